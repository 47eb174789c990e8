// buf: the one growable byte buffer — appends with overflow-checked growth,
// an optional cap on the length, and memory from the C heap or from an
// allocator the owner supplies (the Jinja renderer's arena).
#ifndef MOESERVE_BASE_BUF_H
#define MOESERVE_BASE_BUF_H

#include <stdarg.h>
#include <stddef.h>

// Where a buffer's bytes live when not on the C heap. grow returns a block of
// new_cap bytes whose first len bytes are those of old (old is NULL the first
// time), or NULL, leaving old as it was; release gives a block back (NULL:
// nothing to do, as for an arena that frees everything at once). The
// allocator must outlive every buffer that points to it.
struct ms_buf_alloc {
    void *(*grow)(void *ctx, void *old, size_t len, size_t new_cap);
    void (*release)(void *ctx, void *p);
    void *ctx;
};

// A zeroed struct ms_buf is an empty, uncapped heap buffer. After every
// successful append data is non-NULL and data[len] is a NUL (not counted in
// len), so data is a C string whenever the bytes hold no NUL of their own.
// One owner; no locking: a buffer shared by threads needs the owner's lock.
struct ms_buf {
    char *data;   // NULL until the first append
    size_t len;   // bytes held
    size_t cap;   // bytes allocated at data (len + 1 at least, once allocated)
    size_t max;   // 0: no cap; else len never exceeds max
    const struct ms_buf_alloc *alloc; // NULL: malloc / realloc / free
};

// Appends n bytes (n may be 0: the buffer is then allocated, holding ""). The
// capacity at least doubles when it grows and never passes max + 1. Returns
// 0; MS_ETOOLONG when len + n would pass max (or SIZE_MAX); MS_ENOMEM when
// memory runs out. On failure the buffer is unchanged.
int ms_buf_append(struct ms_buf *b, const void *p, size_t n);
// Appends printf-formatted text. Same returns, and MS_EINVAL when the format
// cannot be rendered (an encoding error).
int ms_buf_append_fmt(struct ms_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ms_buf_append_vfmt(struct ms_buf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
// Makes room for n more bytes without changing the contents, so that later
// appends of up to n bytes in all cannot fail. Same returns as append.
int ms_buf_reserve(struct ms_buf *b, size_t n);
// Drops the first n bytes (all of them when n >= len), keeping the memory.
void ms_buf_drop_front(struct ms_buf *b, size_t n);
// Empties the buffer, keeping its memory, max and allocator.
void ms_buf_reset(struct ms_buf *b);
// Hands the bytes to the caller (NUL-terminated; *len, when len is non-NULL,
// receives the length) and leaves the buffer empty with no memory. The
// caller frees the result with free() for a heap buffer; for a buffer with an
// allocator it stays the allocator's. Returns NULL when an empty heap buffer
// cannot allocate its "".
char *ms_buf_steal(struct ms_buf *b, size_t *len);
// Gives the memory back; the buffer is empty and may be used again (max and
// allocator kept).
void ms_buf_free(struct ms_buf *b);

#endif
