// bench: the load generator — prompts, arrivals, the libcurl multi loop that
// streams every request, per-chunk timing and the result statistics.
#include "bench/bench.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/sse.h"
#include "base/base.h"

#define MAX_EVENT_BYTES (4u << 20)   // one SSE event; chunks are a few hundred bytes
#define MAX_ERROR_BODY 4096          // bytes of a non-200 body kept for the message

void bench_opts_default(struct bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->base_url = "http://127.0.0.1:8000";
    o->endpoint = "/v1/completions";
    o->num_prompts = 1000;
    o->request_rate = INFINITY;
    o->random_input_len = 1024;
    o->random_output_len = 128;
    // Ids that are ordinary tokens in every vocabulary of 32k or more.
    o->vocab_lo = 100;
    o->vocab_hi = 30000;
    o->initial_test = true;
}

// ---- randomness: splitmix64, seeded, identical on every platform -----------------
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; } // [0, 1)

static int rng_between(uint64_t *s, int lo, int hi) // [lo, hi]
{
    if (hi <= lo) return lo;
    return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

int bench_arrivals(int n, double rate, uint64_t seed, double *out)
{
    if (n < 0 || !(rate > 0)) return MS_EINVAL;
    uint64_t s = seed ^ 0xa5a5a5a5deadbeefull;
    double t = 0;
    for (int i = 0; i < n; i++) {
        out[i] = t;
        // Poisson process: exponential gaps, -ln(1 - u) / rate.
        if (isfinite(rate)) t += -log1p(-rng_unit(&s)) / rate;
    }
    return 0;
}

// ---- statistics -------------------------------------------------------------------------
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0) return 0.0;
    if (p <= 0) return sorted[0];
    if (p >= 100) return sorted[n - 1];
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)pos;
    double frac = pos - (double)lo;
    if (lo + 1 >= n) return sorted[n - 1];
    return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

void bench_stats_of(double *v, size_t n, struct bench_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    if (!n) return;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    out->mean = sum / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (v[i] - out->mean) * (v[i] - out->mean);
    out->std = sqrt(ss / (double)n); // numpy's default (population)
    out->median = bench_percentile(v, n, 50);
    out->p99 = bench_percentile(v, n, 99);
}

// ---- prompts ------------------------------------------------------------------------------
// Common English words; in BPE vocabularies each (with its leading space) is one token.
static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other", "its",
    "may", "these", "what", "them", "than", "some", "him", "time", "into", "only", "do", "out",
    "then", "about", "any", "could", "new", "first", "two", "also", "like", "our", "over",
    "such", "made", "many", "after", "most", "years", "where", "your", "way", "well", "down",
    "should", "because", "each", "just", "those", "people", "how", "too", "little", "state",
    "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get",
    "here", "between", "both", "life", "being", "under", "never", "day", "same", "another",
    "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since",
    "against", "go", "came", "right", "used", "take", "three", "water", "city", "house",
};

struct prompt {
    int input_len, output_len;
    char *body; // the request's JSON
};

