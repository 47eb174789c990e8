// hostile_json: the sweep the parser tests share — each field of a JSON
// object replaced in turn by each of a list of hostile values. Include it
// after cmocka.h and jansson.h.
#ifndef MOESERVE_TESTS_HOSTILE_JSON_H
#define MOESERVE_TESTS_HOSTILE_JSON_H

// Calls fn(key, value, ctx) once for each field of obj and each of the n
// values (JSON texts), with that field set to the value and the rest of the
// document as it was; every field is put back afterwards.
static void hostile_json_sweep(json_t *obj, const char *const *values, size_t n,
                               void (*fn)(const char *key, const char *value, void *ctx), void *ctx)
{
    const char *key;
    json_t *val;
    void *tmp;
    json_object_foreach_safe(obj, tmp, key, val) {
        json_t *keep = json_incref(val);
        for (size_t h = 0; h < n; h++) {
            json_t *v = json_loads(values[h], JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            assert_non_null(v);
            json_object_set_new(obj, key, v);
            fn(key, values[h], ctx);
        }
        json_object_set_new(obj, key, keep);
    }
}

#endif
