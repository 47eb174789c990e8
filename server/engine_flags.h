// engine_flags: the engine's command-line flags (vLLM's names), parsed once
// here for `serve`, `bench-offline` and every other command that runs an engine.
#ifndef MOESERVE_SERVER_ENGINE_FLAGS_H
#define MOESERVE_SERVER_ENGINE_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/config.h"
#include "model/model.h"
#include "scheduler/engine.h"

struct engine_flags {
    struct engine_opts opts;
    bool kv_dtype_auto; // --kv-cache-dtype auto: follow the checkpoint (resolved by engine_flags_finish)
    enum load_format load_format; // --load-format auto | dummy
    enum quant_format quantization; // --quantization fp8 | int8 | int4 (QUANT_NONE: as stored)
    enum quant_method quant_method; // --quantization gptq | awq | compressed-tensors (+ _marlin):
                                    // the checkpoint's own, checked at load
    const char *cache_dir;        // --cache-dir DIR | none (NULL: the default); points into argv
    size_t kv_per_rank;           // --kv-cache-memory-bytes (vLLM's, per GPU): resolved by engine_flags_end
};

// The model load the flags ask for (--load-format, --quantization, --cache-dir).
struct model_load_opts engine_flags_load_opts(const struct engine_flags *f);

void engine_flags_init(struct engine_flags *f);

// Looks at argv[*i]. When it is an engine flag (`--name value` or
// `--name=value`), stores it, advances *i past its value and returns 1; when
// it is not, returns 0 and leaves *i alone; a bad value returns MS_EINVAL
// with a sentence naming the flag, the value and what is accepted.
int engine_flags_parse_one(struct engine_flags *f, int argc, char **argv, int *i, char *err,
                           size_t errlen);

// After the last flag: what depends on several of them. vLLM's
// --kv-cache-memory-bytes is per GPU, so per rank here: the engine's total
// (--kv-cache-memory) is it times --data-parallel-size.
void engine_flags_end(struct engine_flags *f);

// Resolves what depends on the model: `auto` KV dtype becomes
// engine_flags_auto_kv_dtype's.
void engine_flags_finish(struct engine_flags *f, const struct model_config *cfg);
// `--kv-cache-dtype auto`: float32 for a float32 checkpoint, else bfloat16.
enum dtype engine_flags_auto_kv_dtype(const struct model_config *cfg);

// The flags' help lines, for a command's --help.
void engine_flags_usage(FILE *out);

#endif
