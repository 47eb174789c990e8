// Pins server/http_head: which request heads are taken (and how long the
// head is), which wait for more bytes, and which are refused with which
// status — each refusal with a sentence of printable ASCII, decided on the
// first bytes that show the fault and kept for every longer input.
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "server/http_head.h"

#define LIMIT 4096
// A string literal and its length (NULs inside count).
#define B(s) s, sizeof(s) - 1

// Checks what every verdict promises, whatever the result.
static enum http_head_result check(const char *buf, size_t n, size_t limit, bool eof,
                                   struct http_head_verdict *v)
{
    memset(v, 0x5a, sizeof *v); // garbage: the check must fill every field
    enum http_head_result r = http_head_check(buf, n, limit, eof, v);
    assert_non_null(v->reason);
    assert_non_null(v->code);
    assert_non_null(memchr(v->message, 0, sizeof v->message));
    if (r == HTTP_HEAD_REFUSE) {
        assert_true(v->status == 400 || v->status == 431 || v->status == 501 || v->status == 505);
        assert_true(v->reason[0] && v->code[0] && v->message[0]);
        for (const char *p = v->message; *p; p++)
            assert_true((unsigned char)*p >= 0x20 && (unsigned char)*p <= 0x7e);
        assert_int_equal(v->head_len, 0);
    } else {
        assert_true(r == HTTP_HEAD_OK || r == HTTP_HEAD_MORE);
        assert_int_equal(v->status, 0);
        assert_string_equal(v->reason, "");
        assert_string_equal(v->code, "");
        if (r == HTTP_HEAD_MORE) assert_int_equal(v->head_len, 0);
    }
    return r;
}

// The whole bytes are a head (plus whatever follows it) that is taken.
static void accepted(const char *buf, size_t n, size_t head_len)
{
    struct http_head_verdict v;
    enum http_head_result r = check(buf, n, LIMIT, false, &v);
    if (r != HTTP_HEAD_OK) fail_msg("refused (%d): %s", v.status, v.message);
    assert_int_equal(v.head_len, head_len);
    assert_int_equal(check(buf, n, LIMIT, true, &v), HTTP_HEAD_OK);
    assert_int_equal(v.head_len, head_len);
    assert_int_equal(check(buf, n, head_len, false, &v), HTTP_HEAD_OK); // a head may fill the limit
}

// The bytes are refused with status; the verdict is left in *out.
static void refused_as(const char *buf, size_t n, int status, struct http_head_verdict *out)
{
    struct http_head_verdict v;
    enum http_head_result r = check(buf, n, LIMIT, false, &v);
    if (r != HTTP_HEAD_REFUSE) fail_msg("not refused (%d) with status %d", (int)r, status);
    if (v.status != status) fail_msg("status %d, not %d: %s", v.status, status, v.message);
    if (out) *out = v;
}

static void refused(const char *buf, size_t n, int status) { refused_as(buf, n, status, NULL); }

// The refusal's sentence says this.
static void refused_saying(const char *buf, size_t n, int status, const char *says)
{
    struct http_head_verdict v;
    refused_as(buf, n, status, &v);
    if (!strstr(v.message, says)) fail_msg("'%s' does not say '%s'", v.message, says);
}

