// sample: logits to tokens on the device the way the CPU backend's sampler
// (model/cpu/sample.c) does it, one CTA per row: logprobs and the top
// alternatives from the raw row, then the allowed mask, logit_bias in order,
// the penalties, then greedy (lowest id among equal maxima) or temperature,
// min_p, top_k (an exact radix select of the k-th largest), top_p (a binary
// search for the smallest probability kept, ties in id order) and the draw:
// the uniform is sampling_uniform(seed, stream, position) from
// model/sampling.h, the same counter-based Philox draw as the CPU's, walked
// over the weights in id order. Sums are in double in a fixed order, so the
// same row draws the same token every time. Against the CPU a draw can move
// only where a boundary falls within rounding of it: CUDA's expf and logf
// (min_p's threshold) are within 2 ulp of glibc's, and the total is summed
// per thread then in a tree where the CPU sums blocks of CPU_EXP_BLOCK. The
// mask, bias, penalties (each product rounded as the CPU rounds it), greedy
// and the top_k and top_p cuts on equal inputs keep the same tokens.
//
// The host side (backend_cuda.cu) checks the parameters, deduplicates the
// penalty ids and packs every row's tables into one upload.
#include "gpu/kernels.cuh"

#include <math.h>

#define SAMPLE_THREADS 1024
#define SAMPLING_EPS 1e-5f

__device__ __forceinline__ float clean(float v) { return isnan(v) ? -INFINITY : v; }

__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

struct red {
    double d[32];
    float f[32];
    int i[32];
    double scan[SAMPLE_THREADS];
};

// The best (value, id) of the block by (value descending, id ascending).
__device__ void block_best(float &v, int &id, struct red *r)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (oi >= 0 && (id < 0 || ranks_before(ov, oi, v, id))) v = ov, id = oi;
    }
    __syncthreads();
    if (lane == 0) r->f[warp] = v, r->i[warp] = id;
    __syncthreads();
    if (warp == 0) {
        v = r->f[lane];
        id = r->i[lane];
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (oi >= 0 && (id < 0 || ranks_before(ov, oi, v, id))) v = ov, id = oi;
        }
        if (lane == 0) r->f[0] = v, r->i[0] = id;
    }
    __syncthreads();
    v = r->f[0];
    id = r->i[0];
    __syncthreads();
}

__device__ float block_max(float v, struct red *r)
{
    int id = 0; // every id equal: only the values decide
    block_best(v, id, r);
    return v;
}

__device__ int block_min_int(int v, struct red *r)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) r->i[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = r->i[lane];
        for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) r->i[0] = v;
    }
    __syncthreads();
    v = r->i[0];
    __syncthreads();
    return v;
}

// Each thread's exclusive prefix of x over the block, in thread order.
__device__ double block_exclusive_scan(double x, struct red *r)
{
    __syncthreads();
    r->scan[threadIdx.x] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        double at = 0;
        for (int t = 0; t < (int)blockDim.x; t++) {
            const double c = r->scan[t];
            r->scan[t] = at;
            at += c;
        }
    }
    __syncthreads();
    const double v = r->scan[threadIdx.x];
    __syncthreads();
    return v;
}

