"""Build the task graph of one step from a plan (design §7).

Tasks: one forward and one backward task per (pack, model chunk, DP rank); packs that run
together become one group task spanning their devices (DP-Merge packs inside their merge
group; with FSDP, pack ``i`` of every DP rank of a stage). Per-device orders come from the
pipeline schedule (:mod:`slimdata.execution.schedule`). Edges:

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
from slimdata.execution import Collective, Programs
from slimdata.execution.compute import PackCompute
from slimdata.execution.pricing import PackTimes
from slimdata.plan import StepPlan
from slimdata.sim.comm import p2p_time, spans_nodes
from slimdata.sim.config import SimConfig
from slimdata.sim.cp import CpPacks, cp_packs, exchange_exposed, real_devices
from slimdata.sim.engine import TaskGraph

__all__ = ["Durations", "StepDag", "build_dag"]

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
    programs: Programs
    """The execution model the graph was built from (its allocations give the memory)."""
    p2p: np.ndarray
    """Point-to-point seconds sent by each device."""
    cp: int = 1
    """Static CP size: each device of the graph stands for ``cp`` identical devices."""

    def device(self, chunk: int, rank: int) -> int:
        return (chunk % self.pp) * self.dp + rank


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
    programs: Programs,
    *,
    ranks_per_node: int,
    config: SimConfig,
    durations: Durations | None = None,
) -> StepDag:
    """The task graph of ``programs`` (module docstring): every compute of every program
    becomes a task placed in program order, then the edges."""
    if config.parallelism == "fsdp":
        _check_merge_alignment(plan)
    cp_model = _cp_model(cost, programs, config)
    fwork, bwork = _chunk_work(programs, cp_model[1], durations)
    read = _ProgramOps.read(
        programs,
        sends=len(programs.fractions) > 1,
        merges=bool(plan.merges),
        params=config.parallelism == "fsdp",
    )
    tasks = _Tasks(plan, cost, programs, config, ranks_per_node, cp_model, (fwork, bwork), read)
    if plan.merges:
        _token_exchanges(tasks)
    for prog in programs:
        for op in prog.computes():
            tasks.graph.place(prog.device, tasks.make(op.pass_, op.chunk, prog.rank, op.pack))
    p2p = _pipeline_edges(tasks)
    _continuation_edges(tasks)
    _gradient_all_reduce(tasks)
    return StepDag(
        graph=tasks.graph,
        pt=programs.pt,
        dp=plan.dp,
        pp=programs.pp,
        chunks=tasks.n_chunks,
        fractions=programs.fractions,
        ftid=tasks.ftid,
        btid=tasks.btid,
        fwork=fwork,
        bwork=bwork,
        programs=programs,
        p2p=p2p,
        cp=programs.cp,
    )


def _check_merge_alignment(plan: StepPlan) -> None:
    merge_at = _merge_index(plan)
    for gi, m in enumerate(plan.merges):
        for kind in ("F", "B"):
            idx = {merge_at[(r, kind)] for r in m.ranks}
            if len(idx) != 1:
                raise PlanError(
                    f"FSDP lockstep: merge group {gi} runs its {kind} pack at different indices "
                    f"{sorted(idx)} on its members; align them"
                )


def _cp_model(
    cost: CostModel, programs: Programs, config: SimConfig
) -> tuple[CpPacks, PackCompute]:
    """Every pack's compute on one device (static CP member shares, merged slices' attention
    efficiency: :mod:`slimdata.execution.compute`) and its static-CP K/V exchange
    (:mod:`slimdata.sim.cp`)."""
    pt, compute = programs.pt, programs.compute
    cpp = cp_packs(
        pt,
        compute,
        cost,
        programs.cp,
        config.interconnect,
        programs.cp_gathers,
        overlap=config.cp_overlap,
    )
    return cpp, compute


def _chunk_work(
    programs: Programs, compute: PackCompute, durations: Durations | None
) -> tuple[np.ndarray, np.ndarray]:
    """``[chunk, flat pack] -> seconds`` of every forward and backward task: the pack's
    compute on one device (:func:`~slimdata.execution.compute.pack_compute`) times the
    chunk's share of the layers, replaced by measured ``durations`` where given."""
    pt, frac = programs.pt, programs.fractions
    fwork = frac[:, None] * compute.fwd[None, :]
    bwork = frac[:, None] * compute.bwd[None, :]
    if durations:
        offs = {"F": pt.f_offset, "B": pt.b_offset}
        for (c, r, kind, i), sec in durations.items():
            (fwork if kind == "F" else bwork)[c, offs[kind][r] + i] = sec
    return fwork, bwork


