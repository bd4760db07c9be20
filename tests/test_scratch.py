import dataclasses
import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from daskpile import _kernels, _random
from daskpile._storage import filesystem
from daskpile.datasets import write_reference_dataset
from daskpile.engine import _passes, _scratch


@pytest.mark.parametrize("run_bytes", [1, 300, 1 << 30], ids=["a batch per pile", "runs", "one batch"])
def test_one_file_per_partition_piles_in_runs(tmp_path, monkeypatch, run_bytes):
    monkeypatch.setattr(_scratch, "RUN_BYTES", run_bytes)
    fs, _ = filesystem(str(tmp_path))
    table = pa.table(
        {
            "x": np.arange(100),
            "d": pa.array([f"v{i % 3}" for i in range(100)]).dictionary_encode(),
        }
    )
    grouped, counts = _kernels.scatter(table, 6, _random.generator(0, _random.SCATTER, 0))
    path = _scratch.scratch_path(str(tmp_path), 0)
    _scratch.write_piles(fs, path, grouped, counts)
    assert [p.name for p in tmp_path.iterdir()] == ["scatter-000000.arrow"]  # no temporary left behind
    with pa.memory_map(path) as f:
        batches = ipc.open_file(f).num_record_batches
    assert batches == {1: 6, 300: 3, 1 << 30: 1}[run_bytes]
    starts = _kernels.offsets(counts)
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 1)) as reader:
        for j in [0, 5, 2, 3, 1, 4]:  # out of order: a reader may go back to an earlier batch
            (batch,) = reader.pile(j)
            assert batch.schema == table.schema
            assert batch.equals(grouped.slice(starts[j], counts[j]))


def test_a_long_pile_is_cut_in_batches_of_at_most_a_write_locally_and_kept_whole_on_a_store(tmp_path):
    # The IPC writer hands the kernel a buffer a write; one of more than 2 MiB is cached in 2 MiB pages, ten
    # times dearer on a VM that reports free memory to its host (_storage.write_in_pieces).  On an object store a
    # batch is a request, so there a pile stays one batch.
    from daskpile._storage import WRITE_BUFFER_BYTES

    table = pa.table({"line": pa.array([f"{i:0100d}".encode() for i in range(60_000)]), "n": np.arange(60_000)})
    grouped, counts = _kernels.scatter(table, 3, _random.generator(0, _random.SCATTER, 0))  # 2 MB a pile
    starts = _kernels.offsets(counts)
    for url, most in [(str(tmp_path), WRITE_BUFFER_BYTES * 1.1), ("memory://scratch-test", None)]:
        fs, root = filesystem(url)
        _scratch.write_piles(fs, _scratch.scratch_path(root, 0), grouped, counts)
        with fs.open(_scratch.scratch_path(root, 0), "rb") as f:
            reader = ipc.open_file(pa.BufferReader(f.read()))
            sizes = [reader.get_batch(b).get_total_buffer_size() for b in range(reader.num_record_batches)]
        if most is None:
            assert len(sizes) == 3
        else:
            assert len(sizes) >= 6 and max(sizes) <= most
        with _scratch.PileReader(_scratch.Scratch(fs, root, 1)) as pile_reader:
            for j in [2, 0, 1]:  # out of order: a reader may go back to an earlier batch
                slices = pile_reader.pile(j)
                assert pa.Table.from_batches(slices).equals(
                    pa.Table.from_batches([grouped.slice(starts[j], counts[j])])
                )


def test_a_band_s_pile_under_the_write_size_stays_one_batch(tmp_path):
    # The limit of a batch goes by the band's own rows: a band's slice reports its whole partition's buffers
    # (get_total_buffer_size), which made 8 bands cut piles of 650 KB in batches of 120 KB.
    table = pa.table({"x": np.arange(640_000), "y": np.arange(640_000)})  # 10 MB
    grouped, counts = _kernels.scatter(table, 16, _random.generator(0, _random.SCATTER, 0))  # 640 KB a pile
    fs, root = filesystem(str(tmp_path))
    run = dataclasses.replace(_scratch.Scratch(fs, root, 1), bands=_scratch.band_bounds(16))
    run.write(0, 0, grouped, counts)
    for band in range(run.band_count):
        with pa.memory_map(run.path(0, 0, band)) as f:
            assert ipc.open_file(f).num_record_batches == 2  # its two piles, one batch each


