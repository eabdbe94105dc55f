// Tensor-core FlashAttention backward for sm_90a (H100/H200), float16 / bfloat16 (docs/KERNELS.md,
// "flash_wgmma_bwd.cu"; plan in iokernels/plan/fast_bwd.py, kernel "wgmma"): the FlashAttention-2
// K/V-outer loop of flash_bwd_kv_outer, so it moves exactly the bytes of that schedule's model with
// its own tiles, through warpgroup matrix products (PTX wgmma, wgmma.cuh; tiles as in wg.cuh).
//
// Grid (ceil(N_k / BC), 1, BH_kv), THREADS = 2 * BC: warpgroup w owns keys [64 w, 64 w + 64) of the
// block's BC. K_j, V_j are loaded once; Q_i, dO_i, lse_i, D_i (BR query rows) stream through a
// two-stage cp.async pipeline, for every query head that reads this K/V head (kv_group of them:
// grouped-query attention; 1 for none) and every query block. Per query block, each warpgroup
// computes the transposed products, its 64 keys as the wgmma M dimension:
//   Sᵀ  = K_w Q_iᵀ,  dPᵀ = V_w dO_iᵀ    m64nBRk16, A and B from shared memory, both K-major;
//   Pᵀ  = exp2(Sᵀ τ log2e − lse log2e)   (keys past N_k: 0);   dSᵀ = Pᵀ ∘ (dPᵀ − D);
//   dV_w += Pᵀ dO_i, dK_w += dSᵀ Q_i     m64nTILE_Dk16, A = Pᵀ / dSᵀ from registers (the accumulators,
//                                        rounded to T), B = dO_i / Q_i MN-major (transposed by wgmma);
// then every warpgroup stores its dSᵀ rows (rounded to T) in shared memory and, after a barrier, the
// warpgroups split dQ_i += τ dS K_j into 64 x 64 blocks (m64n64k16, A = dS and B = K_j both MN-major
// from shared memory), added to dQacc with float32 reductions (red.global.add.v2.f32), each counted as
// 4 bytes read and 4 written per float (DESIGN.md rule 4). dK (times τ) and dV stay in float32
// registers and are rounded and written once at the end.
//
// Rows past N_q or N_k are zero-filled in shared memory and never read or counted; their
// contributions vanish (zero rows of Q, dO, K, V; P of keys past N_k forced to 0), and nothing is
// stored for them.
//
// HEAD_D (the problem's d, the row stride in global memory) may sit inside a wider tile, TILE_D = 64 or 128
// (wg.cuh; the plan's HEAD_D_TILE): the columns past d are zero-filled in Q, dO, K, V, never read or counted,
// so S and dP are exact; the dQ, dK and dV columns past d are computed but neither added, stored nor counted.
//
// CAUSAL (causal plans; common.cuh): the query blocks start at the first one whose last row sees the
// block's first key (the blocks before it are entirely masked and not loaded); a key block no query
// sees loads nothing and writes dK_j = dV_j = 0. In the blocks that cross the diagonal, Pᵀ is 0 where
// key > query + offset (this also covers queries that see no key at all, whose lse is −inf).
//
// DROPOUT (dropout plans; common.cuh, iokernels/plan/dropout.py): with Z the keep mask times 1 / (1 − p),
// dV = (Z ∘ P)ᵀ dO, dP = Z ∘ (dO Vᵀ), dS = P ∘ (dP − D) (lse and D as without dropout). The keep bits of
// a step (wg_dropout_cols; element (bh, i, j): bh the query batch·head, i the query, j the key) are computed
// after the step before's products (while they flew, at d 96 and 128 they spilled); dSᵀ takes the undropped Pᵀ,
// so the dV product waits
// for it: Pᵀ's dropped elements are zeroed in its A fragments after dSᵀ is formed, and dV is multiplied by
// 1 / (1 − p) at the end.
#include "common.cuh"

#include "tiles.cuh"

#include "wgmma.cuh"

#include "wg.cuh"

#include "bwd.cuh"

#include "wg_bwd.cuh"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS) || !defined(SMEM_BYTES)
#error "flash_wgmma_bwd.cu needs BR, BC, HEAD_D, THREADS and SMEM_* from the plan"
#endif
static_assert(BC % 64 == 0 && THREADS == 2 * BC, "a warpgroup (128 threads) per 64 keys");
static_assert((BR == 64 || BR == 128) && (TILE_D == 64 || TILE_D == 128), "wgmma tile widths");

constexpr int WB_WARPGROUPS = BC / 64;
constexpr int WB_DSLABS = TILE_D / 64;                  // 64-column slabs of the tiles
constexpr int WB_DQ_BLOCKS = (BR / 64) * WB_DSLABS;     // 64 x 64 blocks of dQ_i per query block

