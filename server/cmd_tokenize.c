// cmd_tokenize: `moeserve tokenize MODEL_DIR` — JSON lines in, ids (or text
// with --decode) out, and --bench for the tokenizer's throughput.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/cli.h"
#include "tokenizer/tokenizer.h"
#include "server/commands.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve tokenize MODEL_DIR [--no-add-special-tokens]\n"
            "       moeserve tokenize MODEL_DIR --decode [--skip-special-tokens] [--stream]\n"
            "       moeserve tokenize MODEL_DIR --bench FILE [--chunk BYTES] [--seconds S]\n\n"
            "Reads one JSON string per line on standard input and prints one JSON array\n"
            "of token ids per line (--no-add-special-tokens: without the ids the\n"
            "tokenizer's post-processor puts around the text, as add_special_tokens=False).\n"
            "With --decode, reads one JSON array of ids per line\n"
            "and prints one JSON string per line; --stream decodes through the streaming\n"
            "decoder instead (same text). MODEL_DIR holds tokenizer.json (and optionally\n"
            "tokenizer_config.json).\n\n"
            "--bench FILE encodes the UTF-8 text in FILE, cut into chunks of about BYTES\n"
            "(default 4096) at line ends, with and without the pre-token cache, and times\n"
            "the streaming decoder; each measurement runs for about S seconds (default 1).\n");
}

static int print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) return -1;
    int rc = puts(s) < 0 ? -1 : 0;
    free(s);
    return rc;
}

static int encode_lines(struct tokenizer *t, bool add_special)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    size_t lineno = 0;
    int status = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        json_error_t jerr;
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!v || !json_is_string(v)) {
            fprintf(stderr, "moeserve tokenize: line %zu is not a JSON string%s%s\n", lineno,
                    v ? "" : ": ", v ? "" : jerr.text);
            json_decref(v);
            status = 1;
            break;
        }
        int32_t *ids;
        size_t n_ids;
        char err[512];
        int rc = tok_encode_max(t, json_string_value(v), json_string_length(v), SIZE_MAX,
                                add_special, &ids, &n_ids, err, sizeof err);
        json_decref(v);
        if (rc) {
            fprintf(stderr, "moeserve tokenize: line %zu: %s\n", lineno, err);
            status = 1;
            break;
        }
        putchar('[');
        for (size_t i = 0; i < n_ids; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
        putchar(']');
        putchar('\n');
        free(ids);
    }
    free(line);
    if (fflush(stdout) != 0) status = 1;
    return status;
}

static int decode_stream(struct tokenizer *t, const int32_t *ids, size_t n, bool skip,
                         char **text, size_t *len, char *err, size_t errlen)
{
    size_t chunk = tok_stream_max_output(t);
    size_t cap = 0;
    if (ms_mul_overflow(n + 1, chunk, &cap))
        return ms_err(err, errlen, MS_ENOMEM, "too many ids");
    char *out = malloc(cap + 1);
    if (!out) return ms_err(err, errlen, MS_ENOMEM, "out of memory");
    struct tok_stream s;
    tok_stream_init(&s, t, skip);
    size_t o = 0, w;
    for (size_t i = 0; i < n; i++) {
        if (tok_stream_feed(&s, ids[i], out + o, chunk, &w)) {
            free(out);
            return ms_err(err, errlen, MS_EINVAL, "token id %d at position %zu is not in the "
                                                  "vocabulary", (int)ids[i], i);
        }
        o += w;
    }
    tok_stream_finish(&s, out + o, chunk, &w);
    o += w;
    out[o] = 0;
    *text = out;
    *len = o;
    return 0;
}

