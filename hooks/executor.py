"""The step executor: run one rank's share of a :class:`StepPlan` inside a training loop.

:func:`run_step` executes ``plan.ranks[rank].order``: forward packs in order, backward packs
in order, with slice continuation through a per-step :class:`KVStore`, the loss normalised by
the global loss-token count, and DP-Merge on the group's subgroup. It leaves the exact
gradient of the unpacked batch in ``param.grad`` (after the DP reduction) and returns a
:class:`StepSummary`; the optimizer step stays the caller's.

Backward packs. A backward pack that is exactly a union of forward packs runs ``backward``
through the graphs kept from those forward packs (latest first, so readers go before the
slices they read). Any other backward pack (asymmetric partitioning) runs one of two ways
(``asymmetric``): *split* (default outside FSDP) runs every forward pack as one call per
backward pack its slices go to, each keeping its graph, so every backward pack is a union
of calls (:func:`slimdata.plan.split_calls`); *recompute* re-runs the pack's forward from the
saved boundary states -- the token ids plus the keys/values of the document prefixes in the
store -- and runs backward through that, and forward packs feeding only such packs run
without a graph. Either way the backward of a slice receives, as the gradient of the
keys/values it produced, the sum accumulated in the store by every later reader.

Wrappers. Under ``DistributedDataParallel`` the executor calls the wrapped module directly
inside ``no_sync()`` (DDP's hooks assume one forward/backward per step) and then all-reduces
the gradients itself with SUM over DDP's process group -- the right reduction because every
rank's loss is already divided by the global loss-token count. A bare module on several
ranks gets the same reduction with ``reduce_grads=True``. Under FSDP2 (``fully_shard``) the
plan must be lockstep and every rank makes the same model calls (plan-global kept/recomputed
decisions, dummy calls for padding packs; :mod:`slimdata.hooks.fsdp`); FSDP reduce-scatters
the gradients with a plain SUM. Assumes a deterministic forward (dropout 0) and buffers
identical across ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from slimdata.hooks import fsdp as fsdp_rt
from slimdata.hooks.callbacks import Callback, PackEvent, StepSummary
from slimdata.hooks.continuation import PackContext
from slimdata.hooks.cp import CpRuntime, cp_runtime, plan_cp
from slimdata.hooks.hf import hf_hidden_forward, max_positions
from slimdata.hooks.kvstore import KVStore
from slimdata.hooks.launcher import die_with_launcher
from slimdata.hooks.loss import IGNORE, HiddenStates, packed_loss, slice_labels
from slimdata.hooks.merge import MergeRuntime, ensure_groups
from slimdata.hooks.payload import StepPayload
from slimdata.hooks.recompute import StepRecompute, resolve_policy, step_recompute
from torch import nn

from slimdata.errors import ConfigError
from slimdata.execution.cp import doc_slices
from slimdata.plan import MicroPack, RankPlan, RankStep, Slice
from slimdata.plan.schedule import SplitCalls, kept_forward_packs, split_calls

__all__ = ["ForwardFn", "hf_forward", "kept_forward_packs", "reduce_gradients", "run_step"]

ForwardFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], "torch.Tensor | HiddenStates"]
"""``forward(module, input_ids (T,), position_ids (T,)) -> logits (T, vocab)`` or
:class:`~slimdata.hooks.loss.HiddenStates` (the loss then never holds a whole pack's logits)."""


def hf_forward(
    module: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """Forward of a Hugging Face causal LM (batch of one packed row, doc-relative positions)."""
    return module(
        input_ids=input_ids[None], position_ids=position_ids[None], use_cache=False
    ).logits[0]


def reduce_gradients(params: Sequence[nn.Parameter], group=None) -> None:
    """SUM-all-reduce ``.grad`` of ``params`` (flattened per dtype/device, one call each).

    A parameter without ``.grad`` (an idle rank, a share that never reached it) gets zeros
    first, so every rank issues the same calls with the same sizes whatever its share.
    """
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]  # all of them, after the above
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        buckets.setdefault((g.dtype, g.device), []).append(g)
    for gs in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in gs])
        dist.all_reduce(flat, group=group)
        off = 0
        for g in gs:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()


