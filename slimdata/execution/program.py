"""Build the :class:`~slimdata.execution.ops.Program` of every device of a step.

Per DP rank and pipeline stage, the operations in the order the device runs them:

- the pack order is the pipeline schedule of the rank's plan order
  (:func:`slimdata.execution.schedule.stage_ops`; under FSDP every rank follows
  :func:`~slimdata.execution.schedule.common_order`);
- how each pack runs (model calls, graph-free forwards, recomputed backwards) is the
  executor's rule (:func:`slimdata.plan.execution`), and its price is what one device
  computes of it (:func:`slimdata.execution.compute.pack_compute`: the cost model's
  :func:`~slimdata.execution.pricing.pack_times`, a static-CP member's share, merged
  slices' chunk efficiency) times the chunk's share of the layers;
- around every compute: pipeline ``recv`` / ``send`` of its hidden states, FSDP's parameter
  all-gather (and gradient reduce-scatter in the backward), a merge pack's per-layer K/V
  all-gathers (and K/V-gradient reduce-scatters in the backward,
  :func:`slimdata.execution.merge.merge_collectives`), under static CP every model call's
  per-layer K/V all-gathers (re-gathers and K/V-gradient reduce-scatters in the backward,
  :func:`slimdata.execution.cp.cp_pass_gathers`); DDP's gradient all-reduce ends the step;
- memory (the one rule, :mod:`slimdata.execution.memory`): a slice's activations and its
  retained K/V are allocated when its forward starts and freed when its backward pack ends;
  a graph-free forward holds the activations only while it runs, and its recomputing
  backward allocates them again; a context-parallel pass (merge pack, static CP) holds one
  layer's gathered K/V while it runs (static CP: its largest call's), twice that in the
  backward (K/V and their gradients). With static CP (``cp = k``) a device holds ``1 / k``
  of every slice's bytes.

Under static CP a device (``stage * dp + rank``) stands for the ``cp`` processes of its CP
group (:func:`slimdata.sim.cp.real_devices` maps it to them): collective groups name devices,
and a CP group's K/V collectives name the one device of that group.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel, causal_pairs
from slimdata.errors import ConfigError
from slimdata.execution.compute import PackCompute, pack_compute, padded
from slimdata.execution.cp import PassGathers, cp_pass_gathers
from slimdata.execution.memory import gathered_kv_held
from slimdata.execution.merge import merge_collectives, merge_layer_tokens, merge_token_bytes
from slimdata.execution.ops import Alloc, Collective, Compute, Free, Operation, Program
from slimdata.execution.pricing import PackTimes, chunk_fractions, pack_times
from slimdata.execution.schedule import (
    INTERLEAVED_CHUNKS,
    SCHEDULES,
    chunks_per_device,
    common_order,
    stage_ops,
)
from slimdata.plan import StepPlan

__all__ = ["ExecutionConfig", "Programs", "build_programs", "pack_prices", "padded"]


@dataclass(frozen=True, kw_only=True)
class ExecutionConfig:
    """How a plan is executed: the layout dimensions and runtime rules the program depends on."""

    pp: int = 1
    """Pipeline stages."""
    parallelism: str = "ddp"
    """``"ddp"`` (gradients all-reduced at the end of the step) or ``"fsdp"`` (lockstep
    rules: parameters gathered per pack pass, gradients reduce-scattered per backward)."""
    split: bool = True
    """Outside FSDP: forward packs split by backward pack (``run_step(asymmetric="split")``,
    its default) instead of recomputing asymmetric backward packs."""
    schedule: str = "1f1b"
    """Pipeline schedule (:data:`slimdata.execution.schedule.SCHEDULES`)."""
    virtual_stages: int = INTERLEAVED_CHUNKS
    """Model chunks per device under the ``"interleaved"`` schedule with ``pp > 1`` (default
    :data:`~slimdata.execution.schedule.INTERLEAVED_CHUNKS`); unused otherwise."""
    cp: int = 1
    """Static context parallelism: each device stands for ``cp`` members holding 1/cp each."""
    grad_bytes: int = 2
    """Bytes per parameter of the gradient / parameter collectives."""
    fsdp_keeps_graphs: bool = True
    """Under ``"fsdp"``: FSDP2 (``fully_shard``), whose backward pack that is a union of
    forward packs runs through the graphs they kept; ``False``: FSDP1
    (``FullyShardedDataParallel``), which frees its gathered parameters after a forward, so
    the executor recomputes every backward pack's forward first
    (:func:`slimdata.plan.lockstep_schedule` with ``keep=False``)."""

    def __post_init__(self) -> None:
        if self.parallelism not in ("ddp", "fsdp"):
            raise ConfigError(f"parallelism={self.parallelism!r}: use 'ddp' or 'fsdp'")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r}: use one of {', '.join(SCHEDULES)}")
        if min(self.pp, self.virtual_stages, self.cp, self.grad_bytes) < 1:
            raise ConfigError(
                f"pp={self.pp}, virtual_stages={self.virtual_stages}, cp={self.cp}, "
                f"grad_bytes={self.grad_bytes}: each must be at least 1"
            )

    @property
    def chunks_per_device(self) -> int:
        """Model chunks each device holds (:func:`~slimdata.execution.schedule.chunks_per_device`:
        1 unless interleaved on a pipeline)."""
        return chunks_per_device(self.schedule, self.pp, self.virtual_stages)

    @property
    def ranks_meet_every_pass(self) -> bool:
        """FSDP on one stage: every pass first gathers the parameters from all ranks, so the
        ranks meet before each one (:func:`~slimdata.execution.critical.critical_path`'s
        ``lockstep``)."""
        return self.parallelism == "fsdp" and self.pp == 1


def pack_prices(
    plan: StepPlan, cost: CostModel, config: ExecutionConfig | None = None
) -> tuple[PackTimes, PackCompute]:
    """Every pack of ``plan`` at the execution model's price, the one price of a pack: run by
    the executor's rules of ``config`` (:func:`~slimdata.execution.pricing.pack_times`:
    FSDP's plan-global rules, else split calls or recomputes; per-call constants, graph-free
    forwards, padding calls) as one device computes it
    (:func:`~slimdata.execution.compute.pack_compute`: a static-CP member's share, merged
    slices' chunk efficiency). The simulator's computes, the planner's estimate
    (:func:`~slimdata.execution.critical.plan_critical_path`) and the seconds a solved plan
    records per pack (``MicroPack.cost``, :func:`slimdata.solver.common.assemble_plan`) are
    these."""
    config = config or ExecutionConfig()
    pt = pack_times(
        plan,
        cost,
        lockstep=config.parallelism == "fsdp",
        split=config.split,
        keep=config.fsdp_keeps_graphs,
    )
    return pt, pack_compute(pt, plan, config.cp)


@dataclass(frozen=True)
class Programs:
    """Every device's program of one step, and the pricing they were built from."""

    programs: dict[tuple[int, int], Program]
    """``(rank, stage) -> Program``."""
    pt: PackTimes
    compute: PackCompute
    """Every pack's compute on one device (its computes take these times the chunk's share)."""
    fractions: np.ndarray
    """Share of the model's layers in every global chunk."""
    dp: int
    pp: int
    cp_gathers: PassGathers | None = None
    """Static CP (``cp > 1``): every pack pass's K/V gathers (None for ``cp == 1`` and
    ``compute_only`` builds)."""
    cp: int = 1
    """Static CP the programs were built for (``ExecutionConfig.cp``)."""

    def __getitem__(self, key: tuple[int, int]) -> Program:
        return self.programs[key]

    def __iter__(self) -> Iterator[Program]:
        return iter(self.programs.values())


def build_programs(
    plan: StepPlan,
    cost: CostModel,
    config: ExecutionConfig | None = None,
    *,
    compute_only: bool = False,
    memory_only: bool = False,
    ranks: Collection[int] | None = None,
) -> Programs:
    """The program of every (rank, stage) of ``plan`` (module docstring). ``compute_only``:
    list the computes alone (their order and prices, e.g. for a time estimate; much faster).
    ``memory_only``: the computes and their allocations and frees, no collectives (what
    :mod:`slimdata.execution.memory` reads: the same levels and peak, e.g. for a planner's
    memory check; per-layer K/V collectives make the full programs long). ``ranks``: the
    programs of those ranks only (per-rank rules: each rank's programs read its own packs;
    under FSDP's plan-global rules every rank's are built)."""
    config = config or ExecutionConfig()
    fsdp = config.parallelism == "fsdp"
    pt, prices = pack_prices(plan, cost, config)
    ranks = None if fsdp or ranks is None else frozenset(ranks)
    gathers = (
        cp_pass_gathers(
            plan,
            config.cp,
            lockstep=fsdp,
            split=config.split,
            ranks=ranks,
            keep=config.fsdp_keeps_graphs,
        )
        if config.cp > 1 and not compute_only
        else None
    )
    b = _Builder(plan, cost, config, pt, prices, gathers, memory_only=memory_only)
    order_all = common_order(plan) if fsdp else None
    programs = {}
    for r in range(plan.dp) if ranks is None else sorted(ranks):
        order = order_all or plan.ranks[r].order
        for s in range(config.pp):
            ops: list[Operation] = [] if compute_only or memory_only else [*b.step_start(s, r)]
            for kind, c, i in stage_ops(config.schedule, order, s, config.pp, b.v):
                if compute_only:
                    if i < b.side[kind].n_packs[r]:
                        ops.append(b.compute(kind, c, r, i))
                else:
                    ops.extend(b.pass_ops(kind, c, r, i))
            if not (compute_only or memory_only):
                ops.extend(b.step_end(s))
            programs[(r, s)] = Program(r, s, b.device(s, r), tuple(ops))
    return Programs(programs, pt, b.prices, b.frac, plan.dp, config.pp, gathers, config.cp)


@dataclass(frozen=True)
class _Side:
    """Per flat pack of one pass (forward or backward), as plain lists for fast lookup."""

    offset: list[int]
    n_packs: list[int]
    seconds: list[float]
    tokens: list[int]
    pairs: list[float]
    calls: list[int]
    flag: list[bool]
    """Forward: graph-free; backward: recomputed."""
    merge: list[int | None]
    slices: list[int]
    act: list[float]
    """Activation bytes of the pack's slices (full model)."""
    kv: list[float]
    """Retained K/V bytes of the pack's slices (full model)."""
    act_rebuilt: list[float]
    """Backward: activation bytes of its slices whose forward ran graph-free."""

    @staticmethod
    def build(plan: StepPlan, pt: PackTimes, kind: str, seconds: np.ndarray) -> _Side:
        """Pass ``kind``'s packs of ``plan``, each taking ``seconds`` on one device."""
        fwd = kind == "F"
        pack_of = pt.s_fpack if fwd else pt.s_bpack
        n = len(pt.fwd if fwd else pt.bwd)
        pairs = causal_pairs(pt.s_start, pt.s_end)
        free = pt.f_graph_free[pt.s_fpack]
        return _Side(
            offset=(pt.f_offset if fwd else pt.b_offset).tolist(),
            n_packs=[len(rs.forward if fwd else rs.backward) for rs in plan.ranks],
            seconds=seconds.tolist(),
            tokens=np.rint(pt.f_tokens if fwd else pt.b_tokens).astype(int).tolist(),
            pairs=np.bincount(pack_of, pairs, n).tolist(),
            calls=(pt.f_calls if fwd else pt.b_calls).tolist(),
            flag=(pt.f_graph_free if fwd else pt.b_recomputed).tolist(),
            merge=[p.merge for rs in plan.ranks for p in (rs.forward if fwd else rs.backward)],
            slices=np.bincount(pack_of, minlength=n).tolist(),
            act=np.bincount(pack_of, pt.s_act, n).tolist(),
            kv=np.bincount(pack_of, pt.s_kv, n).tolist(),
            act_rebuilt=np.bincount(pack_of, np.where(free, pt.s_act, 0.0), n).tolist(),
        )


class _Builder:
    """The per-pass operations of one plan (shared lookups of :func:`build_programs`)."""

    def __init__(
        self,
        plan: StepPlan,
        cost: CostModel,
        config: ExecutionConfig,
        pt: PackTimes,
        prices: PackCompute,
        gathers: PassGathers | None,
        *,
        memory_only: bool = False,
    ):
        self.plan, self.cost, self.config, self.pt, self.prices = plan, cost, config, pt, prices
        self.gathers, self.memory_only = gathers, memory_only
        self.kv_per_token = float(cost.gathered_kv_bytes(1))
        self.dp, self.pp, self.v = plan.dp, config.pp, config.chunks_per_device
        self.n_chunks = config.pp * self.v
        self.frac = chunk_fractions(cost.layers, self.n_chunks)
        self.frac_list = self.frac.tolist()
        self.fsdp = config.parallelism == "fsdp"
        self.side = {
            "F": _Side.build(plan, pt, "F", self.prices.fwd),
            "B": _Side.build(plan, pt, "B", self.prices.bwd),
        }
        self.merge_tokens = [
            merge_layer_tokens(plan, g, config.cp) for g in range(len(plan.merges))
        ]
        self.merge_kv = [float(cost.gathered_kv_bytes(t)) for t in self.merge_tokens]
        # the chunks' layers, a partition of the model's (at least one): with fewer layers
        # than chunks (2 over 4) some chunks hold none, not every chunk rint(0.5) = 0
        ends = np.rint(np.cumsum(self.frac) * max(cost.layers, 1)).astype(int)
        self.first_layer = np.concatenate(([0], ends[:-1])).tolist()
        self.layer_count = np.diff(ends, prepend=0).tolist()
        self.calls_anywhere = {
            kind: {
                i
                for r in range(self.dp)
                for i in range(self.side[kind].n_packs[r])
                if self.side[kind].calls[self.side[kind].offset[r] + i]
            }
            for kind in "FB"
        }
        self.stage_groups = [
            tuple(self.device(s, r) for r in range(self.dp)) for s in range(self.pp)
        ]

    def device(self, stage: int, rank: int) -> int:
        return stage * self.dp + rank

    def pass_ops(self, kind: str, c: int, r: int, i: int) -> list[Operation]:
        """Receive, gather, allocate, compute, free, scatter, send: one pass of pack ``i``."""
        if i >= self.side[kind].n_packs[r]:  # FSDP: a slot of the common order this rank lacks
            return [Compute(kind, c, i, 0.0, 0, 0.0, 0)] if self.fsdp else []
        dev = self.device(c % self.pp, r)
        k = self.side[kind].offset[r] + i
        talk = not self.memory_only  # the collectives (memory_only: none)
        before: list[Operation] = (
            [*self.receive(kind, c, r, k, dev), *self.param_gather(kind, c, i)] if talk else []
        )
        after: list[Operation] = []
        for alloc in self.transient(kind, k):
            before.append(alloc)
            after.append(Free(alloc.what, alloc.bytes))
        if talk:
            before.extend(self.merge_exchange(kind, c, i, k))
            before.extend(self.cp_exchange(kind, c, i, k, dev))
        before.extend(self.slice_allocs(kind, c, k))
        after.extend(self.slice_frees(kind, c, k))
        if talk:
            after.extend(self.param_scatter(kind, c, i))
            after.extend(self.send(kind, c, r, k, dev))
        return [*before, self.compute(kind, c, r, i), *after]

    def compute(self, kind: str, c: int, r: int, i: int) -> Compute:
        side = self.side[kind]
        k = side.offset[r] + i
        return Compute(
            pass_=kind,
            chunk=c,
            pack=i,
            seconds=self.frac_list[c] * side.seconds[k],
            tokens=side.tokens[k],
            pairs=side.pairs[k],
            calls=side.calls[k],
            graph_free=kind == "F" and side.flag[k],
            recompute=kind == "B" and side.flag[k],
            merge=side.merge[k],
        )

    def slice_allocs(self, kind: str, c: int, k: int) -> list[Operation]:
        """Forward: the activations and K/V of the pack's slices; backward: the activations
        of its slices whose forward ran graph-free (the recompute rebuilds them)."""
        side, share = self.side[kind], self.frac_list[c] / self.config.cp
        if not side.slices[k]:
            return []
        if kind == "F":
            return [Alloc("activations", side.act[k] * share), Alloc("kv", side.kv[k] * share)]
        rebuilt = side.act_rebuilt[k] * share
        return [Alloc("activations", rebuilt)] if rebuilt else []

    def slice_frees(self, kind: str, c: int, k: int) -> list[Operation]:
        """Forward: a graph-free pass drops its activations; backward: the activations and
        K/V of the pack's slices go."""
        side, share = self.side[kind], self.frac_list[c] / self.config.cp
        if not side.slices[k]:
            return []
        if kind == "B":
            return [Free("activations", side.act[k] * share), Free("kv", side.kv[k] * share)]
        return [Free("activations", side.act[k] * share)] if side.flag[k] else []

    def transient(self, kind: str, k: int) -> list[Alloc]:
        """One layer's gathered K/V while the pass runs, twice in the backward
        (:func:`~slimdata.execution.memory.gathered_kv_held`)."""
        side = self.side[kind]
        out = []
        g = side.merge[k]
        if g is not None:
            out.append(
                Alloc(
                    "gathered_kv", gathered_kv_held(self.kv_per_token, self.merge_tokens[g], kind)
                )
            )
        tokens = self.gathers.largest(kind, k) if self.gathers is not None else 0
        if tokens:
            out.append(Alloc("gathered_kv", gathered_kv_held(self.kv_per_token, tokens, kind)))
        return out

    def merge_exchange(self, kind: str, c: int, i: int, k: int) -> list[Collective]:
        """A merge pack's per-layer K/V collectives over its group, in the runtime's order
        (:mod:`slimdata.hooks.merge`)."""
        g = self.side[kind].merge[k]
        if g is None:
            return []
        group = tuple(self.device(c % self.pp, m) for m in sorted(self.plan.merges[g].ranks))
        nbytes = self.merge_kv[g]
        layers = range(self.first_layer[c], self.first_layer[c] + self.layer_count[c])
        if kind == "F":
            return [Collective("merge_kv_all_gather", group, nbytes, kind, c, i, x) for x in layers]
        recomputed = self.side[kind].flag[k]
        # a recomputed pack re-runs its whole forward first (one gather per layer); then
        # per layer, last first: gathers (one more inside a checkpointed layer under
        # recompute="full") and the K/V-gradient reduce-scatter
        out = [
            Collective("merge_kv_all_gather", group, nbytes, kind, c, i, x)
            for x in (layers if recomputed else ())
        ]
        per_layer = merge_collectives(kind, recomputed) - 1 - int(recomputed)
        for x in reversed(layers):
            out.extend(
                Collective("merge_kv_all_gather", group, nbytes, kind, c, i, x)
                for _ in range(per_layer)
            )
            out.append(Collective("merge_kv_reduce_scatter", group, nbytes, kind, c, i, x))
        return out

    def cp_exchange(self, kind: str, c: int, i: int, k: int, dev: int) -> list[Collective]:
        """Static CP: every model call's per-layer K/V collectives over device ``dev``'s CP
        group, in the runtime's order (:mod:`slimdata.hooks.cp`): the forward gathers per
        call and layer; the backward re-runs a recomputed pack's forward first (a gather per
        layer), then per call and layer, last first, gathers again (the attention is
        checkpointed) and reduce-scatters the K/V gradient."""
        if self.gathers is None:
            return []
        calls = (self.gathers.forward if kind == "F" else self.gathers.backward)[k]
        layers = range(self.first_layer[c], self.first_layer[c] + self.layer_count[c])
        group, ag, rs = (dev,), "cp_kv_all_gather", "cp_kv_reduce_scatter"
        per_token = self.kv_per_token  # CostModel.gathered_kv_bytes of one token, one layer
        out: list[Collective] = []
        if kind == "F" or self.gathers.recomputed[k]:
            for t in calls:
                out.extend(Collective(ag, group, per_token * t, kind, c, i, x) for x in layers)
        if kind == "F":
            return out
        for t in calls:
            nbytes = per_token * t
            for x in reversed(layers):
                out.append(Collective(ag, group, nbytes, kind, c, i, x))
                out.append(Collective(rs, group, nbytes, kind, c, i, x))
        return out

    def param_bytes(self, c: int) -> float:
        return float(self.cost.param_count * self.frac_list[c] * self.config.grad_bytes)

    def param_gather(self, kind: str, c: int, i: int) -> list[Collective]:
        """FSDP: a pack's parameters are gathered on every rank unless no rank calls it."""
        if not self.fsdp or i not in self.calls_anywhere[kind]:
            return []
        group = self.stage_groups[c % self.pp]
        return [Collective("fsdp_all_gather", group, self.param_bytes(c), kind, c, i)]

    def param_scatter(self, kind: str, c: int, i: int) -> list[Collective]:
        if kind == "F" or not self.fsdp or i not in self.calls_anywhere[kind]:
            return []
        group = self.stage_groups[c % self.pp]
        return [Collective("fsdp_reduce_scatter", group, self.param_bytes(c), kind, c, i)]

    def hidden_bytes(self, kind: str, k: int) -> float:
        tokens = self.side[kind].tokens[k]
        return float(tokens / self.config.cp * self.cost.hidden * self.cost.dtype_bytes)

    def neighbour(self, kind: str, c: int, towards: str) -> int | None:
        """Chunk a pass receives from (``"in"``) or sends to (``"out"``): forward flows up
        the chunks, backward down."""
        step = 1 if (kind == "F") == (towards == "out") else -1
        n = c + step
        return n if 0 <= n < self.n_chunks else None

    def receive(self, kind: str, c: int, r: int, k: int, dev: int) -> list[Collective]:
        src = self.neighbour(kind, c, "in")
        if src is None:
            return []
        pair = (self.device(src % self.pp, r), dev)
        i = k - self.side[kind].offset[r]
        return [Collective("recv", pair, self.hidden_bytes(kind, k), kind, c, i)]

    def send(self, kind: str, c: int, r: int, k: int, dev: int) -> list[Collective]:
        dst = self.neighbour(kind, c, "out")
        if dst is None:
            return []
        pair = (dev, self.device(dst % self.pp, r))
        i = k - self.side[kind].offset[r]
        return [Collective("send", pair, self.hidden_bytes(kind, k), kind, c, i)]

    def step_start(self, stage: int, rank: int) -> list[Collective]:
        """A merge member: its group's token ids and loss masks gathered before any pack runs
        (:func:`~slimdata.execution.merge.merge_token_bytes`)."""
        g = self.plan.merge_of_rank(rank)
        if g is None:
            return []
        group = tuple(self.device(stage, r) for r in sorted(self.plan.merges[g].ranks))
        nbytes = merge_token_bytes(self.plan, g, self.config.cp)
        return [Collective("merge_tokens_all_gather", group, nbytes)]

    def step_end(self, stage: int) -> list[Collective]:
        """DDP: the stage's gradients all-reduced over every DP rank (and CP member)."""
        if self.fsdp or self.dp * self.config.cp == 1 or self.cost.param_count <= 0:
            return []
        share = sum(self.frac_list[c] for c in range(self.n_chunks) if c % self.pp == stage)
        nbytes = float(self.cost.param_count * share * self.config.grad_bytes)
        return [Collective("ddp_all_reduce", self.stage_groups[stage], nbytes)]
