// weights_cache: the file of prepared weights (see weights_cache.h): its
// name and key, the header check, and the atomic write.
#include "model/cpu/weights_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/base.h"
#include "base/buf.h"
#include "model/cpu/threadpool.h"
#include "model/safetensors.h"
#include "moeserve_build.h"

// Bump when the packed layout, the quantization or the dummy recipe changes
// what a file of the same key would hold (the key also names the version of
// moeserve that wrote it, so that a release that forgot to bump it cannot
// serve another release's bytes).
#define CACHE_FORMAT 3
#define CACHE_MAGIC "MSPACK\x01\n"
#define PAGE 4096u

struct disk_header {
    char magic[8];
    uint64_t format;
    uint64_t data_off, packed_bytes, made_off, made_bytes, file_bytes;
    uint64_t key_len;
    uint64_t n_sums;             // data checksums after the key, one a WEIGHTS_CACHE_SUM_BYTES
    uint64_t checksum;           // FNV-1a over this header (checksum 0), the key and the sums
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t header_sum(const struct disk_header *h, const char *key, const uint64_t *sums)
{
    struct disk_header z = *h;
    z.checksum = 0;
    const uint64_t k = fnv1a(fnv1a(0xcbf29ce484222325ull, &z, sizeof z), key, h->key_len);
    return fnv1a(k, sums, h->n_sums * sizeof *sums);
}

// ---- the data's checksums ---------------------------------------------------------
//
// FNV-1a reads a byte at a time (under 1 GB/s); the data is tens of GB read
// at every start, so its sums take 8 bytes at a time in four independent
// lanes (a multiply, a rotate and a multiply each, the round xxHash64 is
// built on), then fold the lanes and the length and mix the result so that
// every input bit reaches every output bit. Not a cryptographic hash: it
// finds damage, not forgeries (check_file's ownership rules keep others'
// files out).
#define SUM_P1 0x9E3779B185EBCA87ull
#define SUM_P2 0xC2B2AE3D27D4EB4Full
#define SUM_P3 0x165667B19E3779F9ull

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t sum_round(uint64_t acc, uint64_t v) { return rotl64(acc + v * SUM_P2, 31) * SUM_P1; }

// The checksum of n bytes at p (n a multiple of 32: the areas are whole pages).
static uint64_t data_sum(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t a0 = SUM_P1 + SUM_P2, a1 = SUM_P2, a2 = 0, a3 = 0 - SUM_P1;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        // This VM's hardware prefetchers alone left one core reading at 4
        // GB/s; a line 4 KiB ahead makes it 8-11 (the sums' own speed from L2
        // is 14 GB/s, 2.6 GHz).
        if ((i & 63) == 0) __builtin_prefetch(b + i + 4096);
        uint64_t v[4];
        memcpy(v, b + i, sizeof v);
        a0 = sum_round(a0, v[0]);
        a1 = sum_round(a1, v[1]);
        a2 = sum_round(a2, v[2]);
        a3 = sum_round(a3, v[3]);
    }
    uint64_t h = rotl64(a0, 1) + rotl64(a1, 7) + rotl64(a2, 12) + rotl64(a3, 18);
    const uint64_t lanes[4] = {a0, a1, a2, a3};
    for (int i = 0; i < 4; i++) h = (h ^ sum_round(0, lanes[i])) * SUM_P1 + SUM_P3;
    h += (uint64_t)n;
    h = (h ^ (h >> 33)) * SUM_P2;
    h = (h ^ (h >> 29)) * SUM_P3;
    return h ^ (h >> 32);
}

// The sums of the data (c->map from data_off), taken on every core: chunks
// handed out from a shared counter. With check, compares them with c->sums
// and returns the first chunk that differs (n_sums when none); without,
// writes them to c->sums. With lock, each chunk is locked in memory first
// (mlock reads what is not in the page cache): while one thread waits on
// the disk for its chunk another sums its own, so that a start from disk
// takes about the read, not the read and then the sums (each page's first
// touch after a read from the disk is slow on a VM: the sums alone ran at
// 1.7 GB/s there). The first lock that fails leaves its errno in *lock_err
// and the rest unlocked.
struct sum_job {
    const struct weights_cache *c;
    uint64_t *sums;
    bool check, lock;
    _Atomic uint64_t next, bad;
    _Atomic int lock_err;
};

