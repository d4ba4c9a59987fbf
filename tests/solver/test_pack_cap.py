"""``Layout.pack_tokens`` is a hard cap for every pack, DP-Merge shares included."""

from __future__ import annotations

import pytest

from slimdata.cost import CostModel, ModelConfig
from slimdata.solver import Layout, solve

from .conftest import docs_of

SMALL = ModelConfig(
    name="small", layers=4, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=32000, dtype_bytes=4
)
CAP = 131072


@pytest.mark.parametrize(
    ("dp", "lengths", "mode"),
    [
        (2, [864000, 1000, 3000], "free"),  # a merge over 2 ranks would need 432K-token shares
        (2, [864000, 1000, 3000], "lockstep"),
        (4, [500000, 2000, 500000, 2000], "free"),
        (2, [300000, 5000], "free"),
    ],
)
def test_every_pack_within_pack_tokens(dp, lengths, mode):
    cost = CostModel.analytic(SMALL, "h100", "selective")
    layout = Layout(dp=dp, memory_gib=60, mode=mode, context=1 << 20, pack_tokens=CAP)
    plan = solve(docs_of(lengths, 2048), layout, "slimpack", cost=cost)
    packs = [p for rs in plan.ranks for p in (*rs.forward, *rs.backward)]
    assert max(p.tokens for p in packs) <= CAP
    # token conservation: each token once in a forward pack and once in a backward pack
    assert sum(rs.tokens for rs in plan.ranks) == sum(lengths)
    assert sum(p.tokens for rs in plan.ranks for p in rs.forward) == sum(lengths)


def test_merge_shares_within_pack_tokens():
    # a 500K-token document on 4 ranks merges; every member's share is one pack <= the cap
    cost = CostModel.analytic(SMALL, "h100", "selective")
    layout = Layout(dp=4, memory_gib=60, context=1 << 20, pack_tokens=CAP)
    plan = solve(docs_of([500000, 2000, 3000, 2000], 2048), layout, "slimpack", cost=cost)
    assert plan.merges, "expected a merge group: the check below would be vacuous"
    shares = [p for rs in plan.ranks for p in rs.forward if p.merge is not None]
    assert shares and max(p.tokens for p in shares) <= CAP


def test_a_document_whose_shares_exceed_the_pack_cap_is_refused_for_its_tokens():
    # a 6000-token document must merge (0.25 GiB per device holds about half of it), but a
    # member's share is one pack of <= 2048 tokens: 3 ranks, and only 2 exist; more memory
    # would not help, so the error does not suggest it
    from slimdata.errors import PlanError

    tiny = ModelConfig(name="t", layers=3, hidden=512, heads=8, kv_heads=2, ffn=1376, vocab=1024)
    layout = Layout(dp=2, context=1 << 16, pack_tokens=2048, memory_gib=0.25)
    docs = docs_of([6000, 700, 1300, 300, 129], 256)
    with pytest.raises(PlanError) as err:
        solve(docs, layout, "slimpack", cost=CostModel.analytic(tiny, "h100", "none"))
    assert str(err.value) == (
        "document doc_id 0 (6000 tokens, 24 slices) needs 3 merged ranks, since a member's "
        "share is one pack of at most 2,048 tokens, and at most 2 can hold it: use more devices"
        " (--nodes, --ranks-per-node), or use --oversize split|truncate"
    )
