"""Options shared by several commands (cost model selection, document input), and the one
validation layer of numeric option values.

Every numeric option of every command takes one of the types below, so a bad value is
refused by click, before any work, with ``Error: Invalid value for '--x': ...`` (exit 2):
``POSITIVE_INT`` (counts, sizes, token budgets), ``SEED`` (``>= 0``), ``POSITIVE_FLOAT``
(finite and ``> 0``: ``nan``, ``inf``, ``0`` and negatives are refused) and
:class:`FiniteFloatRange` (finite, within bounds).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slimdata.cost import (
    DEVICE_PRESETS,
    MODEL_PRESETS,
    RECOMPUTE_POLICIES,
    CostModel,
    resolve_cost_model,
)
from slimdata.errors import ConfigError, InputError
from slimdata.units import MAX_RANKS

__all__ = [
    "DEFAULT_MODEL",
    "MEMORY_BUDGET_OPTIONS",
    "PLAN_LAYOUT_OPTIONS",
    "POSITIVE_FLOAT",
    "POSITIVE_INT",
    "RANKS",
    "SEED",
    "FiniteFloatRange",
    "cost_model_from_options",
    "cost_model_options",
    "cost_model_options_auto",
    "creatable_folder",
    "json_option",
    "memory_budget_options",
    "plan_layout_options",
    "renamed_option",
    "resolve_memory",
    "resolve_mode",
    "writable_file",
    "writable_folder",
    "writable_image",
    "write_json",
]

DEFAULT_MODEL = "llama-8b"


class FiniteFloatRange(click.FloatRange):
    """A float range that also refuses ``nan`` and ``inf`` (click's own accepts ``nan``:
    every comparison with it is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


POSITIVE_INT = click.IntRange(min=1)
RANKS = click.IntRange(min=1, max=MAX_RANKS)
"""A count of ranks, nodes or ranks per node (:data:`~slimdata.units.MAX_RANKS` at most)."""
SEED = click.IntRange(min=0)
POSITIVE_FLOAT = FiniteFloatRange(min=0.0, min_open=True)


def cost_model_options(fn: Callable[..., Any], recompute: str = "selective") -> Callable[..., Any]:
    """Add ``--model``, ``--cost-device``, ``--recompute`` and ``--cost-profile`` (parameters
    ``model``, ``device``, ``recompute``, ``cost_profile``)."""
    fn = click.option(
        "--cost-profile",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="Measured coefficient file from `slimdata profile` (overrides the analytic model).",
    )(fn)
    fn = click.option(
        "--recompute",
        type=click.Choice(RECOMPUTE_POLICIES + (("auto",) if recompute == "auto" else ())),
        default=recompute,
        show_default=True,
        help="Activation recompute policy assumed by the memory and backward-time model"
        + (" (auto: full from a 32K context on, else selective)." if recompute == "auto" else "."),
    )(fn)
    fn = renamed_option("--device", "device", "--cost-device")(fn)
    fn = click.option(
        "--cost-device",
        "device",
        default="h100",
        show_default=True,
        help=f"Device preset of the cost model: {', '.join(sorted(DEVICE_PRESETS))}.",
    )(fn)
    fn = click.option(
        "--model",
        default=DEFAULT_MODEL,
        show_default=True,
        help=f"Model preset ({', '.join(MODEL_PRESETS)}) or a JSON config path.",
    )(fn)
    return fn


def cost_model_from_options(
    model: str, device: str, recompute: str, cost_profile: str | None, context: int = 0
) -> CostModel:
    """The cost model of the options; ``recompute="auto"`` resolved with ``context``."""
    from slimdata.cost.states import auto_recompute

    rc = auto_recompute(recompute, context)
    return resolve_cost_model(model, device, rc, cost_profile)  # type: ignore[arg-type]


COST_OPTIONS = ("model", "device", "recompute", "cost_profile")
"""The options that choose a cost model (:func:`cost_model_options`)."""


def cost_options_given(ctx: click.Context) -> bool:
    """Whether the user gave any cost-model option; without one, a command reading
    ``slimdata build`` shards uses the cost model the build recorded in its sidecar."""
    return any(
        ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT
        for name in COST_OPTIONS
    )


def cost_model_options_auto(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`cost_model_options` with ``--recompute auto`` (``plan`` and ``simulate``)."""
    return cost_model_options(fn, recompute="auto")


PLAN_LAYOUT_OPTIONS = ("nodes", "ranks_per_node", "global_batch_tokens")
"""Layout options that planning needs (required by ``plan``; by ``build`` only with --plan)."""

MEMORY_BUDGET_OPTIONS = ("memory_gib", "parallelism", "optimizer")
"""What sets the per-device activation budget (:func:`memory_budget_options`)."""


def memory_budget_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--memory-gib`` (default: derived, :func:`resolve_memory`), ``--parallelism`` and
    ``--optimizer``: one definition for ``plan``, ``build --plan`` and ``simulate``."""
    opts = [
        click.option(
            "--memory-gib",
            type=POSITIVE_FLOAT,
            default=None,
            help="Per-device budget for activations and K/V, GiB [default: 90% of the --cost-device "
            "memory minus the model states of --model under --parallelism and --optimizer]. "
            "Every strategy must fit it.",
        ),
        click.option(
            "--parallelism",
            type=click.Choice(["ddp", "zero1", "fsdp"]),
            default="zero1",
            show_default=True,
            help="ddp (replicated states), zero1 (distributed optimizer; timed as ddp), or fsdp "
            "(ZeRO-3, lockstep packs). Sets the model-state memory of the default --memory-gib.",
        ),
        click.option(
            "--optimizer",
            type=click.Choice(["adam", "sgd"]),
            default="adam",
            show_default=True,
            help="Optimizer whose fp32 states the default --memory-gib leaves room for.",
        ),
    ]
    return _with_options(fn, opts)


def _with_options(fn: Callable[..., Any], opts: list[Callable[..., Any]]) -> Callable[..., Any]:
    """``fn`` with the click options ``opts``, shown in ``--help`` in the order listed."""
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def resolve_memory(
    memory_gib: float | None,
    device: str,
    cost,
    parallelism: str,
    optimizer: str,
    dp: int,
    pp: int,
    *,
    pp_option: bool = True,
) -> tuple[float, str]:
    """``--memory-gib`` if given, else the device memory left after model states, and a
    one-line account of where the number came from (``pp_option``: the command has
    ``--pp``, which an error may then suggest)."""
    from slimdata.cost import load_device
    from slimdata.cost.states import GIVEN, activation_budget_gib

    if memory_gib is not None:
        return memory_gib, GIVEN
    if cost.param_count <= 0:
        raise ConfigError("the cost model has no parameter count: give --memory-gib")
    return activation_budget_gib(
        load_device(device).memory_gib,
        cost.param_count,
        parallelism,
        optimizer,
        dp,
        pp,
        layers=cost.layers,
        pp_option=pp_option,
        device=f"--cost-device {device}",
    )


def resolve_mode(layout: dict[str, Any], parallelism: str) -> None:
    """``layout["mode"]`` from --mode: by default lockstep under --parallelism fsdp (FSDP runs
    only lockstep plans), else free; --mode free with --parallelism fsdp is refused."""
    if layout["mode"] is None:
        layout["mode"] = "lockstep" if parallelism == "fsdp" else "free"
    elif layout["mode"] == "free" and parallelism == "fsdp":
        raise ConfigError(
            "--mode free with --parallelism fsdp: FSDP runs only lockstep plans (every rank "
            "makes the same calls); use --mode lockstep or leave --mode out"
        )


def plan_layout_options(required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the training-layout options of ``slimdata plan`` (shared with ``build --plan``): the
    layout itself (:data:`PLAN_LAYOUT_OPTIONS`, ``required`` or not), how to plan it, and the
    memory budget (:func:`memory_budget_options`)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = _with_options(fn, [*_layout_options(required), *_planning_options()])
        return memory_budget_options(fn)

    return decorate


def _layout_options(required: bool) -> list[Callable[..., Any]]:
    """``--nodes``, ``--ranks-per-node``, ``--global-batch-tokens`` (:data:`PLAN_LAYOUT_OPTIONS`)."""
    return [
        click.option(
            "--nodes",
            type=RANKS,
            required=required,
            help="Nodes (num_canonical_nodes of the reader).",
        ),
        click.option(
            "--ranks-per-node",
            type=RANKS,
            required=required,
            help="Data-parallel ranks per node.",
        ),
        click.option(
            "--global-batch-tokens",
            type=POSITIVE_INT,
            required=required,
            help="Tokens per optimizer step.",
        ),
    ]


def _planning_options() -> list[Callable[..., Any]]:
    """``--strategy``, ``--context``, ``--seed``, ``--mode``, ``--oversize``,
    ``--workers-per-rank`` and ``--cp``: how the plan is solved and read."""
    from slimdata.solver.batches import OVERSIZE_POLICIES
    from slimdata.solver.registry import STRATEGIES

    return [
        click.option(
            "--strategy",
            type=click.Choice(list(STRATEGIES)),
            default="slimpack",
            show_default=True,
            help="Packing strategy.",
        ),
        click.option(
            "--context",
            type=POSITIVE_INT,
            default=131072,
            show_default=True,
            help="Context length (row length of concat; default pack token cap).",
        ),
        click.option(
            "--seed",
            type=SEED,
            default=0,
            show_default=True,
            help="Seed of the plan-time document shuffle.",
        ),
        click.option(
            "--mode",
            type=click.Choice(["free", "lockstep"]),
            default=None,
            help="free (DDP) or lockstep (FSDP/pipeline).  [default: lockstep under "
            "--parallelism fsdp, else free]",
        ),
        click.option(
            "--oversize",
            type=click.Choice(OVERSIZE_POLICIES),
            default="split",
            show_default=True,
            help="Documents longer than --context: split into independent pieces, truncate, or fail.",
        ),
        click.option(
            "--workers-per-rank",
            type=POSITIVE_INT,
            default=1,
            show_default=True,
            help="DataLoader workers per rank that will read the plan shards.",
        ),
        click.option(
            "--cp",
            default="auto",
            metavar="auto|N",
            show_default=True,
            callback=lambda _ctx, _param, value: _cp_size(value),
            help="Static context parallelism: ranks per DP rank (Megatron's "
            "--context-parallel-size), dividing --nodes x --ranks-per-node; 'auto': 1 unless a "
            "document outweighs a device, else the size the simulator finds fastest that plans "
            "every step.",
        ),
    ]


def _cp_size(value: str | int) -> str | int:
    """``--cp``: ``auto`` or a positive integer."""
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise click.BadParameter(f"{value!r}: use 'auto' or an integer >= 1", param_hint="'--cp'")
    return k


def json_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--json [FILE]`` (parameter ``json_path``), the same in every command: the command's
    machine-readable result written to FILE, or to standard output when FILE is left out or
    is ``-`` (instead of the text report)."""
    return click.option(
        "--json",
        "json_path",
        is_flag=False,
        flag_value="-",
        default=None,
        metavar="[FILE]",
        callback=writable_file,
        help=f"Write {what} as JSON to FILE; to standard output without FILE (or with -).",
    )


def _writable_folder(folder: Path, value: str) -> None:
    if not folder.is_dir():
        raise click.BadParameter(f"{value}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: the folder {folder} is not writable")


def writable_file(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Click callback of an output FILE option: its folder exists and is writable and it is
    not a folder, checked before the command's work (which would otherwise end in a
    traceback after it). ``-`` (standard output) passes."""
    if value is None or value == "-":
        return value
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a folder, not a file")
    _writable_folder(path.parent, value)
    return value


def writable_image(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """:func:`writable_file` for a chart, whose suffix is a format matplotlib writes."""
    if value is None or writable_file(ctx, param, value) is None:
        return value
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(value).suffix.lstrip(".").lower() not in formats:
        raise click.BadParameter(
            f"{value}: not an image file name; end it in one of {', '.join(sorted(formats))}"
        )
    return value


def writable_folder(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Click callback of an output FOLDER option (a ``click.Path(file_okay=False)``): a
    writable folder, or one that can be made in a writable folder."""
    if value is None:
        return value
    path = Path(value)
    _writable_folder(path if path.is_dir() else path.parent, value)
    return value


def creatable_folder(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Click callback of an output FOLDER option that the command creates with any missing
    parents: the nearest path on the way up that exists is a writable folder, so that
    ``-o README.md/x`` (a file on the way) fails here and not in a traceback later."""
    from slimdata.paths import check_creatable

    if value is None:
        return value
    try:
        check_creatable(value)
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def write_json(payload: Any, json_path: str) -> None:
    """Write ``payload`` where ``--json`` said (see :func:`json_option`)."""
    import json
    from pathlib import Path

    text = json.dumps(payload, indent=1, sort_keys=True, default=float)
    if json_path == "-":
        click.echo(text)
    else:
        try:
            Path(json_path).write_text(text + "\n")
        except OSError as exc:  # checked at parse time (writable_file); the disk may still refuse
            raise InputError(f"{json_path}: cannot write it ({exc.strerror})") from None
        click.echo(f"wrote {json_path}")


def renamed_option(
    old: str, param: str, new: str, **option: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Keep ``old``, the former name of ``new`` (parameter ``param``), working: hidden from
    ``--help``, it warns once on standard error and sets ``param``; both given with different
    values is a usage error."""
    import functools

    alias = f"_{param}_renamed"

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(alias)
            if value is not None:
                ctx = click.get_current_context()
                given = ctx.get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE
                if given and kwargs[param] != value:
                    raise click.UsageError(f"{old} and {new} both given; give {new} only")
                click.echo(f"Warning: {old} is now {new}; {old} will be removed.", err=True)
                kwargs[param] = value
                ctx.set_parameter_source(param, click.core.ParameterSource.COMMANDLINE)
            return fn(*args, **kwargs)

        return click.option(old, alias, hidden=True, default=None, **option)(wrapper)

    return decorate
