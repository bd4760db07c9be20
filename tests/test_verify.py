import dataclasses
import json
import os
import pathlib

import dask.dataframe as dd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import every_type_table, write_parts

import daskpile
from daskpile import _kernels
from daskpile.checks import _fingerprint
from daskpile.datasets import reference_table


@pytest.fixture
def source(tmp_path):
    write_parts(reference_table(0, 5_000, 5_000), tmp_path / "src", parts=3)
    return str(tmp_path / "src")


def test_manifest_records_matching_fingerprints(client, source, tmp_path):
    report = daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=4, seed=0)
    manifest = daskpile.read_manifest(str(tmp_path / "out"))
    assert manifest["fingerprint"] == report.fingerprint.to_json() and report.fingerprint.rows == 5_000
    assert "verified" in str(report)
    # Each part says which pile it holds, with its rows and fingerprint.
    stamp = json.loads(pq.read_metadata(tmp_path / "out" / "part-00002.parquet").metadata[b"daskpile.pile"])
    assert stamp["pile"] == 2 and stamp["rows"] == manifest["rows_per_pile"][2] and "fingerprint" in stamp


def test_verify_recomputes_from_the_files(client, source, tmp_path):
    dest = str(tmp_path / "out")
    daskpile.shuffle_parquet(source, dest, piles=4, seed=0)
    result = daskpile.verify(source, dest)
    assert result.ok and result.source.rows == 5_000 and "match" in str(result)

    # Damage one output file: one value changed, row count unchanged.
    part = os.path.join(dest, "part-00001.parquet")
    table = pq.read_table(part)
    names = table["name"].to_pylist()
    names[0] = "tampered"
    pq.write_table(table.set_column(table.column_names.index("name"), "name", pa.array(names)), part)
    damaged = daskpile.verify(source, dest)
    assert not damaged.ok and not damaged
    assert damaged.dest.rows == damaged.source.rows == 5_000
    assert damaged.columns_differing == ("name",)
    assert "MISMATCH: source 5,000 rows, result 5,000 rows" in str(damaged)
    assert "columns that differ: name" in str(damaged)
    # a result of another source differs in every column: ten are named, and how many more
    many = dataclasses.replace(damaged, columns_differing=tuple(f"c{i}" for i in range(300)))
    assert "columns that differ: c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, and 290 more" in str(many)
    # against its manifest, no column is fingerprinted alone: not said to be values in other rows
    alone = daskpile.verify(dest)
    assert not alone.ok and "MISMATCH: recorded 5,000 rows, result 5,000 rows" in str(alone)
    assert "not in the same rows" not in str(alone), str(alone)


def test_path_likes_name_a_source_and_a_result_as_their_strings_do(sync_scheduler, source, tmp_path):
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(pathlib.Path(source), dest, piles=4, seed=0)
    assert daskpile.verify(pathlib.Path(source), dest).ok and daskpile.verify(dest).ok
    assert daskpile.verify(sorted(pathlib.Path(source).glob("*.parquet")), dest).ok
    assert daskpile.quality(dest, order_column="id").rows == 5_000


def test_a_dataframe_given_for_files_is_a_type_error_naming_the_argument(source, tmp_path):
    """``verify(ddf, "out/")`` said the frame's seven-line repr "does not exist"."""
    ddf = dd.read_parquet(source)
    wanted = r"^{} must be a path or URL .* got a dask DataFrame \(a DataFrame: daskpile.shuffle shuffles a dask one"
    for call, role in [
        (lambda: daskpile.verify(ddf, str(tmp_path)), "source"),
        (lambda: daskpile.verify(source, ddf), "dest"),
        (lambda: daskpile.shuffle_parquet(ddf, str(tmp_path / "out")), "source"),
        (lambda: daskpile.shuffle_parquet(source, ddf), "dest"),
        (lambda: daskpile.PileLoader(ddf, batch_size=2, seed=0), "path"),
        (lambda: daskpile.quality(ddf, order_column="id"), "dest"),
    ]:
        with pytest.raises(TypeError, match=wanted.format(role)):
            call()
    assert os.listdir(tmp_path) == [os.path.basename(source)]


def test_values_moved_between_rows_are_a_mismatch_with_every_column_intact(sync_scheduler, source, tmp_path):
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=2, seed=0)
    part = dest / "part-00000.parquet"
    table = pq.read_table(part)
    swapped = table["x"].to_pylist()
    swapped[0], swapped[1] = swapped[1], swapped[0]
    pq.write_table(table.set_column(table.column_names.index("x"), "x", pa.array(swapped)), part)
    result = daskpile.verify(source, str(dest))
    assert not result.ok and result.columns_differing == ()
    assert "every column holds the same values, but not in the same rows" in str(result)
    alone = daskpile.verify(str(dest))  # generations are a moving window's: a plain result has none to name
    assert not alone.ok and alone.generations_differing == () and "generation" not in str(alone)


