// harness: a real `moeserve serve` on loopback for integration tests — start
// it on a free port, talk to it with libcurl (whole bodies and SSE), stop it.
#ifndef MOESERVE_TESTS_SERVER_HARNESS_H
#define MOESERVE_TESTS_SERVER_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "tests/server/client.h"

struct srv {
    pid_t pid;
    int port;
    int err_fd;
    struct srv_log *log;         // stderr, collected by a thread
};

// Starts the server on the tiny model (MOESERVE_TINY_MODEL) with small test
// defaults (--port 0, a small KV cache, --max-model-len 2048, one thread)
// plus extra (NULL-terminated; an extra "--model DIR" replaces the
// MODEL_DIR). Waits for its "ready" line. 0 or -1.
int srv_start(struct srv *s, const char *const *extra);
// Sends sig, waits up to timeout_s for the exit; returns the exit status,
// 128+signal when killed by one, or -1 when it did not exit (then SIGKILLed).
int srv_stop(struct srv *s, int sig, double timeout_s);
// Everything the server wrote to stderr so far (NUL-terminated copy, free it).
char *srv_stderr(struct srv *s);

// One request; body NULL for none; key NULL for no Authorization header.
struct resp srv_request(const struct srv *s, const char *method, const char *path,
                        const char *body, size_t len, const char *key);
// POST a JSON body (NUL-terminated) and parse the answer; *status receives the code.
json_t *srv_post_json(const struct srv *s, const char *path, const char *body, long *status);
json_t *srv_get_json(const struct srv *s, const char *path, long *status);

// A whole SSE response: the parsed `data:` events in order (the [DONE]
// marker recorded separately), and comments counted.
struct sse {
    long status;
    json_t *events;              // array of the JSON events
    bool done;                   // `data: [DONE]` came last
    int comments;
    char *raw;
};
void sse_free(struct sse *e);
// Parses an SSE body.
void sse_parse(const char *raw, size_t len, struct sse *out);
struct sse srv_stream(const struct srv *s, const char *path, const char *body);

// Concatenated delta contents (chat) or texts (completions) of one choice index.
char *sse_text(const struct sse *e, int index);

// /health's JSON fields as numbers (-1 when absent).
long srv_health_field(const struct srv *s, const char *field);
// Polls /health until num_running and num_waiting are 0 and no KV block is
// referenced, up to timeout_s; true when that happened.
bool srv_wait_idle(const struct srv *s, double timeout_s);

double now_s(void);

#endif