class _Step:
    """State of one run_step call: the rank's schedule, its documents' tokens, the KV store."""

    def __init__(
        self,
        module,
        payload: StepPayload,
        forward: ForwardFn,
        backend: str,
        device,
        chunk=None,
        recompute: StepRecompute | None = None,
        cp: int = 1,
    ) -> None:
        self.module, self.forward, self.backend, self.device = module, forward, backend, device
        self.chunk: int | None = chunk
        self.recompute = recompute
        self.plan, self.rank = payload.view(), payload.rank
        self.rs = self.plan.ranks[self.rank]
        self.norm = self.plan.loss_tokens
        self.store = KVStore()
        self.cp: CpRuntime | None = cp_runtime(self.plan, self.rank, cp)
        self.merge: MergeRuntime | None = _merge_runtime(self.plan, self.rank, self.cp)
        toks, masks = _slice_tensors(payload)
        # merged documents are laid out by the merge group (gathered below), not by this rank
        self.doc_slices = doc_slices(self.rs, self.merge.docs if self.merge else set())
        self.doc_tokens = _join_slices(toks, self.doc_slices, device)
        self.doc_masks = None if masks is None else _join_slices(masks, self.doc_slices, device)
        if self.merge is not None:
            self._gather_merged_docs(self.merge, toks, masks)

    def _gather_merged_docs(
        self,
        merge: MergeRuntime,
        toks: dict[Slice, torch.Tensor],
        masks: dict[Slice, torch.Tensor] | None,
    ) -> None:
        """Gather the merge group's documents from its members (token ids and loss masks, in
        one exchange)."""
        mine = merge.layout[self.rank]
        got, got_masks = merge.gather_documents(
            {s: toks[s].to(self.device) for s in mine},
            None if masks is None else {s: masks[s].to(self.device) for s in mine},
        )
        self.doc_tokens.update(got)
        if got_masks is not None and self.doc_masks is not None:
            self.doc_masks.update(got_masks)

    def run_pack(self, pack: MicroPack, mode: str) -> tuple[torch.Tensor, PackContext]:
        sl = pack.slices
        # token ranges this process runs: whole slices, or its chunks of them under static CP
        rows = self.cp.local(sl) if self.cp is not None else [(s, s.start, s.end) for s in sl]
        if not rows:  # a CP member's empty share: one padding token, no label (hooks.cp)
            ids = pos = torch.zeros(1, dtype=torch.long, device=self.device)
            labels = torch.full((1,), IGNORE, dtype=torch.long, device=self.device)
        else:
            ids = torch.cat([self.doc_tokens[s.doc][a:b] for s, a, b in rows])
            pos = torch.cat([torch.arange(a, b, device=self.device) for _s, a, b in rows])
            labels = torch.cat(
                [
                    slice_labels(
                        self.doc_tokens[s.doc],
                        a,
                        b,
                        None if self.doc_masks is None else self.doc_masks[s.doc],
                    )
                    for s, a, b in rows
                ]
            )
        ctx = PackContext(
            sl,
            self.doc_slices,
            self.store,
            mode=mode,
            backend=self.backend,
            merge=self.merge if pack.merge is not None else None,
            cp=self.cp,
        )
        with ctx, torch.set_grad_enabled(mode != "nograd"):
            logits = self.forward(self.module, ids, pos)
            loss = packed_loss(logits, labels, self.norm, self.chunk)
        rc = self.recompute
        if rc is not None and rc.policy != "none" and mode != "nograd" and not rc.calls:
            raise ConfigError(_NOTHING_RECOMPUTED[rc.policy])
        return loss, ctx

    def dummy(self, grad: bool) -> tuple[torch.Tensor, None]:
        """A padding pack's call under FSDP (:func:`~slimdata.hooks.fsdp.dummy_loss`)."""
        with torch.set_grad_enabled(grad):
            return fsdp_rt.dummy_loss(self.module, self.forward, self.device), None

    def backward(self, loss: torch.Tensor, ctx: PackContext | None) -> None:
        outs, grads = [loss], [torch.ones_like(loss)]
        for (layer, s), (k, v) in ctx.live.items() if ctx is not None else ():
            gk, gv = self.store.grad(layer, s)
            if gk is not None:
                outs.append(k)
                grads.append(gk)
            if gv is not None:
                outs.append(v)
                grads.append(gv)
        torch.autograd.backward(outs, grads)


