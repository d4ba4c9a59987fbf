"""Build throughput vs. raw tokenizer throughput on the same text and cores.

Corpus: the interpreter's standard-library ``.py`` files, then the ``.py`` files of the
active environment's site-packages, copied into a temporary directory until at least
``--mb`` megabytes (UTF-8 files only); several sizes can be given (``--mb 50 200``).

For each size, measured in fresh processes, one after the other, ``--repeat`` times:

- **raw**: the same tokenizer's ``encode_batch_fast`` (``--all-methods`` adds
  ``encode_batch``) over the same files, texts already in memory, batches of the build's
  ``batch_chars``, rayon on ``--workers`` threads (``RAYON_NUM_THREADS``). Process start,
  imports and tokenizer loading are outside its timed region.
- **end to end**: the ``slimdata build`` command (``--format text --workers N --quiet``) as
  a subprocess, wall clock from exec to exit: interpreter start, imports (streaming imports
  torch), planning, tokenizer loading, read, tokenize, EOS, slice, cost, MDS write, merge,
  manifest, sidecar.
- **warm**: ``build()`` called in a process that has already imported the writer stack
  (streaming, pyarrow) and loaded the tokenizer: the build's steady state without the
  fixed start-up cost (planning, worker start, writing and finalizing are still inside).
- **marginal** (two or more sizes): the slope of end-to-end time over tokens between the
  smallest and the largest size, i.e. the end-to-end throughput once fixed costs are
  amortized.

After the repeats, the median end-to-end ratio of each size (the development VM's speed
drifts by up to 1.5x between consecutive runs, so single runs decide nothing).

Ratios are build tokens/s (content tokens, EOS excluded) over raw ``encode_batch_fast``
tokens/s measured next to it. The load average is printed with each run: this benchmark
is only meaningful on an otherwise idle machine.

    python benchmarks/bench_build.py --mb 50 200 --workers 2 --repeat 3 [--pycache /tmp/pyc]
    python benchmarks/bench_build.py --mb 50 --repeat 3 --no-warm --variant=--task-bytes=4194304

CPU seconds (user + sys, workers included) are printed too: on a loaded machine their
ratio (raw CPU / build CPU) is a steadier measure of the build's overhead than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)


def utf8_text(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is non-blank UTF-8 text, else None."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return data if data.strip() else None


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
            data = utf8_text(path)
            if data is None:
                continue
            dest = target / f"{files:06d}_{path.name}"
            dest.write_bytes(data)
            files += 1
            total += len(data)
    return files, total


ENV: dict[str, str] = dict(os.environ)
"""Environment of every measured subprocess (``--pycache`` changes it)."""


def _python(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` (with this directory importable) in a fresh interpreter; its JSON."""
    prelude = f"import json, sys; sys.path.insert(0, {HERE!r}); import bench_build as b; "
    proc = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def raw_one(corpus: str, tokenizer: str, batch_chars: int, method: str) -> dict[str, float]:
    """Tokens/s of ``method`` over the corpus (run in a fresh process: the tokenizer's word
    cache starts cold, as in the build; a second pass over the same text is much faster)."""
    from slimdata.tokenize import load_tokenizer

    tok = load_tokenizer(tokenizer)
    texts = [p.read_bytes().decode("utf-8") for p in sorted(Path(corpus).iterdir())]
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
    cpu, start = time.process_time(), time.perf_counter()
    tokens = sum(len(e.ids) for b in batches for e in fn(b, add_special_tokens=False))
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "cpu": cpu}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def warm_one(corpus: str, out: str, tokenizer: str, workers: int) -> dict[str, float]:
    """``build()`` after the writer stack is imported and the tokenizer loaded."""
    import pyarrow as pa
    import streaming  # noqa: F401 - torch import, outside the timed region

    from slimdata.ingest import BuildConfig, build
    from slimdata.ingest.task import cached_tokenizer

    pa.array([0])
    cached_tokenizer(tokenizer, None)
    config = BuildConfig(inputs=(corpus,), format="text", tokenizer=tokenizer, workers=workers)
    cpu, start = time.process_time() + _children_cpu(), time.perf_counter()
    summary = build(config, out)
    seconds = time.perf_counter() - start
    cpu = time.process_time() + _children_cpu() - cpu
    tokens = summary.counts["tokens"] - summary.counts["documents"]
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "cpu": cpu}


def build_args(
    corpus: Path, out: Path, tokenizer: str, workers: int, extra: Sequence[str] = ()
) -> list[str]:
    """``slimdata build`` arguments of every timed build."""
    args = ["build", str(corpus), "-o", str(out), "--format", "text", "--tokenizer", tokenizer]
    return [*args, "--workers", str(workers), "--quiet", *extra]


