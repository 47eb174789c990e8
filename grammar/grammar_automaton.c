// grammar_automaton: expressions to automata. Each rule's expression becomes
// an NFA (Thompson), then a DFA by subset construction over byte classes and
// calls; then the checks that keep matching finite and free of dead ends:
// every rule defined, unproductive parts trimmed, left recursion refused,
// and the bytes that may follow each rule (for pruning at precompute time).
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"

// ---- NFA ----
#define LBL_EPS (-1)
#define LBL_CALL_BASE (-2) // label -2 - rule

struct nfa_edge {
    int32_t to, label, next;
};

struct nfa {
    int32_t *first;      // per state, first edge or -1
    size_t n, cap;
    struct nfa_edge *e;
    size_t ne, cape;
    uint8_t (*sets)[32]; // distinct byte classes used by edges
    size_t nsets, capsets;
    int status;
    char *err;
    size_t errlen;
};

static int32_t nfa_state(struct nfa *a)
{
    if (a->status) return -1;
    if (a->n >= GRAMMAR_MAX_NFA_STATES) {
        a->status = ms_err(a->err, a->errlen, MS_ENOFIT,
                           "the grammar needs more than %d automaton states (before "
                           "determinization); repetition bounds or nesting are too large",
                           GRAMMAR_MAX_NFA_STATES);
        return -1;
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 1024;
        int32_t *f = realloc(a->first, cap * sizeof *f);
        if (!f) {
            a->status = ms_err(a->err, a->errlen, MS_ENOMEM, "out of memory building the automaton");
            return -1;
        }
        a->first = f;
        a->cap = cap;
    }
    a->first[a->n] = -1;
    return (int32_t)a->n++;
}

static void nfa_edge(struct nfa *a, int32_t from, int32_t to, int32_t label)
{
    if (a->status || from < 0 || to < 0) return;
    if (a->ne == a->cape) {
        size_t cap = a->cape ? 2 * a->cape : 2048;
        struct nfa_edge *e = realloc(a->e, cap * sizeof *e);
        if (!e) {
            a->status = ms_err(a->err, a->errlen, MS_ENOMEM, "out of memory building the automaton");
            return;
        }
        a->e = e;
        a->cape = cap;
    }
    a->e[a->ne] = (struct nfa_edge){to, label, a->first[from]};
    a->first[from] = (int32_t)a->ne++;
}

static int32_t nfa_set(struct nfa *a, const uint8_t cls[32])
{
    // Expressions repeat the same few classes; a linear scan of the distinct
    // ones stays short (and is bounded by the expression count anyway).
    for (size_t i = a->nsets; i-- > 0;)
        if (memcmp(a->sets[i], cls, 32) == 0) return (int32_t)i;
    if (a->nsets == a->capsets) {
        size_t cap = a->capsets ? 2 * a->capsets : 64;
        uint8_t(*s)[32] = realloc(a->sets, cap * sizeof *s);
        if (!s) {
            a->status = ms_err(a->err, a->errlen, MS_ENOMEM, "out of memory building the automaton");
            return -1;
        }
        a->sets = s;
        a->capsets = cap;
    }
    memcpy(a->sets[a->nsets], cls, 32);
    return (int32_t)a->nsets++;
}

