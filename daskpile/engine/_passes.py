"""The two passes as functions that run inside Dask tasks.

Pass 1 (scatter), one task per input partition ``k``: draw a pile for every row
from the generator keyed (seed, SCATTER, k), group the rows by pile and write
them to scratch (a file per band of piles, see ``_scratch``).  Pass 2 (gather),
one task per pile ``j``: read slice ``j`` of every scratch file, permute the
rows with the generator keyed (seed, GATHER, j), and hand the pile on (as a
Parquet file or a pandas frame).

The functions here are what the graphs in ``engine._pipeline`` and ``dataframe._expr`` call;
they take everything they need as arguments so a task is a pure function of its
inputs and can be run twice, anywhere, with the same result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import posixpath
from collections.abc import Callable

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from daskpile import _kernels, _random
from daskpile._compute import stop_after_ctrl_c
from daskpile._storage import atomic_sink, exists
from daskpile._words import count, human_size
from daskpile.checks import _fingerprint
from daskpile.checks._fingerprint import Fingerprint
from daskpile.engine import _manifest, _outputs, _scratch, _sizing
from daskpile.engine._outputs import Output
from daskpile.engine._scratch import PileReader, Scratch
from daskpile.sources.parquet import read_parquet
from daskpile.sources.read import Reading, SourceFile, read_pieces
from daskpile.sources.schemas import GEO


@dataclasses.dataclass(frozen=True)
class ScatterResult:
    partition: int
    rows: int
    scratch_bytes: int
    counts: np.ndarray | None  # the rows sent to each pile; None once summed apart (``PileTotals``), as below
    fingerprint: Fingerprint | None
    reused: bool = False
    pieces: int = 1
    nulls: frozenset[str] | None = frozenset()  # the columns holding a null; None: not recorded (reused)
    pile_bytes: np.ndarray | None = None  # the Arrow bytes sent to each pile; None: not recorded (reused)
    largest_rows: np.ndarray | None = None  # the bytes of each pile's largest row (as pile_bytes)

    def without_pile_counts(self) -> ScatterResult:
        """This result as the command keeps it: without its arrays of one number a pile, which are summed on the
        workers (``pile_totals``)."""
        return dataclasses.replace(self, counts=None, pile_bytes=None, largest_rows=None)


@dataclasses.dataclass(frozen=True)
class PileTotals:
    """What pass 1 sent to each pile, over all its tasks: rows, Arrow bytes, the largest row's bytes.

    Summed on the workers, a few tasks at a time, so that the command holds
    one array of each, not every task's (a task's are 24 bytes a pile: piles
    of 32 MiB over 1 TiB of files of 16 MiB, 32,768 piles over 65,536 tasks,
    would have been 48 GiB).
    """

    counts: np.ndarray
    pile_bytes: np.ndarray | None  # None: some piece is scratch of a daskpile that did not record them
    largest_rows: np.ndarray | None


# Pass 1's per-pile counts are summed this many tasks' results at a time: the most a summing task holds.
SUM_FAN_IN = 16


# What a pass-1 task's result holds for each pile (its rows, Arrow bytes and largest row), and the share of the
# machine's memory that the results a summing task holds may take
PILE_COUNT_BYTES = 24
PILE_COUNTS_FRACTION = 1 / 4


def refuse_piles_beyond_their_counts(piles: int, tasks: int, rows: str) -> None:
    """Refuse more piles than this machine holds the counts of: pass 1's per-pile counts are summed
    ``SUM_FAN_IN`` tasks' at a time (100,000,000 piles over 13 tasks, each held, took 22 GB, and 32 s, before a
    row was written; ``shuffle(ddf, piles=10**9)`` was killed for its memory).  ``rows``: what the input holds,
    for the message."""
    import psutil

    summed_at_once = min(max(tasks, 1), SUM_FAN_IN)
    held = summed_at_once + 1  # (and their sum)
    needed, machine = PILE_COUNT_BYTES * piles * held, psutil.virtual_memory().total
    if needed > machine * PILE_COUNTS_FRACTION:
        most = max(1, int(machine * PILE_COUNTS_FRACTION) // (PILE_COUNT_BYTES * held))
        raise ValueError(
            f"{piles:,} piles would take {human_size(needed)} of pile counts to sum pass 1's "
            f"({summed_at_once} tasks' at a time), more than a quarter of this machine's {human_size(machine)}: "
            f"give at most {most:,} piles (for {rows})"
        )


def summed_to_a_few(leaves: list, make_sum: Callable) -> list:
    """Sums of ``leaves``, ``SUM_FAN_IN`` children a node, level after level, until at most ``SUM_FAN_IN``
    remain: those (the leaves themselves where they are that few), for one last sum of the caller's.
    ``make_sum(depth, index, children)`` makes each node, a task of the caller's kind.

    >>> summed_to_a_few(list(range(40)), lambda depth, index, children: sum(children))
    [120, 376, 284]
    """
    level, depth = list(leaves), 0
    while len(level) > SUM_FAN_IN:
        level = [make_sum(depth, i // SUM_FAN_IN, level[i : i + SUM_FAN_IN]) for i in range(0, len(level), SUM_FAN_IN)]
        depth += 1
    return level


def pile_totals(*results: ScatterResult | PileTotals) -> PileTotals:
    """The ``PileTotals`` of pass-1 results, or of totals of some of them.

    >>> one = ScatterResult(0, 3, 0, np.array([1, 2]), None, pile_bytes=np.array([8, 16]))
    >>> one = dataclasses.replace(one, largest_rows=np.array([8, 4]))
    >>> totals = pile_totals(one, pile_totals(one, one))
    >>> totals.counts.tolist(), totals.pile_bytes.tolist(), totals.largest_rows.tolist()
    ([3, 6], [24, 48], [8, 4])
    """
    pile_bytes = [r.pile_bytes for r in results]
    largest = [r.largest_rows for r in results]
    return PileTotals(
        np.sum([r.counts for r in results], axis=0),
        None if any(b is None for b in pile_bytes) else np.sum(pile_bytes, axis=0),
        None if any(b is None for b in largest) else np.max(largest, axis=0),
    )


@dataclasses.dataclass(frozen=True)
class GatherResult:
    pile: int
    rows: int
    path: str
    bytes: int
    fingerprint: Fingerprint | None
    reused: bool = False
    sub: int | None = None  # the sub-pile, for a pile split because it was over its memory budget


@dataclasses.dataclass(frozen=True)
class SplitResult:
    """An oversized pile sent to sub-piles: their scratch files (one batch per sub-pile) and row counts."""

    pile: int
    scratch: Scratch
    counts: np.ndarray


PARQUET = Output()

FINGERPRINT_KEY = "daskpile.fingerprint"  # in a scratch file's footer, beside _scratch's pile index
NULLS_KEY = "daskpile.nulls"  # the columns of the rows scattered that hold a null, for the manifest
PILE_BYTES_KEY = "daskpile.pile_bytes"  # the Arrow bytes of each pile's rows: a few large rows make a pile large
LARGEST_ROWS_KEY = "daskpile.largest_rows"  # the bytes of each pile's largest row: what no split can cut


def scatter_table(
    table: pa.Table, partition: int, piles: int, seed: int, scratch: Scratch, fingerprint: bool = False, piece: int = 0
) -> ScatterResult:
    """Pass 1 for one partition (or one piece of it) already in Arrow form."""
    rng = _random.generator(seed, _random.SCATTER, partition, piece)
    grouped, counts = _kernels.scatter(table, piles, rng)
    input_fingerprint = _fingerprint.of(table) if fingerprint else None
    nulls = frozenset(name for name, column in zip(table.column_names, table.columns, strict=True) if column.null_count)
    pile_bytes = _kernels.group_nbytes(grouped, counts)
    largest = _kernels.group_largest_row(grouped, counts)
    footer = {FINGERPRINT_KEY: json.dumps(input_fingerprint.to_json())} if input_fingerprint is not None else {}
    footer[NULLS_KEY] = json.dumps(sorted(nulls))
    footer[PILE_BYTES_KEY] = _scratch.encode_integers(pile_bytes)
    footer[LARGEST_ROWS_KEY] = _scratch.encode_integers(largest)
    nbytes = scratch.write(partition, piece, grouped, counts, footer)
    return ScatterResult(
        partition, table.num_rows, nbytes, counts, input_fingerprint, nulls=nulls, pile_bytes=pile_bytes,
        largest_rows=largest,
    )  # fmt: skip


# Like dask.dataframe.read_parquet's blocksize: a file larger than this in
# memory (the row groups' uncompressed size) is read in pieces of whole row
# groups or of one's rows, so a task never holds a multi-GB file.  It decides the pieces, and so
# the output for a seed: it is part of a run's identity, not a tuning knob.
BLOCKSIZE = 256 * 2**20


def scatter_partition(
    fs: fsspec.AbstractFileSystem,
    files: list[SourceFile],
    partition: int,
    piles: int,
    seed: int,
    scratch: Scratch,
    reading: Reading,
    fingerprint: bool = False,
    blocksize: int = BLOCKSIZE,
    task_memory: int | None = None,
    kept: dict[str, int] | None = None,
    output: Output | None = None,
) -> ScatterResult:
    """Pass 1 for one partition of a source plan (consecutive files): read and scatter it piece by piece.

    A scratch file left by an interrupted run of the same spec is reused as
    is, and its piece not even read.  With ``task_memory`` (a worker's memory
    limit over its threads), a row group whose rows the task cannot hold is
    refused before it is read, rather than killing the worker.  ``kept``: the
    partition's scratch files there when the run began (name: bytes, from
    ``Scratch.kept``), so that a file not there is not looked for; None: each
    is looked for.  ``output``: the result's format, whose values it cannot
    hold are refused as they are read (``Output.refuse_values``).
    """
    files_key = _files_key(files)
    reused = _finished_partition(scratch, partition, files_key, piles, fingerprint, kept)
    if reused is not None:
        pieces, footer_rows = reused
        _check_rows_scattered(files, reading, footer_rows, sum(r.rows for r in pieces))
        return _partition_result(partition, pieces, fingerprint)
    results = []
    finished: dict[int, ScatterResult | None] = {}

    def done(piece: int) -> bool:
        finished[piece] = _finished_scatter(scratch, partition, piece, piles, fingerprint, kept)
        return finished[piece] is not None

    footer_rows: list[int] = []

    def check_rows(row_group: str, rows: int, row_bytes: float) -> None:
        where = f"{row_group} holds {count(rows, 'row')} of"
        _sizing.refuse_rows_a_task_cannot_hold(where, row_bytes, task_memory, each=rows > 1)

    pieces = read_pieces(fs, files, reading, blocksize, skip=done, footer_rows=footer_rows, check_rows=check_rows)
    for piece, table in pieces:
        stop_after_ctrl_c()
        if table is not None and output is not None:
            _refuse_values(output, table, fs, files, reading, blocksize)
        results.append(
            finished[piece]
            if table is None
            else scatter_table(table, partition, piles, seed, scratch, fingerprint, piece)
        )
    _check_rows_scattered(files, reading, sum(footer_rows), sum(r.rows for r in results))
    scratch.write_done(partition, files_key, len(results), sum(footer_rows))
    return _partition_result(partition, results, fingerprint)


def _partition_result(partition: int, pieces: list[ScatterResult], fingerprint: bool) -> ScatterResult:
    """The result of a partition's task, from its pieces'."""
    totals = pile_totals(*pieces)
    return ScatterResult(
        partition,
        sum(r.rows for r in pieces),
        sum(r.scratch_bytes for r in pieces),
        totals.counts,
        _fingerprint.total(r.fingerprint for r in pieces) if fingerprint else None,
        reused=all(r.reused for r in pieces),
        pieces=len(pieces),
        nulls=_manifest.union_of_nulls(r.nulls for r in pieces),
        pile_bytes=totals.pile_bytes,
        largest_rows=totals.largest_rows,
    )


def _files_key(files: list[SourceFile]) -> str:
    """What a partition reads, as its done record names it: its files (byte ranges, versions) in order."""
    described = [(f.path, f.byte_range, f.stamp) for f in files]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def _finished_partition(
    scratch: Scratch, partition: int, files: str, piles: int, fingerprint: bool, kept: dict[str, int] | None
) -> tuple[list[ScatterResult], int] | None:
    """(the results of every piece, its files' footer rows) of a partition of ``files`` (``_files_key``) an
    interrupted run of the same spec finished (``Scratch.write_done``), its source not read again; None where any
    piece is not there whole."""
    record = scratch.read_done(partition, files, kept)
    if record is None or record["pieces"] < 1:
        return None
    pieces = [_finished_scatter(scratch, partition, p, piles, fingerprint, kept) for p in range(record["pieces"])]
    return None if any(p is None for p in pieces) else (pieces, record["footer_rows"])


def _check_rows_scattered(files: list[SourceFile], reading: Reading, footers: int, scattered: int) -> None:
    """The rows a partition's pieces hold, read now or reused from an interrupted run's scratch, against its
    Parquet footers.  A reused piece's fingerprint is its scratch's: a piece numbered otherwise than when it
    was written would hold other rows, and the fingerprints of both passes would agree on them."""
    if reading.text is None and scattered != footers:
        raise ValueError(  # (which removes scratch)
            f"pass 1 scattered {scattered:,} rows of {_files_said(files)}, whose footers say {footers:,}: the "
            "scratch of the interrupted run this call resumed does not hold the pieces it reads now, and is "
            "removed; run the call again"
        )


def _refuse_values(output: Output, table: pa.Table, fs, files: list[SourceFile], reading: Reading, blocksize: int):
    """``Output.refuse_values`` of a piece, naming the file that holds the value refused: a piece may span
    files, which are then read again, one at a time, to find it (bad input only)."""
    cut_at_newlines = reading.text is not None and reading.text.format == "lines"  # (no value holds one)
    try:
        output.refuse_values(table, _files_said(files), cut_at_newlines=cut_at_newlines)
    except ValueError:
        if len(files) > 1:
            for f in files:
                for _, alone in read_pieces(fs, [f], reading, blocksize):
                    output.refuse_values(alone, repr(f.path), cut_at_newlines=cut_at_newlines)
        raise


def _files_said(files: list[SourceFile]) -> str:
    return repr(files[0].path) + (f" and {len(files) - 1:,} more files" if len(files) > 1 else "")


def _finished_scatter(
    scratch: Scratch, partition: int, piece: int, piles: int, fingerprint: bool, kept: dict[str, int] | None = None
) -> ScatterResult | None:
    path = scratch.last_path(partition, piece)
    if kept is not None and posixpath.basename(path) not in kept:
        return None  # (on an object store, a request saved a piece: 1,569 of them took as long as pass 1)
    footer = _scratch.read_footer(scratch.fs, path)
    bands = list(scratch.bands or (0, piles))
    if not footer or _scratch.BATCH_ROWS_KEY not in footer or _bands_in(footer) != bands:
        return None  # none, or written by a version of daskpile with another scratch layout
    found = footer.get(FINGERPRINT_KEY)
    input_fingerprint = Fingerprint.from_json(json.loads(found)) if found else None
    if fingerprint and input_fingerprint is None:  # none, or of another hash version
        return None
    counts = _scratch.decode_integers(footer[_scratch.COUNTS_KEY])
    if len(counts) != piles:
        return None
    size = scratch.size(partition, piece, kept)
    nulls = frozenset(json.loads(footer[NULLS_KEY])) if NULLS_KEY in footer else None
    pile_bytes = _scratch.decode_integers(footer[PILE_BYTES_KEY]) if PILE_BYTES_KEY in footer else None
    largest = _scratch.decode_integers(footer[LARGEST_ROWS_KEY]) if LARGEST_ROWS_KEY in footer else None
    return ScatterResult(
        partition, int(counts.sum()), size, counts, input_fingerprint, reused=True, nulls=nulls,
        pile_bytes=pile_bytes, largest_rows=largest,
    )  # fmt: skip


def _bands_in(footer: dict[str, str]) -> list[int] | None:
    return _scratch.decode_integers(footer[_scratch.BANDS_KEY]).tolist() if _scratch.BANDS_KEY in footer else None


def gather_table(
    batches: list[pa.RecordBatch], pile: int, seed: int, sub: int | None = None, permute: bool = True
) -> pa.Table:
    """Pass 2 for one pile (or sub-pile): its slices from every scratch file, concatenated and permuted.

    With ``permute=False`` (the lazy second pass) the rows stay in scatter
    order, for ``PileLoader`` to permute when it loads the pile.
    """
    try:  # (not a set of schemas: hashing one costs more than comparing, 0.6 ms a pile for 40 slices)
        table = pa.Table.from_batches(batches)
    except pa.ArrowInvalid:  # partitions of a Dask DataFrame may disagree (e.g. an all-null partition)
        table = _promoted(batches)
    if not permute:
        return table
    piece = 0 if sub is None else sub + 1
    return _kernels.permute(table, _random.generator(seed, _random.GATHER, pile, piece))


class TypesDisagree(TypeError):
    """Partitions holding a column as types no one type holds: ``said(name)`` says so of the column ``name``."""

    def __init__(self, column: str, kinds: list[str], cause: Exception):
        self.column, self.kinds, self.cause = column, kinds, cause
        super().__init__(self.said(repr(column)))

    def said(self, name: str) -> str:
        return (
            f"the partitions hold {name} as {self.kinds[0]} and as {self.kinds[1]}, which no one type holds "
            f"({self.cause}): give it one dtype in every partition (ddf.astype) before the shuffle"
        )


def _promoted(batches: list[pa.RecordBatch]) -> pa.Table:
    """The batches as one table, their types promoted; where none holds them all, ``TypesDisagree`` naming the
    column (Arrow's error names its position: "Field 2 has incompatible types", a trial's categoricals of ints in
    some partitions and of strings in others)."""
    try:
        return pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid) as e:
        for name in batches[0].schema.names:  # the first column whose types promote to none (not merely differ)
            fields = {str(b.schema.field(name).type): b.schema.field(name) for b in batches if name in b.schema.names}
            try:
                pa.unify_schemas([pa.schema([f]) for f in fields.values()], promote_options="permissive")
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                raise TypesDisagree(name, sorted(fields), e) from None
        raise


PILE_METADATA_KEY = _manifest.PILE_METADATA_KEY


def gather_to_parquet(
    scratch: Scratch,
    total_piles: int,
    piles: list[int],
    expected_rows: list[int],
    seed: int,
    fs: fsspec.AbstractFileSystem,
    paths: list[str],
    schema: pa.Schema,
    fingerprint: bool = False,
    parent: int | None = None,
    as_arrow: bool = False,
    permute: bool = True,
    output: Output = PARQUET,
    on_pile=None,
) -> list[GatherResult]:
    """Pass 2 for a few piles, each written as one file of ``output``'s format (atomically); ``on_pile(n)``
    after each, ``n`` the piles done (``_compute.Units``).

    The piles are handled one after the other, so memory holds one pile; a
    task takes several so that each scratch file is opened once per task
    rather than once per pile.  An output file left by an interrupted run of
    the same spec is reused: its footer says which pile it holds, its rows and
    fingerprint.  With ``parent``, ``piles`` are sub-piles of that pile and
    ``scratch`` its split files.  With ``as_arrow``, each permuted pile goes
    to an uncompressed Arrow IPC file at its path instead, for
    ``rechunk_to_parquet`` to cut into files of equal length (not
    fingerprinted: that is done on what is finally written).  With
    ``permute=False`` the piles are written unpermuted (the lazy second pass).
    """
    results = []
    existing_paths = set() if as_arrow else existing(fs, paths)
    with PileReader(scratch) as reader:
        for index, rows, path in zip(piles, expected_rows, paths, strict=True):
            stop_after_ctrl_c()
            pile, sub = (index, None) if parent is None else (parent, index)
            stamp = {"pile": int(pile), "piles": int(total_piles), "seed": int(seed), "rows": int(rows)}
            if sub is not None:
                stamp["sub"] = int(sub)
            if not permute:
                stamp["lazy"] = True
            finished = _finished_pile(fs, path, stamp, fingerprint) if path in existing_paths else None
            if finished is not None:
                results.append(finished)
                _said(on_pile, len(results))
                continue
            table = gather_table(reader.pile(index), pile, seed, sub, permute)
            if table.num_rows != rows:
                raise RuntimeError(f"pile {pile} has {table.num_rows} rows, pass 1 sent it {rows}")
            if as_arrow:
                size, output_fingerprint = _scratch.write_table(fs, path, table, RECHUNK_BATCH_ROWS), None
            else:
                size, output_fingerprint = _write_stamped(table, fs, path, schema, stamp, fingerprint, output)
            results.append(GatherResult(pile, rows, path, size, output_fingerprint, sub=sub))
            del table  # before the next pile is read, so that memory holds one pile
            _said(on_pile, len(results))
    return results


def _said(on_pile, done: int) -> None:
    if on_pile is not None:
        on_pile(done)


RECHUNK_BATCH_ROWS = 65_536  # permuted piles are stored in batches this long, so a range reads little more


def rechunk_to_parquet(
    ranges: list[tuple[str, int, int]],
    fs_scratch: fsspec.AbstractFileSystem,
    fs: fsspec.AbstractFileSystem,
    path: str,
    file_index: int,
    seed: int,
    schema: pa.Schema,
    fingerprint: bool = False,
    output: Output = PARQUET,
) -> GatherResult:
    """Pass 3 of ``rows_per_file``: one output file from row ranges ``(permuted pile file, start, stop)``.

    The ranges are consecutive stretches of the permuted sequence, so the
    output files are that sequence cut into equal lengths.
    """
    rows = sum(stop - start for _, start, stop in ranges)
    stamp = {"file": int(file_index), "seed": int(seed), "rows": int(rows), "ranges": len(ranges)}
    finished = _finished_pile(fs, path, stamp, fingerprint)
    if finished is not None:
        return finished
    parts = [_scratch.read_rows(fs_scratch, scratch_path, start, stop) for scratch_path, start, stop in ranges]
    table = pa.concat_tables(parts) if parts else _kernels.empty_table(schema)
    size, output_fingerprint = _write_stamped(table, fs, path, schema, stamp, fingerprint, output)
    return GatherResult(file_index, rows, path, size, output_fingerprint)


def split_pile(
    scratch: Scratch, pile: int, sub_piles: int, seed: int, flush_bytes: int, budget: int | None = None
) -> SplitResult:
    """Send each row of an oversized pile to one of ``sub_piles`` uniformly random sub-piles.

    The pile is streamed a scratch file at a time (what one input piece sent
    it) and written in flushes of about ``flush_bytes``, one scratch file per
    flush with one batch per sub-pile, so memory holds a flush, never the
    pile.  Sub-piles are drawn a scratch file at a time from the generator
    keyed (seed, SPLIT, pile), whatever batches the file holds its rows in
    (local scratch cuts long piles, a store's does not), and each sub-pile
    keeps its rows' order, so the flush size changes neither the sub-piles
    nor their order.  A sub-pile still over ``budget`` (a few rows of many MB
    each) is refused, naming the pile, before any is loaded whole.
    """
    directory = posixpath.join(scratch.directory, f"split-{pile:06d}")
    scratch.fs.makedirs(directory, exist_ok=True)
    rng = _random.generator(seed, _random.SPLIT, pile)
    counts = np.zeros(sub_piles, dtype=np.int64)
    sub_bytes = np.zeros(sub_piles, dtype=np.int64)
    files = 0
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    assignments: list[np.ndarray] = []

    def flush():
        nonlocal files, pending_bytes
        table = pa.Table.from_batches(pending, schema=pending[0].schema)
        grouped, flush_counts = _kernels.group_by_pile(table, np.concatenate(assignments), sub_piles)
        _scratch.write_piles(scratch.fs, _scratch.scratch_path(directory, files), grouped, flush_counts)
        counts[:] += flush_counts
        sub_bytes[:] += _kernels.group_nbytes(grouped, flush_counts)
        files += 1
        pending.clear()
        assignments.clear()
        pending_bytes = 0

    with PileReader(scratch) as reader:
        for slices in reader.pile_slices(pile):
            pending.extend(slices)
            pending_bytes += sum(batch.get_total_buffer_size() for batch in slices)
            assignments.append(_kernels.random_piles(rng, sum(batch.num_rows for batch in slices), sub_piles))
            if pending_bytes >= flush_bytes:
                flush()
        if pending:
            flush()
    if budget is not None and sub_bytes.max(initial=0) > budget:
        s = int(sub_bytes.argmax())
        raise ValueError(
            f"pile {pile} is over memory_per_pile={budget:,} bytes even split in {sub_piles}: a part of it holds "
            f"{int(counts[s]):,} rows of {int(sub_bytes[s]):,} bytes, a few large rows holding most of them. Give "
            "a larger memory_per_pile (--memory-per-pile) and the workers the memory for it"
        )
    return SplitResult(pile, Scratch(scratch.fs, directory, files), counts)


def gather_split_to_parquet(
    split: SplitResult,
    total_piles: int,
    subs: list[int],
    seed: int,
    fs: fsspec.AbstractFileSystem,
    paths: list[str],
    schema: pa.Schema,
    fingerprint: bool = False,
    as_arrow: bool = False,
    permute: bool = True,
    output: Output = PARQUET,
) -> list[GatherResult]:
    """Pass 2 for some sub-piles of a split pile: like ``gather_to_parquet``, one file each."""
    expected = [int(split.counts[s]) for s in subs]
    return gather_to_parquet(
        split.scratch, total_piles, subs, expected, seed, fs, paths, schema, fingerprint, split.pile, as_arrow,
        permute, output,
    )  # fmt: skip


def _write_stamped(
    table, fs, path: str, schema: pa.Schema, stamp: dict, fingerprint: bool, output: Output = PARQUET
) -> tuple[int, Fingerprint | None]:
    """Write an output file stamped with what it holds (``stamp`` and fingerprint), for a rerun to reuse:
    in its footer, or for text beside it (``_outputs.write_stamp``).

    Returns its size in bytes and its fingerprint.
    """
    if output.serialized:  # fingerprinted as a reader parses the text back, not as the rows were before
        data = _outputs.serialize(table, output)
        output_fingerprint = _fingerprint.of(_outputs.read_back(data, table, output)) if fingerprint else None
        size = _outputs.write(table, fs, path, output, data)
        _outputs.write_stamp(fs, path, _with_fingerprint(stamp, output_fingerprint))  # text has no footer
        return size, output_fingerprint
    output_fingerprint = _fingerprint.of(table) if fingerprint else None
    stamp = _with_fingerprint(stamp, output_fingerprint)
    if GEO in (schema.metadata or {}):  # its GeoParquet bbox holds its rows (``schemas.with_geo_of_all``)
        stamp = {**stamp, GEO_OF_ROWS: True}
    metadata = {**(schema.metadata or {}), PILE_METADATA_KEY: json.dumps(stamp).encode()}
    table = table.replace_schema_metadata(metadata)
    if output.format == "parquet":
        return write_parquet(table, fs, path, output.compression), output_fingerprint
    return _outputs.write(table, fs, path, output), output_fingerprint


# A pile's stamp says its GeoParquet metadata is of its own rows: files written before took the first input
# file's bbox, and a compaction of such files cannot take their union
GEO_OF_ROWS = "geo_of_rows"


def _with_fingerprint(stamp: dict, fingerprint: Fingerprint | None) -> dict:
    return stamp if fingerprint is None else {**stamp, "fingerprint": fingerprint.to_json()}


def existing(fs: fsspec.AbstractFileSystem, paths: list[str]) -> set[str]:
    """Which of ``paths`` exist: one listing per directory rather than a probe per file.

    A fresh run's task then probes no file at all (a probe cost 0.2-0.3 ms
    locally, and is a request on an object store).
    """
    found: set[str] = set()
    for directory in {posixpath.dirname(p) for p in paths}:
        fs.invalidate_cache(directory)  # a listing cached before this run's tasks wrote is stale
        with contextlib.suppress(FileNotFoundError):
            found.update(p.rstrip("/") for p in fs.ls(directory, detail=False))
    return found.intersection(paths)


def pile_stamp(fs, path: str) -> dict | None:
    """What an output file says it holds (pile, piles, seed, rows...): its footer, or beside a text file
    the stamp written with it; None if no such file or stamp."""
    if _outputs.stamped_beside(path):
        return _outputs.read_stamp(fs, path)
    try:
        if path.endswith(".arrow"):
            with fs.open(path, "rb") as f:
                metadata = pa.ipc.open_file(f).schema.metadata or {}
        else:
            metadata = read_parquet(fs, path, pq.read_metadata).metadata or {}
    except (FileNotFoundError, ValueError, pa.ArrowInvalid):
        return None
    return stamp_of(metadata) or None


def stamp_of(found: pa.Schema | dict | None) -> dict:
    """The pile stamp in a file's schema (or its metadata); {} if none."""
    metadata = (found.metadata if isinstance(found, pa.Schema) else found) or {}
    stamp = metadata.get(PILE_METADATA_KEY)
    return json.loads(stamp) if stamp else {}


def _finished_pile(fs, path: str, expected: dict, fingerprint: bool) -> GatherResult | None:
    """The output file of an interrupted run of the same (pile, piles, seed, rows), if there is one."""
    stamp = pile_stamp(fs, path)
    if stamp is None:
        return None
    found = stamp.get("fingerprint")
    output_fingerprint = Fingerprint.from_json(found) if found else None
    if any(stamp.get(k) != v for k, v in expected.items()) or (fingerprint and output_fingerprint is None):
        return None
    if stamp.get("lazy", False) != expected.get("lazy", False):
        return None
    if fingerprint and not _still_holds(fs, path, output_fingerprint):
        return None  # changed since it was written, its footer kept: written again
    return GatherResult(
        expected.get("pile", expected.get("file")),
        expected["rows"],
        path,
        fs.size(path),
        output_fingerprint,
        reused=True,
        sub=expected.get("sub"),
    )


def _still_holds(fs, path: str, recorded: Fingerprint) -> bool:
    """Whether a Parquet or Arrow part holds the rows its footer's fingerprint says, read back as ``verify``
    reads it.  A resumed run took the footer's word, and said "verified" over a part changed since; the check
    of the whole run then holds only if each part's fingerprint is its rows'.  (A text part's stamp beside it
    records the file's identity, which a change does not keep.)"""
    if _outputs.stamped_beside(path):
        return True
    try:
        if path.endswith(".arrow"):
            with fs.open(path, "rb") as f:
                table = pa.ipc.open_file(f).read_all()
        else:
            table = read_parquet(fs, path)
    except (ValueError, OSError, pa.ArrowInvalid):
        return False
    return _fingerprint.of(table) == recorded


def write_parquet(table: pa.Table, fs: fsspec.AbstractFileSystem, path: str, codec: str | None = None) -> int:
    """Write one pile; returns the file's size in bytes.  Settings measured on the reference dataset (benchmarks/):

    - dictionary-encoding every column doubles write time and, on shuffled
      data, makes files larger, so only columns that already are dictionaries
      get it;
    - statistics only for integer and boolean columns (and vectors of them), for
      their null counts (``PileLoader(output="numpy")`` reads a column that holds a null
      anywhere as float64 in every batch, and refuses a null vector of integers; no cost measured): a pile is a
      uniform sample of the dataset, so its ranges span nearly every value
      and let a reader skip nothing, and statistics of every column cost a
      fifth of the write time (223 against 175 ns a row);
    - Snappy, but only on the columns it shrinks (``compression``).
    """
    dictionary_columns = [f.name for f in table.schema if pa.types.is_dictionary(f.type)]
    counted = [f.name for f in table.schema if _kernels.integer_or_boolean(f.type)]
    # and the values of vectors of integers (a null vector counts), which PileLoader(output="numpy") refuses
    depths = {f.name: _kernels.integer_vector_depth(f.type) for f in table.schema}
    counted += [_kernels.vector_leaf_paths(name, depth)[0] for name, depth in depths.items() if depth]
    with atomic_sink(fs, path) as sink:
        if not table.num_rows:
            # No row group, where pyarrow writes an empty one: Hugging Face datasets cannot read that file
            # ("BatchSize must be greater than 0"), and reads one without
            pq.ParquetWriter(sink, table.schema).close()
            return sink.tell()
        pq.write_table(
            table,
            sink,
            compression=codec or compression(table),
            use_dictionary=dictionary_columns or False,
            write_statistics=counted or False,
        )
        return sink.tell()


# Like ZFS, which stores a block uncompressed unless compressing saves an eighth of it.
SNAPPY_MIN_SAVING = 1 / 8
SNAPPY_SAMPLE_BYTES = 8 * 2**10  # per column and pile; deciding takes 0.2 ms a pile


def compression(table: pa.Table) -> str | dict[str, str]:
    """Snappy for every column, except flat columns on which it saves less than ``SNAPPY_MIN_SAVING``.

    Snappy is the codec every Parquet reader has, and usually worth it; but on
    values with little repetition it costs time for nothing.  Measured on a
    shuffled pile of dataset A, ns a row compressed against plain: random
    float64 9.8 against 6.9 (0 % saved), timestamps 46 against 7 (8 %
    saved), ids 30 against 8 (35 % saved), short strings 74 against 22 (52 %
    saved).  The decision is made on the pile's first ``SNAPPY_SAMPLE_BYTES``
    of values (a pile is a uniform sample, so any stretch of it is typical),
    so it is a function of the pile: the same for the same seed.  Tables with
    nested columns or repeated names keep Snappy everywhere (pyarrow names
    codecs per leaf column path).

    >>> import numpy as np
    >>> compression(pa.table({"noise": np.random.default_rng(0).random(10_000), "zeros": np.zeros(10_000)}))
    {'noise': 'none', 'zeros': 'snappy'}
    """
    names = table.column_names
    if len(set(names)) < len(names) or any(pa.types.is_nested(f.type) for f in table.schema):
        return "snappy"
    return {name: "snappy" if _snappy_pays(table.column(name)) else "none" for name in names}


def _snappy_pays(column: pa.ChunkedArray) -> bool:
    chunks = [c for c in column.chunks if len(c)]
    if not chunks:
        return True
    sample = _value_bytes(chunks[0], SNAPPY_SAMPLE_BYTES)
    if sample is None or sample.size < 4096:  # too few values to judge: the default
        return True
    return len(pa.compress(sample, "snappy")) <= (1 - SNAPPY_MIN_SAVING) * sample.size


def _value_bytes(array: pa.Array, limit: int) -> pa.Buffer | None:
    """Up to ``limit`` bytes of a primitive or string array's values (near what Parquet's plain encoding writes)."""
    t = array.type
    if pa.types.is_boolean(t) or pa.types.is_dictionary(t) or pa.types.is_null(t):
        return None
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        first = int(_kernels.value_offsets(array)[0])
        data = array.buffers()[2]
        return None if data is None else data.slice(first, min(limit, data.size - first))
    if not pa.types.is_primitive(t) and not pa.types.is_decimal(t) and not pa.types.is_fixed_size_binary(t):
        return None
    width = t.bit_width // 8 if not pa.types.is_fixed_size_binary(t) else t.byte_width
    return array.buffers()[1].slice(array.offset * width, min(len(array) * width, limit))


def scratch_can_finish(
    scratch_dir: Scratch, dest_fs, targets: list[str], piles: int, seed: int, output: Output = PARQUET
) -> bool:
    """Whether an interrupted run's scratch can finish the run: every band pass 2 removed has its piles in dest
    (in one of the directories ``targets``: an overwrite's staging directory, then dest, which a commit
    stopped halfway has moved part of them into).

    Pass 2 removes a band's scratch once the band's piles are written; if
    those piles were then deleted from dest (or are not this run's), the
    scratch can no longer make them, and resuming would fail in pass 2.
    """
    if scratch_dir.bands is None or not exists(scratch_dir.fs, scratch_dir.directory):
        return True
    present: dict[tuple[int, int], set[int]] = {}
    for path in scratch_dir.fs.ls(scratch_dir.directory, detail=False):
        parsed = _scratch.parse_scratch_name(posixpath.basename(path))
        if parsed is not None and parsed[2] is not None:
            present.setdefault(parsed[:2], set()).add(parsed[2])
    removed = set()
    for band in range(1, len(scratch_dir.bands) - 1):
        for key, found in present.items():
            # A listing made while pass 1 still renames files in may miss a band written before band 0 (readdir
            # does not return entries added during the listing in the order added): confirm the absence itself
            if 0 in found and band not in found and not exists(scratch_dir.fs, scratch_dir.path(*key, band)):
                removed.add(band)
                break
    needed = [j for b in sorted(removed) for j in range(scratch_dir.bands[b], scratch_dir.bands[b + 1])]
    return all(
        any(_holds_pile(dest_fs, posixpath.join(t, _manifest.part_name(j, piles, suffix=output.suffix)), j, piles, seed)
            for t in targets)
        for j in needed
    )  # fmt: skip


def _holds_pile(fs, path: str, pile: int, piles: int, seed: int) -> bool:
    stamp = pile_stamp(fs, path)
    return stamp is not None and (stamp.get("pile"), stamp.get("piles"), stamp.get("seed")) == (pile, piles, seed)
