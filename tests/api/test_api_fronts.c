// Pins the Responses and Anthropic Messages fronts (api/responses.h,
// api/anthropic.h): their bodies become the chat messages, tools and
// sampling the chat path runs; refusals name the API's own parameters;
// hostile and malformed bodies are taken or refused as 4xx; and the output
// parser's events become each API's events in order and the same answer
// as a whole body.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <jansson.h>

#include "api/anthropic.h"
#include "api/responses.h"
#include "base/arena.h"
#include "base/base.h"
#include "tests/hostile_json.h"

static const struct oa_limits lim = {.vocab_size = 1000, .max_model_len = 4096};

typedef int (*front_parse)(const char *body, size_t len, const struct oa_limits *lim,
                           struct arena *a, struct oa_chat_request *out, json_t **echo,
                           struct oa_error *e);

// Parses body with fn; on success returns the chat messages as compact JSON
// text (free it), on failure NULL with *e filled.
static char *parse(front_parse fn, const char *body, struct oa_chat_request *r, json_t **echo,
                   struct oa_error *e, struct arena *a)
{
    memset(e, 0, sizeof *e);
    if (fn(body, strlen(body), &lim, a, r, echo, e)) return NULL;
    return json_dumps(r->messages, JSON_COMPACT);
}

static void assert_json(json_t *got, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);
    assert_non_null(w);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("got  %s\nwant %s", g, want);
    }
    json_decref(w);
}

// ---- Responses ------------------------------------------------------------------------

static void responses_input_items_become_chat_messages(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"m\", \"instructions\": \"Be brief.\", \"input\": ["
        "{\"role\": \"developer\", \"content\": \"Use tools.\"},"
        "{\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\"},"
        " {\"type\": \"input_text\", \"text\": \"b\"}]},"
        "{\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": [], \"content\": [{\"type\": \"reasoning_text\", \"text\": \"hmm\"}]},"
        "{\"type\": \"function_call\", \"call_id\": \"call_1\", \"name\": \"f\", \"arguments\": \"{\\\"x\\\":1}\"},"
        "{\"type\": \"function_call\", \"call_id\": \"call_2\", \"name\": \"g\", \"arguments\": \"{}\"},"
        "{\"type\": \"function_call_output\", \"call_id\": \"call_1\", \"output\": \"one\"},"
        "{\"type\": \"function_call_output\", \"call_id\": \"call_2\", \"output\": [{\"type\": \"input_text\", \"text\": \"two\"}]},"
        "{\"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"done\"}]}],"
        "\"tools\": [{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"type\": \"object\"}},"
        " {\"type\": \"function\", \"name\": \"g\", \"description\": \"G\"}],"
        "\"tool_choice\": {\"type\": \"function\", \"name\": \"g\"}, \"max_output_tokens\": 50,"
        "\"reasoning\": {\"effort\": \"none\"}, \"temperature\": 0.5, \"store\": false,"
        "\"metadata\": {\"k\": \"v\"}, \"parallel_tool_calls\": false, \"unknown_field\": 1}";
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    json_t *echo;
    char *m = parse(rs_parse, body, &r, &echo, &e, a);
    if (!m) fail_msg("refused: %s (%s)", e.message, e.param);
    assert_json(r.messages,
                "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                "{\"role\":\"system\",\"content\":\"Use tools.\"},"
                "{\"role\":\"user\",\"content\":\"a\\nb\"},"
                "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"hmm\",\"tool_calls\":["
                "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}},"
                "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":{}}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"one\"},"
                "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"two\"},"
                "{\"role\":\"assistant\",\"content\":\"done\"}]");
    // As vLLM re-serializes tools for the template: absent fields are null.
    assert_json(r.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":null,"
                         "\"parameters\":{\"type\":\"object\"}}},"
                         "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"description\":\"G\",\"parameters\":null}}]");
    assert_int_equal(r.tool_choice, OA_TOOL_NAMED);
    assert_string_equal(r.tool_choice_name, "g");
    assert_int_equal(r.gen.max_tokens, 50);
    assert_int_equal(r.thinking, 0);
    assert_false(r.parallel_tool_calls);
    assert_true(r.gen.sampling.temperature == 0.5f);
    assert_string_equal(r.ignored, "unknown_field");
    // The Response repeats the request's own spelling of what it asked.
    assert_string_equal(json_string_value(json_object_get(echo, "instructions")), "Be brief.");
    assert_string_equal(json_string_value(json_object_get(json_object_get(echo, "tool_choice"), "name")), "g");
    assert_int_equal(json_integer_value(json_object_get(echo, "max_output_tokens")), 50);
    assert_string_equal(json_string_value(json_object_get(json_object_get(echo, "metadata"), "k")), "v");
    assert_true(json_real_value(json_object_get(echo, "temperature")) == 0.5);
    free(m);
    json_decref(echo);
    oa_chat_request_release(&r);
    // Items join the assistant message before them while its slot is empty,
    // as vLLM's construct_chat_messages_with_tool_call joins them: a message,
    // then reasoning, then a call are one turn; a second reasoning item opens
    // another; a call then a message are one turn; trailing reasoning is a turn.
    m = parse(rs_parse, "{\"input\": [{\"role\": \"user\", \"content\": \"q\"},"
                        "{\"role\": \"assistant\", \"content\": \"A\"},"
                        "{\"type\": \"reasoning\", \"content\": [{\"type\": \"reasoning_text\", \"text\": \"R1\"}]},"
                        "{\"type\": \"reasoning\", \"summary\": [{\"type\": \"summary_text\", \"text\": \"R2\"}]},"
                        "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{}\"},"
                        "{\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"o\"},"
                        "{\"type\": \"function_call\", \"call_id\": \"c2\", \"name\": \"f\", \"arguments\": \"{}\"},"
                        "{\"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"B\"}]},"
                        "{\"role\": \"user\", \"content\": \"again\"},"
                        "{\"type\": \"reasoning\", \"content\": [{\"type\": \"reasoning_text\", \"text\": \"R3\"}]}]}",
              &r, &echo, &e, a);
    if (!m) fail_msg("refused: %s (%s)", e.message, e.param);
    assert_json(r.messages,
                "[{\"role\":\"user\",\"content\":\"q\"},"
                "{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":\"R1\"},"
                "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"R2\",\"tool_calls\":["
                "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"o\"},"
                "{\"role\":\"assistant\",\"content\":\"B\",\"tool_calls\":["
                "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]},"
                "{\"role\":\"user\",\"content\":\"again\"},"
                "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"R3\"}]");
    free(m);
    json_decref(echo);
    oa_chat_request_release(&r);
    // A string input is one user message (empty instructions are none);
    // text.format becomes structured output.
    m = parse(rs_parse, "{\"input\": \"hi\", \"instructions\": \"\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"x\","
                        " \"schema\": {\"type\": \"object\"}}}}", &r, &echo, &e, a);
    assert_non_null(m);
    assert_string_equal(m, "[{\"role\":\"user\",\"content\":\"hi\"}]");
    assert_int_equal(r.gen.structured.kind, OA_SO_JSON_SCHEMA);
    free(m);
    json_decref(echo);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

struct refusal {
    const char *body;
    const char *param;
    int http;
};

static void check_refusals(front_parse fn, const struct refusal *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct arena *a = arena_create(4096);
        struct oa_chat_request r;
        struct oa_error e;
        json_t *echo = NULL;
        char *m = parse(fn, cases[i].body, &r, &echo, &e, a);
        if (m) fail_msg("taken: %s", cases[i].body);
        if (strcmp(e.param, cases[i].param) || e.http != cases[i].http)
            fail_msg("%s: param '%s' http %d (%s); want '%s' %d", cases[i].body, e.param, e.http,
                     e.message, cases[i].param, cases[i].http);
        assert_true(strlen(e.message) > 10);
        assert_null(echo);
        arena_destroy(a);
    }
}

