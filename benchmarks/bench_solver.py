"""Solver benchmarks (not collected by pytest): heuristic latency and plan quality.

Run: ``taskset -c 1 .venv/bin/python benchmarks/bench_solver.py [--quick] [--only latency|lockstep-latency|lockstep-split|quality|pipeline|memory|free-sim|schedule-memory|study-solve] [--validate]``

1. Latency of ``solve(..., "slimpack")`` (heuristic, MILP off) on one core for a 1M-token
   global batch over 64 DP ranks and a 4M-token batch over 256 ranks from ``wlb128k.json.gz``
   (median and worst over batches, wall time and this process's CPU time: on a shared
   machine the CPU time is the figure to compare), plus how it grows with batch size;
   ``validate=False`` unless ``--validate`` (the per-step solve; tests and plan shards always
   validate).
   ``--only lockstep-latency``: the same for lockstep plans, 4M tokens over 64 ranks, ``pp``
   1 and 4.
2. Plan quality from the cost model alone: imbalance degree ``max * n / sum`` of per-rank
   forward, backward and total cost, for every strategy, both length files, contexts 32K /
   128K / 256K (mean over batches). Setting: llama-8b on h100, full recompute, 60 GiB per rank,
   16 DP ranks, global batch = 16 x context tokens (one context-length row per rank for
   ``concat``), documents longer than the context split (``--oversize split``) so that every
   strategy sees the same documents.
3. Lockstep pipeline plans (``--only pipeline``): simulated step time vs the simulator's lower
   bound for slimpack with dp=8, pp=4 (the strategy study's small setting).
4. Memory caps (``--only memory``): slimpack plans for llama-8b under 60 GiB, full and
   selective recompute, peak per rank or the solver's refusal.
5. Free-mode plans in the simulator (``--only free-sim [--no-skew]``, not in the default
   run): step time vs the bound, with and without the skew merges.
6. Where a lockstep PP 4 solve spends its CPU time (``--only lockstep-split``, not in the
   default run): phase 1 (all its calls) and the rounds that pack every rank at one pack count
   and lag, per solve, 4M tokens over 64 ranks.
7. Lockstep plans under the interleaved schedule and under static CP against the simulator's
   memory (``--only schedule-memory``, not in the default run): does every device fit?
8. slimpack's solve time in the fair study's hardest pipeline cell (``--only study-solve``,
   not in the default run; about a minute).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths, load_lengths
from slimdata.solver import (
    STRATEGIES,
    Layout,
    SolveOptions,
    apply_oversize,
    make_batches,
    solve,
)

DATA = os.environ.get("SLIMDATA_LENGTHS", "/work/shared/data/lengths")
FILES = {"wlb128k": f"{DATA}/wlb128k.json.gz", "wikipedia": f"{DATA}/wikipedia.txt.gz"}
COST = CostModel.analytic("llama-8b", "h100", "full")


def batches(name: str, tokens: int, n: int, context: int, seed: int = 0):
    lengths = load_lengths(FILES[name])
    rng = np.random.default_rng(seed)
    need = int(tokens * (n + 1) / lengths.mean() * 1.2)
    sample = lengths[rng.permutation(len(lengths))[: min(need, len(lengths))]]
    docs = apply_oversize(documents_from_lengths(sample), context, "split")
    return make_batches(docs, tokens, seed)[:n]


def latency(quick: bool, validate: bool = False, lockstep: bool = False) -> None:
    mode = "lockstep" if lockstep else "free"
    print(
        f"== slimpack heuristic latency (one core, wlb128k, 128K context, 60 GiB, {mode}, "
        f"validate={validate}) =="
    )
    print(
        f"{'tokens':>8} {'dp':>4} {'pp':>3} {'docs':>6} {'median ms':>10} {'max ms':>8} "
        f"{'cpu med':>8} {'cpu max':>8} {'imbalance':>9}  worst fwd / bwd / total"
    )
    settings = [(1 << 18, 16, 1), (1 << 20, 64, 1), (1 << 21, 128, 1), (1 << 22, 256, 1)]
    if lockstep:
        settings = [(1 << 22, 64, 1), (1 << 22, 64, 4)]
    for tokens, dp, pp in settings:
        bs = batches("wlb128k", tokens, 3 if quick else 8, 131072)
        layout = Layout(dp=dp, pp=pp, memory_gib=60, context=131072, mode=mode)
        times, cpu, imb = [], [], []
        for b in bs:
            t0, c0 = time.perf_counter(), time.process_time()
            p = solve(b, layout, "slimpack", 0, COST, validate=validate)
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
            imb.append((p.meta["imbalance_fwd"], p.meta["imbalance_bwd"], p.meta["imbalance"]))
        w = np.max(imb, axis=0)
        print(
            f"{tokens:>8} {dp:>4} {pp:>3} {np.mean([len(b) for b in bs]):>6.0f} {np.median(times):>10.1f} {max(times):>8.1f} "
            f"{np.median(cpu):>8.1f} {max(cpu):>8.1f} {np.mean(imb, axis=0)[2]:>9.4f}"
            f"  {w[0]:.4f} / {w[1]:.4f} / {w[2]:.4f}"
        )


def lockstep_split(quick: bool) -> None:
    """CPU time of a lockstep PP 4 solve split into phase 1 and the packing rounds, by
    wrapping the two private steps of :mod:`slimdata.solver.strategies.slimpack`."""
    import slimdata.solver.strategies.slimpack as sp

    spent = {"phase1": [0, 0.0], "rounds": [0, 0.0]}

    def timed(name, fn):
        def run(*args, **kwargs):
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name][0] += 1
                spent[name][1] += time.process_time() - c0

        return run

    saved = sp._phase1, sp._lockstep_at
    sp._phase1, sp._lockstep_at = timed("phase1", saved[0]), timed("rounds", saved[1])
    layout = Layout(dp=64, pp=4, memory_gib=60, context=131072, mode="lockstep")
    print("\n== lockstep PP 4, 4M tokens / 64 ranks: CPU ms per solve ==")
    print(f"{'batch':>5} {'total':>7} {'phase 1':>12} {'pack rounds':>14} {'rest':>6}")
    try:
        for k, b in enumerate(batches("wlb128k", 1 << 22, 3 if quick else 8, 131072)):
            for v in spent.values():
                v[:] = [0, 0.0]
            c0 = time.process_time()
            solve(b, layout, "slimpack", 0, COST, validate=False)
            total = (time.process_time() - c0) * 1e3
            (n1, t1), (n2, t2) = spent["phase1"], spent["rounds"]
            rest = total - 1e3 * (t1 + t2)
            print(
                f"{k:>5} {total:>7.1f} {1e3 * t1:>7.1f} ({n1:>2}) {1e3 * t2:>8.1f} ({n2:>2}) {rest:>6.1f}"
            )
    finally:
        sp._phase1, sp._lockstep_at = saved


def quality(quick: bool) -> None:
    dp = 16
    print(
        f"\n== imbalance degree (max*n/sum) per rank, dp={dp}, T = dp x context, llama-8b full recompute, 60 GiB =="
    )
    print(
        f"{'file':>10} {'ctx':>5} {'strategy':>10} {'fwd':>7} {'bwd':>7} {'total':>7} {'merges':>6} {'ms':>7}"
    )
    for name in FILES:
        for ctx in (32768, 131072, 262144):
            bs = batches(name, dp * ctx, 2 if quick else 5, ctx)
            layout = Layout(dp=dp, memory_gib=60, context=ctx)
            for s in STRATEGIES:
                rows = []
                for b in bs:
                    p = solve(b, layout, s, 0, COST)
                    rows.append(
                        (
                            p.meta["imbalance_fwd"],
                            p.meta["imbalance_bwd"],
                            p.meta["imbalance"],
                            len(p.merges),
                            p.meta["solve_ms"],
                        )
                    )
                f, bw, t, m, ms = np.mean(rows, axis=0)
                print(
                    f"{name:>10} {ctx // 1024:>4}K {s:>10} {f:>7.3f} {bw:>7.3f} {t:>7.3f} {m:>6.1f} {ms:>7.1f}"
                )


def pipeline(quick: bool) -> None:
    """Lockstep slimpack plans on a 1F1B pipeline, judged by the simulator: the strategy
    study's small setting (dp=8, pp=4, 4 context-long rows per rank, 60 GiB, DDP, seed 0)."""
    from slimdata.sim import SimConfig, simulate_step

    print(
        "\n== lockstep slimpack, dp=8 pp=4, 4 rows/rank, 60 GiB: simulated step vs lower bound =="
    )
    print(
        f"{'file':>10} {'ctx':>5} {'m':>3} {'lag':>3} {'merges':>6} {'step s':>8} {'bound s':>8} {'gap':>7} {'peak GiB':>8} {'solve ms':>8}"
    )
    dp, pp = 8, 4
    for name in FILES:
        for ctx in (32768, 131072, 262144):
            layout = Layout(dp=dp, pp=pp, context=ctx, memory_gib=60, mode="lockstep")
            lengths = load_lengths(FILES[name])
            gbt = dp * ctx * 4
            need = int(np.searchsorted(np.cumsum(lengths), 3 * gbt)) + 1
            docs = apply_oversize(documents_from_lengths(lengths[:need]), ctx, "split")
            b = make_batches(docs, gbt, 0)[0]
            p = solve(b, layout, "slimpack", 0, COST, validate=False)
            r = simulate_step(p, COST, layout, SimConfig())
            print(
                f"{name:>10} {ctx // 1024:>4}K {p.meta['microbatches']:>3} {p.meta['lag']:>3} {len(p.merges):>6} {r.step_time:>8.2f} {r.lower_bound:>8.2f} {r.step_time / r.lower_bound - 1:>+7.1%} {r.peak_memory_gib:>8.1f} {p.meta['solve_ms']:>8.0f}"
            )


