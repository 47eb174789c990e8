// Pins safetensors validation: well-formed single and sharded files map
// correctly; every malformed header or layout is a clear error, never a crash.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/safetensors.h"

static char tmpdir[256];

static int make_tmpdir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/moeserve-st-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *out, size_t len, const char *sub, const char *name)
{
    snprintf(out, len, "%s/%s", tmpdir, sub);
    if (name) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", out);
        assert_int_equal(system(cmd), 0);
        size_t n = strlen(out);
        snprintf(out + n, len - n, "/%s", name);
    }
}

// Writes an 8-byte length (hlen, or the header's own length when hlen is
// UINT64_MAX, the header then padded with spaces to 8 bytes as real writers
// do, so that alignment is each test's choice), the header text, and
// data_bytes bytes counting 0, 1, 2, ...
static void write_raw(const char *path, uint64_t hlen, const char *text, size_t data_bytes)
{
    char header[2048];
    snprintf(header, sizeof header, "%s", text);
    if (hlen == UINT64_MAX)
        while (strlen(header) % 8) strcat(header, " ");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = hlen == UINT64_MAX ? strlen(header) : hlen;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(n >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0xff), f);
    assert_int_equal(fclose(f), 0);
}

static void write_all_bytes(const char *path, const char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

// Opens a file holding header + data and expects failure with status rc
// and an error containing want.
static void expect_error(const char *header, size_t data_bytes, int rc, const char *want)
{
    char path[512];
    path_in(path, sizeof path, "bad.safetensors", NULL);
    write_raw(path, UINT64_MAX, header, data_bytes);
    struct safetensors *st = NULL;
    char err[1024] = "";
    int got = safetensors_open_file(path, &st, err, sizeof err);
    if (got != rc || !strstr(err, want) || st)
        fail_msg("header %s: rc %d (want %d), err \"%s\" (want \"%s\")", header, got, rc, err,
                 want);
}

// Two aligned tensors with 8 + 8 bytes of data; the header is padded to 8 bytes.
#define GOOD_HEADER                                                                       \
    "{\"__metadata__\":{\"format\":\"pt\"},"                                             \
    "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"                   \
    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}"

static void well_formed_file_maps_every_tensor(void **state)
{
    (void)state;
    char path[512];
    path_in(path, sizeof path, "good.safetensors", NULL);
    write_raw(path, UINT64_MAX, GOOD_HEADER, 16);
    struct safetensors *st = NULL;
    char err[1024] = "";
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), 0);
    assert_int_equal(safetensors_count(st), 2);
    const struct st_tensor *a = safetensors_find(st, "a"), *b = safetensors_find(st, "b");
    assert_non_null(a);
    assert_non_null(b);
    assert_null(safetensors_find(st, "c"));
    assert_null(safetensors_find(st, "__metadata__"));
    assert_true(a->supported);
    assert_int_equal(a->dtype, DTYPE_BF16);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 2);
    assert_int_equal(a->nbytes, 8);
    assert_int_equal(b->dtype, DTYPE_F32);
    assert_int_equal(b->nbytes, 8);
    assert_string_equal(a->file, "good.safetensors");
    // Data is where the offsets say: byte i of the data section holds i.
    assert_int_equal(((const uint8_t *)a->data)[0], 0);
    assert_int_equal(((const uint8_t *)b->data)[0], 8);
    assert_int_equal(((const uint8_t *)b->data)[7], 15);
    assert_ptr_equal(safetensors_get(st, 0), a); // name order
    assert_null(safetensors_get(st, 2));
    safetensors_close(st);
}

static void known_dtypes_we_do_not_compute_with_are_listed_unsupported(void **state)
{
    (void)state;
    char path[512];
    path_in(path, sizeof path, "i64.safetensors", NULL);
    write_raw(path, UINT64_MAX,
              "{\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16);
    struct safetensors *st = NULL;
    char err[1024] = "";
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), 0);
    const struct st_tensor *t = safetensors_find(st, "pos");
    assert_non_null(t);
    assert_false(t->supported);
    assert_string_equal(t->dtype_str, "I64");
    safetensors_close(st);
}

