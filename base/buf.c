// buf: growth, the cap and the allocator hook of the shared byte buffer (see buf.h).
#include "base/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

// The first allocation: small buffers (an SSE line, a rendered filter
// argument) fit without a second growth.
#define BUF_FIRST_CAP 256

// Grows the allocation to hold need bytes (NUL included), doubling.
static int buf_grow(struct ms_buf *b, size_t need)
{
    size_t cap = b->cap ? b->cap : BUF_FIRST_CAP;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    // The cap bounds the allocation too: max bytes and the NUL.
    if (b->max && b->max < SIZE_MAX && cap > b->max + 1) cap = b->max + 1;
    if (cap < need) cap = need;
    char *p = b->alloc ? b->alloc->grow(b->alloc->ctx, b->data, b->len, cap)
                       : realloc(b->data, cap);
    if (!p) return MS_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int ms_buf_reserve(struct ms_buf *b, size_t n)
{
    size_t len, need;
    if (ms_add_overflow(b->len, n, &len) || (b->max && len > b->max) ||
        ms_add_overflow(len, 1, &need))
        return MS_ETOOLONG;
    if (need <= b->cap) return 0;
    return buf_grow(b, need);
}

int ms_buf_append(struct ms_buf *b, const void *p, size_t n)
{
    int rc = ms_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int ms_buf_append_vfmt(struct ms_buf *b, const char *fmt, va_list ap)
{
    // Format into the room there is; when the text is longer, grow to its
    // length and format again.
    va_list again;
    va_copy(again, ap);
    size_t room = b->data ? b->cap - b->len : 0;
    int k = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
    int rc = 0;
    if (k < 0) rc = MS_EINVAL;
    else if ((size_t)k >= room) rc = ms_buf_reserve(b, (size_t)k);
    else if (b->max && (size_t)k > b->max - b->len) rc = MS_ETOOLONG;
    if (!rc && (size_t)k >= room) vsnprintf(b->data + b->len, (size_t)k + 1, fmt, again);
    va_end(again);
    if (rc) {
        if (b->data) b->data[b->len] = 0; // undo what the first try wrote
        return rc;
    }
    b->len += (size_t)k;
    return 0;
}

int ms_buf_append_fmt(struct ms_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = ms_buf_append_vfmt(b, fmt, ap);
    va_end(ap);
    return rc;
}

void ms_buf_drop_front(struct ms_buf *b, size_t n)
{
    if (!b->data) return;
    if (n > b->len) n = b->len;
    memmove(b->data, b->data + n, b->len - n + 1);
    b->len -= n;
}

void ms_buf_reset(struct ms_buf *b)
{
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

char *ms_buf_steal(struct ms_buf *b, size_t *len)
{
    if (!b->data && ms_buf_append(b, "", 0)) return NULL;
    char *p = b->data;
    if (len) *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

void ms_buf_free(struct ms_buf *b)
{
    if (b->data) {
        if (!b->alloc) free(b->data);
        else if (b->alloc->release) b->alloc->release(b->alloc->ctx, b->data);
    }
    b->data = NULL;
    b->len = b->cap = 0;
}
