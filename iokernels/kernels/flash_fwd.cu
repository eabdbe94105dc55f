// FlashAttention forward in the two loop orders of KERNELS.md ("flash_fwd.cu"):
//   flash_q_outer   FlashAttention-2: block i keeps Q_i, O_i, m_i, l_i on chip and streams K_j, V_j.
//   flash_kv_outer  Algorithm 1 of the paper: one block per (batch, head) keeps K_j, V_j on chip and
//                   streams Q_i, O_i, l_i, m_i through HBM for every j (O as a float32 accumulator,
//                   Oacc, so half-precision runs accumulate in float32; flash_finalize rounds it once).
//
// BR, BC, HEAD_D and the SMEM_* offsets come from the plan. CUDA cores, float32 accumulation.
// CAUSAL (causal plans; common.cuh): masked elements of S are −inf; (query block, key block) pairs
// whose elements are all masked are skipped, loads included; a row that sees no key ends with O = 0
// and lse = −inf (m stays −inf, l = 0, and exp is taken against 0 instead of −inf, never NaN).
// BLOCK_SPARSE (block-sparse plans; common.cuh): pairs whose block-mask byte is 0 are skipped, loads
// included; the resident block (q_outer: Q_i; kv_outer: K_j, V_j) is loaded at its first computed pair, so a
// block with none loads nothing (q_outer: O = 0, lse = −inf).
// MASK (explicit masks, flash_q_outer only; common.cuh): every element of S of a computed pair reads its
// mask element once (boolean 0 → −inf, additive: τS + mask); rows that see no key end as with CAUSAL.
// DROPOUT (dropout on P; common.cuh, iokernels/plan/dropout.py): m and l are those of the undropped P (l sums
// P before dropout), and P_ij is multiplied by Z_ij = iok_dropout(bh, i, j) before PV, so O = (Z ∘ P) V; the
// mask is regenerated from (seed, offset, batch·head, row, column), never stored: no byte more or less.
// Shared memory (the plan's buffers, nothing else):
//   Q  HEAD_D x BR of T, transposed (Qt[k][r]) so that S = QKᵀ reads consecutive r / c across a warp
//   K  HEAD_D x BC of T, transposed (Kt[k][c])
//   V  BC x HEAD_D of T, as in HBM
//   O  BR x HEAD_D float32;  S  BR x BC float32 (row stride BC);  M, L  BR float32
#include "common.cuh"

#include "tiles.cuh"

#ifdef DROPOUT
#define FWD_DROP_ROW(p, cols, i, col0, lane) \
    iok_drop_row(p, cols, blockIdx.z, i, col0, dropout_threshold, dropout_scale, dropout_seed, dropout_offset, lane)
#endif

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
              float* __restrict__ lse, int n_q, int n_k, float scale, IOK_BLOCK_MASK_PARAM IOK_MASK_PARAM
              IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
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
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_lse IOK_BLOCK_MASK_T IOK_MASK_T> io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);  // the last row block is ragged
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;  // first row of Q_i, O_i, lse_i
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;
#ifdef MASK
    const iok_mask_t* mask_i = iok_mask_rows(mask, blockIdx.z, n_q, n_k) + static_cast<size_t>(row0) * n_k;
#endif
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
    // keys past the block's last row's last visible key are masked for all its rows: their blocks are skipped
    const int kend = min(n_k, row0 + rows + off);
#else
    const int kend = n_k;
#endif

    // Q_i -> SRAM once: it stays for the whole sweep over K, V. O = 0, m = -inf, l = 0.
#ifdef BLOCK_SPARSE
    const int tc = (n_k + BC - 1) / BC;
    bool q_loaded = false;  // Q_i comes at the first computed pair
#else
#ifdef CAUSAL
    if (kend > 0)  // no key visible to the block: nothing to load, O = 0 and lse = -inf below
#endif
        load_transposed<IOK_T_Q, BR>(io, Qt, Q + q_off * HEAD_D, rows);
#endif
    for (int i = threadIdx.x; i < rows * HEAD_D; i += THREADS) Oacc[i] = 0.0f;
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
        // K_j, V_j -> SRAM (the previous iteration ended at a barrier: nobody reads them any more)
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
        __syncthreads();  // K_j, V_j (and Q_i, O, m, l on the first pass) were stored by other threads

        // S = τ Q_i K_jᵀ (MASK: every element's mask element read, before the causal test)
