"""Forward TFLOP/s of the tensor-core kernel (iokernels.fast) beside torch SDPA in the same process.

Issue #5 progress probe, not the `iokernels bench` of the issue: B*H*N = 262144 tokens (16 heads),
FlashAttention-2's FLOP convention (4 N^2 d per head), CUDA-graph replays for ours (iokernels.gpu.
graph_seconds) and CUDA events around 20 calls after 5 warm-ups for torch. Prints one JSON line per row.
"""

import json
import statistics
import sys

from iokernels import gpu
from iokernels.fast import FAST_BC, FAST_BR, FAST_TUNING, make_fast_plan


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


def tuning():
    """float16 forward TFLOP/s of each tile variant (the default first) beside SDPA FLASH_ATTENTION."""
    import torch
    for d in (64, 128):
        for n in (4096, 16384):
            heads, batch = 16, 262144 // (n * 16)
            flops = 4 * n * n * d * batch * heads
            q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            peer = flops / torch_seconds("FLASH_ATTENTION", q, k, v) / 1e12
            del q, k, v
            for dd, br, bc in ((d, FAST_BR, FAST_BC), *FAST_TUNING):
                if dd != d:
                    continue
                plan = make_fast_plan(N_q=n, d=d, dtype="float16", batch=batch, heads=heads, block_r=br, block_c=bc)
                inputs, _ = gpu.make_device_inputs(plan, seed=0) if n <= 4096 else (_random(plan), None)
                ours = flops / gpu.time_plan(plan, inputs, repeats=20)[0] / 1e12
                print(json.dumps({"d": d, "N": n, "Br": br, "Bc": bc, "iokernels_tc_tflops": ours,
                                  "sdpa_flash_attention_tflops": peer, "ratio": ours / peer}), flush=True)


def _random(plan):
    import cupy as cp
    rs = cp.random.default_rng(0)
    return {x: rs.standard_normal((plan.bh, plan.N_q, plan.d), dtype=cp.float32).astype(cp.float16)
            for x in ("Q", "K", "V")}


def main():
    if "--tuning" in sys.argv:
        return tuning()
    for dtype in ("float16", "bfloat16"):
        for d in (64, 128):
            for n in (1024, 4096, 16384):
                heads = 16
                batch = 262144 // (n * heads)
                plan = make_fast_plan(N_q=n, d=d, dtype=dtype, batch=batch, heads=heads)
                inputs, _ = gpu.make_device_inputs(plan, seed=0) if n <= 4096 else (None, None)
                if inputs is None:
                    import cupy as cp
                    shape = (plan.bh, n, d)
                    rs = cp.random.default_rng(0)
                    inputs = {x: (rs.standard_normal(shape, dtype=cp.float32)).astype(cp.float16)
                              for x in ("Q", "K", "V")}
                    if dtype == "bfloat16":
                        inputs = {x: (y.astype(cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
                                  for x, y in inputs.items()}
                flops = 4 * n * n * d * plan.bh
                ours, _ = gpu.time_plan(plan, inputs, repeats=20)
                row = {"dtype": dtype, "d": d, "N": n, "batch": batch, "heads": heads,
                       "iokernels_tc_tflops": flops / ours / 1e12}
                try:
                    import torch
                    tdt = getattr(torch, dtype)
                    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=tdt) for _ in range(3))
                    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                        try:
                            row[f"sdpa_{name.lower()}_tflops"] = flops / torch_seconds(name, q, k, v) / 1e12
                        except Exception as exc:  # unsupported backend/config
                            row[f"sdpa_{name.lower()}_tflops"] = f"error: {type(exc).__name__}"
                    del q, k, v
                except ImportError:
                    pass
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
