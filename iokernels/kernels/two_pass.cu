// Online-softmax attention in two passes (Milakov & Gimelshein; KERNELS.md, "two_pass.cu"):
//   two_pass_stats<T, STORE_S>   pass 1: m_i = rowmax S, l_i = rowsum exp(S − m_i), online over K_j;
//                                STORE_S = 1 also writes S (rounded to T) for pass 2 to read.
//   two_pass_store_output<T>     pass 2 from the stored S: O_i = Σ_j exp(S_ij − m_i) V_j / l_i.
//   two_pass_recompute_output<T> pass 2 recomputing S_ij = τ Q_i K_jᵀ instead of reading it.
//
// BR, BC, HEAD_D and the SMEM_* offsets come from the plan. Each stage is compiled with its own
// layout's defines, so a kernel is only defined where the buffers it uses are. CUDA cores, float32
// accumulation. CAUSAL (causal plans; common.cuh): S is −inf where masked (stored so too); a query block
// reads key blocks only up to its last row's last visible key, and with none it loads nothing (pass 1
// writes m = −inf, l = 0, pass 2 O = 0); exp is taken against 0 where m is −inf, never NaN.
// BLOCK_SPARSE (block-sparse plans; common.cuh): key blocks whose block-mask byte is 0 are skipped by both
// passes; what a query block reads once (Q_i; pass 2: m_i, l_i and Q_i) comes at its first computed pair, so a
// block with none loads nothing (m = −inf, l = 0, O = 0).
// DROPOUT (dropout on P, pass 2 only; common.cuh, iokernels/plan/dropout.py): pass 1's m, l are those of the undropped
// P; pass 2 multiplies P_ij by Z_ij = iok_dropout(bh, i, j) before PV, so O = (Z ∘ P) V. The mask is regenerated
// from (seed, offset, batch·head, row, column), never stored: no byte more or less.
// Shared memory (the plan's buffers, nothing else):
//   Q  HEAD_D x BR of T, transposed (Qt[k][r]) so that S = QKᵀ reads consecutive r / c across a warp
//   K  HEAD_D x BC of T, transposed (Kt[k][c])
//   V  BC x HEAD_D of T, as in HBM
//   O  BR x HEAD_D float32;  S  BR x BC float32 (row stride BC);  M, L  BR float32
#include "common.cuh"

#include "tiles.cuh"

// ---- kernels ------------------------------------------------------------------------------------

template <bool B, typename X, typename Y> struct pick { using type = X; };
template <typename X, typename Y> struct pick<false, X, Y> { using type = Y; };

// BLOCK_SPARSE: pass 2 reads m_i, l_i at its first computed pair, not up front
#ifdef BLOCK_SPARSE
enum : bool { BLOCK_SPARSE_LAZY = true };  // an enumerator: no unused warning in the stages that need none
#else
enum : bool { BLOCK_SPARSE_LAZY = false };
#endif

// m_i, l_i (rows of them) -> SRAM, one thread per row
template <typename C>
__device__ __forceinline__ void load_row_stats(C& io, float* m_i, float* l_i, const float* m, const float* l, int rows)
{
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        m_i[r] = iok_ld<IOK_T_m>(io, m + r);
        l_i[r] = iok_ld<IOK_T_l>(io, l + r);
    }
}

#ifdef DROPOUT
#define TP_DROP_ROW(p, cols, i, col0, lane) \
    iok_drop_row(p, cols, blockIdx.z, i, col0, dropout_threshold, dropout_scale, dropout_seed, dropout_offset, lane)
#endif

#if defined(SMEM_Q) && defined(SMEM_K) && defined(SMEM_S) && defined(SMEM_M) && defined(SMEM_L)
// Pass 1. Grid (Tr, 1, BH). Bytes: Q N_q d, K N_k d Tr read; S N_q N_k (STORE_S), m, l N_q written.
template <typename T, int STORE_S>
__global__ void __launch_bounds__(THREADS, 1)
two_pass_stats(const T* __restrict__ Q, const T* __restrict__ K, T* __restrict__ S, float* __restrict__ m,
               float* __restrict__ l, int n_q, int n_k, float scale, IOK_BLOCK_MASK_PARAM
               unsigned long long* __restrict__ iok_counters)
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
    typename pick<STORE_S, IokCounters<IOK_T_Q, IOK_T_K, IOK_T_S, IOK_T_m, IOK_T_l IOK_BLOCK_MASK_T>,
                  IokCounters<IOK_T_Q, IOK_T_K, IOK_T_m, IOK_T_l IOK_BLOCK_MASK_T>>::type io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of Q_i, S_i, m_i, l_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
    const int kend = min(n_k, row0 + rows + off);  // key blocks from here on are masked for the whole block
#else
    const int kend = n_k;
