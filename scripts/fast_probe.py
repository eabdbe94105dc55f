"""Forward TFLOP/s of the tensor-core kernels (iokernels.fast) beside torch SDPA in the same process.

Issue #5 progress probe, not the `iokernels bench` of the issue: B*H*N = 262144 tokens (16 heads),
FlashAttention-2's FLOP convention (4 N^2 d per head), CUDA-graph replays for ours (iokernels.gpu.
graph_seconds, median of 20) and CUDA events around each of 20 calls after 5 warm-ups for torch.
Every kernel and tile variant of iokernels.fast that runs on this GPU (the default tiles first);
prints one JSON line per (dtype, d, N). `--quick`: float16 only, N 4096 and 16384.
"""

import json
import statistics
import sys

from iokernels import gpu
from iokernels.fast import FAST_TUNING, WGMMA_TUNING, default_kernel, make_fast_plan


def torch_seconds(backend_name, q, k, v):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    with sdpa_kernel(backend):
        for _ in range(5):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def variants(d):
    out = [("wgmma", None, None)] if default_kernel() == "wgmma" else []
    if out:
        out += [("wgmma", br, bc) for dd, br, bc in WGMMA_TUNING if dd == d]
    out += [("mma", None, None)] + [("mma", br, bc) for dd, br, bc in FAST_TUNING if dd == d]
    return out


def _random(plan, dtype):
    import cupy as cp
    rs = cp.random.default_rng(0)
    shape = (plan.bh, plan.N_q, plan.d)
    x = {n: rs.standard_normal(shape, dtype=cp.float32).astype(cp.float16) for n in ("Q", "K", "V")}
    if dtype == "bfloat16":  # round-to-zero bits of the same values; fine for timing
        x = {n: (y.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16) for n, y in x.items()}
    return x


def main():
    quick = "--quick" in sys.argv
    for dtype in ("float16",) if quick else ("float16", "bfloat16"):
        for d in (64, 128):
            for n in (4096, 16384) if quick else (1024, 4096, 16384):
                heads = 16
                batch = 262144 // (n * heads)
                flops = 4 * n * n * d * batch * heads
                row = {"dtype": dtype, "d": d, "N": n, "batch": batch, "heads": heads, "ours": {}}
                for kernel, br, bc in variants(d) if dtype == "float16" else variants(d)[:1]:
                    plan = make_fast_plan(N_q=n, d=d, dtype=dtype, batch=batch, heads=heads, block_r=br,
                                          block_c=bc, kernel=kernel)
                    label = f"{kernel} {plan.tile['Br']}x{plan.tile['Bc']}"
                    seconds = gpu.time_plan(plan, _random(plan, dtype), repeats=20)[0]
                    row["ours"][label] = round(flops / seconds / 1e12, 1)
                try:
                    import torch
                    tdt = getattr(torch, dtype)
                    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=tdt) for _ in range(3))
                    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                        try:
                            row[f"sdpa_{name.lower()}"] = round(flops / torch_seconds(name, q, k, v) / 1e12, 1)
                        except Exception as exc:  # unsupported backend/config
                            row[f"sdpa_{name.lower()}"] = f"error: {type(exc).__name__}"
                    del q, k, v
                except ImportError:
                    pass
                best = max(row["ours"].values())
                if isinstance(row.get("sdpa_flash_attention"), float):
                    row["best_over_flash"] = round(best / row["sdpa_flash_attention"], 3)
                if isinstance(row.get("sdpa_cudnn_attention"), float):
                    row["best_over_cudnn"] = round(best / row["sdpa_cudnn_attention"], 3)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
