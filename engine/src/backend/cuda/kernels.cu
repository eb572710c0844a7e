// thicket's CUDA kernels: K/V rows written into the device-resident paged cache, paged tree
// attention (each row sees its sequence's cached context through the block table plus the
// tree rows on its own root path), and KV row copies. Compiled to PTX by nvcc at build time
// (engine/build.rs) and loaded once per device.
//
// The cache is one allocation: [layer][K or V][slot][kv_head][head_dim] halves.

#include <cuda_fp16.h>

#define MAX_HEAD_DIM 256
#define ROW_FIELDS 7
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

// Paged tree attention. q: f32, element (row, head, d) at row * q_row + head * q_head + d;
// out: [rows][heads * dim]; plan: see backend/cuda/plan.rs. A block takes one (head, row) and
// a run of the row's keys with an online softmax in f32 (attend_keys). A row
// whose keys fit in one run of `split` is done in one pass; longer rows are split into runs
// of `split` keys (blocks along z) whose partial sums a second kernel merges. Where the runs
// fall depends only on the row's own key count, so a row's result never depends on the other
// rows of the batch, and a row of one run gives the same bits either way.

struct RowKeys {
    int context, keys;
    const int* table;
    const int* tree;
};

__device__ __forceinline__ RowKeys row_keys(const int* plan, int row) {
    const int* r = plan + row * ROW_FIELDS;
    return RowKeys{r[0], r[0] + r[3], plan + r[1], plan + r[2]};
}

#define ATT_THREADS 128
#define TILE 128

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// The max (Max) or sum over the ATT_THREADS threads of the block, to every thread (`red`:
// ATT_THREADS / 32 floats).
template <bool Max>
__device__ float block_reduce(float v, float* red) {
    v = Max ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float r = red[0];
    for (int i = 1; i < ATT_THREADS / 32; i++) r = Max ? fmaxf(r, red[i]) : r + red[i];
    return r;
}

// Online softmax over keys [first, last) of one (head, row), ATT_THREADS threads, keys in
// tiles of TILE: each thread scores one key of the tile (its K row read in 16-byte pieces
// against q in shared memory), the tile's max and sum are block reductions, then groups of
// threads, one thread per dimension, add the tile's weighted V rows (each group every G-th
// key). Leaves the block's sums of weighted values in `sums` (shared, dim values) and
// returns (top, total) to every thread.
__device__ float2 attend_keys(const float* __restrict__ q, long long q_row, long long q_head,
                              const __half* __restrict__ cache, long long k_at, long long v_at,
                              RowKeys rk, int first, int last, int heads, int kv_heads,
                              int dim, int block_size, float scale, float* sums) {
    __shared__ float qs[MAX_HEAD_DIM];
    __shared__ float ps[TILE];
    __shared__ int slots[TILE];
    __shared__ float red[ATT_THREADS / 32];
    __shared__ float group_acc[2 * ATT_THREADS];
    int h = blockIdx.x, row = blockIdx.y, t = threadIdx.x;
    int kh = h / (heads / kv_heads);
    int width = kv_heads * dim;
    const float* qr = q + row * q_row + h * q_head;
    for (int d = t; d < dim; d += ATT_THREADS) qs[d] = qr[d] * scale;
    // V: `lanes` threads per group, one dimension each (and a second past ATT_THREADS).
    int lanes = min(dim, ATT_THREADS);
    int groups = ATT_THREADS / lanes;
    int g = t / lanes, d0 = t % lanes;
    bool second = d0 + lanes < dim;
    float acc[2] = {0.f, 0.f};
    float m = -INFINITY, l = 0.f;
    __syncthreads();
    for (int base = first; base < last; base += TILE) {
        int j = base + t;
        float s = -INFINITY;
        if (j < last) {
            int slot = j < rk.context ? rk.table[j / block_size] * block_size + j % block_size
                                      : rk.tree[j - rk.context];
            slots[t] = slot;
            const uint4* kp = (const uint4*)(cache + k_at + (long long)slot * width + kh * dim);
            float dot = 0.f;
            for (int c = 0; c < dim / 8; c++) {
                uint4 w = kp[c];
                const __half2* hw = (const __half2*)&w;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float2 f = __half22float2(hw[i]);
                    dot += qs[c * 8 + 2 * i] * f.x + qs[c * 8 + 2 * i + 1] * f.y;
                }
            }
            s = dot;
        }
        float m_new = fmaxf(m, block_reduce<true>(s, red));
        float p = j < last ? __expf(s - m_new) : 0.f;
        ps[t] = p;
        float keep = __expf(m - m_new);
        l = l * keep + block_reduce<false>(p, red);
        acc[0] *= keep;
        acc[1] *= keep;
        int n = min(TILE, last - base);
        if (g < groups) {
            for (int k = g; k < n; k += groups) {
                const __half* vp = cache + v_at + (long long)slots[k] * width + kh * dim;
                float pk = ps[k];
                acc[0] += pk * __half2float(vp[d0]);
                if (second) acc[1] += pk * __half2float(vp[d0 + lanes]);
            }
        }
        m = m_new;
        __syncthreads();
    }
    if (g < groups) {
        group_acc[g * dim + d0] = acc[0];
        if (second) group_acc[g * dim + d0 + lanes] = acc[1];
    }
    __syncthreads();
    for (int d = t; d < dim; d += ATT_THREADS) {
        float sum = 0.f;
        for (int k = 0; k < groups; k++) sum += group_acc[k * dim + d];
        sums[d] = sum;
    }
    __syncthreads();
    return make_float2(m, l);
}

