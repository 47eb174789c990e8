// tokenizer: loading from a model folder, the encoding pipeline (added
// tokens, normalizer, pre-tokenizers, BPE, post-processor) and the accessors.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tokenizer_internal.h"

#define TOK_JSON_MAX ((size_t)1 << 30)
#define TOK_CONFIG_MAX ((size_t)64 << 20)
#define TOK_TEMPLATE_MAX ((size_t)16 << 20)

int tok_read_chat_template_file(const char *dir, char **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    int rc = ms_path_join(path, sizeof path, dir, "chat_template.jinja");
    if (rc) return ms_err(err, errlen, rc, "the path %s/chat_template.jinja is too long", dir);
    size_t len;
    char terr[512];
    rc = ms_read_file(path, TOK_TEMPLATE_MAX, out, &len, terr, sizeof terr);
    if (rc == MS_ENOTFOUND) return 0;
    if (rc) return ms_err(err, errlen, rc, "%s", terr);
    // The template is a C string from here on: a NUL would cut it short
    // without a word (a template whose loops vanished renders empty prompts).
    const char *nul = memchr(*out, 0, len);
    if (nul) {
        const size_t at = (size_t)(nul - *out);
        free(*out);
        *out = NULL;
        return ms_err(err, errlen, MS_EFORMAT, "%s holds a NUL byte at offset %zu; a chat template "
                      "is text: remove it (or the file, to use tokenizer_config.json's chat_template)",
                      path, at);
    }
    return 0;
}

int tok_load(const char *dir, struct tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    int rc = ms_path_join(path, sizeof path, dir, "tokenizer.json");
    if (rc) return ms_err(err, errlen, rc, "the path %s/tokenizer.json is too long", dir);
    char *tok_json = NULL, *cfg_json = NULL;
    size_t tok_len = 0, cfg_len = 0;
    if ((rc = ms_read_file(path, TOK_JSON_MAX, &tok_json, &tok_len, err, errlen))) return rc;
    if ((rc = ms_path_join(path, sizeof path, dir, "tokenizer_config.json"))) {
        free(tok_json);
        return ms_err(err, errlen, rc, "the path %s/tokenizer_config.json is too long", dir);
    }
    // tokenizer_config.json is optional (without it: no chat template, no
    // bos/eos names); a file that is there but unreadable is an error.
    char cerr[512];
    rc = ms_read_file(path, TOK_CONFIG_MAX, &cfg_json, &cfg_len, cerr, sizeof cerr);
    if (rc && rc != MS_ENOTFOUND) {
        free(tok_json);
        return ms_err(err, errlen, rc, "%s", cerr);
    }
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        free(tok_json);
        free(cfg_json);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory loading the tokenizer");
    }
    rc = tok_load_json(t, tok_json, tok_len, cfg_json, cfg_len, err, errlen);
    free(tok_json);
    free(cfg_json);
    // Newer checkpoints ship their template as chat_template.jinja, which
    // transformers and vLLM prefer to tokenizer_config.json's.
    char *jinja = NULL;
    if (rc == 0 && (rc = tok_read_chat_template_file(dir, &jinja, err, errlen)) == 0 && jinja) {
        free(t->chat_template);
        t->chat_template = jinja;
    }
    if (rc == 0 && tok_cache_init(&t->cache))
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for the tokenizer cache");
    if (rc) {
        tok_free_fields(t);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tok_destroy(struct tokenizer *t)
{
    if (!t) return;
    tok_cache_free(&t->cache);
    tok_free_fields(t);
    free(t);
}

void tok_set_cache(struct tokenizer *t, bool enabled)
{
    // Emptied either way, so that a benchmark starts from a cold cache.
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        struct tok_cache_shard *sh = &t->cache.shards[i];
        if (!sh->entries) continue;
        pthread_mutex_lock(&sh->lock);
        memset(sh->entries, 0, TOK_CACHE_SLOTS * sizeof *sh->entries);
        pthread_mutex_unlock(&sh->lock);
    }
    t->cache.enabled = enabled && t->cache.shards[0].entries;
}

// ---- encoding ----

