"""JSON lines in, JSON lines out: each line kept as written, checked to be one JSON object.

The oracles are independent of daskpile's reader: Python's ``split`` for the
lines and pyarrow's whole-file JSON reader for what other tools read.
"""

import collections
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from _util import daskpile_in_process, read_output

import daskpile
from daskpile.engine._manifest import read as read_manifest

# What a parse and a rewrite would change: key order, spaces, integers past int64, escapes, non-ASCII text,
# CRLF, a repeated key, nesting; and what a JSON reader skips: blank lines, spaces alone, no final newline.
CORPUS = (
    b'{"b": 2, "a": 1}\n'
    + b"\n"
    + b' {"a": 12345678901234567890123}\r\n'
    + b'{"a":"caf\xc3\xa9 \\u00e9 \\n", "z": [1, {"x": null}]}\n'
    + b" \t \r\n"
    + b'{"a":1,"a":2}\n'
    + b'{"long": "'
    + b"x" * 5000
    + b'"}\n'
    + b"".join(b'{"i": %d, "f": 0.1}\n' % i for i in range(400))
    + b'{"last": true}'
)


def objects_in(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\n") if line.strip(b" \t\r")]


def written(report) -> bytes:
    return b"".join(Path(f).read_bytes() for f in report.files)


@pytest.mark.slow
@pytest.mark.parametrize("blocksize", [2**10, 2**30])  # ranges of 64 bytes, and the whole file in one
def test_json_lines_out_are_the_input_lines_as_written_permuted(tmp_path, sync_scheduler, blocksize):
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(CORPUS)
    report = daskpile.shuffle_parquet(
        str(source), str(tmp_path / "out"), piles=5, seed=2, blocksize=blocksize, output_format="jsonl"
    )
    data = written(report)
    assert collections.Counter(data.split(b"\n")[:-1]) == collections.Counter(objects_in(CORPUS))
    assert data.endswith(b"\n") and data.split(b"\n")[:-1] != objects_in(CORPUS)  # permuted, not in order
    assert report.rows == len(objects_in(CORPUS))
    assert read_manifest(str(tmp_path / "out"))["source"]["read_options"] == {"as_written": True}
    assert daskpile.verify(str(source), str(tmp_path / "out")).ok and daskpile.verify(str(tmp_path / "out")).ok


def test_what_a_json_reader_reads_of_the_output_is_what_it_reads_of_the_input(tmp_path, sync_scheduler):
    # one type a key, no key twice, no integer past int64: what Arrow's reader takes whole
    readable = b"\n".join(
        [b'{"b": 2, "a": "x"}', b"", b' {"a": "caf\xc3\xa9 \\u00e9"}\r', b'{"z": [{"x": null}, {"x": 1}]}']
        + [b'{"i": %d, "f": 0.1}' % i for i in range(400)]
    )
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(readable)
    report = daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=3, seed=1, output_format="jsonl")

    def rows(data: bytes) -> list:
        table = pa_json.read_json(io.BytesIO(data))
        return sorted(repr(sorted(row.items())) for row in table.to_pylist())  # columns come in first-seen order

    assert rows(written(report)) == rows(readable)


def test_a_changed_line_fails_verification(tmp_path, sync_scheduler):
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(CORPUS)
    report = daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=3, seed=1, output_format="jsonl")
    part = Path(report.files[0])
    part.write_bytes(part.read_bytes().replace(b'"f": 0.1', b'"f": 0.10', 1))  # the same number, other bytes
    assert not daskpile.verify(str(source), str(tmp_path / "out")).ok


