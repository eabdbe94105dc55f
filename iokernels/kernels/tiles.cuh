// Tile helpers shared by the research attention kernels (flash_fwd.cu, two_pass.cu): conversions,
// 16-byte row moves through the counted loads and stores, and the products S = τ Q Kᵀ and O += P V
// over the plan's shared-memory tiles (register micro-tiles on CUDA cores; mma.sync tensor cores
// for float16 / bfloat16). build_source inlines it where a
// kernel includes it; it expects common.cuh and the plan's defines (THREADS, HEAD_D, BR, BC).
#pragma once


static_assert(THREADS % 32 == 0, "whole warps");
static_assert(HEAD_D % 8 == 0, "rows of T move as 16-byte vectors");
enum : int { NWARPS = THREADS / 32 };  // not a variable: no unused warning in the stages that need none
__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> __device__ __forceinline__ T from_bits(unsigned short b);
template <> __device__ __forceinline__ __half from_bits<__half>(unsigned short b) { return __ushort_as_half(b); }
template <> __device__ __forceinline__ __nv_bfloat16 from_bits<__nv_bfloat16>(unsigned short b)
{
    return __ushort_as_bfloat16(b);
}
__device__ __forceinline__ unsigned to_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned to_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

// mma.sync m16n8k16, float32 accumulators (sm_80 and newer): D += A B for 16 x 16 A (four registers of two
// T, row-major fragment) and 16 x 8 B (two registers, column-major fragment).
template <typename T>
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);

template <>
__device__ __forceinline__ void tc_mma<__half>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void tc_mma<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                                      unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two T (low half = first).
template <typename T>
__device__ __forceinline__ unsigned tc_pack(float lo, float hi)
{
    return to_bits(from_f<T>(lo)) | (to_bits(from_f<T>(hi)) << 16);
}

// Rows move as 16-byte vectors: HEAD_D % 8 == 0 keeps every row of Q, K, V, O 16-byte aligned.
template <typename T> constexpr int VEC = 16 / sizeof(T);

__device__ __forceinline__ unsigned word(const uint4& v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <typename T>
__device__ __forceinline__ T vec_get(const uint4& v, int e)
{
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(word(v, e));
    } else {
        return from_bits<T>(static_cast<unsigned short>(word(v, e / 2) >> (16 * (e % 2))));
    }
}

