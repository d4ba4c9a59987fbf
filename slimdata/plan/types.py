"""Plan types (design §3): plain, serializable values, identical on every rank.

A :class:`StepPlan` says, for one optimizer step, which slices of which documents every
data-parallel rank runs, grouped into forward and backward MicroPacks, in which interleaved
order, and which ranks temporarily merge into a context-parallel group (DP-Merge).

Example: two documents of 6 and 3 tokens on one rank, the first cut at 4::

    docs   = (Document(doc_id=0, length=6, ...), Document(doc_id=1, length=3, ...))
    fwd    = [MicroPack((Slice(0, 0, 4),)), MicroPack((Slice(0, 4, 6), Slice(1, 0, 3)))]
    bwd    = [MicroPack((Slice(0, 4, 6),)), MicroPack((Slice(1, 0, 3), Slice(0, 0, 4)))]
    order  = (("F", 0), ("F", 1), ("B", 0), ("B", 1))

Backward packs regroup the same slices (asymmetric partitioning); slice ``[4,6)`` runs its
backward before ``[0,4)`` because ``[0,4)``'s keys and values receive gradient from it.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slimdata.errors import ConfigError, PlanError
from slimdata.plan.pipeline import interleave
from slimdata.plan.validate import validate_plan
from slimdata.slicing import check_length

if TYPE_CHECKING:
    from slimdata.plan.rankplan import RankPlan

__all__ = [
    "Document",
    "MergeGroup",
    "MicroPack",
    "RankStep",
    "Slice",
    "StepPlan",
    "eager_order",
    "group_of_rank",
    "loss_token_count",
]


def loss_token_count(length: int, mask: Sequence[int] | None = None) -> int:
    """Tokens of one trained sequence (a document, or an independent piece of a cut one) that
    carry a label: every token but the last, which has no next token in the sequence, less
    those whose ``mask`` entry is 0. The runtime labels exactly these
    (:func:`slimdata.hooks.loss.slice_labels`), and :attr:`StepPlan.loss_tokens` sums this
    count, so the step loss is normalised by the labels it actually sums.

    ``loss_token_count(4) == 3``; ``loss_token_count(1) == 0``; ``loss_token_count(0) == 0``;
    ``loss_token_count(4, [1, 0, 1, 1]) == 2`` (token 1 is masked, token 3 is the last).
    """
    if mask is None:
        return max(length - 1, 0)
    return sum(1 for m in list(mask)[: max(length - 1, 0)] if m)


def _int(value: Any, what: str) -> int:
    """``value`` if it is a JSON integer (not a bool, float or string), else a PlanError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{what} must be an integer, got {value!r:.60}")
    return value


def _ints(values: Any, what: str, count: int | None = None) -> tuple[int, ...]:
    if not isinstance(values, list | tuple) or (count is not None and len(values) != count):
        size = f"{count} " if count is not None else ""
        raise PlanError(f"{what} must be a list of {size}integers, got {values!r:.60}")
    return tuple(_int(v, what) for v in values)


@dataclass(frozen=True, order=True, slots=True)
class Slice:
    """Half-open token range ``[start, end)`` of document ``doc`` (an index into ``StepPlan.docs``).

    Its queries attend to the whole prefix ``[0, start)`` of the same document and causally
    to themselves.
    """

    doc: int
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start

    def to_list(self) -> list[int]:
        return list(_SLICE_ROW(self))


_SLICE_ROW = operator.attrgetter("doc", "start", "end")
_SLICE_DOC = operator.attrgetter("doc")


@dataclass(frozen=True)
class MicroPack:
    """Slices executed as one varlen call; ``cost`` is the predicted seconds of this pass: in
    a solved plan, what one device computes of it at the execution model's price
    (:func:`slimdata.execution.pack_prices`, under the rules of the layout it was solved for,
    :attr:`slimdata.solver.Layout.execution`); 0 where no solver priced it. The runtime's
    predicted pack time reads it; the simulator and the planner's estimate recompute it."""

    slices: tuple[Slice, ...]
    cost: float = 0.0
    merge: int | None = None
    """Index into ``StepPlan.merges`` when this is the pack a merge group runs together."""

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.slices)

    def to_dict(self) -> dict[str, Any]:
        slices = list(map(list, map(_SLICE_ROW, self.slices)))  # [[doc, start, end], ...]
        out: dict[str, Any] = {"slices": slices, "cost": self.cost}
        if self.merge is not None:
            out["merge"] = self.merge
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MicroPack:
        cost = d.get("cost", 0.0)
        if isinstance(cost, bool) or not isinstance(cost, int | float):
            raise PlanError(f"pack cost must be a number, got {cost!r:.60}")
        merge = d.get("merge")
        return cls(
            tuple(Slice(*_ints(s, "a slice [doc, start, end]", 3)) for s in d["slices"]),
            float(cost),
            None if merge is None else _int(merge, "a pack's merge group"),
        )


