// client: libcurl easy and multi requests, and raw sockets (see client.h).
#include "tests/server/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

void resp_free(struct resp *r)
{
    free(r->body);
    r->body = NULL;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    struct resp *r = ud;
    size_t k = sz * n;
    char *b = realloc(r->body, r->len + k + 1);
    if (!b) return 0;
    r->body = b;
    memcpy(r->body + r->len, p, k);
    r->len += k;
    r->body[r->len] = 0;
    return k;
}

// Copies the value of header `name` (with its colon) from line p into out.
static void header_value(const char *p, size_t k, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    if (k <= nl || strncasecmp(p, name, nl)) return;
    const char *v = p + nl;
    while (*v == ' ') v++;
    snprintf(out, cap, "%.*s", (int)(p + k - v), v);
    out[strcspn(out, "\r\n")] = 0;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud)
{
    struct resp *r = ud;
    size_t k = sz * n;
    header_value(p, k, "Retry-After:", r->retry_after, sizeof r->retry_after);
    header_value(p, k, "Allow:", r->allow, sizeof r->allow);
    return k;
}

CURL *client_prepare(struct resp *r, int port, const char *method, const char *path,
                     const char *body, size_t len, const char *key, const char *const *headers,
                     long timeout_s)
{
    memset(r, 0, sizeof *r);
    CURL *c = curl_easy_init();
    if (!c) {
        r->curl_code = CURLE_OUT_OF_MEMORY;
        return NULL;
    }
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_PRIVATE, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
    bool typed = false;
    for (int i = 0; headers && headers[i]; i++) {
        r->header_list = curl_slist_append(r->header_list, headers[i]);
        typed |= !strncasecmp(headers[i], "Content-Type:", 13);
    }
    // The server takes JSON bodies only; curl would say form-urlencoded.
    if (body && !typed)
        r->header_list = curl_slist_append(r->header_list, "Content-Type: application/json");
    if (key) {
        char auth[256];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        r->header_list = curl_slist_append(r->header_list, auth); // copies auth
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->header_list);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    return c;
}

void client_finish(CURL *c, struct resp *r)
{
    if (c && r->curl_code == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    if (c) curl_easy_cleanup(c);
    curl_slist_free_all(r->header_list);
    r->header_list = NULL;
    if (!r->body) r->body = strdup("");
}

struct resp client_request(int port, const char *method, const char *path, const char *body,
                           size_t len, const char *key, const char *const *headers,
                           long timeout_s)
{
    struct resp r;
    CURL *c = client_prepare(&r, port, method, path, body, len, key, headers, timeout_s);
    if (c) r.curl_code = curl_easy_perform(c);
    client_finish(c, &r);
    return r;
}

int client_perform_all(CURL *const *h, int n)
{
    CURLM *m = curl_multi_init();
    if (!m) return -1;
    for (int i = 0; i < n; i++) curl_multi_add_handle(m, h[i]);
    int running = 1;
    CURLMcode mc = CURLM_OK;
    while (running && mc == CURLM_OK) {
        mc = curl_multi_perform(m, &running);
        if (running && mc == CURLM_OK) mc = curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
        char *priv = NULL; // the struct resp of client_prepare's handles
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
        if (msg->msg == CURLMSG_DONE && priv) ((struct resp *)priv)->curl_code = msg->data.result;
    }
    for (int i = 0; i < n; i++) curl_multi_remove_handle(m, h[i]);
    curl_multi_cleanup(m);
    return mc == CURLM_OK ? 0 : -1;
}

int client_connect_raw(int port, long timeout_s)
{
    return client_connect_from(port, NULL, timeout_s);
}

int client_connect_from(int port, const char *src, long timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (src) {
        struct sockaddr_in me = {.sin_family = AF_INET};
        if (inet_pton(AF_INET, src, &me.sin_addr) != 1 || bind(fd, (struct sockaddr *)&me, sizeof me)) {
            close(fd);
            return -1;
        }
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

size_t client_read_until(int fd, char *buf, size_t cap, const char *needle)
{
    size_t len = 0;
    buf[0] = 0;
    while (len + 1 < cap) {
        ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
        buf[len] = 0;
        if (needle && strstr(buf, needle)) break;
    }
    buf[len] = 0;
    return len;
}
