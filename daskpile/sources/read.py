"""Reading one partition of a plan (a group of consecutive files) as Arrow tables in the plan's schema.

A partition is cut into pieces of whole row groups of at most ``blocksize``
bytes uncompressed, across file boundaries, and a larger row group into
pieces of its rows: a piece of many small files is one table, scattered at
once, so the number of scatter tasks and scratch files follows the bytes, not
the file count, and a task never holds more than about ``blocksize`` of rows
(on an object store, beside the compressed bytes of a cut row group, fetched
whole: see ``open_parquet``).  A partition of one file is cut as
that file alone always was.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator

import pyarrow as pa

from daskpile._storage import FileVersion, full_url
from daskpile.sources import arrowfiles, text
from daskpile.sources.parquet import open_parquet, parquet_errors, refuse_unwritable
from daskpile.sources.schemas import HUGGING_FACE, Conformer, conformer
from daskpile.sources.text import TextOptions


@dataclasses.dataclass(frozen=True)
class SourceFile:
    path: str
    size: int  # bytes stored
    stamp: str  # size and modification stamp, to tell a rerun whether the file changed
    keys: tuple[tuple[str, pa.Scalar], ...] = ()  # its partition values
    byte_range: tuple[int, int] | None = None  # of a text file cut into ranges: [start, end) of it
    listed: FileVersion | None = None  # as listed when the run was planned (None: a table's, never written again)


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a task needs to turn a file's rows into the plan's rows."""

    schema: pa.Schema
    policy: str  # "strict", "unify", or "table" (a table format's schema: missing columns are nulls)
    reference: str  # the file (or table) the schema comes from, for messages
    # Iceberg: (field id, its path of names now), nested fields' too; columns are matched by id
    field_ids: tuple[tuple[int, tuple[str, ...]], ...] = ()
    name_ids: tuple[tuple[str, int], ...] = ()  # Iceberg: its name mapping, for files written without field ids
    text: TextOptions | None = None  # how text files are read; None: Parquet
    # The types the output's readers get back, where they differ (``Output.stored_plan``): the rows take them
    stored: pa.Schema | None = None
    # Parquet: the Arrow bytes a row takes at least, where footers count less (dictionary-encoded columns: a
    # country name in a byte), so that a piece of ``blocksize`` bytes is that size in memory too
    row_bytes: int = 0
    # Parquet: a row group larger than a piece is read in parts of consecutive rows; False (runs begun before
    # daskpile cut row groups, resumed) reads it whole, one piece, as they did
    cut_row_groups: bool = True

    @property
    def window(self) -> str | None:
        """The moving window whose columns the rows are read into (an append's), else None."""
        return self.reference if self.policy == "window" else None