// Everything one encode call allocates, reused across its pieces.
struct enc {
    const struct tokenizer *t;
    struct tok_ids ids;
    struct tok_buf norm;   // the normalized text piece
    struct tok_buf prefix; // a piece with the ByteLevel prefix space
    struct tok_spans levels[TOK_MAX_SPLITS + 1];
    struct tok_spans bl_spans;
    struct tok_pieces pieces_norm;
    struct tok_matcher m;
    struct tok_bpe_scratch bpe;
    char *err;
    size_t errlen;
    size_t max_ids;        // stop with MS_ETOOLONG once more ids than this are out
};

static void enc_free(struct enc *e)
{
    free(e->ids.p);
    free(e->norm.p);
    free(e->prefix.p);
    for (int i = 0; i <= TOK_MAX_SPLITS; i++) free(e->levels[i].p);
    free(e->bl_spans.p);
    free(e->pieces_norm.p);
    tok_matcher_free(&e->m);
    tok_bpe_scratch_free(&e->bpe);
}

static int enc_nomem(struct enc *e)
{
    return ms_err(e->err, e->errlen, MS_ENOMEM, "out of memory while encoding");
}

// The early stop of tok_encode_max, checked after every word: a text far
// over the limit costs only the work up to the limit.
static int enc_over(struct enc *e)
{
    if (e->ids.len <= e->max_ids) return 0;
    return ms_err(e->err, e->errlen, MS_ETOOLONG, "the text is more than %zu tokens", e->max_ids);
}

// ByteLevel, then BPE, on one piece that the Split steps produced.
static int encode_byte_level(struct enc *e, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = e->t;
    int rc;
    if (t->bl_add_prefix_space && (n == 0 || s[0] != ' ')) {
        e->prefix.len = 0;
        if (tok_buf_push(&e->prefix, " ", 1) || tok_buf_push(&e->prefix, s, n)) return enc_nomem(e);
        s = e->prefix.p;
        n = e->prefix.len;
    }
    if (!t->bl_use_regex) {
        if ((rc = tok_bpe_word(t, &e->bpe, s, n, &e->ids))) return enc_nomem(e);
        return enc_over(e);
    }
    e->bl_spans.len = 0;
    rc = tok_split_span(&t->bl_regex, TOK_SPLIT_ISOLATED, false, &e->m, s,
                        (struct tok_span){0, (uint32_t)n}, &e->bl_spans, e->err, e->errlen);
    if (rc) return rc;
    for (size_t i = 0; i < e->bl_spans.len; i++) {
        struct tok_span sp = e->bl_spans.p[i];
        if ((rc = tok_bpe_word(t, &e->bpe, s + sp.off, sp.len, &e->ids))) return enc_nomem(e);
        if ((rc = enc_over(e))) return rc;
    }
    return 0;
}

// The Split steps, depth first: level k splits each piece of level k-1.
static int encode_splits(struct enc *e, const uint8_t *s, struct tok_span span, int level)
{
    const struct tokenizer *t = e->t;
    if (level == t->n_splits) return encode_byte_level(e, s + span.off, span.len);
    const struct tok_split_step *st = &t->splits[level];
    struct tok_spans *out = &e->levels[level];
    size_t base = out->len;
    int rc = tok_split_span(&st->re, st->behavior, st->invert, &e->m, s, span, out, e->err,
                            e->errlen);
    if (rc) return rc;
    size_t end = out->len;
    for (size_t i = base; i < end; i++) {
        // Deeper levels use their own arrays, so this one stays put.
        if ((rc = encode_splits(e, s, e->levels[level].p[i], level + 1))) return rc;
    }
    out->len = base;
    return 0;
}

static int encode_text(struct enc *e, const uint8_t *s, size_t n)
{
    if (n == 0) return 0;
    return encode_splits(e, s, (struct tok_span){0, (uint32_t)n}, 0);
}

