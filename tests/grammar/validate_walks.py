#!/usr/bin/env python3
"""Runs grammar_walk (random walks through compiled JSON grammars over the
real Qwen3 vocabulary) and validates every output with an independent
validator: Python's json module and the jsonschema package (Debian's
python3-jsonschema). A walk's text must parse as JSON and validate against
its schema; prefix and suffix (a tool-call wrapper) must be there verbatim.

usage: validate_walks.py GRAMMAR_WALK TOKENIZER_DIR SCHEMAS.json WALKS SEED
"""
import json
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    print("validate_walks: the jsonschema module is missing: install Debian's python3-jsonschema "
          "(deploy/setup.sh does)", file=sys.stderr)
    sys.exit(1)


def main():
    walker, tok_dir, schemas_path, walks, seed = sys.argv[1:6]
    with open(schemas_path, encoding="utf-8") as f:
        entries = {e["name"]: e for e in json.load(f)}
    run = subprocess.run([walker, tok_dir, schemas_path, walks, seed], capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    passed = failed = 0
    seen = set()
    for line in run.stdout.splitlines():
        out = json.loads(line)
        e = entries[out["name"]]
        seen.add(out["name"])
        text = out["text"]
        prefix, suffix = e.get("prefix", ""), e.get("suffix", "")
        try:
            if not (text.startswith(prefix) and text.endswith(suffix)):
                raise ValueError("prefix or suffix missing")
            body = text[len(prefix):len(text) - len(suffix)]
            value = json.loads(body)
            # Python's json takes a lone escaped surrogate; Unicode (and jansson) do not.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
            schema = {"type": "object"} if e.get("json_object") else e["schema"]
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
            passed += 1
        except Exception as exc:  # noqa: BLE001 - every failure is reported the same way
            failed += 1
            print(f"FAIL {out['name']}: {exc}\n  text: {text!r}", file=sys.stderr)
    missing = set(entries) - seen
    if run.returncode != 0:
        print(f"validate_walks: grammar_walk exited {run.returncode}", file=sys.stderr)
        failed += 1
    if missing:
        print(f"validate_walks: no walk finished for {sorted(missing)}", file=sys.stderr)
        failed += len(missing)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