_OpKey = tuple[int, str, int, int]
"""``(rank, pass, chunk, pack)`` of a pack pass."""


@dataclass(frozen=True)
class _ProgramOps:
    """The collectives of the programs' pack passes that the simulator times, by
    ``(rank, pass, chunk, pack)``: the execution model says what each moves."""

    sends: dict[_OpKey, float]
    """Bytes of every pipeline ``send`` (a pack pass's hidden states to the next chunk)."""
    merges: dict[_OpKey, list[Collective]]
    """DP-Merge ``merge_kv_*`` collectives of a merge pack's pass, in program order."""
    params: dict[_OpKey, list[Collective]]
    """FSDP ``fsdp_*`` collectives of a pack pass."""

    @staticmethod
    def read(programs: Programs, *, sends: bool, merges: bool, params: bool) -> _ProgramOps:
        """Index the kinds asked for; none asked, no walk (programs with per-layer static-CP
        collectives are long)."""
        out = _ProgramOps({}, {}, {})
        kinds = frozenset(
            (("merge_kv_all_gather", "merge_kv_reduce_scatter") if merges else ())
            + (("fsdp_all_gather", "fsdp_reduce_scatter") if params else ())
        )
        for prog in programs if sends or kinds else ():
            rank = prog.rank
            if sends:
                out.sends.update(
                    {
                        (rank, op.pass_, op.chunk, op.pack): op.bytes
                        for op in prog.ops
                        if op.__class__ is Collective and op.kind == "send"
                    }
                )
            for op in [op for op in prog.ops if op.__class__ is Collective and op.kind in kinds]:
                key = (rank, op.pass_, op.chunk, op.pack)
                (out.merges if op.kind[0] == "m" else out.params).setdefault(key, []).append(op)
        return out


