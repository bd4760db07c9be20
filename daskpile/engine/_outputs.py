"""What a pile is written as: Parquet (the default), Arrow IPC, CSV or plain lines, optionally compressed.

Every format writes a whole pile at once, atomically (a temporary name, then
a rename), and reads it back for ``verify``.  Parquet and Arrow files carry
the pile's stamp (which pile, seed, rows, fingerprint) in their schema
metadata, so a rerun of an interrupted run reuses them; a text file's stamp is
a small file beside it (``write_stamp``), valid while the file is the one it
was written with (``file_identity``).

- ``lines``: the single binary or string column of the rows, each value
  followed by ``\\n``: with lines in (``format="lines"``), the output is the
  input's lines permuted, byte for byte (a final newline added where the
  input's last line had none);
- ``jsonl``: one JSON object per row, built by Arrow's kernels; rows read as
  JSON lines as written (``text.is_json_text``) are written as the lines they
  are, byte for byte;
- ``csv``: pyarrow's CSV writer, a header line per file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.ipc as ipc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from daskpile import _kernels
from daskpile._storage import atomic_sink, is_local, rows_per_write, write_bytes, write_in_pieces
from daskpile.sources.schemas import view_free, without_views
from daskpile.sources.text import JSON_TEXT, SCAN_BYTES, first_newline, is_json_text, lines_table, open_decompressed
from daskpile.sources.text.formats import LINE

OUTPUT_FORMATS = ("parquet", "arrow", "csv", "jsonl", "lines")
COMPRESSIONS = ("gzip", "zstd")
_SUFFIXES = {"parquet": ".parquet", "arrow": ".arrow", "csv": ".csv", "jsonl": ".jsonl", "lines": ".txt"}
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

    def stored_plan(self, plan):
        """``plan`` (a ``SourcePlan``) with its rows cast, once read, to the types this format's readers get back.

        Parquet has no unit of seconds and no date in milliseconds: Arrow
        writes ``timestamp[s]`` and ``time32[s]`` in milliseconds and
        ``date64`` as ``date32``, and readers get those.  The rows are
        fingerprinted in the types a reader gets, so a result verifies as it
        is read back (before, ``verify`` called a result of a CSV's
        ``timestamp[s]`` column a mismatch).  Other formats keep every type.
        """
        if self.format != "parquet":
            return plan
        stored = parquet_stored_schema(plan.reading.schema)
        if stored.equals(plan.reading.schema):
            return plan
        return dataclasses.replace(plan, reading=dataclasses.replace(plan.reading, stored=stored))

    @property
    def serialized(self) -> bool:
        """Whether the rows are written as text that readers parse back (their fingerprint is taken so)."""
        return self.format in ("csv", "jsonl", "lines")

    def check(self, schema: pa.Schema) -> None:
        """Refuse, before anything runs, rows this format cannot hold."""
        if self.format == "jsonl" and is_json_text(schema):
            return
        if self.format in ("jsonl", "csv"):
            decoded = _decoded_schema(schema)
            nested = [f for f in decoded if pa.types.is_nested(f.type)]
            if nested:
                raise ValueError(
                    f"output_format={self.format!r} writes flat columns, and {nested[0].name!r} is {nested[0].type}: "
                    "write parquet or arrow"
                )
            for field in decoded:  # (found in pass 2 otherwise, after pass 1's work)
                if isinstance(field.type, pa.BaseExtensionType):  # (an empty one casts; its values do not)
                    raise ValueError(
                        f"output_format={self.format!r} writes values as text, and Arrow cannot write column "
                        f"{field.name!r} ({field.type}) so: cast it to a string first (DuckDB: CAST(... AS "
                        "VARCHAR)), or write another format (parquet, arrow)"
                    )
                try:
                    pc.cast(pa.array([], field.type), pa.string())
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise ValueError(
                        f"output_format={self.format!r} writes values as text, and Arrow cannot write column "
                        f"{field.name!r} ({field.type}) so: write another format (arrow)"
                    ) from None
            if not self._reads_back(decoded):  # (a half float, a decimal256: found in pass 2 otherwise)
                field = next((f for f in decoded if not self._reads_back(pa.schema([f]))), None)
                shown = ", ".join(decoded.names[:10]) + (
                    f", and {len(decoded) - 10:,} more" if len(decoded) > 10 else ""
                )
                named = f"column {field.name!r} ({field.type})" if field else f"these columns together ({shown})"
                raise ValueError(
                    f"output_format={self.format!r} writes values as text, and Arrow cannot write {named} so, or "
                    "read it back: write another format (arrow)"
                )
        if self.format == "lines" and (
            len(schema) != 1 or not (pa.types.is_binary(schema[0].type) or pa.types.is_string(schema[0].type))
        ):
            advice = ""
            if len(schema) > 1 and schema.names[0] == LINE:  # (lines already, beside the key=value folders' columns)
                advice = (
                    ": folders named key=value add columns (--partitioning none leaves them out), and a table's other "
                    "columns (--format lines reads each line whole)"
                )
            elif len(schema) > 1:
                advice = (
                    ": read the input with --format lines; folders named key=value add columns (--partitioning none)"
                )
            raise ValueError(
                f"output_format='lines' writes a single binary or string column, and the rows have {schema.names}"
                + advice
            )

    def _reads_back(self, schema: pa.Schema) -> bool:
        """Whether a row of nulls of ``schema`` is written and read back as a pile is."""
        beside = "_" + "_".join(schema.names)  # (a CSV row of one null is an empty line, refused)
        probe = pa.table({**{f.name: pa.nulls(1, f.type) for f in schema}, beside: [0]})
        try:
            parse(serialize(probe, self), self, probe.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return False
        return True

    def refuse_values(self, table: pa.Table, where: str, *, cut_at_newlines: bool = False) -> None:
        """Refuse, as pass 1 reads them (``where``: their file), values this format writes as others: a
        NaN in CSV (read back as null), a NaN or infinity in JSON lines (which JSON cannot hold), a value
        holding a newline in lines (two lines read back; not looked for where the input's rows were
        ``cut_at_newlines``).  Pass 2's writers refuse them too; found here, the message names the file, and
        no more of pass 1 is spent on a run that cannot finish.

        >>> Output("csv").refuse_values(pa.table({"x": [1.0, float("nan")]}), "'a.parquet'")
        Traceback (most recent call last):
        ...
        ValueError: column 'x' holds NaN, in 'a.parquet', which CSV readers read back as null: write another format
        """
        if self.format == "lines" and not cut_at_newlines:
            for name, column in zip(table.column_names, table.columns, strict=True):
                values = column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
                for chunk in values.chunks:
                    _refuse_newline(chunk, name, where)
        if self.format not in ("csv", "jsonl") or (self.format == "jsonl" and is_json_text(table.schema)):
            return
        # (plain lines written as CSV or JSON lines: a line not UTF-8 was said in pass 2, of no file, and of
        # whichever pile failed first); a dictionary's values as the rows hold them
        binary = {
            name: column if column.type in _BINARY else column.cast(column.type.value_type)
            for name, column in zip(table.column_names, table.columns, strict=True)
            if column.type in _BINARY or (pa.types.is_dictionary(column.type) and column.type.value_type in _BINARY)
        }
        if binary:
            _refuse_not_utf8(pa.table(binary), self, where)
        for name, column in zip(table.column_names, table.columns, strict=True):
            if not pa.types.is_floating(column.type):
                continue
            if self.format == "csv" and pc.any(pc.is_nan(column)).as_py():
                raise ValueError(
                    f"column {name!r} holds NaN, in {where}, which CSV readers read back as null: write another format"
                )
            if self.format == "jsonl" and pc.any(pc.invert(pc.is_finite(column))).as_py():
                raise ValueError(
                    f"column {name!r} holds {_first_not_finite(column)}, in {where}, which JSON cannot hold: write "
                    "another format"
                )

    @classmethod
    def from_key(cls, key: str) -> Output:
        """The inverse of ``key``.

        >>> Output.from_key("lines:zstd") == Output("lines", "zstd")
        True
        """
        format, _, compression = key.partition(":")
        return cls(format, compression or None)

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


# Beside the text files of a run in progress, in the same directory: hidden, so that readers of the
# directory skip it, and removed when the run commits (its manifest then records the files).
STAMPS_DIR = ".daskpile-stamps"


def stamp_path(path: str) -> str:
    """Where the stamp of the text file ``path`` is kept while its run is under way.

    >>> stamp_path("out/part-00003.txt.zst")
    'out/.daskpile-stamps/part-00003.txt.zst.json'
    """
    directory, name = posixpath.split(path)
    return posixpath.join(directory, STAMPS_DIR, name + ".json")


# The stamp's key for the file it describes: no stamp of a pile or of a file of rows_per_file uses it.
_WRITTEN = "written"
# What tells a file from one put in its place: a store's ETag or generation; locally its inode and
# change time, which copying tools cannot set (cp -p and rsync -t keep a size and modification time).
_IDENTITY = ("size", "ETag", "etag", "generation", "LastModified", "last_modified", "mtime", "ino", "created")


def file_identity(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """What ``fs`` says of ``path`` that changes when the file is written or replaced.

    >>> import fsspec, tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     file_identity(fsspec.filesystem("file"), f.name).startswith("size=0 ")
    True
    """
    fs.invalidate_cache(path)  # from the file itself (a HEAD), never from a listing, which words it otherwise
    try:
        info = fs.info(path, refresh=True)  # (another thread's listing may have filled the cache again)
    except TypeError:  # a file system whose info takes no refresh
        info = fs.info(path)
    identity = " ".join(f"{k}={info[k]}" for k in _IDENTITY if k in info)
    if is_local(fs):  # fsspec's "created" is the birth time on macOS and Windows, not the change time
        identity += f" ctime_ns={os.stat(path).st_ctime_ns}"
    return identity


def write_stamp(fs: fsspec.AbstractFileSystem, path: str, stamp: dict) -> None:
    """Record what the text file ``path``, just written, holds, with its identity (``file_identity``)."""
    write_bytes(fs, stamp_path(path), json.dumps({**stamp, _WRITTEN: file_identity(fs, path)}).encode())


def read_stamp(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    """The stamp ``write_stamp`` recorded, if ``path`` is still the file it was recorded for; else None."""
    try:
        with fs.open(stamp_path(path), "rb") as f:
            record = json.load(f)
        now = file_identity(fs, path)
    except (FileNotFoundError, ValueError):
        return None
    return record if record.pop(_WRITTEN, None) == now else None


def stamped_beside(path: str) -> bool:
    """Whether a part file's stamp is beside it (text) rather than in its footer (Parquet, Arrow).

    >>> stamped_beside("out/part-00003.txt.zst"), stamped_beside("out/part-00003.parquet")
    (True, False)
    """
    return not path.endswith((".parquet", ".arrow"))


def parquet_stored_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each type as a Parquet file written by Arrow gives it back (names and metadata kept).

    >>> parquet_stored_schema(pa.schema([("t", pa.timestamp("s")), ("d", pa.date64()), ("x", pa.int8())])).types
    [TimestampType(timestamp[ms]), DataType(date32[day]), DataType(int8)]
    """
    sink = pa.BufferOutputStream()
    try:  # (an empty file: what Arrow stores is a function of the types alone)
        pq.write_table(_kernels.empty_table(schema), sink)
        back = pq.read_schema(pa.BufferReader(sink.getvalue()))
    except (pa.ArrowException, ValueError, TypeError):  # a type Parquet cannot hold: the writer says so later
        return schema
    fields = [f if f.type.equals(b.type) else f.with_type(b.type) for f, b in zip(schema, back, strict=True)]
    return pa.schema(fields, metadata=schema.metadata)


