"""Reading a text file a block of whole lines at a time: a byte range of an uncompressed file, or a
compressed one streamed, each block parsed into the plan's schema with errors that name the line."""

from __future__ import annotations

import contextlib
import io
import json

import fsspec.utils
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from daskpile._storage import FileVersion, full_url, is_local, open_read, uncached
from daskpile.sources.text.formats import (
    UTF8_BOM,
    TextOptions,
    ending_of,
    open_decompressed,
    refuse_what_is_not_text,
)
from daskpile.sources.text.lines import (
    AS_WRITTEN,
    check_utf8,
    ended_lines,
    json_lines_table,
    lines_table,
    new_field,
    newline_ended,
    refused_line,
    shown,
)
from daskpile.sources.text.schema import (
    Tail,
    column_names_in_utf8,
    csv_errors,
    not_in_encoding,
    read_json,
    refuse_rounded_integers,
    stream_csv,
)

# Read beyond a range's end with it, in the same request, for the line that crosses its end
LINE_SCAN_BYTES = 2**16


def read_lines_range(fs, path: str, start: int, end: int, listed: FileVersion | None = None) -> tuple[int, bytes]:
    """(offset, bytes) of the whole lines that start in ``[start, end)`` of a file (of the version ``listed``),
    as ``fs.read_block`` with a newline delimiter cuts them (a range not at 0 begins after the first newline at
    or after its start, and ends after the first at or after its end); the offset is where the first of them
    starts, for errors to name bytes.

    One request on an object store, of the range and ``LINE_SCAN_BYTES`` past it (more for a longer line), read
    without fsspec's read-ahead: s3fs' fetched up to 50 MiB more (a range of 1 MB of a 20 MB file got the 19 MB
    to its end).  Locally the lines are read where they are found, not cut from a larger read: a copy into new
    memory, whose pages this project's VM makes costly, made reading a file in ranges 5x slower.

    >>> fs = fsspec.filesystem("memory")
    >>> fs.pipe("/doc/lines", b"ab\\ncd\\nef")
    >>> [read_lines_range(fs, "/doc/lines", *r) for r in [(0, 2), (2, 5), (5, 8)]]
    [(0, b'ab\\n'), (3, b'cd\\n'), (6, b'ef')]
    >>> fs.rm("/doc/lines")
    """
    if is_local(fs):  # (a few small reads either side, then the lines read once, into their own memory)
        with fs.open(path, "rb") as f:
            f.seek(start)
            fsspec.utils.seek_delimiter(f, b"\n", 2**16)
            begin = f.tell()
            f.seek(end)  # (before begin when no line starts in the range: then none is read)
            fsspec.utils.seek_delimiter(f, b"\n", 2**16)
            stop = f.tell()
            f.seek(begin)
            return begin, f.read(max(stop - begin, 0))
    with open_read(fs, path, listed, **uncached(fs)) as f:
        f.seek(start)
        data = f.read(end - start + LINE_SCAN_BYTES)

        def after_newline(at: int) -> int:
            """Where the first line after offset ``at`` of ``data`` starts (the end of the file if none does)."""
            nonlocal data
            while (found := data.find(b"\n", at)) < 0:
                more = f.read(LINE_SCAN_BYTES)
                if not more:
                    return len(data)
                at, data = max(at, len(data)), data + more
            return found + 1

        begin = after_newline(0) if start else 0
        stop = after_newline(end - start)
        return start + begin, data[begin:stop] if stop > begin else b""


