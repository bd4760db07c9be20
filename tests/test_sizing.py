"""piles="auto": the estimate from Parquet footers, and a plan whose largest pile fits."""

import math

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import daskpile
from daskpile._storage import filesystem
from daskpile.datasets import write_reference_dataset
from daskpile.engine import _sizing


def test_the_largest_pile_fits_and_one_pile_fewer_would_not():
    for rows, data_bytes, memory in [(10**8, 4 * 10**9, 2**28), (10**6, 10**9, 2**24), (5_000, 10**6, 10**5)]:
        plan = _sizing.plan(rows, data_bytes, memory)
        bytes_per_row = data_bytes / rows
        mean = rows / plan.piles
        assert (mean + 6 * math.sqrt(mean)) * bytes_per_row <= memory
        fewer = rows / (plan.piles - 1)
        assert (fewer + 6 * math.sqrt(fewer)) * bytes_per_row > memory
        # and over random assignments the largest pile stays under the budget
        largest = max(
            np.random.default_rng(s).multinomial(rows, [1 / plan.piles] * plan.piles).max() for s in range(20)
        )
        assert largest * bytes_per_row <= memory


def test_plan_limits():
    assert _sizing.plan(10**6, 10**7, 10**9, min_piles=8).piles == 8  # enough rows: 4 piles per thread
    assert _sizing.plan(100, 1000, 10**9, min_piles=8).piles == 1  # never more piles than the rows need
    assert _sizing.plan(25_000, 10**5, 10**9, min_piles=8).piles == 2  # piles of at least 10,000 rows
    assert _sizing.plan(10_001, 10**5, 10**9, min_piles=8).piles == 1
    # (rows of 1 MB against a budget of 100 kB: what to pass, both ways)
    said = (
        r"rows take about 1\.0 MiB each .* which is 97\.7 KiB: pass a memory_per_pile \(--memory-per-pile\) of 7\.0 MiB"
    )
    with pytest.raises(ValueError, match=said + r" or more .*, or a pile count \(shuffle_parquet and the command"):
        _sizing.plan(10, 2**20 * 10, 10**5)
    with pytest.raises(
        ValueError, match=r"which is 10\.0 B: pass a memory_per_pile \(--memory-per-pile\) of 70\.0 B or more"
    ):
        _sizing.plan(10, 100, 10)  # (it said "0 MiB")
    with pytest.raises(ValueError, match="more than the 65,535 daskpile supports"):
        _sizing.plan(10**10, 10**13, 10**6)


def test_auto_keeps_piles_small_enough_to_permute_fast():
    """The fewest piles that fit the memory are not the fastest: B in 8 piles of 640 MiB took half as long
    again in pass 2 as in 64 to 256 (_sizing.FAST_PILE_BYTES)."""
    fewest = _sizing.plan(10**8, 5 * 2**30, memory_per_pile=2**32).piles
    chosen = _sizing.plan_for_cluster(10**8, 5 * 2**30, memory_per_pile=2**32)
    assert fewest < 8 and chosen.piles == 160
    assert chosen.bytes / chosen.piles <= _sizing.FAST_PILE_BYTES
    assert "32 MiB a pile on average, each planned to fit a budget of 4,096 MiB" in str(chosen)
    assert "4 piles: about 46,200 rows, 2.0 MiB in memory, 512 KiB a pile on average" in str(
        _sizing.PilePlan(4, 46_200, 2**21, 2**30)
    )  # (a new user's plan said "0 MiB a pile on average")
    # a budget smaller than that still decides, and data too small for it keeps piles of 10,000 rows or 32 MiB,
    # whichever is more piles: rows of 53 KB (images) made 2 piles of 512 MiB, which a loader holds a few of
    assert (
        _sizing.plan_for_cluster(10**8, 5 * 2**30, memory_per_pile=2**24).piles
        == (_sizing.plan(10**8, 5 * 2**30, 2**24).piles)
        > 320
    )
    assert _sizing.plan_for_cluster(20_000, 2**26, memory_per_pile=2**32).piles == 2
    assert _sizing.plan_for_cluster(20_000, 2**30, memory_per_pile=2**32).piles == 32
    # and the most piles daskpile supports are enough for any data that fits the memory
    assert _sizing.plan_for_cluster(10**12, 3 * 2**40, memory_per_pile=2**36).piles == _sizing.MAX_PILES


