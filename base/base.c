// base: error sentences, clocks, core counts, half-precision conversion, logging, whole-file reads.
#include "base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/utf8.h"

int ms_log_level = MS_LOG_INFO;

const char *ms_status_name(int status)
{
    switch (status) {
    case MS_OK: return "ok";
    case MS_EINVAL: return "invalid argument";
    case MS_ENOMEM: return "out of memory";
    case MS_EIO: return "I/O error";
    case MS_EFORMAT: return "malformed input";
    case MS_ETOOLONG: return "too long";
    case MS_EBUSY: return "busy";
    case MS_ENOTFOUND: return "not found";
    case MS_EUNSUPPORTED: return "unsupported";
    case MS_ECANCELLED: return "cancelled";
    case MS_ENOFIT: return "does not fit";
    case MS_EINTERNAL: return "internal error";
    default: return "unknown error";
    }
}

int ms_err(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

double ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *ms_map_huge(int fd, size_t n, int prot)
{
    const size_t huge = (size_t)2 << 20;
    size_t span;
    if (n == 0 || ms_add_overflow(n, huge, &span)) {
        errno = n == 0 ? EINVAL : ENOMEM;
        return MAP_FAILED;
    }
    // Reserve n + 2 MiB, place the mapping at the first 2 MiB boundary in
    // it, and give back the ends.
    char *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return MAP_FAILED;
    char *a = (char *)(((uintptr_t)r + huge - 1) & ~(uintptr_t)(huge - 1));
    void *p = fd >= 0 ? mmap(a, n, prot, MAP_SHARED | MAP_FIXED, fd, 0)
                      : mmap(a, n, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
        const int e = errno;
        munmap(r, span);
        errno = e;
        return MAP_FAILED;
    }
    if (a > r) munmap(r, (size_t)(a - r));
    if (r + span > a + n) munmap(a + n, (size_t)(r + span - (a + n)));
    madvise(p, n, MADV_HUGEPAGE);
    return p;
}

int64_t ms_unix_time(void)
{
    return (int64_t)time(NULL);
}

// Up to cap - 1 bytes of a small kernel file (/proc and /sys ones say
// size 0 or 4096 whatever they hold, so ms_read_file's size check does not
// fit them), NUL-terminated; -1 when it cannot be opened or read.
static ssize_t read_small_file(const char *path, char *buf, size_t cap)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    size_t n = 0;
    while (n + 1 < cap) {
        const ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            close(fd);
            return -1;
        }
        if (k == 0) break;
        n += (size_t)k;
    }
    close(fd);
    buf[n] = 0;
    return (ssize_t)n;
}

// cpu.max holds "max PERIOD" (no quota) or "QUOTA PERIOD" in microseconds.
static int cpu_max_cores(const char *text)
{
    char *end;
    // strtoull would take a sign or spaces (and negate "-5"): digits only.
    if (text[0] < '0' || text[0] > '9') return 0;
    errno = 0;
    const unsigned long long quota = strtoull(text, &end, 10);
    if (errno || end == text || *end != ' ') return 0;
    const char *p = end + 1;
    if (p[0] < '0' || p[0] > '9') return 0;
    const unsigned long long period = strtoull(p, &end, 10);
    if (errno || end == p || period == 0 || quota == 0) return 0;
    const unsigned long long cores = quota / period + (quota % period != 0);
    return cores > 1u << 20 ? 1 << 20 : (int)cores;
}

// The cores one group's files allow, 0 for no limit: v2's cpu.max, or v1's
// cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
static int group_cores(char *dir, size_t dir_len, bool v1)
{
    char text[128];
    if (!v1) {
        memcpy(dir + dir_len, "/cpu.max", sizeof "/cpu.max");
        return read_small_file(dir, text, sizeof text) > 0 ? cpu_max_cores(text) : 0;
    }
    memcpy(dir + dir_len, "/cpu.cfs_quota_us", sizeof "/cpu.cfs_quota_us");
    if (read_small_file(dir, text, sizeof text) <= 0) return 0;
    const size_t q = strcspn(text, "\n");
    if (q + 1 >= sizeof text) return 0;
    text[q] = ' ';
    memcpy(dir + dir_len, "/cpu.cfs_period_us", sizeof "/cpu.cfs_period_us");
    if (read_small_file(dir, text + q + 1, sizeof text - q - 1) <= 0) return 0;
    return cpu_max_cores(text); // "QUOTA PERIOD", as cpu.max writes it
}

