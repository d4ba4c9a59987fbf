"""A damaged Parquet, Arrow or JSON input is quarantined with the reason, like a corrupt ``.gz``
JSONL file: the build goes on, every readable row of it is kept, and a resumed build neither
loses nor repeats a document."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from build_helpers import TINY_TOKENIZER, read_shards, tiny_config, tree_bytes
from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.ingest import build

ROWS = pa.table({"text": [f"row {i} of the table" for i in range(8)]})
"""Eight short documents, ``row 0 ...`` to ``row 7 ...``."""


def quarantine(out):
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


def doc_ids(out):
    samples, _ = read_shards(out)
    return [s["doc_id"] for s in samples]


def arrow_error(call) -> str:
    """What pyarrow says about a damaged file (one line), for exact expected reasons."""
    with pytest.raises((OSError, pa.ArrowException)) as info:
        call()
    return " ".join(str(info.value).split())


def write_parquet(path):
    """Four row groups of two rows, plain pages (no compression, no dictionary)."""
    pq.write_table(ROWS, path, row_group_size=2, compression="none", use_dictionary=False)


def damage_row_group(path, group: int) -> None:
    """Overwrite the page header of row group ``group`` with 0xFF bytes."""
    offset = pq.ParquetFile(path).metadata.row_group(group).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))


def arrow_stream(batches) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, ROWS.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def cut_arrow_stream() -> bytes:
    """A stream of four 2-row batches cut 10 bytes into its third batch (rows 0-3 readable)."""
    batches = ROWS.to_batches(max_chunksize=2)
    assert len(batches) == 4
    two = len(arrow_stream(batches[:2])) - 8  # without the 8-byte end-of-stream marker
    return arrow_stream(batches)[: two + 10]


def test_a_truncated_parquet_file_is_quarantined_and_the_build_goes_on(tmp_path):
    write_parquet(tmp_path / "good.parquet")
    data = (tmp_path / "good.parquet").read_bytes()
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(data[: len(data) // 2])  # what `head -c` of half the file leaves
    (tmp_path / "ok.jsonl").write_text('{"text": "fine"}\n')
    out = tmp_path / "out"
    args = ["build", str(cut), str(tmp_path / "ok.jsonl"), "-o", str(out)]
    result = CliRunner().invoke(cli, [*args, "--tokenizer", TINY_TOKENIZER])
    assert result.exit_code == 0, result.output
    assert f"quarantined 1 record: see {out / 'quarantine.jsonl'}" in result.output
    assert quarantine(out) == [
        {
            "doc_id": "cut/cut.parquet",
            "source": "cut",
            "reason": "unreadable, corrupt or truncated file: "
            + arrow_error(lambda: pq.ParquetFile(cut)),
            "excerpt": "",
        }
    ]
    assert doc_ids(out) == ["ok/ok.jsonl:1"]


def test_a_damaged_parquet_row_group_is_quarantined_the_others_kept(tmp_path):
    mid = tmp_path / "mid.parquet"
    write_parquet(mid)
    damage_row_group(mid, 1)
    why = arrow_error(lambda: pq.ParquetFile(mid).read_row_group(1))
    out = tmp_path / "out"
    build(tiny_config(mid), out)
    assert quarantine(out) == [
        {
            "doc_id": "mid/mid.parquet:2",
            "source": "mid",
            "reason": f"unreadable, corrupt or truncated row group 1 (rows 2-3): {why}",
            "excerpt": "",
        }
    ]
    assert doc_ids(out) == [f"mid/mid.parquet:{i}" for i in (0, 1, 4, 5, 6, 7)]


def test_a_build_killed_inside_a_damaged_parquet_file_resumes_without_loss_or_repeat(tmp_path):
    """Killed after rows 0 and 1 were written and row group 1 was quarantined: the resumed
    build redoes the task whole, so it equals an uninterrupted build byte for byte."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_parquet(corpus / "mid.parquet")
    damage_row_group(corpus / "mid.parquet", 1)
    (corpus / "ok.jsonl").write_text('{"text": "fine"}\n')
    reference, out = tmp_path / "reference", tmp_path / "out"
    build(tiny_config(corpus, batch_chars=1), reference)  # one document per batch
    code = (
        "from slimdata.ingest import BuildConfig, build; "
        f"build(BuildConfig(inputs=({str(corpus)!r},), tokenizer={TINY_TOKENIZER!r}, "
        f"slice_tokens=128, batch_chars=1), {str(out)!r})"
    )
    env = {**os.environ, "SLIMDATA_FAULT_KILL": "0:3"}  # rows 0, 1, then 4 of task 0
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -9, proc.stderr
    assert "task-00000.partial" in {p.name for p in out.iterdir()}
    build(tiny_config(corpus, batch_chars=1), out, resume=True)
    assert tree_bytes(out) == tree_bytes(reference)
    assert doc_ids(out) == [f"corpus/mid.parquet:{i}" for i in (0, 1, 4, 5, 6, 7)] + [
        "corpus/ok.jsonl:1"
    ]
    assert [q["doc_id"] for q in quarantine(out)] == ["corpus/mid.parquet:2"]


