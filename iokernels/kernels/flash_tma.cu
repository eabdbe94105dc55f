// Tensor-core FlashAttention forward for sm_90a with a producer warp (issue #21: TMA loads on mbarriers, warp
// specialization, register reallocation, the FlashAttention-3 overlap). The math is flash_wgmma.cu's (the q_outer
// loop order and bytes, wgmma products, online softmax in registers, CAUSAL and DROPOUT as there; WINDOW, a sliding
// window, visits the key tiles [kt0, kt0 + tiles) of the block's band only); how the tiles move and when the
// products are issued differ:
//
// A block is BR / 64 consumer warpgroups (query rows [64 w, 64 w + 64) each) and one producer warpgroup
// (THREADS = 2 BR + 128; BR 64, one consumer warpgroup, in the decode's tile of few packed rows). The producer gives
// up registers (setmaxnreg.dec: 24 with one or two consumer warpgroups, 40 in the counting build, 32 with three; the
// consumers take 240, 232 or 160) and one of its threads issues every copy:
// Q_i once, then K_0, and K_{j+1} before V_j, into two-stage rings, each tile as TILE_D / 64 TMA boxes of 64
// columns (kernels/tma.cuh; the maps from kernels/tensormap.py, one head at a time, so rows past N are zero-filled,
// never read) that land 128-byte swizzled as wgmma reads them. Stage s has a "full" barrier (the producer's
// expect_tx plus the copies' bytes) and an "empty" one (one arrival per consumer warp, after its product has read
// the stage). No block-wide barrier runs between the roles (the counting build's iok_flush has none either).
//
// A consumer warpgroup's step j issues S_j = Q K_jᵀ and then O += P_{j-1} V_{j-1} (P from registers), waits for
// the first, masks and exponentiates S_j while the second runs, then waits for it, rescales O and rounds P_j into
// the registers the next step's product reads; the last P V follows the loop. The warpgroups take turns issuing
// (named barriers 1 .. BR / 64, each warpgroup releasing the next), so one's softmax overlaps another's products.
//
// CAUSAL without PERSISTENT runs a block per item, each head's rows last to first (the longest first), the heads in
// turn or, with HEAD_BAND, in bands of heads (common.cuh IOK_GRID_X).
//
// ITEM_LIST (with PERSISTENT; the causal plans'; iokernels/plan/fast.py item_list): block b takes the entries [work[b],
// work[b + 1]) of the plan's list, work[G + 1 + i] (G = gridDim.x), each z T_r + (query block): the host's list
// schedule of the causal items (longest first, in bands of heads as HEAD_BAND's, each to the block that finishes
// first), so a block's next Q and K load while it finishes an item, and the blocks end together. Thread 0 reads the
// two offsets before the roles part; the producer's thread and lane 0 of each consumer warp (common.cuh IokList) read
// each entry, one item ahead.
//
// SPLIT (the split-KV decode, iokernels/plan/decode.py): the host passes the g query heads of each K/V head as one
// head of g·N_q packed rows (n_q, bh: the packed rows and the batch·K/V heads; kv_group 1); block (x, s, z) takes key
// tiles [s c, s c + c) of its item, c = ⌈T_c / S⌉ (S = gridDim.y, a split count the plan made with none empty), and
// writes its normalized float32 O and lse, the split's partials, to Opart and lse_part (S, bh, n_q[, d]), which
// combine.cu merges.
//
// PACKED_CAUSAL (the decode's causal mask on packed rows, bottom-right): packed row r is query position r % q_len of
// its head (q_len, an argument: the queries per head), which sees the keys up to keys - q_len + r % q_len; only the
// tiles past keys - q_len hold masked elements, and a row may see no key of a split (its partial: O = 0, lse -inf).
//
// VARLEN (a variable-length batch, iokernels/plan/varlen.py): Q, O as (total_q, heads, d) and K, V as (total_k,
// kv_heads, d), packed; block (x, b, z) takes query tile x of sequence b (its rows [cu_q[b], cu_q[b + 1]), read first
// with its keys' [cu_k[b], cu_k[b + 1])) for head z: n_q and n_k become the sequence's lengths (CAUSAL per sequence),
// the copies' rows are offset by the sequence's first and bounded by the packed rows (n_q, n_k as passed), and its
// last V tile's rows past the sequence (the next one's) are zeroed as RAGGED's are. O rows and lse (total_q, heads)
// are stored at their packed rows; a tile past the sequence's end does nothing. VARLEN_HEAD_MAJOR: every tensor a
// head's rows together, (heads, total, d) (common.cuh iok_varlen_at): the dense layout, a sequence per document.
//
// SOFTCAP (iokernels/plan/variants.py with_softcap): the logits τ s become c tanh(τ s / c) before the masks.
//
// ALIBI (iokernels/plan/variants.py with_alibi): thread 0 reads the block's head's slope before the roles part; the
// logits (after the softcap) get −slope |key − row − (n_k − n_q)| before the masks.
//
// MASK_MOD, SCORE_MOD (iokernels/plan/mods.py with_mods; common.cuh iok_mod_s): the user's expressions applied to
// every element of a tile inside the problem after ALiBi's place, before the masks; with BLOCK_SPARSE mask_mod only in
// the tiles the block mask marks partial. MOD_PREFETCH (the element the mods read first, one captured array's, at an
// index of b, h, q_idx, kv_idx: an explicit mask's): tile j + 1's lines of it prefetched into the L2 in step j.
// MOD_STAGE (an explicit mask's read X[R + kv_idx], rows 16-byte aligned): in step j each warp copies its 16 rows of
// tile j + 1's elements by cp.async into its rows of SMEM_STAGE (16-byte pieces; past N_q and the keys zero-filled,
// not read), and step j + 1 reads them there in pairs (the bias added, or −inf where the byte is 0). MOD_TMA (where two
// stages of B_r x B_c elements fit; iokernels/plan/mods.py mask_layout): the producer's thread loads tile j's elements
// with K_j instead, by the copy engine (tm_mask: the capture as {n_k, n_q, heads, batch}, boxes of 128 bytes x B_r
// rows, 128-byte swizzled; past N_q and the keys zero-filled) into stage SMEM_MASK0/1 of K_j's ring slot, completing
// on K_j's full barrier; a consumer warp releases the slot once it has read its rows (after the softmax's masks).
//
// BLOCK_SPARSE (block-sparse plans, the paper's Algorithm 5; iokernels/plan/masks.py): before the roles part, warp 0
// reads the block's row of the grid (T_r x T_c bytes, the key tiles of its band; common.cuh iok_kept_blocks) into a
// list of the kept key tiles in shared memory (BLOCK_LIST entries at most), and the item's steps run over that list:
// step j takes key tile kept[j], the same loop as without a mask. A row with no kept tile loads nothing and writes
// O = 0, lse -inf. With ITEM_LIST (iokernels/plan/fast.py with_listed_blocks: the list balances the rows' kept tiles;
// no dropout, ALiBi or mods) the producer's warp 0 walks the list and lists each item's kept tiles in `kept` in turn;
// its lane 0 issues the copies, and passes the consumers each item's count (item_tiles, a two-slot ring on full_item /
// empty_item) and each step's key tile (tile_of[stage], written before K's expect_tx: K's full barrier publishes it).
// Lane 0 of each consumer warp reads them (the thread that then arrives on the slot's empty barrier) and shares them.
//
// Counting: the producer counts the bytes a copy reads (its rows inside the tensor, HEAD_D T each), the
// consumers count O and lse (SPLIT: Opart and lse_part) as flash_wgmma.cu does; the model is q_outer's (SPLIT: the
// decode's, iokernels/model/hbm.py).
#include "common.cuh"

