// grammar_tokens: the token-level half of compilation. For every automaton
// position the whole vocabulary trie is walked once, starting from a stack
// that holds only that position: tokens that finish inside the rule are
// accepted for good, tokens that die inside it are rejected for good, and
// the few that leave the rule part-way (a closing quote followed by a comma)
// are kept, as suffixes in a small trie, for the matcher to check against
// the live stack.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"

struct unc_entry {
    int32_t id;
    uint16_t k; // bytes consumed inside the rule
};

struct walker {
    const struct grammar *g;
    const struct grammar_vocab *v;
    struct gs_pool pool;
    struct gs_scratch sc;
    struct gs_set *sets; // per depth
    uint16_t *live;      // depths at which the rule returned, still worth checking
    uint32_t *nlive;
    int32_t *acc;
    size_t n_acc, cap_acc;
    struct unc_entry *unc;
    size_t n_unc, cap_unc;
    uint64_t steps;
};

static void walker_free(struct walker *w, int depth)
{
    gs_pool_free(&w->pool);
    gs_scratch_free(&w->sc);
    if (w->sets)
        for (int d = 0; d < depth; d++) gs_set_free(&w->sets[d]);
    free(w->sets);
    free(w->live);
    free(w->nlive);
    free(w->acc);
    free(w->unc);
}

static int push_acc(struct walker *w, int32_t id)
{
    if (w->n_acc == w->cap_acc) {
        size_t cap = w->cap_acc ? 2 * w->cap_acc : 1024;
        int32_t *a = realloc(w->acc, cap * sizeof *a);
        if (!a) return MS_ENOMEM;
        w->acc = a;
        w->cap_acc = cap;
    }
    w->acc[w->n_acc++] = id;
    return 0;
}

static int push_unc(struct walker *w, int32_t id, uint16_t k)
{
    if (w->n_unc == w->cap_unc) {
        size_t cap = w->cap_unc ? 2 * w->cap_unc : 256;
        struct unc_entry *a = realloc(w->unc, cap * sizeof *a);
        if (!a) return MS_ENOMEM;
        w->unc = a;
        w->cap_unc = cap;
    }
    w->unc[w->n_unc++] = (struct unc_entry){id, k};
    return 0;
}

// The walk of one position over the vocabulary trie. Long because the
// per-depth bookkeeping (sets, rule returns still alive) must stay in step
// with the preorder index; split, it would pass all of it around.
static int walk_position(struct walker *w, int32_t s)
{
    const struct grammar *g = w->g;
    const struct grammar_vocab *v = w->v;
    const uint8_t *fol = g->follow + (size_t)g->states[s].rule * 32;
    gs_pool_clear(&w->pool);
    w->n_acc = w->n_unc = 0;
    struct gs_set *s0 = &w->sets[0];
    s0->n = 0;
    s0->ended = s0->popped = false;
    if (!s0->cap) {
        s0->t = malloc(16 * sizeof *s0->t);
        if (!s0->t) return MS_ENOMEM;
        s0->cap = 16;
    }
    s0->t[s0->n++] = (struct gs_top){s, GS_BOTTOM};
    w->nlive[0] = 0;
    size_t i = 0;
    while (i < v->n_trie) {
        const struct gtrie *node = &v->trie[i];
        int d = node->depth;
        struct gs_set *out = &w->sets[d];
        gs_step(g, &w->pool, &w->sc, &w->sets[d - 1], node->byte, out);
        if (w->sc.status) return w->sc.status;
        w->steps++;
        uint32_t nl = w->nlive[d - 1];
        if (d >= 2 && w->sets[d - 1].popped && gx_cls_has(fol, node->byte)) w->live[nl++] = (uint16_t)(d - 1);
        w->nlive[d] = nl;
        if (node->tok_n) {
            const int32_t *ids = v->trie_tok + node->tok_begin;
            if (out->n || out->popped) {
                for (uint16_t t = 0; t < node->tok_n; t++)
                    if (push_acc(w, ids[t])) return MS_ENOMEM;
            } else {
                for (uint32_t j = 0; j < nl; j++)
                    for (uint16_t t = 0; t < node->tok_n; t++)
                        if (push_unc(w, ids[t], w->live[j])) return MS_ENOMEM;
            }
        }
        if (!out->n && !out->popped && !nl)
            i = node->end;
        else
            i++;
    }
    return 0;
}

