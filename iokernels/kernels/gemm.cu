// C = alpha * A B: the six matrix products of standard attention (docs/KERNELS.md, gemm.cu).
//
// One block per BM x BN tile of C, for one batch*head (blockIdx.z). It walks K in BK-wide k-slices:
// each slice of its A panel and B panel is loaded from global memory once, into registers D slices
// ahead (so D slices are in flight while one multiplies), then into one of the two shared-memory
// k-slices of A and B. The C tile is stored once, from registers.
//   __half, __nv_bfloat16 (BM >= 32, BK >= 16): tensor cores, mma.sync m16n8k16 with float
//     accumulators; 2 x 4 warps, each a (BM/2) x (BN/4) warp tile; shared tiles keep the global
//     layout, 16-byte chunks XOR-swizzled so ldmatrix reads 8 rows without bank conflicts.
//   float, and the smaller tiles: SIMT, 16 x 16 threads, each a (BM/16) x (BN/16) micro-tile in two
//     halves (rows ty*h and BM/2 + ty*h), read from k-major shared tiles.
// Ragged edges: only in-range elements are loaded (the rest of a slice is zero) or stored.
// CAUSAL (the qk stage of causal plans; common.cuh): C[row][col] = −inf where key col is masked for
// query row (S = τQKᵀ with M = n_q, N = n_k); every element is still computed and stored.
// MASK (the qk stage of plans with an explicit mask; common.cuh): the epilogue reads the mask element of
// every element of S it stores, once, through iok_apply_mask (boolean 0: −inf; additive: τS + mask).
// DROPOUT (pv and dv, whose A operand is the stored P; common.cuh): each k-slice of A is multiplied by the
// dropout multipliers Z of its elements (element (i, j) of P, batch·head blockIdx.z) on its way from
// registers to shared memory, so C = (Z ∘ P) V or (Z ∘ P)ᵀ dO; Z is regenerated, never loaded.
#include "common.cuh"

#if !defined(BM) || !defined(BN) || !defined(BK) || !defined(THREADS) || !defined(SMEM_A) || \
    !defined(SMEM_B) || !defined(SMEM_BYTES)
#error "gemm.cu needs BM, BN, BK, THREADS, SMEM_A, SMEM_B and SMEM_BYTES from the plan"
#endif

static_assert(BM == BN && (BM == 16 || BM == 32 || BM == 64 || BM == 128), "square tiles of 16..128");
static_assert(BK == 8 || BK == 16 || BK == 32, "k-slices of 8, 16 or 32");
static_assert(THREADS == 256, "the thread layouts tile a block as 16 x 16 threads or 2 x 4 warps");
static_assert(SMEM_A % 16 == 0 && SMEM_B % 16 == 0, "16-byte chunks of shared memory");

template <typename T>
__device__ __forceinline__ float gemm_to_float(T x)
{
    return static_cast<float>(x);
}

// True when p is 16-byte aligned and rows of ld elements keep every 16-byte chunk aligned.
template <typename T>
__device__ __forceinline__ bool gemm_vector_ok(const T* p, size_t ld)
{
    return reinterpret_cast<size_t>(p) % 16 == 0 && ld % (16 / sizeof(T)) == 0;
}

// Element offset of 16-byte chunk `unit` of `row` in a swizzled ROWS x COLS tile: XOR-ing the chunk
// index with the row's position in its 128-byte line spreads 8 consecutive rows over all 32 banks.
template <typename T, int COLS>
__device__ __forceinline__ int gemm_swizzle(int row, int unit)
{
    constexpr int UNITS = COLS * static_cast<int>(sizeof(T)) / 16;
    constexpr int ROWS_PER_LINE = UNITS >= 8 ? 1 : 8 / UNITS;
    constexpr int LINE_MASK = (UNITS >= 8 ? 8 : UNITS) - 1;
    return row * COLS + (unit ^ ((row / ROWS_PER_LINE) & LINE_MASK)) * (16 / static_cast<int>(sizeof(T)));
}

