"""SolveOptions: typed strategy knobs, refused where the strategy does not read them."""

import dataclasses

import pytest

from slimdata.errors import ConfigError
from slimdata.solver import Layout, PlanConfig, SolveOptions, solve
from slimdata.solver.epoch import plan_epoch
from slimdata.solver.options import OPTIONS_OF

from .conftest import docs_of


def test_defaults_change_nothing_and_name_the_changed_knobs():
    assert SolveOptions().changed() == ()
    assert SolveOptions(skew_merge=False, min_cp=2).changed() == ("skew_merge", "min_cp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        SolveOptions().merge_share = 2.0  # type: ignore[misc]


def test_a_misspelt_knob_fails_where_the_value_is_built():
    with pytest.raises(TypeError, match="skew_merges"):
        SolveOptions(skew_merges=False)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("merge_share", 0.0, "merge_share=0"),
        ("merge_share", -1.0, "merge_share=-1.0"),
        ("improve_rounds", -1, "improve_rounds=-1"),
        ("milp_seconds", -0.5, "milp_seconds=-0.5"),
        ("refine_share", -0.1, "refine_share=-0.1"),
        ("max_seqlen_per_rank", 0, "max_seqlen_per_rank=0"),
        ("min_cp", 0, "min_cp=0"),
    ],
)
def test_invalid_knobs_name_the_value(field, value, match):
    with pytest.raises(ConfigError, match=match):
        SolveOptions(**{field: value})


def test_every_knob_is_read_by_exactly_one_strategy():
    fields = {f.name for f in dataclasses.fields(SolveOptions)}
    assert set().union(*OPTIONS_OF.values()) == fields
    assert sum(len(v) for v in OPTIONS_OF.values()) == len(fields)


def test_a_knob_the_strategy_does_not_read_is_refused(ucost):
    docs = docs_of([100, 50, 90])
    with pytest.raises(
        ConfigError, match=r"strategy='bfd' does not read the option\(s\) skew_merge"
    ):
        solve(docs, Layout(dp=2), "bfd", cost=ucost, options=SolveOptions(skew_merge=False))
    with pytest.raises(ConfigError, match=r"does not read the option\(s\) min_cp \(it reads: "):
        solve(docs, Layout(dp=2), "slimpack", cost=ucost, options=SolveOptions(min_cp=2))
    # defaults go to every strategy
    assert solve(docs, Layout(dp=2), "bfd", cost=ucost, options=SolveOptions()).tokens == 240


def test_options_reach_slimpack_through_every_entry(ucost):
    # improve_rounds=0 turns the local search off: the plan records no move
    docs = docs_of([300, 200, 100, 400, 250, 150, 90, 310])
    layout = Layout(dp=3, memory_gib=100)
    off = SolveOptions(improve_rounds=0)
    assert solve(docs, layout, "slimpack", cost=ucost, options=off).meta["improve_moves"] == 0
    config = PlanConfig(layout=layout, global_batch_tokens=10_000, cost=ucost)
    assert config.solve(docs, options=off).meta["improve_moves"] == 0
    plans = list(plan_epoch(docs, layout, global_batch_tokens=10_000, cost=ucost, options=off))
    assert [p.meta["improve_moves"] for p in plans] == [0]
    assert SolveOptions(merge_share=0.5).merge_share == 0.5
    shared = solve(docs, layout, "slimpack", cost=ucost, options=SolveOptions(merge_share=0.5))
    assert shared.meta["merge_share"] == 0.5


def test_forced_merges_only_turns_off_every_merge_memory_does_not_force():
    opts = SolveOptions(improve_rounds=3).forced_merges_only()
    assert opts.changed() == ("merge_share", "improve_rounds", "skew_merge", "coarse_merge")
    assert (opts.merge_share, opts.skew_merge, opts.coarse_merge) == (float("inf"), False, False)
    assert opts.improve_rounds == 3  # the other knobs kept
