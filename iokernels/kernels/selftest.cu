// Self-test of common.cuh, used the way the attention kernels use it: a ragged tile staged through
// shared memory, a float atomic, and the counter flush.
//
//   O[r, j] = scale * Q[r, cols - 1 - j]    (each row reversed, so a thread stores what another loaded)
//   dQacc[0] += sum(Q)                       (one atomic per warp that loaded anything)
//
// Launch: grid = ceil(rows / BLOCK_ROWS), block = a multiple of 32 threads,
// dynamic shared memory = BLOCK_ROWS * cols * 4 bytes.
// Expected bytes: Q read = O written = rows * cols * sizeof(T); dQacc 4 read + 4 written per atomic.
#include "common.cuh"

#ifndef BLOCK_ROWS
#error "BLOCK_ROWS comes from the compile variant"
#endif

template <typename T>
__global__ void iok_selftest(const T* __restrict__ q, T* __restrict__ o, float* __restrict__ dqacc,
                             int rows, int cols, float scale,
                             unsigned long long* __restrict__ iok_counters)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float* tile = reinterpret_cast<float*>(smem);
    IokCounters<IOK_T_Q, IOK_T_O, IOK_T_dQacc> c;  // the tensors this kernel moves

    const int row0 = blockIdx.x * BLOCK_ROWS;
    const int n = min(BLOCK_ROWS, rows - row0) * cols;  // the last tile is ragged: load only real rows
    const size_t base = static_cast<size_t>(row0) * cols;

    // Qi -> SRAM in float, whatever T is; the partial sum rides along.
    float partial = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = static_cast<float>(iok_ld<IOK_T_Q>(c, q + base + i));
        tile[i] = x;
        partial += x;
    }
    __syncthreads();  // each output element reads a tile element another thread loaded

    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int r = i / cols;
        const int j = i - r * cols;
        iok_st<IOK_T_O>(c, o + base + i, T(scale * tile[r * cols + cols - 1 - j]));
    }

#pragma unroll
    for (int off = 16; off > 0; off >>= 1) partial += __shfl_down_sync(0xffffffffu, partial, off);
    const bool warp_loaded = __any_sync(0xffffffffu, static_cast<int>(threadIdx.x) < n);
    if ((threadIdx.x & 31u) == 0 && warp_loaded) iok_atomic_add<IOK_T_dQacc>(c, dqacc, partial);

    iok_flush(c, iok_counters);
}

// Dropout's stream on the device (common.cuh iok_keep16, iok_dropout) for n given elements (bh[x], i[x], j[x]):
// keep[x] = the keep bits of the element's 16-key group (bit e: key 16 (j / 16) + e) and z[x] = its multiplier
// (keep_scale or 0), for a GPU test to compare with iokernels.plan.dropout in numpy.
// Launch: any 1-D grid; no shared memory, no counters.
extern "C" __global__ void iok_dropout_selftest(const unsigned int* __restrict__ bh, const unsigned int* __restrict__ i,
                                                const unsigned int* __restrict__ j, unsigned int* __restrict__ keep,
                                                float* __restrict__ z, int n, unsigned int threshold,
                                                float keep_scale, unsigned long long seed, unsigned int offset)
{
    for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < n; x += gridDim.x * blockDim.x) {
        keep[x] = iok_keep16(threshold, seed, offset, bh[x], i[x], j[x]);
        z[x] = iok_dropout(threshold, keep_scale, seed, offset, bh[x], i[x], j[x]);
    }
}