static void truncated_and_absurd_lengths_are_refused(void **state)
{
    (void)state;
    char path[512];
    path_in(path, sizeof path, "short.safetensors", NULL);
    FILE *f = fopen(path, "wb");
    fputs("abcde", f);
    fclose(f);
    struct safetensors *st = NULL;
    char err[1024] = "";
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "truncated"));

    path_in(path, sizeof path, "empty.safetensors", NULL);
    f = fopen(path, "wb");
    fclose(f);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "0 bytes"));

    // Header length past the end of the file.
    path_in(path, sizeof path, "past.safetensors", NULL);
    write_raw(path, 1000, "{}", 40);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "runs past the end"));

    // An absurd header length (2^60, and 2^64 - 1).
    write_raw(path, 1ull << 60, "{}", 40);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "limit"));
    write_raw(path, UINT64_MAX - 1, "{}", 40);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_EFORMAT);

    // A header with no tensors at all (fuzzing found finish() sorting a NULL
    // table): an empty set, opened and closed cleanly.
    write_raw(path, 8, "{}      ", 8);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), 0);
    assert_int_equal(safetensors_count(st), 0);
    assert_null(safetensors_find(st, "a"));
    safetensors_close(st);

    // A file cut short inside the data section.
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4,4],\"data_offsets\":[0,32]}}", 16,
                 MS_EFORMAT, "past the end of the data section");

    path_in(path, sizeof path, "missing.safetensors", NULL);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_ENOTFOUND);
    assert_null(st);

    // A FIFO in a shard's place: refused at once (an open to read would
    // wait for a writer forever).
    path_in(path, sizeof path, "fifo.safetensors", NULL);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(safetensors_open_file(path, &st, err, sizeof err), MS_EIO);
    assert_non_null(strstr(err, "not a regular file"));
    assert_null(st);
    unlink(path);
}

static void malformed_headers_are_refused(void **state)
{
    (void)state;
    expect_error("{\"a\":{\"dtype\":\"BF16\",", 8, MS_EFORMAT, "not valid JSON");
    expect_error("[1,2,3]", 8, MS_EFORMAT, "not a JSON object");
    expect_error("\"x\"", 8, MS_EFORMAT, "not valid JSON"); // jansson rejects top-level strings
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
                 8, MS_EFORMAT, "not valid JSON"); // duplicate names
    expect_error("{\"a\":5}", 8, MS_EFORMAT, "not an object");
    expect_error("{\"a\":{\"shape\":[2],\"data_offsets\":[0,4]}}", 8, MS_EFORMAT, "dtype");
    expect_error("{\"a\":{\"dtype\":\"BF17\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8,
                 MS_EFORMAT, "unknown dtype \"BF17\"");
    expect_error("{\"a\":{\"dtype\":16,\"shape\":[2],\"data_offsets\":[0,4]}}", 8, MS_EFORMAT,
                 "dtype");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[-2],\"data_offsets\":[0,4]}}", 8,
                 MS_EFORMAT, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 8,
                 MS_EFORMAT, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                 "\"data_offsets\":[0,2]}}", 8, MS_EFORMAT, "9 dimensions");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
                 MS_EFORMAT, "data_offsets");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[-4,0]}}", 8,
                 MS_EFORMAT, "data_offsets");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,0]}}", 8,
                 MS_EFORMAT, "end before they begin");
    expect_error("{\"__metadata__\":[1],\"a\":{\"dtype\":\"BF16\",\"shape\":[2],"
                 "\"data_offsets\":[0,4]}}", 8, MS_EFORMAT, "__metadata__");
}

static void offsets_outside_or_overlapping_are_refused(void **state)
{
    (void)state;
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}", 8,
                 MS_EFORMAT, "past the end of the data section");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],"
                 "\"data_offsets\":[9223372036854775800,9223372036854775804]}}", 8, MS_EFORMAT,
                 "past the end");
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[4,12]}}", 16,
                 MS_EFORMAT, "overlap");
    // Identical ranges overlap too.
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 16,
                 MS_EFORMAT, "overlap");
    // One range inside another (not adjacent in sort order to its end).
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}", 16,
                 MS_EFORMAT, "overlap");
    // An F32 tensor at an odd offset.
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 8,
                 MS_EFORMAT, "aligned");
}

