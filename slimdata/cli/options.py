"""Options shared by several commands (cost model selection, document input)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from slimdata.cost import DEVICE_PRESETS, MODEL_PRESETS, RECOMPUTE_POLICIES, CostModel, resolve_cost_model

__all__ = ["DEFAULT_MODEL", "cost_model_from_options", "cost_model_options"]

DEFAULT_MODEL = "llama-8b"


def cost_model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--model``, ``--device``, ``--recompute`` and ``--cost-profile``."""
    fn = click.option(
        "--cost-profile",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="Measured coefficient file from `slimdata profile` (overrides the analytic model).",
    )(fn)
    fn = click.option(
        "--recompute",
        type=click.Choice(RECOMPUTE_POLICIES),
        default="selective",
        show_default=True,
        help="Activation recompute policy assumed by the memory and backward-time model.",
    )(fn)
    fn = click.option(
        "--device",
        default="h100",
        show_default=True,
        help=f"Device preset for the analytic model: {', '.join(sorted(DEVICE_PRESETS))}.",
    )(fn)
    fn = click.option(
        "--model",
        default=DEFAULT_MODEL,
        show_default=True,
        help=f"Model preset ({', '.join(MODEL_PRESETS)}) or a JSON config path.",
    )(fn)
    return fn


def cost_model_from_options(model: str, device: str, recompute: str, cost_profile: str | None) -> CostModel:
    return resolve_cost_model(model, device, recompute, cost_profile)  # type: ignore[arg-type]
