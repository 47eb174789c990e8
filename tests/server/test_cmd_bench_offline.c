// Pins `moeserve bench-offline` end to end on the golden checkpoint: every
// request completes with exactly --output-len tokens (the JSON counts them),
// the text output names vLLM's three figures, 2 expert-parallel ranks run,
// and bad arguments exit 2 with a sentence.
#include <math.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cmocka.h>
#include <jansson.h>

#include "base/base.h"

static const char *bin;
static char model[4096];

static int setup(void **state)
{
    (void)state;
    bin = getenv("MOESERVE_BIN");
    const char *data = getenv("MOESERVE_TEST_DATA");
    if (!bin || !data) return -1;
    snprintf(model, sizeof model, "%s/qwen3moe-v2048", data);
    return 0;
}

// Runs a command; stdout into *out (malloc'd); stderr is merged when merge_err.
static int run(const char *args, bool merge_err, char **out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s bench-offline %s %s", bin, args, merge_err ? "2>&1" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; (k = fread(buf + n, 1, cap - n - 1, p)) > 0;) n += k;
    buf[n] = 0;
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void json_passes_count_every_token(void **state)
{
    (void)state;
    char args[8192], *out;
    snprintf(args, sizeof args,
             "%s --num-prompts 6 --input-len 40 --output-len 9 --max-concurrency 1,4 --json "
             "--threads 2 --kv-cache-memory 64MiB", model);
    assert_int_equal(run(args, false, &out), 0);
    char *line = out;
    int passes = 0;
    for (char *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) fail_msg("not JSON: %s", line);
        assert_int_equal(json_integer_value(json_object_get(j, "num_requests")), 6);
        assert_int_equal(json_integer_value(json_object_get(j, "total_num_tokens")), 6 * (40 + 9));
        assert_int_equal(json_integer_value(json_object_get(j, "max_concurrency")),
                         passes == 0 ? 1 : 4);
        assert_true(json_real_value(json_object_get(j, "output_tokens_per_second")) > 0);
        assert_true(json_real_value(json_object_get(j, "requests_per_second")) > 0);
        // 9 tokens each: at least 9 steps; one rank's split of them.
        assert_true(json_integer_value(json_object_get(j, "steps")) >= 9);
        json_t *ranks = json_object_get(j, "step_ms");
        assert_int_equal(json_array_size(ranks), 1);
        const char *phases[] = {"attention", "moe", "lm_head", "sampling"};
        for (int f = 0; f < 4; f++)
            if (!(json_real_value(json_object_get(json_array_get(ranks, 0), phases[f])) > 0))
                fail_msg("no %s time in: %s", phases[f], line);
        assert_true(json_real_value(json_object_get(json_array_get(ranks, 0), "exchange")) == 0);
        // The decode steps apart: one stream at a time takes a prompt step
        // and 8 decode steps a request, exactly: a pass counts the step that
        // finished its last request, and not the warm-up's last.
        const json_int_t steps = json_integer_value(json_object_get(j, "steps"));
        const json_int_t nd = json_integer_value(json_array_get(json_object_get(j, "decode_steps"), 0));
        if (passes == 0 && (steps - nd != 6 || nd != 6 * 8))
            fail_msg("one stream: %lld steps, %lld decode, not 6 prompt steps and 48 decode: %s",
                     (long long)steps, (long long)nd, line);
        assert_true(nd > 0 && nd < steps);
        json_t *dec = json_array_get(json_object_get(j, "decode_step_ms"), 0),
               *oth = json_array_get(json_object_get(j, "other_step_ms"), 0);
        for (int f = 0; f < 4; f++) {
            const double d = json_real_value(json_object_get(dec, phases[f])),
                         o = json_real_value(json_object_get(oth, phases[f])),
                         all = json_real_value(json_object_get(json_array_get(ranks, 0), phases[f]));
            if (!(d > 0 && o > 0)) fail_msg("no %s time in a step kind: %s", phases[f], line);
            // The mean over all steps is the two kinds' weighted by their
            // counts (each printed to 3 decimals).
            const double mix = (d * (double)nd + o * (double)(steps - nd)) / (double)steps;
            if (fabs(mix - all) > 2e-3) fail_msg("%s: %f decode and %f other do not make %f: %s", phases[f], d, o, all, line);
        }
        json_decref(j);
        passes++;
    }
    assert_int_equal(passes, 2);
    free(out);
}

// The "threads" of a run without --threads.
static long default_threads(const char *args)
{
    char *out;
    assert_int_equal(run(args, false, &out), 0);
    json_error_t je;
    json_t *j = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    if (!j) fail_msg("not JSON: %s", out);
    const long n = (long)json_integer_value(json_object_get(j, "threads"));
    json_decref(j);
    free(out);
    return n;
}

