"""Build the :class:`~slimdata.execution.ops.Program` of every device of a step.

Per DP rank and pipeline stage, the operations in the order the device runs them:

- the pack order is the pipeline schedule of the rank's plan order
  (:func:`slimdata.execution.schedule.stage_ops`; under FSDP every rank follows
  :func:`~slimdata.execution.schedule.common_order`);
- how each pack runs (model calls, graph-free forwards, recomputed backwards) is the
  executor's rule (:func:`slimdata.plan.execution`), and its price is
  :func:`slimdata.execution.pricing.pack_times` times the chunk's share of the layers;
- around every compute: pipeline ``recv`` / ``send`` of its hidden states, FSDP's parameter
  all-gather (and gradient reduce-scatter in the backward), a merge pack's per-layer K/V
  all-gathers (and K/V-gradient reduce-scatters in the backward,
  :func:`slimdata.execution.merge.merge_collectives`); DDP's gradient all-reduce ends the
  step;
- memory (the one rule, :mod:`slimdata.execution.memory`): a slice's activations and its
  retained K/V are allocated when its forward starts and freed when its backward pack ends;
  a graph-free forward holds the activations only while it runs, and its recomputing
  backward allocates them again; a context-parallel pass (merge pack, static CP) holds one
  layer's gathered K/V while it runs, twice that in the backward (K/V and their gradients).
  With static CP (``cp = k``) a device holds ``1 / k`` of every slice's bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from slimdata.cost import CostModel, causal_pairs
from slimdata.execution.merge import merge_collectives, merge_layer_tokens
from slimdata.execution.ops import Alloc, Collective, Compute, Free, Operation, Program
from slimdata.execution.pricing import PackTimes, chunk_fractions, pack_times
from slimdata.execution.schedule import common_order, stage_ops
from slimdata.plan import StepPlan

__all__ = ["ExecutionConfig", "Programs", "build_programs", "padded"]


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
    virtual_stages: int = 1
    """Model chunks per device with ``pp > 1`` (``"interleaved"``)."""
    cp: int = 1
    """Static context parallelism: each device stands for ``cp`` members holding 1/cp each."""
    grad_bytes: int = 2
    """Bytes per parameter of the gradient / parameter collectives."""

    def __post_init__(self) -> None:
        if self.parallelism not in ("ddp", "fsdp"):
            raise ValueError(f"parallelism={self.parallelism!r}: use 'ddp' or 'fsdp'")
        if min(self.pp, self.virtual_stages, self.cp, self.grad_bytes) < 1:
            raise ValueError(
                f"pp={self.pp}, virtual_stages={self.virtual_stages}, cp={self.cp}, "
                f"grad_bytes={self.grad_bytes}: each must be at least 1"
            )

    @property
    def chunks_per_device(self) -> int:
        return self.virtual_stages if self.pp > 1 else 1


@dataclass(frozen=True)
class Programs:
    """Every device's program of one step, and the pricing they were built from."""

    programs: dict[tuple[int, int], Program]
    """``(rank, stage) -> Program``."""
    pt: PackTimes
    fractions: np.ndarray
    """Share of the model's layers in every global chunk."""
    dp: int
    pp: int

    def __getitem__(self, key: tuple[int, int]) -> Program:
        return self.programs[key]

    def __iter__(self) -> Iterator[Program]:
        return iter(self.programs.values())


def padded(tokens, k: int) -> np.ndarray:
    """Tokens padded to a multiple of ``2 k`` under static CP (``k > 1``), Megatron's THD
    requirement: ``padded(1000, 3) == 1002``."""
    t = np.asarray(tokens, dtype=np.float64)
    return t if k == 1 else np.ceil(t / (2 * k)) * (2 * k)


