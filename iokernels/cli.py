"""Command line: ``iokernels model``, ``specs``, ``compare``, ``kernel-bench``, ``bench``, ``sweep`` and
``profile``.

Errors a user can cause (bad sizes, dtypes, head dims, an M that fits no tiling or exceeds the GPU's
shared memory, an unknown GPU) print one line on stderr and exit with code 2. Logs go to stderr so
``--json`` output on stdout stays one clean JSON document.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from . import model
from .dropout import Dropout, check_p
from .masks import DEFAULT_BLOCK, MASK_KINDS, PATTERNS, ExplicitMask
from .masks import pattern as block_pattern
from .plan import DEFAULT_CAUSAL_ALIGNMENT, all_plans, normalize_causal
from .report import build, render
from .specs import DEFAULT_GPU, current_device_spec, list_specs, resolve_spec, table_notes
from .units import check_dtype, format_bytes, parse_size

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


def problem_options(fn: Callable) -> Callable:
    options = [
        click.option("--N", "n", type=int, default=None, help="sequence length (sets N_q and N_k)"),
        click.option("--Nq", "n_q", type=int, default=None, help="query length (default: --N)"),
        click.option("--Nk", "n_k", type=int, default=None, help="key/value length (default: --N)"),
        click.option("--d", "d", type=int, default=64, show_default=True, help="head dimension"),
        click.option("--sram", default="192KB", show_default=True, help=f"M, shared memory per block: {SIZE_HELP}"),
        click.option("--dtype", default="float32", show_default=True, help="float32, float16 or bfloat16"),
        click.option("--batch", type=int, default=1, show_default=True),
        click.option("--heads", type=int, default=1, show_default=True),
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


def _causal(causal: bool, causal_align: str | None) -> str:
    """The plans' causal alignment ("" for none) from --causal and --causal-align."""
    if causal_align is not None and not causal:
        raise ValueError(f"--causal-align {causal_align} needs --causal")
    if not causal:
        return ""
    return normalize_causal(True if causal_align is None else causal_align)


def block_sparse_options(fn: Callable) -> Callable:
    """--block-sparse DENSITY and the block mask's pattern, seed and block size (iokernels.masks)."""
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


def _sparse(block_sparse, block_pattern, block_seed, block_size) -> dict | None:
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
    """--mask KIND [--mask-per-head] (an explicit mask of random values) and --dropout P [--dropout-seed]."""
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
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _mask_dropout(mask_kind, mask_per_head, dropout_p, dropout_seed) -> dict:
    """all_plans' mask and dropout arguments from the options."""
    if mask_per_head and mask_kind is None:
        raise ValueError("--mask-per-head needs --mask bool|additive")
    if dropout_seed is not None and dropout_p is None:
        raise ValueError("--dropout-seed needs --dropout P")
    return {"mask": None if mask_kind is None else ExplicitMask(mask_kind, shared=not mask_per_head),
            "dropout": None if dropout_p is None else Dropout(dropout_p, dropout_seed or 0)}


KV_HEADS_OPTION = click.option(
    "--kv-heads", "kv_heads", type=int, default=None,
    help="grouped-query attention: K and V with this many heads, each shared by heads / kv-heads query heads "
         "(only flash/fast takes it; the other plans are left out)")


def _plans(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal=False, causal_align=None, sparse=None,
           kv_heads=None, mask=None, dropout=None):
    causal = _causal(causal, causal_align)
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
                      causal=causal, block_mask=block_mask, kv_heads=kv_heads, mask=mask, dropout=dropout)
    if not plans:
        raise ValueError("no algorithm implements this combination of masks" if kv_heads is None else
                         "no plan takes grouped-query attention here: flash/fast needs float16 or bfloat16 and "
                         "d of 64 or 128")
    return plans, spec


def _emit(doc: dict, as_json: bool, text: str) -> None:
    click.echo(json.dumps(doc, indent=1, default=float) if as_json else text)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="iokernels")
