// Pins api/output_parser: reasoning / content / tool-call splitting of Qwen3
// output, the same under every split of the deltas as for the whole text; the
// vLLM parser bugs it must not have; malformed model output; and the JSON of
// messages and stream deltas.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/output_parser.h"
#include "base/base.h"
#include "moeserve_build.h"
#include "tests/fuzz/fuzz_output_parser.h"
#include "tokenizer/tokenizer.h"

static const struct output_parser_opts QWEN3 = {.reasoning = true, .tools = true};
static const struct output_parser_opts TOOLS_ONLY = {.tools = true};

#define CALL(name, args) "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " args "}\n</tool_call>"

// ---- helpers ---------------------------------------------------------------------

static struct output_parser *parse_whole_n(const struct output_parser_opts *o, const char *text,
                                           size_t n)
{
    struct output_parser *p;
    char err[256];
    const struct output_event *ev;
    size_t n_ev;
    assert_int_equal(output_parser_create(o, &p, err, sizeof err), 0);
    assert_int_equal(output_parser_feed(p, text, n, &ev, &n_ev, err, sizeof err), 0);
    assert_int_equal(output_parser_finish(p, &ev, &n_ev, err, sizeof err), 0);
    return p;
}

static struct output_parser *parse_whole(const struct output_parser_opts *o, const char *text)
{
    return parse_whole_n(o, text, strlen(text));
}

static void assert_text(const char *got, size_t len, const char *want)
{
    if (len != strlen(want) || memcmp(got, want, len))
        fail_msg("got '%.*s' (%zu bytes), want '%s'", (int)len, got, len, want);
}

static void assert_content(const struct output_parser *p, const char *want)
{
    size_t len;
    const char *s = output_parser_content(p, &len);
    assert_text(s, len, want);
}

static void assert_reasoning(const struct output_parser *p, const char *want)
{
    size_t len;
    const char *s = output_parser_reasoning(p, &len);
    assert_text(s, len, want);
}

static void assert_call(const struct output_parser *p, int i, const char *name, const char *args)
{
    struct output_call c;
    assert_int_equal(output_parser_call(p, i, &c), 0);
    char id[32];
    snprintf(id, sizeof id, "call_%d", i);
    assert_string_equal(c.id, id);
    assert_text(c.name, c.name_len, name);
    assert_text(c.arguments, c.arguments_len, args);
}

static void check_split(const struct output_parser_opts *o, const char *text, size_t n,
                        const size_t *cuts, size_t n_cuts)
{
    char why[512];
    if (output_parser_check_split(o, text, n, cuts, n_cuts, why, sizeof why)) {
        char where[128] = "";
        for (size_t i = 0; i < n_cuts && i < 3; i++)
            snprintf(where + strlen(where), sizeof where - strlen(where), " %zu", cuts[i]);
        fail_msg("text '%.*s' cut at%s%s: %s", (int)n, text, where, n_cuts > 3 ? " ..." : "", why);
    }
}

// Every split into 2 and 3 pieces (all cut points, empty pieces included)
// and byte by byte.
static void check_every_split(const struct output_parser_opts *o, const char *text, size_t n,
                              bool three_pieces)
{
    for (size_t i = 0; i <= n; i++) {
        check_split(o, text, n, &i, 1);
        for (size_t j = i; three_pieces && j <= n; j++) {
            size_t cuts[2] = {i, j};
            check_split(o, text, n, cuts, 2);
        }
    }
    size_t *bytes = malloc((n + 1) * sizeof *bytes);
    assert_non_null(bytes);
    for (size_t i = 0; i < n; i++) bytes[i] = i + 1;
    check_split(o, text, n, bytes, n);
    free(bytes);
}

// ---- the promise: any split is the whole ------------------------------------------------

