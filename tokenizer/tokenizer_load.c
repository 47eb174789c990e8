// tokenizer_load: tokenizer.json and tokenizer_config.json -> struct tokenizer.
// Every field is type- and range-checked; a component we do not implement is
// refused with its name rather than approximated.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tokenizer_internal.h"

#define FAIL(code, ...) return ms_err(err, errlen, (code), __VA_ARGS__)

// ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ----

// Printable Latin-1 bytes stand for themselves; the other 68 bytes take the
// code points from U+0100 up, in byte order.
static void byte_level_alphabet(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    uint32_t extra = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        byte_to_cp[b] = printable ? (uint32_t)b : extra++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

// The bytes a token string stands for: each character through the
// byte-level alphabet, or — as Hugging Face's ByteLevel decoder does when a
// character is outside it — the string's own UTF-8.
static int token_bytes(const char *s, size_t n, const int16_t cp_to_byte[324], uint8_t **out,
                       size_t *out_len, bool *byte_level)
{
    uint8_t *b = malloc(n + 1);
    if (!b) return MS_ENOMEM;
    size_t o = 0, i = 0;
    bool ok = true;
    while (i < n) {
        uint32_t cp;
        i += (size_t)utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0) {
            ok = false;
            break;
        }
        b[o++] = (uint8_t)cp_to_byte[cp];
    }
    if (!ok) {
        memcpy(b, s, n);
        o = n;
    }
    b[o] = 0;
    *out = b;
    *out_len = o;
    if (byte_level) *byte_level = ok;
    return 0;
}

// ---- content -> id ----

static uint64_t str_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

static int str_map_init(struct tokenizer *t, size_t count)
{
    size_t cap = 16;
    while (cap < count * 2 + 16) {
        if (ms_mul_overflow(cap, 2, &cap)) return MS_ENOMEM;
    }
    t->str_slots = malloc(cap * sizeof *t->str_slots);
    if (!t->str_slots) return MS_ENOMEM;
    for (size_t i = 0; i < cap; i++) t->str_slots[i] = -1;
    t->str_mask = cap - 1;
    return 0;
}

// The slot holding s, or the empty slot where it would go.
static size_t str_slot(const struct tokenizer *t, const char *s, size_t n)
{
    size_t i = (size_t)str_hash(s, n) & t->str_mask;
    for (;;) {
        int32_t id = t->str_slots[i];
        if (id < 0) return i;
        const char *c = t->content[id];
        if (strlen(c) == n && memcmp(c, s, n) == 0) return i;
        i = (i + 1) & t->str_mask;
    }
}

int32_t tok_str_lookup(const struct tokenizer *t, const char *s, size_t n)
{
    if (!t->str_slots) return -1;
    return t->str_slots[str_slot(t, s, n)];
}

// ---- JSON field helpers (path names the field in messages) ----

