"""The speed commands: ``bench`` (iokernels beside its peers) and ``kernel-bench`` (per kernel stage)."""

from __future__ import annotations

import shlex

import click
from click.core import ParameterSource

from ..bench import configs
from ..bench.configs import DEFAULT_DS, DEFAULT_DTYPES, DEFAULT_NS, OVERHEAD_DS, OVERHEAD_DTYPES, OVERHEAD_NS
from ..plan.dropout import check_p
from ..plan.units import check_dtype
from ..plan.variants import check_softcap
from .app import cli
from .options import SIZE_HELP, emit, parse_window, plans_from_options, problem_options, user_errors


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


def _csv(values: tuple) -> str:
    return ",".join(str(v) for v in values)


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def _command_line(ctx: click.Context) -> str:
    """The command as run, rebuilt from the options given (their defaults left out)."""
    words = ["iokernels", ctx.info_name or "bench"]
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or not _given(ctx, param.name):
            continue
        value = ctx.params[param.name]
        if param.is_flag:
            words.append(param.opts[0] if value or not param.secondary_opts else param.secondary_opts[0])
        else:
            words += [max(param.opts, key=len), str(value)]
    return shlex.join(words)


# the bench options that --decode does not take, and the --decode options
NOT_DECODE = ("ns", "tokens", "heads", "causal", "dropout_p", "window", "documents", "softcap", "alibi", "attn_mask",
              "block_sparse", "block_pattern", "block_seed", "overhead", "overhead_calls", "long_table", "long_only",
              "long_max_n", "long_dtype", "sram")
DECODE_ONLY = ("decode_heads", "decode_batch", "decode_nk", "decode_nq")
# the bench options that --varlen does not take, and the --varlen options
NOT_VARLEN = ("ns", "tokens", "dropout_p", "window", "documents", "softcap", "alibi", "attn_mask", "block_sparse",
              "block_pattern", "block_seed", "overhead", "overhead_calls", "long_table", "long_only", "long_max_n",
              "long_dtype", "sram", "impls", "peers", "decode")
# what --block-sparse does not combine with (the block mask runs alone, with --causal or without), and why
NOT_BLOCK_SPARSE = {"documents": "two masks", "window": "two masks",
                    "softcap": "the block-sparse run times the block mask alone",
                    "dropout_p": "the block-sparse run times the block mask alone"}
VARLEN_ONLY = ("varlen_batch", "varlen_max")


@cli.command("bench")
@click.option("--d", "ds", default=None,
              help=f"head dims, comma-separated [default: {_csv(DEFAULT_DS)}; with --overhead {_csv(OVERHEAD_DS)}]")
@click.option("--N", "ns", default=None,
              help=f"sequence lengths, comma-separated [default: {_csv(DEFAULT_NS)}; with --overhead "
                   f"{_csv(OVERHEAD_NS)}]")
@click.option("--tokens", type=int, default=262144, show_default=True, help="B*H*N of every configuration")
@click.option("--heads", type=int, default=16, show_default=True, help="H; batch B = tokens / (N*H)")
@click.option("--dtype", "dtypes", default=None,
              help=f"comma-separated dtypes [default: {_csv(DEFAULT_DTYPES)}; with --overhead {_csv(OVERHEAD_DTYPES)}]")
@click.option("--causal", is_flag=True, help="causal attention (N_q = N_k, so top-left and bottom-right agree)")
@click.option("--dropout", "dropout_p", type=float, default=0.0, show_default=True, metavar="P",
              help="dropout probability on P for every implementation (each draws its own mask; cupy has none)")
@click.option("--window", "window", default=None, metavar="LEFT,RIGHT",
              help="a sliding window (FlashAttention's window_size; -1: that side unbounded) on ours and FlexAttention "
                   "(torch's SDPA has none) and, for the ratio, ours dense (io-dense: no window); TFLOP/s counted on "
                   "the visible elements (and, against io-dense, on ours' computed tiles)")
@click.option("--documents", "documents", type=int, default=None, metavar="K",
              help="document masking (issue #22): each N cut into K documents of equal length (the last takes the "
                   "remainder), a row seeing only its own document's keys (with --causal, those up to its own), on "
                   "ours and FlexAttention (torch's SDPA has none) and, for the ratio, ours dense (io-dense: no "
                   "documents); TFLOP/s counted on the visible elements (and, against io-dense, on ours' computed "
                   "tiles)")
