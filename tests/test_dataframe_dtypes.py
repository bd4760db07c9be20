"""Every dtype pandas and Dask produce goes through ``daskpile.shuffle(ddf)`` unchanged.

One test id per dtype: a frame of 60 rows, an int64 ``id`` and the case's column, as a
Dask DataFrame of 4 partitions of which the first and the last are EMPTY, shuffled into
3 piles.  The shuffled frame must have the input's dtypes (lazily and computed), the same
index dtype and name, and the same rows with exactly the same values, in another order.

Dask's settings matter: ``dataframe.convert-string`` (on by default) makes object strings,
pandas 3's ``str``, ``string[python]`` and ``ArrowDtype(large_string)`` into
``string[pyarrow]`` (columns and index), so the ``-noconvert`` cases turn it off to shuffle
those dtypes themselves.  ``dd.read_parquet`` gives a dictionary column a categorical meta
with *no* categories (Dask counts them as known) while its partitions hold ``d0, d1, d2``.
"""

# The bar: Dask's own shuffle, ddf.shuffle(on="id", shuffle_method="tasks", npartitions=3), passes
# check_round_trip (the same four checks) on EVERY round-trip case below, empty partitions
# included (dask 2026.8.0, pandas 3.1.1, pyarrow 26.0.1, sync scheduler). It never leaves pandas,
# so it also round-trips complex128, Sparse[float64, nan] and an object column of ints, strings,
# floats and None; daskpile carries those (which Arrow has no type for) as pickles, and so must too.

from __future__ import annotations

import dataclasses
import datetime
import decimal
import math
from collections.abc import Callable

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import str_dtype

import daskpile

ROWS = 60
ID = np.arange(ROWS)
IDS = ID.tolist()
MISSING = (ID % 7 == 3).tolist()  # rows 3, 10, 17, ...: in the empty first partition and in the kept ones


def per_row(value: Callable[[int], object], ids: list[int] = IDS) -> list:
    """``value(i)`` for every id ``i``, None where ``i % 7 == 3`` (the rows of ``MISSING``)."""
    return [None if i % 7 == 3 else value(i) for i in ids]


def keep_middle(ddf: dd.DataFrame) -> dd.DataFrame:
    """Rows 15..44 of 0..59: of 4 partitions of 15 rows, the first and the last become empty."""
    return ddf[(ddf["id"] >= 15) & (ddf["id"] < 45)]


def from_pandas(values, index=None) -> Callable[[str], dd.DataFrame]:
    """A case built with ``dd.from_pandas`` (in id order: ``sort=False``), then filtered."""

    def build(_parquet_dir: str) -> dd.DataFrame:
        frame = pd.DataFrame({"id": ID, "c": values() if callable(values) else values}, index=index)
        return keep_middle(dd.from_pandas(frame, npartitions=4, sort=False))

    return build


def with_missing(values) -> pd.Series:
    """``values`` with the rows of ``MISSING`` replaced by the dtype's missing value."""
    return pd.Series(values).mask(np.array(MISSING))


# --- nested Parquet, read back by dd.read_parquet (the object columns pandas makes of it) ----------


