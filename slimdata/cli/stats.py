"""``slimdata stats DIR``: summary of a build as text or JSON, plus optional PNG plots."""

from __future__ import annotations

import json

import click

__all__ = ["command"]


@click.command("stats")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write lengths.png and shares.png here.",
)
def command(directory: str, as_json: bool, plots_dir: str | None) -> None:
    """Documents, tokens, length percentiles and the tail's share of tokens and attention work."""
    from slimdata.stats import format_stats, shard_stats

    stats = shard_stats(directory)
    if plots_dir:
        from slimdata.plots import write_plots

        stats["plots"] = [str(p) for p in write_plots(directory, plots_dir)]
    if as_json:
        click.echo(json.dumps(stats, indent=1))
    else:
        click.echo(format_stats(stats))
        for path in stats.get("plots", []):
            click.echo(f"plot         {path}")
