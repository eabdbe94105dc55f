"""iokernels.plan.cexpr: C expressions (score_mod, mask_mod, score_grad) evaluated on the CPU as the GPU runs them.

The expected values and read counts are computed independently, by hand or by plain Python loops over small grids
that spell C's semantics out element by element (truncating division, short circuits, one read per array access
reached)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from iokernels.plan.cexpr import CExpr, ExprError, parse

VARIABLES = ("b", "h", "q_idx", "kv_idx", "score", "slope", "x", "y", "z", "a", "c", "d", "e")
ARRAYS = ("doc", "slopes")


def _parse(text: str) -> CExpr:
    return parse(text, VARIABLES, ARRAYS, what="score_mod")


def _scalar(text: str):
    """The value of a constant expression, as a Python number, with its dtype."""
    value, reads = _parse(text).evaluate({}, {})
    assert value.shape == () and reads == {}
    return value.item(), value.dtype


def _c_div(a: int, b: int) -> int:
    """C's integer division, by hand: the quotient of the magnitudes, negated when the signs differ."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _grid(n_q: int, n_k: int) -> dict[str, np.ndarray]:
    return {"q_idx": np.arange(n_q)[:, None], "kv_idx": np.arange(n_k)[None, :]}


DOC = np.array([0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3])  # 16 keys in 4 documents


@pytest.mark.parametrize(("text", "expected"), [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("10 - 4 - 3", 3),  # left-associative
    ("100 / 10 / 5", 2),
    ("2 * 3 % 4", 2),
    ("1 << 2 + 1", 8),  # + binds tighter than <<
    ("1 & 2 == 2", 1),  # == binds tighter than & in C (Python's (1 & 2) == 2 is False)
    ("1 < 2 == 1", 1),
    ("1 | 2 ^ 3 & 1", 3),  # 1 | (2 ^ (3 & 1))
    ("2 - -1", 3),
    ("-2 * 3", -6),
    ("!0 + 1", 2),
    ("~0", -1),
    ("!5", 0),
    ("1 || 0 && 0", 1),  # && binds tighter than ||
    ("0 ? 1 : 0 ? 2 : 3", 3),  # right-associative
    ("1 ? 0 ? 4 : 5 : 6", 5),
    ("0 || 2", 1),  # logical results are 0 or 1
    ("3 > 2 > 1", 0),  # (3 > 2) > 1
])
def test_precedence_and_associativity_are_cs(text, expected):
    value, dtype = _scalar(text)
    assert (value, dtype) == (expected, np.int64)


def test_nested_ternary_and_logic_over_a_grid():
    rng = np.random.default_rng(1)
    env = {k: rng.integers(-1, 3, size=(5, 7)) for k in ("a", "b", "c", "d", "e", "x", "y", "z")}
    got, _ = _parse("a ? b : c ? d : e").evaluate(env, {})
    got_logic, _ = _parse("!x && y || z").evaluate(env, {})
    for i in range(5):
        for j in range(7):
            v = {k: int(a[i, j]) for k, a in env.items()}
            assert got[i, j] == (v["b"] if v["a"] != 0 else v["d"] if v["c"] != 0 else v["e"])
            assert got_logic[i, j] == int((v["x"] == 0 and v["y"] != 0) or v["z"] != 0)


def test_integer_division_truncates_and_remainder_takes_the_dividends_sign():
    assert _scalar("-7 / 2") == (-3, np.int64) and -7 // 2 == -4  # not Python's floor
    assert _scalar("-7 % 2") == (-1, np.int64) and -7 % 2 == 1
    assert _scalar("7 % -2") == (1, np.int64)
    xs, ys = np.arange(-9, 10)[:, None], np.array([-4, -3, -2, -1, 1, 2, 3, 4])[None, :]
    quot, _ = _parse("x / y").evaluate({"x": xs, "y": ys}, {})
    rem, _ = _parse("x % y").evaluate({"x": xs, "y": ys}, {})
    assert quot.dtype == rem.dtype == np.int64
    for i, a in enumerate(xs[:, 0].tolist()):
        for j, b in enumerate(ys[0].tolist()):
            assert quot[i, j] == _c_div(a, b)
            assert rem[i, j] == a - _c_div(a, b) * b


