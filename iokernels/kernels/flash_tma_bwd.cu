// Tensor-core FlashAttention backward for sm_90a with a producer warpgroup (issue #21; docs/KERNELS.md,
// "flash_tma_bwd.cu"; plan in iokernels/plan/fast_bwd.py, kernel "tma"). The math, the loop order, the tiles and
// the bytes are flash_wgmma_bwd.cu's (the FlashAttention-2 K/V-outer loop: its comment states the products, the
// causal and dropout rules; WINDOW, a sliding window, visits the query blocks of the key block's band only); how
// tiles move and how dQ is added differ:
//
// A block is BC / 64 consumer warpgroups (keys [64 w, 64 w + 64) each) and one producer warpgroup
// (THREADS = 2 BC + 128), which gives up registers (setmaxnreg, as flash_tma.cu). Its warp 0 loads: lane 0 issues
// the TMA copies (kernels/tma.cuh; maps per head, so rows past N are zero-filled, never read) of K_j and V_j once,
// then of Q_i and dO_i into a two-stage ring, while the 32 lanes copy lse_i and D_i into the same stage (rows past
// N_q: 0); stage s is "full" after the copies' bytes and 33 arrivals, and "empty" after one arrival per consumer
// warp once its products of the step have completed. Its warp 1 adds dQ: the consumers write τ dS K_j (float32,
// 128-byte swizzled boxes of 64 rows x 32 columns) into shared memory and signal it (named barrier DQ_FULL); lane
// 0 adds the boxes to dQacc with the bulk tensor reduction (cp.reduce.async.bulk.tensor ... add.f32: the copy
// engine reads and writes dQacc, no atomic instruction per element), waits until the engine has read the buffer
// and hands it back (DQ_EMPTY). The consumers exchange dSᵀ through a double buffer and one named barrier (DS) per
// step; no block-wide barrier runs between the roles (the counting build's iok_flush has none either).
//
// Wide tiles (TILE_D 192 or 256, kernel flash_tma_bwd_wide in the plan; BR = BC = 64): a warpgroup's dK and dV of
// 64 keys x TILE_D would not fit its registers, so both consumer warpgroups own the block's 64 keys and split the
// work: warpgroup w computes Sᵀ and dPᵀ for queries [32 w, 32 w + 32) of the step (m64n32), writes its columns of
// Pᵀ (with DROPOUT the dropped one) and dSᵀ into the step's buffers (two of each); after the DS barrier warpgroup 0
// adds dV += Pᵀ dO_i and warpgroup 1 dK += dSᵀ Q_i (m64nTILE_D, A from shared memory), and each adds its d slabs of
// τ dS K_j to dQacc with float32 reductions (red.global.add.v2.f32, flash_wgmma_bwd.cu's way: with the two-stage
// ring no shared memory is left for a dQ buffer). The producer's warp 1 has no work there.
//
// VARLEN (a variable-length batch, iokernels/plan/varlen.py; flash_tma.cu's): Q, dO, dQacc as (total_q, heads, d), K,
// V, dK, dV as (total_k, kv_heads, d), lse and D as (total_q, heads), packed (VARLEN_HEAD_MAJOR: a head's rows
// together, (heads, total, d), common.cuh iok_varlen_at); block (x, b, z) takes key block x of
// sequence b for K/V head z (its offsets read first): n_q and n_k become the sequence's lengths (CAUSAL per sequence),
// the copies' rows are offset by its first and bounded by the packed rows (n_q, n_k as passed; the offsets clamped to
// them, common.cuh); the loader zeroes the rows past the sequence's end (the next sequence's) once copied: of Q and dO
// in its last query block, so they add nothing, and of K and V in its last key block, so that a NaN or inf there
// reaches nothing (masked keys still enter dQ = dS K), as the rows the copy engine zero-fills past N do without it.
// A key block past the sequence's end does nothing; one whose sequence has no query writes dK = dV = 0.
//
// SOFTCAP (narrow tiles): Pᵀ from c tanh(τ Sᵀ / c) and dSᵀ times 1 − tanh² (wg_bwd.cuh wgb_probs_softcap; the band
// mask written as −inf before it).
//
// MASK_MOD, SCORE_MOD, SCORE_GRAD (narrow tiles; iokernels/plan/mods.py): Sᵀ through the user's expressions before
// Pᵀ, the hidden elements' Pᵀ set to 0 after it, dSᵀ times SCORE_GRAD (wg_bwd.cuh wgb_mods, wgb_hide); with BLOCK_SPARSE
// mask_mod only in the query blocks the block mask marks partial.
// ALIBI: the first kv_group threads read the slopes of the block's query heads before the roles part (ALIBI of them at
// most); Sᵀ gets −slope |key − query − (n_k − n_q)| before Pᵀ (wg_bwd.cuh wgb_alibi), a constant with no derivative.
//
// BLOCK_SPARSE (block-sparse plans, the paper's Algorithm 5; iokernels/plan/masks.py): once the roles' common values
// are known, warp 0 reads the key block's column of the grid (T_r x T_c bytes, the query blocks of its band;
// common.cuh iok_kept_blocks) into a list of the kept query blocks in shared memory (BLOCK_LIST entries at most), and
// the steps run over that list (step s: query head s / span, query block kept[s % span]), read once per K/V head.
//
// ITEM_LIST (the plain causal plans' and the sliding window's narrow tiles; iokernels/plan/fast.py item_list,
// plan/fast_bwd.py with_item_list): a persistent grid whose block b takes the items [work[b], work[b + 1]) of the
// host's list, each z_kv T_c + (key block). The loader, the dQ writer and each consumer warp walk them (common.cuh
// IokList); K and V land on bar_kv once per item with a step and are released on kv_empty, so the loader copies the
// next item's while the consumers write dK and dV; the ring's stages and phases and the dQ buffer count the block's
// earlier steps.
//
// Counting (DESIGN.md rules 2-4, 6): the loader counts the bytes each copy reads (rows inside the tensor, HEAD_D
// T each) and each lse / D float it loads; the dQ warp counts each element of a box inside (N_q, d) as 4 bytes
// read and 4 written of dQacc (the reduction's read-modify-write; with the wide tiles the consumers count their
// float32 reductions the same way, bwd.cuh); the consumers count dK and dV. The totals are flash_wgmma_bwd.cu's,
// so the model is the same.
#include "common.cuh"

#include "tiles.cuh"

#include "wgmma.cuh"

#include "wg.cuh"

#include "tma.cuh"

#include "bwd.cuh"

