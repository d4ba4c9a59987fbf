"""Round trip: build -> stock StreamingDataset, exact tokens against an independent
tokenization, token conservation, slice tiling, cost columns, manifest and sidecar."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
from build_helpers import FIXTURES, TINY_TOKENIZER, read_shards, tiny_config
from tokenizers import Tokenizer

from slimdata.cost import CostModel
from slimdata.docsource import load_shard_documents
from slimdata.ingest import COST_COLUMNS, build
from slimdata.slicing import ALIGN


def expected_documents() -> dict[str, str]:
    """doc_id -> text, read independently of slimdata's readers."""
    out = {}
    for i, line in enumerate((FIXTURES / "docs.jsonl").read_text().splitlines(), 1):
        out[f"docs/docs.jsonl:{i}"] = json.loads(line)["text"]
    for rel in ("alpha.txt", "gamma.md", "sub/beta.py"):
        out[f"text/{rel}"] = (FIXTURES / "text" / rel).read_text()
    return out


def test_round_trip_exact_tokens(tmp_path):
    out = tmp_path / "out"
    summary = build(tiny_config(FIXTURES / "docs.jsonl", FIXTURES / "text"), out)
    tok = Tokenizer.from_file(TINY_TOKENIZER)
    eos = tok.token_to_id("<|endoftext|>")
    texts = expected_documents()
    by_index, by_iter = read_shards(out)
    assert len(by_index) == len(texts) == summary.counts["documents"] == 8
    assert [s["doc_id"] for s in by_index] == [s["doc_id"] for s in by_iter]
    assert [s["doc_id"] for s in by_index] == list(texts)  # input order, sorted files
    total = 0
    for sample in by_index:
        want = [*tok.encode(texts[sample["doc_id"]], add_special_tokens=False).ids, eos]
        assert sample["tokens"].dtype == np.uint32
        assert sample["tokens"].tolist() == want
        assert sample["length"] == len(want)
        total += len(want)
    assert total == summary.counts["tokens"]  # token conservation
    assert summary.counts["quarantined"] == 0
    assert (out / "quarantine.jsonl").read_text() == ""


def test_slices_tile_and_costs_match(tmp_path):
    out = tmp_path / "out"
    build(tiny_config(FIXTURES / "docs.jsonl", FIXTURES / "text"), out)
    sidecar = json.loads((out / "slimdata.json").read_text())
    model = CostModel.analytic("llama-8b", "h100", "full")  # BuildConfig's default policy
    assert sidecar["cost_model"] == model.to_dict()
    samples, _ = read_shards(out)
    assert any(len(s["slices"]) > 2 for s in samples)  # some document has several slices
    for s in samples:
        cuts = s["slices"].astype(np.int64)
        assert cuts[0] == 0 and cuts[-1] == s["length"]
        assert np.all(np.diff(cuts) > 0)
        assert np.all(cuts[1:-1] % 128 == 0) and 128 % ALIGN == 0
        assert np.all(np.diff(cuts)[:-1] == 128)
        costs = model.cuts_costs(cuts)
        for name in COST_COLUMNS:
            assert s[name].dtype == np.float64 and len(s[name]) == len(cuts) - 1
            np.testing.assert_array_equal(s[name], getattr(costs, name))


def test_manifest_sidecar_and_docsource(tmp_path):
    out = tmp_path / "out"
    summary = build(tiny_config(FIXTURES / "docs.jsonl", FIXTURES / "text"), out)
    samples, _ = read_shards(out)
    manifest = pl.read_parquet(out / "manifest.parquet")
    assert manifest.columns == ["sample", "doc_id", "source", "length", "loss_tokens", "cuts"]
    assert manifest["sample"].to_list() == list(range(len(samples)))
    assert manifest["doc_id"].to_list() == [s["doc_id"] for s in samples]
    assert (
        manifest["source"].to_list()
        == [s["source"] for s in samples]
        == ["docs"] * 5 + ["text"] * 3
    )
    assert manifest["length"].to_list() == [s["length"] for s in samples]
    assert (manifest["loss_tokens"] == manifest["length"] - 1).all()
    assert manifest["cuts"].to_list() == [s["slices"].tolist() for s in samples]
    docs = load_shard_documents(out)
    assert [d.length for d in docs] == manifest["length"].to_list()
    side = json.loads((out / "slimdata.json").read_text())
    assert side["tokenizer"]["eos_id"] == 0 and side["tokenizer"]["vocab_size"] == 512
    assert side["slice_tokens"] == 128 and side["model"] == "llama-8b"
    assert side["counts"]["documents"] == 8 and side["counts"]["tokens"] == manifest["length"].sum()
    assert (
        side["fingerprint"].startswith("sha256:")
        and side["fingerprint"] == summary.sidecar["fingerprint"]
    )
    assert side["slimdata_version"]
    index = json.loads((out / "index.json").read_text())
    allowed = {
        "column_encodings",
        "column_names",
        "column_sizes",
        "compression",
        "format",
        "hashes",
        "raw_data",
        "samples",
        "size_limit",
        "version",
        "zip_data",
    }
    assert all(set(shard) <= allowed for shard in index["shards"])