static void *sum_worker(void *arg)
{
    struct sum_job *j = arg;
    const struct weights_cache *c = j->c;
    const uint64_t data = c->file_bytes - c->data_off;
    for (uint64_t i; (i = atomic_fetch_add(&j->next, 1)) < c->n_sums;) {
        const uint64_t off = i * WEIGHTS_CACHE_SUM_BYTES;
        const uint64_t len = data - off < WEIGHTS_CACHE_SUM_BYTES ? data - off : WEIGHTS_CACHE_SUM_BYTES;
        const char *p = (const char *)c->map + c->data_off + off;
        if (j->lock && !atomic_load(&j->lock_err) && mlock(p, (size_t)len) != 0) {
            int none = 0;
            atomic_compare_exchange_strong(&j->lock_err, &none, errno ? errno : ENOMEM);
        }
        const uint64_t s = data_sum(p, (size_t)len);
        if (!j->check) {
            j->sums[i] = s;
        } else if (s != j->sums[i]) {
            uint64_t was = atomic_load(&j->bad);
            while (i < was && !atomic_compare_exchange_weak(&j->bad, &was, i)) {}
        }
    }
    return NULL;
}

static uint64_t sum_data_locking(const struct weights_cache *c, bool check, bool lock, int *lock_err)
{
    struct sum_job j = {.c = c, .sums = c->sums, .check = check, .lock = lock};
    atomic_init(&j.next, 0);
    atomic_init(&j.bad, c->n_sums);
    atomic_init(&j.lock_err, 0);
    threadpool_run_once(sum_worker, &j, c->n_sums > 64 ? 64 : c->n_sums ? (int)c->n_sums : 1);
    if (lock_err && atomic_load(&j.lock_err)) *lock_err = atomic_load(&j.lock_err); // keeps the caller's
    return atomic_load(&j.bad);
}

static uint64_t sum_data(const struct weights_cache *c, bool check) { return sum_data_locking(c, check, false, NULL); }

static uint64_t round_page(uint64_t n) { return (n + PAGE - 1) / PAGE * PAGE; }

static int file_line_of(struct ms_buf *t, const char *label, const struct ms_file_id *f)
{
    return ms_buf_append_fmt(t, "file %s %llu %lld %lld %llu\n", label, (unsigned long long)f->size,
                             (long long)f->mtime_ns, (long long)f->ctime_ns, (unsigned long long)f->ino);
}

static int mkdir_p(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return -1;
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            const char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            *p = c;
            if (!c) break;
        }
    }
    struct stat sb;
    return stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) ? 0 : -1;
}

// The directory: the model's cache_dir, else $XDG_CACHE_HOME/moeserve or
// ~/.cache/moeserve. Returns false when caching is off for these weights.
static bool cache_dir_of(const struct model *m, uint64_t bytes, char *dir, size_t len)
{
    if (!strcmp(m->cache_dir, "none")) return false;
    if (m->cache_dir[0]) return snprintf(dir, len, "%s", m->cache_dir) < (int)len;
    if (bytes < WEIGHTS_CACHE_MIN_BYTES) return false;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(dir, len, "%s/moeserve", xdg);
    else if (home && *home) n = snprintf(dir, len, "%s/.cache/moeserve", home);
    else return false;
    return n > 0 && n < (int)len;
}