def test_a_split_pile_draws_the_same_sub_piles_whatever_batches_scratch_holds_it_in(tmp_path):
    # Local scratch cuts a long pile in batches of about a write, a store's does not: the sub-piles are drawn
    # a scratch file at a time, so they are the same on both (else the output would depend on where scratch is).
    table = pa.table({"line": pa.array([f"{i:0100d}".encode() for i in range(60_000)])})  # 6 MB, one pile
    found = []
    for url in [str(tmp_path), "memory://split-test"]:
        fs, root = filesystem(url)
        run = _scratch.Scratch(fs, root, 2)
        for k, (start, rows) in enumerate([(0, 30_001), (30_001, 29_999)]):  # odd: numpy draws uint16 in pairs
            _passes.scatter_table(table.slice(start, rows), k, 1, 7, run)
        split = _passes.split_pile(run, 0, 4, 7, flush_bytes=2**30)
        with _scratch.PileReader(split.scratch) as reader:
            found.append([pa.Table.from_batches(reader.pile(sub)) for sub in range(4)])
    local, remote = found
    assert all(a.equals(b) for a, b in zip(local, remote, strict=True))
    assert sum(t.num_rows for t in local) == 60_000


def test_pile_runs_close_once_they_reach_the_size():
    counts = np.array([3, 0, 4, 10, 0, 0, 1, 2, 2])  # a pile over the size is a run of its own
    runs = _scratch.pile_runs(counts, 4)
    assert runs.tolist() == [3, 1, 5]  # rows 3 0 4 | 10 | 0 0 1 2 2
    assert runs.sum() == len(counts)
    assert _scratch.pile_runs(np.zeros(5, dtype=np.int64), 4).tolist() == [5]


def test_empty_piles_are_empty_batches(tmp_path):
    fs, _ = filesystem(str(tmp_path))
    table = pa.table({"x": [1, 2]})
    grouped, counts = _kernels.scatter(table, 50, _random.generator(0, _random.SCATTER, 0))
    _scratch.write_piles(fs, _scratch.scratch_path(str(tmp_path), 0), grouped, counts)
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 1)) as reader:
        assert sum(sum(b.num_rows for b in reader.pile(j)) for j in range(50)) == 2


def test_scratch_directory_lifetime(tmp_path):
    run = _scratch.Scratch.create(str(tmp_path), None, partitions=2)
    assert run.fs.isdir(run.directory) and run.directory.startswith(str(tmp_path))
    run.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_reader_counts_the_pages_of_the_piles_it_read_not_of_their_batches(tmp_path, monkeypatch):
    """Counting whole batches made a reader of 200 files unmap and reopen them every pile or two."""
    monkeypatch.setattr(_scratch, "RUN_BYTES", 1 << 30)  # one batch holding every pile
    fs, _ = filesystem(str(tmp_path))
    table = pa.table({"x": np.arange(64_000)})
    grouped, counts = _kernels.scatter(table, 64, _random.generator(0, _random.SCATTER, 0))
    _scratch.write_piles(fs, _scratch.scratch_path(str(tmp_path), 0), grouped, counts)
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 1)) as reader:
        reader.pile(5)
        assert reader._mapped == 8 * counts[5]  # int64: 8 bytes a row


