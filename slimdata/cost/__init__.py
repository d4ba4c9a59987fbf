"""Cost and memory model: model shapes, device profiles, per-slice costs (design §5)."""

from __future__ import annotations

from slimdata.cost.costmodel import (
    LOSS_CHUNK_BYTES,
    RECOMPUTE_POLICIES,
    CostModel,
    SliceCosts,
    causal_pairs,
    loss_chunk_tokens,
    resolve_cost_model,
)
from slimdata.cost.device import DEVICE_PRESETS, DeviceProfile, Interconnect, load_device
from slimdata.cost.model import MODEL_PRESETS, ModelConfig, load_model_config

__all__ = [
    "DEVICE_PRESETS",
    "LOSS_CHUNK_BYTES",
    "MODEL_PRESETS",
    "RECOMPUTE_POLICIES",
    "CostModel",
    "DeviceProfile",
    "Interconnect",
    "ModelConfig",
    "SliceCosts",
    "causal_pairs",
    "load_device",
    "load_model_config",
    "loss_chunk_tokens",
    "resolve_cost_model",
]
