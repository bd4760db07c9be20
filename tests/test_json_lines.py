"""JSON lines in, JSON lines out: each line kept as written, checked to be one JSON object.

The oracles are independent of daskpile's reader: Python's ``split`` for the
lines and pyarrow's whole-file JSON reader for what other tools read.
"""

import collections
import io
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from _util import daskpile_command

import daskpile
from daskpile._manifest import read as read_manifest

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
    "bad, message",
    [
        (b'{"a": 1}{"a": 2}', r"line at byte 9,000 holds several JSON values, not one object"),
        (b'{"a":\n 1}', r"line at byte 9,000 is not one JSON object \(b'\{\"a\":'\)"),
        (b"[1, 2]", r"line at byte 9,000 is not one JSON object"),
        (b'"text"', r"line at byte 9,000 is not one JSON object"),
        (b'{"a": [1, {"b": tru}]}', r"line at byte 9,000: JSON parse error: Invalid value$"),
        (b'{"a": "caf\xe9"}', r"invalid UTF-8 at byte 9,010$"),
        (b'{"a": "tab\tinside"}', r"line at byte 9,000: JSON parse error"),
    ],
)
def test_a_line_that_is_not_one_json_object_is_refused_naming_its_byte(tmp_path, bad, message):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(b'{"a": 1}\n' * 1000 + bad + b'\n{"a": 3}\n')  # in the last of many ranges
    dest = tmp_path / "out"
    args = ("--output-format", "jsonl", "--blocksize", "16KiB", "--scheduler", "sync")
    done = daskpile_command("shuffle", str(source), str(dest), *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(r"bad\.jsonl' as jsonl: .*" + message, done.stderr.strip()), done.stderr
    assert not dest.exists()


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


def test_json_lines_kept_as_written_can_go_to_parquet_as_one_binary_column(tmp_path, sync_scheduler):
    source = tmp_path / "corpus.jsonl"
    source.write_bytes(CORPUS)
    daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=2, read_options={"as_written": True})
    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "out").glob("*.parquet")))
    assert table.column_names == ["json"]
    assert collections.Counter(table.column("json").to_pylist()) == collections.Counter(objects_in(CORPUS))
    assert daskpile.verify(str(source), str(tmp_path / "out")).ok
