// The decode step's append (issue #23; iokernels/plan/decode.py, stage "append"; plan/kvcache.py): the new keys and
// values of each sequence, Knew and Vnew (batch · kv_heads, n_new, HEAD_D), written into its cache right after its
// cached keys (row seqlens[b] + r of the contiguous cache (batch · kv_heads, n_k, HEAD_D), or of the paged pool
// (pages · kv_heads, PAGED, HEAD_D) through the page table) before the attention (flash_tma.cu) reads them. A warp per
// new row of one K/V head (THREADS / 32 rows per block, grid (⌈n_new / rows⌉, 1, batch · kv_heads)): lane 0 reads the
// sequence's length (and the page's entry) once, each lane copies 16 bytes of K and of V (HEAD_D ≤ 256: one chunk).
// A row whose position lies past the capacity (or, paged, past the page table's columns or on a negative page entry)
// is skipped: never written over another sequence's keys (a page number past the pool is not checked).
//
// Counting: each 16-byte chunk read of Knew, Vnew and written of K, V; the length and the page entry once per row.
#include "common.cuh"

#if !defined(HEAD_D) || !defined(THREADS) || !defined(RAGGED)
#error "kvcache.cu needs HEAD_D, THREADS and a cache of per-sequence lengths (RAGGED) from the plan"
#endif
constexpr int CHUNKS = HEAD_D * 2 / 16;  // 16-byte chunks of a row of 2-byte elements
static_assert(HEAD_D % 8 == 0 && CHUNKS <= 32 && THREADS % 32 == 0, "a lane per 16 bytes of a row");

template <typename T>
__global__ void __launch_bounds__(THREADS)
kv_append(const T* __restrict__ Knew, const T* __restrict__ Vnew, T* __restrict__ K, T* __restrict__ V, int n_new,
          int n_k, IOK_CACHE_PARAM unsigned long long* __restrict__ iok_counters)
{
    IokCounters<IOK_T_Knew, IOK_T_Vnew, IOK_T_K, IOK_T_V IOK_CACHE_T> io;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * (THREADS / 32) + warp;  // the new row
    const int z = blockIdx.z, heads_kv = gridDim.z / batch, seq = z / heads_kv;
    if (r < n_new) {
        int pos = 0;
        size_t dst = 0;  // the row of K and V it goes to
        if (lane == 0) pos = iok_ld<IOK_T_seqlens>(io, seqlens + seq) + r;
        pos = __shfl_sync(0xffffffffu, pos, 0);
        bool inside = pos >= 0 && pos < n_k;  // (n_k: the capacity, max_pages · PAGED when paged)
#ifdef PAGED
        int page = 0;
        const int* entry = page_table + static_cast<size_t>(seq) * max_pages + pos / PAGED;
        if (lane == 0 && inside) page = iok_ld<IOK_T_page_table>(io, entry);
        page = __shfl_sync(0xffffffffu, page, 0);
        inside = inside && page >= 0;
        dst = (static_cast<size_t>(page) * heads_kv + z % heads_kv) * PAGED + pos % PAGED;
#else
        dst = static_cast<size_t>(z) * n_k + pos;
#endif
        const size_t src = static_cast<size_t>(z) * n_new + r;
        if (lane < CHUNKS && inside) {
            const uint4* kn = reinterpret_cast<const uint4*>(Knew + src * HEAD_D) + lane;
            const uint4* vn = reinterpret_cast<const uint4*>(Vnew + src * HEAD_D) + lane;
            iok_st<IOK_T_K>(io, reinterpret_cast<uint4*>(K + dst * HEAD_D) + lane, iok_ld<IOK_T_Knew>(io, kn));
            iok_st<IOK_T_V>(io, reinterpret_cast<uint4*>(V + dst * HEAD_D) + lane, iok_ld<IOK_T_Vnew>(io, vn));
        }
    }
    iok_flush(io, iok_counters);
}
