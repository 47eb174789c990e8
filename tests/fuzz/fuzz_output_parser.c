// fuzz_output_parser: feeds api/output_parser a text whole and cut into
// deltas and checks that both runs agree and every event is well formed.
// The unit tests call it on chosen texts and cuts; built with libFuzzer it
// explores the rest: tests/fuzz/run.sh SECONDS fuzz_output_parser.
#include "tests/fuzz/fuzz_output_parser.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

// What the events of one run add up to.
struct tcall {
    char id[OUTPUT_PARSER_MAX_ID];
    char *name, *args;
    size_t name_len, args_len;
};
struct transcript {
    char *text[2]; // content, reasoning
    size_t len[2];
    struct tcall *calls;
    int n_calls;
};

static void transcript_free(struct transcript *t)
{
    free(t->text[0]);
    free(t->text[1]);
    for (int i = 0; i < t->n_calls; i++) {
        free(t->calls[i].name);
        free(t->calls[i].args);
    }
    free(t->calls);
    memset(t, 0, sizeof *t);
}

static int failf(char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && whylen) vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return 1;
}

static bool append(char **buf, size_t *len, const char *s, size_t n)
{
    char *b = realloc(*buf, *len + n + 1);
    if (!b) return false;
    memcpy(b + *len, s, n);
    *len += n;
    b[*len] = 0;
    *buf = b;
    return true;
}

static int take_events(struct transcript *t, const struct output_event *ev, size_t n_ev, char *why,
                       size_t whylen)
{
    json_t *delta = json_object();
    int rc = output_events_delta_fill(delta, ev, n_ev, true);
    json_decref(delta);
    if (rc) return failf(why, whylen, "the delta JSON of a batch failed (%d)", rc);
    for (size_t i = 0; i < n_ev; i++) {
        const struct output_event *e = &ev[i];
        if (utf8_valid_prefix((const uint8_t *)e->text, e->len) != e->len)
            return failf(why, whylen, "event %zu (kind %d) is not valid UTF-8", i, e->kind);
        switch (e->kind) {
        case OUTPUT_EVENT_CONTENT:
        case OUTPUT_EVENT_REASONING: {
            int k = e->kind == OUTPUT_EVENT_REASONING;
            if (!e->len || e->index != -1 || e->id)
                return failf(why, whylen, "text event %zu: len %zu index %d", i, e->len, e->index);
            if (!append(&t->text[k], &t->len[k], e->text, e->len)) return failf(why, whylen, "oom");
            break;
        }
        case OUTPUT_EVENT_TOOL_BEGIN: {
            if (e->index != t->n_calls || !e->id || !e->len)
                return failf(why, whylen, "call begins with index %d after %d calls", e->index,
                             t->n_calls);
            struct tcall *c = realloc(t->calls, (size_t)(t->n_calls + 1) * sizeof *c);
            if (!c) return failf(why, whylen, "oom");
            t->calls = c;
            c = &t->calls[t->n_calls++];
            memset(c, 0, sizeof *c);
            snprintf(c->id, sizeof c->id, "%s", e->id);
            if (!append(&c->name, &c->name_len, e->text, e->len) || !append(&c->args, &c->args_len, "", 0))
                return failf(why, whylen, "oom");
            break;
        }
        case OUTPUT_EVENT_TOOL_ARGS:
            if (e->index < 0 || e->index >= t->n_calls || e->id)
                return failf(why, whylen, "arguments for call %d of %d", e->index, t->n_calls);
            if (!append(&t->calls[e->index].args, &t->calls[e->index].args_len, e->text, e->len))
                return failf(why, whylen, "oom");
            break;
        default:
            return failf(why, whylen, "unknown event kind %d", e->kind);
        }
    }
    return 0;
}

static bool same(const char *a, size_t an, const char *b, size_t bn)
{
    return an == bn && (!an || !memcmp(a, b, an));
}

// The events must add up to what the parser says it kept.
static int check_totals(const struct output_parser *p, const struct transcript *t, char *why,
                        size_t whylen)
{
    size_t len;
    const char *s = output_parser_content(p, &len);
    if (!same(s, len, t->text[0] ? t->text[0] : "", t->len[0]))
        return failf(why, whylen, "content events differ from the parser's content");
    s = output_parser_reasoning(p, &len);
    if (!same(s, len, t->text[1] ? t->text[1] : "", t->len[1]))
        return failf(why, whylen, "reasoning events differ from the parser's reasoning");
    if (output_parser_n_calls(p) != t->n_calls)
        return failf(why, whylen, "%d calls begun, the parser kept %d", t->n_calls,
                     output_parser_n_calls(p));
    for (int i = 0; i < t->n_calls; i++) {
        struct output_call c;
        if (output_parser_call(p, i, &c) || strcmp(c.id, t->calls[i].id) ||
            !same(c.name, c.name_len, t->calls[i].name, t->calls[i].name_len) ||
            !same(c.arguments, c.arguments_len, t->calls[i].args, t->calls[i].args_len))
            return failf(why, whylen, "call %d's events differ from the kept call", i);
    }
    if (output_parser_held(p) || output_parser_in_call(p))
        return failf(why, whylen, "%zu bytes held after finish", output_parser_held(p));
    json_t *m = json_object();
    int rc = output_parser_message_fill(p, m, true);
    json_decref(m);
    if (rc) return failf(why, whylen, "the message JSON failed (%d)", rc);
    return 0;
}

