"""Parquet lakes as they are: partition folders, evolved schemas, sidecars and strays, many sources, bad files.

Each output is checked against what the user's other tools read from the
same lake (``pyarrow.dataset`` with hive partitioning), as a multiset of rows.
"""

import itertools
import os
import warnings

import dask
import dask.dataframe as dd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from _util import file_bytes, read_output

import daskpile
from daskpile.cli import main as cli_main
from daskpile.sources import plan_sources


def rows(table: pa.Table) -> list:
    """A table's rows as a sorted list (a multiset), whatever the column order."""
    names = sorted(table.column_names)
    return sorted((tuple(str(r[n]) for n in names) for r in table.to_pylist()), key=str)


def shuffle(source, dest, **kwargs):
    kwargs.setdefault("piles", 3)
    kwargs.setdefault("seed", 7)
    return daskpile.shuffle_parquet(source, str(dest), **kwargs)


@pytest.fixture
def hive_lake(tmp_path):
    """Two levels of key=value folders, URL-encoded values and the default (null) partition."""
    table = pa.table({
        "id": pa.array(range(600), pa.int64()),
        "v": pa.array([i / 7 for i in range(600)]),
        "year": [2023, 2024, 2025] * 200,
        "city": ["New York", "a/b", None, "Zürich"] * 150,
    })  # fmt: skip
    root = tmp_path / "lake"
    ds.write_dataset(
        table, root, format="parquet", partitioning=["year", "city"], partitioning_flavor="hive",
        max_rows_per_file=40, max_rows_per_group=40,
    )  # fmt: skip
    return str(root)


def test_partition_folders_become_columns_as_pyarrow_reads_them(sync_scheduler, hive_lake, tmp_path):
    report = shuffle(hive_lake, tmp_path / "out")
    out = read_output(tmp_path / "out")
    expected = ds.dataset(hive_lake, format="parquet", partitioning="hive").to_table()
    assert out.schema.remove_metadata() == expected.schema.remove_metadata()  # year int32, city string, last
    assert rows(out) == rows(expected)
    assert None in out["city"].to_pylist() and "a/b" in out["city"].to_pylist()  # default partition, URL-decoded
    assert report.source_description["partition_keys"] == {"year": "int32", "city": "string"}
    # the keys are fingerprinted: the files without their folders are another dataset
    assert daskpile.verify(hive_lake, str(tmp_path / "out")).ok
    assert not daskpile.verify(hive_lake, str(tmp_path / "out"), partitioning="none").ok


def test_partition_folders_that_are_links_are_read_through_as_pyarrow_reads_them(sync_scheduler, hive_lake, tmp_path):
    """A lake whose year=... folders are links (to where the data lives): refused with "[Errno 21] Is a
    directory", since fsspec lists a link to a folder as one entry and does not go in."""
    linked = tmp_path / "linked"
    linked.mkdir()
    for folder in sorted(os.listdir(hive_lake)):
        os.symlink(os.path.join(hive_lake, folder), linked / folder)
    shuffle(str(linked), tmp_path / "out")
    expected = ds.dataset(str(linked), format="parquet", partitioning="hive").to_table()
    assert rows(read_output(tmp_path / "out")) == rows(expected) and expected.num_rows == 600
    assert daskpile.verify(str(linked), str(tmp_path / "out")).ok
    os.symlink(hive_lake, linked / "again")  # the lake's own folders once more: every row twice, or a loop
    with pytest.raises(
        ValueError, match=r"source folder '.*linked/.*' is a link to '.*lake.*', which the source reads"
    ):
        shuffle(str(linked), tmp_path / "twice")
    assert not (tmp_path / "twice").exists()


def test_dask_reads_the_same_values(sync_scheduler, tmp_path):
    table = pa.table({"id": range(300), "year": [2023, 2024, 2025] * 100, "city": ["New York", "a/b", "c"] * 100})
    lake = str(tmp_path / "lake")  # (no default partition: Dask's reader fails on one, "couldn't infer type")
    ds.write_dataset(table, lake, format="parquet", partitioning=["year", "city"], partitioning_flavor="hive")
    shuffle(lake, tmp_path / "out")
    theirs = dd.read_parquet(lake).compute()
    ours = read_output(tmp_path / "out").to_pandas()
    key = ["id", "year", "city"]
    theirs = theirs.astype({"year": "int64", "city": "string"}).sort_values("id")[key].reset_index(drop=True)
    ours = ours.astype({"year": "int64", "city": "string"}).sort_values("id")[key].reset_index(drop=True)
    assert theirs.equals(ours)


def test_declared_partition_types_and_none(sync_scheduler, hive_lake, tmp_path):
    shuffle(hive_lake, tmp_path / "typed", partitioning=pa.schema([("year", pa.int16()), ("city", pa.string())]))
    assert read_output(tmp_path / "typed").schema.field("year").type == pa.int16()
    cli_main_exit(["shuffle", hive_lake, str(tmp_path / "cli"), "--piles", "3", "--seed", "7", "--scheduler", "sync",
                   "--partitioning", "year:int16,city:string", "-q"])  # fmt: skip
    assert file_bytes(tmp_path / "cli") == file_bytes(tmp_path / "typed")
    shuffle(hive_lake, tmp_path / "none", partitioning="none")
    assert read_output(tmp_path / "none").column_names == ["id", "v"]
    with pytest.raises(ValueError, match=r"'date' \(for key 'day'\) is not an Arrow type \(string, int32, .*date32"):
        shuffle(hive_lake, tmp_path / "sql", partitioning="day:date")  # (a DuckDB user's name: Arrow's is date32)


def test_a_value_too_large_for_int32_makes_the_key_a_string(sync_scheduler, tmp_path):
    for value in ["1", "99999999999"]:
        os.makedirs(tmp_path / "lake" / f"n={value}")
        pq.write_table(pa.table({"id": [int(value)]}), tmp_path / "lake" / f"n={value}" / "a.parquet")
    shuffle(str(tmp_path / "lake"), tmp_path / "out")
    expected = ds.dataset(str(tmp_path / "lake"), format="parquet", partitioning="hive").schema
    assert read_output(tmp_path / "out").schema.field("n").type == expected.field("n").type == pa.string()


