// bench: a serving load generator for OpenAI-compatible servers in the
// style of `vllm bench serve` — random prompts, Poisson arrivals, a
// concurrency cap, every request streamed, latency statistics.
#ifndef MOESERVE_BENCH_BENCH_H
#define MOESERVE_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// How random prompts are made. Token ids give exact input lengths but only
// /v1/completions accepts them (a prompt may be a list of ids); chat
// messages need text, so they get random common English words, about one
// token each (the server's usage.prompt_tokens gives the true count).
enum bench_prompt_kind {
    BENCH_PROMPT_AUTO,   // ids for /v1/completions, words for chat
    BENCH_PROMPT_IDS,
    BENCH_PROMPT_WORDS,
};

struct bench_opts {
    const char *base_url;      // "http://127.0.0.1:8000"
    const char *endpoint;      // "/v1/completions" or "/v1/chat/completions"
    const char *model;         // NULL: the first id GET /v1/models lists
    const char *api_key;       // NULL: no Authorization header
    int num_prompts;           // 1000
    int max_concurrency;       // requests in flight at most; 0: no cap
    double request_rate;       // mean requests/s of the Poisson arrivals; INFINITY: all at t=0
    int random_input_len;      // 1024
    int random_output_len;     // 128 (max_tokens)
    double random_range_ratio; // lengths uniform in [len*(1-r), len*(1+r)]; 0: exact
    int vocab_lo, vocab_hi;    // token-id prompts draw from [vocab_lo, vocab_hi)
    enum bench_prompt_kind prompt_kind;
    bool ignore_eos;           // vLLM's extension: generate exactly max_tokens
    double temperature;        // 0: greedy
    uint64_t seed;             // prompts, lengths and arrival times
    double request_timeout;    // seconds per request; 0: none
    bool initial_test;         // send the first prompt alone first; stop if it fails
    const char *extra_body;    // NULL, or a JSON object whose members are added to every
                               // request body, replacing ours of the same name (vLLM's
                               // --extra-body: sampling fields a server needs)
};
void bench_opts_default(struct bench_opts *o);

// One request's outcome. Times are seconds.
struct bench_request {
    int input_len;          // the tokens (ids) or words sent
    int output_len;         // max_tokens asked for
    int prompt_tokens;      // usage.prompt_tokens, else input_len
    int output_tokens;      // usage.completion_tokens, else content chunks
    bool usage_seen;
    bool success;
    double start;           // since the benchmark began
    double ttft;            // to the first chunk carrying generated text
    double latency;         // to the end of the stream (E2EL)
    double *itl;            // (n_itl) gaps between successive content chunks
    size_t n_itl, cap_itl;
    char *error;            // why it failed, or NULL
};

struct bench_stats {
    size_t n;
    double mean, median, std, p99;  // milliseconds
};

struct bench_result {
    char model[256];
    int num_prompts, completed, failed;
    double duration;                  // first send to last completion
    uint64_t total_input, total_output;
    double request_throughput, output_throughput, total_token_throughput;
    double peak_output_throughput;    // most content chunks in one second of the run
    int peak_concurrency;             // most requests in flight at once
    struct bench_stats ttft, tpot, itl, e2el;
    struct bench_request *reqs;       // (num_prompts)
    bool usage_missing;               // some stream had no usage chunk: tokens counted as chunks
};

// Runs the benchmark. A progress line goes to `progress` (NULL: none).
// Returns 0 when the run took place (individual failures are in the
// result), or a negative MS_* status with err filled: bad options, the
// initial test request failing, no model to name.
int bench_run(const struct bench_opts *o, struct bench_result *r, FILE *progress,
              char *err, size_t errlen);
void bench_result_free(struct bench_result *r);
// vLLM's result block.
void bench_print(const struct bench_opts *o, const struct bench_result *r, FILE *f);
// --save-result: vLLM's JSON keys (completed, failed, request_throughput,
// output_throughput, total_token_throughput, mean_ttft_ms, ... p99_e2el_ms)
// plus the per-request lists.
int bench_save_json(const struct bench_opts *o, const struct bench_result *r, const char *path,
                    char *err, size_t errlen);

// Pieces exposed for tests.
// Arrival offsets (seconds from the start) of n requests: 0, then
// exponential gaps of mean 1/rate (all 0 when rate is infinite).
int bench_arrivals(int n, double rate, uint64_t seed, double *out);
// numpy's linear-interpolation percentile of a sorted array, p in [0, 100].
double bench_percentile(const double *sorted, size_t n, double p);
void bench_stats_of(double *values, size_t n, struct bench_stats *out); // sorts values; ms in, ms out

#endif
