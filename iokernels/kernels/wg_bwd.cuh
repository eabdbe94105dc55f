// The per-step math of the sm_90 backwards (flash_wgmma_bwd.cu, flash_tma_bwd.cu: the same products, masks and
// dropout; they differ in how tiles move and how dQ is added). A warpgroup owns 64 keys of the block's BC (rows
// key_w + g and key_w + g + 8 of a thread); its accumulators hold Sᵀ and dPᵀ (64 keys x BR queries, or x 32 of
// them in flash_tma_bwd.cu's wide tiles: element i of a thread is key g + 8 ((i >> 1) & 1), query 8 (i >> 2) + 2t
// + (i & 1) of its first) and dK, dV (64 keys x TILE_D, or the warpgroup's columns of it).
// The comment of flash_wgmma_bwd.cu states the products and the rules.
#pragma once

#if !defined(BR) || !defined(BC) || !defined(HEAD_D)
#error "wg_bwd.cuh needs BR, BC and HEAD_D from the plan"
#endif

constexpr int WGB_DSTEPS = (HEAD_D + 15) / 16;  // 16-wide steps of S, dP over d (past d: zero columns)

// Sᵀ = K_w Q_iᵀ and dPᵀ = V_w dO_iᵀ (m64nBRk16, both operands K-major in shared memory) issued, two commit groups
template <typename T>
__device__ __forceinline__ void wgb_s_dp_issue(float (&s)[BR / 2], float (&dp)[BR / 2], const unsigned char* Ks,
                                               const unsigned char* Vs, const unsigned char* Qs,
                                               const unsigned char* dOs, int wg)
{
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < WGB_DSTEPS; ++kk) {
        wg_mma_ss<T, BR>(s, wg_desc_k<BC>(Ks, wg * 64, kk), wg_desc_k<BR>(Qs, 0, kk), kk);
    }
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < WGB_DSTEPS; ++kk) {
        wg_mma_ss<T, BR>(dp, wg_desc_k<BC>(Vs, wg * 64, kk), wg_desc_k<BR>(dOs, 0, kk), kk);
    }
    wg_commit();
}
// The same, returning once Sᵀ is done (dPᵀ may fly)
template <typename T>
__device__ __forceinline__ void wgb_s_dp(float (&s)[BR / 2], float (&dp)[BR / 2], const unsigned char* Ks,
                                         const unsigned char* Vs, const unsigned char* Qs, const unsigned char* dOs,
                                         int wg)
{
    wgb_s_dp_issue<T>(s, dp, Ks, Vs, Qs, dOs, wg);
    wg_wait<1>();  // Sᵀ done (dPᵀ may fly)
    wg_fence_regs(s);
}

