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

// Writes data to path (for parsers that read files); aborts when it cannot.
static inline void fuzz_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) abort();
    fclose(f);
}

#endif
