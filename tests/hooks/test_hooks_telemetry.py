"""StepTelemetry: the per-step record from every rank's numbers, the progress line, the log
and its plots."""

from __future__ import annotations

import io
import json

from slimdata.hooks import StepSummary, StepTelemetry
from slimdata.hooks.telemetry import _record

from slimdata.plots import write_training_plots


def test_record_by_hand():
    # (loss share, tokens, seconds, busy, predicted, peak bytes) of two ranks
    r = _record(3, [(1.5, 100, 2.0, 1.0, 0.5, 10), (0.5, 60, 4.0, 3.0, 0.7, 20)])
    assert r["step"] == 3 and r["loss"] == 2.0 and r["tokens"] == 160
    assert r["seconds"] == 4.0 and r["tokens_per_s"] == 40.0
    assert r["predicted"] == [0.5, 0.7] and r["measured"] == [1.0, 3.0]
    assert r["imbalance"] == 1.5  # 3 * 2 / 4
    assert r["wait_share"] == 1 - 4 / 6
    assert r["peak_mem_bytes"] == [10, 20]


def test_single_process_log_progress_and_plots(tmp_path):

    log, out = tmp_path / "t.jsonl", io.StringIO()
    tel = StepTelemetry(log=log, progress=out)
    for step, loss in enumerate([3.0, 2.5]):
        tel._predicted = 0.25
        tel.on_step_end(StepSummary(step, 0, loss, 64, 0.5, 0.4))
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["loss"] for r in rows] == [3.0, 2.5] and rows[1]["tokens_per_s"] == 128.0
    assert out.getvalue().startswith("step     0  loss 3.0000  128 tok/s")
    paths = write_training_plots({"a": log}, tmp_path / "plots")
    assert [p.name for p in paths] == ["loss.png", "step_time.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert tel.history == rows
    assert rows[0]["peak_mem_bytes"][0] > 0


def test_plots_of_a_killed_run_and_refusals_of_damaged_logs(tmp_path):
    import pytest

    from slimdata.errors import InputError

    good = {"step": 0, "loss": 3.0, "predicted": [0.5], "measured": [0.6]}
    log = tmp_path / "killed.jsonl"
    log.write_text(json.dumps(good) + "\n" + json.dumps({**good, "step": 1})[:20])
    paths = write_training_plots({"a": log}, tmp_path / "plots")  # the cut record left out
    assert [p.name for p in paths] == ["loss.png", "step_time.png"]
    with pytest.raises(InputError, match=r"missing\.jsonl: cannot read the log"):
        write_training_plots({"a": tmp_path / "missing.jsonl"}, tmp_path / "plots")
    middle = tmp_path / "middle.jsonl"
    middle.write_text("{not json\n" + json.dumps(good) + "\n")
    with pytest.raises(InputError, match=r"middle\.jsonl:1: not a JSON record"):
        write_training_plots({"a": middle}, tmp_path / "plots")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"step": 0}) + "\n")
    with pytest.raises(InputError, match=r"other\.jsonl:1: not a step record of StepTelemetry"):
        write_training_plots({"a": other}, tmp_path / "plots")


def test_predicted_times_are_the_execution_models_price():
    # a 256-token document of slices [0, 128) [128, 256), one forward pack and one backward
    # pack per slice, 1 s a token forward, 2 s backward, 5 s / 7 s a model call: the
    # executor splits the forward pack into one call per backward pack (2 calls: 256 + 10 s)
    # and runs each backward pack as one call (256 + 7 s); predicted as it runs
    from hooks_helpers import TinyLM, doc_tokens, tiny_forward
    from slimdata.hooks import make_payload, run_step
    from toy_costs import call_priced_cost

    from slimdata.docsource import documents_from_lengths
    from slimdata.solver import Layout
    from slimdata.solver.common import BatchView, assemble_plan

    cost = call_priced_cost()
    view = BatchView.build(documents_from_lengths([256], 128), cost)
    plan = assemble_plan(
        view=view,
        layout=Layout(dp=1, context=1024),
        cost=cost,
        strategy="hand",
        step=0,
        forward=[[[0, 1]]],
        backward=[[[1], [0]]],
    )
    tel = StepTelemetry(progress=None)
    summary = run_step(
        TinyLM(), make_payload(plan, 0, doc_tokens([256])), forward=tiny_forward, callbacks=[tel]
    )
    assert [(e.pass_, e.calls, e.predicted) for e in summary.events] == [
        ("F", 2, 266.0),
        ("B", 1, 263.0),
        ("B", 1, 263.0),
    ]
    assert tel.history[0]["predicted"] == [792.0]
