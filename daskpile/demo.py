"""The demo: make a sorted dataset, shuffle it on a LocalCluster, prove the result.

python -m daskpile.demo --rows 3000000 --piles 32
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import daskpile
from daskpile.datasets import write_reference_dataset


def check_permutation(source_files: list[str], files: list[str]) -> tuple[pa.Table, str]:
    """Read the output in pile order and compare it, row for row, with the input (sorted by id)."""
    source = pa.concat_tables(pq.read_table(f) for f in source_files)
    rows = source.num_rows
    out = pa.concat_tables(pq.read_table(f) for f in files)
    ids = out["id"].to_numpy()
    if not np.array_equal(np.sort(ids), np.arange(rows)):
        raise SystemExit("FAILED: the output ids are not a permutation of the input ids")
    if not out.sort_by("id").equals(source):
        raise SystemExit("FAILED: some row's values changed")
    return out, f"all {rows:,} rows present exactly once, every value intact"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--piles", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--dir", default="demo-data", help="where the input and output go (replaced)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict")
    args = parser.parse_args(argv)
    say = (lambda *a: None) if args.quiet else print

    from distributed import Client

    from daskpile._compute import local_cluster

    source, dest = os.path.join(args.dir, "sorted"), os.path.join(args.dir, "shuffled")
    _clear(args.dir)
    os.makedirs(args.dir)
    open(os.path.join(args.dir, DEMO_MARKER), "w").close()
    start = time.perf_counter()
    write_reference_dataset(source, args.rows, args.files)
    say(
        f"wrote {args.rows:,} rows sorted by id (label 0 then 1) as {args.files} files in {source}/ "
        f"({time.perf_counter() - start:.1f} s)"
    )

    with (
        local_cluster(n_workers=args.workers, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        say(f"LocalCluster: {args.workers} workers, dashboard {client.dashboard_link}")
        report = daskpile.shuffle_parquet(source, dest, piles=args.piles, seed=args.seed)
    say(report)

    out, verdict = check_permutation(report.source_files, report.files)
    say(f"verified: {verdict}")
    say(f"first ids in output order: {out['id'].to_numpy()[:8].tolist()} ...")
    quality = daskpile.quality(dest, order_column="id", label_column="label")
    say(quality)
    if args.quiet:
        print(f"demo: {verdict}; {quality.verdict}")
    say(
        f"output: {len(report.files)} files {os.path.basename(report.files[0])} ... "
        f"{os.path.basename(report.files[-1])} and {os.path.basename(report.manifest)} in {dest}/"
    )


DEMO_MARKER = ".daskpile-demo"  # written into the demo's directory: only such a directory is ever replaced


def _clear(directory: str) -> None:
    """Remove a previous demo's directory, and nothing else: any other directory or file is refused."""
    if not os.path.exists(directory):
        return
    if not os.path.isdir(directory) or not os.path.exists(os.path.join(directory, DEMO_MARKER)):
        raise FileExistsError(
            f"{directory!r} exists and is not a previous demo's directory: give the demo a new directory"
        )
    shutil.rmtree(directory)


if __name__ == "__main__":
    main()
