// planner: sizes a deployment from config.json alone — parameter counts,
// weight and KV bytes, per-device capacity under TP and DP-EP, and the weight
// traffic of a decode step. The server's start-up fit check calls the same
// functions, so what `moeserve plan` says fits is what starts.
#ifndef MOESERVE_MODEL_PLANNER_H
#define MOESERVE_MODEL_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/quant.h"

// Storage formats for weights and the KV cache. The 16/32-bit ones are plain
// casts of every tensor; the 8/4-bit ones quantise the projections only
// (attention q/k/v/o, experts, dense MLPs: what the loader's --quantization
// and the FP8 and GPTQ checkpoints quantise), each counted as the loader
// holds it (model/quant.h, groups of QUANT_GROUP inputs).
enum plan_dtype {
    PLAN_BF16,
    PLAN_F16,
    PLAN_F32,
    PLAN_FP8,   // e4m3 bytes, an fp32 scale per output and group
    PLAN_INT8,  // int8, an fp32 scale per output and group
    PLAN_INT4,  // two values a byte, an fp16 scale and a uint8 zero point per output and group
};
const char *plan_dtype_name(enum plan_dtype t);
// Accepts bf16, fp16|f16, fp32|f32, fp8, int8, int4. Returns MS_EINVAL otherwise.
int plan_dtype_parse(const char *s, enum plan_dtype *out, char *err, size_t errlen);
enum plan_dtype plan_dtype_from_dtype(enum dtype t);
// A loaded model's projections: the quantized format, else its dtype.
enum plan_dtype plan_dtype_from_quant(enum quant_format f, enum dtype plain);

enum plan_layout {
    PLAN_TP,     // tensor parallel: heads, expert widths and the vocabulary split over the devices
    PLAN_DP_EP,  // data-parallel attention (everything but the experts replicated), experts split
};
const char *plan_layout_name(enum plan_layout l); // "tp", "dp-ep"
int plan_layout_parse(const char *s, enum plan_layout *out, char *err, size_t errlen);

// Parameter counts by kind. Counts are exact element counts of the tensors
// the checkpoint holds (model/model.h's struct model), independent of dtype.
struct plan_params {
    uint64_t experts;      // routed experts' gate, up and down, all MoE layers
    uint64_t attention;    // q, k, v and o projections
    uint64_t router;       // the MoE gate (n_experts, hidden) of each MoE layer
    uint64_t dense_mlp;    // gate, up, down of dense layers (Qwen3 dense, mlp_only_layers)
    uint64_t embeddings;   // embed_tokens (vocab, hidden)
    uint64_t lm_head;      // (vocab, hidden); 0 when tied to the embeddings
    uint64_t norms;        // every RMSNorm weight: per layer 2 * hidden + q/k norms, plus the final norm
    uint64_t total;
    uint64_t active;       // what one token's forward uses: everything except the n_experts - k
                           // experts a MoE layer does not route it to
    uint64_t one_expert;   // gate + up + down of one expert: 3 * moe_ffn * hidden
    int moe_layers;
};
// Returns MS_EINVAL when the config is not sizeable (a non-positive size, or
// a count that overflows 64 bits), naming the field.
int plan_count_params(const struct model_config *cfg, struct plan_params *out, char *err,
                      size_t errlen);

// Expected number of distinct experts a MoE layer runs for a batch of
// `batch` tokens when each picks k of E uniformly: E * (1 - (1 - k/E)^batch).
double plan_expected_unique_experts(int n_experts, int k, int batch);

// Bytes of a (rows, cols) projection stored as t, scales included (for the
// quantized formats, quant_matrix_bytes with groups of `group` inputs, 0
// for one a row: quant_config_group's for the config).
uint64_t plan_matrix_bytes(uint64_t rows, uint64_t cols, enum plan_dtype t, int group);

// KV bytes per token for the whole model (K and V, every layer, every KV
// head); equals kv_block_bytes(cfg, dtype) / KV_BLOCK_TOKENS in model/forward.h.
uint64_t plan_kv_bytes_per_token(const struct model_config *cfg, enum plan_dtype kv_dtype);

