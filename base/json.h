// json: helpers over jansson values that several rooms share.
#ifndef MOESERVE_BASE_JSON_H
#define MOESERVE_BASE_JSON_H

#include <jansson.h>

// What a value is, as error sentences name it ("'top_p' must be a number, got
// a string"): "an object", "an array", "a string", "an integer", "a number"
// (a real), "a boolean" or "null". v must not be NULL. A static string.
const char *json_kind(const json_t *v);

#endif
