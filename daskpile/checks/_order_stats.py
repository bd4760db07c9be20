"""The statistics ``quality`` tests, computed from the rank sequence of an output order.

``rank[i]`` is the input position of the row at output position ``i``.  Two
ways to the same figures:

- ``in_memory(rank)``: from the whole rank array (8 bytes a row and the
  temporaries of NumPy), for any order column;
- ``by_file(...)``: file by file on Dask, for an order column of integers
  that are exactly the positions shifted (``id`` 0..n-1, or any dense range):
  a task holds one file, and the distances between consecutive ranks, whose
  entropy needs every distinct value, are counted in ``RANGES`` parts reduced
  apart, so no process holds more than a file or a part of the range.
"""

from __future__ import annotations

import dataclasses
import math

import dask
import numpy as np

HISTOGRAM_BINS = 50  # the quality figure's position histogram
RANGES = 64  # parts of the distance (and rank) range counted apart in ``by_file``


@dataclasses.dataclass(frozen=True)
class OrderStats:
    rows: int
    sum_d2: float  # sum over output positions of (rank - position)^2
    decile_table: np.ndarray  # 10 x 10 counts: input decile x output decile
    successions: int  # output neighbours that were input neighbours (rank + 1 or - 1)
    longest: int  # rows in the longest such stretch
    near: int  # output neighbours within `neighbours` input positions
    entropy_bits: float  # of |rank difference| of output neighbours
    histogram: np.ndarray  # HISTOGRAM_BINS^2 counts: input bin x output bin

    @property
    def rank_correlation(self) -> float:
        n = self.rows
        return 0.0 if n < 2 else float(1 - 6 * self.sum_d2 / (n * (n * n - 1.0)))


def in_memory(rank: np.ndarray, neighbours: int) -> OrderStats:
    n = len(rank)
    positions = np.arange(n)
    d = (rank - positions).astype(np.float64)
    steps = np.diff(rank)
    distance = np.abs(steps)
    return OrderStats(
        rows=n,
        sum_d2=float(np.dot(d, d)),
        decile_table=_table(rank, positions, n, 10),
        successions=int(np.count_nonzero(distance == 1)),
        longest=_longest_run(distance == 1, n),
        near=int(np.count_nonzero(distance <= neighbours)),
        entropy_bits=_entropy(*np.unique(distance, return_counts=True)[1:], total=len(distance)),
        histogram=_table(rank, positions, n, HISTOGRAM_BINS),
    )