def write(table: pa.Table, fs: fsspec.AbstractFileSystem, path: str, output: Output, data=None) -> int:
    """Write one pile that is not Parquet (``_passes.write_parquet`` writes those); its size in bytes.

    ``data``: the pile already serialized (``serialize``), for text formats.
    """
    with atomic_sink(fs, path) as sink:
        if output.format == "arrow":
            options = ipc.IpcWriteOptions(compression=output.compression)
            with ipc.new_file(sink, table.schema, options=options) as writer:
                writer.write_table(table, max_chunksize=rows_per_write(table))
            return sink.tell()
        for run in serialize(table, output) if data is None else data:
            if output.compression:  # a frame a run, in memory; zstd and gzip tools read frames end to end
                run = codec(output.compression).compress(run, asbytes=False)
            write_in_pieces(sink, run)
        return sink.tell()


# gzip's own default level: Arrow's is 9, which wrote a pile of 31 MiB of JSON lines in 5.4 s against 3.1 s at 6,
# for about the same size (1: 0.45 s, larger; zstd 0.19 s)
GZIP_LEVEL = 6


def codec(compression: str) -> pa.Codec:
    """The codec that compresses piles with ``compression``.

    >>> codec("gzip").compression_level, codec("zstd").name
    (6, 'zstd')
    """
    return pa.Codec(compression, compression_level=GZIP_LEVEL if compression == "gzip" else None)


