"""Programmable variants (issue #22): ``mask_mod``, ``score_mod`` and its derivative ``score_grad`` given as CUDA C
expressions and compiled into the sm_90 tma forward and backward (kernels/common.cuh ``iok_mod_s``, wg_bwd.cuh
``wgb_mods``).

An expression is one C expression over the ints ``b``, ``h`` (the batch and the query head), ``q_idx``, ``kv_idx`` (the
element's query and key), ``n_q``, ``n_k`` and, in ``score_mod`` and ``score_grad``, the float ``score`` (τ q·k, the
logit before the mod); it may index up to :data:`MAX_CAPTURES` captured 1-d arrays by name (``doc[q_idx]``), int32,
int64, uint8, float16 (read as a float) or float32. ``mask_mod`` keeps an element where it is nonzero (FlexAttention's);
``score_mod`` returns the new logit; ``score_grad`` is d score_mod / d score at the same score, derived from score_mod
where left out (:func:`iokernels.plan.cderiv.derivative`; none needed where it is 1, as for a bias). The kernels
evaluate, for every element of a tile they compute (a query or key past the problem's end with the last one's index):
mask_mod (not in a block the block mask marks full, see :func:`mod_block_mask`), then where it keeps the element
score_mod and, in the backward, score_grad. A captured element read is counted (tensor ``captures``, its itemsize each);
the model takes those bytes from the same evaluation on the CPU (:func:`capture_bytes`, :mod:`iokernels.plan.cexpr`),
when the plan was made with the captured arrays' values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from .cderiv import derivative
from .cexpr import parse
from .core import Plan, Unsupported
from .fast_bwd import KERNEL_TMA
from .masks import BlockMask
from .modspec import VARIABLES, Mods
from .units import cdiv

MOD_KERNELS = ("flash_tma_fwd", KERNEL_TMA)
MOD_D_MAX = 128  # the narrow backward's tiles, and the forward's consumers' registers
MAX_CAPTURES = 4  # capture addresses a kernel takes (common.cuh IOK_MOD_PARAM)
MOD_DEFINES = ("MASK_MOD", "SCORE_MOD", "MOD_STAGE")  # the variant's defines: any makes a kernel take the captures
MOD_BLOCK_THREADS = 256  # kernels/mod_blocks.cu's threads per block
CAPTURE_CTYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long", np.dtype(np.uint8): "unsigned char",
                  np.dtype(np.float16): "__half", np.dtype(np.float32): "float"}  # (a __half element reads as a float)


def capture_buffer(name: str) -> str:
    """The buffer (and input) name of a captured array: the kernels', the simulator's and the library's."""
    return f"cap_{name}"


def captures_of(mods: Mods | None, inputs: Mapping[str, object]) -> dict[str, object]:
    """The captured arrays among a run's inputs (by buffer name), by capture name (none without a variant)."""
    captures = () if mods is None else mods.captures
    return {name: inputs[capture_buffer(name)] for name, _ in captures if capture_buffer(name) in inputs}


def capture_inputs(mods: Mods, inputs: Mapping[str, object]) -> dict[str, object]:
    """The captured arrays among a launch's inputs (by buffer name), each a contiguous 1-d array of its planned type
    (ValueError otherwise)."""
    out = {}
    for name, ctype in mods.captures:
        x = inputs.get(capture_buffer(name))
        if x is None or x.ndim != 1 or CAPTURE_CTYPES.get(x.dtype) != ctype or not x.flags.c_contiguous:
            got = "none" if x is None else f"{x.dtype} {tuple(x.shape)}"
            raise ValueError(f"capture {name}: expected a contiguous 1-d array of C type {ctype}, got {got}")
        out[capture_buffer(name)] = x
    return out


