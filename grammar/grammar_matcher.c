// grammar_matcher: one sequence's place in a grammar — the live set of
// stacks, the allowed-token mask for the next step (precomputed sets ORed,
// plus the few rule-leaving tokens checked against the stacks), and
// advancing by an accepted token.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"

// Past this many interned frames the pool is rebuilt from the live stacks.
#define MATCHER_POOL_COMPACT 200000

struct grammar_matcher {
    struct grammar *g;
    struct gs_pool pool;
    struct gs_scratch sc;
    struct gs_set cur, a, b;
    struct gs_set *walk; // per depth, for suffix walks
    int walk_depth;
    uint32_t *pos_stamp;
    uint32_t stamp;
    bool terminated;
};

static int matcher_start(struct grammar_matcher *m)
{
    gs_pool_clear(&m->pool);
    m->sc.status = 0;
    m->cur.n = 0;
    m->cur.ended = m->cur.popped = false;
    m->terminated = false;
    gs_closure(m->g, &m->pool, &m->sc, m->g->rule_start[m->g->root], GS_ROOT, &m->cur);
    return m->sc.status;
}

int grammar_matcher_create(struct grammar *g, struct grammar_matcher **out, char *err, size_t errlen)
{
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return ms_err(err, errlen, MS_ENOMEM, "out of memory for a grammar matcher");
    m->g = grammar_ref(g);
    m->walk_depth = g->vocab->max_len + 2;
    m->walk = calloc((size_t)m->walk_depth, sizeof *m->walk);
    m->pos_stamp = calloc((size_t)(g->n_pos ? g->n_pos : 1), sizeof *m->pos_stamp);
    int rc = m->walk && m->pos_stamp ? matcher_start(m) : MS_ENOMEM;
    if (rc) {
        grammar_matcher_destroy(m);
        return ms_err(err, errlen, rc, "cannot start the grammar matcher (%s)", ms_status_name(rc));
    }
    *out = m;
    return 0;
}

void grammar_matcher_destroy(struct grammar_matcher *m)
{
    if (!m) return;
    gs_pool_free(&m->pool);
    gs_scratch_free(&m->sc);
    gs_set_free(&m->cur);
    gs_set_free(&m->a);
    gs_set_free(&m->b);
    if (m->walk)
        for (int d = 0; d < m->walk_depth; d++) gs_set_free(&m->walk[d]);
    free(m->walk);
    free(m->pos_stamp);
    grammar_unref(m->g);
    free(m);
}

int grammar_matcher_reset(struct grammar_matcher *m)
{
    return matcher_start(m);
}

static bool is_eos(const struct grammar_vocab *v, int32_t id)
{
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) return true;
    return false;
}

static void set_bit(uint32_t *mask, int32_t id)
{
    mask[id >> 5] |= 1u << (id & 31);
}

// Sets the bits of the suffix trie [begin, end) that continue from frame
// `node` (the caller of the rule the top is in).
static void walk_suffixes(struct grammar_matcher *m, int32_t node, uint32_t begin, uint32_t end, uint32_t *mask)
{
    const struct grammar *g = m->g;
    gs_set_from_frame(g, &m->pool, &m->sc, node, &m->walk[0]);
    if (!m->walk[0].n) return;
    uint32_t i = begin;
    while (i < end) {
        const struct gtrie *t = &g->unc[i];
        struct gs_set *out = &m->walk[t->depth];
        gs_step(g, &m->pool, &m->sc, &m->walk[t->depth - 1], t->byte, out);
        if (t->tok_n && (out->n || out->ended))
            for (uint16_t k = 0; k < t->tok_n; k++) set_bit(mask, g->unc_tok[t->tok_begin + k]);
        i = out->n ? i + 1 : t->end;
    }
}

// Runs bytes from `from` into the matcher's spare sets; returns the set
// reached (m->a or m->b), or NULL when the bytes die.
static struct gs_set *run_bytes(struct grammar_matcher *m, const struct gs_set *from, const uint8_t *p, size_t n)
{
    const struct gs_set *in = from;
    struct gs_set *out = NULL;
    for (size_t i = 0; i < n; i++) {
        out = in == &m->a ? &m->b : &m->a;
        gs_step(m->g, &m->pool, &m->sc, in, p[i], out);
        if (!out->n && !(out->ended && i + 1 == n)) return NULL;
        in = out;
    }
    return out;
}

int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask)
{
    const struct grammar *g = m->g;
    const struct grammar_vocab *v = g->vocab;
    memset(mask, 0, (size_t)v->mask_words * sizeof *mask);
    if (m->terminated) {
        for (int i = 0; i < v->n_eos; i++) set_bit(mask, v->eos[i]);
        return 0;
    }
    m->sc.status = 0;
    if (++m->stamp == 0) {
        memset(m->pos_stamp, 0, (size_t)(g->n_pos ? g->n_pos : 1) * sizeof *m->pos_stamp);
        m->stamp = 1;
    }
    for (size_t i = 0; i < m->cur.n; i++) {
        struct gs_top top = m->cur.t[i];
        int32_t p = g->states[top.state].pos;
        const struct gpos *pos = &g->pos[p];
        if (m->pos_stamp[p] != m->stamp) {
            m->pos_stamp[p] = m->stamp;
            const uint32_t *w = g->words + pos->acc_off;
            if (pos->acc_bitmask) {
                for (int k = 0; k < v->mask_words; k++) mask[k] |= w[k];
            } else {
                for (uint32_t k = 0; k < pos->n_acc; k++) set_bit(mask, (int32_t)w[k]);
            }
        }
        if (top.parent >= 0 && pos->unc_begin < pos->unc_end)
            walk_suffixes(m, top.parent, pos->unc_begin, pos->unc_end, mask);
    }
    for (int i = 0; i < g->n_specials; i++) {
        int32_t id = g->specials[i];
        if (run_bytes(m, &m->cur, v->bytes[id], v->len[id])) set_bit(mask, id);
    }
    if (m->cur.ended)
        for (int i = 0; i < v->n_eos; i++) set_bit(mask, v->eos[i]);
    return m->sc.status;
}

