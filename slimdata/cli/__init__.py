"""The ``slimdata`` command line: a thin click group; each command lives in its own module
and is imported only when invoked (so ``slimdata stats`` does not pay for torch).

Every :class:`~slimdata.errors.SlimdataError` becomes a one-line ``error: ...`` message and
exit code 2, never a bare traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from slimdata import __version__
from slimdata.errors import SlimdataError

__all__ = ["COMMANDS", "cli", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("slimdata.cli.build", "Tokenize, slice and cost-annotate a corpus into MDS shards."),
    "stats": ("slimdata.cli.stats", "Summarize document shards (text, --json, PNG plots)."),
    "plan": ("slimdata.cli.plan", "Solve packing plans for an epoch and write plan shards."),
    "simulate": ("slimdata.cli.simulate", "Predict step time of packing strategies."),
    "profile": ("slimdata.cli.profile", "Measure and fit cost-model coefficients on this device."),
}


class UsageFailure(click.ClickException):
    """A :class:`SlimdataError` shown as ``Error: ...`` with exit code 2, like bad usage."""

    exit_code = 2


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(n, h) for n, (_m, h) in COMMANDS.items()])

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SlimdataError as exc:
            raise UsageFailure(str(exc)) from exc


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="slimdata")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """slimdata: make LLM training on long-tailed, variable-length data fast."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="slimdata", standalone_mode=True)
    except SlimdataError as exc:  # raised outside a command's invoke (e.g. option callbacks)
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
