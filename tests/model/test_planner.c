// Pins the planner's arithmetic on Qwen3-30B-A3B (the figures issue 6 states)
// and Qwen3-0.6B (dense, tied embeddings), with the configs filled by hand.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/base.h"
#include "model/planner.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

// Qwen3-30B-A3B's config.json (tests/data/qwen3-30b-a3b/config.json).
static void fill_qwen3_30b_a3b(struct model_config *c)
{
    memset(c, 0, sizeof *c);
    c->arch = ARCH_QWEN3_MOE;
    strcpy(c->model_type, "qwen3_moe");
    c->hidden_size = 2048;
    c->n_layers = 48;
    c->n_heads = 32;
    c->n_kv_heads = 4;
    c->head_dim = 128;
    c->intermediate_size = 6144;
    c->moe_intermediate_size = 768;
    c->n_experts = 128;
    c->n_experts_per_tok = 8;
    c->norm_topk_prob = true;
    c->decoder_sparse_step = 1;
    for (int i = 0; i < c->n_layers; i++) c->layer_is_moe[i] = true;
    c->rms_norm_eps = 1e-6f;
    c->rope_theta = 1e6;
    c->max_position_embeddings = 40960;
    c->tie_word_embeddings = false;
    c->vocab_size = 151936;
    c->torch_dtype = DTYPE_BF16;
}

// Qwen3-0.6B: dense, tied embeddings (tests/data/qwen3-0.6b/config.json).
static void fill_qwen3_0_6b(struct model_config *c)
{
    memset(c, 0, sizeof *c);
    c->arch = ARCH_QWEN3;
    strcpy(c->model_type, "qwen3");
    c->hidden_size = 1024;
    c->n_layers = 28;
    c->n_heads = 16;
    c->n_kv_heads = 8;
    c->head_dim = 128;
    c->intermediate_size = 3072;
    c->max_position_embeddings = 40960;
    c->tie_word_embeddings = true;
    c->vocab_size = 151936;
    c->torch_dtype = DTYPE_BF16;
}

static void qwen3_30b_a3b_has_30_5b_total_and_3_35b_active_params(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    struct plan_params p;
    char err[256];
    assert_int_equal(plan_count_params(&c, &p, err, sizeof err), 0);
    // 48 layers * 128 experts * 3 * 768 * 2048
    assert_int_equal(p.experts, 28991029248ull);
    // 48 * 2048 * (2 * 4096 + 2 * 512)
    assert_int_equal(p.attention, 905969664ull);
    assert_int_equal(p.router, 48ull * 128 * 2048);
    assert_int_equal(p.embeddings, 151936ull * 2048);
    assert_int_equal(p.lm_head, 151936ull * 2048); // untied: counted separately
    assert_int_equal(p.norms, 48ull * (2 * 2048 + 2 * 128) + 2048);
    assert_int_equal(p.dense_mlp, 0);
    assert_int_equal(p.total, 30532122624ull);
    assert_int_equal(p.active, 3353032704ull);
    assert_int_equal(p.moe_layers, 48);
    assert_true(fabs(p.total / 1e9 - 30.5) < 0.05);
    assert_true(fabs(p.active / 1e9 - 3.35) < 0.005);
}

static void qwen3_0_6b_counts_tied_embeddings_once(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_0_6b(&c);
    struct plan_params p;
    char err[256];
    assert_int_equal(plan_count_params(&c, &p, err, sizeof err), 0);
    assert_int_equal(p.lm_head, 0);
    assert_int_equal(p.experts, 0);
    assert_int_equal(p.router, 0);
    assert_int_equal(p.dense_mlp, 28ull * 3 * 3072 * 1024);
    // The model card: 0.6B total, 0.44B non-embedding.
    assert_int_equal(p.total, 596049920ull);
    assert_true(fabs((p.total - p.embeddings) / 1e9 - 0.44) < 0.005);
    assert_int_equal(p.active, p.total);
}

