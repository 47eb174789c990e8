// stop: stop conditions and the stop-string hold-back buffer (see stop.h).
#include "scheduler/stop.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

bool stop_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            n = 2;
            cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            n = 3;
            cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            n = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (len - i < n) return false;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += n;
    }
    return true;
}

int stop_init(struct stop_state *s, const struct engine_stop *p, const int *eos_ids, int n_eos,
              char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (p->max_tokens < 1)
        return ms_err(err, errlen, MS_EINVAL, "max_tokens must be at least 1, not %d",
                      p->max_tokens);
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return ms_err(err, errlen, MS_EINVAL, "the stop token id list is malformed");
    if (p->n_stop_strs < 0 || (p->n_stop_strs > 0 && !p->stop_strs))
        return ms_err(err, errlen, MS_EINVAL, "the stop string list is malformed");
    if (p->n_stop_strs > STOP_MAX_STRINGS)
        return ms_err(err, errlen, MS_EINVAL, "at most %d stop strings are supported, not %d",
                      STOP_MAX_STRINGS, p->n_stop_strs);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0)
            return ms_err(err, errlen, MS_EINVAL, "stop token id %d is negative",
                          (int)p->stop_ids[i]);
    for (int i = 0; i < p->n_stop_strs; i++) {
        const char *str = p->stop_strs[i];
        size_t n = str ? strlen(str) : 0;
        if (n == 0)
            return ms_err(err, errlen, MS_EINVAL, "stop string %d is empty", i);
        if (n > STOP_MAX_STRING_BYTES)
            return ms_err(err, errlen, MS_EINVAL,
                          "stop string %d is %zu bytes long; at most %d are supported", i, n,
                          STOP_MAX_STRING_BYTES);
        if (!stop_utf8_valid(str, n))
            return ms_err(err, errlen, MS_EINVAL, "stop string %d is not valid UTF-8", i);
    }
    s->max_tokens = p->max_tokens;
    int n_ids = (p->ignore_eos ? 0 : n_eos) + p->n_stop_ids;
    if (n_ids > 0) {
        s->ids = malloc((size_t)n_ids * sizeof *s->ids);
        if (!s->ids) goto oom;
        if (!p->ignore_eos)
            for (int i = 0; i < n_eos; i++) s->ids[s->n_ids++] = eos_ids[i];
        for (int i = 0; i < p->n_stop_ids; i++) s->ids[s->n_ids++] = p->stop_ids[i];
    }
    if (p->n_stop_strs > 0) {
        s->strs = calloc((size_t)p->n_stop_strs, sizeof *s->strs);
        s->lens = calloc((size_t)p->n_stop_strs, sizeof *s->lens);
        if (!s->strs || !s->lens) goto oom;
        for (int i = 0; i < p->n_stop_strs; i++) {
            s->strs[i] = strdup(p->stop_strs[i]);
            if (!s->strs[i]) goto oom;
            s->lens[i] = strlen(s->strs[i]);
            s->n_strs = i + 1;
        }
        s->cap = 2 * STOP_MAX_STRING_BYTES + 256;
        s->buf = malloc(s->cap);
        if (!s->buf) goto oom;
    }
    return 0;
oom:
    stop_free(s);
    return ms_err(err, errlen, MS_ENOMEM, "out of memory copying the stop conditions");
}

void stop_free(struct stop_state *s)
{
    free(s->ids);
    for (int i = 0; i < s->n_strs; i++) free(s->strs[i]);
    free(s->strs);
    free(s->lens);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

bool stop_has_strings(const struct stop_state *s) { return s->n_strs > 0; }

enum engine_finish stop_check_token(const struct stop_state *s, int32_t id, int n_generated,
                                    int seq_len, int max_model_len, int32_t *stop_id)
{
    *stop_id = -1;
    for (int i = 0; i < s->n_ids; i++)
        if (s->ids[i] == id) {
            *stop_id = id;
            return FINISH_STOP;
        }
    if (n_generated >= s->max_tokens) return FINISH_LENGTH;
    if (max_model_len > 0 && seq_len >= max_model_len) return FINISH_LENGTH;
    return FINISH_NONE;
}

int stop_feed_text(struct stop_state *s, const char *text, size_t len, int *matched,
                   const char **out, size_t *out_len)
{
    *matched = -1;
    if (s->n_strs == 0 || s->matched) {
        // Nothing to hold back (or already stopped: the caller should not feed).
        *out = s->matched ? "" : text;
        *out_len = s->matched ? 0 : len;
        return 0;
    }
    // Bring the held-back tail of the last call to the front.
    size_t held = s->len - s->held_off;
    memmove(s->buf, s->buf + s->held_off, held);
    s->len = held;
    s->held_off = 0;
    if (len > s->cap - s->len) {
        size_t cap = s->len + len + 256;
        char *nb = realloc(s->buf, cap);
        if (!nb) return MS_ENOMEM;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, len);
    s->len += len;

    // No stop string occurred before: held text is the longest suffix that is
    // a proper prefix of one, so any occurrence now lies within buf.
    // The stop string that completes first wins (the longest among those
    // ending together), which makes the cut independent of how the text was
    // split into tokens.
    size_t best = SIZE_MAX, best_end = SIZE_MAX;
    for (int i = 0; i < s->n_strs; i++) {
        const char *p = memmem(s->buf, s->len, s->strs[i], s->lens[i]);
        if (!p) continue;
        size_t at = (size_t)(p - s->buf), end = at + s->lens[i];
        if (end < best_end || (end == best_end && at < best)) {
            best = at;
            best_end = end;
            *matched = i;
        }
    }
    *out = s->buf;
    if (*matched >= 0) {
        s->matched = true;
        *out_len = best;
        s->held_off = s->len = 0;
        return 0;
    }
    size_t hold = 0;
    for (int i = 0; i < s->n_strs; i++) {
        size_t k = s->lens[i] - 1;
        if (k > s->len) k = s->len;
        for (; k > hold; k--)
            if (s->buf[s->len - k] == s->strs[i][0] &&
                !memcmp(s->buf + s->len - k, s->strs[i], k))
                break;
        if (k > hold) hold = k;
    }
    // Valid text and stop strings make this a character boundary already;
    // never cut a character even if the text was not.
    while (hold > 0 && hold < s->len &&
           ((unsigned char)s->buf[s->len - hold] & 0xc0) == 0x80)
        hold++;
    *out_len = s->len - hold;
    s->held_off = s->len - hold;
    return 0;
}

void stop_flush(struct stop_state *s, const char **out, size_t *out_len)
{
    if (s->n_strs == 0 || s->matched) {
        *out = "";
        *out_len = 0;
        return;
    }
    *out = s->buf + s->held_off;
    *out_len = s->len - s->held_off;
    s->len = s->held_off = 0;
}
