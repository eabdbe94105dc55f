"""Where the d 128 backward's time goes beside cuDNN's: one backward of ours (iokernels.torch.attention, autograd) and
one of SDPA's CUDNN backend per case, each after a warm-up call, for Nsight Compute's memory counters. Run as
`ncu --kernel-name regex:"flash_tma_bwd|bprop" --launch-skip 0 --metrics <list> --csv python3 ncu_l2.py` (run_n1.sh):
every main kernel is profiled, the warm-up's too (the second of each name is the one to read). NCU_CASES: other
cases."""
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from iokernels.torch import attention

CASES = [(1, 4, 65536, True), (1, 16, 16384, True), (1, 16, 16384, False)]  # B, H, N, causal; d 128, fp16
if os.environ.get("NCU_CASES"):  # "B,H,N,causal;...": these instead (run_n2.sh)
    CASES = [(*(int(x) for x in c.split(",")[:3]), c.split(",")[3] == "1") for c in os.environ["NCU_CASES"].split(";")]
for B, H, N, causal in CASES:
    q, k, v = (torch.randn(B, H, N, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, N, 128, device="cuda", dtype=torch.float16)
    for name in ("ours", "cudnn"):
        for _ in range(2):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "cudnn" else torch.enable_grad():
                out = (attention(q, k, v, causal=causal) if name == "ours"
                       else F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                torch.autograd.grad(out, (q, k, v), dout)
                torch.cuda.synchronize()
        print(f"done B {B} H {H} N {N} causal {causal} {name}", flush=True)