// Pᵀ = exp(τ Sᵀ − lse) in base 2 (lse_s: the lse values of the accumulator's queries; LOG2: already times log2 e,
// flash_tma_bwd.cu's loader), 0 for keys past n_k (key_out: the thread's two keys). SPLIT: the selects in a branch of
// their own, taken in the last key block only (32 FSEL a step fewer at B_r 64 elsewhere; the builds whose registers
// allow it: with the variants' state ptxas spills).
template <bool LOG2 = false, bool SPLIT = false, int NS>
__device__ __forceinline__ void wgb_probs(float (&s)[NS], const float* lse_s, float scale2, const bool (&key_out)[2],
                                          int t)
{
    constexpr float l2_scale = LOG2 ? 1.0f : WG_LOG2E;  // lse to base 2
    if (!SPLIT || key_out[0] || key_out[1]) {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            const float p = iok_exp2(fmaf(s[i], scale2, -lse_s[8 * (i >> 2) + 2 * t + (i & 1)] * l2_scale));
            s[i] = key_out[(i >> 1) & 1] ? 0.0f : p;
        }
    } else {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            s[i] = iok_exp2(fmaf(s[i], scale2, -lse_s[8 * (i >> 2) + 2 * t + (i & 1)] * l2_scale));
        }
    }
}
#ifdef ALIBI
// ALiBi's bias (common.cuh) added to Sᵀ in units of s (slope: the query head's over τ): −slope |key − q − off| for
// the thread's keys key and key + 8 and the accumulator's queries q0 + 8 (i >> 2) + 2t + (i & 1)
template <int NS>
__device__ __forceinline__ void wgb_alibi(float (&s)[NS], int key, int q0, float slope, int off, int t)
{
    const float c0 = static_cast<float>(key - q0 - 2 * t - off);  // (floats: exact offsets, no integer temporaries)
#pragma unroll
    for (int i = 0; i < NS; ++i) {
        const float c = c0 + static_cast<float>(8 * ((i >> 1) & 1) - 8 * (i >> 2) - (i & 1));
        s[i] = fmaf(-slope, fabsf(c), s[i]);
    }
}
#endif
#ifdef IOK_MODS
// The mods (common.cuh iok_mod_s) on Sᵀ in units of s, for the thread's keys key and key + 8 and the accumulator's
// queries q0 + 8 (i >> 2) + 2t + (i & 1), every element (a query or key past the problem's end takes its last one's
// index; no branch around an element): mask_mod first (where `partial`), setting bit i of hidden where it hides the
// element (wgb_hide zeroes its P after wgb_probs, as a band does: a row that sees no key
// has lse −inf), then where it keeps it the derivative (SCORE_GRAD, at the score before score_mod; 0 elsewhere) into
// grad as half2 pairs, as wgb_probs_softcap's, and score_mod's value into s.
template <int NS, typename IO>
__device__ __forceinline__ void wgb_mods(IO& io, const IokMod& m, float (&s)[NS], unsigned (&hidden)[(NS + 31) / 32],
                                         [[maybe_unused]] unsigned (&grad)[NS / 2], int key, int q0, int z,
                                         float scale, [[maybe_unused]] bool partial, int t)
{
#pragma unroll
    for (int w = 0; w < (NS + 31) / 32; ++w) hidden[w] = 0u;
    [[maybe_unused]] float gr[2];
    const int keys[2] = {min(key, m.n_k - 1), min(key + 8, m.n_k - 1)};
    [[maybe_unused]] const float inv = 1.0f / scale;
#pragma unroll
    for (int i = 0; i < NS; ++i) {
        const int k = keys[(i >> 1) & 1], q = min(q0 + 8 * (i >> 2) + 2 * t + (i & 1), m.n_q - 1);
#ifdef MASK_MOD
        const bool hide = partial && !iok_mask_mod(io, m, z, q, k);
#else
        constexpr bool hide = false;
#endif
#ifdef SCORE_GRAD
        gr[i & 1] = 0.0f;
#endif
        if (!hide) {
#ifdef SCORE_GRAD
            gr[i & 1] = iok_score_grad(io, m, z, q, k, s[i] * scale);
#endif
#ifdef SCORE_MOD
            s[i] = iok_score_mod(io, m, z, q, k, s[i] * scale) * inv;
#endif
        }
        if (hide) hidden[i / 32] |= 1u << (i % 32);
#ifdef SCORE_GRAD
        if (i & 1) grad[i >> 1] = wg_pack<__half>(gr[0], gr[1]);
#endif
    }
}