template <typename Out>
__device__ void attend_whole(const float* q, long long q_row, long long q_head,
                             const __half* cache, long long k_at, long long v_at,
                             const int* plan, Out* out, int heads, int kv_heads, int dim,
                             int block_size, float scale) {
    __shared__ float sums[MAX_HEAD_DIM];
    int h = blockIdx.x, row = blockIdx.y;
    RowKeys rk = row_keys(plan, row);
    float2 tt = attend_keys(q, q_row, q_head, cache, k_at, v_at, rk, 0, rk.keys, heads,
                            kv_heads, dim, block_size, scale, sums);
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        out[(long long)row * heads * dim + h * dim + d] = (Out)(tt.y > 0.f ? sums[d] / tt.y : 0.f);
}

extern "C" __global__ void tree_attention(const float* q, long long q_row, long long q_head,
                                          const __half* cache, long long k_at, long long v_at,
                                          const int* plan, float* out, int heads, int kv_heads,
                                          int dim, int block_size, float scale) {
    attend_whole<float>(q, q_row, q_head, cache, k_at, v_at, plan, out, heads, kv_heads, dim,
                        block_size, scale);
}

extern "C" __global__ void tree_attention_f16(const float* q, long long q_row, long long q_head,
                                              const __half* cache, long long k_at,
                                              long long v_at, const int* plan, __half* out,
                                              int heads, int kv_heads, int dim, int block_size,
                                              float scale) {
    attend_whole<__half>(q, q_row, q_head, cache, k_at, v_at, plan, out, heads, kv_heads, dim,
                         block_size, scale);
}