class BlockReader:
    """Blocks of whole lines of one file as tables in ``schema``: a byte range, or the whole file streaming."""

    def __init__(
        self,
        fs,
        path: str,
        schema: pa.Schema,
        options: TextOptions,
        blocksize: int,
        window: str | None = None,
        listed: FileVersion | None = None,
    ):
        self.fs, self.path, self.schema, self.options = fs, path, schema, options
        self.listed = listed  # the version of the file listed, which its reads require (``open_read``)
        self.blocksize = blocksize
        self.url = full_url(fs, path)
        self.window = window  # the moving window whose columns ``schema`` is, for an append; None: the source's
        self._columns: list[str] | None = None  # a CSV file's, as its header names them (``_header``)

    def blocks(self, byte_range: tuple[int, int] | None):
        """(offset, bytes) of whole lines: those starting in ``byte_range`` (uncompressed files), or all, streaming."""
        if byte_range is not None:
            yield read_lines_range(self.fs, self.path, *byte_range, self.listed)
            return
        offset, tail = 0, b""
        with open_decompressed(self.fs, self.path, self.listed) as f:
            while True:
                # One copy of a block held while the caller works (which reads the next block before it is done
                # with this one's rows: pieces end by their next block's size): the chunk read and the block it
                # ends were three, 7x the blocksize in all for a task streaming a .csv.gz (a trial's 2 GB worker)
                data = f.read(self.blocksize)
                if not data:
                    if tail:
                        yield offset, tail
                    return
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # no line ends in it yet: a line longer than the block
                    tail += data
                    continue
                block = data if not tail and cut == len(data) else b"".join((tail, memoryview(data)[:cut]))
                tail = data[cut:]
                del data
                yield offset, block
                offset += len(block)
                del block

    def streamed_records(self):
        """The tables of a CSV whose quoted values may hold newlines, a block at a time, as Arrow's streaming
        reader cuts them (see ``first_records``): a whole file, read by one task."""
        where = repr(self.url)
        names = list(self.schema.names)  # (Arrow numbers the columns in the file's order: its errors' names)
        with contextlib.suppress(ValueError, pa.ArrowInvalid):  # (a header Arrow's stream reads, or refuses, below)
            names[:] = self._header(None, where)  # (before the reader: it converts its first block as it is made)
        with (
            open_decompressed(self.fs, self.path, self.listed) as f,
            csv_errors(self.fs, self.path, self.options, names),
        ):
            stream = Tail(f)
            if not stream.peek():  # an empty file holds no rows (Arrow's reader calls it an error)
                return
            refuse_what_is_not_text(stream.peek(64), self.url, self.options.format, ending_of(self.fs, self.path))
            reader = stream_csv(stream, self.options, self.schema, self.blocksize)
            order = names[:] = _columns_of_the_source(reader.schema.names, self.schema.names, where)
            table = None
            for batch in self._batches(reader, stream):
                table = pa.Table.from_batches([batch])
                yield table if order == self.schema.names else table.select(self.schema.names)
            if table is not None and table.num_rows:
                self._refuse_unclosed_quote(table.slice(table.num_rows - 1), stream.tail, stream.handed_out)

    def _batches(self, reader, stream):
        """The reader's batches; a record longer than a block said as such, with where and what to do (Arrow:
        "straddling object straddles two block boundaries (try to increase block size?)")."""
        records = 0
        try:
            for batch in reader:
                records += batch.num_rows
                yield batch
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e):
                raise
            raise ValueError(
                f"cannot read {self.url!r} as {self.options.format}: a record after its first {records:,} (within "
                f"its first {stream.handed_out:,} bytes) is longer than the block of {self.blocksize:,} bytes that a "
                "CSV with quoted newlines is read in: a value that long needs a larger blocksize (--blocksize); or "
                "a quote opening a value is never closed (if quotes are characters of the values, pass the read "
                "option quote_char=false)"
            ) from None

    def _refuse_unclosed_quote(self, last: pa.Table, tail: bytes, stream_bytes: int) -> None:
        """Arrow reads a quote never closed as a value running to the end of the file (pandas: "EOF inside
        string"): a TSV of 200,000 lines with one literal opening quote became 11 rows, verified.  Such a value
        is the last record's last field, and the file ends with its bytes after the quote, as a closed one
        cannot (its closing quote follows them).  ``last``: that record, its columns in the file's order."""
        quote = self.options.quote_char.encode() if self.options.quote_char is not False else None
        if quote is None or not last.num_columns:
            return
        name = last.column_names[-1]
        value = last.column(name)[0].as_py()
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # (a quoted number, as QUOTE_ALL exports write them: as read, if written so)
        if isinstance(value, str):
            value = value.encode()
        if not isinstance(value, bytes) or not value.strip(quote + b"\r\n"):
            return  # (quotes or line breaks alone, or none: closed, and a last newline, they end as unclosed ones)
        written = _quoted(value, quote)
        if len(value) < len(tail):
            cut = tail.endswith(quote + value) or tail.endswith(written)
        else:  # (the tail is its end: a value with a newline, which no unquoted one holds)
            cut = b"\n" in value and tail == value[-len(tail) :]
        if cut:
            # Where the quote is, when the value's bytes are the file's: none of them unquoted or decoded
            as_read = quote not in value and self.options.text_encoding == "utf8" and not self.options.escape_char
            at = f" at byte {stream_bytes - len(value) - len(quote):,}" if as_read else ""
            raise ValueError(
                f"cannot read {self.url!r} as {self.options.format}: a quote opening a value of column {name!r}"
                f"{at} is never closed, and the value runs to the end of the file ({shown(value)}): if quotes "
                "are characters of the values, pass the read option quote_char=false"
            )

    def parse(self, block: bytes, start: int) -> pa.Table:
        """The rows of ``block``, which begins at byte ``start`` of the (decompressed) file."""
        if start == 0:
            refuse_what_is_not_text(block, self.url, self.options.format, ending_of(self.fs, self.path))
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
            check_utf8(np.frombuffer(block, dtype=np.uint8), start, repr(self.url))
        try:
            table = self._json(block) if jsonl else self._csv(block, first=start == 0, where=where)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(self._bad_line(block, start, e)) from None
        except UnicodeError:  # (Python's codec, in Arrow's reader: a file of another encoding than said)
            said = not_in_encoding([block], start, repr(self.url), self.options.format, self.options.text_encoding)
            raise ValueError(said) from None
        if jsonl:
            _refuse_objects_sharing_a_line(table, block, start, repr(self.url))
        else:  # (files with newlines in values are read by streamed_records, not in blocks of lines)
            quote = (self.options.quote_char or '"').encode()  # (no quote character: no newline in a value)
            _refuse_newlines_in_values(table, block, start, self.url, self.options.format, quote)
        refuse_rounded_integers(table, block, self.options, self.url, start)
        return table

    def _bad_line(self, block: bytes, start: int, error: Exception) -> str:
        format = self.options.format
        header = start == 0 and format != "jsonl" and not self.options.autogenerate_column_names

        def read(text: bytes) -> pa.Table:
            # (lines apart, in the columns' order as far as known: the header itself may be what is refused)
            return self._json(text) if format == "jsonl" else self._csv(text, first=False, where="", apart=True)

        named = self._unexpected_field if format == "jsonl" else None
        return refused_line(
            block, start, error, self.url, format, read, skip=int(header), named=named,
            names=self._columns or self.schema.names,  # (Arrow numbers the columns in the file's order)
            schema=self.schema, window=self.window,
        )  # fmt: skip

    def _unexpected_field(self, line: bytes) -> str | None:
        """Which field of ``line`` is not a column (or not a field of a struct column), for Arrow's "unexpected
        field"."""
        try:
            record = json.loads(line)
        except ValueError:
            return None
        new = new_field(record, self.schema) if isinstance(record, dict) else None
        if new is None:
            return None
        if self.window is not None:
            return (
                f"field {new!r} is not a column of the window {self.window} ({', '.join(self.schema.names)}): a "
                "window's columns are those of its first data"
            )
        top = new.split(".")[0].removesuffix("[]")
        if "." not in new or top not in self.schema.names:  # (a new key of its own, "user.name" too)
            return (
                f"field {new!r} is not one of the columns found in the first file's first MiB "
                f"({', '.join(self.schema.names)}): declare its type to read it (read option column_types), or "
                f"keep the lines as written ({AS_WRITTEN})"
            )
        return (
            f"field {new!r} is not one found in the first file's first MiB: declare the whole column {top!r} with it "
            f"(read option column_types, e.g. --read-option 'column_types.{top}={self.schema.field(top).type}' "
            f"with {new.split('.')[-1]!r} added), or keep the lines as written ({AS_WRITTEN})"
        )

    def _json(self, block: bytes) -> pa.Table:
        return read_json(block, self.schema, self.window, unexpected_field_behavior="error")

    def _csv(self, block: bytes, first: bool, where: str, apart: bool = False) -> pa.Table:
        names = self.schema.names
        block = newline_ended(block)
        headed = not self.options.autogenerate_column_names
        order = (self._columns or names) if apart or not headed else self._header(block if first else None, where)
        table = pa_csv.read_csv(
            io.BytesIO(block),
            read_options=self.options.csv_read(
                column_names=order, skip_rows=1 if first and headed else 0, block_size=len(block) + 1
            ),
            parse_options=self.options.csv_parse(),
            convert_options=self.options.csv_convert(self.schema),
        )
        return table if order == names else table.select(names)

    def _first_line(self) -> bytes:
        """The file's first line, decompressed: read a few KiB at a time, each a request on an object store."""
        line = b""
        with open_decompressed(self.fs, self.path, self.listed, **uncached(self.fs)) as f:
            while b"\n" not in line and (more := f.read(LINE_SCAN_BYTES)):
                line += more
        return newline_ended(line[: line.find(b"\n") + 1 or len(line)])

    def _header(self, block: bytes | None, where: str) -> list[str]:
        """The columns of the file as its header names them, in its order (from ``block`` at its start, else read
        once): the source's columns, in any order, as Parquet and JSON lines files may hold them."""
        if self._columns is None:
            if block is None:  # a later range or block (a resumed run skips those done): the file's first line
                where, block = repr(self.url), self._first_line()
            header = block[: block.find(b"\n") + 1 or len(block)]
            with column_names_in_utf8(where, self.options.format, self.options.text_encoding, lambda: header):
                found = pa_csv.read_csv(
                    io.BytesIO(header),
                    read_options=self.options.csv_read(block_size=len(header) + 2),  # (a header of over 1 MiB)
                    parse_options=self.options.csv_parse(newlines_in_values=False),
                ).schema.names
            self._columns = _columns_of_the_source(found, self.schema.names, where)
        return self._columns


