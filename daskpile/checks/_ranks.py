"""The rank of every row of an order column across many files, without any process holding the column.

For ``quality`` on an order column that is not a dense range of integers
(timestamps, sparse ids, text): a sort on Dask, through scratch, in three
steps of tasks:

1. per file: its values sent to buckets of the value range (bounds from a
   sample of every file, one value in ``SAMPLE_EVERY`` rows), written to
   scratch grouped by bucket, with where each came from (file, row);
2. per bucket: its values sorted (by Arrow, whatever their type), so each
   row's rank is the bucket's offset plus its place in the bucket; the ranks
   written back to scratch grouped by file;
3. per file (``Ranked.read_ranks``): its rows' ranks in row order.

A task holds one file's column, or one bucket: about ``BUCKET_ROWS`` rows
(the sample's error aside), whatever the row count.  Two equal values, a NaN,
or files whose columns have different types are errors, as in memory.
"""

from __future__ import annotations

import dataclasses
import math

import dask
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from daskpile import _kernels
from daskpile._storage import full_url
from daskpile.engine._places import refuse_blind_workers
from daskpile.engine._scratch import PileReader, Scratch

BUCKET_ROWS = 4_000_000  # a step-2 task sorts this many values (about 100 MiB of numbers with their origins)
SAMPLE_EVERY = 1024  # rows per value of the sample the buckets' bounds come from: it follows each file's size


def sample(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One value in ``SAMPLE_EVERY`` of one file's column (at least one), for the buckets' bounds."""
    values = _plain(values)
    step = min(SAMPLE_EVERY, max(1, len(values)))
    return values.take(pa.array(np.arange(0, len(values), step)))


def _plain(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return values.dictionary_decode() if pa.types.is_dictionary(values.type) else values


@dataclasses.dataclass(frozen=True)
class Ranked:
    """Where the ranks are: step 2's scratch (a partition per bucket, a pile per file), each file's last rank."""

    scratch: Scratch
    root: Scratch  # the directory of both steps' scratch, removed by ``remove``
    rows: tuple[int, ...]
    lasts: tuple[int, ...]

    def read_ranks(self, file: int) -> np.ndarray:
        """The ranks of the rows of file ``file``, in row order."""
        rank = np.empty(self.rows[file], dtype=np.int64)
        with PileReader(self.scratch) as reader:
            for batch in reader.pile(file):
                rank[batch.column(0).to_numpy()] = batch.column(1).to_numpy()
        return rank

    def remove(self) -> None:
        self.root.remove()


def rank_files(
    read_column, files: list, rows: list[int], samples: list[pa.Array], scratch_url, storage_options
) -> Ranked:
    """Steps 1 and 2 as Dask tasks (``read_column(file)`` gives a file's order column); ``remove()`` it after use.

    ``scratch_url`` is where the scratch goes (default: the local temporary
    directory), somewhere every worker reaches.
    """
    bounds = _bounds(samples, math.ceil(sum(rows) / BUCKET_ROWS))
    root = Scratch.create(scratch_url, storage_options, len(files))
    try:  # refused now, not when a worker finds nothing
        refuse_blind_workers(root.fs, root.directory, f"scratch {full_url(root.fs, root.directory)!r}",
                             "scratch='s3://bucket/prefix' (--scratch)")  # fmt: skip
    except ValueError:
        root.remove()
        raise
    by_bucket = dataclasses.replace(root, directory=f"{root.directory}/by-bucket")
    by_file = Scratch(root.fs, f"{root.directory}/by-file", len(bounds) + 1)
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


def _bounds(samples: list[pa.Array], buckets: int) -> list[pa.Scalar]:
    """``buckets - 1`` values cutting the pooled sample into equal parts."""
    samples = [s for s in samples if len(s)]
    if buckets <= 1 or not samples:
        return []
    pooled = _same_type(lambda: pa.chunked_array(samples))
    pooled = pooled.take(pc.sort_indices(pooled))
    return [pooled[len(pooled) * b // buckets] for b in range(1, buckets)]


def _same_type(make):
    try:
        return make()
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"the order column has another type in some files: {e}") from None


def _to_buckets(read_column, file, k: int, bounds: list[pa.Scalar], scratch: Scratch) -> np.ndarray:
    """Step 1 for one file: (its value, row) grouped by bucket, to scratch; the count in each bucket.

    A value's bucket is the number of bounds at or below it: a comparison per
    bound, by Arrow, for any type that has an order.
    """
    values = _plain(read_column(file))
    bucket = np.zeros(len(values), dtype=np.uint32)
    for bound in bounds:
        bucket += pc.greater_equal(values, bound).to_numpy(zero_copy_only=False).astype(np.uint32)
    table = pa.table({"key": values, "row": pa.array(np.arange(len(values), dtype=np.int64)),
                      "file": pa.array(np.full(len(values), k, dtype=np.int32))})  # fmt: skip
    grouped, counts = _kernels.group_by_pile(table, bucket, len(bounds) + 1)
    scratch.write(k, 0, grouped, counts)
    return counts


def _rank_bucket(by_bucket: Scratch, by_file: Scratch, j: int, start: int, rows: list[int], files: int) -> dict:
    """Step 2 for one bucket: its values sorted into ranks, written back grouped by file; each file's last row."""
    with PileReader(by_bucket) as reader:
        batches = [b for b in reader.pile(j) if b.num_rows]
    if not batches:
        by_file.write(j, 0, pa.record_batch({"row": pa.array([], pa.int64()), "rank": pa.array([], pa.int64())}),
                      np.zeros(files, dtype=np.int64))  # fmt: skip
        return {}
    table = _same_type(lambda: pa.Table.from_batches(batches))
    keys = table.column("key")
    if pa.types.is_floating(keys.type) and pc.any(pc.is_nan(keys)).as_py():
        raise ValueError("the order column has NaN values: it must identify each row's position")
    order = pc.sort_indices(keys).to_numpy()
    ordered = keys.take(order)
    repeated = pc.sum(pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))).as_py() or 0
    if repeated:
        raise ValueError(f"the order column has {repeated:,} repeated values: it must identify each row's position")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = start + np.arange(len(order))
    origin_rows = table.column("row").to_numpy()
    origin_files = table.column("file").to_numpy()
    ranks = pa.table({"row": pa.array(origin_rows), "rank": pa.array(rank)})
    grouped, counts = _kernels.group_by_pile(ranks, origin_files.astype(np.uint32), files)
    by_file.write(j, 0, grouped, counts)
    last = origin_rows == np.array(rows, dtype=np.int64)[origin_files] - 1
    return dict(zip(origin_files[last].tolist(), rank[last].tolist(), strict=True))
