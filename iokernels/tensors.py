"""Names of the tensors whose HBM traffic is counted, shared by kernels, simulator and model.

The order fixes the counter index of each tensor in the kernels' counter arrays
(``counters[2 * index]`` = bytes read, ``counters[2 * index + 1]`` = bytes written); the CUDA
sources get these indices as ``IOK_T_<name>`` defines, never written down a second time.
"""

from __future__ import annotations

TENSORS: tuple[str, ...] = (
    "Q", "K", "V", "O", "S", "P", "m", "l", "lse",
    "dO", "D", "dP", "dS", "dQ", "dK", "dV", "dQacc", "Oacc",
)
TENSOR_INDEX: dict[str, int] = {name: i for i, name in enumerate(TENSORS)}
NUM_TENSORS = len(TENSORS)
