// text_trim: see text_trim.h.
#include "api/text_trim.h"

#include "base/base.h"

static bool ws_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int text_trim_feed(struct text_trim *t, const char *s, size_t n, const struct text_trim_ops *ops, void *ctx)
{
    size_t end = n;
    while (end > 0 && ws_byte(s[end - 1])) end--;
    if (end == 0) // whitespace only: held inside an open block (or a kept lead), dropped before one
        return (t->open || t->keep_lead) && ms_buf_append(&t->held, s, n) ? MS_ENOMEM : 0;
    int rc;
    if (!t->open) {
        size_t lead = 0;
        while (!t->keep_lead && ws_byte(s[lead])) lead++;
        s += lead, end -= lead, n -= lead;
        if ((rc = ops->open(ctx))) return rc;
        t->open = true;
        t->keep_lead = false;
    }
    if (t->held.len) {
        if ((rc = ops->send(ctx, t->held.data, t->held.len))) return rc;
        t->held.len = 0;
    }
    if ((rc = ops->send(ctx, s, end))) return rc;
    return end < n && ms_buf_append(&t->held, s + end, n - end) ? MS_ENOMEM : 0;
}

void text_trim_end(struct text_trim *t)
{
    if (t->open || t->held.len) t->keep_lead = false; // a run ended: the first one was it
    t->open = false;
    t->held.len = 0;
}

void text_trim_free(struct text_trim *t)
{
    ms_buf_free(&t->held);
    t->open = false;
}
