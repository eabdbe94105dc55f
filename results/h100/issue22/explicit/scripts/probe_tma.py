"""A/B of the forward's MOD_TMA (an explicit mask's tiles loaded by the copy engine with K's) against MOD_STAGE (each
consumer warp copies its rows of the next tile by cp.async), B 4, H 16, N 4096, fp16, a mask per batch and head:
``iokernels.torch.attention(attn_mask=)`` planned as it is now (MOD_TMA), the same call planned with
``plan.mods.mask_layout`` patched to None (so the plan stages by cp.async; the two plans cached by their signatures:
the second through ``iokernels.torch.attention_mods`` with the same expression), and SDPA CUDNN with the mask. Each:
CUDA events around 10 back-to-back calls after 3 untimed, the median of 7 such loops, alternated; forward TFLOP/s at
4·N²·d per head; outputs compared (MOD_TMA against MOD_STAGE bitwise, both against cuDNN)."""
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import iokernels.plan.mods as mods
import iokernels.torch as iot

b, h, n = 4, 16, 4096


def loop(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 10


def planned() -> list[str]:
    """The staged plans the library holds (its dispatch caches): each one's label and how its mask is loaded."""
    from iokernels.library import dispatch

    seen = []
    for cache in (dispatch.TORCH_CALLS, dispatch.CACHE, dispatch.ROUTED_CALLS, dispatch.CUPY_CALLS):
        for entry in list(cache.entries.values()):
            for plan in getattr(getattr(entry, "call", entry), "chain", ()):
                main = dict(plan.stage("main").params) if any(s.name == "main" for s in plan.stages) else {}
                if "MOD_STAGE" in main:
                    seen.append(f"{plan.label} d{plan.d}: {'MOD_TMA' if 'MOD_TMA' in main else 'MOD_STAGE (cp.async)'}")
    return sorted(set(seen))


def case(d, kind):
    gen = torch.Generator(device="cuda").manual_seed(d)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    if kind == "additive":
        mask = torch.randn(b, h, n, n, device="cuda", dtype=torch.float16, generator=gen)
        flat = mask.reshape(-1)
    else:
        mask = torch.rand(b, h, n, n, device="cuda", generator=gen) < 0.9
        flat = mask.reshape(-1).view(torch.uint8)
    flops = 4 * d * b * h * n * n
    index = f"(b * {h} + h) * {n * n} + q_idx * {n} + kv_idx"
    written = {"score_mod": f"score + mask[{index}]"} if kind == "additive" else {"mask_mod": f"mask[{index}] != 0"}

    def tma():
        return iot.attention(q, k, v, attn_mask=mask)

    def stage():
        return iot.attention_mods(q, k, v, captures={"mask": flat}, **written)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    layout = mods.mask_layout
    mods.mask_layout = lambda *a: None  # the staged plan: planned (and cached) with no map
    try:
        out_stage = stage().float()
    finally:
        mods.mask_layout = layout
    fns = {"MOD_TMA": tma, "MOD_STAGE": stage, "cudnn": cudnn}
    outs = {"MOD_TMA": tma().float(), "MOD_STAGE": stage().float(), "cudnn": cudnn().float()}
    assert torch.equal(outs["MOD_STAGE"], out_stage)
    for fn in fns.values():
        for _ in range(3):
            fn()
    times = {name: [] for name in fns}
    for _ in range(7):
        for name, fn in fns.items():
            times[name].append(loop(fn))
    for name, t in times.items():
        ms = statistics.median(t)
        print(f"{kind} d{d} {name:9s} fwd {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  loops "
              f"{[round(x, 3) for x in t]}", flush=True)
    print(f"  plans: {planned()}", flush=True)
    print(f"  MOD_TMA == MOD_STAGE bitwise: {torch.equal(outs['MOD_TMA'], outs['MOD_STAGE'])}; max |MOD_TMA - cudnn| = "
          f"{(outs['MOD_TMA'] - outs['cudnn']).abs().max().item():.3e}", flush=True)


with torch.no_grad():
    for d, kind in ((64, "additive"), (128, "additive"), (64, "bool"), (128, "bool")):
        case(d, kind)
