"""Configuration of the step simulator: how a plan's packs are run on the devices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from slimdata.cost import Interconnect
from slimdata.errors import ConfigError, PlanError
from slimdata.execution import INTERLEAVED_CHUNKS, ExecutionConfig
from slimdata.execution.schedule import SCHEDULES, chunks_per_device
from slimdata.plan import StepPlan

__all__ = ["ASYMMETRIC", "PARALLELISMS", "SCHEDULE_NAMES", "Pipeline", "SimConfig"]

PARALLELISMS: tuple[str, ...] = ("ddp", "zero1", "fsdp")
ASYMMETRIC: tuple[str, ...] = ("split", "recompute")
SCHEDULE_NAMES: tuple[str, ...] = tuple(SCHEDULES)
"""The execution model's pipeline schedules (:data:`slimdata.execution.schedule.SCHEDULES`)."""


class Pipeline(NamedTuple):
    """How a plan's devices are laid out: :attr:`SimConfig.pipeline` (every field set)."""

    schedule: str
    virtual_stages: int
    cp: int


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Execution model of one training step (everything the plan itself does not say)."""

    parallelism: str = "ddp"
    """``ddp``: replicated parameters, one gradient all-reduce at step end; ``zero1``
    (distributed optimizer): timed as ``ddp`` (its gradient reduce-scatter and parameter
    all-gather move the bytes of one all-reduce), it only holds less memory; ``fsdp``
    (ZeRO-3): per-pack parameter all-gather and gradient reduce-scatter, all DP ranks in
    lockstep pack by pack."""
    asymmetric: str = "split"
    """How the executor runs a backward pack that is not a union of forward packs
    (``run_step(asymmetric=...)``): ``split`` forward packs into one call per backward pack,
    or ``recompute`` the pack's forward. ``fsdp`` always recomputes (plan-global rules)."""
    schedule: str | None = None
    """Pipeline schedule when ``pp > 1``: ``1f1b`` or ``interleaved`` (1F1B over
    ``virtual_stages`` model chunks per device). ``None``: the one the plan was solved for
    where it records one (:meth:`for_plan`), else ``1f1b``."""
    virtual_stages: int | None = None
    """Model chunks per device for the interleaved schedule. ``None``: the plan's where it
    records them, else :data:`~slimdata.execution.schedule.INTERLEAVED_CHUNKS` (the
    solver's ``Layout`` default too)."""
    interconnect: Interconnect = field(default_factory=Interconnect)
    """Alpha-beta model of intra- and inter-node links."""
    overlap_param_comm: bool = True
    """Parameter/gradient collectives (FSDP all-gather/reduce-scatter, DDP all-reduce) overlap
    the compute they accompany; only the excess is exposed. ``False`` exposes all of it."""
    grad_bytes: int = 2
    """Bytes per gradient/parameter element exchanged by the DP collectives (bf16)."""
    cp: int | None = None
    """Static context parallelism (:mod:`slimdata.sim.cp`): every pack of the plan is split
    across a fixed group of ``cp`` devices, so a plan solved for ``dp / cp`` DP groups runs on
    ``Layout.dp`` devices. ``1``: no CP (the plain model). ``None``: the plan's
    (``plan.meta["cp"]``) where it records one, else 1."""
    fsdp_keeps_graphs: bool = True
    """Under ``fsdp``: FSDP2 (``fully_shard``) rules; ``False``: FSDP1's
    (``FullyShardedDataParallel``), whose every backward pack recomputes its forward
    (:attr:`slimdata.execution.ExecutionConfig.fsdp_keeps_graphs`)."""
    cp_overlap: float = 1.0
    """Share of the ring-attention overlap window that hides the K/V exchange of static CP,
    DP-Merge and ``dcp`` groups alike: up to ``cp_overlap * (k - 1) / k`` of a member's
    attention time in that layer (0: fully exposed)."""

    def __post_init__(self) -> None:
        if self.parallelism not in PARALLELISMS:
            raise ConfigError(f"parallelism={self.parallelism!r}: use one of {PARALLELISMS}")
        if self.asymmetric not in ASYMMETRIC:
            raise ConfigError(f"asymmetric={self.asymmetric!r}: use one of {ASYMMETRIC}")
        if self.schedule is not None and self.schedule not in SCHEDULE_NAMES:
            raise ConfigError(f"schedule={self.schedule!r}: use one of {SCHEDULE_NAMES}")
        v = self.virtual_stages
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"virtual_stages={v!r} must be an int >= 1 (e.g. 2)")
        cp = self.cp
        if cp is not None and (not isinstance(cp, int) or isinstance(cp, bool) or cp < 1):
            raise ConfigError(f"cp={cp!r} must be an int >= 1 (1: no context parallelism)")
        if not 0.0 <= self.cp_overlap <= 1.0:
            raise ConfigError(f"cp_overlap={self.cp_overlap!r} must be in [0, 1] (e.g. 1.0)")
        if self.grad_bytes not in (1, 2, 4):
            raise ConfigError(f"grad_bytes={self.grad_bytes!r}: use 2 (bf16) or 4 (fp32)")

    @property
    def split(self) -> bool:
        """Does the executor split forward packs (``asymmetric="split"`` outside FSDP)?"""
        return self.asymmetric == "split" and self.parallelism != "fsdp"

    @property
    def pipeline(self) -> Pipeline:
        """The schedule, model chunks per device and static CP a plan that records none of
        them runs under: as given, else the defaults."""
        return self._settled()

    @property
    def chunks_per_device(self) -> int:
        """Model chunks each device of a pipeline holds (1 unless interleaved); unset fields
        at their defaults."""
        schedule, v, _cp = self._settled()
        return chunks_per_device(schedule, 2, v)  # any pp > 1

    def resolved(self, plan: StepPlan | None = None) -> SimConfig:
        """This configuration with ``schedule``, ``virtual_stages`` and ``cp`` set: as given,
        else as ``plan`` records them, else the defaults (``1f1b``,
        :data:`~slimdata.execution.schedule.INTERLEAVED_CHUNKS`, 1). :meth:`for_plan` also
        refuses a given value the plan contradicts."""
        schedule, v, cp = self._settled(plan)
        return dataclasses.replace(self, schedule=schedule, virtual_stages=v, cp=cp)

    def _settled(self, plan: StepPlan | None = None) -> Pipeline:
        rec = _recorded(plan) if plan is not None else {}
        return Pipeline(
            self.schedule or rec.get("schedule") or "1f1b",
            self.virtual_stages or rec.get("virtual_stages") or INTERLEAVED_CHUNKS,
            self.cp or rec.get("cp") or 1,
        )

    def for_plan(self, plan: StepPlan) -> SimConfig:
        """The configuration ``plan`` is simulated under: the pipeline schedule, model chunks
        per device and static CP it was solved for where it records them (a SlimPack plan
        solved for the interleaved schedule records both, ``plan.meta["layout"]``; a plan of
        a static-CP layout its ``cp``, ``plan.meta["cp"]``), this configuration's (or the
        defaults) where it does not. A plan recording none runs under any schedule.

        Raises :class:`~slimdata.errors.PlanError` when this configuration sets one of them
        to another value than the plan records: its estimate, packs and memory were
        solved for that execution, not this one."""
        rec = _recorded(plan)
        asked = {"schedule": self.schedule, "virtual_stages": self.virtual_stages, "cp": self.cp}
        clash = {k: (asked[k], rec[k]) for k in rec if asked[k] is not None and asked[k] != rec[k]}
        if clash:
            said = ", ".join(f"{k}={a!r}" for k, (a, _r) in clash.items())
            solved = ", ".join(f"{k}={r!r}" for k, (_a, r) in clash.items())
            raise PlanError(
                f"the plan was solved for {solved} but the simulator was asked for {said}: "
                "leave them unset to simulate the plan as solved, or solve it again for "
                "this execution (Layout.schedule, Layout.virtual_stages, Layout.cp)"
            )
        return self.resolved(plan)

    def execution(self, pp: int) -> ExecutionConfig:
        """The execution model's view of this configuration on ``pp`` pipeline stages (unset
        fields at their defaults; :meth:`for_plan` sets them for a plan)."""
        schedule, v, cp = self._settled()
        return ExecutionConfig(
            pp=pp,
            parallelism="fsdp" if self.parallelism == "fsdp" else "ddp",
            split=self.split,
            schedule=schedule,
            virtual_stages=chunks_per_device(schedule, pp, v),
            cp=cp,
            grad_bytes=self.grad_bytes,
            fsdp_keeps_graphs=self.fsdp_keeps_graphs,
        )


def _recorded(plan: StepPlan) -> dict[str, Any]:
    """What ``plan`` records of the execution it was solved for: ``schedule`` and
    ``virtual_stages`` (SlimPack, a pipeline under a schedule other than 1F1B,
    ``meta["layout"]``), ``cp`` (a static-CP layout, ``meta["cp"]``); absent keys: not
    recorded."""
    lay = plan.meta.get("layout")
    lay = lay if isinstance(lay, dict) else {}
    out = {k: lay[k] for k in ("schedule", "virtual_stages") if lay.get(k) is not None}
    if plan.meta.get("cp") is not None:
        out["cp"] = plan.meta["cp"]
    return out
