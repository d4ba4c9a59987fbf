"""Progress of long commands: ``slimdata plan`` counts the steps it solves and ``slimdata
simulate`` the steps it simulates, on standard error when it is a terminal, never into what
a pipe or ``--json -`` reads."""

from __future__ import annotations

import io
import json
from collections import Counter

from click.testing import CliRunner

from slimdata.cli import cli
from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths
from slimdata.sim.compare import compare_strategies
from slimdata.solver import Layout
from slimdata.solver.epoch import plan_epoch

LENGTHS = [3000, 1200, 800, 4000, 500, 2500, 700, 1900, 3300, 600, 1500, 900]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plan_epoch_counts_every_step_on_a_terminal(monkeypatch):
    docs = documents_from_lengths(LENGTHS, 512)
    layout = Layout(dp=2, memory_gib=80, context=4096)
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    plans = list(plan_epoch(docs, layout, global_batch_tokens=8192, progress=True))
    assert len(plans) == 3  # 21,900 tokens in steps of <= 8,192
    assert "plan: 100%" in err.getvalue() and "3/3" in err.getvalue()

    quiet = Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    assert len(list(plan_epoch(docs, layout, global_batch_tokens=8192))) == 3
    assert quiet.getvalue() == ""


def test_no_bar_where_standard_error_is_not_a_terminal(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(map(str, LENGTHS)))
    args = ["plan", "--lengths", str(lengths), "--nodes", "1", "--ranks-per-node", "2"]
    args += ["--global-batch-tokens", "8192", "--context", "4096", "--memory-gib", "80"]
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "p"), "--json", "-"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["steps"] == 3  # nothing but the JSON
    res = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "q"), "--quiet"])
    assert res.exit_code == 0 and "wrote 3 steps" in res.output, res.output


def test_simulate_reports_every_simulation_with_its_strategy():
    docs = documents_from_lengths(LENGTHS, 512)
    layout = Layout(dp=2, memory_gib=80, context=4096)
    seen: Counter[str] = Counter()
    cmp = compare_strategies(
        docs,
        layout,
        CostModel.analytic("llama-1b", "h100", "full"),
        strategies=["bfd", "slimpack"],
        steps=2,
        global_batch_tokens=8192,
        progress=lambda name: seen.update([name]),
    )
    assert sum(seen.values()) == cmp.search["simulations"]
    # the two strategies and concat at the smallest CP (the Megatron default column)
    assert set(seen) == {"bfd", "slimpack", "concat"}
