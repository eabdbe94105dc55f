"""The library's dispatch cache (iokernels/library/dispatch.py), without a GPU: a repeated call plans once, and
a call that differs in any shape, stride, dtype or option plans again (never a stale plan)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import iokernels
from iokernels.kernels import launch
from iokernels.library import api, dispatch, fastpath
from iokernels.plan import make_plan
from iokernels.plan.dropout import Dropout

from .fakes import NumpyCupy


@pytest.fixture
def planned(monkeypatch):
    """Calls run on the host up to the launch: each records its plans (``runs``) and gets zeros back;
    ``planned.count`` counts the calls of choose_plan (the planning the cache saves). The cache starts empty."""
    state = type("Planned", (), {"count": 0, "runs": []})()
    choose = api.choose_plan

    def counted(*args, **kwargs):
        state.count += 1
        return choose(*args, **kwargs)

    def execute(chain, inputs, scale, graph, outputs, raws=None):
        state.runs.append((tuple(chain), scale, raws))
        return {n: np.zeros(launch.tensor_shape(chain[-1], n), launch.tensor_dtype(chain[-1], n))
                for n in outputs if n in launch.plan_tensors(chain[-1])}

    monkeypatch.setattr(api, "choose_plan", counted)
    monkeypatch.setattr(api, "execute", execute)
    monkeypatch.setattr(api, "require_cupy", NumpyCupy)
    monkeypatch.setattr(fastpath, "require_cupy", NumpyCupy)
    monkeypatch.setattr(launch, "free_device_bytes", lambda: (80 * 1024**3, 80 * 1024**3))
    dispatch.clear_dispatch_cache()
    yield state
    dispatch.clear_dispatch_cache()


def _arrays(shape=(2, 4, 40, 64), kv_heads=4, n_k=33, dtype=np.float32):
    rng = np.random.default_rng(0)
    q = rng.standard_normal(shape).astype(dtype)
    k, v = (rng.standard_normal((*shape[:-3], kv_heads, n_k, shape[-1])).astype(dtype) for _ in range(2))
    return q, k, v


def test_an_identical_call_plans_once(planned):
    q, k, v = _arrays()
    iokernels.attention(q, k, v)
    iokernels.attention(q.copy(), k.copy(), v.copy())  # other arrays, the same signature
    assert planned.count == 1
    assert dispatch.CACHE.hits == 1 and dispatch.CACHE.misses == 1 and len(dispatch.CACHE.entries) == 1
    (first, _, slots1), (second, _, slots2) = planned.runs
    assert first == second and slots1 is slots2  # the same plans and the same prepared-launch slots


def test_an_identical_backward_plans_once(planned):
    q, k, v = _arrays()
    lse = np.zeros(q.shape[:-1], np.float32)
    for _ in range(3):
        iokernels.attention_backward(q, k, v, q, q, lse)
    assert planned.count == 1 and dispatch.CACHE.hits == 2


def _last_entry():
    return next(reversed(dispatch.CACHE.entries.values()))  # the most recently used


BOOL_MASK = np.ones((40, 33), bool)


@pytest.mark.parametrize("change, check", [
    ("shape", lambda e, base: e.chain[0].N_q == 48 and base.chain[0].N_q == 40),
    ("stride", lambda e, base: e.chain == base.chain),  # the same plans, under a key of their own
    ("dtype", lambda e, base: e.chain[0].dtype == "float16" and base.chain[0].dtype == "float32"),
    ("causal", lambda e, base: e.chain[0].causal == "bottom_right" and base.chain[0].causal == ""),
    ("scale", lambda e, base: e.scale == 0.5 and base.scale == 0.125),
    ("mask", lambda e, base: e.chain[0].mask.kind == "bool" and base.chain[0].mask is None),
    ("mask_kind", lambda e, base: e.chain[0].mask.kind == "additive" and base.chain[0].mask.kind == "bool"),
    ("dropout", lambda e, base: e.chain[0].dropout.p == 0.25 and base.chain[0].dropout is None),
    ("kv_heads", lambda e, base: (e.group, e.expand, base.group, base.expand) == (2, True, 1, False)),
    ("algorithm", lambda e, base: e.chain[0].algorithm == "standard" and base.chain[0].algorithm == "flash"),
])
def test_any_change_plans_again(planned, change, check):
    q, k, v = _arrays()
    base_kwargs = {"mask": BOOL_MASK} if change == "mask_kind" else {}
    iokernels.attention(q, k, v, **base_kwargs)
    base = _last_entry()
    kwargs = dict(base_kwargs)
    if change == "shape":
        q = _arrays(shape=(2, 4, 48, 64))[0]
    elif change == "stride":  # a transposed, non-contiguous q of the same shape and values
        q = np.ascontiguousarray(np.swapaxes(q, -1, -2)).swapaxes(-1, -2)
        assert not q.flags.c_contiguous
    elif change == "dtype":
        q, k, v = (x.astype(np.float16) for x in (q, k, v))
    elif change == "causal":
        kwargs["causal"] = True
    elif change == "scale":
        kwargs["scale"] = 0.5
    elif change == "mask":
        kwargs["mask"] = BOOL_MASK
    elif change == "mask_kind":
        kwargs["mask"] = np.zeros((40, 33), np.float32)
    elif change == "dropout":
        kwargs["dropout"] = 0.25
    elif change == "kv_heads":
        q, k, v = _arrays(kv_heads=2)
    elif change == "algorithm":
        kwargs["algorithm"] = "standard"
    iokernels.attention(q, k, v, **kwargs)
    assert planned.count == 2 and len(dispatch.CACHE.entries) == 2
    assert check(_last_entry(), base)
    iokernels.attention(*_arrays(), **base_kwargs)  # the first signature still gets its own plans
    assert planned.count == 2 and _last_entry() is base and planned.runs[-1][0] == base.chain


def test_a_changed_backward_flag_plans_again(planned):
    q, k, v = (x.astype(np.float16) for x in _arrays())
    lse = np.zeros(q.shape[:-1], np.float32)
    iokernels.attention_backward(q, k, v, q, q, lse)
    iokernels.attention_backward(q, k, v, q, q, lse, deterministic=True)
    assert planned.count == 2 and planned.runs[-1][0][-1].variant == "deterministic"
    assert planned.runs[0][0][-1].variant == ""
    iokernels.attention_backward(q, k, v, q, q, lse, dropout=Dropout(0.1, 7, 3))
    assert planned.count == 3 and planned.runs[-1][0][-1].dropout == Dropout(0.1, 7, 3)


def test_dropout_seed_and_offset_come_from_each_call(planned):
    q, k, v = _arrays()
    first, second = Dropout(0.25, 11, 0), Dropout(0.25, 12, 5)
    iokernels.attention(q, k, v, dropout=first)
    iokernels.attention(q, k, v, dropout=second)
    assert planned.count == 1
    got = planned.runs[-1][0][0]
    want = make_plan("flash", "q_outer", N_q=40, N_k=33, d=64, dtype="float32", sram=got.sram_bytes, batch=8,
                     heads=1, dropout=second)  # planned afresh with the second call's Dropout
    assert got.dropout == second and got == want
    iokernels.attention(q, k, v, dropout=0.25)  # drawn from the library's stream: a new offset each call
    iokernels.attention(q, k, v, dropout=0.25)
    a, b = (run[0][0].dropout for run in planned.runs[-2:])
    assert planned.count == 1 and a.seed == b.seed and b.offset == (a.offset + 1) % 2**32


def _half():
    return tuple(x.astype(np.float16) for x in _arrays())


def test_a_window_plans_apart_from_no_window(planned):
    """A window call and a plain one on the same arrays never share a plan; windows equal once normalized do."""
    q, k, v = _half()
    iokernels.attention(q, k, v)
    base = _last_entry()
    iokernels.attention(q, k, v, window=(8, 8))
    windowed = _last_entry()
    assert planned.count == 2 and windowed is not base
    assert base.chain[0].window is None and windowed.chain[0].window == (8, 8)
    assert planned.runs[-1][0] == windowed.chain
    iokernels.attention(q, k, v, window=[8, np.int64(8)])  # the same window, spelled otherwise
    iokernels.attention(q, k, v, window=(-1, -1))  # no window: the plain call's plans
    iokernels.attention(q, k, v, window=(None, None))
    assert planned.count == 2 and planned.runs[-3][0] == windowed.chain and planned.runs[-1][0] == base.chain
    iokernels.attention(q, k, v, window=(8, None))
    assert planned.count == 3 and planned.runs[-1][0][0].window == (8, None)
    iokernels.attention(q, k, v)
    assert planned.count == 3 and _last_entry() is base and planned.runs[-1][0] == base.chain


def test_a_windowed_backward_plans_apart(planned):
    q, k, v = _half()
    lse = np.zeros(q.shape[:-1], np.float32)
    iokernels.attention_backward(q, k, v, q, q, lse, window=(4, 0))
    iokernels.attention_backward(q, k, v, q, q, lse)
    iokernels.attention_backward(q, k, v, q, q, lse, window=(4, -1))
    assert planned.count == 3
    assert [run[0][-1].window for run in planned.runs] == [(4, 0), None, (4, None)]
    iokernels.attention_backward(q, k, v, q, q, lse, window=(4, 0))
    assert planned.count == 3 and planned.runs[-1][0] == planned.runs[0][0]


def test_the_memo_of_a_plain_call_is_not_a_window_calls(planned, monkeypatch):
    """The cupy memo (CUPY_CALLS, keyed by the arguments as given) of a call without a window is never found by one
    with a window, and the reverse: each call's memo key holds its normalized window."""
    keys = []

    def recorded(arrays, options):
        keys.append(dispatch.memo_key(arrays, options))
        return keys[-1]

    monkeypatch.setattr(api, "memo_key", recorded)
    q, k, v = _half()
    iokernels.attention(q, k, v)
    plain = _last_entry()
    iokernels.attention(q, k, v, window=(8, 8))
    windowed = _last_entry()
    assert keys[0] is not None and len({keys[0], keys[1]}) == 2
    dispatch.CUPY_CALLS.put(keys[0], plain)  # as if each had a fast path
    dispatch.CUPY_CALLS.put(keys[1], windowed)
    for window, want in ((None, plain), ((8, 8), windowed), ((-1, -1), plain), ([8, 8], windowed)):
        before = dispatch.CACHE.hits + dispatch.CACHE.misses
        iokernels.attention(q, k, v, window=window)
        assert planned.runs[-1][0] == want.chain, window  # the memo's plans, found without the dispatch cache
        assert dispatch.CACHE.hits + dispatch.CACHE.misses == before
    iokernels.attention(q, k, v, window=(9, 8))  # not memoized: planned afresh
    assert planned.runs[-1][0][0].window == (9, 8) and keys[-1] not in (keys[0], keys[1])
    lse = np.zeros(q.shape[:-1], np.float32)
    iokernels.attention_backward(q, k, v, q, q, lse)
    iokernels.attention_backward(q, k, v, q, q, lse, window=(8, 8))
    assert keys[-2] != keys[-1]


