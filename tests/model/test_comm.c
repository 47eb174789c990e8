// Pins model/comm.h's contract on every communicator this build and machine
// have (the in-process one always; a NCCL one joins the list when built and a
// GPU is visible): all_gather and all_to_all_v deliver every peer's bytes
// where asked, over thousands of back-to-back rounds (a fast rank never
// overwrites what a slow one still reads), with buffers in each rank's
// backend memory; inconsistent sizes are reported rather than copied (by the
// communicators that can check); abort releases peers blocked in a call and
// fails every later one (check, which does not communicate, included);
// impossible rank counts are refused; a NCCL group made by id (the
// multi-process bootstrap) delivers as well; on backends
// that record graphs (CUDA), exchanges recorded once deliver each replay's
// bytes (a padded decode step replays its exchanges so).
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/backend_registry.h"
#include "moeserve_build.h"
#if MOESERVE_HAVE_CUDA
#include "gpu/backend_cuda.h"
#endif

#define MAX_R 5
#define ROUNDS 3000
#define BUF 1024

// A communicator under test: the device its ranks run on, whether it checks
// count mismatches (NCCL cannot), and how many ranks this machine gives it.
struct factory {
    const char *name;
    enum backend_device device;
    bool checks_counts;
    int max_ranks;
};

// The in-process communicator always; NCCL when this build has the CUDA
// backend and a GPU is visible, over as many ranks as there are GPUs.
static struct factory factories[2];
static size_t n_factories;

// MOESERVE_TEST_DEVICE=cuda (tests/gpu/): NCCL alone.
static bool only_nccl;

static int list_factories(void **state)
{
    (void)state;
    n_factories = 0;
    if (!only_nccl) factories[n_factories++] = (struct factory){"in-process", BACKEND_DEVICE_CPU, true, 3};
    const int gpus = backend_device_count(BACKEND_DEVICE_CUDA);
    if (gpus > 0)
        factories[n_factories++] = (struct factory){"nccl", BACKEND_DEVICE_CUDA, false,
                                                    gpus < MAX_R ? gpus : MAX_R};
    else
        print_message("note: no CUDA device (or no CUDA build): the NCCL communicator is not "
                      "tested here\n");
    return 0;
}

struct peer {
    const struct factory *f;
    struct comm *c;
    struct backend *b;
    int errors;
    int mismatch_rc;
    bool no_graphs;  // its backend records none
};

// Rank r sends (r + 1) * (p + 1) + round % 3 bytes to peer p, each byte
// naming sender, receiver and round.
static size_t amount(int r, int p, int round) { return (size_t)((r + 1) * (p + 1) + round % 3); }
static uint8_t mark(int r, int p, int round, size_t i) { return (uint8_t)(r * 31 + p * 7 + round + i); }

static void *peer_main(void *arg)
{
    struct peer *pe = arg;
    struct comm *c = pe->c;
    struct backend *b = pe->b;
    const int R = c->n_ranks, me = c->rank;
    uint8_t send[BUF], recv[BUF];
    void *d_send, *d_recv, *d_mine, *d_all;
    if (b->ops->alloc(b, BUF, &d_send) || b->ops->alloc(b, BUF, &d_recv) ||
        b->ops->alloc(b, 8, &d_mine) || b->ops->alloc(b, 8 * MAX_R, &d_all)) {
        pe->errors++;
        return NULL;
    }
    size_t sb[MAX_R], so[MAX_R], rb[MAX_R], ro[MAX_R];
    for (int round = 0; round < ROUNDS; round++) {
        int32_t mine[2] = {me, round}, all[2 * MAX_R];
        b->ops->upload(b, d_mine, mine, sizeof mine);
        if (comm_all_gather(c, d_mine, sizeof mine, d_all)) pe->errors++;
        b->ops->download(b, all, d_all, (size_t)R * sizeof mine);
        for (int p = 0; p < R; p++)
            if (all[2 * p] != p || all[2 * p + 1] != round) pe->errors++;
        size_t at = 0;
        for (int p = 0; p < R; p++) {
            sb[p] = amount(me, p, round);
            so[p] = at;
            for (size_t i = 0; i < sb[p]; i++) send[at + i] = mark(me, p, round, i);
            at += sb[p];
        }
        b->ops->upload(b, d_send, send, at);
        at = 0;
        for (int p = 0; p < R; p++) {
            rb[p] = amount(p, me, round);
            ro[p] = at;
            at += rb[p];
        }
        memset(recv, 0xee, sizeof recv);
        b->ops->upload(b, d_recv, recv, sizeof recv);
        if (comm_all_to_all_v(c, d_send, sb, so, d_recv, rb, ro)) pe->errors++;
        b->ops->download(b, recv, d_recv, sizeof recv);
        for (int p = 0; p < R; p++)
            for (size_t i = 0; i < rb[p]; i++)
                if (recv[ro[p] + i] != mark(p, me, round, i)) pe->errors++;
    }
    if (pe->f->checks_counts) {
        // Rank 0 gathers a different size than the others: every rank must see it.
        pe->mismatch_rc = comm_all_gather(c, d_mine, me == 0 ? 4 : 8, d_all);
    }
    if (comm_barrier(c)) pe->errors++;
    b->ops->free(b, d_send);
    b->ops->free(b, d_recv);
    b->ops->free(b, d_mine);
    b->ops->free(b, d_all);
    return NULL;
}

