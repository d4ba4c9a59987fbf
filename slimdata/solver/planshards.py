"""Plan shards (design §8): every step of an epoch solved at build time, one MDS sample per
(step, rank) payload, ordered so that a stock ``StreamingDataset(shuffle=False, batch_size=1,
num_canonical_nodes=nodes)`` hands rank ``r`` exactly its payloads in step order.

Columns: ``step`` (int), ``rank`` (int), ``plan`` (str: the JSON of this rank's view of the
step's plan, :class:`~slimdata.plan.rankplan.RankPlan`: its own packs, the members' merge
packs of its merge group, the documents of those slices and the step-wide fields),
``tokens`` (``ndarray:uint32``: this rank's tokens, concatenated in the order of its forward
packs' slices; empty when planned from lengths), ``ntokens`` (int: the length of ``tokens``; MDS cannot encode an empty array, so an empty
payload is stored as one zero token with ``ntokens = 0``; :func:`read_plan_payload` undoes it)
and ``crc32`` (int: :func:`payload_crc32` of the plan text and the tokens, which
:func:`read_plan_payload` checks: a damaged shard is an error, not a wrong batch).

Ordering: :func:`payload_positions` asks mosaicml-streaming's own partitioner
(``streaming.base.partition.get_partitions``, algorithm ``orig``, the default) which global
sample index each (node, rank, worker) reads at each position, and places payload
``(step, rank)`` there. The layout assumes ``num_canonical_nodes == nodes`` (the physical node
count) and ``workers_per_rank`` DataLoader workers (1 = iterating the dataset directly); the
sidecar ``plan.json`` records them and the runtime checks every payload's stamp with
:func:`check_payload`.

Format: ``plan.json`` has ``"slimdata_plan_shards": 4`` (:data:`PLAN_SHARDS_FORMAT`), the
payloads ``"format": 2``. ``plan.json`` also records, per step, the loss-token total and a
digest of the step-wide fields (``step_loss_tokens``, ``step_digests``), against which
:func:`check_step_fields` checks every payload at load: a rank divides its loss by the total
its payload carries, which no single payload can prove. Format 1 stored the whole step plan in
every payload (64 copies of it per step at DP 64), format 2 had no per-step records, format
3 no checksum per payload; reading any of them raises :class:`~slimdata.errors.PlanFormatError` (:func:`read_plan_sidecar`,
:func:`read_plan_payload`).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from slimdata.errors import ConfigError, PlanError, PlanFormatError
from slimdata.paths import write_atomic
from slimdata.plan.load import parse_rank_plan
from slimdata.plan.rankplan import RankPlan, rank_views
from slimdata.plan.types import StepPlan

__all__ = [
    "MAX_SIDECAR_BYTES",
    "PLAN_COLUMNS",
    "PLAN_SHARDS_FORMAT",
    "PLAN_SIDECAR",
    "TIMING_KEYS",
    "check_payload",
    "check_plan_sidecar",
    "check_step_fields",
    "payload_crc32",
    "payload_positions",
    "rank_tokens",
    "read_plan_payload",
    "read_plan_sidecar",
    "without_timings",
    "write_plan_shards",
]

PLAN_COLUMNS = {
    "step": "int",
    "rank": "int",
    "plan": "str",
    "tokens": "ndarray:uint32",
    "ntokens": "int",
    "crc32": "int",
}
PLAN_SIDECAR = "plan.json"
PLAN_SHARDS_FORMAT = 4
"""``slimdata_plan_shards`` in ``plan.json``: 4 = one rank's view per payload with a CRC-32 of
its plan and tokens, and per-step loss-token totals and digests in ``plan.json`` (3 had no
checksums, 2 no per-step records)."""
MAX_SIDECAR_BYTES = 64 << 20
"""Largest ``plan.json`` read (64 MiB): its per-step records take about 40 bytes a step, so
this bounds a loader's parse while leaving room for 1.5 million steps."""