template <int NS>
__device__ __forceinline__ void wgb_hide(float (&p)[NS], const unsigned (&hidden)[(NS + 31) / 32])
{
#pragma unroll
    for (int i = 0; i < NS; ++i) {
        if ((hidden[i / 32] >> (i % 32)) & 1u) p[i] = 0.0f;
    }
}
#endif
#ifdef SOFTCAP
// With a softcap c (common.cuh): t = tanh(τ Sᵀ / c), Pᵀ = exp(c t − lse) in base 2 (lse_s times log2 e) rounded into
// the A fragments pa (0 for keys past n_k and where the band set Sᵀ to −inf: tanh(−inf) = −1 would not give 0), and
// cap_grad holding 1 − t², the logits' derivative, which dS takes (0 where P is), as half2 pairs (in [0, 1]; 16
// registers at B_r 64 where floats took 32 and spilled the counting build)
template <typename T, int NS>
__device__ __forceinline__ void wgb_probs_softcap(const float (&s)[NS], unsigned (&pa)[NS / 8][4],
                                                  unsigned (&cap_grad)[NS / 2], const float* lse_s, float softcap,
                                                  float scale, const bool (&key_out)[2], int t)
{
    float p[2], gr[2];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
        const float l2 = lse_s[8 * (i >> 2) + 2 * t + (i & 1)];  // (times log2 e: flash_tma_bwd.cu's loader)
        const bool out = key_out[(i >> 1) & 1] || s[i] == neg_inf();
        const float th = iok_tanh(s[i] * (scale / softcap));
        p[i & 1] = out ? 0.0f : iok_exp2(fmaf(th, softcap * WG_LOG2E, -l2));
        gr[i & 1] = out ? 0.0f : fmaf(-th, th, 1.0f);
        if (i & 1) {
            pa[i >> 3][(i >> 1) & 3] = wg_pack<T>(p[0], p[1]);
            cap_grad[i >> 1] = wg_pack<__half>(gr[0], gr[1]);
        }
    }
}
#endif
#ifdef IOK_BAND
// Pᵀ's elements outside the band (common.cuh) set to `out` (0; −inf before wgb_probs_softcap): key > query + hi, and
// with WINDOW key < query + lo (lo is not read without). Only in steps whose block reaches past them (the step's
// queries of s: q0 .. q0 + 2 NS - 1).
template <int NS>
__device__ __forceinline__ void wgb_band(float (&s)[NS], int col0, int key_w, int g, int t, int q0,
                                         [[maybe_unused]] int lo, int hi, float out = 0.0f)
{
#ifdef WINDOW
    if (col0 + BC - 1 > q0 + hi || col0 < q0 + 2 * NS - 1 + lo) {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            const int key = col0 + key_w + g + 8 * ((i >> 1) & 1), q = q0 + 8 * (i >> 2) + 2 * t + (i & 1);
            if (key > q + hi || key < q + lo) s[i] = out;
        }
    }
#else
    if (col0 + BC - 1 > q0 + hi) {
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            const int key = col0 + key_w + g + 8 * ((i >> 1) & 1);
            if (key > q0 + 8 * (i >> 2) + 2 * t + (i & 1) + hi) s[i] = out;
        }
    }
#endif
}
#endif

// From Pᵀ (pa, rounded to T, the A fragments of the dV product) and dPᵀ (dp, its product maybe in flight): dSᵀ =
// Pᵀ ∘ (dPᵀ − D) into dsa (rounded to T; d_s the step's D values), and the product dV_w += Pᵀ dO_i issued, one commit
// group (dK_w += dSᵀ Q_i is wgb_dk's, which the caller issues when it suits its pipeline). With DROPOUT (keep: the
// step's keep bits, wg_dropout_cols; z the keep scale): dSᵀ = Pᵀ ∘ (Z ∘ dPᵀ − D) with the undropped Pᵀ, then Pᵀ's
// dropped elements zeroed in pa for the dV product (dV is multiplied by 1 / (1 − p) at the end). With SOFTCAP
// (cap_grad: wgb_probs_softcap's 1 − tanh², half2 pairs) or SCORE_GRAD (wgb_mods') dSᵀ is that times cap_grad.
template <typename T>
__device__ __forceinline__ void wgb_grads(float (&dv)[TILE_D / 2], float (&dp)[BR / 2],
                                          unsigned (&pa)[BR / 16][4], unsigned (&dsa)[BR / 16][4], const float* d_s,
                                          const unsigned char* dOs, int t
#ifdef DROPOUT
                                          , unsigned (&keep)[WG_COLS_REGS<BR>], float z_scale
#endif
#if defined(SOFTCAP) || defined(SCORE_GRAD)
                                          , const unsigned (&cap_grad)[BR / 4]
#endif
)
{
#ifdef DROPOUT
    wg_wait<0>();  // dPᵀ done
    wg_fence_regs(dp);
    wg_pin(keep);  // no use of them earlier
#pragma unroll
    for (int i = 0; i < BR / 2; ++i) {
        const float2 p2 = wg_unpack<T>(pa[i >> 3][(i >> 1) & 3]);
        const float p = (i & 1) ? p2.y : p2.x;
        const int b = wg_cols_bit<BR>(i);
        const float z = wg_keep(z_scale, keep[b / 32], b % 32);  // Z: the keep scale or 0
        dp[i] = p * fmaf(dp[i], z, -d_s[8 * (i >> 2) + 2 * t + (i & 1)]);
    }
    wg_acc_to_a<T, BR>(dsa, dp);
    wg_fence_regs(pa);  // the dropped Pᵀ below, not earlier beside the undropped one
    // (Z ∘ Pᵀ) / keep scale: register r of step kk holds elements 8 kk + 2r and the next
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int lo = wg_cols_bit<BR>(8 * kk + 2 * r), hi = wg_cols_bit<BR>(8 * kk + 2 * r + 1);
            pa[kk][r] = wg_keep2(pa[kk][r], keep[lo / 32], lo % 32, keep[hi / 32], hi % 32);
        }
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) wg_mma_rs_tb<T, TILE_D>(dv, pa[kk], wg_desc_mn<BR>(dOs, 0, kk), 1);
    wg_commit();
