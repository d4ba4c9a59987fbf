import pytest

from slimdata.errors import ConfigError, PlanError
from slimdata.plan.types import Document
from slimdata.solver import apply_oversize, make_batches

from .conftest import docs_of


def test_make_batches_deterministic_and_complete():
    docs = docs_of([5, 3, 4, 9, 1, 2, 7])
    a = make_batches(docs, 8, seed=3)
    assert a == make_batches(docs, 8, seed=3)
    assert sorted(d.doc_id for b in a for d in b) == list(range(7))  # nothing dropped
    for b in a:  # <= T unless a single document is longer
        assert sum(d.length for d in b) <= 8 or len(b) == 1
    assert make_batches(docs, 8, seed=4) != a


def test_make_batches_policy_exact():
    docs = docs_of([5, 3, 4, 9])
    # greedy <= T over the shuffled order; a 9-token document forms a batch alone
    for b in make_batches(docs, 8, seed=0):
        if any(d.length == 9 for d in b):
            assert len(b) == 1
    assert make_batches([], 8, 0) == []
    with pytest.raises(ConfigError):
        make_batches(docs, 0, 0)


def test_oversize_policies():
    d = Document(doc_id="x", length=300, cuts=(0, 128, 256, 300))
    split = apply_oversize([d], 128, "split")
    assert [(p.offset, p.length, p.cuts) for p in split] == [
        (0, 128, (0, 128)),
        (128, 128, (0, 128)),
        (256, 44, (0, 44)),
    ]
    # every piece is trained alone: its last token has no label (299 labels whole, 297 cut)
    assert [p.loss_tokens for p in split] == [127, 127, 43]
    (t,) = apply_oversize([d], 128, "truncate")
    assert (t.offset, t.length, t.loss_tokens) == (0, 128, 127)
    with pytest.raises(PlanError, match="'x' has 300 tokens"):
        apply_oversize([d], 128, "error")
    with pytest.raises(ConfigError):
        apply_oversize([d], 128, "drop")
