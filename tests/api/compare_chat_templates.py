#!/usr/bin/env python3
"""compare_chat_templates: renders the chat-template corpora with moeserve and
with two references nobody here wrote, and requires byte-identical text.

  * constructs.jsonl (one small template per line): moeserve's interpreter
    (jinja_lines) against Python Jinja2 configured as transformers configures it.
  * style_cases.jsonl: requests for the Gemma-3, Llama-3.1 and Mistral style
    templates in tests/data/templates, compared the same way.
  * cases.jsonl (chat requests) with the Qwen3 template (read by
    `moeserve chat-template MODEL_DIR` from the real tokenizer_config.json) and the
    Qwen2.5-Instruct template (`--template FILE`): moeserve against Python Jinja2
    (transformers) and against @huggingface/jinja. Cases marked "differs" for a
    template are where @huggingface/jinja itself departs from transformers; there
    moeserve must match transformers and the reference must still differ.

A case passes when the outputs are equal strings, or when every renderer fails.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile


def run(cmd, lines, env=None):
    inp = "".join(l + "\n" for l in lines)
    p = subprocess.run(cmd, input=inp.encode(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = p.stdout.decode().split("\n")[:-1]
    if len(out) != len(lines):
        sys.exit(f"{cmd[0]} printed {len(out)} lines for {len(lines)} inputs (exit {p.returncode}):\n"
                 + p.stderr.decode()[-2000:])
    return [json.loads(o) for o in out]


def is_err(v):
    return isinstance(v, dict)


def find_jinja2_python():
    for py in [sys.executable, "/usr/bin/python3", shutil.which("python3")]:
        if py and subprocess.run([py, "-c", "import jinja2"], capture_output=True).returncode == 0:
            return py
    sys.exit("Python Jinja2 is not installed (Debian package python3-jinja2): run deploy/setup.sh")


def show(s, width=300):
    r = repr(s)
    return r if len(r) <= width else r[:width] + "..."


def first_diff(a, b):
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return f"first difference at character {i}: ours {show(a[max(0, i - 40):i + 60])} vs {show(b[max(0, i - 40):i + 60])}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moeserve", default=os.environ.get("MOESERVE_BIN"))
    ap.add_argument("--jinja-lines", required=True)
    ap.add_argument("--data", default=os.environ.get("MOESERVE_TEST_DATA"))
    ap.add_argument("--qwen3-dir", required=True, help="a model directory with the Qwen3 tokenizer_config.json")
    ap.add_argument("--node", default=shutil.which("node"))
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    py = find_jinja2_python()
    ref_py = [py, os.path.join(here, "jinja2_reference.py")]
    if not a.node:
        sys.exit("node is not installed: run deploy/setup.sh")
    node_env = dict(os.environ)
    node_env.setdefault("NODE_PATH", os.path.join(root, "tests", "node", "node_modules"))
    ref_js = [a.node, os.path.join(root, "tests", "node", "render_chat_template.mjs")]
    ddir = os.path.join(a.data, "chat_template")
    failures = []
    passed = 0

    # 1. constructs against Python Jinja2
    lines = open(os.path.join(ddir, "constructs.jsonl"), encoding="utf-8").read().split("\n")
    lines = [l for l in lines if l.strip()]
    ours = run([a.jinja_lines], lines)
    ref = run(ref_py + ["--per-line"], lines)
    for i, (l, o, r) in enumerate(zip(lines, ours, ref)):
        if (is_err(o) and is_err(r)) or o == r:
            passed += 1
        else:
            failures.append(f"constructs.jsonl:{i + 1} template {show(json.loads(l)['template'], 200)}\n"
                            f"    moeserve: {show(o)}\n    jinja2:   {show(r)}")
    print(f"constructs: {len(lines)} templates compared with Python Jinja2")

    # 2. chat requests with the real Qwen templates
    cfg = json.load(open(os.path.join(a.qwen3_dir, "tokenizer_config.json"), encoding="utf-8"))
    tmp = tempfile.mkdtemp()
    qwen3_file = os.path.join(tmp, "qwen3.jinja")
    with open(qwen3_file, "w", encoding="utf-8") as f:
        f.write(cfg["chat_template"])
    qwen25_file = os.path.join(a.data, "templates", "qwen2.5-instruct.jinja")
    eos = ["--eos-token", "<|im_end|>"]
    setups = {
        "qwen3": ([a.moeserve, "chat-template", a.qwen3_dir], qwen3_file),
        "qwen2.5": ([a.moeserve, "chat-template", "--template", qwen25_file] + eos, qwen25_file),
    }
    lines = [l for l in open(os.path.join(ddir, "cases.jsonl"), encoding="utf-8").read().split("\n") if l.strip()]
    corpora = [(name, ours_cmd, tfile, eos, lines, 200) for name, (ours_cmd, tfile) in setups.items()]
    # Other families' constructs: the *-style templates with their own requests.
    style = [l for l in open(os.path.join(ddir, "style_cases.jsonl"), encoding="utf-8").read().split("\n") if l.strip()]
    toks = ["--bos-token", "<s>", "--eos-token", "</s>"]
    for name in sorted({json.loads(l)["template"] for l in style}):
        tfile = os.path.join(a.data, "templates", name + ".jinja")
        mine = [l for l in style if json.loads(l)["template"] == name]
        corpora.append((name, [a.moeserve, "chat-template", "--template", tfile] + toks, tfile, toks, mine, 1))
    for name, ours_cmd, tfile, flags, lines, minimum in corpora:
        cases = [json.loads(l) for l in lines]
        ours = run(ours_cmd, lines)
        tf = run(ref_py + ["--template", tfile] + flags, lines)
        js = run(ref_js + ["--template", tfile] + flags, lines, env=node_env)
        agree = errors = differs = 0
        for c, o, t, j in zip(cases, ours, tf, js):
            where = f"{name} {c['name']}"
            reason = (c.get("differs") or {}).get(name)
            same_tj = (is_err(t) and is_err(j)) or t == j
            if is_err(o) and is_err(t):
                pass
            elif o != t:
                failures.append(f"{where}: moeserve differs from transformers (Python Jinja2): "
                                + (first_diff(o, t) if not is_err(o) and not is_err(t) else
                                   f"\n    moeserve: {show(o)}\n    transformers: {show(t)}"))
                continue
            if reason:
                if same_tj:
                    failures.append(f"{where}: marked '{reason}' but @huggingface/jinja now agrees with "
                                    "transformers; drop the mark")
                    continue
                differs += 1
            elif not same_tj:
                failures.append(f"{where}: @huggingface/jinja differs from moeserve and transformers: "
                                + (first_diff(o, j) if not is_err(o) and not is_err(j) else
                                   f"\n    moeserve: {show(o)}\n    @huggingface/jinja: {show(j)}"))
                continue
            elif is_err(o):
                errors += 1
            else:
                agree += 1
            passed += 1
        print(f"{name}: {agree} requests byte-identical to both references, {differs} identical to "
              f"transformers where @huggingface/jinja is known to differ, {errors} rejected by all")
        if agree < minimum:
            failures.append(f"{name}: only {agree} requests where all three agree; the corpus needs at least {minimum}")
    shutil.rmtree(tmp)
    for f in failures:
        print("FAIL " + f)
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
