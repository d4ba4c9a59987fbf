"""Cyclic garbage collection is paused while plans are built, and restored exactly as found."""

import gc

import pytest

import slimdata.solver.strategies.slimpack as sp
from slimdata.gcpause import cyclic_gc_paused
from slimdata.solver import Layout, solve

from .conftest import docs_of, unit_cost


@pytest.fixture(autouse=True)
def _gc_restored():
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_off_inside_restored_after_even_on_error_and_nested():
    gc.enable()
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one found it off: it leaves it off
    assert gc.isenabled()
    with pytest.raises(KeyError), cyclic_gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_caller_that_turned_collection_off_keeps_it_off():
    gc.disable()
    with cyclic_gc_paused():
        pass
    assert not gc.isenabled()


@pytest.mark.parametrize("mode", ["free", "lockstep"])
def test_a_slimpack_solve_runs_with_collection_paused(monkeypatch, mode):
    seen = []
    for name in ("_solve_lockstep", "_phase1"):
        inner = getattr(sp, name)

        def spy(*args, _inner=inner, **kwargs):
            seen.append(gc.isenabled())
            return _inner(*args, **kwargs)

        monkeypatch.setattr(sp, name, spy)
    gc.enable()
    layout = Layout(dp=2, pp=2 if mode == "lockstep" else 1, mode=mode, memory_gib=100)
    solve(docs_of([300, 200, 100, 400]), layout, "slimpack", 0, unit_cost())
    assert seen and not any(seen)  # guard: the spies ran
    assert gc.isenabled()
