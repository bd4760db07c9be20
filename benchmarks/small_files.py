"""The same rows as a few large files and as many small ones, side by side in one run.

    python benchmarks/small_files.py --reps 3              # A (40 files) against A-2000 (2,000 files)
    python benchmarks/small_files.py --reps 1 --small tiny --large tiny   # proves the script works

Every system runs on both datasets, alternating systems and datasets, each
run in a fresh process (``run.run_one``).  The table gives each system's
median on each dataset, the ratio of many files to few, and each daskpile
system's ratio to DuckDB on the same files.  Results go to
benchmarks/results/small-files.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import SIZES, dataset, machine, run_one, summarise  # noqa: E402
from systems import PEER  # noqa: E402

SYSTEMS = ["daskpile 64 piles", "daskpile 64 piles, threads", PEER]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--large", default="A", choices=SIZES, help="the dataset of few files")
    parser.add_argument("--small", default="A-2000", choices=SIZES, help="the dataset of many files")
    parser.add_argument("--systems", nargs="*", default=SYSTEMS)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    sources = {size: dataset(size, args.data_dir) for size in dict.fromkeys([args.large, args.small])}
    work = os.path.join(args.data_dir, "out")
    runs = {size: [] for size in sources}
    cases = [(size, system) for system in args.systems for size in sources]
    for rep in range(args.reps):
        for size, system in cases[rep % len(cases) :] + cases[: rep % len(cases)]:
            result = run_one(system, sources[size], work)
            runs[size].append(result)
            status = f"{result['wall_s']:.1f} s" if result["ok"] else "FAILED: " + result["error"][-300:]
            print(f"[{rep + 1}/{args.reps}] {size} {system}: {status}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    for size_runs in runs.values():  # CPU is not separable per run here: reported as not measured
        for r in size_runs:
            r.pop("cpu_total", None)
            r["cpu_s"] = float("nan")
    summaries = {size: summarise(size_runs, SIZES[size][0]) for size, size_runs in runs.items()}
    meta = {
        "large": args.large,
        "small": args.small,
        "files": {size: SIZES[size][1] for size in sources},
        "rows": SIZES[args.large][0],
        "reps": args.reps,
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
    }
    os.makedirs(args.results_dir, exist_ok=True)
    stem = os.path.join(args.results_dir, "small-files")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "summary": summaries, "runs": runs}, f, indent=1, default=str)
    table = markdown(summaries, meta)
    with open(stem + ".md", "w") as f:
        f.write(table + "\n")
    print(table)
    return summaries


def markdown(summaries: dict, meta: dict) -> str:
    large, small = meta["large"], meta["small"]
    m = meta["machine"]
    lines = [
        f"{meta['rows']:,} rows as {meta['files'][large]} files ({large}) and as {meta['files'][small]} files "
        f"({small}); {m['cores']} cores, {m['memory_gib']} GiB ({m['cpu']}); {meta['date']}; "
        f"{meta['reps']} runs each, alternating",
        "",
        f"| system | {large}: wall s, median (min-max) | {small}: wall s, median (min-max) | {small} / {large} "
        f"| work s {large} / {small} | x DuckDB on {small} |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for system in summaries[large]:
        a, b = summaries[large][system], summaries[small].get(system, {"ok": False})
        if not (a["ok"] and b["ok"]):
            lines.append(f"| {system} | {'ok' if a['ok'] else 'failed'} | {'ok' if b['ok'] else 'failed'} | | | |")
            continue
        vs = b.get("vs_duckdb")
        lines.append(
            f"| {system} | {a['wall_median_s']:.1f} ({a['wall_min_s']:.1f}-{a['wall_max_s']:.1f}) "
            f"| {b['wall_median_s']:.1f} ({b['wall_min_s']:.1f}-{b['wall_max_s']:.1f}) "
            f"| {b['wall_median_s'] / a['wall_median_s']:.2f} "
            f"| {a['work_median_s']:.1f} / {b['work_median_s']:.1f} | {f'{vs:.2f}' if vs else ''} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
