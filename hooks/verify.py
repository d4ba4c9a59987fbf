"""Check that packing leaves the math unchanged on your model, device and dtype.

A plan's gradients must equal those of the unpacked batch. In fp32 they match to about 1e-6;
in bf16 every change of summation order (another pack size, another kernel tile) moves them
by a few units of bf16 rounding, so a packed run is judged against the *noise floor*: the
difference between two unpacked references that differ only in how whole documents are
grouped into packs. :func:`equivalence_report` measures both::

    from slimdata.hooks.verify import equivalence_report
    rep = equivalence_report(model, plan, tokens)   # plan: any solver plan of these docs
    rep["packed"]["grad"] <= 4 * rep["noise"]["grad"]

All ranks of a plan run in sequence in this process (their gradients add up, which is the
SUM reduction of data parallelism), so a DP plan is checked on one device. Plans with
DP-Merge groups need their ranks in separate processes and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from slimdata.hooks.executor import ForwardFn, run_step
from slimdata.hooks.payload import make_payload
from torch import nn

from slimdata.errors import ConfigError, PlanError
from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan

__all__ = ["equivalence_report", "grad_error", "run_plan", "whole_document_plan"]


def whole_document_plan(docs: Sequence[Document], per_pack: int = 1, reverse: bool = False):
    """One rank, every document one slice, ``per_pack`` documents per pack (in document order,
    or reversed): the unpacked batch as the executor runs it. ``per_pack=1`` is the reference;
    another grouping of the same documents measures the noise of the summation order."""
    ids = list(range(len(docs)))[:: -1 if reverse else 1]
    groups = [ids[i : i + per_pack] for i in range(0, len(ids), per_pack)]
    packs = tuple(MicroPack(tuple(Slice(d, 0, docs[d].length) for d in g)) for g in groups)
    rank = RankStep(rank=0, forward=packs, backward=packs[::-1])
    return StepPlan(step=0, strategy="unpacked", docs=tuple(docs), ranks=(rank,)).validate()


def run_plan(
    model: nn.Module,
    plan: StepPlan,
    tokens: Sequence[np.ndarray],
    *,
    forward: ForwardFn | None = None,
    backend: str = "auto",
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of ``plan`` with every rank's share run in sequence (grads summed)."""
    if plan.merges:
        raise PlanError("a plan with DP-Merge groups needs one process per rank; use run_step")
    model.zero_grad(set_to_none=True)
    loss = 0.0
    for r in range(plan.dp):
        loss += run_step(
            model, make_payload(plan, r, tokens), forward=forward, backend=backend
        ).loss
    return loss, {n: _grad(p) for n, p in model.named_parameters()}


def _grad(p: nn.Parameter) -> torch.Tensor:
    """``p``'s gradient in fp32 (zeros for a parameter the batch did not reach)."""
    return torch.zeros_like(p, dtype=torch.float32) if p.grad is None else p.grad.detach().float()


def grad_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """Largest relative L2 error over parameters: ``max_p ||got_p - ref_p|| / ||ref_p||``."""
    errs = []
    for name, r in ref.items():
        denom = float(r.norm())
        if denom == 0:
            raise ConfigError(f"reference gradient of {name} is zero: the comparison is vacuous")
        errs.append(float((got[name] - r).norm()) / denom)
    return max(errs)


def equivalence_report(
    model: nn.Module,
    plan: StepPlan,
    tokens: Sequence[np.ndarray],
    *,
    forward: ForwardFn | None = None,
    backend: str = "auto",
) -> dict[str, dict[str, float]]:
    """``{"noise": {...}, "packed": {...}}``: relative loss and gradient error against the
    unpacked reference of two whole-document packings (``noise``) and of ``plan``."""
    ref_loss, ref = run_plan(
        model, whole_document_plan(plan.docs), tokens, forward=forward, backend=backend
    )
    repacked = whole_document_plan(plan.docs, per_pack=3, reverse=True)
    out = {}
    for name, p in (("noise", repacked), ("packed", plan)):
        loss, grads = run_plan(model, p, tokens, forward=forward, backend=backend)
        out[name] = {"loss": abs(loss - ref_loss) / abs(ref_loss), "grad": grad_error(grads, ref)}
    return out
