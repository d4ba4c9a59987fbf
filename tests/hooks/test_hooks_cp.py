"""Static context parallelism at run time: cp=2 on 2 and 4 gloo ranks against the unpacked
reference (DDP, a bare module, FSDP2; DP-Merge on top of static CP), and the chunk split the
simulator prices."""

from __future__ import annotations

import cp_workers as W
import pytest
from execution_workers import TINY
from slimdata.hooks.distributed import run_distributed

from slimdata.cost import CostModel
from slimdata.execution import ExecutionConfig, build_programs, padded
from slimdata.execution.cp import cp_chunks

pytestmark = pytest.mark.timeout(300)
TOL = 1e-5


def _check(results):
    assert results and all(results)
    for case in zip(*results, strict=True):  # per case, one tuple per process
        shares, refs, errs = zip(*case, strict=True)
        assert sum(shares) == pytest.approx(refs[0], rel=1e-6)  # each loss token counted once
        assert max(errs) <= TOL, errs


def test_cp2_on_two_processes():
    res = run_distributed(W.cp_two_process_suite, 2)
    _check([r[0] for r in res])
    # TinyLM has 2 layers: per pack, one K/V all-gather per layer forward; backward, per layer,
    # one re-gather (the attention is checkpointed) and one reduce-scatter of the K/V gradient.
    # Each gather moves 2 members x the longer member's rows x 128 B (K+V of a token, one
    # layer): the pack's slices and their documents' earlier slices (the prefix), in chunks
    # pack 0, [0,10) [1-token doc]: member 0 rows 4 + 1, member 1 rows 6 + 0 -> 2 * 6 rows
    # pack 1, prefix [0,10) + [10,17) + doc 2 [0,9): 4+3+3 vs 6+4+6 -> 2 * 16 rows
    # pack 2, [0,10) + [10,17) + [17,23) + doc 3 [0,5): 4+3+2+2 vs 6+4+4+3 -> 2 * 17 rows
    rows = {0: 12, 1: 32, 2: 34}
    want = [("F", i, 2, 0, [rows[i] * 128] * 2) for i in range(3)]
    want += [("B", i, 2, 2, [rows[2 - i] * 128] * 2) for i in range(3)]  # backward packs reversed
    assert res[0][1] == want
    assert res[1][1] == want
    assert _listed(W.PLANS["one_rank"]()[1]) == want  # the execution model lists the same
    assert (
        res[0][2]
        == res[1][2]
        == [
            "cp=2: the plan has 2 DP ranks, so it runs on 4 processes (2 groups of 2), not 2",
            "cp=3: the plan has 1 DP ranks, so it runs on 3 processes (1 groups of 3), not 2",
            "cp=0: static context parallelism needs an integer >= 1",
        ]
    )


def _listed(plan) -> list:
    """Per pack of ``plan``'s DP rank 0 at cp=2: what the execution model lists, in the
    recorder's shape (pass, pack, K/V all-gathers, reduce-scatters, all-gather bytes)."""
    prog = build_programs(plan, CostModel.analytic(TINY, "h100", "none"), ExecutionConfig(cp=2))
    out = []
    for op in prog[(0, 0)].computes():
        mine = [
            c
            for c in prog[(0, 0)].collectives()
            if (c.pass_, c.pack) == (op.pass_, op.pack) and c.kind.startswith("cp_kv_")
        ]
        gathers = [round(c.bytes) for c in mine if c.kind == "cp_kv_all_gather"]
        out.append((op.pass_, op.pack, len(gathers), len(mine) - len(gathers), gathers))
    return out


@pytest.mark.slow
def test_cp2_on_four_processes():
    _check(run_distributed(W.cp_four_process_suite, 4))


def test_chunks_are_load_balanced_zigzag():
    # slice [10, 20) at cp=2: padded to 12, chunks of 3: [10,13) [13,16) [16,19) [19,20)
    assert cp_chunks(10, 20, 2, 0) == [(10, 13), (19, 20)]
    assert cp_chunks(10, 20, 2, 1) == [(13, 16), (16, 19)]
    # 16 tokens at cp=4: 8 chunks of 2; member 1 holds chunks 1 and 6
    assert cp_chunks(0, 16, 4, 1) == [(2, 4), (12, 14)]
    # one token: member 0 holds it, member 1 nothing
    assert cp_chunks(5, 6, 2, 0) == [(5, 6)]
    assert cp_chunks(5, 6, 2, 1) == []
    assert cp_chunks(0, 7, 1, 0) == [(0, 7)]


@pytest.mark.parametrize("length", [1, 2, 3, 7, 8, 13, 40])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_chunks_tile_the_slice(length, cp):
    got = sorted(r for m in range(cp) for r in cp_chunks(3, 3 + length, cp, m))
    assert [t for a, b in got for t in range(a, b)] == list(range(3, 3 + length))
    shares = [sum(b - a for a, b in cp_chunks(3, 3 + length, cp, m)) for m in range(cp)]
    chunk = -(-length // (2 * cp))  # ceil(s / 2k)
    assert max(shares) <= 2 * chunk  # at most two chunks each
    if cp > 1:  # the chunks cut the simulator's padded slice (execution.padded) into 2k
        assert 2 * cp * chunk == padded(length, cp)


def test_member_outside_the_group_is_rejected():
    with pytest.raises(ValueError, match="member=2 outside a CP group of 2"):
        cp_chunks(0, 4, 2, 2)
