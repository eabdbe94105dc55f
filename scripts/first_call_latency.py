"""First-call latency of the library: compile time, cold and warm from cupy's on-disk cache.

    python scripts/first_call_latency.py [--json]

Runs the same child process twice against one fresh, empty cupy cache directory (CUPY_CACHE_DIR):
the first run compiles every kernel (cold), the second loads them from the disk cache (warm). In
each, every call is timed twice: its first call (compile or load, then run) and its second (the
per-device memo: run only). A third run does ``iokernels warmup`` in another fresh cache first.
Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import cupy as cp
import iokernels
import_s = time.perf_counter() - t0
rng = cp.random.default_rng(0)
x32 = [rng.standard_normal((8, 1024, 64), dtype=cp.float32) for _ in range(4)]
x16 = [x.astype(cp.float16) for x in x32]
cp.cuda.get_current_stream().synchronize()
cases = {
    "flash fwd float16 d64 (fast)": lambda: iokernels.attention(*x16[:3], return_lse=True),
    "flash bwd float16 d64 (fast)": lambda: iokernels.attention_backward(*x16[:3], *fwd16, x16[3], fwd16_lse),
    "flash fwd float32 d64 (q_outer)": lambda: iokernels.attention(*x32[:3], return_lse=True),
    "flash bwd float32 d64 (kv_outer)": lambda: iokernels.attention_backward(*x32[:3], *fwd32, x32[3], fwd32_lse),
    "standard fwd float32 d64": lambda: iokernels.attention(*x32[:3], algorithm="standard"),
}
rows = []
for name, call in cases.items():
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = call()
        cp.cuda.get_current_stream().synchronize()
        times.append(time.perf_counter() - start)
    if name.startswith("flash fwd float16"):
        fwd16, fwd16_lse = (out[0],), out[1]
    if name.startswith("flash fwd float32"):
        fwd32, fwd32_lse = (out[0],), out[1]
    rows.append({"call": name, "first_s": times[0], "second_s": times[1]})
print(json.dumps({"import_s": import_s, "rows": rows}))
"""


def child(cache: str, warmup: bool = False) -> dict:
    env = {**os.environ, "CUPY_CACHE_DIR": cache}
    if warmup:
        subprocess.run([sys.executable, "-m", "iokernels.cli", "warmup", "--dtype", "float16,float32", "--d", "64",
                        "--algorithms", "flash,standard"], env=env, check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        from iokernels._cupy import require_cupy

        require_cupy()
    except RuntimeError as exc:
        print(f"first_call_latency: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as warmed:
        runs = {"cold": child(cache), "warm (disk cache)": child(cache), "after iokernels warmup": child(warmed, True)}
    if args.json:
        print(json.dumps(runs, indent=1))
        return 0
    print(f"{'run':<24} {'call':<34} {'first call s':>12} {'second call s':>13}")
    for run, doc in runs.items():
        print(f"{run:<24} {'import cupy, iokernels':<34} {doc['import_s']:>12.3f}")
        for r in doc["rows"]:
            print(f"{run:<24} {r['call']:<34} {r['first_s']:>12.3f} {r['second_s']:>13.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