# The bytes of text a run of a pile is serialized and parsed in: under the 2 GiB that Arrow's string
# arrays (32-bit offsets) and its readers' blocks hold, so a pile of any size is written and read back.
RUN_BYTES = 2**30
CSV_BLOCK_LIMIT = 2**31 - 1  # the bytes of the largest block Arrow's CSV reader takes


def serialize(table: pa.Table, output: Output) -> list[pa.Buffer]:
    """The bytes of a CSV, JSON-lines or lines file of ``table``, uncompressed, in runs of whole records."""
    if output.format in ("csv", "jsonl"):
        table = _decoded(table)
    if output.format == "csv":
        try:
            return _csv_runs(table.replace_schema_metadata(None))
        except pa.ArrowInvalid:  # Arrow's CSV writer takes binary values as text, and refuses those not UTF-8
            _refuse_not_utf8(table, output)
            raise
    if output.format == "jsonl" and not is_json_text(table.schema):
        return _lines_bytes(_json_objects(table), "(the objects)")
    return _lines_bytes(table.column(0), table.column_names[0])


def _decoded_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each dictionary column as its values' type and views as their large forms: what CSV and
    JSON lines hold of them (a dictionary column fingerprints as its values; Arrow's CSV writer takes no
    ``string_view``, which Polars writes to Arrow files, and decodes no dictionary of them)."""
    return pa.schema(
        [
            pa.field(f.name, view_free(f.type.value_type))
            if pa.types.is_dictionary(f.type)
            else f.with_type(view_free(f.type))
            for f in schema
        ],
        metadata=schema.metadata,
    )


def _decoded(table: pa.Table) -> pa.Table:
    decoded = _decoded_schema(table.schema)
    if decoded.equals(table.schema):
        return table
    return table.cast(without_views(table.schema)).cast(decoded)  # (a dictionary of views decodes as one of large)


def parse(data: list[pa.Buffer], output: Output, schema: pa.Schema) -> pa.Table:
    """What a reader gets from ``serialize``'s bytes: the rows in ``schema`` (dictionaries as their values)."""
    schema = _decoded_schema(schema)
    if output.format == "csv" and not len(schema):  # rows of no column (an empty file read): an empty file
        tables = []
    elif output.format == "csv":  # runs of whole records already, the first with the header
        tables = [_parse_csv(run, schema, header=i == 0) for i, run in enumerate(data)]
    else:
        tables = [_parse_run(part, output, schema) for run in data for part in _runs_of_lines(run)]
    return pa.concat_tables(tables) if tables else _kernels.empty_table(schema)


