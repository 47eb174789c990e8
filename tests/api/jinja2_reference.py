#!/usr/bin/env python3
"""jinja2_reference: renders chat templates exactly as transformers'
apply_chat_template does (Python Jinja2, ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls, tojson as json.dumps with
ensure_ascii=False, raise_exception and strftime_now globals).

  jinja2_reference.py --template FILE [--bos-token S] [--eos-token S] < requests.jsonl
  jinja2_reference.py --per-line < cases.jsonl      (lines: {"template", "vars"})

Output: one line per input line, the rendered JSON string or {"error": message}.
"""
import argparse
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker: {% generation %}...{% endgeneration %} renders its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template")
    ap.add_argument("--per-line", action="store_true")
    ap.add_argument("--bos-token")
    ap.add_argument("--eos-token")
    a = ap.parse_args()
    env = make_env()
    shared = None
    if a.template:
        try:
            with open(a.template, encoding="utf-8") as f:
                shared = env.from_string(f.read())
        except Exception as e:  # a template that does not parse fails every line
            shared = e
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if a.per_line:
                out = env.from_string(req["template"]).render(**req.get("vars", {}))
            else:
                if isinstance(shared, Exception):
                    raise shared
                kw = {}
                if a.bos_token is not None:
                    kw["bos_token"] = a.bos_token
                if a.eos_token is not None:
                    kw["eos_token"] = a.eos_token
                kw.update(req.get("kwargs") or {})
                out = shared.render(messages=req["messages"], tools=req.get("tools"),
                                    documents=None,
                                    add_generation_prompt=bool(req.get("add_generation_prompt")),
                                    **kw)
            sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        except Exception as e:
            sys.stdout.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
