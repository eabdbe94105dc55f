"""The derivative of a CUDA C expression as another C expression: ``score_grad`` from a ``score_mod``.

The backward pass multiplies dP by d score_mod / d score at every element; users should not have to derive it by
hand for ``30.0f * tanhf(score / 30.0f)``. :func:`derivative` walks :attr:`CExpr.tree` with the textbook rules and
prints C that compiles where the ``score_mod`` compiles: the same names, float literals (``1.0f``), float functions
(``cosf``), ``(float)`` casts where a term of the original could be an int, and parentheses wherever C's precedence
would regroup the text. It also parses with :func:`iokernels.plan.cexpr.parse` over the same names, so the CPU
reference evaluates exactly the text the GPU runs.

The variable differentiated is taken to be a float (``score`` is). Every subexpression that depends on it and has a
derivative is then a float too (only comparisons, logic, integer operators and ``(int)`` casts make ints of it, and
those are refused), which is what lets the printed derivative keep C's float arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .cexpr import (
    BINARY_PRECEDENCE,
    FLOAT,
    INT,
    TERNARY_PRECEDENCE,
    UNARY_PRECEDENCE,
    UNSIGNED,
    Binary,
    Call,
    Cast,
    CExpr,
    Cond,
    Index,
    Name,
    Node,
    Num,
    Unary,
)

_ATOM = 100  # names, literals, calls, indexing and parenthesized text: never regrouped
_LN2 = math.log(2.0)
_CAST_KEYWORD = {FLOAT: "float", UNSIGNED: "unsigned"}  # (double) prints as (float): the derivative is float math


class _Underivable(Exception):
    """The expression has no derivative this module writes (see :func:`derivative`)."""


@dataclass(frozen=True)
class _Term:
    """C text with how tightly its top operator binds (so a caller knows when to parenthesize it), its value when
    it is a number literal (for the ``0 *``, ``* 1``, ``+ 0`` simplifications), whether C types it float for any
    variables' types, and, for ``-x``, the ``x`` (so ``a + -x`` prints ``a - x`` and ``--x`` cannot appear)."""

    text: str
    bp: int = _ATOM
    value: float | None = None
    floaty: bool = True
    negated: _Term | None = None


def _operand(t: _Term) -> str:
    """``t`` as the operand of a unary operator or cast: parenthesized unless it is an atom (``-(-x)``, not
    ``--x``, which C reads as a decrement)."""
    return t.text if t.bp == _ATOM else f"({t.text})"


def _wrap(t: _Term, at_least: int) -> str:
    return t.text if t.bp >= at_least else f"({t.text})"


def _lit(value: float) -> _Term:
    """A float literal; C has none for inf or nan, which a literal too large for a double would give."""
    if not math.isfinite(value):
        raise _Underivable
    text = f"{float(value) + 0.0!r}f"  # + 0.0 turns -0.0 into 0.0
    return _Term(text, UNARY_PRECEDENCE if text.startswith("-") else _ATOM, float(value))


_ZERO, _ONE, _TWO = _lit(0.0), _lit(1.0), _lit(2.0)


def _binary(op: str, a: _Term, b: _Term, floaty: bool = True) -> _Term:
    """``a op b`` with C's left associativity: the right operand is parenthesized at the same binding power."""
    bp = BINARY_PRECEDENCE[op]
    return _Term(f"{_wrap(a, bp)} {op} {_wrap(b, bp + 1)}", bp, floaty=floaty)


def _ternary(cond: _Term, then: _Term, other: _Term) -> _Term:
    """``cond ? then : other``, nested ternaries parenthesized for the reader (C would not need it)."""
    bp = TERNARY_PRECEDENCE + 1
    return _Term(f"{_wrap(cond, bp)} ? {_wrap(then, bp)} : {_wrap(other, bp)}", TERNARY_PRECEDENCE,
                 floaty=then.floaty or other.floaty)


def _pick(cond: _Term, then: _Term, other: _Term) -> _Term:
    """The derivative of a piecewise expression: one branch's where both are the same text (``0.0f`` for both)."""
    return then if then.text == other.text else _ternary(cond, then, other)


def _call(func: str, *args: _Term, floaty: bool = True) -> _Term:
    return _Term(f"{func}({', '.join(a.text for a in args)})", floaty=floaty)


def _as_float(t: _Term) -> _Term:
    """``t`` typed float: a term of the original that stands alone once a float factor ``1.0f`` is dropped may be
    an int (``score * q_idx`` has derivative ``(float)q_idx``, not an int that a later ``/`` would truncate)."""
    if t.floaty:
        return t
    if t.value is not None:
        return _lit(t.value)
    return _Term(f"(float){_operand(t)}", UNARY_PRECEDENCE)


def _neg(a: _Term) -> _Term:
    """``-a``; an int literal stays an int (``q_idx / -2`` divides as ints), without a value (``-1u`` is not -1)."""
    if a.value is not None and a.floaty:
        return _lit(-a.value)
    if a.negated is not None:
        return a.negated
    return _Term(f"-{_operand(a)}", UNARY_PRECEDENCE, floaty=a.floaty, negated=a)


