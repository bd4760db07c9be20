"""Delta Lake and Iceberg tables, written by their own libraries, read through them: live files only.

Each output is compared with the library's own read of the table, as a
multiset of rows.
"""

import os
import shutil

import pyarrow as pa
import pytest
from _util import read_output

import daskpile
from daskpile.sources import plan_sources

deltalake = pytest.importorskip("deltalake")


def rows(table: pa.Table) -> list:
    names = sorted(table.column_names)
    return sorted((tuple(str(r[n]) for n in names) for r in table.to_pylist()), key=str)


def events(start: int, n: int, **extra) -> pa.Table:
    columns = {"id": pa.array(range(start, start + n), pa.int64()), "region": ["eu", "us"] * (n // 2)}
    return pa.table({**columns, **extra})


@pytest.fixture
def delta_table(tmp_path):
    """Written, overwritten twice, appended to with a new column, partitioned, and deleted from."""
    path = str(tmp_path / "delta")
    for _ in range(3):
        deltalake.write_deltalake(path, events(0, 500), mode="overwrite", partition_by=["region"])
    deltalake.write_deltalake(path, events(1000, 100, score=pa.array([0.5] * 100)), mode="append", schema_mode="merge")
    deltalake.DeltaTable(path).delete("id < 10")
    return path


def test_a_delta_table_is_its_live_rows(sync_scheduler, delta_table, tmp_path):
    report = daskpile.shuffle_parquet(delta_table, str(tmp_path / "out"), piles=3, seed=1)
    expected = deltalake.DeltaTable(delta_table).to_pyarrow_table()
    out = read_output(tmp_path / "out")
    assert report.rows == expected.num_rows == 590  # not the 1,600 rows of every file in the folder
    assert rows(out) == rows(expected)
    assert set(out.column_names) == set(expected.column_names)  # the partition column and the merged one
    assert daskpile.read_manifest(str(tmp_path / "out"))["source"]["table"].startswith("delta table at version")
    assert daskpile.verify(delta_table, str(tmp_path / "out")).ok


def test_an_older_delta_version(sync_scheduler, delta_table, tmp_path):
    daskpile.shuffle_parquet(delta_table, str(tmp_path / "v0"), piles=2, seed=1, version=0)
    expected = deltalake.DeltaTable(delta_table, version=0).to_pyarrow_table()
    assert rows(read_output(tmp_path / "v0")) == rows(expected)
    # verify reads the version the manifest records, not the table's current one
    assert daskpile.verify(delta_table, str(tmp_path / "v0")).ok


def test_verify_of_another_version_than_the_result_s_says_so_and_blames_nothing_else(delta_table, tmp_path):
    """From the Spark-lake trial: verify --table-version 0 of a result made from the latest version said its files
    "changed since it was written" (read without the column merged in since) and that "the source changed"."""
    latest = deltalake.DeltaTable(delta_table).version()
    daskpile.shuffle_parquet(delta_table, str(tmp_path / "out"), piles=2, seed=1)
    result = daskpile.verify(delta_table, str(tmp_path / "out"), version=0)
    assert not result.ok and result.other_version == (latest, 0)
    assert result.files_differing == () and result.source_changed == ()
    assert f"the result was made from version {latest} of the table, and version 0 was read" in str(result)
    assert "changed since" not in str(result)
    assert daskpile.verify(delta_table, str(tmp_path / "out"), version=latest).ok


def test_verify_of_a_version_vacuumed_since_says_so(sync_scheduler, delta_table, tmp_path):
    """It printed the raw "[Errno 2] Failed to open local file ..." of the first file missing."""
    daskpile.shuffle_parquet(delta_table, str(tmp_path / "v0"), piles=2, seed=1, version=0)
    deltalake.DeltaTable(delta_table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(FileNotFoundError, match=r"delta table at version 0 of .* lists files that are gone \(.*"
                                                r"and \d+ more\): removed since by a vacuum"):  # fmt: skip
        daskpile.verify(delta_table, str(tmp_path / "v0"))
    shutil.rmtree(os.path.join(delta_table, "region=us"))  # a partition's folder gone whole (an empty S3 prefix)
    with pytest.raises(FileNotFoundError, match=r"lists files that are gone \(.*region=.*\): removed since"):
        daskpile.verify(delta_table, str(tmp_path / "v0"))
    # and a shuffle of that version, which said "[Errno 2] Failed to open local file" (from the Spark-lake trial)
    with pytest.raises(FileNotFoundError, match=r"delta table at version 0 of .* lists files that are gone"):
        daskpile.shuffle_parquet(delta_table, str(tmp_path / "again"), piles=2, seed=1, version=0)
    assert not (tmp_path / "again").exists()


def test_a_delta_version_out_of_range_is_said_plainly(delta_table, tmp_path):
    """From the Spark-lake trial: delta-rs's own words ("LogSegment end version 0 not the same as the specified
    end version 99", "can't convert negative int to unsigned")."""
    latest = deltalake.DeltaTable(delta_table).version()
    with pytest.raises(ValueError, match=rf"the Delta table '.*delta' has no version 99 \(its latest is {latest}\)"):
        daskpile.shuffle_parquet(delta_table, str(tmp_path / "o"), piles=2, version=99)
    with pytest.raises(ValueError, match=r"a Delta table's versions count from 0, and -1 was asked of"):
        daskpile.shuffle_parquet(delta_table, str(tmp_path / "o"), piles=2, version=-1)
    assert not (tmp_path / "o").exists()


def test_deletion_vectors_are_refused_by_name(tmp_path):
    path = str(tmp_path / "dv")
    deltalake.write_deltalake(path, events(0, 10), configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(ValueError, match="deletionVectors"):
        daskpile.shuffle_parquet(path, str(tmp_path / "out"), piles=2)
    assert not (tmp_path / "out").exists()


def test_a_table_inside_the_source_folder_is_not_read_as_loose_files(delta_table, tmp_path):
    with pytest.raises(ValueError, match=r"'.*delta' is a table: give it as the source"):
        plan_sources(str(tmp_path))


def test_without_the_library_the_message_names_the_extra(delta_table, tmp_path):
    from _util import run_in_fresh_process

    script = """
import sys, json
sys.modules["deltalake"] = None  # as if the extra were not installed
from daskpile.sources import plan_sources
try:
    plan_sources(sys.argv[1])
except ImportError as e:
    print(json.dumps(str(e)))
"""
    message = run_in_fresh_process(script, delta_table)
    assert "pip install 'daskpile[delta]'" in message


@pytest.fixture
def iceberg_catalog(tmp_path):
    """A real Iceberg catalog (pyiceberg's SQLite one) with a warehouse on local disk."""
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path / "warehouse"
    os.makedirs(warehouse)
    catalog = SqlCatalog("test", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    catalog.create_namespace("db")
    return catalog


def test_an_iceberg_table_is_its_current_snapshot(sync_scheduler, tmp_path, iceberg_catalog):
    catalog = iceberg_catalog
    table = catalog.create_table("db.events", schema=events(0, 2).schema)
    table.append(events(0, 500))
    table.overwrite(events(500, 300))
    table.append(events(800, 100))
    table.delete("id < 510")
    location = table.location().removeprefix("file://")
    report = daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=3, seed=1)
    expected = table.scan().to_arrow()
    assert report.rows == expected.num_rows == 390
    assert rows(read_output(tmp_path / "out")) == rows(expected)
    assert daskpile.verify(location, str(tmp_path / "out")).ok
    first = table.history()[0].snapshot_id  # an older snapshot: the first append alone
    daskpile.shuffle_parquet(location, str(tmp_path / "first"), piles=2, seed=1, version=first)
    assert rows(read_output(tmp_path / "first")) == rows(table.scan(snapshot_id=first).to_arrow())


def test_a_glob_or_folder_inside_a_delta_table_is_refused(delta_table):
    """(A glob inside the table whose matches include its log's checkpoint was told the table is a folder above
    it.)"""
    deltalake.DeltaTable(delta_table).create_checkpoint()
    globs = [os.path.join(delta_table, "*", "*.parquet"), os.path.join(delta_table, "*", "*")]
    for inside in [os.path.join(delta_table, "region=eu"), *globs]:
        with pytest.raises(ValueError, match=r"inside the table '.*delta'"):
            plan_sources(inside)


def test_delta_partition_values_that_need_escaping(sync_scheduler, tmp_path):
    """A timestamp partition: its folder names are URL-encoded, and the log encodes them once more."""
    import datetime

    path = str(tmp_path / "delta")
    when = pa.array(
        [datetime.datetime(2024, 1, 1, 12, 30), datetime.datetime(2024, 1, 2, 0, 0)] * 5, pa.timestamp("us")
    )
    deltalake.write_deltalake(path, pa.table({"id": range(10), "at": when, "city": ["a/b", "c d"] * 5}),
                              partition_by=["at", "city"])  # fmt: skip
    plan = plan_sources(path)
    assert all(f.size > 0 for f in plan.files)
    report = daskpile.shuffle_parquet(path, str(tmp_path / "out"), piles=2, seed=1)
    assert rows(read_output(tmp_path / "out")) == rows(deltalake.DeltaTable(path).to_pyarrow_table())
    assert report.rows == 10 and daskpile.verify(path, str(tmp_path / "out")).ok


def test_iceberg_columns_are_matched_by_field_id(sync_scheduler, tmp_path, iceberg_catalog):
    """A column renamed, another added under the old name, a third dropped: as pyiceberg reads them."""
    from pyiceberg.types import StringType

    catalog = iceberg_catalog
    first = pa.table({"id": pa.array([1, 2], pa.int64()), "a": ["old-1", "old-2"], "gone": ["x", "y"]})
    table = catalog.create_table("db.t", schema=first.schema)
    table.append(first)
    with table.update_schema() as update:
        update.rename_column("a", "b")
        update.delete_column("gone")
    with table.update_schema() as update:
        update.add_column("a", StringType())
    table.append(pa.table({"id": pa.array([3], pa.int64()), "b": ["new-b"], "a": ["new-a"]}))
    location = table.location().removeprefix("file://")
    daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=2, seed=1)
    expected = table.scan().to_arrow()
    out = read_output(tmp_path / "out")
    assert rows(out) == rows(expected)
    assert {r["id"]: (r["b"], r["a"]) for r in out.to_pylist()}[1] == ("old-1", None)


def test_an_older_iceberg_snapshot_is_read_with_its_own_schema(sync_scheduler, tmp_path, iceberg_catalog):
    """From the Spark-lake trial: a snapshot taken before a column was dropped was read with the table's schema
    now, so the column's values were lost (pyiceberg reads them), and the run said verified."""
    table = iceberg_catalog.create_table("db.t", schema=pa.schema([("id", pa.int64()), ("city", pa.string())]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "city": ["Paris", "Lyon"]}))
    old = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.delete_column("city")
    table.append(pa.table({"id": pa.array([3], pa.int64())}))
    location = table.location().removeprefix("file://")
    daskpile.shuffle_parquet(location, str(tmp_path / "old"), piles=1, seed=1, version=old)
    assert rows(read_output(tmp_path / "old")) == rows(table.scan(snapshot_id=old).to_arrow())
    assert read_output(tmp_path / "old").column_names == ["id", "city"]
    daskpile.shuffle_parquet(location, str(tmp_path / "now"), piles=1, seed=1)
    assert rows(read_output(tmp_path / "now")) == rows(table.scan().to_arrow())


@pytest.mark.parametrize("change", ["renamed", "dropped-and-added"])
def test_iceberg_nested_fields_that_reading_by_name_would_misread_are_refused(
    sync_scheduler, tmp_path, iceberg_catalog, change
):
    """From the Spark-lake trial: nested fields are read by name, so a nested field renamed came out all null,
    and one dropped and added again came back with its old values; the run said verified.  Refused, naming it."""
    from pyiceberg.types import StringType

    kind = pa.struct([("a", pa.string()), ("b", pa.string())])
    table = iceberg_catalog.create_table("db.t", schema=pa.schema([("id", pa.int64()), ("st", kind)]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "st": pa.array([{"a": "a1", "b": "b1"}] * 2, kind)}))
    with table.update_schema() as update:
        if change == "renamed":
            update.rename_column("st.a", "a2")
        else:
            update.delete_column("st.b")
    if change == "dropped-and-added":
        with table.update_schema() as update:
            update.add_column(("st", "b"), StringType())
    location = table.location().removeprefix("file://")
    said = r"st\.a: renamed st\.a2 \(field id \d+\)" if change == "renamed" else r"st\.b: dropped \(field id \d+\)"
    with pytest.raises(ValueError, match=said + ".*daskpile reads nested fields by name"):
        daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=1, seed=1)
    assert not (tmp_path / "out").exists()