def end_to_end(
    corpus: Path, out: Path, tokenizer: str, workers: int, extra: Sequence[str] = ()
) -> dict[str, float]:
    cmd = [sys.executable, "-c", "from slimdata.cli import main; main()"]
    cmd += build_args(corpus, out, tokenizer, workers, extra)
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, env=ENV)
    seconds = time.perf_counter() - start
    cpu = _children_cpu() - cpu
    counts = json.loads((out / "slimdata.json").read_text())["counts"]
    tokens = counts["tokens"] - counts["documents"]
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "cpu": cpu}


PHASES = """
import json, resource, sys, time
T0 = time.perf_counter()
rows = []
def mark(what):
    rows.append({"at_s": round(time.perf_counter() - T0, 2), "cpu_s": round(time.process_time(), 2), "what": what})
mark("interpreter started")
from slimdata.cli import cli
import slimdata.ingest.run as run
def timed(name):
    inner = getattr(run, name)
    def wrapper(*args, **kwargs):
        mark(name + " start")
        out = inner(*args, **kwargs)
        mark(name + " end")
        return out
    setattr(run, name, wrapper)
for name in ("plan_build", "_warm_imports", "write_task", "finalize"):
    timed(name)
try:
    cli.main(sys.argv[1:], prog_name="slimdata", standalone_mode=False)
finally:
    mark("build returned")
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"phases": rows, "workers_cpu_s": round(child.ru_utime + child.ru_stime, 2)}))
"""