static void acceptable_heads_are_taken(void **state)
{
    (void)state;
    accepted(B("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 27);
    accepted(B("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:8000\r\n"
               "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n"), 111);
    accepted(B("GET / HTTP/1.1\nHost: a\n\n"), 24);                          // LF alone
    accepted(B("GET / HTTP/1.1\r\nHost: a\n\r\n"), 26);                      // mixed
    accepted(B("\r\n\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"), 32);          // leading blank lines
    accepted(B("GET / HTTP/1.0\r\n\r\n"), 18);                               // 1.0 needs no Host
    accepted(B("GET / HTTP/1.0\r\nAccept: */*\r\n\r\n"), 31);
    accepted(B("GET / HTTP/1.9\r\nHost: a\r\n\r\n"), 27);                    // any 1.x
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), 56);
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  Chunked \t\r\n\r\n"), 59);
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length:5\r\n\r\n"),
             65);
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n"), 65);
    accepted(B("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), 31);
    accepted(B("M-SEARCH! /\xc3\xa9\xff?q=1 HTTP/1.1\r\nHost:\r\nX: \x80\xff caf\xc3\xa9\r\n\r\n"),
             51);
    accepted(B("GET / HTTP/1.1\r\nHost: a\r\nEmpty:\r\nTabs:\t\tx\t\r\n\r\n"), 46);
}

static void the_head_ends_at_the_first_blank_line(void **state)
{
    (void)state;
    // A body (or a pipelined request) follows; only the head is read.
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n{}\r\n"), 47);
    accepted(B("GET / HTTP/1.1\r\nHost: a\r\n\r\n\x00\xff\r garbage \r\n\r\n"), 27);
    accepted(B("GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/2.0\r\n\r\n"), 27);
    // The bytes past the head may go past the limit too.
    struct http_head_verdict v;
    const char head[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\nBODY";
    assert_int_equal(check(head, sizeof head - 1, 27, false, &v), HTTP_HEAD_OK);
    assert_int_equal(v.head_len, 27);
}

static void every_strict_prefix_of_an_acceptable_head_waits(void **state)
{
    (void)state;
    static const char *heads[] = {
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "\r\n\nPOST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\nX: a\r\n\r\n",
        "GET / HTTP/1.0\n\n",
        "PUT /a?b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) {
        size_t n = strlen(heads[i]);
        struct http_head_verdict v;
        assert_int_equal(check(heads[i], n, LIMIT, false, &v), HTTP_HEAD_OK);
        assert_int_equal(v.head_len, n);
        for (size_t k = 0; k < n; k++) {
            if (check(heads[i], k, LIMIT, false, &v) != HTTP_HEAD_MORE)
                fail_msg("head %zu cut at %zu: %d %s", i, k, v.status, v.message);
            assert_string_equal(v.message, "");
        }
    }
}

static void a_head_cut_by_the_end_of_the_connection_is_a_400(void **state)
{
    (void)state;
    const char head[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    struct http_head_verdict v;
    for (size_t k = 0; k < sizeof head - 1; k++) {
        assert_int_equal(check(head, k, LIMIT, true, &v), HTTP_HEAD_REFUSE);
        assert_int_equal(v.status, 400);
        assert_non_null(strstr(v.message, "connection was shut before the request headers ended"));
    }
    assert_int_equal(check(NULL, 0, LIMIT, true, &v), HTTP_HEAD_REFUSE);
    assert_int_equal(check(NULL, 0, LIMIT, false, &v), HTTP_HEAD_MORE);
}

static void malformed_request_lines_are_400(void **state)
{
    (void)state;
    const char *shape = "the request line must be 'METHOD /path HTTP/1.1'";
    refused_saying(B("GET\r\nHost: a\r\n\r\n"), 400, shape);
    refused_saying(B("GET \r\nHost: a\r\n\r\n"), 400, "ends after the method");
    refused_saying(B("GET /\r\nHost: a\r\n\r\n"), 400, "no HTTP version");
    refused_saying(B("GET / \r\nHost: a\r\n\r\n"), 400, "no HTTP version");
    refused_saying(B("GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), 400, "two spaces");
    refused_saying(B("GET / HTTP/1.1 \r\nHost: a\r\n\r\n"), 400, "more than two spaces");
    refused_saying(B("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n"), 400, "%20");
    refused_saying(B("GET / http/1.1\r\nHost: a\r\n\r\n"), 400,
                   "'http/1.1' is not an HTTP version");
    refused(B("GET / HTTP/1\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/11.1\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.1.1\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/a.1\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/2\r\nHost: a\r\n\r\n"), 400); // not a version, so not a 505
    refused(B("GET / HTTP/1.1x\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    refused(B(" GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    refused_saying(B("GE(T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400, "the method 'GE(T' is not");
    refused(B("GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    refused_saying(B("GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n"), 400,
                   "the path has the control byte \\x09");
    // 32 method characters are taken, 33 are not.
    accepted(B("ABCDEFGHIJKLMNOPQRSTUVWXYZ012345 / HTTP/1.1\r\nHost: a\r\n\r\n"), 56);
    refused_saying(B("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456 / HTTP/1.1\r\nHost: a\r\n\r\n"), 400,
                   "1 to 32");
}

static void other_http_versions_are_505(void **state)
{
    (void)state;
    refused_saying(B("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505,
                   "this server speaks HTTP/1.1 (and HTTP/1.0), not HTTP/2.0; send HTTP/1.1 "
                   "requests (curl: --http1.1)");
    refused_saying(B("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 505, "not HTTP/2.0"); // h2 preface
    refused_saying(B("GET / HTTP/0.9\r\n\r\n"), 505, "not HTTP/0.9");
    refused_saying(B("GET / HTTP/3.0\r\nHost: a\r\n\r\n"), 505, "not HTTP/3.0");
    refused(B("GET / HTTP/9.9\r\nHost: a\r\n\r\n"), 505);
    struct http_head_verdict v;
    refused_as(B("GET / HTTP/2.0\r\n"), 505, &v); // before the head ends
    assert_string_equal(v.reason, "HTTP Version Not Supported");
    assert_string_equal(v.code, "http_version_not_supported");
}

static void malformed_header_lines_are_400(void **state)
{
    (void)state;
    const char *shape = "must be 'Name: value'";
    refused_saying(B("GET / HTTP/1.1\r\nHost a\r\n\r\n"), 400, shape);
    refused_saying(B("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400, "the header line 'Host : a'");
    refused_saying(B("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n"), 400, shape);
    refused_saying(B("GET / HTTP/1.1\r\n: a\r\nHost: a\r\n\r\n"), 400, shape);
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n"), 400, shape);
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nX(y): 1\r\n\r\n"), 400, shape);
    refused_saying(B("GET / HTTP/1.1\r\n folded\r\nHost: a\r\n\r\n"), 400,
                   "a header line starts with whitespace");
    // Every fold (MHD would join it to the header's name: "Content-" + " Length"
    // framed a body by a header the gate never saw, and a request was smuggled).
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nX-Long: one\r\n  two\r\n\r\n"), 400, "line fold");
    refused_saying(B("POST /ping HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-: chunked\r\n"
                     " Encoding\r\n\r\n"), 400, "line fold");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n 7\r\n\r\n"), 400, "line fold");
    refused_saying(B("GET / HTTP/1.1\r\n\t\r\nHost: a\r\n\r\n"), 400, "starts with whitespace");
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01" "b\r\n\r\n"), 400,
                   "the header 'X' has the control byte \\x01 in its value");
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n"), 400, "\\x7f");
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nX-Fold: a\r\n b\x1b\r\n\r\n"), 400, "line fold");
    struct http_head_verdict v;
    refused_as(B("GET / HTTP/1.1\r\nHost a\r\n\r\n"), 400, &v);
    assert_string_equal(v.reason, "Bad Request");
    assert_string_equal(v.code, "malformed_request");
}

static void http_1_1_needs_exactly_one_host(void **state)
{
    (void)state;
    refused_saying(B("GET / HTTP/1.1\r\n\r\n"), 400, "HTTP/1.1 requests must send a Host header");
    refused_saying(B("GET / HTTP/1.1\r\nX-Host: a\r\n\r\n"), 400, "must send a Host header");
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"), 400, "more than one Host");
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\nHOST: a\r\n\r\n"), 400, "more than one Host");
    // RFC 9112 3.2: more than one is a 400 in any request, 1.0's too.
    refused_saying(B("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"), 400, "more than one Host");
    accepted(B("GET / HTTP/1.0\r\nHost: a\r\n\r\n"), 27);
    accepted(B("GET / HTTP/1.1\r\nhOsT: a\r\n\r\n"), 27);
}

static void content_length_is_one_plain_number(void **state)
{
    (void)state;
    const char *says = "Content-Length must be 1 to 19 digits";
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n"),
                   400, "not '99999999999999999999'");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n"),
                   400, says);
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n"), 400, "not '+5'");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400, "not '-1'");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n"), 400,
                   "not '5, 5'");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\n"), 400, says);
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n"), 400, "not ''");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n"), 400, says);
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n 6\r\n\r\n"), 400, "line fold");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \xd9\xa5\r\n\r\n"), 400,
                   "not '\\xd9\\xa5'");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                     "Content-Length: 6\r\n\r\n"),
                   400, "different values");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                     "Content-Length: x\r\n\r\n"),
                   400, says);
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \t0 \r\n\r\n"), 49);
    accepted(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 05\r\nContent-Length: 5\r\n\r\n"),
             67); // the same length
}

static void transfer_encoding_other_than_chunked_is_501(void **state)
{
    (void)state;
    const char *send = "send Content-Length or 'Transfer-Encoding: chunked'";
    struct http_head_verdict v;
    refused_as(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), 501, &v);
    assert_string_equal(v.reason, "Not Implemented");
    assert_string_equal(v.code, "unsupported_transfer_encoding");
    assert_non_null(strstr(v.message, "'gzip'"));
    assert_non_null(strstr(v.message, send));
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501,
                   send);
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"),
                   501, send);
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n"),
                   501, "not several");
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n"), 501);
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n x\r\n\r\n"), 400); // a fold
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunkedx\r\n\r\n"), 501);
}