def cli() -> None:
    """Attention kernels that count their HBM bytes, beside an exact model of those bytes."""


@cli.command("model")
@problem_options
@block_sparse_options
@mask_dropout_options
@KV_HEADS_OPTION
@click.option("--detail", is_flag=True, help="per-tensor rows and formulas")
@click.option("--latex", is_flag=True, help="formulas in LaTeX instead of pretty text")
@user_errors
def model_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json, block_sparse,
              block_pattern, block_seed, block_size, mask_kind, mask_per_head, dropout_p, dropout_seed, kv_heads,
              detail, latex) -> None:
    """Predicted HBM bytes, FLOPs, footprint and roofline time, with the formulas."""
    plans, spec = _plans(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align,
                         _sparse(block_sparse, block_pattern, block_seed, block_size), kv_heads,
                         **_mask_dropout(mask_kind, mask_per_head, dropout_p, dropout_seed))
    doc = build(plans, spec, "model", note="exact model of the plans' tiling; nothing was run")
    doc["formulas"] = {p.label: dict(model.formulas(p.algorithm, p.schedule, p.direction, latex=True,
                                                    causal=p.causal, block_sparse=p.block_mask is not None))
                       for p in plans}
    lines = [render(doc, detail=detail, measured=False), ""]
    totals = {(r["algorithm"], r["schedule"], r["pass"]): r for r in doc["rows"] if r["tensor"] == "total"}
    for p in plans:
        t = totals[(p.algorithm, p.schedule, p.direction)]
        lines.append(f"{p.label}: {t['flops']:.4g} FLOPs, {t['intensity_flops_per_byte']:.1f} FLOP/B, "
                     f"extra memory {format_bytes(t['footprint_bytes'])}, "
                     f"roofline {t['roofline_seconds'] * 1e3:.3f} ms on {spec.name}")
    lines.append("")
    causal_note = ("; causal: R_K, R_Q key and query rows the block loops load over the visible block pairs, "
                   "A_S elements of the visible S blocks, N_qv, N_kv rows of blocks with a visible pair")
    sparse_note = ("; block-sparse: R_K, R_Q, A_S, N_qv, N_kv over the block pairs the mask keeps, N_bm "
                   "block-mask bytes read (one per pair visited), s the fraction of visited pairs kept")
    lines.append("formulas (bytes; N_q, N_k, d, BH = batch*heads, BH_kv = batch*kv_heads (rows of K, V), "
                 "e = bytes per element, M in elements, "
                 "B_r, B_c, BM, BN tiles" + (causal_note if any(p.causal for p in plans) else "")
                 + (sparse_note if any(p.block_mask for p in plans) else "") + "):")
    for p in plans:
        for label, formula in model.formulas(p.algorithm, p.schedule, p.direction, latex=latex, per_tensor=detail,
                                             causal=p.causal, block_sparse=p.block_mask is not None):
            lines.append(f"[{p.label}] {label}:")
            lines.extend("    " + x for x in formula.splitlines())
    _emit(doc, as_json, "\n".join(lines))


@cli.command("specs")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@user_errors
def specs_cmd(as_json: bool) -> None:
    """The GPU specification table (and the current device, when there is one)."""
    specs = list(list_specs())
    device = current_device_spec()
    if device is not None:
        specs.append(device)
    rows = [s.as_row() for s in specs]
    doc = {"header": {"notes": table_notes(), "current_device": device.name if device else None}, "rows": rows}
    headers = ["key", "name", "SMs", "smem/SM", "smem/block", "L1+smem/SM", "L2", "HBM GB/s",
               "tensor TFLOP/s", "fp32 TFLOP/s", "unverified"]
    body = [[s.key, s.name + (" (this device)" if s.from_device else ""), str(s.sms or "?"),
             format_bytes(s.smem_per_sm_bytes), format_bytes(s.smem_per_block_bytes),
             format_bytes(s.l1_smem_per_sm_bytes), format_bytes(s.l2_bytes),
             f"{s.hbm_bytes_per_s / 1e9:.0f}", f"{s.tensor_flops / 1e12:.0f}", f"{s.fp32_flops / 1e12:.1f}",
             ",".join(s.unverified) or "-"] for s in specs]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                     for r in [headers, ["-" * w for w in widths], *body])
    _emit(doc, as_json, text + "\n\n" + table_notes())