static void responses_refusals_name_the_responses_parameter(void **state)
{
    (void)state;
    const struct refusal cases[] = {
        {"{\"input\": \"x\", \"store\": true}", "store", 400},
        {"{\"input\": \"x\", \"previous_response_id\": \"resp_1\"}", "previous_response_id", 400},
        {"{\"input\": \"x\", \"background\": true}", "background", 400},
        {"{\"input\": \"x\", \"max_output_tokens\": 0}", "max_output_tokens", 400},
        {"{\"input\": \"x\", \"max_output_tokens\": \"9\"}", "max_output_tokens", 400},
        {"{\"input\": \"x\", \"temperature\": 9}", "temperature", 400},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"web_search\"}]}", "tools[0].type", 400},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"a b\"}]}", "tools[0].name", 400},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\", \"parameters\": 3}]}",
         "tools[0].parameters", 400},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}], \"tool_choice\": "
         "{\"type\": \"function\", \"name\": \"g\"}}", "tool_choice.name", 400},
        {"{\"input\": \"x\", \"tool_choice\": {\"type\": \"allowed_tools\"}}", "tool_choice.type", 400},
        {"{\"input\": \"x\", \"tool_choice\": \"required\"}", "tool_choice", 400},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\"}}}",
         "text.format.schema", 400},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"schema\": 5}}}",
         "text.format.schema", 400},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"yaml\"}}}", "text.format.type", 400},
        {"{\"input\": \"x\", \"reasoning\": {\"effort\": \"extreme\"}}", "reasoning.effort", 400},
        {"{\"input\": \"x\", \"include\": [\"message.output_text.logprobs\"]}", "include[0]", 400},
        {"{\"input\": \"x\", \"truncation\": \"auto\"}", "truncation", 400},
        {"{\"input\": \"x\", \"top_logprobs\": 2}", "top_logprobs", 400},
        {"{\"input\": \"x\", \"prompt\": {\"id\": \"p\"}}", "prompt", 400},
        {"{}", "input", 400},
        {"{\"input\": 5}", "input", 400},
        {"{\"input\": []}", "input", 400},
        {"{\"input\": [5]}", "input[0]", 400},
        {"{\"input\": [{\"content\": \"x\"}]}", "input[0].type", 400},
        {"{\"input\": [{\"type\": \"item_reference\", \"id\": \"x\"}]}", "input[0].type", 400},
        {"{\"input\": [{\"role\": \"user\"}]}", "input[0].content", 400},
        {"{\"input\": [{\"role\": 3, \"content\": \"x\"}]}", "input[0].role", 400},
        {"{\"input\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "input[0].role", 400},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\"}]}]}",
         "input[0].content[0].type", 400},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\"}]}]}",
         "input[0].content[0].text", 400},
        {"{\"input\": [{\"type\": \"function_call\", \"name\": \"f\", \"arguments\": \"{}\"}]}",
         "input[0].call_id", 400},
        {"{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c\"}]}", "input[0].output", 400},
        {"{\"input\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", \"content\": \"x\"}]}",
         "input[1].role", 400},
        {"[1]", "", 400},
        {"{\"input\": \"x\",}", "", 400},
        {"", "", 400},
    };
    check_refusals(rs_parse, cases, sizeof cases / sizeof cases[0]);
}

