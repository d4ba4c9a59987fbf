"""Determinism (byte-identical builds, any worker count) and crash-resume (kill -9)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from build_helpers import (
    cli_build_cmd,
    make_text_corpus,
    read_shards,
    tiny_config,
    tree_bytes,
)

from slimdata.errors import ConfigError, SlimdataError
from slimdata.ingest import build


@pytest.fixture
def corpus(tmp_path):
    return make_text_corpus(tmp_path)


def config(corpus, **changes):
    return tiny_config(corpus, task_bytes=600, compression="zstd", hashes=("sha1",), **changes)


def test_two_builds_byte_identical(tmp_path, corpus):
    a = build(config(corpus), tmp_path / "a")
    build(config(corpus), tmp_path / "b")
    assert a.sidecar["counts"]["tasks"] >= 5  # several sub-directories merged
    first, second = tree_bytes(tmp_path / "a"), tree_bytes(tmp_path / "b")
    assert len(first) > 20 and first == second


def test_workers_do_not_change_bytes(tmp_path, corpus):
    one = build(config(corpus), tmp_path / "one")
    two = build(config(corpus, workers=2), tmp_path / "two")
    assert two.tasks_run == one.tasks_run >= 5
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")


def test_kill_9_then_resume_equals_uninterrupted(tmp_path, corpus):
    reference = tmp_path / "reference"
    build(config(corpus), reference)
    out = tmp_path / "crashed"
    cmd = cli_build_cmd(corpus, out, "--hashes", "sha1")
    env = {**os.environ, "SLIMDATA_FAULT_KILL": "3:1"}  # SIGKILL after 1 document of task 3
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert "task-00003.partial" in names and "task-00002" in names and "index.json" not in names
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert (
        refused.returncode != 0
        and "--resume" in refused.stderr
        and "Traceback" not in refused.stderr
    )
    summary = build(config(corpus), out, resume=True)
    assert (
        summary.tasks_resumed == 3 and summary.tasks_run == summary.sidecar["counts"]["tasks"] - 3
    )
    assert tree_bytes(out) == tree_bytes(reference)
    samples, _ = read_shards(out)
    assert len({s["doc_id"] for s in samples}) == len(samples) == 24


def test_dead_worker_is_reported_and_resumable(tmp_path, corpus, monkeypatch):
    reference = tmp_path / "reference"
    build(config(corpus), reference)
    out = tmp_path / "out"
    monkeypatch.setenv("SLIMDATA_FAULT_KILL", "2:1")
    with pytest.raises(SlimdataError, match="--resume"):
        build(config(corpus, workers=2), out)
    monkeypatch.delenv("SLIMDATA_FAULT_KILL")
    build(config(corpus, workers=2), out, resume=True)
    assert tree_bytes(out) == tree_bytes(reference)


def test_resume_refuses_an_input_edited_in_place(tmp_path, corpus, monkeypatch):
    """An input changed after the build started, even to the same size, would give a build
    mixed from old and new text: resume refuses it, naming the file, and writes nothing."""
    out = tmp_path / "out"
    monkeypatch.setenv("SLIMDATA_FAULT_KILL", "2:1")
    with pytest.raises(SlimdataError, match="--resume"):
        build(config(corpus, workers=2), out)
    monkeypatch.delenv("SLIMDATA_FAULT_KILL")
    edited = corpus / "doc005.txt"
    text = edited.read_text()
    assert "end 5" in text
    edited.write_text(text.replace("end 5", "END 5"))  # same size
    before = tree_bytes(out)
    with pytest.raises(ConfigError) as refused:
        build(config(corpus, workers=2), out, resume=True)
    assert str(refused.value) == (
        f"cannot resume {out}: input {edited.resolve()} changed since the interrupted build "
        "(size or modification time); use --overwrite to start over"
    )
    assert tree_bytes(out) == before


def test_resume_refuses_a_build_plan_of_the_first_format(tmp_path, corpus):
    """Format 1 recorded no input sizes and modification times: such a build cannot be
    checked, so it is not resumed."""
    out = tmp_path / "out"
    build(config(corpus), out)
    plan = json.loads((out / "build_plan.json").read_text())
    assert plan["slimdata_build_plan"] == 2 and len(plan["inputs"]) == 24
    del plan["inputs"]
    (out / "build_plan.json").write_text(json.dumps({**plan, "slimdata_build_plan": 1}))
    with pytest.raises(ConfigError) as refused:
        build(config(corpus), out, resume=True)
    assert str(refused.value) == (
        f"cannot resume {out}: its build_plan.json has format 1, not 2 (written by another "
        "slimdata version, which cannot tell whether the inputs changed); use --overwrite to "
        "start over"
    )
    (out / "build_plan.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"its build_plan\.json is unreadable"):
        build(config(corpus), out, resume=True)


def test_resume_of_finished_build_is_a_no_op_and_options_must_match(tmp_path, corpus):
    out = tmp_path / "out"
    build(config(corpus), out)
    before = tree_bytes(out)
    again = build(config(corpus), out, resume=True)
    assert again.tasks_run == 0 and tree_bytes(out) == before
    with pytest.raises(ConfigError, match="slice_tokens"):
        build(config(corpus).replace(slice_tokens=256), out, resume=True)
    with pytest.raises(ConfigError, match="exclude each other"):
        build(config(corpus), out, resume=True, overwrite=True)
