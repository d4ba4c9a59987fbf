"""Hand-computable cost models shared by the test directories (``tests`` is on the path:
``pythonpath`` in ``pyproject.toml``)."""

from __future__ import annotations

from slimdata.cost import CostModel


def call_priced_cost() -> CostModel:
    """1 s a token forward, 2 s backward, no per-slice constants, 5 s / 7 s a forward /
    backward model call; a forward pass without an autograd graph takes half the time; 1
    byte of activations a token, no K/V."""
    return CostModel(
        fwd_lin=1.0,
        fwd_att=0.0,
        fwd_const=0.0,
        bwd_lin=2.0,
        bwd_att=0.0,
        bwd_const=0.0,
        act_bytes_per_token=1.0,
        kv_bytes_per_token=0.0,
        fwd_pack_const=5.0,
        bwd_pack_const=7.0,
        graph_free_scale=0.5,
    )
