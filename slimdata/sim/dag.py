"""Build the task graph of one step from a plan (design §7).

Tasks: one forward and one backward task per (pack, model chunk, DP rank); packs that run
together become one group task spanning their devices (DP-Merge packs inside their merge
group; with FSDP, pack ``i`` of every DP rank of a stage). Per-device orders come from the
pipeline schedule (:mod:`slimdata.sim.schedule`). Edges:

- slice continuation (design §4) on every chunk: forward of slice ``j`` after slice
  ``j - 1``; backward of slice ``j`` after slice ``j + 1``; a document's backward after its
  last forward;
- pipeline: a pack's forward on chunk ``c`` after chunk ``c - 1`` and its backward on ``c``
  after ``c + 1``, each lagged by the point-to-point transfer of its hidden states;
- synchronizing collectives: DDP's gradient all-reduce closes every device's step; FSDP packs
  and DP-Merge packs are group tasks (all members start together and leave together).

With static context parallelism (``SimConfig.cp = k > 1``, :mod:`slimdata.sim.cp`) every
task runs on one representative device per CP group: its work is a member's share, its
exposed K/V exchange is added as communication, and collective volumes and node spans are
those of the ``k`` real devices it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.plan import StepPlan
from slimdata.plan.pipeline import interleave
from slimdata.sim.comm import p2p_time, param_collective_time, spans_nodes
from slimdata.sim.config import SimConfig
from slimdata.sim.cp import (
    cp_packs,
    exchange_exposed,
    merge_attention_scale,
    merge_collectives,
    merge_layer_tokens,
    real_devices,
)
from slimdata.sim.engine import TaskGraph
from slimdata.sim.packs import PackTimes, chunk_fractions
from slimdata.sim.schedule import ready_index, stage_ops

__all__ = ["Durations", "StepDag", "build_dag", "common_order"]

Durations = dict[tuple[int, int, str, int], float]
"""Measured seconds keyed ``(chunk, rank, pass, pack)`` that replace the cost model's."""


@dataclass
class StepDag:
    graph: TaskGraph
    pt: PackTimes
    dp: int
    pp: int
    chunks: int
    fractions: np.ndarray
    ftid: np.ndarray
    """``[chunk, flat forward pack] -> task``."""
    btid: np.ndarray
    """``[chunk, flat backward pack] -> task``."""
    fwork: np.ndarray
    """``[chunk, flat forward pack] -> seconds`` (what the tasks use)."""
    bwork: np.ndarray
    transient: list[tuple[int, int, float]]
    """``(task, device, bytes)`` held only while a merge task runs (gathered K/V)."""
    p2p: np.ndarray
    """Point-to-point seconds sent by each device."""
    cp: int = 1
    """Static CP size: each device of the graph stands for ``cp`` identical devices."""

    def device(self, chunk: int, rank: int) -> int:
        return (chunk % self.pp) * self.dp + rank


def common_order(plan: StepPlan) -> tuple[tuple[str, int], ...]:
    """One order every rank can follow in lockstep: the most packs of any rank, and backward
    pack ``j`` after the latest forward any rank needs before it. Equals the ranks' own order
    when they all share it."""
    orders = {rs.order for rs in plan.ranks}
    if len(orders) == 1:
        return next(iter(orders))
    nf = max(len(rs.forward) for rs in plan.ranks)
    nb = max(len(rs.backward) for rs in plan.ranks)
    ready = [-1] * nb
    for rs in plan.ranks:
        for j, r in enumerate(ready_index(rs.order)):
            ready[j] = max(ready[j], r)
    for j in range(1, nb):
        ready[j] = max(ready[j], ready[j - 1])
    return interleave(nf, ready)


