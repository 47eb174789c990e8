// cmd_generate: `moeserve generate` — runs a checkpoint on one prompt from the
// command line (token ids, or text when the checkpoint has a tokenizer), and
// `--bench`, decode and prefill speed beside the machine's measured limits.
// Both go through the engine, as the server does: one engine path.
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "base/cli.h"
#include "model/backend_registry.h"
#include "model/model.h"
#include "model/sampling.h"
#include "scheduler/engine.h"
#include "server/commands.h"
#include "server/engine_flags.h"
#include "tokenizer/tokenizer.h"

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
            "  --threads N            compute threads (default: all the cores it may use)\n"
            "  --kv-cache-dtype D     auto (float32 for a float32 checkpoint, else bfloat16),\n"
            "                         bfloat16, float16, float32\n"
            "  --device D             auto, cpu or cuda (vLLM's --device; default auto)\n"
            "  --load-format F        auto (the safetensors) or dummy (random weights of\n"
            "                         config.json's shapes, made on the device; for benchmarks)\n"
            "  --quantization Q       fp8, int8 or int4: quantize the projections at load\n"
            "  --cache-dir DIR        where the CPU keeps its prepared weights (none: never)\n"
            "  --bench                decode tokens/s at batch 1 and prefill tokens/s for a\n"
            "                         %d-token prompt, beside the read bandwidth and FMA peak\n"
            "                         measured in the same run\n",
            SAMPLING_MAX_LOGPROBS, PREFILL_CHUNK);
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
    enum backend_device device;
    enum load_format load_format;
    enum quant_format quantization;
    const char *cache_dir;
};

// The shared number parsers (base/cli.h), their sentence on stderr.
static bool parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char err[256];
    int64_t v;
    if (cli_parse_int(flag, s, lo, hi, &v, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return false;
    }
    *out = (long)v;
    return true;
}

