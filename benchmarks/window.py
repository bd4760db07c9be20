"""What a moving window costs: appending new rows against reshuffling the whole window, in one session.

    python benchmarks/window.py --size B --new-rows 1000000 --reps 3

The window is the reference dataset of ``--size`` shuffled into ``--piles``
piles (made once, kept in the data directory).  Each round, on a fresh
hard-linked copy of it, in fresh processes of the ``daskpile`` command (on
Dask's threaded scheduler, or ``--scheduler local``), one after the other:

- ``append``: ``daskpile append NEW WINDOW`` (the new rows into the window's piles);
- ``shuffle new rows alone``: ``daskpile shuffle NEW OUT --piles P``, the floor an append is held to;
- ``expire``: ``daskpile expire WINDOW --keep 1`` (a manifest version, no data read).

Then, ``--full-reps`` times, what users do today after each append: a full
reshuffle of the window (the old rows and the new), by ``daskpile shuffle`` and
by DuckDB ``ORDER BY random()``; and ``daskpile compact`` of the appended window
(the full second pass for readers of plain files).  Writes
``results/window-SIZE.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import SIZES, dataset, machine, peak_rss, save, settle  # noqa: E402

THREADS = int(os.environ.get("BENCH_THREADS", "2"))
DAILY = ["append", "shuffle new rows alone", "expire"]
FULL = ["full reshuffle: daskpile", "full reshuffle: duckdb ORDER BY random()", "compact"]


def new_rows(data_dir: str, start: int, rows: int, files: int = 2) -> str:
    """``rows`` new rows of the reference dataset's shape, ids going on from ``start``, made once."""
    import pyarrow.parquet as pq

    from daskpile.datasets import reference_table

    path = os.path.join(data_dir, f"new-{start}-{rows}")
    if not os.path.exists(os.path.join(path, "_COMPLETE")):
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        bounds = [start + rows * k // files for k in range(files + 1)]
        for k in range(files):
            table = reference_table(bounds[k], bounds[k + 1], start + rows)
            pq.write_table(table, os.path.join(path, f"part-{k}.parquet"), row_group_size=100_000)
        open(os.path.join(path, "_COMPLETE"), "w").close()
    return path


def window_of(size: str, data_dir: str, piles: int) -> str:
    """The reference dataset shuffled into ``piles`` piles (seed 0): generation 0 of the window, made once."""
    import dask

    import daskpile

    dest = os.path.join(data_dir, f"{size}-piles-{piles}")
    if not os.path.exists(os.path.join(dest, "_daskpile.json")):
        print(f"shuffling {size} into {dest} ...", flush=True)
        with dask.config.set(scheduler="threads"):
            daskpile.shuffle_parquet(dataset(size, data_dir), dest, piles=piles, seed=0, overwrite=True)
    return dest


def fresh_copy(window: str, target: str) -> str:
    """A copy of the window whose files are hard links: an append writes beside them, never into them."""
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    subprocess.run(["cp", "-al", window, target], check=True)
    return target


def timed(name: str, args: list[str], warm: list[str], tmp: str) -> dict:
    """One command in a fresh process, its own TMPDIR: wall seconds and the peak memory of its tree."""
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for path in warm:
        settle(path)
    start = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": tmp})
    peak, _ = peak_rss(process, start)
    wall = time.perf_counter() - start
    stdout, stderr = process.communicate()
    shutil.rmtree(tmp, ignore_errors=True)
    if process.returncode:
        raise RuntimeError(f"{name}: {stderr.decode()[-2000:]}")
    return {"system": name, "wall_s": wall, "peak_rss_mib": peak / 2**20, "stdout": stdout.decode()[-500:]}


def daskpile(*args: str) -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), "daskpile"), *args, "-q"]


def duckdb_command(sources: list[str], dest: str) -> list[str]:
    globs = ", ".join(f"'{s}/*.parquet'" for s in sources)
    script = (
        "import duckdb, os; con = duckdb.connect(); "
        f"con.execute('SET threads = {THREADS}'); os.makedirs({dest!r}, exist_ok=True); "
        f"con.execute(\"COPY (SELECT * FROM read_parquet([{globs}]) ORDER BY random()) TO '{dest}' "
        '(FORMAT parquet, PER_THREAD_OUTPUT)")'
    )
    return [sys.executable, "-c", script]


