// Pins the grammar engine on the real Qwen3 vocabulary: the language each
// compiler accepts and refuses (by name), token-level masks against a
// token-by-token check, EOS and special tokens, the cache, and hostile or
// malformed input refused or bounded. (Random walks validated by an
// independent JSON Schema validator live in validate_walks.py.)
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "moeserve_build.h"
#include "tokenizer/tokenizer.h"

#define MODEL_VOCAB 151936
#define TOOL_CALL 151657
#define TOOL_CALL_END 151658
#define IM_START 151644
#define THINK 151667

static struct tokenizer *tok;
static struct grammar_vocab *vocab;
static int32_t eos[2];
static char err[512];

static int group_setup(void **state)
{
    (void)state;
    if (tok_load(MOESERVE_TOKENIZER_DIR, &tok, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", MOESERVE_TOKENIZER_DIR, err);
        return -1;
    }
    eos[0] = tok_find_token(tok, "<|im_end|>");
    eos[1] = tok_find_token(tok, "<|endoftext|>");
    return grammar_vocab_create(tok, MODEL_VOCAB, eos, 2, &vocab, err, sizeof err);
}

static int group_teardown(void **state)
{
    (void)state;
    grammar_vocab_destroy(vocab);
    tok_destroy(tok);
    return 0;
}

static int compile(enum grammar_kind kind, const char *text, struct grammar **g)
{
    struct grammar_source src = {.kind = kind, .text = text, .len = text ? strlen(text) : 0};
    err[0] = 0;
    *g = NULL;
    return grammar_compile(vocab, &src, g, err, sizeof err);
}

static struct grammar *must_compile(enum grammar_kind kind, const char *text)
{
    struct grammar *g;
    int rc = compile(kind, text, &g);
    if (rc) fprintf(stderr, "compile failed: %s\n", err);
    assert_int_equal(rc, 0);
    return g;
}

// Whether text (bytes) is a complete sentence of g.
static bool matches(struct grammar *g, const char *text, size_t len);

// Number bounds with fractions (Pydantic's confloat(ge=0.01) and the like):
// every candidate decimal (integer parts -13..13, fractions that sit on, just
// beside and far from the bounds' digits, up to 11 of them) is accepted exactly when the
// double it reads as lies within the bounds, as a client's validator
// compares. "-0" forms are left out: the grammar never writes them.
static void decimal_number_bounds_hold_as_doubles(void **state)
{
    (void)state;
    // The bounds' keys and values as the schema writes them (NULL: none).
    const struct {
        const char *lo_key, *lo, *hi_key, *hi;
    } bounds[] = {
        {"minimum", "0.01", NULL, NULL},
        {"exclusiveMinimum", "0.5", "maximum", "2.25"},
        {"minimum", "-1.5", "exclusiveMaximum", "-0.05"},
        {"exclusiveMinimum", "-2.125", "exclusiveMaximum", "10.1"},
        {"minimum", "0.1", "maximum", "0.3"},
        {"exclusiveMinimum", "0.25", "exclusiveMaximum", "0.26"},
        {NULL, NULL, "maximum", "-12.5"},
        {"minimum", "3", "maximum", "3.5"},
        {"exclusiveMinimum", "0", "maximum", "1e-3"},
    };
    const char *fracs[] = {"", ".0", ".00", ".001", ".0009", ".001000", ".0011", ".01", ".009", ".0100", ".011",
                           ".05", ".049", ".0501", ".1", ".099999", ".1000", ".10001", ".124", ".125", ".1251",
                           ".2", ".25", ".2500", ".2501", ".255", ".26", ".2599999", ".26001", ".3", ".29999",
                           ".30000", ".30001", ".5", ".4999", ".50", ".50001", ".75", ".9", ".99999999999999"};
    int checked = 0;
    for (size_t k = 0; k < sizeof bounds / sizeof *bounds; k++) {
        char schema[200];
        snprintf(schema, sizeof schema, "{\"type\":\"number\"%s%s%s%s%s%s%s%s}", bounds[k].lo_key ? ",\"" : "",
                 bounds[k].lo_key ? bounds[k].lo_key : "", bounds[k].lo_key ? "\":" : "", bounds[k].lo ? bounds[k].lo : "",
                 bounds[k].hi_key ? ",\"" : "", bounds[k].hi_key ? bounds[k].hi_key : "", bounds[k].hi_key ? "\":" : "",
                 bounds[k].hi ? bounds[k].hi : "");
        const double lo = bounds[k].lo ? strtod(bounds[k].lo, NULL) : -HUGE_VAL;
        const double hi = bounds[k].hi ? strtod(bounds[k].hi, NULL) : HUGE_VAL;
        const bool lo_ex = bounds[k].lo_key && !strcmp(bounds[k].lo_key, "exclusiveMinimum");
        const bool hi_ex = bounds[k].hi_key && !strcmp(bounds[k].hi_key, "exclusiveMaximum");
        struct grammar *g = must_compile(GRAMMAR_JSON_SCHEMA, schema);
        for (int n = -13; n <= 13; n++)
            for (size_t f = 0; f < sizeof fracs / sizeof *fracs; f++) {
                for (int neg = 0; neg < 2; neg++) {
                    if (neg && n > 0) continue;
                    if (!neg && n < 0) continue;
                    char text[48];
                    snprintf(text, sizeof text, "%s%d%s", neg && n == 0 ? "-" : "", n, fracs[f]);
                    const double x = strtod(text, NULL);
                    // Fewer digits than the cap on significant ones (15 beside
                    // the larger bound) leaves: never the reason here.
                    if (strlen(fracs[f]) > 12) continue;
                    if (neg && x == 0) continue; // -0, -0.0: never written
                    const bool in = (lo_ex ? x > lo : x >= lo) && (hi_ex ? x < hi : x <= hi);
                    if (matches(g, text, strlen(text)) != in)
                        fail_msg("%s: %s is %s the bounds but the grammar %s it", schema, text,
                                 in ? "within" : "outside", in ? "refuses" : "accepts");
                    checked++;
                }
            }
        grammar_unref(g);
    }
    print_message("%d numbers checked against the bounds\n", checked);
    // Past 14 integer digits an inclusive bound still holds (rounding keeps
    // order): compiled, one fraction digit.
    struct grammar *big = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"maximum\":1e17}");
    assert_true(matches(big, "100000000000000000", 18));
    assert_true(matches(big, "99999999999999999.5", 19));
    assert_false(matches(big, "100000000000000001", 18));
    grammar_unref(big);
}

