"""Simulator speed: one step of a 64-rank, 1M-token batch (target <= 1 s on one core).

    .venv/bin/python benchmarks/bench_sim.py [--lengths FILE] [--repeat 5]

Prints, per strategy and layout, the median wall time of ``simulate_step`` (plan solved once,
outside the timing) and the number of tasks; the last line is ``concat`` with static CP 4
(plan for 16 DP groups simulated on 64 devices).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths, load_lengths
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver import Layout, apply_oversize, make_batches, solve

DEFAULT = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "lengths" / "wlb128k.json.gz"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cost = CostModel.analytic("llama-8b", "h100", "full")
    lens = load_lengths(args.lengths)[:20000]
    for pp, par in ((1, "ddp"), (1, "fsdp"), (4, "ddp")):
        layout = Layout(
            dp=64,
            pp=pp,
            context=131072,
            memory_gib=400,
            mode="lockstep" if pp > 1 or par == "fsdp" else "free",
        )
        batch = make_batches(
            apply_oversize(documents_from_lengths(lens), layout.context, "split"), 1 << 20, 0
        )[0]
        for strategy in ("concat", "wlb-ideal", "slimpack"):
            plan = solve(batch, layout, strategy, 0, cost)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                r = simulate_step(plan, cost, layout, SimConfig(parallelism=par))
                times.append(time.perf_counter() - t0)
            n_slices = sum(len(p.slices) for rs in plan.ranks for p in rs.forward)
            print(
                f"dp=64 pp={pp} {par:<4} {strategy:<9} tokens={plan.tokens:>8} slices={n_slices:>5} median {statistics.median(times) * 1e3:7.1f} ms  max {max(times) * 1e3:7.1f} ms  step {r.step_time:.3f} s"
            )
    layout = Layout(dp=64, context=131072, memory_gib=400)
    plan = solve(batch, Layout(dp=16, context=131072, memory_gib=400), "concat", 0, cost)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        r = simulate_step(plan, cost, layout, SimConfig(cp=4))
        times.append(time.perf_counter() - t0)
    print(
        f"dp=64 pp=1 ddp  concat cp=4 median {statistics.median(times) * 1e3:7.1f} ms  "
        f"step {r.step_time:.3f} s"
    )


if __name__ == "__main__":
    main()