@pytest.mark.parametrize("dataset_dir", [False, True])
def test_an_arrow_stream_cut_short_keeps_its_rows_and_quarantines_the_rest(tmp_path, dataset_dir):
    data = cut_arrow_stream()
    if dataset_dir:  # a `datasets` save_to_disk directory whose data file was cut
        path = tmp_path / "ds"
        path.mkdir()
        (path / "state.json").write_text('{"_data_files": [{"filename": "data-0.arrow"}]}')
        (path / "data-0.arrow").write_bytes(data)
        first = "ds/data-0.arrow"
    else:
        path = tmp_path / "cut.arrow"
        path.write_bytes(data)
        first = "cut/cut.arrow"
    why = arrow_error(lambda: ipc.open_stream(pa.py_buffer(data)).read_all())
    (tmp_path / "ok.jsonl").write_text('{"text": "fine"}\n')
    out = tmp_path / "out"
    build(tiny_config(path, tmp_path / "ok.jsonl"), out)
    source = first.split("/")[0]
    assert quarantine(out) == [
        {
            "doc_id": f"{first}:4",
            "source": source,
            "reason": f"unreadable, corrupt or truncated file from here on: {why}",
            "excerpt": "",
        }
    ]
    assert doc_ids(out) == [f"{first}:{i}" for i in range(4)] + ["ok/ok.jsonl:1"]


def arrow_file_format_cut() -> bytes:
    """An Arrow IPC *file* (``ARROW1`` magic, footer at the end) cut to half its bytes."""
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, ROWS.schema) as writer:
        writer.write_table(ROWS)
    data = sink.getvalue().to_pybytes()
    return data[: len(data) // 2]


def open_as(path):
    """How the reader of ``path`` opens it."""
    if path.suffix == ".parquet":
        return pq.ParquetFile(path)
    source = pa.memory_map(str(path), "r")
    if source.read_at(6, 0) == b"ARROW1":
        return ipc.open_file(source)
    return ipc.open_stream(source)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("cut.parquet", b""),
        ("cut.parquet", b"not a table at all\n"),
        ("cut.parquet", None),  # a dangling symlink
        ("cut.arrow", b""),
        ("cut.arrow", b"not a table at all\n"),
        ("cut.arrow", arrow_file_format_cut()),
        ("cut.arrow", None),
    ],
)
def test_a_file_that_cannot_be_opened_is_quarantined_whole(tmp_path, name, data):
    (tmp_path / "cut").mkdir()  # an input directory: a dangling link in it is read
    path = tmp_path / "cut" / name
    if data is None:
        path.symlink_to(tmp_path / "gone")
    else:
        path.write_bytes(data)
    why = arrow_error(lambda: open_as(path))
    (tmp_path / "ok.jsonl").write_text('{"text": "fine"}\n')
    out = tmp_path / "out"
    build(tiny_config(path.parent, tmp_path / "ok.jsonl"), out)
    assert quarantine(out) == [
        {
            "doc_id": f"cut/{name}",
            "source": "cut",
            "reason": f"unreadable, corrupt or truncated file: {why}",
            "excerpt": "",
        }
    ]
    assert doc_ids(out) == ["ok/ok.jsonl:1"]


