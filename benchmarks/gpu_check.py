"""GPU validation report (``make gpu-check``): what the cost model and the runtime claim, measured.

Sections, each written to ``OUT/report.md`` (and ``OUT/results.json``) as soon as it is done,
in the order 1, 2, 4 (the 8B-shaped model), 6, 4 (the 1B-class model), 5, 3: the measured
speedup runs as soon as its cost model is profiled, so a run the device's time limit cuts
short keeps it:

1. Device, torch, and the attention backend ``auto`` picks for bf16.
2. bf16 equivalence: slimpack plans (slices with continuation, asymmetric backward packs, two
   DP ranks run in sequence) against the unpacked reference with the same kernels, next to
   the noise floor of two whole-document packings (:mod:`slimdata.hooks.verify`).
3. Attention throughput against sequence (chunk) length, forward and backward (PNG).
4. ``slimdata profile`` of a 1B-class and an 8B-shaped model (fewer layers); per-pack time
   MAPE on held-out slimpack plans (PNG: predicted against measured).
5. Memory fidelity: the solver's memory trace (bytes held after each pack) against
   ``torch.cuda.memory_allocated`` after the pack, and the pack's peak
   (``max_memory_allocated``) beside it.
6. Measured speedup: one step per strategy on real shards (DP ranks run in sequence on the
   one GPU; the step is the slowest rank), tokens/s, against the simulator's prediction.

    python benchmarks/gpu_check.py --out gpu-report [--shards DIR] [--quick]

``--quick`` shrinks every size (runs on CPU in fp32 too) to check the script itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from bench_hooks import bench_mape, heldout_plans
from slimdata.hooks import Callback, hf, make_payload, run_step
from slimdata.hooks.attention import VarlenBatch, get_backend, resolve_backend
from slimdata.hooks.profile import ProfileConfig, measure_activation_bytes, tiny_llama
from slimdata.hooks.verify import equivalence_report

from slimdata.cost import MODEL_PRESETS, CostModel, ModelConfig, causal_pairs
from slimdata.docsource import documents_from_lengths, load_shard_documents
from slimdata.execution import pack_times
from slimdata.sim import SimConfig, simulate_step
from slimdata.solver import Layout, SolveOptions, solve
from slimdata.solver.batches import apply_oversize, make_batches
from slimdata.solver.memory import rank_memory_trace

GIB = 2**30
HELDOUT = dict(
    mu=float(np.log(3000)),
    sigma=1.2,
    clip=(64, 8192),
    docs=12,
    slice_tokens=2048,
    pack_tokens=8192,
    memory_gib=16.0,
)
"""Held-out plans of the profile and memory sections: 12 lognormal documents (median 3000
tokens, at most 8192), slices of 2048, packs of at most 8192, a 16 GiB activation budget."""
STEPS = 4
"""Global batches timed per strategy in the speedup section."""
SAME_WORK = ("slimpack", "bfd", "multipack", "wlb-ideal", "sorted")
"""Strategies that keep documents whole (``concat`` cuts them at row ends: less attention)."""


@dataclasses.dataclass
class Report:
    out: Path
    device: str
    dtype: torch.dtype
    quick: bool
    md: list[str] = dataclasses.field(default_factory=list)
    """The report's heading."""
    data: dict = dataclasses.field(default_factory=dict)
    sections: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Each section's lines by its ``results.json`` key, in the order first written."""

    def section(self, title: str, key: str, value, lines: list[str]) -> None:
        """Write (or rewrite, for a ``key`` written before) one section to both files."""
        self.data[key] = value
        self.sections[key] = [f"## {title}", "", *lines, ""]
        self.out.mkdir(parents=True, exist_ok=True)
        body = [line for sec in self.sections.values() for line in sec]
        (self.out / "report.md").write_text("\n".join([*self.md, *body]))
        (self.out / "results.json").write_text(json.dumps(self.data, indent=1, default=str))
        print("\n".join([f"## {title}", *lines]), flush=True)


def sizes(quick: bool, full, small):
    return small if quick else full


