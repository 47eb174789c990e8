// Pins the base helpers: bf16/f16 rounding, overflow checks, arena alignment,
// huge-page mappings, error buffers, log lines and the core count under a
// cgroup's CPU quota.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/arena.h"
#include "base/base.h"

static void bf16_rounds_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(ms_f32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 is exactly halfway between two bf16 values: rounds to even (1.0).
    assert_int_equal(ms_f32_to_bf16(1.00390625f), 0x3f80);
    // 1 + 3*2^-8 is halfway too: rounds up to the even neighbour.
    assert_int_equal(ms_f32_to_bf16(1.01171875f), 0x3f82);
    assert_true(ms_bf16_to_f32(ms_f32_to_bf16(-2.5f)) == -2.5f);
}

static void f16_round_trips_normals_and_subnormals(void **state)
{
    (void)state;
    const float vals[] = {0.0f, 1.0f, -1.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        assert_true(ms_f16_to_f32(ms_f32_to_f16(vals[i])) == vals[i]);
    assert_int_equal(ms_f32_to_f16(1e6f), 0x7c00); // overflow to inf
}

static void size_arithmetic_reports_overflow(void **state)
{
    (void)state;
    size_t r;
    assert_true(ms_add_overflow(SIZE_MAX, 1, &r));
    assert_false(ms_add_overflow(1, 2, &r));
    assert_int_equal(r, 3);
    assert_true(ms_mul_overflow(SIZE_MAX / 2 + 1, 2, &r));
}

static void arena_allocations_are_aligned_and_distinct(void **state)
{
    (void)state;
    struct arena *a = arena_create(256);
    assert_non_null(a);
    char *prev = NULL;
    for (int i = 1; i < 200; i++) {
        char *p = arena_alloc(a, (size_t)i);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        memset(p, 0xab, (size_t)i);
        assert_ptr_not_equal(p, prev);
        prev = p;
    }
    char *big = arena_alloc(a, 100000);
    assert_non_null(big);
    memset(big, 1, 100000);
    assert_null(arena_alloc(a, SIZE_MAX));
    assert_string_equal(arena_strdup(a, "hello"), "hello");
    arena_destroy(a);
}

static void err_fills_buffer_and_returns_code(void **state)
{
    (void)state;
    char err[32];
    assert_int_equal(ms_err(err, sizeof err, MS_EINVAL, "bad %s", "thing"), MS_EINVAL);
    assert_string_equal(err, "bad thing");
    assert_int_equal(ms_err(NULL, 0, MS_EIO, "ignored"), MS_EIO);
}

// Runs ms_log with what a client controls and returns what it wrote to stderr.
static char *logged(const char *what)
{
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    dup2(fileno(tmp), 2);
    ms_log(MS_LOG_INFO, "GET %s 404", what);
    ms_log(MS_LOG_INFO, "next");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long n = ftell(tmp);
    char *out = calloc(1, (size_t)n + 1);
    rewind(tmp);
    assert_int_equal(fread(out, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return out;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// A client's newline must not forge a log line, however long the entry.
static void log_lines_cannot_be_forged(void **state)
{
    (void)state;
    char *out = logged("/x\n2026-01-01T00:00:00.000Z INFO 10.0.0.1 POST /admin 200\r\x1b[2J\x7f\xc2\x9b\xff");
    assert_int_equal(count_lines(out), 2);
    assert_non_null(strstr(out, "/x\\n2026-01-01T00:00:00.000Z INFO 10.0.0.1 POST /admin 200\\r\\x1b[2J"
                                "\\x7f\\u009b\\xff 404\n"));
    free(out);
    // Past 2 KB, and past the buffer: still one line each, cut with "...".
    char *big = malloc(20000);
    for (int i = 0; i < 19999; i++) big[i] = i % 100 == 99 ? '\n' : 'a' + i % 26;
    big[19999] = 0;
    out = logged(big);
    assert_int_equal(count_lines(out), 2);
    assert_non_null(strstr(out, "...\n"));
    assert_true(strlen(out) > 4000);
    assert_non_null(strstr(out, "INFO next\n"));
    free(out);
    free(big);
    // Valid UTF-8 passes unchanged.
    out = logged("/caf\xc3\xa9/\xe4\xb8\xad");
    assert_non_null(strstr(out, "GET /caf\xc3\xa9/\xe4\xb8\xad 404\n"));
    free(out);
}

// ms_map_huge: 2 MiB-aligned, zeroed and writable anonymous memory of any
// length; a file's bytes shared both ways; nothing for zero bytes or a
// length past the address space.
static void huge_mappings_are_aligned_zeroed_and_shared(void **state)
{
    (void)state;
    const size_t huge = (size_t)2 << 20, n = 3 * huge + 5;
    unsigned char *p = ms_map_huge(-1, n, PROT_READ | PROT_WRITE);
    assert_true(p != MAP_FAILED);
    assert_int_equal((uintptr_t)p % huge, 0);
    for (size_t i = 0; i < n; i += 4093) assert_int_equal(p[i], 0);
    assert_int_equal(p[n - 1], 0);
    p[0] = 1;
    p[n - 1] = 2;
    assert_int_equal(p[0] + p[n - 1], 3);
    assert_int_equal(munmap(p, n), 0);

    char path[] = "/tmp/moeserve-test-huge-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(pwrite(fd, "weights", 7, 4096), 7);
    char *f = ms_map_huge(fd, 8192, PROT_READ | PROT_WRITE);
    assert_true(f != MAP_FAILED);
    assert_int_equal((uintptr_t)f % huge, 0);
    assert_memory_equal(f + 4096, "weights", 7);
    memcpy(f, "packed", 6);
    char back[6];
    assert_int_equal(pread(fd, back, 6, 0), 6);
    assert_memory_equal(back, "packed", 6);
    assert_int_equal(munmap(f, 8192), 0);
    close(fd);

    errno = 0;
    assert_true(ms_map_huge(-1, 0, PROT_READ) == MAP_FAILED);
    assert_int_equal(errno, EINVAL);
    assert_true(ms_map_huge(-1, SIZE_MAX - 4096, PROT_READ) == MAP_FAILED);
    assert_int_equal(errno, ENOMEM);
}

// A FIFO where a file is expected (a config.json, say) is refused at once:
// opening one to read would wait for a writer forever.
static void reading_a_fifo_is_refused_not_waited_on(void **state)
{
    (void)state;
    char dir[] = "/tmp/moeserve-fifo-XXXXXX", path[64], err[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(ms_read_file(path, 1 << 20, &buf, &len, err, sizeof err), MS_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    assert_null(buf);
    unlink(path);
    rmdir(dir);
}

// Writes text to dir/rel, making the folders on the way.
static void put_file(const char *dir, const char *rel, const char *text)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    for (char *slash = path + strlen(dir) + 1; (slash = strchr(slash, '/')); slash++) {
        *slash = 0;
        mkdir(path, 0700);
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

// A quota in a cgroup (docker --cpus 1.5, systemd's CPUQuota=150%, a
// Kubernetes limit) caps the cores a pool spins on, rounded up; the tightest
// of the group and its ancestors wins; "max", v1-only hierarchies, missing
// and malformed files set no limit.
static void cgroup_quota_caps_the_cores(void **state)
{
    (void)state;
    char dir[] = "/tmp/moeserve-cgroup-XXXXXX", proc[64], root[64];
    assert_non_null(mkdtemp(dir));
    snprintf(proc, sizeof proc, "%s/cgroup", dir);
    snprintf(root, sizeof root, "%s/fs", dir);
    put_file(dir, "cgroup", "12:cpu,cpuacct:/docker/x\n0::/system.slice/moeserve.service\n");
    put_file(dir, "fs/system.slice/moeserve.service/cpu.max", "150000 100000\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 2);
    put_file(dir, "fs/system.slice/cpu.max", "100000 100000\n"); // the parent is tighter
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 1);
    put_file(dir, "fs/system.slice/cpu.max", "max 100000\n");
    put_file(dir, "fs/system.slice/moeserve.service/cpu.max", "max 100000\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 0);
    put_file(dir, "fs/cpu.max", "250000 100000\n"); // a container's own root
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 3);
    put_file(dir, "cgroup", "0::/\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 3);
    put_file(dir, "fs/cpu.max", "18446744073709551615 1\n"); // no overflow
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 1 << 20);
    const char *malformed[] = {"", "abc 100000", "100000 0", "0 100000", "100000", "-5 100000",
                               "99999999999999999999999 1"};
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
        put_file(dir, "fs/cpu.max", malformed[i]);
        assert_int_equal(ms_cgroup_cpu_limit(proc, root), 0);
    }
    put_file(dir, "cgroup", "4:memory:/x\n1:cpuacct:/\n"); // v1, no cpu controller
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 0);
    // v1 (docker on an older host): cpu.cfs_quota_us over cpu.cfs_period_us
    // under root/cpu; -1 is no quota. Inside a container the mount is its
    // own group while the path names the host's, which the walk up finds.
    put_file(dir, "cgroup", "5:memory:/docker/c1\n3:cpu,cpuacct:/docker/c1\n0::/\n");
    put_file(dir, "fs/cpu.max", "max 100000\n");
    put_file(dir, "fs/cpu/cpu.cfs_quota_us", "-1\n");
    put_file(dir, "fs/cpu/cpu.cfs_period_us", "100000\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 0);
    put_file(dir, "fs/cpu/cpu.cfs_quota_us", "350000\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 4);
    put_file(dir, "fs/cpu/docker/c1/cpu.cfs_quota_us", "50000\n");
    put_file(dir, "fs/cpu/docker/c1/cpu.cfs_period_us", "100000\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 1);
    put_file(dir, "fs/cpu/docker/c1/cpu.cfs_period_us", "0\n");
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 4);
    // Mounted only under the hierarchy's name, with no cpu link.
    char moved[128], to[128];
    snprintf(moved, sizeof moved, "%s/fs/cpu", dir);
    snprintf(to, sizeof to, "%s/fs/cpu,cpuacct", dir);
    assert_int_equal(rename(moved, to), 0);
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 4);
    assert_int_equal(rename(to, moved), 0);
    put_file(dir, "fs/cpu.max", "200000 100000\n"); // both hierarchies: the tighter
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 2);
    put_file(dir, "cgroup", "3:cpu\n3:cpu:\n3:cpux:/\n3:,cpu\n::\n0::\n0:/\n"); // none names a group
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 0);
    char long_line[9000] = "0::/";
    memset(long_line + 4, 'a', sizeof long_line - 6);
    long_line[sizeof long_line - 2] = '\n';
    put_file(dir, "cgroup", long_line); // a path longer than any the check builds
    assert_int_equal(ms_cgroup_cpu_limit(proc, root), 0);
    assert_int_equal(ms_cgroup_cpu_limit("/nonexistent/cgroup", root), 0);
    assert_true(ms_cpu_count() >= 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_rounds_to_nearest_even),
        cmocka_unit_test(f16_round_trips_normals_and_subnormals),
        cmocka_unit_test(size_arithmetic_reports_overflow),
        cmocka_unit_test(arena_allocations_are_aligned_and_distinct),
        cmocka_unit_test(huge_mappings_are_aligned_zeroed_and_shared),
        cmocka_unit_test(err_fills_buffer_and_returns_code),
        cmocka_unit_test(log_lines_cannot_be_forged),
        cmocka_unit_test(reading_a_fifo_is_refused_not_waited_on),
        cmocka_unit_test(cgroup_quota_caps_the_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