@click.option("--softcap", "softcap", type=float, default=None, metavar="C",
              help="attention softcapping (Gemma 2's; issue #22): every logit capped at C tanh(s / C), C > 0, on ours "
                   "(softcap=C) and FlexAttention (a score_mod; torch's SDPA and cupy have none); combines with "
                   "--causal and --window, not --documents or --dropout; FLOPs as without (the tanh not counted)")
@click.option("--alibi", "alibi", is_flag=True,
              help="ALiBi (FlashAttention-2's alibi_slopes; issue #22): the logits of query i, key j minus "
                   "slope_h |j - i|, the standard slopes 2^(-8(h+1)/H) of the H heads, on ours (alibi_slopes=; the "
                   "sm_90 tma kernels, d up to 128: past it unsup) and FlexAttention (a score_mod; torch's SDPA and "
                   "cupy have none); combines with --causal, --window and --block-sparse, not --softcap, --documents "
                   "or --dropout; FLOPs as without (the bias not counted)")
@click.option("--attn-mask", "attn_mask", type=click.Choice(configs.ATTN_MASKS), default=None,
              help="an explicit mask per batch and head, (B, H, N, N) made once per problem with the same values for "
                   "every implementation, given as attn_mask (issue #22): additive (standard normal, the problem's "
                   "dtype) on ours, SDPA and FlexAttention (a score_mod reading it), or bool (keys kept with "
                   f"probability {configs.ATTN_MASK_KEEP:g}) on ours and SDPA; combines with --causal only; FLOPs as "
                   "without")
@click.option("--block-sparse", "block_sparse", type=float, default=None, metavar="DENSITY",
              help="block-sparse attention (the paper's Algorithm 5; issue #22): a block mask of 128x128 blocks "
                   "keeping about this fraction, in (0, 1], made once per N; ours (block_mask=), FlexAttention (a "
                   "BlockMask of the same blocks) and, for the ratio, ours dense (io-dense: no mask); torch's SDPA "
                   "and cupy have none; combines with --causal only; TFLOP/s on the kept blocks' visible elements "
                   "(io-dense: on its dense count)")
@click.option("--block-pattern", "block_pattern", default=configs.DEFAULT_BLOCK_PATTERN, show_default=True,
              metavar="local|strided|random",
              help="with --block-sparse: the mask's pattern (iokernels.plan.masks.pattern: a band around the "
                   "diagonal, every 1/DENSITY-th key block, or blocks drawn at random)")
@click.option("--block-seed", "block_seed", type=int, default=0, show_default=True,
              help="with --block-sparse and --block-pattern random: the seed of the blocks drawn")
@click.option("--backward/--no-backward", default=True, show_default=True, help="also time the backward pass")
@click.option("--mode", "mode", default=None,
              help="call: CUDA events around back-to-back calls of each public function (host time included); "
                   "graph: each call captured in a CUDA graph and replayed; both: the two side by side "
                   "[default: call; with --decode both]")
@click.option("--overhead", is_flag=True,
              help="instead of TFLOP/s: median and p90 host microseconds per call (CPU timer around the enqueue "
                   "only), forward and forward+backward, ours beside the peers")
@click.option("--overhead-calls", type=int, default=200, show_default=True, help="timed calls per --overhead row")
@click.option("--long", "long_table", is_flag=True,
              help="also the long-sequence table: heads 48, d 64, batch 1, N from 512 doubling to --long-max-n")
@click.option("--long-only", is_flag=True, help="only the long-sequence table")
@click.option("--long-max-n", type=int, default=131072, show_default=True, help="largest N of the long table")
@click.option("--long-dtype", default="float16", show_default=True, help="dtype of the long table")
@click.option("--impls", default="default", show_default=True,
              help="ours, comma-separated: torch (iokernels.torch.attention; alias fast), cupy (iokernels.attention "
                   "on cupy arrays), flash (q_outer), standard, kv_outer (slow; research kernels through the cupy "
                   "call), dense (with --block-sparse, --window or --documents only: torch without the mask), all, "
                   "none; default: torch,cupy; with --block-sparse, --window or --documents torch,dense")
@click.option("--peers", default="all", show_default=True,
              help="peers, comma-separated: cupy, flash, cudnn, efficient, math (torch SDPA backends), flex "
                   "(FlexAttention, compiled), all, none")
