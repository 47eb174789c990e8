// fuzz_sse: a text/event-stream body through bench/sse, whole and cut into
// pieces (the first byte seeds the cuts). Promises: the pieces give exactly
// the events and the status the whole gives (lines may end anywhere); every
// event's data is NUL-terminated at its length and within the event bound;
// a refusal is MS_EFORMAT (too long), never anything else; nothing leaks.
#include "base/base.h"
#include "bench/sse.h"
#include "tests/fuzz/fuzz.h"

enum { MAX_EVENT = 256 };

struct events {
    char *all; // each event's data then a 0xff separator
    size_t len;
    int count;
};

static int on_data(void *ctx, const char *d, size_t len)
{
    struct events *ev = ctx;
    FUZZ_CHECK(d[len] == 0, "event data not NUL-terminated at %zu", len);
    FUZZ_CHECK(len <= MAX_EVENT, "event of %zu bytes past the %d bound", len, MAX_EVENT);
    char *p = realloc(ev->all, ev->len + len + 1);
    if (!p) abort();
    memcpy(p + ev->len, d, len);
    p[ev->len + len] = (char)0xff;
    ev->all = p;
    ev->len += len + 1;
    ev->count++;
    return 0;
}

// Feeds body in pieces from cuts (ascending, none: whole) then finishes.
static int run(const char *body, size_t n, uint8_t seed, struct events *ev)
{
    struct sse_parser *p = sse_create(MAX_EVENT, on_data, ev);
    if (!p) abort();
    int rc = 0;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t at = 0; at < n && !rc;) {
        size_t step = n - at;
        if (seed) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            step = 1 + x % 7;
            if (step > n - at) step = n - at;
        }
        rc = sse_feed(p, body + at, step);
        at += step;
    }
    if (!rc) rc = sse_finish(p);
    sse_destroy(p);
    FUZZ_CHECK(rc == 0 || rc == MS_EFORMAT, "status %d", rc);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    const char *body = (const char *)data + 1;
    struct events whole = {0}, cut = {0};
    int a = run(body, n - 1, 0, &whole);
    int b = run(body, n - 1, data[0] | 1, &cut);
    // A refusal can come at different events when cut, but only as a refusal.
    FUZZ_CHECK(a == b, "whole says %d, pieces say %d", a, b);
    if (!a)
        FUZZ_CHECK(whole.count == cut.count && whole.len == cut.len &&
                       (!whole.len || !memcmp(whole.all, cut.all, whole.len)),
                   "whole gave %d events, pieces %d", whole.count, cut.count);
    free(whole.all);
    free(cut.all);
    return 0;
}
