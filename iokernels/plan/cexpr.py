"""CUDA C expressions on the CPU: a ``score_mod``, ``mask_mod`` or ``score_grad`` evaluated as the GPU runs it.

Users write these as single C expressions over ``b, h, q_idx, kv_idx`` (ints), ``score`` (a float; not in a
mask_mod), named scalar constants, and named read-only captured 1-D arrays indexed like ``doc[q_idx]``. The
kernels paste the text into their source. :func:`parse` reads the same text, and :meth:`CExpr.evaluate`
computes it with numpy over broadcast grids (``q_idx`` of shape (N, 1), ``kv_idx`` of shape (1, M), ...) for
the float64 reference and the simulator. It also counts the captured-array element reads the GPU executes,
with C's short circuits (``a && b``, ``a || b`` and ``c ? x : y`` evaluate ``b``, ``x``, ``y`` only where
needed), because the counting build's bytes are those reads.

C semantics kept: integer ``/`` truncates toward zero and ``%`` takes the dividend's sign (``-7 / 2 == -3``,
``-7 % 2 == -1``); int op float promotes to float; comparisons and ``! && ||`` give int 0 or 1; ``?:``
converts its branches to their common type; ``&``, ``|``, ``^``, ``~``, ``<<``, ``>>`` and ``%`` take integers
only, as C does; ``0x``, octal (``010`` is 8) and ``u``/``l`` suffixed literals. ``unsigned`` (a
``(unsigned)`` cast, a ``u`` suffix, a hex or octal literal above INT_MAX) is 32 bits and wraps, with C's
conversions (``-1 < 0u`` is 0), so ``(unsigned)(q_idx - kv_idx) < 256u`` is the window it is on the GPU.

Deliberate differences: float arithmetic is float64 (the reference's precision: ``0.1f`` is the double 0.1)
and int arithmetic is int64, so the two differ where the GPU's 32-bit int overflows (undefined behaviour in
C); ``l`` literals are int64 and mix with unsigned as int does. Types are known only at evaluation (a
variable's is its value's dtype), so type errors such as ``score % 2`` are raised by :meth:`CExpr.evaluate`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

INT, UNSIGNED, FLOAT = "int", "unsigned", "float"
_DTYPES = {INT: np.int64, UNSIGNED: np.int64, FLOAT: np.float64}  # unsigned values are kept in [0, 2^32)
_U32 = 0xFFFFFFFF
_INT_MAX = 2**31 - 1
_CASTS = {"float": FLOAT, "double": FLOAT, "int": INT, "unsigned": UNSIGNED}

# binding powers, C's precedence from loosest to tightest; all binary operators associate left
_TERNARY = 2
_BINARY = {"||": 3, "&&": 4, "|": 5, "^": 6, "&": 7, "==": 8, "!=": 8, "<": 9, "<=": 9, ">": 9, ">=": 9,
           "<<": 10, ">>": 10, "+": 11, "-": 11, "*": 12, "/": 12, "%": 12}
_UNARY = 13
_INTEGER_ONLY = {"%", "&", "|", "^", "<<", ">>"}
_COMPARE = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
            ">=": np.greater_equal}
_ARITHMETIC = {"+": np.add, "-": np.subtract, "*": np.multiply, "&": np.bitwise_and, "|": np.bitwise_or,
               "^": np.bitwise_xor, "<<": np.left_shift, ">>": np.right_shift}

# functions of floats giving a float; abs, min and max keep C++'s overloads (int in, int out)
_FLOAT_FUNCTIONS = {
    "tanhf": np.tanh, "tanh": np.tanh, "expf": np.exp, "exp": np.exp, "exp2f": np.exp2, "exp2": np.exp2,
    "logf": np.log, "log": np.log, "log2f": np.log2, "log2": np.log2, "sqrtf": np.sqrt, "sqrt": np.sqrt,
    "fabsf": np.abs, "fabs": np.abs, "floorf": np.floor, "floor": np.floor, "ceilf": np.ceil, "ceil": np.ceil,
    "sinf": np.sin, "sin": np.sin, "cosf": np.cos, "cos": np.cos,
    "powf": np.power, "pow": np.power, "fminf": np.fmin, "fmin": np.fmin, "fmaxf": np.fmax, "fmax": np.fmax,
    "fmodf": np.fmod, "fmod": np.fmod,
}
_ARITY = {name: f.nin for name, f in _FLOAT_FUNCTIONS.items()} | {"abs": 1, "min": 2, "max": 2}

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>//|/\*)
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?|\d+[eE][+-]?\d+[fF]?)
  | (?P<int>(?:0[xX][0-9a-fA-F]+|\d+)[uUlL]*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<assign><<=|>>=|\+\+|--|[-+*/%&|^]=|=(?!=))
  | (?P<op>&&|\|\||<<|>>|<=|>=|==|!=|[-+*/%<>!~&|^?:()\[\],])
""", re.VERBOSE)
_NUMBER_TAIL = re.compile(r"[\w.]*")  # what may not follow a number ("1f", "1.0.5", "0x1p3")
_INT_SUFFIXES = {"": INT, "l": INT, "L": INT, "ll": INT, "LL": INT, "u": UNSIGNED, "U": UNSIGNED}


