"""GPU checks (``pytest -m gpu``, run by ``make gpu-check``): attention kernels and bf16
equivalence on a CUDA device. Deselected by default (``-m "not gpu"`` in pyproject); on a
machine without CUDA, ``pytest -m gpu`` fails instead of skipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpu_workers import TWO_PROCESSES
from slimdata.hooks.attention import (
    BACKENDS,
    VarlenBatch,
    get_backend,
    resolve_backend,
    sdpa_varlen,
)
from slimdata.hooks.profile import tiny_llama
from slimdata.hooks.verify import equivalence_report, grad_error, run_plan, whole_document_plan

from slimdata.cost import CostModel, ModelConfig
from slimdata.docsource import documents_from_lengths
from slimdata.solver import Layout, SolveOptions, solve

pytestmark = pytest.mark.gpu

FAST = [b for b in ("flash", "torch-varlen") if b in BACKENDS]


@pytest.fixture(scope="module", autouse=True)
def cuda():
    assert torch.cuda.is_available(), "pytest -m gpu needs a CUDA device"


def test_auto_picks_a_linear_memory_kernel_for_bf16():
    assert FAST, "neither flash-attn nor torch>=2.10 varlen attention is available"
    assert resolve_backend("auto", "cuda", torch.bfloat16) == FAST[0]
    assert resolve_backend("auto", "cuda", torch.float32) == "sdpa"


@pytest.mark.parametrize("backend", FAST)
def test_fast_backend_matches_fp32_reference_with_prefix_and_gqa(backend):
    # three sequences: a 3-query slice after 6 prefix keys, a whole 300-token document, a
    # 700-query slice after 1300 prefix keys (slice continuation), 8 query heads on 2 kv heads
    g = torch.Generator(device="cuda").manual_seed(0)
    lq, lk = [3, 300, 700], [9, 300, 2000]
    q = torch.randn(sum(lq), 8, 128, generator=g, device="cuda", requires_grad=True)
    k, v = (
        torch.randn(sum(lk), 2, 128, generator=g, device="cuda", requires_grad=True) for _ in "kv"
    )
    b = VarlenBatch.from_lengths(lq, lk, device="cuda")
    do = torch.randn(sum(lq), 8, 128, generator=g, device="cuda")
    ref = sdpa_varlen(q, k, v, b, 128**-0.5)
    ref_grads = torch.autograd.grad(ref, (q, k, v), do)
    half = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    out = get_backend(backend)(*half, b, 128**-0.5)
    grads = torch.autograd.grad(out, half, do.bfloat16())
    # bf16 inputs round to 2^-9 relative; the fp32 reference sees the unrounded inputs
    assert (out.float() - ref).norm() / ref.norm() < 1e-2
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got.float() - want).norm() / want.norm() < 2e-2


SHAPE = ModelConfig(name="t", layers=3, hidden=512, heads=8, kv_heads=2, ffn=1376, vocab=1024)


def _model(dtype):
    return tiny_llama(SHAPE, "cuda", str(dtype).removeprefix("torch."))


def _case(lengths, dp, mode="free"):
    """A slimpack plan (slices of 256 tokens, packs of <= 1024) and the documents' tokens."""
    docs = documents_from_lengths(lengths, slice_tokens=256)
    layout = Layout(dp=dp, context=1 << 16, pack_tokens=1024, memory_gib=1e3, mode=mode)
    cost = CostModel.analytic(SHAPE, "h100", "none")
    # no DP-Merge: verify runs the ranks in sequence in one process
    no_merges = SolveOptions().forced_merges_only()
    plan = solve(docs, layout, "slimpack", seed=0, cost=cost, options=no_merges)
    rng = np.random.default_rng(0)
    return plan, [rng.integers(0, 1024, d.length).astype(np.uint32) for d in plan.docs]


LENGTHS = [3000, 1900, 700, 640, 300, 129, 40, 1]


def _sliced_and_asymmetric(plan):
    rs = plan.ranks
    sliced = any(s.start > 0 for r in rs for p in r.forward for s in p.slices)
    asym = any(set(r.forward) != set(r.backward) for r in rs)
    return sliced, asym


def test_fp32_on_gpu_matches_the_unpacked_reference_to_1e5():
    plan, toks = _case(LENGTHS, dp=2)
    assert _sliced_and_asymmetric(plan)[0]
    model = _model(torch.float32)
    loss_ref, ref = run_plan(model, whole_document_plan(plan.docs), toks)
    loss, got = run_plan(model, plan, toks)
    assert abs(loss - loss_ref) / loss_ref < 1e-5
    assert grad_error(got, ref) < 1e-5


@pytest.mark.parametrize("mode", ["free", "lockstep"])
def test_bf16_packed_error_is_within_the_repacking_noise(mode):
    # tolerance: 4x the error between two whole-document packings of the same tokens (the
    # noise of the summation order alone), and never above 2^-6 (a few bf16 units, 2^-9 each,
    # accumulated over the layers)
    plan, toks = _case(LENGTHS, dp=2, mode=mode)
    rep = equivalence_report(_model(torch.bfloat16), plan, toks)
    noise, packed = rep["noise"], rep["packed"]
    assert packed["grad"] <= max(4 * noise["grad"], 2**-9), rep
    assert packed["grad"] < 2**-6, rep
    assert packed["loss"] <= max(4 * noise["loss"], 2**-9), rep


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(TWO_PROCESSES))
def test_two_processes_on_one_gpu_match_the_unpacked_reference(case, dtype):
    # the cases and what each runs: gpu_workers.TWO_PROCESSES (shared with the GPU report)
    from slimdata.hooks.distributed import run_distributed

    worker, args = TWO_PROCESSES[case]
    res = run_distributed(worker, 2, "cuda", dtype, *args, timeout_s=300)
    shares, refs, errs, noise, used = zip(*res, strict=True)
    assert min(used) >= 1  # merge groups, or slices cut from a document: the feature ran
    assert sum(shares) == pytest.approx(refs[0], rel=1e-5 if dtype == "float32" else 1e-2)
    if dtype == "float32":
        assert max(errs) < 1e-5
    else:
        assert max(errs) <= max(4 * max(noise), 2**-9), res
