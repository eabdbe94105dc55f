// Tensor-core FlashAttention forward for float16 / bfloat16 (docs/KERNELS.md, "flash_tc.cu"): the
// FlashAttention-2 loop order of flash_q_outer, so it moves exactly the bytes of the q_outer model
// (Q_i read once, K_j and V_j once per row block, O and lse written once), with its own tiles.
//
// A block of THREADS = 32 * BR / 16 threads owns BR query rows, 16 per warp. Q_i is loaded once into
// shared memory and then into registers (mma A fragments). K_j and V_j (BC rows) stream through a
// two-stage cp.async pipeline. Per warp: S = Q Kᵀ (mma.sync m16n8k16, float32 accumulators), online
// softmax in registers (exp2, rows of S reduced across the 4 lanes that hold them), P reused from the
// accumulator registers as the A operand of O += P V (V through ldmatrix.trans). O is divided by l and
// rounded once at the end. Shared-memory rows are 16-byte chunks XOR-swizzled by (row % 8), so that
// ldmatrix reads 8 rows without bank conflicts.
//
// BR, BC, HEAD_D and the SMEM_* offsets come from the plan (HEAD_D a multiple of 16, BC of 16).
// CAUSAL (causal plans; common.cuh): the key tiles stop at the block's last row's last visible key
// (none: nothing is loaded, O = 0 and lse = −inf), masked elements of S are −inf, and the softmax
// takes exp2 against 0 where a row's running max is still −inf, so a row with no key ends at 0, not NaN.
#include "common.cuh"

#include "tiles.cuh"

#include "tc.cuh"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS)
#error "flash_tc.cu needs BR, BC, HEAD_D and THREADS from the plan"
#endif
static_assert(BR % 16 == 0 && THREADS == 32 * (BR / 16), "a warp per 16 query rows");
static_assert(BC % 16 == 0 && HEAD_D % 16 == 0, "16-wide mma steps");

template <typename T>
__device__ constexpr bool tc_layout_ok()
{
    return layout_ok<5>({{SMEM_Q, BR * HEAD_D * sizeof(T)},
                         {SMEM_K0, BC * HEAD_D * sizeof(T)},
                         {SMEM_K1, BC * HEAD_D * sizeof(T)},
                         {SMEM_V0, BC * HEAD_D * sizeof(T)},
                         {SMEM_V1, BC * HEAD_D * sizeof(T)}});
}

