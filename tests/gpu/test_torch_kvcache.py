"""iokernels.torch.attention_with_kvcache on an sm_90 device (issue #23): O against torch SDPA in float64 over each
sequence's keys within flash-attention's same-precision tolerance, and lse against the float64 logsumexp, for a
contiguous cache with per-sequence lengths (and without), a paged pool through its page table, float16 and bfloat16,
rows past the lengths and unused pages NaN; a signature's later calls (the fast path) read new values where they lie;
torch.library.opcheck and torch.compile on the operator; a decode step captured in a CUDA graph replays correctly
after the cache, the lengths, the page table and q change in place; the backward raises; count_io counts a torch
call.

Run alone: ``PYTHONPATH=. pytest tests/gpu/test_torch_kvcache.py`` (skips without an sm_90 device).
"""

import math

import pytest

torch = pytest.importorskip("torch")
itorch = pytest.importorskip("iokernels.torch")

pytestmark = pytest.mark.usefixtures("sm90")

F = torch.nn.functional


@pytest.fixture
def plain_outputs(monkeypatch):
    """opcheck and graph replays compare runs: no NaN poisoning (a fill kernel per buffer) here."""
    from iokernels.kernels import launch

    monkeypatch.setattr(launch, "DEBUG_POISON", False)


def _cache(lengths, n_cap, kv_heads, d, dtype, page_size=0, pages=0, seed=0, append=0):
    """A cache holding random keys and values up to each sequence's length, NaN elsewhere: contiguous k, v (B, H_kv,
    N_cap, d), or a pool (pages, H_kv, page_size, d) whose pages are handed out in random order, with the page table
    (B, N_cap / page_size) int32 on the device (−1 past a sequence's pages). Returns (k, v, cache_seqlens, page_table
    or None, each sequence's (k, v) of shape (H_kv, length, d))."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seqs = [tuple(torch.randn(kv_heads, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
            for n in lengths]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if not page_size:
        k, v = (torch.full((len(lengths), kv_heads, n_cap, d), math.nan, device="cuda", dtype=dtype) for _ in range(2))
        for b, kv in enumerate(seqs):
            for cache, x in zip((k, v), kv, strict=True):
                cache[b, :, :x.shape[1]] = x
        return k, v, seqlens, None, seqs
    k, v = (torch.full((pages, kv_heads, page_size, d), math.nan, device="cuda", dtype=dtype) for _ in range(2))
    table = torch.full((len(lengths), n_cap // page_size), -1, dtype=torch.int32)
    order = iter(torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).tolist())
    for b, kv in enumerate(seqs):
        for i in range(-(-(lengths[b] + append) // page_size)):  # (pages for the rows a step appends too)
            page = next(order)
            table[b, i] = page
            for cache, x in zip((k, v), kv, strict=True):
                rows = x[:, i * page_size:(i + 1) * page_size]
                cache[page, :, :rows.shape[1]] = rows
    return k, v, seqlens, table.cuda(), seqs


def _reference(q, seqs, scale=None):
    """O of each sequence's query heads over its keys by SDPA in float64 and in q's dtype (the same-precision
    yardstick), and lse in float64; a sequence of no key: O 0, lse −inf."""
    d = q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o64, same = torch.zeros(q.shape, dtype=torch.float64, device="cuda"), torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float64, device="cuda")
    for b, (k, v) in enumerate(seqs):
        if k.shape[1] == 0:
            continue
        qb, kb, vb = q[b:b + 1], k[None], v[None]  # 4-d, as SDPA's fused kernels take them (the same-precision one)
        o64[b] = F.scaled_dot_product_attention(qb.double(), kb.double(), vb.double(), scale=scale, enable_gqa=True)[0]
        same[b] = F.scaled_dot_product_attention(qb, kb, vb, scale=scale, enable_gqa=True)[0]
        group = q.shape[1] // k.shape[0]
        s = scale * q[b].double() @ k.double().repeat_interleave(group, dim=0).transpose(-1, -2)
        lse[b] = torch.logsumexp(s, dim=-1)
    return o64, same, lse


def _assert_close(q, seqs, o, lse, scale=None):
    o64, same, lse64 = _reference(q, seqs, scale)
    empty = torch.isneginf(lse64)
    assert torch.equal(torch.isneginf(lse), empty) and torch.all(o[empty] == 0)
    err = (o.double() - o64).abs().max().item()
    err_same = (same.double() - o64).abs().max().item()
    assert math.isfinite(err) and err <= 2 * err_same + 1e-3, (err, err_same)
    lse_err = (lse[~empty].double() - lse64[~empty]).abs()
    assert lse_err.numel() == 0 or lse_err.max().item() < 1e-2


# (lengths or None (N_cap keys each), N_cap, page size, pool pages, N_q, d, heads, kv_heads, dtype, causal, splits)
CASES = [
    ((0, 1, 128, 129, 1100), 1100, 0, 0, 1, 128, 8, 2, torch.float16, True, 3),  # empty, one key, a tile's end
    ((300, 0, 77), 512, 0, 0, 3, 64, 4, 4, torch.bfloat16, False, 1),  # 1:1, one split
    ((5000, 3, 4097, 2048), 8192, 0, 0, 1, 128, 64, 8, torch.bfloat16, True, 0),  # GQA 8:1, the plan's split
    (None, 1000, 0, 0, 2, 128, 16, 4, torch.float16, False, 0),  # no lengths: every sequence N_cap keys
    ((16, 17, 500, 0), 512, 16, 80, 3, 96, 48, 2, torch.float16, False, 4),  # pages of 16, d 96
    ((700, 255, 1), 1024, 256, 9, 1, 256, 2, 1, torch.bfloat16, True, 0),  # pages of 256, d 256
    ((900, 1, 0, 3000), 4096, 64, 80, 1, 128, 32, 8, torch.bfloat16, True, 0),  # the docs' decode
]
IDS = [f"{'paged' + str(c[2]) if c[2] else 'contiguous'}-{c[1]}-{c[4]}x{c[5]}-{c[6]}:{c[7]}-{str(c[8])[6:]}"
       for c in CASES]


def _copy_into(static, fresh):
    """Each tensor of ``fresh`` (q, k, v and the cache's kw) written into its place in ``static``."""
    q, k, v, kw, _ = static
    q2, k2, v2, kw2, _ = fresh
    for name in ("cache_seqlens", "page_table"):
        if kw[name] is not None:
            kw[name].copy_(kw2[name])
    for x, x2 in ((q, q2), (k, k2), (v, v2)):
        x.copy_(x2)


def _case(case, seed=0, lengths=None):
    given, n_cap, page, pages, n_q, d, heads, kv_heads, dtype, causal, splits = case
    lengths = lengths or given or (n_cap,) * 3
    k, v, seqlens, table, seqs = _cache(lengths, n_cap, kv_heads, d, dtype, page, pages, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(seqlens.shape[0], heads, n_q, d, device="cuda", dtype=dtype, generator=gen)
    kw = dict(cache_seqlens=None if given is None else seqlens, page_table=table, causal=causal, num_splits=splits)
    return q, k, v, kw, seqs


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_outputs_equal_sdpa_over_each_sequences_keys(case):
    q, k, v, kw, seqs = _case(case)
    o, lse = itorch.attention_with_kvcache(q, k, v, return_lse=True, **kw)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    _assert_close(q, seqs, o, lse)
    fresh = _case(case, seed=7)  # the signature's next call (the fast path): new values in the same tensors
    _copy_into((q, k, v, kw, seqs), fresh)
    again, lse_again = itorch.attention_with_kvcache(q, k, v, return_lse=True, **kw)
    _assert_close(q, fresh[4], again, lse_again)


def test_a_scale_is_applied():
    q, k, v, kw, seqs = _case(CASES[0])
    o, lse = itorch.attention_with_kvcache(q, k, v, scale=0.3, return_lse=True, **kw)
    _assert_close(q, seqs, o, lse, scale=0.3)


@pytest.mark.usefixtures("plain_outputs")
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=[IDS[0], IDS[4]])
def test_opcheck(case):
    q, k, v, kw, _ = _case(case)
    args = (q, k, v, kw["cache_seqlens"], kw["page_table"], "bottom_right" if kw["causal"] else "", None,
            kw["num_splits"])
    torch.library.opcheck(torch.ops.iokernels.attention_with_kvcache.default, args)


def test_compile_fullgraph_equals_eager():
    torch._dynamo.reset()
    q, k, v, kw, _ = _case(CASES[6])

    def step(q, k, v, seqlens, table):
        return itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, causal=True) * 2

    with torch.no_grad():
        compiled = torch.compile(step, fullgraph=True)(q, k, v, kw["cache_seqlens"], kw["page_table"])
        assert torch.equal(compiled, step(q, k, v, kw["cache_seqlens"], kw["page_table"]))