static int get_bool(json_t *obj, const char *key, bool dflt, bool *out, const char *path,
                    char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v)) FAIL(MS_EFORMAT, "%s.%s must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

static const char *type_of(json_t *obj)
{
    json_t *ty = json_object_get(obj, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

// ---- components ----

static int load_normalizer(struct tokenizer *t, json_t *n, const char *path, int depth, char *err,
                           size_t errlen)
{
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) FAIL(MS_EFORMAT, "tokenizer.json: %s must be an object or null", path);
    if (depth > 4) FAIL(MS_EUNSUPPORTED, "tokenizer.json: %s nests Sequences too deeply", path);
    const char *ty = type_of(n);
    if (!ty) FAIL(MS_EFORMAT, "tokenizer.json: %s has no \"type\" string", path);
    enum tok_norm kind;
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            FAIL(MS_EFORMAT, "tokenizer.json: %s.normalizers must be an array", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            int rc = load_normalizer(t, json_array_get(list, i), sub, depth + 1, err, errlen);
            if (rc) return rc;
        }
        return 0;
    } else if (!strcmp(ty, "NFC")) {
        kind = TOK_NORM_NFC;
    } else if (!strcmp(ty, "NFD")) {
        kind = TOK_NORM_NFD;
    } else if (!strcmp(ty, "NFKC")) {
        kind = TOK_NORM_NFKC;
    } else if (!strcmp(ty, "NFKD")) {
        kind = TOK_NORM_NFKD;
    } else {
        FAIL(MS_EUNSUPPORTED,
             "tokenizer.json: %s is a \"%.64s\" normalizer, which moeserve does not implement "
             "(it implements NFC, NFD, NFKC, NFKD and Sequence)", path, ty);
    }
    if (t->n_norm == TOK_MAX_NORMALIZERS)
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: more than %d normalizers", TOK_MAX_NORMALIZERS);
    t->norm[t->n_norm++] = kind;
    return 0;
}

static int load_split(struct tokenizer *t, json_t *p, const char *path, char *err, size_t errlen)
{
    if (t->n_splits == TOK_MAX_SPLITS)
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: more than %d Split pre-tokenizers", TOK_MAX_SPLITS);
    struct tok_split_step *st = &t->splits[t->n_splits];
    json_t *pat = json_object_get(p, "pattern");
    json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    if (!json_is_string(rx) && !json_is_string(lit))
        FAIL(MS_EFORMAT, "tokenizer.json: %s.pattern must be {\"Regex\": string} or {\"String\": string}",
             path);
    json_t *src = json_is_string(rx) ? rx : lit;
    json_t *beh = json_object_get(p, "behavior");
    if (!json_is_string(beh)) FAIL(MS_EFORMAT, "tokenizer.json: %s.behavior must be a string", path);
    static const struct { const char *name; enum tok_split_behavior b; } behaviors[] = {
        {"Removed", TOK_SPLIT_REMOVED},
        {"Isolated", TOK_SPLIT_ISOLATED},
        {"MergedWithPrevious", TOK_SPLIT_MERGED_WITH_PREVIOUS},
        {"MergedWithNext", TOK_SPLIT_MERGED_WITH_NEXT},
        {"Contiguous", TOK_SPLIT_CONTIGUOUS},
    };
    size_t k = 0;
    for (; k < sizeof behaviors / sizeof behaviors[0]; k++)
        if (!strcmp(json_string_value(beh), behaviors[k].name)) break;
    if (k == sizeof behaviors / sizeof behaviors[0])
        FAIL(MS_EFORMAT,
             "tokenizer.json: %s.behavior \"%.64s\" is not one of Removed, Isolated, "
             "MergedWithPrevious, MergedWithNext, Contiguous", path, json_string_value(beh));
    st->behavior = behaviors[k].b;
    int rc = get_bool(p, "invert", false, &st->invert, path, err, errlen);
    if (rc) return rc;
    char rerr[400];
    rc = tok_regex_compile(&st->re, json_string_value(src), json_string_length(src),
                           json_is_string(lit), rerr, sizeof rerr);
    if (rc) FAIL(rc, "tokenizer.json: %s.pattern: %s", path, rerr);
    t->n_splits++;
    return 0;
}

// The GPT-2 pattern that ByteLevel splits with when use_regex is true.
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_byte_level(struct tokenizer *t, json_t *p, const char *path, char *err,
                           size_t errlen)
{
    int rc = get_bool(p, "add_prefix_space", true, &t->bl_add_prefix_space, path, err, errlen);
    if (rc) return rc;
    if ((rc = get_bool(p, "use_regex", true, &t->bl_use_regex, path, err, errlen))) return rc;
    if (t->bl_use_regex) {
        char rerr[300];
        rc = tok_regex_compile(&t->bl_regex, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, rerr,
                               sizeof rerr);
        if (rc) FAIL(MS_EINTERNAL, "the GPT-2 pattern does not compile: %s", rerr);
    }
    return 0;
}

static int load_pre_tokenizer(struct tokenizer *t, json_t *p, char *err, size_t errlen)
{
    if (!p || json_is_null(p))
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: pre_tokenizer is null; moeserve implements "
                              "byte-level BPE, which needs a ByteLevel pre-tokenizer");
    if (!json_is_object(p)) FAIL(MS_EFORMAT, "tokenizer.json: pre_tokenizer must be an object");
    const char *ty = type_of(p);
    if (!ty) FAIL(MS_EFORMAT, "tokenizer.json: pre_tokenizer has no \"type\" string");
    json_t *single[1] = {p};
    json_t **steps = single;
    size_t n_steps = 1;
    json_t *list = NULL;
    if (!strcmp(ty, "Sequence")) {
        list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list) || json_array_size(list) == 0)
            FAIL(MS_EFORMAT, "tokenizer.json: pre_tokenizer.pretokenizers must be a non-empty array");
        n_steps = json_array_size(list);
    }
    for (size_t i = 0; i < n_steps; i++) {
        json_t *step = list ? json_array_get(list, i) : steps[i];
        char path[64];
        if (list) snprintf(path, sizeof path, "pre_tokenizer.pretokenizers[%zu]", i);
        else snprintf(path, sizeof path, "pre_tokenizer");
        if (!json_is_object(step)) FAIL(MS_EFORMAT, "tokenizer.json: %s must be an object", path);
        const char *sty = type_of(step);
        if (!sty) FAIL(MS_EFORMAT, "tokenizer.json: %s has no \"type\" string", path);
        bool last = i + 1 == n_steps;
        int rc;
        if (!strcmp(sty, "Split")) {
            if (last)
                FAIL(MS_EUNSUPPORTED, "tokenizer.json: %s: the pre-tokenizers must end with "
                                      "ByteLevel (moeserve implements byte-level BPE)", path);
            rc = load_split(t, step, path, err, errlen);
        } else if (!strcmp(sty, "ByteLevel")) {
            if (!last)
                FAIL(MS_EUNSUPPORTED, "tokenizer.json: %s: ByteLevel followed by other "
                                      "pre-tokenizers is not supported", path);
            rc = load_byte_level(t, step, path, err, errlen);
        } else {
            FAIL(MS_EUNSUPPORTED,
                 "tokenizer.json: %s is a \"%.64s\" pre-tokenizer, which moeserve does not "
                 "implement (it implements Split, ByteLevel and Sequence)", path, sty);
        }
        if (rc) return rc;
    }
    return 0;
}