#include "tiles.cuh"

#include "wgmma.cuh"

#include "wg.cuh"

#include "tma.cuh"

#if !defined(BR) || !defined(BC) || !defined(HEAD_D) || !defined(THREADS)
#error "flash_tma.cu needs BR, BC, HEAD_D and THREADS from the plan"
#endif
constexpr int CONSUMERS = 2 * BR;  // threads of the consumer warpgroups
static_assert((BR == 64 || BR == 128 || BR == 192) && THREADS == CONSUMERS + 128,
              "a warpgroup per 64 rows, and the producer's");
constexpr int WGS = BR / 64;  // consumer warpgroups
// registers per thread after setmaxnreg: the producer keeps what issuing copies needs
// (its counting build keeps 40: it adds the bytes of every copy in 64-bit counters; 56 across the items of a
// persistent block)
#if defined(RAGGED) && defined(IOK_COUNT) && !defined(SPLIT) \
    && (defined(HEAD_D_TILE) ? HEAD_D_TILE > 128 : HEAD_D > 128)
// (a cache's counting build past d 128, one split: the consumers' O of 128 x 256 and the masks need 232, the producer
// fits in 40. With SPLIT and PACKED_CAUSAL neither split of the registers avoids a small spill, 16 bytes of the
// consumers' at 56 / 224: the counting build only, tests/kernels/test_compile.py SPILLS_ALLOWED)
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
#elif defined(BLOCK_SPARSE) && defined(ITEM_LIST) && defined(IOK_COUNT) \
    && (defined(HEAD_D_TILE) ? HEAD_D_TILE <= 64 : HEAD_D <= 64)
// (a block mask's list, counting, d up to 64: its producer's warp spills at 56 and 64; the consumers' tiles fit 208)
constexpr int PRODUCER_REGS = 80, CONSUMER_REGS = 208;
#elif defined(RAGGED) || (defined(IOK_COUNT) && defined(PERSISTENT)) || (defined(BLOCK_SPARSE) && defined(ITEM_LIST))
// (RAGGED: the page table's, the tail's state; a block mask's list: the producer's warp lists each item's kept tiles;
// three consumer warpgroups, persistent: 152 each, what the block's 65536 leave them)
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = WGS <= 2 ? 224 : 152;
#elif defined(IOK_COUNT)  // (VARLEN with three consumer warpgroups: their 160 spill 40 bytes, the counting build only)
constexpr int PRODUCER_REGS = WGS <= 2 ? 40 : 32, CONSUMER_REGS = WGS <= 2 ? 232 : 160;
#else
constexpr int PRODUCER_REGS = WGS <= 2 ? 24 : 32, CONSUMER_REGS = WGS <= 2 ? 240 : 160;
#endif
// setmaxnreg moves registers within the block's allocation at launch (65536 / THREADS per thread, a multiple of
// 8): an increase beyond it waits forever
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * CONSUMERS <= (65536 / THREADS) / 8 * 8 * THREADS,
              "the block's registers");
// TILE_D (wg.cuh): the tile's width; HEAD_D the problem's d. The copy engine zero-fills the columns past d, so
// they add nothing to S or O; those of O are not stored. The row strides of Q, K, V and O are d's (the tensor
// maps', HEAD_D in the stores).
static_assert((BC == 64 || BC == 128 || (BC == 176 && TILE_D <= 128 && WGS == 2)) && TILE_D <= 256,
              "wgmma tile widths (176: FlashAttention-3's keys per tile at d up to 128, two consumer warpgroups)");
static_assert(TILE_D <= 128 || (BC == 64 && BR == 128), "d past 128: S, O and P fit the registers at 128 x 64 only");

#if defined(RAGGED) && (defined(PERSISTENT) || defined(IOK_BAND) || defined(DROPOUT))
#error "RAGGED: a block per work item (its sequence's length read first), no mask, no dropout"
#endif
#if defined(SOFTCAP) && (defined(VARLEN) || defined(DROPOUT) || defined(RAGGED) || defined(SPLIT))
#error "SOFTCAP: the dense forward, with causal or a window, no dropout"
#endif
#if defined(VARLEN) && (defined(PERSISTENT) || defined(WINDOW) || defined(DROPOUT) || defined(RAGGED) || defined(SPLIT))
#error "VARLEN: a block per work item (its sequence's offsets read first), causal or no mask, no dropout"
#endif
#if defined(BLOCK_SPARSE) && ((defined(PERSISTENT) && !defined(ITEM_LIST)) || defined(VARLEN) || defined(RAGGED) \
    || defined(SPLIT) || defined(WINDOW) || !defined(BLOCK_LIST))
#error "BLOCK_SPARSE: a block per item or the list's persistent grid, causal or no mask; BLOCK_LIST from the plan"
#endif
#if defined(BLOCK_SPARSE) && defined(ITEM_LIST)
#if defined(DROPOUT) || defined(IOK_MODS) || defined(ALIBI)
#error "BLOCK_SPARSE with ITEM_LIST: no dropout, mods or ALiBi (their reads take the step's key tile ahead of it)"
#endif
#define IOK_SPARSE_LIST 1
#endif
#if defined(ALIBI) && (defined(PERSISTENT) || defined(VARLEN) || defined(RAGGED) || defined(SPLIT) || defined(SOFTCAP))
#error "ALIBI: a block per item (its slope read first), no softcap"
#endif
#if defined(HEAD_BAND) && (!defined(CAUSAL) || defined(PERSISTENT) || defined(VARLEN) || defined(SPLIT) \
    || defined(RAGGED))
#error "HEAD_BAND: the causal grid of a block per item, (T_r, 1, BH)"
#endif
#if defined(IOK_MODS) && (defined(PERSISTENT) || defined(VARLEN) || defined(RAGGED) || defined(SPLIT) \
    || defined(SOFTCAP) || defined(ALIBI) || defined(DROPOUT) || defined(PACKED_CAUSAL))
#error "MASK_MOD, SCORE_MOD: a block per item, no softcap, ALiBi or dropout (the mods express the first two)"
#endif
#ifdef IOK_MODS
static_assert(TILE_D <= 128, "MASK_MOD, SCORE_MOD: d up to 128");
#endif
#if defined(ITEM_LIST) && !defined(PERSISTENT)
#error "ITEM_LIST: a persistent grid's list of items"
#endif
#if defined(MOD_STAGE) && !defined(MOD_TMA)
constexpr int STAGE_PITCH = BC * static_cast<int>(sizeof(MOD_STAGE_T)) + 16;  // a query row in SMEM_STAGE (padded)
constexpr int STAGE_CHUNKS = BC * static_cast<int>(sizeof(MOD_STAGE_T)) / 16;  // its 16-byte pieces
static_assert(BC * sizeof(MOD_STAGE_T) % 16 == 0, "MOD_STAGE: whole 16-byte pieces a row");
#endif
#ifdef MOD_TMA
#if !defined(MOD_STAGE) || defined(PERSISTENT)
#error "MOD_TMA: a staged read (MOD_STAGE), a block per item"
#endif
constexpr int MASK_BOX = 128 / static_cast<int>(sizeof(MOD_STAGE_T));  // the elements of a box's row, 128 bytes
constexpr unsigned MASK_TILE_BYTES = BR * BC * sizeof(MOD_STAGE_T);   // a stage: BC / MASK_BOX boxes of BR x 128 B
static_assert(BC % MASK_BOX == 0 && BR <= 256 && SMEM_MASK0 % 1024 == 0 && SMEM_MASK1 % 1024 == 0,
              "MOD_TMA: whole boxes, 1024-byte aligned stages");