static char *make_body(const struct bench_opts *o, const json_t *extra, const char *model, bool chat,
                       bool ids, int in_len, int out_len, uint64_t *rng)
{
    json_t *b = json_object();
    if (!b) return NULL;
    json_object_set_new(b, "model", json_string(model));
    json_t *prompt = NULL;
    if (ids) {
        prompt = json_array();
        for (int i = 0; prompt && i < in_len; i++)
            json_array_append_new(prompt, json_integer(rng_between(rng, o->vocab_lo, o->vocab_hi - 1)));
    } else {
        size_t cap = (size_t)in_len * 9 + 1, len = 0;
        char *text = malloc(cap);
        if (text) {
            text[0] = 0;
            for (int i = 0; i < in_len; i++) {
                const char *w = words[rng_next(rng) % (sizeof words / sizeof words[0])];
                len += (size_t)snprintf(text + len, cap - len, "%s%s", i ? " " : "", w);
            }
            prompt = json_string(text);
            free(text);
        }
    }
    if (!prompt) {
        json_decref(b);
        return NULL;
    }
    if (chat) {
        json_object_set_new(b, "messages",
                            json_pack("[{s:s, s:o}]", "role", "user", "content", prompt));
        json_object_set_new(b, "max_completion_tokens", json_integer(out_len));
    } else {
        json_object_set_new(b, "prompt", prompt);
        json_object_set_new(b, "max_tokens", json_integer(out_len));
    }
    json_object_set_new(b, "temperature", json_real(o->temperature));
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (o->ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    if (extra && json_object_update(b, (json_t *)extra)) {
        json_decref(b);
        return NULL;
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

// ---- one request in flight -------------------------------------------------------------------
struct live {
    CURL *easy;
    struct curl_slist *headers;
    struct sse_parser *sse;
    struct bench_request *rq;
    double t0;            // the benchmark's start (ms_now)
    double sent;          // ms_now() when handed to curl
    double last;          // the last content chunk
    bool first_seen, done;
    long status;
    char *errbody;
    size_t errbody_len;
    char curl_err[CURL_ERROR_SIZE];
    char *stream_err;     // a malformed chunk or an error event
    size_t chunks;        // content chunks
    double *chunk_times;  // (chunks) since t0, for the peak throughput
    size_t cap_times;
};

static int push_double(double **a, size_t *n, size_t *cap, double v)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        double *b = realloc(*a, c * sizeof *b);
        if (!b) return MS_ENOMEM;
        *a = b;
        *cap = c;
    }
    (*a)[(*n)++] = v;
    return 0;
}

static void set_stream_err(struct live *l, const char *fmt, const char *detail)
{
    if (l->stream_err) return;
    size_t n = strlen(fmt) + (detail ? strlen(detail) : 0) + 1;
    l->stream_err = malloc(n);
    if (l->stream_err) snprintf(l->stream_err, n, fmt, detail ? detail : "");
}

static int on_event(void *ctx, const char *data, size_t len)
{
    struct live *l = ctx;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        l->done = true;
        return 0;
    }
    double now = ms_now();
    json_error_t je;
    // A model may emit a NUL byte ("\u0000"), which is valid JSON.
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        set_stream_err(l, "a stream chunk is not a JSON object: %.200s", data);
        return 1;
    }
    json_t *e = json_object_get(j, "error");
    if (e) {
        const char *m = json_string_value(json_object_get(e, "message"));
        set_stream_err(l, "the stream carried an error: %.300s", m ? m : data);
        json_decref(j);
        return 1;
    }
    json_t *choices = json_object_get(j, "choices");
    if (json_is_array(choices) && json_array_size(choices) > 0) {
        json_t *c = json_array_get(choices, 0);
        // Lengths, not C strings: a text of one NUL byte is a token too.
        json_t *text = json_object_get(c, "text");
        json_t *delta = json_object_get(c, "delta");
        if (!json_is_string(text) && delta) {
            text = json_object_get(delta, "content");
            if (json_string_length(text) == 0) text = json_object_get(delta, "reasoning_content");
        }
        // Only chunks that carry generated text count as tokens: a chat
        // stream's opening role chunk and the closing finish_reason chunk
        // may come before the first token or after the last one.
        if (json_string_length(text) > 0) {
            if (!l->first_seen) {
                l->first_seen = true;
                l->rq->ttft = now - l->sent;
            } else if (push_double(&l->rq->itl, &l->rq->n_itl, &l->rq->cap_itl, now - l->last)) {
                json_decref(j);
                return MS_ENOMEM;
            }
            l->last = now;
            size_t n = l->chunks;
            if (push_double(&l->chunk_times, &n, &l->cap_times, now - l->t0)) {
                json_decref(j);
                return MS_ENOMEM;
            }
            l->chunks = n;
        }
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        json_t *pt = json_object_get(u, "prompt_tokens"), *ct = json_object_get(u, "completion_tokens");
        if (json_is_integer(pt)) l->rq->prompt_tokens = (int)json_integer_value(pt);
        if (json_is_integer(ct)) {
            l->rq->output_tokens = (int)json_integer_value(ct);
            l->rq->usage_seen = true;
        }
    }
    json_decref(j);
    return 0;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct live *l = ud;
    size_t n = size * nmemb;
    if (!l->status) curl_easy_getinfo(l->easy, CURLINFO_RESPONSE_CODE, &l->status);
    if (l->status != 200) { // keep the start of an error body for the message
        size_t room = MAX_ERROR_BODY - l->errbody_len, take = n < room ? n : room;
        if (take) {
            char *b = realloc(l->errbody, l->errbody_len + take + 1);
            if (!b) return 0;
            memcpy(b + l->errbody_len, ptr, take);
            l->errbody = b;
            l->errbody_len += take;
            b[l->errbody_len] = 0;
        }
        return n;
    }
    int rc = sse_feed(l->sse, ptr, n);
    if (rc == MS_EFORMAT) set_stream_err(l, "an SSE event is longer than 4 MiB%s", NULL);
    else if (rc == MS_ENOMEM) set_stream_err(l, "out of memory%s", NULL);
    return rc ? 0 : n; // 0 aborts the transfer
}