// ---- Anthropic ------------------------------------------------------------------------

static void anthropic_blocks_become_chat_messages(void **state)
{
    (void)state;
    const char *body =
        "{\"model\": \"m\", \"max_tokens\": 64, \"system\": [{\"type\": \"text\", \"text\": "
        "\"x-anthropic-billing-header: cc_version=2.0; cch=9f3a\"}, {\"type\": \"text\", \"text\": \"S1\","
        " \"cache_control\": {\"type\": \"ephemeral\"}}, {\"type\": \"text\", \"text\": \"S2\"}],"
        "\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"},"
        "{\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"hm\", \"signature\": \"s\"},"
        " {\"type\": \"text\", \"text\": \"Let me look.\"},"
        " {\"type\": \"tool_use\", \"id\": \"toolu_1\", \"name\": \"w\", \"input\": {\"city\": \"Paris\"}}]},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"toolu_1\","
        " \"content\": [{\"type\": \"text\", \"text\": \"21C\"}]}, {\"type\": \"text\", \"text\": \"\"},"
        " {\"type\": \"text\", \"text\": \"So?\"}]}],"
        "\"tools\": [{\"name\": \"w\", \"description\": \"W\", \"input_schema\": {\"type\": \"object\"}}],"
        "\"tool_choice\": {\"type\": \"any\", \"disable_parallel_tool_use\": true},"
        "\"stop_sequences\": [\"END\"], \"temperature\": 0.25, \"top_k\": 7,"
        "\"thinking\": {\"type\": \"disabled\"}, \"metadata\": {\"user_id\": \"u1\"}}";
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    json_t *echo;
    char *m = parse(an_parse, body, &r, &echo, &e, a);
    if (!m) fail_msg("refused: %s (%s)", e.message, e.param);
    assert_null(echo);
    assert_json(r.messages,
                "[{\"role\":\"system\",\"content\":\"S1\\nS2\"},"
                "{\"role\":\"user\",\"content\":\"Weather?\"},"
                "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"reasoning_content\":\"hm\",\"tool_calls\":["
                "{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"21C\"},"
                "{\"role\":\"user\",\"content\":\"So?\"}]");
    assert_json(r.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"W\","
                         "\"parameters\":{\"type\":\"object\"}}}]");
    assert_int_equal(r.tool_choice, OA_TOOL_REQUIRED);
    assert_false(r.parallel_tool_calls);
    assert_int_equal(r.gen.max_tokens, 64);
    assert_int_equal(r.gen.n_stop, 1);
    assert_string_equal(r.gen.stop[0], "END");
    assert_int_equal(r.gen.sampling.top_k, 7);
    assert_int_equal(r.thinking, 0);
    assert_string_equal(r.gen.user, "u1");
    free(m);
    oa_chat_request_release(&r);
    // An empty system prompt is no system turn (Claude Code's billing header
    // above is dropped, as vLLM drops it: it changes with every request).
    const char *empty_sys = "{\"model\": \"m\", \"max_tokens\": 8, \"system\": \"\", \"messages\": "
                            "[{\"role\": \"user\", \"content\": \"x\"}]}";
    m = parse(an_parse, empty_sys, &r, &echo, &e, a);
    assert_non_null(m);
    assert_json(r.messages, "[{\"role\":\"user\",\"content\":\"x\"}]");
    free(m);
    oa_chat_request_release(&r);
    // count_tokens takes the same body without max_tokens.
    memset(&e, 0, sizeof e);
    const char *ct = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
    assert_int_equal(an_parse_count_tokens(ct, strlen(ct), &lim, a, &r, &e), 0);
    oa_chat_request_release(&r);
    arena_destroy(a);
}