template <typename T>
__device__ constexpr bool wb_layout_ok()
{
    constexpr size_t q = BR * TILE_D * sizeof(T), kv = BC * TILE_D * sizeof(T), row = BR * sizeof(float);
    return layout_ok<11>({{SMEM_K, kv}, {SMEM_V, kv}, {SMEM_Q0, q}, {SMEM_Q1, q}, {SMEM_DO0, q}, {SMEM_DO1, q},
                          {SMEM_DS, BC * BR * sizeof(T)}, {SMEM_LSE0, row}, {SMEM_LSE1, row}, {SMEM_D0, row},
                          {SMEM_D1, row}})
           && SMEM_K % 1024 == 0 && SMEM_V % 1024 == 0 && SMEM_Q0 % 1024 == 0 && SMEM_Q1 % 1024 == 0
           && SMEM_DO0 % 1024 == 0 && SMEM_DO1 % 1024 == 0 && SMEM_DS % 1024 == 0;
}

// Grid (ceil(n_k / BC), 1, BH / kv_group). Q, dO: (BH, n_q, HEAD_D) of T; K, V, dK, dV:
// (BH / kv_group, n_k, HEAD_D) of T; lse, D: (BH, n_q) float32; dQacc: (BH, n_q, HEAD_D) float32
// (zeroed by the prep stage). Query head z reads K/V head z / kv_group.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_wgmma_bwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, const T* __restrict__ dO,
                const float* __restrict__ lse, const float* __restrict__ Dg, float* __restrict__ dQacc,
                T* __restrict__ dK, T* __restrict__ dV, int n_q, int n_k, float scale, int kv_group,
                IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
{
    static_assert(wb_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES, tiles 1024-byte aligned");
    extern __shared__ __align__(1024) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_dO, IOK_T_lse, IOK_T_D, IOK_T_dQacc, IOK_T_dK, IOK_T_dV> io;
    if (threadIdx.x == 0 && (static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 1023u) != 0) __trap();

    const int wg = threadIdx.x >> 7;  // warpgroup: keys [64 wg, 64 wg + 64) of the block
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;  // accumulator coordinates: row group, thread in group
    const int col0 = blockIdx.x * BC;
    const int cols = min(BC, n_k - col0);  // the last K/V block is ragged
    const size_t kv_off = static_cast<size_t>(blockIdx.z) * n_k + col0;
    const int tiles = (n_q + BR - 1) / BR;
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
    // the first query block whose last row sees key col0 (tiles when no query sees it)
    const int first = col0 - off > n_q - 1 ? tiles : max(0, col0 - off) / BR;
    const int span = tiles - first;      // query blocks per query head
#else
    const int span = tiles;
#endif
    const int steps = span * kv_group;   // (query head of the group, query block) pairs
    const float scale2 = scale * WG_LOG2E;
    const unsigned char* Ks = smem + SMEM_K;
    const unsigned char* Vs = smem + SMEM_V;
    T* dSs = reinterpret_cast<T*>(smem + SMEM_DS);

#ifdef CAUSAL
    if (steps > 0) {  // a key block that no query sees loads nothing
#endif
        wg_load_tile<IOK_T_K, BC>(io, reinterpret_cast<T*>(smem + SMEM_K), K + kv_off * HEAD_D, cols);
        wg_load_tile<IOK_T_V, BC>(io, reinterpret_cast<T*>(smem + SMEM_V), V + kv_off * HEAD_D, cols);
#ifdef CAUSAL
    }
    auto step_block = [&](int s) { return first + s % span; };  // the query block of step s
#endif
    // first query row (over all heads) of step s, and its number of valid rows
    auto step_row = [&](int s, int& rows) {
        const int h = s / span;
#ifdef CAUSAL
        const int i = first + (s - h * span);
#else
        const int i = s - h * span;
#endif
        rows = min(BR, n_q - i * BR);
        return (static_cast<size_t>(blockIdx.z) * kv_group + h) * n_q + static_cast<size_t>(i) * BR;
    };
    auto load_q_block = [&](int s, int buf) {
        int rows;
        const size_t row = step_row(s, rows);
        wg_load_tile<IOK_T_Q, BR>(io, reinterpret_cast<T*>(smem + (buf ? SMEM_Q1 : SMEM_Q0)), Q + row * HEAD_D, rows);
        wg_load_tile<IOK_T_dO, BR>(io, reinterpret_cast<T*>(smem + (buf ? SMEM_DO1 : SMEM_DO0)), dO + row * HEAD_D,
                                   rows);
        bwd_load_scalars<IOK_T_lse, BR>(io, reinterpret_cast<float*>(smem + (buf ? SMEM_LSE1 : SMEM_LSE0)), lse + row,
                                        rows);
        bwd_load_scalars<IOK_T_D, BR>(io, reinterpret_cast<float*>(smem + (buf ? SMEM_D1 : SMEM_D0)), Dg + row, rows);
    };
#ifdef CAUSAL
    if (steps > 0)
#endif
        load_q_block(0, 0);
    iok_cp_async_commit();

    float dk[TILE_D / 2], dv[TILE_D / 2], s[BR / 2], dp[BR / 2];
#pragma unroll
    for (int i = 0; i < TILE_D / 2; ++i) dk[i] = dv[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < BR / 2; ++i) s[i] = dp[i] = 0.0f;
    const int key_w = wg * 64 + warp * 16;  // this warp's first key: rows key_w + g and key_w + g + 8
    const bool key_out[2] = {key_w + g >= cols, key_w + g + 8 >= cols};  // past n_k: P = 0
#ifdef DROPOUT
    // the keep bits of step s (element e of the Sᵀ fragment, key key_w + g + 8h, query 8n + 2t + c of the
    // block for e = 4n + 2h + c: bit wg_cols_bit<BR>(e)); step 0's now, step s + 1's at the end of step s
    constexpr int KEEP_REGS = WG_COLS_REGS<BR>;
    auto dropout_bits = [&](int s, unsigned (&keep)[KEEP_REGS]) {
        const int head = s / span;
#ifdef CAUSAL
        const int q0 = (first + s - head * span) * BR;
#else
        const int q0 = (s - head * span) * BR;
#endif
        wg_dropout_cols<BR>(keep, dropout_threshold, dropout_seed, dropout_offset, blockIdx.z * kv_group + head,
                            col0 + key_w, q0, g, t);
    };
    unsigned keep[KEEP_REGS];
    dropout_bits(0, keep);
#endif

#pragma unroll 1
    for (int step = 0; step < steps; ++step) {
        const int buf = step & 1;
        iok_cp_async_wait<0>();  // block step (and K, V) landed
        wg_fence_async_smem();
        __syncthreads();  // ... for every thread; every warpgroup is done with step - 1 (and dS)
        if (step + 1 < steps) load_q_block(step + 1, buf ^ 1);  // flies while this block is used
        iok_cp_async_commit();
        const unsigned char* Qs = smem + (buf ? SMEM_Q1 : SMEM_Q0);
        const unsigned char* dOs = smem + (buf ? SMEM_DO1 : SMEM_DO0);
        const float* lse_s = reinterpret_cast<const float*>(smem + (buf ? SMEM_LSE1 : SMEM_LSE0));
        const float* d_s = reinterpret_cast<const float*>(smem + (buf ? SMEM_D1 : SMEM_D0));

        wgb_s_dp<T>(s, dp, Ks, Vs, Qs, dOs, wg);  // Sᵀ done, dPᵀ may fly
        wgb_probs(s, lse_s, scale2, key_out, t);
#ifdef CAUSAL
        wgb_band(s, col0, key_w, g, t, step_block(step) * BR, 0, off);
#endif
        unsigned pa[BR / 16][4], dsa[BR / 16][4];  // Pᵀ and dSᵀ as A fragments (rounded to T)
        wg_acc_to_a<T, BR>(pa, s);
#ifdef DROPOUT
        wgb_grads<T>(dv, dp, pa, dsa, d_s, dOs, t, keep, dropout_scale);
#else
        wgb_grads<T>(dv, dp, pa, dsa, d_s, dOs, t);
#endif
        wgb_dk<T>(dk, dsa, Qs);
        wgb_store_ds<T>(dSs, dsa, key_w, g, t);
        wg_fence_async_smem();
        __syncthreads();  // every warpgroup's dSᵀ rows are visible

        // dQacc_i += τ dS K_j, 64 x 64 blocks (query slab, d slab) split among the warpgroups
        int rows;
        const size_t row0 = step_row(step, rows);
#pragma unroll 1
        for (int blk = wg; blk < WB_DQ_BLOCKS; blk += WB_WARPGROUPS) {
            const int qs = blk / WB_DSLABS, ds = blk % WB_DSLABS;
            float acc[32];  // overwritten by the first product (scale_d = 0)
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BC / 16; ++kk) {
                wg_mma_ss_tt<T, 64>(acc, wg_desc_mn<BC>(smem + SMEM_DS, qs, kk), wg_desc_mn<BC>(Ks, ds, kk), kk);
            }
            wg_commit();
            wg_wait<0>();
            wg_fence_regs(acc);
            wgb_dq_red(io, dQacc, acc, row0, rows, qs, ds, warp, g, t, scale);
        }
        wg_wait<0>();  // dV and dK products done: pa, dsa may be reused
        wg_fence_regs(pa);
        wg_fence_regs(dsa);
        wg_fence_regs(dv);
        wg_fence_regs(dk);
#ifdef DROPOUT
        // the next step's bits once the products are done (drawn while they fly, with pa and dsa live, they spilled
        // at d 96 and 128)
        if (step + 1 < steps) dropout_bits(step + 1, keep);
#endif
    }
    iok_cp_async_wait<0>();

    // dK_j = τ dK, dV_j rounded and written once
#ifdef DROPOUT
    wgb_store_dkdv(io, dK, dV, dk, dv, kv_off, key_w, g, t, cols, scale, dropout_scale);
#else
    wgb_store_dkdv(io, dK, dV, dk, dv, kv_off, key_w, g, t, cols, scale, 1.0f);
#endif
    iok_flush(io, iok_counters);
}
