"""Plan payloads are untrusted: every damaged or hostile payload is a PlanError with the
reason, at a cost bounded by its size (issue 18). Mutations that keep the token count, so
the old token-count check alone would have let them through, are caught by validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slimdata.errors import PlanError, PlanFormatError
from slimdata.plan import load
from slimdata.plan.load import MAX_PLAN_BYTES, parse_plan, parse_rank_plan
from slimdata.solver import Layout, solve
from slimdata.solver.planshards import check_payload, payload_crc32

from .conftest import docs_of, unit_cost


@pytest.fixture(scope="module")
def plan():
    docs = docs_of([300, 40, 520, 128, 77, 900, 12, 256], 128)
    return solve(docs, Layout(dp=2, memory_gib=10), "slimpack", 0, unit_cost())


@pytest.fixture(scope="module")
def view(plan):
    """Rank 0's view of ``plan``: what its payload carries."""
    return plan.rank_view(0)


def payload(data, rank=0, step=0):
    """A payload of ``data`` (a plan's text or dict) with its checksum right: what these
    tests damage is the plan itself, as a hostile writer who recomputes checksums would."""
    text = data if isinstance(data, str | bytes) else json.dumps(data)
    return {
        "step": step,
        "rank": rank,
        "plan": text,
        "tokens": np.zeros(1, np.uint32),
        "ntokens": 0,
        "crc32": payload_crc32(text, np.zeros(0, np.uint32)),
    }


def test_good_payload_round_trips(view):
    got, tokens = check_payload(payload(view.to_json()), 0, 0, dp=2)
    assert got == view and len(tokens) == 0


def test_a_whole_plan_payload_is_an_old_format_error(plan):
    with pytest.raises(
        PlanFormatError, match="plan payload of format 1; this slimdata reads format 2"
    ):
        check_payload(payload(plan.to_json()), 0, 0, dp=2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"step": 0,',
            "plan payload is not valid JSON: Expecting property name enclosed in double quotes at position 11",
        ),
        ("[" * 100_000 + "]" * 100_000, "plan payload is nested too deeply to be a plan"),
        (b"\xff\xfe{}", "plan payload is not UTF-8 text (byte 0)"),
        ("[1, 2]", "plan payload is a JSON list, not an object"),
        ('{"format": 2, "step": 0}', "plan payload has no 'ranks' list"),
    ],
)
def test_unparsable_payloads_are_plan_errors(text, message):
    with pytest.raises(PlanError) as info:
        check_payload(payload(text), 0, 0)
    assert str(info.value) == message


@pytest.mark.slow
def test_repeated_ranks_list_is_refused_before_any_plan_object_is_built(plan, view, monkeypatch):
    data = plan.to_dict()
    data["ranks"] = data["ranks"] * 50_000
    built = []
    monkeypatch.setattr(load.StepPlan, "from_dict", lambda d: built.append(d))
    with pytest.raises(PlanError, match="plan payload has 100000 ranks; the layout has 2"):
        parse_plan(json.dumps(data), dp=2)
    data = view.to_dict()
    data["ranks"] = data["ranks"] * 50_000
    monkeypatch.setattr(load.RankPlan, "from_dict", lambda d: built.append(d))
    with pytest.raises(PlanError, match="plan payload has 50000 listed ranks; the layout has 2"):
        parse_rank_plan(json.dumps(data), dp=2)
    assert built == []


def test_oversized_payload_is_refused_before_parsing(monkeypatch):
    monkeypatch.setattr(load, "MAX_PLAN_BYTES", 1000)
    monkeypatch.setattr(load.json, "loads", lambda *a: pytest.fail("parsed"))
    with pytest.raises(PlanError, match="plan payload of 1001 bytes is over the 1000 byte limit"):
        parse_plan(" " * 1001)
    assert MAX_PLAN_BYTES == 64 << 20  # the documented limit


