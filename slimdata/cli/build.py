"""``slimdata build``: parse options into a :class:`BuildConfig` and call :func:`build`."""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any, cast

import click
from click.core import ParameterSource

from slimdata.cli.options import (
    MEMORY_BUDGET_OPTIONS,
    PLAN_LAYOUT_OPTIONS,
    POSITIVE_INT,
    cost_model_options_auto,
    creatable_folder,
    json_option,
    plan_layout_options,
    resolve_memory,
    resolve_mode,
    write_json,
)
from slimdata.cost.states import auto_recompute
from slimdata.errors import ConfigError
from slimdata.ingest.config import ENGINES, BuildConfig
from slimdata.ingest.task import QUARANTINE_NAME
from slimdata.readers import FORMATS
from slimdata.slicing import DEFAULT_SLICE_TOKENS
from slimdata.tokenize import DEFAULT_TOKENIZER
from slimdata.units import gib, plural

if TYPE_CHECKING:
    from slimdata.ingest import BuildSummary

__all__ = ["command"]

# CLI parameter name -> BuildConfig field, for options that override a --pipeline recipe.
_PLAN_OPTIONS = (
    *PLAN_LAYOUT_OPTIONS,
    *MEMORY_BUDGET_OPTIONS,
    "strategy",
    "context",
    "seed",
    "mode",
    "oversize",
    "workers_per_rank",
    "cp",
)

_FIELDS = {
    "fmt": "format",
    "text_field": "text_field",
    "id_field": "id_field",
    "source": "source",
    "include": "include",
    "exclude": "exclude",
    "tokenizer": "tokenizer",
    "eos_token": "eos_token",
    "slice_tokens": "slice_tokens",
    "model": "model",
    "device": "device",
    "recompute": "recompute",
    "cost_profile": "cost_profile",
    "truncate": "truncate",
    "compression": "compression",
    "hashes": "hashes",
    "size_limit": "size_limit",
    "workers": "workers",
    "engine": "engine",
    "ray_address": "ray_address",
    "task_bytes": "task_bytes",
}


def _pipeline(name: str | None) -> BuildConfig:
    if name is None:
        return BuildConfig()
    from pipelines import PIPELINES

    if name not in PIPELINES:
        raise ConfigError(f"unknown pipeline {name!r}; available: {', '.join(PIPELINES)}")
    return PIPELINES[name]()