class _Tasks:
    """The graph under construction and how one pack pass becomes a task."""

    def __init__(
        self,
        plan: StepPlan,
        cost: CostModel,
        programs: Programs,
        config: SimConfig,
        rpn: int,
        cp_model: tuple[CpPacks, PackCompute],
        work: tuple[np.ndarray, np.ndarray],
        ops: _ProgramOps,
    ) -> None:
        self.plan, self.cost, self.config, self.rpn = plan, cost, config, rpn
        self.programs, self.pt, self.frac = programs, programs.pt, programs.fractions
        self.dp, self.pp, self.cp = plan.dp, programs.pp, programs.cp
        self.n_chunks = len(self.frac)
        self.net, self.fsdp = config.interconnect, config.parallelism == "fsdp"
        self.fwork, self.bwork = work
        self.offsets = {"F": self.pt.f_offset.tolist(), "B": self.pt.b_offset.tolist()}
        """Per pass, each rank's first flat pack (Python ints: read for every pack pass)."""
        self.graph = TaskGraph(n_devices=self.dp * self.pp)
        self.ftid = np.full((self.n_chunks, len(self.pt.fwd)), -1, dtype=np.int64)
        self.btid = np.full((self.n_chunks, len(self.pt.bwd)), -1, dtype=np.int64)
        self.keyed: dict[tuple, int] = {}
        self.ops = ops
        self.merge_at = _merge_index(plan)
        self.group_of = [plan.merge_of_rank(r) for r in range(plan.dp)]
        self.cpp, self.compute = cp_model
        # [stage, group] -> does the CP group span nodes (row of CpPacks.*_comm)
        self.cp_row = np.array(
            [
                [
                    int(len({d // rpn for d in self.real([s * self.dp + r])}) > 1)
                    for r in range(self.dp)
                ]
                for s in range(self.pp)
            ]
        )

    def dev(self, c: int, r: int) -> int:
        return (c % self.pp) * self.dp + r

    def real(self, devs: list[int]) -> list[int]:
        return real_devices(devs, self.dp, self.cp)

    def n_packs(self, r: int, kind: str) -> int:
        rs = self.plan.ranks[r]
        return len(rs.forward) if kind == "F" else len(rs.backward)

    def offset(self, r: int, kind: str) -> int:
        return self.offsets[kind][r]

    def cp_comm(self, c: int, r: int, kind: str, i: int) -> float:
        """Exposed static-CP K/V exchange of a pack (:func:`slimdata.sim.cp.cp_packs`)."""
        if self.cp == 1 or i >= self.n_packs(r, kind):
            return 0.0
        arr = self.cpp.f_comm if kind == "F" else self.cpp.b_comm
        return float(self.frac[c] * arr[self.cp_row[c % self.pp, r], self.offset(r, kind) + i])

    def pack_work(self, c: int, r: int, kind: str, i: int) -> float:
        if i >= self.n_packs(r, kind):
            return 0.0
        return float((self.fwork if kind == "F" else self.bwork)[c, self.offset(r, kind) + i])

    def merge_comm(self, c: int, gi: int, kind: str, m: int, j: int) -> float:
        """Member ``m``'s exposed K/V exchange of its merge pack ``j`` (:mod:`slimdata.sim.cp`;
        the exchange is per layer, as under static CP). On top of static CP ``k`` the ring
        spans every process of the members (``k`` each), and what hides it is one process's
        attention as the execution model prices it (``PackCompute.f_merge_att``: its share
        of the padded slices' pairs, merged slices' chunk efficiency)."""
        ops = self.ops.merges.get((m, kind, c, j))
        if not ops:  # a chunk without layers exchanges nothing
            return 0.0
        grp = self.plan.merges[gi]
        devs = self.real([self.dev(c, r) for r in grp.ranks])
        off = self.offset(m, kind) + j
        att = (self.compute.f_merge_att if kind == "F" else self.compute.b_merge_att)[off]
        # the program's per-layer K/V collectives of this pass: each layer's alike
        per_layer = len(ops) // len({op.layer for op in ops})
        t = exchange_exposed(
            self.net,
            np.array([ops[0].bytes]),
            per_layer,
            np.array([att]),
            len(devs),
            max(self.cost.layers, 1),
            self.config.cp_overlap,
            spans_nodes(devs, self.rpn),
        )
        return float(self.frac[c] * t[0])

    def param_comm(self, c: int, kind: str, i: int) -> float:
        """FSDP: seconds of the program's parameter collectives of pack pass ``i`` (the same
        on every rank), over the real devices of the stage."""
        devs = self.real([self.dev(c, r) for r in range(self.dp)])
        spans = spans_nodes(devs, self.rpn)
        params = self.ops.params
        ops = next((params[k] for r in range(self.dp) if (k := (r, kind, c, i)) in params), [])
        return sum(
            getattr(self.net, op.kind[len("fsdp_") :])(op.bytes, len(devs), spans) for op in ops
        )

    def members(self, kind: str, r: int, i: int) -> tuple[tuple, list[int]]:
        """Key of the task a pack pass belongs to and the ranks running it together."""
        merge = (
            (self.plan.ranks[r].forward if kind == "F" else self.plan.ranks[r].backward)[i].merge
            if i < self.n_packs(r, kind)
            else None
        )
        if self.fsdp:
            return ("fsdp", kind, i), list(range(self.dp))
        if merge is not None:
            return ("merge", kind, merge), list(self.plan.merges[merge].ranks)
        return (kind, r, i), [r]

    def make(self, kind: str, c: int, r: int, i: int) -> int:
        """The task of pass ``kind`` of pack ``i`` of rank ``r`` on chunk ``c`` (one per group
        of ranks running it together), created on first use."""
        key, members = self.members(kind, r, i)
        key = (*key, c)
        if key in self.keyed:
            return self.keyed[key]
        merged = key[0] == "merge"
        work, comm = [], []
        for m in members:
            j = self.merge_at[(m, kind)] if merged else i
            work.append(self.pack_work(c, m, kind, j))
            mg = self.group_of[m]
            tagged = (
                j < self.n_packs(m, kind) and self.merge_at.get((m, kind)) == j and mg is not None
            )
            x = self.cp_comm(c, m, kind, j)
            comm.append(
                x + (self.merge_comm(c, mg, kind, m, j) if tagged and mg is not None else 0.0)
            )
            if j < self.n_packs(m, kind):
                (self.ftid if kind == "F" else self.btid)[c, self.offset(m, kind) + j] = len(
                    self.graph
                )
        overlap = 0.0
        if self.fsdp:
            t = self.param_comm(c, kind, i)  # a pack empty on every rank makes no call, none
            if self.config.overlap_param_comm:
                overlap = t
            else:
                comm = [x + t for x in comm]
        t_id = self.graph.add(
            kind,
            (r if len(members) == 1 else -1, c, i),
            tuple(self.dev(c, m) for m in members),
            tuple(work),
            tuple(comm),
            overlap,
        )
        self.keyed[key] = t_id
        return t_id


def _pipeline_edges(tasks: _Tasks) -> np.ndarray:
    """A pack's forward on chunk ``c`` after chunk ``c - 1``, its backward on ``c`` after
    ``c + 1``, each lagged by the point-to-point transfer; returns seconds sent per device."""
    sent = [0.0] * (tasks.dp * tasks.pp)
    if tasks.n_chunks == 1:
        return np.array(sent)
    g, net, rpn, sends = tasks.graph, tasks.net, tasks.rpn, tasks.ops.sends
    ftid, btid = tasks.ftid.tolist(), tasks.btid.tolist()
    for r in range(tasks.dp):
        fo, bo = tasks.offset(r, "F"), tasks.offset(r, "B")
        for c in range(1, tasks.n_chunks):
            src, dst = tasks.dev(c - 1, r), tasks.dev(c, r)
            rs_, rd_ = tasks.real([src])[0], tasks.real([dst])[0]
            for i in range(tasks.n_packs(r, "F")):  # chunk c - 1's send of forward pack i
                lag = p2p_time(net, sends[(r, "F", c - 1, i)], rs_, rd_, rpn)
                sent[src] += lag
                g.edge(ftid[c - 1][fo + i], ftid[c][fo + i], lag)
            for j in range(tasks.n_packs(r, "B")):  # chunk c's send of backward pack j
                lag = p2p_time(net, sends[(r, "B", c, j)], rd_, rs_, rpn)
                sent[dst] += lag
                g.edge(btid[c][bo + j], btid[c - 1][bo + j], lag)
    return np.array(sent)


def _continuation_edges(tasks: _Tasks) -> None:
    """Slice continuation (design §4) on every chunk: forward of slice ``j`` after ``j - 1``,
    backward of ``j`` after ``j + 1``, a document's first backward after its last forward."""
    pt = tasks.pt
    o = np.lexsort((pt.s_start, pt.s_doc))
    same = pt.s_doc[o][1:] == pt.s_doc[o][:-1]
    last = np.ones(len(o), dtype=bool)
    last[:-1] = ~same
    for c in range(tasks.n_chunks):
        sf, sb = tasks.ftid[c][pt.s_fpack[o]], tasks.btid[c][pt.s_bpack[o]]
        pairs = np.concatenate(
            (
                np.stack((sf[:-1][same], sf[1:][same]), 1),  # F(j-1) -> F(j)
                np.stack((sb[1:][same], sb[:-1][same]), 1),  # B(j+1) -> B(j)
                np.stack((sf[last], sb[last]), 1),  # last F -> first B of a document
            )
        )
        pairs = pairs[pairs[:, 0] != pairs[:, 1]]
        for a, b in np.unique(pairs, axis=0).tolist():
            tasks.graph.edge(a, b)


def _token_exchanges(tasks: _Tasks) -> None:
    """DP-Merge: each merge group's exchange of its documents' token ids and loss masks, the
    first operation of its members' programs (``merge_tokens_all_gather``), one all-gather
    task on their devices of each stage, before any pack pass."""
    g, net = tasks.graph, tasks.net
    made: set[tuple[int, ...]] = set()
    for prog in tasks.programs:
        op = prog.ops[0] if prog.ops else None
        if not (op.__class__ is Collective and op.kind == "merge_tokens_all_gather"):
            continue
        if op.group in made:
            continue
        made.add(op.group)
        real = tasks.real(list(op.group))
        t = net.all_gather(op.bytes, len(real), spans_nodes(real, tasks.rpn))
        n = len(op.group)
        task = g.add("TG", (-1, prog.stage, -1), op.group, (0.0,) * n, (t,) * n)
        for d in op.group:
            g.place(d, task)


def _gradient_all_reduce(tasks: _Tasks) -> None:
    """DDP: the program's gradient all-reduce closes each stage's step. Overlapped: buckets
    stream out during the last backward pack of every rank, so it ends no earlier than the
    latest last-pack end + latency and no earlier than the latest last-pack start + the
    all-reduce."""
    g, net = tasks.graph, tasks.net
    for s in range(tasks.pp):
        ops = [op for op in tasks.programs[(0, s)].collectives() if op.kind == "ddp_all_reduce"]
        if not ops:
            continue
        devs = list(ops[0].group)
        real = tasks.real(devs)
        t = net.all_reduce(ops[0].bytes, len(real), spans_nodes(real, tasks.rpn))
        n = len(devs)
        if tasks.config.overlap_param_comm:
            ar = g.add("AR", (-1, s, -1), tuple(devs), (0.0,) * n)
            g.hidden[ar] = t
            for d in devs:
                if g.dev_seq[d]:
                    g.edge(g.dev_seq[d][-1], ar, net.latency_s)
                    g.start_edge(g.dev_seq[d][-1], ar, t)
        else:
            ar = g.add("AR", (-1, s, -1), tuple(devs), (0.0,) * n, (t,) * n)
        for d in devs:
            g.place(d, ar)
