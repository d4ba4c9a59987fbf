"""A slice that does not fit a device alone is refused up front, with what it needs by the
execution model's memory rule (:func:`device_peak_memory` of a plan running it alone)."""

from __future__ import annotations

import pytest

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.execution import ExecutionConfig
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan
from slimdata.solver import Layout, solve
from slimdata.solver.common import BatchView
from slimdata.solver.memory import device_peak_memory
from slimdata.units import gib

from .conftest import GIB

FULL = CostModel.analytic("llama-8b", "h100", "full")

# a 65,536-token document cut every 1,024 tokens up to 63,488: its last slice, [63488,
# 65536), is the longest
DOC = Document(0, 65536, cuts=(*range(0, 63489, 1024), 65536))


def alone(cp: int) -> float:
    """The execution model's device peak of a plan that runs [63488, 65536) alone."""
    pack = MicroPack((Slice(0, 63488, 65536),))
    plan = StepPlan(0, "by-hand", (DOC,), (RankStep(0, (pack,), (pack,)),))
    return device_peak_memory(plan, FULL, ExecutionConfig(cp=cp))


@pytest.mark.parametrize("memory_gib", [0.5, 0.7])
def test_a_slice_above_the_cap_is_named_with_what_it_needs_on_a_device(memory_gib):
    """The review's case (full recompute): the slice needs 0.81 GiB alone (its activations
    and K/V), where the message gave 8.56 GiB (its activations and the K/V of its whole
    prefix) and the check compared its activations alone (0.56 GiB), so at 0.7 GiB it
    passed."""
    need = alone(1)
    assert gib(need / GIB, 2) == "0.81 GiB"
    layout = Layout(dp=1, memory_gib=memory_gib, context=65536)
    with pytest.raises(
        PlanError,
        match=rf"^slice \[63488, 65536\) of document doc_id 0 needs 0\.81 GiB on a device "
        rf"alone \(its activations and K/V\), above the memory cap {memory_gib:.2f} GiB per "
        r"device: raise --memory-gib or cut finer slices$",
    ):
        solve([DOC], layout, "slimpack", cost=FULL)


def test_under_static_cp_a_slice_needs_its_share_and_its_gathered_kv():
    need = alone(2)
    assert gib(need / GIB, 2) == "0.42 GiB"
    layout = Layout(dp=1, cp=2, memory_gib=0.4, context=65536)
    with pytest.raises(
        PlanError,
        match=r"needs 0\.42 GiB on a device alone \(its activations and K/V, and the K/V its "
        r"pass gathers under static CP 2\), above the memory cap 0\.40 GiB per device",
    ):
        solve([DOC], layout, "slimpack", cost=FULL)


@pytest.mark.parametrize("cp", [1, 2])
def test_a_slice_that_fits_a_device_alone_passes(cp):
    from slimdata.solver.strategies.slimpack import _check_slices

    view = BatchView.build([DOC], FULL)
    _check_slices(view, Layout(dp=1, cp=cp, memory_gib=alone(cp) / GIB, context=65536), FULL)
    below = Layout(dp=1, cp=cp, memory_gib=alone(cp) * (1 - 1e-9) / GIB, context=65536)
    with pytest.raises(PlanError, match="on a device alone"):
        _check_slices(view, below, FULL)