static int load_decoder(json_t *d, char *err, size_t errlen)
{
    if (!d || json_is_null(d))
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: decoder is null; moeserve implements the "
                              "ByteLevel decoder only");
    if (!json_is_object(d)) FAIL(MS_EFORMAT, "tokenizer.json: decoder must be an object");
    const char *ty = type_of(d);
    if (!ty) FAIL(MS_EFORMAT, "tokenizer.json: decoder has no \"type\" string");
    if (strcmp(ty, "ByteLevel"))
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: decoder is a \"%.64s\" decoder, which moeserve "
                              "does not implement (it implements ByteLevel)", ty);
    return 0;
}

static int push_id(int32_t **arr, size_t *n, int32_t id)
{
    int32_t *p = realloc(*arr, (*n + 1) * sizeof *p);
    if (!p) return MS_ENOMEM;
    p[(*n)++] = id;
    *arr = p;
    return 0;
}

static int load_template(struct tokenizer *t, json_t *p, const char *path, char *err, size_t errlen)
{
    json_t *single = json_object_get(p, "single");
    json_t *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single)) FAIL(MS_EFORMAT, "tokenizer.json: %s.single must be an array", path);
    if (specials && !json_is_object(specials) && !json_is_null(specials))
        FAIL(MS_EFORMAT, "tokenizer.json: %s.special_tokens must be an object", path);
    bool seen_a = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i);
        json_t *sp = json_is_object(item) ? json_object_get(item, "SpecialToken") : NULL;
        json_t *sq = json_is_object(item) ? json_object_get(item, "Sequence") : NULL;
        if (json_is_object(sq)) {
            json_t *sid = json_object_get(sq, "id");
            if (!json_is_string(sid) || strcmp(json_string_value(sid), "A"))
                FAIL(MS_EFORMAT, "tokenizer.json: %s.single[%zu] must be sequence \"A\"", path, i);
            if (seen_a) FAIL(MS_EFORMAT, "tokenizer.json: %s.single has sequence A twice", path);
            seen_a = true;
            continue;
        }
        if (!json_is_object(sp))
            FAIL(MS_EFORMAT, "tokenizer.json: %s.single[%zu] must be a SpecialToken or a Sequence",
                 path, i);
        json_t *name = json_object_get(sp, "id");
        if (!json_is_string(name))
            FAIL(MS_EFORMAT, "tokenizer.json: %s.single[%zu].SpecialToken.id must be a string", path, i);
        json_t *def = json_is_object(specials) ? json_object_get(specials, json_string_value(name)) : NULL;
        json_t *ids = json_is_object(def) ? json_object_get(def, "ids") : NULL;
        if (!json_is_array(ids))
            FAIL(MS_EFORMAT, "tokenizer.json: %s.special_tokens has no ids for \"%.64s\"", path,
                 json_string_value(name));
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *v = json_array_get(ids, k);
            json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
            if (id < 0 || id >= t->n_ids || !t->has_token[id])
                FAIL(MS_EFORMAT, "tokenizer.json: %s.special_tokens[\"%.64s\"].ids[%zu] is not a "
                                 "token id", path, json_string_value(name), k);
            int rc = push_id(seen_a ? &t->post_suffix : &t->post_prefix,
                             seen_a ? &t->n_post_suffix : &t->n_post_prefix, (int32_t)id);
            if (rc) return rc;
        }
    }
    if (!seen_a) FAIL(MS_EFORMAT, "tokenizer.json: %s.single has no sequence A", path);
    return 0;
}

static int load_post_processor(struct tokenizer *t, json_t *p, const char *path, int depth,
                               bool *have_template, char *err, size_t errlen)
{
    if (!p || json_is_null(p)) return 0;
    if (!json_is_object(p)) FAIL(MS_EFORMAT, "tokenizer.json: %s must be an object or null", path);
    if (depth > 4) FAIL(MS_EUNSUPPORTED, "tokenizer.json: %s nests Sequences too deeply", path);
    const char *ty = type_of(p);
    if (!ty) FAIL(MS_EFORMAT, "tokenizer.json: %s has no \"type\" string", path);
    if (!strcmp(ty, "ByteLevel")) return 0; // it only adjusts offsets
    if (!strcmp(ty, "TemplateProcessing")) {
        if (*have_template)
            FAIL(MS_EUNSUPPORTED, "tokenizer.json: %s: more than one TemplateProcessing", path);
        *have_template = true;
        return load_template(t, p, path, err, errlen);
    }
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(p, "processors");
        if (!json_is_array(list)) FAIL(MS_EFORMAT, "tokenizer.json: %s.processors must be an array", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            int rc = load_post_processor(t, json_array_get(list, i), sub, depth + 1, have_template,
                                         err, errlen);
            if (rc) return rc;
        }
        return 0;
    }
    FAIL(MS_EUNSUPPORTED,
         "tokenizer.json: %s is a \"%.64s\" post-processor, which moeserve does not implement "
         "(it implements ByteLevel, TemplateProcessing and Sequence)", path, ty);
}

