"""Arrow extension types (and view layouts) are shuffled and fingerprinted through their storage."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import read_output

import daskpile
from daskpile.checks import _fingerprint


class Rgb(pa.ExtensionType):
    """A user's own extension type, registered as users do."""

    def __init__(self):
        super().__init__(pa.struct([("r", pa.uint8()), ("g", pa.uint8()), ("b", pa.uint8())]), "test.rgb")

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()


pa.register_extension_type(Rgb())
N = 200


def storage_of(name: str) -> pa.Array:
    rng = np.random.default_rng(0)
    if name == "uuid":
        return pa.ExtensionArray.from_storage(pa.uuid(), pa.array([rng.bytes(16) for _ in range(N)], pa.binary(16)))
    if name == "json":
        return pa.ExtensionArray.from_storage(pa.json_(), pa.array([f'{{"k": {i}}}' for i in range(N)]))
    if name == "bool8":
        return pa.ExtensionArray.from_storage(pa.bool8(), pa.array(rng.integers(0, 2, N), pa.int8()))
    if name == "fixed-shape tensor":
        tensor = pa.fixed_shape_tensor(pa.int32(), (2, 2))
        return pa.ExtensionArray.from_storage(
            tensor, pa.array([[i, i + 1, i + 2, i + 3] for i in range(N)], pa.list_(pa.int32(), 4))
        )
    if name == "opaque":
        return pa.ExtensionArray.from_storage(
            pa.opaque(pa.binary(), "geometry", "postgis"), pa.array([rng.bytes(5) for _ in range(N)])
        )
    if name == "user-registered":
        storage = pa.array([{"r": i % 256, "g": 2 * i % 256, "b": 3 * i % 256} for i in range(N)], Rgb().storage_type)
        return pa.ExtensionArray.from_storage(Rgb(), storage)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["uuid", "json", "bool8", "fixed-shape tensor", "opaque", "user-registered"])
def test_extension_types_are_shuffled_and_verified(sync_scheduler, tmp_path, name):
    column = storage_of(name)
    table = pa.table({"id": pa.array(range(N), pa.int64()), "x": column})
    os.makedirs(tmp_path / "src")
    pq.write_table(table.slice(0, N // 2), tmp_path / "src" / "a.parquet")
    pq.write_table(table.slice(N // 2), tmp_path / "src" / "b.parquet")
    report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=3, seed=1)
    assert report.fingerprint.rows == N
    out = read_output(tmp_path / "out").sort_by("id")
    expected = pq.read_table(tmp_path / "src").sort_by("id")  # as Parquet gives the type back
    assert out.schema.field("x").type == expected.schema.field("x").type
    assert out.column("x").combine_chunks().storage.equals(expected.column("x").combine_chunks().storage)
    assert daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out")).ok


def test_an_extension_array_has_the_fingerprint_of_its_storage():
    column = storage_of("uuid")
    assert _fingerprint.of(pa.table({"u": column})) == _fingerprint.of(pa.table({"u": column.storage}))
    changed = pa.ExtensionArray.from_storage(
        pa.uuid(), pa.array([b"\0" * 16, *column.storage.to_pylist()[1:]], pa.binary(16))
    )
    assert _fingerprint.of(pa.table({"u": changed})) != _fingerprint.of(pa.table({"u": column}))


def test_duckdb_uuid_columns_are_verified(sync_scheduler, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    os.makedirs(tmp_path / "src")
    duckdb.sql(f"COPY (SELECT range AS id, uuid() AS u FROM range(500)) TO '{tmp_path}/src/a.parquet' (FORMAT parquet)")
    report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, seed=1)
    assert report.rows == 500 and daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out")).ok
    source = pq.read_table(tmp_path / "src")
    assert sorted(read_output(tmp_path / "out")["u"].to_pylist(), key=str) == sorted(source["u"].to_pylist(), key=str)


@pytest.mark.parametrize("output_format", ["csv", "jsonl"])
def test_extension_columns_are_refused_as_text_before_the_run(tmp_path, output_format):
    """A DuckDB trial: UUID and JSON columns into CSV or JSON lines failed with Arrow's "Unsupported Type"
    naming no column, or mid-run leaving its state behind.  Refused before the run, naming the column."""
    duckdb = pytest.importorskip("duckdb")
    (tmp_path / "src").mkdir()
    query = "SELECT range AS id, uuid() AS u, '{\"a\": 1}'::JSON AS j FROM range(10)"
    duckdb.sql(f"COPY ({query}) TO '{tmp_path / 'src' / 'x.parquet'}' (FORMAT PARQUET)")
    with pytest.raises(
        ValueError,
        match=rf"output_format='{output_format}' writes values as text, and Arrow cannot "
        r"write column 'u' \(extension<arrow\.uuid>\) so: cast it to a string",
    ):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, output_format=output_format)
    assert not (tmp_path / "out").exists()


def test_views_are_fingerprinted_as_their_plain_layouts():
    for view, plain in [
        (pa.array(["a", None, "ccc"], pa.string_view()), pa.array(["a", None, "ccc"], pa.large_string())),
        (pa.array([b"a", None, b"ccc"], pa.binary_view()), pa.array([b"a", None, b"ccc"], pa.large_binary())),
    ]:
        assert _fingerprint.of(pa.table({"v": view})) == _fingerprint.of(pa.table({"v": plain}))


def test_a_type_that_cannot_be_fingerprinted_names_the_column_and_no_verify():
    intervals = pa.array([pa.scalar((1, 2, 3), pa.month_day_nano_interval())] * 3)
    with pytest.raises(TypeError, match=r"column 'when': unsupported Arrow type .*--no-verify"):
        _fingerprint.of(pa.table({"when": intervals}))


def test_a_long_column_of_a_users_extension_type_is_taken():
    """Above VIEW_TAKE_MIN_ROWS, a take looks for a view layout: a Python extension type is unhashable."""
    from daskpile import _kernels

    rows = _kernels.VIEW_TAKE_MIN_ROWS
    channel = pa.array(np.arange(rows) % 256, pa.uint8())
    storage = pa.StructArray.from_arrays([channel] * 3, names=["r", "g", "b"])
    table = pa.table({"c": pa.ExtensionArray.from_storage(Rgb(), storage)})
    order = np.random.default_rng(0).permutation(rows)
    assert _kernels.take(table, order).equals(table.take(order))