static void live_free(struct live *l)
{
    if (l->easy) curl_easy_cleanup(l->easy);
    curl_slist_free_all(l->headers);
    sse_destroy(l->sse);
    free(l->errbody);
    free(l->stream_err);
    free(l->chunk_times);
}

struct run {
    const struct bench_opts *o;
    CURLM *multi;
    char url[2048];
    char auth[1024];
    double t0;
    struct live *live;        // (num_prompts)
    int running, done, failed, peak;
    uint64_t out_tokens;
};

static int start_request(struct run *R, int i, struct prompt *p, struct bench_request *rq)
{
    struct live *l = &R->live[i];
    memset(l, 0, sizeof *l);
    l->rq = rq;
    l->t0 = R->t0;
    rq->input_len = p->input_len;
    rq->output_len = p->output_len;
    rq->prompt_tokens = p->input_len;
    l->easy = curl_easy_init();
    l->sse = sse_create(MAX_EVENT_BYTES, on_event, l);
    l->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (l->headers) l->headers = curl_slist_append(l->headers, "Accept: text/event-stream");
    if (l->headers && R->auth[0]) l->headers = curl_slist_append(l->headers, R->auth);
    if (!l->easy || !l->sse || !l->headers) return MS_ENOMEM;
    CURL *e = l->easy;
    curl_easy_setopt(e, CURLOPT_URL, R->url);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, p->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(p->body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, l->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, l);
    curl_easy_setopt(e, CURLOPT_PRIVATE, l);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, l->curl_err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    if (R->o->request_timeout > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(R->o->request_timeout * 1000));
    l->sent = ms_now();
    rq->start = l->sent - R->t0;
    if (curl_multi_add_handle(R->multi, e) != CURLM_OK) return MS_ENOMEM;
    R->running++;
    if (R->running > R->peak) R->peak = R->running;
    return 0;
}

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

static void finish_request(struct run *R, struct live *l, CURLcode res)
{
    struct bench_request *rq = l->rq;
    double end = ms_now();
    rq->latency = end - l->sent;
    if (res == CURLE_OK && l->status == 200 && !l->stream_err) {
        int rc = sse_finish(l->sse);
        if (rc == MS_EFORMAT) set_stream_err(l, "an SSE event is longer than 4 MiB%s", NULL);
    }
    curl_easy_getinfo(l->easy, CURLINFO_RESPONSE_CODE, &l->status);
    bool ok = false;
    if (l->stream_err) {
        rq->error = l->stream_err;
        l->stream_err = NULL;
    } else if (res != CURLE_OK) {
        rq->error = str_printf("%s", l->curl_err[0] ? l->curl_err : curl_easy_strerror(res));
    } else if (l->status != 200) {
        rq->error = str_printf("HTTP %ld: %.300s", l->status, l->errbody ? l->errbody : "");
    } else if (!l->done) {
        rq->error = str_printf("the stream ended without data: [DONE] (%zu content chunks)", l->chunks);
    } else if (!l->first_seen) {
        rq->error = str_printf("no chunk carried generated text, so there is no TTFT");
    } else {
        ok = true;
    }
    rq->success = ok;
    if (!ok) {
        R->failed++;
    } else {
        if (!rq->usage_seen) rq->output_tokens = (int)l->chunks;
        R->out_tokens += (uint64_t)rq->output_tokens;
    }
    curl_multi_remove_handle(R->multi, l->easy);
    R->running--;
    R->done++;
}

static void progress_line(struct run *R, FILE *f, int total, bool final)
{
    if (!f) return;
    double el = ms_now() - R->t0;
    fprintf(f, "%s[%*d/%d] %d running, %d failed, %.1f s, %.0f output tok/s%s",
            isatty(fileno(f)) ? "\r" : "", (int)snprintf(NULL, 0, "%d", total), R->done, total,
            R->running, R->failed, el, el > 0 ? (double)R->out_tokens / el : 0.0,
            isatty(fileno(f)) && !final ? "   " : "\n");
    fflush(f);
}