template <typename T>
__device__ __forceinline__ uint4 vec_pack(const float (&x)[VEC<T>])
{
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (sizeof(T) == 4) {
            w[i] = __float_as_uint(x[i]);
        } else {
            w[i] = to_bits(from_f<T>(x[2 * i])) | to_bits(from_f<T>(x[2 * i + 1])) << 16;
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// Each buffer 16-byte aligned, inside SMEM_BYTES, disjoint from the others.
struct Buffer {
    size_t offset, bytes;
};
template <int N>
__host__ __device__ constexpr bool layout_ok(const Buffer (&b)[N])
{
    for (int i = 0; i < N; ++i) {
        if (b[i].offset % 16 != 0 || b[i].offset + b[i].bytes > SMEM_BYTES) return false;
        for (int j = 0; j < i; ++j) {
            if (b[i].offset < b[j].offset + b[j].bytes && b[j].offset < b[i].offset + b[i].bytes) return false;
        }
    }
    return true;
}

// Thread layout of a rows x cols product tile: NX threads along the columns, THREADS / NX along the
// rows, each thread a TM x TN register micro-tile strided by (THREADS / NX, NX) so that a warp reads
// consecutive shared addresses. Tiles are arbitrary, so pick the layout that minimises a thread's
// inner-loop cost over all the passes it needs: TM*TN FMAs + (TM + TN) shared loads at ~3 FMAs each.
// TM*TN <= 32 keeps the accumulators in registers.
struct MicroTile {
    int nx, tm, tn;
};
__host__ __device__ constexpr MicroTile micro_tile(int rows, int cols)
{
    MicroTile best{1, 1, 1};
    long best_cost = -1;
    for (int nx = THREADS; nx >= 1; --nx) {
        if (THREADS % nx != 0) continue;
        const int ny = THREADS / nx;
        for (int tm = 1; tm <= 8; ++tm) {
            for (int tn = 1; tn <= 8 && tm * tn <= 32; ++tn) {
                const long row_passes = (rows + ny * tm - 1) / (ny * tm);
                const long passes = row_passes * ((cols + nx * tn - 1) / (nx * tn));
                const long cost = passes * (tm * tn + 3 * (tm + tn));
                if (best_cost < 0 || cost < best_cost) {
                    best = MicroTile{nx, tm, tn};
                    best_cost = cost;
                }
            }
        }
    }
    return best;
}

// S[r][c] = epi(r, c, Σ_k Qt[k][r] Kt[k][c]) for r < rows, c < cols (S row stride BC), on CUDA cores.
template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile_fma(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
{
    constexpr MicroTile mt = micro_tile(BR, BC);
    constexpr int NX = mt.nx, NY = THREADS / NX, TM = mt.tm, TN = mt.tn;
    const int tx = threadIdx.x % NX, ty = threadIdx.x / NX;
    for (int r0 = ty; r0 < rows; r0 += NY * TM) {
        for (int c0 = tx; c0 < cols; c0 += NX * TN) {
            // ragged edges reread a real row / column (never an unloaded one); their results are dropped
            const T* q[TM];
            const T* k[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a) q[a] = Qt + min(r0 + a * NY, rows - 1);
#pragma unroll
            for (int b = 0; b < TN; ++b) k[b] = Kt + min(c0 + b * NX, cols - 1);
            float acc[TM][TN] = {};
#pragma unroll 8
            for (int kk = 0; kk < HEAD_D; ++kk) {
                float qa[TM], kb[TN];
#pragma unroll
                for (int a = 0; a < TM; ++a) qa[a] = to_f(q[a][kk * BR]);
#pragma unroll
                for (int b = 0; b < TN; ++b) kb[b] = to_f(k[b][kk * BC]);
#pragma unroll
                for (int a = 0; a < TM; ++a) {
#pragma unroll
                    for (int b = 0; b < TN; ++b) acc[a][b] = fmaf(qa[a], kb[b], acc[a][b]);
                }
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int r = r0 + a * NY;
#pragma unroll
                for (int b = 0; b < TN; ++b) {
                    const int c = c0 + b * NX;
                    if (r < rows && c < cols) S[r * BC + c] = epi(r, c, acc[a][b]);
                }
            }
        }
    }
}

// epi(r, n, Σ_c P[r][c] V[c][n]) for r < rows, n < HEAD_D, c < cols (P row stride BC), on CUDA cores.
template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile_fma(const float* P, const T* V, int rows, int cols, Epi epi)
{
    constexpr MicroTile mt = micro_tile(BR, HEAD_D);
    constexpr int NX = mt.nx, NY = THREADS / NX, TM = mt.tm, TN = mt.tn;
    const int tx = threadIdx.x % NX, ty = threadIdx.x / NX;
    for (int r0 = ty; r0 < rows; r0 += NY * TM) {
        for (int n0 = tx; n0 < HEAD_D; n0 += NX * TN) {
            const float* p[TM];
            const T* v[TN];
#pragma unroll
            for (int a = 0; a < TM; ++a) p[a] = P + min(r0 + a * NY, rows - 1) * BC;
#pragma unroll
            for (int b = 0; b < TN; ++b) v[b] = V + min(n0 + b * NX, HEAD_D - 1);
            float acc[TM][TN] = {};
#pragma unroll 4
            for (int c = 0; c < cols; ++c) {
                float pa[TM], vb[TN];
#pragma unroll
                for (int a = 0; a < TM; ++a) pa[a] = p[a][c];
#pragma unroll
                for (int b = 0; b < TN; ++b) vb[b] = to_f(v[b][c * HEAD_D]);
#pragma unroll
                for (int a = 0; a < TM; ++a) {
#pragma unroll
                    for (int b = 0; b < TN; ++b) acc[a][b] = fmaf(pa[a], vb[b], acc[a][b]);
                }
            }
#pragma unroll
            for (int a = 0; a < TM; ++a) {
                const int r = r0 + a * NY;
#pragma unroll
                for (int b = 0; b < TN; ++b) {
                    const int n = n0 + b * NX;
                    if (r < rows && n < HEAD_D) epi(r, n, acc[a][b]);
                }
            }
        }
    }
}

// ---- the same two products on tensor cores -------------------------------------------------------
// For 16-bit T, HEAD_D % 16 == 0 and sm_80 or newer, S = τ Q Kᵀ and P V run as mma.sync m16n8k16 over
// the same shared-memory tiles (any B_r, B_c): each warp takes 16-row strips of up to MMA_NT 8-column
// tiles, building its fragments from shared memory with 16-bit loads (the tiles are transposed or
// unaligned for ldmatrix at arbitrary B_r, B_c); rows past the last whole 16 and columns past the last
// whole 8 (qk) or keys past the last whole 16 (pv) are summed on CUDA cores. P is rounded to T for the
// product, as in every FlashAttention kernel. Loads and stores, and so the counted bytes, are unchanged.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define IOK_MMA_ARCH 1
#else
#define IOK_MMA_ARCH 0
#endif
template <typename T> constexpr bool MMA_TILES = IOK_MMA_ARCH && sizeof(T) == 2 && HEAD_D % 16 == 0;

// 8-column tiles per warp strip: the most (of 4, 2, 1) that still gives every warp a strip.
__host__ __device__ constexpr int mma_nt(int row_strips, int col_tiles)
{
    return row_strips * ((col_tiles + 3) / 4) >= NWARPS ? 4 : row_strips * ((col_tiles + 1) / 2) >= NWARPS ? 2 : 1;
}

// p[0] and p[stride] as one register of two T (low half = p[0]).
template <typename T>
__device__ __forceinline__ unsigned mma_pair(const T* p, int stride)
{
    return to_bits(p[0]) | (to_bits(p[stride]) << 16);
}

template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile_mma(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
{
    constexpr int NT = mma_nt(BR / 16, BC / 8);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows16 = rows / 16 * 16, cols8 = cols / 8 * 8;
    const int groups = (cols8 / 8 + NT - 1) / NT, strips = rows16 / 16 * groups;
    for (int strip = warp; strip < strips; strip += NWARPS) {
        const int r0 = strip / groups * 16, c0 = strip % groups * 8 * NT;
        float acc[NT][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < HEAD_D; k0 += 16) {
            const T* q = Qt + (k0 + 2 * t) * BR + r0 + g;  // Q[r0 + g][k0 + 2t], Qt[k][r]
            const unsigned a[4] = {mma_pair(q, BR), mma_pair(q + 8, BR), mma_pair(q + 8 * BR, BR),
                                   mma_pair(q + 8 * BR + 8, BR)};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (c0 + 8 * j < cols8) {
                    const T* k = Kt + (k0 + 2 * t) * BC + c0 + 8 * j + g;  // Kᵀ[k0 + 2t][c], Kt[k][c]
                    tc_mma<T>(acc[j], a, mma_pair(k, BC), mma_pair(k + 8 * BC, BC));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (c0 + 8 * j < cols8) {
#pragma unroll
                for (int h = 0; h < 4; ++h) S[(r0 + g + 8 * (h / 2)) * BC + c0 + 8 * j + 2 * t + h % 2] = acc[j][h];
            }
        }
        // the epilogue row by row with lanes along the columns, so that what it reads or writes in HBM
        // (STORE_S, MASK) is coalesced as on CUDA cores
        __syncwarp();
        const int width = min(8 * NT, cols8 - c0);
        for (int i = lane; i < 16 * width; i += 32) {
            const int r = r0 + i / width, c = c0 + i % width;
            S[r * BC + c] = epi(r, c, S[r * BC + c]);
        }
    }
    // the ragged rest: rows [rows16, rows) x [0, cols), then rows [0, rows16) x [cols8, cols)
    const int tail_rows = (rows - rows16) * cols, tail_cols = cols - cols8;
    for (int i = threadIdx.x; i < tail_rows + rows16 * tail_cols; i += THREADS) {
        const int r = i < tail_rows ? rows16 + i / cols : (i - tail_rows) / tail_cols;
        const int c = i < tail_rows ? i % cols : cols8 + (i - tail_rows) % tail_cols;
        float acc = 0.0f;
        for (int kk = 0; kk < HEAD_D; ++kk) acc = fmaf(to_f(Qt[kk * BR + r]), to_f(Kt[kk * BC + c]), acc);
        S[r * BC + c] = epi(r, c, acc);
    }
}

template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile_mma(const float* P, const T* V, int rows, int cols, Epi epi)
{
    constexpr int NT = mma_nt(BR / 16, HEAD_D / 8);
    constexpr int GROUPS = (HEAD_D / 8 + NT - 1) / NT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int rows16 = rows / 16 * 16, cols16 = cols / 16 * 16;
    for (int strip = warp; strip < rows16 / 16 * GROUPS; strip += NWARPS) {
        const int r0 = strip / GROUPS * 16, n0 = strip % GROUPS * 8 * NT;
        float acc[NT][4] = {};
        const float* p0 = P + (r0 + g) * BC + 2 * t;  // P[r0 + g][2t]
        for (int c0 = 0; c0 < cols16; c0 += 16) {
            const float* p = p0 + c0;
            const unsigned a[4] = {tc_pack<T>(p[0], p[1]), tc_pack<T>(p[8 * BC], p[8 * BC + 1]),
                                   tc_pack<T>(p[8], p[9]), tc_pack<T>(p[8 * BC + 8], p[8 * BC + 9])};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (n0 + 8 * j < HEAD_D) {
                    const T* v = V + (c0 + 2 * t) * HEAD_D + n0 + 8 * j + g;  // V[c0 + 2t][n]
                    tc_mma<T>(acc[j], a, mma_pair(v, HEAD_D), mma_pair(v + 8 * HEAD_D, HEAD_D));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (n0 + 8 * j < HEAD_D) {
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const int r = r0 + g + 8 * (h / 2), n = n0 + 8 * j + 2 * t + h % 2;
                    float x = acc[j][h];
                    for (int c = cols16; c < cols; ++c) x = fmaf(P[r * BC + c], to_f(V[c * HEAD_D + n]), x);
                    epi(r, n, x);
                }
            }
        }
    }
    // rows [rows16, rows) on CUDA cores
    for (int i = threadIdx.x; i < (rows - rows16) * HEAD_D; i += THREADS) {
        const int r = rows16 + i / HEAD_D, n = i % HEAD_D;
        float x = 0.0f;
        for (int c = 0; c < cols; ++c) x = fmaf(P[r * BC + c], to_f(V[c * HEAD_D + n]), x);
        epi(r, n, x);
    }
}

// The products the research kernels call: tensor cores where MMA_TILES<T>, else CUDA cores.
template <typename T, typename Epi>
__device__ __forceinline__ void qk_tile(const T* Qt, const T* Kt, float* S, int rows, int cols, Epi epi)
{
    if constexpr (MMA_TILES<T>) {
        qk_tile_mma(Qt, Kt, S, rows, cols, epi);
    } else {
        qk_tile_fma(Qt, Kt, S, rows, cols, epi);
    }
}

template <typename T, typename Epi>
__device__ __forceinline__ void pv_tile(const float* P, const T* V, int rows, int cols, Epi epi)
{
    if constexpr (MMA_TILES<T>) {
        pv_tile_mma(P, V, rows, cols, epi);
    } else {
        pv_tile_fma(P, V, rows, cols, epi);
    }
}

// rows x HEAD_D of T, contiguous in HBM -> dst[k * LD + r], the transposed tile qk_tile reads.
// r runs fastest across threads, so the scattered shared stores fall in distinct banks.
template <int TENSOR, int LD, typename T, typename C>
__device__ __forceinline__ void load_transposed(C& io, T* dst, const T* src, int rows)
{
    constexpr int VPR = HEAD_D / VEC<T>;  // vectors per row
    for (int i = threadIdx.x; i < LD * VPR; i += THREADS) {
        const int r = i % LD, v = i / LD;
        if (r < rows) {
            const uint4* row = reinterpret_cast<const uint4*>(src + static_cast<size_t>(r) * HEAD_D);
            const uint4 x = iok_ld<TENSOR>(io, row + v);
#pragma unroll
            for (int e = 0; e < VEC<T>; ++e) dst[(v * VEC<T> + e) * LD + r] = vec_get<T>(x, e);
        }
    }
}

// rows x HEAD_D of T, contiguous in HBM -> dst, same layout.
template <int TENSOR, typename T, typename C>
__device__ __forceinline__ void load_rows(C& io, T* dst, const T* src, int rows)
{
    const int n = rows * (HEAD_D / VEC<T>);
    for (int i = threadIdx.x; i < n; i += THREADS) {
        reinterpret_cast<uint4*>(dst)[i] = iok_ld<TENSOR>(io, reinterpret_cast<const uint4*>(src) + i);
    }
}

// dst (rows x HEAD_D of T, contiguous in HBM) = src (rows x HEAD_D float32) / div[r], each element once
// (CAUSAL, BLOCK_SPARSE: 0 where div[r] = 0, a row that saw no key).
template <int TENSOR, typename T, typename C>
__device__ __forceinline__ void store_rows_divided(C& io, T* dst, const float* src, const float* div, int rows)
{
    constexpr int VPR = HEAD_D / VEC<T>;
    for (int i = threadIdx.x; i < rows * VPR; i += THREADS) {
#ifdef IOK_EMPTY_ROWS
        const float inv = div[i / VPR] == 0.0f ? 0.0f : 1.0f / div[i / VPR];  // a row with no visible key: 0
#else
        const float inv = 1.0f / div[i / VPR];
#endif
        float x[VEC<T>];
#pragma unroll
        for (int h = 0; h < VEC<T> / 4; ++h) {
            const float4 f = reinterpret_cast<const float4*>(src)[i * (VEC<T> / 4) + h];
            x[4 * h] = f.x * inv;
            x[4 * h + 1] = f.y * inv;
            x[4 * h + 2] = f.z * inv;
            x[4 * h + 3] = f.w * inv;
        }
        iok_st<TENSOR>(io, reinterpret_cast<uint4*>(dst) + i, vec_pack<T>(x));
    }
}
