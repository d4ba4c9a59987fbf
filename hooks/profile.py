"""``slimdata profile``: measure forward/backward time on this device and fit the cost model.

For a model config (preset or JSON) the profiler builds a random-init Llama-style model
(``transformers.LlamaForCausalLM``, attention through slimdata's registered function) and
times, with the step executor itself, a pack of ``k`` slices ``[start, start + s)`` of ``k``
documents, each continuing a prefix of ``start`` tokens, over a grid of ``(s, start, k)``.
Each point is the median of ``repeats`` runs (or their minimum, ``--stat min``); the repeats
go round the whole grid after a warm-up round (:func:`round_robin`), so machine drift hits
every point alike. The pack times of forward and backward are fitted by least squares on the
separate terms of the cost model (design §5)::

    time = lin * k*s + att * k*pairs + slice_const * k + pack_const
    pairs = s * start + s * (s + 1) / 2

with non-negative coefficients (a negative term is dropped and the rest refitted), relative
residuals. ``pack_const`` (one model call per pack) goes to ``CostModel.fwd_pack_const`` /
``bwd_pack_const``; with ``--pack-sizes 1`` the two constants cannot be told apart and all of
it is per slice. The activation bytes per token are measured (:func:`measure_activation_bytes`,
``--no-measure-memory`` keeps the analytic value); the K/V bytes are the analytic model's.

Calibration (``--calibration-plans``, default 3): a few slimpack plans of random documents
run in the same rounds as the grid, and the fitted forward and backward coefficients are
scaled by the median ratio of their measured to predicted pack times. On the 2-core CPU VM
this work was developed on, a pack inside a plan ran about 4-5% slower than the same pack
timed on its own after identical lead packs (one diagnostic run over 16 plan packs; see
``docs/hooks.md``).

The output file is a :class:`~slimdata.cost.CostModel` JSON that ``CostModel.load`` and
``--cost-profile`` accept.

Assumes timings are stable on the device (close other jobs); on GPU the device is
synchronized around every pack.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from slimdata.cost import CostModel, ModelConfig, load_model_config
from slimdata.cost.profiling import ProfileConfig, profile_points

__all__ = [
    "CALIBRATION_RANGE",
    "ProfileConfig",
    "aggregate_points",
    "calibrate",
    "calibration_payloads",
    "calibration_warning",
    "fit_cost_model",
    "fit_nonneg",
    "fit_terms",
    "graph_free_scale",
    "plan_job",
    "point_jobs",
    "point_payload",
    "profile_cost_model",
    "profile_plan",
    "profile_points",
    "round_robin",
    "time_point",
    "tiny_llama",
    "write_profile",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


def tiny_llama(model: ModelConfig, device: str = "cpu", dtype: str = "float32"):
    """A random-init ``LlamaForCausalLM`` of ``model``'s shape using slimdata attention."""
    import torch
    from slimdata.hooks import hf
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=model.vocab,
        hidden_size=model.hidden,
        intermediate_size=model.ffn,
        num_hidden_layers=model.layers,
        num_attention_heads=model.heads,
        num_key_value_heads=model.kv_heads,
        max_position_embeddings=1 << 20,
        attn_implementation=hf.register(),
    )
    torch.manual_seed(0)
    net = LlamaForCausalLM(cfg)
    return net.to(device=device, dtype=getattr(torch, dtype))  # type: ignore[call-arg]


