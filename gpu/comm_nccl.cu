// comm_nccl: model/comm.h over NCCL — one endpoint per rank, each on its
// rank's GPU and enqueueing on that rank's backend stream, so an exchange is
// ordered after the ops that produced its send buffer and before the ops
// that read its receive buffer without a host synchronisation.
// all_to_all_v is a group of ncclSend/ncclRecv (the rank's own part a
// device copy), all_gather is ncclAllGather, barrier an all-reduce of one
// int waited for on the host. Abort sets the group's flag and stops every
// endpoint's NCCL communicator, so peers waiting in a barrier (which polls)
// or a later call return MS_ECANCELLED instead of hanging. Stopping is
// ncclCommRevoke where the NCCL loaded has it (2.28.7 on): it ends the
// operations in flight but frees nothing, so a peer thread still inside an
// NCCL call on its communicator reads no freed memory. Each endpoint's own
// thread then aborts its communicator (ncclCommAbort) the next time it
// sees the flag, or its destroy does: an operation it launched after the
// revoke had finished runs with no abort flag, waiting for peers that never
// come. With an older NCCL the abort itself calls ncclCommAbort on every
// endpoint, as the only way to release them. Without an abort, the
// communicators outlive their endpoints until the group's last endpoint
// goes, and are then finalized in one NCCL group and destroyed (NCCL's
// finalize is an intra-node collective). NCCL cannot check that the
// sizes agree: a mismatch is the caller's bug (comm.h).
#include "gpu/backend_cuda.h"

#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kernels.cuh"

struct nccl_group {
    int n_ranks;
    int refs;                       // endpoints not yet destroyed
    int aborted;                    // atomic: set once by abort
    bool revoked;                   // the abort revoked (each endpoint aborts its own), under mu
    pthread_mutex_t mu;
    ncclComm_t *comms;              // (n_ranks), this process's endpoints (NULL: another process's,
                                    // or freed), under mu
    int *devs;                      // (n_ranks) each comms[r]'s GPU
};

struct nccl_ep {
    struct comm c;
    struct nccl_group *g;
    ncclComm_t nc;
    cudaStream_t stream;
    int dev;
    int32_t *flag;                  // device: the barrier's word
};

static void group_free(struct nccl_group *g);

static struct nccl_ep *ep_of(struct comm *c) { return (struct nccl_ep *)c->impl; }

static bool aborted(const struct nccl_group *g) { return __atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE); }

static int nccl_status(ncclResult_t r) { return r == ncclSuccess ? 0 : MS_EIO; }

// ncclCommRevoke came with NCCL 2.28.7: declared weak, so that a library
// older than the header leaves it NULL (the abort then frees) instead of
// failing to link or load.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
#define NCCL_HAS_REVOKE 1
#pragma weak ncclCommRevoke
#else
#define NCCL_HAS_REVOKE 0
#endif

static bool can_revoke(void)
{
#if NCCL_HAS_REVOKE
    int v = 0;
    return ncclCommRevoke != NULL && ncclGetVersion(&v) == ncclSuccess && v >= NCCL_VERSION(2, 28, 7);
#else
    return false;
#endif
}

// Teardown's NCCL calls have no caller to report to: a failure is logged.
static void nccl_release_check(ncclResult_t r, const char *what, int rank)
{
    if (r != ncclSuccess)
        ms_log(MS_LOG_WARN, "%s rank %d's NCCL communicator failed: %s", what, rank,
               ncclGetErrorString(r));
}