// Adds x after state `from`; returns the state where x ends.
static int32_t nfa_expr(struct nfa *a, const struct gbuild *b, const struct gx *x, int32_t from, int depth)
{
    if (a->status || from < 0) return -1;
    if (depth > 2000) {
        a->status = ms_err(a->err, a->errlen, MS_ENOFIT, "the grammar's expressions nest too deeply");
        return -1;
    }
    switch (x->kind) {
    case GX_EMPTY:
        return from;
    case GX_CLASS: {
        int32_t to = nfa_state(a);
        int32_t set = nfa_set(a, x->cls);
        if (set >= 0) nfa_edge(a, from, to, set);
        return to;
    }
    case GX_SEQ:
        for (uint32_t i = 0; i < x->n_kids && from >= 0; i++) from = nfa_expr(a, b, x->kids[i], from, depth + 1);
        return from;
    case GX_ALT: {
        int32_t end = nfa_state(a);
        for (uint32_t i = 0; i < x->n_kids; i++) {
            int32_t s = nfa_state(a);
            nfa_edge(a, from, s, LBL_EPS);
            nfa_edge(a, nfa_expr(a, b, x->kids[i], s, depth + 1), end, LBL_EPS);
        }
        return end;
    }
    case GX_REPEAT: {
        for (uint32_t i = 0; i < x->min && from >= 0; i++) {
            int32_t s = nfa_state(a);
            nfa_edge(a, from, s, LBL_EPS);
            from = nfa_expr(a, b, x->kids[0], s, depth + 1);
        }
        if (x->max == GX_INF) {
            int32_t loop = nfa_state(a);
            nfa_edge(a, from, loop, LBL_EPS);
            int32_t s = nfa_state(a);
            nfa_edge(a, loop, s, LBL_EPS);
            nfa_edge(a, nfa_expr(a, b, x->kids[0], s, depth + 1), loop, LBL_EPS);
            return loop;
        }
        int32_t end = nfa_state(a);
        for (uint32_t i = x->min; i < x->max && from >= 0; i++) {
            nfa_edge(a, from, end, LBL_EPS);
            int32_t s = nfa_state(a);
            nfa_edge(a, from, s, LBL_EPS);
            from = nfa_expr(a, b, x->kids[0], s, depth + 1);
        }
        nfa_edge(a, from, end, LBL_EPS);
        return end;
    }
    case GX_PROPS: {
        // F: nothing written yet; A: a member written (the next needs the separator).
        uint32_t n = x->min;
        struct gx *sep = x->kids[n], *extra = x->kids[n + 1];
        int32_t f = from, a_prev = -1, end = nfa_state(a);
        for (uint32_t j = 0; j < n; j++) {
            int32_t f_next = nfa_state(a), a_next = nfa_state(a);
            nfa_edge(a, nfa_expr(a, b, x->kids[j], f, depth + 1), a_next, LBL_EPS);
            if (a_prev >= 0) {
                int32_t s = nfa_expr(a, b, sep, a_prev, depth + 1);
                nfa_edge(a, nfa_expr(a, b, x->kids[j], s, depth + 1), a_next, LBL_EPS);
            }
            if (x->opt[j]) {
                nfa_edge(a, f, f_next, LBL_EPS);
                if (a_prev >= 0) nfa_edge(a, a_prev, a_next, LBL_EPS);
            }
            f = f_next;
            a_prev = a_next;
        }
        nfa_edge(a, f, end, LBL_EPS);
        if (a_prev >= 0) nfa_edge(a, a_prev, end, LBL_EPS);
        if (extra) {
            int32_t loop = nfa_state(a);
            nfa_edge(a, nfa_expr(a, b, extra, f, depth + 1), loop, LBL_EPS);
            if (a_prev >= 0)
                nfa_edge(a, nfa_expr(a, b, extra, nfa_expr(a, b, sep, a_prev, depth + 1), depth + 1), loop, LBL_EPS);
            nfa_edge(a, nfa_expr(a, b, extra, nfa_expr(a, b, sep, loop, depth + 1), depth + 1), loop, LBL_EPS);
            nfa_edge(a, loop, end, LBL_EPS);
        }
        return end;
    }
    case GX_CALL: {
        if (x->rule < 0 || x->rule >= b->n_rules || !b->rules[x->rule].body) {
            a->status = ms_err(a->err, a->errlen, MS_EINVAL, "rule '%s' is used but not defined",
                               x->rule >= 0 && x->rule < b->n_rules ? b->rules[x->rule].name : "?");
            return -1;
        }
        int32_t to = nfa_state(a);
        nfa_edge(a, from, to, LBL_CALL_BASE - x->rule);
        return to;
    }
    }
    a->status = ms_err(a->err, a->errlen, MS_EINTERNAL, "unknown expression kind %d", x->kind);
    return -1;
}

static void nfa_free(struct nfa *a)
{
    free(a->first);
    free(a->e);
    free(a->sets);
}

// ---- growable int arrays ----
struct ivec {
    int32_t *p;
    size_t n, cap;
};

