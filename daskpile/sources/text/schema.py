"""A text source's schema: sampled from the first file's first MiB (or streamed, for CSV values with
newlines), inferred by Arrow's readers, and the inferences that would lose data refused."""

from __future__ import annotations

import codecs
import contextlib
import csv
import decimal
import io
import itertools
import json
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from daskpile._storage import full_url
from daskpile.sources.text.formats import (
    JSON_TEXT,
    LINE,
    SAMPLE_BYTES,
    TextOptions,
    arrow_type,
    ending_of,
    error_line,
    is_utf8,
    open_decompressed,
    refuse_what_is_not_text,
    with_column_names,
)
from daskpile.sources.text.lines import check_json_lines, check_utf8, newline_ended, refused_line, shown


def sample(fs, path: str, options: TextOptions | None = None) -> bytes:
    """The first ``SAMPLE_BYTES`` of a file (decompressed), cut after its last whole line; at least its first
    line (of data: a CSV header's next), up to ``SAMPLE_LIMIT`` (a first line cut short was read as a shorter
    line, or a CSV header alone).

    Not for CSV with newlines in values, whose records Arrow alone finds (``first_records``).
    """
    header = options is not None and options.format in ("csv", "tsv") and not options.autogenerate_column_names
    with open_decompressed(fs, path) as f:
        head = f.read(SAMPLE_BYTES)
        refuse_what_is_not_text(head, full_url(fs, path), options.format if options else "text", ending_of(fs, path))
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
        refuse_what_is_not_text(head, full_url(fs, path), options.format, ending_of(fs, path))
        if not head:  # an empty file: no rows, and no columns (Arrow's readers call it an error)
            return pa.table({}), head
        try:
            # The file itself, not its first bytes alone: given those, Arrow took the record they cut short for
            # a whole one (a row short of fields refused, or its cut last value inferred as another type)
            with open_decompressed(fs, path) as f, csv_errors(fs, path, options):
                reader = stream_csv(f, options, declared, block)
                batch = next(iter(reader), None)
            break
        except ValueError as e:
            if "straddl" not in str(e) or block >= SAMPLE_LIMIT:  # a first record longer than the block
                raise
            block *= 4
    return pa.Table.from_batches([batch] if batch is not None else [], schema=reader.schema), head


def stream_csv(f, options: TextOptions, types, block_size: int):
    return pa_csv.open_csv(
        NoBlockEndsInCR(f),
        read_options=options.csv_read(
            block_size=block_size, autogenerate_column_names=options.autogenerate_column_names
        ),
        parse_options=options.csv_parse(newlines_in_values=True),
        convert_options=options.csv_convert(types),
    )


class NoBlockEndsInCR(io.RawIOBase):
    """A file whose reads (the blocks of Arrow's streaming CSV reader) never end with a carriage return unless
    the file does: the reader drops the newline of a quoted ``\\r\\n`` that two blocks share
    (apache/arrow#51368), and the value comes out altered yet verified, the fingerprints being of the rows as
    parsed (a new user's 60,000 Windows-style multi-line values at 16 KiB blocks: 6 of them).

    >>> f = NoBlockEndsInCR(io.BytesIO(b"ab\\r\\r\\ncd\\r"))
    >>> [f.read(3) for _ in range(5)]
    [b'ab', b'\\r\\r\\n', b'cd', b'\\r', b'']
    """

    def __init__(self, f):
        self.f, self.held = f, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        size = len(buffer)
        data = self.held + self.f.read(max(size - len(self.held), 0))
        data, self.held = data[:size], data[size:]
        kept = len(data.rstrip(b"\r"))
        if kept:  # the carriage returns it ends with begin the next read
            data, self.held = data[:kept], data[kept:] + self.held
        elif not self.held:  # carriage returns alone: with the byte after them
            while data and len(data) < size:
                more = self.f.read(1)
                data += more
                if more != b"\r":
                    break
        buffer[: len(data)] = data
        return len(data)