def check_mods(mask_mod: str | None = None, score_mod: str | None = None, score_grad: str | None = None,
               captures: Mapping[str, object] | None = None) -> Mods | None:
    """The variant of these expressions (None: none given), each parsed (ExprError: the expression, the column and
    what is wrong); ``captures``: name -> a 1-d array (host or device; its dtype and name only are kept here).
    Without score_grad it is derived from score_mod (ValueError where it cannot be; left out where it is 1)."""
    for what, text in (("mask_mod", mask_mod), ("score_mod", score_mod), ("score_grad", score_grad)):
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise TypeError(f"{what} must be a C expression (a non-empty str) or None, got {text!r}")
    if mask_mod is None and score_mod is None:
        if score_grad is not None or captures:
            raise ValueError("score_grad and captures need a score_mod or a mask_mod")
        return None
    if score_grad is not None and score_mod is None:
        raise ValueError("score_grad is the derivative of score_mod: give score_mod too")
    caps = []
    for name, array in (captures or {}).items():
        dtype = np.dtype(array.dtype if hasattr(array, "dtype") else np.asarray(array).dtype)
        shape = tuple(getattr(array, "shape", np.shape(array)))
        if not isinstance(name, str) or not name.isidentifier() or name in (*VARIABLES, "score"):
            raise ValueError(f"capture name {name!r} must be an identifier other than {', '.join(VARIABLES)}, score")
        if dtype not in CAPTURE_CTYPES or len(shape) != 1 or shape[0] < 1:
            raise TypeError(f"capture {name!r} must be a non-empty 1-d array of int32, int64, uint8, float16 or "
                            f"float32, got {dtype} of shape {shape}")
        caps.append((name, CAPTURE_CTYPES[dtype]))
    if len(caps) > MAX_CAPTURES:
        raise ValueError(f"at most {MAX_CAPTURES} captured arrays, got {len(caps)}")
    mods = Mods(mask_mod, score_mod, score_grad, tuple(caps))
    parsed = mods.parsed()
    if score_mod is not None and score_grad is None:  # derived (iokernels.plan.cderiv); 1 needs no factor
        grad = derivative(parsed["score_mod"])
        if grad is None:
            raise ValueError(f"score_mod {score_mod!r}: its derivative in score is not derived for this form (a "
                             "comparison, an integer operation or an array indexed by score): give it as score_grad "
                             "(a C expression over the same names)")
        if grad != "1.0f":
            mods = Mods(mask_mod, score_mod, grad, tuple(caps))
    return mods


