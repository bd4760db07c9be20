import contextlib
import glob
import json
import os

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import assert_tables_equal, every_type_table, read_output, run_in_fresh_process, write_parts

import daskpile
from daskpile.datasets import reference_table
from daskpile.engine import _passes, _scratch


@pytest.fixture
def source(tmp_path):
    write_parts(reference_table(0, 10_000, 10_000), tmp_path / "src", parts=4)
    return str(tmp_path / "src")


def test_layout_manifest_and_report(client, source, tmp_path):
    dest = str(tmp_path / "out")
    report = daskpile.shuffle_parquet(source, dest, piles=12, seed=5)
    names = sorted(os.listdir(dest))
    assert names == ["_daskpile.json"] + [f"part-{j:05d}.parquet" for j in range(12)]
    names = names[1:] + names[:1]
    manifest = json.loads((tmp_path / "out" / "_daskpile.json").read_text())
    assert manifest["piles"] == 12 and manifest["seed"] == 5 and manifest["rows"] == 10_000
    assert manifest["rows_per_pile"] == [pq.read_metadata(os.path.join(dest, n)).num_rows for n in names[:-1]]
    assert manifest["files"] == names[:-1]
    pile = pq.read_metadata(os.path.join(dest, names[0])).row_group(0)
    with_stats = {pile.column(i).path_in_schema for i in range(pile.num_columns) if pile.column(i).is_stats_set}
    kinds = pq.read_schema(os.path.join(dest, names[0]))
    # statistics would prune nothing; integers and booleans have them for their null counts (PileLoader's numpy)
    assert with_stats == {f.name for f in kinds if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)} != set()
    assert len(manifest["source_files"]) == 4 and set(manifest["versions"]) >= {"dask", "pyarrow", "daskpile"}
    assert [f["name"] for f in manifest["schema"]] == ["id", "label", "x", "y", "z", "ts", "name"]
    assert daskpile.read_manifest(dest) == manifest
    assert report.rows == 10_000 and report.piles == 12 and report.seed == 5
    assert report.files == [os.path.join(dest, n) for n in names[:-1]]
    assert report.seconds_scatter > 0 and report.seconds_gather > 0 and report.scratch_bytes > 0
    assert report.output_bytes == sum(os.path.getsize(f) for f in report.files)  # told by the writers
    assert "10,000 rows" in str(report)


def test_exact_permutation_of_rows(client, source, tmp_path):
    dest = str(tmp_path / "out")
    daskpile.shuffle_parquet(source, dest, piles=7, seed=1)
    out = read_output(dest)
    expected = reference_table(0, 10_000, 10_000)
    assert out.sort_by("id").equals(expected)
    assert out["id"].to_pylist() != expected["id"].to_pylist()


def test_every_type_round_trips(client, tmp_path):
    table = every_type_table(600)
    write_parts(table, tmp_path / "src", parts=3)
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=4, seed=2)
    out = read_output(tmp_path / "out")
    assert_tables_equal(out.sort_by("id"), table)


def test_images_and_grids_of_vectors_come_through_whole(client, tmp_path):
    """pyarrow takes a fixed-size list of fixed-size lists from the wrong rows where it is a slice (a pile of a
    batch): the shuffle of a column of 3x2 grids failed verification, 147 of 200 rows holding others' grids."""
    rows = np.arange(600)
    grid = pa.list_(pa.list_(pa.int16(), 2), 3)
    table = pa.table(
        {
            "id": rows,
            "grid": pa.array([[[int(i), -int(i)]] * 3 for i in rows], grid),
            "image": pa.array([{"pixels": [[int(i) % 256] * 2] * 3} for i in rows], pa.struct([("pixels", grid)])),
            "tiles": pa.array([[[[int(i), 0], [1, 2], [3, 4]]] for i in rows], pa.list_(grid)),
        }
    )
    write_parts(table, tmp_path / "src", parts=3)
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=4, seed=2)
    assert_tables_equal(read_output(tmp_path / "out").sort_by("id"), table)


def test_seed_none_is_drawn_and_recorded(client, source, tmp_path):
    report = daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=3)
    assert daskpile.read_manifest(str(tmp_path / "out"))["seed"] == report.seed


