// cmd_generate: `moeserve generate` — runs a checkpoint on one prompt from the
// command line (token ids, or text when the checkpoint has a tokenizer), and
// `--bench`, decode and prefill speed beside the machine's measured limits.
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "model/cpu/kernels.h"
#include "model/cpu/probe.h"
#include "model/cpu/threadpool.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "scheduler/sampler.h"
#include "server/commands.h"

#define PREFILL_CHUNK 512

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve generate MODEL_DIR (--prompt-ids 1,2,3 | --prompt TEXT) [options]\n"
            "       moeserve generate MODEL_DIR --bench [--threads N] [--json]\n\n"
            "Runs the model on one prompt and prints the generated tokens: text when MODEL_DIR\n"
            "has a tokenizer, else token ids. Sampling defaults come from the checkpoint's\n"
            "generation_config.json, as vLLM does.\n\n"
            "  --prompt-ids LIST      comma-separated token ids\n"
            "  --prompt TEXT          text, encoded with MODEL_DIR's tokenizer\n"
            "  --max-tokens N         tokens to generate at most (16)\n"
            "  --temperature T        0 is greedy\n"
            "  --top-p P, --top-k K, --min-p P, --repetition-penalty R\n"
            "  --seed S               reproducible sampling (default: random)\n"
            "  --top-logprobs K       alternatives per token in --json output (0..%d, default 0)\n"
            "  --ignore-eos           keep going past end-of-sequence tokens\n"
            "  --json                 one JSON object: prompt_tokens, tokens (id, logprob,\n"
            "                         top_logprobs), text (with a tokenizer), finish_reason,\n"
            "                         timings\n"
            "  --threads N            compute threads (default: all cores)\n"
            "  --kv-cache-dtype D     auto (the checkpoint's dtype), bfloat16, float16, float32\n"
            "  --bench                decode tokens/s at batch 1 and prefill tokens/s for a\n"
            "                         %d-token prompt, beside the read bandwidth and FMA peak\n"
            "                         measured in the same run\n",
            ENGINE_MAX_LOGPROBS, PREFILL_CHUNK);
}

struct gen_opts {
    const char *dir;
    const char *prompt_ids, *prompt_text;
    int max_tokens;
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_rep;
    float temperature, top_p, min_p, rep;
    int top_k;
    bool has_seed;
    uint64_t seed;
    int top_logprobs;
    bool ignore_eos, json, bench;
    int threads;
    const char *kv_dtype;
};

static bool parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "moeserve generate: %s must be an integer from %ld to %ld, not '%s'\n", flag,
                lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

static bool parse_float(const char *flag, const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "moeserve generate: %s must be a number from %g to %g, not '%s'\n", flag, lo,
                hi, s);
        return false;
    }
    *out = (float)v;
    return true;
}

