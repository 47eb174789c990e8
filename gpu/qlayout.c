// qlayout: the host side of the CUDA backend's quantized layout (qlayout.h):
// canonical rows packed into a block.
#include "gpu/qlayout.h"

#include <string.h>

#include "base/base.h"

void ql_pack_block(const struct quant_rows *r, void *dst)
{
    const enum quant_format f = r->format;
    const int K = r->cols, ng = r->n_groups;
    uint8_t *blk = dst;
    memset(blk, 0, quant_block_bytes(f, K, r->group));
    uint8_t *val = blk + quant_block_header_bytes(f, K, r->group);
    for (int j = 0; j < r->n && j < QUANT_BLOCK_ROWS; j++) {
        for (int g = 0; g < ng; g++) {
            const float s = r->scale[(size_t)j * ng + g];
            if (f == QUANT_INT4) {
                const uint16_t h = ms_f32_to_f16(s); // an fp16 value by the format's contract
                memcpy(blk + ql_scale_off(f, g, j), &h, sizeof h);
                blk[ql_zero_off(g, j)] = r->zero[(size_t)j * ng + g];
            } else {
                memcpy(blk + ql_scale_off(f, g, j), &s, sizeof s);
            }
        }
        const uint8_t *q = r->q + (size_t)j * K;
        for (int k = 0; k < K; k++) {
            int shift;
            const size_t at = ql_value_off(f, K, j, k, &shift);
            if (f == QUANT_INT4) val[at] |= (uint8_t)((q[k] & 15u) << shift);
            else val[at] = q[k];
        }
    }
}