#endif
#ifdef ALIBI
static_assert(TILE_D <= 128, "ALIBI: d up to 128 (past it the counting build's consumers spill)");
#endif
#if defined(RAGGED) || defined(VARLEN)
#define IOK_TAIL 1  // the last V tile's rows past the sequence zeroed in shared memory
#endif
#ifdef PACKED_CAUSAL
#ifdef IOK_BAND
#error "PACKED_CAUSAL: the decode's own causal mask, not CAUSAL's or a window's"
#endif
#define IOK_PACKED_PARAM const int q_len,
#else
#define IOK_PACKED_PARAM
#endif
#ifdef SPLIT
#if defined(PERSISTENT) || defined(IOK_BAND) || defined(DROPOUT)
#error "SPLIT: a block per (item, split), no mask, no dropout"
#endif
constexpr int OUT_T = IOK_T_Opart, LSE_T = IOK_T_lse_part;  // the split's partials, float32
template <typename T> struct FwdOut { using type = float; };
#else
constexpr int OUT_T = IOK_T_O, LSE_T = IOK_T_lse;
template <typename T> struct FwdOut { using type = T; };
#endif

template <typename T>
__device__ constexpr bool wg_layout_ok()
{
    return layout_ok<5>({{SMEM_Q, BR * TILE_D * sizeof(T)},
                         {SMEM_K0, BC * TILE_D * sizeof(T)},
                         {SMEM_K1, BC * TILE_D * sizeof(T)},
                         {SMEM_V0, BC * TILE_D * sizeof(T)},
                         {SMEM_V1, BC * TILE_D * sizeof(T)}})
           && SMEM_Q % 1024 == 0 && SMEM_K0 % 1024 == 0 && SMEM_K1 % 1024 == 0 && SMEM_V0 % 1024 == 0
           && SMEM_V1 % 1024 == 0;
}

