"""The text formats: their names, file extensions and compressions, the read options (``TextOptions``), and a
file opened decompressed as its name says."""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import lzma
import posixpath
import re
from collections.abc import Callable

import pyarrow as pa
import pyarrow.csv as pa_csv

from daskpile._storage import FileVersion, full_url, open_read

FORMATS = ("parquet", "csv", "tsv", "jsonl", "lines", "arrow", "orc")


TEXT_FORMATS = ("csv", "tsv", "jsonl", "lines")


EXTENSIONS = {
    ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".txt": "lines",
    ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".orc": "orc",
}  # fmt: skip


COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz"}


UTF8_BOM = b"\xef\xbb\xbf"
# Byte order marks of encodings whose newline is not the byte 10, which every text format here cuts lines at;
# Excel's "Unicode Text" (a .txt of tab-separated values) starts with the first
WIDE_BOMS = {  # (UTF-32's little-endian mark begins as UTF-16's: looked for first)
    b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16",
}  # fmt: skip


def wide_encoding(head: bytes) -> str | None:
    """UTF-16 or UTF-32, where ``head`` (a file's first bytes) begins with its byte order mark and, if it holds a
    byte 10, holds that encoding's newline too: the byte 10 with its NULs, at a character's place.  A file of
    Latin-1 or other bytes that begins "ÿþ" is the bytes of UTF-16's mark, and lines ended by the byte 10 (a
    trial's, refused as UTF-16); in real UTF-16 a byte 10 may be half of another character (上 is 0A 4E).

    >>> wide_encoding("上海\\nb\\n".encode("utf-16")), wide_encoding(b"\\xff\\xfeabc\\nsecond\\n")
    ('UTF-16', None)
    >>> wide_encoding("上\\n".encode("utf-32")), wide_encoding(b"\\xfe\\xff" + "a\\n".encode("utf-16-be"))
    ('UTF-32', 'UTF-16')
    """
    found = next(((bom, name) for bom, name in WIDE_BOMS.items() if head.startswith(bom)), None)
    if found is None:
        return None
    bom, name = found
    body, width = head[len(bom) :], 4 if name == "UTF-32" else 2
    if b"\n" not in body:  # (nothing to bear it out or not: the mark is taken at its word)
        return name
    nulls = b"\x00" * (width - 1)
    newline = b"\n" + nulls if bom[0] == 0xFF else nulls + b"\n"  # little-endian, or big
    at = body.find(newline)
    while at >= 0 and at % width:
        at = body.find(newline, at + 1)
    return name if at >= 0 else None


def refuse_what_is_not_text(head: bytes, url: str, fmt: str, ending: Callable[[], bytes] | None = None) -> None:
    """Refuse a file read as text whose first bytes ``head`` say it is not (UTF-8) text: UTF-16 or UTF-32 by a
    byte order mark, or compressed, Parquet, Arrow, ORC or zip data by its signature.  Cut at the byte 10, a
    wide encoding's lines were each other's halves (an Excel "Unicode Text" file came out as one more row,
    verified), and a .txt holding gzip data, or a Parquet file given as lines, was shuffled as lines, verified.

    A signature is taken with the bytes its format puts after it, so that text beginning "PAR1" or "ORCA" is
    read; ORC's (three letters and then anything) is taken only if the file's last bytes, ``ending()``, are an
    ORC postscript's too.
    """
    encoding = wide_encoding(head)
    if encoding is not None:
        raise ValueError(
            f"cannot read {url!r} as {fmt}: it is {encoding} (its first bytes are a byte order mark), in which a "
            f"newline is not the byte 10: convert it to UTF-8 first (iconv -f {encoding} -t UTF-8)"
        )
    kind = next((kind for kind, signature in _SIGNATURES.items() if signature.match(head)), None)
    if kind is None and head.startswith(b"ORC") and ending is not None and ending()[-4:-1] == b"ORC":
        kind = "ORC"
    if kind is None:
        return
    name = posixpath.basename(url)
    extension = _extension_of(kind)
    compressed = compression_of(url)
    if extension is not None and compressed is not None:
        what = f"decompressed as its name says ({compressed}), it holds {kind} data: decompress that too first"
    elif extension is not None:
        what = f"rename it {name}{extension}, and it is read decompressed"
    elif kind == "zip":
        what = "unzip it first"
    elif kind == "Feather v1":
        what = "rewrite it as Arrow (pyarrow.feather.write_feather(pyarrow.feather.read_table(path), new_path))"
    elif compressed is not None:
        what = f"decompress it, and read that as {kind}"
    else:
        suffix, option = {"Parquet": (".parquet", "parquet"), "Arrow": (".arrow", "arrow"), "ORC": (".orc", "orc")}[
            kind
        ]
        if name.lower().endswith(suffix):  # (named so, and given another format)
            what = f"read it as {kind} (format={option!r}, --format {option}, or the format its name says)"
        else:
            what = f"rename it {posixpath.splitext(name)[0]}{suffix}, and it is read as {kind}"
    raise ValueError(f"cannot read {url!r} as {fmt}: it holds {kind} data, not text (it starts {head[:8]!r}): {what}")