def test_a_column_whose_type_changed_with_its_values_kept_is_a_mismatch_naming_it(sync_scheduler, source, tmp_path):
    """The fingerprints hash values, which a cast may keep: a timestamp as int64, a string as binary, int64 as
    int32 all said "match".  Types that hold the same values alike (large_string) still match."""
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=2, seed=0)
    part = dest / "part-00000.parquet"
    table = pq.read_table(part)
    metadata = table.schema.metadata
    as_large = table.set_column(table.column_names.index("name"), "name", table["name"].cast(pa.large_string()))
    # the same instants in another unit, written by a tool that writes nanoseconds, said "columns that differ"
    in_ns = as_large.set_column(table.column_names.index("ts"), "ts", table["ts"].cast(pa.timestamp("ns")))
    pq.write_table(in_ns.replace_schema_metadata(metadata), part)
    assert daskpile.verify(source, str(dest)).ok and daskpile.verify(str(dest)).ok
    cast = {"id": pa.int32(), "ts": pa.int64(), "name": pa.binary()}
    for name, kind in cast.items():
        table = table.set_column(table.column_names.index(name), name, table[name].cast(kind))
    pq.write_table(table.replace_schema_metadata(metadata), part)
    for result, whose in [(daskpile.verify(source, str(dest)), "source"), (daskpile.verify(str(dest)), "manifest")]:
        # (a time's value is its instant: microseconds as plain int64 are other values)
        assert not result.ok and result.columns_differing == (("ts",) if whose == "source" else ())
        assert result.types_differing == (
            f"id (int64 in the {whose}, int32 in the result)",
            f"ts (timestamp[no time zone] in the {whose}, int64 in the result)",
            f"name (string in the {whose}, binary in the result)",
        )
        assert "column types that differ: id (int64 in the " in str(result)


def test_utc_spelled_another_way_is_the_same_time_zone(sync_scheduler, tmp_path):
    """UTC, Etc/UTC and +00:00 were said to be column types that differ."""
    times = pa.array(range(0, 50_000_000, 10_000), pa.timestamp("us", "UTC"))
    write_parts(pa.table({"id": pa.array(range(len(times))), "t": times}), tmp_path / "src", parts=2)
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, seed=0)
    for zone in ("Etc/UTC", "+00:00"):
        for part in (tmp_path / "out").glob("part-*.parquet"):
            table = pq.read_table(part)
            moved = table.set_column(
                1, pa.field("t", pa.timestamp("us", zone)), table["t"].cast(pa.timestamp("us", zone))
            )
            pq.write_table(moved.replace_schema_metadata(table.schema.metadata), part)
        assert daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out")).ok, zone
    table = pq.read_table(part)  # another zone: the same instants, shown otherwise
    moved = table.set_column(1, "t", table["t"].cast(pa.timestamp("us", "Europe/Paris")))
    pq.write_table(moved.replace_schema_metadata(table.schema.metadata), part)
    result = daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not result.ok and result.types_differing[0].startswith("t (timestamp[UTC] in the source, "), result


def test_missing_and_unreadable_files_are_named_with_the_reason(sync_scheduler, source, tmp_path):
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0)
    os.remove(dest / "part-00001.parquet")
    (dest / "part-00002.parquet").write_bytes(b"PAR1 not really")
    result = daskpile.verify(source, str(dest))
    assert not result.ok
    assert [os.path.basename(m.split(" ")[0]) for m in result.missing_files] == ["part-00001.parquet"]
    assert len(result.unreadable_files) == 1 and "part-00002.parquet" in result.unreadable_files[0]
    assert "as Parquet" in result.unreadable_files[0]  # the reason
    text = str(result)
    assert "missing: " in text and "the manifest lists it" in text and "unreadable: " in text