# -- 1. environment ----------------------------------------------------------------------------
def environment(rep: Report) -> None:
    name = torch.cuda.get_device_name() if rep.device == "cuda" else "cpu"
    backend = resolve_backend("auto", rep.device, rep.dtype)
    info = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": str(rep.dtype),
        "backend": backend,
        "date": datetime.date.today().isoformat(),
    }
    rep.md = [f"# slimdata GPU check: {name}, {info['date']}", ""]
    rep.section(
        "Environment",
        "environment",
        info,
        [f"- {k}: `{v}`" for k, v in info.items()]
        + [
            "- flash-attn: not installed (PyPI has only its source distribution for torch"
            f" {torch.__version__}); `auto` uses the backend above"
            if backend != "flash"
            else "- flash-attn: installed"
        ],
    )


# -- 2. bf16 equivalence -----------------------------------------------------------------------
def equivalence(rep: Report) -> None:
    shape = ModelConfig(
        name="eq", layers=4, hidden=1024, heads=16, kv_heads=4, ffn=2816, vocab=32000
    )
    if rep.quick:
        shape = ModelConfig(name="eq", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
    lengths = sizes(rep.quick, [9000, 4100, 2500, 1300, 700, 300, 129, 1], [600, 300, 90, 1])
    cap = sizes(rep.quick, 4096, 256)
    model = _hf_model(shape, rep)
    rows = []
    for mode in ("free", "lockstep"):
        plan, toks = _solved(shape, lengths, dp=2, cap=cap, mode=mode)
        r = equivalence_report(model, plan, toks)
        sliced = sum(s.start > 0 for rk in plan.ranks for p in rk.forward for s in p.slices)
        asym = sum(set(rk.forward) != set(rk.backward) for rk in plan.ranks)
        rows.append({"mode": mode, "sliced": sliced, "asymmetric_ranks": asym, **_flat(r)})
    if rep.device == "cuda":
        rows += _two_process_rows(rep)
    lines = [
        f"Model {shape.layers} layers x {shape.hidden} ({shape.heads} heads, {shape.kv_heads} kv),"
        f" {rep.dtype}; documents {lengths}; slimpack, 2 DP ranks run in sequence, packs <= {cap}.",
        "Errors are relative: loss |l - l_ref| / l_ref; gradients max over parameters of"
        " ||g - g_ref|| / ||g_ref||. *noise* = the reference against the same documents packed"
        " 3 per pack in reverse order (summation order alone).",
        "",
        "The DP-Merge row is another model (3 layers x 512, documents [6000, 700, 1300, 300, 129],"
        " packs <= 4096, 0.25 GiB budget so the 6000-token document is merged over both ranks). The static CP row"
        " runs the same model and documents as one DP rank on a CP group of two processes (slices"
        " of 512 tokens, each cut into load-balanced chunks; keys/values exchanged per layer).",
        "",
        "| mode | sliced slices | asymmetric ranks | noise loss | noise grad | packed loss | packed grad | packed / noise (grad) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['sliced']} | {r['asymmetric_ranks']} | {r['noise_loss']:.2e} |"
            f" {r['noise_grad']:.2e} | {r['packed_loss']:.2e} | {r['packed_grad']:.2e} |"
            f" {r['packed_grad'] / max(r['noise_grad'], 1e-30):.2f} |"
        )
    rep.section("bf16 equivalence", "equivalence", rows, lines)


def _two_process_rows(rep: Report) -> list[dict]:
    """DP-Merge and static CP, each as two processes on the one GPU (gloo): the cases of
    ``tests/gpu`` (``TWO_PROCESSES``, rank bodies in ``tests/gpu/gpu_workers.py``)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
    import gpu_workers as W
    from slimdata.hooks.distributed import run_distributed

    dtype = str(rep.dtype).removeprefix("torch.")
    rows = []
    for case, (worker, args) in W.TWO_PROCESSES.items():
        res = run_distributed(worker, 2, "cuda", dtype, *args)
        shares, refs, errs, noise, used = zip(*res, strict=True)
        merge = case == "dp_merge"
        rows.append(
            {
                "mode": f"DP-Merge ({used[0]} group, 2 processes)"
                if merge
                else "static CP 2 (1 DP rank, 2 processes)",
                "sliced": "-" if merge else used[0],
                "asymmetric_ranks": "-",
                "noise_loss": float("nan"),
                "noise_grad": max(noise),
                "packed_loss": abs(sum(shares) - refs[0]) / refs[0],
                "packed_grad": max(errs),
            }
        )
    return rows


def _flat(r: dict) -> dict:
    return {f"{a}_{b}": v for a, d in r.items() for b, v in d.items()}


def _hf_model(shape: ModelConfig, rep: Report):
    return tiny_llama(shape, rep.device, str(rep.dtype).removeprefix("torch."))


def _solved(shape, lengths, dp, cap, mode="free", slice_tokens=None):
    docs = documents_from_lengths(lengths, slice_tokens=slice_tokens or max(128, cap // 4))
    layout = Layout(dp=dp, context=1 << 16, pack_tokens=cap, memory_gib=1e3, mode=mode)
    cost = CostModel.analytic(shape, "h100", "none")
    # no DP-Merge: verify runs the ranks in sequence in one process
    no_merges = SolveOptions().forced_merges_only()
    plan = solve(docs, layout, "slimpack", seed=0, cost=cost, options=no_merges)
    rng = np.random.default_rng(0)
    return plan, [rng.integers(0, shape.vocab, d.length).astype(np.uint32) for d in plan.docs]


# -- 3. attention throughput -------------------------------------------------------------------
def attention_curve(rep: Report) -> None:
    heads, kv, d = 32, 8, 128
    total = sizes(rep.quick, 65536, 1024)
    lengths = [2**i for i in range(7, 17) if 2**i <= total]
    rows = []
    for n in lengths:
        f, b = _time_attention(n, total // n, heads, kv, d, rep)
        flops = 4 * d * heads * float(causal_pairs(0, n)) * (total // n)
        rows.append(
            {"length": n, "fwd_tflops": flops / f / 1e12, "bwd_tflops": 2.5 * flops / b / 1e12}
        )
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("fwd_tflops", "forward"), ("bwd_tflops", "backward")):
        ax.plot([r["length"] for r in rows], [r[key] for r in rows], "o-", label=label)
    ax.set(xscale="log", xlabel="sequence (chunk) length, tokens", ylabel="TFLOP/s (causal)")
    ax.set_title(f"varlen causal attention, {heads}/{kv} heads x {d}, {total} tokens per call")
    ax.legend()
    fig.tight_layout()
    fig.savefig(rep.out / "attention_curve.png", dpi=120)
    plt.close(fig)
    lines = [
        f"`{resolve_backend('auto', rep.device, rep.dtype)}` kernel, {total} tokens per call as"
        f" {total}/L causal sequences of length L; flops 4·d·heads·pairs forward, 2.5x that backward.",
        "",
        "| L | forward TFLOP/s | backward TFLOP/s |",
        "|---|---|---|",
        *(f"| {r['length']} | {r['fwd_tflops']:.1f} | {r['bwd_tflops']:.1f} |" for r in rows),
        "",
        "![attention throughput](attention_curve.png)",
    ]
    rep.section("Attention throughput against chunk length", "attention_curve", rows, lines)


def _time_attention(n: int, seqs: int, heads: int, kv: int, d: int, rep: Report):
    dev, dt = rep.device, rep.dtype
    q = torch.randn(n * seqs, heads, d, device=dev, dtype=dt, requires_grad=True)
    k, v = (torch.randn(n * seqs, kv, d, device=dev, dtype=dt, requires_grad=True) for _ in "kv")
    batch = VarlenBatch.from_lengths([n] * seqs, [n] * seqs, device=dev)
    attend = get_backend("auto")
    grad = torch.randn_like(q)

    def run(backward: bool) -> float:
        times = []
        for i in range(4):
            _sync(dev)
            t0 = time.perf_counter()
            out = attend(q, k, v, batch, d**-0.5)
            if backward:
                torch.autograd.grad(out, (q, k, v), grad)
            _sync(dev)
            if i:
                times.append(time.perf_counter() - t0)
        return float(np.median(times))

    f = run(False)
    return f, max(run(True) - f, 1e-9)


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


# -- 4. profile and held-out time MAPE ----------------------------------------------------------
def profile_models(rep: Report, which: slice = slice(None)) -> dict[str, CostModel]:
    """The models ``which`` selects of :func:`_profile_setup`'s profiled, added to the one
    profile section; returns their calibrated cost models by name."""
    shapes, config, plan_args = _profile_setup(rep)
    results, models = rep.data.get("profile", []), {}
    for shape in shapes[which]:
        model = _hf_model(shape, rep)
        t0 = time.perf_counter()
        res = bench_mape(
            config.repeats,
            "median",
            shape,
            config=config,
            model=model,
            plans=heldout_plans(shape, **plan_args),
        )
        res["seconds"] = time.perf_counter() - t0
        res["rows"] = [row | {"rec": bool(row["rec"])} for row in res["rows"]]  # JSON-ready
        models[shape.name] = res.pop("cost_model")
        models[shape.name].save(rep.out / f"profile-{shape.name}.json")
        results.append(res)
        del model
        torch.cuda.empty_cache() if rep.device == "cuda" else None
    _plot_pack_times(rep, results)
    rep.section(
        "Profile and per-pack time prediction", "profile", results, _profile_lines(config, results)
    )
    return models


def _profile_setup(rep: Report) -> tuple[list[ModelConfig], ProfileConfig, dict]:
    """An 8B-shaped and a 1B-class model (the speedup section's first: it runs between
    them), the GPU grid and the held-out plans' settings."""
    eight = MODEL_PRESETS["llama-8b"]
    shapes = [
        dataclasses.replace(eight, name="llama-8b-4layers", layers=4, vocab=129280),
        MODEL_PRESETS["llama-1b"],
    ]
    config = ProfileConfig(
        # up to the held-out plans' 8192-token packs; no point holds more than 16384 tokens
        # (a 1B model's activations for them, ~40 GB)
        slice_tokens=(512, 1024, 2048, 4096, 8192),
        prefixes=(0, 2048, 6144),
        pack_sizes=(1, 2),
        max_point_tokens=16384,
        calibration_memory_gib=32.0,
        repeats=3,
        lead_packs=1,
        device=rep.device,
        dtype=str(rep.dtype).removeprefix("torch."),
    )
    if not rep.quick:
        return shapes, config, HELDOUT
    tiny = ModelConfig(name="q", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
    config = dataclasses.replace(config, slice_tokens=(32, 64, 128), prefixes=(0, 128), repeats=1)
    return (
        [tiny],
        config,
        dict(mu=4.5, sigma=1.0, clip=(2, 600), docs=8, slice_tokens=128, pack_tokens=256),
    )


def _plot_pack_times(rep: Report, results: list[dict]) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.scatter(
            [x["measured"] for x in r["rows"]],
            [x["predicted"] for x in r["rows"]],
            s=10,
            label=r["model"],
        )
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k:", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="measured pack time, s", ylabel="predicted, s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(rep.out / "pack_time_mape.png", dpi=120)
    plt.close(fig)


def _profile_lines(config: ProfileConfig, results: list[dict]) -> list[str]:
    return [
        f"Grid: slices {config.slice_tokens} x prefixes {config.prefixes} x packs of"
        f" {config.pack_sizes} slices (points holding at most {config.max_point_tokens} tokens),"
        f" {config.repeats} rounds, calibrated on"
        f" {config.calibration_plans} plans; held out: 3 slimpack plans of 12 lognormal documents"
        " (slices of 2048, packs <= 8192, 16 GiB budget) timed in the same rounds.",
        "",
        "| model | packs | MAPE | forward | backward | uncalibrated | in-sample floor | seconds |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['packs']} | {r['mape_pct']:.2f}% | {r['mape_pct_fwd']:.2f}% |"
            f" {r['mape_pct_bwd']:.2f}% | {r['mape_pct_uncalibrated']:.2f}% |"
            f" {r['mape_pct_in_sample_floor']:.2f}% | {r['seconds']:.0f} |"
            for r in results
        ),
        "",
        "![pack time, predicted against measured](pack_time_mape.png)",
    ]


# -- 5. memory fidelity --------------------------------------------------------------------------
class MemoryRecorder(Callback):
    """Bytes allocated after each pack (and the peak during it) above the step's start."""

    def __init__(self) -> None:
        self.base, self.held, self.peak = 0, [], []

    def on_step_start(self, plan, rank) -> None:
        torch.cuda.synchronize()
        self.base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def on_pack_end(self, event) -> None:
        self.held.append(torch.cuda.memory_allocated() - self.base)
        self.peak.append(torch.cuda.max_memory_allocated() - self.base)
        torch.cuda.reset_peak_memory_stats()


def memory_fidelity(rep: Report, models: dict[str, CostModel]) -> None:
    if rep.device != "cuda":
        return
    shape = MODEL_PRESETS["llama-1b"]
    cm = models.get(shape.name) or CostModel.analytic(shape, "h100", "none")
    model = _hf_model(shape, rep)
    plans = heldout_plans(shape, n=3, seed=7, **HELDOUT)
    # slimdata profile's measured activation bytes, from packs of whole documents
    act = measure_activation_bytes(model, cm, [(2048, 1), (4096, 1), (4096, 2), (8192, 1)])
    measured_cm = dataclasses.replace(cm, act_bytes_per_token=act)
    pred, pred_m, held, peak = [], [], [], []
    for plan, payload in plans:
        run_step(model, payload)  # gradients allocated: the step's base holds them
        model.zero_grad(set_to_none=False)
        mem = MemoryRecorder()
        run_step(model, payload, callbacks=[mem])
        model.zero_grad(set_to_none=False)
        trace = rank_memory_trace(plan, 0, cm)
        fwd = [i for i, (kind, _) in enumerate(plan.ranks[0].order) if kind == "F"]
        pred += [trace[i] for i in fwd]
        pred_m += [rank_memory_trace(plan, 0, measured_cm)[i] for i in fwd]
        held += [mem.held[i] for i in fwd]
        peak += [mem.peak[i] for i in fwd]
    pred_a, held_a, peak_a = (np.array(x, float) for x in (pred, held, peak))
    ok = held_a > 0
    mape_held = 100 * float(np.mean(np.abs(pred_a[ok] - held_a[ok]) / held_a[ok]))
    mape_peak = 100 * float(np.mean(np.abs(pred_a[ok] - peak_a[ok]) / peak_a[ok]))
    fit = float(np.sum(pred_a[ok] * held_a[ok]) / np.sum(pred_a[ok] ** 2))
    pm = np.array(pred_m, float)
    mape_measured = 100 * float(np.mean(np.abs(pm[ok] - held_a[ok]) / held_a[ok]))
    _plot_memory(rep, pred_a, held_a, peak_a)
    data = {
        "packs": int(ok.sum()),
        "mape_held_pct": mape_held,
        "mape_peak_pct": mape_peak,
        "measured_over_predicted": fit,
        "act_bytes_per_token": cm.act_bytes_per_token,
        "kv_bytes_per_token": cm.kv_bytes_per_token,
        "measured_act_bytes_per_token": act,
        "mape_held_pct_measured_act": mape_measured,
    }
    lines = [
        f"{shape.name} in {rep.dtype}, 3 held-out slimpack plans, after every forward pack:"
        " the solver's memory trace (`slimdata.solver.memory`, activation"
        f" {cm.act_bytes_per_token / 2**20:.2f} MiB/token + K/V {cm.kv_bytes_per_token / 2**10:.0f}"
        " KiB/token) against `torch.cuda.memory_allocated` above the step's start (model and"
        " gradients excluded, as in the budget).",
        "",
        f"- packs: {int(ok.sum())}",
        f"- MAPE, held bytes: **{mape_held:.1f}%**",
        f"- MAPE against the pack's peak (`max_memory_allocated`): {mape_peak:.1f}%",
        f"- least-squares measured / predicted: {fit:.3f}",
        f"- with the activation bytes `slimdata profile` measures ({act / 2**20:.2f} MiB/token):"
        f" MAPE, held bytes **{mape_measured:.1f}%**",
        "",
        "![memory](memory_fidelity.png)",
    ]
    rep.section("Memory fidelity", "memory", data, lines)


def _plot_memory(rep: Report, pred: np.ndarray, held: np.ndarray, peak: np.ndarray) -> None:
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter(held / GIB, pred / GIB, s=12, label="held after forward pack")
    ax.scatter(peak / GIB, pred / GIB, s=12, marker="x", label="peak during pack")
    lim = [0, max(held.max(), peak.max(), pred.max()) / GIB * 1.05]
    ax.plot(lim, lim, "k:", lw=1)
    ax.set(xlabel="measured GiB", ylabel="predicted GiB (solver memory trace)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(rep.out / "memory_fidelity.png", dpi=120)
    plt.close(fig)


# -- 6. measured speedup -------------------------------------------------------------------------
def speedup(
    rep: Report, models: dict[str, CostModel], shards: str | None, dp: int, context: int
) -> None:
    shape_name = "llama-8b-4layers" if not rep.quick else "q"
    if shards is None or shape_name not in models:
        return
    cm = models[shape_name]
    eight = MODEL_PRESETS["llama-8b"]
    shape = dataclasses.replace(eight, name=shape_name, layers=4, vocab=129280)
    if rep.quick:
        shape = ModelConfig(
            name="q", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=129280
        )
    dp, context = sizes(rep.quick, (dp, context), (2, 1024))
    layout = Layout(dp=dp, context=context, memory_gib=sizes(rep.quick, 16.0, 1.0))
    docs, tokens = _shard_batches(shards, layout, steps=STEPS)
    model = _hf_model(shape, rep)
    results = {}
    for strategy in (*SAME_WORK, "concat"):
        results[strategy] = _run_strategy(model, strategy, docs, tokens, layout, cm)
    _report_speedup(rep, results, layout, shape)


def _shard_batches(shards: str, layout: Layout, steps: int):
    """The epoch's first ``steps`` global batches of the shards and the tokens of every
    sample they draw from, by sample index."""
    from streaming import StreamingDataset

    all_docs = apply_oversize(load_shard_documents(shards), layout.context, "split")
    batches = make_batches(all_docs, layout.dp * layout.context, seed=0)
    batches = batches[:steps]  # the epoch's first batches: documents in random order
    ds = StreamingDataset(local=shards, shuffle=False, batch_size=1)
    samples = {d.sample for b in batches for d in b}
    return batches, {i: np.asarray(ds[i]["tokens"]) for i in sorted(samples)}


def _run_strategy(model, strategy, batches, tokens, layout, cm) -> dict:
    measured, predicted, simulated, ntok, pairs = [], [], [], 0, 0.0
    for step, batch in enumerate(batches):
        # one process runs every rank: no DP-Merge groups (they need a process per rank)
        opts = SolveOptions().forced_merges_only() if strategy == "slimpack" else SolveOptions()
        plan = solve(batch, layout, strategy, seed=step, cost=cm, options=opts)
        # a strategy that cuts documents plans pieces: each its sample's tokens from its offset
        toks = [tokens[d.sample][d.offset : d.offset + d.length] for d in plan.docs]
        per_rank = []
        for r in range(plan.dp):
            payload = make_payload(plan, r, toks)
            run_step(model, payload) if step == 0 and r == 0 else None  # warm-up
            model.zero_grad(set_to_none=False)
            per_rank.append(run_step(model, payload).seconds)
        pt = pack_times(plan, cm, split=True)
        measured.append(max(per_rank))
        predicted.append(
            max(
                sum(pt.forward_of(r, i) for i in range(len(rs.forward)))
                + sum(pt.backward_of(r, j) for j in range(len(rs.backward)))
                for r, rs in enumerate(plan.ranks)
            )
        )
        simulated.append(simulate_step(plan, cm, layout, SimConfig()).step_time)
        ntok += sum(rs.tokens for rs in plan.ranks)
        pairs += sum(
            float(causal_pairs(s.start, s.end))
            for rs in plan.ranks
            for p in rs.forward
            for s in p.slices
        )
    return {
        "measured_s": sum(measured),
        "predicted_compute_s": sum(predicted),
        "simulated_step_s": sum(simulated),
        "tokens": ntok,
        "attention_pairs": pairs,
        "tokens_per_s": ntok / sum(measured),
    }


def _report_speedup(rep: Report, results: dict, layout: Layout, shape: ModelConfig) -> None:
    base = min((s for s in SAME_WORK if s != "slimpack"), key=lambda s: results[s]["measured_s"])
    base_pred = min(
        (s for s in SAME_WORK if s != "slimpack"), key=lambda s: results[s]["predicted_compute_s"]
    )
    sp = results["slimpack"]
    meas = results[base]["measured_s"] / sp["measured_s"]
    pred = results[base_pred]["predicted_compute_s"] / sp["predicted_compute_s"]
    lines = [
        f"Model {shape.name} ({shape.layers} layers, hidden {shape.hidden}), {rep.dtype};"
        f" DP {layout.dp} ranks run one after another on the one GPU (the step is the slowest"
        f" rank; the gradient all-reduce is not measured), context {layout.context},"
        f" {layout.memory_gib:g} GiB activation budget for every strategy; slimpack without"
        f" DP-Merge (one process runs every rank); the first {STEPS} global batches of"
        " the bundled-corpus shards (documents shuffled, split at the context). Predicted: the profiled cost"
        " model's per-rank pack times (slowest rank), and the simulator's step (all-reduce"
        " included).",
        "",
        "| strategy | same work | measured s | tokens/s | predicted compute s | simulated step s | attention pairs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {'yes' if name in SAME_WORK else 'no (cuts documents)'} |"
            f" {r['measured_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['predicted_compute_s']:.3f} |"
            f" {r['simulated_step_s']:.3f} | {r['attention_pairs']:.3e} |"
        )
    lines += [
        "",
        f"- slimpack vs the best same-work baseline measured ({base}): **{meas:.3f}x**",
        f"- predicted (best predicted baseline, {base_pred}): **{pred:.3f}x**",
        f"- measured / predicted speedup: {meas / pred:.3f}",
    ]
    data = {
        "results": results,
        "best_baseline": base,
        "speedup_measured": meas,
        "speedup_predicted": pred,
    }
    rep.section(
        f"Measured speedup, DP {layout.dp}, context {layout.context}",
        f"speedup_dp{layout.dp}_context{layout.context}",
        data,
        lines,
    )


def _load_profiles(directory: str | None) -> dict[str, CostModel]:
    if directory is None:
        return {}
    return {
        p.stem.removeprefix("profile-"): CostModel.load(p)
        for p in sorted(Path(directory).glob("profile-*.json"))
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="report directory (report.md, PNGs, results.json)")
    ap.add_argument("--shards", default=None, help="slimdata build output for the speedup section")
    ap.add_argument(
        "--quick", action="store_true", help="tiny sizes (CPU allowed): checks the script"
    )
    ap.add_argument("--sections", default="env,equivalence,curve,profile,memory,speedup")
    ap.add_argument(
        "--speedup-layouts",
        default="4:16384",
        help="DP ranks:context of each speedup measurement, comma-separated",
    )
    ap.add_argument(
        "--profiles",
        default=None,
        help="directory of profile-<model>.json from an earlier run: memory and speedup use"
        " them when the profile section is not run",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        raise SystemExit("Error: no CUDA device; use --quick to check the script on CPU")
    hf.register()
    rep = Report(
        Path(args.out),
        "cuda" if cuda else "cpu",
        torch.bfloat16 if cuda else torch.float32,
        args.quick,
    )
    todo = set(args.sections.split(","))
    environment(rep)
    if "equivalence" in todo:
        equivalence(rep)
    # the measured speedup as early as its cost model allows: a run cut short by the device's
    # time limit loses the sections after it, each written as soon as it is done
    profiled = "profile" in todo
    models = profile_models(rep, slice(0, 1)) if profiled else _load_profiles(args.profiles)
    if "speedup" in todo:
        for layout in args.speedup_layouts.split(","):
            dp, context = (int(x) for x in layout.split(":"))
            speedup(rep, models, args.shards, dp, context)
    if profiled:
        models |= profile_models(rep, slice(1, None))
    if "memory" in todo:
        memory_fidelity(rep, models)
    if "curve" in todo:
        attention_curve(rep)


if __name__ == "__main__":
    main()