static const struct {
    const char *text;
    size_t len; // 0: strlen
} CORPUS[] = {
    {"Hello, world!", 0},
    {"", 0},
    {"<think>\nLet me think about 2+2.\n</think>\n\nIt is 4.", 0},
    {"Still thinking</think>\n\nDone.", 0},
    {"<think></think>", 0},
    {"<think>\nunterminated reasoning", 0},
    {"<think>\nThe user wants Paris.\n</think>\n\n" CALL("get_weather", "{\"city\": \"Paris\"}"), 0},
    {"Let me check.\n\n" CALL("get_weather", "{\"city\": \"Paris\"}") "\n"
     CALL("get_time", "{\"tz\": \"CET\"}") "\n", 0},
    {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> after", 0},
    {"<tool_call><tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call></tool_call>", 0},
    {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2, {\"y\": \"}\"}]}}\n", 0},
    {"<tool_call>\n{\"name\": \"f\", \"argum", 0},
    {"a <tool_ca b </think c <thi d </tool_call> <tool_call", 0},
    {"<think>\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80</think>\xe6\x97\xa5 <tool_call>{\"name\":\"\xc3\xbc\","
     "\"arguments\":{\"k\":\"\xc3\x9f\xf0\x9f\x98\x80\"}}</tool_call> \xe2\x9c\x93", 0},
    {"a\xff\xe2\x82 b \xf0\x9f\x98<tool_call>{\"name\":\"f\",\"arguments\":{\"s\":\"\xe2\x28\"}}"
     "</tool_call>\xc3", 0},
    {"x\0y<tool_call>{\"name\":\"f\",\"arguments\":{\"s\":\"a\\u0000b\"}}</tool_call>\0",
     sizeof "x\0y<tool_call>{\"name\":\"f\",\"arguments\":{\"s\":\"a\\u0000b\"}}</tool_call>\0" - 1},
    {"  \n\t<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>  \n  text  \n ", 0},
    {"<tool_call>{\"arguments\": {\"old\": 1}, \"name\": \"f\", \"argu\\u006dents\": "
     "{\"new\": \"\\\"}\\\\\"}}</tool_call>", 0},
    {"<think><think>nested</think></think>after", 0},
    {"</tool_call><tool_call>", 0},
    {"<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>", 0},
    {"<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>x<tool_call>{\"name\":\"b\","
     "\"arguments\":{\"q\":1}}</tool_call>", 0},
    {"<tool_call>", 0},
    {"<", 0},
    {"</think", 0},
    {"<think", 0},
    {"<think>\n</think>\n\n" CALL("f", "{}"), 0},
    {"\r\n\r\n", 0},
    {"<think>I will use <tool_call> now</think><tool_call>{\"name\":\"f\",\"arguments\":{}}"
     "</tool_call>", 0},
    {"<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"\","
     "\"arguments\":{}}</tool_call>", 0},
};

static const struct output_parser_opts OPTION_SETS[] = {
    {0},
    {.reasoning = true},
    {.reasoning = true, .start_in_reasoning = true},
    {.tools = true},
    {.tools = true, .max_call_bytes = 24},
    {.reasoning = true, .tools = true},
    {.reasoning = true, .start_in_reasoning = true, .tools = true},
    {.reasoning = true, .start_in_reasoning = true, .tools = true, .max_call_bytes = 24},
    {.tools = true, .max_calls = 1},
    {.reasoning = true, .tools = true, .max_calls = 1},
};

static void every_split_of_every_text_gives_the_whole_answer(void **state)
{
    (void)state;
    for (size_t t = 0; t < sizeof CORPUS / sizeof CORPUS[0]; t++) {
        size_t n = CORPUS[t].len ? CORPUS[t].len : strlen(CORPUS[t].text);
        for (size_t k = 0; k < sizeof OPTION_SETS / sizeof OPTION_SETS[0]; k++) {
            // three pieces under the options that look for every tag; two elsewhere
            bool three = OPTION_SETS[k].reasoning && OPTION_SETS[k].tools;
            check_every_split(&OPTION_SETS[k], CORPUS[t].text, n, three);
        }
    }
}

// Random texts made of tags, their pieces, JSON, whitespace, multibyte and
// broken UTF-8 and NUL, under random options and cuts (the fuzz target's
// check, run on a fixed seed so that the suite repeats it).
static void random_texts_under_random_cuts_give_the_whole_answer(void **state)
{
    (void)state;
    static const char *const parts[] = {
        "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_", "</thi", "<", ">", "\n",
        " ", "\t", "{\"name\": \"f\", \"arguments\": {", "{\"name\":\"g\",\"arguments\":{}}",
        "\"a\": 1}}", "}", "{", "\"", "\\", "\"x\":\"}\"", "\xc3\xa9", "\xf0\x9f\x98\x80",
        "\xe4\xb8", "\xad", "\xff", "\x80", "text", "\xc0\xaf", "\xed\xa0\x80",
    };
    uint32_t x = 12345;
    uint8_t buf[400];
    for (int iter = 0; iter < 6000; iter++) {
        size_t n = 2;
        x = x * 1103515245u + 12345u;
        buf[0] = (uint8_t)(x >> 16);
        buf[1] = (uint8_t)(x >> 8);
        int k = 1 + (int)((x >> 20) % 14);
        for (int i = 0; i < k; i++) {
            x = x * 1103515245u + 12345u;
            uint32_t pick = (x >> 16) % (sizeof parts / sizeof parts[0] + 1);
            if (pick == sizeof parts / sizeof parts[0]) {
                buf[n++] = 0; // a NUL byte
                continue;
            }
            size_t l = strlen(parts[pick]);
            if (n + l > sizeof buf) break;
            memcpy(buf + n, parts[pick], l);
            n += l;
        }
        if (fuzz_output_parser(buf, n)) fail_msg("random text %d broke the promise", iter);
    }
}

// The Qwen3 tokenizer's own pieces: a call's tags are single tokens, and
// multibyte characters span byte-level tokens.
static void qwen3_token_pieces_give_the_whole_answer(void **state)
{
    (void)state;
    struct tokenizer *tok;
    char err[512];
    assert_int_equal(tok_load(MOESERVE_TOKENIZER_DIR, &tok, err, sizeof err), 0);
    assert_int_equal(tok_find_token(tok, "<tool_call>") >= 0, 1);
    const char *text = "<think>\nThe user asks about Z\xc3\xbcrich \xf0\x9f\x8c\xa7. "
                       "I'll call the tool.\n</think>\n\n"
                       CALL("get_weather", "{\"city\": \"Z\xc3\xbcrich\", \"unit\": \"celsius\"}") "\n"
                       CALL("get_time", "{\"tz\": \"Europe/Zurich\"}");
    int32_t *ids;
    size_t n_ids, n = strlen(text);
    assert_int_equal(tok_encode(tok, text, n, &ids, &n_ids, err, sizeof err), 0);
    size_t *cuts = malloc(n_ids * sizeof *cuts), at = 0;
    assert_non_null(cuts);
    for (size_t i = 0; i < n_ids; i++) {
        size_t len;
        assert_non_null(tok_token_bytes(tok, ids[i], &len));
        at += len;
        cuts[i] = at;
    }
    assert_int_equal(at, n);
    check_split(&QWEN3, text, n, cuts, n_ids);
    struct output_parser *p = parse_whole(&QWEN3, text);
    assert_int_equal(output_parser_n_calls(p), 2);
    assert_call(p, 0, "get_weather", "{\"city\": \"Z\xc3\xbcrich\", \"unit\": \"celsius\"}");
    output_parser_destroy(p);
    free(cuts);
    free(ids);
    tok_destroy(tok);
}

// ---- what the text means ------------------------------------------------------------

static void qwen3_reasoning_goes_to_reasoning_and_the_rest_to_content(void **state)
{
    (void)state;
    struct output_parser_opts in_prompt = QWEN3;
    in_prompt.start_in_reasoning = true;
    struct {
        const struct output_parser_opts *o;
        const char *text, *reasoning, *content;
    } cases[] = {
        {&QWEN3, "<think>\nLet me think.\n</think>\n\nParis.", "\nLet me think.\n", "\n\nParis."},
        {&QWEN3, "No tags here.", "", "No tags here."},
        {&QWEN3, " <think>late</think>", "", " <think>late</think>"},
        {&QWEN3, "<think>\nout of tokens", "\nout of tokens", ""},
        {&in_prompt, "I think.\n</think>\n\nAnswer", "I think.\n", "\n\nAnswer"},
        {&in_prompt, "<think>\nI think.</think>Answer", "\nI think.", "Answer"},
        {&in_prompt, "never closed", "never closed", ""},
        {&QWEN3, "<think>a</think>b</think>c<think>d", "a", "b</think>c<think>d"},
        {&TOOLS_ONLY, "<think>a</think>b", "", "<think>a</think>b"},
        {&QWEN3, "<think>use <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call></think>",
         "use <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct output_parser *p = parse_whole(cases[i].o, cases[i].text);
        assert_reasoning(p, cases[i].reasoning);
        assert_content(p, cases[i].content);
        assert_int_equal(output_parser_n_calls(p), 0);
        output_parser_destroy(p);
    }
}

static void hermes_calls_become_tool_calls_with_the_models_argument_bytes(void **state)
{
    (void)state;
    const char *text = "Let me check both.\n\n"
                       CALL("get_weather", "{\"city\": \"Paris\",  \"days\": [1, 2]}") "\n"
                       "<tool_call>{\"name\":\"get_time\",\"arguments\":{\"tz\":\"CET\"}}</tool_call>\n";
    struct output_parser *p = parse_whole(&QWEN3, text);
    assert_content(p, "Let me check both.");
    assert_int_equal(output_parser_n_calls(p), 2);
    assert_call(p, 0, "get_weather", "{\"city\": \"Paris\",  \"days\": [1, 2]}");
    assert_call(p, 1, "get_time", "{\"tz\":\"CET\"}");
    output_parser_destroy(p);

    // text after a call stays content; whitespace around calls does not
    p = parse_whole(&TOOLS_ONLY, "  " CALL("f", "{}") "\n\nDone.\n");
    assert_content(p, "\n\nDone.");
    assert_call(p, 0, "f", "{}");
    output_parser_destroy(p);

    // no calls: the text is the model's, whitespace included
    p = parse_whole(&TOOLS_ONLY, "  plain\n");
    assert_content(p, "  plain\n");
    output_parser_destroy(p);
}

// parallel_tool_calls false: the first call is kept, later ones vanish
// whole (vLLM's rule); text between them and broken blocks stay content.
static void calls_past_max_calls_are_dropped_whole(void **state)
{
    (void)state;
    static const struct output_parser_opts ONE = {.reasoning = true, .tools = true, .max_calls = 1};
    const char *text = "<think>two cities</think>Checking.\n\n" CALL("get_weather", "{\"city\": \"Paris\"}")
                       "\n" CALL("get_weather", "{\"city\": \"Rome\"}") "\nthen\n"
                       "<tool_call>{\"name\": \"f\"}</tool_call>\n" CALL("g", "{}") "\n";
    struct output_parser *p = parse_whole(&ONE, text);
    assert_reasoning(p, "two cities");
    assert_content(p, "Checking.\nthen\n<tool_call>{\"name\": \"f\"}</tool_call>");
    assert_int_equal(output_parser_n_calls(p), 1);
    assert_call(p, 0, "get_weather", "{\"city\": \"Paris\"}");
    assert_string_equal(output_parser_finish_reason(p, "stop"), "tool_calls");
    output_parser_destroy(p);
    check_every_split(&ONE, text, strlen(text), false);

    // the same text with any number of calls keeps all three
    p = parse_whole(&QWEN3, text);
    assert_int_equal(output_parser_n_calls(p), 3);
    assert_call(p, 2, "g", "{}");
    output_parser_destroy(p);

    // two allowed: the third goes
    static const struct output_parser_opts TWO = {.tools = true, .max_calls = 2};
    p = parse_whole(&TWO, CALL("a", "{}") CALL("b", "{}") CALL("c", "{}") " end");
    assert_int_equal(output_parser_n_calls(p), 2);
    assert_call(p, 1, "b", "{}");
    assert_content(p, " end");
    output_parser_destroy(p);
}

// Qwen3-Coder's XML calls (vLLM's qwen3_coder parser): values converted by
// the types of the tool's parameters; unknown keys, failed conversions and
// string types stay strings; one newline trimmed at each end of a value.
static const char *const CODER_TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"write_file\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"path\": {\"type\": \"string\"}, \"lines\": {\"type\": \"integer\"}, \"ratio\": {\"type\": "
    "\"number\"}, \"force\": {\"type\": \"boolean\"}, \"tags\": {\"type\": \"array\"}, \"meta\": {\"type\": \"object\"}, "
    "\"mode\": {\"enum\": [\"a\", \"w\"]}, \"opt\": {\"type\": [\"null\", \"integer\"]}}}}}]";

#define XCALL(name, params) "<tool_call>\n<function=" name ">\n" params "</function>\n</tool_call>"
#define XPAR(k, v) "<parameter=" k ">\n" v "\n</parameter>\n"

static void qwen3_coder_xml_calls_take_their_types_from_the_tools(void **state)
{
    (void)state;
    json_t *tools = json_loads(CODER_TOOLS, 0, NULL);
    assert_non_null(tools);
    const struct output_parser_opts o = {.reasoning = true, .tools = true, .tool_format = OUTPUT_TOOLS_QWEN3_XML,
                                         .tool_defs = tools};
    const char *text = "I will write it.\n" XCALL("write_file",
        XPAR("path", "/tmp/a b.txt") XPAR("lines", "42") XPAR("ratio", "0.5") XPAR("force", "True")
        XPAR("tags", "[\"x\", 1]") XPAR("meta", "{\"k\": {\"n\": 2}}") XPAR("mode", "w") XPAR("opt", "NULL")
        XPAR("extra", "  keep  spaces\n") XPAR("body", "line 1\nline 2 <b>bold</b> \"q\""));
    struct output_parser *p = parse_whole(&o, text);
    assert_content(p, "I will write it.");
    assert_int_equal(output_parser_n_calls(p), 1);
    assert_call(p, 0, "write_file",
                "{\"path\": \"/tmp/a b.txt\", \"lines\": 42, \"ratio\": 0.5, \"force\": true, \"tags\": [\"x\", 1], "
                "\"meta\": {\"k\": {\"n\": 2}}, \"mode\": \"w\", \"opt\": null, \"extra\": \"  keep  spaces\\n\", "
                "\"body\": \"line 1\\nline 2 <b>bold</b> \\\"q\\\"\"}");
    assert_string_equal(output_parser_finish_reason(p, "stop"), "tool_calls");
    output_parser_destroy(p);
    check_every_split(&o, text, strlen(text), false);

    // Written as vLLM writes them (Python's json.dumps: floats as repr);
    // numbers read as Python's int() and float() read them.
    p = parse_whole(&o, XCALL("write_file", XPAR("ratio", "0.1") XPAR("meta", "{\"v\": 2.675, \"w\": [1e5, -0.0]}")
                                                XPAR("lines", " 5 ")));
    assert_call(p, 0, "write_file", "{\"ratio\": 0.1, \"meta\": {\"v\": 2.675, \"w\": [100000.0, -0.0]}, \"lines\": 5}");
    output_parser_destroy(p);
    // A whole number is an integer (vLLM's int(float(v))), past 2^53 too.
    p = parse_whole(&o, XCALL("write_file", XPAR("ratio", "2.0") XPAR("meta", "{}") XPAR("ratio", "1e17")));
    assert_call(p, 0, "write_file", "{\"ratio\": 100000000000000000, \"meta\": {}}");
    output_parser_destroy(p);
    p = parse_whole(&o, XCALL("write_file", XPAR("ratio", "0x10") XPAR("lines", "0x10")));
    assert_call(p, 0, "write_file", "{\"ratio\": \"0x10\", \"lines\": \"0x10\"}");
    output_parser_destroy(p);
    // Values that do not convert stay strings (a non-boolean is false, as vLLM has it).
    p = parse_whole(&o, XCALL("write_file", XPAR("lines", "forty") XPAR("ratio", "1e400") XPAR("force", "yes")
                                                XPAR("tags", "not json")));
    assert_call(p, 0, "write_file", "{\"lines\": \"forty\", \"ratio\": \"1e400\", \"force\": false, \"tags\": \"not json\"}");
    output_parser_destroy(p);
    // Python's spelling of an object or array, which json.loads refuses, is
    // read as vLLM's ast.literal_eval reads it; what json.dumps could not
    // write (a set, bytes) stays the model's text.
    const char *py = XCALL("write_file", XPAR("tags", "['x', (1, 2), None, True]")
                                             XPAR("meta", "{'path': 'a.txt', 'n': 1_000, 1: -0.5,}")
                                             XPAR("tags", "[b'raw']"));
    p = parse_whole(&o, py);
    assert_call(p, 0, "write_file", "{\"tags\": \"[b'raw']\", \"meta\": {\"path\": \"a.txt\", \"n\": 1000, "
                                    "\"1\": -0.5}}");
    output_parser_destroy(p);
    p = parse_whole(&o, XCALL("write_file", XPAR("meta", "{1, 2}") XPAR("tags", "('a',)")));
    assert_call(p, 0, "write_file", "{\"meta\": \"{1, 2}\", \"tags\": [\"a\"]}");
    output_parser_destroy(p);
    check_every_split(&o, py, strlen(py), false);

    // A parameter ends where the next begins or the function ends; </function>
    // may be missing; no parameters is {}; an unknown tool's values are strings.
    p = parse_whole(&o, "<tool_call>\n<function=write_file>\n<parameter=lines>\n7<parameter=path>\nx\n"
                        "</tool_call>" XCALL("ping", "") XCALL("other", XPAR("lines", "3")));
    assert_int_equal(output_parser_n_calls(p), 3);
    assert_call(p, 0, "write_file", "{\"lines\": 7, \"path\": \"x\"}");
    assert_call(p, 1, "ping", "{}");
    assert_call(p, 2, "other", "{\"lines\": \"3\"}");
    output_parser_destroy(p);

    // Not calls: text after </function>, no name, a name over two lines,
    // bytes that are not UTF-8; they stay content, byte for byte.
    const char *bad[] = {
        "<tool_call>\n<function=f>\n</function>\ntrailing\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>\n<function=a\nb>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=k>\n\xff\n</parameter>\n</function>\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = parse_whole(&o, bad[i]);
        assert_int_equal(output_parser_n_calls(p), 0);
        output_parser_destroy(p);
        check_every_split(&o, bad[i], strlen(bad[i]), false);
    }

    // A Hermes JSON body is a call too: a forced call's grammar writes one.
    p = parse_whole(&o, CALL("write_file", "{\"lines\": 1}"));
    assert_call(p, 0, "write_file", "{\"lines\": 1}");
    output_parser_destroy(p);
    // The Hermes format does not read XML bodies.
    p = parse_whole(&TOOLS_ONLY, XCALL("write_file", XPAR("lines", "42")));
    assert_int_equal(output_parser_n_calls(p), 0);
    output_parser_destroy(p);
    json_decref(tools);
}

static void arguments_keep_escapes_nesting_and_the_last_duplicate(void **state)
{
    (void)state;
    struct {
        const char *body, *name, *args;
    } cases[] = {
        {"{\"name\": \"f\", \"arguments\": {\"q\": \"say \\\"}\\\" and \\\\\", \"n\": [{}, [[]]]}}",
         "f", "{\"q\": \"say \\\"}\\\" and \\\\\", \"n\": [{}, [[]]]}"},
        {"{\"arguments\": {\"first\": 1}, \"name\": \"f\", \"argu\\u006dents\": {\"second\": 2}}",
         "f", "{\"second\": 2}"},
        {"{\"name\": \"\\u00fc\\u00df\", \"arguments\": {\"x\": 1e3, \"y\": -0.5, \"z\": null}}",
         "\xc3\xbc\xc3\x9f", "{\"x\": 1e3, \"y\": -0.5, \"z\": null}"},
        {"\n  {\"name\":\"f\",\"arguments\":{\"big\":123456789012345678901234567890}}  \n", "f",
         "{\"big\":123456789012345678901234567890}"},
        {"{\"name\": \"f\", \"arguments\": {\"s\": \"</think><tool_call>\"}}", "f",
         "{\"s\": \"</think><tool_call>\"}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "<tool_call>%s</tool_call>", cases[i].body);
        struct output_parser *p = parse_whole(&TOOLS_ONLY, text);
        assert_int_equal(output_parser_n_calls(p), 1);
        assert_call(p, 0, cases[i].name, cases[i].args);
        assert_content(p, "");
        output_parser_destroy(p);
    }
}

// A call that is not {"name": string, "arguments": object} stays content,
// raw, as vLLM leaves it; the calls around it are still kept.
static void calls_that_do_not_parse_stay_raw_content(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "{\"name\": \"f\", \"arguments\": {\"a\": }",        // broken JSON
        "{\"name\": 7, \"arguments\": {}}",                  // name not a string
        "{\"arguments\": {}}",                               // no name
        "{\"name\": \"f\"}",                                 // no arguments
        "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}", // arguments a string
        "{\"name\": \"f\", \"arguments\": [1]}",             // arguments an array
        "{\"name\": \"\", \"arguments\": {}}",               // empty name
        "{\"name\": \"f\\u0000g\", \"arguments\": {}}",      // NUL in the name
        "[{\"name\": \"f\", \"arguments\": {}}]",            // not an object
        "{\"name\": \"f\", \"arguments\": {}} extra",        // trailing bytes
        "",                                                  // empty
        "{\"name\": \"f\", \"arguments\": {\"x\": 1e400}}",  // beyond a double (known limit)
        "{\"name\": \"f\", \"arguments\": {\"s\": \"\xff\"}}", // invalid UTF-8 in the JSON
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        char text[1200], raw[512];
        snprintf(raw, sizeof raw, "<tool_call>%s</tool_call>", bodies[i]);
        snprintf(text, sizeof text, CALL("a", "{}") "\n%s\n" CALL("b", "{}"), raw);
        struct output_parser *p = parse_whole(&TOOLS_ONLY, text);
        assert_int_equal(output_parser_n_calls(p), 2);
        assert_call(p, 0, "a", "{}");
        assert_call(p, 1, "b", "{}");
        size_t len;
        const char *content = output_parser_content(p, &len);
        if (i == sizeof bodies / sizeof bodies[0] - 1) { // \xff is handed out as U+FFFD
            assert_non_null(strstr(content, "\"s\": \"\xef\xbf\xbd\""));
        } else {
            char want[600];
            snprintf(want, sizeof want, "\n%s", raw); // the whitespace before b is dropped
            assert_text(content, len, want);
        }
        output_parser_destroy(p);
    }
}

static void malformed_tags_and_bytes_are_content_never_a_crash(void **state)
{
    (void)state;
    struct output_parser *p;
    // a call opened inside a call: the first </tool_call> closes a broken body
    p = parse_whole(&TOOLS_ONLY, "<tool_call>\n<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>");
    assert_int_equal(output_parser_n_calls(p), 0);
    assert_content(p, "<tool_call>\n<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>");
    output_parser_destroy(p);

    // unterminated tags at the end are text
    static const char *const ends[] = {"x <tool_call", "x </tool_call>", "x <tool_call>\n{\"na", "<tool_call>"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        p = parse_whole(&QWEN3, ends[i]);
        assert_content(p, ends[i]);
        assert_int_equal(output_parser_n_calls(p), 0);
        output_parser_destroy(p);
    }

    // invalid UTF-8 becomes U+FFFD byte by byte; NUL bytes are kept
    p = parse_whole_n(&QWEN3, "a\xff" "b\xe2\x82" "c\0d\xf0\x9f\x98", 11);
    size_t len;
    const char *s = output_parser_content(p, &len);
    assert_int_equal(len, 1 + 3 + 1 + 6 + 1 + 1 + 1 + 9);
    assert_memory_equal(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\0d"
                           "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", len);
    output_parser_destroy(p);

    // deep nesting: jansson's depth limit refuses it, the text stays content
    size_t depth = 5000, n = 0;
    char *deep = malloc(2 * depth + 128);
    if (!deep) {
        fail();
        return;
    }
    n += (size_t)sprintf(deep, "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":");
    memset(deep + n, '[', depth);
    n += depth;
    memset(deep + n, ']', depth);
    n += depth;
    n += (size_t)sprintf(deep + n, "}}</tool_call>");
    p = parse_whole_n(&TOOLS_ONLY, deep, n);
    assert_int_equal(output_parser_n_calls(p), 0);
    s = output_parser_content(p, &len);
    assert_int_equal(len, n);
    output_parser_destroy(p);
    free(deep);
}

static void names_and_bodies_past_their_limits_stay_content(void **state)
{
    (void)state;
    char text[1024], name[OUTPUT_PARSER_MAX_NAME + 2];
    for (int over = 0; over <= 1; over++) {
        memset(name, 'n', sizeof name);
        name[OUTPUT_PARSER_MAX_NAME + over] = 0;
        snprintf(text, sizeof text, "<tool_call>{\"name\":\"%s\",\"arguments\":{}}</tool_call>", name);
        struct output_parser *p = parse_whole(&TOOLS_ONLY, text);
        assert_int_equal(output_parser_n_calls(p), !over);
        assert_content(p, over ? text : "");
        output_parser_destroy(p);
    }
    // a body of exactly max_call_bytes is a call; one byte more is content,
    // whether or not </tool_call> ever comes
    const char *body = "{\"name\":\"f\",\"arguments\":{}}";
    size_t bl = strlen(body);
    for (int over = 0; over <= 1; over++) {
        struct output_parser_opts o = {.tools = true, .max_call_bytes = bl - (size_t)over};
        for (int closed = 0; closed <= 1; closed++) {
            snprintf(text, sizeof text, "<tool_call>%s%s", body, closed ? "</tool_call>" : "");
            struct output_parser *p = parse_whole(&o, text);
            assert_int_equal(output_parser_n_calls(p), !over);
            assert_content(p, over ? text : "");
            output_parser_destroy(p);
            size_t cut = strlen(text) - 1;
            check_split(&o, text, strlen(text), &cut, 1);
        }
    }
}

static void tool_parsing_off_leaves_tags_as_text(void **state)
{
    (void)state;
    struct output_parser_opts o = {.reasoning = true}; // tool_choice "none"
    struct output_parser *p = parse_whole(&o, "<think>r</think>" CALL("f", "{}"));
    assert_reasoning(p, "r");
    assert_content(p, CALL("f", "{}"));
    assert_int_equal(output_parser_n_calls(p), 0);
    assert_string_equal(output_parser_finish_reason(p, "stop"), "stop");
    output_parser_destroy(p);
}

// ---- the vLLM parser bugs, each pinned -------------------------------------------------

// Streaming feed of text in the given deltas, collecting what a client sees.
struct seen {
    char content[1024], reasoning[1024];
    char args[4][256];
    char names[4][64];
    int begins;
    size_t n_events;
};

static void feed_deltas(struct output_parser *p, const char *const *deltas, size_t n, struct seen *s)
{
    memset(s, 0, sizeof *s);
    char err[256];
    for (size_t i = 0; i <= n; i++) {
        const struct output_event *ev;
        size_t n_ev;
        if (i < n)
            assert_int_equal(output_parser_feed(p, deltas[i], strlen(deltas[i]), &ev, &n_ev, err, sizeof err), 0);
        else
            assert_int_equal(output_parser_finish(p, &ev, &n_ev, err, sizeof err), 0);
        for (size_t k = 0; k < n_ev; k++) {
            const struct output_event *e = &ev[k];
            s->n_events++;
            switch (e->kind) {
            case OUTPUT_EVENT_CONTENT: strncat(s->content, e->text, e->len); break;
            case OUTPUT_EVENT_REASONING: strncat(s->reasoning, e->text, e->len); break;
            case OUTPUT_EVENT_TOOL_BEGIN:
                assert_int_equal(e->index, s->begins);
                assert_true(e->index < 4);
                snprintf(s->names[e->index], sizeof s->names[0], "%.*s", (int)e->len, e->text);
                s->begins++;
                break;
            case OUTPUT_EVENT_TOOL_ARGS:
                assert_true(e->index >= 0 && e->index < s->begins);
                strncat(s->args[e->index], e->text, e->len);
                break;
            }
        }
    }
}

// vLLM lost calls when streaming with enable_thinking false: its reasoning
// parser waited for a </think> the template had already closed.
static void calls_survive_streaming_with_thinking_off(void **state)
{
    (void)state;
    const char *prompt = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
                         "<think>\n\n</think>\n\n";
    struct output_parser_opts o = QWEN3;
    o.start_in_reasoning = output_parser_prompt_in_reasoning(prompt, strlen(prompt));
    assert_false(o.start_in_reasoning);
    struct output_parser *p;
    assert_int_equal(output_parser_create(&o, &p, NULL, 0), 0);
    const char *deltas[] = {"<tool_call>", "\n{\"name\": \"get", "_weather\", \"arguments\": {\"city\"",
                            ": \"Paris\"}}", "\n", "</tool_call>"};
    struct seen s;
    feed_deltas(p, deltas, sizeof deltas / sizeof deltas[0], &s);
    assert_int_equal(s.begins, 1);
    assert_string_equal(s.names[0], "get_weather");
    assert_string_equal(s.args[0], "{\"city\": \"Paris\"}");
    assert_string_equal(s.content, "");
    assert_string_equal(s.reasoning, "");
    output_parser_destroy(p);
}

// vLLM answered finish_reason "stop" with the raw <tool_call> text in content.
static void kept_calls_finish_with_tool_calls_and_no_raw_tags(void **state)
{
    (void)state;
    struct output_parser *p = parse_whole(&QWEN3, "<think>x</think>\n\n" CALL("f", "{\"a\": 1}") "\n");
    assert_string_equal(output_parser_finish_reason(p, "stop"), "tool_calls");
    assert_string_equal(output_parser_finish_reason(p, "length"), "length");
    assert_content(p, "");
    json_t *m = json_object();
    assert_int_equal(output_parser_message_fill(p, m, true), 0);
    assert_true(json_is_null(json_object_get(m, "content")));
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 1);
    json_decref(m);
    output_parser_destroy(p);

    p = parse_whole(&QWEN3, "no call");
    assert_string_equal(output_parser_finish_reason(p, "stop"), "stop");
    output_parser_destroy(p);
}

// vLLM dropped the final "} of the arguments when it came in the same delta as
// </tool_call>, and its streamed arguments differed from the non-streamed ones.
static void final_brace_of_arguments_is_kept_and_streamed_equals_whole(void **state)
{
    (void)state;
    const char *deltas[] = {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b",
                            "\"}}\n</tool_call>"};
    struct output_parser *p;
    assert_int_equal(output_parser_create(&TOOLS_ONLY, &p, NULL, 0), 0);
    struct seen s;
    feed_deltas(p, deltas, 2, &s);
    assert_string_equal(s.args[0], "{\"a\": \"b\"}");
    output_parser_destroy(p);
    p = parse_whole(&TOOLS_ONLY, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}\n</tool_call>");
    assert_call(p, 0, "f", s.args[0]);
    output_parser_destroy(p);
}

// vLLM numbered argument chunks wrongly in parallel calls.
static void argument_chunks_carry_their_own_call_index(void **state)
{
    (void)state;
    const char *deltas[] = {CALL("a", "{\"n\": 0}") "\n<tool_", "call>\n{\"name\": \"b\", \"arguments\": ",
                            "{\"n\": 1}}\n</tool_call>\n" CALL("c", "{\"n\": 2}")};
    struct output_parser *p;
    assert_int_equal(output_parser_create(&TOOLS_ONLY, &p, NULL, 0), 0);
    struct seen s;
    feed_deltas(p, deltas, 3, &s); // asserts begin indices 0, 1, 2 and args after their begin
    assert_int_equal(s.begins, 3);
    for (int i = 0; i < 3; i++) {
        char want[32];
        snprintf(want, sizeof want, "{\"n\": %d}", i);
        assert_string_equal(s.args[i], want);
        assert_int_equal(s.names[i][0], 'a' + i);
    }
    output_parser_destroy(p);
}

// vLLM leaked a </think> split across deltas into content.
static void think_end_split_anywhere_never_reaches_content(void **state)
{
    (void)state;
    const char *text = "<think>\nhmm\n</think>\n\nHi";
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++) {
        for (size_t j = i; j <= n; j++) {
            char a[64], b[64], c[64];
            snprintf(a, sizeof a, "%.*s", (int)i, text);
            snprintf(b, sizeof b, "%.*s", (int)(j - i), text + i);
            snprintf(c, sizeof c, "%s", text + j);
            const char *deltas[] = {a, b, c};
            struct output_parser *p;
            assert_int_equal(output_parser_create(&QWEN3, &p, NULL, 0), 0);
            struct seen s;
            feed_deltas(p, deltas, 3, &s);
            assert_string_equal(s.reasoning, "\nhmm\n");
            assert_string_equal(s.content, "\n\nHi");
            output_parser_destroy(p);
        }
    }
}

// A stop string (or max_tokens) may cut the output inside a call: a call
// whose JSON is complete is still kept; a broken one comes back as content.
// Meanwhile the parser says it is inside a call and how much it holds.
static void calls_cut_by_a_stop_are_kept_or_given_back(void **state)
{
    (void)state;
    struct output_parser *p;
    const struct output_event *ev;
    size_t n_ev;
    assert_int_equal(output_parser_create(&TOOLS_ONLY, &p, NULL, 0), 0);
    const char *t = "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": 1}}\n";
    assert_int_equal(output_parser_feed(p, t, strlen(t), &ev, &n_ev, NULL, 0), 0);
    assert_true(output_parser_in_call(p));
    assert_int_equal(output_parser_held(p), strlen(t) - strlen("ok"));
    assert_int_equal(n_ev, 1);
    assert_text(ev[0].text, ev[0].len, "ok");
    assert_int_equal(output_parser_finish(p, &ev, &n_ev, NULL, 0), 0);
    assert_int_equal(n_ev, 2);
    assert_int_equal(ev[0].kind, OUTPUT_EVENT_TOOL_BEGIN);
    assert_text(ev[1].text, ev[1].len, "{\"q\": 1}");
    assert_false(output_parser_in_call(p));
    assert_int_equal(output_parser_held(p), 0);
    output_parser_destroy(p);

    p = parse_whole(&TOOLS_ONLY, "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\"");
    assert_int_equal(output_parser_n_calls(p), 0);
    assert_content(p, "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\"");
    assert_string_equal(output_parser_finish_reason(p, "stop"), "stop");
    output_parser_destroy(p);
}

