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
//   - every thread of the block calls iok_flush(c, iok_counters) once, after its last counted access.
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
// 2^x by one approximate ex2 with results below 2^-126 flushed to 0 (ex2.approx.ftz.f32: one MUFU.EX2, the same
// approximation exp2f uses). exp2f keeps those results as subnormals with a compare and two multiplies around it, 3
// of the softmax loops' ~9 instructions an element (SASS of the sm_90 backward, 2026-11-28): the sm_90 backward's
// probabilities (wg_bwd.cuh) and the softcap's tanh go through iok_exp2 (a probability under 2^-126 rounds to 0 in
// float16 and adds nothing next to the row's largest, 1). -inf gives 0, +inf gives +inf, as exp2f. The forwards keep
// exp2f: with this and the backward's other cuts the d 128 forward ran at 0.90× (results/h200/issue21/cuts/).
__device__ __forceinline__ float iok_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
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
    const float e = iok_exp2(2.8853900817779268f * x);
    float r;
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
// A persistent grid's list of work items (ITEM_LIST, the causal tma plans'; iokernels/plan/fast.py item_list): the
// kernel takes it (int32: G + 1 offsets, block b's entries [work[b], work[b + 1]), then the entries) as the argument
// before the dropout's (IOK_WORK_PARAM) and names it in its counters (IOK_WORK_T). IokList: a warp's walk over the
// block's entries, each read by lane 0 one item ahead and given to the warp's lanes at the next.
#ifdef ITEM_LIST
#define IOK_WORK_PARAM const int *__restrict__ work,
#define IOK_WORK_T , IOK_T_work
#else
#define IOK_WORK_PARAM
#define IOK_WORK_T
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

#ifdef ITEM_LIST
// A warp's walk over its block's entries [first, last) of the list (all 32 lanes): lane 0 reads entry i + 1 while
// the warp works on entry i, and take() gives the lanes the entry read the item before
struct IokList {
    const int* entries;
    int i, last, next;
    template <typename C>
    __device__ __forceinline__ IokList(C& io, const int* work, int first, int last_, int lane)
        : entries(work + gridDim.x + 1), i(first), last(last_), next(0)
    {
        if (lane == 0 && first < last_) next = iok_ld<IOK_T_work>(io, entries + first);
    }
    __device__ __forceinline__ bool more() const { return i < last; }
    template <typename C>
    __device__ __forceinline__ int take(C& io, int lane)
    {
        const int e = __shfl_sync(0xffffffffu, next, 0);
        if (lane == 0 && i + 1 < last) next = iok_ld<IOK_T_work>(io, entries + i + 1);
        ++i;
        return e;
    }
};
#endif

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
#ifdef MOD_TMA  // (flash_tma.cu: the staged read's tiles by the copy engine, through this map of its capture)
#define IOK_MOD_PARAM const int mod_heads, const void* __restrict__ cap0, const void* __restrict__ cap1, \
    const void* __restrict__ cap2, const void* __restrict__ cap3, const __grid_constant__ IokTensorMap tm_mask,
#else
#define IOK_MOD_PARAM const int mod_heads, const void* __restrict__ cap0, const void* __restrict__ cap1, \
    const void* __restrict__ cap2, const void* __restrict__ cap3,
#endif
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

// Adds the block's bytes to its slot of global_counters: [slot][2*T] (read) and [slot][2*T+1] (written), slot = linear
// block index % IOK_COUNTER_SLOTS, so that tens of thousands of blocks do not serialise on one address (the launcher
// sums the slots). Each warp sums its lanes' counts (iok_warp_sum) and its lane 0 adds them, a read and a written
// atomic per tensor that moved bytes: at most 2 · tensors · warps per block, never one per element (DESIGN.md's rule
// 5), and no shared memory or barrier, so a kernel's warps may come to it in any order and state (a warp-specialized
// kernel's roles, a diverged warp). A block-wide sum through shared memory behind __syncthreads, this flush until
// issue #21, drew an intermittent racecheck report in the tma forward whatever its barrier's form
// (results/h100/issue21/band/README.md). Every thread of the block calls it once, after its last counted access.
template <int... Ts>
__device__ __forceinline__ void iok_flush(IokCounters<Ts...>& c, unsigned long long* global_counters)
{
    constexpr int NT = static_cast<int>(sizeof...(Ts));
    constexpr int ids[] = {Ts...};
    const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = tid & 31u;
    const unsigned lanes = min(32u, nthreads - (tid & ~31u));  // the last warp of a block may be partial
    const unsigned mask = lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u;
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned long long* slot = global_counters + (block % IOK_COUNTER_SLOTS) * (2 * IOK_NUM_TENSORS);
#pragma unroll
    for (int i = 0; i < NT; ++i) {  // static indices: the counts stay in registers
        const unsigned long long r = iok_warp_sum(c.r[i], mask), w = iok_warp_sum(c.w[i], mask);
        if (lane == 0 && r != 0) atomicAdd(slot + 2 * ids[i], r);
        if (lane == 0 && w != 0) atomicAdd(slot + 2 * ids[i] + 1, w);
    }
}

#else

// Nothing: the plain build has no counters.
template <int... Ts>
__device__ __forceinline__ void iok_flush(IokCounters<Ts...>&, unsigned long long*)
{
}

#endif  // IOK_COUNT
