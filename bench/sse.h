// sse: an incremental parser for text/event-stream bodies (the client side
// of OpenAI streaming). Bytes arrive in arbitrary pieces; each complete
// event's data is handed to a callback.
#ifndef MOESERVE_BENCH_SSE_H
#define MOESERVE_BENCH_SSE_H

#include <stddef.h>

// Called once per event with its data (the event's `data:` lines joined by
// '\n', NUL-terminated). Return 0 to go on, non-zero to stop parsing (the
// value comes back from sse_feed).
typedef int (*sse_on_data)(void *ctx, const char *data, size_t len);

struct sse_parser;

// max_event_bytes bounds one line and one event's data: a stream that sends
// more without a line break or blank line is refused (MS_EFORMAT), never
// buffered without end.
struct sse_parser *sse_create(size_t max_event_bytes, sse_on_data cb, void *ctx);
void sse_destroy(struct sse_parser *p);
// Feeds bytes. Lines end in \n, \r\n or \r (split across calls is fine);
// `data:` fields accumulate, a blank line dispatches, `:` comments and
// other fields (event, id, retry) are ignored. Returns 0, the callback's
// non-zero value, MS_EFORMAT (too long) or MS_ENOMEM.
int sse_feed(struct sse_parser *p, const char *buf, size_t n);
// At end of stream: dispatches a pending event whose blank line never came
// (servers that close right after the last `data:` line). Same returns.
int sse_finish(struct sse_parser *p);

#endif