// One run of `split` keys (run blockIdx.z) of one (head, row): its (top, total, sums[dim])
// at parts[((row * heads + head) * runs + z) * (dim + 2)]. Runs past the row's keys do
// nothing. grid: (heads, rows, runs).
extern "C" __global__ void tree_attention_part(const float* q, long long q_row, long long q_head,
                                               const __half* cache, long long k_at,
                                               long long v_at, const int* plan,
                                               float* __restrict__ parts, int heads,
                                               int kv_heads, int dim, int block_size,
                                               float scale, int split) {
    __shared__ float sums[MAX_HEAD_DIM];
    int h = blockIdx.x, row = blockIdx.y, z = blockIdx.z;
    RowKeys rk = row_keys(plan, row);
    int first = z * split;
    if (first >= rk.keys) return;
    int last = min(first + split, rk.keys);
    float2 tt = attend_keys(q, q_row, q_head, cache, k_at, v_at, rk, first, last, heads,
                            kv_heads, dim, block_size, scale, sums);
    float* part = parts + (((long long)row * heads + h) * gridDim.z + z) * (dim + 2);
    if (threadIdx.x == 0) {
        part[0] = tt.x;
        part[1] = tt.y;
    }
    for (int d = threadIdx.x; d < dim; d += blockDim.x) part[2 + d] = sums[d];
}

// Merges a (head, row)'s runs from tree_attention_part. grid: (heads, rows).
template <typename Out>
__device__ void merge_runs(const float* __restrict__ parts, const int* plan, Out* out,
                           int heads, int dim, int split, int runs) {
    int h = blockIdx.x, row = blockIdx.y;
    RowKeys rk = row_keys(plan, row);
    int used = (rk.keys + split - 1) / split;
    const float* part = parts + ((long long)row * heads + h) * runs * (dim + 2);
    float top = -INFINITY;
    for (int z = 0; z < used; z++) top = fmaxf(top, part[z * (dim + 2)]);
    float total = 0.f;
    for (int z = 0; z < used; z++) {
        const float* p = part + z * (dim + 2);
        if (p[1] > 0.f) total += p[1] * (used == 1 ? 1.f : __expf(p[0] - top));
    }
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float sum = 0.f;
        for (int z = 0; z < used; z++) {
            const float* p = part + z * (dim + 2);
            if (p[1] > 0.f) sum += p[2 + d] * (used == 1 ? 1.f : __expf(p[0] - top));
        }
        out[(long long)row * heads * dim + h * dim + d] = (Out)(total > 0.f ? sum / total : 0.f);
    }
}

extern "C" __global__ void tree_attention_merge(const float* parts, const int* plan, float* out,
                                                int heads, int dim, int split, int runs) {
    merge_runs<float>(parts, plan, out, heads, dim, split, runs);
}

extern "C" __global__ void tree_attention_merge_f16(const float* parts, const int* plan,
                                                    __half* out, int heads, int dim, int split,
                                                    int runs) {
    merge_runs<__half>(parts, plan, out, heads, dim, split, runs);
}

// The fused f16 pass (backend/cuda/fused.rs): every kernel below takes one row per block.

// x[row] = the embedding of the row's token (plan field 6). grid: rows.
extern "C" __global__ void embed(const float* __restrict__ table, const int* __restrict__ plan,
                                 float* __restrict__ x, int hidden) {
    int row = blockIdx.x;
    long long token = plan[row * ROW_FIELDS + 6];
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        x[(long long)row * hidden + i] = table[token * hidden + i];
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < blockDim.x / 32 ? part[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) total = t;
    }
    __syncthreads();
    return total;
}

// x[row] += delta[row] when delta is given (the residual), then
// out[row] = x[row] / sqrt(mean(x[row]^2) + eps) * gamma, as f16. grid: rows.
__device__ void residual_norm(float* __restrict__ x, const __half* __restrict__ delta,
                              const float* __restrict__ gamma, __half* __restrict__ out,
                              int hidden, float eps) {
    int row = blockIdx.x;
    float* xr = x + (long long)row * hidden;
    float squares = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float v = xr[i];
        if (delta != nullptr) {
            v += __half2float(delta[(long long)row * hidden + i]);
            xr[i] = v;
        }
        squares += v * v;
    }
    float inv = rsqrtf(block_sum(squares) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[(long long)row * hidden + i] = __float2half_rn(xr[i] * inv * gamma[i]);
}

extern "C" __global__ void rms_norm(float* x, const float* gamma, __half* out, int hidden,
                                    float eps) {
    residual_norm(x, nullptr, gamma, out, hidden, eps);
}

