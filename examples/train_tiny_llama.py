"""Train a tiny Llama-style model on SlimPack plans with slimdata's runtime hooks.

Two CPU ranks, gloo, through torchrun::

    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --steps 6 --check
    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --steps 6 --check --memory-gib 0.008   # with DP-Merge
    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --shards demo-out --check   # after `make demo`

Same data, two strategies, one loss plot (the curves coincide: packing changes the schedule,
not the math)::

    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --shards demo-out --steps 300 --telemetry slimpack.jsonl
    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --shards demo-out --steps 300 --strategy bfd --telemetry bfd.jsonl
    python examples/plot_training.py slimpack=slimpack.jsonl bfd=bfd.jsonl --out plots

Every rank builds the same random-init ``LlamaForCausalLM`` from a config (no downloads),
wraps it in DDP (``--fsdp``: FSDP2, ``fully_shard`` per decoder layer and at the root, on
lockstep plans), and for every step: reads this rank's :class:`StepPayload` from document
shards (``DocumentLoader``: same global batch and plan on every rank, own tokens read by
index), runs ``run_step`` (slice continuation, asymmetric backward packs, DP-Merge over gloo
subgroups), and takes an AdamW step. ``--check`` recomputes every step's loss and gradients
with the *unpacked* reference (every document whole, Hugging Face eager attention) and exits
non-zero if the max relative gradient error exceeds ``--tol``. ``--checkpoint FILE`` saves
the model, the optimizer and the loader's position after the run and, when ``FILE`` exists,
resumes from it: 3 steps, then 3 more from the checkpoint, print the same lines as 6 steps
in one run::

    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --steps 3 --checkpoint ck.pt
    torchrun --nproc-per-node 2 examples/train_tiny_llama.py --steps 3 --checkpoint ck.pt

Without ``--shards`` rank 0 writes small synthetic document shards (long-tailed lengths,
random tokens) to a temporary directory. Their documents fit one rank under the default
``--memory-gib 1``, and the analytic cost model of so small a model finds no merge that
pays, so no step merges; with ``--memory-gib 0.008`` step 4's longest document (1,024
tokens) no longer fits one rank and runs DP-Merge over both, which ``--check`` then covers. Token ids are folded into the tiny model's
vocabulary (``id % --vocab``): the demo exercises the mechanics, not language modelling.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from slimdata.hooks import (
    BalanceMeter,
    PackTimeRecorder,
    StepTelemetry,
    hf,
    hf_forward,
    run_step,
)
from slimdata.hooks.loader import DocumentLoader, LoaderConfig, documents_of
from torch.nn.parallel import DistributedDataParallel

from slimdata.docsource import load_shard_documents
from slimdata.errors import SlimdataError
from slimdata.slicing import slice_cuts
from slimdata.solver import Layout


def synthetic_shards(out: Path, n_docs: int, seed: int) -> None:
    from streaming import MDSWriter

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(4.3, 1.4, size=n_docs).astype(int), 2, 1500)
    cols = {
        "tokens": "ndarray:uint32",
        "slices": "ndarray:uint32",
        "length": "int",
        "doc_id": "str",
        "source": "str",
    }
    with MDSWriter(out=str(out), columns=cols) as w:
        for i, n in enumerate(lengths.tolist()):
            t = rng.integers(0, 1 << 15, size=n).astype(np.uint32)
            w.write(
                {
                    "tokens": t,
                    "slices": slice_cuts(n, 128).astype(np.uint32),
                    "length": n,
                    "doc_id": f"syn{i}",
                    "source": "synthetic",
                }
            )


def build_model(vocab: int, attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1 << 16,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


class Folded:
    """A dataset view that folds token ids into the model's vocabulary."""

    def __init__(self, ds, vocab: int) -> None:
        self.ds, self.vocab, self.num_samples = ds, vocab, ds.num_samples

    def __getitem__(self, i: int) -> dict:
        s = dict(self.ds[i])
        s["tokens"] = np.asarray(s["tokens"]) % self.vocab
        return s