def test_pandas_written_input_keeps_its_index_as_data(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"v": range(100)}, index=pd.Index(np.arange(1000, 1100), name="key"))
    os.makedirs(tmp_path / "src")
    frame.iloc[:50].to_parquet(tmp_path / "src" / "a.parquet")
    frame.iloc[50:].to_parquet(tmp_path / "src" / "b.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=3, seed=0)
    back = pd.read_parquet(tmp_path / "out")
    assert back.index.name == "key" and (back.index - 1000 == back["v"]).all() and len(back) == 100

    # A RangeIndex written by pandas is metadata only: it must not come back with the input's row numbers.
    os.makedirs(tmp_path / "src2")
    pd.DataFrame({"v": range(10)}).to_parquet(tmp_path / "src2" / "a.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "src2"), str(tmp_path / "out2"), piles=2, seed=0)
    assert sorted(pd.read_parquet(tmp_path / "out2")["v"]) == list(range(10))


@pytest.mark.parametrize(("rows", "piles"), [(5, 20), (100, 1), (1, 3)])
def test_edges_piles_vs_rows(client, tmp_path, rows, piles):
    write_parts(reference_table(0, rows, rows), tmp_path / "src", parts=1)
    report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=piles, seed=0)
    out = read_output(tmp_path / "out")
    assert len(report.files) == piles and out.num_rows == rows
    assert out.sort_by("id").equals(reference_table(0, rows, rows))


def test_empty_input_gives_empty_piles_with_the_schema(client, tmp_path):
    """Zero rows in, `piles` empty files out, each with the schema, and a manifest saying 0 rows."""
    empty = reference_table(0, 0, 0)
    write_parts(empty, tmp_path / "src", parts=2)
    report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=3, seed=0)
    assert report.rows == 0 and len(report.files) == 3
    out = read_output(tmp_path / "out")
    assert out.num_rows == 0 and out.schema.remove_metadata() == empty.schema
    assert daskpile.read_manifest(str(tmp_path / "out"))["rows_per_pile"] == [0, 0, 0]
    # no row group, not an empty one: Hugging Face datasets cannot read that ("BatchSize must be greater than 0")
    assert all(pq.ParquetFile(f).metadata.num_row_groups == 0 for f in report.files)
    assert daskpile.verify(str(tmp_path / "src"), str(tmp_path / "out")).ok


def test_empty_files_among_others(client, tmp_path):
    table = reference_table(0, 100, 100)
    os.makedirs(tmp_path / "src")
    pq.write_table(table.slice(0, 0), tmp_path / "src" / "a.parquet")
    pq.write_table(table, tmp_path / "src" / "b.parquet")
    pq.write_table(table.slice(0, 0), tmp_path / "src" / "c.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=4, seed=0)
    assert read_output(tmp_path / "out").sort_by("id").equals(table)


def test_source_as_glob_and_list(client, source, tmp_path):
    a = daskpile.shuffle_parquet(os.path.join(source, "*.parquet"), str(tmp_path / "a"), piles=3, seed=9)
    files = sorted(os.path.join(source, f) for f in os.listdir(source))
    b = daskpile.shuffle_parquet(files, str(tmp_path / "b"), piles=3, seed=9)
    assert a.source_files == b.source_files
    assert read_output(tmp_path / "a").equals(read_output(tmp_path / "b"))


def test_hidden_and_metadata_files_are_skipped(client, source, tmp_path):
    open(os.path.join(source, "_SUCCESS"), "w").close()
    open(os.path.join(source, ".crc"), "w").close()
    report = daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=0)
    assert len(report.source_files) == 4


def test_dest_not_empty_is_refused_unless_overwrite(client, source, tmp_path):
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=5, seed=0)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        daskpile.shuffle_parquet(source, str(dest), piles=3, seed=0, scratch=str(tmp_path / "scratch"))
    assert not (tmp_path / "scratch").exists()
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=1, overwrite=True)
    assert sorted(os.listdir(dest)) == ["_daskpile.json"] + [f"part-{j:05d}.parquet" for j in range(3)]
    assert daskpile.read_manifest(str(dest))["seed"] == 1


@pytest.mark.parametrize("piles", [0, -3, 2.5, "8", True, None])
def test_bad_piles_are_refused_before_writing(source, tmp_path, piles):
    with pytest.raises(ValueError, match="piles"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=piles)
    assert not (tmp_path / "out").exists()


def test_missing_source_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        daskpile.shuffle_parquet(str(tmp_path / "nowhere"), str(tmp_path / "out"), piles=2)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(FileNotFoundError, match=r"'.*emptydir' matches no files$"):
        daskpile.shuffle_parquet(str(tmp_path / "emptydir"), str(tmp_path / "out"), piles=2)


