"""Time and peak memory of ``daskpile quality`` on a shuffled dataset, per process.

    python benchmarks/quality_memory.py --size A        # 10 M rows
    python benchmarks/quality_memory.py --size B        # 100 M rows
    python benchmarks/quality_memory.py --size B --order-column ts --dest benchmarks/data/B-piles-64

Shuffles the reference dataset once (cached; or measures ``--dest``), then runs
``daskpile quality --order-column id --label-column label`` in a fresh process on a LocalCluster
of 2 workers limited to 2 GiB each, polling the resident memory of every
process of the tree.  ``--order-column ts`` (a timestamp, not a dense range of
integers) measures the path that ranks the column by a sort on Dask.  Prints one JSON line per run and appends it to
benchmarks/results/quality-memory.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import SIZES, dataset, machine, peak_rss  # noqa: E402


def shuffled(size: str, data_dir: str) -> str:
    dest = os.path.join(data_dir, f"{size}-shuffled")
    if not os.path.exists(os.path.join(dest, "_daskpile.json")):
        daskpile = os.path.join(os.path.dirname(sys.executable), "daskpile")
        subprocess.run(
            [daskpile, "shuffle", dataset(size, data_dir), dest, "--seed", "1", "-q", "--overwrite"], check=True
        )
    return dest


def measure(dest: str, order_column: str = "id") -> dict:
    daskpile = os.path.join(os.path.dirname(sys.executable), "daskpile")
    args = [daskpile, "quality", dest, "--order-column", order_column, "--label-column", "label", "--json",
            "--workers", "2", "--memory-limit", "2GiB"]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak_tree, peak_process = peak_rss(process, start)
    stdout, stderr = process.communicate()
    report = json.loads(stdout)[0] if stdout.strip() else None
    return {
        "wall_s": round(time.perf_counter() - start, 2),
        "peak_largest_process_mib": round(peak_process / 2**20),
        "peak_tree_mib": round(peak_tree / 2**20),
        "exit": process.returncode,
        "ok": report and report["ok"],
        "rows": report and report["rows"],
        "error": stderr.decode()[-500:] if process.returncode not in (0, 1) else None,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="A")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--order-column", default="id", help="id (a dense range) or ts (a timestamp: sorted on Dask)")
    parser.add_argument("--dest", help="A shuffle result of the dataset to measure [made with auto piles]")
    args = parser.parse_args(argv)
    dest = args.dest or shuffled(args.size, args.data_dir)
    for _ in range(args.reps):
        measured = measure(dest, args.order_column)
        result = {"size": args.size, "order_column": args.order_column, "date": datetime.date.today().isoformat(),
                  "dest": os.path.basename(dest.rstrip("/")), **measured}  # fmt: skip
        result["machine"] = machine()["cpu"]
        print(json.dumps(result), flush=True)
        os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
        with open(os.path.join(HERE, "results", "quality-memory.jsonl"), "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
