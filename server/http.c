// http: libmicrohttpd glue. A front gate accepts connections itself and
// checks each one's first request head (server/http_head) before handing it
// to MHD, so that a head MHD would refuse with its own HTML page, and a
// connection over a limit, get the OpenAI error envelope instead. Routing,
// auth and bodies in the access handler; deferred and streamed responses
// suspend their connection and are resumed by http_async_wake; a watcher
// thread notices clients that hang up while suspended (MHD does not), keeps
// idle streams alive with SSE comments, and closes connections whose request
// does not arrive in time. What one client may hold (connections, buffered
// body bytes) is counted per address here, since MHD only counts connections.
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "base/base.h"
#include "server/http_head.h"

#define MAX_EXTRA_HEADERS 4
#define STREAM_BLOCK 16384
#define PEER_BUCKETS 1024
// The most bytes a request head may take (431 beyond; nginx's default is
// 32 KiB too). It must fit MHD's per-connection memory (128 KiB, half of it
// its first read buffer) with room to spare, so that what the gate passes
// MHD takes too; and since peeking consumes nothing, the whole of it must fit
// the socket's receive window (about 64 KiB with Linux's default buffers),
// or a head at the limit would neither end nor reach it.
#define HEAD_MAX (32 * 1024)
// A refused connection is read and discarded for this long (or this many
// bytes) after its answer, before it is closed: closing with unread bytes
// would reset the connection and could destroy the answer in flight.
#define LINGER_S 2.0
#define LINGER_BYTES (256 * 1024)
#define LINGER_MAX 256
// A head arriving in pieces is looked at again when its bytes have doubled
// since the last look, or after a wait that starts at PEEK_FIRST_WAIT_S and
// doubles with each look up to PEEK_MAX_WAIT_S: a client sending a byte at a
// time cannot make the gate copy and parse its whole head per byte.
#define PEEK_FIRST_WAIT_S 0.01
#define PEEK_MAX_WAIT_S 1.0
// A connection handed to MHD and not announced within this long was dropped
// by MHD without a word (its set-up failed on the worker thread).
#define HANDOFF_STALE_S 30.0
// A body declared over --max-request-body by at most this much is read and
// dropped before its 413 (see head_acceptable).
#define BODY_DISCARD_MAX (16u << 20)

// One client address: what its connections hold together (under s->cmu).
#define PEER_KEY_MAX (INET6_ADDRSTRLEN + 4) // an address, or an IPv6 /64 ("2001:db8::/64")

struct http_peer {
    char addr[PEER_KEY_MAX];
    int conns;
    size_t buffered;             // body bytes reserved by its requests
    struct http_peer *next;      // hash chain
};

// Where a connection is in its request, for the deadlines.
enum conn_phase {
    PHASE_HEAD,                  // waiting for the first request's headers (since accept)
    PHASE_IDLE,                  // kept alive after a response, waiting for the next request
    PHASE_BODY,                  // headers in, body arriving
    PHASE_BUSY,                  // request whole: the handler and the response, no deadline
};

// One TCP connection: MHD's socket context, listed in s->conns (under s->cmu).
struct http_conn {
    int fd;
    struct http_peer *peer;
    enum conn_phase phase;
    double since;                // when the phase began
    bool timed_out;              // the watcher closed it for a deadline
    double handed;               // when the gate handed it to MHD
    struct http_conn *prev, *next; // in s->conns, or (singly) in s->handoff
};

// A connection the gate accepted and has not handed to MHD yet: its first
// request head is arriving, or it was refused and is lingering before close.
// The gate thread's alone.
struct gate_conn {
    int fd;
    struct sockaddr_storage sa;
    socklen_t salen;
    struct http_conn *k;         // its accounting (counted in s->n_conns and its peer)
    double since;                // accepted at; once closing, answered at
    double next_peek;            // when to look again at bytes that did not double
    double peek_wait;            // the wait after the next look that finds no end
    size_t peeked;               // bytes seen at the last look
    bool dirty;                  // bytes arrived that have not been looked at yet
    bool eof;                    // the client shut its side (or the socket failed)
    bool closing;                // answered and shut for writing: reading what is left
    size_t drained;
    struct gate_conn *prev, *next;
};

struct http_server {
    struct MHD_Daemon *d;
    struct http_opts o;
    char **api_keys;             // (n_api_keys) our copies
    int n_api_keys;
    char **hosts;                // allowed Host names (n_hosts), lower case
    int n_hosts;
    int port;
    int listen_fd;
    pthread_mutex_t cmu;         // guards conns, handoff, n_conns, peers, buffered, last_refusal_log
    struct http_conn *conns;
    struct http_conn *handoff;   // handed to MHD, which has not announced them yet
    unsigned n_conns;            // open connections, the gate's and MHD's (max_connections)
    struct http_peer *peers[PEER_BUCKETS];
    size_t buffered;             // body bytes reserved, all connections
    double last_refusal_log;
    long refusals_unlogged;
    // The request workers: POST handlers (parsing, templates, tokenizing)
    // run here, so that a slow one never holds an HTTP thread that other
    // connections' streams are written from.
    pthread_t *workers;
    int n_workers;
    pthread_mutex_t wmu;         // guards the queue and wquit
    pthread_cond_t wcv;
    struct http_request *q_head, *q_tail;
    bool wquit;
    // The front gate: its thread accepts on listen_fd and holds each new
    // connection until its first request head is known good.
    int gate_ep, gate_ev;
    pthread_t gate;
    bool gate_started;
    struct gate_conn *gate_list;
    int gate_closing;            // gate_list's refused ones, lingering
    bool gate_any_dirty;
    atomic_bool gate_quit;
    double gate_paused_until;    // accept paused (out of descriptors) until then
    char *peek;                  // HEAD_MAX bytes
    int epfd, evfd;
    pthread_t watcher;
    bool watcher_started;
    atomic_bool quit;
    atomic_bool stopping;
    atomic_int n_requests;       // begun (the access handler ran) and not completed
    pthread_mutex_t mu;          // guards the list of open asyncs
    struct http_async *head;
    int n_open;
    uint64_t next_id;
};

struct http_request {
    struct http_server *s;
    struct MHD_Connection *c;
    struct http_conn *conn;      // NULL when the connection could not be tracked
    const struct http_route *route;
    char method[16];
    char *path;
    char peer[64];
    struct ms_buf body;          // capped at max_body
    size_t reserved;             // of the body budgets (s->buffered, the peer's)
    bool started;                // the access handler has run (else MHD refused the request itself)
    bool raw_nul;                // the undecoded path had %00
    bool http11;                 // HTTP/1.1 or later: 1xx responses are understood
    bool too_large, responded, dispatched;
    bool settled;                // the final call returned once before dispatching (on_access)
    bool busy, busy_per_client;  // the body is over a budget, declared or arriving (503)
    bool late;                   // refused from its head, answered once its body is dropped
    struct oa_error late_err;
    size_t declared;             // Content-Length, when one was sent
    // On a worker: the connection is suspended and responses are built into
    // pending, queued by the connection's thread once the worker resumes it.
    bool offloaded, handled;
    struct MHD_Response *pending;
    struct http_request *q_next;
    int status;
    double t0;
    int prompt_tokens, completion_tokens;
    int n_hdr;
    struct {
        char name[40];
        char value[160];
    } hdr[MAX_EXTRA_HEADERS];
    struct cors_headers cors;    // what every response to an allowed Origin carries
    struct http_async *async;    // the connection's reference
};

struct http_async {
    struct http_server *s;
    struct MHD_Connection *c;
    const struct http_async_ops *ops;
    void *ctx;
    bool streaming;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending;                // woken since the last fill/ready
    bool suspended;              // we suspended the connection and nobody resumed it yet
    bool closed;                 // the request completed
    bool complete;               // fill said the stream is complete
    bool gone_sent;
    bool gone_seen;              // the watcher saw the hang-up
    bool half_closed;            // the peer shut its sending side; only a real hang-up cancels
    bool probe_due;              // deferred: write a 100 Continue when suspending, to learn
                                 // whether the peer is still there (a closed one answers RST)
    bool http11;
    int in_gone;                 // gone() calls running on the watcher
    bool keepalive_due;
    double last_out;
    struct ms_buf out;           // streams: bytes not yet handed to MHD (connection thread only)
    size_t off;
    // watcher registration (under s->mu)
    uint64_t id;
    int fd;
    bool listed, watched;
    struct http_async *prev, *next;
    atomic_int log_prompt, log_completion;
};

// ---- peers, connections and the body budgets ------------------------------------------

static void addr_text(const struct sockaddr *sa, char *out, size_t len)
{
    out[0] = 0;
    if (!sa) return;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)len);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out,
                  (socklen_t)len);
}