static int ivec_push(struct ivec *v, int32_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return MS_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

// ---- subset construction ----
// DFA states are sets of NFA states, stored in `sets` (offset, length) and
// found again through an open-addressing hash of their contents.
struct dfa_build {
    struct ivec members;   // concatenated sorted NFA-state sets
    struct ivec off, len;  // per DFA state
    struct ivec rule;      // per DFA state
    uint32_t *hash;        // DFA id + 1
    size_t hcap;
    // outputs
    struct ivec trans;     // n * ncls
    struct ivec call_rule, call_ret, call_begin, call_end;
    struct ivec final;
};

static uint64_t hash_ints(const int32_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int dfa_rehash(struct dfa_build *d)
{
    size_t cap = d->hcap ? 2 * d->hcap : 4096;
    uint32_t *h = calloc(cap, sizeof *h);
    if (!h) return MS_ENOMEM;
    for (size_t i = 0; i < d->off.n; i++) {
        size_t k = hash_ints(d->members.p + d->off.p[i], (size_t)d->len.p[i]) & (cap - 1);
        while (h[k]) k = (k + 1) & (cap - 1);
        h[k] = (uint32_t)i + 1;
    }
    free(d->hash);
    d->hash = h;
    d->hcap = cap;
    return 0;
}

// Returns the DFA id for the sorted set (adding it), or a negative status.
static int32_t dfa_intern(struct dfa_build *d, const int32_t *set, size_t n, int32_t rule, int *is_new)
{
    *is_new = 0;
    if (2 * (d->off.n + 1) > d->hcap && dfa_rehash(d)) return MS_ENOMEM;
    size_t k = hash_ints(set, n) & (d->hcap - 1);
    while (d->hash[k]) {
        int32_t id = (int32_t)d->hash[k] - 1;
        if ((size_t)d->len.p[id] == n && d->rule.p[id] == rule &&
            memcmp(d->members.p + d->off.p[id], set, n * sizeof *set) == 0)
            return id;
        k = (k + 1) & (d->hcap - 1);
    }
    if (d->off.n >= GRAMMAR_MAX_DFA_STATES) return MS_ENOFIT;
    int32_t id = (int32_t)d->off.n;
    if (ivec_push(&d->off, (int32_t)d->members.n) || ivec_push(&d->len, (int32_t)n) ||
        ivec_push(&d->rule, rule))
        return MS_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (ivec_push(&d->members, set[i])) return MS_ENOMEM;
    d->hash[k] = (uint32_t)id + 1;
    *is_new = 1;
    return id;
}

static void dfa_build_free(struct dfa_build *d)
{
    struct ivec *v[] = {&d->members, &d->off, &d->len, &d->rule, &d->trans, &d->call_rule,
                        &d->call_ret, &d->call_begin, &d->call_end, &d->final};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) free(v[i]->p);
    free(d->hash);
}

// Epsilon closure of set (in place, sorted, deduplicated). mark is a
// per-NFA-state stamp array; stamp a fresh value per call.
static int eps_close(const struct nfa *a, struct ivec *set, uint32_t *mark, uint32_t stamp)
{
    for (size_t i = 0; i < set->n; i++) mark[set->p[i]] = stamp;
    for (size_t i = 0; i < set->n; i++) {
        for (int32_t e = a->first[set->p[i]]; e >= 0; e = a->e[e].next) {
            if (a->e[e].label != LBL_EPS || mark[a->e[e].to] == stamp) continue;
            mark[a->e[e].to] = stamp;
            if (ivec_push(set, a->e[e].to)) return MS_ENOMEM;
        }
    }
    qsort(set->p, set->n, sizeof *set->p, cmp_i32);
    return 0;
}

struct automaton_in {
    const struct gbuild *b;
    struct nfa nfa;
    int32_t *nfa_start, *nfa_final; // per rule
};

// The whole of grammar_build's first half: NFA, byte classes, DFA. Long
// because subset construction keeps several parallel arrays in step; the
// pieces are not useful apart.
static int automaton_make(struct grammar *g, struct gbuild *b, char *err, size_t errlen)
{
    struct automaton_in in = {.b = b};
    struct nfa *a = &in.nfa;
    a->err = err;
    a->errlen = errlen;
    struct dfa_build d = {0};
    struct ivec work = {0}, tmp = {0};
    uint32_t *mark = NULL;
    int rc = 0;
    // NFA edges followed and closure members made: the cost of the subset
    // construction, which the state limit alone bounds only loosely (a few
    // thousand states over large NFA sets can take seconds).
    unsigned long long steps = 0;

    in.nfa_start = malloc((size_t)b->n_rules * sizeof *in.nfa_start);
    in.nfa_final = malloc((size_t)b->n_rules * sizeof *in.nfa_final);
    if (!in.nfa_start || !in.nfa_final) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory building the automaton");
        goto out;
    }
    for (int r = 0; r < b->n_rules; r++) {
        in.nfa_start[r] = in.nfa_final[r] = -1;
        if (!b->rules[r].body) continue;
        in.nfa_start[r] = nfa_state(a);
        in.nfa_final[r] = nfa_expr(a, b, b->rules[r].body, in.nfa_start[r], 0);
        if (a->status) {
            rc = a->status;
            goto out;
        }
    }

    // Byte classes: the coarsest partition of 0..255 that every edge's set respects.
    uint8_t id[256] = {0};
    int ncls = 1;
    for (size_t s = 0; s < a->nsets; s++) {
        int16_t remap[256][2];
        memset(remap, -1, sizeof remap);
        int next = 0;
        uint8_t nid[256];
        for (int c = 0; c < 256; c++) {
            int in_set = gx_cls_has(a->sets[s], (unsigned)c);
            if (remap[id[c]][in_set] < 0) remap[id[c]][in_set] = (int16_t)next++;
            nid[c] = (uint8_t)remap[id[c]][in_set];
        }
        memcpy(id, nid, sizeof id);
        ncls = next;
    }
    memcpy(g->cls, id, sizeof id);
    g->n_classes = ncls;
    uint8_t rep[256]; // a byte of each class
    for (int c = 255; c >= 0; c--) rep[id[c]] = (uint8_t)c;

    mark = calloc(a->n ? a->n : 1, sizeof *mark);
    if (!mark) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory building the automaton");
        goto out;
    }
    uint32_t stamp = 0;
    g->n_rules = b->n_rules;
    g->rule_start = malloc((size_t)b->n_rules * sizeof *g->rule_start);
    if (!g->rule_start) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory building the automaton");
        goto out;
    }
    for (int r = 0; r < b->n_rules; r++) {
        g->rule_start[r] = -1;
        if (in.nfa_start[r] < 0) continue;
        tmp.n = 0;
        if (ivec_push(&tmp, in.nfa_start[r]) || eps_close(a, &tmp, mark, ++stamp)) goto nomem;
        int is_new;
        int32_t sid = dfa_intern(&d, tmp.p, tmp.n, r, &is_new);
        if (sid < 0) goto dfa_fail;
        g->rule_start[r] = sid;
        work.n = 0;
        if (ivec_push(&work, sid)) goto nomem;
        while (work.n) {
            int32_t ds = work.p[--work.n];
            // Trans rows and call lists are written in id order, so states
            // made here are finished in the order they were made: grow the
            // rows to cover ds and fill them.
            while (d.trans.n < (size_t)(ds + 1) * (size_t)ncls)
                if (ivec_push(&d.trans, -1)) goto nomem;
            while (d.final.n < (size_t)ds + 1) {
                if (ivec_push(&d.final, 0) || ivec_push(&d.call_begin, 0) || ivec_push(&d.call_end, 0))
                    goto nomem;
            }
            int32_t off = d.off.p[ds], len = d.len.p[ds];
            int fin = 0;
            for (int32_t i = 0; i < len; i++)
                if (d.members.p[off + i] == in.nfa_final[r]) fin = 1;
            d.final.p[ds] = fin;
            // byte classes
            for (int k = 0; k < ncls; k++) {
                tmp.n = 0;
                ++stamp;
                for (int32_t i = 0; i < d.len.p[ds]; i++) {
                    int32_t ns = d.members.p[d.off.p[ds] + i];
                    for (int32_t e = a->first[ns]; e >= 0; e = a->e[e].next) {
                        int32_t l = a->e[e].label;
                        steps++;
                        if (l < 0 || !gx_cls_has(a->sets[l], rep[k]) || mark[a->e[e].to] == stamp) continue;
                        mark[a->e[e].to] = stamp;
                        if (ivec_push(&tmp, a->e[e].to)) goto nomem;
                    }
                }
                if (steps > GRAMMAR_MAX_SUBSET_STEPS) goto work_fail;
                if (!tmp.n) continue;
                if (eps_close(a, &tmp, mark, ++stamp)) goto nomem;
                steps += tmp.n;
                int32_t t = dfa_intern(&d, tmp.p, tmp.n, r, &is_new);
                if (t < 0) goto dfa_fail;
                d.trans.p[(size_t)ds * (size_t)ncls + (size_t)k] = t;
                if (is_new && ivec_push(&work, t)) goto nomem;
            }
            // calls: one edge per distinct callee
            d.call_begin.p[ds] = (int32_t)d.call_rule.n;
            struct ivec callees = {0};
            for (int32_t i = 0; i < d.len.p[ds]; i++) {
                int32_t ns = d.members.p[d.off.p[ds] + i];
                for (int32_t e = a->first[ns]; e >= 0; e = a->e[e].next) {
                    int32_t l = a->e[e].label;
                    if (l > LBL_CALL_BASE) continue;
                    int32_t callee = LBL_CALL_BASE - l;
                    int seen = 0;
                    for (size_t j = 0; j < callees.n; j++) seen |= callees.p[j] == callee;
                    if (!seen && ivec_push(&callees, callee)) {
                        free(callees.p);
                        goto nomem;
                    }
                }
            }
            // Callees of this state are gathered first because the call
            // list must be contiguous while new states may be made below.
            struct ivec rets = {0};
            for (size_t j = 0; j < callees.n; j++) {
                tmp.n = 0;
                ++stamp;
                for (int32_t i = 0; i < d.len.p[ds]; i++) {
                    int32_t ns = d.members.p[d.off.p[ds] + i];
                    for (int32_t e = a->first[ns]; e >= 0; e = a->e[e].next) {
                        if (a->e[e].label != LBL_CALL_BASE - callees.p[j] || mark[a->e[e].to] == stamp) continue;
                        mark[a->e[e].to] = stamp;
                        if (ivec_push(&tmp, a->e[e].to)) goto nomem_calls;
                    }
                }
                if (eps_close(a, &tmp, mark, ++stamp)) goto nomem_calls;
                int32_t t = dfa_intern(&d, tmp.p, tmp.n, r, &is_new);
                if (t < 0) {
                    free(callees.p);
                    free(rets.p);
                    goto dfa_fail;
                }
                if (ivec_push(&rets, t)) goto nomem_calls;
                if (is_new && ivec_push(&work, t)) goto nomem_calls;
            }
            for (size_t j = 0; j < callees.n; j++) {
                if (ivec_push(&d.call_rule, callees.p[j]) || ivec_push(&d.call_ret, rets.p[j]))
                    goto nomem_calls;
            }
            d.call_end.p[ds] = (int32_t)d.call_rule.n;
            free(callees.p);
            free(rets.p);
            continue;
        nomem_calls:
            free(callees.p);
            free(rets.p);
            goto nomem;
        }
    }
    // States made last may not have rows yet (none: every state is pushed
    // and processed), but keep the arrays in step with the count.
    size_t n = d.off.n;
    g->n_states = (int)n;
    g->states = calloc(n ? n : 1, sizeof *g->states);
    g->calls = malloc((d.call_rule.n ? d.call_rule.n : 1) * sizeof *g->calls);
    if (!g->states || !g->calls) goto nomem;
    g->trans = d.trans.p;
    d.trans.p = NULL;
    g->n_calls = d.call_rule.n;
    for (size_t i = 0; i < d.call_rule.n; i++) g->calls[i] = (struct gcall){d.call_rule.p[i], d.call_ret.p[i]};
    for (size_t s = 0; s < n; s++) {
        g->states[s].rule = d.rule.p[s];
        g->states[s].final = (uint8_t)d.final.p[s];
        g->states[s].call_begin = (uint32_t)d.call_begin.p[s];
        g->states[s].call_end = (uint32_t)d.call_end.p[s];
        g->states[s].pos = -1;
    }
    goto out;