#else
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) wg_mma_rs_tb<T, TILE_D>(dv, pa[kk], wg_desc_mn<BR>(dOs, 0, kk), 1);
    wg_commit();
    wg_wait<1>();  // dPᵀ done (dV may fly)
    wg_fence_regs(dp);
#pragma unroll
    for (int i = 0; i < BR / 2; ++i) {  // with Pᵀ as rounded for the dV product
        const float2 p2 = wg_unpack<T>(pa[i >> 3][(i >> 1) & 3]);
        const float p = (i & 1) ? p2.y : p2.x;
        dp[i] = p * (dp[i] - d_s[8 * (i >> 2) + 2 * t + (i & 1)]);
#if defined(SOFTCAP) || defined(SCORE_GRAD)
        const float2 g2 = wg_unpack<__half>(cap_grad[i >> 1]);
        dp[i] *= (i & 1) ? g2.y : g2.x;  // through the softcap (1 − tanh²) or score_mod (SCORE_GRAD)
#endif
    }
    wg_acc_to_a<T, BR>(dsa, dp);
#endif
}

// dK_w += dSᵀ Q_i (τ applied at the end), one commit group
template <typename T>
__device__ __forceinline__ void wgb_dk(float (&dk)[TILE_D / 2], const unsigned (&dsa)[BR / 16][4],
                                       const unsigned char* Qs)
{
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) wg_mma_rs_tb<T, TILE_D>(dk, dsa[kk], wg_desc_mn<BR>(Qs, 0, kk), 1);
    wg_commit();
}

// dSᵀ (or Pᵀ) -> shared memory (BC keys x BR queries of T, the wg.cuh tile layout): fragment register r of step
// kk holds key g + 8 (r & 1), queries q0 + 16 kk + 8 (r >> 1) + 2t and the next, i.e. 8 x 8 matrix r of the warp's
// 16 keys x 16 queries in the layout stmatrix takes; one stmatrix.x4 stores the step's four, lane 8m + j giving the
// address of row j of matrix m (a row's 8 queries are one 16-byte chunk of the swizzled tile)
template <typename T, int KS>
__device__ __forceinline__ void wgb_store_ds(T* dSs, const unsigned (&dsa)[KS][4], int key_w, int g, int t,
                                             int q0 = 0)
{
    const int lane = 4 * g + t, m = lane >> 3, key = key_w + (lane & 7) + 8 * (m & 1);
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        const unsigned addr = static_cast<unsigned>(
            __cvta_generic_to_shared(dSs + wg_off<BC>(key, q0 + 16 * kk + 8 * (m >> 1))));
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(dsa[kk][0]),
                     "r"(dsa[kk][1]), "r"(dsa[kk][2]), "r"(dsa[kk][3])
                     : "memory");
    }
}

