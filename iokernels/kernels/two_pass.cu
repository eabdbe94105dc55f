// Online-softmax attention in two passes (Milakov & Gimelshein; KERNELS.md, "two_pass.cu"):
//   two_pass_stats<T, STORE_S>   pass 1: m_i = rowmax S, l_i = rowsum exp(S − m_i), online over K_j;
//                                STORE_S = 1 also writes S (rounded to T) for pass 2 to read.
//   two_pass_store_output<T>     pass 2 from the stored S: O_i = Σ_j exp(S_ij − m_i) V_j / l_i.
//   two_pass_recompute_output<T> pass 2 recomputing S_ij = τ Q_i K_jᵀ instead of reading it.
//
// BR, BC, HEAD_D and the SMEM_* offsets come from the plan. Each stage is compiled with its own
// layout's defines, so a kernel is only defined where the buffers it uses are. CUDA cores, float32
// accumulation. Shared memory (the plan's buffers, nothing else):
//   Q  HEAD_D x BR of T, transposed (Qt[k][r]) so that S = QKᵀ reads consecutive r / c across a warp
//   K  HEAD_D x BC of T, transposed (Kt[k][c])
//   V  BC x HEAD_D of T, as in HBM
//   O  BR x HEAD_D float32;  S  BR x BC float32 (row stride BC);  M, L  BR float32
#include "common.cuh"

// ---- tile helpers (the same text in flash_fwd.cu: build_source inlines common.cuh only) ----------

static_assert(THREADS % 32 == 0, "whole warps");
static_assert(HEAD_D % 8 == 0, "rows of T move as 16-byte vectors");
enum : int { NWARPS = THREADS / 32 };  // not a variable: no unused warning in the stages that need none
__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> __device__ __forceinline__ T from_bits(unsigned short b);
template <> __device__ __forceinline__ __half from_bits<__half>(unsigned short b) { return __ushort_as_half(b); }
template <> __device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(unsigned short b)
{
    return __ushort_as_bfloat16(b);
}
__device__ __forceinline__ unsigned to_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned to_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

// Rows move as 16-byte vectors: HEAD_D % 8 == 0 keeps every row of Q, K, V, O 16-byte aligned.
template <typename T> constexpr int VEC = 16 / sizeof(T);

__device__ __forceinline__ unsigned word(const uint4& v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <typename T>
__device__ __forceinline__ T vec_get(const uint4& v, int e)
{
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(word(v, e));
    } else {
        return from_bits<T>(static_cast<unsigned short>(word(v, e / 2) >> (16 * (e % 2))));
    }
}

