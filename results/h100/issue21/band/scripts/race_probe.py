"""Which launch of san_band.py's forward racecheck flags (run2.sh): the causal tma forward (RACE_D, RACE_DTYPE: d 128
bfloat16 by default), both alignments, without bands and with bands of 6 and 2 heads (RACE_BANDS), counting and plain
builds, each launch labelled and synchronized; compiled with -lineinfo (a fresh cubin cache, CUPY_CACHE_DIR set by the
caller) and the generated sources written to $SRC_OUT so that the report's lines can be read."""
import os
import sys
from dataclasses import replace

import cupy as cp

from iokernels.kernels import launch, nvrtc
from iokernels.kernels.sources import build_source
from iokernels.plan import make_plan

plain_compile = nvrtc.compile_to_cubin


def with_lineinfo(*args, extra_options=(), **kwargs):
    return plain_compile(*args, extra_options=(*extra_options, "-lineinfo"), **kwargs)


nvrtc.compile_to_cubin = with_lineinfo
out = os.environ.get("SRC_OUT", "/tmp")
for causal, (n_q, n_k) in (("bottom_right", (300, 517)), ("top_left", (517, 300))):
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=int(os.environ.get("RACE_D", 128)),
                     dtype=os.environ.get("RACE_DTYPE", "bfloat16"), sram=227 * 1024, batch=2, heads=3, causal=causal)
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    for band in [None if b == "none" else int(b) for b in os.environ.get("RACE_BANDS", "none,6,2").split(",")]:
        def params(s, band=band):
            kept = tuple(p for p in s.params if p[0] != "HEAD_BAND")
            return kept if band is None else (*kept, ("HEAD_BAND", band))
        p = replace(plan, stages=tuple(replace(s, params=params(s)) for s in plan.stages))
        for counting in (True, False):
            st = p.stage("main")
            if causal == "top_left":
                with open(f"{out}/src-band{band}-count{int(counting)}.cu", "w") as f:
                    f.write(build_source("flash_tma.cu", dict(st.params), counting))
            print(f"=== launch {causal} band {band} counting {counting} grid {st.grid}", flush=True)
            sys.stderr.flush()
            launch.run_plan(p, inputs, counting=counting)
            cp.cuda.runtime.deviceSynchronize()
print("done", flush=True)
