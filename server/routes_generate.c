// routes_generate: POST /v1/chat/completions and /v1/completions — parse
// and validate the body, turn the messages or prompts into token ids, check
// them against the context, and submit one engine request per choice as a
// job (server/job.h), which answers with one body or an SSE stream.
#include "server/routes_generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai.h"
#include "base/arena.h"
#include "base/base.h"
#include "server/app_state.h"
#include "server/job.h"

// The request as parsed: exactly one of cr (chat) and pr (completions)
// holds it; g, served and param point into it or at static strings.
struct parsed {
    bool chat;
    struct oa_chat_request cr;
    struct oa_completion_request pr;
    const struct oa_gen_params *g;
    const char *served;              // the served model name it asked for
    const char *param;               // where its prompt is: "messages" or "prompt"
};

static int parse(struct app *a, struct http_request *r, struct job *j, struct parsed *q,
                 struct oa_error *e)
{
    size_t len;
    const char *body = http_body(r, &len);
    const char *model, *ignored;
    int rc;
    if (q->chat) {
        rc = oa_parse_chat(body, len, &a->limits, j->arena, &q->cr, e);
        q->g = &q->cr.gen;
        model = q->cr.model;
        ignored = q->cr.ignored;
    } else {
        rc = oa_parse_completion(body, len, &a->limits, j->arena, &q->pr, e);
        q->g = &q->pr.gen;
        model = q->pr.model;
        ignored = q->pr.ignored;
        j->echo = !rc && q->pr.echo;
    }
    if (rc) return rc;
    if (ignored) ms_log(MS_LOG_WARN, "%s: ignored unknown fields: %s", http_path(r), ignored);
    q->served = app_served_name(a, model, e);
    return q->served ? 0 : e->status;
}

static int chat_prompt(struct app *a, const struct parsed *q, struct job_prompt *p,
                       struct oa_error *e)
{
    char *text;
    size_t tl;
    int rc = app_render_chat(a, q->cr.messages, q->cr.add_generation_prompt,
                             q->cr.chat_template_kwargs, &text, &tl, e);
    if (rc) return rc;
    rc = app_encode(a, text, tl, q->param, &p->ids, &p->n_ids, e);
    free(text);
    return rc;
}

// A prompt given as text or as ids; with echo, both spellings are kept.
static int completion_prompt(struct app *a, const struct parsed *q, bool echo,
                             const struct oa_prompt *op, struct job_prompt *p, struct oa_error *e)
{
    if (op->text) {
        int rc = app_encode(a, op->text, op->text_len, q->param, &p->ids, &p->n_ids, e);
        if (rc) return rc;
        if (echo) {
            p->text = malloc(op->text_len + 1);
            if (!p->text) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
            memcpy(p->text, op->text, op->text_len);
            p->text[op->text_len] = 0;
            p->text_len = op->text_len;
        }
        return 0;
    }
    p->ids = malloc((size_t)op->n_ids * sizeof *p->ids);
    if (!p->ids) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    memcpy(p->ids, op->ids, (size_t)op->n_ids * sizeof *p->ids);
    p->n_ids = op->n_ids;
    if (echo) {
        char err[256];
        int rc = tok_decode(a->tok, p->ids, (size_t)p->n_ids, false, &p->text, &p->text_len, err,
                            sizeof err);
        if (rc) return oa_errorf(e, rc, "invalid_value", q->param, "%s", err);
    }
    return 0;
}

// Every prompt holds a token and leaves room for one; echoed prompts with
// logprobs get the entries the engine's prompt logprobs will fill.
static int check_prompts(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    for (int i = 0; i < j->n_prompts; i++) {
        struct job_prompt *p = &j->prompts[i];
        char pname[32];
        snprintf(pname, sizeof pname, q->chat || j->n_prompts == 1 ? "%s" : "%s[%d]", q->param, i);
        if (p->n_ids == 0)
            return oa_errorf(e, MS_EINVAL, "invalid_value", pname,
                             "the prompt is empty: it must hold at least one token");
        if (p->n_ids >= a->max_model_len)
            return oa_errorf(e, MS_ETOOLONG, "context_length_exceeded", pname,
                             "This model's maximum context length is %d tokens, and the prompt is "
                             "%d tokens, which leaves no room for a completion (--max-model-len)",
                             a->max_model_len, p->n_ids);
        if (j->echo && q->g->logprobs >= 0) {
            p->echo_tokens = calloc((size_t)p->n_ids, sizeof *p->echo_tokens);
            if (!p->echo_tokens)
                return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
            for (int k = 0; k < p->n_ids; k++) p->echo_tokens[k].id = p->ids[k];
        }
    }
    return 0;
}

static int make_prompts(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    j->n_prompts = q->chat ? 1 : q->pr.n_prompts;
    j->prompts = calloc((size_t)j->n_prompts, sizeof *j->prompts);
    if (!j->prompts) return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    int rc = 0;
    if (q->chat) rc = chat_prompt(a, q, &j->prompts[0], e);
    for (int i = 0; !q->chat && !rc && i < q->pr.n_prompts; i++)
        rc = completion_prompt(a, q, j->echo, &q->pr.prompts[i], &j->prompts[i], e);
    return rc ? rc : check_prompts(a, j, q, e);
}