@click.command("build")
@click.argument("inputs", nargs=-1)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(file_okay=False),
    callback=creatable_folder,
    help="Output directory for the MDS shards.",
)
@click.option(
    "--pipeline", default=None, help="Start from a recipe in pipelines/ (stdlib, code, web, books)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="auto",
    show_default=True,
    help="Input format (auto: by file suffix).",
)
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="JSON key / column holding the text (dots for nested keys).",
)
@click.option(
    "--id-field",
    default=None,
    help="JSON key / column holding a document id (default: source/file:line).",
)
@click.option(
    "--source",
    default=None,
    help="Source name stored with every document (default: the input's name).",
)
@click.option(
    "--include",
    multiple=True,
    help="Keep only files matching this glob when walking directories (repeatable).",
)
@click.option(
    "--exclude", multiple=True, help="Skip files/directories matching this glob (repeatable)."
)
@click.option(
    "--tokenizer",
    default=DEFAULT_TOKENIZER,
    show_default=True,
    help="'deepseek', a tokenizer.json, a local HF tokenizer dir, a tiktoken encoding name or a .tiktoken file.",
)
@click.option(
    "--eos-token", default=None, help="EOS token to append (default: the tokenizer's own)."
)
@click.option(
    "--slice-tokens",
    type=POSITIVE_INT,
    default=DEFAULT_SLICE_TOKENS,
    show_default=True,
    help="Slice length (multiple of 128).",
)
@cost_model_options_auto
@click.option(
    "--truncate",
    type=POSITIVE_INT,
    default=None,
    help="Opt-in: keep at most N tokens per document (EOS included); dropped tokens are counted.",
)
@click.option(
    "--compression",
    default=None,
    help="Shard compression: zstd, zstd:<level>, br, bz2, snappy (gz is not byte-reproducible).",
)
@click.option(
    "--hashes",
    default="",
    help="Comma-separated shard hashes recorded in index.json (sha1, xxh64, ...).",
)
@click.option(
    "--size-limit",
    default="64mb",
    show_default=True,
    help="Shard size limit (bytes or 64mb / 1gb).",
)
@click.option(
    "--workers",
    type=POSITIVE_INT,
    default=1,
    show_default=True,
    help="Worker processes (output is identical for any value).",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINES),
    default="local",
    help="Where tasks run: local processes (default) or Ray Data tasks (needs slimdata[ray]); same output.",
)
@click.option(
    "--address",
    "ray_address",
    default=None,
    help="Ray cluster for --engine ray (auto, ray://host:10001); default: RAY_ADDRESS, else a new local cluster.",
)
@click.option(
    "--task-bytes",
    type=POSITIVE_INT,
    default=None,
    help="Input bytes per task/sub-directory (default: total/64, within 256 KiB-4 MiB).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing build in OUTPUT (and earlier plan shards in the --plan directory).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted build in OUTPUT (same inputs and options); with --plan, "
    "solve the plan again over earlier plan shards in its directory.",
)
@click.option(
    "--plan",
    "plan_dir",
    default=None,
    type=click.Path(file_okay=False),
    callback=creatable_folder,
    help="Also solve an epoch's packing plan for the layout below and write plan shards here.",
)
@plan_layout_options(required=False)
@click.option("--quiet", is_flag=True, help="No progress bar and no summary.")
@json_option("the sidecar (counts, fingerprint)")
@click.pass_context
def command(
    ctx: click.Context,
    inputs: tuple[str, ...],
    output: str,
    pipeline: str | None,
    overwrite: bool,
    resume: bool,
    plan_dir: str | None,
    quiet: bool,
    json_path: str | None,
    **options,
) -> None:
    """Tokenize, slice and cost-annotate INPUTS (files, directories, globs) into MDS shards.

    Without INPUTS the embedded default corpus is used: the running interpreter's
    standard-library .py sources (PSF-2.0). The cost model defaults to --model
    llama-8b on --cost-device h100 with --recompute auto (full at the default 128K
    --context, as `plan` and `simulate` assume).

    \b
    Examples:
        slimdata build -o out/                  # the bundled corpus
        slimdata build data/*.jsonl.zst -o out/ --workers 8 --compression zstd

    On a Ray cluster (same output): --engine ray [--address auto].
    """
    from slimdata.ingest import build

    layout = _plan_layout(ctx, options, plan_dir)
    config = _config(ctx, pipeline, inputs, options, layout["context"])
    # --resume finishes the whole command: the plan is solved again over earlier plan shards
    # (recognised by their plan.json, as --overwrite requires)
    replace_plan = overwrite or resume
    how = None if plan_dir is None else _plan_budget(plan_dir, config, layout, replace_plan)
    if (config.compression or "").split(":")[0] == "gz":
        click.echo(
            "warning: --compression gz shards are not byte-identical from build to build "
            "(gzip stamps the time); zstd or br are",
            err=True,
        )
    try:
        summary = build(config, output, overwrite=overwrite, resume=resume, progress=not quiet)
    except KeyboardInterrupt:  # Ctrl-C: click alone would print "Aborted!"
        click.echo(
            f"interrupted: the finished tasks in {output} are kept; rerun the same command "
            "with --resume to continue",
            err=True,
        )
        ctx.exit(130)
    text = not quiet and json_path != "-"  # `--json` alone: standard output holds only JSON
    if json_path is not None:
        write_json(summary.sidecar, json_path)
    if text:
        _echo_summary(summary, output)
    if plan_dir is not None and how is not None:
        _write_plan(plan_dir, output, layout, how, overwrite=replace_plan, echo=text)


def _plan_layout(
    ctx: click.Context, options: dict[str, Any], plan_dir: str | None
) -> dict[str, Any]:
    """Take the options of ``--plan`` out of ``options``; ``--plan`` needs the training
    layout, and without ``--plan`` they would be ignored, so giving them is an error
    (``--context`` aside: it also resolves ``--recompute auto``)."""
    layout = {name: options.pop(name) for name in _PLAN_OPTIONS}
    if plan_dir is None:
        given = [
            f"--{name.replace('_', '-')}"
            for name in _PLAN_OPTIONS
            if name != "context" and ctx.get_parameter_source(name) != ParameterSource.DEFAULT
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)}: the layout of a plan, which needs --plan DIR; "
                "give --plan DIR to write plan shards too, or leave them out"
            )
        return layout
    missing = [f"--{n.replace('_', '-')}" for n in PLAN_LAYOUT_OPTIONS if layout[n] is None]
    if missing:
        raise ConfigError(f"--plan needs the training layout: give {', '.join(missing)}")
    return layout