class Tail(io.RawIOBase):
    """A file read through, its last ``TAIL_BYTES`` kept."""

    def __init__(self, f):
        self.f, self.tail, self.first = f, b"", b""
        self.handed_out = 0  # bytes

    def peek(self, size: int = 1) -> bytes:
        """Its first ``size`` bytes (fewer at its end), still to be read."""
        if len(self.first) < size and not self.handed_out:
            self.first += self.f.read(size - len(self.first))
        return self.first[:size]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        held, self.first = self.first[: len(buffer)], self.first[len(buffer) :]
        data = held + self.f.read(len(buffer) - len(held)) if len(held) < len(buffer) else held
        buffer[: len(data)] = data
        if data:
            self.tail = (self.tail + data)[-TAIL_BYTES:]
        self.handed_out += len(data)
        return len(data)


TAIL_BYTES = 2**16


@contextlib.contextmanager
def csv_errors(fs, path: str, options: TextOptions, names: list[str] | None = None):
    """Arrow's errors reading a whole CSV file as one error naming it, the line of the record blamed, and the
    column by its name (of ``names``), where Arrow gives its number."""
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        # Arrow's "Row #N" of a streamed CSV is its Nth record, a header counted: not a line when values hold newlines
        def said_where(match: re.Match) -> str:
            record = int(match[1])
            line = record_line(fs, path, options, record)
            on_line = f", on line {line:,}" if line is not None else ""
            return f"record {record:,} (counted from 1, a header included){on_line}: "

        said = re.sub(r"Row #(\d+): ", said_where, with_column_names(error_line(e), names))
        raise ValueError(f"cannot read {full_url(fs, path)!r} as {options.format}: {said}") from None
    except UnicodeError:  # (Python's codec, in Arrow's reader: a file of another encoding than said)
        with open_decompressed(fs, path) as f:
            chunks = iter(lambda: f.read(2**20), b"")
            said = not_in_encoding(chunks, 0, repr(full_url(fs, path)), options.format, options.text_encoding)
        raise ValueError(said) from None


def not_in_encoding(chunks, start: int, where: str, format: str, encoding: str) -> str:
    """What to say of text of ``format`` that ``encoding`` cannot decode: the line holding the first byte it refuses,
    by its byte in the file, as every other bad line is named.  ``chunks``: the text's bytes, from byte
    ``start``.  An error's path: Python's codec, which Arrow's reader used, decodes them again.

    >>> said = not_in_encoding([b"a\\n1,caf\\xc3\\xa9\\n2,\\xe4\\xb8\\xad\\n"], 0, "f.csv", "csv", "gbk")
    >>> print(said.split(": give")[0])
    cannot read f.csv as csv: the line at byte 10 is not gbk text (byte 14: '2,中')
    """
    decoder = codecs.getincrementaldecoder(encoding)()
    offset, line_start, line_head = start, start, b""  # where the current line starts, and its first bytes
    for chunk in itertools.chain(chunks, [None]):  # (None: the end, where a character cut short is refused)
        # Bytes of a character begun in the chunk before, counted before the decode: CJK codecs drop them as they
        # raise
        held = len(decoder.getstate()[0])
        try:
            decoder.decode(chunk or b"", final=chunk is None)
        except UnicodeDecodeError as e:
            at = offset - held + e.start  # the byte refused, in the file
            data = chunk or b""
            newline = data.rfind(b"\n", 0, max(at - offset, 0))
            if newline >= 0:
                line_start, line_head = offset + newline + 1, b""
            ends = data.find(b"\n", max(at - offset, 0))
            line = line_head + data[max(line_start - offset, 0) : ends if ends >= 0 else len(data)]
            advice = "or none for UTF-8" if encoding != "utf8" else "latin1, cp1252..."
            return (
                f"cannot read {where} as {format}: the line at byte {line_start:,} is not {encoding} text (byte "
                f"{at:,}: {shown(line)}): give the file's own encoding (read option encoding), {advice}"
            )
        except UnicodeError as e:  # (iso2022_jp's "pending buffer overflow": no byte said)
            return (
                f"cannot read {where} as {format}: it is not {encoding} text ({e}, in the bytes from {line_start:,}): "
                "give the file's own encoding (read option encoding)"
            )
        if chunk is None:
            break
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            line_start, line_head = offset + newline + 1, chunk[newline + 1 :][:SHOWN_BYTES]
        else:
            line_head = (line_head + chunk)[:SHOWN_BYTES]
        offset += len(chunk)
    return f"cannot read {where} as {format}: it is not {encoding} text"


