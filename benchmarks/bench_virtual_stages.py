"""Interleaved virtual stages: what a baseline and slimpack gain from more model chunks per
device than the search's fixed 2 (``SimConfig.virtual_stages``; the configuration search does
not search it). One cell of the fair study (``benchmarks/study_fair.py``'s ``setting``),
every strategy at its best configuration for each ``v``:

    .venv/bin/python benchmarks/bench_virtual_stages.py --data ../shared/data/lengths \\
        [--dataset lognormal] [--context 128K] [--layout 16x4] [--stages 2,4,8] \\
        [--strategies wlb-ideal,bfd,slimpack]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from study_fair import CONTEXTS, distributions, setting

from slimdata.sim import SimConfig, compare_strategies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data/lengths"))
    ap.add_argument("--dataset", default="lognormal")
    ap.add_argument("--context", default="128K", choices=list(CONTEXTS))
    ap.add_argument("--layout", default="16x4", help="DPxPP")
    ap.add_argument("--stages", default="2,4,8", help="virtual stages (model chunks per device)")
    ap.add_argument("--strategies", default="wlb-ideal,bfd,slimpack")
    args = ap.parse_args()
    dp, pp = map(int, args.layout.split("x"))
    docs, layout, cost, gbt, how = setting(
        distributions(args.data)[args.dataset], CONTEXTS[args.context], dp, pp, 1
    )
    names = args.strategies.split(",")
    print(f"{args.dataset} {args.context} DP {dp} PP {pp}: seconds per step (configuration)")
    print(f"{'v':>3} " + " ".join(f"{n:>36}" for n in names))
    for v in map(int, args.stages.split(",")):
        t0 = time.perf_counter()
        res = compare_strategies(
            docs,
            layout,
            cost,
            strategies=names,
            global_batch_tokens=gbt,
            config=SimConfig(parallelism="zero1", virtual_stages=v),
            memory_budget=how,
        ).results
        cells = []
        for n in names:
            r = res[n]
            if r.error:
                cells.append(f"{'failed':>36}")
                continue
            how_run = f"cp{r.cp} {r.schedule} {r.micro_batches} row {r.row_tokens // 1024}K"
            cells.append(f"{r.step_time:>9.3f} ({how_run:>24})")
        print(f"{v:>3} " + " ".join(cells) + f"  [{time.perf_counter() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