// ---- the model: vocab and merges ----

static int check_id_value(json_t *v, int32_t limit, int32_t *out)
{
    if (!json_is_integer(v)) return -1;
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= limit) return -2;
    *out = (int32_t)id;
    return 0;
}

static int set_content(struct tokenizer *t, int32_t id, const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (!c) return MS_ENOMEM;
    memcpy(c, s, n);
    c[n] = 0;
    t->content[id] = c;
    return 0;
}

static int merge_part(const struct tokenizer *t, const bool *in_vocab, const char *s, size_t n,
                      size_t rank, char *err, size_t errlen, int32_t *id)
{
    *id = tok_str_lookup(t, s, n);
    if (*id < 0 || !in_vocab[*id])
        FAIL(MS_EFORMAT, "tokenizer.json: model.merges[%zu] names \"%.*s\", which is not in "
                         "model.vocab", rank, (int)(n > 64 ? 64 : n), s);
    return 0;
}

static int load_merges(struct tokenizer *t, json_t *merges, const bool *in_vocab, char *err,
                       size_t errlen)
{
    size_t nm = json_array_size(merges);
    if (nm >= TOK_MERGE_MAX)
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: model.merges has %zu merges; moeserve supports up "
                              "to %u", nm, TOK_MERGE_MAX - 1);
    if (tok_merges_init(t->merges, nm)) FAIL(MS_ENOMEM, "out of memory for %zu merges", nm);
    char *cat = NULL;
    size_t cat_cap = 0;
    int rc = 0;
    for (size_t r = 0; r < nm && rc == 0; r++) {
        json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            // The older form "left right": exactly one space separates the parts.
            const char *s = json_string_value(m);
            size_t n = json_string_length(m);
            const char *sp = memchr(s, ' ', n);
            if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
                rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer.json: model.merges[%zu] \"%.64s\" is "
                                                     "not two tokens separated by one space", r, s);
                break;
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = n - la - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            lb = json_string_length(json_array_get(m, 1));
        } else {
            rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer.json: model.merges[%zu] must be a "
                                                 "string or a pair of strings", r);
            break;
        }
        int32_t ia, ib;
        if ((rc = merge_part(t, in_vocab, a, la, r, err, errlen, &ia))) break;
        if ((rc = merge_part(t, in_vocab, b, lb, r, err, errlen, &ib))) break;
        size_t lc;
        if (ms_add_overflow(la, lb, &lc) || ms_add_overflow(lc, 1, &lc)) {
            rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer.json: model.merges[%zu] is too long", r);
            break;
        }
        if (lc > cat_cap) {
            char *nc = realloc(cat, lc);
            if (!nc) {
                rc = ms_err(err, errlen, MS_ENOMEM, "out of memory reading merges");
                break;
            }
            cat = nc;
            cat_cap = lc;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        int32_t ic = tok_str_lookup(t, cat, la + lb);
        if (ic < 0 || !in_vocab[ic]) {
            rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer.json: model.merges[%zu] makes \"%.*s\", "
                                                 "which is not in model.vocab", r,
                        (int)(la + lb > 64 ? 64 : la + lb), cat);
            break;
        }
        tok_merges_put(t->merges, ia, ib, (uint32_t)r, ic);
    }
    free(cat);
    return rc;
}

