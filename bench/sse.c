// sse: text/event-stream line assembly and event dispatch, bounded.
#include "bench/sse.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/buf.h"

struct sse_parser {
    sse_on_data cb;
    void *ctx;
    struct ms_buf line; // the line being assembled (capped at max_event_bytes)
    struct ms_buf data; // the event's data so far (capped likewise)
    bool has_data;      // a data field was seen (even an empty one)
    bool last_cr;       // the previous byte ended a line with \r: skip a following \n
};

struct sse_parser *sse_create(size_t max_event_bytes, sse_on_data cb, void *ctx)
{
    struct sse_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    size_t max = max_event_bytes ? max_event_bytes : 1;
    p->line.max = max;
    p->data.max = max;
    p->cb = cb;
    p->ctx = ctx;
    return p;
}

void sse_destroy(struct sse_parser *p)
{
    if (!p) return;
    ms_buf_free(&p->line);
    ms_buf_free(&p->data);
    free(p);
}

// Appends to a capped buffer; past the cap the stream is malformed.
static int append(struct ms_buf *b, const char *s, size_t n)
{
    int rc = ms_buf_append(b, s, n);
    return rc == MS_ETOOLONG ? MS_EFORMAT : rc;
}

static int dispatch(struct sse_parser *p)
{
    if (!p->has_data) return 0;
    int rc = append(&p->data, "", 0); // the callback gets a string even for empty data
    if (!rc) rc = p->cb(p->ctx, p->data.data, p->data.len);
    ms_buf_reset(&p->data);
    p->has_data = false;
    return rc;
}

static int field_line(struct sse_parser *p, const char *l, size_t n)
{
    if (n == 0) return dispatch(p);
    if (l[0] == ':') return 0; // comment (keep-alive pings)
    const char *colon = memchr(l, ':', n);
    size_t name_len = colon ? (size_t)(colon - l) : n;
    if (name_len != 4 || memcmp(l, "data", 4)) return 0; // event, id, retry: not needed here
    const char *v = colon ? colon + 1 : l + n;
    size_t vn = (size_t)(l + n - v);
    if (vn && *v == ' ') {
        v++;
        vn--;
    }
    int rc = 0;
    if (p->has_data) rc = append(&p->data, "\n", 1);
    if (!rc) rc = append(&p->data, v, vn);
    p->has_data = true;
    return rc;
}

static int end_line(struct sse_parser *p)
{
    int rc = field_line(p, p->line.data ? p->line.data : "", p->line.len);
    ms_buf_reset(&p->line);
    return rc;
}

int sse_feed(struct sse_parser *p, const char *buf, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (p->last_cr) {
            p->last_cr = false;
            if (buf[i] == '\n') {
                i++;
                continue;
            }
        }
        // Take the run up to the next line end in one append.
        size_t j = i;
        while (j < n && buf[j] != '\n' && buf[j] != '\r') j++;
        if (j > i) {
            int rc = append(&p->line, buf + i, j - i);
            if (rc) return rc;
        }
        if (j == n) break;
        p->last_cr = buf[j] == '\r';
        i = j + 1;
        int rc = end_line(p);
        if (rc) return rc;
    }
    return 0;
}

int sse_finish(struct sse_parser *p)
{
    int rc = 0;
    if (p->line.len) rc = end_line(p);
    if (!rc) rc = dispatch(p);
    return rc;
}