def _mutations():
    """(name, mutate(dict), expected message part): damage to rank 0's view that keeps the
    token count."""
    r0 = lambda d: d["ranks"][0]  # noqa: E731
    doc0 = lambda d: d["docs"][0]  # noqa: E731  [index, doc_id, length, loss_tokens, cuts, ...]
    return [
        (
            "slice as text",
            lambda d: r0(d)["forward"][0]["slices"][0].__setitem__(1, "0"),
            "a slice [doc, start, end] must be an integer",
        ),
        (
            "slice of 4",
            lambda d: r0(d)["forward"][0]["slices"][0].append(1),
            "a slice [doc, start, end] must be a list of 3 integers",
        ),
        (
            "bool length",
            lambda d: doc0(d).__setitem__(2, True),
            "document length must be an integer",
        ),
        (
            "huge length",
            lambda d: doc0(d).__setitem__(2, 10**15),
            "exceeds the maximum of 2147483647 tokens",
        ),
        (
            "bad order",
            lambda d: r0(d).__setitem__("order", ["X0"]),
            "rank order must be a list like",
        ),
        ("missing docs", lambda d: d.pop("docs"), "malformed plan payload: KeyError: 'docs'"),
        (
            "cuts",
            lambda d: doc0(d).__setitem__(4, [0, 5]),
            ": cut points must start at 0 and end at",
        ),
        (
            "loss",
            lambda d: doc0(d).__setitem__(3, 10**9),
            "has 1000000000 loss tokens",
        ),
        ("rank swap", lambda d: r0(d).__setitem__("rank", 1), "holds ranks [1]; it needs [0]"),
        (
            "backward twice",
            lambda d: r0(d)["backward"].append(r0(d)["backward"][0]),
            "is not in exactly one forward and one backward pack",
        ),
        (
            "reversed forward",
            lambda d: r0(d).__setitem__("forward", r0(d)["forward"][::-1]),
            "of the same document (rule 3)",
        ),
        (
            "merge tag",
            lambda d: r0(d)["forward"][0].__setitem__("merge", 0),
            "is tagged with merge group 0",
        ),
        ("mode", lambda d: d.__setitem__("mode", "chaos"), "mode='chaos' must be"),
    ]


def test_each_structural_mutation_is_a_named_plan_error(view):
    assert len(view.ranks[0].forward) >= 2  # the order mutations bite
    for name, mutate, message in _mutations():
        data = json.loads(view.to_json())
        mutate(data)
        with pytest.raises(PlanError) as info:
            check_payload(payload(data), 0, 0, dp=2)
        assert message in str(info.value), (name, str(info.value))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_damage_is_a_plan_error_or_a_valid_plan(view, data):
    text = bytearray(view.to_json().encode())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text) - 1))
        text[i] = data.draw(st.sampled_from(b'0123456789[]{},:"-eE.tfnxFB '))
    try:
        got, _ = check_payload(payload(bytes(text)), 0, 0, dp=2)
    except PlanError:
        return
    got.validate()  # whatever got through is a valid view of rank 0 of 2 ranks
    assert got.dp == 2 and got.rank == 0


def test_plan_shard_loader_refuses_a_damaged_shard(plan, tmp_path):
    from slimdata.hooks.loader import PlanShardLoader
    from streaming import LocalDataset, MDSWriter

    from slimdata.solver.planshards import PLAN_COLUMNS, payload_positions, write_plan_shards

    pos = payload_positions(1, 1, 2)
    damaged = plan.rank_view(1).to_dict()
    damaged["ranks"][0]["backward"] = damaged["ranks"][0]["backward"][:1]  # slices lost
    with MDSWriter(out=str(tmp_path / "plan"), columns=PLAN_COLUMNS) as w:
        for flat in np.argsort(pos.reshape(-1)).tolist():
            w.write(payload(damaged if flat == 1 else plan.rank_view(flat).to_dict(), rank=flat))
    write_plan_shards([plan], tmp_path / "intact", nodes=1, ranks_per_node=2)  # its plan.json
    loader = PlanShardLoader(
        LocalDataset(local=str(tmp_path / "plan")),
        rank=1,
        ranks_per_node=2,
        plan_json=tmp_path / "intact" / "plan.json",
    )
    with pytest.raises(PlanError, match="is not in exactly one forward and one backward pack"):
        next(iter(loader))


def test_a_payload_changed_after_writing_is_refused_by_its_checksum(view):
    """A flipped token keeps every count and the plan intact; only the checksum sees it
    (a damaged shard once handed a rank token 1,515,909,660 of a 129,280-token vocabulary)."""
    good = payload(view.to_json())
    tokens = np.arange(1, view.tokens + 1, dtype=np.uint32)
    good.update(tokens=tokens, ntokens=len(tokens), crc32=payload_crc32(good["plan"], tokens))
    assert np.array_equal(check_payload(dict(good), 0, 0, dp=2)[1], tokens)
    flipped = dict(good, tokens=tokens.copy())
    flipped["tokens"][3] = 1515909660
    with pytest.raises(
        PlanError,
        match=r"plan payload stamped step 0, rank 0 is damaged: its plan and tokens have CRC-32 \d+, not the \d+ written with them",
    ):
        check_payload(flipped, 0, 0, dp=2)
    assert '"loss_tokens":2225' in good["plan"]  # a digit of the plan text changes:
    with pytest.raises(PlanError, match="is damaged"):
        check_payload(
            dict(good, plan=good["plan"].replace('"loss_tokens":2225', '"loss_tokens":2226', 1)),
            0,
            0,
        )
    renamed = {("text" if k == "plan" else k): v for k, v in good.items()}
    with pytest.raises(PlanError, match=r"not a slimdata plan payload .*missing \['plan'\]"):
        check_payload(renamed, 0, 0)