#endif

    // Q_i -> SRAM once: it stays for the whole sweep over K. m = -inf, l = 0.
#ifdef BLOCK_SPARSE
    const int tc = (n_k + BC - 1) / BC;
    bool q_loaded = false;  // Q_i comes at the first computed pair
#else
#ifdef CAUSAL
    if (kend > 0)
#endif
        load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
#endif
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        m_i[r] = neg_inf();
        l_i[r] = 0.0f;
    }

    for (int col0 = 0; col0 < kend; col0 += BC) {
        const int cols = min(BC, n_k - col0);
#ifdef BLOCK_SPARSE
        if (!iok_block_kept(io, block_mask, blockIdx.x, col0 / BC, tc)) continue;  // a zero block of the mask
        if (!q_loaded) {
            load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
            q_loaded = true;
        }
#endif
        // K_j -> SRAM (QKᵀ of the previous j finished before its barrier below)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // K_j (and Q_i, m, l on the first pass) stored by other threads; and the
                          // previous j's statistics are done reading S before QKᵀ overwrites it

        // S_ij = τ Q_i K_jᵀ; STORE_S: rounded to T and written, and the statistics use the stored
        // values, so that pass 2's exp(S − m) / l sums to 1 over what it reads
        qk_tile(Qt, Kt, Sij, rows, cols, [&](int r, int c, float qk) {
#ifdef CAUSAL
            float s = col0 + c > row0 + r + off ? neg_inf() : scale * qk;
#else
            float s = scale * qk;
#endif
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
#ifdef CAUSAL
            const float m_ref = m_new == neg_inf() ? 0.0f : m_new;  // no key seen yet: exp(-inf) = 0
#else
            const float m_ref = m_new;
#endif
            float sum = 0.0f;
            for (int c = lane; c < cols; c += 32) sum += __expf(s[c] - m_ref);
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
    iok_flush(io, iok_counters);
}
#endif

#if defined(SMEM_S) && defined(SMEM_V) && defined(SMEM_O) && defined(SMEM_M) && defined(SMEM_L)
// Pass 2 from the stored S. Grid (Tr, 1, BH).
// Bytes: m, l N_q; S N_q N_k; V N_k d Tr read; O N_q d written.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
two_pass_store_output(const T* __restrict__ S, const float* __restrict__ m, const float* __restrict__ l,
                      const T* __restrict__ V, T* __restrict__ O, int n_q, int n_k, IOK_BLOCK_MASK_PARAM
                      IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
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
    IokCounters<IOK_T_S, IOK_T_V, IOK_T_O, IOK_T_m, IOK_T_l IOK_BLOCK_MASK_T> io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of S_i, m_i, l_i, O_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;
#ifdef CAUSAL
    const int kend = min(n_k, row0 + rows + iok_causal_offset(n_q, n_k));  // as pass 1
#else
    const int kend = n_k;
#endif

    // m_i, l_i -> SRAM once (BLOCK_SPARSE: at the first computed pair); O = 0
    for (int r = threadIdx.x; r < rows; r += THREADS) {
#ifdef IOK_EMPTY_ROWS
        if (kend <= 0 || BLOCK_SPARSE_LAZY) {  // no key visible to the block (yet): nothing read, O = 0
            m_i[r] = neg_inf();
            l_i[r] = 0.0f;
            continue;
        }
#endif
        m_i[r] = iok_ld<IOK_T_m>(io, m + q_off + r);
        l_i[r] = iok_ld<IOK_T_l>(io, l + q_off + r);
    }
    for (int i = threadIdx.x; i < rows * HEAD_D; i += THREADS) Oacc[i] = 0.0f;
    __syncthreads();  // m_i is read below by other threads than the ones that loaded it
#ifdef BLOCK_SPARSE
    const int tc = (n_k + BC - 1) / BC;
    bool stats_loaded = false;
#endif

    for (int col0 = 0; col0 < kend; col0 += BC) {
        const int cols = min(BC, n_k - col0);
#ifdef BLOCK_SPARSE
        if (!iok_block_kept(io, block_mask, blockIdx.x, col0 / BC, tc)) continue;  // a zero block of the mask
        if (!stats_loaded) {
            load_row_stats(io, m_i, l_i, m + q_off, l + q_off, rows);
            stats_loaded = true;
            __syncthreads();  // m_i is read below by other threads than the ones that loaded it
        }
#endif
        // P_ij = exp(S_ij − m_i) as S_ij streams in (the 1/l_i waits for the final store); V_j -> SRAM.
        // The previous iteration ended at a barrier: nobody reads P or V any more.
        for (int r = warp; r < rows; r += NWARPS) {
            const T* s = S + (q_off + r) * n_k + col0;
#ifdef CAUSAL
            const float mr = m_i[r] == neg_inf() ? 0.0f : m_i[r];  // a row with no visible key: S = -inf, P = 0
#else
            const float mr = m_i[r];
#endif
            for (int c = lane; c < cols; c += 32) P[r * BC + c] = __expf(to_f(iok_ld<IOK_T_S>(io, s + c)) - mr);
#ifdef DROPOUT
            __syncwarp();  // the row's P came from every lane
            TP_DROP_ROW(P + r * BC, cols, row0 + r, col0, lane);
#endif
        }
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // P and V_j were stored by other threads than the PV micro-tiles

        // O += P_ij V_j
        pv_tile(P, Vs, rows, cols, [&](int r, int n, float pv) { Oacc[r * HEAD_D + n] += pv; });
        __syncthreads();  // done with P and V_j before the next loads; O complete for the final store
    }

    // O_i = O / l_i, written once
#ifdef IOK_EMPTY_ROWS
    __syncthreads();  // with no key block the loop's barriers never ordered the set-up of O, l before this
#endif
    store_rows_divided<IOK_T_O>(io, O + q_off * HEAD_D, Oacc, l_i, rows);
    iok_flush(io, iok_counters);
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
                          int n_k, float scale, IOK_BLOCK_MASK_PARAM IOK_DROPOUT_PARAM
                          unsigned long long* __restrict__ iok_counters)
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
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_m, IOK_T_l IOK_BLOCK_MASK_T> io;

    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of Q_i, m_i, l_i, O_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
    const int kend = min(n_k, row0 + rows + off);  // as pass 1
#else
    const int kend = n_k;
#endif

    // Q_i, m_i, l_i -> SRAM once (BLOCK_SPARSE: at the first computed pair); O = 0
#ifdef BLOCK_SPARSE
    const int tc = (n_k + BC - 1) / BC;
    bool q_loaded = false;
#else
#ifdef CAUSAL
    if (kend > 0)  // no key visible to the block: nothing to read, O = 0
#endif
        load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
#endif
    for (int r = threadIdx.x; r < rows; r += THREADS) {
#ifdef IOK_EMPTY_ROWS
        if (kend <= 0 || BLOCK_SPARSE_LAZY) {
            m_i[r] = neg_inf();
            l_i[r] = 0.0f;
            continue;
        }
#endif
        m_i[r] = iok_ld<IOK_T_m>(io, m + q_off + r);
        l_i[r] = iok_ld<IOK_T_l>(io, l + q_off + r);
    }
    for (int i = threadIdx.x; i < rows * HEAD_D; i += THREADS) Oacc[i] = 0.0f;

    for (int col0 = 0; col0 < kend; col0 += BC) {
        const int cols = min(BC, n_k - col0);
#ifdef BLOCK_SPARSE
        if (!iok_block_kept(io, block_mask, blockIdx.x, col0 / BC, tc)) continue;  // a zero block of the mask
        if (!q_loaded) {  // the barrier after K_j, V_j orders these before their readers
            load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
            load_row_stats(io, m_i, l_i, m + q_off, l + q_off, rows);
            q_loaded = true;
        }
#endif
        // K_j, V_j -> SRAM (the previous iteration ended at a barrier: nobody reads them any more)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // K_j, V_j (and Q_i, m_i, l_i, O on the first pass) were stored by other threads

        // P_ij = exp(τ Q_i K_jᵀ − m_i), S recomputed exactly as pass 1 did (the 1/l_i waits for the store)
#ifdef CAUSAL
        qk_tile(Qt, Kt, P, rows, cols, [&](int r, int c, float qk) {
            return col0 + c > row0 + r + off ? 0.0f : __expf(scale * qk - m_i[r]);
        });
#else
        qk_tile(Qt, Kt, P, rows, cols, [&](int r, int, float qk) { return __expf(scale * qk - m_i[r]); });
#endif
        __syncthreads();  // a row of P comes from many threads' micro-tiles
#ifdef DROPOUT
        for (int r = threadIdx.x / 32; r < rows; r += NWARPS) {
            TP_DROP_ROW(P + r * BC, cols, row0 + r, col0, threadIdx.x % 32);
        }
        __syncthreads();  // a row of the dropped P is read by many threads' PV micro-tiles
#endif

        // O += P_ij V_j
        pv_tile(P, Vs, rows, cols, [&](int r, int n, float pv) { Oacc[r * HEAD_D + n] += pv; });
        __syncthreads();  // done with P, K_j, V_j before the next loads; O complete for the final store
    }

    // O_i = O / l_i, written once
#ifdef IOK_EMPTY_ROWS
    __syncthreads();  // with no key block the loop's barriers never ordered the set-up of O, l before this
#endif
    store_rows_divided<IOK_T_O>(io, O + q_off * HEAD_D, Oacc, l_i, rows);
    iok_flush(io, iok_counters);
}
#endif