static void kv_is_96_kib_per_token_in_bf16_and_half_in_fp8(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    assert_int_equal(plan_kv_bytes_per_token(&c, PLAN_BF16), 96 * 1024);
    assert_int_equal(plan_kv_bytes_per_token(&c, PLAN_FP8), 48 * 1024);
    assert_int_equal(plan_kv_bytes_per_token(&c, PLAN_F32), 192 * 1024);
}

static void expected_unique_experts_match_uniform_routing(void **state)
{
    (void)state;
    const int batch[] = {1, 8, 32, 64};
    const double want[] = {8.0, 51.6, 111.8, 125.9};
    for (int i = 0; i < 4; i++)
        assert_true(fabs(plan_expected_unique_experts(128, 8, batch[i]) - want[i]) < 0.05);
    // Saturates at E and never exceeds the batch's k * B picks.
    assert_true(fabs(plan_expected_unique_experts(128, 8, 100000) - 128.0) < 1e-9);
    assert_true(plan_expected_unique_experts(128, 8, 2) <= 16.0);
    assert_true(plan_expected_unique_experts(4, 4, 1) == 4.0);
    assert_true(plan_expected_unique_experts(0, 8, 1) == 0.0);
}

static void tp2_holds_about_28_5_gib_of_bf16_weights_per_gpu(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    char err[256];
    uint64_t one, two;
    assert_int_equal(plan_weight_bytes(&c, PLAN_BF16, PLAN_TP, 1, &one, err, sizeof err), 0);
    assert_int_equal(one, 2 * 30532122624ull);
    assert_int_equal(plan_weight_bytes(&c, PLAN_BF16, PLAN_TP, 2, &two, err, sizeof err), 0);
    // Everything is halved except the router and the norms, replicated:
    // (total - router - norms) / 2 + router + norms, in bf16.
    const uint64_t repl = 48ull * 128 * 2048 + 48ull * (2 * 2048 + 2 * 128) + 2048;
    assert_int_equal(two, 2 * ((30532122624ull - repl) / 2 + repl));
    assert_true(fabs(two / GIB - 28.5) < 0.1);
    // dp-ep replicates all but the experts: more per device than tp.
    uint64_t ep;
    assert_int_equal(plan_weight_bytes(&c, PLAN_BF16, PLAN_DP_EP, 2, &ep, err, sizeof err), 0);
    assert_int_equal(ep, 2 * (30532122624ull - 28991029248ull / 2));
}

static void one_80_gib_gpu_at_0_9_leaves_about_13_gib_for_140k_tokens(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_device d;
    char err[256];
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), 0);
    assert_int_equal(d.usable_bytes, 72ull << 30);
    assert_int_equal(d.weight_bytes, 61064245248ull);
    // The allowance: 8192 tokens * 117,248 activation bytes + 1024 rows of
    // fp32 logits + the 1 GiB runtime reserve (512 MiB of it the CUDA
    // backend's attention partials).
    assert_int_equal(d.workspace_bytes, 8192ull * 117248 + 1024ull * 151936 * 4 + (1ull << 30));
    assert_int_equal(d.kv_bytes, (72ull << 30) - 61064245248ull - d.workspace_bytes);
    assert_true(fabs(d.kv_bytes / GIB - 13.0) < 0.5);
    assert_int_equal(d.kv_bytes_per_token, 98304);
    assert_int_equal(d.kv_blocks, d.kv_bytes / (16 * 98304));
    assert_int_equal(d.kv_tokens, d.kv_blocks * 16);
    assert_true(d.kv_tokens > 135000 && d.kv_tokens < 145000);
    assert_int_equal(d.max_model_len, 40960);
    assert_int_equal(d.seq_blocks, 2560);
    assert_int_equal(d.max_len_seqs, 3);
    assert_true(d.fits);
    assert_int_equal(plan_check_fit(&d, err, sizeof err), 0);
}

