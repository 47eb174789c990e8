// tokenizer_decode: ids -> bytes -> text. One UTF-8 repair state machine
// serves both the whole-sequence decode and the streaming decoder, so their
// outputs agree by construction; it replaces each maximal ill-formed
// subsequence with U+FFFD, as Rust's from_utf8_lossy and WHATWG's decoder do.
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tokenizer/tokenizer_internal.h"

static const uint8_t REPLACEMENT[3] = {0xef, 0xbf, 0xbd};

static int lead_len(uint8_t c)
{
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 0;
}

static bool valid_next(const uint8_t *pending, int n_pending, uint8_t b)
{
    if ((b & 0xc0) != 0x80) return false;
    if (n_pending == 1) {
        switch (pending[0]) {
        case 0xe0: return b >= 0xa0;
        case 0xed: return b <= 0x9f;
        case 0xf0: return b >= 0x90;
        case 0xf4: return b <= 0x8f;
        default: return true;
        }
    }
    return true;
}

// Feeds bytes through the repair state; out must hold 3 * (n + 3) bytes.
// With out NULL it only counts what it would write (the state still moves).
static size_t repair_feed(uint8_t *pending, int *n_pending, const uint8_t *src, size_t n,
                          uint8_t *out)
{
#define EMIT(p, len) do { if (out) memcpy(out + o, (p), (len)); o += (len); } while (0)
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = src[i];
        if (*n_pending > 0) {
            if (valid_next(pending, *n_pending, b)) {
                pending[(*n_pending)++] = b;
                if (*n_pending == lead_len(pending[0])) {
                    EMIT(pending, (size_t)*n_pending);
                    *n_pending = 0;
                }
                continue;
            }
            EMIT(REPLACEMENT, 3);
            *n_pending = 0; // and b starts afresh
        }
        int l = lead_len(b);
        if (l == 1) {
            EMIT(&b, 1);
        } else if (l == 0) {
            EMIT(REPLACEMENT, 3);
        } else {
            pending[0] = b;
            *n_pending = 1;
        }
    }
    return o;
#undef EMIT
}

static int check_id(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->has_token[id] ? 0 : MS_EINVAL;
}

int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               char **text, size_t *len, char *err, size_t errlen)
{
    *text = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (check_id(t, ids[i]))
            return ms_err(err, errlen, MS_EINVAL,
                          "token id %d at position %zu is not in the vocabulary (ids are 0 to %d)",
                          (int)ids[i], i, (int)t->n_ids - 1);
        if (skip_special && t->special[ids[i]]) continue;
        if (ms_add_overflow(total, t->bytes_len[ids[i]], &total))
            return ms_err(err, errlen, MS_ENOMEM, "decoded text is too large");
    }
    size_t cap;
    if (ms_add_overflow(total, 3, &cap) || ms_mul_overflow(cap, 3, &cap) ||
        ms_add_overflow(cap, 1, &cap))
        return ms_err(err, errlen, MS_ENOMEM, "decoded text is too large");
    uint8_t *out = malloc(cap);
    if (!out) return ms_err(err, errlen, MS_ENOMEM, "out of memory decoding %zu ids", n);
    uint8_t pending[4];
    int n_pending = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && t->special[id]) continue;
        o += repair_feed(pending, &n_pending, t->bytes[id], t->bytes_len[id], out + o);
    }
    if (n_pending) {
        memcpy(out + o, REPLACEMENT, 3);
        o += 3;
    }
    out[o] = 0;
    *text = (char *)out;
    if (len) *len = o;
    return 0;
}

size_t tok_stream_max_output(const struct tokenizer *t)
{
    return 3 * (t->max_token_bytes + 3);
}

void tok_stream_init(struct tok_stream *s, const struct tokenizer *t, bool skip_special)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->skip_special = skip_special;
}

int tok_stream_feed(struct tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    const struct tokenizer *t = s->tok;
    if (!t || check_id(t, id)) return MS_EINVAL;
    if (s->skip_special && t->special[id]) return 0;
    size_t n = t->bytes_len[id];
    if (cap < 3 * (n + 3)) {
        // Valid UTF-8 needs about n bytes; only broken bytes triple. Count
        // exactly before refusing, on a copy of the state.
        uint8_t pend[4];
        memcpy(pend, s->pending, sizeof pend);
        int np = s->n_pending;
        if (repair_feed(pend, &np, t->bytes[id], n, NULL) > cap) return MS_EINVAL;
    }
    *n_out = repair_feed(s->pending, &s->n_pending, t->bytes[id], n, (uint8_t *)out);
    return 0;
}

int tok_stream_finish(struct tok_stream *s, char *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if (s->n_pending == 0) return 0;
    if (cap < 3) return MS_EINVAL;
    memcpy(out, REPLACEMENT, 3);
    *n_out = 3;
    s->n_pending = 0;
    return 0;
}
