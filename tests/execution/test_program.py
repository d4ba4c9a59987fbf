"""The execution model on hand-computable plans: operation order, collectives, the memory rule."""

from __future__ import annotations

import dataclasses

import pytest

from slimdata.cost import CostModel
from slimdata.execution import (
    Alloc,
    Collective,
    ExecutionConfig,
    Free,
    build_programs,
    compute_levels,
    levels,
    peak,
)
from slimdata.plan import Document, MergeGroup, MicroPack, RankStep, Slice, StepPlan

# 1 s per token forward, 2 s backward, 1 byte of activations and 1 of K/V per token
COST = CostModel(
    fwd_lin=1.0,
    fwd_att=0.0,
    fwd_const=0.0,
    bwd_lin=2.0,
    bwd_att=0.0,
    bwd_const=0.0,
    act_bytes_per_token=1.0,
    kv_bytes_per_token=1.0,
)


def _plan(ranks, lengths, merges=()):
    docs = tuple(Document(i, n) for i, n in enumerate(lengths))
    steps = tuple(
        RankStep(
            r,
            tuple(MicroPack(tuple(Slice(*s) for s in p)) for p in fwd),
            tuple(MicroPack(tuple(Slice(*s) for s in p)) for p in bwd),
        )
        for r, (fwd, bwd) in enumerate(ranks)
    )
    return StepPlan(0, "test", docs, steps, merges)


def test_docstring_example_order_and_memory():
    # a 6-token doc as forward packs [0,4) [4,6) and one backward pack
    plan = _plan([([[(0, 0, 4)], [(0, 4, 6)]], [[(0, 4, 6), (0, 0, 4)]])], [6])
    prog = build_programs(plan, COST)[(0, 0)]
    assert [type(op).__name__ for op in prog.ops] == [
        "Alloc", "Alloc", "Compute", "Alloc", "Alloc", "Compute",
        "Compute", "Free", "Free",
    ]  # fmt: skip
    assert prog.ops[-2:] == (Free("activations", 6.0), Free("kv", 6.0))
    f0, f1, b0 = prog.computes()
    assert (f0.pass_, f0.pack, f0.seconds, f0.tokens, f0.pairs) == ("F", 0, 4.0, 4, 10.0)
    assert (f1.seconds, f1.pairs) == (2.0, 4 * 2 + 3.0)  # 2 queries x 4 prefix + causal 3
    assert (b0.pass_, b0.seconds, b0.tokens) == ("B", 12.0, 6)
    assert levels(prog).tolist() == [8.0, 12.0, 12.0]  # held while each compute runs
    assert compute_levels(prog).tolist() == [8.0, 12.0, 0.0]  # after each compute
    assert peak(prog) == 12.0
    assert prog.collectives() == []  # one rank, no parameters: nothing to exchange


def test_kv_freed_per_slice_when_its_backward_pack_ends():
    # backward packs [4,6) then [0,4): B0 frees the last slice's activations (2) and K/V (2),
    # so 12 - 4 = 8 bytes stay until B1 (a per-document rule would keep all 6 K/V: 10)
    plan = _plan([([[(0, 0, 4)], [(0, 4, 6)]], [[(0, 4, 6)], [(0, 0, 4)]])], [6])
    prog = build_programs(plan, COST)[(0, 0)]
    assert compute_levels(prog).tolist() == [8.0, 12.0, 8.0, 0.0]


def test_ddp_all_reduce_ends_the_step_on_every_rank():

    cost = dataclasses.replace(COST, param_count=100)
    plan = _plan([([[(0, 0, 3)]], [[(0, 0, 3)]]), ([[(1, 0, 2)]], [[(1, 0, 2)]])], [3, 2])
    progs = build_programs(plan, cost, ExecutionConfig(grad_bytes=4))
    for r in (0, 1):
        assert progs[(r, 0)].collectives() == [Collective("ddp_all_reduce", (0, 1), 400.0)]
        assert isinstance(progs[(r, 0)].ops[-1], Collective)


def _merge_of_8_tokens():
    """Doc 0 (8 tokens) merged over ranks 0 and 1, shares [0, 5) and [5, 8)."""
    r0 = RankStep(
        0, (MicroPack((Slice(0, 0, 5),), merge=0),), (MicroPack((Slice(0, 0, 5),), merge=0),)
    )
    r1 = RankStep(
        1, (MicroPack((Slice(0, 5, 8),), merge=0),), (MicroPack((Slice(0, 5, 8),), merge=0),)
    )
    return StepPlan(0, "test", (Document(0, 8),), (r0, r1), (MergeGroup((0, 1), (0,)),))