# Of a line said in an error: its first bytes (``shown`` shows 40 characters of at most 4 bytes)
SHOWN_BYTES = 160


def record_line(fs, path: str, options: TextOptions, record: int) -> int | None:
    """The line on which record ``record`` of a CSV begins (counted from 1, a header included, empty lines
    not, as Arrow counts them); None if Python's reader cannot tell.

    An error's path: the file is read again up to that record, by Python's ``csv``, which takes a quote as
    Arrow does, opening a value only at its start.
    """
    quoting = {"quotechar": options.quote_char} if options.quote_char else {"quoting": csv.QUOTE_NONE}
    try:
        with open_decompressed(fs, path) as raw:
            text = io.TextIOWrapper(raw, encoding=options.encoding, errors="replace", newline="")
            reader = csv.reader(text, delimiter=options.separator, strict=False, **quoting)
            seen, before = 0, 0  # records, and the lines read before the current one
            for row in reader:
                if row:
                    seen += 1
                    if seen == record:
                        return before + 1
                before = reader.line_num
    except (csv.Error, OSError, ValueError):  # a field over csv's size limit, say: the record alone is said
        return None
    return None


def infer_schema(fs, path: str, options: TextOptions) -> tuple[pa.Schema, int]:
    """The schema of the rows of ``path``'s first MiB, with the declared types applied, and those rows' count."""
    if options.format == "lines":
        return pa.schema([pa.field(LINE, pa.binary())]), 1
    schema, rows = (
        _streamed_schema(fs, path, options) if options.newlines_in_values else _schema_of_sample(fs, path, options)
    )
    seen = set()  # (a name looked for in the names before it took minutes at 20,000 columns: a trial's export)
    repeated = [name for name in schema.names if name in seen or seen.add(name)]
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
    url = full_url(fs, path)
    if not head:  # an empty file: no rows, and no columns (Arrow's readers call it an error)
        return pa.schema([]), 0
    if options.format == "jsonl":
        check_utf8(np.frombuffer(head, dtype=np.uint8), 0, repr(url))
    with column_names_in_utf8(repr(url), options.format, options.text_encoding, lambda: head):
        return _inferred_schema(head, options, _declared(options, head), url)


def _streamed_schema(fs, path: str, options: TextOptions) -> tuple[pa.Schema, int]:
    declared = _declared(options, b"")
    url = full_url(fs, path)
    with column_names_in_utf8(repr(url), options.format, options.text_encoding, lambda: sample(fs, path, options)):
        table, head = first_records(fs, path, options, declared)
        if options.as_text and table.num_columns:
            # The header's names as Arrow's reader reads the records: a quoted name may hold a newline (Excel's
            # Alt+Enter), which a header taken as the first line cut in two
            declared = {**dict.fromkeys(table.schema.names, pa.string()), **declared}
            table, head = first_records(fs, path, options, declared)
        names = table.schema.names  # (Arrow decodes them as it hands them out: here, where they are named)
    if not head:
        return pa.schema([]), 0
    unknown = [name for name in declared if name not in names]
    if unknown:
        raise ValueError(f"column {unknown[0]!r} has a declared type but is not a column of {url!r}")
    # (in the first file's first MiB, where its text is at hand: the streamed reading does not see it)
    refuse_rounded_integers(table, head, options, url)
    _refuse_inferred_binary(table, head, options, url)
    return table.schema, table.num_rows


def _declared(options: TextOptions, head: bytes) -> dict[str, pa.DataType]:
    """The declared types: ``column_types``, and with ``as_text`` a string for every other column of the header."""
    declared = {name: arrow_type(t, name) for name, t in options.column_types}
    if not options.as_text:
        return declared
    first = head[: head.find(b"\n") + 1] if b"\n" in head else head
    if not first.strip():
        return declared
    names = pa_csv.read_csv(
        io.BytesIO(newline_ended(first)),
        read_options=options.csv_read(
            autogenerate_column_names=options.autogenerate_column_names, block_size=len(first) + 2
        ),
        parse_options=options.csv_parse(newlines_in_values=False),
    ).schema.names
    return {**dict.fromkeys(names, pa.string()), **declared}