#if defined(MASK) && defined(CAUSAL)
        qk_tile(Qt, Kt, S, rows, cols, [&](int r, int c, float qk) {
            const float x = iok_apply_mask(io, mask_i + static_cast<size_t>(r) * n_k + col0 + c, scale * qk);
            return col0 + c > row0 + r + off ? neg_inf() : x;
        });
#elif defined(MASK)
        qk_tile(Qt, Kt, S, rows, cols, [&](int r, int c, float qk) {
            return iok_apply_mask(io, mask_i + static_cast<size_t>(r) * n_k + col0 + c, scale * qk);
        });
#elif defined(CAUSAL)
        qk_tile(Qt, Kt, S, rows, cols,
                [&](int r, int c, float qk) { return col0 + c > row0 + r + off ? neg_inf() : scale * qk; });
#else
        qk_tile(Qt, Kt, S, rows, cols, [&](int, int, float qk) { return scale * qk; });
#endif
        __syncthreads();  // a row of S comes from many threads' micro-tiles

        // m_new = max(m, rowmax S); P = exp(S − m_new); l = e^{m − m_new} l + rowsum P; O *= e^{m − m_new}
        for (int r = warp; r < rows; r += NWARPS) {
            float* s = S + r * BC;
            float mx = neg_inf();
            for (int c = lane; c < cols; c += 32) mx = fmaxf(mx, s[c]);
            const float m_old = m_i[r];
            const float m_new = fmaxf(m_old, warp_max(mx));
#if defined(CAUSAL) || defined(MASK)
            const float m_ref = m_new == neg_inf() ? 0.0f : m_new;  // no key seen yet: every p is exp(-inf) = 0
#else
            const float m_ref = m_new;
#endif
            float sum = 0.0f;
            for (int c = lane; c < cols; c += 32) {
                const float p = __expf(s[c] - m_ref);
                s[c] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            // the first tile has nothing to rescale, and e^{-inf - (-inf)} would be NaN
            const float alpha = m_old == neg_inf() ? 0.0f : __expf(m_old - m_new);
            for (int n = lane; n < HEAD_D; n += 32) Oacc[r * HEAD_D + n] *= alpha;
            __syncwarp();  // every lane has read m_i[r] before lane 0 overwrites it (DROPOUT: and wrote its P)
            if (lane == 0) {
                m_i[r] = m_new;
                l_i[r] = alpha * l_i[r] + sum;
            }
#ifdef DROPOUT
            FWD_DROP_ROW(s, cols, row0 + r, col0, lane);  // l summed the undropped P; O accumulates Z ∘ P
#endif
        }
        __syncthreads();  // P and the rescaled O rows were written by other warps than the PV micro-tiles

        // O += P V_j (DROPOUT: the dropped P)
        pv_tile(S, Vs, rows, cols, [&](int r, int n, float pv) { Oacc[r * HEAD_D + n] += pv; });
        __syncthreads();  // done with S, V_j and O before the next K_j, V_j and the final store
    }

    // O_i = O / l, lse_i = m + log l, each written once (a row that saw no key: 0 and -inf)
#ifdef IOK_EMPTY_ROWS
    __syncthreads();  // with no key block the loop's barriers never ordered the set-up of O, m, l before this
#endif
    store_rows_divided<IOK_T_O>(io, O + q_off * HEAD_D, Oacc, l_i, rows);
    for (int r = threadIdx.x; r < rows; r += THREADS) iok_st<IOK_T_lse>(io, lse + q_off + r, m_i[r] + logf(l_i[r]));
    iok_flush(io, iok_counters);
}

