"""Rank bodies of the execution-model test: what ``run_step`` actually does on a rank (model
calls per pack, collectives with their group and bytes: every floating-point one and the
merge groups' token exchange), recorded by wrapping
the model call and ``torch.distributed``'s collectives, next to the execution model's program
for that rank. Under static CP (``cp = k``) process ``r`` runs DP rank ``r // k``'s program,
whose groups name devices that stand for ``k`` processes each
(:func:`slimdata.sim.cp.real_devices`)."""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.distributed as dist
from hooks_helpers import TinyLM, doc_tokens, solver_case, tiny_forward
from hooks_workers import FSDP_PLANS, PLANS, _fsdp1, _fully_shard
from slimdata.hooks import make_payload, run_step
from slimdata.hooks import merge as merge_rt
from slimdata.hooks.callbacks import Callback

from slimdata.cost import CostModel, ModelConfig
from slimdata.execution import Collective, Compute, ExecutionConfig, build_programs
from slimdata.execution.cp import cp_chunks
from slimdata.plan import split_calls
from slimdata.sim.cp import real_devices

TINY = ModelConfig(
    name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=64, dtype_bytes=4
)

Pack = tuple[str, int, int, int, tuple[tuple[str, tuple[int, ...], int], ...]]
"""``(pass, pack, model calls, tokens through the model, collectives in the pack)``."""


def random_case(seed: int, world: int, mode: str = "free"):
    """A solver plan for random lengths: slimpack (merges when a document is long), or a
    baseline."""
    rng = random.Random(seed)
    lengths = [rng.randint(5, 140) for _ in range(rng.randint(2, 6))] + [rng.randint(300, 700)]
    strategy = ("slimpack", "bfd", "multipack")[seed % 3] if mode == "free" else "slimpack"
    plan, toks = solver_case(lengths, strategy, world, seed, context=512, mode=mode, memory_gib=4)
    return toks, plan


def random_cp_case(seed: int, dp: int, cp: int, mode: str = "free"):
    """A slimpack plan solved for static CP (``Layout(cp=cp)``) with one document longer than
    a pack (cut into slices across packs; at ``dp > 1`` slimpack may merge it)."""
    rng = random.Random(seed)
    lengths = [rng.randint(5, 140) for _ in range(rng.randint(2, 6))] + [rng.randint(520, 900)]
    plan, toks = solver_case(
        lengths, "slimpack", dp, seed, context=512, mode=mode, memory_gib=4, cp=cp
    )
    return toks, plan


def cut_across_packs(plan) -> bool:
    """Does some rank run one document's slices in more than one forward pack?"""
    return any(
        len({i for i, p in enumerate(rs.forward) for s in p.slices if s.doc == d}) > 1
        for rs in plan.ranks
        for d in {s.doc for s in rs.slices()}
    )


class _Recorder(Callback):
    def __init__(self) -> None:
        self.packs: list[Pack] = []
        self.tokens = 0
        self.coll: list[tuple[str, tuple[int, ...], int]] = []
        self.head: list[tuple[str, tuple[int, ...], int]] = []
        """Collectives before the first pack (the step's, not a pass's)."""

    def on_step_start(self, plan, rank) -> None:
        self.head, self.coll = self.coll, []

    def on_pack_end(self, event) -> None:
        self.packs.append((event.pass_, event.pack, event.calls, self.tokens, tuple(self.coll)))
        self.tokens, self.coll = 0, []


def _group_ranks(group) -> tuple[int, ...]:
    if group is None:
        return tuple(range(dist.get_world_size()))
    return tuple(sorted(dist.get_process_group_ranks(group)))


def _kind(group, what: str, other_kind: str, cp: int) -> str:
    """``merge_kv_<what>`` on a merge group's subgroup, ``cp_kv_<what>`` on a CP group's (the
    ``cp`` processes of one DP rank), else ``other_kind`` (FSDP's)."""
    if id(group) not in set(map(id, merge_rt._GROUPS.values())):
        return other_kind
    ranks = _group_ranks(group)
    cp_group = cp > 1 and ranks == tuple(range(ranks[0], ranks[0] + cp)) and ranks[0] % cp == 0
    return f"{'cp' if cp_group else 'merge'}_kv_{what}"