static void tp_splits_kv_heads_and_dp_ep_keeps_them_whole(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_device tp, ep, tp8;
    char err[256];
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 2, &tp, err, sizeof err), 0);
    assert_int_equal(plan_device_compute(&c, &o, PLAN_DP_EP, 2, &ep, err, sizeof err), 0);
    assert_int_equal(tp.kv_bytes_per_token, 98304 / 2);
    assert_int_equal(ep.kv_bytes_per_token, 98304);
    // 8 devices over 4 KV heads: each keeps one head (replicated pairs).
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 8, &tp8, err, sizeof err), 0);
    assert_int_equal(tp8.kv_bytes_per_token, 98304 / 4);
    assert_true(tp.fits && ep.fits);
    assert_true(tp.kv_tokens > ep.kv_tokens);
}

static void indivisible_layouts_are_refused_with_the_numbers(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_device d;
    char err[256];
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 3, &d, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "num_attention_heads 32"));
    assert_int_equal(plan_device_compute(&c, &o, PLAN_DP_EP, 256, &d, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "128 experts"));
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 0, &d, err, sizeof err), MS_EINVAL);
    // dp-ep with an uneven split: the busiest device holds ceil(128 / 3) = 43.
    uint64_t w;
    assert_int_equal(plan_weight_bytes(&c, PLAN_BF16, PLAN_DP_EP, 3, &w, err, sizeof err), 0);
    assert_int_equal(w, 2 * (30532122624ull - 28991029248ull + 43ull * 48 * 3 * 768 * 2048));
}

static void a_model_too_big_for_the_device_is_refused_with_numbers(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    struct plan_opts o;
    plan_opts_default(&o);
    o.device_memory = (uint64_t)48 << 30;
    struct plan_device d;
    char err[512];
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), 0);
    assert_false(d.fits);
    assert_int_equal(d.kv_bytes, 0);
    assert_int_equal(plan_check_fit(&d, err, sizeof err), MS_ENOFIT);
    assert_non_null(strstr(err, "weights 56.87 GiB"));
    assert_non_null(strstr(err, "40960-token sequence"));
    assert_non_null(strstr(err, "43.20 GiB usable"));
    // Two such devices under dp-ep hold half the experts each and fit.
    assert_int_equal(plan_device_compute(&c, &o, PLAN_DP_EP, 2, &d, err, sizeof err), 0);
    assert_true(d.fits);
    // An explicit KV pool too small for one sequence is refused too.
    o.device_memory = (uint64_t)80 << 30;
    o.kv_cache_bytes = (uint64_t)1 << 30;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), 0);
    assert_false(d.fits);
    assert_int_equal(plan_check_fit(&d, err, sizeof err), MS_ENOFIT);
    assert_non_null(strstr(err, "682 blocks"));
    // ... and one that exceeds what is left after the weights.
    o.kv_cache_bytes = (uint64_t)20 << 30;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), 0);
    assert_false(d.fits);
    assert_int_equal(plan_check_fit(&d, err, sizeof err), MS_ENOFIT);
    assert_non_null(strstr(err, "KV cache 20.00 GiB"));
}