static bool matches(struct grammar *g, const char *text, size_t len)
{
    struct grammar_matcher *m;
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    bool ok = grammar_matcher_accept_bytes(m, text, len, err, sizeof err) == 0 && grammar_matcher_can_end(m);
    grammar_matcher_destroy(m);
    return ok;
}

#define ACCEPTS(g, s) assert_true(matches((g), (s), strlen(s)))
#define REFUSES(g, s) assert_false(matches((g), (s), strlen(s)))

// A refusal with this code whose sentence contains `word`.
static void refused(enum grammar_kind kind, const char *text, int code, const char *word)
{
    struct grammar *g;
    int rc = compile(kind, text, &g);
    if (rc != code || !strstr(err, word))
        fprintf(stderr, "for %.80s: expected %d with '%s', got %d: %s\n", text, code, word, rc, err);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err, word));
    assert_null(g);
}

static bool bit(const uint32_t *mask, int32_t id)
{
    return mask[id >> 5] >> (id & 31) & 1;
}

// ---- languages ----

static void regex_matches_exactly_its_language(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_REGEX, "[a-c]+(x|yz){2}");
    ACCEPTS(g, "abxyz");
    ACCEPTS(g, "cxx");
    REFUSES(g, "ab");
    REFUSES(g, "abxyzx");
    REFUSES(g, "dxx");
    grammar_unref(g);
    g = must_compile(GRAMMAR_REGEX, "^[α-γ]+\\d{2}\\.\\w?.$");
    ACCEPTS(g, "αβγ12.q€");
    ACCEPTS(g, "α00.é");
    REFUSES(g, "α00._\n"); // '.' does not match a newline
    REFUSES(g, "δ12.qq");
    grammar_unref(g);
    g = must_compile(GRAMMAR_REGEX, "[^a-z\\s]{1,3}|\\u0041\\x42");
    ACCEPTS(g, "AB");
    ACCEPTS(g, "Ω1");
    REFUSES(g, "a");
    REFUSES(g, "A B");
    grammar_unref(g);
}

static void regex_refuses_what_it_cannot_honour(void **state)
{
    (void)state;
    refused(GRAMMAR_REGEX, "(a)\\1", MS_EUNSUPPORTED, "backreferences");
    refused(GRAMMAR_REGEX, "a(?=b)", MS_EUNSUPPORTED, "lookaround");
    refused(GRAMMAR_REGEX, "\\bword", MS_EUNSUPPORTED, "word boundaries");
    refused(GRAMMAR_REGEX, "\\p{L}+", MS_EUNSUPPORTED, "Unicode property");
    refused(GRAMMAR_REGEX, "(?i)abc", MS_EUNSUPPORTED, "flags");
    refused(GRAMMAR_REGEX, "a^b", MS_EUNSUPPORTED, "anchors");
    refused(GRAMMAR_REGEX, "(ab", MS_EINVAL, "parenthesis");
    refused(GRAMMAR_REGEX, "ab)", MS_EINVAL, "parenthesis");
    refused(GRAMMAR_REGEX, "*a", MS_EINVAL, "nothing to repeat");
    refused(GRAMMAR_REGEX, "a{3,2}", MS_EINVAL, "above its maximum");
    refused(GRAMMAR_REGEX, "a{,3}", MS_EINVAL, "{0,n}");
    refused(GRAMMAR_GBNF, "start: \"a\" | \"b\"", MS_EINVAL, "Lark");
    refused(GRAMMAR_REGEX, "[z-a]", MS_EINVAL, "out of order");
    refused(GRAMMAR_REGEX, "[abc", MS_EINVAL, "unterminated");
    refused(GRAMMAR_REGEX, "ab\\", MS_EINVAL, "backslash");
    refused(GRAMMAR_REGEX, "\xff\xfe", MS_EFORMAT, "UTF-8");
}

static void choice_is_one_of_its_strings(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_CHOICE, "[\"yes\", \"no\", \"maybe so\", \"yes!\"]");
    ACCEPTS(g, "yes");
    ACCEPTS(g, "yes!");
    ACCEPTS(g, "maybe so");
    REFUSES(g, "ye");
    REFUSES(g, "yesno");
    REFUSES(g, "\"yes\"");
    grammar_unref(g);
    refused(GRAMMAR_CHOICE, "[\"a\",", MS_EFORMAT, "not JSON");
    refused(GRAMMAR_CHOICE, "[]", MS_EINVAL, "non-empty");
    refused(GRAMMAR_CHOICE, "{\"a\":1}", MS_EINVAL, "array");
    refused(GRAMMAR_CHOICE, "[\"a\", 3]", MS_EINVAL, "item 1");
    refused(GRAMMAR_CHOICE, "[\"\"]", MS_EINVAL, "item 0");
}

static void gbnf_follows_llama_cpp_syntax(void **state)
{
    (void)state;
    const char *arith =
        "# arithmetic\n"
        "root ::= expr\n"
        "expr ::= term ((\"+\" | \"-\") term)*   # sums\n"
        "term ::= [0-9]{1,3}\n"
        "       | \"(\" expr \")\"\n"
        "ws-x_1 ::= [ \\t\\n]? \"\\x41\\u00e9\"\n";
    struct grammar *g = must_compile(GRAMMAR_GBNF, arith);
    ACCEPTS(g, "1+(22-333)");
    ACCEPTS(g, "((7))");
    REFUSES(g, "1+");
    REFUSES(g, "1234");
    REFUSES(g, "(1");
    grammar_unref(g);
    // JSON in the style of llama.cpp's grammars: bodies on the next line,
    // an empty alternative, a whitespace rule called everywhere
    const char *json =
        "root ::= value\n"
        "value ::= obj | arr | str | num | (\"true\" | \"false\" | \"null\") ws\n"
        "obj ::=\n"
        "  \"{\" ws (\n"
        "    str \":\" ws value\n"
        "    (\",\" ws str \":\" ws value)*\n"
        "  )? \"}\" ws\n"
        "arr ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
        "str ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\nt] )* \"\\\"\" ws  # strings\n"
        "num ::= \"-\"? [0-9]+ ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,8}\n";
    g = must_compile(GRAMMAR_GBNF, json);
    ACCEPTS(g, "{\"a\": [1, -2, {\"b\":\"c\\n\"}], \"d\":\n  true}");
    REFUSES(g, "{\"a\": [1,]}");
    grammar_unref(g);
    g = must_compile(GRAMMAR_GBNF, "root ::= \"a\"{2,3} [^x-z]+ . \"é\"?\n");
    ACCEPTS(g, "aab€x");
    ACCEPTS(g, "aaaww\nxé");
    REFUSES(g, "ab€x");
    REFUSES(g, "aaxx");
    grammar_unref(g);
}