@click.option("--sram", default=None,
              help=f"M of the research kernels (default: the library's): {SIZE_HELP}")
@click.option("--warmup", type=int, default=3, show_default=True,
              help="untimed calls before the timed ones (with --overhead: 20 when left at 3)")
@click.option("--repeats", type=int, default=20, show_default=True, help="timed loops per measurement (median)")
@click.option("--max-call-ms", type=float, default=2000.0, show_default=True,
              help="skip a configuration when one call takes (or is estimated to take) longer")
@click.option("--time-budget", type=float, default=None,
              help="seconds for the whole run; once spent, the remaining measurements are skipped (and labelled)")
@click.option("--decode", is_flag=True,
              help="decode attention (issue #23) instead: N_q new tokens against K/V caches of N_k, grouped-query; "
                   "ours beside torch SDPA FLASH, CUDNN, EFFICIENT and its own choice; microseconds, KV TB/s, percent "
                   "of the copy bandwidth, time ratio to the faster of FLASH and CUDNN [d default "
                   f"{_csv(configs.DECODE_DS)}, dtype {_csv(configs.DECODE_DTYPES)}]")
@click.option("--decode-heads", default=None, metavar="H:H_KV,...",
              help="with --decode: query heads and K/V heads, comma-separated pairs "
                   f"[default: {','.join(f'{h}:{k}' for h, k in configs.DECODE_HEADS)}]")
@click.option("--decode-batch", default=None,
              help=f"with --decode: batch sizes [default: {_csv(configs.DECODE_BATCHES)}]")
@click.option("--decode-nk", default=None,
              help=f"with --decode: cache lengths N_k [default: {_csv(configs.DECODE_NKS)}]")
@click.option("--decode-nq", default=None,
              help=f"with --decode: new tokens N_q, N_q > 1 causal bottom-right [default: {_csv(configs.DECODE_NQS)}]")
@click.option("--varlen", is_flag=True,
              help="a variable-length batch (issue #23) instead: B sequences of lengths uniform in 1..--varlen-max, "
                   "packed; ours (iokernels.torch.attention_varlen) beside the dense fast path on the padded batch "
                   "and on the mean length, torch SDPA FLASH and CUDNN on the padded batch and SDPA on nested "
                   "(jagged) tensors; TFLOP/s on the real tokens [d default 128, dtype float16, both modes]")
