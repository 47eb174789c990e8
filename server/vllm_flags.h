// vllm_flags: the `vllm serve` flags that `moeserve serve` takes, so that a
// command line copied from a vLLM deployment starts — `--model`,
// `-tp/--tensor-parallel-size`, `--dtype`, `--seed`, `--chat-template`,
// `--generation-config`, `--override-generation-config`, the CORS lists,
// `--root-path`, `--max-logprobs`, `--uvicorn-log-level`,
// `--metrics-prefix`... One table row per flag. A flag whose meaning is
// already how moeserve works is accepted and logged as changing nothing; one
// whose meaning moeserve cannot honour (tensor parallelism, float16) is
// refused with a sentence saying so and what to use instead. (The engine's
// own flags with vLLM's names live in engine_flags.h.)
#ifndef MOESERVE_SERVER_VLLM_FLAGS_H
#define MOESERVE_SERVER_VLLM_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// What the flags asked for; pointers are into argv. NULL / -1: not given.
struct vllm_flags {
    const char *model;                   // --model (the positional MODEL_DIR's other spelling)
    const char *chat_template;           // --chat-template: a file, or the template's text
    const char *generation_config;       // --generation-config: auto, vllm, or a folder
    const char *override_generation_config; // --override-generation-config: a JSON object
    const char *allowed_origins, *allowed_methods, *allowed_headers; // CORS lists (cors.h)
    bool allow_credentials;
    const char *root_path;               // --root-path
    const char *metrics_prefix;          // --metrics-prefix: "moeserve" (default) or "vllm"
    int max_logprobs;                    // --max-logprobs: 0..20, -1 not given
    int log_level;                       // --uvicorn-log-level as MS_LOG_*, -1 not given
    bool access_log;                     // one line per request (false: --disable-uvicorn-access-log)
};

void vllm_flags_init(struct vllm_flags *f);

// Looks at argv[*i] (`--name value` or `--name=value`): a flag of the table
// is stored or logged, *i advanced past its value, and 1 returned; anything
// else returns 0 and leaves *i alone; a value that is refused returns
// MS_EINVAL (or MS_EUNSUPPORTED for a meaning moeserve cannot honour) with a
// sentence naming the flag.
int vllm_flags_parse_one(struct vllm_flags *f, int argc, char **argv, int *i, char *err,
                         size_t errlen);

// Sets the log level from --uvicorn-log-level before anything is parsed,
// so that what flags log while they are parsed (a flag that changes
// nothing, at INFO) already follows it wherever it stands on the line. A
// bad value is left for vllm_flags_parse_one to refuse.
void vllm_flags_apply_log_level(int argc, char **argv);

// The flags' help lines, for serve --help.
void vllm_flags_usage(FILE *out);

#endif