// Algorithm 1 literally. Grid (1, 1, BH); Oacc = 0, l = 0, m = -inf in HBM beforehand (flash_init).
// Bytes: K, V N_k d read; Q N_q d Tc read; Oacc N_q d Tc read and written (float32); m, l N_q Tc read
// and written. Oacc, m, l are read back after this block wrote them (next j), so they are not
// __restrict__: no read-only cache path for them.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_kv_outer(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, float* Oacc, float* m,
               float* l,
               int n_q, int n_k, float scale, IOK_BLOCK_MASK_PARAM IOK_DROPOUT_PARAM
               unsigned long long* __restrict__ iok_counters)
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
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_Oacc, IOK_T_m, IOK_T_l IOK_BLOCK_MASK_T> io;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const size_t q_base = static_cast<size_t>(blockIdx.z) * n_q;
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
#endif
#ifdef BLOCK_SPARSE
    const int tc = (n_k + BC - 1) / BC;
#endif

    for (int col0 = 0; col0 < n_k; col0 += BC) {
        const int cols = min(BC, n_k - col0);
#ifdef CAUSAL
        if (col0 > n_q - 1 + off) break;  // no query sees this key block, nor the later ones
#endif
        // K_j, V_j -> SRAM, once (the previous i ended at a barrier: nobody reads them any more);
        // BLOCK_SPARSE: at the key block's first computed pair
#ifdef BLOCK_SPARSE
        bool kv_loaded = false;
#else
        load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
        load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
#endif

        for (int row0 = 0; row0 < n_q; row0 += BR) {
            const int rows = min(BR, n_q - row0);
#ifdef CAUSAL
            // every element of the pair is masked (the same for the whole block). The last row block
            // always sees this key block, so the loop still ends at the barrier the next K_j, V_j wait for.
            if (col0 > row0 + rows - 1 + off) continue;
#endif
#ifdef BLOCK_SPARSE
            // a zero block of the mask (its barrier also ends the previous pair's work, like the one below)
            if (!iok_block_kept(io, block_mask, row0 / BR, col0 / BC, tc)) continue;
            if (!kv_loaded) {
                load_transposed<IOK_T_K, BC>(io, Kt, K + (kv_base + col0) * HEAD_D, cols);
                load_rows<IOK_T_V>(io, Vs, V + (kv_base + col0) * HEAD_D, cols);
                kv_loaded = true;
            }
#endif
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
#ifdef CAUSAL
            qk_tile(Qt, Kt, S, rows, cols,
                    [&](int r, int c, float qk) { return col0 + c > row0 + r + off ? neg_inf() : scale * qk; });
#else
            qk_tile(Qt, Kt, S, rows, cols, [&](int, int, float qk) { return scale * qk; });
#endif
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
#ifdef CAUSAL
                const bool empty = mx == neg_inf();  // the row sees no key of this block: m, l, O stay
                const float mx_ref = empty ? 0.0f : mx;  // and its p are exp(-inf) = 0, never NaN
#else
                const float mx_ref = mx;
#endif
                float sum = 0.0f;
                for (int c = lane; c < cols; c += 32) {
                    const float p = __expf(s[c] - mx_ref);
                    s[c] = p;
                    sum += p;
                }
                sum = warp_sum(sum);
                const float m_old = m_i[r], l_old = l_i[r];
                const float m_new = fmaxf(m_old, mx);
                // m_i = -inf until the row's first update: nothing to rescale, and no e^{-inf - (-inf)}
                const float a = m_old == neg_inf() ? 0.0f : __expf(m_old - m_new);
#ifdef CAUSAL
                const float b = empty ? 0.0f : __expf(mx - m_new);
                const float l_new = empty ? l_old : a * l_old + b * sum;
#else
                const float b = __expf(mx - m_new);
                const float l_new = a * l_old + b * sum;
#endif
                __syncwarp();  // every lane has read m_i[r], l_i[r] before lane 0 overwrites them (and wrote its P̃)
#ifdef DROPOUT
                FWD_DROP_ROW(s, cols, row0 + r, col0, lane);  // l̃ summed the undropped P̃; O gets β (Z ∘ P̃) V_j
#endif
                if (lane == 0) {
                    iok_st<IOK_T_m>(io, m + q_off + r, m_new);
                    iok_st<IOK_T_l>(io, l + q_off + r, l_new);
#ifdef CAUSAL
                    m_i[r] = empty ? 1.0f : l_old * a / l_new;
                    l_i[r] = empty ? 0.0f : b / l_new;
#else
                    m_i[r] = l_old * a / l_new;
                    l_i[r] = b / l_new;
#endif
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
    iok_flush(io, iok_counters);
}