// The tighter of two limits, 0 being none.
static int tighter(int a, int b) { return a > 0 && (b == 0 || a < b) ? a : b; }

// The tightest limit of the group at mount + path and its ancestors up to
// the mount: a parent's quota bounds its children, and inside a container
// the mount is its own group while the path still names the host's.
static int tightest_cores(const char *mount, const char *path, size_t path_len, bool v1)
{
    char dir[4096 + sizeof "/cpu.cfs_period_us"];
    const size_t root_len = strlen(mount);
    if (root_len + path_len >= 4096) return 0;
    memcpy(dir, mount, root_len);
    memcpy(dir + root_len, path, path_len);
    size_t dir_len = root_len + path_len;
    while (dir_len > root_len && dir[dir_len - 1] == '/') dir_len--;
    int limit = 0;
    for (;;) {
        limit = tighter(group_cores(dir, dir_len, v1), limit);
        if (dir_len <= root_len) break;
        while (dir_len > root_len && dir[dir_len - 1] != '/') dir_len--;
        while (dir_len > root_len && dir[dir_len - 1] == '/') dir_len--;
    }
    return limit;
}

// Whether a v1 line's controller list ("4:cpu,cpuacct:/path") holds cpu.
static bool v1_line_has_cpu(const char *line, const char **path)
{
    const char *c = strchr(line, ':');
    const char *end = c ? strchr(c + 1, ':') : NULL;
    const char *nl = strchr(line, '\n');
    if (!c || !end || (nl && end > nl) || end[1] != '/') return false;
    for (const char *w = c + 1; w < end;) {
        const size_t n = strcspn(w, ",:");
        if (n == 3 && memcmp(w, "cpu", 3) == 0) {
            *path = end + 1;
            return true;
        }
        w += n + (w[n] == ',');
    }
    return false;
}