def read_back(data: list[pa.Buffer], table: pa.Table, output: Output) -> pa.Table:
    """What a reader gets from ``serialize(table, output)``'s bytes ``data``: ``parse``'s rows, or ``table``
    itself where the bytes are laid out as its values, one a line (``_lines_as_written``).

    >>> t = pa.table({"line": [b"a", b"", b"bc"]})
    >>> read_back(serialize(t, Output("lines")), t, Output("lines")) is t
    True
    """
    if _lines_as_written(data, table, output):
        return table
    try:
        return parse(data, output, table.schema)
    except pa.ArrowInvalid:
        _refuse_not_utf8(table, output)
        raise


def _refuse_not_utf8(table: pa.Table, output: Output, where: str | None = None) -> None:
    """Raise, naming the column and value (and ``where``: their file), if a string or binary column holds bytes
    that are not UTF-8."""
    found = _not_utf8(table)
    if found is None:
        return
    name, value = found
    binary = table.schema.field(name).type in _BINARY
    in_file = f", in {where}" if where else ""
    raise ValueError(
        f"column {name!r} holds bytes that are not UTF-8 ({value[:40]!r}){in_file}, which a reader of the "
        f"{output.format} text refuses: write parquet or arrow, which keep them"
        + (", or cast the column to binary" if output.format == "lines" and not binary else "")
    ) from None


_LINE_TYPES = (pa.binary(), pa.string())  # what ``Output.check`` lets out as lines
_BINARY = (pa.binary(), pa.large_binary())