def ending_of(fs, path: str) -> Callable[[], bytes]:
    """The last bytes of an uncompressed file, read when called (b"" for a compressed one, or unreadable)."""

    def ending() -> bytes:
        if compression_of(path) is not None:
            return b""
        try:
            return fs.cat_file(path, start=max(fs.size(path) - 4, 0))
        except (OSError, ValueError):
            return b""

    return ending


# The first bytes of each compression's data (a gzip member's, a zstd frame's, a bz2 stream's, an xz stream's)
MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00"}
_ZSTD_SKIPPABLE = re.compile(rb"[\x50-\x5f]\x2a\x4d\x18", re.S)  # a skippable frame's (pzstd writes one first)

# The first bytes of data that is not text, with what its format puts after them (a gzip member's method,
# deflate; bz2's first block, or its empty stream's end; Parquet's first page or footer, a thrift struct, begins
# 0x15; Arrow and Feather v1 pad to 8 bytes with zeros): text that begins as one does is read
_SIGNATURES = {
    "gzip": re.compile(re.escape(MAGIC["gzip"]) + rb"\x08"),
    "zstd": re.compile(re.escape(MAGIC["zstd"]) + rb"|" + _ZSTD_SKIPPABLE.pattern),
    "bz2": re.compile(re.escape(MAGIC["bz2"]) + rb"[1-9](1AY&SY|\x17rE8P\x90)"),
    "xz": re.compile(re.escape(MAGIC["xz"])),
    "Parquet": re.compile(rb"PAR1\x15"), "Arrow": re.compile(rb"ARROW1\x00\x00"),
    "Feather v1": re.compile(rb"FEA1\x00\x00\x00\x00"), "zip": re.compile(rb"PK\x03\x04"),
}  # fmt: skip


def _extension_of(compression: str) -> str | None:
    """The file extension that says ``compression`` (".gz" for gzip); None for what is not one."""
    return next((suffix for suffix, name in COMPRESSIONS.items() if name == compression), None)


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