def _merge_runtime(plan: RankPlan, rank: int, cp: CpRuntime | None) -> MergeRuntime | None:
    """The DP-Merge runtime of ``rank``'s merge group (under static CP: of this process),
    or None outside any group."""
    if not plan.merges:
        return None
    k = 1 if cp is None else cp.cp
    ensure_groups(plan, k)
    g = plan.merge_of_rank(rank)
    if g is None:
        return None
    return MergeRuntime(plan, rank, g, cp=k, process=None if cp is None else rank * k + cp.member)


def _slice_tensors(
    payload: StepPayload,
) -> tuple[dict[Slice, torch.Tensor], dict[Slice, torch.Tensor] | None]:
    """The payload's tokens and loss masks (None: no mask) per slice, as int64 CPU tensors."""
    toks = {
        s: torch.as_tensor(np.asarray(t, dtype=np.int64)) for s, t in payload.slice_tokens().items()
    }
    masks_np = payload.slice_mask()
    masks = (
        None
        if masks_np is None
        else {s: torch.as_tensor(np.asarray(m, dtype=np.int64)) for s, m in masks_np.items()}
    )
    return toks, masks


def _join_slices(
    per_slice: dict[Slice, torch.Tensor], doc_slices: dict[int, list[Slice]], device
) -> dict[int, torch.Tensor]:
    """Each document's slices' tensors concatenated in order, on ``device``."""
    return {d: torch.cat([per_slice[s] for s in sl]).to(device) for d, sl in doc_slices.items()}


_NOTHING_RECOMPUTED = {
    "full": "recompute='full' but the pack's forward checkpointed no decoder layer: name the "
    "model's layers with slimdata.hooks.checkpoint_layers(model, layers), or run each "
    "layer body through slimdata.hooks.recompute_layer (see docs/hooks.md)",
    "selective": "recompute='selective' but the pack's forward recomputed no norm and no MLP: "
    "the model has no torch.nn.RMSNorm/LayerNorm or *RMSNorm module and no Llama-style MLP "
    "(gate_proj, up_proj, down_proj, act_fn); call slimdata.hooks.selective_norm and "
    "slimdata.hooks.swiglu_down in its forward (see docs/hooks.md), or plan with another policy",
}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class _Options:
    """run_step's arguments, validated, with their defaults resolved."""

    ddp: bool
    """``model`` is a ``DistributedDataParallel`` wrapper."""
    fsdp_kind: str | None
    """``"fsdp2"``, ``"fsdp1"`` or None (:func:`slimdata.hooks.fsdp.fsdp_kind`)."""
    module: nn.Module
    """The module the packs run on (DDP's wrapped module, else ``model``)."""
    device: torch.device
    """The device of the module's parameters."""
    forward: ForwardFn
    """The forward function run on every pack."""
    policy: str
    """The activation recompute policy."""
    reduce_grads: bool
    """SUM-all-reduce the gradients over ``group`` after the packs."""
    group: Any
    """The process group of the gradient reduction (None: the world)."""
    fsdp_grad_sync: str
    """``"each"`` or ``"last"``: when FSDP reduce-scatters."""
    asymmetric: str
    """``"split"`` or ``"recompute"``: how a non-union backward pack runs outside FSDP."""

    @property
    def fsdp(self) -> bool:
        """``model`` is FSDP-wrapped (FSDP2 or FSDP1)."""
        return self.fsdp_kind is not None


