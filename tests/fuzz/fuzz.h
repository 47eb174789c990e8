// fuzz: what every libFuzzer target here shares — the check that a refusal
// says why, and a way to stop on a broken promise that libFuzzer records
// as a crash with the input that caused it. Built only by tests/fuzz/run.sh.
#ifndef MOESERVE_TESTS_FUZZ_FUZZ_H
#define MOESERVE_TESTS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

// A broken promise: libFuzzer saves the input as a crash.
#define FUZZ_CHECK(cond, ...)                                                                   \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: promise broken: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fputc('\n', stderr);                                                                \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

// Every refusal is a negative status with a sentence.
#define FUZZ_REFUSAL(rc, err)                                                                   \
    FUZZ_CHECK((rc) < 0 && (err)[0] && strlen(err) > 8, "rc %d with err '%s'", (int)(rc), (err))

// data as a NUL-terminated copy (malloc'd), for parsers that take C strings.
static inline char *fuzz_cstr(const uint8_t *data, size_t n)
{
    char *s = malloc(n + 1);
    if (!s) abort();
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}

#endif
