// fuzz_openai_request: request bodies for all four endpoints (the first byte
// picks one) through api/openai_parse. Promises: a body is accepted with
// every resolved value in its documented range, or refused with a status,
// an HTTP code and a message the error envelope keeps; nothing leaks
// (LeakSanitizer) and nothing reads out of bounds (ASan).
#include "api/openai.h"
#include "base/arena.h"
#include "base/base.h"
#include "model/sampling.h"
#include "tests/fuzz/fuzz.h"

enum { VOCAB = 1000, MAX_LEN = 4096 };

static void check_gen(const struct oa_gen_params *g)
{
    // The engine's own range check passes on whatever the parser accepted.
    const char *param = NULL;
    char err[256] = "";
    FUZZ_CHECK(!sampling_params_check(&g->sampling, VOCAB, &param, err, sizeof err),
               "accepted sampling fails the engine's check (%s): %s", param ? param : "?", err);
    FUZZ_CHECK(g->n >= 1 && g->n <= OA_MAX_N, "n %d", g->n);
    // 0 when not given. One beyond the context is taken here: only the server,
    // which knows the prompt's length, can refuse it (context_length_exceeded
    // at submission, as vLLM does), so the parser promises no upper bound.
    FUZZ_CHECK(g->max_tokens >= 0, "max_tokens %d", g->max_tokens);
    for (int i = 0; i < g->n_stop; i++) FUZZ_CHECK(g->stop[i] && g->stop[i][0], "stop %d empty", i);
    for (int i = 0; i < g->n_stop_token_ids; i++)
        FUZZ_CHECK(g->stop_token_ids[i] >= 0 && g->stop_token_ids[i] < VOCAB, "stop id %d",
                   g->stop_token_ids[i]);
}

static void check_refusal(int rc, const struct oa_error *e)
{
    FUZZ_CHECK(rc < 0 && e->http >= 400 && e->http < 600, "rc %d http %d", rc, e->http);
    FUZZ_CHECK(strlen(e->message) > 8, "rc %d with message '%s'", rc, e->message);
    json_t *j = oa_error_json(e);
    FUZZ_CHECK(j, "no envelope for '%s'", e->message);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    FUZZ_CHECK(msg && msg[0], "the envelope lost the message '%s'", e->message);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    const char *body = (const char *)data + 1;
    size_t len = n - 1;
    struct oa_limits lim = {.vocab_size = VOCAB, .max_model_len = MAX_LEN};
    struct arena *a = arena_create(4096);
    if (!a) return 0;
    struct oa_error e;
    memset(&e, 0, sizeof e);
    int rc;
    switch (data[0] % 4) {
    case 0: {
        struct oa_chat_request r;
        memset(&r, 0, sizeof r);
        rc = oa_parse_chat(body, len, &lim, a, &r, &e);
        if (!rc) {
            FUZZ_CHECK(json_is_array(r.messages), "chat without a messages array");
            check_gen(&r.gen);
        }
        oa_chat_request_release(&r);
        break;
    }
    case 1: {
        struct oa_completion_request r;
        memset(&r, 0, sizeof r);
        rc = oa_parse_completion(body, len, &lim, a, &r, &e);
        if (!rc) {
            FUZZ_CHECK(r.n_prompts >= 1 && r.n_prompts <= OA_MAX_PROMPTS, "%d prompts", r.n_prompts);
            for (int i = 0; i < r.n_prompts; i++) {
                const struct oa_prompt *p = &r.prompts[i];
                FUZZ_CHECK(p->text || p->n_ids > 0, "prompt %d is neither text nor ids", i);
                for (int k = 0; !p->text && k < p->n_ids; k++)
                    FUZZ_CHECK(p->ids[k] >= 0 && p->ids[k] < VOCAB, "prompt id %d", p->ids[k]);
            }
            check_gen(&r.gen);
        }
        break;
    }
    case 2: {
        struct oa_tokenize_request r;
        memset(&r, 0, sizeof r);
        rc = oa_parse_tokenize(body, len, &lim, a, &r, &e);
        if (!rc) FUZZ_CHECK(r.is_chat ? json_is_array(r.messages) : r.prompt != NULL, "no input");
        oa_tokenize_request_release(&r);
        break;
    }
    default: {
        struct oa_detokenize_request r;
        memset(&r, 0, sizeof r);
        rc = oa_parse_detokenize(body, len, &lim, a, &r, &e);
        if (!rc) FUZZ_CHECK(r.n_tokens >= 0 && (r.tokens || !r.n_tokens), "tokens");
        break;
    }
    }
    if (rc) check_refusal(rc, &e);
    arena_destroy(a);
    return 0;
}
