import pytest

from slimdata.cost import CostModel
from slimdata.docsource import documents_from_lengths

GIB = 1 << 30


def unit_cost(act_tokens_per_gib: int = 100) -> CostModel:
    """Linear toy model: forward 1 s/token, backward 2 s/token, no attention, no constants;
    ``act_tokens_per_gib`` tokens of activations fill one GiB; no K/V."""
    return CostModel(
        fwd_lin=1.0,
        fwd_att=0.0,
        fwd_const=0.0,
        bwd_lin=2.0,
        bwd_att=0.0,
        bwd_const=0.0,
        act_bytes_per_token=GIB / act_tokens_per_gib,
        kv_bytes_per_token=0.0,
    )


def attention_cost() -> CostModel:
    """Attention only: forward 1 s per query-key pair, nothing else."""
    return CostModel(
        fwd_lin=0.0,
        fwd_att=1.0,
        fwd_const=0.0,
        bwd_lin=0.0,
        bwd_att=0.0,
        bwd_const=0.0,
        act_bytes_per_token=1.0,
        kv_bytes_per_token=0.0,
    )


def docs_of(lengths, slice_tokens=128):
    return documents_from_lengths(lengths, slice_tokens)


@pytest.fixture
def ucost():
    return unit_cost()