// Grid (ceil(N_q / BR), 1, BH). tmQ: Q (BH, N_q, HEAD_D) of T in boxes of BR rows; tmK, tmV: K, V (BH / kv_group,
// N_k, HEAD_D) in boxes of BC rows (tensormap.attention_map), query head z reading K/V head z / kv_group
// (grouped-query attention; 1 for none). O: (BH, N_q, HEAD_D) of T; lse: (BH, N_q) float32 (SPLIT: grid (T_r, S, BH),
// O and lse the partials, (S, BH, N_q, HEAD_D) and (S, BH, N_q) float32).
template <typename T>
__global__ void __launch_bounds__(THREADS, 1)
flash_tma_fwd(const __grid_constant__ IokTensorMap tmQ, const __grid_constant__ IokTensorMap tmK,
              const __grid_constant__ IokTensorMap tmV, typename FwdOut<T>::type* __restrict__ O,
              float* __restrict__ lse, const int n_q_in, const int n_k_in, float scale, int kv_group, int bh,
              IOK_BLOCK_MASK_PARAM IOK_WINDOW_PARAM IOK_SOFTCAP_PARAM IOK_ALIBI_PARAM IOK_MOD_PARAM IOK_CACHE_PARAM
              IOK_VARLEN_PARAM IOK_PACKED_PARAM IOK_WORK_PARAM IOK_DROPOUT_PARAM
              unsigned long long* __restrict__ iok_counters)
{
    static_assert(wg_layout_ok<T>(), "the plan's buffers must fit SMEM_BYTES, 1024-byte aligned");
    extern __shared__ __align__(1024) unsigned char smem[];
    IokCounters<IOK_T_Q, IOK_T_K, IOK_T_V, OUT_T, LSE_T IOK_CACHE_T IOK_VARLEN_T IOK_BLOCK_MASK_T IOK_ALIBI_T
                IOK_MOD_T IOK_WORK_T> io;
    if (threadIdx.x == 0 && (static_cast<unsigned>(__cvta_generic_to_shared(smem)) & 1023u) != 0) __trap();

    const int wg = threadIdx.x >> 7;               // warpgroup: query rows [64 wg, 64 wg + 64)
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;         // accumulator coordinates: row group, thread in group
    // the query rows and keys of the problem (VARLEN: of the block's sequence, read below), and where a copy's rows
    // start and end in the tensors (VARLEN: the sequence's first packed row; the packed rows)
    int n_q = n_q_in, n_k = n_k_in, q_base = 0;
    [[maybe_unused]] int k_base = 0;  // (PAGED: its copies address pages)
    const int q_extent = n_q_in;
    [[maybe_unused]] const int k_extent = n_k_in;
    // work items, B_r query rows of one head each. PERSISTENT (a stage parameter; B_r 128, or 192 for short items): the
    // blocks take them in turn (item blockIdx.x, + gridDim.x, ...; the plan launches at most TMA_FWD_CTAS blocks), so
    // the copy engine loads an item's Q and first K while the consumers finish the item before; else one item per
    // block. Causal: the longest rows first, across the heads
    [[maybe_unused]] const int t_r = (n_q + BR - 1) / BR, items = t_r * bh;
#ifdef PERSISTENT
    static_assert(WGS >= 2, "a persistent block keeps more state: its counting build's producer needs 56 registers");
#define ITEM_LOOP _Pragma("unroll 1") for (int it = blockIdx.x; it < items; it += gridDim.x)
#else
#define ITEM_LOOP for ([[maybe_unused]] int it = 0, once = 1; once; once = 0)  // one item, the block's (grid (T_r, 1, BH))
#endif
    struct Item {
        int row0, rows, z, kv_head, kt0, tiles;  // first row, rows, head (batch·head), its K/V head, key tiles
        // [kt0, kt0 + tiles)
        int keys;  // the keys its rows may see: n_k, or (RAGGED) its sequence's length
#ifdef IOK_TAIL
        int zero_from;  // the first row of its last V tile to zero (rows past the sequence loaded), or BC: none
#endif
    };
    int seq_keys = n_k;  // the keys of the block's sequence: n_k, or (RAGGED) its length, read below
    auto item_of = [&]([[maybe_unused]] int it) {
        Item w;
#if defined(ITEM_LIST)
        w.row0 = (it % t_r) * BR;  // (an entry of the list: z t_r + query block)
        w.z = it / t_r;
#elif defined(PERSISTENT) && defined(CAUSAL)
        w.row0 = (t_r - 1 - it / bh) * BR;
        w.z = it % bh;
#elif defined(PERSISTENT)
        w.row0 = (it % t_r) * BR;
        w.z = it / t_r;
#elif defined(CAUSAL)
        w.row0 = (gridDim.x - 1 - IOK_GRID_X) * BR;  // (HEAD_BAND: in bands of heads, common.cuh)
        w.z = IOK_GRID_Z;
#else
        w.row0 = blockIdx.x * BR;
        w.z = blockIdx.z;
#endif
        w.rows = min(BR, n_q - w.row0);  // (VARLEN: <= 0 past the sequence's end)
        w.kv_head = w.z / kv_group;
        w.keys = seq_keys;
#ifdef IOK_BAND
        // the key tiles hold every key a row of the item sees: from its first row's first (WINDOW) to its last
        // row's last; those outside are masked for all its rows
#ifdef WINDOW
        const int key_lo = max(0, w.row0 + win_lo);
#else
        const int key_lo = 0;
#endif
        const int key_hi = min(n_k, w.row0 + w.rows + IOK_BAND_HI);  // one past the last row's last key
        w.kt0 = key_lo / BC;
        w.tiles = key_hi > key_lo ? (key_hi + BC - 1) / BC - w.kt0 : 0;
#elif defined(SPLIT)
        // the splits are cut from the capacity's tiles; the item's sequence has t_b of them (RAGGED: a split past
        // its end has none)
        const int t_c = (n_k + BC - 1) / BC, c = (t_c + gridDim.y - 1) / gridDim.y, t_b = (w.keys + BC - 1) / BC;
        w.kt0 = blockIdx.y * c;
        w.tiles = max(0, min(c, t_b - w.kt0));
#else
        w.kt0 = 0;
        w.tiles = (w.keys + BC - 1) / BC;
#endif
#ifdef VARLEN
        if (w.rows <= 0) w.tiles = 0;  // a tile past its sequence's end
#endif
#ifdef IOK_TAIL
        // the copies of the sequence's last tile load rows past its end (a contiguous cache's up to the capacity, a
        // paged one's to the end of the box) that may hold anything, NaN included: V's must be zero (P = 0 there,
        // and 0 NaN = NaN in P V). K's are masked like any key past the end
        const int last = w.keys - ((w.keys + BC - 1) / BC - 1) * BC;  // rows of it inside the sequence, 1 .. BC
#if defined(PAGED)
        const bool past = w.keys % (PAGED < BC ? PAGED : BC) != 0;
#elif defined(VARLEN)
        const bool past = last < BC;  // (the next sequence's rows, or zero-filled ones past the packed tensor)
#else
        const bool past = w.keys < n_k && last < BC;
#endif
        w.zero_from = w.tiles > 0 && (w.kt0 + w.tiles) * BC >= w.keys && past ? last : BC;
#endif
        return w;
    };
    const float scale2 = scale * WG_LOG2E;  // softmax in base 2: exp(x s) = 2^(x s log2 e)

    // barriers: Q, full (1 arrival + the copy's bytes) and empty (one arrival per consumer warp once the item's last
    // S has read it); per stage of the K and V rings, full and empty (one arrival per consumer warp, after its wgmma
    // wait: every warp of a warpgroup has finished reading). The rings run on across items: tile j of an item is
    // slot ring + j, ring the tiles of the block's earlier items
    __shared__ __align__(8) unsigned long long bar_q, empty_q, full_k[2], full_v[2], empty_k[2], empty_v[2];
#ifdef IOK_TAIL
    // bar_tail: the copy of the sequence's last V tile, which the producer's warp 1 completes on full_v once it has
    // zeroed the rows past the end
    __shared__ __align__(8) unsigned long long bar_tail;
    if (threadIdx.x == 0) iok_mbar_init(&bar_tail, 1);
#endif
#ifdef RAGGED
    // the sequence of the block's K/V head (read once, by one thread) and its rows
    __shared__ int seq_len;
    const int seq = blockIdx.z / (gridDim.z / batch);
    if (threadIdx.x == 0) {
        // with the keys appended first; past the capacity: the capacity (no zero-filled rows taken for keys)
        seq_len = min(iok_ld<IOK_T_seqlens>(io, seqlens + seq) + seq_add, n_k);
    }
#endif
#ifdef VARLEN
    // the block's sequence: its first query and key rows and one past their last (read once, by one thread)
    __shared__ int seq_rows[4];
    if (threadIdx.x == 0) iok_varlen_rows(io, cu_seqlens_q, cu_seqlens_k, blockIdx.y, n_q_in, n_k_in, seq_rows);
#endif
#ifdef IOK_SPARSE_LIST
    // the kept key tiles of the producer's current item's row (its warp 0 lists them), each item's count and each K
    // stage's key tile for the consumers (the header comment)
    __shared__ unsigned short kept[BLOCK_LIST];
    __shared__ int item_tiles[2], tile_of[2];
    __shared__ __align__(8) unsigned long long full_item[2], empty_item[2];
    if (threadIdx.x == 0) {
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            iok_mbar_init(&full_item[st], 1);
            iok_mbar_init(&empty_item[st], CONSUMERS / 32);
        }
    }
#define IOK_KEY_TILE(j) key_tile(j)
#elif defined(BLOCK_SPARSE)
    // the kept key tiles of the block's row of the grid, within its band (kt0 + kept[j]): the item's steps
    __shared__ unsigned short kept[BLOCK_LIST];
    __shared__ int kept_count;
    if (threadIdx.x < 32) {
        const Item w = item_of(0);
        const int n = iok_kept_blocks<4>(io, block_mask + static_cast<size_t>(w.row0 / BR) * ((n_k + BC - 1) / BC),
                                      w.kt0, w.tiles, 1, kept, lane);
        if (lane == 0) kept_count = n;
    }
#ifdef MASK_MOD
#define IOK_KEY_TILE(j) (kt0 + static_cast<int>(kept[j] & (IOK_PARTIAL - 1)))
#define IOK_TILE_PARTIAL(j) ((kept[j] & IOK_PARTIAL) != 0)
#else
#define IOK_KEY_TILE(j) (kt0 + static_cast<int>(kept[j]))
#endif
#else
#define IOK_KEY_TILE(j) (kt0 + (j))
#endif
#ifndef IOK_TILE_PARTIAL
#define IOK_TILE_PARTIAL(j) true
#endif
#ifdef ALIBI
    __shared__ float alibi_slope;  // the block's head's (read once, by one thread)
    if (threadIdx.x == 0) alibi_slope = iok_ld<IOK_T_alibi>(io, alibi + item_of(0).z);
#endif
#ifdef ITEM_LIST
    __shared__ int list_range[2];  // the block's entries of the list
    if (threadIdx.x == 0) {
        list_range[0] = iok_ld<IOK_T_work>(io, work + blockIdx.x);
        list_range[1] = iok_ld<IOK_T_work>(io, work + blockIdx.x + 1);
    }
#endif
    if (threadIdx.x == 0) {
        iok_mbar_init(&bar_q, 1);
        iok_mbar_init(&empty_q, CONSUMERS / 32);
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            iok_mbar_init(&full_k[st], 1);
            iok_mbar_init(&full_v[st], 1);
            iok_mbar_init(&empty_k[st], CONSUMERS / 32);
            iok_mbar_init(&empty_v[st], CONSUMERS / 32);
        }
        iok_mbar_fence_init();
    }
    __syncthreads();  // the last block-wide barrier before the roles part
