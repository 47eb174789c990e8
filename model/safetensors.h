// safetensors: memory-maps a checkpoint's .safetensors files (one file, or the
// shards a model.safetensors.index.json names) and validates every header.
#ifndef MOESERVE_MODEL_SAFETENSORS_H
#define MOESERVE_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define SAFETENSORS_MAX_DIMS 8
// The reference implementation's limit on the JSON header.
#define SAFETENSORS_MAX_HEADER (100u << 20)

// One tensor as stored. data points into a read-only mapping that lives
// until safetensors_close. A tensor whose dtype we do not compute with (I64,
// F8_E4M3, ...) is listed with supported = false so that unused extras do
// not stop a load; binding one is the caller's error to report.
struct st_tensor {
    const char *name;
    bool supported;
    enum dtype dtype;       // meaningful when supported
    char dtype_str[12];     // as written in the header: "BF16", "I64", ...
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;
    size_t nbytes;          // product(shape) * element size
    const char *file;       // the file (basename) it lives in
};

struct safetensors; // opaque: the mapped files and a sorted tensor table

// Opens one .safetensors file.
int safetensors_open_file(const char *path, struct safetensors **out, char *err, size_t errlen);
// Opens DIR/model.safetensors.index.json and its shards when the index
// exists, else DIR/model.safetensors.
int safetensors_open_dir(const char *dir, struct safetensors **out, char *err, size_t errlen);
void safetensors_close(struct safetensors *st);

// NULL when absent.
const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
// The tensors in name order, for iteration.
size_t safetensors_count(const struct safetensors *st);
const struct st_tensor *safetensors_get(const struct safetensors *st, size_t i);

// The mapped files, in the order they were opened: name (as in struct
// st_file) and *info, what each was when mapped (what a cache of prepared
// weights is keyed by). NULL past the last.
size_t safetensors_file_count(const struct safetensors *st);
const char *safetensors_file_info(const struct safetensors *st, size_t i, struct ms_file_id *info);

#endif
