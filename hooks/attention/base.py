"""The one signature every attention backend implements, and its registry.

A backend runs one *varlen* call: ``n`` sequences packed along the token axis, sequence ``i``
with queries ``q[cu_q[i]:cu_q[i+1]]`` and keys/values ``k[cu_k[i]:cu_k[i+1]]``. Masking is
*bottom-right causal* per sequence (flash-attn >= 2.1 ``causal=True``): with ``lq`` queries
and ``lk >= lq`` keys, query ``a`` sees keys ``0 .. a + lk - lq``. A slice ``[start, end)`` of
a document whose keys are the document's tokens ``[0, end)`` is therefore exact: its queries
are the tail of its keys. Sequences never see each other, so tokens of different documents
never attend across documents.

Example: a pack of slice ``[4, 6)`` of doc 0 and slice ``[0, 3)`` of doc 1::

    q: 2 + 3 = 5 rows       cu_q = [0, 2, 5]
    k: 6 + 3 = 9 rows       cu_k = [0, 6, 9]
    doc-0 query 0 sees keys 0..4, query 1 sees keys 0..5; doc-1 is plain causal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from slimdata.errors import ConfigError

__all__ = [
    "AUTO",
    "BACKENDS",
    "AttentionBackend",
    "VarlenBatch",
    "get_backend",
    "register_backend",
    "resolve_backend",
]

log = logging.getLogger("slimdata.hooks.attention")


@dataclass(frozen=True)
class VarlenBatch:
    """Sequence boundaries of one varlen call (int32 tensors on the compute device)."""

    cu_q: torch.Tensor
    """Cumulative query counts, ``(n + 1,)``, starting at 0."""
    cu_k: torch.Tensor
    """Cumulative key counts, ``(n + 1,)``; ``lk_i >= lq_i`` for every sequence."""
    max_q: int
    max_k: int
    cache: dict = field(default_factory=dict, compare=False, repr=False)
    """Backend scratch (e.g. masks) reused by every layer of the same pack."""

    @classmethod
    def from_lengths(
        cls, q_lens: list[int], k_lens: list[int], device: torch.device | str = "cpu"
    ) -> VarlenBatch:
        if len(q_lens) != len(k_lens) or any(
            lk < lq for lq, lk in zip(q_lens, k_lens, strict=True)
        ):
            raise ValueError(
                f"need one key length >= query length per sequence, got q={q_lens} k={k_lens}"
            )
        zero = torch.zeros(1, dtype=torch.int32)
        cu_q = torch.cat(
            [zero, torch.tensor(q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)]
        )
        cu_k = torch.cat(
            [zero, torch.tensor(k_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)]
        )
        return cls(cu_q.to(device), cu_k.to(device), max(q_lens, default=0), max(k_lens, default=0))


AttentionBackend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, VarlenBatch, float], torch.Tensor
]
"""``attend(q, k, v, batch, scale) -> out``: ``q (Tq, Hq, D)``, ``k, v (Tk, Hkv, D)`` with
``Hq % Hkv == 0`` (grouped-query attention: query head ``h`` uses key head ``h // (Hq/Hkv)``),
``out (Tq, Hq, D)``; bottom-right causal inside every sequence, nothing across sequences."""

BACKENDS: dict[str, AttentionBackend] = {}


def register_backend(name: str, fn: AttentionBackend) -> AttentionBackend:
    BACKENDS[name] = fn
    return fn


AUTO = "auto"
"""The default backend name: the fastest registered kernel for the tensors' device and dtype."""

GPU_PREFERENCE = ("flash", "torch-varlen")
"""Linear-memory FlashAttention kernels, best first, that ``auto`` picks for fp16/bf16 on CUDA."""

_announced: set[tuple[str, str, str]] = set()


def resolve_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The backend that ``name`` means for tensors on ``device`` of ``dtype``.

    ``auto``: on CUDA in fp16/bf16 the first of :data:`GPU_PREFERENCE` that is registered
    (``flash`` needs the flash-attn package, ``torch-varlen`` torch >= 2.10), else ``sdpa``
    (exact in fp32, and the only choice on CPU). Falling back to ``sdpa`` on a GPU in half
    precision is logged as a warning, never silent: it is correct and its memory is linear
    in the tokens, but it runs one kernel call per 128 query rows. Any other name is itself.
    The choice is logged once per (device type, dtype).
    """
    if name != AUTO:
        return name
    dev = torch.device(device).type
    fast = dev == "cuda" and dtype in (torch.float16, torch.bfloat16)
    chosen = next((b for b in GPU_PREFERENCE if fast and b in BACKENDS), "sdpa")
    key = (dev, str(dtype), chosen)
    if key not in _announced:
        _announced.add(key)
        if fast and chosen == "sdpa":
            log.warning(
                "attention backend: sdpa on %s/%s (neither flash-attn nor torch>=2.10 varlen "
                "attention is available; install slimdata[gpu] for the fast path)",
                dev,
                dtype,
            )
        else:
            log.info("attention backend: %s on %s/%s", chosen, dev, dtype)
    return chosen


def get_backend(name: str) -> AttentionBackend:
    """Resolve a backend by name: ``auto`` (see :func:`resolve_backend`), ``sdpa``,
    ``torch-varlen`` (torch >= 2.10, CUDA) or ``flash`` (flash-attn package, GPU extra)."""
    if name == AUTO:
        return _auto
    if name not in BACKENDS:
        raise ConfigError(
            f"attention backend {name!r} is not available here; use one of {[AUTO, *sorted(BACKENDS)]}"
        )
    return BACKENDS[name]


_AUTO_CHOICE: dict[tuple[str, torch.dtype], AttentionBackend] = {}
"""``auto``'s kernel per (device type, dtype), resolved once: it runs in every layer of every pack."""


def _auto(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float
) -> torch.Tensor:
    key = (q.device.type, q.dtype)
    fn = _AUTO_CHOICE.get(key)
    if fn is None:
        fn = _AUTO_CHOICE[key] = BACKENDS[resolve_backend(AUTO, q.device, q.dtype)]
    return fn(q, k, v, batch, scale)
