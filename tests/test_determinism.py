"""The output is a pure function of (input partitions, piles, seed)."""

import os
from pathlib import Path

import dask
import dask.dataframe as dd
import pandas as pd
import pytest
from _util import file_bytes, read_output, write_parts
from distributed import Client, LocalCluster

import daskpile
from daskpile.datasets import reference_table
from daskpile.engine import _passes, _scratch
from daskpile.sources import plan_sources


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("determinism") / "src"
    write_parts(reference_table(0, 20_000, 20_000), path, parts=5)
    return str(path)


def run(source, dest, seed=11):
    daskpile.shuffle_parquet(source, str(dest), piles=7, seed=seed)
    return file_bytes(dest)


@pytest.mark.slow
def test_byte_identical_whatever_the_scheduler_or_worker_count(cluster, source, tmp_path):
    with Client(cluster):
        reference = run(source, tmp_path / "distributed-2-workers")
    for scheduler in ["sync", "threads", "processes"]:
        with dask.config.set(scheduler=scheduler):
            assert run(source, tmp_path / scheduler) == reference, scheduler
    for workers, processes in [(1, True), (4, True), (3, False)]:
        with (
            LocalCluster(n_workers=workers, threads_per_worker=2, processes=processes, dashboard_address=":0") as c,
            Client(c),
        ):
            assert run(source, tmp_path / f"{workers}-{processes}") == reference, (workers, processes)


def test_byte_identical_whatever_the_scheduler_with_fixed_size_lists(cluster, tmp_path):
    """Embeddings: pyarrow pickles a fixed_size_list type without its field's name and nullability, so the
    plan's schema, sent to the workers, named the vectors' values ``item`` where the files and a run on threads
    said ``element``: the bytes of a result hung on the scheduler."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    vector = pa.list_(pa.field("element", pa.float32(), nullable=False), 4)
    values = pa.array(np.arange(4_000, dtype=np.float32))
    table = pa.table({"id": range(1_000), "v": pa.FixedSizeListArray.from_arrays(values, type=vector)})
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "part-0.parquet")
    with Client(cluster):
        reference = run(str(tmp_path / "src"), tmp_path / "cluster")
    with dask.config.set(scheduler="threads"):
        assert run(str(tmp_path / "src"), tmp_path / "threads") == reference
    # (its values nullable, as every nested field of the result: files of one lake differ in that)
    assert pq.read_schema(tmp_path / "threads" / "part-00000.parquet").field("v").type == pa.list_(
        pa.field("element", pa.float32()), 4
    )


def test_another_seed_gives_another_permutation(sync_scheduler, source, tmp_path):
    run(source, tmp_path / "a", seed=1)
    run(source, tmp_path / "b", seed=2)
    a, b = read_output(tmp_path / "a"), read_output(tmp_path / "b")
    assert a.sort_by("id").equals(b.sort_by("id"))
    assert a["id"].to_pylist() != b["id"].to_pylist()


def test_a_task_run_twice_changes_nothing(source, tmp_path):
    """Dask may run a task twice (lost worker, stolen task): both runs must write the same bytes."""
    plan = plan_sources(source)
    fs, schema, files = plan.fs, plan.schema, plan.files
    run_dir = _scratch.Scratch.create(str(tmp_path / "scratch"), None, len(files))
    counts = sum(
        _passes.scatter_partition(fs, [f], k, 7, 3, run_dir, plan.reading, True).counts for k, f in enumerate(files)
    )
    first = Path(run_dir.path(2)).read_bytes()
    os.remove(run_dir.path(2))  # else the finished file would be reused, not rewritten
    _passes.scatter_partition(fs, [files[2]], 2, 7, 3, run_dir, plan.reading, True)
    assert Path(run_dir.path(2)).read_bytes() == first

    out = str(tmp_path / "pile.parquet")
    _passes.gather_to_parquet(run_dir, 7, [4], [counts[4]], 3, fs, [out], schema, True)
    pile = Path(out).read_bytes()
    os.remove(out)
    _passes.gather_to_parquet(run_dir, 7, [4], [counts[4]], 3, fs, [out], schema, True)
    assert Path(out).read_bytes() == pile
    assert sorted(os.listdir(tmp_path)) == ["pile.parquet", "scratch"]  # no temporaries left


def test_dataframe_api_same_partitions_on_every_scheduler(client, source):
    ddf = dd.read_parquet(source)
    distributed = [p.compute() for p in daskpile.shuffle(ddf, piles=4, seed=5).partitions]
    for scheduler in ["sync", "threads"]:
        with dask.config.set(scheduler=scheduler):
            local = daskpile.shuffle(ddf, piles=4, seed=5).compute()
        pd.testing.assert_frame_equal(local, pd.concat(distributed))
