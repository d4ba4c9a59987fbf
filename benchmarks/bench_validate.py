"""Scale to many small documents (issue 18): plan validation and `slimdata plan` end to end.

Run: ``taskset -c 1 .venv/bin/python benchmarks/bench_validate.py [--docs 20000] [--plan-docs 1000000] [--phases]``

1. ``StepPlan.validate`` of one step of ``--docs`` documents (best of 5): one-token documents
   over 8 ranks (the shape that took 175 s before), and instruction-data lengths
   (lognormal, median 300 tokens) over 64 ranks at 32K context.
2. ``slimdata plan --lengths`` on ``--plan-docs`` instruction-data lengths (lognormal,
   median 300, clipped to 32K; DP 64 = 8 nodes x 8 ranks, 32K context, ~3.3M tokens per
   step: about 150 steps of ~6,700 documents): wall time and CPU time (user + system) of
   the whole command, and the size of the plan shards it wrote (one rank's view of its step
   per payload: ``slimdata.plan.RankPlan``). Skip with ``--plan-docs 0``. The plan shards
   are written to a temporary directory and deleted. On a shared machine the wall time
   includes waiting for the core; the CPU time is what the command itself costs.
3. ``--phases``: the same pipeline in this process, the CPU time of each phase (imports,
   reading lengths, documents, batches, solving, validating, rank views, JSON encoding, the
   payloads' sample order, MDS writing), cyclic GC off as in ``slimdata plan``. Where the
   end-to-end time goes.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, solve


def instruction_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(300), 1.0, n)), 1, 32768).astype(np.int64)


def best_validate(lengths, layout: Layout) -> tuple[float, int]:
    plan = solve(documents_from_lengths(lengths), layout, "slimpack", 0, validate=False)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        plan.validate()
        best = min(best, time.perf_counter() - t0)
    return best, sum(1 for r in plan.ranks for _ in r.slices())


def end_to_end(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        lengths = Path(tmp) / "lengths.txt"
        np.savetxt(lengths, instruction_lengths(n), fmt="%d")
        cmd = [sys.executable, "-c", "from slimdata.cli import main; main()", "plan"]
        cmd += ["--lengths", str(lengths), "--nodes", "8", "--ranks-per-node", "8"]
        cmd += ["--global-batch-tokens", "3300000", "--memory-gib", "60", "--context", "32768"]
        cmd += ["-o", str(Path(tmp) / "plan")]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        seconds = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        size = sum(p.stat().st_size for p in (Path(tmp) / "plan").iterdir())
        print(f"  {out.strip()}\n  plan shards: {size / 2**20:.1f} MiB")
        return seconds, cpu


def phases(n: int) -> dict[str, float]:
    """CPU seconds of each phase of ``slimdata plan --lengths`` on ``n`` documents, run in this
    process in the order ``plan_to_shards`` runs them."""
    import dataclasses
    import gc
    import shutil

    gc.disable()
    cpu: dict[str, float] = {}
    last = [time.process_time()]

    def done(phase: str) -> None:
        now = time.process_time()
        cpu[phase], last[0] = now - last[0], now

    from slimdata.docsource import load_lengths
    from slimdata.ingest.mds import writer_class
    from slimdata.plan.rankplan import rank_views
    from slimdata.solver.config import PlanConfig
    from slimdata.solver.planshards import (
        PLAN_COLUMNS,
        _sample_order,
        payload_crc32,
        without_timings,
    )

    done("imports")
    with tempfile.TemporaryDirectory() as tmp:
        np.savetxt(Path(tmp) / "lengths.txt", instruction_lengths(n), fmt="%d")
        last[0] = time.process_time()
        lengths = load_lengths(Path(tmp) / "lengths.txt")
        done("read lengths")
        docs = documents_from_lengths(lengths, 2048)
        done("documents")
        layout = Layout(dp=64, ranks_per_node=8, memory_gib=60, context=32768)
        config = PlanConfig(layout=layout, global_batch_tokens=3_300_000, oversize="split")
        batches = config.batches(docs)
        done("batches")
        plans = [config.solve(b, i, validate=False) for i, b in enumerate(batches)]
        done("solve")
        for p in plans:
            p.validate()
        done("validate")
        views = [rank_views(dataclasses.replace(p, meta=without_timings(p.meta))) for p in plans]
        done("rank views")
        texts = [[v.to_json() for v in vs] for vs in views]
        done("JSON")
        order = _sample_order(len(plans), 8, 8, 1)
        done("sample order (partitioner)")
        empty = np.zeros(1, dtype=np.uint32)
        with writer_class()(
            out=str(Path(tmp) / "plan"), columns=PLAN_COLUMNS, size_limit=1 << 26
        ) as w:
            for flat in order:
                step, rank = divmod(flat, 64)
                text = texts[step][rank]
                crc = payload_crc32(text, empty[:0])
                w.write(
                    {
                        "step": step,
                        "rank": rank,
                        "plan": text,
                        "tokens": empty,
                        "ntokens": 0,
                        "crc32": crc,
                    }
                )
        done("MDS write")
        shutil.rmtree(Path(tmp) / "plan")
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--plan-docs", type=int, default=1_000_000)
    ap.add_argument("--phases", action="store_true", help="CPU time of each phase, in process")
    args = ap.parse_args()
    if args.phases:
        cpu = phases(args.plan_docs)
        print(f"phases of slimdata plan --lengths ({args.plan_docs} documents), CPU seconds:")
        for phase, seconds in cpu.items():
            print(f"  {phase:30s} {seconds:6.2f}")
        print(f"  {'total':30s} {sum(cpu.values()):6.2f}")
        return
    s, n = best_validate([1] * args.docs, Layout(dp=8, memory_gib=60))
    print(f"validate: {args.docs} one-token documents, dp 8, {n} slices: {s * 1e3:.1f} ms")
    lengths = instruction_lengths(args.docs)
    s, n = best_validate(lengths, Layout(dp=64, memory_gib=60, context=32768))
    print(f"validate: {args.docs} instruction documents, dp 64, {n} slices: {s * 1e3:.1f} ms")
    if args.plan_docs:
        s, cpu = end_to_end(args.plan_docs)
        print(
            f"slimdata plan --lengths ({args.plan_docs} documents), end to end: "
            f"{s:.1f} s wall, {cpu:.1f} s CPU"
        )


if __name__ == "__main__":
    main()