// After a revoking abort, the endpoint's own thread (the one thread with no
// call of its in flight then) frees its communicator: what it launched after
// the revoke would otherwise spin on its stream. The communicator leaves the
// group under its lock and is aborted outside it: NCCL may have an abort
// wait for the other ranks of this process, whose threads would then wait
// on the lock. Returns MS_ECANCELLED.
static int ep_cancelled(struct nccl_ep *e)
{
    struct nccl_group *g = e->g;
    ncclComm_t nc = NULL;
    pthread_mutex_lock(&g->mu);
    if (g->revoked && e->nc) {
        nc = e->nc;
        e->nc = NULL;
        g->comms[e->c.rank] = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    if (nc) {
        cuda_release_check(cudaSetDevice(e->dev), "selecting the endpoint's GPU");
        nccl_release_check(ncclCommAbort(nc), "aborting", e->c.rank);
    }
    return MS_ECANCELLED;
}

static int ep_a2a(struct comm *c, const void *send, const size_t *sb, const size_t *so, void *recv,
                  const size_t *rb, const size_t *ro)
{
    struct nccl_ep *e = ep_of(c);
    if (aborted(e->g)) return ep_cancelled(e);
    if (cudaSetDevice(e->dev) != cudaSuccess) return MS_EIO;
    const int me = c->rank;
    // A failure of this rank's own part still joins the group below: its
    // peers wait for its sends and receives otherwise (forward.c keeps every
    // rank in every exchange for the same reason).
    int own = 0;
    if (sb[me] != rb[me]) {
        own = MS_EINVAL;
    } else if (sb[me] && cudaMemcpyAsync((char *)recv + ro[me], (const char *)send + so[me], sb[me],
                                         cudaMemcpyDeviceToDevice, e->stream) != cudaSuccess) {
        cudaGetLastError();
        own = MS_EIO;
    }
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < c->n_ranks; p++) {
        if (p == me) continue;
        if (sb[p]) r = ncclSend((const char *)send + so[p], sb[p], ncclUint8, p, e->nc, e->stream);
        if (r == ncclSuccess && rb[p])
            r = ncclRecv((char *)recv + ro[p], rb[p], ncclUint8, p, e->nc, e->stream);
    }
    const ncclResult_t r2 = ncclGroupEnd();
    if (aborted(e->g)) return ep_cancelled(e);
    if (own) return own;
    return nccl_status(r != ncclSuccess ? r : r2);
}

static int ep_all_gather(struct comm *c, const void *send, size_t bytes, void *recv)
{
    struct nccl_ep *e = ep_of(c);
    if (aborted(e->g)) return ep_cancelled(e);
    if (cudaSetDevice(e->dev) != cudaSuccess) return MS_EIO;
    if (!bytes) return 0;
    const ncclResult_t r = ncclAllGather(send, recv, bytes, ncclUint8, e->nc, e->stream);
    if (aborted(e->g)) return ep_cancelled(e);
    return nccl_status(r);
}

// Polls the stream so that an abort from another thread releases the wait.
static int ep_barrier(struct comm *c)
{
    struct nccl_ep *e = ep_of(c);
    if (aborted(e->g)) return ep_cancelled(e);
    if (cudaSetDevice(e->dev) != cudaSuccess) return MS_EIO;
    ncclResult_t r = ncclAllReduce(e->flag, e->flag, 1, ncclInt32, ncclSum, e->nc, e->stream);
    if (r != ncclSuccess) return aborted(e->g) ? ep_cancelled(e) : MS_EIO;
    for (;;) {
        const cudaError_t q = cudaStreamQuery(e->stream);
        // An abort ends the all-reduce too: the stream drains without the
        // peer having arrived, so the flag decides first.
        if (aborted(e->g)) return ep_cancelled(e);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) return MS_EIO;
        // Under the group's lock, the flag read again: with an NCCL
        // without revoke, another thread's abort frees the communicator,
        // and it does so holding this lock, so between the check above and
        // this read it could have gone.
        ncclResult_t ar = ncclSuccess;
        pthread_mutex_lock(&e->g->mu);
        const bool gone = aborted(e->g);
        const bool failed = !gone && ncclCommGetAsyncError(e->nc, &ar) == ncclSuccess &&
                            ar != ncclSuccess && ar != ncclInProgress;
        pthread_mutex_unlock(&e->g->mu);
        if (gone) return ep_cancelled(e);
        if (failed) return MS_EIO;
        sched_yield();
    }
}

static void ep_abort(struct comm *c)
{
    struct nccl_group *g = ep_of(c)->g;
    pthread_mutex_lock(&g->mu);
    if (!g->aborted) {
        __atomic_store_n(&g->aborted, 1, __ATOMIC_RELEASE);
        g->revoked = can_revoke();
        for (int r = 0; r < g->n_ranks; r++) {
            if (!g->comms[r]) continue;
#if NCCL_HAS_REVOKE
            if (g->revoked) {
                nccl_release_check(ncclCommRevoke(g->comms[r], NCCL_REVOKE_DEFAULT), "revoking", r);
                continue;
            }
#endif
            nccl_release_check(ncclCommAbort(g->comms[r]), "aborting", r);
            g->comms[r] = NULL; // freed: neither destroyed nor finalized later
        }
    }
    pthread_mutex_unlock(&g->mu);
}