def test_a_file_per_band_of_piles_each_read_for_its_own_piles(tmp_path):
    fs, _ = filesystem(str(tmp_path))
    table = pa.table({"x": np.arange(1_000), "s": [f"v{i}" for i in range(1_000)]})
    grouped, counts = _kernels.scatter(table, 10, _random.generator(0, _random.SCATTER, 0))
    run = _scratch.Scratch(fs, str(tmp_path), 1, bands=_scratch.band_bounds(10, 4))  # piles 0-2, 3-5, 6-8, 9
    assert run.write(0, 0, grouped, counts) == sum(p.stat().st_size for p in tmp_path.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"scatter-000000-b{b}.arrow" for b in range(4)]
    starts = _kernels.offsets(counts)
    with _scratch.PileReader(run) as reader:
        for j in [9, 0, 4, 3, 8, 1]:  # across bands and back
            (batch,) = reader.pile(j)
            assert batch.equals(grouped.slice(starts[j], counts[j]))
            assert reader._band == run.band_of(j)
    run.remove_band(0)
    assert not fs.exists(run.path(0, 0, 0)) and fs.exists(run.path(0, 0, 1))
    run.remove_band(0)  # already gone: nothing to do


def test_a_band_s_file_indexes_its_own_piles_and_band_0_s_every_pile(tmp_path):
    """Every band's file held the rows, bytes and largest row of every pile, uncompressed: 3,600 pieces of
    16 KiB into 1,000 piles wrote 125 MB of scratch for 5.7 MB of rows.  Band 0's file, which a resumed run
    reads, holds them all; the others only their piles' rows."""
    fs, _ = filesystem(str(tmp_path))
    table = pa.table({"x": np.arange(1_000)})
    bounds = _scratch.band_bounds(1_000, 4)
    run = _scratch.Scratch(fs, str(tmp_path), 1, bands=bounds)
    scattered = _passes.scatter_table(table, 0, 1_000, 0, run)
    footers = [_scratch.read_footer(fs, run.path(0, 0, band)) for band in range(4)]
    assert len(_scratch.decode_integers(footers[0][_scratch.COUNTS_KEY])) == 1_000
    assert {_passes.PILE_BYTES_KEY, _passes.LARGEST_ROWS_KEY, _passes.NULLS_KEY} <= set(footers[0])
    for band, footer in enumerate(footers[1:], 1):
        own = scattered.counts[bounds[band] : bounds[band + 1]]
        assert _scratch.decode_integers(footer[_scratch.COUNTS_KEY]).tolist() == own.tolist()
        assert not {_passes.PILE_BYTES_KEY, _passes.LARGEST_ROWS_KEY, _passes.NULLS_KEY} & set(footer)
    with _scratch.PileReader(run) as reader:
        rows = [pa.Table.from_batches(reader.pile(j), table.schema)["x"].to_pylist() for j in range(1_000)]
    assert sorted(x for pile in rows for x in pile) == list(range(1_000))
    assert [len(pile) for pile in rows] == scattered.counts.tolist()
    assert scattered.scratch_bytes < 4 * table.nbytes  # (every pile's numbers in every band, uncompressed: 16x)


def test_footers_written_before_their_arrays_were_compressed_read_as_they_did():
    """A run resumed by a newer daskpile reads the scratch an older one wrote: every pile's rows in a band's
    footer, in base64 of int64 alone."""
    import base64

    def old(values):
        return base64.b64encode(np.array(values, "<i8").tobytes())

    index = _scratch.PileIndex.from_footer(
        {b"daskpile.counts": old([3, 0, 2, 4]), b"daskpile.batch_lengths": old([6]), b"daskpile.first_pile": b"1"}
    )
    assert (index.pile_start[1:4], index.batch_start) == ([0, 0, 2], [0, 6])
    assert _scratch.decode_integers(old([5, 0]).decode()).tolist() == [5, 0]


@pytest.mark.parametrize(
    "rows, piles, pieces", [(500, 1_000, 20), (200_000, 64, 2), (20_000, 8_192, 4)],
    ids=["small pieces, many piles", "large pieces", "many piles"],
)  # fmt: skip
def test_the_scratch_estimate_covers_what_pieces_write(tmp_path, rows, piles, pieces):
    """The free-space check's estimate: no less than what is written, nor twice as much."""
    fs, _ = filesystem(str(tmp_path))
    rng = np.random.default_rng(0)
    tables = [
        pa.table({"x": rng.integers(0, 2**40, rows), "y": rng.random(rows), "s": [f"s{i}" for i in range(rows)]})
        for _ in range(pieces)
    ]
    bands = _scratch.bands_for(tables[0].nbytes, tables[0].schema)
    run = _scratch.Scratch(fs, str(tmp_path), pieces, bands=_scratch.band_bounds(piles, bands))
    written = sum(_passes.scatter_table(t, k, piles, 0, run).scratch_bytes for k, t in enumerate(tables))
    estimate = _scratch.scratch_bytes(sum(t.nbytes for t in tables), pieces, bands, piles, tables[0].schema)
    assert written <= estimate <= 2 * written, (written, estimate)