// dK_j = τ dK and dV_j = dv_scale dV rounded and written once (rows past n_k, cols of them in the block, and the
// tile's columns past d skipped), counted as dK and dV writes. Key row k of the block is row kv_off + k·stride of HEAD_D
// elements (stride: the K/V heads of a variable-length batch's packed rows, else 1).
template <typename T, typename C>
__device__ __forceinline__ void wgb_store_dkdv(C& io, T* dK, T* dV, const float (&dk)[TILE_D / 2],
                                               const float (&dv)[TILE_D / 2], size_t kv_off, int key_w, int g, int t,
                                               int cols, float scale, float dv_scale, int stride = 1)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key_w + g + 8 * h;
        if (key < cols) {
            T* krow = dK + (kv_off + static_cast<size_t>(key) * stride) * HEAD_D + 2 * t;
            T* vrow = dV + (kv_off + static_cast<size_t>(key) * stride) * HEAD_D + 2 * t;
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; ++n) {  // the columns of d only (HEAD_D / 8 of TILE_D / 8)
                iok_st<IOK_T_dK>(io, reinterpret_cast<unsigned*>(krow + n * 8),
                                 wg_pack<T>(dk[4 * n + 2 * h] * scale, dk[4 * n + 2 * h + 1] * scale));
                iok_st<IOK_T_dV>(io, reinterpret_cast<unsigned*>(vrow + n * 8),
                                 wg_pack<T>(dv[4 * n + 2 * h] * dv_scale, dv[4 * n + 2 * h + 1] * dv_scale));
            }
        }
    }
}
// The same for one of them (tensor TI: dK or dV, x = its scale).
template <int TI, typename T, typename C>
__device__ __forceinline__ void wgb_store_rows(C& io, T* dst, const float (&acc)[TILE_D / 2], size_t kv_off, int key_w,
                                               int g, int t, int cols, float x, int stride = 1)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key_w + g + 8 * h;
        if (key < cols) {
            T* row = dst + (kv_off + static_cast<size_t>(key) * stride) * HEAD_D + 2 * t;
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; ++n) {
                iok_st<TI>(io, reinterpret_cast<unsigned*>(row + n * 8),
                           wg_pack<T>(acc[4 * n + 2 * h] * x, acc[4 * n + 2 * h + 1] * x));
            }
        }
    }
}

// dQacc rows row0 + stride·[0, rows) (row0: the global row of the block's first query; stride as wgb_store_dkdv's),
// columns 64 ds + [0, 64) += τ acc
// (a 64 x 64 block of dQ_i: query slab qs, d slab ds) by float32 reductions (bwd.cuh's red.global.add.v2.f32,
// counted as 8 bytes read and 8 written each); rows past n_q and the tile's columns past d are not added.
template <typename C>
__device__ __forceinline__ void wgb_dq_red(C& io, float* dQacc, const float (&acc)[32], size_t row0, int rows, int qs,
                                           int ds, int warp, int g, int t, float scale, int stride = 1)
{
    constexpr int last_n = (HEAD_D - (TILE_D - 64)) / 8;  // 8-column groups of d in the tiles' last slab
    const bool last = ds == TILE_D / 64 - 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = qs * 64 + warp * 16 + g + 8 * h;
        if (r < rows) {
            float* dst = dQacc + (row0 + static_cast<size_t>(r) * stride) * HEAD_D + ds * 64 + 2 * t;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                if (TILE_D == HEAD_D || n < last_n || !last) {  // columns past d: not added
                    bwd_red_add2<IOK_T_dQacc>(io, dst + n * 8, acc[4 * n + 2 * h] * scale,
                                              acc[4 * n + 2 * h + 1] * scale);
                }
            }
        }
    }
}
