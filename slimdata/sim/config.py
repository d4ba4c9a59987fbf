"""Configuration of the step simulator: how a plan's packs are run on the devices."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimdata.cost import Interconnect
from slimdata.errors import ConfigError
from slimdata.execution import ExecutionConfig

__all__ = ["ASYMMETRIC", "PARALLELISMS", "SCHEDULE_NAMES", "SimConfig"]

PARALLELISMS: tuple[str, ...] = ("ddp", "zero1", "fsdp")
ASYMMETRIC: tuple[str, ...] = ("split", "recompute")
SCHEDULE_NAMES: tuple[str, ...] = ("1f1b", "interleaved")


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
    schedule: str = "1f1b"
    """Pipeline schedule when ``pp > 1``: ``1f1b`` or ``interleaved`` (1F1B over
    ``virtual_stages`` model chunks per device)."""
    virtual_stages: int = 2
    """Model chunks per device for the interleaved schedule."""
    interconnect: Interconnect = field(default_factory=Interconnect)
    """Alpha-beta model of intra- and inter-node links."""
    overlap_param_comm: bool = True
    """Parameter/gradient collectives (FSDP all-gather/reduce-scatter, DDP all-reduce) overlap
    the compute they accompany; only the excess is exposed. ``False`` exposes all of it."""
    grad_bytes: int = 2
    """Bytes per gradient/parameter element exchanged by the DP collectives (bf16)."""
    cp: int = 1
    """Static context parallelism (:mod:`slimdata.sim.cp`): every pack of the plan is split
    across a fixed group of ``cp`` devices, so a plan solved for ``dp / cp`` DP groups runs on
    ``Layout.dp`` devices. ``1``: no CP (the plain model)."""
    cp_overlap: float = 1.0
    """Share of the ring-attention overlap window that hides the K/V exchange of static CP,
    DP-Merge and ``dcp`` groups alike: up to ``cp_overlap * (k - 1) / k`` of a member's
    attention time in that layer (0: fully exposed)."""

    def __post_init__(self) -> None:
        if self.parallelism not in PARALLELISMS:
            raise ConfigError(f"parallelism={self.parallelism!r}: use one of {PARALLELISMS}")
        if self.asymmetric not in ASYMMETRIC:
            raise ConfigError(f"asymmetric={self.asymmetric!r}: use one of {ASYMMETRIC}")
        if self.schedule not in SCHEDULE_NAMES:
            raise ConfigError(f"schedule={self.schedule!r}: use one of {SCHEDULE_NAMES}")
        if not isinstance(self.virtual_stages, int) or self.virtual_stages < 1:
            raise ConfigError(
                f"virtual_stages={self.virtual_stages!r} must be an int >= 1 (e.g. 2)"
            )
        if not isinstance(self.cp, int) or self.cp < 1:
            raise ConfigError(f"cp={self.cp!r} must be an int >= 1 (1: no context parallelism)")
        if not 0.0 <= self.cp_overlap <= 1.0:
            raise ConfigError(f"cp_overlap={self.cp_overlap!r} must be in [0, 1] (e.g. 1.0)")
        if self.grad_bytes not in (1, 2, 4):
            raise ConfigError(f"grad_bytes={self.grad_bytes!r}: use 2 (bf16) or 4 (fp32)")

    @property
    def split(self) -> bool:
        """Does the executor split forward packs (``asymmetric="split"`` outside FSDP)?"""
        return self.asymmetric == "split" and self.parallelism != "fsdp"

    @property
    def chunks_per_device(self) -> int:
        """Model chunks each pipeline device holds (1 unless interleaved)."""
        return self.virtual_stages if self.schedule == "interleaved" else 1

    def execution(self, pp: int) -> ExecutionConfig:
        """The execution model's view of this configuration on ``pp`` pipeline stages."""
        return ExecutionConfig(
            pp=pp,
            parallelism="fsdp" if self.parallelism == "fsdp" else "ddp",
            split=self.split,
            schedule=self.schedule,
            virtual_stages=self.chunks_per_device,
            cp=self.cp,
            grad_bytes=self.grad_bytes,
        )
