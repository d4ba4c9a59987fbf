"""The strategy study example runs end to end in its small (CI) setting."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from slimdata.solver import ALL_STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "fixtures" / "lengths"  # copies of the shared samples


def _study():
    """The example ``examples/strategy_study.py`` as a module."""
    spec = importlib.util.spec_from_file_location(
        "strategy_study", ROOT / "examples" / "strategy_study.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_strategy_study_small(tmp_path):
    mod = _study()
    rows = mod.run(False, tmp_path, DATA)
    assert len(rows) == 2 * 3 * 2 * len(ALL_STRATEGIES)  # datasets x contexts x pp x strategies
    for name in ("strategy_study.csv", "strategy_study.md", "strategy_study.png", "targets.md"):
        assert (tmp_path / name).stat().st_size > 100
    ok = [r for r in rows if not r["error"]]
    assert ok and all(r["lower_bound"] <= r["step_time"] for r in ok)
    assert {r["strategy"] for r in ok} >= {"concat", "slimpack"}


def test_strategy_study_summary_compares_slimpack_with_the_best_same_work_baseline():
    # concat cuts documents (fewer attention pairs): "vs best" is against the fastest other
    mod = _study()
    setting = {"dataset": "wlb128k", "context": "128K", "dp": 8, "pp": 4, "error": "", "cp": 1}
    rows = [
        {**setting, "strategy": name, "step_time": t, "lower_bound": 10.0, "bound": 10.0}
        for name, t in (("concat", 10.44), ("wlb-ideal", 12.14), ("slimpack", 10.69))
    ]
    line = mod.summary(rows).splitlines()[-1].split(" | ")
    assert line[5] == "wlb-ideal 12.14 (1)"
    assert line[8:10] == ["0.98x", "1.14x"]  # vs concat, vs best


def test_strategy_study_measures_slimpack_against_the_plan_independent_bound():
    # "lower_bound" is each plan's own bound (it moves with the plan); the gap to the bound
    # in the summary and the targets is against the batch's plan-independent "bound"
    mod = _study()
    setting = {"dataset": "wikipedia", "context": "32K", "dp": 8, "pp": 1, "error": "", "cp": 1}
    rows = [
        {**setting, "strategy": "slimpack", "step_time": 10.3, "lower_bound": 10.2, "bound": 10.0},
        {**setting, "strategy": "bfd", "step_time": 11.0, "lower_bound": 11.0, "bound": 10.0},
    ]
    assert mod.summary(rows).splitlines()[-1].split(" | ")[7] == "10.00"
    assert mod.summary(rows).splitlines()[-1].endswith("| +3.0% |")
    assert mod.targets(rows).splitlines()[-1].endswith("| +3.0% | no |")