work_fail:
    rc = ms_err(err, errlen, MS_ENOFIT,
                "the grammar is too costly to turn into an automaton (more than %llu steps); a "
                "regular expression with many overlapping repetitions (such as '.*' beside '.{n}') "
                "or a very large repetition is the usual cause",
                (unsigned long long)GRAMMAR_MAX_SUBSET_STEPS);
    goto out;
dfa_fail:
    rc = ms_err(err, errlen, MS_ENOFIT,
                "the grammar needs more than %d automaton states; a regular expression or "
                "repetition is too large",
                GRAMMAR_MAX_DFA_STATES);
    goto out;
nomem:
    rc = ms_err(err, errlen, MS_ENOMEM, "out of memory building the automaton");
out:
    nfa_free(a);
    free(in.nfa_start);
    free(in.nfa_final);
    dfa_build_free(&d);
    free(work.p);
    free(tmp.p);
    free(mark);
    return rc;
}

// ---- checks ----

static int32_t *tr(const struct grammar *g, int32_t s)
{
    return g->trans + (size_t)s * (size_t)g->n_classes;
}

// Productive rules and states that can reach a return, by a backward work
// list; then edges into dead states and calls of unproductive rules go.
static int automaton_trim(struct grammar *g, const struct gbuild *b, char *err, size_t errlen)
{
    int n = g->n_states, ncls = g->n_classes, rc = 0;
    uint8_t *co = calloc((size_t)n, 1), *prod = calloc((size_t)g->n_rules, 1);
    // reverse adjacency: byte preds, call preds by ret, call sites by callee
    int32_t *bp_off = calloc((size_t)n + 1, sizeof *bp_off), *cp_off = calloc((size_t)n + 1, sizeof *cp_off);
    int32_t *cs_off = calloc((size_t)g->n_rules + 1, sizeof *cs_off);
    int32_t *bp = NULL, *cp = NULL, *cs = NULL;
    struct ivec work = {0};
    if (!co || !prod || !bp_off || !cp_off || !cs_off) goto nomem;
    size_t nb = 0;
    for (int s = 0; s < n; s++)
        for (int k = 0; k < ncls; k++) {
            int32_t t = tr(g, s)[k];
            if (t >= 0) {
                bp_off[t + 1]++;
                nb++;
            }
        }
    for (size_t c = 0; c < g->n_calls; c++) {
        cp_off[g->calls[c].ret + 1]++;
        cs_off[g->calls[c].rule + 1]++;
    }
    for (int s = 0; s < n; s++) {
        bp_off[s + 1] += bp_off[s];
        cp_off[s + 1] += cp_off[s];
    }
    for (int r = 0; r < g->n_rules; r++) cs_off[r + 1] += cs_off[r];
    bp = malloc((nb ? nb : 1) * sizeof *bp);
    cp = malloc((g->n_calls ? g->n_calls : 1) * sizeof *cp);
    cs = malloc((g->n_calls ? g->n_calls : 1) * sizeof *cs);
    int32_t *fill_b = calloc((size_t)n, sizeof *fill_b), *fill_c = calloc((size_t)n, sizeof *fill_c);
    int32_t *fill_s = calloc((size_t)g->n_rules, sizeof *fill_s);
    int32_t *call_src = malloc((g->n_calls ? g->n_calls : 1) * sizeof *call_src);
    if (!bp || !cp || !cs || !fill_b || !fill_c || !fill_s || !call_src) {
        free(fill_b);
        free(fill_c);
        free(fill_s);
        free(call_src);
        goto nomem;
    }
    for (int s = 0; s < n; s++) {
        for (int k = 0; k < ncls; k++) {
            int32_t t = tr(g, s)[k];
            if (t >= 0) bp[bp_off[t] + fill_b[t]++] = s;
        }
        for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++) {
            call_src[c] = s;
            int32_t t = g->calls[c].ret, r = g->calls[c].rule;
            cp[cp_off[t] + fill_c[t]++] = (int32_t)c;
            cs[cs_off[r] + fill_s[r]++] = (int32_t)c;
        }
    }
    free(fill_b);
    free(fill_c);
    free(fill_s);
    for (int s = 0; s < n; s++)
        if (g->states[s].final) {
            co[s] = 1;
            if (ivec_push(&work, s)) {
                free(call_src);
                goto nomem;
            }
        }
    while (work.n) {
        int32_t x = work.p[--work.n];
#define MARK(s_)                                                  \
    do {                                                          \
        int32_t m_ = (s_);                                        \
        if (!co[m_]) {                                            \
            co[m_] = 1;                                           \
            if (ivec_push(&work, m_)) {                           \
                free(call_src);                                   \
                goto nomem;                                       \
            }                                                     \
        }                                                         \
    } while (0)
        for (int32_t i = bp_off[x]; i < bp_off[x + 1]; i++) MARK(bp[i]);
        for (int32_t i = cp_off[x]; i < cp_off[x + 1]; i++) {
            int32_t c = cp[i];
            if (prod[g->calls[c].rule]) MARK(call_src[c]);
        }
        int32_t r = g->states[x].rule;
        if (g->rule_start[r] == x && !prod[r]) {
            prod[r] = 1;
            for (int32_t i = cs_off[r]; i < cs_off[r + 1]; i++) {
                int32_t c = cs[i];
                if (co[g->calls[c].ret]) MARK(call_src[c]);
            }
        }
#undef MARK
    }
    free(call_src);
    if (!prod[g->root]) {
        rc = ms_err(err, errlen, MS_EINVAL,
                    "the grammar matches no text (rule '%s' can never finish: unbounded "
                    "recursion or an empty choice)",
                    b->rules[g->root].name);
        goto out;
    }
    for (int s = 0; s < n; s++) {
        for (int k = 0; k < ncls; k++)
            if (tr(g, s)[k] >= 0 && !co[tr(g, s)[k]]) tr(g, s)[k] = -1;
        // calls stay in place; a dead one is marked with rule -1
        for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++)
            if (!prod[g->calls[c].rule] || !co[g->calls[c].ret]) g->calls[c].rule = -1;
    }
    for (int s = 0; s < n; s++) {
        uint8_t hb = 0;
        for (int k = 0; k < ncls; k++) hb |= tr(g, s)[k] >= 0;
        g->states[s].has_bytes = hb;
    }
    goto out;
