// probe: streaming-read and FMA-peak measurements on a rank's threads.
#include "model/cpu/probe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"

// The buffer lies on 2 MiB pages where the kernel grants them, as the packed
// weights do (backend_cpu.c): on 4 KiB pages the page walks of a 1 GiB stream
// cost a third of the bandwidth on the machines measured (decode then read
// "faster than the bandwidth").

int cpu_read_probe_create(size_t bytes, struct cpu_read_probe *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    bytes &= ~(size_t)4095;
    char *b = ms_map_huge(-1, bytes, PROT_READ | PROT_WRITE);
    if (b == MAP_FAILED)
        return ms_err(err, errlen, MS_ENOMEM, "cannot map %.0f MiB for the bandwidth probe",
                      (double)bytes / (1 << 20));
    // Real pages with real data: zero pages would all map one physical page.
    float *f = (float *)b;
    for (size_t i = 0; i < bytes / sizeof(float); i++) f[i] = (float)(i & 1023);
    p->buf = f;
    p->bytes = bytes;
    p->map = b;
    p->map_bytes = bytes;
    return 0;
}

void cpu_read_probe_destroy(struct cpu_read_probe *p)
{
    if (p->map) munmap(p->map, p->map_bytes);
    memset(p, 0, sizeof *p);
}

struct read_ctx {
    const struct cpu_read_probe *p;
    const struct cpu_kernels *k;
    volatile float sink[256];
};

static void read_worker(void *arg, int tid, int n_threads)
{
    struct read_ctx *c = arg;
    size_t n = c->p->bytes / sizeof(float);
    size_t b = n / (size_t)n_threads * (size_t)tid, e = tid == n_threads - 1 ? n : b + n / (size_t)n_threads;
    c->sink[tid & 255] = c->k->stream_sum(c->p->buf + b, e - b);
}

double cpu_read_probe_run(const struct cpu_read_probe *p, struct threadpool *pool,
                          const struct cpu_kernels *k, int reps)
{
    struct read_ctx c = {.p = p, .k = k};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = ms_now();
        threadpool_run(pool, read_worker, &c);
        double dt = ms_now() - t0;
        if (dt > 0 && (double)p->bytes / dt > best) best = (double)p->bytes / dt;
    }
    return best;
}

struct fma_ctx {
    const struct cpu_kernels *k;
    long iters;
    volatile float sink[256];
};

static void fma_worker(void *arg, int tid, int n_threads)
{
    (void)n_threads;
    struct fma_ctx *c = arg;
    c->sink[tid & 255] = c->k->fma_burn(c->iters, (float)tid);
}

double cpu_fma_peak(struct threadpool *pool, const struct cpu_kernels *k, long iters, int reps)
{
    struct fma_ctx c = {.k = k, .iters = iters};
    double best = 0;
    const double flops = (double)iters * CPU_FMA_CHAINS * k->lanes * 2.0 * threadpool_size(pool);
    for (int r = 0; r < reps; r++) {
        double t0 = ms_now();
        threadpool_run(pool, fma_worker, &c);
        double dt = ms_now() - t0;
        if (dt > 0 && flops / dt > best) best = flops / dt;
    }
    return best;
}
