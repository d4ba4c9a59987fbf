"""Local vs Ray build on one machine: tokens/s, peak RSS per process, N-node estimate.

Corpus: the UTF-8 text files of a source tree (e.g. the Linux kernel from Debian's
``linux-source-6.1`` package), hard-linked in sorted path order into a temporary directory
until ``--mb`` megabytes (1 MB = 10^6 bytes; empty and non-UTF-8 files are skipped)::

    cd /tmp && apt-get download linux-source-6.1 && dpkg-deb -x linux-source-6.1_*_all.deb deb
    tar -xJf deb/usr/src/linux-source-6.1.tar.xz      # -> /tmp/linux-source-6.1
    python benchmarks/bench_ray_build.py /tmp/linux-source-6.1 --mb 200

For each engine the ``slimdata build`` command (``--format text --compression zstd --quiet
--json``; ``--workers N`` locally, ``--engine ray`` on a local Ray cluster started by the
command with this machine's cores) runs as a subprocess; wall clock from exec to exit, so
the Ray cluster's start and stop are inside. Every 0.2 s the benchmark reads, for the
command and all its descendant processes (Ray's gcs_server, raylet, agents and workers
included), the peak resident set (``VmHWM``) and the summed current RSS; and it records when
each ``task-N.partial`` directory appears and when it is renamed to ``task-N`` (the Ray
run's per-task wall times, 0.2 s resolution). The two outputs are compared byte for byte.

N-node estimate: the Ray run's measured per-task times scheduled longest-first on
``N * cores`` slots (LPT), plus the run's measured fixed costs (start until the first task
began, and the driver's merge after the last task ended). It assumes nodes like this one,
a shared filesystem that is not the bottleneck, and per-task times that do not change with
the cluster's size; the merge stays on one process.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_build import utf8_text

_TASK = re.compile(r"task-(\d{5})(\.partial)?$")


def make_corpus(source: Path, target: Path, megabytes: int) -> tuple[int, int]:
    """Hard-link (copy across filesystems) text files of ``source`` into ``target``."""
    total = files = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file() and not p.is_symlink()):
        if total >= megabytes * 1_000_000:
            break
        data = utf8_text(path)
        if data is None:
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copyfile(path, dest)
        files += 1
        total += len(data)
    return files, total


_TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command line, CPU seconds so far) of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat[0] not in ("Z", "X"):
            cpu = (int(stat[11]) + int(stat[12])) / _TICK  # utime + stime
            out[int(entry.name)] = (int(stat[1]), cmd.strip(), cpu)
    return out


def _role(pid: int, root: int, cmd: str) -> str:
    if pid == root:
        return "driver (slimdata build)"
    for key in ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py"):
        if key in cmd:
            return key
    if "Agent" in cmd or "agent" in cmd:
        return "ray agents"
    return "worker"


def _memory(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of ``pid`` in bytes (0 when gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    values = dict(re.findall(r"^(VmHWM|VmRSS):\s+(\d+) kB", text, re.M))
    return int(values.get("VmHWM", 0)) << 10, int(values.get("VmRSS", 0)) << 10


def run_build(cmd: list[str], out: Path) -> dict:
    """Run ``cmd``; sample memory of its process tree and the task directories of ``out``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, tuple[str, int]] = {}
    cpu: dict[int, float] = {}
    began: dict[int, float] = {}
    ended: dict[int, float] = {}
    peak_sum = 0
    while proc.poll() is None:
        now = time.perf_counter() - start
        procs = _processes()
        tree, frontier = {proc.pid}, {proc.pid}
        while frontier:
            frontier = {p for p, (parent, *_) in procs.items() if parent in frontier} - tree
            tree |= frontier
        rss_sum = 0
        for pid in tree:
            hwm, rss = _memory(pid)
            rss_sum += rss
            _, cmd_line, seconds = procs.get(pid, (0, "", 0.0))
            cpu[pid] = max(cpu.get(pid, 0.0), seconds)
            role = _role(pid, proc.pid, cmd_line)
            if hwm > peaks.get(pid, ("", 0))[1]:
                peaks[pid] = (role, hwm)
        peak_sum = max(peak_sum, rss_sum)
        if out.is_dir():
            for entry in os.scandir(out):
                if m := _TASK.match(entry.name):
                    index = int(m.group(1))
                    began.setdefault(index, now)
                    if not m.group(2):
                        ended.setdefault(index, now)
        time.sleep(0.2)
    wall = time.perf_counter() - start
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise RuntimeError(stderr[-4000:])
    sidecar = json.loads(stdout)
    roles: dict[str, list[int]] = {}
    for role, hwm in peaks.values():
        roles.setdefault(role, []).append(hwm)
    return {
        "wall_s": wall,
        "sidecar": sidecar,
        "peak_rss_by_role": {
            r: {"processes": len(v), "max_bytes": max(v)} for r, v in roles.items()
        },
        "peak_summed_rss_bytes": peak_sum,
        "cpu_s": sum(cpu.values()),
        "task_seconds": {i: ended[i] - began[i] for i in ended if i in began},
        "first_task_s": min(began.values()) if began else None,
        "last_task_s": max(ended.values()) if ended else None,
    }


