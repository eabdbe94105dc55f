"""The research commands: ``model``, ``specs``, ``compare``, ``roofline``, ``profile`` and ``sweep``."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import model
from ..analysis.report import build, render
from ..model.specs import current_device_spec, list_specs, resolve_spec, table_notes
from ..plan import Unsupported, check_runnable
from ..plan.units import check_dtype, format_bytes, parse_size
from .app import cli
from .options import (
    DECODE_OPTION,
    DOCUMENTS_OPTION,
    KV_HEADS_OPTION,
    VARLEN_OPTION,
    block_sparse_options,
    causal_spec,
    check_repeats,
    emit,
    filling_problem_options,
    mask_dropout_options,
    mask_dropout_spec,
    matching_device,
    plans_from_options,
    problem_options,
    sparse_spec,
    user_errors,
)


@cli.command("model")
@problem_options
@block_sparse_options
@mask_dropout_options
@KV_HEADS_OPTION
@DECODE_OPTION
@VARLEN_OPTION
@DOCUMENTS_OPTION
@click.option("--detail", is_flag=True, help="per-tensor rows and formulas")
@click.option("--latex", is_flag=True, help="formulas in LaTeX instead of pretty text")
@user_errors
def model_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json, block_sparse,
              block_pattern, block_seed, block_size, mask_kind, mask_per_head, dropout_p, dropout_seed, window,
              softcap, alibi, mask_mod, score_mod, score_grad, doc_table, kv_heads, decode, varlen, documents, detail,
              latex) -> None:
    """Predicted HBM bytes, FLOPs, footprint and roofline time, with the formulas."""
    plans, spec = plans_from_options(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align,
                         sparse_spec(block_sparse, block_pattern, block_seed, block_size), kv_heads,
                         **mask_dropout_spec(mask_kind, mask_per_head, dropout_p, dropout_seed, window, softcap,
                                             alibi, mask_mod, score_mod, score_grad, doc_table),
                         decode=decode, varlen=varlen, documents=documents)
    doc = build(plans, spec, "model", note="exact model of the plans' tiling; nothing was run")
    doc["formulas"] = {p.label: dict(model.formulas(p.algorithm, p.schedule, p.direction, latex=True,
                                                    variant=p.variant, causal=p.causal,
                                                    block_sparse=p.block_mask is not None, window=p.positional))
                       for p in plans}
    lines = [render(doc, detail=detail, measured=False), ""]
    totals = {(r["algorithm"], r["schedule"], r["pass"]): r for r in doc["rows"] if r["tensor"] == "total"}
    for p in plans:
        t = totals[(p.algorithm, p.schedule_label, p.direction)]
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
                 "B_r, B_c, BM, BN tiles" + (causal_note if any(p.causal or p.window for p in plans) else "")
                 + (sparse_note if any(p.block_mask for p in plans) else "")
                 + ("; window: A_v the visible elements of S" if any(p.window for p in plans) else "") + "):")
    for p in plans:
        for label, formula in model.formulas(p.algorithm, p.schedule, p.direction, latex=latex, per_tensor=detail,
                                             variant=p.variant, causal=p.causal, block_sparse=p.block_mask is not None,
                                             window=p.positional):
            lines.append(f"[{p.label}] {label}:")
            lines.extend("    " + x for x in formula.splitlines())
    emit(doc, as_json, "\n".join(lines))


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
    emit(doc, as_json, text + "\n\n" + table_notes())


@cli.command("compare")
@filling_problem_options
@block_sparse_options
@mask_dropout_options
@KV_HEADS_OPTION
@DECODE_OPTION
@VARLEN_OPTION
@DOCUMENTS_OPTION
@click.option("--detail", is_flag=True, help="per-tensor rows")
@click.option("--simulate", is_flag=True, help="run the CPU simulator even when a GPU is present")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--repeats", type=int, default=10, show_default=True, help="timed runs per plan (GPU)")
@user_errors
def compare_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json, block_sparse,
                block_pattern, block_seed, block_size, mask_kind, mask_per_head, dropout_p, dropout_seed, window,
                softcap, alibi, mask_mod, score_mod, score_grad, doc_table, kv_heads, decode, varlen, documents, detail,
                simulate, seed, repeats) -> None:
    """Run every algorithm and schedule; measured bytes beside the model's, per pass and tensor, and each
    plan's roofline. Without --batch and --heads: heads 16 and a batch that fills the GPU (see the header)."""
    from ..analysis import roofline
    from ..analysis.compare import compare

    device = matching_device(gpu, off=simulate, hint="add --simulate to simulate another GPU's tiling")

    def make(b: int, h: int) -> list:
        return plans_from_options(n, n_q, n_k, d, sram, dtype, b, h, gpu, backward, causal, causal_align,
                                  sparse_spec(block_sparse, block_pattern, block_seed, block_size), kv_heads,
                                  **mask_dropout_spec(mask_kind, mask_per_head, dropout_p, dropout_seed, window,
                                                      softcap, alibi, mask_mod, score_mod, score_grad, doc_table),
                                  decode=decode, varlen=varlen, documents=documents)[0]

    if varlen is not None:  # the batch is the sequences given
        if batch is not None:
            raise ValueError("--varlen: the batch is the sequences given (--batch does not apply)")
        plans, note = make(1, 16 if heads is None else heads), "a variable-length batch (--varlen)"
    elif documents is not None:  # one batch row of 16 heads unless given
        plans = make(1 if batch is None else batch, 16 if heads is None else heads)
        note = "document masking (--documents)"
    else:
        plans, note = _problem_plans(make, gpu, device, batch, heads, kv_heads)
    if device is not None:  # a GPU runs the plans that have kernels (a window: flash/fast's; no decode kernel yet)
        runnable = [p for p in plans if _runnable(p)]
        if not runnable:
            raise ValueError("no plan here has kernels for these options (a window: flash/fast on sm_90, "
                             "float16/bfloat16); add --simulate")
        if len(runnable) < len(plans):
            note = (note + "; " if note else "") + (f"{len(plans) - len(runnable)} plans without kernels for these "
                                                    "options left out (--simulate runs them)")
        plans = runnable
    spec = resolve_spec(gpu)
    check_repeats(repeats)
    reason = "--simulate" if simulate else "no CUDA device found"
    where = "on the GPU" if device is not None else "on the CPU simulator"
    click.echo(f"iokernels: running {len(plans)} plans {where} (batch {plans[0].batch} x heads {plans[0].heads}) ...",
               err=True)
    doc = compare(plans, spec, on_gpu=device is not None, reason=reason, seed=seed, repeats=repeats,
                  problem_note=note)
    roofline.annotate(doc, plans, spec)
    emit(doc, as_json, render(doc, detail=detail, measured=True))


