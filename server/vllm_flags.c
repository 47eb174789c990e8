// vllm_flags: the table of `vllm serve` flags (see vllm_flags.h) — each row
// a name, whether it takes a value, and either what it sets (with its check)
// or why it changes nothing here.
#include "server/vllm_flags.h"

#include <jansson.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"
#include "base/cli.h"

void vllm_flags_init(struct vllm_flags *f)
{
    memset(f, 0, sizeof *f);
    f->max_logprobs = -1;
    f->log_level = -1;
    f->access_log = true;
}

typedef int (*set_fn)(struct vllm_flags *f, const char *flag, const char *v, char *err,
                      size_t errlen);

struct row {
    const char *name, *alias;
    const char *arg;             // the value's name in --help ("N", "FILE"), NULL: no value
    set_fn set;                  // NULL: accepted, changes nothing (noop says why)
    const char *noop;
    const char *help;            // shown by --help, or NULL (kept out of it)
};

// ---- what the flags set ------------------------------------------------------------------

static int set_model(struct vllm_flags *f, const char *flag, const char *v, char *err, size_t errlen)
{
    if (!*v) return cli_refuse(flag, v, "a model folder", err, errlen);
    f->model = v;
    return 0;
}

// Parallel layouts other than one device per rank do not exist yet: a size
// of 1 is how moeserve runs, anything more is refused and the layout that
// does exist is named.
static int check_parallel(struct vllm_flags *f, const char *flag, const char *v, char *err,
                          size_t errlen)
{
    (void)f;
    int64_t n;
    int rc = cli_parse_int(flag, v, 1, 1 << 16, &n, err, errlen);
    if (rc) return rc;
    if (n == 1) {
        ms_log(MS_LOG_INFO, "%s 1: one device per rank is how moeserve runs; the flag changes "
               "nothing", flag);
        return 0;
    }
    return ms_err(err, errlen, MS_EUNSUPPORTED,
                  "%s %lld cannot be honoured: moeserve has no %s parallelism yet; to use %lld "
                  "devices run --data-parallel-size %lld --enable-expert-parallel (attention "
                  "data-parallel, the experts sharded over the ranks)",
                  flag, (long long)n, strstr(flag, "pipeline") ? "pipeline" : "tensor",
                  (long long)n, (long long)n);
}

static int check_dtype(struct vllm_flags *f, const char *flag, const char *v, char *err,
                       size_t errlen)
{
    (void)f;
    static const char *const fine[] = {"auto", "bfloat16", "bf16"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++)
        if (!strcmp(v, fine[i])) {
            ms_log(MS_LOG_INFO, "%s %s: the weights are used as the checkpoint stores them (bf16; "
                   "fp32 arithmetic on the CPU); the flag changes nothing", flag, v);
            return 0;
        }
    return ms_err(err, errlen, MS_EUNSUPPORTED,
                  "%s %s cannot be honoured: moeserve runs the checkpoint's bf16 weights as they "
                  "are stored; use --dtype auto or bfloat16", flag, v);
}

static int check_seed(struct vllm_flags *f, const char *flag, const char *v, char *err,
                      size_t errlen)
{
    (void)f;
    int64_t seed;
    int rc = cli_parse_int(flag, v, INT64_MIN, INT64_MAX, &seed, err, errlen);
    if (!rc)
        ms_log(MS_LOG_INFO, "%s: each request's sampling is seeded by its own 'seed' (random when "
               "it gives none), whatever the batch; the flag changes nothing", flag);
    return rc;
}

static int set_string(const char **dst, const char *flag, const char *v, char *err, size_t errlen)
{
    if (!*v) return cli_refuse(flag, v, "not empty", err, errlen);
    *dst = v;
    return 0;
}

static int set_chat_template(struct vllm_flags *f, const char *flag, const char *v, char *err,
                             size_t errlen)
{
    return set_string(&f->chat_template, flag, v, err, errlen);
}

static int set_generation_config(struct vllm_flags *f, const char *flag, const char *v, char *err,
                                 size_t errlen)
{
    return set_string(&f->generation_config, flag, v, err, errlen);
}

static int set_override_generation(struct vllm_flags *f, const char *flag, const char *v,
                                   char *err, size_t errlen)
{
    json_t *j = json_loads(v, 0, NULL);
    bool ok = json_is_object(j);
    json_decref(j);
    if (!ok) return cli_refuse(flag, v, "a JSON object such as '{\"temperature\": 0.6}'", err, errlen);
    f->override_generation_config = v;
    return 0;
}

static int set_origins(struct vllm_flags *f, const char *flag, const char *v, char *err, size_t errlen)
{
    return set_string(&f->allowed_origins, flag, v, err, errlen);
}

static int set_methods(struct vllm_flags *f, const char *flag, const char *v, char *err, size_t errlen)
{
    return set_string(&f->allowed_methods, flag, v, err, errlen);
}

static int set_headers(struct vllm_flags *f, const char *flag, const char *v, char *err, size_t errlen)
{
    return set_string(&f->allowed_headers, flag, v, err, errlen);
}