static void cpu_ranks_sharing_memory_count_the_weights_once(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    struct plan_opts o;
    plan_opts_default(&o);
    o.shared_memory = true;
    o.device_memory = (uint64_t)128 << 30;
    o.memory_utilization = 1.0;
    o.activation_bytes = 4;
    o.max_num_batched_tokens = 2048;
    o.max_num_seqs = 256;
    o.runtime_reserve = 0;
    o.kv_cache_bytes = (uint64_t)8 << 30; // the total, 4 GiB per rank
    struct plan_device d;
    char err[512];
    assert_int_equal(plan_device_compute(&c, &o, PLAN_DP_EP, 2, &d, err, sizeof err), 0);
    assert_true(d.shared_memory);
    assert_int_equal(d.weight_bytes, 61064245248ull);
    assert_int_equal(d.workspace_bytes, 2 * plan_workspace_bytes(&c, &o, PLAN_DP_EP, 2));
    // A sampler with rows of its own beside the logits (the GPU's 8 bytes a
    // logit) adds them for every sequence, on each rank.
    {
        struct plan_opts g = o;
        g.sample_bytes_per_logit = 8;
        assert_int_equal(plan_workspace_bytes(&c, &g, PLAN_DP_EP, 2) - plan_workspace_bytes(&c, &o, PLAN_DP_EP, 2),
                         (uint64_t)256 * 151936 * 8);
    }
    assert_int_equal(d.kv_bytes, (uint64_t)4 << 30);
    assert_int_equal(d.kv_blocks, ((uint64_t)4 << 30) / (16 * 98304));
    assert_int_equal(d.used_bytes, d.weight_bytes + d.workspace_bytes + ((uint64_t)8 << 30));
    assert_true(d.fits);
    // 6 GiB over two ranks: 3 GiB each, 2048 blocks, short of 2560.
    o.kv_cache_bytes = (uint64_t)6 << 30;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_DP_EP, 2, &d, err, sizeof err), 0);
    assert_false(d.fits);
    assert_int_equal(plan_check_fit(&d, err, sizeof err), MS_ENOFIT);
    assert_non_null(strstr(err, "2 ranks sharing one memory"));
    assert_non_null(strstr(err, "each rank has 2048 blocks"));
    assert_non_null(strstr(err, "2560 blocks"));
    // Not under tp: there every device holds its own slice.
    o.kv_cache_bytes = 0;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 2, &d, err, sizeof err), 0);
    assert_false(d.shared_memory);
}

static void decode_step_reads_3_04b_params_at_batch_1(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    char err[256];
    double b1, b64;
    assert_int_equal(plan_decode_step_bytes(&c, PLAN_BF16, PLAN_TP, 1, 1, &b1, err, sizeof err), 0);
    // active - embeddings + one embedding row, two bytes each.
    assert_true(fabs(b1 - 2.0 * (3353032704.0 - 311164928.0 + 2048)) < 1.0);
    assert_true(fabs(b1 / 2 / 1e9 - 3.04) < 0.005);
    assert_int_equal(plan_decode_step_bytes(&c, PLAN_BF16, PLAN_TP, 1, 64, &b64, err, sizeof err), 0);
    const double u64 = plan_expected_unique_experts(128, 8, 64);
    assert_true(fabs(b64 - b1 - 2.0 * (48 * (u64 - 8) * 3 * 768 * 2048 + 63 * 2048)) < 16.0);
    // dp-ep over 2: each device reads all shared weights but half the expected experts.
    double ep;
    assert_int_equal(plan_decode_step_bytes(&c, PLAN_BF16, PLAN_DP_EP, 2, 1, &ep, err, sizeof err), 0);
    assert_true(fabs(ep - 2.0 * (3353032704.0 - 311164928.0 - 48.0 * 4 * 3 * 768 * 2048 + 1024)) < 1.0);
}

static void quantised_weights_keep_embeddings_router_and_norms_at_16_bits(void **state)
{
    (void)state;
    assert_int_equal(plan_matrix_bytes(768, 2048, PLAN_BF16, QUANT_GROUP), 768 * 2048 * 2);
    // As the loader holds them (model/quant.h): an fp32 scale per output and
    // group of 128 inputs (fp8, int8), an fp16 scale and a uint8 zero point
    // (int4), rows in blocks of 16.
    assert_int_equal(plan_matrix_bytes(768, 2048, PLAN_FP8, QUANT_GROUP), 768 * 2048 + 768 * 16 * 4);
    assert_int_equal(plan_matrix_bytes(768, 2048, PLAN_INT8, QUANT_GROUP), 768 * 2048 + 768 * 16 * 4);
    assert_int_equal(plan_matrix_bytes(768, 2048, PLAN_INT4, QUANT_GROUP), 768 * 1024 + 768 * 16 * 3);
    assert_int_equal(plan_matrix_bytes(768, 2048, PLAN_INT4, QUANT_GROUP),
                     quant_matrix_bytes(768, 2048, QUANT_INT4, QUANT_GROUP));
    // Odd counts round up: a block of 16 rows, 8 inputs, a 64-byte header.
    assert_int_equal(plan_matrix_bytes(3, 5, PLAN_INT4, QUANT_GROUP), 64 + 64);
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    char err[256];
    uint64_t fp8;
    assert_int_equal(plan_weight_bytes(&c, PLAN_FP8, PLAN_TP, 1, &fp8, err, sizeof err), 0);
    const uint64_t plain = 2 * (2 * 311164928ull + 48ull * 128 * 2048 + 48ull * 4352 + 2048);
    const uint64_t expert = 768 * 2048 + 768 * 16 * 4; // gate, up; down is (2048, 768): the same
    const uint64_t attn = (4096 * 2048 + 4096 * 16 * 4) * 2 + (512 * 2048 + 512 * 16 * 4) * 2;
    assert_int_equal(fp8, plain + 48 * (128 * 3 * expert + attn));
}

