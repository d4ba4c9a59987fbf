"""What ``slimdata profile`` measures: the grid of slice lengths, prefixes and pack sizes,
repeats, lead packs and calibration plans (:class:`ProfileConfig`). Pure Python, so the CLI can
read the defaults without importing the runtime; the measurement itself is
:mod:`slimdata.hooks.profile`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from slimdata.errors import ConfigError

__all__ = ["ProfileConfig", "profile_points"]


@dataclass(frozen=True, kw_only=True)
class ProfileConfig:
    """What to measure."""

    slice_tokens: tuple[int, ...] = (32, 64, 128, 256, 512)
    """Slice lengths ``s`` of the grid."""
    prefixes: tuple[int, ...] = (0, 256, 1024)
    """Prefix lengths ``start`` of the grid."""
    pack_sizes: tuple[int, ...] = (1, 4)
    """Slices per pack ``k`` of the grid (separates per-slice from per-pack constants)."""
    repeats: int = 3
    """Timed runs per point (median); one extra warm-up run precedes them."""
    device: str = "cpu"
    """torch device to profile (``cuda`` on a GPU)."""
    dtype: str = "float32"
    """Parameter/activation dtype: float32, bfloat16 or float16."""
    backend: str = "auto"
    """Attention backend (:func:`slimdata.hooks.attention.resolve_backend`; ``auto`` picks the
    fastest kernel for the device and dtype)."""
    stat: str = "median"
    """Statistic over repeats: ``median``, or ``min`` (robust on a shared, noisy machine)."""
    lead_packs: int = 2
    """Identical packs of the same step run before the measured one (:func:`profile_plan`):
    the first pack of a step runs in another state than the packs of a plan (its backward
    allocates the gradients, for one)."""
    calibration_plans: int = 3
    """slimpack plans of random documents run in the same rounds as the grid
    (:func:`calibration_payloads`); the median ratio of their measured to predicted pack
    times scales the fitted forward and backward coefficients (:func:`calibrate`), because a
    pack inside a plan can run slower than the same pack timed on its own. 0: no calibration."""
    calibration_memory_gib: float = 16.0
    """Activation budget (GiB, the analytic model's bytes) the calibration plans are solved
    for, so that they fit the device being profiled."""
    measure_memory: bool = True
    """Measure the activation bytes per token (:func:`measure_activation_bytes`) instead of
    taking the analytic model's; the K/V bytes stay analytic."""
    max_point_tokens: int | None = None
    """Skip grid points whose step holds more than this many tokens, ``k * (start + s)``
    (the prefix packs and the measured pack are all held until their backward), so a grid
    can reach the plans' largest packs without running out of device memory. None: all."""

    def __post_init__(self) -> None:
        if (
            self.repeats < 1
            or not self.slice_tokens
            or min(self.slice_tokens) < 1
            or min(self.prefixes, default=0) < 0
            or not self.pack_sizes
            or min(self.pack_sizes) < 1
            or self.lead_packs < 0
            or self.calibration_plans < 0
            or self.calibration_memory_gib <= 0
            or (self.max_point_tokens is not None and not profile_points(self))
        ):
            raise ConfigError(
                f"bad profile grid: slice_tokens={self.slice_tokens}, prefixes={self.prefixes}, max_point_tokens={self.max_point_tokens}, repeats={self.repeats}, lead_packs={self.lead_packs}, calibration_plans={self.calibration_plans}: use positive sizes, at least one point within max_point_tokens, repeats >= 1, lead_packs >= 0 and calibration_plans >= 0"
            )
        if self.stat not in ("median", "min"):
            raise ConfigError(f"stat={self.stat!r}: use 'median' or 'min'")
        _check_separable(self)


def _check_separable(config: ProfileConfig) -> None:
    """The grid's points can tell the fitted terms apart: the per-token, per-causal-pair and
    per-slice seconds (and per-pack, with several pack sizes), the columns of
    ``slimdata.hooks.profile.fit_terms``, are linearly independent over the points; else the
    fit would return one of many equally good answers, checked before anything is timed."""
    from slimdata.cost import causal_pairs

    def separable(points: list[tuple[int, int, int]]) -> bool:
        pts = np.array(points, dtype=float).reshape(-1, 3)
        s, start, k = pts[:, 0], pts[:, 1], pts[:, 2]
        columns = [k * s, k * causal_pairs(start, start + s), k]
        if len(set(k.tolist())) > 1:
            columns.append(np.ones(len(k)))
        return bool(np.linalg.matrix_rank(np.stack(columns, axis=1)) == len(columns))

    points = profile_points(config)
    if separable(points):
        return
    grid = (
        f"the profile grid (slice_tokens={config.slice_tokens}, prefixes={config.prefixes}, "
        f"pack_sizes={config.pack_sizes}, {len(points)} point(s)"
    )
    whole = profile_points(config, cap=None)
    if len(whole) > len(points) and separable(whole):
        raise ConfigError(
            f"{grid} of {len(whole)} within max_point_tokens={config.max_point_tokens}) cannot "
            "tell the cost per token, per causal pair and per slice apart: the points above "
            "max_point_tokens are left out; raise it, or give smaller slice lengths or prefixes"
        )
    raise ConfigError(
        f"{grid}) cannot tell the cost per token, per causal pair and per slice apart: give "
        "at least 3 slice lengths, or 2 slice lengths and 2 prefixes"
    )


def profile_points(
    config: ProfileConfig, cap: int | Literal["config"] | None = "config"
) -> list[tuple[int, int, int]]:
    """The ``(s, start, k)`` grid of ``config``, without the points that hold more than
    ``cap`` tokens (``k * (start + s)``; by default ``config.max_point_tokens``)."""
    if cap == "config":
        cap = config.max_point_tokens
    return [
        (s, p, k)
        for k in config.pack_sizes
        for s in config.slice_tokens
        for p in config.prefixes
        if cap is None or k * (p + s) <= cap
    ]
