// Pins config.json / generation_config.json parsing: the fields that change
// the computation, the MoE layer pattern, eos lists, and every refused setting.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "base/base.h"
#include "model/config.h"
#include "model/quant.h"
#include "tests/hostile_json.h"

// Qwen3-30B-A3B's config.json, as published.
static const char *A3B =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"decoder_sparse_step\": 1,"
    " \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 6144,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [],"
    " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
    " \"num_hidden_layers\": 48, \"num_key_value_heads\": 4, \"output_router_logits\": false,"
    " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000.0,"
    " \"router_aux_loss_coef\": 0.001, \"sliding_window\": null, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

// Parses A3B with key set to value_json (or removed when value_json is NULL).
static int parse_edited(const char *key, const char *value_json, struct model_config *cfg,
                        char *err, size_t errlen)
{
    json_t *root = json_loads(A3B, 0, NULL);
    assert_non_null(root);
    if (value_json) {
        json_t *v = json_loads(value_json, JSON_DECODE_ANY, NULL);
        assert_non_null(v);
        json_object_set_new(root, key, v);
    } else {
        json_object_del(root, key);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    int rc = config_parse(text, strlen(text), cfg, err, errlen);
    free(text);
    return rc;
}

static void a3b_config_parses_every_field(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(config_parse(A3B, strlen(A3B), &c, err, sizeof err), 0);
    assert_int_equal(c.arch, ARCH_QWEN3_MOE);
    assert_string_equal(c.model_type, "qwen3_moe");
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.n_layers, 48);
    assert_int_equal(c.n_heads, 32);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 128); // not 2048 / 32
    assert_int_equal(c.intermediate_size, 6144);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_int_equal(c.n_experts, 128);
    assert_int_equal(c.n_experts_per_tok, 8);
    assert_true(c.norm_topk_prob);
    assert_int_equal(c.decoder_sparse_step, 1);
    for (int i = 0; i < 48; i++) assert_true(c.layer_is_moe[i]);
    assert_false(c.layer_is_moe[48]);
    assert_true(c.rms_norm_eps == 1e-6f);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.torch_dtype, DTYPE_BF16);
    assert_int_equal(c.bos_token_id, 151643);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 151645);
    assert_false(c.gen.has_temperature);
}

static void head_dim_defaults_to_hidden_over_heads(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(parse_edited("head_dim", NULL, &c, err, sizeof err), 0);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(parse_edited("head_dim", "96", &c, err, sizeof err), 0);
    assert_int_equal(c.head_dim, 96);
}

static void sparse_step_and_mlp_only_layers_choose_moe_layers(void **state)
{
    (void)state;
    json_t *root = json_loads(A3B, 0, NULL);
    json_object_set_new(root, "num_hidden_layers", json_integer(6));
    json_object_set_new(root, "decoder_sparse_step", json_integer(2));
    json_object_set_new(root, "mlp_only_layers", json_pack("[i,i]", 0, 3));
    char *text = json_dumps(root, 0);
    json_decref(root);
    struct model_config c;
    char err[512] = "";
    assert_int_equal(config_parse(text, strlen(text), &c, err, sizeof err), 0);
    free(text);
    // HF: MoE when not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    const bool want[6] = {false, true, false, false, false, true};
    for (int i = 0; i < 6; i++) assert_int_equal(c.layer_is_moe[i], want[i]);
}

