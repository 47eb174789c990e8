// Pins `moeserve plan`: its --json keys and values for Qwen3-30B-A3B, the
// human tables, one layout or both, and usage errors for bad flags and files.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

// Runs `moeserve plan ARGS` (stderr folded into the output); returns the exit status.
static int run_plan(const char *args, char **out)
{
    const char *bin = getenv("MOESERVE_BIN"), *data = getenv("MOESERVE_TEST_DATA");
    assert_non_null(bin);
    assert_non_null(data);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' plan %s 2>&1", data, bin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[len] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_t *layout(json_t *o, const char *name)
{
    json_t *lays = json_object_get(o, "layouts"), *l;
    size_t i;
    json_array_foreach(lays, i, l)
        if (!strcmp(json_string_value(json_object_get(l, "layout")), name)) return l;
    return NULL;
}

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) fail_msg("key %s missing or not a number", key);
    return json_number_value(v);
}

static void json_lists_both_layouts_with_the_issue_keys(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run_plan("qwen3-30b-a3b --json --devices 2", &out), 0);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    if (!o) fail_msg("not JSON (%s): %s", je.text, out);
    assert_true(num(o, "total_params") == 30532122624.0);
    assert_true(num(o, "active_params") == 3353032704.0);
    assert_true(num(o, "kv_bytes_per_token") == 98304.0);
    json_t *ue = json_object_get(o, "expected_unique_experts");
    assert_true(fabs(num(ue, "1") - 8.0) < 0.05);
    assert_true(fabs(num(ue, "8") - 51.6) < 0.05);
    assert_true(fabs(num(ue, "32") - 111.8) < 0.05);
    assert_true(fabs(num(ue, "64") - 125.9) < 0.05);
    assert_int_equal(json_array_size(json_object_get(o, "layouts")), 2);
    json_t *tp = layout(o, "tp"), *ep = layout(o, "dp-ep");
    assert_non_null(tp);
    assert_non_null(ep);
    assert_true(num(tp, "devices") == 2);
    assert_true(fabs(num(tp, "weight_bytes_per_device") / GIB - 28.5) < 0.1);
    assert_true(num(tp, "kv_bytes_per_device") > 0);
    assert_true(num(tp, "kv_tokens_per_device") > 0);
    assert_true(num(ep, "weight_bytes_per_device") > num(tp, "weight_bytes_per_device"));
    json_decref(o);
    free(out);
}

static void one_80_gib_gpu_shows_13_gib_of_kv_for_140k_tokens(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run_plan("qwen3-30b-a3b/config.json --json --layout tp --device-memory 80GiB "
                              "--gpu-memory-utilization 0.9 --devices 1", &out), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_array_size(json_object_get(o, "layouts")), 1);
    json_t *tp = layout(o, "tp");
    assert_non_null(tp);
    assert_true(fabs(num(tp, "kv_bytes_per_device") / GIB - 13.0) < 0.5);
    double tok = num(tp, "kv_tokens_per_device");
    assert_true(tok > 135000 && tok < 145000);
    assert_true(json_is_true(json_object_get(tp, "fits")));
    json_decref(o);
    free(out);
}

static void human_output_shows_the_split_and_the_tables(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run_plan("qwen3-30b-a3b --devices 2 --memory-bandwidth 3.35TB/s", &out), 0);
    const char *want[] = {"experts        28,991,029,248", "30.53", "3.35", "96.0 KiB",
                          "tp x2       28.45 GiB", "dp-ep x2", "51.6", "125.9", "3.35 TB/s"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("'%s' missing from:\n%s", want[i], out);
    free(out);
}

// A checkpoint's own quantization is the plan's default: a GPTQ config is
// counted in int4 with its own groups (32 here: more bytes than the 128 of
// --dtype int4 on the bf16 config), as the loader holds it.
static double tp_weights(const char *args)
{
    char *out;
    assert_int_equal(run_plan(args, &out), 0);
    json_t *o = json_loads(out, 0, NULL);
    if (!o) fail_msg("not JSON: %s", out);
    const double w = num(layout(o, "tp"), "weight_bytes_per_device");
    json_decref(o);
    free(out);
    return w;
}