@pytest.mark.parametrize("output_format", ["parquet", "jsonl"])
def test_a_file_changed_in_place_is_named(sync_scheduler, source, tmp_path, output_format):
    """The same size, its footer intact: readers see other values and no error; verify names the file."""
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=4, seed=0, output_format=output_format)
    manifest = daskpile.read_manifest(str(dest))
    assert len(manifest["file_fingerprints"]) == len(manifest["files"])
    changed = dest / manifest["files"][1]
    data = bytearray(changed.read_bytes())
    if output_format == "parquet":  # the middle of the file: values of an uncompressed float column
        data[len(data) // 2 : len(data) // 2 + 200] = b"\x11" * 200
    else:  # a digit of a value of the first line
        at = data.index(b'"x":') + 5
        data[at : at + 1] = b"7" if data[at : at + 1] != b"7" else b"3"
    changed.write_bytes(bytes(data))
    for result in (daskpile.verify(str(dest)), daskpile.verify(source, str(dest))):
        assert not result.ok and [os.path.basename(p) for p in result.files_differing] == [changed.name]
        assert f"changed since it was written: {changed}" in str(result)
        assert result.to_json()["files_differing"] == list(result.files_differing)


def test_two_files_swapped_are_said_to_hold_every_row_but_not_where_it_was_written(sync_scheduler, source, tmp_path):
    """Every fingerprint of the rows matches: MISMATCH with the row counts alone read as rows lost."""
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0)
    first, second = dest / "part-00000.parquet", dest / "part-00001.parquet"
    held = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(held)
    result = daskpile.verify(source, str(dest))
    assert not result.ok and result.source == result.dest and len(result.files_differing) == 2
    assert (
        str(result)
        .splitlines()[0]
        .endswith("every row is there, but not every file holds the rows the run wrote in it")
    )


def test_a_data_file_the_manifest_does_not_list_is_a_mismatch(sync_scheduler, source, tmp_path):
    """A copy left in dest: daskpile reads the listed files only, pandas and pyarrow read the folder."""
    import shutil

    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0)
    shutil.copy(dest / "part-00001.parquet", dest / "part-00001 (copy).parquet")
    (dest / "_SUCCESS.parquet").write_bytes(b"")  # what readers skip is not counted
    for result in (daskpile.verify(source, str(dest)), daskpile.verify(str(dest))):
        assert not result.ok and [os.path.basename(p) for p in result.unlisted_files] == ["part-00001 (copy).parquet"]
        assert "not in the manifest: " in str(result) and result.to_json()["unlisted_files"]
    assert pq.read_table(dest).num_rows == 5_000 + pq.read_table(dest / "part-00001.parquet").num_rows


@pytest.mark.parametrize("copy", ["extra.parq", "part-00000.parquet.bak", "backup/part-00000.parquet", "day=2/p"])
def test_a_copy_of_any_name_in_any_folder_below_the_result_is_a_mismatch(sync_scheduler, source, tmp_path, copy):
    """Only a copy named *.parquet beside the parts was found; pandas reads every file not named .* or _*, in
    every folder below (a key=value folder's with a column more)."""
    import shutil

    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0)
    (dest / copy).parent.mkdir(exist_ok=True)
    shutil.copy(dest / "part-00000.parquet", dest / copy)
    for hidden in ("_tmp/part.parquet", ".backup/part.parquet", "_SUCCESS"):  # what readers of the folder skip
        (dest / hidden).parent.mkdir(exist_ok=True)
        shutil.copy(dest / "part-00000.parquet", dest / hidden)
    assert pq.read_table(dest).num_rows > 5_000
    for result in (daskpile.verify(source, str(dest)), daskpile.verify(str(dest))):
        assert not result.ok and result.unlisted_files == (str(dest / copy),), result


def test_a_column_renamed_in_every_file_is_a_mismatch_naming_both_names(sync_scheduler, source, tmp_path):
    """The last column renamed kept its place, and the row hash holds no names: both verify forms said match."""
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0)
    last = pq.read_schema(dest / "part-00000.parquet").names[-1]
    for path in dest.glob("part-*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.rename_columns([*table.column_names[:-1], last.upper()]), path)
    for result, whose in ((daskpile.verify(source, str(dest)), "source"), (daskpile.verify(str(dest)), "manifest")):
        assert not result.ok, result
        assert any(t.startswith(f"{last} (") and "missing in the result" in t for t in result.types_differing)
        assert any(t.startswith(f"{last.upper()} (not in the {whose}") for t in result.types_differing), result
    # one file without it, the others as written
    daskpile.shuffle_parquet(source, str(tmp_path / "out2"), piles=3, seed=0)
    path = tmp_path / "out2" / "part-00001.parquet"
    pq.write_table(pq.read_table(path).drop_columns([last]), path)
    result = daskpile.verify(source, str(tmp_path / "out2"))
    assert not result.ok and [t for t in result.types_differing if t.startswith(last)], result
    assert result.types_differing[0].endswith(", missing in the result)"), result


def test_source_files_skipped_as_not_data_are_said_beside_the_match(sync_scheduler, source, tmp_path):
    """verify said a bare match over a folder whose other files pandas reads (a .pqt, a .data): the shuffle had
    skipped them and said so, verify did not."""
    import shutil

    shutil.copy(next(pathlib.Path(source).glob("*.parquet")), pathlib.Path(source) / "more.data")
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=3, seed=0)
    result = daskpile.verify(source, str(tmp_path / "out"))
    assert result.ok and [os.path.basename(p) for p in result.skipped_files] == ["more.data"]
    assert "skipped in the source, as not data" in str(result) and result.to_json()["skipped_files"]