static void dense_qwen3_has_no_moe_layers(void **state)
{
    (void)state;
    const char *dense =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\","
        " \"hidden_size\": 1024, \"num_hidden_layers\": 28, \"num_attention_heads\": 16,"
        " \"num_key_value_heads\": 8, \"head_dim\": 128, \"intermediate_size\": 3072,"
        " \"vocab_size\": 151936, \"tie_word_embeddings\": true, \"rope_theta\": 1000000,"
        " \"rms_norm_eps\": 1e-6, \"eos_token_id\": [151645, 151643], \"bos_token_id\": null}";
    struct model_config c;
    char err[512] = "";
    assert_int_equal(config_parse(dense, strlen(dense), &c, err, sizeof err), 0);
    assert_int_equal(c.arch, ARCH_QWEN3);
    assert_int_equal(c.n_experts, 0);
    for (int i = 0; i < 28; i++) assert_false(c.layer_is_moe[i]);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.intermediate_size, 3072);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_ids[1], 151643);
    assert_int_equal(c.max_position_embeddings, 32768); // the transformers default
}

// Each refused setting: the status, and a sentence naming field and value.
static void unimplemented_settings_are_refused_by_name(void **state)
{
    (void)state;
    static const struct {
        const char *key, *value, *field_in_err, *value_in_err;
    } cases[] = {
        {"architectures", "[\"LlamaForCausalLM\"]", "architectures", "LlamaForCausalLM"},
        {"architectures", "[\"Qwen3MoeForCausalLM\", \"X\"]", "architectures", "exactly one"},
        {"model_type", "\"llama\"", "model_type", "llama"},
        {"rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling", "yarn"},
        {"rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling", "linear"},
        {"rope_scaling", "\"dynamic\"", "rope_scaling", "a string"},
        {"rope_parameters", "{\"rope_type\": \"llama3\"}", "rope_parameters", "llama3"},
        {"use_sliding_window", "true", "use_sliding_window", "true"},
        {"attention_bias", "true", "attention_bias", "true"},
        {"hidden_act", "\"gelu\"", "hidden_act", "gelu"},
        {"torch_dtype", "\"float8_e4m3fn\"", "torch_dtype", "float8_e4m3fn"},
        {"quantization_config", "{\"quant_method\": \"bitsandbytes\"}", "quantization_config", "bitsandbytes"},
        {"quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, "
         "\"version\": \"gemv\"}", "version", "gemv"},
        {"quantization_config", "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, "
         "\"zero_point\": false}", "zero_point", "false"},
        {"quantization_config", "{\"quant_method\": \"awq\", \"bits\": 8, \"group_size\": 128}",
         "bits", "8"},
        {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128}",
         "bits", "8"},
        {"quantization_config", "{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}", "fmt", "e5m2"},
        {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 100}",
         "group_size", "100"},
        {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128,"
         " \"checkpoint_format\": \"marlin\"}", "checkpoint_format", "marlin"},
        {"layer_types", "[\"full_attention\", \"sliding_attention\"]", "layer_types[1]",
         "sliding_attention"},
        // what transformers would honour and we cannot: refused, never run as something else
        {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128,"
         " \"format\": \"marlin\"}", "format", "marlin"},
        {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128,"
         " \"is_marlin_format\": true}", "is_marlin_format", "Marlin"},
        {"quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128,"
         " \"dynamic\": {\"-:.*mlp.*\": {}}}", "dynamic", "per-module"},
        {"quantization_config", "{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}",
         "activation_scheme", "static"},
        {"partial_rotary_factor", "0.5", "partial_rotary_factor", "0.5"},
        {"rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}",
         "rope_parameters.partial_rotary_factor", "0.25"},
        {"rope_parameters", "{\"full_attention\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
         "rope_parameters.full_attention", "yarn"},
        {"rope_parameters", "{\"full_attention\": {\"rope_type\": \"default\"}, \"sliding_attention\": "
         "{\"rope_type\": \"default\"}}", "rope_parameters", "sliding_attention"},
        {"per_layer_config", "{\"1\": {\"num_experts_per_tok\": 1}}", "per_layer_config", "layer by layer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct model_config c;
        char err[512] = "";
        int rc = parse_edited(cases[i].key, cases[i].value, &c, err, sizeof err);
        if (rc != MS_EUNSUPPORTED || !strstr(err, cases[i].field_in_err) ||
            !strstr(err, cases[i].value_in_err))
            fail_msg("%s=%s: rc %d, err \"%s\"", cases[i].key, cases[i].value, rc, err);
    }
}

