// Row-wise kernels: the softmax passes of standard attention and the per-row set-up and finishing
// of the flash kernels (docs/KERNELS.md, rowwise.cu).
//
// A block of THREADS threads takes ROWS_PER_BLOCK consecutive rows, one after another, of the n_rows
// rows of batch*head bh = blockIdx.z (several when rows are short: fewer, fuller blocks). Rows stream
// in 16-byte chunks when every row starts 16-byte aligned (aligned base, n a multiple of the chunk), element by element otherwise; both count the same bytes. Each thread
// loads ROW_ROUND chunks of a row before it uses any, so a whole row of 4096 is in flight at once.
// A row's scalars (m, l, D) are loaded once, by thread 0, and broadcast through shared memory.
// Masked S (causal plans, explicit masks): S is already −inf where masked (the qk product wrote it); a row
// with no visible key has m = −inf (rowmax), and rowsum and normalize give it l = 0 and P = 0 instead of
// NaN, whatever the mask (a test per row, so every build does it; CAUSAL changes nothing here).
// DROPOUT (rowdot and ds of the standard backward; common.cuh): dP as stored is the raw dO Vᵀ, and both
// kernels multiply it by the dropout multipliers Z of its elements (element (row, j) of batch·head bh):
// D = rowsum(P ∘ Z ∘ dP), dS = P ∘ (Z ∘ dP − D).
// The flash kernels here move short rows (d <= 256): a block's rows as one flat run (RowBlock).
#include "common.cuh"

#if !defined(THREADS) || !defined(SMEM_PARTIALS) || !defined(SMEM_BYTES) || !defined(ROWS_PER_BLOCK)
#error "rowwise.cu needs THREADS, SMEM_PARTIALS, SMEM_BYTES and ROWS_PER_BLOCK from the plan"
#endif

constexpr int ROW_WARPS = THREADS / 32;
constexpr int ROW_ROUND = 4;  // chunks per thread per tensor in flight
// Blocks per SM (__launch_bounds__): a softmax-pass block has one row (8-16 KB at n = 4096) in flight,
// so bandwidth needs many of them. Each kernel asks for as many as its builds fit without spilling:
// the counting build keeps per-tensor counters in registers, which costs some kernels occupancy.
#ifdef IOK_COUNT
constexpr bool ROW_COUNTING = true;
#else
constexpr bool ROW_COUNTING = false;
#endif
constexpr int ROW_MIN_BLOCKS_STATS = ROW_COUNTING ? 5 : 6;  // rowmax, rowsum
constexpr int ROW_MIN_BLOCKS_SOFTMAX = ROW_COUNTING ? 4 : 6;  // normalize
constexpr int ROW_MIN_BLOCKS = 4;  // rowdot, ds
#ifdef DROPOUT
constexpr int ROW_MIN_BLOCKS_DS = ROW_COUNTING ? 2 : 3;  // ds regenerating Z: Philox beside two rounds in flight
#else
constexpr int ROW_MIN_BLOCKS_DS = ROW_MIN_BLOCKS;
#endif
constexpr int ROW_MIN_BLOCKS_PREP = ROW_COUNTING ? 6 : 8;  // flash_bwd_prep
constexpr int ROW_MIN_BLOCKS_FLAT = 8;  // the flash set-up and finishing kernels (up to 32 registers)
static_assert(THREADS % 32 == 0, "whole warps");
// PARTIALS: one float per warp for block reductions, then two broadcast scalars
static_assert(SMEM_PARTIALS % 16 == 0 && SMEM_PARTIALS + ROW_WARPS * 16 <= SMEM_BYTES,
              "PARTIALS ends within SMEM_BYTES");
static_assert((ROW_WARPS + 2) * 4 <= ROW_WARPS * 16, "PARTIALS holds the warp partials and two scalars");

__device__ __forceinline__ float row_neg_inf()
{
    return __int_as_float(0xff800000);
}

template <typename T>
struct RowVec {
    static constexpr int N = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte chunk
};

// True when rows of n elements starting at p are all 16-byte aligned.
template <typename T>
__device__ __forceinline__ bool row_vector_ok(const T* p, int n)
{
    return reinterpret_cast<size_t>(p) % 16 == 0 && n % RowVec<T>::N == 0;
}