int weights_cache_open(struct weights_cache *c, const struct model *m, const char *kernels,
                       uint64_t packed_bytes, uint64_t made_bytes)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    char dir[4096];
    if (!cache_dir_of(m, packed_bytes + made_bytes, dir, sizeof dir)) return 0;
    if (mkdir_p(dir) != 0) {
        ms_log(MS_LOG_WARN, "cannot use %s for the prepared weights (%s): preparing them without a "
               "cache", dir, strerror(errno));
        return 0;
    }
    char real[PATH_MAX];
    const char *model_path = realpath(m->dir, real) ? real : m->dir;
    const char *qname = quant_format_name(m->quant);
    // The name says what the file holds, the key what it was made from.
    char what[PATH_MAX + 256];
    snprintf(what, sizeof what, "%s|%s|%s|%d|%llu", model_path, kernels, qname, (int)m->dummy,
             (unsigned long long)m->seed);
    const char *base = strrchr(model_path, '/');
    base = base && base[1] ? base + 1 : model_path;
    char short_base[64];
    const size_t bl = strlen(base) < sizeof short_base - 1 ? strlen(base) : sizeof short_base - 1;
    memcpy(short_base, base, bl);
    short_base[bl] = 0;
    if (snprintf(c->path, sizeof c->path, "%s/%s-%s-%s-%016llx.weights", dir, short_base, kernels,
                 qname, (unsigned long long)fnv1a(0xcbf29ce484222325ull, what, strlen(what))) >=
        (int)sizeof c->path)
        return 0;
    struct ms_buf t = {0};
    int rc = ms_buf_append_fmt(&t, "moeserve %s prepared weights, format %d\n", MOESERVE_VERSION, CACHE_FORMAT);
    rc = rc ? rc : ms_buf_append_fmt(&t, "model %s\nkernels %s\nquantization %s\n", model_path, kernels, qname);
    rc = rc ? rc : ms_buf_append_fmt(&t, "load %s seed %llu\n", m->dummy ? "dummy" : "safetensors",
                                     (unsigned long long)m->seed);
    rc = rc ? rc : ms_buf_append_fmt(&t, "areas packed %llu made %llu\n", (unsigned long long)packed_bytes,
                                     (unsigned long long)made_bytes);
    // The config as it was read, not as it is now: one replaced since would
    // file these weights under its version.
    rc = rc ? rc : file_line_of(&t, "config.json", &m->cfg.file);
    const struct safetensors *st = m->storage;
    for (size_t i = 0; !rc && st && i < safetensors_file_count(st); i++) {
        struct ms_file_id f;
        const char *name = safetensors_file_info(st, i, &f);
        rc = file_line_of(&t, name, &f);
    }
    if (rc) {
        ms_buf_free(&t);
        return MS_ENOMEM;
    }
    c->key = ms_buf_steal(&t, NULL);
    if (!c->key) return MS_ENOMEM;
    c->packed_bytes = packed_bytes;
    c->made_bytes = made_bytes;
    const uint64_t data = round_page(packed_bytes) + round_page(made_bytes);
    c->n_sums = (data + WEIGHTS_CACHE_SUM_BYTES - 1) / WEIGHTS_CACHE_SUM_BYTES;
    c->sums = calloc(c->n_sums ? c->n_sums : 1, sizeof *c->sums);
    if (!c->sums) {
        free(c->key);
        c->key = NULL;
        return MS_ENOMEM;
    }
    c->data_off = round_page(sizeof(struct disk_header) + strlen(c->key) + c->n_sums * sizeof *c->sums);
    c->made_off = c->data_off + round_page(packed_bytes);
    c->file_bytes = c->made_off + round_page(made_bytes);
    return 1;
}