def _add(a: _Term, b: _Term) -> _Term:
    if a.value is not None and b.value is not None:
        return _lit(a.value + b.value)
    if a.value == 0:
        return _as_float(b)
    if b.value == 0:
        return _as_float(a)
    return _sub(a, b.negated) if b.negated is not None else _binary("+", a, b)


def _sub(a: _Term, b: _Term) -> _Term:
    if a.value is not None and b.value is not None:
        return _lit(a.value - b.value)
    if a.value == 0:
        return _neg(_as_float(b))
    if b.value == 0:
        return _as_float(a)
    return _add(a, b.negated) if b.negated is not None else _binary("-", a, b)


def _mul(a: _Term, b: _Term) -> _Term:
    """``a * b``; one of the two is always a float term here, so a dropped ``1.0f`` leaves the other as float."""
    if a.value == 0 or b.value == 0:
        return _ZERO
    if a.value in (1, -1):
        return _as_float(b) if a.value == 1 else _neg(_as_float(b))
    if b.value in (1, -1):
        return _as_float(a) if b.value == 1 else _neg(_as_float(a))
    return _binary("*", a, b)


def _div(a: _Term, b: _Term) -> _Term:
    """``a / b`` for a float numerator ``a`` (a derivative), so C divides in float."""
    if a.value == 0:
        return _ZERO
    return _as_float(a) if b.value == 1 else _binary("/", a, b)


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Index):
        return (node.index,)
    if isinstance(node, (Unary, Cast)):
        return (node.operand,)
    if isinstance(node, Binary):
        return node.left, node.right
    if isinstance(node, Cond):
        return node.cond, node.then, node.other
    if isinstance(node, Call):
        return node.args
    return ()


def _depends(node: Node, name: str) -> bool:
    if isinstance(node, Name):
        return node.name == name
    return any(_depends(child, name) for child in _children(node))


def depends_on(expr: CExpr, name: str) -> bool:
    """Whether the variable ``name`` occurs in ``expr`` (a capture of that name indexed, ``name[i]``, does not
    count: arrays are constants here). Textual: ``score - score`` depends on score."""
    return _depends(expr.tree, name)


