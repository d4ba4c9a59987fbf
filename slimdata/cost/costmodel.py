"""Per-slice cost and memory model (design §5).

For a slice ``[start, end)`` of a document, with ``s = end - start`` and
``pairs = s * start + s * (s + 1) / 2`` (causal query-key pairs: every query sees the whole
prefix and causally itself)::

    fwd = fwd_lin * s + fwd_att * pairs + fwd_const
    bwd = bwd_lin * s + bwd_att * pairs + bwd_const
    activation_bytes = act_bytes_per_token * s          (held from forward to backward)
    kv_bytes         = kv_bytes_per_token * end         (prefix K/V retained for continuation)

Times are seconds of one full model (all layers) on one device; a pipeline stage with a
fraction of the layers takes that fraction. Assumptions of :meth:`CostModel.analytic`:

- causal attention, flash-attn style (no ``s^2`` memory), bf16 activations;
- linear FLOPs per token per layer ``2 * (2 h^2 + 2 h kv_dim + 3 h ffn)`` plus the LM head
  ``2 h vocab``; attention FLOPs per pair per layer ``4 h`` (QK^T and PV);
- backward = 2x forward FLOPs for linear layers and 2.5x for attention (flash-attn recomputes
  QK^T); ``recompute="full"`` adds one more forward to every backward;
- time = FLOPs / (peak * efficiency) from a :class:`DeviceProfile`, plus a fixed per-layer
  launch overhead per slice;
- activation bytes per token, keys and values excluded, enumerated tensor by tensor in
  :mod:`slimdata.cost.activations`: per layer ``2 ((4 + dtype) h + 4) + dtype (4 h + 4 ffn)
  + 4 heads`` without recompute (fp32 norms, inputs of every GEMM, queries, softmax
  statistics, SwiGLU intermediates), ``dtype * (6 h + 2 ffn) + 4 heads`` with selective
  recompute (norms and the SwiGLU product recomputed; their cost is neglected), ``dtype * h``
  with full recompute (the layer input only); plus, once per token, the token ids and labels, rotary ``cos``/``sin``, the final
  norm and the LM head's input;
- keys and values, ``dtype * 2 kv_dim`` per token per layer
  (:attr:`CostModel.kv_bytes_per_token`), are held under every policy and counted once,
  apart from the activations: autograd saves them (the ``sdpa`` backend holds a prefix as
  the store's tensor, not a copy), and under full recompute the runtime keeps them (the
  per-step K/V store that slice continuation reads, and each pack's in-graph keys/values,
  which receive their gradient). The memory of a slice is ``(act_bytes_per_token +
  kv_bytes_per_token) * tokens`` whatever the policy;
- logits are not held: the loss is assumed chunked or fused (logits recomputed per chunk in
  backward, as in Liger/Megatron fused cross-entropy), so their memory is transient and
  bounded by one chunk, not by the slice length (:func:`loss_chunk_tokens` sizes that
  chunk; the runtime computes its loss that way).

Its accuracy is measured, not assumed: ``slimdata profile`` fits the six time coefficients
on the training device and writes a coefficient file that :meth:`CostModel.load` reads.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import numpy as np

from slimdata.cost.activations import activation_bytes_per_token
from slimdata.cost.device import DeviceProfile, load_device
from slimdata.cost.model import ModelConfig, load_model_config
from slimdata.errors import ConfigError

__all__ = [
    "LOSS_CHUNK_BYTES",
    "RECOMPUTE_POLICIES",
    "CostModel",
    "SliceCosts",
    "causal_pairs",
    "legacy_recompute",
    "loss_chunk_tokens",
    "resolve_cost_model",
]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_POLICIES: tuple[str, ...] = ("none", "selective", "full")


LOSS_CHUNK_BYTES = 256 << 20
"""Default budget of one loss chunk's transient logits (:func:`loss_chunk_tokens`)."""


