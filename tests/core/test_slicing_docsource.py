from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from slimdata.docsource import documents_from_lengths, load_lengths
from slimdata.errors import ConfigError, InputError
from slimdata.slicing import check_cuts, slice_cuts


@pytest.mark.parametrize(
    ("length", "s", "expected"),
    [
        (0, 128, [0]),
        (1, 128, [0, 1]),
        (128, 128, [0, 128]),
        (129, 128, [0, 128, 129]),
        (300, 128, [0, 128, 256, 300]),
        (4096, 2048, [0, 2048, 4096]),
    ],
)
def test_slice_cuts_ladder(length, s, expected):
    cuts = slice_cuts(length, s)
    assert cuts.tolist() == expected
    if length:
        check_cuts(cuts, length)
        assert all(c % 128 == 0 for c in cuts[:-1])


@pytest.mark.parametrize("bad", [0, 100, -128, 1.5])
def test_slice_tokens_must_be_aligned(bad):
    with pytest.raises(ConfigError, match="multiple of 128"):
        slice_cuts(1000, bad)


def test_lengths_formats(tmp_path):
    (tmp_path / "a.txt").write_text("5\n\n7\n")
    with gzip.open(tmp_path / "b.json.gz", "wt") as fh:
        json.dump([5, 7], fh)
    assert load_lengths(tmp_path / "a.txt").tolist() == [5, 7]
    assert load_lengths(tmp_path / "b.json.gz").tolist() == [5, 7]
    (tmp_path / "c.txt").write_text("5\nseven\n")
    with pytest.raises(InputError, match=r"c.txt:2"):
        load_lengths(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_text("5\n0\n")
    with pytest.raises(InputError, match="must be positive"):
        load_lengths(tmp_path / "d.txt")
    with pytest.raises(InputError, match="does not exist"):
        load_lengths(tmp_path / "missing.txt")


def test_documents_from_lengths():
    docs = documents_from_lengths(np.array([300, 10]), 128, first_id=5)
    assert [d.doc_id for d in docs] == [5, 6]
    assert docs[0].cuts == (0, 128, 256, 300) and docs[0].loss_tokens == 299
    assert docs[1].cuts == (0, 10)