def test_a_key_that_is_also_a_column_is_read_from_the_folders_where_they_agree(sync_scheduler, tmp_path):
    """polars' write_parquet(partition_by=...) keeps the key in the files too: that was refused (from the
    Spark-lake trial).  Where every row holds its folder's value (a null under __HIVE_DEFAULT_PARTITION__) the
    lake is read; a file that holds another value is refused, naming it and the value."""
    import polars

    polars.DataFrame({"id": [1, 2, 3], "k": ["a", "b", None]}).write_parquet(tmp_path / "polars", partition_by=["k"])
    shuffle(str(tmp_path / "polars"), tmp_path / "polars-out")
    assert sorted(read_output(tmp_path / "polars-out").to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "k": "a"}, {"id": 2, "k": "b"}, {"id": 3, "k": None},
    ]  # fmt: skip
    assert daskpile.verify(str(tmp_path / "polars"), str(tmp_path / "polars-out")).ok
    os.makedirs(tmp_path / "lake" / "year=2024")
    pq.write_table(pa.table({"id": [1, 2], "year": [2024, 2023]}), tmp_path / "lake" / "year=2024" / "a.parquet")
    with pytest.raises(ValueError, match=r"column 'year' of .*a\.parquet' holds 2023 where its partition folder say"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    shuffle(str(tmp_path / "lake"), tmp_path / "out", partitioning="none")  # the file's column, as it says
    assert sorted(read_output(tmp_path / "out")["year"].to_pylist()) == [2023, 2024]


def test_a_folder_s_small_files_turned_at_once_still_name_the_file_that_is_refused(sync_scheduler, tmp_path):
    """A folder's small files in one piece are put in the plan's schema at once (its key repeated once for all,
    not once a file: a lake of 30,000 files of 200 rows spent a fifth of pass 1 there).  A refusal still names
    the file it is about, not the first of the folder's, and the rows of those that are read are all there."""
    for i in range(5):
        year = [2024, 2023] if i == 3 else [2024, 2024]
        write(str(tmp_path / "lake" / "year=2024" / f"part-{i}.parquet"), id=[2 * i, 2 * i + 1], year=year)
    with pytest.raises(ValueError, match=r"column 'year' of .*part-3\.parquet' holds 2023 where its partition folder"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    os.remove(tmp_path / "lake" / "year=2024" / "part-3.parquet")
    write(str(tmp_path / "lake" / "year=2025" / "part-0.parquet"), id=[6, 7], year=[2025, 2025])
    shuffle(str(tmp_path / "lake"), tmp_path / "out", piles=2)
    rows = sorted(read_output(tmp_path / "out").to_pylist(), key=lambda row: row["id"])
    assert rows == [{"id": i, "year": 2025 if i in (6, 7) else 2024} for i in range(10)]


def test_keys_polars_writes_in_the_files_too_keep_the_files_types_and_places(sync_scheduler, tmp_path):
    """Polars' partition_by keeps the keys in the files: they came out typed as their folders spell them (a
    Date, a Boolean and an Enum as strings, an Int16 as int32) and moved to the end.  Polars reads the source
    with the files' types, in their places; so does the result now.  Declared types still win."""
    import datetime

    polars = pytest.importorskip("polars")  # in the bench extra, which the test venv installs

    frame = polars.DataFrame({
        "v": range(12),
        "day": [datetime.date(2024, 1, 1 + i % 2) for i in range(12)],
        "flag": [i % 3 == 0 for i in range(12)],
        "tier": polars.Series(["lo", "hi", "mid"] * 4, dtype=polars.Enum(["lo", "mid", "hi", "unused"])),
        "year": polars.Series([2023, 2024] * 6, dtype=polars.Int16),
        "w": [f"w{i}" for i in range(12)],
    })  # fmt: skip
    frame.write_parquet(tmp_path / "lake", partition_by=["day", "flag", "tier", "year"])
    source = polars.read_parquet(tmp_path / "lake")
    assert source.schema == frame.schema  # (what Polars reads: the files' types, in their order)
    shuffle(str(tmp_path / "lake"), tmp_path / "out")
    out = polars.read_parquet(str(tmp_path / "out" / "*.parquet"))
    assert out.schema == frame.schema and out.sort("v").equals(frame)
    assert daskpile.verify(str(tmp_path / "lake"), str(tmp_path / "out")).ok
    shuffle(str(tmp_path / "lake"), tmp_path / "declared", partitioning="day:string,flag:string,tier:string,year:int32")
    declared = polars.read_parquet(str(tmp_path / "declared" / "*.parquet"))
    assert declared.columns == frame.columns
    assert declared.schema["day"] == polars.String and declared.schema["year"] == polars.Int32
    assert daskpile.verify(str(tmp_path / "lake"), str(tmp_path / "declared")).ok


def test_verify_reads_a_source_in_the_order_of_its_results_columns(sync_scheduler, tmp_path):
    """A result made before keys the files hold kept their place holds them last: verify reads the source so."""
    from daskpile.sources import read_pieces

    os.makedirs(tmp_path / "lake" / "k=a")
    pq.write_table(pa.table({"id": [1, 2], "k": ["a", "a"], "w": [0.5, 1.5]}), tmp_path / "lake" / "k=a" / "f.parquet")
    plan = plan_sources(str(tmp_path / "lake"))
    assert plan.schema.names == ["id", "k", "w"] and plan.in_order(["id", "w", "k"]).schema.names == ["id", "w", "k"]
    [(_, table)] = read_pieces(plan.fs, list(plan.files), plan.in_order(["id", "w", "k"]).reading, 2**20)
    assert table.column_names == ["id", "w", "k"] and table.to_pylist()[0] == {"id": 1, "w": 0.5, "k": "a"}
    assert plan.in_order(["id", "k"]) is plan  # (not its columns: as it is)


def test_partition_folders_at_different_depths_are_refused(sync_scheduler, tmp_path):
    for sub in ["year=2024/month=1", "year=2024"]:
        os.makedirs(tmp_path / "lake" / sub, exist_ok=True)
        pq.write_table(pa.table({"id": [1]}), tmp_path / "lake" / sub / "a.parquet")
    with pytest.raises(ValueError, match=r"folders of '.*year=2024/a\.parquet' are \['year'\], those of "
                                         r"'.*month=1/a\.parquet' are \['year', 'month'\]: .*same depth"):  # fmt: skip
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    # a key not declared: the file, and the declaration that reads it (a new user's trial: neither was said)
    with pytest.raises(ValueError, match=r"folders \(of '.*month=1/a\.parquet'\) have keys \['month'\] that "
                                         r"partitioning= does not declare: declare them too \(--partitioning "
                                         r"year:int16,month:string\)"):  # fmt: skip
        shuffle(str(tmp_path / "lake" / "year=2024" / "month=1"), tmp_path / "out", partitioning="year:int16")
    os.makedirs(tmp_path / "twice" / "a=1" / "a=2")  # (every file with the same keys: a bare StopIteration)
    pq.write_table(pa.table({"id": [1]}), tmp_path / "twice" / "a=1" / "a=2" / "f.parquet")
    with pytest.raises(ValueError, match=r"folders of '.*f\.parquet' name a key twice \(\['a', 'a'\]\)"):
        shuffle(str(tmp_path / "twice"), tmp_path / "out")


# -- evolved schemas ---------------------------------------------------------------------------------------------


def write(path, **columns):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns) if not isinstance(columns.get("table"), pa.Table) else columns["table"], path)


PROMOTIONS = {
    "added column": (pa.table({"id": [1, 2]}), pa.table({"id": [3], "w": ["x"]})),
    "int32 to int64": (pa.table({"id": pa.array([1, 2], pa.int32())}), pa.table({"id": pa.array([2**40], pa.int64())})),
    "dictionary to string": (
        pa.table({"id": pa.array(["a", "b"]).dictionary_encode()}),
        pa.table({"id": pa.array(["c"])}),
    ),
    "int to float": (pa.table({"id": [1, 2]}), pa.table({"id": [2.5]})),
    "timestamp units": (
        pa.table({"id": pa.array([1, 2], pa.timestamp("ms"))}),
        pa.table({"id": pa.array([3], pa.timestamp("us"))}),
    ),
    "a column dropped": (pa.table({"id": [1, 2], "w": [1.0, 2.0]}), pa.table({"id": [3]})),
}


@pytest.mark.parametrize("case", PROMOTIONS)
def test_unify_takes_the_union_with_promotions(sync_scheduler, tmp_path, case):
    first, second = PROMOTIONS[case]
    os.makedirs(tmp_path / "lake")
    pq.write_table(first, tmp_path / "lake" / "a.parquet")
    pq.write_table(second, tmp_path / "lake" / "b.parquet")
    with pytest.raises(ValueError, match=r"schema of .*b\.parquet.* differs .*--schema unify"):
        shuffle(str(tmp_path / "lake"), tmp_path / "strict")
    assert not (tmp_path / "strict").exists()
    report = shuffle(str(tmp_path / "lake"), tmp_path / "out", schema="unify")
    expected_schema = pa.unify_schemas(
        [pa.schema([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in s])
         for s in (first.schema, second.schema)], promote_options="permissive",
    )  # fmt: skip
    out = read_output(tmp_path / "out")
    assert out.schema.remove_metadata() == expected_schema
    expected = pa.concat_tables(
        [t.cast(pa.schema([f for f in expected_schema if f.name in t.column_names])) for t in (first, second)],
        promote_options="permissive",
    )
    assert rows(out) == rows(expected)
    manifest = daskpile.read_manifest(str(tmp_path / "out"))
    assert manifest["source"]["schema_policy"] == "unify" and manifest["schema"][0]["name"] == "id"
    assert report.fingerprint is not None
    assert daskpile.verify(str(tmp_path / "lake"), str(tmp_path / "out")).ok  # reads the source unified too