def build_programs(
    plan: StepPlan, cost: CostModel, config: ExecutionConfig | None = None
) -> Programs:
    """The program of every (rank, stage) of ``plan`` (module docstring)."""
    config = config or ExecutionConfig()
    fsdp = config.parallelism == "fsdp"
    pt = pack_times(plan, cost, lockstep=fsdp, split=config.split)
    b = _Builder(plan, cost, config, pt)
    order_all = common_order(plan) if fsdp else None
    programs = {}
    for r in range(plan.dp):
        order = order_all or plan.ranks[r].order
        for s in range(config.pp):
            ops: list[Operation] = []
            for kind, c, i in stage_ops(config.schedule, order, s, config.pp, b.v):
                ops.extend(b.pass_ops(kind, c, r, i))
            ops.extend(b.step_end(s))
            programs[(r, s)] = Program(r, s, b.device(s, r), tuple(ops))
    return Programs(programs, pt, b.frac, plan.dp, config.pp)


class _Builder:
    """The per-pass operations of one plan (shared lookups of :func:`build_programs`)."""

    def __init__(self, plan: StepPlan, cost: CostModel, config: ExecutionConfig, pt: PackTimes):
        self.plan, self.cost, self.config, self.pt = plan, cost, config, pt
        self.v = config.chunks_per_device
        self.n_chunks = config.pp * self.v
        self.frac = chunk_fractions(cost.layers, self.n_chunks)
        self.fsdp = config.parallelism == "fsdp"
        cp = config.cp
        self.s_pairs = causal_pairs(pt.s_start, pt.s_end)
        # slices of every flat pack, in plan order
        self.f_slices = _group(pt.s_fpack, len(pt.fwd))
        self.b_slices = _group(pt.s_bpack, len(pt.bwd))
        self.s_free = pt.f_graph_free[pt.s_fpack]
        # static CP: one layer's gathered K/V of every pack (padded tokens)
        sp = padded(pt.s_end - pt.s_start, cp)
        self.cp_kv_f = cost.gathered_kv_bytes(np.bincount(pt.s_fpack, sp, len(pt.fwd)))
        self.cp_kv_b = cost.gathered_kv_bytes(np.bincount(pt.s_bpack, sp, len(pt.bwd)))
        self.merge_kv = [
            float(cost.gathered_kv_bytes(merge_layer_tokens(plan, g)))
            for g in range(len(plan.merges))
        ]
        layers = max(cost.layers, 1)
        counts = np.rint(self.frac * layers).astype(int)
        self.first_layer = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self.layer_count = counts
        self.calls_anywhere = {
            kind: {
                i
                for rs in plan.ranks
                for i in range(len(rs.forward if kind == "F" else rs.backward))
                if self.calls(rs.rank, kind, i)
            }
            for kind in "FB"
        }

    def device(self, stage: int, rank: int) -> int:
        return stage * self.plan.dp + rank

    def flat(self, r: int, kind: str, i: int) -> int:
        return int((self.pt.f_offset if kind == "F" else self.pt.b_offset)[r] + i)

    def n_packs(self, r: int, kind: str) -> int:
        rs = self.plan.ranks[r]
        return len(rs.forward if kind == "F" else rs.backward)

    def calls(self, r: int, kind: str, i: int) -> int:
        if i >= self.n_packs(r, kind):
            return 0
        return int((self.pt.f_calls if kind == "F" else self.pt.b_calls)[self.flat(r, kind, i)])

    def pass_ops(self, kind: str, c: int, r: int, i: int) -> list[Operation]:
        """Receive, gather, allocate, compute, free, scatter, send: one pass of pack ``i``."""
        if i >= self.n_packs(r, kind):  # FSDP: a slot of the common order this rank lacks
            return [Compute(kind, c, i, 0.0, 0, 0.0, 0)] if self.fsdp else []
        dev = self.device(c % self.config.pp, r)
        before: list[Operation] = [
            *self.receive(kind, c, r, i, dev),
            *self.param_gather(kind, c, i),
        ]
        after: list[Operation] = []
        for alloc in self.transient(kind, r, i):
            before.append(alloc)
            after.append(Free(alloc.what, alloc.bytes, alloc.owner))
        before.extend(self.merge_exchange(kind, c, r, i))
        before.extend(self.slice_allocs(kind, c, r, i))
        after.extend(self.slice_frees(kind, c, r, i))
        after.extend(self.param_scatter(kind, c, i))
        after.extend(self.send(kind, c, r, i, dev))
        return [*before, self.compute(kind, c, r, i), *after]

    def compute(self, kind: str, c: int, r: int, i: int) -> Compute:
        pt, k = self.pt, self.flat(r, kind, i)
        sl = (self.f_slices if kind == "F" else self.b_slices)[k]
        pack = (self.plan.ranks[r].forward if kind == "F" else self.plan.ranks[r].backward)[i]
        return Compute(
            pass_=kind,
            chunk=c,
            pack=i,
            seconds=float(self.frac[c] * (pt.fwd if kind == "F" else pt.bwd)[k]),
            tokens=int((pt.f_tokens if kind == "F" else pt.b_tokens)[k]),
            pairs=float(self.s_pairs[sl].sum()),
            calls=self.calls(r, kind, i),
            graph_free=bool(kind == "F" and pt.f_graph_free[k]),
            recompute=bool(kind == "B" and pt.b_recomputed[k]),
            merge=pack.merge,
        )

    def slice_allocs(self, kind: str, c: int, r: int, i: int) -> list[Operation]:
        """Forward: every slice's activations and K/V; backward: the activations of slices
        whose forward ran graph-free (the recompute rebuilds them)."""
        pt, k, share = self.pt, self.flat(r, kind, i), self.frac[c] / self.config.cp
        out: list[Operation] = []
        for s in (self.f_slices if kind == "F" else self.b_slices)[k]:
            owner = (int(pt.s_doc[s]), int(pt.s_start[s]))
            if kind == "F":
                out.append(Alloc("activations", float(pt.s_act[s] * share), owner))
                out.append(Alloc("kv", float(pt.s_kv[s] * share), owner))
            elif self.s_free[s]:
                out.append(Alloc("activations", float(pt.s_act[s] * share), owner))
        return out

    def slice_frees(self, kind: str, c: int, r: int, i: int) -> list[Operation]:
        """Forward: a graph-free pass drops its activations; backward: every slice's
        activations and K/V go."""
        pt, k, share = self.pt, self.flat(r, kind, i), self.frac[c] / self.config.cp
        out: list[Operation] = []
        for s in (self.f_slices if kind == "F" else self.b_slices)[k]:
            owner = (int(pt.s_doc[s]), int(pt.s_start[s]))
            if kind == "B" or self.s_free[s]:
                out.append(Free("activations", float(pt.s_act[s] * share), owner))
            if kind == "B":
                out.append(Free("kv", float(pt.s_kv[s] * share), owner))
        return out

    def transient(self, kind: str, r: int, i: int) -> list[Alloc]:
        """One layer's gathered K/V while the pass runs (twice in the backward)."""
        times = 1 if kind == "F" else 2
        out = []
        pack = (self.plan.ranks[r].forward if kind == "F" else self.plan.ranks[r].backward)[i]
        if pack.merge is not None:
            out.append(Alloc("gathered_kv", times * self.merge_kv[pack.merge]))
        if self.config.cp > 1 and pack.slices:
            k = self.flat(r, kind, i)
            out.append(
                Alloc(
                    "gathered_kv", times * float((self.cp_kv_f if kind == "F" else self.cp_kv_b)[k])
                )
            )
        return out

    def merge_exchange(self, kind: str, c: int, r: int, i: int) -> list[Collective]:
        """A merge pack's per-layer K/V collectives over its group, in the runtime's order
        (:mod:`slimdata.hooks.merge`)."""
        pack = (self.plan.ranks[r].forward if kind == "F" else self.plan.ranks[r].backward)[i]
        if pack.merge is None:
            return []
        g = pack.merge
        group = tuple(self.device(c % self.config.pp, m) for m in sorted(self.plan.merges[g].ranks))
        nbytes = self.merge_kv[g]
        layers = range(self.first_layer[c], self.first_layer[c] + self.layer_count[c])
        if kind == "F":
            return [Collective("merge_kv_all_gather", group, nbytes, kind, c, i, x) for x in layers]
        recomputed = bool(self.pt.b_recomputed[self.flat(r, kind, i)])
        # a recomputed pack re-runs its whole forward first (one gather per layer); then
        # per layer, last first: gathers (one more inside a checkpointed layer under
        # recompute="full") and the K/V-gradient reduce-scatter
        out = [
            Collective("merge_kv_all_gather", group, nbytes, kind, c, i, x)
            for x in (layers if recomputed else ())
        ]
        per_layer = merge_collectives(kind, self.cost, recomputed) - 1 - int(recomputed)
        for x in reversed(layers):
            out.extend(
                Collective("merge_kv_all_gather", group, nbytes, kind, c, i, x)
                for _ in range(per_layer)
            )
            out.append(Collective("merge_kv_reduce_scatter", group, nbytes, kind, c, i, x))
        return out

    def param_bytes(self, c: int) -> float:
        return float(self.cost.param_count * self.frac[c] * self.config.grad_bytes)

    def stage_group(self, stage: int) -> tuple[int, ...]:
        return tuple(self.device(stage, r) for r in range(self.plan.dp))

    def param_gather(self, kind: str, c: int, i: int) -> list[Collective]:
        """FSDP: a pack's parameters are gathered on every rank unless no rank calls it."""
        if not self.fsdp or i not in self.calls_anywhere[kind]:
            return []
        group = self.stage_group(c % self.config.pp)
        return [Collective("fsdp_all_gather", group, self.param_bytes(c), kind, c, i)]

    def param_scatter(self, kind: str, c: int, i: int) -> list[Collective]:
        if kind == "F" or not self.fsdp or i not in self.calls_anywhere[kind]:
            return []
        group = self.stage_group(c % self.config.pp)
        return [Collective("fsdp_reduce_scatter", group, self.param_bytes(c), kind, c, i)]

    def hidden_bytes(self, r: int, kind: str, i: int) -> float:
        tokens = (self.pt.f_tokens if kind == "F" else self.pt.b_tokens)[self.flat(r, kind, i)]
        return float(tokens / self.config.cp * self.cost.hidden * self.cost.dtype_bytes)

    def neighbour(self, kind: str, c: int, towards: str) -> int | None:
        """Chunk a pass receives from (``"in"``) or sends to (``"out"``): forward flows up
        the chunks, backward down."""
        step = 1 if (kind == "F") == (towards == "out") else -1
        n = c + step
        return n if 0 <= n < self.n_chunks else None

    def receive(self, kind: str, c: int, r: int, i: int, dev: int) -> list[Collective]:
        src = self.neighbour(kind, c, "in")
        if src is None:
            return []
        pair = (self.device(src % self.config.pp, r), dev)
        return [Collective("recv", pair, self.hidden_bytes(r, kind, i), kind, c, i)]

    def send(self, kind: str, c: int, r: int, i: int, dev: int) -> list[Collective]:
        dst = self.neighbour(kind, c, "out")
        if dst is None:
            return []
        pair = (dev, self.device(dst % self.config.pp, r))
        return [Collective("send", pair, self.hidden_bytes(r, kind, i), kind, c, i)]

    def step_end(self, stage: int) -> list[Collective]:
        """DDP: the stage's gradients all-reduced over every DP rank (and CP member)."""
        dp_total = self.plan.dp * self.config.cp
        if self.fsdp or dp_total == 1 or self.cost.param_count <= 0:
            return []
        share = float(
            self.frac[[c for c in range(self.n_chunks) if c % self.config.pp == stage]].sum()
        )
        nbytes = float(self.cost.param_count * share * self.config.grad_bytes)
        return [Collective("ddp_all_reduce", self.stage_group(stage), nbytes)]


def _group(pack_of_slice: np.ndarray, n: int) -> list[np.ndarray]:
    """Slice indices of every pack, in slice order: ``_group([1, 0, 1], 2) -> [[1], [0, 2]]``."""
    order = np.argsort(pack_of_slice, kind="stable")
    bounds = np.searchsorted(pack_of_slice[order], np.arange(n + 1))
    return [order[bounds[k] : bounds[k + 1]] for k in range(n)]