def test_a_partition_is_finished_once_its_band_0_written_last_is_there_whatever_pass_2_removed(tmp_path):
    fs, _ = filesystem(str(tmp_path))
    table = pa.table({"x": np.arange(100)})
    grouped, counts = _kernels.scatter(table, 8, _random.generator(0, _random.SCATTER, 0))
    run = _scratch.Scratch(fs, str(tmp_path), 1, bands=_scratch.band_bounds(8, 4))
    run.write(0, 0, grouped, counts)
    for band in (3, 1, 2):  # what pass 2 removes before the end, in any order
        run.remove_band(band)
    finished = _passes._finished_scatter(run, 0, 0, 8, fingerprint=False)
    assert finished.reused and finished.counts.tolist() == counts.tolist()
    assert finished.scratch_bytes == fs.size(run.last_path(0))
    # another band layout, or no band 0 (written last): the partition is done again
    assert _passes._finished_scatter(dataclasses.replace(run, bands=(0, 4, 8)), 0, 0, 8, fingerprint=False) is None
    run.remove_band(0)
    assert _passes._finished_scatter(run, 0, 0, 8, fingerprint=False) is None


@pytest.mark.parametrize("hard", ["above", "at"], ids=["soft limit raised", "one file at a time"])
def test_pass_2_reads_more_scratch_files_than_the_open_files_limit(tmp_path, hard):
    """A band holds a scratch file per pass-1 task; a process's soft limit of open files is often 1,024."""
    import subprocess
    import sys

    source, dest = tmp_path / "source", tmp_path / "dest"
    write_reference_dataset(str(source), rows=6_000, files=150)  # 150 tasks: 150 scratch files per band
    limits = "(48, 4096)" if hard == "above" else "(48, 48)"
    script = f"""
import resource, dask, daskpile
resource.setrlimit(resource.RLIMIT_NOFILE, {limits})
with dask.config.set(scheduler="threads", num_workers=2):
    report = daskpile.shuffle_parquet({str(source)!r}, {str(dest)!r}, piles=3, seed=1, blocksize=1)
print(report.rows, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows, soft = map(int, done.stdout.split())
    assert rows == 6_000 and soft == (4096 if hard == "above" else 48)


def test_pass_2_reads_rather_than_maps_more_scratch_files_than_a_reader_may_map(tmp_path, monkeypatch):
    """Every mapped scratch file of a band is a memory map, in every thread, and Linux caps a process's maps
    (vm.max_map_count): past a reader's share of it, pass 2 reads the files instead (the same verified result)."""
    import dask

    import daskpile

    source = tmp_path / "source"
    write_reference_dataset(str(source), rows=6_000, files=30)  # 30 scratch files per band
    opened = []
    open_scratch = _scratch._open_scratch

    def spy(fs, path, mapped=True, listed=None):
        opened.append(mapped)
        return open_scratch(fs, path, mapped, listed)

    monkeypatch.setattr(_scratch, "_open_scratch", spy)
    with dask.config.set(scheduler="threads", num_workers=2):
        mapped = daskpile.shuffle_parquet(str(source), str(tmp_path / "mapped"), piles=3, seed=1, blocksize=1)
        assert opened and all(opened)
        opened.clear()
        monkeypatch.setattr(_scratch, "maps_budget", lambda: 29)
        read = daskpile.shuffle_parquet(str(source), str(tmp_path / "read"), piles=3, seed=1, blocksize=1)
    assert opened and not any(opened)
    assert read.rows == mapped.rows == 6_000 and read.fingerprint == mapped.fingerprint
    for name in ("part-00000.parquet", "part-00001.parquet", "part-00002.parquet"):
        assert (tmp_path / "read" / name).read_bytes() == (tmp_path / "mapped" / name).read_bytes()


