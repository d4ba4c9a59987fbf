"""The compute-only critical path (:mod:`slimdata.execution.critical`) on hand-computed
pipelines."""

from __future__ import annotations

import numpy as np
import pytest

from slimdata.execution import stage_ops
from slimdata.execution.critical import critical_path
from slimdata.plan.pipeline import interleave

F0B0F1B1 = interleave(2, [0, 1])


def test_one_f_one_b_two_stages_by_hand():
    # forward packs of 1 s, backward 2 s, each op half its pack:
    # stage 0 F0 [0, .5] F1 [.5, 1]; stage 1 F0 [.5, 1] B0 [1, 2] F1 [2, 2.5] B1 [2.5, 3.5];
    # stage 0 B0 [2, 3] B1 [3.5, 4.5]
    assert critical_path([1, 1], [2, 2], F0B0F1B1, 2).tolist() == [4.5]
    # one stage: the packs one after another
    assert critical_path([1, 2], [3, 4], F0B0F1B1, 1).tolist() == [10.0]


def test_chunks_take_their_share_of_the_layers():
    # 3 layers on 2 stages: stage 0 holds 2/3 of the model, stage 1 1/3;
    # stage 0 F0 [0, 2/3] F1 [2/3, 4/3]; stage 1 F0 [2/3, 1] B0 [1, 5/3] F1 [5/3, 2]
    # B1 [2, 8/3]; stage 0 B0 [5/3, 3] B1 [3, 13/3]
    got = critical_path([1, 1], [2, 2], F0B0F1B1, 2, layers=3)
    assert got.tolist() == pytest.approx([13 / 3])


def test_interleaved_two_stages_two_chunks_by_hand():
    # pp = 2, v = 2: chunks 0, 2 on device 0, chunks 1, 3 on device 1; each chunk a quarter
    # of the model: forward ops 0.25 s, backward 0.5 s
    assert stage_ops("interleaved", F0B0F1B1, 0, 2, 2) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1),
        ("B", 2, 0), ("B", 2, 1), ("B", 0, 0), ("B", 0, 1),
    ]  # fmt: skip
    assert stage_ops("interleaved", F0B0F1B1, 1, 2, 2) == [
        ("F", 1, 0), ("F", 1, 1), ("F", 3, 0), ("B", 3, 0),
        ("F", 3, 1), ("B", 3, 1), ("B", 1, 0), ("B", 1, 1),
    ]  # fmt: skip
    # device 0: F(0,0) [0, .25] F(0,1) [.25, .5]; device 1: F(1,0) [.25, .5] F(1,1) [.5, .75]
    # device 0: F(2,0) [.5, .75] F(2,1) [.75, 1]; device 1: F(3,0) [.75, 1] B(3,0) [1, 1.5]
    # F(3,1) [1.5, 1.75] B(3,1) [1.75, 2.25]; device 0: B(2,0) [1.5, 2] B(2,1) [2.25, 2.75];
    # device 1: B(1,0) [2.25, 2.75] B(1,1) [2.75, 3.25]; device 0: B(0,0) [2.75, 3.25]
    # B(0,1) [3.25, 3.75]
    got = critical_path([1, 1], [2, 2], F0B0F1B1, 2, schedule="interleaved", v=2)
    assert got.tolist() == [3.75]
    # one chunk per device: interleaved is 1F1B
    one = critical_path([1, 1], [2, 2], F0B0F1B1, 2, schedule="interleaved", v=1)
    assert one.tolist() == [4.5]


def test_ranks_are_columns_each_as_if_alone():
    rng = np.random.default_rng(0)
    f, b = rng.random((6, 5)), rng.random((6, 5))
    order = interleave(6, [j + 2 for j in range(6)])
    for schedule, v in (("1f1b", 1), ("interleaved", 2)):
        together = critical_path(f, b, order, 3, schedule=schedule, v=v, layers=7)
        alone = [
            critical_path(f[:, r], b[:, r], order, 3, schedule=schedule, v=v, layers=7)[0]
            for r in range(5)
        ]
        assert together.tolist() == alone
        assert min(alone) > 0  # guard: not vacuous


def test_edge_cases():
    assert critical_path([], [], (), 4).tolist() == [0.0]
    # no backward packs: the forwards through the stages
    assert critical_path([1.0], [], (("F", 0),), 2).tolist() == [1.0]


@pytest.mark.parametrize("lockstep", [False, True])
def test_waves_give_the_same_floats_as_op_by_op(monkeypatch, lockstep):
    """Deep pipelines are evaluated a wave of independent ops at a time; every element takes
    the same two operations as op by op (checked by hand above), so the floats are equal."""
    from slimdata.execution import critical

    rng = np.random.default_rng(1)
    for pp, v, schedule, m in ((8, 1, "1f1b", 24), (16, 2, "interleaved", 32), (4, 1, "1f1b", 9)):
        f, b = rng.random((m, 3)), rng.random((m, 3))
        order = interleave(m, [min(m, j + pp) for j in range(m)])
        kw = dict(schedule=schedule, v=v, layers=37, lockstep=lockstep)
        monkeypatch.setattr(critical, "WAVE_GAIN", 0)  # always by waves
        waves = critical_path(f, b, order, pp, **kw)
        monkeypatch.setattr(critical, "WAVE_GAIN", 10**9)  # always op by op
        ops = critical_path(f, b, order, pp, **kw)
        assert waves.tolist() == ops.tolist() and min(ops) > 0
