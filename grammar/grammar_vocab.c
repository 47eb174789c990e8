// grammar_vocab: the tokenizer's vocabulary as byte strings in a preorder
// trie (built once per tokenizer), and the trie builder that the
// per-position suffix tries reuse.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"
#include "tokenizer/tokenizer.h"

static int entry_cmp(const void *a, const void *b)
{
    const struct gtrie_entry *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->bytes, y->bytes, n) : 0;
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void gtrie_sort(struct gtrie_entry *e, size_t n)
{
    if (n > 1) qsort(e, n, sizeof *e, entry_cmp);
}

// Appends the preorder trie of sorted entries to *nodes (and their ids to
// *ids). Each entry's bytes are 1..UINT16_MAX long.
int gtrie_build(const struct gtrie_entry *e, size_t n, struct gtrie **nodes, size_t *n_nodes,
                size_t *cap_nodes, int32_t **ids, size_t *n_ids, size_t *cap_ids)
{
    size_t max_len = 0;
    for (size_t i = 0; i < n; i++)
        if (e[i].len > max_len) max_len = e[i].len;
    size_t *path = malloc((max_len + 1) * sizeof *path);
    if (!path) return MS_ENOMEM;
    size_t cur = 0; // depth of the last path
    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        if (i > 0) {
            size_t m = e[i - 1].len < e[i].len ? e[i - 1].len : e[i].len;
            while (l < m && e[i - 1].bytes[l] == e[i].bytes[l]) l++;
        }
        bool dup = i > 0 && l == e[i].len && e[i - 1].len == e[i].len;
        if (!dup) {
            for (size_t d = cur; d > l; d--) (*nodes)[path[d]].end = (uint32_t)*n_nodes;
            for (size_t d = l + 1; d <= e[i].len; d++) {
                if (*n_nodes == *cap_nodes) {
                    size_t cap = *cap_nodes ? 2 * *cap_nodes : 1024;
                    struct gtrie *t = realloc(*nodes, cap * sizeof *t);
                    if (!t) {
                        free(path);
                        return MS_ENOMEM;
                    }
                    *nodes = t;
                    *cap_nodes = cap;
                }
                (*nodes)[*n_nodes] = (struct gtrie){.end = 0, .tok_begin = 0, .tok_n = 0,
                                                    .depth = (uint16_t)d, .byte = e[i].bytes[d - 1]};
                path[d] = (*n_nodes)++;
            }
            cur = e[i].len;
            (*nodes)[path[cur]].tok_begin = (uint32_t)*n_ids;
        }
        struct gtrie *leaf = &(*nodes)[path[e[i].len]];
        if (leaf->tok_n == UINT16_MAX) continue; // more duplicates than that: the rest are never allowed
        if (*n_ids == *cap_ids) {
            size_t cap = *cap_ids ? 2 * *cap_ids : 1024;
            int32_t *t = realloc(*ids, cap * sizeof *t);
            if (!t) {
                free(path);
                return MS_ENOMEM;
            }
            *ids = t;
            *cap_ids = cap;
        }
        (*ids)[(*n_ids)++] = e[i].id;
        leaf->tok_n++;
    }
    for (size_t d = cur; d > 0; d--) (*nodes)[path[d]].end = (uint32_t)*n_nodes;
    free(path);
    return 0;
}

int grammar_vocab_create(const struct tokenizer *tok, int model_vocab_size, const int32_t *eos_ids, int n_eos,
                         struct grammar_vocab **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!tok || model_vocab_size <= 0 || model_vocab_size > (1 << 24))
        return ms_err(err, errlen, MS_EINVAL, "grammar vocabulary: model vocabulary size %d out of range",
                      model_vocab_size);
    if (n_eos < 1 || n_eos > 64 || !eos_ids)
        return ms_err(err, errlen, MS_EINVAL, "grammar vocabulary: need 1 to 64 end-of-sequence ids, got %d",
                      n_eos);
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the grammar vocabulary");
    int n_tok = tok_vocab_size(tok);
    if (n_tok > model_vocab_size) n_tok = model_vocab_size;
    v->n_vocab = model_vocab_size;
    v->n_tok = n_tok;
    v->mask_words = (model_vocab_size + 31) / 32;
    v->bytes = calloc((size_t)n_tok + 1, sizeof *v->bytes);
    v->len = calloc((size_t)n_tok + 1, sizeof *v->len);
    v->is_eos = calloc((size_t)n_tok + 1, 1);
    v->eos = malloc((size_t)n_eos * sizeof *v->eos);
    v->special = malloc(((size_t)n_tok + 1) * sizeof *v->special);
    struct gtrie_entry *e = malloc(((size_t)n_tok + 1) * sizeof *e);
    int rc = 0;
    if (!v->bytes || !v->len || !v->is_eos || !v->eos || !v->special || !e) goto nomem;
    for (int i = 0; i < n_eos; i++) {
        if (eos_ids[i] < 0 || eos_ids[i] >= model_vocab_size) {
            rc = ms_err(err, errlen, MS_EINVAL, "grammar vocabulary: end-of-sequence id %d out of range",
                        eos_ids[i]);
            goto fail;
        }
        v->eos[v->n_eos++] = eos_ids[i];
        if (eos_ids[i] < n_tok) v->is_eos[eos_ids[i]] = 1;
    }
    size_t total = 0;
    for (int id = 0; id < n_tok; id++) {
        size_t len;
        if (tok_token_bytes(tok, id, &len) && len <= UINT16_MAX && ms_add_overflow(total, len, &total))
            goto nomem;
    }
    v->blob = malloc(total ? total : 1);
    if (!v->blob) goto nomem;
    size_t n_e = 0, at = 0;
    for (int id = 0; id < n_tok; id++) {
        size_t len;
        const uint8_t *b = tok_token_bytes(tok, id, &len);
        if (!b || len == 0 || len > UINT16_MAX || v->is_eos[id]) continue;
        v->bytes[id] = v->blob + at;
        memcpy(v->bytes[id], b, len);
        at += len;
        v->len[id] = (uint32_t)len;
        if ((int)len > v->max_len) v->max_len = (int)len;
        if (tok_is_special(tok, id)) {
            v->special[v->n_special++] = id;
            continue;
        }
        e[n_e++] = (struct gtrie_entry){v->bytes[id], len, id};
    }
    gtrie_sort(e, n_e);
    size_t cap_nodes = 0, cap_ids = 0;
    if (gtrie_build(e, n_e, &v->trie, &v->n_trie, &cap_nodes, &v->trie_tok, &v->n_trie_tok, &cap_ids))
        goto nomem;
    free(e);
    *out = v;
    return 0;
nomem:
    rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for the grammar vocabulary");
fail:
    free(e);
    grammar_vocab_destroy(v);
    return rc;
}

void grammar_vocab_destroy(struct grammar_vocab *v)
{
    if (!v) return;
    free(v->blob);
    free(v->bytes);
    free(v->len);
    free(v->is_eos);
    free(v->eos);
    free(v->special);
    free(v->trie);
    free(v->trie_tok);
    free(v);
}

int grammar_vocab_size(const struct grammar_vocab *v)
{
    return v->n_vocab;
}

int grammar_vocab_mask_words(const struct grammar_vocab *v)
{
    return v->mask_words;
}
