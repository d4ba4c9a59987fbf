"""Rank bodies of the execution-model test: what ``run_step`` actually does on a rank (model
calls per pack, floating-point collectives with their group and bytes), recorded by wrapping
the model call and ``torch.distributed``'s collectives, next to the execution model's program
for that rank."""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.distributed as dist
from hooks_helpers import TinyLM, doc_tokens, solver_case, tiny_forward
from hooks_workers import FSDP_PLANS, PLANS, _fully_shard
from slimdata.hooks import make_payload, run_step
from slimdata.hooks import merge as merge_rt
from slimdata.hooks.callbacks import Callback

from slimdata.cost import CostModel, ModelConfig
from slimdata.execution import Collective, Compute, ExecutionConfig, build_programs

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


class _Recorder(Callback):
    def __init__(self) -> None:
        self.packs: list[Pack] = []
        self.tokens = 0
        self.coll: list[tuple[str, tuple[int, ...], int]] = []

    def on_pack_end(self, event) -> None:
        self.packs.append((event.pass_, event.pack, event.calls, self.tokens, tuple(self.coll)))
        self.tokens, self.coll = 0, []


def _group_ranks(group) -> tuple[int, ...]:
    if group is None:
        return tuple(range(dist.get_world_size()))
    return tuple(sorted(dist.get_process_group_ranks(group)))


def _kind(group, merge_kind: str, other_kind: str) -> str:
    merge_groups = set(map(id, merge_rt._GROUPS.values()))
    return merge_kind if id(group) in merge_groups else other_kind


def record(model, payload, fsdp: bool) -> tuple[list[Pack], list]:
    """Run ``payload`` and return (per pack: calls, tokens, collectives; collectives after
    the last pack)."""
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
        if t.is_floating_point():
            rec.coll.append(
                (
                    _kind(group, "merge_kv_all_gather", "fsdp_all_gather"),
                    _group_ranks(group),
                    sum(p.numel() * p.element_size() for p in parts),
                )
            )
        return saved["all_gather"](parts, t, group=group, **kw)

    def all_gather_into_tensor(out, t, group=None, **kw):
        log(_kind(group, "merge_kv_all_gather", "fsdp_all_gather"), group, out)
        return saved["all_gather_into_tensor"](out, t, group=group, **kw)

    def reduce_scatter_tensor(out, t, op=dist.ReduceOp.SUM, group=None, **kw):
        log(_kind(group, "merge_kv_reduce_scatter", "fsdp_reduce_scatter"), group, t)
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
            model, payload, forward=forward, reduce_grads=None if fsdp else True, callbacks=[rec]
        )
    finally:
        for n, f in saved.items():
            setattr(dist, n, f)
    return rec.packs, rec.coll


def expected(plan, rank: int, model: torch.nn.Module, fsdp: bool) -> tuple[list[Pack], list]:
    """The same, read off the execution model's program of ``rank``."""
    n_params = sum(p.numel() for p in model.parameters())
    cost = dataclasses.replace(CostModel.analytic(TINY, "h100", "none"), param_count=n_params)
    config = ExecutionConfig(parallelism="fsdp" if fsdp else "ddp", grad_bytes=4)
    program = build_programs(plan, cost, config)[(rank, 0)]
    packs: list[Pack] = []
    pending: list[Collective] = []
    for op in program.ops:
        if isinstance(op, Collective):
            pending.append(op)
        elif isinstance(op, Compute):
            packs.append((op.pass_, op.pack, op.calls, _model_tokens(op), ()))
    # a pass's collectives belong to its pack; DDP's all-reduce ends the step
    by_pack: dict[tuple[str, int], list] = {}
    tail = []
    for op in pending:
        if op.pass_:
            by_pack.setdefault((op.pass_, op.pack), []).append((op.kind, op.group, round(op.bytes)))
        else:
            tail.append((op.kind, op.group, round(op.bytes)))
    packs = [(p, i, c, t, tuple(by_pack.get((p, i), ()))) for p, i, c, t, _ in packs]
    return packs, tail


def _model_tokens(op: Compute) -> int:
    """Tokens the model runs in a pass: a forward's (a padding pack: one dummy token per
    call); a recomputing backward re-runs its forward; other backwards run no model call."""
    if op.pass_ == "F" or op.recompute:
        return op.tokens if op.tokens else op.calls
    return 0


def _param_collectives_per_pass(packs: list[Pack]) -> list[Pack]:
    """FSDP2 issues one parameter collective per sharded unit (the model's wrapping) and
    pads shards; the program lists one per pass for the whole model: compare merge exchanges
    exactly and, per pass, which parameter collectives run over which group."""
    out = []
    for p, i, c, t, coll in packs:
        merge = tuple(x for x in coll if x[0].startswith("merge"))
        params = sorted({(x[0], x[1], 0) for x in coll if x[0].startswith("fsdp")})
        out.append((p, i, c, t, (*merge, *params)))
    return out


def runtime_vs_program(rank: int, world: int, seeds: list[int], named: list[str]) -> list:
    """Per case: (recorded, expected) for this rank. Free-mode cases run a bare module with
    ``reduce_grads=True`` (DDP's reduction); ``fsdp:`` cases run FSDP2 on a lockstep plan."""
    cases = [(f"seed{s}", *random_case(s, world)) for s in seeds]
    for name in named:
        if name.startswith("fsdp:"):
            toks, plan = FSDP_PLANS[name[5:]]()
        else:
            toks, plan = PLANS[name]()
            if not name.startswith("solver"):  # hand plans give lengths
                toks = doc_tokens(toks, seed=7)
        cases.append((name, toks, plan))
    cases.append(("fsdp:random", *random_case(seeds[0] + 100, world, mode="lockstep")))
    out = []
    for name, toks, plan in cases:
        fsdp = name.startswith("fsdp:")
        model = TinyLM(seed=1)
        want = expected(plan, rank, model, fsdp)
        if fsdp:
            model = _fully_shard(model, world)
        got = record(model, make_payload(plan, rank, toks), fsdp)
        if fsdp:
            got = (_param_collectives_per_pass(got[0]), got[1])
            want = (_param_collectives_per_pass(want[0]), want[1])
        out.append((name, got, want))
    return out