def test_a_mismatch_after_the_source_changed_says_so(sync_scheduler, source, tmp_path):
    """A lake that got a new day's file, or a file rewritten: the result is not to blame, and verify said only
    MISMATCH, as if the shuffled data were corrupt."""
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0)
    files = sorted(pathlib.Path(source).glob("*.parquet"))
    narrower = daskpile.verify(str(files[1]), str(dest))  # nothing changed: the source given is a part of it
    assert sorted(narrower.source_changed) == [f"{f} (not in the source given)" for f in (files[0], files[2])]
    write_parts(reference_table(5_000, 100, 100), tmp_path / "new", parts=1)
    added = pathlib.Path(source) / "zz-new.parquet"
    (tmp_path / "new").joinpath(os.listdir(tmp_path / "new")[0]).rename(added)
    changed = pq.read_table(files[0])
    pq.write_table(changed.slice(1), files[0])
    files[2].unlink()
    result = daskpile.verify(source, str(dest))
    expected = [f"{added} (added)", f"{files[2]} (gone)", f"{files[0]} (changed)"]
    assert not result.ok and list(result.source_changed) == expected
    assert str(result).splitlines()[-1] == (
        f"  the source changed since the shuffle read it: {', '.join(expected)}; the result matches what was read then"
    )
    assert result.to_json()["source_changed"] == list(result.source_changed)


@pytest.mark.parametrize("happened", ["written again", "removed"])
def test_a_source_changed_while_pass_1_reads_it_is_refused_never_verified(sync_scheduler, tmp_path, happened):
    """Files replaced (mv, as a writer commits) after pass 1 began: the first task read the old rows, the others
    the new, and the run said "verified" (its checks compare the result with what pass 1 read)."""
    from dask.callbacks import Callback

    source = tmp_path / "src"
    write_parts(reference_table(0, 3_000, 3_000), source, parts=3)
    files = sorted(source.glob("*.parquet"))

    def replace_the_files(key, *_):
        if key.startswith("daskpile-scatter-0-") and files[1].exists():  # the first task read its file
            if happened == "removed":
                files[1].unlink()
                return
            for f in files:
                table = pq.read_table(f)
                pq.write_table(table.set_column(0, "id", pa.compute.add(table["id"], 10_000)), f"{f}.new")
                os.replace(f"{f}.new", f)

    dest = tmp_path / "out"
    call = dict(piles=3, seed=0, blocksize=2**14)  # a task a file
    with Callback(posttask=replace_the_files), pytest.raises(ValueError) as refused:
        daskpile.shuffle_parquet(str(source), str(dest), **call)
    named = files[1] if happened == "removed" else files[0]
    assert str(refused.value) == (
        f"source file {str(named)!r} was {happened} while the shuffle read the source, so the rows read are of "
        "no one version of it: nothing was written to dest; run the same command again once the source is no "
        "longer being written"
    )
    assert not dest.exists() or not os.listdir(dest)
    again = daskpile.shuffle_parquet(str(source), str(dest), **call)
    assert again.rows == 3_000 - 1_000 * (happened == "removed") and daskpile.verify(str(source), str(dest)).ok


