// Pins the Jinja interpreter: each construct chat templates use, whitespace
// control, error messages with line numbers, raise_exception, the limits that
// keep a template from hanging or exhausting the server, malformed and huge
// input, concurrent renders of one parsed template, and the chat_template API.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "api/chat_template.h"
#include "api/jinja.h"
#include "base/base.h"

static char err[2048];

// Renders src with the variables of a JSON object; returns the output or NULL (err set).
static char *render_lim(const char *src, const char *vars_json, const struct jinja_limits *lim)
{
    struct jinja_template *t;
    err[0] = 0;
    if (jinja_parse(src, strlen(src), &t, err, sizeof err)) return NULL;
    json_t *vars = vars_json ? json_loads(vars_json, 0, NULL) : json_object();
    assert_non_null(vars);
    struct jinja_var v[32];
    size_t n = 0;
    const char *k;
    json_t *val;
    json_object_foreach(vars, k, val) v[n++] = (struct jinja_var){k, val};
    char *out = NULL;
    size_t len;
    int rc = jinja_render(t, v, n, lim, &out, &len, err, sizeof err);
    json_decref(vars);
    jinja_destroy(t);
    if (rc) return NULL;
    assert_int_equal(strlen(out), len);
    return out;
}

static char *render(const char *src, const char *vars_json) { return render_lim(src, vars_json, NULL); }

static void expect(const char *src, const char *vars, const char *want)
{
    char *out = render(src, vars);
    if (!out) fail_msg("render of %s failed: %s", src, err);
    if (strcmp(out, want)) fail_msg("render of %s\n  got  [%s]\n  want [%s]", src, out, want);
    free(out);
}

// The render must fail and err must contain `part`.
static void expect_error(const char *src, const char *vars, const char *part)
{
    char *out = render(src, vars);
    if (out) fail_msg("render of %s should fail, gave [%s]", src, out);
    if (!strstr(err, part)) fail_msg("error for %s is [%s], expected it to contain [%s]", src, err, part);
}

static char *read_data(const char *rel)
{
    const char *dir = getenv("MOESERVE_TEST_DATA");
    assert_non_null(dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    char *text;
    size_t len;
    char e[256];
    assert_int_equal(ms_read_file(path, 1 << 26, &text, &len, e, sizeof e), 0);
    return text;
}

static void text_output_and_literals_render_like_python(void **state)
{
    (void)state;
    expect("plain", NULL, "plain");
    expect("{{ 'a' ~ 1 ~ none ~ true ~ 1.5 }}", NULL, "a1NoneTrue1.5");
    expect("{{ [1, 'x', none, {'k': (1,)}] }}", NULL, "[1, 'x', None, {'k': (1,)}]");
    expect("{{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1.0 }} {{ 1e-5 }} {{ 7 // -2 }} {{ -7 % 3 }} {{ 2 ** 10 }}", NULL,
           "1e+16 0.30000000000000004 1.0 1e-05 -4 2 1024");
    expect("{{ \"it's\" }}|{{ ['it\\'s'] }}|{{ 'tab\\there' }}", NULL, "it's|[\"it's\"]|tab\there");
    expect("{{ x }}", "{\"x\": 3}", "3");
    expect("{{ 'y' if a else 'n' }}{{ 'z' if not a }}", "{\"a\": []}", "nz");
}

static void whitespace_control_follows_trim_and_lstrip_blocks(void **state)
{
    (void)state;
    // trim_blocks eats the newline after a block tag; lstrip_blocks the indent before it.
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, "a\n  b\nc");
    // Expression tags are not lstripped or trimmed.
    expect("  {{ 1 }}\n  {{ 2 }}", NULL, "  1\n  2");
    expect("a   {{- 'b' -}}   \n c", NULL, "abc");
    expect("x\n{%- if true -%}\n\n  y  \n{%- endif %}", NULL, "xy");
    expect("a {%+ if true %}b{% endif +%}\nc", NULL, "a b\nc");
    expect("a {# note #}\nb\n  {# indented -#}   \n c", NULL, "a b\nc");
    expect("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    // One trailing newline of the template is dropped; CRLF becomes LF.
    expect("l1\r\nl2\n", NULL, "l1\nl2");
}

static void for_loops_expose_loop_and_unpack(void **state)
{
    (void)state;
    expect("{% for x in 'ab' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
           "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}",
           NULL, "10TrueFalse221;21FalseTrue210;");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1,a=2,");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}", NULL, "2/2 4/2 ");
    expect("{% for x in xs %}{% if x > 2 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
           "{\"xs\": [1, 2, 3, 4]}", "2");
    expect("{% for m in msgs[::-1] %}{{ m }}{% endfor %}", "{\"msgs\": [1, 2, 3]}", "321");
    expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, "too many values to unpack");
}

