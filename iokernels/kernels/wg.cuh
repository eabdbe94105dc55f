// Shared-memory tiles and synchronisation for the sm_90a warpgroup kernels (flash_wgmma.cu,
// flash_wgmma_bwd.cu;
// the products themselves are in the generated wgmma.cuh).
//
// Tiles are stored the way wgmma reads them: TILE_D / 64 slabs of [rows][64 elements], 128-byte rows
// whose 16-byte chunks are XOR-swizzled by (row % 8) (the 128-byte swizzle), each slab 1024-byte
// aligned when the tile is. A K-major operand (the reduction runs along the 64-element rows) moves its
// descriptor by 32 bytes per 16-wide step inside a slab and by the slab's size from slab to slab; an
// MN-major operand (the reduction runs down the rows) moves by 16 rows (2048 bytes) per step, with the
// slab stride as the descriptor's leading byte offset.
#pragma once

#if !defined(HEAD_D) || !defined(THREADS)
#error "wg.cuh needs HEAD_D and THREADS from the plan"
#endif

// TILE_D: the tiles' width, a multiple of 64 (HEAD_D itself, or the plan's HEAD_D_TILE where the problem's d is
// not one); HEAD_D, the problem's d, is a multiple of 8 in its last 64-column slab. Columns past d are zero in
// every tile (the copy engine's fill, or wg_load_tile's), so they add nothing to a product; the row strides in
// global memory are HEAD_D's.
#ifdef HEAD_D_TILE
constexpr int TILE_D = HEAD_D_TILE;
#else
constexpr int TILE_D = HEAD_D;
#endif
static_assert(TILE_D % 64 == 0 && HEAD_D % 8 == 0 && TILE_D - 64 < HEAD_D && HEAD_D <= TILE_D,
              "d within its tile's last 64-column slab");

constexpr float WG_LOG2E = 1.4426950408889634f;
constexpr int WG_ROW_CHUNKS = TILE_D / 8;  // 16-byte chunks per row of a tile

// Element offset of (row, col) in a ROWS-row tile stored as 128-byte-swizzled slabs of 64 columns
// (the 16-byte chunk moves with the swizzle, the element keeps its place in the chunk).
template <int ROWS>
__device__ __forceinline__ int wg_off(int row, int col)
{
    return (col >> 6) * (ROWS * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// rows [0, rows_valid) of a ROWS-row, TILE_D-wide tile from global memory (row stride HEAD_D), 16 bytes
// per counted cp.async; rows past the end and columns past HEAD_D are zero-filled, nothing read, nothing
// counted (where TILE_D == HEAD_D the column test folds away at compile time).
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
        const bool valid = row < rows_valid && (TILE_D == HEAD_D || col < HEAD_D);
        // a zero-filled chunk points into row 0 (always valid): its own column, or column 0 past HEAD_D
        const int src_col = TILE_D == HEAD_D || valid ? col : 0;
        iok_cp_async16<TI>(io, s + wg_off<ROWS>(row, col),
                           g + static_cast<size_t>(valid ? row : 0) * HEAD_D + src_col, valid);
    }
}