def _columns_of_the_source(found: list[str], names: list[str], where: str) -> list[str]:
    """``found``, a CSV file's header, if it names the source's columns (in any order); else refused."""
    if found != names and sorted(found) != sorted(names):
        missing, extra = [n for n in names if n not in found], [n for n in found if n not in names]
        differ = "; ".join(
            [*([f"it lacks {', '.join(map(repr, missing))}"] if missing else []),
             *([f"it has {', '.join(map(repr, extra))} too"] if extra else [])]
        ) or "a name twice"  # fmt: skip
        raise ValueError(
            f"the header of {where} names the columns {found}, not {names} ({differ}): a source's CSV files have "
            "the same columns, in any order"
        )
    return found


def _refuse_newlines_in_values(
    table: pa.Table, block: bytes, start: int, url: str, format: str, quote: bytes = b'"'
) -> None:
    """A quoted value holding a newline, which a cut into ranges or blocks could have split: refused, naming the
    line where it starts (found by its text; the block, if a quote character other than ``"`` hides it)."""
    for name in table.column_names:
        column = table.column(name)
        # Binary too (column_types.x=binary): a cut value there was two rows, silently
        textual = any(is_(column.type) for is_ in (pa.types.is_string, pa.types.is_large_string,
                                                  pa.types.is_binary, pa.types.is_large_binary))  # fmt: skip
        found = pc.match_substring(column, "\n") if textual else None
        if found is None or not pc.any(found).as_py():
            continue
        value = column[pc.index(found, True).as_py()].as_py()
        value = value if isinstance(value, bytes) else value.encode()
        _refuse_a_quote_open_at_the_end(value, name, block, start, url, format, quote)
        # As written: opened by a quote, its quotes doubled; up to its first newline, which ends a line
        at = block.find(_quoted(value[: value.index(b"\n") + 1], quote))
        line = start + block.rfind(b"\n", 0, at) + 1
        where = f"the line at byte {line:,}" if at >= 0 else f"bytes {start:,} to {start + len(block):,}"
        raise ValueError(
            f"cannot read {url!r} as {format}: {where}: column {name!r} holds a value with a newline inside quotes "
            f"({shown(value)}): pass the read option newlines_in_values=true (--read-option "
            "newlines_in_values=true; the file is then read by one task), or, if its quotes are characters of the "
            'values (a TSV of 5" floppies), quote_char=false'
        )


