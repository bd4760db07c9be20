"""The loader's arithmetic: which rows each rank reads in an epoch, in which order.  No I/O.

An epoch of a pile dataset, for a seed, is built in three steps, each keyed
only by (seed, epoch) and the canonical layout, never by the world size:

1. the piles (any file of the dataset: a *unit*) are put in a random order;
2. the rows of the units, in that order, are cut into ``canonical`` streams
   of equal length (a stream boundary may fall inside a unit: the stream then
   reads a row range of it);
3. each stream's units are taken ``mix`` at a time (a *group*), and a group's
   rows are permuted together when it is loaded.

A rank of a world of ``world_size`` (which divides ``canonical``) owns the
streams ``rank, rank + world_size, ...`` and deals its rows from them in
turn, a row at a time, so that they are consumed evenly; a batch reads its
rows stream by stream.  So with one stream per rank (the default),
a rank reads its own contiguous share of the piles and holds one group at a
time; resizing the world between restarts keeps every stream's rows and
order, and a resumed job starts each stream where it stopped.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from daskpile import _kernels, _random


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of unit ``unit`` (a file of the dataset)."""

    unit: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class Group:
    """The pieces one stream loads and permutes together: group ``index`` of stream ``stream``."""

    stream: int
    index: int
    pieces: tuple[Piece, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)


class Take(NamedTuple):
    """Rows ``[start, stop)`` of a group, in its permuted order; ``last`` when they end the group.

    A tuple: a rank of 64 streams makes one a stream a batch, 600,000 an epoch of 10 M rows, in the thread
    that feeds the consumer (a frozen dataclass took 1.5 us to make).
    """

    group: Group
    start: int
    stop: int
    last: bool


def unit_order(seed: int, epoch: int, units: int) -> np.ndarray:
    """The order of the units in ``epoch``.

    >>> sorted(unit_order(0, 3, 5).tolist())
    [0, 1, 2, 3, 4]
    """
    return _random.keyed(seed, _random.LOAD_ORDER, epoch).permutation(units)


def group_permutation(seed: int, epoch: int, group: Group) -> np.ndarray:
    """The order of a group's rows (its pieces concatenated) in ``epoch``."""
    return _kernels.permutation(_random.keyed(seed, _random.LOAD_GROUP, epoch, group.stream, group.index), group.rows)


def pile_permutation(seed: int, epoch: int, unit: int, rows: int) -> np.ndarray:
    """A lazy unit's order in ``epoch``, before a stream takes a row range of it (so a random part of it)."""
    return _kernels.permutation(_random.keyed(seed, _random.LOAD_PILE, epoch, unit), rows)


def pile_turn(seed: int, epoch: int, unit: int, rows: int) -> int:
    """How far an eager unit's rows are turned in ``epoch`` before streams take row ranges of it.

    Its rows are in a random order already, but one fixed on disk: cut there,
    its first rows would go to the earlier stream every epoch.
    """
    return int(_random.keyed(seed, _random.LOAD_TURN, epoch, unit).integers(rows)) if rows else 0


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Every stream's groups in one epoch.

    >>> plan = EpochPlan.build(np.array([5, 5, 5]), seed=0, epoch=0, canonical=2, mix=1)
    >>> plan.lengths.tolist(), [len(g) for g in plan.groups]
    ([7, 8], [2, 2])
    """

    groups: tuple[tuple[Group, ...], ...]  # per stream, in reading order
    lengths: np.ndarray  # rows per stream
    group_ends: tuple[np.ndarray, ...]  # per stream, the cumulative rows of its groups

    @classmethod
    def build(cls, unit_rows: np.ndarray, *, seed: int, epoch: int, canonical: int, mix: int) -> EpochPlan:
        order = unit_order(seed, epoch, len(unit_rows))
        rows = np.asarray(unit_rows, dtype=np.int64)[order]
        ends = np.cumsum(rows)
        starts = ends - rows
        total = int(ends[-1]) if len(ends) else 0
        bounds = np.arange(canonical + 1, dtype=np.int64) * total // canonical
        streams = []
        for stream in range(canonical):
            low, high = int(bounds[stream]), int(bounds[stream + 1])
            first, stop = np.searchsorted(ends, low, side="right"), np.searchsorted(starts, high, side="left")
            pieces = [
                Piece(int(order[k]), int(max(low, starts[k]) - starts[k]), int(min(high, ends[k]) - starts[k]))
                for k in range(first, stop)
                if min(high, ends[k]) > max(low, starts[k])
            ]
            streams.append(
                tuple(Group(stream, g, tuple(pieces[i : i + mix])) for g, i in enumerate(range(0, len(pieces), mix)))
            )
        return cls(
            tuple(streams),
            np.diff(bounds),
            tuple(np.cumsum([g.rows for g in groups], dtype=np.int64) for groups in streams),
        )

    def takes(self, stream: int, start: int, stop: int) -> Iterator[Take]:
        """Rows ``[start, stop)`` of a stream, as ranges of its groups."""
        starts, ends, groups = self._group_bounds[stream]
        while start < stop:
            g = bisect.bisect_right(ends, start)
            group_start, group_end = starts[g], ends[g]
            end = min(stop, group_end)
            yield Take(groups[g], start - group_start, end - group_start, end == group_end)
            start = end

    @functools.cached_property
    def _group_bounds(self) -> list[tuple[list[int], list[int], tuple[Group, ...]]]:
        """Each stream's groups' first rows, ends, and groups, as Python ints: ``takes`` runs for each stream of
        a rank a batch, where numpy's scalars and searchsorted cost microseconds a call."""
        return [
            ([0, *ends.tolist()][:-1], ends.tolist(), groups)
            for ends, groups in zip(self.group_ends, self.groups, strict=True)
        ]


