// FlashAttention backward (the paper's Algorithm 4 with FlashAttention-2's D pre-pass and dQ atomics):
// CUDA cores, or tensor cores (mma.sync: fb_p_ds_mma, fb_dk_dv_mma, and tiles.cuh's pv_tile_mma for dQ) for
// float16 / bfloat16 with d a multiple of 16.
// Block j owns K_j, V_j and the dK_j, dV_j accumulators in shared memory; the loop over Q blocks i recomputes
// P from lse, so no N_q x N_k matrix ever touches HBM.
//
// Grid (Tc, 1, BH), THREADS threads, SMEM_BYTES of dynamic shared memory at the plan's SMEM_* offsets.
// Bytes per (batch, head): K, V N_k·d; Q, dO N_q·d·Tc; lse, D N_q·Tc read; dQacc N_q·d·Tc read and
// written (one float atomic per element per i); dK, dV N_k·d written.
//
// The five products run on register micro-tiles whose shapes are chosen at compile time from
// BR, BC and HEAD_D (fb_pick_tiling), so any tile the plan produces works, from 1x1 up.
// Global base pointers must be 16-byte aligned (tiles move as 16-byte vectors).
//
// CAUSAL (causal plans; common.cuh): P = 0 where masked (so dS = 0 there); Q blocks whose pair with
// K_j is all masked are skipped, loads and dQ atomics included; a K/V block that no query sees loads
// nothing and writes dK_j = dV_j = 0. Rows with no visible key (lse = −inf) are masked everywhere.
// BLOCK_SPARSE (block-sparse plans; common.cuh): Q blocks whose block-mask byte with K_j is 0 are skipped
// the same way; K_j, V_j are loaded at the first computed pair (none: dK_j = dV_j = 0, nothing else loaded).
// MASK (explicit masks; common.cuh): each element of a computed pair reads its mask element once (before
// the causal test): P = 0 where it hides (boolean 0, additive −inf), else exp(τS + mask − lse).
// DROPOUT (dropout on P; common.cuh, iokernels/plan/dropout.py): each element's Z_ij = iok_dropout(bh, i, j) is
// regenerated from (seed, offset, batch·head, row, column), the forward's: dV_j += (Z ∘ P)ᵀ dO_i,
// dS = P ∘ (Z ∘ dP − D_i) (D = rowsum(dO ∘ O) of the dropped O, from the prep stage). No byte more or less.
#include "common.cuh"

#include "tiles.cuh"

#if !defined(HEAD_D) || !defined(BR) || !defined(BC) || !defined(THREADS) || !defined(SMEM_BYTES)
#error "HEAD_D, BR, BC, THREADS and SMEM_* come from the plan (iokernels.kernels.stages)"
#endif

static_assert(HEAD_D % 8 == 0 && BR >= 1 && BC >= 1, "d is a multiple of 8, tiles are positive");

// ---------------------------------------------------------------------------------------------
// Shared-memory layout: the plan's buffers, checked to be aligned, disjoint and inside SMEM_BYTES.

struct FbBuffer {
    long long offset, bytes;
};

__host__ __device__ constexpr bool fb_layout_ok(const FbBuffer* b, int n, long long total)
{
    for (int i = 0; i < n; ++i) {
        if (b[i].offset % 16 != 0 || b[i].offset + b[i].bytes > total) return false;
        for (int j = 0; j < i; ++j) {
            if (b[i].offset < b[j].offset + b[j].bytes && b[j].offset < b[i].offset + b[i].bytes) return false;
        }
    }
    return true;
}

template <typename T>
__host__ __device__ constexpr bool fb_layout_fits()
{
    constexpr long long tile_k = static_cast<long long>(BC) * HEAD_D, tile_q = static_cast<long long>(BR) * HEAD_D;
    constexpr long long e = sizeof(T), f = sizeof(float);
    const FbBuffer b[] = {{SMEM_K, tile_k * e},  {SMEM_V, tile_k * e},  {SMEM_DK, tile_k * f},
                          {SMEM_DV, tile_k * f}, {SMEM_Q, tile_q * e},  {SMEM_DO, tile_q * e},
                          {SMEM_P, BR * BC * f}, {SMEM_DS, BR * BC * f}, {SMEM_LSE, BR * f},
                          {SMEM_D, BR * f}};
    return fb_layout_ok(b, sizeof(b) / sizeof(b[0]), SMEM_BYTES);
}

// ---------------------------------------------------------------------------------------------
// Micro-tiles. An M x N output (N in units: scalars or 16-byte vectors of d) is covered by a gm x gn
// grid of threads (gm * gn = THREADS), each owning tm x tn units strided by gm and gn (strides keep
// neighbouring threads on neighbouring shared-memory words), in pm x pn passes.

struct FbTiling {
    int gm, gn, tm, tn, pm, pn;
};

__host__ __device__ constexpr int fb_cdiv(int a, int b) { return (a + b - 1) / b; }