@pytest.mark.usefixtures("plain_outputs")
@pytest.mark.parametrize("case", [CASES[0], CASES[6]], ids=[IDS[0], IDS[6]])
def test_a_captured_decode_step_replays_after_the_cache_changes(case):
    """The usual recipe (warm up on a side stream, capture once): the replay reads q, the cache, the lengths and the
    page table where they lie, so after they change in place it equals an eager call on the new values."""
    q, k, v, kw, seqs = _case(case)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            itorch.attention_with_kvcache(q, k, v, return_lse=True, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_o, static_lse = itorch.attention_with_kvcache(q, k, v, return_lse=True, **kw)
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(q, seqs, static_o, static_lse)
    before = static_o.clone()
    lengths, n_cap = case[:2]
    fresh = _case(case, seed=9, lengths=tuple(min(n + 1 + 37 * i, n_cap) for i, n in enumerate(lengths)))  # longer
    _copy_into((q, k, v, kw, seqs), fresh)  # new values, lengths and (paged) page order
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(static_o, before)
    _assert_close(q, fresh[4], static_o, static_lse)
    with torch.no_grad():
        eager_o, eager_lse = itorch.attention_with_kvcache(q, k, v, return_lse=True, **kw)
    assert torch.equal(static_o, eager_o) and torch.equal(static_lse, eager_lse)


def test_the_backward_raises_and_the_forward_runs_under_autograd():
    q, k, v, kw, _ = _case(CASES[2])
    q.requires_grad_()
    o = itorch.attention_with_kvcache(q, k, v, **kw)  # through the operator (the eager path skips it without grad)
    with torch.no_grad():
        assert torch.equal(o, itorch.attention_with_kvcache(q, k, v, **kw))
    with pytest.raises(RuntimeError, match="has no backward"):
        o.float().sum().backward()


def test_count_io_counts_a_torch_call():
    from iokernels.kernels import launch

    q, k, v, kw, _ = _case(CASES[0])
    plain = itorch.attention_with_kvcache(q, k, v, **kw)
    with launch.count_io() as records:
        counted = itorch.attention_with_kvcache(q, k, v, **kw)
    assert {r["stage"] for r in records} == {"main", "combine"}  # 3 splits: the combine runs
    assert torch.allclose(counted.float(), plain.float(), atol=2e-3, rtol=0)


@pytest.mark.parametrize("page_size", [0, 16])
def test_append_then_causal_attention(page_size):
    """k, v appended after each sequence's keys (the caches updated in place, the lengths not), then the step's
    N_q = N_new queries attend with the bottom-right causal mask (torch.ops.iokernels.attention_with_kvcache_append):
    O against SDPA in float64 with causal_lower_right over the cached and new keys; the caches hold the new rows."""
    from torch.nn.attention.bias import causal_lower_right

    lengths, n_new, heads, kv_heads, d, dtype = (0, 37, 300), 4, 16, 4, 128, torch.bfloat16
    k, v, seqlens, table, seqs = _cache(lengths, 512, kv_heads, d, dtype, page_size=page_size, pages=80, seed=5,
                                        append=n_new)
    gen = torch.Generator(device="cuda").manual_seed(6)
    q = torch.randn(3, heads, n_new, d, device="cuda", dtype=dtype, generator=gen)
    k_new, v_new = (torch.randn(3, kv_heads, n_new, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    with torch.no_grad():
        o = itorch.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, k=k_new, v=v_new,
                                          causal=True)
    scale = 1 / math.sqrt(d)
    for b, (kb, vb) in enumerate(seqs):
        kb, vb = torch.cat([kb, k_new[b]], dim=1), torch.cat([vb, v_new[b]], dim=1)
        mask = causal_lower_right(n_new, kb.shape[1])
        want = F.scaled_dot_product_attention(q[b:b + 1].double(), kb[None].double(), vb[None].double(),
                                              attn_mask=mask, scale=scale, enable_gqa=True)[0]
        same = F.scaled_dot_product_attention(q[b:b + 1], kb[None], vb[None], attn_mask=mask, scale=scale,
                                              enable_gqa=True)[0]
        err, err_same = (o[b].double() - want).abs().max().item(), (same.double() - want).abs().max().item()
        assert err <= 2 * err_same + 2e-3, (b, err, err_same)
        n = lengths[b]
        for cache, new in ((k, k_new), (v, v_new)):  # the new rows in the cache, after the sequence's keys
            if page_size:
                rows = [cache[table[b, (n + r) // page_size], :, (n + r) % page_size] for r in range(n_new)]
                assert torch.equal(torch.stack(rows, dim=1), new[b])
            else:
                assert torch.equal(cache[b, :, n:n + n_new], new[b])
    with pytest.raises(RuntimeError, match="no backward"):
        itorch.attention_with_kvcache(q.requires_grad_(), k, v, cache_seqlens=seqlens, page_table=table, k=k_new,
                                      v=v_new)