def _lines_as_written(data: list[pa.Buffer], table: pa.Table, output: Output) -> bool:
    """Whether ``data`` is one run holding each value of ``table``'s single column followed by a newline,
    and a reader gets those values back.

    A reader splits such bytes into exactly those values: ``serialize``
    refused any value holding a newline, so the newlines are the ones at the
    ends.  Checked from the layout (its size and a byte a line, not a copy of
    every line as ``parse`` makes: for lines out, ``parse`` cost a third of
    pass 2's time).  Strings must also be valid UTF-8, which ``parse``
    checks and Arrow's Parquet reader does not.  Null values (written as
    empty lines), other types and files of many runs are parsed.
    """
    lines_out = output.format == "lines" or (output.format == "jsonl" and is_json_text(table.schema))
    if not lines_out or len(data) != 1 or table.num_columns != 1:
        return False
    column = table.column(0)
    if column.null_count or column.type not in _LINE_TYPES or not _valid_utf8(column):
        return False
    lengths = [np.diff(_kernels.value_offsets(chunk)) for chunk in column.chunks if len(chunk)]
    ends = np.cumsum(np.concatenate(lengths) + 1) - 1 if lengths else np.zeros(0, dtype=np.int64)  # each newline
    view = np.frombuffer(data[0], dtype=np.uint8)
    return len(view) == (int(ends[-1]) + 1 if len(ends) else 0) and bool(np.all(view[ends] == ord("\n")))


def _valid_utf8(column: pa.ChunkedArray) -> bool:
    """False for a string column holding bytes that are not UTF-8 (Arrow's Parquet reader lets them in)."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return True
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _not_utf8(table: pa.Table) -> tuple[str, bytes] | None:
    """The first string or binary column of ``table`` holding bytes that are not UTF-8, and the first such value.

    For an error message: one Python decode a value, until the first that fails.
    """
    for name, column in zip(table.column_names, table.columns, strict=True):
        t = column.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):  # (Arrow's CSV writer takes them as text)
            column = pa.chunked_array(
                [c.view(pa.large_string()) for c in column.cast(pa.large_binary()).chunks], pa.large_string()
            )
        if _valid_utf8(column):
            continue
        as_bytes = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
        for chunk in column.chunks:
            for value in chunk.cast(as_bytes).to_pylist():
                if value is not None and not _decodes(value):
                    return name, value
    return None


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _csv_runs(table: pa.Table) -> list[pa.Buffer]:
    """``table`` as CSV in runs of whole records of about ``RUN_BYTES`` (the header in the first), each
    under ``CSV_BLOCK_LIMIT``: a run is parsed back as one block, since a pile's text may hold quoted
    newlines that a cut by bytes could split.  Together the runs are the bytes of one ``write_csv``."""
    _refuse_what_csv_reads_back_otherwise(table)
    rows = _csv_rows_per_run(table)
    runs = []
    for start in range(0, max(table.num_rows, 1), rows):
        runs += _csv_run(table.slice(start, rows), header=start == 0)
    return runs


def _refuse_what_csv_reads_back_otherwise(table: pa.Table) -> None:
    """Values a CSV reader gets back as others, named before anything is written: they would fail verification."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            raise ValueError(f"column {name!r} holds NaN, which CSV readers read back as null: write another format")
    if table.num_columns == 1 and table.column(0).null_count:
        raise ValueError(
            f"column {table.column_names[0]!r} holds nulls, which a CSV of one column writes as empty lines, "
            "which readers skip: write another format"
        )


# Text of a row against its Arrow bytes: at most about 48 (a boolean, one bit, is "false,"); the text of
# a table under RUN_BYTES / 64 of Arrow bytes is one run without measuring it.
_TEXT_PER_ARROW_BYTE = 64
_SAMPLE_ROWS = 1000


def _csv_rows_per_run(table: pa.Table) -> int:
    """Rows of about ``RUN_BYTES`` of CSV text, from the text of the first rows (a pile is a uniform sample)."""
    if table.nbytes * _TEXT_PER_ARROW_BYTE < RUN_BYTES:
        return max(table.num_rows, 1)
    sample = pa.BufferOutputStream()
    pa_csv.write_csv(table.slice(0, _SAMPLE_ROWS), sample, pa_csv.WriteOptions(include_header=False))
    return max(1, int(RUN_BYTES * min(table.num_rows, _SAMPLE_ROWS) / max(sample.tell(), 1)))


