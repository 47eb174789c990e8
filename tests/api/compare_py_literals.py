#!/usr/bin/env python3
"""compare_py_literals: api/py_literal against Python itself. Each case is
read by ast.literal_eval and written by json.dumps(ensure_ascii=False), as
vLLM's qwen3_coder tool parser does, and by py_literal_lines; the outputs must
be the same text, or both must refuse ("!": literal_eval fails, or json.dumps
would fail or write what is not JSON: sets, bytes, complex, inf, lone
surrogates). Cases whose value holds an integer past 64 bits are skipped
(py_literal writes those as reals, json_loadb_wide's rule).

  compare_py_literals.py --lines build/tests/api/py_literal_lines

Chosen cases first, then a few thousand made at random (seeded) from
pieces of Python's literal syntax, mutated, so that both readers meet
malformed text too.
"""
import argparse
import ast
import json
import math
import random
import subprocess
import sys

CHOSEN = [
    "{'path': 'a.txt', 'lines': [1, 2, 3]}", "['x', \"y\"]", "True", "False", "None", "(1, 2)", "(1,)",
    "()", "(1)", "1, 2", "1,", "[1, 2,]", "{'a': 1,}", "{}", "[]", "1_000", "0x_1f", "0o17", "0b101",
    "0X1F", "007", "00", "0_0", "07.5", "07e1", "1__0", "1_", "_1", ".5", "1.", "1.e5", "1e5", "1E-3",
    "1e400", "-1e400", "1j", "1+2j", "-1", "+1.5", "- 1", "--1", "-True", "-(1)", "-((2.5))", "(-1)",
    "-(1,)", "-'a'", "'a' 'b'", "'a' \"b\" '''c'''", "r'\\n'", "R'\\''", "u'x'", "U\"x\"", "b'x'",
    "rb'x'", "f'x'", "ur'x'", "'\\x41\\u00e9\\U0001F600'", "'\\101\\7\\777'", "'\\q'", "'\\N{DASH}'",
    "'\\ud800'", "'\\x4'", "'\\u00'", "'\\U00110000'", "'''a\nb'''", "'a\nb'", "'a\\\nb'", "\"\"\"x\"\"\"\"",
    "'unterminated", "'\\''", "\"\\\"\"", "'\\\\'", "'\\a\\b\\f\\n\\r\\t\\v'", "'\\0'", "'\\x00'",
    "{1: 2, True: 3, None: 4, 1.5: 5}", "{1.0: 'a', 1: 'b'}", "{True: 1, 1: 2}", "{False: 0, 0.0: 1}",
    "{'a': 1, 'a': 2, 'b': 3}", "{(1, 2): 3}", "{1, 2}", "{[1]: 2}", "{'a' 'b': 1}", "{'k': }",
    "{'k' 1}", "{: 1}", "{,}", "[,]", "(,)", "[1 2]", "[1,, 2]", "set()", "...", "Ellipsis",
    "nan", "inf", "true", "null", "none", "x", "print(1)", "1 + 2", "1 if 1 else 2", "[1, # c\n 2]",
    "[1,\n2]", "1\n2", "1\n", "\n1", "\n\n  1", "  1", "\t1", "1 # c", "# c\n1", "1;", "[1]]",
    "[[1]", "((((1))))", "[" * 150 + "]" * 150, "(" * 150 + "1" + ")" * 150, "[" * 199 + "]" * 199,
    "[" * 200 + "]" * 200, "[" * 201 + "]" * 201, "{'a': {'b': {'c': [1, (2, 3), {'d': None}]}}}",
    "{'v': 2.675, 'w': [1e5, -0.0, 0.1, 1e-7, 1e16, 123456789012345678.0]}", "9223372036854775807",
    "-9223372036854775808", "0x7fffffffffffffff", "'é ü 中'", "'a\u2028b'", "é", "[1, 2\n", "'\\\n'",
    "1\\\n", "[1, \\\n 2]", "'\\\r\nx'", "[1,\r\n2]", "1\r\n", "\f1", "1 2", "'a' 1", "0b", "0x",
    "0b2", "0o8", "1e", "1e+", ".", "-", "+", "-.5", "-0", "0.", "1.2.3", "1..2", "1e5.5", "1_000.000_1",
    "1_e5", "1._5", "0x1.5", "{'a': 1}{", "[{'a': (1, [2, {'b': ()}])}]", "{'k': [True, False, None]}",
    # What reads but json.dumps cannot write, kept only where a later key replaces it.
    "{'a': b'x', 'a': 1}", "{'a': {1, 2}, 'a': 3}", "{'a': ..., 'a': 1}", "{'a': 1j, 'a': 2}",
    "{'a': {(1,): 2}, 'a': 1}", "{'a': '\\ud800', 'a': 1}", "{'a': 1e999, 'a': 0}", "{b'a': 1}",
    "07j", "1+2j", "(1)+2j", "1+(2j)", "1+-2j", "-1-2j", "1j+2j", "1 +2j", "[1+2j]", "- 1j", "-(1j)",
    "(-1)+2j", "-(1)+2j", "1+2j+3j", "1+2", "[1 -2]", "0x1j", "1.5J", "1e3j", "1_0j", "b'\\u00e9'",
    "b'\xe9'", "'a' b'b'", "b'a' b'b'", "f'x'", "rb'\\x'", "Rb'x'", "bR'x'", "br''", "fr'x'", "ub'x'",
    "bb'x'", "{[1]: 2}", "{(1, [2]): 3}", "{1, [2]}", "{1, 2,}", "{1, (2, [3])}", "set()", "set( )",
    "set(1)", "b'\\x4'", "...", "[..., 1]", "{1: 2, 1.0: 3, True: 4}", "{0: 'a', False: 'b', 0.0: 'c', -0.0: 'd'}",
    "{2**63: 1}", "{9223372036854775807: 1, 9223372036854775807.0: 2}", "{'\\x00': 1}", "'a\\x00b'",
    # Lines, blanks and indentation as Python's tokenizer counts them (from a review).
    "1\n ", "1\n\t", "1\n \n", "1\n  #c", "1 #c\n ", "{'a': 1}\n  ", "1\n\n ", "\f 1", " \f 1", "\n\f1",
    "\n \f1", "\n\t\f1", "\\\n1", "\\\n  1", " \\\n1", "\n\\\n  1", "\\\n \\\n1", "1\\\n ",
    "1\\\n\t", "1\\\n", "1,\\\n ", "1\n\f", "1\n \f", "\f1", "1\r\n ", "'''a\r\nb'''", "'''a\rb'''",
    "1\r", "[1,\r2]", "r'a\\\r\nb'", "r'a\\\rb'", "'a\\\r\nb'", "\\\n\n1", "\n  #c\n1",
    # Numbers past 64 bits in other bases, rounded once; signs over unwritable values.
    "0x10000000000000801", "0o2000000000000000004001", "0b" + "1" + "0" * 52 + "1" + "0" * 10 + "1",
    "-0x10000000000000801", "-(1e999)", "-(1e400)", "{-(1e999): 1}", "-(0x1" + "0" * 300 + ")",
    "[" * 198 + "{'a': set(), 'a': 1}" + "]" * 198, "[" * 199 + "set()" + "]" * 199,
]