def _plan_budget(
    plan_dir: str, config: BuildConfig, layout: dict[str, Any], overwrite: bool
) -> str:
    """Check the plan's layout before the build, so that a bad one fails before the corpus
    is tokenized, and resolve its mode and memory budget into ``layout``; returns where the
    budget came from. The cost model is the one the build records for these options."""
    from slimdata.cost import resolve_cost_model
    from slimdata.cost.costmodel import Recompute
    from slimdata.planning import check_plan_layout

    budget = {name: layout.pop(name) for name in MEMORY_BUDGET_OPTIONS}
    resolve_mode(layout, budget["parallelism"])
    recompute = cast("Recompute", config.recompute)
    cost = resolve_cost_model(config.model, config.device, recompute, config.cost_profile)
    layout["memory_gib"], how = resolve_memory(
        budget["memory_gib"],
        config.device,
        cost,
        budget["parallelism"],
        budget["optimizer"],
        layout["nodes"] * layout["ranks_per_node"],
        1,
        pp_option=False,
    )
    check_plan_layout(
        plan_dir,
        nodes=layout["nodes"],
        ranks_per_node=layout["ranks_per_node"],
        memory_gib=layout["memory_gib"],
        context=layout["context"],
        mode=layout["mode"],
        cp=layout["cp"],
        overwrite=overwrite,
    )
    return how


def _config(
    ctx: click.Context,
    pipeline: str | None,
    inputs: tuple[str, ...],
    options: dict[str, Any],
    context: int,
) -> BuildConfig:
    """The ``--pipeline`` recipe (or the defaults) with the options given on the command line."""
    base = _pipeline(pipeline)
    options["hashes"] = tuple(h.strip() for h in options["hashes"].split(",") if h.strip())
    changes = {
        _FIELDS[name]: value
        for name, value in options.items()
        if name in _FIELDS
        and ctx.get_parameter_source(name) != ParameterSource.DEFAULT
        and value is not None
    }
    # the policy `plan` and `simulate` assume by default: full from a 32K context on
    changes["recompute"] = auto_recompute(options["recompute"], context)
    if inputs:
        changes["inputs"] = inputs
    return base.replace(**changes)


def _echo_summary(summary: BuildSummary, output: str) -> None:
    """What was written, and on standard error what was quarantined or truncated."""
    c = summary.counts
    counts = ", ".join(plural(c[key], key[:-1]) for key in ("documents", "tokens", "slices"))
    # the throughput of a whole build only: a resumed one counts tokens it did not tokenize
    rate = (
        f", {c['tokens'] / max(summary.seconds, 1e-9):,.0f} tokens/s"
        if not summary.tasks_resumed
        else ""
    )
    click.echo(
        f"wrote {counts} to {output} ({plural(summary.tasks_run, 'task')} run, "
        f"{summary.tasks_resumed:,} resumed, {summary.seconds:.1f}s{rate})"
    )
    if c["quarantined"]:
        click.echo(
            f"quarantined {plural(c['quarantined'], 'record')}: see {posixpath.join(output, QUARANTINE_NAME)}",
            err=True,
        )
    if c["dropped_tokens"]:
        click.echo(
            f"--truncate dropped {plural(c['dropped_tokens'], 'token')} from "
            f"{plural(c['truncated_documents'], 'document')}",
            err=True,
        )


def _write_plan(
    plan_dir: str,
    output: str,
    layout: dict[str, Any],
    how: str,
    *,
    overwrite: bool,
    echo: bool,
) -> None:
    """Solve the epoch's plan over the new shards for ``layout`` (checked and completed by
    :func:`_plan_budget`, its memory budget from ``how``) and write its plan shards."""
    from slimdata.cli.plan import echo_cp_choice, echo_warnings
    from slimdata.planning import plan_to_shards

    plan = plan_to_shards(plan_dir, shards=output, overwrite=overwrite, progress=echo, **layout)
    echo_warnings(plan)
    if echo:
        click.echo(f"memory budget {gib(layout['memory_gib'])} per device: {how}")
        click.echo(
            f"wrote plan shards for {plural(plan['steps'], 'step')} to {plan_dir} "
            f"(strategy {layout['strategy']}, mean imbalance {plan['mean_imbalance']:.4f})"
        )
        echo_cp_choice(plan)