static void default_rope_and_explicit_nulls_are_accepted(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(parse_edited("rope_scaling", "{\"rope_type\": \"default\"}", &c, err,
                                  sizeof err), 0);
    assert_int_equal(parse_edited("rope_parameters",
                                  "{\"rope_type\": \"default\", \"rope_theta\": 5000000.0}", &c,
                                  err, sizeof err), 0);
    assert_true(c.rope_theta == 5e6);
    // transformers 5 keys rope_parameters by layer type; ours are all full attention.
    assert_int_equal(parse_edited("rope_parameters", "{\"full_attention\": {\"rope_type\": \"default\", "
                                  "\"rope_theta\": 1000000.0}}", &c, err, sizeof err), 0);
    assert_true(c.rope_theta == 1e6);
    assert_int_equal(parse_edited("rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 1.0}",
                                  &c, err, sizeof err), 0);
    // Two answers to one question are a format error, not a guess.
    assert_int_equal(parse_edited("rope_scaling", "{\"rope_type\": \"default\", \"type\": \"yarn\"}", &c,
                                  err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "yarn"));
    assert_int_equal(parse_edited("rope_scaling", "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}",
                                  &c, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "rope_theta 1e+06"));
    assert_int_equal(parse_edited("hidden_act", "\"swish\"", &c, err, sizeof err), 0); // SiLU's other name
    // num_local_experts, the name newer transformers may save num_experts under.
    assert_int_equal(parse_edited("num_local_experts", "128", &c, err, sizeof err), 0);
    assert_int_equal(parse_edited("num_local_experts", "64", &c, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "num_local_experts 64"));
    json_t *root = json_loads(A3B, 0, NULL);
    assert_non_null(root);
    json_object_del(root, "num_experts");
    json_object_set_new(root, "num_local_experts", json_integer(128));
    char *text = json_dumps(root, 0);
    assert_int_equal(config_parse(text, strlen(text), &c, err, sizeof err), 0);
    assert_int_equal(c.n_experts, 128);
    json_object_del(root, "num_local_experts");
    free(text);
    text = json_dumps(root, 0);
    assert_int_equal(config_parse(text, strlen(text), &c, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "num_experts"));
    free(text);
    json_decref(root);
    assert_int_equal(parse_edited("use_sliding_window", "false", &c, err, sizeof err), 0);
    assert_int_equal(parse_edited("torch_dtype", "\"float32\"", &c, err, sizeof err), 0);
    assert_int_equal(c.torch_dtype, DTYPE_F32);
    assert_int_equal(parse_edited("hidden_size", "2048.0", &c, err, sizeof err), 0);
}