nomem:
    rc = ms_err(err, errlen, MS_ENOMEM, "out of memory checking the grammar");
out:
    free(co);
    free(prod);
    free(bp_off);
    free(cp_off);
    free(cs_off);
    free(bp);
    free(cp);
    free(cs);
    free(work.p);
    return rc;
}

// Merges equivalent states (Moore's partition refinement): subset
// construction leaves copies, such as one string-body state per kind of
// character just read, and every copy would cost a walk of the vocabulary.
// States of different rules are never merged (returns differ).
static int call_pair_cmp(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

static int automaton_minimize(struct grammar *g)
{
    int n = g->n_states, ncls = g->n_classes, rc = MS_ENOMEM;
    size_t max_calls = 0;
    for (int s = 0; s < n; s++) {
        size_t c = g->states[s].call_end - g->states[s].call_begin;
        if (c > max_calls) max_calls = c;
    }
    size_t width = 3 + (size_t)ncls + 2 * max_calls + 1;
    int32_t *blk = calloc((size_t)n, sizeof *blk), *nblk = malloc((size_t)n * sizeof *nblk);
    int32_t *sig = malloc((size_t)n * width * sizeof *sig);
    size_t hcap = 16;
    while (hcap < 2 * (size_t)n) hcap *= 2;
    int32_t *hash = malloc(hcap * sizeof *hash);
    int32_t *rep = malloc((size_t)n * sizeof *rep);
    if (!blk || !nblk || !sig || !hash || !rep) goto out;
    int nb = 1;
    uint64_t work = 0;
    for (;;) {
        // Each round refines by one more byte of lookahead, so a long chain
        // (a regex's {9000}) takes as many rounds as it has states: past the
        // budget the automaton stays as determinized, which is correct, only
        // larger (the partition is a congruence only at its fixed point).
        work += (uint64_t)n * width;
        if (work > GRAMMAR_MAX_MINIMIZE_WORK) {
            rc = 0;
            goto out;
        }
        for (size_t i = 0; i < hcap; i++) hash[i] = -1;
        int count = 0;
        for (int s = 0; s < n; s++) {
            int32_t *q = sig + (size_t)s * width;
            size_t k = 0;
            q[k++] = blk[s];
            q[k++] = g->states[s].rule;
            q[k++] = g->states[s].final;
            for (int c = 0; c < ncls; c++) {
                int32_t t = g->trans[(size_t)s * (size_t)ncls + (size_t)c];
                q[k++] = t < 0 ? -1 : blk[t];
            }
            size_t pairs = k;
            for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++) {
                if (g->calls[c].rule < 0) continue;
                q[k++] = g->calls[c].rule;
                q[k++] = blk[g->calls[c].ret];
            }
            qsort(q + pairs, (k - pairs) / 2, 2 * sizeof *q, call_pair_cmp);
            while (k < width) q[k++] = -2;
            uint64_t h = 1469598103934665603ull;
            for (size_t i = 0; i < width; i++) h = (h ^ (uint32_t)q[i]) * 1099511628211ull;
            size_t slot = (size_t)(h ^ (h >> 31)) & (hcap - 1);
            for (;;) {
                int32_t o = hash[slot];
                if (o < 0) {
                    hash[slot] = s;
                    nblk[s] = count;
                    rep[count++] = s;
                    break;
                }
                if (memcmp(sig + (size_t)o * width, q, width * sizeof *q) == 0) {
                    nblk[s] = nblk[o];
                    break;
                }
                slot = (slot + 1) & (hcap - 1);
            }
        }
        memcpy(blk, nblk, (size_t)n * sizeof *blk);
        if (count == nb) break;
        nb = count;
    }
    if (nb < n) {
        int32_t *trans = malloc((size_t)nb * (size_t)ncls * sizeof *trans);
        struct gstate *states = calloc((size_t)nb, sizeof *states);
        struct gcall *calls = malloc((g->n_calls ? g->n_calls : 1) * sizeof *calls);
        if (!trans || !states || !calls) {
            free(trans);
            free(states);
            free(calls);
            goto out;
        }
        size_t nc = 0;
        for (int b = 0; b < nb; b++) {
            int s = rep[b];
            states[b] = g->states[s];
            states[b].pos = -1;
            for (int c = 0; c < ncls; c++) {
                int32_t t = g->trans[(size_t)s * (size_t)ncls + (size_t)c];
                trans[(size_t)b * (size_t)ncls + (size_t)c] = t < 0 ? -1 : blk[t];
            }
            states[b].call_begin = (uint32_t)nc;
            for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++)
                if (g->calls[c].rule >= 0) calls[nc++] = (struct gcall){g->calls[c].rule, blk[g->calls[c].ret]};
            states[b].call_end = (uint32_t)nc;
        }
        for (int r = 0; r < g->n_rules; r++)
            if (g->rule_start[r] >= 0) g->rule_start[r] = blk[g->rule_start[r]];
        free(g->trans);
        free(g->states);
        free(g->calls);
        g->trans = trans;
        g->states = states;
        g->calls = calls;
        g->n_calls = nc;
        g->n_states = nb;
    }
    rc = 0;
