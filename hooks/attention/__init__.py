"""Attention backends with one varlen signature (see :mod:`hooks.attention.base`)."""

from __future__ import annotations

from slimdata.hooks.attention import flash, sdpa, torch_varlen
from slimdata.hooks.attention.base import (
    AUTO,
    BACKENDS,
    AttentionBackend,
    VarlenBatch,
    get_backend,
    register_backend,
    resolve_backend,
)
from slimdata.hooks.attention.sdpa import sdpa_varlen, varlen_mask

__all__ = [
    "AUTO",
    "BACKENDS",
    "AttentionBackend",
    "VarlenBatch",
    "flash",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "sdpa",
    "sdpa_varlen",
    "torch_varlen",
    "varlen_mask",
]