class ExprError(ValueError):
    """An expression we cannot evaluate as the GPU would; the message names the expression and ``column``."""

    def __init__(self, what: str, column: int, message: str) -> None:
        super().__init__(f"{what}: column {column}: {message}")
        self.what = what
        self.column = column


@dataclass(frozen=True)
class _Token:
    kind: str  # "num", "name", "op" or "end"
    text: str
    col: int
    value: int | float = 0
    type: str = INT


@dataclass(frozen=True)
class _Num:
    col: int
    value: int | float
    type: str


@dataclass(frozen=True)
class _Name:
    col: int
    name: str


@dataclass(frozen=True)
class _Index:
    col: int
    array: str
    index: _Node


@dataclass(frozen=True)
class _Unary:
    col: int
    op: str
    operand: _Node


@dataclass(frozen=True)
class _Binary:
    col: int
    op: str
    left: _Node
    right: _Node


@dataclass(frozen=True)
class _Cond:
    col: int
    cond: _Node
    then: _Node
    other: _Node


@dataclass(frozen=True)
class _Call:
    col: int
    func: str
    args: tuple[_Node, ...]


@dataclass(frozen=True)
class _Cast:
    col: int
    type: str
    operand: _Node


_Node = _Num | _Name | _Index | _Unary | _Binary | _Cond | _Call | _Cast

# Public names for the modules that walk a CExpr.tree (cderiv differentiates it): node types and binding powers.
Node = _Node
Num, Name, Index, Unary, Binary, Cond, Call, Cast = _Num, _Name, _Index, _Unary, _Binary, _Cond, _Call, _Cast
BINARY_PRECEDENCE, TERNARY_PRECEDENCE, UNARY_PRECEDENCE = _BINARY, _TERNARY, _UNARY


def _tokens(text: str, what: str) -> list[_Token]:
    """The tokens of ``text``, refusing what makes it more than one expression (``;``, assignments, comments)."""
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos + 1
        if m is None:
            char = text[pos]
            if char == ";":
                raise ExprError(what, col, "';' ends a statement: give a single expression")
            raise ExprError(what, col, f"unexpected character {char!r}")
        kind, word = m.lastgroup, m.group()
        pos = m.end()
        if kind == "comment":
            raise ExprError(what, col, "comments are not allowed in an expression")
        if kind == "assign":
            hint = " (comparison is '==')" if word == "=" else ""
            raise ExprError(what, col, f"'{word}' assigns: give an expression, not a statement{hint}")
        if kind in ("float", "int"):
            tail = _NUMBER_TAIL.match(text, pos).group()
            if tail:
                raise ExprError(what, col, f"malformed number '{word + tail}'")
            if kind == "int":
                out.append(_number(word, col, what))
            else:
                out.append(_Token("num", word, col, float(word.rstrip("fF")), FLOAT))
        elif kind != "space":
            out.append(_Token("name" if kind == "name" else "op", word, col))
    out.append(_Token("end", "end of the expression", len(text) + 1))
    return out