static struct http_peer **peer_slot(struct http_server *s, const char *addr)
{
    uint32_t h = 2166136261u; // FNV-1a
    for (const char *p = addr; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    struct http_peer **pp = &s->peers[h % PEER_BUCKETS];
    while (*pp && strcmp((*pp)->addr, addr)) pp = &(*pp)->next;
    return pp;
}

// Under s->cmu. The peer of addr, created when new; NULL when out of memory.
static struct http_peer *peer_get(struct http_server *s, const char *addr)
{
    struct http_peer **pp = peer_slot(s, addr);
    if (*pp) return *pp;
    struct http_peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    *pp = p;
    return p;
}

// Under s->cmu: forgets p once nothing of it is left.
static void peer_put(struct http_server *s, struct http_peer *p)
{
    if (p->conns || p->buffered) return;
    struct http_peer **pp = peer_slot(s, p->addr);
    if (*pp == p) {
        *pp = p->next;
        free(p);
    }
}

// Whether n more bytes of r's body fit the body budgets (all connections',
// and its address's); with take, they are taken when they do. False, with
// nothing taken, when either would go over (*per_client says which).
static bool budget_check(struct http_request *r, size_t n, bool take, bool *per_client)
{
    struct http_server *s = r->s;
    struct http_peer *p = r->conn ? r->conn->peer : NULL;
    size_t all, mine = 0;
    pthread_mutex_lock(&s->cmu);
    bool ok = !ms_add_overflow(s->buffered, n, &all) &&
              (!s->o.max_buffered_bytes || all <= s->o.max_buffered_bytes);
    *per_client = ok && p &&
                  (ms_add_overflow(p->buffered, n, &mine) ||
                   (s->o.max_buffered_bytes_per_client && mine > s->o.max_buffered_bytes_per_client));
    if (take && ok && !*per_client) {
        s->buffered = all;
        if (p) p->buffered = mine;
        r->reserved += n;
    }
    pthread_mutex_unlock(&s->cmu);
    return ok && !*per_client;
}

static void budget_give_back(struct http_request *r)
{
    if (!r->reserved) return;
    struct http_server *s = r->s;
    pthread_mutex_lock(&s->cmu);
    s->buffered -= r->reserved;
    if (r->conn) {
        r->conn->peer->buffered -= r->reserved;
        peer_put(s, r->conn->peer);
    }
    pthread_mutex_unlock(&s->cmu);
    r->reserved = 0;
}

static void body_free(struct http_request *r)
{
    ms_buf_free(&r->body);
    budget_give_back(r);
}

// Many refusals in a burst make one log line a second, with the count.
static void log_refusal(struct http_server *s, const char *peer, const char *why)
{
    double now = ms_now();
    pthread_mutex_lock(&s->cmu);
    bool say = now - s->last_refusal_log >= 1.0;
    long more = s->refusals_unlogged;
    if (say) {
        s->last_refusal_log = now;
        s->refusals_unlogged = 0;
    } else {
        s->refusals_unlogged++;
    }
    pthread_mutex_unlock(&s->cmu);
    if (say)
        ms_log(MS_LOG_WARN, "%s: %s%s", peer, why,
               more ? " (and more refusals in the last second)" : "");
}

// The error envelope as a whole HTTP/1.1 response that closes the
// connection, written straight to the socket: the gate's (MHD does not hold
// it), or one whose request MHD has written nothing for yet. Its buffer
// takes these few hundred bytes at once; what it would not take is dropped
// rather than waited for (the caller shuts the socket after it).
static void raw_answer(int fd, int http, const char *reason, const char *code, const char *msg)
{
    struct oa_error e;
    memset(&e, 0, sizeof e);
    oa_error_http(&e, http, code, NULL, "%s", msg);
    json_t *j = oa_error_json(&e);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%s"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                     http, reason, http == 503 ? "Retry-After: 1\r\n" : "",
                     body ? strlen(body) : 0);
    if (n > 0 && (size_t)n < sizeof head && send(fd, head, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) == n &&
        body)
        send(fd, body, strlen(body), MSG_DONTWAIT | MSG_NOSIGNAL);
    free(body);
}

// Under s->cmu: k no longer counts against the connection limits.
static void conn_uncount(struct http_server *s, struct http_conn *k)
{
    k->peer->conns--;
    s->n_conns--;
    peer_put(s, k->peer);
}

// MHD announces a connection the gate handed it (STARTED, on the thread
// that will serve it) and its end (CLOSED): the connection's accounting
// moves from the hand-off list to s->conns, and is released at the end.
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct http_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct http_conn *k = *socket_context;
        if (!k) return;
        *socket_context = NULL;
        pthread_mutex_lock(&s->cmu);
        if (k->prev) k->prev->next = k->next;
        else s->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        conn_uncount(s, k);
        pthread_mutex_unlock(&s->cmu);
        free(k);
        return;
    }
    const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!fi) return;
    pthread_mutex_lock(&s->cmu);
    struct http_conn **pp = &s->handoff;
    while (*pp && (*pp)->fd != fi->connect_fd) pp = &(*pp)->next;
    struct http_conn *k = *pp;
    if (k) {
        *pp = k->next;
        k->prev = NULL;
        k->next = s->conns;
        if (s->conns) s->conns->prev = k;
        s->conns = k;
    }
    pthread_mutex_unlock(&s->cmu);
    if (!k) {
        // Every connection comes through the gate, which lists it first; one
        // that is not listed would escape the limits and the deadlines.
        shutdown(fi->connect_fd, SHUT_RDWR);
        return;
    }
    *socket_context = k;
}

static struct http_conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void conn_phase(struct http_server *s, struct http_conn *k, enum conn_phase ph)
{
    if (!k) return;
    pthread_mutex_lock(&s->cmu);
    k->phase = ph;
    k->since = ms_now();
    pthread_mutex_unlock(&s->cmu);
}

// True when the peer has shut its side and nothing it sent is left unread:
// a connection waiting for a request that can never come.
static bool peer_left(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) != 1) return false;
    if (pf.revents & (POLLHUP | POLLERR)) return true;
    int unread = 0;
    return (pf.revents & POLLRDHUP) && ioctl(fd, FIONREAD, &unread) == 0 && unread == 0;
}

// From the watcher: closes connections past a deadline, and those waiting
// for a request whose client has gone (MHD would keep them until the idle
// timeout). shutdown() leaves the descriptor to MHD, which sees the end and
// closes it; a listed connection's descriptor is open (MHD tells us CLOSED,
// which waits for cmu, before it closes it).
static void conns_scan(struct http_server *s)
{
    double now = ms_now();
    pthread_mutex_lock(&s->cmu);
    for (struct http_conn *k = s->conns; k; k = k->next) {
        if (k->timed_out) continue;
        double age = now - k->since;
        const char *what = NULL, *flag = NULL;
        double limit = 0;
        // Between requests a kept-alive connection may wait as long as an
        // idle one may (a proxy's pool of them should close first); the
        // next request's headers still come under the same bound, since
        // MHD's idle timer restarts with every byte.
        double idle = s->o.idle_timeout_s > s->o.header_timeout_s ? s->o.idle_timeout_s
                                                                  : s->o.header_timeout_s;
        if (k->phase == PHASE_HEAD && s->o.header_timeout_s > 0 && age > s->o.header_timeout_s) {
            what = "headers";
            flag = "--request-header-timeout";
            limit = s->o.header_timeout_s;
        } else if (k->phase == PHASE_IDLE && s->o.header_timeout_s > 0 && age > idle) {
            what = "headers (kept alive)";
            flag = s->o.idle_timeout_s > s->o.header_timeout_s ? "--idle-timeout"
                                                                : "--request-header-timeout";
            limit = idle;
        } else if (k->phase == PHASE_BODY && s->o.body_timeout_s > 0 && age > s->o.body_timeout_s) {
            what = "body";
            flag = "--request-body-timeout";
            limit = s->o.body_timeout_s;
        } else if (k->phase != PHASE_BODY && k->phase != PHASE_BUSY && age >= 1.0 &&
                   peer_left(k->fd)) {
            shutdown(k->fd, SHUT_RDWR);
            k->timed_out = true;
            continue;
        }
        if (!what) continue;
        k->timed_out = true;
        shutdown(k->fd, SHUT_RDWR);
        // Idle keep-alive connections end this way too, so only a body cut short is news.
        ms_log(k->phase == PHASE_BODY ? MS_LOG_WARN : MS_LOG_DEBUG,
               "%s: connection closed: request %s not in after %gs (%s)", k->peer->addr, what,
               limit, flag);
    }
    pthread_mutex_unlock(&s->cmu);
}

// ---- asyncs ----------------------------------------------------------------------------

static void async_unlist(struct http_server *s, struct http_async *a)
{
    pthread_mutex_lock(&s->mu);
    if (a->watched) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, a->fd, NULL);
        a->watched = false;
    }
    if (a->listed) {
        if (a->prev) a->prev->next = a->next;
        else s->head = a->next;
        if (a->next) a->next->prev = a->prev;
        a->listed = false;
        s->n_open--;
    }
    pthread_mutex_unlock(&s->mu);
}

void http_async_unref(struct http_async *a)
{
    if (!a) return;
    if (atomic_fetch_sub(&a->refs, 1) != 1) return;
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    ms_buf_free(&a->out);
    free(a);
}

void http_async_wake(struct http_async *a)
{
    pthread_mutex_lock(&a->mu);
    a->pending = true;
    bool resume = a->suspended && !a->closed;
    if (resume) a->suspended = false;
    pthread_mutex_unlock(&a->mu);
    // Outside our lock: MHD takes its own, and only we resume what we suspended.
    if (resume) MHD_resume_connection(a->c);
}

void http_async_set_log_tokens(struct http_async *a, int prompt, int completion)
{
    atomic_store(&a->log_prompt, prompt);
    atomic_store(&a->log_completion, completion);
}

// From the watcher: the peer hung up while we were waiting.
static void async_notify_gone(struct http_async *a)
{
    pthread_mutex_lock(&a->mu);
    // A response already complete has nothing left to cancel: the client
    // just closed after reading it.
    if (a->gone_sent || a->closed || a->complete) {
        pthread_mutex_unlock(&a->mu);
        return;
    }
    a->gone_sent = true;
    a->gone_seen = true;
    a->in_gone++;
    pthread_mutex_unlock(&a->mu);
    a->ops->gone(a->ctx);
    pthread_mutex_lock(&a->mu);
    a->in_gone--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static struct http_async *async_new(struct http_request *r, const struct http_async_ops *ops,
                                    void *ctx, bool streaming)
{
    struct http_server *s = r->s;
    if (r->async || r->responded || r->pending) return NULL;
    struct http_async *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->s = s;
    a->c = r->c;
    a->ops = ops;
    a->ctx = ctx;
    a->streaming = streaming;
    atomic_init(&a->refs, 2);
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->last_out = ms_now();
    a->fd = -1;
    a->http11 = r->http11;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&s->mu);
    a->id = ++s->next_id;
    a->next = s->head;
    if (s->head) s->head->prev = a;
    s->head = a;
    a->listed = true;
    s->n_open++;
    if (ci) {
        a->fd = ci->connect_fd;
        // Only hang-ups: EPOLLRDHUP (peer closed) plus the implicit HUP/ERR.
        struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = a->id};
        a->watched = epoll_ctl(s->epfd, EPOLL_CTL_ADD, a->fd, &ev) == 0;
    }
    pthread_mutex_unlock(&s->mu);
    r->async = a;
    return a;
}

