// fuzz_safetensors: a .safetensors file (8-byte header length, JSON header,
// data) through model/safetensors. Promises: an accepted file's every tensor
// lies inside the file with nbytes = product(shape) * element size and at
// most SAFETENSORS_MAX_DIMS dimensions, names are sorted and unique; or a
// refusal with a sentence; nothing leaks and no byte outside the mapping is
// read. The input is written to a file in /dev/shm (the loader maps files).
#include <stdbool.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "tests/fuzz/fuzz.h"

static char path[64];
static void forget_file(void) { unlink(path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (!path[0]) {
        snprintf(path, sizeof path, "/dev/shm/moeserve-fuzz-st-%d.safetensors", (int)getpid());
        atexit(forget_file);
    }
    fuzz_write(path, data, n);
    struct safetensors *st = NULL;
    char err[512] = "";
    int rc = safetensors_open_file(path, &st, err, sizeof err);
    if (rc) {
        FUZZ_REFUSAL(rc, err);
        FUZZ_CHECK(!st, "refused but returned a table");
        return 0;
    }
    size_t count = safetensors_count(st);
    const char *prev = NULL;
    for (size_t i = 0; i < count; i++) {
        const struct st_tensor *t = safetensors_get(st, i);
        FUZZ_CHECK(t && t->name && t->ndim >= 0 && t->ndim <= SAFETENSORS_MAX_DIMS, "tensor %zu", i);
        FUZZ_CHECK(!prev || strcmp(prev, t->name) < 0, "names out of order: %s, %s", prev, t->name);
        prev = t->name;
        FUZZ_CHECK(safetensors_find(st, t->name) == t, "find(%s) is another tensor", t->name);
        const uint8_t *d = t->data;
        if (t->nbytes) {
            // Within what was written: the first and the last byte are readable (ASan checks).
            volatile uint8_t first = d[0], last = d[t->nbytes - 1];
            (void)first;
            (void)last;
        }
        if (t->supported) {
            size_t want = dtype_size(t->dtype);
            for (int k = 0; k < t->ndim; k++) {
                FUZZ_CHECK(t->shape[k] >= 0, "negative dimension");
                want *= (size_t)t->shape[k];
            }
            FUZZ_CHECK(want == t->nbytes, "%s: %zu bytes for its shape, %zu stored", t->name, want,
                       t->nbytes);
        }
    }
    safetensors_close(st);
    return 0;
}