// A backend for each rank's memory (rank r on device r).
static void open_backends(const struct factory *f, int R, struct backend **bs)
{
    char err[256];
    for (int r = 0; r < R; r++) {
        struct backend_opts bo = {.n_threads = 1, .device_index = r, .rank = r};
        if (backend_create(f->device, &bo, &bs[r], err, sizeof err)) fail_msg("%s: %s", f->name, err);
    }
}

// Endpoint r of a group of R is rank r of R.
static void assert_endpoints(struct comm **comms, int R)
{
    for (int r = 0; r < R; r++) {
        assert_int_equal(comms[r]->rank, r);
        assert_int_equal(comms[r]->n_ranks, R);
    }
}

// The group's endpoints and a backend for each rank's memory.
static void open_group(const struct factory *f, int R, struct comm **comms, struct backend **bs)
{
    char err[256];
    open_backends(f, R, bs);
    if (backend_comm_create(f->device, R, bs, comms, err, sizeof err))
        fail_msg("%s: %s", f->name, err);
    assert_endpoints(comms, R);
}

static void close_group(int R, struct comm **comms, struct backend **bs)
{
    for (int r = 0; r < R; r++) {
        comms[r]->ops->destroy(comms[r]);
        backend_destroy(bs[r]);
    }
}

// fn on a thread per rank of the group comms over bs, then closes it; pe
// (R) says what each saw.
static void run_peers_on(const struct factory *f, int R, struct comm **comms, struct backend **bs,
                         void *(*fn)(void *), struct peer *pe)
{
    pthread_t th[MAX_R];
    for (int r = 0; r < R; r++) {
        pe[r] = (struct peer){.f = f, .c = comms[r], .b = bs[r]};
        assert_int_equal(pthread_create(&th[r], NULL, fn, &pe[r]), 0);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    close_group(R, comms, bs);
    for (int r = 0; r < R; r++)
        if (pe[r].errors) fail_msg("%s, %d ranks: rank %d saw %d errors", f->name, R, r, pe[r].errors);
}

// fn on a thread per rank of a fresh group of R ranks.
static void run_peers(const struct factory *f, int R, void *(*fn)(void *), struct peer *pe)
{
    struct comm *comms[MAX_R];
    struct backend *bs[MAX_R];
    open_group(f, R, comms, bs);
    run_peers_on(f, R, comms, bs, fn, pe);
}

static void exchanges_deliver_every_peer_bytes(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < n_factories; fi++) {
        const struct factory *f = &factories[fi];
        for (int R = 1; R <= f->max_ranks; R++) {
            struct peer pe[MAX_R];
            run_peers(f, R, peer_main, pe);
            for (int r = 0; r < R; r++)
                if (f->checks_counts) assert_int_equal(pe[r].mismatch_rc, R > 1 ? MS_EINVAL : 0);
        }
    }
}

#define REPLAYS 20

