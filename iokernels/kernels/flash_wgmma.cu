// Tensor-core FlashAttention forward for sm_90a (H100/H200), float16 / bfloat16 (docs/KERNELS.md,
// "flash_wgmma.cu"): the FlashAttention-2 loop order of flash_q_outer, so it moves exactly the bytes
// of the q_outer model (Q_i read once, K_j and V_j once per row block, O and lse written once), with
// its own tiles, through warpgroup matrix products (PTX wgmma, wgmma.cuh).
//
// A block of THREADS = 2 * BR threads is BR / 64 warpgroups; warpgroup w owns query rows
// [64 w, 64 w + 64) of the block's BR. Q_i (BR rows) is loaded once; K_j and V_j (BC rows) stream
// through a two-stage cp.async pipeline. Shared-memory tiles are stored the way wgmma reads them:
// HEAD_D / 64 slabs of [rows][64 elements], 128-byte rows whose 16-byte chunks are XOR-swizzled by
// (row % 8) (the 128-byte swizzle), every slab 1024-byte aligned.
//   S = Q_i K_jᵀ : wgmma m64nBCk16, A = Q and B = K from shared memory, both K-major;
//   online softmax of S in registers (exp2, each row's 4 lanes reduced by shuffles);
//   O += P V_j   : wgmma m64nHEAD_Dk16, A = P from registers (converted from S's accumulators),
//                  B = V from shared memory, MN-major (transposed by the instruction).
// O is divided by l and rounded once at the end; lse = m + log l.
//
// BR (a multiple of 64), BC (64 or 128), HEAD_D (64 or 128) and the SMEM_* offsets come from the plan.
// CAUSAL (causal plans; common.cuh): as flash_tc.cu, the key tiles stop at the block's last row's last
// visible key (none: nothing is loaded, O = 0 and lse = −inf), masked elements of S are −inf, a row
// whose running max is still −inf takes exp2 against 0 (never NaN); the row blocks run last to first,
// so the blocks with the most key tiles start first.
// DROPOUT (dropout plans; common.cuh, iokernels/plan/dropout.py): m, l and lse are those of the undropped P; the
// P that multiplies V has its dropped elements zeroed (their keep bits come from Philox, computed while the
// S product flies, wg_dropout_rows), and O is multiplied by the keep scale 1 / (1 − p) with 1 / l. Element
// (bh, i, j): bh the query batch·head (blockIdx.z), i the query row, j the key, both within the head.
#include "common.cuh"

#include "tiles.cuh"

#include "wgmma.cuh"

#include "wg.cuh"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS)
#error "flash_wgmma.cu needs BR, BC, HEAD_D and THREADS from the plan"
#endif
static_assert(BR % 64 == 0 && THREADS == 2 * BR, "a warpgroup (128 threads) per 64 query rows");
static_assert((BC == 64 || BC == 128) && (HEAD_D == 64 || HEAD_D == 128), "wgmma tile widths");

template <typename T>
__device__ constexpr bool wg_layout_ok()
{
    return layout_ok<5>({{SMEM_Q, BR * HEAD_D * sizeof(T)},
                         {SMEM_K0, BC * HEAD_D * sizeof(T)},
                         {SMEM_K1, BC * HEAD_D * sizeof(T)},
                         {SMEM_V0, BC * HEAD_D * sizeof(T)},
                         {SMEM_V1, BC * HEAD_D * sizeof(T)}})
           && SMEM_Q % 1024 == 0 && SMEM_K0 % 1024 == 0 && SMEM_K1 % 1024 == 0 && SMEM_V0 % 1024 == 0
           && SMEM_V1 % 1024 == 0;
}