static void transfer_encoding_with_content_length_or_in_http_1_0_is_400(void **state)
{
    (void)state;
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Length: 5\r\n\r\n"),
                   400, "send one of them");
    refused_saying(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                     "Transfer-Encoding: gzip\r\n\r\n"),
                   400, "send one of them"); // the smuggling 400 before the 501
    refused_saying(B("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400,
                   "HTTP/1.0 request cannot use Transfer-Encoding");
}

static void a_bad_line_is_refused_before_the_head_ends(void **state)
{
    (void)state;
    // Whole lines.
    refused(B("GET / HTTP/1.1 x\r\n"), 400);
    refused(B("GET / HTTP/1.1\r\nHost: a\r\nBad Line\r\n"), 400);
    refused(B("GET / HTTP/1.1\r\n folded\r\n"), 400);
    // Lines not ended yet, as soon as no byte could mend them.
    refused(B("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), 400); // a TLS ClientHello
    refused(B("GET /\x00"), 400);
    refused(B("G\x00"), 400);
    refused(B("GET / HTTP/1.2x"), 400);
    refused(B("GET / HTTPS"), 400);
    refused(B("GET / HTTP/1.1\r\nHo st"), 400);
    refused(B("GET / HTTP/1.1\r\nHost: a\x01"), 400);
    refused(B("GET / HTTP/1.1\r\nHost: a\r\n x\x00"), 400);
    refused(B("GET / HTTP/1.1\r\n x"), 400);
    refused(B("GET / HTTP/1.1\r\nHost: a\r\n \t"), 400); // a fold, however it would go on
    // Not yet: more bytes could still make these right.
    struct http_head_verdict v;
    const char *waits[] = {"GET", "GET ", "GET /", "GET / HTTP/2.0", "GET / HTTP/2.0\r",
                           "GET / HTTP/1.1\r\nHost", "GET / HTTP/1.1\r\nHost: a\r",
                           "\r\n\r"};
    for (size_t i = 0; i < sizeof waits / sizeof *waits; i++)
        if (check(waits[i], strlen(waits[i]), LIMIT, false, &v) != HTTP_HEAD_MORE)
            fail_msg("'%s' refused: %s", waits[i], v.message);
}

static void a_head_over_the_limit_is_431_and_not_one_byte_before(void **state)
{
    (void)state;
    char head[200];
    int len = snprintf(head, sizeof head, "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: %080d\r\n\r\n", 0);
    size_t n = (size_t)len;
    struct http_head_verdict v;
    // The head fits a limit of exactly its length...
    assert_int_equal(check(head, n, n, false, &v), HTTP_HEAD_OK);
    assert_int_equal(v.head_len, n);
    // ...and not one byte less: refused once that many bytes have come, not before.
    for (size_t k = 0; k < n - 1; k++)
        assert_int_equal(check(head, k, n - 1, false, &v), HTTP_HEAD_MORE);
    for (size_t k = n - 1; k <= n; k++) {
        assert_int_equal(check(head, k, n - 1, false, &v), HTTP_HEAD_REFUSE);
        assert_int_equal(v.status, 431);
        assert_string_equal(v.reason, "Request Header Fields Too Large");
        assert_string_equal(v.code, "request_header_too_large");
        char says[80];
        snprintf(says, sizeof says, "over %zu bytes", n - 1);
        assert_non_null(strstr(v.message, says));
        assert_non_null(strstr(v.message, "send smaller headers"));
    }
    // A head without a single LF: still 431 at the limit (431 before eof's 400).
    char line[64];
    memset(line, 'a', sizeof line);
    memcpy(line, "GET /", 5);
    assert_int_equal(check(line, sizeof line, sizeof line, true, &v), HTTP_HEAD_REFUSE);
    assert_int_equal(v.status, 431);
    assert_int_equal(check(line, sizeof line - 1, sizeof line, false, &v), HTTP_HEAD_MORE);
    // A fault within the limit is still told as itself.
    assert_int_equal(check(B("GET / HTTP/1.1\r\nBad Line\r\nX: y"), 30, false, &v),
                     HTTP_HEAD_REFUSE);
    assert_int_equal(v.status, 400);
    // Bytes past the limit are never read.
    assert_int_equal(check(B("GET / HTTP/1.1\r\nHost: a\r\nX\x00"), 26, false, &v),
                     HTTP_HEAD_REFUSE);
    assert_int_equal(v.status, 431);
    assert_int_equal(check(B("x"), 0, false, &v), HTTP_HEAD_REFUSE);
    assert_int_equal(v.status, 431);
}

// MHD spends its per-connection memory on every field: past
// HTTP_HEAD_MAX_FIELDS a head is 431 however short, and at it is taken.
static void too_many_header_fields_are_431(void **state)
{
    (void)state;
    char head[4096];
    int n = snprintf(head, sizeof head, "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 1; i < HTTP_HEAD_MAX_FIELDS; i++) n += snprintf(head + n, sizeof head - (size_t)n, "a: b\r\n");
    int end = n;
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    accepted(head, (size_t)n, (size_t)n);
    n = end + snprintf(head + end, sizeof head - (size_t)end, "a: b\r\n");
    // Refused on the field's line, before the head ends.
    refused_saying(head, (size_t)n, 431, "header fields");
}

static void hostile_bytes_are_refused_or_passed_safely(void **state)
{
    (void)state;
    refused(B("\x00\x00\x00\x00"), 400);
    refused(B("GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.1\x00\r\nHost: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.1\r\nHo\x00st: a\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.1\r\n\x00\r\n\r\n"), 400);
    refused(B("GET / HTTP/1.1\r\nX\xff: a\r\nHost: a\r\n\r\n"), 400);
    refused(B("\xff\xff\xff\xff"), 400);
    // A CR not followed by LF, wherever it is in the head.
    const char *says = "CR byte that is not followed by LF";
    refused_saying(B("GET / HTTP/1.1\rHost: a\r\n\r\n"), 400, says);
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n"), 400, says);
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\n\r\r\n"), 400, says);
    refused_saying(B("\r\rGET / HTTP/1.1\r\nHost: a\r\n\r\n"), 400, says);
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\r\n\r\n"), 400, says);
    refused_saying(B("GET / HTTP/1.1\r\nHost: a\r\n\rX"), 400, says); // before its line ends
    // 0x80-0xff in a path or a value is the application's business.
    accepted(B("GET /\xff\x80 HTTP/1.1\r\nHost: \xff\r\n\r\n"), 29);
    // Content-Length values no number type could hold, signs, lists.
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n"), 400);
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n"), 400);
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n"), 400);
    refused(B("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400);
}

static void quoted_client_bytes_are_escaped(void **state)
{
    (void)state;
    struct http_head_verdict v;
    refused_as(B("GET / HTTP/1.1\x00\xff'\\\r\nHost: a\r\n\r\n"), 400, &v);
    assert_non_null(strstr(v.message, "'HTTP/1.1\\x00\\xff\\x27\\x5c' is not an HTTP version"));
    // At most 40 bytes of a long header name, cut on a whole escape.
    char head[400] = "GET / HTTP/1.1\r\nHost: a\r\n";
    size_t n = strlen(head);
    for (int i = 0; i < 100; i++) head[n++] = i % 2 ? 'n' : '\x01';
    memcpy(head + n, ": v\r\n\r\n", 8);
    n += 7;
    refused_as(head, n, 400, &v);
    const char *q = strstr(v.message, "'");
    assert_non_null(q);
    const char *dots = strstr(q, "...'");
    assert_non_null(dots);
    for (const char *p = q + 1; p < dots;) { // whole escapes and 'n's only
        if (*p == 'n') {
            p++;
        } else {
            assert_memory_equal(p, "\\x01", 4);
            p += 4;
        }
    }
    assert_true(dots - q <= 1 + 40 * 4);
    assert_non_null(strstr(v.message, "right before the colon")); // the sentence is whole
    // A long line of nothing but escapes still leaves the sentence whole and within the array.
    char bad[300];
    memcpy(bad, "GET / HTTP/1.1\r\nHost: a\r\n", 25);
    memset(bad + 25, 0x80, 200);
    memcpy(bad + 225, "\r\n\r\n", 4);
    refused_as(bad, 229, 400, &v);
    assert_true(strlen(v.message) < sizeof v.message);
    assert_non_null(strstr(v.message, "right before the colon"));
}

// The promise a caller leans on: a refusal of some first bytes stands for
// all of them, whatever the bytes that follow.
static void a_refusal_of_a_prefix_holds_for_every_longer_input(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
    } inputs[] = {
        {B("GET / HTTP/2.0\r\nHost: a\r\n\r\n")},
        {B("GET / HTTP/2.0x\r\n\r\n")},
        {B("GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n")},
        {B("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: x\r\n\r\n")},
        {B("GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\r\n\r\n")},
        {B("GET / HTTP/1.1\r\nHost: a\r\n bad\rx\r\n\r\n")},
        {B("\r\n\r\n\rGET")},
    };
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++) {
        struct http_head_verdict whole, part;
        enum http_head_result r = check(inputs[i].s, inputs[i].n, LIMIT, false, &whole);
        for (size_t k = 0; k < inputs[i].n; k++)
            for (size_t limit = 16; limit <= LIMIT; limit += LIMIT - 16) {
                if (check(inputs[i].s, k, limit, false, &part) != HTTP_HEAD_REFUSE) continue;
                struct http_head_verdict w = whole;
                if (limit != LIMIT) check(inputs[i].s, inputs[i].n, limit, false, &w);
                else assert_int_equal(r, HTTP_HEAD_REFUSE);
                if (w.status != part.status)
                    fail_msg("input %zu cut at %zu: %d, whole %d", i, k, part.status, w.status);
            }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(acceptable_heads_are_taken),
        cmocka_unit_test(the_head_ends_at_the_first_blank_line),
        cmocka_unit_test(every_strict_prefix_of_an_acceptable_head_waits),
        cmocka_unit_test(a_head_cut_by_the_end_of_the_connection_is_a_400),
        cmocka_unit_test(malformed_request_lines_are_400),
        cmocka_unit_test(other_http_versions_are_505),
        cmocka_unit_test(malformed_header_lines_are_400),
        cmocka_unit_test(http_1_1_needs_exactly_one_host),
        cmocka_unit_test(content_length_is_one_plain_number),
        cmocka_unit_test(transfer_encoding_other_than_chunked_is_501),
        cmocka_unit_test(transfer_encoding_with_content_length_or_in_http_1_0_is_400),
        cmocka_unit_test(a_bad_line_is_refused_before_the_head_ends),
        cmocka_unit_test(a_head_over_the_limit_is_431_and_not_one_byte_before),
        cmocka_unit_test(too_many_header_fields_are_431),
        cmocka_unit_test(hostile_bytes_are_refused_or_passed_safely),
        cmocka_unit_test(quoted_client_bytes_are_escaped),
        cmocka_unit_test(a_refusal_of_a_prefix_holds_for_every_longer_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