// compressed-tensors' quantization_config as llm-compressor saves it
// (RedHatAI's FP8-dynamic and w4a16 releases), its preset form, and what is
// refused by name: another format for the weights' type, sparsity, static
// input activations, activation-only groups, schemes that differ by group,
// weights quantized at run time, int8 with zero points, NVFP4.
static void compressed_tensors_quantization_configs_parse(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
#define CT_W(w, fmt) "{\"quant_method\": \"compressed-tensors\", \"format\": \"" fmt "\", " \
    "\"quantization_status\": \"compressed\", \"sparsity_config\": {}, \"ignore\": [\"lm_head\", " \
    "\"re:.*mlp.gate$\"], \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": " w "}}}"
    assert_int_equal(parse_edited("quantization_config",
                                  CT_W("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\", "
                                       "\"symmetric\": true, \"dynamic\": false, \"group_size\": null}, "
                                       "\"input_activations\": {\"num_bits\": 8, \"type\": \"float\", "
                                       "\"strategy\": \"token\", \"dynamic\": true}", "float-quantized"),
                                  &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_CT_FP8);
    assert_true(c.quant.channel);
    assert_int_equal(quant_config_format(&c), QUANT_FP8);
    assert_int_equal(parse_edited("quantization_config",
                                  CT_W("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"block\", "
                                       "\"block_structure\": \"128x64\"}", "float-quantized"), &c, err, sizeof err), 0);
    assert_int_equal(c.quant.block_rows, 128);
    assert_int_equal(c.quant.block_cols, 64);
    assert_false(c.quant.channel);
    assert_int_equal(parse_edited("quantization_config",
                                  CT_W("{\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"group\", "
                                       "\"group_size\": 128, \"symmetric\": true, \"actorder\": \"weight\", "
                                       "\"observer\": \"mse\"}", "pack-quantized"), &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_CT_INT);
    assert_int_equal(c.quant.bits, 4);
    assert_int_equal(c.quant.group, 128);
    assert_true(c.quant.sym && !c.quant.desc_act);
    assert_int_equal(quant_config_format(&c), QUANT_INT4);
    // group_size -1 without a strategy is channel; 8 bits is int8.
    assert_int_equal(parse_edited("quantization_config",
                                  CT_W("{\"num_bits\": 8, \"group_size\": -1}", "pack-quantized"), &c, err,
                                  sizeof err), 0);
    assert_int_equal(c.quant.group, 0);
    assert_int_equal(quant_config_format(&c), QUANT_INT8);
    // A preset's name as the group.
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
                                  "\"config_groups\": {\"W4A16_ASYM\": [\"Linear\"]}}", &c, err, sizeof err), 0);
    assert_true(!c.quant.sym && c.quant.group == 128 && c.quant.bits == 4);
    // Early files name it compression_config.
    assert_int_equal(parse_edited("compression_config",
                                  "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
                                  "\"config_groups\": {\"W8A16\": [\"Linear\"]}}", &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_CT_INT);
    assert_int_equal(c.quant.bits, 8);
    static const struct {
        const char *qc, *want;
    } bad[] = {
        {CT_W("{\"num_bits\": 4, \"group_size\": 128}", "float-quantized"), "float-quantized"},
        {CT_W("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}", "pack-quantized"),
         "pack-quantized"},
        {CT_W("{\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"group\", \"group_size\": 16}",
              "nvfp4-pack-quantized"), "4-bit float"},
        {CT_W("{\"num_bits\": 8, \"group_size\": 128, \"symmetric\": false}", "pack-quantized"),
         "asymmetric int8"},
        {CT_W("{\"num_bits\": 4, \"strategy\": \"tensor\"}", "pack-quantized"), "by tensor"},
        {CT_W("{\"num_bits\": 4, \"group_size\": 100}", "pack-quantized"), "group_size 100"},
        {CT_W("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\", \"dynamic\": true}",
              "float-quantized"), "dynamic"},
        {CT_W("null, \"input_activations\": {\"num_bits\": 8, \"dynamic\": true}", "float-quantized"),
         "weights are quantized"},
        {CT_W("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\"}, \"input_activations\": "
              "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\", \"dynamic\": false}",
              "float-quantized"), "static input activations"},
        {CT_W("{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"block\"}", "float-quantized"),
         "block_structure"},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"config_groups\": "
         "{\"a\": {\"weights\": {\"num_bits\": 4, \"group_size\": 128}}, \"b\": {\"weights\": "
         "{\"num_bits\": 4, \"group_size\": 64}}}}", "different weight schemes"},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"sparsity_config\": "
         "{\"format\": \"sparse-24-bitmask\"}, \"config_groups\": {\"W4A16\": [\"Linear\"]}}", "sparsity_config"},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", \"quantization_status\": "
         "\"frozen\", \"config_groups\": {\"W4A16\": [\"Linear\"]}}", "frozen"},
        {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": "
         "{\"FP8\": [\"Linear\"]}}", "preset scheme \"FP8\""},
        {"{\"quant_method\": \"compressed-tensors\", \"config_groups\": {\"W4A16\": [\"Linear\"]}}",
         "no format"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int rc = parse_edited("quantization_config", bad[i].qc, &c, err, sizeof err);
        if (rc == 0) fail_msg("case %zu: accepted", i);
        if (!strstr(err, bad[i].want)) fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].want);
    }