// Cheapest tiling by a per-thread cost model: passes x (reduction length x (FMAs + weighted
// shared-memory loads) + epilogue). Loads weigh more than FMAs (an SM issues ~4 FMA warp-instructions
// per shared-memory wavefront), so larger micro-tiles win until padding waste or max_acc accumulators
// (the register bound that keeps d = 256 from spilling) stop them.
//   red: reduction steps; nprod: products sharing the tiling; acc_unit / fma_unit: accumulators and
//   FMAs per unit per product per step; load_m / load_n: cost of the loads per row / column per step;
//   epi: epilogue cost per accumulator.
__host__ __device__ constexpr FbTiling fb_pick_tiling(int m, int n, int red, int nprod, int acc_unit, int fma_unit,
                                                      int load_m, int load_n, int epi, int max_acc)
{
    FbTiling best{1, THREADS, 1, 1, m, fb_cdiv(n, THREADS)};
    long long best_cost = -1;
    int best_acc = 0;
    for (int gm = 1; gm <= THREADS; gm *= 2) {
        if (THREADS % gm != 0) continue;
        const int gn = THREADS / gm;
        for (int tm = 1; tm <= 8; ++tm) {
            for (int tn = 1; tn <= 8; ++tn) {
                const int acc = tm * tn * acc_unit * nprod;
                if (acc > max_acc) continue;
                const int pm = fb_cdiv(m, gm * tm), pn = fb_cdiv(n, gn * tn);
                const long long step = static_cast<long long>(tm) * tn * fma_unit * nprod + tm * load_m + tn * load_n;
                const long long cost = static_cast<long long>(pm) * pn * (red * step + epi * acc);
                if (best_cost < 0 || cost < best_cost || (cost == best_cost && acc < best_acc)) {
                    best = FbTiling{gm, gn, tm, tn, pm, pn};
                    best_cost = cost;
                    best_acc = acc;
                }
            }
        }
    }
    return best;
}

// Enumerators and constexpr functions rather than static data members, so no device variable is emitted.
template <typename T>
struct FbConfig {
    enum : int {
        VEC = 16 / static_cast<int>(sizeof(T)),  // elements of T in a 16-byte vector
        NKV = HEAD_D / VEC,                      // 16-byte vectors per row of d
        CVT = sizeof(T) < 4 ? VEC : 0,           // conversions to float per vector
        LDV = 8 + CVT,                           // cost of one vector load and its conversions
    };
    // S = QKᵀ and dP = dO Vᵀ: BR x BC scalars, reduced over NKV vectors of d; 2 x 16 accumulators at most.
    __host__ __device__ static constexpr FbTiling s()
    {
        return fb_pick_tiling(BR, BC, NKV, 2, 1, VEC, 2 * LDV, 2 * LDV, 20, 32);
    }
    // dV += Pᵀ dO and dK += dSᵀ Q: BC scalars x NKV vectors, reduced over BR rows.
    __host__ __device__ static constexpr FbTiling kv()
    {
        return fb_pick_tiling(BC, NKV, BR, 2, VEC, VEC, 8, 2 * LDV, 8, 64);
    }
    // dQ += dS K: BR scalars x NKV vectors, reduced over BC columns.
    __host__ __device__ static constexpr FbTiling qd()
    {
        return fb_pick_tiling(BR, NKV, BC, 1, VEC, VEC, 4, LDV, 8, 64);
    }
};

// ---------------------------------------------------------------------------------------------
// 16-byte vectors of T <-> float. Indices are compile-time after unrolling, so nothing hits local memory.

template <typename A, typename B> struct fb_same { enum : bool { value = false }; };
template <typename A> struct fb_same<A, A> { enum : bool { value = true }; };

__device__ __forceinline__ unsigned fb_word(const uint4& u, int w)
{
    return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

template <typename T>
__device__ __forceinline__ float fb_elem(const uint4& u, int e)
{
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(fb_word(u, e));
    } else {
        const unsigned w = fb_word(u, e >> 1);
        const unsigned bits = (e & 1) ? w >> 16 : w & 0xffffu;
        if constexpr (fb_same<T, __half>::value) {
            return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
        } else {
            return __uint_as_float(bits << 16);  // a bfloat16 is the top half of a float
        }
    }
}

template <typename T>
__device__ __forceinline__ unsigned fb_bits(float x)
{
    if constexpr (fb_same<T, __half>::value) {
        return __half_as_ushort(__float2half_rn(x));
    } else {
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    }
}