#include "wg_bwd.cuh"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS)
#error "flash_tma_bwd.cu needs BR, BC, HEAD_D and THREADS from the plan"
#endif
#if defined(VARLEN) && (defined(WINDOW) || defined(DROPOUT))
#error "VARLEN: causal or no mask, no dropout"
#endif
#if defined(BLOCK_SPARSE) && (defined(VARLEN) || defined(WINDOW) || !defined(BLOCK_LIST))
#error "BLOCK_SPARSE: causal or no mask, no VARLEN; BLOCK_LIST from the plan"
#endif
#if defined(HEAD_BAND) && (!defined(CAUSAL) || defined(VARLEN))
#error "HEAD_BAND: the causal grid (T_c, 1, BH / kv_group)"
#endif
#if defined(ALIBI) && (defined(VARLEN) || defined(SOFTCAP) || (defined(HEAD_D_TILE) ? HEAD_D_TILE : HEAD_D) > 128)
#error "ALIBI: the narrow tiles, no VARLEN, no softcap"
#endif
#if defined(IOK_MODS) && (defined(VARLEN) || defined(SOFTCAP) || defined(ALIBI) || defined(DROPOUT) \
    || (defined(HEAD_D_TILE) ? HEAD_D_TILE : HEAD_D) > 128)
#error "MASK_MOD, SCORE_MOD: the narrow tiles, no softcap, ALiBi or dropout"
#endif
#if defined(SOFTCAP) && (defined(VARLEN) || defined(DROPOUT))
#error "SOFTCAP: the dense backward, with causal or a window, no dropout"
#endif
#if defined(HEAD_D_TILE) ? HEAD_D_TILE > 128 : HEAD_D > 128  // wide tiles: two warpgroups share 64 keys
#define TB_WIDE 1
constexpr int CONSUMERS = 256;  // threads of the consumer warpgroups
static_assert(BR == 64 && BC == 64 && (TILE_D == 192 || TILE_D == 256), "wide tiles: 64 x 64");
#else
#define TB_WIDE 0
constexpr int CONSUMERS = 2 * BC;  // threads of the consumer warpgroups: one per 64 keys
static_assert(BC % 64 == 0 && (BR == 64 || BR == 128) && BR <= BC && (TILE_D == 64 || TILE_D == 128),
              "wgmma tile widths");
#endif
static_assert(THREADS == CONSUMERS + 128, "the consumer warpgroups and the producer's");
#if defined(ITEM_LIST) && (TB_WIDE || defined(VARLEN) || defined(BLOCK_SPARSE) || defined(HEAD_BAND) || defined(ALIBI) \
    || defined(IOK_MODS) || defined(DROPOUT) || defined(SOFTCAP))
#error "ITEM_LIST: the narrow tiles' persistent grid, causal or a sliding window, no other variant"
#endif
#if defined(VARLEN)
// (the loader's sequence state and its zeroing of the last query block: 24 or 40 registers spill. In the counting build
// at d 64 the consumers spill 8 bytes at 224: tests/kernels/test_compile.py SPILLS_ALLOWED)
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
#elif defined(IOK_COUNT) && (defined(BLOCK_SPARSE) || defined(ITEM_LIST))  // (the list's counters and walk: 40 spill)
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
#elif defined(IOK_COUNT)
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // the counting build's producer adds 64-bit counters
#else
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;
#endif
// setmaxnreg moves registers within the block's allocation at launch: an increase beyond it waits forever. ptxas
// launches with the largest setmaxnreg target, capped by __launch_bounds__ (65536 / THREADS rounded down to 8):
// 168 at 384 threads, the consumers' share at 256 (sm_90a, CUDA 13)
constexpr int CAP_REGS = (65536 / THREADS) / 8 * 8;
constexpr int LAUNCH_REGS = CAP_REGS < CONSUMER_REGS ? CAP_REGS : CONSUMER_REGS;
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * CONSUMERS <= LAUNCH_REGS * THREADS, "the block's registers");
#ifdef IOK_COUNT
// the counting build's iok_flush runs in every thread after the roles: each role moves to an even share first
// (the flush's sums need more than the producer's share). The producer takes its share back only once the consumers
// have given theirs up (named barrier BAR_REGS): a block with no step (a key block no query sees, past a sequence's end)
// would otherwise let the producer's increase take the registers the consumers' first increase waits for, a deadlock
// (seen under compute-sanitizer's synccheck, which slows the consumers' start)
constexpr int FLUSH_REGS = LAUNCH_REGS;
constexpr int BAR_REGS = 4;
#endif

constexpr int TB_DSLABS = TILE_D / 64;  // 64-column slabs of the tiles
// TB_LEAN: the plain builds of the plain, causal and window backwards (dense, on a list or not) take the warpgroup
// through wg_index (its operands' descriptors in uniform registers) and wgb_probs' split selects (with the other cuts,
// 925 -> 633 instructions in the d 128 step loop, both branches counted: SASS, 2026-11-28). With a per-element variant,
// VARLEN, a block mask or the counters, these two made ptxas spill (tests/kernels/test_compile.py), so those builds keep
// the per-thread warpgroup and one loop.
#if !defined(IOK_COUNT) && !defined(DROPOUT) && !defined(SOFTCAP) && !defined(IOK_MODS) && !defined(ALIBI) \
    && !defined(VARLEN) && !defined(BLOCK_SPARSE)
constexpr bool TB_LEAN = true;
#else
constexpr bool TB_LEAN = false;
#endif
constexpr int BAR_DS = 1;               // named barriers (0 is __syncthreads)
#if !TB_WIDE
constexpr int WGS = BC / 64;                            // consumer warpgroups
constexpr int TB_DQ_BLOCKS = (BR / 64) * TB_DSLABS;     // 64 x 64 blocks of dQ_i per query block
constexpr int TB_DQ_BOXES = (BR / 64) * (TILE_D / 32);  // dQ boxes (64 rows x 32 floats, 8 KB) per query block
constexpr int BAR_DQ_FULL = 2, BAR_DQ_EMPTY = 3;
#endif

__device__ constexpr bool tb_aligned()
{
    return SMEM_K % 1024 == 0 && SMEM_V % 1024 == 0 && SMEM_Q0 % 1024 == 0 && SMEM_Q1 % 1024 == 0
           && SMEM_DO0 % 1024 == 0 && SMEM_DO1 % 1024 == 0 && SMEM_DS0 % 1024 == 0 && SMEM_DS1 % 1024 == 0;
}
template <typename T>
__device__ constexpr bool tb_layout_ok()
{
    constexpr size_t q = BR * TILE_D * sizeof(T), kv = BC * TILE_D * sizeof(T), row = BR * sizeof(float);
    constexpr size_t ds = BC * BR * sizeof(T);
#if TB_WIDE  // two Pᵀ buffers
    return layout_ok<14>({{SMEM_K, kv}, {SMEM_V, kv}, {SMEM_Q0, q}, {SMEM_Q1, q}, {SMEM_DO0, q}, {SMEM_DO1, q},
                          {SMEM_DS0, ds}, {SMEM_DS1, ds}, {SMEM_P0, ds}, {SMEM_P1, ds}, {SMEM_LSE0, row},
                          {SMEM_LSE1, row}, {SMEM_D0, row}, {SMEM_D1, row}})
           && SMEM_P0 % 1024 == 0 && SMEM_P1 % 1024 == 0 && tb_aligned();
#else  // the dQ buffer
    return layout_ok<13>({{SMEM_K, kv}, {SMEM_V, kv}, {SMEM_Q0, q}, {SMEM_Q1, q}, {SMEM_DO0, q}, {SMEM_DO1, q},
                          {SMEM_DS0, ds}, {SMEM_DS1, ds}, {SMEM_DQ, TB_DQ_BOXES * 8192}, {SMEM_LSE0, row},
                          {SMEM_LSE1, row}, {SMEM_D0, row}, {SMEM_D1, row}})
           && SMEM_DQ % 1024 == 0 && tb_aligned();
#endif
}