// The last endpoint of the group gone: its communicators still held go.
// Unaborted ones are finalized together, in one NCCL group, then destroyed
// (each destroy then purely local): NCCL's finalize is an intra-node
// collective, and one thread finalizing several ranks one by one waits in
// the first for the others. Revoked ones are aborted.
static void group_teardown(struct nccl_group *g)
{
    if (!aborted(g)) {
        nccl_release_check(ncclGroupStart(), "grouping the finalize of", 0);
        for (int r = 0; r < g->n_ranks; r++) {
            if (!g->comms[r]) continue;
            cuda_release_check(cudaSetDevice(g->devs[r]), "selecting a rank's GPU");
            nccl_release_check(ncclCommFinalize(g->comms[r]), "finalizing", r);
        }
        nccl_release_check(ncclGroupEnd(), "finalizing the group of", 0);
    }
    for (int r = 0; r < g->n_ranks; r++) {
        if (!g->comms[r]) continue;
        cuda_release_check(cudaSetDevice(g->devs[r]), "selecting a rank's GPU");
        if (aborted(g)) nccl_release_check(ncclCommAbort(g->comms[r]), "aborting", r);
        else nccl_release_check(ncclCommDestroy(g->comms[r]), "destroying", r);
        g->comms[r] = NULL;
    }
}

// An endpoint's communicator stays in the group until the last endpoint goes
// (group_teardown), but for a revoked one, which its endpoint aborts now
// (outside the lock, as ep_cancelled does).
static void ep_destroy(struct comm *c)
{
    if (!c) return;
    struct nccl_ep *e = ep_of(c);
    struct nccl_group *g = e->g;
    ncclComm_t revoked = NULL;
    pthread_mutex_lock(&g->mu);
    if (e->nc && g->revoked) {
        revoked = e->nc;
        g->comms[c->rank] = NULL;
    }
    e->nc = NULL;
    const bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    cuda_release_check(cudaSetDevice(e->dev), "selecting the endpoint's GPU");
    if (revoked) nccl_release_check(ncclCommAbort(revoked), "aborting", c->rank);
    cuda_release_check(cudaFree(e->flag), "an NCCL endpoint's flag");
    free(e);
    if (last) {
        group_teardown(g);
        group_free(g);
    }
}

static int ep_check(struct comm *c)
{
    struct nccl_ep *e = ep_of(c);
    return aborted(e->g) ? ep_cancelled(e) : 0;
}

static const struct comm_ops nccl_ops = {ep_a2a, ep_all_gather, ep_barrier, ep_abort, ep_check,
                                         ep_destroy};

static struct nccl_group *group_new(int n_ranks)
{
    struct nccl_group *g = (struct nccl_group *)calloc(1, sizeof *g);
    if (!g) return NULL;
    g->comms = (ncclComm_t *)calloc((size_t)n_ranks, sizeof *g->comms);
    g->devs = (int *)calloc((size_t)n_ranks, sizeof *g->devs);
    if (!g->comms || !g->devs) {
        free(g->comms);
        free(g->devs);
        free(g);
        return NULL;
    }
    g->n_ranks = n_ranks;
    pthread_mutex_init(&g->mu, NULL);
    return g;
}

static void group_free(struct nccl_group *g)
{
    pthread_mutex_destroy(&g->mu);
    free(g->comms);
    free(g->devs);
    free(g);
}

static int ep_new(struct nccl_group *g, int rank, ncclComm_t nc, struct backend *b,
                  struct comm **out, char *err, size_t errlen)
{
    struct nccl_ep *e = (struct nccl_ep *)calloc(1, sizeof *e);
    if (!e) return ms_err(err, errlen, MS_ENOMEM, "out of memory for a NCCL endpoint");
    e->g = g;
    e->nc = nc;
    e->stream = backend_cuda_stream(b);
    e->dev = backend_cuda_device(b);
    e->c.ops = &nccl_ops;
    e->c.rank = rank;
    e->c.n_ranks = g->n_ranks;
    e->c.impl = e;
    cudaError_t ce;
    if ((ce = cudaSetDevice(e->dev)) != cudaSuccess || (ce = cudaMalloc(&e->flag, 64)) != cudaSuccess ||
        (ce = cudaMemsetAsync(e->flag, 0, 64, e->stream)) != cudaSuccess) {
        if (e->flag) cudaFree(e->flag);
        cudaGetLastError();
        free(e);
        return ms_err(err, errlen, MS_EIO, "rank %d's NCCL endpoint on GPU %d: %s", rank,
                      backend_cuda_device(b), cudaGetErrorString(ce));
    }
    g->comms[rank] = nc;
    g->devs[rank] = e->dev;
    g->refs++;
    *out = &e->c;
    return 0;
}

