// FlashAttention forward in the two loop orders of KERNELS.md ("flash_fwd.cu"):
//   flash_q_outer   FlashAttention-2: block i keeps Q_i, O_i, m_i, l_i on chip and streams K_j, V_j.
//   flash_kv_outer  Algorithm 1 of the paper: one block per (batch, head) keeps K_j, V_j on chip and
//                   streams Q_i, O_i, l_i, m_i through HBM for every j (O as a float32 accumulator,
//                   Oacc, so half-precision runs accumulate in float32; flash_finalize rounds it once).
//
// BR, BC, HEAD_D and the SMEM_* offsets come from the plan. CUDA cores, float32 accumulation.
// Shared memory (the plan's buffers, nothing else):
//   Q  HEAD_D x BR of T, transposed (Qt[k][r]) so that S = QKᵀ reads consecutive r / c across a warp
//   K  HEAD_D x BC of T, transposed (Kt[k][c])
//   V  BC x HEAD_D of T, as in HBM
//   O  BR x HEAD_D float32;  S  BR x BC float32 (row stride BC);  M, L  BR float32
#include "common.cuh"

// ---- tile helpers (the same text in two_pass.cu: build_source inlines common.cuh only) ----------

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

template <typename T>
__device__ constexpr bool flash_layout_ok()
{
    return layout_ok<7>({{SMEM_Q, BR * HEAD_D * sizeof(T)},
                         {SMEM_K, BC * HEAD_D * sizeof(T)},
                         {SMEM_V, BC * HEAD_D * sizeof(T)},
                         {SMEM_O, BR * HEAD_D * sizeof(float)},
                         {SMEM_S, BR * BC * sizeof(float)},
                         {SMEM_M, BR * sizeof(float)},
                         {SMEM_L, BR * sizeof(float)}});
}

// FlashAttention-2 order. Grid (Tr, 1, BH). Bytes: Q N_q d, K and V N_k d Tr read; O N_q d, lse N_q written.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_q_outer(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O,
              float* __restrict__ lse, int n_q, int n_k, float scale, unsigned long long* __restrict__ iok_counters)
{
    static_assert(flash_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(16) unsigned char smem[];
    T* Qt = reinterpret_cast<T*>(smem + SMEM_Q);
    T* Kt = reinterpret_cast<T*>(smem + SMEM_K);
    T* Vs = reinterpret_cast<T*>(smem + SMEM_V);
    float* Oacc = reinterpret_cast<float*>(smem + SMEM_O);
    float* S = reinterpret_cast<float*>(smem + SMEM_S);
    float* m_i = reinterpret_cast<float*>(smem + SMEM_M);
    float* l_i = reinterpret_cast<float*>(smem + SMEM_L);
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_lse> io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of Q_i, O_i, lse_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;

    // Q_i -> SRAM once: it stays for the whole sweep over K, V. O = 0, m = -inf, l = 0.
    load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
    for (int i = threadIdx.x; i < rows * HEAD_D; i += THREADS) Oacc[i] = 0.0f;
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        m_i[r] = neg_inf();
        l_i[r] = 0.0f;
    }

    for (int col0 = 0; col0 < n_k; col0 += BC) {
        const int cols = min(BC, n_k - col0);
        // K_j, V_j -> SRAM (the previous iteration ended at a barrier: nobody reads them any more)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // K_j, V_j (and Q_i, O, m, l on the first pass) were stored by other threads

        // S = τ Q_i K_jᵀ
        qk_tile(Qt, Kt, S, rows, cols, [&](int, int, float qk) { return scale * qk; });
        __syncthreads();  // a row of S comes from many threads' micro-tiles

        // m_new = max(m, rowmax S); P = exp(S − m_new); l = e^{m − m_new} l + rowsum P; O *= e^{m − m_new}
        for (int r = warp; r < rows; r += NWARPS) {
            float* s = S + r * BC;
            float mx = neg_inf();
            for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, s[c]);
            const float m_old = m_i[r];
            const float m_new = fmaxf(m_old, warp_max(mx));
            float sum = 0.0f;
            for (int c = lane; c < cols; c += 32) {
                const float p = __expf(s[c] - m_new);
                s[c] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            // the first tile has nothing to rescale, and e^{-inf - (-inf)} would be NaN
            const float alpha = m_old == neg_inf() ? 0.0f : __expf(m_old - m_new);
            for (int n = lane; n < HEAD_D; n += 32) Oacc[r * HEAD_D + n] *= alpha;
            __syncwarp();  // every lane has read m_i[r] before lane 0 overwrites it
            if (lane == 0) {
                m_i[r] = m_new;
                l_i[r] = alpha * l_i[r] + sum;
            }
        }
        __syncthreads();  // P and the rescaled O rows were written by other warps than the PV micro-tiles

        // O += P V_j
        pv_tile(S, Vs, rows, cols, [&](int r, int n, float pv) { Oacc[r * HEAD_D + n] += pv; });
        __syncthreads();  // done with S, V_j and O before the next K_j, V_j and the final store
    }

    // O_i = O / l, lse_i = m + log l, each written once
    store_rows_divided<IOK_T_O>(io, O + q_off * HEAD_D, Oacc, l_i, rows);
    for (int r = threadIdx.x; r < rows; r += THREADS) iok_st<IOK_T_lse>(io, lse + q_off + r, m_i[r] + logf(l_i[r]));
    iok_flush(io, iok_counters, smem);
}

