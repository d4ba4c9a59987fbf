"""The loader applies the planner's rules (context, oversize, pack cap) and derives its cost
model from the model being trained; its errors name the loop-level argument to change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hooks_helpers import VOCAB, tiny_llama
from slimdata.hooks.loader import DocumentLoader, LoaderConfig
from streaming import MDSWriter, StreamingDataset

from slimdata.cost import CostModel, ModelConfig
from slimdata.errors import ConfigError, PlanError
from slimdata.slicing import slice_cuts
from slimdata.solver import Layout, PlanConfig

pytestmark = pytest.mark.timeout(120)
LENGTHS = [700, 40, 300, 9]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("rules") / "shards"
    rng = np.random.default_rng(1)
    toks = [rng.integers(0, VOCAB, size=n).astype(np.uint32) for n in LENGTHS]
    cols = {"tokens": "ndarray:uint32", "slices": "ndarray:uint32", "length": "int"}
    cols |= {"doc_id": "str", "source": "str"}
    with MDSWriter(out=str(out), columns=cols) as w:
        for i, t in enumerate(toks):
            cuts = slice_cuts(len(t), 256).astype(np.uint32)
            w.write(
                {"tokens": t, "slices": cuts, "length": len(t), "doc_id": f"d{i}", "source": "t"}
            )
    return StreamingDataset(local=str(out), shuffle=False, batch_size=1), toks


def _config(**kw):
    layout = Layout(dp=2, context=kw.pop("context", 512), pack_tokens=kw.pop("pack_tokens", None))
    return LoaderConfig(layout=layout, global_batch_tokens=2000, seed=0, **kw)


def _tokens_seen(ds, config):
    loaders = [DocumentLoader(ds, rank=r, config=config) for r in range(2)]
    out = {}
    for payloads in zip(*loaders, strict=True):
        for p in payloads:
            off = 0
            for s in p.plan.ranks[p.rank].slices():
                d = p.plan.docs[s.doc]
                out[(d.sample, d.offset + s.start)] = p.tokens[off : off + s.tokens]
                off += s.tokens
    return out


def test_oversize_error_names_the_loader_argument(shards):
    ds, _ = shards
    loader = DocumentLoader(ds, rank=0, config=_config(oversize="error"))
    with pytest.raises(PlanError, match=r"d0.*700 tokens.*LoaderConfig\(oversize="):
        next(iter(loader))


@pytest.mark.parametrize("policy", ["split", "truncate"])
def test_oversize_split_keeps_every_token_truncate_the_first_context(shards, policy):
    ds, toks = shards
    seen = _tokens_seen(ds, _config(oversize=policy))
    for i, t in enumerate(toks):
        got = np.concatenate([v for (s, _o), v in sorted(seen.items()) if s == i])
        want = t if policy == "split" or len(t) <= 512 else t[:512]
        np.testing.assert_array_equal(got, want)
    assert len(toks[0]) > 512  # the rule was exercised


def test_slice_above_pack_cap_names_layout_pack_tokens(shards):
    ds, _ = shards
    loader = DocumentLoader(ds, rank=0, config=_config(pack_tokens=128, oversize="split"))
    with pytest.raises(PlanError, match=r"Layout\(pack_tokens=\.\.\.\)") as err:
        next(iter(loader))
    assert "rebuild the shards with a smaller --slice-tokens" in str(err.value)


def test_cost_model_from_the_hf_model_being_trained():
    model = tiny_llama("eager")
    shape = ModelConfig(
        name="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=VOCAB, dtype_bytes=4
    )
    want = CostModel.analytic(shape, "h100", "none")
    got = _config(model=model).resolved_cost()
    assert got == want
    assert _config(model=model.config).resolved_cost() == want
    assert ModelConfig.from_hf(model.to(torch.bfloat16)).dtype_bytes == 2
    assert _config(cost=want, model="llama-8b").resolved_cost() is want


def test_cost_falls_back_to_the_shards_then_the_solver_default(shards):
    ds, _ = shards
    assert DocumentLoader(ds, rank=0, config=_config(oversize="split")).cost is None


def test_bad_rules_are_config_errors():
    with pytest.raises(ConfigError, match="oversize='drop'"):
        _config(oversize="drop")
    with pytest.raises(ConfigError, match="strategy='fast'"):
        PlanConfig(layout=Layout(dp=1), global_batch_tokens=10, strategy="fast")
    with pytest.raises(ConfigError, match="no \\['hidden_size'"):
        ModelConfig.from_hf(object())
