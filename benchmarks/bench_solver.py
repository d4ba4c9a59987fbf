"""Solver benchmarks (not collected by pytest): heuristic latency and plan quality.

Run: ``.venv/bin/python benchmarks/bench_solver.py [--quick]``

1. Latency of ``solve(..., "slimpack")`` (heuristic, MILP off) on one core for a 1M-token
   global batch over 64 DP ranks and a 4M-token batch over 256 ranks from ``wlb128k.json.gz``
   (median over batches), plus how it grows with batch size.
2. Plan quality from the cost model alone: imbalance degree ``max * n / sum`` of per-rank
   forward, backward and total cost, for every strategy, both length files, contexts 32K /
   128K / 256K (mean over batches). Setting: llama-8b on h100, full recompute, 60 GiB per rank,
   16 DP ranks, global batch = 16 x context tokens (one context-length row per rank for
   ``concat``), documents longer than the context split (``--oversize split``) so that every
   strategy sees the same documents.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths, load_lengths
from slimdata.solver import STRATEGIES, Layout, apply_oversize, make_batches, solve

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


def latency(quick: bool) -> None:
    print("== slimpack heuristic latency (one core, wlb128k, 128K context, 60 GiB) ==")
    print(f"{'tokens':>8} {'dp':>4} {'docs':>6} {'median ms':>10} {'max ms':>8} {'imbalance':>9}")
    settings = [(1 << 18, 16), (1 << 20, 64), (1 << 21, 128), (1 << 22, 256)]
    for tokens, dp in settings:
        bs = batches("wlb128k", tokens, 3 if quick else 8, 131072)
        layout = Layout(dp=dp, memory_gib=60, context=131072)
        times, imb = [], []
        for b in bs:
            t0 = time.perf_counter()
            p = solve(b, layout, "slimpack", 0, COST)
            times.append((time.perf_counter() - t0) * 1e3)
            imb.append(p.meta["imbalance"])
        print(f"{tokens:>8} {dp:>4} {np.mean([len(b) for b in bs]):>6.0f} {np.median(times):>10.1f} {max(times):>8.1f} {np.mean(imb):>9.4f}")


def quality(quick: bool) -> None:
    dp = 16
    print(f"\n== imbalance degree (max*n/sum) per rank, dp={dp}, T = dp x context, llama-8b full recompute, 60 GiB ==")
    print(f"{'file':>10} {'ctx':>5} {'strategy':>10} {'fwd':>7} {'bwd':>7} {'total':>7} {'merges':>6} {'ms':>7}")
    for name in FILES:
        for ctx in (32768, 131072, 262144):
            bs = batches(name, dp * ctx, 2 if quick else 5, ctx)
            layout = Layout(dp=dp, memory_gib=60, context=ctx)
            for s in STRATEGIES:
                rows = []
                for b in bs:
                    p = solve(b, layout, s, 0, COST)
                    rows.append((p.meta["imbalance_fwd"], p.meta["imbalance_bwd"], p.meta["imbalance"], len(p.merges), p.meta["solve_ms"]))
                f, bw, t, m, ms = np.mean(rows, axis=0)
                print(f"{name:>10} {ctx // 1024:>4}K {s:>10} {f:>7.3f} {bw:>7.3f} {t:>7.3f} {m:>6.1f} {ms:>7.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer batches")
    ap.add_argument("--only", choices=["latency", "quality"], default=None)
    args = ap.parse_args()
    if args.only in (None, "latency"):
        latency(args.quick)
    if args.only in (None, "quality"):
        quality(args.quick)
