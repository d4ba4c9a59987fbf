"""(d) DP-Merge over 2 and 4 gloo ranks, and DDP, against the unpacked reference."""

from __future__ import annotations

import hooks_workers as W
import pytest
import robust_workers as R
from slimdata.hooks.distributed import run_distributed

pytestmark = pytest.mark.timeout(300)
TOL = 1e-5


def _check(results):
    for step in zip(*results, strict=True):  # per plan, one tuple per rank
        shares, refs, errs = zip(*step, strict=True)
        assert sum(shares) == pytest.approx(refs[0], rel=1e-6)
        assert max(errs) <= TOL, errs


def test_two_ranks_merge_and_ddp():
    res = run_distributed(W.two_rank_suite, 2)
    _check([r[0] for r in res])
    # DDP without merge groups
    assert sum(r[1][0] for r in res) == pytest.approx(res[0][1][1], rel=1e-6)
    assert max(r[1][2] for r in res) <= TOL
    # DP-Merge holds one layer's gathered K/V at a time: TinyLM's 2 layers each gather once in
    # the merge forward pack and once more in its backward (re-gathered, not kept), which also
    # reduce-scatters each layer's K/V gradient; nothing all-reduces, no other pack exchanges
    rank0, rank1 = (r[2] for r in res)
    assert rank0 == [
        ("F", 0, 0, 0, 0), ("F", 1, 2, 0, 0), ("B", 0, 2, 2, 0), ("F", 2, 0, 0, 0), ("B", 1, 0, 0, 0)
    ]  # fmt: skip
    assert rank1 == [
        ("F", 0, 0, 0, 0), ("F", 1, 2, 0, 0), ("F", 2, 0, 0, 0), ("B", 0, 0, 0, 0),
        ("B", 1, 2, 2, 0), ("B", 2, 0, 0, 0),
    ]  # fmt: skip


def test_merged_document_with_a_loss_mask():
    # the members gather the merged document's loss mask with its ids (one exchange): its
    # masked positions carry no label on either member, as in the masked reference
    _check([[r] for r in run_distributed(W.masked_merge, 2)])


@pytest.mark.slow
def test_merge_four_ranks_and_fsdp():
    res = run_distributed(W.four_rank_suite, 4)
    _check([r[0] for r in res])  # plain modules: merge4, two_groups4, solver4, solver4_coarse
    _check([r[1] for r in res])  # FSDP2, lockstep solver plan with a 3-rank merge + padding


def test_failure_on_a_rank_is_reported():
    with pytest.raises(RuntimeError, match=r"rank \d failed(.|\n)*KeyError"):
        run_distributed(W.equivalence, 2, ["no-such-plan"])


def test_merge_exchange_bytes_are_the_simulators():
    # TinyLM: 2 layers, 2 K/V heads of 8, fp32: K+V of one token in one layer = 2*16*4 = 128 B.
    # Shares of 14 and 16 tokens, padded to 16: every collective moves 2 * 16 * 128 = 4096
    # bytes: one all-gather per layer forward; per layer, last first, one re-gather and one
    # reduce-scatter backward
    from slimdata.cost import CostModel, ModelConfig
    from slimdata.sim.cp import merge_collectives, merge_layer_tokens

    res = run_distributed(R.merge_collective_bytes, 2)
    want = [("all_gather", 4096)] * 2 + [("all_gather", 4096), ("reduce_scatter", 4096)] * 2
    assert res == [want, want]
    tiny = ModelConfig(
        name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=64, dtype_bytes=4
    )
    cost = CostModel.analytic(tiny, "h100", "none")
    _lengths, plan = R.plan_member_only2()
    assert merge_layer_tokens(plan, 0) == 32
    assert cost.kv_bytes_per_token / cost.layers * merge_layer_tokens(plan, 0) == 4096
    assert (merge_collectives("F"), merge_collectives("B")) == (1, 2)
