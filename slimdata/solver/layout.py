"""The training layout a plan is solved for."""

from __future__ import annotations

import math
from dataclasses import dataclass

from slimdata.errors import ConfigError
from slimdata.execution.program import ExecutionConfig
from slimdata.execution.schedule import INTERLEAVED_CHUNKS, chunks_per_device
from slimdata.execution.schedule import SCHEDULES as EXECUTION_SCHEDULES
from slimdata.units import GIB, MAX_RANKS

__all__ = ["SCHEDULES", "Layout"]


SCHEDULES: tuple[str, ...] = tuple(EXECUTION_SCHEDULES)
"""Pipeline schedules a lockstep plan can be estimated for (the execution model's registry,
:data:`slimdata.execution.schedule.SCHEDULES`)."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Data/pipeline-parallel layout and per-device limits of one training job."""

    dp: int
    """Data-parallel ranks (one RankStep each)."""
    pp: int = 1
    """Pipeline stages; each stage holds ``layers / pp`` of the model."""
    ranks_per_node: int = 8
    """DP ranks per node: merge groups inside a node use the intra-node bandwidth."""
    memory_gib: float = 40.0
    """Per-device budget for activations and retained K/V (model states excluded), GiB."""
    context: int = 131072
    """Context length: the row length of ``concat`` and the default MicroPack token cap."""
    pack_tokens: int | None = None
    """Maximum tokens in one MicroPack, DP-Merge shares included (default: ``context``); it
    must hold the largest slice."""
    mode: str = "free"
    """``free`` (DDP: only per-rank totals matter) or ``lockstep`` (FSDP/ZeRO-3, pipeline)."""
    microbatches: int | None = None
    """Packs per rank in lockstep mode (default: chosen by the solver)."""
    cp: int = 1
    """Static context parallelism (Megatron's ``--context-parallel-size``): every DP rank is a
    group of ``cp`` devices that run its packs together, each holding load-balanced chunks of
    every slice (:mod:`slimdata.execution.cp`). ``dp`` and ``ranks_per_node`` count DP ranks
    (CP groups), so the job has ``dp * cp`` devices; ``memory_gib`` stays per device and a DP
    rank is planned with its ``cp`` devices' memory (:attr:`memory_bytes`), as the
    simulator's static-CP search solves (:mod:`slimdata.sim.cp`)."""
    schedule: str = "1f1b"
    """Pipeline schedule the plan will run under when ``pp > 1``: ``1f1b`` or ``interleaved``
    (Megatron's interleaved 1F1B over :attr:`virtual_stages` model chunks per device). A
    lockstep planner that estimates the step (SlimPack) estimates it under this schedule."""
    virtual_stages: int = INTERLEAVED_CHUNKS
    """Model chunks per device under the ``interleaved`` schedule (Megatron's
    ``--num-layers-per-virtual-pipeline-stage`` expressed as a count; default
    :data:`~slimdata.execution.schedule.INTERLEAVED_CHUNKS`, as the simulator's); unused
    otherwise."""

    def __post_init__(self) -> None:
        if not isinstance(self.dp, int) or self.dp < 1:
            raise ConfigError(f"dp={self.dp!r}: need at least one data-parallel rank")
        if self.dp > MAX_RANKS or self.ranks_per_node > MAX_RANKS:
            raise ConfigError(
                f"dp={self.dp}, ranks_per_node={self.ranks_per_node}: at most {MAX_RANKS:,} each"
            )
        if not isinstance(self.pp, int) or self.pp < 1:
            raise ConfigError(f"pp={self.pp!r}: need at least one pipeline stage")
        if self.ranks_per_node < 1:
            raise ConfigError(f"ranks_per_node={self.ranks_per_node!r} must be >= 1")
        if not (math.isfinite(self.memory_gib) and self.memory_gib > 0):
            raise ConfigError(f"memory_gib={self.memory_gib!r} must be a finite number > 0")
        if self.context < 128:
            raise ConfigError(f"context={self.context!r} must be >= 128 tokens")
        if self.pack_tokens is not None and self.pack_tokens < 128:
            raise ConfigError(f"pack_tokens={self.pack_tokens!r} must be >= 128")
        if self.mode not in ("free", "lockstep"):
            raise ConfigError(f"mode={self.mode!r}: use 'free' (DDP) or 'lockstep' (FSDP/pipeline)")
        if self.microbatches is not None and self.microbatches < 1:
            raise ConfigError(f"microbatches={self.microbatches!r} must be >= 1")
        if not isinstance(self.cp, int) or isinstance(self.cp, bool) or self.cp < 1:
            raise ConfigError(
                f"cp={self.cp!r}: static context parallelism needs an integer >= 1 (1: none)"
            )
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r}: use one of {', '.join(SCHEDULES)}")
        v = self.virtual_stages
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(
                f"virtual_stages={v!r}: model chunks per device need an integer >= 1 "
                "(e.g. 2 with schedule='interleaved')"
            )

    @property
    def chunks_per_device(self) -> int:
        """Model chunks each pipeline device holds: ``virtual_stages`` under the interleaved
        schedule with ``pp > 1``, else 1 (then every schedule is 1F1B)."""
        return chunks_per_device(self.schedule, self.pp, self.virtual_stages)

    @property
    def execution(self) -> ExecutionConfig:
        """How the plan is meant to run, as the execution model takes it: lockstep packs on
        one stage by FSDP's rules, anything else by DDP's (gradients reduced at the end of the
        step; a pipeline's stages exchange activations), with the executor's default split
        calls, this schedule and static CP. The rules a plan's pack prices
        (``MicroPack.cost``) and SlimPack's estimate assume."""
        return ExecutionConfig(
            pp=self.pp,
            parallelism="fsdp" if self.mode == "lockstep" and self.pp == 1 else "ddp",
            schedule=self.schedule,
            virtual_stages=self.chunks_per_device,
            cp=self.cp,
        )

    @property
    def memory_bytes(self) -> float:
        """Memory a DP rank is planned with: its ``cp`` devices' budget (``cp = 1``: one)."""
        return self.memory_gib * self.cp * GIB

    @property
    def token_cap(self) -> int:
        return self.pack_tokens or self.context
