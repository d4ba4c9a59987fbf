"""``slimdata simulate``: predict the step time of packing strategies on your data.

Fairness rules: see :mod:`slimdata.sim.compare` and docs/simulate.md (every baseline at its
best configuration within ``--memory-gib``, same work stated, a plan-independent bound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from slimdata.cli.options import (
    POSITIVE_INT,
    RANKS,
    SEED,
    FiniteFloatRange,
    cost_model_from_options,
    cost_model_options_auto,
    cost_options_given,
    json_option,
    memory_budget_options,
    renamed_option,
    resolve_memory,
    writable_image,
    write_json,
)
from slimdata.errors import ConfigError, InputError, PlanError
from slimdata.units import gib

if TYPE_CHECKING:
    from slimdata.cost import CostModel
    from slimdata.plan import Document
    from slimdata.sim import Comparison
    from slimdata.solver import Layout

__all__ = ["command"]


@click.command("simulate")
@click.argument("shards", required=False, type=click.Path(exists=True, file_okay=False))
@renamed_option("--shards", "shards", "SHARDS", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--lengths",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Lengths file: one int per line or a JSON list (.gz ok).",
)
@cost_model_options_auto
@click.option(
    "--context",
    type=POSITIVE_INT,
    default=131072,
    show_default=True,
    help="Context length (concat row length, pack token cap).",
)
@click.option("--dp", type=RANKS, default=8, show_default=True, help="Data-parallel ranks.")
@click.option("--pp", type=POSITIVE_INT, default=1, show_default=True, help="Pipeline stages.")
@click.option(
    "--ranks-per-node",
    type=RANKS,
    default=8,
    show_default=True,
    help="Devices per node (intra- vs inter-node bandwidth).",
)
@click.option(
    "--global-batch-tokens",
    type=POSITIVE_INT,
    default=None,
    help="Tokens per optimizer step [default: dp * context, times 2 * pp with --pp > 1 so "
    "that every pipeline gets 2 * pp context-long micro-batches].",
)
@memory_budget_options
@click.option(
    "--asymmetric",
    type=click.Choice(["split", "recompute"]),
    default="split",
    show_default=True,
    help="How the executor runs backward packs that are no union of forward packs: split "
    "forward packs into one call per backward pack, or recompute (FSDP always recomputes).",
)
@click.option(
    "--schedule",
    type=click.Choice(["1f1b", "interleaved"]),
    default="1f1b",
    show_default=True,
    help="Pipeline schedule when --pp > 1.",
)
@click.option(
    "--cp-overlap",
    type=FiniteFloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="Share of ring-attention time that can hide the K/V exchange of static CP, DP-Merge "
    "and dcp groups (0: exposed).",
)
@click.option(
    "--baseline-config",
    default="best",
    show_default=True,
    help="Configuration of every baseline: 'best' (fastest static CP size, hence "
    "micro-batches, and pipeline schedule that fit --memory-gib), 'smallest' (smallest "
    "static CP that fits, with --schedule) or 'cp=N', for slimpack too (slimpack on static "
    "CP); dcp always runs cp=1.",
)
@click.option(
    "--strategies", default="all", show_default=True, help="Comma list of strategies, or 'all'."
)
@click.option(
    "--steps",
    type=POSITIVE_INT,
    default=1,
    show_default=True,
    help="Steps (batches) to simulate; results are means.",
)
@click.option(
    "--seed",
    type=SEED,
    default=0,
    show_default=True,
    help="Seed of the batch shuffle and the solvers.",
)
@click.option(
    "--oversize",
    type=click.Choice(["split", "truncate", "error"]),
    default="split",
    show_default=True,
    help="Documents longer than --context (applied alike to every strategy).",
)
@json_option("the settings and per-strategy results (docs/simulate.md, 'JSON contract')")
@click.option(
    "--gantt",
    type=click.Path(dir_okay=False),
    callback=writable_image,
    default=None,
    help="Write a Gantt chart (PNG) of the first step of every strategy.",
)
@click.option(
    "--jobs",
    type=POSITIVE_INT,
    default=None,
    help="Worker processes that solve and simulate the configurations the search will try "
    "[default: the usable cores, at most 8; none for batches under 1M tokens]. The results "
    "are the same for any number.",
)
@click.option("--quiet", is_flag=True, help="No progress bar (shown only on a terminal).")
# one parameter per option; the body below is the command's steps
@click.pass_context
def command(
    ctx: click.Context,
    shards: str | None,
    lengths: str | None,
    model: str,
    device: str,
    recompute: str,
    cost_profile: str | None,
    context: int,
    dp: int,
    pp: int,
    ranks_per_node: int,
    global_batch_tokens: int | None,
    memory_gib: float | None,
    parallelism: str,
    optimizer: str,
    asymmetric: str,
    schedule: str,
    cp_overlap: float,
    baseline_config: str,
    strategies: str,
    steps: int,
    seed: int,
    oversize: str,
    json_path: str | None,
    gantt: str | None,
    jobs: int | None,
    quiet: bool,
) -> None:
    """Solve and simulate the same batches with every strategy; print a comparison table.

    \b
    Fairness: all strategies get the same documents in the same steps, mask attention at
    document boundaries, and respect --memory-gib. Every baseline runs at its best
    configuration (static CP size taken out of DP, micro-batches, 1F1B or interleaved;
    --baseline-config). Strategies that cut documents (concat) are marked '*': they
    compute fewer attention pairs. 'bound' is a plan-independent lower bound of the step.

    \b
    Example (SHARDS from `slimdata build`, or a --lengths file):
        slimdata simulate --lengths lengths.json.gz --dp 16 --pp 4 --json result.json
    """
    from slimdata.sim import SimConfig, compare_strategies
    from slimdata.sim.compare import parse_strategies
    from slimdata.sim.prefetch import default_jobs
    from slimdata.solver import ALL_STRATEGIES

    _check_baseline_cp(baseline_config, dp)
    _note_searched_schedule(ctx, schedule, baseline_config, pp)
    docs = _documents(shards, lengths)
    cost = _cost_model(ctx, shards, model, device, recompute, cost_profile, context)
    memory_gib, memory_how = resolve_memory(
        memory_gib, device, cost, parallelism, optimizer, dp, pp
    )
    layout = _layout(dp, pp, ranks_per_node, memory_gib, context, parallelism)
    with _progress_bar(quiet) as progress:
        cmp = compare_strategies(
            docs,
            layout,
            cost,
            strategies=parse_strategies(strategies, list(ALL_STRATEGIES)),
            steps=steps,
            seed=seed,
            global_batch_tokens=_global_batch_tokens(global_batch_tokens, dp, pp, context),
            config=SimConfig(
                parallelism=parallelism,
                asymmetric=asymmetric,
                schedule=schedule,
                cp_overlap=cp_overlap,
            ),
            oversize=oversize,
            baseline_config=baseline_config,
            memory_budget=memory_how,
            progress=progress,
            jobs=default_jobs() if jobs is None else jobs,
            timelines=gantt is not None,
        )
    cmp.config.update(
        model=model if cost_options_given(ctx) or shards is None else cost.label,
        device=device,
        recompute=cost.recompute,
        cost_profile=cost_profile,
        optimizer=optimizer,
    )
    _report(cmp, json_path, gantt)
    _check_any_fits(cmp)


@contextmanager
def _progress_bar(quiet: bool) -> Iterator[Callable[[str], None] | None]:
    """A bar on standard error, when it is a terminal and not ``quiet``, counting the steps
    simulated (the configuration search runs many per strategy) and naming the strategy
    searched; closed before the table is printed."""
    if quiet:
        yield None
        return
    from tqdm.auto import tqdm

    with tqdm(desc="simulate", unit=" steps", disable=None) as bar:

        def simulated(strategy: str) -> None:
            bar.set_postfix_str(strategy, refresh=False)
            bar.update()

        yield simulated


def _cost_model(
    ctx: click.Context,
    shards: str | None,
    model: str,
    device: str,
    recompute: str,
    cost_profile: str | None,
    context: int,
) -> CostModel:
    """The cost model of the options; for shards without any cost option, the one the build
    recorded (as `slimdata plan` does)."""
    if shards is not None and not cost_options_given(ctx):
        from slimdata.planning import build_cost_model

        return build_cost_model(shards)
    return cost_model_from_options(model, device, recompute, cost_profile, context)


def _documents(shards: str | None, lengths: str | None) -> list[Document]:
    """The documents of SHARDS or of the --lengths file (exactly one of them)."""
    from slimdata.docsource import documents_from_lengths, load_lengths, load_shard_documents

    if shards is not None and lengths is None:
        return load_shard_documents(shards)
    if lengths is not None and shards is None:
        return documents_from_lengths(load_lengths(lengths))
    raise ConfigError("give exactly one of SHARDS (a build directory) or --lengths FILE")


def _global_batch_tokens(given: int | None, dp: int, pp: int, context: int) -> int:
    """--global-batch-tokens, by default ``dp * context``; with pipeline stages every
    pipeline gets ``2 * pp`` context-long micro-batches (enough to fill 1F1B)."""
    if given is not None:
        return given
    return dp * context * (2 * pp if pp > 1 else 1)


def _layout(
    dp: int, pp: int, ranks_per_node: int, memory_gib: float, context: int, parallelism: str
) -> Layout:
    """The training layout; packs run in lockstep under pipeline stages or FSDP."""
    from slimdata.solver import Layout

    mode = "lockstep" if (pp > 1 or parallelism == "fsdp") else "free"
    return Layout(
        dp=dp,
        pp=pp,
        ranks_per_node=ranks_per_node,
        memory_gib=memory_gib,
        context=context,
        mode=mode,
    )


def _check_baseline_cp(spec: str, dp: int) -> None:
    """A fixed ``--baseline-config cp=N`` must divide --dp (every strategy would fail)."""
    from slimdata.sim.search import parse_baseline_config

    choice = parse_baseline_config(spec)
    if choice.mode == "fixed" and dp % choice.cp:
        raise ConfigError(
            f"--baseline-config cp={choice.cp} does not divide --dp {dp}: static CP takes "
            "its ranks out of the data-parallel ones"
        )


def _note_searched_schedule(ctx: click.Context, schedule: str, spec: str, pp: int) -> None:
    """A --schedule given with --pp > 1 under ``--baseline-config best``, which chooses every
    strategy's schedule itself: say so on standard error rather than drop it silently."""
    from slimdata.sim.search import parse_baseline_config

    given = ctx.get_parameter_source("schedule") != ParameterSource.DEFAULT
    if given and pp > 1 and parse_baseline_config(spec).mode == "best":
        click.echo(
            "note: --baseline-config best chooses each strategy's pipeline schedule (column "
            f"sched), so --schedule {schedule} is not imposed; use --baseline-config smallest "
            f"or cp=N to run {schedule}",
            err=True,
        )


