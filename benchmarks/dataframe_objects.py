"""``shuffle(ddf)`` of list columns as ``dd.read_parquet`` gives them (object columns of numpy arrays), against
reading and writing the same columns with Dask alone.

    python benchmarks/dataframe_objects.py [--rows 500000] [--reps 3]

Writes two Parquet files of ``--rows`` rows in all (an id, an embedding of 8
floats, a float list of 0 to 15 values), then times, on the sync scheduler, in
this process, alternating: ``daskpile.shuffle(dd.read_parquet(src, columns=[id,
c]), piles=16, seed=1).to_parquet(...)`` and ``dd.read_parquet(...).to_parquet(...)``
for each list column ``c``.  Prints each one's median and range.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import dask
import dask.dataframe as dd
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import daskpile


def write_source(directory: str, rows: int) -> list[str]:
    rng = np.random.default_rng(0)
    files = []
    for k, part in enumerate(np.array_split(np.arange(rows), 2)):
        n = len(part)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * 8, np.float32)), 8)
        lengths = rng.integers(0, 16, n)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        floats = pa.ListArray.from_arrays(offsets, pa.array(rng.random(int(lengths.sum()), np.float32)))
        path = os.path.join(directory, f"part-{k}.parquet")
        pq.write_table(pa.table({"id": part, "embedding": embedding, "floats": floats}), path)
        files.append(path)
    return files


def systems_for(files: list[str], columns: list[str], schema: pa.Schema, out: str) -> dict:
    """The two ways to write ``columns`` of ``files`` to ``out``, as functions to time."""
    kept = pa.schema([schema.field(c) for c in columns])  # (Dask infers none from object columns)

    def shuffled():
        frame = daskpile.shuffle(dd.read_parquet(files, columns=columns), piles=16, seed=1)
        frame.to_parquet(out, schema=kept, write_index=False)

    def copied():
        dd.read_parquet(files, columns=columns).to_parquet(out, schema=kept, write_index=False)

    return {"daskpile.shuffle(ddf)": shuffled, "read_parquet, to_parquet": copied}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="daskpile-objects-")
    files = write_source(work, args.rows)
    schema = pq.read_schema(files[0])
    out = os.path.join(work, "out")
    seconds: dict[str, list[float]] = {}
    with dask.config.set(scheduler="sync"):
        for _ in range(args.reps):
            for column in ["embedding", "floats"]:
                for name, run in systems_for(files, ["id", column], schema, out).items():
                    shutil.rmtree(out, ignore_errors=True)
                    seconds.setdefault(f"{name}, {column}", []).append(timed(run))
    shutil.rmtree(work, ignore_errors=True)
    print(f"{args.rows:,} rows, sync scheduler, {args.reps} runs each, alternating: seconds, median (min-max)")
    for name, values in seconds.items():
        print(f"  {name}: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
