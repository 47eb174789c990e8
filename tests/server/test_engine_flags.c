// Pins the shared engine flag parser: vLLM's flag names, human-readable
// sizes and counts (read by base/cli, pinned in tests/base/test_cli.c), --no-
// forms, and refusals that name the flag.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "server/engine_flags.h"

static int parse_all(struct engine_flags *f, int argc, char **argv, char *err, size_t errlen)
{
    for (int i = 0; i < argc; i++) {
        int rc = engine_flags_parse_one(f, argc, argv, &i, err, errlen);
        if (rc < 0) return rc;
        if (rc == 0) return 100 + i; // not an engine flag
    }
    return 0;
}

static void every_engine_flag_is_parsed(void **state)
{
    (void)state;
    struct engine_flags f;
    engine_flags_init(&f);
    char *argv[] = {"--data-parallel-size", "2", "--enable-expert-parallel", "--threads=6",
                    "--kv-cache-memory", "3GiB", "--kv-cache-dtype", "float32",
                    "--max-num-seqs", "64", "--max-num-batched-tokens=4K", "--max-model-len",
                    "32K", "--no-enable-prefix-caching", "--no-enable-chunked-prefill",
                    "--max-waiting-requests", "100", "--gpu-memory-utilization", "0.75",
                    "--enforce-eager", "--prefault-memory"};
    char err[256] = "";
    assert_true(f.opts.gpu_memory_utilization == 0.9); // vLLM's default
    assert_false(f.opts.enforce_eager);                // graphs where the backend has them
    assert_false(f.opts.prefault_memory);              // pages faulted in as steps reach them
    assert_int_equal(parse_all(&f, 21, argv, err, sizeof err), 0);
    assert_true(f.opts.enforce_eager);
    assert_true(f.opts.prefault_memory);
    assert_true(f.opts.gpu_memory_utilization == 0.75);
    assert_int_equal(f.opts.data_parallel_size, 2);
    assert_true(f.opts.enable_expert_parallel);
    assert_int_equal(f.opts.n_threads, 6);
    assert_true(f.opts.kv_cache_bytes == 3ull << 30);
    assert_false(f.kv_dtype_auto);
    assert_int_equal(f.opts.kv_dtype, DTYPE_F32);
    assert_int_equal(f.opts.max_num_seqs, 64);
    assert_int_equal(f.opts.max_num_batched_tokens, 4096);
    assert_int_equal(f.opts.max_model_len, 32768);
    assert_false(f.opts.enable_prefix_caching);
    assert_false(f.opts.enable_chunked_prefill);
    assert_int_equal(f.opts.max_waiting_requests, 100);
    char *back[] = {"--enable-prefix-caching", "--enable-chunked-prefill", "--kv-cache-dtype=auto"};
    assert_int_equal(parse_all(&f, 3, back, err, sizeof err), 0);
    assert_true(f.opts.enable_prefix_caching);
    assert_true(f.opts.enable_chunked_prefill);
    struct model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.torch_dtype = DTYPE_BF16;
    engine_flags_finish(&f, &cfg);
    assert_int_equal(f.opts.kv_dtype, DTYPE_BF16);
    cfg.torch_dtype = DTYPE_F32;
    engine_flags_finish(&f, &cfg);
    assert_int_equal(f.opts.kv_dtype, DTYPE_F32);
    cfg.torch_dtype = DTYPE_F16; // serve and generate alike: bfloat16
    assert_int_equal(engine_flags_auto_kv_dtype(&cfg), DTYPE_BF16);
}

// vLLM's --kv-cache-memory-bytes is per GPU: per rank here, so the total
// is it times the ranks, whichever flag comes first; --kv-cache-memory (the
// total) given later wins, and the other way round.
static void kv_cache_memory_bytes_is_per_rank(void **state)
{
    (void)state;
    char err[256] = "";
    struct engine_flags f;
    engine_flags_init(&f);
    char *a[] = {"--kv-cache-memory-bytes", "1GiB", "--data-parallel-size", "4"};
    assert_int_equal(parse_all(&f, 4, a, err, sizeof err), 0);
    engine_flags_end(&f);
    assert_true(f.opts.kv_cache_bytes == 4ull << 30);
    engine_flags_init(&f);
    char *b[] = {"-dp", "2", "--kv-cache-memory-bytes=3G", "--kv-cache-memory", "1G"};
    assert_int_equal(parse_all(&f, 5, b, err, sizeof err), 0);
    engine_flags_end(&f);
    assert_true(f.opts.kv_cache_bytes == 1ull << 30);
    engine_flags_init(&f);
    char *c[] = {"--kv-cache-memory", "1G", "--kv-cache-memory-bytes", "2G"};
    assert_int_equal(parse_all(&f, 4, c, err, sizeof err), 0);
    engine_flags_end(&f);
    assert_true(f.opts.kv_cache_bytes == 2ull << 30);
}