def nested_table(ids: np.ndarray) -> pa.Table:
    ids = ids.tolist()
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "lists": pa.array(per_row(lambda i: list(range(i % 4)), ids), pa.list_(pa.int64())),
            "structs": pa.array(
                per_row(lambda i: {"a": i, "b": f"s{i}"}, ids),
                pa.struct([("a", pa.int64()), ("b", pa.string())]),
            ),
            "maps": pa.array(
                per_row(lambda i: [("k", i), ("j", -i)], ids),
                pa.map_(pa.string(), pa.int64()),
            ),
            "times": pa.array(
                per_row(lambda i: datetime.time(i % 24, i % 60, 0, i), ids),
                pa.time64("us"),
            ),
            "bytes": pa.array(per_row(lambda i: bytes([i % 256, 0, 255]) * (i % 3), ids)),
            "dictionary": pa.array(per_row(lambda i: f"d{i % 3}", ids)).dictionary_encode(),
            # an embedding: no missing row, so that pandas' object column holds numpy arrays alone
            "embeddings": pa.array(
                [[i / 3, float("nan") if i % 5 == 0 else -i, 0.5, i] for i in ids], pa.list_(pa.float32(), 4)
            ),
        }
    )


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory) -> str:
    """For each nested column, a dataset of ``id`` and that column: 4 files of 15 rows, a partition each.

    Only these two columns: a read of fewer than all columns makes Dask fuse the files into fewer partitions.
    """
    directory = tmp_path_factory.mktemp("nested")
    for k in range(4):
        table = nested_table(np.arange(15 * k, 15 * k + 15))
        for name in table.column_names[1:]:
            (directory / name).mkdir(exist_ok=True)
            pq.write_table(table.select(["id", name]), directory / name / f"part-{k}.parquet")
        # a categorical index, as pandas writes it: dd.read_parquet's meta does not know its categories
        (directory / "category_index").mkdir(exist_ok=True)
        keys = pd.CategoricalIndex([f"k{i % 3}" for i in range(15 * k, 15 * k + 15)], name="key")
        pd.DataFrame({"id": np.arange(15 * k, 15 * k + 15)}, index=keys).to_parquet(
            directory / "category_index" / f"part-{k}.parquet"
        )
    return str(directory)


def middle_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame["id"] >= 15) & (frame["id"] < 45)]


def from_parquet(column: str, **kwargs) -> Callable[[str], dd.DataFrame]:
    def build(parquet_dir: str) -> dd.DataFrame:
        ddf = dd.read_parquet(f"{parquet_dir}/{column}", **kwargs)
        # not keep_middle: Dask would push that filter into read_parquet, which drops the files it excludes
        return ddf.map_partitions(middle_rows, meta=ddf._meta)

    return build


# --- the cases -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[str], dd.DataFrame]
    # dask's "dataframe.convert-string" while the case is built and computed; None leaves the default (on)
    convert_string: bool | None = None
    # the input's categories are unknown to Dask: the output's may come in another order
    unknown_categories: bool = False

    @property
    def param(self):
        return pytest.param(self, id=self.id)


def arrow(values: list, type_: pa.DataType) -> Callable[[], pd.Series]:
    return lambda: pd.Series(pd.arrays.ArrowExtensionArray(pa.array(values, type_)))


def strings() -> list:
    return per_row(lambda i: ["", "é", "a b", "x" * 40][i % 4] + str(i))


def python_strings() -> pd.arrays.StringArray:
    return pd.array(strings(), dtype=pd.StringDtype("python"))


def object_arrays(then: str) -> Callable[[], pd.Series]:
    """Rows 15-29 datetime64 arrays; 30-44 ``then``: float64 arrays with a None, or int32 arrays; 0 to 3 values."""

    def array(i):
        if i < 30:
            return np.array(["2024-01-01", "NaT", "1969-12-31T23:59:59.999"][: i % 4], dtype="datetime64[ms]")
        if then == "float64":
            return None if i == 31 else np.array([i / 7, np.nan, -0.0][: i % 4])
        return np.arange(i, i + i % 4, dtype=np.int32)

    return lambda: pd.Series([array(i) for i in IDS], dtype=object)


def object_strings() -> pd.Series:
    return pd.Series(strings(), dtype=object)


def default_strings() -> pd.Series:
    if str_dtype() is None:
        pytest.skip("pandas before 2.3 has no 'str' dtype")
    series = pd.Series(strings(), dtype=str_dtype())
    assert int(pd.__version__.split(".")[0]) < 3 or pd.Series(strings()).dtype == series.dtype  # pandas 3's default
    return series


def categorical(**kwargs) -> Callable[[], pd.Categorical]:
    return lambda: pd.Categorical(per_row(lambda i: f"c{i % 3}"), **kwargs)


def unknown_categories(_parquet_dir: str, categories_dtype=None) -> dd.DataFrame:
    categories = pd.Index(["c2", "c0", "c1"], dtype=categories_dtype)
    frame = pd.DataFrame({"id": ID, "c": categorical(categories=categories)()})
    ddf = dd.from_pandas(frame, npartitions=4, sort=False)
    ddf = ddf.assign(c=ddf["c"].cat.as_unknown())
    assert not ddf["c"].cat.known
    return keep_middle(ddf)


