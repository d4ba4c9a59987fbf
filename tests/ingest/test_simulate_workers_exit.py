"""``slimdata simulate --jobs``: no worker outlives the command, stopped with Ctrl-C or
SIGTERM or killed with ``kill -9`` (:mod:`slimdata.orphans`, shared with the build)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from build_helpers import child_pids, proc_stat, wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _simulate(tmp_path: Path, session: bool = False) -> subprocess.Popen:
    """A search long enough to stop midway: 16M-token steps, DP 16 x PP 4, two workers;
    ``session``: in a process group of its own, as a terminal's foreground job."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(9.0, 1.4, 4000).astype(int) + 64, 131072)
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lengths.tolist())))
    code = "from slimdata.cli import main; main()"
    args = ["simulate", "--lengths", str(path), "--dp", "16", "--pp", "4", "--jobs", "2"]
    return subprocess.Popen(
        [sys.executable, "-c", code, *args, "--global-batch-tokens", str(1 << 24)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=session,
    )


def _stop(proc: subprocess.Popen, children: int, send) -> tuple[int, bytes]:
    """Once ``proc`` has ``children`` child processes, ``send(proc.pid)`` a signal; its exit
    code and standard error once it and every child it had are gone."""
    workers: list[int] = []
    try:
        assert wait_for(lambda: len(child_pids(proc.pid)) >= children, limit=120), "no workers"
        workers = child_pids(proc.pid)
        send(proc.pid)
        code = proc.wait(timeout=60)
        _out, err = proc.communicate(timeout=30)  # EOF: no worker holds the pipes
        assert wait_for(lambda: all(proc_stat(w) is None for w in workers), limit=30)
    finally:
        proc.kill()
        for w in workers:
            if proc_stat(w) is not None:
                os.kill(w, signal.SIGKILL)
    return code, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["ctrl-c", "term", "kill-9"]
)
def test_no_worker_outlives_a_stopped_simulation(tmp_path, how):
    # two workers and multiprocessing's resource tracker
    code, err = _stop(_simulate(tmp_path), 3, lambda pid: os.kill(pid, how))
    if how == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    # Ctrl-C: click's "Aborted!"; SIGTERM: 128 + 15. No traceback, nothing leaked
    assert code == (1 if how == signal.SIGINT else 143), err.decode()
    assert b"Traceback" not in err and b"leaked" not in err, err.decode()


@pytest.mark.timeout(300)
def test_ctrl_c_typed_while_workers_start_stops_them_without_a_traceback(tmp_path):
    # a terminal's Ctrl-C reaches the whole process group: the workers too, also while they
    # are still importing, before they could ignore it
    code, err = _stop(
        _simulate(tmp_path, session=True), 2, lambda pid: os.killpg(pid, signal.SIGINT)
    )
    assert code == 1, err.decode()
    assert b"Traceback" not in err and b"leaked" not in err, err.decode()
