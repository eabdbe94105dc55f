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
// The same for a 4-D map (coordinates c0 innermost .. c3): an explicit mask's tiles (flash_tma.cu MOD_TMA).
__device__ __forceinline__ void iok_tma_load_4d(void* dst, const IokTensorMap* map, unsigned long long* bar, int c0,
                                                int c1, int c2, int c3)
{
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
        "[%2];\n" ::"r"(iok_smem_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(iok_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
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
// A ROWS x COLS tile of E-byte elements of a 4-D map of 128-byte boxes (an explicit mask's, flash_tma.cu MOD_TMA) at
// element coordinates (col0, row0, c2, c3): COLS / (128 / E) boxes of ROWS rows on barrier `bar`, counted as the
// bytes it reads of tensor TI: its rows before `rows` and columns before `cols` (the others zero-filled, not read).
template <int TI, int ROWS, int COLS, int E, int... Ts>
__device__ __forceinline__ void wg_tma_boxes(IokCounters<Ts...>& io, unsigned char* dst, const IokTensorMap* map,
                                             unsigned long long* bar, int col0, int row0, int c2, int c3, int rows,
                                             int cols)
{
    constexpr int slot = iok_slot<TI, Ts...>(), BOX = 128 / E;
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    static_assert(COLS % BOX == 0, "whole boxes");
    if constexpr (IokCounters<Ts...>::counting) {
        io.r[slot] += static_cast<unsigned long long>(max(0, min(ROWS, rows - row0))) * max(0, min(COLS, cols - col0))
                      * E;
    }
#pragma unroll
    for (int c = 0; c < COLS / BOX; ++c) iok_tma_load_4d(dst + c * ROWS * 128, map, bar, col0 + c * BOX, row0, c2, c3);
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
