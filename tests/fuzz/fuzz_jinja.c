// fuzz_jinja: template source through api/jinja's parser and, when it
// parses, its renderer over chat-like variables (messages, tools, a
// namespace-worthy mix of types). Promises: parse and render each succeed or
// fail with a sentence; a render stays within the limits it was given (so
// no template hangs or exhausts the server); the output is NUL-terminated
// at its length; nothing leaks.
#include <jansson.h>

#include "api/jinja.h"
#include "tests/fuzz/fuzz.h"

static const char *vars_json =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi <think> \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hm\","
    "  \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\","
    "   \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"n\": -3, \"x\": 1e300,"
    " \"s\": \"a'b\\\"c\\n\", \"d\": {\"b\": 1, \"a\": [[]]}, \"e\": []}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    static json_t *vars;
    if (!vars) vars = json_loads(vars_json, 0, NULL);
    if (!vars) abort();
    struct jinja_template *t = NULL;
    char err[512] = "";
    int rc = jinja_parse((const char *)data, n, &t, err, sizeof err);
    if (rc) {
        FUZZ_REFUSAL(rc, err);
        FUZZ_CHECK(!t, "a refused parse returned a template");
        return 0;
    }
    FUZZ_CHECK(t, "parsed without a template");
    struct jinja_var v[16];
    size_t nv = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vars, key, val) if (nv < 16) v[nv++] = (struct jinja_var){key, val};
    v[nv++] = (struct jinja_var){"undefined_one", NULL};
    struct jinja_limits lim = {
        .max_output_bytes = 1 << 16,
        .max_memory_bytes = 8 << 20,
        .max_steps = 20000,
        .max_call_depth = 32,
    };
    char *out = NULL;
    size_t len = 0;
    err[0] = 0;
    rc = jinja_render(t, v, nv, &lim, &out, &len, err, sizeof err);
    if (rc) {
        // raise_exception('') is the template's own (empty) sentence.
        FUZZ_CHECK(rc < 0 && (err[0] || memmem(data, n, "raise_exception", 15)),
                   "render refused (%d) without a sentence", rc);
    } else {
        FUZZ_CHECK(out && len <= lim.max_output_bytes && out[len] == 0, "output of %zu bytes", len);
    }
    free(out);
    jinja_destroy(t);
    return 0;
}