// Why a file is not used, for the log line; NULL when it is good. A file
// another user could have written (not ours, or writable by others) is not
// trusted: its key is no secret, so anyone who can write the directory could
// plant weights under it.
static const char *check_file(struct weights_cache *c, int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) return "cannot be read";
    if (!S_ISREG(sb.st_mode)) return "is not a regular file";
    if (sb.st_uid != geteuid()) return "belongs to another user";
    if (sb.st_mode & (S_IWGRP | S_IWOTH)) return "is writable by other users";
    struct disk_header h;
    if (sb.st_size < (off_t)sizeof h || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        return "is truncated (no whole header)";
    if (memcmp(h.magic, CACHE_MAGIC, 8) != 0) return "is not a moeserve weights file";
    if (h.format != CACHE_FORMAT) return "was written by another version";
    // Sizes compared with ours before anything is read by them.
    if (h.key_len != strlen(c->key) || h.n_sums != c->n_sums) return "is stale or has a corrupt header (sizes)";
    char *key = malloc(h.key_len + 1);
    if (!key) return "cannot be read (out of memory)";
    const char *why = NULL;
    const size_t sums_bytes = c->n_sums * sizeof *c->sums;
    if (pread(fd, key, h.key_len, sizeof h) != (ssize_t)h.key_len ||
        pread(fd, c->sums, sums_bytes, (off_t)(sizeof h + h.key_len)) != (ssize_t)sums_bytes)
        why = "is truncated (no whole key)";
    else if (header_sum(&h, key, c->sums) != h.checksum) why = "has a corrupt header (checksum)";
    else if (memcmp(key, c->key, h.key_len) != 0)
        why = "is stale (the checkpoint, the kernels or the layout changed)";
    else if (h.data_off != c->data_off || h.made_off != c->made_off || h.packed_bytes != c->packed_bytes ||
             h.made_bytes != c->made_bytes || h.file_bytes != c->file_bytes)
        why = "has a corrupt header (layout)";
    else if ((uint64_t)sb.st_size != c->file_bytes) why = "is truncated";
    free(key);
    return why;
}

static bool repage(struct weights_cache *c, int fd);
static void pin_refused(const struct weights_cache *c, int e);

// Whether a check found no damaged chunk (bad, the first one, is n_sums);
// a mismatch is logged with the first damaged offset.
static bool sums_match(const struct weights_cache *c, uint64_t bad)
{
    if (bad >= c->n_sums) return true;
    ms_log(MS_LOG_WARN, "the weights cache %s is corrupt (its data from byte %llu fails its checksum)", c->path,
           (unsigned long long)(c->data_off + bad * WEIGHTS_CACHE_SUM_BYTES));
    return false;
}

// The data against the header's sums (what the file holds now).
static bool data_ok(const struct weights_cache *c) { return sums_match(c, sum_data(c, true)); }

bool weights_cache_map(struct weights_cache *c)
{
    // Not through a symlink, and never blocking (a FIFO planted there).
    const int fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno != ENOENT)
            ms_log(MS_LOG_WARN, "the weights cache %s cannot be opened (%s): preparing the weights again",
                   c->path, strerror(errno));
        return false;
    }
    const char *why = check_file(c, fd);
    if (why) {
        close(fd);
        ms_log(MS_LOG_WARN, "the weights cache %s %s: preparing the weights again", c->path, why);
        return false;
    }
    // Mapped asking for huge pages: the page cache then holds the file in 2
    // MiB folios, each mapped by one page table entry (6.x kernels with large
    // folios on the file system), where 4 KiB pages left a decode step
    // walking page tables for every page of its experts (measured: the int4
    // kernel over 3 GiB of experts picked at random ran at 4-6.5 GB/s with 4
    // KiB pages, 9-10 GB/s with 2 MiB ones).
    void *p = ms_map_huge(fd, (size_t)c->file_bytes, PROT_READ);
    if (p == MAP_FAILED) {
        const int e = errno;
        close(fd);
        ms_log(MS_LOG_WARN, "cannot map the weights cache %s (%s): preparing the weights again",
               c->path, strerror(e));
        return false;
    }
    c->map = p;
    c->map_bytes = (size_t)c->file_bytes;
    // The file is locked (pinned) and checked chunk by chunk on every core
    // (sum_data_locking): bytes damaged on the disk after it was written
    // are never served. Where the pin then reads it again into 2 MiB pages
    // (repage), what came back is checked again.
    const double t0 = ms_now();
    int lock_err = mlock(c->map, (size_t)c->data_off) == 0 ? 0 : errno;
    bool ok = sums_match(c, sum_data_locking(c, true, lock_err == 0, &lock_err));
    if (ok && lock_err) {
        munlock(c->map, c->map_bytes);
        pin_refused(c, lock_err);
        ms_log(MS_LOG_INFO, "weights cache: %.1f GiB checked in %.2f s", (double)c->map_bytes / (1u << 30),
               ms_now() - t0);
    } else if (ok) {
        ms_log(MS_LOG_INFO, "weights cache: %.1f GiB locked in memory and checked in %.2f s",
               (double)c->map_bytes / (1u << 30), ms_now() - t0);
        ok = !repage(c, fd) || data_ok(c);
    }
    close(fd);
    if (!ok) {
        ms_log(MS_LOG_WARN, "preparing the weights again");
        munmap(c->map, c->map_bytes);
        c->map = NULL;
        c->map_bytes = 0;
        return false;
    }
    return true;
}