def _number(word: str, col: int, what: str) -> _Token:
    """An integer literal with C's type: int, or unsigned for a ``u`` suffix or a hex/octal one above INT_MAX."""
    digits = word.rstrip("uUlL")
    suffix = word[len(digits):]
    if suffix not in _INT_SUFFIXES:
        raise ExprError(what, col, f"integer suffix '{suffix}' is not supported (only u, l, ll)")
    if digits[:2].lower() == "0x":
        value = int(digits, 16)
    elif digits.startswith("0") and len(digits) > 1:
        if not digits.isdigit() or "8" in digits or "9" in digits:
            raise ExprError(what, col, f"invalid octal literal '{digits}' (a leading 0 means octal in C)")
        value = int(digits, 8)
    else:
        value = int(digits)
    kind = _INT_SUFFIXES[suffix]
    if kind == UNSIGNED and value > _U32:
        raise ExprError(what, col, f"'{word}' is an unsigned long: 64-bit unsigned is not supported")
    if kind == INT and _INT_MAX < value <= _U32 and digits[0] == "0":
        kind = UNSIGNED
    if value >= 2**63:
        raise ExprError(what, col, f"integer literal '{word}' does not fit 64 bits")
    return _Token("num", word, col, value, kind)


class _Parser:
    """Precedence climbing over :data:`_BINARY`, with the ternary, unary operators, casts, calls and indexing."""

    def __init__(self, text: str, variables: frozenset[str], arrays: frozenset[str], what: str) -> None:
        self.tokens = _tokens(text, what)
        self.pos = 0
        self.variables, self.arrays, self.what = variables, arrays, what
        self.columns: dict[str, int] = {}  # first column of each variable and capture used

    def error(self, token: _Token, message: str) -> ExprError:
        return ExprError(self.what, token.col, message)

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.pos += 1
        return token

    def expect(self, op: str, opener: _Token) -> None:
        token = self.take()
        if token.text != op or token.kind != "op":
            raise self.error(token, f"expected '{op}' for the '{opener.text}' at column {opener.col}, got "
                                    f"{_shown(token)}")

    def expression(self, min_bp: int = 0) -> _Node:
        left = self.operand()
        while True:
            token = self.peek()
            if token.kind != "op":
                return left
            if token.text == "?" and _TERNARY > min_bp:
                self.take()
                then = self.expression()
                self.expect(":", token)
                left = _Cond(token.col, left, then, self.expression(_TERNARY - 1))  # right-associative
            elif _BINARY.get(token.text, 0) > min_bp:
                self.take()
                left = _Binary(token.col, token.text, left, self.expression(_BINARY[token.text]))
            else:
                return left

    def operand(self) -> _Node:
        token = self.take()
        if token.kind == "num":
            return _Num(token.col, token.value, token.type)
        if token.kind == "name":
            return self.named(token)
        if token.text in ("-", "+", "!", "~"):
            return _Unary(token.col, token.text, self.expression(_UNARY))
        if token.text == "(":
            if self.peek().text in _CASTS and self.peek(1).text == ")":
                to = _CASTS[self.take().text]
                self.take()
                return _Cast(token.col, to, self.expression(_UNARY))
            inner = self.expression()
            closer = self.take()
            if closer.text != ")":
                raise self.error(closer, f"missing ')' to close the '(' at column {token.col}, got {_shown(closer)}")
            return inner
        if token.kind == "end":
            raise self.error(token, "the expression ends where an operand is expected")
        raise self.error(token, f"expected an operand, got '{token.text}'")

    def named(self, token: _Token) -> _Node:
        name, after = token.text, self.peek()
        if after.text == "(" and name not in self.variables:
            if name not in _ARITY:
                raise self.error(token, f"unknown function '{name}'{_suggest(name, _ARITY)}")
            return self.call(token)
        if name in self.arrays:
            if after.text != "[":
                raise self.error(token, f"capture '{name}' must be indexed, as {name}[...]")
            self.take()
            index = self.expression()
            self.expect("]", after)
            self.columns.setdefault(name, token.col)
            return _Index(token.col, name, index)
        if name in self.variables:
            if after.text == "(":
                raise self.error(token, f"'{name}' is not a function")
            if after.text == "[":
                arrays = ", ".join(sorted(self.arrays)) or "none"
                raise self.error(token, f"'{name}' is not a captured array (arrays: {arrays})")
            self.columns.setdefault(name, token.col)
            return _Name(token.col, name)
        if name in _ARITY:
            raise self.error(token, f"function '{name}' must be called, as {name}(...)")
        if name in _CASTS:
            raise self.error(token, f"type name '{name}' outside a cast: (float), (double), (int) or (unsigned)")
        raise self.error(token, f"unknown name '{name}'{_suggest(name, self.variables | self.arrays)}")

    def call(self, token: _Token) -> _Call:
        opener = self.take()
        args: list[_Node] = []
        if self.peek().text != ")":
            args.append(self.expression())
            while self.peek().text == ",":
                self.take()
                args.append(self.expression())
        self.expect(")", opener)
        want = _ARITY[token.text]
        if len(args) != want:
            raise self.error(token, f"{token.text} takes {want} argument{'s' * (want > 1)}, got {len(args)}")
        return _Call(token.col, token.text, tuple(args))


