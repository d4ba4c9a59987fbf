"""`slimdata plan` killed while it writes: what it leaves is replaced by --overwrite and
finished by --resume, byte for byte as an uninterrupted run; anything else is still refused.

What a kill can leave follows the write order (``write_plan_shards``): nothing while the
epoch is solved (the writer takes only an empty folder), then ``plan_request.json`` (through
its ``.tmp``), the shards (the last one cut short), ``index.json`` (cut short) and
``plan.json`` (through its ``.tmp``). Each state is made here from a finished run's files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slimdata.cli import cli

REQUEST, SHARD = "plan_request.json", "shard.00000.mds"
STATES = {  # name -> files left: whole ("all") or cut to their first half ("half")
    "request being written": {f"{REQUEST}.tmp": "half"},
    "request written": {REQUEST: "all"},
    "shard cut short": {REQUEST: "all", SHARD: "half"},
    "index cut short": {REQUEST: "all", SHARD: "all", "index.json": "half"},
    "plan.json being written": {
        REQUEST: "all",
        SHARD: "all",
        "index.json": "all",
        "plan.json.tmp": "half",
    },
}


def _args(tmp_path: Path) -> list[str]:
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in [300, 40, 2000, 128, 77, 900, 12, 256] * 6))
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "2"]
    return [*args, "--global-batch-tokens", "4096", "--memory-gib", "40", "--cp", "1"]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _finished(tmp_path: Path, args: list[str]) -> dict[str, bytes]:
    """The files of an uninterrupted run."""
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "whole")])
    assert res.exit_code == 0, res.output
    tree = _tree(tmp_path / "whole")
    assert sorted(tree) == ["index.json", "plan.json", REQUEST, SHARD]
    return tree


def _left(out: Path, whole: dict[str, bytes], state: str) -> None:
    """Make ``out`` hold what a kill in ``state`` leaves."""
    out.mkdir()
    for name, how in STATES[state].items():
        data = whole[name.removesuffix(".tmp")]
        (out / name).write_bytes(data if how == "all" else data[: len(data) // 2])


@pytest.mark.parametrize(
    ("state", "flag"),
    [
        (state, flag)
        for state in STATES
        for flag in ("--overwrite", "--resume")
        # no request to check: test_resume_needs_the_request_it_continues
        if (state, flag) != ("request being written", "--resume")
    ],
)
def test_what_a_kill_leaves_is_replaced_or_finished_byte_for_byte(tmp_path, state, flag):
    args = _args(tmp_path)
    whole = _finished(tmp_path, args)
    out = tmp_path / "killed"
    _left(out, whole, state)
    res = CliRunner().invoke(cli, [*args, "-o", str(out), flag])
    assert res.exit_code == 0, res.output
    assert _tree(out) == whole


@pytest.mark.parametrize("state", list(STATES))
def test_the_same_command_again_says_what_to_do(tmp_path, state):
    args = _args(tmp_path)
    out = tmp_path / "killed"
    _left(out, _finished(tmp_path, args), state)
    res = CliRunner().invoke(cli, [*args, "-o", str(out)])
    advice = (
        f"{out} exists and is not empty; pass --overwrite to replace it or choose a new output "
        "directory"
        if state == "request being written"
        else f"{out} holds the plan shards of an interrupted run (no plan.json); pass --resume "
        "to finish them or --overwrite to replace them"
    )
    assert (res.exit_code, res.output) == (2, f"Error: {advice}\n")
    assert sorted(p.name for p in out.iterdir()) == sorted(STATES[state])


def test_resume_needs_the_request_it_continues(tmp_path):
    """A run killed while it wrote its request (or plan shards of an earlier slimdata) has
    nothing --resume could check: it says to start over with --overwrite."""
    args = _args(tmp_path)
    out = tmp_path / "killed"
    _left(out, _finished(tmp_path, args), "request being written")
    res = CliRunner().invoke(cli, [*args, "-o", str(out), "--resume"])
    assert (res.exit_code, res.output) == (
        2,
        f"Error: cannot resume {out}: it holds no plan_request.json (plan shards of an earlier "
        "slimdata, or a run killed while it wrote that file); use --overwrite to start over\n",
    )
    assert [p.name for p in out.iterdir()] == [f"{REQUEST}.tmp"]


def test_resume_refuses_other_options(tmp_path):
    args = _args(tmp_path)
    out = tmp_path / "killed"
    _left(out, _finished(tmp_path, args), "shard cut short")
    res = CliRunner().invoke(cli, [*args, "-o", str(out), "--resume", "--seed", "1"])
    assert (res.exit_code, res.output) == (
        2,
        f"Error: cannot resume {out}: it was planned with different inputs or options "
        "(changed: options.seed); rerun with the original options, or use --overwrite to "
        "start over\n",
    )
    assert sorted(p.name for p in out.iterdir()) == [REQUEST, SHARD]
    res = CliRunner().invoke(cli, [*args, "-o", str(out), "--resume", "--overwrite"])
    assert (res.exit_code, res.output) == (
        2,
        "Error: --overwrite and --resume exclude each other: resume finishes an interrupted "
        "plan with the same options, overwrite replaces it\n",
    )


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_a_folder_without_a_plan_file_is_still_refused(tmp_path, flag):
    """Shards and an index.json alone (any MDS dataset) do not make plan shards: nothing in
    the folder is touched."""
    args = _args(tmp_path)
    whole = _finished(tmp_path, args)
    other = tmp_path / "other"
    other.mkdir()
    for name in ("index.json", SHARD):
        (other / name).write_bytes(whole[name])
    (other / "notes.txt").write_text("keep me")
    res = CliRunner().invoke(cli, [*args, "-o", str(other), flag])
    assert (res.exit_code, res.output) == (
        2,
        f"Error: refusing to {flag} {other}: it does not look like plan shards (no plan.json "
        "or plan_request.json); remove it yourself if you mean it\n",
    )
    assert _tree(other) == {
        "index.json": whole["index.json"],
        "notes.txt": b"keep me",
        SHARD: whole[SHARD],
    }


def test_a_run_killed_while_it_solved_leaves_an_empty_folder_any_rerun_takes(tmp_path):
    args = _args(tmp_path)
    whole = _finished(tmp_path, args)
    for name, flags in (("plain", []), ("resumed", ["--resume"])):
        (tmp_path / name).mkdir()
        res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / name), *flags])
        assert res.exit_code == 0, res.output
        assert _tree(tmp_path / name) == whole


def test_cp_auto_stops_at_an_error_raised_while_writing_shards(tmp_path, monkeypatch):
    # a size whose every step solved and that then fails while writing (the writer holds the
    # folder) is no matter of CP: --cp auto raises that error, it does not try the next size
    # in the folder the first one began (FileExistsError from the shard writer)
    import slimdata.autocp as autocp
    import slimdata.solver.epoch as epoch
    from slimdata.errors import PlanError

    real, sizes = epoch.write_epoch_plan, []

    def failing_once(docs, out, *, cp, opened=None, **kw):
        sizes.append(cp)
        if len(sizes) == 1:
            opened()
            (Path(out) / SHARD).write_bytes(b"partial")
            raise PlanError("document doc_id 3 has no sample index")
        return real(docs, out, cp=cp, opened=opened, **kw)

    monkeypatch.setattr(epoch, "write_epoch_plan", failing_once)
    monkeypatch.setattr(autocp, "cp_preference", lambda *a, **k: autocp.CpChoice([1, 2], "test"))
    args = _args(tmp_path)
    args[args.index("--cp") + 1] = "auto"
    args[args.index("--ranks-per-node") + 1] = "4"
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "p")])
    assert res.exit_code == 2, res.output
    assert "Error: document doc_id 3 has no sample index" in res.output
    assert len(sizes) == 1
    assert not (tmp_path / "p").exists()  # nothing half-written is left
