// cmd_make_model: `moeserve make-model` — writes a random-weight Qwen3-MoE
// checkpoint (tiny for tests, demo for the README) in Hugging Face layout.
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/cli.h"
#include "model/makemodel.h"
#include "moeserve_build.h"
#include "server/commands.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moeserve make-model --shape tiny|demo|mid --out DIR [--seed N] "
            "[--tokenizer-dir DIR]\n"
            "                           [--quantization fp8|gptq|awq|ct-w4a16|ct-w8a16|ct-fp8\n"
            "                            [--group-size N] [--asym] [--desc-act]]\n\n"
            "Writes config.json, generation_config.json, model.safetensors (bf16, random\n"
            "weights from a generator seeded by --seed, default 0) and the Qwen3\n"
            "tokenizer.json and tokenizer_config.json into DIR.\n\n"
            "  --shape tiny    hidden 64, 2 layers, 8 experts top-2, vocabulary 151936 (tests)\n"
            "  --shape demo    hidden 512, 8 layers, 32 experts top-4, vocabulary 151936\n"
            "  --shape mid     hidden 1024, 12 layers, 64 experts top-8 (moe_intermediate 384),\n"
            "                  16/4 heads of 64, vocabulary 151936: 1.25B parameters\n"
            "  --tokenizer-dir where tokenizer.json comes from (default %s)\n"
            "  --quantization  the projections (attention, experts, MLPs) quantized from the\n"
            "                  same bf16 values: fp8 (e4m3, weight_scale_inv per 128x128 block,\n"
            "                  as Qwen's FP8 releases), gptq (4-bit, group 128, v1 format, as\n"
            "                  Qwen's GPTQ-Int4), awq (4-bit with zero points, group 128,\n"
            "                  AutoAWQ's GEMM layout) or compressed-tensors as llm-compressor\n"
            "                  saves it: ct-w4a16 and ct-w8a16 (pack-quantized int4 and int8\n"
            "                  by group), ct-fp8 (float-quantized FP8 by channel, as the\n"
            "                  FP8-dynamic releases); the rest stays bf16\n"
            "  --group-size N  the FP8 block (N x N) or GPTQ/AWQ/ct-w group size (128)\n"
            "  --asym          GPTQ or ct-w4a16 with zero points per group (default symmetric)\n"
            "  --desc-act      GPTQ, ct-w4a16 or ct-w8a16 quantized in act-order: each\n"
            "                  projection's inputs grouped in an order of their own, which\n"
            "                  g_idx (weight_g_idx) says (desc_act true, actorder group)\n",
            MOESERVE_TOKENIZER_DIR);
}

int cmd_make_model(int argc, char **argv)
{
    static const struct option opts[] = {
        {"shape", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 'S'},
        {"tokenizer-dir", required_argument, NULL, 't'},
        {"quantization", required_argument, NULL, 'q'},
        {"group-size", required_argument, NULL, 'g'},
        {"asym", no_argument, NULL, 'a'},
        {"desc-act", no_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *shape = NULL, *out = NULL, *tok = MOESERVE_TOKENIZER_DIR;
    uint64_t seed = 0;
    enum quant_method quant = QUANT_METHOD_NONE;
    long group = 0;
    bool asym = false, desc_act = false;
    int bits = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's': shape = optarg; break;
        case 'o': out = optarg; break;
        case 't': tok = optarg; break;
        case 'S': {
            char err[256];
            if (cli_parse_u64("--seed", optarg, &seed, err, sizeof err)) {
                fprintf(stderr, "moeserve make-model: %s\n", err);
                return 2;
            }
            break;
        }
        case 'q': {
            char err[256];
            if (!strcmp(optarg, "fp8")) quant = QUANT_METHOD_FP8;
            else if (!strcmp(optarg, "gptq") || !strcmp(optarg, "int4")) quant = QUANT_METHOD_GPTQ;
            else if (!strcmp(optarg, "awq")) quant = QUANT_METHOD_AWQ;
            else if (!strcmp(optarg, "ct-w4a16")) quant = QUANT_METHOD_CT_INT, bits = 4;
            else if (!strcmp(optarg, "ct-w8a16")) quant = QUANT_METHOD_CT_INT, bits = 8;
            else if (!strcmp(optarg, "ct-fp8")) quant = QUANT_METHOD_CT_FP8;
            else {
                cli_refuse("--quantization", optarg, "fp8, gptq, awq, ct-w4a16, ct-w8a16 or ct-fp8", err, sizeof err);
                fprintf(stderr, "moeserve make-model: %s\n", err);
                return 2;
            }
            break;
        }
        case 'g': {
            char err[256];
            int64_t v;
            if (cli_parse_int("--group-size", optarg, 8, 65536, &v, err, sizeof err) ||
                (v % 8 && cli_refuse("--group-size", optarg, "a multiple of 8", err, sizeof err))) {
                fprintf(stderr, "moeserve make-model: %s\n", err);
                return 2;
            }
            group = (long)v;
            break;
        }
        case 'a': asym = true; break;
        case 'd': desc_act = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "moeserve make-model: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!shape || !out) {
        fprintf(stderr, "moeserve make-model: --shape and --out are required\n\n");
        usage(stderr);
        return 2;
    }
    char err[1024];
    struct makemodel_spec spec;
    if (makemodel_spec_for_shape(shape, &spec, err, sizeof err)) {
        fprintf(stderr, "moeserve make-model: %s\n", err);
        return 2;
    }
    if (asym && quant != QUANT_METHOD_GPTQ && !(quant == QUANT_METHOD_CT_INT && bits == 4)) {
        fprintf(stderr, "moeserve make-model: --asym is for --quantization gptq or ct-w4a16\n");
        return 2;
    }
    if (desc_act && quant != QUANT_METHOD_GPTQ && quant != QUANT_METHOD_CT_INT) {
        fprintf(stderr, "moeserve make-model: --desc-act is for --quantization gptq, ct-w4a16 or ct-w8a16\n");
        return 2;
    }
    spec.quant = quant;
    spec.quant_act_order = desc_act;
    spec.quant_bits = bits;
    spec.quant_group = (int)group;
    spec.quant_asym = asym;
    double t0 = ms_now();
    if (makemodel_write(&spec, out, seed, tok, err, sizeof err)) {
        fprintf(stderr, "moeserve make-model: %s\n", err);
        return 1;
    }
    uint64_t params = makemodel_param_count(&spec);
    printf("wrote %s: %s model%s%s, %" PRIu64 " parameters (%.1f MiB in bf16), seed %" PRIu64
           ", %.2f s\n", out, shape,
           quant == QUANT_METHOD_FP8    ? " (fp8 projections)"
           : quant == QUANT_METHOD_AWQ  ? " (awq int4 projections)"
           : quant == QUANT_METHOD_CT_FP8 ? " (compressed-tensors fp8 projections)"
           : quant == QUANT_METHOD_CT_INT ? (bits == 8 ? " (compressed-tensors int8 projections)"
                                                      : asym ? " (compressed-tensors int4 asymmetric projections)"
                                                             : " (compressed-tensors int4 projections)")
           : quant == QUANT_METHOD_GPTQ ? (asym ? " (gptq int4 asymmetric projections)" : " (gptq int4 projections)")
                                        : "",
           desc_act ? " in act-order" : "", params, (double)params * 2 / (1024.0 * 1024.0), seed, ms_now() - t0);
    return 0;
}
