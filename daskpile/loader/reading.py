"""Loading a group of piles (reading its row ranges, permuting them), ahead of the consumer, in a thread."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from daskpile import _kernels
from daskpile._storage import full_url
from daskpile.loader.plan import Group, Piece, Take, group_permutation, pile_permutation
from daskpile.loader.units import Units, parquet_dataset
from daskpile.sources.parquet import open_parquet, parquet_errors


def piece_order(units: Units, piece: Piece, seed: int, epoch: int) -> np.ndarray | None:
    """Which rows of its unit a piece reads, in order; None for the row range itself.

    A lazy pile is in input order, so a row range of it would be a biased
    part: a piece of one takes a range of the pile's own random order.
    """
    rows = int(units.rows[piece.unit])
    if not units.lazy or piece.rows == rows:
        return None
    return pile_permutation(seed, epoch, piece.unit, rows)[piece.start : piece.stop]


def group_row_ids(units: Units, group: Group, seed: int, epoch: int) -> np.ndarray:
    """The dataset-wide row numbers (units in order, rows in file order) of a group, in its permuted order.

    What ``load_group`` reads, without reading it: for measuring the order.
    """
    offsets = np.concatenate(([0], np.cumsum(units.rows)))
    parts = []
    for piece in group.pieces:
        chosen = piece_order(units, piece, seed, epoch)
        local = np.arange(piece.start, piece.stop) if chosen is None else chosen
        parts.append(offsets[piece.unit] + local)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids[group_permutation(seed, epoch, group)]


def load_group(
    units: Units, group: Group, seed: int, epoch: int, columns: list[str] | None, pool: Executor, threads: int
) -> pa.Table:
    """A group's rows, read and permuted: the table its takes slice.

    Column by column in ``pool``: each column is read (its pieces' row
    groups) and taken in the group's order, in parts, as soon as it is read,
    so reading one column overlaps permuting another, on every core.
    """
    order = pool.submit(group_permutation, seed, epoch, group)
    readers = [_PieceReader(units, piece, piece_order(units, piece, seed, epoch), columns) for piece in group.pieces]
    names = list(columns) if columns is not None else units.schema.names

    def read(name: str) -> pa.ChunkedArray:
        parts = [reader.column(name) for reader in readers]
        return parts[0] if len(parts) == 1 else pa.chunked_array([c for p in parts for c in p.chunks], parts[0].type)

    # Each column taken in as many parts as there are threads: a column far costlier than the others
    # (strings: 12.5 ns a row against 2 for numbers, on A) does not leave the other threads idle.  Only the
    # queued takes hold a column's read, so it is let go as soon as its parts are taken: the load does not
    # hold the group read and taken whole at once (mix 4 on A: the Arrow pool's peak 86 MiB against 109;
    # mix 1: 16 against 26).  Reads are queued first: a take queued before the read of the next column
    # would leave a thread waiting (6-15 % slower, measured alternating in one process).
    reads = [pool.submit(read, name) for name in names]
    parts = np.array_split(order.result(), threads)
    taken = [[pool.submit(_take_read, read, part) for part in parts] for read in reads]
    del reads
    columns_taken = []
    for futures in taken:
        chunks = [chunk for future in futures for chunk in future.result().chunks]
        columns_taken.append(pa.chunked_array(chunks, futures[0].result().type))
    return pa.Table.from_arrays(columns_taken, names=names)


def _take_read(read: Future, indices: np.ndarray) -> pa.ChunkedArray:
    return _take(read.result(), indices)


def _take(values: pa.ChunkedArray, indices: np.ndarray) -> pa.ChunkedArray:
    return _kernels.take(pa.table({"values": values}), indices).column(0)


class _PieceReader:
    """A piece's rows column by column: its file's footer read once, then each column on its own.

    With ``chosen`` (part of a lazy pile), the whole pile is read and those
    rows taken.  With a filter, the filtered rows are read once, whole.  A
    window's pile (several files) is always read whole: its files' columns
    concatenated.
    """

    def __init__(self, units: Units, piece: Piece, chosen: np.ndarray | None, columns: list[str] | None):
        self.units, self.unit, self.chosen = units, piece.unit, chosen
        start, stop = (piece.start, piece.stop) if chosen is None else (0, int(units.rows[piece.unit]))
        self.rows, self.table = stop - start, None
        fs, paths, url, expected = units.fs, units.paths[self.unit], units.url(self.unit), int(units.rows[self.unit])
        if units.filter is not None or len(paths) != 1:
            self.table = _whole_unit(units, self.unit, columns).slice(start, stop - start)
            return
        with open_parquet(fs, paths[0]) as parquet, parquet_errors(url):
            _check_rows(url, parquet.metadata.num_rows, expected, "")
            self.footer = parquet.metadata
        ends = np.cumsum([self.footer.row_group(i).num_rows for i in range(self.footer.num_row_groups)])
        first, last = int(np.searchsorted(ends, start, side="right")), int(np.searchsorted(ends, stop, side="left"))
        self.row_groups = list(range(first, min(last + 1, self.footer.num_row_groups)))
        self.offset = start - (int(ends[first - 1]) if first else 0)

    def column(self, name: str) -> pa.ChunkedArray:
        keys = self.units.keys
        if self.table is not None:
            values = self.table.column(name)
        elif keys is not None and name in keys.schema.names:  # a key=value folder's: the same in every row
            values = pa.chunked_array([pa.repeat(keys.value(self.units.paths[self.unit][0], name), self.rows)])
        else:
            fs, (path,) = self.units.fs, self.units.paths[self.unit]
            with open_parquet(fs, path, self.footer) as parquet, parquet_errors(self.units.url(self.unit)):
                values = parquet.read_row_groups(self.row_groups, columns=[name], use_threads=False).column(0)
            values = values.slice(self.offset, self.rows)
        return values if self.chosen is None else _take(values, self.chosen)


def _whole_unit(units: Units, unit: int, columns: list[str] | None) -> pa.Table:
    """Every row of a unit (its files in order) that passes the filter, in the units' schema."""
    fs, url, expected = units.fs, units.url(unit), int(units.rows[unit])
    names = list(columns) if columns is not None else units.schema.names
    parts = []
    for path in units.paths[unit]:
        with parquet_errors(full_url(fs, path)):
            if units.filter is not None or units.keys is not None:
                dataset = parquet_dataset(fs, path, units.keys, units.schema)
                table = dataset.to_table(columns=names, filter=units.filter)
            else:
                with open_parquet(fs, path) as parquet:
                    table = parquet.read(columns=names, use_threads=False)
        parts.append(table.select(names))
    table = pa.concat_tables(parts, promote_options="permissive") if parts else units.schema.empty_table()
    _check_rows(url, table.num_rows, expected, "pass the filter" if units.filter is not None else "")
    return table