@pytest.mark.parametrize(("text", "expected", "dtype"), [
    ("1.0f", 1.0, np.float64), (".5", 0.5, np.float64), ("2e-3f", 0.002, np.float64), ("30.f", 30.0, np.float64),
    ("1.5e+2F", 150.0, np.float64), ("1e3", 1000.0, np.float64), ("1.e1", 10.0, np.float64),
    ("0x1F", 31, np.int64), ("010", 8, np.int64), ("7l", 7, np.int64),
    ("7 / 2", 3, np.int64), ("7 / 2.0f", 3.5, np.float64), ("7.f / 2", 3.5, np.float64),
    ("1 ? 2 : 0.5f", 2.0, np.float64),  # ?: converts both branches to the common type
])
def test_literals_and_promotion(text, expected, dtype):
    value, got_dtype = _scalar(text)
    assert value == pytest.approx(expected, rel=1e-15) and got_dtype == dtype


@pytest.mark.parametrize(("text", "expected", "dtype"), [
    ("(int)3.7", 3, np.int64),
    ("(int)-3.7", -3, np.int64),  # toward zero
    ("(float)7 / 2", 3.5, np.float64),  # the cast binds tighter than /
    ("(float)(7 / 2)", 3.0, np.float64),
    ("(double)1", 1.0, np.float64),
    ("(unsigned)-1", 2**32 - 1, np.int64),
    ("-1 < 0u", 0, np.int64),  # -1 converts to 4294967295
    ("0xFFFFFFFF + 1", 0, np.int64),  # a hex literal above INT_MAX is unsigned, and unsigned wraps
    ("(int)0xFFFFFFFF", -1, np.int64),
    ("0u - 1 > 5", 1, np.int64),
    ("0xFFFFFFFF * 0xFFFFFFFF", 1, np.int64),  # (2^32 - 1)^2 mod 2^32
    ("-2 >> 1", -1, np.int64),  # arithmetic shift of a signed int
    ("0x80000000 >> 31", 1, np.int64),
])
def test_casts_and_unsigned(text, expected, dtype):
    assert _scalar(text) == (expected, dtype)


def test_unsigned_window_idiom_matches_the_signed_pair():
    got, _ = _parse("(unsigned)(q_idx - kv_idx) < 4u").evaluate(_grid(12, 12), {})
    expected = [[int(0 <= q - k < 4) for k in range(12)] for q in range(12)]
    assert got.tolist() == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("tanhf(0.5f)", math.tanh(0.5)), ("tanh(2)", math.tanh(2)), ("expf(1.5f)", math.exp(1.5)),
    ("exp2f(3)", 8.0), ("logf(2.0f)", math.log(2)), ("log2f(8)", 3.0), ("sqrtf(2)", math.sqrt(2)),
    ("fabsf(-2.5f)", 2.5), ("floorf(-2.5f)", -3.0), ("ceilf(-2.5f)", -2.0), ("powf(2, 0.5f)", math.sqrt(2)),
    ("sinf(1)", math.sin(1)), ("cosf(1)", math.cos(1)), ("fminf(1, 2)", 1.0), ("fmaxf(1, 2)", 2.0),
    ("fmodf(-7.5f, 2)", -1.5), ("min(3, 2.5f)", 2.5),
])
def test_float_functions(text, expected):
    value, dtype = _scalar(text)
    assert dtype == np.float64 and value == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(("text", "expected"), [("abs(-3)", 3), ("min(4, -2)", -2), ("max(-1, -2)", -1)])
def test_integer_overloads_stay_integer(text, expected):
    assert _scalar(text) == (expected, np.int64)


def _counted(doc):
    """``doc`` indexing that counts its calls, as the GPU's reads."""
    reads = [0]

    def at(i):
        reads[0] += 1
        return int(doc[i])
    return at, reads


@pytest.mark.parametrize(("text", "element"), [
    ("kv_idx < 8 && doc[kv_idx] == doc[q_idx]", lambda q, k, at: int(k < 8 and at(k) == at(q))),
    ("kv_idx >= 8 || doc[kv_idx] != doc[q_idx]", lambda q, k, at: int(k >= 8 or at(k) != at(q))),
    ("q_idx > kv_idx ? doc[q_idx] : doc[kv_idx] + doc[kv_idx]", lambda q, k, at: at(q) if q > k else at(k) + at(k)),
    ("doc[doc[q_idx] * 4] + (doc[kv_idx] > 1 && q_idx < 3)",
     lambda q, k, at: at(at(q) * 4) + int(at(k) > 1 and q < 3)),
    ("doc[q_idx] == doc[kv_idx]", lambda q, k, at: int(at(q) == at(k))),
])
def test_short_circuits_count_the_reads_c_executes(text, element):
    at, reads = _counted(DOC)
    expected = [[element(q, k, at) for k in range(16)] for q in range(16)]
    got, got_reads = _parse(text).evaluate(_grid(16, 16), {"doc": DOC})
    assert got.tolist() == expected
    assert got_reads == {"doc": reads[0]}
    if text.startswith("kv_idx < 8"):
        assert reads[0] == 2 * 16 * 8