static void other_arguments_are_left_alone(void **state)
{
    (void)state;
    struct engine_flags f;
    engine_flags_init(&f);
    char *argv[] = {"--port", "8000", "--max-num-seqsX", "1"};
    char err[256];
    int i = 0;
    assert_int_equal(engine_flags_parse_one(&f, 4, argv, &i, err, sizeof err), 0);
    assert_int_equal(i, 0);
    i = 2;
    assert_int_equal(engine_flags_parse_one(&f, 4, argv, &i, err, sizeof err), 0);
    assert_int_equal(f.opts.max_num_seqs, 256);
}

// vLLM's method names for a checkpoint's own quantization are taken (the
// load checks them against the checkpoint); the formats quantize at load.
static void quantization_takes_formats_and_vllm_method_names(void **state)
{
    (void)state;
    const struct {
        const char *v;
        enum quant_format q;
        enum quant_method m;
    } cases[] = {{"int4", QUANT_INT4, QUANT_METHOD_NONE},         {"fp8", QUANT_FP8, QUANT_METHOD_NONE},
                 {"gptq", QUANT_NONE, QUANT_METHOD_GPTQ},         {"gptq_marlin", QUANT_NONE, QUANT_METHOD_GPTQ},
                 {"awq_marlin", QUANT_NONE, QUANT_METHOD_AWQ},    {"compressed-tensors", QUANT_NONE, QUANT_METHOD_CT_INT}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct engine_flags f;
        engine_flags_init(&f);
        char err[256] = "";
        char *a[] = {"--quantization", "int8", "--quantization", (char *)cases[k].v}; // the last wins
        assert_int_equal(parse_all(&f, 4, a, err, sizeof err), 0);
        assert_int_equal(f.quantization, cases[k].q);
        assert_int_equal(f.quant_method, cases[k].m);
        const struct model_load_opts lo = engine_flags_load_opts(&f);
        assert_int_equal(lo.method, cases[k].m);
    }
    struct engine_flags f;
    engine_flags_init(&f);
    char err[256] = "";
    char *bad[] = {"--quantization", "q4_k_m"};
    assert_int_equal(parse_all(&f, 2, bad, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "gptq_marlin"));
}

static void malformed_values_are_refused(void **state)
{
    (void)state;
    struct engine_flags f;
    engine_flags_init(&f);
    char err[256] = "";
    char *a1[] = {"--max-model-len", "lots"};
    assert_int_equal(parse_all(&f, 2, a1, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "--max-model-len"));
    assert_non_null(strstr(err, "lots"));
    char *a2[] = {"--kv-cache-dtype", "fp8"};
    assert_int_equal(parse_all(&f, 2, a2, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "fp8"));
    char *a3[] = {"--threads"};
    assert_int_equal(parse_all(&f, 1, a3, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "needs a value"));
    char *a4[] = {"--data-parallel-size", "65"};
    assert_int_equal(parse_all(&f, 2, a4, err, sizeof err), MS_EINVAL);
    char *a5[] = {"--enable-prefix-caching=yes"};
    assert_int_equal(parse_all(&f, 1, a5, err, sizeof err), MS_EINVAL);
    char *a8[] = {"--enforce-eager=1"};
    assert_int_equal(parse_all(&f, 1, a8, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "takes no value"));
    char *a6[] = {"--kv-cache-memory", "0"};
    assert_int_equal(parse_all(&f, 2, a6, err, sizeof err), MS_EINVAL);
    const char *bad_util[] = {"0", "1.01", "-0.5", "nan", "0.9x", "", "inf"};
    for (size_t i = 0; i < sizeof bad_util / sizeof *bad_util; i++) {
        char *a7[] = {"--gpu-memory-utilization", (char *)bad_util[i]};
        assert_int_equal(parse_all(&f, 2, a7, err, sizeof err), MS_EINVAL);
        assert_non_null(strstr(err, "--gpu-memory-utilization must be a number from 0 to 1"));
    }
    assert_true(f.opts.gpu_memory_utilization == 0.9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_engine_flag_is_parsed),
        cmocka_unit_test(kv_cache_memory_bytes_is_per_rank),
        cmocka_unit_test(other_arguments_are_left_alone),
        cmocka_unit_test(quantization_takes_formats_and_vllm_method_names),
        cmocka_unit_test(malformed_values_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
