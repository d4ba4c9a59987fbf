"""Loaders that hand each rank its :class:`StepPayload` for every step.

Two sources, both stock mosaicml-streaming datasets:

- :class:`DocumentLoader` over *document shards* (``slimdata build``). Every rank cuts the
  same global batches (``make_batches``: a shuffle seeded by ``seed + epoch``, then batches of
  at most ``global_batch_tokens``), solves the same :class:`StepPlan` (deterministic for the
  seed), and reads the tokens of *its own* slices by global sample index (``dataset[i]``).
  Reading by index, rather than exchanging tokens through torch.distributed, costs each
  rank only its own documents' bytes, needs no collective (so no rank waits on another's
  I/O), and makes resumption a pure function of a document count.
  Document metadata (lengths, slice boundaries) is what the build wrote: the samples'
  ``slices`` columns, or ``manifest.parquet`` when the caller passes
  :func:`slimdata.docsource.load_shard_documents`; every sample read for its tokens is
  checked against its document (:class:`slimdata.columns.SampleReader`).
- :class:`PlanShardLoader` over *plan shards* (``slimdata plan`` / ``build --plan``): reads
  payload ``(step, rank)`` and checks its stamp, and its loss-token total and step-wide
  fields against ``plan.json``; a misaligned or damaged shard raises
  :class:`~slimdata.errors.PlanError` instead of training on another rank's tokens or a
  wrong loss normalisation.

``state_dict()`` / ``load_state_dict()`` resume exactly: the document loader counts
*documents* consumed in the epoch (not rows or steps), the plan loader counts steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from slimdata.hooks.hf import max_positions
from slimdata.hooks.launcher import die_with_launcher
from slimdata.hooks.payload import StepPayload

from slimdata.columns import SampleReader, sample_document
from slimdata.cost import CostModel, ModelConfig
from slimdata.errors import ConfigError, InputError, PlanError, SlimdataError
from slimdata.mdsindex import check_dataset, local_dirs
from slimdata.plan import Document
from slimdata.planning import SIDECAR_NAME, build_cost_model
from slimdata.solver import Layout, PlanConfig, solve  # noqa: F401  (Layout: LoaderConfig's inherited annotation, resolved by the API reference)
from slimdata.solver.planshards import (
    check_payload,
    check_plan_sidecar,
    check_step_fields,
    payload_positions,
    read_plan_sidecar,
)

__all__ = ["DocumentLoader", "LoaderConfig", "PlanShardLoader", "documents_of"]


@dataclass(frozen=True, kw_only=True)
class LoaderConfig(PlanConfig):
    """How global batches are cut and planned: :class:`~slimdata.solver.PlanConfig`'s rules
    (context, oversize, pack cap, memory budget, the ones ``slimdata plan`` applies) plus the
    model the cost model is derived from.

    The solver's cost model, first that applies: ``cost``; the analytic model of ``model``
    (:meth:`ModelConfig.from_hf`: layers, hidden, heads, kv heads, ffn, vocab, dtype) on
    ``device`` with ``recompute``; the cost model the shards were built with (their
    ``slimdata.json``); the solver's default.
    """

    model: Any = None
    """The model being trained (a Hugging Face model, its ``config``, a
    :class:`~slimdata.cost.ModelConfig` or a preset name), or None."""
    device: str = "h100"
    """Device preset of the analytic cost model derived from ``model``."""
    recompute: str = "none"
    """Recompute policy of the analytic cost model derived from ``model`` (``none``: the
    runtime holds every activation until its pack's backward)."""

    def resolved_cost(self) -> CostModel | None:
        """``cost``, else the analytic model of ``model`` (None when neither is given)."""
        if self.cost is not None or self.model is None:
            return self.cost
        m = self.model
        shape = m if isinstance(m, (ModelConfig, str)) else ModelConfig.from_hf(m)
        return CostModel.analytic(shape, self.device, self.recompute)  # type: ignore[arg-type]


# CLI wording in the library's errors -> the loop-level argument that changes the same thing
_LOOP_ARGS = (
    ("--memory-gib", "Layout(memory_gib=...)"),
    ("--oversize split|truncate", "LoaderConfig(oversize='split' or 'truncate')"),
    ("--context", "Layout(context=...)"),
    ("--global-batch-tokens", "LoaderConfig(global_batch_tokens=...)"),
    ("--microbatches", "Layout(microbatches=...)"),
    ("raise pack_tokens", "raise Layout(pack_tokens=...)"),
    ("the DP size", "Layout(dp=...)"),
    ("cut finer slices", "rebuild the shards with a smaller --slice-tokens"),
)


def _recompute_arg(config: LoaderConfig) -> str:
    """What sets the recompute policy of ``config``'s cost model: ``recompute`` applies only
    to the model derived from ``model`` (:meth:`LoaderConfig.resolved_cost`)."""
    if config.cost is not None:
        return "LoaderConfig(cost=CostModel(...)) with recompute='full'"
    if config.model is None:
        return "LoaderConfig(model=..., recompute='full')"
    return "LoaderConfig(recompute='full')"


def _loop_error(exc: SlimdataError, config: LoaderConfig) -> SlimdataError:
    """The same error, its advice worded for a training loop instead of the CLI."""
    msg = str(exc)
    for cli, loop in (*_LOOP_ARGS, ("--recompute full", _recompute_arg(config))):
        msg = msg.replace(cli, loop)
    return type(exc)(msg)


def _shards_cost(dataset: Any) -> CostModel | None:
    """The cost model the shards were built with, when ``dataset`` (or what it wraps, through
    ``.ds``/``.dataset``) reads a local build that has its sidecar: a stock
    ``StreamingDataset(local=...)`` keeps that directory in ``streams[0].local``
    (:func:`~slimdata.mdsindex.local_dirs`). Several streams must agree on one model."""
    for _ in range(4):
        found = [d for d in local_dirs(dataset) if (d / SIDECAR_NAME).is_file()]
        models = [build_cost_model(d) for d in found]
        if models and all(m == models[0] for m in models):
            return models[0]
        dataset = getattr(dataset, "ds", None) or getattr(dataset, "dataset", None)
        if dataset is None:
            break
    return None


def _plan_sidecar(dataset: Any, plan_json: str | Path | None) -> dict[str, Any]:
    """The ``plan.json`` summary of plan shards: ``plan_json`` if given, else the one in the
    dataset's local directory. Every local ``plan.json`` is format-checked either way."""
    dirs = local_dirs(dataset)
    found = [s for s in map(check_plan_sidecar, dirs) if s is not None]
    if plan_json is not None:
        return read_plan_sidecar(plan_json)
    if len(found) != 1:
        where = ", ".join(map(str, dirs)) or "no local directory"
        raise InputError(
            f"plan shards need exactly one plan.json beside them, found {len(found)} ({where}): "
            "pass plan_json=<the plan.json `slimdata plan` wrote> so every payload's "
            "step-wide totals can be checked"
        )
    return found[0]


def _num_samples(dataset: Any) -> int:
    return int(getattr(dataset, "num_samples", None) or len(dataset))


def documents_of(dataset: Any) -> list[Document]:
    """Document metadata read from the samples: ``doc_id``, ``length`` and the build's slice
    boundaries (``slices``), each checked against the sample's tokens
    (:func:`slimdata.columns.sample_document`). Decodes every sample: for a ``slimdata build``
    output, :func:`slimdata.docsource.load_shard_documents` reads the same from its manifest."""
    return [sample_document(dataset[i], i) for i in range(_num_samples(dataset))]


class DocumentLoader:
    """This rank's payloads over document shards; iterate once per epoch."""

    def __init__(
        self,
        dataset: Any,
        *,
        rank: int,
        config: LoaderConfig,
        documents: Sequence[Document] | None = None,
    ) -> None:
        die_with_launcher()  # a killed torchrun leaves no rank behind
        if not 0 <= rank < config.layout.dp:
            raise ConfigError(f"rank={rank} is outside the layout's {config.layout.dp} ranks")
        _check_model_context(config)
        check_dataset(dataset)  # no shard outside the dataset directory is ever read
        self.dataset, self.rank, self.config = dataset, rank, config
        self.documents = list(documents) if documents is not None else documents_of(dataset)
        if any(d.sample < 0 for d in self.documents):
            raise ConfigError(
                "documents need their sample index (Document.sample) to read tokens by index"
            )
        self.epoch, self.consumed, self.step = 0, 0, 0
        given = config.resolved_cost()
        self.cost = given or _shards_cost(dataset)
        """The cost model every plan is solved with (:class:`LoaderConfig`)."""
        # every sample read is checked against its document; the cost columns only against
        # the build's own model (a model of the user's prices slices its own way)
        self._read = SampleReader(dataset, self.documents, cost=None if given else self.cost)

    def batches(self, epoch: int) -> list[list[Document]]:
        """Global batches of ``epoch`` (oversize rule, seeded shuffle; ``PlanConfig.batches``)."""
        try:
            return self.config.batches(self.documents, epoch)
        except SlimdataError as exc:
            raise _loop_error(exc, self.config) from None

    def solve(self, batch: Sequence[Document], step: int):
        """The plan of one global batch, with :attr:`cost`."""
        cfg = self.config
        try:
            return solve(batch, cfg.layout, cfg.strategy, cfg.seed, self.cost, step=step)
        except SlimdataError as exc:
            raise _loop_error(exc, cfg) from None

    def state_dict(self) -> dict[str, int]:
        """``documents``: documents of this epoch already handed out (all ranks agree)."""
        return {"epoch": self.epoch, "documents": self.consumed, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.consumed, self.step = (
            int(state["epoch"]),
            int(state["documents"]),
            int(state["step"]),
        )

    def __iter__(self) -> Iterator[StepPayload]:
        batches = self.batches(self.epoch)
        bounds = np.cumsum([0] + [len(b) for b in batches])
        start = int(np.searchsorted(bounds, self.consumed))
        if start >= len(bounds) or bounds[start] != self.consumed:
            raise PlanError(
                f"resume point of {self.consumed} documents is not a batch boundary of epoch "
                f"{self.epoch}: the run that saved this state (step {self.step}) batched the "
                "documents otherwise; resume with the LoaderConfig and documents it ran with "
                "(global_batch_tokens, layout, oversize, seed)"
            )
        for b in range(start, len(batches)):
            plan = self.solve(batches[b], self.step)
            tokens = self._tokens(plan)
            self.consumed += len(batches[b])
            self.step += 1
            yield StepPayload(plan=plan, rank=self.rank, tokens=tokens)
        self.epoch, self.consumed = self.epoch + 1, 0

    def _tokens(self, plan) -> np.ndarray:
        cache: dict[int, np.ndarray] = {}
        parts = []
        for s in plan.ranks[self.rank].slices():
            d = plan.docs[s.doc]
            if d.sample not in cache:
                cache[d.sample] = np.asarray(self._read(d.sample), dtype=np.uint32)
            parts.append(cache[d.sample][d.offset + s.start : d.offset + s.end])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def _check_ranks(sidecar: dict, rank: int, nodes: int, ranks_per_node: int) -> None:
    """The loader's layout is the one ``plan.json`` records, and ``rank`` one of its ranks."""
    recorded = (sidecar.get("nodes"), sidecar.get("ranks_per_node"))
    if recorded != (nodes, ranks_per_node):
        raise ConfigError(
            f"nodes={nodes}, ranks_per_node={ranks_per_node}: these plan shards were written "
            f"for nodes={recorded[0]}, ranks_per_node={recorded[1]} (plan.json); give the "
            "loader those, or re-run `slimdata plan` for this layout"
        )
    ranks = nodes * ranks_per_node
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < ranks:
        raise ConfigError(
            f"rank={rank!r}: the plan has {ranks} ranks ({nodes} nodes x {ranks_per_node}), "
            f"numbered 0 to {ranks - 1}"
        )


def _check_context(sidecar: dict, context: int | None) -> None:
    """The plan shards were solved for ``context`` (None: not checked), as ``plan.json``
    records (``slimdata plan --context``)."""
    if context is None:
        return
    if type(context) is not int or context < 1:
        raise ConfigError(f"context={context!r}: give the training's context length in tokens")
    solved = sidecar.get("context")
    if solved is None:
        raise ConfigError(
            f"context={context}: plan.json records no context to check it against (plan "
            "shards not written by `slimdata plan`); omit context="
        )
    if solved != context:
        raise ConfigError(
            f"context={context}: these plan shards were solved for context={solved!r} "
            f"(plan.json): their documents are cut and packed for {solved!r} tokens, not "
            f"{context}; re-run `slimdata plan --context {context}`, or train at context="
            f"{solved!r}"
        )


def _check_model_context(config: LoaderConfig) -> None:
    """``config.layout.context`` fits the positions of ``config.model`` (a Hugging Face
    model or config that says: ``max_position_embeddings``)."""
    limit = max_positions(config.model) if config.model is not None else None
    if limit is not None and config.layout.context > limit:
        raise ConfigError(
            f"Layout(context={config.layout.context}) is longer than the model's {limit} "
            f"positions (config.max_position_embeddings): plans would hold documents of up to "
            f"{config.layout.context} tokens; use Layout(context={limit}), or a model of "
            f"{config.layout.context} positions"
        )


class PlanShardLoader:
    """This rank's payloads from plan shards, stamp-checked.

    ``mode="index"`` reads payload ``(step, rank)`` at the global sample position the shard
    layout defines (``nodes``/``ranks_per_node``, as written to ``plan.json``); ``mode="iterate"``
    walks a stock ``StreamingDataset(shuffle=False, batch_size=1, num_canonical_nodes=nodes)``
    as streaming partitions it for this rank. Both check every payload's (step, rank) stamp,
    and its step-wide fields (the loss-token total it normalises by, and the digest of the
    rest) against ``plan.json``, which is read from the dataset's local directory, or from
    ``plan_json`` for a stream whose local cache does not hold it
    (:func:`~slimdata.solver.planshards.check_step_fields`). Under static CP (``cp`` in
    ``plan.json``) process ``rank`` gets the payload of DP rank ``rank // cp``
    (:mod:`slimdata.hooks.cp`). Each payload carries this rank's view of its step's plan
    (:class:`RankPlan`); plan shards of an older format raise
    :class:`~slimdata.errors.PlanFormatError` here, before any read.

    ``context``: the context length the training runs at; plan shards solved for another
    (``slimdata plan --context``, recorded in ``plan.json``) are refused with a
    :class:`~slimdata.errors.ConfigError` naming both: their documents were cut and packed
    for that length, not this one.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        rank: int,
        nodes: int = 1,
        ranks_per_node: int = 1,
        mode: str = "index",
        plan_json: str | Path | None = None,
        context: int | None = None,
    ) -> None:
        die_with_launcher()  # a killed torchrun leaves no rank behind
        if mode not in ("index", "iterate"):
            raise ConfigError(f"mode={mode!r}: use 'index' or 'iterate'")
        check_dataset(dataset)
        self.sidecar = _plan_sidecar(dataset, plan_json)
        """The ``plan.json`` summary every payload is checked against."""
        self.dataset, self.rank, self.mode = dataset, rank, mode
        self.nodes, self.ranks_per_node = nodes, ranks_per_node
        _check_ranks(self.sidecar, rank, nodes, ranks_per_node)
        _check_context(self.sidecar, context)
        ranks = nodes * ranks_per_node
        # static CP: process ``rank`` runs DP rank ``rank // cp`` (plan.json records cp)
        self.cp = self.sidecar.get("cp", 1)
        if (
            not isinstance(self.cp, int)
            or isinstance(self.cp, bool)
            or self.cp < 1
            or ranks % self.cp
        ):
            raise PlanError(
                f"plan.json records cp={self.cp!r}: need one integer >= 1 dividing the "
                f"{ranks} ranks; re-run `slimdata plan --cp`"
            )
        self.dp = ranks // self.cp
        self.steps = _num_samples(dataset) // ranks
        if self.sidecar["steps"] != self.steps:
            raise PlanError(
                f"plan.json records {self.sidecar['steps']} steps; the plan shards hold "
                f"{self.steps} steps of {ranks} ranks: give the loader the nodes and "
                "ranks_per_node recorded in plan.json, and the plan.json of these shards"
            )
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if self.mode == "iterate" and int(state["step"]):
            raise ConfigError(
                "resume plan shards with mode='index' (iteration restarts the stream)"
            )
        self.step = int(state["step"])

    def _payload(self, sample: dict, step: int) -> StepPayload:
        plan, tokens = check_payload(sample, step, self.rank, self.dp, self.cp)
        check_step_fields(plan, self.sidecar)
        return StepPayload(plan=plan, rank=self.rank // self.cp, tokens=tokens)

    def __iter__(self) -> Iterator[StepPayload]:
        if self.mode == "iterate":
            for step, sample in enumerate(_decoded(iter(self.dataset))):
                self.step = step + 1
                yield self._payload(sample, step)
            return
        pos = payload_positions(self.steps, self.nodes, self.ranks_per_node)
        while self.step < self.steps:
            step = self.step
            try:
                sample = self.dataset[int(pos[step, self.rank])]
            except _DECODE_ERRORS as exc:
                raise _undecodable(exc) from None
            self.step += 1
            yield self._payload(sample, step)


_DECODE_ERRORS = (ValueError, IndexError, KeyError, OSError)
"""What streaming raises on a plan shard it cannot decode (cut, overwritten, renamed columns)."""


def _undecodable(exc: Exception) -> PlanError:
    return PlanError(
        f"plan shards: a payload cannot be decoded ({type(exc).__name__}: {str(exc)[:120]}); "
        "the shard is damaged: re-run `slimdata plan`"
    )


def _decoded(samples: Iterator[dict]) -> Iterator[dict]:
    """The samples of a plan-shard stream, a decoding failure as :func:`_undecodable`."""
    while True:
        try:
            sample = next(samples)
        except StopIteration:
            return
        except _DECODE_ERRORS as exc:
            raise _undecodable(exc) from None
        yield sample
