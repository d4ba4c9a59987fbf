"""SHA-256 of every file ``slimdata plan`` writes, for a set of layouts: the evidence that a
speed-up kept plans byte-identical.

Run: ``.venv/bin/python benchmarks/plan_digests.py --save before.json`` on the old commit,
then ``--check before.json`` on the new one (exit status 1 and the differing files listed
when any digest differs). ``--shards DIR`` adds plans from a ``slimdata build`` output
(payloads with tokens); ``--skip-1m`` leaves out the 1M-document case (about 20 s).

Cases: the 1M-document instruction-data epoch of ``bench_validate.py`` (DP 64, 32K); the
shared Wikipedia and WLB-128K length files (free and lockstep, static CP, two DataLoader
workers, a baseline strategy); 200K instruction-data lengths at DP 16.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_validate import instruction_lengths

DATA = Path("/work/shared/data/lengths")
MEM = ["--memory-gib", "60"]


def cases(tmp: Path, shards: str | None, big: bool) -> dict[str, list[str]]:
    """Case name -> ``slimdata plan`` arguments (without ``-o``)."""
    inst200k = tmp / "inst200k.txt"
    np.savetxt(inst200k, instruction_lengths(200_000, seed=3), fmt="%d")
    wiki, wlb = DATA / "wikipedia.txt.gz", DATA / "wlb128k.json.gz"
    out = {
        "wiki-free-2x8": f"--lengths {wiki} --nodes 2 --ranks-per-node 8 "
        "--global-batch-tokens 1048576 --context 131072",
        "wiki-lockstep-2x4": f"--lengths {wiki} --nodes 2 --ranks-per-node 4 "
        "--global-batch-tokens 524288 --context 65536 --mode lockstep",
        "wlb-free-4x8-cp2": f"--lengths {wlb} --nodes 4 --ranks-per-node 8 "
        "--global-batch-tokens 4194304 --context 131072 --cp 2",
        "wlb-free-2x8-workers2": f"--lengths {wlb} --nodes 2 --ranks-per-node 8 "
        "--global-batch-tokens 2097152 --workers-per-rank 2",
        "wiki-wlb-ideal-1x8": f"--lengths {wiki} --nodes 1 --ranks-per-node 8 "
        "--global-batch-tokens 524288 --strategy wlb-ideal",
        "inst200k-free-2x8": f"--lengths {inst200k} --nodes 2 --ranks-per-node 8 "
        "--global-batch-tokens 1048576 --context 32768",
    }
    if big:
        inst1m = tmp / "inst1m.txt"
        np.savetxt(inst1m, instruction_lengths(1_000_000), fmt="%d")
        out["inst1m-free-8x8"] = (
            f"--lengths {inst1m} --nodes 8 --ranks-per-node 8 "
            "--global-batch-tokens 3300000 --context 32768"
        )
    if shards:
        out["shards-free-1x4"] = (
            f"{shards} --nodes 1 --ranks-per-node 4 --global-batch-tokens 65536"
        )
        out["shards-lockstep-1x4"] = out["shards-free-1x4"] + " --mode lockstep"
    return {name: [*args.split(), *MEM] for name, args in out.items()}


def digests(args: list[str], out: Path) -> dict[str, str]:
    """``relative path -> sha256`` of every file the plan command wrote to ``out``."""
    cmd = [sys.executable, "-c", "from slimdata.cli import main; main()", "plan", *args]
    subprocess.run([*cmd, "-o", str(out)], check=True, capture_output=True)
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", help="write the digests to this JSON file")
    ap.add_argument("--check", help="compare with digests saved by --save")
    ap.add_argument("--shards", help="a slimdata build output to plan from as well")
    ap.add_argument("--skip-1m", action="store_true")
    args = ap.parse_args()
    result: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in cases(Path(tmp), args.shards, not args.skip_1m).items():
            result[name] = digests(cli, Path(tmp) / name)
            print(f"{name}: {len(result[name])} files", flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.check:
        saved = json.loads(Path(args.check).read_text())
        bad = [
            f"{case}/{f}"
            for case in result
            for f in sorted(set(result[case]) | set(saved.get(case, {})))
            if result[case].get(f) != saved.get(case, {}).get(f)
        ]
        files = sum(len(v) for v in result.values())
        print(f"{len(result)} cases, {files} files: {len(bad)} differ")
        for f in bad:
            print(f"  differs: {f}")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
