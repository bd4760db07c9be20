"""Loading a group of piles (reading its row ranges, permuting them), ahead of the consumer, in a thread.

The consumer's thread takes Ctrl-C, so it waits and hands over only through C's ``queue.SimpleQueue``,
never through Python's ``Condition`` (a ``queue.Queue``, a future's ``result()``): a KeyboardInterrupt
landing in one of those can leave its lock held, and a new user's Ctrl-C at random moments hung the process
on it, two runs in three.  An interrupted ``SimpleQueue.get`` holds nothing.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from daskpile import _kernels
from daskpile._storage import FileChangedError, FileVersion, full_url, is_local
from daskpile.loader.plan import Group, Piece, Take, group_permutation, pile_permutation, pile_turn
from daskpile.loader.units import Units, check_rows, parquet_dataset
from daskpile.sources.parquet import open_parquet, parquet_errors
from daskpile.sources.schemas import cast_column, table_without_views, view_free


def piece_order(units: Units, piece: Piece, seed: int, epoch: int) -> np.ndarray | None:
    """Which rows of its lazy unit a piece reads, in order; None for an eager unit (``piece_ranges``).

    A lazy pile is in input order, so a row range of it would be a biased
    part: a piece of one takes a range of the pile's own random order.
    """
    rows = int(units.rows[piece.unit])
    if not units.lazy or piece.rows == rows:
        return None
    return pile_permutation(seed, epoch, piece.unit, rows)[piece.start : piece.stop]


def piece_ranges(units: Units, piece: Piece, seed: int, epoch: int) -> list[tuple[int, int]]:
    """The row ranges of its unit that a piece of an eager unit reads, in order: its rows of the unit turned
    (``pile_turn``), so that which rows of a pile cut between streams go to which changes with the epoch.

    Of a lazy unit, the whole of it (``piece_order`` chooses the rows).
    """
    rows = int(units.rows[piece.unit])
    if piece.rows == rows or units.lazy:
        return [(0, rows)]
    start = (piece.start + pile_turn(seed, epoch, piece.unit, rows)) % rows
    stop = start + piece.rows
    return [(start, stop)] if stop <= rows else [(start, rows), (0, stop - rows)]


def group_row_ids(units: Units, group: Group, seed: int, epoch: int) -> np.ndarray:
    """The dataset-wide row numbers (units in order, rows in file order) of a group, in its permuted order.

    What ``load_group`` reads, without reading it: for measuring the order.
    """
    offsets = np.concatenate(([0], np.cumsum(units.rows)))
    parts = []
    for piece in group.pieces:
        chosen = piece_order(units, piece, seed, epoch)
        if chosen is None:
            chosen = np.concatenate([np.arange(a, b) for a, b in piece_ranges(units, piece, seed, epoch)])
        parts.append(offsets[piece.unit] + chosen)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids[group_permutation(seed, epoch, group)]


# A group is taken in parts of at most this many rows, each a table of its own: the consumer lets each
# part go once it has passed it, so that the next group's files can be read while this one is consumed.
# On B (piles of 1.56 M rows, mix 1), parts of 2**16 rows took the Arrow pool's peak from 164 to 141 MiB
# but the epoch 10-20 % longer: a task, and a hand-over of the GIL, per part and column.  A group has at
# least a part a thread: let go in halves on two, it holds less than whole (A's Arrow peak at mix 4: 75
# against 93 MiB in one part).
PART_ROWS = 1 << 20


class GroupLoad:
    """A group's reads and takes, queued in a pool; ``parts()`` waits for them.

    The parts are the group's rows in its permuted order: consecutive tables
    of equal rows (the last one the rest).  Each take's outcome is handed to
    the consumer in a ``SimpleQueue`` by the thread that finished it, not
    waited for on its future (see the module's docstring).
    """

    def __init__(self, fields, taken: list[list[Future]], stopped: threading.Event, metadata, readers):
        self.fields, self._stopped, self.metadata = fields, stopped, metadata
        # its pieces' readers (weakly) and their lock: a file they hold is let go if the load is stopped
        self._readers = readers
        self._shape = [len(futures) for futures in taken]
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()  # ((column, part), parts, error), as done
        for column, futures in enumerate(taken):
            for k, future in enumerate(futures):
                future.add_done_callback(functools.partial(self._arrive, (column, k)))

    def _arrive(self, where: tuple[int, int], future: Future) -> None:
        # The error as it is, not raised again here: raised in each take's thread, one error shared by the
        # takes after a failed read gained their frames (a missing pile's traceback of hundreds of lines), and
        # a frame of this method in it held the group's parts until a garbage collection
        error = CancelledError() if future.cancelled() else future.exception()
        self._arrived.put((where, None if error is not None else future.result(), error))

    def parts(self) -> list[pa.Table]:
        found, errors = {}, {}  # (taken from the queue: the parts' only owner is then the caller)
        for _ in range(sum(self._shape)):
            where, value, error = self._arrived.get()
            if error is None:
                found[where] = value
            else:
                errors[where] = error
        if errors:
            raise errors[min(errors)]  # (the first column's, whatever finished first)
        columns = [[part for k in range(n) for part in found.pop((column, k))] for column, n in enumerate(self._shape)]
        return [self._table(arrays) for arrays in zip(*columns, strict=True)]

    def _table(self, arrays) -> pa.Table:
        # the files' fields' metadata, which some readers take as part of the type (Polars: an Enum's categories)
        fields = [f.with_type(a.type) for f, a in zip(self.fields, arrays, strict=True)]
        return pa.Table.from_arrays(list(arrays), schema=pa.schema(fields, metadata=self.metadata))

    def cancel(self) -> None:
        """Its tasks not yet started do nothing, and its files are let go."""
        self._stopped.set()
        readers, lock = self._readers
        with lock:
            opened = list(readers)
        for reader in opened:
            reader.close()


class TaskPool:
    """Threads that run the tasks queued to them, those of the earliest load first.

    A load queues a task once its inputs are done (``_after``): in the order
    queued (``ThreadPoolExecutor``), a group's takes would wait behind the
    next group's reads, and the columns read but not yet taken pile up (B,
    mix 1: a peak RSS of 587-622 MiB, against 496 taken in turn).
    """

    def __init__(self, threads: int, name: str):
        # A ThreadPoolExecutor's threads, each job running the first task queued here when it starts:
        # the executor joins its threads at exit, so no thread is inside Arrow when the process ends
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._tasks: queue.PriorityQueue = queue.PriorityQueue()
        self._queued = itertools.count()  # ties in rank run in the order queued
        self._loads = itertools.count()

    def next_rank(self) -> int:
        """The rank of the next load: lower runs first."""
        return next(self._loads)

    def submit(self, rank: int, fn, *args) -> Future:
        future: Future = Future()
        self._tasks.put((rank, next(self._queued), future, fn, args))
        try:
            self._executor.submit(self._run_first)
        except RuntimeError:  # the interpreter is exiting (a loader left mid-epoch): nothing waits for this
            future.cancel()
        return future

    def _run_first(self) -> None:
        _, _, future, fn, args = self._tasks.get_nowait()  # a job per task: never empty
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as error:
                future.set_exception(error)


def load_group(
    units: Units,
    group: Group,
    seed: int,
    epoch: int,
    columns: list[str] | None,
    pool: TaskPool,
    reserve: Callable[[int], None] | None = None,
    threads: int = 1,
    tail: int = 0,
    metadata: dict | None = None,
) -> GroupLoad:
    """Queue the reading and permuting of a group's rows in ``pool``; returns at once.

    Each piece's columns are read, each as a task of its own, once
    ``reserve(rows)`` has returned for it (it may wait for the consumer to let
    rows go).  Then each column is made ready for taking (its pieces
    combined) and taken, part by part in the group's order, at least a part a
    thread.  A task costs tens of microseconds of Python and a hand-over of
    the GIL: a task a part and column made an epoch of A (7 columns, 2
    threads) 8 % longer (0.71-0.75 s against 0.66-0.67), so in a group of
    more than twice as many columns as ``threads`` a column is made ready and
    taken in one task.  With fewer, its parts are spread over tasks, so that a
    column far costlier than the others is taken on every thread: a text and
    a label in one task each made an epoch 10 % longer (0.49 s against 0.43).  A task is queued once its
    inputs are done (``_after``), so the pool's threads never wait for one
    another, and reading one column overlaps taking another.  A column read
    in pieces is let go once they are combined, and that once its parts are
    taken: the load never holds the group read, combined and taken at once.
    The last ``tail`` rows (a batch's) are a part of their own: the rows of a
    batch that a group ends short of are then a view of that part alone, held
    until the next group completes the batch, without a copy.  The parts' schema has ``metadata``.
    """
    stopped = threading.Event()
    rank = pool.next_rank()

    def submit(fn, *args) -> Future:
        return pool.submit(rank, _unless_stopped, stopped, fn, *args)

    def after(inputs: list[Future], fn, *args, handed: bool = False) -> Future:
        return _after(pool, rank, stopped, inputs, fn, *args, handed=handed)

    names = list(columns) if columns is not None else units.schema.names
    order = submit(group_permutation, seed, epoch, group)
    reads: dict[str, list[Future]] = {name: [] for name in names}
    # The pieces' readers, weakly (a reader's future would hold, through its callbacks, the columns read): a
    # stopped load lets their files go
    readers: weakref.WeakSet[_PieceReader] = weakref.WeakSet()
    lock = threading.Lock()  # (a set is not to be changed while ``GroupLoad.cancel`` walks it)

    def read_piece(*args) -> _PieceReader:
        reader = _PieceReader(*args)
        with lock:
            readers.add(reader)
        if stopped.is_set():
            reader.close()
        return reader

    try:
        for piece in group.pieces:
            if reserve is not None:
                reserve(piece.rows)
            chosen, ranges = piece_order(units, piece, seed, epoch), piece_ranges(units, piece, seed, epoch)
            reader = submit(read_piece, units, piece.unit, ranges, chosen, columns)
            for name in names:
                reads[name].append(after([reader], _PieceReader.column, name))
    except BaseException:
        stopped.set()  # the pieces queued already are not wanted either
        raise
    parts = _part_bounds(group.rows, threads, tail)
    if len(names) > 2 * threads:  # (each thread has columns enough to take: a part each would be tasks only)
        taken = [[after([*reads.pop(name), order], _take_column, parts, handed=True)] for name in names]
    else:
        sources = [after(reads.pop(name), _take_source) for name in names]
        taken = [[after([source, order], _take_parts, [part]) for part in parts] for source in sources]
    return GroupLoad([units.schema.field(name) for name in names], taken, stopped, metadata, (readers, lock))


def _part_bounds(rows: int, threads: int, tail: int) -> list[tuple[int, int]]:
    """The parts a group of ``rows`` is taken in: at least one a thread, then its last ``tail`` rows.

    >>> _part_bounds(10, threads=2, tail=3)
    [(0, 4), (4, 7), (7, 10)]
    >>> _part_bounds(2, threads=2, tail=3)
    [(0, 2)]
    """
    body = rows - min(tail, rows)
    size = max(1, min(PART_ROWS, -(-body // threads)))
    bounds = [(start, min(start + size, body)) for start in range(0, body, size)]
    return [*bounds, (body, rows)] if rows > body else bounds


def _unless_stopped(stopped: threading.Event, fn, *args):
    if stopped.is_set():  # the consumer stopped: the load it was for is not wanted
        raise CancelledError
    return fn(*args)


def _after(
    pool: TaskPool, rank: int, stopped: threading.Event, inputs: list[Future], fn, *args, handed: bool = False
) -> Future:
    """``fn(*results of inputs, *args)``, queued in ``pool`` once every input is done (failed: its error).

    A task is queued only when it can run, so no thread of the pool waits
    for another's task (with two threads, one waiting halves the pool).
    ``handed``: ``fn(results, *args)``, the list of results its only
    reference, so that ``fn`` can let each go before it returns.
    """
    result: Future = Future()
    left = [len(inputs)]
    lock = threading.Lock()

    def run() -> None:
        try:
            values = [future.result() for future in inputs]
            inputs.clear()  # the inputs' results (a column read) are let go as soon as this is done with them
            if result.set_running_or_notify_cancel():
                call = (values, *args) if handed else (*values, *args)
                del values
                result.set_result(_unless_stopped(stopped, fn, *call))
        except BaseException as error:
            inputs.clear()
            if not result.done():
                result.set_exception(error)

    def done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        failed = next((future for future in inputs if future.cancelled() or future.exception() is not None), None)
        if failed is None:
            pool.submit(rank, run)
            return
        # An input's error is passed on as it is, here: raised again in each task after it, it gained their
        # frames (a missing pile's one-line message came after 494 lines of traceback)
        inputs.clear()
        if not result.done():
            result.set_exception(CancelledError() if failed.cancelled() else failed.exception())

    for future in list(inputs):
        future.add_done_callback(done)
    return result


def _take_source(*parts: pa.ChunkedArray) -> _kernels.TakeSource:
    chunks = [chunk for part in parts for chunk in part.chunks]
    return _kernels.TakeSource(pa.chunked_array(chunks, parts[0].type))


def _take_column(inputs: list, parts: list[tuple[int, int]]) -> list[pa.Array]:
    """A column's pieces made ready for taking, then taken; ``inputs`` (the pieces' reads, then the order) is
    emptied, its reads' only reference: they are let go once combined (``_after(handed=True)``)."""
    *pieces, order = inputs
    inputs.clear()
    source = _take_source(*pieces)
    del pieces
    return _take_parts(source, order, parts)