static void gbnf_refuses_malformed_and_left_recursive_grammars(void **state)
{
    (void)state;
    refused(GRAMMAR_GBNF, "root ::= item\n", MS_EINVAL, "'item' is used but not defined");
    refused(GRAMMAR_GBNF, "start ::= \"a\"\n", MS_EINVAL, "no rule 'root'");
    refused(GRAMMAR_GBNF, "root ::= root \"a\" | \"b\"\n", MS_EUNSUPPORTED, "left-recursive");
    refused(GRAMMAR_GBNF, "root ::= x\nx ::= y? root \"a\" | \"c\"\ny ::= \"b\"\n", MS_EUNSUPPORTED, "left-recursive");
    refused(GRAMMAR_GBNF, "root ::= \"a\" root\n", MS_EINVAL, "matches no text");
    refused(GRAMMAR_GBNF, "root ::= <think> \"a\"\n", MS_EUNSUPPORTED, "token references");
    refused(GRAMMAR_GBNF, "root ::= \"abc\n", MS_EINVAL, "unterminated string");
    refused(GRAMMAR_GBNF, "root ::= [abc\n", MS_EINVAL, "unterminated character class");
    refused(GRAMMAR_GBNF, "root ::= \"a\"\nroot ::= \"b\"\n", MS_EINVAL, "defined twice");
    refused(GRAMMAR_GBNF, "root = \"a\"\n", MS_EINVAL, "::=");
    refused(GRAMMAR_GBNF, "root ::= (\"a\"\n", MS_EINVAL, "parenthesis");
    refused(GRAMMAR_GBNF, "root ::= \"a\"{9999999}\n", MS_ENOFIT, "repetition");
}

static const char *tool_schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"location\":{\"type\":\"string\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
    "\"required\":[\"location\",\"unit\"]}";

static void schema_accepts_valid_and_refuses_invalid_documents(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_JSON_SCHEMA, tool_schema);
    ACCEPTS(g, "{\"location\":\"Paris\",\"unit\":\"celsius\"}");
    ACCEPTS(g, "{ \"location\" : \"Pa\\\"ris\\u00e9\" ,\n  \"unit\": \"fahrenheit\", \"days\": 14 }");
    REFUSES(g, "{\"unit\":\"celsius\",\"location\":\"Paris\"}");      // schema order
    REFUSES(g, "{\"location\":\"Paris\"}");                           // required
    REFUSES(g, "{\"location\":\"Paris\",\"unit\":\"kelvin\"}");       // enum
    REFUSES(g, "{\"location\":\"Paris\",\"unit\":\"celsius\",\"days\":15}");
    REFUSES(g, "{\"location\":\"Paris\",\"unit\":\"celsius\",\"x\":1}"); // no additional properties
    REFUSES(g, "{\"location\":\"a\tb\",\"unit\":\"celsius\"}");        // raw control character
    REFUSES(g, "{             \"location\":\"Paris\",\"unit\":\"celsius\"}"); // whitespace over the bound
    REFUSES(g, " {\"location\":\"Paris\",\"unit\":\"celsius\"}");
    grammar_unref(g);

    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}");
    const char *in[] = {"-5", "-1", "0", "9", "10", "99", "100", "120"};
    const char *out[] = {"-6", "121", "007", "1.0", "-", "1e2", "200", "-10"};
    for (size_t i = 0; i < 8; i++) {
        ACCEPTS(g, in[i]);
        REFUSES(g, out[i]);
    }
    grammar_unref(g);

    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":-2,\"maximum\":3}");
    const char *nin[] = {"-1.99", "-0.5", "0", "0.25", "2.999", "3", "3.000", "-1"};
    const char *nout[] = {"-2", "-2.0", "-2.5", "3.001", "4", "1e1", "-3", "03"};
    for (size_t i = 0; i < 8; i++) {
        ACCEPTS(g, nin[i]);
        REFUSES(g, nout[i]);
    }
    grammar_unref(g);

    // extra keys may not repeat a declared one
    g = must_compile(GRAMMAR_JSON_SCHEMA,
                     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"],"
                     "\"additionalProperties\":{\"type\":\"boolean\"}}");
    ACCEPTS(g, "{\"id\":1,\"idx\":true,\"i\":false,\"\":true}");
    REFUSES(g, "{\"id\":1,\"id\":true}");
    REFUSES(g, "{\"id\":1,\"x\":2}");
    grammar_unref(g);

    g = must_compile(GRAMMAR_JSON_SCHEMA,
                     "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/n\"}}}},"
                     "\"$ref\":\"#/$defs/n\"}");
    ACCEPTS(g, "{\"next\":{\"next\":{}}}");
    REFUSES(g, "{\"next\":{\"next\":1}}");
    grammar_unref(g);

    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^a\\\"b+$\"}");
    ACCEPTS(g, "\"a\\\"bb\"");
    REFUSES(g, "\"a\"bb\"");
    REFUSES(g, "\"ab\"");
    grammar_unref(g);

    // Lengths count code points, as JSON Schema (and Ajv) do: an escaped
    // surrogate pair is one, a lone escaped surrogate is not a character.
    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}");
    ACCEPTS(g, "\"ab\"");
    ACCEPTS(g, "\"a\\uD83D\\ude00\"");       // a + U+1F600
    ACCEPTS(g, "\"\\ud7ff\\uE000\"");        // both sides of the surrogates
    ACCEPTS(g, "\"\xf0\x9f\x98\x80\\n\"");    // raw U+1F600 and an escape
    REFUSES(g, "\"\\ud83d\\ude00\"");          // one character, not two
    REFUSES(g, "\"\\ud83dx\"");                // a lone high surrogate
    REFUSES(g, "\"x\\ude00\"");                // a lone low surrogate
    REFUSES(g, "\"\\ude00\\ud83d\"");          // low before high
    REFUSES(g, "\"\\ud83d\\ud83d\"");          // two highs
    grammar_unref(g);
    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":1}");
    ACCEPTS(g, "\"\\uDBFF\\uDFFF\"");          // U+10FFFF, one character
    REFUSES(g, "\"\\udbff\"");
    grammar_unref(g);

    g = must_compile(GRAMMAR_JSON_OBJECT, NULL);
    ACCEPTS(g, "{\"a\\ud83d\\ude00\":\"\\u0041\"}");
    REFUSES(g, "{\"a\":\"\\ud83d\"}");
    ACCEPTS(g, "{\"a\":[1,-2.5e3,true,null,{\"b\":\"c\"}],\"a\":{}}");
    REFUSES(g, "[1]");
    REFUSES(g, "{\"a\":01}");
    REFUSES(g, "{\"a\":1,}");
    // Exponents of two digits: e400 overflows a double, which our own
    // tool-call parser (jansson) refuses, so a forced call would be lost.
    ACCEPTS(g, "{\"a\":1e99,\"b\":-2.5E-07}");
    REFUSES(g, "{\"a\":1e400}");
    REFUSES(g, "{\"a\":1e100}");
    grammar_unref(g);

    // An exclusive bound stays exclusive as the double a client reads: no
    // more significant digits than a double keeps apart.
    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":1}");
    ACCEPTS(g, "0.99999999999999");
    ACCEPTS(g, "-2.99999999999999");
    REFUSES(g, "0.99999999999999999");
    REFUSES(g, "-2.9999999999999999");
    grammar_unref(g);

    // json_compact (vLLM's disable_any_whitespace): fixed separators, no
    // other whitespace, as xgrammar writes JSON with any_whitespace false.
    struct grammar_source cs = {.kind = GRAMMAR_JSON_SCHEMA, .text = tool_schema, .len = strlen(tool_schema),
                                .json_compact = true};
    assert_int_equal(grammar_compile(vocab, &cs, &g, err, sizeof err), 0);
    ACCEPTS(g, "{\"location\": \"Paris\", \"unit\": \"celsius\", \"days\": 14}");
    REFUSES(g, "{\"location\":\"Paris\",\"unit\":\"celsius\"}");
    REFUSES(g, "{ \"location\": \"Paris\", \"unit\": \"celsius\"}");
    REFUSES(g, "{\"location\": \"Paris\",\n\"unit\": \"celsius\"}");
    grammar_unref(g);
    cs = (struct grammar_source){.kind = GRAMMAR_JSON_OBJECT, .json_compact = true};
    assert_int_equal(grammar_compile(vocab, &cs, &g, err, sizeof err), 0);
    ACCEPTS(g, "{\"a\": [1, {\"b\": []}, {}], \"c\": null}");
    REFUSES(g, "{\"a\": [1,2]}");
    REFUSES(g, "{\"a\" : 1}");
    grammar_unref(g);

    // format email: a dot-atom local part and a host of two labels or more,
    // no label starting or ending with '-'.
    g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}");
    ACCEPTS(g, "\"a.b+c@ex-ample.co.uk\"");
    ACCEPTS(g, "\"o'neil_{x}@b.io\"");
    static const char *const bad_mail[] = {"\".a@b.co\"", "\"a..b@c.de\"", "\"a.@b.co\"", "\"a@-b.co\"",
                                           "\"a@b-.co\"", "\"a@b\"", "\"@b.co\""};
    for (size_t i = 0; i < sizeof bad_mail / sizeof bad_mail[0]; i++) REFUSES(g, bad_mail[i]);
    grammar_unref(g);
}

