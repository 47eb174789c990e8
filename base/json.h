// json: helpers over jansson values that several rooms share.
#ifndef MOESERVE_BASE_JSON_H
#define MOESERVE_BASE_JSON_H

#include <jansson.h>

// What a value is, as error sentences name it ("'top_p' must be a number, got
// a string"): "an object", "an array", "a string", "an integer", "a number"
// (a real), "a boolean" or "null". v must not be NULL. A static string.
const char *json_kind(const json_t *v);

// A double as Python's repr writes it (and json.dumps): the shortest digits
// that read back as d ("0.1", "1e-07", "100000.0", "inf").
void json_format_py_float(double d, char buf[40]);

// v as Python's json.dumps(v, ensure_ascii=False) writes it (", " and ": ",
// floats as repr, objects in their order): what vLLM hands clients as a tool
// call's arguments. malloc'd; NULL when out of memory or nested past 1000.
char *json_dumps_py(const json_t *v);

// json_loadb(buf, len, flags) where an integer too big for 64 bits (a
// model's output may hold one; Python reads any size) does not fail the
// whole text: then it is read again with every integer as a real. NULL when
// it does not parse either way.
json_t *json_loadb_wide(const char *buf, size_t len, size_t flags);

#endif
