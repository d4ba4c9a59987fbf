"""The compute-only critical path of a pipelined step: the planner's step-time estimate.

Every device runs its computes in the order of the pipeline schedule
(:func:`~slimdata.execution.schedule.stage_ops`, 1F1B or interleaved), a forward on chunk
``c`` after the same pack's forward on chunk ``c - 1``, a backward on ``c`` after the same
pack's backward on ``c + 1``; a pass on chunk ``c`` takes ``chunk_fractions(layers,
pp * v)[c]`` of the pack's full-model seconds. No communication, no memory: this is the
critical path of the compute-only programs (``build_programs(..., compute_only=True)``).
:func:`critical_path` takes per-pack seconds alone, so that SlimPack can afford it in every
probe of its pack-count and lag search; :func:`plan_critical_path` prices an assembled plan
as the simulator's tasks take it on one device
(:func:`~slimdata.execution.program.pack_prices`).

Example (1F1B, ``pp=2``, forward packs of 1 s, backward 2 s, order ``F0 B0 F1 B1``; each op
takes half its pack): stage 0 F0 ends 0.5, F1 1.0; stage 1 F0 1.0, B0 2.0, F1 2.5, B1 3.5;
stage 0 B0 3.0, B1 4.5: ``critical_path([1, 1], [2, 2], order, 2) == [4.5]``.

The op sequence of an order (every stage's ops in one order that respects the
dependencies) depends only on ``(schedule, order, pp, v)`` and is cached; evaluating it
costs two vector operations per op over all ranks at once, or, with a pipeline, per *wave*:
the ops whose dependencies all end in earlier waves (one op per device at most), evaluated
together with the same two operations on each element (the same floats).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from slimdata.cost import CostModel
from slimdata.errors import PlanError
from slimdata.execution.compute import PackCompute
from slimdata.execution.pricing import PackTimes
from slimdata.execution.program import ExecutionConfig, pack_prices
from slimdata.execution.schedule import INTERLEAVED_CHUNKS, chunks_per_device, stage_ops
from slimdata.plan.pipeline import chunk_fractions
from slimdata.plan.types import RankStep, StepPlan

__all__ = ["critical_path", "critical_path_under", "members_wait", "plan_critical_path"]


@dataclass(frozen=True)
class _Sequence:
    """Every op of every device in a dependency-respecting order, as index arrays."""

    backward: np.ndarray
    """Per op: ``True`` for a backward pass."""
    chunk: np.ndarray
    pack: np.ndarray
    after: tuple[tuple[int, int], ...]
    """Per op: the ops it waits for (the device's previous op, the neighbouring chunk's op of
    the same pack), as sequence indices; ``-1`` for none (a row of zeros)."""
    waves: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]
    """Per wave (ops whose dependencies end in earlier waves): its ops' sequence indices and
    those of the two ops each waits for (``-1``: none)."""


def critical_path(
    fwd: ArrayLike,
    bwd: ArrayLike,
    order: Sequence[tuple[str, int]],
    pp: int,
    *,
    schedule: str = "1f1b",
    v: int = INTERLEAVED_CHUNKS,
    layers: int = 0,
    lockstep: bool = False,
) -> np.ndarray:
    """Makespan of one or several ranks that share the plan ``order``: ``fwd[i]`` /
    ``bwd[j]`` are the full-model seconds of forward pack ``i`` / backward pack ``j``,
    ``(packs,)`` or ``(packs, ranks)``; ``v`` model chunks per device under ``"interleaved"``
    (:func:`~slimdata.execution.schedule.chunks_per_device`);
    ``layers`` splits the model into chunks as the execution model does (0: evenly);
    ``lockstep``: the ranks meet before every op (FSDP, one stage: each pass first gathers
    the parameters from every rank), so each op ends when its slowest rank's does.
    Returns one makespan per rank."""
    f, b = _columns(fwd), _columns(bwd)
    ranks = max(f.shape[1], b.shape[1])
    v = chunks_per_device(schedule, pp, v)
    seq = _sequence(schedule, tuple(order), pp, v)
    if not len(seq.pack):
        return np.zeros(ranks)
    frac = chunk_fractions(layers, pp * v)[seq.chunk][:, None]
    both = np.concatenate([np.broadcast_to(x, (len(x), ranks)) for x in (f, b)])
    dur = frac * both[np.where(seq.backward, len(f), 0) + seq.pack]
    end = np.zeros((len(dur) + 1, ranks))  # row -1: nothing to wait for
    if len(seq.waves) * WAVE_GAIN <= len(dur):
        for ops, first, second in seq.waves:
            wave = np.maximum(end[first], end[second])
            wave += dur[ops]
            if lockstep:
                wave[:] = wave.max(axis=1, keepdims=True)
            end[ops] = wave
        return end[:-1].max(axis=0)
    rows, maximum, add = list(end), np.maximum, np.add
    for row, d, (prev, dep) in zip(rows, dur, seq.after, strict=False):
        maximum(rows[prev], rows[dep], out=row)
        add(row, d, out=row)
        if lockstep:
            row.fill(row.max())
    return end[:-1].max(axis=0)


WAVE_GAIN = 4
"""Waves are evaluated together when there are at most a quarter as many as ops (a pipeline
runs one op per device in a wave; on one stage every op is its own wave)."""


def plan_critical_path(
    plan: StepPlan,
    cost: CostModel,
    config: ExecutionConfig | None = None,
    prices: tuple[PackTimes, PackCompute] | None = None,
) -> float:
    """The planner's step-time estimate of ``plan``: every rank's packs at the execution
    model's price on one device (:func:`~slimdata.execution.program.pack_prices`:
    :func:`~slimdata.execution.pricing.pack_times` by the executor's rules of ``config``,
    then :func:`~slimdata.execution.compute.pack_compute`: static CP member shares, merged
    slices' attention efficiency) through its own order (:func:`critical_path`, ``config``'s
    pipeline and schedule), the slowest rank; no communication. Ranks with the same order go
    through one call, a column each (the evaluation is elementwise, so each column is as if
    alone); under FSDP on one stage the ranks meet before every op (``lockstep``).
    ``prices``: ``pack_prices(plan, cost, config)`` where the caller has it already."""
    config = config or ExecutionConfig()
    pt, price = prices or pack_prices(plan, cost, config)
    fwd = _merge_passes(price.fwd, pt.f_offset, plan, "forward")
    bwd = _merge_passes(price.bwd, pt.b_offset, plan, "backward")
    by_order: dict[tuple, list[RankStep]] = {}
    for rs in plan.ranks:
        by_order.setdefault(tuple(rs.order), []).append(rs)
    worst = 0.0
    for order, ranks in by_order.items():
        fa = _rank_columns(fwd, pt.f_offset, ranks, len(ranks[0].forward))
        ba = _rank_columns(bwd, pt.b_offset, ranks, len(ranks[0].backward))
        times = critical_path_under(fa, ba, order, config, cost.layers)
        worst = max(worst, float(times.max(initial=0.0)))
    return worst


def _merge_passes(seconds: np.ndarray, offset: np.ndarray, plan: StepPlan, kind: str) -> np.ndarray:
    """Per flat pack of pass ``kind``, its seconds where a merge group's members run their
    merge packs together (:func:`members_wait`)."""
    if not plan.merges:
        return seconds
    return members_wait(
        seconds,
        [
            [
                int(offset[r]) + i
                for r in m.ranks
                for i, p in enumerate(getattr(plan.ranks[r], kind))
                if p.merge == g
            ]
            for g, m in enumerate(plan.merges)
        ],
    )


def members_wait(seconds: np.ndarray, groups: Iterable[Sequence[int]]) -> np.ndarray:
    """``seconds`` where the packs at the indices of each of ``groups`` (a merge group's
    members' merge packs of one pass) run together: each takes the slowest's (every layer's
    K/V exchange holds a member until all have reached it; the simulator runs the pass as one
    task of the members' devices, as long as its longest). Shares of 40 and 17 ms: 40 ms on
    both members."""
    out = np.array(seconds, dtype=np.float64)
    for at in groups:
        if len(at):
            out[list(at)] = out[list(at)].max()
    return out


def critical_path_under(
    fwd: ArrayLike,
    bwd: ArrayLike,
    order: Sequence[tuple[str, int]],
    config: ExecutionConfig,
    layers: int,
) -> np.ndarray:
    """:func:`critical_path` of ranks sharing ``order`` as ``config`` runs them: its stages,
    schedule and model chunks per device (``layers`` split as the simulator splits them), and
    under FSDP on one stage the ranks meeting before every op."""
    return critical_path(
        fwd,
        bwd,
        order,
        config.pp,
        schedule=config.schedule,
        v=config.chunks_per_device,
        layers=layers,
        lockstep=config.ranks_meet_every_pass,
    )


def _rank_columns(
    seconds: np.ndarray, offset: np.ndarray, ranks: Sequence[RankStep], n: int
) -> np.ndarray:
    """``(n, len(ranks))``: each rank's ``n`` flat packs' ``seconds``, a column each."""
    idx = offset[[rs.rank for rs in ranks]][None, :] + np.arange(n)[:, None]
    return seconds[idx]


def _columns(x: ArrayLike) -> np.ndarray:
    """Per-pack seconds as ``(packs, ranks)``: one column for a flat sequence."""
    a = np.asarray(x, dtype=np.float64)
    return a.reshape(len(a), 1) if a.ndim == 1 else a


@lru_cache(maxsize=512)
def _sequence(schedule: str, order: tuple[tuple[str, int], ...], pp: int, v: int) -> _Sequence:
    """Every device's ops (:func:`stage_ops`) merged into one order that respects the
    dependencies; the same for every rank with this ``order``."""
    stages = [stage_ops(schedule, order, s, pp, v) for s in range(pp)]
    n_chunks = pp * v
    index: dict[tuple[str, int, int], int] = {}  # (pass, chunk, pack) -> sequence index
    ops: list[tuple[str, int, int]] = []
    after: list[tuple[int, int]] = []
    wave: list[int] = []  # per op: one past the later of its dependencies' waves
    pos, last = [0] * pp, [-1] * pp
    while len(ops) < sum(map(len, stages)):
        progressed = False
        for s, stage in enumerate(stages):
            while pos[s] < len(stage):
                kind, c, i = stage[pos[s]]
                up = c - 1 if kind == "F" else c + 1
                dep = index.get((kind, up, i), -1) if 0 <= up < n_chunks else -1
                if dep < 0 and 0 <= up < n_chunks:
                    break  # the neighbouring chunk has not run this pack yet
                after.append((last[s], dep))
                wave.append(
                    1 + max(wave[last[s]] if last[s] >= 0 else -1, wave[dep] if dep >= 0 else -1)
                )
                index[(kind, c, i)] = last[s] = len(ops)
                ops.append((kind, c, i))
                pos[s] += 1
                progressed = True
        if not progressed:  # e.g. interleaved, pp 8, v 2: 10 packs at lag 0
            raise PlanError(
                f"the {schedule} schedule cannot run this order of {len(order)} ops on {pp} "
                f"stages (v={v}): its devices wait on each other; try another micro-batch count"
            )
    return _Sequence(
        backward=np.array([k == "B" for k, _c, _i in ops], dtype=bool),
        chunk=np.array([c for _k, c, _i in ops], dtype=np.int64),
        pack=np.array([i for _k, _c, i in ops], dtype=np.int64),
        after=tuple(after),
        waves=_waves(after, wave),
    )


def _waves(
    after: Sequence[tuple[int, int]], wave: Sequence[int]
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """The ops of a sequence grouped by ``wave`` (each op's: one past the later of its two
    dependencies', :attr:`_Sequence.after`; 0 without any), with those dependencies."""
    deps = np.array(after, dtype=np.int64).reshape(len(after), 2)
    w = np.asarray(wave, dtype=np.int64)
    by_wave = np.argsort(w, kind="stable")
    cuts = np.flatnonzero(np.diff(w[by_wave])) + 1
    return tuple((ops, deps[ops, 0], deps[ops, 1]) for ops in np.split(by_wave, cuts) if len(ops))
