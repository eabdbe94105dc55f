"""The cubins (sm_90a, NVRTC on the CPU, plain and counting builds) of six flash_tma_bwd.cu plans (the causal list, a
dense backward, d 64, dropout, a window as a block per item, the wide tiles): their hashes, to show that 4e24d3f's edit
of the kernel (a guard's condition and a comment, lines unchanged) changes no code (run at 4e24d3f^ and at 4e24d3f,
compare). The window plan is made as a block per item on both sides (the list's own build is new)."""
import hashlib
import sys

sys.path.insert(0, ".")
from iokernels.kernels.nvrtc import compile_to_cubin
from iokernels.kernels.sources import build_source
from iokernels.kernels.stages import kernel_ref
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from tests.gpu.helpers import per_item

KB = 227 * 1024
kw = dict(N_q=1000, dtype="float16", sram=KB, heads=4, direction="bwd")
plans = [make_plan("flash", "fast", d=128, causal=True, **kw), make_plan("flash", "fast", d=128, **kw),
         make_plan("flash", "fast", d=64, **kw), make_plan("flash", "fast", d=64, dropout=Dropout(0.1, 1, 0), **kw),
         per_item(make_plan("flash", "fast", d=128, window=(100, 0), **kw)), make_plan("flash", "fast", d=256, **kw)]
for p in plans:
    st = p.stage("main")
    ref = kernel_ref(p, st)
    for counting in (False, True):
        r = compile_to_cubin(build_source(ref.source, ref.define_dict, counting), arch="sm_90a", name=ref.source,
                             name_expressions=[ref.name_expression])
        print(ref.source, sorted(ref.define_dict.items()), counting, hashlib.sha1(r.cubin).hexdigest()[:16])