def rounds(args, base: str, window: str, new: str, work: str) -> list[dict]:
    runs = []
    scheduler = ["--workers", str(THREADS)] if args.scheduler == "local" else ["--scheduler", args.scheduler]
    for rep in range(args.reps):
        copy = fresh_copy(window, os.path.join(work, "window"))
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        steps = {
            "append": daskpile("append", new, copy, *scheduler),
            "shuffle new rows alone": daskpile("shuffle", new, out, "--piles", str(args.piles), *scheduler),
            "expire": daskpile("expire", copy, "--keep", "1"),
        }
        pair = DAILY[:2] if rep % 2 == 0 else DAILY[1::-1]  # the two compared take turns to go first
        for name in [*pair, "expire"]:  # expire after the append it expires
            runs.append({**timed(name, steps[name], [new], os.path.join(work, "tmp")), "round": rep})
            print(f"  round {rep + 1}: {name} {runs[-1]['wall_s']:.2f} s", flush=True)
    for rep in range(args.full_reps):
        copy = fresh_copy(window, os.path.join(work, "window"))
        subprocess.run(daskpile("append", new, copy, *scheduler), check=True)
        out = os.path.join(work, "out")
        steps = {
            "full reshuffle: daskpile": daskpile("shuffle", base, new, out, "--piles", str(args.piles), *scheduler),
            "full reshuffle: duckdb ORDER BY random()": duckdb_command([base, new], out),
            "compact": daskpile("compact", copy, "--retain", "0", *scheduler),
        }
        for name in FULL:
            shutil.rmtree(out, ignore_errors=True)
            runs.append({**timed(name, steps[name], [base, new], os.path.join(work, "tmp")), "round": rep})
            print(f"  full {rep + 1}: {name} {runs[-1]['wall_s']:.2f} s", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(os.path.join(work, "window"), ignore_errors=True)
    return runs


def summarise(runs: list[dict]) -> dict:
    summary = {}
    for name in DAILY + FULL:
        walls = [r["wall_s"] for r in runs if r["system"] == name]
        if walls:
            summary[name] = {
                "runs": len(walls),
                "wall_median_s": statistics.median(walls),
                "wall_min_s": min(walls),
                "wall_max_s": max(walls),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs if r["system"] == name),
            }
    append = summary["append"]["wall_median_s"]
    for entry in summary.values():
        entry["x_append"] = entry["wall_median_s"] / append
    return summary


def markdown(summary: dict, meta: dict) -> str:
    m = meta["machine"]
    lines = [
        f"Window {meta['size']}: {meta['window_rows']:,} rows in {meta['piles']} piles; append {meta['new_rows']:,} "
        f"rows; daskpile on {meta['scheduler']}; {m['cores']} cores, {m['memory_gib']} GiB ({m['cpu']}); "
        f"{meta['date']}; commit {meta['commit']}",
        "",
        "| step | wall s, median (min-max) | runs | peak MiB (tree) | x append |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, e in summary.items():
        lines.append(
            f"| {name} | {e['wall_median_s']:.2f} ({e['wall_min_s']:.2f}-{e['wall_max_s']:.2f}) | {e['runs']} | "
            f"{e['peak_rss_mib']:,.0f} | {e['x_append']:.2f} |"
        )
    a = summary["append"]["wall_median_s"]
    ratios = [f"append / shuffle of the new rows alone: {a / summary['shuffle new rows alone']['wall_median_s']:.2f}"]
    for name in FULL[:2]:
        if name in summary:
            ratios.append(f"append / {name}: {a / summary[name]['wall_median_s']:.3f}")
    return "\n".join([*lines, "", *[f"- {r}" for r in ratios], ""])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="B")
    parser.add_argument("--new-rows", type=int, default=1_000_000)
    parser.add_argument("--piles", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--scheduler", default="threads", help="threads (default), or local: a LocalCluster of BENCH_THREADS workers"
    )
    parser.add_argument("--full-reps", type=int, default=1)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    os.makedirs(args.data_dir, exist_ok=True)
    base = dataset(args.size, args.data_dir)
    window = window_of(args.size, args.data_dir, args.piles)
    total = SIZES[args.size][0]
    new = new_rows(args.data_dir, total, args.new_rows)
    runs = rounds(args, base, window, new, os.path.join(args.data_dir, "window-bench"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout
    meta = {
        "size": args.size,
        "window_rows": total,
        "new_rows": args.new_rows,
        "piles": args.piles,
        "scheduler": args.scheduler,
        "date": datetime.date.today().isoformat(),
        "commit": commit.strip(),
        "machine": machine(),
    }
    summary = summarise(runs)
    save(os.path.join(args.results_dir, f"window-{args.size}"), meta, summary, runs, markdown(summary, meta))
    return summary


if __name__ == "__main__":
    main()