@cli.command("compare")
@problem_options
@block_sparse_options
@mask_dropout_options
@KV_HEADS_OPTION
@click.option("--detail", is_flag=True, help="per-tensor rows")
@click.option("--simulate", is_flag=True, help="run the CPU simulator even when a GPU is present")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--repeats", type=int, default=10, show_default=True, help="timed runs per plan (GPU)")
@user_errors
def compare_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json, block_sparse,
                block_pattern, block_seed, block_size, mask_kind, mask_per_head, dropout_p, dropout_seed, kv_heads,
                detail, simulate, seed, repeats) -> None:
    """Run every algorithm and schedule; measured bytes beside the model's, per pass and tensor."""
    from .compare import compare

    device = None if simulate else current_device_spec()
    if gpu is not None and device is not None and device.key != resolve_spec(gpu).key:
        raise ValueError(f"--gpu {gpu} does not match this device ({device.name}); add --simulate to "
                         "simulate another GPU's tiling")
    plans, spec = _plans(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align,
                         _sparse(block_sparse, block_pattern, block_seed, block_size), kv_heads,
                         **_mask_dropout(mask_kind, mask_per_head, dropout_p, dropout_seed))
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    reason = "--simulate" if simulate else "no CUDA device found"
    where = "on the GPU" if device is not None else "on the CPU simulator"
    click.echo(f"iokernels: running {len(plans)} plans {where} ...", err=True)
    doc = compare(plans, spec, on_gpu=device is not None, reason=reason, seed=seed, repeats=repeats)
    _emit(doc, as_json, render(doc, detail=detail, measured=True))


@cli.command("kernel-bench")
@problem_options
@click.option("--repeats", type=int, default=20, show_default=True, help="timed runs per stage")
@user_errors
def kernel_bench_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json,
                     repeats) -> None:
    """Each kernel stage against the GPU's copy bandwidth and cupy.matmul; counting vs plain build."""
    from . import bench
    from ._cupy import require_cupy

    require_cupy()
    plans, _ = _plans(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align)
    click.echo(f"iokernels: benchmarking {len(plans)} plans ...", err=True)
    doc = bench.kernel_bench(plans, repeats=repeats)
    _emit(doc, as_json, bench.render(doc))


@cli.command("bench")
@click.option("--d", "ds", default="64,128", show_default=True, help="head dims, comma-separated")
@click.option("--N", "ns", default="1024,4096,16384", show_default=True, help="sequence lengths, comma-separated")
@click.option("--tokens", type=int, default=262144, show_default=True, help="B*H*N of every configuration")
@click.option("--heads", type=int, default=16, show_default=True, help="H; batch B = tokens / (N*H)")
@click.option("--dtype", "dtypes", default="float16,bfloat16", show_default=True, help="comma-separated dtypes")
@click.option("--causal", is_flag=True, help="causal attention (N_q = N_k, so top-left and bottom-right agree)")
@click.option("--dropout", "dropout_p", type=float, default=0.0, show_default=True, metavar="P",
              help="dropout probability on P for every implementation (each draws its own mask; cupy has none)")
@click.option("--backward/--no-backward", default=True, show_default=True, help="also time the backward pass")
@click.option("--long", "long_table", is_flag=True,
              help="also the long-sequence table: heads 48, d 64, batch 1, N from 512 doubling to --long-max-n")
@click.option("--long-only", is_flag=True, help="only the long-sequence table")
@click.option("--long-max-n", type=int, default=131072, show_default=True, help="largest N of the long table")
@click.option("--long-dtype", default="float16", show_default=True, help="dtype of the long table")
@click.option("--impls", default="default", show_default=True,
              help="ours, comma-separated: fast, flash, standard, kv_outer (slow), all, none; default: the first three")