def test_a_source_cut_short_and_restored_while_a_task_reads_it_is_still_worth_a_retry(
    sync_scheduler, tmp_path, monkeypatch
):
    """``cp -p`` or ``rsync --inplace -t`` rewriting a file as pass 1 reads it: the task finds it cut short, and
    by the time the command looks the copy has put it back with its stamp.  That was said as workers that see
    another store (exit 2), on the sync scheduler whose worker is the command itself: it is a change, exit 75."""
    from daskpile.cli import _exit_status
    from daskpile.engine import _passes

    source = tmp_path / "src"
    write_parts(reference_table(0, 3_000, 3_000), source, parts=3)
    victim = sorted(source.glob("*.parquet"))[1]
    data, stat = victim.read_bytes(), victim.stat()
    scatter = _passes.scatter_partition

    def read_while_copied_over(fs, files, k, *args):
        if k != 1:
            return scatter(fs, files, k, *args)
        victim.write_bytes(data[: len(data) // 2])
        try:
            return scatter(fs, files, k, *args)
        finally:  # the copy done, its stamp set: the command finds the file as it listed it
            victim.write_bytes(data)
            os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    monkeypatch.setattr(_passes, "scatter_partition", read_while_copied_over)
    with pytest.raises(daskpile.FileChangedError) as refused:
        daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=3, seed=0, blocksize=2**14)
    assert f"{str(victim)!r} was cut short or written again" in str(refused.value)
    assert _exit_status(refused.value) == 75


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_of_the_result_gone_before_its_commit_is_refused_and_an_old_result_kept(
    sync_scheduler, tmp_path, overwrite
):
    """A file pass 2 wrote, gone before the manifest: the manifest named it, the run said "verified", and an
    overwrite left the old result's file of that name under the new manifest (found reviewing the check for
    workers that write to another store)."""
    from dask.callbacks import Callback

    source = tmp_path / "src"
    write_parts(reference_table(0, 3_000, 3_000), source, parts=3)
    dest = tmp_path / "out"
    if overwrite:
        daskpile.shuffle_parquet(str(source), str(dest), piles=3, seed=1)
    before = sorted(os.listdir(dest)) if overwrite else []
    where = ".daskpile-staging-*/" if overwrite else ""

    def remove_a_written_file(key, *_):
        if key.startswith("daskpile-gather-"):
            for path in dest.glob(f"{where}part-00000.parquet"):
                path.unlink()

    said = r"1 file of the result that pass 2 wrote in dest '.*' \(.*part-00000\.parquet\) is not there"
    with Callback(posttask=remove_a_written_file), pytest.raises(FileNotFoundError, match=said):
        daskpile.shuffle_parquet(str(source), str(dest), piles=2, seed=2, overwrite=overwrite)
    if overwrite:  # the old result whole, its run to finish beside it
        assert [n for n in sorted(os.listdir(dest)) if not n.startswith((".daskpile", "_daskpile.run"))] == before
        assert daskpile.read_manifest(str(dest))["seed"] == 1 and daskpile.verify(str(source), str(dest)).ok
    again = daskpile.shuffle_parquet(str(source), str(dest), piles=2, seed=2, overwrite=overwrite)
    assert again.rows == 3_000 and daskpile.verify(str(source), str(dest)).ok


def test_files_that_are_links_are_not_said_written_again(sync_scheduler, tmp_path):
    """A Hugging Face cache's files are links to its blobs: fsspec lists a link's own mtime, and gives its
    target's in ``info``, so a link made after its file was said written again."""
    import time

    write_parts(reference_table(0, 2_000, 2_000), tmp_path / "blobs", parts=2)
    time.sleep(0.05)
    (tmp_path / "src").mkdir()
    for blob in sorted((tmp_path / "blobs").iterdir()):
        (tmp_path / "src" / blob.name).symlink_to(blob)
    for source in (tmp_path / "src", next((tmp_path / "src").iterdir())):
        dest = tmp_path / f"out-{source.name}"
        assert daskpile.shuffle_parquet(str(source), str(dest), piles=2, seed=0).rows in (1_000, 2_000)
    (tmp_path / "piles").mkdir()
    for part in sorted((tmp_path / "out-src").glob("*.parquet")):
        (tmp_path / "piles" / part.name).symlink_to(part)
    assert sum(b.num_rows for b in daskpile.PileLoader(str(tmp_path / "piles"), batch_size=500, seed=0)) == 2_000


@pytest.mark.parametrize("write_index", [True, False])
def test_the_dask_dataframe_workflow_verifies(sync_scheduler, source, tmp_path, write_index):
    """shuffle(dd.read_parquet(src)).to_parquet(out): Dask's own index column is recognised, and named."""
    import dask.dataframe as dd

    daskpile.shuffle(dd.read_parquet(source), piles=4, seed=5).to_parquet(
        str(tmp_path / "out"), write_index=write_index
    )
    result = daskpile.verify(source, str(tmp_path / "out"))
    assert result.ok, str(result)
    assert result.ignored_columns == (("__null_dask_index__",) if write_index else ())
    assert ("__null_dask_index__" in str(result)) == write_index


def test_an_unnamed_index_pandas_wrote_verifies_under_the_name_dask_writes_it(sync_scheduler, tmp_path):
    """A filtered frame written by pandas keeps its index as __index_level_0__; shuffled and written by Dask,
    the same values are __null_dask_index__, and verify said MISMATCH ("not in the result")."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame({"v": [i * 2.5 for i in range(1000)], "s": [f"x{i % 7}" for i in range(1000)]})
    frame = frame[frame.s != "x3"]
    (tmp_path / "src").mkdir()
    frame.iloc[:400].to_parquet(tmp_path / "src" / "a.parquet")
    frame.iloc[400:].to_parquet(tmp_path / "src" / "b.parquet")
    daskpile.shuffle(dd.read_parquet(tmp_path / "src"), piles=3, seed=1).to_parquet(str(tmp_path / "out"))
    assert "__null_dask_index__" in pq.read_schema(next((tmp_path / "out").glob("*.parquet"))).names
    assert daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out")).ok

    # the index values changed: a mismatch in that column
    path = next((tmp_path / "out").glob("*.parquet"))
    table = pq.read_table(path)
    index = table.column_names.index("__null_dask_index__")
    shifted = pa.compute.add(table.column(index), 1)
    pq.write_table(table.set_column(index, table.field(index), shifted), path)
    result = daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out"))
    assert not result.ok and result.columns_differing == ("__index_level_0__",), result


def test_nans_pandas_wrote_as_nulls_are_said_as_the_cause_of_the_difference(sync_scheduler, tmp_path):
    """pandas and Dask write a float NaN as null: verify said only "columns that differ: f"."""
    import dask.dataframe as dd

    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "f": [1.0, float("nan"), None, 2.0]}), tmp_path / "src" / "a.parquet")
    daskpile.shuffle(dd.read_parquet(tmp_path / "src"), piles=2, seed=1).to_parquet(str(tmp_path / "out"))
    result = daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out"))
    assert result.columns_differing == ("f (1 NaN of the source is null in the result: pandas writes NaN as null)",)
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out2"), piles=2, seed=1)
    # a row gone, not a NaN become null: said plainly
    pq.write_table(pq.read_table(tmp_path / "src" / "a.parquet").slice(0, 3), tmp_path / "src" / "a.parquet")
    assert daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out2")).columns_differing == ("id", "f")


def test_a_dask_result_written_with_partition_on_verifies_its_folder_columns(sync_scheduler, source, tmp_path):
    """to_parquet(partition_on=[...]) moves the columns to key=value folders, which Dask and the loader read back
    as columns: verify reads them so too, in the source's types, and a file put in another folder is a mismatch."""
    import shutil

    import dask.dataframe as dd

    out = tmp_path / "out"
    daskpile.shuffle(dd.read_parquet(source), piles=4, seed=5).to_parquet(str(out), partition_on=["label"])
    assert sorted(os.listdir(out)) == ["label=0", "label=1"]
    result = daskpile.verify(source, str(out))
    assert result.ok, str(result)
    shutil.move(out / "label=0" / "part.2.parquet", out / "label=1" / "part.9.parquet")
    moved = daskpile.verify(source, str(out))
    assert not moved.ok and moved.columns_differing == ("label",)


def test_verify_json_and_exit_status(sync_scheduler, source, tmp_path):
    from click.testing import CliRunner

    from daskpile.cli import cli

    dest = str(tmp_path / "out")
    daskpile.shuffle_parquet(source, dest, piles=2, seed=0)
    done = CliRunner().invoke(cli, ["verify", source, dest, "--json", "--scheduler", "sync"])
    assert done.exit_code == 0 and json.loads(done.output)["ok"] is True
    os.remove(os.path.join(dest, "part-00001.parquet"))
    done = CliRunner().invoke(cli, ["verify", source, dest, "--json", "--scheduler", "sync"])
    report = json.loads(done.output)
    assert done.exit_code == 1 and report["ok"] is False and len(report["missing_files"]) == 1


def test_verify_every_type(client, tmp_path):
    write_parts(every_type_table(300), tmp_path / "src", parts=2)
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=3, seed=0)
    assert daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out")).ok


