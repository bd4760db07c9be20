"""The rank of every row of an order column across many files, without any process holding the column.

For ``quality`` on an order column that is not a dense range of integers
(timestamps, sparse ids, strings): a sort on Dask, through scratch, in three
steps of tasks:

1. per file: its values sent to buckets of the value range (bounds from a
   sample of every file), written to scratch grouped by bucket, with where
   each came from (file, row);
2. per bucket: its values sorted, so each row's rank is the bucket's offset
   plus its place in the bucket; the ranks written back to scratch grouped
   by file;
3. per file (``read_ranks``): its rows' ranks in row order.

A task holds one file's column, or one bucket: ``BUCKET_ROWS`` rows, whatever
the row count.  Two equal values are an error, as in memory.
"""

from __future__ import annotations

import dataclasses
import math

import dask
import numpy as np
import pyarrow as pa

from daskpile import _kernels
from daskpile._scratch import PileReader, Scratch

BUCKET_ROWS = 4_000_000  # a step-2 task sorts this many values (about 100 MiB with their rows' origins)
SAMPLE_PER_FILE = 512  # evenly spaced values of each file, for the buckets' bounds


def sample(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Evenly spaced values of one file's column, as sortable numbers (or strings)."""
    step = max(1, len(values) // SAMPLE_PER_FILE)
    return sortable(values.take(pa.array(np.arange(0, len(values), step))))


def sortable(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The values as a NumPy array that sorts as they do: numbers and times as numbers, text as objects."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    kind = values.type
    if pa.types.is_dictionary(kind):
        values, kind = values.dictionary_decode(), kind.value_type
    if pa.types.is_temporal(kind):
        width = pa.int32() if kind.bit_width == 32 else pa.int64()
        return values.view(width).to_numpy(zero_copy_only=False)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return values.to_numpy(zero_copy_only=False)
    return np.asarray(values.to_pylist(), dtype=object)  # text, decimals: compared as Python compares them


@dataclasses.dataclass(frozen=True)
class Ranked:
    """Where the ranks are: step 2's scratch (a partition per bucket, a pile per file), each file's last rank."""

    scratch: Scratch
    root: Scratch  # the directory of both steps' scratch, removed by ``remove``
    rows: tuple[int, ...]
    lasts: tuple[int, ...]

    def remove(self) -> None:
        self.root.remove()

    def read_ranks(self, file: int) -> np.ndarray:
        """The ranks of the rows of file ``file``, in row order."""
        rank = np.empty(self.rows[file], dtype=np.int64)
        with PileReader(self.scratch) as reader:
            for batch in reader.pile(file):
                rank[batch.column(0).to_numpy()] = batch.column(1).to_numpy()
        return rank


def rank_files(
    read_column, files: list, rows: list[int], samples: list[np.ndarray], scratch_url, storage_options
) -> Ranked:
    """Steps 1 and 2 as Dask tasks (``read_column(file)`` gives a file's order column); ``remove()`` it after use.

    ``scratch_url`` is where the scratch goes (default: the local temporary
    directory), somewhere every worker reaches.
    """
    n = sum(rows)
    bounds = _bounds(samples, math.ceil(n / BUCKET_ROWS))
    buckets = len(bounds) + 1
    root = Scratch.create(scratch_url, storage_options, len(files))
    by_bucket = dataclasses.replace(root, directory=f"{root.directory}/by-bucket")
    by_file = Scratch(root.fs, f"{root.directory}/by-file", buckets)
    for step in (by_bucket, by_file):  # scratch files are written only into a directory that exists
        root.fs.makedirs(step.directory, exist_ok=True)
    try:
        return _sort(read_column, files, rows, bounds, root, by_bucket, by_file)
    except BaseException:
        root.remove()  # (a repeated value, an unreadable file): nothing to keep
        raise


def _sort(read_column, files, rows, bounds, root, by_bucket, by_file) -> Ranked:
    """Step 1, then step 2: values to buckets, buckets sorted into ranks grouped by file."""
    buckets = len(bounds) + 1
    counts = dask.compute(
        *[dask.delayed(_to_buckets)(read_column, f, k, bounds, by_bucket) for k, f in enumerate(files)]
    )
    per_bucket = np.sum(counts, axis=0) if counts else np.zeros(buckets, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(per_bucket)[:-1]))
    lasts = dask.compute(
        *[dask.delayed(_rank_bucket)(by_bucket, by_file, j, int(starts[j]), rows, len(files)) for j in range(buckets)]
    )
    last_of_file = [-1] * len(files)
    for found in lasts:
        for file, rank in found.items():
            last_of_file[file] = rank
    by_bucket.remove()
    return Ranked(by_file, root, tuple(rows), tuple(last_of_file))


def _bounds(samples: list[np.ndarray], buckets: int) -> np.ndarray:
    """``buckets - 1`` values cutting the pooled sample into equal parts."""
    pooled = np.sort(np.concatenate(samples)) if samples else np.zeros(0)
    if buckets <= 1 or not len(pooled):
        return pooled[:0]
    return pooled[[len(pooled) * b // buckets for b in range(1, buckets)]]


def _to_buckets(read_column, file, k: int, bounds: np.ndarray, scratch: Scratch) -> np.ndarray:
    """Step 1 for one file: (its row, its value) grouped by bucket, to scratch; the count in each bucket."""
    keys = sortable(read_column(file))
    bucket = np.searchsorted(bounds, keys, side="right").astype(np.uint32)
    table = pa.table({"row": pa.array(np.arange(len(keys), dtype=np.int64)), "key": _as_arrow(keys),
                      "file": pa.array(np.full(len(keys), k, dtype=np.int32))})  # fmt: skip
    grouped, counts = _kernels.group_by_pile(table, bucket, len(bounds) + 1)
    scratch.write(k, 0, grouped, counts)
    return counts


def _as_arrow(keys: np.ndarray) -> pa.Array:
    return pa.array(keys.tolist() if keys.dtype == object else keys)


def _rank_bucket(by_bucket: Scratch, by_file: Scratch, j: int, start: int, rows: list[int], files: int) -> dict:
    """Step 2 for one bucket: its values sorted into ranks, written back grouped by file; each file's last row."""
    with PileReader(by_bucket) as reader:
        batches = [b for b in reader.pile(j) if b.num_rows]
    table = pa.Table.from_batches(batches) if batches else None
    if table is None:
        keys, origin_rows, origin_files = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int32)
    else:
        keys = sortable(table.column("key"))
        origin_rows = table.column("row").to_numpy()
        origin_files = table.column("file").to_numpy()
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    repeated = int(np.count_nonzero(ordered[1:] == ordered[:-1])) if len(ordered) > 1 else 0
    if repeated:
        raise ValueError(f"the order column has {repeated:,} repeated values: it must identify each row's position")
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = start + np.arange(len(keys))
    ranks = pa.table({"row": pa.array(origin_rows), "rank": pa.array(rank)})
    grouped, counts = _kernels.group_by_pile(ranks, origin_files.astype(np.uint32), files)
    by_file.write(j, 0, grouped, counts)
    last = origin_rows == np.array(rows, dtype=np.int64)[origin_files] - 1
    return dict(zip(origin_files[last].tolist(), rank[last].tolist(), strict=True))
