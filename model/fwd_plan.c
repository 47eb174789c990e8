// fwd_plan: the routing sort, row bounds and decode buckets (fwd_plan.h).
#include "model/fwd_plan.h"

#include <stddef.h>
#include <string.h>

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

int fwd_plan_route_rows(int n_pairs, int n_groups, int pad)
{
    if (n_pairs < 0 || n_groups < 0 || pad < 1) return 0;
    const long long nonempty = n_groups < n_pairs ? n_groups : n_pairs;
    const long long rows = (long long)n_pairs + nonempty * (pad - 1);
    return rows > INT32_MAX ? 0 : (int)rows;
}

// A counting sort: the pairs in (token, slot) order land in their expert's
// rows in that order, so tokens ascend within each expert.
void fwd_plan_route(const int32_t *ids, const int32_t *live, int n_tokens, int k, int e0, int e1,
                     int pad, int32_t *off, int32_t *count, int32_t *slot, int32_t *token,
                     int32_t *pair, int32_t *cursor)
{
    const int n = e1 - e0, P = n_tokens * k;
    memset(count, 0, (size_t)n * sizeof *count);
    for (int p = 0; p < P; p++) {
        const int e = ids[p];
        if (e >= e0 && e < e1 && (!live || live[p / k])) count[e - e0]++;
    }
    off[0] = 0;
    for (int g = 0; g < n; g++) {
        off[g + 1] = off[g] + fwd_plan_padded(count[g], pad);
        cursor[g] = off[g];
        for (int r = off[g] + count[g]; r < off[g + 1]; r++) {
            token[r] = -1;
            if (pair) pair[r] = -1;
        }
    }
    for (int p = 0; p < P; p++) {
        const int e = ids[p];
        if (e < e0 || e >= e1 || (live && !live[p / k])) {
            slot[p] = -1;
            continue;
        }
        const int r = cursor[e - e0]++;
        slot[p] = r;
        token[r] = p / k;
        if (pair) pair[r] = p;
    }
}

int fwd_plan_bucket(int n, int cap)
{
    if (n < 1 || n > cap) return 0;
    int b;
    if (n <= 8) {
        b = 1;
        while (b < n) b *= 2;
    } else if (n <= 64) {
        b = ceil_div(n, 8) * 8;
    } else {
        b = ceil_div(n, 32) * 32;
    }
    return b > cap ? cap : b;
}

int fwd_plan_buckets(int cap, int *out, int max)
{
    int n = 0, last = 0;
    for (int i = 1; i <= cap; i++) {
        const int b = fwd_plan_bucket(i, cap);
        if (b != last) {
            if (out && n < max) out[n] = b;
            n++;
            last = b;
        }
    }
    return !out || n < max ? n : max;
}
