// cmd_plan: `moeserve plan` — sizes a deployment from config.json alone
// (model/planner.h does the arithmetic; this file parses flags and prints).
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/cli.h"
#include "model/config.h"
#include "model/planner.h"
#include "server/commands.h"

#define MAX_BATCHES 64
#define GIB_D (1024.0 * 1024.0 * 1024.0)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve plan MODEL_DIR|CONFIG_JSON [options]\n\n"
            "Sizes a deployment from config.json alone (no weights needed): parameters,\n"
            "weight and KV bytes, per-device capacity under tensor parallelism (tp) and\n"
            "data-parallel attention with expert parallelism (dp-ep), and the weight\n"
            "traffic of a decode step. The server runs the same check at start-up.\n\n"
            "  --json                        one JSON object instead of tables\n"
            "  --dtype bf16|fp16|fp32|fp8|int8|int4\n"
            "                                weights (default: the checkpoint's; 8/4-bit quantise\n"
            "                                the projections, embeddings/router/norms stay 16-bit)\n"
            "  --kv-dtype bf16|fp16|fp32|fp8 KV cache (bf16)\n"
            "  --device-memory SIZE          one device's memory (80GiB; GB = 1e9, GiB = 2^30)\n"
            "  --gpu-memory-utilization F    share of it moeserve may use (0.9)\n"
            "  --kv-cache-memory SIZE        a fixed KV pool per device instead of what is left\n"
            "  --devices N                   devices in the layout (1)\n"
            "  --layout tp|dp-ep             one layout (default: both)\n"
            "  --max-model-len N             tokens of one sequence (the config's maximum; 32K ok)\n"
            "  --max-num-batched-tokens N    tokens per step per rank, sizes the workspace (8192,\n"
            "                                vLLM's on a large GPU; serve's own default is 2048:\n"
            "                                give serve's values to size what serve will take)\n"
            "  --max-num-seqs N              sequences per step per rank, sizes the logits (1024;\n"
            "                                serve's default is 256)\n"
            "  --batch-sizes LIST            decode batch sizes to tabulate (1,8,32,64)\n"
            "  --memory-bandwidth RATE       one device's memory bandwidth (4.8TB/s)\n");
}

// vLLM's human-readable counts (32k = 32000, 32K = 32768), from 1 to max, for flag.
static int count_flag(const char *flag, const char *s, int max, int *out, char *err, size_t errlen)
{
    int64_t v;
    int rc = cli_parse_count(flag, s, 1, max, &v, err, errlen);
    if (!rc) *out = (int)v;
    return rc;
}

static int parse_batches(const char *s, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 1000000 || (*end && *end != ',') || *n == MAX_BATCHES) {
            fprintf(stderr, "moeserve plan: --batch-sizes takes up to %d comma-separated numbers "
                    "from 1 to 1000000, not '%s'\n", MAX_BATCHES, s);
            return -1;
        }
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            fprintf(stderr, "moeserve plan: --batch-sizes ends with a comma: '%s'\n", s);
            return -1;
        }
    }
    if (!*n) {
        fprintf(stderr, "moeserve plan: --batch-sizes is empty\n");
        return -1;
    }
    return 0;
}

// 30,532,122,624
static const char *grouped(uint64_t v, char *buf, size_t len)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%" PRIu64, v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < len; i++) {
        if (i && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = 0;
    return buf;
}