// Bytes mapped by 2 MiB page table entries (FilePmdMapped, or ShmemPmdMapped
// for tmpfs) in the mappings lying within [p, p + n), from /proc/self/smaps;
// -1 when it cannot be read.
long long weights_cache_pmd_bytes(const void *p, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "re");
    if (!f) return -1;
    const uintptr_t lo = (uintptr_t)p, hi = lo + n;
    char *line = NULL;
    size_t cap = 0;
    bool in = false;
    long long total = -1, kb;
    // Whole lines (a mapping's path can be long): a mapping's first line
    // starts "begin-end "; no field's name does.
    while (getline(&line, &cap, f) > 0) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2) {
            in = a >= lo && b <= hi;
        } else if (in && (sscanf(line, "FilePmdMapped: %lld kB", &kb) == 1 ||
                          sscanf(line, "ShmemPmdMapped: %lld kB", &kb) == 1)) {
            total = (total < 0 ? 0 : total) + kb * 1024; // tmpfs files count as shmem
        }
    }
    free(line);
    fclose(f);
    return total;
}

// Drops [off, off + len) of the mapped file from this mapping and from the
// page cache (clean pages no one else maps), so that the next touch reads it
// again from the file.
static void unpage(const struct weights_cache *c, int fd, size_t off, size_t len)
{
    char *p = (char *)c->map + off;
    munlock(p, len);
    madvise(p, len, MADV_DONTNEED);
    posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

// A file whose pages the page cache already holds in 4 KiB folios (read
// page by page by something else, or kept from an older start) stays in 4
// KiB pages even mapped as above, and a decode step then walks page tables
// for its experts (measured on the mid model, 16 streams, builds
// alternating: the MoE phase 56.9-60.0 ms a step on them, 55.1-56.5 on 2
// MiB pages). When under 90% of the locked mapping is in 2 MiB pages, and a
// first 2 MiB dropped and read again through a mapping of its own comes
// back as one (the kernel keeps this file system's pages in large folios),
// the whole file is dropped from the page cache and read again. Returns
// whether anything was read again.
static bool repage(struct weights_cache *c, int fd)
{
    const size_t huge = (size_t)2 << 20, whole = c->map_bytes & ~(huge - 1); // the tail gets none
    if (whole < 2 * huge) return false;
    const long long before = weights_cache_pmd_bytes(c->map, c->map_bytes);
    if (before < 0 || (double)before >= 0.9 * (double)whole) return false;
    const double t0 = ms_now();
    unpage(c, fd, 0, huge);
    void *p = ms_map_huge(fd, huge, PROT_READ);
    bool large = false;
    if (p != MAP_FAILED) {
        for (size_t i = 0; i < huge; i += PAGE) (void)((volatile const char *)p)[i];
        large = weights_cache_pmd_bytes(p, huge) == (long long)huge;
        munmap(p, huge);
    }
    if (large) unpage(c, fd, huge, c->map_bytes - huge);
    weights_cache_pin(c); // reads back what was dropped
    const double pct = 100.0 * (double)before / (double)c->map_bytes;
    if (!large) {
        ms_log(MS_LOG_INFO, "weights cache: %.0f%% of it is in 2 MiB pages, and its first 2 MiB "
               "read again did not come back as one (a kernel that keeps this file system's pages "
               "in 4 KiB folios, or memory too fragmented); --cache-dir none keeps the weights in "
               "anonymous memory, in 2 MiB pages", pct);
        return true; // its first 2 MiB were read again
    }
    const long long after = weights_cache_pmd_bytes(c->map, c->map_bytes);
    ms_log(MS_LOG_INFO, "weights cache: read again into 2 MiB pages in %.2f s (%.0f%% of it was in "
           "them, now %.0f%%)", ms_now() - t0, pct,
           100.0 * (double)(after > 0 ? after : 0) / (double)c->map_bytes);
    return true;
}

// The mapping is the file's page cache, which the kernel may drop under
// memory pressure (anything else reading files evicts it) and then read
// again from disk, page by page, in the middle of a decode step (measured on
// the full-size int4 model: 0.7 tokens/s with 2847 major faults in 24
// tokens). Locking the pages keeps them, and reads the file once now.
// The lock refused (the locked-memory limit): said, and the file read
// ahead at least.
static void pin_refused(const struct weights_cache *c, int e)
{
    ms_log(MS_LOG_WARN, "cannot lock the %.1f GiB of the weights cache in memory (%s): the kernel "
           "may evict them under memory pressure and read them back from disk, slowly; raise the "
           "locked-memory limit (ulimit -l, LimitMEMLOCK= in a systemd unit)",
           (double)c->map_bytes / (1u << 30), strerror(e));
    // Start reading the whole file in the background at least: the first steps need all of it.
    madvise(c->map, c->map_bytes, MADV_WILLNEED);
}

bool weights_cache_pin(struct weights_cache *c)
{
    const double t0 = ms_now();
    if (mlock(c->map, c->map_bytes) == 0) {
        ms_log(MS_LOG_INFO, "weights cache: %.1f GiB locked in memory in %.2f s",
               (double)c->map_bytes / (1u << 30), ms_now() - t0);
        return true;
    }
    pin_refused(c, errno);
    return false;
}

// Temporary files of this cache file that no writer holds any more (a start
// killed while preparing: SIGKILL, an OOM kill, a stop during the load)
// are removed: each would hold the whole file's size of disk forever. A
// writer holds an exclusive lock on its file until it commits or fails.
static void remove_orphans(const struct weights_cache *c, const char *dir)
{
    const char *slash = strrchr(c->path, '/');
    const char *base = slash ? slash + 1 : c->path;
    char prefix[512];
    if (snprintf(prefix, sizeof prefix, "%s.tmp.", base) >= (int)sizeof prefix) return;
    DIR *d = opendir(dir);
    if (!d) return;
    const int dfd = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        const int fd = openat(dfd, e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat sb;
        if (fd < 0) continue;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dfd, e->d_name, 0) == 0)
            ms_log(MS_LOG_INFO, "removed %s/%s, a weights cache an earlier start left unfinished", dir,
                   e->d_name);
        close(fd);
    }
    closedir(d);
}

