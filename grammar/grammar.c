// grammar: compile entry point — one table row per grammar_kind, the
// literal prefix and suffix around any of them, and the choice compiler
// (small enough to live here).
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"

static int json_object_build(struct gbuild *b, const char *text, size_t len, int *root)
{
    (void)text;
    (void)len;
    return grammar_schema_build(b, NULL, 0, true, root);
}

static int json_schema_build(struct gbuild *b, const char *text, size_t len, int *root)
{
    return grammar_schema_build(b, text, len, false, root);
}

static const struct {
    const char *name;
    int (*build)(struct gbuild *b, const char *text, size_t len, int *root);
} kinds[GRAMMAR_KIND_COUNT] = {
    [GRAMMAR_JSON_SCHEMA] = {"json_schema", json_schema_build},
    [GRAMMAR_JSON_OBJECT] = {"json_object", json_object_build},
    [GRAMMAR_REGEX] = {"regex", grammar_regex_build},
    [GRAMMAR_CHOICE] = {"choice", grammar_choice_build},
    [GRAMMAR_GBNF] = {"grammar", grammar_gbnf_build},
};

int grammar_choice_build(struct gbuild *b, const char *text, size_t len, int *root)
{
    json_error_t je;
    json_t *arr = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    if (!arr) return gb_fail(b, MS_EFORMAT, "choice: not JSON (%s at line %d)", je.text, je.line);
    int rc = 0;
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        rc = gb_fail(b, MS_EINVAL, "choice: expected a non-empty array of strings");
        goto out;
    }
    struct gx_list alts = {0};
    size_t i;
    json_t *s;
    json_array_foreach(arr, i, s) {
        if (!json_is_string(s) || json_string_length(s) == 0) {
            rc = gb_fail(b, MS_EINVAL, "choice: item %zu is not a non-empty string", i);
            goto out;
        }
        gb_note_literal(b, (const uint8_t *)json_string_value(s), json_string_length(s));
        gx_list_push(b, &alts, gx_lit(b, json_string_value(s), json_string_length(s)));
    }
    *root = gb_rule_new(b, "root");
    gb_rule_set(b, *root, gx_altv(b, alts.kids, alts.n));
    rc = b->status;
out:
    json_decref(arr);
    return rc;
}

// Where the output starts, every rule a start can reach through calls is
// opened at once: a chain of rules each starting with the next (r0 ::= r1
// ..., r1 ::= r2 ...) deeper than the matcher's stack can never start. Found
// here, once per compiled text, the refusal names the grammar; found by the
// first request's matcher, it read as a request that did not fit.
static int try_start(const struct grammar_source *src, struct grammar **g, char *err, size_t errlen)
{
    struct grammar_matcher *m;
    char why[256];
    const int rc = grammar_matcher_create(*g, &m, why, sizeof why);
    if (!rc) {
        grammar_matcher_destroy(m);
        return 0;
    }
    grammar_unref(*g);
    *g = NULL;
    if (rc == MS_ENOFIT)
        return ms_err(err, errlen, rc, "%s: where the output starts, its rules call each other more "
                      "than %d deep or open more than %d parses at once; nest the rules less",
                      kinds[src->kind].name, GRAMMAR_MAX_STACK_DEPTH, GRAMMAR_MAX_TOPS);
    return ms_err(err, errlen, rc, "%s: %s", kinds[src->kind].name, why);
}

int grammar_compile(const struct grammar_vocab *v, const struct grammar_source *src, struct grammar **out,
                    char *err, size_t errlen)
{
    *out = NULL;
    if (!v || !src || (unsigned)src->kind >= GRAMMAR_KIND_COUNT)
        return ms_err(err, errlen, MS_EINVAL, "grammar: unknown kind");
    if ((!src->text && src->len) || (!src->prefix && src->prefix_len) || (!src->suffix && src->suffix_len))
        return ms_err(err, errlen, MS_EINVAL, "grammar: a length without its text");
    if (src->len > GRAMMAR_MAX_TEXT || src->prefix_len > GRAMMAR_MAX_TEXT || src->suffix_len > GRAMMAR_MAX_TEXT)
        return ms_err(err, errlen, MS_ENOFIT, "%s: the text is longer than %u bytes", kinds[src->kind].name,
                      GRAMMAR_MAX_TEXT);
    struct gbuild b;
    if (gb_init(&b)) return ms_err(err, errlen, MS_ENOMEM, "out of memory compiling a grammar");
    int root = -1;
    b.json_compact = src->json_compact;
    int rc = kinds[src->kind].build(&b, src->text ? src->text : "", src->len, &root);
    if (!rc && (src->prefix_len || src->suffix_len)) {
        gb_note_literal(&b, (const uint8_t *)src->prefix, src->prefix_len);
        gb_note_literal(&b, (const uint8_t *)src->suffix, src->suffix_len);
        int wrapped = gb_rule_new(&b, "wrapped");
        gb_rule_set(&b, wrapped,
                    gx_seq3(&b, gx_lit(&b, src->prefix, src->prefix_len), gx_call(&b, root),
                            gx_lit(&b, src->suffix, src->suffix_len)));
        root = wrapped;
        rc = b.status;
    }
    if (rc || b.status) {
        rc = ms_err(err, errlen, b.status ? b.status : rc, "%s: %s", kinds[src->kind].name,
                    b.err[0] ? b.err : "cannot compile");
    } else {
        rc = grammar_build(&b, root, v, out, err, errlen);
    }
    gb_free(&b);
    if (!rc) rc = try_start(src, out, err, errlen);
    return rc;
}