static int load_model(struct tokenizer *t, json_t *model, json_t *added_tokens, bool **in_vocab_out,
                      const int16_t cp_to_byte[324], const uint32_t byte_to_cp[256], char *err,
                      size_t errlen)
{
    if (!json_is_object(model)) FAIL(MS_EFORMAT, "tokenizer.json: model must be an object");
    const char *ty = type_of(model);
    if (!ty) FAIL(MS_EFORMAT, "tokenizer.json: model has no \"type\" string");
    if (strcmp(ty, "BPE"))
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: model is a \"%.64s\" model, which moeserve does not "
                              "implement (it implements BPE)", ty);
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v)) {
        if (!json_is_number(v)) FAIL(MS_EFORMAT, "tokenizer.json: model.dropout must be a number or null");
        if (json_number_value(v) != 0.0)
            FAIL(MS_EUNSUPPORTED, "tokenizer.json: model.dropout is %g; BPE dropout (random "
                                  "segmentations) is not supported", json_number_value(v));
    }
    const char *strfields[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        v = json_object_get(model, strfields[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) FAIL(MS_EFORMAT, "tokenizer.json: model.%s must be a string or null", strfields[i]);
        if (json_string_length(v))
            FAIL(MS_EUNSUPPORTED, "tokenizer.json: model.%s \"%.32s\" is not supported with "
                                  "byte-level BPE", strfields[i], json_string_value(v));
    }
    bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
    int rc;
    if ((rc = get_bool(model, "byte_fallback", false, &byte_fallback, "model", err, errlen))) return rc;
    if (byte_fallback)
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: model.byte_fallback is true; moeserve implements "
                              "byte-level BPE, where it has no use");
    if ((rc = get_bool(model, "ignore_merges", false, &ignore_merges, "model", err, errlen))) return rc;
    if ((rc = get_bool(model, "fuse_unk", false, &fuse_unk, "model", err, errlen))) return rc;
    if (ignore_merges)
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: model.ignore_merges is true, which moeserve does "
                              "not implement");
    v = json_object_get(model, "unk_token");
    if (v && !json_is_null(v) && !json_is_string(v))
        FAIL(MS_EFORMAT, "tokenizer.json: model.unk_token must be a string or null");

    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) FAIL(MS_EFORMAT, "tokenizer.json: model.vocab must be an object");
    if (!merges || json_is_null(merges)) merges = NULL;
    else if (!json_is_array(merges)) FAIL(MS_EFORMAT, "tokenizer.json: model.merges must be an array");
    size_t n_vocab = json_object_size(vocab);
    size_t n_added = json_array_size(added_tokens);
    if (n_vocab == 0) FAIL(MS_EFORMAT, "tokenizer.json: model.vocab is empty");
    if (n_vocab + n_added > (size_t)INT32_MAX / 2)
        FAIL(MS_EFORMAT, "tokenizer.json: %zu tokens are more than moeserve accepts", n_vocab + n_added);
    // Ids are dense in practice; anything beyond the number of entries is a
    // damaged file, and refusing it bounds the tables we allocate.
    int32_t limit = (int32_t)(n_vocab + n_added);

    // First pass: the largest id, so that the tables can be sized.
    int32_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        int32_t id;
        int r = check_id_value(val, limit, &id);
        if (r == -1) FAIL(MS_EFORMAT, "tokenizer.json: model.vocab[\"%.64s\"] must be an integer id", key);
        if (r == -2)
            FAIL(MS_EFORMAT, "tokenizer.json: model.vocab[\"%.64s\"] = %lld is out of range: with %zu "
                             "vocabulary entries and %zu added tokens ids must be 0 to %d", key,
                 (long long)json_integer_value(val), n_vocab, n_added, (int)limit - 1);
        if (id > max_id) max_id = id;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added_tokens, i);
        json_t *idv = json_is_object(a) ? json_object_get(a, "id") : NULL;
        int32_t id;
        int r = check_id_value(idv, limit, &id);
        if (r == -1) FAIL(MS_EFORMAT, "tokenizer.json: added_tokens[%zu].id must be an integer", i);
        if (r == -2)
            FAIL(MS_EFORMAT, "tokenizer.json: added_tokens[%zu].id = %lld is out of range: ids must "
                             "be 0 to %d", i, (long long)json_integer_value(idv), (int)limit - 1);
        if (id > max_id) max_id = id;
    }
    t->n_ids = max_id + 1;
    if ((uint32_t)t->n_ids > TOK_MERGE_MAX)
        FAIL(MS_EUNSUPPORTED, "tokenizer.json: ids go up to %d; moeserve supports up to %u tokens",
             (int)max_id, TOK_MERGE_MAX);
    size_t nids = (size_t)t->n_ids;
    t->has_token = calloc(nids, sizeof *t->has_token);
    t->special = calloc(nids, sizeof *t->special);
    t->added_index = malloc(nids * sizeof *t->added_index);
    t->bytes = calloc(nids, sizeof *t->bytes);
    t->bytes_len = calloc(nids, sizeof *t->bytes_len);
    t->content = calloc(nids, sizeof *t->content);
    bool *in_vocab = calloc(nids, sizeof *in_vocab);
    *in_vocab_out = in_vocab;
    if (!t->has_token || !t->special || !t->added_index || !t->bytes || !t->bytes_len ||
        !t->content || !in_vocab)
        FAIL(MS_ENOMEM, "out of memory for %zu tokens", nids);
    for (size_t i = 0; i < nids; i++) t->added_index[i] = -1;
    if (str_map_init(t, n_vocab + n_added)) FAIL(MS_ENOMEM, "out of memory for the vocabulary");

    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t klen = strlen(key);
        if (t->has_token[id])
            FAIL(MS_EFORMAT, "tokenizer.json: model.vocab gives id %d to both \"%.64s\" and \"%.64s\"",
                 (int)id, t->content[id], key);
        if ((rc = set_content(t, id, key, klen))) FAIL(rc, "out of memory for the vocabulary");
        size_t bl;
        if ((rc = token_bytes(key, klen, cp_to_byte, &t->bytes[id], &bl, NULL)))
            FAIL(rc, "out of memory for the vocabulary");
        t->bytes_len[id] = (uint32_t)bl;
        t->has_token[id] = true;
        in_vocab[id] = true;
        size_t slot = str_slot(t, key, klen);
        t->str_slots[slot] = id; // keys are unique: jansson refused duplicates
    }
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        int l = (int)utf8_encode(byte_to_cp[b], u);
        int32_t id = tok_str_lookup(t, (const char *)u, (size_t)l);
        if (id < 0 || !in_vocab[id])
            FAIL(MS_EFORMAT, "tokenizer.json: model.vocab has no token for byte 0x%02x (\"%.*s\"); "
                             "byte-level BPE needs all 256", b, l, (const char *)u);
        t->byte_id[b] = id;
    }
    t->merges = malloc(sizeof *t->merges);
    if (!t->merges) FAIL(MS_ENOMEM, "out of memory for the merges");
    t->merges->slots = NULL;
    t->merges->merged = NULL;
    if (merges && (rc = load_merges(t, merges, in_vocab, err, errlen))) return rc;
    if (!merges && tok_merges_init(t->merges, 0)) FAIL(MS_ENOMEM, "out of memory");
    tok_merges_index_bytes(t->merges, t->byte_id);
    return 0;
}

