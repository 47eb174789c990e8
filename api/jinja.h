// jinja: a Jinja2 interpreter for model chat templates. It follows Python
// Jinja2 as transformers configures it (ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loop controls; tojson as json.dumps with
// ensure_ascii=False; raise_exception and strftime_now globals).
// A parsed template is immutable: any number of threads may render it at once.
#ifndef MOESERVE_API_JINJA_H
#define MOESERVE_API_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct jinja_template;

// What one render may use, so that no template or input can hang or exhaust
// the server. A render that crosses a limit fails with MS_EINVAL and says which.
struct jinja_limits {
    size_t max_output_bytes; // the rendered text
    size_t max_memory_bytes; // everything the render allocates (its arena)
    uint64_t max_steps;      // loop iterations + macro calls + items filters walk
    int max_call_depth;      // nested macro / caller() calls
};

void jinja_limits_default(struct jinja_limits *lim);

// Parses template source (UTF-8). Errors name the line and what was expected.
int jinja_parse(const char *src, size_t len, struct jinja_template **out, char *err,
                size_t errlen);
void jinja_destroy(struct jinja_template *t);

// A top-level variable. value NULL means the variable is not defined at all
// (Jinja's Undefined); json null is none. Later entries replace earlier ones.
struct jinja_var {
    const char *name;
    const json_t *value;
};

// Renders into *out (malloc'd, NUL-terminated, *len bytes without the NUL).
// raise_exception(msg) fails with MS_EINVAL and exactly msg in err; other
// runtime errors fail with MS_EINVAL and "line N: what went wrong".
// lim NULL means jinja_limits_default().
int jinja_render(const struct jinja_template *t, const struct jinja_var *vars, size_t nvars,
                 const struct jinja_limits *lim, char **out, size_t *len, char *err,
                 size_t errlen);

#endif