// One run: text fed in the pieces cuts make (none: whole), then finish.
static int run(const struct output_parser_opts *o, const char *text, size_t n, const size_t *cuts,
               size_t n_cuts, struct transcript *t, char *why, size_t whylen)
{
    struct output_parser *p;
    char err[256];
    if (output_parser_create(o, &p, err, sizeof err)) return failf(why, whylen, "%s", err);
    const struct output_event *ev;
    size_t n_ev, at = 0;
    int bad = 0;
    for (size_t i = 0; i <= n_cuts && !bad; i++) {
        size_t to = i < n_cuts ? cuts[i] : n;
        if (to < at || to > n) {
            bad = failf(why, whylen, "cut %zu out of order", to);
            break;
        }
        if (output_parser_feed(p, text + at, to - at, &ev, &n_ev, err, sizeof err))
            bad = failf(why, whylen, "feed: %s", err);
        else
            bad = take_events(t, ev, n_ev, why, whylen);
        at = to;
    }
    if (!bad && output_parser_finish(p, &ev, &n_ev, err, sizeof err))
        bad = failf(why, whylen, "finish: %s", err);
    if (!bad) bad = take_events(t, ev, n_ev, why, whylen);
    if (!bad) bad = check_totals(p, t, why, whylen);
    output_parser_destroy(p);
    return bad;
}

int output_parser_check_split(const struct output_parser_opts *o, const char *text, size_t n,
                              const size_t *cuts, size_t n_cuts, char *why, size_t whylen)
{
    struct transcript whole = {0}, split = {0};
    int bad = run(o, text, n, NULL, 0, &whole, why, whylen);
    if (!bad) bad = run(o, text, n, cuts, n_cuts, &split, why, whylen);
    for (int k = 0; k < 2 && !bad; k++) {
        if (!same(whole.text[k], whole.len[k], split.text[k], split.len[k]))
            bad = failf(why, whylen, "split %s '%.*s' != whole '%.*s'", k ? "reasoning" : "content",
                        (int)split.len[k], split.text[k] ? split.text[k] : "", (int)whole.len[k],
                        whole.text[k] ? whole.text[k] : "");
    }
    if (!bad && whole.n_calls != split.n_calls)
        bad = failf(why, whylen, "split kept %d calls, whole %d", split.n_calls, whole.n_calls);
    for (int i = 0; !bad && i < whole.n_calls; i++) {
        const struct tcall *a = &whole.calls[i], *b = &split.calls[i];
        if (strcmp(a->id, b->id) || !same(a->name, a->name_len, b->name, b->name_len) ||
            !same(a->args, a->args_len, b->args, b->args_len))
            bad = failf(why, whylen, "call %d: split %s '%s' '%s' != whole %s '%s' '%s'", i, b->id,
                        b->name, b->args, a->id, a->name, a->args);
    }
    transcript_free(&whole);
    transcript_free(&split);
    return bad;
}

int fuzz_output_parser(const uint8_t *data, size_t n)
{
    if (n < 2) return 0;
    static const size_t max_call[4] = {0, 8, 32, 100};
    // Tools for Qwen3-Coder's XML calls: a parameter of each type it converts.
    static json_t *tools;
    if (!tools)
        tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"properties\": "
                           "{\"s\": {\"type\": \"string\"}, \"i\": {\"type\": \"integer\"}, \"n\": {\"type\": \"number\"}, "
                           "\"b\": {\"type\": \"boolean\"}, \"o\": {\"type\": \"object\"}, \"a\": {\"type\": [\"array\"]}}}}}]",
                           0, NULL);
    struct output_parser_opts o = {
        .reasoning = data[0] & 1,
        .start_in_reasoning = data[0] & 2,
        .tools = data[0] & 4,
        .max_call_bytes = max_call[(data[0] >> 3) & 3],
        .max_calls = (data[0] >> 5) & 1,
        .tool_format = data[0] & 64 ? OUTPUT_TOOLS_QWEN3_XML : OUTPUT_TOOLS_HERMES,
        .tool_defs = tools,
    };
    const char *text = (const char *)data + 2;
    size_t len = n - 2;
    size_t *cuts = malloc((len + 1) * sizeof *cuts), n_cuts = 0;
    if (!cuts) return 0;
    // data[1] == 0: byte by byte; else pieces of 1..8 bytes from a generator it seeds
    uint32_t x = data[1] * 2654435761u + 1;
    for (size_t at = 0; at < len;) {
        size_t step = 1;
        if (data[1]) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            step = 1 + (x >> 29);
        }
        at = at + step < len ? at + step : len;
        cuts[n_cuts++] = at;
    }
    char why[512];
    int bad = output_parser_check_split(&o, text, len, cuts, n_cuts, why, sizeof why);
    if (bad) fprintf(stderr, "fuzz_output_parser: %s\n", why);
    free(cuts);
    return bad;
}

#ifdef MOESERVE_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (fuzz_output_parser(data, n)) abort();
    return 0;
}
#endif