@pytest.mark.parametrize(
    "bad, message, parsed",  # parsed: what the reading of the rows (to Parquet) says, where it says more
    [
        (b'{"a": 1}{"a": 2}', r"line at byte 9,000 holds 2 JSON values, not one object", None),
        # a blank line after it: as many rows as lines
        (b'{"a": 1} {"a": 2}\n', r"line at byte 9,000 holds 2 JSON values, not one object", None),
        (b'{"a":\n 1}', r"line at byte 9,000 is not one JSON object \('\{\"a\":'\)", None),
        (b"[1, 2]", r"line at byte 9,000 is not one JSON object", r"line at byte 9,000: .* begins a JSON array"),
        (
            b'"text"',
            r"line at byte 9,000 is not one JSON object",
            r"line at byte 9,000: '\"text\"' is a JSON string, not an object",
        ),
        (
            b'{"a": [1, {"b": tru}]}',
            r"line at byte 9,000: JSON parse error: Invalid value \('\{\"a\": \[1, \{\"b\": tru\}\]\}'\)$",
            r"line at byte 9,000: JSON parse error: Column\(/a\) changed from number to array",
        ),
        (b'{"a": "caf\xe9"}', r"line at byte 9,000 is not UTF-8 text \(byte 9,010: b'\{\"a\": \"caf\\xe9", None),
        (b'{"a": "tab\tinside"}', r"line at byte 9,000: JSON parse error", None),
        # a document cut short: its text shown as text (it was a bytes repr, \xd8\xa7... for Arabic)
        ('{"a": "العالم'.encode(), r"line at byte 9,000.*\('\{\"a\": \"العالم'\)$", None),
    ],
)
@pytest.mark.parametrize("output_format", ["jsonl", "parquet"])  # the lines as written, or parsed
def test_a_line_that_is_not_one_json_object_is_refused_naming_its_byte(
    tmp_path, sync_scheduler, bad, message, parsed, output_format
):
    """Parsed, two objects on a line were two rows, and an object over two lines one: Arrow's reader takes
    objects apart by any whitespace."""
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b'{"a": 1}\n' * 1000 + bad + b'\n{"a": 3}\n')  # in the last of many ranges of 1 KiB
    said = parsed if output_format == "parquet" and parsed else message
    with pytest.raises(ValueError, match=r"bad\.jsonl' as jsonl: .*" + said):
        daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), blocksize=2**14, output_format=output_format)
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_a_bad_line_in_one_line_and_writes_nothing(tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b'{"a": 1}\n{"a": 1} {"a": 2}\n')
    done = daskpile_in_process(
        "shuffle", str(source), str(tmp_path / "out"), "--output-format", "jsonl", "--scheduler", "sync"
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"daskpile: error: cannot read {str(source)!r} as jsonl: the line at byte 9 holds 2 JSON values, not one "
        'object (\'{"a": 1} {"a": 2}\')'
    ]
    assert not (tmp_path / "out").exists()


def test_as_written_false_parses_and_writes_the_rows_as_arrow_reads_them(tmp_path, sync_scheduler):
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(b'{"b": 2, "a": 1}\n{"b": 3}\n')
    report = daskpile.shuffle_parquet(
        str(source), str(tmp_path / "out"), piles=1, seed=1, output_format="jsonl", read_options={"as_written": False}
    )
    assert sorted(written(report).splitlines()) == [b'{"b":2,"a":1}', b'{"b":3,"a":null}']
    assert (
        "read_options" not in read_manifest(str(tmp_path / "out"))["source"]
        or not read_manifest(str(tmp_path / "out"))["source"]["read_options"]
    )


def test_what_asks_for_parsed_rows_parses(tmp_path, sync_scheduler):
    """A declared type or key=value folders need columns: those runs parse; as_written with them is refused."""
    (tmp_path / "lake" / "day=1").mkdir(parents=True)
    (tmp_path / "lake" / "day=1" / "a.jsonl").write_bytes(b'{"b": 2}\n')
    report = daskpile.shuffle_parquet(str(tmp_path / "lake"), str(tmp_path / "out"), piles=1, output_format="jsonl")
    assert written(report) == b'{"b":2,"day":1}\n'
    typed = daskpile.shuffle_parquet(
        str(tmp_path / "lake"), str(tmp_path / "typed"), piles=1, output_format="jsonl", partitioning="none",
        read_options={"column_types": {"b": "double"}},
    )  # fmt: skip
    assert written(typed) == b'{"b":2.0}\n'
    with pytest.raises(ValueError, match=r"key=value folders would add the columns \['day'\]"):
        daskpile.shuffle_parquet(
            str(tmp_path / "lake"), str(tmp_path / "x"), output_format="jsonl", read_options={"as_written": True}
        )
    with pytest.raises(ValueError, match=r"as_written .* without column_types"):
        daskpile.shuffle_parquet(
            str(tmp_path / "lake"), str(tmp_path / "x"), partitioning="none",
            read_options={"as_written": True, "column_types": {"b": "double"}},
        )  # fmt: skip
    assert not (tmp_path / "x").exists()
    # lines that parse only as written: the error says why they were parsed (it did not: a new user was lost)
    (tmp_path / "lake" / "day=1" / "a.jsonl").write_bytes(b'{"v": 1}\n{"v": "two"}\n')
    why = r"changed from number to string .* key=value folders add the columns \['day'\]: partitioning='none' "
    with pytest.raises(ValueError, match=why + r"\(--partitioning none\) keeps them as written"):
        daskpile.shuffle_parquet(str(tmp_path / "lake"), str(tmp_path / "x"), output_format="jsonl")
    assert not (tmp_path / "x").exists()