def _shown(token: _Token) -> str:
    return "the end of the expression" if token.kind == "end" else f"'{token.text}'"


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


@dataclass(frozen=True)
class CExpr:
    """A parsed C expression: its text (the C source as given), the variables and constants it uses (``names``),
    the captured arrays it indexes (``captures``), and the tree :meth:`evaluate` walks."""

    text: str
    names: frozenset[str]
    captures: frozenset[str]
    tree: _Node = field(repr=False, compare=False)
    what: str = field(default="expression", compare=False)
    columns: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)

    def evaluate(self, env: Mapping[str, np.ndarray | int | float], arrays: Mapping[str, np.ndarray],
                 active: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int]]:
        """The expression's value at every element of the grid, and the captured-array element reads executed.

        ``env`` gives each name in :attr:`names` a scalar or an array; together with ``active`` their shapes
        broadcast to the grid's. An integer or bool dtype makes the name a C int, a float dtype a float.
        ``arrays`` gives each capture a 1-D array. ``active`` (bool, broadcastable; default everywhere) marks
        the elements where the GPU evaluates the expression at all. Reads are counted per element that reaches
        them (C short circuits included); an index out of range or an integer division by zero raises
        :class:`ExprError` only there. Returns a read-only array of the grid's shape (a broadcast view: copy
        it to write), int64 or float64 (unsigned values in [0, 2^32)), 0 at inactive elements, and a dict of
        reads per capture."""
        shapes = [np.shape(v) for v in env.values()] + ([np.shape(active)] if active is not None else [])
        try:
            shape = np.broadcast_shapes(*shapes)
        except ValueError as e:
            raise ValueError(f"{self.what}: the shapes of env and active do not broadcast: {shapes}") from e
        run = _Evaluation(self, env, arrays, int(np.prod(shape)))
        mask = None if active is None else np.asarray(active, dtype=bool)
        with np.errstate(all="ignore"):  # values on untaken branches may be inf, nan or garbage: C never sees them
            kind = run.typecheck(self.tree)
            value = _convert(run.branch(self.tree, mask), kind, kind)
            if mask is not None:
                value = np.where(mask, value, np.zeros((), _DTYPES[kind]))
        return np.broadcast_to(value, shape), run.reads

    def single_read(self) -> tuple[str, str, str] | None:
        """The one captured read of an explicit mask's forms, (form, array, the index's text): ("bias", X, i) for
        ``score + X[i]``, ("mask", X, i) for ``X[i] != 0`` or ``X[i]``; None for any other expression."""
        t = self.tree
        form = "bias" if isinstance(t, _Binary) and t.op == "+" and t.left == _Name(t.left.col, "score") else "mask"
        if isinstance(t, _Binary) and (form == "bias" or (t.op == "!=" and t.right == _Num(t.right.col, 0, INT))):
            t = t.right if form == "bias" else t.left
        start, depth = (t.col - 1 + len(t.array), 0) if isinstance(t, _Index) else (len(self.text), 0)
        for end in range(start, len(self.text)):  # from the "[" after the array's name (columns are 1-based)
            depth += {"[": 1, "]": -1}.get(self.text[end], 0)
            if depth == 0:
                return form, t.array, self.text[start + 1:end].strip()
        return None

    def minus(self, name: str) -> str | None:
        """L of an expression ``L + name`` whose L does not read ``name`` (``q_idx * 8 + kv_idx``), else None."""
        t = self.tree
        ok = isinstance(t, _Binary) and t.op == "+" and t.right == _Name(t.right.col, name)
        left = self.text[:t.col - 1].strip() if ok else ""  # (the top "+" at 1-based column col)
        return left if ok and not re.search(rf"\b{re.escape(name)}\b", left) else None