def test_a_pile_of_many_small_slices_is_combined_as_read_the_same_rows_in_the_same_order(tmp_path, monkeypatch):
    """A slice holds an array a column whatever its rows: 150 tasks of 3 columns is 450 arrays a pile."""
    monkeypatch.setattr(_scratch, "COMPACT_ARRAYS", 100)
    fs, _ = filesystem(str(tmp_path))
    expected = {j: [] for j in range(4)}
    for k in range(150):
        table = pa.table({"x": np.arange(20) + 20 * k, "s": [f"v{i}" for i in range(20)], "y": np.ones(20)})
        grouped, counts = _kernels.scatter(table, 4, _random.generator(0, _random.SCATTER, k))
        _scratch.write_piles(fs, _scratch.scratch_path(str(tmp_path), k), grouped, counts)
        starts = _kernels.offsets(counts)
        for j in range(4):
            expected[j].append(grouped.slice(starts[j], counts[j]))
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 150)) as reader:
        for j in range(4):
            batches = reader.pile(j)
            held = sum(1 for part in expected[j] if part.num_rows)  # (empty slices are left out)
            assert len(batches) == held // 34 + held % 34  # each 34 slices (102 arrays) combined into one
            assert pa.Table.from_batches(batches).equals(pa.Table.from_batches(expected[j]))


@pytest.mark.parametrize("fields, one_at_a_time", [(450, False), (449, True)])
def test_a_band_of_more_columns_in_all_than_a_reader_may_hold_open_is_read_a_file_at_a_time(
    tmp_path, monkeypatch, fields, one_at_a_time
):
    """An open file holds its schema and its last batch, objects a column: 150 files of 3 columns is 450."""
    monkeypatch.setattr(_scratch, "OPEN_FIELDS", fields)
    fs, _ = filesystem(str(tmp_path))
    expected = []
    for k in range(150):
        table = pa.table({"x": np.arange(20) + 20 * k, "s": [f"v{i}" for i in range(20)], "y": np.ones(20)})
        grouped, counts = _kernels.scatter(table, 4, _random.generator(0, _random.SCATTER, k))
        _scratch.write_piles(fs, _scratch.scratch_path(str(tmp_path), k), grouped, counts)
        expected.append(grouped.slice(_kernels.offsets(counts)[2], counts[2]))
    with _scratch.PileReader(_scratch.Scratch(fs, str(tmp_path), 150)) as reader:
        assert pa.Table.from_batches(reader.pile(2)).equals(pa.Table.from_batches(expected))
        assert reader._one_at_a_time is one_at_a_time and len(reader._files) == (0 if one_at_a_time else 150)


def test_combining_a_pile_s_slices_changes_nothing_in_the_output(tmp_path, monkeypatch):
    import dask
    import pyarrow.parquet as pq

    import daskpile

    source = tmp_path / "source"
    write_reference_dataset(str(source), rows=6_000, files=150)  # 150 tasks: 150 slices a pile
    outputs = {}
    with dask.config.set(scheduler="sync"):
        for arrays in (10**9, 100):
            monkeypatch.setattr(_scratch, "COMPACT_ARRAYS", arrays)
            dest = tmp_path / str(arrays)
            outputs[arrays] = daskpile.shuffle_parquet(str(source), str(dest), piles=3, seed=1, blocksize=1)
    assert outputs[100].fingerprint == outputs[10**9].fingerprint
    for name in ("part-00000.parquet", "part-00001.parquet", "part-00002.parquet"):
        assert pq.read_table(tmp_path / "100" / name).equals(pq.read_table(tmp_path / str(10**9) / name))


