// fuzz_config: config.json and generation_config.json text through
// model/config (the first byte picks which; generation_config.json is merged
// into a valid config.json's result). Promises: accepted values are the
// shapes the loader relies on (positive sizes, heads that group, eos ids
// within the vocabulary's range and count, quantization groups whole units
// of 8), or a refusal with a sentence;
// nothing leaks.
#include "model/config.h"
#include "tests/fuzz/fuzz.h"

static const char *base_config =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\","
    " \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 128,"
    " \"moe_intermediate_size\": 32, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"rms_norm_eps\": 1e-6,"
    " \"rope_theta\": 1000000.0, \"max_position_embeddings\": 4096,"
    " \"tie_word_embeddings\": false, \"vocab_size\": 2048, \"torch_dtype\": \"bfloat16\","
    " \"bos_token_id\": 1, \"eos_token_id\": 2}";

static void check_config(const struct model_config *c)
{
    FUZZ_CHECK(c->hidden_size > 0 && c->n_layers > 0 && c->n_layers <= CONFIG_MAX_LAYERS &&
                   c->n_heads > 0 && c->n_kv_heads > 0 && c->head_dim > 0 && c->vocab_size > 0,
               "sizes %d %d %d %d %d %d", c->hidden_size, c->n_layers, c->n_heads, c->n_kv_heads,
               c->head_dim, c->vocab_size);
    FUZZ_CHECK(c->n_heads % c->n_kv_heads == 0, "%d heads over %d kv heads", c->n_heads,
               c->n_kv_heads);
    FUZZ_CHECK(c->n_eos >= 0 && c->n_eos <= CONFIG_MAX_EOS, "%d eos ids", c->n_eos);
    for (int i = 0; i < c->n_eos; i++)
        FUZZ_CHECK(c->eos_ids[i] >= 0, "eos id %d", c->eos_ids[i]);
    const struct quant_config *q = &c->quant;
    FUZZ_CHECK(q->group >= 0 && q->group % 8 == 0 && q->block_rows >= 0 && q->block_cols >= 0 &&
                   q->zero_offset >= 0 && q->zero_offset <= 1,
               "quantization: group %d, blocks %d x %d, zero offset %d", q->group, q->block_rows,
               q->block_cols, q->zero_offset);
    FUZZ_CHECK(q->method != QUANT_METHOD_AWQ || q->zero_offset == 0, "an AWQ zero offset of %d", q->zero_offset);
    FUZZ_CHECK(q->method != QUANT_METHOD_CT_INT || q->bits == 4 || (q->bits == 8 && q->sym),
               "compressed-tensors int weights of %d bits (symmetric %d)", q->bits, (int)q->sym);
    bool any_moe = false;
    for (int i = 0; i < c->n_layers; i++) any_moe |= c->layer_is_moe[i];
    if (any_moe)
        FUZZ_CHECK(c->n_experts_per_tok >= 1 && c->n_experts_per_tok <= c->n_experts &&
                       c->moe_intermediate_size > 0,
                   "top-%d of %d experts", c->n_experts_per_tok, c->n_experts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1) return 0;
    const char *json = (const char *)data + 1;
    struct model_config *c = calloc(1, sizeof *c);
    if (!c) return 0;
    char err[512] = "";
    int rc;
    if (data[0] & 1) {
        rc = config_parse(json, n - 1, c, err, sizeof err);
    } else {
        rc = config_parse(base_config, strlen(base_config), c, err, sizeof err);
        FUZZ_CHECK(!rc, "the base config is refused: %s", err);
        rc = config_parse_generation(json, n - 1, c, err, sizeof err);
    }
    if (rc) FUZZ_REFUSAL(rc, err);
    else check_config(c);
    free(c);
    return 0;
}