def test_a_json_gz_damaged_in_its_first_lines_keeps_them_and_goes_on(tmp_path):
    """A ``.json`` file's first 4 KiB tell an array from JSON Lines; when they cannot be
    decompressed the file is read as lines, like a ``.jsonl.gz``: what decompresses is kept."""
    lines = b"".join(b'{"text": "doc %d %s"}\n' % (i, b"%x" % (i * 7919) * 9) for i in range(60))
    data = gzip.compress(lines)
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    kept = []
    with pytest.raises(EOFError) as info, gzip.open(path) as fh:
        kept.extend(fh)  # the lines gzip gives before the damage
    assert 1 <= len(kept) < 60 and sum(map(len, kept)) < 4096
    (tmp_path / "ok.jsonl").write_text('{"text": "fine"}\n')
    out = tmp_path / "out"
    build(tiny_config(path, tmp_path / "ok.jsonl"), out)
    assert quarantine(out) == [
        {
            "doc_id": f"cut/cut.json.gz:{len(kept) + 1}",
            "source": "cut",
            "reason": f"unreadable, corrupt or truncated file from here on: {info.value}",
            "excerpt": "",
        }
    ]
    assert doc_ids(out) == [f"cut/cut.json.gz:{i}" for i in range(1, len(kept) + 1)] + [
        "ok/ok.jsonl:1"
    ]


def test_dangling_json_lines_links_are_quarantined_not_a_crash(tmp_path):
    corpus = tmp_path / "dl"
    corpus.mkdir()
    for name in ("x.jsonl", "y.json", "z.json.gz"):
        (corpus / name).symlink_to(tmp_path / "gone")
    (corpus / "ok.jsonl").write_text('{"text": "fine"}\n')
    out = tmp_path / "out"
    build(tiny_config(corpus), out)
    assert quarantine(out) == [
        {
            "doc_id": f"dl/{name}:1",
            "source": "dl",
            "reason": "unreadable, corrupt or truncated file from here on: [Errno 2] No such "
            f"file or directory: '{corpus.resolve() / name}'",
            "excerpt": "",
        }
        for name in ("x.jsonl", "y.json", "z.json.gz")
    ]
    assert doc_ids(out) == ["dl/ok.jsonl:1"]


def manifest_ids(out):
    """Document ids of a build in sample order, from its manifest (no StreamingDataset: each
    one leaves shared-memory descriptors open in the test process)."""
    from slimdata.docsource import load_shard_documents

    return [d.doc_id for d in load_shard_documents(out)]


def json_error(text: str) -> str:
    with pytest.raises(ValueError) as info:
        json.loads(text)
    return str(info.value)


STATE = '{"_data_files": [{"filename": "data-0.arrow"}]}'
"""A sound ``state.json`` listing one data file."""


@pytest.mark.parametrize(
    ("files", "doc_id", "why"),
    [
        (
            {"state.json": '{"_data_files": [{"filen'},
            "ds",
            "state.json of a `datasets` directory is not valid JSON: "
            + json_error('{"_data_files": [{"filen'),
        ),
        (
            {"state.json": '{"_fingerprint": "x"}'},
            "ds",
            "state.json of a `datasets` directory has no list '_data_files'",
        ),
        (
            {"state.json": '{"_data_files": [7]}'},
            "ds",
            "state.json of a `datasets` directory names data file None, not a path inside it",
        ),
        (
            {"state.json": '{"_data_files": [{"filename": "../../etc/passwd"}]}'},
            "ds",
            "state.json of a `datasets` directory names data file '../../etc/passwd', not a "
            "path inside it",
        ),
        (
            {"dataset_dict.json": "[[["},
            "ds",
            "dataset_dict.json of a `datasets` directory is not valid JSON: " + json_error("[[["),
        ),
        (
            {"dataset_dict.json": '{"splits": "train"}'},
            "ds",
            "dataset_dict.json of a `datasets` directory has no list 'splits'",
        ),
        (
            {"dataset_dict.json": '{"splits": ["train"]}'},
            "ds/train",
            "cannot read state.json of a `datasets` directory: No such file or directory",
        ),
        (  # a split naming the directory itself: read once, no endless recursion
            {"dataset_dict.json": '{"splits": ["."]}'},
            "ds",
            "cannot read state.json of a `datasets` directory: No such file or directory",
        ),
    ],
)
@pytest.mark.parametrize("how", ["named", "in a directory", "by a glob"])
def test_a_damaged_datasets_listing_is_quarantined_and_the_build_goes_on(
    tmp_path, files, doc_id, why, how
):
    corpus = tmp_path / "corpus"
    (corpus / "ds").mkdir(parents=True)
    for name, text in files.items():
        (corpus / "ds" / name).write_text(text)
    (corpus / "ds" / "data-0.arrow").write_bytes(arrow_stream(ROWS.to_batches()))
    (corpus / "ok.jsonl").write_text('{"text": "fine"}\n')
    inputs = {
        "named": (corpus / "ds", corpus / "ok.jsonl"),
        "in a directory": (corpus,),
        "by a glob": (corpus / "*",),
    }[how]
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["build", *map(str, inputs), "-o", str(out), "--tokenizer", TINY_TOKENIZER]
    )
    assert result.exit_code == 0, result.output
    source = "ds" if how == "named" else "corpus"
    assert quarantine(out) == [
        {
            "doc_id": doc_id if how == "named" else f"corpus/{doc_id}",
            "source": source,
            "reason": f"unreadable, corrupt or truncated file: {why}",
            "excerpt": "",
        }
    ]
    assert manifest_ids(out) == [f"{'ok' if how == 'named' else 'corpus'}/ok.jsonl:1"]