@pytest.mark.slow
def test_a_wide_source_in_small_partitions_is_scattered_in_fewer_bands_to_the_same_output(tmp_path, monkeypatch):
    """300 columns in ranges of 32 KiB: split in 8 bands, each range's files would be mostly schema."""
    import dask
    import pyarrow.parquet as pq

    import daskpile

    source = tmp_path / "wide.csv"
    with open(source, "w") as f:
        f.write(",".join(f"c{j}" for j in range(300)) + "\n")
        for i in range(200):
            f.write(",".join(str(i * 300 + j) for j in range(300)) + "\n")
    written = []
    write_piles = _scratch.write_piles
    monkeypatch.setattr(_scratch, "write_piles", lambda fs, path, *a: written.append(path) or write_piles(fs, path, *a))
    with dask.config.set(scheduler="sync"):
        fewer = daskpile.shuffle_parquet(str(source), str(tmp_path / "fewer"), piles=8, seed=1, blocksize="512KiB")
        names = [_scratch.parse_scratch_name(path.rsplit("/", 1)[1]) for path in written]
        ranges = {(partition, piece) for partition, piece, _ in names}
        assert len(ranges) > 4 and len(written) == len(ranges)  # a file a range, not 8
        written.clear()
        monkeypatch.setattr(_scratch, "bands_for", lambda *args: _scratch.BANDS)
        eight = daskpile.shuffle_parquet(str(source), str(tmp_path / "eight"), piles=8, seed=1, blocksize="512KiB")
        assert len(written) == 8 * len(ranges)
    assert fewer.fingerprint == eight.fingerprint
    for j in range(8):
        name = f"part-{j:05d}.parquet"
        assert pq.read_table(tmp_path / "fewer" / name).equals(pq.read_table(tmp_path / "eight" / name))


def test_a_partition_s_finished_scratch_is_reused_only_where_the_run_s_listing_holds_it(tmp_path):
    """Pass 1 looked for each piece's scratch file, a request a piece on an object store (on moto, 1,569 of
    them as long as pass 1 itself), even in a new run; it now goes by one listing of the directory."""
    from daskpile.sources import plan_sources

    write_reference_dataset(tmp_path / "src", rows=1_000, files=1)
    plan = plan_sources(str(tmp_path / "src"))
    scratch = _scratch.Scratch.create(str(tmp_path / "scratch"), None, 1)
    first = _passes.scatter_partition(plan.fs, list(plan.files), 0, 4, 1, scratch, plan.reading, True)
    assert not first.reused

    kept = scratch.kept()
    run = tmp_path / "scratch" / scratch.directory.rsplit("/", 1)[1]
    names = ["scatter-000000.arrow", "scatter-000000.done.json"]  # (the partition's record: every piece written)
    assert kept == {0: {name: (run / name).stat().st_size for name in names}}
    again = _passes.scatter_partition(plan.fs, list(plan.files), 0, 4, 1, scratch, plan.reading, True, kept=kept[0])
    assert again.reused and again.scratch_bytes == first.scratch_bytes and again.fingerprint == first.fingerprint
    unlisted = _passes.scatter_partition(plan.fs, list(plan.files), 0, 4, 1, scratch, plan.reading, True, kept={})
    assert not unlisted.reused and unlisted.fingerprint == first.fingerprint  # written again, the same rows


def test_a_partition_s_done_record_serves_only_the_files_it_was_written_for(tmp_path):
    """A record reused for a partition grouped otherwise (another version, a grouping the run's spec does not
    hold) would stand for pieces of other rows: it names its files, and serves those alone."""
    scratch = _scratch.Scratch.create(str(tmp_path / "scratch"), None, 2)
    scratch.write_done(1, "files-a", pieces=3, footer_rows=600)
    kept = scratch.kept()
    assert list(kept) == [1] and scratch.read_done(1, "files-a", kept[1]) == {"pieces": 3, "footer_rows": 600}
    assert scratch.read_done(1, "files-b", kept[1]) is None and scratch.read_done(0, "files-a") is None
    assert scratch.read_done(1, "files-a", kept={}) is None  # not in the run's listing: not looked for
    (tmp_path / "scratch" / posixpath.basename(scratch.directory) / "scatter-000001.done.json").write_text("{")
    assert scratch.read_done(1, "files-a") is None  # unreadable: the partition is read again


