"""The speed commands: ``bench`` (iokernels beside its peers) and ``kernel-bench`` (per kernel stage)."""

from __future__ import annotations

import click

from ..plan.dropout import check_p
from ..plan.units import check_dtype
from .app import cli
from .options import SIZE_HELP, emit, plans_from_options, problem_options, user_errors


@cli.command("kernel-bench")
@problem_options
@click.option("--repeats", type=int, default=20, show_default=True, help="timed runs per stage")
@user_errors
def kernel_bench_cmd(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align, as_json,
                     repeats) -> None:
    """Each kernel stage against the GPU's copy bandwidth and cupy.matmul; counting vs plain build."""
    from ..bench import stages
    from ..kernels.runtime import require_cupy

    require_cupy()
    plans, _ = plans_from_options(n, n_q, n_k, d, sram, dtype, batch, heads, gpu, backward, causal, causal_align)
    click.echo(f"iokernels: benchmarking {len(plans)} plans ...", err=True)
    doc = stages.kernel_bench(plans, repeats=repeats)
    emit(doc, as_json, stages.render(doc))


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
    from ..bench import clocks, configs, implementations, suite

    timing = clocks.Timing(warmup=warmup, repeats=repeats, max_call_seconds=max_call_ms / 1e3,
                           budget_seconds=time_budget)
    timing.check()
    check_p(dropout_p)
    dtype_list = configs.parse_dtypes(dtypes)
    problems = [] if long_only else configs.main_problems(configs.parse_ints("--d", ds), configs.parse_ints("--N", ns),
                                                          dtype_list, tokens=tokens, heads=heads, causal=causal,
                                                          dropout=dropout_p)
    long = configs.long_problems(n_max=long_max_n, dtype=check_dtype(long_dtype), causal=causal, dropout=dropout_p) \
        if long_table or long_only else []
    names = (implementations.parse_names("--impls", impls, implementations.OURS, implementations.IMPL_ALIASES,
                                         implementations.DEFAULT_OURS)
             + implementations.parse_names("--peers", peers, implementations.PEERS, implementations.PEER_ALIASES,
                                           implementations.PEERS))
    if not names:
        raise ValueError("--impls and --peers select no implementation")
    chosen = implementations.make_impls(names, sram=sram)
    passes = configs.PASSES if backward else ("fwd",)
    if all(i.unavailable(p) for i in chosen for p in passes):
        reasons: dict[str, list[str]] = {}
        for i in chosen:
            reasons.setdefault(i.unavailable("fwd") or "", []).append(i.name)
        raise RuntimeError("nothing to measure, no implementation is available: "
                           + "; ".join(f"{', '.join(v)}: {k}" for k, v in reasons.items()))
    click.echo(f"iokernels: bench of {len(chosen)} implementations on {len(problems)} configurations"
               + (f" and {len(long)} long-sequence lengths" if long else "") + " ...", err=True)
    header = {"tokens": tokens, "heads": heads, "causal": causal, "dropout": dropout_p, "sram": sram,
              "long": {"heads": configs.LONG_HEADS, "d": configs.LONG_D, "batch": configs.LONG_BATCH,
                       "dtype": check_dtype(long_dtype),
                       "n_max": long_max_n} if long else None}
    doc = suite.run(problems, chosen, timing, long=long, backward=backward, header=header,
                 progress=lambda msg: click.echo(f"iokernels: {msg}", err=True))
    emit(doc, as_json, suite.render(doc))