@click.option("--varlen-batch", type=int, default=64, show_default=True, help="with --varlen: the sequences B")
@click.option("--varlen-max", type=int, default=8192, show_default=True, help="with --varlen: the longest length")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@click.pass_context
@user_errors
def bench_cmd(ctx, ds, ns, tokens, heads, dtypes, causal, dropout_p, window, documents, softcap, alibi, attn_mask,
              block_sparse,
              block_pattern, block_seed, backward, mode,
              overhead, overhead_calls, long_table, long_only, long_max_n, long_dtype, impls, peers, sram, warmup,
              repeats, max_call_ms, time_budget, decode, decode_heads, decode_batch, decode_nk, decode_nq, varlen,
              varlen_batch, varlen_max, as_json) -> None:
    """TFLOP/s of iokernels and its peers (torch SDPA backends, FlexAttention, cupy/cuBLAS) in one run, all
    timed the same way, with ratios; with --overhead, host microseconds per call; with --decode, decode attention
    against long K/V caches (KV bandwidth, percent of copy, time ratios); with --varlen, a variable-length batch."""
    from ..bench import clocks, implementations, suite
    from ..bench import overhead as host

    if varlen:
        _varlen(ctx, ds, dtypes, heads, causal, backward, mode, warmup, repeats, max_call_ms, time_budget,
                varlen_batch, varlen_max, as_json)
        return
    for name in VARLEN_ONLY:
        if _given(ctx, name):
            raise ValueError(f"--{name.replace('_', '-')} applies to bench --varlen only")
    if decode:
        _decode(ctx, ds, dtypes, mode, impls, peers, warmup, repeats, max_call_ms, time_budget, decode_heads,
                decode_batch, decode_nk, decode_nq, backward, as_json)
        return
    for name in DECODE_ONLY:
        if _given(ctx, name):
            raise ValueError(f"--{name.replace('_', '-')} applies to bench --decode only")
    modes = clocks.parse_mode(mode or "call")
    timing = clocks.Timing(warmup=warmup, repeats=repeats, max_call_seconds=max_call_ms / 1e3,
                           budget_seconds=time_budget)
    timing.check()
    check_p(dropout_p)
    window = parse_window(window)
    sparse = _block_sparse(ctx, block_sparse, block_pattern, block_seed, long_table or long_only or overhead)
    if documents is not None:
        if documents < 1:
            raise ValueError(f"--documents must be >= 1, got {documents}")
        if window is not None:  # one mask by position at a time: their combination is neither's workload
            raise ValueError("--documents and --window are two masks: pick one")
        if long_table or long_only or overhead:  # before the problems, whose lengths could fail first
            raise ValueError("--documents applies to the main table's TFLOP/s (not --long, --long-only or --overhead)")
    if softcap is not None:
        try:
            softcap = check_softcap(softcap)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--softcap: {exc}") from None
        if dropout_p:  # ours refuse dropout with a softcap
            raise ValueError("--softcap and --dropout: ours have no dropout with a softcap; pick one")
        if documents is not None:  # ours run documents on the variable-length kernels, which take no softcap
            raise ValueError("--softcap and --documents: ours have no softcap on documents; pick one")
        if long_table or long_only or overhead:
            raise ValueError("--softcap applies to the main table's TFLOP/s (not --long, --long-only or --overhead)")
    if alibi:
        _check_alibi(softcap, dropout_p, documents, long_table or long_only or overhead)
    if attn_mask is not None and (dropout_p or window is not None or documents is not None or softcap is not None
                                  or alibi or sparse is not None or long_table or long_only or overhead):
        raise ValueError("--attn-mask combines with --causal only (the main table's TFLOP/s, the mask alone)")
    if overhead:
        if modes != ("call",):
            raise ValueError("--overhead times host calls; --mode does not apply to it")
        if long_table or long_only:
            raise ValueError("--overhead runs the main configurations; --long and --long-only do not apply to it")
        host.check(overhead_calls, warmup)
    defaults = (configs.OVERHEAD_DS, configs.OVERHEAD_NS, configs.OVERHEAD_DTYPES) if overhead else \
        (configs.DEFAULT_DS, configs.DEFAULT_NS, configs.DEFAULT_DTYPES)
    ds, ns, dtypes = (_csv(default) if given is None else given for given, default in zip((ds, ns, dtypes), defaults,
                                                                                         strict=True))
    dtype_list = configs.parse_dtypes(dtypes)
    problems = [] if long_only else configs.main_problems(configs.parse_ints("--d", ds), configs.parse_ints("--N", ns),
                                                          dtype_list, tokens=tokens, heads=heads, causal=causal,
                                                          dropout=dropout_p, window=window, documents=documents,
                                                          softcap=softcap, block_sparse=sparse, alibi=alibi,
                                                          attn_mask=attn_mask)
    if window is not None and (long_table or long_only or overhead):
        raise ValueError("--window applies to the main table's TFLOP/s (not --long, --long-only or --overhead)")
    long = configs.long_problems(n_max=long_max_n, dtype=check_dtype(long_dtype), causal=causal, dropout=dropout_p) \
        if long_table or long_only else []
    masked = sparse is not None or window is not None or (documents is not None and documents > 1)
    ours, ours_default = (implementations.MASKED_OURS, implementations.MASKED_DEFAULT_OURS) if masked else \
        (implementations.OURS, implementations.DEFAULT_OURS)
    names = (implementations.parse_names("--impls", impls, ours, implementations.IMPL_ALIASES, ours_default)
             + implementations.parse_names("--peers", peers, implementations.PEERS, implementations.PEER_ALIASES,
                                           implementations.PEERS))
    if not masked and implementations.DENSE in names:
        raise ValueError("--impls dense is the dense reference of a masked run: it needs --block-sparse DENSITY, "
                         "--window or --documents K > 1 (without a mask, it is torch)")
    if not names:
        raise ValueError("--impls and --peers select no implementation")
    chosen = implementations.make_impls(names, sram=sram)
    passes = configs.PASSES if backward else ("fwd",)
    if all(i.unavailable(p) for i in chosen for p in passes):
        reasons: dict[str, list[str]] = {}
        for i in chosen:
            reasons.setdefault(i.unavailable("fwd") or "", []).append(i.name)
        _nothing_available(reasons)
    header = {"tokens": tokens, "heads": heads, "causal": causal, "dropout": dropout_p, "sram": sram,
              "window": None if window is None else list(window), "documents": documents, "softcap": softcap,
              "alibi": {"rule": configs.ALIBI_RULE, "slopes": list(configs.alibi_slopes(heads))} if alibi else None,
              "attn_mask": attn_mask,
              "block_sparse": None if sparse is None else {"density": sparse["density"], "pattern": sparse["kind"],
                                                           "seed": sparse["seed"], "block": sparse["block_q"]},
              "command": _command_line(ctx)}

    def progress(msg: str) -> None:
        click.echo(f"iokernels: {msg}", err=True)

    if overhead:
        click.echo(f"iokernels: host overhead of {len(chosen)} implementations on {len(problems)} configurations ...",
                   err=True)
        doc = host.run(problems, chosen, calls=overhead_calls, warmup=20 if warmup == 3 else warmup,
                       backward=backward, header=header, progress=progress)
        emit(doc, as_json, host.render(doc))
        return
    click.echo(f"iokernels: bench of {len(chosen)} implementations on {len(problems)} configurations"
               + (f" and {len(long)} long-sequence lengths" if long else "") + f", mode {mode} ...", err=True)
    header["long"] = {"heads": configs.LONG_HEADS, "d": configs.LONG_D, "batch": configs.LONG_BATCH,
                      "dtype": check_dtype(long_dtype), "n_max": long_max_n} if long else None
    doc = suite.run(problems, chosen, timing, long=long, backward=backward, header=header, modes=modes,
                    progress=progress)
    emit(doc, as_json, suite.render(doc))


