"""Memory bounded by a piece of input and a pile, not by the size of a file or the dataset."""

import collections
import functools
import itertools
import json
import os

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import file_bytes, over_processes, read_output, resumed_as_begun, run_in_fresh_process
from scipy import stats

import daskpile
from daskpile.engine import _passes, _scratch
from daskpile.sources import plan_sources, read_pieces

ROWS_PER_GROUP = 20_000


def write_many_row_groups(path, rows: int, start: int = 0) -> None:
    rng = np.random.default_rng(start)
    table = pa.table(
        {
            "id": np.arange(start, start + rows),
            "x": rng.normal(size=rows),
            "s": pa.array([f"row {i}" for i in range(start, start + rows)]),
        }
    )
    pq.write_table(table, path, row_group_size=ROWS_PER_GROUP)


@pytest.fixture(scope="module")
def big_files(tmp_path_factory):
    source = tmp_path_factory.mktemp("bounded") / "in"
    source.mkdir()
    write_many_row_groups(source / "a.parquet", 200_000)  # 10 row groups
    write_many_row_groups(source / "b.parquet", 50_000, start=200_000)  # 3 row groups
    return str(source)


def group_bytes(path) -> int:
    return pq.read_metadata(path).row_group(0).total_byte_size


def piece_rows(path, blocksize) -> list[int]:
    plan = plan_sources(path)
    return [table.num_rows for _, table in read_pieces(plan.fs, list(plan.files), plan.reading, blocksize)]


