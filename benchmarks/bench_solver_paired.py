"""Lockstep slimpack solve time of this checkout against another one, in one process.

On a shared machine the load moves between two runs of ``bench_solver.py`` by more than a
change's effect. This loads a second copy of the package (``--base``: the root of another
checkout, e.g. a ``git worktree``; renamed ``slimdata_base`` in a temporary directory) next
to this one and solves the same batches with each in turn: the 4M-token / 64-rank WLB-128K
batches of ``bench_solver.py --only lockstep-latency``, CPU time per solve, and the ratio of
each pair (this checkout / base).

    git worktree add /tmp/base <rev>
    taskset -c 1 .venv/bin/python benchmarks/bench_solver_paired.py --base /tmp/base --pp 4
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_solver import batches

import slimdata.cost
import slimdata.plan.types
import slimdata.solver

RENAME = re.compile(r"\bslimdata(?=[.\s]|$)", re.MULTILINE)


def base_package(root: Path, into: Path):
    """``root``'s ``slimdata`` package copied into ``into`` as ``slimdata_base``, imported."""
    shutil.copytree(root / "slimdata", into / "slimdata_base")
    for f in (into / "slimdata_base").rglob("*.py"):
        f.write_text(RENAME.sub("slimdata_base", f.read_text()))
    sys.path.insert(0, str(into))
    import slimdata_base.cost
    import slimdata_base.plan.types
    import slimdata_base.solver

    return slimdata_base


def per_solve_ms(pkg, pp: int, batch_list) -> float:
    """CPU milliseconds per lockstep solve of ``batch_list`` with package ``pkg``."""
    cost = pkg.cost.CostModel.analytic("llama-8b", "h100", "full")
    layout = pkg.solver.Layout(dp=64, pp=pp, memory_gib=60, context=131072, mode="lockstep")
    t = time.process_time()
    for b in batch_list:
        pkg.solver.solve(b, layout, "slimpack", 0, cost, validate=False)
    return (time.process_time() - t) / len(batch_list) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="root of the other checkout")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = base_package(args.base, Path(tmp))
        ours = batches("wlb128k", 4194304, 8, 131072)
        # the same documents, as the base package's type
        theirs = [[base.plan.types.Document.from_dict(d.to_dict()) for d in b] for b in ours]
        per_solve_ms(slimdata, args.pp, ours[:1])  # warm both
        per_solve_ms(base, args.pp, theirs[:1])
        ratios = []
        for rep in range(args.repeats):
            b = per_solve_ms(base, args.pp, theirs)
            n = per_solve_ms(slimdata, args.pp, ours)
            ratios.append(n / b)
            print(f"repeat {rep}: base {b:.1f} ms, this {n:.1f} ms, ratio {n / b:.3f}")
    print(f"pp {args.pp}: median ratio {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