def reference(model, payload, dataset) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the unpacked global batch (every document whole)."""
    plan = payload.plan
    model.zero_grad(set_to_none=True)
    total = 0.0
    for d in plan.docs:
        ids = torch.as_tensor(
            np.asarray(dataset[d.sample]["tokens"][d.offset : d.offset + d.length], dtype=np.int64)
        )
        logits = hf_forward(model, ids, torch.arange(len(ids)))
        loss = torch.nn.functional.cross_entropy(
            logits[:-1].float(), ids[1:], reduction="sum"
        ) / max(plan.loss_tokens, 1)
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def wrap(model, fsdp: bool, world: int):
    """The model under DDP, or FSDP2 (``fully_shard`` per decoder layer, then the root)."""
    if not fsdp:
        return DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full_grads(model) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (FSDP2's sharded ones gathered)."""
    return {
        n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def full_state(model) -> dict[str, torch.Tensor]:
    """The whole model state on every rank (FSDP2's shards gathered)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def save_checkpoint(path: str, model, opt, loader, rank: int) -> None:
    """Model, optimizer (whole, from every shard) and the loader's position; rank 0 writes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, opt_state = get_state_dict(model, opt, options=whole)
    if rank == 0:
        tmp = f"{path}.tmp"
        torch.save({"model": model_state, "optim": opt_state, "loader": loader.state_dict()}, tmp)
        os.replace(tmp, path)  # a run killed while saving leaves the last checkpoint whole
    dist.barrier()


def load_checkpoint(path: str, model, opt, loader) -> None:
    """:func:`save_checkpoint`'s state into the wrapped model, its optimizer and the loader."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = torch.load(path, weights_only=False)
    whole = StateDictOptions(full_state_dict=True)
    set_state_dict(
        model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"], options=whole
    )
    loader.load_state_dict(state["loader"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shards", default=None, help="document shards from `slimdata build` (default: synthetic)"
    )
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--global-batch-tokens", type=int, default=1536)
    ap.add_argument("--strategy", default="slimpack")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument(
        "--max-docs", type=int, default=200, help="use the first N documents of the shards"
    )
    ap.add_argument(
        "--memory-gib",
        type=float,
        default=1.0,
        help="per-rank budget for activations and K/V: small enough and the longest documents "
        "merge over both ranks (DP-Merge), e.g. 0.002",
    )
    ap.add_argument(
        "--fsdp", action="store_true", help="FSDP2 (fully_shard) on lockstep plans instead of DDP"
    )
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="save model, optimizer and loader position here after the run; resume from it "
        "when it exists",
    )
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--check", action="store_true", help="compare every step with the unpacked reference"
    )
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--pack-times", default=None, help="append per-pack JSON lines here")
    ap.add_argument(
        "--telemetry",
        default=None,
        help="append one StepTelemetry JSON line per step here (rank 0)",
    )
    args = ap.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    tmp = None
    shards = args.shards
    if shards is None:
        tmp = tempfile.mkdtemp(prefix="slimdata-demo-") if rank == 0 else None
        box = [tmp]
        dist.broadcast_object_list(box, src=0)
        shards = str(Path(box[0]) / "shards")
        if rank == 0:
            synthetic_shards(Path(shards), args.max_docs, args.seed)
        dist.barrier()

    from streaming import StreamingDataset

    ds = Folded(StreamingDataset(local=shards, shuffle=False, batch_size=1), args.vocab)
    docs = (
        load_shard_documents(shards)
        if (Path(shards) / "manifest.parquet").exists()
        else documents_of(ds)
    )
    docs = docs[: args.max_docs]
    model = build_model(args.vocab, hf.register())
    ref_model = build_model(args.vocab, "eager") if args.check else None
    # packs hold at least the largest slice of the shards (2048 tokens in a default build)
    pack = max(512, max(b - a for d in docs for a, b in itertools.pairwise(d.cuts)))
    config = LoaderConfig(
        layout=Layout(
            dp=world,
            ranks_per_node=world,
            context=max(1024, pack),
            pack_tokens=pack,
            memory_gib=args.memory_gib,
            mode="lockstep" if args.fsdp else "free",
        ),
        global_batch_tokens=max(args.global_batch_tokens, pack),
        strategy=args.strategy,
        seed=args.seed,
        oversize="split",
        model=model,  # cost model derived from the model's config (no recompute)
    )
    loader = DocumentLoader(ds, rank=rank, config=config, documents=docs)

    wrapped = wrap(model, args.fsdp, world)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.checkpoint and Path(args.checkpoint).exists():
        load_checkpoint(args.checkpoint, model, opt, loader)
    meter = BalanceMeter()
    callbacks = [meter] + ([PackTimeRecorder(args.pack_times)] if args.pack_times else [])
    if args.telemetry:
        callbacks.append(StepTelemetry(log=args.telemetry, progress=None))
    worst, t0, steps = 0.0, time.perf_counter(), 0
    # the loader hands out a step's payload when it is asked for one: asked only for the steps
    # run, its position (``state_dict``) is the next step to run
    for payload in itertools.islice(loader, args.steps):
        opt.zero_grad(set_to_none=True)
        summary = run_step(wrapped, payload, callbacks=callbacks)
        loss = torch.tensor([summary.loss])
        dist.all_reduce(loss)
        line = {
            "step": payload.plan.step,
            "loss": round(float(loss), 6),
            "docs": len(payload.plan.docs),
            "merges": len(payload.plan.merges),
        }
        line.update({k: meter.history[-1][k] for k in ("tokens", "tokens_per_s", "imbalance")})
        if ref_model is not None:
            ref_model.load_state_dict(full_state(model))
            ref_loss, ref = reference(ref_model, payload, ds)
            err = max(
                (g - ref[n]).abs().max().item() / ref[n].abs().max().item()
                for n, g in full_grads(model).items()
            )
            line.update(ref_loss=round(ref_loss, 6), max_rel_grad_err=err)
            worst = max(worst, err, abs(float(loss) - ref_loss) / max(abs(ref_loss), 1e-12))
        opt.step()
        steps += 1
        if rank == 0:
            print(json.dumps(line), flush=True)
    if rank == 0:
        print(
            json.dumps(
                {
                    "steps": steps,
                    "seconds": round(time.perf_counter() - t0, 2),
                    "worst_rel_err": worst,
                }
            ),
            flush=True,
        )
    if args.checkpoint:
        save_checkpoint(args.checkpoint, model, opt, loader, rank)
    ok = not args.check or worst <= args.tol
    dist.barrier()
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    dist.destroy_process_group()
    if not ok:
        print(
            f"rank {rank}: check FAILED: relative error {worst:.3e} > {args.tol}", file=sys.stderr
        )
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SlimdataError as exc:  # a bad argument, shard or checkpoint: its message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