// One operand's k-slice as stored in global memory, ROWS x COLS with COLS contiguous, held in
// registers as 16-byte chunks. Consecutive threads take consecutive chunks of a row (coalesced), or
// with ROW_GROUPS, one chunk of each of 16 consecutive rows, then the next chunk of those rows: the
// SIMT path transposes these slices into k-major shared memory, 2-way bank conflicts at most that
// way, while a warp still reads whole 32-byte sectors of its rows.
template <typename T, int ROWS, int COLS, bool ROW_GROUPS>
struct GemmSlice {
    static constexpr int VEC = 16 / static_cast<int>(sizeof(T));
    static constexpr int UNITS = COLS / VEC;
    static constexpr int CHUNKS = ROWS * UNITS;
    static constexpr int PER_THREAD = (CHUNKS + THREADS - 1) / THREADS;
    static constexpr int GROUP = 16;
    static_assert(COLS % VEC == 0, "slices are whole 16-byte chunks wide");
    static_assert(!ROW_GROUPS || ROWS % GROUP == 0, "whole row groups");

    uint4 v[PER_THREAD];

    static __device__ __forceinline__ int row_of(int q)
    {
        return ROW_GROUPS ? q % GROUP + q / (GROUP * UNITS) * GROUP : q / UNITS;
    }
    static __device__ __forceinline__ int unit_of(int q) { return ROW_GROUPS ? q / GROUP % UNITS : q % UNITS; }
    static __device__ __forceinline__ bool exists(int q) { return CHUNKS % THREADS == 0 || q < CHUNKS; }

    // g: the slice's first element; rows_valid, cols_valid: how much of the slice is in range.
    // vector: whole 16-byte loads (gemm_vector_ok); else element by element, same bytes counted.
    template <int TI, typename Counters>
    __device__ __forceinline__ void load(Counters& c, const T* g, size_t ld, int rows_valid, int cols_valid,
                                         bool vector)
    {
#pragma unroll
        for (int p = 0; p < PER_THREAD; ++p) {
            const int q = static_cast<int>(threadIdx.x) + p * THREADS;
            v[p] = make_uint4(0, 0, 0, 0);
            const int r = row_of(q);
            const int col = unit_of(q) * VEC;
            if (!exists(q) || r >= rows_valid || col >= cols_valid) continue;
            const T* src = g + r * ld + col;
            if (vector) {
                v[p] = iok_ld<TI>(c, reinterpret_cast<const uint4*>(src));
            } else {
                T t[VEC];
#pragma unroll
                for (int e = 0; e < VEC; ++e) t[e] = col + e < cols_valid ? iok_ld<TI>(c, src + e) : T(0.0f);
                memcpy(&v[p], t, 16);
            }
        }
    }

#ifdef DROPOUT
    // Z ∘ the slice: element (row0 + r, col0 + c) of the stored matrix (P: rows are queries, columns keys of
    // batch·head bh) times its dropout multiplier (0 or the keep scale). A chunk starts at a multiple of VEC
    // columns, inside one aligned group of 16 keys, so one Philox call (iok_keep16) gives its keep bits.
    // Elements out of range are 0 and stay 0.
    __device__ __forceinline__ void apply_dropout(int row0, int col0, unsigned bh, unsigned threshold,
                                                  float keep_scale, unsigned long long seed, unsigned offset)
    {
        static_assert(16 % VEC == 0, "a 16-byte chunk within one Philox call's 16 keys");
#pragma unroll
        for (int p = 0; p < PER_THREAD; ++p) {
            const int q = static_cast<int>(threadIdx.x) + p * THREADS;
            if (!exists(q)) continue;
            const unsigned i = static_cast<unsigned>(row0 + row_of(q));
            const unsigned j0 = static_cast<unsigned>(col0 + unit_of(q) * VEC);
            T t[VEC];
            memcpy(t, &v[p], 16);
            const unsigned keep = iok_keep16(threshold, seed, offset, bh, i, j0) >> (j0 & 15u);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                t[e] = (keep >> e) & 1u ? T(gemm_to_float(t[e]) * keep_scale) : T(0.0f);
            }
            memcpy(&v[p], t, 16);
        }
    }
#endif

    // Into a swizzled ROWS x COLS shared tile (tensor-core path).
    __device__ __forceinline__ void store_swizzled(T* s) const
    {
#pragma unroll
        for (int p = 0; p < PER_THREAD; ++p) {
            const int q = static_cast<int>(threadIdx.x) + p * THREADS;
            if (exists(q)) *reinterpret_cast<uint4*>(s + gemm_swizzle<T, COLS>(row_of(q), unit_of(q))) = v[p];
        }
    }

    // Into a k-major shared tile: rows are k (stored as is) or, with TRANSPOSE, columns are k.
    template <bool TRANSPOSE>
    __device__ __forceinline__ void store_k_major(T* s) const
    {
#pragma unroll
        for (int p = 0; p < PER_THREAD; ++p) {
            const int q = static_cast<int>(threadIdx.x) + p * THREADS;
            if (!exists(q)) continue;
            const int r = row_of(q);
            const int col = unit_of(q) * VEC;
            if constexpr (TRANSPOSE) {
                T t[VEC];
                memcpy(t, &v[p], 16);
#pragma unroll
                for (int e = 0; e < VEC; ++e) s[(col + e) * ROWS + r] = t[e];
            } else {
                *reinterpret_cast<uint4*>(s + r * COLS + col) = v[p];
            }
        }
    }
};