bool weights_cache_create(struct weights_cache *c)
{
    const char *slash = strrchr(c->path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash ? slash - c->path : 1), slash ? c->path : ".");
    remove_orphans(c, dir);
    struct statvfs vs;
    if (statvfs(dir, &vs) == 0) {
        const uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
        // Leave room for everything else on the file system: a GiB, or a
        // twentieth of it when that is less.
        uint64_t room = (uint64_t)vs.f_blocks * vs.f_frsize / 20;
        if (room > ((uint64_t)1 << 30)) room = (uint64_t)1 << 30;
        if (avail < c->file_bytes + room) {
            ms_log(MS_LOG_WARN, "not caching the prepared weights in %s: %.2f GiB free, %.2f GiB needed "
                   "(%.2f GiB of them the file, %.2f GiB left for the rest of the file system)", dir,
                   (double)avail / (1u << 30), (double)(c->file_bytes + room) / (1u << 30),
                   (double)c->file_bytes / (1u << 30), (double)room / (1u << 30));
            return false;
        }
    }
    // A name no other writer has (two servers in containers may both be
    // pid 1), made with O_EXCL (never through a symlink planted there).
    // Locked until commit, so that another start's remove_orphans leaves it;
    // that start may have removed it between its creation and our lock (it
    // looked unheld), which fstat sees as no links left: then a new name.
    for (int tries = 0;; tries++) {
        snprintf(c->tmp, sizeof c->tmp, "%s.tmp.XXXXXX", c->path);
        c->fd = mkostemp(c->tmp, O_CLOEXEC);
        if (c->fd < 0) {
            ms_log(MS_LOG_WARN, "cannot create %s (%s): preparing the weights without a cache", c->tmp,
                   strerror(errno));
            return false;
        }
        struct stat sb;
        if (flock(c->fd, LOCK_EX) != 0) {
            // No locks on this file system (some NFS set-ups): nobody else's
            // remove_orphans can lock it either, so it is safe as it is.
            ms_log(MS_LOG_DEBUG, "cannot lock %s (%s)", c->tmp, strerror(errno));
            break;
        }
        if (fstat(c->fd, &sb) == 0 && sb.st_nlink > 0) break;
        close(c->fd);
        c->fd = -1;
        if (tries == 2) {
            ms_log(MS_LOG_WARN, "%s was removed as it was made, three times: preparing the weights "
                   "without a cache", c->tmp);
            return false;
        }
    }
    int e = posix_fallocate(c->fd, 0, (off_t)c->file_bytes);
    void *p = e ? MAP_FAILED : ms_map_huge(c->fd, (size_t)c->file_bytes, PROT_READ | PROT_WRITE);
    if (!e && p == MAP_FAILED) e = errno;
    if (e) {
        ms_log(MS_LOG_WARN, "cannot reserve %.1f GiB for %s (%s): preparing the weights without a "
               "cache", (double)c->file_bytes / (1u << 30), c->tmp, strerror(e));
        close(c->fd);
        unlink(c->tmp);
        c->fd = -1;
        return false;
    }
    c->map = p;
    c->map_bytes = (size_t)c->file_bytes;
    return true;
}