static int load_added(struct tokenizer *t, json_t *added_tokens, const bool *in_vocab,
                      size_t n_vocab, const int16_t cp_to_byte[324], char *err, size_t errlen)
{
    size_t n = json_array_size(added_tokens);
    if (n == 0) return 0;
    int32_t next_id = (int32_t)n_vocab, *next_new = &next_id;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added) FAIL(MS_ENOMEM, "out of memory for added tokens");
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(added_tokens, i);
        if (!json_is_object(a)) FAIL(MS_EFORMAT, "tokenizer.json: added_tokens[%zu] must be an object", i);
        char path[48];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        json_t *c = json_object_get(a, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            FAIL(MS_EFORMAT, "tokenizer.json: %s.content must be a non-empty string", path);
        const char *s = json_string_value(c);
        size_t sl = json_string_length(c);
        if (memchr(s, 0, sl)) FAIL(MS_EFORMAT, "tokenizer.json: %s.content contains a NUL", path);
        struct tok_added *ad = &t->added[t->n_added];
        ad->id = (int32_t)json_integer_value(json_object_get(a, "id")); // checked by load_model
        int rc;
        if ((rc = get_bool(a, "special", false, &ad->special, path, err, errlen))) return rc;
        if ((rc = get_bool(a, "lstrip", false, &ad->lstrip, path, err, errlen))) return rc;
        if ((rc = get_bool(a, "rstrip", false, &ad->rstrip, path, err, errlen))) return rc;
        if ((rc = get_bool(a, "single_word", false, &ad->single_word, path, err, errlen))) return rc;
        if ((rc = get_bool(a, "normalized", true, &ad->normalized, path, err, errlen))) return rc;
        int32_t id = ad->id;
        // Hugging Face ignores the ids written here and assigns its own: a
        // content it already knows keeps that id, a new one takes the next
        // id after the vocabulary (or after the largest added id). A file
        // whose ids differ would encode differently there, so it is refused.
        int32_t known = tok_str_lookup(t, s, sl);
        int32_t expect = known >= 0 ? known : *next_new;
        if (id != expect)
            FAIL(MS_EFORMAT, "tokenizer.json: %s \"%.64s\" has id %d, but Hugging Face would give it "
                             "id %d (%s)", path, s, (int)id, (int)expect,
                 known >= 0 ? "the id its content already has" : "the next free id");
        if (known < 0) *next_new = id + 1;
        if (t->has_token[id]) {
            if (!in_vocab[id] || t->added_index[id] >= 0)
                FAIL(MS_EFORMAT, "tokenizer.json: %s.id %d is already the added token \"%.64s\"",
                     path, (int)id, t->content[id]);
            if (strcmp(t->content[id], s))
                FAIL(MS_EFORMAT, "tokenizer.json: %s gives id %d to \"%.64s\" but model.vocab gives "
                                 "it to \"%.64s\"", path, (int)id, s, t->content[id]);
        } else {
            if ((rc = set_content(t, id, s, sl))) FAIL(rc, "out of memory for added tokens");
            size_t bl;
            if ((rc = token_bytes(s, sl, cp_to_byte, &t->bytes[id], &bl, NULL)))
                FAIL(rc, "out of memory for added tokens");
            t->bytes_len[id] = (uint32_t)bl;
            t->has_token[id] = true;
        }
        // An added token shadows a vocabulary token with the same content.
        t->str_slots[str_slot(t, s, sl)] = id;
        ad->content = t->content[id];
        ad->len = sl;
        t->special[id] = ad->special;
        t->added_index[id] = (int32_t)t->n_added;
        t->n_added++;
    }
    return 0;
}

// ---- tokenizer_config.json ----