// Rounds VEC floats to one 16-byte vector of T.
template <typename T>
__device__ __forceinline__ uint4 fb_pack(const float* f)
{
    if constexpr (sizeof(T) == 4) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    } else {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = fb_bits<T>(f[2 * i]) | (fb_bits<T>(f[2 * i + 1]) << 16);
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// ---------------------------------------------------------------------------------------------
// The phases of one (i, j) step. rows = in-range rows of Q_i, cols = in-range rows of K_j; shared-memory
// rows past them were never loaded, so every read index is clamped into range and every write masked.

// P and τdS of element (r, c) from its S and dP sums: P = exp(τS − lse_r) (0 where masked), stored with
// τ P∘(dP − D_r); DROPOUT: Z∘P and τ P∘(Z∘dP − D_r). τS − lse <= 0 up to rounding (lse is the row's
// log-sum-exp), so exp never overflows.
#ifdef CAUSAL
#define FB_DIAG , diag
#define FB_DIAG_PARAM , int diag  // element (r, c) is masked iff c > r + diag
#else
#define FB_DIAG
#define FB_DIAG_PARAM
#endif
template <typename MaskFn, typename DropFn>
__device__ __forceinline__ void fb_finish(int r, int c, float s, float dp, const float* lse, const float* dd, float* p,
                                          float* ds, float scale, MaskFn mask_fn, DropFn drop_fn FB_DIAG_PARAM)
{
    const float lse_r = lse[r], d_r = dd[r];
#if defined(MASK)
    const float x = mask_fn(r, c, scale * s);  // −inf where the mask hides
#ifdef CAUSAL
    const float pv = c > r + diag || x == iok_neg_inf() ? 0.0f : expf(x - lse_r);
#else
    const float pv = x == iok_neg_inf() ? 0.0f : expf(x - lse_r);
#endif
#elif defined(CAUSAL)
    (void)mask_fn;
    const float pv = c > r + diag ? 0.0f : expf(fmaf(scale, s, -lse_r));
#else
    (void)mask_fn;
    const float pv = expf(fmaf(scale, s, -lse_r));
#endif
#ifdef DROPOUT
    const float z = drop_fn(r, c);
    p[r * BC + c] = z * pv;
    ds[r * BC + c] = scale * pv * (z * dp - d_r);
#else
    (void)drop_fn;
    p[r * BC + c] = pv;
    ds[r * BC + c] = scale * pv * (dp - d_r);
#endif
}

// S = Q_i K_jᵀ, dP = dO_i V_jᵀ; P = exp(τS − lse_i); dS = P∘(dP − D_i). Stores P and τ·dS (τ rides
// along into both dQ and dK); DROPOUT: Z∘P and τ P∘(Z∘dP − D_i). Reduction over d in 16-byte vectors;
// each thread starts at its own vector (rot) so the rows a warp reads in one step fall in different banks.
template <typename T, typename MaskFn, typename DropFn>
__device__ __forceinline__ void fb_p_ds(const uint4* q, const uint4* d_o, const uint4* k, const uint4* v,
                                        const float* lse, const float* dd, float* p, float* ds, int rows,
                                        int cols, float scale,
                                        MaskFn mask_fn,  // (r, c, τS) -> τS with the explicit mask (MASK)
                                        DropFn drop_fn   // (r, c) -> Z of the element (DROPOUT)
                                        FB_DIAG_PARAM)
{
    using C = FbConfig<T>;
    constexpr FbTiling t = C::s();
    const int tid = threadIdx.x;
    const int gr = tid / t.gn, gc = tid % t.gn;
    const int rot = tid % C::NKV;
    for (int pr = 0; pr < t.pm; ++pr) {
        const int r0 = pr * t.gm * t.tm + gr;
        if (r0 >= rows) break;
        for (int pc = 0; pc < t.pn; ++pc) {
            const int c0 = pc * t.gn * t.tn + gc;
            if (c0 >= cols) break;
            int qrow[t.tm], krow[t.tn];  // in vectors
#pragma unroll
            for (int a = 0; a < t.tm; ++a) qrow[a] = min(r0 + a * t.gm, rows - 1) * C::NKV;
#pragma unroll
            for (int b = 0; b < t.tn; ++b) krow[b] = min(c0 + b * t.gn, cols - 1) * C::NKV;
            float s[t.tm][t.tn] = {}, dp[t.tm][t.tn] = {};
            int kv = rot;
#pragma unroll 1
            for (int step = 0; step < C::NKV; ++step) {
                // S += Q_i[:, kv] K_j[:, kv]ᵀ
                {
                    uint4 qa[t.tm], kb[t.tn];
#pragma unroll
                    for (int a = 0; a < t.tm; ++a) qa[a] = q[qrow[a] + kv];
#pragma unroll
                    for (int b = 0; b < t.tn; ++b) kb[b] = k[krow[b] + kv];
#pragma unroll
                    for (int e = 0; e < C::VEC; ++e) {
                        float kf[t.tn];
#pragma unroll
                        for (int b = 0; b < t.tn; ++b) kf[b] = fb_elem<T>(kb[b], e);
#pragma unroll
                        for (int a = 0; a < t.tm; ++a) {
                            const float qf = fb_elem<T>(qa[a], e);
#pragma unroll
                            for (int b = 0; b < t.tn; ++b) s[a][b] = fmaf(qf, kf[b], s[a][b]);
                        }
                    }
                }
                // dP += dO_i[:, kv] V_j[:, kv]ᵀ
                {
                    uint4 oa[t.tm], vb[t.tn];
#pragma unroll
                    for (int a = 0; a < t.tm; ++a) oa[a] = d_o[qrow[a] + kv];
#pragma unroll
                    for (int b = 0; b < t.tn; ++b) vb[b] = v[krow[b] + kv];
#pragma unroll
                    for (int e = 0; e < C::VEC; ++e) {
                        float vf[t.tn];
#pragma unroll
                        for (int b = 0; b < t.tn; ++b) vf[b] = fb_elem<T>(vb[b], e);
#pragma unroll
                        for (int a = 0; a < t.tm; ++a) {
                            const float of = fb_elem<T>(oa[a], e);
#pragma unroll
                            for (int b = 0; b < t.tn; ++b) dp[a][b] = fmaf(of, vf[b], dp[a][b]);
                        }
                    }
                }
                kv = kv + 1 == C::NKV ? 0 : kv + 1;
            }
            // τS − lse <= 0 up to rounding (lse is the row's log-sum-exp), so exp never overflows.
#pragma unroll
            for (int a = 0; a < t.tm; ++a) {
                const int r = r0 + a * t.gm;
                if (r >= rows) break;
#pragma unroll
                for (int b = 0; b < t.tn; ++b) {
                    const int c = c0 + b * t.gn;
                    if (c >= cols) break;
                    fb_finish(r, c, s[a][b], dp[a][b], lse, dd, p, ds, scale, mask_fn, drop_fn FB_DIAG);
                }
            }
        }
    }
}

// dV_j += Pᵀ dO_i, dK_j += (τdS)ᵀ Q_i. Each thread owns tm rows x tn vectors of dK_j and dV_j (the same
// ones every i), so its read-modify-write of the shared accumulators needs no barrier.
template <typename T>
__device__ __forceinline__ void fb_dk_dv(const uint4* q, const uint4* d_o, const float* p, const float* ds,
                                         float* dk, float* dv, int rows, int cols)
{
    using C = FbConfig<T>;
    constexpr FbTiling t = C::kv();
    const int tid = threadIdx.x;
    const int gc = tid / t.gn, gk = tid % t.gn;
    for (int pc = 0; pc < t.pm; ++pc) {
        const int c0 = pc * t.gm * t.tm + gc;
        if (c0 >= cols) break;
        for (int pk = 0; pk < t.pn; ++pk) {
            const int k0 = pk * t.gn * t.tn + gk;
            if (k0 >= C::NKV) break;
            int col[t.tm], kvec[t.tn];
#pragma unroll
            for (int a = 0; a < t.tm; ++a) col[a] = min(c0 + a * t.gm, cols - 1);
#pragma unroll
            for (int b = 0; b < t.tn; ++b) kvec[b] = min(k0 + b * t.gn, C::NKV - 1);
            float acc_v[t.tm][t.tn][C::VEC] = {}, acc_k[t.tm][t.tn][C::VEC] = {};
#pragma unroll 2
            for (int r = 0; r < rows; ++r) {
                float pa[t.tm], dsa[t.tm];
#pragma unroll
                for (int a = 0; a < t.tm; ++a) {
                    pa[a] = p[r * BC + col[a]];
                    dsa[a] = ds[r * BC + col[a]];
                }
#pragma unroll
                for (int b = 0; b < t.tn; ++b) {
                    const uint4 ob = d_o[r * C::NKV + kvec[b]], qb = q[r * C::NKV + kvec[b]];
#pragma unroll
                    for (int e = 0; e < C::VEC; ++e) {
                        const float of = fb_elem<T>(ob, e), qf = fb_elem<T>(qb, e);
#pragma unroll
                        for (int a = 0; a < t.tm; ++a) {
                            acc_v[a][b][e] = fmaf(pa[a], of, acc_v[a][b][e]);
                            acc_k[a][b][e] = fmaf(dsa[a], qf, acc_k[a][b][e]);
                        }
                    }
                }
            }
#pragma unroll
            for (int a = 0; a < t.tm; ++a) {
                if (c0 + a * t.gm >= cols) break;
#pragma unroll
                for (int b = 0; b < t.tn; ++b) {
                    if (k0 + b * t.gn >= C::NKV) break;
                    float4* vv = reinterpret_cast<float4*>(dv + (col[a] * C::NKV + kvec[b]) * C::VEC);
                    float4* kk = reinterpret_cast<float4*>(dk + (col[a] * C::NKV + kvec[b]) * C::VEC);
#pragma unroll
                    for (int h = 0; h < C::VEC / 4; ++h) {
                        float4 x = vv[h], y = kk[h];
                        x.x += acc_v[a][b][4 * h];
                        x.y += acc_v[a][b][4 * h + 1];
                        x.z += acc_v[a][b][4 * h + 2];
                        x.w += acc_v[a][b][4 * h + 3];
                        y.x += acc_k[a][b][4 * h];
                        y.y += acc_k[a][b][4 * h + 1];
                        y.z += acc_k[a][b][4 * h + 2];
                        y.w += acc_k[a][b][4 * h + 3];
                        vv[h] = x;
                        kk[h] = y;
                    }
                }
            }
        }
    }
}

// dQacc_i += (τdS) K_j: one float atomic per in-range element (other blocks j add to the same rows).
template <typename T, typename Counters>
__device__ __forceinline__ void fb_dq(Counters& cnt, const uint4* k, const float* ds, float* dqacc, int rows,
                                      int cols)
{
    using C = FbConfig<T>;
    constexpr FbTiling t = C::qd();
    const int tid = threadIdx.x;
    const int gr = tid / t.gn, gk = tid % t.gn;
    for (int pr = 0; pr < t.pm; ++pr) {
        const int r0 = pr * t.gm * t.tm + gr;
        if (r0 >= rows) break;
        for (int pk = 0; pk < t.pn; ++pk) {
            const int k0 = pk * t.gn * t.tn + gk;
            if (k0 >= C::NKV) break;
            int row[t.tm], kvec[t.tn];
#pragma unroll
            for (int a = 0; a < t.tm; ++a) row[a] = min(r0 + a * t.gm, rows - 1) * BC;
#pragma unroll
            for (int b = 0; b < t.tn; ++b) kvec[b] = min(k0 + b * t.gn, C::NKV - 1);
            float acc[t.tm][t.tn][C::VEC] = {};
#pragma unroll 2
            for (int c = 0; c < cols; ++c) {
                float dsa[t.tm];
#pragma unroll
                for (int a = 0; a < t.tm; ++a) dsa[a] = ds[row[a] + c];
#pragma unroll
                for (int b = 0; b < t.tn; ++b) {
                    const uint4 kb = k[c * C::NKV + kvec[b]];
#pragma unroll
                    for (int e = 0; e < C::VEC; ++e) {
                        const float kf = fb_elem<T>(kb, e);
#pragma unroll
                        for (int a = 0; a < t.tm; ++a) acc[a][b][e] = fmaf(dsa[a], kf, acc[a][b][e]);
                    }
                }
            }
#pragma unroll
            for (int a = 0; a < t.tm; ++a) {
                const int r = r0 + a * t.gm;
                if (r >= rows) break;
#pragma unroll
                for (int b = 0; b < t.tn; ++b) {
                    if (k0 + b * t.gn >= C::NKV) break;
                    float* dst = dqacc + static_cast<size_t>(r) * HEAD_D + kvec[b] * C::VEC;
#pragma unroll
                    for (int e = 0; e < C::VEC; ++e) iok_atomic_add<IOK_T_dQacc>(cnt, dst + e, acc[a][b][e]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The same three phases on tensor cores, where MMA_TILES<T> (tiles.cuh: float16 / bfloat16, HEAD_D % 16 == 0,
// sm_80 and newer): mma.sync m16n8k16 with float32 accumulators, fragments read from the same shared-memory
// tiles (Q, dO, K, V row-major in d; P, dS row stride BC); each warp takes 16-row strips of up to NT 8-column
// tiles. P and τdS are rounded to T for their products, as in every FlashAttention backward. Rows and columns
// past the last whole 16 (8 for S's columns) are summed on CUDA cores. Loads and stores are the same, so are
// the counted bytes; each dQacc element still gets one atomic per (i, j).

// Elements (row, k) and (row, k + 1) of a row-major tile of T (k even) as one register.
template <typename T>
__device__ __forceinline__ unsigned fb_pair(const uint4* tile, int row, int k)
{
    return reinterpret_cast<const unsigned*>(tile)[(row * HEAD_D + k) / 2];
}

template <typename T, typename MaskFn, typename DropFn>
__device__ __forceinline__ void fb_p_ds_mma(const uint4* q, const uint4* d_o, const uint4* k, const uint4* v,
                                            const float* lse, const float* dd, float* p, float* ds, int rows,
                                            int cols, float scale, MaskFn mask_fn, DropFn drop_fn FB_DIAG_PARAM)
{
    constexpr int NT = mma_nt(BR / 16, BC / 8);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows16 = rows / 16 * 16, cols8 = cols / 8 * 8;
    const int groups = (cols8 / 8 + NT - 1) / NT, strips = rows16 / 16 * groups;
    for (int strip = warp; strip < strips; strip += NWARPS) {
        const int r0 = strip / groups * 16, c0 = strip % groups * 8 * NT;
        float sa[NT][4] = {}, dpa[NT][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < HEAD_D; k0 += 16) {
            const int kk = k0 + 2 * t;
            const unsigned a[4] = {fb_pair<T>(q, r0 + g, kk), fb_pair<T>(q, r0 + g + 8, kk), fb_pair<T>(q, r0 + g, kk + 8),
                                   fb_pair<T>(q, r0 + g + 8, kk + 8)};
            const unsigned o[4] = {fb_pair<T>(d_o, r0 + g, kk), fb_pair<T>(d_o, r0 + g + 8, kk),
                                   fb_pair<T>(d_o, r0 + g, kk + 8), fb_pair<T>(d_o, r0 + g + 8, kk + 8)};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int c = c0 + 8 * j + g;
                if (c0 + 8 * j < cols8) {
                    tc_mma<T>(sa[j], a, fb_pair<T>(k, c, kk), fb_pair<T>(k, c, kk + 8));
                    tc_mma<T>(dpa[j], o, fb_pair<T>(v, c, kk), fb_pair<T>(v, c, kk + 8));
                }
            }
        }
        // the raw sums through P and dS, then the epilogue row by row with lanes along the columns (MASK
        // reads of HBM coalesced as on CUDA cores)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (c0 + 8 * j < cols8) {
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const int x = (r0 + g + 8 * (h / 2)) * BC + c0 + 8 * j + 2 * t + h % 2;
                    p[x] = sa[j][h];
                    ds[x] = dpa[j][h];
                }
            }
        }
        __syncwarp();
        const int width = min(8 * NT, cols8 - c0);
        for (int i = lane; i < 16 * width; i += 32) {
            const int r = r0 + i / width, c = c0 + i % width;
            fb_finish(r, c, p[r * BC + c], ds[r * BC + c], lse, dd, p, ds, scale, mask_fn, drop_fn FB_DIAG);
        }
    }
    // the ragged rest: rows [rows16, rows) x [0, cols), then rows [0, rows16) x [cols8, cols)
    const T* qe = reinterpret_cast<const T*>(q);
    const T* oe = reinterpret_cast<const T*>(d_o);
    const T* ke = reinterpret_cast<const T*>(k);
    const T* ve = reinterpret_cast<const T*>(v);
    const int tail_rows = (rows - rows16) * cols, tail_cols = cols - cols8;
    for (int i = threadIdx.x; i < tail_rows + rows16 * tail_cols; i += THREADS) {
        const int r = i < tail_rows ? rows16 + i / cols : (i - tail_rows) / tail_cols;
        const int c = i < tail_rows ? i % cols : cols8 + (i - tail_rows) % tail_cols;
        float sx = 0.0f, dx = 0.0f;
        for (int kk = 0; kk < HEAD_D; ++kk) {
            sx = fmaf(to_f(qe[r * HEAD_D + kk]), to_f(ke[c * HEAD_D + kk]), sx);
            dx = fmaf(to_f(oe[r * HEAD_D + kk]), to_f(ve[c * HEAD_D + kk]), dx);
        }
        fb_finish(r, c, sx, dx, lse, dd, p, ds, scale, mask_fn, drop_fn FB_DIAG);
    }
}

// dV_j += Pᵀ dO_i, dK_j += (τdS)ᵀ Q_i: strips of 16 keys x up to NT 8-column tiles of d, reduced over the rows
// of Q_i. Each (key, column) belongs to one thread, the same every i: no barrier on the accumulators.
template <typename T>
__device__ __forceinline__ void fb_dk_dv_mma(const uint4* q, const uint4* d_o, const float* p, const float* ds,
                                             float* dk, float* dv, int rows, int cols)
{
    constexpr int NT = mma_nt(BC / 16, HEAD_D / 8);
    constexpr int GROUPS = (HEAD_D / 8 + NT - 1) / NT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows16 = rows / 16 * 16, cols16 = cols / 16 * 16;
    const T* qe = reinterpret_cast<const T*>(q);
    const T* oe = reinterpret_cast<const T*>(d_o);
    for (int strip = warp; strip < cols16 / 16 * GROUPS; strip += NWARPS) {
        const int c0 = strip / GROUPS * 16, n0 = strip % GROUPS * 8 * NT;
        float av[NT][4] = {}, ak[NT][4] = {};
        for (int r0 = 0; r0 < rows16; r0 += 16) {
            const float* pp = p + (r0 + 2 * t) * BC + c0 + g;  // Pᵀ[c0 + g][r0 + 2t]
            const float* dd = ds + (r0 + 2 * t) * BC + c0 + g;
            const unsigned ap[4] = {tc_pack<T>(pp[0], pp[BC]), tc_pack<T>(pp[8], pp[BC + 8]),
                                    tc_pack<T>(pp[8 * BC], pp[9 * BC]), tc_pack<T>(pp[8 * BC + 8], pp[9 * BC + 8])};
            const unsigned ad[4] = {tc_pack<T>(dd[0], dd[BC]), tc_pack<T>(dd[8], dd[BC + 8]),
                                    tc_pack<T>(dd[8 * BC], dd[9 * BC]), tc_pack<T>(dd[8 * BC + 8], dd[9 * BC + 8])};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (n0 + 8 * j < HEAD_D) {
                    const int x = (r0 + 2 * t) * HEAD_D + n0 + 8 * j + g;  // dO[r0 + 2t][n], Q[r0 + 2t][n]
                    tc_mma<T>(av[j], ap, mma_pair(oe + x, HEAD_D), mma_pair(oe + x + 8 * HEAD_D, HEAD_D));
                    tc_mma<T>(ak[j], ad, mma_pair(qe + x, HEAD_D), mma_pair(qe + x + 8 * HEAD_D, HEAD_D));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (n0 + 8 * j < HEAD_D) {
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const int c = c0 + g + 8 * (h / 2), n = n0 + 8 * j + 2 * t + h % 2;
                    float xv = av[j][h], xk = ak[j][h];
                    for (int r = rows16; r < rows; ++r) {
                        xv = fmaf(p[r * BC + c], to_f(oe[r * HEAD_D + n]), xv);
                        xk = fmaf(ds[r * BC + c], to_f(qe[r * HEAD_D + n]), xk);
                    }
                    dv[c * HEAD_D + n] += xv;
                    dk[c * HEAD_D + n] += xk;
                }
            }
        }
    }
    // keys [cols16, cols) on CUDA cores
    for (int i = threadIdx.x; i < (cols - cols16) * HEAD_D; i += THREADS) {
        const int c = cols16 + i / HEAD_D, n = i % HEAD_D;
        float xv = 0.0f, xk = 0.0f;
        for (int r = 0; r < rows; ++r) {
            xv = fmaf(p[r * BC + c], to_f(oe[r * HEAD_D + n]), xv);
            xk = fmaf(ds[r * BC + c], to_f(qe[r * HEAD_D + n]), xk);
        }
        dv[c * HEAD_D + n] += xv;
        dk[c * HEAD_D + n] += xk;
    }
}

// K_j, V_j (cols rows from 16-byte vector kv_base on) -> SRAM, each element once.
template <typename T, typename Counters>
__device__ __forceinline__ void fb_load_kv(Counters& cnt, uint4* k_s, uint4* v_s, const T* k, const T* v,
                                           size_t kv_base, int cols)
{
    for (int x = threadIdx.x; x < cols * FbConfig<T>::NKV; x += THREADS) {
        k_s[x] = iok_ld<IOK_T_K>(cnt, reinterpret_cast<const uint4*>(k) + kv_base + x);
        v_s[x] = iok_ld<IOK_T_V>(cnt, reinterpret_cast<const uint4*>(v) + kv_base + x);
    }
}

// ---------------------------------------------------------------------------------------------

template <typename T>
__global__ void
flash_bwd_kv_outer(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const T* __restrict__ d_o, const float* __restrict__ lse, const float* __restrict__ dd,
                   float* __restrict__ dqacc, T* __restrict__ dk, T* __restrict__ dv, int n_q, int n_k,
                   float scale, IOK_BLOCK_MASK_PARAM IOK_MASK_PARAM IOK_DROPOUT_PARAM
                   unsigned long long* __restrict__ iok_counters)
{
    static_assert(fb_layout_fits<T>(), "the plan's buffers must be 16-byte aligned, disjoint, within SMEM_BYTES");
    using C = FbConfig<T>;
    extern __shared__ __align__(16) unsigned char smem[];
    uint4* k_s = reinterpret_cast<uint4*>(smem + SMEM_K);
    uint4* v_s = reinterpret_cast<uint4*>(smem + SMEM_V);
    float* dk_s = reinterpret_cast<float*>(smem + SMEM_DK);
    float* dv_s = reinterpret_cast<float*>(smem + SMEM_DV);
    uint4* q_s = reinterpret_cast<uint4*>(smem + SMEM_Q);
    uint4* do_s = reinterpret_cast<uint4*>(smem + SMEM_DO);
    float* p_s = reinterpret_cast<float*>(smem + SMEM_P);
    float* ds_s = reinterpret_cast<float*>(smem + SMEM_DS);
    float* lse_s = reinterpret_cast<float*>(smem + SMEM_LSE);
    float* d_s = reinterpret_cast<float*>(smem + SMEM_D);
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_dO, IOK_T_lse, IOK_T_D, IOK_T_dQacc, IOK_T_dK,
                IOK_T_dV IOK_BLOCK_MASK_T IOK_MASK_T> c;

    const int tid = threadIdx.x;
    const size_t bh = blockIdx.z;
    const int col0 = blockIdx.x * BC;
    const int cols = min(BC, n_k - col0);  // the last K/V block is ragged
    const int tr = (n_q + BR - 1) / BR;
    const size_t kv_base = (bh * n_k + col0) * C::NKV;  // in 16-byte vectors
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
    if (col0 > n_q - 1 + off) {  // no query sees K_j: dK_j = dV_j = 0, nothing loaded
        for (int x = tid; x < cols * C::NKV; x += THREADS) {
            iok_st<IOK_T_dK>(c, reinterpret_cast<uint4*>(dk) + kv_base + x, make_uint4(0u, 0u, 0u, 0u));
            iok_st<IOK_T_dV>(c, reinterpret_cast<uint4*>(dv) + kv_base + x, make_uint4(0u, 0u, 0u, 0u));
        }
        iok_flush(c, iok_counters);
        return;
    }
#endif

    // K_j, V_j -> SRAM once (in-range rows only; BLOCK_SPARSE: at the first computed pair); dK_j = dV_j = 0.
#ifdef BLOCK_SPARSE
    const int tc = (n_k + BC - 1) / BC;
    bool kv_loaded = false;
#else
    fb_load_kv(c, k_s, v_s, k, v, kv_base, cols);
#endif
    for (int x = tid; x < cols * HEAD_D / 4; x += THREADS) {
        reinterpret_cast<float4*>(dk_s)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
        reinterpret_cast<float4*>(dv_s)[x] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    for (int i = 0; i < tr; ++i) {
        const int row0 = i * BR;
        const int rows = min(BR, n_q - row0);  // the last Q block is ragged
#ifdef CAUSAL
        // every element of the pair is masked (the same for the whole block); the last Q block always
        // sees K_j, so the loop still ends at the barrier the final stores wait for
        if (col0 > row0 + rows - 1 + off) continue;
#endif
#ifdef BLOCK_SPARSE
        // a zero block of the mask (its barrier also ends the previous pair's work, like the one below)
        if (!iok_block_kept(c, block_mask, i, blockIdx.x, tc)) continue;
        if (!kv_loaded) {
            fb_load_kv(c, k_s, v_s, k, v, kv_base, cols);
            kv_loaded = true;
        }
#endif
        const size_t q_row = bh * n_q + row0;

        // Q_i, dO_i, lse_i, D_i -> SRAM, each element once; one thread per row scalar.
        for (int x = tid; x < rows * C::NKV; x += THREADS) {
            q_s[x] = iok_ld<IOK_T_Q>(c, reinterpret_cast<const uint4*>(q) + q_row * C::NKV + x);
            do_s[x] = iok_ld<IOK_T_dO>(c, reinterpret_cast<const uint4*>(d_o) + q_row * C::NKV + x);
        }
        if (tid < rows) {
            lse_s[tid] = iok_ld<IOK_T_lse>(c, lse + q_row + tid);
            d_s[tid] = iok_ld<IOK_T_D>(c, dd + q_row + tid);
        }
        __syncthreads();  // Q_i, dO_i, lse_i, D_i (and at i = 0 K_j, V_j, zeroed dK_j, dV_j) are read by all

#ifdef MASK
        const iok_mask_t* mask_ij = iok_mask_rows(mask, bh, n_q, n_k) + static_cast<size_t>(row0) * n_k + col0;
        const auto mask_fn = [&](int r, int cc, float x) {
            return iok_apply_mask(c, mask_ij + static_cast<size_t>(r) * n_k + cc, x);
        };
#else
        const auto mask_fn = [](int, int, float x) { return x; };
#endif
#ifdef DROPOUT
        const auto drop_fn = [&](int r, int cc) {
            return iok_dropout(dropout_threshold, dropout_scale, dropout_seed, dropout_offset,
                               static_cast<unsigned int>(bh), row0 + r, col0 + cc);
        };
#else
        const auto drop_fn = [](int, int) { return 1.0f; };
#endif
#ifdef CAUSAL
        const int diag = row0 + off - col0;
#endif
        if constexpr (MMA_TILES<T>) {
            fb_p_ds_mma<T>(q_s, do_s, k_s, v_s, lse_s, d_s, p_s, ds_s, rows, cols, scale, mask_fn, drop_fn FB_DIAG);
        } else {
            fb_p_ds<T>(q_s, do_s, k_s, v_s, lse_s, d_s, p_s, ds_s, rows, cols, scale, mask_fn, drop_fn FB_DIAG);
        }
        __syncthreads();  // P and τdS are reduced over rows and columns that other threads computed

        if constexpr (MMA_TILES<T>) {
            fb_dk_dv_mma<T>(q_s, do_s, p_s, ds_s, dk_s, dv_s, rows, cols);
            // dQacc_i += (τdS) K_j: the product of tiles.cuh's PV (float rows of stride BC times rows of T),
            // one float atomic per in-range element, as on CUDA cores
            float* dq_i = dqacc + q_row * HEAD_D;
            pv_tile_mma(ds_s, reinterpret_cast<const T*>(k_s), rows, cols, [&](int r, int n, float x) {
                iok_atomic_add<IOK_T_dQacc>(c, dq_i + static_cast<size_t>(r) * HEAD_D + n, x);
            });
        } else {
            fb_dk_dv<T>(q_s, do_s, p_s, ds_s, dk_s, dv_s, rows, cols);
            fb_dq<T>(c, k_s, ds_s, dqacc + q_row * HEAD_D, rows, cols);
        }
        __syncthreads();  // the next i overwrites Q_i, dO_i, P, dS; after the last, dK_j, dV_j are complete
    }

    // dK_j, dV_j -> HBM once, rounded to T (τ is already in dS).
    for (int x = tid; x < cols * C::NKV; x += THREADS) {
        iok_st<IOK_T_dK>(c, reinterpret_cast<uint4*>(dk) + kv_base + x, fb_pack<T>(dk_s + x * C::VEC));
        iok_st<IOK_T_dV>(c, reinterpret_cast<uint4*>(dv) + kv_base + x, fb_pack<T>(dv_s + x * C::VEC));
    }

    iok_flush(c, iok_counters);
}