@pytest.mark.parametrize("threads", [1, 8, 64])
def test_auto_with_a_memory_per_pile_is_the_same_on_any_cluster(monkeypatch, threads):
    """The docs promise piles="auto" with memory_per_pile as deterministic as a pile count; the count was at
    least 4 a thread of the workers there when planning (2 workers: 8 piles, 3: 12)."""
    monkeypatch.setattr(_sizing, "total_threads", lambda: threads)
    assert _sizing.plan_for_cluster(400_000, 2**27, memory_per_pile=2**28).piles == 4  # 128 MiB: 32 MiB a pile
    assert _sizing.plan_for_cluster(20_000, 2**20, memory_per_pile=2**28).piles == 1
    assert _sizing.plan_for_cluster(400_000, 2**27).piles >= min(4 * threads, 40)  # without: the cluster counts


def test_estimate_from_footers(tmp_path):
    write_reference_dataset(tmp_path, rows=40_000, files=20)
    fs, _ = filesystem(str(tmp_path))
    files = sorted(str(p) for p in tmp_path.glob("*.parquet"))
    sizes = [fs.size(f) for f in files]
    rows, data_bytes, _ = _sizing.estimate_parquet(fs, files, sizes)  # 8 of the 20 footers
    assert rows == pytest.approx(40_000, rel=0.02)
    exact = sum(
        pq.read_metadata(f).row_group(g).total_byte_size
        for f in files
        for g in range(pq.read_metadata(f).num_row_groups)
    )
    assert data_bytes == pytest.approx(exact, rel=0.05)


@pytest.mark.parametrize("sidecar", [False, True])
def test_dictionary_encoded_columns_are_estimated_at_their_size_in_memory(tmp_path, sidecar):
    """A footer counts a dictionary-encoded column at its encoded size: a lake of country and event names
    was estimated at a third of its size in memory, so piles="auto" made piles three times too large and
    the space check let runs start that filled the scratch disk."""
    countries = np.array(["United States", "Germany", "France", "Japan", "Brazil", "India", "Canada"])
    events = np.array([f"page_view_section_{i:03d}" for i in range(100)])
    files, metadata = [], []
    for k in range(4):
        rng = np.random.default_rng(k)
        n = 100_000
        table = pa.table(
            {
                "id": np.arange(k * n, (k + 1) * n),
                "country": countries[rng.integers(0, len(countries), n)],
                "event": events[rng.integers(0, len(events), n)],
                "tags": pa.array([[str(v)] for v in rng.integers(0, 5, n)]),
                "label": rng.integers(0, 3, n),  # 8 bytes a row in memory, a fraction of a bit in the footer
            }
        )
        path = tmp_path / f"part-{k}.parquet"
        pq.write_table(table, path, metadata_collector=metadata)
        metadata[-1].set_file_path(path.name)
        files.append(str(path))
    fs, _ = filesystem(str(tmp_path))
    sizes = [fs.size(f) for f in files]
    in_memory = sum(pq.read_table(f).nbytes for f in files)
    sidecar_metadata = None
    if sidecar:
        sidecar_metadata = metadata[0]
        for m in metadata[1:]:
            sidecar_metadata.append_row_groups(m)
    footers = sum(m.row_group(g).total_byte_size for m in metadata for g in range(m.num_row_groups))
    assert footers < in_memory / 2  # what the estimate was before
    rows, data_bytes, _ = _sizing.estimate_parquet(fs, files, sizes, sidecar_metadata)
    assert rows == 400_000
    assert data_bytes == pytest.approx(in_memory, rel=0.1)


def test_dictionary_encoded_strings_are_measured_over_the_file_not_its_first_rows(tmp_path):
    """A log whose first 65,536 lines were heartbeats ("a") and the rest stack traces was taken for 4 MiB in
    memory, not 1,195: its row group was never cut, and it killed every worker whatever the blocksize."""
    traces = [chr(65 + k) * 5000 for k in range(10)]
    lines = ["a"] * 65_536 + [traces[i % 10] for i in range(20_000)]
    table = pa.table({"id": np.arange(len(lines)), "line": pa.array(lines)})
    pq.write_table(table, tmp_path / "log.parquet", row_group_size=len(lines))
    assert pq.read_metadata(tmp_path / "log.parquet").row_group(0).column(1).has_dictionary_page
    fs, _ = filesystem(str(tmp_path))
    rows, data_bytes, row_bytes = _sizing.estimate_parquet(fs, [str(tmp_path / "log.parquet")], [1])
    assert rows == len(lines) and data_bytes == pytest.approx(table.nbytes, rel=0.05)
    assert row_bytes == pytest.approx(table.nbytes / len(lines), rel=0.05)