// Drives requests [first, first + n) through the multi handle: each starts
// at its arrival time, when fewer than max_concurrency are in flight.
static int drive(struct run *R, struct prompt *prompts, struct bench_request *reqs, int first, int n,
                 const double *arrivals, FILE *progress, char *err, size_t errlen)
{
    const struct bench_opts *o = R->o;
    int next = first, end = first + n, target = R->done + n;
    double last_progress = 0;
    bool tty = progress && isatty(fileno(progress));
    while (R->done < target) {
        double now = ms_now() - R->t0;
        while (next < end && arrivals[next] <= now &&
               (o->max_concurrency <= 0 || R->running < o->max_concurrency)) {
            if (start_request(R, next, &prompts[next], &reqs[next]))
                return ms_err(err, errlen, MS_ENOMEM, "out of memory starting request %d", next);
            next++;
        }
        int still;
        CURLMcode mc = curl_multi_perform(R->multi, &still);
        if (mc != CURLM_OK)
            return ms_err(err, errlen, MS_EIO, "libcurl: %s", curl_multi_strerror(mc));
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(R->multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            struct live *l;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&l);
            finish_request(R, l, msg->data.result);
        }
        if (R->done >= target) break;
        // Sleep until data, the next arrival, or the next progress tick.
        double wait = 0.25;
        if (next < end && (o->max_concurrency <= 0 || R->running < o->max_concurrency)) {
            double until = arrivals[next] - (ms_now() - R->t0);
            if (until < wait) wait = until > 0 ? until : 0;
        }
        if (wait > 0) curl_multi_poll(R->multi, NULL, 0, (int)(wait * 1000) + 1, NULL);
        double t = ms_now() - R->t0;
        if (t - last_progress >= (tty ? 0.5 : 5.0)) {
            progress_line(R, progress, target, false);
            last_progress = t;
        }
    }
    return 0;
}

// ---- the benchmark -----------------------------------------------------------------------------
static size_t collect(char *ptr, size_t size, size_t nmemb, void *ud)
{
    char **buf = ud;
    size_t n = size * nmemb, have = *buf ? strlen(*buf) : 0;
    if (have + n > (1u << 20)) return 0;
    char *b = realloc(*buf, have + n + 1);
    if (!b) return 0;
    memcpy(b + have, ptr, n);
    b[have + n] = 0;
    *buf = b;
    return n;
}