// The thread's warpgroup, read from lane 0 by a shuffle so that the compiler knows every lane has the same: what is
// computed from it (the descriptors of a warpgroup's operands) then lives in uniform registers, with no R2UR before
// each product (SASS of the sm_90 backward, 2026-11-28: 64 a step)
__device__ __forceinline__ int wg_index() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0); }

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading and
// stride byte offsets (16-byte units), 128-byte swizzle.
__device__ __forceinline__ unsigned long long wg_desc(const void* p, unsigned lead_bytes, unsigned stride_bytes)
{
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4)
           | (static_cast<unsigned long long>(lead_bytes >> 4) << 16)
           | (static_cast<unsigned long long>(stride_bytes >> 4) << 32) | (1ull << 62);
}
// The descriptor of the operand `bytes` (a multiple of 16) past desc's: the start address field (bits 0-13) holds the
// shared address over 16, and shared addresses stay under 2^18, so the field takes the offset with no carry out of it.
// One add on the low word per product, where wg_desc of the moved pointer took four (add, mask, shift, or: SASS of the
// sm_90 backward, 2026-11-28); the base descriptor is computed once per tile.
__device__ __forceinline__ unsigned long long wg_desc_add(unsigned long long desc, unsigned bytes)
{
    return (desc & 0xFFFFFFFF00000000ull) | (static_cast<unsigned>(desc) + (bytes >> 4));
}
// K-major operand: step kk (16 wide) of a ROWS-row tile, starting at row row0.
template <int ROWS>
__device__ __forceinline__ unsigned long long wg_desc_k(const unsigned char* tile, int row0, int kk)
{
    return wg_desc_add(wg_desc(tile, 16, 1024), row0 * 128 + (kk & 3) * 32 + (kk >> 2) * ROWS * 128);
}
// MN-major operand: rows [16 kk, 16 kk + 16) of a ROWS-row tile, columns from slab slab0 on.
template <int ROWS>
__device__ __forceinline__ unsigned long long wg_desc_mn(const unsigned char* tile, int slab0, int kk)
{
    return wg_desc_add(wg_desc(tile, ROWS * 128, 1024), slab0 * ROWS * 128 + kk * 16 * 128);
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
// Pins where registers are computed or first used (no memory clobber: nothing else is ordered).
template <int N>
__device__ __forceinline__ void wg_pin(unsigned (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]));
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
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to the async proxy's reads (wgmma,
// the copy engine's bulk copies); a barrier follows.
__device__ __forceinline__ void wg_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Two floats -> one register of two T (low half = first), each rounded to nearest even (tiles.cuh's tc_pack).
// bfloat16 through the packed intrinsic, one F2FP.BF16.F32.PACK_AB, the same bits: from two separate roundings
// ptxas packs only some pairs and leaves single F2F.BF16.F32 on the quarter-rate pipe exp2 also uses (the
// mma.sync kernels keep tc_pack: the packed form makes their counting builds spill).
template <typename T>
__device__ __forceinline__ unsigned wg_pack(float lo, float hi)
{
    return tc_pack<T>(lo, hi);
}
template <>
__device__ __forceinline__ unsigned wg_pack<__nv_bfloat16>(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo, the low half
    return *reinterpret_cast<const unsigned*>(&v);
}

// One register of two T (as wg_pack makes it) -> two floats (low half first).
template <typename T>
__device__ __forceinline__ float2 wg_unpack(unsigned w)
{
    return make_float2(to_f(from_bits<T>(static_cast<unsigned short>(w & 0xffffu))),
                       to_f(from_bits<T>(static_cast<unsigned short>(w >> 16))));
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

#ifdef DROPOUT
// Dropout (common.cuh, iokernels/plan/dropout.py): element (bh, i, j) of P takes byte j % 16 of the Philox call of
// counter (j / 16, i, bh, offset), so one call (iok_keep16) serves 16 adjacent keys of one query row. In an m64nN
// accumulator fragment, thread (g, t) of a warp holds element e = 4n + 2h + c (n < N / 8, h, c in {0, 1}) at row
// g + 8h of the warp's 16 and column 8n + 2t + c. The helpers below draw each call once, in one lane, and pass its
// 16 keep bits to the lanes that hold them.

// All ones where bit `bit` of `bits` is set, else 0. Integer masks rather than selects: the compiler turns
// selects into predicates it hoists and keeps, which spills the backward's registers.
__device__ __forceinline__ unsigned wg_bit_mask(unsigned bits, int bit)
{
    return 0u - ((bits >> bit) & 1u);
}
// x where bit `bit` of `bits` is set (kept), else 0 (dropped; the keep scale is applied later).
__device__ __forceinline__ float wg_keep(float x, unsigned bits, int bit)
{
    return __uint_as_float(__float_as_uint(x) & wg_bit_mask(bits, bit));
}
// The same on a register of two T (wg_pack's layout): the low half kept iff bit lo_bit of lo, the high half
// iff bit hi_bit of hi.
__device__ __forceinline__ unsigned wg_keep2(unsigned x, unsigned lo, int lo_bit, unsigned hi, int hi_bit)
{
    return x & ((wg_bit_mask(lo, lo_bit) & 0x0000ffffu) | (wg_bit_mask(hi, hi_bit) & 0xffff0000u));
}

// Rows are queries, columns keys (the forward's S): keep[h] bit 2n + c is element 4n + 2h + c of the thread's
// fragment, row `row` + 8h (query), column col0 + 8n + 2t + c (key; col0 a multiple of 16). The four lanes of a
// quad hold a row's 16 keys of a call: of the quad's 2 N / 16 (row, 16-key group) calls, lane t draws those k = t
// (mod 4) and the quad exchanges them (shuffles of width 4): N / 32 Philox calls per thread.
template <int N>
__device__ __forceinline__ void wg_dropout_rows(unsigned (&keep)[2], unsigned threshold, unsigned long long seed,
                                                unsigned offset, unsigned bh, unsigned row, unsigned col0, int t)
{
    static_assert(N % 32 == 0 && N <= 128, "whole calls per lane, two bits per 8 columns in one register");
    constexpr int G = N / 16;  // 16-key groups of a row
    unsigned mine[N / 32];
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
        const int k = 4 * u + t;
        mine[u] = iok_keep16(threshold, seed, offset, bh, row + 8 * (k / G), col0 + 16 * (k % G));
    }
    keep[0] = keep[1] = 0u;
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const unsigned m = __shfl_sync(0xffffffffu, mine[u], s, 4);  // call k = 4u + s: row 8 (k / G), group k % G
            const int k = 4 * u + s, h = k / G, grp = k % G;
            const unsigned lo = (m >> (2 * t)) & 3u, hi = (m >> (8 + 2 * t)) & 3u;  // n = 2 grp and 2 grp + 1
            keep[h] |= (lo | (hi << 2)) << (4 * grp);
        }
    }
}