static int decode_lines(struct tokenizer *t, bool skip, bool stream)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    size_t lineno = 0;
    int status = 0;
    int32_t *ids = NULL;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        json_error_t jerr;
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY, &jerr);
        size_t count = json_is_array(v) ? json_array_size(v) : 0;
        int32_t *nids = json_is_array(v) ? realloc(ids, (count + 1) * sizeof *ids) : NULL;
        if (nids) ids = nids;
        bool ok = nids != NULL;
        for (size_t i = 0; ok && i < count; i++) {
            json_t *e = json_array_get(v, i);
            json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
            if (!json_is_integer(e) || x < INT32_MIN || x > INT32_MAX) ok = false;
            else ids[i] = (int32_t)x;
        }
        json_decref(v);
        if (!ok) {
            fprintf(stderr, "moeserve tokenize --decode: line %zu is not a JSON array of integers\n",
                    lineno);
            status = 1;
            break;
        }
        char *text;
        size_t len;
        char err[512];
        int rc = stream ? decode_stream(t, ids, count, skip, &text, &len, err, sizeof err)
                        : tok_decode(t, ids, count, skip, &text, &len, err, sizeof err);
        if (rc) {
            fprintf(stderr, "moeserve tokenize --decode: line %zu: %s\n", lineno, err);
            status = 1;
            break;
        }
        json_t *s = json_stringn(text, len);
        free(text);
        if (!s || print_json(s) != 0) {
            json_decref(s);
            fprintf(stderr, "moeserve tokenize --decode: cannot print line %zu\n", lineno);
            status = 1;
            break;
        }
        json_decref(s);
    }
    free(ids);
    free(line);
    if (fflush(stdout) != 0) status = 1;
    return status;
}

// ---- --bench ----

struct chunk {
    const char *p;
    size_t n;
};

static double time_encode(struct tokenizer *t, const struct chunk *c, size_t nc, double seconds,
                          size_t *n_tokens, int *passes)
{
    double best = 1e30, start = ms_now();
    *passes = 0;
    do {
        double t0 = ms_now();
        size_t tokens = 0;
        for (size_t i = 0; i < nc; i++) {
            int32_t *ids;
            size_t n;
            char err[256];
            if (tok_encode(t, c[i].p, c[i].n, &ids, &n, err, sizeof err)) {
                fprintf(stderr, "moeserve tokenize --bench: %s\n", err);
                return -1;
            }
            tokens += n;
            free(ids);
        }
        double dt = ms_now() - t0;
        if (dt < best) best = dt;
        *n_tokens = tokens;
        (*passes)++;
    } while (ms_now() - start < seconds);
    return best;
}

