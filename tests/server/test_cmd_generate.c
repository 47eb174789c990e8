// Pins `moeserve generate` end to end: --json on the golden checkpoint
// reproduces llama.cpp's greedy tokens and logprobs, the plain output prints
// ids, seeds reproduce samples, text prompts go through the tokenizer, bad
// arguments exit 2 with a sentence, --quantization and quantized checkpoints
// generate (and cache their weights), and --bench --json reports its figures.
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <cmocka.h>
#include <jansson.h>

static const char *bin, *data, *tiny;

static int setup(void **state)
{
    (void)state;
    bin = getenv("MOESERVE_BIN");
    data = getenv("MOESERVE_TEST_DATA");
    tiny = getenv("MOESERVE_TINY_MODEL");
    return bin && data && tiny ? 0 : -1;
}

// Runs a shell command; returns its exit status, stdout in *out (malloc'd),
// stderr in *err_out when non-NULL.
static int run(const char *cmd, char **out, char **err_out)
{
    char full[8192], errpath[] = "/tmp/moeserve-gen-err-XXXXXX";
    int fd = mkstemp(errpath);
    assert_true(fd >= 0);
    snprintf(full, sizeof full, "%s 2>%s", cmd, errpath);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; (k = fread(buf + n, 1, cap - n - 1, p)) > 0;) {
        n += k;
        if (cap - n < 1024) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    if (err_out) {
        FILE *f = fopen(errpath, "r");
        char *e = calloc(1, 1 << 16);
        if (f) {
            size_t k = fread(e, 1, (1 << 16) - 1, f);
            e[k] = 0;
            fclose(f);
        }
        *err_out = e;
    }
    remove(errpath);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_t *golden_case(const char *model, size_t i, char *ids, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/expected.json", data, model);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    json_t *c = json_incref(json_array_get(json_object_get(root, "cases"), i));
    json_decref(root);
    size_t off = 0, k;
    json_t *v;
    json_array_foreach(json_object_get(c, "prompt_ids"), k, v)
        off += (size_t)snprintf(ids + off, len - off, "%s%lld", k ? "," : "", (long long)json_integer_value(v));
    return c;
}

static void json_output_matches_the_reference(void **state)
{
    (void)state;
    const char *models[] = {"qwen3moe-v2048", "qwen3-dense-v2048"};
    for (int mi = 0; mi < 2; mi++)
        for (size_t ci = 0; ci < 4; ci += 3) { // a 1-token and a 33-token prompt
            char ids[8192], cmd[9000], *out;
            json_t *c = golden_case(models[mi], ci, ids, sizeof ids);
            snprintf(cmd, sizeof cmd, "%s generate %s/%s --prompt-ids %s --max-tokens 24 --temperature 0 "
                     "--ignore-eos --json --top-logprobs 5 --kv-cache-dtype float32", bin, data,
                     models[mi], ids);
            assert_int_equal(run(cmd, &out, NULL), 0);
            json_error_t je;
            json_t *got = json_loads(out, 0, &je);
            if (!got) fail_msg("not JSON (%s): %s", je.text, out);
            assert_int_equal(json_integer_value(json_object_get(got, "prompt_tokens")),
                             json_array_size(json_object_get(c, "prompt_ids")));
            json_t *want = json_object_get(c, "tokens"), *have = json_object_get(got, "tokens");
            assert_int_equal(json_array_size(have), json_array_size(want));
            for (size_t i = 0; i < json_array_size(want); i++) {
                json_t *w = json_array_get(want, i), *h = json_array_get(have, i);
                assert_int_equal(json_integer_value(json_object_get(h, "id")),
                                 json_integer_value(json_object_get(w, "id")));
                assert_float_equal(json_real_value(json_object_get(h, "logprob")),
                                   json_number_value(json_object_get(w, "logprob")), 2e-3);
                json_t *wt = json_object_get(w, "top_logprobs"), *ht = json_object_get(h, "top_logprobs");
                assert_int_equal(json_array_size(ht), 5);
                for (size_t j = 0; j < 5; j++) {
                    // Ranks may swap only between near-equal values; compare by id.
                    json_t *e = json_array_get(wt, j);
                    json_int_t id = json_integer_value(json_object_get(e, "id"));
                    bool found = false;
                    for (size_t q = 0; q < 5; q++) {
                        json_t *g = json_array_get(ht, q);
                        if (json_integer_value(json_object_get(g, "id")) != id) continue;
                        found = true;
                        assert_float_equal(json_real_value(json_object_get(g, "logprob")),
                                           json_number_value(json_object_get(e, "logprob")), 2e-3);
                    }
                    assert_true(found);
                }
            }
            assert_string_equal(json_string_value(json_object_get(got, "finish_reason")), "length");
            json_t *t = json_object_get(got, "timings");
            assert_true(json_real_value(json_object_get(t, "prefill_seconds")) > 0);
            assert_true(json_real_value(json_object_get(t, "decode_tokens_per_second")) > 0);
            json_decref(got);
            json_decref(c);
            free(out);
        }
}

static void plain_output_prints_the_generated_ids(void **state)
{
    (void)state;
    char ids[8192], cmd[9000], *out, want[4096];
    json_t *c = golden_case("qwen3moe-v2048", 2, ids, sizeof ids);
    snprintf(cmd, sizeof cmd, "%s generate %s/qwen3moe-v2048 --prompt-ids '%s' --max-tokens 6 "
             "--temperature 0 --ignore-eos --kv-cache-dtype float32", bin, data, ids);
    assert_int_equal(run(cmd, &out, NULL), 0);
    size_t off = 0;
    for (size_t i = 0; i < 6; i++)
        off += (size_t)snprintf(want + off, sizeof want - off, "%s%lld", i ? " " : "",
                                (long long)json_integer_value(json_object_get(
                                    json_array_get(json_object_get(c, "tokens"), i), "id")));
    snprintf(want + off, sizeof want - off, "\n");
    assert_string_equal(out, want);
    free(out);
    // A MOESERVE_CPU_KERNELS that names no table is said, not silently
    // replaced (a typo would spoil a comparison of tables); the ids are the same.
    char *err;
    snprintf(cmd, sizeof cmd, "MOESERVE_CPU_KERNELS=avx512bf16 %s generate %s/qwen3moe-v2048 --prompt-ids '%s' "
             "--max-tokens 6 --temperature 0 --ignore-eos --kv-cache-dtype float32", bin, data, ids);
    assert_int_equal(run(cmd, &out, &err), 0);
    assert_string_equal(out, want);
    if (!strstr(err, "MOESERVE_CPU_KERNELS=avx512bf16 names no table")) fail_msg("no warning: %s", err);
    free(out);
    free(err);
    json_decref(c);
}

static char *sample_ids(const char *seed)
{
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s generate %s/qwen3moe-v2048 --prompt-ids 5,6,7 --max-tokens 20 "
             "--temperature 1.5 --top-p 0.95 --ignore-eos %s", bin, data, seed);
    assert_int_equal(run(cmd, &out, NULL), 0);
    return out;
}