def parse(text: str, variables: Iterable[str], arrays: Iterable[str] = (), what: str = "expression") -> CExpr:
    """Parse one C expression over ``variables`` (ints, floats, named constants) and captured ``arrays``.

    ``what`` names the expression in error messages ("score_mod"). Raises :class:`ExprError` (with the column)
    for anything the GPU would not compile as one expression, or that this module does not model: unknown
    names or functions, wrong arity, indexing a non-array, unbalanced brackets, trailing tokens, statements,
    assignments, comments."""
    variables, arrays = frozenset(variables), frozenset(arrays)
    if variables & arrays:
        raise ValueError(f"{what}: names both variables and arrays: {sorted(variables & arrays)}")
    parser = _Parser(text, variables, arrays, what)
    if parser.peek().kind == "end":
        raise parser.error(parser.peek(), "empty expression")
    tree = parser.expression()
    rest = parser.peek()
    if rest.kind != "end":
        problem = "unbalanced ')'" if rest.text == ")" else f"unexpected '{rest.text}' after the expression"
        raise parser.error(rest, problem)
    used = frozenset(parser.columns)
    return CExpr(text, used & variables, used & arrays, tree, what, dict(parser.columns))


def _common(a: str, b: str) -> str:
    """C's usual arithmetic conversions on our three types."""
    return FLOAT if FLOAT in (a, b) else UNSIGNED if UNSIGNED in (a, b) else INT


def _convert(v: np.ndarray, src: str, dst: str) -> np.ndarray:
    """``v`` of C type ``src`` as C converts it to ``dst`` (comparisons' bools become int64 here)."""
    if dst == FLOAT:
        return v.astype(np.float64, copy=False)
    if src == FLOAT or v.dtype == bool:
        v = v.astype(np.int64)  # truncates toward zero, as C does
    if dst == UNSIGNED and src != UNSIGNED:
        return v & _U32
    if dst == INT and src == UNSIGNED:
        return (v ^ 0x80000000) - 0x80000000  # two's complement: the values above INT_MAX are negative
    return v


def _truth(v: np.ndarray) -> np.ndarray:
    return v if v.dtype == bool else v != 0