def record(
    model, payload, fsdp: bool, cp: int = 1, recompute: str | None = None
) -> tuple[list[Pack], list]:
    """Run ``payload`` (at static CP ``cp``, under ``recompute``: default the plan's) and
    return (per pack: calls, tokens, collectives; collectives after the last pack)."""
    rec = _Recorder()
    saved = {
        n: getattr(dist, n)
        for n in (
            "all_gather",
            "reduce_scatter_tensor",
            "all_reduce",
            "all_gather_into_tensor",
            "all_gather_single",  # FSDP2's parameter all-gather
            "reduce_scatter_single",  # FSDP2's gradient reduce-scatter
        )
    }

    def log(kind, group, t):
        rec.coll.append((kind, _group_ranks(group), t.numel() * t.element_size()))

    def all_gather(parts, t, group=None, **kw):
        if not t.is_floating_point() and _kind(group, "", "", cp).startswith("merge"):
            kind = "merge_tokens_all_gather"
            nbytes = sum(p.numel() * p.element_size() for p in parts)
            rec.coll.append((kind, _group_ranks(group), nbytes))
        if t.is_floating_point():
            rec.coll.append(
                (
                    _kind(group, "all_gather", "fsdp_all_gather", cp),
                    _group_ranks(group),
                    sum(p.numel() * p.element_size() for p in parts),
                )
            )
        return saved["all_gather"](parts, t, group=group, **kw)

    def all_gather_into_tensor(out, t, group=None, **kw):
        log(_kind(group, "all_gather", "fsdp_all_gather", cp), group, out)
        return saved["all_gather_into_tensor"](out, t, group=group, **kw)

    def reduce_scatter_tensor(out, t, op=dist.ReduceOp.SUM, group=None, **kw):
        log(_kind(group, "reduce_scatter", "fsdp_reduce_scatter", cp), group, t)
        return saved["reduce_scatter_tensor"](out, t, op=op, group=group, **kw)

    def all_gather_single(output_tensor, input_tensor, group=None, **kw):
        log("fsdp_all_gather", group, output_tensor)
        return saved["all_gather_single"](output_tensor, input_tensor, group=group, **kw)

    def reduce_scatter_single(output, input, group=None, **kw):
        log("fsdp_reduce_scatter", group, input)
        return saved["reduce_scatter_single"](output=output, input=input, group=group, **kw)

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None, **kw):
        if t.is_floating_point():
            log("ddp_all_reduce", group, t)
        return saved["all_reduce"](t, op=op, group=group, **kw)

    def forward(module, ids, pos):
        rec.tokens += len(ids)
        return tiny_forward(module, ids, pos)

    patched = {
        "all_gather": all_gather,
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "all_reduce": all_reduce,
        "all_gather_into_tensor": all_gather_into_tensor,
        "all_gather_single": all_gather_single,
        "reduce_scatter_single": reduce_scatter_single,
    }
    for n, f in patched.items():
        setattr(dist, n, f)
    try:
        run_step(
            model,
            payload,
            forward=forward,
            reduce_grads=None if fsdp else True,
            callbacks=[rec],
            cp=cp,
            recompute=recompute,
        )
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
    return rec.packs, rec.head + rec.coll


def expected(
    plan,
    rank: int,
    model: torch.nn.Module,
    fsdp: bool,
    cp: int = 1,
    member: int = 0,
    recompute: str = "none",
    keeps_graphs: bool = True,
) -> tuple[list[Pack], list]:
    """The same, read off the execution model's program of DP ``rank`` for a cost model
    of the ``recompute`` policy, its groups' devices mapped to the processes they stand for;
    under static CP the model runs CP ``member``'s tokens; ``keeps_graphs=False``: FSDP1's
    rules."""
    n_params = sum(p.numel() for p in model.parameters())
    cost = dataclasses.replace(CostModel.analytic(TINY, "h100", recompute), param_count=n_params)
    config = ExecutionConfig(
        parallelism="fsdp" if fsdp else "ddp",
        grad_bytes=4,
        cp=cp,
        fsdp_keeps_graphs=keeps_graphs,
    )
    program = build_programs(plan, cost, config)[(rank, 0)]
    packs: list[Pack] = []
    pending: list[Collective] = []
    for op in program.ops:
        if isinstance(op, Collective):
            pending.append(op)
        elif isinstance(op, Compute):
            tokens = (
                _model_tokens(op) if cp == 1 else _member_tokens(plan.ranks[rank], op, cp, member)
            )
            packs.append((op.pass_, op.pack, op.calls, tokens, ()))
    # a pass's collectives belong to its pack; the step's (a merge group's token exchange
    # first, DDP's all-reduce last) in program order
    by_pack: dict[tuple[str, int], list] = {}
    tail = []
    for op in pending:
        row = (op.kind, tuple(real_devices(op.group, plan.dp, cp)), round(op.bytes))
        if op.pass_:
            by_pack.setdefault((op.pass_, op.pack), []).append(row)
        else:
            tail.append(row)
    packs = [(p, i, c, t, tuple(by_pack.get((p, i), ()))) for p, i, c, t, _ in packs]
    return packs, tail


def _model_tokens(op: Compute) -> int:
    """Tokens the model runs in a pass: a forward's (a padding pack: one dummy token per
    call); a recomputing backward re-runs its forward; other backwards run no model call."""
    if op.pass_ == "F" or op.recompute:
        return op.tokens if op.tokens else op.calls
    return 0


