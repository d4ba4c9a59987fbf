"""Cost and memory model: model shapes, device profiles, per-slice costs (design §5)."""

from __future__ import annotations

from slimdata.cost.costmodel import (
    RECOMPUTE_POLICIES,
    CostModel,
    SliceCosts,
    causal_pairs,
    resolve_cost_model,
)
from slimdata.cost.device import DEVICE_PRESETS, DeviceProfile, Interconnect, load_device
from slimdata.cost.model import MODEL_PRESETS, ModelConfig, load_model_config

__all__ = [
    "DEVICE_PRESETS",
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
    "resolve_cost_model",
]
