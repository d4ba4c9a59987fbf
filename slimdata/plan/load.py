"""Load plans from untrusted JSON: a :class:`~slimdata.plan.types.StepPlan`
(:func:`parse_plan`) or one rank's view of one, the plan-shard payload
(:class:`~slimdata.plan.rankplan.RankPlan`, :func:`parse_rank_plan`).

A plan payload comes from a file someone else may have written or damaged, and a training
job acts on it. Both functions make every defect a :class:`~slimdata.errors.PlanError`
with the reason, at a cost bounded by the payload's size, before the runtime sees the plan:

1. size: payloads over :data:`MAX_PLAN_BYTES` are refused before parsing;
2. syntax: malformed JSON, undecodable bytes and nesting too deep to parse are errors
   (no ``JSONDecodeError`` or ``RecursionError`` escapes);
3. shape: the rank count must match the training layout (checked on the parsed lists,
   before any plan object is built, so a ranks list repeated 50,000 times costs one
   ``len``; a rank's view holds at most ``dp`` ranks); every field must have its type
   (``from_dict`` is strict); a payload of another format is a
   :class:`~slimdata.errors.PlanFormatError`;
4. meaning: every document's cut points tile it, and ``validate`` (the ordering and
   coverage rules of design §4), in time linear in the plan's slices.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from slimdata.errors import ConfigError, PlanError
from slimdata.plan.rankplan import RankPlan, check_format
from slimdata.plan.types import Document, StepPlan
from slimdata.slicing import check_cuts

__all__ = ["MAX_PLAN_BYTES", "parse_plan", "parse_rank_plan"]

MAX_PLAN_BYTES = 64 << 20
"""Largest plan payload accepted (64 MiB). A step of 20,000 documents over 64 ranks
serializes to a few MiB, so this leaves room for far larger steps while bounding what a
damaged or hostile shard can make a loader parse."""

_SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def _decode(text: str | bytes) -> Any:
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError(
            f"plan payload of {len(text)} bytes is over the {MAX_PLAN_BYTES} byte limit; "
            "the plan shard is damaged, or the step is too large (use a smaller global batch)"
        )
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except json.JSONDecodeError as exc:
        raise PlanError(
            f"plan payload is not valid JSON: {exc.msg} at position {exc.pos}"
        ) from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"plan payload is not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise PlanError("plan payload is nested too deeply to be a plan") from None


def parse_plan(text: str | bytes, *, dp: int | None = None) -> StepPlan:
    """The validated plan of a JSON payload; ``dp`` (if given) is the expected rank count."""
    data = _decode(text)
    if not isinstance(data, dict):
        raise PlanError(f"plan payload is a JSON {type(data).__name__}, not an object")
    ranks = data.get("ranks")
    if not isinstance(ranks, list):
        raise PlanError("plan payload has no 'ranks' list")
    if dp is not None and len(ranks) != dp:
        raise PlanError(
            f"plan payload has {len(ranks)} ranks; the layout has {dp} "
            "(plan shards were written for another layout, or the payload is damaged)"
        )
    try:
        plan = StepPlan.from_dict(data)
    except PlanError as exc:
        raise PlanError(f"malformed plan payload: {exc}") from None
    except _SHAPE_ERRORS as exc:
        raise PlanError(f"malformed plan payload: {type(exc).__name__}: {str(exc)[:200]}") from None
    _check_docs(enumerate(plan.docs))
    return plan.validate()


def parse_rank_plan(text: str | bytes, *, dp: int | None = None) -> RankPlan:
    """The validated rank view of a JSON payload; ``dp`` (if given) is the layout's rank count."""
    data = _decode(text)
    if not isinstance(data, dict):
        raise PlanError(f"plan payload is a JSON {type(data).__name__}, not an object")
    check_format(data)
    ranks = data.get("ranks")
    if not isinstance(ranks, list):
        raise PlanError("plan payload has no 'ranks' list")
    if dp is not None and (data.get("dp") != dp or len(ranks) > dp):
        got = data.get("dp") if data.get("dp") != dp else f"{len(ranks)} listed"
        raise PlanError(
            f"plan payload has {got!s:.20} ranks; the layout has {dp} "
            "(plan shards were written for another layout, or the payload is damaged)"
        )
    try:
        plan = RankPlan.from_dict(data)
    except PlanError as exc:
        if type(exc) is not PlanError:
            raise
        raise PlanError(f"malformed plan payload: {exc}") from None
    except _SHAPE_ERRORS as exc:
        raise PlanError(f"malformed plan payload: {type(exc).__name__}: {str(exc)[:200]}") from None
    _check_docs(plan.docs.items())
    return plan.validate()


def _check_docs(docs: Iterable[tuple[int, Document]]) -> None:
    """Each document's cut points tile it (``slicing.check_cuts``) and its loss tokens are
    within ``[0, length]`` (the step's loss is divided by their sum)."""
    for i, d in docs:
        try:
            check_cuts(d.cuts, d.length)
        except ConfigError as exc:
            raise PlanError(f"malformed plan payload: document #{i}: {exc}") from None
        if not 0 <= d.loss_tokens <= d.length:
            raise PlanError(
                f"malformed plan payload: document #{i} has {d.loss_tokens} loss tokens "
                f"for {d.length} tokens"
            )