bool weights_cache_commit(struct weights_cache *c)
{
    struct disk_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.format = CACHE_FORMAT;
    h.data_off = c->data_off;
    h.packed_bytes = c->packed_bytes;
    h.made_off = c->made_off;
    h.made_bytes = c->made_bytes;
    h.file_bytes = c->file_bytes;
    h.key_len = strlen(c->key);
    h.n_sums = c->n_sums;
    sum_data(c, false);
    h.checksum = header_sum(&h, c->key, c->sums);
    // The data reaches the disk before the header that vouches for it. Read
    // only from then on: a cp over it (which truncates in place) would take
    // the pages of every server mapping it (SIGBUS); a rename replaces it.
    bool ok = msync(c->map, c->map_bytes, MS_SYNC) == 0 && fdatasync(c->fd) == 0 &&
              pwrite(c->fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
              pwrite(c->fd, c->key, h.key_len, sizeof h) == (ssize_t)h.key_len &&
              pwrite(c->fd, c->sums, h.n_sums * sizeof *c->sums, (off_t)(sizeof h + h.key_len)) ==
                  (ssize_t)(h.n_sums * sizeof *c->sums) &&
              fchmod(c->fd, 0444) == 0 &&
              fdatasync(c->fd) == 0 && rename(c->tmp, c->path) == 0;
    const int e = errno;
    mprotect(c->map, c->map_bytes, PROT_READ);
    // Read again only once committed: the disk then holds what comes back,
    // and what comes back is checked (the sums were taken in memory).
    if (weights_cache_pin(c) && ok && repage(c, c->fd) && !data_ok(c)) {
        unlink(c->path);
        c->damaged = true;
        ok = false;
    }
    close(c->fd);
    c->fd = -1;
    if (c->damaged) return false; // data_ok said why; the caller fails the load
    if (!ok) {
        unlink(c->tmp);
        ms_log(MS_LOG_WARN, "cannot write the weights cache %s (%s); the next start prepares them "
               "again", c->path, strerror(e));
        return false;
    }
    const char *slash = strrchr(c->path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash ? slash - c->path : 1), slash ? c->path : ".");
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return true;
}

void weights_cache_close(struct weights_cache *c)
{
    free(c->key);
    c->key = NULL;
    free(c->sums);
    c->sums = NULL;
    if (c->fd >= 0) {
        close(c->fd);
        unlink(c->tmp);
        c->fd = -1;
    }
}