// The first model GET /v1/models lists (what vLLM's bench does without --model).
static int first_model(const struct run *R, char *out, size_t outlen, char *err, size_t errlen)
{
    char url[2100];
    snprintf(url, sizeof url, "%s/v1/models", R->o->base_url);
    size_t bl = strlen(R->o->base_url);
    if (bl && R->o->base_url[bl - 1] == '/') snprintf(url, sizeof url, "%.*sv1/models", (int)bl, R->o->base_url);
    CURL *e = curl_easy_init();
    if (!e) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    char *body = NULL, cerr[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = R->auth[0] ? curl_slist_append(NULL, R->auth) : NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 30L);
    CURLcode res = curl_easy_perform(e);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    int rc = 0;
    if (res != CURLE_OK) {
        rc = ms_err(err, errlen, MS_EIO, "GET %s: %s; is the server up? (or pass --model)", url,
                    cerr[0] ? cerr : curl_easy_strerror(res));
    } else if (status == 401 || status == 403) {
        rc = ms_err(err, errlen, MS_EIO, "GET %s: HTTP %ld: %.300s: pass --api-key KEY (or set OPENAI_API_KEY)",
                    url, status, body ? body : "");
    } else if (status != 200) {
        rc = ms_err(err, errlen, MS_EIO, "GET %s: HTTP %ld: %.300s (pass --model)", url, status,
                    body ? body : "");
    } else {
        json_t *j = body ? json_loads(body, 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (!id || snprintf(out, outlen, "%s", id) >= (int)outlen)
            rc = ms_err(err, errlen, MS_EFORMAT, "GET %s lists no model id (pass --model)", url);
        json_decref(j);
    }
    free(body);
    return rc;
}

static int check_opts(const struct bench_opts *o, char *err, size_t errlen)
{
    if (!o->base_url || strncmp(o->base_url, "http", 4))
        return ms_err(err, errlen, MS_EINVAL, "--base-url '%s': expected http://HOST:PORT or https://...",
                      o->base_url ? o->base_url : "");
    if (!o->endpoint || o->endpoint[0] != '/')
        return ms_err(err, errlen, MS_EINVAL, "--endpoint '%s': expected /v1/completions or /v1/chat/completions",
                      o->endpoint ? o->endpoint : "");
    if (o->num_prompts < 1) return ms_err(err, errlen, MS_EINVAL, "--num-prompts must be at least 1");
    if (o->max_concurrency < 0) return ms_err(err, errlen, MS_EINVAL, "--max-concurrency must be positive");
    if (!(o->request_rate > 0)) return ms_err(err, errlen, MS_EINVAL, "--request-rate must be positive or inf");
    if (o->random_input_len < 1 || o->random_output_len < 1)
        return ms_err(err, errlen, MS_EINVAL, "--random-input-len and --random-output-len must be at least 1");
    if (!(o->random_range_ratio >= 0 && o->random_range_ratio < 1))
        return ms_err(err, errlen, MS_EINVAL, "--random-range-ratio must be in [0, 1)");
    if (o->vocab_lo < 0 || o->vocab_hi <= o->vocab_lo)
        return ms_err(err, errlen, MS_EINVAL, "--random-vocab-range %d:%d is empty", o->vocab_lo, o->vocab_hi);
    bool chat = strstr(o->endpoint, "chat") != NULL;
    if (chat && o->prompt_kind == BENCH_PROMPT_IDS)
        return ms_err(err, errlen, MS_EINVAL, "token-id prompts need /v1/completions: chat messages are text");
    return 0;
}

static void compute_result(struct bench_result *r, struct run *R, double duration)
{
    r->duration = duration;
    size_t n_itl = 0;
    for (int i = 0; i < r->num_prompts; i++) n_itl += r->reqs[i].n_itl;
    double *ttft = calloc((size_t)r->num_prompts + 1, sizeof *ttft);
    double *tpot = calloc((size_t)r->num_prompts + 1, sizeof *tpot);
    double *e2el = calloc((size_t)r->num_prompts + 1, sizeof *e2el);
    double *itl = calloc(n_itl + 1, sizeof *itl);
    size_t nt = 0, np = 0, ni = 0;
    for (int i = 0; i < r->num_prompts; i++) {
        struct bench_request *q = &r->reqs[i];
        if (!q->success) continue;
        r->completed++;
        r->total_input += (uint64_t)q->prompt_tokens;
        r->total_output += (uint64_t)q->output_tokens;
        if (!q->usage_seen) r->usage_missing = true;
        if (!ttft || !tpot || !e2el || !itl) continue;
        ttft[nt] = q->ttft * 1e3;
        e2el[nt++] = q->latency * 1e3;
        // TPOT excludes the first token: (E2EL - TTFT) / (tokens - 1).
        if (q->output_tokens > 1) tpot[np++] = (q->latency - q->ttft) / (q->output_tokens - 1) * 1e3;
        for (size_t k = 0; k < q->n_itl; k++) itl[ni++] = q->itl[k] * 1e3;
    }
    r->failed = r->num_prompts - r->completed;
    if (ttft && tpot && e2el && itl) {
        bench_stats_of(ttft, nt, &r->ttft);
        bench_stats_of(tpot, np, &r->tpot);
        bench_stats_of(itl, ni, &r->itl);
        bench_stats_of(e2el, nt, &r->e2el);
    }
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    if (duration > 0) {
        r->request_throughput = r->completed / duration;
        r->output_throughput = (double)r->total_output / duration;
        r->total_token_throughput = (double)(r->total_input + r->total_output) / duration;
    }
    // Peak output throughput: content chunks per whole second of the run.
    size_t bins = (size_t)ceil(duration) + 1;
    uint64_t *count = calloc(bins, sizeof *count);
    if (count) {
        uint64_t peak = 0;
        for (int i = 0; i < r->num_prompts; i++) {
            const struct live *l = &R->live[i];
            for (size_t k = 0; k < l->chunks; k++) {
                size_t b = (size_t)(l->chunk_times[k] > 0 ? l->chunk_times[k] : 0);
                if (b >= bins) b = bins - 1;
                if (++count[b] > peak) peak = count[b];
            }
        }
        r->peak_output_throughput = (double)peak;
        free(count);
    }
    r->peak_concurrency = R->peak;
}

int bench_run(const struct bench_opts *o, struct bench_result *r, FILE *progress, char *err,
              size_t errlen)
{
    memset(r, 0, sizeof *r);
    int rc = check_opts(o, err, errlen);
    if (rc) return rc;
    json_t *extra = NULL;
    if (o->extra_body) {
        json_error_t je;
        extra = json_loads(o->extra_body, 0, &je);
        if (!json_is_object(extra)) {
            json_decref(extra);
            return ms_err(err, errlen, MS_EINVAL, "--extra-body: expected a JSON object (%s)",
                          extra ? "got another JSON value" : je.text);
        }
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        json_decref(extra);
        return ms_err(err, errlen, MS_EIO, "libcurl failed to initialise");
    }
    const int n = o->num_prompts;
    struct run R = {.o = o};
    struct prompt *prompts = calloc((size_t)n, sizeof *prompts);
    double *arrivals = calloc((size_t)n, sizeof *arrivals);
    r->reqs = calloc((size_t)n, sizeof *r->reqs);
    R.live = calloc((size_t)n, sizeof *R.live);
    R.multi = curl_multi_init();
    if (!prompts || !arrivals || !r->reqs || !R.live || !R.multi) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory for %d requests", n);
        goto out;
    }
    r->num_prompts = n;
    size_t bl = strlen(o->base_url);
    while (bl && o->base_url[bl - 1] == '/') bl--;
    if (snprintf(R.url, sizeof R.url, "%.*s%s", (int)bl, o->base_url, o->endpoint) >= (int)sizeof R.url) {
        rc = ms_err(err, errlen, MS_EINVAL, "--base-url and --endpoint make a URL longer than 2 KiB");
        goto out;
    }
    if (o->api_key && *o->api_key &&
        snprintf(R.auth, sizeof R.auth, "Authorization: Bearer %s", o->api_key) >= (int)sizeof R.auth) {
        rc = ms_err(err, errlen, MS_EINVAL, "--api-key is longer than 1000 bytes");
        goto out;
    }
    if (o->model) snprintf(r->model, sizeof r->model, "%s", o->model);
    else if ((rc = first_model(&R, r->model, sizeof r->model, err, errlen))) goto out;

    bool chat = strstr(o->endpoint, "chat") != NULL;
    bool ids = o->prompt_kind == BENCH_PROMPT_IDS || (o->prompt_kind == BENCH_PROMPT_AUTO && !chat);
    uint64_t rng = o->seed;
    for (int i = 0; i < n; i++) {
        double rr = o->random_range_ratio;
        int in = rng_between(&rng, (int)floor(o->random_input_len * (1 - rr)), (int)ceil(o->random_input_len * (1 + rr)));
        int out = rng_between(&rng, (int)floor(o->random_output_len * (1 - rr)), (int)ceil(o->random_output_len * (1 + rr)));
        prompts[i].input_len = in < 1 ? 1 : in;
        prompts[i].output_len = out < 1 ? 1 : out;
        prompts[i].body = make_body(o, extra, r->model, chat, ids, prompts[i].input_len,
                                    prompts[i].output_len, &rng);
        if (!prompts[i].body) {
            rc = ms_err(err, errlen, MS_ENOMEM, "out of memory building prompt %d", i);
            goto out;
        }
    }
    bench_arrivals(n, o->request_rate, o->seed, arrivals);

    if (o->initial_test) {
        // One request alone first, as vLLM does: a wrong model name, URL or
        // key shows as one clear error instead of n failures.
        struct bench_request probe = {0};
        double zero = 0;
        R.t0 = ms_now();
        rc = drive(&R, prompts, &probe, 0, 1, &zero, NULL, err, errlen);
        live_free(&R.live[0]);
        memset(&R.live[0], 0, sizeof R.live[0]);
        if (!rc && !probe.success)
            rc = ms_err(err, errlen, MS_EIO, "the initial test request to %s failed: %s", R.url,
                        probe.error ? probe.error : "unknown error");
        free(probe.error);
        free(probe.itl);
        if (rc) goto out;
        R.done = R.failed = R.peak = 0;
        R.out_tokens = 0;
    }
    R.t0 = ms_now();
    rc = drive(&R, prompts, r->reqs, 0, n, arrivals, progress, err, errlen);
    double duration = ms_now() - R.t0;
    progress_line(&R, progress, n, true);
    if (!rc) compute_result(r, &R, duration);
out:
    if (R.live)
        for (int i = 0; i < n; i++) {
            if (R.live[i].easy && R.multi) curl_multi_remove_handle(R.multi, R.live[i].easy);
            live_free(&R.live[i]);
        }
    free(R.live);
    if (R.multi) curl_multi_cleanup(R.multi);
    if (prompts)
        for (int i = 0; i < n; i++) free(prompts[i].body);
    free(prompts);
    free(arrivals);
    json_decref(extra);
    curl_global_cleanup();
    if (rc) bench_result_free(r);
    return rc;
}

