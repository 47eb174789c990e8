// fuzz_grammar: schema, regex, choice and GBNF text through grammar/'s
// compilers against a small byte-level vocabulary (every byte, a few JSON
// and keyword merges, the tool-call tags and an EOS: compiling against
// Qwen3's 151k tokens costs ~0.1 s an input; MOESERVE_FUZZ_QWEN3_DIR picks
// that vocabulary instead) (byte 0 picks the kind and
// whether a tool-call prefix and suffix wrap it). Promises: a refusal is a
// negative status with a sentence; an accepted grammar's matcher, walked a
// few dozen steps by choices the input drives, never offers an empty mask,
// accepts every token its mask allows and refuses one it does not (and is
// unchanged by the refusal); nothing leaks.
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grammar/grammar.h"
#include "base/base.h"
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static struct grammar_vocab *vocab;
static int words;

// GPT-2's byte-to-character map, which byte-level BPE vocabularies use.
static int byte_char(int b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    int extra = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) extra++;
    return 256 + extra;
}

static void put_utf8(char **p, int cp)
{
    if (cp < 0x80) *(*p)++ = (char)cp;
    else {
        *(*p)++ = (char)(0xc0 | cp >> 6);
        *(*p)++ = (char)(0x80 | (cp & 0x3f));
    }
}

// A tokenizer.json: 256 byte tokens, merged tokens spelled by a chain of
// merges ("t r", "tr u", "tru e"), <tool_call> and </tool_call> as added
// tokens and <|end|> as the special EOS. Returns the folder it is in.
static const char *write_small_tokenizer(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/moeserve-fuzz-grammar-%d", (int)getpid());
    mkdir(dir, 0700);
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    char s[16];
    for (int b = 0; b < 256; b++) {
        char *p = s;
        put_utf8(&p, byte_char(b));
        *p = 0;
        json_object_set_new(vocab, s, json_integer(b));
    }
    static const char *const words[] = {"{\"", "\":", "\",", " \"", "true", "false", "null", "  "};
    int id = 256;
    for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
        char acc[64] = "", piece[16];
        for (const char *c = words[w]; *c; c++) {
            char *p = piece;
            put_utf8(&p, byte_char((unsigned char)*c));
            *p = 0;
            if (acc[0]) {
                char merge[96], joined[64];
                snprintf(merge, sizeof merge, "%s %s", acc, piece);
                snprintf(joined, sizeof joined, "%s%s", acc, piece);
                json_array_append_new(merges, json_string(merge));
                if (!json_object_get(vocab, joined)) json_object_set_new(vocab, joined, json_integer(id++));
                snprintf(acc, sizeof acc, "%s", joined);
            } else {
                snprintf(acc, sizeof acc, "%s", piece);
            }
        }
    }
    static const char *const tags[] = {"<tool_call>", "</tool_call>", "<|end|>"};
    for (int t = 0; t < 3; t++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id + t,
                                               "content", tags[t], "single_word", 0, "lstrip", 0,
                                               "rstrip", 0, "normalized", 0, "special", t == 2));
    json_t *tok = json_pack(
        "{s:s, s:o, s:{s:s, s:b, s:b, s:b}, s:{s:s}, s:{s:s, s:o, s:o, s:b}}", "version", "1.0",
        "added_tokens", added, "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 1, "decoder", "type", "ByteLevel", "model", "type", "BPE",
        "vocab", vocab, "merges", merges, "byte_fallback", 0);
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!tok || json_dump_file(tok, path, 0)) abort();
    json_decref(tok);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    static const char config[] = "{\"eos_token\": \"<|end|>\"}";
    fuzz_write(path, config, strlen(config));
    return dir;
}

// The vocabulary once per process.
static void load_vocab(void)
{
    if (vocab) return;
    char err[256];
    struct tokenizer *t;
    const char *dir = getenv("MOESERVE_FUZZ_QWEN3_DIR");
    if (!dir) dir = write_small_tokenizer();
    if (tok_load(dir, &t, err, sizeof err)) {
        fprintf(stderr, "fuzz_grammar: %s: %s\n", dir, err);
        abort();
    }
    const int32_t eos = tok_find_token(t, getenv("MOESERVE_FUZZ_QWEN3_DIR") ? "<|im_end|>" : "<|end|>");
    if (eos < 0 || grammar_vocab_create(t, tok_vocab_size(t), &eos, 1, &vocab, err, sizeof err)) {
        fprintf(stderr, "fuzz_grammar: the vocabulary: %s\n", err);
        abort();
    }
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
