"""No rank outlives a killed torchrun: ``kill -9`` of the launcher ends its workers, which
would otherwise go on training to the end of the run (the walk-through of a killed job)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hooks_helpers import TinyLM, doc_tokens, make_plan, tiny_forward
from slimdata.hooks import executor as executor_mod
from slimdata.hooks import launcher, loader, make_payload, run_step

from slimdata.errors import ConfigError
from slimdata.solver import Layout

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]

# a stand-in for torchrun: starts one worker with torchrun's environment, prints its pid,
# then waits to be killed
LAUNCHER = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=dict(os.environ, **{env}))
print(worker.pid, flush=True)
time.sleep(600)
"""
WORKER = """
import time
from slimdata.hooks.launcher import die_with_launcher
print("armed" if die_with_launcher() else "not armed", flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is no zombie (an orphan's reaper may be slow)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _launch(env: str) -> tuple[subprocess.Popen, int, str]:
    """Start the fake launcher; return it, its worker's pid and the worker's first line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER.format(env=env), WORKER],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, worker, proc.stdout.readline().strip()  # type: ignore[union-attr]


def _wait_gone(pid: int, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not _running(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_rank_ends_when_its_torchrun_launcher_is_killed():
    proc, worker, line = _launch('{"TORCHELASTIC_RUN_ID": "walk"}')
    try:
        assert line == "armed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _wait_gone(worker, 30), "the worker outlived its killed launcher"
    finally:
        proc.kill()
        if _running(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_process_not_started_by_torchrun_is_left_alone():
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER.format(env="{}"), WORKER],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    worker = int(proc.stdout.readline())  # type: ignore[union-attr]
    try:
        assert proc.stdout.readline().strip() == "not armed"  # type: ignore[union-attr]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert not _wait_gone(worker, 1.0), "a plain process died with its parent"
    finally:
        proc.kill()
        if _running(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.fixture
def armed(monkeypatch):
    """Record the calls of die_with_launcher made by the loaders and run_step."""
    calls: list[str] = []
    for mod in (loader, executor_mod):
        monkeypatch.setattr(mod, "die_with_launcher", lambda m=mod: calls.append(m.__name__))
    return calls


def test_both_loaders_and_run_step_arm_it(armed):
    cfg = loader.LoaderConfig(layout=Layout(dp=1), global_batch_tokens=64)
    for build in (
        lambda: loader.DocumentLoader(object(), rank=1, config=cfg),
        lambda: loader.PlanShardLoader(object(), rank=0, mode="walk"),
    ):
        with pytest.raises(ConfigError):  # refused after arming
            build()
    assert armed == ["slimdata.hooks.loader", "slimdata.hooks.loader"]
    lengths = [10, 4]
    plan = make_plan(lengths, [([[(0, 0, 10), (1, 0, 4)]], [[(0, 0, 10), (1, 0, 4)]])])
    run_step(TinyLM(), make_payload(plan, 0, doc_tokens(lengths)), forward=tiny_forward)
    assert armed[2:] == ["slimdata.hooks.executor"]


def test_arming_is_asked_once_per_launcher(monkeypatch):
    asked: list[int] = []
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "walk")
    monkeypatch.setattr(launcher, "die_with_parent", asked.append)
    monkeypatch.setattr(launcher, "_armed_for", None)
    assert launcher.die_with_launcher() and launcher.die_with_launcher()
    assert asked == [os.getppid()]