def test_conflicting_schemas_name_file_and_column(sync_scheduler, tmp_path):
    os.makedirs(tmp_path / "src")
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), tmp_path / "src" / "1.parquet")
    pq.write_table(pa.table({"a": [1.5, 2.5], "b": ["x", "y"]}), tmp_path / "src" / "2.parquet")
    with pytest.raises(ValueError, match=r"2\.parquet.* differs from that of .*1\.parquet.*a: double instead of int64"):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, scratch=str(tmp_path / "s"))
    assert not (tmp_path / "out").exists()
    assert list((tmp_path / "s").iterdir()) == []  # scratch cleaned


@pytest.mark.parametrize("damage", ["not parquet", "truncated"])
def test_corrupt_file_is_named(sync_scheduler, tmp_path, damage):
    os.makedirs(tmp_path / "src")
    pq.write_table(reference_table(0, 1000, 1000), tmp_path / "src" / "a.parquet")
    good = (tmp_path / "src" / "a.parquet").read_bytes()
    bad = b"this is not parquet" if damage == "not parquet" else good[:100] + good[-200:]
    (tmp_path / "src" / "bad.parquet").write_bytes(bad)
    (tmp_path / "scratch").mkdir()
    for first in ["a.parquet", "bad.parquet"]:  # a bad first file is read on the client, others in pass 1
        files = [str(tmp_path / "src" / n) for n in sorted(["a.parquet", "bad.parquet"], key=lambda n: n != first)]
        with pytest.raises(ValueError, match=r"bad\.parquet"):
            daskpile.shuffle_parquet(files, str(tmp_path / "out"), piles=2, scratch=str(tmp_path / "scratch"))
        assert not (tmp_path / "out").exists()
        assert list((tmp_path / "scratch").iterdir()) == []


def test_a_column_that_cannot_be_decoded_is_named_with_its_file(sync_scheduler, tmp_path):
    """Arrow's decoding errors name no column (a DuckDB ARRAY with null rows: "Length spanned by list offsets
    (26) larger than values array"): the column is found by reading each on its own.  Here a string's length
    prefix is damaged, in a file Arrow opens."""
    os.makedirs(tmp_path / "src")
    names = [f"abcdefgh{i}" for i in range(10)]
    table = pa.table({"id": range(10), "name": names, "z": pa.array(range(10), pa.int32())})
    pq.write_table(table, tmp_path / "src" / "a.parquet")
    pq.write_table(table, tmp_path / "bad.parquet", compression="none", use_dictionary=False, write_statistics=False)
    damaged = bytearray((tmp_path / "bad.parquet").read_bytes())
    at = damaged.index(b"abcdefgh0")
    damaged[at - 4 : at] = (1000).to_bytes(4, "little")  # the first string's length, past the page's end
    (tmp_path / "src" / "bad.parquet").write_bytes(damaged)
    with pytest.raises(ValueError, match=r"bad\.parquet' as Parquet: Invalid or truncated .* \(column 'name'\)$"):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2)
    assert not (tmp_path / "out").exists()


def test_dest_inside_source_is_refused(source):
    with pytest.raises(ValueError, match="overlaps"):
        daskpile.shuffle_parquet(source, os.path.join(source, "shuffled"), piles=2)
    with pytest.raises(ValueError, match="overlaps"):
        daskpile.shuffle_parquet(source, source, piles=2)


def test_files_named_one_by_one_overlap_dest_only_from_inside_it_or_by_a_link(source, tmp_path):
    import shutil

    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(sorted(glob.glob(os.path.join(source, "*.parquet")))[0], folder / "a.parquet")
    # dest in the files' folder, the folder not named as the source: the file is not in dest
    assert daskpile.shuffle_parquet([str(folder / "a.parquet")], str(folder / "out"), piles=2).rows > 0
    (tmp_path / "links").mkdir()
    os.symlink(folder / "out" / "part-00000.parquet", tmp_path / "links" / "b.parquet")
    with pytest.raises(ValueError, match="overlaps the source"):  # a source file is a link into dest
        daskpile.shuffle_parquet(str(tmp_path / "links"), str(folder / "out"), piles=2, overwrite=True)
    with pytest.raises(ValueError, match="overlaps the source"):  # a source file in dest, named alone
        daskpile.shuffle_parquet([str(folder / "out" / "part-00001.parquet")], str(folder / "out"), overwrite=True)


