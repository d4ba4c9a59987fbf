"""Callbacks, the profiler's fit and CLI, error cases."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hooks_helpers import VOCAB, TinyLM, doc_tokens, make_plan, tiny_forward, tiny_llama
from slimdata.hooks import BalanceMeter, Callback, PackTimeRecorder, make_payload, run_step
from slimdata.hooks.profile import (
    calibrate,
    fit_terms,
    graph_free_scale,
    profile_plan,
    round_robin,
)

from slimdata.cost import CostModel, causal_pairs
from slimdata.errors import ConfigError, PlanError
from slimdata.plan import execution

pytestmark = pytest.mark.timeout(120)
FWD = [[(0, 0, 6)], [(0, 6, 10), (1, 0, 4)]]
BWD = [[(1, 0, 4), (0, 6, 10)], [(0, 0, 6)]]


def test_callbacks_fire_in_order_and_record_pack_times(tmp_path):
    calls = []

    class Spy(Callback):
        def on_step_start(self, plan, rank):
            calls.append(("start", plan.step, rank))

        def on_pack_end(self, event):
            calls.append((event.pass_, event.pack, event.tokens))

        def on_step_end(self, summary):
            calls.append(("end", summary.tokens))

    plan = make_plan([10, 4], [(FWD, BWD)], step=3)
    rec, meter = PackTimeRecorder(tmp_path / "t.jsonl"), BalanceMeter()
    summary = run_step(
        TinyLM(),
        make_payload(plan, 0, doc_tokens([10, 4])),
        forward=tiny_forward,
        callbacks=[Spy(), rec, meter],
    )
    rec.close()
    assert calls == [
        ("start", 3, 0),
        ("F", 0, 6),
        ("F", 1, 8),
        ("B", 0, 8),
        ("B", 1, 6),
        ("end", 14),
    ]
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rank"], r["pass"], r["pack"], r["tokens"]) for r in lines] == [
        (3, 0, "F", 0, 6),
        (3, 0, "F", 1, 8),
        (3, 0, "B", 0, 8),
        (3, 0, "B", 1, 6),
    ]
    assert all(r["seconds"] > 0 for r in lines)
    h = meter.history[-1]
    assert h["tokens"] == 14 and h["imbalance"] == 1.0 and h["tokens_per_s"] > 0
    assert summary.busy_seconds == pytest.approx(sum(r["seconds"] for r in lines))


def test_fit_terms_recovers_exact_coefficients():
    s = np.array([32, 64, 128, 256, 32, 64, 128, 256])
    start = np.array([0, 0, 0, 0, 512, 512, 512, 512])
    pairs = causal_pairs(start, start + s)
    t = 2e-6 * s + 3e-9 * pairs + 1e-3
    lin, att, const = fit_terms(s, pairs, t)
    assert (lin, att, const) == pytest.approx((2e-6, 3e-9, 1e-3), rel=1e-9)
    # a term that would come out negative is dropped, the rest refitted
    lin, att, const = fit_terms(s, pairs, 5e-6 * s + 1e-3)
    assert att == 0.0 and lin == pytest.approx(5e-6) and const == pytest.approx(1e-3)
    # per-slice and per-pack constants are told apart by packs of several slices
    k = np.array([1, 1, 4, 4, 1, 1, 4, 4])
    t = 2e-6 * k * s + 3e-9 * k * pairs + 1e-4 * k + 2e-3
    assert fit_terms(k * s, k * pairs, t, k) == pytest.approx((2e-6, 3e-9, 1e-4, 2e-3), rel=1e-9)


def test_round_robin_goes_round_all_jobs_and_drops_the_warm_up_round():
    calls = []

    def job(name):
        def run():
            calls.append(name)
            return f"{name}{sum(c == name for c in calls)}"

        return run

    out = round_robin([job("a"), job("b"), job("c")], repeats=2)
    assert calls == ["a", "b", "c"] * 3  # warm-up round, then two timed rounds
    assert out == [["a2", "a3"], ["b2", "b3"], ["c2", "c3"]]
    assert round_robin([], repeats=3) == []
    assert round_robin([job("d")], repeats=1, progress=True) == [["d2"]]


def test_profile_command_writes_a_loadable_cost_profile(tmp_path):
    from slimdata.cli import cli

    cfg = tmp_path / "m.json"
    cfg.write_text(
        json.dumps(
            {
                "name": "t",
                "layers": 1,
                "hidden": 32,
                "heads": 4,
                "kv_heads": 2,
                "ffn": 48,
                "vocab": 64,
                "dtype_bytes": 4,
            }
        )
    )
    out = tmp_path / "p.json"
    res = CliRunner().invoke(
        cli,
        [
            "profile",
            "--model",
            str(cfg),
            "-o",
            str(out),
            "--slice-tokens",
            "16,48",
            "--prefixes",
            "0,32",
            "--pack-sizes",
            "1,2",
            "--repeats",
            "1",
            "--measurements",
            str(tmp_path / "raw.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    # the progress bar of the timed runs is drawn on a terminal only (not this log)
    assert "profile: 100%" not in res.output and "\r" not in res.output
    cm = CostModel.load(out)
    assert cm.source == "profile:cpu" and cm.layers == 1
    # a non-degenerate fit; which coefficients stay positive depends on timing noise (one
    # repeat on a loaded machine can push everything into the per-pack constant)
    fwd = cm.fwd_lin + cm.fwd_att + cm.fwd_const + cm.fwd_pack_const
    assert fwd > 0 and cm.bwd_lin + cm.bwd_att + cm.bwd_const + cm.bwd_pack_const > 0
    doc = json.loads((tmp_path / "raw.json").read_text())
    raw = doc["points"]
    assert doc["calibration"]["plans"] == 3
    assert doc["calibration"]["forward_scale"] > 0 and doc["calibration"]["backward_scale"] > 0
    assert len(raw) == 8
    assert [("fwd_graph_free" in r) for r in raw] == [False] * 4 + [True] * 4  # k = 1, 2
    assert cm.graph_free_scale == graph_free_scale(raw) > 0


def test_profile_plans_time_a_pack_after_identical_ones():
    # s=2 after a 4-token prefix, 2 docs per pack, one lead copy: the copy (docs 0, 1) runs
    # first, the measured pack [4,6) of docs 2, 3 is forward pack 3 and backward pack 2
    plan, pick = profile_plan(4, 2, k=2, lead=1)
    rs = plan.ranks[0]
    assert pick == (3, 2)
    assert [s.doc for s in rs.forward[pick[0]].slices] == [2, 3]
    assert rs.forward[pick[0]].slices == rs.backward[pick[1]].slices
    assert rs.order[:4] == (("F", 0), ("F", 1), ("B", 0), ("B", 1))
    (ex,) = execution(plan)
    assert not ex.graph_free and not ex.recomputed
    # graph-free variant: each [4,6) pack's backward is split, so its forward runs without
    # a graph and both halves recompute; the prefix packs keep theirs
    plan, pick = profile_plan(4, 2, k=2, lead=1, graph=False)
    assert pick[0] == 3
    (ex,) = execution(plan)
    assert (ex.graph_free, ex.recomputed) == ({1, 3}, {0, 1, 3, 4})
    with pytest.raises(ValueError, match="at least 2 slices"):
        profile_plan(0, 4, k=1, graph=False)


def test_calibration_scales_by_the_median_in_plan_ratio():
    from slimdata.execution import pack_times

    cm = CostModel.analytic("llama-1b", "h100", "none")
    lengths = [40, 24, 8]
    fwd = [[(0, 0, 16), (2, 0, 8)], [(0, 16, 40)], [(1, 0, 24)]]
    bwd = [[(1, 0, 24)], [(0, 16, 40)], [(2, 0, 8), (0, 0, 16)]]
    plan = make_plan(lengths, [(fwd, bwd)])
    pt = pack_times(plan, cm, split=True)
    # measured = 2x (forward) and 3x (backward) the prediction, one forward pack an outlier
    run = {("F", i): 2 * pt.forward_of(0, i) for i in range(3)}
    run[("F", 2)] *= 1.5
    run.update({("B", j): 3 * pt.backward_of(0, j) for j in range(3)})
    scaled, f, b = calibrate(cm, [plan], [[run, run]])
    assert (f, b) == pytest.approx((2.0, 3.0))
    assert scaled.fwd_lin == pytest.approx(2 * cm.fwd_lin)
    assert scaled.bwd_att == pytest.approx(3 * cm.bwd_att)
    assert scaled.act_bytes_per_token == cm.act_bytes_per_token  # memory is not timed
    again = pack_times(plan, scaled, split=True)
    assert again.backward_of(0, 1) == pytest.approx(run[("B", 1)])
    assert calibrate(cm, [], []) == (cm, 1.0, 1.0)


def test_graph_free_scale_is_the_median_ratio():
    rows = [
        {"fwd": 2.0, "fwd_graph_free": 1.0},
        {"fwd": 4.0, "fwd_graph_free": 3.0},
        {"fwd": 1.0, "fwd_graph_free": 0.9},
        {"fwd": 1.0},
    ]
    assert graph_free_scale(rows) == 0.75
    assert graph_free_scale(rows[3:]) == 1.0


def test_payload_with_wrong_token_count_is_rejected():
    plan = make_plan([10, 4], [(FWD, BWD)])
    with pytest.raises(PlanError, match="payload has 13 tokens, plan needs 14"):
        make_payload(plan, 0, [np.zeros(10, np.uint32), np.zeros(3, np.uint32)])


def test_payload_without_tokens_says_where_tokens_come_from():
    # plan shards of `slimdata plan --lengths` carry plans only (no tokens)
    from slimdata.hooks.payload import StepPayload

    plan = make_plan([10, 4], [(FWD, BWD)])
    with pytest.raises(PlanError) as info:
        StepPayload(plan=plan, rank=0, tokens=np.zeros(0, np.uint32))
    assert str(info.value) == (
        "step 0 rank 0: payload has 0 tokens, plan needs 14: plan shards of `slimdata plan "
        "--lengths` carry no tokens; to train, plan from the build's shards (`slimdata plan "
        "SHARDS`) or use a DocumentLoader"
    )


def test_unknown_backend_names_the_choices():
    plan = make_plan([10, 4], [(FWD, BWD)])
    with pytest.raises(ValueError, match="use one of"):
        run_step(
            TinyLM(),
            make_payload(plan, 0, doc_tokens([10, 4])),
            forward=tiny_forward,
            backend="nope",
        )


def test_tokens_outside_the_models_vocabulary_are_one_clear_error():
    # tokens of another build's tokenizer: id 61 on a model of 61 embeddings (VOCAB)
    from slimdata.hooks import hf

    model = tiny_llama(hf.register())
    plan = make_plan([10, 4], [(FWD, BWD)], step=3)
    tokens = doc_tokens([10, 4])
    tokens[1][2] = VOCAB
    with pytest.raises(ConfigError) as info:
        run_step(model, make_payload(plan, 0, tokens))
    assert str(info.value) == (
        "step 3 rank 0: token id 61 is outside the model's vocabulary of 61 input "
        "embeddings: the tokens come from a tokenizer with more ids (plan shards or shards of "
        "another build?); build the model with the vocabulary of the build that wrote them "
        "(tokenizer.vocab_size in its slimdata.json)"
    )
    assert all(p.grad is None for p in model.parameters())  # refused before any pack
    tokens[1][2] = VOCAB - 1  # the largest id the model has runs
    assert run_step(model, make_payload(plan, 0, tokens)).loss > 0


def test_auto_backend_is_sdpa_on_cpu_and_unknown_names_list_auto():
    from slimdata.hooks.attention import get_backend, resolve_backend

    assert resolve_backend("auto", "cpu", torch.bfloat16) == "sdpa"
    assert resolve_backend("auto", "cpu", torch.float32) == "sdpa"
    assert resolve_backend("sdpa", "cuda", torch.bfloat16) == "sdpa"
    with pytest.raises(ValueError, match="'auto'"):
        get_backend("nope")


def test_profile_grid_cap_skips_points_that_hold_too_many_tokens():
    from slimdata.hooks.profile import ProfileConfig, profile_points

    cfg = ProfileConfig(
        slice_tokens=(4096, 8192), prefixes=(0, 6144), pack_sizes=(1, 2), max_point_tokens=16384
    )
    # k * (prefix + s): 4096, 10240, 8192, 14336 (k=1); 8192, 20480, 16384, 28672 (k=2)
    assert profile_points(cfg) == [
        (4096, 0, 1),
        (4096, 6144, 1),
        (8192, 0, 1),
        (8192, 6144, 1),
        (4096, 0, 2),
        (8192, 0, 2),
    ]
    assert len(profile_points(ProfileConfig(slice_tokens=(4096, 8192), prefixes=(0, 6144)))) == 8


def test_profile_rejects_bad_grids_without_a_traceback(tmp_path):
    from slimdata.cli import cli

    for args in (["--repeats", "0"], ["--slice-tokens", "512", "--max-point-tokens", "100"]):
        res = CliRunner().invoke(
            cli, ["profile", "--model", "llama-1b", "-o", str(tmp_path / "p.json"), *args]
        )
        assert res.exit_code == 2, res.output
        assert "Error: bad profile grid" in res.output and "Traceback" not in res.output


def test_measured_activation_bytes_predict_an_unseen_pack():
    from hooks_helpers import tiny_llama
    from slimdata.hooks import hf
    from slimdata.hooks.memory import SavedTensorMeter
    from slimdata.hooks.profile import measure_activation_bytes, point_payload

    from slimdata.cost import CostModel, ModelConfig

    model = tiny_llama(hf.register())
    cost = CostModel.analytic(ModelConfig.from_hf(model), "h100", "none")
    act = measure_activation_bytes(model, cost, [(64, 1), (96, 2)])
    assert act > 0
    # a pack the fit never saw: 3 documents of 80 tokens
    payload, _ = point_payload(model, (80, 0, 3), np.random.default_rng(5))
    meter = SavedTensorMeter(model.parameters())
    held = []

    class After(Callback):
        def on_pack_end(self, event):
            if event.pass_ == "F":
                held.append(meter.live)

    with meter.watch():
        run_step(model, payload, callbacks=[After()])
    predicted = (act + cost.kv_bytes_per_token) * 240  # the memory trace after that pack
    assert abs(predicted - held[0]) / held[0] < 0.05


@pytest.mark.parametrize(
    ("forward", "backward", "warned"),
    [(1.0, 1.0, False), (0.8, 1.25, False), (6.946, 1.1, True), (1.0, 0.79, True)],
)
def test_a_calibration_far_from_the_fit_is_a_warning(forward, backward, warned):
    """On an idle machine the calibration scales came out 0.96-1.06; a profile on a busy CPU
    printed x6.946 and no word of doubt."""
    from slimdata.hooks.profile import calibration_warning

    got = calibration_warning(forward, backward)
    assert (got is not None) == warned
    if warned:
        assert got.startswith(
            f"the calibration plans ran x{forward:.2f} (forward) and x{backward:.2f} (backward) "
            "the grid's fit, outside 0.8-1.25: "
        )


def test_profile_progress_bar_on_a_terminal_only(monkeypatch):
    import io
    import sys

    from slimdata.hooks.profile import round_robin

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for terminal, want in ((True, True), (False, False)):
        err = Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert round_robin([lambda: 1, lambda: 2], 2, progress=True) == [[1, 1], [2, 2]]
        assert ("profile: 100%" in err.getvalue()) == want
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    round_robin([lambda: 1], 1, progress=False)  # --quiet
    assert err.getvalue() == ""