// One eager round, then an all_gather and an all_to_all_v recorded once in a
// graph on the rank's backend and replayed with new bytes each time.
static void *peer_replays(void *arg)
{
    struct peer *pe = arg;
    struct comm *c = pe->c;
    struct backend *b = pe->b;
    const int R = c->n_ranks, me = c->rank;
    if (!b->ops->graph_begin) {
        pe->no_graphs = true;
        return NULL;
    }
    uint8_t send[BUF], recv[BUF];
    int32_t mine[2], all[2 * MAX_R];
    void *d_send, *d_recv, *d_mine, *d_all;
    if (b->ops->alloc(b, BUF, &d_send) || b->ops->alloc(b, BUF, &d_recv) ||
        b->ops->alloc(b, 8, &d_mine) || b->ops->alloc(b, 8 * MAX_R, &d_all)) {
        pe->errors++;
        return NULL;
    }
    size_t sb[MAX_R], so[MAX_R], rb[MAX_R], ro[MAX_R], at = 0, rat = 0;
    for (int p = 0; p < R; p++) {
        sb[p] = amount(me, p, 0);
        so[p] = at;
        at += sb[p];
        rb[p] = amount(p, me, 0);
        ro[p] = rat;
        rat += rb[p];
    }
    struct backend_graph *g = NULL;
    for (int round = 0; round <= REPLAYS; round++) {
        mine[0] = me, mine[1] = round;
        for (int p = 0; p < R; p++)
            for (size_t i = 0; i < sb[p]; i++) send[so[p] + i] = mark(me, p, round, i);
        b->ops->upload(b, d_mine, mine, sizeof mine);
        b->ops->upload(b, d_send, send, at);
        if (round == 0) {
            // Eagerly first (NCCL connects its peers), then recorded.
            if (comm_all_gather(c, d_mine, sizeof mine, d_all) ||
                comm_all_to_all_v(c, d_send, sb, so, d_recv, rb, ro))
                pe->errors++;
            if (b->ops->graph_begin(b)) pe->errors++;
            if (comm_all_gather(c, d_mine, sizeof mine, d_all) ||
                comm_all_to_all_v(c, d_send, sb, so, d_recv, rb, ro))
                pe->errors++;
            if (b->ops->graph_end(b, &g) || !g) {
                fprintf(stderr, "rank %d: %s\n", me, b->err);
                pe->errors++;
                break;
            }
            continue;
        }
        memset(recv, 0xee, sizeof recv);
        b->ops->upload(b, d_recv, recv, sizeof recv);
        if (b->ops->graph_launch(b, g)) pe->errors++;
        b->ops->download(b, all, d_all, (size_t)R * sizeof mine);
        b->ops->download(b, recv, d_recv, rat);
        for (int p = 0; p < R; p++) {
            if (all[2 * p] != p || all[2 * p + 1] != round) pe->errors++;
            for (size_t i = 0; i < rb[p]; i++)
                if (recv[ro[p] + i] != mark(p, me, round, i)) pe->errors++;
        }
    }
    if (g) b->ops->graph_free(b, g);
    b->ops->free(b, d_send);
    b->ops->free(b, d_recv);
    b->ops->free(b, d_mine);
    b->ops->free(b, d_all);
    return NULL;
}

static void recorded_exchanges_deliver_on_every_replay(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < n_factories; fi++) {
        const struct factory *f = &factories[fi];
        for (int R = 1; R <= f->max_ranks; R++) {
            struct peer pe[MAX_R];
            run_peers(f, R, peer_replays, pe);
            if (pe[0].no_graphs) {
                print_message("note: %s ranks' backend records no graphs\n", f->name);
                break;
            }
        }
    }
}

struct waiter {
    struct comm *c;
    int rc_first, rc_later;
};

static void *wait_in_barrier(void *arg)
{
    struct waiter *w = arg;
    w->rc_first = comm_barrier(w->c);
    w->rc_later = comm_barrier(w->c);
    return NULL;
}

// Ranks 1..R-1 wait in a barrier rank 0 never joins; rank 0 aborts instead.
// Before the abort they must really be waiting (they have not returned);
// after it, both their pending and their next calls fail.
static void abort_releases_blocked_peers_and_fails_later_calls(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < n_factories; fi++) {
        const struct factory *f = &factories[fi];
        const int R = f->max_ranks;
        if (R < 2) continue;
        struct comm *comms[MAX_R];
        struct backend *bs[MAX_R];
        open_group(f, R, comms, bs);
        struct waiter w[MAX_R];
        pthread_t th[MAX_R];
        for (int r = 1; r < R; r++) {
            w[r] = (struct waiter){.c = comms[r], .rc_first = 1, .rc_later = 1};
            assert_int_equal(pthread_create(&th[r], NULL, wait_in_barrier, &w[r]), 0);
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        for (int r = 1; r < R; r++)
            assert_int_equal(__atomic_load_n(&w[r].rc_first, __ATOMIC_SEQ_CST), 1); // still waiting
        assert_int_equal(comm_check(comms[0]), 0);
        comm_abort(comms[0]);
        for (int r = 1; r < R; r++) {
            pthread_join(th[r], NULL);
            assert_int_equal(w[r].rc_first, MS_ECANCELLED);
            assert_int_equal(w[r].rc_later, MS_ECANCELLED);
        }
        // What a rank that exchanged inside a replayed graph asks after it.
        for (int r = 0; r < R; r++) assert_int_equal(comm_check(comms[r]), MS_ECANCELLED);
        int32_t v = 0, all[MAX_R];
        assert_int_equal(comm_all_gather(comms[0], &v, sizeof v, all), MS_ECANCELLED);
        close_group(R, comms, bs);
    }
}

