// Pins the in-process communicator: all_gather and all_to_all_v deliver
// every peer's bytes where asked, over thousands of back-to-back rounds (the
// barrier never lets a fast rank overwrite what a slow one still reads), and
// inconsistent sizes are reported instead of copied.
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "scheduler/comm_inproc.h"

#define MAX_R 5
#define ROUNDS 3000

struct peer {
    struct comm *c;
    int errors;
    int mismatch_rc;
};

// Rank r sends (r + 1) * (p + 1) + round % 3 bytes to peer p, each byte
// naming sender, receiver and round.
static size_t amount(int r, int p, int round) { return (size_t)((r + 1) * (p + 1) + round % 3); }
static uint8_t mark(int r, int p, int round, size_t i) { return (uint8_t)(r * 31 + p * 7 + round + i); }

static void *peer_main(void *arg)
{
    struct peer *pe = arg;
    struct comm *c = pe->c;
    const int R = c->n_ranks, me = c->rank;
    uint8_t send[1024], recv[1024];
    size_t sb[MAX_R], so[MAX_R], rb[MAX_R], ro[MAX_R];
    for (int round = 0; round < ROUNDS; round++) {
        int32_t mine[2] = {me, round}, all[2 * MAX_R];
        if (comm_all_gather(c, mine, sizeof mine, all)) pe->errors++;
        for (int p = 0; p < R; p++)
            if (all[2 * p] != p || all[2 * p + 1] != round) pe->errors++;
        size_t at = 0;
        for (int p = 0; p < R; p++) {
            sb[p] = amount(me, p, round);
            so[p] = at;
            for (size_t i = 0; i < sb[p]; i++) send[at + i] = mark(me, p, round, i);
            at += sb[p];
        }
        at = 0;
        for (int p = 0; p < R; p++) {
            rb[p] = amount(p, me, round);
            ro[p] = at;
            at += rb[p];
        }
        memset(recv, 0xee, sizeof recv);
        if (comm_all_to_all_v(c, send, sb, so, recv, rb, ro)) pe->errors++;
        for (int p = 0; p < R; p++)
            for (size_t i = 0; i < rb[p]; i++)
                if (recv[ro[p] + i] != mark(p, me, round, i)) pe->errors++;
    }
    // Rank 0 gathers a different size than the others: every rank must see it.
    int32_t v[2] = {0, 0}, out[2 * MAX_R];
    pe->mismatch_rc = comm_all_gather(c, v, me == 0 ? 4 : 8, out);
    if (comm_barrier(c)) pe->errors++;
    return NULL;
}

static void exchanges_deliver_every_peer_bytes(void **state)
{
    (void)state;
    for (int R = 1; R <= 3; R++) {
        struct comm *comms[MAX_R];
        char err[256];
        assert_int_equal(comm_inproc_create(R, comms, err, sizeof err), 0);
        struct peer pe[MAX_R];
        pthread_t th[MAX_R];
        for (int r = 0; r < R; r++) {
            pe[r] = (struct peer){.c = comms[r]};
            assert_int_equal(comms[r]->rank, r);
            assert_int_equal(comms[r]->n_ranks, R);
            assert_int_equal(pthread_create(&th[r], NULL, peer_main, &pe[r]), 0);
        }
        for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < R; r++) {
            assert_int_equal(pe[r].errors, 0);
            assert_int_equal(pe[r].mismatch_rc, R > 1 ? MS_EINVAL : 0);
        }
        for (int r = 0; r < R; r++) comms[r]->ops->destroy(comms[r]);
    }
}

static void refuses_impossible_rank_counts(void **state)
{
    (void)state;
    struct comm *c[1];
    char err[256];
    assert_int_equal(comm_inproc_create(0, c, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "not 0"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exchanges_deliver_every_peer_bytes),
        cmocka_unit_test(refuses_impossible_rank_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