out:
    free(blk);
    free(nblk);
    free(sig);
    free(hash);
    free(rep);
    return rc;
}

// Nullable rules, then refusal of left recursion: a rule that can reach a
// call of itself without reading a byte would make closures endless.
static int automaton_left_recursion(struct grammar *g, const struct gbuild *b, uint8_t *nullable,
                                    char *err, size_t errlen)
{
    int n = g->n_states, nr = g->n_rules, rc = 0;
    // nullable: sweeps until stable (each sweep checks every rule from its start)
    uint8_t *seen = calloc((size_t)n, 1);
    int32_t *stack = malloc((size_t)(n ? n : 1) * sizeof *stack);
    struct ivec *left = calloc((size_t)nr, sizeof *left);
    if (!seen || !stack || !left) goto nomem;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < nr; r++) {
            if (nullable[r] || g->rule_start[r] < 0) continue;
            memset(seen, 0, (size_t)n);
            int top = 0;
            stack[top++] = g->rule_start[r];
            seen[g->rule_start[r]] = 1;
            while (top && !nullable[r]) {
                int32_t s = stack[--top];
                if (g->states[s].final) {
                    nullable[r] = 1;
                    changed = 1;
                    break;
                }
                for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++) {
                    int32_t cr = g->calls[c].rule, t = g->calls[c].ret;
                    if (cr >= 0 && nullable[cr] && !seen[t]) {
                        seen[t] = 1;
                        stack[top++] = t;
                    }
                }
            }
        }
    }
    // left-call edges
    for (int r = 0; r < nr; r++) {
        if (g->rule_start[r] < 0) continue;
        memset(seen, 0, (size_t)n);
        int top = 0;
        stack[top++] = g->rule_start[r];
        seen[g->rule_start[r]] = 1;
        while (top) {
            int32_t s = stack[--top];
            for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++) {
                int32_t cr = g->calls[c].rule, t = g->calls[c].ret;
                if (cr < 0) continue;
                if (ivec_push(&left[r], cr)) goto nomem;
                if (nullable[cr] && !seen[t]) {
                    seen[t] = 1;
                    stack[top++] = t;
                }
            }
        }
    }
    // cycle search: iterative DFS with colours (0 white, 1 grey, 2 black)
    uint8_t *colour = calloc((size_t)nr, 1);
    int32_t *it = calloc((size_t)nr, sizeof *it), *path = malloc((size_t)nr * sizeof *path);
    if (!colour || !it || !path) {
        free(colour);
        free(it);
        free(path);
        goto nomem;
    }
    for (int r0 = 0; r0 < nr && !rc; r0++) {
        if (colour[r0]) continue;
        int top = 0;
        path[top++] = r0;
        colour[r0] = 1;
        while (top && !rc) {
            int32_t r = path[top - 1];
            if ((size_t)it[r] < left[r].n) {
                int32_t nx = left[r].p[it[r]++];
                if (colour[nx] == 1) {
                    rc = ms_err(err, errlen, MS_EUNSUPPORTED,
                                "rule '%s' is left-recursive (it can reach itself before reading "
                                "any text); rewrite it with repetition",
                                b->rules[nx].name);
                } else if (!colour[nx]) {
                    colour[nx] = 1;
                    path[top++] = nx;
                }
            } else {
                colour[r] = 2;
                top--;
            }
        }
    }
    free(colour);
    free(it);
    free(path);
    goto out;