def _member_tokens(rs, op: Compute, cp: int, member: int) -> int:
    """Static CP: tokens ``member`` runs through the model in a pass, its chunks of every
    call's slices (:func:`slimdata.execution.cp.cp_chunks`; an empty share runs one padding
    token, as does a dummy call)."""
    if op.pass_ == "B" and not op.recompute:
        return 0
    if not op.tokens:
        return op.calls
    if op.pass_ == "B":
        calls = [rs.backward[op.pack].slices]
    elif op.calls > 1:  # split by backward pack
        calls = [sl for _j, sl in split_calls(rs.forward, rs.backward).forward[op.pack]]
    else:
        calls = [rs.forward[op.pack].slices]
    return sum(
        max(sum(b - a for s in sl for a, b in cp_chunks(s.start, s.end, cp, member)), 1)
        for sl in calls
    )


def _param_collectives_per_pass(packs: list[Pack]) -> list[Pack]:
    """FSDP2 and FSDP1 issue one parameter collective per sharded unit (the model's
    wrapping) and pad shards; the program lists one per pass for the whole model: compare
    merge exchanges exactly and, per pass, which parameter collectives run over which
    group."""
    out = []
    for p, i, c, t, coll in packs:
        merge = tuple(x for x in coll if x[0].startswith(("merge", "cp_kv")))
        params = sorted({(x[0], x[1], 0) for x in coll if x[0].startswith("fsdp")})
        out.append((p, i, c, t, (*merge, *params)))
    return out


def runtime_vs_program(rank: int, world: int, seeds: list[int], named: list[str]) -> list:
    """Per case: (recorded, expected) for this rank. Free-mode cases run a bare module with
    ``reduce_grads=True`` (DDP's reduction); ``fsdp:`` cases run FSDP2 on a lockstep plan,
    ``fsdp1:`` cases FSDP1 (``FullyShardedDataParallel``: every backward pack recomputed);
    ``full:`` cases run with every layer checkpointed (``recompute="full"``), priced by a
    cost model of that policy."""
    cases = [(f"seed{s}", *random_case(s, world)) for s in seeds]
    for name in named:
        base = name.split(":")[-1]
        if name.startswith(("fsdp:", "fsdp1:")):
            toks, plan = FSDP_PLANS[base]()
        else:
            toks, plan = PLANS[base]()
            if not base.startswith("solver"):  # hand plans give lengths
                toks = doc_tokens(toks, seed=7)
        cases.append((name, toks, plan))
    cases.append(("fsdp:random", *random_case(seeds[0] + 100, world, mode="lockstep")))
    out = []
    for name, toks, plan in cases:
        fsdp1 = name.startswith("fsdp1:")
        fsdp = fsdp1 or name.startswith("fsdp:")
        policy = "full" if name.startswith("full:") else "none"
        model = TinyLM(seed=1)
        want = expected(plan, rank, model, fsdp, recompute=policy, keeps_graphs=not fsdp1)
        if fsdp:
            model = _fsdp1(model) if fsdp1 else _fully_shard(model, world)
        got = record(model, make_payload(plan, rank, toks), fsdp, recompute=policy)
        if fsdp:
            got = (_param_collectives_per_pass(got[0]), got[1])
            want = (_param_collectives_per_pass(want[0]), want[1])
        out.append((name, got, want))
    return out


def runtime_vs_program_cp(rank: int, world: int, seeds: list[int], named: list[str]) -> list:
    """Static CP at ``cp = 2`` (DP rank ``rank // 2``): per case, (recorded, expected,
    some document cut across packs?). Random slimpack plans solved with ``Layout(cp=2)``
    (free mode, a bare module with ``reduce_grads=True``; and one lockstep plan under FSDP2)
    and hand plans of :mod:`cp_workers`."""
    import cp_workers

    cp = 2
    dp = world // cp
    cases = [(f"cp_seed{s}", *random_cp_case(s, dp, cp)) for s in seeds]
    for name in named:
        lengths, plan = cp_workers.PLANS[name]()
        cases.append((name, doc_tokens(lengths, seed=3), plan))
    cases.append(("fsdp:cp_random", *random_cp_case(seeds[0] + 100, dp, cp, mode="lockstep")))
    out = []
    for name, toks, plan in cases:
        fsdp = name.startswith("fsdp:")
        model = TinyLM(seed=1)
        want = expected(plan, rank // cp, model, fsdp, cp, rank % cp)
        if fsdp:
            model = _fully_shard(model, world)
        got = record(model, make_payload(plan, rank // cp, toks), fsdp, cp)
        if fsdp:
            got = (_param_collectives_per_pass(got[0]), got[1])
            want = (_param_collectives_per_pass(want[0]), want[1])
        out.append((name, got, want, cut_across_packs(plan)))
    return out