static void schema_refuses_unsupported_keywords_by_name(void **state)
{
    (void)state;
    // An $id below the root would make its $refs relative to it (every $ref
    // here resolves from the root): refused where a $ref lies under it.
    refused(GRAMMAR_JSON_SCHEMA,
            "{\"type\":\"object\",\"properties\":{\"x\":{\"$id\":\"http://e.com/x\",\"$defs\":{\"A\":"
            "{\"type\":\"integer\"}},\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"type\":\"string\"}}}",
            MS_EUNSUPPORTED, "$id");
    struct grammar *ok = must_compile(GRAMMAR_JSON_SCHEMA, "{\"$id\":\"http://e.com/r\",\"type\":\"object\","
                                      "\"properties\":{\"x\":{\"$id\":\"http://e.com/x\",\"type\":\"integer\"}}}");
    grammar_unref(ok);
    struct {
        const char *schema;
        int code;
        const char *word;
    } cases[] = {
        {"{\"not\":{\"type\":\"string\"}}", MS_EUNSUPPORTED, "'not'"},
        {"{\"type\":\"object\",\"if\":{},\"then\":{}}", MS_EUNSUPPORTED, "'if'"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}", MS_EUNSUPPORTED, "'patternProperties'"},
        {"{\"type\":\"number\",\"multipleOf\":2}", MS_EUNSUPPORTED, "'multipleOf'"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", MS_EUNSUPPORTED, "uniqueItems"},
        {"{\"type\":\"object\",\"minProperties\":1}", MS_EUNSUPPORTED, "'minProperties'"},
        {"{\"$ref\":\"https://example.com/s.json\"}", MS_EUNSUPPORTED, "outside this document"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", MS_EUNSUPPORTED, "oneOf"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", MS_EUNSUPPORTED, "'hostname'"},
        {"{\"type\":\"number\",\"minimum\":1e-20}", MS_EUNSUPPORTED, "15 significant digits"},
        {"{\"type\":\"number\",\"minimum\":1e-40}", MS_EUNSUPPORTED, "15 significant digits"}, // not 0
        {"{\"type\":\"number\",\"minimum\":1234567890123455,\"exclusiveMaximum\":1234567890123456.5}",
         MS_EUNSUPPORTED, "exclusive number bounds of 1e14"},
        {"{\"type\":\"number\",\"minimum\":0.5,\"exclusiveMaximum\":0.5}", MS_EINVAL, "admit no value"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", MS_EUNSUPPORTED, "allOf"},
        {"{\"type\":\"string\",\"minLength\":1,\"anyOf\":[{}]}", MS_EUNSUPPORTED, "beside anyOf"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", MS_EUNSUPPORTED, "'a'"},
        {"{\"type\":\"foo\"}", MS_EINVAL, "unknown type 'foo'"},
        {"{\"$ref\":\"#/$defs/missing\"}", MS_EINVAL, "points nowhere"},
        {"{\"$ref\":\"#\"}", MS_EINVAL, "matches no text"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"}]}},\"$ref\":\"#/$defs/a\"}",
         MS_EINVAL, "matches no text"},
        {"{\"type\":\"array\",\"minItems\":1000000}", MS_ENOFIT, "minItems"},
        {"{\"enum\":[]}", MS_EINVAL, "enum"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", MS_EINVAL, "no value"},
        {"false", MS_EINVAL, "false"},
        {"{\"type\":\"object\",", MS_EFORMAT, "not JSON"},
        {"{\"a\":1,\"a\":2}", MS_EFORMAT, "not JSON"},
        {"[1,2]", MS_EINVAL, "object or a boolean"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) refused(GRAMMAR_JSON_SCHEMA, cases[i].schema, cases[i].code, cases[i].word);
}

// Schemas that cost a compiler without bounds are refused: a oneOf whose
// alternatives refer back to the root eight times over (8^depth visits to
// learn its types, hours), and a property name of 200000 bytes beside
// additionalProperties (a level of recursion a byte: the stack overflowed).
static void schema_refuses_what_would_exhaust_the_compiler(void **state)
{
    (void)state;
    refused(GRAMMAR_JSON_SCHEMA,
            "{\"oneOf\":[{\"anyOf\":[{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"$ref\":\"#\"},"
            "{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"$ref\":\"#\"},{\"$ref\":\"#\"}]},{\"type\":\"null\"}]}",
            MS_EUNSUPPORTED, "oneOf");
    const size_t lens[] = {GRAMMAR_MAX_KEY_BYTES + 1, 200000};
    for (size_t i = 0; i < 2; i++) {
        char *sch = malloc(lens[i] + 200);
        assert_non_null(sch);
        int n = sprintf(sch, "{\"type\":\"object\",\"properties\":{\"");
        memset(sch + n, 'a', lens[i]);
        sprintf(sch + n + lens[i], "\":{\"type\":\"string\"}},\"additionalProperties\":true}");
        // The longer one meets the expression-node budget first (its key's
        // literal): refused all the same, with that sentence.
        refused(GRAMMAR_JSON_SCHEMA, sch, MS_ENOFIT, i == 0 ? "property name" : "");
        free(sch);
    }
    // A name of 40 bytes compiles, and other keys are still taken. (Names
    // of a few hundred bytes meet the automaton's budget; past the limit
    // above they are refused before the trie's recursion starts.)
    char *sch = malloc(300);
    int n = sprintf(sch, "{\"type\":\"object\",\"properties\":{\"");
    memset(sch + n, 'a', 40);
    sprintf(sch + n + 40, "\":{\"type\":\"string\"}},\"additionalProperties\":true}");
    struct grammar *g = must_compile(GRAMMAR_JSON_SCHEMA, sch);
    ACCEPTS(g, "{\"b\":1}");
    grammar_unref(g);
    free(sch);
}

// ---- tokens ----

// Every id's mask bit against allows(), which runs the id's bytes through
// the stacks one by one: the precomputed sets must agree everywhere.
static void check_mask_against_each_token(struct grammar_matcher *m)
{
    uint32_t *mask = calloc((size_t)grammar_vocab_mask_words(vocab), sizeof *mask);
    assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
    int allowed = 0;
    for (int32_t id = 0; id < MODEL_VOCAB; id++) {
        bool a = grammar_matcher_allows(m, id);
        if (a != bit(mask, id)) fprintf(stderr, "token %d: mask %d, allows %d\n", id, bit(mask, id), a);
        assert_int_equal(a, bit(mask, id));
        allowed += a;
    }
    assert_true(allowed > 0);
    free(mask);
}

static void masks_agree_with_token_by_token_checks(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_JSON_SCHEMA, tool_schema);
    const char *prefixes[] = {"", "{", "{\"location\"", "{\"location\":\"Pa", "{\"location\":\"Paris\"", "{\"location\":\"Paris\", ",
                              "{\"location\":\"Paris\",\"unit\":\"celsius\",\"days\":1", "{\"location\":\"Paris\",\"unit\":\"celsius\"}"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        struct grammar_matcher *m;
        assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
        assert_int_equal(grammar_matcher_accept_bytes(m, prefixes[i], strlen(prefixes[i]), err, sizeof err), 0);
        check_mask_against_each_token(m);
        grammar_matcher_destroy(m);
    }
    grammar_unref(g);
    g = must_compile(GRAMMAR_GBNF, "root ::= (\"ab\" | [a-z] \"b\"+)+ \"!\"\n");
    struct grammar_matcher *m;
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_accept_bytes(m, "abzb", 4, err, sizeof err), 0);
    check_mask_against_each_token(m);
    grammar_matcher_destroy(m);
    grammar_unref(g);
}

static void a_token_not_allowed_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_JSON_OBJECT, NULL);
    struct grammar_matcher *m;
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    int32_t hello = tok_find_token(tok, "hello"), brace = tok_find_token(tok, "{");
    assert_true(hello >= 0 && brace >= 0);
    assert_int_equal(grammar_matcher_accept(m, hello, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "not allowed"));
    assert_int_equal(grammar_matcher_accept(m, -1, err, sizeof err), MS_EINVAL);
    assert_int_equal(grammar_matcher_accept(m, MODEL_VOCAB, err, sizeof err), MS_EINVAL);
    assert_int_equal(grammar_matcher_accept(m, eos[0], err, sizeof err), MS_EINVAL);
    assert_int_equal(grammar_matcher_accept(m, brace, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_accept_bytes(m, "]", 1, err, sizeof err), MS_EINVAL);
    assert_int_equal(grammar_matcher_accept_bytes(m, "}", 1, err, sizeof err), 0);
    assert_true(grammar_matcher_must_end(m));
    grammar_matcher_destroy(m);
    grammar_unref(g);
}

static void compacting_the_frame_pool_changes_no_mask(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_JSON_OBJECT, NULL);
    struct grammar_matcher *m;
    int words = grammar_vocab_mask_words(vocab);
    uint32_t *before = calloc((size_t)words, sizeof *before), *after = calloc((size_t)words, sizeof *after);
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    const char *text = "{\"a\":[[{\"b\":[1,{\"c\":\"x\"}]}],[[[\"d\",{\"e\":[tru";
    assert_int_equal(grammar_matcher_accept_bytes(m, text, strlen(text), err, sizeof err), 0);
    assert_int_equal(grammar_matcher_fill_mask(m, before), 0);
    assert_int_equal(grammar_matcher_compact(m), 0);
    assert_int_equal(grammar_matcher_fill_mask(m, after), 0);
    assert_memory_equal(before, after, (size_t)words * sizeof *before);
    const char *rest = "e]}]]]]}";
    assert_int_equal(grammar_matcher_accept_bytes(m, rest, strlen(rest), err, sizeof err), 0);
    assert_true(grammar_matcher_must_end(m));
    grammar_matcher_destroy(m);
    grammar_unref(g);
    free(before);
    free(after);
}

static void eos_is_allowed_exactly_where_the_grammar_may_end(void **state)
{
    (void)state;
    struct grammar *g = must_compile(GRAMMAR_REGEX, "ab(cd)?");
    struct grammar_matcher *m;
    uint32_t *mask = calloc((size_t)grammar_vocab_mask_words(vocab), sizeof *mask);
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    const char *steps[] = {"a", "b", "c", "d"};
    const bool can_end[] = {false, true, false, true};
    assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
    assert_false(bit(mask, eos[0]) || bit(mask, eos[1]));
    for (int i = 0; i < 4; i++) {
        assert_int_equal(grammar_matcher_accept_bytes(m, steps[i], 1, err, sizeof err), 0);
        assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
        assert_int_equal(bit(mask, eos[0]), can_end[i]);
        assert_int_equal(bit(mask, eos[1]), can_end[i]);
        assert_int_equal(grammar_matcher_can_end(m), can_end[i]);
    }
    assert_true(grammar_matcher_must_end(m));
    assert_int_equal(grammar_matcher_accept(m, eos[1], err, sizeof err), 0);
    assert_true(grammar_matcher_is_terminated(m));
    assert_int_equal(grammar_matcher_accept(m, eos[0], err, sizeof err), MS_EINVAL);
    assert_int_equal(grammar_matcher_reset(m), 0);
    assert_false(grammar_matcher_is_terminated(m));
    assert_int_equal(grammar_matcher_accept_bytes(m, "abcd", 4, err, sizeof err), 0);
    grammar_matcher_destroy(m);
    grammar_unref(g);
    free(mask);
}

static void tool_call_tokens_are_allowed_where_their_text_is(void **state)
{
    (void)state;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"}},\"required\":[\"name\"]}";
    struct grammar_source src = {.kind = GRAMMAR_JSON_SCHEMA, .text = schema, .len = strlen(schema),
                                 .prefix = "<tool_call>\n", .prefix_len = 12, .suffix = "\n</tool_call>", .suffix_len = 13};
    struct grammar *g;
    assert_int_equal(grammar_compile(vocab, &src, &g, err, sizeof err), 0);
    struct grammar_matcher *m;
    uint32_t *mask = calloc((size_t)grammar_vocab_mask_words(vocab), sizeof *mask);
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
    assert_true(bit(mask, TOOL_CALL));
    assert_false(bit(mask, TOOL_CALL_END));
    assert_int_equal(grammar_matcher_accept(m, TOOL_CALL, err, sizeof err), 0);
    const char *body = "\n{\"name\": \"f\"}\n";
    assert_int_equal(grammar_matcher_accept_bytes(m, body, strlen(body), err, sizeof err), 0);
    assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
    assert_true(bit(mask, TOOL_CALL_END));
    assert_false(bit(mask, eos[0]));
    assert_int_equal(grammar_matcher_accept(m, TOOL_CALL_END, err, sizeof err), 0);
    assert_true(grammar_matcher_must_end(m));
    grammar_matcher_destroy(m);
    grammar_unref(g);
    free(mask);
}

static void special_tokens_need_a_literal_and_padding_is_never_allowed(void **state)
{
    (void)state;
    uint32_t *mask = calloc((size_t)grammar_vocab_mask_words(vocab), sizeof *mask);
    struct grammar *g = must_compile(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\"}");
    struct grammar_matcher *m;
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_accept_bytes(m, "\"", 1, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
    assert_false(bit(mask, IM_START)); // special: its text would fit, but it is not text
    assert_true(bit(mask, THINK));     // added but not special: ordinary text
    for (int32_t id = tok_vocab_size(tok); id < MODEL_VOCAB; id++) assert_false(bit(mask, id));
    assert_int_equal(grammar_matcher_accept(m, IM_START, err, sizeof err), MS_EINVAL);
    grammar_matcher_destroy(m);
    grammar_unref(g);

    g = must_compile(GRAMMAR_GBNF, "root ::= \"<|im_start|>\" \"x\"\n");
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_fill_mask(m, mask), 0);
    assert_true(bit(mask, IM_START));
    assert_int_equal(grammar_matcher_accept(m, IM_START, err, sizeof err), 0);
    grammar_matcher_destroy(m);
    grammar_unref(g);
    free(mask);
}

static void vocab_refuses_bad_arguments(void **state)
{
    (void)state;
    struct grammar_vocab *v;
    assert_int_equal(grammar_vocab_create(tok, MODEL_VOCAB, eos, 0, &v, err, sizeof err), MS_EINVAL);
    int32_t bad = MODEL_VOCAB;
    assert_int_equal(grammar_vocab_create(tok, MODEL_VOCAB, &bad, 1, &v, err, sizeof err), MS_EINVAL);
    assert_int_equal(grammar_vocab_create(tok, 0, eos, 1, &v, err, sizeof err), MS_EINVAL);
    // a model vocabulary smaller than the tokenizer's: the rest are never allowed
    assert_int_equal(grammar_vocab_create(tok, 1000, (int32_t[]){5}, 1, &v, err, sizeof err), 0);
    assert_int_equal(grammar_vocab_mask_words(v), (1000 + 31) / 32);
    grammar_vocab_destroy(v);
}

// ---- the cache ----

struct cache_job {
    struct grammar_cache *c;
    int failures;
};

static void *cache_hammer(void *arg)
{
    struct cache_job *j = arg;
    char e[256];
    for (int i = 0; i < 60; i++) {
        char text[64];
        snprintf(text, sizeof text, "[\"a%d\", \"b\"]", i % 5);
        struct grammar_source src = {.kind = GRAMMAR_CHOICE, .text = text, .len = strlen(text)};
        struct grammar *g;
        if (grammar_cache_get(j->c, &src, &g, e, sizeof e)) {
            j->failures++;
            continue;
        }
        if (!matches(g, "b", 1)) j->failures++;
        grammar_unref(g);
    }
    return NULL;
}

static void cache_hits_keeps_refusals_evicts_least_recent_and_shares_across_threads(void **state)
{
    (void)state;
    struct grammar_cache *c;
    assert_int_equal(grammar_cache_create(vocab, 2, 0, &c, err, sizeof err), 0);
    struct grammar_source a = {.kind = GRAMMAR_REGEX, .text = "a+", .len = 2};
    struct grammar_source b = {.kind = GRAMMAR_REGEX, .text = "b+", .len = 2};
    struct grammar_source a_choice = {.kind = GRAMMAR_CHOICE, .text = "[\"a+\"]", .len = 6};
    struct grammar_source a_wrapped = a;
    a_wrapped.prefix = "x";
    a_wrapped.prefix_len = 1;
    struct grammar *g1, *g2, *g3;
    uint64_t hits, misses;
    size_t entries;
    assert_int_equal(grammar_cache_get(c, &a, &g1, err, sizeof err), 0);
    assert_int_equal(grammar_cache_get(c, &a, &g2, err, sizeof err), 0);
    assert_ptr_equal(g1, g2);
    grammar_cache_stats(c, &entries, NULL, &hits, &misses);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 1);
    grammar_unref(g2);
    assert_int_equal(grammar_cache_get(c, &a_wrapped, &g2, err, sizeof err), 0); // another key
    assert_ptr_not_equal(g1, g2);
    ACCEPTS(g2, "xaa");
    grammar_unref(g2);
    assert_int_equal(grammar_cache_get(c, &b, &g3, err, sizeof err), 0); // evicts a
    grammar_unref(g3);
    grammar_cache_stats(c, &entries, NULL, &hits, &misses);
    assert_int_equal(entries, 2);
    assert_int_equal(grammar_cache_get(c, &a, &g2, err, sizeof err), 0);
    assert_ptr_not_equal(g1, g2);   // compiled again
    ACCEPTS(g1, "aaa");             // the evicted one still works for its holder
    grammar_unref(g1);
    grammar_unref(g2);
    assert_int_equal(grammar_cache_get(c, &a_choice, &g1, err, sizeof err), 0); // kind is part of the key
    ACCEPTS(g1, "a+");
    grammar_unref(g1);
    // So is the JSON whitespace switch.
    struct grammar_source obj = {.kind = GRAMMAR_JSON_OBJECT}, obj_compact = obj;
    obj_compact.json_compact = true;
    assert_int_equal(grammar_cache_get(c, &obj, &g1, err, sizeof err), 0);
    assert_int_equal(grammar_cache_get(c, &obj_compact, &g2, err, sizeof err), 0);
    assert_ptr_not_equal(g1, g2);
    ACCEPTS(g1, "{\"a\":1}");
    REFUSES(g2, "{\"a\":1}");
    grammar_unref(g1);
    grammar_unref(g2);
    // A refusal is kept with its sentence: the second ask is a hit that
    // says the same, without compiling again.
    struct grammar_source bad = {.kind = GRAMMAR_REGEX, .text = "(", .len = 1};
    grammar_cache_stats(c, NULL, NULL, &hits, &misses);
    const uint64_t hits0 = hits, misses0 = misses;
    assert_int_equal(grammar_cache_get(c, &bad, &g1, err, sizeof err), MS_EINVAL);
    assert_null(g1);
    char first[sizeof err];
    snprintf(first, sizeof first, "%s", err);
    assert_true(first[0] != 0);
    snprintf(err, sizeof err, "stale");
    assert_int_equal(grammar_cache_get(c, &bad, &g1, err, sizeof err), MS_EINVAL);
    assert_null(g1);
    assert_string_equal(err, first);
    grammar_cache_stats(c, &entries, NULL, &hits, &misses);
    assert_int_equal(misses, misses0 + 1);
    assert_int_equal(hits, hits0 + 1);
    assert_int_equal(entries, 2); // it took the place of the least recent grammar
    grammar_cache_destroy(c);

    assert_int_equal(grammar_cache_create(vocab, 3, 0, &c, err, sizeof err), 0);
    pthread_t th[4];
    struct cache_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct cache_job){c, 0};
        assert_int_equal(pthread_create(&th[i], NULL, cache_hammer, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].failures, 0);
    }
    grammar_cache_stats(c, &entries, NULL, &hits, &misses);
    assert_true(entries <= 3);
    assert_int_equal(hits + misses, 240);
    grammar_cache_destroy(c);
}

