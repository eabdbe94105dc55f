// Counted accesses shared by the tensor-core backward kernels (flash_tc_bwd.cu, flash_wgmma_bwd.cu),
// following common.cuh's pattern: the count sits beside the access (DESIGN.md rule 6).
#pragma once

#if !defined(THREADS)
#error "bwd.cuh needs THREADS from the plan"
#endif

// One float, global -> shared, by a 4-byte cp.async, counted as 4 bytes read of tensor TI. With
// valid == false the float is zero-filled and nothing is read or counted (src must still point into
// the tensor).
template <int TI, int... Ts>
__device__ __forceinline__ void bwd_cp_async4(IokCounters<Ts...>& c, float* dst, const float* src, bool valid)
{
    constexpr int slot = iok_slot<TI, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) c.r[slot] += valid ? 4u : 0u;
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}

// ROWS row scalars (lse or D of a block of rows), rows [0, rows_valid) read, the rest zero.
template <int TI, int ROWS, typename C>
__device__ __forceinline__ void bwd_load_scalars(C& io, float* s, const float* g, int rows_valid)
{
#pragma unroll
    for (int r = threadIdx.x; r < ROWS; r += THREADS) {
        const bool valid = r < rows_valid;
        bwd_cp_async4<TI>(io, s + r, g + (valid ? r : 0), valid);
    }
}

// p[0] += a, p[1] += b in global memory (p 8-byte aligned): a read-modify-write of 8 bytes, counted
// as 8 read and 8 written (DESIGN.md rule 4), like two float iok_atomic_add.
template <int TI, int... Ts>
__device__ __forceinline__ void bwd_red_add2(IokCounters<Ts...>& c, float* p, float a, float b)
{
    constexpr int slot = iok_slot<TI, Ts...>();
    static_assert(slot >= 0, "tensor not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) {
        c.r[slot] += 8u;
        c.w[slot] += 8u;
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}
