"""No build worker outlives a killed build (kill -9 of the main process included), and the
killed build resumes to the same bytes as an uninterrupted one (issue 18)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from build_helpers import (
    child_pids,
    cli_build_cmd,
    make_text_corpus,
    proc_stat,
    tiny_config,
    tree_bytes,
    wait_for,
)

from slimdata.errors import OutputExistsError
from slimdata.ingest import build

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def config(corpus, **changes):
    return tiny_config(corpus, task_bytes=600, compression="zstd", hashes=("sha1",), **changes)


@pytest.mark.timeout(300)
def test_kill_9_of_main_process_kills_workers_then_resume_is_identical(tmp_path):
    corpus = make_text_corpus(tmp_path)
    reference = tmp_path / "reference"
    build(config(corpus, workers=2), reference)
    out = tmp_path / "out"
    cmd = cli_build_cmd(corpus, out, "--hashes", "sha1", "--workers", "2")
    env = {**os.environ, "SLIMDATA_FAULT_STALL": "0:1"}  # task 0's worker waits forever
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        assert wait_for(lambda: len(child_pids(proc.pid)) == 2), "workers never started"
        workers = child_pids(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        assert wait_for(lambda: all(proc_stat(w) is None for w in workers), limit=30)
        proc.communicate(timeout=30)  # EOF: no worker holds the caller's pipes any more
    finally:
        proc.kill()
        for w in workers:  # a failed run must not leave them behind either
            if proc_stat(w) is not None:
                os.kill(w, signal.SIGKILL)
    assert "index.json" not in {p.name for p in out.iterdir()}
    build(config(corpus, workers=2), out, resume=True)
    assert tree_bytes(out) == tree_bytes(reference)


def test_worker_whose_parent_is_already_gone_exits_at_once(tmp_path):
    code = (
        "import os, sys\n"
        "from slimdata.orphans import die_with_parent\n"
        "die_with_parent(os.getppid() + 1_000_000)\n"  # not our parent: it is 'gone'
        "print('survived')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""


def test_watch_thread_ends_an_orphan_where_prctl_is_missing(tmp_path):
    code = (
        "import os, sys, time\n"
        "import slimdata.orphans as o\n"
        "o._prctl_deathsig = lambda: False\n"
        "o._POLL_SECONDS = 0.05\n"
        "if os.fork() == 0:\n"
        "    parent = os.getppid()\n"
        "    os.write(1, b'child\\n')\n"
        "    o.die_with_parent(parent)\n"
        "    time.sleep(600)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "os._exit(0)\n"  # the parent ends; the child must follow
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=60)  # EOF only once the child has exited too
    finally:
        proc.kill()
    assert out == "child\n"


@pytest.mark.timeout(300)
def test_output_is_locked_during_a_build_and_released_when_it_dies(tmp_path):
    corpus = make_text_corpus(tmp_path)
    reference = tmp_path / "reference"
    build(config(corpus), reference)
    out = tmp_path / "out"
    cmd = cli_build_cmd(corpus, out, "--hashes", "sha1")
    env = {**os.environ, "SLIMDATA_FAULT_STALL": "2:1"}  # serial build: the main process waits
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: (out / "task-00002.partial").exists()), "build never started"
        for resume in (True, False):
            with pytest.raises(OutputExistsError) as info:
                build(config(corpus), out, resume=resume, overwrite=not resume)
            assert str(info.value) == (
                f"another build is writing into {out} (it holds the directory's lock); "
                "wait for it to finish or choose another output directory"
            )
        assert (out / "task-00001").is_dir()  # the refused builds touched nothing
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    build(config(corpus), out, resume=True)  # the kernel dropped the dead build's lock
    assert tree_bytes(out) == tree_bytes(reference)
    assert not (out / ".index-staging").exists()