def test_a_changed_row_fails_loudly_and_leaves_no_manifest(sync_scheduler, source, tmp_path, monkeypatch):
    """Fault injection: a pass-2 permutation that alters one value must be caught by the fingerprints."""
    honest = _kernels.permute

    def corrupting_permute(table, rng):
        permuted = honest(table, rng)
        if permuted.num_rows == 0:
            return permuted
        x = permuted["x"].to_numpy().copy()
        x[0] += 1.0
        return permuted.set_column(permuted.column_names.index("x"), "x", pa.array(x))

    monkeypatch.setattr(_kernels, "permute", corrupting_permute)
    scratch = tmp_path / "scratch"
    with pytest.raises(daskpile.VerificationError, match=r"not a permutation.*a rerun starts afresh"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=0, scratch=str(scratch))
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []
    # The fault has passed (a disk that corrupted a write once): the rerun reuses nothing of the failed run
    monkeypatch.setattr(_kernels, "permute", honest)
    report = daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=0, scratch=str(scratch))
    assert report.resumed_piles == 0 and daskpile.verify(source, str(tmp_path / "out")).ok


def test_verification_can_be_turned_off(sync_scheduler, source, tmp_path):
    report = daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=0, verify=False)
    assert report.fingerprint is None and daskpile.read_manifest(str(tmp_path / "out"))["fingerprint"] is None