def test_merge_pack_gathers_one_layer_at_a_time():
    # doc 0 (8 tokens) merged over ranks 0 and 1, shares 5 and 3 (padded to 5: 10 tokens per
    # layer); 2 layers, K/V 2 bytes per token over all layers -> 1 byte per token per layer

    cost = dataclasses.replace(COST, layers=2, kv_bytes_per_token=2.0)
    plan = _merge_of_8_tokens()
    prog = build_programs(plan, cost)[(1, 0)]
    merge = [(c.kind, c.layer, c.bytes) for c in prog.collectives() if c.kind.startswith("merge")]
    assert merge == [
        # first the members' token ids and loss masks: 2 rows of 5 int64 from each of 2 ranks
        ("merge_tokens_all_gather", -1, 160.0),
        ("merge_kv_all_gather", 0, 10.0), ("merge_kv_all_gather", 1, 10.0),  # forward
        ("merge_kv_all_gather", 1, 10.0), ("merge_kv_reduce_scatter", 1, 10.0),  # backward
        ("merge_kv_all_gather", 0, 10.0), ("merge_kv_reduce_scatter", 0, 10.0),
    ]  # fmt: skip
    # rank 1 (3 tokens): F holds act 3 + K/V 6 + one layer's gathered K/V 10 = 19;
    # B holds 9 + twice the gathered K/V (K/V and their gradients) = 29
    assert levels(prog).tolist() == [19.0, 29.0]
    assert compute_levels(prog).tolist() == [9.0, 0.0]


def test_merge_members_gather_the_documents_tokens_once_before_any_pack():
    # the merge above on 2 pipeline stages under static CP 2: on each stage the members'
    # devices (stage * dp + rank) gather, before their first pass, 2 rows (ids, loss mask) of
    # the larger share's 5 tokens from each of the 2 x 2 processes: 4 * 2 * 5 * 8 = 320 bytes
    plan = _merge_of_8_tokens()
    progs = build_programs(plan, COST, ExecutionConfig(pp=2, cp=2))
    for (rank, stage), devices in {(0, 0): (0, 1), (1, 0): (0, 1), (1, 1): (2, 3)}.items():
        first = progs[(rank, stage)].ops[0]
        assert first == Collective("merge_tokens_all_gather", devices, 320.0)
        tokens = [c for c in progs[(rank, stage)].collectives() if "tokens" in c.kind]
        assert tokens == [first]


def test_a_model_with_fewer_layers_than_chunks_gathers_once_per_layer():
    # the merge above, 2 layers over 4 pipeline chunks (pp 2, 2 virtual stages): the chunks
    # hold 0, 1, 1 and 0 layers, so the member's programs gather each layer's K/V once in the
    # forward, as the model has 2 layers (not none: every chunk's rint(0.5) layers)
    cost = dataclasses.replace(COST, layers=2, kv_bytes_per_token=2.0)
    plan = _merge_of_8_tokens()
    config = ExecutionConfig(pp=2, schedule="interleaved", virtual_stages=2)
    progs = build_programs(plan, cost, config)
    forward = [
        (c.chunk, c.layer)
        for stage in (0, 1)
        for c in progs[(1, stage)].collectives()
        if c.kind == "merge_kv_all_gather" and c.pass_ == "F"
    ]
    assert sorted(forward) == [(1, 0), (2, 1)]


def test_pipeline_sends_and_receives_hidden_states():

    cost = dataclasses.replace(COST, layers=2, hidden=4, dtype_bytes=2)
    plan = _plan([([[(0, 0, 3)]], [[(0, 0, 3)]])], [3])
    progs = build_programs(plan, cost, ExecutionConfig(pp=2))
    # 3 tokens x 4 hidden x 2 bytes = 24 bytes each way; device = stage * dp + rank
    assert progs[(0, 0)].collectives() == [
        Collective("send", (0, 1), 24.0, "F", 0, 0),
        Collective("recv", (1, 0), 24.0, "B", 0, 0),
    ]
    assert progs[(0, 1)].collectives() == [
        Collective("recv", (0, 1), 24.0, "F", 1, 0),
        Collective("send", (1, 0), 24.0, "B", 1, 0),
    ]
    # each stage holds half of the layers: 1.5 + 1.5 bytes of the 3 tokens
    assert peak(progs[(0, 0)]) == pytest.approx(3.0)
    assert [c.seconds for c in progs[(0, 1)].computes()] == [1.5, 3.0]


