// cmd_bench_offline: `moeserve bench-offline`, offline throughput in the
// style of `vllm bench throughput` — random prompts, ignore_eos, a fixed
// number of requests kept in flight — reporting requests/s and tokens/s.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/cli.h"
#include "model/model.h"
#include "scheduler/engine.h"
#include "server/commands.h"
#include "server/engine_flags.h"

#define MAX_PASSES 16
#define MAX_ROUNDS 8

struct bench_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_flight;
    int done;
    int failed;
    long long output_tokens;
    char first_error[256];
};

static void bench_on_delta(void *ctx, const struct engine_delta *d)
{
    struct bench_state *b = ctx;
    if (d->finish == FINISH_NONE) return;
    pthread_mutex_lock(&b->mu);
    b->in_flight--;
    b->done++;
    b->output_tokens += d->completion_tokens;
    if (d->finish == FINISH_ABORT) {
        if (!b->failed)
            snprintf(b->first_error, sizeof b->first_error, "%s",
                     d->error ? d->error : "aborted");
        b->failed++;
    }
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: moeserve bench-offline MODEL_DIR [options] [engine options]\n"
        "\n"
        "Offline throughput, as `vllm bench throughput` measures it: NUM random prompts of\n"
        "INPUT tokens, each generating exactly OUTPUT tokens (ignore_eos, temperature 1),\n"
        "at most C requests in flight. Prints requests/s, output tokens/s, total tokens/s.\n"
        "\n"
        "options:\n"
        "  --num-prompts N        requests per pass (64)\n"
        "  --input-len N          prompt tokens (256)\n"
        "  --output-len N         generated tokens (128)\n"
        "  --max-concurrency C    requests in flight; a list such as 1,16 runs one pass\n"
        "                         each, side by side on the same engine (default: all)\n"
        "  --rounds R             repeat the list of concurrencies R times, interleaved, and\n"
        "                         report each concurrency pooled over the rounds (1)\n"
        "  --temperature T        sampling temperature (1, as vLLM's benchmark; 0 is greedy)\n"
        "  --seed S               the random prompts and sampling seeds (0)\n"
        "  --json                 print one JSON object per pass instead of text\n"
        "\n");
    engine_flags_usage(f);
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

// The ranks whose step breakdown a pass reports.
#define SHOWN_RANKS 8

struct pass_result {
    int concurrency;
    double seconds;
    uint64_t steps;
    uint64_t padded_steps, graph_steps; // rank 0's decode steps padded, and replayed as graphs
    int n_ranks;
    // Per rank over the pass, in seconds: each engine phase, the exchanges.
    double phase[SHOWN_RANKS][ENGINE_PHASES];
    double exchange[SHOWN_RANKS];
    // Of steps and phase, each rank's decode steps (every sequence one new
    // token): a wave's prompt steps cost tens of decode steps each, and a
    // mean over both says little of either.
    uint64_t decode_steps[SHOWN_RANKS];
    double decode_phase[SHOWN_RANKS][ENGINE_PHASES];
    int done, failed;
    long long input_tokens, output_tokens;
};

// The engine's figures once it has published the step that finished the
// pass's last request: a request reports its end from inside that step,
// before the step's figures are published, so a snapshot taken at once
// could leave the step to the next pass (one decode step off in each).
// Bounded, should the engine never go idle.
static void stats_after_last_step(struct engine *e, struct engine_stats *s)
{
    const double give_up = ms_now() + 10.0;
    for (;;) {
        engine_get_stats(e, s);
        if ((s->num_running == 0 && s->num_waiting == 0) || ms_now() > give_up) return;
        usleep(100);
    }
}

