"""Cost model: values checked by hand on tiny configs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from slimdata.cost import (
    MODEL_PRESETS,
    CostModel,
    DeviceProfile,
    Interconnect,
    ModelConfig,
    causal_pairs,
    load_model_config,
    resolve_cost_model,
)
from slimdata.errors import ConfigError

TINY = ModelConfig(name="tiny", layers=2, hidden=8, heads=2, kv_heads=1, ffn=16, vocab=10)
# 1 TFLOP/s peak, efficiencies 1/2 so the arithmetic stays exact
DEV = DeviceProfile(
    name="unit",
    peak_tflops=1.0,
    linear_efficiency=0.5,
    attention_fwd_efficiency=0.5,
    attention_bwd_efficiency=0.5,
    launch_overhead_s=1e-6,
)


def test_causal_pairs_by_hand():
    assert causal_pairs(0, 4) == 10  # 1+2+3+4
    assert causal_pairs(4, 6) == 2 * 4 + 3  # prefix 4 for both queries, then 1+2
    # slices of a document add up to the whole document's pairs
    cuts = np.array([0, 3, 7, 10])
    assert causal_pairs(cuts[:-1], cuts[1:]).sum() == causal_pairs(0, 10) == 55


def test_analytic_coefficients_by_hand():
    cm = CostModel.analytic(TINY, DEV, recompute="none")
    kv = 1 * 4  # kv_heads * head_dim
    lin = 2 * 2 * (2 * 64 + 2 * 8 * kv + 3 * 8 * 16) + 2 * 8 * 10  # layers*2*(...) + lm head
    assert lin == 2 * 2 * (128 + 64 + 384) + 160 == 2464
    assert cm.fwd_lin == pytest.approx(lin / 0.5e12)
    assert cm.bwd_lin == pytest.approx(2 * lin / 0.5e12)
    assert cm.fwd_att == pytest.approx(2 * 4 * 8 / 0.5e12)
    assert cm.bwd_att == pytest.approx(2.5 * 2 * 4 * 8 / 0.5e12)
    assert cm.fwd_const == pytest.approx(2e-6) and cm.bwd_const == pytest.approx(4e-6)
    assert cm.kv_bytes_per_token == 2 * 2 * kv * 2  # layers * (K+V) * kv_dim * bf16
    # K/V are kv_bytes_per_token, not activations (slimdata.cost.activations, bf16, h=8,
    # head_dim 4, ffn 16): a norm holds its fp32 input, fp32 statistic and bf16 output,
    # 4 * 8 + 4 + 2 * 8 = 52; per layer 2 norms + bf16 * (4 h + 4 ffn) + fp32 softmax stats
    # of 2 heads = 104 + 192 + 8 = 304; once: ids and labels 2 * 8, cos/sin 2 * 2 * 4, final
    # norm 52, LM-head input 2 * 8
    assert cm.act_bytes_per_token == 2 * 304 + 16 + 16 + 52 + 16 == 708
    # slice [4, 6): s=2, pairs=11
    assert cm.forward(4, 6) == pytest.approx(2 * cm.fwd_lin + 11 * cm.fwd_att + cm.fwd_const)
    assert cm.backward(4, 6) == pytest.approx(2 * cm.bwd_lin + 11 * cm.bwd_att + cm.bwd_const)
    assert cm.kv_bytes(6) == 6 * cm.kv_bytes_per_token


def test_recompute_policies_order_memory_and_time():
    none, sel, full = (
        CostModel.analytic("llama-8b", "h100", r) for r in ("none", "selective", "full")
    )
    assert none.act_bytes_per_token > sel.act_bytes_per_token > full.act_bytes_per_token
    assert full.bwd_lin == pytest.approx(none.bwd_lin + none.fwd_lin)
    assert none.bwd_lin == sel.bwd_lin


def test_slice_costs_split_terms_and_sum():
    cm = CostModel.analytic("llama-1b")
    c = cm.cuts_costs([0, 2048, 4096, 5000])
    assert np.allclose(c.fwd, c.fwd_lin + c.fwd_att + cm.fwd_const)
    assert np.allclose(c.bwd, c.bwd_lin + c.bwd_att + cm.bwd_const)
    assert np.allclose(c.kv_bytes, cm.kv_bytes_per_token * np.array([2048, 4096, 5000]))
    # attention grows along the document: later slices of equal size cost more
    assert c.fwd_att[1] > c.fwd_att[0]
    assert c.fwd_lin[0] == c.fwd_lin[1]


def test_pack_times_with_pack_constant_and_graph_free_forward():
    cm = CostModel(
        fwd_lin=1.0,
        fwd_att=0.0,
        fwd_const=0.5,
        bwd_lin=2.0,
        bwd_att=0.0,
        bwd_const=0.0,
        act_bytes_per_token=0.0,
        kv_bytes_per_token=0.0,
        fwd_pack_const=3.0,
        bwd_pack_const=4.0,
        graph_free_scale=0.8,
    )
    # slices [0,2) and [5,9): 6 tokens + 2 slices * 0.5 + 3 = 10; without a graph 8
    assert cm.pack_forward([0, 5], [2, 9]) == 10.0
    assert cm.pack_forward([0, 5], [2, 9], graph=False) == 8.0
    assert cm.pack_backward([0, 5], [2, 9]) == 16.0
    assert CostModel.analytic("llama-1b").graph_free_scale == 1.0
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="graph_free_scale"):
            CostModel.from_dict({**cm.to_dict(), "graph_free_scale": bad})


def test_profile_file_round_trip(tmp_path):
    cm = CostModel.analytic("llama-7b", "a100", "full")
    path = tmp_path / "profile.json"
    cm.save(path)
    assert CostModel.load(path) == cm
    assert resolve_cost_model(profile=path) == cm
    path.write_text(json.dumps({"fwd_lin": 1}))
    with pytest.raises(ConfigError, match="not a slimdata cost profile"):
        CostModel.load(path)


def test_model_configs(tmp_path):
    assert set(MODEL_PRESETS) >= {"llama-1b", "llama-7b", "llama-8b", "llama-13b", "llama-70b"}
    # parameter counts land near the published sizes
    assert 7.5e9 < MODEL_PRESETS["llama-8b"].params < 8.1e9
    assert 6.5e9 < MODEL_PRESETS["llama-7b"].params < 7.0e9
    assert 69e9 < MODEL_PRESETS["llama-70b"].params < 71.5e9
    hf = tmp_path / "config.json"
    hf.write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 8,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "intermediate_size": 16,
                "vocab_size": 10,
            }
        )
    )
    cfg = load_model_config(str(hf))
    assert (cfg.layers, cfg.hidden, cfg.kv_heads, cfg.ffn, cfg.vocab) == (2, 8, 1, 16, 10)
    with pytest.raises(ConfigError, match="unknown model"):
        load_model_config("llama-9000")
    with pytest.raises(ConfigError, match="not divisible"):
        ModelConfig(name="bad", layers=1, hidden=10, heads=3, kv_heads=1, ffn=4, vocab=4)


def test_interconnect_alpha_beta():
    net = Interconnect(intra_node_gbps=100, inter_node_gbps=10, latency_s=1e-6)
    assert net.all_gather(1e9, 1) == 0.0
    assert net.all_gather(1e9, 4) == pytest.approx(1e-6 + 0.75 * 1e9 / 100e9)
    assert net.all_reduce(1e9, 2, spans_nodes=True) == pytest.approx(1e-6 + 1e9 / 10e9)


def test_recompute_is_a_field_saved_and_loaded(tmp_path):
    for policy in ("none", "selective", "full"):
        cm = CostModel.analytic("llama-1b", "h100", policy)
        assert cm.recompute == policy
        path = tmp_path / f"{policy}.json"
        cm.save(path)
        assert json.loads(path.read_text())["recompute"] == policy
        assert CostModel.load(path).recompute == policy
    with pytest.raises(ConfigError, match="recompute='partial'"):
        CostModel(**{**CostModel.analytic("llama-1b").to_dict(), "recompute": "partial"})


def test_profile_without_recompute_field_gets_it_from_label_or_source(tmp_path):
    base = CostModel.analytic("llama-1b", "h100", "full").to_dict()
    del base["recompute"]

    def load(**over) -> CostModel:
        path = tmp_path / "old.json"
        path.write_text(json.dumps({"slimdata_cost_profile": 1, **base, **over}))
        return CostModel.load(path)

    assert load().recompute == "full"  # label llama-1b@h100/full
    assert load(label="llama-1b@h100/selective").recompute == "selective"
    # written by `slimdata profile`, which times the runtime (no recompute)
    assert load(source="profile:cpu", label="tiny@cpu/float32").recompute == "none"
    with pytest.raises(ConfigError, match=r"does not say its recompute policy.*\"recompute\""):
        load(source="analytic", label="my model")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("layers", -3, "layers=-3 must be an integer >= 1"),
        ("layers", 0, "layers=0 must be an integer >= 1"),
        ("layers", 2.5, "layers=2.5 must be an integer >= 1"),
        ("dtype_bytes", 0, "dtype_bytes=0 must be an integer >= 1"),
        ("param_count", -1, "param_count=-1 must be an integer >= 0"),
        ("hidden", True, "hidden=True must be an integer >= 0"),
        ("fwd_const", float("nan"), "fwd_const=nan must be finite and >= 0"),
        ("bwd_pack_const", -0.5, "bwd_pack_const=-0.5 must be finite and >= 0"),
        ("bwd_lin", "1e-5", "bwd_lin='1e-5' must be finite and >= 0"),
    ],
)
def test_a_cost_model_from_a_file_is_checked_field_by_field(field, value, message):
    """A build's slimdata.json or a profile is untrusted: `layers: -3` was accepted and the
    simulator split the model over a negative layer count."""
    data = CostModel.analytic("llama-8b", "h100", "full").to_dict()
    with pytest.raises(ConfigError, match=re.escape(f"cost model: {message}")):
        CostModel.from_dict({**data, field: value})
    assert CostModel.from_dict({**data, "layers": np.int64(32)}).layers == 32  # numpy ints pass


def test_a_build_whose_cost_model_is_out_of_range_names_its_sidecar(tmp_path):
    from slimdata.errors import InputError
    from slimdata.planning import build_cost_model

    data = CostModel.analytic("llama-8b", "h100", "full").to_dict()
    (tmp_path / "slimdata.json").write_text(json.dumps({"cost_model": {**data, "layers": -3}}))
    with pytest.raises(
        InputError, match=re.escape(f"{tmp_path / 'slimdata.json'}: cost model: layers=-3")
    ):
        build_cost_model(tmp_path)