def _resolve_options(
    model: nn.Module,
    payload: StepPayload,
    forward: ForwardFn | None,
    reduce_grads: bool | None,
    group,
    fsdp_grad_sync: str,
    asymmetric: str,
    recompute: str | None,
) -> _Options:
    """Validate run_step's arguments against the model's wrapper; fill in the defaults."""
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    kind = fsdp_rt.fsdp_kind(model)
    module: nn.Module = model.module if ddp else model  # type: ignore[assignment]
    _check_arguments(kind, fsdp_grad_sync, asymmetric, reduce_grads)
    if ddp and group is None:
        group = model.process_group
    device = next(module.parameters()).device
    if forward is None:
        forward = hf_forward if kind is not None else hf_hidden_forward
    _check_vocabulary(module, payload)
    _check_positions(module, payload)
    policy = resolve_policy(recompute, payload.plan)
    _check_fsdp_recompute(kind, module, policy)
    return _Options(
        ddp=ddp,
        fsdp_kind=kind,
        module=module,
        device=device,
        forward=forward,
        policy=policy,
        reduce_grads=ddp if reduce_grads is None else reduce_grads,
        group=group,
        fsdp_grad_sync=fsdp_grad_sync,
        asymmetric=asymmetric,
    )


def _input_rows(module: nn.Module) -> int | None:
    """Rows of the model's input embeddings (Hugging Face ``get_input_embeddings``), or None
    for a model that does not say (a custom model's tokens are not checked)."""
    get = getattr(module, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except NotImplementedError:
        return None
    rows = getattr(emb, "num_embeddings", None)
    return rows if isinstance(rows, int) else None


def _check_vocabulary(module: nn.Module, payload: StepPayload) -> None:
    """Every token id of the payload names a row of the model's input embeddings: tokens of
    another tokenizer (plan shards or shards of another build) fail here, before any pack,
    instead of inside the embedding lookup."""
    rows = _input_rows(module)
    if rows is None or len(payload.tokens) == 0:
        return
    top = int(payload.tokens.max())
    if top >= rows:
        raise ConfigError(
            f"step {payload.plan.step} rank {payload.rank}: token id {top} is outside the "
            f"model's vocabulary of {rows} input embeddings: the tokens come from a tokenizer "
            "with more ids (plan shards or shards of another build?); build the model with "
            "the vocabulary of the build that wrote them (tokenizer.vocab_size in its "
            "slimdata.json)"
        )


def _check_positions(module: nn.Module, payload: StepPayload) -> None:
    """Every slice of the payload ends within the model's positions: a plan solved for a
    longer context than the model's (``slimdata plan --context 8192`` for a model of 4,096
    positions) fails here, before any pack, instead of training positions the model does
    not have (RoPE: silently; learned positions: inside the embedding lookup)."""
    limit = max_positions(module)
    if limit is None:
        return
    plan = payload.plan  # a StepPlan or this rank's view: both index ranks and docs so
    ends = [(s.end, s.doc) for s in plan.ranks[payload.rank].slices()]
    if not ends or max(ends)[0] <= limit:
        return
    end, doc = max(ends)
    raise ConfigError(
        f"step {plan.step} rank {payload.rank}: document {plan.docs[doc].doc_id!r} reaches "
        f"position {end - 1}, beyond the model's {limit} positions "
        "(config.max_position_embeddings): the plan was solved for a longer context than the "
        f"model's; plan with --context {limit} (Layout(context={limit})), or train a model "
        "of the plan's context"
    )


def _check_processes(opts: _Options, payload: StepPayload, cp: int) -> None:
    """The processes that sum the gradients (DDP's process group, or ``group``/the world under
    ``reduce_grads``) are the plan's ``dp * cp``, and this one is in the CP group of its
    payload's DP rank: a plan for another world size (or a rank's payload on another rank)
    would otherwise train on part of the batch, or fail inside a collective."""
    if not (opts.reduce_grads and dist.is_initialized()):
        return
    size, me = dist.get_world_size(opts.group), dist.get_rank(opts.group)
    dp, want = payload.plan.dp, payload.plan.dp * cp
    if size != want:
        raise ConfigError(
            f"step {payload.plan.step}: the plan is for {want} processes ({dp} DP ranks x "
            f"cp={cp}) but the gradients are summed over {size}: launch {want} processes, or "
            f"plan for {size} (`slimdata plan --nodes/--ranks-per-node`, Layout(dp=...))"
        )
    if me // cp != payload.rank:
        raise ConfigError(
            f"step {payload.plan.step}: process {me} runs DP rank {me // cp} of the plan but "
            f"got the payload of DP rank {payload.rank}: hand process r the payload of DP rank "
            f"r // {cp} (PlanShardLoader(rank=r), DocumentLoader(rank=r // {cp}))"
        )


def _check_arguments(
    kind: str | None, fsdp_grad_sync: str, asymmetric: str, reduce_grads: bool | None
) -> None:
    """Reject option values outside their choices or that the model's wrapper cannot run."""
    if fsdp_grad_sync not in ("each", "last"):
        raise ConfigError(f"fsdp_grad_sync={fsdp_grad_sync!r}: use 'each' or 'last'")
    if kind == "fsdp1" and fsdp_grad_sync == "last":
        raise ConfigError("fsdp_grad_sync='last' needs FSDP2 (fully_shard); FSDP1 supports 'each'")
    if asymmetric not in ("split", "recompute"):
        raise ConfigError(f"asymmetric={asymmetric!r}: use 'split' or 'recompute'")
    if kind is not None and reduce_grads:
        raise ConfigError("reduce_grads=True with an FSDP model: FSDP reduces the gradients itself")


def _check_fsdp_recompute(kind: str | None, module: nn.Module, policy: str) -> None:
    """Reject activation recompute (the policy's or the model's own checkpointing) under FSDP."""
    if kind is not None and (
        policy != "none" or getattr(module, "is_gradient_checkpointing", False)
    ):
        # a recomputation runs module forwards again inside the backward, on parameters FSDP
        # resharded after the forward and re-gathers only through its own module hooks: the
        # collectives would no longer be the lockstep schedule's (design §9), untested here
        raise ConfigError(
            f"recompute={policy!r} (gradient checkpointing) under FSDP is not supported by "
            "run_step: plan and run with recompute='none' under FSDP (LoaderConfig(recompute="
            "'none'), run_step(recompute='none')), or use DDP / a bare module with 'full' or "
            "'selective'"
        )


_GraphKey = tuple[int, int]
"""A kept graph: ``(forward pack, backward pack)``, or ``(forward pack, -1)`` for a whole pack."""


@dataclass(frozen=True)
class _Calls:
    """The model calls of every pack of one rank's schedule."""

    forward: list[list[tuple[_GraphKey, MicroPack, bool]]]
    """Per forward pack, its calls in run order: (graph key, slices to run, keep the graph?)."""
    backward: list[list[_GraphKey] | None]
    """Per backward pack, the graphs to run backward through (latest first), or None:
    recompute the pack."""
    kept: set[int]
    """The forward packs that keep their graph (the others run without one)."""
    idle_forward: frozenset[int] = frozenset()
    """Forward packs empty on every rank under FSDP: no call at all (no call to match)."""
    idle_backward: frozenset[int] = frozenset()
    """Backward packs empty on every rank under FSDP: no call at all."""

    def backward_calls(self) -> int:
        """How many backward calls the rank makes (FSDP's ``"last"`` sync counts them)."""
        return sum(
            1 if (keys := self.backward[j]) is None else len(keys)
            for j in range(len(self.backward))
            if j not in self.idle_backward
        )


def _pack_calls(payload: StepPayload, rs: RankStep, opts: _Options) -> _Calls:
    """The rank's calls: FSDP's plan-global lockstep rules, else the rank's own kept/union
    forward packs, with forward packs split by backward pack under ``asymmetric="split"``."""
    if opts.fsdp:
        return _lockstep_calls(payload, rs, keep=opts.fsdp_kind == "fsdp2")
    kept, unions = kept_forward_packs(rs.forward, rs.backward)
    sc = split_calls(rs.forward, rs.backward) if opts.asymmetric == "split" else None
    if sc is None:  # recompute, or a merge pack that must stay one call
        return _whole_pack_calls(rs, kept, unions)
    return _split_pack_calls(rs, sc)


def _lockstep_calls(payload: StepPayload, rs: RankStep, keep: bool) -> _Calls:
    """Calls from FSDP's lockstep schedule, the same on every rank."""
    # from the whole plan when the payload has it, else the schedule the view carries
    fsdp_rt.check_lockstep(payload.plan)
    sched = fsdp_rt.lockstep_schedule(payload.plan, keep=keep)
    unions = {j: list(f) for j, f in sched.unions.items()}
    calls = _whole_pack_calls(rs, set(sched.kept), unions)
    return replace(calls, idle_forward=sched.idle_forward, idle_backward=sched.idle_backward)


def _whole_pack_calls(rs: RankStep, kept: set[int], unions: dict[int, list[int]]) -> _Calls:
    """One call per forward pack; a union backward pack runs through its forward packs'
    graphs, latest first, any other is recomputed."""
    return _Calls(
        forward=[[((i, -1), p, i in kept)] for i, p in enumerate(rs.forward)],
        backward=[
            [(f, -1) for f in reversed(unions[j])] if j in unions else None
            for j in range(len(rs.backward))
        ],
        kept=kept,
    )


def _split_pack_calls(rs: RankStep, sc: SplitCalls) -> _Calls:
    """One call per (forward pack, backward pack) share, every call keeping its graph."""
    return _Calls(
        forward=[
            [((i, j), MicroPack(sl, merge=rs.forward[i].merge), True) for j, sl in calls]
            for i, calls in enumerate(sc.forward)
        ],
        backward=[[(i, j) for i in fs] for j, fs in enumerate(sc.backward)],
        kept=set(range(len(rs.forward))),
    )


class _PackRunner:
    """Runs one rank's packs in the schedule's order, holding the graphs kept in between."""

    def __init__(
        self,
        st: _Step,
        calls: _Calls,
        model: nn.Module,
        opts: _Options,
        callbacks: Sequence[Callback],
    ) -> None:
        self.st, self.calls, self.model, self.opts = st, calls, model, opts
        self.callbacks = callbacks
        self.graphs: dict[_GraphKey, tuple[torch.Tensor, PackContext | None]] = {}
        self.events: list[PackEvent] = []
        self.loss_total = 0.0
        self.n_calls, self.done_calls = calls.backward_calls(), 0

    def run(self) -> None:
        """Every pack of ``rs.order``; then check that every kept graph ran backward."""
        for pass_, i in self.st.rs.order:
            t0 = time.perf_counter()
            if pass_ == "F":
                self.forward_pack(i, t0)
            else:
                self.backward_pack(i, t0)
        if self.graphs or len(self.st.store):
            raise RuntimeError(
                f"step {self.st.plan.step} rank {self.st.rank}: packs {sorted(self.graphs)} "
                "never ran backward"
            )

    def forward_pack(self, i: int, t0: float) -> None:
        """Forward pack ``i``'s calls (a dummy call for an FSDP padding pack)."""
        st, calls = self.st, self.calls
        pack = st.rs.forward[i]
        n = 0
        if pack.slices:
            for key, sub, keep in calls.forward[i]:
                self._add(key if keep else None, *st.run_pack(sub, "keep" if keep else "nograd"))
            n = len(calls.forward[i])
        elif self.opts.fsdp and i not in calls.idle_forward:  # match the other ranks' call
            grad = i in calls.kept
            self._add((i, -1) if grad else None, *st.dummy(grad=grad))
            n = 1
        self._emit("F", i, pack, t0, i not in calls.kept, n)

    def backward_pack(self, i: int, t0: float) -> None:
        """Backward pack ``i``: through its kept graphs, or recomputed; then drop its slices'
        keys/values from the store."""
        st = self.st
        pack = st.rs.backward[i]
        keys = self.calls.backward[i]
        n = 0
        if i in self.calls.idle_backward or (not pack.slices and not self.opts.fsdp):
            pass  # no work, nothing to match
        elif keys is not None:
            for key in keys:
                self._backward(*self.graphs.pop(key))
            n = len(keys)
        else:
            self._backward(*(st.run_pack(pack, "recompute") if pack.slices else st.dummy(True)))
            n = 1
        for s in pack.slices:
            st.store.drop(s)
        self._emit("B", i, pack, t0, keys is None, n)

    def _add(self, key: _GraphKey | None, loss: torch.Tensor, ctx: PackContext | None) -> None:
        """Count a forward call's loss; keep its graph under ``key`` (None: no graph)."""
        self.loss_total += float(loss.detach())
        if key is not None:
            self.graphs[key] = (loss, ctx)

    def _backward(self, loss: torch.Tensor, ctx: PackContext | None) -> None:
        """One backward call; under ``fsdp_grad_sync="last"`` FSDP syncs on the last only."""
        if self.opts.fsdp and self.opts.fsdp_grad_sync == "last":
            fsdp_rt.set_gradient_sync(self.model, self.done_calls == self.n_calls - 1)
        self.st.backward(loss, ctx)
        self.done_calls += 1

    def _emit(
        self, pass_: str, i: int, pack: MicroPack, t0: float, recomputed: bool, calls: int
    ) -> None:
        """Record the pack's :class:`PackEvent` (after the device is done) and report it."""
        _sync(self.opts.device)
        ev = PackEvent(
            self.st.plan.step,
            self.st.rank,
            pass_,
            i,
            time.perf_counter() - t0,
            pack.tokens,
            pack.cost,
            recomputed,
            calls,
        )
        self.events.append(ev)
        for cb in self.callbacks:
            cb.on_pack_end(ev)


def run_step(
    model: nn.Module,
    payload: StepPayload,
    *,
    forward: ForwardFn | None = None,
    backend: str = "auto",
    callbacks: Sequence[Callback] = (),
    reduce_grads: bool | None = None,
    group=None,
    fsdp_grad_sync: str = "each",
    asymmetric: str = "split",
    loss_chunk_tokens: int | None = None,
    recompute: str | None = None,
    cp: int | None = None,
) -> StepSummary:
    """Run ``payload.rank``'s forward and backward packs of ``payload.plan``; accumulate grads.

    ``model`` may be wrapped in ``DistributedDataParallel`` (gradients are then SUM-reduced over
    its process group); ``reduce_grads=True`` reduces a bare module's gradients over ``group``
    (default: the world). Every rank of a merge group must call this for the same plan.

    ``model`` may be an FSDP2 module (``fully_shard``): the plan must be lockstep, FSDP's
    reduce-scatter is switched to SUM (``set_gradient_divide_factor(1.0)``), and the sharded
    ``param.grad`` hold the exact gradient afterwards. An FSDP1 ``FullyShardedDataParallel``
    wrapper works the same way with every backward pack recomputed and a SUM comm hook. ``fsdp_grad_sync="each"`` reduce-scatters
    after every backward call (FSDP's default, sharded accumulation); ``"last"`` turns gradient
    sync off until the step's last backward call (one reduce-scatter per step, unsharded
    gradients held meanwhile) and leaves it on afterwards.

    ``asymmetric``: how a backward pack that is not a union of forward packs runs outside FSDP.
    ``"split"`` (default) runs each forward pack as one call per backward pack its slices go
    to, every call keeping its graph (:func:`slimdata.plan.split_calls`: more, smaller calls,
    no extra compute, activations held as the solver's memory rule assumes); ``"recompute"``
    runs such forward packs without a graph and recomputes them in their backward packs (one
    extra forward, less memory held). FSDP always uses the plan-global recompute rules (every
    rank must make the same calls).

    ``forward`` (default: :func:`hf_hidden_forward`, or :func:`hf_forward` under FSDP, whose
    wrappers own the LM head's parameters) runs the model on one pack; the loss is computed in
    chunks of ``loss_chunk_tokens`` tokens (default: :func:`slimdata.cost.loss_chunk_tokens`
    for the model's vocabulary), so no pack holds all its logits (:mod:`slimdata.hooks.loss`).

    ``recompute``: the activation recompute policy, ``"none"``, ``"selective"`` (norms and the
    SwiGLU product recomputed: :mod:`slimdata.hooks.selective`) or ``"full"`` (every decoder
    layer checkpointed, recomputed inside its pack in the backward:
    :mod:`slimdata.hooks.recompute`); default: the policy of the cost model the plan was solved
    with (``plan.meta["recompute"]``), else ``"none"``. Under FSDP only ``"none"`` runs
    (:class:`~slimdata.errors.ConfigError` otherwise).

    ``cp``: static context parallelism (default: ``plan.meta["cp"]``, else 1): this process is
    a member of its DP rank's group of ``cp`` processes, runs load-balanced chunks of every
    slice and exchanges keys/values per layer with the group (:mod:`slimdata.hooks.cp`).
    """
    # long only by its docstring (one paragraph per option); the body is the step's stages
    t_step = time.perf_counter()
    die_with_launcher()  # a killed torchrun leaves no rank behind
    opts = _resolve_options(
        model, payload, forward, reduce_grads, group, fsdp_grad_sync, asymmetric, recompute
    )
    cp = plan_cp(payload.plan, cp)
    _check_processes(opts, payload, cp)
    with step_recompute(opts.module, opts.policy) as rc:
        st = _Step(
            opts.module,
            payload,
            opts.forward,
            backend,
            opts.device,
            loss_chunk_tokens,
            rc,
            cp,
        )
        for cb in callbacks:
            cb.on_step_start(st.plan, st.rank)
        calls = _pack_calls(payload, st.rs, opts)
        if opts.fsdp:
            fsdp_rt.prepare(model)
        runner = _PackRunner(st, calls, model, opts, callbacks)
        with model.no_sync() if opts.ddp else _null():  # type: ignore[operator]
            runner.run()
        if opts.reduce_grads and dist.is_initialized() and dist.get_world_size(opts.group) > 1:
            reduce_gradients([p for p in opts.module.parameters() if p.requires_grad], opts.group)
        summary = _summary(st, runner, t_step)
        for cb in callbacks:
            cb.on_step_end(summary)
        return summary


def _summary(st: _Step, runner: _PackRunner, t_step: float) -> StepSummary:
    """The step's summary: loss, tokens, wall time since ``t_step`` and the pack events."""
    return StepSummary(
        step=st.plan.step,
        rank=st.rank,
        loss=runner.loss_total,
        tokens=st.rs.tokens,
        seconds=time.perf_counter() - t_step,
        busy_seconds=sum(e.seconds for e in runner.events),
        events=tuple(runner.events),
    )


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