int ms_cgroup_cpu_limit(const char *proc_self_cgroup, const char *cgroup_root)
{
    char text[8192];
    if (read_small_file(proc_self_cgroup, text, sizeof text) <= 0) return 0;
    // The v2 line is "0::/path" (files under the root); a v1 line names its
    // controllers, and cpu's files are under root/cpu. A hybrid host has
    // both; the tighter wins.
    int limit = 0;
    for (const char *line = text; line && *line;) {
        const char *path = NULL;
        bool v1 = false;
        if (strncmp(line, "0::/", 4) == 0) path = line + 3;
        else v1 = v1_line_has_cpu(line, &path);
        if (path) {
            char mount[4096];
            if (snprintf(mount, sizeof mount, "%s%s", cgroup_root, v1 ? "/cpu" : "") >=
                (int)sizeof mount)
                return limit;
            int cores = tightest_cores(mount, path, strcspn(path, "\n"), v1);
            // v1's cpu controller is mounted at cpu, or only at the name of
            // its hierarchy ("cpu,cpuacct") where no link says cpu.
            const char *names = strchr(line, ':') + 1;
            const int names_len = (int)(path - 1 - names);
            if (v1 && !cores && snprintf(mount, sizeof mount, "%s/%.*s", cgroup_root, names_len, names) <
                                    (int)sizeof mount)
                cores = tightest_cores(mount, path, strcspn(path, "\n"), v1);
            limit = tighter(cores, limit);
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return limit;
}

static int cap_by_quota(int n)
{
    const int quota = ms_cgroup_cpu_limit("/proc/self/cgroup", "/sys/fs/cgroup");
    return quota > 0 && quota < n ? quota : n;
}

int ms_cpu_count(void)
{
    // A cpu_set_t holds 1024 CPUs; a larger machine's mask needs a larger
    // set, which the kernel says by EINVAL.
    for (int n_bits = 1024; n_bits <= (1 << 20); n_bits *= 2) {
        cpu_set_t *set = CPU_ALLOC(n_bits);
        if (!set) break;
        const size_t size = CPU_ALLOC_SIZE(n_bits);
        CPU_ZERO_S(size, set);
        const int rc = sched_getaffinity(0, size, set);
        const int n = rc == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (n > 0) return cap_by_quota(n);
        if (rc == 0 || errno != EINVAL) break;
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return cap_by_quota(online > 0 ? (int)online : 1);
}

float ms_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { // subnormal: renormalise
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t ms_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) // inf or NaN
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)half;
}

// Writes msg into out (cap bytes, cap >= 16) as one line of text: control
// characters (C0, DEL, C1) and bytes that are not UTF-8 become \n, \r, \t or
// \xNN / \u00NN escapes, so a client's string quoted in a log line (a path,
// an unknown JSON key) cannot forge a line or drive a terminal. Returns the
// bytes written; a message that does not fit ends in "...".
static size_t log_escape(const char *msg, size_t n, char *out, size_t cap)
{
    size_t o = 0, room = cap - 5; // "...\n" and the NUL
    for (size_t i = 0; i < n;) {
        const uint8_t *p = (const uint8_t *)msg + i;
        uint32_t cp;
        size_t k = utf8_decode(p, n - i, &cp);
        char esc[8];
        const char *put = (const char *)p;
        size_t len = k;
        if (cp == UTF8_REPLACEMENT && !(k == 3 && p[0] == 0xef)) {
            len = (size_t)snprintf(esc, sizeof esc, "\\x%02x", p[0]);
            put = esc;
        } else if (cp == '\n' || cp == '\r' || cp == '\t') {
            esc[0] = '\\';
            esc[1] = cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't';
            len = 2;
            put = esc;
        } else if (cp < 0x20 || cp == 0x7f) {
            len = (size_t)snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
            put = esc;
        } else if (cp >= 0x80 && cp < 0xa0) {
            len = (size_t)snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            put = esc;
        }
        if (o + len > room) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(out + o, put, len);
        o += len;
        i += k;
    }
    out[o++] = '\n';
    out[o] = 0;
    return o;
}

void ms_log(int level, const char *fmt, ...)
{
    if (level > ms_log_level) return;
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char msg[4096], line[8192];
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, names[level < 0 ? 0 : level > 3 ? 3 : level]);
    if (n < 0 || (size_t)n >= sizeof line) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    size_t mlen = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
    size_t len = (size_t)n + log_escape(msg, mlen, line + n, sizeof line - (size_t)n);
    if ((size_t)m > mlen && len >= 4 && memcmp(line + len - 4, "...\n", 4) &&
        len + 4 < sizeof line) // cut by msg's size: say so
        memcpy(line + len - 1, "...\n", 5);
    // One fputs per line so that lines from several threads do not interleave.
    fputs(line, stderr);
}

void ms_file_id_of(const struct stat *sb, struct ms_file_id *id)
{
    *id = (struct ms_file_id){.size = (uint64_t)sb->st_size,
                              .mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec,
                              .ctime_ns = (int64_t)sb->st_ctim.tv_sec * 1000000000 + sb->st_ctim.tv_nsec,
                              .ino = (uint64_t)sb->st_ino};
}

int ms_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                 char *err, size_t errlen)
{
    return ms_read_file_id(path, max_bytes, out, len, NULL, err, errlen);
}

int ms_read_file_id(const char *path, size_t max_bytes, char **out, size_t *len,
                    struct ms_file_id *id, char *err, size_t errlen)
{
    *out = NULL;
    if (len) *len = 0;
    // Non-blocking: opening a FIFO (or a device) to read would wait for a
    // writer forever, before the check below could refuse it. Reads of a
    // regular file are the same either way.
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        const int e = errno;
        if (fd >= 0) close(fd);
        return ms_err(err, errlen, e == ENOENT ? MS_ENOTFOUND : MS_EIO, "cannot open %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return ms_err(err, errlen, MS_EIO, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        return ms_err(err, errlen, MS_EFORMAT, "%s is %lld bytes, more than the %zu allowed",
                      path, (long long)st.st_size, max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory reading %s (%zu bytes)", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    int rerr = ferror(f);
    fclose(f);
    if (got != n || rerr) {
        free(buf);
        return ms_err(err, errlen, MS_EIO, "short read on %s: %zu of %zu bytes", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    if (id) ms_file_id_of(&st, id);
    return 0;
}

int ms_path_join(char *out, size_t outlen, const char *dir, const char *name)
{
    int n = snprintf(out, outlen, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= outlen) return MS_EINVAL;
    return 0;
}
