"""The fairness rule of ``compare_strategies``: every strategy respects the memory cap; a
baseline that does not fit runs static CP, slimpack runs cp=1 and must fit by itself."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner
from sim_helpers import LENGTHS, mib_cost

from slimdata.cli import cli
from slimdata.docsource import documents_from_lengths
from slimdata.sim import SimConfig
from slimdata.sim.compare import compare_strategies, cp_sizes, format_table
from slimdata.solver import Layout
from slimdata.solver.memory import device_peak_memory
from slimdata.units import GIB


def run(memory_gib: float, strategies=("concat", "bfd", "slimpack"), baseline_config="smallest"):
    lay = Layout(dp=4, context=1024, memory_gib=memory_gib)
    return compare_strategies(
        documents_from_lengths(LENGTHS),
        lay,
        mib_cost(),
        strategies=list(strategies),
        global_batch_tokens=4 * 1024,
        steps=2,
        baseline_config=baseline_config,
    )


def test_cp_sizes():
    assert cp_sizes(8) == [1, 2, 4, 8]
    assert cp_sizes(12) == [1, 2, 4]
    assert cp_sizes(1) == [1]


def test_baseline_over_the_cap_runs_the_smallest_cp_that_fits():
    # full rows need 1 GiB; 0.6 GiB fits half a row -> cp=2, re-planned for 4 / 2 = 2 groups
    cmp = run(0.6)
    concat = cmp.results["concat"]
    assert concat.cp == 2
    assert concat.plan_memory_gib == pytest.approx(0.5)  # the largest row, halved
    assert concat.peak_memory_gib == pytest.approx(0.5)  # simulated, what the fit test reads
    plan, r = cmp.first["concat"]
    assert plan.dp == 2 and r.cp == 2 and r.busy.shape == (1, 4)
    assert cmp.results["slimpack"].cp == 1  # DP-Merge, no static CP
    assert cmp.results["slimpack"].plan_memory_gib <= 0.6
    assert cmp.results["slimpack"].over_memory_steps == 0
    assert not any(r.error for r in cmp.results.values())
    table = format_table(cmp)
    assert "static context parallelism" in table
    d = cmp.to_dict()
    assert d["results"]["concat"]["cp"] == 2 and d["results"]["slimpack"]["cp"] == 1
    assert "memory_rule" in d["config"]


def test_plan_memory_is_the_largest_simulated_peak_of_the_configuration_run():
    # 4 pipeline stages of 1 layer each: a device holds a quarter of the layers' activations
    # of the packs in flight. plan_memory_gib is the largest per-device peak of any step under
    # the configuration run (the execution model's memory, which the simulation places in
    # time), peak_memory_gib its mean over the steps; it was one stage of the whole model
    # under DDP (bfd 0.99609375 GiB against a simulated 0.98876953125).
    cost = dataclasses.replace(mib_cost(), layers=4)
    lay = Layout(dp=2, pp=4, context=1024, memory_gib=2.0, mode="lockstep")
    cmp = compare_strategies(
        documents_from_lengths(LENGTHS),
        lay,
        cost,
        strategies=["bfd", "slimpack"],
        global_batch_tokens=2 * 4 * 1024,
        steps=2,
        baseline_config="cp=1",
    )
    for name, r in cmp.results.items():
        plan, first = cmp.first[name]
        model = device_peak_memory(plan, cost, SimConfig(schedule=r.schedule).execution(4))
        assert first.peak_memory_gib == model / GIB  # the simulation's peak is the model's
        assert r.plan_memory_gib == first.peak_memory_gib  # the first step holds the most
        assert r.peak_memory_gib < r.plan_memory_gib  # the mean over a lighter second step
        assert cmp.to_dict()["results"][name]["plan_memory_gib"] == r.plan_memory_gib


def test_roomy_cap_needs_no_cp():
    cmp = run(2.0)
    assert {k: r.cp for k, r in cmp.results.items()} == {"concat": 1, "bfd": 1, "slimpack": 1}


def test_nothing_fits_is_reported_not_hidden():
    # a 1 GiB row over 4 devices is 0.25 GiB > 0.2: even cp=4 (= dp) does not fit
    cmp = run(0.2, strategies=("concat",))
    r = cmp.results["concat"]
    assert r.cp == 0 and r.steps == 0
    assert "--memory-gib 0.2" in r.error and "static CP 4" in r.error
    assert "failed" in format_table(cmp)


def test_cli_reports_cp_per_strategy(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n * 40) for n in LENGTHS) + "\n")
    out = tmp_path / "r.json"
    args = ["simulate", "--lengths", str(lengths), "--model", "llama-1b", "--recompute", "full"]
    args += ["--context", "16384", "--dp", "4", "--global-batch-tokens", "65536"]
    args += ["--memory-gib", "1.25", "--strategies", "concat,slimpack", "--json", str(out)]
    args += ["--baseline-config", "smallest"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())["results"]
    # llama-1b full recompute: a 16K-token concat row holds 1.5 GiB > 1.25 GiB
    assert data["concat"]["cp"] == 2
    assert data["concat"]["peak_memory_gib"] <= 1.25
    assert data["slimpack"]["cp"] == 1
    assert res.output.splitlines()[1].split()[:2] == ["strategy", "cp"]
