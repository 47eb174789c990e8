// grammar_cache: compiled grammars by (kind, text, prefix, suffix), least
// recently used first out, bounded by count and bytes, behind one mutex.
// Compilation runs outside the lock. Refusals are kept too (their code and
// sentence): compiling is a pure function of the key, and a client that
// repeats a grammar at the compile budgets would otherwise cost up to a
// second of CPU each time.
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_internal.h"

struct cache_entry {
    struct cache_entry *prev, *next; // most recent at head
    uint64_t hash;
    uint8_t *key;
    size_t key_len;
    struct grammar *g;               // NULL for a refusal
    int rc;                          // the refusal's code (g NULL)
    char *msg;                       // the refusal's sentence (g NULL)
    size_t bytes;
};

struct grammar_cache {
    const struct grammar_vocab *v;
    pthread_mutex_t mu;
    struct cache_entry *head, *tail;
    size_t n, bytes, max_entries, max_bytes;
    uint64_t hits, misses;
};

int grammar_cache_create(const struct grammar_vocab *v, size_t max_entries, size_t max_bytes,
                         struct grammar_cache **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!v || max_entries == 0) return ms_err(err, errlen, MS_EINVAL, "grammar cache: needs a vocabulary and room for one entry");
    struct grammar_cache *c = calloc(1, sizeof *c);
    if (!c) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the grammar cache");
    if (pthread_mutex_init(&c->mu, NULL)) {
        free(c);
        return ms_err(err, errlen, MS_ENOMEM, "grammar cache: cannot create its mutex");
    }
    c->v = v;
    c->max_entries = max_entries;
    c->max_bytes = max_bytes;
    *out = c;
    return 0;
}

static void entry_free(struct cache_entry *e)
{
    grammar_unref(e->g);
    free(e->msg);
    free(e->key);
    free(e);
}

void grammar_cache_destroy(struct grammar_cache *c)
{
    if (!c) return;
    for (struct cache_entry *e = c->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void put_part(uint8_t **p, const char *s, size_t n)
{
    memcpy(*p, &n, sizeof n);
    *p += sizeof n;
    if (n) memcpy(*p, s, n);
    *p += n;
}

// The key: kind, the JSON switch, then each of text, prefix and suffix with
// its length.
static uint8_t *make_key(const struct grammar_source *src, size_t *len)
{
    size_t n = 2 + 3 * sizeof(size_t);
    if (ms_add_overflow(n, src->len, &n) || ms_add_overflow(n, src->prefix_len, &n) ||
        ms_add_overflow(n, src->suffix_len, &n))
        return NULL;
    uint8_t *k = malloc(n), *p = k;
    if (!k) return NULL;
    *p++ = (uint8_t)src->kind;
    *p++ = (uint8_t)src->json_compact;
    put_part(&p, src->text, src->len);
    put_part(&p, src->prefix, src->prefix_len);
    put_part(&p, src->suffix, src->suffix_len);
    *len = n;
    return k;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void unlink_entry(struct grammar_cache *c, struct cache_entry *e)
{
    if (e->prev) e->prev->next = e->next; else c->head = e->next;
    if (e->next) e->next->prev = e->prev; else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(struct grammar_cache *c, struct cache_entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

static struct cache_entry *find(struct grammar_cache *c, uint64_t h, const uint8_t *key, size_t len)
{
    for (struct cache_entry *e = c->head; e; e = e->next)
        if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0) return e;
    return NULL;
}

// Moves a found entry to the front and hands out what it holds: a reference
// to its grammar, or its refusal. Called with the lock held.
static int entry_take(struct grammar_cache *c, struct cache_entry *e, struct grammar **out, char *err,
                      size_t errlen)
{
    unlink_entry(c, e);
    push_front(c, e);
    if (e->g) *out = grammar_ref(e->g);
    return e->g ? 0 : ms_err(err, errlen, e->rc, "%s", e->msg);
}

int grammar_cache_get(struct grammar_cache *c, const struct grammar_source *src, struct grammar **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    if (!src || (unsigned)src->kind >= GRAMMAR_KIND_COUNT || (!src->text && src->len))
        return grammar_compile(c->v, src, out, err, errlen); // it says what is wrong
    size_t len;
    uint8_t *key = make_key(src, &len);
    if (!key) return ms_err(err, errlen, MS_ENOMEM, "out of memory for the grammar cache");
    uint64_t h = hash_bytes(key, len);
    pthread_mutex_lock(&c->mu);
    struct cache_entry *e = find(c, h, key, len);
    if (e) {
        c->hits++;
        const int rc = entry_take(c, e, out, err, errlen);
        pthread_mutex_unlock(&c->mu);
        free(key);
        return rc;
    }
    c->misses++;
    pthread_mutex_unlock(&c->mu);

    struct grammar *g = NULL;
    int rc = grammar_compile(c->v, src, &g, err, errlen);
    // Refusals that depend on the text alone are kept; running out of
    // memory or an internal error may not happen again.
    const bool keep = rc == 0 || rc == MS_EINVAL || rc == MS_ENOFIT || rc == MS_EUNSUPPORTED ||
                      rc == MS_EFORMAT;
    e = keep ? calloc(1, sizeof *e) : NULL;
    char *msg = NULL;
    if (e && rc) {
        msg = strdup(err && errlen ? err : "the grammar was refused");
        if (!msg) {
            free(e);
            e = NULL;
        }
    }
    if (!e) {
        // still usable (or refused), just not cached
        free(key);
        *out = g;
        return rc;
    }
    *e = (struct cache_entry){.hash = h, .key = key, .key_len = len, .g = g, .rc = rc, .msg = msg,
                              .bytes = (g ? grammar_bytes(g) : strlen(msg)) + len};
    pthread_mutex_lock(&c->mu);
    struct cache_entry *other = find(c, h, key, len);
    if (other) {
        // Another thread compiled it meanwhile (the same result: compiling
        // is a pure function of the key): keep theirs, so a key is never
        // listed twice.
        rc = entry_take(c, other, out, err, errlen);
        pthread_mutex_unlock(&c->mu);
        entry_free(e); // ours goes, with its grammar
        return rc;
    }
    push_front(c, e);
    c->n++;
    c->bytes += e->bytes;
    if (g) *out = grammar_ref(g);
    while (c->n > 1 && (c->n > c->max_entries || (c->max_bytes && c->bytes > c->max_bytes))) {
        struct cache_entry *old = c->tail;
        unlink_entry(c, old);
        c->n--;
        c->bytes -= old->bytes;
        entry_free(old); // grammars handed out keep their own reference
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void grammar_cache_stats(struct grammar_cache *c, size_t *entries, size_t *bytes, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    if (entries) *entries = c->n;
    if (bytes) *bytes = c->bytes;
    if (hits) *hits = c->hits;
    if (misses) *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}
