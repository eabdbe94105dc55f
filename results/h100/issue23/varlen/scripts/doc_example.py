"""docs/LIBRARY.md's variable-length example, run as written, and its outputs checked against the float64 reference."""
import cupy as cp
import numpy as np

import iokernels
from iokernels.simulate import reference

lengths = [17, 0, 500, 129]
cu = cp.asarray([0, *cp.cumsum(cp.asarray(lengths)).tolist()], dtype=cp.int32)
q, k, v = (cp.random.standard_normal((sum(lengths), 8, 128)).astype(cp.float16) for _ in range(3))
o, lse = iokernels.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, return_lse=True)
dq, dk, dv = iokernels.attention_varlen_backward(cp.ones_like(o), q, k, v, o, lse, cu, cu, max(lengths),
                                                 max(lengths), causal=True)
worst = 0.0
start = 0
for n in lengths:
    if n:
        x = [cp.asnumpy(t[start:start + n]).astype(np.float64).swapaxes(0, 1) for t in (q, k, v)]
        want = reference.forward(*x, causal=True)[0]
        got = cp.asnumpy(o[start:start + n]).astype(np.float64).swapaxes(0, 1)
        worst = max(worst, float(np.abs(got - want).max()))
    start += n
print("max |O - reference|", worst, "finite grads", all(bool(cp.isfinite(g).all()) for g in (dq, dk, dv)))
assert worst < 2e-2