@contextlib.contextmanager
def column_names_in_utf8(where: str, format: str, encoding: str = "utf8", head=None):
    """A column name that is not UTF-8 named with its file: pyarrow decodes names as it hands them out.  With
    another ``encoding``, Python's codec decodes the text as Arrow's reader reads it: a byte it refuses is said
    by its line in ``head()``, the file's first bytes read."""
    try:
        yield
    except UnicodeError as e:
        decoding = isinstance(e, UnicodeDecodeError)  # (else iso2022_jp's "pending buffer overflow", say)
        if head is not None and (not decoding or not is_utf8(e.encoding)):
            raise ValueError(not_in_encoding([head()], 0, where, format, encoding)) from None
        if not decoding:
            raise
        name = shown(e.object[max(e.start - 40, 0) : e.end + 40])
        raise ValueError(
            f"cannot read {where} as {format}: a column name is not UTF-8 ({name})"
            + ("; read option encoding names the file's encoding (latin1, cp1252...)" if encoding == "utf8" else "")
        ) from None


def _inferred_schema(head: bytes, options: TextOptions, declared: dict, url: str) -> tuple[pa.Schema, int]:
    def read(text: bytes) -> pa.Table:
        if options.format == "jsonl":
            return read_json(text, pa.schema(list(declared.items())) if declared else None)
        return pa_csv.read_csv(  # in one block: a first row past Arrow's 1 MiB blocks was refused as straddling
            io.BytesIO(newline_ended(text)),
            read_options=options.csv_read(
                autogenerate_column_names=options.autogenerate_column_names, block_size=max(len(text), 1) + 1
            ),
            parse_options=options.csv_parse(),
            convert_options=options.csv_convert(declared),
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
        raise ValueError(refused_line(head, 0, e, url, options.format, read, prefixes=True, names=names)) from None
    unknown = [name for name in declared if name not in table.schema.names]
    if unknown:
        raise ValueError(f"column {unknown[0]!r} has a declared type but is not a column of {url!r}")
    refuse_rounded_integers(table, head, options, url)
    _refuse_inferred_binary(table, head, options, url)
    schema = _in_file_order(table.schema, head) if options.format == "jsonl" and declared else table.schema
    if options.format == "jsonl":
        schema = _json_times(schema, head, declared)
    return schema, table.num_rows


# A time of day, then its offset from UTC: "2020-01-01" ends in "-01", which is no offset
_UTC_OFFSET = re.compile(r"[T ][0-9]{2}(:[0-9]{2}){0,2}([.,][0-9]+)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)$")
_DATE_ALONE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def _json_times(schema: pa.Schema, head: bytes, declared: dict) -> pa.Schema:
    """``schema`` with the timestamp columns Arrow inferred from JSON strings typed as their strings say, as
    Arrow's CSV reader types them: instants in UTC where each says its UTC offset (``2020-01-01T10:00:00+02:00``,
    ``...Z``: Arrow's JSON reader converts them to UTC and drops the zone, and they read as local times), dates
    where each is a date alone (``2020-01-01``: Arrow's JSON reader makes it a midnight).  Found by two users'
    trials.  Top-level columns, decided on the first file's first MiB, as every inferred type is.

    >>> bool(_UTC_OFFSET.search("2020-01-01T10:00:00+02:00")), bool(_UTC_OFFSET.search("2020-01-01"))
    (True, False)
    """
    naive = [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.tz is None and f.name not in declared]
    if not naive:
        return schema
    as_text = pa.schema([(name, pa.string()) for name in naive])
    try:
        table = read_json(head, as_text, unexpected_field_behavior="ignore")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return schema
    typed = {}
    for name in naive:
        column = table.column(name)
        if column.null_count == len(column):
            continue
        for pattern, kind in (
            (_UTC_OFFSET, pa.timestamp(schema.field(name).type.unit, "UTC")),
            (_DATE_ALONE, pa.date32()),
        ):
            if pc.all(pc.match_substring_regex(column, pattern.pattern)).as_py():  # (null where the value is)
                typed[name] = kind
    fields = [f.with_type(typed[f.name]) if f.name in typed else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def read_json(text: bytes, schema: pa.Schema | None, window: str | None = None, **parse) -> pa.Table:
    """Arrow's JSON reader on ``text``, its columns typed as ``schema`` types them (those it names; the others
    inferred, unless ``parse`` says otherwise).

    Arrow's reader converts no string to a date (``changed from number to string``: a declared date32 refused
    every line), takes a time without its UTC offset as UTC in a column with a zone (where Arrow's cast and CSV
    reader refuse it: a window trial's local times stored as UTC), and makes no dictionary: such columns are
    read as strings (or the dictionary's values) and cast, a value the cast refuses raised as ``pa.ArrowInvalid``
    naming its column, for the caller to name the line.  A date32 column written as day numbers, which Arrow
    reads, is read so (a column of both is refused).  ``window``: the window whose types ``schema`` are, which
    no declaration changes.
    Top-level columns: a date or zoned time nested in a struct or list is Arrow's to read.

    >>> read_json(b'{"d": "2020-01-02", "n": 1}', pa.schema([("d", pa.date32())])).schema.types
    [DataType(date32[day]), DataType(int64)]
    """

    def read(explicit: pa.Schema | None) -> pa.Table:
        return pa_json.read_json(
            io.BytesIO(text),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(text), 1) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=explicit, **parse),
        )

    if schema is None:
        return read(None)
    readable = pa.schema([f.with_type(_json_read_type(f.type)) for f in schema], metadata=schema.metadata)
    try:
        if readable.equals(schema):
            return read(schema)
        try:
            table = read(readable)
        except pa.ArrowInvalid as e:
            table = _read_day_numbers(read, readable, schema, e)
    except pa.ArrowInvalid as e:
        raise _no_string_of_numbers(e, readable, window) from None
    return _as_typed(table, schema, window)


