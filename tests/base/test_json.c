// Pins json_kind: the one wording error sentences use for a value's type
// (config.json, generation_config.json and request bodies alike); and the
// Python forms: floats as repr, values as json.dumps(ensure_ascii=False)
// writes them (the figures are Python 3's own output).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "base/json.h"

static void json_kind_names_every_type_with_an_article(void **state)
{
    (void)state;
    static const struct {
        const char *json, *kind;
    } cases[] = {
        {"{}", "an object"}, {"[]", "an array"}, {"\"x\"", "a string"}, {"3", "an integer"},
        {"3.5", "a number"}, {"true", "a boolean"}, {"false", "a boolean"}, {"null", "null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        assert_string_equal(json_kind(v), cases[i].kind);
        json_decref(v);
    }
}

static void floats_and_values_are_written_as_python_writes_them(void **state)
{
    (void)state;
    static const struct {
        double d;
        const char *repr;
    } floats[] = {
        {0.1, "0.1"}, {2.675, "2.675"}, {1e16, "1e+16"}, {1e-7, "1e-07"}, {100000.0, "100000.0"},
        {-0.0, "-0.0"}, {1.0 / 3, "0.3333333333333333"}, {123456789012345678.0, "1.2345678901234568e+17"},
        {0.0001, "0.0001"}, {1.5e300, "1.5e+300"},
    };
    char buf[40];
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        json_format_py_float(floats[i].d, buf);
        assert_string_equal(buf, floats[i].repr);
    }
    // json.dumps({"a": [1, 2.5, true, null], "b": {"c": "x\"y\n\u00e9"}, "d": 1e5}, ensure_ascii=False)
    json_t *v = json_loads("{\"a\": [1, 2.5, true, null], \"b\": {\"c\": \"x\\\"y\\n\u00e9\"}, \"d\": 1e5, \"e\": []}",
                           0, NULL);
    assert_non_null(v);
    char *t = json_dumps_py(v);
    assert_non_null(t);
    assert_string_equal(t, "{\"a\": [1, 2.5, true, null], \"b\": {\"c\": \"x\\\"y\\n\u00e9\"}, \"d\": 100000.0, \"e\": []}");
    free(t);
    json_decref(v);

    // json.dumps({"k\x01": "x\x0b\x1f\x7f\\/y\x00z"}, ensure_ascii=False): lower-case
    // \u00xx for control bytes (jansson writes upper case), DEL and '/' as they are.
    v = json_pack("{s:s%}", "k\x01", "x\x0b\x1f\x7f\\/y\0z", (size_t)9);
    assert_non_null(v);
    t = json_dumps_py(v);
    assert_non_null(t);
    assert_string_equal(t, "{\"k\\u0001\": \"x\\u000b\\u001f\x7f\\\\/y\\u0000z\"}");
    free(t);
    json_decref(v);
}

// An integer past 64 bits reads as a real rather than failing the text
// (where a forced call's arguments became {}); other errors stay errors.
static void wide_integers_read_as_reals_instead_of_failing(void **state)
{
    (void)state;
    const char *t = "{\"x\": 58976666666666666666, \"y\": 3}";
    assert_null(json_loadb(t, strlen(t), 0, NULL));
    json_t *v = json_loadb_wide(t, strlen(t), 0);
    assert_non_null(v);
    assert_true(json_is_real(json_object_get(v, "x")));
    assert_true(json_real_value(json_object_get(v, "x")) > 5.8e19);
    json_decref(v);
    v = json_loadb_wide("{\"y\": 3}", 8, 0); // integers stay integers when they fit
    assert_true(json_is_integer(json_object_get(v, "y")));
    json_decref(v);
    assert_null(json_loadb_wide("{\"y\": 3", 7, 0));
    assert_null(json_loadb_wide("[1e400]", 7, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_kind_names_every_type_with_an_article),
        cmocka_unit_test(floats_and_values_are_written_as_python_writes_them),
        cmocka_unit_test(wide_integers_read_as_reals_instead_of_failing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