def _quoted(value: bytes, quote: bytes) -> bytes:
    """``value`` as a CSV writes it, up to its closing quote: the opening quote, then its quotes doubled.

    >>> _quoted(b'5" floppy', b'"')
    b'"5"" floppy'
    """
    return quote + value.replace(quote, quote + quote)


def _refuse_a_quote_open_at_the_end(
    value: bytes, name: str, block: bytes, start: int, url: str, format: str, quote: bytes
) -> None:
    """A value that an opening quote runs to the end of its range (Arrow gives the last line its newline): a
    value holding newlines, or a quote never closed, which only a read of the whole file can tell apart.  Said
    as such: "a newline inside quotes" was wrong of a file cut off inside a quoted value."""
    as_written = _quoted(value, quote)
    ended = block if block.endswith(b"\n") else block + b"\n"
    if not ended.endswith(as_written):
        return
    at = start + len(ended) - len(as_written)
    raise ValueError(
        f"cannot read {url!r} as {format}: a quote opening a value of column {name!r} at byte {at:,} is not closed "
        f"before the end of bytes {start:,} to {start + len(block):,}, the range that holds it ({shown(value)}): if "
        "values hold newlines, pass the read option newlines_in_values=true (--read-option newlines_in_values=true; "
        "the file is then read by one task, and a quote never closed is refused); if quotes are characters of the "
        "values, quote_char=false"
    )


def _refuse_objects_sharing_a_line(table: pa.Table, block: bytes, start: int, where: str) -> None:
    """Refuse a line of JSON lines that Arrow's reader read as several rows, or a row spread over lines.

    Arrow's reader takes objects apart by any whitespace: a line ``{"id": 2} {"id": 3}`` became two rows,
    which other JSON-lines readers refuse (pandas: "Trailing data"), or one row of the first object.  When
    every line starts with ``{`` and there are as many rows as lines, each line is one (``json_lines_table``
    says why); otherwise, a rare path, the lines are checked one by one to name the one to blame.
    """
    data, offsets = ended_lines(block)
    if table.num_rows == len(offsets) - 1 and (data[offsets[:-1]] == ord("{")).all():
        return
    if start == 0 and block.startswith(UTF8_BOM):
        block, start = block[len(UTF8_BOM) :], len(UTF8_BOM)
    if json_lines_table(block, start, where).num_rows != table.num_rows:  # (refuses the line to blame)
        raise ValueError(
            f"cannot read {where}, bytes {start:,} to {start + len(block):,}, as jsonl: not one object a line"
        )
