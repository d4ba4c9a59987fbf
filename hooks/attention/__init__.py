"""Attention backends with one varlen signature (see :mod:`hooks.attention.base`)."""

from __future__ import annotations

from slimdata.hooks.attention import flash, sdpa
from slimdata.hooks.attention.base import (
    BACKENDS,
    AttentionBackend,
    VarlenBatch,
    get_backend,
    register_backend,
)
from slimdata.hooks.attention.sdpa import sdpa_varlen, varlen_mask

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "VarlenBatch",
    "flash",
    "get_backend",
    "register_backend",
    "sdpa",
    "sdpa_varlen",
    "varlen_mask",
]
