// Tensor-core FlashAttention backward for float16 / bfloat16 (docs/KERNELS.md, "flash_tc_bwd.cu";
// plans in iokernels/plan/fast_bwd.py). mma.sync m16n8k16 with float32 accumulators, ldmatrix, cp.async
// into XOR-swizzled shared memory (tc.cuh).
//
// flash_tc_bwd / flash_tc_bwd_dkdv (grid (ceil(N_k / BC), 1, BH), THREADS = 32 * BC / 16): the
// FlashAttention-2 K/V-outer loop of flash_bwd_kv_outer, so it moves exactly the bytes of that
// schedule's model with its own tiles. A block owns BC keys, a warp 16 of them, and keeps the warp's
// rows of dK_j and dV_j in float32 registers. K_j, V_j are loaded once; Q_i, dO_i, lse_i, D_i (BR query
// rows) stream through a two-stage cp.async pipeline. Per query block, each warp computes the
// transposed products, with its 16 keys as the mma M dimension:
//   Sᵀ = K_w Q_iᵀ, dPᵀ = V_w dO_iᵀ            (K_w, V_w by ldmatrix; Q_i, dO_i as B operands)
//   Pᵀ = exp2(Sᵀ τ log2e − lse log2e)         (keys past N_k: 0)
//   dSᵀ = Pᵀ ∘ (dPᵀ − D)
//   dV_w += Pᵀ dO_i, dK_w += dSᵀ Q_i           (Pᵀ, dSᵀ straight from the accumulators as A operands;
//                                              dO_i, Q_i by ldmatrix.trans)
// so P and dS never leave registers for dK and dV. flash_tc_bwd then stores dSᵀ (rounded to T) in
// shared memory, and the warps split dQ_i += τ dS K_j (BR x HEAD_D) among them (dS by ldmatrix.trans,
// K_j by ldmatrix.trans), adding it to dQacc with float32 reductions (red.global.add.v2.f32 on sm_90,
// two atomicAdd before), each counted as 4 bytes read and 4 written per float (DESIGN.md rule 4).
// dK (times τ) and dV are rounded and written once at the end. flash_tc_bwd_dkdv is the same kernel
// without dQ (the deterministic plan's K/V stage).
//
// flash_tc_bwd_dq (grid (ceil(N_q / BR), 1, BH), THREADS = 32 * BR / 16): the deterministic plan's
// query-outer dQ. A block owns BR query rows, a warp 16 of them. It loads Q_i, dO_i, O_i and lse_i once,
// computes D_i = rowsum(dO_i ∘ O_i) and writes it (for the dK/dV stage), then for every KV_BLOCK keys
// (K, V double-buffered) recomputes S, P, dP, dS in registers and accumulates dQ_i = τ dS K in
// registers; dQ_i is rounded and written once. No atomics: bit-identical results run to run.
//
// Rows past N_q or N_k are zero-filled in shared memory and never read or counted; their
// contributions vanish (zero rows of Q, dO, K, V; P of keys past N_k forced to 0), and nothing is
// stored for them.
//
// Which kernel a module holds follows the stage's buffers: SMEM_Q0 (the K/V-outer layout) with
// SMEM_DS0: flash_tc_bwd, without: flash_tc_bwd_dkdv; SMEM_O (the query-outer layout): flash_tc_bwd_dq.
#include "common.cuh"

#include "tiles.cuh"

#include "tc.cuh"

#include "bwd.cuh"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS) || !defined(SMEM_BYTES)
#error "flash_tc_bwd.cu needs BR, BC, HEAD_D, THREADS and SMEM_* from the plan"
#endif
static_assert(HEAD_D % 16 == 0, "16-wide mma steps along d");
static_assert(BR % 64 == 0, "dSᵀ rows of BR elements are at least 8 swizzled 16-byte chunks");
static_assert(BC % 16 == 0, "16 keys per warp");

