// http_head: owns the verdict on the head of a connection's first HTTP/1.x
// request (see http_head.h) — the request line, the header lines, and the
// framing headers (Host, Content-Length, Transfer-Encoding) read together at
// the head's end — and the sentence that tells the client what was wrong.
// The bytes are the client's: any value, NUL anywhere, a head cut anywhere,
// so every index below stays within the bytes examined and every length is
// a difference of two such indexes.
#include "server/http_head.h"

#include <stdint.h>
#include <string.h>

enum {
    METHOD_MAX = 32,    // longest method taken (the longest registered one is 17)
    QUOTE_MAX = 40,     // most client bytes quoted in a message
    LENGTH_DIGITS = 19, // 10^19 - 1 < 2^64: any 19 digits fit a uint64_t
};

// ---- bytes ------------------------------------------------------------------

// RFC 9110 5.6.2: the characters of a method or a field name.
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
        return true;
    default:
        return false;
    }
}

static bool is_ctl(unsigned char c) { return c < 0x20 || c == 0x7f; }

static bool is_ows(unsigned char c) { return c == ' ' || c == '\t'; }

// A field value may hold HTAB, SP, visible ASCII and obs-text (0x80-0xff):
// RFC 9110 5.5. Returns the index of the first byte it may not, or n.
static size_t first_bad_value_byte(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c != '\t' && is_ctl(c)) return i;
    }
    return n;
}

// s[0..n) equals lower (all lowercase ASCII) but for ASCII case.
static bool equals_caseless(const char *s, size_t n, const char *lower)
{
    if (n != strlen(lower)) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c - 'A' + 'a');
        if (c != (unsigned char)lower[i]) return false;
    }
    return true;
}

// Drops OWS from both ends of s[0..*n).
static const char *trim_ows(const char *s, size_t *n)
{
    while (*n && is_ows((unsigned char)s[0])) s++, (*n)--;
    while (*n && is_ows((unsigned char)s[*n - 1])) (*n)--;
    return s;
}

// Content-Length: 1 to 19 ASCII digits and nothing else (no sign, no list,
// no inner spaces: RFC 9110 8.6 allows a list of equal values, but MHD
// 0.9.75 would refuse one with its own page).
static bool parse_length(const char *s, size_t n, uint64_t *out)
{
    if (n < 1 || n > LENGTH_DIGITS) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < '0' || c > '9') return false;
        unsigned d = (unsigned)(c - '0');
        // 19 digits cannot overflow; the check keeps that true if LENGTH_DIGITS grows.
        if (x > (UINT64_MAX - d) / 10) return false;
        x = x * 10 + d;
    }
    *out = x;
    return true;
}

// ---- the sentence -----------------------------------------------------------

// v->message as it is written: always NUL-terminated, never past its end.
struct say {
    char *s;
    size_t cap, len; // len < cap
};

static void say_char(struct say *m, char c)
{
    if (m->len + 1 < m->cap) m->s[m->len++] = c;
    m->s[m->len] = 0;
}

// This file's own text (printable ASCII); cut short rather than overflow.
static void say_text(struct say *m, const char *t)
{
    for (; *t; t++) say_char(m, *t);
}

static void say_uint(struct say *m, uint64_t x)
{
    char d[20]; // 2^64 - 1 has 20 digits
    size_t k = 0;
    do d[k++] = (char)('0' + x % 10), x /= 10;
    while (x && k < sizeof d);
    while (k) say_char(m, d[--k]);
}

// Whether a quoted byte is written as \xNN: all but 0x20-0x7e, and the quote
// and the backslash themselves, so that a quote cannot be confused with the
// sentence around it.
static bool escaped(unsigned char c) { return c < 0x20 || c > 0x7e || c == '\'' || c == '\\'; }

// Writes c as \xNN (and a NUL) into out.
static void hex_escape(char out[5], unsigned char c)
{
    static const char hex[] = "0123456789abcdef";
    out[0] = '\\';
    out[1] = 'x';
    out[2] = hex[c >> 4];
    out[3] = hex[c & 15];
    out[4] = 0;
}