def test_an_impossible_promotion_names_both_files_and_the_column(sync_scheduler, tmp_path):
    write(str(tmp_path / "lake" / "a.parquet"), v=[1, 2])
    write(str(tmp_path / "lake" / "b.parquet"), v=["x"])
    with pytest.raises(ValueError, match=r"column 'v' is int64 in '.*a\.parquet' and string in '.*b\.parquet'"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out", schema="unify")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("nesting", ["a column", "a struct's field"])
def test_decimals_unified_past_38_digits_are_refused(sync_scheduler, tmp_path, nesting):
    """decimal(38,2) and decimal(38,10) unify to decimal256(46,10): written and "verified", but Polars refused
    to read it and DuckDB read it as a double, digits lost; in a struct, Spark refused it."""
    import decimal

    def write(name, value, precision, scale):
        kind = pa.decimal128(precision, scale)
        column = pa.array([decimal.Decimal(value)], kind)
        if nesting == "a struct's field":
            column = pa.StructArray.from_arrays([column], ["amount"])
        pq.write_table(pa.table({"d": column}), tmp_path / "lake" / name)

    (tmp_path / "lake").mkdir()
    write("a.parquet", "1.25", 38, 2)
    write("b.parquet", "0.5", 38, 10)
    with pytest.raises(ValueError, match=r"column 'd' is .* in .*a\.parquet.* and .*: .*more than 38 digits"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out", schema="unify")
    assert not (tmp_path / "out").exists()
    write("a.parquet", "1.25", 20, 2)
    write("b.parquet", "0.5", 20, 10)
    shuffle(str(tmp_path / "lake"), tmp_path / "out", schema="unify")  # decimal128(28, 10) holds both
    unified = read_output(tmp_path / "out").schema.field("d").type
    assert unified == (
        pa.decimal128(28, 10) if nesting == "a column" else pa.struct([("amount", pa.decimal128(28, 10))])
    )


STRICT_TOLERATES = {
    "column order": (pa.table({"id": [1], "v": ["a"]}), pa.table({"v": ["b"], "id": [2]})),
    "nullable flag": (
        pa.table({"id": [1]}, schema=pa.schema([pa.field("id", pa.int64(), nullable=False)])),
        pa.table({"id": [2]}),
    ),
    "string and large_string": (pa.table({"v": pa.array(["a"])}), pa.table({"v": pa.array(["b"], pa.large_string())})),
    "a zero-row file of null columns": (pa.table({"v": pa.array(["a"])}), pa.table({"v": pa.array([], pa.null())})),
    # Polars writes large strings and lists at every level: refused inside structs and maps before
    "large strings in a struct": (
        pa.table({"v": pa.array([{"b": "x"}], pa.struct([("b", pa.string())]))}),
        pa.table({"v": pa.array([{"b": "y"}], pa.struct([("b", pa.large_string())]))}),
    ),
    "large strings in a map": (
        pa.table({"v": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))}),
        pa.table({"v": pa.array([[("j", 2)]], pa.map_(pa.large_string(), pa.int64()))}),
    ),
    "a large list of structs of large strings": (
        pa.table({"v": pa.array([[{"b": "x"}]], pa.list_(pa.struct([("b", pa.string())])))}),
        pa.table({"v": pa.array([[{"b": "y"}]], pa.large_list(pa.struct([("b", pa.large_string())])))}),
    ),
}


@pytest.mark.parametrize("case", STRICT_TOLERATES)
def test_strict_passes_differences_that_change_no_value(sync_scheduler, tmp_path, case):
    first, second = STRICT_TOLERATES[case]
    write(str(tmp_path / "lake" / "a.parquet"), table=first)
    write(str(tmp_path / "lake" / "b.parquet"), table=second)
    if case == "a zero-row file of null columns":  # the zero-row file first: the schema comes from one with rows
        os.rename(tmp_path / "lake" / "b.parquet", tmp_path / "lake" / "0.parquet")
    shuffle(str(tmp_path / "lake"), tmp_path / "out")
    out = read_output(tmp_path / "out")
    assert out.schema.remove_metadata().names == first.column_names  # the first file's order and types
    assert out.schema.field(0).type == first.schema.field(0).type
    assert rows(out) == rows(pa.concat_tables([first, second.select(first.column_names).cast(first.schema)]))


@pytest.mark.parametrize("null_file_first", [True, False])
def test_a_lake_of_zero_row_files_one_of_null_columns_is_shuffled_as_zero_rows(
    sync_scheduler, tmp_path, null_file_first
):
    """No file with rows: the schema came from the last file, and a null-typed one then refused the typed
    ones ("s: string instead of null"), as on a day with no events."""
    typed = pa.table({"id": pa.array([], pa.int64()), "s": pa.array([], pa.string())})
    nulls = pa.table({"id": pa.array([], pa.int64()), "s": pa.array([], pa.null())})
    write(str(tmp_path / "lake" / "a.parquet"), table=nulls if null_file_first else typed)
    write(str(tmp_path / "lake" / "b.parquet"), table=typed if null_file_first else nulls)
    shuffle(str(tmp_path / "lake"), tmp_path / "out")
    out = read_output(tmp_path / "out")
    assert out.num_rows == 0 and out.schema.field("s").type == pa.string()


def test_categoricals_coded_in_other_widths_are_said_so(sync_scheduler, tmp_path):
    """pandas codes a categorical in int8 up to 127 categories and int16 beyond: a day of 200 labels was
    refused as "dictionary<..., indices=int16> instead of dictionary<..., indices=int8>", and told to convert."""
    import pandas as pd

    (tmp_path / "lake").mkdir()
    for name, labels in [("a", 3), ("b", 200)]:
        categories = pd.Categorical([f"c{i % labels}" for i in range(400)])
        pd.DataFrame({"id": range(400), "cat": categories}).to_parquet(tmp_path / "lake" / f"{name}.parquet")
    with pytest.raises(ValueError, match=r"cat: .* \(categories coded in int16, not int8: pandas codes a categorical"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")


# -- sidecars, strays, several sources -----------------------------------------------------------------------------


def test_sidecars_and_markers_are_not_data_and_strays_are_listed(sync_scheduler, tmp_path, capsys):
    lake = tmp_path / "lake"
    table = pa.table({"id": list(range(100))})
    os.makedirs(lake)
    collector = []
    pq.write_to_dataset(table, lake, metadata_collector=collector, basename_template="part-{i}.parquet")
    for c in collector:
        c.set_file_path("part-0.parquet")
    pq.write_metadata(table.schema, lake / "_common_metadata")
    pq.write_metadata(table.schema, lake / "_metadata", metadata_collector=collector)
    for name in ["_SUCCESS", "._SUCCESS.crc", ".part-0.parquet.crc", "_committed_123", "_started_123", "README.txt"]:
        (lake / name).write_text("not data")
    plan = plan_sources(str(lake))
    assert [os.path.basename(f.path) for f in plan.files] == ["part-0.parquet"]
    assert plan.reading.reference == "_metadata" and plan.metadata.num_rows == 100  # planning from the sidecar
    report = shuffle(str(lake), tmp_path / "out")
    assert report.rows == 100 and [os.path.basename(f) for f in report.skipped_files] == ["README.txt"]
    assert "skipped, not data: 1 file (" in str(report)
    with pytest.raises(ValueError, match=r"README\.txt' is not a Parquet file"):
        shuffle(str(lake), tmp_path / "strict", stray_files="error")


def test_several_directories_and_globs_in_one_command(tmp_path, capsys):
    for d, start in [("a", 0), ("b", 100), ("c", 200)]:
        write(str(tmp_path / d / "x.parquet"), id=list(range(start, start + 100)))
    write(str(tmp_path / "c" / "y.other.parquet"), id=list(range(300, 310)))
    cli_main_exit(["shuffle", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c" / "*.other.parquet"),
                   str(tmp_path / "out"), "--piles", "2", "--seed", "1", "--scheduler", "sync", "-q"])  # fmt: skip
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == list(range(200)) + list(range(300, 310))
    with pytest.raises(
        ValueError, match=rf"x\.parquet' is named by two sources: '{tmp_path / 'a'}' and '.*\*\.parquet'"
    ):
        shuffle([str(tmp_path / "a"), str(tmp_path / "a" / "*.parquet")], tmp_path / "twice")
    with pytest.raises(ValueError, match=rf"is named by two sources: '.*x\.parquet' and '{tmp_path / 'a'}'"):
        shuffle([str(tmp_path / "a" / "x.parquet"), str(tmp_path / "a")], tmp_path / "twice")


def test_a_file_two_sources_name_through_a_link_is_refused_nothing_written(tmp_path):
    """By name, ``day1/x.parquet`` and ``day1-link/x.parquet`` (a linked folder), or a hard link, were two files:
    read twice, and verified (a new user's trial, appending a day).  Locally, a file is its device and inode."""
    write(str(tmp_path / "day1" / "x.parquet"), id=list(range(100)))
    (tmp_path / "day1-link").symlink_to(tmp_path / "day1")
    os.link(tmp_path / "day1" / "x.parquet", tmp_path / "x-hard.parquet")
    for second in (tmp_path / "day1-link", tmp_path / "day1-link" / "x.parquet", tmp_path / "x-hard.parquet"):
        said = r"(x-hard|day1-link/x)\.parquet'.* is '.*day1/x\.parquet'.* under another name, through a link: its rows"
        with pytest.raises(ValueError, match=said):
            shuffle([str(tmp_path / "day1"), str(second)], tmp_path / "twice")
        assert not (tmp_path / "twice").exists()
    write(str(tmp_path / "day2" / "x.parquet"), id=list(range(100, 200)))  # a copy, not a link: two files
    shuffle([str(tmp_path / "day1"), str(tmp_path / "day2")], tmp_path / "two")
    assert sorted(read_output(tmp_path / "two")["id"].to_pylist()) == list(range(200))


def cli_main_exit(argv):
    with pytest.raises(SystemExit) as e:
        cli_main(argv)
    assert e.value.code in (0, None), e.value.code


def test_a_folder_with_data_only_in_sub_folders_is_read_recursively(sync_scheduler, tmp_path):
    write(str(tmp_path / "lake" / "2024" / "01" / "a.parquet"), id=[1, 2])
    write(str(tmp_path / "lake" / "2024" / "02" / "b.parquet"), id=[3])
    shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert sorted(read_output(tmp_path / "out")["id"].to_pylist()) == [1, 2, 3]


# -- many small files ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_many_small_files_are_read_in_groups_decided_by_bytes(tmp_path, client):
    table = pa.table({"id": pa.array(range(30_000), pa.int64()), "v": pa.array(range(30_000), pa.float64())})
    os.makedirs(tmp_path / "small")
    for k in range(300):
        pq.write_table(table.slice(100 * k, 100), tmp_path / "small" / f"f-{k:04d}.parquet")
    plan = plan_sources(str(tmp_path / "small"))
    size = plan.files[0].size
    groups = plan.partitions(blocksize=16 * 30 * size)  # about 30 files of `size` bytes a task
    assert 9 <= len(groups) <= 11 and sum(len(g) for g in groups) == 300
    for group, following in itertools.pairwise(groups):  # each as full as it can be
        assert sum(f.size for f in group) <= 30 * size < sum(f.size for f in group) + following[0].size
    report = shuffle(str(tmp_path / "small"), tmp_path / "out", blocksize=16 * 30 * size)
    assert report.rows == 30_000 and sorted(read_output(tmp_path / "out")["id"].to_pylist()) == list(range(30_000))
    with dask.config.set(scheduler="sync"):
        shuffle(str(tmp_path / "small"), tmp_path / "sync", blocksize=16 * 30 * size)
    assert file_bytes(tmp_path / "out") == file_bytes(tmp_path / "sync")  # a function of the files and blocksize


# -- bad lakes -----------------------------------------------------------------------------------------------------


def test_a_truncated_file_is_named_and_nothing_is_written(sync_scheduler, tmp_path):
    for k in range(3):
        write(str(tmp_path / "lake" / f"{k}.parquet"), id=list(range(k * 10, k * 10 + 10)))
    data = (tmp_path / "lake" / "1.parquet").read_bytes()
    (tmp_path / "lake" / "1.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cannot read '.*1\.parquet' as Parquet"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_that_vanishes_after_listing_is_named(sync_scheduler, tmp_path):
    from daskpile.engine import _passes, _scratch

    for k in range(2):
        write(str(tmp_path / "lake" / f"{k}.parquet"), id=[k])
    plan = plan_sources(str(tmp_path / "lake"))
    os.remove(tmp_path / "lake" / "1.parquet")
    scratch = _scratch.Scratch.create(str(tmp_path / "scratch"), None, 1)
    with pytest.raises(FileNotFoundError, match=r"1\.parquet"):
        _passes.scatter_partition(plan.fs, list(plan.files), 0, 2, 1, scratch, plan.reading)


def test_an_empty_lake_and_a_lake_of_strays_say_so(tmp_path):
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"matches no files$"):
        plan_sources(str(tmp_path / "empty"))
    (tmp_path / "empty" / "notes.md").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"only files that are not Parquet, such as '.*notes\.md'"):
        plan_sources(str(tmp_path / "empty"))