static void sizes_that_overflow_or_disagree_are_refused(void **state)
{
    (void)state;
    // 2^40 cubed overflows 64 bits; so does 2^62 elements of 4 bytes.
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[1099511627776,1099511627776,"
                 "1099511627776],\"data_offsets\":[0,8]}}", 8, MS_EFORMAT, "overflows");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                 "\"data_offsets\":[0,8]}}", 8, MS_EFORMAT, "overflows");
    // An element count past jansson's integers is bad JSON, not a wrap-around.
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[99999999999999999999],"
                 "\"data_offsets\":[0,8]}}", 8, MS_EFORMAT, "not valid JSON");
    // Byte length != product(shape) * element size.
    expect_error("{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                 MS_EFORMAT, "holds 8 bytes but its shape and dtype BF16 need 6");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8,
                 MS_EFORMAT, "need 16");
}

static void write_index(const char *dir, const char *body)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
}

// A checkpoint in two shards, a.bin holding x and y, b.bin holding z.
static void make_sharded(const char *sub, char *dir, size_t len)
{
    char path[512];
    path_in(path, sizeof path, sub, "one.safetensors");
    write_raw(path, UINT64_MAX,
              "{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
              "\"y\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}",
              8);
    path_in(path, sizeof path, sub, "two.safetensors");
    write_raw(path, UINT64_MAX,
              "{\"z\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[0,4]}}", 4);
    path_in(dir, len, sub, NULL);
}

static void sharded_checkpoint_opens_through_its_index(void **state)
{
    (void)state;
    char dir[512];
    make_sharded("sharded", dir, sizeof dir);
    write_index(dir, "{\"metadata\":{\"total_size\":12},\"weight_map\":{"
                     "\"x\":\"one.safetensors\",\"y\":\"one.safetensors\","
                     "\"z\":\"two.safetensors\"}}");
    struct safetensors *st = NULL;
    char err[1024] = "";
    assert_int_equal(safetensors_open_dir(dir, &st, err, sizeof err), 0);
    assert_int_equal(safetensors_count(st), 3);
    const struct st_tensor *z = safetensors_find(st, "z");
    assert_non_null(z);
    assert_string_equal(z->file, "two.safetensors");
    assert_int_equal(z->dtype, DTYPE_F16);
    assert_int_equal(z->shape[1], 2);
    assert_string_equal(safetensors_find(st, "y")->file, "one.safetensors");
    assert_int_equal(((const uint8_t *)safetensors_find(st, "y")->data)[0], 4);
    safetensors_close(st);
}

static void expect_dir_error(const char *dir, int rc, const char *want)
{
    struct safetensors *st = NULL;
    char err[1024] = "";
    int got = safetensors_open_dir(dir, &st, err, sizeof err);
    if (got != rc || !strstr(err, want) || st)
        fail_msg("%s: rc %d (want %d), err \"%s\" (want \"%s\")", dir, got, rc, err, want);
}