TIMING_KEYS = frozenset({"solve_ms", "milp_ms", "solve_ms_total"})
"""Wall-clock measurements in plan metadata: kept in memory and in the returned summary (the
CLI prints them), never written, so the same inputs give byte-identical plan shards."""

TokenSource = Callable[[int], np.ndarray]
"""``sample index -> token array`` of the document shards (``Document.sample``)."""


def without_timings(meta: Any) -> Any:
    """``meta`` with every :data:`TIMING_KEYS` entry removed, at any depth."""
    if isinstance(meta, dict):
        return {k: without_timings(v) for k, v in meta.items() if k not in TIMING_KEYS}
    if isinstance(meta, list):
        return [without_timings(v) for v in meta]
    return meta


def payload_positions(
    steps: int, nodes: int, ranks_per_node: int, workers_per_rank: int = 1
) -> np.ndarray:
    """``pos[step, rank]`` = global sample index at which payload (step, rank) must be written."""
    from slimdata.ingest.mds import get_partitions

    dp = nodes * ranks_per_node
    n = steps * dp
    if n == 0:
        return np.zeros((0, dp), dtype=np.int64)
    ids = get_partitions("orig", n, nodes, nodes, ranks_per_node, workers_per_rank, 1)
    pos = np.full((steps, dp), -1, dtype=np.int64)
    for node in range(nodes):
        for local in range(ranks_per_node):
            r = node * ranks_per_node + local
            # a DataLoader takes batches from its workers round-robin: batch k from worker k % W
            seq = ids[node, local, :, :, 0].T.reshape(-1)
            seq = seq[seq >= 0][:steps]
            if len(seq) < steps:
                raise PlanError(
                    f"streaming partition gives rank {r} only {len(seq)} of {steps} samples"
                )
            pos[:, r] = seq
    if len(np.unique(pos)) != n:
        raise PlanError(
            "streaming partition repeats samples for this layout; cannot align plan payloads"
        )
    return pos