static int config_token(json_t *cfg, const char *key, char **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content"); // {"__type": "AddedToken", ...}
    if (!json_is_string(v))
        FAIL(MS_EFORMAT, "tokenizer_config.json: %s must be a string, an AddedToken object or null", key);
    *out = strdup(json_string_value(v));
    if (!*out) FAIL(MS_ENOMEM, "out of memory");
    return 0;
}

static int load_config(struct tokenizer *t, json_t *cfg, bool *split_special, char *err,
                       size_t errlen)
{
    int rc;
    json_t *v = json_object_get(cfg, "chat_template");
    if (json_is_array(v)) {
        // A list of named templates: transformers uses "default" when none is named.
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *e = json_array_get(v, i);
            json_t *name = json_is_object(e) ? json_object_get(e, "name") : NULL;
            json_t *tpl = json_is_object(e) ? json_object_get(e, "template") : NULL;
            if (!json_is_string(name) || !json_is_string(tpl))
                FAIL(MS_EFORMAT, "tokenizer_config.json: chat_template[%zu] needs string \"name\" "
                                 "and \"template\"", i);
            if (!strcmp(json_string_value(name), "default")) v = tpl;
        }
        if (json_is_array(v)) v = NULL;
    }
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            FAIL(MS_EFORMAT, "tokenizer_config.json: chat_template must be a string or a list");
        t->chat_template = strdup(json_string_value(v));
        if (!t->chat_template) FAIL(MS_ENOMEM, "out of memory");
    }
    if ((rc = config_token(cfg, "bos_token", &t->bos_token, err, errlen))) return rc;
    if ((rc = config_token(cfg, "eos_token", &t->eos_token, err, errlen))) return rc;
    bool cleanup = false;
    if ((rc = get_bool(cfg, "clean_up_tokenization_spaces", false, &cleanup, "tokenizer_config",
                       err, errlen)))
        return rc;
    if (cleanup)
        FAIL(MS_EUNSUPPORTED, "tokenizer_config.json: clean_up_tokenization_spaces is true; "
                              "moeserve's decoder does not implement that clean-up");
    if ((rc = get_bool(cfg, "split_special_tokens", false, split_special, "tokenizer_config", err,
                       errlen)))
        return rc;
    // transformers treats every token tokenizer_config.json names as special
    // (skip_special_tokens drops it). One that tokenizer.json's added_tokens
    // lacks, transformers would add with a new id; we refuse instead.
    static const char *named[] = {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                                  "cls_token", "mask_token"};
    const size_t n_named = sizeof named / sizeof named[0];
    for (size_t i = 0; i <= n_named; i++) {
        // Pass n_named is the list additional_special_tokens, when there is one.
        json_t *list = i < n_named ? NULL : json_object_get(cfg, "additional_special_tokens");
        if (list && json_is_null(list)) list = NULL;
        if (i == n_named && !list) break;
        if (list && !json_is_array(list))
            FAIL(MS_EFORMAT, "tokenizer_config.json: additional_special_tokens must be a list");
        size_t n = list ? json_array_size(list) : 1;
        for (size_t k = 0; k < n; k++) {
            json_t *v = list ? json_array_get(list, k) : json_object_get(cfg, named[i]);
            const char *key = list ? "additional_special_tokens" : named[i];
            if (!v || json_is_null(v)) continue;
            if (json_is_object(v)) v = json_object_get(v, "content");
            if (!json_is_string(v))
                FAIL(MS_EFORMAT, "tokenizer_config.json: %s must be a string, an AddedToken object or null", key);
            int32_t id = tok_str_lookup(t, json_string_value(v), json_string_length(v));
            if (id < 0 || t->added_index[id] < 0)
                FAIL(MS_EUNSUPPORTED, "tokenizer_config.json: %s \"%.64s\" is not one of tokenizer.json's "
                                      "added_tokens (transformers would add it with an id of its own)",
                     key, json_string_value(v));
            t->special[id] = true;
            t->added[t->added_index[id]].special = true;
        }
    }
    // added_tokens_decoder repeats tokenizer.json's added tokens; a
    // disagreement means the two files are from different tokenizers.
    json_t *atd = json_object_get(cfg, "added_tokens_decoder");
    if (atd && !json_is_null(atd)) {
        if (!json_is_object(atd))
            FAIL(MS_EFORMAT, "tokenizer_config.json: added_tokens_decoder must be an object");
        const char *k;
        json_t *e;
        json_object_foreach(atd, k, e) {
            char *end = NULL;
            long id = strtol(k, &end, 10);
            json_t *c = json_is_object(e) ? json_object_get(e, "content") : NULL;
            if (!*k || *end || id < 0 || !json_is_string(c))
                FAIL(MS_EFORMAT, "tokenizer_config.json: added_tokens_decoder[\"%.32s\"] must map an "
                                 "id to an object with a content string", k);
            if (id >= t->n_ids || !t->has_token[id] || strcmp(t->content[id], json_string_value(c)))
                FAIL(MS_EFORMAT, "tokenizer_config.json: added_tokens_decoder gives id %ld to "
                                 "\"%.64s\", which tokenizer.json does not", id, json_string_value(c));
        }
    }
    return 0;
}