static void broken_shard_sets_are_refused(void **state)
{
    (void)state;
    char dir[512];
    make_sharded("broken", dir, sizeof dir);
    write_index(dir, "{\"weight_map\":{\"x\":\"one.safetensors\",\"z\":\"three.safetensors\"}}");
    expect_dir_error(dir, MS_ENOTFOUND, "shard three.safetensors");
    write_index(dir, "{\"weight_map\":{\"x\":\"one.safetensors\",\"w\":\"two.safetensors\"}}");
    expect_dir_error(dir, MS_EFORMAT, "maps tensor w to two.safetensors, but two.safetensors "
                                      "has no such tensor");
    write_index(dir, "{\"weight_map\":{\"x\":\"one.safetensors\",\"y\":\"two.safetensors\"}}");
    expect_dir_error(dir, MS_EFORMAT, "but it is in one.safetensors");
    write_index(dir, "{\"weight_map\":{\"x\":\"../one.safetensors\"}}");
    expect_dir_error(dir, MS_EFORMAT, "file name in the checkpoint directory");
    write_index(dir, "{\"weight_map\":{\"x\":7}}");
    expect_dir_error(dir, MS_EFORMAT, "weight_map[\"x\"]");
    write_index(dir, "{\"weight_map\":{}}");
    expect_dir_error(dir, MS_EFORMAT, "empty");
    write_index(dir, "{\"metadata\":{}}");
    expect_dir_error(dir, MS_EFORMAT, "no weight_map");
    write_index(dir, "{\"weight_map\":");
    expect_dir_error(dir, MS_EFORMAT, "not valid JSON");

    // The same tensor name in two shards.
    char path[512];
    path_in(path, sizeof path, "broken", "three.safetensors");
    write_raw(path, UINT64_MAX,
              "{\"x\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4);
    write_index(dir, "{\"weight_map\":{\"x\":\"one.safetensors\",\"z\":\"three.safetensors\"}}");
    expect_dir_error(dir, MS_EFORMAT, "appears in both");

    // A shard that is itself malformed reports that shard.
    path_in(path, sizeof path, "broken", "three.safetensors");
    write_raw(path, 500, "{}", 4);
    expect_dir_error(dir, MS_EFORMAT, "three.safetensors: header length 500");

    char empty[512];
    path_in(empty, sizeof empty, "nothing", "x");
    empty[strlen(empty) - 2] = 0;
    expect_dir_error(empty, MS_ENOTFOUND, "neither model.safetensors nor");
}

// The golden checkpoint cut at every interesting place fails cleanly.
static void truncated_real_checkpoint_is_refused(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    assert_non_null(data);
    char src[512], *bytes = NULL;
    size_t len = 0;
    char err[1024] = "";
    snprintf(src, sizeof src, "%s/qwen3moe-v2048/model.safetensors", data);
    assert_int_equal(ms_read_file(src, 64u << 20, &bytes, &len, err, sizeof err), 0);
    const size_t cuts[] = {0, 7, 8, 100, 19480, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char path[512];
        path_in(path, sizeof path, "cut.safetensors", NULL);
        FILE *f = fopen(path, "wb");
        assert_int_equal(fwrite(bytes, 1, cuts[i], f), cuts[i]);
        fclose(f);
        struct safetensors *st = NULL;
        int rc = safetensors_open_file(path, &st, err, sizeof err);
        if (rc != MS_EFORMAT || st) fail_msg("cut at %zu: rc %d, err %s", cuts[i], rc, err);
    }
    free(bytes);
}

// Hundreds of one- to three-byte corruptions of a real header: each open either
// succeeds with every tensor inside the file or fails with a sentence.
static void corrupted_real_headers_never_crash(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    assert_non_null(data);
    char src[512], *orig = NULL, err[1024] = "";
    size_t len = 0;
    snprintf(src, sizeof src, "%s/qwen3-dense-v2048/model.safetensors", data);
    assert_int_equal(ms_read_file(src, 64u << 20, &orig, &len, err, sizeof err), 0);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (uint8_t)orig[i];
    char *buf = malloc(len);
    assert_non_null(buf);
    static const char pool[] = "0123456789[]{}\",:\" -eE.";
    uint64_t x = 12345;
    int opened = 0, refused = 0;
    char path[512];
    path_in(path, sizeof path, "fuzz.safetensors", NULL);
    for (int iter = 0; iter < 600; iter++) {
        memcpy(buf, orig, len);
        for (int k = 0; k < 1 + iter % 3; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((x >> 33) % (8 + hlen));
            buf[at] = pool[(x >> 13) % (sizeof pool - 1)];
        }
        write_all_bytes(path, buf, len);
        struct safetensors *st = NULL;
        int rc = safetensors_open_file(path, &st, err, sizeof err);
        if (rc == 0) {
            opened++;
            for (size_t i = 0; i < safetensors_count(st); i++) {
                const struct st_tensor *t = safetensors_get(st, i);
                if (t->nbytes) {
                    // Touch both ends: under ASan an out-of-map view would trap.
                    volatile uint8_t a = ((const uint8_t *)t->data)[0];
                    volatile uint8_t b = ((const uint8_t *)t->data)[t->nbytes - 1];
                    (void)a;
                    (void)b;
                }
            }
            safetensors_close(st);
        } else {
            assert_true(rc < 0 && strlen(err) > 10);
            refused++;
        }
    }
    assert_true(refused > 0 && opened + refused == 600);
    free(buf);
    free(orig);
}

int main(void)
{
    ms_log_level = MS_LOG_ERROR;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(well_formed_file_maps_every_tensor),
        cmocka_unit_test(known_dtypes_we_do_not_compute_with_are_listed_unsupported),
        cmocka_unit_test(truncated_and_absurd_lengths_are_refused),
        cmocka_unit_test(malformed_headers_are_refused),
        cmocka_unit_test(offsets_outside_or_overlapping_are_refused),
        cmocka_unit_test(sizes_that_overflow_or_disagree_are_refused),
        cmocka_unit_test(sharded_checkpoint_opens_through_its_index),
        cmocka_unit_test(broken_shard_sets_are_refused),
        cmocka_unit_test(truncated_real_checkpoint_is_refused),
        cmocka_unit_test(corrupted_real_headers_never_crash),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