static void anthropic_refusals_name_the_messages_parameter(void **state)
{
    (void)state;
#define M "\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]"
    const struct refusal cases[] = {
        {"{" M "}", "max_tokens", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5}", "messages", 400},
        {"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "model", 400},
        {"{" M ", \"max_tokens\": 0}", "max_tokens", 400},
        {"{" M ", \"max_tokens\": 5, \"stop_sequences\": [\"\"]}", "stop_sequences[0]", 400},
        {"{" M ", \"max_tokens\": 5, \"stop_sequences\": \"END\", \"top_k\": \"x\"}", "top_k", 400},
        {"{" M ", \"max_tokens\": 5, \"tools\": [{\"type\": \"bash_20250124\", \"name\": \"bash\"}]}",
         "tools[0].type", 400},
        {"{" M ", \"max_tokens\": 5, \"tools\": [{\"name\": \"w\", \"input_schema\": 3}]}",
         "tools[0].input_schema", 400},
        {"{" M ", \"max_tokens\": 5, \"tools\": [{\"name\": \"w\"}], \"tool_choice\": {\"type\": \"tool\","
         " \"name\": \"v\"}}", "tool_choice.name", 400},
        {"{" M ", \"max_tokens\": 5, \"tool_choice\": {\"type\": \"tool\"}}", "tool_choice.name", 400},
        {"{" M ", \"max_tokens\": 5, \"tool_choice\": {\"type\": \"some\"}}", "tool_choice.type", 400},
        {"{" M ", \"max_tokens\": 5, \"thinking\": {\"type\": \"maybe\"}}", "thinking.type", 400},
        {"{" M ", \"max_tokens\": 5, \"mcp_servers\": [{\"url\": \"x\"}]}", "mcp_servers", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": []}", "messages", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}",
         "messages[0].role", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\"}]}",
         "messages[0].content", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
         "[{\"type\": \"image\", \"source\": {}}]}]}", "messages[0].content[0].type", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
         "[{\"type\": \"tool_use\", \"id\": \"t\", \"name\": \"n\", \"input\": {}}]}]}",
         "messages[0].content[0]", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"assistant\", \"content\": "
         "[{\"type\": \"tool_use\", \"id\": \"t\", \"name\": \"n\", \"input\": [1]}]}]}",
         "messages[0].content[0].input", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
         "[{\"type\": \"tool_result\", \"content\": \"x\"}]}]}", "messages[0].content[0].tool_use_id", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
         "[{\"type\": \"text\", \"text\": 4}]}]}", "messages[0].content[0].text", 400},
        {"{\"model\": \"m\", \"max_tokens\": 5, \"system\": 7, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
         "system", 400},
        // A bad block after Claude Code's billing header (which is dropped)
        // is named where the client put it.
        {"{" M ", \"max_tokens\": 5, \"system\": [{\"type\": \"text\", \"text\": "
         "\"x-anthropic-billing-header: a\"}, 5]}", "system[1]", 400},
        {"{" M ", \"max_tokens\": 5, \"system\": [{\"type\": \"text\", \"text\": "
         "\"x-anthropic-billing-header: a\"}, {\"type\": \"image\"}]}", "system[1].type", 400},
        {"not json", "", 400},
    };
#undef M
    check_refusals(an_parse, cases, sizeof cases / sizeof cases[0]);
}

static void anthropic_errors_take_anthropics_shape(void **state)
{
    (void)state;
    const struct {
        int http;
        const char *type;
    } cases[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
                 {404, "not_found_error"}, {413, "request_too_large"},
                 {503, "overloaded_error"}, {500, "api_error"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct oa_error e;
        memset(&e, 0, sizeof e);
        oa_error_http(&e, cases[i].http, "c", "p", "went wrong \xff here");
        json_t *j = an_error_json(&e);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "type")), "error");
        json_t *err = json_object_get(j, "error");
        assert_string_equal(json_string_value(json_object_get(err, "type")), cases[i].type);
        // Invalid UTF-8 in a message still makes a message (U+FFFD in its place).
        assert_string_equal(json_string_value(json_object_get(err, "message")), "went wrong \xef\xbf\xbd here");
        json_decref(j);
    }
}

// ---- hostile values in every field --------------------------------------------------------

struct sweep {
    front_parse fn;
    json_t *root;
    int taken, refused;
};

static void parse_swept(const char *key, const char *value, void *ctx)
{
    struct sweep *c = ctx;
    char *text = json_dumps(c->root, 0);
    struct arena *a = arena_create(4096);
    struct oa_chat_request r;
    struct oa_error e;
    json_t *echo = NULL;
    char *m = parse(c->fn, text, &r, &echo, &e, a);
    if (m) {
        c->taken++;
        assert_true(json_array_size(r.messages) > 0);
        oa_chat_request_release(&r);
        json_decref(echo);
        free(m);
    } else {
        c->refused++;
        if (e.http < 400 || e.http > 499 || !e.message[0])
            fail_msg("%s = %s: http %d, message '%s'", key, value, e.http, e.message);
    }
    arena_destroy(a);
    free(text);
}

static const char *hostile[] = {
    "null", "true", "false", "0", "-1", "1", "2147483648", "-9223372036854775808", "1e308", "0.5",
    "\"\"", "\"x\"", "\"\\u0000\"", "[]", "[null]", "[1, \"a\", {}]", "{}", "{\"a\": {\"b\": []}}",
    "[{\"type\": \"text\", \"text\": \"t\"}]", "{\"type\": \"function\", \"name\": \"f\"}",
};

static void sweep_body(front_parse fn, const char *body, const char *list)
{
    json_t *root = json_loads(body, 0, NULL);
    assert_non_null(root);
    struct sweep c = {.fn = fn, .root = root};
    hostile_json_sweep(root, hostile, sizeof hostile / sizeof hostile[0], parse_swept, &c);
    // The turns' own fields, and their parts'.
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(root, list), i, item) {
        hostile_json_sweep(item, hostile, sizeof hostile / sizeof hostile[0], parse_swept, &c);
        json_t *content = json_object_get(item, "content");
        size_t k;
        json_t *part;
        json_array_foreach(content, k, part)
            if (json_is_object(part)) hostile_json_sweep(part, hostile, sizeof hostile / sizeof hostile[0], parse_swept, &c);
    }
    assert_true(c.taken > 0 && c.refused > 0);
    json_decref(root);
}

