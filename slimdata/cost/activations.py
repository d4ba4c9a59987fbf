"""Bytes a Llama-style model holds from a token's forward to its backward, per policy.

One place for the memory model's activation term (:attr:`CostModel.act_bytes_per_token`),
enumerated tensor by tensor for a decoder-only model with RMSNorm computed in fp32 (Hugging
Face ``LlamaRMSNorm``), RoPE, GQA attention and a SwiGLU MLP, run by :mod:`slimdata.hooks`
(``d`` = bytes per element of the model dtype, ``h`` hidden, ``f`` ffn, ``hd`` head dim).

A norm without recompute holds its fp32 input, its fp32 per-token statistic and its
normalised tensor in the model dtype: ``norm = (4 + d) h + 4`` (in fp32 the input is not
copied: ``8 h + 4``). Per decoder layer, keys and values excluded:

- ``none``: two norms, their outputs (inputs of the q/k/v and gate/up GEMMs), the queries,
  the attention output (input of the o GEMM) and its fp32 softmax log-sum-exp per query
  head (``4 heads``, what flash-attn and the CPU ``sdpa`` backend hold), and the MLP's gate,
  ``act(gate)``, up and their product (input of the down GEMM):
  ``2 norm + d (4 h + 4 f) + 4 heads``;
- ``selective`` (:mod:`slimdata.hooks.selective`: norms checkpointed, the product and
  ``act(gate)`` rebuilt in the backward): the norms' inputs instead of the norms,
  ``d (6 h + 2 f) + 4 heads``;
- ``full`` (every layer checkpointed): its input, ``d h``.

Once per token, whatever the layer count: the int64 token ids (embedding) and labels (loss),
``16``; the rotary ``cos`` and ``sin``, ``2 d hd``; the final norm (``norm``, or its input
``d h`` under ``selective``) and the LM head's input, ``d h``, which the chunked loss keeps
to recompute each chunk's logits; under ``full`` the checkpoints also hold the layers'
position inputs (position ids and cache positions in Hugging Face Llama), ``16``.

Keys and values, ``2 d kv_dim`` per token per layer, are :attr:`CostModel.kv_bytes_per_token`
under every policy: without recompute autograd saves them; under ``full`` the runtime keeps
them for slice continuation and for their gradient (the K/V store, the pack's in-graph
keys/values). Not counted: transient buffers (one loss chunk's logits, one layer's
recomputation, the attention kernel's workspace).

``activation_bytes_per_token(tiny, "none")`` for 2 layers, hidden 32, 4 heads, 2 kv heads,
ffn 48, fp32: per layer ``2 * 260 + 4 * (128 + 192) + 16 = 1816``; once ``16 + 64 + 260 +
128``.
"""

from __future__ import annotations

from slimdata.cost.model import ModelConfig

__all__ = ["activation_bytes_per_token", "layer_activation_bytes", "norm_bytes"]

INT64 = 8


def norm_bytes(m: ModelConfig) -> int:
    """Bytes one RMSNorm (fp32 compute) holds per token without recompute."""
    return (4 + m.dtype_bytes) * m.hidden + 4


def layer_activation_bytes(m: ModelConfig, recompute: str) -> int:
    """Bytes one decoder layer holds per token, keys and values excluded."""
    d, h, f = m.dtype_bytes, m.hidden, m.ffn
    softmax_stats = 4 * m.heads
    if recompute == "full":
        return d * h
    if recompute == "selective":
        return d * (6 * h + 2 * f) + softmax_stats
    return 2 * norm_bytes(m) + d * (4 * h + 4 * f) + softmax_stats


def activation_bytes_per_token(m: ModelConfig, recompute: str) -> int:
    """:attr:`CostModel.act_bytes_per_token`: every layer plus the per-token terms outside
    the layers (see the module docstring)."""
    d, h = m.dtype_bytes, m.hidden
    final_norm = d * h if recompute == "selective" else norm_bytes(m)
    outside = 2 * INT64 + 2 * d * m.head_dim + final_norm + d * h
    if recompute == "full":
        outside += 2 * INT64
    return m.layers * layer_activation_bytes(m, recompute) + outside
