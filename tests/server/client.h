// client: the client side of the server tests, over 127.0.0.1 — one
// request with libcurl, many at once on one multi handle, and raw sockets
// for what curl will not send (malformed requests, slow bodies, hang-ups).
// Shared by test_http.c (the HTTP layer alone) and the serve harness. No
// cmocka here (bench_serve links it too): failures come back as values.
#ifndef MOESERVE_TESTS_SERVER_CLIENT_H
#define MOESERVE_TESTS_SERVER_CLIENT_H

#include <curl/curl.h>
#include <stddef.h>

struct resp {
    long status;                 // 0 when no response came (curl_code says why)
    CURLcode curl_code;
    char *body;                  // NUL-terminated, malloc'd ("" when none)
    size_t len;
    char retry_after[32];        // the Retry-After header, "" when none
    char allow[128];             // the Allow header, "" when none
    struct curl_slist *header_list; // the request's headers, until client_finish
};
void resp_free(struct resp *r);

// A request to 127.0.0.1:port, set up but not run: run it with
// curl_easy_perform or client_perform_all, then client_finish. Its answer
// goes to *out, which (like body) must stay put until then. body NULL for
// none (a body goes as Content-Type: application/json unless headers name a
// Content-Type); key NULL for no Authorization header; headers: more header
// lines (NULL-terminated list, or NULL). NULL when libcurl is out of memory.
CURL *client_prepare(struct resp *out, int port, const char *method, const char *path,
                     const char *body, size_t len, const char *key, const char *const *headers,
                     long timeout_s);
// Reads the status into r and frees c (which may be NULL).
void client_finish(CURL *c, struct resp *r);
// client_prepare, run, client_finish.
struct resp client_request(int port, const char *method, const char *path, const char *body,
                           size_t len, const char *key, const char *const *headers,
                           long timeout_s);

// Runs every handle (set up, none in a multi handle) to completion, all at
// once on one multi handle, then takes them out of it again; the results of
// handles from client_prepare land in their struct resp (finish them after).
// 0, or -1 when libcurl failed.
int client_perform_all(CURL *const *h, int n);

// A TCP connection to 127.0.0.1:port whose reads give up after timeout_s;
// -1 when it could not connect.
int client_connect_raw(int port, long timeout_s);
// The same from the loopback address src ("127.0.0.2"; NULL: the kernel's
// choice), so that one test can be several clients.
int client_connect_from(int port, const char *src, long timeout_s);
// Reads until buf holds needle, the peer closes, or the read times out
// (needle NULL: until the peer closes); buf is NUL-terminated; returns the
// bytes read.
size_t client_read_until(int fd, char *buf, size_t cap, const char *needle);

#endif
