"""The cubins (sm_90a, NVRTC on the CPU, plain and counting builds) of seven flash_tma.cu plans (block-sparse on the
list, causal list, dense, block-sparse with dropout, an explicit mask by MOD_TMA, persistent): their hashes, to show an
edit that should not change code does not (run before and after, compare)."""
import hashlib

import numpy as np

from iokernels.kernels.nvrtc import compile_to_cubin
from iokernels.kernels.sources import build_source
from iokernels.kernels.stages import kernel_ref
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout
from iokernels.plan.masks import pattern
from iokernels.plan.mods import check_mods

KB = 227 * 1024
plans = []
bm = pattern("random", 0.3, n_q=1000, n_k=1000)
plans.append(make_plan("flash", "fast", N_q=1000, d=64, dtype="float16", sram=KB, heads=4, block_mask=bm))
plans.append(make_plan("flash", "fast", N_q=1000, d=128, dtype="bfloat16", sram=KB, heads=4, block_mask=bm, causal=True))
plans.append(make_plan("flash", "fast", N_q=1000, d=128, dtype="float16", sram=KB, heads=4, causal=True))
plans.append(make_plan("flash", "fast", N_q=1000, d=64, dtype="float16", sram=KB, heads=4))
plans.append(make_plan("flash", "fast", N_q=1000, d=128, dtype="float16", sram=KB, heads=4, block_mask=bm, dropout=Dropout(0.1, 1, 0)))
mods = check_mods(None, "score + mask[h * 1000000 + q_idx * 1000 + kv_idx]", captures={"mask": np.zeros(1, np.float16)})
plans.append(make_plan("flash", "fast", N_q=1000, d=64, dtype="float16", sram=KB, heads=4, mods=mods))
plans.append(make_plan("flash", "fast", N_q=1, N_k=4096, d=128, dtype="float16", sram=KB, heads=8, kv_heads=1))
for p in plans:
    st = p.stage("main")
    ref = kernel_ref(p, st)
    for counting in (False, True):
        r = compile_to_cubin(build_source(ref.source, ref.define_dict, counting), arch="sm_90a", name=ref.source, name_expressions=[ref.name_expression])
        print(ref.source, sorted(ref.define_dict.items())[:6], counting, hashlib.sha1(r.cubin).hexdigest()[:16])
