"""Arrow IPC (Feather v2) and ORC files as sources: read a record batch or a stripe at a time.

Neither is cut into byte ranges: a file's units are its record batches (IPC)
or stripes (ORC), which pass 1 groups into pieces of at most ``blocksize``
bytes in memory, as it groups a Parquet file's row groups.  An ``.arrow`` file
may also hold the IPC *stream* format (Hugging Face ``datasets`` writes its
cache so): its batches are read in order, the same way.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.orc as orc

from daskpile._storage import FileVersion, full_url, open_read
from daskpile.sources.schemas import table_without_views, without_views

FORMATS = ("arrow", "orc")
# An ORC file's size in memory, before it is read: this many times its size on disk (its default codec
# is zlib); an IPC file is its size in memory, unless its buffers are compressed.
ORC_RATIO = 4


@contextlib.contextmanager
def opened(fs, path: str, format: str, listed: FileVersion | None = None):
    """The IPC file reader or ``ORCFile`` of ``path`` (of the version ``listed``), with errors that name the
    file."""
    url = full_url(fs, path)
    with open_read(fs, path, listed) as f:
        try:
            reader = orc.ORCFile(f) if format == "orc" else _ipc_reader(f)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise ValueError(f"cannot read {url!r} as {format}: {e}") from None
        yield reader


def _ipc_reader(f):
    """The IPC file reader of ``f``; for the stream format, its stream reader."""
    try:
        return ipc.open_file(f)
    except pa.ArrowInvalid as e:
        if "Not an Arrow file" not in str(e):
            raise
        f.seek(0)
        if f.read(4) == b"FEA1":  # (pyarrow.feather.read_table reads it; a dataset's reader does not)
            raise pa.ArrowInvalid(
                "it is a Feather v1 file, which is not Arrow IPC: rewrite it "
                "(pyarrow.feather.write_feather(pyarrow.feather.read_table(path), new_path))"
            ) from None
        f.seek(0)
        try:
            return ipc.open_stream(f)
        except pa.ArrowInvalid:
            raise e from None  # neither: the file format's error


def schema(fs, path: str, format: str) -> pa.Schema:
    """The files' schema as read: views (Polars writes its strings as ``string_view``) as their large forms, as
    Parquet files' are (``schemas.without_views``: pyarrow before 22 sizes no view, and its CSV writer takes none)."""
    with opened(fs, path, format) as reader:
        return without_views(reader.schema)


def units(fs, path: str, format: str, listed: FileVersion | None = None):
    """(bytes in memory, table) of each record batch or stripe, in order, one in memory at a time."""
    with opened(fs, path, format, listed) as reader:
        if isinstance(reader, ipc.RecordBatchStreamReader):
            parts = iter(reader)
        elif format == "arrow":
            parts = (reader.get_batch(k) for k in range(reader.num_record_batches))
        else:
            parts = (reader.read_stripe(k) for k in range(reader.nstripes))
        for part in parts:
            table = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else pa.table(part)
            table = table_without_views(table)
            yield table.nbytes, table


def estimate(fs, path: str, sizes: list[int], format: str) -> tuple[int, int]:
    """(rows, bytes in memory) of the files, extrapolated from the first file's first unit."""
    for nbytes, table in units(fs, path, format):
        if table.num_rows:
            stored = sum(sizes) * (ORC_RATIO if format == "orc" else 1)
            return round(stored * table.num_rows / max(nbytes, 1)), stored
    return 0, 0
