"""Study: slimpack against every baseline at its best configuration, with `simulate`'s defaults.

Grid: context {128K, 256K, 512K} x layout {DP64 PP1, DP16 PP4, DP8 PP8} x length distribution
{wikipedia, wlb128k (the files of ``../shared/data/lengths``), lognormal (Megatron DCP's
synthetic benchmark: median 1024 tokens, sigma 1.5, clipped to [128, 8192])}. Every cell runs
``compare_strategies`` exactly as ``slimdata simulate`` does with its defaults (llama-8b on
H100, memory budget = device minus model states under zero1 + Adam, ``--recompute auto``,
global batch ``dp * context * (2 pp if pp > 1 else 1)``, ``--baseline-config best``).

Writes ``study_fair.md`` (one row per cell: the best same-work baseline with its
configuration, the Megatron default, dcp, slimpack, slimpack's speedup over the best baseline
and its step / bound) and ``study_fair.png`` (heat map of that speedup), plus the raw rows as
``study_fair.json``.

    .venv/bin/python benchmarks/study_fair.py --data ../shared/data/lengths --out study/

``--rerun NAME --merge DIR...`` runs strategy NAME again in every cell of earlier runs (the
others' results kept) and writes each run's cells, patched, to ``OUT/<its folder name>/``
before the merged table: a change to one strategy, measured without the whole grid.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

from slimdata.cost import CostModel, load_device
from slimdata.cost.states import activation_budget_gib, auto_recompute
from slimdata.docsource import documents_from_lengths
from slimdata.sim import SimConfig, compare_strategies
from slimdata.sim.prefetch import default_jobs
from slimdata.solver import ALL_STRATEGIES, Layout

CONTEXTS = {"128K": 131072, "256K": 262144, "512K": 524288}
LAYOUTS = [(64, 1), (16, 4), (8, 8)]


def load(path: Path) -> np.ndarray:
    with gzip.open(path, "rt") as fh:
        text = fh.read()
    vals = json.loads(text) if text.lstrip().startswith("[") else text.split()
    return np.asarray([int(x) for x in vals], dtype=np.int64)


def lognormal(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).lognormal(mean=np.log(1024), sigma=1.5, size=n)
    return np.clip(np.round(x), 128, 8192).astype(np.int64)


def distributions(data: Path) -> dict[str, np.ndarray]:
    out = {
        "wikipedia": load(data / "wikipedia.txt.gz"),
        "wlb128k": load(data / "wlb128k.json.gz"),
        "lognormal": lognormal(400_000),
    }
    rng = np.random.default_rng(0)
    return {k: v[rng.permutation(len(v))] for k, v in out.items()}


def setting(lens: np.ndarray, context: int, dp: int, pp: int, steps: int):
    """A cell's documents, layout, cost model and global batch, with simulate's defaults."""
    recompute = auto_recompute("auto", context)
    cost = CostModel.analytic("llama-8b", "h100", recompute)  # type: ignore[arg-type]
    memory, how = activation_budget_gib(
        load_device("h100").memory_gib,
        cost.param_count,
        "zero1",
        "adam",
        dp,
        pp,
        layers=cost.layers,
    )
    gbt = dp * context * (2 * pp if pp > 1 else 1)
    need = int(np.searchsorted(np.cumsum(lens), 1.2 * gbt * steps)) + 1
    layout = Layout(
        dp=dp, pp=pp, context=context, memory_gib=memory, mode="lockstep" if pp > 1 else "free"
    )
    return documents_from_lengths(lens[:need]), layout, cost, gbt, how


def runner(lens: np.ndarray, context: int, dp: int, pp: int, steps: int, jobs: int = 1):
    """``run(strategies, baseline_config)``: the comparison of one cell as JSON."""
    docs, layout, cost, gbt, how = setting(lens, context, dp, pp, steps)

    def run(strategies: list[str], baseline_config: str) -> dict:
        return compare_strategies(
            docs,
            layout,
            cost,
            strategies=strategies,
            steps=steps,
            global_batch_tokens=gbt,
            config=SimConfig(parallelism="zero1"),
            baseline_config=baseline_config,
            memory_budget=how,
            jobs=jobs,
        ).to_dict()

    return run


def cell(lens: np.ndarray, context: int, dp: int, pp: int, steps: int, jobs: int = 1) -> dict:
    """One cell with simulate's defaults; returns the comparison as JSON. ``jobs``: the
    search's worker processes (``simulate --jobs``; the same results for any number)."""
    run = runner(lens, context, dp, pp, steps, jobs)
    out = run(list(ALL_STRATEGIES), "best")
    # what the runtime hooks execute today: slimpack without static CP
    out["slimpack_cp1"] = run(["slimpack"], "cp=1")["results"]["slimpack"]
    out.pop("steps")  # the lengths are reproducible from the seed; keep the file small
    return out