static void a_seed_reproduces_the_sample(void **state)
{
    (void)state;
    char *a = sample_ids("--seed 7"), *b = sample_ids("--seed 7"), *c = sample_ids("--seed 8");
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
}

static void text_prompts_use_the_checkpoint_tokenizer(void **state)
{
    (void)state;
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt 'Hello, world' --max-tokens 4 --temperature 0 "
             "--json", bin, tiny);
    assert_int_equal(run(cmd, &out, NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "prompt_tokens")), 3); // "Hello" "," " world"
    assert_true(json_array_size(json_object_get(j, "tokens")) >= 1);
    assert_true(json_is_string(json_object_get(j, "text")));
    json_decref(j);
    free(out);
}

static void bad_arguments_exit_2_with_a_sentence(void **state)
{
    (void)state;
    struct {
        const char *args, *needle;
        int rc;
    } cases[] = {
        {"--prompt-ids 1,x", "--prompt-ids", 2},
        {"--prompt-ids 1,99999", "not a token id", 2},
        {"--prompt hello", "no tokenizer.json", 2},
        {"--prompt-ids 1 --max-tokens 5000", "max_position_embeddings", 2},
        {"--prompt-ids 1 --kv-cache-dtype int8", "--kv-cache-dtype", 2},
        {"--prompt-ids 1 --top-logprobs 21", "--top-logprobs", 2},
        {"--prompt-ids 1 --temperature -1", "--temperature", 2},
        {"--prompt-ids 1 --device gpu", "--device must be auto, cpu or cuda", 2},
        {"--prompt-ids 1 --load-format pt", "--load-format must be auto or dummy", 2},
        {"--prompt-ids 1 --quantization q4_0", "--quantization must be fp8, int8 or int4", 2},
        {"", "either --prompt-ids or --prompt", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[2048], *out, *err;
        snprintf(cmd, sizeof cmd, "%s generate %s/qwen3moe-v2048 %s", bin, data, cases[i].args);
        int rc = run(cmd, &out, &err);
        if (rc != cases[i].rc || !strstr(err, cases[i].needle))
            fail_msg("'%s': exit %d, stderr: %s", cases[i].args, rc, err);
        free(out);
        free(err);
    }
    char cmd[2048], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate /nonexistent/model --prompt-ids 1", bin);
    assert_int_equal(run(cmd, &out, &err), 1);
    assert_non_null(strstr(err, "/nonexistent/model"));
    free(out);
    free(err);
}

// --load-format dummy reads only config.json: a folder with nothing else
// generates (random weights made by the backend), the same seed the same ids;
// --device cuda where there is no CUDA backend or GPU fails with a sentence.
static void dummy_weights_need_only_the_config(void **state)
{
    (void)state;
    char dir[] = "/tmp/moeserve-dummy-XXXXXX", cmd[2048], *out, *out2, *err;
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp %s/qwen3moe-v2048/config.json %s/", data, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s generate %s --load-format dummy --prompt-ids 1,2,3 --max-tokens 6 "
             "--temperature 0", bin, dir);
    assert_int_equal(run(cmd, &out, &err), 0);
    int n = 0;
    for (char *p = out; *p; p++) n += *p == ' ';
    if (n != 5) fail_msg("expected 6 ids, got '%s' (%s)", out, err);
    assert_int_equal(run(cmd, &out2, NULL), 0);
    assert_string_equal(out, out2);
    free(out);
    free(out2);
    free(err);
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt-ids 1,2,3", bin, dir); // no weights on disk
    assert_int_not_equal(run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "safetensors"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s generate %s --load-format dummy --device cuda --prompt-ids 1", bin, dir);
    int rc = run(cmd, &out, &err);
    if (rc == 0) fprintf(stderr, "note: this machine runs --device cuda\n");
    else if (!strstr(err, "cuda") && !strstr(err, "CUDA")) fail_msg("--device cuda: %s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

// --quantization on the tiny model: each format generates; the first int4
// start writes its weights cache and the next maps it and generates the same
// ids; make-model's FP8 and GPTQ checkpoints generate as they are, and
// --quantization int8 on the GPTQ one is refused with a sentence.
static void quantization_generates_and_the_next_start_maps_its_cache(void **state)
{
    (void)state;
    char tmp[] = "/tmp/moeserve-quant-gen-XXXXXX", cmd[4096], *out, *out2, *err;
    assert_non_null(mkdtemp(tmp));
    const char *formats[] = {"int4", "int8", "fp8"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s generate %s --quantization %s --cache-dir none --prompt-ids 1,2,3 "
                 "--max-tokens 4 --temperature 0", bin, tiny, formats[i]);
        if (run(cmd, &out, &err) != 0) fail_msg("--quantization %s: %s", formats[i], err);
        free(out);
        free(err);
    }
    snprintf(cmd, sizeof cmd, "%s generate %s --quantization int4 --cache-dir %s/cache --prompt-ids 1,2,3 "
             "--max-tokens 4 --temperature 0", bin, tiny, tmp);
    assert_int_equal(run(cmd, &out, &err), 0);
    if (!strstr(err, "written to the cache")) fail_msg("first start: %s", err);
    free(err);
    assert_int_equal(run(cmd, &out2, &err), 0);
    if (!strstr(err, "mapped from the cache")) fail_msg("second start: %s", err);
    assert_string_equal(out, out2);
    free(out);
    free(out2);
    free(err);
    // make-model's every checkpoint format, through the command line.
    const char *kinds[] = {"fp8", "gptq", "awq", "ct-w4a16", "ct-w8a16", "ct-fp8"};
    for (int i = 0; i < 6; i++) {
        snprintf(cmd, sizeof cmd, "%s make-model --shape tiny --out %s/%s --quantization %s", bin, tmp,
                 kinds[i], kinds[i]);
        assert_int_equal(run(cmd, &out, &err), 0);
        free(out);
        free(err);
        snprintf(cmd, sizeof cmd, "%s generate %s/%s --prompt-ids 1,2,3 --max-tokens 4 --temperature 0",
                 bin, tmp, kinds[i]);
        if (run(cmd, &out, &err) != 0) fail_msg("the %s checkpoint: %s", kinds[i], err);
        free(out);
        free(err);
    }
    snprintf(cmd, sizeof cmd, "%s generate %s/gptq --quantization int8 --prompt-ids 1", bin, tmp);
    assert_int_equal(run(cmd, &out, &err), 1);
    if (!strstr(err, "GPTQ") || !strstr(err, "--quantization int8")) fail_msg("%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

static void bench_reports_speed_beside_the_machine_limits(void **state)
{
    (void)state;
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "%s generate %s --bench --json --threads 1", bin, tiny);
    assert_int_equal(run(cmd, &out, NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    if (!j) fail_msg("not JSON: %s", out);
    const char *keys[] = {"read_bandwidth_gbs", "fma_peak_gflops", "decode_tokens_per_second",
                          "decode_gbs", "decode_fraction_of_bandwidth", "prefill_tokens_per_second",
                          "prefill_gflops", "prefill_fraction_of_peak"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!(json_real_value(json_object_get(j, keys[i])) > 0)) fail_msg("%s missing or not positive", keys[i]);
    assert_int_equal(json_integer_value(json_object_get(j, "threads")), 1);
    // The decode step reads what model_active_bytes says: hidden 64, 2 layers,
    // top-2 of 8 experts, a 151936 x 64 lm_head.
    assert_true(json_real_value(json_object_get(j, "decode_active_bytes")) > 151936.0 * 64 * 2);
    json_decref(j);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_output_matches_the_reference),
        cmocka_unit_test(plain_output_prints_the_generated_ids),
        cmocka_unit_test(a_seed_reproduces_the_sample),
        cmocka_unit_test(text_prompts_use_the_checkpoint_tokenizer),
        cmocka_unit_test(bad_arguments_exit_2_with_a_sentence),
        cmocka_unit_test(dummy_weights_need_only_the_config),
        cmocka_unit_test(quantization_generates_and_the_next_start_maps_its_cache),
        cmocka_unit_test(bench_reports_speed_beside_the_machine_limits),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
