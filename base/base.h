// base: error codes, error-buffer formatting, overflow-checked size arithmetic,
// the monotonic clock, bf16/f16 conversion and logging. The bottom of the tree.
#ifndef MOESERVE_BASE_BASE_H
#define MOESERVE_BASE_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Functions return 0 on success or one of these; api/ maps them to HTTP
// statuses and OpenAI error types. The human sentence travels separately in
// a caller-owned buffer (char *err, size_t errlen).
enum ms_status {
    MS_OK = 0,
    MS_EINVAL = -1,       // a bad argument or request parameter (400)
    MS_ENOMEM = -2,       // allocation failed (500)
    MS_EIO = -3,          // a file or socket error (500 / load error)
    MS_EFORMAT = -4,      // malformed input bytes: JSON, safetensors, tokenizer (400 / load error)
    MS_ETOOLONG = -5,     // prompt + max_tokens beyond max_model_len (400)
    MS_EBUSY = -6,        // waiting queue full, draining (503)
    MS_ENOTFOUND = -7,    // unknown model, path, tensor (404 / load error)
    MS_EUNSUPPORTED = -8, // a setting we do not implement (400 / load error)
    MS_ECANCELLED = -9,   // the request was cancelled
    MS_ENOFIT = -10,      // does not fit one rank's KV pool, or the device (400 / start-up error)
    MS_EINTERNAL = -11,   // a bug (500)
};

const char *ms_status_name(int status);

// Formats a sentence into err (if err is non-NULL) and returns code, so that
// error paths read `return ms_err(err, errlen, MS_EFORMAT, "...", ...);`.
int ms_err(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Overflow-checked arithmetic for every size computed from untrusted bytes.
// They return true when the result overflowed (like the builtins).
static inline bool ms_add_overflow(size_t a, size_t b, size_t *r) { return __builtin_add_overflow(a, b, r); }
static inline bool ms_mul_overflow(size_t a, size_t b, size_t *r) { return __builtin_mul_overflow(a, b, r); }
static inline bool ms_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_add_overflow(a, b, r); }
static inline bool ms_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *r) { return __builtin_mul_overflow(a, b, r); }

// Seconds on the monotonic clock, and wall-clock Unix seconds.
double ms_now(void);

// n bytes (n > 0) mapped at a 2 MiB boundary with huge pages asked for
// (MADV_HUGEPAGE): fd's first n bytes shared (fd >= 0), or zeroed private
// memory committed as it is touched (fd < 0). A range touched once then
// costs one fault per 2 MiB instead of 512 (a 4 KiB fault took 8.7 us on
// the VMs we run on: the first touch of a 400 MiB workspace 890 ms against
// 24 ms) and reads walk one TLB entry per 2 MiB. Where the kernel has no
// huge page to give, the same memory in 4 KiB pages. MAP_FAILED with
// errno set on failure; munmap(p, n) gives it back.
void *ms_map_huge(int fd, size_t n, int prot);
int64_t ms_unix_time(void);

// Cores this process may run on, at least 1: its CPU affinity mask
// (taskset, systemd's CPUAffinity=, docker --cpuset-cpus), else the online
// cores, and no more than its cgroup's CPU quota allows (docker --cpus,
// systemd's CPUQuota=, a Kubernetes CPU limit; ms_cgroup_cpu_limit). Every
// "all cores" default reads this one count, since a thread pool that spins
// with more threads than it has cores loses each step to the scheduler.
int ms_cpu_count(void);

// The CPU quota, in whole cores rounded up, of the cgroups that
// proc_self_cgroup names: v2's "0::/path" (cpu.max under cgroup_root) and
// v1's cpu controller ("N:cpu,cpuacct:/path", cpu.cfs_quota_us and
// cpu.cfs_period_us under cgroup_root/cpu), the tightest of each group's and
// its ancestors'; 0 when none is set or the files cannot be read. The paths are parameters for the tests
// ("/proc/self/cgroup" and "/sys/fs/cgroup" in use).
int ms_cgroup_cpu_limit(const char *proc_self_cgroup, const char *cgroup_root);

// bf16 is the top half of an fp32; conversion to it rounds to nearest even.
static inline float ms_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t ms_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float ms_f16_to_f32(uint16_t h);

// A hex digit's value (either case), -1 for any other character.
static inline int ms_hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
uint16_t ms_f32_to_f16(float f);

// Logging to stderr with a timestamp. Level: 0 error, 1 warn, 2 info, 3 debug.
enum { MS_LOG_ERROR, MS_LOG_WARN, MS_LOG_INFO, MS_LOG_DEBUG };
extern int ms_log_level;
void ms_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Reads a whole file into a NUL-terminated malloc'd buffer; refuses files
// larger than max_bytes. Returns 0 or a negative status with err filled.
int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                 char *err, size_t errlen);

// One version of a file, as what is made from it (a cache of prepared
// weights) is keyed: a file replaced in place keeping its size and
// modification time (cp -p, a normalized mtime) still gets another inode
// or change time, which no user can set.
struct ms_file_id {
    uint64_t size;
    int64_t mtime_ns, ctime_ns;
    uint64_t ino;
};
struct stat;
void ms_file_id_of(const struct stat *sb, struct ms_file_id *id);

// ms_read_file, and *id (when not NULL) the version read: taken from the
// open file, so a file replaced by its path meanwhile is not mistaken for it.
int ms_read_file_id(const char *path, size_t max_bytes, char **out, size_t *len,
                    struct ms_file_id *id, char *err, size_t errlen);

// Joins dir and name into out; returns MS_EINVAL when it does not fit.
int ms_path_join(char *out, size_t outlen, const char *dir, const char *name);

#endif
