// sse: text/event-stream line assembly and event dispatch, bounded.
#include "bench/sse.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct sse_parser {
    size_t max;
    sse_on_data cb;
    void *ctx;
    char *line;       // the line being assembled
    size_t line_len, line_cap;
    char *data;       // the event's data so far
    size_t data_len, data_cap;
    bool has_data;    // a data field was seen (even an empty one)
    bool last_cr;     // the previous byte ended a line with \r: skip a following \n
};

struct sse_parser *sse_create(size_t max_event_bytes, sse_on_data cb, void *ctx)
{
    struct sse_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->max = max_event_bytes ? max_event_bytes : 1;
    p->cb = cb;
    p->ctx = ctx;
    return p;
}

void sse_destroy(struct sse_parser *p)
{
    if (!p) return;
    free(p->line);
    free(p->data);
    free(p);
}

// Appends n bytes to a growable buffer that never exceeds max (+1 for NUL).
static int append(char **buf, size_t *len, size_t *cap, size_t max, const char *s, size_t n)
{
    size_t need;
    if (ms_add_overflow(*len, n, &need) || need > max) return MS_EFORMAT;
    if (need + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < need + 1) c = c > max / 2 ? max + 1 : c * 2;
        char *b = realloc(*buf, c);
        if (!b) return MS_ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len = need;
    (*buf)[need] = 0;
    return 0;
}

static int dispatch(struct sse_parser *p)
{
    if (!p->has_data) return 0;
    int rc = 0;
    if (!p->data) rc = append(&p->data, &p->data_len, &p->data_cap, p->max, "", 0);
    if (!rc) rc = p->cb(p->ctx, p->data, p->data_len);
    p->data_len = 0;
    if (p->data) p->data[0] = 0;
    p->has_data = false;
    return rc;
}

static int end_line(struct sse_parser *p)
{
    const char *l = p->line ? p->line : "";
    size_t n = p->line_len;
    p->line_len = 0;
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
    if (p->has_data) rc = append(&p->data, &p->data_len, &p->data_cap, p->max, "\n", 1);
    if (!rc) rc = append(&p->data, &p->data_len, &p->data_cap, p->max, v, vn);
    p->has_data = true;
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
            int rc = append(&p->line, &p->line_len, &p->line_cap, p->max, buf + i, j - i);
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
    if (p->line_len) rc = end_line(p);
    if (!rc) rc = dispatch(p);
    return rc;
}