def test_the_mask_values_are_read_on_every_call(planned):
    q, k, v = _arrays()
    iokernels.attention(q, k, v, mask=np.zeros((40, 33), np.float32))
    with pytest.raises(ValueError, match="NaN"):  # the same signature, a value the first call did not have
        iokernels.attention(q, k, v, mask=np.full((40, 33), np.nan, np.float32))
    assert planned.count == 1


def test_failed_calls_are_not_cached(planned):
    q, k, v = _arrays()
    for _ in range(2):
        with pytest.raises(ValueError, match="head dim"):
            iokernels.attention(q, k[..., :32], v)
    with pytest.raises(ValueError, match="dropout probability"):
        iokernels.attention(q, k, v, dropout=1.5)
    assert len(dispatch.CACHE.entries) == 0 and planned.count == 0


def test_the_key_holds_the_device_and_every_option(monkeypatch):
    q, k, v = _arrays()
    monkeypatch.setattr(dispatch, "device_id", lambda: 0)
    on_0 = dispatch.call_key("fwd", (q, k, v), None, causal="", scale=None)
    monkeypatch.setattr(dispatch, "device_id", lambda: 1)
    assert dispatch.call_key("fwd", (q, k, v), None, causal="", scale=None) != on_0
    monkeypatch.setattr(dispatch, "device_id", lambda: 0)
    assert dispatch.call_key("fwd", (q, k, v), None, causal="", scale=None) == on_0
    assert dispatch.call_key("fwd", (q, k, v), None, causal="top_left", scale=None) != on_0
    assert dispatch.call_key("bwd", (q, k, v), None, causal="", scale=None) != on_0
    assert dispatch.call_key("fwd", (q, k, v), np.ones((40, 33), bool), causal="", scale=None) != on_0
    assert dispatch.call_key("fwd", (q, k, v), None, causal="", scale=None, window=(8, 8)) != \
        dispatch.call_key("fwd", (q, k, v), None, causal="", scale=None, window=None)
    assert dispatch.call_key("fwd", (q, [1.0], v), None) is None  # not an array: no key, checked in full