static int set_credentials(struct vllm_flags *f, const char *flag, const char *v, char *err,
                           size_t errlen)
{
    (void)flag, (void)v, (void)err, (void)errlen;
    f->allow_credentials = true;
    return 0;
}

static int set_root_path(struct vllm_flags *f, const char *flag, const char *v, char *err,
                         size_t errlen)
{
    size_t n = strlen(v);
    if (!strcmp(v, "/") || !*v) return 0; // the root itself: nothing to strip
    if (v[0] != '/' || v[n - 1] == '/' || strchr(v, '?') || strchr(v, '%'))
        return cli_refuse(flag, v, "a path prefix such as /api (a leading /, no trailing /)", err,
                          errlen);
    f->root_path = v;
    return 0;
}

static int set_metrics_prefix(struct vllm_flags *f, const char *flag, const char *v, char *err,
                              size_t errlen)
{
    if (strcmp(v, "moeserve") && strcmp(v, "vllm")) return cli_refuse(flag, v, "moeserve or vllm", err, errlen);
    f->metrics_prefix = v;
    return 0;
}

// vLLM's cap on logprobs per token; moeserve's own bound is OA_MAX_LOGPROBS (20).
static int set_max_logprobs(struct vllm_flags *f, const char *flag, const char *v, char *err,
                            size_t errlen)
{
    int64_t n;
    int rc = cli_parse_int(flag, v, -1, 1 << 20, &n, err, errlen);
    if (rc) return rc;
    if (n == -1 || n > 20) {
        if (n > 20)
            return ms_err(err, errlen, MS_EUNSUPPORTED, "%s %lld cannot be honoured: moeserve "
                          "returns at most 20 alternatives per token; use 20 or less", flag,
                          (long long)n);
        n = 20; // vLLM's -1: as many as the server allows
    }
    f->max_logprobs = (int)n;
    return 0;
}

static int set_log_level(struct vllm_flags *f, const char *flag, const char *v, char *err,
                         size_t errlen)
{
    static const struct {
        const char *name;
        int level;
    } levels[] = {{"critical", MS_LOG_ERROR}, {"error", MS_LOG_ERROR}, {"warning", MS_LOG_WARN},
                  {"info", MS_LOG_INFO}, {"debug", MS_LOG_DEBUG}, {"trace", MS_LOG_DEBUG}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (!strcasecmp(v, levels[i].name)) {
            f->log_level = levels[i].level;
            return 0;
        }
    return cli_refuse(flag, v, "critical, error, warning, info, debug or trace", err, errlen);
}

static int set_no_access_log(struct vllm_flags *f, const char *flag, const char *v, char *err,
                             size_t errlen)
{
    (void)flag, (void)v, (void)err, (void)errlen;
    f->access_log = false;
    return 0;
}

static int check_block_size(struct vllm_flags *f, const char *flag, const char *v, char *err,
                            size_t errlen)
{
    (void)f;
    int64_t n;
    int rc = cli_parse_int(flag, v, 1, 1 << 20, &n, err, errlen);
    if (rc) return rc;
    if (n != 16)
        return ms_err(err, errlen, MS_EUNSUPPORTED, "%s %lld cannot be honoured: moeserve's KV "
                      "blocks hold 16 tokens; use 16 or leave the flag out", flag, (long long)n);
    return 0;
}

static const struct row rows[] = {
    {"--model", NULL, "DIR", set_model, NULL, "the model folder (the same as MODEL_DIR)"},
    {"--tensor-parallel-size", "-tp", "N", check_parallel, NULL,
     "1 only: no tensor parallelism yet (use --data-parallel-size)"},
    {"--pipeline-parallel-size", "-pp", "N", check_parallel, NULL, "1 only"},
    {"--dtype", NULL, "D", check_dtype, NULL, "auto or bfloat16: the checkpoint's weights as stored"},
    {"--seed", NULL, "N", check_seed, NULL, "accepted; requests seed themselves ('seed')"},
    {"--trust-remote-code", NULL, NULL, NULL,
     "no model code is ever loaded: the architectures moeserve serves are its own C", "accepted; runs no code"},
    {"--disable-log-requests", NULL, NULL, NULL,
     "moeserve never logs prompts or outputs (one access line per request stays: "
     "--disable-uvicorn-access-log drops it)", "accepted; prompts are never logged"},
    {"--enable-log-requests", NULL, NULL, NULL, "moeserve never logs prompts or outputs", NULL},
    {"--disable-log-stats", NULL, NULL, NULL,
     "moeserve writes no periodic stats lines (/metrics has the numbers)", "accepted"},
    {"--disable-uvicorn-access-log", NULL, NULL, set_no_access_log, NULL, "no line per request"},
    {"--uvicorn-log-level", NULL, "LEVEL", set_log_level, NULL,
     "critical|error|warning|info|debug|trace: the server log's level (info)"},
    {"--max-logprobs", NULL, "N", set_max_logprobs, NULL,
     "logprobs / top_logprobs a request may ask for, 0 to 20 (20)"},
    {"--enable-prompt-tokens-details", NULL, NULL, NULL,
     "usage always carries prompt_tokens_details.cached_tokens", "accepted; always on"},
    {"--chat-template", NULL, "FILE", set_chat_template, NULL,
     "FILE (or the template's text) instead of the checkpoint's"},
    {"--generation-config", NULL, "G", set_generation_config, NULL,
     "auto (the checkpoint's generation_config.json), vllm (neutral defaults), or a folder "
     "holding a generation_config.json (auto)"},
    {"--override-generation-config", NULL, "JSON", set_override_generation, NULL,
     "JSON of default sampling over the above, e.g. '{\"temperature\": 0.6}'"},
    {"--allowed-origins", NULL, "LIST", set_origins, NULL,
     "CORS: origins whose pages may call the server, a JSON list or comma list ('[\"*\"]'); "
     "CORS is off unless given"},
    {"--allowed-methods", NULL, "LIST", set_methods, NULL, "CORS: methods a preflight may ask for (*)"},
    {"--allowed-headers", NULL, "LIST", set_headers, NULL, "CORS: headers a preflight may ask for (*)"},
    {"--allow-credentials", NULL, NULL, set_credentials, NULL, "CORS: allow cookies and auth headers"},
    {"--root-path", NULL, "PATH", set_root_path, NULL,
     "a prefix a reverse proxy keeps: /api serves /api/v1/... as /v1/... (both are served)"},
    {"--metrics-prefix", NULL, "P", set_metrics_prefix, NULL,
     "moeserve or vllm: /metrics series as moeserve:... or vllm:... (vLLM's dashboards, alerts "
     "and autoscalers read vllm:num_requests_waiting...) (moeserve)"},
    {"--enable-reasoning", NULL, NULL, NULL,
     "reasoning is split off whenever --reasoning-parser finds a parser (auto by default)", NULL},
    {"--swap-space", NULL, "GIB", NULL,
     "preempted sequences are recomputed from their prompt, never swapped to host memory",
     "accepted; nothing is swapped"},
    {"--block-size", NULL, "N", check_block_size, NULL, "16 only: the KV block size"},
    {"--disable-frontend-multiprocessing", NULL, NULL, NULL,
     "the HTTP front end and the engine share one process", NULL},
    {"--max-log-len", NULL, "N", NULL, "moeserve never logs prompts", NULL},
};

void vllm_flags_apply_log_level(int argc, char **argv)
{
    struct vllm_flags f;
    vllm_flags_init(&f);
    char err[256];
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        int at = i;
        if (cli_match("--uvicorn-log-level", true, argc, argv, &at, &v, err, sizeof err) == 1 && v)
            set_log_level(&f, "--uvicorn-log-level", v, err, sizeof err);
    }
    if (f.log_level >= 0) ms_log_level = f.log_level;
}