def _csv_run(table: pa.Table, header: bool) -> list[pa.Buffer]:
    data = pa.BufferOutputStream()
    pa_csv.write_csv(table, data, pa_csv.WriteOptions(include_header=header))
    if data.tell() < CSV_BLOCK_LIMIT or table.num_rows <= 1:
        return [data.getvalue()]
    del data  # rows longer than the sample's: in halves
    half = table.num_rows // 2
    return _csv_run(table.slice(0, half), header) + _csv_run(table.slice(half), header=False)


def _parse_csv(data: pa.Buffer, schema: pa.Schema, header: bool) -> pa.Table:
    return pa_csv.read_csv(
        pa.BufferReader(data),
        read_options=pa_csv.ReadOptions(
            use_threads=False, block_size=data.size + 1, column_names=None if header else schema.names
        ),
        parse_options=pa_csv.ParseOptions(newlines_in_values=True),
        # Arrow writes a null string as an empty field and an empty one as "": read back as written
        convert_options=pa_csv.ConvertOptions(
            column_types=schema, null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=False
        ),
    )


def _runs_of_lines(data: pa.Buffer) -> list[pa.Buffer]:
    """``data`` cut after newlines into runs of at most ``RUN_BYTES`` (a longer line is a run of its own)."""
    return _runs_of_records(data, quoted=False)


def _parse_run(data: pa.Buffer, output: Output, schema: pa.Schema) -> pa.Table:
    if is_json_text(schema):  # written from lines checked as JSON: read back as the lines
        return pa.Table.from_arrays([lines_table(data).column(0)], schema=pa.schema([JSON_TEXT]))
    if output.format == "jsonl":
        if not data.size:
            return _kernels.empty_table(schema)
        # Arrow's JSON reader takes dates as day numbers, and neither times nor durations: read as written
        written = pa.schema([pa.field(f.name, _json_written_type(f.type)) for f in schema])
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=data.size + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=written, unexpected_field_behavior="error"),
        ).select(schema.names)
        return pa.Table.from_arrays(
            [_from_json_text(c, f.type) for c, f in zip(table.columns, schema, strict=True)], schema=schema
        )
    lines = lines_table(data).column(0)  # read in place: no copy of the pile
    return pa.table({schema[0].name: lines.cast(schema[0].type)})


def _json_written_type(kind: pa.DataType) -> pa.DataType:
    """What a column of ``kind`` is in the JSON lines written: dates and times text, durations their count."""
    if pa.types.is_date(kind) or pa.types.is_time(kind):
        return pa.string()
    return pa.int64() if pa.types.is_duration(kind) else kind


