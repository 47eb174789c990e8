#!/usr/bin/env python3
"""chat_template_command: pins `moeserve chat-template` — how it reads a model
directory (tokenizer_config.json's chat_template as a string or as named
templates, bos/eos as strings, AddedToken objects or null, chat_template.jinja
taking precedence), --template FILE, one JSON string per request line, and an
{"error": ...} line (exit status 1) for a request that cannot be rendered."""
import json
import os
import subprocess
import sys
import tempfile

BIN = os.environ["MOESERVE_BIN"]
failures = []
passed = 0


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(f"{name}: {detail}")


def run(args, stdin=""):
    p = subprocess.run([BIN, "chat-template"] + args, input=stdin.encode(), capture_output=True)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def model_dir(cfg, jinja=None):
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    if jinja is not None:
        with open(os.path.join(d, "chat_template.jinja"), "w") as f:
            f.write(jinja)
    return d


T = "[{{ bos_token|default('NOBOS') }}|{{ eos_token }}]{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}" \
    "{% if add_generation_prompt %}GEN{% endif %}{% if enable_thinking is defined %}T={{ enable_thinking }}{% endif %}"
REQ = json.dumps({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
                  "kwargs": {"enable_thinking": False}})

# eos as an AddedToken object, bos null (as in Qwen checkpoints).
d = model_dir({"chat_template": T, "bos_token": None,
               "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False}})
rc, out, err = run([d], REQ + "\n")
check("added_token_eos", rc == 0 and json.loads(out) == "[NOBOS|<|im_end|>]user:hi;GENT=False", f"rc={rc} out={out!r} err={err!r}")

# Named templates: tool_use when tools are given, default otherwise.
d = model_dir({"chat_template": [{"name": "default", "template": "D{{ messages|length }}"},
                                 {"name": "tool_use", "template": "TOOLS{{ tools|length }}"}],
               "bos_token": "<s>", "eos_token": "</s>"})
rc, out, _ = run([d], REQ + "\n" + json.dumps({"messages": [], "tools": [{"type": "function"}]}) + "\n")
check("named_templates", rc == 0 and [json.loads(l) for l in out.split("\n") if l] == ["D1", "TOOLS1"], out)

# chat_template.jinja wins over tokenizer_config.json.
d = model_dir({"chat_template": "from config", "eos_token": "</s>"}, jinja="from file {{ eos_token }}\n")
rc, out, _ = run([d], REQ + "\n")
check("jinja_file_precedence", rc == 0 and json.loads(out) == "from file </s>", out)

# A NUL in chat_template.jinja is refused by name: read as a C string it
# cut the template short (its loop gone: every prompt rendered empty).
d = model_dir({"chat_template": "from config", "eos_token": "</s>"},
              jinja="{# header #}\0{% for m in messages %}{{ m.content }}{% endfor %}")
rc, out, err = run([d], REQ + "\n")
check("jinja_file_nul", rc == 1 and "NUL byte at offset 12" in err, f"rc={rc} out={out!r} err={err!r}")

# No template anywhere.
d = model_dir({"eos_token": "</s>"})
rc, out, err = run([d], REQ + "\n")
check("no_template", rc == 1 and "has no chat_template" in err, f"rc={rc} err={err!r}")

# Malformed config and missing directory.
d = tempfile.mkdtemp()
open(os.path.join(d, "tokenizer_config.json"), "w").write("{not json")
rc, _, err = run([d], "")
check("bad_config", rc == 1 and "not a JSON object" in err, err)
rc, _, err = run(["/nonexistent/model"], "")
check("missing_dir", rc == 1 and "/nonexistent/model" in err, err)
d = model_dir({"chat_template": "{% if %}", "eos_token": "</s>"})
rc, _, err = run([d], "")
check("template_syntax_error", rc == 1 and "line 1:" in err, err)

# --template FILE, bad request lines in between good ones, raise_exception.
f = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)
f.write("{% if messages|length == 0 %}{{ raise_exception('need a message') }}{% endif %}{{ messages[0].content }}")
f.close()
lines = [REQ, "not json", json.dumps({"messages": []}), json.dumps({"messages": "nope"}),
         json.dumps({"messages": [{"content": "é\u2028\"x\""}], "add_generation_prompt": "yes"}),
         json.dumps({"messages": [{"content": "é\u2028\"x\""}]})]
rc, out, _ = run(["--template", f.name], "\n".join(lines) + "\n")
got = [json.loads(l) for l in out.split("\n") if l]
check("line_count", len(got) == len(lines), out)
if len(got) == len(lines):
    check("good_line", got[0] == "hi", got[0])
    check("not_json", isinstance(got[1], dict) and "not a JSON object" in got[1]["error"], got[1])
    check("raise_exception", got[2] == {"error": "need a message"}, got[2])
    check("messages_not_array", isinstance(got[3], dict) and "messages must be an array" in got[3]["error"], got[3])
    check("bad_flag", isinstance(got[4], dict) and "add_generation_prompt" in got[4]["error"], got[4])
    check("unicode_round_trip", got[5] == "é\u2028\"x\"", got[5])
check("exit_status_on_errors", rc == 1, rc)

# Usage errors.
rc, _, _ = run([])
check("no_args", rc == 2)
rc, _, _ = run(["a", "--template", f.name])
check("both_sources", rc == 2)
rc, _, _ = run(["--template", f.name, "--repeat", "0"])
check("bad_repeat", rc == 2)
rc, out, _ = run(["--help"])
check("help", rc == 0 and "usage: moeserve chat-template" in out)
os.unlink(f.name)

for x in failures:
    print("FAIL " + x)
print(f"{passed} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