static void every_field_replaced_by_a_hostile_value_is_taken_or_refused(void **state)
{
    (void)state;
    sweep_body(rs_parse,
               "{\"model\": \"m\", \"instructions\": \"i\", \"input\": [{\"role\": \"user\", \"content\": "
               "[{\"type\": \"input_text\", \"text\": \"a\"}]}, {\"type\": \"function_call\", \"call_id\": "
               "\"c\", \"name\": \"f\", \"arguments\": \"{}\"}, {\"type\": \"function_call_output\", "
               "\"call_id\": \"c\", \"output\": \"o\"}, {\"type\": \"reasoning\", \"summary\": []}], "
               "\"tools\": [{\"type\": \"function\", \"name\": \"f\"}], \"tool_choice\": \"auto\", "
               "\"max_output_tokens\": 9, \"temperature\": 1, \"top_p\": 0.9, \"text\": {\"format\": "
               "{\"type\": \"text\"}}, \"reasoning\": {\"effort\": \"low\"}, \"stream\": true, "
               "\"store\": false, \"metadata\": {}, \"include\": [], \"truncation\": \"disabled\"}",
               "input");
    sweep_body(an_parse,
               "{\"model\": \"m\", \"max_tokens\": 9, \"system\": \"s\", \"messages\": [{\"role\": "
               "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}, {\"role\": \"assistant\", "
               "\"content\": [{\"type\": \"tool_use\", \"id\": \"t\", \"name\": \"f\", \"input\": {}}]}, "
               "{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"t\", "
               "\"content\": \"r\"}]}], \"tools\": [{\"name\": \"f\", \"input_schema\": {}}], "
               "\"tool_choice\": {\"type\": \"auto\"}, \"stop_sequences\": [\"x\"], \"temperature\": 1, "
               "\"top_p\": 1, \"top_k\": 5, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 100}, "
               "\"stream\": true, \"metadata\": {\"user_id\": \"u\"}}",
               "messages");
}

// ---- the builders ----------------------------------------------------------------------

struct collected {
    json_t *events;                  // [[name, data], ...]
};

static void collect(void *ctx, const char *event, json_t *data)
{
    struct collected *c = ctx;
    assert_non_null(data);
    json_array_append_new(c->events, json_pack("[s, o]", event, data));
}

static const struct output_event answer[] = {
    {OUTPUT_EVENT_REASONING, -1, "thin", 4, NULL},
    {OUTPUT_EVENT_REASONING, -1, "king", 4, NULL},
    {OUTPUT_EVENT_CONTENT, -1, "Hello", 5, NULL},
    {OUTPUT_EVENT_TOOL_BEGIN, 0, "f", 1, "call_abc"},
    {OUTPUT_EVENT_TOOL_ARGS, 0, "{\"a\":", 5, NULL},
    {OUTPUT_EVENT_TOOL_ARGS, 0, "1}", 2, NULL},
};

static const char *name_at(const struct collected *c, size_t i)
{
    return json_string_value(json_array_get(json_array_get(c->events, i), 0));
}

static json_t *data_at(const struct collected *c, size_t i)
{
    return json_array_get(json_array_get(c->events, i), 1);
}

static void responses_events_come_in_order_and_add_up_to_the_body(void **state)
{
    (void)state;
    json_t *echo = json_pack("{s:s}", "instructions", "x");
    struct es_meta m = {.id = "resp_1", .created = 7, .model = "tiny", .prompt_tokens = 11, .echo = echo};
    struct es_result res = {.finish = "tool_calls", .usage = {11, 9, 3}, .reasoning_tokens = 4};
    // Streamed.
    void *st = rs_stream_create(&m);
    struct collected c = {json_array()};
    assert_int_equal(rs_stream_ops.start(st, NULL, collect, &c), 0);
    assert_int_equal(rs_stream_ops.feed(st, answer, 3, collect, &c), 0);
    assert_int_equal(rs_stream_ops.feed(st, answer + 3, 3, collect, &c), 0);
    assert_int_equal(rs_stream_ops.finish(st, &res, collect, &c), 0);
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    };
    assert_int_equal(json_array_size(c.events), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_string_equal(name_at(&c, i), want[i]);
        json_t *d = data_at(&c, i);
        assert_string_equal(json_string_value(json_object_get(d, "type")), want[i]);
        assert_int_equal(json_integer_value(json_object_get(d, "sequence_number")), i);
    }
    json_t *last = json_object_get(data_at(&c, sizeof want / sizeof want[0] - 1), "response");
    rs_stream_ops.destroy(st);
    // Whole: the same steps without events give the same response.
    st = rs_stream_create(&m);
    assert_int_equal(rs_stream_ops.feed(st, answer, 6, NULL, NULL), 0);
    assert_int_equal(rs_stream_ops.finish(st, &res, NULL, NULL), 0);
    json_t *body = rs_stream_ops.body(st);
    assert_non_null(body);
    // The same items but for their ids (fresh in each answer).
    json_t *o1 = json_deep_copy(json_object_get(body, "output")), *o2 = json_deep_copy(json_object_get(last, "output"));
    size_t k;
    json_t *it;
    json_array_foreach(o1, k, it) json_object_del(it, "id");
    json_array_foreach(o2, k, it) json_object_del(it, "id");
    assert_true(json_equal(o1, o2));
    json_decref(o1);
    json_decref(o2);
    json_t *out = json_object_get(body, "output");
    assert_int_equal(json_array_size(out), 3);
    json_t *rs = json_array_get(out, 0), *msg = json_array_get(out, 1), *fc = json_array_get(out, 2);
    assert_string_equal(json_string_value(json_object_get(rs, "type")), "reasoning");
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(rs, "content"), 0), "text")), "thinking");
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(msg, "content"), 0), "text")), "Hello");
    assert_string_equal(json_string_value(json_object_get(fc, "call_id")), "call_abc");
    assert_string_equal(json_string_value(json_object_get(fc, "arguments")), "{\"a\":1}");
    assert_string_equal(json_string_value(json_object_get(body, "status")), "completed");
    assert_string_equal(json_string_value(json_object_get(body, "instructions")), "x");
    json_t *u = json_object_get(body, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 20);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(u, "output_tokens_details"), "reasoning_tokens")), 4);
    json_decref(body);
    rs_stream_ops.destroy(st);
    // Cut by the length: incomplete, and so is the item it was in.
    st = rs_stream_create(&m);
    struct es_result cut = {.finish = "length", .usage = {11, 9, 0}};
    json_array_clear(c.events);
    rs_stream_ops.start(st, NULL, collect, &c);
    rs_stream_ops.feed(st, answer + 2, 1, collect, &c);
    rs_stream_ops.finish(st, &cut, collect, &c);
    json_t *fin = data_at(&c, json_array_size(c.events) - 1);
    assert_string_equal(json_string_value(json_object_get(fin, "type")), "response.incomplete");
    json_t *resp = json_object_get(fin, "response");
    assert_string_equal(json_string_value(json_object_get(json_object_get(resp, "incomplete_details"), "reason")),
                        "max_output_tokens");
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(resp, "output"), 0), "status")),
                        "incomplete");
    // A failure after it: an error event, then response.failed.
    struct oa_error e;
    memset(&e, 0, sizeof e);
    oa_errorf(&e, MS_EINTERNAL, "internal_error", NULL, "the engine failed");
    size_t before = json_array_size(c.events);
    rs_stream_ops.failed(st, &e, collect, &c);
    assert_string_equal(name_at(&c, before), "error");
    assert_string_equal(name_at(&c, before + 1), "response.failed");
    rs_stream_ops.destroy(st);
    json_decref(c.events);
    json_decref(echo);
}

