"""Blocks of lines as Arrow: plain lines (``lines_table``), JSON lines kept as written and checked to be one
object each (``json_lines_table``), and the newline scans both rest on, a MiB at a time."""

from __future__ import annotations

import contextlib
import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from daskpile import _kernels
from daskpile.sources.schemas import untyped_window_column
from daskpile.sources.text.formats import JSON_TEXT, LINE, UTF8_BOM, arrow_type, error_line, with_column_names


def newline_ended(text: bytes) -> bytes:
    """CSV text with a newline after its last line: Arrow's reader refuses a header alone without one ("Empty CSV
    file or block"), as a file of a header and no rows is often written."""
    return text if not text or text.endswith(b"\n") else text + b"\n"


def lines_table(block) -> pa.Table:
    """One row per line of ``block``: its bytes without the ``\\n``; a last line without one is a line too.

    >>> lines_table(b"a\\n\\nbc\\r\\nd").column("line").to_pylist()
    [b'a', b'', b'bc\\r', b'd']
    """
    data, offsets = ended_lines(block)
    return pa.table({LINE: _lines_without_newlines(data, offsets)})


def ended_lines(block) -> tuple[np.ndarray, np.ndarray]:
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
    ValueError: cannot read f as jsonl: the line at byte 8 holds 2 JSON values, not one object ('{"a":1}{}')
    """
    data, offsets = ended_lines(block)
    check_utf8(data, start, where)
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
            f"object ({shown(line)})"
        )
    if not empty.any():
        return None
    blank = np.zeros(len(lines), dtype=bool)
    blank[odd[empty]] = True
    return blank


def check_utf8(data: np.ndarray, start: int, where: str) -> None:
    whole = pa.Array.from_buffers(
        pa.large_binary(), 1, [None, pa.py_buffer(np.array([0, len(data)], dtype=np.int64)), pa.py_buffer(data)]
    )
    try:
        whole.cast(pa.large_string())  # Arrow's check, 7x faster than Python's decode on text that is not ASCII
    except pa.ArrowInvalid:
        try:
            bytes(data).decode("utf-8")  # only to say where
        except UnicodeDecodeError as e:
            # Named by its line's first byte, as every other error of a line is (and `tail -c +BYTE` shows it)
            newlines = np.flatnonzero(data[: e.start] == ord("\n"))  # (a rare error's path: a scan is fine)
            begins = int(newlines[-1]) + 1 if len(newlines) else 0
            length = first_newline(data[begins:])
            line = bytes(data[begins : begins + length if length >= 0 else len(data)])
            raise ValueError(
                f"cannot read {where} as jsonl: the line at byte {start + begins:,} is not UTF-8 text (byte "
                f"{start + e.start:,}: {shown(line)}); JSON is UTF-8: convert the file "
                "(iconv -f latin1 -t utf-8, if it is Latin-1)"
            ) from None
        raise


def _check_one_object_a_line(block, lines: pa.Array, starts: np.ndarray, start: int, where: str) -> None:
    """Arrow's JSON reader parses the block (every value, none kept) and must count one object a line."""
    found = _objects(block)
    if found == len(lines):
        return
    if isinstance(found, str) and "surrogate" in found:
        # A lone surrogate escape ("\udc80", what Python's json.dumps writes for undecodable bytes kept with
        # surrogateescape) is valid JSON, which Arrow's reader refuses and Python's and jq read: such a block's
        # lines are looked at by Python's (a rare block's path), and kept as written
        _check_one_object_a_line_in_python(lines, starts, start, where)
        return
    ends = np.append(starts[1:], len(block))  # (a line's bytes run to the next's start: blank lines between)

    def objects(low: int, high: int) -> int | str:  # what Arrow's reader finds in lines [low, high)
        return _objects(block[int(starts[low]) : int(ends[high - 1])])

    k = _first_wrong(0, len(lines), lambda low, high: objects(low, high) != high - low)
    found = objects(k, k + 1)
    at = f"cannot read {where} as jsonl: the line at byte {start + int(starts[k]):,}"
    if isinstance(found, str):
        raise ValueError(f"{at}: {found} ({shown(lines[k].as_py())})")
    if found != 1:
        raise ValueError(f"{at} holds {found} JSON values, not one object ({shown(lines[k].as_py())})")
    raise ValueError(f"cannot read {where}, bytes {start:,} to {start + len(block):,}, as jsonl: not one object a line")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # (1e999: Arrow's reader refuses a number past a double's range)
        raise ValueError(f"the number {text} is past a double's range")
    return value


def _check_one_object_a_line_in_python(lines: pa.Array, starts: np.ndarray, start: int, where: str) -> None:
    for line, at in zip(lines.to_pylist(), starts.tolist(), strict=True):
        try:
            record = json.loads(line, parse_float=_finite)
        except ValueError as e:
            raise ValueError(
                f"cannot read {where} as jsonl: the line at byte {start + at:,}: {e} ({shown(line)})"
            ) from None
        if not isinstance(record, dict):
            raise ValueError(
                f"cannot read {where} as jsonl: the line at byte {start + at:,} is not one JSON object ({shown(line)})"
            )


