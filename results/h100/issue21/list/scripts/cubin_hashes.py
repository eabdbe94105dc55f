"""The list plans' cubins (sm_90a, NVRTC on the CPU, plain and counting builds): their hashes, to show that an edit of
flash_tma.cu / flash_tma_bwd.cu that should not change code does not (run before and after, compare)."""
import hashlib
from iokernels.kernels.nvrtc import compile_to_cubin
from iokernels.kernels.sources import build_source
from iokernels.kernels.stages import stage_defines
from iokernels.plan import make_plan
for d, dt, direction in ((64, "float16", "fwd"), (128, "bfloat16", "fwd"), (256, "float16", "fwd"), (128, "float16", "bwd"), (64, "bfloat16", "bwd")):
    p = make_plan("flash", "fast", N_q=4096, d=d, dtype=dt, sram=227*1024, batch=4, heads=16, causal=True, direction=direction)
    st = p.stage("main")
    src = "flash_tma.cu" if direction == "fwd" else "flash_tma_bwd.cu"
    T = "__half" if dt == "float16" else "__nv_bfloat16"
    fn = ("flash_tma_fwd" if direction == "fwd" else "flash_tma_bwd") + f"<{T}>"
    for counting in (False, True):
        r = compile_to_cubin(build_source(src, stage_defines(p, st), counting), arch="sm_90a", name_expressions=(fn,))
        print(direction, d, dt, counting, hashlib.sha256(r.cubin).hexdigest()[:16])
