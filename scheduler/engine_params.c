// engine_params: the defaults of engine options and requests, and the names
// of finish reasons — the part of engine.h that needs no engine.
#include <string.h>

#include "scheduler/engine.h"

void engine_opts_default(struct engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = BACKEND_DEVICE_AUTO;
    o->data_parallel_size = 1;
    o->enable_expert_parallel = false;
    o->n_threads = 0;
    o->kv_cache_bytes = 0;
    o->kv_dtype = DTYPE_BF16;
    o->max_num_seqs = 256;
    o->max_num_batched_tokens = 2048;
    o->max_model_len = 0;
    o->enable_prefix_caching = true;
    o->enable_chunked_prefill = true;
    o->max_waiting_requests = 0;
    o->enforce_eager = false;
    o->gpu_memory_utilization = 0.9;
}

// vLLM's SamplingParams defaults: temperature 1, nothing else on, 16 tokens.
void engine_request_default(struct engine_request *r)
{
    memset(r, 0, sizeof *r);
    sampling_params_default(&r->sampling);
    r->stop.max_tokens = 16;
    r->stop.skip_special_tokens = true;
    r->grammar_after = -1;
    r->stop_pause_open = r->stop_pause_close = -1;
}

const char *engine_finish_name(enum engine_finish f)
{
    switch (f) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_ABORT: return "abort";
    case FINISH_NONE:
    case FINISH_COUNT_: break;
    }
    return "none";
}
