"""Document masking on the fast path (issue #22; iokernels.plan.varlen.make_documents_plan) on the CPU: the
variable-length plan of the documents on the dense (B·H, N, d) layout (VARLEN_HEAD_MAJOR), its shapes and maps, and
the simulator's outputs against the dense float64 reference with the document mask built here element by element,
its bytes the model's exact ones and the packed plan's (the layout moves no byte)."""

import numpy as np
import pytest

from iokernels import model
from iokernels.kernels import launch
from iokernels.plan.varlen import make_documents_plan, make_varlen_plan
from iokernels.simulate import make_inputs, reference, simulate


def document_mask(documents, causal):
    """(N, N) bool: key j visible to query i (same document; causal: j <= i)."""
    ids = np.repeat(np.arange(len(documents)), documents)
    mask = ids[:, None] == ids[None, :]
    if causal:
        mask &= np.tri(len(ids), dtype=bool)
    return mask


def test_plan_layout_and_defines():
    plan = make_documents_plan((100, 0, 200), d=64, dtype="float16", batch=2, heads=3, causal=True)
    main = plan.stage("main")
    params = dict(main.params)
    assert params["VARLEN"] == 1 and params["VARLEN_HEAD_MAJOR"] == 1
    assert main.grid[1:] == (3, 6)  # 3 documents, batch · heads
    assert launch.tensor_shape(plan, "Q") == (6, 300, 64)
    assert launch.tensor_shape(plan, "lse") == (6, 300)
    assert launch.tensor_shape(plan, "cu_seqlens_q") == (4,)
    q_map = launch.stage_arg_layout(plan, main, 0.1)[0][0]
    assert not q_map.packed and (q_map.bh, q_map.n, q_map.d) == (6, 300, 64)
    packed = make_varlen_plan(d=64, dtype="float16", heads=6, lengths_q=(100, 0, 200), causal=True)
    assert "VARLEN_HEAD_MAJOR" not in dict(packed.stage("main").params)
    assert model.exact(plan) == model.exact(packed)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("documents", [(37, 200, 1, 90), (128, 128)])
def test_forward_simulator_equals_dense_reference_with_the_document_mask(causal, documents):
    plan = make_documents_plan(documents, d=64, dtype="float16", batch=2, heads=2, kv_heads=1, causal=causal)
    inputs = make_inputs(plan, seed=3)
    sim = simulate(plan, inputs)
    assert sim.counts == model.exact(plan)
    k, v = (np.repeat(inputs[n], 2, axis=0) for n in ("K", "V"))  # K/V head z // 2 of the 4 query heads
    want = reference.forward(inputs["Q"], k, v, mask=document_mask(documents, causal))[0]
    assert sim.outputs["O"].shape == inputs["Q"].shape
    assert np.max(np.abs(sim.outputs["O"] - want)) < 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_backward_simulator_equals_dense_reference_with_the_document_mask(causal):
    documents = (70, 1, 150)
    plan = make_documents_plan(documents, d=128, dtype="bfloat16", heads=2, causal=causal, direction="bwd")
    inputs = make_inputs(plan, seed=4)
    sim = simulate(plan, inputs)
    assert sim.counts == model.exact(plan)
    want = reference.backward(inputs["Q"], inputs["K"], inputs["V"], inputs["dO"],
                              mask=document_mask(documents, causal))
    for name, x in zip(("dQ", "dK", "dV"), want, strict=True):
        assert np.max(np.abs(sim.outputs[name] - x)) < 1e-10 * max(1.0, np.max(np.abs(x)))


def test_bad_documents():
    with pytest.raises(ValueError, match="documents"):
        make_documents_plan((), d=64, dtype="float16")
    with pytest.raises(ValueError, match="documents"):
        make_documents_plan((5, -1), d=64, dtype="float16")
    with pytest.raises(ValueError, match="kv_heads"):
        make_documents_plan((5,), d=64, dtype="float16", heads=3, kv_heads=2)
    with pytest.raises(ValueError, match="batch"):
        make_documents_plan((5,), d=64, dtype="float16", batch=0)
