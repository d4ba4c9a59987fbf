"""What reading a build's columns costs `slimdata plan SHARDS`, in CPU time of this process.

Reads the document metadata from ``manifest.parquet`` (what planning reads), decodes every
MDS sample (what reading the `slices` or cost columns of all documents would cost), times
the checks a plan applies to what it reads (``check_manifest``, one ``SampleReader`` pass
with its cost-column checks), and one ``plan_to_shards`` call. Best and median CPU time of
``--repeat`` runs; pin it to one core with ``taskset -c 1``.

    taskset -c 1 .venv/bin/python benchmarks/bench_columns.py demo-out
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def timed(label: str, fn: Callable[[], object], repeat: int) -> None:
    """Print the best and median CPU time of ``repeat`` calls (wall time of the best)."""
    runs = []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.process_time() - cpu, time.perf_counter() - wall))
    runs.sort()
    (best, wall), median = runs[0], runs[len(runs) // 2][0]
    print(
        f"{label:<44} cpu best {best * 1e3:8.2f} ms  median {median * 1e3:8.2f} ms"
        f"  (wall of best {wall * 1e3:8.2f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="a `slimdata build` output directory")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import pyarrow.parquet as pq
    from streaming import LocalDataset

    from slimdata.columns import SampleReader, check_manifest
    from slimdata.docsource import load_shard_documents
    from slimdata.planning import build_cost_model, plan_to_shards

    shards, repeat = args.shards, args.repeat
    docs = load_shard_documents(shards)
    dataset = LocalDataset(local=shards)
    cost = build_cost_model(shards)
    columns = ["sample", "doc_id", "length", "loss_tokens", "cuts"]
    table = pq.read_table(Path(shards) / "manifest.parquet", columns=columns).sort_by("sample")
    print(f"{len(docs)} documents, {sum(len(d.cuts) - 1 for d in docs)} slices")
    timed("load_shard_documents (manifest + checks)", lambda: load_shard_documents(shards), repeat)
    timed("  of which check_manifest", lambda: check_manifest(table, "manifest"), repeat)
    timed(
        "decode every sample (all columns)", lambda: [dataset[i] for i in range(len(docs))], repeat
    )

    def read_checked() -> None:
        reader = SampleReader(dataset, docs, cost=cost)
        for i in range(len(docs)):
            reader(i)

    timed("decode every sample through SampleReader", read_checked, repeat)
    timed(
        "recompute cuts_costs of every document",
        lambda: [cost.cuts_costs(d.cuts) for d in docs],
        repeat,
    )

    def plan() -> None:
        out = Path(tempfile.mkdtemp()) / "plan"
        try:
            plan_to_shards(
                out,
                shards=shards,
                nodes=1,
                ranks_per_node=8,
                global_batch_tokens=1 << 20,
                memory_gib=30.9,
            )
        finally:
            shutil.rmtree(out.parent)

    timed("plan_to_shards (8 ranks, 1M tokens a step)", plan, repeat)


if __name__ == "__main__":
    main()