#ifdef RAGGED
    seq_keys = seq_len;
#endif
#ifdef VARLEN
    q_base = seq_rows[0];
    n_q = seq_rows[1] - q_base;
    k_base = seq_rows[2];
    n_k = seq_rows[3] - k_base;
    seq_keys = n_k;
#endif
#ifdef SPLIT
    // the combine may be launched now (programmatic dependent launch, combine.cu's PDL): its blocks wait for this
    // grid's completion, so only its launch overlaps the splits
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#ifdef ITEM_LIST
    const int list_first = list_range[0], list_last = list_range[1];
    [[maybe_unused]] const int* const entries = work + gridDim.x + 1;
#endif
#ifdef PERSISTENT
#define ITEM_OF(it) item_of(it)
#elif defined(BLOCK_SPARSE)
    Item block_item = item_of(0);  // before the roles part, as the one item's values: its steps, the kept tiles
    block_item.tiles = kept_count;
#define ITEM_OF(it) block_item
#else
    const Item block_item = item_of(0);  // before the roles part, as the one item's values
#define ITEM_OF(it) block_item
#endif

    if (threadIdx.x >= CONSUMERS) {  // the producer warpgroup: one thread issues every copy
        iok_regs_dec<PRODUCER_REGS>();
#ifdef IOK_SPARSE_LIST
        if (threadIdx.x < CONSUMERS + 32) {  // (its warp 0: lane 0 issues the copies, the warp lists the kept tiles)
            int ni = 0;  // items passed to the consumers
#else
        if (threadIdx.x == CONSUMERS) {
#endif
            iok_tma_prefetch_map(&tmQ);
            iok_tma_prefetch_map(&tmK);
            iok_tma_prefetch_map(&tmV);
#ifdef MOD_TMA
            iok_tma_prefetch_map(&tm_mask);
#endif
            int ring = 0, nq = 0;  // K/V slots and Q tiles loaded so far
#ifdef IOK_SPARSE_LIST
            IokList list(io, work, list_first, list_last, lane);
#pragma unroll 1
            while (list.more()) {
                const int it = list.take(io, lane);
#elif defined(ITEM_LIST)
            int next = list_first < list_last ? iok_ld<IOK_T_work>(io, entries + list_first) : 0;
#pragma unroll 1
            for (int i = list_first; i < list_last; ++i) {
                const int it = next;
                if (i + 1 < list_last) next = iok_ld<IOK_T_work>(io, entries + i + 1);
#else
            ITEM_LOOP {
#endif
                const Item w = ITEM_OF(it);
                const int z = w.z, kt0 = w.kt0;  // (scalars: a lambda captures them)
#ifdef IOK_SPARSE_LIST
                // the item's kept tiles (kt0 + kept[j]), its count to the consumers
                const unsigned char* row = block_mask + static_cast<size_t>(w.row0 / BR) * ((n_k + BC - 1) / BC);
                const int tiles = iok_kept_blocks<1>(io, row, kt0, w.tiles, 1, kept, lane);
                __syncwarp();
                if (lane == 0) {
                    iok_mbar_wait(&empty_item[ni & 1], ((ni >> 1) & 1) ^ 1);
                    item_tiles[ni & 1] = tiles;
                    iok_mbar_arrive(&full_item[ni & 1]);
                }
                ++ni;
                auto key_tile = [&](int j) { return kt0 + static_cast<int>(kept[j]); };
                if (lane == 0 && tiles > 0) {
#else
                const int tiles = w.tiles;
                if (tiles > 0) {  // (not a causal or window item whose rows see no key)
#endif
                    const int kv_head = w.kv_head;
#ifdef PERSISTENT
                    iok_mbar_wait(&empty_q, (nq & 1) ^ 1);  // the consumers' last product that reads Q is done
#endif
                    iok_mbar_expect_tx(&bar_q, BR * TILE_D * sizeof(T));
                    wg_tma_tile<IOK_T_Q, BR, T>(io, smem + SMEM_Q, &tmQ, &bar_q, q_base + w.row0, q_extent, z);
                    ++nq;
                    // K_0, then K_{j+1} before V_j: the consumers' step j + 1 issues Q K_{j+1}ᵀ together with P_j V_j
                    auto load = [&](int j, bool is_k) {
                        const int st = (ring + j) & 1;
                        const unsigned phase = ((ring + j) >> 1) & 1;
                        unsigned long long* empty = is_k ? &empty_k[st] : &empty_v[st];
                        unsigned long long* full = is_k ? &full_k[st] : &full_v[st];
                        iok_mbar_wait(empty, phase ^ 1);  // the consumers are done with this stage's last tile
#ifdef IOK_TAIL
                        if (!is_k && j == tiles - 1 && w.zero_from < BC) full = &bar_tail;  // (warp 1 fills the stage)
#endif
#ifdef IOK_SPARSE_LIST
                        if (is_k) tile_of[st] = IOK_KEY_TILE(j);  // (published by the arrival below)
#endif
#ifdef MOD_TMA
                        iok_mbar_expect_tx(full, BC * TILE_D * sizeof(T) + (is_k ? MASK_TILE_BYTES : 0u));
#else
                        iok_mbar_expect_tx(full, BC * TILE_D * sizeof(T));
#endif
                        const int key0 = IOK_KEY_TILE(j) * BC;
                        unsigned char* dst = smem + (is_k ? (st ? SMEM_K1 : SMEM_K0) : (st ? SMEM_V1 : SMEM_V0));
#ifdef PAGED
                        const int* table = page_table + static_cast<size_t>(seq) * max_pages;
                        const int heads_kv = gridDim.z / batch;
                        if (is_k) {
                            wg_tma_paged<IOK_T_K, BC, T>(io, dst, &tmK, full, key0, w.keys, table, kv_head % heads_kv,
                                                         heads_kv);
                        } else {
                            wg_tma_paged<IOK_T_V, BC, T>(io, dst, &tmV, full, key0, w.keys, table, kv_head % heads_kv,
                                                         heads_kv);
                        }
#else
                        if (is_k) {
                            wg_tma_tile<IOK_T_K, BC, T>(io, dst, &tmK, full, k_base + key0, k_extent, kv_head);
#ifdef MOD_TMA
                            // the mask's tile j with K_j: its elements inside (N_q, N_k) counted, the rest zero-filled
                            [[maybe_unused]] const int b = z / mod_heads, h = z % mod_heads;
                            wg_tma_boxes<IOK_T_captures, BR, BC, sizeof(MOD_STAGE_T)>(
                                io, smem + (st ? SMEM_MASK1 : SMEM_MASK0), &tm_mask, full, key0, w.row0, MOD_TMA_H,
                                MOD_TMA_B, n_q, w.keys);
#endif
                        } else {
                            wg_tma_tile<IOK_T_V, BC, T>(io, dst, &tmV, full, k_base + key0, k_extent, kv_head);
                        }
#endif
                    };
                    load(0, true);
#pragma unroll 1
                    for (int j = 0; j < tiles; ++j) {
                        if (j + 1 < tiles) load(j + 1, true);
                        load(j, false);
                    }
                    ring += tiles;
                }
#ifdef IOK_SPARSE_LIST
                __syncwarp();  // lane 0 done with kept before the warp lists the next item's
#endif
            }
        }
#ifdef IOK_TAIL
        else if (warp == 1 && block_item.zero_from < BC) {
            // the sequence's last V tile (stage (tiles - 1) % 2 of a block's one item): once copied, its rows past
            // the end are set to 0 (128 bytes of each 64-column slab a row: the swizzle moves 16-byte chunks within a
            // row), made visible to the tensor cores, and the stage is full
            const int st = (block_item.tiles - 1) & 1;
            iok_mbar_wait(&bar_tail, 0);
            wg_zero_tail<BC>(smem + (st ? SMEM_V1 : SMEM_V0), block_item.zero_from, lane);
            wg_fence_async_smem();
            __syncwarp();
            if (lane == 0) iok_mbar_arrive(&full_v[st]);
        }
#endif
    } else {  // the consumer warpgroups
        iok_regs_inc<CONSUMER_REGS>();
        int ring = 0, nq = 0;  // K/V slots and Q tiles used so far
#ifdef IOK_SPARSE_LIST
        int ni = 0;  // items taken from the producer
#endif
#ifdef ITEM_LIST
        IokList list(io, work, list_first, list_last, lane);
#pragma unroll 1
        while (list.more()) {
            const int it = list.take(io, lane);
#else
        ITEM_LOOP {
#endif
            const Item w = ITEM_OF(it);
#ifdef IOK_SPARSE_LIST
            // the item's count from the producer (lane 0 takes it and releases the slot), and each step's key tile
            int tiles = 0, step_tile = 0;
            if (lane == 0) {
                iok_mbar_wait(&full_item[ni & 1], (ni >> 1) & 1);
                tiles = item_tiles[ni & 1];
                iok_mbar_arrive(&empty_item[ni & 1]);
            }
            tiles = __shfl_sync(0xffffffffu, tiles, 0);
            ++ni;
            auto key_tile = [&](int) { return step_tile; };
            auto take_tile = [&](int buf) {  // (after K's full barrier)
                step_tile = __shfl_sync(0xffffffffu, lane == 0 ? tile_of[buf] : 0, 0);
            };
            [[maybe_unused]] const int row0 = w.row0, rows = w.rows, z = w.z, kt0 = w.kt0;  // (lambdas capture
            // scalars)
#else
            auto take_tile = [](int) {};
            [[maybe_unused]] const int row0 = w.row0, rows = w.rows, z = w.z, kt0 = w.kt0, tiles = w.tiles;  // (lambdas
            // capture scalars)
#endif
            float s[BC / 2], o[TILE_D / 2];
#pragma unroll
            for (int i = 0; i < TILE_D / 2; ++i) o[i] = 0.0f;
            float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.0f, 0.0f};  // rows g and g + 8, base-2 units
#ifdef IOK_MODS
            const IokMod mod{{cap0, cap1, cap2, cap3}, mod_heads, n_q, n_k};
#endif
            unsigned pa[BC / 16][4];  // P_j rounded to T: the A operand of the P V product issued in step j + 1
#ifdef DROPOUT
            unsigned keep[2];  // tile j's keep bits (rows g, g + 8; keep[h] bit 2n + c: element 4n + 2h + c)
#endif

            // S = Q K_jᵀ (64 x BC per warpgroup): TILE_D / 16 steps of 16; within a 64-column slab a step moves the
            // descriptors by 32 bytes, from slab to slab by the slab's size
            auto issue_s = [&](int j) {
                const unsigned char* Kt = smem + (((ring + j) & 1) ? SMEM_K1 : SMEM_K0);
#pragma unroll
                for (int kk = 0; kk < TILE_D / 16; ++kk) {
                    const int koff = (kk & 3) * 32 + (kk >> 2) * BR * 128;
                    const int kkoff = (kk & 3) * 32 + (kk >> 2) * BC * 128;
                    wg_mma_ss<T, BC>(s, wg_desc(smem + SMEM_Q + wg * 64 * 128 + koff, 16, 1024),
                                     wg_desc(Kt + kkoff, 16, 1024), kk);
                }
                wg_commit();
            };
            // O += P_j V_j: P from registers, 16 keys per step
            auto issue_pv = [&](int j) {
                const unsigned char* Vt = smem + (((ring + j) & 1) ? SMEM_V1 : SMEM_V0);
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    wg_mma_rs_tb<T, TILE_D>(o, pa[kk], wg_desc(Vt + kk * 16 * 128, BC * 128, 1024), 1);
                }
                wg_commit();
            };
            // MOD_PREFETCH: tile j's elements of the captured array the mods read first, into the L2 while the step
            // before runs (a line of 128 bytes per lane and 16 rows per warp; nothing past the item's last tile)
            auto mod_prefetch = [&]([[maybe_unused]] int j) {
#ifdef MOD_PREFETCH
                if (j >= tiles) return;
                const int key0 = IOK_KEY_TILE(j) * BC, keys = w.keys;
                const int q = min(row0 + wg * 64 + warp * 16 + (lane & 15), n_q - 1);
                constexpr int LINE = 128 / static_cast<int>(sizeof(MOD_PREFETCH_T));  // elements of a line
#pragma unroll
                for (int c = (lane >> 4) * LINE; c < BC; c += 2 * LINE) {
                    iok_mod_prefetch(mod, z, q, min(key0 + c, keys - 1));
                }
#endif
            };
            // MOD_STAGE: tile j's elements of the warp's 16 rows into its rows of SMEM_STAGE (one commit group)
            auto stage_copy = [&]([[maybe_unused]] int j) {
#if defined(MOD_STAGE) && !defined(MOD_TMA)
                if (j >= tiles) return;
                const int key0 = IOK_KEY_TILE(j) * BC, keys = w.keys, r0 = wg * 64 + warp * 16;
                const MOD_STAGE_T* x = static_cast<const MOD_STAGE_T*>(mod.cap[MOD_STAGE_SLOT]);
                constexpr int PER = 16 / static_cast<int>(sizeof(MOD_STAGE_T));  // elements a piece
#pragma unroll
                for (int c = lane; c < 16 * STAGE_CHUNKS; c += 32) {
                    const int r = c / STAGE_CHUNKS, k = key0 + (c % STAGE_CHUNKS) * PER, q = row0 + r0 + r;
                    const int inside = q < n_q ? max(0, min(PER, keys - k)) : 0;  // its elements inside
                    const MOD_STAGE_T* src = inside ? x + iok_stage_row(mod, z, q) + k : x;
                    iok_cp_async_part<IOK_T_captures>(io, smem + SMEM_STAGE + (r0 + r) * STAGE_PITCH
                                                      + (c % STAGE_CHUNKS) * 16, src,
                                                      inside * static_cast<int>(sizeof(MOD_STAGE_T)));
                }
                iok_cp_async_commit();
#endif
            };
            auto dropout_bits = [&]([[maybe_unused]] int j) {
#ifdef DROPOUT
                wg_dropout_rows<BC>(keep, dropout_threshold, dropout_seed, dropout_offset, z,
                                    row0 + wg * 64 + warp * 16 + g, IOK_KEY_TILE(j) * BC, t);
                asm volatile("" : "+r"(keep[0]), "+r"(keep[1]));  // done before the wait
#endif
            };
            // S_j landed in s: release K_j, mask, and the online softmax (rows g: i % 4 < 2, g + 8: i % 4 >= 2); s
            // becomes P_j, corr the factor of O
            auto softmax = [&](int j, float (&corr)[2]) {
                wg_fence_regs(s);
                __syncwarp();
#ifndef MOD_TMA  // (MOD_TMA: the slot's mask tile is read below first)
                if (lane == 0) iok_mbar_arrive(&empty_k[(ring + j) & 1]);  // this warp's share of the product read K_j
#endif
#ifdef PERSISTENT
                if (lane == 0 && j == tiles - 1) iok_mbar_arrive(&empty_q);  // ... and the item's last that reads Q
#endif
#ifdef SOFTCAP
                // the logits through the softcap, kept in units of s (τ s -> c tanh(τ s / c), times 1 / τ): the max
                // and the exponentials below scale them by τ as without one (common.cuh iok_tanh)
#pragma unroll
                for (int i = 0; i < BC / 2; ++i) s[i] = (softcap / scale) * iok_tanh(s[i] * (scale / softcap));
#endif
                const int key0 = IOK_KEY_TILE(j) * BC, keys = w.keys;
#ifdef ALIBI
                {
                    // −slope |key − row − (n_k − n_q)| in units of s (the exponentials scale it by τ); c: key − row
                    // − (n_k − n_q) of element 0 of the lane's first row
                    // (in floats: the offsets below are exact, and no integer temporaries)
                    const float slope = alibi_slope / scale;
                    const float c0 = static_cast<float>(key0 + 2 * t - (row0 + wg * 64 + warp * 16 + g) - (n_k - n_q));
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        const float c = c0 + static_cast<float>((i >> 2) * 8 + (i & 1) - 8 * ((i >> 1) & 1));
                        s[i] = fmaf(-slope, fabsf(c), s[i]);
                    }
                }
#endif
#ifdef IOK_MODS
                {
                    // every element of the tile, no branch around it (so the compiler may share an expression's
                    // loads among elements): a row or key past the problem's end takes its last one's index
                    const int r0 = row0 + wg * 64 + warp * 16 + g;  // the lane's first row (+ 8: its second)
                    const int q_idx[2] = {min(r0, n_q - 1), min(r0 + 8, n_q - 1)};
                    const bool partial = IOK_TILE_PARTIAL(j);
                    const float inv = 1.0f / scale;
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        const int k = min(key0 + (i >> 2) * 8 + 2 * t + (i & 1), keys - 1);
                        s[i] = iok_mod_s(io, mod, z, q_idx[(i >> 1) & 1], k, s[i], scale, inv, partial);
                    }
                }
#endif
#ifdef MOD_STAGE
                {
#ifdef MOD_TMA
                    // the lane's rows r, r + 8 of the stage (K_j's full barrier, waited for S_j, covered its bytes):
                    // box key / MASK_BOX, its 16-byte chunk XOR r % 8 (the 128-byte swizzle; r + 8: the same)
                    const int r = wg * 64 + warp * 16 + g;
                    const unsigned char* tile = smem + (((ring + j) & 1) ? SMEM_MASK1 : SMEM_MASK0) + r * 128;
#else
                    iok_cp_async_wait<0>();  // this lane's pieces of tile j landed ...
                    __syncwarp();            // ... and the warp's
                    const unsigned char* row = smem + SMEM_STAGE + (wg * 64 + warp * 16 + g) * STAGE_PITCH;
#endif
                    [[maybe_unused]] const float inv = 1.0f / scale;  // (a bias is a logit: in units of s, / τ)
#pragma unroll
                    for (int n = 0; n < BC / 4; ++n) {  // elements 2n, 2n + 1: row g + 8 (n & 1), keys (n >> 1) 8 + 2t
                        const int key = (n >> 1) * 8 + 2 * t;
#ifdef MOD_TMA
                        const int byte = (key % MASK_BOX) * static_cast<int>(sizeof(MOD_STAGE_T));
                        const float2 v = iok_stage_pair(tile + (key / MASK_BOX) * BR * 128 + (n & 1) * 8 * 128
                                                        + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15));
#else
                        const float2 v = iok_stage_pair(row + (n & 1) * 8 * STAGE_PITCH
                                                        + key * static_cast<int>(sizeof(MOD_STAGE_T)));
#endif
#if MOD_STAGE_FORM == 1
                        s[2 * n] = fmaf(v.x, inv, s[2 * n]);
                        s[2 * n + 1] = fmaf(v.y, inv, s[2 * n + 1]);
#else
                        if (v.x == 0.0f) s[2 * n] = neg_inf();
                        if (v.y == 0.0f) s[2 * n + 1] = neg_inf();
#endif
                    }
                    __syncwarp();  // the warp's reads done before its next copies into these rows
#ifdef MOD_TMA
                    if (lane == 0) iok_mbar_arrive(&empty_k[(ring + j) & 1]);  // ... and before the slot's next K, mask
#endif
                }
#endif
                if (key0 + BC > keys) {  // keys past n_k (ragged last tile; RAGGED: the sequence's end) get -inf
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) >= keys) s[i] = neg_inf();
                    }
                }
