"""Tiny hand-built plans and cost models for the simulator tests."""

from __future__ import annotations

from slimdata.cost import CostModel
from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan

MIB = 1 << 20
LENGTHS = [300, 120, 250, 80, 60, 310, 200, 90, 150, 40, 280, 220, 170, 130, 260, 100] * 3
"""Document lengths of the CP-search and same-work tests (concat cuts some of them)."""


def mib_cost() -> CostModel:
    """1 MiB of activations per token, no K/V: a 1024-token concat row holds 1 GiB."""
    return CostModel(
        fwd_lin=1e-3,
        fwd_att=1e-6,
        fwd_const=0.0,
        bwd_lin=2e-3,
        bwd_att=2e-6,
        bwd_const=0.0,
        act_bytes_per_token=float(MIB),
        kv_bytes_per_token=0.0,
        layers=1,
        hidden=1,
    )


def linear_cost(
    fwd: float = 1.0,
    bwd: float = 2.0,
    att_f: float = 0.0,
    att_b: float = 0.0,
    layers: int = 1,
    act: float = 1.0,
    params: int = 0,
) -> CostModel:
    """Seconds per token ``fwd``/``bwd`` (+ per pair ``att_*``), no constants, 1 byte/token."""
    return CostModel(
        fwd_lin=fwd,
        fwd_att=att_f,
        fwd_const=0.0,
        bwd_lin=bwd,
        bwd_att=att_b,
        bwd_const=0.0,
        act_bytes_per_token=act,
        kv_bytes_per_token=0.0,
        layers=layers,
        hidden=1,
        param_count=params,
    )


def kv_cost(recompute: str = "none", params: int = 0) -> CostModel:
    """4-token doc: F = 2*4 + 0.2*10 = 10 s (8 linear, 2 attention), B = 16 + 4 = 20 s;
    1 layer, 1 byte of activations and 1 GB of K/V per token."""
    c = linear_cost(fwd=2.0, bwd=4.0, att_f=0.2, att_b=0.4, params=params)
    return CostModel(**{**c.to_dict(), "kv_bytes_per_token": 1e9, "recompute": recompute})


def whole_doc_plan(per_rank: list[list[list[int]]], mode: str = "free") -> StepPlan:
    """``per_rank[r][i]`` lists document lengths in forward pack ``i`` of rank ``r``; each doc is
    one slice, backward packs mirror the forward packs, eager order."""
    docs: list[Document] = []
    ranks = []
    for r, packs in enumerate(per_rank):
        fwd = []
        for lengths in packs:
            slices = []
            for n in lengths:
                slices.append(Slice(len(docs), 0, n))
                docs.append(Document(doc_id=len(docs), length=n))
            fwd.append(MicroPack(tuple(slices)))
        ranks.append(RankStep(rank=r, forward=tuple(fwd), backward=tuple(fwd)))
    return StepPlan(
        step=0, strategy="test", docs=tuple(docs), ranks=tuple(ranks), mode=mode
    ).validate()


def merge_plan(length: int = 4, cut: int = 2) -> StepPlan:
    """A ``length``-token document shared by ranks 0 ([0, cut)) and 1 ([cut, length)) as one
    merge group (default: 4 tokens, shares of 2)."""
    doc = Document(doc_id=0, length=length)
    p0 = MicroPack((Slice(0, 0, cut),), merge=0)
    p1 = MicroPack((Slice(0, cut, length),), merge=0)
    ranks = (
        RankStep(rank=0, forward=(p0,), backward=(p0,)),
        RankStep(rank=1, forward=(p1,), backward=(p1,)),
    )
    return StepPlan(
        step=0, strategy="test", docs=(doc,), ranks=ranks, merges=(MergeGroup((0, 1), (0,)),)
    ).validate()