// Grid (ceil(N_q / BR), 1, BH). Q, O: (BH, N_q, HEAD_D) of T; K, V: (BH / kv_group, N_k, HEAD_D) of T,
// query head z reading K/V head z / kv_group (grouped-query attention; 1 for none); lse: (BH, N_q) float32.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tc_fwd(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O,
             float* __restrict__ lse, int n_q, int n_k, float scale, int kv_group,
             unsigned long long* __restrict__ iok_counters)
{
    static_assert(tc_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES");
    extern __shared__ __align__(128) unsigned char smem[];
    T* Qs = reinterpret_cast<T*>(smem + SMEM_Q);
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_O, IOK_T_lse> io;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int row0 = blockIdx.x * BR;
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
    const float scale2 = scale * TC_LOG2E;  // softmax in base 2: exp(x s) = 2^(x s log2 e)

#ifdef CAUSAL
    if (tiles > 0) {  // else no row of the block sees a key: nothing to load (the groups stay, empty)
#endif
        tc_load_tile<IOK_T_Q, BR>(io, Qs, Q + q_off * HEAD_D, rows);
        iok_cp_async_commit();
        tc_load_tile<IOK_T_K, BC>(io, tc_buffer<T>(smem, SMEM_K0), K + kv_base * HEAD_D, min(BC, n_k));
        tc_load_tile<IOK_T_V, BC>(io, tc_buffer<T>(smem, SMEM_V0), V + kv_base * HEAD_D, min(BC, n_k));
        iok_cp_async_commit();
#ifdef CAUSAL
    } else {
        iok_cp_async_commit();
        iok_cp_async_commit();
    }
#endif

    // Q fragments of this warp's 16 rows, for every 16-wide step of HEAD_D
    unsigned qa[HEAD_D / 16][4];
    iok_cp_async_wait<1>();  // Q landed (K_0, V_0 may still fly)
    __syncthreads();
    {
        const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kk = 0; kk < HEAD_D / 16; ++kk) tc_ldmatrix_x4(qa[kk], Qs + tc_off(r, kk * 2 + (lane >> 4)));
    }

    float o[HEAD_D / 8][4];
#pragma unroll
    for (int n = 0; n < HEAD_D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, base-2 units

#pragma unroll 1
    for (int j = 0; j < tiles; ++j) {
        const int buf = j & 1;
        if (j + 1 < tiles) {  // the next K, V tile flies while this one is used
            const size_t next = kv_base + static_cast<size_t>(j + 1) * BC;
            const int valid = min(BC, n_k - (j + 1) * BC);
            tc_load_tile<IOK_T_K, BC>(io, tc_buffer<T>(smem, buf ? SMEM_K0 : SMEM_K1), K + next * HEAD_D, valid);
            tc_load_tile<IOK_T_V, BC>(io, tc_buffer<T>(smem, buf ? SMEM_V0 : SMEM_V1), V + next * HEAD_D, valid);
        }
        iok_cp_async_commit();
        iok_cp_async_wait<1>();  // tile j landed
        __syncthreads();
        const T* Kt = tc_buffer<T>(smem, buf ? SMEM_K1 : SMEM_K0);
        const T* Vt = tc_buffer<T>(smem, buf ? SMEM_V1 : SMEM_V0);

        // S = Q Kᵀ: 16 x BC per warp, BC / 8 accumulator tiles
        float s[BC / 8][4];
#pragma unroll
        for (int n = 0; n < BC / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HEAD_D / 16; ++kk) {
#pragma unroll
            for (int n = 0; n < BC / 8; n += 2) {
                unsigned b[4];
                const int key = n * 8 + (lane & 7) + (lane >> 4) * 8;
                tc_ldmatrix_x4(b, Kt + tc_off(key, kk * 2 + ((lane >> 3) & 1)));
                tc_mma<T>(s[n], qa[kk], b[0], b[1]);
                tc_mma<T>(s[n + 1], qa[kk], b[2], b[3]);
            }
        }

        // keys past n_k (ragged last tile) get -inf
        const int key0 = j * BC;
        if (key0 + BC > n_k) {
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (key0 + n * 8 + 2 * t + (e & 1) >= n_k) s[n][e] = neg_inf();
                }
            }
        }

#ifdef CAUSAL
        // keys past a row's last visible key get -inf (only tiles that reach past the block's first row's)
        if (key0 + BC - 1 > row0 + off) {
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = row0 + warp * 16 + g + 8 * (e >> 1);
                    if (key0 + n * 8 + 2 * t + (e & 1) > row + off) s[n][e] = neg_inf();
                }
            }
        }
#endif

        // online softmax, rows g (e = 0, 1) and g + 8 (e = 2, 3)
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = m[h];
#pragma unroll
            for (int n = 0; n < BC / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]) * scale2);
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
                s[n][2 * h] = exp2f(fmaf(s[n][2 * h], scale2, -mx_ref));
                s[n][2 * h + 1] = exp2f(fmaf(s[n][2 * h + 1], scale2, -mx_ref));
                sum += s[n][2 * h] + s[n][2 * h + 1];
            }
            l[h] = l[h] * corr[h] + sum;  // per-lane partial of the row sum; reduced at the end
        }
#pragma unroll
        for (int n = 0; n < HEAD_D / 8; ++n) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }

        // O += P V: P from the S accumulators (two 8-key tiles make one 16-key A fragment)
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            unsigned pa[4];
            pa[0] = tc_pack<T>(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = tc_pack<T>(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = tc_pack<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = tc_pack<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; n += 2) {
                unsigned b[4];
                const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                tc_ldmatrix_x4_trans(b, Vt + tc_off(key, n + (lane >> 4)));
                tc_mma<T>(o[n], pa, b[0], b[1]);
                tc_mma<T>(o[n + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp is done with buffer buf before it is refilled
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
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp * 16 + g + 8 * h;
        if (r < rows) {
            T* orow = O + (q_off + r) * HEAD_D;
#pragma unroll
            for (int n = 0; n < HEAD_D / 8; ++n) {
                iok_st<IOK_T_O>(io, reinterpret_cast<unsigned*>(orow + n * 8 + 2 * t),
                                tc_pack<T>(o[n][2 * h] * inv[h], o[n][2 * h + 1] * inv[h]));
            }
            if (t == 0) iok_st<IOK_T_lse>(io, lse + q_off + r, (m[h] + __log2f(l[h])) * 0.6931471805599453f);
        }
    }
    iok_flush(io, iok_counters);
}