def _no_string_of_numbers(error: pa.ArrowInvalid, readable: pa.Schema, window: str | None) -> pa.ArrowInvalid:
    """Arrow's "changed from string to number" of a column read as a string, with what to do: a trial's
    ``column_types.v=string`` over a field that is a number in some lines gave no way forward.

    >>> try:
    ...     read_json(b'{"v": 1}', pa.schema([("v", pa.string())]))
    ... except pa.ArrowInvalid as e:
    ...     print("column 'v' is read as a string" in str(e))
    True
    """
    found = _COLUMN_IN_ERROR.search(str(error))
    name = found.group(1) if found else None
    if found is None or found.group(2) != "string" or name not in readable.names:
        return error
    if readable.field(name).type not in (pa.string(), pa.large_string()):
        return error
    why = "the window's column" if window is not None else "declared in column_types, or as the first lines hold it"
    return pa.ArrowInvalid(
        f"{error}: column {name!r} is read as a string ({why}), and Arrow's JSON reader reads no "
        f"{found.group(3)} as one: write it as a string in every line, or keep the lines as written (JSON lines "
        "out; or, without column_types, the read option as_written=true)"
    )


_COLUMN_IN_ERROR = re.compile(r"Column\(/(.*)\) changed from (\w+) to (\w+)")
FIRST_DAY, LAST_DAY = -719_162, 2_932_896  # 0001-01-01 and 9999-12-31, in days since 1970-01-01


