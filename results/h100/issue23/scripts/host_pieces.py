"""Issue #23 probe: the host time of a decode call through iokernels.torch.attention, piece by piece (median
microseconds over 2000 calls of each piece alone, the stream synchronised every 50 calls outside the timed region):
the whole call, the fast path's run (allocations and launches), each launch as RawStage.launch does it (slots and the
ctypes call), the bare ctypes call, cupy's Cython launchKernel with the same parameters (the plain launch only), the
allocations, the signature key, and SDPA CUDNN's whole call beside them. One case: B 1, 64:8, N_k 4096, d 128, fp16."""
import ctypes
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.torch as iot
from iokernels.kernels import rawlaunch
from iokernels.library import dispatch, torch_ops


def us(fn, calls=2000, chunk=50):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if i % chunk == chunk - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


b, h, hkv, nk, d = 1, 64, 8, 4096, 128
q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16)
k = torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
out = iot.attention(q, k, v)
entry = next(e for e in dispatch.TORCH_CALLS.entries.values() if isinstance(e, torch_ops.TorchCall))
raw = entry.call.fast
stream = torch_ops.raw_stream(q.device)
given = (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0)
seen = {}
original = rawlaunch.RawStage.launch


def record(self, pointers, s, dropout=None, counters=0):  # the pointers each stage is launched with
    seen[id(self)] = list(pointers)
    original(self, pointers, s, dropout, counters)


rawlaunch.RawStage.launch = record
torch_ops.run_torch(entry, (q, k, v), given, None, False)
rawlaunch.RawStage.launch = original
rows = [("iokernels.torch.attention (the whole call)", us(lambda: iot.attention(q, k, v))),
        ("run_torch: allocations + launches", us(lambda: torch_ops.run_torch(entry, (q, k, v), given, None, False)))]
for i, st in enumerate(raw.stages):
    name = getattr(st.function, "name", "kernel")
    p = seen[id(st)]
    rows.append((f"stage {i} ({name}) RawStage.launch{' (PDL, cuLaunchKernelEx)' if st.config is not None else ''}",
                 us(lambda st=st, p=p: st.launch(p, stream, None))))
    rows.append((f"stage {i} bare ctypes launch", us(lambda st=st: st._launch(stream))))
    if st.config is None:
        from cupy.cuda import driver

        args = (*st.prefix, stream, ctypes.addressof(st.params), 0)
        rows.append((f"stage {i} cupy driver.launchKernel", us(lambda args=args: driver.launchKernel(*args))))
ws = raw.workspace_bytes
rows += [("torch.empty_like(q)", us(lambda: torch.empty_like(q))),
         (f"torch.empty({ws}, uint8) (the workspace)", us(lambda: torch.empty((ws,), dtype=torch.uint8,
                                                                              device=q.device))),
         ("the signature key (forward's)", us(lambda: ("fwd", q.shape, q.stride(), q.dtype, q.device, k.shape,
                                                       k.stride(), k.dtype, k.device, v.shape, v.stride(), v.dtype,
                                                       v.device, None, False, "", None, "flash", None, None, None,
                                                       None, None, None))),
         ("raw_stream", us(lambda: torch_ops.raw_stream(q.device))),
         ("dispatch.device_id", us(dispatch.device_id)),
         ("torch.is_grad_enabled", us(torch.is_grad_enabled))]
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    rows.append(("SDPA CUDNN (the whole call)", us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))))
print(f"device {torch.cuda.get_device_name()}; B {b} H {h}/{hkv} N_k {nk} d {d} fp16; workspace {ws} bytes; "
      f"stages {len(raw.stages)}")
for name, t in rows:
    print(f"{t:8.2f} us  {name}")