# Read options that only CSV and TSV take, in the order a refusal names the first given
_CSV_ONLY = (
    "autogenerate_column_names", "newlines_in_values", "quote_char", "null_values", "escape_char", "decimal_point",
    "true_values", "false_values", "timestamp_parsers",
)  # fmt: skip


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
    as_text: bool | None = None  # csv/tsv: every value its text, a string (what a CSV written out keeps)
    # csv/tsv: the texts read as a null; pyarrow's default would read "NA", "null", "NaN", "N/A" and others as
    # nulls too, in text columns as well: a name "NA" or a word "null" lost, and verified as read
    null_values: tuple[str, ...] = ("",)
    # csv/tsv, under pyarrow's names: a character escaping the next in a value (false: none); the decimal point
    # of floats and decimals; the texts of true and of false (pyarrow's defaults where not given); the formats
    # of timestamps, strptime's ("%d/%m/%Y"), tried in turn (ISO 8601 where not given)
    escape_char: str | bool = False
    decimal_point: str = "."
    true_values: tuple[str, ...] = ()
    false_values: tuple[str, ...] = ()
    timestamp_parsers: tuple[str, ...] = ()

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
        for name in (
            "autogenerate_column_names", "newlines_in_values", "as_written", "as_text", "quote_char", "escape_char"
        ):  # fmt: skip
            if isinstance(options.get(name), str) and options[name].lower() in ("true", "false"):
                options[name] = options[name].lower() == "true"  # as a command line or a config file gives it
        if options.get("delimiter") in ("\\t", "tab"):  # a tab, as a shell makes it hard to type
            options["delimiter"] = "\t"
        for name in ("null_values", "true_values", "false_values", "timestamp_parsers"):
            if name not in options:
                continue
            texts = options[name]
            texts = texts.split(",") if isinstance(texts, str) else texts  # (a command line's "NA,null")
            if not isinstance(texts, (list, tuple)) or not all(isinstance(v, str) for v in texts):
                raise ValueError(f"read option {name} is a list of texts, got {options[name]!r}")
            options[name] = tuple(texts)
        types = options.pop("column_types", None) or {}
        if not isinstance(types, dict):
            raise ValueError(f"read option column_types maps column names to type names, got {types!r}")
        return cls(format, column_types=tuple(sorted((str(k), str(v)) for k, v in types.items())), **options)

    def __post_init__(self):
        for name in ("autogenerate_column_names", "newlines_in_values", "as_written", "as_text"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name in ("as_written", "as_text") and value is None):
                raise ValueError(f"read option {name} is true or false, got {value!r}")
        if self.format not in FORMATS[1:]:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.format not in TEXT_FORMATS and self.read_options():
            raise ValueError(f"read options apply to text formats (csv, tsv, jsonl, lines), not {self.format}")
        if self.delimiter is not None and self.format not in ("csv", "tsv"):
            raise ValueError(f"read option delimiter applies to csv and tsv, not {self.format}")
        if self.delimiter is not None and len(self.delimiter) != 1:
            raise ValueError(f"read option delimiter is one character, got {self.delimiter!r}")
        given = [name for name in _CSV_ONLY if name in self.read_options()]
        if self.format not in ("csv", "tsv") and given:
            raise ValueError(f"read option {given[0]} applies to csv and tsv, not {self.format}")
        for name in ("escape_char", "decimal_point"):
            value = getattr(self, name)
            if (value is not False or name == "decimal_point") and (not isinstance(value, str) or len(value) != 1):
                raise ValueError(f"read option {name} is one character{', or false' * (name == 'escape_char')}: "
                                 f"got {value!r}")  # fmt: skip
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
        if self.as_text and self.format not in ("csv", "tsv"):
            raise ValueError(
                "read option as_text reads every value of a CSV as its text (but those column_types declares): it "
                "applies to csv and tsv"
            )
        for name, type_name in self.column_types:
            arrow_type(type_name, name)

    @property
    def text_encoding(self) -> str:
        """The encoding Arrow's reader is given: ``utf8``, its own, for any name of UTF-8 (``utf-8-sig``, pandas'
        advice for Excel's "CSV UTF-8", too: Arrow drops a BOM as it reads UTF-8), else Python's codec, by the
        name given (kept as given: it is part of a run's identity)."""
        return "utf8" if is_utf8(self.encoding) else self.encoding

    def _check_encoding(self) -> None:
        """An encoding in which a newline is the byte 10 alone, as the cuts into ranges and blocks take it."""
        if self.format not in ("csv", "tsv"):
            raise ValueError("read option encoding applies to csv and tsv (JSON is UTF-8; lines keep their bytes)")
        if is_utf8(self.encoding):  # (utf-8-sig encodes a newline alone as a BOM and a newline)
            return
        try:
            newline = "\n".encode(self.encoding)
        except (LookupError, TypeError, UnicodeError):  # ("undefined": a codec that refuses everything)
            raise ValueError(f"read option encoding: {self.encoding!r} is not a codec name such as latin1") from None
        if newline != b"\n":
            raise ValueError(
                f"read option encoding {self.encoding!r} writes a newline as {newline!r}, not the byte 10 that "
                "files are cut at: convert the files to UTF-8 first (iconv -f ... -t utf-8)"
            )

    def csv_read(self, **options) -> pa_csv.ReadOptions:
        """Arrow's read options for these files: ``options``, and the encoding."""
        return pa_csv.ReadOptions(use_threads=False, encoding=self.text_encoding, **options)

    def csv_convert(self, column_types) -> pa_csv.ConvertOptions:
        """Arrow's conversion of the values: ``column_types``; an empty field of a string column is a null (and
        any of ``null_values``), and ``""`` an empty string, as daskpile writes them (and as pandas reads an
        empty field: a missing value)."""
        given = {
            "true_values": list(self.true_values), "false_values": list(self.false_values),
            "timestamp_parsers": list(self.timestamp_parsers),
        }  # fmt: skip
        return pa_csv.ConvertOptions(
            column_types=column_types, null_values=list(self.null_values), strings_can_be_null=True,
            quoted_strings_can_be_null=False, decimal_point=self.decimal_point,
            **{name: texts for name, texts in given.items() if texts},
        )  # fmt: skip

    @property
    def separator(self) -> str:
        return self.delimiter or ("\t" if self.format == "tsv" else ",")

    def csv_parse(self, newlines_in_values: bool | None = None) -> pa_csv.ParseOptions:
        """Arrow's parse options for these files (``newlines_in_values`` as given, unless said here)."""
        return pa_csv.ParseOptions(
            delimiter=self.separator,
            quote_char=self.quote_char,
            escape_char=self.escape_char,
            newlines_in_values=self.newlines_in_values if newlines_in_values is None else newlines_in_values,
        )

    def read_options(self) -> dict:
        """The options given, as ``of`` takes them.

        >>> TextOptions("csv", delimiter=";").read_options()
        {'delimiter': ';'}
        """
        given = {}
        for field in dataclasses.fields(self)[1:]:  # (not the format)
            value = getattr(self, field.name)
            # as_written and as_text recorded when true: false and not said read alike
            if value == field.default or (field.name in ("as_written", "as_text") and not value):
                continue
            given[field.name] = (
                dict(value) if field.name == "column_types" else list(value) if isinstance(value, tuple) else value
            )
        return given

    def key(self) -> str:
        """What changes the rows read, for a run's identity."""
        return repr(dataclasses.astuple(self))