class _Pair(pa.ExtensionType):
    """An extension type stored as a struct: its leaves are the struct's."""

    def __init__(self):
        super().__init__(pa.struct([("a", pa.int64()), ("b", pa.int64())]), "daskpile.test.pair")

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()


def test_the_estimate_of_unusual_files_is_the_footers_at_least_and_never_fails(tmp_path):
    """An extension type stored as a struct shifted every column after it (64 times too small an estimate);
    duplicate column names failed the shuffle with a KeyError."""
    fs, _ = filesystem(str(tmp_path))
    pa.register_extension_type(_Pair())
    try:
        n = 50_000
        pairs = pa.ExtensionArray.from_storage(_Pair(), pa.array([{"a": i, "b": i} for i in range(n)]))
        table = pa.table({"pair": pairs, "text": pa.array(["some words, repeated"] * n)})
        pq.write_table(table, tmp_path / "ext.parquet")
        _, estimate, _ = _sizing.estimate_parquet(
            fs, [str(tmp_path / "ext.parquet")], [fs.size(str(tmp_path / "ext.parquet"))]
        )
        assert estimate == pytest.approx(pq.read_table(tmp_path / "ext.parquet").nbytes, rel=0.2)
    finally:
        pa.unregister_extension_type("daskpile.test.pair")
    twice = pa.Table.from_arrays([pa.array(["a"] * 1000), pa.array(["b"] * 1000)], names=["x", "x"])
    pq.write_table(twice, tmp_path / "twice.parquet")
    rows, estimate, _ = _sizing.estimate_parquet(
        fs, [str(tmp_path / "twice.parquet")], [fs.size(str(tmp_path / "twice.parquet"))]
    )
    assert rows == 1000 and estimate > 0


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["gzip", "bz2", "zstd", "xz"])
def test_the_size_of_compressed_text_is_estimated_from_its_own_ratio(sync_scheduler, tmp_path, codec):
    """Taken as 5 times its size on disk, a corpus that compresses 100 times was estimated at a twentieth of
    its rows, and its piles came out over their budget.  The ratio is measured on the file's first MiB."""
    import bz2
    import gzip
    import lzma

    import pyarrow as pa

    rows = 100_000
    repetitive = b"".join(b'{"id": %d, "text": "%s"}\n' % (i % 7, b"a" * 200) for i in range(rows))
    # (one generator: one a row took 3 s of the test's 6 to 11)
    xs = np.random.default_rng(0).random(rows).tolist()
    varied = b"".join(b'{"id": %d, "x": %r}\n' % (i, x) for i, x in enumerate(xs))
    compress = {  # (the fastest levels: xz's default took 5 s of its test's 8)
        "gzip": lambda b: gzip.compress(b, compresslevel=1),
        "bz2": lambda b: bz2.compress(b, compresslevel=1),
        "zstd": lambda b: pa.compress(b, "zstd", asbytes=True),
        "xz": lambda b: lzma.compress(b, preset=0),
    }
    suffix = {"gzip": "gz", "bz2": "bz2", "zstd": "zst", "xz": "xz"}[codec]
    for name, data in [("repetitive", repetitive), ("varied", varied)]:
        source = tmp_path / f"{name}.jsonl.{suffix}"
        source.write_bytes(compress[codec](data))
        report = daskpile.shuffle_parquet(str(source), str(tmp_path / f"out-{name}"), "auto", seed=1)
        assert report.rows == rows and rows / 2 < report.pile_plan.rows < rows * 2, (name, report.pile_plan)


