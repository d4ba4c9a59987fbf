"""``slimdata plan``: solve every step of an epoch and write plan shards."""

from __future__ import annotations

from pathlib import Path

import click

from slimdata.cli.options import cost_model_from_options, cost_model_options
from slimdata.errors import ConfigError, OutputExistsError
from slimdata.solver.batches import OVERSIZE_POLICIES
from slimdata.solver.registry import STRATEGIES

__all__ = ["command"]


@click.command("plan")
@click.argument("shards", required=False, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--lengths",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Plan from document lengths (one int per line or a JSON list; .gz ok) instead of shards.",
)
@click.option("--nodes", type=int, required=True, help="Nodes (num_canonical_nodes of the reader).")
@click.option("--ranks-per-node", type=int, required=True, help="Data-parallel ranks per node.")
@click.option("--global-batch-tokens", type=int, required=True, help="Tokens per optimizer step.")
@click.option(
    "--memory-gib", type=float, required=True, help="Per-rank budget for activations and K/V, GiB."
)
@click.option(
    "--strategy", type=click.Choice(list(STRATEGIES)), default="slimpack", show_default=True
)
@click.option(
    "--context",
    type=int,
    default=131072,
    show_default=True,
    help="Context length (row length of concat; default pack token cap).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the document shuffle."
)
@click.option(
    "--mode",
    type=click.Choice(["free", "lockstep"]),
    default="free",
    show_default=True,
    help="free (DDP) or lockstep (FSDP/pipeline).",
)
@click.option(
    "--oversize",
    type=click.Choice(OVERSIZE_POLICIES),
    default="error",
    show_default=True,
    help="Documents longer than --context: split into independent pieces, truncate, or fail.",
)
@click.option(
    "--slice-tokens",
    type=int,
    default=2048,
    show_default=True,
    help="Slice length when planning from --lengths.",
)
@click.option(
    "--workers-per-rank",
    type=int,
    default=1,
    show_default=True,
    help="DataLoader workers per rank that will read the plan shards.",
)
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Output directory for plan shards.",
)
@cost_model_options
def command(
    shards,
    lengths,
    nodes,
    ranks_per_node,
    global_batch_tokens,
    memory_gib,
    strategy,
    context,
    seed,
    mode,
    oversize,
    slice_tokens,
    workers_per_rank,
    out,
    model,
    device,
    recompute,
    cost_profile,
) -> None:
    """Solve packing plans for an epoch and write one MDS sample per (step, rank)."""
    from slimdata.docsource import documents_from_lengths, load_lengths, load_shard_documents
    from slimdata.solver.epoch import write_epoch_plan

    if (shards is None) == (lengths is None):
        raise ConfigError("give either SHARDS or --lengths FILE (exactly one)")
    if Path(out).exists() and any(Path(out).iterdir()):
        raise OutputExistsError(f"{out} exists and is not empty; choose a new -o directory")
    cost = cost_model_from_options(model, device, recompute, cost_profile)
    tokens_of = None
    if lengths is not None:
        docs = documents_from_lengths(load_lengths(lengths), slice_tokens)
    else:
        docs = load_shard_documents(shards)
        from streaming import LocalDataset
        from streaming.base.dataset import StreamingDataset  # noqa: F401 - fail early if missing

        ds = LocalDataset(local=shards)

        def tokens_of(i: int):
            return ds[i]["tokens"]

    summary = write_epoch_plan(
        docs,
        out,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        global_batch_tokens=global_batch_tokens,
        memory_gib=memory_gib,
        strategy=strategy,
        seed=seed,
        cost=cost,
        context=context,
        mode=mode,
        oversize=oversize,
        tokens_of=tokens_of,
        workers_per_rank=workers_per_rank,
    )
    click.echo(
        f"wrote {summary['steps']} steps x {nodes * ranks_per_node} ranks to {out} "
        f"(strategy {strategy}, mean imbalance {summary['mean_imbalance']:.4f}, "
        f"solve {summary['solve_ms_total']:.0f} ms total)"
    )