nomem:
    rc = ms_err(err, errlen, MS_ENOMEM, "out of memory checking the grammar");
out:
    free(seen);
    free(stack);
    if (left)
        for (int r = 0; r < nr; r++) free(left[r].p);
    free(left);
    return rc;
}

// FOLLOW sets of one byte: what may come right after each rule returns.
// An over-approximation is safe (it only prunes less), so sweeps stop after
// a bound and then everything is allowed.
static int automaton_follow(struct grammar *g, const uint8_t *nullable)
{
    int n = g->n_states, nr = g->n_rules;
    uint8_t(*first)[32] = calloc((size_t)(n ? n : 1), 32);
    g->follow = calloc((size_t)(nr ? nr : 1), 32);
    if (!first || !g->follow) {
        free(first);
        return MS_ENOMEM;
    }
    for (int s = 0; s < n; s++)
        for (int c = 0; c < 256; c++)
            if (tr(g, s)[g->cls[c]] >= 0) gx_cls_set(first[s], (unsigned)c);
    int sweeps = 0;
    for (int changed = 1; changed && sweeps < 200; sweeps++) {
        changed = 0;
        for (int s = n - 1; s >= 0; s--) {
            uint8_t acc[32];
            memcpy(acc, first[s], 32);
            for (uint32_t c = g->states[s].call_begin; c < g->states[s].call_end; c++) {
                int32_t r = g->calls[c].rule, t = g->calls[c].ret;
                if (r < 0) continue;
                uint8_t *fr = g->follow + (size_t)r * 32;
                for (int i = 0; i < 32; i++) {
                    acc[i] |= first[g->rule_start[r]][i];
                    if (nullable[r]) acc[i] |= first[t][i];
                    if ((fr[i] | first[t][i]) != fr[i]) {
                        fr[i] |= first[t][i];
                        changed = 1;
                    }
                }
            }
            if (g->states[s].final)
                for (int i = 0; i < 32; i++) acc[i] |= g->follow[(size_t)g->states[s].rule * 32 + i];
            if (memcmp(acc, first[s], 32)) {
                memcpy(first[s], acc, 32);
                changed = 1;
            }
        }
        if (changed && sweeps == 199) memset(g->follow, 0xff, (size_t)nr * 32);
    }
    free(first);
    return 0;
}

int grammar_automaton(struct grammar *g, struct gbuild *b, char *err, size_t errlen)
{
    int rc = automaton_make(g, b, err, errlen);
    if (rc) return rc;
    if ((rc = automaton_trim(g, b, err, errlen))) return rc;
    if (automaton_minimize(g)) return ms_err(err, errlen, MS_ENOMEM, "out of memory minimizing the automaton");
    uint8_t *nullable = calloc((size_t)g->n_rules, 1);
    if (!nullable) return ms_err(err, errlen, MS_ENOMEM, "out of memory checking the grammar");
    rc = automaton_left_recursion(g, b, nullable, err, errlen);
    if (!rc && automaton_follow(g, nullable)) rc = ms_err(err, errlen, MS_ENOMEM, "out of memory checking the grammar");
    free(nullable);
    return rc;
}