#ifdef WINDOW
                // keys outside a row's band get -inf (only in tiles that reach past the block's first row's last key or
                // before its last row's first)
                if (key0 + BC - 1 > row0 + win_hi || key0 < row0 + BR - 1 + win_lo) {
                    // the lane's first row's band relative to its first key (+ 8 for its second row)
                    const int rel = row0 + wg * 64 + warp * 16 + g - key0 - 2 * t;
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        const int c = (i >> 2) * 8 + (i & 1) - 8 * ((i >> 1) & 1);  // key - row, less rel
                        if (c > rel + win_hi || c < rel + win_lo) s[i] = neg_inf();
                    }
                }
#elif defined(PACKED_CAUSAL)
                // keys past a packed row's last visible key, keys - q_len + its position, get -inf (only tiles past
                // keys - q_len, the least of them)
                if (key0 + BC - 1 > keys - q_len) {
                    const int r = row0 + wg * 64 + warp * 16 + g;
                    const int last[2] = {keys - q_len + r % q_len, keys - q_len + (r + 8) % q_len};
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) > last[(i >> 1) & 1]) s[i] = neg_inf();
                    }
                }
#elif defined(CAUSAL)
                // keys past a row's last visible key get -inf (only tiles that reach past the block's first row's)
                const int off = IOK_BAND_HI;
                if (key0 + BC - 1 > row0 + off) {
                    const int row = row0 + wg * 64 + warp * 16 + g + off;  // + 8 for the second row of the lane
#pragma unroll
                    for (int i = 0; i < BC / 2; ++i) {
                        if (key0 + (i >> 2) * 8 + 2 * t + (i & 1) > row + 8 * ((i >> 1) & 1)) s[i] = neg_inf();
                    }
                }
