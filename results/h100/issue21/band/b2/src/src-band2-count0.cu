#define CAUSAL 1
#define HEAD_BAND 2
#define IOK_NUM_TENSORS 30
#define IOK_COUNTER_SLOTS 64
#define IOK_T_Q 0
#define IOK_T_K 1
#define IOK_T_V 2
#define IOK_T_O 3
#define IOK_T_S 4
#define IOK_T_P 5
#define IOK_T_m 6
#define IOK_T_l 7
#define IOK_T_lse 8
#define IOK_T_dO 9
#define IOK_T_D 10
#define IOK_T_dP 11
#define IOK_T_dS 12
#define IOK_T_dQ 13
#define IOK_T_dK 14
#define IOK_T_dV 15
#define IOK_T_dQacc 16
#define IOK_T_Oacc 17
#define IOK_T_block_mask 18
#define IOK_T_mask 19
#define IOK_T_Opart 20
#define IOK_T_lse_part 21
#define IOK_T_seqlens 22
#define IOK_T_page_table 23
#define IOK_T_Knew 24
#define IOK_T_Vnew 25
#define IOK_T_cu_seqlens_q 26
#define IOK_T_cu_seqlens_k 27
#define IOK_T_alibi 28
#define IOK_T_captures 29
#line 1 "common.cuh"
// Byte counting shared by every iokernels kernel (DESIGN.md, "IO accounting rules").
//
// build_source() inlines this file after a prelude of #defines: IOK_NUM_TENSORS, one IOK_T_<name>
// per tensor of iokernels/plan/tensors.py, and IOK_COUNT in the counting build only.
//
// Kernel conventions:
//   - the last parameter is `unsigned long long* __restrict__ iok_counters` in both builds, so one
//     launcher serves both: IOK_COUNTER_SLOTS * 2 * IOK_NUM_TENSORS zeroed u64 in the counting build
//     (slot s = block index % IOK_COUNTER_SLOTS; read bytes of tensor T at [s][2*T], written bytes at
//     [s][2*T+1]; the launcher sums the slots), may be null in the plain build;
//   - `IokCounters<IOK_T_Q, IOK_T_O> c;` names the tensors the kernel moves;
//   - every global load, store and atomic on them goes through iok_ld / iok_st / iok_atomic_add<IOK_T_x>;
//   - all threads of the block call iok_flush(c, iok_counters, smem) once, last.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef IOK_NUM_TENSORS
#error "IOK_NUM_TENSORS is defined by iokernels.kernels.build_source; compile its output, not this file"
#endif

// Causal attention (iokernels/plan/): a kernel compiled with CAUSAL (1 top-left, 2 bottom-right, a
// stage parameter of causal plans) sees key j from query i iff j <= i + iok_causal_offset(n_q, n_k).
#ifdef CAUSAL
static_assert(CAUSAL == 1 || CAUSAL == 2, "CAUSAL is 1 (top-left) or 2 (bottom-right)");
__device__ __forceinline__ int iok_causal_offset(int n_q, int n_k)
{
    return CAUSAL == 2 ? n_k - n_q : 0;
}
#endif

// A sliding window (iokernels/plan/causal.py, band_offsets): a kernel compiled with WINDOW (a stage parameter of
// window plans) takes two arguments after the masks (IOK_WINDOW_PARAM): query i sees the keys [i + win_lo,
// i + win_hi], the host folding a causal mask into win_hi (an unbounded side: -2^30 or 2^30). IOK_BAND: a key is
// masked by its position (CAUSAL or WINDOW); IOK_BAND_LO / IOK_BAND_HI are the band's offsets in either (without
// WINDOW there is no lower bound, and IOK_BAND_LO is not read).
#ifdef WINDOW
#define IOK_WINDOW_PARAM const int win_lo, const int win_hi,
#define IOK_BAND_LO win_lo
#define IOK_BAND_HI win_hi
#else
#define IOK_WINDOW_PARAM
#ifdef CAUSAL
#define IOK_BAND_LO 0
#define IOK_BAND_HI iok_causal_offset(n_q, n_k)
#endif
#endif
// A softcap c (iokernels/plan/variants.py, with_softcap): a kernel compiled with SOFTCAP takes c after the window's
// offsets (IOK_SOFTCAP_PARAM); the logits τ s become c · tanh(τ s / c) (Gemma 2's attention softcapping), and dS is
// multiplied by 1 − tanh² in the backward. iok_tanh: 1 − 2 / (2^(2x log2 e) + 1) with the approximate ex2 and rcp
// (two MUFU operations; ±1 for |x| large, an absolute error ~1e-7: tanh.approx.f32, one operation, has a relative
// 2^-11 that would move a logit of 30 by 0.015, more than float16 rounds it; __frcp_rn and exp2f's range handling ran
// the d 64 forward at a fifth of its speed, results/h100/issue22/softcap/)
#ifdef SOFTCAP
#define IOK_SOFTCAP_PARAM const float softcap,
__device__ __forceinline__ float iok_tanh(float x)
{
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(2.8853900817779268f * x));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
    return fmaf(-2.0f, r, 1.0f);
}
#else
#define IOK_SOFTCAP_PARAM
#endif

// ALiBi (iokernels/plan/variants.py, with_alibi): a kernel compiled with ALIBI takes the slopes, a float per
// batch·head, after the softcap (IOK_ALIBI_PARAM) and names them in its counters (IOK_ALIBI_T); the logits τ s of
// query i and key j get −slope · |j − i − (n_k − n_q)| (FlashAttention-2's bias, the bottom-right offset).
#ifdef ALIBI
#define IOK_ALIBI_PARAM const float *__restrict__ alibi,
#define IOK_ALIBI_T , IOK_T_alibi
#else
#define IOK_ALIBI_PARAM
#define IOK_ALIBI_T
#endif

#if defined(CAUSAL) || defined(WINDOW)
#define IOK_BAND 1
#endif

// The block's place in a grid (X, 1, Z) of a block per (X index, head): blockIdx.x and .z, or with HEAD_BAND
// (iokernels/plan/fast.py head_band; it divides Z) the grid taken in bands of HEAD_BAND heads, the band's blocks in
// order of x across its heads (x 0 of each head, then x 1, ...). The hardware hands blocks out in grid order: with the
// longest blocks at x 0 (a causal grid's), the grid then ends on short blocks, where one head's blocks in order leave
// the last head's longest block near its end, while the blocks in flight still share a few heads' tiles in the L2.
#ifdef HEAD_BAND
__device__ __forceinline__ int iok_band_block() { return blockIdx.x + blockIdx.z * gridDim.x; }
#define IOK_GRID_X (iok_band_block() % (HEAD_BAND * static_cast<int>(gridDim.x)) / HEAD_BAND)
#define IOK_GRID_Z                                                                                                    \
    (iok_band_block() / (HEAD_BAND * static_cast<int>(gridDim.x)) * HEAD_BAND + iok_band_block() % HEAD_BAND)
#else
#define IOK_GRID_X static_cast<int>(blockIdx.x)
#define IOK_GRID_Z static_cast<int>(blockIdx.z)
#endif

// A decode's cache (iokernels/plan/kvcache.py): a kernel compiled with RAGGED takes the sequences' lengths (int32, one
// per sequence), the number of sequences and the keys appended to each (a sequence of length n attends to n +
// seq_add keys) after the window (IOK_CACHE_PARAM) and names them in its counters (IOK_CACHE_T); with PAGED (the
// page size: a paged pool read through the page table) also the page table (batch, max_pages) of int32 page numbers
// and its columns.
#ifdef RAGGED
#ifdef PAGED
#define IOK_CACHE_PARAM const int *__restrict__ seqlens, const int batch, const int seq_add, \
    const int *__restrict__ page_table, const int max_pages,
#define IOK_CACHE_T , IOK_T_seqlens, IOK_T_page_table
#else
#define IOK_CACHE_PARAM const int *__restrict__ seqlens, const int batch, const int seq_add,
#define IOK_CACHE_T , IOK_T_seqlens
#endif
#else
#define IOK_CACHE_PARAM
#define IOK_CACHE_T
#endif

// A variable-length batch (iokernels/plan/varlen.py): a kernel compiled with VARLEN takes the sequences' offsets into
// the packed query and key rows (cu_seqlens_q, cu_seqlens_k: B + 1 int32 each) after the cache (IOK_VARLEN_PARAM) and
// names them in its counters (IOK_VARLEN_T); its n_q and n_k arguments are the packed rows.
#ifdef VARLEN
#define IOK_VARLEN_PARAM const int *__restrict__ cu_seqlens_q, const int *__restrict__ cu_seqlens_k,
#define IOK_VARLEN_T , IOK_T_cu_seqlens_q, IOK_T_cu_seqlens_k
#else
#define IOK_VARLEN_PARAM
#define IOK_VARLEN_T
#endif

// Block-sparse attention (iokernels/plan/masks.py): a kernel compiled with BLOCK_SPARSE (a stage parameter of
// block-sparse plans) takes the plan's block mask, T_r x T_c bytes on its tile grid shared by every batch and
// head, as the argument before the counters (IOK_BLOCK_MASK_PARAM), names it in its counters
// (IOK_BLOCK_MASK_T) and skips the (query block, key block) pairs whose byte is 0.
#ifdef BLOCK_SPARSE
#define IOK_BLOCK_MASK_PARAM const unsigned char *__restrict__ block_mask,
#define IOK_BLOCK_MASK_T , IOK_T_block_mask
#else
#define IOK_BLOCK_MASK_PARAM
#define IOK_BLOCK_MASK_T
#endif
// Explicit masks (iokernels/plan/masks.py ExplicitMask): a kernel compiled with MASK (1 boolean: uint8, 0 hides;
// 2 additive: float32 added to τS, −inf hides) takes the mask tensor (1 or batch·heads rows of N_q x N_k,
// MASK_BH_STRIDE 0 or 1) as the argument after the block mask (IOK_MASK_PARAM), names it in its counters
// (IOK_MASK_T) and reads each element of every pair it computes once, through iok_apply_mask.
#ifdef MASK
static_assert(MASK == 1 || MASK == 2, "MASK is 1 (boolean) or 2 (additive)");
static_assert(MASK_BH_STRIDE == 0 || MASK_BH_STRIDE == 1, "MASK_BH_STRIDE is 0 (shared) or 1 (per batch-head)");
#if MASK == 1
typedef unsigned char iok_mask_t;
#else
typedef float iok_mask_t;
#endif
#define IOK_MASK_PARAM const iok_mask_t *__restrict__ mask,
#define IOK_MASK_T , IOK_T_mask
#else
#define IOK_MASK_PARAM
#define IOK_MASK_T
#endif
// Dropout on P (iokernels/plan/dropout.py, which defines the stream): a kernel compiled with DROPOUT takes four
// arguments after the masks (IOK_DROPOUT_PARAM): the keep threshold t (0..255: an element is kept iff its random
// byte >= t), the keep scale 256 / (256 - t) (float32), the 64-bit seed and the 32-bit offset. The mask is never
// stored: every kernel that needs element (bh, i, j)'s multiplier regenerates it (iok_keep16, iok_dropout).
#ifdef DROPOUT
#define IOK_DROPOUT_PARAM const unsigned int dropout_threshold, const float dropout_scale, \
    const unsigned long long dropout_seed, const unsigned int dropout_offset,
#define IOK_DROPOUT_ARGS dropout_threshold, dropout_scale, dropout_seed, dropout_offset
#else
#define IOK_DROPOUT_PARAM
#endif

// Philox4x32-10 (Random123): 10 rounds of the 4x32 Philox bijection of `ctr` under `key`.
struct IokPhilox {
    unsigned int x, y, z, w;
};
__device__ __forceinline__ IokPhilox iok_philox4x32_10(unsigned int c0, unsigned int c1, unsigned int c2,
                                                       unsigned int c3, unsigned int k0, unsigned int k1)
{
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return {c0, c1, c2, c3};
}

// Per byte of w: bit b (b < 4) of the result is set iff byte b (the low byte first) >= t (t < 256). SWAR: the low
// seven bits compare in (w | H) - (t & ~H) without borrows between bytes; the high bits settle the rest.
__device__ __forceinline__ unsigned int iok_keep4(unsigned int w, unsigned int t)
{
    constexpr unsigned int H = 0x80808080u;
    const unsigned int y = t * 0x01010101u;
    const unsigned int low = (w | H) - (y & ~H);           // high bit of each byte: w's low 7 bits >= t's
    const unsigned int ge = ((low & ~(w ^ y)) | (w & ~y)) & H;  // the byte compare
    return (ge * 0x00204081u) >> 28;                       // bits 7, 15, 23, 31 -> 0..3
}

// The keep bits of keys 16 (j / 16) ... 16 (j / 16) + 15 of row i of batch-head bh: bit e set iff element (bh, i,
// 16 (j / 16) + e) is kept (byte e of one Philox call).
__device__ __forceinline__ unsigned int iok_keep16(unsigned int threshold, unsigned long long seed,
                                                   unsigned int offset, unsigned int bh, unsigned int i,
                                                   unsigned int j)
{
    const IokPhilox r = iok_philox4x32_10(j >> 4, i, bh, offset, static_cast<unsigned int>(seed),
                                          static_cast<unsigned int>(seed >> 32));
    return iok_keep4(r.x, threshold) | (iok_keep4(r.y, threshold) << 4) | (iok_keep4(r.z, threshold) << 8)
           | (iok_keep4(r.w, threshold) << 12);
}

// Z_ij: dropout_scale where element (bh, i, j) is kept, 0 where it is dropped.
__device__ __forceinline__ float iok_dropout(unsigned int threshold, float keep_scale, unsigned long long seed,
                                             unsigned int offset, unsigned int bh, unsigned int i, unsigned int j)
{
    return (iok_keep16(threshold, seed, offset, bh, i, j) >> (j & 15u)) & 1u ? keep_scale : 0.0f;
}