def with_mods(plan: Plan, mods: Mods | None, values: Mapping[str, object] | None = None) -> Plan:
    """``plan`` with the variant (None: unchanged): the defines on the main stage of the sm_90 tma forward or narrow
    backward (d up to :data:`MOD_D_MAX`, a block per work item, no softcap, ALiBi, dropout, explicit mask or window);
    any other plan raises Unsupported. ``values``: the captured arrays on the host, by name, for the model's bytes
    (:func:`capture_bytes`) and kept in the plan (``Mods.values``: the simulator's and compare's inputs); without
    them a plan with captures has no exact bytes."""
    if mods is None:
        return plan
    main = next((s for s in plan.stages if s.name == "main"), None)
    kernel = None if main is None else main.kernel
    if plan.schedule != "fast" or plan.variant or kernel not in MOD_KERNELS or dict(main.params).get("PERSISTENT") \
            or plan.d > MOD_D_MAX or plan.softcap is not None or plan.alibi is not None or plan.dropout is not None \
            or plan.mask is not None or plan.window is not None or plan.documents is not None:
        raise Unsupported(f"score_mod and mask_mod run on the sm_90 tma kernels (flash/fast, a block per work item, d "
                          f"up to {MOD_D_MAX}) without a softcap, ALiBi, dropout, a window or an explicit mask, not "
                          f"{plan.label} at d={plan.d}" + (f" ({kernel})" if kernel else ""))
    defines, smem = mods.defines(plan.direction), ()
    staged = staging(plan, mods)
    if staged is not None:  # the read staged through shared memory in place of the expression and its prefetch
        form, slot, ctype, row = staged
        defines = (*((k, v) for k, v in defines if k in ("MOD_CAPS",)), ("MOD_STAGE", row),
                   ("MOD_STAGE_SLOT", str(slot)), ("MOD_STAGE_T", ctype), ("MOD_STAGE_FORM", str(form)))
        layout, size = mask_layout(plan, row, ctype), plan.tile["Br"] * plan.tile["Bc"] * CTYPE_BYTES[ctype]
        at = -(-main.smem_bytes // 1024) * 1024  # (MOD_TMA's stages: the 128-byte swizzle's boxes, 1024-byte aligned)
        if layout is None or at + 2 * size + STATIC_SMEM > STAGE_SMEM_LIMIT:
            smem = (("STAGE", main.smem_bytes, stage_bytes(plan, ctype)),)
        else:  # the copy engine loads the tiles (MOD_TMA), two stages beside K's
            (_, _, heads, batch), _, _, _ = layout
            defines += (("MOD_TMA", "1"), ("MOD_TMA_H", "h" if heads > 1 else "0"),
                        ("MOD_TMA_B", "b" if batch > 1 else "0"))
            smem = (("MASK0", at, size), ("MASK1", at + size, size))
    stages = tuple(replace(s, params=(*s.params, *defines), smem=(*s.smem, *smem))
                   if s.name == "main" else s for s in plan.stages)
    plan = replace(plan, mods=replace(mods, capture_bytes=None, values=()), stages=stages)
    if not mods.captures:
        return replace(plan, mods=replace(plan.mods, capture_bytes=0))
    if values is None:
        return plan
    arrays = host_captures(mods, values)
    kept = tuple((name, arrays[name].dtype.str, arrays[name].tobytes()) for name, _ in mods.captures)
    return replace(plan, mods=replace(plan.mods, capture_bytes=capture_bytes(plan, arrays), values=kept))


STAGE_SMEM_LIMIT = 227 * 1024  # the sm_90 block's shared memory: a staged plan must fit it
CTYPE_BYTES = {ctype: dtype.itemsize for dtype, ctype in CAPTURE_CTYPES.items()}  # a captured element's bytes


def stage_bytes(plan: Plan, ctype: str) -> int:
    """MOD_STAGE's buffer: a row of B_c elements (and 16 bytes of padding: conflict-free reads) per query row."""
    return plan.tile["Br"] * (plan.tile["Bc"] * CTYPE_BYTES[ctype] + 16)


def staging(plan: Plan, mods: Mods) -> tuple[int, int, str, str] | None:
    """How a forward reads an explicit mask's form through shared memory (MOD_STAGE, flash_tma.cu), as (form: 1 a
    score_mod ``score + X[R + kv_idx]``, 2 a mask_mod ``X[R + kv_idx] != 0``, the capture's slot, its C type, R), or
    None: the variant is not one of those forms alone, R reads kv_idx or score, R is not a multiple of 16 bytes for
    every (b, h, q_idx) (cp.async's 16-byte copies), or the buffer does not fit beside the plan's. Its warps copy their
    rows of the next key tile in 16-byte pieces (cp.async, past N_k and N_q zero-filled, not read) while a step runs;
    every element of a computed tile inside (N_q, N_k) is read once."""
    read = mods.prefetch()  # the form's one read (its index does not read score)
    if plan.direction != "fwd" or read is None or (mods.mask_mod is None) == (mods.score_mod is None):
        return None
    slot, ctype, text = read
    names = [n for n, _ in mods.captures]
    index = parse(text, VARIABLES, names)
    row = index.minus("kv_idx")  # (R, not reading kv_idx)
    if row is None or index.captures or plan.stage("main").smem_bytes + stage_bytes(plan, ctype) > STAGE_SMEM_LIMIT:
        return None
    starts = parse(row, VARIABLES, names)
    b, h, q = np.meshgrid(np.arange(plan.bh // plan.heads), np.arange(plan.heads), np.arange(plan.N_q), indexing="ij")
    env = {"b": b, "h": h, "q_idx": q, "n_q": plan.N_q, "n_k": plan.N_k}
    if np.any(np.asarray(starts.evaluate({n: env[n] for n in starts.names}, {})[0]) % (16 // CTYPE_BYTES[ctype])):
        return None
    return (2 if mods.mask_mod is not None else 1), slot, ctype, " ".join(row.split())


TMA_CTYPES = {"unsigned char": "uint8", "__half": "float16", "float": "float32"}  # a staged read's map dtype
STATIC_SMEM = 1024  # bytes kept for the forward's static shared memory beside a plan's buffers (barriers, lists)


MaskLayout = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], str]


def mask_layout(plan: Plan, row: str, ctype: str) -> MaskLayout | None:
    """How the copy engine loads a staged read's tiles (MOD_TMA, flash_tma.cu), as the tensor map's (dims, strides in
    bytes, box, dtype) over the captured array, {n_k, n_q, heads, batch} innermost first (a dim the row offset R does
    not step is 1, read at 0), boxes of 128 bytes x B_r rows, 128-byte swizzled; or None where it cannot (R not
    s_b b + s_h h + s_q q_idx, B_c not whole boxes, a stride the map refuses). :func:`with_mods` takes it where two
    stages of B_r x B_c elements fit beside the plan's buffers, else the read is staged by cp.async."""
    itemsize, br, bc = CTYPE_BYTES[ctype], plan.tile["Br"], plan.tile["Bc"]
    box = 128 // itemsize
    if ctype not in TMA_CTYPES or bc % box or br > 256:
        return None
    batch = plan.bh // plan.heads
    starts = parse(row, VARIABLES)  # (R reads no capture: staging)
    b, h, q = np.meshgrid(np.arange(batch), np.arange(plan.heads), np.arange(plan.N_q), indexing="ij")
    env = {"b": b, "h": h, "q_idx": q, "n_q": plan.N_q, "n_k": plan.N_k}
    at = np.broadcast_to(np.asarray(starts.evaluate({n: env[n] for n in starts.names}, {})[0], np.int64), b.shape)
    step = [int(at[tuple(int(i == axis) for i in range(3))] - at[0, 0, 0]) if at.shape[axis] > 1 else 0
            for axis in range(3)]  # s_b, s_h, s_q
    if at[0, 0, 0] != 0 or np.any(at != step[0] * b + step[1] * h + step[2] * q) or min(step) < 0:
        return None
    dims = [plan.N_k, plan.N_q, plan.heads if step[1] else 1, batch if step[0] else 1]
    strides, extent = [], plan.N_k * itemsize
    for s, n in ((step[2], dims[1]), (step[1], dims[2]), (step[0], dims[3])):
        stride = s * itemsize if s else -(-extent // 16) * 16  # (a dim of 1: any stride, the packed one)
        strides.append(stride)
        extent = stride * n
    if any(s % 16 or s >= 2**40 for s in strides) or strides[0] < plan.N_k * itemsize:  # (rows that overlap: staged)
        return None
    return tuple(dims), tuple(strides), (box, br, 1, 1), TMA_CTYPES[ctype]


def _levels(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(computed, partial): (T_r, T_c) grids of the tile pairs the kernel computes, and of those where it evaluates
    mask_mod (all of them but the blocks the block mask marks full, 2)."""
    from .causal import pair_grid

    computed, _ = pair_grid(plan)
    if plan.block_mask is None:
        return computed, computed
    return computed, computed & (plan.block_grid() == 1)


def apply_mods(mods: Mods, arrays: Mapping[str, np.ndarray], heads: int, n_q: int, n_k: int, logits: np.ndarray,
               rows: np.ndarray, cols: np.ndarray, *, partial: np.ndarray | bool = True, grads: bool = False,
               active: np.ndarray | bool = True, z0: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """The variant on logits (BH', rows, cols) of τ q·k for query heads z0, z0 + 1, ... (b = z // heads, h = z %
    heads), queries ``rows`` and keys ``cols``, as the kernels apply it where ``active``: mask_mod where ``partial``,
    then score_mod (and with ``grads`` score_grad) where it keeps the element. Returns (the logits through score_mod,
    −inf where mask_mod hides; d score_mod / d score, 1 without score_grad and 0 where hidden; the bytes of captured
    arrays read). ``arrays``: the captures on the host (:func:`host_captures`)."""
    parsed = mods.parsed()
    shape = logits.shape
    z = z0 + np.arange(shape[0])[:, None, None]
    env = {"b": z // heads, "h": z % heads, "q_idx": rows[None, :, None], "kv_idx": cols[None, None, :], "n_q": n_q,
           "n_k": n_k, "score": logits}
    evaluated = np.broadcast_to(np.asarray(active, bool), shape)
    reads = 0

    def run(what: str, where: np.ndarray) -> np.ndarray:
        nonlocal reads
        value, counts = parsed[what].evaluate(env, arrays, where)
        reads += sum(n * arrays[name].itemsize for name, n in counts.items())
        return np.broadcast_to(value, shape)

    keep = evaluated
    if "mask_mod" in parsed:
        checked = evaluated & np.broadcast_to(np.asarray(partial, bool), shape)
        keep = evaluated & ~(checked & (run("mask_mod", checked) == 0))
    grad = np.ones(shape)
    if grads and "score_grad" in parsed:
        grad = run("score_grad", keep).astype(np.float64)
    out = run("score_mod", keep).astype(np.float64) if "score_mod" in parsed else logits
    hidden = evaluated & ~keep
    return np.where(hidden, -np.inf, out), np.where(hidden, 0.0, grad), reads


def capture_bytes(plan: Plan, values: Mapping[str, object]) -> int:
    """The bytes of captured arrays the plan's kernel reads (module docstring): the expressions evaluated on the CPU
    (:func:`apply_mods`) over every element of the tiles it computes, B_r x B_c each (a query or key past the end
    with the last one's index, as the kernels evaluate them), with a seeded stand-in for the scores: exact when which
    captured elements an expression reads does not depend on the score."""
    mods = plan.mods
    arrays = host_captures(mods, values)
    computed, partial = _levels(plan)
    main = dict(plan.stage("main").params)
    if "MOD_STAGE" in main:  # every element of a computed tile inside (N_q, N_k), once
        br, bc = plan.tile["Br"], plan.tile["Bc"]
        rows = np.minimum(plan.N_q, (np.arange(computed.shape[0]) + 1) * br) - np.arange(computed.shape[0]) * br
        cols = np.minimum(plan.N_k, (np.arange(computed.shape[1]) + 1) * bc) - np.arange(computed.shape[1]) * bc
        return plan.bh * int((rows[:, None] * cols[None, :] * computed).sum()) * CTYPE_BYTES[main["MOD_STAGE_T"]]
    per_head = any({"b", "h"} & e.names for e in mods.parsed().values())
    br, bc = plan.tile["Br"], plan.tile["Bc"]
    cols = np.minimum(np.arange(computed.shape[1] * bc), plan.N_k - 1)
    rng = np.random.default_rng(0)
    reads = 0
    for i in range(computed.shape[0]):
        if not computed[i].any():
            continue
        rows = np.minimum(np.arange(i * br, (i + 1) * br), plan.N_q - 1)
        score = rng.standard_normal((1, br, len(cols)))
        comp, part = (np.repeat(g[i], bc)[None, :] for g in (computed, partial))
        for z in range(plan.bh) if per_head else (0,):
            reads += apply_mods(mods, arrays, plan.heads, plan.N_q, plan.N_k, score, rows, cols, partial=part,
                                grads=plan.direction == "bwd", active=comp, z0=z)[2]
    return reads if per_head else reads * plan.bh


def host_captures(mods: Mods, values: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The captured arrays as numpy arrays, checked against the variant's names and types."""
    out = {}
    for name, ctype in mods.captures:
        if name not in values:
            raise ValueError(f"capture {name!r} has no value")
        a = values[name]
        a = a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
        if CAPTURE_CTYPES.get(a.dtype) != ctype or a.ndim != 1:
            raise TypeError(f"capture {name!r}: a 1-d array of C type {ctype} was planned, got {a.dtype} {a.shape}")
        out[name] = a
    return out


def block_levels(mods: Mods, values: Mapping[str, object], n_q: int, n_k: int, block: int = 128
                 ) -> tuple[np.ndarray, int]:
    """The levels of mask_mod's blocks of ``block`` x ``block``, (⌈n_q / block⌉, ⌈n_k / block⌉) uint8: 0 where it
    hides every element of a block, 2 where it keeps every one (the kernels skip mask_mod there), 1 otherwise;
    evaluated on the CPU for batch 0 and head 0 on every element inside the problem, and the bytes of captured arrays
    that evaluation reads (kernels/mod_blocks.cu's, which counts the same)."""
    parsed = mods.parsed()
    if "mask_mod" not in parsed:
        raise ValueError("a block mask comes from a mask_mod")
    arrays = host_captures(mods, values)
    rows_b, cols_b = cdiv(n_q, block), cdiv(n_k, block)
    levels = np.zeros((rows_b, cols_b), np.uint8)
    reads = 0
    for i in range(rows_b):
        rows = np.arange(i * block, min(n_q, (i + 1) * block))
        env = {"b": 0, "h": 0, "q_idx": rows[:, None], "kv_idx": np.arange(n_k)[None, :], "n_q": n_q, "n_k": n_k}
        value, counts = parsed["mask_mod"].evaluate(env, arrays)
        reads += sum(n * arrays[name].itemsize for name, n in counts.items())
        keep = np.broadcast_to(value != 0, (len(rows), n_k))
        pad = np.zeros((len(rows), cols_b * block), bool)
        pad[:, :n_k] = keep
        full = np.ones((len(rows), cols_b * block), bool)
        full[:, :n_k] = keep
        any_ = pad.reshape(len(rows), cols_b, block).any(axis=(0, 2))
        all_ = full.reshape(len(rows), cols_b, block).all(axis=(0, 2))
        levels[i] = np.where(all_, 2, np.where(any_, 1, 0))
    return levels, reads


def mod_blocks_defines(mods: Mods, block: int) -> dict[str, int | str]:
    """kernels/mod_blocks.cu's defines for a variant's mask_mod in blocks of ``block`` (its score_mod not read)."""
    defines = {k: v for k, v in mods.defines("fwd") if k == "MASK_MOD" or k == "MOD_CAPS"}
    return {**defines, "MOD_BLOCK": block, "THREADS": MOD_BLOCK_THREADS}


def mod_block_mask(mods: Mods, values: Mapping[str, object], n_q: int, n_k: int, block: int = 128) -> BlockMask:
    """The block mask of mask_mod (FlexAttention's ``create_block_mask``) in blocks of ``block`` (a multiple of 128
    for the tma kernels), from :func:`block_levels` on the CPU."""
    levels, _ = block_levels(mods, values, n_q, n_k, block)
    return BlockMask.from_levels(levels, n_q=n_q, n_k=n_k, block_q=block, block_k=block, label="mask_mod")