// n choices for each prompt, the response's id and what every chunk repeats.
static int make_choices(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    const struct oa_gen_params *g = q->g;
    long total = (long)j->n_prompts * g->n;
    if (total > JOB_MAX_CHOICES)
        return oa_errorf(e, MS_EINVAL, "invalid_value", "n",
                         "%d prompts times n=%d makes %ld choices; at most %d per request",
                         j->n_prompts, g->n, total, JOB_MAX_CHOICES);
    if (job_add_choices(j, (int)total))
        return oa_errorf(e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    const char *prefix = q->chat ? "chatcmpl-" : "cmpl-";
    if (g->request_id) snprintf(j->id, sizeof j->id, "%s%s", prefix, g->request_id);
    else oa_make_id(j->id, sizeof j->id, prefix);
    j->meta.id = j->id;
    j->meta.created = ms_unix_time();
    j->meta.model = q->served;
    j->meta.tok = a->tok;
    j->meta.tokens_as_ids = g->return_tokens_as_token_ids;
    j->meta.logprobs = g->logprobs;
    j->stream = g->stream;
    j->include_usage = g->include_usage;
    j->continuous_usage = g->continuous_usage_stats;
    return 0;
}

static void fill_engine_request(struct app *a, const struct oa_gen_params *g,
                                const struct job_prompt *p, int choice_in_prompt,
                                bool want_prompt_lp, struct engine_request *er)
{
    engine_request_default(er);
    er->prompt = p->ids;
    er->n_prompt = p->n_ids;
    struct sampling_params *s = &er->sampling;
    *s = g->sampling;
    // n > 1: each choice draws its own stream under the one seed, all reproducible.
    s->stream = (uint32_t)choice_in_prompt;
    s->logprobs = g->logprobs;
    s->prompt_logprobs = want_prompt_lp ? g->logprobs : -1;
    struct engine_stop *st = &er->stop;
    int room = a->max_model_len - p->n_ids;
    int max = g->max_tokens;
    if (max == 0) {
        max = room;
        if (a->use_gen && a->model->cfg.gen.max_new_tokens > 0 &&
            a->model->cfg.gen.max_new_tokens < max)
            max = a->model->cfg.gen.max_new_tokens;
    }
    st->max_tokens = max;
    st->ignore_eos = g->ignore_eos;
    st->stop_ids = g->stop_token_ids;
    st->n_stop_ids = g->n_stop_token_ids;
    st->stop_strs = g->stop;
    st->n_stop_strs = g->n_stop;
    st->skip_special_tokens = g->skip_special_tokens;
}

// Submits every choice; the first refusal cancels those already submitted
// and names the parameter to blame.
static int submit_choices(struct app *a, struct job *j, const struct parsed *q, struct oa_error *e)
{
    const struct oa_gen_params *g = q->g;
    for (int i = 0; i < j->n_choices; i++) {
        int prompt = i / g->n;
        struct engine_request er;
        fill_engine_request(a, g, &j->prompts[prompt], i % g->n, j->echo && g->logprobs >= 0, &er);
        char err[512];
        int rc = job_submit(j, i, prompt, &er, err, sizeof err);
        if (rc) {
            const char *code = rc == MS_ETOOLONG ? "context_length_exceeded"
                               : rc == MS_EBUSY   ? "service_unavailable"
                                                  : "invalid_value";
            const char *p = rc == MS_ETOOLONG ? (g->max_tokens ? "max_tokens" : q->param)
                            : rc == MS_EBUSY  ? NULL
                                              : q->param;
            oa_errorf(e, rc, code, p, "%s", err);
            job_cancel_all(j);
            return rc;
        }
    }
    return 0;
}

static void handle_generate(struct app *a, struct http_request *r, bool chat)
{
    if (!app_serving(a, r)) return;
    struct job *j = job_create(a->engine, &a->last_delta_us, chat);
    if (!j) {
        http_respond_json(r, 500, NULL);
        return;
    }
    struct parsed q;
    memset(&q, 0, sizeof q);
    q.chat = chat;
    q.param = chat ? "messages" : "prompt";
    struct oa_error e;
    int rc = parse(a, r, j, &q, &e);
    if (!rc) rc = make_prompts(a, j, &q, &e);
    if (!rc) rc = make_choices(a, j, &q, &e);
    if (!rc) rc = submit_choices(a, j, &q, &e);
    if (!rc && job_respond(j, r)) rc = oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (chat) oa_chat_request_release(&q.cr);
    if (rc) app_respond_error(r, &e);
    job_unref(j);
}

void routes_generate_chat(void *app, struct http_request *r)
{
    handle_generate(app, r, true);
}

void routes_generate_completions(void *app, struct http_request *r)
{
    handle_generate(app, r, false);
}