static int run_pass(struct engine *e, int vocab, int n_prompts, int input_len, int output_len,
                    int concurrency, float temperature, uint64_t seed, struct pass_result *pr,
                    char *err, size_t errlen)
{
    struct bench_state b;
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    int32_t *prompt = malloc((size_t)input_len * sizeof *prompt);
    if (!prompt) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the prompts");
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567u;
    struct engine_sink sink = {bench_on_delta, &b};
    int rc = 0, submitted = 0;
    struct engine_stats s0, s1;
    engine_get_stats(e, &s0);
    double t0 = ms_now();
    while (submitted < n_prompts) {
        pthread_mutex_lock(&b.mu);
        while (b.in_flight >= concurrency) pthread_cond_wait(&b.cv, &b.mu);
        b.in_flight++;
        pthread_mutex_unlock(&b.mu);
        for (int i = 0; i < input_len; i++) prompt[i] = (int32_t)(xorshift(&x) % (uint64_t)vocab);
        struct engine_request r;
        engine_request_default(&r);
        r.prompt = prompt;
        r.n_prompt = input_len;
        r.sampling.temperature = temperature;
        r.sampling.has_seed = true;
        r.sampling.seed = seed + (uint64_t)submitted;
        r.stop.max_tokens = output_len;
        r.stop.ignore_eos = true;
        rc = engine_submit(e, &r, &sink, NULL, err, errlen);
        if (rc) {
            pthread_mutex_lock(&b.mu);
            b.in_flight--;
            pthread_mutex_unlock(&b.mu);
            break;
        }
        submitted++;
    }
    pthread_mutex_lock(&b.mu);
    while (b.done < submitted) pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
    double t1 = ms_now();
    stats_after_last_step(e, &s1);
    free(prompt);
    pr->concurrency = concurrency;
    pr->seconds = t1 - t0;
    pr->steps = s1.steps - s0.steps;
    pr->padded_steps = s1.rank[0].padded_steps - s0.rank[0].padded_steps;
    pr->graph_steps = s1.rank[0].graph_steps - s0.rank[0].graph_steps;
    pr->n_ranks = s1.n_ranks < SHOWN_RANKS ? s1.n_ranks : SHOWN_RANKS;
    for (int ri = 0; ri < pr->n_ranks; ri++) {
        for (int f = 0; f < ENGINE_PHASES; f++)
            pr->phase[ri][f] = s1.rank[ri].phase_seconds[f] - s0.rank[ri].phase_seconds[f];
        pr->exchange[ri] = s1.rank[ri].exchange_seconds - s0.rank[ri].exchange_seconds;
        pr->decode_steps[ri] = s1.rank[ri].decode_steps - s0.rank[ri].decode_steps;
        for (int f = 0; f < ENGINE_PHASES; f++)
            pr->decode_phase[ri][f] = s1.rank[ri].decode_phase_seconds[f] - s0.rank[ri].decode_phase_seconds[f];
    }
    pr->done = b.done - b.failed;
    pr->failed = b.failed;
    pr->input_tokens = (long long)input_len * b.done;
    pr->output_tokens = b.output_tokens;
    if (!rc && b.failed)
        rc = ms_err(err, errlen, MS_EINTERNAL, "%d requests failed; the first: %s", b.failed,
                    b.first_error);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    return rc;
}

static double ms_per(double seconds, uint64_t steps) { return steps ? seconds * 1e3 / (double)steps : 0.0; }

static double step_ms(const struct pass_result *r, double seconds) { return ms_per(seconds, r->steps); }

// Rank ri's phases over its decode steps (decode) or over the others, in
// ms per step: " attention 5.10 moe 35.20 ...", or JSON's fields.
static void print_split(const struct pass_result *r, int ri, bool decode, bool json)
{
    const uint64_t nd = r->decode_steps[ri], n = decode ? nd : r->steps > nd ? r->steps - nd : 0;
    for (int f = 0; f < ENGINE_PHASES; f++) {
        const double s = decode ? r->decode_phase[ri][f] : r->phase[ri][f] - r->decode_phase[ri][f];
        if (json) printf("%s\"%s\": %.3f", f ? ", " : "", engine_phase_names[f], ms_per(s, n));
        else printf(" %s %.2f", engine_phase_names[f], ms_per(s, n));
    }
}