def unknown_categories_of(categories_dtype) -> Callable[[str], dd.DataFrame]:
    """Unknown categories that are not pandas' default ``str``: Arrow's dictionary alone would give ``str``."""
    return lambda parquet_dir: unknown_categories(parquet_dir, categories_dtype)


def timestamps(unit: str, tz: str | None = None) -> Callable[[], pd.Series]:
    return lambda: with_missing(pd.date_range("2024-03-30 22:00", periods=ROWS, freq="37min", tz=tz).as_unit(unit))


DECIMALS = per_row(lambda i: decimal.Decimal(f"{i}.{i % 100:02d}") * (-1) ** i)
LISTS = per_row(lambda i: list(range(i % 4)))
STRUCTS = per_row(lambda i: {"a": i, "b": f"s{i}"})
MAPS = per_row(lambda i: [("k", i), ("j", -i)])
AWARE = per_row(lambda i: datetime.datetime(2024, 3, 31, tzinfo=datetime.UTC) + datetime.timedelta(minutes=7 * i))

ROUND_TRIP_CASES = [
    # numpy
    Case("int8", from_pandas((ID % 256 - 128).astype(np.int8))),
    Case("int64", from_pandas(ID * -(2**40))),
    Case("uint64", from_pandas(ID.astype(np.uint64) + np.uint64(2**63))),
    Case("float32", from_pandas((ID / 3).astype(np.float32))),
    Case("float64-nan", from_pandas(np.where(MISSING, np.nan, ID / 3))),
    Case("bool", from_pandas(ID % 3 == 0)),
    # pandas' nullable dtypes
    Case(
        "Int64",
        from_pandas(lambda: pd.array(per_row(lambda i: i), dtype="Int64")),
    ),
    Case(
        "boolean",
        from_pandas(lambda: pd.array(per_row(lambda i: i % 2 == 0), "boolean")),
    ),
    Case(
        "Float64",
        from_pandas(lambda: pd.array(per_row(lambda i: i / 3), dtype="Float64")),
    ),
    # strings
    Case("string-pyarrow", from_pandas(lambda: pd.array(strings(), dtype=pd.StringDtype("pyarrow")))),
    Case("string-python", from_pandas(python_strings)),  # dask makes them string[pyarrow]
    Case("string-python-noconvert", from_pandas(python_strings), convert_string=False),
    Case("object-str", from_pandas(object_strings)),  # dask makes them string[pyarrow]
    Case("object-str-noconvert", from_pandas(object_strings), convert_string=False),
    Case("str", from_pandas(default_strings)),  # dask makes them string[pyarrow]
    Case("str-noconvert", from_pandas(default_strings), convert_string=False),
    # categoricals
    Case("category-known", from_pandas(categorical(categories=["c2", "c0", "c1"]))),
    Case("category-ordered", from_pandas(categorical(categories=["c2", "c0", "c1"], ordered=True))),
    Case("category-int", from_pandas(lambda: pd.Categorical(ID % 5 * 10, categories=[40, 30, 20, 10, 0]))),
    Case("category-unknown", unknown_categories, unknown_categories=True),
    Case("category-unknown-string", unknown_categories_of(pd.StringDtype("pyarrow")), unknown_categories=True),
    Case("category-unknown-object", unknown_categories_of(object), unknown_categories=True, convert_string=False),
    Case("category-parquet", from_parquet("dictionary"), unknown_categories=True),
    Case("category-all-missing", from_pandas(lambda: pd.Categorical([None] * ROWS, categories=["a", "b"]))),
    Case("category-all-missing-no-categories", from_pandas(lambda: pd.Series([np.nan] * ROWS, dtype="category"))),
    # of what Arrow's dictionaries did not carry back: zoned times (shifted to UTC), intervals (pd.cut), periods,
    # tuples; and unknown categories with a partition of missing values only (Dask's placeholder came out)
    Case(
        "category-tz",
        from_pandas(lambda: pd.Categorical(pd.date_range("2020-01-01", periods=3, tz="Europe/Paris")[ID % 3])),
    ),
    Case("category-interval", from_pandas(lambda: pd.cut(ID % 90, bins=[-1, 18, 40, 65, 100]))),
    Case(
        "category-period", from_pandas(lambda: pd.Categorical(pd.period_range("2020-01", periods=4, freq="M")[ID % 4]))
    ),
    Case("category-tuples", from_pandas(lambda: pd.Categorical([(int(i) % 3, "x") for i in ID])), convert_string=False),
    Case("index-category-unknown", from_parquet("category_index"), unknown_categories=True),
    # times
    Case("datetime64-ns", from_pandas(timestamps("ns"))),
    Case("datetime64-us", from_pandas(timestamps("us"))),
    Case("datetime64-ns-tz", from_pandas(timestamps("ns", "Europe/Paris"))),
    Case("datetime64-us-tz", from_pandas(timestamps("us", "Europe/Paris"))),
    Case("timedelta64-ns", from_pandas(lambda: with_missing(pd.to_timedelta(ID * 1234567, unit="us").as_unit("ns")))),
    Case("period-D", from_pandas(lambda: with_missing(pd.period_range("2024-01-01", periods=ROWS, freq="D")))),
    Case("interval-int64", from_pandas(lambda: pd.arrays.IntervalArray.from_arrays(ID, ID + 2, closed="left"))),
    Case(
        "interval-float64-nan", from_pandas(lambda: with_missing(pd.arrays.IntervalArray.from_arrays(ID / 2, ID + 0.5)))
    ),
    # pd.ArrowDtype
    Case("arrow-decimal128", from_pandas(arrow(DECIMALS, pa.decimal128(12, 2)))),
    Case("arrow-list-int64", from_pandas(arrow(LISTS, pa.list_(pa.int64())))),
    Case("arrow-struct", from_pandas(arrow(STRUCTS, pa.struct([("a", pa.int64()), ("b", pa.string())])))),
    Case("arrow-large-string", from_pandas(arrow(strings(), pa.large_string()))),  # dask makes them string[pyarrow]
    Case("arrow-large-string-noconvert", from_pandas(arrow(strings(), pa.large_string())), convert_string=False),
    Case("arrow-timestamp-us-tz", from_pandas(arrow(AWARE, pa.timestamp("us", tz="Europe/Paris")))),
    Case("arrow-map", from_pandas(arrow(MAPS, pa.map_(pa.string(), pa.int64())))),
    # indexes
    Case("index-named", from_pandas(ID % 5, index=pd.Index(ID * 10 + 3, name="key"))),
    Case("index-str", from_pandas(ID % 5, index=pd.Index([f"r{i}" for i in ID], name="key"))),
    Case(
        "index-str-noconvert",
        from_pandas(ID % 5, index=pd.Index([f"r{i}" for i in ID], name="key")),
        convert_string=False,
    ),
    Case("index-range-named", from_pandas(ID % 5, index=pd.RangeIndex(ROWS, name="row"))),
    # nested Parquet as dd.read_parquet makes it: object columns of numpy arrays, dicts, tuples, times, bytes
    Case("parquet-object-list", from_parquet("lists")),
    Case("parquet-object-struct", from_parquet("structs")),
    Case("parquet-object-map", from_parquet("maps")),
    Case("parquet-object-time", from_parquet("times")),
    Case("parquet-object-bytes", from_parquet("bytes")),
    Case("parquet-object-bytes-noconvert", from_parquet("bytes"), convert_string=False),
    Case("parquet-object-embeddings", from_parquet("embeddings")),  # carried as raw bytes, not pickles
    # ... and with dtype_backend="pyarrow"
    Case("parquet-arrow-list", from_parquet("lists", dtype_backend="pyarrow")),
    Case("parquet-arrow-struct", from_parquet("structs", dtype_backend="pyarrow")),
    Case("parquet-arrow-map", from_parquet("maps", dtype_backend="pyarrow")),
    Case("parquet-arrow-time", from_parquet("times", dtype_backend="pyarrow")),
    Case("parquet-arrow-bytes", from_parquet("bytes", dtype_backend="pyarrow")),
    Case("parquet-arrow-dictionary", from_parquet("dictionary", dtype_backend="pyarrow")),
]
ROUND_TRIP_CASES += [
    Case("complex128", from_pandas(ID * (1 + 2j))),
    Case("sparse", from_pandas(lambda: pd.arrays.SparseArray(np.where(ID % 4 == 0, ID / 2, np.nan)))),
    # with convert-string on, dask turns the column into strings itself ('1', '2.5')
    Case("object-mixed", from_pandas(lambda: pd.Series([1, "a", 2.5, None] * 15, dtype=object)), convert_string=False),
    # numpy arrays, a partition's of one dtype carried as raw bytes, in piles that mix them with other dtypes'
    # and with pickles (a partition with a None)
    Case("object-arrays-pickled-too", from_pandas(object_arrays("float64")), convert_string=False),
    Case("object-arrays-of-two-dtypes", from_pandas(object_arrays("int32")), convert_string=False),
]
CASES = {case.id: case for case in ROUND_TRIP_CASES}
assert len(CASES) == len(ROUND_TRIP_CASES)