def free_sim(quick: bool, options: SolveOptions) -> None:
    """Free-mode (DDP) slimpack plans judged by the simulator: the quality settings (dp=16,
    T = 16 x context, 2 batches) and the latency table's 1M/64 and 2M/128 (3 batches); mean
    simulated step time, lower bound, worst of the fwd/bwd/total imbalance degrees and ranks in
    merge groups. ``options`` go to ``solve`` (e.g. ``SolveOptions(skew_merge=False)``)."""
    from slimdata.sim import SimConfig, simulate_step

    changed = ", ".join(f"{n}={getattr(options, n)}" for n in options.changed())
    print(f"\n== free-mode slimpack, simulated (DDP, 60 GiB, full recompute) {changed} ==")
    print(
        f"{'file':>10} {'ctx':>5} {'dp':>4} {'step s':>8} {'bound s':>8} {'imb':>7} {'merge ranks':>11}"
    )
    settings = [(n, c, 16, 16 * c, 2) for n in FILES for c in (32768, 131072, 262144)]
    settings += [("wlb128k", 131072, dp, t, 3) for t, dp in ((1 << 20, 64), (1 << 21, 128))]
    for name, ctx, dp, tokens, n in settings:
        layout = Layout(dp=dp, memory_gib=60, context=ctx)
        rows = []
        for b in batches(name, tokens, n, ctx):
            p = solve(b, layout, "slimpack", 0, COST, validate=False, options=options)
            r = simulate_step(p, COST, layout, SimConfig())
            imb = max(p.meta["imbalance_fwd"], p.meta["imbalance_bwd"], p.meta["imbalance"])
            rows.append((r.step_time, r.lower_bound, imb, sum(len(g.ranks) for g in p.merges)))
        st, lb, imb, mr = np.mean(rows, axis=0)
        print(f"{name:>10} {ctx // 1024:>4}K {dp:>4} {st:>8.3f} {lb:>8.3f} {imb:>7.4f} {mr:>11.1f}")