def read_pieces(
    fs,
    files: list[SourceFile],
    reading: Reading,
    blocksize: int,
    skip: Callable[[int], bool] = lambda piece: False,
    footer_rows: list[int] | None = None,
    check_rows: Callable[[str, int, float], None] | None = None,
) -> Iterator[tuple[int, pa.Table | None]]:
    """The pieces of a partition in order, as (piece, table in the plan's schema).

    A piece is whole row groups, across file boundaries, of at most
    ``blocksize`` bytes uncompressed, or in memory where ``reading.row_bytes``
    says that is more; a larger row group is cut in pieces of consecutive
    rows (``row_group_parts``), read a batch at a time; a partition
    without rows is one empty piece.  Files are opened one at a time, so a
    partition of thousands of tiny files never holds them all open.  Pieces
    ``skip`` says are done come as (piece, None), their rows not read.  Each
    Parquet file's row count, as its footer says, is appended to ``footer_rows``.
    ``check_rows(row_group, rows, row_bytes)`` sees each row group (named), its
    rows and their average size in memory before any is read, and may refuse them.
    """
    if reading.text is not None:
        yield from _text_pieces(fs, files, reading, blocksize, skip)
        return
    piece, size, tables, filled = 0, 0, [], False  # filled: the current piece has row groups
    skipped = skip(0)
    known: list = []  # (schema, keys, conformer): in a lake most files share both (schemas may not hash)
    checked: list = []  # (Parquet schema, writer) checked: an Arrow type may stand for two Parquet types
    for f in files:
        url = full_url(fs, f.path)
        with open_parquet(fs, f.path, listed=f.listed) as parquet:
            schema, footer = parquet.schema_arrow, parquet.metadata
            if footer_rows is not None:
                footer_rows.append(footer.num_rows)
            # (the columns' metadata, not the schema's: pandas' differs from file to file, by its RangeIndex;
            # but Hugging Face's features, which the conformer compares)
            features = (schema.metadata or {}).get(HUGGING_FACE)
            bare = schema.remove_metadata() if features is None else schema.with_metadata({HUGGING_FACE: features})
            # (newest first: a folder's files come one after the other, and its key tuple is shared)
            conform = next(
                (
                    c
                    for s, k, c in reversed(known)
                    if (k is f.keys or k == f.keys) and s.equals(bare, check_metadata=True)
                ),
                None,
            )
            writer = footer.created_by  # (before the run, only the first file's types were checked)
            if not any(parquet.schema.equals(s) and writer == w for s, w in checked):
                refuse_unwritable(footer, url)
                checked.append((parquet.schema, writer))
            if conform is None:
                conform = conformer(
                    schema,
                    reading.schema,
                    dict(f.keys),
                    reading.policy,
                    url,
                    reading.reference,
                    dict(reading.field_ids),
                    dict(reading.name_ids),
                )
                known.append((bare, f.keys, conform))
            groups: list[int] = []  # of this file, in the current piece
            for g in range(footer.num_row_groups):
                group = footer.row_group(g)
                if not group.num_rows and reading.cut_row_groups:  # nothing to read (alone, an empty piece)
                    continue
                if check_rows is not None and group.num_rows:
                    check_rows(f"row group {g} of {url!r}", group.num_rows, group.total_byte_size / group.num_rows)
                nbytes = max(group.total_byte_size, group.num_rows * reading.row_bytes)
                parts = row_group_parts(group.num_rows, nbytes, blocksize) if reading.cut_row_groups else 1
                if filled and (parts > 1 or size + nbytes > blocksize):
                    if groups and not skipped:
                        tables.append((_read(parquet, groups, url), conform, url))
                    yield piece, None if skipped else _concat(_conformed(tables), reading)
                    piece, size, tables, groups, filled = piece + 1, 0, [], [], False
                    skipped = skip(piece)
                if skipped is None:
                    skipped = skip(piece)
                if parts > 1:
                    skips = [skipped] + [skip(piece + i) for i in range(1, parts)]
                    cut = _read_in_parts(fs, f, footer, g, nbytes, parts, skips, conform, url)
                    for i, table in enumerate(cut):
                        yield piece + i, None if table is None else _concat([table], reading)
                    piece, skipped = piece + parts, None  # None: asked when the next piece gets a row group
                    continue
                groups.append(g)
                size += nbytes
                filled = True
            if groups and not skipped:
                tables.append((_read(parquet, groups, url), conform, url))
    if filled or piece == 0:
        yield piece, None if skipped else _concat(_conformed(tables), reading)


MIN_PART_BYTES = 2**14  # the command's least --blocksize


