// bench_serve: what the HTTP and JSON path costs next to the engine. Starts
// `moeserve serve MODEL`, then measures (1) requests/s of max_tokens-1 chat
// requests at a concurrency, with the CPU time the HTTP threads spent per
// request; (2) time to first token of a 16-token prompt on the idle server;
// (3) the decode step at that concurrency (inter-token time of as many
// streams) with the HTTP CPU per streamed chunk. A benchmark, not a test.
#include <curl/curl.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/server/harness.h"

// CPU seconds (user + system) of the server's threads, split into the HTTP
// side (libmicrohttpd's workers and our watcher) and the rest.
static void thread_cpu(pid_t pid, double *http, double *other)
{
    *http = *other = 0;
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return;
    long hz = sysconf(_SC_CLK_TCK);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[400], buf[1024];
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        if (!open || !close) continue;
        char comm[64];
        snprintf(comm, sizeof comm, "%.*s", (int)(close - open - 1), open + 1);
        // Fields after the comm: state is 3, utime 14, stime 15.
        unsigned long ut = 0, st = 0;
        char *p = close + 2;
        for (int field = 3; field < 14 && p; field++) p = strchr(p, ' ') ? strchr(p, ' ') + 1 : NULL;
        if (!p || sscanf(p, "%lu %lu", &ut, &st) != 2) continue;
        double s = (double)(ut + st) / (double)hz;
        if (!strcmp(comm, "MHD-worker") || !strcmp(comm, "http-watcher")) *http += s;
        else *other += s;
    }
    closedir(d);
}

struct req {
    CURL *h;
    double t0, t_first, t_last;
    int chunks;
    double gap_sum;
    int gaps;
    size_t bytes;
};

static size_t on_data(char *p, size_t sz, size_t n, void *ud)
{
    struct req *r = ud;
    double t = now_s();
    size_t k = sz * n;
    for (size_t i = 0; i + 7 <= k; i++)
        if (!memcmp(p + i, "data: {", 7)) {
            if (!r->chunks) r->t_first = t;
            else {
                r->gap_sum += t - r->t_last;
                r->gaps++;
            }
            r->t_last = t;
            r->chunks++;
        }
    r->bytes += k;
    return k;
}