#if MOESERVE_HAVE_CUDA
struct joiner {
    const unsigned char *id;
    int n_ranks, rank;
    struct backend *b;
    struct comm *c;
    int rc;
    char err[256];
};

static void *join_main(void *arg)
{
    struct joiner *j = arg;
    j->rc = comm_nccl_join(j->id, j->n_ranks, j->rank, j->b, &j->c, j->err, sizeof j->err);
    return NULL;
}
#endif

// The multi-process bootstrap (comm_nccl_make_id, then comm_nccl_join by
// each rank, which blocks until all have joined), here with the ranks as
// threads: the group delivers like the one ncclCommInitAll makes. A rank
// that does not exist is refused before NCCL is asked.
static void a_group_joined_by_id_delivers(void **state)
{
    (void)state;
#if MOESERVE_HAVE_CUDA
    for (size_t fi = 0; fi < n_factories; fi++) {
        const struct factory *f = &factories[fi];
        if (f->device != BACKEND_DEVICE_CUDA) continue;
        for (int R = 1; R <= f->max_ranks; R++) {
            unsigned char id[NCCL_ID_BYTES];
            char err[256];
            if (comm_nccl_make_id(id, err, sizeof err)) fail_msg("%s", err);
            struct backend *bs[MAX_R];
            struct comm *comms[MAX_R];
            struct joiner js[MAX_R];
            pthread_t th[MAX_R];
            open_backends(f, R, bs);
            for (int r = 0; r < R; r++) {
                js[r] = (struct joiner){.id = id, .n_ranks = R, .rank = r, .b = bs[r]};
                assert_int_equal(pthread_create(&th[r], NULL, join_main, &js[r]), 0);
            }
            for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
            for (int r = 0; r < R; r++) {
                if (js[r].rc) fail_msg("rank %d of %d joining: %s", r, R, js[r].err);
                comms[r] = js[r].c;
            }
            assert_endpoints(comms, R);
            struct peer pe[MAX_R];
            run_peers_on(f, R, comms, bs, peer_main, pe);
        }
        struct comm *c = NULL;
        unsigned char id[NCCL_ID_BYTES] = {0};
        char err[256];
        assert_int_equal(comm_nccl_join(id, 2, 2, NULL, &c, err, sizeof err), MS_EINVAL);
        assert_non_null(strstr(err, "rank 2 of 2 ranks does not exist"));
        assert_null(c);
    }
#else
    print_message("note: this build has no NCCL communicator to join\n");
#endif
}

static void refuses_impossible_rank_counts(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < n_factories; fi++) {
        struct comm *c[1];
        char err[256];
        assert_int_equal(backend_comm_create(factories[fi].device, 0, NULL, c, err, sizeof err), MS_EINVAL);
        assert_non_null(strstr(err, "not 0"));
    }
}

int main(void)
{
    const char *dev = getenv("MOESERVE_TEST_DEVICE");
    if (dev && !strcmp(dev, "cuda")) {
        if (backend_device_count(BACKEND_DEVICE_CUDA) < 1) {
            fprintf(stderr, "skipped: no GPU, so no NCCL communicator to test\n");
            return 77;
        }
        only_nccl = true;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exchanges_deliver_every_peer_bytes),
        cmocka_unit_test(recorded_exchanges_deliver_on_every_replay),
        cmocka_unit_test(abort_releases_blocked_peers_and_fails_later_calls),
        cmocka_unit_test(a_group_joined_by_id_delivers),
        cmocka_unit_test(refuses_impossible_rank_counts),
    };
    return cmocka_run_group_tests(tests, list_factories, NULL);
}
