"""Memory fidelity: bytes held from forward to backward, measured on CPU, against the memory model.

For each model shape (Llama-style, ``attn_implementation="slimdata"``, fp32) and each random
one-rank ``slimpack`` plan (several packs, sliced documents), ``run_step`` runs under
a :class:`~slimdata.hooks.memory.SavedTensorMeter`: the distinct storages autograd holds for
backward and the keys/values the runtime keeps outside them (K/V store, in-graph keys/values),
parameters excluded (model states are outside the budget). After every forward
pack the live bytes are compared with ``slimdata.solver.rank_memory_trace`` of the cost model
derived from the same model (``LoaderConfig(model=...)``'s rule: analytic, with ``--recompute``,
default ``none``; the plan carries the policy and ``run_step`` runs it):
activations held from forward to backward plus retained keys/values. Printed: per shape, the
mean absolute percentage error of the per-plan peak, and of every forward-pack point.

Each shape is predicted twice: with the analytic activation bytes per token, and with the
bytes ``slimdata profile`` measures (:func:`~slimdata.hooks.profile.measure_activation_bytes`
on a few packs of whole documents, not the plans' packs).

    python benchmarks/bench_memory.py [--plans 8] [--seed 0] [--recompute none|selective|full]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import numpy as np
import torch
from slimdata.hooks import Callback, hf, make_payload, run_step
from slimdata.hooks.memory import SavedTensorMeter
from slimdata.hooks.profile import measure_activation_bytes

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, solve
from slimdata.solver.memory import rank_memory_trace

SHAPES = {
    "2x64": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=172),
    "4x128": dict(layers=4, hidden=128, heads=8, kv_heads=4, ffn=344),
    "2x256": dict(layers=2, hidden=256, heads=8, kv_heads=8, ffn=688),
}
VOCAB = 512
PROFILE_SIZES = ((128, 1), (256, 1), (256, 2), (512, 1))
"""``(slice tokens, slices)`` packs that ``measure_activation_bytes`` fits (``slimdata profile``
uses its grid's sizes)."""


class AfterForward(Callback):
    def __init__(self, saved: SavedTensorMeter) -> None:
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


def measure(
    model, cost: CostModel, rng: np.random.Generator, models: list[CostModel]
) -> tuple[list[float], list[list[float]]]:
    """Measured bytes after every forward pack of one random plan (solved with ``cost``), and
    each of ``models``' predictions of them."""
    lengths = np.clip(rng.lognormal(5.0, 0.9, size=int(rng.integers(3, 8))), 8, 900)
    docs = documents_from_lengths(lengths.astype(int).tolist(), slice_tokens=128)
    plan = solve(docs, Layout(dp=1, context=1024, pack_tokens=256, memory_gib=1), cost=cost)
    toks = [rng.integers(0, VOCAB, size=d.length).astype(np.uint32) for d in plan.docs]
    saved = SavedTensorMeter(model.parameters())
    meter = AfterForward(saved)
    model.zero_grad(set_to_none=True)
    with saved.watch():
        run_step(model, make_payload(plan, 0, toks), callbacks=[meter])
    fwd = [i for i, (kind, _) in enumerate(plan.ranks[0].order) if kind == "F"]
    preds = [[rank_memory_trace(plan, 0, m)[i] for i in fwd] for m in models]
    return [float(x) for x in meter.points], preds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, shape in SHAPES.items():
        model = model_of(shape)
        cost = CostModel.analytic(ModelConfig.from_hf(model), "h100", args.recompute)
        act = measure_activation_bytes(model, cost, PROFILE_SIZES, recompute=args.recompute)
        models = {"analytic": cost, "profiled": dataclasses.replace(cost, act_bytes_per_token=act)}
        rng = np.random.default_rng(args.seed)
        peaks: dict[str, list[float]] = {k: [] for k in models}
        points: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(args.plans):
            meas, preds = measure(model, cost, rng, list(models.values()))
            for key, pred in zip(models, preds, strict=True):
                peaks[key].append(abs(max(pred) - max(meas)) / max(meas))
                points[key] += [abs(p - m) / m for p, m in zip(pred, meas, strict=True) if m > 0]
        for key, m in models.items():
            print(
                f"{name} {key}: peak MAPE {100 * statistics.mean(peaks[key]):.2f}% over"
                f" {len(peaks[key])} plans, per-pack MAPE {100 * statistics.mean(points[key]):.2f}%"
                f" over {len(points[key])} points, {m.act_bytes_per_token:.0f} activation B/token"
            )


if __name__ == "__main__":
    main()