// A text piece between raw added tokens: normalize, match the normalized
// added tokens, pre-tokenize and merge the rest.
static int encode_piece(struct enc *e, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = e->t;
    int rc;
    const uint8_t *ns = s;
    size_t nn = n;
    if (t->n_norm) {
        if ((rc = tok_normalize(t->norm, t->n_norm, s, n, &e->norm)))
            return rc == MS_ENOMEM ? enc_nomem(e)
                                   : ms_err(e->err, e->errlen, rc, "the text cannot be normalized");
        ns = e->norm.p;
        nn = e->norm.len;
        // Spans are 32-bit; normalization can make a text longer (NFD, NFKC).
        if (nn > UINT32_MAX - 8)
            return ms_err(e->err, e->errlen, MS_EINVAL, "the text is %zu bytes once normalized; at "
                                                        "most 4 GiB can be encoded", nn);
    }
    if (!t->have_norm_added) return encode_text(e, ns, nn);
    e->pieces_norm.len = 0;
    if ((rc = tok_added_split(&t->trie_norm, t->added, ns, nn, &e->pieces_norm))) return enc_nomem(e);
    for (size_t i = 0; i < e->pieces_norm.len; i++) {
        struct tok_piece p = e->pieces_norm.p[i];
        if (p.added >= 0) rc = tok_ids_push(&e->ids, t->added[p.added].id) ? enc_nomem(e) : 0;
        else rc = encode_text(e, ns + p.off, p.len);
        if (rc) return rc;
    }
    return 0;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids,
               size_t *n_ids, char *err, size_t errlen)
{
    return tok_encode_max(t, text, len, SIZE_MAX, true, ids, n_ids, err, errlen);
}

int tok_encode_max(const struct tokenizer *t, const char *text, size_t len, size_t max_ids,
                   bool add_special, int32_t **ids, size_t *n_ids, char *err, size_t errlen)
{
    *ids = NULL;
    *n_ids = 0;
    const uint8_t *s = (const uint8_t *)text;
    if (len && !text) return ms_err(err, errlen, MS_EINVAL, "no text given to encode");
    if (len > UINT32_MAX - 8)
        return ms_err(err, errlen, MS_EINVAL, "the text is %zu bytes; at most 4 GiB can be encoded", len);
    size_t valid = utf8_valid_prefix(s, len);
    if (valid != len)
        return ms_err(err, errlen, MS_EFORMAT, "the text is not valid UTF-8 (byte 0x%02x at offset %zu)",
                      s[valid], valid);
    struct enc e = {.t = t, .err = err, .errlen = errlen, .max_ids = max_ids};
    struct tok_pieces pieces = {0};
    int rc = 0;
    for (size_t i = 0; add_special && i < t->n_post_prefix && rc == 0; i++)
        rc = tok_ids_push(&e.ids, t->post_prefix[i]) ? enc_nomem(&e) : 0;
    if (rc == 0 && tok_added_split(&t->trie_raw, t->added, s, len, &pieces)) rc = enc_nomem(&e);
    for (size_t i = 0; i < pieces.len && rc == 0; i++) {
        struct tok_piece p = pieces.p[i];
        if (p.added >= 0) rc = tok_ids_push(&e.ids, t->added[p.added].id) ? enc_nomem(&e) : 0;
        else rc = encode_piece(&e, s + p.off, p.len);
        if (rc == 0) rc = enc_over(&e);
    }
    for (size_t i = 0; add_special && i < t->n_post_suffix && rc == 0; i++)
        rc = tok_ids_push(&e.ids, t->post_suffix[i]) ? enc_nomem(&e) : 0;
    if (rc == 0) rc = enc_over(&e);
    free(pieces.p);
    if (rc == 0) {
        *ids = e.ids.p;
        *n_ids = e.ids.len;
        e.ids.p = NULL;
        if (!*ids) { // an empty result still gives a pointer the caller can free
            *ids = malloc(sizeof **ids);
            if (!*ids) rc = ms_err(err, errlen, MS_ENOMEM, "out of memory");
        }
    }
    enc_free(&e);
    return rc;
}

// ---- accessors ----

int tok_vocab_size(const struct tokenizer *t)
{
    return t->n_ids;
}

bool tok_is_special(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->special[id];
}

size_t tok_max_bytes_per_id(const struct tokenizer *t)
{
    size_t m = 1;
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->has_token[id] && t->bytes_len[id] > m) m = t->bytes_len[id];
    // Normalization may shrink the text first: composition packs at most
    // three code points (a Hangul syllable's jamo, 9 bytes) into one of 3.
    return t->n_norm ? 3 * m : m;
}

const uint8_t *tok_token_bytes(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->has_token[id]) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->bytes_len[id];
    return t->bytes[id];
}

int32_t tok_find_token(const struct tokenizer *t, const char *content)
{
    if (!content) return -1;
    return tok_str_lookup(t, content, strlen(content));
}

const char *tok_chat_template(const struct tokenizer *t)
{
    return t->chat_template;
}

const char *tok_bos_token(const struct tokenizer *t)
{
    return t->bos_token;
}

const char *tok_eos_token(const struct tokenizer *t)
{
    return t->eos_token;
}
