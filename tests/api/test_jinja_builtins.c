// Pins the builtin table of the Jinja engine against its dispatch: every name
// the table lists reaches its builtin the way a template reaches it (filter,
// test, method, loop attribute, global), the name checks (`is filter`, `is
// test`, `is defined`) agree with the table, no name is listed twice, and an
// unknown name fails with the sentences it always failed with.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "api/jinja.h"
#include "api/jinja_impl.h"

static char err[1024];

// Renders src (no variables): the output (malloc'd), or NULL with err set by
// the parse or the render.
static char *render(const char *src)
{
    struct jinja_template *t;
    err[0] = 0;
    if (jinja_parse(src, strlen(src), &t, err, sizeof err)) return NULL;
    char *out = NULL;
    size_t len;
    int rc = jinja_render(t, NULL, 0, NULL, &out, &len, err, sizeof err);
    jinja_destroy(t);
    return rc ? NULL : out;
}

static void expect(const char *src, const char *want)
{
    char *out = render(src);
    if (!out) fail_msg("%s failed: %s", src, err);
    if (strcmp(out, want)) fail_msg("%s gave [%s], want [%s]", src, out, want);
    free(out);
}

static void expect_error(const char *src, const char *want)
{
    char *out = render(src);
    if (out) fail_msg("%s should fail, gave [%s]", src, out);
    if (strcmp(err, want)) fail_msg("%s failed with [%s], want [%s]", src, err, want);
}

// Renders src; it may fail, but not because the name is unknown.
static bool reaches(const char *src, const char *unknown_sentence)
{
    char *out = render(src);
    if (out) {
        free(out);
        return true;
    }
    if (strstr(err, unknown_sentence)) fail_msg("%s: %s", src, err);
    return false;
}

// A template expression of each type a method can belong to.
static const char *value_of_type(int t)
{
    switch (t) {
    case JV_STR: return "'abc'";
    case JV_DICT: return "{'k': 1}";
    case JV_LIST: return "[3, 1, 2]";
    case JV_TUPLE: return "(3, 1)";
    default: return NULL;
    }
}

static void every_listed_name_reaches_its_builtin(void **state)
{
    (void)state;
    char src[512], want[128];
    int kind;
    const char *name;
    unsigned recv;
    int counts[5] = {0};
    for (size_t i = 0; jb_entry(i, &kind, &name, &recv); i++) {
        assert_true(kind >= 0 && kind < 5);
        counts[kind]++;
        switch (kind) {
        case JB_FILTER:
            // Known to the parser, to `is filter`, and to the call.
            snprintf(src, sizeof src, "{{ '%s' is filter }}", name);
            expect(src, "True");
            snprintf(src, sizeof src, "{{ [3, 1, 2] | %s }}", name);
            reaches(src, "no filter named");
            snprintf(src, sizeof src, "{{ ['a'] | map('%s') | list }}", name);
            reaches(src, "no filter named");
            break;
        case JB_TEST: {
            // Every test through select(), which takes any name (==, <= too);
            // either no argument or one argument is the right number.
            snprintf(src, sizeof src, "{{ '%s' is test }}", name);
            expect(src, "True");
            int right = 0;
            for (int nargs = 0; nargs < 2; nargs++) {
                snprintf(src, sizeof src, "{{ [1, 2] | select('%s'%s) | list }}", name, nargs ? ", 1" : "");
                if (reaches(src, "no test named") || !strstr(err, "got the wrong number of arguments"))
                    right++;
            }
            if (right != 1) fail_msg("test '%s' takes %d of: no argument, one argument", name, right);
            break;
        }
        case JB_METHOD:
            for (int t = 0; t < 16; t++) {
                if (!(recv & (1u << t))) continue;
                snprintf(want, sizeof want, "<built-in function %s>", name);
                if (t == JV_LOOP) {
                    snprintf(src, sizeof src, "{%% for i in [1] %%}{{ loop.%s }}{%% endfor %%}", name);
                } else {
                    assert_non_null(value_of_type(t));
                    snprintf(src, sizeof src, "{{ %s.%s }}", value_of_type(t), name);
                }
                expect(src, want);
            }
            break;
        case JB_ATTR:
            assert_int_equal(recv, 1u << JV_LOOP);
            // The middle of three items has every attribute (previtem, nextitem too).
            snprintf(src, sizeof src,
                     "{%% for i in [1, 2, 3] %%}{%% if i == 2 %%}{{ loop.%s is defined }}{%% endif %%}{%% endfor %%}",
                     name);
            expect(src, "True");
            break;
        case JB_GLOBAL:
            snprintf(src, sizeof src, "{{ %s is defined }} {{ %s }}", name, name);
            snprintf(want, sizeof want, "True <built-in function %s>", name);
            expect(src, want);
            break;
        }
    }
    // What chat templates use is all there.
    assert_true(counts[JB_FILTER] >= 40);
    assert_true(counts[JB_TEST] >= 35);
    assert_true(counts[JB_METHOD] >= 45);
    assert_int_equal(counts[JB_ATTR], 11);
    assert_int_equal(counts[JB_GLOBAL], 5);
}

