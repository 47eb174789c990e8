// cmd_serve: `moeserve serve MODEL_DIR` — the OpenAI-compatible server:
// flags, start-up (listen first, 503 while loading), and the drain on
// SIGTERM/SIGINT.
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/base.h"
#include "base/cli.h"
#include "server/app.h"
#include "server/commands.h"
#include "server/engine_flags.h"
#include "server/http.h"
#include "server/notify.h"
#include "server/vllm_flags.h"

#define MAX_SERVED 16
#define MAX_API_KEYS 16
#define MAX_HOSTS 64

static void usage(FILE *f)
{
    fprintf(f,
        "usage: moeserve serve MODEL_DIR [options]\n"
        "\n"
        "Serves the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses,\n"
        "/v1/models), Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens),\n"
        "/health, /tokenize, /detokenize, /version, /metrics and the live /dashboard for\n"
        "the checkpoint in MODEL_DIR (or --model DIR).\n"
        "\n"
        "server options:\n"
        "  --host ADDR                   address to listen on (127.0.0.1; 0.0.0.0 for all)\n"
        "  --port N                      TCP port (8000; 0 picks a free one)\n"
        "  --served-model-name NAME ...  names clients use as \"model\" (the MODEL_DIR as given)\n"
        "  --api-key KEY ...             require 'Authorization: Bearer KEY' or 'x-api-key: KEY',\n"
        "                                KEY one of those given (else MOESERVE_API_KEY, else\n"
        "                                VLLM_API_KEY, unless empty); /health, /metrics and\n"
        "                                /dashboard stay open\n"
        "  --max-request-body BYTES      larger bodies get 413 (8MiB)\n"
        "  --shutdown-timeout S          on SIGTERM/SIGINT, running requests get S seconds, then\n"
        "                                end with finish_reason abort (30)\n"
        "  --http-threads N              HTTP event threads (4)\n"
        "  --request-workers N           threads that parse, template and tokenize request\n"
        "                                bodies, so a huge prompt never stalls running streams\n"
        "                                (4; 0: on the HTTP threads)\n"
        "  --sse-keepalive S             SSE comment after S idle seconds in a stream (15; 0 off)\n"
        "  --health-timeout S            /health says 503 when work waits and no engine step\n"
        "                                ends for S seconds (120)\n"
        "\n"
        "agent options (vLLM's names):\n"
        "  --reasoning-parser P          auto, qwen3 or none: text up to </think> goes to\n"
        "                                reasoning_content (auto: qwen3 for templates that think)\n"
        "  --enable-auto-tool-choice     accepted: tool calls are parsed whenever tools are given\n"
        "  --tool-call-parser P          auto (default: the chat template's format), hermes\n"
        "                                (Qwen3's JSON calls) or qwen3_coder (Qwen3-Coder's XML\n"
        "                                calls; vLLM's qwen3_xml is the same)\n"
        "  --default-chat-template-kwargs JSON  defaults for chat_template_kwargs, e.g.\n"
        "                                '{\"enable_thinking\": false}'\n"
        "\n"
        "what one client may hold (0 turns a limit off):\n"
        "  --max-connections N           connections at once, all clients (16384, at most the\n"
        "                                open-file limit less 64); more get 503 at once\n"
        "  --max-connections-per-client N  connections at once from one address (a quarter of\n"
        "                                --max-connections; an IPv6 client is its /64); more\n"
        "                                get 503. Behind a proxy every request comes from its\n"
        "                                address: raise it or use 0\n"
        "  --request-header-timeout S    a request's headers must arrive within S seconds of\n"
        "                                the connection's start (30); between requests the\n"
        "                                bound is --idle-timeout when that is longer\n"
        "  --request-body-timeout S      and its body within S seconds of the headers (60)\n"
        "  --idle-timeout S              close a connection that neither sends nor reads for S\n"
        "                                seconds; waiting for the model is not idle (90: longer\n"
        "                                than a proxy's keep-alive, nginx's 60 s)\n"
        "  --max-buffered-bytes SIZE     request bodies held while they arrive, all clients;\n"
        "                                more get 503 (256MiB)\n"
        "  --max-buffered-bytes-per-client SIZE  the same for one address (64MiB)\n"
        "  --allowed-hosts H[,H...]      answer only requests whose Host header names one of\n"
        "                                these (no port; * any), against DNS rebinding (any)\n"
        "  --reuse-port                  share --port with other servers already on it\n"
        "                                (SO_REUSEPORT); without it a port in use is an error\n"
        "\n");
    vllm_flags_usage(f);
    engine_flags_usage(f);
}