def test_scratch_is_removed_after_success(sync_scheduler, source, tmp_path):
    (tmp_path / "scratch").mkdir()
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=3, seed=0, scratch=str(tmp_path / "scratch"))
    assert list((tmp_path / "scratch").iterdir()) == []


@pytest.mark.parametrize("where", ["threads", "LocalCluster"])
def test_pass_2_removes_each_band_of_scratch_once_its_piles_are_written(request, source, tmp_path, monkeypatch, where):
    """While pass 2 works on the other bands; band 0 stays until the end, for a resumed run."""
    if where == "LocalCluster":
        request.getfixturevalue("client")
    dest, piles = tmp_path / "out", 16
    removed = []
    remove_band = _scratch.Scratch.remove_band

    def spy(self, band):  # the real removal, noting what dest held when it started
        removed.append((band, set(os.listdir(dest))))
        remove_band(self, band)

    monkeypatch.setattr(_scratch.Scratch, "remove_band", spy)
    with dask.config.set(scheduler="threads") if where == "threads" else contextlib.nullcontext():
        daskpile.shuffle_parquet(source, str(dest), piles=piles, seed=0, scratch=str(tmp_path / "scratch"))
    bounds = _scratch.band_bounds(piles)
    assert sorted(band for band, _ in removed) == list(range(1, len(bounds) - 1))  # each once, all but band 0
    for band, in_dest in removed:
        assert {f"part-{j:05d}.parquet" for j in range(bounds[band], bounds[band + 1])} <= in_dest
    assert list((tmp_path / "scratch").iterdir()) == []


def test_pass_2_runs_the_tasks_of_band_0_last(sync_scheduler, source, tmp_path, monkeypatch):
    """Band 0 is removed at the end in any case (it marks finished partitions): its piles go last."""
    started = []
    gather = _passes.gather_to_parquet

    def spy(scratch, total_piles, piles, *args, **kwargs):
        started.append(piles[0])
        return gather(scratch, total_piles, piles, *args, **kwargs)

    monkeypatch.setattr(_passes, "gather_to_parquet", spy)
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=32, seed=0, scratch=str(tmp_path / "scratch"))
    assert started == sorted(started, reverse=True) and started[-1] == 0


def test_output_is_a_partitioned_dataset_readers_understand(client, source, tmp_path):
    import dask.dataframe as dd

    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=6, seed=0)
    ddf = dd.read_parquet(str(tmp_path / "out"))
    assert ddf.npartitions == 6 and len(ddf) == 10_000
    assert np.array_equal(ddf["id"].compute().to_numpy(), read_output(tmp_path / "out")["id"].to_numpy())


def test_snappy_only_where_it_shrinks_the_column(client, tmp_path):
    rng = np.random.default_rng(0)
    table = pa.table({"id": np.arange(40_000), "noise": rng.random(40_000), "word": ["repeated"] * 40_000})
    write_parts(table, tmp_path / "src", parts=2)
    daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, seed=1)
    for name in ["part-00000.parquet", "part-00001.parquet"]:
        group = pq.read_metadata(tmp_path / "out" / name).row_group(0)
        codecs = {group.column(i).path_in_schema: group.column(i).compression for i in range(group.num_columns)}
        assert codecs == {"id": "SNAPPY", "noise": "UNCOMPRESSED", "word": "SNAPPY"}
    assert read_output(tmp_path / "out").sort_by("id").equals(table)


def test_tables_with_nested_columns_or_repeated_names_keep_snappy_everywhere():
    noise = np.random.default_rng(0).random(10_000)
    assert _passes.compression(pa.table({"noise": noise}))["noise"] == "none"
    assert _passes.compression(pa.table({"noise": noise, "nested": [[1, 2]] * 10_000})) == "snappy"
    assert _passes.compression(pa.Table.from_arrays([noise, noise], names=["a", "a"])) == "snappy"


def test_a_threaded_shuffle_of_parquet_does_not_import_pandas(source, tmp_path):
    """pyarrow imports pandas on its first ``pa.array`` of numpy data: 0.25-0.6 s holding the GIL, mid-shuffle."""
    script = """
        import json, sys, dask, daskpile
        with dask.config.set(scheduler="threads", num_workers=2):
            daskpile.shuffle_parquet(sys.argv[1], sys.argv[2], piles=4, seed=1)
        print(json.dumps("pandas" in sys.modules))
    """
    assert run_in_fresh_process(script, source, str(tmp_path / "out")) is False