def _read_day_numbers(read, readable: pa.Schema, schema: pa.Schema, error: pa.ArrowInvalid) -> pa.Table:
    """The block read again with the date32 columns Arrow found numbers in typed date32 (days since 1970, as a
    date column was written before dates were read from strings); refused where a column holds both strings
    and numbers, or a number that is no day; Arrow's error where it is of another column (whose name it says).

    >>> read_json(b'{"d": 18000}', pa.schema([("d", pa.date32())])).column("d").to_pylist()
    [datetime.date(2019, 4, 14)]
    """
    retyped, first_said, e = readable, {}, error  # first_said: a date32 column retyped -> the error that named it
    while True:
        found = _COLUMN_IN_ERROR.search(str(e))
        name = found.group(1) if found else None
        if name in first_said:
            raise pa.ArrowInvalid(
                f"column {name!r} is of type date32, and holds both dates as strings and day numbers: write one or "
                f"the other ({first_said[name]})"
            )
        if found is None and first_said:  # (a fraction, or a number past int32: epoch milliseconds)
            days = ", ".join(map(repr, first_said))
            raise pa.ArrowInvalid(f"{e} (date32 column {days} holds numbers, read as days since 1970-01-01)")
        day_numbers = found is not None and found.groups()[1:] == ("string", "number") and name in schema.names
        if not day_numbers or schema.field(name).type != pa.date32():
            raise e  # (another column's, named by Arrow, or no column's)
        first_said[name] = e
        retyped = retyped.set(retyped.get_field_index(name), retyped.field(name).with_type(pa.date32()))
        try:
            table = read(retyped)
        except pa.ArrowInvalid as again:
            e = again
            continue
        for column in first_said:  # (Arrow takes any integer: epoch seconds made dates past the year 9999)
            ends = pc.min_max(table.column(column).cast(pa.int32())).values()
            wrong = next((v.as_py() for v in ends if v.is_valid and not FIRST_DAY <= v.as_py() <= LAST_DAY), None)
            if wrong is not None:
                raise pa.ArrowInvalid(
                    f"column {column!r} is of type date32, and {wrong:,} is no day number (days since 1970-01-01, "
                    f"from {FIRST_DAY:,} to {LAST_DAY:,}): write dates as YYYY-MM-DD strings"
                )
        return table


def _json_read_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(kind):
        return _json_read_type(kind.value_type)
    zoned = pa.types.is_timestamp(kind) and kind.tz is not None
    return pa.string() if pa.types.is_date(kind) or zoned else kind


def _as_typed(table: pa.Table, schema: pa.Schema, window: str | None) -> pa.Table:
    """``table`` with the columns ``schema`` names cast to its types (see ``read_json``)."""
    wanted = dict(zip(schema.names, schema.types, strict=True))
    for i, field in enumerate(table.schema):
        target = wanted.get(field.name, field.type)
        if target == field.type:
            continue
        values = target.value_type if pa.types.is_dictionary(target) else target
        column = table.column(i)
        if values != column.type:
            try:
                column = column.cast(values)
            except pa.ArrowInvalid as e:
                raise pa.ArrowInvalid(_refused_cast(field.name, values, e, window)) from None
        if values is not target:
            column = pc.dictionary_encode(column).cast(target)
        table = table.set_column(i, field.with_type(target), column)
    return table


def _refused_cast(name: str, kind: pa.DataType, error: Exception, window: str | None) -> str:
    said = str(error).split(". If these timestamps")[0]  # (Arrow's advice is for its own casts)
    said = f"{said[0].lower()}{said[1:]}"
    if window is not None:
        return (
            f"column {name!r} is of type {kind} in the window {window}, and {said}: a window's columns are those "
            "of its first data (write the day's values as that type)"
        )
    other = f"timestamp[{kind.unit}]" if pa.types.is_timestamp(kind) else "timestamp[s]"
    return (
        f"column {name!r} is of type {kind} (declared, or inferred from the first file's first MiB), and {said}: "
        f"declare another type (read option column_types, e.g. --read-option column_types.{name}={other}, or string)"
    )


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


TWO_TO_THE_53 = 2.0**53  # the integers a float64 holds exactly, in magnitude