def loss_chunk_tokens(vocab: int, dtype_bytes: int, budget_bytes: float = LOSS_CHUNK_BYTES) -> int:
    """Tokens of one loss chunk whose transient logits fit ``budget_bytes``: per token the
    logits in the model dtype, their fp32 copy and its fp32 gradient, ``vocab * (dtype + 8)``
    bytes. ``loss_chunk_tokens(32000, 2, 320000) == 1``; never below 1."""
    return max(1, int(budget_bytes // (vocab * (dtype_bytes + 8))))


def causal_pairs(start: np.ndarray | int, end: np.ndarray | int) -> np.ndarray:
    """Query-key pairs of a slice that continues its document: ``s*start + s*(s+1)/2``.

    ``causal_pairs(0, 4) == 10`` (4 queries see 1+2+3+4 keys); ``causal_pairs(4, 6) == 17``
    (2 queries see the 4-token prefix plus 1 and 2 keys of their own).
    """
    start = np.asarray(start, dtype=np.float64)
    s = np.asarray(end, dtype=np.float64) - start
    return s * start + s * (s + 1.0) / 2.0


@dataclass(frozen=True)
class SliceCosts:
    """Per-slice predicted costs for the slices of one or more documents (arrays, aligned)."""

    fwd_lin: np.ndarray
    fwd_att: np.ndarray
    bwd_lin: np.ndarray
    bwd_att: np.ndarray
    fwd: np.ndarray
    """Forward seconds, constants included."""
    bwd: np.ndarray
    """Backward seconds, constants included."""
    act_bytes: np.ndarray
    """Activation bytes held from the slice's forward to its backward."""
    kv_bytes: np.ndarray
    """Retained key/value bytes of the document up to the slice's end."""


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Coefficients of the per-slice cost model; a plain value, JSON round-trippable."""

    fwd_lin: float
    """Forward seconds per token (linear layers, LM head)."""
    fwd_att: float
    """Forward seconds per causal query-key pair."""
    fwd_const: float
    """Forward seconds per slice (fixed overheads)."""
    bwd_lin: float
    """Backward seconds per token."""
    bwd_att: float
    """Backward seconds per causal pair."""
    bwd_const: float
    """Backward seconds per slice."""
    act_bytes_per_token: float
    """Activation bytes per token held between forward and backward, keys and values
    excluded (they are :attr:`kv_bytes_per_token`, counted once under every policy)."""
    kv_bytes_per_token: float
    """Key+value bytes per token over all layers (retained for slice continuation), held on
    top of the activations under every recompute policy."""
    layers: int = 1
    """Layers the times cover (a pipeline stage of ``k`` layers costs ``k / layers``)."""
    hidden: int = 0
    """Model width, for communication volumes (activation bytes per token = hidden * dtype)."""
    kv_dim: int = 0
    """K (or V) width per layer, for DP-Merge exchange volumes."""
    dtype_bytes: int = 2
    """Bytes per element of activations and K/V."""
    param_count: int = 0
    """Parameters (for gradient all-reduce volumes in the simulator)."""
    fwd_pack_const: float = 0.0
    """Forward seconds per MicroPack (one model call: launches, Python), on top of per-slice
    costs; 0 in the analytic model. Use :meth:`pack_forward` to include it."""
    bwd_pack_const: float = 0.0
    """Backward seconds per MicroPack; see :attr:`fwd_pack_const`."""
    graph_free_scale: float = 1.0
    """Time of a forward pack run without an autograd graph, as a share of the same pack's
    forward with its graph. The step executor runs a forward that way when the backward packs
    of its slices recompute it (``slimdata.plan.execution``). 1 in the analytic model (kernel
    time is the same); on a CPU, where recording the graph is a visible share, ``slimdata
    profile`` measures it. Use ``pack_forward(..., graph=False)`` to apply it."""
    recompute: Recompute = "none"
    """Activation recompute policy the coefficients assume (``none``, ``selective`` or
    ``full``). The solver's memory advice and the runtime read it (``plan.meta["recompute"]``
    is the policy ``run_step`` runs); a K/V exchange costs the same under every policy, as a
    checkpointed layer's recomputation is the backward's re-gather. ``slimdata profile`` measures the runtime, which runs no recompute: ``none``."""
    source: str = "analytic"
    """Where the coefficients came from: ``analytic`` or ``profile:<device>``."""
    label: str = ""
    """Display label, e.g. ``llama-8b@h100/selective``; nothing reads a policy from it."""

    def __post_init__(self) -> None:
        for f in (
            "fwd_lin",
            "fwd_att",
            "bwd_lin",
            "bwd_att",
            "act_bytes_per_token",
            "kv_bytes_per_token",
            "fwd_const",
            "bwd_const",
            "fwd_pack_const",
            "bwd_pack_const",
        ):
            v = getattr(self, f)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float | np.number)
                or not np.isfinite(v)
                or v < 0
            ):
                raise ConfigError(f"cost model: {f}={v!r} must be finite and >= 0")
        for f, least in (
            ("layers", 1),
            ("dtype_bytes", 1),
            ("hidden", 0),
            ("kv_dim", 0),
            ("param_count", 0),
        ):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < least:
                raise ConfigError(f"cost model: {f}={v!r} must be an integer >= {least}")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise ConfigError(
                f"cost model: recompute={self.recompute!r}: use one of {RECOMPUTE_POLICIES}"
            )
        if not np.isfinite(self.graph_free_scale) or self.graph_free_scale <= 0:
            raise ConfigError(
                f"cost model: graph_free_scale={self.graph_free_scale} must be finite and > 0"
            )

    # -- evaluation -------------------------------------------------------------------------
    def forward(self, start, end) -> np.ndarray:
        s = np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64)
        return self.fwd_lin * s + self.fwd_att * causal_pairs(start, end) + self.fwd_const

    def backward(self, start, end) -> np.ndarray:
        s = np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64)
        return self.bwd_lin * s + self.bwd_att * causal_pairs(start, end) + self.bwd_const

    def activation_bytes(self, start, end) -> np.ndarray:
        s = np.asarray(end, dtype=np.float64) - np.asarray(start, dtype=np.float64)
        return self.act_bytes_per_token * s

    def kv_bytes(self, end) -> np.ndarray:
        return self.kv_bytes_per_token * np.asarray(end, dtype=np.float64)

    def gathered_kv_bytes(self, tokens) -> np.ndarray:
        """One layer's keys and values of ``tokens`` tokens: what a context-parallel member
        (DP-Merge or static CP) holds gathered while that layer runs, freed after it (twice
        that in the backward: the keys/values and their gradients; design §9)."""
        return self.kv_bytes_per_token / max(self.layers, 1) * np.asarray(tokens, dtype=np.float64)

    def slice_costs(self, starts, ends) -> SliceCosts:
        """Costs of slices ``[starts[i], ends[i])`` (each relative to its document's start)."""
        starts = np.asarray(starts, dtype=np.float64)
        ends = np.asarray(ends, dtype=np.float64)
        s = ends - starts
        pairs = causal_pairs(starts, ends)
        fl, fa = self.fwd_lin * s, self.fwd_att * pairs
        bl, ba = self.bwd_lin * s, self.bwd_att * pairs
        return SliceCosts(
            fwd_lin=fl,
            fwd_att=fa,
            bwd_lin=bl,
            bwd_att=ba,
            fwd=fl + fa + self.fwd_const,
            bwd=bl + ba + self.bwd_const,
            act_bytes=self.act_bytes_per_token * s,
            kv_bytes=self.kv_bytes_per_token * ends,
        )

    def cuts_costs(self, cuts) -> SliceCosts:
        """Costs of the slices of one document given its cut points ``[0, c1, ..., length]``."""
        cuts = np.asarray(cuts, dtype=np.float64)
        return self.slice_costs(cuts[:-1], cuts[1:])

    def pack_forward(self, starts, ends, graph: bool = True) -> float:
        """Forward seconds of one MicroPack of slices ``[starts[i], ends[i])``; ``graph=False``:
        run without an autograd graph (:attr:`graph_free_scale`)."""
        t = float(np.sum(self.forward(starts, ends))) + self.fwd_pack_const
        return t if graph else t * self.graph_free_scale

    def pack_backward(self, starts, ends) -> float:
        """Backward seconds of one MicroPack of slices ``[starts[i], ends[i])``."""
        return float(np.sum(self.backward(starts, ends))) + self.bwd_pack_const

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def analytic(
        cls,
        model: ModelConfig | str,
        device: DeviceProfile | str = "h100",
        recompute: Recompute = "selective",
    ) -> CostModel:
        """Coefficients from FLOPs and device throughput (see the module docstring)."""
        m = load_model_config(model)
        d = load_device(device)
        if recompute not in RECOMPUTE_POLICIES:
            raise ConfigError(f"recompute={recompute!r}: use one of {RECOMPUTE_POLICIES}")
        h, kv, f, L = m.hidden, m.kv_dim, m.ffn, m.layers
        lin_flops = L * 2 * (2 * h * h + 2 * h * kv + 3 * h * f) + 2 * h * m.vocab
        att_flops = L * 4 * h
        peak = d.peak_tflops * 1e12
        fwd_lin = lin_flops / (peak * d.linear_efficiency)
        fwd_att = att_flops / (peak * d.attention_fwd_efficiency)
        bwd_lin = 2 * lin_flops / (peak * d.linear_efficiency)
        bwd_att = 2.5 * att_flops / (peak * d.attention_bwd_efficiency)
        const = L * d.launch_overhead_s
        if recompute == "full":
            bwd_lin, bwd_att = bwd_lin + fwd_lin, bwd_att + fwd_att
        act = activation_bytes_per_token(m, recompute)
        return cls(
            fwd_lin=fwd_lin,
            fwd_att=fwd_att,
            fwd_const=const,
            bwd_lin=bwd_lin,
            bwd_att=bwd_att,
            bwd_const=2 * const,
            act_bytes_per_token=float(act),
            kv_bytes_per_token=float(L * 2 * kv * m.dtype_bytes),
            layers=L,
            hidden=h,
            kv_dim=kv,
            dtype_bytes=m.dtype_bytes,
            param_count=m.params,
            recompute=recompute,
            source="analytic",
            label=f"{m.name}@{d.name}/{recompute}",
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        """The cost model of :meth:`to_dict`'s output. A dict written before the
        ``recompute`` field existed gets its policy from :func:`legacy_recompute`."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"cost profile has unknown keys {unknown}")
        if "recompute" not in data:
            data = {**data, "recompute": legacy_recompute(data)}
        return cls(**data)

    def save(self, path: str | Path) -> None:
        """Write a coefficient file (JSON) that :meth:`load` and ``--cost-profile`` accept."""
        Path(path).write_text(json.dumps({"slimdata_cost_profile": 1, **self.to_dict()}, indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read cost profile {path}: {exc}") from exc
        if not isinstance(data, dict) or data.pop("slimdata_cost_profile", None) != 1:
            raise ConfigError(
                f"{path} is not a slimdata cost profile (missing 'slimdata_cost_profile': 1)"
            )
        return cls.from_dict(data)


def legacy_recompute(data: dict) -> Recompute:
    """The recompute policy of a cost-model dict written without a ``recompute`` key.

    Analytic models were labelled ``<model>@<device>/<policy>``: that suffix is the policy.
    ``slimdata profile`` wrote ``source="profile:<device>"`` and a dtype suffix
    (``tiny@cpu/float32``); it times the runtime, which runs no recompute: ``none``. Anything
    else cannot be decided and raises :class:`ConfigError`.
    """
    label, source = str(data.get("label", "")), str(data.get("source", ""))
    suffix = label.rsplit("/", 1)[-1] if "/" in label else ""
    if suffix in RECOMPUTE_POLICIES:
        return cast(Recompute, suffix)
    if source.startswith("profile:"):
        return "none"
    raise ConfigError(
        f"cost model (label {label!r}, source {source!r}) does not say its recompute policy: "
        f'add "recompute": one of {list(RECOMPUTE_POLICIES)} to the file'
    )


def resolve_cost_model(
    model: str | ModelConfig = "llama-8b",
    device: str | DeviceProfile = "h100",
    recompute: Recompute = "selective",
    profile: str | Path | None = None,
) -> CostModel:
    """The cost model every CLI uses: a measured profile file if given, else analytic."""
    if profile is not None:
        return CostModel.load(profile)
    return CostModel.analytic(model, device, recompute)
