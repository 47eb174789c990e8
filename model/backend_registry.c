// backend_registry: --device parsing and the backends and communicators
// this build has.
#include "model/backend_registry.h"

#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/cpu/backend_cpu.h"
#include "model/cpu/comm_inproc.h"
#include "moeserve_build.h"
#if MOESERVE_HAVE_CUDA
#include "gpu/backend_cuda.h"
#endif

int backend_device_parse(const char *s, enum backend_device *out)
{
    if (!strcmp(s, "auto")) *out = BACKEND_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = BACKEND_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *out = BACKEND_DEVICE_CUDA;
    else return MS_EINVAL;
    return 0;
}

const char *backend_device_name(enum backend_device d)
{
    switch (d) {
    case BACKEND_DEVICE_AUTO: return "auto";
    case BACKEND_DEVICE_CPU: return "cpu";
    case BACKEND_DEVICE_CUDA: return "cuda";
    }
    return "?";
}

int backend_device_resolve(enum backend_device want, enum backend_device *out, char *note,
                           size_t notelen, char *err, size_t errlen)
{
    if (note && notelen) note[0] = 0;
    switch (want) {
    case BACKEND_DEVICE_CPU:
        *out = BACKEND_DEVICE_CPU;
        return 0;
    case BACKEND_DEVICE_AUTO:
    case BACKEND_DEVICE_CUDA:
        break;
    }
#if MOESERVE_HAVE_CUDA
    char why[320];
    int n;
    if (backend_cuda_probe(&n, why, sizeof why) == 0) {
        *out = BACKEND_DEVICE_CUDA;
        return 0;
    }
#else
    const char *why = "this build of moeserve has no CUDA backend (it was built without the CUDA "
                      "toolkit, or with -Dcuda=disabled)";
#endif
    if (want == BACKEND_DEVICE_AUTO) {
        *out = BACKEND_DEVICE_CPU;
        if (note && notelen) snprintf(note, notelen, "--device auto: %s; running on the CPU", why);
        return 0;
    }
    return ms_err(err, errlen, MS_EUNSUPPORTED, "--device cuda: %s; use --device cpu (or auto)", why);
}

int backend_create(enum backend_device d, const struct backend_opts *o, struct backend **out,
                   char *err, size_t errlen)
{
    *out = NULL;
    int rc;
    switch (d) {
    case BACKEND_DEVICE_CPU: {
        const struct cpu_kernels *k = NULL;
        if (o->variant && !(k = cpu_kernels_by_name(o->variant)))
            return ms_err(err, errlen, MS_EUNSUPPORTED, "this CPU (or build) cannot run the %s "
                          "kernels", o->variant);
        rc = backend_cpu_create(o->n_threads, k, out, err, errlen);
        if (!rc) (*out)->index = o->rank;
        return rc;
    }
    case BACKEND_DEVICE_AUTO:
        return ms_err(err, errlen, MS_EINVAL, "resolve --device auto before making a backend");
    case BACKEND_DEVICE_CUDA:
#if MOESERVE_HAVE_CUDA
        return backend_cuda_create(o->device_index, o->rank, out, err, errlen);
#else
        break;
#endif
    }
    return ms_err(err, errlen, MS_EUNSUPPORTED, "this build of moeserve has no %s backend",
                  backend_device_name(d));
}

int backend_device_count(enum backend_device d)
{
    if (d == BACKEND_DEVICE_CPU) return 1;
#if MOESERVE_HAVE_CUDA
    int n;
    char why[320];
    if (d == BACKEND_DEVICE_CUDA && backend_cuda_probe(&n, why, sizeof why) == 0) return n;
#endif
    return 0;
}

int backend_variants(enum backend_device d, const char **names, int max)
{
    int n = 0;
#if MOESERVE_HAVE_CUDA
    if (d == BACKEND_DEVICE_CUDA) {
        int nd;
        char why[320];
        if (backend_cuda_probe(&nd, why, sizeof why) == 0 && max > 0) {
            names[0] = "cuda";
            return 1;
        }
        return 0;
    }
#endif
    if (d == BACKEND_DEVICE_CPU) {
        static const char *const tables[] = {"amx", "avx512", "avx512_bf16", "avx2", "scalar"};
        for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
            if (cpu_kernels_by_name(tables[i])) {
                if (n < max) names[n] = tables[i];
                n++;
            }
    }
    return n < max ? n : max;
}

bool backend_variant_bf16_activations(enum backend_device d, const char *variant)
{
    if (d == BACKEND_DEVICE_CUDA) return true;
    const struct cpu_kernels *k = variant ? cpu_kernels_by_name(variant) : cpu_kernels_best();
    return k && k->bf16_activations;
}

int backend_comm_create(enum backend_device d, int n_ranks, struct backend *const *ranks,
                        struct comm **out, char *err, size_t errlen)
{
    if (d == BACKEND_DEVICE_CPU) return comm_inproc_create(n_ranks, out, err, errlen);
#if MOESERVE_HAVE_CUDA
    if (d == BACKEND_DEVICE_CUDA) return comm_nccl_create(n_ranks, ranks, out, err, errlen);
#else
    (void)ranks;
#endif
    return ms_err(err, errlen, MS_EUNSUPPORTED, "this build of moeserve has no communicator for %s "
                  "ranks", backend_device_name(d));
}
