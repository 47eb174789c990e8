// http_head: checks the head (request line and header fields) of the first
// HTTP/1.x request on a connection, before libmicrohttpd sees it. MHD 0.9.75
// answers a head it cannot take (a header section too large, an HTTP/2
// request line, a malformed Content-Length, a header line without a colon,
// an HTTP/1.1 request without Host) with its own fixed HTML page; the
// server's front gate (server/http.c) peeks at the bytes a client sent and,
// when this module refuses them, answers in the OpenAI error envelope
// instead. Pure: no I/O, no allocation, no globals; safe on any bytes.
#ifndef MOESERVE_SERVER_HTTP_HEAD_H
#define MOESERVE_SERVER_HTTP_HEAD_H

#include <stdbool.h>
#include <stddef.h>

// The most header fields a head may have (431 beyond), whatever its size.
#define HTTP_HEAD_MAX_FIELDS 100

enum http_head_result {
    HTTP_HEAD_OK = 0,      // the head is complete and acceptable: hand the connection on
    HTTP_HEAD_MORE = 1,    // nothing wrong so far, but the head has not ended: wait for bytes
    HTTP_HEAD_REFUSE = 2,  // answer v->status with v->message and close
};

struct http_head_verdict {
    int status;            // HTTP_HEAD_REFUSE: 400, 431, 501 or 505; else 0
    const char *reason;    // its reason phrase ("Bad Request"), a static string
    const char *code;      // the error envelope's code ("malformed_request", ...), static
    char message[240];     // what was wrong and what to do: one sentence, printable ASCII
                           // only (client bytes quoted in it are escaped), never empty
    size_t head_len;       // HTTP_HEAD_OK: bytes through the blank line that ends the head
};

// buf: the first n bytes the client sent on the connection (a body or a
// pipelined request may follow the head; only the head is read). limit: the
// most bytes a head may take (the blank line included); a head not ended
// within limit bytes is refused with 431. eof: the client will send nothing
// more (it shut its side), so a head not ended yet never will be.
// Refusals are decided as early as possible and never change: when a prefix
// of some bytes is refused, the whole bytes are refused with the same status
// (so a caller may refuse on the first bytes that show the fault): a line
// is judged as soon as a byte shows its fault, even before its LF comes.
// What is refused (RFC 9112, and what MHD 0.9.75 would otherwise answer with
// its own page): 400 a malformed request line or header line (a lone CR, a
// control byte, a name not right before its colon, an obsolete line fold:
// MHD would join it to the header's name), an HTTP/1.1 head without exactly one Host (more than one in
// any request), a Content-Length that is not 1 to 19 digits or differs
// between its headers, Transfer-Encoding in HTTP/1.0 or beside
// Content-Length; 431 no head within limit bytes, or more than
// HTTP_HEAD_MAX_FIELDS header fields; 501 a Transfer-Encoding
// other than one 'chunked'; 505 an HTTP version other than 1.x.
enum http_head_result http_head_check(const char *buf, size_t n, size_t limit, bool eof,
                                      struct http_head_verdict *v);

#endif