def test_graph_free_forward_holds_activations_only_while_it_runs():
    # FSDP lockstep; a = doc 0 [0,2), b = doc 1 [0,3), c = doc 2 [0,1); forward [a], [b, c],
    # backward [c], [a, b]: no backward pack is a union, so both forward packs run graph-free
    # and both backward packs recompute; K/V stays from forward to backward
    plan = _plan(
        [([[(0, 0, 2)], [(1, 0, 3), (2, 0, 1)]], [[(2, 0, 1)], [(0, 0, 2), (1, 0, 3)]])], [2, 3, 1]
    )
    prog = build_programs(plan, COST, ExecutionConfig(parallelism="fsdp"))[(0, 0)]
    f0, f1, b0, b1 = prog.computes()
    assert f0.graph_free and f1.graph_free and b0.recompute and b1.recompute
    # F0: act 2 + kv 2 = 4, keeps kv 2; F1: 2 + act 4 + kv 4 = 10, keeps kv 6;
    # B0 re-runs c: 6 + act 1 = 7, frees c (kv 1): 5; B1 re-runs a, b: 5 + act 5 = 10, frees all
    assert levels(prog).tolist() == [4.0, 10.0, 7.0, 10.0]
    assert compute_levels(prog).tolist() == [2.0, 6.0, 5.0, 0.0]
    assert [op for op in prog.ops if isinstance(op, Alloc | Free)]  # guard: memory was listed


def test_fsdp1_recomputes_every_backward_pack():
    # FSDP lockstep, one rank; a = doc 0 [0,2), b = doc 1 [0,3); forward [a], [b], backward
    # [b], [a]: each backward pack is the union of one forward pack. FSDP2 runs them through
    # the kept graphs; FSDP1 frees its gathered parameters after a forward, so both forwards
    # run graph-free and both backward packs re-run their forward first
    plan = _plan([([[(0, 0, 2)], [(1, 0, 3)]], [[(1, 0, 3)], [(0, 0, 2)]])], [2, 3])
    fsdp2 = build_programs(plan, COST, ExecutionConfig(parallelism="fsdp"))[(0, 0)]
    fsdp1 = ExecutionConfig(parallelism="fsdp", fsdp_keeps_graphs=False)
    prog = build_programs(plan, COST, fsdp1)[(0, 0)]
    kept = fsdp2.computes()
    assert not any(c.graph_free or c.recompute for c in kept)
    assert [c.seconds for c in kept] == [2.0, 3.0, 6.0, 4.0]  # 1 s / token forward, 2 backward
    f0, f1, b0, b1 = prog.computes()
    assert f0.graph_free and f1.graph_free and b0.recompute and b1.recompute
    assert [c.seconds for c in (f0, f1, b0, b1)] == [2.0, 3.0, 3.0 + 6.0, 2.0 + 4.0]
    # memory: F0 act 2 + kv 2 = 4, keeps kv 2; F1 2 + act 3 + kv 3 = 8, keeps kv 5; B0 re-runs
    # b: 5 + act 3 = 8, frees b (kv 3): 2; B1 re-runs a: 2 + act 2 = 4, frees all
    assert levels(prog).tolist() == [4.0, 8.0, 8.0, 4.0]
    assert compute_levels(prog).tolist() == [2.0, 5.0, 2.0, 0.0]


def critical_path(programs) -> list[float]:
    """Reference: every rank's programs run their computes in program order, a forward on
    chunk c after the same pack's forward on c - 1, a backward on c after c + 1; no
    communication; the makespan per rank."""
    n_chunks = len(programs.fractions)
    out = []
    for r in range(programs.dp):
        stages = [programs[(r, s)].computes() for s in range(programs.pp)]
        end: dict = {}
        clock, pos = [0.0] * len(stages), [0] * len(stages)
        while any(p < len(ops) for p, ops in zip(pos, stages, strict=True)):
            for s, ops in enumerate(stages):
                while pos[s] < len(ops):
                    op = ops[pos[s]]
                    up = op.chunk - 1 if op.pass_ == "F" else op.chunk + 1
                    dep = (op.pass_, up, op.pack)
                    if 0 <= up < n_chunks and dep not in end:
                        break
                    clock[s] = max(clock[s], end.get(dep, 0.0)) + op.seconds
                    end[(op.pass_, op.chunk, op.pack)] = clock[s]
                    pos[s] += 1
        out.append(max(clock, default=0.0))
    return out


