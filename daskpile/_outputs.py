"""What a pile is written as: Parquet (the default), Arrow IPC, CSV or plain lines, optionally compressed.

Every format writes a whole pile at once, atomically (a temporary name, then
a rename), and reads it back for ``verify``.  Parquet and Arrow files carry
the pile's stamp (which pile, seed, rows, fingerprint) in their schema
metadata, so a rerun reuses them; a CSV or lines file is rewritten instead.

- ``lines``: the single binary or string column of the rows, each value
  followed by ``\\n``: with lines in (``format="lines"``), the output is the
  input's lines permuted, byte for byte (a final newline added where the
  input's last line had none);
- ``csv``: pyarrow's CSV writer, a header line per file.
"""

from __future__ import annotations

import dataclasses
import io

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.ipc as ipc

from daskpile._storage import atomic_sink
from daskpile.sources.text import lines_table, open_decompressed

OUTPUT_FORMATS = ("parquet", "arrow", "csv", "lines")
COMPRESSIONS = ("gzip", "zstd")
_SUFFIXES = {"parquet": ".parquet", "arrow": ".arrow", "csv": ".csv", "lines": ".txt"}
_COMPRESSED_SUFFIXES = {"gzip": ".gz", "zstd": ".zst"}


@dataclasses.dataclass(frozen=True)
class Output:
    """A pile's file format and compression.

    >>> Output("lines", "zstd").suffix, Output().suffix
    ('.txt.zst', '.parquet')
    """

    format: str = "parquet"
    compression: str | None = None

    def __post_init__(self):
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, got {self.format!r}")
        if self.compression is not None and self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}")
        if self.format == "arrow" and self.compression == "gzip":
            raise ValueError("Arrow files compress with zstd (compression='zstd'), not gzip")

    @property
    def suffix(self) -> str:
        """The file name's end; Parquet and Arrow compress inside the file."""
        if self.format in ("parquet", "arrow") or not self.compression:
            return _SUFFIXES[self.format]
        return _SUFFIXES[self.format] + _COMPRESSED_SUFFIXES[self.compression]

    @property
    def stamped(self) -> bool:
        """Whether the file carries the pile's stamp, so that a rerun can reuse it."""
        return self.format in ("parquet", "arrow")

    def check(self, schema: pa.Schema) -> None:
        """Refuse, before anything runs, rows this format cannot hold."""
        if self.format == "lines" and (
            len(schema) != 1 or not (pa.types.is_binary(schema[0].type) or pa.types.is_string(schema[0].type))
        ):
            raise ValueError(
                f"output_format='lines' writes a single binary or string column, and the rows have {schema.names}"
            )

    def key(self) -> str:
        """For a run's identity: ``"parquet"``, ``"lines:zstd"``."""
        return self.format + (f":{self.compression}" if self.compression else "")

    def to_json(self) -> dict:
        return {"format": self.format, "compression": self.compression}


def of_manifest(manifest: dict | None) -> Output:
    """The format a result's files were written in (Parquet in manifests that do not say)."""
    found = (manifest or {}).get("output") or {}
    return Output(found.get("format", "parquet"), found.get("compression"))


def require_parquet(manifest: dict | None, where: str, what: str) -> None:
    """Refuse a result whose files are not Parquet, for what reads Parquet only (``what``)."""
    output = of_manifest(manifest)
    if output.format != "parquet":
        raise ValueError(f"{where!r} holds {output.format} files: {what} reads Parquet results only")


def write(table: pa.Table, fs: fsspec.AbstractFileSystem, path: str, output: Output) -> int:
    """Write one pile that is not Parquet (``_passes.write_parquet`` writes those); its size in bytes."""
    with atomic_sink(fs, path) as sink:
        if output.format == "arrow":
            options = ipc.IpcWriteOptions(compression=output.compression)
            with ipc.new_file(sink, table.schema, options=options) as writer:
                writer.write_table(table)
            return sink.tell()
        if output.format == "csv":
            data = pa.BufferOutputStream()
            pa_csv.write_csv(table.replace_schema_metadata(None), data)
            data = data.getvalue()
        else:
            data = _lines_bytes(table.column(0))
        if output.compression:  # one shot, in memory: a pile fits it, and every zstd and gzip tool reads the frame
            data = pa.compress(data, output.compression, asbytes=False)
        sink.write(data)
        return sink.tell()


def _lines_bytes(column: pa.ChunkedArray) -> pa.Buffer:
    """Every value followed by a newline, end to end, joined by Arrow (a null is an empty line)."""
    values = column.combine_chunks().fill_null(b"" if pa.types.is_binary(column.type) else "")
    empty, newline = (pa.scalar(v, pa.binary()).cast(values.type) for v in (b"", b"\n"))
    joined = pc.binary_join_element_wise(values, empty, newline)
    if not len(joined):
        return pa.py_buffer(b"")
    width = np.int64 if pa.types.is_large_binary(joined.type) or pa.types.is_large_string(joined.type) else np.int32
    offsets = np.frombuffer(joined.buffers()[1], dtype=width)[joined.offset : joined.offset + len(joined) + 1]
    return joined.buffers()[2][int(offsets[0]) : int(offsets[-1])]


def read(fs: fsspec.AbstractFileSystem, path: str, output: Output, schema: pa.Schema) -> pa.Table:
    """A pile file as the table that was written (its rows in ``schema``), for ``verify``."""
    try:
        return _read(fs, path, output, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"cannot read {path!r} as {output.format}: {e}") from e


def _read(fs, path: str, output: Output, schema: pa.Schema) -> pa.Table:
    with open_decompressed(fs, path) as f:
        data = f.read()
    if output.format == "arrow":
        return ipc.open_file(pa.py_buffer(data)).read_all()
    if output.format == "csv":
        return pa_csv.read_csv(
            io.BytesIO(data),
            read_options=pa_csv.ReadOptions(use_threads=False, block_size=len(data) + 1),
            convert_options=pa_csv.ConvertOptions(column_types=schema),
        )
    lines = lines_table(data).column(0)
    return pa.table({schema[0].name: lines.cast(schema[0].type)})
