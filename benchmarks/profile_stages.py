"""Where the time of a shuffle goes: each stage of both passes, timed on one thread.

    python benchmarks/profile_stages.py [--size A] [--piles 64]

Runs the same kernels as the Dask tasks, in-process and in sequence, and
prints the CPU seconds of every stage summed over the dataset, so that what
bounds the wall time on N cores is visible (about sum / N when the stages
parallelise well).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import dataset  # noqa: E402

from daskpile import _fingerprint, _kernels, _random, _scratch  # noqa: E402
from daskpile._passes import write_parquet  # noqa: E402
from daskpile._storage import filesystem  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="A")
    parser.add_argument("--piles", type=int, default=64)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    parser.add_argument("--files", type=int, default=None, help="only the first N files of the dataset")
    args = parser.parse_args(argv)
    source = dataset(args.size, args.data_dir)
    files = sorted(os.path.join(source, f) for f in os.listdir(source) if f.endswith(".parquet"))[: args.files]
    work = tempfile.mkdtemp(prefix="daskpile-profile-")
    fs, _ = filesystem(work)
    run = _scratch.Scratch.create(work, None, len(files))
    seconds = collections.Counter()

    def timed(stage, fn, *a):
        start = time.perf_counter()
        result = fn(*a)
        seconds[stage] += time.perf_counter() - start
        return result

    all_counts = np.zeros(args.piles, dtype=np.int64)
    for k, path in enumerate(files):
        table = timed("pass 1: read Parquet", pq.read_table, path)
        timed("pass 1: fingerprint", _fingerprint.of, table)
        grouped, counts = timed(
            "pass 1: assign piles + group (take)",
            _kernels.scatter,
            table,
            args.piles,
            _random.generator(1, _random.SCATTER, k),
        )
        timed("pass 1: write scratch IPC", _scratch.write_piles, fs, run.path(k), grouped, counts)
        all_counts += counts
    with _scratch.PileReader(run) as reader:
        for j in range(args.piles):
            batches = timed("pass 2: read scratch slices", reader.pile, j)
            table = timed("pass 2: concatenate", pa.Table.from_batches, batches)
            permuted = timed("pass 2: permute (take)", _kernels.permute, table, _random.generator(1, _random.GATHER, j))
            timed("pass 2: fingerprint", _fingerprint.of, permuted)
            timed("pass 2: write Parquet", write_parquet, permuted, fs, os.path.join(work, f"part-{j}.parquet"))
    shutil.rmtree(work)
    total = sum(seconds.values())
    print(f"{args.size}, {args.piles} piles, one thread: {total:.1f} s of work")
    for stage, s in seconds.items():
        print(f"  {stage:<38} {s:6.2f} s  {100 * s / total:4.0f} %")


if __name__ == "__main__":
    main()
