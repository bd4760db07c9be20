"""Opening and reading Parquet files, local or through fsspec, with errors that name the file."""

from __future__ import annotations

import collections
import contextlib

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from daskpile._storage import FileChangedError, FileVersion, full_url, is_local, open_read, uncached
from daskpile.sources.text.formats import compression_of

# Spark, Hive and Impala write timestamps as INT96, which pyarrow reads as nanoseconds unless told otherwise,
# silently wrapping dates outside 1677-2262: Spark's 9999-12-31 sentinel became 1816-03-30, and verification,
# reading alike, agreed.  Read as microseconds, as Spark, Hive and DuckDB read them.
INT96_UNIT = "us"


def _read_table_single_threaded(source) -> pa.Table:
    # Parallelism comes from Dask running many of these at once; pyarrow's own
    # reader threads on top oversubscribe the cores (measured: pass 1 on 10 M
    # rows took 3.7 s with them, 2.5 s without, on 2 cores).
    pre_buffer = not isinstance(source, str)  # see open_parquet
    # partitioning=None: the folders' key=value columns are sources.hive's to read, typed as the plan says; pyarrow
    # before 22 added them to a single file's table too (``label=0/a.parquet`` gained a dictionary of int32)
    return pq.read_table(
        source, use_threads=False, pre_buffer=pre_buffer, coerce_int96_timestamp_unit=INT96_UNIT, partitioning=None
    )


def refuse_unwritable(footer: pq.FileMetaData, url: str) -> None:
    """ValueError naming a column whose Parquet type pyarrow reads but cannot write back: DuckDB's INTERVAL,
    read as 12 bytes and written as such, was a BLOB to DuckDB in the result, and verification (comparing the
    bytes) agreed; DuckDB's TIME WITH TIME ZONE came back a plain TIME.

    >>> import io
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"i": [1]}), sink)
    >>> refuse_unwritable(pq.read_metadata(pa.BufferReader(sink.getvalue())), "a.parquet")  # nothing to refuse
    """
    schema = footer.schema
    names = collections.Counter(schema.to_arrow_schema().names)  # (a Counter: a file may have 10,000 columns)
    twice = sorted(name for name, n in names.items() if n > 1)
    if twice:
        raise ValueError(
            f"{url!r} has {names[twice[0]]} columns named {twice[0]!r}: readers take one of them, or rename or "
            "refuse the file (Polars, Spark, and daskpile's verify); rename them first"
        )
    for i in range(len(schema)):
        column = schema.column(i)
        if column.converted_type == "INTERVAL" or str(column.logical_type) == "Interval":
            raise ValueError(
                f"column {column.path!r} of {url!r} is a Parquet INTERVAL, which pyarrow reads as 12 bytes and "
                "cannot write back: the result would hold bytes where its readers saw intervals; convert it first "
                "(DuckDB: to a number of seconds, or a string)"
            )
        # A TIME adjusted to UTC is DuckDB's TIMETZ where DuckDB wrote it; pyarrow up to 21 marked every time so
        # (and writes it so, where daskpile runs on it), so only DuckDB's files are refused
        if str(column.logical_type).startswith("Time(isAdjustedToUTC=true") and _by_duckdb(footer):
            raise ValueError(
                f"column {column.path!r} of {url!r} is DuckDB's TIME WITH TIME ZONE (a Parquet TIME adjusted to "
                "UTC), which pyarrow reads as a plain time: the result's readers would see TIME where they saw "
                "TIMETZ; convert it first (DuckDB: CAST(... AS TIME) for the time in UTC, or to a string)"
            )


def _by_duckdb(footer: pq.FileMetaData) -> bool:
    return (footer.created_by or "").lower().startswith("duckdb")


def arrow_schema(footer: pq.FileMetaData) -> pa.Schema:
    """The Arrow schema of a footer (a ``_metadata`` file's), as daskpile reads rows (``INT96_UNIT``).

    >>> import datetime, io
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"t": [datetime.datetime(1, 1, 1)]}), sink, use_deprecated_int96_timestamps=True)
    >>> arrow_schema(pq.read_metadata(pa.BufferReader(sink.getvalue()))).field("t").type
    TimestampType(timestamp[us])
    """
    return pq.ParquetFile(pa.BufferReader(b""), metadata=footer, coerce_int96_timestamp_unit=INT96_UNIT).schema_arrow


def read_parquet(fs: fsspec.AbstractFileSystem, path: str, reader=_read_table_single_threaded):
    """Read one Parquet file (or with ``reader=pq.read_metadata`` its footer) as Arrow.

    Local files go to pyarrow's native reader; others through fsspec.
    """
    with parquet_errors(full_url(fs, path)):
        if is_local(fs):
            return reader(path)
        with fs.open(path, "rb") as f:
            return reader(f)


# A streamed local row group's read buffer, per column (so small: a table may have hundreds of columns).
# Without one pyarrow reads each column chunk whole.  Measured, a row group of 2 M rows, 717 MiB in memory and
# 71 MiB on disk, in batches of 40,000 rows: Arrow's peak 50 MiB with 64 KiB buffers, 53 with 1 MiB, 118
# unbuffered, 0.36 s each; read whole, 1,405 MiB and 1.8-4.8 s.
STREAM_BUFFER_BYTES = 2**16


