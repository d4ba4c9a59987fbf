"""The planner's step-time estimate against the simulator, and slimpack's solve time, on the
pipeline cells of the fair study (``study_fair.py``'s grid and defaults, ``pp > 1``).

For every cell: the first step's batch (``PlanConfig.batches``, as ``simulate``), solved by
slimpack in lockstep mode at each static CP size of ``--cp`` (``dp / cp`` DP groups of ``cp``
devices, as ``simulate`` runs it) and the pipeline schedule of ``--schedule``;
``StepPlan.meta["pipeline_estimate"]`` (the slowest rank's compute-only critical path,
:func:`slimdata.execution.critical.plan_critical_path`) against ``simulate_step`` (ZeRO-1),
and the solve's wall time.

    .venv/bin/python benchmarks/bench_estimate.py --data ../shared/data/lengths [--cp 1,2]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

import numpy as np
from study_fair import CONTEXTS, LAYOUTS, distributions, setting

from slimdata.errors import PlanError
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver import PlanConfig, solve


def measure(
    lens: np.ndarray, context: int, dp: int, pp: int, cp: int, schedule: str
) -> tuple[float, float, float, int]:
    """``(estimate s, simulated s, solve s, micro-batches)`` of the cell's first step."""
    docs, layout, cost, gbt, _how = setting(lens, context, dp, pp, 1)
    config = SimConfig(parallelism="zero1", schedule=schedule, cp=cp)
    plan_layout = dataclasses.replace(
        layout,
        dp=dp // cp,
        ranks_per_node=max(1, layout.ranks_per_node // cp),
        cp=cp,
        schedule=schedule,
        virtual_stages=config.pipeline.virtual_stages,
    )
    batch = PlanConfig(layout=plan_layout, global_batch_tokens=gbt).batches(docs)[0]
    t0 = time.perf_counter()
    plan = solve(batch, plan_layout, "slimpack", 0, cost)
    solve_s = time.perf_counter() - t0
    sim = simulate_step(plan, cost, layout, config)
    return plan.meta["pipeline_estimate"], sim.step_time, solve_s, plan.meta["microbatches"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data/lengths"))
    ap.add_argument("--contexts", default=",".join(CONTEXTS))
    ap.add_argument("--datasets", default="wikipedia,wlb128k,lognormal")
    ap.add_argument("--cp", default="1", help="static CP sizes, comma-separated")
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "interleaved"])
    args = ap.parse_args(argv)
    dists = distributions(args.data)
    print("| dataset | context | DP x PP | cp | estimate s | simulated s | error | solve s | mb |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for ds in args.datasets.split(","):
        for ctx in args.contexts.split(","):
            for (dp, pp), cp in itertools.product(
                (x for x in LAYOUTS if x[1] > 1), map(int, args.cp.split(","))
            ):
                where = f"| {ds} | {ctx} | {dp}x{pp} | {cp} |"
                try:
                    est, sim, solve_s, mb = measure(
                        dists[ds], CONTEXTS[ctx], dp, pp, cp, args.schedule
                    )
                except PlanError as exc:  # slimpack at this CP size does not fit the cell
                    print(f"{where} failed: {exc} | | | | |", flush=True)
                    continue
                errors.append(abs(est - sim) / sim)
                print(
                    f"{where} {est:.2f} | {sim:.2f} | "
                    f"{100 * (est - sim) / sim:+.1f}% | {solve_s:.1f} | {mb} |",
                    flush=True,
                )
    print(
        f"\nmean |error| {100 * np.mean(errors):.2f}%, max {100 * np.max(errors):.2f}% "
        f"over {len(errors)} cells"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