class _Evaluation:
    """One :meth:`CExpr.evaluate`: the operands' values and types, and the reads counted so far.

    A mask is None (every element of the grid) or a bool array broadcastable to the grid with some element
    True: the elements where the node is evaluated. Values are computed on the operands' own broadcast
    shapes, everywhere; masks decide only which reads count and which errors are raised."""

    def __init__(self, expr: CExpr, env: Mapping[str, object], arrays: Mapping[str, object], size: int) -> None:
        self.expr, self.size = expr, size
        self.reads = dict.fromkeys(sorted(expr.captures), 0)
        self.values = {name: self.operand(name, env, "no value for") for name in expr.names}
        self.arrays = {name: self.operand(name, arrays, "no array for capture") for name in expr.captures}
        for name, (array, _) in self.arrays.items():
            if array.ndim != 1:
                raise self.error(self.expr.columns[name], f"capture '{name}' must be 1-D, got shape {array.shape}")
        self.types: dict[int, str] = {}

    def error(self, column: int, message: str) -> ExprError:
        return ExprError(self.expr.what, column, message)

    def operand(self, name: str, given: Mapping[str, object], missing: str) -> tuple[np.ndarray, str]:
        if name not in given:
            raise self.error(self.expr.columns[name], f"{missing} '{name}'")
        v = np.asarray(given[name])
        if v.dtype.kind in "biu":
            return v.astype(np.int64, copy=False), INT
        if v.dtype.kind == "f":
            return v.astype(np.float64, copy=False), FLOAT
        raise self.error(self.expr.columns[name], f"'{name}' has dtype {v.dtype}: give integers or floats")

    def typecheck(self, node: _Node) -> str:
        """The C type of ``node`` (kept in ``types`` for :meth:`branch`), refusing what C would not compile."""
        if isinstance(node, _Num):
            kind = node.type
        elif isinstance(node, _Name):
            kind = self.values[node.name][1]
        elif isinstance(node, _Index):
            if self.typecheck(node.index) == FLOAT:
                raise self.error(node.col, f"the index of '{node.array}' must be an integer")
            kind = self.arrays[node.array][1]
        elif isinstance(node, _Unary):
            kind = self.typecheck(node.operand)
            if node.op == "~" and kind == FLOAT:
                raise self.error(node.col, "'~' needs an integer operand")
            kind = INT if node.op == "!" else kind
        elif isinstance(node, _Binary):
            left, right = self.typecheck(node.left), self.typecheck(node.right)
            if node.op in _INTEGER_ONLY and FLOAT in (left, right):
                hint = " (for floats, fmodf)" if node.op == "%" else ""
                raise self.error(node.col, f"'{node.op}' needs integer operands{hint}")
            if node.op in _COMPARE or node.op in ("&&", "||"):
                kind = INT
            else:
                kind = left if node.op in ("<<", ">>") else _common(left, right)
        elif isinstance(node, _Cond):
            self.typecheck(node.cond)
            kind = _common(self.typecheck(node.then), self.typecheck(node.other))
        elif isinstance(node, _Call):
            kinds = [self.typecheck(a) for a in node.args]
            if node.func == "abs" and kinds[0] == UNSIGNED:
                raise self.error(node.col, "abs of an unsigned value is ambiguous in C++")
            kind = FLOAT if node.func in _FLOAT_FUNCTIONS else kinds[0] if node.func == "abs" else _common(*kinds)
        else:
            self.typecheck(node.operand)
            kind = node.type
        self.types[id(node)] = kind
        return kind

    def count(self, mask: np.ndarray | None) -> int:
        """How many grid elements ``mask`` covers (it repeats along the axes it broadcasts)."""
        if mask is None or mask.size == 0:
            return self.size if mask is None else 0
        return int(np.count_nonzero(mask)) * (self.size // mask.size)

    def failing(self, bad: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
        """Where ``bad`` holds within ``mask`` (broadcast together), or None where it holds nowhere there."""
        if not bad.any():
            return None
        hit = bad if mask is None else bad & mask
        return hit if hit.any() else None

    def branch(self, node: _Node, mask: np.ndarray | None) -> np.ndarray:
        """The value of a node evaluated only where ``mask`` holds: nothing at all (a zero) where it is empty."""
        if mask is not None and not mask.any():
            return np.zeros((), _DTYPES[self.types[id(node)]])
        return self.value(node, mask)

    def typed(self, node: _Node, mask: np.ndarray | None, to: str) -> np.ndarray:
        return _convert(self.value(node, mask), self.types[id(node)], to)

    def value(self, node: _Node, mask: np.ndarray | None) -> np.ndarray:
        kind = self.types[id(node)]
        if isinstance(node, _Num):
            return np.asarray(node.value, _DTYPES[kind])
        if isinstance(node, _Name):
            return self.values[node.name][0]
        if isinstance(node, _Index):
            return self.index(node, mask)
        if isinstance(node, _Unary):
            if node.op == "!":
                return np.logical_not(_truth(self.value(node.operand, mask)))
            v = self.typed(node.operand, mask, kind)
            v = -v if node.op == "-" else ~v if node.op == "~" else v
            return v & _U32 if kind == UNSIGNED else v
        if isinstance(node, _Binary):
            return self.binary(node, kind, mask)
        if isinstance(node, _Cond):
            cond = _truth(self.value(node.cond, mask))
            then = _convert(self.branch(node.then, _within(mask, cond)), self.types[id(node.then)], kind)
            other = self.branch(node.other, _within(mask, np.logical_not(cond)))
            return np.where(cond, then, _convert(other, self.types[id(node.other)], kind))
        if isinstance(node, _Call):
            return self.call(node, kind, mask)
        return self.typed(node.operand, mask, kind)

    def index(self, node: _Index, mask: np.ndarray | None) -> np.ndarray:
        i = self.typed(node.index, mask, INT)
        array = self.arrays[node.array][0]
        n = len(array)
        hit = self.failing((i < 0) | (i >= n), mask)
        if hit is not None:
            at = np.broadcast_to(i, hit.shape)[np.unravel_index(int(np.argmax(hit)), hit.shape)]
            raise self.error(node.col, f"capture '{node.array}' indexed at {at}, it has {n} elements")
        self.reads[node.array] += self.count(mask)
        return array[np.clip(i, 0, n - 1)]

    def binary(self, node: _Binary, kind: str, mask: np.ndarray | None) -> np.ndarray:
        op = node.op
        if op in ("&&", "||"):
            left = _truth(self.value(node.left, mask))
            rest = _within(mask, left if op == "&&" else np.logical_not(left))
            right = _truth(self.branch(node.right, rest))
            return left & right if op == "&&" else left | right
        if op in _COMPARE:
            kind = _common(self.types[id(node.left)], self.types[id(node.right)])
        x = self.typed(node.left, mask, kind)
        y = self.typed(node.right, mask, INT if op in ("<<", ">>") else kind)
        if op in _COMPARE:
            return _COMPARE[op](x, y)
        if op in ("/", "%") and kind == FLOAT:
            return x / y
        if op in ("/", "%"):
            zero = y == 0
            if self.failing(zero, mask) is not None:
                raise self.error(node.col, f"integer {'division' if op == '/' else 'remainder'} by zero")
            y = np.where(zero, 1, y)
            r = np.fmod(x, y)  # C's remainder: the dividend's sign
            return r if op == "%" else (x - r) // y
        v = _ARITHMETIC[op](x, y)
        return v & _U32 if kind == UNSIGNED else v

    def call(self, node: _Call, kind: str, mask: np.ndarray | None) -> np.ndarray:
        if node.func in _FLOAT_FUNCTIONS:
            return _FLOAT_FUNCTIONS[node.func](*(self.typed(a, mask, FLOAT) for a in node.args))
        args = [self.typed(a, mask, kind) for a in node.args]
        if node.func == "abs":
            return np.abs(args[0])
        if kind == FLOAT:  # CUDA's min and max of floats are fminf and fmaxf
            return (np.fmin if node.func == "min" else np.fmax)(*args)
        return (np.minimum if node.func == "min" else np.maximum)(*args)


def _within(mask: np.ndarray | None, cond: np.ndarray) -> np.ndarray:
    """The elements of ``mask`` where ``cond`` holds."""
    cond = np.asarray(cond)
    return cond if mask is None else mask & cond