// Rows are keys, columns queries (the backward's Sᵀ = K Qᵀ): element e = 4n + 2h + c of the thread's fragment,
// row key0 + g + 8h (key; key0 a multiple of 16), column q0 + 8n + 2t + c (query), is kept iff bit
// wg_cols_bit<N>(e) of the WG_COLS_REGS<N> registers `keep` (bit b: register b / 32, bit b % 32) is set.
// One call serves a query's 16 keys, which the eight lanes g of one t hold: of their N / 4 queries (k = 2n + c),
// lane g draws those k = g (mod 8) and the eight exchange them: N / 32 Philox calls per thread.
template <int N>
constexpr int WG_COLS_REGS = (N / 2 + 31) / 32;
template <int N>
__device__ constexpr int wg_cols_bit(int e)
{
    return (e & 3) * (N / 8) + (e >> 2);  // N / 8 bits (over n) per (h, c)
}
template <int N>
__device__ __forceinline__ void wg_dropout_cols(unsigned (&keep)[WG_COLS_REGS<N>], unsigned threshold,
                                                unsigned long long seed, unsigned offset, unsigned bh, unsigned key0,
                                                unsigned q0, int g, int t)
{
    static_assert(N % 32 == 0 && N <= 128 && 32 % (N / 8) == 0, "whole calls per lane; the (h, c) bit groups");
    unsigned mine[N / 32];
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
        const int k = 8 * u + g;  // query 8 (k / 2) + 2t + k % 2
        mine[u] = iok_keep16(threshold, seed, offset, bh, q0 + 8 * (k >> 1) + 2 * t + (k & 1), key0);
    }
#pragma unroll
    for (int i = 0; i < WG_COLS_REGS<N>; ++i) keep[i] = 0u;
#pragma unroll
    for (int u = 0; u < N / 32; ++u) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            const unsigned m = __shfl_sync(0xffffffffu, mine[u], 4 * s + t);  // query k = 8u + s of this t
            const int k = 8 * u + s, n = k >> 1, c = k & 1;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                constexpr int per = N / 8;
                const int b = (2 * h + c) * per + n;
                keep[b / 32] |= ((m >> (g + 8 * h)) & 1u) << (b % 32);
            }
        }
    }
}
#endif
