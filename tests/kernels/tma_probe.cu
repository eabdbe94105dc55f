// A test kernel for kernels/tma.cuh and kernels/tensormap.py (tests/kernels/test_tma.py compiles it,
// tests/gpu/test_tma.py runs it): one block loads the HEAD_D-wide, ROWS-row tile of head `z` from row `r0`
// on through TMA (HEAD_D / 64 boxes on one mbarrier) and copies its shared memory, as laid out, to `out`.
#if !defined(ROWS) || !defined(HEAD_D)
#error "tma_probe.cu needs ROWS and HEAD_D"
#endif
extern "C" __global__ void __launch_bounds__(128, 1)
tma_probe(const __grid_constant__ IokTensorMap map, unsigned short* __restrict__ out, int r0, int z)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long full;
    if (threadIdx.x == 0) {
        iok_tma_prefetch_map(&map);
        iok_mbar_init(&full, 1);
        iok_mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        iok_mbar_expect_tx(&full, ROWS * HEAD_D * 2);  // the full boxes, zero-filled rows included
        for (int s = 0; s < HEAD_D / 64; ++s) iok_tma_load_3d(smem + s * ROWS * 128, &map, &full, 64 * s, r0, z);
    }
    iok_mbar_wait(&full, 0);
    const unsigned short* tile = reinterpret_cast<const unsigned short*>(smem);
    for (int i = threadIdx.x; i < ROWS * HEAD_D; i += blockDim.x) out[i] = tile[i];
}