// ---- hostile and malformed input ----

static char *repeat(const char *open, int n, const char *mid, const char *close)
{
    size_t lo = strlen(open), lm = strlen(mid), lc = strlen(close);
    char *s = malloc((size_t)n * (lo + lc) + lm + 1), *p = s;
    for (int i = 0; i < n; i++, p += lo) memcpy(p, open, lo);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lc) memcpy(p, close, lc);
    *p = 0;
    return s;
}

static void hostile_grammars_are_refused_or_bounded(void **state)
{
    (void)state;
    struct grammar *g;
    char *s = repeat("{\"type\":\"array\",\"items\":", 500, "{}", "}");
    refused(GRAMMAR_JSON_SCHEMA, s, MS_ENOFIT, "nests deeper");
    free(s);
    s = repeat("(", 5000, "a", ")");
    refused(GRAMMAR_REGEX, s, MS_ENOFIT, "nested too deeply");
    free(s);
    s = repeat("(", 5000, "\"a\"", ")");
    char *gbnf = malloc(strlen(s) + 16);
    sprintf(gbnf, "root ::= %s\n", s);
    refused(GRAMMAR_GBNF, gbnf, MS_ENOFIT, "nested too deeply");
    free(gbnf);
    free(s);
    // A chain of rules each starting with the next opens every one of them
    // where the output starts: past the matcher's stack, refused when it
    // compiles (it was the first request's matcher that failed, reported
    // as a request that did not fit); a shorter one still matches.
    for (int n = 3000; n >= 300; n -= 2700) {
        size_t cap = (size_t)n * 32 + 64;
        char *chain = malloc(cap), *p = chain;
        p += sprintf(p, "root ::= r0\n");
        for (int i = 0; i < n; i++) p += sprintf(p, "r%d ::= r%d \"x\"\n", i, i + 1);
        sprintf(p, "r%d ::= \"b\"\n", n);
        if (n == 3000) {
            refused(GRAMMAR_GBNF, chain, MS_ENOFIT, "where the output starts");
        } else {
            g = must_compile(GRAMMAR_GBNF, chain);
            grammar_unref(g);
        }
        free(chain);
    }
    // exponential determinization: refused at the state limit, not run for ever
    refused(GRAMMAR_REGEX, "(a|b)*a(a|b){40}", MS_ENOFIT, "automaton states");
    refused(GRAMMAR_REGEX, "((a{100}){100}){100}", MS_ENOFIT, "automaton states");
    // ... or, where the states stand for large sets of NFA states (any byte
    // beside counts), at the step budget, in a fraction of a second: the
    // second regex took 3.7 s of CPU to reach the state limit alone (on a
    // 2-core Xeon, -O2, the Qwen3 vocabulary), a hostile client's to spend
    // on every request worker
    double t0 = ms_now();
    refused(GRAMMAR_REGEX, ".*a.{20}", MS_ENOFIT, "too costly");
    refused(GRAMMAR_REGEX, ".*.{60}.*x.{60}", MS_ENOFIT, "too costly");
    print_message("two regexes refused at the step budget in %.2f s\n", ms_now() - t0);
    // while a large automaton of small sets is still built (32768 states)
    g = must_compile(GRAMMAR_REGEX, "[ab]*a[ab]{14}");
    ACCEPTS(g, "baaaaaaaaaaaaaaa");  // the 15th byte from the end is an a
    REFUSES(g, "abbbbbbbbbbbbbbb");  // it is a b
    grammar_unref(g);
    refused(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":9000,\"maxItems\":9999}",
            MS_ENOFIT, "");
    // a huge enum compiles (or is refused for size), and then matches exactly
    size_t cap = 6000 * 16 + 32;
    char *en = malloc(cap), *p = en;
    p += sprintf(p, "{\"enum\":[");
    for (int i = 0; i < 6000; i++) p += sprintf(p, "%s\"v%d\"", i ? "," : "", i * 7);
    sprintf(p, "]}");
    int rc = compile(GRAMMAR_JSON_SCHEMA, en, &g);
    assert_true(rc == 0 || rc == MS_ENOFIT);
    if (rc == 0) {
        ACCEPTS(g, "\"v41993\"");
        REFUSES(g, "\"v41994\"");
        grammar_unref(g);
    }
    free(en);
    // a text over the size limit is refused before parsing
    struct grammar_source big = {.kind = GRAMMAR_REGEX, .text = "a", .len = GRAMMAR_MAX_TEXT + 1};
    assert_int_equal(grammar_compile(vocab, &big, &g, err, sizeof err), MS_ENOFIT);
    // output nesting past the runtime depth limit is an error, not a crash
    g = must_compile(GRAMMAR_JSON_OBJECT, NULL);
    struct grammar_matcher *m;
    assert_int_equal(grammar_matcher_create(g, &m, err, sizeof err), 0);
    assert_int_equal(grammar_matcher_accept_bytes(m, "{\"a\":", 5, err, sizeof err), 0);
    rc = 0;
    for (int i = 0; i < 2000 && rc == 0; i++) rc = grammar_matcher_accept_bytes(m, "[", 1, err, sizeof err);
    assert_int_equal(rc, MS_ENOFIT);
    grammar_matcher_destroy(m);
    grammar_unref(g);
}