// Qwen3's "<think>\nx\n</think>\n\nAnswer \n more\n" comes back as
// Anthropic's blocks are: no whitespace around a block's text, none of
// whitespace alone, inner whitespace kept; streamed deltas add up to the body.
static void anthropic_blocks_are_trimmed_of_the_models_newlines(void **state)
{
    (void)state;
    static const struct output_event ev[] = {
        {OUTPUT_EVENT_REASONING, -1, "\n", 1, NULL},
        {OUTPUT_EVENT_REASONING, -1, "I think", 7, NULL},
        {OUTPUT_EVENT_REASONING, -1, "\n", 1, NULL},
        {OUTPUT_EVENT_CONTENT, -1, "\n\n", 2, NULL},
        {OUTPUT_EVENT_CONTENT, -1, "Answer \n", 8, NULL},
        {OUTPUT_EVENT_CONTENT, -1, " more\n\n", 7, NULL},
        {OUTPUT_EVENT_TOOL_BEGIN, 0, "f", 1, "call_abc"},
        {OUTPUT_EVENT_TOOL_ARGS, 0, "{}", 2, NULL},
        {OUTPUT_EVENT_CONTENT, -1, " \n", 2, NULL},
    };
    struct es_meta m = {.id = "msg_1", .created = 7, .model = "tiny", .prompt_tokens = 11};
    struct es_result res = {.finish = "tool_calls", .usage = {11, 9, 0}};
    void *st = an_stream_create(&m);
    struct collected c = {json_array()};
    assert_int_equal(an_stream_ops.start(st, NULL, collect, &c), 0);
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        assert_int_equal(an_stream_ops.feed(st, ev + i, 1, collect, &c), 0);
    assert_int_equal(an_stream_ops.finish(st, &res, collect, &c), 0);
    json_t *body = an_stream_ops.body(st);
    assert_json(json_object_get(body, "content"),
                "[{\"type\":\"thinking\",\"thinking\":\"I think\",\"signature\":\"\"},"
                "{\"type\":\"text\",\"text\":\"Answer \\n more\"},"
                "{\"type\":\"tool_use\",\"id\":\"call_abc\",\"name\":\"f\",\"input\":{}}]");
    // The deltas of each block add up to it; three blocks started, none empty.
    char streamed[3][64] = {"", "", ""};
    int starts = 0;
    for (size_t i = 0; i < json_array_size(c.events); i++) {
        json_t *d = data_at(&c, i);
        if (!strcmp(name_at(&c, i), "content_block_start")) starts++;
        if (strcmp(name_at(&c, i), "content_block_delta")) continue;
        const int idx = (int)json_integer_value(json_object_get(d, "index"));
        json_t *delta = json_object_get(d, "delta");
        const char *piece = json_string_value(json_object_get(delta, idx == 0 ? "thinking" : idx == 1 ? "text"
                                                                                             : "partial_json"));
        strncat(streamed[idx], piece, sizeof streamed[idx] - strlen(streamed[idx]) - 1);
    }
    assert_int_equal(starts, 3);
    assert_string_equal(streamed[0], "I think");
    assert_string_equal(streamed[1], "Answer \n more");
    json_decref(body);
    an_stream_ops.destroy(st);
    json_decref(c.events);
}

