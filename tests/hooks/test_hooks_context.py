"""A plan solved for another context length than the training's is refused with both numbers:
plan shards for ``context=`` of the loader, a loader's ``Layout(context=...)`` longer than its
model's positions, and a payload reaching past them in ``run_step``; each ran silently."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hooks_helpers import VOCAB, doc_tokens, make_plan, tiny_llama
from slimdata.hooks import make_payload, run_step
from slimdata.hooks.loader import DocumentLoader, LoaderConfig, PlanShardLoader
from streaming import LocalDataset

from slimdata.docsource import documents_from_lengths
from slimdata.errors import ConfigError
from slimdata.solver import Layout
from slimdata.solver.epoch import write_epoch_plan
from slimdata.solver.planshards import write_plan_shards

pytestmark = pytest.mark.timeout(120)
LENGTHS = [300, 40, 200, 128, 77, 90, 12, 256]


def _tokens(sample: int) -> np.ndarray:
    return (np.arange(LENGTHS[sample], dtype=np.uint32) + sample) % VOCAB


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Plan shards of ``slimdata plan --context 512`` (2 ranks), as the CLI writes them."""
    docs = [
        dataclasses.replace(d, sample=i) for i, d in enumerate(documents_from_lengths(LENGTHS, 128))
    ]
    out = tmp_path_factory.mktemp("ctx") / "plan"
    write_epoch_plan(
        docs,
        out,
        nodes=1,
        ranks_per_node=2,
        global_batch_tokens=1024,
        memory_gib=40,
        context=512,
        tokens_of=_tokens,
    )
    return out


def _loader(directory, **kw):
    return PlanShardLoader(LocalDataset(local=str(directory)), rank=0, ranks_per_node=2, **kw)


def test_plan_shards_solved_for_another_context_are_refused(planned):
    with pytest.raises(ConfigError) as info:
        _loader(planned, context=1024)
    assert str(info.value) == (
        "context=1024: these plan shards were solved for context=512 (plan.json): their "
        "documents are cut and packed for 512 tokens, not 1024; re-run `slimdata plan "
        "--context 1024`, or train at context=512"
    )
    with pytest.raises(
        ConfigError, match=r"context=256: these plan shards were solved for context=512"
    ):
        _loader(planned, context=256)
    with pytest.raises(ConfigError, match=r"^context=0: give the training's context length"):
        _loader(planned, context=0)
    steps = list(_loader(planned, context=512))  # the plan's own context loads
    assert len(steps) >= 2 and sum(len(p.tokens) for p in steps) > 0
    assert len(list(_loader(planned))) == len(steps)  # not checked when not given


def test_a_context_cannot_be_checked_against_plan_shards_that_do_not_record_one(tmp_path):
    docs = [
        dataclasses.replace(d, sample=i)
        for i, d in enumerate(documents_from_lengths(LENGTHS[:2], 128))
    ]
    from slimdata.solver import solve

    plan = solve(docs, Layout(dp=2, memory_gib=40), "bfd", 0, step=0)
    write_plan_shards([plan], tmp_path / "p", nodes=1, ranks_per_node=2, tokens_of=_tokens)
    with pytest.raises(ConfigError) as info:
        _loader(tmp_path / "p", context=512)
    assert str(info.value) == (
        "context=512: plan.json records no context to check it against (plan shards not "
        "written by `slimdata plan`); omit context="
    )


def test_a_document_loader_longer_than_its_models_positions_is_refused():
    from transformers import LlamaConfig

    model = LlamaConfig(max_position_embeddings=256)
    config = LoaderConfig(layout=Layout(dp=1, context=512), global_batch_tokens=1024, model=model)
    with pytest.raises(ConfigError) as info:
        DocumentLoader([], rank=0, config=config, documents=[])
    assert str(info.value) == (
        "Layout(context=512) is longer than the model's 256 positions "
        "(config.max_position_embeddings): plans would hold documents of up to 512 tokens; "
        "use Layout(context=256), or a model of 512 positions"
    )


def test_run_step_refuses_a_payload_past_the_models_positions():
    # a plan of a 300-token document for a model of 256 positions (tiny_llama): RoPE trained
    # positions 256-299 silently
    from slimdata.hooks import hf

    model = tiny_llama(hf.register())
    assert model.config.max_position_embeddings == 256
    spec = [[(0, 0, 300), (1, 0, 4)]]
    plan = make_plan([300, 4], [(spec, spec)], step=2)
    with pytest.raises(ConfigError) as info:
        run_step(model, make_payload(plan, 0, doc_tokens([300, 4])))
    assert str(info.value) == (
        "step 2 rank 0: document 'd0' reaches position 299, beyond the model's 256 positions "
        "(config.max_position_embeddings): the plan was solved for a longer context than the "
        "model's; plan with --context 256 (Layout(context=256)), or train a model of the "
        "plan's context"
    )
    assert all(p.grad is None for p in model.parameters())  # refused before any pack
    plan = make_plan([256, 4], [([[(0, 0, 256), (1, 0, 4)]],) * 2], step=2)
    assert run_step(model, make_payload(plan, 0, doc_tokens([256, 4]))).loss > 0  # 0-255 run
