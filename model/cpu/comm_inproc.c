// comm_inproc: ranks publish pointers to their send buffers in per-rank
// slots, meet at a generation-counted barrier, copy what is theirs straight
// from their peers' buffers, and meet again before anyone reuses a buffer.
#include "model/cpu/comm_inproc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/spin.h"

#define SPIN_ITERS 4000

struct slot {
    const void *send;
    const size_t *send_bytes; // (n) all_to_all_v
    const size_t *send_off;   // (n)
    size_t bytes;             // all_gather
};

struct group {
    int n;
    _Atomic int refs;
    _Atomic uint32_t arrived;
    _Atomic uint32_t generation;
    _Atomic int aborted;      // comm_abort: every wait and later call fails
    struct slot *slots;       // (n)
    struct comm *ends;        // (n)
};

// Returns MS_ECANCELLED, without waiting further, once the group is aborted.
static int group_barrier(struct group *g)
{
    if (atomic_load(&g->aborted)) return MS_ECANCELLED;
    uint32_t gen = atomic_load(&g->generation);
    if (atomic_fetch_add(&g->arrived, 1) == (uint32_t)g->n - 1) {
        atomic_store(&g->arrived, 0);
        atomic_fetch_add(&g->generation, 1);
        ms_futex_wake(&g->generation, INT32_MAX);
        return atomic_load(&g->aborted) ? MS_ECANCELLED : 0;
    }
    int spins = 0;
    while (atomic_load(&g->generation) == gen) {
        if (++spins < SPIN_ITERS) ms_cpu_relax();
        else ms_futex_wait(&g->generation, gen);
    }
    return atomic_load(&g->aborted) ? MS_ECANCELLED : 0;
}

static int inproc_barrier(struct comm *c) { return group_barrier(c->impl); }

// Wakes every waiter by moving the generation on; they see the flag.
static void inproc_abort(struct comm *c)
{
    struct group *g = c->impl;
    atomic_store(&g->aborted, 1);
    atomic_fetch_add(&g->generation, 1);
    ms_futex_wake(&g->generation, INT32_MAX);
}

static int inproc_all_gather(struct comm *c, const void *send, size_t bytes, void *recv)
{
    struct group *g = c->impl;
    g->slots[c->rank].send = send;
    g->slots[c->rank].bytes = bytes;
    int rc = group_barrier(g);
    if (rc) return rc;
    // Every rank sees every size, so all of them agree on a mismatch.
    bool same = true;
    for (int p = 0; p < g->n; p++) same = same && g->slots[p].bytes == bytes;
    if (same)
        for (int p = 0; p < g->n; p++)
            if (bytes) memcpy((char *)recv + (size_t)p * bytes, g->slots[p].send, bytes);
    if ((rc = group_barrier(g))) return rc;
    return same ? 0 : MS_EINVAL;
}

static int inproc_all_to_all_v(struct comm *c, const void *send, const size_t *send_bytes,
                               const size_t *send_off, void *recv, const size_t *recv_bytes,
                               const size_t *recv_off)
{
    struct group *g = c->impl;
    struct slot *me = &g->slots[c->rank];
    me->send = send;
    me->send_bytes = send_bytes;
    me->send_off = send_off;
    int rc = group_barrier(g);
    if (rc) return rc;
    for (int p = 0; p < g->n; p++) {
        const struct slot *s = &g->slots[p];
        size_t n = s->send_bytes[c->rank];
        if (n != recv_bytes[p]) {
            rc = MS_EINVAL; // the counts were not exchanged consistently
            continue;
        }
        if (n) memcpy((char *)recv + recv_off[p], (const char *)s->send + s->send_off[c->rank], n);
    }
    int brc = group_barrier(g);
    return brc ? brc : rc;
}

static void group_free(struct group *g)
{
    free(g->slots);
    free(g->ends);
    free(g);
}

static void inproc_destroy(struct comm *c)
{
    if (!c) return;
    struct group *g = c->impl;
    if (atomic_fetch_sub(&g->refs, 1) == 1) group_free(g);
}

static int inproc_check(struct comm *c)
{
    return atomic_load(&((struct group *)c->impl)->aborted) ? MS_ECANCELLED : 0;
}

static const struct comm_ops inproc_ops = {
    .all_to_all_v = inproc_all_to_all_v,
    .all_gather = inproc_all_gather,
    .barrier = inproc_barrier,
    .abort = inproc_abort,
    .check = inproc_check,
    .destroy = inproc_destroy,
};

int comm_inproc_create(int n_ranks, struct comm **out, char *err, size_t errlen)
{
    if (n_ranks < 1 || n_ranks > 4096)
        return ms_err(err, errlen, MS_EINVAL, "an in-process communicator needs 1 to 4096 ranks, "
                      "not %d", n_ranks);
    struct group *g = calloc(1, sizeof *g);
    if (g) {
        g->slots = calloc((size_t)n_ranks, sizeof *g->slots);
        g->ends = calloc((size_t)n_ranks, sizeof *g->ends);
    }
    if (!g || !g->slots || !g->ends) {
        if (g) group_free(g);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory creating a communicator for %d ranks",
                      n_ranks);
    }
    g->n = n_ranks;
    atomic_store(&g->refs, n_ranks);
    for (int r = 0; r < n_ranks; r++) {
        g->ends[r] = (struct comm){.ops = &inproc_ops, .rank = r, .n_ranks = n_ranks, .impl = g};
        out[r] = &g->ends[r];
    }
    return 0;
}
