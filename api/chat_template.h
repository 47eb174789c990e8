// chat_template: renders a model's Jinja2 chat_template the way transformers'
// apply_chat_template does. Parsed once per model; rendering is thread-safe.
#ifndef MOESERVE_API_CHAT_TEMPLATE_H
#define MOESERVE_API_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct chat_template;

// Parse errors name the template line and what was expected.
int chat_template_parse(const char *source, size_t len, struct chat_template **out,
                        char *err, size_t errlen);
void chat_template_destroy(struct chat_template *t);

struct chat_template_args {
    const json_t *messages;      // array of message objects (role, content, tool_calls, ...)
    const json_t *tools;         // array or NULL
    bool add_generation_prompt;
    const json_t *kwargs;        // object of extra variables (enable_thinking, ...) or NULL
    const char *bos_token;       // or NULL
    const char *eos_token;       // or NULL
};

// *out is malloc'd and NUL-terminated. raise_exception() and runtime errors
// return MS_EINVAL with the template's message in err.
int chat_template_render(const struct chat_template *t, const struct chat_template_args *a,
                         char **out, size_t *len, char *err, size_t errlen);

#endif
