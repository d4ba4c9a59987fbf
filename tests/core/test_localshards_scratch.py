"""A killed reader of compressed shards leaves no scratch directory behind: SIGTERM and Ctrl-C
remove it on the way out, and the next reader removes one a ``kill -9`` left
(:mod:`slimdata.scratch`)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from slimdata import orphans
from slimdata.cli import cli
from slimdata.localshards import SCRATCH_PREFIX, LocalShards
from slimdata.orphans import exit_on_sigterm
from slimdata.scratch import ScratchDir, remove_stale

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

READER = """
import sys, time
from slimdata.localshards import LocalShards
reader = LocalShards(sys.argv[1])
reader[0]
print(reader.shards[0].dirname, flush=True)
time.sleep(120)
"""
"""A process that decompresses a shard into its scratch directory, says where, and waits."""


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A build of the fixture documents with zstd shards (read through a scratch copy)."""
    out = tmp_path_factory.mktemp("zstd") / "packed"
    args = ["build", str(FIXTURES / "docs.jsonl"), "-o", str(out), "--slice-tokens", "128"]
    args += ["--tokenizer", str(FIXTURES / "tiny_tokenizer.json"), "--compression", "zstd"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch) -> Path:
    """A private ``$TMPDIR`` for this test and its subprocesses."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def scratch_dirs(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(SCRATCH_PREFIX))


def start_reader(packed: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(packed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    scratch = Path(proc.stdout.readline().strip())
    return proc, scratch


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, -2)])
def test_a_reader_killed_by_sigterm_or_ctrl_c_removes_its_scratch_directory(
    packed, tmpdir_env, sig, status
):
    proc, scratch = start_reader(packed)
    try:
        assert scratch.parent == tmpdir_env and scratch.name.startswith(
            f"{SCRATCH_PREFIX}{proc.pid}-"
        )
        assert list(scratch.rglob("*.mds"))  # decompressed there: not vacuous
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == status
    finally:
        proc.kill()
        proc.communicate()
    assert scratch_dirs(tmpdir_env) == []


@pytest.mark.timeout(120)
def test_the_next_reader_removes_the_scratch_directory_a_kill_9_left(packed, tmpdir_env):
    proc, scratch = start_reader(packed)
    proc.kill()
    proc.wait(timeout=60)
    proc.communicate()
    assert scratch_dirs(tmpdir_env) == [scratch.name]  # kill -9 runs no cleanup
    reader = LocalShards(packed)
    reader[0]
    mine = Path(reader.shards[0].dirname)
    assert scratch_dirs(tmpdir_env) == [mine.name] and mine.name.startswith(
        f"{SCRATCH_PREFIX}{os.getpid()}-"
    )
    reader.close()
    assert scratch_dirs(tmpdir_env) == []


def test_only_directories_of_dead_unlocking_processes_are_removed(tmpdir_env):
    gone = dead_pid()
    for name in (
        f"{SCRATCH_PREFIX}{gone}-stale",  # removed
        f"{SCRATCH_PREFIX}{gone}-locked",  # its holder (another pid namespace) lives
        f"{SCRATCH_PREFIX}{os.getpid()}-live",  # a live process
        f"{SCRATCH_PREFIX}k2j4h5x1",  # a name without a pid (an older version's)
    ):
        (tmpdir_env / name).mkdir()
    (tmpdir_env / f"{SCRATCH_PREFIX}{gone}-file").write_text("not a directory")
    fd = os.open(tmpdir_env / f"{SCRATCH_PREFIX}{gone}-locked", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_stale(SCRATCH_PREFIX) == [tmpdir_env / f"{SCRATCH_PREFIX}{gone}-stale"]
    finally:
        os.close(fd)
    assert scratch_dirs(tmpdir_env) == sorted(
        [
            f"{SCRATCH_PREFIX}{gone}-file",
            f"{SCRATCH_PREFIX}{gone}-locked",
            f"{SCRATCH_PREFIX}{os.getpid()}-live",
            f"{SCRATCH_PREFIX}k2j4h5x1",
        ]
    )
    assert remove_stale(SCRATCH_PREFIX) == [tmpdir_env / f"{SCRATCH_PREFIX}{gone}-locked"]


def test_sigterm_exits_only_while_a_scratch_directory_lives_and_a_handler_is_kept(
    tmpdir_env, monkeypatch
):
    monkeypatch.setattr(orphans, "_holds", 0)  # whatever readers other tests left open
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        check_sigterm_holds()
    finally:
        signal.signal(signal.SIGTERM, before)


def check_sigterm_holds() -> None:
    first, second = ScratchDir("t-"), ScratchDir("t-")
    assert signal.getsignal(signal.SIGTERM) is exit_on_sigterm
    first.cleanup()
    first.cleanup()  # once only: the second still holds it
    assert signal.getsignal(signal.SIGTERM) is exit_on_sigterm
    second.cleanup()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert not Path(first.name).exists() and not Path(second.name).exists()

    def own(signum, frame):  # a program's own handler (a trainer's checkpoint-and-exit)
        pass

    signal.signal(signal.SIGTERM, own)
    scratch = ScratchDir("t-")
    assert signal.getsignal(signal.SIGTERM) is own
    scratch.cleanup()
    assert signal.getsignal(signal.SIGTERM) is own