def lpt_makespan(times: list[float], slots: int) -> float:
    """Longest-processing-time-first schedule of ``times`` on ``slots`` parallel slots."""
    loads = [0.0] * slots
    heapq.heapify(loads)
    for t in sorted(times, reverse=True):
        heapq.heapreplace(loads, loads[0] + t)
    return max(loads)


def tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a source tree of text files")
    parser.add_argument("--mb", type=int, default=200, help="corpus size in MB (10^6 bytes)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--tokenizer", default="deepseek")
    parser.add_argument("--engines", nargs="+", default=["local", "ray"])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()
    import ray

    work = Path(tempfile.mkdtemp(prefix="slimdata-raybench-", dir=args.work))
    try:
        corpus = work / "corpus"
        files, nbytes = make_corpus(args.source, corpus, args.mb)
        print(json.dumps({"corpus_mb": round(nbytes / 1e6, 1), "files": files}), flush=True)
        print(json.dumps({"ray": ray.__version__, "cores": args.workers}), flush=True)
        base = [sys.executable, "-m", "slimdata.cli", "build", str(corpus), "--format", "text"]
        base += ["--tokenizer", args.tokenizer, "--compression", "zstd", "--quiet", "--json"]
        results, digests = {}, {}
        for engine in args.engines:
            out = work / f"out-{engine}"
            extra = ["--workers", str(args.workers)] if engine == "local" else ["--engine", "ray"]
            print(f"# {' '.join([*base, '-o', str(out), *extra])}", flush=True)
            results[engine] = r = run_build([*base, "-o", str(out), *extra], out)
            digests[engine] = tree_digest(out)
            counts = r["sidecar"]["counts"]
            row = {
                "engine": engine,
                "wall_s": round(r["wall_s"], 1),
                "documents": counts["documents"],
                "tokens": counts["tokens"],
                "tasks": counts["tasks"],
                "tokens_per_s": round(counts["tokens"] / r["wall_s"]),
                "cpu_s": round(r["cpu_s"], 1),
                "tokens_per_cpu_s": round(counts["tokens"] / r["cpu_s"]),
                "load_avg_1m_after": os.getloadavg()[0],
                "peak_summed_rss_gib": round(r["peak_summed_rss_bytes"] / 2**30, 2),
                "peak_rss_gib_by_role": {
                    role: [v["processes"], round(v["max_bytes"] / 2**30, 2)]
                    for role, v in sorted(r["peak_rss_by_role"].items())
                },
            }
            print(json.dumps(row), flush=True)
            shutil.rmtree(out)
        if len(set(digests.values())) == 1:
            print(json.dumps({"byte_identical": True, "sha256_of_tree": digests[args.engines[0]]}))
        else:
            print(json.dumps({"byte_identical": False, "digests": digests}))
        if "ray" in results:
            r = results["ray"]
            times = list(r["task_seconds"].values())
            fixed = r["first_task_s"] + (r["wall_s"] - r["last_task_s"])
            tokens = r["sidecar"]["counts"]["tokens"]
            print(
                json.dumps(
                    {
                        "ray_tasks_timed": len(times),
                        "task_s_sum": round(sum(times), 1),
                        "task_s_max": round(max(times), 2),
                        "start_until_first_task_s": round(r["first_task_s"], 1),
                        "after_last_task_s": round(r["wall_s"] - r["last_task_s"], 1),
                    }
                ),
                flush=True,
            )
            for n in args.nodes:
                span = lpt_makespan(times, n * args.workers)
                est = {"nodes": n, "slots": n * args.workers, "tasks_s": round(span, 1)}
                est["wall_s"] = round(span + fixed, 1)
                est["tokens_per_s"] = round(tokens / (span + fixed))
                print(json.dumps({"estimate": est}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