static void say_escape(struct say *m, unsigned char c)
{
    char x[5];
    if (!escaped(c)) {
        say_char(m, (char)c);
        return;
    }
    hex_escape(x, c);
    say_text(m, x);
}

// Client bytes b[0..n), escaped: at most QUOTE_MAX of them, and no more
// than leave `keep` characters of room for the rest of the sentence; a cut
// is marked "..." and falls between whole escapes.
static void say_quote(struct say *m, const char *b, size_t n, size_t keep)
{
    size_t room = m->cap - 1 - m->len; // len < cap, so no wrap
    room = room > keep ? room - keep : 0;
    size_t take = n < QUOTE_MAX ? n : QUOTE_MAX, width = 0;
    for (size_t i = 0; i < take; i++) width += escaped((unsigned char)b[i]) ? 4 : 1;
    bool cut = take < n || width > room;
    if (cut) room = room > 3 ? room - 3 : 0; // the "..."
    for (size_t i = 0; i < take; i++) {
        size_t w = escaped((unsigned char)b[i]) ? 4 : 1;
        if (w > room) break;
        say_escape(m, (unsigned char)b[i]);
        room -= w;
    }
    if (cut) say_text(m, "...");
}

// Starts a refusal: v's status, reason and code; the caller writes the sentence.
static struct say refuse(struct http_head_verdict *v, int status)
{
    v->status = status;
    switch (status) {
    case 431:
        v->reason = "Request Header Fields Too Large";
        v->code = "request_header_too_large";
        break;
    case 501:
        v->reason = "Not Implemented";
        v->code = "unsupported_transfer_encoding";
        break;
    case 505:
        v->reason = "HTTP Version Not Supported";
        v->code = "http_version_not_supported";
        break;
    default:
        v->status = 400;
        v->reason = "Bad Request";
        v->code = "malformed_request";
        break;
    }
    v->head_len = 0;
    v->message[0] = 0;
    return (struct say){v->message, sizeof v->message, 0};
}

// A refusal whose sentence is before 'quote' after: the quote shrinks so
// that the whole sentence fits.
static enum http_head_result refuse_quoting(struct http_head_verdict *v, int status,
                                            const char *before, const char *q, size_t qn,
                                            const char *after)
{
    struct say m = refuse(v, status);
    say_text(&m, before);
    say_char(&m, '\'');
    say_quote(&m, q, qn, 1 + strlen(after));
    say_char(&m, '\'');
    say_text(&m, after);
    return HTTP_HEAD_REFUSE;
}

static enum http_head_result refuse_text(struct http_head_verdict *v, int status, const char *text)
{
    struct say m = refuse(v, status);
    say_text(&m, text);
    return HTTP_HEAD_REFUSE;
}

// ---- the head, line by line ---------------------------------------------------

enum field_kind { FIELD_NONE, FIELD_OTHER, FIELD_HOST, FIELD_LENGTH, FIELD_CODING };

// The field the last header line began; obs-fold lines continue its value.
struct field {
    enum field_kind kind; // FIELD_NONE before the first header line
    const char *name;
    size_t name_len;
    size_t pieces;            // non-empty OWS-trimmed pieces of the value (its line's, each fold's)
    const char *first, *end;  // from the first piece to the end of the last (quoted)
    bool good;                // Content-Length: the first piece is a length; TE: it is "chunked"
    uint64_t length;          // Content-Length: that length
};

struct head {
    bool in_headers; // the request line has been taken
    unsigned minor;  // its HTTP/1.minor
    struct field cur;
    // The framing headers, counted as each field ends (only complete lines count).
    size_t fields;   // header lines that began a field
    size_t hosts, lengths, codings;
    bool length_set, length_bad, lengths_differ, coding_other;
    uint64_t length; // the first good Content-Length
    const char *bad_length, *bad_coding; // the first bad one's value, quoted
    size_t bad_length_n, bad_coding_n;
};