# Types Arrow's Parquet writer stores as others: Parquet has no unit of seconds and no date in milliseconds
STORED_AS_OTHERS = {
    "timestamp[s]": (pa.array([0, 86_400, None, 1_600_000_000], pa.timestamp("s")), pa.timestamp("ms")),
    "timestamp[s, UTC]": (pa.array([0, 1, 2, None], pa.timestamp("s", tz="UTC")), pa.timestamp("ms", tz="UTC")),
    "time32[s]": (pa.array([0, 59, 3_600, None], pa.time32("s")), pa.time32("ms")),
    "date64": (pa.array([0, 86_400_000, None, 864_000_000], pa.date64()), pa.date32()),
    "list<timestamp[s]>": (pa.array([[0], [1, 2], None, []], pa.list_(pa.timestamp("s"))),
                           pa.list_(pa.field("element", pa.timestamp("ms")))),
    "struct<date64>": (pa.array([{"d": 0}, None, {"d": 86_400_000}, {"d": None}], pa.struct([("d", pa.date64())])),
                       pa.struct([("d", pa.date32())])),
}  # fmt: skip


@pytest.mark.parametrize("kind", STORED_AS_OTHERS)
def test_a_type_parquet_stores_as_another_verifies_as_read_back(sync_scheduler, tmp_path, kind):
    """A shuffle said "verified", then ``verify`` said MISMATCH: the fingerprint was of seconds, the files hold
    milliseconds.  The rows now take the stored type once read, and the values are the same instants."""
    values, stored = STORED_AS_OTHERS[kind]
    table = pa.table({"id": pa.array(range(4000)), "v": pa.concat_arrays([values] * 1000)})
    source = tmp_path / "in.arrow"
    with pa.ipc.new_file(source, table.schema) as writer:
        writer.write_table(table)
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(str(source), str(dest), piles=3, seed=1)
    assert daskpile.verify(str(dest)).ok and daskpile.verify(str(source), str(dest)).ok
    back = pq.read_table(dest).sort_by("id")
    assert back.schema.field("v").type.equals(stored) and daskpile.read_manifest(str(dest))["schema"][1]["type"] == str(
        stored
    )
    assert back.column("v").equals(table.column("v").cast(stored))
    kept = daskpile.shuffle_parquet(str(source), str(tmp_path / "arrow"), piles=3, seed=1, output_format="arrow")
    assert kept.rows == 4000 and daskpile.verify(str(tmp_path / "arrow")).ok  # Arrow files keep the type


def test_a_csv_time_in_seconds_verifies_and_a_date_parquet_cannot_hold_is_refused(sync_scheduler, tmp_path):
    (tmp_path / "t.csv").write_text("id,when\n1,2020-01-01 00:00:00\n2,2020-01-02 00:00:01\n")
    daskpile.shuffle_parquet(str(tmp_path / "t.csv"), str(tmp_path / "out"), piles=1, seed=0)
    assert (
        daskpile.verify(str(tmp_path / "out")).ok and daskpile.verify(str(tmp_path / "t.csv"), str(tmp_path / "out")).ok
    )
    midday = pa.table({"d": pa.array([0, 43_200_000], pa.date64())})  # a date64 at noon: not a whole day
    pq_source = tmp_path / "d.arrow"
    with pa.ipc.new_file(pq_source, midday.schema) as writer:
        writer.write_table(midday)
    with pytest.raises(
        ValueError, match=r"column 'd' \(date64\[ms\]\) holds values that Parquet.*--output-format arrow"
    ):
        daskpile.shuffle_parquet(str(pq_source), str(tmp_path / "refused"), piles=1, seed=0)
    assert not (tmp_path / "refused").exists()