def _objects(data) -> int | str:
    """How many JSON values Arrow's reader finds in ``data``, or its error."""
    try:
        return pa_json.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=pa_json.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore"),
        ).num_rows
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        return re.sub(r" in row \d+", "", error_line(e)).rstrip(" .")


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


def refused_line(
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
    schema: pa.Schema | None = None,
    window: str | None = None,
) -> str:
    """What is wrong with ``block`` (from byte ``start`` of ``url``), naming the first line ``read`` refuses by
    its byte in the file; Arrow's own message if no line is to blame.

    Arrow counts rows from a block's start, from 0 in JSON and from 1 with the header in CSV; a line's byte is
    what every format's errors name.  Found by halves (a rare error's path): each line on its own when rows are
    read in a declared schema, or the first refused prefix when types are inferred from every row before.
    ``skip`` lines (a header) are never blamed; ``named(line)`` may say more of the line found, ``names``
    name the columns Arrow numbers, and ``schema`` (the rows') gives the type to declare for a field typed null,
    unless they are the ``window``'s, whose types no declaration changes.
    """
    data, offsets = ended_lines(block)

    def refused(low: int, high: int) -> str | None:
        try:
            read(bytes(data[offsets[0 if prefixes else low] : offsets[high]]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            return error_line(e)
        return None

    lines = len(offsets) - 1
    low = _first_wrong(skip, lines, lambda a, b: refused(a, b) is not None) if lines > skip else skip
    message = refused(low, low + 1) if lines > low else None
    if message is None:
        return f"cannot read {url!r}, bytes {start:,} to {start + len(block):,} as {format}: {error_line(error)}"
    line = bytes(data[offsets[low] : offsets[low + 1] - 1])
    said = (named(line) if named else None) or (_not_json_lines(line) if format == "jsonl" else None)
    if "conversion error to null" in message:
        message += f" {untyped_window_column()}" if window else (
            " (the column was empty in every row of the first file's first MiB, so typed null: declare its type)"
        )  # fmt: skip
    hint = ""
    header = bytes(data[offsets[0] : offsets[1]]) if start == 0 and lines else b""
    if low == 1 and format in ("csv", "tsv") and "Expected" in message and header.count(b'"') % 2:
        # (a quoted column name holding a newline: Excel's "Amount<Alt-Enter>(EUR)")
        hint = (
            ": the header opens a quote its line does not close: a column name holding a newline? pass the read "
            "option newlines_in_values=true"
        )
    if "invalid UTF8 data" in message and format in ("csv", "tsv"):
        hint = (
            ": if the file is in another encoding, pass it (read option encoding, e.g. --read-option encoding=latin1)"
        )
    message = re.sub(r"(CSV parse error: )?Row #\d+: |^(JSON parse error: .*?)\.? in row \d+$", r"\2", message)
    if changed := re.search(r"Column\(/([^)]*)\) changed from null to (\w+)", message):
        message += f" {untyped_window_column(changed[1])}" if window else (
            " (the field was null or absent in every line of the first file's first MiB, so typed null: "
            f"{_null_typed_fix(changed[1], changed[2], schema)})"
        )  # fmt: skip
    elif "Invalid encoding in string" in message and format == "jsonl":
        message += " (a string not closed on its line, or a raw control character in it)"
    message = with_column_names(message, names)
    return (
        f"cannot read {url!r} as {format}: the line at byte {start + int(offsets[low]):,}: "
        + (
            said
            or (message if message.endswith(f": {line.decode('utf-8', 'replace')}") else f"{message} ({shown(line)})")
        )
        + hint
    )


# How JSON lines are kept as written, unparsed, whatever their fields
AS_WRITTEN = (
    "--output-format jsonl, with --partitioning none where key=value folders are above the files; into Parquet, "
    "--read-option as_written=true"
)
# The type to declare for a field typed null whose later value is of Arrow's JSON kind
_DECLARED_FOR_KIND = {"string": "string", "number": "double", "boolean": "bool"}


def _null_typed_fix(path: str, kind: str, schema: pa.Schema | None = None) -> str:
    """What to do about a field typed null (Arrow's path to it, ``tags/[]``, ``meta/a``) that later holds ``kind``:
    the column's type to declare, the null in it replaced, where ``schema`` (the rows') has the column.

    >>> _null_typed_fix("opt", "string")
    "declare its type: --read-option 'column_types.opt=string'"
    >>> _null_typed_fix("tags/[]", "string")
    "declare its type: --read-option 'column_types.tags=list<string>'"
    >>> meta = pa.schema([("meta", pa.struct([("a", pa.null()), ("b", pa.list_(pa.int64()))]))])
    >>> _null_typed_fix("meta/a", "string", meta)
    "declare its type: --read-option 'column_types.meta=struct<a: string, b: list<item: int64>>'"
    >>> _null_typed_fix("meta/a", "object", meta)[:70]
    "'meta/a' is in a list or an object, whose type has no name to declare:"
    """
    column, *inside = path.split("/")
    whole = " (int64 for whole numbers)" if kind == "number" else ""
    if kind in _DECLARED_FOR_KIND and all(step == "[]" for step in inside):  # (a list's items: a type of lists)
        declared = _DECLARED_FOR_KIND[kind]
        for _ in inside:
            declared = f"list<{declared}>"
        return f"declare its type: --read-option 'column_types.{column}={declared}'{whole}"
    if kind in _DECLARED_FOR_KIND and schema is not None and column in schema.names:
        declared = _with_null_typed(schema.field(column).type, inside, arrow_type(_DECLARED_FOR_KIND[kind]))
        if declared is not None and arrow_type(str(declared)) == declared:  # (a name its printing would not give)
            return f"declare its type: --read-option 'column_types.{column}={declared}'{whole}"
    what = f"{path!r} is in a list or an object" if "/" in path else f"{path!r} holds an {kind}"
    return f"{what}, whose type has no name to declare: keep the lines as written ({AS_WRITTEN})"


def _with_null_typed(kind: pa.DataType, steps: list[str], typed: pa.DataType) -> pa.DataType | None:
    """``kind`` with the null type at ``steps`` (Arrow's path: ``[]`` a list's items, a name a struct's field)
    made ``typed``; None where the path leads to no null."""
    if not steps:
        return typed if pa.types.is_null(kind) else None
    step, rest = steps[0], steps[1:]
    if step == "[]" and pa.types.is_list(kind):
        inner = _with_null_typed(kind.value_type, rest, typed)
        return None if inner is None else pa.list_(kind.value_field.with_type(inner))
    if pa.types.is_struct(kind) and kind.get_field_index(step) >= 0:
        i = kind.get_field_index(step)
        inner = _with_null_typed(kind.field(i).type, rest, typed)
        fields = [kind.field(j) for j in range(kind.num_fields)]
        return None if inner is None else pa.struct([*fields[:i], fields[i].with_type(inner), *fields[i + 1 :]])
    return None


def new_field(record: dict, fields, prefix: str = "") -> str | None:
    """The first key of ``record`` (nested: ``a.b``) that ``fields`` (a schema, or a struct type) lacks."""
    known = {f.name: f.type for f in fields}
    for key, value in record.items():
        if key not in known:
            return prefix + key
        kind = known[key]
        if isinstance(value, dict) and pa.types.is_struct(kind):
            found = new_field(value, kind, f"{prefix}{key}.")
            if found:
                return found
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if isinstance(value, list) and listed and pa.types.is_struct(kind.value_type):  # (a chat's messages)
            for item in value:
                found = new_field(item, kind.value_type, f"{prefix}{key}[].") if isinstance(item, dict) else None
                if found:
                    return found
    return None


def _not_json_lines(line: bytes) -> str | None:
    """What a line says of a file that is JSON but not JSON lines (a pretty-printed object, an array), or None.

    >>> _not_json_lines(b'{"a": 1}') is None, _not_json_lines(b"{")[:40]
    (True, "'{' begins a JSON object written over se")
    """
    text = line.strip().decode("utf-8", "replace")
    if text.startswith("["):
        return (
            f"{shown(line)} begins a JSON array, not JSON lines (one object a line): `jq -c '.[]' FILE` rewrites it so"
        )
    if text.startswith("{") and text.endswith(("{", "[", ",")):  # what a whole object, or a cut one, never ends in
        return (
            f"{shown(line)} begins a JSON object written over several lines (pretty-printed), not JSON lines (one "
            "object a line): `jq -c . FILE` rewrites it so"
        )
    if not text.startswith("{"):  # a string, a number, null: Arrow says "Column() changed from object to string"
        with contextlib.suppress(ValueError):
            value = json.loads(text)
            kind = {str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
            return f"{shown(line)} is a JSON {kind}, not an object: JSON lines hold one object a line"
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


def shown(line: bytes, limit: int = 40) -> str:
    """The start of a line for an error: as text where it is UTF-8 (Arabic, CJK or emoji shown as themselves,
    not as the ``\\x..`` of a ``bytes`` repr), else as bytes.

    >>> shown("héllo wörld".encode(), limit=5), shown(b"Stra\\xdfe")
    ("'héllo'...", "b'Stra\\\\xdfe'")
    """
    head = line[: 4 * limit]  # (a character is at most 4 bytes)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3 or len(head) == len(line):  # not only a character cut at the end
            return repr(line[:limit]) + ("..." if len(line) > limit else "")
        text = head[: e.start].decode("utf-8")
    return repr(text[:limit]) + ("..." if len(text) > limit or len(head) < len(line) else "")


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