def test_active_counts_and_evaluates_only_the_active_elements():
    text = "kv_idx < 12 && doc[kv_idx] == doc[q_idx]"
    active = np.arange(16)[:, None] >= np.arange(16)[None, :]  # causal
    at, reads = _counted(DOC)
    expected = {(q, k): int(k < 12 and at(k) == at(q)) for q in range(16) for k in range(16) if q >= k}
    got, got_reads = _parse(text).evaluate(_grid(16, 16), {"doc": DOC}, active=active)
    assert got_reads == {"doc": reads[0]} and reads[0] < 2 * 16 * 12
    assert {(q, k): int(got[q, k]) for q, k in expected} == expected
    none, no_reads = _parse(text).evaluate(_grid(16, 16), {"doc": DOC}, active=np.zeros((16, 1), bool))
    assert none.shape == (16, 16) and no_reads == {"doc": 0}


def test_reads_broadcast_over_the_grid_and_unreached_captures_count_zero():
    expr = parse("h < 0 ? doc[0] : slopes[h] * kv_idx", ("h", "kv_idx"), ARRAYS)
    env = {"h": np.arange(3)[:, None, None], "q_idx": np.zeros((1, 5, 1), int), "kv_idx": np.arange(7)[None, None, :]}
    got, reads = expr.evaluate(env, {"doc": DOC, "slopes": np.array([0.5, 0.25, 0.125])})
    assert got.shape == (3, 5, 7) and got.dtype == np.float64
    assert reads == {"doc": 0, "slopes": 3 * 5 * 7}  # q_idx is not used but is part of the grid
    assert got[2, 4, 6] == 0.125 * 6


def test_out_of_range_raises_only_where_reached():
    expr = _parse("doc[q_idx + 8] > 0")
    with pytest.raises(ExprError, match=r"^score_mod: column 1: capture 'doc' indexed at 16, it has 16 elements$"):
        expr.evaluate(_grid(16, 4), {"doc": DOC})
    rows = np.arange(16)[:, None] < 8
    got, reads = expr.evaluate(_grid(16, 4), {"doc": DOC}, active=rows)
    assert reads == {"doc": 8 * 4} and got[:8].tolist() == [[int(DOC[q + 8] > 0)] * 4 for q in range(8)]
    got, reads = _parse("q_idx < 8 && doc[q_idx + 8] > 0").evaluate(_grid(16, 4), {"doc": DOC})
    assert reads == {"doc": 8 * 4} and got[8:].sum() == 0
    with pytest.raises(ExprError, match="indexed at -8, it has 16"):  # row 8 is the first to reach the read
        _parse("q_idx < 8 || doc[-q_idx] > 0").evaluate(_grid(16, 4), {"doc": DOC})


def test_integer_division_by_zero_raises_only_where_reached():
    with pytest.raises(ExprError, match=r"^score_mod: column 7: integer division by zero$"):
        _parse("q_idx / kv_idx").evaluate(_grid(4, 4), {})
    with pytest.raises(ExprError, match="column 7: integer remainder by zero"):
        _parse("q_idx % kv_idx").evaluate(_grid(4, 4), {})
    got, _ = _parse("kv_idx != 0 ? q_idx / kv_idx : -1").evaluate(_grid(4, 4), {})
    assert got.tolist() == [[-1] + [_c_div(q, k) for k in range(1, 4)] for q in range(4)]
    got, _ = _parse("q_idx / kv_idx").evaluate(_grid(4, 4), {}, active=np.arange(4) > 0)
    assert got[:, 1:].tolist() == [[_c_div(q, k) for k in range(1, 4)] for q in range(4)]
    assert _scalar("1.0f / 0")[0] == math.inf  # float division by zero is IEEE's, as on the GPU