static void field_piece(struct field *f, const char *s, size_t n)
{
    s = trim_ows(s, &n);
    if (!n) return;
    if (f->pieces++ == 0) {
        f->first = s;
        if (f->kind == FIELD_LENGTH) f->good = parse_length(s, n, &f->length);
        if (f->kind == FIELD_CODING) f->good = equals_caseless(s, n, "chunked");
    }
    f->end = s + n;
}

// Counts the field that has just ended. A folded value is its pieces joined
// by spaces, so only a single piece can be a length or "chunked".
static void field_end(struct head *h)
{
    const struct field *f = &h->cur;
    bool one_good = f->pieces == 1 && f->good;
    size_t span = f->pieces ? (size_t)(f->end - f->first) : 0;
    switch (f->kind) {
    case FIELD_HOST:
        h->hosts++;
        break;
    case FIELD_LENGTH:
        h->lengths++;
        if (!one_good) {
            if (!h->length_bad) {
                h->length_bad = true;
                h->bad_length = f->first;
                h->bad_length_n = span;
            }
        } else if (!h->length_set) {
            h->length_set = true;
            h->length = f->length;
        } else if (f->length != h->length) {
            h->lengths_differ = true;
        }
        break;
    case FIELD_CODING:
        h->codings++;
        if (!one_good && !h->coding_other) {
            h->coding_other = true;
            h->bad_coding = f->first;
            h->bad_coding_n = span;
        }
        break;
    default:
        break;
    }
}

static enum http_head_result bad_request_line(struct http_head_verdict *v, const char *what,
                                              const char *q, size_t qn, const char *after)
{
    char before[160] = "the request line must be 'METHOD /path HTTP/1.1', but ";
    size_t k = strlen(before), w = strlen(what);
    if (w < sizeof before - k) memcpy(before + k, what, w + 1);
    if (!q) return refuse_text(v, 400, before);
    return refuse_quoting(v, 400, before, q, qn, after);
}

// The request line s[0..len) (len > 0, no CR, no LF); whole: its LF has
// come, else more of it may. A fault is refused only when no more bytes
// could mend it, so that a refusal of a prefix holds for the whole.
static enum http_head_result request_line(struct head *h, const char *s, size_t len, bool whole,
                                          struct http_head_verdict *v)
{
    // method SP
    size_t m = 0;
    while (m < len && is_tchar((unsigned char)s[m])) m++;
    if (m > METHOD_MAX || (m < len && (m == 0 || s[m] != ' '))) {
        const char *sp = memchr(s, ' ', len);
        size_t qn = sp ? (size_t)(sp - s) : len;
        return bad_request_line(v, "the method ", s, qn,
                                " is not 1 to 32 letters, digits or !#$%&'*+-.^_`|~");
    }
    if (m == len) return whole ? bad_request_line(v, "it ends after the method", NULL, 0, "")
                               : HTTP_HEAD_MORE;
    // request-target SP: no SP or CTL; obs-text is the application's business
    size_t t = m + 1, te = t;
    while (te < len && s[te] != ' ' && !is_ctl((unsigned char)s[te])) te++;
    if (te < len && s[te] != ' ') {
        char what[48] = "the path has the control byte ";
        hex_escape(what + strlen(what), (unsigned char)s[te]);
        return bad_request_line(v, what, NULL, 0, "");
    }
    if (te == t && te < len)
        return bad_request_line(v, "two spaces follow the method", NULL, 0, "");
    if (te == len) {
        if (!whole) return HTTP_HEAD_MORE;
        return bad_request_line(v, te == t ? "it ends after the method"
                                           : "it has no HTTP version after the path",
                                NULL, 0, "");
    }
    // HTTP-version: "HTTP/" DIGIT "." DIGIT, then the end of the line
    static const char pattern[] = "HTTP/1.1";
    const size_t pn = sizeof pattern - 1;
    const char *ver = s + te + 1;
    size_t vn = len - (te + 1), i = 0;
    for (; i < vn && i < pn; i++) {
        unsigned char c = (unsigned char)ver[i];
        bool ok = (i == 5 || i == 7) ? (c >= '0' && c <= '9') : c == (unsigned char)pattern[i];
        if (!ok) break;
    }
    if (i < vn || (whole && vn < pn)) {
        if (!vn) return bad_request_line(v, "it has no HTTP version after the path", NULL, 0, "");
        if (memchr(ver, ' ', vn))
            return bad_request_line(
                v, "it has more than two spaces (send a space in the path as %20)", NULL, 0, "");
        return bad_request_line(v, "", ver, vn, " is not an HTTP version");
    }
    if (!whole) return HTTP_HEAD_MORE;
    if (ver[5] != '1') {
        char after[96] = ", not HTTP/";
        size_t k = strlen(after);
        // Two digits and a dot: printable, so written as they came.
        after[k] = ver[5];
        after[k + 1] = '.';
        after[k + 2] = ver[7];
        after[k + 3] = 0;
        struct say msg = refuse(v, 505);
        say_text(&msg, "this server speaks HTTP/1.1 (and HTTP/1.0)");
        say_text(&msg, after);
        say_text(&msg, "; send HTTP/1.1 requests (curl: --http1.1)");
        return HTTP_HEAD_REFUSE;
    }
    h->minor = (unsigned)(ver[7] - '0');
    return HTTP_HEAD_MORE;
}