// P_ij *= Z_ij over row i of a tile (p: its cols elements from key col0 on), by one warp: each lane draws the keep
// bits of one aligned group of 16 keys (one Philox call) and applies those that fall in the tile.
__device__ __forceinline__ void iok_drop_row(float* p, int cols, unsigned int bh, unsigned int i, int col0,
                                             unsigned int threshold, float keep_scale, unsigned long long seed,
                                             unsigned int offset, int lane)
{
    const int g_end = ((col0 + cols - 1) >> 4) + 1;
    for (int g = (col0 >> 4) + lane; g < g_end; g += 32) {
        const unsigned int keep = iok_keep16(threshold, seed, offset, bh, i, static_cast<unsigned int>(g) << 4);
#pragma unroll
        for (int w = 0; w < 16; ++w) {
            const int c = 16 * g + w - col0;
            if (c >= 0 && c < cols) p[c] *= (keep >> w) & 1u ? keep_scale : 0.0f;
        }
    }
}

// Rows that may see no key at all (causal, block-sparse, explicit masks): O = 0 and lse = −inf there, never NaN.
#if defined(CAUSAL) || defined(BLOCK_SPARSE) || defined(MASK)
#define IOK_EMPTY_ROWS 1
#endif

// Scratch iok_flush needs: one (read, written) pair of u64 per warp.
#define IOK_FLUSH_SCRATCH_BYTES(nthreads) ((((nthreads) + 31) / 32) * 16)

// Position of tensor T in the pack Ts, or -1.
template <int T, int... Ts>
__host__ __device__ constexpr int iok_slot()
{
    constexpr int ids[] = {Ts...};
    for (int i = 0; i < static_cast<int>(sizeof...(Ts)); ++i) {
        if (ids[i] == T) return i;
    }
    return -1;
}

template <int... Ts>
__host__ __device__ constexpr bool iok_valid_tensors()
{
    constexpr int ids[] = {Ts...};
    for (int i = 0; i < static_cast<int>(sizeof...(Ts)); ++i) {
        if (ids[i] < 0 || ids[i] >= IOK_NUM_TENSORS) return false;
        for (int j = 0; j < i; ++j) {
            if (ids[j] == ids[i]) return false;
        }
    }
    return true;
}

// Makes a parameter a non-deduced context: the stored type comes from the pointer alone, so
// iok_st<IOK_T_O>(c, half_ptr, float_value) converts instead of failing deduction.
template <typename X> struct iok_same { using type = X; };

// Counters only for the tensors a kernel names: a flush costs barriers per tensor, so all
// IOK_NUM_TENSORS of them in every kernel would be slow and bloat the code.
#ifdef IOK_COUNT
template <int... Ts>
struct IokCounters {
    static_assert(sizeof...(Ts) > 0 && iok_valid_tensors<Ts...>(), "IokCounters<IOK_T_...>: distinct tensors");
    enum : bool { counting = true };  // an enumerator, so no device variable is emitted
    // Per thread, in registers: slots are template constants, never indexed at run time.
    unsigned long long r[sizeof...(Ts)] = {};
    unsigned long long w[sizeof...(Ts)] = {};
};
#else
template <int... Ts>
struct IokCounters {  // plain build: empty, the helpers below are the bare accesses
    static_assert(sizeof...(Ts) > 0 && iok_valid_tensors<Ts...>(), "IokCounters<IOK_T_...>: distinct tensors");
    enum : bool { counting = false };
};
#endif

// Rule 6: each helper counts in the same code path as its access.
template <int T, typename X, int... Ts>
__device__ __forceinline__ X iok_ld(IokCounters<Ts...>& c, const X* p)
{
    constexpr int slot = iok_slot<T, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) c.r[slot] += sizeof(X);
    return *p;
}

template <int T, typename X, int... Ts>
__device__ __forceinline__ void iok_st(IokCounters<Ts...>& c, X* p, typename iok_same<X>::type v)
{
    constexpr int slot = iok_slot<T, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) c.w[slot] += sizeof(X);
    *p = v;
}

// Rule 4: a read-modify-write of b bytes counts b read and b written.
template <int T, typename X, int... Ts>
__device__ __forceinline__ X iok_atomic_add(IokCounters<Ts...>& c, X* p, typename iok_same<X>::type v)
{
    constexpr int slot = iok_slot<T, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) {
        c.r[slot] += sizeof(X);
        c.w[slot] += sizeof(X);
    }
    return atomicAdd(p, v);
}

// cp.async (sm_80+) of one 16-byte chunk, global -> shared, counted as 16 bytes read of tensor T.
// With valid == false the chunk is zero-filled and nothing is read or counted (src-size 0; the
// source pointer must still point into the tensor). Pair with iok_cp_async_commit / _wait.
template <int T, typename X, int... Ts>
__device__ __forceinline__ void iok_cp_async16(IokCounters<Ts...>& c, X* smem_dst, const X* gmem_src, bool valid)
{
    constexpr int slot = iok_slot<T, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) c.r[slot] += valid ? 16u : 0u;
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(valid ? 16 : 0));
}

// ... of the first `bytes` (0 to 16) of a 16-byte chunk, the rest zero-filled; counted as those bytes.
template <int T, typename X, int... Ts>
__device__ __forceinline__ void iok_cp_async_part(IokCounters<Ts...>& c, void* smem_dst, const X* gmem_src, int bytes)
{
    constexpr int slot = iok_slot<T, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) c.r[slot] += static_cast<unsigned>(bytes);
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(bytes));
}

__device__ __forceinline__ void iok_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void iok_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#ifdef VARLEN
// Sequence b's rows in the packed tensors (one thread reads them, counted): rows[0], rows[1] its first query row and one
// past its last, rows[2], rows[3] its keys'. Each offset is clamped to the packed rows (n_q, n_k) and to the one before
// it, so offsets out of range or out of order (bad input the host cannot see without a copy) give a shorter, longer or
// empty sequence, never a copy or a store outside the tensors.
template <int... Ts>
__device__ __forceinline__ void iok_varlen_rows(IokCounters<Ts...>& c, const int* cu_seqlens_q, const int* cu_seqlens_k,
                                                int b, int n_q, int n_k, int (&rows)[4])
{
    rows[0] = min(max(iok_ld<IOK_T_cu_seqlens_q>(c, cu_seqlens_q + b), 0), n_q);
    rows[1] = min(max(iok_ld<IOK_T_cu_seqlens_q>(c, cu_seqlens_q + b + 1), rows[0]), n_q);
    rows[2] = min(max(iok_ld<IOK_T_cu_seqlens_k>(c, cu_seqlens_k + b), 0), n_k);
    rows[3] = min(max(iok_ld<IOK_T_cu_seqlens_k>(c, cu_seqlens_k + b + 1), rows[2]), n_k);
}
// Where packed row r of head z lies, in rows of HEAD_D elements (rows: the packed rows of a head, heads: the heads of a
// row), and the step from one packed row to the next. By default a row's heads lie together, (total, heads, d); with
// VARLEN_HEAD_MAJOR a head's rows do, (heads, total, d): the dense (B·H, N, d) layout, a sequence per document of
// every head (document masking, iokernels/plan/varlen.py)
__device__ __forceinline__ size_t iok_varlen_at(int r, int z, [[maybe_unused]] int rows, [[maybe_unused]] int heads)
{
#ifdef VARLEN_HEAD_MAJOR
    return static_cast<size_t>(z) * rows + r;
#else
    return static_cast<size_t>(r) * heads + z;
#endif
}
__device__ __forceinline__ int iok_varlen_step([[maybe_unused]] int heads)
{
#ifdef VARLEN_HEAD_MAJOR
    return 1;
#else
    return heads;
#endif
}
#endif

#ifdef BLOCK_SPARSE
// Whether pair (i, j) of the tile grid (t_c key blocks) is computed. Thread 0 reads its byte, counted once
// per block and visit; the barrier hands it to every thread, so all threads of the block call this together.
template <int... Ts>
__device__ __forceinline__ bool iok_block_kept(IokCounters<Ts...>& c, const unsigned char* block_mask, int i, int j,
                                               int t_c)
{
    int kept = 0;
    if (threadIdx.x == 0) kept = iok_ld<IOK_T_block_mask>(c, block_mask + static_cast<size_t>(i) * t_c + j) != 0;
    return __syncthreads_or(kept) != 0;
}

// The kept blocks of one row (or column) of the tile grid, for kernels whose loop runs over a list (the sm_90 tma
// kernels): one warp reads the bytes of blocks first, first + 1, ..., first + count - 1 (entry b at
// grid[b * stride]; 32 ROUND at a time, their loads issued together, each byte counted once) and writes the kept ones' places in that range (b - first),
// in order, to kept[0 .. n) of shared memory; returns n in every lane. With MASK_MOD a byte of 1 marks a partial block,
// whose place has IOK_PARTIAL set, and one of 2 or more a full block (mask_mod is true on all of it).
#define IOK_PARTIAL 0x8000u
template <int ROUND, int... Ts>
__device__ __forceinline__ int iok_kept_blocks(IokCounters<Ts...>& c, const unsigned char* grid, int first, int count,
                                               int stride, unsigned short* kept, int lane)
{
    int n = 0;
    for (int b0 = 0; b0 < count; b0 += 32 * ROUND) {
        unsigned char v[ROUND];
#pragma unroll
        for (int u = 0; u < ROUND; ++u) {
            const int b = b0 + 32 * u + lane;
            v[u] = b < count ? iok_ld<IOK_T_block_mask>(c, grid + static_cast<size_t>(first + b) * stride) : 0;
        }
#pragma unroll
        for (int u = 0; u < ROUND; ++u) {
            const unsigned ballot = __ballot_sync(0xffffffffu, v[u] != 0);
#ifdef MASK_MOD
            const unsigned flag = v[u] == 1 ? IOK_PARTIAL : 0u;  // a partial block: mask_mod evaluated in it
#else
            constexpr unsigned flag = 0;
#endif
            if (v[u] != 0) {
                kept[n + __popc(ballot & ((1u << lane) - 1u))] = static_cast<unsigned short>((b0 + 32 * u + lane) | flag);
            }
            n += __popc(ballot);
        }
    }
    return n;
}
#endif

// Programmable variants (iokernels/plan/mods.py, with_mods): MASK_MOD, SCORE_MOD and SCORE_GRAD are a user's C
// expressions, one line each, over the ints b, h (the batch and head of a query head), q_idx, kv_idx, n_q, n_k and
// (not in MASK_MOD) the float score, τ s; SCORE_GRAD is d SCORE_MOD / d score at the same score. MOD_CAPS declares the
// captured arrays, IOK_CAP(type, name, slot) each, read through counted accessors (tensor "captures"). A kernel compiled
// with them takes the heads per batch and four capture addresses after ALiBi's slopes (IOK_MOD_PARAM). Every element
// of a computed tile is evaluated (a query or key past the problem's end with its last one's index): mask_mod first
// (in a tile the block mask marks full, not at all), then score_mod and its gradient where the mask keeps it.
#if defined(MASK_MOD) || defined(SCORE_MOD) || defined(MOD_STAGE)
#define IOK_MODS 1
#define IOK_MOD_PARAM const int mod_heads, const void* __restrict__ cap0, const void* __restrict__ cap1, \
    const void* __restrict__ cap2, const void* __restrict__ cap3,
#define IOK_MOD_T , IOK_T_captures
#ifndef MOD_CAPS
#define MOD_CAPS
#endif
struct IokMod {  // what an expression reads besides its element's place and score
    const void* cap[4];
    int heads, n_q, n_k;
};
template <typename E>
struct IokCapValue {  // what name[i] gives: the element, a float for a __half one (no __half arithmetic in user code)
    using type = E;
    __device__ static E of(E x) { return x; }
};
template <>
struct IokCapValue<__half> {
    using type = float;
    __device__ static float of(__half x) { return __half2float(x); }
};
template <typename E, typename IO>
struct IokCap {  // a captured array: name[i] is a counted load
    const E* p;
    IO& io;
    // (a plain load, which the compiler may share among the elements of a tile)
    __device__ __forceinline__ typename IokCapValue<E>::type operator[](long long i) const
    {
        return IokCapValue<E>::of(iok_ld<IOK_T_captures>(io, p + i));
    }
};
#define IOK_CAP(type, name, slot) [[maybe_unused]] const IokCap<type, IO> name{static_cast<const type*>(m.cap[slot]), io};
#define IOK_MOD_VARS                                                                                         \
    [[maybe_unused]] const int b = z / m.heads, h = z % m.heads, n_q = m.n_q, n_k = m.n_k;                    \
    MOD_CAPS
