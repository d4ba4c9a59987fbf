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

import numpy as np
import torch
import torch.distributed as dist
from slimdata.hooks import fsdp as fsdp_rt
from slimdata.hooks.callbacks import Callback, PackEvent, StepSummary
from slimdata.hooks.continuation import PackContext
from slimdata.hooks.hf import hf_hidden_forward
from slimdata.hooks.kvstore import KVStore
from slimdata.hooks.loss import HiddenStates, packed_loss, slice_labels
from slimdata.hooks.merge import MergeRuntime, ensure_groups
from slimdata.hooks.payload import StepPayload
from slimdata.hooks.recompute import StepRecompute, resolve_policy, step_recompute
from torch import nn

from slimdata.errors import ConfigError
from slimdata.plan import MicroPack, Slice
from slimdata.plan.schedule import kept_forward_packs, split_calls

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
    """State of one run_step call."""

    def __init__(
        self,
        module,
        payload: StepPayload,
        forward: ForwardFn,
        backend: str,
        device,
        chunk=None,
        recompute: StepRecompute | None = None,
    ) -> None:
        self.module, self.forward, self.backend, self.device = module, forward, backend, device
        self.chunk: int | None = chunk
        self.recompute = recompute
        self.plan, self.rank = payload.view(), payload.rank
        self.rs = self.plan.ranks[self.rank]
        self.norm = self.plan.loss_tokens
        self.store = KVStore()
        self.merge: MergeRuntime | None = None
        if self.plan.merges:
            ensure_groups(self.plan)
            g = self.plan.merge_of_rank(self.rank)
            if g is not None:
                self.merge = MergeRuntime(self.plan, self.rank, g)
        toks = {
            s: torch.as_tensor(np.asarray(t, dtype=np.int64))
            for s, t in payload.slice_tokens().items()
        }
        masks_np = payload.slice_mask()
        masks = (
            None
            if masks_np is None
            else {s: torch.as_tensor(np.asarray(m, dtype=np.int64)) for s, m in masks_np.items()}
        )
        merged_docs = self.merge.docs if self.merge else set()
        self.doc_slices: dict[int, list[Slice]] = {}
        for s in self.rs.slices():
            if s.doc not in merged_docs:
                self.doc_slices.setdefault(s.doc, []).append(s)
        for sl in self.doc_slices.values():
            sl.sort(key=lambda s: s.start)
        self.doc_tokens = {
            d: torch.cat([toks[s] for s in sl]).to(device) for d, sl in self.doc_slices.items()
        }
        self.doc_masks = (
            None
            if masks is None
            else {
                d: torch.cat([masks[s] for s in sl]).to(device) for d, sl in self.doc_slices.items()
            }
        )
        if self.merge is not None:
            mine = {s: toks[s] for s in self.merge.layout[self.rank]}
            self.doc_tokens.update(
                {
                    d: t.to(device)
                    for d, t in self.merge.gather_tokens(
                        {s: t.to(device) for s, t in mine.items()}
                    ).items()
                }
            )
            if masks is not None and self.doc_masks is not None:
                got = self.merge.gather_tokens(
                    {s: masks[s].to(device) for s in self.merge.layout[self.rank]}
                )
                self.doc_masks.update(got)

    def run_pack(self, pack: MicroPack, mode: str) -> tuple[torch.Tensor, PackContext]:
        sl = pack.slices
        ids = torch.cat([self.doc_tokens[s.doc][s.start : s.end] for s in sl])
        pos = torch.cat([torch.arange(s.start, s.end, device=self.device) for s in sl])
        labels = torch.cat(
            [
                slice_labels(
                    self.doc_tokens[s.doc],
                    s.start,
                    s.end,
                    None if self.doc_masks is None else self.doc_masks[s.doc],
                )
                for s in sl
            ]
        )
        ctx = PackContext(
            sl,
            self.doc_slices,
            self.store,
            mode=mode,
            backend=self.backend,
            merge=self.merge if pack.merge is not None else None,
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
    """
    t_step = time.perf_counter()
    ddp = isinstance(model, nn.parallel.DistributedDataParallel)
    kind = fsdp_rt.fsdp_kind(model)
    fsdp = kind is not None
    module: nn.Module = model.module if ddp else model  # type: ignore[assignment]
    if fsdp_grad_sync not in ("each", "last"):
        raise ValueError(f"fsdp_grad_sync={fsdp_grad_sync!r}: use 'each' or 'last'")
    if kind == "fsdp1" and fsdp_grad_sync == "last":
        raise ValueError("fsdp_grad_sync='last' needs FSDP2 (fully_shard); FSDP1 supports 'each'")
    if asymmetric not in ("split", "recompute"):
        raise ValueError(f"asymmetric={asymmetric!r}: use 'split' or 'recompute'")
    if fsdp and reduce_grads:
        raise ValueError("reduce_grads=True with an FSDP model: FSDP reduces the gradients itself")
    if reduce_grads is None:
        reduce_grads = ddp
    if ddp and group is None:
        group = model.process_group
    device = next(module.parameters()).device
    if forward is None:
        forward = hf_forward if fsdp else hf_hidden_forward
    policy = resolve_policy(recompute, payload.plan)
    if fsdp and (policy != "none" or getattr(module, "is_gradient_checkpointing", False)):
        # a recomputation runs module forwards again inside the backward, on parameters FSDP
        # resharded after the forward and re-gathers only through its own module hooks: the
        # collectives would no longer be the lockstep schedule's (design §9), untested here
        raise ConfigError(
            f"recompute={policy!r} (gradient checkpointing) under FSDP is not supported by "
            "run_step: plan and run with recompute='none' under FSDP (LoaderConfig(recompute="
            "'none'), run_step(recompute='none')), or use DDP / a bare module with 'full' or "
            "'selective'"
        )
    with step_recompute(module, policy) as rc:
        st = _Step(module, payload, forward, backend, device, loss_chunk_tokens, rc)
        plan, rs = st.plan, st.rs
        for cb in callbacks:
            cb.on_step_start(plan, st.rank)
        idle_f: frozenset[int] = frozenset()
        idle_b: frozenset[int] = frozenset()
        if fsdp:
            # from the whole plan when the payload has it, else the schedule the view carries
            fsdp_rt.check_lockstep(payload.plan)
            sched = fsdp_rt.lockstep_schedule(payload.plan, keep=kind == "fsdp2")
            kept, unions = set(sched.kept), {j: list(f) for j, f in sched.unions.items()}
            idle_f, idle_b = sched.idle_forward, sched.idle_backward
            fsdp_rt.prepare(model)
        else:
            kept, unions = kept_forward_packs(rs.forward, rs.backward)
        # the calls of every pack: forward pack i -> (graph key, slices, keep graph?); backward
        # pack j -> graph keys to run backward through, or None: recompute pack j
        # (graph keys: (forward pack, backward pack), or (forward pack, -1) for a whole pack)
        fcalls: list[list[tuple[tuple[int, int], MicroPack, bool]]] = [
            [((i, -1), p, i in kept)] for i, p in enumerate(rs.forward)
        ]
        bcalls: list[list[tuple[int, int]] | None] = [
            [(f, -1) for f in reversed(unions[j])] if j in unions else None
            for j in range(len(rs.backward))
        ]
        sc = split_calls(rs.forward, rs.backward) if not fsdp and asymmetric == "split" else None
        if sc is not None:
            fcalls = [
                [((i, j), MicroPack(sl, merge=rs.forward[i].merge), True) for j, sl in calls]
                for i, calls in enumerate(sc.forward)
            ]
            bcalls = [[(i, j) for i in fs] for j, fs in enumerate(sc.backward)]
            kept = set(range(len(rs.forward)))
        calls = [
            1 if (keys := bcalls[j]) is None else len(keys)
            for j in range(len(rs.backward))
            if j not in idle_b
        ]
        n_calls, done_calls = sum(calls), 0
        graphs: dict[tuple[int, int], tuple[torch.Tensor, PackContext | None]] = {}
        events: list[PackEvent] = []
        loss_total = 0.0

        def emit(
            pass_: str, i: int, pack: MicroPack, t0: float, recomputed: bool, calls: int
        ) -> None:
            _sync(device)
            ev = PackEvent(
                plan.step,
                st.rank,
                pass_,
                i,
                time.perf_counter() - t0,
                pack.tokens,
                pack.cost,
                recomputed,
                calls,
            )
            events.append(ev)
            for cb in callbacks:
                cb.on_pack_end(ev)

        def backward(loss: torch.Tensor, ctx: PackContext | None) -> None:
            nonlocal done_calls
            if fsdp and fsdp_grad_sync == "last":
                fsdp_rt.set_gradient_sync(model, done_calls == n_calls - 1)
            st.backward(loss, ctx)
            done_calls += 1

        with model.no_sync() if ddp else _null():  # type: ignore[operator]
            for kind, i in rs.order:
                t0 = time.perf_counter()
                if kind == "F":
                    pack = rs.forward[i]
                    n = 0
                    if pack.slices:
                        for key, sub, keep in fcalls[i]:
                            loss, ctx = st.run_pack(sub, "keep" if keep else "nograd")
                            loss_total += float(loss.detach())
                            if keep:
                                graphs[key] = (loss, ctx)
                        n = len(fcalls[i])
                    elif fsdp and i not in idle_f:  # a padding pack: match the other ranks' call
                        loss, ctx = st.dummy(grad=i in kept)
                        loss_total += float(loss.detach())
                        if i in kept:
                            graphs[(i, -1)] = (loss, ctx)
                        n = 1
                    emit("F", i, pack, t0, i not in kept, n)
                else:
                    pack = rs.backward[i]
                    keys = bcalls[i]
                    n = 0
                    if i in idle_b or (not pack.slices and not fsdp):
                        pass  # no work, nothing to match
                    elif keys is not None:
                        for key in keys:
                            backward(*graphs.pop(key))
                        n = len(keys)
                    else:
                        backward(
                            *(st.run_pack(pack, "recompute") if pack.slices else st.dummy(True))
                        )
                        n = 1
                    for s in pack.slices:
                        st.store.drop(s)
                    emit("B", i, pack, t0, keys is None, n)
            if graphs or len(st.store):
                raise RuntimeError(
                    f"step {plan.step} rank {st.rank}: packs {sorted(graphs)} never ran backward"
                )
        if reduce_grads and dist.is_initialized() and dist.get_world_size(group) > 1:
            reduce_gradients([p for p in module.parameters() if p.requires_grad], group)
        summary = StepSummary(
            step=plan.step,
            rank=st.rank,
            loss=loss_total,
            tokens=rs.tokens,
            seconds=time.perf_counter() - t_step,
            busy_seconds=sum(e.seconds for e in events),
            events=tuple(events),
        )
        for cb in callbacks:
            cb.on_step_end(summary)
        return summary


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
