"""The runtime executes exactly the execution model's program (design §7): per rank, the
pack passes in program order with their model calls and tokens, and every floating-point
collective with its group and bytes, recorded on CPU gloo for random solver plans (slimpack
with DP-Merge, baselines), hand-built merge plans and FSDP2 lockstep plans (FSDP2's parameter
collectives per pass and group: it issues one per sharded unit, the program one per pass)."""

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
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds


@pytest.mark.slow
def test_runtime_runs_the_program_four_ranks():
    res = run_distributed(
        X.runtime_vs_program, 4, [4, 5], ["merge4", "two_groups4", "fsdp:merge_recompute4"]
    )
    kinds = _assert_equal(res)
    assert {"merge_kv_all_gather", "merge_kv_reduce_scatter", "ddp_all_reduce"} <= kinds
    assert {"fsdp_all_gather", "fsdp_reduce_scatter"} <= kinds
