// routes_responses: the Responses API's front for routes_generate (see
// routes_responses.h).
#include "server/routes_responses.h"

#include "api/responses.h"
#include "server/routes_generate.h"

static const struct generate_front responses_front = {
    .param = "input",
    .id_prefix = "resp_",
    .call_id_prefix = "call_",
    .max_param = "max_output_tokens",
    .parse = rs_parse,
    .stream_create = rs_stream_create,
    .ops = &rs_stream_ops,
};

void routes_responses_create(void *app, struct http_request *r)
{
    routes_generate_front(app, r, &responses_front);
}