static void set_scoping_and_namespaces_match_jinja(void **state)
{
    (void)state;
    // A set inside a loop does not leak out; a namespace attribute does.
    expect("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", NULL, "231");
    expect("{% set ns = namespace(n=0, last=none) %}{% for i in [5, 6] %}{% set ns.n = ns.n + i %}"
           "{% set ns.last = i %}{% endfor %}{{ ns.n }} {{ ns.last }}", NULL, "11 6");
    expect("{% if true %}{% set y = 'if does not scope' %}{% endif %}{{ y }}", NULL, "if does not scope");
    expect("{% set a, b = 'xy' %}{{ b }}{{ a }}", NULL, "yx");
    expect("{% set s %}[{{ 1 }}]{% endset %}{{ s ~ s }}", NULL, "[1][1]");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, "non-namespace");
}

static void macros_and_call_blocks_bind_arguments(void **state)
{
    (void)state;
    expect("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}{{ m(b=4, a=5) }}", NULL, "1B2354");
    expect("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}in{% endcall %}", NULL, "<in>");
    expect("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", NULL, "321");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, "takes not more than 1 argument");
}

static void filters_and_methods_follow_python(void **state)
{
    (void)state;
    expect("{{ x|tojson }}", "{\"x\": {\"b\": [1, 2.5, null, true], \"a\": \"\\u00e9\\n\\\"\"}}",
           "{\"b\": [1, 2.5, null, true], \"a\": \"\xc3\xa9\\n\\\"\"}");
    expect("{{ x|tojson(indent=2) }}", "{\"x\": {\"a\": [1], \"b\": {}}}", "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
    expect("{{ x|tojson(ensure_ascii=true, sort_keys=true, separators=(',', ':')) }}",
           "{\"x\": {\"z\": \"\\u00e9\\ud83d\\ude00\", \"a\": 1.0}}", "{\"a\":1.0,\"z\":\"\\u00e9\\ud83d\\ude00\"}");
    expect("{{ '  x  '|trim }}|{{ 'ab'|length }}|{{ [1, 2]|join('-') }}|{{ nope|default('d') }}|{{ 'aXa'|replace('X', 'y') }}",
           NULL, "x|2|1-2|d|aya");
    expect("{{ 'a</think>b'.split('</think>')[-1] }}|{{ '\\n\\nx \\n'.strip('\\n') }}|{{ 'ab'.upper() }}|{{ 'AB'|lower }}"
           "|{{ 'ab'.startswith('a') }}|{{ 'ab'.endswith(('x', 'b')) }}|{{ '  x'.lstrip() }}|{{ 'x\\n\\n'.rstrip('\\n') }}",
           NULL, "b|x |AB|ab|True|True|x|x");
    // select with no argument at all: no test, no positional list (NULL + 0 was UB).
    expect("{{ [1, 0, 2]|select|list }}|{{ [1, 0]|reject|list }}", NULL, "[1, 2]|[0]");
    expect("{{ m|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}",
           "{\"m\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"tool\", \"content\": \"t\"}]}", "['u']");
    expect("{{ 'x' is string }}{{ {} is mapping }}{{ none is none }}{{ 1 is number }}{{ [] is sequence }}{{ u is defined }}",
           NULL, "TrueTrueTrueTrueTrueFalse");
    expect("{{ '42'|int + '1.5'|float }}|{{ [3, 1, 2]|sort|first }}|{{ {'b': 1, 'a': 2}|dictsort|first }}", NULL,
           "43.5|1|('a', 2)");
}

static void undefined_values_print_empty_and_fail_when_used(void **state)
{
    (void)state;
    expect("[{{ nope }}][{{ d.missing }}]{{ d.missing is defined }}{{ nope|length }}", "{\"d\": {}}", "[][]False0");
    expect_error("{{ nope.attr }}", NULL, "'nope' is undefined");
    expect_error("{{ d.missing.deeper }}", "{\"d\": {}}", "'dict object' has no attribute 'missing'");
    expect_error("{{ nope + 1 }}", NULL, "'nope' is undefined");
    expect_error("{{ nope|tojson }}", NULL, "not JSON serializable");
}

static void raise_exception_returns_the_template_message(void **state)
{
    (void)state;
    char *out = render("line one\n{% if true %}\n{{ raise_exception('Conversation roles must alternate') }}{% endif %}", NULL);
    assert_null(out);
    assert_string_equal(err, "Conversation roles must alternate");
}

static void parse_errors_name_the_line_and_what_was_expected(void **state)
{
    (void)state;
    struct {
        const char *src, *want;
    } cases[] = {
        {"a\nb\n{% for x in y %}\n{{ x }}", "line 4: unexpected end of template: expected 'endfor' or 'else' to close the 'for' block opened on line 3"},
        {"{% if a %}\n\n{% endfor %}", "line 3: unexpected 'endfor': expected 'elif' or 'else' or 'endif' to close the 'if' block opened on line 1"},
        {"ok\n{{ 1 + }}", "line 2: expected an expression, got end of print statement"},
        {"\n\n{% frobnicate %}", "line 3: unknown tag 'frobnicate'"},
        {"{{ (1, 2 }}", "line 1: unexpected '}', expected ')'"},
        {"x\n{{ 'abc }}", "line 2: unterminated string literal"},
        {"{{ 'a' }}\n{{ '\\N{EN DASH}' }}", "line 2: \\N{...} escapes (characters by name) are not supported"},
        {"{% set x = [1, 2 %}", "line 1: unexpected '}', expected ']'"},
        {"{{ x }\n}", "line 1: unexpected '}'"},
        {"\n{% endif %}", "line 2: unexpected 'endif': no block is open here"},
        {"{% for x in y %}{% break %}{% endfor %}{% continue %}", "line 1: 'continue' outside of a for loop"},
        {"{% macro m(a=1, b) %}{% endmacro %}", "line 1: non-default argument follows default argument"},
        {"{# never closed", "line 1: the comment opened here is missing its '#}'"},
        {"{% include 'x' %}", "line 1: the 'include' tag is not supported in chat templates"},
        {"{{ x.1.2 }}{{ 1 +* 2 }}", "line 1: expected an expression, got '*'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct jinja_template *t = NULL;
        err[0] = 0;
        assert_int_equal(jinja_parse(cases[i].src, strlen(cases[i].src), &t, err, sizeof err), MS_EINVAL);
        assert_null(t);
        if (!strstr(err, cases[i].want)) fail_msg("template %s: error [%s], want [%s]", cases[i].src, err, cases[i].want);
    }
    struct jinja_template *t;
    assert_int_equal(jinja_parse("a\n\xff", 3, &t, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "line 2: the template is not valid UTF-8"));
}

static void runtime_errors_name_the_line(void **state)
{
    (void)state;
    expect_error("one\ntwo\n{{ 1 / 0 }}", NULL, "line 3: division by zero");
    expect_error("{% for m in msgs %}\n{{ m.content + 1 }}\n{% endfor %}", "{\"msgs\": [{\"content\": \"c\"}]}",
                 "line 2: can only concatenate str (not \"int\") to str");
    expect_error("\n\n{{ 'x' < 1 }}", NULL, "line 3: '<' not supported between instances of 'str' and 'int'");
}

// %-formatting's integer conversions take what Python's do: a float's
// integer part for %d however large (its exact digits, where a cast to long
// long was undefined past 2^63: fuzz_jinja found '%x' % 1e300), no float for
// %x, %o or %c, %c only a code point in range or one character.
static void percent_format_converts_integers_as_python_does(void **state)
{
    (void)state;
    expect("{{ '%d' % 1e20 }}|{{ '%+d' % -1e20 }}|{{ '%030d' % 1e20 }}|{{ '%-24d|' % 1e20 }}|{{ '%.23d' % 1e20 }}"
           "|{{ '%d' % 2.7 }}|{{ '%5i' % -2.7 }}|{{ '%c' % 65 }}{{ '%c' % 'x' }}",
           NULL,
           "100000000000000000000|-100000000000000000000|000000000100000000000000000000"
           "|100000000000000000000   ||00100000000000000000000|2|   -2|Ax");
    expect_error("{{ '%x' % 1e300 }}", NULL, "%x format: an integer is required, not float");
    expect_error("{{ '%o' % 3.0 }}", NULL, "%o format: an integer is required, not float");
    expect_error("{{ '%c' % 65.0 }}", NULL, "%c requires int or char, not float");
    expect_error("{{ '%c' % 'ab' }}", NULL, "%c requires int or char, not a string of another length");
    expect_error("{{ '%c' % 1114112 }}", NULL, "%c arg not in range(0x110000)");
    expect_error("{{ '%c' % -1 }}", NULL, "%c arg not in range(0x110000)");
    expect_error("{{ '%c' % 55296 }}", NULL, "%c of U+D800: a lone surrogate has no UTF-8 form");
    expect_error("{{ '%d' % (1e300 * 1e300) }}", NULL, "cannot convert float infinity to integer");
}

static void deep_nesting_is_refused_without_crashing(void **state)
{
    (void)state;
    size_t n = 100000;
    char *src = malloc(4 * n + 16);
    assert_non_null(src);
    // (((((...))))) far beyond the parse depth limit.
    size_t o = 0;
    o += (size_t)sprintf(src + o, "{{ ");
    for (size_t i = 0; i < n; i++) src[o++] = '(';
    src[o++] = '1';
    for (size_t i = 0; i < n; i++) src[o++] = ')';
    o += (size_t)sprintf(src + o, " }}");
    src[o] = 0;
    struct jinja_template *t;
    assert_int_equal(jinja_parse(src, o, &t, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "nested too deeply"));
    // not not not ... 1, and nested if blocks.
    o = 0;
    o += (size_t)sprintf(src + o, "{{ ");
    for (size_t i = 0; i < 20000; i++) o += (size_t)sprintf(src + o, "not ");
    o += (size_t)sprintf(src + o, "1 }}");
    assert_int_equal(jinja_parse(src, o, &t, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "nests more than"));
    o = 0;
    for (size_t i = 0; i < 5000; i++) o += (size_t)sprintf(src + o, "{%% if true %%}");
    assert_int_equal(jinja_parse(src, o, &t, err, sizeof err), MS_EINVAL);
    // Chains the parser builds left-deep, whose evaluation recursed once
    // per link with no bound (fuzz_jinja: 1 + 1 + ... overflowed the
    // stack): each link is a level of nesting.
    static const char *const links[] = {" + 1", " * 1", " ** 1", " and 1", " or 0", "|string", ".x", "[0]", "()", "|e"};
    for (size_t l = 0; l < sizeof links / sizeof links[0]; l++) {
        o = 0;
        o += (size_t)sprintf(src + o, "{{ 1");
        for (size_t i = 0; i < 20000; i++) o += (size_t)sprintf(src + o, "%s", links[l]);
        o += (size_t)sprintf(src + o, " }}");
        if (jinja_parse(src, o, &t, err, sizeof err) != MS_EINVAL || !strstr(err, "nests more than"))
            fail_msg("a chain of 20000 '%s' was not refused by depth: [%s]", links[l], err);
    }
    // 150 links, inside the limit, still render.
    o = 0;
    o += (size_t)sprintf(src + o, "{{ 0");
    for (size_t i = 0; i < 150; i++) o += (size_t)sprintf(src + o, " + 1");
    o += (size_t)sprintf(src + o, " }}");
    src[o] = 0;
    expect(src, NULL, "150");
    // A deep but legal template still works.
    o = 0;
    for (size_t i = 0; i < 50; i++) o += (size_t)sprintf(src + o, "{%% if true %%}");
    o += (size_t)sprintf(src + o, "deep");
    for (size_t i = 0; i < 50; i++) o += (size_t)sprintf(src + o, "{%% endif %%}");
    src[o] = 0;
    expect(src, NULL, "deep");
    free(src);
    // Values nested far deeper than printing allows fail cleanly.
    expect_error("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v|tojson }}",
                 NULL, "nests too deeply");
    expect_error("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
                 NULL, "nests too deeply");
}

static void loops_and_recursion_cannot_hang_the_server(void **state)
{
    (void)state;
    double t0 = ms_now();
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL,
                 "more than 10000000 loop iterations");
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, "macro calls nest more than 64 deep");
    // Past the stack, whatever the call limit says: refused, not a crash.
    {
        struct jinja_limits deep;
        jinja_limits_default(&deep);
        deep.max_call_depth = 1 << 30;
        assert_null(render_lim("{% macro f(n) %}{{ n + f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &deep));
        assert_non_null(strstr(err, "nests too deeply for the stack"));
    }
    expect_error("{{ range(1000000)|length }}", NULL, "Range too big");
    // Doubling a string 40 times would need a terabyte: the memory or output limit stops it.
    expect_error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                 NULL, "MiB a render may use");
    expect_error("{{ 'x' * 100000000000 }}", NULL, "too large");
    struct jinja_limits lim;
    jinja_limits_default(&lim);
    lim.max_output_bytes = 1000;
    char *out = render_lim("{% for i in range(2000) %}x{% endfor %}", NULL, &lim);
    assert_null(out);
    assert_non_null(strstr(err, "the rendered text exceeds 1000 bytes"));
    // Building range(n) and iterating it cost n steps each.
    lim.max_steps = 20;
    assert_null(render_lim("{% for i in range(11) %}{% endfor %}", NULL, &lim));
    assert_non_null(strstr(err, "more than 20 loop iterations"));
    out = render_lim("{% for i in range(9) %}{% endfor %}ok", NULL, &lim);
    assert_non_null(out);
    assert_string_equal(out, "ok");
    free(out);
    // All of the above stops well within a second or two.
    assert_true(ms_now() - t0 < 30);
}

// A name with a NUL inside ('length\0') compared against the built-in names
// read past the end of "length" (found by tests/fuzz/fuzz_jinja under ASan).
static void names_with_a_nul_are_unknown_not_overread(void **state)
{
    (void)state;
    static const char src[] = "{{ [[1]]|map('length\0')|list }}";
    struct jinja_template *t;
    assert_int_equal(jinja_parse(src, sizeof src - 1, &t, err, sizeof err), 0);
    char *out = NULL;
    size_t len;
    assert_true(jinja_render(t, NULL, 0, NULL, &out, &len, err, sizeof err) < 0);
    assert_non_null(strstr(err, "filter"));
    jinja_destroy(t);
}

static void malformed_templates_never_crash(void **state)
{
    (void)state;
    char *src = read_data("templates/qwen2.5-instruct.jinja");
    size_t n = strlen(src);
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"},"
                              "{\"role\": \"assistant\", \"content\": \"a\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {}}}]},"
                              "{\"role\": \"tool\", \"content\": \"t\"}]", 0, NULL);
    struct jinja_var vars[] = {{"messages", msgs}, {"add_generation_prompt", json_true()}, {"tools", json_null()}};
    // Every prefix of a real template: parses or fails cleanly; what parses renders or fails cleanly.
    size_t parsed = 0;
    for (size_t len = 0; len <= n; len++) {
        struct jinja_template *t;
        if (jinja_parse(src, len, &t, err, sizeof err) == 0) {
            parsed++;
            char *out;
            size_t ol;
            if (jinja_render(t, vars, 3, NULL, &out, &ol, err, sizeof err) == 0) free(out);
            jinja_destroy(t);
        } else {
            assert_true(strncmp(err, "line ", 5) == 0);
        }
    }
    assert_true(parsed > 0);
    // Random byte mutations, deterministic.
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char *m = malloc(n + 1);
    assert_non_null(m);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(m, src, n + 1);
        for (int k = 0; k < 1 + iter % 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            static const char pool[] = "{}%#-+()[]'\"|.,:=~*/ \nabcdefghijklmnopqrstuvwxyz0123456789";
            m[x % n] = pool[(x >> 32) % (sizeof pool - 1)];
        }
        struct jinja_template *t;
        if (jinja_parse(m, n, &t, err, sizeof err) == 0) {
            char *out;
            size_t ol;
            if (jinja_render(t, vars, 3, NULL, &out, &ol, err, sizeof err) == 0) free(out);
            jinja_destroy(t);
        }
    }
    free(m);
    json_decref(msgs);
    free(src);
}

