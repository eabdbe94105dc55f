"""The library's commands: ``info`` and ``warmup``."""

from __future__ import annotations

import click

from ..plan.units import check_dtype
from .app import cli
from .options import emit, user_errors


@cli.command("info")
@click.option("--json", "as_json", is_flag=True, help="one JSON document on stdout")
@user_errors
def info_cmd(as_json: bool) -> None:
    """Device, CUDA/cupy/torch versions, the algorithms and dtypes that run here, the kernel caches."""
    from ..analysis import info

    doc = info.collect()
    emit(doc, as_json, info.render(doc))


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
    from ..kernels.runtime import cupy_cache_dir, require_cupy
    from ..library import warmup

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
    emit({"header": {"cache": str(cupy_cache_dir())}, "rows": rows}, as_json,
          warmup.render(rows, str(cupy_cache_dir())))