def test_a_damaged_split_is_quarantined_and_the_other_splits_read(tmp_path):
    ds = tmp_path / "dict"
    for split in ("train", "test"):
        (ds / split).mkdir(parents=True)
        (ds / split / "data-0.arrow").write_bytes(arrow_stream(ROWS.to_batches()))
    (ds / "dataset_dict.json").write_text('{"splits": ["train", "test", "valid"]}')
    (ds / "train" / "state.json").write_text(STATE)
    (ds / "test" / "state.json").write_text(STATE[:20])  # cut short
    (ds / "valid").mkdir()
    (ds / "valid" / "state.json").write_text('{"_data_files": [{"filename": "data-9.arrow"}]}')
    missing = ds / "valid" / "data-9.arrow"
    why = arrow_error(lambda: open_as(missing))
    out = tmp_path / "out"
    build(tiny_config(ds), out)
    assert quarantine(out) == [
        {
            "doc_id": "dict/test",
            "source": "dict",
            "reason": "unreadable, corrupt or truncated file: state.json of a `datasets` "
            f"directory is not valid JSON: {json_error(STATE[:20])}",
            "excerpt": "",
        },
        {
            "doc_id": "dict/valid/data-9.arrow",
            "source": "dict",
            "reason": f"unreadable, corrupt or truncated file: {why}",
            "excerpt": "",
        },
    ]
    assert manifest_ids(out) == [f"dict/train/data-0.arrow:{i}" for i in range(8)]


def test_a_missing_data_file_of_a_dataset_in_a_walked_directory_is_quarantined(tmp_path):
    # corpus/ds/state.json lists data-0.arrow (there) and data-1.arrow (missing): it was
    # skipped with a warning only
    ds = tmp_path / "corpus" / "ds"
    ds.mkdir(parents=True)
    (ds / "state.json").write_text(
        '{"_data_files": [{"filename": "data-0.arrow"}, {"filename": "data-1.arrow"}]}'
    )
    (ds / "data-0.arrow").write_bytes(arrow_stream(ROWS.to_batches()))
    why = arrow_error(lambda: open_as(ds / "data-1.arrow"))
    out = tmp_path / "out"
    build(tiny_config(tmp_path / "corpus"), out)
    assert quarantine(out) == [
        {
            "doc_id": "corpus/ds/data-1.arrow",
            "source": "corpus",
            "reason": f"unreadable, corrupt or truncated file: {why}",
            "excerpt": "",
        }
    ]
    assert manifest_ids(out) == [f"corpus/ds/data-0.arrow:{i}" for i in range(8)]


def test_an_oversized_datasets_listing_is_refused_unread(tmp_path, monkeypatch):
    from slimdata.readers import arrow

    monkeypatch.setattr(arrow, "META_MAX_BYTES", len(STATE) - 1)
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "state.json").write_text(STATE)
    (ds / "data-0.arrow").write_bytes(arrow_stream(ROWS.to_batches()))
    assert str(arrow.listing_error(ds)) == (
        f"state.json of a `datasets` directory is over {len(STATE) - 1} bytes; not read"
    )
    monkeypatch.setattr(arrow, "META_MAX_BYTES", len(STATE))
    assert arrow.listing_error(ds) is None