@dataclasses.dataclass(frozen=True)
class RoundRobin:
    """A rank's rows: its streams' rows ``[first, stop)`` dealt a row at a time, in turn, and read ``item`` at a time.

    Row n of the rank goes to the next stream in turn that has rows left, so
    at every point its streams have given as many rows as each other, to a
    row (until one runs out): a job resized between restarts finds every
    stream where the others are, and no rank has much more left than another.
    Each ``item`` rows (a batch) are read stream by stream.

    >>> rr = RoundRobin(np.array([0, 0]), np.array([5, 3]), item=2)
    >>> list(rr.segments())
    [(0, 0, 1), (1, 0, 1), (0, 1, 2), (1, 1, 2), (0, 2, 3), (1, 2, 3), (0, 3, 5)]
    >>> rr.consumed(5).tolist()
    [3, 2]
    """

    first: np.ndarray
    stop: np.ndarray
    item: int

    @property
    def rows(self) -> int:
        return int((self.stop - self.first).sum())

    @functools.cached_property
    def _levels(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The streams' lengths; sorted, the rows dealt in all once the shortest j have run out, and before."""
        lengths = np.asarray(self.stop - self.first, dtype=np.int64)
        ascending = np.sort(lengths)
        exhausted = np.concatenate([[0], np.cumsum(ascending)])  # rows of the j shortest streams
        # rows dealt when every stream has given ascending[j] rows (or run out before): where stream j runs out
        runs_out = exhausted[:-1] + (len(lengths) - np.arange(len(lengths))) * ascending
        return lengths, exhausted, runs_out

    def consumed(self, rows: int) -> np.ndarray:
        """Rows taken from each stream by the first ``rows`` rows (by arithmetic: a resumed epoch skips most of
        its rows without walking them)."""
        lengths, exhausted, runs_out = self._levels
        rows = min(max(rows, 0), int(exhausted[-1]))
        out = int(np.searchsorted(runs_out, rows, side="right"))  # streams run out by now (the shortest)
        if out == len(lengths):
            return lengths.copy()
        active = len(lengths) - out
        level, extra = divmod(rows - int(exhausted[out]), active)  # whole rounds of the streams left, and a part
        taken = np.minimum(lengths, level)
        taken[np.flatnonzero(lengths > level)[:extra]] += 1  # the part round goes to the streams in order
        return taken

    def segments(self, skip: int = 0) -> Iterator[tuple[int, int, int]]:
        """(stream, start, stop) in reading order, after the first ``skip`` rows; a stream's rows read one after
        the other are one segment (a rank of one stream reads it whole, not an item at a time)."""
        if len(self.first) == 1:  # the dealing below would cut it into items, 13 us each
            start, stop = int(self.first[0]) + max(skip, 0), int(self.stop[0])
            if start < stop:
                yield 0, start, stop
            return
        pending = None
        for i, start, stop in self._dealt(skip):
            if pending is not None and pending[0] == i and pending[2] == start:
                pending = (i, pending[1], stop)
                continue
            if pending is not None:
                yield pending
            pending = (i, start, stop)
        if pending is not None:
            yield pending

    def _dealt(self, skip: int) -> Iterator[tuple[int, int, int]]:
        """``segments`` an item at a time."""
        total = self.rows
        first = self.first.tolist()  # (Python ints: a few per stream an item)
        position = skip - skip % self.item  # the start of the item that row ``skip`` is in
        before, inside = self.consumed(position).tolist(), skip - position
        while position < total:
            end = min(position + self.item, total)
            after = self.consumed(end).tolist()
            for i, (was, now) in enumerate(zip(before, after, strict=True)):
                if now == was:
                    continue
                if inside >= now - was:
                    inside -= now - was
                    continue
                yield i, first[i] + was + inside, first[i] + now
                inside = 0
            before, position = after, end


@dataclasses.dataclass(frozen=True)
class Layout:
    """How ranks share an epoch's streams: the world, the batch size, and where each stream starts.

    ``starts`` are the rows of each stream consumed before this layout began
    (zeros at the start of an epoch; a job resumed with another world size
    starts where the old one stopped).
    """

    canonical: int
    world_size: int
    batch_size: int
    drop_last: bool
    starts: tuple[int, ...]

    def __post_init__(self):
        if self.canonical % self.world_size:
            raise ValueError(
                f"world_size {self.world_size} does not divide canonical_ranks {self.canonical}: "
                "the streams cannot be shared equally"
            )

    def round_robin(self, plan: EpochPlan, rank: int) -> RoundRobin:
        streams = np.arange(rank, self.canonical, self.world_size)
        return RoundRobin(np.asarray(self.starts, dtype=np.int64)[streams], plan.lengths[streams], self.batch_size)

    def rank_rows(self, plan: EpochPlan) -> list[int]:
        return [self.round_robin(plan, r).rows for r in range(self.world_size)]

    def rows_per_rank(self, plan: EpochPlan) -> int:
        """The rows every rank yields: all of the longest rank's, or whole batches of the shortest's."""
        rows = self.rank_rows(plan)
        if self.drop_last:
            return min(rows) // self.batch_size * self.batch_size
        return max(rows)

    def batches(self, plan: EpochPlan) -> int:
        return -(-self.rows_per_rank(plan) // self.batch_size)

    def takes(self, plan: EpochPlan, rank: int, skip_batches: int = 0) -> Iterator[Take]:
        """The group ranges ``rank`` reads, in order, after its first ``skip_batches`` batches.

        A rank shorter than the longest (without ``drop_last``) then wraps
        around to rows of its streams from this epoch (its own since this
        layout began, or when it has none left, after a resize, its streams'
        from their start), so that every rank yields the same number of
        batches of the same sizes.
        """
        streams = range(rank, self.canonical, self.world_size)
        robin = self.round_robin(plan, rank)
        again = (
            robin
            if robin.rows
            else RoundRobin(
                np.zeros(len(streams), np.int64), plan.lengths[streams.start :: self.world_size], self.batch_size
            )
        )
        skip = min(skip_batches * self.batch_size, self.rows_per_rank(plan))
        wanted = self.rows_per_rank(plan) - skip

        def segments():
            if skip < robin.rows:
                yield from robin.segments(skip)
                rest = 0
            else:
                rest = skip - robin.rows
            while again.rows:
                yield from again.segments(rest % again.rows)
                rest = 0

        for i, start, stop in segments():
            stop = min(stop, start + wanted)
            yield from plan.takes(streams[i], start, stop)
            wanted -= stop - start
            if wanted == 0:
                return
        if wanted:
            raise ValueError(f"rank {rank} has no rows in this epoch while others do")

    def consumed(self, plan: EpochPlan, batches: int) -> np.ndarray:
        """Rows of each stream read once every rank has yielded ``batches`` batches (all ranks in step)."""
        read = np.zeros(self.canonical, dtype=np.int64)
        rows = min(batches * self.batch_size, self.rows_per_rank(plan))
        for rank in range(self.world_size):
            robin = self.round_robin(plan, rank)
            read[rank :: self.world_size] = robin.consumed(min(rows, robin.rows))
        return np.asarray(self.starts, dtype=np.int64) + read


def worker_share(rank: int, world_size: int, worker: int, workers: int) -> tuple[int, int]:
    """The (rank, world size) of DataLoader worker ``worker`` of ``workers`` on ``rank``: ranks times workers.

    >>> [worker_share(1, 2, w, 3) for w in range(3)]
    [(3, 6), (4, 6), (5, 6)]
    """
    return rank * workers + worker, world_size * workers
