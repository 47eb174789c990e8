// cmd_bench: `moeserve bench` — flags for the serving load generator in
// bench/ (named as `vllm bench serve` names them), the result block and file.
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "base/base.h"
#include "server/commands.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve bench [options]\n\n"
            "Sends random prompts to an OpenAI-compatible server (moeserve, vLLM, ...), streams\n"
            "every request, and prints vLLM's serving benchmark result block.\n\n"
            "  --base-url URL              server (http://127.0.0.1:8000)\n"
            "  --endpoint PATH             /v1/completions (default) or /v1/chat/completions\n"
            "  --model NAME                model name to send (default: the first of /v1/models)\n"
            "  --num-prompts N             requests to send (1000)\n"
            "  --max-concurrency N         requests in flight at most (default: no cap)\n"
            "  --request-rate R            Poisson arrivals at R requests/s (default inf: all at once)\n"
            "  --random-input-len N        prompt tokens (1024)\n"
            "  --random-output-len N       max_tokens (128)\n"
            "  --random-range-ratio F      lengths uniform in [N(1-F), N(1+F)] (0)\n"
            "  --random-vocab-range LO:HI  token ids of the prompts (100:30000)\n"
            "  --prompt-kind ids|words     ids (exact lengths; completions only) or random words\n"
            "                              (about one token each); default ids for completions,\n"
            "                              words for chat\n"
            "  --ignore-eos                ask for exactly max_tokens (vLLM's ignore_eos)\n"
            "  --temperature T             sampling temperature (0)\n"
            "  --seed N                    prompts, lengths and arrivals (0)\n"
            "  --api-key KEY               Bearer token (default: $OPENAI_API_KEY, if set)\n"
            "  --request-timeout S         give up on one request after S seconds (none)\n"
            "  --save-result FILE          write the result as JSON (vLLM's key names)\n"
            "  --no-initial-test           skip the single request sent first to check the set-up\n"
            "  --no-progress               no progress line on stderr\n"
            "  --fail-on-error             exit 1 when any request failed\n");
}

static int parse_int(const char *s, const char *flag, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > INT_MAX) {
        fprintf(stderr, "moeserve bench: %s must be a whole number >= %d, not '%s'\n", flag, lo, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, const char *flag, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || isnan(v) || v < 0) {
        fprintf(stderr, "moeserve bench: %s must be a non-negative number, not '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        {"base-url", required_argument, NULL, 'u'},
        {"endpoint", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},
        {"num-prompts", required_argument, NULL, 'n'},
        {"max-concurrency", required_argument, NULL, 'c'},
        {"request-rate", required_argument, NULL, 'r'},
        {"random-input-len", required_argument, NULL, 'I'},
        {"random-output-len", required_argument, NULL, 'O'},
        {"random-range-ratio", required_argument, NULL, 'R'},
        {"random-vocab-range", required_argument, NULL, 'V'},
        {"prompt-kind", required_argument, NULL, 'k'},
        {"ignore-eos", no_argument, NULL, 'E'},
        {"temperature", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {"api-key", required_argument, NULL, 'a'},
        {"request-timeout", required_argument, NULL, 'T'},
        {"save-result", required_argument, NULL, 'S'},
        {"no-initial-test", no_argument, NULL, 'N'},
        {"no-progress", no_argument, NULL, 'P'},
        {"fail-on-error", no_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct bench_opts o;
    bench_opts_default(&o);
    o.api_key = getenv("OPENAI_API_KEY");
    const char *save = NULL;
    bool progress = true, fail_on_error = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'u': o.base_url = optarg; break;
        case 'e':
            if (strcmp(optarg, "/v1/completions") && strcmp(optarg, "/v1/chat/completions")) {
                fprintf(stderr, "moeserve bench: --endpoint must be /v1/completions or "
                        "/v1/chat/completions, not '%s'\n", optarg);
                return 2;
            }
            o.endpoint = optarg;
            break;
        case 'm': o.model = optarg; break;
        case 'n': if (parse_int(optarg, "--num-prompts", 1, &o.num_prompts)) return 2; break;
        case 'c': if (parse_int(optarg, "--max-concurrency", 1, &o.max_concurrency)) return 2; break;
        case 'r':
            if (!strcmp(optarg, "inf")) o.request_rate = INFINITY;
            else if (parse_double(optarg, "--request-rate", &o.request_rate)) return 2;
            if (!(o.request_rate > 0)) {
                fprintf(stderr, "moeserve bench: --request-rate must be positive or inf\n");
                return 2;
            }
            break;
        case 'I': if (parse_int(optarg, "--random-input-len", 1, &o.random_input_len)) return 2; break;
        case 'O': if (parse_int(optarg, "--random-output-len", 1, &o.random_output_len)) return 2; break;
        case 'R':
            if (parse_double(optarg, "--random-range-ratio", &o.random_range_ratio)) return 2;
            if (o.random_range_ratio >= 1) {
                fprintf(stderr, "moeserve bench: --random-range-ratio must be below 1\n");
                return 2;
            }
            break;
        case 'V': {
            char *end;
            errno = 0;
            long lo = strtol(optarg, &end, 10), hi = -1;
            if (end != optarg && *end == ':') {
                char *e2;
                hi = strtol(end + 1, &e2, 10);
                if (e2 == end + 1 || *e2) hi = -1;
            }
            if (errno || lo < 0 || hi <= lo || hi > INT_MAX) {
                fprintf(stderr, "moeserve bench: --random-vocab-range must be LO:HI with 0 <= LO < HI, "
                        "not '%s'\n", optarg);
                return 2;
            }
            o.vocab_lo = (int)lo;
            o.vocab_hi = (int)hi;
            break;
        }
        case 'k':
            if (!strcmp(optarg, "ids")) o.prompt_kind = BENCH_PROMPT_IDS;
            else if (!strcmp(optarg, "words")) o.prompt_kind = BENCH_PROMPT_WORDS;
            else {
                fprintf(stderr, "moeserve bench: --prompt-kind must be ids or words, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'E': o.ignore_eos = true; break;
        case 't': if (parse_double(optarg, "--temperature", &o.temperature)) return 2; break;
        case 's': {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (end == optarg || *end || errno || optarg[0] == '-') {
                fprintf(stderr, "moeserve bench: --seed must be a non-negative integer, not '%s'\n", optarg);
                return 2;
            }
            o.seed = v;
            break;
        }
        case 'a': o.api_key = optarg; break;
        case 'T': if (parse_double(optarg, "--request-timeout", &o.request_timeout)) return 2; break;
        case 'S': save = optarg; break;
        case 'N': o.initial_test = false; break;
        case 'P': progress = false; break;
        case 'F': fail_on_error = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "moeserve bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    char err[1024];
    struct bench_result r;
    int rc = bench_run(&o, &r, progress ? stderr : NULL, err, sizeof err);
    if (rc) {
        fprintf(stderr, "moeserve bench: %s\n", err);
        return rc == MS_EINVAL ? 2 : 1;
    }
    bench_print(&o, &r, stdout);
    int status = 0;
    if (save && bench_save_json(&o, &r, save, err, sizeof err)) {
        fprintf(stderr, "moeserve bench: %s\n", err);
        status = 1;
    }
    if (r.completed == 0 || (fail_on_error && r.failed > 0)) status = 1;
    bench_result_free(&r);
    return status;
}
