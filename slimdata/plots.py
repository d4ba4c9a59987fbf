"""PNG plots of a build's length distribution (matplotlib, Agg backend, no display needed).

- ``lengths.png``: histogram of document lengths on log-spaced bins, log x axis;
- ``shares.png``: cumulative share of documents, tokens and attention work (causal pairs) in
  documents up to a given length: the gap between the token and attention curves is the
  long tail's outsized compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import numpy as np

from slimdata.errors import InputError
from slimdata.stats import load_lengths_frame

__all__ = ["write_plots", "write_training_plots"]


def write_plots(directory: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the plots of the build at ``directory`` into ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = load_lengths_frame(directory)
    lengths = np.sort(df["length"].to_numpy().astype(np.float64))
    attention = lengths * (lengths + 1) / 2
    out_dir = _plots_folder(out_dir)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.logspace(0, np.log10(max(lengths.max(), 2)) + 0.01, 60)
    # cast: matplotlib's stub types ``bins`` as a Sequence; hist accepts any array-like
    ax.hist(lengths, bins=cast("Sequence[float]", bins), color="#3a6ea5")
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens, log scale)")
    ax.set_ylabel("documents")
    ax.set_title(f"Length distribution ({len(lengths):,} documents)")
    fig.tight_layout()
    paths.append(out_dir / "lengths.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for values, label in (
        (np.ones_like(lengths), "documents"),
        (lengths, "tokens"),
        (attention, "attention work"),
    ):
        ax.plot(lengths, np.cumsum(values) / values.sum(), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("document length (tokens, log scale)")
    ax.set_ylabel("cumulative share in documents <= length")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Token and compute share by length")
    fig.tight_layout()
    paths.append(out_dir / "shares.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _read_log(path: Path) -> list[dict]:
    """The step records of a ``StepTelemetry`` log (see :func:`write_training_plots`)."""
    import json

    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise InputError(f"{path}: cannot read the log ({exc.strerror})") from None
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # the record a killed run was writing
            raise InputError(f"{path}:{i + 1}: not a JSON record") from None
        if not isinstance(row, dict) or not {"step", "loss", "predicted", "measured"} <= set(row):
            raise InputError(
                f"{path}:{i + 1}: not a step record of StepTelemetry (needs step, loss, "
                "predicted, measured)"
            )
        rows.append(row)
    return rows


def write_training_plots(
    logs: dict[str, str | Path] | str | Path, out_dir: str | Path
) -> list[Path]:
    """PNGs of training logs written by ``slimdata.hooks.StepTelemetry(log=...)``:

    - ``loss.png``: loss by step, one curve per log (``logs``: one path, or label -> path);
    - ``step_time.png``: per rank and step, measured busy seconds against the plan's
      predicted seconds (the cost model's units: device seconds of its profile).

    A log's last line cut short (a run killed while writing it) is left out; a missing log
    or any other line that is not a step's record is an :class:`~slimdata.errors.InputError`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not isinstance(logs, dict):
        logs = {Path(logs).stem: logs}
    runs = {label: _read_log(Path(p)) for label, p in logs.items()}
    out_dir = _plots_folder(out_dir)
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in runs.items():
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean token cross-entropy)")
    ax.legend()
    fig.tight_layout()
    paths = [out_dir / "loss.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 5))
    for label, rows in runs.items():
        pred = [p for r in rows for p in r["predicted"]]
        meas = [m for r in rows for m in r["measured"]]
        ax.scatter(pred, meas, s=8, label=label)
    ax.set_xlabel("predicted seconds per rank (cost model)")
    ax.set_ylabel("measured busy seconds per rank")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "step_time.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return paths


def _plots_folder(out_dir: str | Path) -> Path:
    """``out_dir``, made if missing; a folder that cannot be made is a clear error."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out_dir}: cannot make the plots folder ({exc.strerror})") from None
    return out_dir