def eager_order(
    forward: Sequence[MicroPack], backward: Sequence[MicroPack]
) -> tuple[tuple[str, int], ...]:
    """Interleave forward and backward packs, 1F1B-like: forward packs in order, and every
    backward pack (in order) as soon as the forwards of all its documents have run.

    Running backward early frees activations; this is the default per-rank order in free mode.
    """
    last_fwd: dict[int, int] = {}  # document -> its last forward pack
    for i, pack in enumerate(forward):
        last_fwd.update(dict.fromkeys(map(_SLICE_DOC, pack.slices), i))
    ready_after = [
        max(map(last_fwd.get, map(_SLICE_DOC, p.slices), itertools.repeat(-1)), default=-1)
        for p in backward
    ]
    return interleave(len(forward), ready_after)


def _is_order_item(o: Any) -> bool:
    return isinstance(o, str) and len(o) > 1 and o[0] in "FB" and o[1:].isdigit() and o.isascii()


@dataclass(frozen=True)
class RankStep:
    """One DP rank's work for one step: forward packs, backward packs, and their interleaving."""

    rank: int
    forward: tuple[MicroPack, ...]
    backward: tuple[MicroPack, ...]
    order: tuple[tuple[str, int], ...] = ()
    """``("F", i)`` / ``("B", j)`` in execution order; empty means :func:`eager_order`."""

    def __post_init__(self) -> None:
        if not self.order:
            object.__setattr__(self, "order", eager_order(self.forward, self.backward))

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.forward)

    def slices(self) -> Iterator[Slice]:
        for p in self.forward:
            yield from p.slices

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "forward": [p.to_dict() for p in self.forward],
            "backward": [p.to_dict() for p in self.backward],
            "order": [f"{k}{i}" for k, i in self.order],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankStep:
        order = d.get("order", ())
        if not isinstance(order, list | tuple) or not all(_is_order_item(o) for o in order):
            raise PlanError(f"rank order must be a list like ['F0', 'B0'], got {order!r:.60}")
        return cls(
            rank=_int(d["rank"], "rank"),
            forward=tuple(MicroPack.from_dict(p) for p in d["forward"]),
            backward=tuple(MicroPack.from_dict(p) for p in d["backward"]),
            order=tuple((o[0], int(o[1:])) for o in order),
        )