_DECIMAL = re.compile(r"decimal(128|256)?\(\s*(\d+)\s*,\s*(\d+)\s*\)")


_TIMESTAMP = re.compile(r"timestamp\[\s*(s|ms|us|ns)\s*(?:,\s*tz\s*=\s*([^\]]+?)\s*)?\]")


_NESTED = re.compile(r"(large_list|list|struct|map)\s*<(.*)>", re.DOTALL)


def is_utf8(encoding) -> bool:
    """Whether ``encoding`` names UTF-8: ``utf-8-sig`` (pandas' advice for Excel's CSV UTF-8) too, whose BOM
    Arrow's reader drops as it reads UTF-8; its newline, encoded alone, is a BOM and a newline.

    >>> is_utf8("UTF-8-SIG"), is_utf8("utf_8"), is_utf8("latin1"), is_utf8("no such codec")
    (True, True, False, False)
    """
    try:
        return isinstance(encoding, str) and codecs.lookup(encoding).name in ("utf-8", "utf-8-sig")
    except LookupError:
        return False


def arrow_type(name: str, column: str = "") -> pa.DataType:
    """An Arrow type from its name as Arrow prints it (``int64``, ``string``, ``bool``, ``timestamp[ms]``,
    ``timestamp[ms, tz=UTC]``, ``decimal128(10, 2)``, ``list<string>``, ``struct<a: int64, b: list<double>>``,
    ``map<string, int64>``).

    >>> arrow_type("timestamp[us, tz=Europe/Paris]"), arrow_type("decimal128(10, 2)")
    (TimestampType(timestamp[us, tz=Europe/Paris]), Decimal128Type(decimal128(10, 2)))
    >>> arrow_type("struct<a: list<item: string>, b: map<string, int64>>")
    StructType(struct<a: list<item: string>, b: map<string, int64>>)
    """
    nested = _NESTED.fullmatch(name.strip())
    if nested:
        return _nested_type(nested[1], _top_level_parts(nested[2]), name, column)
    decimal, timestamp = _DECIMAL.fullmatch(name.strip()), _TIMESTAMP.fullmatch(name.strip())
    try:
        if decimal:
            make = pa.decimal256 if decimal[1] == "256" else pa.decimal128
            return make(int(decimal[2]), int(decimal[3]))
        if timestamp:
            return pa.timestamp(timestamp[1], tz=timestamp[2])
        return pa.type_for_alias(name.strip())
    except (ValueError, pa.ArrowInvalid) as e:
        raise ValueError(
            f"column {column!r}: {name!r} is not an Arrow type name such as int64, string, timestamp[ms, tz=UTC] or "
            f"decimal128(10, 2) ({error_line(e)})"
        ) from None


