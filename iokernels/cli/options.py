"""Options, errors and output shared by the commands: every command takes the problem the same way, and a
user's mistake prints one line on stderr and exits with code 2; ``--json`` output stays one clean document."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click
import numpy as np

from ..model.specs import DEFAULT_GPU, GpuSpec, current_device_spec, resolve_spec
from ..plan import DEFAULT_CAUSAL_ALIGNMENT, all_plans, normalize_causal, normalize_window
from ..plan.decode import DECODE_SMS, make_decode_plan
from ..plan.dropout import Dropout
from ..plan.masks import DEFAULT_BLOCK, MASK_KINDS, PATTERNS, ExplicitMask
from ..plan.masks import pattern as block_pattern
from ..plan.mods import check_mods
from ..plan.units import check_dtype, format_bytes, parse_size
from ..plan.variants import check_softcap, geometric_slopes
from ..plan.varlen import make_documents_plan, make_varlen_plan

SIZE_HELP = "bytes, or with a unit: 192KB, 192KiB, 1MB (KB, MB are binary: 1 KB = 1024 bytes, same as KiB)"


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"iokernels: error: {self.format_message()}", err=True)


class EnvironmentProblem(UserError):
    """What this machine lacks (cupy, a GPU): one line, exit code 1."""

    exit_code = 1


class Cli(click.Group):
    """A group whose usage errors are one line on stderr, exit code 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("iokernels: aborted", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            click.echo(f"iokernels: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)


def user_errors(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as exc:
            raise UserError(str(exc)) from exc
        except RuntimeError as exc:
            raise EnvironmentProblem(str(exc)) from exc
    return wrapper


FILL_HELP = ("default: chosen to fill the GPU (heads 16, the smallest batch whose smallest grid has a block per "
             "SM in waves at least 90% full; see the report's header); give --batch or --heads to set them")


def problem_options(fn: Callable, *, fill: bool = False) -> Callable:
    """The problem's options; ``fill``: --batch and --heads default to None (``compare`` picks values that fill
    the GPU when neither is given), else to 1."""
    batch_heads = ([click.option("--batch", type=int, default=None, help=f"batch size ({FILL_HELP})"),
                    click.option("--heads", type=int, default=None, help=f"heads ({FILL_HELP})")] if fill else
                   [click.option("--batch", type=int, default=1, show_default=True),
                    click.option("--heads", type=int, default=1, show_default=True)])
    options = [
        click.option("--N", "n", type=int, default=None, help="sequence length (sets N_q and N_k)"),
        click.option("--Nq", "n_q", type=int, default=None, help="query length (default: --N)"),
        click.option("--Nk", "n_k", type=int, default=None, help="key/value length (default: --N)"),
        click.option("--d", "d", type=int, default=64, show_default=True, help="head dimension"),
        click.option("--sram", default="192KB", show_default=True, help=f"M, shared memory per block: {SIZE_HELP}"),
        click.option("--dtype", default="float32", show_default=True, help="float32, float16 or bfloat16"),
        *batch_heads,
        click.option("--gpu", default=None,
                     help=f"GPU spec by name (see `iokernels specs`); default: the current device, else {DEFAULT_GPU}"),
        click.option("--backward", is_flag=True, help="also the backward passes"),
        click.option("--causal", is_flag=True,
                     help="causal attention (key j visible to query i iff j <= i + offset); flash and two_pass "
                          "skip fully masked blocks"),
        click.option("--causal-align", "causal_align", default=None, metavar="bottom-right|top-left",
                     help=f"alignment of the causal mask when N_q != N_k (with --causal; default "
                          f"{DEFAULT_CAUSAL_ALIGNMENT.replace('_', '-')}: offset N_k - N_q, the last query sees "
                          "every key; top-left: offset 0)"),
        click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def filling_problem_options(fn: Callable) -> Callable:
    """:func:`problem_options` with --batch and --heads left None when not given (``compare``)."""
    return problem_options(fn, fill=True)


def matching_device(gpu: str | None, *, off: bool = False, hint: str = "") -> GpuSpec | None:
    """The current device's spec (None without one, or when ``off``: --simulate, --model-only); ValueError when
    --gpu names another GPU (``hint``: what to add instead)."""
    device = None if off else current_device_spec()
    if gpu is not None and device is not None and device.key != resolve_spec(gpu).key:
        raise ValueError(f"--gpu {gpu} does not match this device ({device.name})" + (f"; {hint}" if hint else ""))
    return device


def check_repeats(repeats: int) -> int:
    """--repeats, which must be >= 1."""
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    return repeats


def causal_spec(causal: bool, causal_align: str | None) -> str:
    """The plans' causal alignment ("" for none) from --causal and --causal-align."""
    if causal_align is not None and not causal:
        raise ValueError(f"--causal-align {causal_align} needs --causal")
    if not causal:
        return ""
    return normalize_causal(True if causal_align is None else causal_align)


def block_sparse_options(fn: Callable) -> Callable:
    """--block-sparse DENSITY and the block mask's pattern, seed and block size (iokernels.plan.masks)."""
    options = [
        click.option("--block-sparse", "block_sparse", type=float, default=None, metavar="DENSITY",
                     help="block-sparse attention (the paper's Algorithm 5) with about this fraction of nonzero "
                          "blocks, in (0, 1]; flash and two_pass skip the zero blocks"),
        click.option("--block-pattern", "block_pattern", default=None, metavar="|".join(PATTERNS),
                     help=f"the block mask's pattern (with --block-sparse; default {PATTERNS[0]}: a sliding "
                          "window; strided; random)"),
        click.option("--block-seed", "block_seed", type=int, default=None,
                     help="seed of --block-pattern random (default 0)"),
        click.option("--block-size", "block_size", type=int, default=None,
                     help=f"queries and keys per block of the mask (default {DEFAULT_BLOCK}); the plans' tiles "
                          "divide it"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def sparse_spec(block_sparse, block_pattern, block_seed, block_size) -> dict | None:
    """The block-sparse options as pattern arguments (None without --block-sparse)."""
    if block_sparse is None:
        given = [name for name, v in (("--block-pattern", block_pattern), ("--block-seed", block_seed),
                                      ("--block-size", block_size)) if v is not None]
        if given:
            raise ValueError(f"{given[0]} needs --block-sparse DENSITY")
        return None
    return {"kind": block_pattern or PATTERNS[0], "density": block_sparse, "seed": block_seed or 0,
            "block_q": DEFAULT_BLOCK if block_size is None else block_size}


def mask_dropout_options(fn: Callable) -> Callable:
    """--mask KIND [--mask-per-head] (an explicit mask of random values), --dropout P [--dropout-seed], --window
    LEFT,RIGHT (a sliding window), --softcap C, --alibi, and a programmable variant (--mask-mod, --score-mod,
    --score-grad, --doc-table)."""
    options = [
        click.option("--mask", "mask_kind", type=click.Choice(list(MASK_KINDS)), default=None,
                     help="an explicit element mask read from HBM, random values (about 70% visible): bool (1 byte "
                          "per element) or additive (float32 added to the scores); only the plans that read one"),
        click.option("--mask-per-head", is_flag=True,
                     help="one --mask per batch-head instead of one shared by all (the bytes read are the same)"),
        click.option("--dropout", "dropout_p", type=float, default=None, metavar="P",
                     help="dropout on P with probability P in [0, 1) (Philox, regenerated in every kernel that "
                          "needs it: no bytes); only the plans that implement it"),
        click.option("--dropout-seed", type=int, default=None, help="seed of --dropout's stream (default 0)"),
        click.option("--window", "window", default=None, metavar="LEFT,RIGHT",
                     help="a sliding window (FlashAttention's window_size; -1: that side unbounded): the tiled "
                          "plans skip the blocks with no visible element; on a GPU only flash/fast's kernels take it"),
        click.option("--softcap", "softcap", type=float, default=None, metavar="C",
                     help="the logits capped at C tanh(s / C) (no bytes): the flash/fast plans on the tma kernels "
                          "only (the others are left out)"),
        click.option("--alibi", "alibi", is_flag=True,
                     help="ALiBi with the heads' geometric slopes 2^(-8(h+1)/H) (a float per block and head read): "
                          "the flash/fast plans on the tma kernels only, d up to 128 (the others are left out)"),
        click.option("--mask-mod", "mask_mod", default=None, metavar="EXPR",
                     help="a programmable mask: a CUDA C expression over b, h, q_idx, kv_idx, n_q, n_k (and doc[] "
                          "with --doc-table), nonzero where the key is seen (issue #22): flash/fast on the tma "
                          "kernels only, d up to 128"),
        click.option("--score-mod", "score_mod", default=None, metavar="EXPR",
                     help="a programmable score: a CUDA C expression of score (the logit) and the same names, the "
                          "new logit; its derivative is derived unless --score-grad gives it"),
        click.option("--score-grad", "score_grad", default=None, metavar="EXPR",
                     help="d score_mod / d score as a CUDA C expression over the same names"),
        click.option("--doc-table", "doc_table", default=None, metavar="L1,L2,...",
                     help="a captured int32 array doc[] the expressions may read: each position's document, for "
                          "documents of these lengths (their sum: N_k)"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def parse_window(text: str | None) -> tuple[int | None, int | None] | None:
    """``"1024,0"`` -> (1024, 0) (-1: that side unbounded); None or "" -> None; ValueError naming --window else."""
    if text is None or not str(text).strip():
        return None
    items = [x.strip() for x in str(text).split(",")]
    try:
        return normalize_window(tuple(int(x) for x in items))
    except ValueError as exc:
        raise ValueError(f"--window: expected LEFT,RIGHT (ints >= 0, or -1 for unbounded), got {text!r} ({exc})") \
            from None


def mask_dropout_spec(mask_kind, mask_per_head, dropout_p, dropout_seed, window=None, softcap=None,
                      alibi=False, mask_mod=None, score_mod=None, score_grad=None, doc_table=None) -> dict:
    """plans_from_options' mask, dropout, window, softcap, alibi (a flag), mods and capture_values arguments from the
    options."""
    captures = None
    if doc_table is not None:
        try:
            lengths = [int(x) for x in doc_table.split(",")]
        except ValueError:
            raise ValueError(f"--doc-table: expected comma-separated lengths, got {doc_table!r}") from None
        if not lengths or min(lengths) < 1:
            raise ValueError(f"--doc-table: lengths >= 1, got {doc_table!r}")
        captures = {"doc": np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)}
    mods = check_mods(mask_mod, score_mod, score_grad, captures)
    if mask_per_head and mask_kind is None:
        raise ValueError("--mask-per-head needs --mask bool|additive")
    if dropout_seed is not None and dropout_p is None:
        raise ValueError("--dropout-seed needs --dropout P")
    return {"mask": None if mask_kind is None else ExplicitMask(mask_kind, shared=not mask_per_head),
            "dropout": None if dropout_p is None else Dropout(dropout_p, dropout_seed or 0),
            "window": parse_window(window), "softcap": check_softcap(softcap), "alibi": bool(alibi), "mods": mods,
            "capture_values": captures}


DECODE_OPTION = click.option(
    "--decode", is_flag=True,
    help="also the split-KV decode plan (issue #23; model and simulator only, no kernel yet): the query heads of a "
         "K/V head packed into one tile, the keys cut into splits chosen for the GPU's SMs, and their combine")
VARLEN_OPTION = click.option(
    "--varlen", "varlen", default=None, metavar="L1,L2,...",
    help="a variable-length batch (issue #23) instead: sequences of these lengths (queries and keys) packed without "
         "padding, its plans alone (the tma forward, and the backward with --backward; --N and --batch not used)")
DOCUMENTS_OPTION = click.option(
    "--documents", "documents", default=None, metavar="L1,L2,...",
    help="document masking (issue #22) instead: N cut into documents of these lengths (N their sum; every batch row "
         "and head), a row seeing its own document's keys only; the variable-length plans on the dense layout "
         "(the tma forward, and the backward with --backward; --N not used)")
KV_HEADS_OPTION = click.option(
    "--kv-heads", "kv_heads", type=int, default=None,
    help="grouped-query attention: K and V with this many heads, each shared by heads / kv-heads query heads "
         "(only flash/fast takes it; the other plans are left out)")


def plans_from_options(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal=False, causal_align=None,
                       sparse=None, kv_heads=None, mask=None, dropout=None, window=None, decode=False, varlen=None,
                       documents=None, softcap=None, alibi=False, mods=None, capture_values=None):
    """The plans ``model``/``compare``/``profile`` run, and the GPU spec, from the shared problem options (``alibi``:
    the heads' geometric slopes, every batch row alike)."""
    causal = causal_spec(causal, causal_align)
    if alibi and (documents is not None or varlen is not None or decode):
        raise ValueError("--alibi: the dense plans only (not --documents, --varlen or --decode)")
    if mods is not None and (documents is not None or varlen is not None or decode):
        raise ValueError("--mask-mod, --score-mod: the dense plans only (not --documents, --varlen or --decode)")
    if capture_values is not None and (n_k or n) is not None and len(capture_values["doc"]) != (n_k or n):
        raise ValueError(f"--doc-table: the lengths sum to {len(capture_values['doc'])}, not N_k = {n_k or n}")
    if documents is not None:  # document masking's plans alone
        if varlen is not None or n is not None or n_q is not None or n_k is not None:
            raise ValueError("--documents: N is the documents' sum (--N, --Nq, --Nk and --varlen do not apply)")
        if sparse is not None or mask is not None or dropout is not None or window is not None or decode or softcap:
            raise ValueError("--documents: the document plans take causal alone (no block-sparse, mask, dropout, "
                             "window or --decode)")
        try:
            lengths = [int(x) for x in documents.split(",")]
        except ValueError:
            raise ValueError(f"--documents: expected comma-separated lengths (ints >= 0), got {documents!r}") from None
        return [make_documents_plan(lengths, d=d, dtype=check_dtype(dtype), batch=batch, heads=heads,
                                    kv_heads=kv_heads, causal=causal, direction=direction)
                for direction in (("fwd", "bwd") if backward else ("fwd",))], resolve_spec(gpu)
    if varlen is not None:  # a variable-length batch's plans alone
        if n is not None or n_q is not None or n_k is not None:
            raise ValueError("--varlen: the lengths are the sequences' (--N, --Nq and --Nk do not apply)")
        if sparse is not None or mask is not None or dropout is not None or window is not None or decode or softcap:
            raise ValueError("--varlen: the variable-length plans take causal alone (no block-sparse, mask, dropout, "
                             "window or --decode)")
        try:
            lengths = [int(x) for x in varlen.split(",")]
        except ValueError:
            raise ValueError(f"--varlen: expected comma-separated lengths (ints >= 0), got {varlen!r}") from None
        return [make_varlen_plan(d=d, dtype=check_dtype(dtype), heads=heads, kv_heads=kv_heads, lengths_q=lengths,
                                 causal=causal, direction=direction)
                for direction in (("fwd", "bwd") if backward else ("fwd",))], resolve_spec(gpu)
    n_q = n if n_q is None else n_q
    n_k = n if n_k is None else n_k
    if n_q is None or n_k is None:
        raise ValueError("give --N, or both --Nq and --Nk")
    block_mask = None if sparse is None else block_pattern(n_q=n_q, n_k=n_k, **sparse)
    spec = resolve_spec(gpu)
    sram_bytes = parse_size(sram)
    limit = spec.smem_per_block_bytes
    if limit and sram_bytes > limit:
        raise ValueError(f"--sram {sram_bytes} bytes exceeds the per-block shared-memory limit of {spec.name}, "
                         f"{limit} bytes ({format_bytes(limit)}); choose a smaller --sram or another --gpu")
    plans = all_plans(N_q=n_q, N_k=n_k, d=d, dtype=check_dtype(dtype), sram=sram_bytes, batch=batch,
                      heads=heads, backward=backward, smem_limit=spec.smem_per_block_bytes or None,
                      causal=causal, block_mask=block_mask, kv_heads=kv_heads, mask=mask, dropout=dropout,
                      window=window, softcap=softcap, alibi=geometric_slopes(heads) if alibi else None, mods=mods,
                      capture_values=capture_values)
    if decode:  # the split-KV decode plan beside the others (forward; no mask)
        if causal or block_mask is not None or mask is not None or dropout is not None or window is not None \
                or softcap is not None:
            raise ValueError("--decode: the split-KV decode plan takes no mask, window, softcap or dropout")
        plans.append(make_decode_plan(N_q=n_q, N_k=n_k, d=d, dtype=check_dtype(dtype), batch=batch, heads=heads,
                                      kv_heads=kv_heads, sms=spec.sms or DECODE_SMS))
    if not plans:
        raise ValueError("no algorithm implements this combination of masks (and softcap)" if kv_heads is None else
                         "no plan takes grouped-query attention here: flash/fast needs float16 or bfloat16 and "
                         "d of 64 or 128")
    return plans, spec


def emit(doc: dict, as_json: bool, text: str) -> None:
    click.echo(json.dumps(doc, indent=1, default=float) if as_json else text)