def test_the_command_prints_the_unified_schema(tmp_path):
    from click.testing import CliRunner

    from daskpile.cli import cli

    write(str(tmp_path / "lake" / "a.parquet"), id=pa.array([1], pa.int32()))
    write(str(tmp_path / "lake" / "b.parquet"), id=[2], w=["x"])
    args = [str(tmp_path / "lake"), str(tmp_path / "out"), "--piles", "2", "--seed", "1", "--scheduler", "sync"]
    refused = CliRunner().invoke(cli, ["shuffle", *args])
    assert refused.exit_code == 2 and "--schema unify" in refused.output
    result = CliRunner().invoke(cli, ["shuffle", *args, "--schema", "unify"])
    assert result.exit_code == 0, result.output
    assert "source: 2 files, schema unify (id: int64, w: string)" in result.output


def test_a_file_pyarrow_opens_but_cannot_read_is_named(sync_scheduler, tmp_path):
    """Its footer is whole, so planning passes; a page in the middle is garbled, so pass 1's read fails."""
    path = tmp_path / "lake" / "garbled.parquet"
    write(str(path), id=list(range(1000)), s=[str(i) * 5 for i in range(1000)])
    column = pq.ParquetFile(path).metadata.row_group(0).column(1)
    data = bytearray(path.read_bytes())
    middle = (column.dictionary_page_offset or column.data_page_offset) + column.total_compressed_size // 2
    data[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(data)
    with pytest.raises(ValueError, match=r"cannot read '.*garbled\.parquet' as Parquet: Corrupt snappy"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_keys_of_a_glob_a_file_and_a_sub_folder_are_kept(sync_scheduler, tmp_path):
    """Every key=value folder of a file's path counts, as DuckDB reads them."""
    for k in ["x", "y"]:
        write(str(tmp_path / "lake" / f"k={k}" / "p.parquet"), id=[1 if k == "x" else 2])
    for n, source in enumerate([
        str(tmp_path / "lake" / "k=x" / "*.parquet"),
        str(tmp_path / "lake" / "k=x" / "p.parquet"),
        str(tmp_path / "lake" / "k=x"),
        [str(tmp_path / "lake" / "k=x" / "p.parquet"), str(tmp_path / "lake" / "k=y" / "p.parquet")],
    ]):  # fmt: skip
        plan = plan_sources(source)
        assert [dict(f.keys)["k"].as_py() for f in plan.files] == (["x"] if n < 3 else ["x", "y"])


def test_a_glob_of_folders_reads_the_files_in_them(sync_scheduler, tmp_path):
    """'lake/day=00[0-1]' named the folders of two days and read "no files": a folder a glob names holds data
    as a folder named alone does, its key=value folders counted from above the wildcard."""
    for day in ["000", "001", "002"]:
        write(str(tmp_path / "lake" / f"day={day}" / "sub" / "p.parquet"), id=[int(day)])
    plan = plan_sources(str(tmp_path / "lake" / "day=00[0-1]"))
    assert [dict(f.keys)["day"].as_py() for f in plan.files] == [0, 1]
    assert all(f.path.endswith("sub/p.parquet") for f in plan.files)
    days = str(tmp_path / "lake" / "day=00[0-1]")
    assert daskpile.verify(days, days).ok
    write(str(tmp_path / "lake" / "top.parquet"), id=[9])  # a glob that matches files reads them alone
    assert [os.path.basename(f.path) for f in plan_sources(str(tmp_path / "lake" / "*")).files] == ["top.parquet"]


def test_partition_values_are_ints_only_as_pyarrow_parses_them(tmp_path):
    for value in ["1_000", "5"]:  # Python's int() takes "1_000"; pyarrow and DuckDB read a string
        write(str(tmp_path / "lake" / f"n={value}" / "a.parquet"), id=[1])
    assert plan_sources(str(tmp_path / "lake")).schema.field("n").type == pa.string()


def test_upper_case_extensions_are_parquet(tmp_path):
    write(str(tmp_path / "lake" / "A.PARQUET"), id=[1])
    write(str(tmp_path / "lake" / "b.Parquet"), id=[2])
    plan = plan_sources(str(tmp_path / "lake"))
    assert len(plan.files) == 2 and not plan.skipped


def test_every_parquet_extension_in_use_is_read(tmp_path):
    """A .pqt beside .parquet files was skipped as not data, where pandas reads it."""
    for k, name in enumerate(["a.parquet", "b.parq", "c.pq", "d.pqt", "e.snappy.parquet"]):
        write(str(tmp_path / "lake" / name), id=[k])
    plan = plan_sources(str(tmp_path / "lake"))
    assert len(plan.files) == 5 and not plan.skipped


def test_a_column_the_first_file_declares_never_null_takes_another_file_s_nulls(sync_scheduler, tmp_path):
    """Spark declares its columns NOT NULL; a file of another writer with a null in one was refused ("has
    nulls, which the dataset's schema forbids") where nullability is said to be free to differ.  Columns
    come out nullable, whatever the files declare; verify and the loader read them."""
    not_null = pa.schema([pa.field("x", pa.int64(), nullable=False), pa.field("y", pa.string(), nullable=False)])
    write(str(tmp_path / "lake" / "a.parquet"), table=pa.table({"x": [1, 3], "y": ["a", "c"]}, schema=not_null))
    write(str(tmp_path / "lake" / "b.parquet"), table=pa.table({"x": [None, 2], "y": ["b", None]}))
    shuffle(str(tmp_path / "lake"), tmp_path / "out")
    out = read_output(tmp_path / "out")
    assert sorted(zip(out["x"].to_pylist(), out["y"].to_pylist(), strict=True), key=str) == sorted(
        [(1, "a"), (3, "c"), (None, "b"), (2, None)], key=str
    )
    assert all(f.nullable for f in out.schema) and daskpile.verify(str(tmp_path / "out")).ok
    loaded = daskpile.PileLoader(str(tmp_path / "out"), batch_size=3, seed=0)
    assert sum(b.num_rows for b in loaded) == 4


def test_unify_keeps_a_column_nullable_if_any_file_has_nulls_in_it(sync_scheduler, tmp_path):
    not_null = pa.schema([pa.field("x", pa.int64(), nullable=False)])
    write(str(tmp_path / "lake" / "a.parquet"), table=pa.table({"x": [1]}, schema=not_null))
    write(str(tmp_path / "lake" / "b.parquet"), x=pa.array([None, 2], pa.int64()))
    shuffle(str(tmp_path / "lake"), tmp_path / "out", schema="unify")
    assert sorted(read_output(tmp_path / "out")["x"].to_pylist(), key=str) == [1, 2, None]


NOFILE_SCRIPT = """
import json, resource, sys
import dask, daskpile
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
with dask.config.set(scheduler="sync"):
    report = daskpile.shuffle_parquet(sys.argv[1], sys.argv[2], piles=2, seed=1)
print(json.dumps(report.rows))
"""


@pytest.mark.slow
def test_a_group_of_more_files_than_may_be_open_at_once(tmp_path):
    """A task reads hundreds of tiny files one after the other: it never holds them all open."""
    from _util import run_in_fresh_process

    for k in range(400):
        write(str(tmp_path / "lake" / f"f{k:03d}.parquet"), id=[k])
    assert len(plan_sources(str(tmp_path / "lake")).partitions(256 * 2**20)) == 1
    assert run_in_fresh_process(NOFILE_SCRIPT, str(tmp_path / "lake"), str(tmp_path / "out")) == 400


@pytest.mark.parametrize("schema_from", ["a file", "_metadata", "unify"])
def test_spark_int96_timestamps_are_read_as_spark_reads_them(sync_scheduler, tmp_path, schema_from):
    """Spark writes timestamps as INT96, which pyarrow reads as nanoseconds by default: its 9999-12-31 and
    0001-01-01 sentinels wrapped to 1816 and 1754, were written so, and verification (reading alike) agreed."""
    import datetime

    lake = tmp_path / "lake"
    lake.mkdir()
    stamps = [datetime.datetime(9999, 12, 31, 23, 59, 59), datetime.datetime(1, 1, 1), None]
    stamps += [datetime.datetime(2024, 5, 6, 7, 8, 9, 123456)] * 97
    table = pa.table({"id": range(100), "valid_to": pa.array(stamps, pa.timestamp("us"))})
    collector = []
    for k in range(2):
        part = table.slice(50 * k, 50)
        pq.write_table(part, lake / f"part-{k}.parquet", use_deprecated_int96_timestamps=True)
        collector.append(pq.read_metadata(lake / f"part-{k}.parquet"))
        collector[-1].set_file_path(f"part-{k}.parquet")
    if schema_from == "_metadata":
        pq.write_metadata(
            table.schema, lake / "_metadata", metadata_collector=collector, use_deprecated_int96_timestamps=True
        )
    assert pq.read_metadata(lake / "part-0.parquet").schema.column(1).physical_type == "INT96"
    kwargs = {"schema": "unify"} if schema_from == "unify" else {}
    report = shuffle(str(lake), tmp_path / "out", **kwargs)
    out = read_output(tmp_path / "out").sort_by("id")
    assert out.column("valid_to").type == pa.timestamp("us")
    assert out.column("valid_to").to_pylist() == stamps and report.fingerprint is not None
    assert daskpile.verify(str(lake), str(tmp_path / "out")).ok


def test_a_spark_lake_that_moved_from_int96_to_utc_timestamps_unifies_as_utc(sync_scheduler, tmp_path):
    """From the Spark-lake trial: a writer whose spark.sql.parquet.outputTimestampType moved from INT96 to
    TIMESTAMP_MICROS left naive and UTC columns of one timestamp, refused even with schema='unify' (DuckDB and
    Spark read them as one).  INT96 is Spark's instant, adjusted to UTC; a naive column stored otherwise is not."""
    import datetime

    lake = tmp_path / "lake"
    lake.mkdir()
    old, new = datetime.datetime(2024, 1, 1, 12), datetime.datetime(2025, 1, 1, 12)
    pq.write_table(pa.table({"id": [1], "ts": pa.array([old], pa.timestamp("us"))}), lake / "part-0.parquet",
                   use_deprecated_int96_timestamps=True, store_schema=False)  # fmt: skip
    pq.write_table(pa.table({"id": [2], "ts": pa.array([new], pa.timestamp("us", "UTC"))}), lake / "part-1.parquet")
    with pytest.raises(ValueError, match=r"ts: timestamp\[us, tz=UTC\] instead of timestamp\[us\]"):
        shuffle(str(lake), tmp_path / "strict")  # strict: the two types differ
    shuffle(str(lake), tmp_path / "out", schema="unify")
    out = read_output(tmp_path / "out").sort_by("id")
    assert out.column("ts").type == pa.timestamp("us", "UTC")
    utc = datetime.UTC
    assert [t.astimezone(utc) for t in out.column("ts").to_pylist()] == [
        old.replace(tzinfo=utc),
        new.replace(tzinfo=utc),
    ]
    assert daskpile.verify(str(lake), str(tmp_path / "out")).ok
    naive = tmp_path / "naive"  # a naive column not stored as INT96 (Spark's TIMESTAMP_NTZ): no instant to take
    naive.mkdir()
    pq.write_table(pa.table({"id": [1], "ts": pa.array([old], pa.timestamp("us"))}), naive / "part-0.parquet")
    pq.write_table(pa.table({"id": [2], "ts": pa.array([new], pa.timestamp("us", "UTC"))}), naive / "part-1.parquet")
    with pytest.raises(ValueError, match="no type holds both"):
        shuffle(str(naive), tmp_path / "naive-out", schema="unify")


def spark_schema(fields: dict[str, str]) -> bytes:
    """Spark's schema key, as Spark writes it in each file's footer."""
    import json

    listed = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields.items()]
    return json.dumps({"type": "struct", "fields": listed}).encode()


@pytest.mark.parametrize("case", ["partition folders", "INT96 timestamps", "the same columns", "UTC timestamps"])
def test_spark_s_schema_key_is_kept_only_where_it_still_describes_the_rows(sync_scheduler, tmp_path, case):
    """Spark reads a file's columns from the key its writer put in the footer: copied into the output, it hid
    the key=value columns from Spark, and named as "timestamp" a column written without a time zone, which
    Spark refused to read."""
    from daskpile.sources.schemas import SPARK_SCHEMA_KEY

    lake = tmp_path / "lake" / ("day=1" if case == "partition folders" else "")
    lake.mkdir(parents=True)
    stamps = pa.array([0, 1], pa.timestamp("us", tz="UTC" if case == "UTC timestamps" else None))
    table = pa.table({"id": [1, 2], "ts": stamps})
    kinds = {"id": "long", "ts": "timestamp_ntz" if case in ("partition folders", "the same columns") else "timestamp"}
    table = table.replace_schema_metadata({SPARK_SCHEMA_KEY: spark_schema(kinds)})
    pq.write_table(
        table, lake / "part-00000.snappy.parquet", use_deprecated_int96_timestamps=case == "INT96 timestamps"
    )
    shuffle(str(tmp_path / "lake"), tmp_path / "out", piles=1)
    written = pq.read_schema(tmp_path / "out" / "part-00000.parquet").metadata or {}
    assert (SPARK_SCHEMA_KEY in written) == (case in ("the same columns", "UTC timestamps"))


def test_spark_s_schema_key_is_not_kept_when_files_are_unified(sync_scheduler, tmp_path):
    """The union's key was the first file's: an integer column promoted to long was still 'integer' in it, and
    Spark failed reading the result."""
    from daskpile.sources.schemas import SPARK_SCHEMA_KEY

    (tmp_path / "lake").mkdir()
    for name, kind, spark in [("a", pa.int32(), "integer"), ("b", pa.int64(), "long")]:
        table = pa.table({"n": pa.array([1, 2], kind)})
        table = table.replace_schema_metadata({SPARK_SCHEMA_KEY: spark_schema({"n": spark})})
        pq.write_table(table, tmp_path / "lake" / f"{name}.parquet")
    shuffle(str(tmp_path / "lake"), tmp_path / "out", piles=1, schema="unify")
    written = pq.read_schema(tmp_path / "out" / "part-00000.parquet")
    assert written.field("n").type == pa.int64() and SPARK_SCHEMA_KEY not in (written.metadata or {})


@pytest.mark.parametrize("schema", ["strict", "unify"])
def test_a_duckdb_interval_which_the_output_cannot_hold_is_refused(tmp_path, schema):
    """pyarrow reads a Parquet INTERVAL as 12 bytes and cannot write it back: DuckDB read the result's column
    as a BLOB, and verification, comparing bytes, agreed."""
    duckdb = pytest.importorskip("duckdb")
    (tmp_path / "lake").mkdir()
    path = tmp_path / "lake" / "x.parquet"
    duckdb.sql(f"COPY (SELECT range AS id, to_seconds(range) AS waited FROM range(10)) TO '{path}' (FORMAT PARQUET)")
    with pytest.raises(ValueError, match=r"column 'waited' of '.*x\.parquet' is a Parquet INTERVAL"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out", schema=schema)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["the first file", "a later file"])
def test_a_duckdb_time_with_time_zone_which_the_output_cannot_hold_is_refused(sync_scheduler, tmp_path, where):
    """A DuckDB trial: TIMETZ (a Parquet TIME adjusted to UTC) came back a plain TIME, pyarrow having no time
    with a time zone, and verify, comparing the times, said match.  Refused in the first file before the run;
    in a later one (the same Arrow type, strict lets it through) by the task reading it.  pyarrow up to 21
    marked every time adjusted to UTC: its files are read as before."""
    import datetime

    duckdb = pytest.importorskip("duckdb")
    (tmp_path / "lake").mkdir()
    plain = "SELECT range AS id, TIME '12:34:56' AS t FROM range(10)"
    zoned = "SELECT range AS id, TIMETZ '12:34:56+05:30' AS t FROM range(10)"
    for name, query in zip("ab", [zoned, plain] if where == "the first file" else [plain, zoned], strict=True):
        duckdb.sql(f"COPY ({query}) TO '{tmp_path / 'lake' / name}.parquet' (FORMAT PARQUET)")
    named = "a" if where == "the first file" else "b"
    with pytest.raises(ValueError, match=rf"column 't' of '.*{named}\.parquet' is DuckDB's TIME WITH TIME ZONE"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "pyarrow").mkdir()
    times = pa.table({"id": [1, 2], "t": [datetime.time(1), datetime.time(2)]})
    as_21 = {"write_time_adjusted_to_utc": True} if int(pa.__version__.split(".")[0]) >= 22 else {}  # (21's way)
    pq.write_table(times, tmp_path / "pyarrow" / "a.parquet", **as_21)
    assert "isAdjustedToUTC=true" in str(pq.ParquetFile(tmp_path / "pyarrow" / "a.parquet").schema)
    shuffle(str(tmp_path / "pyarrow"), tmp_path / "pyarrow-out")
    assert sorted(read_output(tmp_path / "pyarrow-out")["t"].to_pylist()) == [datetime.time(1), datetime.time(2)]


def test_unify_keeps_pandas_metadata_only_where_every_file_shares_it(sync_scheduler, tmp_path):
    """The first file's was kept: its index, absent from the other file, came back as an index of floats and
    NaNs in pandas, or a column, depending on which file sorted first."""
    import pandas as pd

    (tmp_path / "lake").mkdir()
    pd.DataFrame({"x": [1, 2]}, index=pd.Index([10, 20], name="k")).to_parquet(tmp_path / "lake" / "a.parquet")
    pd.DataFrame({"x": [3, 4]}).to_parquet(tmp_path / "lake" / "b.parquet")
    shuffle(str(tmp_path / "lake"), tmp_path / "out", piles=1, schema="unify")
    frame = pd.read_parquet(tmp_path / "out")
    assert "k" in frame.columns and sorted(frame["x"]) == [1, 2, 3, 4]  # a column, null in b's rows, as documented


def test_unify_takes_timestamps_of_two_time_zones_as_utc_instants(sync_scheduler, tmp_path):
    """DuckDB writes TIMESTAMPTZ as UTC, pandas and Polars with a named zone: unify said "no type holds both",
    though both are UTC instants."""
    import datetime

    (tmp_path / "lake").mkdir()
    instant = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    pq.write_table(pa.table({"t": pa.array([instant], pa.timestamp("us", "UTC"))}), tmp_path / "lake" / "a.parquet")
    paris = pa.array([instant], pa.timestamp("ns", "UTC")).cast(pa.timestamp("ns", "Europe/Paris"))
    pq.write_table(pa.table({"t": paris}), tmp_path / "lake" / "b.parquet")
    shuffle(str(tmp_path / "lake"), tmp_path / "out", piles=1, schema="unify")
    out = read_output(tmp_path / "out")
    assert out.schema.field("t").type == pa.timestamp("ns", "UTC") and out["t"].to_pylist() == [instant] * 2
    assert daskpile.verify(str(tmp_path / "lake"), str(tmp_path / "out")).ok


def test_strict_takes_nested_fields_whose_nulls_differ_as_nullable(sync_scheduler, tmp_path):
    """A map whose values a file declares never null, beside one that holds nulls, failed in pass 2 on a cast
    naming no file; then was refused, as were lists and structs whose fields' flags differ (Spark writes
    array<bigint> with containsNull false or true as the array was built), and structs of other field orders
    (Spark's, as selected), which DuckDB reads together (a new user's trial).  Nested fields come out nullable,
    as the columns do."""
    lake = tmp_path / "lake"
    lake.mkdir()
    never_null = pa.field("x", pa.int64(), nullable=False)
    pq.write_table(pa.table({
        "m": pa.array([[("k", 1)]], pa.map_(pa.string(), never_null.with_name("value"))),
        "l": pa.array([[1]], pa.list_(never_null.with_name("element"))),
        "s": pa.array([{"a": 1, "b": "x"}], pa.struct([never_null.with_name("a"), ("b", pa.string())])),
    }), lake / "a.parquet")  # fmt: skip
    pq.write_table(pa.table({
        "m": pa.array([[("k", None)]], pa.map_(pa.string(), pa.int64())),
        "l": pa.array([[2, None]], pa.list_(pa.int64())),
        "s": pa.array([{"b": "y", "a": None}], pa.struct([("b", pa.string()), ("a", pa.int64())])),
    }), lake / "b.parquet")  # fmt: skip
    shuffle(str(lake), tmp_path / "out")
    result = read_output(tmp_path / "out")
    assert sorted(map(str, result.to_pylist())) == sorted(map(str, [
        {"m": [("k", 1)], "l": [1], "s": {"a": 1, "b": "x"}},
        {"m": [("k", None)], "l": [2, None], "s": {"a": None, "b": "y"}},
    ]))  # fmt: skip
    assert result.schema.field("s").type == pa.struct([("a", pa.int64()), ("b", pa.string())])


@pytest.mark.parametrize("more", ["a.parquet", "b.parquet"])
def test_strict_refuses_structs_of_other_fields_naming_the_file(sync_scheduler, tmp_path, more):
    """A struct with a field more in one file than in the other: "daskpile: error: index out of bounds", and
    a run state left to resume, when the file with the field more came second."""
    (tmp_path / "lake").mkdir()
    for name in ["a.parquet", "b.parquet"]:
        value = {"x": 1, "y": 2, "z": 3} if name == more else {"x": 1, "y": 2}
        pq.write_table(pa.table({"s": [value]}), tmp_path / "lake" / name)
    with pytest.raises(ValueError, match=r"schema of '.*b\.parquet' differs from that of '.*a\.parquet': s: "):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_polars_enums_of_other_categories_are_refused_strict_and_unified_as_categoricals(sync_scheduler, tmp_path):
    """Polars keeps an Enum's categories in the column's metadata: every output file took the first file's, so
    Polars read another file's values as null ('z' in Enum(['x', 'y'])), and verify, which reads Arrow, said
    match.  Strict refuses files whose column metadata differ, as Polars does; unify keeps only the metadata
    every file shares (Polars reads a Categorical); an Enum the same in every file stays one."""
    polars = pytest.importorskip("polars")  # in the bench extra, which the test venv installs

    def lake(name, *categories):
        os.makedirs(tmp_path / name)
        for file, ids, values, kinds in zip("ab", [[1, 2], [3, 4]], [["x", "y"], ["z", "x"]], categories, strict=True):
            frame = polars.DataFrame({"id": ids, "e": polars.Series(values, dtype=polars.Enum(kinds))})
            frame.write_parquet(tmp_path / name / f"{file}.parquet")
        return str(tmp_path / name)

    def read(out):
        return polars.read_parquet(str(tmp_path / out / "*.parquet")).sort("id")

    evolved = lake("evolved", ["x", "y"], ["x", "y", "z"])
    with pytest.raises(ValueError, match=r"b\.parquet' differs .*: e: metadata _PL_ENUM_VALUES2='1;x1;y1;z' "):
        shuffle(evolved, tmp_path / "strict")
    assert not (tmp_path / "strict").exists()
    shuffle(evolved, tmp_path / "unified", schema="unify")
    assert read("unified")["e"].to_list() == ["x", "y", "z", "x"] and read("unified")["e"].dtype == polars.Categorical
    assert daskpile.verify(evolved, str(tmp_path / "unified")).ok
    same = lake("same", ["x", "y", "z"], ["x", "y", "z"])
    for schema in ["strict", "unify"]:
        shuffle(same, tmp_path / schema, schema=schema)
        assert read(schema).equals(polars.read_parquet(same).sort("id")), schema
    # An Enum inside a list keeps its categories on the list's field; a Polars Categorical (tagged) beside a
    # pyarrow file's dictionary column (not) is the same type to every reader, and passes strict
    os.makedirs(tmp_path / "nested")
    for file, ids, values, kinds in [("a", [1], [["x"]], ["x", "y"]), ("b", [2], [["z"]], ["x", "y", "z"])]:
        frame = polars.DataFrame({"id": ids, "l": polars.Series(values, dtype=polars.List(polars.Enum(kinds)))})
        frame.write_parquet(tmp_path / "nested" / f"{file}.parquet")
    with pytest.raises(ValueError, match=r"b\.parquet' differs .*: l: metadata element _PL_ENUM_VALUES2='1;x1;y1;z' "):
        shuffle(str(tmp_path / "nested"), tmp_path / "nested-strict")
    shuffle(str(tmp_path / "nested"), tmp_path / "nested-unified", schema="unify")
    assert read("nested-unified")["l"].to_list() == [["x"], ["z"]]
    os.makedirs(tmp_path / "tagged")
    polars.DataFrame({"c": polars.Series(["x"], dtype=polars.Categorical)}).write_parquet(
        tmp_path / "tagged" / "a.parquet"
    )
    tag = pq.read_schema(tmp_path / "tagged" / "a.parquet").field("c")
    assert tag.metadata  # (Polars' tag, which a pyarrow file's column lacks)
    pq.write_table(
        pa.table({"c": pa.array(["y"]).dictionary_encode().cast(tag.type)}), tmp_path / "tagged" / "b.parquet"
    )
    shuffle(str(tmp_path / "tagged"), tmp_path / "tagged-out")
    assert sorted(polars.read_parquet(str(tmp_path / "tagged-out" / "*.parquet"))["c"].cast(str).to_list()) == [
        "x",
        "y",
    ]


def test_unify_keeps_pandas_metadata_written_by_other_versions_of_pandas(sync_scheduler, tmp_path):
    import json

    import pandas as pd

    (tmp_path / "lake").mkdir()
    for name, version in [("a", "2.2.3"), ("b", "3.1.1")]:
        table = pa.Table.from_pandas(pd.DataFrame({"x": [1, 2]}, index=pd.Index([1, 2], name="k")))
        pandas = json.loads(table.schema.metadata[b"pandas"])
        pandas["pandas_version"] = version
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
        pq.write_table(table, tmp_path / "lake" / f"{name}.parquet")
    shuffle(str(tmp_path / "lake"), tmp_path / "out", piles=1, schema="unify")
    assert pd.read_parquet(tmp_path / "out").index.name == "k"  # the index, as both files have it


def test_a_column_of_128_bit_integers_is_refused_with_what_to_do(sync_scheduler, tmp_path):
    """Polars writes Int128 as Parquet INT(128), which Arrow cannot open, column name and all."""
    polars = pytest.importorskip("polars")  # in the bench extra: none of our dependencies writes INT(128)
    (tmp_path / "lake").mkdir()
    polars.DataFrame({"id": [1, 2], "big": polars.Series([1, 2], dtype=polars.Int128)}).write_parquet(
        tmp_path / "lake" / "wide.parquet"
    )
    with pytest.raises(ValueError, match=r"'.*wide\.parquet' as Parquet: .*Polars' Int128: cast it to Int64"):
        shuffle(str(tmp_path / "lake"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("schema", ["strict", "unify"])
def test_geoparquet_metadata_says_what_every_output_file_holds(tmp_path, schema):
    """Each GeoParquet file's metadata gives its own geometries' bbox and types; every output file holds rows of
    every input file, so it gets their union (the first file's bbox left rows outside it: a reader skipping files
    by bbox would skip them), and no bbox where one file has none."""
    import json
    import struct

    def point(x, y):
        return struct.pack("<BIdd", 1, 1, x, y)

    def write(directory, name, x0, types, bbox=True):
        column = {"encoding": "WKB", "geometry_types": types, "crs": None}
        if bbox:
            column["bbox"] = [x0, -x0, x0 + 1, -x0 + 1]
        geo = {"version": "1.1.0", "primary_column": "geometry", "columns": {"geometry": column}}
        table = pa.table({"id": [x0, x0 + 1], "geometry": [point(x0, -x0), point(x0 + 1, -x0 + 1)]})
        pq.write_table(table.replace_schema_metadata({"geo": json.dumps(geo)}), directory / name)

    def output_geo(dest):
        found = []
        for name in sorted(os.listdir(dest)):
            if name.endswith(".parquet"):
                xs = [struct.unpack("<BIdd", g)[2] for g in pq.read_table(dest / name)["geometry"].to_pylist()]
                found.append((json.loads(pq.read_schema(dest / name).metadata[b"geo"]), xs))
        return found

    lake = tmp_path / "lake"
    lake.mkdir()
    for i, (x0, types) in enumerate([(0, ["Point"]), (100, ["Point"]), (50, ["Point Z"])]):
        write(lake, f"f{i}.parquet", x0, types)
    shuffle(lake, tmp_path / "out", piles=2, seed=1, schema=schema)
    for geo, xs in output_geo(tmp_path / "out"):
        column = geo["columns"]["geometry"]
        assert column["bbox"] == [0, -100, 101, 1] and column["crs"] is None and geo["version"] == "1.1.0"
        assert all(column["bbox"][0] <= x <= column["bbox"][2] for x in xs)
        assert column["geometry_types"] == ["Point", "Point Z"]
    empty = pa.table({"id": pa.array([], pa.int64()), "geometry": pa.array([], pa.binary())})
    geo = {"version": "1.1.0", "primary_column": "geometry", "columns": {"geometry": {"encoding": "WKB",
           "geometry_types": []}}}  # fmt: skip
    pq.write_table(empty.replace_schema_metadata({"geo": json.dumps(geo)}), lake / "f2-empty.parquet")
    shuffle(lake, tmp_path / "out1", piles=2, seed=1, schema=schema)  # (GeoPandas' empty frame: no bbox, no types)
    assert all(g["columns"]["geometry"]["bbox"] == [0, -100, 101, 1] for g, _ in output_geo(tmp_path / "out1"))
    write(lake, "f3.parquet", 200, [], bbox=False)  # types unknown, and no bbox
    shuffle(lake, tmp_path / "out2", piles=2, seed=1, schema=schema)
    for geo, _ in output_geo(tmp_path / "out2"):
        assert "bbox" not in geo["columns"]["geometry"] and geo["columns"]["geometry"]["geometry_types"] == []


@pytest.mark.parametrize("schema", ["strict", "unify"])
def test_view_columns_are_shuffled_as_their_plain_forms(tmp_path, schema):
    """Polars, DataFusion and DuckDB write string_view, binary_view and list_view columns; Arrow's take and filter
    select none of them (pyarrow 26: "no kernel matching input types (string_view, int64)", after pass 1, with
    the run's record left in dest).  They are read as their large forms, beside files of the plain types."""
    lake = tmp_path / "lake"
    lake.mkdir()
    names = ["a", "b" * 20, None, "c" * 13]
    views = pa.table({
        "id": [0, 1, 2, 3],
        "s": pa.array(names, pa.string_view()),
        "b": pa.array([n.encode() if n else None for n in names], pa.binary_view()),
        "l": pa.array([[1], [2, 3], None, []], pa.list_view(pa.int64())),
        "nested": pa.array([[n] for n in names], pa.list_(pa.string_view())),
    })  # fmt: skip
    try:
        pq.write_table(views, lake / "views.parquet")
    except pa.ArrowNotImplementedError:  # (pyarrow 21 writes no list view to Parquet: "Unhandled type")
        views = views.drop_columns(["l"])
        pq.write_table(views, lake / "views.parquet")
    plain = pa.table({
        "id": [4, 5],
        "s": pa.array(["d", None], pa.string()),
        "b": pa.array([b"d", None], pa.binary()),
        "l": pa.array([[4], None], pa.list_(pa.int64())),
        "nested": pa.array([["d"], None], pa.list_(pa.string())),
    }).select(views.column_names)  # fmt: skip
    pq.write_table(plain, lake / "plain.parquet")
    shuffle(lake, tmp_path / "out", piles=2, seed=1, schema=schema)
    result = read_output(tmp_path / "out")
    # the reference file's types in strict mode (plain.parquet is first), the large forms unified
    assert "view" not in str(result.schema)
    if schema == "unify":
        assert result.schema.field("s").type == pa.large_string() and result.schema.field("b").type == pa.large_binary()
        assert result.schema.field("nested").type.value_type == pa.large_string()
    assert rows(result) == sorted(rows(views) + rows(plain), key=str)  # (pyarrow 26 casts list views wrong)
    assert daskpile.verify(str(lake), str(tmp_path / "out")).ok


def test_unify_holds_integers_and_decimals_in_one_decimal(tmp_path):
    """pyarrow unifies int64 and decimal(5, 2) as decimal(20, 2), then casts no int64 to it ("Precision is not
    great enough", for the value 7): a lake whose first writer inferred integers could not be unified."""
    import decimal

    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(
        pa.table({"id": [1], "price": pa.array([decimal.Decimal("1.25")], pa.decimal128(5, 2))}), lake / "a.parquet"
    )
    pq.write_table(pa.table({"id": [2, 3], "price": pa.array([7, -(2**63)], pa.int64())}), lake / "b.parquet")
    pq.write_table(pa.table({"id": [4], "price": pa.array([2**32 - 1], pa.uint32())}), lake / "c.parquet")
    shuffle(lake, tmp_path / "out", piles=2, seed=1, schema="unify")
    result = read_output(tmp_path / "out")
    assert result.schema.field("price").type == pa.decimal128(21, 2)
    assert sorted(result.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "price": decimal.Decimal("1.25")}, {"id": 2, "price": decimal.Decimal(7)},
        {"id": 3, "price": decimal.Decimal(-(2**63))}, {"id": 4, "price": decimal.Decimal(2**32 - 1)},
    ]  # fmt: skip
    wide = tmp_path / "wide"  # no decimal holds every int64 and 60 places: pyarrow's own error named nothing
    wide.mkdir()
    pq.write_table(pa.table({"p": pa.array([1], pa.decimal256(76, 60))}), wide / "a.parquet")
    pq.write_table(pa.table({"p": pa.array([1], pa.int64())}), wide / "b.parquet")
    with pytest.raises(ValueError, match=r"column 'p' is decimal256\(76, 60\) in .* and int64 in .*no type holds"):
        shuffle(wide, tmp_path / "out3", piles=2, seed=1, schema="unify")
    pq.write_table(pa.table({"id": [5], "price": pa.array([1], pa.decimal128(38, 20))}), lake / "d.parquet")
    with pytest.raises(ValueError, match=r"column 'price' is .* the type that holds both, decimal256\(39, 20\), has "
                                         r"more than 38 digits"):  # fmt: skip
        shuffle(lake, tmp_path / "out2", piles=2, seed=1, schema="unify")


def test_a_file_with_two_columns_of_one_name_is_refused_naming_it(tmp_path):
    """pyarrow writes such a file; the shuffle went through and said "verified", then daskpile verify failed
    with Arrow's "Field "x" exists 2 times in schema", naming no file (a new user's trial)."""
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"x": [0], "y": [1]}), lake / "a.parquet")
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["x", "x"]), lake / "b.parquet")
    for schema in ["strict", "unify"]:
        with pytest.raises(ValueError, match=r"b\.parquet' has 2 columns named 'x': readers take one of them"):
            shuffle(lake, tmp_path / "out", piles=2, seed=1, schema=schema)
        assert not (tmp_path / "out").exists()