def test_the_memo_key_tells_every_spelling_apart(monkeypatch):
    q, k, v = _arrays()
    monkeypatch.setattr(dispatch, "device_id", lambda: 0)
    base = dispatch.memo_key((q, k, v), ("fwd", "flash", None, True, None))
    assert base == dispatch.memo_key((q.copy(), k, v), ("fwd", "flash", None, True, None))
    for options in (("fwd", "flash", None, 1, None), ("fwd", "flash", None, "bottom_right", None),
                    ("fwd", "flash", None, True, 1.0), ("bwd", "flash", None, True, None)):
        assert dispatch.memo_key((q, k, v), options) != base
    assert dispatch.memo_key((q, k, v.astype(np.float16)), ("fwd", "flash", None, True, None)) != base
    assert dispatch.memo_key((q, k, v[..., ::2]), ("fwd", "flash", None, True, None)) != base
    monkeypatch.setattr(dispatch, "device_id", lambda: 1)
    assert dispatch.memo_key((q, k, v), ("fwd", "flash", None, True, None)) != base
    assert dispatch.memo_key((q, [1.0], v), ("fwd",)) is None  # not an array
    assert dispatch.memo_key((q, k, v), ("fwd", [1.0])) is None  # an unhashable option: the checked path


def test_the_cache_is_a_bounded_lru():
    cache = dispatch.DispatchCache(size=2)
    built = []

    def build(name):
        return lambda: built.append(name) or name

    for key in ("a", "b", "a", "c", "b"):  # c evicts b (a was used more recently); b is built again
        cache.lookup((key,), build(key))
    assert built == ["a", "b", "c", "b"] and list(cache.entries) == [("c",), ("b",)]
    assert cache.hits == 1 and cache.misses == 4
    cache.lookup(None, build("x"))
    cache.lookup(([],), build("y"))  # unhashable: built, not stored
    assert built[-2:] == ["x", "y"] and len(cache.entries) == 2