template <typename T>
__device__ __forceinline__ void row_unpack(const uint4& v, float (&f)[RowVec<T>::N])
{
    T t[RowVec<T>::N];
    memcpy(t, &v, 16);
#pragma unroll
    for (int e = 0; e < RowVec<T>::N; ++e) f[e] = static_cast<float>(t[e]);
}

template <typename T>
__device__ __forceinline__ uint4 row_pack(const float (&f)[RowVec<T>::N])
{
    T t[RowVec<T>::N];
#pragma unroll
    for (int e = 0; e < RowVec<T>::N; ++e) t[e] = T(f[e]);
    uint4 v;
    memcpy(&v, t, 16);
    return v;
}

#ifdef DROPOUT
// f[e] *= Z of element (bh, i, j0 + e), e < V (j0 a multiple of 4; one Philox call per 16 keys, drawn again where
// the chunk enters the next 16)
template <int V>
__device__ __forceinline__ void row_dropout(float (&f)[V], unsigned bh, unsigned i, unsigned j0, unsigned threshold,
                                            float keep_scale, unsigned long long seed, unsigned offset)
{
    static_assert(V % 4 == 0, "whole 4-key groups");
    unsigned keep = 0;
#pragma unroll
    for (int g = 0; g < V; g += 4) {
        if (g == 0 || ((j0 + g) & 15u) == 0) keep = iok_keep16(threshold, seed, offset, bh, i, j0 + g);
        const unsigned b = (j0 + g) & 15u;
#pragma unroll
        for (int e = 0; e < 4; ++e) f[g + e] = (keep >> (b + e)) & 1u ? f[g + e] * keep_scale : 0.0f;
    }
}
#define ROW_DROPOUT_CHUNK(f, row_in, j0) \
    row_dropout(f, blockIdx.z, static_cast<unsigned>(row_in), static_cast<unsigned>(j0), IOK_DROPOUT_ARGS)
#define ROW_DROPOUT_ONE(x, row_in, j) \
    ((x) * iok_dropout(IOK_DROPOUT_ARGS, blockIdx.z, static_cast<unsigned>(row_in), static_cast<unsigned>(j)))
#else
#define ROW_DROPOUT_CHUNK(f, row_in, j0)
#define ROW_DROPOUT_ONE(x, row_in, j) (x)
#endif

// Chunk of round `base` that slot r of this thread handles.
__device__ __forceinline__ int row_chunk(int base, int r)
{
    return base + r * THREADS + static_cast<int>(threadIdx.x);
}

// Loads this thread's chunks of one round of a row (chunks: the row's count of 16-byte chunks).
template <int TI, typename T, typename Counters>
__device__ __forceinline__ void row_load_round(Counters& c, const T* row, int chunks, int base,
                                               uint4 (&v)[ROW_ROUND])
{
#pragma unroll
    for (int r = 0; r < ROW_ROUND; ++r) {
        const int q = row_chunk(base, r);
        v[r] = q < chunks ? iok_ld<TI>(c, reinterpret_cast<const uint4*>(row) + q) : make_uint4(0, 0, 0, 0);
    }
}

struct RowMax {
    static __device__ __forceinline__ float op(float a, float b) { return fmaxf(a, b); }
};
struct RowSum {
    static __device__ __forceinline__ float op(float a, float b) { return a + b; }
};

// Block-wide reduction; the result reaches every thread. partials[0, ROW_WARPS) is its scratch.
template <typename Op>
__device__ __forceinline__ float row_reduce(float x, float* partials)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = Op::op(x, __shfl_xor_sync(0xffffffffu, x, off));
    if ((threadIdx.x & 31u) == 0) partials[threadIdx.x >> 5] = x;
    __syncthreads();  // every warp's partial written
    x = partials[0];
#pragma unroll
    for (int w = 1; w < ROW_WARPS; ++w) x = Op::op(x, partials[w]);
    return x;
}