__device__ __forceinline__ uint32_t order_key(float f)
{
    const uint32_t u = __float_as_uint(f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

__device__ __forceinline__ float key_float(uint32_t k)
{
    return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

// The k-th largest of w (1-based, no NaN), by four 8-bit radix passes.
__device__ float kth_largest(const float *w, int V, int k, int *hist)
{
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const uint32_t key = order_key(w[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        __shared__ int pick[2];
        if (threadIdx.x == 0) {
            int d = 255, above = 0;
            for (; d > 0 && above + hist[d] < k; d--) above += hist[d];
            pick[0] = d;
            pick[1] = above;
        }
        __syncthreads();
        prefix |= (uint32_t)pick[0] << shift;
        mask |= 255u << shift;
        k -= pick[1];
        __syncthreads();
    }
    return key_float(prefix);
}

// Sum of p over the elements whose bits exceed key (p >= 0).
__device__ double mass_above(const float *p, int V, uint32_t key, struct red *r)
{
    double s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (__float_as_uint(p[i]) > key) s += p[i];
    return block_sum_d(s, r->d);
}

__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(const struct cuda_sample p)
{
    __shared__ struct red r;
    __shared__ int hist[256];
    const struct cuda_sample_row row = p.rows[blockIdx.x];
    const int V = p.vocab;
    const float *L = row.logits;
    float *W = p.work + (size_t)blockIdx.x * V;
    float *P = p.probs + (size_t)blockIdx.x * V;
    struct sample_token *out = p.out + blockIdx.x;
    const bool want_lp = row.score >= 0 || row.logprobs >= 0;
    double lse = 0;
    if (want_lp) {
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, clean(L[i]));
        mx = block_max(mx, &r);
        if (!isfinite(mx)) {
            lse = mx;
        } else {
            double s = 0;
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                const float v = clean(L[i]);
                s += v == -INFINITY ? 0.0f : expf(v - mx);
            }
            lse = (double)mx + log(block_sum_d(s, r.d));
        }
        int k = row.score >= 0 ? row.prompt_logprobs : row.logprobs;
        if (k > SAMPLING_MAX_LOGPROBS) k = SAMPLING_MAX_LOGPROBS;
        if (k > V) k = V;
        float prev_v = INFINITY;
        int prev_i = -1, m = 0;
        for (int j = 0; j < k; j++) {
            float bv = -INFINITY;
            int bi = -1;
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                const float v = clean(L[i]);
                if (j > 0 && !ranks_before(prev_v, prev_i, v, i)) continue;
                if (bi < 0 || ranks_before(v, i, bv, bi)) bv = v, bi = i;
            }
            block_best(bv, bi, &r);
            if (bi < 0) break;
            if (threadIdx.x == 0) out->top[m] = {bi, (float)((double)bv - lse)};
            m++;
            prev_v = bv;
            prev_i = bi;
        }
        if (threadIdx.x == 0) out->n_top = m;
    } else if (threadIdx.x == 0) {
        out->n_top = 0;
    }
    if (row.score >= 0) {
        // The rank as the CPU's score_row counts it: the logits >= the token's.
        const float v = clean(L[row.score]);
        double ge = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) ge += clean(L[i]) >= v ? 1.0 : 0.0;
        ge = block_sum_d(ge, r.d);
        if (threadIdx.x == 0) {
            out->id = row.score;
            out->logprob = v == -INFINITY ? -INFINITY : (float)((double)v - lse);
            out->rank = (int32_t)ge;
        }
        return;
    }
    // The working row: the mask first, then the bias in order, then the penalties.
    const uint32_t *allowed = row.allowed_off >= 0 ? p.words + row.allowed_off : nullptr;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        W[i] = allowed && !(allowed[i >> 5] >> (i & 31) & 1u) ? -INFINITY : L[i];
    __syncthreads();
    if (threadIdx.x == 0)
        for (int j = 0; j < row.n_bias; j++) {
            const struct sampling_logit_bias b = p.bias[row.bias_off + j];
            W[b.id] += b.bias;
        }
    __syncthreads();
    for (int j = threadIdx.x; j < row.n_pen; j += blockDim.x) {
        const struct cuda_penalty e = p.pen[row.pen_off + j]; // ids distinct
        float v = W[e.id];
        if (row.rep != 1.0f && e.seen) v = v > 0 ? v / row.rep : v * row.rep;
        if ((row.freq != 0.0f || row.pres != 0.0f) && e.count > 0)
            // Rounded as the C11 CPU code does (nvcc would fuse an FMA here).
            v -= __fadd_rn(__fmul_rn(row.freq, (float)e.count), row.pres);
        W[e.id] = v;
    }
    __syncthreads();
    int id;
    if (row.temperature < SAMPLING_EPS || row.top_k == 1) {
        float bv = -INFINITY;
        int bi = -1;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = clean(W[i]);
            if (bi < 0 || ranks_before(v, i, bv, bi)) bv = v, bi = i;
        }
        block_best(bv, bi, &r);
        id = bi;
    } else {
        const float inv_t = 1.0f / row.temperature;
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = isnan(W[i]) ? -INFINITY : W[i] * inv_t;
            W[i] = v;
            mx = fmaxf(mx, v);
        }
        mx = block_max(mx, &r);
        int best = V - 1;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            if (W[i] == mx) {
                best = i;
                break;
            }
        best = block_min_int(best, &r);
        if (!isfinite(mx)) {
            id = best;
            goto done;
        }
        if (row.min_p > 0) {
            const float thr = mx + logf(row.min_p);
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (W[i] < thr && i != best) W[i] = -INFINITY;
            __syncthreads();
        }
        if (row.top_k > 0 && row.top_k < V) {
            const float kth = kth_largest(W, V, row.top_k, hist);
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (W[i] < kth) W[i] = -INFINITY;
            __syncthreads();
        }
        if (row.top_p < 1.0f) {
            double s = 0;
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                const float e = W[i] == -INFINITY ? 0.0f : expf(W[i] - mx);
                P[i] = e;
                s += e;
            }
            const float inv = (float)(1.0 / block_sum_d(s, r.d));
            for (int i = threadIdx.x; i < V; i += blockDim.x) P[i] *= inv;
            __syncthreads();
            // The smallest kept probability: the least key whose mass above is below top_p.
            uint32_t lo = 0, hi = 0x7f800000u;
            while (lo < hi) {
                const uint32_t mid = lo + (hi - lo) / 2;
                if (mass_above(P, V, mid, &r) < (double)row.top_p) hi = mid;
                else lo = mid + 1;
            }
            const double above = mass_above(P, V, lo, &r);
            const float vcut = __uint_as_float(lo);
            // Ties at the cut are kept in id order while the mass before them stays below.
            const int cs = (V + (int)blockDim.x - 1) / (int)blockDim.x;
            const int c0 = min(V, (int)threadIdx.x * cs), c1 = min(V, c0 + cs);
            int ties = 0;
            for (int i = c0; i < c1; i++) ties += lo > 0 && __float_as_uint(P[i]) == lo;
            int j = (int)block_exclusive_scan((double)ties, &r);
            for (int i = c0; i < c1; i++) {
                const uint32_t b = __float_as_uint(P[i]);
                bool keep = P[i] > 0 && b > lo;
                if (lo > 0 && b == lo) keep = above + (double)j++ * vcut < (double)row.top_p;
                if (!keep) W[i] = -INFINITY;
            }
            __syncthreads();
        }
        // The draw: weights in id order, the first whose running sum passes u * total.
        const int cs = (V + (int)blockDim.x - 1) / (int)blockDim.x;
        const int c0 = min(V, (int)threadIdx.x * cs), c1 = min(V, c0 + cs);
        double mine = 0;
        int last = -1;
        for (int i = c0; i < c1; i++) {
            const float e = W[i] == -INFINITY ? 0.0f : expf(W[i] - mx);
            P[i] = e;
            mine += e;
            if (e > 0) last = i;
        }
        const double before = block_exclusive_scan(mine, &r);
        const double total = block_sum_d(mine, r.d);
        const double target = sampling_uniform(row.seed, row.stream, row.position) * total;
        int pick = V; // none
        if (mine > 0 && before <= target && before + mine > target) {
            double acc = before;
            for (int i = c0; i < c1; i++) {
                if (P[i] <= 0) continue;
                acc += P[i];
                pick = i;
                if (acc > target) break;
            }
        }
        pick = block_min_int(pick, &r);
        const int last_live = -block_min_int(-last, &r);
        id = pick < V ? pick : last_live >= 0 ? last_live : best;
    }
done:
    if (allowed && !(allowed[id >> 5] >> (id & 31) & 1u)) {
        int first = V;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            if (allowed[i >> 5] >> (i & 31) & 1u) {
                first = i;
                break;
            }
        first = block_min_int(first, &r);
        if (first < V) id = first;
    }
    if (threadIdx.x == 0) {
        out->id = id;
        out->rank = 0;
        if (want_lp) {
            const float v = clean(L[id]);
            out->logprob = v == -INFINITY ? -INFINITY : (float)((double)v - lse);
        } else {
            out->logprob = 0;
        }
    }
}

cudaError_t cuda_sample(cudaStream_t s, const struct cuda_sample *p, int n)
{
    if (n <= 0) return cudaSuccess;
    sample_kernel<<<n, SAMPLE_THREADS, 0, s>>>(*p);
    return launch_status();
}
