// weights_cache: the CPU backend's prepared weights (packed, quantized,
// made for a dummy load) kept in a file that the next start maps instead of
// preparing them again — minutes for a full-size model quantized at load,
// a fraction of a second mapped.
//
// A file is named after what it holds (the model's path, the kernel table,
// the quantization, the dummy seed) and keyed by everything its bytes depend
// on: moeserve's version and a format version, the same, config.json's and
// every safetensors file's name, size, modification and change times and
// inode, and the sizes of the prepared areas. It starts with a header
// (magic, sizes, the key text, a checksum of each 64 MiB of the data, a
// checksum over all of those), then the packed area and the made area, each
// page-aligned. It is written under a temporary name of its own (O_EXCL,
// locked while written; one no writer holds is an earlier start's leftover
// and removed), synced, made read-only and renamed into place. A file whose
// header is truncated, corrupt or keyed otherwise, whose data fails its
// checksums (checked at every start on every core, each locking a piece
// of the file and checking it: 0.1-0.2 s a GiB on two in the page cache), or that is not a regular file of this user's that no one
// else can write, is never trusted (the weights are prepared again and the
// file replaced). The check is once, at start: without the lock (ulimit -l)
// the kernel may drop pages and read them again later, unchecked.
#ifndef MOESERVE_MODEL_CPU_WEIGHTS_CACHE_H
#define MOESERVE_MODEL_CPU_WEIGHTS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

// Prepared weights below this many bytes are cached only when the model's
// cache_dir names a directory: they are quicker to prepare than to map.
#define WEIGHTS_CACHE_MIN_BYTES ((uint64_t)1 << 30)
// The data (from data_off to the end) has a checksum per this many bytes,
// so that the check runs on every core and names where the damage is.
#define WEIGHTS_CACHE_SUM_BYTES ((uint64_t)64 << 20)

// One cache file, being read or written. Owned by its caller; the mapping
// (map, map_bytes) outlives weights_cache_close when kept (see below).
struct weights_cache {
    char path[4096];
    char *key;                  // the key text (malloc'd)
    uint64_t *sums;             // (n_sums) each WEIGHTS_CACHE_SUM_BYTES of the data's checksum (malloc'd)
    uint64_t n_sums;
    uint64_t packed_bytes, made_bytes;
    uint64_t data_off;          // where the packed area starts
    uint64_t made_off;          // where the made area starts
    uint64_t file_bytes;
    void *map;                  // the whole file, mapped
    size_t map_bytes;
    int fd;                     // a file being written, else -1
    bool damaged;               // commit read the data back from the disk and it failed its sums:
                                // the mapping's weights must not be used
    char tmp[4200];             // its temporary name
};

// Whether m's weights prepared for table `kernels` (packed_bytes and
// made_bytes of them) are cached, and where: fills c (path, key, layout)
// and returns 1; 0 when they are not (cache_dir "none", below
// WEIGHTS_CACHE_MIN_BYTES without a cache_dir, or no usable directory, said
// in a log line); a negative code when out of memory.
int weights_cache_open(struct weights_cache *c, const struct model *m, const char *kernels,
                       uint64_t packed_bytes, uint64_t made_bytes);

// Maps c's file read-only when its header matches c's key and layout and
// its data its checksums: returns true with c->map set. False when there
// is none, or it is stale or corrupt (logged): then prepare the weights and
// write them.
bool weights_cache_map(struct weights_cache *c);

// A new cache file under a temporary name, its full size reserved on disk
// (so that a full disk fails here, not as a fault while writing it) and
// mapped read-write: prepare the weights into c->map + data_off and
// + made_off, then commit. False (logged) when the file cannot be made.
bool weights_cache_create(struct weights_cache *c);
// Sums the data, syncs it, writes the header, syncs and renames the file
// into place. Where it then reads the file back into 2 MiB pages, it checks
// what came back: a mismatch (the disk damaged it) removes the file and
// sets c->damaged.
// The mapping stays valid either way (it becomes read-only); false (logged)
// when the file could not be committed (it is then removed).
bool weights_cache_commit(struct weights_cache *c);

// Locks the mapped file in memory (reading what is not in the page cache),
// so that it stays resident like anonymous memory, and returns true; when
// the locked-memory limit refuses, says so, only starts reading it ahead
// and returns false. Called by weights_cache_map and weights_cache_commit,
// which then read the file again into 2 MiB pages where it needs that
// (weights_cache_pmd_bytes).
bool weights_cache_pin(struct weights_cache *c);

// Bytes mapped by 2 MiB page table entries in the mappings lying within
// [p, p + n) (/proc/self/smaps' FilePmdMapped, and ShmemPmdMapped for
// tmpfs); -1 when that cannot be read.
long long weights_cache_pmd_bytes(const void *p, size_t n);

// Frees the key and the sums; removes a temporary file not committed. Leaves the
// mapping: the caller unmaps it (munmap(map, map_bytes)) when it keeps the
// weights no longer.
void weights_cache_close(struct weights_cache *c);

#endif
