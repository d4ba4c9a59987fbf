"""Shared helpers for the build tests: tiny committed fixtures and a fast tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimdata.ingest import BuildConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY_TOKENIZER = str(FIXTURES / "tiny_tokenizer.json")
"""512-id byte-level BPE trained on four stdlib files; EOS ``<|endoftext|>`` = id 0."""


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def tiny_config(*inputs, **changes) -> BuildConfig:
    """A build of ``inputs`` with the tiny tokenizer and 128-token slices."""
    return BuildConfig(
        inputs=tuple(str(p) for p in inputs), tokenizer=TINY_TOKENIZER, slice_tokens=128, **changes
    )


def read_shards(directory: Path) -> tuple[list[dict], list[dict]]:
    """Samples of ``directory`` through a stock StreamingDataset: by index, and by iteration."""
    from streaming import StreamingDataset

    ds = StreamingDataset(local=str(directory), shuffle=False, batch_size=1)
    return [ds[i] for i in range(ds.num_samples)], list(ds)


def tree_bytes(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative path -> bytes), for byte-identity checks."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def make_text_corpus(root: Path, files: int = 24, seed: int = 0) -> Path:
    """``files`` small text files of varied length (deterministic), under ``root/corpus``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "slice",
        "token",
        "pack",
        "rank",
        "def",
        "return",
        "\n",
    ]
    for i in range(files):
        n = int(rng.integers(5, 60)) * (20 if i % 7 == 0 else 1)
        (corpus / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(words, n)) + f"\nend {i}\n")
    return corpus


def cli_build_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    """`slimdata build` arguments: tiny tokenizer, 128-token slices, ~600-byte tasks (many
    tasks from a small corpus), zstd shards."""
    return [
        "build",
        str(corpus),
        "-o",
        str(out),
        "--tokenizer",
        TINY_TOKENIZER,
        "--slice-tokens",
        "128",
        "--task-bytes",
        "600",
        "--compression",
        "zstd",
        *extra,
    ]


def cli_build_cmd(corpus: Path, out: Path, *extra: str) -> list[str]:
    """:func:`cli_build_args` as a command line for a fresh subprocess, no progress bar."""
    import sys

    code = "from slimdata.cli import main; main()"
    return [sys.executable, "-c", code, *cli_build_args(corpus, out, *extra), "--quiet"]


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process, None when it is gone (zombies count as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else (fields[0], int(fields[1]))


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid``, sorted."""
    return sorted(
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (st := proc_stat(int(p.name))) is not None and st[1] == pid
    )


def wait_for(predicate, limit: float = 60.0) -> bool:
    """Poll ``predicate`` until true or ``limit`` seconds pass (a bound, not a timing check)."""
    import time

    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