@pytest.mark.filterwarnings("error")
def test_untaken_and_inactive_elements_give_no_warnings_and_finite_values():
    score = np.array([[-1.0, 0.0, 4.0, np.nan]])
    active = np.array([False, False, True, False])
    got, _ = _parse("logf(score) + (int)score").evaluate({"score": score}, {}, active=active)
    assert np.isfinite(got).all() and got[0, 2] == pytest.approx(math.log(4) + 4)
    got, _ = _parse("score > 0 ? sqrtf(score) : expf(1000.0f)").evaluate({"score": score}, {})
    assert got[0, 2] == 2.0 and got[0, 0] == math.inf


@pytest.mark.parametrize(("text", "column", "message"), [
    ("qidx >= kv_idx", 1, "unknown name 'qidx' (did you mean 'q_idx'?)"),
    ("q_idx >= kvidx", 10, "unknown name 'kvidx'"),
    ("foo(q_idx)", 1, "unknown function 'foo'"),
    ("tanhf(score, 1.0f)", 1, "tanhf takes 1 argument, got 2"),
    ("powf(score)", 1, "powf takes 2 arguments, got 1"),
    ("tanhf", 1, "function 'tanhf' must be called"),
    ("q_idx(1)", 1, "'q_idx' is not a function"),
    ("q_idx[0]", 1, "'q_idx' is not a captured array"),
    ("doc + 1", 1, "capture 'doc' must be indexed"),
    ("doc[q_idx", 10, "expected ']' for the '[' at column 4"),
    ("q_idx kv_idx", 7, "unexpected 'kv_idx' after the expression"),
    ("q_idx, kv_idx", 6, "unexpected ','"),
    ("(q_idx + 1", 11, "missing ')' to close the '(' at column 1"),
    ("q_idx + 1)", 10, "unbalanced ')'"),
    ("q_idx >= kv_idx;", 16, "';' ends a statement"),
    ("score = 1", 7, "'=' assigns"),
    ("score += 1", 7, "'+=' assigns"),
    ("q_idx++", 6, "'++' assigns"),
    ("q_idx <<= 1", 7, "'<<=' assigns"),
    ("", 1, "empty expression"),
    ("   ", 4, "empty expression"),
    ("q_idx +", 8, "ends where an operand is expected"),
    ("q_idx + * 2", 9, "expected an operand, got '*'"),
    ("q_idx ? 1", 10, "expected ':' for the '?' at column 7"),
    ("1f", 1, "malformed number '1f'"),
    ("1.0.5", 1, "malformed number"),
    ("09", 1, "invalid octal literal"),
    ("4294967296u", 1, "64-bit unsigned is not supported"),
    ("1ul", 1, "suffix 'ul' is not supported"),
    ("q_idx # 2", 7, "unexpected character '#'"),
    ("q_idx // 2", 7, "comments are not allowed"),
    ("float + 1", 1, "type name 'float' outside a cast"),
    ("score.x", 6, "unexpected character '.'"),
])
def test_parse_errors_name_the_expression_and_the_column(text, column, message):
    with pytest.raises(ExprError) as info:
        _parse(text)
    assert info.value.column == column
    assert str(info.value).startswith(f"score_mod: column {column}: ")
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("text", "column", "message"), [
    ("score % 2", 7, "'%' needs integer operands"),
    ("score & 1", 7, "'&' needs integer operands"),
    ("1 << score", 3, "'<<' needs integer operands"),
    ("~score", 1, "'~' needs an integer operand"),
    ("doc[score]", 1, "the index of 'doc' must be an integer"),
    ("abs((unsigned)q_idx)", 1, "abs of an unsigned value"),
    ("q_idx > 0 ? score : slope", 21, "no value for 'slope'"),
    ("slopes[h]", 1, "no array for capture 'slopes'"),
])
def test_evaluation_errors_name_the_column(text, column, message):
    env = {"score": np.ones((2, 2)), "q_idx": np.arange(2)[:, None], "h": 0}
    with pytest.raises(ExprError) as info:
        _parse(text).evaluate(env, {"doc": DOC})
    assert info.value.column == column and message in str(info.value)


def test_names_and_captures():
    expr = _parse("score - slope * abs(q_idx - kv_idx) + slopes[h] * tanhf(score)")
    assert expr.names == {"score", "slope", "q_idx", "kv_idx", "h"}
    assert expr.captures == {"slopes"}
    assert expr.text == "score - slope * abs(q_idx - kv_idx) + slopes[h] * tanhf(score)"
    assert expr == _parse(expr.text) and hash(expr) == hash(_parse(expr.text))
    with pytest.raises(ValueError, match="both variables and arrays"):
        parse("doc[0]", ["doc"], ["doc"])