def _from_json_text(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """A column read as ``_json_written_type`` says, as ``kind`` again."""
    if pa.types.is_time(kind):  # HH:MM:SS and the unit's digits of a second: no cast from text in Arrow
        digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[kind.unit]

        def field(start: int, stop: int) -> pa.ChunkedArray:
            return pc.cast(pc.utf8_slice_codeunits(column, start, stop), pa.int64())

        seconds = pc.add(pc.multiply(pc.add(pc.multiply(field(0, 2), 60), field(3, 5)), 60), field(6, 8))
        count = pc.add(pc.multiply(seconds, 10**digits), field(9, 9 + digits)) if digits else seconds
        return pc.cast(pc.cast(count, pa.int32() if kind.bit_width == 32 else pa.int64()), kind)
    return pc.cast(column, kind) if column.type != kind else column


def _json_objects(table: pa.Table) -> pa.Array:
    """One JSON object per row, built by Arrow's casts and string kernels: numbers as Arrow prints them
    (shortest round-trip floats), text, times and dates as strings, nulls as null."""
    if not table.num_columns:
        return pa.array(["{}"] * table.num_rows, pa.string())
    pieces: list = []
    before = "{"  # what ends the previous value and starts this one's key
    for name in table.column_names:
        text, quote = _json_values(table.column(name), name)
        pieces += [_text(before + json.dumps(name) + ":" + quote), text]
        before = quote + ","
    pieces.append(_text(quote + "}"))
    return pc.binary_join_element_wise(*pieces, _text(""))


def _text(value: str) -> pa.Scalar:
    return _kernels.binary_scalar(value.encode(), pa.string())


_NEEDS_ESCAPE = '[\\x00-\\x1f"\\\\]'  # a control character, a quote or a backslash
_JSON_ESCAPES = [("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")]
_OTHER_CONTROLS = "[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f]"  # JSON writes these as \\u00XX


def _json_values(column: pa.ChunkedArray, name: str) -> tuple[pa.ChunkedArray, str]:
    """The JSON text of each value, and the quote the object around it puts on both sides ("" or '"').

    Text without nulls is quoted by the object's join (a join of its own would copy it once more);
    with nulls, here, since a null is ``null``, unquoted.
    """
    kind = column.type
    if pa.types.is_floating(kind) and pc.any(pc.invert(pc.is_finite(column))).as_py():
        raise ValueError(
            f"column {name!r} holds {_first_not_finite(column)}, which JSON cannot hold: write another format"
        )
    quote = ""
    if pa.types.is_duration(kind):  # its count of the unit: Arrow prints no other form of it
        column = pc.cast(column, pa.int64())
        kind = column.type
    if (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_decimal(kind)
    ):
        text = pc.cast(column, pa.string())
        # 3.0, not Arrow's 3: a reader would take a whole float for an integer.  Whole values are found
        # by value first (2 ns a row), text searched only if there are some (a regex: 74 ns a row)
        if pa.types.is_floating(kind) and pc.any(pc.equal(column, pc.trunc(column))).as_py():
            whole = pc.invert(pc.match_substring_regex(text, "[.eE]"))
            text = pc.if_else(whole, pc.binary_join_element_wise(text, _text(".0"), _text("")), text)
    else:
        try:
            text = pc.cast(column, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            _refuse_not_utf8(pa.table({name: column}), Output("jsonl"))  # binary that is not UTF-8: its value
            raise ValueError(f"column {name!r} ({kind}) cannot be written as JSON text: {e}") from None
        # Dates and times print without quotes, backslashes or control characters; other text is scanned
        # once, and escaped only if it needs it (most text does not: 5 passes of replace_substring saved)
        if not pa.types.is_temporal(kind) and pc.any(pc.match_substring_regex(text, _NEEDS_ESCAPE)).as_py():
            for plain, escaped in _JSON_ESCAPES:
                text = pc.replace_substring(text, plain, escaped)
            # Form feeds of PDF text, ANSI escapes, NULs: rare, so their 27 passes run only where one is
            if pc.any(pc.match_substring_regex(text, _OTHER_CONTROLS)).as_py():
                for code in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20)]:
                    text = pc.replace_substring(text, chr(code), f"\\u{code:04x}")
        quote = '"'
    if not column.null_count:
        return text, quote
    if quote:
        text = pc.binary_join_element_wise(_text(quote), text, _text(quote), _text(""))
    return pc.if_else(pc.is_null(column), _text("null"), text), ""


def _first_not_finite(column: pa.ChunkedArray) -> str:
    """NaN, inf or -inf: the first such value of a float column, as the error names it."""
    index = pc.index(pc.is_finite(column), False).as_py()
    value = column[index].as_py()
    return "NaN" if value != value else repr(value)


