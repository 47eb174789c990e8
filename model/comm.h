// comm: the communicator ranks use to exchange MoE tokens. The forward pass
// sees only this table; scheduler/ provides the in-process implementation
// (ranks as threads) and gpu/ the NCCL one.
#ifndef MOESERVE_MODEL_COMM_H
#define MOESERVE_MODEL_COMM_H

#include <stddef.h>

struct comm;

struct comm_ops {
    // Every rank calls this with the same n_ranks. Rank r sends
    // send_bytes[p] bytes from send + send_off[p] to peer p, and receives
    // recv_bytes[p] bytes from peer p into recv + recv_off[p]. Counts must
    // agree pairwise (exchange them first with all_gather). Returns 0 or a
    // negative status.
    int (*all_to_all_v)(struct comm *c, const void *send, const size_t *send_bytes,
                        const size_t *send_off, void *recv, const size_t *recv_bytes,
                        const size_t *recv_off);
    // recv holds n_ranks * bytes: rank p's contribution at p * bytes.
    int (*all_gather)(struct comm *c, const void *send, size_t bytes, void *recv);
    int (*barrier)(struct comm *c);
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

#endif