template <typename T>
__device__ __forceinline__ uint4 vec_pack(const float (&x)[VEC<T>])
{
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (sizeof(T) == 4) {
            w[i] = __float_as_uint(x[i]);
        } else {
            w[i] = to_bits(from_f<T>(x[2 * i])) | to_bits(from_f<T>(x[2 * i + 1])) << 16;
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// Each buffer 16-byte aligned, inside SMEM_BYTES, disjoint from the others; room for iok_flush.
struct Buffer {
    size_t offset, bytes;
};
template <int N>
__host__ __device__ constexpr bool layout_ok(const Buffer (&b)[N])
{
    for (int i = 0; i < N; ++i) {
        if (b[i].offset % 16 != 0 || b[i].offset + b[i].bytes > SMEM_BYTES) return false;
        for (int j = 0; j < i; ++j) {
            if (b[i].offset < b[j].offset + b[j].bytes && b[j].offset < b[i].offset + b[i].bytes) return false;
        }
    }
    return SMEM_BYTES >= IOK_FLUSH_SCRATCH_BYTES(THREADS);
}

// Thread layout of a rows x cols product tile: NX threads along the columns, THREADS / NX along the
// rows, each thread a TM x TN register micro-tile strided by (THREADS / NX, NX) so that a warp reads
// consecutive shared addresses. Tiles are arbitrary, so pick the layout that minimises a thread's
// inner-loop cost over all the passes it needs: TM*TN FMAs + (TM + TN) shared loads at ~3 FMAs each.
// TM*TN <= 32 keeps the accumulators in registers.
struct MicroTile {
    int nx, tm, tn;
};
__host__ __device__ constexpr MicroTile micro_tile(int rows, int cols)
{
    MicroTile best{1, 1, 1};
    long best_cost = -1;
    for (int nx = THREADS; nx >= 1; --nx) {
        if (THREADS % nx != 0) continue;
        const int ny = THREADS / nx;
        for (int tm = 1; tm <= 8; ++tm) {
            for (int tn = 1; tn <= 8 && tm * tn <= 32; ++tn) {
                const long row_passes = (rows + ny * tm - 1) / (ny * tm);
                const long passes = row_passes * ((cols + nx * tn - 1) / (nx * tn));
                const long cost = passes * (tm * tn + 3 * (tm + tn));
                if (best_cost < 0 || cost < best_cost) {
                    best = MicroTile{nx, tm, tn};
                    best_cost = cost;
                }
            }
        }
    }
    return best;
}

// S[r][c] = epi(r, c, Σ_k Qt[k][r] Kt[k][c]) for r < rows, c < cols (S row stride BC).
template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
{
    constexpr MicroTile mt = micro_tile(BR, BC);
    constexpr int NX = mt.nx, NY = THREADS / NX, TM = mt.tm, TN = mt.tn;
    const int tx = threadIdx.x % NX, ty = threadIdx.x / NX;
    for (int r0 = ty; r0 < rows; r0 += NY * TM) {
        for (int c0 = tx; c0 < cols; c0 += NX * TN) {
            // ragged edges reread a real row / column (never an unloaded one); their results are dropped
            const T* q[TM];
            const T* k[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a) q[a] = Qt + min(r0 + a * NY, rows - 1);
#pragma unroll
            for (int b = 0; b < TN; ++b) k[b] = Kt + min(c0 + b * NX, cols - 1);
            float acc[TM][TN] = {};
#pragma unroll 8
            for (int kk = 0; kk < HEAD_D; ++kk) {
                float qa[TM], kb[TN];
#pragma unroll
                for (int a = 0; a < TM; ++a) qa[a] = to_f(q[a][kk * BR]);
#pragma unroll
                for (int b = 0; b < TN; ++b) kb[b] = to_f(k[b][kk * BC]);
#pragma unroll
                for (int a = 0; a < TM; ++a) {
#pragma unroll
                    for (int b = 0; b < TN; ++b) acc[a][b] = fmaf(qa[a], kb[b], acc[a][b]);
                }
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int r = r0 + a * NY;
#pragma unroll
                for (int b = 0; b < TN; ++b) {
                    const int c = c0 + b * NX;
                    if (r < rows && c < cols) S[r * BC + c] = epi(r, c, acc[a][b]);
                }
            }
        }
    }
}

// epi(r, n, Σ_c P[r][c] V[c][n]) for r < rows, n < HEAD_D, c < cols (P row stride BC).
template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile(const float* P, const T* V, int rows, int cols, Epi epi)
{
    constexpr MicroTile mt = micro_tile(BR, HEAD_D);
    constexpr int NX = mt.nx, NY = THREADS / NX, TM = mt.tm, TN = mt.tn;
    const int tx = threadIdx.x % NX, ty = threadIdx.x / NX;
    for (int r0 = ty; r0 < rows; r0 += NY * TM) {
        for (int n0 = tx; n0 < HEAD_D; n0 += NX * TN) {
            const float* p[TM];
            const T* v[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a) p[a] = P + min(r0 + a * NY, rows - 1) * BC;
#pragma unroll
            for (int b = 0; b < TN; ++b) v[b] = V + min(n0 + b * NX, HEAD_D - 1);
            float acc[TM][TN] = {};
#pragma unroll 4
            for (int c = 0; c < cols; ++c) {
                float pa[TM], vb[TN];
#pragma unroll
                for (int a = 0; a < TM; ++a) pa[a] = p[a][c];
#pragma unroll
                for (int b = 0; b < TN; ++b) vb[b] = to_f(v[b][c * HEAD_D]);
#pragma unroll
                for (int a = 0; a < TM; ++a) {
#pragma unroll
                    for (int b = 0; b < TN; ++b) acc[a][b] = fmaf(pa[a], vb[b], acc[a][b]);
                }
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int r = r0 + a * NY;
#pragma unroll
                for (int b = 0; b < TN; ++b) {
                    const int n = n0 + b * NX;
                    if (r < rows && n < HEAD_D) epi(r, n, acc[a][b]);
                }
            }
        }
    }
}

// rows x HEAD_D of T, contiguous in HBM -> dst[k * LD + r], the transposed tile qk_tile reads.
// r runs fastest across threads, so the scattered shared stores fall in distinct banks.
template <int TENSOR, int LD, typename T, typename C>
__device__ __forceinline__ void load_transposed(C& io, T* dst, const T* src, int rows)
{
    constexpr int VPR = HEAD_D / VEC<T>;  // vectors per row
    for (int i = threadIdx.x; i < LD * VPR; i += THREADS) {
        const int r = i % LD, v = i / LD;
        if (r < rows) {
            const uint4* row = reinterpret_cast<const uint4*>(src + static_cast<size_t>(r) * HEAD_D);
            const uint4 x = iok_ld<TENSOR>(io, row + v);
#pragma unroll
            for (int e = 0; e < VEC<T>; ++e) dst[(v * VEC<T> + e) * LD + r] = vec_get<T>(x, e);
        }
    }
}

// rows x HEAD_D of T, contiguous in HBM -> dst, same layout.
template <int TENSOR, typename T, typename C>
__device__ __forceinline__ void load_rows(C& io, T* dst, const T* src, int rows)
{
    const int n = rows * (HEAD_D / VEC<T>);
    for (int i = threadIdx.x; i < n; i += THREADS) {
        reinterpret_cast<uint4*>(dst)[i] = iok_ld<TENSOR>(io, reinterpret_cast<const uint4*>(src) + i);
    }
}

// dst (rows x HEAD_D of T, contiguous in HBM) = src (rows x HEAD_D float32) / div[r], each element once.
template <int TENSOR, typename T, typename C>
__device__ __forceinline__ void store_rows_divided(C& io, T* dst, const float* src, const float* div, int rows)
{
    constexpr int VPR = HEAD_D / VEC<T>;
    for (int i = threadIdx.x; i < rows * VPR; i += THREADS) {
        const float inv = 1.0f / div[i / VPR];
        float x[VEC<T>];
#pragma unroll
        for (int h = 0; h < VEC<T> / 4; ++h) {
            const float4 f = reinterpret_cast<const float4*>(src)[i * (VEC<T> / 4) + h];
            x[4 * h] = f.x * inv;
            x[4 * h + 1] = f.y * inv;
            x[4 * h + 2] = f.z * inv;
            x[4 * h + 3] = f.w * inv;
        }
        iok_st<TENSOR>(io, reinterpret_cast<uint4*>(dst) + i, vec_pack<T>(x));
    }
}

// ---- kernels ------------------------------------------------------------------------------------

template <bool B, typename X, typename Y> struct pick { using type = X; };
template <typename X, typename Y> struct pick<false, X, Y> { using type = Y; };

#if defined(SMEM_Q) && defined(SMEM_K) && defined(SMEM_S) && defined(SMEM_M) && defined(SMEM_L)
// Pass 1. Grid (Tr, 1, BH). Bytes: Q N_q d, K N_k d Tr read; S N_q N_k (STORE_S), m, l N_q written.
template <typename T, int STORE_S>
__global__ void __launch_bounds__(THREADS, 1)
two_pass_stats(const T* __restrict__ Q, const T* __restrict__ K, T* __restrict__ S, float* __restrict__ m,
               float* __restrict__ l, int n_q, int n_k, float scale, unsigned long long* __restrict__ iok_counters)
{
    static_assert(layout_ok<5>({{SMEM_Q, BR * HEAD_D * sizeof(T)},
                                {SMEM_K, BC * HEAD_D * sizeof(T)},
                                {SMEM_S, BR * BC * sizeof(float)},
                                {SMEM_M, BR * sizeof(float)},
                                {SMEM_L, BR * sizeof(float)}}),
                  "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(16) unsigned char smem[];
    T* Qt = reinterpret_cast<T*>(smem + SMEM_Q);
    T* Kt = reinterpret_cast<T*>(smem + SMEM_K);
    float* Sij = reinterpret_cast<float*>(smem + SMEM_S);
    float* m_i = reinterpret_cast<float*>(smem + SMEM_M);
    float* l_i = reinterpret_cast<float*>(smem + SMEM_L);
    typename pick<STORE_S, IokCounters<IOK_T_Q, IOK_T_K, IOK_T_S, IOK_T_m, IOK_T_l>,
                  IokCounters<IOK_T_Q, IOK_T_K, IOK_T_m, IOK_T_l>>::type io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of Q_i, S_i, m_i, l_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;

    // Q_i -> SRAM once: it stays for the whole sweep over K. m = -inf, l = 0.
    load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        m_i[r] = neg_inf();
        l_i[r] = 0.0f;
    }

    for (int col0 = 0; col0 < n_k; col0 += BC) {
        const int cols = min(BC, n_k - col0);
        // K_j -> SRAM (QKᵀ of the previous j finished before its barrier below)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // K_j (and Q_i, m, l on the first pass) stored by other threads; and the
                          // previous j's statistics are done reading S before QKᵀ overwrites it

        // S_ij = τ Q_i K_jᵀ; STORE_S: rounded to T and written, and the statistics use the stored
        // values, so that pass 2's exp(S − m) / l sums to 1 over what it reads
        qk_tile(Qt, Kt, Sij, rows, cols, [&](int r, int c, float qk) {
            float s = scale * qk;
            if constexpr (STORE_S != 0) {
                const T stored = from_f<T>(s);
                iok_st<IOK_T_S>(io, S + (q_off + r) * n_k + col0 + c, stored);
                s = to_f(stored);
            }
            return s;
        });
        __syncthreads();  // a row of S comes from many threads' micro-tiles

        // m_new = max(m, rowmax S_ij); l = e^{m − m_new} l + rowsum exp(S_ij − m_new)
        for (int r = warp; r < rows; r += NWARPS) {
            const float* s = Sij + r * BC;
            float mx = neg_inf();
            for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, s[c]);
            const float m_old = m_i[r];
            const float m_new = fmaxf(m_old, warp_max(mx));
            float sum = 0.0f;
            for (int c = lane; c < cols; c += 32) sum += __expf(s[c] - m_new);
            sum = warp_sum(sum);
            // the first tile has nothing to rescale, and e^{-inf - (-inf)} would be NaN
            const float alpha = m_old == neg_inf() ? 0.0f : __expf(m_old - m_new);
            __syncwarp();  // every lane has read m_i[r] before lane 0 overwrites it
            if (lane == 0) {
                m_i[r] = m_new;
                l_i[r] = alpha * l_i[r] + sum;
            }
        }
    }
    __syncthreads();  // m_i, l_i were last written by lane 0 of other warps

    // m_i, l_i written once
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        iok_st<IOK_T_m>(io, m + q_off + r, m_i[r]);
        iok_st<IOK_T_l>(io, l + q_off + r, l_i[r]);
    }
    iok_flush(io, iok_counters, smem);
}
#endif