def test_a_metadata_sidecar_that_names_other_files_is_not_used_to_plan(tmp_path, capsys):
    """A summary left from an earlier write (Spark ignores them by default, DuckDB and pyarrow.dataset never
    read them): naming 1 file of 4 it planned piles='auto' for a quarter of the rows; schema only (no row
    groups), it planned about 0 rows, and refused files that all agreed for a column it did not have."""
    lake = tmp_path / "lake"
    lake.mkdir()
    collected = []
    for i in range(4):
        pq.write_table(pa.table({"x": range(i * 100, (i + 1) * 100)}), lake / f"p{i}.parquet",
                       metadata_collector=collected)  # fmt: skip
        collected[-1].set_file_path(f"p{i}.parquet")
    pq.ParquetWriter(lake / "p4.parquet", pa.schema([("x", pa.int64())])).close()  # no rows, no row group
    pq.write_metadata(pa.schema([("x", pa.int64())]), lake / "_metadata", metadata_collector=collected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a current summary cannot name a file of no row group: not "stale"
        shuffle(lake, tmp_path / "whole", piles=2, seed=1)
    pq.write_metadata(pa.schema([("x", pa.int64())]), lake / "_metadata", metadata_collector=collected[:1])
    with pytest.warns(UserWarning, match=r"_metadata' names 1 of the 5 files listed: .* not used to plan"):
        shuffle(lake, tmp_path / "out", piles=2, seed=1)
    assert read_output(tmp_path / "out").num_rows == 400
    for i in range(4):  # every file gains a column the summary (schema only) predates
        pq.write_table(pa.table({"x": range(i * 100, (i + 1) * 100), "y": [i] * 100}), lake / f"p{i}.parquet")
    pq.ParquetWriter(lake / "p4.parquet", pa.schema([("x", pa.int64()), ("y", pa.int64())])).close()
    pq.write_metadata(pa.schema([("x", pa.int64())]), lake / "_metadata")
    cli_main_exit(
        ["shuffle", str(lake), str(tmp_path / "out2"), "--piles", "auto", "--seed", "1", "--scheduler", "sync"]
    )
    assert "_metadata' names 0 of the 5 files listed" in capsys.readouterr().out
    assert read_output(tmp_path / "out2").column_names == ["x", "y"]


def test_names_that_differ_only_in_case_are_refused_as_spark_would_read_them_as_one(tmp_path):
    """Unified, userId and userid were two half-null columns (Spark refuses to read the result, DuckDB reads
    userid_1); a folder Year=2024 over files holding year=2023 kept both, and skipped the check that the files'
    values are their folders' (a new user's trial).  One file's own two spellings stay its columns."""
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"id": [1], "userId": [10]}), lake / "f0.parquet")
    pq.write_table(pa.table({"id": [2], "userid": [20]}), lake / "f1.parquet")
    with pytest.raises(ValueError, match=r"columns 'userId' \(in '.*f0\.parquet'\) and 'userid' \(in '.*f1\.parquet'\) "
                                         r"differ only in case"):  # fmt: skip
        shuffle(lake, tmp_path / "out", schema="unify")
    pq.write_table(pa.table({"id": [2], "userid": [20], "userId": [3]}), lake / "f1.parquet")
    shuffle(lake, tmp_path / "out", schema="unify")  # (f1 holds both: its own columns)
    assert sorted(read_output(tmp_path / "out").column_names) == ["id", "userId", "userid"]
    folders = tmp_path / "hive" / "Year=2024"
    folders.mkdir(parents=True)
    pq.write_table(pa.table({"id": [1, 2], "year": [2023, 2023]}), folders / "f.parquet")
    with pytest.raises(ValueError, match=r"partition folders' key 'Year' and column 'year' of '.*f\.parquet' differ"):
        shuffle(tmp_path / "hive", tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_a_struct_of_two_fields_of_one_name_is_not_matched_by_name(sync_scheduler, tmp_path):
    """Structs are matched by name, but the plan's struct<a, a> took a file's struct<a, b> (every plan name in
    the file, as many fields), and Arrow's cast dropped b's values, with verify saying OK (the review)."""
    lake = tmp_path / "lake"
    lake.mkdir()
    twice = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    pq.write_table(pa.table({"id": [0], "s": twice}), lake / "a.parquet")
    pq.write_table(pa.table({"id": [1], "s": pa.array([{"a": 3, "b": 4}])}), lake / "b.parquet")
    with pytest.raises(ValueError, match=r"schema of '.*b\.parquet' differs from that of '.*a\.parquet': s: "):
        shuffle(lake, tmp_path / "out")
