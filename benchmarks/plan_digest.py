"""Digests of slimpack's lockstep plans over many batches and layouts (not collected by
pytest): a change meant to make the solver faster without changing its plans is checked by
writing the digests before and comparing after.

    .venv/bin/python benchmarks/plan_digest.py --write /tmp/before.json
    .venv/bin/python benchmarks/plan_digest.py --compare /tmp/before.json

A digest is the SHA-256 of ``json.dumps(plan.to_dict(), sort_keys=True)`` with the
wall-clock ``meta["solve_ms"]`` removed; ``pipeline_estimate`` is kept. Each plan also gets
the digest of its packs and merge groups alone (``meta`` left out), so a change of the
estimate alone reads "same packs".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths, load_lengths
from slimdata.errors import PlanError
from slimdata.solver import Layout, apply_oversize, make_batches, solve

DATA = os.environ.get("SLIMDATA_LENGTHS", "/work/shared/data/lengths")
FILES = {"wlb128k": f"{DATA}/wlb128k.json.gz", "wikipedia": f"{DATA}/wikipedia.txt.gz"}

# (file, tokens, dp, pp, context, memory GiB, microbatches, recompute)
CASES = [
    ("wlb128k", 1 << 22, 64, 4, 131072, 60, None, "full"),
    ("wlb128k", 1 << 22, 64, 1, 131072, 60, None, "full"),
    ("wlb128k", 1 << 20, 8, 4, 131072, 60, None, "full"),
    ("wlb128k", 1 << 20, 8, 4, 131072, 30, None, "full"),
    ("wlb128k", 1 << 20, 16, 2, 32768, 20, None, "full"),
    ("wlb128k", 1 << 21, 8, 8, 262144, 60, None, "full"),
    ("wlb128k", 1 << 20, 8, 4, 131072, 60, 8, "full"),
    ("wlb128k", 1 << 20, 8, 4, 131072, 60, None, "selective"),
    ("wikipedia", 1 << 20, 8, 4, 32768, 60, None, "full"),
    ("wikipedia", 1 << 21, 32, 2, 131072, 40, None, "full"),
]


def digests(n: int) -> dict[str, str]:
    out = {}
    for fname, tokens, dp, pp, ctx, gib, mb, rec in CASES:
        cost = CostModel.analytic("llama-8b", "h100", rec)
        lengths = load_lengths(FILES[fname])
        rng = np.random.default_rng(0)
        need = int(tokens * (n + 1) / lengths.mean() * 1.2)
        sample = lengths[rng.permutation(len(lengths))[: min(need, len(lengths))]]
        docs = apply_oversize(documents_from_lengths(sample), ctx, "split")
        layout = Layout(dp=dp, pp=pp, memory_gib=gib, context=ctx, mode="lockstep", microbatches=mb)
        for k, batch in enumerate(make_batches(docs, tokens, 0)[:n]):
            key = f"{fname} {tokens} dp{dp} pp{pp} ctx{ctx} {gib}GiB mb{mb} {rec} #{k}"
            try:
                plan = solve(batch, layout, "slimpack", k, cost, validate=False)
            except PlanError as exc:
                out[key] = f"PlanError: {exc}"
                continue
            d = plan.to_dict()
            d["meta"].pop("solve_ms", None)
            text = json.dumps(d, sort_keys=True)
            packs = json.dumps({k: v for k, v in d.items() if k != "meta"}, sort_keys=True)
            out[key] = (
                f"{_sha(packs)} {_sha(text)}"
                f" est={plan.meta.get('pipeline_estimate')} mb={plan.meta.get('microbatches')}"
                f" lag={plan.meta.get('lag')}"
            )
    return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=6)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write")
    g.add_argument("--compare")
    args = ap.parse_args(argv)
    got = digests(args.batches)
    if args.write:
        with open(args.write, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
        print(f"{len(got)} plans written")
        return 0
    with open(args.compare) as f:
        want = json.load(f)
    diff = [k for k in want if got.get(k) != want[k]]
    same_packs = [k for k in diff if got.get(k, " ").split()[0] == want[k].split()[0]]
    for k in diff:
        what = "same packs" if k in same_packs else "DIFFERS"
        print(f"{what} {k}\n  before {want[k]}\n  after  {got.get(k)}")
    print(
        f"{len(want) - len(diff)} of {len(want)} plans identical,"
        f" {len(same_packs)} more with the same packs (meta differs)"
    )
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
