"""`slimdata simulate` end to end on a tiny lengths file, the Gantt chart, and the fidelity hook."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from sim_helpers import linear_cost, merge_plan, whole_doc_plan

from slimdata.cli import cli
from slimdata.errors import InputError
from slimdata.execution import build_programs
from slimdata.sim import SimConfig, simulate_step
from slimdata.sim.fidelity import fidelity_report, load_measured_times
from slimdata.sim.gantt import draw_gantt
from slimdata.solver.layout import Layout

LENGTHS = [300, 4000, 120, 2500, 7000, 800, 60, 3100, 5000, 900, 1500, 6400, 200, 2200, 3300, 450]


@pytest.fixture
def lengths_file(tmp_path):
    p = tmp_path / "lengths.txt"
    p.write_text("\n".join(map(str, LENGTHS)) + "\n")
    return p


def test_cli_table_json_gantt(lengths_file, tmp_path):
    out_json, out_png = tmp_path / "r.json", tmp_path / "g.png"
    args = [
        "simulate",
        "--lengths",
        str(lengths_file),
        "--model",
        "llama-1b",
        "--context",
        "8192",
        "--dp",
        "4",
        "--global-batch-tokens",
        "16384",
        "--memory-gib",
        "200",
        "--steps",
        "2",
        "--strategies",
        "concat,bfd,slimpack",
        "--json",
        str(out_json),
        "--gantt",
        str(out_png),
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "slimpack" in res.output and "vs concat" in res.output
    data = json.loads(out_json.read_text())
    assert data["config"]["dp"] == 4 and data["config"]["steps"] == 2
    assert set(data["results"]) == {"concat", "bfd", "slimpack"}
    for r in data["results"].values():
        assert r["steps"] == 2
        assert 0 < r["lower_bound"] <= r["step_time"]
        assert r["imbalance"] >= 1.0
        assert 0 <= r["bubble"] < 1
        assert r["peak_memory_gib"] > 0 and r["solve_ms"] >= 0
    assert data["results"]["concat"]["speedup_vs_concat"] == 1.0
    assert out_png.stat().st_size > 5000
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_asymmetric_split_beats_recompute(lengths_file, tmp_path):
    # lockstep (pp 2) slimpack plans for 1F1B balance backward packs apart from forward packs,
    # so some backward packs are no unions: recomputing them costs more than splitting the
    # forwards. The schedule is pinned: slimpack's plan for the interleaved schedule (which the
    # search of --baseline-config best also tries) has only unions here, so there the two tie
    times = {}
    for mode in ("split", "recompute"):
        out = tmp_path / f"{mode}.json"
        args = ["simulate", "--lengths", str(lengths_file), "--model", "llama-1b"]
        args += ["--context", "8192", "--dp", "2", "--pp", "2", "--memory-gib", "200"]
        args += ["--global-batch-tokens", "65536", "--schedule", "1f1b", "--baseline-config"]
        args += ["cp=1", "--strategies", "slimpack", "--asymmetric", mode, "--json", str(out)]
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        result = json.loads(out.read_text())["results"]["slimpack"]
        assert result["config"]["schedule"] == "1f1b"
        times[mode] = result["step_time"]
    assert times["split"] < times["recompute"]
    res = CliRunner().invoke(cli, ["simulate", "--lengths", str(lengths_file), "--asymmetric", "x"])
    assert res.exit_code != 0 and "asymmetric" in res.output


def test_cli_needs_exactly_one_input(lengths_file):
    res = CliRunner().invoke(cli, ["simulate"])
    assert res.exit_code != 0 and "exactly one of SHARDS" in res.output
    res = CliRunner().invoke(
        cli, ["simulate", "--lengths", str(lengths_file), "--strategies", "nope"]
    )
    assert res.exit_code != 0 and "unknown ['nope']" in res.output


def test_gantt_pipeline(tmp_path):
    plan = whole_doc_plan([[[2], [2]], [[1], [3]]], mode="lockstep")
    r = simulate_step(plan, linear_cost(layers=2), Layout(dp=2, pp=2, context=128))
    out = draw_gantt({"a": r, "b": r}, tmp_path / "p.png", title="t")
    assert out.stat().st_size > 5000


def test_gantt_of_eight_strategies_keeps_every_text_off_the_others(tmp_path, monkeypatch):
    """The figure title, the legend and the eight panel titles overlap neither each other nor
    a panel (the legend used to sit on the first panel's bars, the title on its title)."""
    from matplotlib.figure import Figure

    drawn = []
    save = Figure.savefig

    def saved(fig, *args, **kwargs):  # the figure as written, with the renderer that drew it
        save(fig, *args, **kwargs)
        drawn.append((fig, fig.canvas.get_renderer()))

    monkeypatch.setattr(Figure, "savefig", saved)
    plan = whole_doc_plan([[[2], [2]], [[1], [3]]], mode="lockstep")
    r = simulate_step(plan, linear_cost(layers=2), Layout(dp=2, pp=2, context=128))
    names = ["concat", "bfd", "multipack", "wlb", "wlb-ideal", "sorted", "dcp", "slimpack"]
    draw_gantt(dict.fromkeys(names, r), tmp_path / "g.png", title="dp=2 pp=2 context=128")
    ((fig, renderer),) = drawn
    texts = [fig.get_suptitle(), *(ax.get_title() for ax in fig.axes)]
    assert texts[1].startswith("concat: step") and len(texts) == 9  # not vacuous
    (legend,) = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    boxes = [fig._suptitle, *(ax.title for ax in fig.axes), legend]
    boxes = [b.get_window_extent(renderer) for b in boxes]
    panels = [ax.get_window_extent(renderer) for ax in fig.axes]
    for i, a in enumerate(boxes):
        assert not any(a.overlaps(b) for b in boxes[i + 1 :]), i
        assert not any(a.overlaps(p) for p in panels), i


def _records(tmp_path, rows, jsonl=True):
    p = tmp_path / ("m.jsonl" if jsonl else "m.json")
    p.write_text("\n".join(json.dumps(r) for r in rows) if jsonl else json.dumps(rows))
    return p


def test_fidelity_exact_model_has_zero_error(tmp_path):
    # rank 0: pack of 3 tokens (F 3, B 6); rank 1: 5 tokens (F 5, B 10); the model is exact
    plan = whole_doc_plan([[[3]], [[5]]])
    rows = [
        {"step": 0, "rank": 0, "pass": "F", "pack": 0, "seconds": 3.0},
        {"step": 0, "rank": 0, "pass": "B", "pack": 0, "seconds": 6.0},
        {"step": 0, "rank": 1, "pass": "F", "pack": 0, "seconds": 5.0},
        {"step": 0, "rank": 1, "pass": "B", "pack": 0, "seconds": 10.0},
        {"step": 0, "pass": "step", "seconds": 15.0},
    ]
    for jsonl in (True, False):
        measured = load_measured_times(_records(tmp_path, rows, jsonl))
        rep = fidelity_report([plan], linear_cost(), Layout(dp=2, context=128), measured)
        assert rep.packs == 4
        assert rep.pack_mape == 0.0
        assert rep.step_error == 0.0
        assert rep.steps[0]["replayed"] == 15.0


def test_fidelity_predicts_the_execution_models_compute_seconds(tmp_path):
    # a 6-token document merged over DP ranks 0 ([0, 3)) and 1 ([3, 6)), static CP 2: each
    # 3-token slice is padded to 4 (chunks of 1 token), so a process computes half of 4
    # tokens' linear time and half of the padded slice's causal pairs ([0, 4): 10 pairs,
    # [3, 7): 22). F (1 s/token, 1 s/pair): rank 0 4 / 2 + 10 / 2 = 7 s, rank 1 2 + 11 = 13 s;
    # B (2 s/token, 2 s/pair): 4 + 10 = 14 s, 4 + 22 = 26 s. Measured exactly that, the
    # predictions are exact: the fidelity hook predicts what the simulator's tasks take, the
    # execution model's Compute.seconds (it predicted the unsplit packs: 9, 18, 18, 36 s)
    plan = merge_plan(length=6, cut=3)
    cost = linear_cost(att_f=1.0, att_b=2.0)
    config = SimConfig(cp=2)
    computes = {
        (prog.rank, op.pass_, op.pack): op.seconds
        for prog in build_programs(plan, cost, config.execution(1))
        for op in prog.computes()
    }
    assert computes == {(0, "F", 0): 7.0, (1, "F", 0): 13.0, (0, "B", 0): 14.0, (1, "B", 0): 26.0}
    rows = [
        {"step": 0, "rank": r, "pass": kind, "pack": i, "seconds": sec}
        for (r, kind, i), sec in computes.items()
    ]
    measured = load_measured_times(_records(tmp_path, rows))
    rep = fidelity_report([plan], cost, Layout(dp=4, context=128), measured, config)
    assert rep.packs == 4
    assert rep.pack_mape == 0.0
    assert rep.steps[0]["replayed"] == rep.steps[0]["simulated"]


def test_fidelity_reports_errors(tmp_path):
    # measured backward of rank 1 is 20 s, not 10: pack errors 0,0,0,0.5 -> MAPE 0.125;
    # the replay takes 25 s; measured wall 25 s -> step error |15 - 25| / 25 = 0.4
    plan = whole_doc_plan([[[3]], [[5]]])
    rows = [
        {"step": 0, "rank": 0, "pass": "F", "pack": 0, "seconds": 3.0},
        {"step": 0, "rank": 0, "pass": "B", "pack": 0, "seconds": 6.0},
        {"step": 0, "rank": 1, "pass": "F", "pack": 0, "seconds": 5.0},
        {"step": 0, "rank": 1, "pass": "B", "pack": 0, "seconds": 20.0},
        {"step": 0, "rank": 0, "pass": "step", "seconds": 25.0},
    ]
    rep = fidelity_report(
        {0: plan},
        linear_cost(),
        Layout(dp=2, context=128),
        load_measured_times(_records(tmp_path, rows)),
    )
    assert rep.pack_mape == pytest.approx(0.125)
    assert rep.steps[0]["replayed"] == 25.0
    assert rep.step_error == pytest.approx(0.4)
    rows.pop()  # without a wall time the replay is the reference
    rep = fidelity_report(
        {0: plan},
        linear_cost(),
        Layout(dp=2, context=128),
        load_measured_times(_records(tmp_path, rows)),
    )
    assert rep.step_error == pytest.approx(0.4)
    assert not math.isnan(rep.to_dict()["step_error"])


def test_fidelity_rejects_bad_records(tmp_path):
    with pytest.raises(InputError, match="record 1"):
        load_measured_times(
            _records(tmp_path, [{"step": 0, "rank": 0, "pass": "X", "pack": 0, "seconds": 1}])
        )
    plan = whole_doc_plan([[[3]]])
    bad = load_measured_times(
        _records(tmp_path, [{"step": 0, "rank": 0, "pass": "F", "pack": 5, "seconds": 1}])
    )
    with pytest.raises(InputError, match="does not have"):
        fidelity_report([plan], linear_cost(), Layout(dp=1, context=128), bad)
