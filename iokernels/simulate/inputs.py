"""Inputs and references of simulated (and GPU) runs: random inputs for a plan, the masks and dropout the float64
reference takes for it, what its outputs must equal, and the error measure the tests use."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..plan import Plan
from ..plan.units import round_to
from . import reference
from .simulator import kv_rows, reference_dropout


def make_inputs(plan: Plan, seed: int = 0, scale: float | None = None, *, magnitude: float = 1.0,
                rounded: bool = False) -> dict[str, np.ndarray]:
    """Random float64 inputs of shape (batch*heads, N, d); for a backward plan also O, lse, P and dO
    (O, lse and P from the reference on the same Q, K, V).

    ``magnitude`` multiplies Q and K (logits scale with its square). ``rounded``: every value stored
    in the plan's dtype is rounded to it, so that a GPU run gets exactly these values (lse stays
    float32-exact float64, as the kernels read it).
    """
    rng = np.random.default_rng(seed)
    bh = plan.bh

    def stored(x: np.ndarray) -> np.ndarray:
        return round_to(x, plan.dtype) if rounded else x

    q = stored(magnitude * rng.standard_normal((bh, plan.N_q, plan.d)))
    k = stored(magnitude * rng.standard_normal((plan.bh_kv, plan.N_k, plan.d)))  # grouped-query: fewer heads
    v = stored(rng.standard_normal((plan.bh_kv, plan.N_k, plan.d)))
    inputs = {"Q": q, "K": k, "V": v}
    if plan.mask is not None:  # an explicit mask (iokernels.plan.masks.ExplicitMask): data, like Q, K, V
        inputs["mask"] = random_mask(plan, rng)
    if plan.direction == "bwd":
        scale = reference.default_scale(plan.d) if scale is None else scale
        kv = kv_rows(plan)
        mask = reference_mask(plan, inputs)
        # dropout: O is the forward's dropped output (D = rowsum(dO ∘ O)); lse and P stay undropped
        o, lse = reference.forward(q, k[kv], v[kv], scale, causal=plan.causal, mask=mask,
                                   dropout=reference_dropout(plan))
        inputs.update(O=stored(o), lse=lse, dO=stored(rng.standard_normal(o.shape)),
                      P=stored(reference.probabilities(q, k[kv], scale, causal=plan.causal, mask=mask)
                               if plan.causal or mask is not None
                               else np.exp(scale * (q @ np.swapaxes(k[kv], -1, -2)) - lse[..., None])))
    return inputs


def random_mask(plan: Plan, rng: np.random.Generator, *, empty_rows: bool = True) -> np.ndarray:
    """A random explicit mask for ``plan.mask``: (1 or BH, N_q, N_k) of its dtype. Boolean: about 70%
    visible; additive: N(0, 1) values with about 30% −inf. ``empty_rows``: every 7th query row sees no key."""
    spec = plan.mask
    shape = spec.shape(plan.bh, plan.N_q, plan.N_k)
    visible = rng.random(shape) < 0.7
    if empty_rows:
        visible[:, 3::7, :] = False
    if spec.kind == "bool":
        return visible.astype(spec.dtype)
    return np.where(visible, rng.standard_normal(shape), -np.inf).astype(spec.dtype)


def reference_mask(plan: Plan, inputs: dict[str, np.ndarray]) -> np.ndarray | None:
    """The mask :mod:`iokernels.simulate.reference` takes for ``plan``: its block mask's elements, its window and/or
    its explicit mask (boolean, or additive with −inf where the others hide); None without any (the causal mask
    goes to the reference by its own argument)."""
    block = plan.element_mask()
    if plan.positional:  # the window and the documents (the causal mask goes by its own argument)
        window = replace(plan, causal="").visible(np.arange(plan.N_q), np.arange(plan.N_k))
        block = window if block is None else block & window
    if plan.mask is None:
        return block
    m = inputs["mask"]
    if plan.mask.kind == "bool":
        m = m != 0
        return m if block is None else m & block
    m = m.astype(np.float64)
    return m if block is None else np.where(block, m, -np.inf)


def reference_outputs(plan: Plan, inputs: dict[str, np.ndarray], scale: float | None = None
                      ) -> dict[str, np.ndarray]:
    """What the simulated outputs must equal: the naive float64 reference on the same inputs."""
    if plan.direction == "fwd":
        kv = kv_rows(plan)
        return {"O": reference.forward(inputs["Q"], inputs["K"][kv], inputs["V"][kv], scale, causal=plan.causal,
                                       mask=reference_mask(plan, inputs), dropout=reference_dropout(plan))[0]}
    kv, group = kv_rows(plan), plan.heads // plan.kv_heads
    dq, dk, dv = reference.backward(inputs["Q"], inputs["K"][kv], inputs["V"][kv], inputs["dO"], scale,
                                    causal=plan.causal, mask=reference_mask(plan, inputs),
                                    dropout=reference_dropout(plan))
    # grouped-query attention: a K/V head's gradient sums those of the query heads that share it
    dk, dv = (x.reshape(plan.bh_kv, group, *x.shape[1:]).sum(axis=1) for x in (dk, dv))
    return {"dQ": dq, "dK": dk, "dV": dv}


def max_relative_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """max over outputs of max|got - want| / max(max|want|, 1e-3); NaN or inf anywhere gives inf.

    The floor keeps outputs that are exactly zero meaningful (one key: dQ = dK = 0).
    """
    worst = 0.0
    for name, w in want.items():
        g = got[name]
        if not np.all(np.isfinite(g)):
            return float("inf")
        worst = max(worst, float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-3)))
    return worst