extern "C" __global__ void add_rms_norm(float* x, const __half* delta, const float* gamma,
                                        __half* out, int hidden, float eps) {
    residual_norm(x, delta, gamma, out, hidden, eps);
}

// One row's q, k and v from the fused projection ([rows][(heads + 2 kv_heads) * dim] f16,
// plus an f32 bias when has_bias): q rotated into q ([rows][heads][dim] f32), k rotated and v
// written at the row's slot (plan field 4) in the cache, RoPE at the row's position (field 5)
// with pairs (2i, 2i+1) when interleaved, else (i, i + dim/2). grid: rows.
extern "C" __global__ void rope_kv(const __half* __restrict__ qkv, const float* __restrict__ bias,
                                   int has_bias, const float* __restrict__ cos,
                                   const float* __restrict__ sin, const int* __restrict__ plan,
                                   float* __restrict__ q, __half* __restrict__ cache,
                                   long long k_at, long long v_at, int heads, int kv_heads,
                                   int dim, int interleaved) {
    int row = blockIdx.x;
    long long slot = plan[row * ROW_FIELDS + 4];
    long long position = plan[row * ROW_FIELDS + 5];
    int half_dim = dim / 2;
    int width = (heads + 2 * kv_heads) * dim;
    int kv_width = kv_heads * dim;
    const __half* src = qkv + (long long)row * width;
    const float* c = cos + position * half_dim;
    const float* s = sin + position * half_dim;
    for (int p = threadIdx.x; p < (heads + kv_heads) * half_dim; p += blockDim.x) {
        int h = p / half_dim, i = p - h * half_dim;
        int a = interleaved ? 2 * i : i;
        int b = interleaved ? 2 * i + 1 : i + half_dim;
        int at = h * dim;
        float xa = __half2float(src[at + a]) + (has_bias ? bias[at + a] : 0.f);
        float xb = __half2float(src[at + b]) + (has_bias ? bias[at + b] : 0.f);
        float ya = xa * c[i] - xb * s[i];
        float yb = xa * s[i] + xb * c[i];
        if (h < heads) {
            float* qr = q + ((long long)row * heads + h) * dim;
            qr[a] = ya;
            qr[b] = yb;
        } else {
            __half* kr = cache + k_at + slot * kv_width + (h - heads) * dim;
            kr[a] = to_half(ya);
            kr[b] = to_half(yb);
        }
    }
    int v_from = (heads + kv_heads) * dim;
    for (int j = threadIdx.x; j < kv_width; j += blockDim.x) {
        float v = __half2float(src[v_from + j]) + (has_bias ? bias[v_from + j] : 0.f);
        cache[v_at + slot * kv_width + j] = to_half(v);
    }
}

// out[row][j] = silu(gate) * up with gate = gate_up[row][j], up = gate_up[row][ffn + j], as
// f16 (computed in f32). grid: rows.
extern "C" __global__ void swiglu(const __half* __restrict__ gate_up, __half* __restrict__ out,
                                  int ffn) {
    int row = blockIdx.x;
    const __half* gu = gate_up + (long long)row * 2 * ffn;
    for (int j = threadIdx.x; j < ffn; j += blockDim.x) {
        float g = __half2float(gu[j]), u = __half2float(gu[ffn + j]);
        out[(long long)row * ffn + j] = __float2half_rn(g / (1.f + expf(-g)) * u);
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

// out[i] = h[plan[list_at + i]]: the rows whose logits are wanted, gathered before the LM
// head (f16 rows of `hidden`). grid: wanted rows.
extern "C" __global__ void gather_rows(const __half* __restrict__ h, const int* __restrict__ plan,
                                       int list_at, __half* __restrict__ out, int hidden) {
    long long from = plan[list_at + blockIdx.x];
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[(long long)blockIdx.x * hidden + i] = h[from * hidden + i];
}
