// Shared-memory tiles and synchronisation for the sm_90a warpgroup kernels (flash_wgmma.cu,
// flash_wgmma_bwd.cu;
// the products themselves are in the generated wgmma.cuh).
//
// Tiles are stored the way wgmma reads them: HEAD_D / 64 slabs of [rows][64 elements], 128-byte rows
// whose 16-byte chunks are XOR-swizzled by (row % 8) (the 128-byte swizzle), each slab 1024-byte
// aligned when the tile is. A K-major operand (the reduction runs along the 64-element rows) moves its
// descriptor by 32 bytes per 16-wide step inside a slab and by the slab's size from slab to slab; an
// MN-major operand (the reduction runs down the rows) moves by 16 rows (2048 bytes) per step, with the
// slab stride as the descriptor's leading byte offset.
#pragma once

#if !defined(HEAD_D) || !defined(THREADS)
#error "wg.cuh needs HEAD_D and THREADS from the plan"
#endif

constexpr float WG_LOG2E = 1.4426950408889634f;
constexpr int WG_ROW_CHUNKS = HEAD_D / 8;  // 16-byte chunks per row of a HEAD_D-wide tile

// Element offset of (row, col) in a ROWS-row tile stored as 128-byte-swizzled slabs of 64 columns
// (the 16-byte chunk moves with the swizzle, the element keeps its place in the chunk).
template <int ROWS>
__device__ __forceinline__ int wg_off(int row, int col)
{
    return (col >> 6) * (ROWS * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// rows [0, rows_valid) of a ROWS-row, HEAD_D-wide tile from global memory (row stride HEAD_D), 16 bytes
// per counted cp.async; rows past the end are zero-filled, nothing read, nothing counted.
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
        const bool valid = row < rows_valid;  // a zero-filled row points at row 0 (always valid)
        iok_cp_async16<TI>(io, s + wg_off<ROWS>(row, col), g + static_cast<size_t>(valid ? row : 0) * HEAD_D + col,
                           valid);
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
template <int N>
__device__ __forceinline__ void wg_fence_regs(unsigned (&r)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
    }
}
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to wgmma's reads (the
// async proxy); a block barrier follows.
__device__ __forceinline__ void wg_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Two floats -> one register of two T (low half = first).
template <typename T>
__device__ __forceinline__ unsigned wg_pack(float lo, float hi)
{
    return to_bits(from_f<T>(lo)) | (to_bits(from_f<T>(hi)) << 16);
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