def _block_sparse(ctx: click.Context, density, kind, seed, other_table: bool) -> dict | None:
    """--block-sparse DENSITY with --block-pattern and --block-seed as the mask's pattern arguments
    (configs.block_sparse_spec), None without it; ValueError for what does not go with it."""
    if density is None:
        for name in ("block_pattern", "block_seed"):
            if _given(ctx, name):
                raise ValueError(f"--{name.replace('_', '-')} needs --block-sparse DENSITY")
        return None
    sparse = configs.block_sparse_spec(density, kind, seed)
    if _given(ctx, "block_seed") and sparse["kind"] != "random":
        raise ValueError(f"--block-seed applies to --block-pattern random only (the {sparse['kind']} pattern draws "
                         "nothing)")
    for name, why in NOT_BLOCK_SPARSE.items():
        if ctx.params[name]:  # given, and not its default (no dropout, no window, ...)
            flag = next(max(p.opts, key=len) for p in ctx.command.params if p.name == name)
            raise ValueError(f"--block-sparse and {flag}: {why}; pick one (--block-sparse combines with --causal)")
    if other_table:
        raise ValueError("--block-sparse applies to the main table's TFLOP/s (not --long, --long-only or --overhead)")
    return sparse


def _check_alibi(softcap, dropout_p, documents, other_table: bool) -> None:
    """--alibi's refusals (ValueError): what ours or FlexAttention, its peer, do not run with it."""
    if softcap is not None:  # the tma kernels take one or the other
        raise ValueError("--alibi and --softcap: ours have no ALiBi with a softcap; pick one")
    if dropout_p:  # ours would take it; FlexAttention, the one peer with ALiBi, has none: no comparison left
        raise ValueError("--alibi and --dropout: FlexAttention, the peer with ALiBi, has no dropout; pick one")
    if documents is not None:  # ours run documents on the variable-length kernels, which have no ALiBi
        raise ValueError("--alibi and --documents: ours have no ALiBi on documents; pick one")
    if other_table:
        raise ValueError("--alibi applies to the main table's TFLOP/s (not --long, --long-only or --overhead)")


def _nothing_available(reasons: dict[str, list[str]]) -> None:
    raise RuntimeError("nothing to measure, no implementation is available: "
                       + "; ".join(f"{', '.join(v)}: {k}" for k, v in reasons.items()))