// Without --threads the engine runs on every core the process may use (its
// affinity mask, as taskset or systemd's CPUAffinity= set it), and the JSON
// says how many (it printed the flag's 0 for "all"); with more ranks than
// threads, the one each rank runs all the same.
static void json_names_the_threads_it_ran_on(void **state)
{
    (void)state;
    char args[8192], *out;
    snprintf(args, sizeof args, "%s --num-prompts 2 --input-len 8 --output-len 2 --json --kv-cache-memory 64MiB",
             model);
    // The mask's count, within a cgroup quota where the test runs under one.
    assert_int_equal(default_threads(args), ms_cpu_count());
    cpu_set_t mine;
    assert_int_equal(sched_getaffinity(0, sizeof mine, &mine), 0);
    // On one core of the machine's several, one thread (it had counted
    // every online core and spun that many threads on the one).
    int first = 0;
    while (!CPU_ISSET(first, &mine)) first++;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    const long on_one = default_threads(args);
    assert_int_equal(sched_setaffinity(0, sizeof mine, &mine), 0);
    assert_int_equal(on_one, 1);
    json_error_t je;
    json_t *j;
    // More ranks than threads: each rank runs one all the same.
    snprintf(args, sizeof args, "%s --num-prompts 2 --input-len 8 --output-len 2 --json --kv-cache-memory 64MiB "
             "--threads 1 --data-parallel-size 2 --enable-expert-parallel", model);
    assert_int_equal(run(args, false, &out), 0);
    j = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    if (!j) fail_msg("not JSON: %s", out);
    assert_int_equal(json_integer_value(json_object_get(j, "threads")), 2);
    json_decref(j);
    free(out);
}

static void text_output_on_two_expert_parallel_ranks(void **state)
{
    (void)state;
    char args[8192], *out;
    snprintf(args, sizeof args,
             "%s --num-prompts 4 --input-len 20 --output-len 5 --max-concurrency 2 --rounds 2 "
             "--data-parallel-size 2 --enable-expert-parallel --threads 2 --kv-cache-memory 64MiB",
             model);
    assert_int_equal(run(args, false, &out), 0);
    assert_non_null(strstr(out, "requests/s"));
    assert_non_null(strstr(out, "total tokens/s"));
    assert_non_null(strstr(out, "output tokens/s"));
    assert_non_null(strstr(out, "(4 requests, 100 tokens in"));
    assert_non_null(strstr(out, "over 2 rounds"));
    // Each pass's step split, for each of the two ranks.
    assert_non_null(strstr(out, "\n  rank 0, ms per step over "));
    assert_non_null(strstr(out, "\n  rank 1, ms per step over "));
    assert_non_null(strstr(out, " lm_head "));
    assert_non_null(strstr(out, "(exchanges "));
    assert_non_null(strstr(out, " decode steps: attention "));
    assert_non_null(strstr(out, " other steps: attention "));
    free(out);
}

static void bad_arguments_exit_2_with_a_reason(void **state)
{
    (void)state;
    struct {
        const char *args, *says;
    } cases[] = {
        {"", "usage"},
        {"MODEL --num-prompts 0", "--num-prompts"},
        {"MODEL --max-concurrency 1,x", "--max-concurrency"},
        {"MODEL --rounds 99", "--rounds"},
        {"MODEL --temperature hot", "--temperature"},
        {"MODEL --max-model-len lots", "--max-model-len"},
        {"MODEL --frobnicate", "--frobnicate"},
        {"MODEL other-dir", "one MODEL_DIR"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[8192], *out;
        const char *m = strstr(cases[i].args, "MODEL");
        if (m) snprintf(args, sizeof args, "%s%s", model, m + 5);
        else snprintf(args, sizeof args, "%s", cases[i].args);
        assert_int_equal(run(args, true, &out), 2);
        if (!strstr(out, cases[i].says)) fail_msg("`%s` printed: %s", args, out);
        free(out);
    }
    // A request the model cannot hold is a runtime error with the numbers.
    char args[8192], *out;
    snprintf(args, sizeof args, "%s --input-len 4000 --output-len 200 --num-prompts 1", model);
    assert_int_equal(run(args, true, &out), 2);
    assert_non_null(strstr(out, "4096"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_passes_count_every_token),
        cmocka_unit_test(json_names_the_threads_it_ran_on),
        cmocka_unit_test(text_output_on_two_expert_parallel_ranks),
        cmocka_unit_test(bad_arguments_exit_2_with_a_reason),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