def _nested_type(kind: str, parts: list[str], name: str, column: str) -> pa.DataType:
    fields = [_named(part) for part in parts]
    if kind in ("list", "large_list") and len(parts) == 1:
        return (pa.list_ if kind == "list" else pa.large_list)(_field(*fields[0], column))
    if kind == "map" and len(parts) == 2:
        return pa.map_(arrow_type(parts[0], column), _field("value", fields[1][1], column))
    if kind == "struct" and all(field_name for field_name, _ in fields):
        return pa.struct([_field(field_name, type_name, column) for field_name, type_name in fields])
    raise ValueError(
        f"column {column!r}: {name!r} is not an Arrow type name: list<T> and large_list<T> take one type, map<K, V> "
        "two, struct<a: T, b: U> named fields"
    )


def _field(name: str | None, type_name: str, column: str) -> pa.Field:
    """A nested field of ``type_name``, not nullable where it ends in ``not null`` (as Arrow prints it).

    >>> arrow_type("struct<user id: int64 not null, tags: list<element: string not null>>")
    StructType(struct<user id: int64 not null, tags: list<element: string not null>>)
    """
    kind, not_null = re.subn(r"\s+not\s+null\s*$", "", type_name)
    return pa.field(name or "item", arrow_type(kind, column), nullable=not not_null)


def _named(part: str) -> tuple[str | None, str]:
    """(``a``, ``T``) of ``a: T`` (a field: a list's item, a struct's), (None, ``T``) of a type alone."""
    name, colon, kind = part.partition(":")
    if colon and re.fullmatch(r"[^<>\[\](),=]*\w[^<>\[\](),=]*", name):  # (a name may hold spaces, not brackets)
        return name.strip(), kind.strip()
    return None, part.strip()


