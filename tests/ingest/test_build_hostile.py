"""Hostile inputs to `slimdata build`: every record-level problem is quarantined with its
reason, the build goes on, and every good document is kept exactly once (issue 18)."""

from __future__ import annotations

import json
import logging
import os

import pytest
from build_helpers import TINY_TOKENIZER, read_shards, tiny_config
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slimdata.cli import cli
from slimdata.docsource import load_shard_documents
from slimdata.ingest import build
from slimdata.ingest.stages import batch_records, tokenize_batch
from slimdata.readers import ReadOptions, Record, Rejected, plan_inputs, read_task
from slimdata.tokenize import load_tokenizer


def quarantine(out):
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


def test_lone_surrogate_is_quarantined_and_the_build_goes_on(tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text(
        '{"text": "good one"}\n{"text": "a\\ud800b"}\n{"text": "\\udfff"}\n{"text": "good two"}\n'
    )
    out = tmp_path / "out"
    summary = build(tiny_config(src), out)
    assert quarantine(out) == [
        {
            "doc_id": "s/s.jsonl:2",
            "source": "s",
            "reason": "unencodable text: lone surrogate U+D800 at character 1",
            "excerpt": "'a\\ud800b'",
        },
        {
            "doc_id": "s/s.jsonl:3",
            "source": "s",
            "reason": "unencodable text: lone surrogate U+DFFF at character 0",
            "excerpt": "'\\udfff'",
        },
    ]
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["s/s.jsonl:1", "s/s.jsonl:4"]
    assert summary.counts["quarantined"] == 2 and summary.counts["documents"] == 2


def test_surrogate_in_id_field_is_quarantined(tmp_path):
    src = tmp_path / "ids.jsonl"
    src.write_text('{"id": "x\\ud800", "text": "hello"}\n{"id": "ok", "text": "fine"}\n')
    out = tmp_path / "out"
    build(tiny_config(src, id_field="id"), out)
    (q,) = quarantine(out)
    assert q["doc_id"] == "ids/ids.jsonl:1"
    assert q["reason"] == "id field 'id': unencodable text: lone surrogate U+D800 at character 1"
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["ok"]


def test_deeply_nested_jsonl_line_is_quarantined(tmp_path):
    src = tmp_path / "deep.jsonl"
    src.write_text("[" * 200_000 + "]" * 200_000 + '\n{"text": "kept"}\n')
    out = tmp_path / "out"
    build(tiny_config(src), out)
    (q,) = quarantine(out)
    assert q["doc_id"] == "deep/deep.jsonl:1"
    assert q["reason"] == "malformed JSON: nested too deeply to parse"
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["deep/deep.jsonl:2"]


def test_tokenizer_refusal_quarantines_only_the_refused_record():
    tok = load_tokenizer(TINY_TOKENIZER)
    batch = [
        Record("a", "good"),
        Record("b", "x\ud800"),
        Rejected("c", "earlier"),
        Record("d", "ok"),
    ]
    out = tokenize_batch(tok, batch)
    assert [type(o).__name__ for o in out] == ["Document", "Rejected", "Rejected", "Document"]
    assert out[1].doc_id == "b" and out[1].reason.startswith("tokenizer refused the text: ")
    assert out[1].excerpt == "'x\\ud800'"
    assert out[2] == Rejected("c", "earlier")
    assert list(out[0].tokens) == list(tok.encode_batch(["good"])[0])


@pytest.mark.timeout(60)
def test_named_pipe_in_input_directory_is_skipped_unopened(tmp_path, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha text")
    os.mkfifo(corpus / "pipe.txt")  # opening it for reading would block forever
    (corpus / "dangling.txt").symlink_to(tmp_path / "missing.txt")
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="slimdata.readers"):
        summary = build(tiny_config(corpus), out)
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["corpus/a.txt"]
    # the dangling link is a quarantine line (test_build_bad_input), the pipe a warning
    assert summary.counts["documents"] == 1 and summary.counts["quarantined"] == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped {corpus / 'pipe.txt'}: not a regular file (named pipe); never opened",
    ]