def best_baseline(results: dict) -> tuple[str, dict] | None:
    ok = {
        k: r
        for k, r in results.items()
        if k != "slimpack" and not r.get("failed") and r["same_work"] and not r["over_memory_steps"]
    }
    if not ok:
        return None
    name = min(ok, key=lambda k: ok[k]["step_time"])
    return name, ok[name]


def row(ds: str, ctx: str, dp: int, pp: int, res: dict) -> dict:
    r = res["results"]
    best = best_baseline(r)
    sp, mega, dcp = r.get("slimpack", {}), res.get("megatron_default"), r.get("dcp", {})
    sp1 = res.get("slimpack_cp1", {})

    def t(x: dict | None) -> float | None:
        return None if not x or x.get("failed") else x["step_time"]

    return {
        "dataset": ds,
        "context": ctx,
        "dp": dp,
        "pp": pp,
        "best": best[0] if best else None,
        "best_config": {**best[1]["config"], "context": CONTEXTS[ctx]} if best else None,
        "best_s": best[1]["step_time"] if best else None,
        "megatron_s": t(mega),
        "dcp_s": t(dcp),
        "wlb_s": t(r.get("wlb")),
        "wlb_iterations": r.get("wlb", {}).get("iterations"),
        "wlb_token_delay": r.get("wlb", {}).get("token_delay"),
        "slimpack_s": t(sp),
        "slimpack_config": {**sp["config"], "context": CONTEXTS[ctx]} if sp.get("config") else None,
        "slimpack_cp1_s": t(sp1),
        "slimpack_over_memory": bool(sp.get("over_memory_steps")),
        "dcp_over_memory": bool(dcp.get("over_memory_steps")),
        "slimpack_failed": sp.get("reason"),
        "speedup": (best[1]["step_time"] / sp["step_time"]) if best and t(sp) else None,
        "slimpack_over_bound": sp.get("step_over_bound"),
        "bound_s": sp.get("bound") or (best[1]["bound"] if best else None),
        "search_s": res["search"]["seconds"],
        "warnings": res["warnings"],
    }


def _wlb(r: dict) -> str:
    """The faithful wlb: run time per step (flush included), iterations, mean token delay."""
    if r.get("wlb_s") is None:
        return "failed" if "wlb_s" in r else "-"
    return f"{r['wlb_s']:.2f} ({r['wlb_iterations']}, {r['wlb_token_delay']:.2f})"