#if defined(SMEM_S) && defined(SMEM_V) && defined(SMEM_O) && defined(SMEM_M) && defined(SMEM_L)
// Pass 2 from the stored S. Grid (Tr, 1, BH).
// Bytes: m, l N_q; S N_q N_k; V N_k d Tr read; O N_q d written.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
two_pass_store_output(const T* __restrict__ S, const float* __restrict__ m, const float* __restrict__ l,
                      const T* __restrict__ V, T* __restrict__ O, int n_q, int n_k,
                      unsigned long long* __restrict__ iok_counters)
{
    static_assert(layout_ok<5>({{SMEM_S, BR * BC * sizeof(float)},
                                {SMEM_V, BC * HEAD_D * sizeof(T)},
                                {SMEM_O, BR * HEAD_D * sizeof(float)},
                                {SMEM_M, BR * sizeof(float)},
                                {SMEM_L, BR * sizeof(float)}}),
                  "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(16) unsigned char smem[];
    float* P = reinterpret_cast<float*>(smem + SMEM_S);
    T* Vs = reinterpret_cast<T*>(smem + SMEM_V);
    float* Oacc = reinterpret_cast<float*>(smem + SMEM_O);
    float* m_i = reinterpret_cast<float*>(smem + SMEM_M);
    float* l_i = reinterpret_cast<float*>(smem + SMEM_L);
    IokCounters<IOK_T_S, IOK_T_V, IOK_T_O, IOK_T_m, IOK_T_l> io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of S_i, m_i, l_i, O_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;

    // m_i, l_i -> SRAM once; O = 0
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        m_i[r] = iok_ld<IOK_T_m>(io, m + q_off + r);
        l_i[r] = iok_ld<IOK_T_l>(io, l + q_off + r);
    }
    for (int i = threadIdx.x; i < rows * HEAD_D; i += THREADS) Oacc[i] = 0.0f;
    __syncthreads();  // m_i is read below by other threads than the ones that loaded it

    for (int col0 = 0; col0 < n_k; col0 += BC) {
        const int cols = min(BC, n_k - col0);
        // P_ij = exp(S_ij − m_i) as S_ij streams in (the 1/l_i waits for the final store); V_j -> SRAM.
        // The previous iteration ended at a barrier: nobody reads P or V any more.
        for (int r = warp; r < rows; r += NWARPS) {
            const T* s = S + (q_off + r) * n_k + col0;
            const float mr = m_i[r];
            for (int c = lane; c < cols; c += 32) P[r * BC + c] = __expf(to_f(iok_ld<IOK_T_S>(io, s + c)) - mr);
        }
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // P and V_j were stored by other threads than the PV micro-tiles

        // O += P_ij V_j
        pv_tile(P, Vs, rows, cols, [&](int r, int n, float pv) { Oacc[r * HEAD_D + n] += pv; });
        __syncthreads();  // done with P and V_j before the next loads; O complete for the final store
    }

    // O_i = O / l_i, written once
    store_rows_divided<IOK_T_O>(io, O + q_off * HEAD_D, Oacc, l_i, rows);
    iok_flush(io, iok_counters, smem);
}
#endif