def test_row_groups_are_grouped_into_pieces(big_files):
    path = os.path.join(big_files, "a.parquet")  # 10 row groups of 20,000 rows
    one = group_bytes(path)
    assert piece_rows(path, 10**12) == [200_000]
    assert piece_rows(path, int(3.5 * one)) == [60_000, 60_000, 60_000, 20_000]
    largest = max(pq.read_metadata(path).row_group(g).total_byte_size for g in range(10))
    assert piece_rows(path, largest // 4 + 1) == [5_000] * 40  # a larger row group in parts of its rows


def write_row_groups(path, sizes: list[int]) -> pa.Table:
    """A file of row groups of these many rows each, ids counting up through them; returns its rows.

    Unique strings, written plain (no dictionary page, a fixed cost to read that is large beside a small file)."""
    rows = sum(sizes)
    table = pa.table({"id": np.arange(rows), "s": pa.array([f"row {i:08d}" for i in range(rows)])})
    with pq.ParquetWriter(path, table.schema, use_dictionary=False) as writer:
        start = 0
        for size in sizes:
            writer.write_table(table.slice(start, size), row_group_size=max(size, 1))  # (0: a row group of none)
            start += size
    return table


def test_a_row_group_larger_than_blocksize_is_read_in_parts_between_whole_ones(tmp_path):
    """Cut before, at whole-row-group boundaries around it, and after: no piece empty, none numbered twice.

    A row group was never cut: a file written with one large row group (pandas and pyarrow before 15 wrote
    64 Mi rows to one) was one piece whatever the blocksize, and killed a worker of 1 GiB reading 717 MiB."""
    path = tmp_path / "groups.parquet"
    table = write_row_groups(path, [1_000, 1_000, 0, 100_000, 1_000, 100_000, 0])
    footer = pq.read_metadata(path)
    assert [footer.row_group(g).num_rows for g in range(footer.num_row_groups)][2::4] == [0, 0]
    blocksize = max(footer.row_group(g).total_byte_size for g in (3, 5)) // 4 + 1
    plan = plan_sources(str(path))
    pieces = list(read_pieces(plan.fs, list(plan.files), plan.reading, blocksize))
    assert [p for p, _ in pieces] == list(range(len(pieces)))
    rows = [t.num_rows for _, t in pieces]
    # the two small ones together; a large one in 4 parts; the third small one alone, as the next group is cut
    assert rows == [2_000] + [25_000] * 4 + [1_000] + [25_000] * 4, rows
    assert pa.concat_tables(t for _, t in pieces).equals(table)  # every row once, in the file's order
    # a resumed task reads only the parts not done; one done before them is still decoded, none after them
    done = {0, 1, 3, 4, 7, 8, 9}
    resumed = list(read_pieces(plan.fs, list(plan.files), plan.reading, blocksize, skip=done.__contains__))
    assert [p for p, _ in resumed] == list(range(len(pieces)))
    for (piece, again), (_, first) in zip(resumed, pieces, strict=True):
        assert (again is None) if piece in done else again.equals(first)


def test_a_run_begun_before_row_groups_were_cut_resumes_reading_them_whole():
    """Its scratch numbers pieces of whole row groups: read otherwise, a reused piece would hold other rows."""
    from daskpile.engine import _run

    spec = _run.RunSpec(("a.parquet",), ("1",), piles=8, seed=1, dest="/d", blocksize=2**20)
    assert spec.cut_row_groups and _run.RunSpec.from_json(spec.to_json()) == spec
    before = {k: v for k, v in spec.to_json().items() if k != "cut_row_groups"}  # as such runs wrote it
    assert not _run.RunSpec.from_json(before).cut_row_groups
    assert "cut_row_groups" not in spec.call_json()  # the manifest's record of the call is as it was


def test_an_interrupted_run_begun_before_row_groups_were_cut_resumes_to_the_same_bytes(
    tmp_path, sync_scheduler, monkeypatch
):
    """Resumed with its row groups cut, a reused piece held other rows than its number now reads: 117,272 rows
    written from 60,000, "verified" (each piece's input fingerprint comes from its scratch)."""
    from daskpile.engine import _pipeline

    source = tmp_path / "in"
    source.mkdir()
    write_row_groups(source / "a.parquet", [20_000, 20_000])
    write_row_groups(source / "b.parquet", [10_000, 10_000])
    blocksize = pq.read_metadata(source / "a.parquet").row_group(0).total_byte_size // 3
    shuffle = functools.partial(daskpile.shuffle_parquet, str(source), piles=4, seed=2, blocksize=blocksize)
    # (the daskpile of now cuts row groups in new runs)
    report = resumed_as_begun(shuffle, tmp_path, monkeypatch, _pipeline, "CUT_ROW_GROUPS", False)
    assert report.resumed_partitions >= 1 and report.rows == 60_000
    cut = shuffle(str(tmp_path / "new"))  # and a new run cuts them: 3 parts of each of a's row groups
    assert cut.rows == 60_000 and file_bytes(tmp_path / "new") != file_bytes(tmp_path / "before")


def test_a_reused_piece_holding_other_rows_than_its_files_is_refused(tmp_path, sync_scheduler, monkeypatch):
    """A reused piece's input fingerprint is its scratch's own: a scratch file standing for other rows than
    its piece's (another piece's, as a numbering changed between versions would leave) was written and
    verified.  Pass 1 now counts each partition's rows against its files' footers."""
    source = tmp_path / "in"
    source.mkdir()
    write_row_groups(source / "a.parquet", [20_000, 20_000])  # in parts of 5,000 rows
    write_row_groups(source / "b.parquet", [7_000, 7_000])  # in parts of 3,500
    blocksize = pq.read_metadata(source / "a.parquet").row_group(0).total_byte_size // 3
    shuffle = functools.partial(
        daskpile.shuffle_parquet, str(source), str(tmp_path / "out"), piles=4, seed=2, blocksize=blocksize,
        scratch=str(tmp_path / "scratch"),
    )  # fmt: skip
    rows_of, scatter = {}, _passes.scatter_table  # (partition, piece): rows

    def interrupted_at_a_third_piece_of_a(table, partition, piles, seed, scratch, fingerprint=False, piece=0):
        if (partition, piece) == (0, 2):  # (pieces of 5,000 rows; of 6,667 with pyarrow 21, which sizes them so)
            raise RuntimeError("interrupted")
        rows_of[partition, piece] = table.num_rows
        return scatter(table, partition, piles, seed, scratch, fingerprint, piece)

    monkeypatch.setattr(_passes, "scatter_table", interrupted_at_a_third_piece_of_a)
    with pytest.raises(RuntimeError, match="interrupted"):
        shuffle()
    monkeypatch.undo()
    (run,) = [p for p in (tmp_path / "scratch").iterdir() if p.is_dir()]
    bands = sorted(run.glob("scatter-000001-b*.arrow"))  # b's first piece (named as a partition's only one)
    assert len(bands) == 4
    for band in bands:  # where a's second was
        target = run / band.name.replace("scatter-000001-", "scatter-000000-0001-")
        assert target.exists()
        target.write_bytes(band.read_bytes())
    scattered = 40_000 - rows_of[0, 1] + rows_of[1, 0]
    with pytest.raises(ValueError, match=rf"scattered {scattered:,} rows of '.*a\.parquet', whose footers say 40,000"):
        shuffle()
    assert not (tmp_path / "out").exists() and not run.exists()  # removed: the same call runs afresh
    assert shuffle().rows == 54_000


@pytest.mark.slow
def test_a_piece_of_dictionary_encoded_strings_is_blocksize_in_memory_not_on_disk(tmp_path, capsys):
    """Country names dictionary-encoded take a byte a row in a footer and 12 in memory: a file of 0.6 MB on
    disk was one piece of 19 MB with a blocksize of 4 MiB (a 29 MiB file, 426 MiB in memory, one 423 MiB piece at
    --blocksize 64MiB, killed a 1 GiB worker)."""
    import dataclasses

    from daskpile._storage import filesystem
    from daskpile.engine import _sizing

    countries = np.array(["United States", "Germany", "United Kingdom", "Brazil", "India", "Japan", "Mexico"])
    rng = np.random.default_rng(0)
    table = pa.table({f"c{k}": countries[rng.integers(0, len(countries), 400_000)] for k in range(4)})
    path = tmp_path / "countries.parquet"
    pq.write_table(table, path, row_group_size=50_000)
    fs, _ = filesystem(str(path))
    _, _, row_bytes = _sizing.estimate_parquet(fs, [str(path)], [fs.size(str(path))])
    plan = plan_sources(str(path))
    blocksize = 4 * 2**20
    by_footers = [t.nbytes for _, t in read_pieces(plan.fs, list(plan.files), plan.reading, blocksize)]
    assert len(by_footers) == 1 and by_footers[0] > 3 * blocksize  # what it was
    reading = dataclasses.replace(plan.reading, row_bytes=row_bytes)
    in_memory = [t.nbytes for _, t in read_pieces(plan.fs, list(plan.files), reading, blocksize)]
    assert sum(in_memory) == table.nbytes and len(in_memory) > 3 and max(in_memory) <= blocksize
    dest = tmp_path / "out"  # and a shuffle cuts its pieces so
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(str(path), str(dest), piles=3, seed=1, blocksize=blocksize, progress=True)
    assert f"in 1 task ({len(in_memory)} pieces)" in capsys.readouterr().out
    assert daskpile.verify(str(path), str(dest)).ok


@pytest.mark.slow
def test_a_categorical_s_dictionary_counts_once_not_once_a_piece(tmp_path, sync_scheduler):
    """Each piece's scratch carries the categorical's dictionary: counted in every pile once a piece, 20 pieces
    of a 2 MB dictionary made every pile "40 MB" and a run of 1.5 MB piles was refused or split for nothing."""
    categories = pa.array([f"{i:06d}-" + "c" * 94 for i in range(20_000)])
    source, dest = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    for k in range(20):
        values = pa.array(np.random.default_rng(k).integers(0, 20_000, 5_000).astype(np.int32))
        table = pa.table(
            {"id": np.arange(k * 5_000, (k + 1) * 5_000), "cat": pa.DictionaryArray.from_arrays(values, categories)}
        )
        pq.write_table(table, source / f"{k:02d}.parquet")
    report = daskpile.shuffle_parquet(
        str(source), str(dest), piles=8, seed=1, memory_per_pile=8 * 2**20, on_oversize="error", blocksize=2**20
    )  # (a task a file: 20 pieces, each with the dictionary)
    assert report.rows == 100_000 and len(report.files) == 8 and daskpile.verify(str(source), str(dest)).ok


@pytest.mark.slow
@pytest.mark.parametrize("cut", [3, 1 / 3], ids=["three row groups a piece", "a row group in three pieces"])
def test_a_file_larger_than_blocksize_is_shuffled_in_pieces(big_files, tmp_path, client, cut):
    blocksize = int(cut * group_bytes(os.path.join(big_files, "a.parquet"))) + 1
    report = daskpile.shuffle_parquet(big_files, str(tmp_path / "out"), piles=5, seed=1, blocksize=blocksize)
    out = read_output(tmp_path / "out")
    source = pa.concat_tables(pq.read_table(os.path.join(big_files, f)) for f in ["a.parquet", "b.parquet"])
    assert out.sort_by("id").equals(source)  # every row exactly once, values intact
    assert report.fingerprint is not None and daskpile.verify(big_files, str(tmp_path / "out")).ok
    # the same bytes on the local scheduler: pieces are decided by the data and blocksize, not the cluster
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(big_files, str(tmp_path / "sync"), piles=5, seed=1, blocksize=blocksize)
    assert file_bytes(tmp_path / "out") == file_bytes(tmp_path / "sync")


PEAK_SCRIPT = """
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
from daskpile.engine import _passes, _scratch
from daskpile.sources import plan_sources
path, scratch, blocksize = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = plan_sources(path)
run = _scratch.Scratch.create(scratch, None, 1)
result = _passes.scatter_partition(plan.fs, list(plan.files), 0, 4, 1, run, plan.reading, True, blocksize=blocksize)
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "pieces": result.pieces, "rows": result.rows}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("row_groups", [10, 1])
def test_pass_1_memory_is_bounded_by_blocksize_not_by_the_file(tmp_path, row_groups):
    """Arrow's peak allocation in a fresh process scattering a file of 10 row groups or of one, whole and in
    pieces of a tenth; and a file ten times larger in pieces of the same blocksize."""
    small, large = str(tmp_path / "small.parquet"), str(tmp_path / "large.parquet")
    write_row_groups(small, [200_000 // row_groups] * row_groups)
    write_row_groups(large, [2_000_000 // row_groups] * row_groups)
    tenth = sum(g.total_byte_size for g in map(pq.read_metadata(small).row_group, range(row_groups))) // 10
    whole = run_in_fresh_process(PEAK_SCRIPT, small, str(tmp_path / "whole"), str(10**12))
    pieces = run_in_fresh_process(PEAK_SCRIPT, small, str(tmp_path / "pieces"), str(tenth + 1))
    ten_times = run_in_fresh_process(PEAK_SCRIPT, large, str(tmp_path / "ten-times"), str(tenth + 1))
    assert whole["pieces"] == 1 and pieces["pieces"] == 10 and whole["rows"] == pieces["rows"] == 200_000
    assert ten_times["pieces"] >= 100 and ten_times["rows"] == 2_000_000
    # a tenth of the rows at a time; reading a piece also holds its compressed column chunks (files are not
    # memory-mapped), or a buffer of each when a row group is streamed (pyarrow 26: a quarter of the whole;
    # 21: two fifths), whatever the file's size: ten times the rows, in pieces, hold less than half the whole
    assert pieces["peak"] < whole["peak"] / 2, (pieces, whole)
    assert ten_times["peak"] < whole["peak"] / 2, (ten_times, whole)


def split_shuffle(rows_by_partition, sub_piles, seed, directory, permute=True) -> list[int]:
    """One pile over its budget, through the real pass functions: scatter, split, gather each sub-pile."""
    run = _scratch.Scratch.create(str(directory), None, len(rows_by_partition))
    for k, rows in enumerate(rows_by_partition):
        _passes.scatter_table(pa.table({"x": rows}), k, 1, seed, run)
    split = _passes.split_pile(run, 0, sub_piles, seed, flush_bytes=1)  # a flush per slice
    order = []
    with _scratch.PileReader(split.scratch) as reader:
        for sub in range(sub_piles):
            if permute:
                order += _passes.gather_table(reader.pile(sub), 0, seed, sub)["x"].to_pylist()
            else:
                order += [x for batch in reader.pile(sub) for x in batch["x"].to_pylist()]
    run.remove()
    return order


def split_orders(part, seeds, directory, permute) -> list[tuple]:
    return [tuple(split_shuffle([[0, 1], [2, 3]], 3, seed, directory / f"{permute}-{seed}", permute)) for seed in seeds]


@pytest.mark.slow
def test_all_24_orders_equally_likely_when_a_pile_is_split(tmp_path, two_processes):
    """4 rows in 2 partitions, all in one pile that is split in 3: chi-square on 960 seeds (40 an order), alpha 1e-3.

    The teeth need fewer seeds: sub-piles left in input order make some orders impossible.
    """
    orders = list(itertools.permutations(range(4)))

    def pvalue(permute, seeds):
        counts = collections.Counter(over_processes(two_processes, split_orders, range(seeds), tmp_path, permute))
        return stats.chisquare([counts[o] for o in orders]).pvalue

    assert pvalue(permute=True, seeds=960) > 1e-3
    assert pvalue(permute=False, seeds=480) < 1e-3  # teeth: sub-piles left in input order


@pytest.mark.slow
def test_piles_over_memory_per_pile_are_split_into_consecutive_files(big_files, tmp_path, client):
    dest = str(tmp_path / "out")
    budget = 2 * group_bytes(os.path.join(big_files, "a.parquet"))  # about 2 of the 12.5 row groups in a pile
    report = daskpile.shuffle_parquet(big_files, dest, piles=2, seed=3, memory_per_pile=budget)
    manifest = daskpile.read_manifest(dest)
    files = manifest["files"]
    assert (
        files == sorted(files) and len(files) > 2 and all(f.startswith(("part-00000-", "part-00001-")) for f in files)
    )
    assert sum(manifest["rows_per_file"]) == sum(manifest["rows_per_pile"]) == 250_000 == report.rows
    assert max(manifest["rows_per_file"]) < 250_000 / 4
    out = pa.concat_tables(pq.read_table(os.path.join(dest, f)) for f in files)
    assert np.array_equal(np.sort(out["id"].to_numpy()), np.arange(250_000))
    assert daskpile.verify(big_files, dest).ok and daskpile.quality(dest, "id").ok
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(big_files, str(tmp_path / "sync"), piles=2, seed=3, memory_per_pile=budget)
    assert file_bytes(dest) == file_bytes(tmp_path / "sync")


def test_on_oversize_error_stops_before_pass_2(big_files, tmp_path, sync_scheduler):
    dest = tmp_path / "out"
    scratch = tmp_path / "scratch"
    with pytest.raises(daskpile.PileTooLargeError, match=r"2 of 2 piles are over memory_per_pile=100,000 bytes"):
        daskpile.shuffle_parquet(
            big_files, str(dest), piles=2, memory_per_pile=100_000, on_oversize="error", scratch=str(scratch)
        )
    assert not dest.exists()
    assert list(scratch.iterdir()) == []


def blob_files(directory, blobs_per_file: int = 3, files: int = 3) -> str:
    """Thousands of tiny rows and a few of 2 MiB each: a pile's bytes do not follow its row count."""
    os.makedirs(directory, exist_ok=True)
    for k in range(files):
        start = k * 10_000
        payload = [b"x" * 2**21 if i % (10_000 // blobs_per_file) == 0 else b"" for i in range(10_000)]
        table = pa.table({"id": np.arange(start, start + 10_000), "blob": pa.array(payload, pa.binary())})
        pq.write_table(table, os.path.join(directory, f"part-{k}.parquet"))
    return str(directory)


@pytest.mark.slow
def test_a_pile_is_sized_by_its_own_rows_not_the_average_row(tmp_path, sync_scheduler):
    """15 rows of 2 MiB among 30,000 tiny ones, in 8 piles: a pile with three of them was over memory_per_pile,
    taken as its rows times the average row, neither split nor refused (on_oversize="error" said nothing), and
    a worker holding it was killed."""
    source = blob_files(tmp_path / "in", blobs_per_file=5)
    budget = 5 * 2**20  # two blobs and the tiny rows fit; three do not
    biggest = {}
    for seed in range(1, 6):
        daskpile.shuffle_parquet(source, str(tmp_path / f"plain-{seed}"), piles=8, seed=seed)
        sizes = [
            pq.read_table(tmp_path / f"plain-{seed}" / f).nbytes
            for f in sorted(os.listdir(tmp_path / f"plain-{seed}"))
            if f.endswith(".parquet")
        ]
        biggest[seed] = max(sizes)
    seed = next(s for s, size in biggest.items() if size > budget)  # (9 blobs in 8 piles: some pile has two)
    with pytest.raises(daskpile.PileTooLargeError, match=r"piles? (is|are) over memory_per_pile=5,242,880 bytes"):
        daskpile.shuffle_parquet(
            source, str(tmp_path / "refused"), piles=8, seed=seed, memory_per_pile=budget, on_oversize="error"
        )
    # split into sub-piles drawn at random (as the rows' content must not steer them): each is within its
    # budget, or the run is refused saying so (two blobs drawn into one sub-pile), never a worker killed
    outcomes = []
    for seed in [s for s, size in biggest.items() if size > budget]:
        dest = tmp_path / f"split-{seed}"
        try:
            report = daskpile.shuffle_parquet(source, str(dest), piles=8, seed=seed, memory_per_pile=budget)
        except ValueError as e:
            assert "even split in" in str(e) and not dest.exists()
            outcomes.append("refused")
            continue
        files = daskpile.read_manifest(str(dest))["files"]
        assert len(files) > 8 and report.rows == 30_000 and daskpile.verify(source, str(dest)).ok
        assert max(pq.read_table(dest / f).nbytes for f in files) <= budget
        outcomes.append("split")
    assert "split" in outcomes


def test_a_pile_that_no_split_brings_under_its_budget_is_refused_by_name(tmp_path, sync_scheduler):
    """A row larger than memory_per_pile: no sub-pile can hold it, and a worker loading it would be killed."""
    source = blob_files(tmp_path / "in", blobs_per_file=1, files=1)
    scratch = tmp_path / "scratch"
    refused = r"pile \d holds a row of 2,097,1\d\d bytes, as much as memory_per_pile=1,048,576 or more: no split"
    with pytest.raises(daskpile.PileTooLargeError, match=refused):
        daskpile.shuffle_parquet(
            source, str(tmp_path / "out"), piles=2, seed=1, memory_per_pile=2**20, scratch=str(scratch)
        )
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []


NESTED_BLOBS = {
    "struct": lambda blobs: pa.StructArray.from_arrays([blobs], ["image"]),
    "list": lambda blobs: pa.ListArray.from_arrays(np.arange(len(blobs) + 1, dtype=np.int32), blobs),
    "list of structs": lambda blobs: pa.ListArray.from_arrays(
        np.arange(len(blobs) + 1, dtype=np.int32), pa.StructArray.from_arrays([blobs], ["image"])
    ),
    "map": lambda blobs: pa.MapArray.from_arrays(
        np.arange(len(blobs) + 1, dtype=np.int32), pa.array(["key"] * len(blobs)), blobs
    ),
}


@pytest.mark.parametrize("nesting", NESTED_BLOBS)
def test_a_row_too_large_for_any_split_is_found_inside_nested_values(tmp_path, sync_scheduler, nesting):
    """Only fixed widths, strings and lists of numbers were counted in a row: a 2 MiB image in a struct,
    a list or a map went unseen, and its pile was split in up to 64 sub-piles before the run was refused."""
    source = tmp_path / "in"
    source.mkdir()
    blobs = pa.array([b"x" * 2**21 if i == 5 else b"" for i in range(10_000)], pa.binary())
    pq.write_table(pa.table({"id": np.arange(10_000), "nested": NESTED_BLOBS[nesting](blobs)}), source / "a.parquet")
    refused = r"pile \d holds a row of 2,097,\d{3} bytes, as much as memory_per_pile=1,048,576 or more: no split"
    with pytest.raises(daskpile.PileTooLargeError, match=refused):
        daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=2, seed=1, memory_per_pile=2**20)
    assert not (tmp_path / "out").exists()


def sequence(dest) -> np.ndarray:
    files = daskpile.read_manifest(str(dest))["files"]
    return np.concatenate([pq.read_table(os.path.join(dest, f), columns=["id"])["id"].to_numpy() for f in files])


def test_rows_per_file_cuts_the_same_sequence_into_equal_files(big_files, tmp_path, client):
    daskpile.shuffle_parquet(big_files, str(tmp_path / "piles"), piles=5, seed=1)
    scratch = tmp_path / "scratch"
    report = daskpile.shuffle_parquet(
        big_files, str(tmp_path / "equal"), piles=5, seed=1, rows_per_file=7_000, scratch=str(scratch)
    )
    manifest = daskpile.read_manifest(str(tmp_path / "equal"))
    assert manifest["rows_per_file"] == [7_000] * 35 + [250_000 - 35 * 7_000]
    assert len(report.files) == 36 and report.fingerprint is not None
    # the same uniformly random sequence as one file per pile, only cut differently
    assert np.array_equal(sequence(tmp_path / "equal"), sequence(tmp_path / "piles"))
    assert daskpile.verify(big_files, str(tmp_path / "equal")).ok
    assert list(scratch.iterdir()) == []  # the permuted piles went with the rest of scratch


def test_rows_per_file_with_split_piles(big_files, tmp_path, sync_scheduler):
    budget = 2 * group_bytes(os.path.join(big_files, "a.parquet"))
    daskpile.shuffle_parquet(big_files, str(tmp_path / "split"), piles=2, seed=3, memory_per_pile=budget)
    daskpile.shuffle_parquet(
        big_files, str(tmp_path / "equal"), piles=2, seed=3, memory_per_pile=budget, rows_per_file=100_000
    )
    assert daskpile.read_manifest(str(tmp_path / "equal"))["rows_per_file"] == [100_000, 100_000, 50_000]
    assert np.array_equal(sequence(tmp_path / "equal"), sequence(tmp_path / "split"))


def test_a_single_huge_csv_is_split_by_dask(tmp_path, sync_scheduler):
    """A text file has no row groups: Dask's blocksize cuts it into partitions, and each is a pass-1 task."""
    frame = pd.DataFrame({"id": np.arange(50_000), "s": [f"row {i}" for i in range(50_000)]})
    frame.to_csv(tmp_path / "one.csv", index=False)
    ddf = dd.read_csv(str(tmp_path / "one.csv"), blocksize=100_000)
    assert ddf.npartitions > 5  # one file, several bounded partitions
    out = daskpile.shuffle(ddf, piles=4, seed=1).compute()
    assert np.array_equal(np.sort(out["id"].to_numpy()), np.arange(50_000))


GATHER_PEAK_SCRIPT = """
import json, sys, threading
import psutil
from daskpile.engine import _passes, _scratch
from daskpile._storage import filesystem
directory, out, release_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
counts = json.loads(sys.argv[4])
_scratch.RELEASE_BYTES = release_bytes
run = _scratch.Scratch(filesystem(directory)[0], directory, len(counts[0]))
fs, _ = filesystem(out)
with _scratch.PileReader(run) as reader:
    schema = reader.pile(0)[0].schema
piles = list(range(len(counts)))
paths = [f"{out}/part-{j}.parquet" for j in piles]
rows = [sum(c) for c in counts]
# pile 0 alone first, so the libraries a gather loads are resident before the baseline
_passes.gather_to_parquet(run, len(piles), piles[:1], rows[:1], 1, fs, paths[:1], schema)
process, samples, done = psutil.Process(), [], threading.Event()
def sample():
    while not done.wait(0.002):
        samples.append(process.memory_info().rss)
before = process.memory_info().rss
sampler = threading.Thread(target=sample)
sampler.start()
_passes.gather_to_parquet(run, len(piles), piles[1:], rows[1:], 1, fs, paths[1:], schema)
done.set()
sampler.join()
print(json.dumps({"growth": max([*samples, process.memory_info().rss]) - before}))
"""


@pytest.mark.slow
def test_pass_2_memory_is_bounded_by_a_pile_not_by_the_task(tmp_path):
    """One task gathering 32 piles of 4 MB from 128 MB of scratch: mapped pages are dropped as they add up.

    Resident memory counts the scratch pages a task has mapped; kept for a whole
    task, they would grow with the data (all 128 MB here, the task's share on a
    real cluster), not with a pile.
    """
    partitions, rows, piles = 8, 1_000_000, 32
    run = _scratch.Scratch.create(str(tmp_path / "scratch"), None, partitions)
    counts = []
    for k in range(partitions):
        table = pa.table({"id": np.arange(k * rows, (k + 1) * rows), "x": np.random.default_rng(k).normal(size=rows)})
        counts.append(_passes.scatter_table(table, k, piles, 1, run).counts.tolist())
    by_pile = [[c[j] for c in counts] for j in range(piles)]
    args = [str(run.directory), str(tmp_path / "out"), str(8 * 2**20), json.dumps(by_pile)]
    growth = run_in_fresh_process(GATHER_PEAK_SCRIPT, *args)["growth"]
    assert growth < 64 * 2**20, f"pass 2 grew by {growth / 2**20:.0f} MiB for 4 MiB piles and 8 MiB release"
    assert read_output(tmp_path / "out").num_rows == partitions * rows


@pytest.mark.slow
def test_rows_a_task_cannot_hold_are_refused_before_pass_1(tmp_path):
    """Three rows of 300 MiB on workers of 1 GiB: pass 1's workers died four times over, then the advice was a
    smaller blocksize (a piece is at least a row).  Here rows of 70 MiB (zeros: a small file) on 512 MiB."""
    from distributed import Client, LocalCluster

    (tmp_path / "src").mkdir()
    blob = pa.array([bytes(70 * 2**20)] * 2, pa.binary())
    pq.write_table(pa.table({"id": [0, 1], "blob": blob}), tmp_path / "src" / "blobs.parquet", row_group_size=1)
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", dashboard_address=":0")
    said = (
        r"the rows of the source \('.*blobs\.parquet'\) take about 70 MiB each in memory, and a task holds a row "
        r"up to 8 times over, more than the 512 MiB it has .* at least 0\.8 GiB"
    )
    source, dest = str(tmp_path / "src"), str(tmp_path / "out")
    with cluster, Client(cluster):
        for piles in (2, "auto"):  # (auto: before the pile count is planned, which would refuse in its own terms)
            with pytest.raises(ValueError, match=said):
                daskpile.shuffle_parquet(source, dest, piles=piles, scratch=str(tmp_path))
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == ["src"]
    # A local scheduler's task may take the machine's memory: not refused
    with dask.config.set(scheduler="sync"):
        report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, scratch=str(tmp_path))
    assert report.rows == 2