class _Differentiator:
    """d/d``name`` of the nodes of one tree, printed as :class:`_Term`; raises :class:`_Underivable`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def source(self, node: Node) -> _Term:
        """A node of the original, printed back to C (literals as their values: ``0x10`` prints ``16``)."""
        if isinstance(node, Num):
            if node.type == FLOAT:
                return _lit(node.value)
            return _Term(f"{node.value}{'u' * (node.type == UNSIGNED)}", value=node.value, floaty=False)
        if isinstance(node, Name):
            return _Term(node.name, floaty=node.name == self.name)
        if isinstance(node, Index):
            return _Term(f"{node.array}[{self.source(node.index).text}]", floaty=False)
        if isinstance(node, Unary):
            inner = self.source(node.operand)
            if node.op == "-" and isinstance(node.operand, Num) and node.operand.type == INT:
                return replace(_neg(inner), value=-node.operand.value)  # -2 is the int -2 (-1u is not -1)
            if node.op == "-":
                return _neg(inner)
            floaty = node.op == "+" and inner.floaty
            return _Term(f"{node.op}{_operand(inner)}", UNARY_PRECEDENCE, inner.value if floaty else None, floaty)
        if isinstance(node, Binary):
            left, right = self.source(node.left), self.source(node.right)
            return _binary(node.op, left, right, node.op in ("+", "-", "*", "/") and (left.floaty or right.floaty))
        if isinstance(node, Cond):
            return _ternary(self.source(node.cond), self.source(node.then), self.source(node.other))
        if isinstance(node, Call):
            args = [self.source(a) for a in node.args]
            floaty = node.func not in ("abs", "min", "max") or any(a.floaty for a in args)
            return _call(node.func, *args, floaty=floaty)
        keyword = _CAST_KEYWORD.get(node.type, "int")
        return _Term(f"({keyword}){_operand(self.source(node.operand))}", UNARY_PRECEDENCE, floaty=node.type == FLOAT)

    def d(self, node: Node) -> _Term:
        """The derivative of ``node``, a float term (0 where ``node`` does not depend on the variable)."""
        if not _depends(node, self.name):
            return _ZERO
        if isinstance(node, Name):
            return _ONE
        if isinstance(node, Unary) and node.op in ("+", "-"):
            inner = self.d(node.operand)
            return _neg(inner) if node.op == "-" else inner
        if isinstance(node, Cast) and node.type == FLOAT:
            return self.d(node.operand)
        if isinstance(node, Cond):  # piecewise: each branch's derivative where C takes it
            return _pick(self.source(node.cond), self.d(node.then), self.d(node.other))
        if isinstance(node, Binary) and node.op in ("+", "-", "*", "/"):
            return self.binary(node)
        if isinstance(node, Call):
            return self.call(node)
        raise _Underivable  # an index, ! ~, (int), comparisons, logic, integer operators of the variable

    def binary(self, node: Binary) -> _Term:
        l_, r = node.left, node.right
        if node.op == "+":
            return _add(self.d(l_), self.d(r))
        if node.op == "-":
            return _sub(self.d(l_), self.d(r))
        if node.op == "*":
            return _add(_mul(self.d(l_), self.source(r)), _mul(self.source(l_), self.d(r)))
        if not _depends(r, self.name):
            return _div(self.d(l_), self.source(r))
        right = self.source(r)
        top = _sub(_mul(self.d(l_), right), _mul(self.source(l_), self.d(r)))
        return _div(top, _binary("*", right, right))

    def call(self, node: Call) -> _Term:
        family = node.func.removesuffix("f")  # fabsf -> fabs, exp2f -> exp2, fminf -> fmin
        f = "f" if node.func.endswith("f") else ""
        if family in ("fmin", "fmax", "min", "max"):  # at a tie (a kink), the first argument's slope
            a, b = node.args
            picks_a = _binary("<=" if family.endswith("min") else ">=", self.source(a), self.source(b), False)
            return _pick(picks_a, self.d(a), self.d(b))
        if family == "pow":
            base, exponent = node.args
            if _depends(exponent, self.name):
                raise _Underivable
            k, u = self.source(exponent), self.source(base)
            power = _binary("-", k, _ONE) if k.value is None else _lit(k.value - 1.0)  # powf(u, 1.0f) prints u
            outer = u if power.value == 1 else _ONE if power.value == 0 else _call(node.func, u, power)
            return _mul(_mul(k, outer), self.d(base))
        if family == "fmod":  # x - trunc(x / y) * y: slope 1 in x between the jumps, for a y free of the variable
            if _depends(node.args[1], self.name):
                raise _Underivable
            return self.d(node.args[0])
        (u,) = node.args
        du, value, arg = self.d(u), self.source(node), self.source(u)
        if family == "tanh":
            return _mul(_sub(_ONE, _binary("*", value, value)), du)
        if family == "exp":
            return _mul(value, du)
        if family == "exp2":
            return _mul(_mul(value, _lit(_LN2)), du)
        if family == "log":
            return _div(du, arg)
        if family == "log2":
            return _div(du, _binary("*", arg, _lit(_LN2)))
        if family == "sqrt":
            return _div(du, _binary("*", _TWO, value))
        if family == "sin":
            return _mul(_call(f"cos{f}", arg), du)
        if family == "cos":
            return _mul(_neg(_call(f"sin{f}", arg)), du)
        if family in ("fabs", "abs"):
            sign = _ternary(_binary(">", arg, _ZERO, False), _ONE,
                            _ternary(_binary("<", arg, _ZERO, False), _lit(-1.0), _ZERO))
            return _mul(sign, du)
        raise _Underivable  # floorf, ceilf: steps


def derivative(expr: CExpr, name: str = "score") -> str | None:
    """C text of d ``expr`` / d ``name``, the float variable ``name``; ``"0.0f"`` where ``expr`` does not depend on
    it, None where this module cannot write the derivative.

    Rules: sums, differences, products, quotients, unary ``-`` and ``+``, ``(float)`` and ``(double)`` casts;
    ``tanh exp exp2 log log2 sqrt sin cos fabs abs`` (each with or without the ``f``), ``pow`` with an exponent
    free of ``name``, ``fmod`` with a divisor free of it; ``fmin fmax min max`` and ``c ? a : b`` are piecewise,
    the branch C takes: ``a <= b ? a' : b'`` for min (the first argument on a tie, as the evaluator picks), and
    ``c ? a' : b'`` (the condition is not differentiated: the derivative is one-sided at the switch, and a jump
    there has none; where ``b`` is nan, fminf returns ``a`` but the comparison picks ``b'``). ``fabsf(x)`` gives
    ``x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f)`` times ``x'``. Constants, other variables and captured-array
    reads free of ``name`` are constants. The text drops ``0 *``, ``* 1`` and ``+ 0`` (``score - slopes[h] *
    abs(q_idx - kv_idx)`` gives ``1.0f``) and may repeat a subexpression (``tanhf(u) * tanhf(u)``).

    None, where ``name`` occurs: in an array index (a gather has no derivative we can write); in ``pow``'s exponent
    or ``fmod``'s divisor (not implemented); under ``(int)``/``(unsigned)`` casts, ``floorf``/``ceilf``,
    comparisons used as values, ``!``, ``&&``, ``||`` or integer operators. Those are steps: the derivative is 0
    almost everywhere, but writing 0 would silently drop a term where the user more likely meant something smooth
    or a ternary, so the caller asks the user for ``score_grad`` instead. Also None where a literal is out of a
    double's range (no C literal prints inf)."""
    try:
        return _Differentiator(name).d(expr.tree).text
    except _Underivable:
        return None
