"""`slimdata build --engine ray` (issue 19): the same bytes as the local build, Ray's retry
of a killed task, resume after a killed driver, and a clear error without the extra.

One local Ray cluster (2 CPUs, loopback, its own temp directory, no usage stats, no auth
token in $HOME) serves the whole test session; its processes must be gone after
``ray.shutdown()``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import build_helpers
import pytest
from build_helpers import (
    FIXTURES,
    cli_build_args,
    cli_build_cmd,
    make_text_corpus,
    tiny_config,
    tree_bytes,
)
from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.errors import ConfigError
from slimdata.ingest import build

_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := build_helpers.proc_stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[1]
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _with_env(name: str, value: str) -> list[int]:
    """Live processes of this user whose environment has ``name=value``."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if build_helpers.proc_stat(pid) is not None]


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the session; yields its GCS address."""
    import ray

    saved = {name: os.environ.get(name) for name in _ENV}
    os.environ.update(_ENV)
    temp = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths must fit 107 bytes
    before = _descendants(os.getpid())  # other tests' helpers (e.g. a resource tracker)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 << 20,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp,
        log_to_driver=False,
    )
    cluster = _descendants(os.getpid()) - before  # gcs_server, raylet, agents, workers
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        started = cluster.union(*(_descendants(pid) for pid in cluster))  # + later workers
        ray.shutdown()
        gone = build_helpers.wait_for(
            lambda: all(build_helpers.proc_stat(p) is None for p in started), limit=60
        )
        left = [p for p in started if build_helpers.proc_stat(p) is not None]
        for pid in left:  # never leave them behind, even when the check fails
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        assert gone, f"Ray processes outlived ray.shutdown(): {left}"


@pytest.fixture
def corpus(tmp_path) -> Path:
    """Generated text files plus the committed fixtures (records that are quarantined too)."""
    root = make_text_corpus(tmp_path, files=16)
    shutil.copytree(FIXTURES / "text", root / "text")
    shutil.copy(FIXTURES / "docs.jsonl", root / "docs.jsonl")
    (root / "rejects.jsonl").write_text('{"text": "kept"}\n{"text": ""}\n{"body": "no text"}\n')
    return root


def config(corpus, **changes):
    return tiny_config(corpus, task_bytes=600, compression="zstd", hashes=("sha1",), **changes)


@pytest.mark.timeout(300)
def test_ray_build_is_byte_identical_to_local(ray_cluster, tmp_path, corpus):
    local = build(config(corpus, workers=2), tmp_path / "local")
    ray_out = tmp_path / "ray"
    args = cli_build_args(corpus, ray_out, "--hashes", "sha1", "--engine", "ray")
    result = CliRunner().invoke(cli, [*args, "--address", ray_cluster])
    assert result.exit_code == 0, result.output
    counts = local.sidecar["counts"]
    assert counts["tasks"] >= 10 and counts["quarantined"] >= 1  # many tasks; merged quarantine
    assert f"wrote {counts['documents']:,} documents, {counts['tokens']:,} tokens" in result.output
    assert "tokens/s" in result.output
    assert tree_bytes(ray_out) == tree_bytes(tmp_path / "local")


@pytest.mark.timeout(300)
def test_ray_retries_a_task_whose_worker_was_killed(ray_cluster, tmp_path, corpus, monkeypatch):
    reference = tmp_path / "reference"
    build(config(corpus), reference)
    once = tmp_path / "fault-fired"
    monkeypatch.setenv("SLIMDATA_FAULT_KILL", "2:1")  # SIGKILL after 1 document of task 2...
    monkeypatch.setenv("SLIMDATA_FAULT_ONCE", str(once))  # ...in the first attempt only
    summary = build(config(corpus, engine="ray"), tmp_path / "out")
    assert once.exists()  # the worker did die
    assert summary.tasks_run == summary.sidecar["counts"]["tasks"] and summary.tasks_resumed == 0
    assert tree_bytes(tmp_path / "out") == tree_bytes(reference)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_driver_then_resume_is_identical(ray_cluster, tmp_path, corpus):
    reference = tmp_path / "reference"
    build(config(corpus), reference)
    out = tmp_path / "out"
    cmd = cli_build_cmd(
        corpus, out, "--hashes", "sha1", "--engine", "ray", "--address", ray_cluster
    )
    marker = str(tmp_path)  # tells the stalled worker apart from other processes
    env = {**os.environ, "SLIMDATA_FAULT_STALL": "0:1", "SLIMDATA_FAULT_ONCE": marker + "/stall"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        finished = lambda: len(list(out.glob("task-*[0-9]"))) >= 3  # noqa: E731
        assert build_helpers.wait_for(
            lambda: (out / "task-00000.partial").is_dir() and finished(), 180
        ), "the Ray build never got going"
        assert _with_env("SLIMDATA_FAULT_ONCE", marker + "/stall"), "no stalled worker found"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        # Ray ends the dead driver's workers (the stalled one included)
        assert build_helpers.wait_for(
            lambda: not _with_env("SLIMDATA_FAULT_ONCE", marker + "/stall"), 60
        )
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    names = {p.name for p in out.iterdir()}
    assert "index.json" not in names and "task-00000" not in names
    summary = build(config(corpus, engine="ray"), out, resume=True)
    assert summary.tasks_resumed >= 3 and summary.tasks_run >= 1
    assert tree_bytes(out) == tree_bytes(reference)


def test_missing_ray_is_a_clear_error(tmp_path, corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"pip install 'slimdata\[ray\]'"):
        build(config(corpus, engine="ray"), out)
    result = CliRunner().invoke(cli, ["build", str(corpus), "-o", str(out), "--engine", "ray"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--engine ray needs Ray Data" in result.output and "slimdata[ray]" in result.output
    assert not out.exists()  # checked before anything is written


def test_a_cluster_out_of_reach_is_an_error_before_any_output(tmp_path, corpus, monkeypatch):
    """No cluster for ``auto``, ``ray://`` without ``ray[client]`` (ray.init's own errors,
    raised by a stand-in: ``auto`` would find the cluster of the other tests) and a GCS
    ``host:port`` where nothing listens (ray.init retries that for ten minutes): one
    ``Error:`` line each, exit 2, before the output directory is made."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    errors = {
        "auto": ConnectionError("Could not find any running Ray instance. Please specify one."),
        "ray://127.0.0.1:1": ValueError("Ray Client requires pip package `ray[client]`.\nMore."),
    }

    def init(address=None, **_options):
        raise errors[address]

    monkeypatch.setattr(ray, "init", init)
    out = tmp_path / "out"
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{bound.getsockname()[1]}"
        for address, reason in (
            ("auto", "Could not find any running Ray instance. Please specify one"),
            ("ray://127.0.0.1:1", "Ray Client requires pip package `ray[client]`"),
            (closed, "Connection refused"),
        ):
            args = [*cli_build_args(corpus, out, "--engine", "ray"), "--address", address]
            result = CliRunner().invoke(cli, args)
            assert (result.exit_code, result.output) == (
                2,
                f"Error: --engine ray cannot connect to the Ray cluster at {address}: {reason}; "
                "start one (`ray start --head`) and give its address, or leave --address out "
                "and RAY_ADDRESS unset for a local cluster\n",
            )
    assert not out.exists()