def profile_plan(start: int, s: int, k: int = 1, lead: int = 0, graph: bool = True):
    """Plan whose measured pack holds slice ``[start, start + s)`` of ``k`` documents; the
    prefixes ``[0, start)`` run in a pack before it (forward) and after it (backward). The
    measured pack comes last, after ``lead`` identical packs of other documents of the same
    step (each with its prefix pack), so it runs in the state of a pack inside a plan: the
    gradients already allocated, the previous pack's memory just freed.

    ``start=4, s=2, k=1, lead=1``: docs 0, 1 of 6 tokens; forward ``[0,4)`` of doc 0, ``[4,6)``
    of doc 0, backward ``[4,6)``, ``[0,4)``, then the same for doc 1, whose ``[4,6)`` is timed.

    ``graph=False`` (``k >= 2``): every pack of slices ``[start, start + s)`` runs its backward
    as two packs (its first ``k // 2`` slices, then the rest), so the executor runs its
    forward without a graph and the backward packs recompute it.
    """
    from slimdata.plan import Document, MicroPack, RankStep, Slice, StepPlan

    if not graph and k < 2:
        raise ValueError("a graph-free forward needs a pack of at least 2 slices")
    n = start + s
    fwd: list[MicroPack] = []
    bwd: list[MicroPack] = []
    order: list[tuple[str, int]] = []
    for c in range(lead + 1):
        docs = range(c * k, (c + 1) * k)
        tails = MicroPack(tuple(Slice(d, start, n) for d in docs))
        back = (
            [tails]
            if graph
            else [MicroPack(tails.slices[: k // 2]), MicroPack(tails.slices[k // 2 :])]
        )
        if start:
            fwd.append(MicroPack(tuple(Slice(d, 0, start) for d in docs)))
            order.append(("F", len(fwd) - 1))
        fwd.append(tails)
        order.append(("F", len(fwd) - 1))
        pick = (len(fwd) - 1, len(bwd))
        order += [("B", len(bwd) + i) for i in range(len(back) + (1 if start else 0))]
        bwd += back
        if start:
            bwd.append(fwd[-2])
    plan = StepPlan(
        step=0,
        strategy="profile",
        docs=tuple(Document(doc_id=d, length=n) for d in range((lead + 1) * k)),
        ranks=(RankStep(rank=0, forward=tuple(fwd), backward=tuple(bwd), order=tuple(order)),),
    )
    return plan.validate(), pick


def point_payload(
    model,
    point: tuple[int, int, int],
    rng: np.random.Generator,
    lead: int = 0,
    graph: bool = True,
):
    """``(payload, (forward pack, backward pack))`` that times ``point = (s, start, k)``
    after ``lead`` identical packs (:func:`profile_plan`)."""
    from slimdata.hooks import make_payload

    s, start, k = point
    plan, pick = profile_plan(start, s, k, lead, graph)
    vocab = model.config.vocab_size
    docs = [rng.integers(0, vocab, size=d.length).astype(np.uint32) for d in plan.docs]
    return make_payload(plan, 0, docs), pick


def time_point(model, payload, pick: tuple[int, int], backend: str = "auto") -> tuple[float, float]:
    """Forward and backward seconds of the measured packs ``pick`` in one run of ``payload``."""
    from slimdata.hooks import run_step

    model.zero_grad(set_to_none=True)
    # recompute: the graph-free variant (profile_plan(graph=False)) is timed as it runs
    ev = run_step(model, payload, backend=backend, asymmetric="recompute").events
    f = next(e.seconds for e in ev if e.pass_ == "F" and e.pack == pick[0])
    b = next(e.seconds for e in ev if e.pass_ == "B" and e.pack == pick[1])
    return f, b


def _time_variants(model, variants, backend: str) -> tuple[float, ...]:
    """``(fwd, bwd)`` of the first ``(payload, pick)``, then the forward of a graph-free one
    if given."""
    f, b = time_point(model, variants[0][0], variants[0][1], backend)
    return (f, b, *(time_point(model, p, pick, backend)[0] for p, pick in variants[1:]))


def _stderr_lines(on: bool) -> Callable[[str], None]:
    """A writer of ``profile: ...`` lines on standard error (nothing unless ``on``): what
    the profiler does before its progress bar starts."""

    def say(text: str) -> None:
        if on:
            print(f"profile: {text}", file=sys.stderr, flush=True)

    return say


def round_robin(
    jobs: Sequence[Callable[[], T]], repeats: int, progress: bool = False
) -> list[list[T]]:
    """``repeats`` results of every job, run in rounds (job 1, 2, ..., then again) after one
    discarded warm-up round, so a slow spell of a shared machine lands on every job alike
    instead of skewing a few; ``progress``: a bar of the runs done (standard error, on a
    terminal only: in a log it would be a run of carriage returns)."""
    from tqdm.auto import tqdm

    out: list[list[T]] = [[] for _ in jobs]
    hide = None if progress else True  # None: tqdm shows the bar on a terminal alone
    with tqdm(total=len(jobs) * (repeats + 1), desc="profile", disable=hide) as bar:
        for rep in range(repeats + 1):
            for acc, job in zip(out, jobs, strict=True):
                r = job()
                bar.update()
                if rep:
                    acc.append(r)
    return out


def point_jobs(
    model, config: ProfileConfig, points: Sequence[tuple[int, int, int]]
) -> list[Callable[[], tuple[float, ...]]]:
    """One timing job per point, for :func:`round_robin`: ``(fwd, bwd)`` of the measured
    pack, and for packs of 2 or more slices also its forward without a graph."""
    rng = np.random.default_rng(0)
    jobs: list[Callable[[], tuple[float, ...]]] = []
    for p in points:
        variants = [point_payload(model, p, rng, config.lead_packs)]
        if p[2] >= 2:
            variants.append(point_payload(model, p, rng, config.lead_packs, graph=False))
        jobs.append(functools.partial(_time_variants, model, variants, config.backend))
    return jobs


def aggregate_points(
    points: Sequence[tuple[int, int, int]],
    times: Sequence[Sequence[tuple[float, ...]]],
    stat: str = "median",
) -> list[dict]:
    """Rows ``{s, start, k, fwd, bwd[, fwd_graph_free]}`` (median or min over repeats) from
    each point's ``(fwd, bwd[, fwd_graph_free])`` timings."""
    agg = np.min if stat == "min" else np.median
    out = []
    for (s, start, k), ts in zip(points, times, strict=True):
        f, b = agg([t[0] for t in ts]), agg([t[1] for t in ts])
        row = {"s": s, "start": start, "k": k, "fwd": float(f), "bwd": float(b)}
        if len(ts[0]) > 2:
            row["fwd_graph_free"] = float(agg([t[2] for t in ts]))
        out.append(row)
        log.info("s=%d start=%d k=%d fwd=%.4fs bwd=%.4fs", s, start, k, f, b)
    return out


def fit_nonneg(columns: list[np.ndarray], t: np.ndarray) -> list[float]:
    """Non-negative least squares of ``t ~ sum c_i * columns[i]`` on relative residuals: a
    coefficient that comes out negative is dropped and the rest refitted."""
    t = np.asarray(t, float)
    cols = [np.asarray(c, float) for c in columns]
    active = list(range(len(cols)))
    w = 1.0 / np.maximum(t, 1e-12)  # fit relative error, as MAPE measures
    while True:
        A = np.stack([cols[i] for i in active], axis=1) * w[:, None]
        coef, *_ = np.linalg.lstsq(A, t * w, rcond=None)
        if (coef >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(coef)))
    full = [0.0] * len(cols)
    for i, c in zip(active, coef, strict=True):
        full[i] = max(float(c), 0.0)
    return full


def fit_terms(s, pairs, t, slices=None) -> tuple[float, ...]:
    """``(lin, att, const)`` of ``t ~ lin*s + att*pairs + const``; with ``slices`` (slices per
    pack) ``(lin, att, slice_const, pack_const)`` of ``... + slice_const*slices + pack_const``."""
    ones = np.ones(len(t))
    if slices is None:
        return tuple(fit_nonneg([s, pairs, ones], t))
    return tuple(fit_nonneg([s, pairs, slices, ones], t))


def fit_cost_model(
    model_cfg: ModelConfig, meas: list[dict], config: ProfileConfig = ProfileConfig()
) -> CostModel:
    """The :class:`CostModel` whose time coefficients fit the measurements ``meas`` (rows of
    :func:`aggregate_points`); memory coefficients are the analytic model's."""
    import torch

    from slimdata.cost import causal_pairs

    s = np.array([m["s"] for m in meas], dtype=float)
    start = np.array([m["start"] for m in meas], dtype=float)
    k = np.array([m["k"] for m in meas], dtype=float)
    pairs = causal_pairs(start, start + s)
    fwd_t, bwd_t = np.array([m["fwd"] for m in meas]), np.array([m["bwd"] for m in meas])
    if len(set(k.tolist())) > 1:
        fl, fa, fc, fp = fit_terms(k * s, k * pairs, fwd_t, k)
        bl, ba, bc, bp = fit_terms(k * s, k * pairs, bwd_t, k)
    else:  # one pack size: per-slice and per-pack constants are indistinguishable
        fl, fa, fc = fit_terms(k * s, k * pairs, fwd_t)
        bl, ba, bc = fit_terms(k * s, k * pairs, bwd_t)
        fp = bp = 0.0
    dtype_bytes = torch.empty(0, dtype=getattr(torch, config.dtype)).element_size()
    analytic = CostModel.analytic(
        dataclasses.replace(model_cfg, dtype_bytes=dtype_bytes), "h100", "none"
    )
    dev = torch.cuda.get_device_name() if config.device.startswith("cuda") else "cpu"
    return dataclasses.replace(
        analytic,
        fwd_lin=fl,
        fwd_att=fa,
        fwd_const=fc,
        bwd_lin=bl,
        bwd_att=ba,
        bwd_const=bc,
        fwd_pack_const=fp,
        bwd_pack_const=bp,
        graph_free_scale=graph_free_scale(meas),
        recompute="none",  # the runtime it timed runs no recompute
        source=f"profile:{dev}",
        label=f"{model_cfg.name}@{dev}/{config.dtype}",
    )


def graph_free_scale(meas: Sequence[dict]) -> float:
    """Median ratio of a pack's forward without and with its graph over the rows that timed
    both (``fwd_graph_free``); 1.0 when none did (a grid of 1-slice packs only)."""
    r = [m["fwd_graph_free"] / m["fwd"] for m in meas if "fwd_graph_free" in m and m["fwd"] > 0]
    return float(np.median(r)) if r else 1.0


def calibration_payloads(model_cfg: ModelConfig, config: ProfileConfig, seed: int = 2027):
    """``config.calibration_plans`` one-rank slimpack plans (with their payloads) over 12
    documents each, lengths log-uniform between the grid's smallest slice and three times its
    largest, packs of up to the largest slice (at least 128 tokens), slices of a quarter of
    that (a multiple of 128, at least 128). The plans are solved with the analytic model:
    they only need realistic packs."""
    from slimdata.hooks import make_payload

    from slimdata.docsource import documents_from_lengths
    from slimdata.solver import Layout, solve

    rng = np.random.default_rng(seed)
    cap = max(128, -(-max(config.slice_tokens) // 128) * 128)
    cut = max(128, cap // 4 // 128 * 128)
    layout = Layout(dp=1, context=cap, pack_tokens=cap, memory_gib=config.calibration_memory_gib)
    analytic = CostModel.analytic(model_cfg, "h100", "none")
    out = []
    for i in range(config.calibration_plans):
        lengths = np.exp(rng.uniform(np.log(min(config.slice_tokens)), np.log(3 * cap), 12))
        docs = documents_from_lengths(lengths.astype(int).tolist(), slice_tokens=cut)
        plan = solve(docs, layout, "slimpack", seed=i, cost=analytic)
        toks = [rng.integers(0, model_cfg.vocab, d.length).astype(np.uint32) for d in plan.docs]
        out.append((plan, make_payload(plan, 0, toks)))
    return out


def plan_job(model, payload, backend: str = "auto") -> Callable[[], dict]:
    """A :func:`round_robin` job: ``{(pass, pack): seconds}`` of one run of ``payload``."""
    from slimdata.hooks import run_step

    def run() -> dict:
        model.zero_grad(set_to_none=True)
        ev = run_step(model, payload, backend=backend).events
        return {(e.pass_, e.pack): e.seconds for e in ev}

    return run


def calibrate(
    cm: CostModel, plans: Sequence, runs: Sequence[Sequence[dict]], stat: str = "median"
) -> tuple[CostModel, float, float]:
    """``cm`` with its forward and backward time coefficients scaled by the median ratio of
    measured to predicted time over the packs of ``plans`` (``runs``: each plan's
    :func:`plan_job` results; predictions: :func:`slimdata.execution.pack_times` as the executor
    runs the packs). Returns ``(model, forward scale, backward scale)``; ``(cm, 1, 1)`` when
    there is nothing to compare."""
    from slimdata.execution import pack_times

    agg = np.min if stat == "min" else np.median
    ratios: dict[str, list[float]] = {"F": [], "B": []}
    for plan, rr in zip(plans, runs, strict=True):
        pt = pack_times(plan, cm, split=True)
        for (p, i), _ in rr[0].items():
            pred = pt.forward_of(0, i) if p == "F" else pt.backward_of(0, i)
            if pred > 0:
                ratios[p].append(float(agg([r[(p, i)] for r in rr])) / pred)
    if not ratios["F"] or not ratios["B"]:
        return cm, 1.0, 1.0
    f, b = float(np.median(ratios["F"])), float(np.median(ratios["B"]))
    scaled = dataclasses.replace(
        cm,
        fwd_lin=cm.fwd_lin * f,
        fwd_att=cm.fwd_att * f,
        fwd_const=cm.fwd_const * f,
        fwd_pack_const=cm.fwd_pack_const * f,
        bwd_lin=cm.bwd_lin * b,
        bwd_att=cm.bwd_att * b,
        bwd_const=cm.bwd_const * b,
        bwd_pack_const=cm.bwd_pack_const * b,
    )
    log.info("calibration over %d plans: forward x%.3f, backward x%.3f", len(plans), f, b)
    return scaled, f, b


def measure_activation_bytes(
    model,
    cost: CostModel,
    sizes: Sequence[tuple[int, int]],
    backend: str = "auto",
    recompute: str = "none",
) -> float:
    """Activation bytes per token the memory model should use for ``model``: the bytes
    autograd holds after a forward pack of ``k`` whole documents of ``s`` tokens, for every
    ``(s, k)`` of ``sizes``, fitted as ``slope * tokens`` (least squares through 0, the memory
    model's form), minus ``cost.kv_bytes_per_token``, which the memory trace adds for the
    same tokens (:func:`slimdata.solver.memory.rank_memory_trace`). Counted by
    :class:`~slimdata.hooks.memory.SavedTensorMeter` (parameters excluded), on any device,
    with the packs run under ``recompute`` (:func:`~slimdata.hooks.run_step`)."""
    from slimdata.hooks import Callback, run_step
    from slimdata.hooks.memory import SavedTensorMeter

    class AfterForward(Callback):  # the plan runs one forward pack, then its backward
        def on_pack_end(self, event) -> None:
            if event.pass_ == "F":
                held.append(float(meter.live))

    rng = np.random.default_rng(0)
    tokens: list[float] = []
    held: list[float] = []
    for s, k in sizes:
        payload, _ = point_payload(model, (s, 0, k), rng)
        meter = SavedTensorMeter(model.parameters())
        model.zero_grad(set_to_none=True)
        with meter.watch():
            run_step(
                model, payload, backend=backend, callbacks=[AfterForward()], recompute=recompute
            )
        tokens.append(float(s * k))
    t, b = np.array(tokens), np.array(held)
    slope = float(t @ b / (t @ t))
    return max(slope - cost.kv_bytes_per_token, 0.0)


def profile_cost_model(
    model_cfg: ModelConfig, config: ProfileConfig = ProfileConfig(), progress: bool = False
) -> tuple[CostModel, list[dict], dict]:
    """Measure and fit; returns the fitted (and calibrated) :class:`CostModel`, the raw grid
    measurements and the calibration ``{"plans", "forward_scale", "backward_scale"}``;
    ``progress``: a bar of the timed runs."""
    say = _stderr_lines(progress)
    points = profile_points(config)
    say(
        f"building the model and the payloads of {len(points)} grid points and "
        f"{config.calibration_plans} calibration plans"
    )
    model = tiny_llama(model_cfg, config.device, config.dtype)
    plans = calibration_payloads(model_cfg, config)
    jobs: list[Callable[[], Any]] = [*point_jobs(model, config, points)]
    jobs += [plan_job(model, payload, config.backend) for _, payload in plans]
    largest = max(range(len(points)), key=lambda i: (points[i][0] + points[i][1]) * points[i][2])
    s, start, k = points[largest]
    say(f"warming up twice on the largest grid point ({k} x {s} tokens after {start})")
    for _ in range(2):  # first calls pay lazy initialisation
        jobs[largest]()
    results = round_robin(jobs, config.repeats, progress)
    meas = aggregate_points(points, results[: len(points)], config.stat)
    cm = fit_cost_model(model_cfg, meas, config)
    cm, f, b = calibrate(cm, [p for p, _ in plans], results[len(points) :], config.stat)
    if config.measure_memory:
        sizes = sorted({(s, k) for s, _, k in points})
        act = measure_activation_bytes(model, cm, sizes, config.backend)
        cm = dataclasses.replace(cm, act_bytes_per_token=act)
    return cm, meas, {"plans": len(plans), "forward_scale": f, "backward_scale": b}


def write_profile(
    model_spec: str,
    output: str,
    config: ProfileConfig,
    measurements: str | None = None,
    progress: bool = False,
) -> str:
    """Profile ``model_spec`` (a preset or a JSON config) under ``config``, write the cost
    profile to ``output`` (and the raw timings to ``measurements``); return a one-line summary
    (what ``slimdata profile`` prints). ``progress``: a bar of the timed runs."""
    cm, meas, cal = profile_cost_model(load_model_config(model_spec), config, progress)
    cm.save(output)
    if measurements:
        Path(measurements).write_text(json.dumps({"points": meas, "calibration": cal}, indent=1))
    warning = calibration_warning(cal["forward_scale"], cal["backward_scale"])
    return (
        f"wrote {output}: fwd = {cm.fwd_lin:.3e}*s + {cm.fwd_att:.3e}*pairs + {cm.fwd_const:.3e}/slice"
        f" + {cm.fwd_pack_const:.3e}/pack; bwd = {cm.bwd_lin:.3e}*s + {cm.bwd_att:.3e}*pairs"
        f" + {cm.bwd_const:.3e}/slice + {cm.bwd_pack_const:.3e}/pack; graph-free forward"
        f" x{cm.graph_free_scale:.3f} ({len(meas)} points; calibrated on {cal['plans']} plans:"
        f" forward x{cal['forward_scale']:.3f}, backward x{cal['backward_scale']:.3f})"
        + (f"\nwarning: {warning}" if warning else "")
    )


CALIBRATION_RANGE = (0.8, 1.25)
"""Calibration scales outside this range mean the grid's fit does not predict the plans' pack
times (on an idle machine they came out 0.96-1.06: ``benchmarks/RESULTS.md``)."""


def calibration_warning(forward: float, backward: float) -> str | None:
    """Why a profile whose calibration scaled its fit by ``forward`` / ``backward`` may not
    predict this device's packs, or None when both are within :data:`CALIBRATION_RANGE`."""
    lo, hi = CALIBRATION_RANGE
    if lo <= forward <= hi and lo <= backward <= hi:
        return None
    return (
        f"the calibration plans ran x{forward:.2f} (forward) and x{backward:.2f} (backward) "
        f"the grid's fit, outside {lo}-{hi}: the machine was busy or the grid misses these "
        "pack sizes; re-run on an idle device, or with --stat min and more --repeats"
    )
