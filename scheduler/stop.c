// stop: stop conditions and the stop-string hold-back buffer (see stop.h).
#include "scheduler/stop.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/utf8.h"

bool stop_utf8_valid(const char *str, size_t len)
{
    return utf8_valid_prefix((const uint8_t *)str, len) == len;
}

int stop_init(struct stop_state *s, const struct engine_stop *p, const int *eos_ids, int n_eos,
              char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (p->max_tokens < 1)
        return ms_err(err, errlen, MS_EINVAL, "max_tokens must be at least 1, not %d",
                      p->max_tokens);
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return ms_err(err, errlen, MS_EINVAL, "min_tokens is %d; it must be 0 to max_tokens (%d)",
                      p->min_tokens, p->max_tokens);
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
    s->include_str = p->include_stop_str;
    int n_ids = (p->ignore_eos ? 0 : n_eos) + p->n_stop_ids;
    if (n_ids > 0) {
        s->ids = malloc((size_t)n_ids * sizeof *s->ids);
        if (!s->ids) goto oom;
        if (!p->ignore_eos)
            for (int i = 0; i < n_eos; i++) s->ids[s->n_ids++] = eos_ids[i];
        s->n_eos = s->n_ids;
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
        // Room for a held-back tail and a chunk, so that feeding rarely allocates.
        if (ms_buf_reserve(&s->text, 2 * STOP_MAX_STRING_BYTES + 256)) goto oom;
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
    ms_buf_free(&s->text);
    memset(s, 0, sizeof *s);
}

bool stop_has_strings(const struct stop_state *s) { return s->n_strs > 0; }

enum engine_finish stop_check_token(const struct stop_state *s, int32_t id, int n_generated,
                                    int seq_len, int max_model_len, int32_t *stop_id)
{
    *stop_id = -1;
    // The model's eos (the first of its list) is an ordinary end, reported
    // as -1 (stop_reason null); the list's others and the request's own stop
    // ids name themselves (vLLM's stop_reason: it adds generation_config's
    // other eos ids to stop_token_ids). The eos first, as vLLM checks it
    // before stop_token_ids: a request that lists it too still gets null.
    for (int i = 0; i < s->n_ids; i++)
        if (s->ids[i] == id) {
            if (i > 0 || s->n_eos == 0) *stop_id = id;
            return FINISH_STOP;
        }
    if (n_generated >= s->max_tokens) return FINISH_LENGTH;
    if (max_model_len > 0 && seq_len >= max_model_len) return FINISH_LENGTH;
    return FINISH_NONE;
}

// The longest tail of buf that is a proper prefix of a stop string, never
// cutting a character: what must be held back until the next text decides.
static size_t held_tail(const struct stop_state *s, const char *buf, size_t blen)
{
    size_t hold = 0;
    for (int i = 0; i < s->n_strs; i++) {
        size_t k = s->lens[i] - 1;
        if (k > blen) k = blen;
        for (; k > hold; k--)
            if (buf[blen - k] == s->strs[i][0] && !memcmp(buf + blen - k, s->strs[i], k)) break;
        if (k > hold) hold = k;
    }
    // Valid text and stop strings make this a character boundary already;
    // never cut a character even if the text was not.
    while (hold > 0 && hold < blen && ((unsigned char)buf[blen - hold] & 0xc0) == 0x80) hold++;
    return hold;
}

// Brings the held-back tail of the last call to the front and appends text.
static int take_text(struct stop_state *s, const char *text, size_t len)
{
    ms_buf_drop_front(&s->text, s->held_off);
    s->min_end = s->min_end > s->held_off ? s->min_end - s->held_off : 0;
    s->held_off = 0;
    int rc = ms_buf_append(&s->text, text, len);
    return rc == MS_ETOOLONG ? MS_ENOMEM : rc;
}

int stop_pass_text(struct stop_state *s, const char *text, size_t len, const char **out,
                   size_t *out_len)
{
    if (s->n_strs == 0 || s->matched) {
        *out = s->matched ? "" : text;
        *out_len = s->matched ? 0 : len;
        return 0;
    }
    int rc = take_text(s, text, len);
    if (rc) return rc;
    // Not matched, but its tail is held as ever: a stop string that begins
    // in it and ends in later text is still found.
    s->min_end = s->text.len;
    *out = s->text.data;
    *out_len = s->text.len - held_tail(s, s->text.data, s->text.len);
    s->held_off = *out_len;
    return 0;
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
    int rc = take_text(s, text, len);
    if (rc) return rc;
    const char *buf = s->text.data;
    size_t blen = s->text.len;

    // No stop string occurred before: held text is the longest suffix that is
    // a proper prefix of one, so any occurrence now lies within buf (and
    // ends past min_end: text passed within min_tokens is not matched).
    // The stop string that completes first wins (the longest among those
    // ending together), which makes the cut independent of how the text was
    // split into tokens.
    size_t best = SIZE_MAX, best_end = SIZE_MAX;
    for (int i = 0; i < s->n_strs; i++) {
        const size_t from = s->min_end >= s->lens[i] ? s->min_end - s->lens[i] + 1 : 0;
        if (from >= blen) continue;
        const char *p = memmem(buf + from, blen - from, s->strs[i], s->lens[i]);
        if (!p) continue;
        size_t at = (size_t)(p - buf), end = at + s->lens[i];
        if (end < best_end || (end == best_end && at < best)) {
            best = at;
            best_end = end;
            *matched = i;
        }
    }
    *out = buf;
    if (*matched >= 0) {
        s->matched = true;
        *out_len = s->include_str ? best_end : best;
        s->held_off = blen; // nothing is held back any more
        return 0;
    }
    *out_len = blen - held_tail(s, buf, blen);
    s->held_off = *out_len;
    return 0;
}

void stop_flush(struct stop_state *s, const char **out, size_t *out_len)
{
    if (s->n_strs == 0 || s->matched) {
        *out = "";
        *out_len = 0;
        return;
    }
    *out = s->text.data + s->held_off;
    *out_len = s->text.len - s->held_off;
    s->held_off = s->text.len; // released: the next feed drops it
}
