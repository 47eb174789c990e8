// jinja_lines: test helper that renders {"template": ..., "vars": {...}} JSON lines
// from stdin with the Jinja interpreter and prints one JSON string (or
// {"error": message}) per line, the format of the reference renderers.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/jinja.h"

static void print_json(json_t *v)
{
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    printf("%s\n", s ? s : "{\"error\":\"output is not UTF-8\"}");
    free(s);
    json_decref(v);
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        if (n <= 1) continue;
        char err[1024] = "";
        json_error_t je;
        json_t *req = json_loadb(line, (size_t)n, 0, &je);
        const char *src = json_string_value(json_object_get(req, "template"));
        if (!src) {
            print_json(json_pack("{s:s}", "error", "bad test line"));
            json_decref(req);
            continue;
        }
        struct jinja_template *t;
        int rc = jinja_parse(src, json_string_length(json_object_get(req, "template")), &t, err, sizeof err);
        if (!rc) {
            json_t *vars = json_object_get(req, "vars");
            size_t nv = json_object_size(vars), i = 0;
            struct jinja_var *v = calloc(nv + 1, sizeof *v);
            const char *k;
            json_t *val;
            json_object_foreach(vars, k, val) v[i++] = (struct jinja_var){k, val};
            char *out;
            size_t len;
            rc = jinja_render(t, v, i, NULL, &out, &len, err, sizeof err);
            if (!rc) {
                print_json(json_stringn(out, len));
                free(out);
            }
            free(v);
            jinja_destroy(t);
        }
        if (rc) print_json(json_pack("{s:s}", "error", err));
        json_decref(req);
        fflush(stdout);
    }
    free(line);
    return 0;
}
