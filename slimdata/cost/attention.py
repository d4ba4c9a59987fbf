"""Attention kernel efficiency versus sequence (chunk) length, from a published curve.

A fused attention kernel is less efficient on short sequences (fewer tiles to fill the
device, fixed prologue/epilogue per tile row). Context parallelism cuts a sequence of ``L``
tokens into chunks, so it runs the kernel on shorter query chunks than the unsplit sequence.
The curve is stored as data (``slimdata/assets/attention_efficiency.json``, with its source):
FlashAttention-3 forward throughput on an H100 at sequence lengths 512 .. 16K, measured by
``pytorch/benchmark`` (PR #2391) with the FlashAttention-3 paper's input sizes.

``relative(n)`` is throughput at ``n`` over the curve's peak, linear in ``log2 n`` between
the points and flat beyond them (below 512 tokens the 512-token value, a conservative
choice: the true loss is larger). ``chunk_factor(whole, chunk) = relative(whole) /
relative(chunk)`` is how much longer the attention of a ``chunk``-token piece of a
``whole``-token sequence takes, per query-key pair, than the same pairs run unsplit: 1 for
``chunk == whole`` and for both lengths below 512.

Example: ``chunk_factor(16384, 2048) = 1.0 / 0.9111 = 1.0976``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["CURVE_FILE", "EfficiencyCurve", "attention_curve"]

CURVE_FILE = Path(__file__).resolve().parents[1] / "assets" / "attention_efficiency.json"


@dataclass(frozen=True)
class EfficiencyCurve:
    """Throughput (TFLOP/s) of the attention kernel at each sequence length."""

    seqlen: tuple[float, ...]
    tflops: tuple[float, ...]
    source: str = ""

    def relative(self, n: np.ndarray | float) -> np.ndarray:
        """Throughput at ``n`` tokens over the peak (module docstring)."""
        x = np.log2(np.maximum(np.asarray(n, dtype=np.float64), 1.0))
        y = np.interp(x, np.log2(self.seqlen), self.tflops)
        return y / max(self.tflops)

    def chunk_factor(self, whole: np.ndarray | float, chunk: np.ndarray | float) -> np.ndarray:
        """Attention time of a ``chunk`` of a ``whole``-token sequence, relative to unsplit."""
        return self.relative(whole) / self.relative(chunk)


@lru_cache(maxsize=1)
def attention_curve() -> EfficiencyCurve:
    """The stored curve (:data:`CURVE_FILE`)."""
    data = json.loads(CURVE_FILE.read_text())
    return EfficiencyCurve(
        tuple(float(x) for x in data["seqlen"]),
        tuple(float(x) for x in data["tflops"]),
        data["source"],
    )