// The Responses front trims the same way (text_trim): the reasoning item's
// text and the message's output_text carry no whitespace at either end, and
// a message of whitespace alone is no item.
static void responses_items_are_trimmed_of_the_models_newlines(void **state)
{
    (void)state;
    static const struct output_event ev[] = {
        {OUTPUT_EVENT_REASONING, -1, "\n", 1, NULL},
        {OUTPUT_EVENT_REASONING, -1, "I think", 7, NULL},
        {OUTPUT_EVENT_REASONING, -1, "\n", 1, NULL},
        {OUTPUT_EVENT_CONTENT, -1, "\n\n", 2, NULL},
        {OUTPUT_EVENT_CONTENT, -1, "Answer \n", 8, NULL},
        {OUTPUT_EVENT_CONTENT, -1, " more\n\n", 7, NULL},
        {OUTPUT_EVENT_TOOL_BEGIN, 0, "f", 1, "call_abc"},
        {OUTPUT_EVENT_TOOL_ARGS, 0, "{}", 2, NULL},
        {OUTPUT_EVENT_CONTENT, -1, " \n", 2, NULL},
    };
    json_t *echo = json_object();
    struct es_meta m = {.id = "resp_1", .created = 7, .model = "tiny", .prompt_tokens = 11, .echo = echo};
    struct es_result res = {.finish = "tool_calls", .usage = {11, 9, 0}};
    void *st = rs_stream_create(&m);
    struct collected c = {json_array()};
    assert_int_equal(rs_stream_ops.start(st, NULL, collect, &c), 0);
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        assert_int_equal(rs_stream_ops.feed(st, ev + i, 1, collect, &c), 0);
    assert_int_equal(rs_stream_ops.finish(st, &res, collect, &c), 0);
    json_t *body = rs_stream_ops.body(st);
    json_t *out = json_object_get(body, "output");
    assert_int_equal(json_array_size(out), 3);
    json_t *r0 = json_array_get(json_object_get(json_array_get(out, 0), "content"), 0);
    json_t *m1 = json_array_get(json_object_get(json_array_get(out, 1), "content"), 0);
    assert_string_equal(json_string_value(json_object_get(r0, "text")), "I think");
    assert_string_equal(json_string_value(json_object_get(m1, "text")), "Answer \n more");
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 2), "type")), "function_call");
    // The streamed deltas of the message add up to its text.
    char streamed[64] = "";
    for (size_t i = 0; i < json_array_size(c.events); i++)
        if (!strcmp(name_at(&c, i), "response.output_text.delta"))
            strncat(streamed, json_string_value(json_object_get(data_at(&c, i), "delta")),
                    sizeof streamed - strlen(streamed) - 1);
    assert_string_equal(streamed, "Answer \n more");
    json_decref(body);
    rs_stream_ops.destroy(st);
    json_decref(c.events);
    json_decref(echo);
}

// An answer that continues the prompt's final message (a prefill) keeps the
// leading whitespace of its first text ("The answer is" + " 42"), but only of
// a first run: where a call comes first, text after it is trimmed as ever.
static void a_continued_answer_keeps_its_first_runs_leading_space(void **state)
{
    (void)state;
    static const struct output_event lead[] = {{OUTPUT_EVENT_CONTENT, -1, " 42", 3, NULL}};
    static const struct output_event call_first[] = {
        {OUTPUT_EVENT_TOOL_BEGIN, 0, "f", 1, "call_abc"},
        {OUTPUT_EVENT_TOOL_ARGS, 0, "{}", 2, NULL},
        {OUTPUT_EVENT_CONTENT, -1, "\n\nDone", 6, NULL},
    };
    json_t *echo = json_object();
    struct es_meta m = {.id = "x_1", .created = 7, .model = "tiny", .prompt_tokens = 11, .echo = echo,
                        .continues = true};
    struct es_result res = {.finish = "stop", .usage = {11, 3, 0}};
    for (int anthropic = 0; anthropic < 2; anthropic++)
        for (int first = 0; first < 2; first++) {
            const struct event_stream_ops *ops = anthropic ? &an_stream_ops : &rs_stream_ops;
            void *st = anthropic ? an_stream_create(&m) : rs_stream_create(&m);
            const struct output_event *ev = first ? call_first : lead;
            const size_t n = first ? 3 : 1;
            for (size_t i = 0; i < n; i++) assert_int_equal(ops->feed(st, ev + i, 1, NULL, NULL), 0);
            assert_int_equal(ops->finish(st, &res, NULL, NULL), 0);
            json_t *body = ops->body(st);
            json_t *items = json_object_get(body, anthropic ? "content" : "output");
            json_t *last = json_array_get(items, json_array_size(items) - 1);
            if (!anthropic) last = json_array_get(json_object_get(last, "content"), 0);
            assert_string_equal(json_string_value(json_object_get(last, "text")), first ? "Done" : " 42");
            json_decref(body);
            ops->destroy(st);
        }
    json_decref(echo);
    // A call's integer past 64 bits (a grammar allows 20 digits) keeps its
    // input, as a real, where the whole input came back {}.
    static const struct output_event big[] = {
        {OUTPUT_EVENT_TOOL_BEGIN, 0, "f", 1, "call_abc"},
        {OUTPUT_EVENT_TOOL_ARGS, 0, "{\"x\": 58976666666666666666}", 27, NULL},
    };
    struct es_meta bm = {.id = "msg_1", .created = 7, .model = "tiny", .prompt_tokens = 11};
    struct es_result bres = {.finish = "tool_calls", .usage = {11, 9, 0}};
    void *st = an_stream_create(&bm);
    assert_int_equal(an_stream_ops.feed(st, big, 2, NULL, NULL), 0);
    assert_int_equal(an_stream_ops.finish(st, &bres, NULL, NULL), 0);
    json_t *body = an_stream_ops.body(st);
    json_t *x = json_object_get(json_object_get(json_array_get(json_object_get(body, "content"), 0), "input"), "x");
    assert_true(json_is_real(x) && json_real_value(x) > 5.8e19);
    json_decref(body);
    an_stream_ops.destroy(st);
}

