// utf8: validation, decoding and encoding of UTF-8 (see utf8.h).
#include "base/utf8.h"

// Bytes in the sequence that lead byte c starts, with the range its second
// byte must fall in (the tighter ranges rule out overlong forms, surrogates
// and code points past U+10FFFF); 0 when c cannot start a sequence.
static size_t lead_info(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) {
        if (c == 0xe0) *lo = 0xa0;
        else if (c == 0xed) *hi = 0x9f;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (c == 0xf0) *lo = 0x90;
        else if (c == 0xf4) *hi = 0x8f;
        return 4;
    }
    return 0;
}

// The length of the well-formed sequence at s, or 0.
static size_t seq_len(const uint8_t *s, size_t n)
{
    uint8_t lo, hi;
    size_t len = lead_info(s[0], &lo, &hi);
    if (len <= 1) return len;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    return len;
}

size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = seq_len(s + i, n - i);
        if (!len) return i;
        i += len;
    }
    return n;
}

size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t len = seq_len(s, n);
    switch (len) {
    case 2: *cp = ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f); return 2;
    case 3:
        *cp = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
        return 3;
    case 4:
        *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
              ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
        return 4;
    default: *cp = UTF8_REPLACEMENT; return 1;
    }
}

size_t utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (uint8_t)(0xf0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}