@contextlib.contextmanager
def open_parquet(
    fs: fsspec.AbstractFileSystem,
    path: str,
    footer: pq.FileMetaData | None = None,
    stream: bool | int = False,
    listed: FileVersion | None = None,
    **options,
):
    """A ``pq.ParquetFile`` (footer read, or ``footer`` given; no data yet), local or through fsspec.

    ``listed``: the version of the file listed before, which the file read must be (``FileChangedError`` if
    not): a footer read before, or another column of the same rows, is of that version.  A local file is
    looked at before it is opened and once the caller's block is done (Arrow maps a file it opens by its
    name, where a file opened here would have its pages copied: twice the memory); a remote one as opened.

    ``stream``: for ``iter_batches`` over a row group too large to hold, or a column read whole but held
    once (an int: the buffer's bytes, else ``STREAM_BUFFER_BYTES``): a local file's pages are read a buffer
    at a time, not its column chunks whole.  On an object store the column chunks are still fetched
    whole (pre-buffered, in few requests): a buffer's worth a request, column after column, would be
    thousands of requests, each refilling fsspec's read-ahead elsewhere.  ``options`` go to ``ParquetFile``
    (``read_dictionary``).
    """
    with contextlib.ExitStack() as stack:
        with parquet_errors(full_url(fs, path)):  # only the opening: errors of the caller's block stay theirs
            local = is_local(fs)
            check = listed is not None and local
            if check:
                listed.require(FileVersion.local(path), full_url(fs, path))
            source = path if local else stack.enter_context(open_read(fs, path, listed, **uncached(fs)))
            if listed is not None and not local:
                listed.require(FileVersion.opened(source), full_url(fs, path))
            # Pre-buffering (coalescing a file's reads) pays on object stores; locally it is a fixed cost
            # per file, as is memory-mapping.  CPU to read every file of a dataset on one thread, pyarrow
            # 26 (best of 4): A's 40 files 0.58 s mapped and pre-buffered, 0.57 s neither; the same rows as
            # 2,000 files 1.14 s against 0.81 s; files of 500,000 rows 53 ns a row either way.
            size = STREAM_BUFFER_BYTES if stream is True else stream
            buffered = {"buffer_size": size} if size and local else {}
            parquet = pq.ParquetFile(
                source,
                metadata=footer,
                pre_buffer=not local,
                coerce_int96_timestamp_unit=INT96_UNIT,
                filesystem=_LOCAL if local else None,
                **buffered,
                **options,
            )
            stack.callback(parquet.close)
        yield parquet
        if check:
            listed.require(FileVersion.local(path), full_url(fs, path))


# Given a path alone, Arrow makes a filesystem and looks the file up before opening it: 12 % of the time to
# open and read a file of 200 rows (30,000 such files, a lake of small ones)
_LOCAL = pafs.LocalFileSystem()


@contextlib.contextmanager
def parquet_errors(url: str, parquet: pq.ParquetFile | None = None, row_groups: list[int] | None = None):
    """Any failure to read or parse a file becomes an error that names it: ValueError, or FileNotFoundError.

    ``parquet`` and ``row_groups``: what the block reads, whose column a decoding error is in (Arrow's message
    names none) is then found, reading them one at a time: on that error only.
    """
    try:
        yield
    except FileNotFoundError as e:
        if url in str(e):
            raise
        raise FileNotFoundError(f"{url!r} does not exist (any more): {e}") from e
    except pa.ArrowMemoryError:
        raise
    except (pa.ArrowException, OSError) as e:  # ArrowInvalid, ArrowNotImplementedError (unsupported codecs), ...
        if type(e).__name__ == "FileExpired":  # s3fs reads with If-Match: the object changed since it was opened
            # (opened with the ETag the listing gave: mostly written again before any read, a trial found)
            raise FileChangedError(f"{url!r} was written again since it was listed, or while it was read") from e
        hint, name = "", url.rsplit("/", 1)[-1]
        if "magic bytes not found" in str(e):
            if "." not in name:  # Spark's part-00000, named so
                hint = " (a file named without an extension is read as Parquet: if these are text, pass --format)"
            elif compression_of(name) is not None:  # logs.gz: compressed, but compressed what?
                hint = (
                    " (a compressed file whose name says no format within, such as .txt.gz or .jsonl.gz, is read as "
                    "Parquet: pass --format)"
                )
        elif "more than 64 bits" in str(e):  # Arrow has no such type, so names no column: say what it is
            hint = " (a column of 128-bit integers, such as Polars' Int128: cast it to Int64 or a Decimal first)"
        elif isinstance(e, pa.ArrowInvalid) and parquet is not None:
            hint = _column_failing(parquet, row_groups, e)
        raise ValueError(f"cannot read {url!r} as Parquet: {e}{hint}") from e


def _column_failing(parquet: pq.ParquetFile, row_groups: list[int], error: pa.ArrowInvalid) -> str:
    """`` (column 'x')``, the first column whose reading on its own fails as the whole did, or ``""``."""
    for name in parquet.schema_arrow.names:
        try:
            parquet.read_row_groups(row_groups, columns=[name], use_threads=False)
        except pa.ArrowInvalid as e:
            if str(e) != str(error):
                continue
            if "list offsets" in str(e):  # (DuckDB's, reproduced with pq.read_table; see the lakes guide)
                return (
                    f" (column {name!r}: if DuckDB wrote it, an ARRAY holding null rows, which pyarrow cannot read: "
                    f"write it as a list, {name}::INTEGER[] for one of integers)"
                )
            return f" (column {name!r})"
        except Exception:  # another error: not this one's column
            continue
    return ""
