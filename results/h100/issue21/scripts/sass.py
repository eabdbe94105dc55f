"""SASS of the default tma forward and the tma and wgmma backward plans (plain builds, compiled by NVRTC on the CPU): the count of
each instruction class, and whether HGMMA and UTMALDG sit inside the main loop (between a backward branch's
target and the branch). Usage: PYTHONPATH=. python3 results/h100/issue21/scripts/sass.py /path/to/cuobjdump"""
import re
import subprocess
import sys
import tempfile

from iokernels.kernels import nvrtc
from iokernels.kernels.sources import build_source
from iokernels.kernels.stages import kernel_ref
from iokernels.plan.fast import make_fast_plan
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.variants import with_causal

OPS = ("HGMMA", "UTMALDG", "UTMAREDG", "SYNCS", "USETMAXREG", "BAR", "LDGSTS", "RED", "STG", "MUFU.EX2")
plans = [with_causal(make_fast_plan(N_q=4096, d=d, dtype="float16", heads=16, kernel="tma", causal=c), c)
         for d in (64, 128, 256) for c in ("", "bottom_right")]
plans += [make_fast_backward_plan(N_q=4096, d=d, dtype="float16", heads=16, kernel=k) for d in (64, 96, 128)
          for k in ("wgmma", "tma")]
plans += [make_fast_backward_plan(N_q=4096, d=d, dtype="float16", heads=16, kernel="tma") for d in (192, 256)]  # wide
if len(sys.argv) > 2:  # a subset: e.g. "wide" (the tma backward past d 128 only)
    plans = [p for p in plans if p.direction == "bwd" and p.d > 128]
for plan in plans:
    ref = kernel_ref(plan, plan.stage("main"))
    res = nvrtc.compile_to_cubin(build_source(ref.source, ref.define_dict, False), arch="sm_90a", name=ref.source,
                                 name_expressions=[ref.name_expression])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(res.cubin)
        f.flush()
        sass = subprocess.run([sys.argv[1], "-sass", f.name], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.search(r"/\*([0-9a-f]{4,})\*/", ln).group(1), 16) for ln in lines]
    # loops: a branch to an earlier address; the instructions in [target, branch]
    loops = []
    for ln, a in zip(lines, addr):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", ln)
        if m and m.group(1) and int(m.group(1), 16) < a:
            loops.append((int(m.group(1), 16), a))
    def in_loop(op):
        return any(lo <= a <= hi for a, ln in zip(addr, lines) if op in ln for lo, hi in loops)
    counts = {op: sum(op in ln for ln in lines) for op in OPS}
    tiles = dict(plan.tiles)
    print(f"{ref.source} d {plan.d} {tiles['Br']}x{tiles['Bc']}{' causal' if plan.causal else ''}: {counts}; "
          f"in a loop: HGMMA {in_loop('HGMMA')}, UTMALDG {in_loop('UTMALDG')}, backward branches {len(loops)}",
          flush=True)