#endif
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = m[h];
#pragma unroll
                    for (int n = 0; n < BC / 8; ++n) {
                        mx = fmaxf(mx, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]) * scale2);
                    }
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#if defined(IOK_BAND) || defined(PACKED_CAUSAL) || defined(IOK_MODS)
                    // a row that has seen no key yet: exp2 against 0, so its p and corr are 0, never NaN
                    const float mx_ref = mx == neg_inf() ? 0.0f : mx;
#else
                    const float mx_ref = mx;
#endif
                    corr[h] = exp2f(m[h] - mx_ref);  // m = -inf at first: 0
                    m[h] = mx;
                    float sum = 0.0f;
#pragma unroll
                    for (int n = 0; n < BC / 8; ++n) {
                        s[4 * n + 2 * h] = exp2f(fmaf(s[4 * n + 2 * h], scale2, -mx_ref));
                        s[4 * n + 2 * h + 1] = exp2f(fmaf(s[4 * n + 2 * h + 1], scale2, -mx_ref));
                        sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
                    }
                    l[h] = l[h] * corr[h] + sum;  // per-lane partial of the row sum; reduced at the end
                }
            };
            auto pack_p = [&]() {
#ifdef DROPOUT
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {  // element 8 kk + 2r + c: keep[r & 1] bit 2 (2 kk + r / 2) + c
                        const int bit = 4 * kk + 2 * (r >> 1);
                        pa[kk][r] = wg_pack<T>(wg_keep(s[8 * kk + 2 * r], keep[r & 1], bit),
                                               wg_keep(s[8 * kk + 2 * r + 1], keep[r & 1], bit + 1));
                    }
                }