// ---- the interface -----------------------------------------------------------------------

static void held_bytes_are_a_possible_tag_or_character(void **state)
{
    (void)state;
    struct {
        const struct output_parser_opts *o;
        const char *delta;
        size_t held;
    } cases[] = {
        {&QWEN3, "<thi", 4},                // may open reasoning
        {&QWEN3, "<tool_ca", 8},            // may open a call
        {&QWEN3, "ab\xe4\xb8", 2},          // half a character
        {&QWEN3, "ab  \n", 3},              // whitespace that may precede a call
        {&TOOLS_ONLY, "ab </tool", 0},      // no call is open: not a tag to wait for
        {&(struct output_parser_opts){0}, "ab  <tool_ca", 0},
        {&(struct output_parser_opts){.reasoning = true, .start_in_reasoning = true}, "r</thin", 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct output_parser *p;
        const struct output_event *ev;
        size_t n_ev;
        assert_int_equal(output_parser_create(cases[i].o, &p, NULL, 0), 0);
        assert_int_equal(output_parser_feed(p, cases[i].delta, strlen(cases[i].delta), &ev, &n_ev, NULL, 0), 0);
        if (output_parser_held(p) != cases[i].held)
            fail_msg("'%s': held %zu, want %zu", cases[i].delta, output_parser_held(p), cases[i].held);
        output_parser_destroy(p);
    }
}

static void make_long_id(void *ctx, int index, char *out, size_t cap)
{
    int *calls = ctx;
    (*calls)++;
    assert_int_equal(cap, OUTPUT_PARSER_MAX_ID);
    if (!out) return;
    memset(out, 'x', cap); // no NUL: the parser must end it
    snprintf(out, cap, "call_r%d", index);
    if (index == 1) memset(out, 'y', cap);
}

static void ids_come_from_the_callers_generator(void **state)
{
    (void)state;
    int calls = 0;
    struct output_parser_opts o = TOOLS_ONLY;
    o.make_id = make_long_id;
    o.make_id_ctx = &calls;
    struct output_parser *p = parse_whole(&o, CALL("f", "{}") CALL("g", "{}"));
    assert_int_equal(calls, 2);
    struct output_call c;
    assert_int_equal(output_parser_call(p, 0, &c), 0);
    assert_string_equal(c.id, "call_r0");
    assert_int_equal(output_parser_call(p, 1, &c), 0);
    assert_int_equal(strlen(c.id), OUTPUT_PARSER_MAX_ID - 1);
    assert_int_equal(output_parser_call(p, 2, &c), MS_EINVAL);
    assert_int_equal(output_parser_call(p, -1, &c), MS_EINVAL);
    output_parser_destroy(p);
}

static void misuse_is_refused_with_a_sentence(void **state)
{
    (void)state;
    struct output_parser *p;
    const struct output_event *ev;
    size_t n_ev;
    char err[256];
    assert_int_equal(output_parser_create(NULL, &p, err, sizeof err), MS_EINVAL);
    assert_null(p);
    assert_int_equal(output_parser_create(&QWEN3, &p, err, sizeof err), 0);
    assert_int_equal(output_parser_feed(p, NULL, 3, &ev, &n_ev, err, sizeof err), MS_EINVAL);
    assert_int_equal(output_parser_feed(p, NULL, 0, &ev, &n_ev, err, sizeof err), 0);
    assert_int_equal(n_ev, 0);
    assert_int_equal(output_parser_finish(p, &ev, &n_ev, err, sizeof err), 0);
    assert_int_equal(output_parser_feed(p, "a", 1, &ev, &n_ev, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "after finish"));
    assert_int_equal(output_parser_finish(p, &ev, &n_ev, err, sizeof err), MS_EINVAL);
    output_parser_destroy(p);
    output_parser_destroy(NULL);
}

static void prompts_that_leave_think_open_start_in_reasoning(void **state)
{
    (void)state;
    struct {
        const char *prompt;
        bool open;
    } cases[] = {
        {"<|im_start|>assistant\n<think>\n", true},
        {"<|im_start|>assistant\n<think>", true},
        {"<|im_start|>assistant\n<think>\n\n</think>\n\n", false},
        {"<|im_start|>assistant\n", false},
        {"<|im_start|>user\n<think><|im_end|>\n<|im_start|>assistant\n", false},
        {"", false},
        {"think>\n", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(output_parser_prompt_in_reasoning(cases[i].prompt, strlen(cases[i].prompt)),
                         cases[i].open);
    assert_false(output_parser_prompt_in_reasoning(NULL, 0));
}

static void assert_json(json_t *j, const char *want)
{
    char *got = json_dumps(j, JSON_COMPACT);
    assert_non_null(got);
    if (strcmp(got, want)) fail_msg("got  %s\nwant %s", got, want);
    free(got);
}

static void message_has_content_reasoning_and_tool_calls(void **state)
{
    (void)state;
    struct output_parser *p = parse_whole(&QWEN3, "<think>\nr\n</think>\n\n"
                                          CALL("get_weather", "{\"city\": \"Paris\"}"));
    json_t *m = json_object();
    assert_int_equal(output_parser_message_fill(p, m, true), 0);
    assert_json(m, "{\"content\":null,\"reasoning_content\":\"\\nr\\n\",\"reasoning\":\"\\nr\\n\","
                   "\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\",\"function\":"
                   "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}");
    json_decref(m);
    m = json_object();
    assert_int_equal(output_parser_message_fill(p, m, false), 0); // include_reasoning false
    assert_null(json_object_get(m, "reasoning_content"));
    assert_null(json_object_get(m, "reasoning"));
    json_decref(m);
    output_parser_destroy(p);

    p = parse_whole(&QWEN3, "Just text.");
    m = json_object();
    assert_int_equal(output_parser_message_fill(p, m, true), 0);
    assert_json(m, "{\"content\":\"Just text.\",\"reasoning_content\":null,\"reasoning\":null}");
    json_decref(m);
    json_t *calls = output_parser_tool_calls_json(p);
    assert_json(calls, "[]");
    json_decref(calls);
    output_parser_destroy(p);
}

static void deltas_have_openai_stream_shapes(void **state)
{
    (void)state;
    struct output_parser *p;
    const struct output_event *ev;
    size_t n_ev;
    assert_int_equal(output_parser_create(&QWEN3, &p, NULL, 0), 0);
    const char *d1 = "<think>\nr</think>\n\nSure.\n" CALL("a", "{\"x\": 1}") "\n<tool_call>\n";
    assert_int_equal(output_parser_feed(p, d1, strlen(d1), &ev, &n_ev, NULL, 0), 0);
    json_t *delta = json_object();
    assert_int_equal(output_events_delta_fill(delta, ev, n_ev, true), 0);
    assert_json(delta, "{\"reasoning_content\":\"\\nr\",\"reasoning\":\"\\nr\",\"content\":\"\\n\\nSure.\","
                       "\"tool_calls\":[{\"index\":0,\"id\":\"call_0\",\"type\":\"function\",\"function\":"
                       "{\"name\":\"a\",\"arguments\":\"{\\\"x\\\": 1}\"}}]}");
    json_decref(delta);
    const char *d2 = "{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
    assert_int_equal(output_parser_feed(p, d2, strlen(d2), &ev, &n_ev, NULL, 0), 0);
    delta = json_object();
    assert_int_equal(output_events_delta_fill(delta, ev, n_ev, false), 0);
    assert_json(delta, "{\"tool_calls\":[{\"index\":1,\"id\":\"call_1\",\"type\":\"function\","
                       "\"function\":{\"name\":\"b\",\"arguments\":\"{}\"}}]}");
    json_decref(delta);
    assert_int_equal(output_parser_finish(p, &ev, &n_ev, NULL, 0), 0);
    assert_int_equal(n_ev, 0);
    delta = json_object();
    assert_int_equal(output_events_delta_fill(delta, ev, n_ev, true), 0);
    assert_json(delta, "{}");
    json_decref(delta);
    output_parser_destroy(p);

    // arguments of a call begun in an earlier batch: {index, function: {arguments}}
    struct output_event later = {.kind = OUTPUT_EVENT_TOOL_ARGS, .index = 3, .text = "{}", .len = 2};
    delta = json_object();
    assert_int_equal(output_events_delta_fill(delta, &later, 1, true), 0);
    assert_json(delta, "{\"tool_calls\":[{\"index\":3,\"function\":{\"arguments\":\"{}\"}}]}");
    json_decref(delta);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_split_of_every_text_gives_the_whole_answer),
        cmocka_unit_test(random_texts_under_random_cuts_give_the_whole_answer),
        cmocka_unit_test(qwen3_token_pieces_give_the_whole_answer),
        cmocka_unit_test(qwen3_reasoning_goes_to_reasoning_and_the_rest_to_content),
        cmocka_unit_test(hermes_calls_become_tool_calls_with_the_models_argument_bytes),
        cmocka_unit_test(calls_past_max_calls_are_dropped_whole),
        cmocka_unit_test(qwen3_coder_xml_calls_take_their_types_from_the_tools),
        cmocka_unit_test(arguments_keep_escapes_nesting_and_the_last_duplicate),
        cmocka_unit_test(calls_that_do_not_parse_stay_raw_content),
        cmocka_unit_test(malformed_tags_and_bytes_are_content_never_a_crash),
        cmocka_unit_test(names_and_bodies_past_their_limits_stay_content),
        cmocka_unit_test(tool_parsing_off_leaves_tags_as_text),
        cmocka_unit_test(calls_survive_streaming_with_thinking_off),
        cmocka_unit_test(kept_calls_finish_with_tool_calls_and_no_raw_tags),
        cmocka_unit_test(final_brace_of_arguments_is_kept_and_streamed_equals_whole),
        cmocka_unit_test(argument_chunks_carry_their_own_call_index),
        cmocka_unit_test(think_end_split_anywhere_never_reaches_content),
        cmocka_unit_test(calls_cut_by_a_stop_are_kept_or_given_back),
        cmocka_unit_test(held_bytes_are_a_possible_tag_or_character),
        cmocka_unit_test(ids_come_from_the_callers_generator),
        cmocka_unit_test(misuse_is_refused_with_a_sentence),
        cmocka_unit_test(prompts_that_leave_think_open_start_in_reasoning),
        cmocka_unit_test(message_has_content_reasoning_and_tool_calls),
        cmocka_unit_test(deltas_have_openai_stream_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
