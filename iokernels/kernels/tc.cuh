// Tensor-core helpers of flash_tc.cu (forward) and flash_tc_bwd.cu (backward): ldmatrix (plain and
// .trans) and tiles of HEAD_D-element rows in shared memory whose 16-byte chunks are XOR-swizzled by
// (row % 8), filled by counted cp.async (rows past the end zero-filled). The mma.sync m16n8k16
// wrapper (tc_mma) and tc_pack live in tiles.cuh, which the research kernels share.
//
// Needs HEAD_D (a multiple of 16) and THREADS defined before inclusion, common.cuh and tiles.cuh.
#pragma once

constexpr int TC_CHUNKS = HEAD_D / 8;  // 16-byte chunks per row of 8 halves
constexpr float TC_LOG2E = 1.4426950408889634f;

template <typename T>
__device__ __forceinline__ T* tc_buffer(unsigned char* smem, int offset)
{
    return reinterpret_cast<T*>(smem + offset);
}

// Element offset of (row, chunk) in a swizzled tile of HEAD_D-element rows.
__device__ __forceinline__ int tc_off(int row, int chunk)
{
    return row * HEAD_D + ((chunk ^ (row & 7)) << 3);
}

// rows [0, rows_valid) of a BR- or BC-row tile: global (row stride HEAD_D) -> swizzled shared memory,
// 16 bytes per cp.async; rows past the end are zero-filled, nothing read, nothing counted.
template <int TI, int ROWS, typename T, typename C>
__device__ __forceinline__ void tc_load_tile(C& io, T* s, const T* g, int rows_valid)
{
#pragma unroll
    for (int q = threadIdx.x; q < ROWS * TC_CHUNKS; q += THREADS) {
        const int row = q / TC_CHUNKS, chunk = q % TC_CHUNKS;
        const bool valid = row < rows_valid;  // a zero-filled row points at row 0 (always valid)
        iok_cp_async16<TI>(io, s + tc_off(row, chunk), g + static_cast<size_t>(valid ? row : 0) * HEAD_D + chunk * 8,
                           valid);
    }
}

__device__ __forceinline__ void tc_ldmatrix_x4(unsigned (&r)[4], const void* p)
{
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void tc_ldmatrix_x4_trans(unsigned (&r)[4], const void* p)
{
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
