"""Memory left for activations: device memory minus model states (the default budget).

Model states per parameter, mixed-precision training as in the ZeRO paper (Rajbhandari et
al., SC'20, §3.1): 2 bytes of bf16 parameters, 2 bytes of bf16 gradients and the optimizer's
fp32 states: 12 bytes for Adam (master parameters, momentum, variance), 8 for SGD with
momentum. A pipeline stage holds its share ``S`` of the layers' parameters, the first
(largest) stage counting: ``S = 1 / pp`` when ``pp`` divides the layers, else the first
stage's larger share of the split every consumer uses
(:func:`slimdata.plan.pipeline.stage_share`; 32 layers over 6 stages: ``S = 6 / 32``).
Sharding over the ``dp`` devices of a stage (DP x static CP, as Megatron's distributed
optimizer):

    ddp   (replicated):            (2 + 2 + K) * P * S
    zero1 (optimizer sharded):     (2 + 2 + K / dp) * P * S
    fsdp  (everything sharded):    (2 + 2 + K) * P * S / dp

The budget is ``RESERVE`` (90%) of the device memory minus the states: the other 10% covers
the CUDA context, allocator fragmentation and transient buffers (attention workspace, the
chunked loss). Example: llama-8b (8.03e9 parameters) on an 80 GiB H100 with zero1 over 64
devices, pp 1: states ``(4 + 12 / 64) * 8.03e9 B = 31.3 GiB``, budget ``72 - 31.3 = 40.7 GiB``.
"""

from __future__ import annotations

from slimdata.errors import ConfigError
from slimdata.plan.pipeline import stage_share
from slimdata.units import GIB, gib

__all__ = [
    "GIVEN",
    "OPTIMIZER_BYTES",
    "PARALLELISM_STATES",
    "RESERVE",
    "activation_budget_gib",
    "budget_text",
    "model_state_gib",
]

RESERVE = 0.9
"""Share of device memory usable by model states and activations."""
OPTIMIZER_BYTES: dict[str, float] = {"adam": 12.0, "sgd": 8.0}
"""fp32 optimizer bytes per parameter (master copy included)."""
PARALLELISM_STATES: tuple[str, ...] = ("ddp", "zero1", "fsdp")
GIVEN = "--memory-gib"
"""How a budget the user gave is accounted for (a derived one: :func:`activation_budget_gib`)."""
FULL_RECOMPUTE_FROM = 32768
"""``--recompute auto`` picks ``full`` from this context length on: a 32K-token row holds
108 GiB of llama-8b activations and K/V under selective recompute, more than any device."""


def auto_recompute(recompute: str, context: int) -> str:
    """``auto`` -> ``full`` at ``context >= FULL_RECOMPUTE_FROM`` else ``selective``."""
    if recompute != "auto":
        return recompute
    return "full" if context >= FULL_RECOMPUTE_FROM else "selective"


def budget_text(memory_gib: float, how: str = GIVEN) -> str:
    """The per-device budget as messages name it: a given one (``how`` is :data:`GIVEN`) as
    the option, ``--memory-gib 0.01``; a derived one (``how`` is the account of
    :func:`activation_budget_gib`) by its value and rule, never as an option the user did not
    give: ``the default 12.17 GiB budget (90% of device memory minus model states)``."""
    if how == GIVEN:
        return f"{GIVEN} {memory_gib:g}"
    rule = f"{RESERVE:.0%} of device memory minus model states"
    return f"the default {gib(memory_gib, 2)} budget ({rule})"


def model_state_gib(
    params: int, parallelism: str, optimizer: str, dp: int, pp: int, layers: int = 0
) -> float:
    """GiB of parameters, gradients and optimizer states one device of the first pipeline
    stage holds (module docstring); ``layers``: the model's, for the stage's share (``0``:
    unknown, ``1 / pp``)."""
    if parallelism not in PARALLELISM_STATES:
        raise ConfigError(f"parallelism={parallelism!r}: use one of {PARALLELISM_STATES}")
    if optimizer not in OPTIMIZER_BYTES:
        raise ConfigError(f"optimizer={optimizer!r}: use one of {sorted(OPTIMIZER_BYTES)}")
    k = OPTIMIZER_BYTES[optimizer]
    per_param = {"ddp": 4.0 + k, "zero1": 4.0 + k / dp, "fsdp": (4.0 + k) / dp}[parallelism]
    return per_param * params * stage_share(layers, pp) / GIB


def activation_budget_gib(
    device_gib: float,
    params: int,
    parallelism: str,
    optimizer: str,
    dp: int,
    pp: int,
    *,
    layers: int = 0,
    pp_option: bool = True,
    device: str = "",
) -> tuple[float, str]:
    """The default ``--memory-gib`` and a one-line account of it; raises when nothing is left,
    naming what would leave room: more sharded states than ``parallelism``, a larger
    ``--pp`` where the command has one (``pp_option``), or ``--memory-gib``. ``layers``: the
    model's (:func:`model_state_gib`); ``device``: the preset whose memory ``device_gib`` is,
    named in the account."""
    states = model_state_gib(params, parallelism, optimizer, dp, pp, layers)
    budget = RESERVE * device_gib - states
    memory = f"the {device_gib:g} GiB of {device}" if device else f"{device_gib:g} GiB"
    how = (
        f"{RESERVE:.0%} of {memory} minus {gib(states)} of model states "
        f"({params / 1e9:.2f}B parameters, {parallelism}, {optimizer}, dp={dp}, pp={pp})"
    )
    if budget <= 0:
        sharded = {"ddp": ["--parallelism zero1 or fsdp"], "zero1": ["--parallelism fsdp"]}
        ways = [*sharded.get(parallelism, []), *(["a larger --pp"] if pp_option else [])]
        raise ConfigError(
            f"model states need {gib(states)} per device, more than {RESERVE:.0%} of "
            f"{memory} ({parallelism}, dp={dp}, pp={pp}): "
            + (f"use {', '.join(ways)}, or give --memory-gib" if ways else "give --memory-gib")
        )
    return budget, how