// ---- responses ---------------------------------------------------------------------------

static void add_headers(struct http_request *r, struct MHD_Response *resp)
{
    // Stopping: a kept-alive client must not send its next request here.
    if (atomic_load(&r->s->stopping)) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    for (int i = 0; i < r->n_hdr; i++) MHD_add_response_header(resp, r->hdr[i].name, r->hdr[i].value);
    r->n_hdr = 0;
    for (int i = 0; i < r->cors.n; i++)
        MHD_add_response_header(resp, r->cors.h[i].name, r->cors.h[i].value);
}

// Queues resp now, or (on a worker) keeps it for the connection's thread.
static int respond_with(struct http_request *r, int status, struct MHD_Response *resp)
{
    if (r->offloaded) {
        r->pending = resp;
        r->status = status;
        return 0;
    }
    enum MHD_Result ok = MHD_queue_response(r->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ok != MHD_YES) return -1;
    r->responded = true;
    r->status = status;
    return 0;
}

int http_respond(struct http_request *r, int status, const char *content_type, const char *body,
                 size_t len)
{
    if (r->responded || r->pending) return -1;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!resp) return -1;
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    add_headers(r, resp);
    return respond_with(r, status, resp);
}

int http_respond_json(struct http_request *r, int status, json_t *j)
{
    if (!j) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        return http_respond(r, 500, "application/json", oom, sizeof oom - 1);
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!s) return http_respond_json(r, status, NULL);
    int rc = http_respond(r, status, "application/json", s, strlen(s));
    free(s);
    return rc;
}

int http_respond_error(struct http_request *r, const struct oa_error *e)
{
    json_t *(*shape)(const struct oa_error *) =
        r->route && r->route->error_json ? r->route->error_json : oa_error_json;
    return http_respond_json(r, e->http, shape(e));
}