def test_json_lines_kept_as_written_can_go_to_parquet_as_one_binary_column(tmp_path, sync_scheduler):
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(CORPUS)
    daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=2, read_options={"as_written": True})
    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "out").glob("*.parquet")))
    assert table.column_names == ["json"]
    assert collections.Counter(table.column("json").to_pylist()) == collections.Counter(objects_in(CORPUS))
    assert daskpile.verify(str(source), str(tmp_path / "out")).ok


def test_an_error_in_a_later_range_names_the_byte_where_its_line_starts(tmp_path, sync_scheduler):
    """A range begins after the first newline in it, not at its first byte: the offsets count from there."""
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b'{"a": 1234567}\n' * 20000 + b"[1]\n" + b'{"a": 1234567}\n')  # 15-byte lines
    with pytest.raises(ValueError, match=r"the line at byte 300,000 is not one JSON object"):
        daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), blocksize=2**16, output_format="jsonl")
    source.write_bytes(b'{"a": 1234567}\n' * 20000 + b'{"a": 1}\xff\n')
    with pytest.raises(ValueError, match=r"the line at byte 300,000 is not UTF-8 text \(byte 300,008: "):
        daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), blocksize=2**16, output_format="jsonl")


@pytest.mark.parametrize(
    "lines, bad, message",
    [
        # Arrow's "in row 3" counts objects: it pointed past the line holding two, at a line that is fine
        ([b'{"a": 1}', b'{"a": 1} {"b": 2}', b'{"a": 3}', b'{"a": tru}', b'{"a": 5}'], 1, "holds 2 JSON values"),
        ([b'{"a": 1}', b'{"a": 2}', b'{"a": tru}', b'{"a": 4} {"b": 2}'], 2, ": JSON parse error: Invalid value"),
        ([b'{"a": 1}', b'{"a": 1}}', b'{"a": 3}'], 1, ": JSON parse error"),
        ([b'{"a": 1}', b'{"a": {}', b'{"a": 3}'], 1, ": JSON parse error"),
        ([b'{"a": 1}', b'{"a": "nul\x00"}'], 1, ": JSON parse error"),
    ],
)
def test_the_line_named_is_the_first_that_arrow_does_not_read_as_one_object(
    tmp_path, sync_scheduler, lines, bad, message
):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    at = sum(len(line) + 1 for line in lines[:bad])
    with pytest.raises(ValueError, match=rf"the line at byte {at}( |){message}"):
        daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), output_format="jsonl")


def test_a_first_line_longer_than_the_sample_and_a_byte_order_mark(tmp_path, sync_scheduler):
    source = tmp_path / "long.jsonl"
    long = b'{"text": "' + b"x" * (3 << 20) + b'"}'
    source.write_bytes(b"\xef\xbb\xbf" + long + b'\n{"b": 1}\n')
    report = daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=2, output_format="jsonl")
    assert sorted(written(report).split(b"\n")[:-1]) == sorted([long, b'{"b": 1}'])  # the mark is not kept


@pytest.mark.parametrize("value", ["yes", 1, "0"])
def test_a_true_or_false_read_option_takes_only_true_or_false(tmp_path, value):
    """True and false, or their text in any case (a config file's "true", Python's "False")."""
    (tmp_path / "a.jsonl").write_bytes(b'{"a": 1}\n')
    with pytest.raises(ValueError, match="read option as_written is true or false"):
        daskpile.shuffle_parquet(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), read_options={"as_written": value})


