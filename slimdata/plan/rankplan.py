"""One rank's view of a :class:`~slimdata.plan.types.StepPlan`: what that rank needs to run
its step, and nothing of the other ranks' work (the plan-shard payload, design §8).

A rank runs its own forward and backward packs, divides its loss by the step's global
loss-token count, creates every merge group's process subgroup (a collective, so every rank
knows every group's ranks) and, inside its own merge group, lays out the gathered keys and
values by every member's merged slices. So the view holds:

- the step-level fields: ``step``, ``strategy``, ``mode``, ``dp``, the global
  ``loss_tokens``, every merge group (ranks and document indices) and ``meta``;
- ``ranks[rank]``: the rank's own :class:`RankStep`, unchanged;
- ``ranks[m]`` for every other member ``m`` of the rank's merge group: ``m``'s forward and
  backward merge packs only (one each), with ``order`` ``F0 B0``;
- ``docs``: the documents those slices belong to, keyed by their index in the step's
  ``docs`` (slices keep their step-wide document index, so members agree on the layout),
  serialized as rows ``[index, doc_id, length, loss_tokens, cuts, sample, offset]``
  (:meth:`Document.to_row`);
- ``lockstep``: for a lockstep plan (FSDP), the plan-global schedule every rank must follow
  (:func:`~slimdata.plan.schedule.lockstep_schedule`), which no single rank could derive.

Example: dp 3, rank 1 holds document 4 whole and shares document 7 with rank 2 in merge
group 0; rank 1's view has ``docs {4: ..., 7: ...}``, ``ranks {1: <its RankStep>, 2: <rank
2's merge packs over document 7>}``. A view of a step of 6,700 documents over 64 ranks is
about 1/64 of the step's JSON.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from slimdata.errors import PlanError, PlanFormatError
from slimdata.plan.schedule import LockstepSchedule, check_lockstep, lockstep_schedule
from slimdata.plan.types import (
    DOCUMENT_ROW,
    Document,
    MergeGroup,
    MicroPack,
    RankStep,
    _int,
    _ints,
    group_of_rank,
)
from slimdata.plan.validate import validate_rank_plan

if TYPE_CHECKING:
    from slimdata.plan.types import StepPlan

__all__ = ["RANK_PLAN_FORMAT", "RankPlan", "check_format", "rank_views"]

RANK_PLAN_FORMAT = 2
"""``format`` of a serialized :class:`RankPlan` (format 1 was a full StepPlan per payload)."""


@dataclass(frozen=True)
class RankPlan:
    """What rank ``rank`` needs of the plan of step ``step`` (module docstring)."""

    step: int
    strategy: str
    dp: int
    """Data-parallel ranks of the step (the layout's, not ``len(ranks)``)."""
    rank: int
    loss_tokens: int
    """Global loss tokens of the step: every rank divides its loss sum by this."""
    docs: dict[int, Document]
    """Step document index -> document, for every document with a slice in ``ranks``."""
    ranks: dict[int, RankStep]
    """``rank`` -> its RankStep; other members of its merge group -> their merge packs."""
    merges: tuple[MergeGroup, ...] = ()
    """Every merge group of the step, indexed as the packs' ``merge`` tags."""
    mode: str = "free"
    lockstep: LockstepSchedule | None = None
    """The plan-global FSDP schedule of a lockstep plan (None: not a lockstep plan)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tokens(self) -> int:
        """Tokens of this rank's slices."""
        return self.ranks[self.rank].tokens

    def merge_of_rank(self, rank: int) -> int | None:
        return group_of_rank(self.merges, rank)

    def validate(self) -> RankPlan:
        """Check the view at a cost linear in its slices; raise :class:`PlanError` naming the
        slice: :func:`~slimdata.plan.validate.validate_rank_plan`."""
        validate_rank_plan(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._header(),
            "docs": [[i, *DOCUMENT_ROW(d)] for i, d in sorted(self.docs.items())],
            "ranks": [rs.to_dict() for _r, rs in sorted(self.ranks.items())],
        }

    def _header(self) -> dict[str, Any]:
        """Every serialized field but ``docs`` and ``ranks``."""
        return {
            "format": RANK_PLAN_FORMAT,
            "step": self.step,
            "strategy": self.strategy,
            "mode": self.mode,
            "dp": self.dp,
            "rank": self.rank,
            "loss_tokens": self.loss_tokens,
            "merges": [m.to_dict() for m in self.merges],
            "lockstep": None if self.lockstep is None else _schedule_to_dict(self.lockstep),
            "meta": self.meta,
        }

    def step_digest(self) -> str:
        """16 hex digits of SHA-256 over the step-wide fields (every serialized field but
        ``rank``, ``docs`` and ``ranks``: step, strategy, mode, dp, loss_tokens, merges,
        lockstep, meta), equal in every rank's view of one step. ``plan.json`` records it per
        step, so a loader can tell a payload whose shared fields were damaged
        (:func:`~slimdata.solver.planshards.check_step_fields`)."""
        header = self._header()
        del header["rank"]
        text = _ENCODER.encode(json.loads(_ENCODER.encode(header)))  # as a payload decodes
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankPlan:
        check_format(d)
        if not isinstance(d["strategy"], str) or not isinstance(d.get("meta", {}), dict):
            raise PlanError("plan strategy must be a string and meta an object")
        docs: dict[int, Document] = {}
        for row in d["docs"]:
            if not isinstance(row, list) or not row:
                raise PlanError(f"docs must be [index, *document row] lists, got {row!r:.60}")
            i = _int(row[0], "document index")
            if i in docs:
                raise PlanError(f"document #{i} is listed twice")
            docs[i] = Document.from_row(row[1:])
        ranks: dict[int, RankStep] = {}
        for x in d["ranks"]:
            rs = RankStep.from_dict(x)
            if rs.rank in ranks:
                raise PlanError(f"rank {rs.rank} is listed twice")
            ranks[rs.rank] = rs
        sched = d.get("lockstep")
        return cls(
            step=_int(d["step"], "step"),
            strategy=d["strategy"],
            dp=_int(d["dp"], "dp"),
            rank=_int(d["rank"], "rank"),
            loss_tokens=_int(d["loss_tokens"], "loss_tokens"),
            docs=docs,
            ranks=ranks,
            merges=tuple(MergeGroup.from_dict(x) for x in d.get("merges", ())),
            mode=str(d.get("mode", "free")),
            lockstep=None if sched is None else _schedule_from_dict(sched),
            meta=dict(d.get("meta", {})),
        )

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON with sorted keys, built fast for plan shards (an
        epoch of 1M short documents writes 10^6 rows): document rows and slices as tuples read
        in comprehensions (JSON arrays all the same), encoded by ``orjson`` (UTF-8, shortest
        float form). The same view always gives the same bytes."""
        fields = {
            **self._header(),
            "docs": [
                (i, d.doc_id, d.length, d.loss_tokens, d.cuts, d.sample, d.offset)
                for i, d in sorted(self.docs.items())
            ],
            "ranks": [_rank_step_fields(rs) for _r, rs in sorted(self.ranks.items())],
        }
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS).decode()


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)
"""The step digest's canonical form (small: the step-wide fields alone)."""


def _rank_step_fields(rs: RankStep) -> dict[str, Any]:
    """:meth:`RankStep.to_dict` with every slice ``[doc, start, end]`` as a tuple."""

    def pack(p: MicroPack) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slices": [(s.doc, s.start, s.end) for s in p.slices],
            "cost": p.cost,
        }
        if p.merge is not None:
            out["merge"] = p.merge
        return out

    return {
        "rank": rs.rank,
        "forward": list(map(pack, rs.forward)),
        "backward": list(map(pack, rs.backward)),
        "order": [f"{k}{i}" for k, i in rs.order],
    }