def phases(
    corpus: Path, out: Path, tokenizer: str, workers: int, extra: Sequence[str] = ()
) -> dict:
    """One end-to-end build with the build process's wall and CPU clocks read at the start
    and end of its phases (planning, writer imports, each task's write, finalize); also when
    each prepared task reached the writer (the last ones show the tail where workers idle)."""
    args = build_args(corpus, out, tokenizer, workers, extra)
    proc = subprocess.run(
        [sys.executable, "-c", PHASES, *args], capture_output=True, text=True, env=ENV, check=True
    )
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    marks = data["phases"]
    writes = [m for m in marks if m["what"].startswith("write_task")]
    cpu = {"build process total": marks[-1]["cpu_s"], "workers total": data["workers_cpu_s"]}
    cpu["task writes"] = round(
        sum(e["cpu_s"] - s["cpu_s"] for s, e in zip(writes[::2], writes[1::2], strict=True)), 2
    )
    for name in ("plan_build", "_warm_imports", "finalize"):
        start, end = (m for m in marks if m["what"] in (f"{name} start", f"{name} end"))
        cpu[name] = round(end["cpu_s"] - start["cpu_s"], 2)
    cpu["before planning"] = next(m for m in marks if m["what"] == "plan_build start")["cpu_s"]
    return {
        "cpu_seconds": cpu,
        "tasks": len(writes) // 2,
        "task_ready_at_s": [m["at_s"] for m in writes[::2]],
        "timeline": [m for m in marks if m not in writes],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[50])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", default="deepseek")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--all-methods", action="store_true", help="also raw encode_batch")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm in-process build")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="only: one build of the smallest --mb size (with the --variant options) and the "
        "CPU seconds of each phase of the build process",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="OPT",
        help="also time the build with this extra option (e.g. --variant=--task-bytes=4194304), "
        "right after the default build of each size; repeatable",
    )
    parser.add_argument(
        "--pycache",
        metavar="DIR",
        help="run the builds with a bytecode cache in DIR (PYTHONPYCACHEPREFIX, filled before "
        "timing), as an installation with compiled bytecode has; default: this environment as is",
    )
    args = parser.parse_args()
    if args.pycache:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = str(Path(args.pycache).resolve())
        warm_up = "import streaming, pyarrow.parquet, pandas, slimdata.cli.build, slimdata.ingest"
        subprocess.run([sys.executable, "-c", warm_up], check=True, env=ENV)

    from slimdata.ingest import BuildConfig

    batch_chars = BuildConfig().batch_chars
    rayon = {"RAYON_NUM_THREADS": str(args.workers)}
    methods = ["encode_batch_fast"] + (["encode_batch"] if args.all_methods else [])
    work = Path(tempfile.mkdtemp(prefix="slimdata-bench-"))
    try:
        corpora = {}
        for mb in sorted(args.mb):
            corpora[mb] = work / f"corpus{mb}"
            corpora[mb].mkdir()
            files, nbytes = make_corpus(corpora[mb], mb)
            print(json.dumps({"corpus_mb": round(nbytes / 1e6, 1), "files": files}), flush=True)
        if args.phases:
            corpus = corpora[min(corpora)]
            print(
                json.dumps(
                    phases(corpus, work / "out", args.tokenizer, args.workers, args.variant)
                ),
                flush=True,
            )
            return
        print(
            json.dumps(
                {
                    "bytecode_cache": ENV.get("PYTHONPYCACHEPREFIX"),
                    "dont_write_bytecode": ENV.get("PYTHONDONTWRITEBYTECODE"),
                }
            ),
            flush=True,
        )
        ratios: dict[int, list[float]] = {mb: [] for mb in corpora}
        for rep in range(args.repeat):
            e2e = {}
            for mb, corpus in corpora.items():
                row: dict = {"repeat": rep, "corpus_mb": mb, "workers": args.workers}
                row["load_before"] = round(os.getloadavg()[0], 2)
                for method in methods:
                    raw = _python(
                        f"print(json.dumps(b.raw_one({str(corpus)!r}, {args.tokenizer!r}, "
                        f"{batch_chars}, {method!r})))",
                        rayon,
                    )
                    row[f"raw_{method}_tok_s"] = round(raw["tok_s"])
                    if method == "encode_batch_fast":
                        ref, ref_cpu = raw["tok_s"], raw["cpu"]
                        row["raw_cpu_seconds"] = round(ref_cpu, 2)
                out = work / "out"
                shutil.rmtree(out, ignore_errors=True)
                e2e[mb] = end_to_end(corpus, out, args.tokenizer, args.workers)
                assert e2e[mb]["tokens"] == raw["tokens"], (e2e[mb], raw)
                row["tokens"] = e2e[mb]["tokens"]
                row["end_to_end_seconds"] = round(e2e[mb]["seconds"], 2)
                row["end_to_end_tok_s"] = round(e2e[mb]["tok_s"])
                row["end_to_end_ratio"] = round(e2e[mb]["tok_s"] / ref, 3)
                ratios[mb].append(row["end_to_end_ratio"])
                row["end_to_end_cpu_seconds"] = round(e2e[mb]["cpu"], 2)
                row["end_to_end_cpu_ratio"] = round(ref_cpu / e2e[mb]["cpu"], 3)
                if args.variant:
                    shutil.rmtree(out, ignore_errors=True)
                    var = end_to_end(corpus, out, args.tokenizer, args.workers, args.variant)
                    row["variant"] = args.variant
                    row["variant_seconds"] = round(var["seconds"], 2)
                    row["variant_ratio"] = round(var["tok_s"] / ref, 3)
                print(json.dumps({"partial": True, **row}), flush=True)
                if not args.no_warm:
                    shutil.rmtree(out, ignore_errors=True)
                    warm = _python(
                        f"print(json.dumps(b.warm_one({str(corpus)!r}, {str(out)!r}, "
                        f"{args.tokenizer!r}, {args.workers})))"
                    )
                    row["warm_seconds"] = round(warm["seconds"], 2)
                    row["warm_tok_s"] = round(warm["tok_s"])
                    row["warm_ratio"] = round(warm["tok_s"] / ref, 3)
                    row["warm_cpu_seconds"] = round(warm["cpu"], 2)
                    row["warm_cpu_ratio"] = round(ref_cpu / warm["cpu"], 3)
                shutil.rmtree(out, ignore_errors=True)
                row["load_after"] = round(os.getloadavg()[0], 2)
                print(json.dumps(row), flush=True)
            if len(e2e) > 1:
                lo, hi = min(e2e), max(e2e)
                slope = (e2e[hi]["tokens"] - e2e[lo]["tokens"]) / (
                    e2e[hi]["seconds"] - e2e[lo]["seconds"]
                )
                fixed = e2e[lo]["seconds"] - e2e[lo]["tokens"] / slope
                print(
                    json.dumps(
                        {
                            "repeat": rep,
                            "marginal_mb": [lo, hi],
                            "marginal_tok_s": round(slope),
                            "marginal_ratio_vs_raw_at_largest": round(slope / ref, 3),
                            "fixed_seconds": round(fixed, 2),
                        }
                    ),
                    flush=True,
                )
        for mb, values in ratios.items():
            summary = {"corpus_mb": mb, "end_to_end_ratios": values}
            summary["median_end_to_end_ratio"] = statistics.median(values)
            print(json.dumps({"summary": True, **summary}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
