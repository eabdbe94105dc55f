"""The ``paper`` commands: the FlashAttention paper's figures reproduced (``paper fig2``)."""

from __future__ import annotations

import shlex

import click

from ..kernels.runtime import source_commit
from ..model.specs import current_device_spec, resolve_spec
from ..plan.masks import PATTERNS
from ..plan.units import check_dtype, format_bytes, parse_size
from .app import cli
from .options import SIZE_HELP, check_repeats, emit, user_errors


@cli.group("paper")
def paper() -> None:
    """The FlashAttention paper's figures (Dao et al. 2022), measured and predicted."""


def _command_line(ctx: click.Context) -> str:
    """The command as typed, rebuilt from the options that differ from their defaults."""
    words = ["iokernels", "paper", ctx.info_name or "fig2"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if not isinstance(param, click.Option) or value in (None, False) or value == param.get_default(ctx):
            continue
        flag = max(param.opts, key=len)
        words += [flag] if param.is_flag else [flag, str(value)]
    return shlex.join(words)


@paper.command("fig2")
@click.option("--panels", default="left,middle,right", show_default=True,
              help="comma-separated subset of left,middle,right")
@click.option("--spec", "--gpu", "spec_name", default=None,
              help="GPU spec of the predicted columns and the default M (see `iokernels specs`; a100 for the "
                   "paper's GPU); default: the current device, else h200")
@click.option("--sram", default=None, help=f"M, shared memory per block (default: the spec's per-block limit): "
                                           f"{SIZE_HELP}")
@click.option("--N", "n", type=int, default=1024, show_default=True, help="sequence length")
@click.option("--d", "d", type=int, default=64, show_default=True, help="head dimension")
@click.option("--batch", type=int, default=64, show_default=True)
@click.option("--heads", type=int, default=16, show_default=True)
@click.option("--dtype", default="float16", show_default=True, help="float16, bfloat16 or float32")
@click.option("--schedule", type=click.Choice(["kv_outer", "q_outer"]), default="kv_outer", show_default=True,
              help="the flash forward of the middle and right panels (kv_outer: the paper's Algorithm 1)")
@click.option("--blocks", default=None,
              help="middle: comma-separated resident block sizes (default: 64, 128, ... while they fit M)")
@click.option("--densities", default="1,0.5,0.25,0.125,0.0625", show_default=True,
              help="right: fractions of nonzero blocks, in (0, 1]")
@click.option("--block-pattern", "block_pattern", type=click.Choice(list(PATTERNS)), default="random",
              show_default=True, help="right: the block mask's pattern")
@click.option("--block-size", "block_size", type=int, default=128, show_default=True,
              help="right: queries and keys per block of the mask")
@click.option("--block-seed", "block_seed", type=int, default=0, show_default=True, help="right: seed of random")
@click.option("--repeats", type=int, default=10, show_default=True, help="timed runs per plan (GPU)")
@click.option("--no-ncu", "no_ncu", is_flag=True, help="skip the DRAM columns (Nsight Compute)")
@click.option("--predict-only", "predict_only", is_flag=True, help="run nothing, even with a GPU")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="write the three panels to this file (PNG; needs matplotlib)")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@click.pass_context
@user_errors
def fig2_cmd(ctx, panels, spec_name, sram, n, d, batch, heads, dtype, schedule, blocks, densities, block_pattern,
             block_size, block_seed, repeats, no_ncu, predict_only, plot_path, as_json) -> None:
    """Figure 2: GPT-2 medium (left), block size (middle), block sparsity (right), beside the paper's A100."""
    from ..analysis import figure2
    from ..analysis.compare import environment

    chosen = figure2.parse_panels(panels)
    block_list = None if blocks is None else figure2.parse_numbers("--blocks", blocks, int)
    density_list = figure2.parse_numbers("--densities", densities, float)
    check_repeats(repeats)
    if plot_path is not None:
        from ..analysis.plotting import require_matplotlib

        require_matplotlib()
    spec = resolve_spec(spec_name)
    sram_bytes = spec.smem_per_block_bytes if sram is None else parse_size(sram)
    device = None if predict_only else current_device_spec()
    if device is not None and sram_bytes > device.smem_per_block_bytes:
        raise ValueError(f"M = {sram_bytes} bytes ({format_bytes(sram_bytes)}, from {spec.name}) exceeds this "
                         f"device's per-block limit of {device.smem_per_block_bytes} bytes: give --sram, or "
                         "--predict-only")
    problem = figure2.Problem(N=n, d=d, batch=batch, heads=heads, dtype=check_dtype(dtype), sram=sram_bytes)
    header = {"commit": source_commit(), "command": _command_line(ctx), "environment": environment(),
              "device": None if device is None else device.name}
    measure = dram = None
    if device is None:
        header["reason"] = "--predict-only" if predict_only else "no CUDA device found"
    else:
        def measure(plan):
            return figure2.measure_gpu(plan, repeats=repeats, seed=0)

        dram = _dram(no_ncu, chosen, header)
    click.echo(f"iokernels: figure 2 ({', '.join(chosen)}) " + ("on " + device.name if device else "predicted only")
               + " ...", err=True)
    doc = figure2.build(problem, spec, chosen, schedule=schedule, blocks=block_list, densities=density_list,
                        pattern=block_pattern, sparse_block=block_size, seed=block_seed, measure=measure,
                        dram=dram, header=header)
    if plot_path is not None:
        from ..analysis.figure2_plot import plot

        plot(doc, plot_path)
    emit(doc, as_json, figure2.render(doc))


def _dram(no_ncu: bool, panels: tuple[str, ...], header: dict):
    """The DRAM measurement (ncu) for the panels that show it, or None with the reason in the header."""
    from ..analysis import figure2
    from ..analysis.profile import check_environment

    if no_ncu or not {"left", "middle"} & set(panels):
        header["dram_note"] = "--no-ncu" if no_ncu else "only the left and middle panels show DRAM bytes"
        return None
    try:
        ncu = check_environment()
    except RuntimeError as exc:
        header["dram_note"] = str(exc)
        return None

    def dram(plans):
        return figure2.dram_bytes(plans, ncu=ncu)
    return dram