def test_critical_path_of_a_two_stage_pipeline():
    # forward packs of 1 s, backward 2 s, order F0 B0 F1 B1, pp = 2,
    # each op half its pack: stage 0 F0 0.5, F1 1.0; stage 1 F0 1.0, B0 2.0, F1 2.5, B1 3.5;
    # stage 0 B0 3.0, B1 4.5
    one = dataclasses.replace(COST, layers=2, act_bytes_per_token=0.0, kv_bytes_per_token=0.0)
    plan = _plan([([[(0, 0, 1)], [(1, 0, 1)]], [[(0, 0, 1)], [(1, 0, 1)]])], [1, 1])
    assert plan.ranks[0].order == (("F", 0), ("B", 0), ("F", 1), ("B", 1))
    progs = build_programs(plan, one, ExecutionConfig(pp=2))
    assert [(c.pass_, c.pack) for c in progs[(0, 0)].computes()] == [
        ("F", 0), ("F", 1), ("B", 0), ("B", 1)
    ]  # fmt: skip
    assert critical_path(progs) == [4.5]


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_planner_fast_estimate_is_the_programs_critical_path(pp):
    # equivalence against the reference: the solver's estimate of a lockstep plan (packs'
    # MicroPack.cost through its stage orders) equals the critical path of the programs
    import numpy as np

    from slimdata.docsource import documents_from_lengths
    from slimdata.execution.critical import plan_critical_path
    from slimdata.solver import Layout, solve

    cost = CostModel.analytic("llama-8b", "h100", "full")
    rng = np.random.default_rng(pp)
    checked = 0
    for seed in range(3):
        lengths = rng.integers(200, 20000, size=40).tolist()
        layout = Layout(dp=4, pp=pp, mode="lockstep", context=32768, memory_gib=20)
        plan = solve(documents_from_lengths(lengths, 2048), layout, "slimpack", seed, cost)
        assert not plan.merges  # the setup: every document on one rank
        progs = build_programs(plan, cost, ExecutionConfig(pp=pp), compute_only=True)
        full = build_programs(plan, cost, ExecutionConfig(pp=pp))
        assert [p.computes() for p in full] == [list(p.ops) for p in progs]  # same computes
        want = max(critical_path(progs))
        got = plan_critical_path(plan, cost, ExecutionConfig(pp=pp))
        assert got == pytest.approx(want, rel=1e-9)
        checked += want > 0
    assert checked == 3


@pytest.mark.parametrize(("pp", "schedule", "v"), [(2, "1f1b", 1), (4, "interleaved", 2)])
def test_planner_estimate_is_the_critical_path_of_random_orders(pp, schedule, v):
    # random plans: every rank a random lag (its own order), layers that do not split evenly;
    # the planner's estimate of the plan equals the critical path of its compute-only programs
    import numpy as np

    from slimdata.docsource import documents_from_lengths
    from slimdata.execution.critical import plan_critical_path
    from slimdata.plan.pipeline import interleave
    from slimdata.solver import Layout, solve

    cost = dataclasses.replace(CostModel.analytic("llama-8b", "h100", "full"), layers=30)
    rng = np.random.default_rng(pp)
    checked = 0
    for seed in range(3):
        lengths = rng.integers(200, 20000, size=40).tolist()
        layout = Layout(dp=3, pp=pp, mode="lockstep", context=32768, memory_gib=60)
        plan = solve(documents_from_lengths(lengths, 2048), layout, "slimpack", seed, cost)
        ranks = []
        for rs in plan.ranks:
            m, lag = len(rs.forward), int(rng.integers(0, 4))
            ranks.append(dataclasses.replace(rs, order=interleave(m, [j + lag for j in range(m)])))
        plan = dataclasses.replace(plan, ranks=tuple(ranks))
        assert not plan.merges
        config = ExecutionConfig(pp=pp, schedule=schedule, virtual_stages=v)
        want = max(critical_path(build_programs(plan, cost, config, compute_only=True)))
        got = plan_critical_path(plan, cost, config)
        assert got == pytest.approx(want, rel=1e-9)
        checked += len({rs.order for rs in plan.ranks}) > 1 and want > 0
    assert checked  # not vacuous: ranks with different orders


def test_bad_execution_config_names_the_value():
    from slimdata.errors import ConfigError

    with pytest.raises(ConfigError, match="parallelism='zero3'"):
        ExecutionConfig(parallelism="zero3")
    with pytest.raises(ConfigError, match="pp=0"):
        ExecutionConfig(pp=0)


