"""``slimdata stats DIR``: summary of a build as text or JSON, plus optional PNG plots."""

from __future__ import annotations

import click

from slimdata.cli.options import json_option, writable_folder, write_json

__all__ = ["command"]


@click.command("stats")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@json_option("the summary")
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False),
    callback=writable_folder,
    default=None,
    help="Write lengths.png and shares.png here.",
)
def command(directory: str, json_path: str | None, plots_dir: str | None) -> None:
    """Documents, tokens, length percentiles and the tail's share of tokens and attention work.

    \b
    Example:
        slimdata stats demo-out --plots demo-out/plots --json demo-out/stats.json
    """
    from slimdata.stats import format_stats, shard_stats

    stats = shard_stats(directory)
    if plots_dir:
        from slimdata.plots import write_plots

        stats["plots"] = [str(p) for p in write_plots(directory, plots_dir)]
    if json_path == "-":
        write_json(stats, json_path)
        return
    click.echo(format_stats(stats))
    for path in stats.get("plots", []):
        click.echo(f"plot         {path}")
    if json_path is not None:
        write_json(stats, json_path)
