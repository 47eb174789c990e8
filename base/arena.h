// arena: bump allocation for memory that lives exactly as long as one
// request (parsed JSON fields, token arrays, rendered prompts), freed at once.
#ifndef MOESERVE_BASE_ARENA_H
#define MOESERVE_BASE_ARENA_H

#include <stddef.h>

struct arena;

// chunk: the size of each block taken from malloc (larger requests get their own).
struct arena *arena_create(size_t chunk);
void arena_destroy(struct arena *a);
// 16-byte aligned; NULL when malloc fails or n overflows.
void *arena_alloc(struct arena *a, size_t n);
void *arena_calloc(struct arena *a, size_t count, size_t size);
char *arena_strndup(struct arena *a, const char *s, size_t n);
char *arena_strdup(struct arena *a, const char *s);
size_t arena_bytes_used(const struct arena *a);

#endif
