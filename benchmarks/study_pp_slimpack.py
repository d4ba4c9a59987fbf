"""slimpack's best simulated step on the fair study's pipeline cells (PP 4, PP 8), alone.

A quick before/after check of a change to slimpack or the search on the 18 pipeline cells of
``study_fair.py`` (its ``setting``; ``compare_strategies`` with ``strategies=["slimpack"]``,
``--baseline-config best``, as a cell runs it). ``<tree>``: the source tree to measure (its
``benchmarks/study_fair.py`` is used; run with ``PYTHONPATH=<tree>``); cells already in
``<out.json>`` are skipped; ``[cells...]``: only these (``"wikipedia 512K DP8xPP8"``).

    PYTHONPATH=/tmp/old .venv/bin/python benchmarks/study_pp_slimpack.py /tmp/old before.json
"""

import json
import os
import sys
import time
from pathlib import Path

tree, out = Path(sys.argv[1]), Path(sys.argv[2])
only = sys.argv[3:]
sys.path.insert(0, str(tree / "benchmarks"))
import study_fair as sf  # noqa: E402

from slimdata.sim import SimConfig, compare_strategies  # noqa: E402

DATA = Path(os.environ.get("SLIMDATA_LENGTHS", "/work/shared/data/lengths"))
dists = sf.distributions(DATA)
done = json.loads(out.read_text()) if out.exists() else {}
# context-major, so that a partial run covers every dataset
cells = [
    (ds, ctx, dp, pp)
    for ctx in ("128K", "256K", "512K")
    for ds in ("wikipedia", "wlb128k", "lognormal")
    for dp, pp in ((16, 4), (8, 8))
]
for ds, ctx, dp, pp in cells:
    key = f"{ds} {ctx} DP{dp}xPP{pp}"
    if key in done or (only and key not in only):
        continue
    t0 = time.perf_counter()
    docs, layout, cost, gbt, _how = sf.setting(dists[ds], sf.CONTEXTS[ctx], dp, pp, 1)
    res = compare_strategies(
        docs,
        layout,
        cost,
        strategies=["slimpack"],
        steps=1,
        global_batch_tokens=gbt,
        config=SimConfig(parallelism="zero1"),
        baseline_config="best",
    ).to_dict()
    r = res["results"]["slimpack"]
    c = r.get("config") or {}
    done[key] = {
        "step_time": None if r.get("failed") else r["step_time"],
        "reason": r.get("reason"),
        "cp": c.get("cp"),
        "schedule": c.get("schedule"),
        "micro_batches": c.get("micro_batches"),
        "solves": res["search"].get("solves"),
        "simulations": res["search"].get("simulations"),
        "search_s": res["search"]["seconds"],
        "wall_s": time.perf_counter() - t0,
    }
    print(key, done[key], flush=True)
    out.write_text(json.dumps(done, indent=1))