def test_a_column_renamed_since_the_last_snapshot_verifies(sync_scheduler, tmp_path, iceberg_catalog):
    """From the review: a rename or an added column makes no snapshot; the shuffle read the table's schema and
    its verify, asking for the snapshot the result records, read that snapshot's: a false mismatch."""
    from pyiceberg.types import StringType

    table = iceberg_catalog.create_table("db.t", schema=pa.schema([("id", pa.int64()), ("a", pa.string())]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "a": ["x", "y"]}))
    with table.update_schema() as update:
        update.rename_column("a", "b")
        update.add_column("c", StringType())
    location = table.location().removeprefix("file://")
    daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=1, seed=1)
    assert read_output(tmp_path / "out").column_names == ["id", "b", "c"]
    assert daskpile.verify(location, str(tmp_path / "out")).ok


def test_iceberg_files_without_field_ids_are_read_through_the_name_mapping(sync_scheduler, tmp_path, iceberg_catalog):
    """From the Spark-lake trial: a Hive-era file added to a table as it was (add_files: no field ids; the table's
    name mapping gives them) was refused after a rename, where pyiceberg reads it."""
    import pyarrow.parquet as pq

    legacy = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "city": pa.array(["Paris", "Lyon", None])})
    os.makedirs(tmp_path / "data")
    pq.write_table(legacy, tmp_path / "data" / "legacy-0.parquet")
    table = iceberg_catalog.create_table("db.t", schema=legacy.schema)
    table.add_files([f"file://{tmp_path / 'data' / 'legacy-0.parquet'}"])
    with table.update_schema() as update:
        update.rename_column("city", "town")
    table = iceberg_catalog.load_table("db.t")
    location = table.location().removeprefix("file://")
    daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=1, seed=1)
    assert rows(read_output(tmp_path / "out")) == rows(table.scan().to_arrow())
    assert read_output(tmp_path / "out").column_names == ["id", "town"]
    assert daskpile.verify(location, str(tmp_path / "out")).ok