@click.option("--peers", default="all", show_default=True,
              help="peers, comma-separated: cupy, flash, cudnn, efficient, math (torch SDPA backends), all, none")
@click.option("--sram", default=None,
              help=f"M of the research plans (default 96KB, capped at the device's limit): {SIZE_HELP}")
@click.option("--warmup", type=int, default=3, show_default=True, help="untimed calls before the timed ones")
@click.option("--repeats", type=int, default=20, show_default=True, help="timed calls per measurement (median)")
@click.option("--max-call-ms", type=float, default=2000.0, show_default=True,
              help="skip a configuration when one call takes (or is estimated to take) longer")
@click.option("--time-budget", type=float, default=None,
              help="seconds for the whole run; once spent, the remaining measurements are skipped (and labelled)")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@user_errors
def bench_cmd(ds, ns, tokens, heads, dtypes, causal, dropout_p, backward, long_table, long_only, long_max_n, long_dtype,
              impls, peers, sram, warmup, repeats, max_call_ms, time_budget, as_json) -> None:
    """TFLOP/s of iokernels and its peers (cupy/cuBLAS, torch SDPA backends) in one run, with ratios."""
    from . import peerbench as pb

    timing = pb.Timing(warmup=warmup, repeats=repeats, max_call_seconds=max_call_ms / 1e3, budget_seconds=time_budget)
    timing.check()
    check_p(dropout_p)
    dtype_list = pb.parse_dtypes(dtypes)
    problems = [] if long_only else pb.main_problems(pb.parse_ints("--d", ds), pb.parse_ints("--N", ns), dtype_list,
                                                     tokens=tokens, heads=heads, causal=causal, dropout=dropout_p)
    long = pb.long_problems(n_max=long_max_n, dtype=check_dtype(long_dtype), causal=causal, dropout=dropout_p) \
        if long_table or long_only else []
    names = (pb.parse_names("--impls", impls, pb.OURS, pb.IMPL_ALIASES, pb.DEFAULT_OURS)
             + pb.parse_names("--peers", peers, pb.PEERS, pb.PEER_ALIASES, pb.PEERS))
    if not names:
        raise ValueError("--impls and --peers select no implementation")
    chosen = pb.make_impls(names, sram=sram)
    passes = pb.PASSES if backward else ("fwd",)
    if all(i.unavailable(p) for i in chosen for p in passes):
        reasons: dict[str, list[str]] = {}
        for i in chosen:
            reasons.setdefault(i.unavailable("fwd") or "", []).append(i.name)
        raise RuntimeError("nothing to measure, no implementation is available: "
                           + "; ".join(f"{', '.join(v)}: {k}" for k, v in reasons.items()))
    click.echo(f"iokernels: bench of {len(chosen)} implementations on {len(problems)} configurations"
               + (f" and {len(long)} long-sequence lengths" if long else "") + " ...", err=True)
    header = {"tokens": tokens, "heads": heads, "causal": causal, "dropout": dropout_p, "sram": sram,
              "long": {"heads": pb.LONG_HEADS, "d": pb.LONG_D, "batch": pb.LONG_BATCH, "dtype": check_dtype(long_dtype),
                       "n_max": long_max_n} if long else None}
    doc = pb.run(problems, chosen, timing, long=long, backward=backward, header=header,
                 progress=lambda msg: click.echo(f"iokernels: {msg}", err=True))
    _emit(doc, as_json, pb.render(doc))


@cli.command("profile")
@problem_options
@click.option("--algorithms", default=None,
              help="comma-separated algorithm[/schedule[/pass]], e.g. standard,flash/q_outer (default: all)")
@click.option("--kernels", default=None,
              help="comma-separated stage or kernel names, e.g. qk,rowmax or gemm (default: every stage)")
@click.option("--cache-control", "cache_control", type=click.Choice(["all", "none"]), default="all",
              show_default=True, help="ncu's: all flushes L1 and L2 before each replay pass; none leaves them")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--detail", is_flag=True, help="per-tensor counted and model bytes under each kernel")
