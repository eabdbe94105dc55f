"""Launch overhead saved by ``graph=True`` at small N: the library's multi-kernel paths timed per call
with plain launches and with CUDA-graph replays (same inputs, so the second call on replays).

    python scripts/graph_overhead.py [--N 128,256] [--heads 8] [--d 64] [--repeats 200] [--json]

Per call: "back to back" is the wall time of ``repeats`` calls then one synchronize, divided by
``repeats`` (what a loop of calls costs: host launch overhead when the kernels are short); "synced"
adds a synchronize after every call (latency). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# (label, function, algorithm, schedule, dtype): function "fwd" is iokernels.attention, "bwd" attention_backward
CASES = (
    ("standard fwd", "fwd", "standard", None, "float32"),
    ("two_pass store fwd", "fwd", "two_pass", "store", "float32"),
    ("two_pass recompute fwd", "fwd", "two_pass", "recompute", "float32"),
    ("flash kv_outer fwd", "fwd", "flash", "kv_outer", "float32"),
    ("flash q_outer fwd (1 kernel)", "fwd", "flash", "q_outer", "float32"),
    ("standard bwd", "bwd", "standard", None, "float32"),
    ("flash bwd (kv_outer)", "bwd", "flash", None, "float32"),
    ("flash bwd (fast)", "bwd", "flash", None, "float16"),
)


def measure(n: int, heads: int, d: int, repeats: int) -> list[dict]:
    import cupy as cp

    import iokernels

    rows = []
    for label, fn, algorithm, schedule, dtype in CASES:
        rng = cp.random.default_rng(0)
        q, k, v, do = (rng.standard_normal((heads, n, d), dtype=cp.float32).astype(dtype) for _ in range(4))
        o, lse = iokernels.attention(q, k, v, algorithm="flash" if fn == "bwd" else algorithm,
                                     return_lse=True)

        def call(graph: bool, fn=fn, algorithm=algorithm, schedule=schedule, q=q, k=k, v=v, do=do, o=o, lse=lse):
            if fn == "fwd":
                return iokernels.attention(q, k, v, algorithm=algorithm, schedule=schedule, graph=graph)
            return iokernels.attention_backward(q, k, v, o, do, lse, algorithm=algorithm, graph=graph)[0]

        row = {"case": label, "N": n, "heads": heads, "d": d, "dtype": dtype}
        results = {}
        for graph in (False, True):
            for _ in range(3):
                results[graph] = call(graph)
            cp.cuda.get_current_stream().synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                call(graph)
            cp.cuda.get_current_stream().synchronize()
            row[f"{'graph' if graph else 'plain'}_us"] = (time.perf_counter() - start) / repeats * 1e6
            start = time.perf_counter()
            for _ in range(repeats):
                call(graph)
                cp.cuda.get_current_stream().synchronize()
            row[f"{'graph' if graph else 'plain'}_synced_us"] = (time.perf_counter() - start) / repeats * 1e6
        a, b = (results[g].astype(cp.float32) for g in (False, True))
        row["max_abs_diff"] = float(cp.max(cp.abs(a - b)))
        row["saving_us"] = row["plain_us"] - row["graph_us"]
        row["speedup"] = row["plain_us"] / row["graph_us"]
        rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    headers = ["case", "N", "dtype", "plain us", "graph us", "saving us", "speedup", "plain synced", "graph synced",
               "max |diff|"]
    body = [[r["case"], str(r["N"]), r["dtype"], f"{r['plain_us']:.1f}", f"{r['graph_us']:.1f}",
             f"{r['saving_us']:.1f}", f"{r['speedup']:.2f}x", f"{r['plain_synced_us']:.1f}",
             f"{r['graph_synced_us']:.1f}", f"{r['max_abs_diff']:.1e}"] for r in rows]
    widths = [max(len(h), *(len(x[i]) for x in body)) for i, h in enumerate(headers)]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(x, widths, strict=True)))
                     for x in [headers, ["-" * w for w in widths], *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--N", default="128,256", help="sequence lengths, comma-separated")
    parser.add_argument("--heads", type=int, default=8, help="batch*heads")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        from iokernels._cupy import require_cupy

        require_cupy()
    except RuntimeError as exc:
        print(f"graph_overhead: {exc}", file=sys.stderr)
        return 1
    rows = [r for n in (int(x) for x in args.N.split(",")) for r in measure(n, args.heads, args.d, args.repeats)]
    print(json.dumps(rows, indent=1) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