// Row scalars (lse or D) r = lane, lane + 32, ... of a BR-row block by the 32 lanes of a warp, row r at g[r stride]:
// rows [0, rows_valid) read (4 bytes each, counted), the rest 0. LSE: a row that sees no key (lse −inf) is kept as
// +inf, so that its P = exp(τS − lse) is 0 whatever τS is (a score_mod may give −inf everywhere in it, and
// −inf − (−inf) is NaN), and stored times log2 e, the base-2 exponent wgb_probs<true> and wgb_probs_softcap take.
template <int TI, bool LSE, int... Ts>
__device__ __forceinline__ void tb_scalars(IokCounters<Ts...>& io, float* s, const float* g, int rows_valid, int lane,
                                           int stride)
{
#pragma unroll
    for (int r = lane; r < BR; r += 32) {
        const float x = r < rows_valid ? iok_ld<TI>(io, g + static_cast<size_t>(r) * stride) : 0.0f;
        s[r] = !LSE ? x
               : x == __int_as_float(static_cast<int>(0xff800000u)) ? __int_as_float(0x7f800000) : x * WG_LOG2E;
    }
}

// Adds box b of the dQ buffer (query slab b / (TILE_D / 32), columns 32 (b % (TILE_D / 32)) ...) to dQacc at query
// row row0 of head `head`; counted as 4 bytes read and 4 written per element inside (n_q, d) (rule 4).
template <int... Ts>
__device__ __forceinline__ void tb_dq_box(IokCounters<Ts...>& io, const unsigned char* box, const IokTensorMap* map,
                                          int b, int row0, int n_q, int head)
{
    const int r0 = row0 + 64 * (b / (TILE_D / 32)), c0 = 32 * (b % (TILE_D / 32));
    if (c0 >= HEAD_D) return;  // the tile's columns past d: nothing to add
    constexpr int slot = iok_slot<IOK_T_dQacc, Ts...>();
    static_assert(slot >= 0, "dQacc not named in this kernel's IokCounters<...>");
    if constexpr (IokCounters<Ts...>::counting) {
        const unsigned long long bytes = 4ull * max(0, min(64, n_q - r0)) * min(32, HEAD_D - c0);
        io.r[slot] += bytes;
        io.w[slot] += bytes;
    }
    iok_tma_reduce_add_3d(map, box, c0, r0, head);
}

constexpr int TB_Q = TB_WIDE ? 32 : BR;  // queries of a step's block per warpgroup in Sᵀ and dPᵀ