struct plan_opts {
    enum plan_dtype weight_dtype;     // projections' format (others stay at 16 bits when quantised)
    enum plan_dtype kv_dtype;         // PLAN_BF16, PLAN_F16, PLAN_F32 or PLAN_FP8
    uint64_t device_memory;           // bytes of one device (80 GiB)
    double memory_utilization;        // share of device_memory moeserve may use (0.9)
    uint64_t kv_cache_bytes;          // > 0: the KV pool of each device is exactly this (with
                                      // shared_memory: the total, split between the ranks, as
                                      // the engine's --kv-cache-memory); 0: what is left
    bool shared_memory;               // dp-ep ranks are threads of one process sharing one memory
                                      // (the CPU backend): the weights count once, each rank adds
                                      // its workspace and KV pool; device_memory is the host's
    int max_model_len;                // one sequence's tokens (0: the config's max_position_embeddings)
    int max_num_batched_tokens;       // new tokens in one step on one rank (8192)
    int max_num_seqs;                 // sequences in one step on one rank (1024)
    int activation_bytes;             // bytes of one activation element: 2 (bf16 on GPU), 4 (CPU fp32)
    uint64_t runtime_reserve;         // per device: runtime, GEMM and communicator buffers, a backend's scratch (1 GiB)
    uint32_t sample_bytes_per_logit;  // the sampler's bytes per logit beyond the fp32 logits
                                      // (backend_memory's: 0 on the CPU, 8 on a GPU; default 0)
    double memory_bandwidth;          // bytes/s of one device (4.8e12)
    uint64_t weight_bytes;            // > 0: the busiest device's weights as the loader holds
                                      // them (the engine's, from its model: a checkpoint's own
                                      // quantization groups), in place of the count from the
                                      // config and weight_dtype; 0: counted
};
void plan_opts_default(struct plan_opts *o);

// One device of a layout. Under tp every device holds a slice of every
// sequence's KV, so kv_tokens and max_len_seqs are the group's; under dp-ep
// each device holds whole sequences of its own, so they are per device and
// the group holds `devices` times as many.
struct plan_device {
    enum plan_layout layout;
    int devices;
    int max_model_len;
    bool shared_memory;            // the ranks share one memory (plan_opts.shared_memory, dp-ep):
                                   // weights, workspace, need and used are the host's totals,
                                   // kv_* and max_len_seqs are per rank
    uint64_t weight_bytes;         // the busiest device's weights
    uint64_t usable_bytes;         // device_memory * memory_utilization
    uint64_t workspace_bytes;      // the activation-workspace allowance (plan_workspace_bytes)
    uint64_t kv_bytes;             // KV pool: kv_cache_bytes, or usable - weights - workspace (0 if negative)
    uint64_t kv_bytes_per_token;   // on this device (tp: its share of the KV heads)
    uint64_t kv_blocks;            // whole 16-token blocks in kv_bytes
    uint64_t kv_tokens;            // kv_blocks * 16
    uint64_t seq_blocks;           // blocks one max_model_len sequence needs
    uint64_t max_len_seqs;         // sequences of max_model_len that fit at once
    uint64_t need_bytes;           // weights + workspace + KV of one max_model_len sequence
    uint64_t used_bytes;           // weights + workspace + kv_bytes
    bool fits;                     // need_bytes <= usable and kv_blocks >= seq_blocks
};

// Bytes of weights one device of the layout holds (the busiest one).
int plan_weight_bytes(const struct model_config *cfg, enum plan_dtype t, enum plan_layout layout,
                      int devices, uint64_t *out, char *err, size_t errlen);
// The activation-workspace allowance of one device (see planner.c).
uint64_t plan_workspace_bytes(const struct model_config *cfg, const struct plan_opts *o,
                              enum plan_layout layout, int devices);
// Fills one device's plan. Returns MS_EINVAL for a layout the model cannot be
// split into (heads, widths or experts not divisible), naming the numbers.
int plan_device_compute(const struct model_config *cfg, const struct plan_opts *o,
                        enum plan_layout layout, int devices, struct plan_device *out,
                        char *err, size_t errlen);
// The start-up check: 0 when d->fits, else MS_ENOFIT with a sentence giving
// weights, workspace, the KV of one max-model-len sequence and the usable bytes.
int plan_check_fit(const struct plan_device *d, char *err, size_t errlen);

// Weight bytes one device reads in a decode step of `batch` sequences (the
// whole group's batch, spread evenly over the ranks under dp-ep), expected
// under uniform routing. Divided by the device's bandwidth this is a lower
// bound on the time per output token (KV reads and compute come on top).
int plan_decode_step_bytes(const struct model_config *cfg, enum plan_dtype t,
                           enum plan_layout layout, int devices, int batch, double *out,
                           char *err, size_t errlen);

// Byte sizes and bandwidths from the command line. Sizes: a number with an
// optional unit B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB or K/M/G/T
// (powers of 1024). Bandwidths: a number with B/s, KB/s.. TB/s, KiB/s.. TiB/s.
int plan_parse_bytes(const char *s, uint64_t *out, char *err, size_t errlen);
int plan_parse_bandwidth(const char *s, double *out, char *err, size_t errlen);

#endif