// An act-order checkpoint (GPTQ desc_act, compressed-tensors actorder
// group) also holds an input order per matrix, 4 bytes an input, as the
// loader keeps them: one shared by q, k and v, o's, one shared by each
// expert's gate and up, down's. Qwen3-30B-A3B in int4: 48 x (2048 + 4096
// + 128 x (2048 + 768)) x 4 = 70.4 MB more; under tp 2, o's and down's
// inputs are halved. A format the config's quantization is not stored in
// (bf16) holds none.
static void act_order_checkpoints_count_their_input_orders(void **state)
{
    (void)state;
    struct model_config c;
    fill_qwen3_30b_a3b(&c);
    char err[256];
    uint64_t plain, act, plain2, act2, bf16, bf16_act;
    assert_int_equal(plan_weight_bytes(&c, PLAN_INT4, PLAN_TP, 1, &plain, err, sizeof err), 0);
    assert_int_equal(plan_weight_bytes(&c, PLAN_INT4, PLAN_TP, 2, &plain2, err, sizeof err), 0);
    assert_int_equal(plan_weight_bytes(&c, PLAN_BF16, PLAN_TP, 1, &bf16, err, sizeof err), 0);
    c.quant.desc_act = true;
    assert_int_equal(plan_weight_bytes(&c, PLAN_INT4, PLAN_TP, 1, &act, err, sizeof err), 0);
    assert_int_equal(plan_weight_bytes(&c, PLAN_INT4, PLAN_TP, 2, &act2, err, sizeof err), 0);
    assert_int_equal(plan_weight_bytes(&c, PLAN_BF16, PLAN_TP, 1, &bf16_act, err, sizeof err), 0);
    assert_int_equal(act - plain, 48ull * 4 * (2048 + 4096 + 128 * (2048 + 768)));
    assert_int_equal(act2 - plain2, 48ull * 4 * (2048 + 2048 + 128 * (2048 + 384)));
    assert_int_equal(bf16_act, bf16);
}