// Grid (ceil(n_k / BC), 1, BH / kv_group), block (x, 0, z) key block x of K/V head z (HEAD_BAND: the grid in bands
// of heads, common.cuh IOK_GRID_X; ITEM_LIST: (G, 1, 1), the items of the list). tmQ, tmdO: Q, dO (BH, n_q, HEAD_D)
// of T in boxes of BR rows; tmK, tmV: K, V (BH / kv_group, n_k, HEAD_D) in boxes of BC rows; tmdQ: dQacc (BH, n_q,
// HEAD_D) float32 in boxes of 64 rows x 32 (tensormap.py; wide tiles: dQacc itself); lse, D: (BH, n_q) float32; dK,
// dV: as K. Query head z reads K/V head z / kv_group.
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tma_bwd(const __grid_constant__ IokTensorMap tmQ, const __grid_constant__ IokTensorMap tmK,
              const __grid_constant__ IokTensorMap tmV, const __grid_constant__ IokTensorMap tmdO,
              const float* __restrict__ lse, const float* __restrict__ Dg,
#if TB_WIDE
              float* __restrict__ dQacc,
#else
              const __grid_constant__ IokTensorMap tmdQ,
#endif
              T* __restrict__ dK, T* __restrict__ dV, const int n_q_in, const int n_k_in, float scale, int kv_group,
              IOK_BLOCK_MASK_PARAM IOK_WINDOW_PARAM IOK_SOFTCAP_PARAM IOK_ALIBI_PARAM IOK_MOD_PARAM IOK_VARLEN_PARAM
              IOK_WORK_PARAM IOK_DROPOUT_PARAM unsigned long long* __restrict__ iok_counters)
{
    static_assert(tb_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES, tiles 1024-byte aligned");
    extern __shared__ __align__(1024) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, IOK_T_dO, IOK_T_lse, IOK_T_D, IOK_T_dQacc, IOK_T_dK, IOK_T_dV IOK_VARLEN_T
                IOK_BLOCK_MASK_T IOK_ALIBI_T IOK_MOD_T IOK_WORK_T> io;
    if (threadIdx.x == 0 && (static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 1023u) != 0) __trap();

    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    // the problem's query rows and keys (VARLEN: the block's sequence's, read below), where a copy's rows start and end
    // in the tensors (VARLEN: the sequence's first packed row; the packed rows), and the stride of a query row's scalars
    // (VARLEN: the heads of a packed row)
    int n_q = n_q_in, n_k = n_k_in, q_base = 0, k_base = 0;
    const int q_extent = n_q_in, k_extent = n_k_in;
#ifdef VARLEN
    const int row_stride = iok_varlen_step(gridDim.z * kv_group);
#else
    constexpr int row_stride = 1;
#endif

    // barriers: K and V; per stage of the Q / dO / lse / D ring, full (the loader's expect_tx arrival, the copies'
    // bytes and its 32 lanes' arrivals after their scalar stores) and empty (an arrival per consumer thread: with one
    // per warp after __syncwarp, compute-sanitizer's racecheck reported the loader's next lse / D stores into the
    // stage as hazards against the other lanes' reads, 8 per launch; with one per thread, none)
    __shared__ __align__(8) unsigned long long bar_kv, full[2], empty[2];
#ifdef ITEM_LIST
    // kv_empty: an arrival per consumer thread once an item's last product has read K and V (the loader then copies
    // the next item's); list_range: the block's entries of the list (read once, by one thread)
    __shared__ __align__(8) unsigned long long kv_empty;
    __shared__ int list_range[2];
#endif
#ifdef VARLEN
    // bar_tail: the copies of the sequence's last key block (first use) and of its last query block, which the loader
    // completes on bar_kv or on its stage's full barrier once it has zeroed the rows past the end; seq_rows: the
    // sequence's first query and key rows and one past their last (read once, by one thread)
    __shared__ __align__(8) unsigned long long bar_tail;
    __shared__ int seq_rows[4];
#endif
#ifdef ALIBI
    __shared__ float alibi_slope[ALIBI];  // the slopes of the block's query heads (read once, a thread each)
    if (threadIdx.x < kv_group) {
        alibi_slope[threadIdx.x] = iok_ld<IOK_T_alibi>(io, alibi + IOK_GRID_Z * kv_group + threadIdx.x);
    }
#endif
    if (threadIdx.x == 0) {
        iok_mbar_init(&bar_kv, 1);
#ifdef ITEM_LIST
        iok_mbar_init(&kv_empty, CONSUMERS);
        list_range[0] = iok_ld<IOK_T_work>(io, work + blockIdx.x);
        list_range[1] = iok_ld<IOK_T_work>(io, work + blockIdx.x + 1);
#endif
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            iok_mbar_init(&full[st], 33);
            iok_mbar_init(&empty[st], CONSUMERS);
        }
#ifdef VARLEN
        iok_mbar_init(&bar_tail, 1);
        iok_varlen_rows(io, cu_seqlens_q, cu_seqlens_k, blockIdx.y, n_q_in, n_k_in, seq_rows);
#endif
        iok_mbar_fence_init();
    }
    __syncthreads();  // the last block-wide barrier before the roles part
#ifdef VARLEN
    q_base = seq_rows[0];
    n_q = seq_rows[1] - q_base;
    k_base = seq_rows[2];
    n_k = seq_rows[3] - k_base;
#endif

    // the block's key block and K/V head; ITEM_LIST: each item's in turn (set_item), entry z_kv · T_c + (key block)
    int col0 = IOK_GRID_X * BC, kvz = IOK_GRID_Z;
    int cols = min(BC, n_k - col0);  // the last K/V block is ragged (VARLEN: <= 0 past the sequence's end)
#ifdef ITEM_LIST
    const int list_first = list_range[0], list_last = list_range[1];
    auto set_item = [&](int e) {
        const int t_c = (n_k + BC - 1) / BC;
        col0 = e % t_c * BC;
        kvz = e / t_c;
        cols = min(BC, n_k - col0);
    };
#endif
    // the query blocks [first, first + span) per query head: those with a row that sees a key of the block (rows
    // col0 - hi .. col0 + cols - 1 - lo of the band, common.cuh; all of them without a band); the steps, (query
    // head of the group, query block) pairs. A function that each role calls after its register reallocation
    // (kept live across it, a value spills)
    int first, span;
#ifdef BLOCK_SPARSE
    // the kept query blocks of the key block's column of the grid, within its band (first + kept[s])
    __shared__ unsigned short kept[BLOCK_LIST];
    __shared__ int kept_count;
#endif
    auto band = [&]() {
#ifdef IOK_BAND
        const int q_lo = max(0, col0 - IOK_BAND_HI);
#ifdef WINDOW
        const int q_end = min(n_q, col0 + cols - win_lo);  // one past the last
#else
        const int q_end = n_q;
#endif
        first = q_lo / BR;
        span = q_end > q_lo ? (q_end + BR - 1) / BR - first : 0;
#else
        first = 0;
        span = (n_q + BR - 1) / BR;
#endif
    };
    auto schedule = [&]() {
#ifdef VARLEN
        if (cols <= 0) {  // a key block past its sequence's end: no step, nothing written
            first = span = 0;
            return 0;
        }
#endif
        band();
#ifdef BLOCK_SPARSE
        span = kept_count;
#endif
        return span * kv_group;
    };
#ifdef BLOCK_SPARSE
    if (threadIdx.x < 32) {
        band();
        // (4 loads a round; 2 in the softcapped counting build, where 4 spill 16 bytes)
#if defined(IOK_COUNT) && defined(SOFTCAP)
        constexpr int round = 2;
#else
        constexpr int round = 4;
#endif
        const int n = iok_kept_blocks<round>(io, block_mask + IOK_GRID_X, first, span, (n_k + BC - 1) / BC, kept, lane);
        if (lane == 0) kept_count = n;
    }
    __syncthreads();  // the list, before the roles part
    // step s: query head kvz * kv_group + s / span, query block first + kept[s % span]
#ifdef MASK_MOD
    auto step_q0 = [&](int s) { return (first + static_cast<int>(kept[s % span] & (IOK_PARTIAL - 1))) * BR; };
    [[maybe_unused]] auto step_partial = [&](int s) { return (kept[s % span] & IOK_PARTIAL) != 0; };
#else
    auto step_q0 = [&](int s) { return (first + static_cast<int>(kept[s % span])) * BR; };
#endif
#else
    // step s: query head kvz * kv_group + s / span, query block first + s % span
    auto step_q0 = [&](int s) { return (first + s % span) * BR; };
#endif
#if !defined(BLOCK_SPARSE) || !defined(MASK_MOD)
    [[maybe_unused]] auto step_partial = [](int) { return true; };
#endif
    auto step_head = [&](int s) { return kvz * kv_group + s / span; };

    if (threadIdx.x >= CONSUMERS) {  // the producer warpgroup
        iok_regs_dec<PRODUCER_REGS>();
        // the loader's item (its steps; sg: the steps of the block's earlier items, the ring's stages and phases)
        auto load_item = [&](const int steps, const int sg) {
            [[maybe_unused]] int tails = 0;  // (VARLEN: the uses of bar_tail so far)
#ifdef VARLEN
            // the sequence's last key block: its copies go to bar_tail, the rows past the end (the next sequence's,
            // masked in P but a NaN or inf there would reach dQ through dS K and dP) are set to 0, then bar_kv completes
            const bool kv_tail = cols < BC;
            unsigned long long* kv_bar = kv_tail ? &bar_tail : &bar_kv;
#else
            unsigned long long* kv_bar = &bar_kv;
#endif
            if (lane == 0) {
                iok_tma_prefetch_map(&tmQ);
                iok_tma_prefetch_map(&tmdO);
                iok_mbar_expect_tx(kv_bar, 2 * BC * TILE_D * sizeof(T));
                wg_tma_tile<IOK_T_K, BC, T>(io, smem + SMEM_K, &tmK, kv_bar, k_base + col0, k_extent, kvz);
                wg_tma_tile<IOK_T_V, BC, T>(io, smem + SMEM_V, &tmV, kv_bar, k_base + col0, k_extent, kvz);
            }
#ifdef VARLEN
            if (kv_tail) {
                iok_mbar_wait(&bar_tail, 0);
                ++tails;
                wg_zero_tail<BC>(smem + SMEM_K, cols, lane);
                wg_zero_tail<BC>(smem + SMEM_V, cols, lane);
                wg_fence_async_smem();
                __syncwarp();
                if (lane == 0) iok_mbar_arrive(&bar_kv);
            }
#endif
#pragma unroll 1
            for (int s = 0; s < steps; ++s) {
                const int st = (sg + s) & 1, head = step_head(s), q0 = step_q0(s);
                const int rows = min(BR, n_q - q0);
                unsigned char* q = smem + (st ? SMEM_Q1 : SMEM_Q0);
                unsigned char* dO = smem + (st ? SMEM_DO1 : SMEM_DO0);
#ifdef VARLEN
                const bool tail = rows < BR;  // the sequence's last query block: its rows past the end zeroed below
                unsigned long long* bar = tail ? &bar_tail : &full[st];
#else
                unsigned long long* bar = &full[st];
#endif
                iok_mbar_wait(&empty[st], (((sg + s) >> 1) & 1) ^ 1);  // the consumers are done with step s - 2
                if (lane == 0) {
                    iok_mbar_expect_tx(bar, 2 * BR * TILE_D * sizeof(T));
                    wg_tma_tile<IOK_T_Q, BR, T>(io, q, &tmQ, bar, q_base + q0, q_extent, head);
                    wg_tma_tile<IOK_T_dO, BR, T>(io, dO, &tmdO, bar, q_base + q0, q_extent, head);
                }
#ifdef VARLEN
                const size_t row = iok_varlen_at(q_base + q0, head, q_extent, gridDim.z * kv_group);
#else
                const size_t row = static_cast<size_t>(head) * n_q + q0;
#endif
                tb_scalars<IOK_T_lse, true>(io, reinterpret_cast<float*>(smem + (st ? SMEM_LSE1 : SMEM_LSE0)), lse + row,
                                      rows, lane, row_stride);
                tb_scalars<IOK_T_D, false>(io, reinterpret_cast<float*>(smem + (st ? SMEM_D1 : SMEM_D0)), Dg + row, rows,
                                    lane, row_stride);
#ifdef VARLEN
                if (tail) {
                    // once copied, the rows past the sequence (another's, which may hold anything) set to 0 in each
                    // 64-column slab of Q and dO (128 bytes a row), made visible to the tensor cores; lane 0 then
                    // arrives on the stage for its expect_tx, which went to bar_tail
                    iok_mbar_wait(&bar_tail, tails & 1);
                    ++tails;
                    wg_zero_tail<BR>(q, rows, lane);
                    wg_zero_tail<BR>(dO, rows, lane);
                    wg_fence_async_smem();
                    __syncwarp();
                    if (lane == 0) iok_mbar_arrive(&full[st]);
                }
#endif
                iok_mbar_arrive(&full[st]);  // each lane's stores, released to the consumers' wait
            }
        };
        // the dQ writer's item: step s's buffer handed back to the consumers before step s + 1 (the block's first
        // step takes it as it is)
        [[maybe_unused]] auto dq_item = [&](const int steps, const int sg) {
#if !TB_WIDE
#pragma unroll 1
            for (int s = 0; s < steps; ++s) {
                if (sg + s > 0) iok_bar_arrive(BAR_DQ_EMPTY, CONSUMERS + 32);  // the buffer is free again
                iok_bar_sync(BAR_DQ_FULL, CONSUMERS + 32);  // the consumers' τ dS K_j of step s is in the buffer
                if (lane == 0) {
#pragma unroll
                    for (int b = 0; b < TB_DQ_BOXES; ++b) {
                        tb_dq_box(io, smem + SMEM_DQ + b * 8192, &tmdQ, b, q_base + step_q0(s), q_extent, step_head(s));
                    }
                    iok_bulk_commit();
                    iok_bulk_wait_read<0>();  // the engine has read the buffer
                }
                __syncwarp();
            }
#endif
        };
#ifdef ITEM_LIST
        if (warp < 2) {  // the loader and the dQ writer walk the list
            IokList list(io, work, list_first, list_last, lane);
            for (int sg = 0, nkv = 0; list.more();) {
                set_item(list.take(io, lane));
                const int steps = schedule();
                if (steps > 0 && warp == 0) {
                    if (nkv > 0) iok_mbar_wait(&kv_empty, (nkv - 1) & 1);  // the item before is done with K and V
                    load_item(steps, sg);
                } else if (steps > 0) {
                    dq_item(steps, sg);
                }
                sg += steps;
                nkv += steps > 0;
            }
            if (warp == 1 && lane == 0) iok_bulk_wait<0>();  // the additions are done before the block ends
        }
#else
        const int steps = schedule();
        if (warp == 0 && steps > 0) {
            load_item(steps, 0);
        }
#if !TB_WIDE
        else if (warp == 1 && steps > 0) {
            dq_item(steps, 0);
            if (lane == 0) iok_bulk_wait<0>();  // the additions are done before the block ends
        }
#endif
#endif
#ifdef IOK_COUNT
        iok_bar_sync(BAR_REGS, THREADS);  // the consumers are down to FLUSH_REGS
        iok_regs_inc<FLUSH_REGS>();
#endif
    } else {  // the consumer warpgroups
        iok_regs_inc<CONSUMER_REGS>();
        // one item: its steps, then dK_j, dV_j written; sg: the steps of the block's earlier items (the ring's stages
        // and phases, and the dQ buffer's first use), nkv: its earlier items with a step (bar_kv's phase)
        auto item = [&](const int steps, const int sg, const int nkv) {
        // warpgroup: keys [64 wg, 64 wg + 64) of the block (wide: w of 2)
        const int wg = TB_LEAN ? wg_index() : static_cast<int>(threadIdx.x >> 7);
        const int g = lane >> 2, t = lane & 3;  // accumulator coordinates: row group, thread in group
#ifdef VARLEN
        const size_t kv_off = iok_varlen_at(k_base + col0, kvz, k_extent, gridDim.z);  // packed rows
        const int kv_stride = iok_varlen_step(gridDim.z);
#else
        const size_t kv_off = static_cast<size_t>(kvz) * n_k + col0;
        constexpr int kv_stride = 1;
#endif
        [[maybe_unused]] const float scale2 = scale * WG_LOG2E;  // (SOFTCAP: wgb_probs_softcap)
        const unsigned char* Ks = smem + SMEM_K;
        const unsigned char* Vs = smem + SMEM_V;
#ifdef DROPOUT
        const float dv_scale = dropout_scale;  // dV = (Z ∘ P)ᵀ dO: P's kept elements times 1 / (1 − p), at the end
#else
        const float dv_scale = 1.0f;
#endif

#if TB_WIDE
        float kv[TILE_D / 2], s[TB_Q / 2], dp[TB_Q / 2];  // kv: dV (warpgroup 0) or dK (warpgroup 1)
#pragma unroll
        for (int i = 0; i < TILE_D / 2; ++i) kv[i] = 0.0f;
#else
        float dk[TILE_D / 2], dv[TILE_D / 2], s[BR / 2], dp[BR / 2];
#pragma unroll
        for (int i = 0; i < TILE_D / 2; ++i) dk[i] = dv[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < BR / 2; ++i) s[i] = dp[i] = 0.0f;
#endif
        // this warp's first key (rows key_w + g and key_w + g + 8) and its warpgroup's first query of a step's
        // block in Sᵀ and dPᵀ: its own 64 keys and every query, or (wide) the block's 64 and 32 queries each
        const int key_w = (TB_WIDE ? 0 : wg * 64) + warp * 16;
        const bool key_out[2] = {key_w + g >= cols, key_w + g + 8 >= cols};  // past n_k: P = 0
#ifdef IOK_MODS
        const IokMod mod{{cap0, cap1, cap2, cap3}, mod_heads, n_q, n_k};
#endif
        [[maybe_unused]] const int qw = TB_WIDE ? TB_Q * wg : 0;  // (narrow: read by dropout only)
#ifdef DROPOUT
        // the keep bits of step s (as flash_wgmma_bwd.cu); step 0's now, step s + 1's while step s's products fly
        auto dropout_bits = [&](int s, unsigned (&keep)[WG_COLS_REGS<TB_Q>]) {
            wg_dropout_cols<TB_Q>(keep, dropout_threshold, dropout_seed, dropout_offset, step_head(s), col0 + key_w,
                                  step_q0(s) + qw, g, t);
        };
        unsigned keep[WG_COLS_REGS<TB_Q>];
        if (steps > 0) dropout_bits(0, keep);
#endif
        if (steps > 0) iok_mbar_wait(&bar_kv, nkv & 1);

#if TB_WIDE
#ifdef SOFTCAP
#error "SOFTCAP: the narrow tiles (d up to 128)"
#endif

#pragma unroll 1
        for (int step = 0; step < steps; ++step) {
            const int buf = (sg + step) & 1;
            iok_mbar_wait(&full[buf], ((sg + step) >> 1) & 1);  // Q_i, dO_i, lse_i, D_i of this step landed
            const unsigned char* Qs = smem + (buf ? SMEM_Q1 : SMEM_Q0);
            const unsigned char* dOs = smem + (buf ? SMEM_DO1 : SMEM_DO0);
            const float* lse_s = reinterpret_cast<const float*>(smem + (buf ? SMEM_LSE1 : SMEM_LSE0));
            const float* d_s = reinterpret_cast<const float*>(smem + (buf ? SMEM_D1 : SMEM_D0));
            unsigned char* Pb = smem + (buf ? SMEM_P1 : SMEM_P0);
            unsigned char* dSb = smem + (buf ? SMEM_DS1 : SMEM_DS0);

            // Sᵀ = K_j Q_wᵀ, dPᵀ = V_j dO_wᵀ for this warpgroup's 32 queries
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < WGB_DSTEPS; ++kk) {
                wg_mma_ss<T, TB_Q>(s, wg_desc_k<BC>(Ks, 0, kk), wg_desc_k<BR>(Qs, qw, kk), kk);
            }
            wg_commit();
#pragma unroll
            for (int kk = 0; kk < WGB_DSTEPS; ++kk) {
                wg_mma_ss<T, TB_Q>(dp, wg_desc_k<BC>(Vs, 0, kk), wg_desc_k<BR>(dOs, qw, kk), kk);
            }
            wg_commit();
            wg_wait<1>();
            wg_fence_regs(s);
#ifdef ALIBI
            wgb_alibi(s, col0 + key_w + g, step_q0(step) + qw, alibi_slope[step / span] / scale, n_k - n_q, t);
#endif
            wgb_probs<true, TB_LEAN>(s, lse_s + qw, scale2, key_out, t);
#ifdef IOK_BAND
            wgb_band(s, col0, key_w, g, t, step_q0(step) + qw, IOK_BAND_LO, IOK_BAND_HI);
#endif
            unsigned pa[TB_Q / 16][4], dsa[TB_Q / 16][4];  // Pᵀ and dSᵀ rounded to T
            wg_acc_to_a<T, TB_Q>(pa, s);
            wg_wait<0>();  // dPᵀ done
            wg_fence_regs(dp);
#pragma unroll
            for (int i = 0; i < TB_Q / 2; ++i) {  // dSᵀ = Pᵀ ∘ (dPᵀ − D) (DROPOUT: Z ∘ dPᵀ) with Pᵀ as rounded
                const float2 p2 = wg_unpack<T>(pa[i >> 3][(i >> 1) & 3]);
                const float p = (i & 1) ? p2.y : p2.x, dq = d_s[qw + 8 * (i >> 2) + 2 * t + (i & 1)];
#ifdef DROPOUT
                const int bit = wg_cols_bit<TB_Q>(i);
                dp[i] = p * fmaf(dp[i], wg_keep(dropout_scale, keep[bit / 32], bit % 32), -dq);
#else
                dp[i] = p * (dp[i] - dq);
#endif
            }
            wg_acc_to_a<T, TB_Q>(dsa, dp);
#ifdef DROPOUT
#pragma unroll
            for (int kk = 0; kk < TB_Q / 16; ++kk) {  // Pᵀ's dropped elements zeroed for the dV product
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int lo = wg_cols_bit<TB_Q>(8 * kk + 2 * r), hi = wg_cols_bit<TB_Q>(8 * kk + 2 * r + 1);
                    pa[kk][r] = wg_keep2(pa[kk][r], keep[lo / 32], lo % 32, keep[hi / 32], hi % 32);
                }
            }
#endif
            // this warpgroup's columns of Pᵀ and dSᵀ -> the step's buffers; they were last read by the products of
            // step - 2, which both warpgroups waited for before the DS barrier of step - 1
            wgb_store_ds<T>(reinterpret_cast<T*>(Pb), pa, key_w, g, t, qw);
            wgb_store_ds<T>(reinterpret_cast<T*>(dSb), dsa, key_w, g, t, qw);
            wg_fence_async_smem();
            iok_bar_sync(BAR_DS, CONSUMERS);  // both warpgroups' columns are visible

            // dV += Pᵀ dO_i (warpgroup 0) or dK += dSᵀ Q_i (warpgroup 1): the same products on other operands (A from
            // shared memory, K-major; B MN-major), no branch around them (ptxas would serialize every wgmma)
            const unsigned char* a_s = wg ? dSb : Pb;
            const unsigned char* b_s = wg ? Qs : dOs;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BR / 16; ++kk) {
                wg_mma_ss_tb<T, TILE_D>(kv, wg_desc_k<BC>(a_s, 0, kk), wg_desc_mn<BR>(b_s, 0, kk), 1);
            }
            wg_commit();
#ifdef DROPOUT
            if (step + 1 < steps) {
                dropout_bits(step + 1, keep);
                wg_pin(keep);  // here, while the products fly
            }
#endif
            // dQacc_i += τ dS K_j: this warpgroup's d slabs (warpgroup 0 the first half, rounded up)
            const int head = step_head(step), q0 = step_q0(step);
#ifdef VARLEN
            const size_t row0 = iok_varlen_at(q_base + q0, head, q_extent, gridDim.z * kv_group);
#else
            const size_t row0 = static_cast<size_t>(head) * n_q + q0;
#endif
            constexpr int half = (TB_DSLABS + 1) / 2;
#pragma unroll 1
            for (int ds = wg ? half : 0; ds < (wg ? TB_DSLABS : half); ++ds) {
                float acc[32];  // overwritten by the first product (scale_d = 0)
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    wg_mma_ss_tt<T, 64>(acc, wg_desc_mn<BC>(dSb, 0, kk), wg_desc_mn<BC>(Ks, ds, kk), kk);
                }
                wg_commit();
                wg_wait<0>();
                wg_fence_regs(acc);
                wgb_dq_red(io, dQacc, acc, row0, min(BR, n_q - q0), 0, ds, warp, g, t, scale, row_stride);
            }
            wg_wait<0>();  // the dV or dK product done: the stage may be reused
            wg_fence_regs(kv);
            iok_mbar_arrive(&empty[buf]);  // this thread is done with the stage
        }

        // dV_j (warpgroup 0) or dK_j = τ dK (warpgroup 1) rounded and written once
        if (wg == 0) {
            wgb_store_rows<IOK_T_dV>(io, dV, kv, kv_off, key_w, g, t, cols, dv_scale, kv_stride);
        } else {
            wgb_store_rows<IOK_T_dK>(io, dK, kv, kv_off, key_w, g, t, cols, scale, kv_stride);
        }