// m = max_j S[row, j]
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_STATS)
rowmax(const T* __restrict__ S, float* __restrict__ m, int n, int n_rows, unsigned long long* __restrict__ iok_counters)
{
    constexpr int V = RowVec<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    float* partials = reinterpret_cast<float*>(smem + SMEM_PARTIALS);
    IokCounters<IOK_T_S, IOK_T_m> c;
    for (int rr = 0; rr < ROWS_PER_BLOCK; ++rr) {
        const int r_in = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + rr;
        if (r_in >= n_rows) break;  // the same for the whole block
        const size_t row = static_cast<size_t>(blockIdx.z) * n_rows + r_in;
        const T* s = S + row * n;

        float x = row_neg_inf();
        if (row_vector_ok(S, n)) {
            const int chunks = n / V;
            for (int base = 0; base < chunks; base += THREADS * ROW_ROUND) {
                uint4 v[ROW_ROUND];
                row_load_round<IOK_T_S>(c, s, chunks, base, v);
#pragma unroll
                for (int r = 0; r < ROW_ROUND; ++r) {
                    if (row_chunk(base, r) >= chunks) continue;
                    float f[V];
                    row_unpack<T>(v[r], f);
#pragma unroll
                    for (int e = 0; e < V; ++e) x = fmaxf(x, f[e]);
                }
            }
        } else {
            for (int j = threadIdx.x; j < n; j += THREADS) x = fmaxf(x, static_cast<float>(iok_ld<IOK_T_S>(c, s + j)));
        }
        x = row_reduce<RowMax>(x, partials);
        if (threadIdx.x == 0) iok_st<IOK_T_m>(c, m + row, x);
        __syncthreads();  // PARTIALS and the broadcast scalars are reused by the next row
    }

    iok_flush(c, iok_counters);
}

// l = sum_j exp(S[row, j] - m)
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_STATS)
rowsum(const T* __restrict__ S, const float* __restrict__ m, float* __restrict__ l, int n, int n_rows,
       unsigned long long* __restrict__ iok_counters)
{
    constexpr int V = RowVec<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    float* partials = reinterpret_cast<float*>(smem + SMEM_PARTIALS);
    float* scalars = partials + ROW_WARPS;
    IokCounters<IOK_T_S, IOK_T_m, IOK_T_l> c;
    for (int rr = 0; rr < ROWS_PER_BLOCK; ++rr) {
        const int r_in = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + rr;
        if (r_in >= n_rows) break;  // the same for the whole block
        const size_t row = static_cast<size_t>(blockIdx.z) * n_rows + r_in;
        const T* s = S + row * n;
        const bool vector = row_vector_ok(S, n);
        const int chunks = vector ? n / V : 0;

        // the row's first round is in flight while thread 0 fetches m
        uint4 v[ROW_ROUND];
        if (vector) row_load_round<IOK_T_S>(c, s, chunks, 0, v);
        if (threadIdx.x == 0) scalars[0] = iok_ld<IOK_T_m>(c, m + row);
        __syncthreads();  // m visible to all
        // a row with no visible key (S = -inf throughout, m = -inf): exp(-inf - 0) = 0, so l = 0
        const float mr = scalars[0] == row_neg_inf() ? 0.0f : scalars[0];

        float x = 0.0f;
        if (vector) {
            for (int base = 0;;) {
#pragma unroll
                for (int r = 0; r < ROW_ROUND; ++r) {
                    if (row_chunk(base, r) >= chunks) continue;
                    float f[V];
                    row_unpack<T>(v[r], f);
#pragma unroll
                    for (int e = 0; e < V; ++e) x += expf(f[e] - mr);
                }
                base += THREADS * ROW_ROUND;
                if (base >= chunks) break;
                row_load_round<IOK_T_S>(c, s, chunks, base, v);
            }
        } else {
            for (int j = threadIdx.x; j < n; j += THREADS) {
                x += expf(static_cast<float>(iok_ld<IOK_T_S>(c, s + j)) - mr);
            }
        }
        x = row_reduce<RowSum>(x, partials);
        if (threadIdx.x == 0) iok_st<IOK_T_l>(c, l + row, x);
        __syncthreads();  // PARTIALS and the broadcast scalars are reused by the next row
    }

    iok_flush(c, iok_counters);
}

