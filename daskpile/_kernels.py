"""The two kernels of the pile shuffle: pure functions on Arrow data.

``scatter`` sends each row of one input partition to a uniformly random pile
and groups the rows by pile; ``permute`` puts the rows of one pile into a
uniformly random order.  Composed over all partitions and piles they produce a
uniformly random permutation of the whole input (see DESIGN.md: choosing the
pile is a radix sort on the leading digits of a uniform key, permuting inside
a pile sorts on the remaining digits).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def scatter(table: pa.Table, piles: int, rng: np.random.Generator) -> tuple[pa.RecordBatch, np.ndarray]:
    """Assign every row to a uniformly random pile and group the rows by pile.

    Returns one record batch whose rows are ordered by pile (stably, so rows
    keep their input order inside a pile; pass 2 permutes them) and the row
    count of each pile.  Pile ``j`` is ``batch.slice(offsets[j], counts[j])``.

    >>> import pyarrow as pa, numpy as np
    >>> batch, counts = scatter(pa.table({"x": [1, 2, 3]}), 2, np.random.default_rng(0))
    >>> int(counts.sum()), batch.num_rows
    (3, 3)
    """
    return group_by_pile(table, random_piles(rng, table.num_rows, piles), piles)


def random_piles(rng: np.random.Generator, rows: int, piles: int) -> np.ndarray:
    """A uniformly random pile for each of ``rows`` rows."""
    dtype = np.uint16 if piles <= 1 << 16 else np.uint32
    return rng.integers(0, piles, size=rows, dtype=dtype)


def group_by_pile(table: pa.Table, pile_of_row: np.ndarray, piles: int) -> tuple[pa.RecordBatch, np.ndarray]:
    """The rows of ``table`` ordered by their pile, stably, and the row count of each pile."""
    counts = np.bincount(pile_of_row, minlength=piles).astype(np.int64)
    if piles > 1:
        # A stable sort of 16-bit keys is a radix sort in numpy: linear time.
        table = table.take(np.argsort(pile_of_row, kind="stable"))
    return as_record_batch(table), counts


def permute(table: pa.Table, rng: np.random.Generator) -> pa.Table:
    """Return the rows of ``table`` in a uniformly random order.

    Called on one pile at a time, so the random ``take`` stays within a pile
    (cache friendly) and memory is bounded by the pile.

    >>> import pyarrow as pa, numpy as np
    >>> sorted(permute(pa.table({"x": [1, 2, 3]}), np.random.default_rng(0))["x"].to_pylist())
    [1, 2, 3]
    """
    if table.num_rows <= 1:
        return table
    return table.take(rng.permutation(table.num_rows))


def as_record_batch(table: pa.Table) -> pa.RecordBatch:
    """The whole table as a single record batch (empty tables included)."""
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=field.type) for field in table.schema], schema=table.schema
        )
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def offsets(counts: np.ndarray) -> np.ndarray:
    """Start row of each pile in a batch grouped by ``scatter``.

    >>> offsets(np.array([2, 0, 3])).tolist()
    [0, 2, 2]
    """
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