static int parse_args(int argc, char **argv, struct gen_opts *o)
{
    enum { O_IDS = 256, O_TEXT, O_MAX, O_TEMP, O_TOPP, O_TOPK, O_MINP, O_REP, O_SEED, O_LP, O_EOS,
           O_JSON, O_THREADS, O_KV, O_BENCH };
    static const struct option opts[] = {
        {"prompt-ids", required_argument, NULL, O_IDS},
        {"prompt", required_argument, NULL, O_TEXT},
        {"max-tokens", required_argument, NULL, O_MAX},
        {"temperature", required_argument, NULL, O_TEMP},
        {"top-p", required_argument, NULL, O_TOPP},
        {"top-k", required_argument, NULL, O_TOPK},
        {"min-p", required_argument, NULL, O_MINP},
        {"repetition-penalty", required_argument, NULL, O_REP},
        {"seed", required_argument, NULL, O_SEED},
        {"top-logprobs", required_argument, NULL, O_LP},
        {"ignore-eos", no_argument, NULL, O_EOS},
        {"json", no_argument, NULL, O_JSON},
        {"threads", required_argument, NULL, O_THREADS},
        {"kv-cache-dtype", required_argument, NULL, O_KV},
        {"bench", no_argument, NULL, O_BENCH},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    o->max_tokens = 16;
    o->kv_dtype = "auto";
    long v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_IDS: o->prompt_ids = optarg; break;
        case O_TEXT: o->prompt_text = optarg; break;
        case O_MAX:
            if (!parse_long("--max-tokens", optarg, 1, 1 << 30, &v)) return 2;
            o->max_tokens = (int)v;
            break;
        case O_TEMP:
            if (!parse_float("--temperature", optarg, 0, 1e6, &o->temperature)) return 2;
            o->has_temperature = true;
            break;
        case O_TOPP:
            if (!parse_float("--top-p", optarg, 1e-9, 1, &o->top_p)) return 2;
            o->has_top_p = true;
            break;
        case O_TOPK:
            if (!parse_long("--top-k", optarg, -1, INT32_MAX, &v)) return 2;
            o->top_k = (int)v;
            o->has_top_k = true;
            break;
        case O_MINP:
            if (!parse_float("--min-p", optarg, 0, 1, &o->min_p)) return 2;
            o->has_min_p = true;
            break;
        case O_REP:
            if (!parse_float("--repetition-penalty", optarg, 1e-6, 1e6, &o->rep)) return 2;
            o->has_rep = true;
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-') {
                fprintf(stderr, "moeserve generate: --seed must be a non-negative integer, not '%s'\n",
                        optarg);
                return 2;
            }
            o->seed = s;
            o->has_seed = true;
            break;
        }
        case O_LP:
            if (!parse_long("--top-logprobs", optarg, 0, ENGINE_MAX_LOGPROBS, &v)) return 2;
            o->top_logprobs = (int)v;
            break;
        case O_EOS: o->ignore_eos = true; break;
        case O_JSON: o->json = true; break;
        case O_THREADS:
            if (!parse_long("--threads", optarg, 1, 4096, &v)) return 2;
            o->threads = (int)v;
            break;
        case O_KV: o->kv_dtype = optarg; break;
        case O_BENCH: o->bench = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "moeserve generate: give exactly one MODEL_DIR%s\n\n",
                optind < argc ? " (unexpected extra argument)" : "");
        usage(stderr);
        return 2;
    }
    o->dir = argv[optind];
    if (!o->bench && !o->prompt_ids == !o->prompt_text) {
        fprintf(stderr, "moeserve generate: give either --prompt-ids or --prompt\n\n");
        usage(stderr);
        return 2;
    }
    return -1; // parsed; go on
}

static int kv_dtype_from(const char *s, const struct model *m, enum dtype *out)
{
    if (!strcmp(s, "auto")) *out = m->cfg.torch_dtype;
    else if (!strcmp(s, "bfloat16") || !strcmp(s, "bf16")) *out = DTYPE_BF16;
    else if (!strcmp(s, "float16") || !strcmp(s, "half") || !strcmp(s, "fp16")) *out = DTYPE_F16;
    else if (!strcmp(s, "float32") || !strcmp(s, "float") || !strcmp(s, "fp32")) *out = DTYPE_F32;
    else {
        fprintf(stderr, "moeserve generate: --kv-cache-dtype must be auto, bfloat16, float16 or "
                "float32, not '%s'\n", s);
        return 2;
    }
    return 0;
}