static int bench(struct tokenizer *t, const char *file, size_t chunk_bytes, double seconds)
{
    char *data;
    size_t len;
    char err[512];
    if (ms_read_file(file, (size_t)1 << 31, &data, &len, err, sizeof err)) {
        fprintf(stderr, "moeserve tokenize --bench: %s\n", err);
        return 1;
    }
    // Chunks end at a line end past chunk_bytes (or at the end of the file).
    size_t cap = len / (chunk_bytes ? chunk_bytes : 1) + 2, nc = 0;
    struct chunk *c = malloc(cap * sizeof *c);
    if (!c) {
        free(data);
        fprintf(stderr, "moeserve tokenize --bench: out of memory\n");
        return 1;
    }
    for (size_t off = 0; off < len && nc < cap;) {
        size_t end = off + chunk_bytes < len ? off + chunk_bytes : len;
        while (end < len && data[end - 1] != '\n') end++;
        c[nc++] = (struct chunk){data + off, end - off};
        off = end;
    }
    double mb = (double)len / 1e6;
    size_t tokens = 0;
    int passes;
    tok_set_cache(t, false);
    double t_nocache = time_encode(t, c, nc, seconds, &tokens, &passes);
    if (t_nocache < 0) goto fail;
    printf("file %s: %.2f MB in %zu chunks, %zu tokens (%.2f bytes/token)\n", file, mb, nc, tokens,
           (double)len / (double)(tokens ? tokens : 1));
    printf("encode, no cache:      %8.2f MB/s  %10.0f tokens/s  (best of %d passes)\n",
           mb / t_nocache, (double)tokens / t_nocache, passes);
    tok_set_cache(t, true); // starts empty
    int one = 0;
    double t_cold = time_encode(t, c, nc, 0, &tokens, &one);
    if (t_cold < 0) goto fail;
    printf("encode, cache cold:    %8.2f MB/s  %10.0f tokens/s  (first pass from an empty cache)\n",
           mb / t_cold, (double)tokens / t_cold);
    double t_warm = time_encode(t, c, nc, seconds, &tokens, &passes);
    if (t_warm < 0) goto fail;
    printf("encode, cache warm:    %8.2f MB/s  %10.0f tokens/s  (best of %d passes)\n",
           mb / t_warm, (double)tokens / t_warm, passes);

    // The streaming decoder over every chunk's ids, against one tok_decode per chunk.
    int32_t **all = calloc(nc, sizeof *all);
    size_t *counts = calloc(nc, sizeof *counts);
    size_t outcap = tok_stream_max_output(t);
    char *out = malloc(outcap);
    if (!all || !counts || !out) {
        free(all);
        free(counts);
        free(out);
        goto fail;
    }
    size_t total = 0;
    for (size_t i = 0; i < nc; i++) {
        if (tok_encode(t, c[i].p, c[i].n, &all[i], &counts[i], err, sizeof err)) break;
        total += counts[i];
    }
    double best_stream = 1e30, best_decode = 1e30, start = ms_now();
    size_t sink = 0;
    do {
        double t0 = ms_now();
        for (size_t i = 0; i < nc; i++) {
            struct tok_stream s;
            tok_stream_init(&s, t, false);
            size_t w;
            for (size_t k = 0; k < counts[i]; k++) {
                tok_stream_feed(&s, all[i][k], out, outcap, &w);
                sink += w;
            }
            tok_stream_finish(&s, out, outcap, &w);
            sink += w;
        }
        double t1 = ms_now();
        for (size_t i = 0; i < nc; i++) {
            char *text;
            size_t tl;
            if (tok_decode(t, all[i], counts[i], false, &text, &tl, err, sizeof err) == 0) {
                sink += tl;
                free(text);
            }
        }
        double t2 = ms_now();
        if (t1 - t0 < best_stream) best_stream = t1 - t0;
        if (t2 - t1 < best_decode) best_decode = t2 - t1;
    } while (ms_now() - start < seconds);
    printf("stream decode:         %8.1f ns/token  (tok_decode of whole chunks: %.1f ns/token; %zu bytes out)\n",
           best_stream * 1e9 / (double)(total ? total : 1),
           best_decode * 1e9 / (double)(total ? total : 1), sink);
    for (size_t i = 0; i < nc; i++) free(all[i]);
    free(all);
    free(counts);
    free(out);
    free(c);
    free(data);
    return 0;
fail:
    free(c);
    free(data);
    return 1;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *bench_file = NULL;
    bool decode = false, skip = false, stream = false, add_special = true;
    size_t chunk = 4096;
    double seconds = 1.0;
    char err[1024];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--decode")) {
            decode = true;
        } else if (!strcmp(a, "--skip-special-tokens")) {
            skip = true;
        } else if (!strcmp(a, "--no-add-special-tokens")) {
            add_special = false;
        } else if (!strcmp(a, "--stream")) {
            stream = true;
        } else if (!strcmp(a, "--bench") && i + 1 < argc) {
            bench_file = argv[++i];
        } else if (!strcmp(a, "--chunk") && i + 1 < argc) {
            int64_t v;
            if (cli_parse_int(a, argv[++i], 1, 1 << 30, &v, err, sizeof err)) {
                fprintf(stderr, "moeserve tokenize: %s\n", err);
                return 2;
            }
            chunk = (size_t)v;
        } else if (!strcmp(a, "--seconds") && i + 1 < argc) {
            if (cli_parse_double(a, argv[++i], 0, 600, &seconds, err, sizeof err)) {
                fprintf(stderr, "moeserve tokenize: %s\n", err);
                return 2;
            }
        } else if (a[0] == '-' || dir) {
            fprintf(stderr, "moeserve tokenize: unexpected argument '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else {
            dir = a;
        }
    }
    if (!dir || ((skip || stream) && !decode) || (!add_special && (decode || bench_file))) {
        usage(stderr);
        return 2;
    }
    struct tokenizer *t;
    if (tok_load(dir, &t, err, sizeof err)) {
        fprintf(stderr, "moeserve tokenize: %s\n", err);
        return 1;
    }
    int rc = bench_file ? bench(t, bench_file, chunk, seconds)
             : decode   ? decode_lines(t, skip, stream)
                        : encode_lines(t, add_special);
    tok_destroy(t);
    return rc;
}
