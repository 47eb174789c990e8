// safetensors: maps .safetensors files read-only and checks every header
// field against the file with overflow-safe arithmetic before exposing a byte.
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define INDEX_MAX_BYTES (64u << 20)

struct st_file {
    char *name; // basename for shards, the path given for a single file
    void *map;
    size_t size;
    struct ms_file_id id; // when mapped
};

struct safetensors {
    struct st_file *files;
    size_t n_files;
    struct st_tensor *t; // sorted by name once loading is done
    size_t n, cap;
};

static const struct {
    const char *name;
    size_t size;
    bool supported;
    enum dtype dtype;
} dtypes[] = {
    {"BF16", 2, true, DTYPE_BF16}, {"F16", 2, true, DTYPE_F16}, {"F32", 4, true, DTYPE_F32},
    {"F64", 8, false, DTYPE_F32},  {"BOOL", 1, false, DTYPE_F32}, {"U8", 1, false, DTYPE_F32},
    {"I8", 1, false, DTYPE_F32},   {"I16", 2, false, DTYPE_F32}, {"U16", 2, false, DTYPE_F32},
    {"I32", 4, false, DTYPE_F32},  {"U32", 4, false, DTYPE_F32}, {"I64", 8, false, DTYPE_F32},
    {"U64", 8, false, DTYPE_F32},  {"F8_E4M3", 1, false, DTYPE_F32},
    {"F8_E5M2", 1, false, DTYPE_F32}, {"F8_E8M0", 1, false, DTYPE_F32},
};

void safetensors_close(struct safetensors *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free((char *)st->t[i].name);
    free(st->t);
    for (size_t i = 0; i < st->n_files; i++) {
        if (st->files[i].map) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].name);
    }
    free(st->files);
    free(st);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

// Reads one [begin, end] pair element: a non-negative JSON integer.
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

// Parses one header entry into *t. data_size is the byte count after the header.
static int parse_entry(const char *path, const char *name, json_t *v, const uint8_t *data,
                       uint64_t data_off, uint64_t data_size, struct st_tensor *t, char *err,
                       size_t errlen)
{
    if (!json_is_object(v))
        return ms_err(err, errlen, MS_EFORMAT, "%s: header entry \"%s\" is not an object", path,
                      name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo))
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s: tensor %s needs a string dtype, a shape list and a data_offsets list",
                      path, name);
    const char *ds = json_string_value(jd);
    size_t k = 0, nd = sizeof dtypes / sizeof dtypes[0];
    while (k < nd && strcmp(dtypes[k].name, ds) != 0) k++;
    if (k == nd)
        return ms_err(err, errlen, MS_EFORMAT, "%s: tensor %s has unknown dtype \"%.32s\"", path,
                      name, ds);
    t->supported = dtypes[k].supported;
    t->dtype = dtypes[k].dtype;
    snprintf(t->dtype_str, sizeof t->dtype_str, "%s", dtypes[k].name);

    size_t ndim = json_array_size(js);
    if (ndim > SAFETENSORS_MAX_DIMS)
        return ms_err(err, errlen, MS_EFORMAT, "%s: tensor %s has %zu dimensions; at most %d are "
                      "supported", path, name, ndim, SAFETENSORS_MAX_DIMS);
    t->ndim = (int)ndim;
    uint64_t count = 1;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        if (!get_u64(json_array_get(js, i), &d) || d > INT64_MAX)
            return ms_err(err, errlen, MS_EFORMAT,
                          "%s: tensor %s shape[%zu] is not a non-negative integer", path, name, i);
        t->shape[i] = (int64_t)d;
        if (ms_mul_overflow_u64(count, d, &count))
            return ms_err(err, errlen, MS_EFORMAT, "%s: tensor %s: the element count of its "
                          "shape overflows 64 bits", path, name);
    }
    uint64_t want;
    if (ms_mul_overflow_u64(count, dtypes[k].size, &want))
        return ms_err(err, errlen, MS_EFORMAT, "%s: tensor %s: its byte size overflows 64 bits",
                      path, name);

    uint64_t begin, end;
    if (json_array_size(jo) != 2 || !get_u64(json_array_get(jo, 0), &begin) ||
        !get_u64(json_array_get(jo, 1), &end))
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s: tensor %s data_offsets must be two non-negative integers", path, name);
    if (end < begin)
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s: tensor %s data_offsets [%llu, %llu] end before they begin", path, name,
                      (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s: tensor %s data_offsets [%llu, %llu] run past the end of the data "
                      "section (%llu bytes); the file is truncated or corrupt", path, name,
                      (unsigned long long)begin, (unsigned long long)end,
                      (unsigned long long)data_size);
    if (end - begin != want)
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s: tensor %s holds %llu bytes but its shape and dtype %s need %llu", path,
                      name, (unsigned long long)(end - begin), ds, (unsigned long long)want);
    // Kernels load elements directly; HF writers pad the header to 8 bytes so
    // real files always pass this.
    if ((data_off + begin) % dtypes[k].size != 0)
        return ms_err(err, errlen, MS_EFORMAT,
                      "%s: tensor %s starts at byte %llu, not aligned to its %zu-byte elements",
                      path, name, (unsigned long long)(data_off + begin), dtypes[k].size);
    t->data = data + begin;
    t->nbytes = (size_t)want;
    return 0;
}

