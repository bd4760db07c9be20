"""What the loader's epoch costs beyond a plain read: the same epoch with parts of its work taken out.

    python benchmarks/loader_parts.py [--size A] [--epochs 3] [--rounds 2]

Each variant runs in a fresh process, in turns, ``--epochs`` epochs each, and
prints the wall and CPU seconds of every epoch:

- ``plain``: ``pq.read_table`` of each pile and 1024-row slices (the issue's limit);
- ``loader``: ``PileLoader(prefetch=1, mix=1)``, as the loader benchmark runs it;
- ``in file order``: the loader with each pile's permutation the identity (no
  Philox draw; the take gathers consecutive rows);
- ``no take``: the loader with neither permutation nor take (each part a slice).

The last two are not loaders anyone should use (their order is the file's);
they show what the uniform permutation costs.  Prints and saves nothing else.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ["plain", "loader", "in file order", "no take"]

CHILD = """
import glob, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq, pyarrow.dataset  # (read_table imports it: not timed)
import daskpile
from daskpile.loader import reading

variant, path, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
if variant in ("in file order", "no take"):
    reading.group_permutation = lambda seed, epoch, group: np.arange(group.rows)
if variant == "no take":
    def part(source, start, stop):
        values = source.values.slice(start, stop - start)
        if source.view_type is None:
            return values
        views = pa.Array.from_buffers(source.view_type, len(values), values.buffers(), offset=values.offset)
        return views.cast(source.type)
    reading._take_parts = lambda source, order, parts: [part(source, a, b) for a, b in parts]
files = sorted(glob.glob(path + "/*.parquet"))
for epoch in range(epochs):
    cpu, wall, rows = time.process_time(), time.perf_counter(), 0
    if variant == "plain":
        for f in files:
            table = pq.read_table(f)
            for start in range(0, table.num_rows, 1024):
                rows += table.slice(start, 1024).num_rows
    else:
        loader = daskpile.PileLoader(path, batch_size=1024, seed=0, epoch=epoch, prefetch=1, mix=1, output="arrow")
        for batch in loader:
            rows += batch.num_rows
    print(f"{time.perf_counter() - wall:.3f} {time.process_time() - cpu:.3f} {rows}", flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="A")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    args = parser.parse_args()
    path = os.path.join(args.data_dir, f"{args.size}-piles-64")
    if not glob.glob(os.path.join(path, "*.parquet")):
        sys.exit(f"no piles at {path}: run benchmarks/loader.py --size {args.size} once, which writes them")
    print(f"{args.size}: {len(glob.glob(os.path.join(path, '*.parquet')))} piles; wall s / CPU s of each epoch")
    for round_ in range(args.rounds):
        for variant in VARIANTS:
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", CHILD, variant, path, str(args.epochs)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            epochs = [line.split() for line in done.stdout.split("\n") if line.strip()]
            shown = ", ".join(f"{wall} / {cpu}" for wall, cpu, _ in epochs)
            print(f"round {round_ + 1}  {variant:14s} {shown}  ({time.perf_counter() - started:.1f} s with start-up)")


if __name__ == "__main__":
    main()