def rank_tokens(plan: StepPlan, rank: int, tokens_of: TokenSource | None) -> np.ndarray:
    """Tokens of ``rank`` in the order of its forward packs' slices (empty without a source)."""
    if tokens_of is None:
        return np.zeros(0, dtype=np.uint32)
    parts = []
    cache: dict[int, np.ndarray] = {}
    for pack in plan.ranks[rank].forward:
        for s in pack.slices:
            d = plan.docs[s.doc]
            if d.sample < 0:
                raise PlanError(
                    f"document doc_id {d.doc_id!r} has no sample index: plan from shards to carry tokens"
                )
            if d.sample not in cache:
                cache[d.sample] = np.asarray(tokens_of(d.sample), dtype=np.uint32)
            parts.append(cache[d.sample][d.offset + s.start : d.offset + s.end])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def write_plan_shards(
    plans: Iterable[StepPlan],
    out: str | Path,
    *,
    nodes: int,
    ranks_per_node: int,
    tokens_of: TokenSource | None = None,
    workers_per_rank: int = 1,
    compression: str | None = None,
    size_limit: int | str = 1 << 26,
    extra: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
    cp: int = 1,
    opened: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Write plan shards to ``out`` (must be empty or absent); returns the sidecar summary.

    Deterministic: payloads and ``plan.json`` carry no wall-clock timings
    (:data:`TIMING_KEYS`); the returned summary still has them. ``plan.json`` records every
    step's loss-token total and step-wide digest (:func:`check_step_fields`). ``extra``: more
    summary fields, or a function that gives them once every plan is read.

    Every plan must have ``nodes * ranks_per_node / cp`` ranks and steps ``0..n-1`` in order.
    Each is validated, cut into rank views and encoded as it arrives (a generator of plans is
    never held whole: a step's objects are still in the CPU caches, and its plan is dropped
    unless ``tokens_of`` needs it); nothing is written before the last. Static CP (``cp >
    1``): the payload of process ``r`` (stamped ``rank = r``) is DP rank ``r // cp``'s view
    and tokens, so each member of a CP group reads its DP rank's payload. ``opened``: called
    once the shard writer holds ``out`` (which it takes only empty), before its first shard.

    Write order: the shards (the writer writes each as it fills), ``index.json`` (when the
    writer closes), then ``plan.json`` (atomically: :func:`~slimdata.paths.write_atomic`), so
    a folder without a ``plan.json`` holds the plan shards of a run that did not finish.
    """
    if workers_per_rank < 1:
        raise ConfigError(f"workers_per_rank={workers_per_rank!r} must be >= 1")
    steps = _EncodedSteps.of(plans, nodes * ranks_per_node // cp, keep=tokens_of is not None)
    order = _sample_order(len(steps.texts), nodes, ranks_per_node, workers_per_rank)
    _write_payloads(steps, order, out, tokens_of, compression, size_limit, cp, opened)
    summary = {
        "slimdata_plan_shards": PLAN_SHARDS_FORMAT,
        "steps": len(steps.texts),
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "workers_per_rank": workers_per_rank,
        "num_canonical_nodes": nodes,
        "cp": cp,
        "strategy": steps.strategy,
        "tokens": steps.tokens,
        "documents": steps.documents,
        **((extra() if callable(extra) else extra) or {}),
        "step_loss_tokens": steps.loss_tokens,
        "step_digests": steps.digests,
    }
    write_atomic(Path(out) / PLAN_SIDECAR, json.dumps(without_timings(summary), indent=2))
    return summary


@dataclasses.dataclass
class _EncodedSteps:
    """An epoch's plans as :func:`write_plan_shards` needs them: each rank view's JSON per
    step, the per-step records of ``plan.json``, the totals, and the plans themselves only
    when their tokens are to be written (``keep``)."""

    texts: list[list[str]]
    loss_tokens: list[int]
    digests: list[str]
    plans: list[StepPlan]
    strategy: str | None = None
    tokens: int = 0
    documents: int = 0
    dp: int = 1

    @classmethod
    def of(cls, plans: Iterable[StepPlan], dp: int, keep: bool) -> _EncodedSteps:
        """Each plan validated once (whatever the per-step solve skipped), with steps
        ``0..n-1`` of ``dp`` ranks, then encoded."""
        out = cls([], [], [], [], dp=dp)
        for i, p in enumerate(plans):
            if p.step != i or p.dp != dp:
                raise PlanError(
                    f"plan #{i} has step {p.step} and {p.dp} ranks; expected step {i} and {dp} ranks"
                )
            p.validate()
            views = rank_views(dataclasses.replace(p, meta=without_timings(p.meta)))
            out.texts.append([v.to_json() for v in views])
            out.loss_tokens.append(views[0].loss_tokens)
            out.digests.append(views[0].step_digest())
            if i == 0:
                out.strategy = p.strategy
            out.tokens += int(p.tokens)
            out.documents += len(p.docs)
            if keep:
                out.plans.append(p)
        return out


def _sample_order(steps: int, nodes: int, ranks_per_node: int, workers: int) -> list[int]:
    """``step * ranks + rank`` of the payload at every global sample index, in sample order."""
    pos = payload_positions(steps, nodes, ranks_per_node, workers)
    by_pos = np.empty(pos.size, dtype=np.int64)
    by_pos[pos.reshape(-1)] = np.arange(pos.size)
    return by_pos.tolist()


def _write_payloads(
    steps: _EncodedSteps,
    order: list[int],
    out: str | Path,
    tokens_of: TokenSource | None,
    compression: str | None,
    size_limit: int | str,
    cp: int = 1,
    opened: Callable[[], None] | None = None,
) -> None:
    """One MDS sample per (step, process rank) in ``order``: stamp, rank view, tokens (under
    static CP, process ``r`` gets DP rank ``r // cp``'s); ``opened``: called once the writer
    holds ``out``."""
    from slimdata.ingest.mds import writer_class

    writer = writer_class()  # streaming.MDSWriter, imported without all of streaming
    ranks = steps.dp * cp
    empty = np.zeros(1, dtype=np.uint32)
    with writer(
        out=str(out), columns=PLAN_COLUMNS, compression=compression, size_limit=size_limit
    ) as w:
        if opened is not None:
            opened()
        for flat in order:
            step, rank = divmod(flat, ranks)
            toks = rank_tokens(steps.plans[step], rank // cp, tokens_of) if tokens_of else empty[:0]
            w.write(
                {
                    "step": step,
                    "rank": rank,
                    "plan": steps.texts[step][rank // cp],
                    "tokens": toks if len(toks) else empty,
                    "ntokens": len(toks),
                    "crc32": payload_crc32(steps.texts[step][rank // cp], toks),
                }
            )


def check_plan_sidecar(directory: str | Path) -> dict[str, Any] | None:
    """The ``plan.json`` of plan shards in ``directory`` (None if it has none):
    :func:`read_plan_sidecar`."""
    path = Path(directory) / PLAN_SIDECAR
    return read_plan_sidecar(path) if path.is_file() else None


def read_plan_sidecar(path: str | Path) -> dict[str, Any]:
    """The summary in a ``plan.json``, at most :data:`MAX_SIDECAR_BYTES` of it read; raises
    :class:`PlanFormatError` if the shards were written in another format, :class:`PlanError`
    if it is unreadable or its per-step records are malformed."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SIDECAR_BYTES:
            raise ValueError(f"over {MAX_SIDECAR_BYTES} bytes")
        summary = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise PlanError(f"{path}: unreadable plan sidecar ({str(exc)[:100]})") from None
    fmt = summary.get("slimdata_plan_shards") if isinstance(summary, dict) else None
    if fmt != PLAN_SHARDS_FORMAT:
        raise PlanFormatError(
            f"{path}: plan shards of format {fmt!r:.20}; this slimdata reads format "
            f"{PLAN_SHARDS_FORMAT} (one rank's view per payload with its checksum, per-step "
            "totals in plan.json): "
            "re-run `slimdata plan` (or `slimdata build --plan`) to rewrite them"
        )
    _check_step_records(path, summary)
    return summary


def _check_step_records(path: Path, summary: dict[str, Any]) -> None:
    """``step_loss_tokens`` (non-negative integers) and ``step_digests`` (strings) list one
    entry for each of the ``steps``."""
    steps = summary.get("steps")
    losses, digests = summary.get("step_loss_tokens"), summary.get("step_digests")
    ok = (
        type(steps) is int
        and isinstance(losses, list)
        and isinstance(digests, list)
        and len(losses) == len(digests) == steps
        and all(type(x) is int and x >= 0 for x in losses)
        and all(isinstance(x, str) for x in digests)
    )
    if not ok:
        raise PlanError(
            f"{path}: per-step records are damaged (step_loss_tokens and step_digests must "
            "list one non-negative integer and one digest for each of the 'steps'): re-run "
            "`slimdata plan` to rewrite the plan shards"
        )


def check_step_fields(plan: RankPlan, summary: dict[str, Any]) -> None:
    """Raise :class:`PlanError` unless ``plan`` (a payload's view) carries the step-wide fields
    that ``plan.json`` (``summary``, checked by :func:`read_plan_sidecar`) records for its
    step: the loss-token total every rank divides its loss by, and the digest of the rest
    (:meth:`RankPlan.step_digest`). One rank's payload cannot prove its step's total; the
    sidecar, written once per plan, can."""
    step, rank = plan.step, plan.rank
    where = f"payload (step {step}, rank {rank})"
    fix = "the plan shards or plan.json are damaged; re-run `slimdata plan` to rewrite them"
    if not 0 <= step < summary["steps"]:
        raise PlanError(f"{where}: plan.json records only {summary['steps']} steps; {fix}")
    expected = summary["step_loss_tokens"][step]
    if plan.loss_tokens != expected:
        raise PlanError(
            f"{where} divides its loss by {plan.loss_tokens} loss tokens; plan.json records "
            f"{expected} for step {step}: {fix}"
        )
    if plan.step_digest() != summary["step_digests"][step]:
        raise PlanError(
            f"{where} disagrees with plan.json on the step's shared fields (strategy, mode, "
            f"merge groups, lockstep schedule or metadata): {fix}"
        )


def read_plan_payload(
    sample: dict[str, Any], dp: int | None = None
) -> tuple[int, int, RankPlan, np.ndarray]:
    """``(step, rank, plan, tokens)`` of one plan-shard sample (the padding token of an empty
    payload removed: ``tokens`` has ``ntokens`` entries); ``plan`` is the rank's view.

    The view is parsed defensively and validated (:func:`slimdata.plan.load.parse_rank_plan`,
    ``dp`` the expected rank count); any defect is a :class:`PlanError`, a payload of an older
    format a :class:`PlanFormatError`.
    """
    missing = sorted(set(PLAN_COLUMNS) - set(sample))
    if missing or not isinstance(sample["plan"], str | bytes):
        raise PlanError(
            f"not a slimdata plan payload (columns {sorted(sample)[:8]}; missing {missing}, or "
            "'plan' is not text): point the loader at `slimdata plan` output"
        )
    tokens = np.asarray(sample["tokens"], dtype=np.uint32)[: int(sample["ntokens"])]
    crc = payload_crc32(sample["plan"], tokens)
    if sample.get("crc32") != crc:
        raise PlanError(
            f"plan payload stamped step {sample['step']}, rank {sample['rank']} is damaged: its "
            f"plan and tokens have CRC-32 {crc}, not the {sample.get('crc32')} written with them; "
            "re-run `slimdata plan` (or copy the plan shards again)"
        )
    plan = parse_rank_plan(sample["plan"], dp=dp)
    return int(sample["step"]), int(sample["rank"]), plan, tokens


def payload_crc32(plan_text: str | bytes, tokens: np.ndarray) -> int:
    """CRC-32 of a payload's plan text (UTF-8) followed by its tokens (little-endian uint32)."""
    crc = zlib.crc32(plan_text.encode() if isinstance(plan_text, str) else plan_text)
    return zlib.crc32(np.ascontiguousarray(tokens, dtype="<u4").tobytes(), crc)


def check_payload(
    sample: dict[str, Any], step: int, rank: int, dp: int | None = None, cp: int = 1
) -> tuple[RankPlan, np.ndarray]:
    """Return ``(plan, tokens)`` if ``sample`` is the valid payload of (step, rank), else
    raise :class:`PlanError` (misaligned loader: wrong num_canonical_nodes, shuffle, or
    workers; or a damaged plan: see :func:`read_plan_payload`). Under static CP ``rank`` is
    the process, whose plan is DP rank ``rank // cp``'s."""
    got_step, got_rank, plan, tokens = read_plan_payload(sample, dp)
    if (got_step, got_rank) != (step, rank):
        raise PlanError(
            f"plan payload misaligned: rank {rank} at step {step} received the payload of step "
            f"{got_step}, rank {got_rank}; read plan shards with shuffle=False, batch_size=1, "
            "num_canonical_nodes=<nodes> and the workers_per_rank recorded in plan.json"
        )
    if plan.step != step:
        raise PlanError(f"plan payload stamped step {step} carries the plan of step {plan.step}")
    if plan.rank != rank // cp:
        raise PlanError(
            f"plan payload stamped rank {rank} carries the plan of rank {plan.rank}"
            + (f", not of DP rank {rank // cp} (cp={cp})" if cp > 1 else "")
        )
    expected = plan.tokens
    if len(tokens) not in (0, expected):
        raise PlanError(
            f"payload (step {step}, rank {rank}) has {len(tokens)} tokens; its plan needs {expected}"
        )
    return plan, tokens
