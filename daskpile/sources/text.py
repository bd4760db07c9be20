"""Text sources: CSV and TSV, JSON lines, and plain lines, parsed by Arrow from blocks of whole lines.

A file is read in blocks that start and end on a line boundary, as Dask's
``read_bytes`` with a delimiter cuts them (``fsspec``'s ``read_block``): a line
belongs to the block in which it starts, so a line longer than a block still
lands whole in exactly one.  An uncompressed file larger than a task's share
is cut into byte ranges, one pass-1 task each; a compressed file cannot be
cut, and is read by one task, streaming, a block at a time.

Each format turns a block into an Arrow table in the plan's schema:

- ``lines``: one row per line, a single binary column ``line`` holding the
  line's bytes exactly, without its ``\\n`` (a ``\\r`` before it stays, as in
  GNU ``shuf``); empty lines are rows;
- ``csv``/``tsv``: pyarrow's CSV reader, the column names from the first
  file's header (or ``f0``, ``f1``, ... without one), the types inferred from
  its first MiB unless declared;
- ``jsonl``: pyarrow's JSON-lines reader, the schema inferred from the first
  file's first MiB unless declared.  A field that the schema does not have is
  an error, not dropped.  With ``as_written``, the rows are the lines
  themselves, each checked to be one JSON object (``json_lines_table``): what
  a shuffle from JSON lines to JSON lines keeps, byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import lzma
import posixpath
import re

import fsspec.utils
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from daskpile import _kernels
from daskpile._storage import full_url

FORMATS = ("parquet", "csv", "tsv", "jsonl", "lines", "arrow", "orc")
TEXT_FORMATS = ("csv", "tsv", "jsonl", "lines")
EXTENSIONS = {
    ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".txt": "lines",
    ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".orc": "orc",
}  # fmt: skip
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".xz": "xz"}
UTF8_BOM = b"\xef\xbb\xbf"
SAMPLE_BYTES = 2**20  # of the first file, for the column names and types
# A block of text is one Arrow array (32-bit offsets) that a task holds: beyond, a read of a whole file at
# once (MemoryError) or an integer Python cannot index with
MAX_BLOCKSIZE = 2**31 - 2**20
LINE = "line"  # the column of the lines format
# The column of JSON lines kept as written: marked, so that the JSON-lines writer writes its values as
# the lines they are rather than as objects of one binary field.
JSON_TEXT = pa.field("json", pa.binary(), metadata={"daskpile": "json lines as written"})


def is_json_text(schema: pa.Schema) -> bool:
    """Whether rows in ``schema`` are JSON lines as written (``json_lines_table``).

    >>> is_json_text(pa.schema([JSON_TEXT])), is_json_text(pa.schema([("json", pa.binary())]))
    (True, False)
    """
    return len(schema) == 1 and schema[0].equals(JSON_TEXT, check_metadata=True)


@dataclasses.dataclass(frozen=True)
class TextOptions:
    """How text files are read: their format and the options users set (pyarrow's names).

    >>> TextOptions("tsv").separator
    '\\t'
    """

    format: str
    delimiter: str | None = None  # csv/tsv: one character (default "," and tab)
    autogenerate_column_names: bool = False  # csv/tsv: no header line; columns f0, f1, ...
    column_types: tuple[tuple[str, str], ...] = ()  # declared types, by column name (Arrow type names)
    newlines_in_values: bool = False  # csv/tsv: quoted values may hold newlines (the file is not cut in ranges)
    quote_char: str | bool = '"'  # csv/tsv: what quotes a value; false: quotes are characters of the values
    encoding: str = "utf8"  # csv/tsv: of the text (Python's codec names), transcoded to UTF-8 by Arrow
    as_written: bool | None = None  # jsonl: each row the line as written (checked as JSON); None: not said

    @classmethod
    def of(cls, format: str, read_options: dict | None) -> TextOptions:
        """From ``read_options``, keyed by pyarrow's names.

        >>> TextOptions.of("csv", {"delimiter": ";", "column_types": {"id": "int64"}}).column_types
        (('id', 'int64'),)
        """
        options = dict(read_options or {})
        known = [f.name for f in dataclasses.fields(cls) if f.name != "format"]
        unknown = [k for k in options if k not in known]
        if unknown:
            raise ValueError(f"read option {unknown[0]!r} is not one of {', '.join(known)}")
        for name in ("autogenerate_column_names", "newlines_in_values", "as_written", "quote_char"):
            if isinstance(options.get(name), str) and options[name].lower() in ("true", "false"):
                options[name] = options[name].lower() == "true"  # as a command line or a config file gives it
        if options.get("delimiter") in ("\\t", "tab"):  # a tab, as a shell makes it hard to type
            options["delimiter"] = "\t"
        types = options.pop("column_types", None) or {}
        if not isinstance(types, dict):
            raise ValueError(f"read option column_types maps column names to type names, got {types!r}")
        return cls(format, column_types=tuple(sorted((str(k), str(v)) for k, v in types.items())), **options)

    def __post_init__(self):
        for name in ("autogenerate_column_names", "newlines_in_values", "as_written"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "as_written" and value is None):
                raise ValueError(f"read option {name} is true or false, got {value!r}")
        if self.format not in FORMATS[1:]:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.format not in TEXT_FORMATS and self.read_options():
            raise ValueError(f"read options apply to text formats (csv, tsv, jsonl, lines), not {self.format}")
        if self.delimiter is not None and self.format not in ("csv", "tsv"):
            raise ValueError(f"read option delimiter applies to csv and tsv, not {self.format}")
        if self.delimiter is not None and len(self.delimiter) != 1:
            raise ValueError(f"read option delimiter is one character, got {self.delimiter!r}")
        if self.format not in ("csv", "tsv") and (
            self.autogenerate_column_names or self.newlines_in_values or self.quote_char != '"'
        ):
            raise ValueError(
                "read options autogenerate_column_names, newlines_in_values and quote_char apply to csv and tsv"
            )
        if self.encoding != "utf8":
            self._check_encoding()
        if self.quote_char is not False and (not isinstance(self.quote_char, str) or len(self.quote_char) != 1):
            raise ValueError(f"read option quote_char is one character, or false for none: got {self.quote_char!r}")
        if self.format == "lines" and self.column_types:
            raise ValueError("read option column_types does not apply to lines: each line is one binary value")
        if self.as_written and (self.format != "jsonl" or self.column_types):
            raise ValueError(
                "read option as_written keeps JSON lines as written, unparsed: it applies to jsonl, "
                "without column_types"
            )
        for name, type_name in self.column_types:
            arrow_type(type_name, name)

    def _check_encoding(self) -> None:
        """An encoding in which a newline is the byte 10 alone, as the cuts into ranges and blocks take it."""
        if self.format not in ("csv", "tsv"):
            raise ValueError("read option encoding applies to csv and tsv (JSON is UTF-8; lines keep their bytes)")
        try:
            newline = "\n".encode(self.encoding)
        except (LookupError, TypeError):
            raise ValueError(f"read option encoding: {self.encoding!r} is not a codec name such as latin1") from None
        if newline != b"\n":
            raise ValueError(
                f"read option encoding {self.encoding!r} writes a newline as {newline!r}, not the byte 10 that "
                "files are cut at: convert the files to UTF-8 first (iconv -f ... -t utf-8)"
            )

    def csv_read(self, **options) -> pa_csv.ReadOptions:
        """Arrow's read options for these files: ``options``, and the encoding."""
        return pa_csv.ReadOptions(use_threads=False, encoding=self.encoding, **options)

    @property
    def separator(self) -> str:
        return self.delimiter or ("\t" if self.format == "tsv" else ",")

    def csv_parse(self, newlines_in_values: bool | None = None) -> pa_csv.ParseOptions:
        """Arrow's parse options for these files (``newlines_in_values`` as given, unless said here)."""
        return pa_csv.ParseOptions(
            delimiter=self.separator,
            quote_char=self.quote_char,
            newlines_in_values=self.newlines_in_values if newlines_in_values is None else newlines_in_values,
        )

    def read_options(self) -> dict:
        """The options given, as ``of`` takes them.

        >>> TextOptions("csv", delimiter=";").read_options()
        {'delimiter': ';'}
        """
        given = {
            "delimiter": self.delimiter,
            "autogenerate_column_names": self.autogenerate_column_names,
            "newlines_in_values": self.newlines_in_values,
            "as_written": self.as_written,  # recorded when true: false and not said both parse
        }
        given = {k: v for k, v in given.items() if v}
        if self.quote_char != '"':
            given["quote_char"] = self.quote_char
        if self.encoding != "utf8":
            given["encoding"] = self.encoding
        return {**given, "column_types": dict(self.column_types)} if self.column_types else given

    def key(self) -> str:
        """What changes the rows read, for a run's identity."""
        return repr(dataclasses.astuple(self))


_DECIMAL = re.compile(r"decimal(128|256)?\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_TIMESTAMP = re.compile(r"timestamp\[\s*(s|ms|us|ns)\s*(?:,\s*tz\s*=\s*([^\]]+?)\s*)?\]")


def arrow_type(name: str, column: str = "") -> pa.DataType:
    """An Arrow type from its name as Arrow prints it (``int64``, ``string``, ``bool``, ``timestamp[ms]``,
    ``timestamp[ms, tz=UTC]``, ``decimal128(10, 2)``).

    >>> arrow_type("timestamp[us, tz=Europe/Paris]"), arrow_type("decimal128(10, 2)")
    (TimestampType(timestamp[us, tz=Europe/Paris]), Decimal128Type(decimal128(10, 2)))
    """
    decimal, timestamp = _DECIMAL.fullmatch(name.strip()), _TIMESTAMP.fullmatch(name.strip())
    try:
        if decimal:
            make = pa.decimal256 if decimal[1] == "256" else pa.decimal128
            return make(int(decimal[2]), int(decimal[3]))
        if timestamp:
            return pa.timestamp(timestamp[1], tz=timestamp[2])
        return pa.type_for_alias(name)
    except (ValueError, pa.ArrowInvalid) as e:
        raise ValueError(
            f"column {column!r}: {name!r} is not an Arrow type name such as int64, string, timestamp[ms, tz=UTC] or "
            f"decimal128(10, 2) ({_first_line(e)})"
        ) from None


def detect(path: str) -> tuple[str | None, str | None]:
    """(format, compression) that a file's name says, None where it says nothing.

    >>> detect("corpus/part-1.jsonl.zst")
    ('jsonl', 'zstd')
    >>> detect("a.parquet"), detect("000000_0")
    (('parquet', None), (None, None))
    """
    stem, compression = uncompressed_name(path)
    extension = posixpath.splitext(stem)[1]
    if extension in (".parquet", ".parq", ".pq"):
        return "parquet", compression
    return EXTENSIONS.get(extension), compression


def uncompressed_name(path: str) -> tuple[str, str | None]:
    """A file's name, in lower case, without its compression's suffix; that compression.

    >>> uncompressed_name("logs/Server.LOG.gz")
    ('server.log', 'gzip')
    """
    stem = posixpath.basename(path).lower()
    for suffix, name in COMPRESSIONS.items():
        if stem.endswith(suffix):
            return stem.removesuffix(suffix), name
    return stem, None


def compression_of(path: str) -> str | None:
    return detect(path)[1]


def splittable(path: str, options: TextOptions | None = None) -> bool:
    """Whether a file can be cut into byte ranges: text, not compressed, and no newline inside a value."""
    if options is not None and (options.format not in TEXT_FORMATS or options.newlines_in_values):
        return False
    return compression_of(path) is None


@contextlib.contextmanager
def open_decompressed(fs, path: str):
    """A file to read, decompressed as its name says: by Arrow's codecs, xz by Python's lzma."""
    compression = compression_of(path)
    try:
        with fs.open(path, "rb", compression="xz" if compression == "xz" else None) as raw:
            if compression in (None, "xz"):
                yield raw
                return
            stream = pa.CompressedInputStream(raw, compression)
            try:
                yield stream
            finally:
                stream.close()
    except (OSError, EOFError, lzma.LZMAError) as e:
        # What the codecs raise on the body's reads: Arrow's as OSError itself, lzma's as these two. The
        # subclasses of OSError are the storage's (a file gone, a connection reset or timed out): as they are.
        if compression is None or (isinstance(e, OSError) and type(e) is not OSError):
            raise
        raise ValueError(
            f"cannot read {full_url(fs, path)!r}: its {compression} data is damaged or cut short ({_first_line(e)})"
        ) from e


def sample(fs, path: str, options: TextOptions | None = None) -> bytes:
    """The first ``SAMPLE_BYTES`` of a file (decompressed), cut after its last whole line; at least its first
    line (of data: a CSV header's next), up to ``SAMPLE_LIMIT`` (a first line cut short was read as a shorter
    line, or a CSV header alone).

    Not for CSV with newlines in values, whose records Arrow alone finds (``first_records``).
    """
    header = options is not None and options.format in ("csv", "tsv") and not options.autogenerate_column_names
    with open_decompressed(fs, path) as f:
        head = f.read(SAMPLE_BYTES)
        if len(head) < SAMPLE_BYTES:
            return head  # the whole file
        lines = head.count(b"\n")
        while lines < 1 + header and len(head) < SAMPLE_LIMIT:
            more = f.read(SAMPLE_BYTES)
            if not more:
                return head
            head, lines = head + more, lines + more.count(b"\n")
    cut = head.rfind(b"\n") + 1
    return head[:cut] if cut else head


SAMPLE_LIMIT = 64 * SAMPLE_BYTES


def first_records(fs, path: str, options: TextOptions, declared: dict) -> tuple[pa.Table, bytes]:
    """The records of a CSV with newlines in values that begin in its first ``SAMPLE_BYTES`` (more, up to
    ``SAMPLE_LIMIT``, for a first record that long), as Arrow's streaming reader finds them, and those bytes.

    A quote opens a value only at a value's start: ``5" floppy`` is a value, not the start of a quoted one,
    which counting quotes took it for (the records after it were then cut inside their values).
    """
    block = SAMPLE_BYTES
    while True:
        with open_decompressed(fs, path) as f:
            head = f.read(block)
        if not head:  # an empty file: no rows, and no columns (Arrow's readers call it an error)
            return pa.table({}), head
        try:
            # The file itself, not its first bytes alone: given those, Arrow took the record they cut short for
            # a whole one (a row short of fields refused, or its cut last value inferred as another type)
            with open_decompressed(fs, path) as f, _csv_errors(full_url(fs, path), options.format):
                reader = _stream_csv(f, options, declared, block)
                batch = next(iter(reader), None)
            break
        except ValueError as e:
            if "straddl" not in str(e) or block >= SAMPLE_LIMIT:  # a first record longer than the block
                raise
            block *= 4
    return pa.Table.from_batches([batch] if batch is not None else [], schema=reader.schema), head


def _stream_csv(f, options: TextOptions, types, block_size: int):
    return pa_csv.open_csv(
        f,
        read_options=options.csv_read(
            block_size=block_size, autogenerate_column_names=options.autogenerate_column_names
        ),
        parse_options=options.csv_parse(newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(column_types=types),
    )


class _Tail(io.RawIOBase):
    """A file read through, its last ``TAIL_BYTES`` kept."""

    def __init__(self, f):
        self.f, self.tail, self.first = f, b"", b""

    def peek(self) -> bytes:
        """Its first byte, still to be read."""
        self.first = self.first or self.f.read(1)
        return self.first

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data, self.first = self.first + self.f.read(len(buffer) - len(self.first)), b""
        buffer[: len(data)] = data
        if data:
            self.tail = (self.tail + data)[-TAIL_BYTES:]
        return len(data)


TAIL_BYTES = 2**16


@contextlib.contextmanager
def _csv_errors(url: str, format: str):
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ValueError(f"cannot read {url!r} as {format}: {_first_line(e)}") from None


def infer_schema(fs, path: str, options: TextOptions) -> tuple[pa.Schema, int]:
    """The schema of the rows of ``path``'s first MiB, with the declared types applied, and those rows' count."""
    if options.format == "lines":
        return pa.schema([pa.field(LINE, pa.binary())]), 1
    schema, rows = (
        _streamed_schema(fs, path, options) if options.newlines_in_values else _schema_of_sample(fs, path, options)
    )
    repeated = [name for i, name in enumerate(schema.names) if name in schema.names[:i]]
    if repeated:
        raise ValueError(
            f"the header of {full_url(fs, path)!r} names the column {repeated[0]!r} twice: rename one of them"
        )
    return schema, rows


def _schema_of_sample(fs, path: str, options: TextOptions) -> tuple[pa.Schema, int]:
    head = sample(fs, path, options)
    if options.format == "jsonl":
        check_json_lines(head, repr(full_url(fs, path)))
    if options.as_written:  # the lines are checked as they are read: a first line may be longer than the sample
        return pa.schema([JSON_TEXT]), int(bool(head.strip()))
    declared = {name: arrow_type(t, name) for name, t in options.column_types}
    url = full_url(fs, path)
    if not head:  # an empty file: no rows, and no columns (Arrow's readers call it an error)
        return pa.schema([]), 0
    if options.format == "jsonl":
        _check_utf8(np.frombuffer(head, dtype=np.uint8), 0, repr(url))
    with _column_names_in_utf8(repr(url), options.format):
        return _inferred_schema(head, options, declared, url)


def _streamed_schema(fs, path: str, options: TextOptions) -> tuple[pa.Schema, int]:
    declared = {name: arrow_type(t, name) for name, t in options.column_types}
    url = full_url(fs, path)
    with _column_names_in_utf8(repr(url), options.format):
        table, head = first_records(fs, path, options, declared)
    if not head:
        return pa.schema([]), 0
    unknown = [name for name in declared if name not in table.schema.names]
    if unknown:
        raise ValueError(f"column {unknown[0]!r} has a declared type but is not a column of {url!r}")
    # (in the first file's first MiB, where its text is at hand: the streamed reading does not see it)
    _refuse_rounded_integers(table, head, options, f"{url!r}, bytes 0 to {len(head):,}")
    _refuse_inferred_binary(table, head, options, url)
    return table.schema, table.num_rows


@contextlib.contextmanager
def _column_names_in_utf8(where: str, format: str):
    """A column name that is not UTF-8 named with its file: pyarrow decodes names as it hands them out."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise ValueError(f"cannot read {where} as {format}: a column name is not UTF-8 ({e.object!r})") from None


def _inferred_schema(head: bytes, options: TextOptions, declared: dict, url: str) -> tuple[pa.Schema, int]:
    def read(text: bytes) -> pa.Table:
        if options.format == "jsonl":
            explicit = pa.schema(list(declared.items())) if declared else None
            return pa_json.read_json(
                io.BytesIO(text),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(text), 1) + 1),
                parse_options=pa_json.ParseOptions(explicit_schema=explicit),
            )
        return pa_csv.read_csv(
            io.BytesIO(_newline_ended(text)),
            read_options=options.csv_read(autogenerate_column_names=options.autogenerate_column_names),
            parse_options=options.csv_parse(),
            convert_options=pa_csv.ConvertOptions(column_types=declared),
        )

    try:
        table = read(head)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        # Types are inferred from every row read, so a line may be refused for the lines before it: the first
        # prefix of the head that Arrow refuses names it
        names = None
        if options.format != "jsonl":
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
                names = read(head[: head.find(b"\n") + 1]).schema.names  # the header's (or f0, f1, ...)
        raise ValueError(_refused_line(head, 0, e, url, options.format, read, prefixes=True, names=names)) from None
    unknown = [name for name in declared if name not in table.schema.names]
    if unknown:
        raise ValueError(f"column {unknown[0]!r} has a declared type but is not a column of {url!r}")
    _refuse_rounded_integers(table, head, options, f"{url!r}, bytes 0 to {len(head):,}")
    _refuse_inferred_binary(table, head, options, url)
    schema = _in_file_order(table.schema, head) if options.format == "jsonl" and declared else table.schema
    return schema, table.num_rows


def _in_file_order(schema: pa.Schema, head: bytes) -> pa.Schema:
    """``schema`` with its fields in the order the file's keys first appear, as without declared types.

    Arrow puts the fields of an explicit schema first; a declared type must not move its column.

    >>> _in_file_order(pa.schema([("b", pa.string()), ("a", pa.int64())]), b'{"a": 1, "b": "x"}\\n').names
    ['a', 'b']
    """
    order: dict[str, None] = {}
    for line in head.splitlines():  # usually the first line names every column
        with contextlib.suppress(ValueError):  # a line Arrow read is valid JSON; a cut last one may not be
            record = json.loads(line.decode("utf-8", "replace")) if line.strip() else None
            if isinstance(record, dict):
                order.update(dict.fromkeys(k for k in record if k in schema.names))
        if len(order) == len(schema):
            break
    names = [*order, *(n for n in schema.names if n not in order)]
    return pa.schema([schema.field(n) for n in names], metadata=schema.metadata)


TWO_TO_THE_63 = 2.0**63


def _refuse_rounded_integers(table: pa.Table, text: bytes, options: TextOptions, where: str) -> None:
    """Refuse integers past int64 in a column whose type was inferred: Arrow reads them as float64, rounded.

    A uint64 hash (xxhash64, simhash) would come out changed, and verified,
    since the fingerprints are of what Arrow read.  Floats that large are
    left alone: the text is searched for an integer literal of 19 digits or
    more only where a float column holds a value past 2**63.
    """
    declared = {name for name, _ in options.column_types}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in declared or not pa.types.is_float64(column.type) or not len(column):
            continue
        low, high = pc.min_max(column).values()  # one pass: most float columns stop here
        if low.as_py() is None or -TWO_TO_THE_63 < low.as_py() <= high.as_py() < TWO_TO_THE_63:
            continue
        found = _LONG_INTEGER.search(text)
        if found is not None:
            others = (
                "others cannot be read as columns of JSON (Arrow takes no number as a string): keep the lines as "
                "written (--output-format jsonl)"
                if options.format == "jsonl"
                else "string for others"
            )
            raise ValueError(
                f"cannot read {where} as {options.format}: column {name!r} holds integers past int64 "
                f"({found.group().decode()}), "
                "which Arrow reads as floats, rounded: declare its type (read option column_types: uint64 for "
                f"integers from 0 to 2**64, e.g. --read-option column_types.{name}=uint64; double if they are "
                f"floats); {others}"
            )


def _refuse_inferred_binary(table: pa.Table, text: bytes, options: TextOptions, url: str) -> None:
    """Refuse a CSV column that Arrow typed binary because its first MiB is not UTF-8: a latin-1 file became
    bytes without a word, where the same bytes past the first MiB are refused."""
    declared = {name for name, _ in options.column_types}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if name in declared or not pa.types.is_binary(column.type):
            continue
        try:
            text.decode("utf-8")
            where = ""
        except UnicodeDecodeError as e:
            begin, end = text.rfind(b"\n", 0, e.start) + 1, text.find(b"\n", e.start)
            where = f" (the line at byte {begin:,}: {_shown(text[begin : end if end >= 0 else len(text)])})"
        raise ValueError(
            f"cannot read {url!r} as {options.format}: column {name!r} is not UTF-8 text{where}: if the file is in "
            f"another encoding, pass it (read option encoding, e.g. --read-option encoding=latin1); to keep the "
            f"bytes as they are, declare the column binary (--read-option column_types.{name}=binary)"
        )


_LONG_INTEGER = re.compile(rb"(?<![0-9.eE])-?[0-9]{19,}(?![0-9.eE])")


# A compressed file's size in memory is unknown before it is read: the sampled file's own ratio is measured
# on its first RATIO_PROBE_BYTES (decompressing at most RATIO_OUTPUT_BYTES of them), and a file not sampled,
# or too little decompressed to tell (a bzip2 block of 900 kB), taken as this many times its size on disk
# (gzip and zstd shrink text and JSON three to ten times; a repetitive corpus was 66 times).
COMPRESSED_RATIO = 5
RATIO_PROBE_BYTES = 2**20
RATIO_OUTPUT_BYTES = 16 * 2**20


def estimate(fs, path: str, sizes: list[int], compressed: list[bool], schema, options) -> tuple[int, int]:
    """(rows, bytes in memory) of text files, extrapolated from the first file's first MiB."""
    if options.newlines_in_values:
        table, head = first_records(fs, path, options, dict(zip(schema.names, schema.types, strict=True)))
        rows, nbytes, sampled = table.num_rows, table.nbytes, len(head)
    else:
        head = sample(fs, path, options)
        sampled = len(head)
        if options.as_written:  # (a line may be longer than the sample) a row is a line, its bytes as long
            rows, nbytes = head.count(b"\n") or int(bool(head.strip())), len(head)
        else:
            table = BlockReader(fs, path, schema, options, len(head) + 1).parse(head, 0) if head else None
            rows, nbytes = (table.num_rows, table.nbytes) if table is not None else (0, 0)
    if not rows:
        return 0, 0
    ratio = compressed_ratio(fs, path) if compression_of(path) else COMPRESSED_RATIO
    stored = sum(size * (ratio if c else 1) for size, c in zip(sizes, compressed, strict=True))
    return round(rows * stored / sampled), round(nbytes * stored / sampled)


def compressed_ratio(fs, path: str) -> float:
    """Bytes a compressed file holds per byte stored, from its first ``RATIO_PROBE_BYTES``;
    ``COMPRESSED_RATIO`` when they are too few to tell.

    The probe is decompressed 64 KiB at a time (Arrow's stream reads its
    input so; xz's decompressor is fed so), so what was used after each step
    is the bytes that gave its output, give or take 64 KiB: enough when it is
    a few times that, or when the output reaches ``RATIO_OUTPUT_BYTES`` first
    (a ratio of at least 64).
    """
    compression = compression_of(path)
    with fs.open(path, "rb") as raw:
        head = raw.read(RATIO_PROBE_BYTES)
    out, used = _xz_probe(head) if compression == "xz" else _arrow_probe(head, compression)
    if out >= RATIO_OUTPUT_BYTES or used >= 4 * 2**16 or (out and len(head) < RATIO_PROBE_BYTES):
        return out / max(used, 1)
    return COMPRESSED_RATIO


def _arrow_probe(head: bytes, compression: str) -> tuple[int, int]:
    """(bytes out, bytes used) of ``head`` decompressed by Arrow's codec, up to ``RATIO_OUTPUT_BYTES`` out."""
    probe = pa.BufferReader(head)
    stream = pa.CompressedInputStream(probe, compression)
    out = used = 0
    try:
        while out < RATIO_OUTPUT_BYTES and (chunk := stream.read(2**16)):
            out, used = out + len(chunk), probe.tell()
    except OSError:
        pass  # the probe ends inside a block: what came out before it counts
    return out, used


def _xz_probe(head: bytes) -> tuple[int, int]:
    """``_arrow_probe`` for xz, which Arrow has no codec for: Python's lzma, fed 64 KiB at a time."""
    decompressor = lzma.LZMADecompressor()
    out = used = 0
    for start in range(0, len(head), 2**16):
        try:
            out += len(decompressor.decompress(head[start : start + 2**16], max_length=RATIO_OUTPUT_BYTES - out))
        except lzma.LZMAError:
            break  # not xz after all: the read says so, naming the file
        used = min(start + 2**16, len(head))
        if out >= RATIO_OUTPUT_BYTES or decompressor.eof:
            break
    return out, used


def read_lines_range(fs, path: str, start: int, end: int) -> tuple[int, bytes]:
    """(offset, bytes) of the whole lines that start in ``[start, end)`` of a file, as ``fs.read_block`` with a
    newline delimiter cuts them; the offset is where the first of them starts, for errors to name bytes."""
    with fs.open(path, "rb") as f:
        f.seek(start)
        fsspec.utils.seek_delimiter(f, b"\n", 2**16)  # a range not at 0 begins after the first newline in it
        begin = f.tell()
        f.seek(end)  # (before begin when no line starts in the range: then none is read)
        fsspec.utils.seek_delimiter(f, b"\n", 2**16)
        stop = f.tell()
        f.seek(begin)
        return begin, f.read(max(stop - begin, 0))


class BlockReader:
    """Blocks of whole lines of one file as tables in ``schema``: a byte range, or the whole file streaming."""

    def __init__(self, fs, path: str, schema: pa.Schema, options: TextOptions, blocksize: int):
        self.fs, self.path, self.schema, self.options = fs, path, schema, options
        self.blocksize = blocksize
        self.url = full_url(fs, path)

    def blocks(self, byte_range: tuple[int, int] | None):
        """(offset, bytes) of whole lines: those starting in ``byte_range`` (uncompressed files), or all, streaming."""
        if byte_range is not None:
            yield read_lines_range(self.fs, self.path, *byte_range)
            return
        offset, tail = 0, b""
        with open_decompressed(self.fs, self.path) as f:
            while True:
                chunk = f.read(self.blocksize)
                data = tail + chunk
                if not chunk:
                    if data:
                        yield offset, data
                    return
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # no line ends in it yet: a line longer than the block
                    tail = data
                    continue
                yield offset, data[:cut]
                offset, tail = offset + cut, data[cut:]

    def streamed_records(self):
        """The tables of a CSV whose quoted values may hold newlines, a block at a time, as Arrow's streaming
        reader cuts them (see ``first_records``): a whole file, read by one task."""
        where = repr(self.url)
        with open_decompressed(self.fs, self.path) as f, _csv_errors(self.url, self.options.format):
            stream = _Tail(f)
            if not stream.peek():  # an empty file holds no rows (Arrow's reader calls it an error)
                return
            reader = _stream_csv(stream, self.options, self.schema, self.blocksize)
            if reader.schema.names != self.schema.names:
                raise ValueError(
                    f"the header of {where} names the columns {reader.schema.names}, not {self.schema.names}"
                )
            table = None
            for batch in reader:
                table = pa.Table.from_batches([batch])
                yield table
            if table is not None and table.num_rows:
                self._refuse_unclosed_quote(table.slice(table.num_rows - 1), stream.tail)

    def _refuse_unclosed_quote(self, last: pa.Table, tail: bytes) -> None:
        """Arrow reads a quote never closed as a value running to the end of the file (pandas: "EOF inside
        string"): a TSV of 200,000 lines with one literal opening quote became 11 rows, verified.  Such a value
        holds a newline and ends with the file's last bytes, which a closed one could only do before a quote."""
        if self.options.quote_char is False or tail.rstrip(b"\r\n").endswith(self.options.quote_char.encode()):
            return
        for name in last.column_names:
            value = last.column(name)[0].as_py()
            if isinstance(value, str):
                value = value.encode()
            if isinstance(value, bytes) and b"\n" in value and tail.endswith(value[-len(tail) :]):
                raise ValueError(
                    f"cannot read {self.url!r} as {self.options.format}: a quote opening a value of column {name!r} "
                    f"is never closed, and the value runs to the end of the file ({_shown(value)}): if quotes are "
                    "characters of the values, pass the read option quote_char=false"
                )

    def parse(self, block: bytes, start: int) -> pa.Table:
        """The rows of ``block``, which begins at byte ``start`` of the (decompressed) file."""
        if self.options.format == "lines":
            return lines_table(block)
        if self.options.as_written:
            if start == 0 and block.startswith(UTF8_BOM):  # what JSON readers skip: not part of the first line
                block, start = block[len(UTF8_BOM) :], len(UTF8_BOM)
            return json_lines_table(block, start, repr(self.url))
        if not block:  # a range in which no line starts
            return pa.Table.from_batches([], schema=self.schema)  # (schema.empty_table() imports pandas)
        where = f"{self.url!r}, bytes {start:,} to {start + len(block):,}"
        jsonl = self.options.format == "jsonl"
        if jsonl:  # JSON text is UTF-8, and Arrow's reader lets other bytes into its strings
            _check_utf8(np.frombuffer(block, dtype=np.uint8), start, repr(self.url))
        try:
            table = self._json(block) if jsonl else self._csv(block, first=start == 0, where=where)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(self._bad_line(block, start, e)) from None
        if jsonl:
            _refuse_objects_sharing_a_line(table, block, start, repr(self.url))
        else:  # (files with newlines in values are read by streamed_records, not in blocks of lines)
            _refuse_newlines_in_values(table, block, start, self.url, self.options.format)
        _refuse_rounded_integers(table, block, self.options, where)
        return table

    def _bad_line(self, block: bytes, start: int, error: Exception) -> str:
        format = self.options.format
        header = start == 0 and format != "jsonl" and not self.options.autogenerate_column_names

        def read(text: bytes) -> pa.Table:
            return self._json(text) if format == "jsonl" else self._csv(text, first=False, where="")

        named = self._unexpected_field if format == "jsonl" else None
        return _refused_line(
            block, start, error, self.url, format, read, skip=int(header), named=named, names=self.schema.names
        )

    def _unexpected_field(self, line: bytes) -> str | None:
        """Which field of ``line`` is not a column (or not a field of a struct column), for Arrow's "unexpected
        field"."""
        try:
            record = json.loads(line)
        except ValueError:
            return None
        new = _new_field(record, self.schema) if isinstance(record, dict) else None
        if new is None:
            return None
        if "." not in new:
            return (
                f"field {new!r} is not one of the columns found in the first file's first MiB "
                f"({', '.join(self.schema.names)}): declare its type to read it (read option column_types)"
            )
        return (
            f"field {new!r} is not one found in the first file's first MiB, and column_types declares top-level "
            "columns only: keep the lines as written (--output-format jsonl)"
        )

    def _json(self, block: bytes) -> pa.Table:
        return pa_json.read_json(
            io.BytesIO(block),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="error"),
        )

    def _csv(self, block: bytes, first: bool, where: str) -> pa.Table:
        names = self.schema.names
        block = _newline_ended(block)
        if first and not self.options.autogenerate_column_names:
            header = block[: block.find(b"\n") + 1 or len(block)]
            with _column_names_in_utf8(where, self.options.format):
                found = pa_csv.read_csv(
                    io.BytesIO(header),
                    read_options=self.options.csv_read(),
                    parse_options=self.options.csv_parse(newlines_in_values=False),
                ).schema.names
            if found != names:
                raise ValueError(f"the header of {where} names the columns {found}, not {names}")
        return pa_csv.read_csv(
            io.BytesIO(block),
            read_options=self.options.csv_read(
                column_names=names,
                skip_rows=1 if first and not self.options.autogenerate_column_names else 0,
                block_size=len(block) + 1,
            ),
            parse_options=self.options.csv_parse(),
            convert_options=pa_csv.ConvertOptions(column_types=self.schema),
        )


def _newline_ended(text: bytes) -> bytes:
    """CSV text with a newline after its last line: Arrow's reader refuses a header alone without one ("Empty CSV
    file or block"), as a file of a header and no rows is often written."""
    return text if not text or text.endswith(b"\n") else text + b"\n"


def _refuse_newlines_in_values(table: pa.Table, block: bytes, start: int, url: str, format: str) -> None:
    """A quoted value holding a newline, which a cut into ranges or blocks could have split: refused, naming the
    line where it starts (found by its text; the block, if a quote character other than ``"`` hides it)."""
    for name in table.column_names:
        column = table.column(name)
        textual = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        found = pc.match_substring(column, "\n") if textual else None
        if found is None or not pc.any(found).as_py():
            continue
        value = column[pc.index(found, True).as_py()].as_py().encode()
        # As written: opened by a quote, its quotes doubled; up to its first newline, which ends a line
        at = block.find(b'"' + value[: value.index(b"\n") + 1].replace(b'"', b'""'))
        line = start + block.rfind(b"\n", 0, at) + 1
        where = f"the line at byte {line:,}" if at >= 0 else f"bytes {start:,} to {start + len(block):,}"
        raise ValueError(
            f"cannot read {url!r} as {format}: {where}: column {name!r} holds a value with a newline inside quotes "
            f"({_shown(value)}): pass the read option newlines_in_values=true (--read-option "
            "newlines_in_values=true; the file is then read by one task), or, if its quotes are characters of the "
            'values (a TSV of 5" floppies), quote_char=false'
        )


def _refuse_objects_sharing_a_line(table: pa.Table, block: bytes, start: int, where: str) -> None:
    """Refuse a line of JSON lines that Arrow's reader read as several rows, or a row spread over lines.

    Arrow's reader takes objects apart by any whitespace: a line ``{"id": 2} {"id": 3}`` became two rows,
    which other JSON-lines readers refuse (pandas: "Trailing data"), or one row of the first object.  When
    every line starts with ``{`` and there are as many rows as lines, each line is one (``json_lines_table``
    says why); otherwise, a rare path, the lines are checked one by one to name the one to blame.
    """
    data, offsets = _ended_lines(block)
    if table.num_rows == len(offsets) - 1 and (data[offsets[:-1]] == ord("{")).all():
        return
    if start == 0 and block.startswith(UTF8_BOM):
        block, start = block[len(UTF8_BOM) :], len(UTF8_BOM)
    if json_lines_table(block, start, where).num_rows != table.num_rows:  # (refuses the line to blame)
        raise ValueError(
            f"cannot read {where}, bytes {start:,} to {start + len(block):,}, as jsonl: not one object a line"
        )


def lines_table(block) -> pa.Table:
    """One row per line of ``block``: its bytes without the ``\\n``; a last line without one is a line too.

    >>> lines_table(b"a\\n\\nbc\\r\\nd").column("line").to_pylist()
    [b'a', b'', b'bc\\r', b'd']
    """
    data, offsets = _ended_lines(block)
    return pa.table({LINE: _lines_without_newlines(data, offsets)})


def _ended_lines(block) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of ``block`` ending in a newline (one added if it had none), and where each line starts."""
    data = np.frombuffer(block, dtype=np.uint8)  # bytes or an Arrow buffer, not copied
    if len(data) + 1 >= 2**31:  # int32 offsets would wrap: refused, never corrupted
        raise ValueError("a block of lines over 2 GiB (one line that long, or --blocksize): use a smaller --blocksize")
    if len(data) and data[-1] != ord("\n"):
        ended = np.empty(len(data) + 1, dtype=np.uint8)  # only a file's last block can lack it: one copy
        ended[:-1] = data
        ended[-1] = ord("\n")
        data = ended
    return data, line_offsets(data)


def _lines_without_newlines(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    with_newlines = pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    # Arrow copies the lines without their newline in one pass: 2.3x faster than numpy's masked copy
    return pc.binary_slice(with_newlines, 0, -1)


def json_lines_table(block, start: int, where: str) -> pa.Table:
    """The lines of ``block`` (from byte ``start`` of the file ``where``) as written, each checked to hold
    one JSON object, as Arrow's JSON reader reads it; blank lines are dropped, as that reader drops them.

    A line that starts with ``{`` and ends with ``}`` (spaces apart) and a
    next one that does the same can only meet between two objects: inside an
    object or array a value is followed by ``,``, ``]`` or ``}``, never by
    ``{``, and a string cannot hold a raw newline.  So when every line does,
    and the reader counts as many objects as lines, each line is one object.

    >>> json_lines_table(b'{"b": 2, "a": 1}\\n\\n {"a": 10}\\r\\n', 0, "f").column("json").to_pylist()
    [b'{"b": 2, "a": 1}', b' {"a": 10}\\r']
    >>> json_lines_table(b'{"a":1}\\n{"a":1}{}\\n', 0, "f")
    Traceback (most recent call last):
    ...
    ValueError: cannot read f as jsonl: the line at byte 8 holds 2 JSON values, not one object (b'{"a":1}{}')
    """
    data, offsets = _ended_lines(block)
    _check_utf8(data, start, where)
    lines = _lines_without_newlines(data, offsets)
    starts = offsets[:-1]
    blank = _check_braces(data, offsets, lines, start, where)
    if blank is not None:
        kept = np.flatnonzero(~blank)
        lines, starts = lines.take(_kernels.as_arrow_indices(kept)), starts[kept]
    if len(lines):
        _check_one_object_a_line(block, lines, starts, start, where)
    return pa.Table.from_arrays([lines], schema=pa.schema([JSON_TEXT]))


_SPACES = " \t\r"


def _check_braces(data, offsets, lines: pa.Array, start: int, where: str) -> np.ndarray | None:
    """Refuse a line that does not start with ``{`` and end with ``}``, spaces apart; the blank lines (None if
    none).  The first and last bytes of every line are looked at together; only lines with spaces at an end
    or none at all (rare) are trimmed."""
    if not len(lines):
        return None
    first, last = offsets[:-1], offsets[1:] - 2  # (the last byte before the newline; -1 for an empty line)
    last = np.where(data[np.maximum(last, 0)] == ord("\r"), last - 1, last)
    plain = (last > first) & (data[first] == ord("{")) & (data[np.maximum(last, 0)] == ord("}"))
    if plain.all():
        return None
    odd = np.flatnonzero(~plain)
    trimmed = pc.utf8_trim(lines.take(_kernels.as_arrow_indices(odd)).view(pa.string()), _SPACES)
    # Read from the buffers: an Arrow array's to_numpy imports pandas on its first call, as pa.array does
    ends = _kernels.value_offsets(trimmed)
    text = np.frombuffer(trimmed.buffers()[2] or b"", dtype=np.uint8)
    empty = ends[1:] == ends[:-1]
    full = ~empty
    braced = np.zeros(len(odd), dtype=bool)
    braced[full] = (text[ends[:-1][full]] == ord("{")) & (text[ends[1:][full] - 1] == ord("}"))
    wrong = odd[full & ~braced]
    if len(wrong):
        line = bytes(data[offsets[wrong[0]] : offsets[wrong[0] + 1] - 1])
        raise ValueError(
            f"cannot read {where} as jsonl: the line at byte {start + int(offsets[wrong[0]]):,} is not one JSON "
            f"object ({_shown(line)})"
        )
    if not empty.any():
        return None
    blank = np.zeros(len(lines), dtype=bool)
    blank[odd[empty]] = True
    return blank


def _check_utf8(data: np.ndarray, start: int, where: str) -> None:
    whole = pa.Array.from_buffers(
        pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, len(data)], dtype=np.int64)), pa.py_buffer(data)]
    )
    try:
        whole.cast(pa.large_string())  # Arrow's check, 7x faster than Python's decode on text that is not ASCII
    except pa.ArrowInvalid:
        try:
            bytes(data).decode("utf-8")  # only to say where
        except UnicodeDecodeError as e:
            raise ValueError(f"cannot read {where} as jsonl: invalid UTF-8 at byte {start + e.start:,}") from None
        raise


def _check_one_object_a_line(block, lines: pa.Array, starts: np.ndarray, start: int, where: str) -> None:
    """Arrow's JSON reader parses the block (every value, none kept) and must count one object a line."""
    if _objects(block) == len(lines):
        return
    ends = np.append(starts[1:], len(block))  # (a line's bytes run to the next's start: blank lines between)

    def objects(low: int, high: int) -> int | str:  # what Arrow's reader finds in lines [low, high)
        return _objects(block[int(starts[low]) : int(ends[high - 1])])

    k = _first_wrong(0, len(lines), lambda low, high: objects(low, high) != high - low)
    found = objects(k, k + 1)
    at = f"cannot read {where} as jsonl: the line at byte {start + int(starts[k]):,}"
    if isinstance(found, str):
        raise ValueError(f"{at}: {found} ({_shown(lines[k].as_py())})")
    if found != 1:
        raise ValueError(f"{at} holds {found} JSON values, not one object ({_shown(lines[k].as_py())})")
    raise ValueError(f"cannot read {where}, bytes {start:,} to {start + len(block):,}, as jsonl: not one object a line")


def _objects(data) -> int | str:
    """How many JSON values Arrow's reader finds in ``data``, or its error."""
    try:
        return pa_json.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore"),
        ).num_rows
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        return re.sub(r" in row \d+", "", _first_line(e)).rstrip(" .")