def refuse_rounded_integers(table: pa.Table, text: bytes, options: TextOptions, url: str, start: int = 0) -> None:
    """Refuse integers a float64 rounds in a column whose type was inferred as float64: past int64 (Arrow reads
    every value as a float), and past 2**53 in a column that also holds a fraction (``1.0``).

    A uint64 hash (xxhash64, simhash) or a 19-digit id would come out changed,
    and verified, since the fingerprints are of what Arrow read.  Floats that
    large are left alone: only where a float column holds a value past 2**53
    is the text searched for integer literals that a float rounds, and one is
    blamed on the column only if the column holds it as read (a 19-digit id
    of another column, or digits in a string, blamed a column of masses in
    kilograms).  The line named is the first holding the literal; ``text`` begins at byte ``start`` of the file.
    """
    declared = {name for name, _ in options.column_types}
    literals = None  # the text's integer literals past int64 and where each is, found once, by the float each is
    leaves = [
        (top, *leaf)
        for top, values in zip(table.column_names, table.columns, strict=True)
        if top not in declared
        for leaf in _leaves(top, values)
    ]
    for top, name, column in leaves:
        if not pa.types.is_float64(column.type) or not len(column):
            continue
        low, high = pc.min_max(column).values()  # one pass: most float columns stop here
        if low.as_py() is None or -TWO_TO_THE_53 < low.as_py() <= high.as_py() < TWO_TO_THE_53:
            continue
        if literals is None:
            literals = {}
            for match in _LONG_INTEGER.finditer(text):
                if len(match.group().lstrip(b"-")) > 308:  # (past any float: Arrow reads it as inf)
                    continue
                if options.format == "jsonl" and text[match.start() - 1 : match.start()] == b'"':
                    continue  # (a string of digits: not the number a float column holds, nor its line)
                # rounded, and not a float written in full (JavaScript and Go write 2.111386214488209e17 as
                # 211138621448820900: its shortest digits, then zeros)
                if float(value := int(match.group())) != value and decimal.Decimal(repr(float(value))) != value:
                    literals.setdefault(float(value), (match.group(), match.start()))
        past = pc.greater_equal(pc.abs(column), pa.scalar(TWO_TO_THE_53))
        found, at = next((literals[v] for v in column.filter(past).to_pylist() if v in literals), (None, 0))
        if found is not None:
            value = int(found)
            wide = not -(2**63) <= value < 2**63
            line = start + text.rfind(b"\n", 0, at) + 1
            others = (
                "others cannot be read as columns of JSON (Arrow takes no number as a string): keep the lines as "
                "written (--output-format jsonl)"
                if options.format == "jsonl"
                else "string for others"
            )
            kind = "int64" if not wide else "uint64" if 0 <= value < 2**64 else "string"
            example = (
                f"--read-option column_types.{name}={kind}"
                if top == name
                else f"--read-option 'column_types.{top}=<its type, with {kind} for {name}>'"
            )
            if kind == "string" and options.format == "jsonl":  # (Arrow's JSON reader takes no number as a string)
                advice = f"no integer type of Arrow holds {found.decode()}: {others}"
            else:
                types = (
                    f"string: no integer type of Arrow holds {found.decode()}, e.g. {example}"
                    if kind == "string"
                    else f"int64, or uint64 for integers from 0 to 2**64, e.g. {example}; double if they are floats"
                )
                advice = f"declare its type (read option column_types: {types}); {others}"
            raise ValueError(
                f"cannot read {url!r} as {options.format}: the line at byte {line:,}: column {name!r} holds integers "
                f"past {'int64' if wide else '2**53'} ({found.decode()}), which Arrow reads as floats, rounded: "
                f"{advice}"
            )


def _leaves(name: str, column) -> Iterator[tuple[str, pa.ChunkedArray]]:
    """A column and, for a nested one, the values of each field inside it, named as a path (``meta.hash``,
    ``ids[]``): JSON puts integers inside objects and arrays as well."""
    column = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
    kind = column.type
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            child = pa.chunked_array([chunk.field(i) for chunk in column.chunks], kind.field(i).type)
            yield from _leaves(f"{name}.{kind.field(i).name}", child)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        yield from _leaves(f"{name}[]", pc.list_flatten(column))
    elif pa.types.is_map(kind):  # (its items as the slice holds them: a map's .items ignores its offset)
        entries = pa.list_(pa.struct([kind.key_field, kind.item_field]))
        items = [pc.list_flatten(c.cast(entries)).field(1) for c in column.chunks]
        yield from _leaves(f"{name}[]", pa.chunked_array(items, kind.item_type))
    else:
        yield name, column


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
            where = f" (the line at byte {begin:,}: {shown(text[begin : end if end >= 0 else len(text)])})"
        raise ValueError(
            f"cannot read {url!r} as {options.format}: column {name!r} is not UTF-8 text{where}: if the file is in "
            f"another encoding, pass it (read option encoding, e.g. --read-option encoding=latin1); to keep the "
            f"bytes as they are, declare the column binary (--read-option column_types.{name}=binary)"
        )


_LONG_INTEGER = re.compile(rb"(?<![0-9.eE])-?[0-9]{16,}(?![0-9.eE])")  # (2**53 has 16 digits)
