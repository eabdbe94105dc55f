"""iokernels.plan.cderiv: ``score_grad`` written from a ``score_mod``.

The derivative's text is checked against the expression itself, not against a second symbolic derivation: it must
parse with :func:`parse` over the same names, and its :meth:`CExpr.evaluate` must match a central finite difference
of the expression's. Where NVRTC is installed, every derivative also compiles as CUDA next to its expression."""

from __future__ import annotations

import numpy as np
import pytest

from iokernels.plan.cderiv import depends_on, derivative
from iokernels.plan.cexpr import CExpr, parse

VARIABLES = ("b", "h", "q_idx", "kv_idx", "n_q", "n_k", "score", "p")
ARRAYS = ("slopes", "bias", "doc")
N = 8
RNG = np.random.default_rng(7)
ENV = {"b": 1, "h": 3, "q_idx": np.arange(N)[:, None], "kv_idx": np.arange(N)[None, :], "n_q": N, "n_k": N,
       "p": 0.75}
CAPTURES = {"slopes": RNG.uniform(0.1, 1.0, N), "bias": RNG.normal(size=N), "doc": np.arange(N) // 3}
SCORES = RNG.uniform(-3.0, 3.0, (N, N))  # no point this seed draws lies within a step of a kink below

SMOOTH = [
    "30.0f * tanhf(score / 30.0f)",  # softcap
    "score - slopes[h] * abs(q_idx - kv_idx)",  # ALiBi
    "score * slopes[h] + bias[kv_idx]",
    "30.0f * tanhf((score - slopes[h] * abs(q_idx - kv_idx)) / 30.0f)",
    "expf(score * 0.25f) + logf(1.0f + score * score)",
    "sqrtf(expf(score) + 1.0f) * logf(2.0f + sinf(score))",
    "exp2f(score * 1.4426950408889634f) * log2f(score * score + 1.0f) - cos(score)",
    "(score + 1.0f) / (score * score + 2.0f) + (q_idx + 1) / (score * score + 1.0f)",
    "(score * 2) / 3 + score * q_idx * kv_idx / 7",  # int factors: the derivative must not divide as ints
    "q_idx >= kv_idx ? score * 2.0f : tanhf(score) - (float)(q_idx - kv_idx)",
    "doc[q_idx] == doc[kv_idx] && q_idx > 2 ? -score : (q_idx < kv_idx ? 0.5f * score * score : 1.0f)",
    "fminf(score, 2.0f + kv_idx) + fmaxf(score * 0.5f, -score) + max(score, (float)(q_idx - kv_idx))"
    " - min(score, 1.0f)",
    "powf(score * score + 1.0f, 1.5f) - 2.0f * powf(score, 2) + pow(fabsf(score) + 1.0f, p) + powf(score, -3.0f)",
    "expf(-fabsf(score - 0.1f) / (1.0f + cosf(score) * cosf(score)))",
    "-(double)score * +0.5 + (float)(q_idx / 2) * score - -2 * score",
    "fmodf(score, 3.5f) * 2.0f",
]


def _parse(text: str) -> CExpr:
    return parse(text, VARIABLES, ARRAYS, what="score_mod")


def _values(expr: CExpr, scores: np.ndarray) -> np.ndarray:
    value, _ = expr.evaluate({**ENV, "score": scores}, CAPTURES)
    return value.astype(np.float64)


def _finite_difference(expr: CExpr, scores: np.ndarray) -> np.ndarray:
    step = 1e-6 * np.maximum(1.0, np.abs(scores))
    return (_values(expr, scores + step) - _values(expr, scores - step)) / (2 * step)


@pytest.mark.parametrize("text", SMOOTH)
def test_derivative_matches_finite_differences(text: str) -> None:
    expr = _parse(text)
    grad = derivative(expr)
    assert grad is not None
    got = _values(_parse(grad), SCORES)
    np.testing.assert_allclose(got, _finite_difference(expr, SCORES), rtol=1e-5, atol=1e-6, err_msg=grad)


@pytest.mark.parametrize("text", ["30.0f * tanhf(score / 30.0f)", "fmaxf(score, 0.0f) * expf(-score)",
                                  "score / (1.0f + fabsf(score))"])
def test_a_derivative_differentiates_again(text: str) -> None:
    """The printed tree is a whole expression: its own derivative is the second one."""
    first = _parse(derivative(_parse(text)))
    second = derivative(first)
    assert second is not None
    np.testing.assert_allclose(_values(_parse(second), SCORES), _finite_difference(first, SCORES),
                               rtol=1e-5, atol=1e-6, err_msg=second)


@pytest.mark.parametrize(("text", "expected"), [
    ("score", "1.0f"),
    ("score + 1.0f", "1.0f"),
    ("score - slopes[h] * abs(q_idx - kv_idx)", "1.0f"),
    ("score + bias[h]", "1.0f"),
    ("2.0f", "0.0f"),
    ("slopes[h] * abs(q_idx - kv_idx)", "0.0f"),
    ("score - score", "0.0f"),
    ("-(-score)", "1.0f"),
    ("-2 * score", "-2.0f"),
    ("score * q_idx", "(float)q_idx"),  # an int alone would make a later '/' truncate
    ("1 / score", "-1.0f / (score * score)"),
    ("score / 30.0f", "1.0f / 30.0f"),
    ("expf(score)", "expf(score)"),
    ("powf(score, 3.0f)", "3.0f * powf(score, 2.0f)"),
    ("fabsf(score)", "score > 0.0f ? 1.0f : (score < 0.0f ? -1.0f : 0.0f)"),
    ("fminf(score, 5.0f)", "score <= 5.0f ? 1.0f : 0.0f"),
    ("q_idx >= kv_idx ? score : -1.0f", "q_idx >= kv_idx ? 1.0f : 0.0f"),
    ("q_idx >= kv_idx ? score : score + 2.0f", "1.0f"),
    ("30.0f * tanhf(score / 30.0f)",
     "30.0f * ((1.0f - tanhf(score / 30.0f) * tanhf(score / 30.0f)) * (1.0f / 30.0f))"),
])
def test_simplified_text(text: str, expected: str) -> None:
    assert derivative(_parse(text)) == expected


@pytest.mark.parametrize("text", [
    "(int)score", "(unsigned)(score * 4.0f)", "score > 0.0f", "(score > 0.0f) * score", "!score", "score && q_idx",
    "floorf(score)", "ceilf(score) + score", "bias[(int)score]", "powf(2.0f, score)", "fmodf(1.0f, score)",
    "score % 2",
])
def test_underivable(text: str) -> None:
    assert derivative(_parse(text)) is None


def test_other_variables() -> None:
    expr = _parse("score * p + p * p")
    assert derivative(expr, "p") == "(float)score + (p + p)"  # score's type is unknown in a p-derivative
    assert derivative(expr, "q_idx") == "0.0f"


def test_depends_on() -> None:
    assert depends_on(_parse("score - slopes[h] * abs(q_idx - kv_idx)"), "score")
    assert depends_on(_parse("score - score"), "score")  # textual, not algebraic
    assert not depends_on(_parse("slopes[h] * abs(q_idx - kv_idx)"), "score")
    assert depends_on(_parse("slopes[h]"), "h") and not depends_on(_parse("slopes[h]"), "slopes")


def test_derivatives_compile_with_nvrtc() -> None:
    """Each derivative beside its expression, in the kernels' context: int indices, a float score, captures."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from iokernels.kernels.nvrtc import compile_to_cubin

    params = ("float score, int b, int h, int q_idx, int kv_idx, int n_q, int n_k, float p, "
              "const float* slopes, const float* bias, const int* doc")
    args = "score, b, h, q_idx, kv_idx, n_q, n_k, p, slopes, bias, doc"
    texts = [*SMOOTH, "fabsf(score)", "1 / score", "score * q_idx", "fminf(score, 5.0f)", "-2 * score"]
    functions, calls = [], []
    for i, text in enumerate(texts):
        functions.append(f"__device__ float mod{i}({params}) {{ return {text}; }}\n"
                         f"__device__ float grad{i}({params}) {{ return {derivative(_parse(text))}; }}\n")
        calls.append(f"    out[{2 * i}] = mod{i}({args});\n    out[{2 * i + 1}] = grad{i}({args});\n")
    source = "".join(functions) + (
        f'extern "C" __global__ void check(float* out, {params}) {{\n' + "".join(calls) + "}\n")
    try:
        compile_to_cubin(source, arch="sm_90", name="cderiv.cu")
    except ImportError as exc:  # bindings present, libnvrtc not loadable
        pytest.skip(str(exc))