def _take_parts(source: _kernels.TakeSource, order: np.ndarray, parts: list[tuple[int, int]]) -> list[pa.Array]:
    return [source.take(_kernels.as_arrow_indices(order[start:stop])) for start, stop in parts]


def _take(values: pa.ChunkedArray, indices: np.ndarray) -> pa.ChunkedArray:
    return _kernels.take(pa.table({"values": values}), indices).column(0)


class _PieceReader:
    """A piece's rows column by column: its file's footer read once, then each column on its own.

    ``ranges`` are the row ranges of the unit it reads, in order; with
    ``chosen`` (part of a lazy pile), the whole pile is read and those rows
    taken.  With a filter, the filtered rows are read once, whole.  A
    window's pile (several files) is always read whole: its files' columns
    concatenated.
    """

    def __init__(self, units: Units, unit: int, ranges: list[tuple[int, int]], chosen: np.ndarray | None, columns):
        self.units, self.unit, self.chosen = units, unit, chosen
        self.rows, self.table = sum(b - a for a, b in ranges), None
        fs, paths, url, expected = units.fs, units.paths[unit], units.url(unit), int(units.rows[unit])
        if units.filter is not None or len(paths) != 1:
            whole = _whole_unit(units, unit, columns)
            self.table = pa.concat_tables([whole.slice(a, b - a) for a, b in ranges])
            return
        keys = units.keys.schema.names if units.keys is not None else []
        names = list(columns) if columns is not None else units.schema.names
        self.files = _OpenFiles(fs, paths[0], units.listed(unit), url, sum(n not in keys for n in names))
        with self.files.one() as parquet:
            check_rows(url, parquet.metadata.num_rows, expected)
            self.footer = parquet.metadata
        if not self.files.left:  # (key=value folders' columns only)
            self.files.close()
        sizes = np.array([self.footer.row_group(i).num_rows for i in range(self.footer.num_row_groups)], np.int64)
        ends = np.cumsum(sizes)
        groups = set()
        for a, b in ranges:
            first, last = int(np.searchsorted(ends, a, side="right")), int(np.searchsorted(ends, b, side="left"))
            groups.update(range(first, min(last + 1, len(sizes))))
        self.row_groups = sorted(groups)
        # where each range starts among the row groups read (in file order, each once)
        read_before = dict(zip(self.row_groups, np.cumsum([0, *sizes[self.row_groups]]).tolist(), strict=False))
        self.slices = []
        for a, b in ranges:
            group = int(np.searchsorted(ends, a, side="right"))
            self.slices.append((read_before[group] + a - int(ends[group] - sizes[group]), b - a))

    def close(self) -> None:
        """Let its file go, though columns are left to read (the load was stopped)."""
        if self.table is None and hasattr(self, "files"):
            self.files.close()

    def column(self, name: str) -> pa.ChunkedArray:
        keys = self.units.keys
        if self.table is not None:
            values = self.table.column(name)
        elif keys is not None and name in keys.schema.names:  # a key=value folder's: the same in every row
            values = pa.chunked_array([pa.repeat(keys.value(self.units.paths[self.unit][0], name), self.rows)])
        else:
            with self.files.one(read=True) as parquet:
                read = parquet.read_row_groups(self.row_groups, columns=[name], use_threads=False).column(0)
            parts = [read.slice(offset, length) for offset, length in self.slices]
            values = parts[0] if len(parts) == 1 else pa.chunked_array([c for p in parts for c in p.chunks], read.type)
            plain = view_free(values.type)
            if not plain.equals(values.type):  # (a view column, read as its large form: see Units)
                values = cast_column(values, plain)
        return values if self.chosen is None else _take(values, self.chosen)


