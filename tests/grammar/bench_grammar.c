// bench_grammar: compile time and per-mask time of the grammar engine on the
// real Qwen3 vocabulary (not a test: it prints figures and asserts nothing).
// Usage: bench_grammar [tokenizer_dir]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "moeserve_build.h"
#include "tokenizer/tokenizer.h"

static const char *tool_schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"location\":{\"type\":\"string\",\"description\":\"City and country\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},"
    "\"options\":{\"type\":\"object\",\"properties\":{\"hourly\":{\"type\":\"boolean\"},"
    "\"lang\":{\"type\":\"string\"}},\"required\":[\"hourly\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4}},"
    "\"required\":[\"location\",\"unit\"]}";

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench(struct grammar_vocab *v, const char *name, const struct grammar_source *src, int eos, int walks)
{
    char err[512];
    struct grammar *g;
    double t0 = ms_now();
    int rc = grammar_compile(v, src, &g, err, sizeof err);
    double t1 = ms_now();
    if (rc) {
        printf("%-12s compile failed: %s\n", name, err);
        return;
    }
    int words = grammar_vocab_mask_words(v), n = grammar_vocab_size(v);
    uint32_t *mask = malloc((size_t)words * 4);
    double mask_time = 0, max_mask = 0;
    long masks = 0, allowed_sum = 0;
    double *times = malloc(sizeof *times * (size_t)walks * 400);
    for (int w = 0; w < walks; w++) {
        struct grammar_matcher *m;
        if (grammar_matcher_create(g, &m, err, sizeof err)) break;
        for (int step = 0; step < 400; step++) {
            double a = ms_now();
            if (grammar_matcher_fill_mask(m, mask)) break;
            double d = ms_now() - a;
            mask_time += d;
            times[masks] = d;
            if (d > max_mask) max_mask = d;
            masks++;
            int cnt = 0;
            for (int i = 0; i < words; i++) cnt += __builtin_popcount(mask[i]);
            allowed_sum += cnt;
            if (!cnt) break;
            // prefer ending after a while so walks finish
            int pick = -1;
            if (step > 200 && (mask[eos >> 5] >> (eos & 31) & 1)) pick = eos;
            while (pick < 0) {
                int id = (int)(next_rand() % (uint32_t)n);
                if (mask[id >> 5] >> (id & 31) & 1) pick = id;
            }
            if (grammar_matcher_accept(m, pick, err, sizeof err)) {
                printf("accept failed: %s\n", err);
                break;
            }
            if (grammar_matcher_is_terminated(m)) break;
        }
        grammar_matcher_destroy(m);
    }
    qsort(times, (size_t)masks, sizeof *times, cmp_double);
    printf("%-12s compile %6.2f ms  states %4d  %6.0f KiB  mask mean %5.1f us  p50 %5.1f  p99 %6.1f  max %7.1f us  "
           "(%ld masks, mean %ld allowed)\n",
           name, (t1 - t0) * 1e3, grammar_states(g), grammar_bytes(g) / 1024.0, masks ? mask_time / masks * 1e6 : 0,
           masks ? times[masks / 2] * 1e6 : 0, masks ? times[masks * 99 / 100] * 1e6 : 0, max_mask * 1e6, masks,
           masks ? allowed_sum / masks : 0);
    free(times);
    free(mask);
    grammar_unref(g);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : MOESERVE_TOKENIZER_DIR;
    char err[512];
    struct tokenizer *tok;
    if (tok_load(dir, &tok, err, sizeof err)) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    int32_t eos[2] = {tok_find_token(tok, "<|im_end|>"), tok_find_token(tok, "<|endoftext|>")};
    struct grammar_vocab *v;
    double t0 = ms_now();
    if (grammar_vocab_create(tok, 151936, eos, 2, &v, err, sizeof err)) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    printf("vocabulary: %d ids, built in %.1f ms\n", grammar_vocab_size(v), (ms_now() - t0) * 1e3);
    struct grammar_source src = {.kind = GRAMMAR_JSON_SCHEMA, .text = tool_schema, .len = strlen(tool_schema)};
    bench(v, "tool schema", &src, eos[0], 20);
    const char *pre = "<tool_call>\n", *suf = "\n</tool_call>";
    struct grammar_source call = src;
    call.prefix = pre;
    call.prefix_len = strlen(pre);
    call.suffix = suf;
    call.suffix_len = strlen(suf);
    bench(v, "tool call", &call, eos[0], 10);
    struct grammar_source obj = {.kind = GRAMMAR_JSON_OBJECT};
    bench(v, "json_object", &obj, eos[0], 20);
    const char *re = "[a-z]+@[a-z]+\\.(com|org)";
    struct grammar_source rx = {.kind = GRAMMAR_REGEX, .text = re, .len = strlen(re)};
    bench(v, "regex", &rx, eos[0], 20);
    const char *gbnf = "root ::= item (\", \" item)*\nitem ::= [a-z]+ | \"(\" root \")\"\n";
    struct grammar_source gb = {.kind = GRAMMAR_GBNF, .text = gbnf, .len = strlen(gbnf)};
    bench(v, "gbnf", &gb, eos[0], 20);
    const char *json_gbnf =
        "root ::= value\n"
        "value ::= obj | arr | str | num | (\"true\" | \"false\" | \"null\") ws\n"
        "obj ::= \"{\" ws ( str \":\" ws value (\",\" ws str \":\" ws value)* )? \"}\" ws\n"
        "arr ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
        "str ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\" ws\n"
        "num ::= \"-\"? [0-9]+ (\".\" [0-9]+)? ws\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
    struct grammar_source gj = {.kind = GRAMMAR_GBNF, .text = json_gbnf, .len = strlen(json_gbnf)};
    bench(v, "gbnf json", &gj, eos[0], 20);
    grammar_vocab_destroy(v);
    tok_destroy(tok);
    return 0;
}
