// thicket's CUDA kernels: K/V rows written into the device-resident paged cache, paged tree
// attention (each row sees its sequence's cached context through the block table plus the
// tree rows on its own root path), and KV row copies. Compiled to PTX by nvcc at build time
// (engine/build.rs) and loaded once per device.
//
// The cache is one allocation: [layer][K or V][slot][kv_head][head_dim] halves.

#include <cuda_fp16.h>

#define MAX_DIMS_PER_LANE 8   // head_dim <= 256
#define WARPS 8
#define ROW_FIELDS 4
#define F16_MAX 65504.0f

__device__ __forceinline__ __half to_half(float x) {
    return __float2half_rn(fminf(fmaxf(x, -F16_MAX), F16_MAX));
}

// k: [kv_heads][rows][dim] (head-major, as RoPE leaves it); v: [rows][kv_heads * dim].
// grid: rows; block: any.
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    __half* __restrict__ cache, long long k_at, long long v_at,
                                    const int* __restrict__ slots, int rows, int kv_heads,
                                    int dim) {
    int row = blockIdx.x;
    int width = kv_heads * dim;
    long long at = (long long)slots[row] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        int h = i / dim, d = i - h * dim;
        cache[k_at + at + i] = to_half(k[((long long)h * rows + row) * dim + d]);
        cache[v_at + at + i] = to_half(v[(long long)row * width + i]);
    }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// q: [heads][rows][dim]; out: [rows][heads * dim]. plan: see backend/cuda/plan.rs.
// grid: (heads, rows); block: WARPS * 32. Each warp takes every WARPS-th key with an online
// softmax in f32 (lane l holds dims l, l + 32, ...); the warps' partial sums are merged at
// the end. A row's result depends only on its own keys, never on the other rows.
extern "C" __global__ void tree_attention(const float* __restrict__ q,
                                          const __half* __restrict__ cache, long long k_at,
                                          long long v_at, const int* __restrict__ plan,
                                          float* __restrict__ out, int rows, int heads,
                                          int kv_heads, int dim, int block_size, float scale) {
    int h = blockIdx.x, row = blockIdx.y;
    int kh = h / (heads / kv_heads);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int per_lane = dim / 32;
    const int* r = plan + row * ROW_FIELDS;
    int context = r[0];
    const int* table = plan + r[1];
    const int* tree = plan + r[2];
    int keys = context + r[3];
    int width = kv_heads * dim;

    float qv[MAX_DIMS_PER_LANE], acc[MAX_DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; i++) {
        qv[i] = i < per_lane ? q[((long long)h * rows + row) * dim + lane + 32 * i] : 0.f;
        acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = warp; j < keys; j += WARPS) {
        int slot = j < context ? table[j / block_size] * block_size + j % block_size
                               : tree[j - context];
        long long at = (long long)slot * width + kh * dim;
        const __half* kp = cache + k_at + at;
        const __half* vp = cache + v_at + at;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < MAX_DIMS_PER_LANE; i++)
            if (i < per_lane) s += qv[i] * __half2float(kp[lane + 32 * i]);
        s = warp_sum(s) * scale;
        float m_new = fmaxf(m, s);
        float keep = __expf(m - m_new), p = __expf(s - m_new);
        l = l * keep + p;
#pragma unroll
        for (int i = 0; i < MAX_DIMS_PER_LANE; i++)
            if (i < per_lane) acc[i] = acc[i] * keep + p * __half2float(vp[lane + 32 * i]);
        m = m_new;
    }

    __shared__ float warp_m[WARPS], warp_l[WARPS];
    __shared__ float warp_acc[WARPS][32 * MAX_DIMS_PER_LANE];
    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; i++)
        if (i < per_lane) warp_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float top = -INFINITY;
    for (int w = 0; w < WARPS; w++) top = fmaxf(top, warp_m[w]);
    float total = 0.f;
    for (int w = 0; w < WARPS; w++)
        if (warp_l[w] > 0.f) total += warp_l[w] * __expf(warp_m[w] - top);
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float sum = 0.f;
        for (int w = 0; w < WARPS; w++)
            if (warp_l[w] > 0.f) sum += warp_acc[w][d] * __expf(warp_m[w] - top);
        out[(long long)row * heads * dim + h * dim + d] = total > 0.f ? sum / total : 0.f;
    }
}

// Copies slot `from` to slot `to` in every plane (each layer's K and V) for each pair of
// `moves` ([from, to] pairs, no slot both read and written). grid: (pairs, planes).
extern "C" __global__ void kv_copy(__half* __restrict__ cache, const int* __restrict__ moves,
                                   long long plane, int width) {
    const int* m = moves + 2 * blockIdx.x;
    long long base = (long long)blockIdx.y * plane;
    const __half* src = cache + base + (long long)m[0] * width;
    __half* dst = cache + base + (long long)m[1] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}