# A local column chunk read a buffer at a time, not whole into memory before its pages are decoded: a pile's
# column was held twice over while read, and a column of embeddings (fixed-size lists, whose levels Arrow
# decodes too) 3.2 times its size (a new user's trial: 211-213 against 150-159 MiB of Arrow's at mix=1, resident
# 489-523 against 409-481 MiB).  1 MiB, not 64 KiB: a pile's column of 1 MiB is read in one call
COLUMN_BUFFER_BYTES = 2**20


class _OpenFiles:
    """A Parquet file opened once for each thread reading its columns at the same time, and kept open until
    ``reads`` columns have been read from it (or it is let go).  A file opened for each column costs its
    schema each time (2.7 ms at 2,001 columns, where reading a column of 6,000 rows takes 0.1 ms): a piece
    read in time that grew as its columns squared.

    Each read is of the version ``listed``, if given: an object store's file is read as it was opened
    (``open_parquet``); a local one is looked at again after each read, as one written again in place would
    give another file's values.
    """

    def __init__(self, fs, path: str, listed: FileVersion | None, url: str, reads: int):
        self.fs, self.path, self.listed, self.url, self.left = fs, path, listed, url, reads
        self.footer = None  # read when the file is first opened; given to each opening after
        self.free: list[tuple[object, contextlib.ExitStack]] = []  # (a ParquetFile not in use, what closes it)
        self.closed = False
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def one(self, read: bool = False):
        """A ParquetFile of the file, for this thread alone while in the block; ``read``: the block reads a column
        (the last of them closes the file)."""
        with self.lock:
            held = self.free.pop() if self.free else None
        if held is None:
            opened = contextlib.ExitStack()
            parquet = open_parquet(self.fs, self.path, self.footer, stream=COLUMN_BUFFER_BYTES, listed=self.listed)
            held = opened.enter_context(parquet), opened
            self.footer = held[0].metadata
        try:
            with parquet_errors(self.url):
                yield held[0]
                if self.listed is not None and is_local(self.fs):
                    self.listed.require(FileVersion.local(self.path), self.url)
        except BaseException:  # the load fails: its file is let go
            _close(held[1])
            self.close()
            raise
        with self.lock:
            self.left -= 1 if read else 0
            kept = not self.closed and not (read and self.left <= 0)
            if kept:
                self.free.append(held)
        if not kept:
            _close(held[1])
            self.close()

    def close(self) -> None:
        """Close the file: now where no thread reads it, else once its read is done."""
        with self.lock:
            self.closed, free, self.free = True, self.free, []
        for _, opened in free:
            _close(opened)