static void respond_simple_error(struct http_request *r, int http, const char *code,
                                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void respond_simple_error(struct http_request *r, int http, const char *code,
                                 const char *fmt, ...)
{
    struct oa_error e;
    memset(&e, 0, sizeof e);
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof e.message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    oa_error_http(&e, http, code, NULL, "%s", msg);
    http_respond_error(r, &e);
}

void http_add_header(struct http_request *r, const char *name, const char *value)
{
    if (r->n_hdr >= MAX_EXTRA_HEADERS) return;
    snprintf(r->hdr[r->n_hdr].name, sizeof r->hdr[0].name, "%s", name);
    snprintf(r->hdr[r->n_hdr].value, sizeof r->hdr[0].value, "%s", value);
    r->n_hdr++;
}

void http_set_log_tokens(struct http_request *r, int prompt, int completion)
{
    r->prompt_tokens = prompt;
    r->completion_tokens = completion;
}

const char *http_method(const struct http_request *r) { return r->method; }
const char *http_path(const struct http_request *r) { return r->path; }

const char *http_path_rest(const struct http_request *r)
{
    if (!r->route || !r->route->prefix) return "";
    return r->path + strlen(r->route->path);
}

const char *http_header(const struct http_request *r, const char *name)
{
    return MHD_lookup_connection_value(r->c, MHD_HEADER_KIND, name);
}

const char *http_body(const struct http_request *r, size_t *len)
{
    if (len) *len = r->body.len;
    return r->body.data ? r->body.data : "";
}

// ---- streams -------------------------------------------------------------------------------

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct http_async *a = cls;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        if (a->off < a->out.len) {
            size_t n = a->out.len - a->off;
            if (n > max) n = max;
            memcpy(buf, a->out.data + a->off, n);
            a->off += n;
            if (a->off == a->out.len) {
                a->off = 0;
                ms_buf_reset(&a->out);
            }
            a->last_out = ms_now();
            pthread_mutex_unlock(&a->mu);
            return (ssize_t)n;
        }
        if (a->complete) {
            pthread_mutex_unlock(&a->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (a->closed) {
            pthread_mutex_unlock(&a->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (a->pending) {
            a->pending = false;
            pthread_mutex_unlock(&a->mu);
            // out is touched only on this connection's thread, so fill runs unlocked.
            bool done = a->ops->fill(a->ctx, &a->out);
            pthread_mutex_lock(&a->mu);
            if (done) a->complete = true;
            continue;
        }
        if (a->keepalive_due) {
            a->keepalive_due = false;
            static const char comment[] = ": keep-alive\n\n";
            if (ms_buf_append(&a->out, comment, sizeof comment - 1) == 0) continue;
        }
        if (atomic_load(&a->s->stopping)) {
            pthread_mutex_unlock(&a->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        a->suspended = true;
        MHD_suspend_connection(a->c);
        pthread_mutex_unlock(&a->mu);
        return 0;
    }
}

static void stream_free(void *cls)
{
    http_async_unref(cls);
}

struct http_async *http_defer(struct http_request *r, const struct http_async_ops *ops, void *ctx)
{
    return async_new(r, ops, ctx, false);
}

struct http_async *http_stream(struct http_request *r, int status, const char *content_type,
                               const struct http_async_ops *ops, void *ctx)
{
    struct http_async *a = async_new(r, ops, ctx, true);
    if (!a) return NULL;
    a->pending = true; // the first read fills
    atomic_fetch_add(&a->refs, 1); // the response's
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_reader, a, stream_free);
    if (!resp) {
        atomic_fetch_sub(&a->refs, 1);
        // The connection's reference goes at completion, with release.
        return a;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no"); // nginx: do not buffer SSE
    add_headers(r, resp);
    respond_with(r, status, resp);
    return a;
}

// ---- the access handler -------------------------------------------------------------------

static bool key_matches(const char *have, const char *want)
{
    // Constant time in the key's length, so timing does not leak a prefix.
    size_t hl = strlen(have), wl = strlen(want);
    unsigned diff = (unsigned)(hl ^ wl);
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(i < hl ? have[i] : 0);
    return diff == 0;
}

// Every key is compared, so the time does not say which one matched.
static bool key_among(const struct http_server *s, const char *have)
{
    bool ok = false;
    for (int i = 0; i < s->n_api_keys; i++) ok |= key_matches(have, s->api_keys[i]);
    return ok;
}

static bool authorized(struct http_request *r)
{
    if (!r->s->n_api_keys || r->route->public_) return true;
    const char *x = http_header(r, "x-api-key");
    if (x && key_among(r->s, x)) return true;
    const char *h = http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    return key_among(r->s, h);
}

static const struct http_route *find_route(struct http_server *s, const char *method,
                                           const char *path, bool *path_known, char *allow,
                                           size_t allow_len)
{
    *path_known = false;
    allow[0] = 0;
    const char *m = strcmp(method, "HEAD") ? method : "GET";
    const struct http_route *hit = NULL;
    for (int i = 0; i < s->o.n_routes; i++) {
        const struct http_route *rt = &s->o.routes[i];
        size_t pl = strlen(rt->path);
        if (rt->prefix ? strncmp(rt->path, path, pl) || !path[pl] : strcmp(rt->path, path)) continue;
        *path_known = true;
        size_t al = strlen(allow);
        snprintf(allow + al, allow_len - al, "%s%s", al ? ", " : "", rt->method);
        if (!strcmp(rt->method, m)) hit = rt;
    }
    return hit;
}

// Under a->mu, while MHD is not writing to the connection (suspended, or
// about to be): an interim 100 Continue, which HTTP/1.1 clients skip, makes
// a peer that has closed its socket answer with a reset, which the watcher
// sees as a hang-up; a peer that only half-closed reads on.
static void deferred_probe(struct http_async *a)
{
    static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    // Only into an empty send queue: a fuller one might take part of the
    // probe, and half an interim response would corrupt the real one.
    int queued = -1;
    if (a->http11 && a->fd >= 0 && !a->closed && ioctl(a->fd, SIOCOUTQ, &queued) == 0 && queued == 0)
        send(a->fd, probe, sizeof probe - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static enum MHD_Result wait_deferred(struct http_request *r)
{
    struct http_async *a = r->async;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        if (a->pending) {
            a->pending = false;
            pthread_mutex_unlock(&a->mu);
            a->ops->ready(a->ctx, r);
            if (r->responded) {
                pthread_mutex_lock(&a->mu);
                a->complete = true;
                pthread_mutex_unlock(&a->mu);
                return MHD_YES;
            }
            continue;
        }
        if (atomic_load(&r->s->stopping)) {
            pthread_mutex_unlock(&a->mu);
            respond_simple_error(r, 503, "service_unavailable", "the server is shutting down");
            return MHD_YES;
        }
        if (a->probe_due) {
            a->probe_due = false;
            deferred_probe(a);
        }
        a->suspended = true;
        MHD_suspend_connection(r->c);
        pthread_mutex_unlock(&a->mu);
        return MHD_YES;
    }
}

// The undecoded path has a NUL (%00): MHD would decode it and cut the path
// there, so "/health%00x" would be served as "/health".
static bool raw_path_has_nul(const char *uri)
{
    for (const char *p = uri; *p && *p != '?'; p++)
        if (p[0] == '%' && p[1] == '0' && p[2] == '0') return true;
    return false;
}

// MHD calls this with the request line's raw URI, before decoding it; what
// it returns becomes the request's context (and on_completed runs for it
// even when MHD refuses the request before our handler sees it).
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    struct http_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->s = cls;
    r->c = c;
    r->t0 = ms_now();
    r->raw_nul = raw_path_has_nul(uri);
    return r;
}

// The media type of a Content-Type value is application/json or
// application/<anything>+json (parameters such as charset may follow).
static bool is_json_type(const char *ct)
{
    if (!ct) return false;
    while (*ct == ' ' || *ct == '\t') ct++;
    size_t n = strcspn(ct, "; \t");
    if (n == 16 && !strncasecmp(ct, "application/json", 16)) return true;
    return n > 17 && !strncasecmp(ct, "application/", 12) && !strncasecmp(ct + n - 5, "+json", 5);
}

static bool host_allowed(const struct http_server *s, const char *host)
{
    if (!s->n_hosts) return true;
    if (!host) return false;
    // The name without the port: "[::1]:8000" -> "::1", "example.com:80" -> "example.com".
    char name[256];
    const char *end;
    if (host[0] == '[') {
        host++;
        end = strchr(host, ']');
    } else {
        end = strchr(host, ':');
    }
    size_t n = end ? (size_t)(end - host) : strlen(host);
    if (n >= sizeof name) return false;
    memcpy(name, host, n);
    name[n] = 0;
    if (n && name[n - 1] == '.') name[n - 1] = 0; // "localhost." is "localhost"
    for (int i = 0; i < s->n_hosts; i++)
        if (!strcmp(s->hosts[i], "*") || !strcasecmp(s->hosts[i], name)) return true;
    return false;
}

// What a body over the buffered-bytes budgets is told.
static void busy_message(char *msg, size_t len, bool per_client)
{
    snprintf(msg, len, "%s request bodies are being received; retry shortly (%s)",
             per_client ? "this address has too many bytes of" : "too many bytes of",
             per_client ? "--max-buffered-bytes-per-client" : "--max-buffered-bytes");
}

// 503 for a body over the buffered-bytes budgets, through MHD.
static void respond_busy(struct http_request *r, bool per_client)
{
    char msg[200];
    busy_message(msg, sizeof msg, per_client);
    http_add_header(r, "Retry-After", "1");
    respond_simple_error(r, 503, "server_busy", "%s", msg);
    log_refusal(r->s, r->peer[0] ? r->peer : "-", "body refused: over the buffered-bytes budget");
}

static void respond_too_large(struct http_request *r)
{
    if (r->declared)
        respond_simple_error(r, 413, "request_too_large",
                             "the request body is %zu bytes; this server takes at most %zu "
                             "(--max-request-body)",
                             r->declared, r->s->o.max_body);
    else
        respond_simple_error(r, 413, "request_too_large",
                             "the request body is over %zu bytes (--max-request-body)",
                             r->s->o.max_body);
}

// A refusal known from the head of a request with a body. Answered now, a
// client that sends its body at once (no Expect: 100-continue, as most
// SDKs) is still sending when the connection closes after the answer, and
// the close resets the connection: the client sees a broken pipe, and the
// reset can destroy the answer before it is read. So, where the body is
// chunked or declared within BODY_DISCARD_MAX, the answer is kept and sent
// once the body has been read and dropped (nothing of it is buffered or
// counted against the budgets); otherwise it goes now. Returns true when
// kept (the caller reads on), false after answering.
static bool refuse_after_body(struct http_request *r, bool drain, int http, const char *code,
                              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static bool refuse_after_body(struct http_request *r, bool drain, int http, const char *code,
                              const char *fmt, ...)
{
    char msg[sizeof r->late_err.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memset(&r->late_err, 0, sizeof r->late_err);
    oa_error_http(&r->late_err, http, code, NULL, "%s", msg);
    if (!drain) {
        http_respond_error(r, &r->late_err);
        return false;
    }
    r->late = true;
    return true;
}

// The checks that need only the request line and headers, in the order a
// client fixes them: a broken path, a host we do not serve, the route, the
// key, the body's type and size. Returns false after answering, true to
// read on (a refusal kept until the body is in: refuse_after_body).
// How a request frames its body, from every one of its headers.
struct framing {
    int n_length, n_coding;
    const char *length, *coding; // the first of each
    bool lengths_differ;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    struct framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (f->n_length++ == 0) f->length = value;
        else if (strcmp(f->length, value ? value : "")) f->lengths_differ = true;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        if (f->n_coding++ == 0) f->coding = value;
    }
    return MHD_YES;
}

// A kept-alive connection's later requests reach MHD without the gate's
// look at their heads (http_head): their framing is checked here as the
// gate checks it (RFC 9112 6.3), since MHD takes the first of two
// Content-Lengths, decodes chunked beside one and keeps the connection, and
// reads an unknown coding to the close: a request framed two ways would
// desync the connection behind a proxy that reads it the other way. The
// refusal closes the connection. (A folded header line MHD has already
// joined to a name cannot be seen here: the gate refuses folds in first
// requests, and nginx in front refuses them in every request.)
static bool framing_acceptable(struct http_request *r)
{
    struct framing f = {0};
    MHD_get_connection_values(r->c, MHD_HEADER_KIND, count_framing, &f);
    const char *why = NULL;
    int status = 400;
    if (f.lengths_differ) why = "Content-Length headers that differ";
    else if (f.n_coding && f.n_length) why = "both Transfer-Encoding and Content-Length";
    else if (f.n_coding && !r->http11) why = "Transfer-Encoding in HTTP/1.0";
    else if (f.n_coding > 1 || (f.n_coding && strcasecmp(f.coding ? f.coding : "", "chunked")))
        why = "a Transfer-Encoding other than one 'chunked'", status = 501;
    if (!why) return true;
    http_add_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    respond_simple_error(r, status, status == 501 ? "not_implemented" : "invalid_framing",
                         "the request frames its body by %s; send one Content-Length, or "
                         "Transfer-Encoding: chunked alone", why);
    return false;
}

static bool head_acceptable(struct http_request *r, const char *url, const char *method)
{
    struct http_server *s = r->s;
    if (!framing_acceptable(r)) return false;
    if (r->raw_nul) {
        respond_simple_error(r, 400, "invalid_path", "the request path has a NUL byte (%%00)");
        return false;
    }
    const char *host = http_header(r, MHD_HTTP_HEADER_HOST);
    if (!host_allowed(s, host)) {
        respond_simple_error(r, 403, "host_not_allowed",
                             "this server does not answer to the host name '%.100s' "
                             "(--allowed-hosts)",
                             host ? host : "");
        return false;
    }
    const char *origin = http_header(r, "Origin");
    cors_response_headers(s->o.cors, origin, &r->cors);
    const char *pf_method = http_header(r, "Access-Control-Request-Method");
    if (s->o.cors && !strcmp(method, "OPTIONS") && origin && pf_method) {
        // A preflight: answered for any path, before the key (browsers send none).
        char msg[400];
        int st = cors_preflight(s->o.cors, origin, pf_method,
                                http_header(r, "Access-Control-Request-Headers"), &r->cors, msg,
                                sizeof msg);
        if (st == 204) http_respond(r, 204, NULL, NULL, 0);
        else respond_simple_error(r, st, "cors_refused", "%s", msg);
        return false;
    }
    const char *cl = http_header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te = http_header(r, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    unsigned long long n = 0;
    if (cl) {
        char *end;
        errno = 0;
        n = strtoull(cl, &end, 10);
        if (errno || end == cl) n = ULLONG_MAX;
    }
    bool has_body = te || n > 0;
    r->declared = cl ? (size_t)n : 0;
    const char *expect = http_header(r, MHD_HTTP_HEADER_EXPECT);
    const bool waits = expect && !strcasecmp(expect, "100-continue");
    // Refusals below drop a body of up to this much first (refuse_after_body).
    const bool drain = has_body && !waits && (te || n <= BODY_DISCARD_MAX);
    bool known;
    char allow[128];
    r->route = find_route(s, method, url, &known, allow, sizeof allow);
    if (!r->route) {
        if (known) {
            http_add_header(r, "Allow", allow);
            return refuse_after_body(r, drain, 405, "method_not_allowed", "%s is not allowed on %s; use %s",
                                     method, url, allow);
        }
        return refuse_after_body(r, drain, 404, "not_found", "no such endpoint: %s %s", method, url);
    }
    if (!authorized(r)) {
        http_add_header(r, "WWW-Authenticate", "Bearer");
        return refuse_after_body(r, drain, 401, "invalid_api_key",
                                 "missing or wrong API key: send the header 'Authorization: Bearer "
                                 "<key>' (or 'x-api-key: <key>') with the key the server was started "
                                 "with");
    }
    if (has_body && !is_json_type(http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        const char *ct = http_header(r, MHD_HTTP_HEADER_CONTENT_TYPE);
        return refuse_after_body(r, drain, 415, "unsupported_media_type",
                                 "the body must be JSON sent with 'Content-Type: application/json'%s%.80s%s",
                                 ct ? " (got '" : " (no Content-Type was sent)", ct ? ct : "",
                                 ct ? "')" : "");
    }
    if (cl && n > s->o.max_body) {
        // As refuse_after_body, within BODY_DISCARD_MAX past the limit.
        if (!waits && n - s->o.max_body <= BODY_DISCARD_MAX) {
            r->too_large = true;
            return true;
        }
        respond_too_large(r);
        return false;
    }
    // A declared length is checked against the budgets now, so that a body
    // that cannot fit is refused before the client sends it; it is reserved
    // only as it arrives (take_upload), so that declaring a length without
    // sending the bytes holds nothing.
    bool per_client;
    if (cl && n && !budget_check(r, (size_t)n, false, &per_client)) {
        // As refuse_after_body: the 503 and its Retry-After go out once the
        // body has been read and dropped (take_upload discards a busy
        // request's bytes), so a client sending at once reads the answer
        // rather than a reset.
        if (drain) {
            r->busy = true;
            r->busy_per_client = per_client;
            return true;
        }
        respond_busy(r, per_client);
        return false;
    }
    return true;
}

static enum MHD_Result first_call(struct http_server *s, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, void **con_cls)
{
    struct http_request *r = *con_cls;
    if (!r) r = on_uri(s, url, c);
    if (!r) return MHD_NO;
    *con_cls = r;
    r->started = true;
    atomic_fetch_add(&s->n_requests, 1);
    r->conn = conn_of(c);
    r->http11 = version && strcmp(version, MHD_HTTP_VERSION_1_0) && strcmp(version, "HTTP/0.9");
    snprintf(r->method, sizeof r->method, "%s", method);
    // Behind a proxy that keeps its prefix (--root-path), "/api/v1/x" is "/v1/x".
    const char *root = s->o.root_path;
    size_t rl = root ? strlen(root) : 0;
    if (rl && !strncmp(url, root, rl) && (url[rl] == '/' || !url[rl])) url = url[rl] ? url + rl : "/";
    r->path = strdup(url);
    if (!r->path) return MHD_NO;
    conn_phase(s, r->conn, PHASE_BODY);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    addr_text(ci ? ci->client_addr : NULL, r->peer, sizeof r->peer);
    // Refused: answered, or (out of memory) the connection is dropped,
    // since a request without a route must not reach the handler.
    if (!head_acceptable(r, url, method) && !r->responded) return MHD_NO;
    return MHD_YES;
}

// A piece of the body: kept within max_body and the budgets, which are
// reserved as the buffer grows. Over a budget, the body is dropped and the
// request answered 503 once it is in (MHD takes no response mid-body).
static enum MHD_Result take_upload(struct http_request *r, const char *data, size_t n)
{
    struct http_server *s = r->s;
    if (r->responded || r->too_large || r->busy || r->late) return MHD_YES; // discarded
    size_t need;
    if (ms_add_overflow(r->body.len, n, &need) || need > s->o.max_body) {
        r->too_large = true;
        body_free(r);
        return MHD_YES;
    }
    // The buffer doubles from 4 KiB up to its max + 1 (the declared length,
    // else max_body): reserve what it will hold.
    size_t max = r->declared ? r->declared : s->o.max_body;
    size_t cap = 4096;
    while (cap < need + 1 && cap <= max) cap *= 2;
    if (cap > max + 1) cap = max + 1;
    bool per_client;
    if (cap > r->reserved && !budget_check(r, cap - r->reserved, true, &per_client)) {
        body_free(r);
        r->busy = true;
        // MHD takes no response mid-body, and the client may wait for one
        // before sending the rest. MHD has written nothing for this request
        // yet, so the 503 goes straight to the socket, which is then shut
        // for writing; the rest of the body is read and dropped, and the
        // connection closes once it is in (or its deadline passes).
        if (r->conn) {
            char msg[200];
            busy_message(msg, sizeof msg, per_client);
            raw_answer(r->conn->fd, 503, "Service Unavailable", "server_busy", msg);
            shutdown(r->conn->fd, SHUT_WR);
            r->status = 503;
            log_refusal(s, r->peer[0] ? r->peer : "-", "body refused: over the buffered-bytes budget");
        }
        r->busy_per_client = per_client;
        return MHD_YES;
    }
    r->body.max = max;
    return ms_buf_append(&r->body, data, n) ? MHD_NO : MHD_YES;
}

// On the connection's thread once the handler has run (here or on a worker):
// what it answered goes out, or the response waits.
static enum MHD_Result after_handler(struct http_request *r)
{
    if (r->pending) {
        struct MHD_Response *resp = r->pending;
        r->pending = NULL;
        if (respond_with(r, r->status, resp)) return MHD_NO;
    }
    if (r->responded) return MHD_YES;
    if (r->async && !r->async->streaming) return wait_deferred(r);
    if (r->async) return MHD_NO; // a stream that could not be queued
    respond_simple_error(r, 500, "internal_error", "the handler for %s %s gave no answer", r->method,
                         r->path);
    return MHD_YES;
}

// ---- the request workers -----------------------------------------------------------

// Hands r to a worker: the connection stays suspended until the handler has
// run. False (run it here) when there are no workers or they are stopping.
static bool worker_take(struct http_server *s, struct http_request *r)
{
    if (!s->n_workers) return false;
    pthread_mutex_lock(&s->wmu);
    bool ok = !s->wquit;
    if (ok) {
        r->offloaded = true;
        MHD_suspend_connection(r->c);
        r->q_next = NULL;
        if (s->q_tail) s->q_tail->q_next = r;
        else s->q_head = r;
        s->q_tail = r;
        pthread_cond_signal(&s->wcv);
    }
    pthread_mutex_unlock(&s->wmu);
    return ok;
}

static void *worker_main(void *arg)
{
    struct http_server *s = arg;
    pthread_setname_np(pthread_self(), "http-worker");
    for (;;) {
        pthread_mutex_lock(&s->wmu);
        while (!s->q_head && !s->wquit) pthread_cond_wait(&s->wcv, &s->wmu);
        struct http_request *r = s->q_head;
        if (r) {
            s->q_head = r->q_next;
            if (!s->q_head) s->q_tail = NULL;
        }
        pthread_mutex_unlock(&s->wmu);
        if (!r) return NULL; // quitting, and nothing queued
        r->route->handle(s->o.app, r);
        body_free(r);
        // MHD's resume takes its own lock, so the connection's thread sees
        // everything written here.
        r->handled = true;
        MHD_resume_connection(r->c);
    }
}

// Lets the queue drain, then joins the workers (before MHD stops: a
// connection still suspended would stop MHD from stopping).
static void workers_stop(struct http_server *s)
{
    pthread_mutex_lock(&s->wmu);
    s->wquit = true;
    pthread_cond_broadcast(&s->wcv);
    pthread_mutex_unlock(&s->wmu);
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
    s->n_workers = 0;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls)
{
    struct http_server *s = cls;
    struct http_request *r = *con_cls;
    if (!r || !r->started) return first_call(s, c, url, method, version, con_cls);
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return take_upload(r, upload_data, n);
    }
    if (r->offloaded) {
        if (!r->handled) return MHD_YES; // still on a worker
        r->offloaded = false;
        return after_handler(r);
    }
    if (r->responded) return MHD_YES;
    if (r->late) {
        http_respond_error(r, &r->late_err);
        return MHD_YES;
    }
    if (r->too_large) {
        respond_too_large(r);
        return MHD_YES;
    }
    if (r->busy) {
        if (r->status) return MHD_NO; // answered on the socket: close
        respond_busy(r, r->busy_per_client);
        return MHD_YES;
    }
    if (r->async) return wait_deferred(r);
    // Not in the pass that read the request: a handler may suspend the
    // connection (a worker runs it, or the answer is deferred), and MHD
    // keeps a suspended connection's event state as it was ("reading") and,
    // on resume, reads first. A client that half-closed then reads as gone,
    // and MHD closes the connection before the answer goes out. Returning
    // once with no answer lets MHD settle the state to "waiting for the
    // application" and call again at once (it polls with no timeout while a
    // connection waits so).
    if (!r->dispatched && !r->settled) {
        r->settled = true;
        return MHD_YES;
    }
    if (!r->dispatched) {
        r->dispatched = true;
        conn_phase(s, r->conn, PHASE_BUSY);
        if (atomic_load(&s->stopping) && !r->route->public_) {
            http_add_header(r, "Retry-After", "5");
            respond_simple_error(r, 503, "service_unavailable", "the server is shutting down");
            return MHD_YES;
        }
        if (!strcmp(r->route->method, "POST") && worker_take(s, r)) return MHD_YES;
        r->route->handle(s->o.app, r);
        body_free(r); // the handler has what it needs; a long response must not hold the body
        return after_handler(r);
    }
    respond_simple_error(r, 500, "internal_error", "the handler for %s %s gave no answer", r->method,
                         r->path);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *s = cls;
    struct http_request *r = *con_cls;
    struct http_conn *k = conn_of(c);
    conn_phase(s, k, PHASE_IDLE);
    if (!r) return;
    *con_cls = NULL;
    if (!r->started) {
        // MHD refused the request itself (malformed headers, too large, bad version).
        ms_log(MS_LOG_INFO, "%s - - refused by the HTTP parser", k ? k->peer->addr : "-");
        free(r);
        return;
    }
    atomic_fetch_sub(&s->n_requests, 1);
    struct http_async *a = r->async;
    bool gone_seen = false;
    if (a) {
        async_unlist(s, a);
        pthread_mutex_lock(&a->mu);
        a->closed = true;
        bool need_gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !a->gone_sent && !a->complete;
        a->gone_sent = true;
        while (a->in_gone) pthread_cond_wait(&a->cv, &a->mu);
        gone_seen = a->gone_seen;
        pthread_mutex_unlock(&a->mu);
        if (need_gone) a->ops->gone(a->ctx);
        // Streams report their counts through the async; deferred ones may
        // have set them on the request already.
        if (atomic_load(&a->log_prompt) || atomic_load(&a->log_completion)) {
            r->prompt_tokens = atomic_load(&a->log_prompt);
            r->completion_tokens = atomic_load(&a->log_completion);
        }
        a->ops->release(a->ctx);
        http_async_unref(a);
    }
    bool timed_out = false;
    if (k) {
        pthread_mutex_lock(&s->cmu);
        timed_out = k->timed_out;
        pthread_mutex_unlock(&s->cmu);
    }
    const char *how = "";
    if (timed_out) how = " (request timeout)";
    else if (gone_seen || toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT ||
             toe == MHD_REQUEST_TERMINATED_READ_ERROR)
        how = " (client gone)";
    else if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) how = " (timeout)";
    else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) how = " (aborted)";
    if (!s->o.no_access_log)
        ms_log(MS_LOG_INFO, "%s %s %s %d prompt_tokens=%d completion_tokens=%d %.3fs%s",
               r->peer[0] ? r->peer : "-", r->method, r->path ? r->path : "-", r->status,
               r->prompt_tokens, r->completion_tokens, ms_now() - r->t0, how);
    body_free(r);
    if (r->pending) MHD_destroy_response(r->pending);
    free(r->path);
    free(r);
}

// ---- the watcher ------------------------------------------------------------------------------

// The async with id, referenced; a hang-up ends its watch, a half-close
// narrows it to hang-ups (EPOLLHUP and EPOLLERR are always reported).
static struct http_async *take_by_id(struct http_server *s, uint64_t id, bool hangup)
{
    struct http_async *hit = NULL;
    pthread_mutex_lock(&s->mu);
    for (struct http_async *a = s->head; a; a = a->next)
        if (a->id == id) {
            if (a->watched && hangup) {
                epoll_ctl(s->epfd, EPOLL_CTL_DEL, a->fd, NULL);
                a->watched = false;
            } else if (a->watched) {
                struct epoll_event ev = {.events = 0, .data.u64 = a->id};
                epoll_ctl(s->epfd, EPOLL_CTL_MOD, a->fd, &ev);
            }
            atomic_fetch_add(&a->refs, 1);
            hit = a;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return hit;
}

// The peer shut its sending side (shutdown(SHUT_WR), as some clients and
// proxies do once the request is sent). That alone is no hang-up: send
// something harmless now, so that a peer which closed its socket answers
// with a reset (EPOLLHUP/EPOLLERR) and one still reading reads on.
// Returns true where nothing harmless can be sent: an HTTP/1.0 client
// awaiting one whole answer (1xx responses are not for it), whose end of
// input then counts as gone, as vLLM and llama-server count it for every
// client; otherwise its request would run to max_tokens for nobody.
static bool async_half_closed(struct http_async *a)
{
    pthread_mutex_lock(&a->mu);
    a->half_closed = true;
    bool resume = false;
    if (!a->streaming && !a->http11) {
        pthread_mutex_unlock(&a->mu);
        return true;
    }
    if (a->streaming) {
        a->keepalive_due = true; // the reader writes an SSE comment
        resume = a->suspended && !a->closed;
        if (resume) a->suspended = false;
    } else if (a->suspended) {
        deferred_probe(a);
    } else {
        a->probe_due = true;
    }
    pthread_mutex_unlock(&a->mu);
    if (resume) MHD_resume_connection(a->c);
    return false;
}

static void keepalive_scan(struct http_server *s)
{
    double now = ms_now();
    pthread_mutex_lock(&s->mu);
    int cap = s->n_open;
    struct http_async **due = cap ? malloc((size_t)cap * sizeof *due) : NULL;
    int n = 0;
    for (struct http_async *a = s->head; a && due && n < cap; a = a->next) {
        if (!a->streaming) continue;
        pthread_mutex_lock(&a->mu);
        bool idle = !a->closed && !a->complete && !a->keepalive_due &&
                    now - a->last_out >= s->o.keepalive_s;
        if (idle) a->keepalive_due = true;
        pthread_mutex_unlock(&a->mu);
        if (idle) {
            atomic_fetch_add(&a->refs, 1);
            due[n++] = a;
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        // keepalive_due alone must not count as output: the reader adds the comment.
        pthread_mutex_lock(&due[i]->mu);
        bool resume = due[i]->suspended && !due[i]->closed;
        if (resume) due[i]->suspended = false;
        pthread_mutex_unlock(&due[i]->mu);
        if (resume) MHD_resume_connection(due[i]->c);
        http_async_unref(due[i]);
    }
    free(due);
}

static void *watcher_main(void *arg)
{
    struct http_server *s = arg;
    pthread_setname_np(pthread_self(), "http-watcher");
    struct epoll_event ev[64];
    double last_scan = ms_now();
    // A quarter of the shortest period watched, so each is kept to within 25%.
    int tick_ms = 1000;
    double periods[] = {s->o.keepalive_s, s->o.header_timeout_s, s->o.body_timeout_s};
    for (size_t i = 0; i < sizeof periods / sizeof periods[0]; i++)
        if (periods[i] > 0 && periods[i] * 250 < tick_ms) tick_ms = (int)(periods[i] * 250);
    if (tick_ms < 20) tick_ms = 20;
    while (!atomic_load(&s->quit)) {
        int n = epoll_wait(s->epfd, ev, 64, tick_ms);
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0) { // the stop signal
                uint64_t v;
                ssize_t rd = read(s->evfd, &v, sizeof v);
                (void)rd;
                continue;
            }
            bool hangup = ev[i].events & (EPOLLHUP | EPOLLERR);
            struct http_async *a = take_by_id(s, ev[i].data.u64, hangup);
            if (!a) continue;
            if (hangup || async_half_closed(a)) {
                async_notify_gone(a);
                http_async_wake(a);
            }
            http_async_unref(a);
        }
        if (ms_now() - last_scan >= tick_ms / 1000.0) {
            last_scan = ms_now();
            if (s->o.keepalive_s > 0) keepalive_scan(s);
            conns_scan(s);
        }
    }
    return NULL;
}

// ---- the front gate ----------------------------------------------------------------------
//
// MHD answers a request head it cannot take with its own HTML page, and at
// its connection limit it stops accepting, so clients wait in the kernel's
// queue. The gate accepts every connection itself, counts it against the
// limits at once (503 in the error envelope beyond them), and peeks at its
// first request head, answering one that http_head refuses in the envelope
// too; a good head's connection is handed to MHD, its bytes still unread.
// Only the first request of a connection is looked at: later ones on a
// kept-alive connection, and malformed chunked bodies, still get MHD's pages.
// All of it runs on the gate thread, except the hand-off's other end
// (on_connection) and the accounting, which are under s->cmu.

static char gate_tag_listen, gate_tag_stop; // epoll tags beside the gate_conns

// The key one client's limits are counted under: its address, and for IPv6
// its /64 (one host is commonly given a whole /64: counted by single
// addresses, it could take every slot).
static void peer_key(const struct sockaddr *sa, char *out, size_t len)
{
    if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)(const void *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
            inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], out, (socklen_t)len);
            return;
        }
        struct in6_addr net = a6->sin6_addr;
        memset(net.s6_addr + 8, 0, 8);
        char t[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, &net, t, sizeof t);
        snprintf(out, len, "%.*s/64", (int)(sizeof t - 1), t);
        return;
    }
    addr_text(sa, out, len);
}

static void conn_release(struct http_server *s, struct http_conn *k)
{
    if (!k) return;
    pthread_mutex_lock(&s->cmu);
    conn_uncount(s, k);
    pthread_mutex_unlock(&s->cmu);
    free(k);
}

static void gate_unlist(struct http_server *s, struct gate_conn *g)
{
    epoll_ctl(s->gate_ep, EPOLL_CTL_DEL, g->fd, NULL);
    if (g->prev) g->prev->next = g->next;
    else s->gate_list = g->next;
    if (g->next) g->next->prev = g->prev;
}

static void gate_close(struct http_server *s, struct gate_conn *g)
{
    gate_unlist(s, g);
    if (g->closing) s->gate_closing--;
    close(g->fd);
    conn_release(s, g->k);
    free(g);
}

// A refused connection: reads and drops what its client sends, and closes
// once the client has shut its side or sent more than it is worth reading.
// May free g.
static void gate_drain(struct http_server *s, struct gate_conn *g)
{
    for (;;) {
        ssize_t n = recv(g->fd, s->peek, HEAD_MAX, MSG_DONTWAIT);
        if (n > 0 && (g->drained += (size_t)n) <= LINGER_BYTES) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        gate_close(s, g);
        return;
    }
}

// Answers g in the error envelope and closes it: at once when many are
// lingering already (a flood must not hold a descriptor each), else after
// reading what its client still sends. May free g.
static void gate_refuse(struct http_server *s, struct gate_conn *g, int http, const char *reason,
                        const char *code, const char *msg)
{
    raw_answer(g->fd, http, reason, code, msg);
    shutdown(g->fd, SHUT_WR);
    g->closing = true;
    g->since = ms_now();
    conn_release(s, g->k); // a refused connection holds no slot
    g->k = NULL;
    s->gate_closing++;
    if (s->gate_closing > LINGER_MAX) gate_close(s, g);
    else gate_drain(s, g);
}

// The head is good: the connection goes to MHD with its bytes unread. Its
// accounting waits in s->handoff until MHD announces it (on_connection).
static void gate_hand_over(struct http_server *s, struct gate_conn *g)
{
    gate_unlist(s, g);
    struct http_conn *k = g->k;
    pthread_mutex_lock(&s->cmu);
    k->prev = NULL;
    k->next = s->handoff;
    s->handoff = k;
    k->since = g->since;
    k->handed = ms_now();
    pthread_mutex_unlock(&s->cmu);
    if (MHD_add_connection(s->d, g->fd, (const struct sockaddr *)&g->sa, g->salen) != MHD_YES) {
        // MHD has closed the socket; unless it announced the connection
        // first (then its CLOSED releases k), k is still ours.
        pthread_mutex_lock(&s->cmu);
        struct http_conn **pp = &s->handoff;
        while (*pp && *pp != k) pp = &(*pp)->next;
        bool ours = *pp == k;
        if (ours) *pp = k->next;
        pthread_mutex_unlock(&s->cmu);
        if (ours) conn_release(s, k);
        log_refusal(s, "-", "a connection could not be handed to the HTTP threads (out of memory?)");
    }
    free(g);
}

// Looks at what g's client has sent so far. May free g.
static void gate_look(struct http_server *s, struct gate_conn *g)
{
    g->dirty = false;
    ssize_t n;
    do n = recv(g->fd, s->peek, HEAD_MAX, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) { // gone before a request, or reset
        gate_close(s, g);
        return;
    }
    struct http_head_verdict v;
    switch (http_head_check(s->peek, (size_t)n, HEAD_MAX, g->eof, &v)) {
    case HTTP_HEAD_MORE:
        g->peeked = (size_t)n;
        g->peek_wait = g->peek_wait > 0 ? g->peek_wait * 2 : PEEK_FIRST_WAIT_S;
        if (g->peek_wait > PEEK_MAX_WAIT_S) g->peek_wait = PEEK_MAX_WAIT_S;
        g->next_peek = ms_now() + g->peek_wait;
        return;
    case HTTP_HEAD_OK:
        gate_hand_over(s, g);
        return;
    case HTTP_HEAD_REFUSE: {
        char addr[INET6_ADDRSTRLEN];
        addr_text((const struct sockaddr *)&g->sa, addr, sizeof addr);
        // One line, like an access log line; v.message is printable ASCII.
        ms_log(MS_LOG_INFO, "%s - - %d refused before the request: %s", addr[0] ? addr : "-",
               v.status, v.message);
        gate_refuse(s, g, v.status, v.reason, v.code, v.message);
        return;
    }
    }
}

// New bytes (or the end) on a connection whose head has not ended: looked
// at now when they are its first, its last, or twice what was there at the
// last look; else at its next_peek (gate_sweep). May free g.
static void gate_bytes_came(struct http_server *s, struct gate_conn *g)
{
    int queued = 0;
    if (g->eof || !g->peeked || ioctl(g->fd, FIONREAD, &queued) || (size_t)queued >= HEAD_MAX ||
        (size_t)queued >= 2 * g->peeked || ms_now() >= g->next_peek) {
        gate_look(s, g);
        return;
    }
    g->dirty = true;
    s->gate_any_dirty = true;
}

// A new connection: counted against the limits, or refused beyond them.
static void gate_admit(struct http_server *s, int fd, const struct sockaddr_storage *sa,
                       socklen_t salen)
{
    struct gate_conn *g = calloc(1, sizeof *g);
    struct http_conn *k = calloc(1, sizeof *k);
    if (!g || !k) {
        free(g);
        free(k);
        close(fd);
        return;
    }
    char key[PEER_KEY_MAX];
    peer_key((const struct sockaddr *)sa, key, sizeof key);
    g->fd = fd;
    g->sa = *sa;
    g->salen = salen;
    g->since = ms_now();
    enum { ADMITTED, NO_MEMORY, OVER_ALL, OVER_CLIENT } why = ADMITTED;
    pthread_mutex_lock(&s->cmu);
    struct http_peer *p = peer_get(s, key);
    if (!p) why = NO_MEMORY;
    else if (s->o.max_connections && s->n_conns >= s->o.max_connections) why = OVER_ALL;
    else if (s->o.max_connections_per_client &&
             (unsigned)p->conns >= s->o.max_connections_per_client)
        why = OVER_CLIENT;
    if (why == ADMITTED) {
        p->conns++;
        s->n_conns++;
        k->fd = fd;
        k->peer = p;
        k->phase = PHASE_HEAD;
        g->k = k;
    } else if (p) {
        peer_put(s, p);
    }
    pthread_mutex_unlock(&s->cmu);
    if (!g->k) free(k);
    g->next = s->gate_list;
    if (s->gate_list) s->gate_list->prev = g;
    s->gate_list = g;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = g};
    if (epoll_ctl(s->gate_ep, EPOLL_CTL_ADD, fd, &ev)) {
        gate_close(s, g);
        return;
    }
    char msg[240];
    switch (why) {
    case ADMITTED:
        return; // its bytes, already there or not, raise an event
    case NO_MEMORY:
        gate_refuse(s, g, 503, "Service Unavailable", "server_busy",
                    "the server is out of memory; retry shortly");
        return;
    case OVER_ALL:
        snprintf(msg, sizeof msg,
                 "the server has %u connections open, the most it takes (--max-connections); "
                 "retry shortly",
                 s->o.max_connections);
        gate_refuse(s, g, 503, "Service Unavailable", "too_many_connections", msg);
        log_refusal(s, key, "connection refused: over --max-connections");
        return;
    case OVER_CLIENT:
        snprintf(msg, sizeof msg,
                 "this address already has %u connections open, the most one client may hold "
                 "(--max-connections-per-client)",
                 s->o.max_connections_per_client);
        gate_refuse(s, g, 503, "Service Unavailable", "too_many_connections", msg);
        log_refusal(s, key, "connection refused: over --max-connections-per-client");
        return;
    }
}

