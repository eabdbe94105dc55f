"""Issue #23 probe: the decode step from a paged cache against the same keys in a contiguous one, through
iokernels.torch.attention_with_kvcache (d 128, float16, one token), each layout captured in a CUDA graph that cycles
through enough distinct caches to exceed 4x the L2, replays timed with CUDA events (median of 15). Layouts: contiguous
without lengths (every sequence N_k keys: the dense split-KV plan), contiguous with cache_seqlens = N_k (the ragged
plan), paged in pages of 16, 64 and 256 rows handed out in random order (the ragged, paged plan). Prints µs a step and
each layout over the contiguous one with lengths. Usage: python3 results/h100/issue23/scripts/paged_probe.py"""

import statistics

import torch

import iokernels.torch as iot

D, DTYPE = 128, torch.float16
CASES = [(1, 64, 8, 16384), (8, 64, 8, 16384), (1, 64, 8, 131072), (16, 8, 8, 32768), (64, 64, 8, 4096)]


def graph_us(fn, calls: int) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    times = []
    for _ in range(17):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times[2:])


def layouts(b: int, hkv: int, nk: int, gen: torch.Generator) -> dict[str, tuple]:
    """One cache's (k_cache, v_cache, cache_seqlens, page_table) per layout, the same keys and values in each."""
    k, v = (torch.randn(b, hkv, nk, D, device="cuda", dtype=DTYPE, generator=gen) for _ in range(2))
    seqlens = torch.full((b,), nk, dtype=torch.int32, device="cuda")
    out = {"contiguous": (k, v, None, None), "contiguous+lengths": (k, v, seqlens, None)}
    for page in (16, 64, 256):
        per_seq = nk // page
        order = torch.randperm(b * per_seq, device="cuda", generator=gen)
        table = order.view(b, per_seq).int()
        pools = []
        for x in (k, v):  # (b, hkv, pages, page, d) -> pool (pages, hkv, page, d) at the table's page numbers
            pages = x.view(b, hkv, per_seq, page, D).permute(0, 2, 1, 3, 4).reshape(b * per_seq, hkv, page, D)
            pool = torch.empty(pages.shape, device="cuda", dtype=DTYPE)  # (contiguous: empty_like keeps strides)
            pool[order] = pages
            pools.append(pool)
        out[f"paged{page}"] = (*pools, seqlens, table)
    return out


def main() -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"device {torch.cuda.get_device_name()}, L2 {l2 >> 20} MB; d {D} fp16, one token, graph replays")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for b, h, hkv, nk in CASES:
        kv_bytes = 2 * b * hkv * nk * D * 2
        rot = max(1, -(-4 * l2 // kv_bytes))
        q = torch.randn(b, h, 1, D, device="cuda", dtype=DTYPE, generator=gen)
        caches = [layouts(b, hkv, nk, gen) for _ in range(rot)]
        want = iot.attention_with_kvcache(q, *caches[0]["contiguous"][:2])
        row = {}
        with torch.inference_mode():
            for name in caches[0]:
                def step(name=name):
                    for c in caches:
                        k, v, seqlens, table = c[name]
                        iot.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table)
                k, v, seqlens, table = caches[0][name]
                got = iot.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table)
                assert (got.float() - want.float()).abs().max().item() < 1e-2, name
                row[name] = graph_us(step, rot)
        base = row["contiguous+lengths"]
        text = "  ".join(f"{n} {t:.1f} ({t / base:.3f})" for n, t in row.items())
        print(f"B{b} H{h}/{hkv} N_k {nk} (caches {rot}, {kv_bytes / 1e6:.0f} MB): {text}", flush=True)
        del caches


if __name__ == "__main__":
    main()