def _row(config: dict) -> str:
    """``, row 256K`` when the packed row length (slimpack's pack token cap) is not the
    context (searched)."""
    row, ctx = config.get("row_tokens", 0), config.get("context", 0)
    return f", row {row // 1024}K" if row and ctx and row != ctx else ""


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "failed" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    head = (
        "| dataset | context | DP x PP | best baseline (cp, schedule, mb) | best s | Megatron "
        "default s | dcp s | wlb s (iterations, delay) | slimpack (cp, schedule, mb) "
        "| slimpack s | slimpack vs best | slimpack step/bound | slimpack cp1 s |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        c = r["best_config"]
        best = (
            f"{r['best']} (cp{c['cp']}, {c['schedule']}, {c['micro_batches']}{_row(c)})"
            if c
            else "none"
        )
        vs = fmt(r["speedup"]) + ("x" if r["speedup"] else "")
        sc = r.get("slimpack_config")
        sp_cfg = f"cp{sc['cp']}, {sc['schedule']}, {sc['micro_batches']}{_row(sc)}" if sc else "-"
        lines.append(
            f"| {r['dataset']} | {r['context']} | {r['dp']}x{r['pp']} | {best} "
            f"| {fmt(r['best_s'])} | {fmt(r['megatron_s'])} "
            f"| {fmt(r['dcp_s'])}{'!' if r.get('dcp_over_memory') else ''} "
            f"| {_wlb(r)} "
            f"| {sp_cfg} | {fmt(r['slimpack_s'])}{'!' if r.get('slimpack_over_memory') else ''} "
            f"| {vs} | {fmt(r['slimpack_over_bound'])} | {fmt(r.get('slimpack_cp1_s'))} |"
        )
    lines.append(
        "\n`!`: over the memory budget in some step (never taken as the best baseline). "
        "Best baseline: the fastest same-work strategy other than slimpack that fits "
        "(cp, schedule, micro-batches per pipeline, and the packed row length when the search "
        "chose one other than the context). "
        "slimpack runs the same configuration search as the baselines (static CP x schedule "
        "x the pack token cap, its row, and 2x and 4x its own micro-batches with a pipeline); "
        "`slimpack cp1`: slimpack at `cp=1` (no static CP, no micro-batch search). "
        "`wlb`: WLB-LLM with its outlier delay queues over the simulated steps, then flush "
        "iterations for what still waits: run time per step over the same documents, "
        "iterations simulated, mean token delay in iterations."
    )
    return "\n".join(lines) + "\n"


def heatmap(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ylabels = sorted({(r["dataset"], r["dp"], r["pp"]) for r in rows}, key=lambda k: (k[0], -k[1]))
    grid = np.full((len(ylabels), len(CONTEXTS)), np.nan)
    for r in rows:
        i = ylabels.index((r["dataset"], r["dp"], r["pp"]))
        j = list(CONTEXTS).index(r["context"])
        grid[i, j] = r["speedup"] if r["speedup"] is not None else np.nan
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(ylabels) + 1.5))
    im = ax.imshow(np.log2(grid), cmap="RdBu", vmin=-1.5, vmax=1.5, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, "failed" if np.isnan(v) else f"{v:.2f}x", ha="center", va="center")
    ax.set_xticks(range(len(CONTEXTS)), list(CONTEXTS))
    ax.set_yticks(range(len(ylabels)), [f"{d} DP{a} PP{b}" for d, a, b in ylabels])
    ax.set_title("slimpack speedup over the best-configured baseline")
    fig.colorbar(im, ax=ax, label="log2 speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data/lengths"))
    ap.add_argument("--out", type=Path, default=Path("study"))
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help="Worker processes of each cell's configuration search (simulate --jobs; the "
        "same results for any number) [default: the usable cores, at most 8].",
    )
    ap.add_argument("--contexts", default=",".join(CONTEXTS))
    ap.add_argument("--datasets", default="wikipedia,wlb128k,lognormal")
    ap.add_argument(
        "--layouts",
        default=",".join(f"{dp}x{pp}" for dp, pp in LAYOUTS),
        help="DPxPP cells to run, e.g. 64x1 (the table of --merge is in grid order).",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="Only re-render the table and heat map of earlier runs' study_fair.json files.",
    )
    ap.add_argument(
        "--rerun",
        default=None,
        help="With --merge: run this strategy again in every cell of the earlier runs first.",
    )
    args = ap.parse_args(argv)
    if args.rerun and args.merge:
        args.merge = rerun(args.rerun, args.merge, args.out, distributions(args.data), args.jobs)
    if args.merge:
        return merge(args.merge, args.out)
    dists = distributions(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, raw = [], []
    for ds in args.datasets.split(","):
        for ctx in args.contexts.split(","):
            for dp, pp in (tuple(map(int, x.split("x"))) for x in args.layouts.split(",")):
                t0 = time.perf_counter()
                res = cell(dists[ds], CONTEXTS[ctx], dp, pp, args.steps, args.jobs)
                rows.append(row(ds, ctx, dp, pp, res))
                raw.append({"dataset": ds, "context": ctx, **res})
                print(
                    f"{ds} {ctx} DP{dp} PP{pp}: {time.perf_counter() - t0:.0f} s", file=sys.stderr
                )
                (args.out / "study_fair.json").write_text(json.dumps(raw, indent=1, default=float))
                (args.out / "study_fair.md").write_text(table(rows))
    heatmap(rows, args.out / "study_fair.png")
    print(table(rows))
    return 0


def rerun(
    name: str, paths: list[Path], out: Path, dists: dict[str, np.ndarray], jobs: int
) -> list[Path]:
    """Strategy ``name`` run again in every cell of the runs at ``paths`` (``--rerun``), the
    other strategies' results kept: the patched runs, written to ``out / <run folder>``."""
    patched = []
    for path in paths:
        cells = json.loads((path / "study_fair.json").read_text())
        for c in cells:
            t0 = time.perf_counter()
            dp, pp, steps = c["config"]["dp"], c["config"]["pp"], c["config"]["steps"]
            run = runner(dists[c["dataset"]], CONTEXTS[c["context"]], dp, pp, steps, jobs)
            c["results"][name] = run([name], "best")["results"][name]
            print(
                f"{c['dataset']} {c['context']} DP{dp} PP{pp}: {name} "
                f"{c['results'][name].get('step_time', 'failed')} "
                f"({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
            )
        target = out / path.name
        target.mkdir(parents=True, exist_ok=True)
        (target / "study_fair.json").write_text(json.dumps(cells, indent=1, default=float))
        patched.append(target)
    return patched


def merge(paths: list[Path], out: Path) -> int:
    """Table and heat map of the cells of earlier runs (``--merge``)."""
    raw = [c for p in paths for c in json.loads((p / "study_fair.json").read_text())]
    names, contexts = ["wikipedia", "wlb128k", "lognormal"], list(CONTEXTS)
    raw.sort(
        key=lambda c: (
            names.index(c["dataset"]) if c["dataset"] in names else len(names),
            contexts.index(c["context"]),
            LAYOUTS.index((c["config"]["dp"], c["config"]["pp"])),
        )
    )
    rows = [row(c["dataset"], c["context"], c["config"]["dp"], c["config"]["pp"], c) for c in raw]
    out.mkdir(parents=True, exist_ok=True)
    (out / "study_fair.md").write_text(table(rows))
    heatmap(rows, out / "study_fair.png")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