def row_group_parts(rows: int, nbytes: int, blocksize: int) -> int:
    """In how many pieces of consecutive rows a row group of ``nbytes`` in memory is read: 1 if it fits a piece.

    >>> row_group_parts(1_000_000, 700 * 2**20, 256 * 2**20), row_group_parts(1_000_000, 2**20, 256 * 2**20)
    (3, 1)
    >>> row_group_parts(5, 4 * 2**20, 2**20)  # 2 rows a part: 3 parts, none empty
    3
    >>> row_group_parts(1_000_000, 2**20, 1)  # cut at 16 KiB, not at a smaller blocksize: not a file a row
    64
    """
    parts = min(-(-nbytes // max(blocksize, MIN_PART_BYTES)), rows)
    if parts <= 1:
        return 1
    return -(-rows // -(-rows // parts))


# A streamed row group is read in batches of about this many bytes in memory, a part (a piece) concatenated
# from them: the batches in flight stay small beside the part.
STREAM_BATCH_BYTES = 16 * 2**20


def _read_in_parts(
    fs, f: SourceFile, footer, group: int, nbytes: int, parts: int, skips: list[bool], conform, url: str
) -> Iterator[pa.Table | None]:
    """Row group ``group`` (``nbytes`` in memory) in ``parts`` pieces of consecutive rows, each read and
    yielded in turn: a task holds one part, not the group.  Parts ``skips`` says are done are None; those
    before one that is not are still decoded (a row group is read from its start), and none after the last
    that is not."""
    if all(skips):
        yield from [None] * parts
        return
    rows = footer.row_group(group).num_rows
    per_part = -(-rows // parts)
    batch_rows = max(1, min(per_part, STREAM_BATCH_BYTES * rows // max(nbytes, 1)))
    last = max(i for i, done in enumerate(skips) if not done)
    with open_parquet(fs, f.path, footer, stream=True, listed=f.listed) as parquet, parquet_errors(url):
        batches = _ExactBatches(parquet.iter_batches(batch_size=batch_rows, row_groups=[group], use_threads=False))
        for i in range(last + 1):
            part = batches.take(min(per_part, rows - i * per_part))
            yield None if skips[i] else conform(pa.Table.from_batches(part, parquet.schema_arrow), url)
    yield from [None] * (parts - last - 1)


class _ExactBatches:
    """Record batches cut at given row counts: ``take(n)`` gives the next ``n`` rows as batches."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._batches, self._rest = batches, None

    def take(self, rows: int) -> list[pa.RecordBatch]:
        taken = []
        while rows:
            batch = self._rest if self._rest is not None else next(self._batches)
            self._rest = batch.slice(rows) if batch.num_rows > rows else None
            taken.append(batch.slice(0, rows) if batch.num_rows > rows else batch)
            rows -= taken[-1].num_rows
        return taken


def _text_pieces(fs, files: list[SourceFile], reading: Reading, blocksize: int, skip) -> Iterator:
    """Text files as pieces: blocks of whole lines, across files, up to ``blocksize`` bytes read."""
    data_schema = pa.schema([f for f in reading.schema if f.name not in dict(files[0].keys)]) if files else None
    piece, size, tables = 0, 0, []
    skipped = skip(0)
    for f in files:
        url = full_url(fs, f.path)
        for nbytes, table, actual in _units(fs, f, reading, data_schema, blocksize):
            if size and size + nbytes > blocksize:
                yield piece, None if skipped else _concat(tables, reading)
                piece, size, tables = piece + 1, 0, []
                skipped = skip(piece)
            size += nbytes
            if not skipped:
                conform = conformer(actual, reading.schema, dict(f.keys), "first file", url, reading.reference)
                tables.append(conform(table(), url))
    yield piece, None if skipped else _concat(tables, reading)


def _units(fs, f: SourceFile, reading: Reading, data_schema: pa.Schema, blocksize: int) -> Iterator:
    """(bytes, a function giving the table, its schema) of each block of lines, record batch or stripe."""
    if reading.text.format in arrowfiles.FORMATS:
        for nbytes, table in arrowfiles.units(fs, f.path, reading.text.format, f.listed):
            yield nbytes, lambda table=table: table, table.schema
        return
    reader = text.BlockReader(fs, f.path, data_schema, reading.text, blocksize, reading.window, f.listed)
    if reading.text.newlines_in_values:
        for table in reader.streamed_records():
            yield table.nbytes, lambda table=table: table, data_schema
        return
    for start, block in reader.blocks(f.byte_range):
        yield len(block), lambda block=block, start=start: reader.parse(block, start), data_schema


def _read(parquet, groups: list[int], url: str) -> pa.Table:
    with parquet_errors(url, parquet, groups):
        return parquet.read_row_groups(groups, use_threads=False)


def _conformed(read: list[tuple[pa.Table, Conformer, str]]) -> list[pa.Table]:
    """Tables as read, each with its file's conformer and URL, in the plan's schema.

    Consecutive tables of one conformer (the files of one folder that share a schema) are turned at once:
    in a lake of files of 200 rows, turning each (its folder's keys repeated, its columns cast) cost half as
    much as reading it.  Where that fails, each is turned alone, so that the error names its file.
    """
    tables = []
    for _, run in itertools.groupby(read, key=lambda entry: id(entry[1])):
        run = list(run)
        _, conform, url = run[0]
        if len(run) == 1:
            tables.append(conform(run[0][0], url))
            continue
        try:
            tables.append(conform(pa.concat_tables([table for table, _, _ in run]), url))
        except ValueError:
            tables.extend(conform(table, url) for table, _, url in run)
    return tables


def _concat(tables: list[pa.Table], reading: Reading) -> pa.Table:
    schema = reading.schema
    if not tables:
        table = pa.Table.from_batches([], schema=schema)  # (schema.empty_table() imports pandas)
    else:
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        # the plan's metadata, its columns' too: a file's own (a Polars Enum's categories) would describe the
        # rows of other files in the piles its rows reach first
        if not table.schema.equals(schema, check_metadata=True):
            table = pa.Table.from_arrays(table.columns, schema=schema)
    return table if reading.stored is None else _as_stored(table, reading.stored)


def _as_stored(table: pa.Table, stored: pa.Schema) -> pa.Table:
    """``table`` cast to the types the output stores; ValueError naming a column whose values those cannot hold."""
    columns = []
    for column, field in zip(table.columns, stored, strict=True):
        try:
            columns.append(column if column.type.equals(field.type) else column.cast(field.type))
        except pa.ArrowInvalid as e:
            raise ValueError(
                f"column {field.name!r} ({column.type}) holds values that Parquet, which stores it as {field.type}, "
                f"cannot hold ({e}): write another format (--output-format arrow)"
            ) from None
    return pa.Table.from_arrays(columns, schema=stored)