// A control byte in the value of the field named name.
static enum http_head_result bad_value(struct http_head_verdict *v, const char *name,
                                       size_t name_len, unsigned char c)
{
    char after[64] = " has the control byte ";
    size_t k = strlen(after);
    hex_escape(after + k, c);
    memcpy(after + k + 4, " in its value", sizeof " in its value");
    return refuse_quoting(v, 400, "the header ", name, name_len, after);
}

// A header line s[0..len) (len > 0, no CR, no LF); whole as for request_line.
static enum http_head_result header_line(struct head *h, const char *s, size_t len, bool whole,
                                         struct http_head_verdict *v)
{
    // obs-fold (RFC 9112 5.2 lets a server refuse it): MHD 0.9.75 joins a
    // continuation to the header's name, not its value, so "Content-: 5" and
    // " Length" would frame the body for MHD by a header this check never
    // saw, and a request could be smuggled past it.
    if (is_ows((unsigned char)s[0]))
        return refuse_text(v, 400, "a header line starts with whitespace (an obsolete line fold); "
                                   "send each header on one line");
    size_t c = 0;
    while (c < len && is_tchar((unsigned char)s[c])) c++;
    if (c == len && !whole) return HTTP_HEAD_MORE;
    if (c == len || c == 0 || s[c] != ':')
        return refuse_quoting(v, 400, "the header line ", s, len,
                              " must be 'Name: value', a name of letters, digits or "
                              "!#$%&'*+-.^_`|~ right before the colon");
    const char *val = s + c + 1;
    size_t vn = len - (c + 1);
    size_t b = first_bad_value_byte(val, vn);
    if (b < vn) return bad_value(v, s, c, (unsigned char)val[b]);
    if (!whole) return HTTP_HEAD_MORE;
    // MHD keeps each field in its per-connection memory: many short ones
    // fill it long before the byte limit does, and it would answer 431
    // with its own page.
    if (++h->fields > HTTP_HEAD_MAX_FIELDS) {
        struct say m = refuse(v, 431);
        say_text(&m, "the request has more than ");
        say_uint(&m, HTTP_HEAD_MAX_FIELDS);
        say_text(&m, " header fields; send fewer");
        return HTTP_HEAD_REFUSE;
    }
    field_end(h);
    h->cur = (struct field){.kind = FIELD_OTHER, .name = s, .name_len = c};
    if (equals_caseless(s, c, "host")) h->cur.kind = FIELD_HOST;
    if (equals_caseless(s, c, "content-length")) h->cur.kind = FIELD_LENGTH;
    if (equals_caseless(s, c, "transfer-encoding")) h->cur.kind = FIELD_CODING;
    field_piece(&h->cur, val, vn);
    return HTTP_HEAD_MORE;
}