def test_dropout_presence_matches_what_the_call_draws():
    assert [dispatch.dropout_present(x) for x in (None, 0, 0.0, -0.0, np.float32(0), 0.1, Dropout(0.0, 1))] == \
        [False, False, False, False, False, True, True]
    assert dispatch.dropout_present("0.1") and dispatch.dropout_present(True)  # invalid: checked by the call


# ---------------------------------------------------------------------------------------------
# the NaN fill of outputs: a debug switch, off by default

def test_outputs_are_not_poisoned_unless_asked(monkeypatch):
    fills = []
    monkeypatch.setattr(launch, "require_cupy", NumpyCupy)
    monkeypatch.setattr(launch, "poison", lambda x, dtype: fills.append(x.shape))
    plan = make_plan("flash", "q_outer", N_q=40, N_k=33, d=64, dtype="float32", sram=96 * 1024)
    inputs = {n: np.zeros(launch.tensor_shape(plan, n), np.float32) for n in ("Q", "K", "V")}
    monkeypatch.setattr(launch, "DEBUG_POISON", False)
    buffers, _ = launch.allocate(plan, inputs)
    assert fills == [] and buffers["Q"] is inputs["Q"] and buffers["O"].shape == (1, 40, 64)
    monkeypatch.setattr(launch, "DEBUG_POISON", True)
    launch.allocate(plan, inputs)
    assert sorted(fills) == [(1, 40), (1, 40, 64)]  # lse and O, not the inputs
    launch.allocate(plan, inputs, poison_outputs=False)
    assert len(fills) == 2


@pytest.mark.parametrize("value, want", [(None, False), ("0", False), ("1", True)])
def test_the_debug_switch_reads_the_environment(value, want):
    env = {k: x for k, x in os.environ.items() if k != "IOKERNELS_DEBUG_POISON"}
    if value is not None:
        env["IOKERNELS_DEBUG_POISON"] = value
    code = "from iokernels.kernels import launch; print(launch.DEBUG_POISON)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == str(want)