// --shutdown-timeout, --sse-keepalive and --health-timeout: seconds, up to about four months.
#define MAX_SECONDS 1e7

// "--name value" or "--name=value"; returns the value or NULL (no match).
static const char *flag_value(const char *name, int argc, char **argv, int *i, int *rc, char *err,
                              size_t errlen)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n)) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n]) return NULL;
    if (*i + 1 >= argc) {
        *rc = ms_err(err, errlen, MS_EINVAL, "%s needs a value", name);
        return NULL;
    }
    return argv[++*i];
}

// A flag that takes several words, as vLLM's lists (--served-model-name,
// --api-key): v, then the words after it up to the next flag once the model
// is named (MODEL_DIR or --model before it; else the first of them is the
// MODEL_DIR), appended to out (at most max, none empty).
static int flag_words(const char *flag, const char *what, const char *empty_hint, const char *v, int argc,
                      char **argv, int *i, bool model_named, const char **out, int *n, int max, char *err,
                      size_t errlen)
{
    for (;;) {
        if (*n == max) return ms_err(err, errlen, MS_EINVAL, "at most %d %s", max, what);
        if (!v[0]) return ms_err(err, errlen, MS_EINVAL, "%s must not be empty%s", flag, empty_hint);
        out[(*n)++] = v;
        if (*i + 1 < argc && argv[*i + 1][0] != '-' && model_named) v = argv[++*i];
        else return 0;
    }
}

struct serve_opts {
    const char *model_dir;
    const char *host;
    int64_t port;
    const char *served[MAX_SERVED];
    int n_served;
    const char *api_keys[MAX_API_KEYS];
    int n_api_keys;
    size_t max_body;
    double shutdown_timeout;
    int64_t http_threads;
    int64_t request_workers;
    double keepalive;
    double health_timeout;
    const char *reasoning_parser;
    const char *tool_call_parser;
    const char *default_kwargs;
    int64_t max_connections;       // -1: from the open-file limit
    int64_t max_connections_per_client; // -1: a quarter of max_connections
    double header_timeout, body_timeout, idle_timeout;
    size_t max_buffered, max_buffered_per_client;
    const char *hosts[MAX_HOSTS];
    int n_hosts;
    char *hosts_buf;               // the --allowed-hosts value, split in place (freed at exit)
    bool reuse_port;
    struct engine_flags ef;
    struct vllm_flags vf;
};