static void gate_accept(struct http_server *s)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t salen = sizeof sa;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            gate_admit(s, fd, &sa, salen);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            // The listener stays readable, so waiting on it would spin:
            // accepting pauses a moment, the kernel's queue holds the clients.
            epoll_ctl(s->gate_ep, EPOLL_CTL_DEL, s->listen_fd, NULL);
            s->gate_paused_until = ms_now() + 0.1;
            log_refusal(s, "-",
                        "cannot accept connections: out of file descriptors (raise the open-file "
                        "limit, LimitNOFILE=, or lower --max-connections)");
        }
        return;
    }
}

// Deadlines: a head not in within --request-header-timeout (the idle
// timeout when that is off) is answered 408 when part of it came, else the
// connection is closed quietly (browsers open connections ahead of use);
// refused connections are closed after LINGER_S. Heads whose bytes came
// while their look waited (gate_bytes_came) are looked at here.
static void gate_sweep(struct http_server *s)
{
    double now = ms_now();
    if (s->gate_paused_until > 0 && now >= s->gate_paused_until) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &gate_tag_listen};
        epoll_ctl(s->gate_ep, EPOLL_CTL_ADD, s->listen_fd, &ev);
        s->gate_paused_until = 0;
        gate_accept(s);
    }
    double limit = s->o.header_timeout_s > 0 ? s->o.header_timeout_s : s->o.idle_timeout_s;
    s->gate_any_dirty = false;
    struct gate_conn *next;
    for (struct gate_conn *g = s->gate_list; g; g = next) {
        next = g->next;
        if (g->closing) {
            if (now - g->since > LINGER_S) gate_close(s, g);
        } else if (limit > 0 && now - g->since > limit) {
            int unread = 0;
            if (ioctl(g->fd, FIONREAD, &unread) == 0 && unread > 0) {
                char msg[160];
                snprintf(msg, sizeof msg,
                         "the request headers did not arrive within %gs "
                         "(--request-header-timeout)",
                         limit);
                gate_refuse(s, g, 408, "Request Timeout", "request_timeout", msg);
            } else {
                gate_close(s, g);
            }
        } else if (g->dirty && now >= g->next_peek) {
            gate_look(s, g);
        } else if (g->dirty) {
            s->gate_any_dirty = true;
        }
    }
    // A connection MHD took but never announced (its set-up failed on the
    // worker after MHD_add_connection returned) would hold its slot forever.
    pthread_mutex_lock(&s->cmu);
    struct http_conn *stale = NULL;
    for (struct http_conn **pp = &s->handoff; *pp;) {
        struct http_conn *k = *pp;
        if (now - k->handed > HANDOFF_STALE_S) {
            *pp = k->next;
            k->next = stale;
            stale = k;
        } else {
            pp = &k->next;
        }
    }
    pthread_mutex_unlock(&s->cmu);
    while (stale) {
        struct http_conn *k = stale;
        stale = k->next;
        conn_release(s, k);
    }
}