// Runs total requests of body at concurrency c on reused connections.
static double run_load(const struct srv *s, const char *path, const char *body, int c, int total,
                       struct req *reqs_out, int *n_out)
{
    CURLM *m = curl_multi_init();
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)c);
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, path);
    struct req *rs = calloc((size_t)c, sizeof *rs);
    int started = 0, done = 0;
    double t0 = now_s();
    for (int i = 0; i < c && started < total; i++, started++) {
        rs[i].h = curl_easy_init();
        curl_easy_setopt(rs[i].h, CURLOPT_URL, url);
        curl_easy_setopt(rs[i].h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(rs[i].h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(rs[i].h, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(rs[i].h, CURLOPT_WRITEDATA, &rs[i]);
        curl_easy_setopt(rs[i].h, CURLOPT_PRIVATE, &rs[i]);
        rs[i].t0 = now_s();
        curl_multi_add_handle(m, rs[i].h);
    }
    int running = 1;
    while (done < total) {
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            struct req *r;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            long st = 0;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &st);
            if (st != 200) fprintf(stderr, "bench: a request got %ld\n", st);
            if (reqs_out && *n_out < total) reqs_out[(*n_out)++] = *r;
            done++;
            curl_multi_remove_handle(m, r->h);
            if (started < total) {
                started++;
                CURL *h = r->h;
                memset(r, 0, sizeof *r);
                r->h = h;
                r->t0 = now_s();
                curl_multi_add_handle(m, r->h);
            }
        }
        if (done < total) curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    double wall = now_s() - t0;
    for (int i = 0; i < c; i++)
        if (rs[i].h) curl_easy_cleanup(rs[i].h);
    free(rs);
    curl_slist_free_all(hdr);
    curl_multi_cleanup(m);
    return wall;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int conc = 32, total = 1024, stream_tokens = 64;
    const char *model = NULL;
    const char *extra[32] = {0};
    int n_extra = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--concurrency") && i + 1 < argc) conc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc) total = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stream-tokens") && i + 1 < argc) stream_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--")) {
            for (i++; i < argc && n_extra < 31; i++) extra[n_extra++] = argv[i];
        } else if (!model) model = argv[i];
        else {
            fprintf(stderr, "usage: bench_serve MODEL_DIR [--concurrency 32] [--requests 1024] "
                            "[--stream-tokens 64] [-- serve flags...]\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "usage: bench_serve MODEL_DIR [...]\n");
        return 2;
    }
    setenv("MOESERVE_TINY_MODEL", model, 1);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct srv s;
    if (srv_start(&s, extra)) return 1;

    // (1) max_tokens 1 at concurrency: the HTTP + JSON path and one prefill+step each.
    const char *one = "{\"model\": null, \"messages\": [{\"role\": \"user\", \"content\": "
                      "\"What is the capital of France?\"}], \"max_tokens\": 1, \"temperature\": 0}";
    run_load(&s, "/v1/chat/completions", one, conc, conc * 2, NULL, NULL); // warm-up
    double h0, o0, h1, o1;
    thread_cpu(s.pid, &h0, &o0);
    double wall = run_load(&s, "/v1/chat/completions", one, conc, total, NULL, NULL);
    thread_cpu(s.pid, &h1, &o1);
    double http_per_req = (h1 - h0) / total;
    printf("max_tokens=1 chat at concurrency %d: %d requests in %.2fs = %.1f req/s\n", conc, total,
           wall, total / wall);
    printf("  HTTP threads CPU per request: %.1f us; other threads (engine) per request: %.1f us\n",
           http_per_req * 1e6, (o1 - o0) / total * 1e6);

    // (2) TTFT on the idle server: a 16-token prompt, streamed.
    const char *ttft_body = "{\"prompt\": [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, "
                            "13, 576, 3974, 13876, 38835, 34208, 916], \"max_tokens\": 1, "
                            "\"temperature\": 0, \"stream\": true}";
    enum { K = 30 };
    double ttft[K];
    for (int i = 0; i < K; i++) {
        struct req r[1];
        int n = 0;
        run_load(&s, "/v1/completions", ttft_body, 1, 1, r, &n);
        ttft[i] = r[0].t_first - r[0].t0;
    }
    qsort(ttft, K, sizeof ttft[0], cmp_double);
    printf("TTFT, 16-token prompt, idle: median %.2f ms (min %.2f, max %.2f) over %d\n",
           ttft[K / 2] * 1e3, ttft[0] * 1e3, ttft[K - 1] * 1e3, K);

    // (3) Decode at concurrency: as many streams, ignore_eos; the inter-chunk
    // time is the step time, and the HTTP CPU per chunk what each token costs us.
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\": \"Once upon a time\", \"max_tokens\": %d, \"temperature\": 0, "
             "\"ignore_eos\": true, \"stream\": true}",
             stream_tokens);
    struct req *rs = calloc((size_t)conc, sizeof *rs);
    int n = 0;
    thread_cpu(s.pid, &h0, &o0);
    double wall3 = run_load(&s, "/v1/completions", body, conc, conc, rs, &n);
    thread_cpu(s.pid, &h1, &o1);
    double gaps = 0;
    long n_gaps = 0, chunks = 0;
    for (int i = 0; i < n; i++) {
        gaps += rs[i].gap_sum;
        n_gaps += rs[i].gaps;
        chunks += rs[i].chunks;
    }
    double step = n_gaps ? gaps / (double)n_gaps : 0;
    double per_chunk = chunks ? (h1 - h0) / (double)chunks : 0;
    printf("decode at concurrency %d: %ld chunks in %.2fs, mean inter-token %.2f ms\n", conc, chunks,
           wall3, step * 1e3);
    printf("  HTTP threads CPU per streamed chunk: %.1f us; per step (x%d): %.1f us = %.2f%% of "
           "the step\n",
           per_chunk * 1e6, conc, per_chunk * conc * 1e6, step > 0 ? per_chunk * conc / step * 100 : 0);
    printf("  one max_tokens=1 request's HTTP/JSON CPU = %.2f%% of a decode step at concurrency %d\n",
           step > 0 ? http_per_req / step * 100 : 0, conc);
    free(rs);
    int rc = srv_stop(&s, SIGTERM, 60);
    curl_global_cleanup();
    return rc == 0 ? 0 : 1;
}