static void sizes_and_bandwidths_parse_with_units(void **state)
{
    (void)state;
    uint64_t b;
    double bw;
    char err[256];
    assert_int_equal(plan_parse_bytes("80GiB", &b, err, sizeof err), 0);
    assert_int_equal(b, 80ull << 30);
    assert_int_equal(plan_parse_bytes("80G", &b, err, sizeof err), 0);
    assert_int_equal(b, 80ull << 30);
    assert_int_equal(plan_parse_bytes("80GB", &b, err, sizeof err), 0);
    assert_int_equal(b, 80000000000ull);
    assert_int_equal(plan_parse_bytes("1.5MiB", &b, err, sizeof err), 0);
    assert_int_equal(b, 1572864);
    assert_int_equal(plan_parse_bytes("4096", &b, err, sizeof err), 0);
    assert_int_equal(b, 4096);
    assert_int_equal(plan_parse_bandwidth("4.8TB/s", &bw, err, sizeof err), 0);
    assert_true(fabs(bw - 4.8e12) < 1.0);
    assert_int_equal(plan_parse_bandwidth("100GiB/s", &bw, err, sizeof err), 0);
    assert_true(bw == 100.0 * GIB);
    const char *bad_sizes[] = {"", "GiB", "-1GiB", "80 parsecs", "nan", "inf", "1e400", "80GiBx", "99999999999TiB"};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++)
        assert_int_equal(plan_parse_bytes(bad_sizes[i], &b, err, sizeof err), MS_EINVAL);
    const char *bad_rates[] = {"4.8TB", "4.8", "/s", "0TB/s", "4.8XB/s", "4.8TB/h"};
    for (size_t i = 0; i < sizeof bad_rates / sizeof bad_rates[0]; i++)
        assert_int_equal(plan_parse_bandwidth(bad_rates[i], &bw, err, sizeof err), MS_EINVAL);
    enum plan_dtype t;
    assert_int_equal(plan_dtype_parse("int4", &t, err, sizeof err), 0);
    assert_int_equal(t, PLAN_INT4);
    assert_int_equal(plan_dtype_parse("int3", &t, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "int3"));
    enum plan_layout l;
    assert_int_equal(plan_layout_parse("dp-ep", &l, err, sizeof err), 0);
    assert_int_equal(l, PLAN_DP_EP);
    assert_int_equal(plan_layout_parse("pp", &l, err, sizeof err), MS_EINVAL);
}

static void nonsense_configs_are_refused_not_overflowed(void **state)
{
    (void)state;
    struct model_config c;
    struct plan_params p;
    char err[256];
    fill_qwen3_30b_a3b(&c);
    c.hidden_size = 0;
    assert_int_equal(plan_count_params(&c, &p, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "hidden_size"));
    fill_qwen3_30b_a3b(&c);
    c.n_experts_per_tok = 129;
    assert_int_equal(plan_count_params(&c, &p, err, sizeof err), MS_EINVAL);
    fill_qwen3_30b_a3b(&c);
    c.hidden_size = c.n_experts = c.moe_intermediate_size = c.vocab_size = 2147483647;
    assert_int_equal(plan_count_params(&c, &p, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "overflows"));
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_device d;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), MS_EINVAL);
    fill_qwen3_30b_a3b(&c);
    o.max_model_len = 40961;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), MS_EINVAL);
    assert_non_null(strstr(err, "40960"));
    plan_opts_default(&o);
    o.memory_utilization = 1.5;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), MS_EINVAL);
    plan_opts_default(&o);
    o.kv_dtype = PLAN_INT4;
    assert_int_equal(plan_device_compute(&c, &o, PLAN_TP, 1, &d, err, sizeof err), MS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen3_30b_a3b_has_30_5b_total_and_3_35b_active_params),
        cmocka_unit_test(qwen3_0_6b_counts_tied_embeddings_once),
        cmocka_unit_test(kv_is_96_kib_per_token_in_bf16_and_half_in_fp8),
        cmocka_unit_test(expected_unique_experts_match_uniform_routing),
        cmocka_unit_test(tp2_holds_about_28_5_gib_of_bf16_weights_per_gpu),
        cmocka_unit_test(one_80_gib_gpu_at_0_9_leaves_about_13_gib_for_140k_tokens),
        cmocka_unit_test(tp_splits_kv_heads_and_dp_ep_keeps_them_whole),
        cmocka_unit_test(indivisible_layouts_are_refused_with_the_numbers),
        cmocka_unit_test(a_model_too_big_for_the_device_is_refused_with_numbers),
        cmocka_unit_test(cpu_ranks_sharing_memory_count_the_weights_once),
        cmocka_unit_test(decode_step_reads_3_04b_params_at_batch_1),
        cmocka_unit_test(quantised_weights_keep_embeddings_router_and_norms_at_16_bits),
        cmocka_unit_test(act_order_checkpoints_count_their_input_orders),
        cmocka_unit_test(sizes_and_bandwidths_parse_with_units),
        cmocka_unit_test(nonsense_configs_are_refused_not_overflowed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