def memory(quick: bool) -> None:
    """Does slimpack fit llama-8b under 60 GiB (dp=8, free mode, T = dp x context)?"""
    from slimdata.errors import PlanError
    from slimdata.solver import plan_peak_memory

    print("\n== slimpack under 60 GiB, llama-8b, dp=8, T = 8 x context, 2 steps ==")
    for rc in ("full", "selective"):
        cost = CostModel.analytic("llama-8b", "h100", rc)
        for name in FILES:
            lengths = load_lengths(FILES[name])
            for ctx in (131072, 262144):
                gbt = 8 * ctx
                need = int(np.searchsorted(np.cumsum(lengths), 3 * gbt)) + 1
                docs = apply_oversize(documents_from_lengths(lengths[:need]), ctx, "split")
                for step, b in enumerate(make_batches(docs, gbt, 0)[:2]):
                    layout = Layout(dp=8, context=ctx, memory_gib=60)
                    try:
                        p = solve(b, layout, "slimpack", 0, cost, step=step)
                        peak = plan_peak_memory(p, cost).max() / 2**30
                        what = f"ok peak={peak:.1f} GiB groups={[len(g.ranks) for g in p.merges]} imbalance={p.meta['imbalance']:.3f}"
                    except PlanError as exc:
                        what = f"FAIL {str(exc)[:140]}"
                    print(f"{rc:>9} {name:>10} {ctx // 1024:>4}K step {step}: {what}")


