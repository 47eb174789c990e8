// fuzz_tokenizer: tokenizer.json or tokenizer_config.json (the first byte
// picks which; the other is a small valid file) through tokenizer/'s loader,
// then, when it loads, encoding and decoding of a few texts. Promises: a
// load succeeds or is refused with a sentence; a loaded tokenizer encodes to
// ids below its vocabulary size and decodes them back without error, the
// streaming detokenizer agreeing with the whole decode; nothing leaks. The
// files go to a folder in /dev/shm (the loader reads a folder).
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

// The byte-level alphabet, four merges and two added tokens.
static char *tiny_tokenizer_json(void)
{
    static char buf[16384];
    size_t at = 0;
    at += (size_t)snprintf(buf + at, sizeof buf - at,
        "{\"version\": \"1.0\", \"added_tokens\": ["
        "{\"id\": 260, \"content\": \"<|end|>\", \"single_word\": false, \"lstrip\": false,"
        " \"rstrip\": false, \"normalized\": false, \"special\": true},"
        "{\"id\": 261, \"content\": \"<tool>\", \"single_word\": false, \"lstrip\": false,"
        " \"rstrip\": false, \"normalized\": false, \"special\": false}],"
        " \"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\","
        " \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": true},"
        " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {");
    // GPT-2's byte to code point map: printable bytes stand for themselves.
    int cp[256], extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cp[b] = printable ? b : 256 + extra++;
    }
    for (int b = 0; b < 256; b++) {
        char u[8];
        int c = cp[b];
        if (c == '"' || c == '\\') snprintf(u, sizeof u, "\\%c", c);
        else if (c < 0x80) snprintf(u, sizeof u, "%c", c);
        else snprintf(u, sizeof u, "%c%c", 0xc0 | (c >> 6), 0x80 | (c & 0x3f));
        at += (size_t)snprintf(buf + at, sizeof buf - at, "\"%s\": %d, ", u, b);
    }
    snprintf(buf + at, sizeof buf - at,
             "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259},"
             " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\"]}}");
    return buf;
}

static const char *tiny_config =
    "{\"bos_token\": null, \"eos_token\": \"<|end|>\", \"chat_template\": \"{{ x }}\","
    " \"additional_special_tokens\": [\"<tool>\"]}";

static void put(const char *dir, const char *name, const void *data, size_t n)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    fuzz_write(p, data, n);
}

static void round_trip(const struct tokenizer *t, const char *text)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512] = "";
    int rc = tok_encode(t, text, strlen(text), &ids, &n, err, sizeof err);
    FUZZ_CHECK(!rc, "encoding '%s' failed: %s", text, err);
    int vocab = tok_vocab_size(t);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d of %d", ids[i], vocab);
    char *out = NULL;
    size_t len = 0;
    rc = tok_decode(t, ids, n, false, &out, &len, err, sizeof err);
    FUZZ_CHECK(!rc, "decoding failed: %s", err);
    // The streaming detokenizer adds up to the same text.
    struct tok_stream s;
    tok_stream_init(&s, t, false);
    size_t cap = tok_stream_max_output(t) + 1, got = 0;
    char *piece = malloc(cap), *all = malloc(len + cap * (n + 1) + 1);
    if (!piece || !all) abort();
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        FUZZ_CHECK(!tok_stream_feed(&s, ids[i], piece, cap, &k), "stream feed");
        memcpy(all + got, piece, k);
        got += k;
    }
    size_t k = 0;
    FUZZ_CHECK(!tok_stream_finish(&s, piece, cap, &k), "stream finish");
    memcpy(all + got, piece, k);
    got += k;
    FUZZ_CHECK(got == len && !memcmp(all, out, len), "stream gave %zu bytes, decode %zu", got, len);
    free(piece);
    free(all);
    free(out);
    free(ids);
}

static char dir[64];
static void forget_dir(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/dev/shm/moeserve-fuzz-tok-%d", (int)getpid());
        mkdir(dir, 0700);
        atexit(forget_dir);
    }
    const char *tok = tiny_tokenizer_json();
    if (data[0] & 1) {
        put(dir, "tokenizer.json", data + 1, n - 1);
        put(dir, "tokenizer_config.json", tiny_config, strlen(tiny_config));
    } else {
        put(dir, "tokenizer.json", tok, strlen(tok));
        put(dir, "tokenizer_config.json", data + 1, n - 1);
    }
    struct tokenizer *t = NULL;
    char err[512] = "";
    int rc = tok_load(dir, &t, err, sizeof err);
    if (rc) {
        FUZZ_REFUSAL(rc, err);
        FUZZ_CHECK(!t, "refused but returned a tokenizer");
        return 0;
    }
    round_trip(t, "hello world <|end|> <tool>x\xc3\xa9\xf0\x9f\x98\x80 \t\n  12345");
    round_trip(t, "");
    tok_destroy(t);
    return 0;
}
