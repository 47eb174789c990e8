// routes_text: tokenize, detokenize, models, version, health and metrics
// over the loaded app (see routes_text.h); each answers at once.
#include "server/routes_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/openai.h"
#include "base/arena.h"
#include "base/base.h"
#include "moeserve_build.h"
#include "server/app_state.h"
#include "server/dashboard.h"
#include "server/prometheus.h"


// The byte-level BPE spelling of a token, as convert_ids_to_tokens gives it
// (bytes 33-126, 161-172, 174-255 as themselves, the rest shifted to U+0100+).
static json_t *token_str_json(struct app *a, int32_t id)
{
    size_t n = 0;
    const uint8_t *b = tok_token_bytes(a->tok, id, &n);
    if (!b) return json_null();
    if (tok_is_special(a->tok, id)) {
        char *s = malloc(3 * n + 1);
        if (!s) return json_null();
        size_t l = oa_utf8_lossy(b, n, s);
        json_t *j = json_stringn(s, l);
        free(s);
        return j;
    }
    char *s = malloc(2 * n + 1);
    if (!s) return json_null();
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned c = b[i];
        if ((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174) {
            if (c < 0x80) s[o++] = (char)c;
            else s[o++] = (char)(0xc0 | (c >> 6)), s[o++] = (char)(0x80 | (c & 0x3f));
        } else {
            // The other bytes take the code points from 256 up, in byte order.
            unsigned k = c <= 32 ? c : c <= 160 ? 33 + (c - 127) : 67; // 67: byte 173
            unsigned cp = 256 + k;
            s[o++] = (char)(0xc0 | (cp >> 6));
            s[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    json_t *j = json_stringn(s, o);
    free(s);
    return j;
}

void routes_text_tokenize(void *app, struct http_request *r)
{
    struct app *a = app;
    if (!app_serving(a, r)) return;
    size_t len;
    const char *body = http_body(r, &len);
    struct arena *ar = arena_create(4096);
    struct oa_tokenize_request t;
    struct oa_error e;
    memset(&t, 0, sizeof t);
    int32_t *ids = NULL;
    int n_ids = 0;
    int rc = ar ? oa_parse_tokenize(body, len, &a->limits, ar, &t, &e)
                : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (!rc && !app_served_name(a, t.model, &e)) rc = e.status;
    if (!rc) {
        if (t.is_chat) {
            char *text;
            size_t tl;
            json_t *kw = app_chat_kwargs(a, t.chat_template_kwargs, -1);
            rc = kw ? app_render_chat(a, t.messages, t.tools, t.add_generation_prompt,
                                      t.continue_final_message, kw, &text,
                                      &tl, &e)
                    : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
            json_decref(kw);
            if (!rc) {
                rc = app_encode(a, text, tl, "messages", t.add_special_tokens ? APP_ENCODE_SPECIAL : 0,
                                &ids, &n_ids, &e);
                free(text);
            }
        } else {
            rc = app_encode(a, t.prompt, t.prompt_len, "prompt",
                            t.add_special_tokens ? APP_ENCODE_SPECIAL : 0, &ids, &n_ids, &e);
        }
    }
    if (rc) {
        app_respond_error(r, &e);
    } else {
        json_t *o = json_object(), *tokens = json_array();
        for (int i = 0; i < n_ids; i++) json_array_append_new(tokens, json_integer(ids[i]));
        json_object_set_new(o, "count", json_integer(n_ids));
        json_object_set_new(o, "max_model_len", json_integer(a->max_model_len));
        json_object_set_new(o, "tokens", tokens);
        if (t.return_token_strs) {
            json_t *strs = json_array();
            for (int i = 0; i < n_ids; i++) json_array_append_new(strs, token_str_json(a, ids[i]));
            json_object_set_new(o, "token_strs", strs);
        } else {
            json_object_set_new(o, "token_strs", json_null());
        }
        http_set_log_tokens(r, n_ids, 0);
        http_respond_json(r, 200, o);
    }
    free(ids);
    oa_tokenize_request_release(&t);
    arena_destroy(ar);
}

void routes_text_detokenize(void *app, struct http_request *r)
{
    struct app *a = app;
    if (!app_serving(a, r)) return;
    size_t len;
    const char *body = http_body(r, &len);
    struct arena *ar = arena_create(4096);
    struct oa_detokenize_request d;
    struct oa_error e;
    int rc = ar ? oa_parse_detokenize(body, len, &a->limits, ar, &d, &e)
                : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (!rc && !app_served_name(a, d.model, &e)) rc = e.status;
    char *text = NULL;
    size_t tl = 0;
    if (!rc) {
        char err[256];
        rc = tok_decode(a->tok, d.tokens, (size_t)d.n_tokens, false, &text, &tl, err, sizeof err);
        if (rc) oa_errorf(&e, rc, "invalid_value", "tokens", "%s", err);
    }
    if (rc) {
        app_respond_error(r, &e);
    } else {
        json_t *o = json_object();
        json_object_set_new(o, "prompt", json_stringn(text, tl));
        http_respond_json(r, 200, o);
    }
    free(text);
    arena_destroy(ar);
}

// One served name as vLLM's model card lists it, with the keys Anthropic's
// SDK reads of one (type, display_name, created_at) beside them.
static json_t *model_json(const struct app *a, int i)
{
    char created[32];
    const time_t t = (time_t)a->created;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(created, sizeof created, "1970-01-01T00:00:00Z");
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[], s:s, s:s, s:s}", "id", a->names[i], "object",
                     "model", "created", (json_int_t)a->created, "owned_by", "moeserve", "root",
                     a->model->dir, "parent", "max_model_len", a->max_model_len, "permission", "type",
                     "model", "display_name", a->names[i], "created_at", created);
}

void routes_text_models(void *app, struct http_request *r)
{
    struct app *a = app;
    if (atomic_load(&a->state) == APP_LOADING) {
        app_serving(a, r);
        return;
    }
    json_t *data = json_array();
    for (int i = 0; i < a->n_names; i++) json_array_append_new(data, model_json(a, i));
    // Anthropic's page keys beside OpenAI's list.
    http_respond_json(r, 200, json_pack("{s:s, s:o, s:b, s:s, s:s}", "object", "list", "data", data, "has_more", 0,
                                        "first_id", a->names[0], "last_id", a->names[a->n_names - 1]));
}

// GET /v1/models/{id}: the card of one served name, or 404 model_not_found.
void routes_text_model(void *app, struct http_request *r)
{
    struct app *a = app;
    if (atomic_load(&a->state) == APP_LOADING) {
        app_serving(a, r);
        return;
    }
    const char *id = http_path_rest(r);
    for (int i = 0; i < a->n_names; i++)
        if (!strcmp(a->names[i], id)) {
            http_respond_json(r, 200, model_json(a, i));
            return;
        }
    struct oa_error e;
    app_served_name(a, id, &e);
    app_respond_error(r, &e);
}

void routes_text_version(void *app, struct http_request *r)
{
    (void)app;
    http_respond_json(r, 200, json_pack("{s:s, s:s}", "name", "moeserve", "version", MOESERVE_VERSION));
}

// The live page; open like /metrics, which it reads. Its policy lets it run
// only its own inline script and talk only to this server, so nothing on it
// can come from elsewhere.
void routes_text_dashboard(void *app, struct http_request *r)
{
    (void)app;
    http_add_header(r, "Cache-Control", "no-cache");
    http_add_header(r, "Content-Security-Policy",
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                    "connect-src 'self'; img-src data:");
    http_add_header(r, "X-Content-Type-Options", "nosniff");
    http_respond(r, 200, "text/html; charset=utf-8", dashboard_html, dashboard_html_len);
}

// 200 only while serving and the step loop is alive: when work is queued or
// running, some step or output must have happened within health_timeout_s.
void routes_text_health(void *app, struct http_request *r)
{
    struct app *a = app;
    int st = atomic_load(&a->state);
    json_t *o = json_object();
    int status = 200;
    const char *what = "ok";
    if (st == APP_LOADING) {
        status = 503;
        what = "loading";
    } else {
        struct engine_stats s;
        engine_get_stats(a->engine, &s);
        double now = ms_now();
        pthread_mutex_lock(&a->health_mu);
        bool work = s.num_running + s.num_waiting > 0;
        if (s.steps != a->health_steps || !work) {
            a->health_steps = s.steps;
            a->health_t = now;
        }
        double last = a->health_t;
        pthread_mutex_unlock(&a->health_mu);
        double last_delta = (double)atomic_load(&a->last_delta_us) * 1e-6;
        if (last_delta > last) last = last_delta;
        if (st == APP_DRAINING || s.draining) {
            status = 503;
            what = "draining";
        } else if (work && now - last > a->health_timeout_s) {
            status = 503;
            what = "stalled";
        }
        int used = 0, cached = 0, total = 0;
        for (int i = 0; i < s.n_ranks && i < ENGINE_MAX_RANKS; i++) {
            used += s.rank[i].kv_blocks_used;
            cached += s.rank[i].kv_blocks_cached;
            total += s.rank[i].kv_blocks_total;
        }
        json_object_set_new(o, "num_running", json_integer(s.num_running));
        json_object_set_new(o, "num_waiting", json_integer(s.num_waiting));
        json_object_set_new(o, "kv_blocks_used", json_integer(used));
        json_object_set_new(o, "kv_blocks_cached", json_integer(cached));
        json_object_set_new(o, "kv_blocks_total", json_integer(total));
        json_object_set_new(o, "steps", json_integer((json_int_t)s.steps));
        json_object_set_new(o, "generation_tokens_total", json_integer((json_int_t)s.generation_tokens_total));
        json_object_set_new(o, "seconds_since_progress", json_real(work ? now - last : 0.0));
    }
    json_object_set_new(o, "status", json_string(what));
    if (status == 503) http_add_header(r, "Retry-After", "1");
    http_respond_json(r, status, o);
}

// Prometheus text: the engine's counters and gauges now, and the histograms
// and MoE series the engine fed. Open without a key, like /health.
void routes_text_metrics(void *app, struct http_request *r)
{
    struct app *a = app;
    if (atomic_load(&a->state) == APP_LOADING || !a->metrics) {
        http_add_header(r, "Retry-After", "1");
        http_respond(r, 503, "text/plain; charset=utf-8", "loading\n", 8);
        return;
    }
    struct engine_stats st;
    engine_get_stats(a->engine, &st);
    struct metrics_snapshot ms;
    char *text = NULL, err[256];
    size_t len = 0;
    int rc = metrics_take_snapshot(a->metrics, &ms, err, sizeof err);
    if (!rc) rc = prometheus_render(&a->metrics_page, &st, &ms, &text, &len, err, sizeof err);
    metrics_snapshot_release(&ms);
    if (rc) {
        http_respond(r, 500, "text/plain; charset=utf-8", err, strlen(err));
        return;
    }
    http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}