// Four 8x8 b16 matrices from shared memory; TRANS transposes each.
template <bool TRANS>
__device__ __forceinline__ void gemm_ldmatrix_x4(unsigned (&r)[4], const void* p)
{
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    if constexpr (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    }
}

template <bool TRANS>
__device__ __forceinline__ void gemm_ldmatrix_x2(unsigned (&r)[2], const void* p)
{
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    if constexpr (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    }
}

// d += a b for one 16x8x16 tile (a row-major, b column-major), float accumulators.
template <typename T>
__device__ __forceinline__ void gemm_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);

template <>
__device__ __forceinline__ void gemm_mma<__half>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void gemm_mma<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                                        unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T> struct GemmPair;
template <> struct GemmPair<__half> {
    using type = __half2;
    static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct GemmPair<__nv_bfloat16> {
    using type = __nv_bfloat162;
    static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// Tensor-core tiling: 2 x 4 warps, each MI x NI m16n8 tiles.
constexpr int GEMM_WARPS_M = 2;
constexpr int GEMM_WARPS_N = 4;
constexpr int GEMM_WM = BM / GEMM_WARPS_M;
constexpr int GEMM_WN = BN / GEMM_WARPS_N;
constexpr int GEMM_MI = GEMM_WM >= 16 ? GEMM_WM / 16 : 1;  // (1 for the SIMT tiles, unused there)
constexpr int GEMM_NI = GEMM_WN >= 8 ? GEMM_WN / 8 : 1;

// acc += the warp's part of As Bs for one shared k-slice.
//   As: TRANS_A ? BK x BM : BM x BK;  Bs: TRANS_B ? BN x BK : BK x BN  (global layouts, swizzled)
template <typename T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void gemm_mma_slice(float (&acc)[GEMM_MI][GEMM_NI][4], const T* As, const T* Bs,
                                               int wm0, int wn0, int lane)
{
    constexpr int VEC = 8;
    const int j = lane >> 3;  // which 8x8 matrix of an x4 load this lane addresses
    const int i8 = lane & 7;  // which of its rows
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        unsigned a[GEMM_MI][4];
#pragma unroll
        for (int mi = 0; mi < GEMM_MI; ++mi) {
            // matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3
            const int m = wm0 + mi * 16 + ((j & 1) << 3);
            const int k = kk + ((j >> 1) << 3);
            if constexpr (TRANS_A) {
                gemm_ldmatrix_x4<true>(a[mi], As + gemm_swizzle<T, BM>(k + i8, m / VEC));
            } else {
                gemm_ldmatrix_x4<false>(a[mi], As + gemm_swizzle<T, BK>(m + i8, k / VEC));
            }
        }
        unsigned b[GEMM_NI][2];
#pragma unroll
        for (int ni = 0; ni < GEMM_NI; ni += 2) {
            // matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b[ni], b[ni+1]
            const int jj = ni + 1 < GEMM_NI ? j : (j & 1);  // an x2 load for a last, odd n8 tile
            const int n = wn0 + ni * 8 + ((jj >> 1) << 3);
            const int k = kk + ((jj & 1) << 3);
            const T* p = Bs + (TRANS_B ? gemm_swizzle<T, BK>(n + i8, k / VEC) : gemm_swizzle<T, BN>(k + i8, n / VEC));
            if (ni + 1 < GEMM_NI) {
                unsigned r[4];
                gemm_ldmatrix_x4<!TRANS_B>(r, p);
                b[ni][0] = r[0];
                b[ni][1] = r[1];
                b[ni + 1][0] = r[2];
                b[ni + 1][1] = r[3];
            } else {
                unsigned r[2];
                gemm_ldmatrix_x2<!TRANS_B>(r, p);
                b[ni][0] = r[0];
                b[ni][1] = r[1];
            }
        }
#pragma unroll
        for (int mi = 0; mi < GEMM_MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < GEMM_NI; ++ni) gemm_mma<T>(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
    }
}

// SIMT micro-tile: TM x TN per thread in two halves of H rows (columns) each.
constexpr int GEMM_TM = BM / 16;
constexpr int GEMM_TN = BN / 16;
constexpr int GEMM_HM = GEMM_TM > 1 ? GEMM_TM / 2 : 1;
constexpr int GEMM_HN = GEMM_TN > 1 ? GEMM_TN / 2 : 1;

// Row (column) of a thread's i-th micro-tile element within the block tile.
template <int B, int H>
__device__ __forceinline__ int gemm_simt_index(int t, int i)
{
    return (i / H) * (B / 2) + t * H + i % H;
}

// Reads H consecutive elements of a k-major shared row as floats (one 16-byte read for 4 floats).
template <typename T, int H>
__device__ __forceinline__ void gemm_read_half(float* out, const T* s)
{
    if constexpr (sizeof(T) == 4 && H % 4 == 0) {
#pragma unroll
        for (int i = 0; i < H; i += 4) {
            const float4 x = *reinterpret_cast<const float4*>(s + i);
            out[i] = x.x;
            out[i + 1] = x.y;
            out[i + 2] = x.z;
            out[i + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < H; ++i) out[i] = gemm_to_float(s[i]);
    }
}

// acc += As Bs for one k-major shared k-slice (As: BK x BM, Bs: BK x BN), the first JN columns of the
// micro-tile only: when a tile's columns past BN/2 are out of range, nobody computes them.
template <typename T, int JN>
__device__ __forceinline__ void gemm_simt_slice(float (&acc)[GEMM_TM][GEMM_TN], const T* As, const T* Bs, int ty,
                                                int tx)
{
#pragma unroll
    for (int k = 0; k < BK; ++k) {
        float a[GEMM_TM], b[GEMM_TN];
#pragma unroll
        for (int h = 0; h < GEMM_TM / GEMM_HM; ++h) {
            gemm_read_half<T, GEMM_HM>(a + h * GEMM_HM, As + k * BM + h * (BM / 2) + ty * GEMM_HM);
        }
#pragma unroll
        for (int h = 0; h < JN / GEMM_HN; ++h) {
            gemm_read_half<T, GEMM_HN>(b + h * GEMM_HN, Bs + k * BN + h * (BN / 2) + tx * GEMM_HN);
        }
#pragma unroll
        for (int i = 0; i < GEMM_TM; ++i) {
#pragma unroll
            for (int jn = 0; jn < JN; ++jn) acc[i][jn] = fmaf(a[i], b[jn], acc[i][jn]);
        }
    }
}

template <typename T, int TRANS_A, int TRANS_B, int TA, int TB, int TC>
__global__ void __launch_bounds__(THREADS, 1) gemm(const T* __restrict__ A, const T* __restrict__ B,
                                                T* __restrict__ C, int M, int N, int K, float alpha,
                                                IOK_MASK_PARAM IOK_DROPOUT_PARAM
                                                unsigned long long* __restrict__ iok_counters)
{
#ifdef MASK
    static_assert(TC == IOK_T_S, "the explicit mask is applied to S = τQKᵀ (the qk stage)");
#endif
#ifdef DROPOUT
    static_assert(TA == IOK_T_P, "dropout multiplies P, the A operand of pv and dv");
#endif
    static_assert(SMEM_A + 2 * BM * BK * sizeof(T) <= SMEM_B || SMEM_B + 2 * BK * BN * sizeof(T) <= SMEM_A,
                  "A and B buffers overlap");
    static_assert(SMEM_A + 2 * BM * BK * sizeof(T) <= SMEM_BYTES && SMEM_B + 2 * BK * BN * sizeof(T) <= SMEM_BYTES,
                  "the A and B buffers end within SMEM_BYTES");
    constexpr bool USE_MMA = sizeof(T) == 2 && BM >= 32 && BK >= 16;
    // Slices as stored in global memory; the SIMT path transposes those whose rows are m (n).
    using SliceA = GemmSlice<T, TRANS_A ? BK : BM, TRANS_A ? BM : BK, !USE_MMA && !TRANS_A>;
    using SliceB = GemmSlice<T, TRANS_B ? BN : BK, TRANS_B ? BK : BN, !USE_MMA && TRANS_B>;
    // Register sets of slices in flight while one multiplies: as many as 48 registers hold (SIMT: 2, so
    // that a slice has two slices' arithmetic to arrive even when half the micro-tile is skipped).
    constexpr int STAGE_REGS = 4 * (SliceA::PER_THREAD + SliceB::PER_THREAD);
    constexpr int D = USE_MMA ? (STAGE_REGS * 3 <= 48 ? 3 : STAGE_REGS * 2 <= 48 ? 2 : 1) : (STAGE_REGS <= 32 ? 2 : 1);

    extern __shared__ __align__(16) unsigned char smem[];
    T* const As = reinterpret_cast<T*>(smem + SMEM_A);  // two k-slices of BM x BK
    T* const Bs = reinterpret_cast<T*>(smem + SMEM_B);  // two k-slices of BK x BN
    IokCounters<TA, TB, TC IOK_MASK_T> c;

    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    const size_t bh = blockIdx.z;
    A += bh * M * K;
    B += bh * K * N;
    C += bh * M * N;
    const int m_valid = min(BM, M - m0);
    const int n_valid = min(BN, N - n0);
    const size_t lda = TRANS_A ? M : K;
    const size_t ldb = TRANS_B ? K : N;
    const bool a_vector = gemm_vector_ok(A, lda);
    const bool b_vector = gemm_vector_ok(B, ldb);
    const int nk = (K + BK - 1) / BK;

    auto load = [&](SliceA& a, SliceB& b, int kt) {
        const int k0 = kt * BK;
        const int k_valid = min(BK, K - k0);
        if (TRANS_A) {
            a.template load<TA>(c, A + static_cast<size_t>(k0) * lda + m0, lda, k_valid, m_valid, a_vector);
        } else {
            a.template load<TA>(c, A + static_cast<size_t>(m0) * lda + k0, lda, m_valid, k_valid, a_vector);
        }
        if (TRANS_B) {
            b.template load<TB>(c, B + static_cast<size_t>(n0) * ldb + k0, ldb, n_valid, k_valid, b_vector);
        } else {
            b.template load<TB>(c, B + static_cast<size_t>(k0) * ldb + n0, ldb, k_valid, n_valid, b_vector);
        }
    };
    // k-slice kt of A and B into shared buffer buf (DROPOUT: A times Z first; its loads have landed by now)
    auto store = [&](SliceA& a, const SliceB& b, int buf, int kt) {
#ifdef DROPOUT
        if (TRANS_A) {
            a.apply_dropout(kt * BK, m0, static_cast<unsigned>(bh), dropout_threshold, dropout_scale, dropout_seed,
                            dropout_offset);
        } else {
            a.apply_dropout(m0, kt * BK, static_cast<unsigned>(bh), dropout_threshold, dropout_scale, dropout_seed,
                            dropout_offset);
        }
#else
        (void)kt;
#endif
        T* as = As + buf * (BM * BK);
        T* bs = Bs + buf * (BK * BN);
        if constexpr (USE_MMA) {
            a.store_swizzled(as);
            b.store_swizzled(bs);
        } else {
            a.template store_k_major<!TRANS_A>(as);
            b.template store_k_major<TRANS_B != 0>(bs);
        }
    };

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm0 = (warp / GEMM_WARPS_N) * GEMM_WM;
    const int wn0 = (warp % GEMM_WARPS_N) * GEMM_WN;
    // a warp (SIMT: the block) whose columns are all out of range skips the arithmetic
    const bool warp_active = wm0 < m_valid && wn0 < n_valid;
    const bool n_high = n_valid > BN / 2;
    const int ty = tid / 16;
    const int tx = tid % 16;

    float acc_mma[USE_MMA ? GEMM_MI : 1][USE_MMA ? GEMM_NI : 1][4];
    float acc_simt[USE_MMA ? 1 : GEMM_TM][USE_MMA ? 1 : GEMM_TN];
    if constexpr (USE_MMA) {
#pragma unroll
        for (int mi = 0; mi < GEMM_MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < GEMM_NI; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_mma[mi][ni][e] = 0.0f;
    } else {
#pragma unroll
        for (int i = 0; i < GEMM_TM; ++i)
#pragma unroll
            for (int jn = 0; jn < GEMM_TN; ++jn) acc_simt[i][jn] = 0.0f;
    }

    // Slice s waits in register set s % D until shared buffer s % 2 is free.
    SliceA ra[D];
    SliceB rb[D];
#pragma unroll
    for (int s = 0; s < D; ++s) {
        if (s < nk) load(ra[s], rb[s], s);
    }
    store(ra[0], rb[0], 0, 0);
    __syncthreads();  // slice 0 in shared memory
    if (D < nk) load(ra[0], rb[0], D);

    for (int kt0 = 0; kt0 < nk; kt0 += D) {
#pragma unroll
        for (int u = 0; u < D; ++u) {
            const int kt = kt0 + u;
            if (kt >= nk) break;
            const T* as = As + (kt & 1) * (BM * BK);
            const T* bs = Bs + (kt & 1) * (BK * BN);
            if constexpr (USE_MMA) {
                if (warp_active) gemm_mma_slice<T, TRANS_A, TRANS_B>(acc_mma, as, bs, wm0, wn0, lane);
            } else if constexpr (GEMM_TN > 1) {
                if (n_high) {
                    gemm_simt_slice<T, GEMM_TN>(acc_simt, as, bs, ty, tx);
                } else {
                    gemm_simt_slice<T, GEMM_TN / 2>(acc_simt, as, bs, ty, tx);
                }
            } else {
                gemm_simt_slice<T, GEMM_TN>(acc_simt, as, bs, ty, tx);
            }
            if (kt + 1 < nk) {
                const int next = (u + 1) % D;
                // buffer (kt+1)&1 was last read in iteration kt-1, before the barrier that ended it
                store(ra[next], rb[next], (kt + 1) & 1, kt + 1);
                if (kt + 1 + D < nk) load(ra[next], rb[next], kt + 1 + D);
            }
            __syncthreads();  // slice kt+1 visible, and everyone is done reading slice kt
        }
    }

    // C tile, once, in range only; out(): the element as stored (causal, then the explicit mask, read here)
#ifdef CAUSAL
    const int causal_off = iok_causal_offset(M, N);
    const float masked = __int_as_float(static_cast<int>(0xff800000u));  // -inf
#endif
#ifdef MASK
    const iok_mask_t* const mask_bh = iok_mask_rows(mask, bh, M, N);
#endif
    auto out = [&](int row, int col, float x) -> float {
#ifdef CAUSAL
        if (col > row + causal_off) x = masked;
#endif
#ifdef MASK
        x = iok_apply_mask(c, mask_bh + static_cast<size_t>(row) * N + col, x);
#endif
        return x;
    };
    if constexpr (USE_MMA) {
        using Pair = GemmPair<T>;
        const bool pairs = N % 2 == 0 && reinterpret_cast<size_t>(C) % 4 == 0;
#pragma unroll
        for (int mi = 0; mi < GEMM_MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < GEMM_NI; ++ni) {
                const int col = n0 + wn0 + ni * 8 + (lane & 3) * 2;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = m0 + wm0 + mi * 16 + (lane >> 2) + h * 8;
                    if (row >= M || col >= N) continue;
                    T* dst = C + static_cast<size_t>(row) * N + col;
                    const float x = out(row, col, alpha * acc_mma[mi][ni][2 * h]);
                    const float y = col + 1 < N ? out(row, col + 1, alpha * acc_mma[mi][ni][2 * h + 1]) : 0.0f;
                    if (pairs) {
                        iok_st<TC>(c, reinterpret_cast<typename Pair::type*>(dst), Pair::make(x, y));
                    } else {
                        iok_st<TC>(c, dst, T(x));
                        if (col + 1 < N) iok_st<TC>(c, dst + 1, T(y));
                    }
                }
            }
        }
    } else {
        const bool quads = sizeof(T) == 4 && GEMM_HN % 4 == 0 && gemm_vector_ok(C, N);
#pragma unroll
        for (int i = 0; i < GEMM_TM; ++i) {
            const int row = m0 + gemm_simt_index<BM, GEMM_HM>(ty, i);
            if (row >= M) continue;
            T* dst = C + static_cast<size_t>(row) * N;
#pragma unroll
            for (int jn = 0; jn < GEMM_TN; ++jn) {
                const int col = n0 + gemm_simt_index<BN, GEMM_HN>(tx, jn);
                if constexpr (sizeof(T) == 4 && GEMM_HN % 4 == 0) {
                    if (quads) {
                        if (jn % 4 == 0 && col < N) {
                            const float4 v = make_float4(out(row, col, alpha * acc_simt[i][jn]),
                                                         out(row, col + 1, alpha * acc_simt[i][jn + 1]),
                                                         out(row, col + 2, alpha * acc_simt[i][jn + 2]),
                                                         out(row, col + 3, alpha * acc_simt[i][jn + 3]));
                            iok_st<TC>(c, reinterpret_cast<float4*>(dst + col), v);
                        }
                        continue;
                    }
                }
                if (col < N) iok_st<TC>(c, dst + col, T(out(row, col, alpha * acc_simt[i][jn])));
            }
        }
    }

    iok_flush(c, iok_counters);
}
