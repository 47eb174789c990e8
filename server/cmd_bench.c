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
#include "base/cli.h"
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
            "  --extra-body JSON           members added to every request body, e.g.\n"
            "                              '{\"top_k\": 20}' (replacing ours of the same name)\n"
            "  --temperature T             sampling temperature (0)\n"
            "  --seed N                    prompts, lengths and arrivals (0)\n"
            "  --api-key KEY               Bearer token (default: $OPENAI_API_KEY, if set)\n"
            "  --request-timeout S         give up on one request after S seconds (none)\n"
            "  --save-result FILE          write the result as JSON (vLLM's key names)\n"
            "  --no-initial-test           skip the single request sent first to check the set-up\n"
            "  --no-progress               no progress line on stderr\n"
            "  --fail-on-error             exit 1 when any request failed\n");
}

// A whole number from lo to INT_MAX for flag, into *out.
static int int_flag(const char *flag, const char *s, int lo, int *out, char *err, size_t errlen)
{
    int64_t v;
    int rc = cli_parse_int(flag, s, lo, INT_MAX, &v, err, errlen);
    if (!rc) *out = (int)v;
    return rc;
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
        {"extra-body", required_argument, NULL, 'X'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct bench_opts o;
    bench_opts_default(&o);
    o.api_key = getenv("OPENAI_API_KEY");
    const char *save = NULL;
    bool progress = true, fail_on_error = false;
    char err[1024];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'u': o.base_url = optarg; break;
        case 'e':
            if (strcmp(optarg, "/v1/completions") && strcmp(optarg, "/v1/chat/completions"))
                rc = cli_refuse("--endpoint", optarg, "/v1/completions or /v1/chat/completions",
                                err, sizeof err);
            o.endpoint = optarg;
            break;
        case 'm': o.model = optarg; break;
        case 'n': rc = int_flag("--num-prompts", optarg, 1, &o.num_prompts, err, sizeof err); break;
        case 'c': rc = int_flag("--max-concurrency", optarg, 1, &o.max_concurrency, err, sizeof err); break;
        case 'r':
            // "inf" (the default) sends every request at once.
            if (cli_parse_double("--request-rate", optarg, 0, INFINITY, &o.request_rate, err,
                                 sizeof err) || o.request_rate == 0)
                rc = cli_refuse("--request-rate", optarg, "a positive number or inf", err,
                                sizeof err);
            break;
        case 'I': rc = int_flag("--random-input-len", optarg, 1, &o.random_input_len, err, sizeof err); break;
        case 'O': rc = int_flag("--random-output-len", optarg, 1, &o.random_output_len, err, sizeof err); break;
        case 'R':
            if (cli_parse_double("--random-range-ratio", optarg, 0, 1, &o.random_range_ratio, err,
                                 sizeof err) || o.random_range_ratio == 1)
                rc = cli_refuse("--random-range-ratio", optarg, "a number >= 0 and below 1", err,
                                sizeof err);
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
            if (errno || lo < 0 || hi <= lo || hi > INT_MAX)
                rc = cli_refuse("--random-vocab-range", optarg, "LO:HI with 0 <= LO < HI", err,
                                sizeof err);
            o.vocab_lo = (int)lo;
            o.vocab_hi = (int)hi;
            break;
        }
        case 'k':
            if (!strcmp(optarg, "ids")) o.prompt_kind = BENCH_PROMPT_IDS;
            else if (!strcmp(optarg, "words")) o.prompt_kind = BENCH_PROMPT_WORDS;
            else rc = cli_refuse("--prompt-kind", optarg, "ids or words", err, sizeof err);
            break;
        case 'E': o.ignore_eos = true; break;
        case 't':
            rc = cli_parse_double("--temperature", optarg, 0, INFINITY, &o.temperature, err,
                                  sizeof err);
            break;
        case 's': rc = cli_parse_u64("--seed", optarg, &o.seed, err, sizeof err); break;
        case 'a': o.api_key = optarg; break;
        case 'T':
            rc = cli_parse_double("--request-timeout", optarg, 0, INFINITY, &o.request_timeout,
                                  err, sizeof err);
            break;
        case 'S': save = optarg; break;
        case 'N': o.initial_test = false; break;
        case 'P': progress = false; break;
        case 'F': fail_on_error = true; break;
        case 'X': o.extra_body = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (rc) {
            fprintf(stderr, "moeserve bench: %s\n", err);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "moeserve bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
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