int vllm_flags_parse_one(struct vllm_flags *f, int argc, char **argv, int *i, char *err,
                         size_t errlen)
{
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        const struct row *r = &rows[k];
        const char *v = NULL;
        int rc = cli_match(r->name, r->arg != NULL, argc, argv, i, &v, err, errlen);
        if (!rc && r->alias) rc = cli_match(r->alias, r->arg != NULL, argc, argv, i, &v, err, errlen);
        if (rc < 0) return rc;
        if (!rc) continue;
        if (r->set) return (rc = r->set(f, r->name, v ? v : "", err, errlen)) ? rc : 1;
        ms_log(MS_LOG_INFO, "%s%s%s: %s; the flag changes nothing", r->name, v ? " " : "",
               v ? v : "", r->noop);
        return 1;
    }
    return 0;
}

// The help text folded to the usage's 88 columns beside a 32-column name.
void vllm_flags_usage(FILE *out)
{
    fprintf(out, "vLLM's serve flags (a copied `vllm serve` command line starts):\n");
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        const struct row *r = &rows[k];
        if (!r->help) continue;
        char name[64];
        snprintf(name, sizeof name, "%s%s%s%s%s", r->alias ? r->alias : "", r->alias ? "/" : "",
                 r->name, r->arg ? " " : "", r->arg ? r->arg : "");
        fprintf(out, "  %-29s%s", name, strlen(name) > 29 ? "\n" : " ");
        int col = strlen(name) > 29 ? 0 : 32;
        if (!col) fprintf(out, "%32s", "");
        col = 32;
        for (const char *w = r->help; *w;) {
            size_t n = strcspn(w, " ");
            if (col > 32 && col + 1 + (int)n > 88) {
                fprintf(out, "\n%32s", "");
                col = 32;
            } else if (col > 32) {
                fputc(' ', out);
                col++;
            }
            fprintf(out, "%.*s", (int)n, w);
            col += (int)n;
            w += n;
            while (*w == ' ') w++;
        }
        fputc('\n', out);
    }
    fprintf(out, "\n");
}
