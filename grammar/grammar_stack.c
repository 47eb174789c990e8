// grammar_stack: the pushdown machine shared by precomputation and matching.
// A set of stacks is a list of tops (state, parent frame); frames below the
// tops are interned in a pool, so equal stacks share their frames and the
// pool grows with the nesting of the text, not its length.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"

static uint64_t key_of(int32_t state, int32_t parent)
{
    return (uint64_t)(uint32_t)state << 32 | (uint32_t)parent;
}

static size_t hash_key(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

void gs_pool_free(struct gs_pool *p)
{
    free(p->nodes);
    free(p->hash);
    free(p->depth);
    memset(p, 0, sizeof *p);
}

void gs_pool_clear(struct gs_pool *p)
{
    p->n = 0;
    if (p->hash) memset(p->hash, 0, p->hcap * sizeof *p->hash);
}

static int pool_rehash(struct gs_pool *p, size_t cap)
{
    uint32_t *h = calloc(cap, sizeof *h);
    if (!h) return MS_ENOMEM;
    for (size_t i = 0; i < p->n; i++) {
        size_t k = hash_key(key_of(p->nodes[i].state, p->nodes[i].parent)) & (cap - 1);
        while (h[k]) k = (k + 1) & (cap - 1);
        h[k] = (uint32_t)i + 1;
    }
    free(p->hash);
    p->hash = h;
    p->hcap = cap;
    return 0;
}

int32_t gs_pool_intern(struct gs_pool *p, int32_t state, int32_t parent)
{
    if (2 * (p->n + 1) > p->hcap && pool_rehash(p, p->hcap ? 2 * p->hcap : 256)) return -1;
    uint64_t key = key_of(state, parent);
    size_t k = hash_key(key) & (p->hcap - 1);
    while (p->hash[k]) {
        uint32_t i = p->hash[k] - 1;
        if (p->nodes[i].state == state && p->nodes[i].parent == parent) return (int32_t)i;
        k = (k + 1) & (p->hcap - 1);
    }
    int32_t d = parent >= 0 ? p->depth[parent] + 1 : 1;
    if (d > GRAMMAR_MAX_STACK_DEPTH) return -2;
    if (p->n >= INT32_MAX / 2) return -1;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        struct gs_top *nn = realloc(p->nodes, cap * sizeof *nn);
        if (!nn) return -1;
        p->nodes = nn;
        int32_t *nd = realloc(p->depth, cap * sizeof *nd);
        if (!nd) return -1;
        p->depth = nd;
        p->cap = cap;
    }
    p->nodes[p->n] = (struct gs_top){state, parent};
    p->depth[p->n] = d;
    p->hash[k] = (uint32_t)p->n + 1;
    return (int32_t)p->n++;
}

void gs_scratch_free(struct gs_scratch *s)
{
    free(s->seen);
    free(s->seen_gen);
    free(s->work);
    memset(s, 0, sizeof *s);
}

void gs_set_free(struct gs_set *s)
{
    free(s->t);
    memset(s, 0, sizeof *s);
}

static void set_push(struct gs_scratch *sc, struct gs_set *s, int32_t state, int32_t parent)
{
    if (s->n >= GRAMMAR_MAX_TOPS) {
        if (!sc->status) sc->status = MS_ENOFIT;
        return;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        struct gs_top *t = realloc(s->t, cap * sizeof *t);
        if (!t) {
            sc->status = MS_ENOMEM;
            return;
        }
        s->t = t;
        s->cap = cap;
    }
    s->t[s->n++] = (struct gs_top){state, parent};
}

// The visited set of one closure round: open addressing with a generation
// stamp per slot, so starting a round costs nothing.
static void seen_begin(struct gs_scratch *sc)
{
    if (++sc->gen == 0) {
        if (sc->seen_gen) memset(sc->seen_gen, 0, sc->seen_cap * sizeof *sc->seen_gen);
        sc->gen = 1;
    }
}

static bool seen_grow(struct gs_scratch *sc)
{
    size_t cap = sc->seen_cap ? 2 * sc->seen_cap : 64;
    uint64_t *k = malloc(cap * sizeof *k);
    uint32_t *gen = calloc(cap, sizeof *gen);
    if (!k || !gen) {
        free(k);
        free(gen);
        sc->status = MS_ENOMEM;
        return false;
    }
    for (size_t i = 0; i < sc->seen_cap; i++) {
        if (sc->seen_gen[i] != sc->gen) continue;
        size_t j = hash_key(sc->seen[i]) & (cap - 1);
        while (gen[j] == sc->gen) j = (j + 1) & (cap - 1);
        k[j] = sc->seen[i];
        gen[j] = sc->gen;
    }
    free(sc->seen);
    free(sc->seen_gen);
    sc->seen = k;
    sc->seen_gen = gen;
    sc->seen_cap = cap;
    return true;
}

