// engine_flags: parsing of the engine's command-line flags (see engine_flags.h).
#include "server/engine_flags.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/cli.h"
#include "model/backend_registry.h"

void engine_flags_init(struct engine_flags *f)
{
    memset(f, 0, sizeof *f);
    engine_opts_default(&f->opts);
    f->kv_dtype_auto = true;
}

void engine_flags_end(struct engine_flags *f)
{
    if (!f->kv_per_rank) return;
    const size_t ranks = f->opts.data_parallel_size > 0 ? (size_t)f->opts.data_parallel_size : 1;
    f->opts.kv_cache_bytes = f->kv_per_rank > SIZE_MAX / ranks ? SIZE_MAX : f->kv_per_rank * ranks;
}

enum dtype engine_flags_auto_kv_dtype(const struct model_config *cfg)
{
    return cfg->torch_dtype == DTYPE_F32 ? DTYPE_F32 : DTYPE_BF16;
}

void engine_flags_finish(struct engine_flags *f, const struct model_config *cfg)
{
    if (f->kv_dtype_auto) f->opts.kv_dtype = engine_flags_auto_kv_dtype(cfg);
}

struct model_load_opts engine_flags_load_opts(const struct engine_flags *f)
{
    return (struct model_load_opts){.format = f->load_format, .quantization = f->quantization,
                                    .method = f->quant_method, .cache_dir = f->cache_dir};
}

void engine_flags_usage(FILE *out)
{
    fprintf(out,
        "engine options:\n"
        "  --device D                    auto, cpu or cuda (auto: CUDA when this build has it and\n"
        "                                a GPU is visible, else the CPU)\n"
        "  --load-format F               auto (the checkpoint's safetensors) or dummy (random\n"
        "                                weights of config.json's shapes, made on the device)\n"
        "  --quantization Q              fp8, int8 or int4: quantize the projections (attention,\n"
        "                                experts, MLPs) of a bf16 checkpoint as it loads, per 128\n"
        "                                inputs; router, norms, embeddings, lm_head stay (FP8,\n"
        "                                GPTQ, AWQ and compressed-tensors checkpoints are read as\n"
        "                                they are); gptq, gptq_marlin, awq, awq_marlin or\n"
        "                                compressed-tensors: the checkpoint's method, checked\n"
        "  --cache-dir DIR               where the CPU keeps its packed (and quantized) weights\n"
        "                                for the next start (default $XDG_CACHE_HOME/moeserve, for\n"
        "                                weights of 1 GiB or more); none: never\n"
        "  --data-parallel-size N        ranks, each with its own KV pool and thread share (1)\n"
        "  --enable-expert-parallel      shard the experts over the ranks (needed when N > 1)\n"
        "  --threads T                   compute threads in all, split between ranks (all the cores it may use)\n"
        "  --kv-cache-memory SIZE        KV cache in all, split between ranks: bytes, 4GiB, 4G,\n"
        "                                512MiB, 4GB, 4g (default: a quarter of free RAM, at most 4 GiB)\n"
        "  --kv-cache-memory-bytes SIZE  KV cache per rank (vLLM's, per GPU): SIZE x the ranks in all\n"
        "  --gpu-memory-utilization F    the share of each GPU's memory to use, in (0, 1]; the KV\n"
        "                                cache gets what weights and workspace leave (0.9)\n"
        "  --kv-cache-dtype D            auto (float32 for a float32 checkpoint, else bfloat16),\n"
        "                                bfloat16, float16 or float32 (auto)\n"
        "  --prefault-memory             make the KV cache, the step workspace and the logits\n"
        "                                resident at start (llama.cpp clears its KV cache at start):\n"
        "                                the first requests pay no first touch of their pages, and\n"
        "                                too little memory shows while starting (an error or the\n"
        "                                kernel's OOM killer), not mid-request (off: pages are\n"
        "                                faulted in as the first steps reach them)\n"
        "  --max-num-seqs N              running sequences at most, per data-parallel rank (256)\n"
        "  --max-num-batched-tokens N    tokens per step at most, per data-parallel rank (2048)\n"
        "  --max-model-len N             prompt + output tokens at most, e.g. 32K (the config's)\n"
        "  --[no-]enable-prefix-caching  reuse the KV of shared prompt prefixes (on)\n"
        "  --[no-]enable-chunked-prefill spread long prompts over several steps (on)\n"
        "  --max-waiting-requests N      queued requests before new ones get 503 (0: no limit)\n"
        "  --enforce-eager               decode steps run as they come, never replaying CUDA graphs\n"
        "                                (by default a GPU replays a graph per batch bucket)\n");
}