def _merge_index(plan: StepPlan) -> dict[tuple[int, str], int]:
    """``(rank, pass) -> index of that rank's merge pack``."""
    out: dict[tuple[int, str], int] = {}
    for rs in plan.ranks:
        for name, packs in (("F", rs.forward), ("B", rs.backward)):
            for i, p in enumerate(packs):
                if p.merge is not None:
                    out[(rs.rank, name)] = i
    return out


def build_dag(
    plan: StepPlan,
    cost: CostModel,
    pt: PackTimes,
    *,
    pp: int,
    ranks_per_node: int,
    config: SimConfig,
    durations: Durations | None = None,
) -> StepDag:
    dp = plan.dp
    v = config.chunks_per_device if pp > 1 else 1
    C = pp * v
    frac = chunk_fractions(cost.layers, C)
    net, rpn = config.interconnect, ranks_per_node
    layers = max(cost.layers, 1)
    fsdp = config.parallelism == "fsdp"
    cp = config.cp
    cpp = cp_packs(
        pt,
        cost,
        cp,
        net,
        recompute_full=cost.recompute == "full",
        overlap=config.cp_overlap,
    )
    doc_len = np.array([d.length for d in plan.docs], dtype=np.float64)
    merged = np.zeros(len(plan.docs), dtype=bool)
    merged[[d for m in plan.merges for d in m.docs]] = True
    f_scale, b_scale = merge_attention_scale(pt, doc_len, merged)
    fwork = frac[:, None] * (cpp.fwd + pt.f_att * (f_scale - 1) / cp)[None, :]
    bwork = frac[:, None] * (cpp.bwd + pt.b_att * (b_scale - 1) / cp)[None, :]
    if durations:
        offs = {"F": pt.f_offset, "B": pt.b_offset}
        for (c, r, kind, i), sec in durations.items():
            (fwork if kind == "F" else bwork)[c, offs[kind][r] + i] = sec
    merge_at = _merge_index(plan)
    merge_tokens = [merge_layer_tokens(plan, gi) for gi in range(len(plan.merges))]
    g = TaskGraph(n_devices=dp * pp)
    ftid = np.full((C, len(pt.fwd)), -1, dtype=np.int64)
    btid = np.full((C, len(pt.bwd)), -1, dtype=np.int64)
    transient: list[tuple[int, int, float]] = []
    keyed: dict[tuple, int] = {}

    def dev(c: int, r: int) -> int:
        return (c % pp) * dp + r

    def real(devs: list[int]) -> list[int]:
        return real_devices(devs, dp, cp)

    # [stage, group] -> does the CP group span nodes (row of CpPacks.*_comm)
    cp_row = np.array(
        [
            [int(len({d // rpn for d in real([s * dp + r])}) > 1) for r in range(dp)]
            for s in range(pp)
        ]
    )

    def cp_comm(c: int, r: int, kind: str, i: int) -> float:
        if cp == 1 or i >= n_packs(r, kind):
            return 0.0
        off = (pt.f_offset if kind == "F" else pt.b_offset)[r] + i
        arr = cpp.f_comm if kind == "F" else cpp.b_comm
        return float(frac[c] * arr[cp_row[c % pp, r], off])

    def cp_bytes(r: int, kind: str, i: int) -> float:
        if cp == 1 or i >= n_packs(r, kind):
            return 0.0
        off = (pt.f_offset if kind == "F" else pt.b_offset)[r] + i
        return float(cpp.f_layer_kv[off] if kind == "F" else 2 * cpp.b_layer_kv[off])

    def n_packs(r: int, kind: str) -> int:
        rs = plan.ranks[r]
        return len(rs.forward) if kind == "F" else len(rs.backward)

    def model_calls(r: int, kind: str, i: int) -> int:
        if i >= n_packs(r, kind):
            return 0
        calls = pt.f_calls if kind == "F" else pt.b_calls
        return int(calls[(pt.f_offset if kind == "F" else pt.b_offset)[r] + i])

    def pack_work(c: int, r: int, kind: str, i: int) -> float:
        if i >= n_packs(r, kind):
            return 0.0
        off = (pt.f_offset if kind == "F" else pt.b_offset)[r] + i
        return float((fwork if kind == "F" else bwork)[c, off])

    def merge_comm(c: int, gi: int, kind: str, m: int, j: int) -> tuple[float, float]:
        """Member ``m``'s exposed K/V exchange of its merge pack ``j`` (:mod:`slimdata.sim.cp`)
        and the bytes of one layer's gathered K/V of the group it holds meanwhile (the
        exchange is per layer, as under static CP)."""
        grp = plan.merges[gi]
        k = len(grp.ranks)
        tokens = float(merge_tokens[gi])
        devs = real([dev(c, r) for r in grp.ranks])
        off = (pt.f_offset if kind == "F" else pt.b_offset)[m] + j
        att = (pt.f_att[off] * f_scale[off]) if kind == "F" else (pt.b_att[off] * b_scale[off])
        nbytes = float(cost.gathered_kv_bytes(tokens))
        t = exchange_exposed(
            net,
            np.array([nbytes]),
            merge_collectives(kind, cost, bool(kind == "B" and pt.b_recomputed[off])),
            np.array([att]),
            k,
            layers,
            config.cp_overlap,
            spans_nodes(devs, rpn),
        )
        return float(frac[c] * t[0]), nbytes

    def param_comm(c: int, kind: str) -> float:
        devs = real([dev(c, r) for r in range(dp)])
        t = param_collective_time(
            net, cost, float(frac[c]), config.grad_bytes, devs, rpn, "all_gather"
        )
        return (
            t if kind == "F" else 2 * t
        )  # backward: re-gather parameters, reduce-scatter gradients

    def make(kind: str, c: int, r: int, i: int) -> int:
        merge = (
            (plan.ranks[r].forward if kind == "F" else plan.ranks[r].backward)[i].merge
            if i < n_packs(r, kind)
            else None
        )
        if fsdp:
            key: tuple = ("fsdp", kind, c, i)
        elif merge is not None:
            key = ("merge", kind, c, merge)
        else:
            key = (kind, c, r, i)
        if key in keyed:
            return keyed[key]
        if fsdp:
            members = list(range(dp))
        elif merge is not None:
            members = list(plan.merges[merge].ranks)
        else:
            members = [r]
        work, comm, extra = [], [], []
        for m in members:
            j = i if merge is None or fsdp else merge_at[(m, kind)]
            work.append(pack_work(c, m, kind, j))
            mg = plan.merge_of_rank(m)
            tagged = j < n_packs(m, kind) and merge_at.get((m, kind)) == j and mg is not None
            x = cp_comm(c, m, kind, j)
            if tagged and mg is not None:
                t, nbytes = merge_comm(c, mg, kind, m, j)
                comm.append(t + x)
                extra.append((dev(c, m), nbytes * (1 if kind == "F" else 2)))  # K/V (+ their grads)
            else:
                comm.append(x)
            if cp_bytes(m, kind, j) > 0:
                extra.append((dev(c, m), cp_bytes(m, kind, j)))
            off = (pt.f_offset if kind == "F" else pt.b_offset)[m]
            if j < n_packs(m, kind):
                (ftid if kind == "F" else btid)[c, off + j] = len(g)
        overlap = 0.0
        if fsdp and dp * cp > 1 and any(model_calls(m, kind, i) for m in range(dp)):
            t = param_comm(c, kind)  # a pack empty on every rank makes no call, no collective
            if config.overlap_param_comm:
                overlap = t
            else:
                comm = [x + t for x in comm]
        t_id = g.add(
            kind,
            (r if len(members) == 1 else -1, c, i),
            tuple(dev(c, m) for m in members),
            tuple(work),
            tuple(comm),
            overlap,
        )
        transient.extend((t_id, d, b) for d, b in extra)
        keyed[key] = t_id
        return t_id

    order_all = common_order(plan) if fsdp else None
    if fsdp:
        for gi, m in enumerate(plan.merges):
            for kind in ("F", "B"):
                idx = {merge_at[(r, kind)] for r in m.ranks}
                if len(idx) != 1:
                    raise PlanError(
                        f"FSDP lockstep: merge group {gi} runs its {kind} pack at different indices {sorted(idx)} on its members; align them"
                    )
    for r in range(dp):
        order = order_all or plan.ranks[r].order
        for s in range(pp):
            for kind, c, i in stage_ops(config.schedule, order, s, pp, v):
                g.place(dev(c, r), make(kind, c, r, i))

    # pipeline edges with point-to-point lags
    p2p = np.zeros(dp * pp)
    if C > 1:
        for r in range(dp):
            fo, bo = int(pt.f_offset[r]), int(pt.b_offset[r])
            for c in range(1, C):
                src, dst = dev(c - 1, r), dev(c, r)
                rs_, rd_ = real([src])[0], real([dst])[0]
                for i in range(len(plan.ranks[r].forward)):
                    lag = p2p_time(net, cost, pt.f_tokens[fo + i] / cp, rs_, rd_, rpn)
                    p2p[src] += lag
                    g.edge(int(ftid[c - 1, fo + i]), int(ftid[c, fo + i]), lag)
                for j in range(len(plan.ranks[r].backward)):
                    lag = p2p_time(net, cost, pt.b_tokens[bo + j] / cp, rd_, rs_, rpn)
                    p2p[dst] += lag
                    g.edge(int(btid[c, bo + j]), int(btid[c - 1, bo + j]), lag)

    # slice continuation (design §4) on every chunk
    o = np.lexsort((pt.s_start, pt.s_doc))
    same = pt.s_doc[o][1:] == pt.s_doc[o][:-1]
    last = np.ones(len(o), dtype=bool)
    last[:-1] = ~same
    for c in range(C):
        sf, sb = ftid[c][pt.s_fpack[o]], btid[c][pt.s_bpack[o]]
        pairs = np.concatenate(
            (
                np.stack((sf[:-1][same], sf[1:][same]), 1),  # F(j-1) -> F(j)
                np.stack((sb[1:][same], sb[:-1][same]), 1),  # B(j+1) -> B(j)
                np.stack((sf[last], sb[last]), 1),  # last F -> first B of a document
            )
        )
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        for a, b in np.unique(pairs, axis=0).tolist():
            g.edge(a, b)

    # DDP: gradient all-reduce closes each stage's step. Overlapped: buckets stream out
    # during the last backward pack of every rank, so it ends no earlier than the latest
    # last-pack end + latency and no earlier than the latest last-pack start + the all-reduce.
    if not fsdp and dp * cp > 1 and cost.param_count > 0:
        for s in range(pp):
            devs = [s * dp + r for r in range(dp)]
            share = float(frac[[c for c in range(C) if c % pp == s]].sum())
            t = param_collective_time(
                net, cost, share, config.grad_bytes, real(devs), rpn, "all_reduce"
            )
            if config.overlap_param_comm:
                ar = g.add("AR", (-1, s, -1), tuple(devs), (0.0,) * dp)
                g.hidden[ar] = t
                for d in devs:
                    if g.dev_seq[d]:
                        g.edge(g.dev_seq[d][-1], ar, net.latency_s)
                        g.start_edge(g.dev_seq[d][-1], ar, t)
            else:
                ar = g.add("AR", (-1, s, -1), tuple(devs), (0.0,) * dp, (t,) * dp)
            for d in devs:
                g.place(d, ar)
    return StepDag(
        graph=g,
        pt=pt,
        dp=dp,
        pp=pp,
        chunks=C,
        fractions=frac,
        ftid=ftid,
        btid=btid,
        fwork=fwork,
        bwork=bwork,
        transient=transient,
        p2p=p2p,
        cp=cp,
    )
