// grammar_walk: random walks through compiled JSON grammars over the real
// Qwen3 vocabulary, for tests/grammar/validate_walks.py. Each step checks
// the matcher's own promises (a mask is never empty before the end, EOS is
// allowed exactly where the grammar may end, mask bits agree with
// grammar_matcher_allows on sampled ids, a refused token leaves the matcher
// unchanged, padded and special ids are never allowed); each finished walk
// prints one JSON line {"name", "text"} for the independent validator.
// Usage: grammar_walk TOKENIZER_DIR SCHEMAS.json WALKS SEED
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

#define MODEL_VOCAB 151936 // Qwen3's embedding rows: ids past the tokenizer's are padding
#define MAX_STEPS 4000

static uint64_t rng;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int failures;
#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            fprintf(stderr, "grammar_walk: " __VA_ARGS__);        \
            fputc('\n', stderr);                                  \
            failures++;                                           \
            return -1;                                            \
        }                                                         \
    } while (0)

static bool bit(const uint32_t *mask, int32_t id)
{
    return mask[id >> 5] >> (id & 31) & 1;
}

static int32_t pick_token(const struct tokenizer *tok, const uint32_t *mask, int32_t *ids, int n_ids, int step,
                          int32_t eos)
{
    if (step >= 40) {
        if (bit(mask, eos)) return eos;
        // steer towards closing: a token holding a quote or a bracket
        for (int t = 0; t < 400; t++) {
            int32_t id = ids[next_rand() % (uint32_t)n_ids];
            size_t len;
            const uint8_t *b = tok_token_bytes(tok, id, &len);
            if (b && (memchr(b, '"', len) || memchr(b, '}', len) || memchr(b, ']', len))) return id;
        }
    }
    return ids[next_rand() % (uint32_t)n_ids];
}

static int walk(const struct tokenizer *tok, struct grammar *g, const char *name, const int32_t *eos, int n_eos,
                const char *prefix)
{
    char err[512];
    int words = (MODEL_VOCAB + 31) / 32, n_tok = tok_vocab_size(tok);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    int32_t *ids = malloc(MODEL_VOCAB * sizeof *ids);
    char *text = malloc(1 << 20);
    size_t len = 0;
    struct grammar_matcher *m;
    CHECK(mask && ids && text, "out of memory");
    CHECK(!grammar_matcher_create(g, &m, err, sizeof err), "%s: %s", name, err);
    int rc = -1;
    for (int step = 0; step < MAX_STEPS; step++) {
        CHECK(!grammar_matcher_fill_mask(m, mask), "%s: fill_mask failed", name);
        int n = 0;
        for (int32_t id = 0; id < MODEL_VOCAB; id++)
            if (bit(mask, id)) ids[n++] = id;
        CHECK(n > 0, "%s: dead end after %zu bytes: %.*s", name, len, (int)len, text);
        bool eos_allowed = false;
        for (int i = 0; i < n_eos; i++) eos_allowed |= bit(mask, eos[i]);
        CHECK(eos_allowed == grammar_matcher_can_end(m), "%s: EOS in the mask (%d) but can_end %d", name,
              eos_allowed, grammar_matcher_can_end(m));
        for (int32_t id = n_tok; id < MODEL_VOCAB; id++) CHECK(!bit(mask, id), "%s: padded id %d allowed", name, id);
        for (int32_t id = 151643; id <= 151656; id++) {
            bool is_eos = false;
            for (int i = 0; i < n_eos; i++) is_eos |= eos[i] == id;
            CHECK(is_eos || !bit(mask, id), "%s: special token %d allowed", name, id);
        }
        for (int t = 0; t < 48; t++) {
            int32_t id = (int32_t)(next_rand() % MODEL_VOCAB);
            CHECK(bit(mask, id) == grammar_matcher_allows(m, id), "%s: mask bit of %d is %d but allows says %d", name,
                  id, bit(mask, id), !bit(mask, id));
        }
        if (n < MODEL_VOCAB && step % 8 == 0) {
            int32_t id = (int32_t)(next_rand() % MODEL_VOCAB);
            while (bit(mask, id)) id = (id + 1) % MODEL_VOCAB;
            CHECK(grammar_matcher_accept(m, id, err, sizeof err) == MS_EINVAL, "%s: refused token %d was accepted",
                  name, id);
        }
        int32_t pick = pick_token(tok, mask, ids, n, step, eos[0]);
        CHECK(!grammar_matcher_accept(m, pick, err, sizeof err), "%s: allowed token %d refused: %s", name, pick, err);
        if (grammar_matcher_is_terminated(m)) {
            rc = 0;
            break;
        }
        size_t bl;
        const uint8_t *b = tok_token_bytes(tok, pick, &bl);
        CHECK(len + bl < (1 << 20), "%s: output too long", name);
        memcpy(text + len, b, bl);
        len += bl;
    }
    CHECK(rc == 0, "%s: the walk did not end within %d steps: %.*s", name, MAX_STEPS, (int)len, text);
    CHECK(!grammar_matcher_allows(m, eos[0]), "%s: EOS allowed after termination", name);
    json_t *line = json_pack("{s:s, s:s%}", "name", name, "text", text, len);
    CHECK(line, "%s: the output is not valid UTF-8: %.*s", name, (int)len, text);
    char *s = json_dumps(line, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(line);
    (void)prefix;
    grammar_matcher_destroy(m);
    free(mask);
    free(ids);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: grammar_walk TOKENIZER_DIR SCHEMAS.json WALKS SEED\n");
        return 2;
    }
    char err[512];
    struct tokenizer *tok;
    if (tok_load(argv[1], &tok, err, sizeof err)) {
        fprintf(stderr, "grammar_walk: %s\n", err);
        return 2;
    }
    json_error_t je;
    json_t *list = json_load_file(argv[2], 0, &je);
    if (!json_is_array(list)) {
        fprintf(stderr, "grammar_walk: %s: %s\n", argv[2], je.text);
        return 2;
    }
    int walks = atoi(argv[3]);
    rng = strtoull(argv[4], NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
    int32_t eos[2] = {tok_find_token(tok, "<|im_end|>"), tok_find_token(tok, "<|endoftext|>")};
    struct grammar_vocab *v;
    if (grammar_vocab_create(tok, MODEL_VOCAB, eos, 2, &v, err, sizeof err)) {
        fprintf(stderr, "grammar_walk: %s\n", err);
        return 2;
    }
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *schema = json_object_get(e, "schema");
        char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
        const char *prefix = json_string_value(json_object_get(e, "prefix"));
        const char *suffix = json_string_value(json_object_get(e, "suffix"));
        struct grammar_source src = {
            .kind = json_is_true(json_object_get(e, "json_object")) ? GRAMMAR_JSON_OBJECT : GRAMMAR_JSON_SCHEMA,
            .text = text, .len = text ? strlen(text) : 0,
            .prefix = prefix, .prefix_len = prefix ? strlen(prefix) : 0,
            .suffix = suffix, .suffix_len = suffix ? strlen(suffix) : 0};
        struct grammar *g;
        if (grammar_compile(v, &src, &g, err, sizeof err)) {
            fprintf(stderr, "grammar_walk: %s does not compile: %s\n", name, err);
            failures++;
            free(text);
            continue;
        }
        for (int w = 0; w < walks; w++) walk(tok, g, name, eos, 2, prefix);
        grammar_unref(g);
        free(text);
    }
    grammar_vocab_destroy(v);
    tok_destroy(tok);
    json_decref(list);
    if (failures) fprintf(stderr, "grammar_walk: %d failures\n", failures);
    return failures ? 1 : 0;
}
