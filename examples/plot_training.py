"""Plot training logs written by ``StepTelemetry(log=...)`` (``--telemetry`` of ``train_tiny_llama.py``).

    python examples/plot_training.py slimpack=slimpack.jsonl bfd=bfd.jsonl --out plots

writes ``plots/loss.png`` (loss by step, one curve per log) and ``plots/step_time.png``
(measured against predicted seconds per rank and step).
"""

from __future__ import annotations

import argparse
import sys

from slimdata.errors import SlimdataError
from slimdata.plots import write_training_plots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="LABEL=FILE.jsonl (or FILE.jsonl)")
    ap.add_argument("--out", default="plots")
    args = ap.parse_args(argv)
    logs = dict(a.split("=", 1) if "=" in a else (a, a) for a in args.logs)
    try:
        paths = write_training_plots(logs, args.out)
    except SlimdataError as exc:  # a missing or damaged log: one line, no traceback
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