static void no_name_is_listed_twice(void **state)
{
    (void)state;
    int ki, kj;
    const char *ni, *nj;
    unsigned ri, rj;
    for (size_t i = 0; jb_entry(i, &ki, &ni, &ri); i++)
        for (size_t j = i + 1; jb_entry(j, &kj, &nj, &rj); j++)
            if (ki == kj && !strcmp(ni, nj) && (ki == JB_METHOD || ki == JB_ATTR ? (ri & rj) != 0 : true))
                fail_msg("'%s' is listed twice (kind %d)", ni, ki);
}

static void unknown_names_fail_as_they_always_did(void **state)
{
    (void)state;
    // At parse time, outside an if.
    expect_error("{{ 1 | nosuch }}", "line 1: no filter named 'nosuch'");
    expect_error("{{ 1 is nosuch }}", "line 1: no test named 'nosuch'");
    expect_error("{{ 1 | Upper }}", "line 1: no filter named 'Upper'"); // names are case-sensitive
    // At render time: inside an if, through map and select.
    expect_error("{% if true %}{{ 1 | nosuch }}{% endif %}", "line 1: no filter named 'nosuch'");
    expect_error("{% if true %}{{ 1 is nosuch }}{% endif %}", "line 1: no test named 'nosuch'");
    expect("{% if false %}{{ 1 | nosuch }}{% endif %}ok", "ok");
    expect_error("{{ [1] | map('nosuch') | list }}", "line 1: no filter named 'nosuch'");
    expect_error("{{ [1] | select('nosuch') | list }}", "line 1: no test named 'nosuch'");
    // A name longer than 40 bytes is cut in the sentence.
    expect_error("{{ [1] | map('abcdefghijabcdefghijabcdefghijabcdefghijXYZ') | list }}",
                 "line 1: no filter named 'abcdefghijabcdefghijabcdefghijabcdefghij'");
    // The name checks.
    expect("{{ 'nosuch' is filter }} {{ 'nosuch' is test }} {{ 3 is filter }}", "False False False");
    expect("{{ nosuch is defined }} {{ range is defined }}", "False True");
    // Methods and attributes that do not exist are undefined, and fail when called.
    expect("{{ 'abc'.nosuch is defined }} {{ 'abc'.upper is defined }}", "False True");
    expect_error("{{ 'abc'.nosuch() }}", "line 1: 'str object' has no attribute 'nosuch'");
    expect_error("{{ [1].nosuch() }}", "line 1: 'list object' has no attribute 'nosuch'");
    expect_error("{{ (1,).copy() }}", "line 1: 'tuple object' has no attribute 'copy'");
    expect("{{ {'get': 5}.get('get') }} {{ {'role': 'user'}.role }}", "5 user");
    expect("{% for i in [1] %}{{ loop.nosuch is defined }}{% endfor %}", "False");
    // A listed name with the wrong arguments says so.
    expect_error("{{ 'a' | upper(1) }}", "line 1: filter 'upper' takes no arguments");
    expect_error("{{ 1 is odd(2) }}", "line 1: test 'odd' got the wrong number of arguments");
    expect_error("{{ 1 is divisibleby }}", "line 1: test 'divisibleby' got the wrong number of arguments");
    expect_error("{{ 'a'.upper(1) }}", "line 1: str.upper() takes no arguments");
    expect_error("{{ 'a'.join() }}", "line 1: str.join() takes exactly one argument");
    expect_error("{{ 'a'.split(x=1) }}", "line 1: str.split() got an unexpected keyword argument 'x'");
    expect_error("{{ 'a' | d(1, 2, 3) }}", "line 1: filter 'd' takes at most 2 arguments (3 given)");
    expect_error("{{ {}.items(1) }}", "line 1: dict.items() takes no arguments");
    expect_error("{{ (1, 2).index() }}", "line 1: list.index() takes exactly one argument");
    expect_error("{{ [].append(1) }}", "line 1: list.append() modifies the list, which the template sandbox does not allow");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_listed_name_reaches_its_builtin),
        cmocka_unit_test(no_name_is_listed_twice),
        cmocka_unit_test(unknown_names_fail_as_they_always_did),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
