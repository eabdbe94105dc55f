"""Host-overhead probe: microbenchmarks of the pieces a call pays, and a profile of the current path."""
import cProfile, pstats, io, statistics, time, sys
import torch, cupy as cp
import torch.nn.functional as F

def host_us(fn, calls=300, warmup=30, chunk=50):
    for _ in range(warmup): fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(calls):
        if i % chunk == 0: torch.cuda.synchronize()
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6

def p(name, us): print(f"{name:60s} {us:8.2f} us", flush=True)

dev = torch.device("cuda")
q, k, v = (torch.randn(1, 2, 128, 64, device=dev, dtype=torch.float16) for _ in range(3))
p("sdpa fwd tiny", host_us(lambda: F.scaled_dot_product_attention(q, k, v)))
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
def sdpa_fb():
    o = F.scaled_dot_product_attention(qg, kg, vg); torch.autograd.grad(o, (qg, kg, vg), o)
p("sdpa fwd+bwd tiny", host_us(sdpa_fb))
p("python noop", host_us(lambda: None))
p("torch.empty (32,16,512,64) f16", host_us(lambda: torch.empty((32, 16, 512, 64), dtype=torch.float16, device=dev)))
p("torch.empty_like(q)", host_us(lambda: torch.empty_like(q)))
p("torch.cuda.current_stream().cuda_stream", host_us(lambda: torch.cuda.current_stream(dev).cuda_stream))
p("torch._C._cuda_getCurrentRawStream(0)", host_us(lambda: torch._C._cuda_getCurrentRawStream(0)))
p("q.data_ptr()", host_us(lambda: q.data_ptr()))
p("q.is_contiguous()", host_us(lambda: q.is_contiguous()))
p("(q.shape, q.stride(), q.dtype, q.device)", host_us(lambda: (q.shape, q.stride(), q.dtype, q.device)))
p("torch.compiler.is_compiling()", host_us(lambda: torch.compiler.is_compiling()))
p("torch.is_grad_enabled() and q.requires_grad", host_us(lambda: torch.is_grad_enabled() and q.requires_grad))

@torch.library.custom_op("probe::op", mutates_args=())
def op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, s: str, f: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(a), torch.empty(a.shape[:-1], dtype=torch.float32, device=a.device)
@op.register_fake
def _(a, b, c, s, f):
    return torch.empty_like(a), a.new_empty(a.shape[:-1], dtype=torch.float32)
def bwd(ctx, g, g2): return g, g, g, None, None
def setup(ctx, inputs, output): ctx.save_for_backward(*inputs[:3])
op.register_autograd(bwd, setup_context=setup)
p("custom_op (fake+autograd) no grad", host_us(lambda: torch.ops.probe.op(q, k, v, "x", 1.0)))
p("custom_op (fake+autograd) with grad inputs", host_us(lambda: torch.ops.probe.op(qg, kg, vg, "x", 1.0)))

lib = torch.library.Library("probe2", "DEF")
lib.define("op(Tensor a, Tensor b, Tensor c, str s, float f) -> (Tensor, Tensor)")
def impl(a, b, c, s, f): return torch.empty_like(a), torch.empty(a.shape[:-1], dtype=torch.float32, device=a.device)
lib.impl("op", impl, "CUDA")
p("torch.library.Library impl CUDA (no autograd)", host_us(lambda: torch.ops.probe2.op(q, k, v, "x", 1.0)))
class AF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c): return impl(a, b, c, "x", 1.0)[0]
    @staticmethod
    def backward(ctx, g): return g, g, g
p("autograd.Function apply (grad inputs)", host_us(lambda: AF.apply(qg, kg, vg)))

src = r'''extern "C" __global__ void k(const void* a, const void* b, const void* c, void* o, void* l, int n, int m, int d, float s, unsigned long long z) {}'''
rk = cp.RawKernel(src, "k")
args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.data_ptr(), q.data_ptr(), cp.int32(1), cp.int32(1), cp.int32(1), cp.float32(1), cp.uint64(0))
p("cupy RawKernel call (current stream)", host_us(lambda: rk((1, 1, 1), (128,), args, shared_mem=0)))
fn = rk.kernel
class S:
    __slots__ = ("ptr",)
    def __init__(self, ptr): self.ptr = ptr
s = S(torch.cuda.current_stream().cuda_stream)
p("cupy Function call stream=obj", host_us(lambda: fn((1, 1, 1), (128, 1, 1), args, 0, s)))
es = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
p("cupy Function call stream=ExternalStream", host_us(lambda: fn((1, 1, 1), (128, 1, 1), args, 0, es)))
p("cp.cuda.ExternalStream(ptr)", host_us(lambda: cp.cuda.ExternalStream(s.ptr)))
p("cp.cuda.Device(0) enter/exit", host_us(lambda: cp.cuda.Device(0).__enter__() and None))
p("cp.cuda.runtime.getDevice()", host_us(lambda: cp.cuda.runtime.getDevice()))
p("cp.empty((32,16,512,64), f16)", host_us(lambda: cp.empty((32, 16, 512, 64), cp.float16)))
a = cp.empty((32, 16, 512, 64), cp.float16)
p("cupy (a.shape, a.strides, a.dtype, a.data.ptr)", host_us(lambda: (a.shape, a.strides, a.dtype, a.data.ptr)))
p("cupy a.reshape((512,512,64))", host_us(lambda: a.reshape((512, 512, 64))))
p("cupy a.flags.c_contiguous", host_us(lambda: a.flags.c_contiguous))
p("cp.cuda.runtime.memGetInfo()", host_us(lambda: cp.cuda.runtime.memGetInfo()))
try:
    from cuda.bindings import driver as cud
    p("cuda.bindings available", 0)
except Exception as e:
    print("no cuda.bindings", e)

import iokernels, iokernels.torch as it
for shape in [(1, 2, 128, 64), (32, 16, 512, 64)]:
    q, k, v = (torch.randn(*shape, device=dev, dtype=torch.float16) for _ in range(3))
    p(f"iokernels.torch.attention fwd {shape}", host_us(lambda: it.attention(q, k, v)))
    qc, kc, vc = (cp.asarray(t) for t in (q, k, v))
    p(f"iokernels.attention cupy fwd {shape}", host_us(lambda: iokernels.attention(qc, kc, vc)))
    p(f"sdpa fwd {shape}", host_us(lambda: F.scaled_dot_product_attention(q, k, v)))
q, k, v = (torch.randn(1, 2, 128, 64, device=dev, dtype=torch.float16, requires_grad=True) for _ in range(3))
def ours_fb():
    o = it.attention(q, k, v); torch.autograd.grad(o, (q, k, v), o)
p("iokernels.torch fwd+bwd tiny", host_us(ours_fb))
for name, fn_ in [("torch fwd", lambda: it.attention(q.detach(), k.detach(), v.detach())), ("torch fwd+bwd", ours_fb),
                  ("cupy fwd", lambda: iokernels.attention(qc, kc, vc))]:
    pr = cProfile.Profile(); pr.enable()
    for i in range(500):
        fn_()
        if i % 50 == 0: torch.cuda.synchronize()
    pr.disable(); torch.cuda.synchronize()
    st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(35); print(f"=== profile {name}\n", st.getvalue()[:9000])
