import statistics, time, cProfile, pstats, io
import torch, cupy as cp
import torch.nn.functional as F
import iokernels, iokernels.torch as it

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
q = torch.randn(32, 16, 512, 64, device=dev, dtype=torch.float16)
p("torch.empty(shape, dtype=, device=)", host_us(lambda: torch.empty((32, 16, 512, 64), dtype=torch.float16, device=dev)))
p("q.new_empty(shape)", host_us(lambda: q.new_empty((32, 16, 512, 64))))
p("torch.empty_like(q)", host_us(lambda: torch.empty_like(q)))
for shape in [(1, 2, 128, 64), (32, 16, 512, 64)]:
    for dt in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(*shape, device=dev, dtype=dt) for _ in range(3))
        o = it.attention(q, k, v); ref = F.scaled_dot_product_attention(q, k, v)
        print("maxerr", shape, dt, float((o.float() - ref.float()).abs().max()))
        p(f"io.torch fwd {shape} {dt}", host_us(lambda: it.attention(q, k, v)))
        p(f"sdpa fwd {shape} {dt}", host_us(lambda: F.scaled_dot_product_attention(q, k, v)))
        p(f"io.torch causal fwd {shape} {dt}", host_us(lambda: it.attention(q, k, v, is_causal=True)))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        def ours_fb():
            o = it.attention(qg, kg, vg); torch.autograd.grad(o, (qg, kg, vg), o)
        def sdpa_fb():
            o = F.scaled_dot_product_attention(qg, kg, vg); torch.autograd.grad(o, (qg, kg, vg), o)
        p(f"io.torch fwd+bwd {shape} {dt}", host_us(ours_fb))
        p(f"sdpa fwd+bwd {shape} {dt}", host_us(sdpa_fb))
    qc, kc, vc = (cp.asarray(t.half()) for t in (q, k, v))
    p(f"io.cupy fwd {shape}", host_us(lambda: iokernels.attention(qc, kc, vc)))
    def cfb():
        o, lse = iokernels.attention(qc, kc, vc, return_lse=True); iokernels.attention_backward(qc, kc, vc, o, o, lse)
    p(f"io.cupy fwd+bwd {shape}", host_us(cfb))
class AF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a): return a.clone()
    @staticmethod
    def backward(ctx, g): return g
x = torch.randn(4, device=dev, requires_grad=True)
def trivial():
    y = AF.apply(x); torch.autograd.grad(y, (x,), y)
p("trivial autograd.Function fwd+grad (engine floor)", host_us(trivial))
mask = torch.rand(512, 512, device=dev) > 0.2
q, k, v = (torch.randn(32, 16, 512, 64, device=dev, dtype=torch.float16) for _ in range(3))
o = it.attention(q, k, v, attn_mask=mask); ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
print("mask maxerr", float((o.float() - ref.float()).abs().max()))
p("io.torch fwd masked (32,16,512,64)", host_us(lambda: it.attention(q, k, v, attn_mask=mask)))
q, k, v = (torch.randn(1, 2, 128, 64, device=dev, dtype=torch.float16) for _ in range(3))
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
qc, kc, vc = (cp.asarray(t) for t in (q, k, v))
def ofb():
    o = it.attention(qg, kg, vg); torch.autograd.grad(o, (qg, kg, vg), o)
for name, f in [("torch fwd", lambda: it.attention(q, k, v)), ("cupy fwd", lambda: iokernels.attention(qc, kc, vc)), ("torch fwd+bwd", ofb)]:
    pr = cProfile.Profile(); pr.enable()
    for i in range(500):
        f()
        if i % 50 == 0: torch.cuda.synchronize()
    pr.disable(); torch.cuda.synchronize()
    st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(22); print("=== ", name, st.getvalue()[:5000])