static int grow(struct safetensors *st, size_t more, char *err, size_t errlen)
{
    size_t need;
    if (ms_add_overflow(st->n, more, &need))
        return ms_err(err, errlen, MS_ENOMEM, "too many tensors");
    if (need <= st->cap) return 0;
    size_t cap = st->cap ? st->cap : 64;
    while (cap < need) cap *= 2;
    size_t bytes;
    if (ms_mul_overflow(cap, sizeof *st->t, &bytes))
        return ms_err(err, errlen, MS_ENOMEM, "too many tensors");
    struct st_tensor *t = realloc(st->t, bytes);
    if (!t) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the tensor table");
    st->t = t;
    st->cap = cap;
    return 0;
}

// Maps path and appends its tensors. label names the file in st->files.
static int load_file(struct safetensors *st, const char *path, const char *label, char *err,
                     size_t errlen)
{
    struct st_file *files = realloc(st->files, (st->n_files + 1) * sizeof *files);
    if (!files) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    st->files = files;
    struct st_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof *f);
    f->name = strdup(label);
    if (!f->name) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    st->n_files++;

    // Non-blocking: a FIFO would wait for a writer in open, before the
    // regular-file check could refuse it.
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return ms_err(err, errlen, errno == ENOENT ? MS_ENOTFOUND : MS_EIO, "cannot open %s: %s",
                      path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ms_err(err, errlen, MS_EIO, "%s is not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return ms_err(err, errlen, MS_EFORMAT, "%s is %llu bytes: truncated (a safetensors file "
                      "starts with an 8-byte header length)", path, (unsigned long long)size);
    }
    if (size > SIZE_MAX) {
        close(fd);
        return ms_err(err, errlen, MS_EIO, "%s is too large to map", path);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED)
        return ms_err(err, errlen, MS_EIO, "cannot map %s: %s", path, strerror(map_errno));
    f->map = map;
    f->size = (size_t)size;
    ms_file_id_of(&sb, &f->id);

    const uint8_t *b = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > SAFETENSORS_MAX_HEADER)
        return ms_err(err, errlen, MS_EFORMAT, "%s: header length %llu is beyond the %u-byte "
                      "limit; this is not a safetensors file", path, (unsigned long long)hlen,
                      SAFETENSORS_MAX_HEADER);
    if (hlen > size - 8)
        return ms_err(err, errlen, MS_EFORMAT, "%s: header length %llu runs past the end of the "
                      "%llu-byte file; the file is truncated", path, (unsigned long long)hlen,
                      (unsigned long long)size);
    if (hlen < 2)
        return ms_err(err, errlen, MS_EFORMAT, "%s: header length %llu is too short for a JSON "
                      "object", path, (unsigned long long)hlen);
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!h)
        return ms_err(err, errlen, MS_EFORMAT, "%s: the header is not valid JSON (column %d: %s)",
                      path, je.column, je.text);
    int rc = 0;
    if (!json_is_object(h)) {
        rc = ms_err(err, errlen, MS_EFORMAT, "%s: the header is not a JSON object", path);
        goto out;
    }
    uint64_t data_off = 8 + hlen, data_size = size - data_off;
    const uint8_t *data = b + data_off;
    size_t first = st->n;
    if ((rc = grow(st, json_object_size(h), err, errlen))) goto out;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v) && !json_is_null(v)) {
                rc = ms_err(err, errlen, MS_EFORMAT, "%s: __metadata__ is not an object", path);
                goto out;
            }
            continue;
        }
        struct st_tensor *t = &st->t[st->n];
        memset(t, 0, sizeof *t);
        if ((rc = parse_entry(path, key, v, data, data_off, data_size, t, err, errlen))) goto out;
        t->file = f->name;
        t->name = strdup(key);
        if (!t->name) {
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory");
            goto out;
        }
        st->n++;
    }

    // Overlap: sort this file's non-empty tensors by start and compare neighbours.
    size_t nf = st->n - first, ne = 0;
    if (nf > 1) {
        const struct st_tensor **order = malloc(nf * sizeof *order);
        if (!order) {
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < nf; i++)
            if (st->t[first + i].nbytes) order[ne++] = &st->t[first + i];
        qsort(order, ne, sizeof *order, cmp_tensor_offset);
        for (size_t i = 1; i < ne; i++) {
            const uint8_t *prev_end = (const uint8_t *)order[i - 1]->data + order[i - 1]->nbytes;
            if ((const uint8_t *)order[i]->data < prev_end) {
                rc = ms_err(err, errlen, MS_EFORMAT, "%s: tensors %s and %s overlap (bytes "
                            "%td..%td and %td..%td of the data section)", path,
                            order[i - 1]->name, order[i]->name,
                            (const uint8_t *)order[i - 1]->data - data, prev_end - data,
                            (const uint8_t *)order[i]->data - data,
                            (const uint8_t *)order[i]->data + order[i]->nbytes - data);
                break;
            }
        }
        free(order);
    }
