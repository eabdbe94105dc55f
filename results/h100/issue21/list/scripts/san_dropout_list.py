"""The causal forward with dropout on the list's persistent grid under compute-sanitizer: d 64 and 128, both
alignments, N_q != N_k and ragged, grouped-query, the counting build (counters == the model) and the plain one."""
from iokernels.kernels import launch
from iokernels.model.hbm import exact
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout

n = 0
for n_q, n_k, d, causal in ((300, 517, 64, "bottom_right"), (517, 300, 128, "top_left"), (129, 129, 64, "top_left"),
                            (700, 700, 128, "bottom_right")):
    plan = make_plan("flash", "fast", N_q=n_q, N_k=n_k, d=d, dtype="float16", sram=227 * 1024, batch=2, heads=4,
                     kv_heads=2, causal=causal, dropout=Dropout(0.1, 3, 0))
    assert dict(plan.stage("main").params).get("ITEM_LIST") == 1
    inputs, _ = launch.make_device_inputs(plan, seed=1)
    r = launch.run_plan(plan, inputs, counting=True)
    assert r.counts == exact(plan), (n_q, n_k, d, causal)
    launch.run_plan(plan, inputs, counting=False)
    n += 2
print(f"ran {n} launches; counters == model on every counting one")