// P = exp(S - m) / l
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_SOFTMAX)
normalize(const T* __restrict__ S, const float* __restrict__ m, const float* __restrict__ l,
          T* __restrict__ P, int n, int n_rows, unsigned long long* __restrict__ iok_counters)
{
    constexpr int V = RowVec<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    float* scalars = reinterpret_cast<float*>(smem + SMEM_PARTIALS) + ROW_WARPS;
    IokCounters<IOK_T_S, IOK_T_P, IOK_T_m, IOK_T_l> c;
    for (int rr = 0; rr < ROWS_PER_BLOCK; ++rr) {
        const int r_in = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + rr;
        if (r_in >= n_rows) break;  // the same for the whole block
        const size_t row = static_cast<size_t>(blockIdx.z) * n_rows + r_in;
        const T* s = S + row * n;
        T* p = P + row * n;
        const bool vector = row_vector_ok(S, n) && row_vector_ok(P, n);
        const int chunks = vector ? n / V : 0;

        uint4 v[ROW_ROUND];
        if (vector) row_load_round<IOK_T_S>(c, s, chunks, 0, v);
        if (threadIdx.x == 0) {
            scalars[0] = iok_ld<IOK_T_m>(c, m + row);
            scalars[1] = iok_ld<IOK_T_l>(c, l + row);
        }
        __syncthreads();  // m, l visible to all
        // a row with no visible key (m = -inf, l = 0): P = 0
        const float mr = scalars[0] == row_neg_inf() ? 0.0f : scalars[0];
        const float inv_l = scalars[1] == 0.0f ? 0.0f : 1.0f / scalars[1];

        if (vector) {
            for (int base = 0;;) {
#pragma unroll
                for (int r = 0; r < ROW_ROUND; ++r) {
                    const int q = row_chunk(base, r);
                    if (q >= chunks) continue;
                    float f[V];
                    row_unpack<T>(v[r], f);
#pragma unroll
                    for (int e = 0; e < V; ++e) f[e] = expf(f[e] - mr) * inv_l;
                    iok_st<IOK_T_P>(c, reinterpret_cast<uint4*>(p) + q, row_pack<T>(f));
                }
                base += THREADS * ROW_ROUND;
                if (base >= chunks) break;
                row_load_round<IOK_T_S>(c, s, chunks, base, v);
            }
        } else {
            for (int j = threadIdx.x; j < n; j += THREADS) {
                iok_st<IOK_T_P>(c, p + j, T(expf(static_cast<float>(iok_ld<IOK_T_S>(c, s + j)) - mr) * inv_l));
            }
        }
        __syncthreads();  // PARTIALS and the broadcast scalars are reused by the next row
    }

    iok_flush(c, iok_counters);
}

