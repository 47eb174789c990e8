// chat_template: apply_chat_template on top of the Jinja interpreter — the
// variables transformers passes (messages, tools, documents, add_generation_prompt,
// the special tokens, then the caller's keyword arguments).
#include "api/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "api/jinja.h"
#include "base/base.h"

struct chat_template {
    struct jinja_template *jt;
};

int chat_template_parse(const char *source, size_t len, struct chat_template **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    struct chat_template *t = calloc(1, sizeof *t);
    if (!t) return ms_err(err, errlen, MS_ENOMEM, "out of memory parsing the chat template");
    char e[512];
    int rc = jinja_parse(source, len, &t->jt, e, sizeof e);
    if (rc) {
        free(t);
        return ms_err(err, errlen, rc, "chat template: %s", e);
    }
    *out = t;
    return 0;
}

void chat_template_destroy(struct chat_template *t)
{
    if (!t) return;
    jinja_destroy(t->jt);
    free(t);
}

static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt"};

int chat_template_render(const struct chat_template *t, const struct chat_template_args *a,
                         char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (!a->messages || !json_is_array(a->messages))
        return ms_err(err, errlen, MS_EINVAL, "chat template: messages must be an array");
    if (a->tools && !json_is_array(a->tools) && !json_is_null(a->tools))
        return ms_err(err, errlen, MS_EINVAL, "chat template: tools must be an array or null");
    if (a->kwargs && !json_is_object(a->kwargs))
        return ms_err(err, errlen, MS_EINVAL, "chat template: kwargs must be an object");
    size_t nkw = a->kwargs ? json_object_size(a->kwargs) : 0;
    size_t cap = 6 + nkw, n = 0;
    struct jinja_var *vars = calloc(cap, sizeof *vars);
    if (!vars) return ms_err(err, errlen, MS_ENOMEM, "out of memory rendering the chat template");
    json_t *bos = a->bos_token ? json_string(a->bos_token) : NULL;
    json_t *eos = a->eos_token ? json_string(a->eos_token) : NULL;
    int rc = 0;
    if ((a->bos_token && !bos) || (a->eos_token && !eos)) {
        rc = ms_err(err, errlen, MS_EINVAL, "chat template: bos_token/eos_token must be UTF-8");
        goto done;
    }
    // transformers renders messages=..., tools=None unless given, documents=None.
    vars[n++] = (struct jinja_var){"messages", a->messages};
    vars[n++] = (struct jinja_var){"tools", a->tools ? a->tools : json_null()};
    vars[n++] = (struct jinja_var){"documents", json_null()};
    vars[n++] = (struct jinja_var){"add_generation_prompt",
                                   a->add_generation_prompt ? json_true() : json_false()};
    // Special tokens that are None are not passed at all (undefined in the template).
    if (bos) vars[n++] = (struct jinja_var){"bos_token", bos};
    if (eos) vars[n++] = (struct jinja_var){"eos_token", eos};
    if (a->kwargs) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)a->kwargs, key, val) {
            for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
                if (!strcmp(key, reserved[i])) {
                    rc = ms_err(err, errlen, MS_EINVAL,
                                "chat template: kwargs may not set '%s' (it is its own argument)", key);
                    goto done;
                }
            vars[n++] = (struct jinja_var){key, val};
        }
    }
    rc = jinja_render(t->jt, vars, n, NULL, out, len, err, errlen);
done:
    json_decref(bos);
    json_decref(eos);
    free(vars);
    return rc;
}