def _decode(ctx: click.Context, ds, dtypes, mode, impls, peers, warmup, repeats, max_call_ms, time_budget,
            decode_heads, decode_batch, decode_nk, decode_nq, backward, as_json) -> None:
    """bench --decode: the case grid from the options, ours and the peers, iokernels.bench.decode's run."""
    from ..bench import clocks, decode
    from ..bench.implementations import parse_names

    given = [name for name in NOT_DECODE if _given(ctx, name)] + (["backward"] if backward and _given(ctx, "backward")
                                                                  else [])
    if given:
        flags = ", ".join(max(p.opts, key=len) for p in ctx.command.params if p.name in given)
        raise ValueError(f"--decode measures the forward of decode cases (--decode-heads, --decode-batch, --decode-nk, "
                         f"--decode-nq, --d, --dtype); {flags} do not apply to it")
    modes = clocks.parse_mode(mode or "both")
    timing = clocks.Timing(warmup=warmup, repeats=repeats, max_call_seconds=max_call_ms / 1e3,
                           budget_seconds=time_budget)
    timing.check()

    def ints(option: str, text: str | None, default: tuple[int, ...]) -> list[int]:
        return configs.parse_ints(option, _csv(default) if text is None else text)

    heads = configs.parse_head_pairs("--decode-heads", ",".join(f"{h}:{k}" for h, k in configs.DECODE_HEADS)
                                     if decode_heads is None else decode_heads)
    problems = configs.decode_problems(
        heads, ints("--decode-batch", decode_batch, configs.DECODE_BATCHES),
        ints("--decode-nk", decode_nk, configs.DECODE_NKS), ints("--decode-nq", decode_nq, configs.DECODE_NQS),
        ints("--d", ds, configs.DECODE_DS),
        configs.parse_dtypes(_csv(configs.DECODE_DTYPES) if dtypes is None else dtypes))
    names = (parse_names("--impls", impls, decode.DECODE_OURS, decode.DECODE_OURS_ALIASES, decode.DECODE_OURS)
             + parse_names("--peers", peers, decode.DECODE_PEERS, decode.DECODE_PEER_ALIASES, decode.DECODE_PEERS))
    if not names:
        raise ValueError("--impls and --peers select no implementation")
    chosen = decode.make_impls(names)
    if all(i.unavailable() for i in chosen):
        reasons: dict[str, list[str]] = {}
        for i in chosen:
            reasons.setdefault(i.unavailable() or "", []).append(i.name)
        _nothing_available(reasons)
    click.echo(f"iokernels: bench --decode of {len(chosen)} implementations on {len(problems)} cases, "
               f"mode {', '.join(modes)} ...", err=True)

    def progress(msg: str) -> None:
        click.echo(f"iokernels: {msg}", err=True)

    doc = decode.run(problems, chosen, timing, modes=modes, progress=progress, header={"command": _command_line(ctx)})
    emit(doc, as_json, decode.render(doc))


def _varlen(ctx: click.Context, ds, dtypes, heads, causal, backward, mode, warmup, repeats, max_call_ms, time_budget,
            batch, longest, as_json) -> None:
    """bench --varlen: one problem per d and dtype, every implementation of iokernels.bench.varlen, both passes."""
    from ..bench import clocks, varlen

    given = [name for name in NOT_VARLEN if _given(ctx, name)]
    if given:
        flags = ", ".join(max(p.opts, key=len) for p in ctx.command.params if p.name in given)
        raise ValueError(f"--varlen takes --varlen-batch, --varlen-max, --d, --dtype, --heads, --causal, --backward, "
                         f"--mode and the timing options; {flags} do not apply to it")
    if batch < 1 or longest < 1:
        raise ValueError(f"--varlen-batch and --varlen-max must be >= 1, got {batch}, {longest}")
    modes = clocks.parse_mode(mode or "both")
    timing = clocks.Timing(warmup=warmup, repeats=repeats, max_call_seconds=max_call_ms / 1e3,
                           budget_seconds=time_budget)
    timing.check()
    problems = [varlen.VarlenProblem(batch=batch, max_len=longest, heads=heads, d=d, dtype=t, causal=causal)
                for d in configs.parse_ints("--d", ds or "128") for t in configs.parse_dtypes(dtypes or "float16")]
    chosen = varlen.make_impls(varlen.VARLEN_IMPLS)
    click.echo(f"iokernels: bench --varlen of {len(chosen)} implementations on {len(problems)} problems, mode "
               f"{', '.join(modes)} ...", err=True)
    doc = varlen.run(problems, chosen, timing, modes=modes, passes=varlen.PASSES if backward else ("fwd",),
                     progress=lambda msg: click.echo(f"iokernels: {msg}", err=True),
                     header={"command": _command_line(ctx)})
    emit(doc, as_json, varlen.render(doc))
