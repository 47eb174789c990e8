// fuzz_http_head: the first bytes of a connection through server/http_head,
// whole and cut short. Byte 0 seeds the cuts, byte 1 picks the head limit
// (64..4096, so that 431 is reached), the rest are the client's bytes.
// Promises: a result is one of the three and its verdict is whole (a refusal
// has a listed status, names, and a sentence of printable ASCII within the
// array; a taken head ends with an LF within the bytes and the limit);
// refusals never change: a prefix refused (the connection still open) means
// the whole is refused with the same status; a head taken means every
// shorter prefix waits and every longer one takes the same head; the end of
// the connection only turns a wait into a 400; bytes past the limit are never read.
#include <stdbool.h>

#include "server/http_head.h"
#include "tests/fuzz/fuzz.h"

// Checks the verdict's own promises; returns the result.
static enum http_head_result check(const char *buf, size_t n, size_t limit, bool eof,
                                   struct http_head_verdict *v)
{
    memset(v, 0x5a, sizeof *v); // every field must be written
    enum http_head_result r = http_head_check(buf, n, limit, eof, v);
    FUZZ_CHECK(r == HTTP_HEAD_OK || r == HTTP_HEAD_MORE || r == HTTP_HEAD_REFUSE, "result %d",
               (int)r);
    FUZZ_CHECK(memchr(v->message, 0, sizeof v->message), "message not NUL-terminated");
    FUZZ_CHECK(v->reason && v->code, "reason or code NULL");
    if (r == HTTP_HEAD_REFUSE) {
        int s = v->status;
        FUZZ_CHECK(s == 400 || s == 431 || s == 501 || s == 505, "status %d", s);
        FUZZ_CHECK(v->reason[0] && v->code[0], "status %d without a reason or code", s);
        FUZZ_CHECK(v->message[0], "status %d without a message", s);
        for (const char *p = v->message; *p; p++)
            FUZZ_CHECK((unsigned char)*p >= 0x20 && (unsigned char)*p <= 0x7e,
                       "byte 0x%02x in the message '%s'", (unsigned char)*p, v->message);
    } else {
        FUZZ_CHECK(v->status == 0 && !v->reason[0] && !v->code[0], "status %d on result %d",
                   v->status, (int)r);
    }
    if (r == HTTP_HEAD_OK) {
        size_t seen = n < limit ? n : limit;
        FUZZ_CHECK(v->head_len > 0 && v->head_len <= seen, "head_len %zu of %zu bytes (limit %zu)",
                   v->head_len, n, limit);
        FUZZ_CHECK(buf[v->head_len - 1] == '\n', "the head does not end with LF");
    }
    if (n >= limit) FUZZ_CHECK(r != HTTP_HEAD_MORE, "waits with %zu bytes at limit %zu", n, limit);
    if (eof) FUZZ_CHECK(r != HTTP_HEAD_MORE, "waits after the end of the connection");
    return r;
}

// The first k bytes alone, in a block of exactly k bytes so that a read past
// them is an ASan finding.
static enum http_head_result check_copy(const char *buf, size_t k, size_t limit, bool eof,
                                        struct http_head_verdict *v)
{
    char *copy = malloc(k ? k : 1);
    if (!copy) abort();
    if (k) memcpy(copy, buf, k);
    enum http_head_result r = check(copy, k, limit, eof, v);
    free(copy);
    return r;
}

// The prefix of k bytes against the whole (result r, verdict w).
static void prefix_agrees(const char *buf, size_t n, size_t k, size_t limit,
                          enum http_head_result r, const struct http_head_verdict *w)
{
    struct http_head_verdict v;
    enum http_head_result rk = check_copy(buf, k, limit, false, &v);
    if (rk == HTTP_HEAD_REFUSE)
        FUZZ_CHECK(r == HTTP_HEAD_REFUSE && w->status == v.status,
                   "%zu of %zu bytes refused with %d (%s), the whole gives %d status %d", k, n,
                   v.status, v.message, (int)r, w->status);
    if (r == HTTP_HEAD_OK && k < w->head_len)
        FUZZ_CHECK(rk == HTTP_HEAD_MORE, "%zu bytes of a %zu-byte head give %d (%s)", k,
                   w->head_len, (int)rk, v.message);
    if (r == HTTP_HEAD_OK && k >= w->head_len)
        FUZZ_CHECK(rk == HTTP_HEAD_OK && v.head_len == w->head_len,
                   "%zu bytes holding a %zu-byte head give %d", k, w->head_len, (int)rk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    uint32_t x = data[0] * 2654435761u + 1;
    size_t limit = 64 + (size_t)data[1] * (4096 - 64) / 255;
    const char *buf = (const char *)data + 2;
    size_t n = size - 2;

    struct http_head_verdict w, e;
    enum http_head_result r = check(buf, n, limit, false, &w);

    // The end of the connection turns a wait into a 400 and changes nothing else.
    enum http_head_result re = check(buf, n, limit, true, &e);
    if (r == HTTP_HEAD_MORE)
        FUZZ_CHECK(re == HTTP_HEAD_REFUSE && e.status == 400, "eof gives %d status %d", (int)re,
                   e.status);
    else
        FUZZ_CHECK(re == r && e.status == w.status && e.head_len == w.head_len,
                   "eof turns %d (%d) into %d (%d)", (int)r, w.status, (int)re, e.status);

    // Bytes past the limit are never read: cut there, the verdict is the same.
    if (n > limit) {
        struct http_head_verdict c;
        enum http_head_result rc = check_copy(buf, limit, limit, false, &c);
        FUZZ_CHECK(rc == r && c.status == w.status && c.head_len == w.head_len,
                   "cut at the limit: %d (%d), whole %d (%d)", (int)rc, c.status, (int)r, w.status);
    }

    // Prefixes: a few the first byte picks, the one a byte short, and (for a
    // short head) every one shorter than the head.
    if (!n) return 0;
    for (int i = 0; i < 4; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        prefix_agrees(buf, n, x % n, limit, r, &w);
    }
    prefix_agrees(buf, n, n - 1, limit, r, &w);
    if (r == HTTP_HEAD_OK && w.head_len <= 512)
        for (size_t k = 0; k < w.head_len; k++) {
            struct http_head_verdict v;
            enum http_head_result rk = check(buf, k, limit, false, &v);
            FUZZ_CHECK(rk == HTTP_HEAD_MORE, "%zu bytes of a %zu-byte head give %d (%s)", k,
                       w.head_len, (int)rk, v.message);
        }
    return 0;
}