static const char *human_bytes(double b, char *buf, size_t len)
{
    if (b >= GIB_D) snprintf(buf, len, "%.2f GiB", b / GIB_D);
    else if (b >= 1048576.0) snprintf(buf, len, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(buf, len, "%.1f KiB", b / 1024.0);
    else snprintf(buf, len, "%.0f B", b);
    return buf;
}

static const char *human_rate(double r, char *buf, size_t len)
{
    if (r >= 1e12) snprintf(buf, len, "%.2f TB/s", r / 1e12);
    else if (r >= 1e9) snprintf(buf, len, "%.2f GB/s", r / 1e9);
    else snprintf(buf, len, "%.3g B/s", r);
    return buf;
}

struct layout_row {
    enum plan_layout layout;
    int rc;
    char err[512];
    struct plan_device d;
    double step_bytes[MAX_BATCHES];
};

static json_t *jint(uint64_t v) { return json_integer(v > (uint64_t)LLONG_MAX ? LLONG_MAX : (json_int_t)v); }

int cmd_plan(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"dtype", required_argument, NULL, 'd'},
        {"kv-dtype", required_argument, NULL, 'k'},
        {"device-memory", required_argument, NULL, 'm'},
        {"gpu-memory-utilization", required_argument, NULL, 'u'},
        {"kv-cache-memory", required_argument, NULL, 'K'},
        {"devices", required_argument, NULL, 'n'},
        {"layout", required_argument, NULL, 'l'},
        {"max-model-len", required_argument, NULL, 'L'},
        {"max-num-batched-tokens", required_argument, NULL, 'T'},
        {"max-num-seqs", required_argument, NULL, 'S'},
        {"batch-sizes", required_argument, NULL, 'b'},
        {"memory-bandwidth", required_argument, NULL, 'w'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct plan_opts po;
    plan_opts_default(&po);
    bool json = false, have_dtype = false, have_layout = false;
    int devices = 1;
    enum plan_layout only = PLAN_TP;
    int batches[MAX_BATCHES] = {1, 8, 32, 64}, n_batches = 4;
    char err[1024];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'j': json = true; break;
        case 'd': rc = plan_dtype_parse(optarg, &po.weight_dtype, err, sizeof err); have_dtype = true; break;
        case 'k':
            rc = plan_dtype_parse(optarg, &po.kv_dtype, err, sizeof err);
            if (!rc && (po.kv_dtype == PLAN_INT8 || po.kv_dtype == PLAN_INT4))
                rc = ms_err(err, sizeof err, MS_EINVAL, "--kv-dtype %s: expected bf16, fp16, fp32 or fp8", optarg);
            break;
        case 'm': rc = plan_parse_bytes(optarg, &po.device_memory, err, sizeof err); break;
        case 'K': rc = plan_parse_bytes(optarg, &po.kv_cache_bytes, err, sizeof err); break;
        case 'u':
            // A share of the device: above 0, at most all of it.
            if (cli_parse_double("--gpu-memory-utilization", optarg, 0, 1, &po.memory_utilization,
                                 err, sizeof err) || po.memory_utilization == 0)
                rc = cli_refuse("--gpu-memory-utilization", optarg, "a number in (0, 1]", err,
                                sizeof err);
            break;
        case 'n': rc = count_flag("--devices", optarg, 4096, &devices, err, sizeof err); break;
        case 'l': rc = plan_layout_parse(optarg, &only, err, sizeof err); have_layout = true; break;
        case 'L': rc = count_flag("--max-model-len", optarg, INT_MAX, &po.max_model_len, err, sizeof err); break;
        case 'T':
            rc = count_flag("--max-num-batched-tokens", optarg, INT_MAX, &po.max_num_batched_tokens,
                            err, sizeof err);
            break;
        case 'S': rc = count_flag("--max-num-seqs", optarg, INT_MAX, &po.max_num_seqs, err, sizeof err); break;
        case 'b': if (parse_batches(optarg, batches, &n_batches)) return 2; break;
        case 'w': rc = plan_parse_bandwidth(optarg, &po.memory_bandwidth, err, sizeof err); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (rc) {
            fprintf(stderr, "moeserve plan: %s\n", err);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, optind < argc ? "moeserve plan: one model directory or config.json, not several\n\n"
                                      : "moeserve plan: which model? give its directory or config.json\n\n");
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    struct model_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        fprintf(stderr, "moeserve plan: out of memory\n");
        return 1;
    }
    int status = 1;
    if (config_load(path, cfg, err, sizeof err)) {
        fprintf(stderr, "moeserve plan: %s\n", err);
        goto out;
    }
    // The checkpoint's own: its quantization_config's format where it has one.
    if (!have_dtype) po.weight_dtype = plan_dtype_from_quant(quant_config_format(cfg), cfg->torch_dtype);
    struct plan_params p;
    if (plan_count_params(cfg, &p, err, sizeof err)) {
        fprintf(stderr, "moeserve plan: %s\n", err);
        goto out;
    }
    uint64_t weights;
    if (plan_weight_bytes(cfg, po.weight_dtype, PLAN_TP, 1, &weights, err, sizeof err)) {
        fprintf(stderr, "moeserve plan: %s\n", err);
        goto out;
    }
    const uint64_t kv_tok = plan_kv_bytes_per_token(cfg, po.kv_dtype);
    double unique[MAX_BATCHES], step1[MAX_BATCHES];
    for (int i = 0; i < n_batches; i++) {
        unique[i] = plan_expected_unique_experts(cfg->n_experts, cfg->n_experts_per_tok, batches[i]);
        if (p.moe_layers == 0) unique[i] = 0;
        if (plan_decode_step_bytes(cfg, po.weight_dtype, PLAN_TP, 1, batches[i], &step1[i], err, sizeof err)) {
            fprintf(stderr, "moeserve plan: %s\n", err);
            goto out;
        }
    }
    struct layout_row rows[2];
    int n_rows = 0;
    for (int l = 0; l < 2; l++) {
        enum plan_layout lay = l == 0 ? PLAN_TP : PLAN_DP_EP;
        if (have_layout && lay != only) continue;
        struct layout_row *r = &rows[n_rows++];
        r->layout = lay;
        r->err[0] = 0;
        r->rc = plan_device_compute(cfg, &po, lay, devices, &r->d, r->err, sizeof r->err);
        if (r->rc == 0 && !r->d.fits) plan_check_fit(&r->d, r->err, sizeof r->err);
        for (int i = 0; r->rc == 0 && i < n_batches; i++)
            r->rc = plan_decode_step_bytes(cfg, po.weight_dtype, lay, devices, batches[i],
                                           &r->step_bytes[i], r->err, sizeof r->err);
        if (have_layout && r->rc) {
            fprintf(stderr, "moeserve plan: %s\n", r->err);
            goto out;
        }
    }
    int n_ok = 0;
    for (int r = 0; r < n_rows; r++) n_ok += rows[r].rc == 0;
    if (!n_ok) { // nothing to show: the first layout's sentence says why
        fprintf(stderr, "moeserve plan: %s\n", rows[0].err);
        goto out;
    }
    int max_len = po.max_model_len > 0 ? po.max_model_len : cfg->max_position_embeddings;

    if (json) {
        json_t *o = json_object(), *split = json_object(), *ue = json_object(), *dec = json_array(),
               *lays = json_array();
        if (!o || !split || !ue || !dec || !lays) {
            json_decref(o); json_decref(split); json_decref(ue); json_decref(dec); json_decref(lays);
            fprintf(stderr, "moeserve plan: out of memory\n");
            goto out;
        }
        json_object_set_new(o, "config", json_string(path));
        json_object_set_new(o, "model_type", json_string(cfg->model_type));
        json_object_set_new(o, "total_params", jint(p.total));
        json_object_set_new(o, "active_params", jint(p.active));
        json_object_set_new(split, "experts", jint(p.experts));
        json_object_set_new(split, "attention", jint(p.attention));
        json_object_set_new(split, "router", jint(p.router));
        json_object_set_new(split, "dense_mlp", jint(p.dense_mlp));
        json_object_set_new(split, "embeddings", jint(p.embeddings));
        json_object_set_new(split, "lm_head", jint(p.lm_head));
        json_object_set_new(split, "norms", jint(p.norms));
        json_object_set_new(o, "params", split);
        json_object_set_new(o, "tie_word_embeddings", json_boolean(cfg->tie_word_embeddings));
        json_object_set_new(o, "dtype", json_string(plan_dtype_name(po.weight_dtype)));
        json_object_set_new(o, "weight_bytes", jint(weights));
        json_object_set_new(o, "kv_dtype", json_string(plan_dtype_name(po.kv_dtype)));
        json_object_set_new(o, "kv_bytes_per_token", jint(kv_tok));
        json_object_set_new(o, "max_model_len", json_integer(max_len));
        json_object_set_new(o, "device_memory", jint(po.device_memory));
        json_object_set_new(o, "gpu_memory_utilization", json_real(po.memory_utilization));
        json_object_set_new(o, "memory_bandwidth", json_real(po.memory_bandwidth));
        json_object_set_new(o, "max_num_batched_tokens", json_integer(po.max_num_batched_tokens));
        json_object_set_new(o, "max_num_seqs", json_integer(po.max_num_seqs));
        for (int i = 0; i < n_batches; i++) {
            char key[16];
            snprintf(key, sizeof key, "%d", batches[i]);
            json_object_set_new(ue, key, json_real(unique[i]));
            json_array_append_new(dec, json_pack("{s:i, s:f, s:f, s:f}", "batch_size", batches[i],
                                                 "unique_experts_per_layer", unique[i],
                                                 "weight_bytes_per_step", step1[i],
                                                 "min_time_per_output_token_ms",
                                                 step1[i] / po.memory_bandwidth * 1e3));
        }
        json_object_set_new(o, "expected_unique_experts", ue);
        json_object_set_new(o, "decode", dec);
        for (int r = 0; r < n_rows; r++) {
            const struct layout_row *L = &rows[r];
            json_t *lo = json_pack("{s:s, s:i}", "layout", plan_layout_name(L->layout), "devices", devices);
            if (!lo) continue;
            if (L->rc) {
                json_object_set_new(lo, "error", json_string(L->err));
                json_array_append_new(lays, lo);
                continue;
            }
            const struct plan_device *d = &L->d;
            json_object_set_new(lo, "weight_bytes_per_device", jint(d->weight_bytes));
            json_object_set_new(lo, "workspace_bytes_per_device", jint(d->workspace_bytes));
            json_object_set_new(lo, "usable_bytes_per_device", jint(d->usable_bytes));
            json_object_set_new(lo, "kv_bytes_per_device", jint(d->kv_bytes));
            json_object_set_new(lo, "kv_bytes_per_token_per_device", jint(d->kv_bytes_per_token));
            json_object_set_new(lo, "kv_blocks_per_device", jint(d->kv_blocks));
            json_object_set_new(lo, "kv_tokens_per_device", jint(d->kv_tokens));
            // tp: every device holds a slice of the same tokens; dp-ep: its own.
            json_object_set_new(lo, "kv_tokens_total",
                                jint(L->layout == PLAN_TP ? d->kv_tokens : d->kv_tokens * (uint64_t)devices));
            json_object_set_new(lo, "max_model_len_sequences",
                                jint(L->layout == PLAN_TP ? d->max_len_seqs : d->max_len_seqs * (uint64_t)devices));
            json_object_set_new(lo, "fits", json_boolean(d->fits));
            if (!d->fits) json_object_set_new(lo, "why", json_string(L->err));
            json_t *ld = json_array();
            for (int i = 0; ld && i < n_batches; i++)
                json_array_append_new(ld, json_pack("{s:i, s:f, s:f}", "batch_size", batches[i],
                                                    "weight_bytes_per_device_per_step", L->step_bytes[i],
                                                    "min_time_per_output_token_ms",
                                                    L->step_bytes[i] / po.memory_bandwidth * 1e3));
            json_object_set_new(lo, "decode", ld);
            json_array_append_new(lays, lo);
        }
        json_object_set_new(o, "layouts", lays);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        json_decref(o);
        if (!s) {
            fprintf(stderr, "moeserve plan: out of memory\n");
            goto out;
        }
        puts(s);
        free(s);
        status = 0;
        goto out;
    }

    char a[64], b[64], g[64];
    printf("model        %s: %d layers (%d MoE), hidden %d, %d query / %d KV heads of %d",
           cfg->model_type, cfg->n_layers, p.moe_layers, cfg->hidden_size, cfg->n_heads,
           cfg->n_kv_heads, cfg->head_dim);
    if (p.moe_layers) printf(", %d experts (top-%d) of width %d", cfg->n_experts, cfg->n_experts_per_tok,
                             cfg->moe_intermediate_size);
    printf(", vocabulary %d\n\n", cfg->vocab_size);
    printf("parameters   %18s %10s\n", "count", "billions");
    const struct {
        const char *name;
        uint64_t v;
    } kinds[] = {
        {"experts", p.experts},       {"attention", p.attention}, {"router", p.router},
        {"dense mlp", p.dense_mlp},   {"embeddings", p.embeddings}, {"lm_head", p.lm_head},
        {"norms", p.norms},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (!kinds[i].v && strcmp(kinds[i].name, "lm_head")) continue;
        printf("  %-10s %18s %10.3f%s\n", kinds[i].name, grouped(kinds[i].v, a, sizeof a), kinds[i].v / 1e9,
               !strcmp(kinds[i].name, "lm_head") && cfg->tie_word_embeddings ? "  (tied to the embeddings)" : "");
    }
    printf("  %-10s %18s %10.2f\n", "total", grouped(p.total, a, sizeof a), p.total / 1e9);
    printf("  %-10s %18s %10.2f  (a token's path: %d of %d experts per MoE layer)\n\n", "active",
           grouped(p.active, a, sizeof a), p.active / 1e9, p.moe_layers ? cfg->n_experts_per_tok : 0,
           p.moe_layers ? cfg->n_experts : 0);
    printf("weights      %s bytes = %s in %s\n", grouped(weights, a, sizeof a),
           human_bytes((double)weights, b, sizeof b), plan_dtype_name(po.weight_dtype));
    printf("KV cache     %s bytes per token = %s in %s (%s per 16-token block)\n\n",
           grouped(kv_tok, a, sizeof a), human_bytes((double)kv_tok, b, sizeof b),
           plan_dtype_name(po.kv_dtype), human_bytes((double)kv_tok * 16, g, sizeof g));

    printf("per device   %s, %s usable (x %.2f); max-model-len %d; workspace for %d tokens, %d sequences\n",
           human_bytes((double)po.device_memory, a, sizeof a),
           human_bytes((double)po.device_memory * po.memory_utilization, b, sizeof b),
           po.memory_utilization, max_len, po.max_num_batched_tokens, po.max_num_seqs);
    printf("  %-9s %11s %11s %11s %13s %13s %6s\n", "layout", "weights", "workspace", "KV cache",
           "KV tokens", "max-len seqs", "fits");
    for (int r = 0; r < n_rows; r++) {
        const struct layout_row *L = &rows[r];
        char name[32];
        snprintf(name, sizeof name, "%s x%d", plan_layout_name(L->layout), devices);
        if (L->rc) {
            printf("  %-9s %s\n", name, L->err);
            continue;
        }
        const struct plan_device *d = &L->d;
        char w[32], ws[32], kv[32], tok[32], seqs[32];
        printf("  %-9s %11s %11s %11s %13s %13s %6s\n", name, human_bytes((double)d->weight_bytes, w, sizeof w),
               human_bytes((double)d->workspace_bytes, ws, sizeof ws), human_bytes((double)d->kv_bytes, kv, sizeof kv),
               grouped(d->kv_tokens, tok, sizeof tok), grouped(d->max_len_seqs, seqs, sizeof seqs),
               d->fits ? "yes" : "NO");
    }
    printf("  (tp: each device holds a slice of the same tokens; dp-ep: each holds its own, %d x as many in all)\n",
           devices);
    for (int r = 0; r < n_rows; r++)
        if (!rows[r].rc && !rows[r].d.fits) printf("  %s x%d: %s\n", plan_layout_name(rows[r].layout), devices, rows[r].err);

    printf("\ndecode step  weight bytes read per device; time per output token >= bytes / %s\n",
           human_rate(po.memory_bandwidth, a, sizeof a));
    printf("  %6s %14s", "batch", "experts/layer");
    for (int r = 0; r < n_rows; r++) {
        char name[48];
        snprintf(name, sizeof name, "%s x%d", plan_layout_name(rows[r].layout), devices);
        printf(" %14s %9s", name, "ms/token");
    }
    printf("\n");
    for (int i = 0; i < n_batches; i++) {
        printf("  %6d %14.1f", batches[i], unique[i]);
        for (int r = 0; r < n_rows; r++) {
            if (rows[r].rc) {
                printf(" %14s %9s", "-", "-");
                continue;
            }
            printf(" %14s %9.3f", human_bytes(rows[r].step_bytes[i], a, sizeof a),
                   rows[r].step_bytes[i] / po.memory_bandwidth * 1e3);
        }
        printf("\n");
    }
    if (p.moe_layers)
        printf("  (experts/layer: E(1-(1-k/E)^B), distinct experts a MoE layer runs under uniform routing)\n");
    status = 0;
out:
    free(cfg);
    return status;
}