PIECES = ["'a'", '"b"', "1", "-2", "3.5", "1e3", "True", "False", "None", "0x1f", "1_0", "'\\n'", "r'\\d'",
          "'é'", "()", "[]", "{}", "b'x'", "{1, 2}", "2j", "1-2j", "...", "1e999", "set()", "-(1)", "'\\u00e9'"]


def gen(rng, depth=0):
    k = rng.random()
    if depth > 4 or k < 0.4:
        return rng.choice(PIECES)
    n = rng.randint(0, 4)
    items = [gen(rng, depth + 1) for _ in range(n)]
    sep = rng.choice([", ", ",", ",\n ", " , "])
    trail = rng.choice(["", ","]) if n else ""
    if k < 0.6:
        return "[" + sep.join(items) + trail + "]"
    if k < 0.75:
        return "(" + sep.join(items) + ("," if n == 1 else trail) + ")"
    keys = [rng.choice(["'k'", "'j'", "1", "1.0", "True", "None", "2.5", "(1,)", "'k'", "b'k'", "0", "False"])
            for _ in range(n)]
    return "{" + sep.join(f"{kk}: {v}" for kk, v in zip(keys, items)) + trail + "}"


def mutate(rng, s):
    if not s or rng.random() < 0.5:
        return s
    i = rng.randrange(len(s) + 1)
    op = rng.random()
    if op < 0.3:
        return s[:i] + s[i + 1:]
    if op < 0.6:
        return s[:i] + rng.choice("[](){},:'\"\\ \n\r\t\f#-+._xj0e") + s[i:]
    j = rng.randrange(len(s) + 1)
    return s[:min(i, j)] + s[max(i, j):]


def big_int(v):
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return not -2 ** 63 <= v < 2 ** 63
    if isinstance(v, (list, tuple)):
        return any(big_int(x) for x in v)
    if isinstance(v, dict):
        return any(big_int(k) or big_int(x) for k, x in v.items())
    return False


def writable(v):
    if v is None or isinstance(v, (bool, int)):
        return True
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, str):
        try:
            v.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False
    if isinstance(v, (list, tuple)):
        return all(writable(x) for x in v)
    if isinstance(v, dict):
        return all((k is None or isinstance(k, (str, int, float))) and writable(k) and writable(x)
                   for k, x in v.items())
    return False  # set, bytes, complex, Ellipsis


def expect(s):
    """Python's answer, or None to skip the case."""
    try:
        v = ast.literal_eval(s)
    except Exception:
        return "!"
    if big_int(v):
        return None
    if not writable(v):
        return "!"
    return json.dumps(v, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", required=True)
    ap.add_argument("--random", type=int, default=4000)
    a = ap.parse_args()
    rng = random.Random(20261207)
    cases = list(CHOSEN)
    for _ in range(a.random):
        cases.append(mutate(rng, gen(rng)))
    inp = "".join(json.dumps(c) + "\n" for c in cases)
    p = subprocess.run([a.lines], input=inp.encode(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode:
        sys.exit(f"py_literal_lines exited {p.returncode}: {p.stderr.decode()[-2000:]}")
    got = p.stdout.decode("utf-8").split("\n")[:-1]
    if len(got) != len(cases):
        sys.exit(f"py_literal_lines printed {len(got)} lines for {len(cases)} cases")
    bad = compared = refused = 0
    for c, g in zip(cases, got):
        e = expect(c)
        if e is None:
            continue
        compared += 1
        refused += e == "!"
        if e != g:
            bad += 1
            if bad <= 20:
                print(f"DIFFERS {c!r}\n  python:     {e}\n  py_literal: {g}")
    print(f"{compared} cases compared ({refused} refused by both or expected refused), {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