@user_errors
def profile_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json, algorithms,
                kernels, cache_control, seed, detail) -> None:
    """Nsight Compute counters (DRAM, L1, L2) beside the kernels' counted bytes and the model, per kernel."""
    from . import profile

    device = current_device_spec()
    if gpu is not None and device is not None and device.key != resolve_spec(gpu).key:
        raise ValueError(f"--gpu {gpu} does not match this device ({device.name})")
    plans, _ = _plans(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align)
    plans = profile.select_plans(plans, algorithms)
    selection = profile.select_stages(plans, kernels)
    ncu = profile.check_environment()
    launches = sum(len(v) for v in selection.values())
    click.echo(f"iokernels: profiling {launches} kernel launches of {len(selection)} plans under ncu ...", err=True)
    doc = profile.profile(plans, selection, cache_control=cache_control, seed=seed, ncu=ncu)
    _emit(doc, as_json, profile.render(doc, detail=detail))


@cli.command("sweep")
@click.option("--vary", required=True,
              type=click.Choice(["N", "d", "M", "block", "density"], case_sensitive=False),
              metavar="N|d|M|block|density",
              help="the quantity to vary (block: the resident B_c of flash kv_outer and bwd, B_r of q_outer "
                   "and two_pass; it overrides --N, --d or --sram; density: of the block-sparse mask, "
                   "--block-pattern, fractions in (0, 1])")
@click.option("--values", required=True,
              help="comma-separated values: 1024,2048,4096 (M: sizes such as 48KB,96KB,192KB)")
@click.option("--algorithms", default=None, help="comma-separated: standard,two_pass,flash (default: all; "
                                                 "--vary block: flash)")
@click.option("--schedules", default=None, help="comma-separated schedules to keep, e.g. q_outer,kv_outer")
@problem_options
@block_sparse_options
@click.option("--simulate", is_flag=True, help="run the CPU simulator even when a GPU is present")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--repeats", type=int, default=10, show_default=True, help="timed runs per plan (GPU)")
@click.option("--no-check", is_flag=True, help="GPU: skip the float64 reference check of the outputs (host time)")
@click.option("--no-fit", is_flag=True, help="no exponent fits (they need scipy)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write one CSV row per point to this file")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="write log-log plots to this file (PNG; needs matplotlib)")
@user_errors
def sweep_cmd(vary, values, algorithms, schedules, n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward,
              causal, causal_align, as_json, block_sparse, block_pattern, block_seed, block_size, simulate, seed,
              repeats, no_check, no_fit, csv_path, plot_path) -> None:
    """Run compare for each value of N, d, M or block size; fit log-log exponents beside the model's."""
    from . import sweep

    if plot_path is not None:
        from .plotting import require_matplotlib

        require_matplotlib()
    device = None if simulate else current_device_spec()
    if gpu is not None and device is not None and device.key != resolve_spec(gpu).key:
        raise ValueError(f"--gpu {gpu} does not match this device ({device.name}); add --simulate to "
                         "simulate another GPU's tiling")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    spec = resolve_spec(gpu)
    base = sweep.Problem(N_q=n if n_q is None else n_q, N_k=n if n_k is None else n_k, d=d,
                         dtype=check_dtype(dtype), sram=parse_size(sram), batch=batch, heads=heads,
                         causal=_causal(causal, causal_align),
                         **_sweep_sparse(vary, block_sparse, block_pattern, block_seed, block_size))
    value_list = sweep.parse_values(vary, values)
    keys = sweep.select(algorithms, schedules, backward, vary)
    reason = "--simulate" if simulate else "no CUDA device found"
    where = "on the GPU" if device is not None else "on the CPU simulator"

    def progress(jobs: list) -> Any:
        return _progress(jobs, f"iokernels: sweep {vary} {where}")

    doc = sweep.run(vary, value_list, keys, base, spec, on_gpu=device is not None, reason=reason, seed=seed,
                    repeats=repeats, reference_check=not no_check, do_fit=not no_fit, progress=progress)
    if csv_path is not None:
        with open(csv_path, "w", encoding="utf-8", newline="") as f:
            f.write(sweep.to_csv(doc))
    if plot_path is not None:
        from .plotting import plot

        plot(doc, plot_path)
    _emit(doc, as_json, sweep.render(doc))


