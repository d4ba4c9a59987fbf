"""Memory fidelity: bytes saved for backward, measured on CPU, against the memory model.

For each model shape (Llama-style, ``attn_implementation="slimdata"``, fp32) and each random
one-rank ``slimpack`` plan (several packs, sliced documents), ``run_step`` runs under
``torch.autograd.graph.saved_tensors_hooks`` that track the distinct storages autograd holds
for backward, parameters excluded (model states are outside the budget). After every forward
pack the live bytes are compared with ``slimdata.solver.rank_memory_trace`` of the cost model
derived from the same model (``LoaderConfig(model=...)``'s rule: analytic, ``recompute="none"``):
activations held from forward to backward plus retained keys/values. Printed: per shape, the
mean absolute percentage error of the per-plan peak, and of every forward-pack point.

    python benchmarks/bench_memory.py [--plans 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch
from slimdata.hooks import Callback, hf, make_payload, run_step

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, rank_memory_trace, solve

SHAPES = {
    "2x64": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=172),
    "4x128": dict(layers=4, hidden=128, heads=8, kv_heads=4, ffn=344),
    "2x256": dict(layers=2, hidden=256, heads=8, kv_heads=8, ffn=688),
}
VOCAB = 512


class SavedBytes:
    """Distinct non-parameter storages held by autograd for backward, live and peak bytes."""

    def __init__(self, params) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.refs: dict[int, list[int]] = {}  # data_ptr -> [refcount, bytes]
        self.live = 0

    def pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.params or st.nbytes() == 0:
            return t
        return _Held(self, key, st.nbytes(), t)

    def unpack(self, h):
        return h.t if isinstance(h, _Held) else h

    def add(self, key: int, nbytes: int) -> None:
        ref = self.refs.setdefault(key, [0, nbytes])
        if ref[0] == 0:
            self.live += nbytes
        ref[0] += 1

    def drop(self, key: int) -> None:
        ref = self.refs[key]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self.refs[key]


class _Held:
    def __init__(self, owner: SavedBytes, key: int, nbytes: int, t: torch.Tensor) -> None:
        self.owner, self.key, self.t = owner, key, t
        owner.add(key, nbytes)

    def __del__(self) -> None:
        self.owner.drop(self.key)


class AfterForward(Callback):
    def __init__(self, saved: SavedBytes) -> None:
        self.saved, self.points = saved, []

    def on_pack_end(self, event) -> None:
        if event.pass_ == "F":
            self.points.append(self.saved.live)


def model_of(shape: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=shape["hidden"],
        intermediate_size=shape["ffn"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=1 << 14,
        attn_implementation=hf.register(),
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def measure(model, cost: CostModel, rng: np.random.Generator) -> tuple[list[float], list[float]]:
    """(measured, predicted) bytes after every forward pack of one random plan."""
    lengths = np.clip(rng.lognormal(5.0, 0.9, size=int(rng.integers(3, 8))), 8, 900)
    docs = documents_from_lengths(lengths.astype(int).tolist(), slice_tokens=128)
    plan = solve(docs, Layout(dp=1, context=1024, pack_tokens=256, memory_gib=1), cost=cost)
    toks = [rng.integers(0, VOCAB, size=d.length).astype(np.uint32) for d in plan.docs]
    saved = SavedBytes(model.parameters())
    meter = AfterForward(saved)
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        run_step(model, make_payload(plan, 0, toks), callbacks=[meter])
    trace = rank_memory_trace(plan, 0, cost)
    pred = [b for (kind, _i), b in zip(plan.ranks[0].order, trace, strict=True) if kind == "F"]
    return [float(x) for x in meter.points], pred


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, shape in SHAPES.items():
        model = model_of(shape)
        cost = CostModel.analytic(ModelConfig.from_hf(model), "h100", "none")
        rng = np.random.default_rng(args.seed)
        peaks, points = [], []
        for _ in range(args.plans):
            meas, pred = measure(model, cost, rng)
            peaks.append(abs(max(pred) - max(meas)) / max(meas))
            points += [abs(p - m) / m for p, m in zip(pred, meas, strict=True) if m > 0]
        print(
            f"{name}: peak MAPE {100 * statistics.mean(peaks):.2f}% over {len(peaks)} plans, "
            f"per-pack MAPE {100 * statistics.mean(points):.2f}% over {len(points)} points, "
            f"model: {cost.act_bytes_per_token:.0f} activation B/token"
        )


if __name__ == "__main__":
    main()