def _runnable(plan) -> bool:
    try:
        check_runnable(plan)
    except Unsupported:
        return False
    return True


def _problem_plans(make, gpu, device, batch, heads, kv_heads) -> tuple[list, str]:
    """The plans for --batch and --heads as given, or (neither given) for the batch x heads that fill the GPU
    (:func:`iokernels.analysis.compare.filling_problem`; device memory bounds them on a GPU); and how."""
    from ..analysis.compare import filling_problem

    if batch is not None or heads is not None:
        return make(1 if batch is None else batch, 1 if heads is None else heads), "as given (--batch, --heads)"
    memory = None
    if device is not None:
        from ..kernels.launch import free_device_bytes

        memory = free_device_bytes()[0]
    return filling_problem(make, resolve_spec(gpu).sms, memory, kv_heads)


@cli.command("roofline")
@filling_problem_options
@click.option("--dram", is_flag=True, help="GPU: also each stage's DRAM bytes from Nsight Compute (needs ncu)")
@click.option("--model-only", "model_only", is_flag=True, help="the predicted columns only, even on a GPU")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="write a log-log roofline (FLOP/byte against TFLOP/s) to this file (PNG; needs matplotlib)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
@click.option("--repeats", type=int, default=10, show_default=True, help="timed runs per stage (GPU)")
@user_errors
def roofline_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json, dram,
                 model_only, plot_path, seed, repeats) -> None:
    """Per plan and stage: FLOPs, HBM bytes, intensity and roofline time; on a GPU the measured copy bandwidth
    and matmul peak, and each stage's achieved TFLOP/s and TB/s (with --dram, DRAM bytes from ncu)."""
    from ..analysis import roofline

    if plot_path is not None:
        from ..analysis.plotting import require_matplotlib

        require_matplotlib()
    check_repeats(repeats)
    device = matching_device(gpu, off=model_only, hint="add --model-only to predict another GPU's roofline")
    if dram and device is None:
        raise RuntimeError("--dram needs a CUDA GPU and Nsight Compute (ncu): " +
                           ("--model-only was given" if model_only else "no CUDA device found"))

    def make(b: int, h: int) -> list:
        return plans_from_options(n, n_q, n_k, d, sram, dtype, b, h, gpu, backward, causal, causal_align)[0]

    plans, note = _problem_plans(make, gpu, device, batch, heads, None)
    spec = resolve_spec(gpu)
    ceilings = measured = None
    if device is not None:
        click.echo(f"iokernels: measuring the ceilings and {len(plans)} plans on the GPU ...", err=True)
        ceilings = roofline.measure_ceilings(plans[0].dtype)
        measured = roofline.measure(plans, seed=seed, repeats=repeats, dram=dram)
        where = (f"GPU: stages timed alone (CUDA-graph replays, median of {repeats})"
                 + ("; DRAM bytes from ncu (cache control all)" if dram else ""))
    else:
        where = ("--model-only" if model_only else "no CUDA device found") + ": predicted columns only, spec ceilings"
    doc = roofline.build(plans, spec, measured_ceilings=ceilings, measured=measured,
                         note=where, problem_note=note)
    if plot_path is not None:
        roofline.plot(doc, plot_path)
    emit(doc, as_json, roofline.render(doc))


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
    from ..analysis import profile

    matching_device(gpu)
    plans, _ = plans_from_options(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align)
    plans = profile.select_plans(plans, algorithms)
    selection = profile.select_stages(plans, kernels)
    ncu = profile.check_environment()
    launches = sum(len(v) for v in selection.values())
    click.echo(f"iokernels: profiling {launches} kernel launches of {len(selection)} plans under ncu ...", err=True)
    doc = profile.profile(plans, selection, cache_control=cache_control, seed=seed, ncu=ncu)
    emit(doc, as_json, profile.render(doc, detail=detail))


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
    from ..analysis import sweep

    if plot_path is not None:
        from ..analysis.plotting import require_matplotlib

        require_matplotlib()
    device = matching_device(gpu, off=simulate, hint="add --simulate to simulate another GPU's tiling")
    check_repeats(repeats)
    spec = resolve_spec(gpu)
    base = sweep.Problem(N_q=n if n_q is None else n_q, N_k=n if n_k is None else n_k, d=d,
                         dtype=check_dtype(dtype), sram=parse_size(sram), batch=batch, heads=heads,
                         causal=causal_spec(causal, causal_align),
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
        from ..analysis.plotting import plot

        plot(doc, plot_path)
    emit(doc, as_json, sweep.render(doc))


def _sweep_sparse(vary: str, block_sparse, block_pattern, block_seed, block_size) -> dict:
    """sweep.Problem's block-sparse fields: --vary density takes the pattern options without --block-sparse."""
    if vary == "density" and block_sparse is not None:
        raise ValueError("--vary density sets the density: drop --block-sparse")
    sparse = sparse_spec(0.5 if vary == "density" else block_sparse, block_pattern, block_seed, block_size)
    if sparse is None:
        return {}
    return {"block_sparse": None if vary == "density" else sparse["density"], "block_pattern": sparse["kind"],
            "block_seed": sparse["seed"], "block_size": sparse["block_q"]}


def _progress(jobs: list, label: str) -> Any:
    """Iterate ``jobs`` with a progress bar on stderr, so stdout stays the report."""
    with click.progressbar(jobs, label=label, file=sys.stderr,
                           item_show_func=lambda job: None if job is None else f"{job[0]} {job[1].label}") as bar:
        yield from bar