#ifdef MASK_MOD
template <typename IO>
__device__ __forceinline__ bool iok_mask_mod(IO& io, const IokMod& m, int z, int q_idx, int kv_idx)
{
    IOK_MOD_VARS
    return static_cast<bool>(MASK_MOD);
}
#endif
#ifdef SCORE_MOD
template <typename IO>
__device__ __forceinline__ float iok_score_mod(IO& io, const IokMod& m, int z, int q_idx, int kv_idx, float score)
{
    IOK_MOD_VARS
    return static_cast<float>(SCORE_MOD);
}
#endif
#ifdef SCORE_GRAD
template <typename IO>
__device__ __forceinline__ float iok_score_grad(IO& io, const IokMod& m, int z, int q_idx, int kv_idx, float score)
{
    IOK_MOD_VARS
    return static_cast<float>(SCORE_GRAD);
}
#endif
#ifdef MOD_STAGE
// MOD_STAGE (iokernels/plan/mods.py staging): an explicit mask's read X[R + kv_idx] in place of the expression that
// holds it (MOD_STAGE_FORM 1: a score_mod score + X[...]; 2: a mask_mod X[...] != 0), X capture slot MOD_STAGE_SLOT
// of C type MOD_STAGE_T, R the expression MOD_STAGE of b, h, q_idx (n_q, n_k): the offset of row q_idx's key 0
__device__ __forceinline__ long long iok_stage_row(const IokMod& m, int z, int q_idx)
{
    [[maybe_unused]] const int b = z / m.heads, h = z % m.heads, n_q = m.n_q, n_k = m.n_k;
    return static_cast<long long>(MOD_STAGE);
}
// two adjacent staged elements (a row's keys k, k + 1) as floats
__device__ __forceinline__ float2 iok_stage_pair(const unsigned char* p)
{
    if constexpr (sizeof(MOD_STAGE_T) == 1) {
        const uchar2 u = *reinterpret_cast<const uchar2*>(p);
        return make_float2(u.x, u.y);
    } else if constexpr (sizeof(MOD_STAGE_T) == 2) {
        return __half22float2(*reinterpret_cast<const __half2*>(p));
    } else {
        return *reinterpret_cast<const float2*>(p);
    }
}
#endif
#ifdef MOD_PREFETCH
// MOD_PREFETCH (iokernels/plan/modspec.py Mods.prefetch): the index, an expression of b, h, q_idx, kv_idx, n_q, n_k,
// of the element of capture MOD_PREFETCH_SLOT (of C type MOD_PREFETCH_T) that the mods read first for an element of S:
// its line prefetched into the L2 (prefetch.global.L2; not a read of the kernel's: not counted, the loads that follow
// are)
__device__ __forceinline__ void iok_mod_prefetch(const IokMod& m, int z, int q_idx, int kv_idx)
{
    [[maybe_unused]] const int b = z / m.heads, h = z % m.heads, n_q = m.n_q, n_k = m.n_k;
    const MOD_PREFETCH_T* p = static_cast<const MOD_PREFETCH_T*>(m.cap[MOD_PREFETCH_SLOT]) + (MOD_PREFETCH);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
#endif
// s (an element of S in units of s, τ its scale, inv 1 / τ) through the mods, −inf where mask_mod hides it (`partial`:
// its tile is not one the block mask marks full)
template <typename IO>
__device__ __forceinline__ float iok_mod_s(IO& io, const IokMod& m, int z, int q_idx, int kv_idx, float s,
                                           [[maybe_unused]] float scale, [[maybe_unused]] float inv,
                                           [[maybe_unused]] bool partial)
{
#ifdef MASK_MOD
    if (partial && !iok_mask_mod(io, m, z, q_idx, kv_idx)) return __int_as_float(static_cast<int>(0xff800000u));
#endif
#ifdef SCORE_MOD
    s = iok_score_mod(io, m, z, q_idx, kv_idx, s * scale) * inv;  // (× 1 / τ: a division is a dozen instructions)
#endif
    return s;
}
#else
#define IOK_MOD_PARAM
#define IOK_MOD_T
#endif

#ifdef MASK
__device__ __forceinline__ float iok_neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

// The first mask element of batch·head z (MASK_BH_STRIDE 0: the one shared mask).
__device__ __forceinline__ const iok_mask_t* iok_mask_rows(const iok_mask_t* mask, size_t z, int n_q, int n_k)
{
    return mask + z * MASK_BH_STRIDE * static_cast<size_t>(n_q) * n_k;
}

// x (τS of one element) with its mask element p applied, read and counted here: −inf where it hides.
template <int... Ts>
__device__ __forceinline__ float iok_apply_mask(IokCounters<Ts...>& c, const iok_mask_t* p, float x)
{
    const iok_mask_t m = iok_ld<IOK_T_mask>(c, p);
#if MASK == 1
    return m != 0 ? x : iok_neg_inf();
#else
    return m == iok_neg_inf() ? iok_neg_inf() : x + m;  // −inf hides whatever x is
#endif
}
#endif

#ifdef IOK_COUNT

// Sum of x over the lanes in mask, in every lane of mask (the last warp of a block may be partial).
// redux.sync (sm_80+) adds 32-bit values in one instruction; x goes through it in 27/27/10-bit parts,
// so no part's sum over 32 lanes can overflow (32 * 2^27 = 2^32), and few registers stay live.
__device__ __forceinline__ unsigned long long iok_warp_sum(unsigned long long x, unsigned mask)
{
    constexpr unsigned long long low27 = (1ull << 27) - 1;
    const unsigned a = __reduce_add_sync(mask, static_cast<unsigned>(x & low27));
    const unsigned b = __reduce_add_sync(mask, static_cast<unsigned>((x >> 27) & low27));
    const unsigned c = __reduce_add_sync(mask, static_cast<unsigned>(x >> 54));
    return a + (static_cast<unsigned long long>(b) << 27) + (static_cast<unsigned long long>(c) << 54);
}

// Adds the block's bytes to its slot of global_counters: [slot][2*T] (read) and [slot][2*T+1]
// (written), slot = linear block index % IOK_COUNTER_SLOTS. Blocks spread over the slots so that
// tens of thousands of them do not serialise on one address (the launcher sums the slots).
// Every thread of the block calls it once, after its last counted access. scratch_smem is the
// kernel's own shared memory, reused (the first barrier waits until the block is done with it); it
// must be 16-byte aligned and hold IOK_FLUSH_SCRATCH_BYTES(threads per block) bytes. When the kernel
// declares (SMEM_BYTES) room for every warp's partials of every tensor, all tensors reduce behind one
// barrier; otherwise one tensor at a time through the minimal scratch (2 barriers per tensor).
template <int... Ts>
__device__ __forceinline__ void iok_flush(IokCounters<Ts...>& c, unsigned long long* global_counters,
                                          void* scratch_smem)
{
    constexpr int NT = static_cast<int>(sizeof...(Ts));
    constexpr int ids[] = {Ts...};
    const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned nwarps = (nthreads + 31u) >> 5;
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = tid & 31u, warp = tid >> 5;
    const unsigned lanes = min(32u, nthreads - (tid & ~31u));
    const unsigned mask = lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u;
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned long long* slot = global_counters + (block % IOK_COUNTER_SLOTS) * (2 * IOK_NUM_TENSORS);
    ulonglong2* scratch = static_cast<ulonglong2*>(scratch_smem);

#if defined(SMEM_BYTES) && defined(THREADS)
    constexpr bool wide = SMEM_BYTES >= (THREADS + 31) / 32 * 16 * NT;
#else
    constexpr bool wide = false;
#endif
    __syncthreads();  // the kernel may still be reading the shared memory used as scratch
    if constexpr (wide) {
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const unsigned long long r = iok_warp_sum(c.r[i], mask), w = iok_warp_sum(c.w[i], mask);
            if (lane == 0) scratch[warp * NT + i] = make_ulonglong2(r, w);
        }
        __syncthreads();  // every warp's partials of every tensor visible
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            if (tid == static_cast<unsigned>(i)) {  // one thread per tensor; static indices stay in registers
                unsigned long long r = 0, w = 0;
                for (unsigned k = 0; k < nwarps; ++k) {
                    r += scratch[k * NT + i].x;
                    w += scratch[k * NT + i].y;
                }
                // Rule 5: once per block, not per element.
                if (r != 0) atomicAdd(slot + 2 * ids[i], r);
                if (w != 0) atomicAdd(slot + 2 * ids[i] + 1, w);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            unsigned long long r = iok_warp_sum(c.r[i], mask), w = iok_warp_sum(c.w[i], mask);
            if (lane == 0) scratch[warp] = make_ulonglong2(r, w);
            __syncthreads();  // per-warp partials visible to thread 0
            if (tid == 0) {
                for (unsigned k = 1; k < nwarps; ++k) {
                    r += scratch[k].x;
                    w += scratch[k].y;
                }
                // Rule 5: once per block, not per element.
                if (r != 0) atomicAdd(slot + 2 * ids[i], r);
                if (w != 0) atomicAdd(slot + 2 * ids[i] + 1, w);
            }
            __syncthreads();  // thread 0 has read scratch before the next tensor overwrites it
        }
    }
}

#else

// No barrier either: kernels must not rely on iok_flush to synchronize.
template <int... Ts>
__device__ __forceinline__ void iok_flush(IokCounters<Ts...>&, unsigned long long*, void*)
{
}

#endif  // IOK_COUNT
#line 1 "flash_tma.cu"
// Tensor-core FlashAttention forward for sm_90a with a producer warp (issue #21: TMA loads on mbarriers, warp
// specialization, register reallocation, the FlashAttention-3 overlap). The math is flash_wgmma.cu's (the q_outer
// loop order and bytes, wgmma products, online softmax in registers, CAUSAL and DROPOUT as there; WINDOW, a sliding
// window, visits the key tiles [kt0, kt0 + tiles) of the block's band only); how the tiles move and when the
// products are issued differ:
//
// A block is BR / 64 consumer warpgroups (query rows [64 w, 64 w + 64) each) and one producer warpgroup
// (THREADS = 2 BR + 128). The producer gives up registers (setmaxnreg.dec: 24 with two consumer warpgroups, 40 in
// the counting build, 32 with three; the consumers take 240, 232 or 160) and one of its threads issues every copy:
// Q_i once, then K_0, and K_{j+1} before V_j, into two-stage rings, each tile as TILE_D / 64 TMA boxes of 64
// columns (kernels/tma.cuh; the maps from kernels/tensormap.py, one head at a time, so rows past N are zero-filled,
// never read) that land 128-byte swizzled as wgmma reads them. Stage s has a "full" barrier (the producer's
// expect_tx plus the copies' bytes) and an "empty" one (one arrival per consumer warp, after its product has read
// the stage). No block-wide barrier runs between the roles: every thread meets again only in iok_flush (the
// counting build).
//
// A consumer warpgroup's step j issues S_j = Q K_jᵀ and then O += P_{j-1} V_{j-1} (P from registers), waits for
// the first, masks and exponentiates S_j while the second runs, then waits for it, rescales O and rounds P_j into
// the registers the next step's product reads; the last P V follows the loop. The warpgroups take turns issuing
// (named barriers 1 .. BR / 64, each warpgroup releasing the next), so one's softmax overlaps another's products.
//
// CAUSAL without PERSISTENT runs a block per item, each head's rows last to first (the longest first), the heads in
// turn or, with HEAD_BAND, in bands of heads (common.cuh IOK_GRID_X).
//
// SPLIT (the split-KV decode, iokernels/plan/decode.py): the host passes the g query heads of each K/V head as one
// head of g·N_q packed rows (n_q, bh: the packed rows and the batch·K/V heads; kv_group 1); block (x, s, z) takes key
// tiles [s c, s c + c) of its item, c = ⌈T_c / S⌉ (S = gridDim.y, a split count the plan made with none empty), and
// writes its normalized float32 O and lse, the split's partials, to Opart and lse_part (S, bh, n_q[, d]), which
// combine.cu merges.
//
// PACKED_CAUSAL (the decode's causal mask on packed rows, bottom-right): packed row r is query position r % q_len of
// its head (q_len, an argument: the queries per head), which sees the keys up to keys - q_len + r % q_len; only the
// tiles past keys - q_len hold masked elements, and a row may see no key of a split (its partial: O = 0, lse -inf).
//
// VARLEN (a variable-length batch, iokernels/plan/varlen.py): Q, O as (total_q, heads, d) and K, V as (total_k,
// kv_heads, d), packed; block (x, b, z) takes query tile x of sequence b (its rows [cu_q[b], cu_q[b + 1]), read first
// with its keys' [cu_k[b], cu_k[b + 1])) for head z: n_q and n_k become the sequence's lengths (CAUSAL per sequence),
// the copies' rows are offset by the sequence's first and bounded by the packed rows (n_q, n_k as passed), and its
// last V tile's rows past the sequence (the next one's) are zeroed as RAGGED's are. O rows and lse (total_q, heads)
// are stored at their packed rows; a tile past the sequence's end does nothing. VARLEN_HEAD_MAJOR: every tensor a
// head's rows together, (heads, total, d) (common.cuh iok_varlen_at): the dense layout, a sequence per document.
//
// SOFTCAP (iokernels/plan/variants.py with_softcap): the logits τ s become c tanh(τ s / c) before the masks.
//
// ALIBI (iokernels/plan/variants.py with_alibi): thread 0 reads the block's head's slope before the roles part; the
// logits (after the softcap) get −slope |key − row − (n_k − n_q)| before the masks.
//
// MASK_MOD, SCORE_MOD (iokernels/plan/mods.py with_mods; common.cuh iok_mod_s): the user's expressions applied to
// every element of a tile inside the problem after ALiBi's place, before the masks; with BLOCK_SPARSE mask_mod only in
// the tiles the block mask marks partial. MOD_PREFETCH (the element the mods read first, one captured array's, at an
// index of b, h, q_idx, kv_idx: an explicit mask's): tile j + 1's lines of it prefetched into the L2 in step j.
// MOD_STAGE (an explicit mask's read X[R + kv_idx], rows 16-byte aligned): in step j each warp copies its 16 rows of
// tile j + 1's elements by cp.async into its rows of SMEM_STAGE (16-byte pieces; past N_q and the keys zero-filled,
// not read), and step j + 1 reads them there in pairs (the bias added, or −inf where the byte is 0).
//
// BLOCK_SPARSE (block-sparse plans, the paper's Algorithm 5; iokernels/plan/masks.py): before the roles part, warp 0
// reads the block's row of the grid (T_r x T_c bytes, the key tiles of its band; common.cuh iok_kept_blocks) into a
// list of the kept key tiles in shared memory (BLOCK_LIST entries at most), and the item's steps run over that list:
// step j takes key tile kept[j], the same loop as without a mask. A row with no kept tile loads nothing and writes
// O = 0, lse -inf.
//
// Counting: the producer counts the bytes a copy reads (its rows inside the tensor, HEAD_D T each), the
// consumers count O and lse (SPLIT: Opart and lse_part) as flash_wgmma.cu does; the model is q_outer's (SPLIT: the
// decode's, iokernels/model/hbm.py).


#line 1 "tiles.cuh"
// Tile helpers shared by the research attention kernels (flash_fwd.cu, two_pass.cu): conversions,
// 16-byte row moves through the counted loads and stores, and the products S = τ Q Kᵀ and O += P V
// over the plan's shared-memory tiles (register micro-tiles on CUDA cores; mma.sync tensor cores
// for float16 / bfloat16). build_source inlines it where a
// kernel includes it; it expects common.cuh and the plan's defines (THREADS, HEAD_D, BR, BC).
#pragma once


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

// mma.sync m16n8k16, float32 accumulators (sm_80 and newer): D += A B for 16 x 16 A (four registers of two
// T, row-major fragment) and 16 x 8 B (two registers, column-major fragment).
template <typename T>
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);

template <>
__device__ __forceinline__ void tc_mma<__half>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void tc_mma<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                                      unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two T (low half = first).
template <typename T>
__device__ __forceinline__ unsigned tc_pack(float lo, float hi)
{
    return to_bits(from_f<T>(lo)) | (to_bits(from_f<T>(hi)) << 16);
}

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

