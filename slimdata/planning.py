"""Plan an epoch from document shards or a lengths file and write plan shards.

The one library call behind ``slimdata plan`` and ``slimdata build --plan``. Planning from
shards uses the cost model recorded in the build's sidecar unless another is given, so the
plan balances the same costs that were written next to every slice.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slimdata.columns import SampleReader
from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths, load_lengths, load_shard_documents
from slimdata.errors import ConfigError, InputError, OutputExistsError, PlanError
from slimdata.gcpause import cyclic_gc_paused
from slimdata.paths import (
    check_creatable,
    check_same_record,
    holds_any,
    read_record,
    write_atomic,
)
from slimdata.slicing import DEFAULT_SLICE_TOKENS

if TYPE_CHECKING:
    from slimdata.plan import Document
    from slimdata.solver.planshards import TokenSource

__all__ = [
    "REQUEST_NAME",
    "SIDECAR_NAME",
    "build_cost_model",
    "check_plan_layout",
    "plan_to_shards",
]

SIDECAR_NAME = "slimdata.json"
REQUEST_NAME = "plan_request.json"
"""The record of a plan (:func:`_plan_request`), written into its output folder before the
first shard: a folder a killed plan left holds it (``--overwrite`` replaces such a folder,
``--resume`` checks it is finishing the same plan), and a finished one keeps it."""
REQUEST_KEY = "slimdata_plan_request"
REQUEST_FORMAT = 1
"""Format of :data:`REQUEST_NAME` (its ``slimdata_plan_request`` key)."""


def build_vocab_size(shards: str | Path) -> int | None:
    """The vocabulary size of the tokenizer a ``slimdata build`` output was written with
    (its sidecar's ``tokenizer.vocab_size``), or None where the sidecar does not give one."""
    try:
        size = json.loads((Path(shards) / SIDECAR_NAME).read_text())["tokenizer"]["vocab_size"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def build_cost_model(shards: str | Path) -> CostModel:
    """The cost model a ``slimdata build`` output was annotated with (from its sidecar)."""
    sidecar = Path(shards) / SIDECAR_NAME
    try:
        data = json.loads(sidecar.read_text())
        return CostModel.from_dict(data["cost_model"])
    except FileNotFoundError:
        raise InputError(
            f"{shards} has no {SIDECAR_NAME}: was it written by `slimdata build`?"
        ) from None
    except (KeyError, json.JSONDecodeError, TypeError) as exc:
        raise InputError(f"{sidecar}: no readable cost model ({exc})") from exc
    except ConfigError as exc:  # a field out of range (CostModel's checks)
        raise InputError(f"{sidecar}: {exc}") from None


@cyclic_gc_paused()
def plan_to_shards(
    out: str | Path,
    *,
    shards: str | Path | None = None,
    lengths: str | Path | None = None,
    nodes: int,
    ranks_per_node: int,
    global_batch_tokens: int,
    memory_gib: float,
    strategy: str = "slimpack",
    seed: int = 0,
    context: int = 131072,
    mode: str = "free",
    oversize: str = "split",
    slice_tokens: int | None = None,
    workers_per_rank: int = 1,
    cost: CostModel | None = None,
    cp: int | str = 1,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Solve every step of one epoch and write one MDS sample per (step, rank) to ``out``.

    Exactly one of ``shards`` (a ``slimdata build`` output; payloads then carry the tokens)
    and ``lengths`` (a lengths file; payloads carry no tokens) is needed. ``slice_tokens``
    cuts the documents of a lengths file (default :data:`DEFAULT_SLICE_TOKENS`); shards keep
    the slices they were built with. ``cp``: static context parallelism
    (:func:`slimdata.solver.epoch.write_epoch_plan`); ``"auto"`` chooses it
    (:mod:`slimdata.autocp`) and the summary's ``cp_choice`` says how. An existing non-empty
    ``out`` is refused unless ``overwrite``, which replaces earlier plan shards there, whole or
    left by a killed run, or ``resume``, which solves again the plan a killed run was writing
    there (same inputs and options: its :data:`REQUEST_NAME`; :func:`_replaces`). The plan
    shards are the same bytes either way. ``progress``: a bar of the steps solved on standard
    error, when it is a terminal. Returns the summary that is also written to
    ``out/plan.json``.
    """
    from slimdata.solver.epoch import write_epoch_plan

    if (shards is None) == (lengths is None):
        raise ConfigError("give either document shards or a lengths file (exactly one)")
    settings = dict(
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        global_batch_tokens=global_batch_tokens,
        memory_gib=memory_gib,
        strategy=strategy,
        seed=seed,
        context=context,
        mode=mode,
        oversize=oversize,
        workers_per_rank=workers_per_rank,
    )
    out = Path(out)
    request = _plan_request(
        shards, lengths, cost, {**settings, "cp": cp, "slice_tokens": slice_tokens}
    )
    replace = _replaces(out, overwrite, resume, request)
    check_creatable(out)
    docs, tokens_of, cost = _documents(shards, lengths, slice_tokens, cost)
    common = dict(settings, cost=cost, tokens_of=tokens_of, progress=progress)
    common["opened"] = functools.partial(_write_request, out, request)
    if replace:  # the inputs are read: only now is the earlier plan removed
        _discard(out, created=False)
    created = not out.exists()
    try:
        _make_output(out)
        if cp != "auto":
            return write_epoch_plan(docs, out, cp=cp, **common)  # type: ignore[arg-type]
        return _plan_auto_cp(docs, out, common)
    except BaseException:  # nothing half-written is left to look like a plan
        _discard(out, created)
        raise


def _plan_request(
    shards: str | Path | None,
    lengths: str | Path | None,
    cost: CostModel | None,
    options: dict[str, Any],
) -> dict[str, Any]:
    """What :data:`REQUEST_NAME` records of a plan: its input (the folder or file, resolved),
    the cost model it was given (None: the build's, or the default for a lengths file) and
    its options; ``--resume`` continues only a plan whose record is equal."""
    kind, path = ("shards", shards) if shards is not None else ("lengths", lengths)
    assert path is not None  # exactly one of shards/lengths, checked by the caller
    return {
        REQUEST_KEY: REQUEST_FORMAT,
        "input": {kind: str(Path(path).resolve())},
        "cost_model": None if cost is None else cost.to_dict(),
        "options": options,
    }


def _write_request(out: Path, request: dict[str, Any]) -> None:
    """Record the plan's request in ``out``, atomically, once the shard writer holds ``out``
    and before its first shard (the writer takes only an empty folder)."""
    write_atomic(out / REQUEST_NAME, json.dumps(request, indent=1, sort_keys=True))


def _documents(
    shards: str | Path | None,
    lengths: str | Path | None,
    slice_tokens: int | None,
    cost: CostModel | None,
) -> tuple[list[Document], TokenSource | None, CostModel | None]:
    """The documents to plan, a reader of their tokens (None for a lengths file) and the
    cost model (the build's for shards, unless ``cost`` is given)."""
    if lengths is not None:
        size = DEFAULT_SLICE_TOKENS if slice_tokens is None else slice_tokens
        return documents_from_lengths(load_lengths(lengths), size), None, cost
    assert shards is not None  # exactly one of shards/lengths, checked by the caller
    return _shard_source(shards, slice_tokens, cost)


def check_plan_layout(
    out: str | Path,
    *,
    nodes: int,
    ranks_per_node: int,
    memory_gib: float,
    context: int,
    mode: str,
    cp: int | str,
    overwrite: bool,
) -> None:
    """The checks of :func:`plan_to_shards` that need no document, for a caller that makes
    the documents first (``build --plan``) and must not fail only after that: ``out`` can
    take plan shards, and the layout is valid (a fixed ``cp`` divides the ranks)."""
    from slimdata.solver.epoch import epoch_layout

    _replaces(Path(out), overwrite)
    check_creatable(Path(out))
    fixed = cp if isinstance(cp, int) else 1  # "auto" chooses among the sizes that divide
    epoch_layout(nodes, ranks_per_node, fixed, memory_gib, context, mode)


def _make_output(out: Path) -> None:
    """Make the output folder (and its parents) before the epoch is solved."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot make the folder ({exc.strerror})") from None


def _replaces(
    out: Path, overwrite: bool, resume: bool = False, request: dict[str, Any] | None = None
) -> bool:
    """Whether ``out`` holds plan shards to replace. A non-empty ``out`` is refused without
    ``overwrite`` or ``resume``, and with them unless it holds a ``plan.json`` or a
    :data:`REQUEST_NAME` (the plan shards of a finished or a killed run: a typo must not
    wipe a build or unrelated files); ``resume`` also needs a :data:`REQUEST_NAME` equal to
    ``request``."""
    from slimdata.solver.planshards import PLAN_SIDECAR

    if overwrite and resume:
        raise ConfigError(
            "--overwrite and --resume exclude each other: resume finishes an interrupted plan "
            "with the same options, overwrite replaces it"
        )
    if not (out.is_dir() and any(out.iterdir())):
        return False
    if not (overwrite or resume):
        raise OutputExistsError(_not_empty(out))
    if not holds_any(out, (PLAN_SIDECAR, REQUEST_NAME)):
        raise OutputExistsError(
            f"refusing to {'--resume' if resume else '--overwrite'} {out}: it does not look "
            f"like plan shards (no {PLAN_SIDECAR} or {REQUEST_NAME}); remove it yourself if "
            "you mean it"
        )
    if resume:
        assert request is not None
        _check_resumable(out, request)
    return True


def _not_empty(out: Path) -> str:
    """Why a non-empty ``out`` is refused without ``--overwrite`` or ``--resume``."""
    from slimdata.solver.planshards import PLAN_SIDECAR

    if (out / REQUEST_NAME).is_file() and not (out / PLAN_SIDECAR).is_file():
        return (
            f"{out} holds the plan shards of an interrupted run (no {PLAN_SIDECAR}); pass "
            "--resume to finish them or --overwrite to replace them"
        )
    if (out / PLAN_SIDECAR).is_file():
        return (
            f"{out} exists and is not empty: it holds finished plan shards ({PLAN_SIDECAR}); "
            "pass --overwrite to replace them or choose a new output directory"
        )
    return (
        f"{out} exists and is not empty; pass --overwrite to replace it or choose a new "
        "output directory"
    )


def _check_resumable(out: Path, request: dict[str, Any]) -> None:
    """Refuse to resume ``out`` unless its :data:`REQUEST_NAME` records ``request``."""
    if not (out / REQUEST_NAME).is_file():
        raise ConfigError(
            f"cannot resume {out}: it holds no {REQUEST_NAME} (plan shards of an earlier "
            "slimdata, or a run killed while it wrote that file); use --overwrite to start over"
        )
    old = read_record(out, REQUEST_NAME, REQUEST_KEY, REQUEST_FORMAT)
    check_same_record(out, old, request, "planned")


def _discard(out: Path, created: bool) -> None:
    """Remove what a failed plan wrote: ``out`` itself when the plan created it, else its
    contents (it was empty)."""
    if created:
        shutil.rmtree(out, ignore_errors=True)
    elif out.is_dir():
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def _plan_auto_cp(docs: list[Document], out: Path, common: dict[str, Any]) -> dict[str, Any]:
    """The epoch at the first static CP size of :func:`slimdata.autocp.cp_preference`'s order
    that plans every step; the summary says which and why (``cp_choice``)."""
    from slimdata.autocp import cp_preference
    from slimdata.solver.epoch import write_epoch_plan

    keys = ("global_batch_tokens", "memory_gib", "context", "mode", "strategy", "seed", "cost")
    choice = cp_preference(
        docs,
        ranks=common["nodes"] * common["ranks_per_node"],
        ranks_per_node=common["ranks_per_node"],
        oversize=common["oversize"],
        **{k: common[k] for k in keys},
    )
    failed: list[str] = []
    errors: list[PlanError] = []
    for k in choice.order:
        try:
            summary = write_epoch_plan(docs, out, cp=k, **common)
        except PlanError as exc:
            if holds_any(out, (REQUEST_NAME,)):
                raise  # failed while writing its shards, every step solved: not a matter of CP
            failed.append(f"cp={k}: {exc}")
            errors.append(exc)
            continue
        how = {"cp": k, "reason": choice.reason, "screened": choice.tried, "failed": failed}
        return {**summary, "cp_choice": how}
    if len({str(e) for e in errors}) == 1:  # the same at every size: not a matter of CP
        raise errors[0]
    raise PlanError(
        "no static context-parallel size plans every step (--cp auto tried "
        + ", ".join(f"cp={k}" for k in choice.order)
        + "):\n"
        + "\n".join(failed)
    )


def _shard_source(
    shards: str | Path, slice_tokens: int | None, cost: CostModel | None
) -> tuple[list[Document], TokenSource, CostModel]:
    """The documents of a ``slimdata build`` output with the slice boundaries it recorded
    (checked), a reader of their tokens (checked against them, read when a payload needs
    them), and the cost model to plan with (the build's unless ``cost`` is given)."""
    from slimdata.localshards import LocalShards

    if slice_tokens is not None:
        raise ConfigError(
            f"slice_tokens (--slice-tokens) applies to a lengths file: the documents of {shards} keep the slices "
            f"they were built with (slice_tokens in its {SIDECAR_NAME}); rebuild them with "
            "`slimdata build --slice-tokens N` to change it"
        )
    docs = load_shard_documents(shards)
    # The build's cost columns are its cost model's prices of these boundaries: with that
    # model (the default) the plan prices the same numbers, and the first samples it reads
    # are checked to agree. A cost model the user gives prices the slices its own way:
    # recomputing is right then, and the columns are not compared.
    built = cost is None
    cost = build_cost_model(shards) if cost is None else cost
    reader = SampleReader(
        LocalShards(shards),
        docs,
        where=f"{shards}: ",
        cost=cost if built else None,
        vocab=build_vocab_size(shards),
    )
    return docs, reader, cost