static int grow_words(struct grammar *g, size_t *cap, size_t extra)
{
    size_t need;
    if (ms_add_overflow(g->n_words, extra, &need)) return MS_ENOMEM;
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    uint32_t *w = realloc(g->words, c * sizeof *w);
    if (!w) return MS_ENOMEM;
    g->words = w;
    *cap = c;
    return 0;
}

// Stores the walk's results for position p.
static int store_position(struct grammar *g, struct walker *w, int32_t p, size_t *cap_words,
                          size_t *cap_unc, size_t *cap_unc_tok)
{
    const struct grammar_vocab *v = w->v;
    struct gpos *pos = &g->pos[p];
    pos->n_acc = (uint32_t)w->n_acc;
    pos->acc_off = (uint32_t)g->n_words;
    pos->acc_bitmask = w->n_acc > (size_t)v->mask_words;
    size_t words = pos->acc_bitmask ? (size_t)v->mask_words : w->n_acc;
    if (grow_words(g, cap_words, words)) return MS_ENOMEM;
    uint32_t *dst = g->words + g->n_words;
    if (pos->acc_bitmask) {
        memset(dst, 0, words * sizeof *dst);
        for (size_t i = 0; i < w->n_acc; i++) dst[w->acc[i] >> 5] |= 1u << (w->acc[i] & 31);
    } else {
        for (size_t i = 0; i < w->n_acc; i++) dst[i] = (uint32_t)w->acc[i];
    }
    g->n_words += words;
    pos->unc_begin = pos->unc_end = (uint32_t)g->n_unc;
    if (!w->n_unc) return 0;
    struct gtrie_entry *e = malloc(w->n_unc * sizeof *e);
    if (!e) return MS_ENOMEM;
    for (size_t i = 0; i < w->n_unc; i++) {
        int32_t id = w->unc[i].id;
        e[i] = (struct gtrie_entry){v->bytes[id] + w->unc[i].k, v->len[id] - w->unc[i].k, id};
    }
    gtrie_sort(e, w->n_unc);
    int rc = gtrie_build(e, w->n_unc, &g->unc, &g->n_unc, cap_unc, &g->unc_tok, &g->n_unc_tok, cap_unc_tok);
    free(e);
    pos->unc_end = (uint32_t)g->n_unc;
    return rc;
}

// Marks the states reachable from the root's start; numbers the positions.
static int number_positions(struct grammar *g)
{
    uint8_t *seen = calloc((size_t)g->n_states, 1);
    int32_t *stack = malloc((size_t)g->n_states * sizeof *stack);
    if (!seen || !stack) {
        free(seen);
        free(stack);
        return MS_ENOMEM;
    }
    int top = 0;
    stack[top++] = g->rule_start[g->root];
    seen[g->rule_start[g->root]] = 1;
    while (top) {
        int32_t s = stack[--top];
        for (int k = 0; k < g->n_classes; k++) {
            int32_t t = g->trans[(size_t)s * (size_t)g->n_classes + (size_t)k];
            if (t >= 0 && !seen[t]) {
                seen[t] = 1;
                stack[top++] = t;
            }
        }
        for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++) {
            if (g->calls[c].rule < 0) continue;
            int32_t a = g->rule_start[g->calls[c].rule], r = g->calls[c].ret;
            if (!seen[a]) {
                seen[a] = 1;
                stack[top++] = a;
            }
            if (!seen[r]) {
                seen[r] = 1;
                stack[top++] = r;
            }
        }
    }
    g->n_pos = 0;
    for (int s = 0; s < g->n_states; s++)
        if (seen[s] && g->states[s].has_bytes) g->states[s].pos = g->n_pos++;
    free(seen);
    free(stack);
    return 0;
}

