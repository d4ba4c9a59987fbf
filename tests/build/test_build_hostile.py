"""Hostile inputs to `slimdata build`: every record-level problem is quarantined with its
reason, the build goes on, and every good document is kept exactly once (issue 18)."""

from __future__ import annotations

import json

from build_helpers import TINY_TOKENIZER, read_shards, tiny_config

from slimdata.build import build
from slimdata.build.stages import tokenize_batch
from slimdata.readers import Record, Rejected
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