@pytest.mark.slow
def test_dates_times_and_durations_go_out_as_json_lines_and_verify(tmp_path, sync_scheduler):
    """Dates and times are written as text, durations as their count: the read-back for the fingerprints took
    dates for day numbers ("changed from number to string") and had no conversion to times or durations."""
    import datetime

    table = pa.table(
        {
            "id": list(range(6)),
            "day": pa.array([datetime.date(2024, 1, i + 1) for i in range(5)] + [None], pa.date32()),
            "at": pa.array([5, 86_399_999, 0, 1, None, 7], pa.time32("ms")),
            "precise": pa.array([5, None, 10**9, 86_399_999_999_999, 1, 2], pa.time64("ns")),
            "seconds": pa.array([0, 1, None, 3, 4, 5], pa.time32("s")),
            "took": pa.array([1, None, -3, 2**40, 0, 1], pa.duration("us")),
        }
    )
    import pyarrow.feather as feather

    feather.write_feather(table, str(tmp_path / "in.arrow"))  # (Parquet has no time32[s]: it would be ms)
    report = daskpile.shuffle_parquet(str(tmp_path / "in.arrow"), str(tmp_path / "out"), piles=2, seed=1,
                                      output_format="jsonl")  # fmt: skip
    assert report.fingerprint is not None and report.fingerprint.rows == 6
    lines = [line for f in report.files for line in Path(f).read_text().splitlines()]
    first = next(line for line in lines if line.startswith('{"id":0,'))
    assert first == (
        '{"id":0,"day":"2024-01-01","at":"00:00:00.005","precise":"00:00:00.000000005","seconds":"00:00:00","took":1}'
    )
    assert daskpile_in_process("verify", str(tmp_path / "out")).returncode == 0


def test_a_column_arrow_cannot_write_as_text_is_refused_before_anything_runs(tmp_path, sync_scheduler):
    import pyarrow.feather as feather

    feather.write_feather(pa.table({"id": [1], "span": pa.array([(1, 2, 3)], pa.month_day_nano_interval())}),
                          str(tmp_path / "in.arrow"))  # fmt: skip
    with pytest.raises(ValueError, match=r"Arrow cannot write column 'span' \(month_day_nano_interval\) so"):
        daskpile.shuffle_parquet(str(tmp_path / "in.arrow"), str(tmp_path / "out"), piles=1, output_format="jsonl")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "output_format, kind, values",
    [("csv", pa.float16(), [0.5]), ("jsonl", pa.float16(), [0.5]), ("csv", pa.decimal256(40, 2), [1]),
     ("jsonl", pa.binary(4), [b"abcd"])],
)  # fmt: skip
def test_a_column_arrow_cannot_read_back_as_text_is_refused_before_anything_runs(
    tmp_path, sync_scheduler, output_format, kind, values
):
    """Arrow writes a half float or a decimal256 as CSV and cannot read it back, nor a fixed-size binary from
    JSON lines: the run failed in pass 2, exit 1, its record left in dest (a new user's trial of formats)."""
    import re

    import pyarrow.feather as feather

    feather.write_feather(pa.table({"id": [1], "v": pa.array(values, kind)}), str(tmp_path / "in.arrow"))
    with pytest.raises(ValueError, match=rf"Arrow cannot write column 'v' \({re.escape(str(kind))}\) so, or read it"):
        daskpile.shuffle_parquet(
            str(tmp_path / "in.arrow"), str(tmp_path / "out"), piles=1, output_format=output_format
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("output_format", ["csv", "jsonl"])
def test_views_and_dictionaries_of_views_go_out_as_their_values(tmp_path, sync_scheduler, output_format):
    """Polars writes strings to Arrow files as string_view, and categoricals as dictionaries of them: Arrow's CSV
    writer takes no view, and decodes no dictionary of them (a new user's trial of formats)."""
    import pyarrow.ipc as ipc

    codes = pa.DictionaryArray.from_arrays(pa.array([0, 1, None], pa.uint32()), pa.array(["a", "b"], pa.string_view()))
    table = pa.table({"id": [1, 2, 3], "s": pa.array(["x", "", None], pa.string_view()), "cat": codes})
    with ipc.new_file(str(tmp_path / "in.arrow"), table.schema) as writer:
        writer.write_table(table)
    report = daskpile.shuffle_parquet(
        str(tmp_path / "in.arrow"), str(tmp_path / "out"), piles=1, seed=1, output_format=output_format
    )
    assert report.fingerprint.rows == 3 and daskpile.verify(str(tmp_path / "in.arrow"), str(tmp_path / "out")).ok


@pytest.mark.parametrize("output_format", ["csv", "jsonl"])
def test_dictionary_columns_go_out_as_their_values(tmp_path, sync_scheduler, output_format):
    """A categorical column was refused as not flat; CSV and JSON lines hold its values, and verify."""
    table = pa.table({"id": list(range(6)), "cat": pa.array(["a", "b", None, "a", "c", "b"]).dictionary_encode()})
    pq.write_table(table, tmp_path / "in.parquet")
    report = daskpile.shuffle_parquet(str(tmp_path / "in.parquet"), str(tmp_path / "out"), piles=2, seed=1,
                                      output_format=output_format)  # fmt: skip
    text = b"".join(Path(f).read_bytes() for f in report.files)
    assert text.count(b'"a"') == 2 and text.count(b'"c"') == 1
    assert daskpile.verify(str(tmp_path / "in.parquet"), str(tmp_path / "out")).ok


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (
            [json.dumps({"id": i, "x": None if i < 80_000 else i}) for i in range(80_001)],  # past the 1 MiB sampled
            r"Column\(/x\) changed from null to number \(the field was null or absent in every line of the first "
            r"file's first MiB, so typed null: declare its type: --read-option 'column_types.x=double' \(int64 for "
            r"whole numbers\)\)",
        ),
        (
            [json.dumps({"id": i, "tags": [] if i < 80_000 else [i]}) for i in range(80_001)],
            r"Column\(/tags/\[\]\) changed from null to number \(.* so typed null: declare its type: --read-option "
            r"'column_types.tags=list<double>' \(int64 for whole numbers\)\)",
        ),
        (
            [json.dumps({"id": i, "meta": {"a": None if i < 80_000 else i}}) for i in range(80_001)],
            r"Column\(/meta/a\) changed from null to number \(.* so typed null: declare its type: --read-option "
            r"'column_types.meta=struct<a: double>' \(int64 for whole numbers\)\)",
        ),
        (
            [json.dumps({"id": i, "meta": {"a": None if i < 80_000 else {"x": i}}}) for i in range(80_001)],
            r"Column\(/meta/a\) changed from null to object \(.* so typed null: 'meta/a' is in a list or an "
            r"object, whose type has no name to declare: keep the lines as written \(--output-format jsonl, with "
            r"--partitioning none where key=value folders are above the files; into Parquet, --read-option "
            r"as_written=true\)",
        ),
        (['{"a": 1, "s": "abc'], r"Invalid encoding in string \(a string not closed on its line, or a raw control"),
    ],
    ids=[
        "null-then-number",
        "empty-list-then-numbers",
        "null-in-an-object-then-number",
        "null-in-an-object-then-object",
        "string-not-closed",
    ],
)
def test_arrows_json_errors_come_with_what_they_mean(tmp_path, sync_scheduler, lines, said):
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=said):
        daskpile.shuffle_parquet(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), piles=1)
    assert not (tmp_path / "out").exists()


