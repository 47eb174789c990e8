// fuzz_grammar: schema, regex, choice and GBNF text through grammar/'s
// compilers against the real Qwen3 vocabulary (byte 0 picks the kind and
// whether a tool-call prefix and suffix wrap it). Promises: a refusal is a
// negative status with a sentence; an accepted grammar's matcher, walked a
// few dozen steps by choices the input drives, never offers an empty mask,
// accepts every token its mask allows and refuses one it does not (and is
// unchanged by the refusal); nothing leaks.
#include "grammar/grammar.h"
#include "base/base.h"
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static struct grammar_vocab *vocab;
static int words;

// The vocabulary once per process: the tokenizer files the set-up script puts
// under third_party/ (run.sh runs from the checkout's root).
static void load_vocab(void)
{
    if (vocab) return;
    char err[256];
    struct tokenizer *t;
    const char *dir = getenv("MOESERVE_TOKENIZER_DIR");
    if (tok_load(dir ? dir : "third_party/qwen3-tokenizer", &t, err, sizeof err)) {
        fprintf(stderr, "fuzz_grammar: %s\n", err);
        abort();
    }
    const int32_t eos[] = {151645, 151643};
    if (grammar_vocab_create(t, tok_vocab_size(t), eos, 2, &vocab, err, sizeof err)) abort();
    tok_destroy(t);
    words = grammar_vocab_mask_words(vocab);
}

static bool allowed(const uint32_t *mask, int32_t id) { return mask[id >> 5] >> (id & 31) & 1u; }

// A short walk: each step draws from the mask by the input's bytes.
static void walk(struct grammar *g, const uint8_t *data, size_t n)
{
    struct grammar_matcher *m;
    char err[256];
    if (grammar_matcher_create(g, &m, err, sizeof err)) return; // out of memory
    uint32_t *mask = malloc((size_t)words * 4), *again = malloc((size_t)words * 4);
    if (!mask || !again) abort();
    const int V = grammar_vocab_size(vocab);
    for (int step = 0; step < 48 && !grammar_matcher_is_terminated(m); step++) {
        if (grammar_matcher_fill_mask(m, mask)) break; // a depth or ambiguity limit: allowed to end
        int n_ok = 0, pick = -1, not_ok = -1;
        const unsigned r = n ? data[(size_t)step % n] * 2654435761u + (unsigned)step : (unsigned)step;
        for (int id = 0; id < V; id++) {
            if (allowed(mask, id)) {
                if (n_ok == 0 || (r + (unsigned)id) % 7919u == 0) pick = id;
                n_ok++;
            } else if (not_ok < 0 || (r ^ (unsigned)id) % 104729u == 0) {
                not_ok = id;
            }
        }
        FUZZ_CHECK(n_ok > 0, "an empty mask at step %d", step);
        if (not_ok >= 0) {
            FUZZ_CHECK(grammar_matcher_accept(m, not_ok, err, sizeof err) == MS_EINVAL,
                       "token %d outside the mask was accepted", not_ok);
            FUZZ_CHECK(!grammar_matcher_fill_mask(m, again) && !memcmp(mask, again, (size_t)words * 4),
                       "a refused token changed the matcher");
        }
        FUZZ_CHECK(grammar_matcher_allows(m, pick), "mask and allows() disagree on %d", pick);
        FUZZ_CHECK(grammar_matcher_accept(m, pick, err, sizeof err) == 0, "token %d from the mask: %s",
                   pick, err);
    }
    free(mask);
    free(again);
    grammar_matcher_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    load_vocab();
    static const enum grammar_kind kinds[] = {GRAMMAR_JSON_SCHEMA, GRAMMAR_JSON_OBJECT,
                                              GRAMMAR_REGEX, GRAMMAR_CHOICE, GRAMMAR_GBNF};
    struct grammar_source src = {.kind = kinds[(data[0] & 7) % 5], .text = (const char *)data + 1,
                                 .len = n - 1};
    if (data[0] & 8) {
        src.prefix = "<tool_call>\n";
        src.prefix_len = 12;
        src.suffix = "\n</tool_call>";
        src.suffix_len = 13;
    }
    struct grammar *g = NULL;
    char err[512] = "";
    int rc = grammar_compile(vocab, &src, &g, err, sizeof err);
    if (rc) {
        FUZZ_REFUSAL(rc, err);
        FUZZ_CHECK(!g, "a refusal left a grammar");
        return 0;
    }
    FUZZ_CHECK(g && grammar_states(g) > 0, "an accepted grammar with no states");
    walk(g, data + 1, n - 1);
    grammar_unref(g);
    return 0;
}
