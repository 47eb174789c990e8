// comm: the communicator expert-parallel ranks exchange MoE rows (and
// lm_head slices) through. The forward pass sees only this table; the
// in-process implementation (ranks as threads of one process) lives in
// the CPU backend's folder, the NCCL one in gpu/. backend_registry.h makes
// the one that matches the ranks' backends.
//
// The contract every implementation keeps:
// - Collective. Every rank of the group makes the same calls in the same
//   order (a rank with nothing to send still calls, with zero counts).
// - Memory. send and recv buffers are in the calling rank's backend memory
//   (model/backend.h); the count and offset arrays are host memory, read
//   before the call returns.
// - Order. A call sees the results of every op its rank issued on its
//   backend before it, and ops issued after it see what it received. (The
//   CPU backend runs ops synchronously, so the in-process calls simply
//   copy; a NCCL communicator enqueues on the rank's backend stream.) A call
//   returns when this rank's part is done or enqueued; buffers may be reused
//   once the backend has passed the call (after `sync` on a GPU).
// - Counts. Sizes must agree pairwise: what rank p sends to q is what q
//   expects from p (exchange counts first, with all_gather). The in-process
//   communicator checks and returns MS_EINVAL on every rank that sees a
//   mismatch, copying nothing for that pair; a NCCL communicator cannot check,
//   so a mismatch there is a caller's bug with undefined results.
// - Failure. Calls return 0 or a negative status. After `abort` (from any
//   thread, for instance when one rank fails), every blocked and later call
//   on every rank of the group returns MS_ECANCELLED instead of waiting for
//   a peer that will never come; the group is then only good for destroy.
//   `check` asks without communicating: a rank that ran exchanges some other
//   way (a replayed CUDA graph holds them) calls it after, so that it fails
//   the step too, and the NCCL endpoint stops what its graph launched.
// - Ownership. A group is made as n_ranks endpoints, each used by exactly
//   one thread and released with its destroy; the group goes with the last.
#ifndef MOESERVE_MODEL_COMM_H
#define MOESERVE_MODEL_COMM_H

#include <stddef.h>

struct comm;

struct comm_ops {
    // Rank r sends send_bytes[p] bytes from send + send_off[p] to peer p, and
    // receives recv_bytes[p] bytes from peer p into recv + recv_off[p].
    int (*all_to_all_v)(struct comm *c, const void *send, const size_t *send_bytes,
                        const size_t *send_off, void *recv, const size_t *recv_bytes,
                        const size_t *recv_off);
    // send (bytes) -> recv (n_ranks * bytes): rank p's contribution at p * bytes.
    int (*all_gather)(struct comm *c, const void *send, size_t bytes, void *recv);
    int (*barrier)(struct comm *c);
    // Fails every pending and later call of the group (see above).
    void (*abort)(struct comm *c);
    // 0, or MS_ECANCELLED once the group is aborted; no communication.
    int (*check)(struct comm *c);
    void (*destroy)(struct comm *c);
};

struct comm {
    const struct comm_ops *ops;
    int rank;
    int n_ranks;
    void *impl;
};

static inline int comm_all_to_all_v(struct comm *c, const void *send, const size_t *send_bytes,
                                    const size_t *send_off, void *recv,
                                    const size_t *recv_bytes, const size_t *recv_off)
{
    return c->ops->all_to_all_v(c, send, send_bytes, send_off, recv, recv_bytes, recv_off);
}
static inline int comm_all_gather(struct comm *c, const void *send, size_t bytes, void *recv)
{
    return c->ops->all_gather(c, send, bytes, recv);
}
static inline int comm_barrier(struct comm *c) { return c->ops->barrier(c); }
static inline void comm_abort(struct comm *c) { c->ops->abort(c); }
static inline int comm_check(struct comm *c) { return c->ops->check(c); }

#endif