// D = sum_j P[row, j] dP[row, j] (DROPOUT: P[row, j] Z[row, j] dP[row, j])
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS)
rowdot(const T* __restrict__ P, const T* __restrict__ dP, float* __restrict__ D, int n, int n_rows,
       IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
{
    constexpr int V = RowVec<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    float* partials = reinterpret_cast<float*>(smem + SMEM_PARTIALS);
    IokCounters<IOK_T_P, IOK_T_dP, IOK_T_D> c;
    for (int rr = 0; rr < ROWS_PER_BLOCK; ++rr) {
        const int r_in = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + rr;
        if (r_in >= n_rows) break;  // the same for the whole block
        const size_t row = static_cast<size_t>(blockIdx.z) * n_rows + r_in;
        const T* p = P + row * n;
        const T* dp = dP + row * n;

        float x = 0.0f;
        if (row_vector_ok(P, n) && row_vector_ok(dP, n)) {
            const int chunks = n / V;
            for (int base = 0; base < chunks; base += THREADS * ROW_ROUND) {
                uint4 vp[ROW_ROUND], vd[ROW_ROUND];
                row_load_round<IOK_T_P>(c, p, chunks, base, vp);
                row_load_round<IOK_T_dP>(c, dp, chunks, base, vd);
#pragma unroll
                for (int r = 0; r < ROW_ROUND; ++r) {
                    if (row_chunk(base, r) >= chunks) continue;
                    float fp[V], fd[V];
                    row_unpack<T>(vp[r], fp);
                    row_unpack<T>(vd[r], fd);
                    ROW_DROPOUT_CHUNK(fd, r_in, row_chunk(base, r) * V);
#pragma unroll
                    for (int e = 0; e < V; ++e) x = fmaf(fp[e], fd[e], x);
                }
            }
        } else {
            for (int j = threadIdx.x; j < n; j += THREADS) {
                const float pj = static_cast<float>(iok_ld<IOK_T_P>(c, p + j));
                x = fmaf(pj, ROW_DROPOUT_ONE(static_cast<float>(iok_ld<IOK_T_dP>(c, dp + j)), r_in, j), x);
            }
        }
        x = row_reduce<RowSum>(x, partials);
        if (threadIdx.x == 0) iok_st<IOK_T_D>(c, D + row, x);
        __syncthreads();  // PARTIALS and the broadcast scalars are reused by the next row
    }

    iok_flush(c, iok_counters);
}

// dS = P (dP - D) (DROPOUT: P (Z dP - D))
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_DS)
ds(const T* __restrict__ P, const T* __restrict__ dP, const float* __restrict__ D, T* __restrict__ dS, int n,
   int n_rows, IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
{
    constexpr int V = RowVec<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    float* scalars = reinterpret_cast<float*>(smem + SMEM_PARTIALS) + ROW_WARPS;
    IokCounters<IOK_T_P, IOK_T_dP, IOK_T_D, IOK_T_dS> c;
    for (int rr = 0; rr < ROWS_PER_BLOCK; ++rr) {
        const int r_in = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK + rr;
        if (r_in >= n_rows) break;  // the same for the whole block
        const size_t row = static_cast<size_t>(blockIdx.z) * n_rows + r_in;
        const T* p = P + row * n;
        const T* dp = dP + row * n;
        T* out = dS + row * n;
        const bool vector = row_vector_ok(P, n) && row_vector_ok(dP, n) && row_vector_ok(dS, n);
        const int chunks = vector ? n / V : 0;

        uint4 vp[ROW_ROUND], vd[ROW_ROUND];
        if (vector) {
            row_load_round<IOK_T_P>(c, p, chunks, 0, vp);
            row_load_round<IOK_T_dP>(c, dp, chunks, 0, vd);
        }
        if (threadIdx.x == 0) scalars[0] = iok_ld<IOK_T_D>(c, D + row);
        __syncthreads();  // D visible to all
        const float dr = scalars[0];

        if (vector) {
            for (int base = 0;;) {
#pragma unroll
                for (int r = 0; r < ROW_ROUND; ++r) {
                    const int q = row_chunk(base, r);
                    if (q >= chunks) continue;
                    float fp[V], fd[V];
                    row_unpack<T>(vp[r], fp);
                    row_unpack<T>(vd[r], fd);
                    ROW_DROPOUT_CHUNK(fd, r_in, q * V);
#pragma unroll
                    for (int e = 0; e < V; ++e) fp[e] *= fd[e] - dr;
                    iok_st<IOK_T_dS>(c, reinterpret_cast<uint4*>(out) + q, row_pack<T>(fp));
                }
                base += THREADS * ROW_ROUND;
                if (base >= chunks) break;
                row_load_round<IOK_T_P>(c, p, chunks, base, vp);
                row_load_round<IOK_T_dP>(c, dp, chunks, base, vd);
            }
        } else {
            for (int j = threadIdx.x; j < n; j += THREADS) {
                const float x = static_cast<float>(iok_ld<IOK_T_P>(c, p + j));
                const float g = ROW_DROPOUT_ONE(static_cast<float>(iok_ld<IOK_T_dP>(c, dp + j)), r_in, j);
                iok_st<IOK_T_dS>(c, out + j, T(x * (g - dr)));
            }
        }
        __syncthreads();  // PARTIALS and the broadcast scalars are reused by the next row
    }

    iok_flush(c, iok_counters);
}

// The flash set-up and finishing kernels move rows of d <= 256 elements: a block's ROWS_PER_BLOCK
// consecutive rows form one contiguous run of rows * d elements, which all threads stream at once,
// with no barrier between rows (a row-at-a-time loop would pay a round trip per short row).
struct RowBlock {
    size_t first;  // index of the block's first row among all batch*head rows
    int rows;      // rows this block owns (the last block of a batch*head may have fewer)
};

__device__ __forceinline__ RowBlock row_block(int n_rows)
{
    const int r0 = static_cast<int>(blockIdx.x) * ROWS_PER_BLOCK;
    return {static_cast<size_t>(blockIdx.z) * n_rows + r0, min(ROWS_PER_BLOCK, n_rows - r0)};
}

// x[0, n) = 0, float32
template <int TX, typename Counters>
__device__ __forceinline__ void flat_zero(Counters& c, float* __restrict__ x, int n)
{
    if (row_vector_ok(x, n)) {
#pragma unroll 1
        for (int q = threadIdx.x; q < n / 4; q += THREADS) {
            iok_st<TX>(c, reinterpret_cast<float4*>(x) + q, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
    } else {
#pragma unroll 1
        for (int j = threadIdx.x; j < n; j += THREADS) iok_st<TX>(c, x + j, 0.0f);
    }
}

// y[0, n) = x[0, n) rounded to T (x float32); TX, TY: their tensors. PAIRED: x holds each 8 columns in pair order
// (columns 0, 2, 4, 6, then 1, 3, 5, 7 of the 8: flash_tma_bwd.cu's dQ writes it so; n and the rows a multiple of 8)
template <int TX, int TY, bool PAIRED = false, typename T, typename Counters>
__device__ __forceinline__ void flat_round(Counters& c, const float* __restrict__ x, T* __restrict__ y, int n)
{
    constexpr int V = RowVec<T>::N;
    static_assert(!PAIRED || V == 8, "PAIRED: 8 elements of T a 16-byte chunk");
    // a chunk of V elements of T is V / 4 float4 of x (PAIRED: two, the even columns' and the odd ones')
    if (row_vector_ok(y, n) && row_vector_ok(x, n)) {
#pragma unroll 1
        for (int q = threadIdx.x; q < n / V; q += THREADS) {
            if constexpr (PAIRED) {
                const float4 e = iok_ld<TX>(c, reinterpret_cast<const float4*>(x) + 2 * q);  // columns 0, 2, 4, 6
                const float4 o = iok_ld<TX>(c, reinterpret_cast<const float4*>(x) + 2 * q + 1);  // 1, 3, 5, 7
                const float f[8] = {e.x, o.x, e.y, o.y, e.z, o.z, e.w, o.w};
                iok_st<TY>(c, reinterpret_cast<uint4*>(y) + q, row_pack<T>(f));
            } else {
                float f[V];
#pragma unroll
                for (int i = 0; i < V / 4; ++i) {
                    const float4 v = iok_ld<TX>(c, reinterpret_cast<const float4*>(x) + q * (V / 4) + i);
                    f[4 * i] = v.x;
                    f[4 * i + 1] = v.y;
                    f[4 * i + 2] = v.z;
                    f[4 * i + 3] = v.w;
                }
                iok_st<TY>(c, reinterpret_cast<uint4*>(y) + q, row_pack<T>(f));
            }
        }
    } else {
#pragma unroll 1
        for (int j = threadIdx.x; j < n; j += THREADS) {
            iok_st<TY>(c, y + j, T(iok_ld<TX>(c, x + (PAIRED ? (j & ~7) + 4 * (j & 1) + ((j >> 1) & 3) : j))));
        }
    }
}

// Oacc rows = 0, m = -inf, l = 0: the state Algorithm 1 starts from (T only names the run's dtype)
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_FLAT)
flash_init(float* __restrict__ Oacc, float* __restrict__ m, float* __restrict__ l, int d, int n_rows,
           unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(16) unsigned char smem[];
    IokCounters<IOK_T_Oacc, IOK_T_m, IOK_T_l> c;
    const RowBlock b = row_block(n_rows);
    flat_zero<IOK_T_Oacc>(c, Oacc + b.first * d, b.rows * d);
#pragma unroll 1
    for (int r = threadIdx.x; r < b.rows; r += THREADS) {
        iok_st<IOK_T_m>(c, m + b.first + r, row_neg_inf());
        iok_st<IOK_T_l>(c, l + b.first + r, 0.0f);
    }
    iok_flush(c, iok_counters);
}

// O = Oacc, rounded to T
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_FLAT)
flash_finalize(const float* __restrict__ Oacc, T* __restrict__ O, int d, int n_rows,
               unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(16) unsigned char smem[];
    IokCounters<IOK_T_O, IOK_T_Oacc> c;
    const RowBlock b = row_block(n_rows);
    flat_round<IOK_T_Oacc, IOK_T_O>(c, Oacc + b.first * d, O + b.first * d, b.rows * d);
    iok_flush(c, iok_counters);
}

// D = sum_j dO[row, j] O[row, j]; dQacc rows = 0.
// A row is G lanes of a warp: G = the row's count of 16-byte chunks (of elements, when rows are not
// 16-byte aligned) rounded up to a power of two, at most 32. A warp takes 32 / G rows at once and
// sums each within its aligned lane group, so short rows (d = 64 in float16 is 8 chunks) keep every
// lane busy; the order of the sums is fixed, so D is the same bits run to run.
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_PREP)
flash_bwd_prep(const T* __restrict__ dO, const T* __restrict__ O, float* __restrict__ D,
               float* __restrict__ dQacc, int d, int n_rows, unsigned long long* __restrict__ iok_counters)
{
    constexpr int V = RowVec<T>::N;
    extern __shared__ __align__(16) unsigned char smem[];
    IokCounters<IOK_T_O, IOK_T_dO, IOK_T_D, IOK_T_dQacc> c;
    const RowBlock b = row_block(n_rows);
    const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
    const bool vector = row_vector_ok(dO, d) && row_vector_ok(O, d);
    const int units = vector ? d / V : d;
    int g = 1;
    while (g < units && g < 32) g <<= 1;
    const int sub = lane & (g - 1), rows_per_warp = 32 / g;

#pragma unroll 1
    for (int r0 = warp * rows_per_warp; r0 < b.rows; r0 += ROW_WARPS * rows_per_warp) {  // warp-uniform
        const int r = r0 + lane / g;
        float x = 0.0f;
        if (r < b.rows) {
            const size_t row = b.first + r;
            const T* dor = dO + row * d;
            const T* o = O + row * d;
            if (vector) {
#pragma unroll 1
                for (int q = sub; q < units; q += g) {
                    float fd[V], fo[V];
                    row_unpack<T>(iok_ld<IOK_T_dO>(c, reinterpret_cast<const uint4*>(dor) + q), fd);
                    row_unpack<T>(iok_ld<IOK_T_O>(c, reinterpret_cast<const uint4*>(o) + q), fo);
#pragma unroll
                    for (int e = 0; e < V; ++e) x = fmaf(fd[e], fo[e], x);
                }
            } else {
#pragma unroll 1
                for (int j = sub; j < units; j += g) {
                    const float a = static_cast<float>(iok_ld<IOK_T_dO>(c, dor + j));
                    x = fmaf(a, static_cast<float>(iok_ld<IOK_T_O>(c, o + j)), x);
                }
            }
        }
#pragma unroll 1
        for (int off = g >> 1; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
        if (r < b.rows && sub == 0) iok_st<IOK_T_D>(c, D + b.first + r, x);
    }
    flat_zero<IOK_T_dQacc>(c, dQacc + b.first * d, b.rows * d);
    iok_flush(c, iok_counters);
}

// dQ = dQacc, rounded to T (DQ_PAIRED: dQacc's columns in flash_tma_bwd.cu's pair order)
template <typename T>
__global__ void __launch_bounds__(THREADS, ROW_MIN_BLOCKS_FLAT)
flash_bwd_dq(const float* __restrict__ dQacc, T* __restrict__ dQ, int d, int n_rows,
             unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(16) unsigned char smem[];
    IokCounters<IOK_T_dQ, IOK_T_dQacc> c;
    const RowBlock b = row_block(n_rows);
#ifdef DQ_PAIRED
    constexpr bool paired = true;
#else
    constexpr bool paired = false;
#endif
    flat_round<IOK_T_dQacc, IOK_T_dQ, paired>(c, dQacc + b.first * d, dQ + b.first * d, b.rows * d);
    iok_flush(c, iok_counters);
}