void bench_result_free(struct bench_result *r)
{
    if (r->reqs)
        for (int i = 0; i < r->num_prompts; i++) {
            free(r->reqs[i].error);
            free(r->reqs[i].itl);
        }
    free(r->reqs);
    r->reqs = NULL;
}

// ---- output ---------------------------------------------------------------------------------------
static void rule(FILE *f, const char *title, char c)
{
    int n = (int)strlen(title), left = (50 - n) / 2, right = 50 - n - left;
    for (int i = 0; i < left; i++) fputc(c, f);
    fputs(title, f);
    for (int i = 0; i < right; i++) fputc(c, f);
    fputc('\n', f);
}

static void stat_block(FILE *f, const char *title, const char *abbr, const struct bench_stats *s)
{
    rule(f, title, '-');
    char k[64];
    snprintf(k, sizeof k, "Mean %s (ms):", abbr);
    fprintf(f, "%-40s %-10.2f\n", k, s->mean);
    snprintf(k, sizeof k, "Median %s (ms):", abbr);
    fprintf(f, "%-40s %-10.2f\n", k, s->median);
    snprintf(k, sizeof k, "P99 %s (ms):", abbr);
    fprintf(f, "%-40s %-10.2f\n", k, s->p99);
}

void bench_print(const struct bench_opts *o, const struct bench_result *r, FILE *f)
{
    rule(f, " Serving Benchmark Result ", '=');
    fprintf(f, "%-40s %-10d\n", "Successful requests:", r->completed);
    fprintf(f, "%-40s %-10d\n", "Failed requests:", r->failed);
    if (o->max_concurrency > 0) fprintf(f, "%-40s %-10d\n", "Maximum request concurrency:", o->max_concurrency);
    else fprintf(f, "%-40s %-10s\n", "Maximum request concurrency:", "unlimited");
    if (isfinite(o->request_rate)) fprintf(f, "%-40s %-10.2f\n", "Request rate (req/s):", o->request_rate);
    else fprintf(f, "%-40s %-10s\n", "Request rate (req/s):", "inf");
    fprintf(f, "%-40s %-10.2f\n", "Benchmark duration (s):", r->duration);
    fprintf(f, "%-40s %-10llu\n", "Total input tokens:", (unsigned long long)r->total_input);
    fprintf(f, "%-40s %-10llu\n", "Total generated tokens:", (unsigned long long)r->total_output);
    fprintf(f, "%-40s %-10.2f\n", "Request throughput (req/s):", r->request_throughput);
    fprintf(f, "%-40s %-10.2f\n", "Output token throughput (tok/s):", r->output_throughput);
    fprintf(f, "%-40s %-10.2f\n", "Peak output token throughput (tok/s):", r->peak_output_throughput);
    fprintf(f, "%-40s %-10.2f\n", "Peak concurrent requests:", (double)r->peak_concurrency);
    fprintf(f, "%-40s %-10.2f\n", "Total Token throughput (tok/s):", r->total_token_throughput);
    stat_block(f, "Time to First Token", "TTFT", &r->ttft);
    stat_block(f, "Time per Output Token (excl. 1st token)", "TPOT", &r->tpot);
    stat_block(f, "Inter-token Latency", "ITL", &r->itl);
    stat_block(f, "End-to-end Latency", "E2EL", &r->e2el);
    rule(f, "", '=');
    if (r->usage_missing)
        fprintf(f, "note: some streams had no usage chunk; their tokens were counted as chunks\n");
    int shown = 0;
    for (int i = 0; i < r->num_prompts && shown < 5; i++)
        if (r->reqs[i].error) {
            fprintf(f, "request %d failed: %s\n", i, r->reqs[i].error);
            shown++;
        }
    if (r->failed > shown) fprintf(f, "(%d more failed)\n", r->failed - shown);
}