def _check_rows(url: str, found: int, expected: int, what: str) -> None:
    if found != expected:
        raise ValueError(
            f"{url} has {found:,} rows{' that ' + what if what else ''}, the dataset said {expected:,}: "
            "it changed since the loader was made (or its manifest is wrong)"
        )


class Prefetcher:
    """A rank's takes with their groups' tables, the groups loaded in a thread ahead of the consumer.

    At most ``held + ahead`` groups are in memory: the ``held`` the consumer
    is reading (one per stream it interleaves) and ``ahead`` loaded or being
    loaded.  A group is let go when its last rows are taken.  ``waited``
    counts the seconds the consumer waited after its first group arrived.
    """

    def __init__(self, takes: Iterator[Take], load: Callable[[Group], pa.Table], held: int, ahead: int):
        self._permits = threading.Semaphore(held + ahead)
        # Groups load in a pool of their own, so that the next starts as soon as memory allows, not when
        # the last column of the one before is taken (a core would wait at each group's end otherwise)
        self._loads = ThreadPoolExecutor(max(1, ahead), thread_name_prefix="daskpile-group")
        self._events: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(takes, load), daemon=True, name="daskpile-load")
        self.waited = 0.0
        self.first_wait = 0.0
        self.loaded = 0  # groups the consumer received
        self.produced = 0  # groups the thread loaded

    def __iter__(self) -> Iterator[pa.Table]:
        """The rows of each take, in order."""
        self._thread.start()
        tables: dict[int, pa.Table] = {}
        try:
            while True:
                started = time.perf_counter()
                kind, item, payload = self._events.get()
                table = payload.result() if kind == "table" else None  # a group's load: waited for here
                waited = time.perf_counter() - started
                if self.loaded:
                    self.waited += waited
                else:
                    self.first_wait += waited
                if kind == "end":
                    return
                if kind == "error":
                    raise payload
                if kind == "table":
                    if item.stream in tables:
                        self._permits.release()
                    tables[item.stream] = table
                    self.loaded += 1
                    continue
                yield tables[item.group.stream].slice(item.start, item.stop - item.start)
                if item.last:
                    del tables[item.group.stream]
                    self._permits.release()
        finally:
            self._stop.set()
            self._permits.release()  # a producer waiting for room sees the stop
            self._loads.shutdown(wait=False, cancel_futures=True)

    def _produce(self, takes: Iterator[Take], load: Callable[[Group], pa.Table]) -> None:
        current: dict[int, Group] = {}
        try:
            for take in takes:
                if current.get(take.group.stream) is not take.group:
                    if not self._acquire():
                        return
                    self._events.put(("table", take.group, self._loads.submit(load, take.group)))
                    self.produced += 1
                    current[take.group.stream] = take.group
                self._events.put(("take", take, None))
                if take.last:
                    current.pop(take.group.stream, None)
            self._events.put(("end", None, None))
        except BaseException as error:
            self._events.put(("error", None, error))

    def _acquire(self) -> bool:
        while not self._stop.is_set():
            if self._permits.acquire(timeout=0.1):
                return not self._stop.is_set()
        return False