#if defined(SMEM_Q) && defined(SMEM_K) && defined(SMEM_V) && defined(SMEM_O) && defined(SMEM_S) && \
    defined(SMEM_M) && defined(SMEM_L)
// Pass 2 recomputing S. Grid (Tr, 1, BH).
// Bytes: Q N_q d; K, V N_k d Tr; m, l N_q read; O N_q d written.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
two_pass_recompute_output(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                          const float* __restrict__ m, const float* __restrict__ l, T* __restrict__ O, int n_q,
                          int n_k, float scale, unsigned long long* __restrict__ iok_counters)
{
    static_assert(layout_ok<7>({{SMEM_Q, BR * HEAD_D * sizeof(T)},
                                {SMEM_K, BC * HEAD_D * sizeof(T)},
                                {SMEM_V, BC * HEAD_D * sizeof(T)},
                                {SMEM_O, BR * HEAD_D * sizeof(float)},
                                {SMEM_S, BR * BC * sizeof(float)},
                                {SMEM_M, BR * sizeof(float)},
                                {SMEM_L, BR * sizeof(float)}}),
                  "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(16) unsigned char smem[];
    T* Qt = reinterpret_cast<T*>(smem + SMEM_Q);
    T* Kt = reinterpret_cast<T*>(smem + SMEM_K);
    T* Vs = reinterpret_cast<T*>(smem + SMEM_V);
    float* Oacc = reinterpret_cast<float*>(smem + SMEM_O);
    float* P = reinterpret_cast<float*>(smem + SMEM_S);
    float* m_i = reinterpret_cast<float*>(smem + SMEM_M);
    float* l_i = reinterpret_cast<float*>(smem + SMEM_L);
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_m, IOK_T_l> io;

    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of Q_i, m_i, l_i, O_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;

    // Q_i, m_i, l_i -> SRAM once; O = 0
    load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        m_i[r] = iok_ld<IOK_T_m>(io, m + q_off + r);
        l_i[r] = iok_ld<IOK_T_l>(io, l + q_off + r);
    }
    for (int i = threadIdx.x; i < rows * HEAD_D; i += THREADS) Oacc[i] = 0.0f;

    for (int col0 = 0; col0 < n_k; col0 += BC) {
        const int cols = min(BC, n_k - col0);
        // K_j, V_j -> SRAM (the previous iteration ended at a barrier: nobody reads them any more)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // K_j, V_j (and Q_i, m_i, l_i, O on the first pass) were stored by other threads

        // P_ij = exp(τ Q_i K_jᵀ − m_i), S recomputed exactly as pass 1 did (the 1/l_i waits for the store)
        qk_tile(Qt, Kt, P, rows, cols, [&](int r, int, float qk) { return __expf(scale * qk - m_i[r]); });
        __syncthreads();  // a row of P comes from many threads' micro-tiles

        // O += P_ij V_j
        pv_tile(P, Vs, rows, cols, [&](int r, int n, float pv) { Oacc[r * HEAD_D + n] += pv; });
        __syncthreads();  // done with P, K_j, V_j before the next loads; O complete for the final store
    }

    // O_i = O / l_i, written once
    store_rows_divided<IOK_T_O>(io, O + q_off * HEAD_D, Oacc, l_i, rows);
    iok_flush(io, iok_counters, smem);
}
#endif
