// arena: a linked list of malloc'd chunks; allocation bumps a pointer.
#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

struct arena_chunk {
    struct arena_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

struct arena {
    struct arena_chunk *head;
    size_t chunk;
    size_t total;
};

struct arena *arena_create(size_t chunk)
{
    struct arena *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->chunk = chunk < 256 ? 256 : chunk;
    return a;
}

void arena_destroy(struct arena *a)
{
    if (!a) return;
    struct arena_chunk *c = a->head;
    while (c) {
        struct arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(a);
}

void *arena_alloc(struct arena *a, size_t n)
{
    size_t need;
    if (ms_add_overflow(n, 15, &need)) return NULL;
    need &= ~(size_t)15;
    if (need == 0) need = 16;
    struct arena_chunk *c = a->head;
    if (!c || c->size - c->used < need) {
        size_t size = need > a->chunk ? need : a->chunk;
        size_t bytes;
        if (ms_add_overflow(size, sizeof *c, &bytes)) return NULL;
        c = malloc(bytes);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        // A big one-off allocation goes behind the head so the head's free space stays usable.
        if (a->head && need > a->chunk) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += need;
    a->total += need;
    return p;
}

void *arena_calloc(struct arena *a, size_t count, size_t size)
{
    size_t n;
    if (ms_mul_overflow(count, size, &n)) return NULL;
    void *p = arena_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

char *arena_strndup(struct arena *a, const char *s, size_t n)
{
    size_t bytes;
    if (ms_add_overflow(n, 1, &bytes)) return NULL;
    char *p = arena_alloc(a, bytes);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(struct arena *a, const char *s)
{
    return arena_strndup(a, s, strlen(s));
}

size_t arena_bytes_used(const struct arena *a)
{
    return a->total;
}