#undef CT_W
}

// Qwen3-30B-A3B-FP8's and -GPTQ-Int4's quantization_config, and the variants
// a file may write (per-tensor FP8, group_size -1, asymmetric, GPTQ v2).
static void fp8_and_gptq_quantization_configs_parse(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", "
                                  "\"quant_method\": \"fp8\", \"weight_block_size\": [128, 64]}",
                                  &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_FP8);
    assert_int_equal(c.quant.block_rows, 128);
    assert_int_equal(c.quant.block_cols, 64);
    assert_int_equal(parse_edited("quantization_config", "{\"quant_method\": \"fp8\"}", &c, err,
                                  sizeof err), 0);
    assert_int_equal(c.quant.block_rows, 0); // one scale per tensor
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"damp_percent\": 0.01, \"desc_act\": false, "
                                  "\"group_size\": 128, \"quant_method\": \"gptq\", \"static_groups\": "
                                  "false, \"sym\": true, \"true_sequential\": true}", &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_GPTQ);
    assert_int_equal(c.quant.group, 128);
    assert_true(c.quant.sym && !c.quant.desc_act);
    assert_int_equal(c.quant.zero_offset, 1);
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": -1, \"quant_method\": \"gptq\", "
                                  "\"sym\": false, \"checkpoint_format\": \"gptq_v2\"}", &c, err,
                                  sizeof err), 0);
    assert_int_equal(c.quant.group, 0); // one group over all inputs
    assert_false(c.quant.sym);
    assert_int_equal(c.quant.zero_offset, 0);
    // GPTQModel and AutoGPTQ 0.8 name it "format"; newer files write both.
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": 128, \"quant_method\": \"gptq\", "
                                  "\"format\": \"gptq_v2\"}", &c, err, sizeof err), 0);
    assert_int_equal(c.quant.zero_offset, 0);
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": 128, \"quant_method\": \"gptq\", "
                                  "\"format\": \"gptq\", \"checkpoint_format\": \"gptq\"}", &c, err, sizeof err), 0);
    assert_int_equal(c.quant.zero_offset, 1);
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": 128, \"quant_method\": \"gptq\", "
                                  "\"format\": \"gptq_v2\", \"checkpoint_format\": \"gptq\"}", &c, err,
                                  sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "gptq_v2"));
    // AutoAWQ's quantization_config (version and modules_to_not_convert as
    // its exports write them; the version is case-insensitive there).
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": 128, \"modules_to_not_convert\": [\"gate\"], "
                                  "\"quant_method\": \"awq\", \"version\": \"GEMM\", \"zero_point\": true}",
                                  &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_AWQ);
    assert_int_equal(c.quant.group, 128);
    assert_int_equal(c.quant.zero_offset, 0);
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": 64, \"quant_method\": \"awq\"}", &c, err,
                                  sizeof err), 0);
    assert_int_equal(c.quant.group, 64);
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"bits\": 4, \"group_size\": 128, \"quant_method\": \"awq\", "
                                  "\"modules_to_not_convert\": \"gate\"}", &c, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "modules_to_not_convert"));
    assert_int_equal(parse_edited("quantization_config", NULL, &c, err, sizeof err), 0);
    assert_int_equal(c.quant.method, QUANT_METHOD_NONE);
    // Malformed pieces are format errors naming the field.
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", &c,
                                  err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "weight_block_size"));
    assert_int_equal(parse_edited("quantization_config",
                                  "{\"quant_method\": \"fp8\", \"weight_block_size\": [0, 128]}",
                                  &c, err, sizeof err), MS_EFORMAT);
    assert_int_equal(parse_edited("quantization_config", "{\"quant_method\": \"gptq\", \"bits\": 4}",
                                  &c, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "group_size"));
    assert_int_equal(parse_edited("quantization_config", "[1]", &c, err, sizeof err), MS_EFORMAT);
}

