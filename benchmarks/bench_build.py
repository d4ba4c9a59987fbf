"""Build throughput vs. raw tokenizer throughput on the same text and cores.

Corpus: the interpreter's standard-library ``.py`` files, then the ``.py`` files of the
active environment's site-packages, copied into a temporary directory until at least
``--mb`` megabytes (UTF-8 files only). Raw throughput: the same tokenizer's batched encode
(``encode_batch`` and ``encode_batch_fast``, all cores through rayon; texts already in
memory) over the same files; the better of the two is the reference. Build throughput:
``slimdata build`` end to end (read, tokenize, EOS, slice, cost, MDS write, merge, manifest,
sidecar) on ``--workers`` processes.

    python benchmarks/bench_build.py --mb 50 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import site
import sysconfig
import tempfile
import time
from pathlib import Path


def make_corpus(target: Path, megabytes: int) -> tuple[int, int]:
    roots = [Path(sysconfig.get_paths()["stdlib"]), *map(Path, site.getsitepackages())]
    total = files = 0
    seen: set[Path] = set()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if total >= megabytes * 1_000_000:
                return files, total
            real = path.resolve()
            if real in seen or not path.is_file():
                continue
            seen.add(real)
            if root == roots[0] and "site-packages" in path.relative_to(root).parts:
                continue
            data = path.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if not data.strip():
                continue
            dest = target / f"{files:06d}_{path.name}"
            dest.write_bytes(data)
            files += 1
            total += len(data)
    return files, total


def raw_throughput(corpus: Path, tokenizer: str, batch_chars: int) -> dict[str, float]:
    """Each method in a fresh process: the tokenizer's word cache must start cold, as it
    does in the build (a second pass over the same text is several times faster)."""
    import subprocess
    import sys

    out: dict[str, float] = {}
    for method in ("encode_batch", "encode_batch_fast"):
        here = str(Path(__file__).parent)
        args = (str(corpus), tokenizer, batch_chars, method)
        code = (
            f"import json, sys; sys.path.insert(0, {here!r}); import bench_build as b; "
            f"print(json.dumps(b.raw_one(*{args!r})))"
        )
        res = json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
        out.update(res)
    return out


def raw_one(corpus: str, tokenizer: str, batch_chars: int, method: str) -> dict[str, float]:
    from slimdata.tokenize import load_tokenizer

    corpus = Path(corpus)

    tok = load_tokenizer(tokenizer)
    texts = [
        p.read_bytes().decode("utf-8") for p in sorted(corpus.iterdir())
    ]  # exact bytes, no newline translation
    batches, batch, chars = [], [], 0
    for t in texts:
        batch.append(t)
        chars += len(t)
        if chars >= batch_chars:
            batches.append(batch)
            batch, chars = [], 0
    if batch:
        batches.append(batch)
    fn = getattr(tok.backend, method)
    start = time.perf_counter()
    tokens = sum(len(e.ids) for b in batches for e in fn(b, add_special_tokens=False))
    return {method: tokens / (time.perf_counter() - start), "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", default="deepseek")
    args = parser.parse_args()

    import streaming  # noqa: F401 - import once outside the timed region (torch import)

    from slimdata.build import BuildConfig, build

    work = Path(tempfile.mkdtemp(prefix="slimdata-bench-"))
    try:
        corpus = work / "corpus"
        corpus.mkdir()
        files, nbytes = make_corpus(corpus, args.mb)
        config = BuildConfig(
            inputs=(str(corpus),), format="text", tokenizer=args.tokenizer, workers=args.workers
        )
        raw = raw_throughput(corpus, args.tokenizer, config.batch_chars)
        start = time.perf_counter()
        summary = build(config, work / "out")
        seconds = time.perf_counter() - start
        tokens = summary.counts["tokens"]
        content_tokens = tokens - summary.counts["documents"]  # without the appended EOS
        build_tps = content_tokens / seconds
        best_raw = max(raw.get("encode_batch", 0), raw.get("encode_batch_fast", 0))
        result = {
            "corpus_files": files,
            "corpus_mb": round(nbytes / 1e6, 1),
            "cpus": os.cpu_count(),
            "workers": args.workers,
            "tokenizer": args.tokenizer,
            "tokens_raw": raw["tokens"],
            "tokens_built_without_eos": content_tokens,
            "raw_encode_batch_tok_s": round(raw.get("encode_batch", 0)),
            "raw_encode_batch_fast_tok_s": round(raw.get("encode_batch_fast", 0)),
            "build_seconds": round(seconds, 2),
            "build_tok_s": round(build_tps),
            "ratio_vs_best_raw": round(build_tps / best_raw, 3),
            "ratio_vs_encode_batch": round(build_tps / raw["encode_batch"], 3),
        }
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