static void print_pass(const struct pass_result *r, const struct engine_opts *o, int n_threads, int n_prompts,
                       int input_len, int output_len, bool json)
{
    double rps = r->done / r->seconds;
    double out_tps = (double)r->output_tokens / r->seconds;
    double tot_tps = (double)(r->output_tokens + r->input_tokens) / r->seconds;
    if (json) {
        printf("{\"max_concurrency\": %d, \"num_prompts\": %d, \"input_len\": %d, "
               "\"output_len\": %d, \"data_parallel_size\": %d, \"threads\": %d, "
               "\"elapsed_time\": %.4f, \"num_requests\": %d, \"total_num_tokens\": %lld, "
               "\"requests_per_second\": %.4f, \"tokens_per_second\": %.2f, "
               "\"output_tokens_per_second\": %.2f, \"steps\": %llu, \"padded_steps\": %llu, "
               "\"graph_steps\": %llu, \"step_ms\": [",
               r->concurrency, n_prompts, input_len, output_len, o->data_parallel_size,
               n_threads, r->seconds, r->done, r->output_tokens + r->input_tokens, rps, tot_tps,
               out_tps, (unsigned long long)r->steps, (unsigned long long)r->padded_steps,
               (unsigned long long)r->graph_steps);
        for (int ri = 0; ri < r->n_ranks; ri++) {
            printf("%s{", ri ? ", " : "");
            for (int f = 0; f < ENGINE_PHASES; f++)
                printf("\"%s\": %.3f, ", engine_phase_names[f], step_ms(r, r->phase[ri][f]));
            printf("\"exchange\": %.3f}", step_ms(r, r->exchange[ri]));
        }
        printf("], \"decode_steps\": [");
        for (int ri = 0; ri < r->n_ranks; ri++)
            printf("%s%llu", ri ? ", " : "", (unsigned long long)r->decode_steps[ri]);
        for (int decode = 1; decode >= 0; decode--) {
            printf("], \"%s_step_ms\": [", decode ? "decode" : "other");
            for (int ri = 0; ri < r->n_ranks; ri++) {
                printf("%s{", ri ? ", " : "");
                print_split(r, ri, decode, true);
                printf("}");
            }
        }
        printf("]}\n");
    } else {
        printf("max-concurrency %d: Throughput: %.2f requests/s, %.2f total tokens/s, "
               "%.2f output tokens/s (%d requests, %lld tokens in %.2f s)\n",
               r->concurrency, rps, tot_tps, out_tps, r->done, r->output_tokens + r->input_tokens,
               r->seconds);
        // Where a step's time went, so that a figure comes with its reason.
        if (r->padded_steps)
            printf("  decode steps padded to a bucket: %llu, replayed as graphs: %llu\n",
                   (unsigned long long)r->padded_steps, (unsigned long long)r->graph_steps);
        for (int ri = 0; ri < r->n_ranks; ri++) {
            printf("  rank %d, ms per step over %llu steps:", ri, (unsigned long long)r->steps);
            for (int f = 0; f < ENGINE_PHASES; f++)
                printf(" %s %.2f", engine_phase_names[f], step_ms(r, r->phase[ri][f]));
            printf(" (exchanges %.2f)\n", step_ms(r, r->exchange[ri]));
            const uint64_t nd = r->decode_steps[ri];
            printf("    %llu decode steps:", (unsigned long long)nd);
            print_split(r, ri, true, false);
            printf("; %llu other steps:", (unsigned long long)(r->steps > nd ? r->steps - nd : 0));
            print_split(r, ri, false, false);
            printf("\n");
        }
    }
    fflush(stdout);
}

