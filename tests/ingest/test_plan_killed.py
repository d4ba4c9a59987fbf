"""`slimdata plan` stopped with SIGTERM or `kill -9` while it writes its plan shards: no
process is left behind, and the folder is finished by --resume and replaced by
--overwrite, byte for byte as an uninterrupted run (the states a kill can leave, one by
one: tests/core/test_plan_interrupted.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from build_helpers import child_pids, proc_stat, tree_bytes, wait_for
from click.testing import CliRunner

from slimdata.cli import cli

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

# `slimdata plan` that stops for good at a point of its writing, once it touched READY:
# at "payloads" the writer holds OUT (the request is written, no shard yet), at "plan.json"
# the shards and index.json are written, plan.json is not
_STALLING = """
import signal, sys
from pathlib import Path
import slimdata.solver.planshards as ps

ready, where, write_atomic = Path(sys.argv[1]), sys.argv[2], ps.write_atomic

def stall(*args):
    ready.touch()
    while True:
        signal.pause()

def before_plan_json(path, data):
    (stall if path.name == "plan.json" else write_atomic)(path, data)

if where == "payloads":
    ps.payload_crc32 = stall
else:
    ps.write_atomic = before_plan_json
from slimdata.cli import main
sys.argv = ["slimdata", *sys.argv[3:]]
main()
"""
LEFT = {
    "payloads": ["plan_request.json"],
    "plan.json": ["index.json", "plan_request.json", "shard.00000.mds"],
}


def _args(tmp_path: Path) -> list[str]:
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [300, 40, 2000, 128, 77, 900, 12, 256] * 6))
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "2"]
    return [*args, "--global-batch-tokens", "4096", "--memory-gib", "40", "--quiet"]


def _stop(tmp_path: Path, args: list[str], where: str, how: int) -> int:
    """Run ``args`` until it stalls at ``where``, check it has no child process, send it
    ``how``; its exit code once it is gone."""
    ready = tmp_path / "ready"
    cmd = [sys.executable, "-c", _STALLING, str(ready), where, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: ready.exists() or proc.poll() is not None, limit=120)
        assert ready.exists(), proc.communicate()[1].decode()
        assert child_pids(proc.pid) == []  # plan runs in one process: no worker to outlive it
        proc.send_signal(how)
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc_stat(proc.pid) is None
    return code


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill-9"])
@pytest.mark.parametrize("where", list(LEFT))
def test_a_killed_plan_is_resumed_or_replaced_to_the_same_bytes(tmp_path, where, how):
    args = _args(tmp_path)
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "whole")])
    assert res.exit_code == 0, res.output
    whole = tree_bytes(tmp_path / "whole")
    killed = tmp_path / "killed"
    assert _stop(tmp_path, [*args, "-o", str(killed)], where, how) == -how
    assert sorted(p.name for p in killed.iterdir()) == LEFT[where]
    shutil.copytree(killed, tmp_path / "replaced")
    res = CliRunner().invoke(cli, [*args, "-o", str(killed), "--resume"])
    assert (res.exit_code, tree_bytes(killed)) == (0, whole), res.output
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "replaced"), "--overwrite"])
    assert (res.exit_code, tree_bytes(tmp_path / "replaced")) == (0, whole), res.output