out:
    json_decref(h);
    return rc;
}

// Sorts the table and refuses names that appear twice (across shards).
static int finish(struct safetensors *st, char *err, size_t errlen)
{
    if (st->n > 1) qsort(st->t, st->n, sizeof *st->t, cmp_tensor_name); // t is NULL when empty
    for (size_t i = 1; i < st->n; i++)
        if (!strcmp(st->t[i - 1].name, st->t[i].name))
            return ms_err(err, errlen, MS_EFORMAT, "tensor %s appears in both %s and %s",
                          st->t[i].name, st->t[i - 1].file, st->t[i].file);
    return 0;
}

int safetensors_open_file(const char *path, struct safetensors **out, char *err, size_t errlen)
{
    *out = NULL;
    struct safetensors *st = calloc(1, sizeof *st);
    if (!st) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    const char *slash = strrchr(path, '/');
    int rc = load_file(st, path, slash ? slash + 1 : path, err, errlen);
    if (!rc) rc = finish(st, err, errlen);
    if (rc) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

// A shard name from the index must stay inside the checkpoint directory.
static bool plain_file_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int open_index(struct safetensors *st, const char *dir, const char *index_path,
                      char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    int rc = ms_read_file(index_path, INDEX_MAX_BYTES, &text, &len, err, errlen);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return ms_err(err, errlen, MS_EFORMAT, "%s is not valid JSON (line %d: %s)", index_path,
                      je.line, je.text);
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    const char *name;
    json_t *v;
    if (!json_is_object(wm)) {
        rc = ms_err(err, errlen, MS_EFORMAT, "%s has no weight_map object", index_path);
        goto out;
    }
    if (json_object_size(wm) == 0) {
        rc = ms_err(err, errlen, MS_EFORMAT, "%s: weight_map is empty", index_path);
        goto out;
    }
    // Open each distinct shard once, in the order the index first names it.
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v) || !plain_file_name(json_string_value(v))) {
            rc = ms_err(err, errlen, MS_EFORMAT, "%s: weight_map[\"%s\"] must be a file name in "
                        "the checkpoint directory", index_path, name);
            goto out;
        }
        const char *shard = json_string_value(v);
        bool seen = false;
        for (size_t i = 0; i < st->n_files && !seen; i++) seen = !strcmp(st->files[i].name, shard);
        if (seen) continue;
        char path[4096];
        if (ms_path_join(path, sizeof path, dir, shard)) {
            rc = ms_err(err, errlen, MS_EINVAL, "path %s/%s is too long", dir, shard);
            goto out;
        }
        char sub[1024];
        rc = load_file(st, path, shard, sub, sizeof sub);
        if (rc == MS_ENOTFOUND) {
            rc = ms_err(err, errlen, MS_ENOTFOUND, "shard %s, which %s names for tensor %s, is "
                        "missing from %s", shard, INDEX_NAME, name, dir);
            goto out;
        }
        if (rc) {
            ms_err(err, errlen, rc, "%s", sub);
            goto out;
        }
    }
    if ((rc = finish(st, err, errlen))) goto out;
    json_object_foreach(wm, name, v) {
        const struct st_tensor *t = safetensors_find(st, name);
        const char *shard = json_string_value(v);
        if (!t) {
            rc = ms_err(err, errlen, MS_EFORMAT, "%s maps tensor %s to %s, but %s has no such "
                        "tensor", INDEX_NAME, name, shard, shard);
            goto out;
        }
        if (strcmp(t->file, shard) != 0) {
            rc = ms_err(err, errlen, MS_EFORMAT, "%s maps tensor %s to %s, but it is in %s",
                        INDEX_NAME, name, shard, t->file);
            goto out;
        }
    }
