"""Defaults a first run survives: memory budget from model states, recompute, warnings."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.cost import CostModel
from slimdata.cost.states import activation_budget_gib, auto_recompute, model_state_gib
from slimdata.docsource import documents_from_lengths
from slimdata.errors import ConfigError
from slimdata.sim.compare import compare_strategies
from slimdata.solver import Layout

GIB = float(1 << 30)


def test_model_states_per_parallelism():
    # 1e9 parameters, Adam: 2 + 2 + 12 bytes each
    assert model_state_gib(10**9, "ddp", "adam", dp=4, pp=1) == pytest.approx(16e9 / GIB)
    assert model_state_gib(10**9, "zero1", "adam", dp=4, pp=1) == pytest.approx(7e9 / GIB)
    assert model_state_gib(10**9, "fsdp", "adam", dp=4, pp=2) == pytest.approx(2e9 / GIB)
    assert model_state_gib(10**9, "ddp", "sgd", dp=4, pp=1) == pytest.approx(12e9 / GIB)


def test_model_states_are_the_first_pipeline_stages_share():
    # 32 layers over 6 stages split 6 6 5 5 5 5: the first stage holds 6 / 32 of the
    # parameters, not 1 / 6; 3.2e9 parameters, Adam, ddp: 16 bytes each
    assert model_state_gib(32 * 10**8, "ddp", "adam", dp=1, pp=6, layers=32) == pytest.approx(
        16 * 6e8 / GIB
    )
    assert model_state_gib(32 * 10**8, "ddp", "adam", dp=1, pp=4, layers=32) == pytest.approx(
        16 * 8e8 / GIB
    )
    budget, _how = activation_budget_gib(80.0, 32 * 10**8, "ddp", "adam", dp=1, pp=6, layers=32)
    assert budget == pytest.approx(72.0 - 16 * 6e8 / GIB)


def test_budget_is_device_minus_states_or_a_clear_error():
    budget, how = activation_budget_gib(80.0, 10**9, "ddp", "adam", dp=4, pp=1)
    assert budget == pytest.approx(72.0 - 16e9 / GIB)
    assert "ddp" in how and "80 GiB" in how
    with pytest.raises(ConfigError, match="zero1 or fsdp"):
        activation_budget_gib(80.0, 8 * 10**9, "ddp", "adam", dp=64, pp=1)  # 119 GiB


def test_auto_recompute_follows_the_context():
    assert auto_recompute("auto", 131072) == "full"
    assert auto_recompute("auto", 8192) == "selective"
    assert auto_recompute("none", 131072) == "none"


def test_simulate_defaults_derive_the_memory_budget(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(300 + 37 * i % 900) for i in range(200)) + "\n")
    out = tmp_path / "r.json"
    args = ["simulate", "--lengths", str(lengths), "--model", "llama-1b", "--context", "4096"]
    args += ["--dp", "4", "--pp", "2", "--strategies", "bfd,slimpack", "--json", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    cfg = json.loads(out.read_text())["config"]
    # llama-1b under zero1 over 4 devices, 2 stages, on an 80 GiB H100
    assert 0 < cfg["memory_gib"] < 72.0 and "zero1" in cfg["memory_budget"]
    assert cfg["recompute"] == "selective"  # 4K context
    assert cfg["global_batch_tokens"] == 4 * 4096 * 2 * 2  # 2 pp micro-batches per pipeline
    assert "memory budget" in res.output


def test_few_micro_batches_warn():
    lay = Layout(dp=2, pp=4, context=1024, memory_gib=100, mode="lockstep")
    cmp = compare_strategies(
        documents_from_lengths([1000, 900, 800]),
        lay,
        CostModel.analytic("llama-1b"),
        strategies=["concat"],
        global_batch_tokens=2048,
    )
    assert cmp.warnings and "2*pp = 8" in cmp.warnings[0] and "concat" in cmp.warnings[0]