# --- the checks ----------------------------------------------------------------------------------


def convert_string(case: Case):
    if case.convert_string is None:
        return dask.config.set({})
    return dask.config.set({"dataframe.convert-string": case.convert_string})


def assert_same_dtype(actual, expected, what: str, unknown_categories: bool = False) -> None:
    """Equal and with the same repr: pandas calls some distinct dtypes equal (string storage, NA vs NaN)."""
    if unknown_categories and isinstance(expected, pd.CategoricalDtype):
        assert isinstance(actual, pd.CategoricalDtype), f"{what}: {actual!r} is not categorical like {expected!r}"
        assert actual.ordered == expected.ordered, what
        assert actual.categories.dtype == expected.categories.dtype, f"{what}: {actual!r} != {expected!r}"
        assert set(actual.categories) == set(expected.categories), f"{what}: {actual!r} != {expected!r}"
        return
    assert actual == expected and repr(actual) == repr(expected), f"{what}: {actual!r} != {expected!r}"


def assert_same_dtypes(actual: pd.DataFrame, expected: pd.DataFrame, where: str, unknown_categories=False) -> None:
    assert list(actual.columns) == list(expected.columns), where
    for name in expected.columns:
        assert_same_dtype(actual[name].dtype, expected[name].dtype, f"{where} column {name!r}", unknown_categories)
    assert_same_dtype(actual.index.dtype, expected.index.dtype, f"{where} index")
    assert actual.index.name == expected.index.name, f"{where} index name"