// S[r][c] = epi(r, c, Σ_k Qt[k][r] Kt[k][c]) for r < rows, c < cols (S row stride BC), on CUDA cores.
template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile_fma(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
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

// epi(r, n, Σ_c P[r][c] V[c][n]) for r < rows, n < HEAD_D, c < cols (P row stride BC), on CUDA cores.
template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile_fma(const float* P, const T* V, int rows, int cols, Epi epi)
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

// ---- the same two products on tensor cores -------------------------------------------------------
// For 16-bit T, HEAD_D % 16 == 0 and sm_80 or newer, S = τ Q Kᵀ and P V run as mma.sync m16n8k16 over
// the same shared-memory tiles (any B_r, B_c): each warp takes 16-row strips of up to MMA_NT 8-column
// tiles, building its fragments from shared memory with 16-bit loads (the tiles are transposed or
// unaligned for ldmatrix at arbitrary B_r, B_c); rows past the last whole 16 and columns past the last
// whole 8 (qk) or keys past the last whole 16 (pv) are summed on CUDA cores. P is rounded to T for the
// product, as in every FlashAttention kernel. Loads and stores, and so the counted bytes, are unchanged.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define IOK_MMA_ARCH 1
#else
#define IOK_MMA_ARCH 0
#endif
template <typename T> constexpr bool MMA_TILES = IOK_MMA_ARCH && sizeof(T) == 2 && HEAD_D % 16 == 0;

// 8-column tiles per warp strip: the most (of 4, 2, 1) that still gives every warp a strip.
__host__ __device__ constexpr int mma_nt(int row_strips, int col_tiles)
{
    return row_strips * ((col_tiles + 3) / 4) >= NWARPS ? 4 : row_strips * ((col_tiles + 1) / 2) >= NWARPS ? 2 : 1;
}

// p[0] and p[stride] as one register of two T (low half = p[0]).
template <typename T>
__device__ __forceinline__ unsigned mma_pair(const T* p, int stride)
{
    return to_bits(p[0]) | (to_bits(p[stride]) << 16);
}

template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile_mma(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
{
    constexpr int NT = mma_nt(BR / 16, BC / 8);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows16 = rows / 16 * 16, cols8 = cols / 8 * 8;
    const int groups = (cols8 / 8 + NT - 1) / NT, strips = rows16 / 16 * groups;
    for (int strip = warp; strip < strips; strip += NWARPS) {
        const int r0 = strip / groups * 16, c0 = strip % groups * 8 * NT;
        float acc[NT][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < HEAD_D; k0 += 16) {
            const T* q = Qt + (k0 + 2 * t) * BR + r0 + g;  // Q[r0 + g][k0 + 2t], Qt[k][r]
            const unsigned a[4] = {mma_pair(q, BR), mma_pair(q + 8, BR), mma_pair(q + 8 * BR, BR),
                                   mma_pair(q + 8 * BR + 8, BR)};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (c0 + 8 * j < cols8) {
                    const T* k = Kt + (k0 + 2 * t) * BC + c0 + 8 * j + g;  // Kᵀ[k0 + 2t][c], Kt[k][c]
                    tc_mma<T>(acc[j], a, mma_pair(k, BC), mma_pair(k + 8 * BC, BC));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (c0 + 8 * j < cols8) {
#pragma unroll
                for (int h = 0; h < 4; ++h) S[(r0 + g + 8 * (h / 2)) * BC + c0 + 8 * j + 2 * t + h % 2] = acc[j][h];
            }
        }
        // the epilogue row by row with lanes along the columns, so that what it reads or writes in HBM
        // (STORE_S, MASK) is coalesced as on CUDA cores
        __syncwarp();
        const int width = min(8 * NT, cols8 - c0);
        for (int i = lane; i < 16 * width; i += 32) {
            const int r = r0 + i / width, c = c0 + i % width;
            S[r * BC + c] = epi(r, c, S[r * BC + c]);
        }
    }
    // the ragged rest: rows [rows16, rows) x [0, cols), then rows [0, rows16) x [cols8, cols)
    const int tail_rows = (rows - rows16) * cols, tail_cols = cols - cols8;
    for (int i = threadIdx.x; i < tail_rows + rows16 * tail_cols; i += THREADS) {
        const int r = i < tail_rows ? rows16 + i / cols : (i - tail_rows) / tail_cols;
        const int c = i < tail_rows ? i % cols : cols8 + (i - tail_rows) % tail_cols;
        float acc = 0.0f;
        for (int kk = 0; kk < HEAD_D; ++kk) acc = fmaf(to_f(Qt[kk * BR + r]), to_f(Kt[kk * BC + c]), acc);
        S[r * BC + c] = epi(r, c, acc);
    }
}

template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile_mma(const float* P, const T* V, int rows, int cols, Epi epi)
{
    constexpr int NT = mma_nt(BR / 16, HEAD_D / 8);
    constexpr int GROUPS = (HEAD_D / 8 + NT - 1) / NT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows16 = rows / 16 * 16, cols16 = cols / 16 * 16;
    for (int strip = warp; strip < rows16 / 16 * GROUPS; strip += NWARPS) {
        const int r0 = strip / GROUPS * 16, n0 = strip % GROUPS * 8 * NT;
        float acc[NT][4] = {};
        const float* p0 = P + (r0 + g) * BC + 2 * t;  // P[r0 + g][2t]
        for (int c0 = 0; c0 < cols16; c0 += 16) {
            const float* p = p0 + c0;
            const unsigned a[4] = {tc_pack<T>(p[0], p[1]), tc_pack<T>(p[8 * BC], p[8 * BC + 1]),
                                   tc_pack<T>(p[8], p[9]), tc_pack<T>(p[8 * BC + 8], p[8 * BC + 9])};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (n0 + 8 * j < HEAD_D) {
                    const T* v = V + (c0 + 2 * t) * HEAD_D + n0 + 8 * j + g;  // V[c0 + 2t][n]
                    tc_mma<T>(acc[j], a, mma_pair(v, HEAD_D), mma_pair(v + 8 * HEAD_D, HEAD_D));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (n0 + 8 * j < HEAD_D) {
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const int r = r0 + g + 8 * (h / 2), n = n0 + 8 * j + 2 * t + h % 2;
                    float x = acc[j][h];
                    for (int c = cols16; c < cols; ++c) x = fmaf(P[r * BC + c], to_f(V[c * HEAD_D + n]), x);
                    epi(r, n, x);
                }
            }
        }
    }
    // rows [rows16, rows) on CUDA cores
    for (int i = threadIdx.x; i < (rows - rows16) * HEAD_D; i += THREADS) {
        const int r = rows16 + i / HEAD_D, n = i % HEAD_D;
        float x = 0.0f;
        for (int c = 0; c < cols; ++c) x = fmaf(P[r * BC + c], to_f(V[c * HEAD_D + n]), x);
        epi(r, n, x);
    }
}

// The products the research kernels call: tensor cores where MMA_TILES<T>, else CUDA cores.
template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
{
    if constexpr (MMA_TILES<T>) {
        qk_tile_mma(Qt, Kt, S, rows, cols, epi);
    } else {
        qk_tile_fma(Qt, Kt, S, rows, cols, epi);
    }
}

template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile(const float* P, const T* V, int rows, int cols, Epi epi)
{
    if constexpr (MMA_TILES<T>) {
        pv_tile_mma(P, V, rows, cols, epi);
    } else {
        pv_tile_fma(P, V, rows, cols, epi);
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

// dst (rows x HEAD_D of T, contiguous in HBM) = src (rows x HEAD_D float32) / div[r], each element once
// (CAUSAL, BLOCK_SPARSE: 0 where div[r] = 0, a row that saw no key).
template <int TENSOR, typename T, typename C>
__device__ __forceinline__ void store_rows_divided(C& io, T* dst, const float* src, const float* div, int rows)
{
    constexpr int VPR = HEAD_D / VEC<T>;
    for (int i = threadIdx.x; i < rows * VPR; i += THREADS) {
#ifdef IOK_EMPTY_ROWS
        const float inv = div[i / VPR] == 0.0f ? 0.0f : 1.0f / div[i / VPR];  // a row with no visible key: 0
#else
        const float inv = 1.0f / div[i / VPR];
#endif
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
#line 68 "flash_tma.cu"

#line 1 "wgmma.cuh"
// GENERATED by scripts/gen_wgmma.py; do not edit. sm_90a warpgroup matrix products (PTX wgmma):
//   wg_mma_ss<T, N>(d, da, db, scale_d):    d (64 x N, float32) = [d +] A B, A (64 x 16) and B (16 x N)
//       both from shared memory through descriptors, both K-major (no transpose);
//   wg_mma_rs_tb<T, N>(d, a, db, scale_d): the same with A from registers (the mma.sync m16n8k16 A
//       fragment of each warp's 16 rows) and B from shared memory MN-major (imm-trans-b = 1);
//   wg_mma_ss_tt<T, N>(d, da, db, scale_d): A and B from shared memory, both MN-major (imm-trans-a =
//       imm-trans-b = 1);
//   wg_mma_ss_tb<T, N>(d, da, db, scale_d): A K-major and B MN-major from shared memory (imm-trans-b = 1).
// scale_d = 0 overwrites d instead of accumulating. Accumulator register i of a warp holds row
// 16 * warp + g (+ 8 for i % 4 >= 2), column 8 * (i / 4) + 2 * t + (i % 2), g = lane / 4, t = lane % 4.
#pragma once

template <typename T, int N>
__device__ __forceinline__ void wg_mma_ss(float (&d)[N / 2], unsigned long long da, unsigned long long db,
                                          int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wg_mma_rs_tb(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db,
                                             int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wg_mma_ss_tt(float (&d)[N / 2], unsigned long long da, unsigned long long db,
                                             int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wg_mma_ss_tb(float (&d)[N / 2], unsigned long long da, unsigned long long db,
                                             int scale_d);

template <>
__device__ __forceinline__ void wg_mma_ss<__half, 64>(float (&d)[32], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__half, 64>(float (&d)[32], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tt<__half, 64>(float (&d)[32], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__half, 128>(float (&d)[64], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__half, 128>(float (&d)[64], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tt<__half, 128>(float (&d)[64], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__half, 192>(float (&d)[96], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, {%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__half, 256>(float (&d)[128], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
                   "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                   "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
                   "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
                   "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__half, 32>(float (&d)[16], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tb<__half, 192>(float (&d)[96], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tb<__half, 256>(float (&d)[128], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
                   "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                   "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
                   "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
                   "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__half, 176>(float (&d)[88], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__nv_bfloat16, 64>(float (&d)[32], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__nv_bfloat16, 64>(float (&d)[32], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tt<__nv_bfloat16, 64>(float (&d)[32], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__nv_bfloat16, 128>(float (&d)[64], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__nv_bfloat16, 128>(float (&d)[64], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tt<__nv_bfloat16, 128>(float (&d)[64], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__nv_bfloat16, 192>(float (&d)[96], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, {%96, %97, %98, %99}, %100, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_rs_tb<__nv_bfloat16, 256>(float (&d)[128], const unsigned (&a)[4],
                                                        unsigned long long db, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
                   "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                   "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
                   "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
                   "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__nv_bfloat16, 32>(float (&d)[16], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tb<__nv_bfloat16, 192>(float (&d)[96], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss_tb<__nv_bfloat16, 256>(float (&d)[128], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),
                   "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
                   "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                   "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
                   "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),
                   "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wg_mma_ss<__nv_bfloat16, 176>(float (&d)[88], unsigned long long da, unsigned long long db,
                                                     int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
                   "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
                   "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
                   "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
                   "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),
                   "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
                   "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                   "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
                 : "l"(da), "l"(db), "r"(scale_d));
}
#line 70 "flash_tma.cu"

#line 1 "wg.cuh"
// Shared-memory tiles and synchronisation for the sm_90a warpgroup kernels (flash_wgmma.cu,
// flash_wgmma_bwd.cu;
// the products themselves are in the generated wgmma.cuh).
//
// Tiles are stored the way wgmma reads them: TILE_D / 64 slabs of [rows][64 elements], 128-byte rows
// whose 16-byte chunks are XOR-swizzled by (row % 8) (the 128-byte swizzle), each slab 1024-byte
// aligned when the tile is. A K-major operand (the reduction runs along the 64-element rows) moves its
// descriptor by 32 bytes per 16-wide step inside a slab and by the slab's size from slab to slab; an
// MN-major operand (the reduction runs down the rows) moves by 16 rows (2048 bytes) per step, with the
// slab stride as the descriptor's leading byte offset.
#pragma once

#if !defined(HEAD_D) || !defined(THREADS)
#error "wg.cuh needs HEAD_D and THREADS from the plan"
#endif

// TILE_D: the tiles' width, a multiple of 64 (HEAD_D itself, or the plan's HEAD_D_TILE where the problem's d is
// not one); HEAD_D, the problem's d, is a multiple of 8 in its last 64-column slab. Columns past d are zero in
// every tile (the copy engine's fill, or wg_load_tile's), so they add nothing to a product; the row strides in
// global memory are HEAD_D's.
#ifdef HEAD_D_TILE
constexpr int TILE_D = HEAD_D_TILE;
#else
constexpr int TILE_D = HEAD_D;
#endif
static_assert(TILE_D % 64 == 0 && HEAD_D % 8 == 0 && TILE_D - 64 < HEAD_D && HEAD_D <= TILE_D,
              "d within its tile's last 64-column slab");

constexpr float WG_LOG2E = 1.4426950408889634f;
constexpr int WG_ROW_CHUNKS = TILE_D / 8;  // 16-byte chunks per row of a tile

// Element offset of (row, col) in a ROWS-row tile stored as 128-byte-swizzled slabs of 64 columns
// (the 16-byte chunk moves with the swizzle, the element keeps its place in the chunk).
template <int ROWS>
__device__ __forceinline__ int wg_off(int row, int col)
{
    return (col >> 6) * (ROWS * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// rows [0, rows_valid) of a ROWS-row, TILE_D-wide tile from global memory (row stride HEAD_D), 16 bytes
// per counted cp.async; rows past the end and columns past HEAD_D are zero-filled, nothing read, nothing
// counted (where TILE_D == HEAD_D the column test folds away at compile time).
template <int TI, int ROWS, typename T, typename C>
__device__ __forceinline__ void wg_load_tile(C& io, T* s, const T* g, int rows_valid)
{
#ifdef IOK_COUNT
#pragma unroll 1  // the counting build: fewer registers (its counters take some)
#else
#pragma unroll
#endif
    for (int q = threadIdx.x; q < ROWS * WG_ROW_CHUNKS; q += THREADS) {
        const int row = q / WG_ROW_CHUNKS, col = (q % WG_ROW_CHUNKS) * 8;
        const bool valid = row < rows_valid && (TILE_D == HEAD_D || col < HEAD_D);
        // a zero-filled chunk points into row 0 (always valid): its own column, or column 0 past HEAD_D
        const int src_col = TILE_D == HEAD_D || valid ? col : 0;
        iok_cp_async16<TI>(io, s + wg_off<ROWS>(row, col),
                           g + static_cast<size_t>(valid ? row : 0) * HEAD_D + src_col, valid);
    }
}

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading and
// stride byte offsets (16-byte units), 128-byte swizzle.
__device__ __forceinline__ unsigned long long wg_desc(const void* p, unsigned lead_bytes, unsigned stride_bytes)
{
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4)
           | (static_cast<unsigned long long>(lead_bytes >> 4) << 16)
           | (static_cast<unsigned long long>(stride_bytes >> 4) << 32) | (1ull << 62);
}
// K-major operand: step kk (16 wide) of a ROWS-row tile, starting at row row0.
template <int ROWS>
__device__ __forceinline__ unsigned long long wg_desc_k(const unsigned char* tile, int row0, int kk)
{
    return wg_desc(tile + row0 * 128 + (kk & 3) * 32 + (kk >> 2) * ROWS * 128, 16, 1024);
}
// MN-major operand: rows [16 kk, 16 kk + 16) of a ROWS-row tile, columns from slab slab0 on.
template <int ROWS>
__device__ __forceinline__ unsigned long long wg_desc_mn(const unsigned char* tile, int slab0, int kk)
{
    return wg_desc(tile + slab0 * ROWS * 128 + kk * 16 * 128, ROWS * 128, 1024);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of wgmma accumulators across the asynchronous products.
template <int N>
__device__ __forceinline__ void wg_fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Pins where registers are computed or first used (no memory clobber: nothing else is ordered).
template <int N>
__device__ __forceinline__ void wg_pin(unsigned (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]));
}
template <int N>
__device__ __forceinline__ void wg_fence_regs(unsigned (&r)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
    }
}
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to the async proxy's reads (wgmma,
// the copy engine's bulk copies); a barrier follows.
__device__ __forceinline__ void wg_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Two floats -> one register of two T (low half = first), each rounded to nearest even (tiles.cuh's tc_pack).
// bfloat16 through the packed intrinsic, one F2FP.BF16.F32.PACK_AB, the same bits: from two separate roundings
// ptxas packs only some pairs and leaves single F2F.BF16.F32 on the quarter-rate pipe exp2 also uses (the
// mma.sync kernels keep tc_pack: the packed form makes their counting builds spill).
template <typename T>
__device__ __forceinline__ unsigned wg_pack(float lo, float hi)
{
    return tc_pack<T>(lo, hi);
}
template <>
__device__ __forceinline__ unsigned wg_pack<__nv_bfloat16>(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo, the low half
    return *reinterpret_cast<const unsigned*>(&v);
}

// One register of two T (as wg_pack makes it) -> two floats (low half first).
template <typename T>
__device__ __forceinline__ float2 wg_unpack(unsigned w)
{
    return make_float2(to_f(from_bits<T>(static_cast<unsigned short>(w & 0xffffu))),
                       to_f(from_bits<T>(static_cast<unsigned short>(w >> 16))));
}

// An m64nN accumulator (N / 2 floats per thread) as the register A fragments of the next product:
// 16 columns (one k step) per fragment.
template <typename T, int N>
__device__ __forceinline__ void wg_acc_to_a(unsigned (&a)[N / 16][4], const float (&acc)[N / 2])
{
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) a[kk][r] = wg_pack<T>(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
    }
}

#ifdef DROPOUT
// Dropout (common.cuh, iokernels/plan/dropout.py): element (bh, i, j) of P takes byte j % 16 of the Philox call of
// counter (j / 16, i, bh, offset), so one call (iok_keep16) serves 16 adjacent keys of one query row. In an m64nN
// accumulator fragment, thread (g, t) of a warp holds element e = 4n + 2h + c (n < N / 8, h, c in {0, 1}) at row
// g + 8h of the warp's 16 and column 8n + 2t + c. The helpers below draw each call once, in one lane, and pass its
// 16 keep bits to the lanes that hold them.

// All ones where bit `bit` of `bits` is set, else 0. Integer masks rather than selects: the compiler turns
// selects into predicates it hoists and keeps, which spills the backward's registers.
__device__ __forceinline__ unsigned wg_bit_mask(unsigned bits, int bit)
{
    return 0u - ((bits >> bit) & 1u);
}
// x where bit `bit` of `bits` is set (kept), else 0 (dropped; the keep scale is applied later).
__device__ __forceinline__ float wg_keep(float x, unsigned bits, int bit)
{
    return __uint_as_float(__float_as_uint(x) & wg_bit_mask(bits, bit));
}
// The same on a register of two T (wg_pack's layout): the low half kept iff bit lo_bit of lo, the high half
// iff bit hi_bit of hi.
__device__ __forceinline__ unsigned wg_keep2(unsigned x, unsigned lo, int lo_bit, unsigned hi, int hi_bit)
{
    return x & ((wg_bit_mask(lo, lo_bit) & 0x0000ffffu) | (wg_bit_mask(hi, hi_bit) & 0xffff0000u));
}

// Rows are queries, columns keys (the forward's S): keep[h] bit 2n + c is element 4n + 2h + c of the thread's
// fragment, row `row` + 8h (query), column col0 + 8n + 2t + c (key; col0 a multiple of 16). The four lanes of a
// quad hold a row's 16 keys of a call: of the quad's 2 N / 16 (row, 16-key group) calls, lane t draws those k = t
// (mod 4) and the quad exchanges them (shuffles of width 4): N / 32 Philox calls per thread.
template <int N>
__device__ __forceinline__ void wg_dropout_rows(unsigned (&keep)[2], unsigned threshold, unsigned long long seed,
                                                unsigned offset, unsigned bh, unsigned row, unsigned col0, int t)
{
    static_assert(N % 32 == 0 && N <= 128, "whole calls per lane, two bits per 8 columns in one register");
    constexpr int G = N / 16;  // 16-key groups of a row
    unsigned mine[N / 32];
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
        const int k = 4 * u + t;
        mine[u] = iok_keep16(threshold, seed, offset, bh, row + 8 * (k / G), col0 + 16 * (k % G));
    }
    keep[0] = keep[1] = 0u;
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const unsigned m = __shfl_sync(0xffffffffu, mine[u], s, 4);  // call k = 4u + s: row 8 (k / G), group k % G
            const int k = 4 * u + s, h = k / G, grp = k % G;
            const unsigned lo = (m >> (2 * t)) & 3u, hi = (m >> (8 + 2 * t)) & 3u;  // n = 2 grp and 2 grp + 1
            keep[h] |= (lo | (hi << 2)) << (4 * grp);
        }
    }
}

// Rows are keys, columns queries (the backward's Sᵀ = K Qᵀ): element e = 4n + 2h + c of the thread's fragment,
// row key0 + g + 8h (key; key0 a multiple of 16), column q0 + 8n + 2t + c (query), is kept iff bit
// wg_cols_bit<N>(e) of the WG_COLS_REGS<N> registers `keep` (bit b: register b / 32, bit b % 32) is set.
// One call serves a query's 16 keys, which the eight lanes g of one t hold: of their N / 4 queries (k = 2n + c),
// lane g draws those k = g (mod 8) and the eight exchange them: N / 32 Philox calls per thread.
template <int N>
constexpr int WG_COLS_REGS = (N / 2 + 31) / 32;
template <int N>
__device__ constexpr int wg_cols_bit(int e)
{
    return (e & 3) * (N / 8) + (e >> 2);  // N / 8 bits (over n) per (h, c)
}
template <int N>
__device__ __forceinline__ void wg_dropout_cols(unsigned (&keep)[WG_COLS_REGS<N>], unsigned threshold,
                                                unsigned long long seed, unsigned offset, unsigned bh, unsigned key0,
                                                unsigned q0, int g, int t)
{
    static_assert(N % 32 == 0 && N <= 128 && 32 % (N / 8) == 0, "whole calls per lane; the (h, c) bit groups");
    unsigned mine[N / 32];
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
        const int k = 8 * u + g;  // query 8 (k / 2) + 2t + k % 2
        mine[u] = iok_keep16(threshold, seed, offset, bh, q0 + 8 * (k >> 1) + 2 * t + (k & 1), key0);
    }
#pragma unroll
    for (int i = 0; i < WG_COLS_REGS<N>; ++i) keep[i] = 0u;
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const unsigned m = __shfl_sync(0xffffffffu, mine[u], 4 * s + t);  // query k = 8u + s of this t
            const int k = 8 * u + s, n = k >> 1, c = k & 1;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                constexpr int per = N / 8;
                const int b = (2 * h + c) * per + n;
                keep[b / 32] |= ((m >> (g + 8 * h)) & 1u) << (b % 32);
            }
        }
    }
}
#endif
#line 72 "flash_tma.cu"

#line 1 "tma.cuh"
// The Hopper (sm_90) asynchronous data movement the warp-specialized kernels use (issue #21): tensor maps,
// the bulk tensor copy engine (TMA) loading 2-D boxes of a (BH, N, d) tensor into shared memory, and the
// shared-memory transaction barriers (mbarrier) their completion lands on. Host side:
// iokernels/kernels/tensormap.py encodes the maps; each is passed by value as a
// `const __grid_constant__ IokTensorMap` kernel parameter.
//
// Barrier phases: a fresh barrier is in phase 0; iok_mbar_wait(bar, parity) returns once the phase of that
// parity has completed, so waiting on parity 1 of a fresh barrier returns at once. A ring of S stages flips
// the parity each time its index wraps: parity = (iteration / S) & 1 for the consumer's "full" waits,
// the complement for the producer's "empty" waits.
//
// TMA boxes: a map made by tensormap.attention_map loads `rows` rows x 64 columns (128 bytes, 128-byte
// swizzled: 16-byte chunk c of row r lands at chunk c ^ (r % 8)), which is the slab layout of wg.cuh
// (wg_off), so wgmma reads the tile as loaded. Rows past the head's N are zero-filled and never read.
#pragma once

// CUtensorMap (cuda.h, which NVRTC does not ship): 128 opaque bytes, 64-byte aligned.
struct alignas(64) IokTensorMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned iok_smem_addr(const void* p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----------------------------------------------------------------------------------------

// One thread initializes; then iok_mbar_fence_init and a block barrier before anyone uses it.
__device__ __forceinline__ void iok_mbar_init(unsigned long long* bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(iok_smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void iok_mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The producer's arrival that also announces `bytes` of TMA transactions for this phase.
__device__ __forceinline__ void iok_mbar_expect_tx(unsigned long long* bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(iok_smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// A plain arrival (a consumer releasing a stage).
__device__ __forceinline__ void iok_mbar_arrive(unsigned long long* bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(iok_smem_addr(bar)) : "memory");
}
// Wait until the phase of `parity` has completed (try_wait may time out: loop).
__device__ __forceinline__ void iok_mbar_wait(unsigned long long* bar, unsigned parity)
{
    asm volatile(
        "{\n"
        " .reg .pred done;\n"
        " IOK_MBAR_WAIT:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra IOK_MBAR_WAIT;\n"
        "}\n" ::"r"(iok_smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// ---- TMA -----------------------------------------------------------------------------------------------

// Load the box at element coordinates (c0 innermost, c1, c2) of `map` into shared memory at `dst` (1024-byte
// aligned for the 128-byte swizzle); its bytes complete on `bar` (announced by iok_mbar_expect_tx).
__device__ __forceinline__ void iok_tma_load_3d(void* dst, const IokTensorMap* map, unsigned long long* bar, int c0,
                                                int c1, int c2)
{
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];\n" ::"r"(iok_smem_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(iok_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
__device__ __forceinline__ void iok_tma_prefetch_map(const IokTensorMap* map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
// Add the box at `src` (shared memory, laid out as the map's box) into the tensor at element coordinates (c0, c1,
// c2) of `map`: the copy engine reads, adds and writes global memory (float32 add, a read-modify-write per
// element); elements outside the tensor are skipped. Completes in the thread's bulk group (iok_bulk_commit).
__device__ __forceinline__ void iok_tma_reduce_add_3d(const IokTensorMap* map, const void* src, int c0, int c1, int c2)
{
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(iok_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
__device__ __forceinline__ void iok_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of the thread's bulk groups are still reading their shared-memory source (the buffer may be
// written again) ...
template <int N>
__device__ __forceinline__ void iok_bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// ... or are still incomplete (their writes to global memory done).
template <int N>
__device__ __forceinline__ void iok_bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- warpgroup tiles ------------------------------------------------------------------------------------

#ifdef IOK_NUM_TENSORS  // the kernels (common.cuh's counters), not a bare probe of this header
// The copy of a ROWS-row tile (wg.cuh's TILE_D wide: include wg.cuh first) from row row0 of head `head`:
// TILE_D / 64 boxes of ROWS x 64 on barrier `bar`, counted where it is issued (DESIGN.md's rule 6) as the bytes it
// reads of tensor TI: its rows inside the tensor's n (the rows past it are zero-filled, nothing read), HEAD_D
// elements each.
template <int TI, int ROWS, typename T, int SLAB_ROWS = ROWS, int... Ts>
__device__ __forceinline__ void wg_tma_tile(IokCounters<Ts...>& io, unsigned char* dst, const IokTensorMap* map,
                                            unsigned long long* bar, int row0, int n, int head)
{
    constexpr int slot = iok_slot<TI, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) {
        io.r[slot] += static_cast<unsigned long long>(max(0, min(ROWS, n - row0))) * HEAD_D * sizeof(T);
    }
#pragma unroll
    for (int s = 0; s < TILE_D / 64; ++s) iok_tma_load_3d(dst + s * SLAB_ROWS * 128, map, bar, 64 * s, row0, head);
}
// Rows [from, ROWS) of a landed ROWS-row tile (wg_tma_tile's slabs) set to 0 by the 32 lanes of a warp: rows a copy
// read past a sequence's end (the next sequence's, or a cache's rows past its length, which may hold anything, NaN
// included). The swizzle moves 16-byte chunks within a row, so a row's 128 bytes of each slab stay its own. The
// caller then fences them for the tensor cores (wg_fence_async_smem) before the stage's barrier completes.
template <int ROWS>
__device__ __forceinline__ void wg_zero_tail(unsigned char* tile, int from, int lane)
{
    const int chunks = (ROWS - from) * 8;  // 16-byte chunks of a slab's rows past the end
#pragma unroll
    for (int s = 0; s < TILE_D / 64; ++s) {
        for (int c = lane; c < chunks; c += 32) {
            *reinterpret_cast<uint4*>(tile + s * ROWS * 128 + from * 128 + c * 16) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}
#ifdef PAGED
// The copy of key tile [key0, key0 + BCR) of one sequence (its `keys` keys; `table`: its row of the page table) for
// K/V head `kv` of `kv_heads`, from a paged pool's map (pages · kv_heads, PAGED, d): box by box of min(PAGED, BCR)
// rows (wg_tma_tile's slabs, each box at its rows of them), each from the page its page-table entry names, read and
// counted here once per box for every slab; a box past the sequence's end reads nothing (its row lies past the page:
// the copy engine zero-fills it).
template <int TI, int BCR, typename T, int... Ts>
__device__ __forceinline__ void wg_tma_paged(IokCounters<Ts...>& io, unsigned char* dst, const IokTensorMap* map,
                                             unsigned long long* bar, int key0, int keys, const int* table, int kv,
                                             int kv_heads)
{
    constexpr int U = PAGED < BCR ? PAGED : BCR;
    static_assert(BCR % U == 0 && U % 8 == 0, "whole boxes of whole 8-row swizzle atoms");
#pragma unroll
    for (int i = 0; i < BCR / U; ++i) {
        const int key = key0 + i * U;
        int page = 0, row = PAGED;  // past the sequence: a box past the page
        if (key < keys) {
            page = iok_ld<IOK_T_page_table>(io, table + key / PAGED);
            row = key % PAGED;
        }
        wg_tma_tile<TI, U, T, BCR>(io, dst + i * U * 128, map, bar, row, PAGED, page * kv_heads + kv);
    }
}
#endif
#endif

// ---- warp specialization ---------------------------------------------------------------------------------

// Register reallocation (sm_90a; every warp of the warpgroup executes the same one; the kernel needs
// __launch_bounds__(threads, 1), else ptxas ignores it with warning C7508).
template <int N>
__device__ __forceinline__ void iok_regs_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void iok_regs_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Named barriers 1..15 (0 is __syncthreads), `count` threads, a multiple of 32.
__device__ __forceinline__ void iok_bar_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void iok_bar_arrive(int id, int count)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#line 74 "flash_tma.cu"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS)
#error "flash_tma.cu needs BR, BC, HEAD_D and THREADS from the plan"
#endif
constexpr int CONSUMERS = 2 * BR;  // threads of the consumer warpgroups
static_assert((BR == 128 || BR == 192) && THREADS == CONSUMERS + 128, "a warpgroup per 64 rows, and the producer's");
constexpr int WGS = BR / 64;  // consumer warpgroups
// registers per thread after setmaxnreg: the producer keeps what issuing copies needs
// (its counting build keeps 40: it adds the bytes of every copy in 64-bit counters; 56 across the items of a
// persistent block)
#if defined(RAGGED) && defined(IOK_COUNT) && !defined(SPLIT) \
    && (defined(HEAD_D_TILE) ? HEAD_D_TILE > 128 : HEAD_D > 128)
// (a cache's counting build past d 128, one split: the consumers' O of 128 x 256 and the masks need 232, the producer
// fits in 40. With SPLIT and PACKED_CAUSAL neither split of the registers avoids a small spill, 16 bytes of the
// consumers' at 56 / 224: the counting build only, tests/kernels/test_compile.py SPILLS_ALLOWED)
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
#elif defined(RAGGED) || (defined(IOK_COUNT) && defined(PERSISTENT))  // (RAGGED: the page table's, the tail's state)
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
#elif defined(IOK_COUNT)  // (VARLEN with three consumer warpgroups: their 160 spill 40 bytes, the counting build only)
constexpr int PRODUCER_REGS = WGS == 2 ? 40 : 32, CONSUMER_REGS = WGS == 2 ? 232 : 160;
#else
constexpr int PRODUCER_REGS = WGS == 2 ? 24 : 32, CONSUMER_REGS = WGS == 2 ? 240 : 160;
#endif
// setmaxnreg moves registers within the block's allocation at launch (65536 / THREADS per thread, a multiple of
// 8): an increase beyond it waits forever
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * CONSUMERS <= (65536 / THREADS) / 8 * 8 * THREADS,
              "the block's registers");
// TILE_D (wg.cuh): the tile's width; HEAD_D the problem's d. The copy engine zero-fills the columns past d, so
// they add nothing to S or O; those of O are not stored. The row strides of Q, K, V and O are d's (the tensor
// maps', HEAD_D in the stores).
static_assert((BC == 64 || BC == 128 || (BC == 176 && TILE_D <= 128 && WGS == 2)) && TILE_D <= 256,
              "wgmma tile widths (176: FlashAttention-3's keys per tile at d up to 128, two consumer warpgroups)");
static_assert(TILE_D <= 128 || (BC == 64 && BR == 128), "d past 128: S, O and P fit the registers at 128 x 64 only");

#if defined(RAGGED) && (defined(PERSISTENT) || defined(IOK_BAND) || defined(DROPOUT))
#error "RAGGED: a block per work item (its sequence's length read first), no mask, no dropout"
#endif
#if defined(SOFTCAP) && (defined(VARLEN) || defined(DROPOUT) || defined(RAGGED) || defined(SPLIT))
#error "SOFTCAP: the dense forward, with causal or a window, no dropout"
#endif
#if defined(VARLEN) && (defined(PERSISTENT) || defined(WINDOW) || defined(DROPOUT) || defined(RAGGED) || defined(SPLIT))
#error "VARLEN: a block per work item (its sequence's offsets read first), causal or no mask, no dropout"
#endif
#if defined(BLOCK_SPARSE) && (defined(PERSISTENT) || defined(VARLEN) || defined(RAGGED) || defined(SPLIT) \
    || defined(WINDOW) || !defined(BLOCK_LIST))
#error "BLOCK_SPARSE: a block per item (its list read first), causal or no mask; BLOCK_LIST from the plan"
#endif
#if defined(ALIBI) && (defined(PERSISTENT) || defined(VARLEN) || defined(RAGGED) || defined(SPLIT) || defined(SOFTCAP))
#error "ALIBI: a block per item (its slope read first), no softcap"
#endif
#if defined(HEAD_BAND) && (!defined(CAUSAL) || defined(PERSISTENT) || defined(VARLEN) || defined(SPLIT) \
    || defined(RAGGED))
#error "HEAD_BAND: the causal grid of a block per item, (T_r, 1, BH)"
#endif
#if defined(IOK_MODS) && (defined(PERSISTENT) || defined(VARLEN) || defined(RAGGED) || defined(SPLIT) \
    || defined(SOFTCAP) || defined(ALIBI) || defined(DROPOUT) || defined(PACKED_CAUSAL))
#error "MASK_MOD, SCORE_MOD: a block per item, no softcap, ALiBi or dropout (the mods express the first two)"
#endif
#ifdef IOK_MODS
static_assert(TILE_D <= 128, "MASK_MOD, SCORE_MOD: d up to 128");
#endif
#ifdef MOD_STAGE
constexpr int STAGE_PITCH = BC * static_cast<int>(sizeof(MOD_STAGE_T)) + 16;  // a query row in SMEM_STAGE (padded)
constexpr int STAGE_CHUNKS = BC * static_cast<int>(sizeof(MOD_STAGE_T)) / 16;  // its 16-byte pieces
static_assert(BC * sizeof(MOD_STAGE_T) % 16 == 0, "MOD_STAGE: whole 16-byte pieces a row");
#endif
#ifdef ALIBI
static_assert(TILE_D <= 128, "ALIBI: d up to 128 (past it the counting build's consumers spill)");
#endif
#if defined(RAGGED) || defined(VARLEN)
#define IOK_TAIL 1  // the last V tile's rows past the sequence zeroed in shared memory
#endif
#ifdef PACKED_CAUSAL
#ifdef IOK_BAND
#error "PACKED_CAUSAL: the decode's own causal mask, not CAUSAL's or a window's"
#endif
#define IOK_PACKED_PARAM const int q_len,
#else
#define IOK_PACKED_PARAM
#endif
#ifdef SPLIT
#if defined(PERSISTENT) || defined(IOK_BAND) || defined(DROPOUT)
#error "SPLIT: a block per (item, split), no mask, no dropout"
#endif
constexpr int OUT_T = IOK_T_Opart, LSE_T = IOK_T_lse_part;  // the split's partials, float32
template <typename T> struct FwdOut { using type = float; };
#else
constexpr int OUT_T = IOK_T_O, LSE_T = IOK_T_lse;
template <typename T> struct FwdOut { using type = T; };
#endif

template <typename T>
__device__ constexpr bool wg_layout_ok()
{
    return layout_ok<5>({{SMEM_Q, BR * TILE_D * sizeof(T)},
                         {SMEM_K0, BC * TILE_D * sizeof(T)},
                         {SMEM_K1, BC * TILE_D * sizeof(T)},
                         {SMEM_V0, BC * TILE_D * sizeof(T)},
                         {SMEM_V1, BC * TILE_D * sizeof(T)}})
           && SMEM_Q % 1024 == 0 && SMEM_K0 % 1024 == 0 && SMEM_K1 % 1024 == 0 && SMEM_V0 % 1024 == 0
           && SMEM_V1 % 1024 == 0;
}

// Grid (ceil(N_q / BR), 1, BH). tmQ: Q (BH, N_q, HEAD_D) of T in boxes of BR rows; tmK, tmV: K, V (BH / kv_group,
// N_k, HEAD_D) in boxes of BC rows (tensormap.attention_map), query head z reading K/V head z / kv_group
// (grouped-query attention; 1 for none). O: (BH, N_q, HEAD_D) of T; lse: (BH, N_q) float32 (SPLIT: grid (T_r, S, BH),
// O and lse the partials, (S, BH, N_q, HEAD_D) and (S, BH, N_q) float32).
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tma_fwd(const __grid_constant__ IokTensorMap tmQ, const __grid_constant__ IokTensorMap tmK,
              const __grid_constant__ IokTensorMap tmV, typename FwdOut<T>::type* __restrict__ O,
              float* __restrict__ lse, const int n_q_in, const int n_k_in, float scale, int kv_group, int bh,
              IOK_BLOCK_MASK_PARAM IOK_WINDOW_PARAM IOK_SOFTCAP_PARAM IOK_ALIBI_PARAM IOK_MOD_PARAM IOK_CACHE_PARAM
              IOK_VARLEN_PARAM IOK_PACKED_PARAM IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
{
    static_assert(wg_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES, 1024-byte aligned");
    extern __shared__ __align__(1024) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, OUT_T, LSE_T IOK_CACHE_T IOK_VARLEN_T IOK_BLOCK_MASK_T IOK_ALIBI_T
                IOK_MOD_T> io;
    if (threadIdx.x == 0 && (static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 1023u) != 0) __trap();

    const int wg = threadIdx.x >> 7;               // warpgroup: query rows [64 wg, 64 wg + 64)
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;         // accumulator coordinates: row group, thread in group
    // the query rows and keys of the problem (VARLEN: of the block's sequence, read below), and where a copy's rows
    // start and end in the tensors (VARLEN: the sequence's first packed row; the packed rows)
    int n_q = n_q_in, n_k = n_k_in, q_base = 0;
    [[maybe_unused]] int k_base = 0;  // (PAGED: its copies address pages)
    const int q_extent = n_q_in;
    [[maybe_unused]] const int k_extent = n_k_in;
    // work items, B_r query rows of one head each. PERSISTENT (a stage parameter; B_r 128): the blocks take them in
    // turn (item blockIdx.x, + gridDim.x, ...; the plan launches at most TMA_FWD_CTAS blocks), so the copy engine loads
    // an item's Q and first K while the consumers finish the item before; else one item per block. Causal: the
    // longest rows first, across the heads
    [[maybe_unused]] const int t_r = (n_q + BR - 1) / BR, items = t_r * bh;
#ifdef PERSISTENT
    static_assert(WGS == 2, "a persistent block keeps more state: its counting build's producer needs 56 registers");
#define ITEM_LOOP _Pragma("unroll 1") for (int it = blockIdx.x; it < items; it += gridDim.x)
#else
#define ITEM_LOOP for ([[maybe_unused]] int it = 0, once = 1; once; once = 0)  // one item, the block's (grid (T_r, 1, BH))
#endif
    struct Item {
        int row0, rows, z, kv_head, kt0, tiles;  // first row, rows, head (batch·head), its K/V head, key tiles
        // [kt0, kt0 + tiles)
        int keys;  // the keys its rows may see: n_k, or (RAGGED) its sequence's length
#ifdef IOK_TAIL
        int zero_from;  // the first row of its last V tile to zero (rows past the sequence loaded), or BC: none
#endif
    };
    int seq_keys = n_k;  // the keys of the block's sequence: n_k, or (RAGGED) its length, read below
    auto item_of = [&]([[maybe_unused]] int it) {
        Item w;
#if defined(PERSISTENT) && defined(CAUSAL)
        w.row0 = (t_r - 1 - it / bh) * BR;
        w.z = it % bh;
#elif defined(PERSISTENT)
        w.row0 = (it % t_r) * BR;
        w.z = it / t_r;
#elif defined(CAUSAL)
        w.row0 = (gridDim.x - 1 - IOK_GRID_X) * BR;  // (HEAD_BAND: in bands of heads, common.cuh)
        w.z = IOK_GRID_Z;
#else
        w.row0 = blockIdx.x * BR;
        w.z = blockIdx.z;
#endif
        w.rows = min(BR, n_q - w.row0);  // (VARLEN: <= 0 past the sequence's end)
        w.kv_head = w.z / kv_group;
        w.keys = seq_keys;
#ifdef IOK_BAND
        // the key tiles hold every key a row of the item sees: from its first row's first (WINDOW) to its last
        // row's last; those outside are masked for all its rows
#ifdef WINDOW
        const int key_lo = max(0, w.row0 + win_lo);
#else
        const int key_lo = 0;
#endif
        const int key_hi = min(n_k, w.row0 + w.rows + IOK_BAND_HI);  // one past the last row's last key
        w.kt0 = key_lo / BC;
        w.tiles = key_hi > key_lo ? (key_hi + BC - 1) / BC - w.kt0 : 0;
#elif defined(SPLIT)
        // the splits are cut from the capacity's tiles; the item's sequence has t_b of them (RAGGED: a split past
        // its end has none)
        const int t_c = (n_k + BC - 1) / BC, c = (t_c + gridDim.y - 1) / gridDim.y, t_b = (w.keys + BC - 1) / BC;
        w.kt0 = blockIdx.y * c;
        w.tiles = max(0, min(c, t_b - w.kt0));
#else
        w.kt0 = 0;
        w.tiles = (w.keys + BC - 1) / BC;
#endif
#ifdef VARLEN
        if (w.rows <= 0) w.tiles = 0;  // a tile past its sequence's end
#endif
#ifdef IOK_TAIL
        // the copies of the sequence's last tile load rows past its end (a contiguous cache's up to the capacity, a
        // paged one's to the end of the box) that may hold anything, NaN included: V's must be zero (P = 0 there,
        // and 0 NaN = NaN in P V). K's are masked like any key past the end
        const int last = w.keys - ((w.keys + BC - 1) / BC - 1) * BC;  // rows of it inside the sequence, 1 .. BC
#if defined(PAGED)
        const bool past = w.keys % (PAGED < BC ? PAGED : BC) != 0;
#elif defined(VARLEN)
        const bool past = last < BC;  // (the next sequence's rows, or zero-filled ones past the packed tensor)
#else
        const bool past = w.keys < n_k && last < BC;
#endif
        w.zero_from = w.tiles > 0 && (w.kt0 + w.tiles) * BC >= w.keys && past ? last : BC;
#endif
        return w;
    };
    const float scale2 = scale * WG_LOG2E;  // softmax in base 2: exp(x s) = 2^(x s log2 e)

    // barriers: Q, full (1 arrival + the copy's bytes) and empty (one arrival per consumer warp once the item's last
    // S has read it); per stage of the K and V rings, full and empty (one arrival per consumer warp, after its wgmma
    // wait: every warp of a warpgroup has finished reading). The rings run on across items: tile j of an item is
    // slot ring + j, ring the tiles of the block's earlier items
    __shared__ __align__(8) unsigned long long bar_q, empty_q, full_k[2], full_v[2], empty_k[2], empty_v[2];
#ifdef IOK_TAIL
    // bar_tail: the copy of the sequence's last V tile, which the producer's warp 1 completes on full_v once it has
    // zeroed the rows past the end
    __shared__ __align__(8) unsigned long long bar_tail;
    if (threadIdx.x == 0) iok_mbar_init(&bar_tail, 1);
#endif
#ifdef RAGGED
    // the sequence of the block's K/V head (read once, by one thread) and its rows
    __shared__ int seq_len;
    const int seq = blockIdx.z / (gridDim.z / batch);
    if (threadIdx.x == 0) {
        // with the keys appended first; past the capacity: the capacity (no zero-filled rows taken for keys)
        seq_len = min(iok_ld<IOK_T_seqlens>(io, seqlens + seq) + seq_add, n_k);
    }
#endif
#ifdef VARLEN
    // the block's sequence: its first query and key rows and one past their last (read once, by one thread)
    __shared__ int seq_rows[4];
    if (threadIdx.x == 0) iok_varlen_rows(io, cu_seqlens_q, cu_seqlens_k, blockIdx.y, n_q_in, n_k_in, seq_rows);
#endif
#ifdef BLOCK_SPARSE
    // the kept key tiles of the block's row of the grid, within its band (kt0 + kept[j]): the item's steps
    __shared__ unsigned short kept[BLOCK_LIST];
    __shared__ int kept_count;
    if (threadIdx.x < 32) {
        const Item w = item_of(0);
        const int n = iok_kept_blocks<4>(io, block_mask + static_cast<size_t>(w.row0 / BR) * ((n_k + BC - 1) / BC),
                                      w.kt0, w.tiles, 1, kept, lane);
        if (lane == 0) kept_count = n;
    }
#ifdef MASK_MOD
#define IOK_KEY_TILE(j) (kt0 + static_cast<int>(kept[j] & (IOK_PARTIAL - 1)))
#define IOK_TILE_PARTIAL(j) ((kept[j] & IOK_PARTIAL) != 0)
#else
#define IOK_KEY_TILE(j) (kt0 + static_cast<int>(kept[j]))
#endif
#else
#define IOK_KEY_TILE(j) (kt0 + (j))
#endif
#ifndef IOK_TILE_PARTIAL
#define IOK_TILE_PARTIAL(j) true
#endif
#ifdef ALIBI
    __shared__ float alibi_slope;  // the block's head's (read once, by one thread)
    if (threadIdx.x == 0) alibi_slope = iok_ld<IOK_T_alibi>(io, alibi + item_of(0).z);
#endif
    if (threadIdx.x == 0) {
        iok_mbar_init(&bar_q, 1);
        iok_mbar_init(&empty_q, CONSUMERS / 32);
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            iok_mbar_init(&full_k[st], 1);
            iok_mbar_init(&full_v[st], 1);
            iok_mbar_init(&empty_k[st], CONSUMERS / 32);
            iok_mbar_init(&empty_v[st], CONSUMERS / 32);
        }
        iok_mbar_fence_init();
    }
    __syncthreads();  // the last block-wide barrier before the roles part
#ifdef RAGGED
    seq_keys = seq_len;
#endif
#ifdef VARLEN
    q_base = seq_rows[0];
    n_q = seq_rows[1] - q_base;
    k_base = seq_rows[2];
    n_k = seq_rows[3] - k_base;
    seq_keys = n_k;
#endif
#ifdef SPLIT
    // the combine may be launched now (programmatic dependent launch, combine.cu's PDL): its blocks wait for this
    // grid's completion, so only its launch overlaps the splits
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#ifdef PERSISTENT
#define ITEM_OF(it) item_of(it)
#elif defined(BLOCK_SPARSE)
    Item block_item = item_of(0);  // before the roles part, as the one item's values: its steps, the kept tiles
    block_item.tiles = kept_count;
#define ITEM_OF(it) block_item
#else
    const Item block_item = item_of(0);  // before the roles part, as the one item's values
#define ITEM_OF(it) block_item
#endif

    if (threadIdx.x >= CONSUMERS) {  // the producer warpgroup: one thread issues every copy
        iok_regs_dec<PRODUCER_REGS>();
        if (threadIdx.x == CONSUMERS) {
            iok_tma_prefetch_map(&tmQ);
            iok_tma_prefetch_map(&tmK);
            iok_tma_prefetch_map(&tmV);
            int ring = 0, nq = 0;  // K/V slots and Q tiles loaded so far
            ITEM_LOOP {
                const Item w = ITEM_OF(it);
                const int z = w.z, kt0 = w.kt0, tiles = w.tiles;  // (scalars: a lambda captures them)
                if (tiles == 0) continue;  // (a causal or window item whose rows see no key)
                const int kv_head = w.kv_head;
#ifdef PERSISTENT
                iok_mbar_wait(&empty_q, (nq & 1) ^ 1);  // the consumers' last product that reads Q is done
#endif
                iok_mbar_expect_tx(&bar_q, BR * TILE_D * sizeof(T));
                wg_tma_tile<IOK_T_Q, BR, T>(io, smem + SMEM_Q, &tmQ, &bar_q, q_base + w.row0, q_extent, z);
                ++nq;
                // K_0, then K_{j+1} before V_j: the consumers' step j + 1 issues Q K_{j+1}ᵀ together with P_j V_j
                auto load = [&](int j, bool is_k) {
                    const int st = (ring + j) & 1;
                    const unsigned phase = ((ring + j) >> 1) & 1;
                    unsigned long long* empty = is_k ? &empty_k[st] : &empty_v[st];
                    unsigned long long* full = is_k ? &full_k[st] : &full_v[st];
                    iok_mbar_wait(empty, phase ^ 1);  // the consumers are done with this stage's last tile
#ifdef IOK_TAIL
                    if (!is_k && j == tiles - 1 && w.zero_from < BC) full = &bar_tail;  // (warp 1 fills the stage)
#endif
                    iok_mbar_expect_tx(full, BC * TILE_D * sizeof(T));
                    const int key0 = IOK_KEY_TILE(j) * BC;
                    unsigned char* dst = smem + (is_k ? (st ? SMEM_K1 : SMEM_K0) : (st ? SMEM_V1 : SMEM_V0));
#ifdef PAGED
                    const int* table = page_table + static_cast<size_t>(seq) * max_pages;
                    const int heads_kv = gridDim.z / batch;
                    if (is_k) {
                        wg_tma_paged<IOK_T_K, BC, T>(io, dst, &tmK, full, key0, w.keys, table, kv_head % heads_kv,
                                                     heads_kv);
                    } else {
                        wg_tma_paged<IOK_T_V, BC, T>(io, dst, &tmV, full, key0, w.keys, table, kv_head % heads_kv,
                                                     heads_kv);
                    }
#else
                    if (is_k) {
                        wg_tma_tile<IOK_T_K, BC, T>(io, dst, &tmK, full, k_base + key0, k_extent, kv_head);
                    } else {
                        wg_tma_tile<IOK_T_V, BC, T>(io, dst, &tmV, full, k_base + key0, k_extent, kv_head);
                    }
#endif
                };
                load(0, true);
#pragma unroll 1
                for (int j = 0; j < tiles; ++j) {
                    if (j + 1 < tiles) load(j + 1, true);
                    load(j, false);
                }
                ring += tiles;
            }
        }
#ifdef IOK_TAIL
        else if (warp == 1 && block_item.zero_from < BC) {
            // the sequence's last V tile (stage (tiles - 1) % 2 of a block's one item): once copied, its rows past
            // the end are set to 0 (128 bytes of each 64-column slab a row: the swizzle moves 16-byte chunks within a
            // row), made visible to the tensor cores, and the stage is full
            const int st = (block_item.tiles - 1) & 1;
            iok_mbar_wait(&bar_tail, 0);
            wg_zero_tail<BC>(smem + (st ? SMEM_V1 : SMEM_V0), block_item.zero_from, lane);
            wg_fence_async_smem();
            __syncwarp();
            if (lane == 0) iok_mbar_arrive(&full_v[st]);
        }
#endif
    } else {  // the consumer warpgroups
        iok_regs_inc<CONSUMER_REGS>();
        int ring = 0, nq = 0;  // K/V slots and Q tiles used so far
        ITEM_LOOP {
            const Item w = ITEM_OF(it);
            const int row0 = w.row0, rows = w.rows, z = w.z, kt0 = w.kt0, tiles = w.tiles;  // (lambdas capture
            // scalars)
            float s[BC / 2], o[TILE_D / 2];
#pragma unroll
            for (int i = 0; i < TILE_D / 2; ++i) o[i] = 0.0f;
            float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, base-2 units
#ifdef IOK_MODS
            const IokMod mod{{cap0, cap1, cap2, cap3}, mod_heads, n_q, n_k};
#endif
            unsigned pa[BC / 16][4];  // P_j rounded to T: the A operand of the P V product issued in step j + 1
#ifdef DROPOUT
            unsigned keep[2];  // tile j's keep bits (rows g, g + 8; keep[h] bit 2n + c: element 4n + 2h + c)
#endif

            // S = Q K_jᵀ (64 x BC per warpgroup): TILE_D / 16 steps of 16; within a 64-column slab a step moves the
            // descriptors by 32 bytes, from slab to slab by the slab's size
            auto issue_s = [&](int j) {
                const unsigned char* Kt = smem + (((ring + j) & 1) ? SMEM_K1 : SMEM_K0);
#pragma unroll
                for (int kk = 0; kk < TILE_D / 16; ++kk) {
                    const int koff = (kk & 3) * 32 + (kk >> 2) * BR * 128;
                    const int kkoff = (kk & 3) * 32 + (kk >> 2) * BC * 128;
                    wg_mma_ss<T, BC>(s, wg_desc(smem + SMEM_Q + wg * 64 * 128 + koff, 16, 1024),
                                     wg_desc(Kt + kkoff, 16, 1024), kk);
                }
                wg_commit();
            };
            // O += P_j V_j: P from registers, 16 keys per step
            auto issue_pv = [&](int j) {
                const unsigned char* Vt = smem + (((ring + j) & 1) ? SMEM_V1 : SMEM_V0);
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    wg_mma_rs_tb<T, TILE_D>(o, pa[kk], wg_desc(Vt + kk * 16 * 128, BC * 128, 1024), 1);
                }
                wg_commit();
            };
            // MOD_PREFETCH: tile j's elements of the captured array the mods read first, into the L2 while the step
            // before runs (a line of 128 bytes per lane and 16 rows per warp; nothing past the item's last tile)
            auto mod_prefetch = [&]([[maybe_unused]] int j) {
#ifdef MOD_PREFETCH
                if (j >= tiles) return;
                const int key0 = IOK_KEY_TILE(j) * BC, keys = w.keys;
                const int q = min(row0 + wg * 64 + warp * 16 + (lane & 15), n_q - 1);
                constexpr int LINE = 128 / static_cast<int>(sizeof(MOD_PREFETCH_T));  // elements of a line
#pragma unroll
                for (int c = (lane >> 4) * LINE; c < BC; c += 2 * LINE) {
                    iok_mod_prefetch(mod, z, q, min(key0 + c, keys - 1));
                }
#endif
            };
            // MOD_STAGE: tile j's elements of the warp's 16 rows into its rows of SMEM_STAGE (one commit group)
            auto stage_copy = [&]([[maybe_unused]] int j) {
#ifdef MOD_STAGE
                if (j >= tiles) return;
                const int key0 = IOK_KEY_TILE(j) * BC, keys = w.keys, r0 = wg * 64 + warp * 16;
                const MOD_STAGE_T* x = static_cast<const MOD_STAGE_T*>(mod.cap[MOD_STAGE_SLOT]);
                constexpr int PER = 16 / static_cast<int>(sizeof(MOD_STAGE_T));  // elements a piece
#pragma unroll
                for (int c = lane; c < 16 * STAGE_CHUNKS; c += 32) {
                    const int r = c / STAGE_CHUNKS, k = key0 + (c % STAGE_CHUNKS) * PER, q = row0 + r0 + r;
                    const int inside = q < n_q ? max(0, min(PER, keys - k)) : 0;  // its elements inside
                    const MOD_STAGE_T* src = inside ? x + iok_stage_row(mod, z, q) + k : x;
                    iok_cp_async_part<IOK_T_captures>(io, smem + SMEM_STAGE + (r0 + r) * STAGE_PITCH
                                                      + (c % STAGE_CHUNKS) * 16, src,
                                                      inside * static_cast<int>(sizeof(MOD_STAGE_T)));
                }
                iok_cp_async_commit();
#endif
            };
            auto dropout_bits = [&]([[maybe_unused]] int j) {
#ifdef DROPOUT
                wg_dropout_rows<BC>(keep, dropout_threshold, dropout_seed, dropout_offset, z,
                                    row0 + wg * 64 + warp * 16 + g, IOK_KEY_TILE(j) * BC, t);
                asm volatile("" : "+r"(keep[0]), "+r"(keep[1]));  // done before the wait
#endif
            };
            // S_j landed in s: release K_j, mask, and the online softmax (rows g: i % 4 < 2, g + 8: i % 4 >= 2); s
            // becomes P_j, corr the factor of O
            auto softmax = [&](int j, float (&corr)[2]) {
                wg_fence_regs(s);
                __syncwarp();
                if (lane == 0) iok_mbar_arrive(&empty_k[(ring + j) & 1]);  // this warp's share of the product read K_j
#ifdef PERSISTENT
                if (lane == 0 && j == tiles - 1) iok_mbar_arrive(&empty_q);  // ... and the item's last that reads Q
#endif
#ifdef SOFTCAP
                // the logits through the softcap, kept in units of s (τ s -> c tanh(τ s / c), times 1 / τ): the max
                // and the exponentials below scale them by τ as without one (common.cuh iok_tanh)
#pragma unroll
                for (int i = 0; i < BC / 2; ++i) s[i] = (softcap / scale) * iok_tanh(s[i] * (scale / softcap));
#endif
                const int key0 = IOK_KEY_TILE(j) * BC, keys = w.keys;
#ifdef ALIBI
                {
                    // −slope |key − row − (n_k − n_q)| in units of s (the exponentials scale it by τ); c: key − row
                    // − (n_k − n_q) of element 0 of the lane's first row
                    // (in floats: the offsets below are exact, and no integer temporaries)
                    const float slope = alibi_slope / scale;
                    const float c0 = static_cast<float>(key0 + 2 * t - (row0 + wg * 64 + warp * 16 + g) - (n_k - n_q));
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        const float c = c0 + static_cast<float>((i >> 2) * 8 + (i & 1) - 8 * ((i >> 1) & 1));
                        s[i] = fmaf(-slope, fabsf(c), s[i]);
                    }
                }
#endif
#ifdef IOK_MODS
                {
                    // every element of the tile, no branch around it (so the compiler may share an expression's
                    // loads among elements): a row or key past the problem's end takes its last one's index
                    const int r0 = row0 + wg * 64 + warp * 16 + g;  // the lane's first row (+ 8: its second)
                    const int q_idx[2] = {min(r0, n_q - 1), min(r0 + 8, n_q - 1)};
                    const bool partial = IOK_TILE_PARTIAL(j);
                    const float inv = 1.0f / scale;
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        const int k = min(key0 + (i >> 2) * 8 + 2 * t + (i & 1), keys - 1);
                        s[i] = iok_mod_s(io, mod, z, q_idx[(i >> 1) & 1], k, s[i], scale, inv, partial);
                    }
                }
#endif
#ifdef MOD_STAGE
                {
                    iok_cp_async_wait<0>();  // this lane's pieces of tile j landed ...
                    __syncwarp();            // ... and the warp's
                    const unsigned char* row = smem + SMEM_STAGE + (wg * 64 + warp * 16 + g) * STAGE_PITCH;
                    [[maybe_unused]] const float inv = 1.0f / scale;  // (a bias is a logit: in units of s, / τ)
#pragma unroll
                    for (int n = 0; n < BC / 4; ++n) {  // elements 2n, 2n + 1: row g + 8 (n & 1), keys (n >> 1) 8 + 2t
                        const int key = (n >> 1) * 8 + 2 * t;
                        const float2 v = iok_stage_pair(row + (n & 1) * 8 * STAGE_PITCH
                                                        + key * static_cast<int>(sizeof(MOD_STAGE_T)));
#if MOD_STAGE_FORM == 1
                        s[2 * n] = fmaf(v.x, inv, s[2 * n]);
                        s[2 * n + 1] = fmaf(v.y, inv, s[2 * n + 1]);
#else
                        if (v.x == 0.0f) s[2 * n] = neg_inf();
                        if (v.y == 0.0f) s[2 * n + 1] = neg_inf();
#endif
                    }
                    __syncwarp();  // the warp's reads done before its next copies into these rows
                }
#endif
                if (key0 + BC > keys) {  // keys past n_k (ragged last tile; RAGGED: the sequence's end) get -inf
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) >= keys) s[i] = neg_inf();
                    }
                }
#ifdef WINDOW
                // keys outside a row's band get -inf (only in tiles that reach past the block's first row's last key or
                // before its last row's first)
                if (key0 + BC - 1 > row0 + win_hi || key0 < row0 + BR - 1 + win_lo) {
                    // the lane's first row's band relative to its first key (+ 8 for its second row)
                    const int rel = row0 + wg * 64 + warp * 16 + g - key0 - 2 * t;
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        const int c = (i >> 2) * 8 + (i & 1) - 8 * ((i >> 1) & 1);  // key - row, less rel
                        if (c > rel + win_hi || c < rel + win_lo) s[i] = neg_inf();
                    }
                }
#elif defined(PACKED_CAUSAL)
                // keys past a packed row's last visible key, keys - q_len + its position, get -inf (only tiles past
                // keys - q_len, the least of them)
                if (key0 + BC - 1 > keys - q_len) {
                    const int r = row0 + wg * 64 + warp * 16 + g;
                    const int last[2] = {keys - q_len + r % q_len, keys - q_len + (r + 8) % q_len};
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) > last[(i >> 1) & 1]) s[i] = neg_inf();
                    }
                }
#elif defined(CAUSAL)
                // keys past a row's last visible key get -inf (only tiles that reach past the block's first row's)
                const int off = IOK_BAND_HI;
                if (key0 + BC - 1 > row0 + off) {
                    const int row = row0 + wg * 64 + warp * 16 + g + off;  // + 8 for the second row of the lane
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) > row + 8 * ((i >> 1) & 1)) s[i] = neg_inf();
                    }
                }
#endif
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = m[h];
#pragma unroll
                    for (int n = 0; n < BC / 8; ++n) {
                        mx = fmaxf(mx, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]) * scale2);
                    }
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#if defined(IOK_BAND) || defined(PACKED_CAUSAL) || defined(IOK_MODS)
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
            };
            auto pack_p = [&]() {
#ifdef DROPOUT
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {  // element 8 kk + 2r + c: keep[r & 1] bit 2 (2 kk + r / 2) + c
                        const int bit = 4 * kk + 2 * (r >> 1);
                        pa[kk][r] = wg_pack<T>(wg_keep(s[8 * kk + 2 * r], keep[r & 1], bit),
                                               wg_keep(s[8 * kk + 2 * r + 1], keep[r & 1], bit + 1));
                    }
                }
#else
                wg_acc_to_a<T, BC>(pa, s);
#endif
            };

            // Step 0: S_0 alone. Every later step issues S_j and then P_{j-1} V_{j-1}, waits for the first, runs
            // S_j's softmax while the second flies, then waits for it and rescales O. No branch around a product or
            // a wait (ptxas would serialize the products).
            float corr[2];
            mod_prefetch(0);
            stage_copy(0);
            if (tiles > 0) {  // (a causal or window item whose rows see no key: O = 0)
                iok_mbar_wait(&bar_q, nq & 1);
                ++nq;
                iok_mbar_wait(&full_k[ring & 1], (ring >> 1) & 1);
                wg_fence();
                issue_s(0);
                mod_prefetch(1);
                dropout_bits(0);
                wg_wait<0>();
                softmax(0, corr);
                stage_copy(1);
                pack_p();
#pragma unroll 1
                for (int j = 1; j < tiles; ++j) {
                    const int buf = (ring + j) & 1, pbuf = buf ^ 1;
                    // the warpgroups take turns issuing (named barrier 1 + wg; warpgroup 0 has the first turn)
                    if (!(wg == 0 && j == 1)) iok_bar_sync(1 + wg, 256);
                    iok_mbar_wait(&full_k[buf], ((ring + j) >> 1) & 1);  // K_j landed
                    iok_mbar_wait(&full_v[pbuf], ((ring + j - 1) >> 1) & 1);  // V_{j-1} landed
                    wg_fence();
                    issue_s(j);
                    issue_pv(j - 1);
                    if (!(wg == WGS - 1 && j == tiles - 1)) iok_bar_arrive(1 + (wg + 1) % WGS, 256);  // the next's turn
                    mod_prefetch(j + 1);
                    dropout_bits(j);
                    wg_wait<1>();  // S_j done (P_{j-1} V_{j-1} may still fly)
                    softmax(j, corr);
                    stage_copy(j + 1);
                    wg_wait<0>();  // P_{j-1} V_{j-1} done: O and P's registers are free
                    wg_fence_regs(o);
                    wg_fence_regs(pa);
                    __syncwarp();
                    if (lane == 0) iok_mbar_arrive(&empty_v[pbuf]);  // this warp's share has read V_{j-1}
#pragma unroll
                    for (int i = 0; i < TILE_D / 2; ++i) o[i] *= corr[(i >> 1) & 1];
                    pack_p();
                }
                // the last tile's O += P V
                iok_mbar_wait(&full_v[(ring + tiles - 1) & 1], ((ring + tiles - 1) >> 1) & 1);
                wg_fence();
                issue_pv(tiles - 1);
                wg_wait<0>();
                wg_fence_regs(o);
#ifdef PERSISTENT
                __syncwarp();
                if (lane == 0) iok_mbar_arrive(&empty_v[(ring + tiles - 1) & 1]);  // this warp's share has read it
                ring += tiles;
#endif
            }

#ifdef SPLIT
            if (tiles == 0) continue;  // (RAGGED: a split past its sequence's end writes nothing; the combine knows)
#endif
            // O = O / l, rounded once; lse = (m + log2 l) ln 2
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
                l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
            }
#if defined(IOK_BAND) || defined(RAGGED) || defined(PACKED_CAUSAL) || defined(VARLEN) || defined(BLOCK_SPARSE) \
    || defined(IOK_MODS)
            // a row that sees no key (RAGGED, VARLEN: a sequence of none; PACKED_CAUSAL: of a split; BLOCK_SPARSE: a row
            // of the grid with no kept tile; IOK_MODS: one whose every key the mods hide): O = 0, lse = -inf
            const float inv[2] = {l[0] == 0.0f ? 0.0f : 1.0f / l[0], l[1] == 0.0f ? 0.0f : 1.0f / l[1]};
#else
            const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
#endif
#ifdef DROPOUT
            const float out_scale[2] = {inv[0] * dropout_scale, inv[1] * dropout_scale};  // O = (Z ∘ P) V / l
#else
            const float (&out_scale)[2] = inv;
#endif
#if defined(VARLEN)
            const size_t out_off = iok_varlen_at(q_base + row0, z, n_q_in, bh);  // packed rows of bh heads
            const int out_step = iok_varlen_step(bh);
#else
            const size_t q_off = static_cast<size_t>(z) * n_q + row0;
#ifdef SPLIT
            const size_t out_off = static_cast<size_t>(blockIdx.y) * gridDim.z * n_q + q_off;  // split s's rows
#else
            const size_t out_off = q_off;
#endif
            constexpr int out_step = 1;
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wg * 64 + warp * 16 + g + 8 * h;
                if (r < rows) {
                    auto* orow = O + (out_off + static_cast<size_t>(r) * out_step) * HEAD_D;
#pragma unroll
                    for (int n = 0; n < TILE_D / 8; ++n) {
                        if (n * 8 < HEAD_D) {  // the tile's columns past d: not stored
                            const float a = o[4 * n + 2 * h] * out_scale[h], b = o[4 * n + 2 * h + 1] * out_scale[h];
#ifdef SPLIT
                            iok_st<OUT_T>(io, reinterpret_cast<float2*>(orow + n * 8 + 2 * t), make_float2(a, b));
#else
                            iok_st<OUT_T>(io, reinterpret_cast<unsigned*>(orow + n * 8 + 2 * t), wg_pack<T>(a, b));
#endif
                        }
                    }
                    if (t == 0) {
                        iok_st<LSE_T>(io, lse + out_off + static_cast<size_t>(r) * out_step,
                                      (m[h] + __log2f(l[h])) * 0.6931471805599453f);
                    }
                }
            }
        }
    }
    iok_flush(io, iok_counters, smem);  // one call site for both roles: its barriers are the same instructions
}