def _first_wrong(low: int, high: int, wrong) -> int:
    """The first of lines ``[low, high)`` (``high > low``, and ``wrong(low, high)``) to blame, by halves:
    ``wrong(a, b)`` says whether lines ``[a, b)`` read together hold it.  A rare error's path, in which the
    reader's own word is had on every line."""
    while high - low > 1:
        middle = (low + high) // 2
        if wrong(low, middle):
            high = middle
        else:
            low = middle
    return low


def _refused_line(
    block: bytes,
    start: int,
    error: Exception,
    url: str,
    format: str,
    read,
    skip: int = 0,
    prefixes: bool = False,
    named=None,
    names: list[str] | None = None,
) -> str:
    """What is wrong with ``block`` (from byte ``start`` of ``url``), naming the first line ``read`` refuses by
    its byte in the file; Arrow's own message if no line is to blame.

    Arrow counts rows from a block's start, from 0 in JSON and from 1 with the header in CSV; a line's byte is
    what every format's errors name.  Found by halves (a rare error's path): each line on its own when rows are
    read in a declared schema, or the first refused prefix when types are inferred from every row before.
    ``skip`` lines (a header) are never blamed; ``named(line)`` may say more of the line found, and ``names``
    name the columns Arrow numbers.
    """
    data, offsets = _ended_lines(block)

    def refused(low: int, high: int) -> str | None:
        try:
            read(bytes(data[offsets[0 if prefixes else low] : offsets[high]]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            return _first_line(e)
        return None

    lines = len(offsets) - 1
    low = _first_wrong(skip, lines, lambda a, b: refused(a, b) is not None) if lines > skip else skip
    message = refused(low, low + 1) if lines > low else None
    if message is None:
        return f"cannot read {url!r}, bytes {start:,} to {start + len(block):,} as {format}: {_first_line(error)}"
    line = bytes(data[offsets[low] : offsets[low + 1] - 1])
    said = (named(line) if named else None) or (_not_json_lines(line) if format == "jsonl" else None)
    if "conversion error to null" in message:
        message += " (the column was empty in every row of the first file's first MiB, so typed null: declare its type)"
    hint = ""
    if "invalid UTF8 data" in message and format in ("csv", "tsv"):
        hint = (
            ": if the file is in another encoding, pass it (read option encoding, e.g. --read-option encoding=latin1)"
        )
    message = re.sub(r"(CSV parse error: )?Row #\d+: |^(JSON parse error: .*?)\.? in row \d+$", r"\2", message)
    if names:  # Arrow numbers CSV columns from 0
        message = re.sub(r"In CSV column #(\d+)", lambda m: f"column {names[int(m[1])]!r}", message)
    return (
        f"cannot read {url!r} as {format}: the line at byte {start + int(offsets[low]):,}: "
        + (
            said
            or (message if message.endswith(f": {line.decode('utf-8', 'replace')}") else f"{message} ({_shown(line)})")
        )
        + hint
    )


def _new_field(record: dict, fields, prefix: str = "") -> str | None:
    """The first key of ``record`` (nested: ``a.b``) that ``fields`` (a schema, or a struct type) lacks."""
    known = {f.name: f.type for f in fields}
    for key, value in record.items():
        if key not in known:
            return prefix + key
        if isinstance(value, dict) and pa.types.is_struct(known[key]):
            found = _new_field(value, known[key], f"{prefix}{key}.")
            if found:
                return found
    return None


def _not_json_lines(line: bytes) -> str | None:
    """What a line says of a file that is JSON but not JSON lines (a pretty-printed object, an array), or None.

    >>> _not_json_lines(b'{"a": 1}') is None, _not_json_lines(b"{")[:40]
    (True, "b'{' begins a JSON object written over s")
    """
    text = line.strip().decode("utf-8", "replace")
    if text.startswith("["):
        return (
            f"{_shown(line)} begins a JSON array, not JSON lines (one object a line): `jq -c '.[]' FILE` rewrites it so"
        )
    if text.startswith("{") and text.endswith(("{", "[", ",")):  # what a whole object, or a cut one, never ends in
        return (
            f"{_shown(line)} begins a JSON object written over several lines (pretty-printed), not JSON lines (one "
            "object a line): `jq -c . FILE` rewrites it so"
        )
    return None


def check_json_lines(head: bytes, where: str) -> None:
    """Refuse a file whose first line shows it is JSON, but not JSON lines: whatever a range of it would give.

    Arrow's reader takes a pretty-printed file read in one block, and fails on one cut in ranges: the first
    line decides, whatever the file's size.
    """
    head = head[len(UTF8_BOM) :] if head.startswith(UTF8_BOM) else head
    for line in head.split(b"\n")[:-1]:  # whole lines only: a first line longer than the sample is not judged
        if line.strip():
            hint = _not_json_lines(line)
            if hint:
                raise ValueError(f"cannot read {where} as jsonl: its first line {hint}")
            return


def _shown(line: bytes, limit: int = 40) -> str:
    return repr(line[:limit]) + ("..." if len(line) > limit else "")


# Bytes scanned per step: a step's mask stays in cache, where one mask of a whole block costs a fresh page
# every 4 KiB (measured 1.6x faster on a block of 128 MiB, and 3x for the search for a first newline).
SCAN_BYTES = 2**20


def line_offsets(data: np.ndarray) -> np.ndarray:
    """0 and the int32 offset just past each ``\\n`` of ``data`` (bytes under 2 GiB), in order.

    >>> line_offsets(np.frombuffer(b"a\\n\\nbc\\n", dtype=np.uint8)).tolist()
    [0, 2, 3, 6]
    """
    mask = np.empty(min(SCAN_BYTES, len(data)), dtype=bool)
    parts = [np.zeros(1, dtype=np.int32)]
    for start in range(0, len(data), SCAN_BYTES):
        step = data[start : start + SCAN_BYTES]
        np.equal(step, ord("\n"), out=mask[: len(step)])
        ends = np.flatnonzero(mask[: len(step)]).astype(np.int32)
        ends += start + 1
        parts.append(ends)
    return np.concatenate(parts)


def first_newline(data: np.ndarray) -> int:
    """Where the first ``\\n`` of ``data`` (bytes) is; -1 if it holds none.

    >>> first_newline(np.frombuffer(b"ab\\nc\\n", dtype=np.uint8)), first_newline(np.frombuffer(b"ab", dtype=np.uint8))
    (2, -1)
    """
    mask = np.empty(min(SCAN_BYTES, len(data)), dtype=bool)
    for start in range(0, len(data), SCAN_BYTES):
        step = data[start : start + SCAN_BYTES]
        np.equal(step, ord("\n"), out=mask[: len(step)])
        if mask[: len(step)].any():
            return start + int(mask[: len(step)].argmax())
    return -1


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