def test_empty_plan_and_idle_rank():
    # a rank with no packs has an empty program (no collectives without parameters) and
    # peak 0; the edge of the ladder: an idle rank next to a busy one
    plan = _plan([([[(0, 0, 3)]], [[(0, 0, 3)]]), ([], [])], [3])
    progs = build_programs(plan, COST)
    assert progs[(1, 0)].ops == ()
    assert peak(progs[(1, 0)]) == 0.0
    assert peak(progs[(0, 0)]) == 6.0


def test_static_cp_lists_every_calls_kv_collectives_per_layer():
    # doc 0 of 7 tokens cut [0,4) [4,7), forward packs [0,4) then [4,7), backward packs
    # mirrored; cp=2, 2 layers, K/V 2 bytes per token over all layers -> 1 byte per token per
    # layer. Members' rows: [0,4) 2 and 2, [4,7) 1 and 2 (chunks of 1), so F0 gathers
    # 2 x 2 = 4 tokens, F1 its prefix [0,4) and [4,7): 2 x max(3, 4) = 8 tokens.
    cost = dataclasses.replace(COST, layers=2, kv_bytes_per_token=2.0)
    plan = _plan([([[(0, 0, 4)], [(0, 4, 7)]], [[(0, 4, 7)], [(0, 0, 4)]])], [7])
    prog = build_programs(plan, cost, ExecutionConfig(cp=2))[(0, 0)]
    got = [(c.kind[6:], c.pass_, c.pack, c.layer, c.bytes) for c in prog.collectives()]
    assert all(c.kind.startswith("cp_kv_") and c.group == (0,) for c in prog.collectives())
    assert got == [
        ("all_gather", "F", 0, 0, 4.0), ("all_gather", "F", 0, 1, 4.0),
        ("all_gather", "F", 1, 0, 8.0), ("all_gather", "F", 1, 1, 8.0),
        # backward: per layer, last first, gather again and reduce-scatter the gradient
        ("all_gather", "B", 0, 1, 8.0), ("reduce_scatter", "B", 0, 1, 8.0),
        ("all_gather", "B", 0, 0, 8.0), ("reduce_scatter", "B", 0, 0, 8.0),
        ("all_gather", "B", 1, 1, 4.0), ("reduce_scatter", "B", 1, 1, 4.0),
        ("all_gather", "B", 1, 0, 4.0), ("reduce_scatter", "B", 1, 0, 4.0),
    ]  # fmt: skip
    # held while each pass runs: half the slices' bytes (act 1 + K/V 2 per token) plus one
    # layer's gathered K/V, twice in the backward: F0 6 + 4, F1 10.5 + 8, B0 10.5 + 16,
    # B1 (after B0 freed [4,7)) 6 + 8
    assert levels(prog).tolist() == [10.0, 18.5, 26.5, 14.0]


@pytest.mark.parametrize(
    ("pp", "schedule", "v", "parallelism", "cp", "mode"),
    [
        (1, "1f1b", 1, "ddp", 1, "free"),
        (1, "1f1b", 1, "fsdp", 1, "lockstep"),
        (2, "interleaved", 2, "ddp", 1, "lockstep"),
        (2, "1f1b", 1, "ddp", 2, "lockstep"),
        (1, "1f1b", 1, "ddp", 2, "free"),
    ],
)
def test_memory_only_programs_hold_what_the_full_programs_hold(
    pp, schedule, v, parallelism, cp, mode
):
    """``memory_only`` drops the collectives and keeps every allocation, free and compute in
    order: every device's levels are the full program's, bit for bit, with DP-Merge groups,
    FSDP, the interleaved schedule and static CP."""
    import numpy as np

    from slimdata.docsource import documents_from_lengths
    from slimdata.solver import Layout, solve

    cost = CostModel.analytic("llama-8b", "h100", "full")
    lengths = np.random.default_rng(0).integers(200, 60000, size=10).tolist()
    layout = Layout(
        dp=8, pp=pp, mode=mode, context=65536, memory_gib=20, cp=cp, schedule=schedule,
        virtual_stages=v,
    )  # fmt: skip
    plan = solve(documents_from_lengths(lengths, 2048), layout, "slimpack", 0, cost)
    assert plan.merges  # merge packs' gathered K/V buffers are among the allocations
    config = ExecutionConfig(
        pp=pp, parallelism=parallelism, schedule=schedule, virtual_stages=v, cp=cp
    )
    full = build_programs(plan, cost, config)
    lean = build_programs(plan, cost, config, memory_only=True)
    for key, program in full.programs.items():
        assert levels(lean[key]).tolist() == levels(program).tolist()
        assert not any(isinstance(op, Collective) for op in lean[key].ops)
    assert sum(map(len, (p.ops for p in lean))) < sum(map(len, (p.ops for p in full)))