#else
                wg_acc_to_a<T, BC>(pa, s);
#endif
            };

            // Step 0: S_0 alone. Every later step issues S_j and then P_{j-1} V_{j-1}, waits for the first, runs
            // S_j's softmax while the second flies, then waits for it and rescales O. No branch around a product or
            // a wait (ptxas would serialize the products).
            float corr[2];
            mod_prefetch(0);
            stage_copy(0);
            if (tiles > 0) {  // (a causal or window item whose rows see no key: O = 0)
                iok_mbar_wait(&bar_q, nq & 1);
                ++nq;
                iok_mbar_wait(&full_k[ring & 1], (ring >> 1) & 1);
                take_tile(ring & 1);
                wg_fence();
                issue_s(0);
                mod_prefetch(1);
                dropout_bits(0);
                wg_wait<0>();
                softmax(0, corr);
                stage_copy(1);
                pack_p();
#pragma unroll 1
                for (int j = 1; j < tiles; ++j) {
                    const int buf = (ring + j) & 1, pbuf = buf ^ 1;
                    // the warpgroups take turns issuing (named barrier 1 + wg; warpgroup 0 has the first turn); one
                    // (BR 64, the decode's tile of few packed rows) has no turns to take
                    if (WGS > 1 && !(wg == 0 && j == 1)) iok_bar_sync(1 + wg, 256);
                    iok_mbar_wait(&full_k[buf], ((ring + j) >> 1) & 1);  // K_j landed
                    take_tile(buf);
                    iok_mbar_wait(&full_v[pbuf], ((ring + j - 1) >> 1) & 1);  // V_{j-1} landed
                    wg_fence();
                    issue_s(j);
                    issue_pv(j - 1);
                    if (WGS > 1 && !(wg == WGS - 1 && j == tiles - 1)) iok_bar_arrive(1 + (wg + 1) % WGS, 256);  // next
                    mod_prefetch(j + 1);
                    dropout_bits(j);
                    wg_wait<1>();  // S_j done (P_{j-1} V_{j-1} may still fly)
                    softmax(j, corr);
                    stage_copy(j + 1);
                    wg_wait<0>();  // P_{j-1} V_{j-1} done: O and P's registers are free
                    wg_fence_regs(o);
                    wg_fence_regs(pa);
                    __syncwarp();
                    if (lane == 0) iok_mbar_arrive(&empty_v[pbuf]);  // this warp's share has read V_{j-1}
#pragma unroll
                    for (int i = 0; i < TILE_D / 2; ++i) o[i] *= corr[(i >> 1) & 1];
                    pack_p();
                }
                // the last tile's O += P V
                iok_mbar_wait(&full_v[(ring + tiles - 1) & 1], ((ring + tiles - 1) >> 1) & 1);
                wg_fence();
                issue_pv(tiles - 1);
                wg_wait<0>();
                wg_fence_regs(o);
#ifdef PERSISTENT
                __syncwarp();
                if (lane == 0) iok_mbar_arrive(&empty_v[(ring + tiles - 1) & 1]);  // this warp's share has read it
                ring += tiles;
#endif
            }

#ifdef SPLIT
            if (tiles == 0) continue;  // (RAGGED: a split past its sequence's end writes nothing; the combine knows)
#endif
            // O = O / l, rounded once; lse = (m + log2 l) ln 2
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
                l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
            }
#if defined(IOK_BAND) || defined(RAGGED) || defined(PACKED_CAUSAL) || defined(VARLEN) || defined(BLOCK_SPARSE) \
    || defined(IOK_MODS)
            // a row that sees no key (RAGGED, VARLEN: a sequence of none; PACKED_CAUSAL: of a split; BLOCK_SPARSE: a row
            // of the grid with no kept tile; IOK_MODS: one whose every key the mods hide): O = 0, lse = -inf
            const float inv[2] = {l[0] == 0.0f ? 0.0f : 1.0f / l[0], l[1] == 0.0f ? 0.0f : 1.0f / l[1]};
#else
            const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
#endif
#ifdef DROPOUT
            const float out_scale[2] = {inv[0] * dropout_scale, inv[1] * dropout_scale};  // O = (Z ∘ P) V / l
#else
            const float (&out_scale)[2] = inv;
#endif
#if defined(VARLEN)
            const size_t out_off = iok_varlen_at(q_base + row0, z, n_q_in, bh);  // packed rows of bh heads
            const int out_step = iok_varlen_step(bh);
#else
            const size_t q_off = static_cast<size_t>(z) * n_q + row0;
#ifdef SPLIT
            const size_t out_off = static_cast<size_t>(blockIdx.y) * gridDim.z * n_q + q_off;  // split s's rows
#else
            const size_t out_off = q_off;
#endif
            constexpr int out_step = 1;
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wg * 64 + warp * 16 + g + 8 * h;
                if (r < rows) {
                    auto* orow = O + (out_off + static_cast<size_t>(r) * out_step) * HEAD_D;
#pragma unroll
                    for (int n = 0; n < TILE_D / 8; ++n) {
                        if (n * 8 < HEAD_D) {  // the tile's columns past d: not stored
                            const float a = o[4 * n + 2 * h] * out_scale[h], b = o[4 * n + 2 * h + 1] * out_scale[h];
#ifdef SPLIT
                            iok_st<OUT_T>(io, reinterpret_cast<float2*>(orow + n * 8 + 2 * t), make_float2(a, b));
#else
                            iok_st<OUT_T>(io, reinterpret_cast<unsigned*>(orow + n * 8 + 2 * t), wg_pack<T>(a, b));
#endif
                        }
                    }
                    if (t == 0) {
                        iok_st<LSE_T>(io, lse + out_off + static_cast<size_t>(r) * out_step,
                                      (m[h] + __log2f(l[h])) * 0.6931471805599453f);
                    }
                }
            }
        }
    }
    iok_flush(io, iok_counters);  // one call site for both roles
}
