"""Property-based fuzzing of the CPU layers (hypothesis): random N_q, N_k, d, M, dtype, algorithm, schedule,
direction, mask, batch and heads. The simulator's bytes equal ``model.exact`` byte for byte, its outputs equal
the float64 reference, and ``make_plan`` refuses an M exactly when it is below the smallest M it names.

Deterministic in CI (``derandomize``); ``IOK_FUZZ_SEED=<int>`` draws other examples and
``IOK_FUZZ_EXAMPLES=<n>`` scales the run (default 500 + 150 examples).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st

from iokernels import model
from iokernels.plan import (
    CAUSAL_ALIGNMENTS,
    D_MAX,
    D_MIN,
    D_MULTIPLE,
    SCHEDULES,
    Plan,
    SramTooSmall,
    Unsupported,
    make_plan,
    min_sram,
    supports_block_sparse,
    supports_causal,
    supports_dropout,
    supports_explicit_mask,
)
from iokernels.plan.dropout import Dropout
from iokernels.plan.fast import FAST_DTYPES, FAST_HEAD_DIMS
from iokernels.plan.fast_bwd import make_fast_backward_plan
from iokernels.plan.masks import MASK_KINDS, PATTERNS, ExplicitMask, pattern
from iokernels.plan.units import DTYPE_ITEMSIZE
from iokernels.plan.variants import FAST_SPARSE_BLOCK
from iokernels.simulate import make_inputs, max_relative_error, reference_outputs, simulate

KB = 1024
KEYS = [(a, s, p) for (a, p), ss in SCHEDULES.items() for s in ss]
HEAD_DIMS = list(range(D_MIN, D_MAX + 1, D_MULTIPLE))
M_MAX = 227 * KB  # the H100/H200 per-block limit: the largest M a plan is asked for on those GPUs
N_MAX = 200
TILE_STEPS_MAX = 1600  # (query block, key block) pairs per head the simulator walks; M grows until under it
EXAMPLES = int(os.environ.get("IOK_FUZZ_EXAMPLES", "500"))
SEED = os.environ.get("IOK_FUZZ_SEED")
Key = tuple[str, str, str]


def fuzz(examples: int) -> Callable:
    """hypothesis settings: ``examples`` examples, no deadline, derandomized unless IOK_FUZZ_SEED is set."""
    def wrap(test: Callable) -> Callable:
        test = settings(max_examples=examples, deadline=None, derandomize=SEED is None, database=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(test)
        return seed(int(SEED))(test) if SEED else test
    return wrap


# ---------------------------------------------------------------------------------------------
# masks: make_plan keyword arguments per kind, and which (algorithm, schedule, direction) implement it.
# A new kind of mask (block-sparse, explicit, dropout) is one more entry.

@dataclass(frozen=True)
class Mask:
    kwargs: Callable[[int, int], st.SearchStrategy[dict]]  # (N_q, N_k) -> make_plan keyword arguments
    supported: Callable[[Key, dict], bool]  # (key, the make_plan keyword arguments) -> whether a kernel takes it


MASKS: dict[str, Mask] = {
    "none": Mask(lambda n_q, n_k: st.just({}), lambda key, kw: True),
    "causal": Mask(lambda n_q, n_k: st.sampled_from([True, *CAUSAL_ALIGNMENTS]).map(lambda c: {"causal": c}),
                   lambda key, kw: supports_causal(*key)),
    # a block mask of a random pattern, density and block size (the plan's tiles divide its blocks), with or
    # without the causal mask
    "block_sparse": Mask(lambda n_q, n_k: st.builds(
        lambda kind, density, block, s, causal: {"block_mask": pattern(kind, density, n_q=n_q, n_k=n_k, block_q=block,
                                                                       seed=s), "causal": causal},
        st.sampled_from(PATTERNS), st.floats(0.05, 1.0), st.sampled_from([8, 16, 32, 48, 64, 128]),
        st.integers(0, 99), st.sampled_from([False, "bottom_right", "top_left"])),
        # (flash/fast: its tiles divide blocks of a multiple of FAST_SPARSE_BLOCK only)
        lambda key, kw: supports_block_sparse(*key)
        and (key[1] != "fast" or kw["block_mask"].block_q % FAST_SPARSE_BLOCK == 0)),
    # an explicit mask, boolean or additive, shared or one per batch-head, with or without the causal mask
    "explicit": Mask(lambda n_q, n_k: st.builds(
        lambda kind, shared, causal: {"mask": ExplicitMask(kind, shared), "causal": causal},
        st.sampled_from(MASK_KINDS), st.booleans(), st.sampled_from([False, "bottom_right", "top_left"])),
        lambda key, kw: supports_explicit_mask(*key)),
    # dropout of a random p, seed and offset, alone or with the causal mask
    "dropout": Mask(lambda n_q, n_k: st.builds(
        lambda t, s, off: {"dropout": Dropout(t / 256, s, off)},
        st.integers(0, 243), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)),  # p: a multiple of 1/256
        lambda key, kw: supports_dropout(*key)),
    # a sliding window (left, right; None: unbounded) with or without the causal mask (the model and the simulator
    # take it; no kernel does yet)
    "window": Mask(lambda n_q, n_k: st.builds(
        lambda left, right, causal: {"window": (left, right), "causal": causal},
        st.none() | st.integers(0, 2 * N_MAX), st.none() | st.integers(0, 2 * N_MAX),
        st.sampled_from([False, *CAUSAL_ALIGNMENTS])),
        lambda key, kw: supports_causal(*key)),
    "dropout_causal": Mask(lambda n_q, n_k: st.builds(
        lambda t, s, causal: {"dropout": Dropout(t / 256, s, 0), "causal": causal},
        st.integers(0, 243), st.integers(0, 2**64 - 1), st.sampled_from(CAUSAL_ALIGNMENTS)),
        lambda key, kw: supports_dropout(*key) and supports_causal(*key)),
}


# ---------------------------------------------------------------------------------------------
# problems

@dataclass(frozen=True)
class Problem:
    key: Key
    n_q: int
    n_k: int
    d: int
    dtype: str
    batch: int
    heads: int
    kv_heads: int
    mask: str
    mask_kwargs: dict
    deterministic: bool
    sram_frac: float  # where M lies between the smallest M and M_MAX, log-uniformly

    def make(self, sram: int) -> Plan:
        algorithm, schedule, direction = self.key
        if self.deterministic:  # its own plan (make_plan has no deterministic option); M does not apply
            return make_fast_backward_plan(N_q=self.n_q, N_k=self.n_k, d=self.d, dtype=self.dtype, batch=self.batch,
                                           heads=self.heads, deterministic=True)
        extra = {"kv_heads": self.kv_heads} if self.kv_heads != self.heads else {}
        return make_plan(algorithm, schedule, N_q=self.n_q, N_k=self.n_k, d=self.d, dtype=self.dtype, sram=sram,
                         batch=self.batch, heads=self.heads, direction=direction, **extra, **self.mask_kwargs)

    def smallest_m(self) -> int:
        """The smallest M make_plan takes for this problem, as its SramTooSmall says."""
        try:
            self.make(1)
        except SramTooSmall as exc:
            return exc.min_bytes
        return 1


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    key = draw(st.sampled_from(KEYS))
    fast = key[1] == "fast"
    dtype = draw(st.sampled_from(FAST_DTYPES if fast else list(DTYPE_ITEMSIZE)))
    d = draw(st.sampled_from(FAST_HEAD_DIMS if fast else HEAD_DIMS))
    n_q, n_k = draw(st.integers(1, N_MAX)), draw(st.integers(1, N_MAX))
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    deterministic = key == ("flash", "fast", "bwd") and draw(st.booleans())
    # grouped-query K/V: the tensor-core path (not its deterministic backward)
    kv_heads = draw(st.sampled_from(_divisors(heads))) if fast and not deterministic else heads
    mask = "none" if deterministic else draw(st.sampled_from(sorted(MASKS)))
    mask_kwargs = draw(MASKS[mask].kwargs(n_q, n_k))
    return Problem(key, n_q, n_k, d, dtype, batch, heads, kv_heads, mask, mask_kwargs, deterministic,
                   draw(st.floats(0, 1)))


def _tile_steps(plan: Plan) -> int:
    t = plan.tile
    if "Br" in t:
        return -(-plan.N_q // t["Br"]) * -(-plan.N_k // t["Bc"])
    # standard: the k-slices of its largest product, over its output tiles
    n = max(plan.N_q, plan.N_k, plan.d)
    return -(-plan.N_q // t["BM"]) * -(-n // t["BN"]) * -(-n // t["BK"]) // 8


def _plan_or_unsupported(problem: Problem, sram: int) -> Plan | None:
    try:
        return problem.make(sram)
    except Unsupported:
        # legitimate only where the plans say the mask has no kernel here
        assert not MASKS[problem.mask].supported(problem.key, problem.mask_kwargs), problem
        event(f"unsupported: {problem.mask} on {'/'.join(problem.key)}")
        return None


@fuzz(EXAMPLES)
@given(problem=problems())
def test_simulator_bytes_equal_the_model_and_outputs_the_reference(problem: Problem):
    try:
        smallest = problem.smallest_m()
    except Unsupported:  # legitimate only where the plans say the mask has no kernel here
        assert not MASKS[problem.mask].supported(problem.key, problem.mask_kwargs), problem
        return
    if smallest == 1 and not problem.deterministic:  # make_plan took M = 1 byte: only if it has no tiles to fit
        pytest.fail(f"make_plan accepted M = 1 byte: {problem}")
    sram = min(M_MAX, int(smallest * (M_MAX / smallest) ** problem.sram_frac))
    plan = _plan_or_unsupported(problem, sram)
    if plan is None:
        return
    while _tile_steps(plan) > TILE_STEPS_MAX and sram < M_MAX:  # keep the simulator's walk short
        sram = min(M_MAX, 2 * sram)
        plan = problem.make(sram)
    if not problem.deterministic:
        assert plan.smem_bytes <= sram
    assert (plan.N_q, plan.N_k, plan.d, plan.bh, plan.bh_kv) == (
        problem.n_q, problem.n_k, problem.d, problem.batch * problem.heads, problem.batch * problem.kv_heads)
    event(f"{plan.label} {problem.mask}")

    inputs = make_inputs(plan, seed=problem.n_q * 1000 + problem.n_k)
    result = simulate(plan, inputs)
    assert result.counts == model.exact(plan), plan.label
    err = max_relative_error(result.outputs, reference_outputs(plan, inputs))
    assert err < 1e-10, (plan.label, err)


@fuzz(max(1, EXAMPLES * 3 // 10))
@given(problem=problems(), below=st.booleans(), frac=st.floats(0, 1))
def test_sram_too_small_exactly_below_the_smallest_m(problem: Problem, below: bool, frac: float):
    if problem.deterministic:
        return  # takes no M
    try:
        smallest = problem.smallest_m()
    except Unsupported:
        assert not MASKS[problem.mask].supported(problem.key, problem.mask_kwargs), problem
        return
    if problem.mask == "none" and problem.kv_heads == problem.heads:
        algorithm, schedule, direction = problem.key
        assert smallest == min_sram(algorithm, schedule, d=problem.d, dtype=problem.dtype, direction=direction)
    if below and smallest > 1:
        sram = max(1, int((smallest - 1) * frac))
        with pytest.raises(SramTooSmall) as info:
            problem.make(sram)
        assert info.value.min_bytes == smallest
    else:
        sram = smallest + int(frac * (M_MAX - smallest)) if smallest < M_MAX else smallest
        plan = problem.make(sram)
        assert plan.smem_bytes <= sram


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_smallest_m_counts_the_row_wise_stages(direction):
    smallest = min_sram("flash", "kv_outer", d=16, direction=direction)
    plan = make_plan("flash", "kv_outer", N_q=5, d=16, sram=smallest, direction=direction)
    assert plan.smem_bytes <= smallest