// Rebuilds the pool with only the frames the live stacks use.
int grammar_matcher_compact(struct grammar_matcher *m)
{
    struct gs_pool old = m->pool;
    memset(&m->pool, 0, sizeof m->pool);
    int32_t *map = malloc(old.n * sizeof *map);
    int32_t *chain = malloc(((size_t)GRAMMAR_MAX_STACK_DEPTH + 1) * sizeof *chain);
    if (!map || !chain) {
        free(map);
        free(chain);
        gs_pool_free(&m->pool);
        m->pool = old;
        return MS_ENOMEM;
    }
    for (size_t i = 0; i < old.n; i++) map[i] = -1;
    for (size_t i = 0; i < m->cur.n; i++) {
        int32_t x = m->cur.t[i].parent;
        int n = 0;
        while (x >= 0 && map[x] < 0 && n <= GRAMMAR_MAX_STACK_DEPTH) {
            chain[n++] = x;
            x = old.nodes[x].parent;
        }
        while (n--) {
            int32_t o = chain[n], par = old.nodes[o].parent;
            int32_t np = par >= 0 ? map[par] : par;
            map[o] = gs_pool_intern(&m->pool, old.nodes[o].state, np);
            if (map[o] < 0) {
                free(map);
                free(chain);
                gs_pool_free(&m->pool);
                m->pool = old;
                return MS_ENOMEM;
            }
        }
        if (m->cur.t[i].parent >= 0) m->cur.t[i].parent = map[m->cur.t[i].parent];
    }
    free(map);
    free(chain);
    gs_pool_free(&old);
    return 0;
}

static int advance(struct grammar_matcher *m, const uint8_t *p, size_t n, char *err, size_t errlen)
{
    m->sc.status = 0;
    struct gs_set *r = run_bytes(m, &m->cur, p, n);
    if (m->sc.status)
        return ms_err(err, errlen, m->sc.status,
                      "the output nests deeper than %d levels or has more than %d parses alive",
                      GRAMMAR_MAX_STACK_DEPTH, GRAMMAR_MAX_TOPS);
    if (!r) return ms_err(err, errlen, MS_EINVAL, "the text does not continue the grammar here");
    struct gs_set t = m->cur;
    m->cur = *r;
    *r = t;
    if (m->pool.n > MATCHER_POOL_COMPACT && grammar_matcher_compact(m))
        return ms_err(err, errlen, MS_ENOMEM, "out of memory in the grammar matcher");
    return 0;
}

// Why a token can never be accepted here whatever the stacks say, or NULL.
static const char *token_barred(const struct grammar_matcher *m, int32_t id)
{
    const struct grammar_vocab *v = m->g->vocab;
    if (m->terminated) return "after the end of the grammar";
    if (id < 0 || id >= v->n_vocab) return "out of range";
    if (is_eos(v, id)) return m->cur.ended ? NULL : "(end of sequence) before the grammar is complete";
    if (id >= v->n_tok || !v->bytes[id]) return "has no text";
    bool special = false, spelled = false;
    for (int i = 0; i < v->n_special; i++) special |= v->special[i] == id;
    for (int i = 0; i < m->g->n_specials; i++) spelled |= m->g->specials[i] == id;
    if (special && !spelled) return "is a special token the grammar does not spell";
    return NULL;
}

bool grammar_matcher_allows(struct grammar_matcher *m, int32_t id)
{
    if (token_barred(m, id)) return false;
    const struct grammar_vocab *v = m->g->vocab;
    if (is_eos(v, id)) return true;
    m->sc.status = 0;
    return run_bytes(m, &m->cur, v->bytes[id], v->len[id]) && !m->sc.status;
}

int grammar_matcher_accept(struct grammar_matcher *m, int32_t id, char *err, size_t errlen)
{
    const struct grammar_vocab *v = m->g->vocab;
    const char *why = token_barred(m, id);
    if (why) return ms_err(err, errlen, MS_EINVAL, "token %d %s", id, why);
    if (is_eos(v, id)) {
        m->terminated = true;
        return 0;
    }
    int rc = advance(m, v->bytes[id], v->len[id], err, errlen);
    if (rc == MS_EINVAL) return ms_err(err, errlen, MS_EINVAL, "token %d is not allowed here", id);
    return rc;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const void *bytes, size_t n, char *err, size_t errlen)
{
    if (m->terminated) return ms_err(err, errlen, MS_EINVAL, "text after the end of the grammar");
    if (n == 0) return 0;
    return advance(m, bytes, n, err, errlen);
}

bool grammar_matcher_can_end(const struct grammar_matcher *m)
{
    return !m->terminated && m->cur.ended;
}

bool grammar_matcher_must_end(const struct grammar_matcher *m)
{
    return !m->terminated && m->cur.ended && m->cur.n == 0;
}

bool grammar_matcher_is_terminated(const struct grammar_matcher *m)
{
    return m->terminated;
}
