"""Hugging Face integration: a registered attention function, no model edits.

``register()`` adds ``"slimdata"`` to ``transformers.AttentionInterface``; load or build any
model whose attention dispatches through ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral,
Gemma...) with ``attn_implementation="slimdata"`` and run it with :func:`run_step`::

    from slimdata.hooks import hf, run_step
    hf.register()
    model = LlamaForCausalLM(config)          # config._attn_implementation = "slimdata"
    run_step(model, payload)                  # default forward = hf_forward

Transformers builds no mask for an implementation it does not know (the mask comes from the
plan), and calls us with ``query (1, Hq, T, D)``, ``key/value (1, Hkv, T, D)`` after RoPE; we
return ``(1, T, Hq, D)``. Outside the executor the function is plain causal attention (a
given 4D mask is honoured), so generation and evaluation keep working.
"""

from __future__ import annotations

import torch.nn.functional as F
from slimdata.hooks.continuation import active_context

__all__ = ["NAME", "register", "slimdata_attention"]

NAME = "slimdata"


def slimdata_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Attention function with the ``AttentionInterface`` signature."""
    ctx = active_context()
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if ctx is not None:
        if query.shape[0] != 1:
            raise ValueError(
                f"slimdata packs run as one packed row; got batch size {query.shape[0]}"
            )
        if dropout:
            raise ValueError(
                "slimdata needs a deterministic forward (backward packs may recompute it): set attention_dropout=0"
            )
        out = ctx.attend(
            query[0].transpose(0, 1),
            key[0].transpose(0, 1),
            value[0].transpose(0, 1),
            module.layer_idx,
            scale,
        )
        return out[None], None
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    mask = attention_mask[..., : key.shape[-2]] if attention_mask is not None else None
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        is_causal=mask is None and query.shape[2] > 1,
        scale=scale,
        dropout_p=dropout,
    )
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Register :func:`slimdata_attention` under ``name``; returns the name for ``attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, slimdata_attention)
    return name
