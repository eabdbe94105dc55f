"""One backward of ours (iokernels.torch.attention, the tma backward's three kernels) and one of SDPA's CUDNN backend,
d 128, N 4096, fp16, B 4, H 16, for Nsight Compute: run as
`ncu --kernel-name regex:"flash_tma_bwd|bprop" --section SpeedOfLight --section ComputeWorkloadAnalysis --section
WarpStateStats --section SchedulerStats --section Occupancy python3 results/h100/issue21/bc176/scripts/ncu_bwd.py`
(each main kernel profiled once, after a warm-up call)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from iokernels.torch import attention

B, H, N, D = 4, 16, 4096, 128
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
for name in ("ours", "cudnn"):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if name == "cudnn" else torch.enable_grad():
        out = attention(q, k, v) if name == "ours" else F.scaled_dot_product_attention(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
