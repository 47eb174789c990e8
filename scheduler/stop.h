// stop: one sequence's stop conditions — eos and stop token ids, max_tokens
// and max_model_len, and stop strings matched on the detokenized text, with
// any tail that could still grow into a stop string held back until decided.
#ifndef MOESERVE_SCHEDULER_STOP_H
#define MOESERVE_SCHEDULER_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "scheduler/engine.h"

#define STOP_MAX_STRINGS 64
#define STOP_MAX_STRING_BYTES 1024

struct stop_state {
    int32_t *ids;     // (n_ids) eos ids (unless ignore_eos), then the request's stop ids
    int n_ids;
    int n_eos;        // how many of ids are the model's eos ids
    int max_tokens;
    char **strs;      // (n_strs) NUL-terminated copies
    size_t *lens;     // (n_strs)
    int n_strs;
    bool include_str;   // a match keeps its stop string (the text is cut after it)
    struct ms_buf text; // held-back text followed by the newest chunk
    size_t held_off;    // text.data[held_off, text.len) is held back from the last call
    size_t min_end;     // no match may end at or before text.data + min_end (text passed within min_tokens)
    bool matched;
};

// Copies everything it keeps. Refuses (MS_EINVAL, with the reason) empty or
// invalid-UTF-8 stop strings, more than STOP_MAX_STRINGS of them, one longer
// than STOP_MAX_STRING_BYTES, negative ids, and max_tokens < 1.
int stop_init(struct stop_state *s, const struct engine_stop *p, const int *eos_ids, int n_eos,
              char *err, size_t errlen);
void stop_free(struct stop_state *s);

// The decision for the n_generated-th generated token id, the sequence now
// holding seq_len tokens: FINISH_STOP for eos (unless ignore_eos) or a stop
// id (its id in *stop_id; -1 for the first eos id, the model's own end), FINISH_LENGTH once max_tokens or
// max_model_len is reached, else FINISH_NONE. A stop token's text is not
// part of the output.
enum engine_finish stop_check_token(const struct stop_state *s, int32_t id, int n_generated,
                                    int seq_len, int max_model_len, int32_t *stop_id);

// Feeds the text a new token completed (whole UTF-8 characters). *matched
// receives the index of the stop string that now occurs (the one completing
// first in the text, the longest among those ending together) or -1. *out, *out_len receive the text
// that may be released now — up to the match when there is one (through it
// with include_stop_str) — valid until the next call. Returns 0, or MS_ENOMEM when the buffer cannot grow.
int stop_feed_text(struct stop_state *s, const char *text, size_t len, int *matched,
                   const char **out, size_t *out_len);
// Text of a token within min_tokens: never matched, but its tail that could
// begin a stop string is held back as stop_feed_text holds it (vLLM looks
// only once more than min_tokens are out, for strings that end in new text).
int stop_pass_text(struct stop_state *s, const char *text, size_t len, const char **out,
                   size_t *out_len);
// At the end of a sequence that did not stop on a string: the held-back text.
void stop_flush(struct stop_state *s, const char **out, size_t *out_len);
bool stop_has_strings(const struct stop_state *s);

// Whether bytes are valid UTF-8 (no overlongs, surrogates or values past U+10FFFF).
bool stop_utf8_valid(const char *s, size_t len);

#endif
