"""The description of a programmable variant that plans carry (:class:`Mods`; what it means and how the kernels,
the simulator and the model use it: :mod:`iokernels.plan.mods`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cexpr import CExpr, parse

VARIABLES = ("b", "h", "q_idx", "kv_idx", "n_q", "n_k")  # the ints an expression reads (and score, a float)


@dataclass(frozen=True)
class Mods:
    """A variant's expressions (module docstring), its captured arrays' names and C types in slot order, and the
    bytes of them a plan's kernel reads (None: their values were not given)."""

    mask_mod: str | None = None
    score_mod: str | None = None
    score_grad: str | None = None
    captures: tuple[tuple[str, str], ...] = ()
    capture_bytes: int | None = None
    # the captured arrays' values on the host, (name, dtype, bytes), where the plan was made with them: the
    # simulator's and compare's inputs (the library's plans carry none: its arrays come with each call)
    values: tuple[tuple[str, str, bytes], ...] = ()

    def host_values(self) -> dict[str, np.ndarray]:
        """The captured arrays the plan was made with (:attr:`values`), by name."""
        return {name: np.frombuffer(raw, dtype=np.dtype(dtype)) for name, dtype, raw in self.values}

    def parsed(self) -> dict[str, CExpr]:
        """The expressions given, parsed (ExprError, a ValueError, for a bad one)."""
        arrays = [n for n, _ in self.captures]
        out = {}
        for what in ("mask_mod", "score_mod", "score_grad"):
            text = getattr(self, what)
            if text is not None:
                out[what] = parse(text, VARIABLES + (() if what == "mask_mod" else ("score",)), arrays, what)
        return out

    def prefetch(self) -> tuple[int, str, str] | None:
        """The read the forward prefetches into the L2 a tile ahead (MOD_PREFETCH, common.cuh), as (capture slot, C
        type, index expression): that of a mask_mod ``X[i] != 0`` (or ``X[i]``), else, with no mask_mod, of a
        score_mod ``score + X[i]``, i not reading score (an explicit mask's forms, :meth:`CExpr.single_read`); None
        for any other variant."""
        parsed = self.parsed()
        what, form = ("mask_mod", "mask") if self.mask_mod is not None else ("score_mod", "bias")
        read = parsed[what].single_read() if what in parsed else None
        if read is None or read[0] != form:
            return None
        names = [n for n, _ in self.captures]
        if "score" in parse(read[2], (*VARIABLES, "score"), names).names:
            return None
        slot = names.index(read[1])
        return slot, self.captures[slot][1], read[2]

    def defines(self, direction: str) -> tuple[tuple[str, str], ...]:
        """The main stage's defines: each expression on one line, the captures' declarations, and in the forward the
        read :meth:`prefetch` finds."""
        out = [(name.upper(), " ".join(getattr(self, name).split()))
               for name in ("mask_mod", "score_mod") + (("score_grad",) if direction == "bwd" else ())
               if getattr(self, name) is not None]
        prefetch = self.prefetch() if direction == "fwd" else None
        if prefetch is not None:
            out += [("MOD_PREFETCH", " ".join(prefetch[2].split())), ("MOD_PREFETCH_SLOT", str(prefetch[0])),
                    ("MOD_PREFETCH_T", prefetch[1])]
        if self.captures:
            out.append(("MOD_CAPS", " ".join(f"IOK_CAP({ctype}, {name}, {i})"
                                             for i, (name, ctype) in enumerate(self.captures))))
        return tuple(out)

    def check_source(self) -> str:
        """A small CUDA translation unit with each expression in a function of its own, after a ``#line 1
        "<name>"`` directive: NVRTC's message for a bad one names it and its line (:func:`iokernels.library.mods`
        compiles it before any kernel)."""
        lines = ["#include <cuda_fp16.h>",
                 "template <typename E> struct IokCapValue { using type = E; };",
                 "template <> struct IokCapValue<__half> { using type = float; };",
                 "template <typename E> struct IokCap { const E* p; __device__ typename IokCapValue<E>::type "
                 "operator[](long long i) const { return p[i]; } };"]
        params = ", ".join(["int b, int h, int q_idx, int kv_idx, int n_q, int n_k, float score",
                            *(f"IokCap<{ctype}> {name}" for name, ctype in self.captures)])
        for what in ("mask_mod", "score_mod", "score_grad"):
            if getattr(self, what) is not None:
                lines += [f"__device__ float iok_check_{what}({params})", "{", f'#line 1 "{what}"',
                          f"return static_cast<float>({getattr(self, what)});", "}"]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"mask_mod": self.mask_mod, "score_mod": self.score_mod, "score_grad": self.score_grad,
                "captures": [list(c) for c in self.captures], "capture_bytes": self.capture_bytes}