#else

        // The tensor cores' queue across a step: with one dQ block per warpgroup (TB_DQ_PIPE, the default tiles at d 64
        // and 128) the dK product is issued after the dQ product and runs while τ dS K_j is stored; where the registers
        // allow (TB_DK_FLIES: B_r 64) it is waited for only once the next step's Sᵀ and dPᵀ are issued, so the tensor
        // cores go from one to the next without a gap (at B_r 128 the step's dSᵀ fragments, which the product reads,
        // leave too few registers: ptxas serializes every wgmma, C7512). The counting builds (their counters take
        // registers) and VARLEN do not let dK fly past the step (C7512 again), and the counting builds with DROPOUT or
        // SOFTCAP keep the order dK, dQ (with the keep bits the new order serializes the products and spills 8 bytes);
        // the order moves no byte. Issuing the next step's Sᵀ and dPᵀ at the end of a step made ptxas serialize them
        // all (C7514: the accumulators came from the loop and its prologue), as does a path around the loop that sets
        // dK while the last product flies (C7515): the loop and the wait after it are one branch.
#ifdef IOK_COUNT
#if defined(DROPOUT) || defined(SOFTCAP) || defined(IOK_MODS)
        constexpr bool TB_DQ_PIPE = false;
#else
        constexpr bool TB_DQ_PIPE = TB_DQ_BLOCKS == WGS;