def _check_any_fits(cmp: Comparison) -> None:
    """After the report: a comparison in which every strategy failed or went over the memory
    budget answers no question a user asked, so it ends as an error (exit code 2)."""
    from slimdata.cost.states import budget_text

    if cmp.results and all(r.error or r.over_memory_steps for r in cmp.results.values()):
        budget = budget_text(cmp.config["memory_gib"], cmp.config["memory_budget"])
        raise PlanError(
            f"no strategy fits {budget} per device "
            "(each failed or went over it, above): raise --memory-gib, use more devices or "
            "a larger --pp, or lower --context"
        )


def _report(cmp: Comparison, json_path: str | None, gantt: str | None) -> None:
    """The table and the memory budget (only the JSON with `--json` alone), then the --json
    file and the --gantt chart."""
    from slimdata.sim import format_table

    if json_path == "-":
        write_json(cmp.to_dict(), json_path)
        return
    c = cmp.config
    click.echo(
        f"{c['documents']} documents, {c['cost_model']}, dp={c['dp']} pp={c['pp']} context={c['context']}, "
        f"{c['global_batch_tokens']} tokens/step, {c['steps']} step(s)"
    )
    click.echo(format_table(cmp))
    click.echo(f"memory budget {gib(c['memory_gib'])} per device: {c['memory_budget']}")
    if json_path is not None:
        write_json(cmp.to_dict(), json_path)
    if gantt:
        from slimdata.sim.gantt import draw_gantt

        try:
            draw_gantt(
                {k: r for k, (_p, r) in cmp.first.items()},
                gantt,
                title=f"dp={c['dp']} pp={c['pp']} context={c['context']}",
            )
        except OSError as exc:  # checked at parse time (writable_image); the disk may refuse
            raise InputError(f"{gantt}: cannot write it ({exc.strerror})") from None
        click.echo(f"wrote {gantt}")