out:
    json_decref(root);
    return rc;
}

int safetensors_open_dir(const char *dir, struct safetensors **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    if (ms_path_join(path, sizeof path, dir, INDEX_NAME))
        return ms_err(err, errlen, MS_EINVAL, "path %s is too long", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        struct safetensors *st = calloc(1, sizeof *st);
        if (!st) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
        int rc = open_index(st, dir, path, err, errlen);
        if (rc) {
            safetensors_close(st);
            return rc;
        }
        *out = st;
        return 0;
    }
    if (ms_path_join(path, sizeof path, dir, SINGLE_NAME))
        return ms_err(err, errlen, MS_EINVAL, "path %s is too long", dir);
    if (stat(path, &sb) != 0)
        return ms_err(err, errlen, MS_ENOTFOUND, "%s has neither %s nor %s", dir, SINGLE_NAME,
                      INDEX_NAME);
    return safetensors_open_file(path, out, err, errlen);
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name)
{
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->t[mid].name, name);
        if (c == 0) return &st->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

size_t safetensors_count(const struct safetensors *st)
{
    return st->n;
}

const struct st_tensor *safetensors_get(const struct safetensors *st, size_t i)
{
    return i < st->n ? &st->t[i] : NULL;
}

size_t safetensors_file_count(const struct safetensors *st)
{
    return st->n_files;
}

const char *safetensors_file_info(const struct safetensors *st, size_t i, struct ms_file_id *info)
{
    if (i >= st->n_files) return NULL;
    *info = st->files[i].id;
    return st->files[i].name;
}
