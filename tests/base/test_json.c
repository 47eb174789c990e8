// Pins json_kind: the one wording error sentences use for a value's type
// (config.json, generation_config.json and request bodies alike).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_kind_names_every_type_with_an_article),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