def test_a_manifest_of_another_version_of_the_row_hash_is_said_so(sync_scheduler, source, tmp_path):
    """verify(dest) of a result written by a daskpile whose row hash was another version failed with
    "'NoneType' object has no attribute 'rows'"; with the source, it is checked as any Parquet dataset."""
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=2, seed=0)
    manifest = dest / "_daskpile.json"
    version = _fingerprint.HASH_VERSION
    manifest.write_text(manifest.read_text().replace(f'"hash": {version}', '"hash": 3'))
    with pytest.raises(
        ValueError, match=rf"fingerprints of version 3 of the row hash, .* computes version {version}: "
    ):
        daskpile.verify(str(dest))
    assert daskpile.verify(source, str(dest)).ok


def test_times_wrapped_past_int64_nanoseconds_are_a_mismatch(sync_scheduler, tmp_path):
    """Spark's INT96 0001-01-01 and 9999-12-31, read by pyarrow (and so by dask) as wrapped nanoseconds, came
    out of ``shuffle(dd.read_parquet(lake)).to_parquet`` as 1754-08-30 and 1816-03-29, and verify said "match":
    the row hash took times as nanoseconds, wrapped alike."""
    import datetime

    source, dest = tmp_path / "lake", tmp_path / "out"
    source.mkdir()
    instants = [datetime.datetime(1, 1, 1), datetime.datetime(2024, 1, 1), datetime.datetime(9999, 12, 31)]
    table = pa.table({"id": [1, 2, 3], "ts": pa.array(instants, pa.timestamp("us"))})
    pq.write_table(table, source / "part-00000.c000.snappy.parquet", use_deprecated_int96_timestamps=True)
    daskpile.shuffle(dd.read_parquet(str(source)), piles=1, seed=1).to_parquet(str(dest), write_index=False)
    assert pq.read_table(dest)["ts"].type == pa.timestamp("ns")  # wrapped: the 9999 sentinel is now 1816
    result = daskpile.verify(str(source), str(dest))
    assert not result.ok and result.columns_differing == ("ts",), result
    daskpile.shuffle_parquet(str(source), str(tmp_path / "ours"), piles=1, seed=1)  # reads INT96 as Spark does
    assert daskpile.verify(str(source), str(tmp_path / "ours")).ok


@pytest.mark.slow
def test_a_text_source_is_read_with_the_format_and_read_options_given(sync_scheduler, tmp_path):
    """From the CSV trial: verify took no format or read options, so a result of shuffle(dd.read_csv(...,
    sep=";")) was compared with the source read with commas (a false mismatch, or a refusal), and a .txt source
    was read as lines (a mismatch that looked like data lost)."""
    from _util import daskpile_command

    source = tmp_path / "erp.txt"
    source.write_text("id;city;amount\n" + "".join(f"{i};c{i};{i},5\n" for i in range(500)))
    ddf = dd.read_csv(str(source), sep=";", dtype={"amount": "string"})
    daskpile.shuffle(ddf, piles=2, seed=1).to_parquet(str(tmp_path / "out"), write_index=False)
    assert not daskpile.verify(str(source), str(tmp_path / "out")).ok  # read as lines: one column, "line"
    options = {"delimiter": ";", "column_types": {"amount": "string"}}
    assert daskpile.verify(str(source), str(tmp_path / "out"), format="csv", read_options=options).ok
    options = ["--read-option", "delimiter=;", "--read-option", "column_types.amount=string"]
    done = daskpile_command(
        "verify", str(source), str(tmp_path / "out"), "--format", "csv", *options, "--scheduler=sync"
    )
    assert done.returncode == 0 and "match: the result is a permutation of the source (500 rows)" in done.stdout
    alone = daskpile_command("verify", str(tmp_path / "out"), "--format", "csv")
    assert alone.returncode == 2 and "--format and --read-option say how SOURCE is read: give SOURCE" in alone.stderr


def test_a_source_of_other_partition_keys_is_said_to_be_another_source(sync_scheduler, tmp_path):
    """From the Spark-lake trial: verify of another lake blamed "partitioning=", which the user never gave (the
    keys came from the result's manifest)."""
    for folder in ("a/day=1", "b/year=2024"):
        (tmp_path / folder).mkdir(parents=True)
        pq.write_table(pa.table({"id": [1, 2]}), tmp_path / folder / "p.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "a"), str(tmp_path / "out"), piles=1, seed=1)
    said = r"the source's partition folders have keys \['year'\], where the result's manifest records \['day'\]: is"
    with pytest.raises(ValueError, match=said):
        daskpile.verify(str(tmp_path / "b"), str(tmp_path / "out"))