// Grid (ceil(N_q / BR), 1, BH). Q, O: (BH, N_q, HEAD_D) of T; K, V: (BH / kv_group, N_k, HEAD_D) of T,
// query head z reading K/V head z / kv_group (grouped-query attention; 1 for none); lse: (BH, N_q) float32.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_wgmma_fwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O,
                float* __restrict__ lse, int n_q, int n_k, float scale, int kv_group,
                IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
{
    static_assert(wg_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES, 1024-byte aligned");
    extern __shared__ __align__(1024) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_lse> io;
    if (threadIdx.x == 0 && (static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 1023u) != 0) __trap();

    T* Qs = reinterpret_cast<T*>(smem + SMEM_Q);
    const int wg = threadIdx.x >> 7;               // warpgroup: query rows [64 wg, 64 wg + 64)
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;         // accumulator coordinates: row group, thread in group
#ifdef CAUSAL
    const int row0 = (gridDim.x - 1 - blockIdx.x) * BR;  // the longest rows first
#else
    const int row0 = blockIdx.x * BR;
#endif
    const int rows = min(BR, n_q - row0);
    const size_t q_off = static_cast<size_t>(blockIdx.z) * n_q + row0;
    const size_t kv_base = static_cast<size_t>(blockIdx.z / kv_group) * n_k;  // this head's K/V head
#ifdef CAUSAL
    const int off = iok_causal_offset(n_q, n_k);
    // key tiles from the block's last row's last visible key on are masked for all its rows
    const int tiles = (max(0, min(n_k, row0 + rows + off)) + BC - 1) / BC;
#else
    const int tiles = (n_k + BC - 1) / BC;
#endif
    const float scale2 = scale * WG_LOG2E;  // softmax in base 2: exp(x s) = 2^(x s log2 e)

    if (tiles > 0) {  // causal: else no row of the block sees a key, nothing is loaded
        wg_load_tile<IOK_T_Q, BR>(io, Qs, Q + q_off * HEAD_D, rows);
        iok_cp_async_commit();
        wg_load_tile<IOK_T_K, BC>(io, reinterpret_cast<T*>(smem + SMEM_K0), K + kv_base * HEAD_D, min(BC, n_k));
        wg_load_tile<IOK_T_V, BC>(io, reinterpret_cast<T*>(smem + SMEM_V0), V + kv_base * HEAD_D, min(BC, n_k));
    }
    iok_cp_async_commit();

    float s[BC / 2], o[HEAD_D / 2];
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) s[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < HEAD_D / 2; ++i) o[i] = 0.0f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, base-2 units

#pragma unroll 1
    for (int j = 0; j < tiles; ++j) {
        const int buf = j & 1;
        if (j + 1 < tiles) {  // the next K, V tile flies while this one is used
            const size_t next = kv_base + static_cast<size_t>(j + 1) * BC;
            const int valid = min(BC, n_k - (j + 1) * BC);
            wg_load_tile<IOK_T_K, BC>(io, reinterpret_cast<T*>(smem + (buf ? SMEM_K0 : SMEM_K1)), K + next * HEAD_D,
                                      valid);
            wg_load_tile<IOK_T_V, BC>(io, reinterpret_cast<T*>(smem + (buf ? SMEM_V0 : SMEM_V1)), V + next * HEAD_D,
                                      valid);
        }
        iok_cp_async_commit();
        iok_cp_async_wait<1>();  // Q and tile j landed
        wg_fence_async_smem();
        __syncthreads();
        const unsigned char* Kt = smem + (buf ? SMEM_K1 : SMEM_K0);
        const unsigned char* Vt = smem + (buf ? SMEM_V1 : SMEM_V0);

        // S = Q Kᵀ (64 x BC per warpgroup): HEAD_D / 16 steps of 16; within a 64-column slab a step
        // moves the descriptors by 32 bytes, from slab to slab by the slab's size.
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < HEAD_D / 16; ++kk) {
            const int koff = (kk & 3) * 32 + (kk >> 2) * BR * 128;
            const int kkoff = (kk & 3) * 32 + (kk >> 2) * BC * 128;
            wg_mma_ss<T, BC>(s, wg_desc(smem + SMEM_Q + wg * 64 * 128 + koff, 16, 1024),
                             wg_desc(Kt + kkoff, 16, 1024), kk);
        }
        wg_commit();
        const int key0 = j * BC;
#ifdef DROPOUT
        // this tile's keep bits, while the product flies (rows g, g + 8 of the warp; keep[h] bit 2n + c:
        // element 4n + 2h + c)
        unsigned keep[2];
        wg_dropout_rows<BC>(keep, dropout_threshold, dropout_seed, dropout_offset, blockIdx.z,
                            row0 + wg * 64 + warp * 16 + g, key0, t);
        asm volatile("" : "+r"(keep[0]), "+r"(keep[1]));  // done before the wait
#endif
        wg_wait<0>();
        wg_fence_regs(s);

        // keys past n_k (ragged last tile) get -inf
        if (key0 + BC > n_k) {
#pragma unroll
            for (int i = 0; i < BC / 2; ++i) {
                if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) >= n_k) s[i] = neg_inf();
            }
        }
