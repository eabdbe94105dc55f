// Byte counting shared by every iokernels kernel (DESIGN.md, "IO accounting rules").
//
// build_source() inlines this file after a prelude of #defines: IOK_NUM_TENSORS, one IOK_T_<name>
// per tensor of iokernels/tensors.py, and IOK_COUNT in the counting build only.
//
// Kernel conventions:
//   - the last parameter is `unsigned long long* __restrict__ iok_counters` in both builds, so one
//     launcher serves both: 2 * IOK_NUM_TENSORS zeroed u64 in the counting build, may be null in the
//     plain build;
//   - every global load, store and atomic goes through iok_ld / iok_st / iok_atomic_add<IOK_T_x>;
//   - all threads of the block call iok_flush(c, iok_counters, smem) once, last.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef IOK_NUM_TENSORS
#error "IOK_NUM_TENSORS is defined by iokernels.kernels.build_source; compile its output, not this file"
#endif

// Makes a parameter a non-deduced context: the stored type comes from the pointer alone, so
// iok_st<IOK_T_O>(c, half_ptr, float_value) converts instead of failing deduction.
template <typename X> struct iok_same { using type = X; };

// Scratch iok_flush needs: one u64 per warp.
#define IOK_FLUSH_SCRATCH_BYTES(nthreads) ((((nthreads) + 31) / 32) * 8)

#ifdef IOK_COUNT

// Per-thread counters in registers; the tensor index is a template argument everywhere, so the
// arrays are only ever indexed statically and never spill to local memory.
struct IokCounters {
    unsigned long long r[IOK_NUM_TENSORS] = {};
    unsigned long long w[IOK_NUM_TENSORS] = {};
};

template <int T, typename X>
__device__ __forceinline__ X iok_ld(IokCounters& c, const X* p)
{
    static_assert(T >= 0 && T < IOK_NUM_TENSORS, "tensor index out of range");
    c.r[T] += sizeof(X);
    return *p;
}

template <int T, typename X>
__device__ __forceinline__ void iok_st(IokCounters& c, X* p, typename iok_same<X>::type v)
{
    static_assert(T >= 0 && T < IOK_NUM_TENSORS, "tensor index out of range");
    c.w[T] += sizeof(X);
    *p = v;
}

// Rule 4: a read-modify-write of b bytes counts b read and b written.
template <int T, typename X>
__device__ __forceinline__ X iok_atomic_add(IokCounters& c, X* p, typename iok_same<X>::type v)
{
    static_assert(T >= 0 && T < IOK_NUM_TENSORS, "tensor index out of range");
    c.r[T] += sizeof(X);
    c.w[T] += sizeof(X);
    return atomicAdd(p, v);
}

// Block sum of one counter; thread 0 adds it to *dst. Called by every thread of the block.
__device__ __forceinline__ void iok_flush_one(unsigned long long v, unsigned long long* dst,
                                              unsigned long long* scratch)
{
    // A counter that is zero at compile time is zero in every thread: skip it uniformly, so the
    // barriers below are paid only for the tensors the kernel touches.
    if (__builtin_constant_p(v) && v == 0) return;

    const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = tid & 31u;
    const unsigned warp = tid >> 5;
    const unsigned nwarps = (nthreads + 31u) >> 5;

    // The last warp may be partial: values shuffled from lanes past its end are ignored.
    unsigned lanes = min(32u, nthreads - warp * 32u);
    unsigned mask = lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u;
#pragma unroll
    for (unsigned off = 16; off > 0; off >>= 1) {
        const unsigned long long u = __shfl_down_sync(mask, v, off);
        if (lane + off < lanes) v += u;
    }
    if (lane == 0) scratch[warp] = v;
    __syncthreads();  // per-warp partials visible to warp 0
    if (warp == 0) {
        lanes = min(32u, nthreads);
        mask = lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u;
        v = lane < nwarps ? scratch[lane] : 0ull;
#pragma unroll
        for (unsigned off = 16; off > 0; off >>= 1) {
            const unsigned long long u = __shfl_down_sync(mask, v, off);
            if (lane + off < lanes) v += u;
        }
        if (lane == 0 && v != 0) atomicAdd(dst, v);  // rule 5: once per block, not per element
    }
    __syncthreads();  // warp 0 has read scratch before the next counter overwrites it
}

template <int T = 0>
__device__ __forceinline__ void iok_flush_from(IokCounters& c, unsigned long long* g,
                                               unsigned long long* scratch)
{
    if constexpr (T < IOK_NUM_TENSORS) {
        iok_flush_one(c.r[T], g + 2 * T, scratch);
        iok_flush_one(c.w[T], g + 2 * T + 1, scratch);
        iok_flush_from<T + 1>(c, g, scratch);
    }
}

// Adds the block's bytes to global_counters[2*T] (read) and [2*T+1] (written).
// Every thread of the block calls it once, after its last counted access. scratch_smem is the
// kernel's own shared memory, reused (the first barrier waits until the block is done with it):
// it must be 8-byte aligned and hold IOK_FLUSH_SCRATCH_BYTES(threads per block) bytes.
__device__ __forceinline__ void iok_flush(IokCounters& c, unsigned long long* global_counters,
                                          void* scratch_smem)
{
    __syncthreads();  // the kernel may still be reading the shared memory used as scratch
    iok_flush_from(c, global_counters, static_cast<unsigned long long*>(scratch_smem));
}

#else  // plain build: no counting code, the helpers are the bare access

struct IokCounters {};

template <int T, typename X>
__device__ __forceinline__ X iok_ld(IokCounters&, const X* p)
{
    static_assert(T >= 0 && T < IOK_NUM_TENSORS, "tensor index out of range");
    return *p;
}

template <int T, typename X>
__device__ __forceinline__ void iok_st(IokCounters&, X* p, typename iok_same<X>::type v)
{
    static_assert(T >= 0 && T < IOK_NUM_TENSORS, "tensor index out of range");
    *p = v;
}

template <int T, typename X>
__device__ __forceinline__ X iok_atomic_add(IokCounters&, X* p, typename iok_same<X>::type v)
{
    static_assert(T >= 0 && T < IOK_NUM_TENSORS, "tensor index out of range");
    return atomicAdd(p, v);
}

// No barrier either: kernels must not rely on iok_flush to synchronize.
__device__ __forceinline__ void iok_flush(IokCounters&, unsigned long long*, void*) {}

#endif  // IOK_COUNT
