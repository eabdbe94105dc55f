"""Issue #23 probe: the split-KV decode through iokernels.torch.attention beside torch SDPA (FLASH, CUDNN) with
grouped-query K/V, each captured in a CUDA graph that cycles through enough distinct K/V caches to exceed 4x the L2
(so no call reads a cache the last one left in L2), replays timed with CUDA events; the plan's split count and the
main / combine stages alone (graph replays on one cache). KV bandwidth = K and V bytes / time. Prints one line per
case. Usage: python3 scripts/decode_probe.py [B,H,H_kv,N_k[,N_q] ...]"""

import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.torch as iot
from iokernels.kernels import launch, timing
from iokernels.library.planning import choose_plan

D, DTYPE = 128, torch.float16
CASES = [(1, 64, 8, 16384), (1, 8, 8, 16384), (1, 64, 8, 131072), (8, 64, 8, 16384), (16, 16, 16, 65536),
         (64, 64, 8, 4096), (4, 64, 8, 32768), (1, 64, 8, 4096)]


def graph_us(fn, calls: int) -> float:
    """Median µs per call of ``calls`` calls captured in one graph (each call one cache of the rotation)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        fn()
    times = []
    for _ in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times[2:])


def main() -> None:
    cases = [tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]] or CASES
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    src = torch.empty(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    copy = graph_us(lambda: dst.copy_(src), 1)
    copy_bw = 2 * src.numel() * 4 / copy / 1e6
    print(f"device {torch.cuda.get_device_name()} L2 {l2 >> 20} MB, copy {copy_bw:.2f} TB/s (read + written)")
    for case in cases:
        b, h, hkv, nk, nq = (*case, 1) if len(case) == 4 else case
        kv_bytes = 2 * b * hkv * nk * D * 2
        rot = max(1, -(-4 * l2 // kv_bytes))
        if rot * kv_bytes > 40e9:
            print(f"B{b} H{h}/{hkv} N_k {nk}: skipped (memory)")
            continue
        q = torch.randn(b, h, nq, D, device="cuda", dtype=DTYPE)
        ks = [torch.randn(b, hkv, nk, D, device="cuda", dtype=DTYPE) for _ in range(rot)]
        vs = [torch.randn(b, hkv, nk, D, device="cuda", dtype=DTYPE) for _ in range(rot)]
        plan, _ = choose_plan("fwd", "flash", None, nq, nk, D, "float16", (b, h), None, h // hkv, "")
        row = {}
        impls = {"ours": lambda k, v, q=q: iot.attention(q, k, v)}
        for name, backend in (("FLASH", SDPBackend.FLASH_ATTENTION), ("CUDNN", SDPBackend.CUDNN_ATTENTION)):
            def call(k, v, backend=backend, q=q):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            impls[name] = call
        ref = None
        for name, fn in impls.items():
            try:
                out = fn(ks[0], vs[0])
                if ref is None:
                    ref = out.float()
                err = (out.float() - ref).abs().max().item()
                row[name] = (graph_us(lambda fn=fn, ks=ks, vs=vs: [fn(k, v) for k, v in zip(ks, vs, strict=True)],
                                      rot), err)
            except Exception as exc:  # a backend that refuses the case
                row[name] = (float("nan"), str(exc).splitlines()[0][:60])
        inputs = {"Q": launch.to_device(q.reshape(b * h, nq, D), "float16"), "K": ks[0].reshape(b * hkv, nk, D),
                  "V": vs[0].reshape(b * hkv, nk, D)}
        import cupy as cp
        inputs = {n: cp.asarray(x) if n != "Q" else x for n, x in inputs.items()}
        _, stages = timing.time_plan(plan, inputs)
        text = " ".join(f"{n} {t:.1f}us {kv_bytes / t / 1e6:.2f}TB/s({100 * kv_bytes / t / 1e6 / copy_bw:.0f}%)"
                        f"{'' if isinstance(e, float) and e < 1e-2 else ' ERR ' + str(e)}"
                        for n, (t, e) in row.items())
        stage_text = " ".join(f"{n} {t * 1e6:.1f}" for n, t in stages.items())
        print(f"B{b} H{h}/{hkv} N_q {nq} N_k {nk} {plan.label} Br={plan.tile.get('Br')} S={plan.tile.get('S', 1)} rot {rot}: {text} | "
              f"stages(us, one cache) {stage_text}", flush=True)


if __name__ == "__main__":
    main()