def _close(opened: contextlib.ExitStack) -> None:
    with contextlib.suppress(FileChangedError):  # (looked at after each read already)
        opened.close()


def _whole_unit(units: Units, unit: int, columns: list[str] | None) -> pa.Table:
    """Every row of a unit (its files in order) that passes the filter, in the units' schema."""
    fs, url, expected = units.fs, units.url(unit), int(units.rows[unit])
    names = list(columns) if columns is not None else units.schema.names
    parts = []
    for file, path in enumerate(units.paths[unit]):
        with parquet_errors(full_url(fs, path)):
            if units.filter is not None or units.keys is not None:
                # A dataset opens the file by its name: the version is looked at before and after instead
                _check_version(fs, path, units.listed(unit, file))
                dataset = parquet_dataset(fs, path, units.keys, units.schema)
                table = dataset.to_table(columns=names, filter=units.filter, **_unsliced_batches(units.schema))
                _check_version(fs, path, units.listed(unit, file))
            else:
                with open_parquet(fs, path, listed=units.listed(unit, file)) as parquet:
                    table = parquet.read(columns=names, use_threads=False)
        parts.append(table_without_views(table.select(names)))  # (views, read as their large forms: see Units)
    table = pa.concat_tables(parts, promote_options="permissive") if parts else _kernels.empty_table(units.schema)
    check_rows(url, table.num_rows, expected, "pass the filter" if units.filter is not None else "")
    return table