int comm_nccl_create(int n_ranks, struct backend *const *ranks, struct comm **out, char *err,
                     size_t errlen)
{
    if (n_ranks < 1)
        return ms_err(err, errlen, MS_EINVAL, "a communicator group needs at least one rank, not %d",
                      n_ranks);
    if (!ranks)
        return ms_err(err, errlen, MS_EINVAL, "a NCCL group needs the ranks' CUDA backends");
    int *devs = (int *)calloc((size_t)n_ranks, sizeof *devs);
    ncclComm_t *nc = (ncclComm_t *)calloc((size_t)n_ranks, sizeof *nc);
    struct nccl_group *g = group_new(n_ranks);
    int rc = 0;
    if (!devs || !nc || !g) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for a NCCL group");
        goto out;
    }
    for (int r = 0; r < n_ranks; r++) {
        devs[r] = backend_cuda_device(ranks[r]);
        if (devs[r] < 0) {
            rc = ms_err(err, errlen, MS_EINVAL, "rank %d's backend is not a CUDA backend", r);
            goto out;
        }
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r]) {
                rc = ms_err(err, errlen, MS_EINVAL, "ranks %d and %d are both on GPU %d: NCCL needs "
                            "one GPU per rank", q, r, devs[r]);
                goto out;
            }
    }
    {
        const ncclResult_t r = ncclCommInitAll(nc, n_ranks, devs);
        if (r != ncclSuccess) {
            rc = ms_err(err, errlen, MS_EIO, "NCCL could not join %d GPUs: %s (%s)", n_ranks,
                        ncclGetErrorString(r), ncclGetLastError(NULL));
            goto out;
        }
    }
    for (int r = 0; r < n_ranks; r++) {
        if ((rc = ep_new(g, r, nc[r], ranks[r], &out[r], err, errlen))) {
            // The communicators without an endpoint join the group's, all
            // finalized together when the last endpoint made so far goes
            // (or now, when none was made).
            for (int q = r; q < n_ranks; q++) {
                g->comms[q] = nc[q];
                g->devs[q] = devs[q];
            }
            if (r == 0) group_teardown(g);
            else g = NULL; // the endpoints made so far hold the group: the last one frees it
            for (int q = 0; q < r; q++) {
                ep_destroy(out[q]);
                out[q] = NULL; // as comm_inproc leaves out: the caller destroys what it finds there
            }
            goto out;
        }
    }
    g = NULL; // owned by the endpoints
out:
    if (g) group_free(g);
    free(devs);
    free(nc);
    return rc;
}

int comm_nccl_make_id(unsigned char id[NCCL_ID_BYTES], char *err, size_t errlen)
{
    ncclUniqueId u;
    const ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return ms_err(err, errlen, MS_EIO, "NCCL could not make a group id: %s", ncclGetErrorString(r));
    memcpy(id, u.internal, NCCL_ID_BYTES);
    return 0;
}

int comm_nccl_join(const unsigned char id[NCCL_ID_BYTES], int n_ranks, int rank, struct backend *b,
                   struct comm **out, char *err, size_t errlen)
{
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return ms_err(err, errlen, MS_EINVAL, "rank %d of %d ranks does not exist", rank, n_ranks);
    if (backend_cuda_device(b) < 0)
        return ms_err(err, errlen, MS_EINVAL, "a NCCL endpoint needs a CUDA backend");
    ncclUniqueId u;
    memcpy(u.internal, id, NCCL_ID_BYTES);
    struct nccl_group *g = group_new(n_ranks);
    if (!g) return ms_err(err, errlen, MS_ENOMEM, "out of memory for a NCCL group");
    ncclComm_t nc;
    const cudaError_t ce = cudaSetDevice(backend_cuda_device(b));
    if (ce != cudaSuccess) {
        group_free(g);
        return ms_err(err, errlen, MS_EIO, "rank %d: selecting GPU %d failed: %s", rank,
                      backend_cuda_device(b), cudaGetErrorString(ce));
    }
    const ncclResult_t r = ncclCommInitRank(&nc, n_ranks, u, rank);
    int rc = 0;
    if (r != ncclSuccess)
        rc = ms_err(err, errlen, MS_EIO, "rank %d could not join its NCCL group: %s", rank,
                    ncclGetErrorString(r));
    else if ((rc = ep_new(g, rank, nc, b, out, err, errlen)))
        ncclCommDestroy(nc);
    if (rc) group_free(g);
    return rc;
}
