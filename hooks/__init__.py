"""slimdata.hooks: the train-time runtime (loader, pack executor, attention backends,
DP-Merge, callbacks). Imports torch; the ``slimdata`` library never imports this package.

Typical loop::

    from slimdata.hooks import hf, run_step
    hf.register()                                   # attn_implementation="slimdata"
    for payload in loader:                          # StepPayload: plan + this rank's tokens
        summary = run_step(model, payload)          # exact grads of the unpacked batch
        optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

from slimdata.hooks.callbacks import (
    BalanceMeter,
    Callback,
    PackEvent,
    PackTimeRecorder,
    StepSummary,
)
from slimdata.hooks.continuation import slice_attention
from slimdata.hooks.executor import ForwardFn, hf_forward, run_step
from slimdata.hooks.loader import DocumentLoader, LoaderConfig, PlanShardLoader
from slimdata.hooks.payload import StepPayload, make_payload
from slimdata.hooks.recompute import checkpoint_layers, recompute_layer
from slimdata.hooks.selective import selective_norm, swiglu_down
from slimdata.hooks.telemetry import StepTelemetry

__all__ = [  # what a training loop uses; the building blocks stay in their modules
    "BalanceMeter",
    "Callback",
    "DocumentLoader",
    "ForwardFn",
    "LoaderConfig",
    "PackEvent",
    "PackTimeRecorder",
    "PlanShardLoader",
    "StepPayload",
    "StepSummary",
    "StepTelemetry",
    "checkpoint_layers",
    "hf_forward",
    "make_payload",
    "recompute_layer",
    "run_step",
    "selective_norm",
    "slice_attention",
    "swiglu_down",
]