def _sweep_sparse(vary: str, block_sparse, block_pattern, block_seed, block_size) -> dict:
    """sweep.Problem's block-sparse fields: --vary density takes the pattern options without --block-sparse."""
    if vary == "density" and block_sparse is not None:
        raise ValueError("--vary density sets the density: drop --block-sparse")
    sparse = _sparse(0.5 if vary == "density" else block_sparse, block_pattern, block_seed, block_size)
    if sparse is None:
        return {}
    return {"block_sparse": None if vary == "density" else sparse["density"], "block_pattern": sparse["kind"],
            "block_seed": sparse["seed"], "block_size": sparse["block_q"]}


def _progress(jobs: list, label: str) -> Any:
    """Iterate ``jobs`` with a progress bar on stderr, so stdout stays the report."""
    with click.progressbar(jobs, label=label, file=sys.stderr,
                           item_show_func=lambda job: None if job is None else f"{job[0]} {job[1].label}") as bar:
        yield from bar


@cli.command("info")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@user_errors
def info_cmd(as_json: bool) -> None:
    """Device, CUDA/cupy/torch versions, the algorithms and dtypes that run here, the kernel caches."""
    from . import info

    doc = info.collect()
    _emit(doc, as_json, info.render(doc))


@cli.command("warmup")
@click.option("--dtype", "dtypes", default="float16,float32", show_default=True,
              help="comma-separated: float32, float16, bfloat16")
@click.option("--d", "ds", default="64,128", show_default=True, help="head dims, comma-separated")
@click.option("--algorithms", default="flash", show_default=True,
              help="comma-separated: flash, two_pass, standard (the schedules the library picks for each)")
@click.option("--causal", is_flag=True, help="also the causal plans")
@click.option("--no-backward", is_flag=True, help="forward plans only")
@click.option("--N", "ns", default="1024,4096,16384", show_default=True,
              help="sequence lengths of the plans, comma-separated (the fast forward's tiles and standard's "
                   "row-wise kernels depend on N)")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@user_errors
def warmup_cmd(dtypes, ds, algorithms, causal, no_backward, ns, as_json) -> None:
    """Compile the kernels of the library's common calls on this GPU (cupy keeps them on disk)."""
    from . import warmup
    from ._cupy import require_cupy
    from .gpu import cupy_cache_dir

    dtype_list = [check_dtype(x.strip()) for x in dtypes.split(",") if x.strip()]
    try:
        d_list = [int(x) for x in ds.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"--d takes comma-separated integers, got {ds!r}") from exc
    try:
        n_list = tuple(int(x) for x in ns.split(",") if x.strip())
    except ValueError as exc:
        raise ValueError(f"--N takes comma-separated integers, got {ns!r}") from exc
    if not n_list or min(n_list) < 1:
        raise ValueError(f"--N must be >= 1, got {ns}")
    names = tuple(x.strip() for x in algorithms.split(",") if x.strip())
    plans = warmup.warmup_plans(dtype_list, d_list, names, causal=causal, backward=not no_backward,
                                ns=n_list)
    require_cupy()
    rows = warmup.warmup(plans, progress=lambda p: click.echo(f"iokernels: compiling {p.label} {p.dtype} d={p.d}"
                                                              + (" causal" if p.causal else ""), err=True))
    _emit({"header": {"cache": str(cupy_cache_dir())}, "rows": rows}, as_json,
          warmup.render(rows, str(cupy_cache_dir())))


def main() -> None:
    cli(prog_name="iokernels")


if __name__ == "__main__":
    main()