static void *gate_main(void *arg)
{
    struct http_server *s = arg;
    pthread_setname_np(pthread_self(), "http-gate");
    struct epoll_event ev[64];
    int tick_ms = 250;
    if (s->o.header_timeout_s > 0 && s->o.header_timeout_s * 250 < tick_ms)
        tick_ms = (int)(s->o.header_timeout_s * 250);
    if (tick_ms < 10) tick_ms = 10;
    double last_sweep = ms_now();
    while (!atomic_load(&s->gate_quit)) {
        int n = epoll_wait(s->gate_ep, ev, 64, s->gate_any_dirty ? 10 : tick_ms);
        for (int i = 0; i < n; i++) {
            void *tag = ev[i].data.ptr;
            if (tag == &gate_tag_stop) continue;
            if (tag == &gate_tag_listen) {
                gate_accept(s);
                continue;
            }
            // Each connection appears once per batch, and only its own
            // event or the sweep (after the batch) frees it.
            struct gate_conn *g = tag;
            if (ev[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) g->eof = true;
            if (g->closing) gate_drain(s, g);
            else gate_bytes_came(s, g);
        }
        double now = ms_now();
        if (s->gate_any_dirty || now - last_sweep >= tick_ms / 1000.0) {
            last_sweep = now;
            gate_sweep(s);
        }
    }
    while (s->gate_list) gate_close(s, s->gate_list);
    return NULL;
}

static void gate_stop(struct http_server *s)
{
    if (!s->gate_started) return;
    atomic_store(&s->gate_quit, true);
    uint64_t one = 1;
    ssize_t w = write(s->gate_ev, &one, sizeof one);
    (void)w;
    pthread_join(s->gate, NULL);
    s->gate_started = false;
    // Closed now, not when the server is freed: while running responses
    // finish, a new client is refused at once rather than left in the queue.
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
}

// ---- start and stop ------------------------------------------------------------------------------

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
    ms_log(MS_LOG_DEBUG, "libmicrohttpd: %s", buf);
}