def same_value(a, b) -> bool:
    """Exactly the same Python value: same type, NaN only equal to NaN, None only to None."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and all(map(same_value, a.tolist(), b.tolist()))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(map(same_value, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def assert_same_rows(out: pd.DataFrame, expected: pd.DataFrame, unknown_categories: bool = False) -> None:
    """The same rows, compared in id order: values exactly equal, object values of the same type."""
    out = out.sort_values("id", kind="stable")
    expected = expected.sort_values("id", kind="stable")
    for name in expected.columns:
        if expected[name].dtype == object:
            bad = [(a, b) for a, b in zip(out[name], expected[name], strict=True) if not same_value(a, b)]
            assert not bad, f"column {name!r} values: {len(bad)} differ, (out, expected) {bad[:2]}"
        elif unknown_categories and isinstance(expected[name].dtype, pd.CategoricalDtype):
            out[name] = out[name].cat.reorder_categories(expected[name].cat.categories)
    pd.testing.assert_frame_equal(
        out.drop(columns=[n for n in expected.columns if expected[n].dtype == object]),
        expected.drop(columns=[n for n in expected.columns if expected[n].dtype == object]),
        check_exact=True,
        check_index_type="equiv",  # a RangeIndex cannot survive a shuffle; its dtype and name are checked
        check_column_type=True,
        check_categorical=True,
    )


def check_round_trip(case: Case, ddf: dd.DataFrame, shuffled: dd.DataFrame) -> None:
    expected = ddf.compute()
    # (1) the lazy result's dtypes are the input's
    assert_same_dtypes(shuffled._meta, ddf._meta, "lazy (shuffled vs ddf)")
    pd.testing.assert_series_equal(shuffled.dtypes, ddf.dtypes)
    # (2) so are the computed ones
    out = shuffled.compute()
    assert_same_dtypes(out, expected, "computed (out vs ddf.compute())", case.unknown_categories)
    # (3) the same rows, exactly
    assert len(out) == len(expected) == 30
    assert_same_rows(out, expected, case.unknown_categories)
    # (4) in another order
    assert not out["id"].is_monotonic_increasing


def build(case: Case, parquet_dir: str) -> dd.DataFrame:
    ddf = case.build(parquet_dir)
    assert ddf.npartitions == 4
    # meta given: Dask cannot make up a non-empty interval column to infer it
    assert ddf.map_partitions(len, meta=("rows", "int64")).compute().tolist() == [0, 15, 15, 0]
    return ddf


@pytest.mark.parametrize("case", [case.param for case in ROUND_TRIP_CASES])
def test_dtype_round_trips(case, parquet_dir, sync_scheduler):
    with convert_string(case):
        ddf = build(case, parquet_dir)
        shuffled = daskpile.shuffle(ddf, piles=3, seed=7)
        assert shuffled.npartitions == 3
        check_round_trip(case, ddf, shuffled)


TRICKIEST = [
    "object-str-noconvert",
    "category-unknown",
    "category-parquet",
    "datetime64-us-tz",
    "interval-float64-nan",
    "arrow-struct",
    "index-range-named",
    "parquet-object-list",
    "object-arrays-pickled-too",
]


@pytest.mark.slow
@pytest.mark.parametrize("case", [CASES[name].param for name in TRICKIEST])
def test_dtype_round_trips_on_a_cluster(case, parquet_dir, client):
    with convert_string(case):
        ddf = build(case, parquet_dir)
        check_round_trip(case, ddf, daskpile.shuffle(ddf, piles=3, seed=7))


def test_numpy_arrays_are_carried_as_their_bytes_and_come_back_writable():
    """An object column of 1-D numpy arrays of one dtype (pandas' Parquet lists: embeddings) is carried as their
    bytes, not a pickle each (ten times the time of the rest of the shuffle); they come back as arrays of their
    dtype (byte order too) that can be written to, each its own rows."""
    from daskpile.dataframe._pandas import OBJECTS, FrameCodec

    codec = FrameCodec(pd.DataFrame({"v": pd.Series([], dtype=object)}), index=False)
    frame = pd.DataFrame({"v": [np.array([1.5, np.nan], np.float32), np.array([], np.float32), np.ones(3, np.float32)]})
    table = codec.to_arrow(frame)
    assert table.column(0).type == OBJECTS and table.column(0).combine_chunks().field("pickle").null_count == 3
    back = codec.to_pandas(pa.concat_tables([table.slice(1), table.slice(0, 1)]))["v"].tolist()
    assert [a.dtype for a in back] == [np.float32] * 3 and [len(a) for a in back] == [0, 3, 2]
    assert np.isnan(back[2][1]) and back[2][0] == 1.5 and all(a.flags.writeable for a in back)
    back[1][0] = 7  # its own memory: the next row is not changed
    assert back[2][0] == 1.5
    big_endian = pd.DataFrame({"v": [np.array([1.5, 2.5], ">f8"), np.array([-3.0], ">f8")]})  # (FITS, h5py)
    back = codec.to_pandas(codec.to_arrow(big_endian))["v"].tolist()
    assert [a.dtype.str for a in back] == [">f8", ">f8"] and [a.tolist() for a in back] == [[1.5, 2.5], [-3.0]]
    mixed = pd.DataFrame({"v": [np.array([1.5], np.float32), np.array([1], np.int64)]})
    assert codec.to_arrow(mixed).column(0).combine_chunks().field("raw").null_count == 2  # two dtypes: pickles