static void malformed_configs_are_format_errors(void **state)
{
    (void)state;
    static const struct {
        const char *key, *value, *in_err;
    } cases[] = {
        {"hidden_size", "\"big\"", "hidden_size must be an integer"},
        {"hidden_size", "0", "hidden_size is 0"},
        {"hidden_size", NULL, "no hidden_size"},
        {"num_hidden_layers", "100000", "num_hidden_layers is 100000"},
        {"num_key_value_heads", "5", "not a multiple of num_key_value_heads"},
        {"num_experts_per_tok", "129", "num_experts_per_tok is 129"},
        {"moe_intermediate_size", NULL, "moe_intermediate_size"},
        {"mlp_only_layers", "[48]", "mlp_only_layers[0]"},
        {"mlp_only_layers", "5", "mlp_only_layers must be a list"},
        {"norm_topk_prob", "\"yes\"", "norm_topk_prob must be true or false"},
        {"rms_norm_eps", "-1", "rms_norm_eps"},
        {"head_dim", "33", "even head_dim"},
        {"eos_token_id", "\"</s>\"", "eos_token_id"},
        {"eos_token_id", "[1, -2]", "eos_token_id[1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct model_config c;
        char err[512] = "";
        int rc = parse_edited(cases[i].key, cases[i].value, &c, err, sizeof err);
        if (rc >= 0 || !strstr(err, cases[i].in_err))
            fail_msg("%s=%s: rc %d, err \"%s\"", cases[i].key,
                     cases[i].value ? cases[i].value : "(removed)", rc, err);
    }
    // A dense layer needs intermediate_size.
    json_t *root = json_loads(A3B, 0, NULL);
    json_object_set_new(root, "mlp_only_layers", json_pack("[i]", 2));
    json_object_del(root, "intermediate_size");
    char *text = json_dumps(root, 0);
    json_decref(root);
    struct model_config c;
    char err[512] = "";
    assert_int_equal(config_parse(text, strlen(text), &c, err, sizeof err), MS_EFORMAT);
    assert_non_null(strstr(err, "intermediate_size"));
    free(text);

    const char *bad[] = {"", "{", "[1, 2]", "{\"hidden_size\": 1, \"hidden_size\": 2}", "nul\0l"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = config_parse(bad[i], i == 4 ? 5 : strlen(bad[i]), &c, err, sizeof err);
        assert_int_equal(rc, MS_EFORMAT);
        assert_non_null(strstr(err, "config.json"));
    }
}

static void generation_config_sets_eos_list_and_sampling_defaults(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(config_parse(A3B, strlen(A3B), &c, err, sizeof err), 0);
    const char *g = "{\"bos_token_id\": 151643, \"do_sample\": true,"
                    " \"eos_token_id\": [151645, 151643], \"pad_token_id\": 151643,"
                    " \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95,"
                    " \"transformers_version\": \"4.51.0\"}";
    assert_int_equal(config_parse_generation(g, strlen(g), &c, err, sizeof err), 0);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_ids[0], 151645);
    assert_int_equal(c.eos_ids[1], 151643);
    assert_true(c.gen.has_temperature && c.gen.temperature == 0.6f);
    assert_true(c.gen.has_top_p && c.gen.top_p == 0.95f);
    assert_true(c.gen.has_top_k && c.gen.top_k == 20);
    assert_false(c.gen.has_min_p);
    assert_false(c.gen.has_repetition_penalty);
    assert_int_equal(c.gen.max_new_tokens, 0);

    const char *g2 = "{\"eos_token_id\": 7, \"min_p\": 0.05, \"repetition_penalty\": 1.1,"
                     " \"max_new_tokens\": 256}";
    assert_int_equal(config_parse_generation(g2, strlen(g2), &c, err, sizeof err), 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 7);
    assert_true(c.gen.has_min_p && c.gen.min_p == 0.05f);
    assert_true(c.gen.has_repetition_penalty && c.gen.repetition_penalty == 1.1f);
    assert_int_equal(c.gen.max_new_tokens, 256);
    assert_true(c.gen.has_temperature); // earlier settings stay
}