#endif
        constexpr bool TB_DK_FLIES = false;
#elif defined(VARLEN)
        constexpr bool TB_DQ_PIPE = TB_DQ_BLOCKS == WGS;
        constexpr bool TB_DK_FLIES = false;  // (the consumers' 224 registers: C7512)
#else
        constexpr bool TB_DQ_PIPE = TB_DQ_BLOCKS == WGS;
        constexpr bool TB_DK_FLIES = TB_DQ_PIPE && BR == 64;
#endif
        unsigned dsa[BR / 16][4];  // dSᵀ as A fragments (rounded to T)

        if (!TB_DK_FLIES || steps > 0) {  // (a branch only where a product flies past the loop)
#pragma unroll 1
            for (int step = 0; step < steps; ++step) {
                const int buf = (sg + step) & 1;
                iok_mbar_wait(&full[buf], ((sg + step) >> 1) & 1);  // Q_i, dO_i, lse_i, D_i of this step landed
                const unsigned char* Qs = smem + (buf ? SMEM_Q1 : SMEM_Q0);
                const unsigned char* dOs = smem + (buf ? SMEM_DO1 : SMEM_DO0);
                const float* lse_s = reinterpret_cast<const float*>(smem + (buf ? SMEM_LSE1 : SMEM_LSE0));
                const float* d_s = reinterpret_cast<const float*>(smem + (buf ? SMEM_D1 : SMEM_D0));
                unsigned char* dSb = smem + (buf ? SMEM_DS1 : SMEM_DS0);
                T* dSs = reinterpret_cast<T*>(dSb);

                wgb_s_dp_issue<T>(s, dp, Ks, Vs, Qs, dOs, wg);
                if (TB_DK_FLIES && step > 0) {  // the previous step's dK product done: its stage may be reused
                    wg_wait<2>();
                    wg_fence_regs(dsa);
                    wg_fence_regs(dk);
                    iok_mbar_arrive(&empty[buf ^ 1]);
                }
                wg_wait<1>();  // Sᵀ done (dPᵀ may fly)
                wg_fence_regs(s);
                unsigned pa[BR / 16][4];  // Pᵀ as A fragments (rounded to T)
#ifdef SOFTCAP
#ifdef IOK_BAND
                wgb_band(s, col0, key_w, g, t, step_q0(step), IOK_BAND_LO, IOK_BAND_HI, neg_inf());
#endif
                unsigned cap_grad[BR / 4];  // 1 − tanh², half2 pairs
                wgb_probs_softcap<T>(s, pa, cap_grad, lse_s, softcap, scale, key_out, t);
#else
#ifdef ALIBI
                wgb_alibi(s, col0 + key_w + g, step_q0(step), alibi_slope[step / span] / scale, n_k - n_q, t);
#endif
#ifdef IOK_MODS
                unsigned hidden[(BR / 2 + 31) / 32], cap_grad[BR / 4];  // (cap_grad: SCORE_GRAD's derivative)
                wgb_mods(io, mod, s, hidden, cap_grad, col0 + key_w + g, step_q0(step), step_head(step), scale,
                         step_partial(step), t);
#endif
                wgb_probs<true, TB_LEAN>(s, lse_s, scale2, key_out, t);
#ifdef IOK_BAND
                wgb_band(s, col0, key_w, g, t, step_q0(step), IOK_BAND_LO, IOK_BAND_HI);
#endif
#ifdef IOK_MODS
                wgb_hide(s, hidden);
#endif
                wg_acc_to_a<T, BR>(pa, s);
#endif
#ifdef DROPOUT
                wgb_grads<T>(dv, dp, pa, dsa, d_s, dOs, t, keep, dropout_scale);
                if constexpr (!TB_DQ_PIPE) wgb_dk<T>(dk, dsa, Qs);
                if (step + 1 < steps) {
                    dropout_bits(step + 1, keep);
                    wg_pin(keep);  // here, while the products fly
                }
#elif defined(SOFTCAP) || defined(SCORE_GRAD)
                wgb_grads<T>(dv, dp, pa, dsa, d_s, dOs, t, cap_grad);  // dV flies
                if constexpr (!TB_DQ_PIPE) wgb_dk<T>(dk, dsa, Qs);
#else
                wgb_grads<T>(dv, dp, pa, dsa, d_s, dOs, t);  // dV flies
                if constexpr (!TB_DQ_PIPE) wgb_dk<T>(dk, dsa, Qs);
#endif

                // dSᵀ -> this step's buffer; it was last read by the dQ products of step - 2, which every warpgroup
                // waited for before the DS barrier of step - 1
                wgb_store_ds<T>(dSs, dsa, key_w, g, t);
                wg_fence_async_smem();
                iok_bar_sync(BAR_DS, CONSUMERS);  // every warpgroup's dSᵀ rows are visible

                // τ dS K_j, 64 x 64 blocks (query slab, d slab) split among the warpgroups, into the dQ buffer once
                // the writer has handed it back: box (query slab qs, 32 columns) holds row r, its 16-byte chunk x at
                // byte r * 128 + 16 (x ^ (r % 8)) (the 128-byte swizzle of the map)
                if (sg + step > 0) iok_bar_sync(BAR_DQ_EMPTY, CONSUMERS + 32);
#ifdef VARLEN
                // rows past the sequence's end are the next sequence's rows of dQacc: 0 is added there (their dS rows
                // are 0, or NaN where this sequence's V holds one: dP = 0 · V), so a NaN stays in its sequence
                const int q_rows = n_q - step_q0(step);
#endif
                // one stmatrix.x4 per 8 columns 64 ds + 8n ... + 7: its matrix j = 2h + c holds rows
                // warp·16 + 8h + (0..7) of the query slab, column 8n + 2t + c in the row's slot t, i.e. the 16-byte
                // chunk c of the 8 columns in dQacc's pair order (columns 8n + 0, 2, 4, 6, then 1, 3, 5, 7:
                // flash_bwd_dq with DQ_PAIRED puts them back); lane 8j + k gives the address of matrix j's row k (16
                // float stores of 8 bytes a thread before, the shared-memory queue's largest load:
                // results/h200/issue21/ncu-003e066/)
                auto dq_store = [&](const float (&acc)[32], int qs, int ds) {
                    const int mj = lane >> 3, mk = lane & 7;
                    const int r = warp * 16 + 8 * (mj >> 1) + mk;  // the row this lane gives the address of
#ifdef VARLEN
                    const bool in[2] = {qs * 64 + warp * 16 + g < q_rows, qs * 64 + warp * 16 + g + 8 < q_rows};
#else
                    constexpr bool in[2] = {true, true};
#endif
#pragma unroll
                    for (int n = 0; n < 8; ++n) {
                        const unsigned char* box = smem + SMEM_DQ + (qs * (TILE_D / 32) + 2 * ds + (n >> 2)) * 8192;
                        const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(
                            box + r * 128 + (((2 * (n & 3) + (mj & 1)) ^ (r & 7)) << 4)));
                        unsigned v[4];
#pragma unroll
                        for (int j = 0; j < 4; ++j) v[j] = __float_as_uint(in[j >> 1] ? acc[4 * n + j] * scale : 0.0f);
                        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                                     "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                                     : "memory");
                    }
                };
                if constexpr (TB_DQ_PIPE) {  // this warpgroup's block, then dK; the block stored while dK runs
                    const int qs = wg / TB_DSLABS, ds = wg % TB_DSLABS;
                    float acc[32];  // overwritten by the first product (scale_d = 0)
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < BC / 16; ++kk) {
                        wg_mma_ss_tt<T, 64>(acc, wg_desc_mn<BC>(dSb, qs, kk), wg_desc_mn<BC>(Ks, ds, kk), kk);
                    }
                    wg_commit();
                    wgb_dk<T>(dk, dsa, Qs);
                    wg_wait<1>();  // dV and dQ done (dK may fly)
                    wg_fence_regs(acc);
                    dq_store(acc, qs, ds);
                } else {
#pragma unroll 1
                    for (int blk = wg; blk < TB_DQ_BLOCKS; blk += WGS) {
                        const int qs = blk / TB_DSLABS, ds = blk % TB_DSLABS;
                        float acc[32];  // overwritten by the first product (scale_d = 0)
                        wg_fence();
#pragma unroll
                        for (int kk = 0; kk < BC / 16; ++kk) {
                            wg_mma_ss_tt<T, 64>(acc, wg_desc_mn<BC>(dSb, qs, kk), wg_desc_mn<BC>(Ks, ds, kk), kk);
                        }
                        wg_commit();
                        wg_wait<0>();
                        wg_fence_regs(acc);
                        dq_store(acc, qs, ds);
                    }
                }
                wg_fence_async_smem();  // the buffer's writes, before the copy engine reads them
                iok_bar_arrive(BAR_DQ_FULL, CONSUMERS + 32);
                if constexpr (!TB_DK_FLIES) {
                    wg_wait<0>();  // dV and dK products done: the stage, pa, dsa may be reused
                    wg_fence_regs(pa);
                    wg_fence_regs(dsa);
                    wg_fence_regs(dv);
                    wg_fence_regs(dk);
                    iok_mbar_arrive(&empty[buf]);  // this thread is done with the stage
                }
            }
            if constexpr (TB_DK_FLIES) {
                wg_wait<0>();  // the last step's dK product
                wg_fence_regs(dsa);
                wg_fence_regs(dk);
#ifdef ITEM_LIST
                if (steps > 0) iok_mbar_arrive(&empty[(sg + steps - 1) & 1]);  // its stage, for the next item's steps
#endif
            }
#ifdef ITEM_LIST
            if (steps > 0) iok_mbar_arrive(&kv_empty);  // this thread's products are done with K_j and V_j
#endif
        }

        // dK_j = τ dK, dV_j rounded and written once
        wgb_store_dkdv(io, dK, dV, dk, dv, kv_off, key_w, g, t, cols, scale, dv_scale, kv_stride);
#endif
        };
#ifdef ITEM_LIST
        IokList list(io, work, list_first, list_last, lane);
        for (int sg = 0, nkv = 0; list.more();) {
            set_item(list.take(io, lane));
            const int steps = schedule();
            item(steps, sg, nkv);
            sg += steps;
            nkv += steps > 0;
        }
#else
        item(schedule(), 0, 0);
#endif
#ifdef IOK_COUNT
        if constexpr (FLUSH_REGS < CONSUMER_REGS) iok_regs_dec<FLUSH_REGS>();
        iok_bar_arrive(BAR_REGS, THREADS);
#endif
    }
    iok_flush(io, iok_counters);  // one call site for every role
}