// Algorithm 1 literally. Grid (1, 1, BH); Oacc = 0, l = 0, m = -inf in HBM beforehand (flash_init).
// Bytes: K, V N_k d read; Q N_q d Tc read; Oacc N_q d Tc read and written (float32); m, l N_q Tc read
// and written. Oacc, m, l are read back after this block wrote them (next j), so they are not
// __restrict__: no read-only cache path for them.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_kv_outer(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, float* Oacc, float* m,
               float* l,
               int n_q, int n_k, float scale, unsigned long long* __restrict__ iok_counters)
{
    static_assert(flash_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(16) unsigned char smem[];
    T* Qt = reinterpret_cast<T*>(smem + SMEM_Q);
    T* Kt = reinterpret_cast<T*>(smem + SMEM_K);
    T* Vs = reinterpret_cast<T*>(smem + SMEM_V);
    float* Oi = reinterpret_cast<float*>(smem + SMEM_O);
    float* S = reinterpret_cast<float*>(smem + SMEM_S);
    float* m_i = reinterpret_cast<float*>(smem + SMEM_M);
    float* l_i = reinterpret_cast<float*>(smem + SMEM_L);
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_Oacc, IOK_T_m, IOK_T_l> io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t q_base = static_cast<size_t>(blockIdx.z) * n_q;
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;

    for (int col0 = 0; col0 < n_k; col0 += BC) {
        const int cols = min(BC, n_k - col0);
        // K_j, V_j -> SRAM, once (the previous i ended at a barrier: nobody reads them any more)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);

        for (int row0 = 0; row0 < n_q; row0 += BR) {
            const int rows = min(BR, n_q - row0);
            const size_t q_off = q_base + row0;
            // Q_i, O_i (float32), l_i, m_i -> SRAM
            load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
            const int nv = rows * (HEAD_D / 4);
            for (int i = threadIdx.x; i < nv; i += THREADS) {
                reinterpret_cast<float4*>(Oi)[i] =
                    iok_ld<IOK_T_Oacc>(io, reinterpret_cast<const float4*>(Oacc + q_off * HEAD_D) + i);
            }
            for (int r = threadIdx.x; r < rows; r += THREADS) {
                m_i[r] = iok_ld<IOK_T_m>(io, m + q_off + r);
                l_i[r] = iok_ld<IOK_T_l>(io, l + q_off + r);
            }
            __syncthreads();  // Q_i, O_i, l_i, m_i (and K_j, V_j) were stored by other threads

            // S_ij = τ Q_i K_jᵀ
            qk_tile(Qt, Kt, S, rows, cols, [&](int, int, float qk) { return scale * qk; });
            __syncthreads();  // a row of S comes from many threads' micro-tiles

            // m̃ = rowmax S_ij, P̃ = exp(S_ij − m̃), l̃ = rowsum P̃; m_new = max(m_i, m̃),
            // l_new = e^{m_i − m_new} l_i + e^{m̃ − m_new} l̃, both written back now. M and L then hold
            // the factors of O_i ← α O_i + β P̃ V_j:
            //   α = l_i e^{m_i − m_new} / l_new,  β = e^{m̃ − m_new} / l_new
            for (int r = warp; r < rows; r += NWARPS) {
                float* s = S + r * BC;
                float mx = neg_inf();
                for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, s[c]);
                mx = warp_max(mx);
                float sum = 0.0f;
                for (int c = lane; c < cols; c += 32) {
                    const float p = __expf(s[c] - mx);
                    s[c] = p;
                    sum += p;
                }
                sum = warp_sum(sum);
                const float m_old = m_i[r], l_old = l_i[r];
                const float m_new = fmaxf(m_old, mx);
                // m_i = -inf until the row's first update: nothing to rescale, and no e^{-inf - (-inf)}
                const float a = m_old == neg_inf() ? 0.0f : __expf(m_old - m_new);
                const float b = __expf(mx - m_new);
                const float l_new = a * l_old + b * sum;
                __syncwarp();  // every lane has read m_i[r], l_i[r] before lane 0 overwrites them
                if (lane == 0) {
                    iok_st<IOK_T_m>(io, m + q_off + r, m_new);
                    iok_st<IOK_T_l>(io, l + q_off + r, l_new);
                    m_i[r] = l_old * a / l_new;
                    l_i[r] = b / l_new;
                }
            }
            __syncthreads();  // P̃, α and β were written by other warps than the PV micro-tiles

            // O_i ← α O_i + β P̃ V_j, written back straight from the micro-tiles
            pv_tile(S, Vs, rows, cols, [&](int r, int n, float pv) {
                const float o = m_i[r] * Oi[r * HEAD_D + n] + l_i[r] * pv;
                iok_st<IOK_T_Oacc>(io, Oacc + (q_off + r) * HEAD_D + n, o);
            });
            __syncthreads();  // done with S, O_i, M, L (and K_j, V_j) before the next loads overwrite them
        }
    }
    iok_flush(io, iok_counters, smem);
}
