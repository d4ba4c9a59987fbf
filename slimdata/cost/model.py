"""Transformer shapes: Llama-style presets and JSON configs for any other model.

A :class:`ModelConfig` carries only what the cost model needs (layer count and matrix
shapes). Presets follow the published configs of the named models.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from slimdata.errors import ConfigError

__all__ = ["MODEL_PRESETS", "ModelConfig", "dtype_bytes", "load_model_config"]

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a decoder-only, Llama-style transformer (RMSNorm, GQA, SwiGLU MLP)."""

    name: str
    """Label used in shard sidecars and reports."""
    layers: int
    """Number of transformer blocks."""
    hidden: int
    """Model width (d_model)."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (GQA); equals ``heads`` for multi-head attention."""
    ffn: int
    """Intermediate width of the SwiGLU MLP."""
    vocab: int
    """Vocabulary size (embedding and LM head rows)."""
    dtype_bytes: int = 2
    """Bytes per activation element (2 for bf16/fp16, 4 for fp32)."""

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype_bytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {self.name!r}: {field}={value!r} must be a positive int")
        if self.hidden % self.heads:
            raise ConfigError(
                f"model {self.name!r}: hidden={self.hidden} is not divisible by heads={self.heads}"
            )
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name!r}: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (or value) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def params(self) -> int:
        """Parameter count (untied embedding and LM head; norms ignored)."""
        per_layer = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim
        per_layer += 3 * self.hidden * self.ffn
        return self.layers * per_layer + 2 * self.vocab * self.hidden

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError(
                f"a model config is a JSON object of {_FIELDS}, not {type(data).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"model config has unknown keys {unknown}; known keys: {sorted(known)}"
            )
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise ConfigError(f"model config has no {missing}; it needs {_FIELDS}")
        return cls(**data)

    @classmethod
    def from_hf(cls, model_or_config: object) -> ModelConfig:
        """The shape of a Hugging Face causal LM: pass the model (DDP/FSDP wrappers are
        unwrapped through ``.module``) or its ``config``. Layers, hidden, heads, kv heads, ffn
        and vocab come from the config; bytes per element from the model's parameters when a
        model is given, else from ``config.torch_dtype`` (unset: fp32, as transformers builds
        a model from a config). Duck-typed: torch is not imported here."""
        obj = model_or_config
        while hasattr(obj, "module") and not hasattr(obj, "config"):
            obj = obj.module
        config = getattr(obj, "config", obj)
        dtype = None
        params = getattr(obj, "parameters", None)
        if callable(params) and config is not obj:
            dtype = next(iter(params()), None)
            dtype = getattr(dtype, "dtype", None)
        if dtype is None:
            dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None)
        fields = {k: getattr(config, k, None) for k in _HF_KEYS}
        missing = sorted(k for k in _HF_KEYS[:5] if fields[k] is None)
        if missing:
            raise ConfigError(
                f"cannot derive the cost model from {type(config).__name__}: it has no {missing}; "
                "pass cost=CostModel.analytic(ModelConfig(...)) instead"
            )
        data = _from_hf_fields(fields)
        data["dtype_bytes"] = dtype_bytes(dtype)
        return cls.from_dict(data)


_FIELDS = ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab"]
"""The fields a model config must give (``name`` and ``dtype_bytes`` have defaults)."""

_HF_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "num_key_value_heads",
    "_name_or_path",
    "model_type",
)


def _from_hf_fields(data: dict, name: str = "hf-model") -> dict:
    """ModelConfig fields from Hugging Face config keys (``num_hidden_layers`` ...)."""
    missing = [k for k in _HF_KEYS[:5] if data.get(k) is None]
    if missing:
        raise ConfigError(f"Hugging Face config of {name!r} has no {missing}")
    heads = data["num_attention_heads"]
    return {
        "name": data.get("_name_or_path") or data.get("model_type") or name,
        "layers": data["num_hidden_layers"],
        "hidden": data["hidden_size"],
        "heads": heads,
        "kv_heads": data.get("num_key_value_heads") or heads,
        "ffn": data["intermediate_size"],
        "vocab": data["vocab_size"],
    }


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a torch dtype or its name (``torch.bfloat16``, ``"bf16"``...);
    ``None`` means fp32."""
    if dtype is None:
        return 4
    name = str(dtype).removeprefix("torch.")
    name = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(name, name)
    if name not in DTYPE_BYTES:
        raise ConfigError(f"dtype {dtype!r}: use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


MODEL_PRESETS: dict[str, ModelConfig] = {
    # Llama-3.2-1B
    "llama-1b": ModelConfig(
        name="llama-1b", layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256
    ),
    # Llama-2-7B (multi-head attention)
    "llama-7b": ModelConfig(
        name="llama-7b", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000
    ),
    # Llama-3-8B (GQA)
    "llama-8b": ModelConfig(
        name="llama-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256
    ),
    # Llama-2-13B
    "llama-13b": ModelConfig(
        name="llama-13b", layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000
    ),
    # Llama-3-70B
    "llama-70b": ModelConfig(
        name="llama-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256
    ),
}


def load_model_config(spec: str | ModelConfig) -> ModelConfig:
    """Resolve ``spec``: a preset name (``llama-8b``), or a path to a JSON file of ModelConfig
    fields; a Hugging Face ``config.json`` (``num_hidden_layers`` ...) is accepted too."""
    if isinstance(spec, ModelConfig):
        return spec
    if spec in MODEL_PRESETS:
        return MODEL_PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"unknown model {spec!r}: use one of {sorted(MODEL_PRESETS)} or a path to a JSON config"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"model config {path}: a JSON object of {_FIELDS} or a Hugging Face config.json, "
            f"not {type(data).__name__}"
        )
    if "num_hidden_layers" in data:  # Hugging Face config.json
        data = _from_hf_fields(data, path.stem)
    data.setdefault("name", path.stem)
    return ModelConfig.from_dict(data)
