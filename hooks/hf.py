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

import torch
import torch.nn.functional as F
from slimdata.hooks.continuation import active_context
from slimdata.hooks.loss import HiddenStates
from torch import nn

from slimdata.errors import ConfigError

__all__ = ["NAME", "hf_hidden_forward", "max_positions", "register", "slimdata_attention"]

NAME = "slimdata"

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose logits are not just ``lm_head(hidden)``."""


def max_positions(model: object) -> int | None:
    """The positions a Hugging Face model (or its ``config``) has,
    ``config.max_position_embeddings``; None for a model that does not say (a custom model's
    positions are not checked)."""
    config = getattr(model, "config", model)
    n = getattr(config, "max_position_embeddings", None)
    return n if type(n) is int and n > 0 else None


def slimdata_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Attention function with the ``AttentionInterface`` signature."""
    ctx = active_context()
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if ctx is not None:
        if query.shape[0] != 1:
            raise ConfigError(
                f"slimdata packs run as one packed row; got batch size {query.shape[0]}"
            )
        if dropout:
            raise ConfigError(
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


def hf_hidden_forward(
    module: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor | HiddenStates:
    """Forward of a Hugging Face causal LM up to its final hidden states, returned with its LM
    head for the chunked loss; models whose logits are transformed after the head (soft-capping,
    scaling) and models without ``get_decoder``/``get_output_embeddings`` get
    their logits (as :func:`slimdata.hooks.hf_forward`)."""
    config = getattr(module, "config", None)
    head = getattr(module, "get_output_embeddings", lambda: None)()
    decoder = getattr(module, "get_decoder", lambda: None)()
    transformed = any(getattr(config, k, None) not in (None, 1, 1.0) for k in _LOGIT_TRANSFORMS)
    if head is None or decoder is None or decoder is module or transformed:
        kw = {"input_ids": input_ids[None], "position_ids": position_ids[None]}
        return module(**kw, use_cache=False).logits[0]
    out = decoder(input_ids=input_ids[None], position_ids=position_ids[None], use_cache=False)
    return HiddenStates(out.last_hidden_state[0], head)
