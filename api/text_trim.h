// text_trim: the whitespace trim of a text run that the Anthropic and
// Responses fronts give their text and thinking blocks (items): Qwen3 writes
// "<think>\nx\n</think>\n\nAnswer", where Anthropic's API and OpenAI's have
// "x" and "Answer". Fed a run's text piece by piece (as it streams), it
// opens the block at the run's first non-whitespace byte (leading
// whitespace, and runs of nothing else, are dropped) and holds trailing
// whitespace until more text of the run follows, dropping it where the run
// ends. Inner whitespace is kept, so the pieces sent add up to the run's
// text trimmed at both ends, however it was split.
#ifndef MOESERVE_API_TEXT_TRIM_H
#define MOESERVE_API_TEXT_TRIM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

struct text_trim {
    bool open;          // the run's block is open (a non-whitespace byte came)
    struct ms_buf held; // trailing whitespace not sent yet
    // The first run keeps its leading whitespace: an answer that continues
    // the prompt's final message (a prefill, "The answer is" + " 42"). Set
    // by the caller before the first feed; the run's end clears it.
    bool keep_lead;
};

// What the caller does for a trimmed run: open its block (once, before the
// first send), and send text into it. Each returns 0 or a negative status,
// which text_trim_feed returns at once.
struct text_trim_ops {
    int (*open)(void *ctx);
    int (*send)(void *ctx, const char *text, size_t len);
};

// Feeds s[0..n) of the current run. 0, a status of ops, or MS_ENOMEM.
int text_trim_feed(struct text_trim *t, const char *s, size_t n, const struct text_trim_ops *ops, void *ctx);
// The run ended (another kind of text, a call, the answer's end): drops the
// held whitespace and forgets the run. t stays usable for the next one.
void text_trim_end(struct text_trim *t);
void text_trim_free(struct text_trim *t);

#endif
