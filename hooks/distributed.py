"""Spawn ``N`` local ranks for tests and examples (gloo on CPU; NCCL where GPUs exist).

``run_distributed(fn, 4, arg)`` starts 4 processes (spawn), initialises the default process
group in each, calls ``fn(rank, world_size, arg)`` and returns the per-rank results in rank
order. A failure on any rank raises :class:`RuntimeError` carrying that rank's traceback; a
rank that does not finish within ``timeout_s`` is killed (a deadlocked collective fails the
test instead of hanging it). ``fn`` and its arguments must be picklable (module-level).
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_distributed"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world: int, port: int, backend: str, fn: Callable, args: tuple, out, threads: int
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))
        result = fn(rank, world, *args)
        out.put((rank, True, result))
    except BaseException:  # reported to the parent, which raises
        out.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 180.0,
    threads: int = 1,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; results by rank."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry, args=(r, world_size, port, backend, fn, args, out, threads), daemon=True
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, ok, value = out.get(timeout=timeout_s)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank} failed:\n{value}")
                break
    except queue.Empty:
        errors.append(
            f"ranks {sorted(set(range(world_size)) - set(results))} did not finish within {timeout_s}s (deadlock?)"
        )
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]
