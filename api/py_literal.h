// py_literal: a Python literal, as ast.literal_eval reads it, made the JSON
// value json.dumps writes of it: what vLLM's qwen3_coder tool parser does
// with a parameter value that is not JSON (a model writing Python's spelling:
// {'path': 'a.txt'}, ['x', 'y'], True, None, (1, 2), 1_000).
//
// Read as Python 3.11 reads them: strings in either quote, triple-quoted,
// with the r and u prefixes, their escapes (\n, \xhh, \uXXXX, \UXXXXXXXX,
// octal, a backslash-newline; an unknown escape keeps its backslash) and
// adjacent strings joined; decimal, hex, octal and binary integers and
// floats with underscores between digits; one sign before a number; True,
// False, None; lists, tuples (as arrays) and dicts, trailing commas,
// comments and line breaks inside brackets, a bare top-level tuple (1, 2);
// lines as Python's tokenizer reads them (\r\n and \r are \n, in strings
// too; blank, comment and backslash-continued lines around the expression,
// but no indentation before it and no indented blank last line).
// Dict keys may be strings, numbers, booleans or None, written as
// json.dumps writes them ("1", "1.5", "true", "null"); keys Python holds
// equal (1, 1.0, True) are one key, keeping the first's spelling and the
// last value.
//
// NULL (the caller keeps the text) where ast.literal_eval fails, and where
// json.dumps would fail or write what is not JSON: sets, bytes, complex
// numbers, Ellipsis, \N{...} escapes (names not known here), lone
// surrogates, tuple keys, floats out of range (inf, where json.dumps writes
// Infinity); also past 200 nested brackets (Python's parser stops there
// too). Integers past 64 bits become reals (json_loadb_wide's rule), rounded
// once, so that two such keys may become one, and -(2**63) written in
// brackets is a real. Keys json.dumps would write as the same text (1 and
// '1') are one key here, the first's place with the last value, where
// json.dumps writes both. s need not be NUL-terminated.
#ifndef MOESERVE_API_PY_LITERAL_H
#define MOESERVE_API_PY_LITERAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

// The value of s[0..n), or NULL as above (or when out of memory).
json_t *py_literal_parse(const char *s, size_t n);

// One escape of a Python string literal (the one reader of them: Jinja's
// string literals, decoded as Python's unicode-escape does, read them here
// too). p points just past the backslash, end past the literal's last
// character; *used gets the characters read from p (the escape's letter
// and its digits). Returns the value written (0 to 0xFFFFFFFF: values
// past 0x10FFFF, which Python refuses, and lone surrogates are the
// caller's to judge), or:
#define PY_ESC_NOTHING (-1) // a backslash-newline: nothing is written
#define PY_ESC_KEEP (-2)    // not an escape: the backslash and the character stay
#define PY_ESC_BAD (-3)     // \x, \u or \U without all its hex digits
#define PY_ESC_NAMED (-4)   // \N{...}, a character by name (no names are known here)
// bytes: a bytes literal's escapes, where \u, \U and \N are not ones.
// p < end.
long py_escape_read(const char *p, const char *end, bool bytes, size_t *used);

#endif