// The head has ended: the framing headers, taken together. The order is
// fixed (every 400 before a 501) so that one head always gets one answer.
static enum http_head_result head_end(struct head *h, struct http_head_verdict *v)
{
    field_end(h);
    if (h->hosts > 1)
        return refuse_text(v, 400, "the request has more than one Host header; send exactly one");
    if (h->minor >= 1 && h->hosts == 0)
        return refuse_text(v, 400, "HTTP/1.1 requests must send a Host header "
                                   "(for example 'Host: localhost')");
    if (h->length_bad)
        return refuse_quoting(v, 400, "Content-Length must be 1 to 19 digits (no sign, list or "
                                      "spaces), not ",
                              h->bad_length, h->bad_length_n, "");
    if (h->lengths_differ)
        return refuse_text(v, 400, "the request has Content-Length headers with different values; "
                                   "send one");
    if (h->codings && h->minor == 0)
        return refuse_text(v, 400, "an HTTP/1.0 request cannot use Transfer-Encoding; "
                                   "send Content-Length");
    if (h->codings && h->lengths)
        return refuse_text(v, 400, "the request has both Transfer-Encoding and Content-Length, "
                                   "which frame the body two ways; send one of them");
    if (h->codings > 1)
        return refuse_text(v, 501, "this server takes a single 'Transfer-Encoding: chunked' "
                                   "header, not several; send Content-Length or "
                                   "'Transfer-Encoding: chunked'");
    if (h->coding_other)
        return refuse_quoting(v, 501, "this server does not implement Transfer-Encoding ",
                              h->bad_coding, h->bad_coding_n,
                              "; send Content-Length or 'Transfer-Encoding: chunked'");
    return HTTP_HEAD_OK;
}

enum http_head_result http_head_check(const char *buf, size_t n, size_t limit, bool eof,
                                      struct http_head_verdict *v)
{
    *v = (struct http_head_verdict){.status = 0, .reason = "", .code = ""};
    if (!buf) n = 0;
    // Bytes past the limit are never read: a head not ended within it is 431.
    const size_t seen = n < limit ? n : limit;
    struct head h = {0};
    size_t at = 0; // where the next line starts; at <= seen
    while (at < seen) {
        const char *line = buf + at;
        const char *lf = memchr(line, '\n', seen - at);
        bool whole = lf != NULL;
        size_t len = whole ? (size_t)(lf - line) : seen - at;
        // A CR ends a line only right before its LF. One that is the last byte
        // examined may still be, so it is left undecided.
        if (len && line[len - 1] == '\r') len--;
        // MHD (like other servers) would end a line at a lone CR, and we would
        // not: refusing it leaves no head that the two could read differently.
        if (memchr(line, '\r', len))
            return refuse_text(v, 400, "the request head has a CR byte that is not followed by LF; "
                                       "end each line with CRLF");
        enum http_head_result r = HTTP_HEAD_MORE;
        if (!h.in_headers) {
            // RFC 9112 2.2: empty lines before the request line are skipped.
            if (len) r = request_line(&h, line, len, whole, v);
            if (len && whole) h.in_headers = true;
        } else if (len) {
            r = header_line(&h, line, len, whole, v);
        } else if (whole) {
            r = head_end(&h, v);
            if (r == HTTP_HEAD_OK) v->head_len = (size_t)(lf - buf) + 1;
            return r;
        }
        if (r != HTTP_HEAD_MORE) return r;
        if (!whole) break;
        at = (size_t)(lf - buf) + 1; // lf < buf + seen, so at <= seen
    }
    if (n >= limit) {
        struct say m = refuse(v, 431);
        say_text(&m, "the request head is over ");
        say_uint(&m, limit);
        say_text(&m, " bytes; send smaller headers");
        return HTTP_HEAD_REFUSE;
    }
    if (eof)
        return refuse_text(v, 400, "the connection was shut before the request headers ended "
                                   "(a blank line ends them)");
    return HTTP_HEAD_MORE;
}
