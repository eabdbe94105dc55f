"""The cost of dropout (issue #6) in the tensor-core path flash/fast on this GPU: forward and backward
TFLOP/s with dropout p (default 0.1) against the same plans without it, beside torch SDPA's FLASH backend
with dropout_p = p and 0 in the same process (torch draws its own mask with its own RNG: only the timing
is comparable).

Same timing and FLOP convention as scripts/bwd_probe.py and `iokernels bench` (iokernels.peerbench:
FlashAttention-2's 4 N^2 d per head forward, 2.5x that backward; B*H*N = 262144 tokens, 16 heads;
CUDA-graph replays of the plain builds for ours, CUDA events for torch; median of 20 after 3 warm-ups).
The backward with dropout runs its own tiles (iokernels.fast_bwd.FAST_BWD_WGMMA_DROPOUT_TILES), so it is
also timed at those tiles without dropout ("bwd_dropout_tiles"), which separates the tiles' cost from the
mask's. One JSON line per (dtype, d, N, causal).

Options: `--full` (float16 and bfloat16, N 1024 to 16384, causal too; default: float16, N 4096 and 16384,
not causal), `--p P`.
"""

from __future__ import annotations

import json
import sys

from iokernels import peerbench as pb
from iokernels.dropout import Dropout
from iokernels.fast_bwd import make_fast_backward_plan
from iokernels.plan import make_plan, with_causal

KB = 1024


def _ours(problem: pb.Problem, direction: str, timing: pb.Timing, dropout: Dropout | None,
          dropout_tiles: bool = False) -> float | str:
    try:
        if dropout_tiles:  # the dropout plan's tiles, without dropout
            plan = with_causal(make_fast_backward_plan(N_q=problem.n, d=problem.d, dtype=problem.dtype,
                                                       batch=problem.batch, heads=problem.heads, kernel="wgmma",
                                                       dropout=True), problem.causal)
        else:
            plan = make_plan("flash", "fast", N_q=problem.n, d=problem.d, dtype=problem.dtype, sram=227 * KB,
                             batch=problem.batch, heads=problem.heads, direction=direction, causal=problem.causal,
                             dropout=dropout)
        seconds = pb.time_runner(pb.plan_runner(plan, problem), timing, cold=True)[0]
        return round(problem.flops(direction) / seconds / 1e12, 1)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        pb.free_device_memory()


def _torch(problem: pb.Problem, direction: str, timing: pb.Timing) -> float | str:
    impl = pb.TorchSdpa("torch_flash")
    why = impl.unavailable(direction)
    if why:
        return why
    try:
        seconds = pb.time_runner(impl.setup(problem, direction), timing, cold=True)[0]
        return round(problem.flops(direction) / seconds / 1e12, 1)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        pb.free_device_memory()


def main() -> None:
    full = "--full" in sys.argv
    p = float(sys.argv[sys.argv.index("--p") + 1]) if "--p" in sys.argv else 0.1
    timing = pb.Timing(warmup=3, repeats=20, max_call_seconds=0.5)
    dropout = Dropout(p, 0)
    for dtype in ("float16", "bfloat16") if full else ("float16",):
        for causal in (False, True) if full else (False,):
            for d in (64, 128):
                for problem in pb.main_problems([d], [1024, 4096, 16384] if full else [4096, 16384], [dtype],
                                                causal=causal):
                    dropped = pb.Problem(problem.batch, problem.heads, problem.n, d, dtype, causal, dropout=p)
                    row = {"dtype": dtype, "d": d, "N": problem.n, "batch": problem.batch, "heads": problem.heads,
                           "causal": causal, "p": p, "fwd": {}, "bwd": {}}
                    for direction in ("fwd", "bwd"):
                        out = row[direction]
                        out["ours"] = _ours(problem, direction, timing, None)
                        out["ours_dropout"] = _ours(problem, direction, timing, dropout)
                        if direction == "bwd":
                            out["ours_dropout_tiles"] = _ours(problem, direction, timing, None, dropout_tiles=True)
                        out["torch_flash"] = _torch(problem, direction, timing)
                        out["torch_flash_dropout"] = _torch(dropped, direction, timing)
                        for key, base in (("ours_cost", "ours"), ("torch_flash_cost", "torch_flash")):
                            a, b = out[base], out[f"{base}_dropout"]
                            if isinstance(a, float) and isinstance(b, float):
                                out[key] = round(b / a, 3)  # TFLOP/s with dropout over without
                        a, b = out["ours_dropout"], out["torch_flash_dropout"]
                        if isinstance(a, float) and isinstance(b, float):
                            out["ours_over_torch_dropout"] = round(a / b, 3)
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