def _top_level_parts(text: str) -> list[str]:
    """``text`` cut at its commas outside brackets: ``a: int64, b: map<string, int64>`` in two."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<[(":
            depth += 1
        elif ch in ">])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


# Parquet files are named *.parquet (Spark: *.snappy.parquet), *.parq, *.pq or *.pqt, or have no extension at
# all (Hive: 000000_0); any other extension is something else.
PARQUET_EXTENSIONS = (".parquet", ".parq", ".pq", ".pqt")


def detect(path: str) -> tuple[str | None, str | None]:
    """(format, compression) that a file's name says, None where it says nothing.

    >>> detect("corpus/part-1.jsonl.zst")
    ('jsonl', 'zstd')
    >>> detect("a.parquet"), detect("000000_0")
    (('parquet', None), (None, None))
    """
    stem, compression = uncompressed_name(path)
    extension = posixpath.splitext(stem)[1]
    if extension in PARQUET_EXTENSIONS:
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
def open_decompressed(fs, path: str, listed: FileVersion | None = None, **options):
    """A file to read (of the version ``listed``; ``options`` to ``fs.open``), decompressed as its name says: by
    Arrow's codecs, xz by Python's lzma."""
    compression = compression_of(path)
    try:
        with open_read(fs, path, listed, **options) as raw:
            # (the size the open file knows, if it does: no request more; an unknown one is not empty)
            if compression is not None and getattr(raw, "size", None) == 0:
                # (no codec's stream is empty: its header alone takes bytes; a failed upload leaves such a file)
                raise ValueError(f"cannot read {full_url(fs, path)!r}: it is empty, which no {compression} data is")
            if compression is None:
                yield raw
                return
            with lzma.LZMAFile(raw) if compression == "xz" else pa.CompressedInputStream(raw, compression) as stream:
                yield stream
    except (OSError, EOFError, lzma.LZMAError) as e:
        # What the codecs raise on the body's reads: Arrow's as OSError itself, lzma's as these two. The
        # subclasses of OSError are the storage's (a file gone, a connection reset or timed out): as they are.
        if compression is None or (isinstance(e, OSError) and type(e) is not OSError):
            raise
        url = full_url(fs, path)
        if (held := _held_instead_of(fs, path, compression)) is not None:
            raise ValueError(f"cannot read {url!r}: its name says {compression}, but {held}") from e
        said = error_line(e)
        raise ValueError(f"cannot read {url!r}: its {compression} data is damaged or cut short ({said})") from e


def _held_instead_of(fs, path: str, compression: str) -> str | None:
    """What a file whose codec failed holds, where it does not start as ``compression``'s data does (a plain
    file named .gz, zstd data named .gz): "damaged or cut short" sent its user looking for a broken download.
    None where it does, where it is cut inside that start, or where it cannot be read."""
    try:
        head = fs.cat_file(path, start=0, end=16)  # (not fs.open: an object store's read-ahead is MiBs)
    except (OSError, ValueError):
        return None
    if _starts_as(head, compression) or MAGIC[compression].startswith(head):
        return None
    other = next((name for name in MAGIC if _starts_as(head, name)), None)
    if other is not None:
        file_name = posixpath.basename(path)
        stem = file_name[: len(uncompressed_name(file_name)[0])]  # (its own case: Events.CSV.gz, not events.csv)
        extension = _extension_of(other)
        return f"it holds {other} data: rename it {stem}{extension}"
    return f"it is no {compression} data (it starts with {head!r}): is it compressed at all?"


def _starts_as(head: bytes, compression: str) -> bool:
    return head.startswith(MAGIC[compression]) or (compression == "zstd" and bool(_ZSTD_SKIPPABLE.match(head)))


def with_column_names(message: str, names: list[str] | None) -> str:
    """Arrow's message with the CSV columns it numbers from 0 ("In CSV column #1") said by their ``names``.

    >>> with_column_names("In CSV column #1: CSV conversion error", ["id", "code"])
    "column 'code': CSV conversion error"
    """
    if not names:
        return message
    return re.sub(
        r"In CSV column #(\d+)", lambda m: f"column {names[int(m[1])]!r}" if int(m[1]) < len(names) else m[0], message
    )


def error_line(e: Exception) -> str:
    """The first line of an error's message (Arrow's run to several), or its type's name if it has none."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
