"""Backward TFLOP/s of the tensor-core backward kernels (iokernels.fast_bwd) beside torch SDPA FLASH and
CUDNN in the same process: every kernel and tile variant that runs on this GPU (the default first).

Issue #5 progress probe, not the `iokernels bench` of the issue (same timing and FLOP convention:
iokernels.peerbench, FlashAttention-2 backward = 2.5 x 4 N^2 d per head; B*H*N = 262144, 16 heads;
CUDA-graph replays for ours, CUDA events for torch, median of 20 after 3 warm-ups). One JSON line per
(dtype, d, N). `--quick`: float16 only, N 4096 and 16384.
"""

import json
import sys

from iokernels import peerbench as pb
from iokernels.fast import default_kernel
from iokernels.fast_bwd import FAST_BWD_TUNING, FAST_BWD_WGMMA_TUNING, make_fast_backward_plan


def variants(d):
    out = []
    if default_kernel() == "wgmma":
        out += [{"kernel": "wgmma"}] + [{"kernel": "wgmma", "block_r": br, "block_c": bc}
                                         for dd, br, bc in FAST_BWD_WGMMA_TUNING if dd == d]
    out += [{"kernel": "mma"}] + [{"kernel": "mma", "block_r": br, "block_c": bc, "ds_stages": ds}
                                  for dd, br, bc, ds in FAST_BWD_TUNING if dd == d]
    return out


def main():
    quick = "--quick" in sys.argv
    timing = pb.Timing(warmup=3, repeats=20, max_call_seconds=0.5)
    for dtype in ("float16",) if quick else ("float16", "bfloat16"):
        for d in (64, 128):
            for problem in pb.main_problems([d], [4096, 16384] if quick else [1024, 4096, 16384], [dtype]):
                flops = problem.flops("bwd")
                row = {"dtype": dtype, "d": d, "N": problem.n, "batch": problem.batch, "heads": problem.heads,
                       "ours": {}}
                for v in variants(d):
                    plan = make_fast_backward_plan(N_q=problem.n, d=d, dtype=dtype, batch=problem.batch,
                                                   heads=problem.heads, **v)
                    label = f"{v['kernel']} {plan.tile['Br']}x{plan.tile['Bc']}" + (
                        f" ds{v['ds_stages']}" if "ds_stages" in v else "")
                    try:
                        seconds = pb.time_runner(pb.plan_runner(plan, problem), timing, cold=True)[0]
                        row["ours"][label] = round(flops / seconds / 1e12, 1)
                    except Exception as exc:
                        row["ours"][label] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
                    pb.free_device_memory()
                for name in ("FLASH", "CUDNN"):
                    impl = pb.TorchSdpa(f"torch_{name.lower()}")
                    why = impl.unavailable("bwd")
                    if why:
                        row[name] = why
                        continue
                    try:
                        seconds = pb.time_runner(impl.setup(problem, "bwd"), timing, cold=True)[0]
                        row[name] = round(flops / seconds / 1e12, 1)
                    except Exception as exc:
                        row[name] = f"error: {type(exc).__name__}"
                    pb.free_device_memory()
                best = max((x for x in row["ours"].values() if isinstance(x, float)), default=None)
                for name in ("FLASH", "CUDNN"):
                    if best and isinstance(row.get(name), float):
                        row[f"best_over_{name.lower()}"] = round(best / row[name], 3)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