// "a,b,c" into names (each trimmed, none empty).
static int parse_hosts(const char *v, struct serve_opts *o, char *err, size_t errlen)
{
    free(o->hosts_buf);
    o->n_hosts = 0;
    o->hosts_buf = strdup(v);
    if (!o->hosts_buf) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    char *save = NULL;
    for (char *t = strtok_r(o->hosts_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        size_t n = strlen(t);
        while (n && t[n - 1] == ' ') t[--n] = 0;
        if (!n) continue;
        if (o->n_hosts == MAX_HOSTS)
            return ms_err(err, errlen, MS_EINVAL, "--allowed-hosts takes at most %d names", MAX_HOSTS);
        o->hosts[o->n_hosts++] = t;
    }
    if (!o->n_hosts)
        return ms_err(err, errlen, MS_EINVAL, "--allowed-hosts needs at least one name (or *)");
    return 0;
}

static int parse_args(int argc, char **argv, struct serve_opts *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->max_body = 8u << 20;
    o->shutdown_timeout = 30;
    o->http_threads = 4;
    o->request_workers = 4;
    o->keepalive = 15;
    o->health_timeout = 120;
    o->max_connections = -1;
    o->max_connections_per_client = -1;
    o->header_timeout = 30;
    o->body_timeout = 60;
    o->idle_timeout = 90;
    o->max_buffered = 256u << 20;
    o->max_buffered_per_client = 64u << 20;
    engine_flags_init(&o->ef);
    vllm_flags_init(&o->vf);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = 0;
        const char *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        int ef = engine_flags_parse_one(&o->ef, argc, argv, &i, err, errlen);
        if (ef < 0) return ef;
        if (ef == 1) continue;
        int vf = vllm_flags_parse_one(&o->vf, argc, argv, &i, err, errlen);
        if (vf < 0) return vf;
        if (vf == 1) continue;
        if ((v = flag_value("--host", argc, argv, &i, &rc, err, errlen))) {
            o->host = v;
        } else if (!rc && (v = flag_value("--port", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_int("--port", v, 0, 65535, &o->port, err, errlen);
        } else if (!rc && (v = flag_value("--served-model-name", argc, argv, &i, &rc, err, errlen))) {
            rc = flag_words("--served-model-name", "served model names", "", v, argc, argv, &i,
                            o->model_dir || o->vf.model, o->served, &o->n_served, MAX_SERVED, err, errlen);
        } else if (!rc && (v = flag_value("--api-key", argc, argv, &i, &rc, err, errlen))) {
            // A later --api-key replaces the list, as argparse's last flag
            // wins: a key overridden stays out.
            o->n_api_keys = 0;
            rc = flag_words("--api-key", "API keys", " (leave it out to serve without a key)", v, argc, argv, &i,
                            o->model_dir || o->vf.model, o->api_keys, &o->n_api_keys, MAX_API_KEYS, err, errlen);
        } else if (!rc && (v = flag_value("--max-request-body", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_bytes("--max-request-body", v, 1024, &o->max_body, err, errlen);
        } else if (!rc && (v = flag_value("--shutdown-timeout", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_double("--shutdown-timeout", v, 0, MAX_SECONDS, &o->shutdown_timeout, err,
                                  errlen);
        } else if (!rc && (v = flag_value("--http-threads", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_int("--http-threads", v, 1, 256, &o->http_threads, err, errlen);
        } else if (!rc && (v = flag_value("--sse-keepalive", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_double("--sse-keepalive", v, 0, MAX_SECONDS, &o->keepalive, err,
                                  errlen);
        } else if (!rc && (v = flag_value("--health-timeout", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_double("--health-timeout", v, 0, MAX_SECONDS, &o->health_timeout, err,
                                  errlen);
            // 0 would read as "the default" further on (app_load takes
            // values above 0), not as "never": refused rather than ignored.
            if (!rc && o->health_timeout <= 0)
                rc = ms_err(err, errlen, MS_EINVAL, "--health-timeout must be above 0 seconds (got %s)", v);
        } else if (!rc && (v = flag_value("--reasoning-parser", argc, argv, &i, &rc, err, errlen))) {
            if (strcmp(v, "auto") && strcmp(v, "qwen3") && strcmp(v, "none") && strcmp(v, "deepseek_r1"))
                rc = ms_err(err, errlen, MS_EINVAL,
                            "--reasoning-parser takes auto, qwen3 or none, got \"%s\"", v);
            o->reasoning_parser = !strcmp(v, "deepseek_r1") ? "qwen3" : v; // the same <think> tags
        } else if (!rc && !strcmp(a, "--enable-auto-tool-choice")) {
            ms_log(MS_LOG_INFO, "--enable-auto-tool-choice: tool calls are parsed whenever a "
                   "request gives tools; the flag changes nothing");
        } else if (!rc && (v = flag_value("--tool-call-parser", argc, argv, &i, &rc, err, errlen))) {
            if (strcmp(v, "hermes") && strcmp(v, "qwen3_coder") && strcmp(v, "qwen3_xml") && strcmp(v, "auto"))
                rc = ms_err(err, errlen, MS_EUNSUPPORTED,
                            "--tool-call-parser %s is not served; hermes (Qwen3's JSON <tool_call> "
                            "format), qwen3_coder (Qwen3-Coder's XML one; qwen3_xml is the same) and "
                            "auto (the one the chat template shows the model) are", v);
            o->tool_call_parser = !strcmp(v, "qwen3_xml") ? "qwen3_coder" : v;
        } else if (!rc && (v = flag_value("--default-chat-template-kwargs", argc, argv, &i, &rc,
                                          err, errlen))) {
            json_error_t je;
            json_t *j = json_loads(v, 0, &je);
            if (!json_is_object(j))
                rc = ms_err(err, errlen, MS_EINVAL,
                            "--default-chat-template-kwargs must be a JSON object, not \"%.80s\"", v);
            json_decref(j);
            o->default_kwargs = v;
        } else if (!rc && (v = flag_value("--request-workers", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_int("--request-workers", v, 0, 256, &o->request_workers, err, errlen);
        } else if (!rc && !strcmp(a, "--reuse-port")) {
            o->reuse_port = true;
        } else if (!rc && (v = flag_value("--max-connections", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_int("--max-connections", v, 0, 1000000, &o->max_connections, err, errlen);
        } else if (!rc && (v = flag_value("--max-connections-per-client", argc, argv, &i, &rc, err,
                                          errlen))) {
            rc = cli_parse_int("--max-connections-per-client", v, 0, 1000000,
                               &o->max_connections_per_client, err, errlen);
        } else if (!rc && (v = flag_value("--request-header-timeout", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_double("--request-header-timeout", v, 0, MAX_SECONDS, &o->header_timeout,
                                  err, errlen);
        } else if (!rc && (v = flag_value("--request-body-timeout", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_double("--request-body-timeout", v, 0, MAX_SECONDS, &o->body_timeout, err,
                                  errlen);
        } else if (!rc && (v = flag_value("--idle-timeout", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_double("--idle-timeout", v, 0, MAX_SECONDS, &o->idle_timeout, err, errlen);
        } else if (!rc && (v = flag_value("--max-buffered-bytes", argc, argv, &i, &rc, err, errlen))) {
            rc = cli_parse_bytes("--max-buffered-bytes", v, 0, &o->max_buffered, err, errlen);
        } else if (!rc && (v = flag_value("--max-buffered-bytes-per-client", argc, argv, &i, &rc, err,
                                          errlen))) {
            rc = cli_parse_bytes("--max-buffered-bytes-per-client", v, 0, &o->max_buffered_per_client,
                                 err, errlen);
        } else if (!rc && (v = flag_value("--allowed-hosts", argc, argv, &i, &rc, err, errlen))) {
            rc = parse_hosts(v, o, err, errlen);
        } else if (!rc && a[0] == '-' && a[1]) {
            rc = ms_err(err, errlen, MS_EINVAL, "unknown option %s (see moeserve serve --help)", a);
        } else if (!rc) {
            if (o->model_dir)
                rc = ms_err(err, errlen, MS_EINVAL, "one MODEL_DIR only (got \"%s\" and \"%s\")",
                            o->model_dir, a);
            o->model_dir = a;
        }
        if (rc) return rc;
    }
    engine_flags_end(&o->ef);
    if (o->vf.model && o->model_dir && strcmp(o->vf.model, o->model_dir))
        return ms_err(err, errlen, MS_EINVAL, "two models: MODEL_DIR \"%s\" and --model \"%s\"",
                      o->model_dir, o->vf.model);
    if (o->vf.model) o->model_dir = o->vf.model;
    if (!o->model_dir) return ms_err(err, errlen, MS_EINVAL, "MODEL_DIR (or --model) is missing");
    // Else from the environment, an empty variable as unset (as vLLM reads
    // VLLM_API_KEY): an empty MOESERVE_API_KEY must not hide VLLM_API_KEY
    // and leave the server open.
    static const char *const env_keys[] = {"MOESERVE_API_KEY", "VLLM_API_KEY"};
    for (int k = 0; k < 2 && !o->n_api_keys; k++) {
        const char *e = getenv(env_keys[k]);
        if (e && e[0]) o->api_keys[o->n_api_keys++] = e;
    }
    return 0;
}

// Signals go to one thread: before the model is loaded one ends the process
// at once (nothing is running); after, the first starts the drain (main
// waits for it on a pipe) and a second quits without waiting.
struct sigctx {
    sigset_t set;
    atomic_bool loaded;
    int pipe_w;
    atomic_int which;
};

static void *signal_main(void *arg)
{
    struct sigctx *c = arg;
    int n = 0;
    for (;;) {
        int sig = 0;
        if (sigwait(&c->set, &sig)) continue;
        const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
        if (!atomic_load(&c->loaded)) {
            ms_log(MS_LOG_INFO, "%s while loading: exiting", name);
            _exit(0);
        }
        if (n++ > 0) {
            ms_log(MS_LOG_WARN, "%s again: quitting without waiting for running requests", name);
            _exit(1);
        }
        atomic_store(&c->which, sig);
        char b = 1;
        ssize_t w = write(c->pipe_w, &b, 1);
        (void)w;
    }
    return NULL;
}

// Many open streams need many descriptors.
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int cmd_serve(int argc, char **argv)
{
    struct serve_opts o;
    char err[1024];
    vllm_flags_apply_log_level(argc, argv);
    if (parse_args(argc, argv, &o, err, sizeof err)) {
        fprintf(stderr, "moeserve serve: %s\n", err);
        return 2;
    }
    if (o.vf.log_level >= 0) ms_log_level = o.vf.log_level;
    struct cors *cors = NULL;
    struct cors_opts co = {.origins = o.vf.allowed_origins, .methods = o.vf.allowed_methods,
                           .headers = o.vf.allowed_headers, .credentials = o.vf.allow_credentials};
    if (cors_create(&co, &cors, err, sizeof err)) {
        fprintf(stderr, "moeserve serve: %s\n", err);
        return 2;
    }
    raise_fd_limit();
    // Every thread created from here on inherits the mask, so only the
    // signal thread ever sees SIGINT and SIGTERM.
    static struct sigctx sc;
    sigemptyset(&sc.set);
    sigaddset(&sc.set, SIGINT);
    sigaddset(&sc.set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sc.set, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sp[2];
    pthread_t sig_th;
    if (pipe(sp) || (sc.pipe_w = sp[1], pthread_create(&sig_th, NULL, signal_main, &sc))) {
        fprintf(stderr, "moeserve serve: cannot start the signal thread\n");
        return 1;
    }
    pthread_detach(sig_th);

    struct app *app;
    if (app_create(&app, err, sizeof err)) {
        fprintf(stderr, "moeserve serve: %s\n", err);
        return 1;
    }
    // Each connection takes a descriptor; keep 64 for the model's files and logs.
    struct rlimit rl;
    unsigned max_conn = o.max_connections >= 0 ? (unsigned)o.max_connections : 16384;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 128 && rl.rlim_cur - 64 < max_conn)
        max_conn = (unsigned)(rl.rlim_cur - 64);
    if (!max_conn) max_conn = 1000000; // 0: MHD's own bound, the descriptors
    unsigned per_client = o.max_connections_per_client >= 0 ? (unsigned)o.max_connections_per_client
                                                            : (max_conn + 3) / 4;
    struct http_opts ho = {
        .host = o.host,
        .port = (int)o.port,
        .reuse_port = o.reuse_port,
        .threads = (int)o.http_threads,
        .workers = (int)o.request_workers,
        .max_body = o.max_body,
        .api_keys = o.api_keys,
        .n_api_keys = o.n_api_keys,
        .keepalive_s = o.keepalive,
        .idle_timeout_s = (unsigned)(o.idle_timeout + 0.999),
        .header_timeout_s = o.header_timeout,
        .body_timeout_s = o.body_timeout,
        .max_connections = max_conn,
        .max_connections_per_client = per_client,
        .max_buffered_bytes = o.max_buffered,
        .max_buffered_bytes_per_client = o.max_buffered_per_client,
        .allowed_hosts = o.hosts,
        .n_allowed_hosts = o.n_hosts,
        .cors = cors,
        .root_path = o.vf.root_path,
        .no_access_log = !o.vf.access_log,
        .app = app,
    };
    app_routes(&ho.routes, &ho.n_routes);
    struct http_server *srv;
    int hrc = http_start(&ho, &srv, err, sizeof err);
    free(o.hosts_buf); // http_start copied the names
    if (hrc) {
        fprintf(stderr, "moeserve serve: %s\n", err);
        app_destroy(app);
        cors_destroy(cors);
        return 1;
    }
    const char *shown = strchr(o.host, ':') ? "[%s]" : "%s";
    char hostbuf[300];
    snprintf(hostbuf, sizeof hostbuf, shown, o.host);
    ms_log(MS_LOG_INFO, "listening on http://%s:%d (loading %s)", hostbuf, http_port(srv), o.model_dir);
    // Under systemd (Type=notify): the state as it goes; READY=1 only once
    // requests can be served, which is what ends `systemctl start`'s wait.
    char status[600];
    snprintf(status, sizeof status, "loading %s", o.model_dir);
    notify_status(status);

    struct app_opts ao = {
        .model_dir = o.model_dir,
        .served_names = o.served,
        .n_served = o.n_served,
        .generation_config = o.vf.generation_config,
        .override_generation_config = o.vf.override_generation_config,
        .chat_template = o.vf.chat_template,
        .max_logprobs = o.vf.max_logprobs,
        .metrics_prefix = o.vf.metrics_prefix,
        .engine = o.ef.opts,
        .kv_dtype_auto = o.ef.kv_dtype_auto,
        .load_format = o.ef.load_format,
        .quantization = o.ef.quantization,
        .quant_method = o.ef.quant_method,
        .cache_dir = o.ef.cache_dir,
        .health_timeout_s = o.health_timeout,
        .reasoning_parser = o.reasoning_parser,
        .tool_call_parser = o.tool_call_parser,
        .default_chat_template_kwargs = o.default_kwargs,
    };
    double t0 = ms_now();
    const int lrc = app_load(app, &ao, err, sizeof err);
    if (lrc) {
        fprintf(stderr, "moeserve serve: %s\n", err);
        http_stop(srv, 1);
        app_destroy(app);
        cors_destroy(cors);
        // 2, as for a bad flag, where starting again cannot help (a model
        // that does not fit, a malformed checkpoint, a setting refused): the
        // unit's RestartPreventExitStatus=2 stops there. 1 for the rest,
        // which a restart may get past: a model directory or GPU not there
        // yet (a mount, a driver still loading at boot), out of memory.
        const bool lasting = lrc == MS_EINVAL || lrc == MS_EFORMAT || lrc == MS_ENOFIT || lrc == MS_ETOOLONG;
        return lasting ? 2 : 1;
    }
    ms_log(MS_LOG_INFO, "ready: serving %s as \"%s\" on http://%s:%d (loaded in %.1fs)%s", o.model_dir,
           o.n_served ? o.served[0] : o.model_dir, hostbuf, http_port(srv), ms_now() - t0,
           !o.n_api_keys ? "" : o.n_api_keys == 1 ? ", API key required" : ", one of the API keys required");

    atomic_store(&sc.loaded, true);
    snprintf(status, sizeof status, "serving %s on port %d", o.n_served ? o.served[0] : o.model_dir, http_port(srv));
    notify_ready(status);
    char b;
    while (read(sp[0], &b, 1) != 1) {
    }
    ms_log(MS_LOG_INFO, "%s: draining (running requests get %.0fs; a second signal quits at once)",
           atomic_load(&sc.which) == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_timeout);
    notify_stopping("draining");
    app_drain(app, o.shutdown_timeout);
    // The engine is done; let the last chunks and bodies reach their clients.
    double end = ms_now() + 10;
    while (http_open_async(srv) > 0 && ms_now() < end) usleep(10000);
    http_stop(srv, 2);
    app_destroy(app);
    cors_destroy(cors);
    ms_log(MS_LOG_INFO, "stopped");
    return 0;
}