def _unsliced_batches(schema: pa.Schema) -> dict:
    """A dataset's scan options that filter grids of vectors right: pyarrow (26.0.1) filters a fixed-size list
    of fixed-size lists from the wrong rows where its batch is a slice of a row group (``_kernels.selectable``),
    as a scan's batches of 131,072 rows are.  A row group in a batch of its own is not one."""
    return {"batch_size": 2**31 - 1} if _kernels.selectable_needs_a_look(schema) else {}


def _check_version(fs, path: str, listed: FileVersion | None) -> None:
    """Refuse the file at ``path`` unless it is the version ``listed`` (when known)."""
    if listed is not None:
        fs.invalidate_cache(path)
        listed.require(FileVersion.of(fs.info(path)), full_url(fs, path))


StartLoad = Callable[[Group, Callable[[int], None]], "GroupLoad"]  # (group, reserve) -> its load, queued


class Budget:
    """What a rank's loader may hold, in rows and in files: a piece is read once it fits beside what is not let go.

    Both count: rows bound the memory, files the reading ahead when files
    differ in size (200 files of 20 rows are 200 opens, not a tenth of a
    pile of 40,000 rows).  ``reserve`` waits for room (a piece larger than
    the whole budget waits for an empty one); ``close`` wakes every waiter
    with ``BudgetClosed``.  Only the loading thread reserves, and counts
    what is held; the consumer gives back through a ``SimpleQueue``, never
    taking a lock (see the module's docstring).
    """

    def __init__(self, rows: int, files: int):
        self.rows, self.files = rows, files
        self.held_rows = self.held_files = 0
        self.closed = False
        self._given_back: queue.SimpleQueue = queue.SimpleQueue()  # (rows, files), or None once closed

    def reserve(self, rows: int) -> None:
        """Room for a piece of ``rows`` rows, one file."""
        self._count_given_back(wait=False)
        while not self.closed and self.held_files and not self._fits(rows):
            self._count_given_back(wait=True)
        if self.closed:
            raise BudgetClosed
        self.held_rows += rows
        self.held_files += 1

    def _count_given_back(self, wait: bool) -> None:
        with contextlib.suppress(queue.Empty):
            returned = self._given_back.get(block=wait)
            while True:
                if returned is not None:
                    self.held_rows -= returned[0]
                    self.held_files -= returned[1]
                returned = self._given_back.get_nowait()

    def _fits(self, rows: int) -> bool:
        return self.held_rows + rows <= self.rows and self.held_files < self.files

    def release(self, rows: int, files: int) -> None:
        self._given_back.put((rows, files))

    def close(self) -> None:
        self.closed = True
        self._given_back.put(None)  # (wakes a reserve waiting)