def test_a_port_that_is_not_a_gcs_is_an_error_at_once(tmp_path, corpus, monkeypatch):
    """A ``host:port`` that accepts connections but is not a Ray GCS (a web server; a server
    that never answers), which ``ray.init`` would retry for ten minutes: one ``Error:`` line
    each, exit 2, before the output directory is made; ray.init is never called."""
    import http.server
    import threading

    import ray

    from slimdata.ingest import ray_engine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **_: pytest.fail("ray.init was called"))
    monkeypatch.setattr(ray_engine, "CONNECT_SECONDS", 0.5)

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args):  # the runner captures stderr with the output
            pass

    web = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    out = tmp_path / "out"
    with socket.socket() as silent:  # listening, never accepting: the kernel completes connects
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        try:
            for address, reason in (
                (f"127.0.0.1:{web.server_port}", "it accepts connections but is not a Ray GCS"),
                (f"127.0.0.1:{silent.getsockname()[1]}", "no answer in 0.5 s"),
            ):
                args = [*cli_build_args(corpus, out, "--engine", "ray"), "--address", address]
                result = CliRunner().invoke(cli, args)
                assert (result.exit_code, result.output) == (
                    2,
                    f"Error: --engine ray cannot connect to the Ray cluster at {address}: "
                    f"{reason}; start one (`ray start --head`) and give its address, or leave "
                    "--address out and RAY_ADDRESS unset for a local cluster\n",
                )
        finally:
            web.shutdown()
            web.server_close()
    assert not out.exists()


def test_auto_checks_the_ray_address_it_connects_to(tmp_path, corpus, monkeypatch):
    """``--address auto`` connects to ``RAY_ADDRESS`` when that is set: a port there that never
    answers is an ``Error:`` line naming it, as with no ``--address``."""
    import ray

    from slimdata.ingest import ray_engine

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **_: pytest.fail("ray.init was called"))
    monkeypatch.setattr(ray_engine, "CONNECT_SECONDS", 0.5)
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    out = tmp_path / "out"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        where = f"127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", where)
        for address in ((), ("--address", "auto")):
            args = [*cli_build_args(corpus, out, "--engine", "ray"), *address]
            result = CliRunner().invoke(cli, args)
            assert result.exit_code == 2, result.output
            assert result.output.startswith(
                f"Error: --engine ray cannot connect to the Ray cluster at {where}: no answer"
            )
    assert not out.exists()


def test_a_real_gcs_passes_the_address_check(ray_cluster):
    """The check above lets a running cluster's GCS through (it answers the HTTP/2 preface
    with a SETTINGS frame)."""
    from slimdata.ingest.ray_engine import _check_listening

    _check_listening(ray_cluster)  # raises ConfigError otherwise


def test_address_needs_the_ray_engine(tmp_path, corpus):
    result = CliRunner().invoke(cli, ["build", str(corpus), "-o", "x", "--address", "auto"])
    assert result.exit_code == 2 and "needs engine='ray'" in result.output


def test_engine_does_not_enter_the_plan():
    """A build started on one engine resumes on the other: the plan ignores the engine."""
    plain = tiny_config("corpus").output_dict()
    assert plain == tiny_config("corpus", engine="ray", ray_address="auto").output_dict()
    assert "engine" not in plain and "workers" not in plain


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_quiet_ray_build_prints_nothing(tmp_path, corpus):
    """`--engine ray --quiet` on a cluster the build starts itself: no line from Ray either
    (it printed its start-up INFO and WARNING notices); the output is the local engine's."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(
        cli_build_cmd(corpus, tmp_path / "ray", "--engine", "ray"),
        env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and run.stderr == ""
    local = subprocess.run(cli_build_cmd(corpus, tmp_path / "local"), capture_output=True)
    assert local.returncode == 0
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