@pytest.mark.timeout(60)
def test_a_glob_matching_dangling_links_and_a_pipe_reports_each(tmp_path, caplog):
    # corpus/*: a.txt, gone.jsonl -> missing, gone.txt -> missing, pipe.txt (FIFO); the
    # links were skipped without a word, as was the pipe
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("alpha text")
    (corpus / "gone.jsonl").symlink_to(tmp_path / "missing.jsonl")
    (corpus / "gone.txt").symlink_to(tmp_path / "missing.txt")
    os.mkfifo(corpus / "pipe.txt")
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="slimdata.readers"):
        summary = build(tiny_config(str(corpus / "*")), out)
    assert [d.doc_id for d in load_shard_documents(out)] == ["corpus/a.txt"]
    quarantined = [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(q["doc_id"], q["reason"]) for q in quarantined] == [
        (
            "corpus/gone.jsonl:1",
            "unreadable, corrupt or truncated file from here on: [Errno 2] No such file or "
            f"directory: '{corpus / 'gone.jsonl'}'",
        ),
        ("corpus/gone.txt", "cannot read file: No such file or directory"),
    ]
    assert summary.counts["documents"] == 1 and summary.counts["quarantined"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped {corpus / 'pipe.txt'}: not a regular file (named pipe); never opened",
    ]


@pytest.mark.timeout(60)
def test_named_pipe_given_as_input_is_a_clear_error(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    result = CliRunner().invoke(
        cli,
        [
            "build",
            str(tmp_path / "pipe.jsonl"),
            "--output",
            str(tmp_path / "out"),
            "--tokenizer",
            TINY_TOKENIZER,
        ],
    )
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: input {str(tmp_path / 'pipe.jsonl')!r} is not a regular file or directory "
        f"(skipped {tmp_path / 'pipe.jsonl'}: not a regular file (named pipe); never opened)\n"
    )


def test_same_input_twice_is_read_once_with_a_warning(tmp_path, caplog):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    (corpus / "b.txt").write_text("bee")
    (tmp_path / "link.jsonl").symlink_to(corpus / "a.jsonl")
    out = tmp_path / "out"
    inputs = (corpus, corpus / "a.jsonl", corpus, tmp_path / "link.jsonl")
    with caplog.at_level(logging.WARNING, logger="slimdata.readers"):
        summary = build(tiny_config(*inputs, source="c"), out)
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["c/a.jsonl:1", "c/a.jsonl:2", "c/b.txt"]
    assert summary.counts["documents"] == 3
    dup = "is given more than once; it is read once"
    assert [r.getMessage() for r in caplog.records] == [
        f"input {corpus / 'a.jsonl'} {dup}",
        f"input {corpus / 'a.jsonl'} {dup}",
        f"input {corpus / 'b.txt'} {dup}",
        f"input {tmp_path / 'link.jsonl'} {dup}",
    ]


def test_duplicate_document_ids_are_reported_and_every_document_kept(tmp_path, caplog):
    src = tmp_path / "ids.jsonl"
    rows = [("a", "one"), ("b", "two"), ("a", "three"), ("c", "four"), ("a", "five"), ("b", "6")]
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="slimdata.ingest.output"):
        summary = build(tiny_config(src, id_field="id"), out)
    samples, _ = read_shards(out)
    assert [s["doc_id"] for s in samples] == ["a", "b", "a", "c", "a", "b"]
    assert summary.counts["documents"] == 6 and summary.counts["duplicate_doc_ids"] == 3
    assert [r.getMessage() for r in caplog.records] == [
        "3 documents repeat an earlier document id (e.g. 'a', 'b'); every document is kept, "
        "but ids are not unique: check --id-field"
    ]


CHARS = st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\udc80", " ", "\x00"]))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(texts=["a\ud800b", "ok", "  ", "\x00", "\udfff"])
@given(texts=st.lists(st.text(CHARS, max_size=12), min_size=1, max_size=12))
def test_any_json_text_is_a_document_or_a_quarantine_line_in_order(tmp_path_factory, texts):
    """Records of arbitrary text (lone surrogates, controls, blanks included): each becomes
    exactly one document with the tokenizer's own tokens, or one rejection with a reason."""
    src = tmp_path_factory.mktemp("prop") / "p.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = load_tokenizer(TINY_TOKENIZER)
    (task,) = plan_inputs([src], opts=ReadOptions())
    out = [
        item
        for batch in batch_records(read_task(task, ReadOptions()), 50)
        for item in tokenize_batch(tok, batch)
    ]
    assert [o.doc_id for o in out] == [f"p/p.jsonl:{i}" for i in range(1, len(texts) + 1)]
    for text, item in zip(texts, out, strict=True):
        encodable = not any(0xD800 <= ord(c) <= 0xDFFF for c in text)
        if text.strip() and encodable and len(tok.encode_batch([text])[0]):
            assert list(item.tokens) == list(tok.encode_batch([text])[0])
        else:
            assert isinstance(item, Rejected) and item.reason