static void anthropic_events_come_in_order_and_add_up_to_the_body(void **state)
{
    (void)state;
    struct es_meta m = {.id = "msg_1", .created = 7, .model = "tiny", .prompt_tokens = 11};
    struct es_result res = {.finish = "tool_calls", .usage = {11, 9, 3}};
    void *st = an_stream_create(&m);
    struct collected c = {json_array()};
    const struct oa_usage admitted = {.prompt_tokens = 11, .cached_tokens = 3};
    assert_int_equal(an_stream_ops.start(st, &admitted, collect, &c), 0);
    assert_int_equal(an_stream_ops.feed(st, answer, 6, collect, &c), 0);
    assert_int_equal(an_stream_ops.finish(st, &res, collect, &c), 0);
    static const char *const want[] = {
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    };
    assert_int_equal(json_array_size(c.events), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) assert_string_equal(name_at(&c, i), want[i]);
    // message_start counts the cached prefix as message_delta will.
    json_t *start_usage = json_object_get(json_object_get(data_at(&c, 0), "message"), "usage");
    assert_int_equal(json_integer_value(json_object_get(start_usage, "input_tokens")), 8);
    assert_int_equal(json_integer_value(json_object_get(start_usage, "cache_read_input_tokens")), 3);
    assert_json(json_object_get(data_at(&c, 3), "delta"), "{\"type\":\"thinking_delta\",\"thinking\":\"thin\"}");
    assert_json(json_object_get(data_at(&c, 7), "delta"), "{\"type\":\"text_delta\",\"text\":\"Hello\"}");
    assert_json(json_object_get(data_at(&c, 9), "content_block"),
                "{\"type\":\"tool_use\",\"id\":\"call_abc\",\"name\":\"f\",\"input\":{}}");
    assert_json(json_object_get(data_at(&c, 10), "delta"), "{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":\"}");
    assert_int_equal(json_integer_value(json_object_get(data_at(&c, 12), "index")), 2);
    assert_json(json_object_get(data_at(&c, 13), "delta"),
                "{\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"stop_details\":null}");
    json_t *body = an_stream_ops.body(st);
    assert_json(json_object_get(body, "content"),
                "[{\"type\":\"thinking\",\"thinking\":\"thinking\",\"signature\":\"\"},"
                "{\"type\":\"text\",\"text\":\"Hello\"},"
                "{\"type\":\"tool_use\",\"id\":\"call_abc\",\"name\":\"f\",\"input\":{\"a\":1}}]");
    // Anthropic counts cache reads apart from input_tokens.
    assert_json(json_object_get(body, "usage"), "{\"input_tokens\":8,\"cache_creation_input_tokens\":0,"
                                                "\"cache_read_input_tokens\":3,\"output_tokens\":9,"
                                                "\"cache_creation\":null,\"server_tool_use\":null,"
                                                "\"service_tier\":\"standard\"}");
    // Present though null, as the SDK types them.
    assert_true(json_is_null(json_object_get(body, "stop_details")));
    assert_true(json_is_null(json_object_get(body, "container")));
    assert_string_equal(json_string_value(json_object_get(body, "stop_reason")), "tool_use");
    json_decref(body);
    an_stream_ops.destroy(st);
    // A stop string: stop_sequence, whole.
    st = an_stream_create(&m);
    struct es_result stop = {.finish = "stop", .stop_str = "END", .usage = {11, 2, 0}};
    an_stream_ops.feed(st, answer + 2, 1, NULL, NULL);
    an_stream_ops.finish(st, &stop, NULL, NULL);
    body = an_stream_ops.body(st);
    assert_string_equal(json_string_value(json_object_get(body, "stop_reason")), "stop_sequence");
    assert_string_equal(json_string_value(json_object_get(body, "stop_sequence")), "END");
    json_decref(body);
    an_stream_ops.destroy(st);
    json_decref(c.events);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(responses_input_items_become_chat_messages),
        cmocka_unit_test(responses_refusals_name_the_responses_parameter),
        cmocka_unit_test(anthropic_blocks_become_chat_messages),
        cmocka_unit_test(anthropic_refusals_name_the_messages_parameter),
        cmocka_unit_test(anthropic_errors_take_anthropics_shape),
        cmocka_unit_test(every_field_replaced_by_a_hostile_value_is_taken_or_refused),
        cmocka_unit_test(responses_events_come_in_order_and_add_up_to_the_body),
        cmocka_unit_test(anthropic_events_come_in_order_and_add_up_to_the_body),
        cmocka_unit_test(anthropic_blocks_are_trimmed_of_the_models_newlines),
        cmocka_unit_test(responses_items_are_trimmed_of_the_models_newlines),
        cmocka_unit_test(a_continued_answer_keeps_its_first_runs_leading_space),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