def schedule_memory(quick: bool) -> None:
    """Lockstep slimpack plans under the interleaved schedule and under static CP, judged by
    the simulator's memory: wlb128k, 2M tokens over 8 devices per stage, pp 4, 128K context, llama-8b
    full recompute, budgets of 60 to 20 GiB per device, 2 batches; the simulated step, the
    largest device peak and whether it is over the budget (a refusal: ``fail``). Written to
    run against older commits too (``PYTHONPATH=<checkout>``)."""
    from slimdata.errors import PlanError
    from slimdata.sim import SimConfig, simulate_step

    print("\n== lockstep slimpack, wlb128k 2M tokens, dp 8, pp 4: simulated peak vs budget ==")
    print(f"{'setting':>22} {'GiB':>4}  per batch: step s / peak GiB / over")
    settings = [("interleaved v2", "interleaved", 2, 1), ("interleaved v4", "interleaved", 4, 1)]
    settings += [("1f1b, static CP 2", "1f1b", 1, 2)]
    for label, sch, v, k in settings:
        for gib in (60, 30, 20):
            cells = []
            for b in batches("wlb128k", 1 << 21, 1 if quick else 2, 131072):
                solve_at = Layout(
                    dp=8 // k, pp=4, memory_gib=gib, context=131072, mode="lockstep",
                    schedule=sch, virtual_stages=v, cp=k,
                )  # fmt: skip
                devices = Layout(dp=8, pp=4, memory_gib=gib, context=131072, mode="lockstep")
                try:
                    p = solve(b, solve_at, "slimpack", 0, COST, validate=False)
                except PlanError:
                    cells.append("fail")
                    continue
                config = SimConfig(schedule=sch, virtual_stages=max(v, 2), cp=k)
                r = simulate_step(p, COST, devices, config)
                over = "OVER" if r.over_memory else "ok"
                cells.append(f"{r.step_time:.2f} / {r.peak_memory_gib:.1f} / {over}")
            print(f"{label:>22} {gib:>4}  " + "   ".join(cells))


def study_solve(quick: bool) -> None:
    """slimpack's solve time in the fair study's hardest pipeline cell (wikipedia 512K, DP 16
    PP 4, ``study_fair.py``'s settings) at its chosen configuration: static CP 2, the
    interleaved schedule; ``simulate``'s search at ``cp=2`` (it asks for 384 micro-batches)."""
    from pathlib import Path

    from study_fair import CONTEXTS, distributions, setting

    from slimdata.sim import SimConfig, compare_strategies

    lens = distributions(Path(DATA))["wikipedia"]
    docs, layout, cost, gbt, _how = setting(lens, CONTEXTS["512K"], 16, 4, 1)
    config = SimConfig(parallelism="zero1", schedule="interleaved")
    r = compare_strategies(
        docs, layout, cost, strategies=["slimpack"], steps=1, global_batch_tokens=gbt,
        config=config, baseline_config="cp=2",
    ).to_dict()  # fmt: skip
    s = r["results"]["slimpack"]
    print("\n== slimpack, wikipedia 512K DP 16 PP 4, static CP 2, interleaved ==")
    if s.get("failed"):
        print(f"failed: {s['reason']}")
        return
    print(f"step {s['step_time']:.2f} s, {s['config']}, solve {s['solve_ms'] / 1e3:.1f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer batches")
    ap.add_argument(
        "--only",
        choices=[
            "latency",
            "lockstep-latency",
            "lockstep-split",
            "quality",
            "pipeline",
            "memory",
            "free-sim",
            "schedule-memory",
            "study-solve",
        ],
        default=None,
    )
    ap.add_argument("--no-skew", action="store_true", help="free-sim: solve with skew_merge=False")
    ap.add_argument("--validate", action="store_true", help="time solve() with validation on")
    args = ap.parse_args()
    if args.only in (None, "latency"):
        latency(args.quick, args.validate)
    if args.only in (None, "lockstep-latency"):
        latency(args.quick, args.validate, lockstep=True)
    if args.only in (None, "quality"):
        quality(args.quick)
    if args.only in (None, "pipeline"):
        pipeline(args.quick)
    if args.only in (None, "memory"):
        memory(args.quick)
    if args.only == "lockstep-split":
        lockstep_split(args.quick)
    if args.only == "study-solve":
        study_solve(args.quick)
    if args.only == "schedule-memory":
        schedule_memory(args.quick)
    if args.only == "free-sim":
        free_sim(args.quick, SolveOptions(skew_merge=not args.no_skew))
