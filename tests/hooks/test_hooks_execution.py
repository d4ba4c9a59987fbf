"""The runtime executes exactly the execution model's program (design §7): per rank, the
pack passes in program order with their model calls and tokens, and every floating-point
collective with its group and bytes (and a merge group's exchange of token ids and loss
masks), recorded on CPU gloo for random solver plans (slimpack
with DP-Merge, baselines), hand-built merge plans and FSDP2 lockstep plans (FSDP2's parameter
collectives per pass and group: it issues one per sharded unit, the program one per pass),
and static CP (cp=2: every K/V all-gather and reduce-scatter of every model call)."""

from __future__ import annotations

import execution_workers as X
import pytest
from slimdata.hooks.distributed import run_distributed

pytestmark = pytest.mark.timeout(600)


def _assert_equal(results):
    kinds = set()
    for rank, cases in enumerate(results):
        for name, got, want in cases:
            assert got == want, f"rank {rank}, case {name}"
            kinds.update(c[0] for pack in want[0] for c in pack[4])
            kinds.update(c[0] for c in want[1])
    return kinds


def test_runtime_runs_the_program_two_ranks():
    res = run_distributed(
        X.runtime_vs_program, 2, [0, 1, 2, 3], ["merge2", "solver2", "fsdp:solver2_merge"]
    )
    kinds = _assert_equal(res)
    # not vacuous: merge exchanges, DDP's all-reduce and FSDP's collectives were all compared
    assert {"merge_kv_all_gather", "merge_kv_reduce_scatter", "ddp_all_reduce"} <= kinds
    assert "merge_tokens_all_gather" in kinds
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds


def test_fsdp1_runs_the_program_of_its_rules():
    # FSDP1 frees its gathered parameters after a forward, so the executor recomputes every
    # backward pack's forward (forwards without a graph): the program under
    # fsdp_keeps_graphs=False lists exactly those calls, tokens and collectives
    res = run_distributed(
        X.runtime_vs_program, 2, [6], ["fsdp1:solver2_merge", "fsdp1:solver2_asym", "fsdp1:hand2"]
    )
    kinds = _assert_equal(res)
    assert {"merge_kv_all_gather", "fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds


def test_runtime_runs_the_program_under_full_recompute():
    # every layer checkpointed: a merge pack's backward re-gathers its keys/values once per
    # layer inside the layer's recomputation, then reduce-scatters their gradient, as with
    # no recompute (2 collectives per layer); only a pack the executor re-runs whole gathers
    # a third time
    res = run_distributed(X.runtime_vs_program, 2, [1], ["full:merge2", "full:solver2"])
    kinds = _assert_equal(res)
    assert {"merge_kv_all_gather", "merge_kv_reduce_scatter", "ddp_all_reduce"} <= kinds


@pytest.mark.slow
def test_runtime_runs_the_program_four_ranks():
    res = run_distributed(
        X.runtime_vs_program, 4, [4, 5], ["merge4", "two_groups4", "fsdp:merge_recompute4"]
    )
    kinds = _assert_equal(res)
    assert {"merge_kv_all_gather", "merge_kv_reduce_scatter", "ddp_all_reduce"} <= kinds
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds


def _assert_equal_cp(results):
    kinds, cut = set(), False
    for rank, cases in enumerate(results):
        for name, got, want, cut_doc in cases:
            assert got == want, f"process {rank}, case {name}"
            kinds.update(c[0] for pack in want[0] for c in pack[4])
            kinds.update(c[0] for c in want[1])
            cut |= cut_doc
    assert cut  # a document's slices ran in several packs (the gathers read their prefix)
    return kinds


def test_runtime_runs_the_program_static_cp_two_processes():
    res = run_distributed(
        X.runtime_vs_program_cp, 2, [0, 3], ["one_rank_asym", "lone_token"], timeout_s=500
    )
    kinds = _assert_equal_cp(res)
    # not vacuous: static CP's exchanges, DDP's all-reduce and FSDP's collectives compared
    assert {"cp_kv_all_gather", "cp_kv_reduce_scatter", "ddp_all_reduce"} <= kinds
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds


@pytest.mark.slow
def test_runtime_runs_the_program_static_cp_four_processes():
    res = run_distributed(
        X.runtime_vs_program_cp, 4, [0, 1], ["two_ranks_asym", "merge2"], timeout_s=580
    )
    kinds = _assert_equal_cp(res)
    assert {"cp_kv_all_gather", "cp_kv_reduce_scatter", "ddp_all_reduce"} <= kinds
    assert {"merge_kv_all_gather", "merge_kv_reduce_scatter", "merge_tokens_all_gather"} <= kinds
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds
