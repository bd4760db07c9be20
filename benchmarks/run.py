"""Benchmark daskpile against what users would use instead, in one run on one machine.

    python benchmarks/run.py --size A --reps 3        # 10 M rows, 40 files
    python benchmarks/run.py --size B --reps 1        # 100 M rows, 200 files
    python benchmarks/run.py --size tiny --reps 1     # 100 k rows: proves the suite works
    python benchmarks/run.py --render benchmarks/results/B.json   # rewrite a result's table and chart
    python benchmarks/run.py --size B --reps 1 --worker-memory 2GiB --duckdb-memory 4GB \
        --systems "daskpile auto piles" "duckdb ORDER BY random()" "dask p2p + sample"   # bounded memory

Each system runs alone in a fresh process, alternating with the others, on the
same cached dataset.  Reported per system: wall time of the whole process
(median, min, max), its start-up apart, CPU time and peak resident memory of
the whole process tree (workers included), rows per second, and ratios to
DuckDB ORDER BY random() and to the plain-copy floor.  Results go to
benchmarks/results/ as JSON, a Markdown table and a PNG chart.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from systems import FLOORS, PEER, SYSTEMS  # noqa: E402

# A-2000 is A's rows in 2,000 files of 5,000 rows: a lake of many small files (benchmarks/small_files.py);
# A-50000 in 50,000 files of 200 rows, what a stream's hourly writers leave.
SIZES = {
    "tiny": (100_000, 4),
    "A": (10_000_000, 40),
    "A-2000": (10_000_000, 2000),
    "A-50000": (10_000_000, 50_000),
    "B": (100_000_000, 200),
}
NEEDS = {"duckdb": "duckdb", "polars": "polars"}


def dataset(size: str, data_dir: str) -> str:
    """The reference dataset of this size, generated once and cached."""
    rows, files = SIZES[size]
    path = os.path.join(data_dir, f"{size}-{rows}-{files}")
    marker = os.path.join(path, "_COMPLETE")
    if not os.path.exists(marker):
        from daskpile.datasets import write_reference_dataset

        shutil.rmtree(path, ignore_errors=True)
        print(f"generating dataset {size}: {rows:,} rows in {files} files ...", flush=True)
        write_reference_dataset(path, rows, files)
        open(marker, "w").close()
    return path


def machine() -> dict:
    from importlib import metadata

    versions = {}
    for name in ["daskpile", "dask", "distributed", "pyarrow", "pandas", "numpy", "duckdb", "polars"]:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if "model name" in line), "?")
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "versions": versions,
    }


def settle(source: str) -> None:
    """Give every run the same start, untimed: no dirty pages of the previous run's output still being
    written back, and the input in the page cache (a run after Polars or DuckDB, which take 9-11 GiB,
    would otherwise read it from disk)."""
    os.sync()
    for name in sorted(os.listdir(source)):
        with open(os.path.join(source, name), "rb") as f:
            while f.read(16 << 20):
                pass


def run_one(system: str, source: str, dest: str, limits: dict | None = None, timeout: float | None = None) -> dict:
    """Run one system in a fresh process; measure wall, CPU and the tree's peak RSS.

    Each run gets an empty dest and its own empty temporary directory (TMPDIR:
    daskpile's scratch, Dask's worker and p2p directories), so nothing left by
    an earlier run, even one killed mid-way, is seen or reused.
    """
    tmp = dest + "-tmp"
    for path in (dest, tmp):
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(tmp)
    settle(source)
    env = {
        **os.environ,
        "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TMPDIR": tmp,
        **(limits or {}),
    }
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "systems.py"), system, source, dest],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    peaks = peak_rss(process, start, timeout)
    if peaks is None:
        return {"system": system, "ok": False, "error": f"timed out after {timeout:.0f} s", "wall_s": timeout}
    peak, peak_process = peaks
    wall = time.perf_counter() - start
    stdout, stderr = process.communicate()
    shutil.rmtree(tmp, ignore_errors=True)
    if process.returncode:
        return {"system": system, "ok": False, "error": stderr.decode()[-2000:], "wall_s": wall}
    children = psutil.Process().cpu_times()  # includes reaped children and their descendants
    inner = json.loads(stdout.decode().strip().splitlines()[-1])
    return {
        "system": system,
        "ok": True,
        "wall_s": wall,
        "peak_rss_mib": peak / 2**20,
        "peak_process_rss_mib": peak_process / 2**20,
        "cpu_total": children,
        **inner,
    }


def peak_rss(process: subprocess.Popen, start: float, timeout: float | None = None) -> tuple[int, int] | None:
    """Wait for ``process``, polling the resident memory of its whole tree: (peak of the tree, of one process).

    None if it ran past ``timeout`` seconds from ``start`` (it is then killed, with its children).
    """
    root = psutil.Process(process.pid)
    peak = peak_process = 0
    while process.poll() is None:
        if timeout and time.perf_counter() - start > timeout:
            for p in [*root.children(recursive=True), root]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            process.wait()
            return None
        try:
            rss = [p.memory_info().rss for p in [root, *root.children(recursive=True)] if p.is_running()]
            peak, peak_process = max(peak, sum(rss)), max(peak_process, *rss)
        except (psutil.Error, ValueError):
            pass
        time.sleep(0.05)
    return peak, peak_process


def summarise(runs: list[dict], rows: int) -> dict[str, dict]:
    summary = {}
    for system in dict.fromkeys(r["system"] for r in runs):
        ok = [r for r in runs if r["system"] == system and r["ok"]]
        if not ok:
            summary[system] = {"ok": False, "error": next(r["error"] for r in runs if r["system"] == system)}
            continue
        walls = [r["wall_s"] for r in ok]
        summary[system] = {
            "ok": True,
            "runs": len(ok),
            "wall_median_s": statistics.median(walls),
            "wall_min_s": min(walls),
            "wall_max_s": max(walls),
            "startup_median_s": statistics.median(r["startup_s"] for r in ok),
            "work_median_s": statistics.median(r["shuffle_s"] for r in ok),
            "cpu_median_s": statistics.median(r["cpu_s"] for r in ok),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in ok),
            "peak_process_rss_mib": max(r.get("peak_process_rss_mib", 0) for r in ok),
            "rows_per_s": rows / statistics.median(walls),
            "output_mib": ok[0]["output_bytes"] / 2**20,
            "scratch_mib": ok[0].get("scratch_bytes", 0) / 2**20,
            "worker_restarts": max((r.get("worker_restarts", 0) for r in ok), default=0),
            "piles": ok[0].get("piles"),
        }
    peer = summary.get(PEER, {}).get("wall_median_s")
    floors = [summary[f]["wall_median_s"] for f in FLOORS if summary.get(f, {}).get("ok")]
    floor = min(floors) if floors else None
    for entry in summary.values():
        if entry["ok"]:
            entry["vs_duckdb"] = entry["wall_median_s"] / peer if peer else None
            entry["vs_floor"] = entry["wall_median_s"] / floor if floor else None
    return summary


def markdown(summary: dict, meta: dict) -> str:
    lines = [
        f"{meta['size']}: {meta['rows']:,} rows, {meta['files']} files, {meta['input_mib']:,.0f} MiB; "
        f"{meta['machine']['cores']} cores, {meta['machine']['memory_gib']} GiB ({meta['machine']['cpu']}); "
        f"{meta['date']}; {meta['reps']} runs each, alternating"
        + "".join(f"; {k.replace('_', ' ')} limit {v}" for k, v in meta.get("limits", {}).items() if v),
        "",
        "| system | wall s, median (min-max) | start-up s | work s | CPU s | peak MiB (tree) "
        "| peak MiB (largest process) | M rows/s | x DuckDB | x floor | scratch MiB | output MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system, e in summary.items():
        if not e["ok"]:
            reason = e["error"].strip().splitlines()[-1][:150].replace("|", "/") if e.get("error") else ""
            lines.append(f"| {system} | failed: {reason} | | | | | | | | | | |")
            continue
        ratios = " | ".join(f"{e[k]:.2f}" if e[k] else "" for k in ("vs_duckdb", "vs_floor"))
        scratch = f"{e['scratch_mib']:,.0f}" if e.get("scratch_mib") else ""
        lines.append(
            f"| {system} | {e['wall_median_s']:.1f} ({e['wall_min_s']:.1f}-{e['wall_max_s']:.1f}) "
            f"| {e['startup_median_s']:.1f} | {e['work_median_s']:.1f} | {e['cpu_median_s']:.1f} "
            f"| {e['peak_rss_mib']:,.0f} | {e['peak_process_rss_mib']:,.0f} | {e['rows_per_s'] / 1e6:.2f} "
            f"| {ratios} | {scratch} | {e['output_mib']:,.0f} |"
        )
    return "\n".join(lines)


def chart(summary: dict, meta: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    entries = [(s, e) for s, e in summary.items() if e["ok"]]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(entries) + 1.5))
    names = [s for s, _ in entries][::-1]
    startup = [e["startup_median_s"] for _, e in entries][::-1]
    rest = [e["wall_median_s"] - e["startup_median_s"] for _, e in entries][::-1]
    errors = [
        [e["wall_median_s"] - e["wall_min_s"] for _, e in entries][::-1],
        [e["wall_max_s"] - e["wall_median_s"] for _, e in entries][::-1],
    ]
    ax.barh(names, startup, color="#bbbbbb", label="start-up (imports, cluster)")
    ax.barh(names, rest, left=startup, xerr=errors, color="#3b75af", label="shuffle and write")
    ax.set_xlabel("wall seconds, whole process (median, min-max)")
    ax.set_title(f"{meta['size']}: {meta['rows']:,} rows; {meta['machine']['cores']} cores, {meta['date']}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="A")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", nargs="*", default=list(SYSTEMS), help="default: all")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker-memory", help="memory limit of each LocalCluster worker, e.g. 2GiB")
    parser.add_argument("--duckdb-memory", help="DuckDB's memory_limit, e.g. 4GB")
    parser.add_argument("--timeout", type=float, help="seconds before a run is killed and reported as timed out")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the table and chart of a results JSON")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            return write_results(args.render.removesuffix(".json"), **json.load(f))
    limits = {}
    if args.worker_memory:
        limits["BENCH_WORKER_MEMORY"] = args.worker_memory
    if args.duckdb_memory:
        limits["BENCH_DUCKDB_MEMORY"] = args.duckdb_memory

    systems = [s for s in args.systems if all(importlib.util.find_spec(m) for k, m in NEEDS.items() if k in s)]
    skipped = sorted(set(args.systems) - set(systems))
    source = dataset(args.size, args.data_dir)
    rows, files = SIZES[args.size]
    work = os.path.join(args.data_dir, "out")
    runs = []
    for rep in range(args.reps):
        order = systems[rep % len(systems) :] + systems[: rep % len(systems)]  # alternate who goes first
        for system in order:
            cpu_before = psutil.Process().cpu_times()
            result = run_one(system, source, work, limits, args.timeout)
            if result["ok"]:
                cpu_after = result.pop("cpu_total")
                result["cpu_s"] = (cpu_after.children_user + cpu_after.children_system) - (
                    cpu_before.children_user + cpu_before.children_system
                )
            runs.append(result)
            status = f"{result['wall_s']:.1f} s" if result["ok"] else "FAILED"
            print(f"[{rep + 1}/{args.reps}] {system}: {status}", flush=True)
    shutil.rmtree(work, ignore_errors=True)

    meta = {
        "size": args.size,
        "rows": rows,
        "files": files,
        "input_mib": sum(os.path.getsize(os.path.join(source, f)) for f in os.listdir(source)) / 2**20,
        "reps": args.reps,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "skipped": skipped,
        "limits": {"worker_memory": args.worker_memory, "duckdb_memory": args.duckdb_memory},
    }
    os.makedirs(args.results_dir, exist_ok=True)
    suffix = "".join(f"-{k.split('_')[0]}-{v}" for k, v in meta["limits"].items() if v)
    return write_results(os.path.join(args.results_dir, f"{args.size}{suffix}"), meta, summarise(runs, rows), runs)


def save(stem: str, meta: dict, summary: dict, runs: list[dict], table: str) -> None:
    """``stem``.json (every run, the summary, how they were made) and ``stem``.md (the table), then print it."""
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(table if table.endswith("\n") else table + "\n")
    print(table)


def write_results(stem: str, meta: dict, summary: dict, runs: list[dict]) -> dict:
    """``stem``.json (every run), .md (the table) and .png (the chart)."""
    table = markdown(summary, meta)
    save(stem, meta, summary, runs, table)
    chart(summary, meta, stem + ".png")
    if meta["skipped"]:
        print(f"skipped (package not installed): {', '.join(meta['skipped'])}")
    return {"meta": meta, "summary": summary}


if __name__ == "__main__":
    main()
