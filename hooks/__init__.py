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
from slimdata.hooks.continuation import PackContext, active_context, slice_attention
from slimdata.hooks.executor import (
    ForwardFn,
    hf_forward,
    kept_forward_packs,
    reduce_gradients,
    run_step,
)
from slimdata.hooks.hf import hf_hidden_forward
from slimdata.hooks.kvstore import KVStore
from slimdata.hooks.loader import DocumentLoader, LoaderConfig, PlanShardLoader
from slimdata.hooks.loss import HiddenStates, packed_loss, slice_labels
from slimdata.hooks.payload import StepPayload, make_payload
from slimdata.hooks.recompute import checkpoint_layers, pack_checkpoint, recompute_layer
from slimdata.hooks.selective import selective_norm, swiglu_down
from slimdata.hooks.telemetry import StepTelemetry

__all__ = [
    "BalanceMeter",
    "Callback",
    "DocumentLoader",
    "ForwardFn",
    "HiddenStates",
    "KVStore",
    "LoaderConfig",
    "PackContext",
    "PackEvent",
    "PackTimeRecorder",
    "PlanShardLoader",
    "StepPayload",
    "StepSummary",
    "StepTelemetry",
    "active_context",
    "checkpoint_layers",
    "hf_forward",
    "hf_hidden_forward",
    "kept_forward_packs",
    "make_payload",
    "pack_checkpoint",
    "packed_loss",
    "recompute_layer",
    "reduce_gradients",
    "run_step",
    "selective_norm",
    "slice_attention",
    "slice_labels",
    "swiglu_down",
]