static void a_quantized_checkpoint_is_planned_as_it_loads(void **state)
{
    (void)state;
    char dir[] = "/tmp/moeserve-plan-gptq-XXXXXX", cmd[1200], args[512];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd,
             "sed 's/^{/{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, "
             "\"group_size\": 32, \"sym\": true, \"desc_act\": false},/' '%s/qwen3-30b-a3b/config.json' > "
             "'%s/config.json'", getenv("MOESERVE_TEST_DATA"), dir);
    assert_int_equal(system(cmd), 0);
    snprintf(args, sizeof args, "'%s' --json", dir);
    const double gptq = tp_weights(args);
    snprintf(args, sizeof args, "'%s' --json --dtype int4", dir);
    assert_true(tp_weights(args) == gptq);
    const double bf16 = tp_weights("qwen3-30b-a3b --json"), int4_128 = tp_weights("qwen3-30b-a3b --json --dtype int4");
    assert_true(gptq < bf16 / 3);
    assert_true(gptq > int4_128 * 1.05);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void a_device_too_small_says_no_with_the_numbers(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run_plan("qwen3-30b-a3b --device-memory 48GiB --layout tp", &out), 0);
    assert_non_null(strstr(out, "NO"));
    assert_non_null(strstr(out, "weights 56.87 GiB"));
    free(out);
    assert_int_equal(run_plan("qwen3-30b-a3b --device-memory 48GiB --json", &out), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_false(json_object_get(layout(o, "tp"), "fits")));
    json_decref(o);
    free(out);
}

static void an_unsplittable_layout_is_reported_per_layout(void **state)
{
    (void)state;
    char *out;
    // 3 devices: tp cannot split 32 heads, dp-ep can deal out 128 experts.
    assert_int_equal(run_plan("qwen3-30b-a3b --json --devices 3", &out), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    assert_non_null(strstr(json_string_value(json_object_get(layout(o, "tp"), "error")), "num_attention_heads"));
    assert_true(num(layout(o, "dp-ep"), "kv_tokens_per_device") > 0);
    json_decref(o);
    free(out);
    assert_int_equal(run_plan("qwen3-30b-a3b --devices 3 --layout tp", &out), 1);
    assert_non_null(strstr(out, "num_attention_heads 32"));
    free(out);
}

static void bad_flags_and_files_are_usage_errors_with_a_sentence(void **state)
{
    (void)state;
    const struct {
        const char *args;
        int status;
        const char *says;
    } cases[] = {
        {"qwen3-30b-a3b --dtype int3", 2, "int3"},
        {"qwen3-30b-a3b --kv-dtype int4", 2, "--kv-dtype"},
        {"qwen3-30b-a3b --device-memory 80parsecs", 2, "parsecs"},
        {"qwen3-30b-a3b --gpu-memory-utilization 1.5", 2, "(0, 1]"},
        {"qwen3-30b-a3b --devices 0", 2, "--devices"},
        {"qwen3-30b-a3b --layout pp", 2, "pp"},
        {"qwen3-30b-a3b --batch-sizes 1,,8", 2, "--batch-sizes"},
        {"qwen3-30b-a3b --batch-sizes 1,8,", 2, "comma"},
        {"qwen3-30b-a3b --memory-bandwidth 4.8TB", 2, "TB/s"},
        {"qwen3-30b-a3b --max-model-len 32X", 2, "--max-model-len"},
        {"qwen3-30b-a3b --max-model-len 64K", 1, "max_position_embeddings 40960"},
        {"", 2, "which model"},
        {"no-such-dir", 1, "no-such-dir"},
        {"GOLDEN.md", 1, "GOLDEN.md"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int st = run_plan(cases[i].args, &out);
        if (st != cases[i].status || !strstr(out, cases[i].says))
            fail_msg("plan %s: status %d (want %d), output: %s", cases[i].args, st, cases[i].status, out);
        free(out);
    }
}

static void max_model_len_accepts_32k_forms(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run_plan("qwen3-30b-a3b --json --layout tp --max-model-len 32K", &out), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    assert_true(num(o, "max_model_len") == 32768);
    json_decref(o);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_lists_both_layouts_with_the_issue_keys),
        cmocka_unit_test(one_80_gib_gpu_shows_13_gib_of_kv_for_140k_tokens),
        cmocka_unit_test(human_output_shows_the_split_and_the_tables),
        cmocka_unit_test(a_quantized_checkpoint_is_planned_as_it_loads),
        cmocka_unit_test(a_device_too_small_says_no_with_the_numbers),
        cmocka_unit_test(an_unsplittable_layout_is_reported_per_layout),
        cmocka_unit_test(bad_flags_and_files_are_usage_errors_with_a_sentence),
        cmocka_unit_test(max_model_len_accepts_32k_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