// Binds and listens ourselves (MHD would set SO_REUSEPORT and give no
// errno): SO_REUSEADDR only lets a restart bind past old connections in
// TIME_WAIT, while a second listener on the port is refused unless
// reuse_port asks to share it.
static int listen_open(const struct http_opts *o, int *fd_out, bool *v6, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    const char *host = o->host && o->host[0] ? o->host : NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai || !ai)
        return ms_err(err, errlen, MS_EINVAL, "--host %s: %s", host ? host : "(any)",
                      gai ? gai_strerror(gai) : "no address");
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = 0, one = 1;
    if (fd < 0) {
        rc = ms_err(err, errlen, MS_EIO, "socket: %s", strerror(errno));
    } else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
               (o->reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one))) {
        rc = ms_err(err, errlen, MS_EIO, "setsockopt: %s", strerror(errno));
    } else if (bind(fd, ai->ai_addr, ai->ai_addrlen)) {
        int e = errno;
        if (e == EADDRINUSE)
            rc = ms_err(err, errlen, MS_EBUSY,
                        "port %d is in use on %s (another server listens there; stop it, pick "
                        "another --port, or share it on purpose with --reuse-port)",
                        o->port, host ? host : "*");
        else if (e == EADDRNOTAVAIL)
            rc = ms_err(err, errlen, MS_EINVAL, "--host %s is not an address of this machine", host);
        else if (e == EACCES)
            rc = ms_err(err, errlen, MS_EIO, "port %d: permission denied (ports below 1024 need "
                        "privileges)", o->port);
        else
            rc = ms_err(err, errlen, MS_EIO, "cannot bind %s port %d: %s", host ? host : "*",
                        o->port, strerror(e));
    } else if (listen(fd, 1024)) {
        rc = ms_err(err, errlen, MS_EIO, "listen on port %d: %s", o->port, strerror(errno));
    }
    *v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (rc) {
        if (fd >= 0) close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

// Our own copies of n strings (the options' may not outlive the start):
// *out (n of them) and *n_out as far as they were made, freed with the
// server either way; -1 when out of memory.
static int strs_copy(char ***out, int *n_out, const char *const *in, int n)
{
    if (n <= 0) return 0;
    *out = calloc((size_t)n, sizeof **out);
    if (!*out) return -1;
    for (int i = 0; i < n; i++) {
        (*out)[i] = strdup(in[i]);
        if (!(*out)[i]) return -1;
        ++*n_out;
    }
    return 0;
}

static void server_free(struct http_server *s)
{
    // Hand-offs MHD never announced (closed with the daemon, or dropped).
    while (s->handoff) {
        struct http_conn *k = s->handoff;
        s->handoff = k->next;
        free(k);
    }
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->gate_ep >= 0) close(s->gate_ep);
    if (s->gate_ev >= 0) close(s->gate_ev);
    free(s->peek);
    if (s->epfd >= 0) close(s->epfd);
    if (s->evfd >= 0) close(s->evfd);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->cmu);
    pthread_mutex_destroy(&s->wmu);
    pthread_cond_destroy(&s->wcv);
    free(s->workers);
    for (int i = 0; i < PEER_BUCKETS; i++)
        while (s->peers[i]) {
            struct http_peer *p = s->peers[i];
            s->peers[i] = p->next;
            free(p);
        }
    for (int i = 0; i < s->n_hosts; i++) free(s->hosts[i]);
    free(s->hosts);
    for (int i = 0; i < s->n_api_keys; i++) free(s->api_keys[i]);
    free(s->api_keys);
    free(s);
}