// True when (state, parent) was not yet seen this round (and marks it).
static bool seen_add(struct gs_scratch *sc, size_t *count, int32_t state, int32_t parent)
{
    if (2 * (*count + 1) > sc->seen_cap && !seen_grow(sc)) return false;
    uint64_t key = key_of(state, parent);
    size_t j = hash_key(key) & (sc->seen_cap - 1);
    while (sc->seen_gen[j] == sc->gen) {
        if (sc->seen[j] == key) return false;
        j = (j + 1) & (sc->seen_cap - 1);
    }
    sc->seen[j] = key;
    sc->seen_gen[j] = sc->gen;
    (*count)++;
    return true;
}

static bool work_push(struct gs_scratch *sc, size_t *n, int32_t state, int32_t parent)
{
    if (*n == sc->work_cap) {
        size_t cap = sc->work_cap ? 2 * sc->work_cap : 64;
        struct gs_top *w = realloc(sc->work, cap * sizeof *w);
        if (!w) {
            sc->status = MS_ENOMEM;
            return false;
        }
        sc->work = w;
        sc->work_cap = cap;
    }
    sc->work[(*n)++] = (struct gs_top){state, parent};
    return true;
}

// One closure inside the current round (seen_begin done by the caller).
static void closure_round(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
                          int32_t state, int32_t parent, struct gs_set *out)
{
    size_t nw = 0;
    if (!work_push(sc, &nw, state, parent)) return;
    while (nw) {
        struct gs_top x = sc->work[--nw];
        if (!seen_add(sc, &sc->seen_n, x.state, x.parent)) {
            if (sc->status) return;
            continue;
        }
        const struct gstate *st = &g->states[x.state];
        if (st->has_bytes) set_push(sc, out, x.state, x.parent);
        for (uint32_t c = st->call_begin; c < st->call_end; c++) {
            const struct gcall *cl = &g->calls[c];
            if (cl->rule < 0) continue;
            int32_t f = gs_pool_intern(p, cl->ret, x.parent);
            if (f < 0) {
                if (!sc->status) sc->status = f == -2 ? MS_ENOFIT : MS_ENOMEM;
                continue;
            }
            if (!work_push(sc, &nw, g->rule_start[cl->rule], f)) return;
        }
        if (st->final) {
            if (x.parent == GS_ROOT) {
                out->ended = true;
            } else if (x.parent == GS_BOTTOM) {
                out->popped = true;
            } else {
                const struct gs_top *f = &p->nodes[x.parent];
                if (!work_push(sc, &nw, f->state, f->parent)) return;
            }
        }
    }
}

void gs_closure(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
                int32_t state, int32_t parent, struct gs_set *out)
{
    seen_begin(sc);
    sc->seen_n = 0;
    closure_round(g, p, sc, state, parent, out);
}

void gs_set_from_frame(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
                       int32_t node, struct gs_set *out)
{
    out->n = 0;
    out->ended = out->popped = false;
    gs_closure(g, p, sc, p->nodes[node].state, p->nodes[node].parent, out);
}

void gs_step(const struct grammar *g, struct gs_pool *p, struct gs_scratch *sc,
             const struct gs_set *in, uint8_t c, struct gs_set *out)
{
    out->n = 0;
    out->ended = out->popped = false;
    int k = g->cls[c];
    // The common case: one stack, and the byte leads to a plain state
    // (no calls, no return): no closure, no visited set.
    if (in->n == 1) {
        int32_t t = g->trans[(size_t)in->t[0].state * (size_t)g->n_classes + (size_t)k];
        if (t < 0) return;
        const struct gstate *st = &g->states[t];
        if (st->call_begin == st->call_end && !st->final) {
            set_push(sc, out, t, in->t[0].parent);
            return;
        }
    }
    seen_begin(sc);
    sc->seen_n = 0;
    for (size_t i = 0; i < in->n; i++) {
        int32_t t = g->trans[(size_t)in->t[i].state * (size_t)g->n_classes + (size_t)k];
        if (t >= 0) closure_round(g, p, sc, t, in->t[i].parent, out);
    }
}
