"""The runtime runs from rank views (plan-shard payloads): DP-Merge over 4 gloo ranks and
FSDP2 on lockstep plans give the gradients of the unpacked reference when each rank holds
only its own view of the plan."""

from __future__ import annotations

import pytest
import rank_view_workers as V
from slimdata.hooks.distributed import run_distributed
from test_hooks_distributed import _check

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow
def test_four_ranks_run_from_their_views():
    res = run_distributed(V.from_views, 4)
    assert len(res) == 4 and all(len(r[0]) == 3 and len(r[1]) == 2 for r in res)
    _check([r[0] for r in res])  # merge4, two_groups4, solver4 (plain modules)
    _check([r[1] for r in res])  # FSDP2: lockstep solver plan with a merge, recomputed merge