static int pick_specials(struct grammar *g, const struct gbuild *b)
{
    const struct grammar_vocab *v = g->vocab;
    for (int i = 0; i < v->n_special; i++) {
        int32_t id = v->special[i];
        for (int l = 0; l < b->n_literals; l++) {
            if (!memmem(b->literals[l], b->literal_lens[l], v->bytes[id], v->len[id])) continue;
            int32_t *s = realloc(g->specials, ((size_t)g->n_specials + 1) * sizeof *s);
            if (!s) return MS_ENOMEM;
            g->specials = s;
            g->specials[g->n_specials++] = id;
            break;
        }
    }
    return 0;
}

static void grammar_free(struct grammar *g)
{
    free(g->rule_start);
    free(g->states);
    free(g->trans);
    free(g->calls);
    free(g->follow);
    free(g->pos);
    free(g->words);
    free(g->unc);
    free(g->unc_tok);
    free(g->specials);
    free(g);
}

struct grammar *grammar_ref(struct grammar *g)
{
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_unref(struct grammar *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_free(g);
}

int grammar_build(struct gbuild *b, int root, const struct grammar_vocab *v, struct grammar **out,
                  char *err, size_t errlen)
{
    *out = NULL;
    if (b->status) return ms_err(err, errlen, b->status, "%s", b->err);
    if (root < 0 || root >= b->n_rules) return ms_err(err, errlen, MS_EINTERNAL, "no root rule");
    double t0 = ms_now();
    struct grammar *g = calloc(1, sizeof *g);
    if (!g) return ms_err(err, errlen, MS_ENOMEM, "out of memory compiling the grammar");
    atomic_init(&g->refs, 1);
    g->vocab = v;
    g->root = root;
    int rc = grammar_automaton(g, b, err, errlen);
    if (rc) goto fail;
    if (number_positions(g) || pick_specials(g, b)) goto nomem;
    g->pos = calloc((size_t)(g->n_pos ? g->n_pos : 1), sizeof *g->pos);
    if (!g->pos) goto nomem;

    int depth = v->max_len + 2;
    struct walker w = {.g = g, .v = v};
    w.sets = calloc((size_t)depth, sizeof *w.sets);
    w.live = malloc((size_t)depth * sizeof *w.live);
    w.nlive = malloc((size_t)depth * sizeof *w.nlive);
    size_t cap_words = 0, cap_unc = 0, cap_unc_tok = 0;
    if (!w.sets || !w.live || !w.nlive) {
        walker_free(&w, depth);
        goto nomem;
    }
    for (int s = 0; s < g->n_states && !rc; s++) {
        if (g->states[s].pos < 0) continue;
        rc = walk_position(&w, s);
        if (!rc) rc = store_position(g, &w, g->states[s].pos, &cap_words, &cap_unc, &cap_unc_tok);
        if (!rc && w.steps > GRAMMAR_MAX_WALK_STEPS)
            rc = MS_ENOFIT;
    }
    walker_free(&w, depth);
    if (rc == MS_ENOFIT) {
        rc = ms_err(err, errlen, MS_ENOFIT,
                    "the grammar is too large to match against the vocabulary (%d positions; "
                    "more than %llu trie steps, or too many nested or ambiguous parses)",
                    g->n_pos, (unsigned long long)GRAMMAR_MAX_WALK_STEPS);
        goto fail;
    }
    if (rc) goto nomem;
    g->bytes = sizeof *g + (size_t)g->n_rules * sizeof *g->rule_start + (size_t)g->n_states * sizeof *g->states +
               (size_t)g->n_states * (size_t)g->n_classes * sizeof *g->trans + g->n_calls * sizeof *g->calls +
               (size_t)g->n_rules * 32 + (size_t)g->n_pos * sizeof *g->pos + g->n_words * sizeof *g->words +
               g->n_unc * sizeof *g->unc + g->n_unc_tok * sizeof *g->unc_tok;
    g->compile_ms = (ms_now() - t0) * 1e3;
    *out = g;
    return 0;
nomem:
    rc = ms_err(err, errlen, MS_ENOMEM, "out of memory compiling the grammar");
fail:
    grammar_free(g);
    return rc;
}

size_t grammar_bytes(const struct grammar *g)
{
    return g->bytes;
}

int grammar_states(const struct grammar *g)
{
    return g->n_states;
}
