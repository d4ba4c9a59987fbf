"""The output directory: refuse/overwrite/resume, the build plan, and the final merge.

Layout of a finished build::

    out/
      index.json          merged MDS index (streaming.base.util.merge_index)
      slimdata.json       sidecar: tokenizer, cost model, slicing, counts, fingerprint
      manifest.parquet    one row per sample in global order (sample, doc_id, ..., cuts)
      quarantine.jsonl    rejected records with their reason (empty file when none)
      build_plan.json     config + task list (what --resume checks it is continuing)
      task-00000/         shards of task 0 (+ its index.json, documents, marker)
      task-00001/ ...

The final files are written to a temporary name and renamed, so they are either complete
or absent after a crash, and a reader during a build sees no ``index.json`` or a complete
one. The directory is locked (:func:`output_lock`) for the duration of a build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slimdata.docsource import MANIFEST_NAME
from slimdata.errors import ConfigError, OutputExistsError
from slimdata.ingest.task import DOCUMENTS_NAME, QUARANTINE_NAME, TaskResult, task_dir
from slimdata.paths import check_same_record, holds_any, read_record, write_atomic
from slimdata.plan.types import loss_token_count
from slimdata.planning import SIDECAR_NAME
from slimdata.units import plural

__all__ = [
    "BUILD_PLAN_FORMAT",
    "PLAN_NAME",
    "SIDECAR_NAME",
    "discard_failed",
    "finalize",
    "output_lock",
    "prepare_output",
    "write_atomic",
]

PLAN_NAME = "build_plan.json"
BUILD_PLAN_FORMAT = 2
"""Format of ``build_plan.json`` (its ``slimdata_build_plan`` key); 2 added ``inputs``, the
size and modification time of every input file, which format 1 lacked."""
_MARKERS = (PLAN_NAME, SIDECAR_NAME)
"""Files only a slimdata build writes: ``index.json`` alone does not qualify (plan shards and
any other MDS dataset hold one too)."""
_log = logging.getLogger(__name__)


def _check_not_file(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise OutputExistsError(f"output {output} exists and is a file; choose a directory path")


@contextlib.contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold an exclusive OS lock (``flock``) on the ``output`` directory for a whole build.

    Creates ``output`` and its parents if needed (:class:`ConfigError` where that fails: a
    file on the way, no permission, ``/proc``). A second build into the same directory fails
    at once with :class:`OutputExistsError` instead of interleaving with the first; the
    kernel releases the lock when the holder exits or dies (``kill -9`` included), so no
    stale lock is left. Where ``fcntl`` is missing (Windows) builds are not locked.
    """
    _check_not_file(output)
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the output directory {output} ({exc.strerror or exc}); "
            "choose another --output"
        ) from None
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        yield
        return
    fd = os.open(output, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputExistsError(
                f"another build is writing into {output} (it holds the directory's lock); "
                "wait for it to finish or choose another output directory"
            ) from None
        yield
    finally:
        os.close(fd)


def _clear(output: Path, keep: str | None = None) -> None:
    """Remove everything inside ``output`` but the directory itself (which holds the lock)
    and the entry named ``keep``."""
    for child in output.iterdir():
        if child.name == keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def discard_failed(output: Path) -> None:
    """Remove what a build that wrote no document left in ``output``, but its quarantine file
    (when it holds a record): the user needs it to see why, and a rerun of the same command
    then finds ``output`` free (see :func:`prepare_output`)."""
    _clear(output, keep=QUARANTINE_NAME)
    quarantine = output / QUARANTINE_NAME
    if quarantine.is_file() and quarantine.stat().st_size == 0:
        quarantine.unlink()


def _failed_leftover(output: Path) -> bool:
    """Whether ``output`` holds only the quarantine file of a build that wrote no document."""
    return [child.name for child in output.iterdir()] == [QUARANTINE_NAME]


def _check_resumable(output: Path, plan: dict[str, Any]) -> None:
    """Refuse to resume ``output`` unless its build plan equals ``plan``: same format, no
    input file changed in place (size or modification time), same inputs and options."""
    old = read_record(
        output,
        PLAN_NAME,
        "slimdata_build_plan",
        plan["slimdata_build_plan"],
        " (written by another slimdata version, which cannot tell whether the inputs changed)",
    )
    before = old.get("inputs", {})
    for name, stamp in plan["inputs"].items():
        if name in before and before[name] != stamp:
            raise ConfigError(
                f"cannot resume {output}: input {name} changed since the interrupted build "
                "(size or modification time); use --overwrite to start over"
            )
    check_same_record(output, old, plan, "built")


def prepare_output(output: Path, plan: dict[str, Any], *, overwrite: bool, resume: bool) -> None:
    """Create ``output`` or check it can be continued; write the build plan.

    An existing non-empty directory is refused unless ``overwrite`` (it must hold a previous
    slimdata build, so a typo cannot wipe unrelated files) or ``resume`` (its build plan must
    equal ``plan``: same inputs, unchanged since, same tokenizer, cost model and options; see
    :func:`_check_resumable`). A directory holding only the quarantine file of a build that
    wrote no document counts as empty.
    """
    if overwrite and resume:
        raise ConfigError(
            "--overwrite and --resume exclude each other: resume continues a build, overwrite discards it"
        )
    _check_not_file(output)
    if output.is_dir() and _failed_leftover(output):
        _clear(output)
    if output.is_dir() and any(output.iterdir()):
        if resume and holds_any(output, (PLAN_NAME,)):
            _check_resumable(output, plan)
            return
        if resume:
            raise OutputExistsError(
                f"cannot resume {output}: it holds no {PLAN_NAME} (not a slimdata build); choose another directory"
            )
        if not overwrite:
            raise OutputExistsError(
                f"output directory {output} exists and is not empty; pass --overwrite to replace it or --resume to continue it"
            )
        if not holds_any(output, _MARKERS):
            raise OutputExistsError(
                f"refusing to --overwrite {output}: it does not look like a slimdata build (no {PLAN_NAME} "
                f"or {SIDECAR_NAME}); remove it yourself if you mean it"
            )
        _clear(output)
    output.mkdir(parents=True, exist_ok=True)
    write_atomic(output / PLAN_NAME, json.dumps(plan, indent=1, sort_keys=True))


def _merge_index(output: Path, indices: list[Path]) -> None:
    from slimdata.ingest.mds import merge_index

    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # merge_index logs a warning about its temp folder
    staging = output / ".index-staging"  # merge_index copies its result in place: not atomic
    try:
        if indices:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            merge_index([str(p) for p in indices], str(staging), keep_local=True)
            os.replace(staging / "index.json", output / "index.json")
            staging.rmdir()
        else:
            write_atomic(output / "index.json", json.dumps({"shards": [], "version": 2}))
    finally:
        logging.disable(previous)


def duplicate_ids(doc_ids: Any) -> tuple[int, list[str]]:
    """``(extra occurrences, up to 5 example ids)`` of ids that appear more than once in a
    pyarrow string column (``--id-field`` values are the user's; positional ids are unique)."""
    import pyarrow.compute as pc

    counts = pc.value_counts(doc_ids)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    extra = int(pc.sum(repeated.field("counts")).as_py() or 0) - len(repeated)
    return extra, sorted(repeated.field("values").to_pylist())[:5]


def _manifest(output: Path, count: int) -> tuple[int, str, int]:
    """Concatenate the tasks' document tables into ``manifest.parquet``; returns the
    number of samples and the content fingerprint (sha256 over every document's id and
    tokens in global order, independent of how tasks were cut) and the number of documents
    whose id repeats an earlier one (with a warning)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(task_dir(output, i) / DOCUMENTS_NAME) for i in range(count)]
    table = pa.concat_tables(tables) if tables else None
    fingerprint = hashlib.sha256()
    n = 0 if table is None else table.num_rows
    extra = 0
    if table is not None:
        for digest in table.column("digest").to_pylist():
            fingerprint.update(digest)
        extra, examples = duplicate_ids(table.column("doc_id"))
        if extra:
            _log.warning(
                "%s %s an earlier document id (e.g. %s); every document is kept, "
                "but ids are not unique: check --id-field",
                plural(extra, "document"),
                "repeats" if extra == 1 else "repeat",
                ", ".join(map(repr, examples)),
            )
        length = table.column("length")
        table = pa.table(
            {
                "sample": pa.array(range(n), pa.int64()),
                "doc_id": table.column("doc_id"),
                "source": table.column("source"),
                "length": length,
                "loss_tokens": pa.array(
                    [loss_token_count(n) for n in length.to_pylist()], length.type
                ),
                "cuts": table.column("cuts"),
            }
        )
        tmp = output / (MANIFEST_NAME + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, output / MANIFEST_NAME)
    return n, "sha256:" + fingerprint.hexdigest(), extra


def _quarantine(output: Path, count: int) -> None:
    tmp = output / (QUARANTINE_NAME + ".tmp")
    with open(tmp, "wb") as out:
        for i in range(count):
            with open(task_dir(output, i) / QUARANTINE_NAME, "rb") as part:
                shutil.copyfileobj(part, out)
    os.replace(tmp, output / QUARANTINE_NAME)


def finalize(output: Path, results: list[TaskResult], sidecar: dict[str, Any]) -> dict[str, Any]:
    """Merge the finished tasks into the dataset's top-level files; returns the sidecar."""
    for name in (SIDECAR_NAME, "index.json"):  # a half-finalized directory never looks finished
        (output / name).unlink(missing_ok=True)
    indices = [task_dir(output, r.index) / "index.json" for r in results]
    indices = [p for p in indices if json.loads(p.read_text())["shards"]]
    _quarantine(output, len(results))
    samples, fingerprint, duplicates = _manifest(output, len(results))
    counts = {
        key: sum(getattr(r, key) for r in results)
        for key in (
            "documents",
            "tokens",
            "quarantined",
            "truncated_documents",
            "dropped_tokens",
            "slices",
            "input_bytes",
        )
    }
    counts["tasks"] = len(results)
    counts["duplicate_doc_ids"] = duplicates
    assert samples == counts["documents"], (samples, counts)
    sidecar = {**sidecar, "counts": counts, "fingerprint": fingerprint}
    if samples:
        _merge_index(output, indices)
    write_atomic(
        output / SIDECAR_NAME, json.dumps(sidecar, indent=1, sort_keys=True, ensure_ascii=False)
    )
    return sidecar