// Matches argv[*i] against --name, --name=value; *val is the value (or NULL
// for a flag that takes none). Returns 1 on a match.
static int match(const char *arg, const char *name, bool takes_value, int argc, char **argv,
                 int *i, const char **val, int *consumed, char *err, size_t errlen)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return 0;
    if (arg[n] == 0) {
        if (!takes_value) {
            *val = NULL;
            *consumed = 1;
            return 1;
        }
        if (*i + 1 >= argc)
            return ms_err(err, errlen, MS_EINVAL, "%s needs a value", name);
        *val = argv[*i + 1];
        *consumed = 2;
        return 1;
    }
    if (arg[n] == '=') {
        if (!takes_value)
            return ms_err(err, errlen, MS_EINVAL, "%s takes no value (got \"%s\")", name, arg + n + 1);
        *val = arg + n + 1;
        *consumed = 1;
        return 1;
    }
    return 0;
}

static int int_value(const char *name, const char *val, int64_t lo, int64_t hi, int *out,
                     char *err, size_t errlen)
{
    int64_t v;
    int rc = cli_parse_count(name, val, lo, hi, &v, err, errlen);
    if (rc) return rc;
    *out = (int)v;
    return 0;
}

int engine_flags_parse_one(struct engine_flags *f, int argc, char **argv, int *i, char *err,
                           size_t errlen)
{
    const char *arg = argv[*i];
    const char *val = NULL;
    int used = 0, rc;
    struct engine_opts *o = &f->opts;
#define MATCH(name, takes) \
    ((rc = match(arg, name, takes, argc, argv, i, &val, &used, err, errlen)) != 0)
#define DONE() \
    do { \
        if (rc < 0) return rc; \
        *i += used - 1; \
        return 1; \
    } while (0)

    if (MATCH("--data-parallel-size", true) || MATCH("-dp", true)) {
        if (rc < 0) return rc;
        if ((rc = int_value("--data-parallel-size", val, 1, ENGINE_MAX_RANKS,
                            &o->data_parallel_size, err, errlen)))
            return rc;
        DONE();
    }
    if (MATCH("--enable-expert-parallel", false) || MATCH("-ep", false)) {
        if (rc > 0) o->enable_expert_parallel = true;
        DONE();
    }
    if (MATCH("--no-enable-expert-parallel", false)) {
        if (rc > 0) o->enable_expert_parallel = false;
        DONE();
    }
    if (MATCH("--prefault-memory", false)) {
        if (rc > 0) o->prefault_memory = true;
        DONE();
    }
    if (MATCH("--enforce-eager", false)) {
        if (rc > 0) o->enforce_eager = true;
        DONE();
    }
    if (MATCH("--device", true)) {
        if (rc < 0) return rc;
        if (backend_device_parse(val, &o->device))
            return ms_err(err, errlen, MS_EINVAL, "--device must be auto, cpu or cuda, not \"%s\"",
                          val);
        DONE();
    }
    if (MATCH("--load-format", true)) {
        if (rc < 0) return rc;
        if (load_format_parse(val, &f->load_format))
            return ms_err(err, errlen, MS_EINVAL,
                          "--load-format must be auto or dummy, not \"%s\"", val);
        DONE();
    }
    if (MATCH("--quantization", true) || MATCH("-q", true)) {
        if (rc < 0) return rc;
        // vLLM's names for methods a checkpoint carries: read as they are,
        // once the load has checked the checkpoint is of that method.
        static const struct {
            const char *name;
            enum quant_method m;
        } methods[] = {{"gptq", QUANT_METHOD_GPTQ}, {"gptq_marlin", QUANT_METHOD_GPTQ},
                       {"awq", QUANT_METHOD_AWQ}, {"awq_marlin", QUANT_METHOD_AWQ},
                       {"compressed-tensors", QUANT_METHOD_CT_INT}};
        f->quantization = QUANT_NONE;
        f->quant_method = QUANT_METHOD_NONE;
        for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++)
            if (!strcmp(val, methods[k].name)) f->quant_method = methods[k].m;
        if (f->quant_method == QUANT_METHOD_NONE && quant_format_parse(val, &f->quantization))
            return ms_err(err, errlen, MS_EINVAL,
                          "--quantization must be fp8, int8 or int4 (quantized at load, or an FP8 "
                          "checkpoint's), or a checkpoint's method: gptq, gptq_marlin, awq, awq_marlin or "
                          "compressed-tensors; not \"%s\"", val);
        DONE();
    }
    if (MATCH("--cache-dir", true)) {
        if (rc < 0) return rc;
        if (!*val)
            return ms_err(err, errlen, MS_EINVAL, "--cache-dir needs a directory (or none)");
        f->cache_dir = val;
        DONE();
    }
    if (MATCH("--threads", true)) {
        if (rc < 0) return rc;
        if ((rc = int_value("--threads", val, 1, 4096, &o->n_threads, err, errlen))) return rc;
        DONE();
    }
    if (MATCH("--kv-cache-memory", true)) {
        if (rc < 0) return rc;
        size_t b;
        if ((rc = cli_parse_bytes("--kv-cache-memory", val, 1, &b, err, errlen))) return rc;
        o->kv_cache_bytes = b;
        f->kv_per_rank = 0; // the later one counts
        DONE();
    }
    if (MATCH("--kv-cache-memory-bytes", true)) {
        if (rc < 0) return rc;
        if ((rc = cli_parse_bytes("--kv-cache-memory-bytes", val, 1, &f->kv_per_rank, err, errlen))) return rc;
        DONE();
    }
    if (MATCH("--gpu-memory-utilization", true)) {
        if (rc < 0) return rc;
        double u;
        static const char *const flag = "--gpu-memory-utilization";
        if ((rc = cli_parse_double(flag, val, 0, 1, &u, err, errlen))) return rc;
        if (u == 0) return cli_refuse(flag, val, "a number from 0 to 1 above 0", err, errlen);
        o->gpu_memory_utilization = u;
        DONE();
    }
    if (MATCH("--kv-cache-dtype", true)) {
        if (rc < 0) return rc;
        if (!strcmp(val, "auto")) {
            f->kv_dtype_auto = true;
        } else if (!strcmp(val, "bfloat16") || !strcmp(val, "bf16")) {
            f->kv_dtype_auto = false;
            o->kv_dtype = DTYPE_BF16;
        } else if (!strcmp(val, "float32") || !strcmp(val, "fp32")) {
            f->kv_dtype_auto = false;
            o->kv_dtype = DTYPE_F32;
        } else if (!strcmp(val, "float16") || !strcmp(val, "fp16") || !strcmp(val, "half")) {
            f->kv_dtype_auto = false;
            o->kv_dtype = DTYPE_F16;
        } else {
            return ms_err(err, errlen, MS_EINVAL,
                          "--kv-cache-dtype must be auto, bfloat16, float16 or float32, not \"%s\"",
                          val);
        }
        DONE();
    }
    if (MATCH("--max-num-seqs", true)) {
        if (rc < 0) return rc;
        if ((rc = int_value("--max-num-seqs", val, 1, 1 << 20, &o->max_num_seqs, err, errlen)))
            return rc;
        DONE();
    }
    if (MATCH("--max-num-batched-tokens", true)) {
        if (rc < 0) return rc;
        if ((rc = int_value("--max-num-batched-tokens", val, 1, 1 << 24,
                            &o->max_num_batched_tokens, err, errlen)))
            return rc;
        DONE();
    }
    if (MATCH("--max-model-len", true)) {
        if (rc < 0) return rc;
        if (!strcmp(val, "auto") || !strcmp(val, "-1")) {
            o->max_model_len = 0;
        } else if ((rc = int_value("--max-model-len", val, 1, 1 << 28, &o->max_model_len, err,
                                   errlen))) {
            return rc;
        }
        DONE();
    }
    if (MATCH("--enable-prefix-caching", false)) {
        if (rc > 0) o->enable_prefix_caching = true;
        DONE();
    }
    if (MATCH("--no-enable-prefix-caching", false)) {
        if (rc > 0) o->enable_prefix_caching = false;
        DONE();
    }
    if (MATCH("--enable-chunked-prefill", false)) {
        if (rc > 0) o->enable_chunked_prefill = true;
        DONE();
    }
    if (MATCH("--no-enable-chunked-prefill", false)) {
        if (rc > 0) o->enable_chunked_prefill = false;
        DONE();
    }
    if (MATCH("--max-waiting-requests", true)) {
        if (rc < 0) return rc;
        if ((rc = int_value("--max-waiting-requests", val, 0, INT32_MAX,
                            &o->max_waiting_requests, err, errlen)))
            return rc;
        DONE();
    }
#undef MATCH
#undef DONE
    return 0;
}