def test_shuffle_parquet_with_auto_piles(sync_scheduler, tmp_path):
    source, dest = tmp_path / "in", tmp_path / "out"
    write_reference_dataset(source, rows=50_000, files=4)
    report = daskpile.shuffle_parquet(str(source), str(dest), "auto", seed=1, memory_per_pile=256 * 1024)
    plan = report.pile_plan
    assert report.piles == plan.piles == len(report.files) and plan.rows == 50_000
    assert daskpile.read_manifest(str(dest))["pile_plan"] == plan.to_json()
    largest = max(daskpile.read_manifest(str(dest))["rows_per_pile"])
    assert largest * plan.bytes / plan.rows <= plan.memory_per_pile
    assert daskpile.verify(str(source), str(dest)).ok
    # without a budget, a quarter of the memory per thread: few piles, but at least 4 per thread
    report = daskpile.shuffle_parquet(str(source), str(tmp_path / "default"), "auto", seed=1)
    assert report.piles >= 4


def test_piles_must_be_a_number_or_auto(tmp_path):
    with pytest.raises(ValueError, match="piles must be a positive integer or 'auto', got 'many'"):
        daskpile.shuffle_parquet(str(tmp_path), str(tmp_path / "out"), "many")


def test_shuffle_dataframe_with_auto_piles(sync_scheduler):
    frame = pd.DataFrame({"x": np.arange(100_000), "s": [f"value {i}" for i in range(100_000)]})
    ddf = dd.from_pandas(frame, npartitions=10)
    budget = 1_000_000
    shuffled = daskpile.shuffle(ddf, "auto", seed=1, memory_per_pile=budget)
    plan = daskpile.plan_piles(ddf, memory_per_pile=budget)
    assert plan.rows == 100_000 and plan.memory_per_pile == budget
    assert shuffled.npartitions == plan.piles >= 3  # (the budget decides: 2.7 MB in piles of 1 MB at most)
    bytes_per_row = plan.bytes / plan.rows
    sizes = shuffled.map_partitions(len).compute()
    assert sizes.max() * bytes_per_row <= budget
    pd.testing.assert_frame_equal(shuffled.compute().sort_index(), ddf.compute())


def test_memory_per_pile_takes_a_size_as_dask_writes_them_and_refuses_zero(tmp_path):
    ddf = dd.from_pandas(pd.DataFrame({"x": np.arange(100_000)}), npartitions=4)
    assert daskpile.shuffle(ddf, "auto", seed=1, memory_per_pile="100kB").npartitions == (
        daskpile.shuffle(ddf, "auto", seed=1, memory_per_pile=100_000).npartitions
    )
    assert daskpile.shuffle(ddf, "auto", seed=1, memory_per_pile=1e5).npartitions == (
        daskpile.shuffle(ddf, "auto", seed=1, memory_per_pile=100_000).npartitions
    )
    for wrong in (0, "0B", "a lot", -5, 2.5):
        with pytest.raises(ValueError, match=f"memory_per_pile must be .*got {wrong!r}"):
            daskpile.shuffle(ddf, "auto", seed=1, memory_per_pile=wrong)
        with pytest.raises(ValueError, match=f"memory_per_pile must be .*got {wrong!r}"):
            daskpile.shuffle_parquet(str(tmp_path), str(tmp_path / "out"), "auto", memory_per_pile=wrong)
        with pytest.raises(ValueError, match=f"memory_per_pile must be .*got {wrong!r}"):
            daskpile.plan_piles(ddf, memory_per_pile=wrong)  # a bare TypeError for a string, 0 the default
    assert daskpile.plan_piles(ddf, memory_per_pile="100kB") == daskpile.plan_piles(ddf, memory_per_pile=100_000)


def test_auto_piles_refuse_to_guess_from_partitions_that_hold_no_rows(sync_scheduler):
    """A filter keeping a range of sorted data: the first, middle and last partitions measured were empty, and
    one pile was planned for 4 MB against a budget of 1 MiB."""
    ddf = dd.from_pandas(pd.DataFrame({"id": np.arange(90_000), "x": np.arange(90_000) / 3}), npartitions=9)
    kept = ddf[(ddf.id > 15_000) & (ddf.id < 40_000)]
    with pytest.raises(ValueError, match=r"the 3 partitions measured \(0, 4, 8 of 9\) hold no rows.*give piles=N"):
        daskpile.shuffle(kept, "auto", memory_per_pile=2**20)
    assert daskpile.plan_piles(dd.from_pandas(pd.DataFrame({"id": []}), npartitions=1)).rows == 0  # all measured