// ---------------------------------------------------------------------------------------------
// Helpers of this file (the counted ones shared with flash_wgmma_bwd.cu are in bwd.cuh).

// Element offset of (row, chunk) in a swizzled tile of LEN-element rows (LEN / 8 >= 8 chunks).
template <int LEN>
__device__ __forceinline__ int ftb_off(int row, int chunk)
{
    static_assert(LEN % 64 == 0, "at least 8 chunks per row");
    return row * LEN + ((chunk ^ (row & 7)) << 3);
}

// One register of two T (as tc_pack makes it) -> two floats (low half first).
template <typename T>
__device__ __forceinline__ float2 ftb_unpack(unsigned w)
{
    return make_float2(to_f(from_bits<T>(static_cast<unsigned short>(w & 0xffffu))),
                       to_f(from_bits<T>(static_cast<unsigned short>(w >> 16))));
}

__device__ __forceinline__ void ftb_zero(float (&a)[4])
{
    a[0] = a[1] = a[2] = a[3] = 0.0f;
}

#ifndef FTB_ABT_UNROLL
#define FTB_ABT_UNROLL (HEAD_D <= 64 ? HEAD_D / 16 : 2)  // d = 128: bounded, for registers
#endif
// acc[n] (16 rows x 8 columns each, n < NT) += A_w Bᵀ, reduction over HEAD_D: A's 16 rows start at
// row a0 of the swizzled tile A (ldmatrix), B's rows (the output columns) are rows [0, 8 NT) of tile B.
template <typename T, int NT>
__device__ __forceinline__ void ftb_abt(float (&acc)[NT][4], const T* A, int a0, const T* B)
{
    static_assert(NT % 2 == 0, "pairs of 8-column tiles");
    const int lane = threadIdx.x & 31;
#pragma unroll FTB_ABT_UNROLL
    for (int kk = 0; kk < HEAD_D / 16; ++kk) {
        unsigned a[4];
        tc_ldmatrix_x4(a, A + tc_off(a0 + (lane & 7) + ((lane >> 3) & 1) * 8, kk * 2 + (lane >> 4)));
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            unsigned b[4];
            tc_ldmatrix_x4(b, B + tc_off(n * 8 + (lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
            tc_mma<T>(acc[n], a, b[0], b[1]);
            tc_mma<T>(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// acc[n] (16 rows x 8 of HEAD_D columns n) += A B, A in registers (16 x 16 KT fragments), B the first
// 16 KT rows of the swizzled tile B (ldmatrix.trans), columns [c0 * 8, (c0 + NT) * 8).
template <typename T, int KT, int NT>
__device__ __forceinline__ void ftb_ab(float (&acc)[NT][4], const unsigned (&a)[KT][4], const T* B, int c0)
{
    static_assert(NT % 2 == 0, "pairs of 8-column tiles");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            unsigned b[4];
            tc_ldmatrix_x4_trans(b, B + tc_off(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c0 + n + (lane >> 4)));
            tc_mma<T>(acc[n], a[kk], b[0], b[1]);
            tc_mma<T>(acc[n + 1], a[kk], b[2], b[3]);
        }
    }
}

// Accumulator tiles (16 x 8 each) as A fragments of the next product: two 8-column tiles make one
// 16-wide k step.
template <typename T, int NT>
__device__ __forceinline__ void ftb_pack(unsigned (&a)[NT / 2][4], const float (&acc)[NT][4])
{
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        a[kk][0] = tc_pack<T>(acc[2 * kk][0], acc[2 * kk][1]);
        a[kk][1] = tc_pack<T>(acc[2 * kk][2], acc[2 * kk][3]);
        a[kk][2] = tc_pack<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
        a[kk][3] = tc_pack<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
    }
}

// ---------------------------------------------------------------------------------------------
#if defined(SMEM_Q0)  // the K/V-outer kernels

static_assert(THREADS == 32 * (BC / 16), "a warp per 16 keys");
// Query blocks double-buffered (Q1, dO1, lse1, D1 in the layout) or not (less shared memory)
#if defined(SMEM_Q1)
#define FTB_STAGES 2
#define FTB_Q1 SMEM_Q1
#define FTB_DO1 SMEM_DO1
#define FTB_LSE1 SMEM_LSE1
#define FTB_D1 SMEM_D1
#else
#define FTB_STAGES 1
#define FTB_Q1 SMEM_Q0
#define FTB_DO1 SMEM_DO0
#define FTB_LSE1 SMEM_LSE0
#define FTB_D1 SMEM_D0
#endif
#if defined(SMEM_DS0)
#define FTB_DQ 1
// dSᵀ double-buffered (DS1 in the layout): block i's dQ is computed in step i + 1, after the barrier
// that step starts with anyway (one barrier per step); single: in step i, behind a barrier of its own
#if defined(SMEM_DS1)
#define FTB_DS_STAGES 2
#define FTB_DS1 SMEM_DS1
#else
#define FTB_DS_STAGES 1
#define FTB_DS1 SMEM_DS0
#endif
constexpr int FTB_WARPS = THREADS / 32;
// dQ_i (BR x HEAD_D) split among the warps: DQ_WM row groups of 16, DQ_WN column groups
constexpr int DQ_WM = BR / 16;
static_assert(FTB_WARPS % DQ_WM == 0, "whole column groups of warps for dQ");
constexpr int DQ_WN = FTB_WARPS / DQ_WM;
static_assert(HEAD_D % (16 * DQ_WN) == 0, "pairs of 8-column tiles per warp for dQ");
constexpr int DQ_NT = HEAD_D / (8 * DQ_WN);  // 8-column tiles per warp
constexpr int DQ_PASS_NT = DQ_NT < 8 ? DQ_NT : 8;  // ... per pass (at most 32 accumulators)
#else
#define FTB_DQ 0
#endif

template <typename T>
__device__ constexpr bool ftb_kv_layout_ok()
{
    constexpr size_t q = BR * HEAD_D * sizeof(T), kv = BC * HEAD_D * sizeof(T), row = BR * sizeof(float);
    // a single-stage layout has no stage-1 buffers: FTB_*1 name the stage-0 ones, listed with 0 bytes
    constexpr size_t q2 = FTB_STAGES == 2 ? q : 0, row2 = FTB_STAGES == 2 ? row : 0;
#if FTB_DQ
    constexpr size_t ds = BC * BR * sizeof(T), ds2 = FTB_DS_STAGES == 2 ? ds : 0;
#endif
    return layout_ok<FTB_DQ ? 12 : 10>({{SMEM_K, kv}, {SMEM_V, kv}, {SMEM_Q0, q}, {FTB_Q1, q2},
                                        {SMEM_DO0, q}, {FTB_DO1, q2}, {SMEM_LSE0, row}, {FTB_LSE1, row2},
                                        {SMEM_D0, row}, {FTB_D1, row2},
#if FTB_DQ
                                        {SMEM_DS0, ds}, {FTB_DS1, ds2}
#endif
    });
}

// Grid (ceil(n_k / BC), 1, BH). Q, dO: (BH, n_q, HEAD_D) of T; K, V, dK, dV: (BH, n_k, HEAD_D) of T;
// lse, D: (BH, n_q) float32; dQacc: (BH, n_q, HEAD_D) float32 (zeroed by the prep stage), or null.
template <typename T, typename C>
__device__ __forceinline__ void ftb_kv_outer(C& io, const T* __restrict__ Q, const T* __restrict__ K,
                                             const T* __restrict__ V, const T* __restrict__ dO,
                                             const float* __restrict__ lse, const float* __restrict__ Dg,
                                             float* __restrict__ dQacc, T* __restrict__ dK, T* __restrict__ dV,
                                             int n_q, int n_k, float scale, unsigned char* smem)
{
    static_assert(ftb_kv_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates: row group, thread in group
    const size_t bh = blockIdx.z;
    const int col0 = blockIdx.x * BC;
    const int cols = min(BC, n_k - col0);  // the last K/V block is ragged
    const size_t kv_off = bh * n_k + col0;
    const size_t q_base = bh * n_q;
    const int tiles = (n_q + BR - 1) / BR;
    const float scale2 = scale * TC_LOG2E;
    T* Ks = tc_buffer<T>(smem, SMEM_K);
    T* Vs = tc_buffer<T>(smem, SMEM_V);

    tc_load_tile<IOK_T_K, BC>(io, Ks, K + kv_off * HEAD_D, cols);
    tc_load_tile<IOK_T_V, BC>(io, Vs, V + kv_off * HEAD_D, cols);
    auto load_q_block = [&](int i, int buf) {
        const size_t row = q_base + static_cast<size_t>(i) * BR;
        const int rows = min(BR, n_q - i * BR);
        tc_load_tile<IOK_T_Q, BR>(io, tc_buffer<T>(smem, buf ? FTB_Q1 : SMEM_Q0), Q + row * HEAD_D, rows);
        tc_load_tile<IOK_T_dO, BR>(io, tc_buffer<T>(smem, buf ? FTB_DO1 : SMEM_DO0), dO + row * HEAD_D, rows);
        bwd_load_scalars<IOK_T_lse, BR>(io, tc_buffer<float>(smem, buf ? FTB_LSE1 : SMEM_LSE0), lse + row, rows);
        bwd_load_scalars<IOK_T_D, BR>(io, tc_buffer<float>(smem, buf ? FTB_D1 : SMEM_D0), Dg + row, rows);
    };
    load_q_block(0, 0);
    iok_cp_async_commit();

    float dk[HEAD_D / 8][4], dv[HEAD_D / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_D / 8; ++n) {
        ftb_zero(dk[n]);
        ftb_zero(dv[n]);
    }
    const int key_w = warp * 16;  // this warp's first key within the block
    // keys g and g + 8 of the warp past n_k (ragged last block): their P is 0
    const bool key_lo_out = key_w + g >= cols, key_hi_out = key_w + g + 8 >= cols;

#if FTB_DQ
    auto buf_ds = [](int i) { return FTB_DS_STAGES == 2 ? (i & 1) : 0; };
    // dQacc of query block i += τ dS_i K_j, from dSᵀ_i in shared memory (visible to every warp)
    auto dq_block = [&](int i) {
        const T* dSs = tc_buffer<T>(smem, buf_ds(i) ? FTB_DS1 : SMEM_DS0);
        const int wm = warp % DQ_WM, wn = warp / DQ_WM;
        const int row0 = i * BR;
#pragma unroll
        for (int pass = 0; pass < DQ_NT / DQ_PASS_NT; ++pass) {  // column passes bound the accumulators
            const int c0 = wn * DQ_NT + pass * DQ_PASS_NT;       // first 8-column tile of the pass
            float acc[DQ_PASS_NT][4];
#pragma unroll
            for (int n = 0; n < DQ_PASS_NT; ++n) ftb_zero(acc[n]);
#pragma unroll 2
            for (int kk = 0; kk < BC / 16; ++kk) {
                // A = dS (16 queries x 16 keys) from dSᵀ (keys x queries) by ldmatrix.trans
                unsigned a[1][4];
                tc_ldmatrix_x4_trans(a[0], dSs + ftb_off<BR>(kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8,
                                                             wm * 2 + ((lane >> 3) & 1)));
                ftb_ab<T, 1, DQ_PASS_NT>(acc, a, Ks + kk * 16 * HEAD_D, c0);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * 16 + g + 8 * h;
                if (row0 + r < n_q) {
                    float* dst = dQacc + (q_base + row0 + r) * HEAD_D + c0 * 8 + 2 * t;
#pragma unroll
                    for (int n = 0; n < DQ_PASS_NT; ++n) {
                        bwd_red_add2<IOK_T_dQacc>(io, dst + n * 8, acc[n][2 * h] * scale, acc[n][2 * h + 1] * scale);
                    }
                }
            }
        }
    };
#endif

#pragma unroll 1
    for (int i = 0; i < tiles; ++i) {
        const int buf = FTB_STAGES == 2 ? i & 1 : 0;
        if constexpr (FTB_STAGES == 2) {
            iok_cp_async_wait<0>();  // block i landed
            __syncthreads();         // ... for every thread; every warp is done with block i - 1 (and dS)
            if (i + 1 < tiles) load_q_block(i + 1, buf ^ 1);  // flies while block i is used
            iok_cp_async_commit();
        } else {
            if (i > 0) {
                __syncthreads();  // every warp is done with block i - 1 (and dS)
                load_q_block(i, 0);
                iok_cp_async_commit();
            }
            iok_cp_async_wait<0>();  // block i landed
            __syncthreads();         // ... for every thread
        }
        const T* Qs = tc_buffer<T>(smem, buf ? FTB_Q1 : SMEM_Q0);
        const T* dOs = tc_buffer<T>(smem, buf ? FTB_DO1 : SMEM_DO0);
        const float* lse_s = tc_buffer<float>(smem, buf ? FTB_LSE1 : SMEM_LSE0);
        const float* d_s = tc_buffer<float>(smem, buf ? FTB_D1 : SMEM_D0);
#if FTB_DQ
        if constexpr (FTB_DS_STAGES == 2) {
            if (i > 0) dq_block(i - 1);  // its dSᵀ, stored in step i - 1, is visible since the barrier above
        }
#endif

        // Sᵀ = K_w Q_iᵀ (16 keys x BR queries per warp), Pᵀ = exp(τ Sᵀ − lse) (base 2), kept as A fragments
        // (rounded to T); element e of accumulator tile n: key g + 8 (e >> 1), query n * 8 + 2t + (e & 1)
        unsigned pa[BR / 16][4], dsa[BR / 16][4];  // Pᵀ and dSᵀ as A fragments
        {
            float s[BR / 8][4];
#pragma unroll
            for (int n = 0; n < BR / 8; ++n) ftb_zero(s[n]);
            ftb_abt<T, BR / 8>(s, Ks, key_w, Qs);
#pragma unroll
            for (int n = 0; n < BR / 8; ++n) {
                const float2 l2 = *reinterpret_cast<const float2*>(lse_s + n * 8 + 2 * t);
                const float lq[2] = {l2.x * TC_LOG2E, l2.y * TC_LOG2E};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = exp2f(fmaf(s[n][e], scale2, -lq[e & 1]));
                    s[n][e] = ((e >> 1) ? key_hi_out : key_lo_out) ? 0.0f : p;
                }
            }
            ftb_pack<T, BR / 8>(pa, s);
        }
        // dV_w += Pᵀ dO_i
        ftb_ab<T, BR / 16, HEAD_D / 8>(dv, pa, dOs, 0);
        // dPᵀ = V_w dO_iᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D) with Pᵀ as rounded for the dV product (it is rounded to T
        // once more for the dK and dQ products, like dSᵀ)
        {
            float dp[BR / 8][4];
#pragma unroll
            for (int n = 0; n < BR / 8; ++n) ftb_zero(dp[n]);
            ftb_abt<T, BR / 8>(dp, Vs, key_w, dOs);
#pragma unroll
            for (int n = 0; n < BR / 8; ++n) {
                const float2 d2 = *reinterpret_cast<const float2*>(d_s + n * 8 + 2 * t);
                const float2 p01 = ftb_unpack<T>(pa[n / 2][2 * (n & 1)]);      // key g
                const float2 p23 = ftb_unpack<T>(pa[n / 2][2 * (n & 1) + 1]);  // key g + 8
                dp[n][0] = p01.x * (dp[n][0] - d2.x);
                dp[n][1] = p01.y * (dp[n][1] - d2.y);
                dp[n][2] = p23.x * (dp[n][2] - d2.x);
                dp[n][3] = p23.y * (dp[n][3] - d2.y);
            }
            ftb_pack<T, BR / 8>(dsa, dp);
        }
        // dK_w += dSᵀ Q_i (τ applied at the end)
        ftb_ab<T, BR / 16, HEAD_D / 8>(dk, dsa, Qs, 0);

#if FTB_DQ
        // dSᵀ -> shared memory (BC keys x BR queries of T), for dQacc_i += τ dS K_j split among the warps
        {
            T* dSs = tc_buffer<T>(smem, (FTB_DS_STAGES == 2 && buf_ds(i)) ? FTB_DS1 : SMEM_DS0);
#pragma unroll
            for (int kk = 0; kk < BR / 16; ++kk) {
#pragma unroll
                for (int x = 0; x < 4; ++x) {  // fragment register x: key g + 8 (x & 1), query tile 2 kk + (x >> 1)
                    const int key = key_w + g + 8 * (x & 1);
                    *reinterpret_cast<unsigned*>(dSs + ftb_off<BR>(key, 2 * kk + (x >> 1)) + 2 * t) = dsa[kk][x];
                }
            }
            if constexpr (FTB_DS_STAGES == 1) {
                __syncthreads();  // every warp's dSᵀ rows are visible
                dq_block(i);
            }
        }
#endif
    }
#if FTB_DQ
    if constexpr (FTB_DS_STAGES == 2) {
        __syncthreads();  // the last block's dSᵀ is visible
        dq_block(tiles - 1);
    }
#endif
    iok_cp_async_wait<0>();

    // dK_j = τ dK, dV_j rounded and written once (rows past n_k skipped)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key_w + g + 8 * h;
        if (key < cols) {
            T* krow = dK + (kv_off + key) * HEAD_D + 2 * t;
            T* vrow = dV + (kv_off + key) * HEAD_D + 2 * t;
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; ++n) {
                iok_st<IOK_T_dK>(io, reinterpret_cast<unsigned*>(krow + n * 8),
                                 tc_pack<T>(dk[n][2 * h] * scale, dk[n][2 * h + 1] * scale));
                iok_st<IOK_T_dV>(io, reinterpret_cast<unsigned*>(vrow + n * 8),
                                 tc_pack<T>(dv[n][2 * h], dv[n][2 * h + 1]));
            }
        }
    }
}

#if FTB_DQ
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tc_bwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, const T* __restrict__ dO,
             const float* __restrict__ lse, const float* __restrict__ D, float* __restrict__ dQacc,
             T* __restrict__ dK, T* __restrict__ dV, int n_q, int n_k, float scale,
             unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(128) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_dO, IOK_T_lse, IOK_T_D, IOK_T_dQacc, IOK_T_dK, IOK_T_dV> io;
    ftb_kv_outer<T>(io, Q, K, V, dO, lse, D, dQacc, dK, dV, n_q, n_k, scale, smem);
    iok_flush(io, iok_counters);
}
#else
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tc_bwd_dkdv(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V,
                  const T* __restrict__ dO, const float* __restrict__ lse, const float* __restrict__ D,
                  T* __restrict__ dK, T* __restrict__ dV, int n_q, int n_k, float scale,
                  unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(128) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_dO, IOK_T_lse, IOK_T_D, IOK_T_dK, IOK_T_dV> io;
    ftb_kv_outer<T>(io, Q, K, V, dO, lse, D, nullptr, dK, dV, n_q, n_k, scale, smem);
    iok_flush(io, iok_counters);
}
#endif

