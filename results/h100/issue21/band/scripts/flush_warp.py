"""Runs san_band.py with iok_flush replaced, in the source text compiled (common.cuh as read by
iokernels.kernels.sources.read_source), by a flush without shared memory or barriers: each warp's lane 0 adds its
warp's sums to the block's slot (a trial against racecheck's report; not the package's flush)."""
import re
import runpy
import sys

from iokernels.kernels import sources

WARP_FLUSH = r"""template <int... Ts>
__device__ __forceinline__ void iok_flush(IokCounters<Ts...>& c, unsigned long long* global_counters, void*)
{
    constexpr int NT = static_cast<int>(sizeof...(Ts));
    constexpr int ids[] = {Ts...};
    const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned lane = tid & 31u;
    const unsigned lanes = min(32u, nthreads - (tid & ~31u));
    const unsigned mask = lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u;
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned long long* slot = global_counters + (block % IOK_COUNTER_SLOTS) * (2 * IOK_NUM_TENSORS);
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const unsigned long long r = iok_warp_sum(c.r[i], mask), w = iok_warp_sum(c.w[i], mask);
        if (lane == 0 && r != 0) atomicAdd(slot + 2 * ids[i], r);
        if (lane == 0 && w != 0) atomicAdd(slot + 2 * ids[i] + 1, w);
    }
}

"""
original = sources.read_source


def patched(name: str) -> str:
    text = original(name)
    if name != "common.cuh":
        return text
    start = text.index("template <int... Ts>\n__device__ __forceinline__ void iok_flush(IokCounters<Ts...>& c")
    end = text.index("#else\n\n// No barrier either", start)
    return text[:start] + WARP_FLUSH + text[end:]


sources.read_source = patched
assert re.search(r"lane == 0 && r != 0", sources.build_source("selftest.cu", {"BLOCK_ROWS": 4}, True))
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