def test_a_list_typed_null_in_the_first_mib_is_read_as_the_type_declared(tmp_path, sync_scheduler):
    """What the error above says to do: a nested type declared by its Arrow name (it was "'list<string>' is not
    an Arrow type name", and a list field typed null could only be kept as written)."""
    lines = [json.dumps({"id": i, "tags": [] if i < 80_000 else [str(i), "x"]}) for i in range(80_010)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    options = {"column_types": {"tags": "list<string>"}}
    report = daskpile.shuffle_parquet(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), piles=2, read_options=options)
    out = read_output(tmp_path / "out")
    assert out.schema.field("tags").type == pa.list_(pa.string()) and report.rows == 80_010
    assert sorted(
        map(tuple, out.filter(pc.greater(pc.list_value_length(out["tags"]), 0))["tags"].to_pylist())
    ) == sorted((str(i), "x") for i in range(80_000, 80_010))
    assert daskpile.verify(str(tmp_path / "a.jsonl"), str(tmp_path / "out")).ok
    # as Arrow prints it: fields named with spaces, values not null (which a Parquet file's schema shows)
    lines = [json.dumps({"id": i, "meta": {"user id": i, "tags": [] if i < 80_000 else ["x"]}}) for i in range(80_010)]
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    declared = "struct<user id: int64, tags: list<element: string not null>>"
    options = {"column_types": {"meta": declared}}
    daskpile.shuffle_parquet(str(tmp_path / "b.jsonl"), str(tmp_path / "out-b"), piles=2, read_options=options)
    assert str(read_output(tmp_path / "out-b").schema.field("meta").type) == declared
