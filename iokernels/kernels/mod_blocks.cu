// The block mask of a mask_mod (issue #22; iokernels/plan/mods.py block_levels, the library's create_block_mask on
// the GPU): block (x, y) of the grid (⌈n_k / MOD_BLOCK⌉, ⌈n_q / MOD_BLOCK⌉) evaluates MASK_MOD on every element of its
// MOD_BLOCK x MOD_BLOCK block inside the problem, for batch 0 and head 0, its THREADS threads an element each in turn,
// and writes the block's level: 0 where the expression hides every element, 2 where it keeps every one, else 1
// (flash_tma.cu and flash_tma_bwd.cu skip the first and do not evaluate the mask in the second).
//
// Counting: the captured arrays' reads the expression executes (common.cuh IokCap), a byte of levels per block.
#include "common.cuh"

#if !defined(MASK_MOD) || !defined(MOD_BLOCK) || !defined(THREADS)
#error "mod_blocks.cu needs MASK_MOD (the expression), MOD_BLOCK and THREADS"
#endif

__global__ void __launch_bounds__(THREADS)
mod_blocks(unsigned char* __restrict__ levels, const int n_q, const int n_k, IOK_MOD_PARAM
           unsigned long long* __restrict__ iok_counters)
{
    IokCounters<IOK_T_block_mask IOK_MOD_T> io;
    const IokMod mod{{cap0, cap1, cap2, cap3}, mod_heads, n_q, n_k};
    const int q0 = blockIdx.y * MOD_BLOCK, k0 = blockIdx.x * MOD_BLOCK;
    const int rows = min(MOD_BLOCK, n_q - q0), cols = min(MOD_BLOCK, n_k - k0);
    int seen = 0, all = 1;
    for (int e = threadIdx.x; e < rows * cols; e += THREADS) {
        const int keep = iok_mask_mod(io, mod, 0, q0 + e / cols, k0 + e % cols) ? 1 : 0;
        seen |= keep;
        all &= keep;
    }
    seen = __syncthreads_or(seen);
    all = __syncthreads_and(all);
    if (threadIdx.x == 0) {
        iok_st<IOK_T_block_mask>(io, levels + static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x,
                                 static_cast<unsigned char>(all ? 2 : seen ? 1 : 0));
    }
    iok_flush(io, iok_counters);
}
