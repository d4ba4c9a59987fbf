"""``benchmarks/gpu_check.py --quick`` (the GPU report's script at toy sizes, on the CPU) runs
every section it can without CUDA to the end: the script a lent GPU runs is checked here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_quick_runs_every_cpu_section(tmp_path):
    shards, out = tmp_path / "shards", tmp_path / "report"
    corpus = Path(json.__file__).parent  # the running interpreter's json package
    build = [sys.executable, "-m", "slimdata.cli", "build", str(corpus), "-o", str(shards)]
    subprocess.run([*build, "--quiet"], check=True, timeout=120, cwd=ROOT)
    run = [sys.executable, "benchmarks/gpu_check.py", "--quick", "--out", str(out)]
    proc = subprocess.run(
        [*run, "--shards", str(shards)], capture_output=True, text=True, timeout=540, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert set(data) == {
        "environment",
        "equivalence",
        "attention_curve",
        "profile",
        "speedup_dp2_context1024",
    }
    # fp32 on the CPU: packing changes nothing but the summation order
    assert [r["mode"] for r in data["equivalence"]] == ["free", "lockstep"]
    assert all(r["packed_grad"] < 1e-5 for r in data["equivalence"])
    results = data["speedup_dp2_context1024"]["results"]
    assert list(results) == ["slimpack", "bfd", "multipack", "wlb-ideal", "sorted", "concat"]
    # the same work: every strategy that keeps documents whole runs the same tokens and
    # attention pairs; concat runs the same tokens and cuts documents (fewer pairs)
    whole = {(r["tokens"], r["attention_pairs"]) for s, r in results.items() if s != "concat"}
    assert len(whole) == 1
    ((tokens, pairs),) = whole
    assert results["concat"]["tokens"] == tokens and results["concat"]["attention_pairs"] < pairs
    assert {"report.md", "attention_curve.png", "pack_time_mape.png"} <= {
        p.name for p in out.iterdir()
    }
