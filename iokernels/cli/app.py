"""The ``iokernels`` group; the command modules (:mod:`.research`, :mod:`.bench`, :mod:`.library`) add to it."""

from __future__ import annotations

import click

from .options import Cli


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="iokernels")
def cli() -> None:
    """Attention kernels that count their HBM bytes, beside an exact model of those bytes."""


def main() -> None:
    cli(prog_name="iokernels")