int http_start(const struct http_opts *o, struct http_server **out, char *err, size_t errlen)
{
    *out = NULL;
    if (o->port < 0 || o->port > 65535)
        return ms_err(err, errlen, MS_EINVAL, "--port must be 0 to 65535, got %d", o->port);
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return ms_err(err, errlen, MS_ENOMEM, "out of memory starting the HTTP server");
    s->o = *o;
    s->o.api_keys = NULL, s->o.allowed_hosts = NULL; // the caller's: ours go in api_keys and hosts
    s->listen_fd = s->epfd = s->evfd = s->gate_ep = s->gate_ev = -1;
    if (s->o.threads < 1) s->o.threads = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_cond_init(&s->wcv, NULL);
    int rc = 0;
    if (strs_copy(&s->api_keys, &s->n_api_keys, o->api_keys, o->n_api_keys) ||
        strs_copy(&s->hosts, &s->n_hosts, o->allowed_hosts, o->n_allowed_hosts)) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory starting the HTTP server");
        goto fail;
    }
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->epfd < 0 || s->evfd < 0) {
        rc = ms_err(err, errlen, MS_EIO, "epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->evfd, &ev);

    bool v6 = false;
    if ((rc = listen_open(o, &s->listen_fd, &v6, err, errlen))) goto fail;
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    s->port = o->port;
    if (!getsockname(s->listen_fd, (struct sockaddr *)&bound, &blen))
        s->port = ntohs(bound.ss_family == AF_INET6
                            ? ((struct sockaddr_in6 *)(void *)&bound)->sin6_port
                            : ((struct sockaddr_in *)(void *)&bound)->sin_port);
    // The gate accepts (MHD has no listening socket) and hands connections
    // over with MHD_add_connection, which needs MHD's inter-thread channel.
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    if (v6) flags |= MHD_USE_IPv6;
    // The gate enforces max_connections over all threads. MHD splits its
    // own limit among them and, should a thread be over its share, drops a
    // handed connection without a word: each thread gets room for all.
    unsigned limit = o->max_connections ? o->max_connections : 4096;
    limit = limit > UINT_MAX / (unsigned)s->o.threads ? UINT_MAX : limit * (unsigned)s->o.threads;
    s->d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, (void *)NULL,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)s->o.threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
        MHD_OPTION_CONNECTION_LIMIT, limit,
        MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
        MHD_OPTION_END);
    if (!s->d) {
        rc = ms_err(err, errlen, MS_EIO, "cannot start the HTTP server on port %d", o->port);
        goto fail;
    }
    s->gate_ep = epoll_create1(EPOLL_CLOEXEC);
    s->gate_ev = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->peek = malloc(HEAD_MAX);
    if (s->gate_ep < 0 || s->gate_ev < 0 || !s->peek) {
        rc = ms_err(err, errlen, MS_EIO, "cannot start the HTTP front gate: %s",
                    s->peek ? strerror(errno) : "out of memory");
        goto fail;
    }
    struct epoll_event gev = {.events = EPOLLIN, .data.ptr = &gate_tag_stop};
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &gate_tag_listen};
    int flags_fd = fcntl(s->listen_fd, F_GETFL);
    if (flags_fd < 0 || fcntl(s->listen_fd, F_SETFL, flags_fd | O_NONBLOCK) ||
        epoll_ctl(s->gate_ep, EPOLL_CTL_ADD, s->gate_ev, &gev) ||
        epoll_ctl(s->gate_ep, EPOLL_CTL_ADD, s->listen_fd, &lev)) {
        rc = ms_err(err, errlen, MS_EIO, "cannot start the HTTP front gate: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&s->gate, NULL, gate_main, s)) {
        rc = ms_err(err, errlen, MS_EIO, "cannot start the HTTP front gate thread");
        goto fail;
    }
    s->gate_started = true;
    if (pthread_create(&s->watcher, NULL, watcher_main, s)) {
        rc = ms_err(err, errlen, MS_EIO, "cannot start the HTTP watcher thread");
        goto fail;
    }
    s->watcher_started = true;
    if (o->workers > 0 && !(s->workers = calloc((size_t)o->workers, sizeof *s->workers))) {
        rc = ms_err(err, errlen, MS_ENOMEM, "out of memory starting the HTTP server");
        goto fail;
    }
    for (int i = 0; i < o->workers; i++) {
        if (pthread_create(&s->workers[i], NULL, worker_main, s)) {
            rc = ms_err(err, errlen, MS_EIO, "cannot start the request worker threads");
            goto fail;
        }
        s->n_workers++;
    }
    *out = s;
    return 0;
fail:
    gate_stop(s);
    workers_stop(s);
    if (s->d) MHD_stop_daemon(s->d);
    if (s->watcher_started) {
        atomic_store(&s->quit, true);
        uint64_t one = 1;
        ssize_t w = write(s->evfd, &one, sizeof one);
        (void)w;
        pthread_join(s->watcher, NULL);
    }
    server_free(s);
    return rc;
}

int http_port(const struct http_server *s)
{
    return s->port;
}

int http_open_async(struct http_server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_open;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void wake_all(struct http_server *s)
{
    pthread_mutex_lock(&s->mu);
    int cap = s->n_open, n = 0;
    struct http_async **all = cap ? malloc((size_t)cap * sizeof *all) : NULL;
    for (struct http_async *a = s->head; a && all && n < cap; a = a->next) {
        atomic_fetch_add(&a->refs, 1);
        all[n++] = a;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        http_async_wake(all[i]);
        http_async_unref(all[i]);
    }
    free(all);
}

// How long no request may be in flight before a stopping server's MHD
// stops (http_stop).
#define STOP_QUIET_S 0.1

void http_stop(struct http_server *s, double timeout_s)
{
    if (!s) return;
    atomic_store(&s->stopping, true);
    gate_stop(s); // no new connections; those whose head was arriving are closed
    double end = ms_now() + timeout_s;
    // MHD must not be stopped with connections suspended: wake them until they are done.
    do {
        wake_all(s);
        if (http_open_async(s) == 0) break;
        usleep(20000);
    } while (ms_now() < end);
    if (http_open_async(s))
        ms_log(MS_LOG_WARN, "http: %d responses still open at shutdown", http_open_async(s));
    // Answers queued since (503s to requests that came on kept-alive
    // connections) go out before MHD stops and cuts the connections. A
    // proxy's idle connections can each still bring one request (its answer
    // closes the connection), in a burst as its next requests come: MHD
    // stops once none has been in flight for STOP_QUIET_S, so that the
    // burst is answered 503 rather than cut mid-request (seen: nginx sent
    // two requests that got their 503 and a third, a millisecond later,
    // that MHD's stop cut, logged "aborted").
    double quiet_since = -1;
    while (ms_now() < end) {
        const double now = ms_now();
        if (atomic_load(&s->n_requests) > 0) quiet_since = -1;
        else if (quiet_since < 0) quiet_since = now;
        else if (now - quiet_since >= STOP_QUIET_S) break;
        usleep(5000);
    }
    workers_stop(s);
    MHD_stop_daemon(s->d);
    atomic_store(&s->quit, true);
    uint64_t one = 1;
    ssize_t w = write(s->evfd, &one, sizeof one);
    (void)w;
    if (s->watcher_started) pthread_join(s->watcher, NULL);
    server_free(s);
}
