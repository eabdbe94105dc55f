// The split-KV decode's combine (issue #23; iokernels/plan/decode.py, stage "combine"): the S splits of
// flash_tma.cu built with SPLIT each wrote a row's normalized partial output O_s and its log-sum-exp lse_s (float32,
// natural log); this kernel merges them into the row's O and lse:
//   m = max_s lse_s,   lse = m + log Σ_s exp(lse_s − m),   O = Σ_s exp(lse_s − lse) O_s.
// A warp per row (THREADS / 32 rows per block): its lanes read the row's S lse values (S ≤ 32 · LSE_PER_LANE), reduce
// the maximum and the sum by shuffles and leave the weights exp(lse_s − lse) in shared memory; then each lane owns
// 4 consecutive columns (float4 loads, 4 · 32 columns per pass) and adds the splits' partials, several loads in flight.
//
// PDL (a stage parameter): the launcher starts this kernel while the splits' kernel is finishing (programmatic
// dependent launch, sm_90: its blocks are set up early and wait in griddepcontrol.wait until the splits' grid has
// completed and its memory is visible); flash_tma.cu's SPLIT blocks let it start (griddepcontrol.launch_dependents).
//
// RAGGED (a decode's cache of per-sequence lengths): a row of sequence b reads its length (lane 0) and merges the
// S_b splits that hold one of its ⌈n_b / BC⌉ key tiles (the splits are cut from the capacity n_k's tiles, c = ⌈T_c /
// S⌉ each: S_b = ⌈⌈n_b / BC⌉ / c⌉, the splits past its end wrote nothing); none: O = 0, lse = −inf.
//
// Counting: each lse_s and each float4 of a partial read inside d (every row reads its S splits, S_b with RAGGED:
// the plan makes none empty), the length (RAGGED), O (HEAD_D T) and lse written once per row; the model's "combine"
// stage.
#include "common.cuh"

#if !defined(HEAD_D) || !defined(BC) || !defined(THREADS) || !defined(SMEM_WEIGHTS) || !defined(SMEM_BYTES)
#error "combine.cu needs HEAD_D, BC, THREADS and the weights buffer from the plan"
#endif
static_assert(HEAD_D % 4 == 0 && THREADS % 32 == 0, "float4 columns, whole warps");
constexpr int WARPS = THREADS / 32;
constexpr int MAX_SPLITS = SMEM_BYTES / (WARPS * 4);  // the weights buffer: a float per split per warp
constexpr int LSE_PER_LANE = (MAX_SPLITS + 31) / 32;
constexpr int COL_PASSES = (HEAD_D + 127) / 128;  // 128 columns (4 per lane) per pass

__device__ __forceinline__ float cb_neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

// Four floats rounded to T, as the 8 bytes of one store.
template <typename T>
__device__ __forceinline__ uint2 cb_pack4(float4 v);
template <>
__device__ __forceinline__ uint2 cb_pack4<__half>(float4 v)
{
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    return make_uint2(*reinterpret_cast<const unsigned*>(&a), *reinterpret_cast<const unsigned*>(&b));
}
template <>
__device__ __forceinline__ uint2 cb_pack4<__nv_bfloat16>(float4 v)
{
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*reinterpret_cast<const unsigned*>(&a), *reinterpret_cast<const unsigned*>(&b));
}

// Grid (⌈rows / WARPS⌉). Opart: (splits, rows, HEAD_D) float32, lse_part: (splits, rows) float32; O: (rows, HEAD_D)
// of T, lse: (rows) float32; rows = batch · heads · N_q; n_k the keys (RAGGED: the capacity).
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_combine(const float* __restrict__ Opart, const float* __restrict__ lse_part, T* __restrict__ O,
              float* __restrict__ lse, int rows, int splits, int n_k, IOK_CACHE_PARAM
              unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(16) unsigned char smem[];
    IokCounters<IOK_T_Opart, IOK_T_lse_part, IOK_T_O, IOK_T_lse IOK_CACHE_T> io;
#if defined(PDL) && __CUDA_ARCH__ >= 900
    // launched while the splits finish (programmatic dependent launch): their partials are complete past this
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS + warp;
    if (splits > MAX_SPLITS && threadIdx.x == 0) __trap();  // the plan never makes more
    float* weight = reinterpret_cast<float*>(smem + SMEM_WEIGHTS) + warp * MAX_SPLITS;

    if (row < rows) {
#ifdef RAGGED
        int keys = 0;
        if (lane == 0) keys = min(iok_ld<IOK_T_seqlens>(io, seqlens + row / (rows / batch)) + seq_add, n_k);
        keys = __shfl_sync(0xffffffffu, keys, 0);
        const int chunk = ((n_k + BC - 1) / BC + splits - 1) / splits;
        splits = ((keys + BC - 1) / BC + chunk - 1) / chunk;  // the row's sequence's non-empty splits
#endif
        float part[LSE_PER_LANE];
        float top = cb_neg_inf();
#pragma unroll
        for (int i = 0; i < LSE_PER_LANE; ++i) {
            const int s = lane + 32 * i;
            part[i] = s < splits ? iok_ld<IOK_T_lse_part>(io, lse_part + static_cast<size_t>(s) * rows + row)
                                 : cb_neg_inf();
            top = fmaxf(top, part[i]);
        }
#pragma unroll
        for (int k = 16; k; k >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, k));
        const float ref = top == cb_neg_inf() ? 0.0f : top;  // (a row no split saw: weights 0, O = 0)
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < LSE_PER_LANE; ++i) sum += __expf(part[i] - ref);
#pragma unroll
        for (int k = 16; k; k >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, k);
        const float total = ref + __logf(sum);
#pragma unroll
        for (int i = 0; i < LSE_PER_LANE; ++i) {
            const int s = lane + 32 * i;
            if (s < splits) weight[s] = sum == 0.0f ? 0.0f : __expf(part[i] - total);
        }
        __syncwarp();  // the weights, visible to the warp's lanes

#pragma unroll 1
        for (int pass = 0; pass < COL_PASSES; ++pass) {
            const int col = 128 * pass + 4 * lane;
            if (col < HEAD_D) {
                const float* src = Opart + static_cast<size_t>(row) * HEAD_D + col;
                const size_t split_stride = static_cast<size_t>(rows) * HEAD_D;
                float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
                for (int s = 0; s < splits; ++s) {
                    const float4 v = iok_ld<IOK_T_Opart>(io, reinterpret_cast<const float4*>(src + s * split_stride));
                    const float w = weight[s];
                    acc.x = fmaf(w, v.x, acc.x);
                    acc.y = fmaf(w, v.y, acc.y);
                    acc.z = fmaf(w, v.z, acc.z);
                    acc.w = fmaf(w, v.w, acc.w);
                }
                iok_st<IOK_T_O>(io, reinterpret_cast<uint2*>(O + static_cast<size_t>(row) * HEAD_D + col),
                                cb_pack4<T>(acc));
            }
        }
        if (lane == 0) iok_st<IOK_T_lse>(io, lse + row, sum == 0.0f ? cb_neg_inf() : total);
    }
    iok_flush(io, iok_counters);
}