@pytest.mark.parametrize("mapped", [True, False])
def test_a_scratch_file_gone_under_the_run_is_said_naming_it(tmp_path, mapped):
    """On S3 the run said only "The specified key does not exist." (a clean --older-than had removed it)."""
    fs = filesystem(str(tmp_path))[0]
    path = str(tmp_path / "daskpile-0123" / "scatter-000003.arrow")
    with pytest.raises(FileNotFoundError, match=r"scratch file '.*scatter-000003.arrow' is gone, removed while"):
        _scratch.ScratchFile(fs, path, mapped=mapped)


def test_scratch_is_made_private_and_a_found_one_is_tightened_or_refused(tmp_path):
    """Under a folder every user may write to (/tmp, the default root), scratch holds a copy of the rows under
    a name any user can work out: made 0700 whatever the umask; one of this user's found there (a run
    interrupted before scratch was private) made 0700; a link, one every user may write to, or another
    user's, refused.  Under a folder of the user's own (or a team's), made and used as before."""
    import os

    from daskpile._storage import ScratchNotPrivateError, make_private_directory

    fs, _ = filesystem(str(tmp_path))
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    old = os.umask(0o002)
    try:
        make_private_directory(fs, str(shared / "daskpile-a"))
        assert os.stat(shared / "daskpile-a").st_mode & 0o777 == 0o700
        (shared / "mine").mkdir(mode=0o775)
        make_private_directory(fs, str(shared / "mine"))
        assert os.stat(shared / "mine").st_mode & 0o777 == 0o700
        make_private_directory(fs, str(own / "daskpile-b"))  # (its parent made too)
        assert os.stat(own / "daskpile-b").st_mode & 0o777 == 0o775  # as the umask says
        (own / "open").mkdir()
        os.chmod(own / "open", 0o777)
        make_private_directory(fs, str(own / "open"))  # no one else may write to its parent: not checked
    finally:
        os.umask(old)
    (shared / "open").mkdir()
    os.chmod(shared / "open", 0o777)
    (shared / "link").symlink_to(shared / "mine")
    for name, why in (("open", r"may be written by every user \(mode 777\)"), ("link", "is a link")):
        with pytest.raises(ScratchNotPrivateError, match=why):
            make_private_directory(fs, str(shared / name))
    if os.geteuid() == 0:  # (only root can give a folder away)
        (shared / "theirs").mkdir(mode=0o700)
        os.chown(shared / "theirs", 65534, 65534)
        with pytest.raises(ScratchNotPrivateError, match="belongs to another user"):
            make_private_directory(fs, str(shared / "theirs"))


def test_a_run_refuses_a_scratch_folder_made_for_its_dest_by_someone_else(tmp_path, sync_scheduler):
    """From the security trial: the scratch folder's name follows from dest, so another user could make it
    first, and put rows of theirs in it with a run file and fingerprints to match: the run said "verified"."""
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq

    import daskpile
    from daskpile._storage import ScratchNotPrivateError, full_url
    from daskpile.engine import _run as run_state

    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "in.parquet")
    shared, dest = tmp_path / "shared", tmp_path / "out"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o1777)  # as /tmp
    fs, dest_path = filesystem(str(dest))
    planted = shared / f"daskpile-{run_state.scratch_name(full_url(fs, dest_path))}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    (planted / run_state.RUN_FILE).write_text("{}")
    with pytest.raises(ScratchNotPrivateError, match=rf"scratch '{planted}' may be written by every user"):
        daskpile.shuffle_parquet(str(tmp_path / "in.parquet"), str(dest), piles=2, seed=1, scratch=str(shared))
    assert not dest.exists() and (planted / run_state.RUN_FILE).read_text() == "{}"  # nothing written, nothing read
    done = subprocess.run(
        [sys.executable, "-m", "daskpile", "shuffle", str(tmp_path / "in.parquet"), str(dest), "--piles", "2",
         "--scratch", str(shared), "--scheduler", "sync", "-q"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "may be written by every user" in done.stderr, done.stderr
    os.chmod(planted, 0o700)  # its owner's, and private: used (its run file is no run, and is replaced)
    report = daskpile.shuffle_parquet(str(tmp_path / "in.parquet"), str(dest), piles=2, seed=1, scratch=str(shared))
    assert report.rows == 100