class BudgetClosed(Exception):
    """The consumer stopped: nothing more is to be read."""


# Rows ``[offset, offset + rows)`` of a table: sliced once, where a batch is put together (``_batches``), not
# first as a take's rows and again as a batch's (a slice of a table is 1.5 us, and a rank of 64 streams takes
# from each of them every batch)
Span = tuple[pa.Table, int, int]


class _HeldGroup:
    """A loaded group's parts, let go one by one as the consumer passes them.

    Its files are let go in proportion to its rows: a group of 4 files
    half consumed gives back 2.
    """

    def __init__(self, parts: list[pa.Table], group: Group, budget: Budget):
        self.parts, self.budget = parts, budget
        self.ends = list(itertools.accumulate(part.num_rows for part in parts))  # ints: a take costs microseconds
        self.released = 0  # parts let go, from the first
        self.rows, self.files = group.rows, len(group.pieces)
        self.released_rows = self.released_files = 0

    def spans(self, start: int, stop: int) -> Iterator[Span]:
        """Rows ``[start, stop)`` of the group, as spans of its parts; a part that ends by ``stop`` is let go
        once the consumer asks for what follows it (a take may span a whole group: see ``RoundRobin.segments``)."""
        if self.released and start < self.ends[self.released - 1]:  # the plan reads a group forward (Layout.takes)
            raise RuntimeError(f"rows {start}-{stop} of a group were asked for after rows past them")
        for i in range(self.released, len(self.parts)):
            end = self.ends[i]
            part = self.parts[i]
            begin = end - part.num_rows
            if begin >= stop:
                break
            if start < end:
                low = start if start > begin else begin
                yield part, low - begin, (stop if stop < end else end) - low
            if end <= stop:
                self._let_go(part.num_rows)

    def release_all(self) -> None:
        self.parts[self.released :] = [None] * (len(self.parts) - self.released)
        self.released = len(self.parts)
        self._give_back(self.rows - self.released_rows, self.files - self.released_files)

    def _let_go(self, rows: int) -> None:
        self.parts[self.released] = None
        self.released += 1
        self._give_back(rows, self.files * (self.released_rows + rows) // self.rows - self.released_files)

    def _give_back(self, rows: int, files: int) -> None:
        self.released_rows += rows
        self.released_files += files
        self.budget.release(rows, files)


def _to_the_end(step: Callable[[], None]) -> None:
    """``step()`` run to its end though Ctrl-C lands in it (pressed again as a loop stops), then that
    KeyboardInterrupt raised: cut short, a stop left its load thread waiting for room for ever, its piles held."""
    interrupted = None
    while True:
        try:
            step()
            break
        except KeyboardInterrupt as error:
            interrupted = error
    if interrupted is not None:
        raise interrupted


class LoadsStopped(Exception):
    """The loads a consumer waited for were stopped (``Prefetcher.stop``): its iterator was replaced."""


class Prefetcher:
    """A rank's takes with their groups' rows, each group loaded ahead of the consumer as memory allows.

    A thread queues the loads, in the order of the takes, within ``budget``:
    a piece of a group is read once it fits beside what the consumer has not
    passed yet, and the consumer lets a group go part by part
    (``PART_ROWS``).  ``waited`` counts the seconds the consumer waited after
    its first group arrived.
    """

    def __init__(self, takes: Iterator[Take], load: StartLoad, budget: Budget):
        self._budget = budget
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: set[GroupLoad] = set()  # queued, not yet received: cancelled if the consumer stops
        self._thread = threading.Thread(target=self._produce, args=(takes, load), daemon=True, name="daskpile-load")
        self.waited = 0.0
        self.first_wait = 0.0
        self.loaded = 0  # groups the consumer received
        self.produced = 0  # groups the thread queued
        self._held: dict[int, _HeldGroup] = {}  # by stream: the group the consumer is in
        self._stopped = False

    def stop(self) -> None:
        """Let go of the groups held and being loaded, and load no more: the consumer will not ask again (the
        loader's iterator it fed was replaced, or left with ``break``; it held its piles, and went on loading
        ahead).  A consumer waiting in another thread gets ``LoadsStopped``."""
        self._stopped = True
        self._budget.close()
        for load in list(self._pending):
            load.cancel()
        self._pending.clear()
        for group in self._held.values():
            group.release_all()
        self._held.clear()
        with contextlib.suppress(queue.Empty):
            while True:  # loads queued for the consumer hold their rows
                self._events.get_nowait()
        self._events.put(("stopped", None, None))  # (for a consumer waiting on the queue in another thread)

    def __iter__(self) -> Iterator[Span]:
        """The rows of each take, in order."""
        begun = time.perf_counter()  # (before the thread starts: the first wait includes its first reads)
        groups = self._held
        try:
            # (in the try: a Ctrl-C while it starts left the thread loading for ever, holding its piles)
            self._thread.start()
            while True:
                started = begun if begun is not None else time.perf_counter()
                begun = None
                kind, item, payload = self._events.get()
                if kind == "stopped":
                    raise LoadsStopped
                parts = payload.parts() if kind == "group" else None  # a group's load: waited for here
                waited = time.perf_counter() - started
                if self.loaded:
                    self.waited += waited
                else:
                    self.first_wait += waited
                if kind == "end":
                    return
                if kind == "error":
                    raise payload
                if kind == "group":
                    self._pending.discard(payload)
                    if item.stream in groups:
                        groups.pop(item.stream).release_all()
                    groups[item.stream] = _HeldGroup(parts, item, self._budget)
                    self.loaded += 1
                    continue
                for take in item:
                    yield from groups[take.group.stream].spans(take.start, take.stop)
                    if take.last:
                        groups.pop(take.group.stream).release_all()
        except Exception:
            if self._stopped:  # (in another thread: its loads cancelled, its groups let go under it)
                raise LoadsStopped from None
            raise
        finally:
            # (a loop left early: what it held and loaded ahead is let go now, not when collected)
            _to_the_end(self.stop)

    def _produce(self, takes: Iterator[Take], load: StartLoad) -> None:
        current: dict[int, Group] = {}
        run: list[Take] = []  # takes go to the consumer a run at a time, not one event (and GIL hand-over) a batch
        try:
            for take in takes:
                if current.get(take.group.stream) is not take.group:
                    if run:  # sent before the load, whose reserve may wait for the consumer to pass them
                        self._events.put(("takes", run, None))
                        run = []
                    loading = load(take.group, self._budget.reserve)
                    self._pending.add(loading)
                    if self._budget.closed:  # the consumer stopped while the load was queued
                        loading.cancel()
                        return
                    self._events.put(("group", take.group, loading))
                    self.produced += 1
                    current[take.group.stream] = take.group
                run.append(take)
                if take.last:
                    current.pop(take.group.stream, None)
            if run:
                self._events.put(("takes", run, None))
            self._events.put(("end", None, None))
        except BudgetClosed:
            return
        except BaseException as error:
            self._events.put(("error", None, error))