// Ids like "1,2, 3"; each checked against the vocabulary.
static int parse_prompt_ids(const char *s, int vocab, int32_t **out, int *n_out)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "moeserve generate: out of memory\n");
        return 1;
    }
    int n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= vocab) {
            fprintf(stderr, "moeserve generate: --prompt-ids entry %d ('%.*s') is not a token id in "
                    "0..%d\n", n + 1, (int)strcspn(p, ","), p, vocab - 1);
            free(ids);
            return 2;
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (!*p) break;
        if (*p != ',') {
            fprintf(stderr, "moeserve generate: --prompt-ids must be comma-separated integers; "
                    "unexpected '%c'\n", *p);
            free(ids);
            return 2;
        }
        p++;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

struct runner {
    struct model *m;
    struct kv_pool *kv;
    struct rank *r;
    int32_t *blocks;
    float *logits;
    int capacity; // tokens the KV blocks hold
};

static void runner_close(struct runner *x)
{
    rank_destroy(x->r);
    kv_pool_destroy(x->kv);
    free(x->blocks);
    free(x->logits);
    memset(x, 0, sizeof *x);
}

static int runner_open(struct runner *x, struct model *m, enum dtype kv_dtype, int threads,
                       int capacity, int max_batch)
{
    char err[1024];
    memset(x, 0, sizeof *x);
    x->m = m;
    x->capacity = capacity;
    int nb = (capacity + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    struct rank_opts ro = {.rank = 0, .n_ranks = 1, .n_threads = threads,
                           .max_batch_tokens = max_batch, .max_batch_seqs = 1};
    x->blocks = malloc((size_t)nb * sizeof *x->blocks);
    x->logits = malloc((size_t)m->cfg.vocab_size * sizeof *x->logits);
    if (!x->blocks || !x->logits) {
        fprintf(stderr, "moeserve generate: out of memory\n");
        runner_close(x);
        return 1;
    }
    for (int i = 0; i < nb; i++) x->blocks[i] = i;
    if (kv_pool_create(&m->cfg, kv_dtype, nb, &x->kv, err, sizeof err) ||
        rank_create(m, x->kv, &ro, &x->r, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        runner_close(x);
        return 1;
    }
    return 0;
}

// Appends n tokens at n_past, in chunks of at most max_batch; logits of the last.
static int runner_feed(struct runner *x, const int32_t *tokens, int n, int n_past, int max_batch)
{
    char err[1024];
    for (int done = 0; done < n;) {
        int c = n - done < max_batch ? n - done : max_batch;
        struct fwd_seq s = {.tokens = tokens + done, .n_new = c, .n_past = n_past + done,
                            .blocks = x->blocks, .n_logits = done + c == n};
        struct fwd_batch b = {.n_seqs = 1, .seqs = &s};
        if (rank_forward(x->r, &b, x->logits, err, sizeof err)) {
            fprintf(stderr, "moeserve generate: %s\n", err);
            return 1;
        }
        done += c;
    }
    return 0;
}

static double json_lp(float lp) { return isfinite(lp) ? lp : -9999.0; } // vLLM's stand-in for -inf

static void sampling_from(const struct gen_opts *o, const struct model_config *cfg,
                          struct engine_sampling *p)
{
    const struct gen_defaults *g = &cfg->gen;
    *p = (struct engine_sampling){.temperature = 1, .top_p = 1, .top_k = 0, .min_p = 0,
                                  .repetition_penalty = 1, .logprobs = o->top_logprobs,
                                  .prompt_logprobs = -1};
    if (g->has_temperature) p->temperature = g->temperature;
    if (g->has_top_p) p->top_p = g->top_p;
    if (g->has_top_k) p->top_k = g->top_k;
    if (g->has_min_p) p->min_p = g->min_p;
    if (g->has_repetition_penalty) p->repetition_penalty = g->repetition_penalty;
    if (o->has_temperature) p->temperature = o->temperature;
    if (o->has_top_p) p->top_p = o->top_p;
    if (o->has_top_k) p->top_k = o->top_k;
    if (o->has_min_p) p->min_p = o->min_p;
    if (o->has_rep) p->repetition_penalty = o->rep;
    p->has_seed = o->has_seed;
    p->seed = o->seed;
}

static bool is_eos(const struct model_config *cfg, int32_t id)
{
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return true;
    return false;
}

static int run_generate(const struct gen_opts *o, struct model *m)
{
    const struct model_config *cfg = &m->cfg;
    char err[1024], path[4200];
    int rc = 1;
    struct tokenizer *tok = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", o->dir);
    if (access(path, R_OK) == 0 && tok_load(o->dir, &tok, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return 1;
    }
    int32_t *prompt = NULL, *out = NULL;
    int n_prompt = 0;
    struct sampler_scratch *scratch = NULL;
    struct runner x = {0};
    if (o->prompt_text) {
        if (!tok) {
            fprintf(stderr, "moeserve generate: %s has no tokenizer.json, so --prompt cannot be "
                    "encoded; give --prompt-ids\n", o->dir);
            rc = 2;
            goto done;
        }
        size_t n;
        if (tok_encode(tok, o->prompt_text, strlen(o->prompt_text), &prompt, &n, err, sizeof err)) {
            fprintf(stderr, "moeserve generate: --prompt: %s\n", err);
            goto done;
        }
        for (size_t i = 0; i < n; i++)
            if (prompt[i] >= cfg->vocab_size) {
                fprintf(stderr, "moeserve generate: the tokenizer gives id %d, outside the model's "
                        "vocabulary of %d\n", prompt[i], cfg->vocab_size);
                goto done;
            }
        n_prompt = (int)n;
        if (n_prompt == 0) {
            fprintf(stderr, "moeserve generate: --prompt encodes to no tokens\n");
            rc = 2;
            goto done;
        }
    } else if ((rc = parse_prompt_ids(o->prompt_ids, cfg->vocab_size, &prompt, &n_prompt))) {
        goto done;
    }
    rc = 1;
    if ((long long)n_prompt + o->max_tokens > cfg->max_position_embeddings) {
        fprintf(stderr, "moeserve generate: the prompt (%d tokens) plus --max-tokens %d exceeds the "
                "model's max_position_embeddings %d\n", n_prompt, o->max_tokens,
                cfg->max_position_embeddings);
        rc = 2;
        goto done;
    }
    enum dtype kvt;
    if ((rc = kv_dtype_from(o->kv_dtype, m, &kvt))) goto done;
    rc = 1;
    int chunk = n_prompt < PREFILL_CHUNK ? n_prompt : PREFILL_CHUNK;
    if (runner_open(&x, m, kvt, o->threads, n_prompt + o->max_tokens, chunk)) goto done;
    struct engine_sampling sp;
    sampling_from(o, cfg, &sp);
    sp.logprobs = o->json ? o->top_logprobs : -1; // the JSON always carries logprobs
    struct sampler_rng rng;
    sampler_rng_seed(&rng, o->has_seed ? o->seed : (uint64_t)ms_unix_time() ^ ((uint64_t)getpid() << 32) ^
                                                      (uint64_t)(ms_now() * 1e9));
    scratch = sampler_scratch_create(cfg->vocab_size);
    out = malloc((size_t)o->max_tokens * sizeof *out);
    struct engine_token *toks = malloc((size_t)o->max_tokens * sizeof *toks);
    if (!scratch || !out || !toks) {
        free(toks);
        fprintf(stderr, "moeserve generate: out of memory\n");
        goto done;
    }
    struct tok_stream ts;
    char *text = NULL;
    if (tok) {
        tok_stream_init(&ts, tok, true);
        text = malloc(tok_stream_max_output(tok) + 1);
        if (!text) {
            free(toks);
            goto done;
        }
    }
    double t0 = ms_now();
    if (runner_feed(&x, prompt, n_prompt, 0, chunk)) {
        free(toks);
        free(text);
        goto done;
    }
    const double t_prefill = ms_now() - t0;
    const char *finish = "length";
    int n_out = 0;
    double t1 = ms_now();
    for (;;) {
        struct engine_token *t = &toks[n_out];
        if (sampler_sample(&sp, x.logits, cfg->vocab_size, prompt, n_prompt, out, n_out, &rng,
                           scratch, t)) {
            fprintf(stderr, "moeserve generate: the sampling parameters are invalid\n");
            free(toks);
            free(text);
            goto done;
        }
        out[n_out++] = t->id;
        if (!o->json) {
            if (tok) {
                size_t nt = 0;
                if (tok_stream_feed(&ts, t->id, text, tok_stream_max_output(tok), &nt) == 0)
                    fwrite(text, 1, nt, stdout);
            } else {
                printf("%s%d", n_out > 1 ? " " : "", t->id);
            }
            fflush(stdout);
        }
        if (!o->ignore_eos && is_eos(cfg, t->id)) {
            finish = "stop";
            break;
        }
        if (n_out == o->max_tokens) break;
        if (runner_feed(&x, &t->id, 1, n_prompt + n_out - 1, 1)) {
            free(toks);
            free(text);
            goto done;
        }
    }
    const double t_decode = ms_now() - t1;
    // The first token comes with the prefill; decode speed counts the rest.
    const double prefill_tps = n_prompt / t_prefill, decode_tps = n_out > 1 ? (n_out - 1) / t_decode : 0;
    if (o->json) {
        json_t *root = json_object(), *arr = json_array();
        json_object_set_new(root, "prompt_tokens", json_integer(n_prompt));
        for (int i = 0; i < n_out; i++) {
            json_t *e = json_object(), *top = json_array();
            json_object_set_new(e, "id", json_integer(toks[i].id));
            json_object_set_new(e, "logprob", json_real(json_lp(toks[i].logprob)));
            for (int j = 0; j < toks[i].n_top; j++)
                json_array_append_new(top, json_pack("{s:i, s:f}", "id", (json_int_t)toks[i].top[j].id,
                                                     "logprob", json_lp(toks[i].top[j].logprob)));
            json_object_set_new(e, "top_logprobs", top);
            json_array_append_new(arr, e);
        }
        json_object_set_new(root, "tokens", arr);
        if (tok) { // the generated text too, when the checkpoint has a tokenizer
            char *t = NULL;
            size_t tl = 0;
            if (tok_decode(tok, out, (size_t)n_out, true, &t, &tl, err, sizeof err) == 0)
                json_object_set_new(root, "text", json_stringn(t, tl));
            free(t);
        }
        json_object_set_new(root, "finish_reason", json_string(finish));
        json_object_set_new(root, "timings",
                            json_pack("{s:f, s:f, s:f, s:f}", "prefill_seconds", t_prefill,
                                      "decode_seconds", t_decode, "prefill_tokens_per_second",
                                      prefill_tps, "decode_tokens_per_second", decode_tps));
        char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (s) puts(s);
        free(s);
        json_decref(root);
    } else {
        if (tok) {
            size_t nt = 0;
            if (tok_stream_finish(&ts, text, tok_stream_max_output(tok), &nt) == 0)
                fwrite(text, 1, nt, stdout);
        }
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "%d prompt tokens in %.3f s (%.1f tokens/s), %d generated in %.3f s "
                "(%.1f tokens/s after the first), finish: %s\n", n_prompt, t_prefill, prefill_tps,
                n_out, t_decode, decode_tps, finish);
    }
    free(toks);
    free(text);
    rc = 0;
done:
    runner_close(&x);
    sampler_scratch_destroy(scratch);
    free(prompt);
    free(out);
    tok_destroy(tok);
    return rc;
}

// ---- --bench --------------------------------------------------------------------------

// FLOPs of a prefill of n tokens from position 0 with logits for the last:
// every weight-matrix product (2 per weight per token; the experts each
// token is routed to), the causal attention products, and one lm_head row.
static double prefill_flops(const struct model *m, int n)
{
    const struct model_config *c = &m->cfg;
    const double hd = c->hidden_size, qd = (double)c->n_heads * c->head_dim;
    const double kvd = (double)c->n_kv_heads * c->head_dim;
    double per_tok = 0;
    for (int l = 0; l < c->n_layers; l++) {
        per_tok += 2 * (hd * qd + 2 * hd * kvd + qd * hd);
        if (m->layers[l].is_moe)
            per_tok += 2 * hd * c->n_experts + 2 * 3.0 * hd * c->moe_intermediate_size * c->n_experts_per_tok;
        else
            per_tok += 2 * 3.0 * hd * c->intermediate_size;
    }
    // Position p attends to p + 1 keys: q.k and p.v, 2 FLOPs each per element.
    double attn = 0;
    for (int l = 0; l < c->n_layers; l++) attn += 4.0 * qd * ((double)n * (n + 1) / 2);
    return per_tok * n + attn + 2 * hd * c->vocab_size;
}

static int run_bench(const struct gen_opts *o, struct model *m)
{
    const struct model_config *cfg = &m->cfg;
    const int n_prompt = PREFILL_CHUNK, n_decode = 64, decode_prompt = 16;
    enum dtype kvt;
    if (kv_dtype_from(o->kv_dtype, m, &kvt)) return 2;
    if (n_prompt + n_decode + decode_prompt > cfg->max_position_embeddings) {
        fprintf(stderr, "moeserve generate --bench: the model's max_position_embeddings (%d) is "
                "below the %d tokens the benchmark uses\n", cfg->max_position_embeddings,
                n_prompt + n_decode);
        return 1;
    }
    char err[1024];
    struct runner x;
    if (runner_open(&x, m, kvt, o->threads, n_prompt + n_decode, n_prompt)) return 1;
    struct threadpool *pool = NULL;
    struct cpu_read_probe probe = {0};
    const struct cpu_kernels *k = cpu_kernels_best();
    int threads = o->threads ? o->threads : threadpool_cpu_count();
    int rc = 1;
    if (threadpool_create(threads, &pool, err, sizeof err) ||
        cpu_read_probe_create((size_t)1 << 30, &probe, err, sizeof err)) {
        fprintf(stderr, "moeserve generate --bench: %s\n", err);
        goto done;
    }
    int32_t *prompt = malloc((size_t)(n_prompt + n_decode) * sizeof *prompt);
    if (!prompt) goto done;
    uint64_t seed = 12345;
    for (int i = 0; i < n_prompt + n_decode; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((seed >> 33) % (uint64_t)cfg->vocab_size);
    }
    // Warm up: fault the mapped weights in and settle the threads.
    if (runner_feed(&x, prompt, n_prompt, 0, n_prompt)) goto free_prompt;

    // Rounds that interleave each measurement with the limit it is compared
    // with, so that both see the same machine; other processes only ever
    // slow a measurement down, so the best of each is the least disturbed.
    const int rounds = 5, window = n_decode / 4;
    const long iters = 4000000;
    double bw = 0, peak = 0, step = INFINITY, best_prefill = INFINITY;
    double step_sum = 0, prefill_sum = 0, bw_sum = 0, peak_sum = 0;
    for (int round = 0; round < rounds; round++) {
        double b1 = cpu_read_probe_run(&probe, pool, k, 1);
        if (runner_feed(&x, prompt, decode_prompt, 0, n_prompt)) goto free_prompt;
        double t0 = ms_now();
        for (int i = 0; i < window; i++) {
            int32_t next = 0;
            for (int v = 1; v < cfg->vocab_size; v++)
                if (x.logits[v] > x.logits[next]) next = v;
            if (runner_feed(&x, &next, 1, decode_prompt + i, 1)) goto free_prompt;
        }
        double st = (ms_now() - t0) / window;
        double p1 = cpu_fma_peak(pool, k, iters, 1);
        t0 = ms_now();
        if (runner_feed(&x, prompt, n_prompt, 0, n_prompt)) goto free_prompt;
        double pt = ms_now() - t0;
        bw = b1 > bw ? b1 : bw;
        peak = p1 > peak ? p1 : peak;
        step = st < step ? st : step;
        best_prefill = pt < best_prefill ? pt : best_prefill;
        bw_sum += b1;
        peak_sum += p1;
        step_sum += st;
        prefill_sum += pt;
    }
    const double active = (double)model_active_bytes(m), flops = prefill_flops(m, n_prompt);
    const double bw_mean = bw_sum / rounds, peak_mean = peak_sum / rounds;
    const double step_mean = step_sum / rounds, prefill_mean = prefill_sum / rounds;
    const double decode_gbs = active / step / 1e9, prefill_gfs = flops / best_prefill / 1e9;
    if (o->json) {
        json_t *j = json_pack(
            "{s:s, s:i, s:s, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
            "s:f, s:f, s:f}",
            "model", o->dir, "threads", threads, "kernels", k->name, "kv_cache_dtype", dtype_name(kvt),
            "rounds", rounds, "read_bandwidth_gbs", bw / 1e9, "fma_peak_gflops", peak / 1e9,
            "decode_tokens_per_second", 1.0 / step, "decode_step_seconds", step,
            "decode_active_bytes", active, "decode_gbs", decode_gbs,
            "decode_fraction_of_bandwidth", decode_gbs / (bw / 1e9),
            "prefill_tokens", (double)n_prompt, "prefill_tokens_per_second", n_prompt / best_prefill,
            "prefill_seconds", best_prefill, "prefill_gflop", flops / 1e9,
            "prefill_gflops", prefill_gfs, "prefill_fraction_of_peak", prefill_gfs / (peak / 1e9),
            "decode_fraction_of_bandwidth_means", active / step_mean / bw_mean,
            "prefill_fraction_of_peak_means", flops / prefill_mean / peak_mean);
        char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        if (s) puts(s);
        free(s);
        json_decref(j);
    } else {
        printf("model: %s (hidden %d, %d layers, %d experts top-%d, vocabulary %d), %d threads, "
               "kernels %s, KV %s\n", o->dir, cfg->hidden_size, cfg->n_layers, cfg->n_experts,
               cfg->n_experts_per_tok, cfg->vocab_size, threads, k->name, dtype_name(kvt));
        printf("%d interleaved rounds; best of each (mean in brackets):\n", rounds);
        printf("  machine: read bandwidth %.2f GB/s [%.2f] (1 GiB streamed on %d threads), "
               "FMA peak %.1f GFLOP/s [%.1f] (%s)\n", bw / 1e9, bw_mean / 1e9, threads, peak / 1e9,
               peak_mean / 1e9, k->name);
        printf("  decode, batch 1: %.1f tokens/s [%.1f], %.1f MB of weights per step -> %.2f GB/s "
               "= %.0f%% of the read bandwidth [%.0f%%]\n", 1.0 / step, 1.0 / step_mean, active / 1e6,
               decode_gbs, 100 * decode_gbs / (bw / 1e9), 100 * active / step_mean / bw_mean);
        printf("  prefill, %d tokens: %.0f tokens/s [%.0f], %.2f GFLOP -> %.1f GFLOP/s = %.0f%% of the "
               "FMA peak [%.0f%%]\n", n_prompt, n_prompt / best_prefill, n_prompt / prefill_mean,
               flops / 1e9, prefill_gfs, 100 * prefill_gfs / (peak / 1e9),
               100 * flops / prefill_mean / peak_mean);
    }
    rc = 0;
free_prompt:
    free(prompt);
done:
    cpu_read_probe_destroy(&probe);
    threadpool_destroy(pool);
    runner_close(&x);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    struct gen_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    char err[2048];
    struct model *m;
    if (model_load(o.dir, &m, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return 1;
    }
    rc = o.bench ? run_bench(&o, m) : run_generate(&o, m);
    model_destroy(m);
    return rc;
}
