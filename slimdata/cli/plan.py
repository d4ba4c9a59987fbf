"""``slimdata plan``: solve every step of an epoch and write plan shards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from slimdata.cli.options import (
    MEMORY_BUDGET_OPTIONS,
    POSITIVE_INT,
    cost_model_from_options,
    cost_model_options_auto,
    cost_options_given,
    json_option,
    plan_layout_options,
    renamed_option,
    resolve_memory,
    resolve_mode,
    write_json,
)
from slimdata.errors import ConfigError
from slimdata.units import MAX_RANKS, gib, plural

if TYPE_CHECKING:
    from slimdata.cost import CostModel

__all__ = ["command", "echo_cp_choice", "echo_warnings"]


@click.command("plan")
@click.argument("shards", required=False, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--lengths",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Plan from document lengths (one int per line or a JSON list; .gz ok) instead of shards.",
)
@plan_layout_options(required=True)
@click.option(
    "--slice-tokens",
    type=POSITIVE_INT,
    default=None,
    help="Slice length when planning from --lengths [default: 2048]; SHARDS keep the slices "
    "they were built with.",
)
@click.option(
    "-o",
    "--output",
    "out",
    required=False,
    type=click.Path(file_okay=False),
    help="Output directory for plan shards.  [required]",
)
@renamed_option("--out", "out", "--output", type=click.Path(file_okay=False))
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace earlier plan shards in OUTPUT (also those a killed run left).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Finish the plan a killed run was writing in OUTPUT (same inputs and options): it is "
    "solved again, and the plan shards equal an uninterrupted run's.",
)
@click.option("--quiet", is_flag=True, help="No progress bar (shown only on a terminal).")
@json_option("the summary (steps, imbalance, solve time, memory budget)")
@cost_model_options_auto
@click.pass_context
def command(
    ctx: click.Context,
    shards,
    lengths,
    out,
    overwrite,
    resume,
    quiet,
    json_path,
    model,
    device,
    recompute,
    cost_profile,
    **layout,
) -> None:
    """Solve packing plans for an epoch and write one MDS sample per (step, rank).

    From SHARDS (a `slimdata build` output) the plan uses the build's cost model unless a
    cost option is given, and every payload carries its rank's tokens.

    \b
    Example:
        slimdata plan out/ --nodes 2 --ranks-per-node 8 --global-batch-tokens 1048576 -o plan/

    The memory budget defaults to what the --cost-device leaves after the model states
    (--parallelism, --optimizer), as in `slimdata simulate`; --memory-gib sets it. An
    OUTPUT that is not empty is refused unless --overwrite or --resume (then it must hold
    plan shards, finished or left by a killed run).
    """
    from slimdata.planning import plan_to_shards

    if out is None:
        raise click.UsageError("Missing option '-o' / '--output'.")
    if (shards is None) == (lengths is None):
        what = "not both" if shards is not None else "one of them"
        raise click.UsageError(f"give SHARDS (a `slimdata build` output) or --lengths FILE, {what}")
    ranks = layout["nodes"] * layout["ranks_per_node"]
    if ranks > MAX_RANKS:
        raise click.UsageError(
            f"--nodes {layout['nodes']} x --ranks-per-node {layout['ranks_per_node']} = "
            f"{ranks:,} ranks, more than {MAX_RANKS:,}"
        )
    if lengths is not None:  # a bad file is the first thing to hear about, not the budget
        from slimdata.docsource import load_lengths

        load_lengths(lengths)
    cost = (
        cost_model_from_options(model, device, recompute, cost_profile, layout["context"])
        if cost_options_given(ctx) or shards is None
        else None
    )
    budget = {name: layout.pop(name) for name in MEMORY_BUDGET_OPTIONS}
    resolve_mode(layout, budget["parallelism"])
    if budget["parallelism"] == "fsdp":
        _check_fsdp_recompute(cost, shards)
    layout["memory_gib"], how = _memory_budget(budget, device, cost, shards, layout)
    with _fsdp_advice(budget["parallelism"] == "fsdp"):
        summary = plan_to_shards(
            out,
            shards=shards,
            lengths=lengths,
            cost=cost,
            overwrite=overwrite,
            resume=resume,
            progress=not quiet,
            **layout,
        )
    result = {**summary, "memory_gib": layout["memory_gib"], "memory_budget": how}
    echo_warnings(summary)
    if json_path == "-":
        write_json(result, json_path)
        return
    _echo_summary(summary, layout, out, how)
    if json_path is not None:
        write_json(result, json_path)


@contextmanager
def _fsdp_advice(fsdp: bool) -> Iterator[None]:
    """Under FSDP a memory refusal does not advise full recompute (FSDP runs plans without
    recompute, :func:`_check_fsdp_recompute`); what else it advises stands."""
    from slimdata.errors import PlanError
    from slimdata.solver.strategies.slimpack import recompute_advice

    try:
        yield
    except PlanError as exc:
        advice = recompute_advice("none")
        if not fsdp or advice not in str(exc):
            raise
        raise PlanError(str(exc).replace(advice, "")) from None


def _check_fsdp_recompute(cost: CostModel | None, shards: str | None) -> None:
    """FSDP runs plans solved without recompute (``run_step`` refuses the others under FSDP):
    the plan's cost model, the given one or the build's, must assume none."""
    from slimdata.planning import build_cost_model

    if cost is None:  # planning from shards without cost options: the build's own
        assert shards is not None
        cost = build_cost_model(shards)
    policy = cost.recompute
    if policy != "none":
        raise ConfigError(
            f"--parallelism fsdp: the cost model assumes {policy} recompute, which run_step "
            "does not run under FSDP; plan with --recompute none (and a --memory-gib that "
            "holds the activations)"
        )


def _memory_budget(
    budget: dict[str, Any],
    device: str,
    cost: CostModel | None,
    shards: str | None,
    layout: dict[str, Any],
) -> tuple[float, str]:
    """Per-device memory budget in GiB and how it was chosen (``resolve_memory``): the model
    whose states are left out is the given cost model's, else the build's (``cost`` is None
    only when planning from shards without cost options)."""
    from slimdata.planning import build_cost_model

    given = budget["memory_gib"] is not None or cost is not None
    return resolve_memory(
        budget["memory_gib"],
        device,
        cost if given or shards is None else build_cost_model(shards),
        budget["parallelism"],
        budget["optimizer"],
        layout["nodes"] * layout["ranks_per_node"],
        1,
        pp_option=False,
    )


def _echo_summary(summary: dict[str, Any], layout: dict[str, Any], out: str, how: str) -> None:
    click.echo(f"memory budget {gib(layout['memory_gib'])} per device: {how}")
    steps, ranks = summary["steps"], layout["nodes"] * layout["ranks_per_node"]
    click.echo(
        f"wrote {plural(steps, 'step')} x {plural(ranks, 'rank')} to {out} "
        f"(strategy {layout['strategy']}, mean imbalance {summary['mean_imbalance']:.4f}, "
        f"solve {summary['solve_ms_total']:.0f} ms total)"
    )
    echo_cp_choice(summary)


def echo_cp_choice(summary: dict[str, Any]) -> None:
    """How ``--cp auto`` chose (the summary's ``cp_choice``), when it did."""
    choice = summary.get("cp_choice")
    if choice is not None and not choice["screened"]:
        click.echo(f"static CP {choice['cp']} (--cp auto): {choice['reason']}")
    elif choice is not None:
        click.echo(
            f"static CP {choice['cp']} (--cp auto): the fastest size on the first step that "
            f"plans every step; sizes screened because {choice['reason']}"
        )
        for t in choice["screened"]:
            got = f"{t['step_time']:.3f} s" if "step_time" in t else f"fails: {t['error']}"
            click.echo(f"  cp={t['cp']}: first step {got}")
        for line in choice["failed"]:
            click.echo(f"  {line}")


def echo_warnings(summary: dict[str, Any]) -> None:
    """The plan's warnings (steps far from --global-batch-tokens), on standard error."""
    for line in summary["warnings"]:
        click.echo(f"warning: {line}", err=True)
