"""Arrow IPC (Feather v2) and ORC files as sources: read a record batch or a stripe at a time.

Neither is cut into byte ranges: a file's units are its record batches (IPC)
or stripes (ORC), which pass 1 groups into pieces of at most ``blocksize``
bytes in memory, as it groups a Parquet file's row groups.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.orc as orc

from daskpile._storage import full_url

FORMATS = ("arrow", "orc")
# An ORC file's size in memory, before it is read: this many times its size on disk (its default codec
# is zlib); an IPC file is its size in memory, unless its buffers are compressed.
ORC_RATIO = 4


@contextlib.contextmanager
def opened(fs, path: str, format: str):
    """The IPC file reader or ``ORCFile`` of ``path``, with errors that name the file."""
    url = full_url(fs, path)
    with fs.open(path, "rb") as f:
        try:
            reader = ipc.open_file(f) if format == "arrow" else orc.ORCFile(f)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise ValueError(f"cannot read {url!r} as {format}: {e}") from None
        yield reader


def schema(fs, path: str, format: str) -> pa.Schema:
    with opened(fs, path, format) as reader:
        return reader.schema


def units(fs, path: str, format: str):
    """(bytes in memory, table) of each record batch or stripe, in order, one in memory at a time."""
    with opened(fs, path, format) as reader:
        count = reader.num_record_batches if format == "arrow" else reader.nstripes
        for k in range(count):
            part = reader.get_batch(k) if format == "arrow" else reader.read_stripe(k)
            table = pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else pa.table(part)
            yield table.nbytes, table


def estimate(fs, path: str, sizes: list[int], format: str) -> tuple[int, int]:
    """(rows, bytes in memory) of the files, extrapolated from the first file's first unit."""
    for nbytes, table in units(fs, path, format):
        if table.num_rows:
            stored = sum(sizes) * (ORC_RATIO if format == "orc" else 1)
            return round(stored * table.num_rows / max(nbytes, 1)), stored
    return 0, 0
