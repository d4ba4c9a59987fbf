"""Gantt chart of simulated steps (matplotlib, Agg backend; not imported by the core).

One panel per strategy, one row per device (``stage/rank``): forward compute in blue,
backward in orange, collectives and waiting inside a synchronized task in grey.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.sim.results import SimResult

__all__ = ["draw_gantt"]

COLORS = {0: "#4C72B0", 1: "#DD8452", 2: "#B0B0B0"}
MAX_ROWS = 64


def draw_gantt(results: Mapping[str, SimResult], path: str | Path, *, title: str = "") -> Path:
    """Write a PNG with one panel per entry of ``results`` (name -> one simulated step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    n_dev = max((r.busy.size for r in results.values()), default=1)
    rows = min(n_dev, MAX_ROWS)
    height = max(2.0, 0.12 * rows + 1.0)
    fig, axes = plt.subplots(
        len(names),
        1,
        figsize=(12, height * max(len(names), 1)),
        squeeze=False,
        sharex=True,
        layout="constrained",  # leaves room for the title, the legend and every panel's title
    )
    for ax, name in zip(axes[:, 0], names, strict=True):
        _draw_panel(ax, name, results[name])
    axes[-1, 0].set_xlabel("seconds")
    _draw_legend(fig)
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _draw_panel(ax: Any, name: str, r: SimResult) -> None:
    """One strategy's step: a row per device (the first :data:`MAX_ROWS`), its figures on top."""
    pp, _dp = r.busy.shape
    for d in range(min(r.busy.size, MAX_ROWS)):
        _draw_device(ax, r.timeline, d)
    ax.set_ylim(min(r.busy.size, MAX_ROWS) - 0.5, -0.5)
    ax.set_ylabel("device" if pp == 1 else "stage*dp+rank")
    ax.set_title(
        f"{name}{f' (cp={r.cp})' if r.cp > 1 else ''}: step {r.step_time:.3f} s, this plan's own bound {r.lower_bound:.3f} s, imbalance {r.imbalance:.2f}, bubble {r.bubble:.0%}",
        fontsize=9,
    )


def _draw_device(ax: Any, tl: Mapping[str, np.ndarray], d: int) -> None:
    """Device ``d``'s tasks of the timeline ``tl``: each forward or backward compute, then its
    wait for the other members of a synchronized task; collectives."""
    m = tl["device"] == d
    for kind in (0, 1, 2):
        k = m & (tl["kind"] == kind)
        if not k.any():
            continue
        comp_end = tl["compute_end"][k] if kind < 2 else tl["end"][k]
        ax.broken_barh(
            list(zip(tl["start"][k], comp_end - tl["start"][k], strict=True)),
            (d - 0.4, 0.8),
            facecolors=COLORS[kind],
            linewidth=0,
        )
        if kind < 2:  # waiting for the other members of a synchronized task
            ax.broken_barh(
                list(zip(comp_end, tl["end"][k] - comp_end, strict=True)),
                (d - 0.4, 0.8),
                facecolors=COLORS[2],
                linewidth=0,
            )


def _draw_legend(fig: Any) -> None:
    """What the colours mean, in one row above the panels (never over a bar)."""
    from matplotlib.patches import Patch

    fig.legend(
        handles=[
            Patch(color=COLORS[0], label="forward"),
            Patch(color=COLORS[1], label="backward"),
            Patch(color=COLORS[2], label="comm / wait"),
        ],
        loc="outside upper right",
        ncols=3,
        fontsize=8,
    )
