// harness: starts `moeserve serve` as a child process, collects its stderr,
// finds the port from its "listening on" line, and talks to it (client.h).
#include "tests/server/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct srv_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *buf;
    size_t len, cap;
    bool eof;
    pthread_t th;
};

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *log_main(void *arg)
{
    struct srv *s = arg;
    struct srv_log *l = s->log;
    char chunk[4096];
    for (;;) {
        ssize_t n = read(s->err_fd, chunk, sizeof chunk);
        if (n <= 0 && errno == EINTR) continue;
        pthread_mutex_lock(&l->mu);
        if (n <= 0) {
            l->eof = true;
            pthread_cond_broadcast(&l->cv);
            pthread_mutex_unlock(&l->mu);
            return NULL;
        }
        if (l->len + (size_t)n + 1 > l->cap) {
            l->cap = (l->len + (size_t)n + 1) * 2;
            l->buf = realloc(l->buf, l->cap);
        }
        memcpy(l->buf + l->len, chunk, (size_t)n);
        l->len += (size_t)n;
        l->buf[l->len] = 0;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        // Keep the server's log in the test's own, for failures.
        fwrite(chunk, 1, (size_t)n, stderr);
    }
}

int srv_start(struct srv *s, const char *const *extra)
{
    memset(s, 0, sizeof *s);
    const char *bin = getenv("MOESERVE_BIN");
    const char *model = getenv("MOESERVE_TINY_MODEL");
    if (!bin || !model) {
        fprintf(stderr, "harness: MOESERVE_BIN and MOESERVE_TINY_MODEL must be set (meson test does)\n");
        return -1;
    }
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "serve";
    bool by_flag = false; // extra names the model with --model: no MODEL_DIR then
    for (int i = 0; extra && extra[i]; i++) by_flag |= !strcmp(extra[i], "--model");
    if (!by_flag) argv[n++] = model;
    const char *defaults[] = {"--port", "0", "--kv-cache-memory", "64MiB", "--max-model-len", "2048",
                              "--threads", "1", "--http-threads", "2", NULL};
    for (int i = 0; defaults[i]; i++) argv[n++] = defaults[i];
    for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    s->pid = pid;
    s->err_fd = fds[0];
    s->log = calloc(1, sizeof *s->log);
    pthread_mutex_init(&s->log->mu, NULL);
    pthread_cond_init(&s->log->cv, NULL);
    pthread_create(&s->log->th, NULL, log_main, s);
    // Wait for "listening on http://HOST:PORT" and then "ready".
    double end = now_s() + 120;
    struct srv_log *l = s->log;
    pthread_mutex_lock(&l->mu);
    while (!l->eof && now_s() < end) {
        if (l->buf && !s->port) {
            const char *p = strstr(l->buf, "listening on http://");
            if (p) {
                p = strchr(p + strlen("listening on http://"), ':');
                const char *q = p ? strchr(p, ']') : NULL; // [v6]:port
                if (q) p = strchr(q, ':');
                if (p) s->port = atoi(p + 1);
            }
        }
        if (l->buf && s->port && strstr(l->buf, "ready: serving")) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    }
    bool ready = l->buf && s->port && strstr(l->buf, "ready: serving");
    pthread_mutex_unlock(&l->mu);
    if (!ready) {
        fprintf(stderr, "harness: the server did not become ready\n");
        srv_stop(s, SIGKILL, 5);
        return -1;
    }
    return 0;
}

int srv_stop(struct srv *s, int sig, double timeout_s)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, sig);
    double end = now_s() + timeout_s;
    int status = 0;
    int rc = -1;
    for (;;) {
        pid_t w = waitpid(s->pid, &status, WNOHANG);
        if (w == s->pid) {
            rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
        if (now_s() >= end) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &status, 0);
            rc = -1;
            break;
        }
        usleep(10000);
    }
    s->pid = 0;
    pthread_join(s->log->th, NULL);
    close(s->err_fd);
    free(s->log->buf);
    pthread_mutex_destroy(&s->log->mu);
    pthread_cond_destroy(&s->log->cv);
    free(s->log);
    s->log = NULL;
    return rc;
}