def test_iceberg_nested_fields_added_or_unchanged_are_read(sync_scheduler, tmp_path, iceberg_catalog):
    """What reading by name reads right passes: a nested field added, lists and maps, a top-level rename."""
    from pyiceberg.types import StringType

    kind = pa.struct([("a", pa.string()), ("tags", pa.list_(pa.string())), ("m", pa.map_(pa.string(), pa.int64()))])
    table = iceberg_catalog.create_table("db.t", schema=pa.schema([("id", pa.int64()), ("st", kind)]))
    value = {"a": "a1", "tags": ["x", "y"], "m": [("k", 1)]}
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "st": pa.array([value] * 2, kind)}))
    with table.update_schema() as update:
        update.add_column(("st", "c"), StringType())
        update.rename_column("st", "record")
    location = table.location().removeprefix("file://")
    daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=1, seed=1)
    assert rows(read_output(tmp_path / "out")) == rows(table.scan().to_arrow())


def test_s3_options_reach_the_table_libraries_under_their_names():
    from daskpile.sources.tables import _delta_options, _iceberg_options

    options = {"key": "k", "secret": "s", "token": "t", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    assert _delta_options(options) == {
        "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
    }  # fmt: skip
    assert _iceberg_options({"anon": True, "client_kwargs": {"region_name": "eu-west-1"}}) == {
        "s3.region": "eu-west-1", "s3.anonymous": "true"
    }  # fmt: skip
    assert _delta_options(None) is None  # nothing given, nothing forced (the environment's region stays)


def test_the_environments_endpoint_and_region_reach_the_table_libraries(monkeypatch):
    """delta-rs reads AWS_ENDPOINT_URL but refuses http without AWS_ALLOW_HTTP; pyiceberg's S3 reads neither
    the endpoint nor the region from the environment, and went to real AWS where a MinIO was named."""
    from daskpile.sources.tables import _delta_options, _iceberg_options

    for name in ("AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert _delta_options(None) == {"AWS_ALLOW_HTTP": "true"}
    assert _iceberg_options(None) == {"s3.endpoint": "http://minio:9000", "s3.region": "eu-west-1"}
    given = {"client_kwargs": {"endpoint_url": "https://other:9000", "region_name": "us-east-1"}}
    assert _iceberg_options(given) == {"s3.endpoint": "https://other:9000", "s3.region": "us-east-1"}
    assert _delta_options(given) == {"AWS_ENDPOINT_URL": "https://other:9000", "AWS_REGION": "us-east-1"}


def _commit_position_deletes(table, data_file: str, positions: list[int], path: str) -> None:
    """A merge-on-read delete of rows ``positions`` of ``data_file``, as Spark or Flink would commit it.

    pyiceberg reads positional delete files but writes none (its ``delete`` rewrites data files), so
    the delete file and its manifest are made here with pyiceberg's own writers: a Parquet file of
    (file_path, pos) under the spec's reserved field ids, appended in a manifest whose content is
    "deletes" (pyiceberg's V2 writer says "data", hence the patch, for this one commit).
    """
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestWriterV2
    from pyiceberg.typedef import Record

    schema = pa.schema([
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
    ])  # fmt: skip
    pq.write_table(pa.table({"file_path": [data_file] * len(positions), "pos": positions}, schema=schema), path)
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=f"file://{path}", file_format=FileFormat.PARQUET,
        partition=Record(), record_count=len(positions), file_size_in_bytes=os.path.getsize(path),
    )  # fmt: skip
    content, meta = ManifestWriterV2.content, ManifestWriterV2._meta
    ManifestWriterV2.content = lambda self: ManifestContent.DELETES
    ManifestWriterV2._meta = property(lambda self: {**meta.fget(self), "content": "deletes"})
    try:
        with table.transaction() as transaction, transaction.update_snapshot().fast_append() as append:
            append.append_data_file(delete_file)
    finally:
        ManifestWriterV2.content, ManifestWriterV2._meta = content, meta


def test_iceberg_positional_deletes_are_refused_by_name(sync_scheduler, tmp_path, iceberg_catalog):
    """Rows deleted by a delete file, which the data files still hold: refused, never shuffled back to life."""
    table = iceberg_catalog.create_table("db.events", schema=events(0, 2).schema)
    table.append(events(0, 500))
    (data_file,) = [task.file.file_path for task in table.scan().plan_files()]
    _commit_position_deletes(table, data_file, [0, 1, 7], str(tmp_path / "deletes.parquet"))
    table = iceberg_catalog.load_table("db.events")
    assert table.scan().to_arrow().num_rows == 497  # pyiceberg applies them: the table is a real one
    location = table.location().removeprefix("file://")
    with pytest.raises(ValueError, match=r"row-level delete files for 1 data files \(the first: '.*\.parquet'\)"):
        daskpile.shuffle_parquet(location, str(tmp_path / "out"), piles=2, seed=1)
    assert not os.path.exists(tmp_path / "out")
    first = table.history()[0].snapshot_id  # before the delete: no delete file applies, so it is read
    daskpile.shuffle_parquet(location, str(tmp_path / "first"), piles=2, seed=1, version=first)
    assert rows(read_output(tmp_path / "first")) == rows(table.scan(snapshot_id=first).to_arrow())