static void huge_inputs_render_completely(void **state)
{
    (void)state;
    char *src = read_data("templates/qwen2.5-instruct.jinja");
    struct chat_template *t;
    assert_int_equal(chat_template_parse(src, strlen(src), &t, err, sizeof err), 0);
    // 20000 turns, and one 8 MiB message.
    json_t *msgs = json_array();
    for (int i = 0; i < 20000; i++)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user", "content", "turn"));
    size_t big = (size_t)8 << 20;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    memset(huge, 'z', big);
    huge[big] = 0;
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", huge));
    struct chat_template_args a = {.messages = msgs, .add_generation_prompt = true};
    char *out;
    size_t len;
    assert_int_equal(chat_template_render(t, &a, &out, &len, err, sizeof err), 0);
    assert_true(len > big + 20000 * 20);
    assert_memory_equal(out + len - 22, "<|im_start|>assistant\n", 22);
    free(out);
    free(huge);
    json_decref(msgs);
    chat_template_destroy(t);
    free(src);
}

struct thread_arg {
    const struct chat_template *t;
    const json_t *msgs;
    const char *want;
    int ok;
};

static void *render_many(void *p)
{
    struct thread_arg *a = p;
    char e[256];
    a->ok = 1;
    for (int i = 0; i < 300; i++) {
        struct chat_template_args args = {.messages = a->msgs, .add_generation_prompt = true,
                                          .kwargs = NULL, .eos_token = "<|im_end|>"};
        char *out;
        size_t len;
        if (chat_template_render(a->t, &args, &out, &len, e, sizeof e) || strcmp(out, a->want)) a->ok = 0;
        free(out);
    }
    return NULL;
}

