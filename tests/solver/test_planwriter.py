"""The plan-shard writer: streaming.MDSWriter's bytes without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from slimdata.ingest.mds import writer_class
from slimdata.solver.planshards import PLAN_COLUMNS
from slimdata.solver.planwriter import PlanShardWriter, plan_writer


def samples():
    # plans of growing size and token arrays, one empty payload (one zero token), one
    # sample larger than the shard size limit below (MDSWriter then writes an empty shard)
    out = []
    for i in range(12):
        plan = json.dumps({"step": i // 4, "rank": i % 4, "pad": "x" * (40 * i)})
        toks = np.arange(i * 7, dtype=np.uint32) if i % 3 else np.zeros(1, dtype=np.uint32)
        out.append({"step": i // 4, "rank": i % 4, "plan": plan, "tokens": toks, "ntokens": i})
    out.insert(5, {**out[5], "plan": "é" * 900})
    return out


def tree(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("limit", [1 << 26, 700])
def test_same_bytes_as_mdswriter(tmp_path, limit):
    with writer_class()(out=str(tmp_path / "ref"), columns=PLAN_COLUMNS, size_limit=limit) as w:
        for s in samples():
            w.write(s)
    with PlanShardWriter(out=tmp_path / "own", columns=PLAN_COLUMNS, size_limit=limit) as w:
        for s in samples():
            w.write(s)
    ref, own = tree(tmp_path / "ref"), tree(tmp_path / "own")
    assert own == ref
    assert len(ref) == (2 if limit > 1 << 20 else 12)  # one shard, or eleven: not vacuous


def test_refuses_a_non_empty_directory_and_bad_limits(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(FileExistsError):
        PlanShardWriter(out=tmp_path, columns=PLAN_COLUMNS, size_limit=1 << 20)
    with pytest.raises(ValueError, match="size_limit"):
        PlanShardWriter(out=tmp_path / "new", columns=PLAN_COLUMNS, size_limit=0)


def test_mdswriter_for_what_it_does_not_cover(tmp_path):
    own = plan_writer(tmp_path / "a", PLAN_COLUMNS, None, 1 << 26)
    assert isinstance(own, PlanShardWriter)
    own.finish()
    mds = writer_class()
    assert isinstance(plan_writer(tmp_path / "b", PLAN_COLUMNS, "zstd", 1 << 26), mds)
    assert isinstance(plan_writer(tmp_path / "c", PLAN_COLUMNS, None, "64mb"), mds)


def test_plan_from_lengths_never_imports_torch(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(map(str, [300, 5000, 70, 1200] * 20)))
    code = f"""
        import sys
        from click.testing import CliRunner
        from slimdata.cli import cli
        args = ["plan", "--lengths", {str(lengths)!r}, "--nodes", "1", "--ranks-per-node", "4",
                "--global-batch-tokens", "20000", "--memory-gib", "60", "--context", "8192",
                "-o", {str(tmp_path / "plan")!r}]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        print("torch" in sys.modules)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
    assert (tmp_path / "plan" / "index.json").is_file()