def test_value_is_broadcast_to_the_grid_and_read_only():
    got, reads = _parse("1").evaluate(_grid(3, 5), {})
    assert got.shape == (3, 5) and got.dtype == np.int64 and (got == 1).all() and reads == {}
    assert not got.flags.writeable
    with pytest.raises(ValueError, match="do not broadcast"):
        _parse("q_idx").evaluate({"q_idx": np.zeros(3), "kv_idx": np.zeros(4)}, {})


MASKS = [
    ("q_idx >= kv_idx", lambda q, k: q >= k),
    ("q_idx - kv_idx <= 4 && kv_idx <= q_idx", lambda q, k: q - k <= 4 and k <= q),
    ("kv_idx < 3 || kv_idx <= q_idx", lambda q, k: k < 3 or k <= q),
]


@pytest.mark.parametrize(("text", "element"), MASKS)
def test_attention_masks(text, element):
    expr = parse(text, ("b", "h", "q_idx", "kv_idx"), what="mask_mod")
    got, reads = expr.evaluate(_grid(13, 17) | {"b": 0, "h": 1}, {})
    assert got.tolist() == [[int(element(q, k)) for k in range(17)] for q in range(13)]
    assert reads == {} and got.dtype == np.int64


def test_document_mask_reads_two_per_element():
    got, reads = parse("doc[q_idx] == doc[kv_idx]", ("q_idx", "kv_idx"), ["doc"]).evaluate(_grid(16, 16), {"doc": DOC})
    assert got.tolist() == [[int(DOC[q] == DOC[k]) for k in range(16)] for q in range(16)]
    assert reads == {"doc": 2 * 16 * 16}


def test_softcap():
    score = np.random.default_rng(0).normal(scale=40, size=(6, 9))
    got, _ = parse("30.0f * tanhf(score / 30.0f)", ("score", "q_idx", "kv_idx")).evaluate({"score": score}, {})
    assert got.dtype == np.float64
    for (i, j), s in np.ndenumerate(score):
        assert got[i, j] == pytest.approx(30 * math.tanh(s / 30), rel=1e-14)


def test_alibi_with_a_slope_per_head():
    slopes = np.array([0.5, 0.25, 0.125], dtype=np.float32)
    score = np.random.default_rng(2).normal(size=(3, 5, 7))
    env = {"h": np.arange(3)[:, None, None], "q_idx": np.arange(5)[None, :, None],
           "kv_idx": np.arange(7)[None, None, :], "score": score}
    expr = parse("score - slopes[h] * abs(q_idx - kv_idx)", ("b", "h", "q_idx", "kv_idx", "score"), ["slopes"])
    got, reads = expr.evaluate(env, {"slopes": slopes})
    for (h, q, k), s in np.ndenumerate(score):
        assert got[h, q, k] == pytest.approx(s - float(slopes[h]) * abs(q - k), rel=1e-14)
    assert reads == {"slopes": 3 * 5 * 7}


@pytest.mark.parametrize("text, want", [
    ("score + m[q_idx * 8 + kv_idx]", ("bias", "m", "q_idx * 8 + kv_idx")),
    ("score+m[ (h * 2) ]", ("bias", "m", "(h * 2)")),
    ("m[a[kv_idx]] != 0", ("mask", "m", "a[kv_idx]")),
    ("m[kv_idx]", ("mask", "m", "kv_idx")),
    ("m[kv_idx] + score", None),
    ("score + m[kv_idx] * 2.0f", None),
    ("m[kv_idx] != 1", None),
    ("score * 2.0f", None),
])
def test_single_read_finds_an_explicit_masks_forms(text, want):
    assert parse(text, ["b", "h", "q_idx", "kv_idx", "score"], ["m", "a"]).single_read() == want


@pytest.mark.parametrize("text, want", [("b * 64 + q_idx * 8 + kv_idx", "b * 64 + q_idx * 8"),
                                        ("q_idx*8+kv_idx", "q_idx*8"), ("kv_idx", None),
                                        ("q_idx * 8 + kv_idx * 1", None), ("(q_idx + kv_idx) + kv_idx", None),
                                        ("kv_idx + q_idx", None)])
def test_minus_finds_a_row_plus_the_key(text, want):
    assert parse(text, ["b", "h", "q_idx", "kv_idx"]).minus("kv_idx") == want