// ---------------------------------------------------------------------------------------------
#elif defined(SMEM_O)  // the deterministic query-outer dQ kernel

#if !defined(KV_BLOCK)
#error "flash_tc_bwd_dq needs KV_BLOCK (keys per step) from the plan"
#endif
static_assert(THREADS == 32 * (BR / 16), "a warp per 16 query rows");
static_assert(KV_BLOCK % 16 == 0, "16-key mma steps");

template <typename T>
__device__ constexpr bool ftb_dq_layout_ok()
{
    constexpr size_t q = BR * HEAD_D * sizeof(T), kv = KV_BLOCK * HEAD_D * sizeof(T), row = BR * sizeof(float);
    return layout_ok<9>({{SMEM_Q, q}, {SMEM_DO, q}, {SMEM_O, q}, {SMEM_K0, kv}, {SMEM_K1, kv}, {SMEM_V0, kv},
                         {SMEM_V1, kv}, {SMEM_LSE, row}, {SMEM_D, row}});
}

// Grid (ceil(n_q / BR), 1, BH). Q, O, dO, dQ: (BH, n_q, HEAD_D) of T; K, V: (BH, n_k, HEAD_D) of T;
// lse: (BH, n_q) float32 read; D: (BH, n_q) float32 written.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tc_bwd_dq(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, const T* __restrict__ O,
                const T* __restrict__ dO, const float* __restrict__ lse, float* __restrict__ Dg,
                T* __restrict__ dQ, int n_q, int n_k, float scale, unsigned long long* __restrict__ iok_counters)
{
    static_assert(ftb_dq_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(128) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_lse, IOK_T_dO, IOK_T_D, IOK_T_dQ> io;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * BR;
    const int rows = min(BR, n_q - row0);
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;
    const size_t kv_base = static_cast<size_t>(blockIdx.z) * n_k;
    const int tiles = (n_k + KV_BLOCK - 1) / KV_BLOCK;
    const float scale2 = scale * TC_LOG2E;
    const T* Qs = tc_buffer<T>(smem, SMEM_Q);
    const T* dOs = tc_buffer<T>(smem, SMEM_DO);
    const T* Os = tc_buffer<T>(smem, SMEM_O);
    float* lse_s = tc_buffer<float>(smem, SMEM_LSE);
    float* d_s = tc_buffer<float>(smem, SMEM_D);

    tc_load_tile<IOK_T_Q, BR>(io, tc_buffer<T>(smem, SMEM_Q), Q + q_off * HEAD_D, rows);
    tc_load_tile<IOK_T_dO, BR>(io, tc_buffer<T>(smem, SMEM_DO), dO + q_off * HEAD_D, rows);
    tc_load_tile<IOK_T_O, BR>(io, tc_buffer<T>(smem, SMEM_O), O + q_off * HEAD_D, rows);
    bwd_load_scalars<IOK_T_lse, BR>(io, lse_s, lse + q_off, rows);
    iok_cp_async_commit();
    tc_load_tile<IOK_T_K, KV_BLOCK>(io, tc_buffer<T>(smem, SMEM_K0), K + kv_base * HEAD_D, min(KV_BLOCK, n_k));
    tc_load_tile<IOK_T_V, KV_BLOCK>(io, tc_buffer<T>(smem, SMEM_V0), V + kv_base * HEAD_D, min(KV_BLOCK, n_k));
    iok_cp_async_commit();
    iok_cp_async_wait<1>();  // Q, dO, O, lse landed (K_0, V_0 may still fly)
    __syncthreads();

    // D_i = rowsum(dO_i ∘ O_i): two lanes per row of this warp, half the 16-byte chunks each
    {
        const int r = warp * 16 + (lane >> 1);
        float x = 0.0f;
#pragma unroll
        for (int c = (lane & 1); c < TC_CHUNKS; c += 2) {
            const uint4 a = *reinterpret_cast<const uint4*>(dOs + tc_off(r, c));
            const uint4 b = *reinterpret_cast<const uint4*>(Os + tc_off(r, c));
#pragma unroll
            for (int e = 0; e < 8; ++e) x = fmaf(to_f(vec_get<T>(a, e)), to_f(vec_get<T>(b, e)), x);
        }
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        if ((lane & 1) == 0) {
            d_s[r] = x;
            if (r < rows) iok_st<IOK_T_D>(io, Dg + q_off + r, x);
        }
        __syncwarp();  // the warp reads its own rows' D below
    }
    const int r_lo = warp * 16 + g;
    const float lse2[2] = {lse_s[r_lo] * TC_LOG2E, lse_s[r_lo + 8] * TC_LOG2E};
    const float dd[2] = {d_s[r_lo], d_s[r_lo + 8]};

    float dq[HEAD_D / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_D / 8; ++n) ftb_zero(dq[n]);

#pragma unroll 1
    for (int j = 0; j < tiles; ++j) {
        const int buf = j & 1;
        if (j + 1 < tiles) {  // the next K, V block flies while this one is used
            const size_t next = kv_base + static_cast<size_t>(j + 1) * KV_BLOCK;
            const int valid = min(KV_BLOCK, n_k - (j + 1) * KV_BLOCK);
            tc_load_tile<IOK_T_K, KV_BLOCK>(io, tc_buffer<T>(smem, buf ? SMEM_K0 : SMEM_K1), K + next * HEAD_D, valid);
            tc_load_tile<IOK_T_V, KV_BLOCK>(io, tc_buffer<T>(smem, buf ? SMEM_V0 : SMEM_V1), V + next * HEAD_D, valid);
        }
        iok_cp_async_commit();
        iok_cp_async_wait<1>();  // block j landed
        __syncthreads();
        const T* Kt = tc_buffer<T>(smem, buf ? SMEM_K1 : SMEM_K0);
        const T* Vt = tc_buffer<T>(smem, buf ? SMEM_V1 : SMEM_V0);

        // S = Q_w K_jᵀ, dP = dO_w V_jᵀ: 16 queries x KV_BLOCK keys per warp
        float s[KV_BLOCK / 8][4], dp[KV_BLOCK / 8][4];
#pragma unroll
        for (int n = 0; n < KV_BLOCK / 8; ++n) {
            ftb_zero(s[n]);
            ftb_zero(dp[n]);
        }
        ftb_abt<T, KV_BLOCK / 8>(s, Qs, warp * 16, Kt);
        ftb_abt<T, KV_BLOCK / 8>(dp, dOs, warp * 16, Vt);

        // P = exp(τS − lse), dS = P ∘ (dP − D); keys past n_k: P = 0
        const int key0 = j * KV_BLOCK;
        const bool ragged = key0 + KV_BLOCK > n_k;
#pragma unroll
        for (int n = 0; n < KV_BLOCK / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float p = exp2f(fmaf(s[n][e], scale2, -lse2[e >> 1]));
                if (ragged && key0 + n * 8 + 2 * t + (e & 1) >= n_k) p = 0.0f;
                dp[n][e] = p * (dp[n][e] - dd[e >> 1]);
            }
        }

        // dQ_w += dS K_j (τ applied at the end)
        unsigned dsa[KV_BLOCK / 16][4];
        ftb_pack<T, KV_BLOCK / 8>(dsa, dp);
        ftb_ab<T, KV_BLOCK / 16, HEAD_D / 8>(dq, dsa, Kt, 0);
        __syncthreads();  // every warp is done with buffer buf before it is refilled
    }
    iok_cp_async_wait<0>();

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = r_lo + 8 * h;
        if (r < rows) {
            T* row = dQ + (q_off + r) * HEAD_D + 2 * t;
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; ++n) {
                iok_st<IOK_T_dQ>(io, reinterpret_cast<unsigned*>(row + n * 8),
                                 tc_pack<T>(dq[n][2 * h] * scale, dq[n][2 * h + 1] * scale));
            }
        }
    }
    iok_flush(io, iok_counters);
}

#else
#error "flash_tc_bwd.cu: the stage's layout names neither Q0 (K/V-outer kernels) nor O (dq kernel)"
#endif
