// routes_anthropic: the Messages API's front for routes_generate, and
// count_tokens (see routes_anthropic.h).
#include "server/routes_anthropic.h"

#include <stdlib.h>

#include "api/anthropic.h"
#include "base/arena.h"
#include "base/base.h"
#include "server/app_state.h"
#include "server/routes_generate.h"

static const struct generate_front messages_front = {
    .param = "messages",
    .id_prefix = "msg_",
    .call_id_prefix = "toolu_",
    .max_param = "max_tokens",
    .max_within_context = true,
    .parse = an_parse,
    .stream_create = an_stream_create,
    .ops = &an_stream_ops,
};

void routes_anthropic_messages(void *app, struct http_request *r)
{
    routes_generate_front(app, r, &messages_front);
}

// The prompt the same body would run with, rendered and tokenized:
// {"input_tokens": N}.
void routes_anthropic_count_tokens(void *app, struct http_request *r)
{
    struct app *a = app;
    if (!app_serving(a, r)) return;
    size_t len;
    const char *body = http_body(r, &len);
    struct arena *ar = arena_create(4096);
    struct oa_chat_request cr = {0};
    struct oa_error e;
    int32_t *ids = NULL;
    int n_ids = 0;
    int rc = ar ? an_parse_count_tokens(body, len, &a->limits, ar, &cr, &e)
                : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
    if (!rc && !app_served_name(a, cr.model, &e)) rc = e.status;
    if (!rc) {
        char *text = NULL;
        size_t tl = 0;
        json_t *kw = app_chat_kwargs(a, cr.chat_template_kwargs, cr.thinking);
        rc = kw ? app_render_chat(a, cr.messages, cr.tools, cr.add_generation_prompt,
                                  cr.continue_final_message, kw, &text, &tl, &e)
                : oa_errorf(&e, MS_ENOMEM, "internal_error", NULL, "out of memory");
        json_decref(kw);
        if (!rc) rc = app_encode(a, text, tl, "messages", 0, &ids, &n_ids, &e); // a rendered chat
        free(text);
    }
    if (rc) {
        app_respond_error(r, &e);
    } else {
        http_set_log_tokens(r, n_ids, 0);
        http_respond_json(r, 200, json_pack("{s:i}", "input_tokens", n_ids));
    }
    free(ids);
    oa_chat_request_release(&cr);
    arena_destroy(ar);
}