def check_format(d: dict[str, Any]) -> None:
    """Raise :class:`PlanFormatError` unless ``d`` is a serialized RankPlan of this format."""
    fmt = d.get("format")
    if fmt != RANK_PLAN_FORMAT:
        raise PlanFormatError(
            f"plan payload of format {1 if fmt is None else fmt!r:.20}; this slimdata reads "
            f"format {RANK_PLAN_FORMAT} (one rank's view per payload): re-run `slimdata plan` "
            "(or `slimdata build --plan`) to rewrite the plan shards"
        )


def _schedule_to_dict(s: LockstepSchedule) -> dict[str, Any]:
    return {
        "kept": sorted(s.kept),
        "unions": [[j, list(fs)] for j, fs in sorted(s.unions.items())],
        "idle_forward": sorted(s.idle_forward),
        "idle_backward": sorted(s.idle_backward),
    }


def _schedule_from_dict(d: Any) -> LockstepSchedule:
    if not isinstance(d, dict):
        raise PlanError(f"lockstep schedule must be an object, got {d!r:.60}")
    unions: dict[int, tuple[int, ...]] = {}
    for pair in d["unions"]:
        if not isinstance(pair, list) or len(pair) != 2:
            raise PlanError(f"lockstep unions must be [pack, [packs]] pairs, got {pair!r:.60}")
        unions[_int(pair[0], "lockstep union pack")] = _ints(pair[1], "lockstep union packs")
    return LockstepSchedule(
        kept=frozenset(_ints(d["kept"], "lockstep kept packs")),
        unions=unions,
        idle_forward=frozenset(_ints(d["idle_forward"], "lockstep idle packs")),
        idle_backward=frozenset(_ints(d["idle_backward"], "lockstep idle packs")),
    )


def rank_views(plan: StepPlan, only: int | None = None) -> list[RankPlan]:
    """``[plan.rank_view(r) for r in range(plan.dp)]`` in time linear in the plan (the
    step-wide parts, such as the lockstep schedule, are computed once); with ``only``, the
    list of that rank's view alone."""
    sched = None
    if plan.mode == "lockstep":
        try:
            check_lockstep(plan)
            sched = lockstep_schedule(plan)
        except PlanError:
            sched = None  # not runnable under FSDP; the executor says so if asked to
    group_of = {r: g for g, m in enumerate(plan.merges) for r in m.ranks}
    merge_packs = {
        r: RankStep(
            rank=r,
            forward=tuple(p for p in plan.ranks[r].forward if p.merge is not None),
            backward=tuple(p for p in plan.ranks[r].backward if p.merge is not None),
        )
        for r in group_of
    }
    loss_tokens = plan.loss_tokens
    views = []
    for rs in plan.ranks if only is None else (plan.ranks[only],):
        ranks = {rs.rank: rs}
        used = {s.doc for p in rs.forward for s in p.slices}
        g = group_of.get(rs.rank)
        if g is not None:
            used.update(plan.merges[g].docs)
            ranks.update({m: merge_packs[m] for m in plan.merges[g].ranks if m != rs.rank})
        views.append(
            RankPlan(
                step=plan.step,
                strategy=plan.strategy,
                dp=plan.dp,
                rank=rs.rank,
                loss_tokens=loss_tokens,
                docs={i: plan.docs[i] for i in sorted(used)},
                ranks=dict(sorted(ranks.items())),
                merges=plan.merges,
                mode=plan.mode,
                lockstep=sched,
                meta=plan.meta,
            )
        )
    return views