// ---- entry point ----

int tok_load_json(struct tokenizer *t, const char *tok_json, size_t tok_len,
                  const char *cfg_json, size_t cfg_len, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(tok_json, tok_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        FAIL(MS_EFORMAT, "tokenizer.json is not valid JSON: %s (line %d, column %d)", jerr.text,
             jerr.line, jerr.column);
    json_t *cfg = NULL;
    bool *in_vocab = NULL;
    int rc = 0;
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    byte_level_alphabet(byte_to_cp, cp_to_byte);
    bool split_special = false;
    bool have_template = false;

    if (!json_is_object(root)) {
        rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer.json must hold a JSON object");
        goto out;
    }
    if (cfg_json) {
        cfg = json_loadb(cfg_json, cfg_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!cfg || !json_is_object(cfg)) {
            rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer_config.json is not a JSON object: %s "
                                                 "(line %d, column %d)",
                        cfg ? "another JSON value" : jerr.text, cfg ? 0 : jerr.line, cfg ? 0 : jerr.column);
            goto out;
        }
    }
    const char *refused[] = {"truncation", "padding"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, refused[i]);
        if (v && !json_is_null(v)) {
            rc = ms_err(err, errlen, MS_EUNSUPPORTED, "tokenizer.json: %s is set; moeserve never "
                                                      "truncates or pads a prompt", refused[i]);
            goto out;
        }
    }
    json_t *added_tokens = json_object_get(root, "added_tokens");
    if (added_tokens && !json_is_null(added_tokens) && !json_is_array(added_tokens)) {
        rc = ms_err(err, errlen, MS_EFORMAT, "tokenizer.json: added_tokens must be an array");
        goto out;
    }
    if (json_is_null(added_tokens)) added_tokens = NULL;
    if ((rc = load_model(t, json_object_get(root, "model"), added_tokens, &in_vocab, cp_to_byte,
                         byte_to_cp, err, errlen)))
        goto out;
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    if ((rc = load_added(t, added_tokens, in_vocab, json_object_size(vocab), cp_to_byte, err, errlen)))
        goto out;
    if ((rc = load_normalizer(t, json_object_get(root, "normalizer"), "normalizer", 0, err, errlen)))
        goto out;
    if ((rc = load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), err, errlen))) goto out;
    if ((rc = load_decoder(json_object_get(root, "decoder"), err, errlen))) goto out;
    if ((rc = load_post_processor(t, json_object_get(root, "post_processor"), "post_processor", 0,
                                  &have_template, err, errlen)))
        goto out;
    if (cfg && (rc = load_config(t, cfg, &split_special, err, errlen))) goto out;

    // What a normalized added token matches is its content after normalization.
    for (size_t i = 0; i < t->n_added && rc == 0; i++) {
        struct tok_added *a = &t->added[i];
        struct tok_buf nb = {0};
        if (a->normalized && t->n_norm) {
            rc = tok_normalize(t->norm, t->n_norm, (const uint8_t *)a->content, a->len, &nb);
        } else {
            rc = tok_buf_push(&nb, a->content, a->len);
        }
        if (rc) {
            free(nb.p);
            rc = ms_err(err, errlen, rc, "cannot normalize added token \"%.64s\"", a->content);
            goto out;
        }
        a->pattern = nb.p;
        a->pattern_len = nb.len;
        if (a->normalized) t->have_norm_added = true;
    }
    if ((rc = tok_trie_build(&t->trie_raw, t->added, t->n_added, false, split_special)) ||
        (rc = tok_trie_build(&t->trie_norm, t->added, t->n_added, true, split_special))) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for the added-token matcher");
        goto out;
    }
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->bytes_len[id] > t->max_token_bytes) t->max_token_bytes = t->bytes_len[id];
out:
    free(in_vocab);
    json_decref(cfg);
    json_decref(root);
    return rc;
}

void tok_free_fields(struct tokenizer *t)
{
    if (t->content)
        for (int32_t i = 0; i < t->n_ids; i++) free(t->content[i]);
    if (t->bytes)
        for (int32_t i = 0; i < t->n_ids; i++) free(t->bytes[i]);
    free(t->content);
    free(t->bytes);
    free(t->bytes_len);
    free(t->has_token);
    free(t->special);
    free(t->added_index);
    free(t->str_slots);
    if (t->merges) tok_merges_free(t->merges);
    free(t->merges);
    for (int i = 0; i < t->n_splits; i++) tok_regex_free(&t->splits[i].re);
    tok_regex_free(&t->bl_regex);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].pattern);
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    free(t->post_prefix);
    free(t->post_suffix);
    free(t->chat_template);
    free(t->bos_token);
    free(t->eos_token);
}