// A long chain needs one refinement round of minimization per state (12.8 s
// of CPU for this 14-byte regex before the budget); past the budget the
// automaton stays as determinized, and must still be exactly the language.
static void a_long_chain_keeps_its_language_past_the_minimization_budget(void **state)
{
    (void)state;
    enum { N = 9210 };
    struct grammar *g;
    int rc = compile(GRAMMAR_REGEX, "[ies\"]{9210}", &g);
    if (rc) fprintf(stderr, "compile: %s\n", err);
    assert_int_equal(rc, 0);
    char *s = malloc(N + 2);
    assert_non_null(s);
    for (int i = 0; i < N + 1; i++) s[i] = "ies\""[i % 4];
    assert_true(matches(g, s, N));
    assert_false(matches(g, s, N - 1));
    assert_false(matches(g, s, N + 1));
    s[N / 2] = 'x';
    assert_false(matches(g, s, N));
    free(s);
    grammar_unref(g);
}

static void malformed_input_never_crashes_a_compiler(void **state)
{
    (void)state;
    static const char *seeds[GRAMMAR_KIND_COUNT] = {
        [GRAMMAR_JSON_SCHEMA] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"},"
                                "\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/x\"},{\"type\":\"null\"}]}},\"$defs\":{\"x\":"
                                "{\"type\":\"array\",\"items\":{\"enum\":[1,\"t\"]},\"maxItems\":3}}}",
        [GRAMMAR_JSON_OBJECT] = "",
        [GRAMMAR_REGEX] = "^(a|[b-d\\d]+){2,5}\\.(?:x|y)*[^\\s\"]?$",
        [GRAMMAR_CHOICE] = "[\"alpha\",\"be\\u00e9ta\",\"gamma\"]",
        [GRAMMAR_GBNF] = "root ::= a (\",\" a)*\na ::= [a-z]{1,3} | \"(\" root \")\" # c\n",
    };
    uint64_t r = 12345;
    for (int kind = 0; kind < GRAMMAR_KIND_COUNT; kind++) {
        size_t n = strlen(seeds[kind]);
        char *buf = malloc(n + 1);
        int ok = 0;
        for (int t = 0; t < 300; t++) {
            memcpy(buf, seeds[kind], n + 1);
            size_t len = n;
            int edits = 1 + (int)(r % 4);
            for (int e = 0; e < edits && len; e++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                size_t at = (size_t)(r >> 33) % len;
                switch ((r >> 20) % 3) {
                case 0: buf[at] = (char)(r >> 40); break;       // replace a byte
                case 1: len = at; break;                        // truncate
                case 2: memmove(buf + at, buf + at + 1, len - at); len--; break; // drop a byte
                }
            }
            struct grammar_source src = {.kind = (enum grammar_kind)kind, .text = buf, .len = len};
            struct grammar *g;
            int rc = grammar_compile(vocab, &src, &g, err, sizeof err);
            if (rc == 0) {
                ok++;
                grammar_unref(g);
            } else {
                assert_true(err[0] != 0); // every refusal says why
            }
        }
        free(buf);
        (void)ok;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decimal_number_bounds_hold_as_doubles),
        cmocka_unit_test(regex_matches_exactly_its_language),
        cmocka_unit_test(regex_refuses_what_it_cannot_honour),
        cmocka_unit_test(choice_is_one_of_its_strings),
        cmocka_unit_test(gbnf_follows_llama_cpp_syntax),
        cmocka_unit_test(gbnf_refuses_malformed_and_left_recursive_grammars),
        cmocka_unit_test(schema_accepts_valid_and_refuses_invalid_documents),
        cmocka_unit_test(schema_refuses_unsupported_keywords_by_name),
        cmocka_unit_test(schema_refuses_what_would_exhaust_the_compiler),
        cmocka_unit_test(masks_agree_with_token_by_token_checks),
        cmocka_unit_test(a_token_not_allowed_is_refused_and_changes_nothing),
        cmocka_unit_test(compacting_the_frame_pool_changes_no_mask),
        cmocka_unit_test(eos_is_allowed_exactly_where_the_grammar_may_end),
        cmocka_unit_test(tool_call_tokens_are_allowed_where_their_text_is),
        cmocka_unit_test(special_tokens_need_a_literal_and_padding_is_never_allowed),
        cmocka_unit_test(vocab_refuses_bad_arguments),
        cmocka_unit_test(cache_hits_keeps_refusals_evicts_least_recent_and_shares_across_threads),
        cmocka_unit_test(hostile_grammars_are_refused_or_bounded),
        cmocka_unit_test(a_long_chain_keeps_its_language_past_the_minimization_budget),
        cmocka_unit_test(malformed_input_never_crashes_a_compiler),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