static void generation_eos_outside_the_vocabulary_is_dropped(void **state)
{
    (void)state;
    struct model_config c;
    char err[512] = "";
    assert_int_equal(parse_edited("vocab_size", "2048", &c, err, sizeof err), 0);
    c.eos_ids[0] = 2047;
    c.n_eos = 1;
    const char *g = "{\"eos_token_id\": [151645, 5]}";
    assert_int_equal(config_parse_generation(g, strlen(g), &c, err, sizeof err), 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 5);
    // Nothing producible: config.json's list stays.
    const char *g2 = "{\"eos_token_id\": 151645}";
    assert_int_equal(config_parse_generation(g2, strlen(g2), &c, err, sizeof err), 0);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 5);
}

static void malformed_generation_configs_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *json, *in_err;
    } cases[] = {
        {"{\"temperature\": -1}", "temperature"},
        {"{\"temperature\": \"hot\"}", "temperature must be a number"},
        {"{\"top_p\": 0}", "top_p"},
        {"{\"top_p\": 1.5}", "top_p"},
        {"{\"min_p\": 2}", "min_p"},
        {"{\"top_k\": -5}", "top_k"},
        {"{\"repetition_penalty\": 0}", "repetition_penalty"},
        {"{\"eos_token_id\": [1, \"x\"]}", "eos_token_id[1]"},
        {"{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "at most"},
        {"[]", "JSON object"},
        {"{\"top_k\": 20,", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct model_config c;
        char err[512] = "";
        assert_int_equal(config_parse(A3B, strlen(A3B), &c, err, sizeof err), 0);
        int rc = config_parse_generation(cases[i].json, strlen(cases[i].json), &c, err, sizeof err);
        if (rc != MS_EFORMAT || !strstr(err, cases[i].in_err) ||
            !strstr(err, "generation_config.json"))
            fail_msg("%s: rc %d, err \"%s\"", cases[i].json, rc, err);
    }
}

// Values of every JSON type and at the edges of every numeric range.
static const char *hostile[] = {
    "null", "true", "false", "0", "-1", "1", "3", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "1e308", "-1e308", "0.5", "-0.0", "1e-320", "\"\"", "\"x\"",
    "\"bfloat16\"", "[]", "[null]", "[1, \"a\", {}]", "[0, 1, 2]", "{}",
    "{\"rope_type\": \"yarn\", \"factor\": 4.0}", "{\"type\": [], \"factor\": \"x\"}",
};

struct config_sweep {
    json_t *root;
    bool generation; // root is a generation_config.json (read after A3B)
    int parsed, refused;
};

static void parse_swept(const char *key, const char *value, void *ctx)
{
    struct config_sweep *c = ctx;
    char *text = json_dumps(c->root, 0);
    assert_non_null(text);
    struct model_config cfg;
    char err[512] = "";
    int rc;
    if (c->generation) {
        assert_int_equal(config_parse(A3B, strlen(A3B), &cfg, err, sizeof err), 0);
        rc = config_parse_generation(text, strlen(text), &cfg, err, sizeof err);
    } else {
        rc = config_parse(text, strlen(text), &cfg, err, sizeof err);
    }
    if (rc == 0) {
        c->parsed++;
    } else {
        c->refused++;
        if (rc > 0 || !err[0]) fail_msg("%s = %s: rc %d with no reason", key, value, rc);
    }
    free(text);
}

// Every field of Qwen3-30B-A3B's config.json, and of a generation_config.json,
// replaced in turn by every hostile value: parsed, or refused with a reason
// — never a crash, which the AddressSanitizer pass of the test command also
// checks for memory errors.
static void every_field_replaced_by_a_hostile_value_is_parsed_or_refused(void **state)
{
    (void)state;
    const char *gen = "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643],"
                      " \"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95,"
                      " \"min_p\": 0.0, \"repetition_penalty\": 1.0, \"max_new_tokens\": 256}";
    const char *bases[2] = {A3B, gen};
    struct config_sweep c = {0};
    for (int b = 0; b < 2; b++) {
        c.root = json_loads(bases[b], 0, NULL);
        assert_non_null(c.root);
        c.generation = b == 1;
        hostile_json_sweep(c.root, hostile, sizeof hostile / sizeof hostile[0], parse_swept, &c);
        json_decref(c.root);
    }
    assert_true(c.parsed > 0 && c.refused > 0);
}

static void config_load_reads_a_directory_or_a_file(void **state)
{
    (void)state;
    const char *data = getenv("MOESERVE_TEST_DATA");
    assert_non_null(data);
    char path[4096];
    snprintf(path, sizeof path, "%s/qwen3moe-v2048", data);
    struct model_config c;
    char err[512] = "";
    assert_int_equal(config_load(path, &c, err, sizeof err), 0);
    assert_int_equal(c.vocab_size, 2048);
    assert_int_equal(c.head_dim, 32);
    assert_int_equal(c.n_experts, 16);
    assert_true(c.gen.has_top_k && c.gen.top_k == 20); // from generation_config.json
    snprintf(path, sizeof path, "%s/qwen3-dense-v2048/config.json", data);
    assert_int_equal(config_load(path, &c, err, sizeof err), 0);
    assert_int_equal(c.arch, ARCH_QWEN3);
    assert_true(c.gen.has_temperature);
    snprintf(path, sizeof path, "%s/no-such-model", data);
    assert_int_equal(config_load(path, &c, err, sizeof err), MS_ENOTFOUND);
    assert_non_null(strstr(err, "no-such-model"));
}

static void dtype_names_and_sizes(void **state)
{
    (void)state;
    assert_string_equal(dtype_name(DTYPE_BF16), "BF16");
    assert_string_equal(dtype_name(DTYPE_F16), "F16");
    assert_string_equal(dtype_name(DTYPE_F32), "F32");
    assert_int_equal(dtype_size(DTYPE_BF16), 2);
    assert_int_equal(dtype_size(DTYPE_F16), 2);
    assert_int_equal(dtype_size(DTYPE_F32), 4);
}

int main(void)
{
    ms_log_level = MS_LOG_ERROR;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a3b_config_parses_every_field),
        cmocka_unit_test(head_dim_defaults_to_hidden_over_heads),
        cmocka_unit_test(sparse_step_and_mlp_only_layers_choose_moe_layers),
        cmocka_unit_test(dense_qwen3_has_no_moe_layers),
        cmocka_unit_test(unimplemented_settings_are_refused_by_name),
        cmocka_unit_test(default_rope_and_explicit_nulls_are_accepted),
        cmocka_unit_test(fp8_and_gptq_quantization_configs_parse),
        cmocka_unit_test(compressed_tensors_quantization_configs_parse),
        cmocka_unit_test(malformed_configs_are_format_errors),
        cmocka_unit_test(generation_config_sets_eos_list_and_sampling_defaults),
        cmocka_unit_test(generation_eos_outside_the_vocabulary_is_dropped),
        cmocka_unit_test(malformed_generation_configs_are_refused),
        cmocka_unit_test(every_field_replaced_by_a_hostile_value_is_parsed_or_refused),
        cmocka_unit_test(config_load_reads_a_directory_or_a_file),
        cmocka_unit_test(dtype_names_and_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