static bool parse_float(const char *flag, const char *s, double lo, double hi, float *out)
{
    char err[256];
    double v;
    if (cli_parse_double(flag, s, lo, hi, &v, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return false;
    }
    *out = (float)v;
    return true;
}

static int parse_args(int argc, char **argv, struct gen_opts *o)
{
    enum { O_IDS = 256, O_TEXT, O_MAX, O_TEMP, O_TOPP, O_TOPK, O_MINP, O_REP, O_SEED, O_LP, O_EOS,
           O_JSON, O_THREADS, O_KV, O_BENCH, O_DEVICE, O_LOAD, O_QUANT, O_CACHE };
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
        {"device", required_argument, NULL, O_DEVICE},
        {"load-format", required_argument, NULL, O_LOAD},
        {"quantization", required_argument, NULL, O_QUANT},
        {"cache-dir", required_argument, NULL, O_CACHE},
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
            if (!parse_float("--temperature", optarg, 0, 2, &o->temperature)) return 2;
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
            if (!parse_float("--repetition-penalty", optarg, 1e-6, 10, &o->rep)) return 2;
            o->has_rep = true;
            break;
        case O_SEED: {
            char err[256];
            if (cli_parse_u64("--seed", optarg, &o->seed, err, sizeof err)) {
                fprintf(stderr, "moeserve generate: %s\n", err);
                return 2;
            }
            o->has_seed = true;
            break;
        }
        case O_LP:
            if (!parse_long("--top-logprobs", optarg, 0, SAMPLING_MAX_LOGPROBS, &v)) return 2;
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
        case O_DEVICE:
            if (backend_device_parse(optarg, &o->device)) {
                fprintf(stderr, "moeserve generate: --device must be auto, cpu or cuda, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_LOAD:
            if (load_format_parse(optarg, &o->load_format)) {
                fprintf(stderr, "moeserve generate: --load-format must be auto or dummy, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_QUANT:
            if (quant_format_parse(optarg, &o->quantization)) {
                fprintf(stderr, "moeserve generate: --quantization must be fp8, int8 or int4, not "
                        "'%s'\n", optarg);
                return 2;
            }
            break;
        case O_CACHE: o->cache_dir = optarg; break;
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
    if (!strcmp(s, "auto")) *out = engine_flags_auto_kv_dtype(&m->cfg); // as serve's
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

static double json_lp(float lp) { return isfinite(lp) ? lp : -9999.0; } // vLLM's stand-in for -inf

static void sampling_from(const struct gen_opts *o, const struct model_config *cfg,
                          struct sampling_params *p)
{
    sampling_params_default(p);
    const struct sampling_set set = {.temperature = o->has_temperature, .top_p = o->has_top_p,
                                     .top_k = o->has_top_k, .min_p = o->has_min_p,
                                     .repetition_penalty = o->has_rep};
    sampling_params_merge_defaults(p, &set, &cfg->gen);
    if (o->has_temperature) p->temperature = o->temperature;
    if (o->has_top_p) p->top_p = o->top_p;
    if (o->has_top_k) p->top_k = o->top_k > 0 ? o->top_k : 0;
    if (o->has_min_p) p->min_p = o->min_p;
    if (o->has_rep) p->repetition_penalty = o->rep;
    p->has_seed = o->has_seed;
    p->seed = o->seed;
}

// ---- one request through the engine -------------------------------------------

// What the engine's sink collects for one request; the command's thread
// waits on it. Tokens and their times are kept; text is printed as it comes
// unless the output is JSON.
struct gen_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, print;
    struct sample_token *toks;   // (cap)
    int n, cap;
    enum engine_finish finish;
    char error[256];
    double t_submit, t_first, t_last;
    bool ids_only;               // no tokenizer: print ids
};

static void gen_on_delta(void *ctx, const struct engine_delta *d)
{
    struct gen_run *g = ctx;
    const double now = ms_now();
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < d->n_tokens; i++) {
        if (g->n == 0) g->t_first = now;
        g->t_last = now;
        if (g->n < g->cap) g->toks[g->n] = d->tokens[i];
        g->n++;
        if (g->print && g->ids_only) printf("%s%d", g->n > 1 ? " " : "", d->tokens[i].id);
    }
    if (g->print && !g->ids_only && d->text_len) fwrite(d->text, 1, d->text_len, stdout);
    if (g->print) fflush(stdout);
    if (d->finish != FINISH_NONE) {
        g->finish = d->finish;
        if (d->error) snprintf(g->error, sizeof g->error, "%s", d->error);
        g->done = true;
        pthread_cond_signal(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

// Submits one request and waits for its last delta. Returns 0, or 1 with a
// sentence on stderr.
static int gen_run_one(struct engine *e, const int32_t *prompt, int n_prompt,
                       const struct sampling_params *sp, int max_tokens, bool ignore_eos,
                       struct gen_run *g)
{
    struct engine_request req;
    engine_request_default(&req);
    req.prompt = prompt;
    req.n_prompt = n_prompt;
    req.sampling = *sp;
    req.stop.max_tokens = max_tokens;
    req.stop.ignore_eos = ignore_eos;
    g->n = 0;
    g->done = false;
    g->error[0] = 0;
    g->t_submit = ms_now();
    struct engine_sink sink = {.on_delta = gen_on_delta, .ctx = g};
    char err[1024];
    if (engine_submit(e, &req, &sink, NULL, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return 1;
    }
    pthread_mutex_lock(&g->mu);
    while (!g->done) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    if (g->finish == FINISH_ABORT) {
        fprintf(stderr, "moeserve generate: %s\n", g->error[0] ? g->error : "the request was aborted");
        return 1;
    }
    return 0;
}

// One sequence at a time, prefill in chunks of at most max_batch tokens, KV
// for exactly `capacity` tokens, no prefix cache (a benchmark repeats its
// prompts).
static int gen_engine(const struct gen_opts *o, struct model *m, const struct tokenizer *tok,
                      enum dtype kvt, int capacity, int max_batch, struct engine **out)
{
    struct engine_opts eo;
    engine_opts_default(&eo);
    eo.device = o->device;
    eo.n_threads = o->threads;
    eo.kv_dtype = kvt;
    const size_t blocks = ((size_t)capacity + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    eo.kv_cache_bytes = blocks * kv_block_bytes(&m->cfg, kvt);
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = max_batch;
    eo.max_model_len = capacity;
    eo.enable_prefix_caching = false;
    char err[2048];
    if (engine_create(m, tok, &eo, out, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return 1;
    }
    return 0;
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
    int32_t *prompt = NULL;
    int n_prompt = 0;
    struct engine *e = NULL;
    struct gen_run g = {.print = !o->json, .ids_only = !tok, .cap = o->max_tokens};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
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
    struct sampling_params sp;
    sampling_from(o, cfg, &sp);
    sp.logprobs = o->json ? o->top_logprobs : -1; // the JSON always carries logprobs
    g.toks = malloc((size_t)o->max_tokens * sizeof *g.toks);
    if (!g.toks) {
        fprintf(stderr, "moeserve generate: out of memory\n");
        goto done;
    }
    if (gen_engine(o, m, tok, kvt, n_prompt + o->max_tokens, PREFILL_CHUNK, &e)) goto done;
    if (gen_run_one(e, prompt, n_prompt, &sp, o->max_tokens, o->ignore_eos, &g)) goto done;
    const int n_out = g.n < g.cap ? g.n : g.cap;
    const char *finish = engine_finish_name(g.finish);
    // The first token comes with the prefill; decode speed counts the rest.
    const double t_prefill = g.t_first - g.t_submit, t_decode = g.t_last - g.t_first;
    const double prefill_tps = n_prompt / t_prefill;
    const double decode_tps = n_out > 1 && t_decode > 0 ? (n_out - 1) / t_decode : 0;
    if (o->json) {
        json_t *root = json_object(), *arr = json_array();
        json_object_set_new(root, "prompt_tokens", json_integer(n_prompt));
        int32_t *ids = malloc(((size_t)n_out + 1) * sizeof *ids);
        for (int i = 0; i < n_out; i++) {
            const struct sample_token *t = &g.toks[i];
            json_t *el = json_object(), *top = json_array();
            json_object_set_new(el, "id", json_integer(t->id));
            json_object_set_new(el, "logprob", json_real(json_lp(t->logprob)));
            for (int j = 0; j < t->n_top; j++)
                json_array_append_new(top, json_pack("{s:i, s:f}", "id", (json_int_t)t->top[j].id,
                                                     "logprob", json_lp(t->top[j].logprob)));
            json_object_set_new(el, "top_logprobs", top);
            json_array_append_new(arr, el);
            if (ids) ids[i] = t->id;
        }
        json_object_set_new(root, "tokens", arr);
        if (tok && ids) { // the generated text too, when the checkpoint has a tokenizer
            char *t = NULL;
            size_t tl = 0;
            if (tok_decode(tok, ids, (size_t)n_out, true, &t, &tl, err, sizeof err) == 0)
                json_object_set_new(root, "text", json_stringn(t, tl));
            free(t);
        }
        free(ids);
        json_object_set_new(root, "finish_reason", json_string(finish));
        json_object_set_new(root, "timings",
                            json_pack("{s:f, s:f, s:f, s:f}", "prefill_seconds", t_prefill,
                                      "decode_seconds", t_decode, "prefill_tokens_per_second",
                                      prefill_tps, "decode_tokens_per_second", decode_tps));
        char *js = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
        if (js) puts(js);
        free(js);
        json_decref(root);
    } else {
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "%d prompt tokens in %.3f s (%.1f tokens/s), %d generated in %.3f s "
                "(%.1f tokens/s after the first), finish: %s\n", n_prompt, t_prefill, prefill_tps,
                n_out, t_decode, decode_tps, finish);
    }
    rc = 0;
done:
    engine_destroy(e);
    free(g.toks);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    free(prompt);
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

// Rounds that interleave each measurement with the limits it is compared
// with, so that both see the same machine; other processes only ever slow a
// measurement down, so the best of each is the least disturbed. The engine
// runs the model (one request at a time, as a user's would); a second
// backend on the same device measures the limits between requests.
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
    int rc = 1;
    struct engine *e = NULL;
    struct backend *probe = NULL;
    int32_t *prompt = NULL;
    struct gen_run g = {.cap = n_decode};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    const int threads = o->threads ? o->threads : 0;
    enum backend_device dev;
    struct backend_opts bo = {.n_threads = threads};
    if (backend_device_resolve(o->device, &dev, NULL, 0, err, sizeof err) ||
        backend_create(dev, &bo, &probe, err, sizeof err)) {
        fprintf(stderr, "moeserve generate --bench: %s\n", err);
        goto done;
    }
    g.toks = malloc((size_t)n_decode * sizeof *g.toks);
    prompt = malloc((size_t)(n_prompt + n_decode) * sizeof *prompt);
    if (!g.toks || !prompt) goto done;
    uint64_t seed = 12345;
    for (int i = 0; i < n_prompt + n_decode; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((seed >> 33) % (uint64_t)cfg->vocab_size);
    }
    if (gen_engine(o, m, NULL, kvt, n_prompt + n_decode, n_prompt, &e)) goto done;
    struct sampling_params greedy;
    sampling_params_default(&greedy);
    greedy.temperature = 0;
    // Warm up: fault the weights in and settle the threads.
    if (gen_run_one(e, prompt, n_prompt, &greedy, 1, true, &g)) goto done;

    const int rounds = 5, window = n_decode / 4;
    double bw = 0, peak = 0, step = INFINITY, best_prefill = INFINITY;
    double step_sum = 0, prefill_sum = 0, bw_sum = 0, peak_sum = 0;
    for (int round = 0; round < rounds; round++) {
        struct backend_limits lim;
        if (probe->ops->measure_limits(probe, &lim)) {
            fprintf(stderr, "moeserve generate --bench: %s\n", probe->err);
            goto done;
        }
        // window + 1 tokens: the first comes with the prefill, the rest are
        // the decode steps timed.
        if (gen_run_one(e, prompt, decode_prompt, &greedy, window + 1, true, &g)) goto done;
        const double st = (g.t_last - g.t_first) / window;
        if (gen_run_one(e, prompt, n_prompt, &greedy, 1, true, &g)) goto done;
        const double pt = g.t_first - g.t_submit;
        bw = lim.read_bytes_per_s > bw ? lim.read_bytes_per_s : bw;
        peak = lim.flops > peak ? lim.flops : peak;
        step = st < step ? st : step;
        best_prefill = pt < best_prefill ? pt : best_prefill;
        bw_sum += lim.read_bytes_per_s;
        peak_sum += lim.flops;
        step_sum += st;
        prefill_sum += pt;
    }
    const char *kernels = probe->ops->variant(probe);
    const int shown_threads = engine_threads(e); // what the engine ran on, not a second count
    const double active = (double)model_active_bytes(m), flops = prefill_flops(m, n_prompt);
    const double bw_mean = bw_sum / rounds, peak_mean = peak_sum / rounds;
    const double step_mean = step_sum / rounds, prefill_mean = prefill_sum / rounds;
    const double decode_gbs = active / step / 1e9, prefill_gfs = flops / best_prefill / 1e9;
    if (o->json) {
        json_t *j = json_pack(
            "{s:s, s:i, s:s, s:s, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, "
            "s:f, s:f, s:f, s:f}",
            "model", o->dir, "threads", shown_threads, "device", backend_device_name(dev),
            "kernels", kernels, "kv_cache_dtype", dtype_name(kvt),
            "rounds", rounds, "read_bandwidth_gbs", bw / 1e9, "fma_peak_gflops", peak / 1e9,
            "decode_tokens_per_second", 1.0 / step, "decode_step_seconds", step,
            "decode_active_bytes", active, "decode_gbs", decode_gbs,
            "decode_fraction_of_bandwidth", decode_gbs / (bw / 1e9),
            "prefill_tokens", (double)n_prompt, "prefill_tokens_per_second", n_prompt / best_prefill,
            "prefill_seconds", best_prefill, "prefill_gflop", flops / 1e9,
            "prefill_gflops", prefill_gfs, "prefill_fraction_of_peak", prefill_gfs / (peak / 1e9),
            "decode_fraction_of_bandwidth_means", active / step_mean / bw_mean,
            "prefill_fraction_of_peak_means", flops / prefill_mean / peak_mean);
        char *js = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        if (js) puts(js);
        free(js);
        json_decref(j);
    } else {
        printf("model: %s (hidden %d, %d layers, %d experts top-%d, vocabulary %d), %d thread%s, "
               "%s kernels %s, KV %s\n", o->dir, cfg->hidden_size, cfg->n_layers, cfg->n_experts,
               cfg->n_experts_per_tok, cfg->vocab_size, shown_threads, shown_threads == 1 ? "" : "s",
               backend_device_name(dev), kernels, dtype_name(kvt));
        printf("%d interleaved rounds through the engine; best of each (mean in brackets):\n",
               rounds);
        printf("  machine: read bandwidth %.2f GB/s [%.2f] (1 GiB streamed on %d thread%s), "
               "FMA peak %.1f GFLOP/s [%.1f] (%s)\n", bw / 1e9, bw_mean / 1e9, shown_threads,
               shown_threads == 1 ? "" : "s", peak / 1e9, peak_mean / 1e9, kernels);
        printf("  decode, batch 1: %.1f tokens/s [%.1f], %.1f MB of weights per step -> %.2f GB/s "
               "= %.0f%% of the read bandwidth [%.0f%%]\n", 1.0 / step, 1.0 / step_mean, active / 1e6,
               decode_gbs, 100 * decode_gbs / (bw / 1e9), 100 * active / step_mean / bw_mean);
        printf("  prefill, %d tokens: %.0f tokens/s [%.0f], %.2f GFLOP -> %.1f GFLOP/s = %.0f%% of the "
               "FMA peak [%.0f%%]\n", n_prompt, n_prompt / best_prefill, n_prompt / prefill_mean,
               flops / 1e9, prefill_gfs, 100 * prefill_gfs / (peak / 1e9),
               100 * flops / prefill_mean / peak_mean);
    }
    rc = 0;
done:
    engine_destroy(e);
    backend_destroy(probe);
    free(prompt);
    free(g.toks);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    struct gen_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    char err[2048];
    struct model *m;
    const struct model_load_opts lo = {.format = o.load_format, .quantization = o.quantization,
                                       .cache_dir = o.cache_dir};
    if (model_load_opts(o.dir, &lo, &m, err, sizeof err)) {
        fprintf(stderr, "moeserve generate: %s\n", err);
        return 1;
    }
    rc = o.bench ? run_bench(&o, m) : run_generate(&o, m);
    model_destroy(m);
    return rc;
}