def _table(rank: np.ndarray, positions: np.ndarray, n: int, bins: int) -> np.ndarray:
    cells = np.minimum(rank * bins // max(n, 1), bins - 1) * bins + np.minimum(positions * bins // max(n, 1), bins - 1)
    return np.bincount(cells, minlength=bins * bins).reshape(bins, bins)


def _longest_run(successions: np.ndarray, rows: int) -> int:
    """Rows in the longest stretch of the output that was a consecutive stretch of the input."""
    if rows < 2:
        return rows
    edges = np.flatnonzero(np.diff(np.concatenate(([0], successions.astype(np.int8), [0]))))
    return int((edges[1::2] - edges[::2]).max(initial=0)) + 1


def _entropy(counts: np.ndarray, total: int) -> float:
    if not total:
        return 0.0
    share = counts / total
    return max(0.0, float(-(share * np.log2(share)).sum()))


@dataclasses.dataclass(frozen=True)
class _FilePart:
    """What one file contributes; its steps include the one from the previous file's last row."""

    rows: int
    sum_d2: float
    decile_table: np.ndarray
    histogram: np.ndarray
    successions: int
    near: int
    steps: int
    head_ones: int  # successions from the start of its steps
    tail_ones: int  # successions at their end
    max_ones: int  # the longest stretch of successions among them


def by_file(read_ranks, files: list, offsets: list[int], lasts: list[int], n: int, neighbours: int) -> OrderStats:
    """``in_memory``'s figures, one Dask task per file (``read_ranks(file)`` gives its ranks) and per range.

    ``lasts`` are each file's last rank (-1 if empty): the step into the next
    file is counted by that file's task.  Raises ValueError if two rows have
    the same rank.
    """
    previous = [-1]
    for last in lasts[:-1]:
        previous.append(last if last >= 0 else previous[-1])  # an empty file passes its predecessor's on
    parts = [
        dask.delayed(_file_part)(read_ranks, f, offset, prev, n, neighbours)
        for f, offset, prev in zip(files, offsets, previous, strict=True)
    ]
    summaries = [dask.delayed(_summary)(p) for p in parts]
    reduced = [dask.delayed(_reduce_range)([dask.delayed(_pick)(p, r) for p in parts]) for r in range(RANGES)]
    summaries, reduced = dask.compute(summaries, reduced)
    return _merge(summaries, reduced, n)


CHUNK_ROWS = 1 << 20  # a file is counted in chunks: its temporaries stay a few tens of MB, whatever its size


def _file_part(read_ranks, file, offset: int, previous: int, n: int, neighbours: int):
    """One file's part: its chunks counted one after the other, then combined as files are."""
    rank = read_ranks(file)
    chunks = []
    for start in range(0, max(len(rank), 1), CHUNK_ROWS):
        piece = rank[start : start + CHUNK_ROWS]
        chunks.append(_chunk_part(piece, offset + start, previous, n, neighbours))
        previous = int(piece[-1]) if len(piece) else previous
    parts = [part for part, _ in chunks]
    by_range = [
        (
            _merge_counts([c[r][0][0] for _, c in chunks], [c[r][0][1] for _, c in chunks]),
            np.sort(np.concatenate([c[r][1] for _, c in chunks])),
        )
        for r in range(RANGES)
    ]
    head, tail, longest = _combined_ones(parts)
    part = _FilePart(
        rows=sum(p.rows for p in parts),
        sum_d2=sum(p.sum_d2 for p in parts),
        decile_table=sum(p.decile_table for p in parts),
        histogram=sum(p.histogram for p in parts),
        successions=sum(p.successions for p in parts),
        near=sum(p.near for p in parts),
        steps=sum(p.steps for p in parts),
        head_ones=head,
        tail_ones=tail,
        max_ones=longest,
    )
    return part, by_range


def _chunk_part(rank: np.ndarray, offset: int, previous: int, n: int, neighbours: int):
    m = len(rank)
    positions = np.arange(offset, offset + m)
    d = (rank - positions).astype(np.float64)
    steps = np.diff(np.concatenate(([previous], rank)) if previous >= 0 else rank)
    distance = np.abs(steps)
    ones = distance == 1  # input neighbours, in either order (a reversed stretch is one too)
    distance_range = np.minimum(distance * RANGES // max(n, 1), RANGES - 1)
    rank_range = np.minimum(rank * RANGES // max(n, 1), RANGES - 1)
    head, tail, longest = _ones(ones)
    part = _FilePart(
        rows=m,
        sum_d2=float(np.dot(d, d)),
        decile_table=_table(rank, positions, n, 10),
        histogram=_table(rank, positions, n, HISTOGRAM_BINS),
        successions=int(np.count_nonzero(ones)),
        near=int(np.count_nonzero(distance <= neighbours)),
        steps=len(steps),
        head_ones=head,
        tail_ones=tail,
        max_ones=longest,
    )
    # Per range, values as uint32 offsets from the range's start (a range spans at most 2^32 values for
    # n < 2^38 rows): what waits for the reductions is 8 bytes a row, spread over the workers.
    by_range = []
    for r in range(RANGES):
        base = r * n // RANGES
        distances, counts = np.unique(distance[distance_range == r] - base, return_counts=True)
        ranks = rank[rank_range == r] - base
        by_range.append(((distances.astype(np.uint32), counts.astype(np.uint32)), ranks.astype(np.uint32)))
    return part, by_range


def _merge_counts(values: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their summed counts, from several (distinct values, counts) pairs."""
    values, counts = np.concatenate(values), np.concatenate(counts).astype(np.int64)
    if not len(values):
        return values, counts.astype(np.uint32)
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    starts = np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))
    return values[starts], np.add.reduceat(counts, starts)


def _combined_ones(parts: list) -> tuple[int, int, int]:
    """(leading, trailing, longest) stretch of successions over consecutive parts' steps."""
    head, all_so_far, best, current = 0, True, 0, 0
    for p in parts:
        if not p.steps:
            continue
        if all_so_far:
            head += p.head_ones
            all_so_far = p.head_ones == p.steps
        if p.head_ones == p.steps:  # every step continues the stretch
            current += p.steps
            continue
        best = max(best, current + p.head_ones, p.max_ones)
        current = p.tail_ones
    return head, current, max(best, current)


def _ones(ones: np.ndarray) -> tuple[int, int, int]:
    """(leading trues, trailing trues, longest stretch of trues)."""
    if not len(ones):
        return 0, 0, 0
    if ones.all():
        return len(ones), len(ones), len(ones)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], ones.astype(np.int8), [0]))))
    return int(np.argmin(ones)), int(np.argmin(ones[::-1])), int((edges[1::2] - edges[::2]).max(initial=0))


def _summary(part_and_ranges) -> _FilePart:
    return part_and_ranges[0]


def _pick(part_and_ranges, r: int):
    return part_and_ranges[1][r]


def _reduce_range(pieces: list) -> tuple[float, int, int]:
    """(sum of c log2 c over the range's distinct distances, the steps in it, ranks repeated in it)."""
    _, counts = _merge_counts([v for (v, _), _ in pieces], [c for (_, c), _ in pieces])
    c = counts.astype(np.float64)
    ranks = np.concatenate([rk for _, rk in pieces])
    return float((c * np.log2(c)).sum()), int(counts.sum()), len(ranks) - len(np.unique(ranks))


def _merge(parts: list[_FilePart], reduced: list, n: int) -> OrderStats:
    repeated = sum(r[2] for r in reduced)
    if repeated:
        raise ValueError(f"the order column has {repeated:,} repeated values: it must identify each row's position")
    best = _combined_ones(parts)[2]
    c_log_c, total = sum(r[0] for r in reduced), sum(r[1] for r in reduced)
    entropy = max(0.0, math.log2(total) - c_log_c / total) if total else 0.0
    return OrderStats(
        rows=n,
        sum_d2=sum(p.sum_d2 for p in parts),
        decile_table=sum((p.decile_table for p in parts), np.zeros((10, 10), dtype=np.int64)),
        successions=sum(p.successions for p in parts),
        longest=n if n < 2 else best + 1,
        near=sum(p.near for p in parts),
        entropy_bits=entropy,
        histogram=sum((p.histogram for p in parts), np.zeros((HISTOGRAM_BINS,) * 2, dtype=np.int64)),
    )