int cmd_bench_offline(int argc, char **argv)
{
    struct engine_flags fl;
    engine_flags_init(&fl);
    const char *dir = NULL;
    int n_prompts = 64, input_len = 256, output_len = 128;
    int conc[MAX_PASSES], n_conc = 0;
    uint64_t seed = 0;
    float temperature = 1.0f;
    int rounds = 1;
    bool json = false;
    char err[1024];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        int rc = engine_flags_parse_one(&fl, argc, argv, &i, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "moeserve bench-offline: %s\n", err);
            return 2;
        }
        if (rc > 0) continue;
        int64_t v;
        rc = 0;
        if (!strcmp(a, "--json")) {
            json = true;
        } else if (a[0] == '-' && i + 1 >= argc) {
            fprintf(stderr, "moeserve bench-offline: %s needs a value (or is unknown)\n", a);
            return 2;
        } else if (!strcmp(a, "--num-prompts") || !strcmp(a, "--input-len") ||
                   !strcmp(a, "--output-len")) {
            int *dst = !strcmp(a, "--num-prompts") ? &n_prompts
                     : !strcmp(a, "--input-len")   ? &input_len
                                                   : &output_len;
            if (!(rc = cli_parse_count(a, argv[++i], 1, 1 << 24, &v, err, sizeof err)))
                *dst = (int)v;
        } else if (!strcmp(a, "--max-concurrency")) {
            char *list = strdup(argv[++i]);
            if (!list) return 1;
            n_conc = 0;
            for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && !rc;
                 tok = strtok_r(NULL, ",", &save)) {
                char what[64];
                snprintf(what, sizeof what, "at most %d numbers separated by commas", MAX_PASSES);
                if (n_conc == MAX_PASSES)
                    rc = cli_refuse(a, argv[i], what, err, sizeof err);
                else if (!(rc = cli_parse_count(a, tok, 1, 1 << 20, &v, err, sizeof err)))
                    conc[n_conc++] = (int)v;
            }
            free(list);
        } else if (!strcmp(a, "--rounds")) {
            if (!(rc = cli_parse_count(a, argv[++i], 1, MAX_ROUNDS, &v, err, sizeof err)))
                rounds = (int)v;
        } else if (!strcmp(a, "--temperature")) {
            double t;
            if (!(rc = cli_parse_double(a, argv[++i], 0, 100, &t, err, sizeof err)))
                temperature = (float)t;
        } else if (!strcmp(a, "--seed")) {
            if (!(rc = cli_parse_count(a, argv[++i], 0, INT64_MAX, &v, err, sizeof err)))
                seed = (uint64_t)v;
        } else if (a[0] == '-') {
            fprintf(stderr, "moeserve bench-offline: unknown option %s (see --help)\n", a);
            return 2;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "moeserve bench-offline: one MODEL_DIR only (got %s and %s)\n", dir, a);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "moeserve bench-offline: %s\n", err);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    engine_flags_end(&fl);
    if (n_conc == 0) conc[n_conc++] = n_prompts;
    struct model *m;
    const struct model_load_opts lo = engine_flags_load_opts(&fl);
    if (model_load_opts(dir, &lo, &m, err, sizeof err)) {
        fprintf(stderr, "moeserve bench-offline: %s\n", err);
        return 1;
    }
    engine_flags_finish(&fl, &m->cfg);
    struct engine_opts o = fl.opts;
    if (o.max_model_len == 0 && input_len + output_len > m->cfg.max_position_embeddings) {
        fprintf(stderr, "moeserve bench-offline: --input-len %d + --output-len %d exceeds the "
                "model's %d positions\n", input_len, output_len, m->cfg.max_position_embeddings);
        model_destroy(m);
        return 2;
    }
    struct engine *e;
    if (engine_create(m, NULL, &o, &e, err, sizeof err)) {
        fprintf(stderr, "moeserve bench-offline: %s\n", err);
        model_destroy(m);
        return 1;
    }
    // A short warm-up maps the weights in and starts the thread pools.
    struct pass_result warm, res[MAX_PASSES * MAX_ROUNDS];
    int rc = run_pass(e, m->cfg.vocab_size, 2, input_len < 32 ? input_len : 32, 4, 2, temperature,
                      seed + 999, &warm, err, sizeof err);
    int n_pass = 0;
    // Rounds interleave the concurrencies, so that a slow spell on a shared
    // machine weighs on all of them alike.
    for (int round = 0; !rc && round < rounds; round++)
        for (int c = 0; !rc && c < n_conc; c++, n_pass++) {
            // Other prompts in every pass, so that no pass hits the prefix cache.
            rc = run_pass(e, m->cfg.vocab_size, n_prompts, input_len, output_len, conc[c],
                          temperature, seed + 1000003u * (uint64_t)(n_pass + 1), &res[n_pass],
                          err, sizeof err);
            if (!rc) print_pass(&res[n_pass], &o, engine_threads(e), n_prompts, input_len, output_len, json);
        }
    if (rc) {
        fprintf(stderr, "moeserve bench-offline: %s\n", err);
    } else if (!json && (n_conc > 1 || rounds > 1)) {
        // Pooled over the rounds: tokens of all passes over their time.
        double rate[MAX_PASSES];
        for (int c = 0; c < n_conc; c++) {
            double tok = 0, sec = 0;
            for (int p = c; p < n_pass; p += n_conc) {
                tok += (double)res[p].output_tokens;
                sec += res[p].seconds;
            }
            rate[c] = tok / sec;
            printf("max-concurrency %d over %d round%s: %.2f output tokens/s\n", conc[c], rounds,
                   rounds > 1 ? "s" : "", rate[c]);
        }
        if (n_conc > 1)
            printf("output tokens/s at concurrency %d / at %d: %.2fx\n", conc[n_conc - 1], conc[0],
                   rate[n_conc - 1] / rate[0]);
    }
    fflush(stdout);
    engine_destroy(e);
    model_destroy(m);
    return rc ? 1 : 0;
}