def _lines_bytes(column: pa.ChunkedArray | pa.Array, name: str) -> list[pa.Buffer]:
    """Every value followed by a newline, end to end, joined by Arrow (a null is an empty line).

    One buffer for each run of chunks of up to ``RUN_BYTES``: a column's
    chunks are each under 2 GiB, but not the pile they make together.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    runs, run, size = [], [], 0
    for chunk in chunks:
        if run and size + chunk.nbytes > RUN_BYTES:
            runs.append(run)
            run, size = [], 0
        run.append(chunk)
        size += chunk.nbytes
    return [_run_bytes(run, column.type, name) for run in [*runs, run] if run] or [pa.py_buffer(b"")]


def _run_bytes(chunks: list[pa.Array], kind: pa.DataType, name: str) -> pa.Buffer:
    values = chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, kind).combine_chunks()
    if values.nbytes > RUN_BYTES:  # a chunk of up to 2 GiB, and a newline a value, outgrow 32-bit offsets
        values = _kernels.as_wide(values)
    if values.null_count:
        values = values.fill_null(_kernels.binary_scalar(b"", values.type))
    _refuse_newline(values, name)
    if not len(values):
        return pa.py_buffer(b"")
    # One list of the values and an empty one, joined by newlines: 3x faster than appending a newline to
    # each value (binary_join_element_wise), which builds an array of n values on the way
    offsets = _kernels.value_offsets(values)
    ended = np.append(offsets, offsets[-1])  # one more value, empty, so that the last line ends too
    data = values.buffers()[2] or pa.py_buffer(b"")  # an array of empty values may have none
    lines = pa.Array.from_buffers(values.type, len(ended) - 1, [None, pa.py_buffer(ended), data])
    one_list = pa.Array.from_buffers(pa.int32(), 2, [None, pa.py_buffer(np.array([0, len(lines)], dtype=np.int32))])
    joined = pc.binary_join(pa.ListArray.from_arrays(one_list, lines), _kernels.binary_scalar(b"\n", values.type))
    return _kernels.value_bytes(joined)


def _refuse_newline(values: pa.Array, name: str, where: str | None = None) -> None:
    """Raise, naming the column and value (and ``where``: their file), if a value holds a newline, which a
    file of lines would make two lines."""
    if not _holds_newline(values):
        return
    value = values[pc.index(pc.match_substring(values.cast(pa.large_binary()), "\n"), True).as_py()].as_py()
    at = value.index("\n" if isinstance(value, str) else b"\n")
    shown = (
        ("..." if at > 20 else "") + repr(value[max(at - 20, 0) : at + 20]) + ("..." if len(value) > at + 20 else "")
    )
    in_file = f", in {where}" if where else ""
    raise ValueError(
        f"column {name!r} holds a value with a newline ({shown}){in_file}, which a file of lines would make two "
        "lines: write another format"
    )


def _holds_newline(values: pa.Array) -> bool:
    """Whether any of the (binary or string) values holds a ``\\n``: one scan of their bytes, 12x faster than
    ``match_substring``, which searches value by value."""
    return bool(len(values)) and first_newline(np.frombuffer(_kernels.value_bytes(values), dtype=np.uint8)) >= 0


def read(fs: fsspec.AbstractFileSystem, path: str, output: Output, schema: pa.Schema) -> pa.Table:
    """A pile file as the table that was written (its rows in ``schema``), for ``verify``."""
    try:
        return _read(fs, path, output, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, OverflowError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"cannot read {path!r} as {output.format}: {e}") from e


def _read(fs, path: str, output: Output, schema: pa.Schema) -> pa.Table:
    with open_decompressed(fs, path) as f:
        data = pa.py_buffer(f.read())
    if output.format == "arrow":
        return ipc.open_file(data).read_all()
    return parse(csv_record_runs(data) if output.format == "csv" else [data], output, schema)


def csv_record_runs(data: pa.Buffer) -> list[pa.Buffer]:
    """A CSV file as Arrow writes it, cut after records into runs of at most ``RUN_BYTES``, under
    ``CSV_BLOCK_LIMIT`` (the block Arrow's reader takes), unless one record is longer.

    Arrow's writer doubles a quote inside a value, so a newline ends a record exactly where the quotes
    before it are even in number.

    >>> [run.to_pybytes() for run in csv_record_runs(pa.py_buffer(b'a\\n"x\\ny"\\n'))]
    [b'a\\n"x\\ny"\\n']
    """
    return _runs_of_records(data, quoted=True)


def _runs_of_records(data: pa.Buffer, quoted: bool) -> list[pa.Buffer]:
    """``data`` cut after record ends (see ``_record_end``) into runs of at most ``RUN_BYTES``."""
    view = np.frombuffer(data, dtype=np.uint8)
    runs, start = [], 0
    while data.size - start > RUN_BYTES:
        end = _record_end(view, start, start + RUN_BYTES, quoted)
        runs.append(data.slice(start, end - start))
        start = end
    if start < data.size or not runs:
        runs.append(data.slice(start))
    return runs


def _record_end(view: np.ndarray, start: int, stop: int, quoted: bool) -> int:
    """Just past the last record-ending newline in ``view[start:stop]``, or if there is none the first
    one after (a record longer than the run), or the end; ``view[start]`` begins a record.  With
    ``quoted``, a newline inside quotes ends none."""
    inside, last = 0, None  # (inside quotes where the step before ended)
    for step_start in range(start, len(view), SCAN_BYTES):
        step = view[step_start : step_start + SCAN_BYTES]
        newlines = step == ord("\n")
        if quoted:
            parity = np.bitwise_xor.accumulate(step == ord('"'), dtype=np.uint8) ^ np.uint8(inside)
            newlines &= parity == 0
            inside = int(parity[-1])
        ends = np.flatnonzero(newlines) + (step_start + 1)
        before = ends[ends <= stop]
        if len(before):
            last = int(before[-1])
        if step_start + len(step) >= stop:  # the step that reaches stop, or one past it
            if last is not None:
                return last
            if len(ends):  # the first end after stop: a record longer than the run
                return int(ends[0])
    return len(view)