@dataclass(frozen=True)
class MergeGroup:
    """DP-Merge: ``ranks`` run ``docs`` together as one context-parallel group this step.

    Each member holds some slices (a share of the queries) of every document of the group in
    exactly one forward and one backward pack tagged with this group's index; keys/values are
    gathered inside the group. Parameters are untouched (members stay DP replicas).
    """

    ranks: tuple[int, ...]
    docs: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "docs": list(self.docs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MergeGroup:
        return cls(_ints(d["ranks"], "merge group ranks"), _ints(d["docs"], "merge group docs"))


def group_of_rank(merges: Sequence[MergeGroup], rank: int) -> int | None:
    """Index of the merge group ``rank`` belongs to, or None."""
    return next((g for g, m in enumerate(merges) if rank in m.ranks), None)


@dataclass(frozen=True, slots=True)
class Document:
    """A document of the step's global batch."""

    doc_id: int | str
    """Stable id from the shards (``doc_id`` column) or the line number of a lengths file."""
    length: int
    """Tokens, EOS included."""
    loss_tokens: int = -1
    """Tokens that carry a label (default :func:`loss_token_count` of ``length``: all but the
    last, which has no next token)."""
    cuts: tuple[int, ...] = ()
    """Build-time cut points ``(0, ..., length)``; a plan may merge consecutive slices."""
    sample: int = -1
    """Global sample index in the document shards (-1 when planned from lengths)."""
    offset: int = 0
    """First token of this document within its source sample: nonzero only for an independent
    piece of a longer document (fixed-length baselines, ``--oversize split``), which does not
    attend to the tokens before it."""

    def __post_init__(self) -> None:
        if self.loss_tokens < 0:
            object.__setattr__(self, "loss_tokens", loss_token_count(self.length))
        if not self.cuts:
            object.__setattr__(self, "cuts", (0, self.length))

    def to_dict(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "length": self.length,
            "loss_tokens": self.loss_tokens,
            "cuts": list(self.cuts),
            "sample": self.sample,
            **({"offset": self.offset} if self.offset else {}),
        }

    def to_row(self) -> list[Any]:
        """Compact JSON form (rank views): ``[doc_id, length, loss_tokens, cuts, sample,
        offset]``, about half the bytes of :meth:`to_dict` and faster to encode."""
        return list(DOCUMENT_ROW(self))

    @classmethod
    def from_row(cls, row: Any) -> Document:
        """Inverse of :meth:`to_row`, as strict as :meth:`from_dict`."""
        if not isinstance(row, list) or len(row) != len(_ROW_FIELDS):
            raise PlanError(f"a document row must be [{', '.join(_ROW_FIELDS)}], got {row!r:.60}")
        return cls.from_dict(dict(zip(_ROW_FIELDS, row, strict=True)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Document:
        doc_id = d["doc_id"]
        if isinstance(doc_id, bool) or not isinstance(doc_id, int | str):
            raise PlanError(f"doc_id must be an integer or a string, got {doc_id!r:.60}")
        try:
            length = check_length(_int(d["length"], "document length"))
        except ConfigError as exc:
            raise PlanError(str(exc)) from None
        return cls(
            doc_id=doc_id,
            length=length,
            loss_tokens=_int(d["loss_tokens"], "loss_tokens"),
            cuts=_ints(d["cuts"], "document cuts"),
            sample=_int(d.get("sample", -1), "document sample"),
            offset=_int(d.get("offset", 0), "document offset"),
        )


_ROW_FIELDS = ("doc_id", "length", "loss_tokens", "cuts", "sample", "offset")
DOCUMENT_ROW = operator.attrgetter(*_ROW_FIELDS)
"""``DOCUMENT_ROW(d)``: the fields of :meth:`Document.to_row` as a tuple (no list built)."""


@dataclass(frozen=True)
class StepPlan:
    """One RankStep per DP rank, the merge groups, and the global loss-token count."""

    step: int
    strategy: str
    docs: tuple[Document, ...]
    ranks: tuple[RankStep, ...]
    merges: tuple[MergeGroup, ...] = ()
    mode: str = "free"
    """``free`` (DDP: per-rank totals matter) or ``lockstep`` (FSDP/PP: pack i runs together)."""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    """Free-form: seed, layout, solve time, optimality gap. Not part of plan equality."""

    @property
    def dp(self) -> int:
        return len(self.ranks)

    @property
    def loss_tokens(self) -> int:
        """Global count of loss tokens: the step loss is (sum of token losses) / this."""
        return sum([d.loss_tokens for d in self.docs])

    @property
    def tokens(self) -> int:
        return sum([d.length for d in self.docs])

    def merge_of_rank(self, rank: int) -> int | None:
        return group_of_rank(self.merges, rank)

    def validate(self) -> StepPlan:
        """Check the invariants of design §4; raise :class:`PlanError` naming the slice."""
        validate_plan(self)
        return self

    def rank_view(self, rank: int) -> RankPlan:
        """What ``rank`` needs of this plan to run it (:class:`~slimdata.plan.rankplan.RankPlan`;
        all ranks at once: :func:`~slimdata.plan.rankplan.rank_views`)."""
        from slimdata.plan.rankplan import rank_views

        if not 0 <= rank < self.dp:
            raise PlanError(f"rank {rank} is not one of the plan's {self.dp} ranks")
        return rank_views(self, only=rank)[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "strategy": self.strategy,
            "mode": self.mode,
            "docs": [d.to_dict() for d in self.docs],
            "ranks": [r.to_dict() for r in self.ranks],
            "merges": [m.to_dict() for m in self.merges],
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepPlan:
        if not isinstance(d["strategy"], str) or not isinstance(d.get("meta", {}), dict):
            raise PlanError("plan strategy must be a string and meta an object")
        return cls(
            step=_int(d["step"], "step"),
            strategy=d["strategy"],
            docs=tuple(Document.from_dict(x) for x in d["docs"]),
            ranks=tuple(RankStep.from_dict(x) for x in d["ranks"]),
            merges=tuple(MergeGroup.from_dict(x) for x in d.get("merges", ())),
            mode=str(d.get("mode", "free")),
            meta=dict(d.get("meta", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> StepPlan:
        return cls.from_dict(json.loads(text))