#ifdef CAUSAL
        // keys past a row's last visible key get -inf (only tiles that reach past the block's first row's)
        if (key0 + BC - 1 > row0 + off) {
            const int row = row0 + wg * 64 + warp * 16 + g + off;  // + 8 for the second row of the lane
#pragma unroll
            for (int i = 0; i < BC / 2; ++i) {
                if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) > row + 8 * ((i >> 1) & 1)) s[i] = neg_inf();
            }
        }
#endif

        // online softmax, rows g (i % 4 < 2) and g + 8 (i % 4 >= 2)
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]) * scale2);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#ifdef CAUSAL
            // a row that has seen no key yet: exp2 against 0, so its p and corr are 0, never NaN
            const float mx_ref = mx == neg_inf() ? 0.0f : mx;
#else
            const float mx_ref = mx;
#endif
            corr[h] = exp2f(m[h] - mx_ref);  // m = -inf at first: 0
            m[h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) {
                s[4 * n + 2 * h] = exp2f(fmaf(s[4 * n + 2 * h], scale2, -mx_ref));
                s[4 * n + 2 * h + 1] = exp2f(fmaf(s[4 * n + 2 * h + 1], scale2, -mx_ref));
                sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
            }
            l[h] = l[h] * corr[h] + sum;  // per-lane partial of the row sum; reduced at the end
        }
#pragma unroll
        for (int i = 0; i < HEAD_D / 2; ++i) o[i] *= corr[(i >> 1) & 1];

        // O += P V: P (the S accumulators, rounded to T) is the A operand, 16 keys per step
        unsigned pa[BC / 16][4];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
#ifdef DROPOUT  // element 8 kk + 2r + c: keep[r & 1] bit 2 (2 kk + r / 2) + c
                const int bit = 4 * kk + 2 * (r >> 1);
                pa[kk][r] = wg_pack<T>(wg_keep(s[8 * kk + 2 * r], keep[r & 1], bit),
                                       wg_keep(s[8 * kk + 2 * r + 1], keep[r & 1], bit + 1));
#else
                pa[kk][r] = wg_pack<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
#endif
            }
        }
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            wg_mma_rs_tb<T, HEAD_D>(o, pa[kk], wg_desc(Vt + kk * 16 * 128, BC * 128, 1024), 1);
        }
        wg_commit();
        wg_wait<0>();
        wg_fence_regs(o);
        __syncthreads();  // every warpgroup is done with buffer buf before it is refilled
    }
    iok_cp_async_wait<0>();

    // O = O / l, rounded once; lse = (m + log2 l) ln 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
#ifdef CAUSAL
    const float inv[2] = {l[0] == 0.0f ? 0.0f : 1.0f / l[0], l[1] == 0.0f ? 0.0f : 1.0f / l[1]};  // no key: O = 0
#else
    const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
#endif
#ifdef DROPOUT
    const float out_scale[2] = {inv[0] * dropout_scale, inv[1] * dropout_scale};  // O = (Z ∘ P) V / l
#else
    const float (&out_scale)[2] = inv;
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = wg * 64 + warp * 16 + g + 8 * h;
        if (r < rows) {
            T* orow = O + (q_off + r) * HEAD_D;
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; ++n) {
                iok_st<IOK_T_O>(io, reinterpret_cast<unsigned*>(orow + n * 8 + 2 * t),
                                wg_pack<T>(o[4 * n + 2 * h] * out_scale[h], o[4 * n + 2 * h + 1] * out_scale[h]));
            }
            if (t == 0) iok_st<IOK_T_lse>(io, lse + q_off + r, (m[h] + __log2f(l[h])) * 0.6931471805599453f);
        }
    }
    iok_flush(io, iok_counters);
}