static void put_stats(json_t *o, const char *name, const struct bench_stats *s)
{
    char k[64];
    snprintf(k, sizeof k, "mean_%s_ms", name);
    json_object_set_new(o, k, json_real(s->mean));
    snprintf(k, sizeof k, "median_%s_ms", name);
    json_object_set_new(o, k, json_real(s->median));
    snprintf(k, sizeof k, "std_%s_ms", name);
    json_object_set_new(o, k, json_real(s->std));
    snprintf(k, sizeof k, "p99_%s_ms", name);
    json_object_set_new(o, k, json_real(s->p99));
}

int bench_save_json(const struct bench_opts *o, const struct bench_result *r, const char *path,
                    char *err, size_t errlen)
{
    json_t *j = json_object();
    json_t *in = json_array(), *out = json_array(), *ttfts = json_array(), *itls = json_array(),
           *errors = json_array(), *lat = json_array();
    if (!j || !in || !out || !ttfts || !itls || !errors || !lat) {
        json_decref(j); json_decref(in); json_decref(out); json_decref(ttfts);
        json_decref(itls); json_decref(errors); json_decref(lat);
        return ms_err(err, errlen, MS_ENOMEM, "out of memory writing %s", path);
    }
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    json_object_set_new(j, "date", json_string(date));
    json_object_set_new(j, "backend", json_string(strstr(o->endpoint, "chat") ? "openai-chat" : "openai"));
    json_object_set_new(j, "base_url", json_string(o->base_url));
    json_object_set_new(j, "endpoint", json_string(o->endpoint));
    json_object_set_new(j, "model_id", json_string(r->model));
    json_object_set_new(j, "num_prompts", json_integer(r->num_prompts));
    if (isfinite(o->request_rate)) json_object_set_new(j, "request_rate", json_real(o->request_rate));
    else json_object_set_new(j, "request_rate", json_string("inf"));
    json_object_set_new(j, "burstiness", json_real(1.0));
    json_object_set_new(j, "max_concurrency", o->max_concurrency > 0 ? json_integer(o->max_concurrency) : json_null());
    json_object_set_new(j, "random_input_len", json_integer(o->random_input_len));
    json_object_set_new(j, "random_output_len", json_integer(o->random_output_len));
    json_object_set_new(j, "ignore_eos", json_boolean(o->ignore_eos));
    json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(j, "duration", json_real(r->duration));
    json_object_set_new(j, "completed", json_integer(r->completed));
    json_object_set_new(j, "failed", json_integer(r->failed));
    json_object_set_new(j, "total_input_tokens", json_integer((json_int_t)r->total_input));
    json_object_set_new(j, "total_output_tokens", json_integer((json_int_t)r->total_output));
    json_object_set_new(j, "request_throughput", json_real(r->request_throughput));
    json_object_set_new(j, "request_goodput", json_null());
    json_object_set_new(j, "output_throughput", json_real(r->output_throughput));
    json_object_set_new(j, "total_token_throughput", json_real(r->total_token_throughput));
    json_object_set_new(j, "max_output_tokens_per_s", json_real(r->peak_output_throughput));
    json_object_set_new(j, "max_concurrent_requests", json_integer(r->peak_concurrency));
    put_stats(j, "ttft", &r->ttft);
    put_stats(j, "tpot", &r->tpot);
    put_stats(j, "itl", &r->itl);
    put_stats(j, "e2el", &r->e2el);
    for (int i = 0; i < r->num_prompts; i++) {
        const struct bench_request *q = &r->reqs[i];
        json_array_append_new(in, json_integer(q->prompt_tokens));
        json_array_append_new(out, json_integer(q->success ? q->output_tokens : 0));
        json_array_append_new(ttfts, json_real(q->success ? q->ttft : 0.0));
        json_array_append_new(lat, json_real(q->latency));
        json_t *g = json_array();
        for (size_t k = 0; g && k < q->n_itl; k++) json_array_append_new(g, json_real(q->itl[k]));
        json_array_append_new(itls, g ? g : json_null());
        json_array_append_new(errors, json_string(q->error ? q->error : ""));
    }
    json_object_set_new(j, "input_lens", in);
    json_object_set_new(j, "output_lens", out);
    json_object_set_new(j, "ttfts", ttfts);
    json_object_set_new(j, "itls", itls);
    json_object_set_new(j, "e2els", lat);
    json_object_set_new(j, "errors", errors);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (rc) return ms_err(err, errlen, MS_EIO, "cannot write %s", path);
    return 0;
}