static void one_parsed_template_renders_on_many_threads(void **state)
{
    (void)state;
    char *src = read_data("templates/qwen2.5-instruct.jinja");
    struct chat_template *t;
    assert_int_equal(chat_template_parse(src, strlen(src), &t, err, sizeof err), 0);
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"},"
                              "{\"role\": \"user\", \"content\": \"more\"}]", 0, NULL);
    const char *want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                       "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
                       "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n";
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){t, msgs, want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_many, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    json_decref(msgs);
    chat_template_destroy(t);
    free(src);
}

static void chat_template_passes_transformers_variables(void **state)
{
    (void)state;
    const char *src = "{{ messages|length }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
                      "{{ bos_token is defined }}|{{ eos_token }}|{{ enable_thinking }}";
    struct chat_template *t;
    assert_int_equal(chat_template_parse(src, strlen(src), &t, err, sizeof err), 0);
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"x\"}]", 0, NULL);
    json_t *kw = json_loads("{\"enable_thinking\": false}", 0, NULL);
    struct chat_template_args a = {.messages = msgs, .kwargs = kw, .eos_token = "<|im_end|>"};
    char *out;
    size_t len;
    assert_int_equal(chat_template_render(t, &a, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "1|True|True|False|False|<|im_end|>|False");
    free(out);
    json_t *bad = json_loads("{\"messages\": []}", 0, NULL);
    a.kwargs = bad;
    assert_int_equal(chat_template_render(t, &a, &out, &len, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "kwargs may not set 'messages'"));
    a.kwargs = NULL;
    a.messages = kw;
    assert_int_equal(chat_template_render(t, &a, &out, &len, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "messages must be an array"));
    json_decref(bad);
    json_decref(kw);
    json_decref(msgs);
    chat_template_destroy(t);
    assert_int_equal(chat_template_parse("{% if %}", 8, &t, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "chat template: line 1:"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(text_output_and_literals_render_like_python),
        cmocka_unit_test(whitespace_control_follows_trim_and_lstrip_blocks),
        cmocka_unit_test(for_loops_expose_loop_and_unpack),
        cmocka_unit_test(set_scoping_and_namespaces_match_jinja),
        cmocka_unit_test(macros_and_call_blocks_bind_arguments),
        cmocka_unit_test(filters_and_methods_follow_python),
        cmocka_unit_test(undefined_values_print_empty_and_fail_when_used),
        cmocka_unit_test(raise_exception_returns_the_template_message),
        cmocka_unit_test(parse_errors_name_the_line_and_what_was_expected),
        cmocka_unit_test(runtime_errors_name_the_line),
        cmocka_unit_test(percent_format_converts_integers_as_python_does),
        cmocka_unit_test(deep_nesting_is_refused_without_crashing),
        cmocka_unit_test(loops_and_recursion_cannot_hang_the_server),
        cmocka_unit_test(names_with_a_nul_are_unknown_not_overread),
        cmocka_unit_test(malformed_templates_never_crash),
        cmocka_unit_test(huge_inputs_render_completely),
        cmocka_unit_test(one_parsed_template_renders_on_many_threads),
        cmocka_unit_test(chat_template_passes_transformers_variables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