char *srv_stderr(struct srv *s)
{
    pthread_mutex_lock(&s->log->mu);
    char *c = strdup(s->log->buf ? s->log->buf : "");
    pthread_mutex_unlock(&s->log->mu);
    return c;
}

struct resp srv_request(const struct srv *s, const char *method, const char *path,
                        const char *body, size_t len, const char *key)
{
    // "Expect:" turns off curl's Expect: 100-continue: bodies go at once.
    static const char *const json[] = {"Content-Type: application/json", "Expect:", NULL};
    return client_request(s->port, method, path, body, len, key, json, 120);
}

json_t *srv_post_json(const struct srv *s, const char *path, const char *body, long *status)
{
    struct resp r = srv_request(s, "POST", path, body, strlen(body), NULL);
    if (status) *status = r.status;
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    resp_free(&r);
    return j;
}

json_t *srv_get_json(const struct srv *s, const char *path, long *status)
{
    struct resp r = srv_request(s, "GET", path, NULL, 0, NULL);
    if (status) *status = r.status;
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    resp_free(&r);
    return j;
}

void sse_free(struct sse *e)
{
    json_decref(e->events);
    free(e->raw);
    e->events = NULL;
    e->raw = NULL;
}

void sse_parse(const char *raw, size_t len, struct sse *out)
{
    out->events = json_array();
    out->done = false;
    out->comments = 0;
    size_t i = 0;
    while (i < len) {
        size_t end = i;
        while (end + 1 < len && !(raw[end] == '\n' && raw[end + 1] == '\n')) end++;
        if (end + 1 >= len) end = len;
        // One event: lines until the blank line.
        const char *ev = raw + i;
        size_t evlen = end - i;
        if (evlen >= 6 && !strncmp(ev, "data: ", 6)) {
            if (evlen - 6 == 6 && !strncmp(ev + 6, "[DONE]", 6)) {
                out->done = true;
            } else {
                out->done = false; // anything after [DONE] undoes it
                json_t *j = json_loadb(ev + 6, evlen - 6, 0, NULL);
                json_array_append_new(out->events, j ? j : json_string("<unparsable event>"));
            }
        } else if (evlen && ev[0] == ':') {
            out->comments++;
        }
        i = end + 2;
    }
}

struct sse srv_stream(const struct srv *s, const char *path, const char *body)
{
    struct resp r = srv_request(s, "POST", path, body, strlen(body), NULL);
    struct sse e;
    memset(&e, 0, sizeof e);
    e.status = r.status;
    sse_parse(r.body, r.len, &e);
    e.raw = r.body;
    return e;
}

char *sse_text(const struct sse *e, int index)
{
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    out[0] = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(e->events, i, ev) {
        json_t *choices = json_object_get(ev, "choices");
        size_t k;
        json_t *ch;
        json_array_foreach(choices, k, ch) {
            if (json_integer_value(json_object_get(ch, "index")) != index) continue;
            json_t *t = json_object_get(json_object_get(ch, "delta"), "content");
            if (!t) t = json_object_get(ch, "text");
            if (!json_is_string(t)) continue;
            size_t n = json_string_length(t);
            if (len + n + 1 > cap) {
                cap = (len + n + 1) * 2;
                out = realloc(out, cap);
            }
            memcpy(out + len, json_string_value(t), n);
            len += n;
            out[len] = 0;
        }
    }
    return out;
}

long srv_health_field(const struct srv *s, const char *field)
{
    json_t *j = srv_get_json(s, "/health", NULL);
    json_t *v = json_object_get(j, field);
    long x = json_is_integer(v) ? (long)json_integer_value(v) : -1;
    json_decref(j);
    return x;
}

bool srv_wait_idle(const struct srv *s, double timeout_s)
{
    double end = now_s() + timeout_s;
    do {
        json_t *j = srv_get_json(s, "/health", NULL);
        long run = (long)json_integer_value(json_object_get(j, "num_running"));
        long wait = (long)json_integer_value(json_object_get(j, "num_waiting"));
        long used = (long)json_integer_value(json_object_get(j, "kv_blocks_used"));
        bool ok = j && run == 0 && wait == 0 && used == 0;
        json_decref(j);
        if (ok) return true;
        usleep(20000);
    } while (now_s() < end);
    return false;
}
