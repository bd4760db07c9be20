"""PileLoader on real pile datasets: every row once per epoch per rank, epochs, resume, prefetch, errors."""

import collections
import contextlib
import decimal
import gc
import glob
import json
import operator
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import dask
import dask.dataframe as dd
import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

import daskpile
from daskpile.loader.pile_loader import CoBatch, _numpy
from tests._cluster import moto_s3
from tests._util import daskpile_in_process, run_in_fresh_process, sorted_source, write_parts

ROWS = 24_000


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A sorted source and its pile datasets: eager, lazy, and shuffle(ddf).to_parquet (no manifest)."""
    import dask.dataframe as dd

    root = tmp_path_factory.mktemp("loader")
    source = sorted_source(root / "source", ROWS, files=6)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(source, str(root / "eager"), piles=8, seed=11)
        daskpile.shuffle_parquet(source, str(root / "lazy"), piles=8, seed=11, second_pass="lazy")
        daskpile.shuffle(dd.read_parquet(source), piles=5, seed=11).to_parquet(str(root / "ddf"))
    return {"source": source, **{k: str(root / k) for k in ("eager", "lazy", "ddf")}}


def ids(batches) -> list[np.ndarray]:
    return [b["id"].to_numpy() for b in batches]


def epoch(path, world=1, **options) -> list[list[np.ndarray]]:
    """The id batches of each rank in one epoch."""
    options.setdefault("batch_size", 500)
    options.setdefault("seed", 5)
    return [ids(daskpile.PileLoader(path, rank=r, world_size=world, **options)) for r in range(world)]


@pytest.mark.parametrize("kind", ["eager", "lazy", "ddf"])
@pytest.mark.parametrize("world", [1, 2, 3, 7, 12])
def test_every_row_once_per_epoch_across_ranks(datasets, kind, world):
    """12 ranks read 8 (or 5) piles: ranks then take row ranges inside piles."""
    per_rank = epoch(datasets[kind], world, columns=["id"])
    assert len({len(batches) for batches in per_rank}) == 1  # equal batch counts
    assert len({tuple(len(b) for b in batches) for batches in per_rank}) == 1  # and equal batch sizes
    seen = collections.Counter(np.concatenate([np.concatenate(b) for b in per_rank]).tolist())
    assert set(seen) == set(range(ROWS))
    repeats = sum(seen.values()) - ROWS  # the short ranks wrap around to rows of their own
    assert repeats < world * 500 and (repeats == 0) == (ROWS % world == 0 or world == 1)


def test_a_folder_daskpile_did_not_write_is_read_with_a_warning_that_batches_mix_one_files_rows(datasets):
    """A sorted folder read as piles gives batches of neighbouring rows: the user is told, not left to find out."""
    said = r"source has no _daskpile.json and no daskpile stamp .* each of its 6 files is read as a pile"
    with pytest.warns(UserWarning, match=said):
        batches = epoch(datasets["source"])[0]
    assert sorted(np.concatenate(batches).tolist()) == list(range(ROWS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in ("eager", "lazy", "ddf"):
            epoch(datasets[kind])
        piles = sorted(glob.glob(os.path.join(datasets["lazy"], "*.parquet")))
        epoch(piles)  # a result's files named one by one carry its pile stamps


def test_a_folder_holding_part_of_a_shuffle_beside_another_is_refused_and_whole_shuffles_are_read(tmp_path):
    """Dask's to_parquet of 4 piles into a folder of 8 left 4 of the first write: a trial's loader read rows twice.
    Whole shuffles side by side (Dask's append, partition_on days, a glob over two results) are read, as they
    were before (a review)."""
    frame = dd.from_pandas(pd.DataFrame({"id": range(3000), "day": ["mon", "tue", "wed"] * 1000}), npartitions=3)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(frame, piles=8, seed=2).to_parquet(str(tmp_path / "s"))
        daskpile.shuffle(frame, piles=4, seed=1).to_parquet(str(tmp_path / "s"))
    said = r"s/part.4.parquet is one of 4 piles of a shuffle into 8 \(seed 2\), beside the files of another shuffle"
    with pytest.raises(ValueError, match=said):
        daskpile.PileLoader(str(tmp_path / "s"), batch_size=100, seed=0)
    for name in sorted(os.listdir(tmp_path / "s"))[4:]:  # (part.4 to part.7: the first write's)
        os.remove(tmp_path / "s" / name)
    assert sorted(np.concatenate(epoch(str(tmp_path / "s"), batch_size=100)[0]).tolist()) == list(range(3000))
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(frame, piles=4, seed=3).to_parquet(str(tmp_path / "s"), append=True)
        for seed in (4, 5):
            daskpile.shuffle(frame, piles=2, seed=seed).to_parquet(str(tmp_path / "days"), partition_on=["day"],
                                                                   append=seed == 5)  # fmt: skip
            daskpile.shuffle(frame, piles=2, seed=seed).to_parquet(str(tmp_path / f"r{seed}"))
    for whole_shuffles in ("s", "days", "r*/*.parquet"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (nor said not to be daskpile's)
            assert len(np.concatenate(epoch(str(tmp_path / whole_shuffles), batch_size=100)[0])) == 6000


def test_drop_last_drops_only_the_remainder(datasets):
    per_rank = epoch(datasets["eager"], 7, batch_size=1000, drop_last=True)
    flat = np.concatenate([np.concatenate(b) for b in per_rank])
    assert all(len(b) == 1000 for batches in per_rank for b in batches)
    assert len(flat) == len(set(flat.tolist())) == 7 * (ROWS // 7 // 1000) * 1000


def test_epochs_differ_and_a_seed_and_epoch_reproduce(datasets):
    loader = daskpile.PileLoader(datasets["lazy"], batch_size=500, seed=5)
    first, second = np.concatenate(ids(loader)), np.concatenate(ids(loader))
    assert loader.epoch == 2 and not np.array_equal(first, second)
    again = daskpile.PileLoader(datasets["lazy"], batch_size=500, seed=5, epoch=1)
    assert np.array_equal(np.concatenate(ids(again)), second)
    other = daskpile.PileLoader(datasets["lazy"], batch_size=500, seed=6, epoch=1)
    assert not np.array_equal(np.concatenate(ids(other)), second)


@pytest.mark.parametrize("stop_after", ["first", "middle", "last"])
@pytest.mark.parametrize("world", [1, 3])
def test_resume_yields_exactly_the_batches_not_seen(datasets, stop_after, world):
    for rank in range(world):
        options = dict(batch_size=700, seed=5, epoch=3, rank=rank, world_size=world, mix=2)
        whole = ids(daskpile.PileLoader(datasets["lazy"], **options))
        stop = {"first": 1, "middle": len(whole) // 2, "last": len(whole)}[stop_after]
        loader = daskpile.PileLoader(datasets["lazy"], **options)
        iterator = iter(loader)
        seen = [next(iterator)["id"].to_numpy() for _ in range(stop)]
        state = loader.state_dict()
        del iterator
        with pytest.raises(ValueError, match="the state's seed 5 is not this loader's seed 99"):
            daskpile.PileLoader(datasets["lazy"], **{**options, "seed": 99}).load_state_dict(state)
        resumed = daskpile.PileLoader(datasets["lazy"], **{**options, "epoch": 0})
        resumed.load_state_dict(state)
        if stop == len(whole):  # taken after the last batch: nothing is left of epoch 3, then epoch 4 whole
            assert resumed.epoch == 3 and len(resumed) == 0 and ids(resumed) == []
            assert resumed.epoch == 4 and len(resumed) == len(whole)
            continue
        assert len(resumed) == len(whole) - stop
        rest = ids(resumed)
        assert [b.tolist() for b in seen + rest] == [b.tolist() for b in whole]
        assert resumed.epoch == 4


@pytest.mark.parametrize("checkpoint_step", ["last of epoch 0", "after epoch 0's loop", "first of epoch 1"])
@pytest.mark.parametrize("calls_set_epoch", [True, False], ids=["set_epoch", "no set_epoch"])
def test_a_training_loop_resumed_from_its_checkpoint_sees_every_batch_once(datasets, checkpoint_step, calls_set_epoch):
    """The guide's loop, checkpointing (epoch, state_dict()) after a step or after an epoch's loop, crashed and
    resumed from it."""
    epochs = 3

    def train(loader, start_epoch, crash_at=None, after_loop=False):
        steps = []
        for epoch in range(start_epoch, epochs):
            if calls_set_epoch:
                loader.set_epoch(epoch)
            for batch in loader:
                steps.append(batch["id"].to_pylist())
                if len(steps) == crash_at and not after_loop:
                    return steps, (epoch, loader.state_dict())
            if len(steps) == crash_at:  # the epoch's loop is over: the checkpoint at the end of an epoch
                return steps, (epoch, loader.state_dict())
        return steps, None

    options = dict(batch_size=1000, seed=3)
    whole, _ = train(daskpile.PileLoader(datasets["eager"], **options), 0)
    per_epoch = len(whole) // epochs
    crash_at = per_epoch + 1 if checkpoint_step == "first of epoch 1" else per_epoch
    after_loop = checkpoint_step == "after epoch 0's loop"
    before, (epoch, state) = train(daskpile.PileLoader(datasets["eager"], **options), 0, crash_at, after_loop)
    resumed = daskpile.PileLoader(datasets["eager"], **options)
    resumed.load_state_dict(state)
    after, _ = train(resumed, epoch)
    assert before + after == whole


@pytest.mark.parametrize("old_world,new_world", [(2, 3), (6, 2), (3, 1)])
def test_resume_after_a_world_size_change(datasets, old_world, new_world):
    """Under canonical_ranks=6 a job stopped mid-epoch on one world size finishes it on another, exactly."""
    options = dict(batch_size=400, seed=8, canonical_ranks=6)
    loaders = [
        daskpile.PileLoader(datasets["eager"], rank=r, world_size=old_world, **options) for r in range(old_world)
    ]
    iterators = [iter(loader) for loader in loaders]
    steps = len(loaders[0]) // 2
    before = [next(it)["id"].to_numpy() for _ in range(steps) for it in iterators]
    state = loaders[0].state_dict()
    after = []
    for rank in range(new_world):
        loader = daskpile.PileLoader(datasets["eager"], rank=rank, world_size=new_world, **options)
        loader.load_state_dict(state)
        after += ids(loader)
    seen = collections.Counter(np.concatenate(before + after).tolist())
    assert set(seen) == set(range(ROWS))
    # a rank's streams are consumed evenly, to a row: a rank has at most 2 rows a stream more left than another
    assert sum(seen.values()) - ROWS <= 2 * 6


@pytest.mark.parametrize("old_world,old_batch,new_world,new_batch", [(2, 2048, 8, 512), (3, 1000, 12, 250)])
def test_a_job_resized_to_more_ranks_with_the_same_global_batch_repeats_almost_nothing(
    datasets, old_world, old_batch, new_world, new_batch
):
    """Ranks reading several streams take a row from each in turn: a resumed job on more ranks finds every stream
    as far along as its siblings, so no new rank wraps around to batches of rows already read (it did, a third of
    the epoch when a rank took whole batches from one stream at a time)."""
    options = dict(seed=0, canonical_ranks=new_world)
    old = [
        daskpile.PileLoader(datasets["eager"], batch_size=old_batch, rank=r, world_size=old_world, **options)
        for r in range(old_world)
    ]
    iterators = [iter(loader) for loader in old]
    before = [next(it)["id"].to_numpy() for _ in range(3) for it in iterators]
    state = old[0].state_dict()
    after = []
    for rank in range(new_world):
        loader = daskpile.PileLoader(
            datasets["eager"], batch_size=new_batch, rank=rank, world_size=new_world, **options
        )
        loader.load_state_dict(state)
        after += ids(loader)
    seen = collections.Counter(np.concatenate(before + after).tolist())
    assert set(seen) == set(range(ROWS))
    assert sum(seen.values()) - ROWS <= 2 * new_world


def test_states_of_earlier_formats_resume_where_they_mean_the_same(datasets):
    """Format 1 read a rank's streams a batch at a time, formats 1 and 2 cut an eager pile in file order."""

    def resumes(path, old_format, **layout):
        loader = daskpile.PileLoader(path, batch_size=700, seed=2, **layout)
        iterator = iter(loader)
        seen = [next(iterator)["id"].to_numpy() for _ in range(3)]
        resumed = daskpile.PileLoader(path, batch_size=700, seed=2, **layout)
        resumed.load_state_dict({**loader.state_dict(), "format": old_format})
        whole = ids(daskpile.PileLoader(path, batch_size=700, seed=2, **layout))
        assert [b.tolist() for b in seen + ids(resumed)] == [b.tolist() for b in whole]

    for old_format in ("daskpile.loader/1", "daskpile.loader/2"):
        resumes(datasets["lazy"], old_format, rank=1, world_size=2)  # a lazy pile's cut is a random part
        resumes(datasets["eager"], old_format)  # one stream: no pile is cut
        with pytest.raises(ValueError, match="cut a pile shared by two streams in file order"):
            resumes(datasets["eager"], old_format, rank=1, world_size=2)
    several = daskpile.PileLoader(datasets["lazy"], batch_size=700, seed=2, world_size=2, canonical_ranks=4)
    several.load_state_dict({**several.state_dict(), "format": "daskpile.loader/1"})  # an epoch's start: the same
    next(iter(several))
    with pytest.raises(ValueError, match="read a rank's streams a batch at a time"):  # mid-epoch: not
        several.load_state_dict({**several.state_dict(), "format": "daskpile.loader/1"})
    several.load_state_dict({**several.state_dict(), "format": "daskpile.loader/2"})
    ended = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=2, world_size=2)
    assert list(ended)  # to the epoch's end: the checkpoint a loop saves after it
    for old_format in ("daskpile.loader/1", "daskpile.loader/2"):
        resumed = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=2, world_size=2)
        resumed.load_state_dict({**ended.state_dict(), "format": old_format})
        resumed.set_epoch(0)
        assert list(resumed) == []


def test_a_pile_cut_between_ranks_is_cut_at_another_row_each_epoch(tmp_path):
    """An eager pile's rows are in a random order, but one fixed on disk: cut there, its first rows went to
    the lower rank every epoch.

    Over 400 epochs, how often rank 0 reads row 0 (in file order) of the pile the two ranks share: about
    half (this pile is cut near its middle), within 130-270 with probability 1 - 1e-12; the file-order cut
    gave 400."""
    from daskpile.loader.reading import group_row_ids

    source = sorted_source(tmp_path / "source", 1000, files=1)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(source, str(tmp_path / "piles"), piles=3, seed=1)
    loader = daskpile.PileLoader(str(tmp_path / "piles"), batch_size=50, seed=9, world_size=2)
    units, starts = loader.units, np.cumsum(loader.units.rows) - loader.units.rows
    on_rank_0 = 0
    for epoch in range(400):
        plan = loader._plan(epoch)
        (shared,) = {p.unit for g in plan.groups[0] for p in g.pieces} & {
            p.unit for g in plan.groups[1] for p in g.pieces
        }
        rank_0 = np.concatenate([group_row_ids(units, g, 9, epoch) for g in plan.groups[0]])
        on_rank_0 += int(starts[shared] in rank_0)
    assert 130 <= on_rank_0 <= 270, on_rank_0


def test_a_loader_pickles_after_an_epoch_and_its_copy_goes_on_from_there(datasets):
    """A loader (or a PileDataset holding one) is pickled to spawned DataLoader workers; once it has loaded, it
    holds thread pools, which stay behind."""
    import pickle

    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=4, mix=2)
    ids(loader)
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.epoch == loader.epoch == 1
    assert [b.tolist() for b in ids(copy)] == [b.tolist() for b in ids(loader)]


def test_a_load_queued_as_the_interpreter_exits_is_cancelled_quietly():
    """A loader left mid-epoch (a peek at one batch, then the script ends) still has loads whose inputs finish
    during exit, when the pool's executor takes no more work: they are cancelled, not a traceback each."""
    from daskpile.loader.reading import TaskPool

    pool = TaskPool(1, name="test")
    pool._executor.shutdown()  # as at interpreter exit
    assert pool.submit(0, lambda: 1).cancelled()


def test_arrow_batches_keep_the_columns_metadata_polars_reads_types_from(tmp_path):
    """A Polars Enum came out of the loader a Categorical: batches held the columns without their metadata,
    where Polars keeps the Enum's categories."""
    polars = pytest.importorskip("polars")  # in the bench extra, which the test venv installs

    frame = polars.DataFrame({"id": range(100), "e": polars.Series(["lo", "hi"] * 50, dtype=polars.Enum(["lo", "hi"]))})
    (tmp_path / "src").mkdir()
    frame.write_parquet(tmp_path / "src" / "a.parquet")
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, seed=1)
    for columns in [None, ["e"]]:
        batches = [polars.from_arrow(b) for b in daskpile.PileLoader(str(tmp_path / "out"), batch_size=30, seed=0,
                                                                    columns=columns)]  # fmt: skip
        assert {b.schema["e"] for b in batches} == {polars.Enum(["lo", "hi"])}
        assert polars.concat(batches)["e"].value_counts().sort("e")["count"].to_list() == [50, 50]


def test_numpy_output_refuses_to_round_integers_past_2_53(tmp_path):
    """pyarrow gives an integer column with nulls as float64: exact up to 2**53, then rounded. Refused, named."""
    big = 2**53 + 1
    source = tmp_path / "src"
    source.mkdir()
    pq.write_table(pa.table({"uid": pa.array([big, None, 7, 8], pa.int64())}), source / "a.parquet")
    dest = str(tmp_path / "piles")
    daskpile.shuffle_parquet(str(source), dest, piles=1, seed=0)
    with pytest.raises(  # (advice PileDataset can follow: it has no output=)
        ValueError, match=r"column 'uid' holds nulls and integers past 2\*\*53 \(9,007,199,254,740,993\), .*: leave "
    ):
        list(daskpile.PileLoader(dest, batch_size=4, seed=0, output="numpy"))
    # when the loader is made, from the footers' statistics, not at the batch that holds one, hours into an epoch
    # (a trial's PileDataset: at step 1,394 of 2,500, on one rank, the others left waiting)
    with pytest.raises(ValueError, match=r"output='numpy'\): column 'uid' holds nulls and integers past 2\*\*53 .*"
                                         r"\(found in the statistics of .*part-00000\.parquet\)"):  # fmt: skip
        daskpile.PileLoader(dest, batch_size=4, seed=0, output="numpy")
    (batch,) = daskpile.PileLoader(dest, batch_size=4, seed=0, output="numpy", filters=[("uid", "<", 100)])
    assert sorted(batch["uid"].tolist()) == [7.0, 8.0]  # small integers (no nulls left here) as pyarrow gives them
    (batch,) = daskpile.PileLoader(dest, batch_size=4, seed=0)
    assert sorted(v for v in batch["uid"].to_pylist() if v is not None) == [7, 8, big]  # arrow keeps them exact


def test_numpy_output_of_vectors_is_an_array_of_rows_by_size(tmp_path):
    """Embeddings (fixed-size lists) came as an object array of arrays, which torch cannot make a tensor of."""
    source = tmp_path / "src"
    source.mkdir()
    ids = np.arange(200)
    floats = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 4).astype(np.float32)), 4)
    # (values null: pyarrow 21 writes no null vector to Parquet; ``_vectors``' doctest reads one as NaN)
    floats = pa.array([[None] * 4 if i == 7 else v for i, v in enumerate(floats.to_pylist())], floats.type)
    grid = pa.list_(pa.list_(pa.int16(), 2), 3)  # (images are lists of lists)
    grids = pa.array([[[int(i)] * 2] * 3 for i in ids], grid)
    pq.write_table(pa.table({"id": ids, "v": floats, "g": grids}), source / "a.parquet")
    daskpile.shuffle_parquet(str(source), str(tmp_path / "piles"), piles=3, seed=0)
    batches = list(daskpile.PileLoader(str(tmp_path / "piles"), batch_size=64, seed=0, output="numpy"))
    assert {(b["v"].dtype, b["v"].shape[1:], b["g"].dtype, b["g"].shape[1:]) for b in batches} == {
        (np.dtype(np.float32), (4,), np.dtype(np.int16), (3, 2))
    }
    v, g, i = (np.concatenate([b[c] for b in batches]) for c in ("v", "g", "id"))
    assert np.isnan(v[i == 7]).all() and (v[i != 7] == i[i != 7, None]).all() and (g == i[:, None, None]).all()
    # integers with a null in one batch: refused, where that batch's array was of objects, the others' of ints
    grids = pa.array([[[None, int(i)]] * 3 if i == 150 else [[int(i)] * 2] * 3 for i in ids], grid)
    pq.write_table(pa.table({"id": ids, "g": grids}), source / "a.parquet")
    daskpile.shuffle_parquet(str(source), str(tmp_path / "nulls"), piles=3, seed=0)
    with pytest.raises(ValueError, match=r"column 'g' holds vectors of integers with a null, which output='numpy' "
                                         r".*\(found in the statistics of .*\.parquet\)"):  # fmt: skip
        daskpile.PileLoader(str(tmp_path / "nulls"), batch_size=64, seed=0, output="numpy")  # (when made)
    # a null vector, and files without statistics (a plain pyarrow write's, here of none): refused at its batch
    grids = pa.array([None if i == 150 else [[int(i)] * 2] * 3 for i in ids], grid)
    pq.write_table(pa.table({"id": ids, "g": grids}), tmp_path / "plain.parquet", write_statistics=False)
    loader = daskpile.PileLoader(str(tmp_path / "plain.parquet"), batch_size=64, seed=0, output="numpy")
    with pytest.raises(ValueError, match=r"column 'g' holds vectors of integers with a null, which output='numpy' "):
        list(loader)
    daskpile.shuffle_parquet(str(tmp_path / "plain.parquet"), str(tmp_path / "null-vector"), piles=3, seed=0)
    with pytest.raises(ValueError, match=r"column 'g' holds vectors of integers with a null.*found in the statis"):
        daskpile.PileLoader(str(tmp_path / "null-vector"), batch_size=64, seed=0, output="numpy")
    # (the review's) a column named as a vector's leaf would be ("g.note", json_normalize's) is not one of them
    notes = pa.array([None if i == 3 else "x" for i in ids])
    pq.write_table(pa.table({"id": ids, "g": grids.fill_null([[0, 0]] * 3), "g.note": notes}), tmp_path / "n.parquet")
    (batch,) = daskpile.PileLoader(str(tmp_path / "n.parquet"), batch_size=200, seed=0, output="numpy",
                                   columns=["id", "g"])  # fmt: skip
    assert batch["g"].shape == (200, 3, 2)


def test_a_filter_of_grids_of_vectors_keeps_each_row_s_grid(tmp_path):
    """A dataset's scan filters batches of 131,072 rows sliced from a row group, and pyarrow filters a sliced
    fixed-size list of fixed-size lists from the wrong rows: 268,252 of 398,999 rows had another's grid."""
    rows = 200_000
    values = pa.array(np.repeat(np.arange(rows), 4).astype(np.int32))
    grids = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(values, 2), 2)
    source = tmp_path / "src"
    source.mkdir()
    pq.write_table(pa.table({"id": np.arange(rows), "g": grids}), source / "a.parquet")
    daskpile.shuffle_parquet(str(source), str(tmp_path / "piles"), piles=1, seed=0)
    loader = daskpile.PileLoader(str(tmp_path / "piles"), batch_size=50_000, seed=0, filters=[("id", ">", 1_000)])
    batches = list(loader)
    firsts = np.concatenate([np.asarray(b["g"].combine_chunks().flatten().flatten())[::4] for b in batches])
    assert len(firsts) == rows - 1_001 and (firsts == np.concatenate([b["id"] for b in batches])).all()


def test_batches_keep_the_files_schema_metadata(tmp_path):
    """A Hugging Face dataset's features (its labels' names) are in the schema's metadata: batches had none."""
    source = tmp_path / "src"
    source.mkdir()
    features = b'{"info": {"features": {"label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}}'
    table = pa.table({"id": range(100), "label": [i % 2 for i in range(100)]})
    pq.write_table(table.replace_schema_metadata({b"huggingface": features}), source / "a.parquet")
    daskpile.shuffle_parquet(str(source), str(tmp_path / "piles"), piles=2, seed=0)
    batches = list(daskpile.PileLoader(str(tmp_path / "piles"), batch_size=30, seed=0))
    assert len(batches) == 4  # (a pile's stamp, of its file, is not a batch's)
    assert {tuple(sorted(b.schema.metadata)) for b in batches} == {(b"huggingface",)}
    assert batches[0].schema.metadata[b"huggingface"] == features


def test_numpy_output_of_an_integer_column_null_in_a_whole_batch(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "opt": pa.array([None] * 4, pa.int64())}), source / "a.parquet")
    daskpile.shuffle_parquet(str(source), str(tmp_path / "piles"), piles=1, seed=0)
    (batch,) = daskpile.PileLoader(str(tmp_path / "piles"), batch_size=4, seed=0, output="numpy")
    assert np.isnan(batch["opt"]).all()


@pytest.mark.parametrize("values", [["x", None, "y", None], [b"x", None, b"y", None]])
def test_numpy_output_of_a_categorical_keeps_its_nulls(tmp_path, values):
    """pyarrow's ``to_numpy`` of a chunked dictionary column gave each null a neighbour's category: labels
    silently wrong in training batches.  A null stays None, as in the other outputs.  (Parquet gives back
    string and binary dictionaries only; numbers are tested on ``_numpy`` below.)"""
    source = tmp_path / "src"
    source.mkdir()
    label = pa.array(values * 2).dictionary_encode()
    pq.write_table(pa.table({"id": range(8), "label": label}), source / "a.parquet")
    daskpile.shuffle_parquet(str(source), str(tmp_path / "piles"), piles=2, seed=0)
    loader = daskpile.PileLoader(str(tmp_path / "piles"), batch_size=8, seed=0, output="numpy")
    (batch,) = loader
    got = {int(i): v for i, v in zip(batch["id"], batch["label"].tolist(), strict=True)}
    assert [got[i] for i in range(1, 8, 2)] == [None] * 4, got
    assert [got[i] for i in range(0, 8, 2)] == [values[0], values[2]] * 2


def test_numpy_of_a_numeric_dictionary_gives_its_nulls_as_nan_and_refuses_to_round():
    small = pa.array([10, None, 20]).dictionary_encode()
    np.testing.assert_array_equal(_numpy("c", pa.chunked_array([small, small])), [10, np.nan, 20] * 2)
    big = pa.array([2**53 + 1, None]).dictionary_encode()  # the value only in the dictionary
    with pytest.raises(ValueError, match=r"column 'c' holds nulls and integers past 2\*\*53"):
        _numpy("c", pa.chunked_array([big]))


def test_a_path_like_names_the_dataset_as_its_string_does(datasets):
    """``shuffle_parquet`` took a ``pathlib.Path``; the loader, which reads what it wrote, said "'PosixPath'
    object is not iterable"."""
    as_string = ids(daskpile.PileLoader(datasets["eager"], batch_size=500, seed=5))
    as_path = ids(daskpile.PileLoader(Path(datasets["eager"]), batch_size=500, seed=5))
    assert len(as_path) == len(as_string) and all(map(np.array_equal, as_path, as_string))
    ddf_files = sorted(Path(datasets["ddf"]).glob("*.parquet"))
    assert sum(map(len, ids(daskpile.PileLoader(ddf_files, batch_size=500, seed=5)))) == ROWS


def test_an_epoch_of_no_batch_moves_the_state_on_too(datasets):
    with pytest.warns(UserWarning, match="match no row"):
        loader = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, filters=[("id", "<", 0)])
    for _ in range(3):
        assert list(loader) == []
    assert loader.epoch == 3 and loader.state_dict()["epoch"] == 2


def test_a_state_of_another_world_size_without_canonical_ranks_says_what_to_give(datasets):
    state = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, world_size=2).state_dict()
    with pytest.raises(ValueError, match=r"canonical_ranks 2 \(this loader 1\): a job resized .* keeps one canon"):
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1).load_state_dict(state)


def test_numpy_integers_given_are_plain_ints_in_the_state(datasets):
    """A loop over ``np.arange`` epochs saved numpy integers in the state: json and ``torch.load`` refused it."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=np.int64(500), seed=np.uint32(1), rank=np.int8(0))
    loader.set_epoch(np.int64(2))
    next(iter(loader))
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert all(
        type(v) is int
        for k, v in state.items()
        if k not in ("format", "drop_last", "starts", "version", "data", "content", "lazy", "filters", "selection")
    )


def test_a_drawn_seed_is_refused_with_more_than_one_rank(datasets):
    """Each rank would draw its own: they would share out different orders, rows lost and repeated."""
    with pytest.raises(ValueError, match=r"seed=None draws a seed in each process.*same seed on every rank"):
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=None, rank=1, world_size=2)
    assert daskpile.PileLoader(datasets["eager"], batch_size=100, seed=None).seed >= 0


def test_a_loader_left_at_one_rank_in_a_job_of_several_says_every_rank_reads_every_row(datasets, monkeypatch):
    """Under torchrun, rank= and world_size= forgotten: each of 2 ranks read all the rows, silently."""
    import warnings

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(UserWarning, match=r"PileLoader\(world_size=1\) in a job of 2 ranks: every rank reads every row"):
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, rank=1, world_size=2)
        monkeypatch.setenv("WORLD_SIZE", "1")
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1)


def test_a_loader_whose_rank_is_not_the_launcher_s_says_so(datasets, monkeypatch):
    """Under torchrun, world_size= given and rank= forgotten: every process was rank 0, and read rank 0's share
    (half the rows twice an epoch, the other half never), silently.  A DataLoader worker's share (a world of
    ranks times workers) is not the launcher's world, and says nothing."""
    import warnings

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.warns(UserWarning, match=r"PileLoader\(rank=0, world_size=2\) in the process its launcher made rank 1"):
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, rank=1, world_size=2)
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, rank=2, world_size=4)  # rank 1's worker 0
        monkeypatch.setenv("RANK", "ranked")  # (not a number: not a launcher's)
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, world_size=2)


def test_piles_smaller_than_a_batch_are_warned_of(datasets):
    """A batch then holds whole piles, whose rows meet in one batch every epoch: a new user's 2,000 piles of
    1,500 rows in batches of 4,096 had a co-batch rate 150 times the ideal, silently.  mix= that groups a batch's
    worth of piles says nothing."""
    import warnings

    with pytest.warns(UserWarning, match=r"batch_size=5,000\): its piles hold [23],\d\d\d rows .* pass mix=2 or more"):
        daskpile.PileLoader(datasets["eager"], batch_size=5000, seed=1)  # (8 piles of 24,000 rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        daskpile.PileLoader(datasets["eager"], batch_size=5000, seed=1, mix=2)
        daskpile.PileLoader(datasets["eager"], batch_size=2000, seed=1)


def test_filters_that_match_no_row_are_warned_of(datasets):
    """Every epoch then yields no batch: a training loop ran no step, silently."""
    with pytest.warns(UserWarning, match=r"filters=\[\('id', '<', -1\)\] match no row of .*every epoch yields no"):
        loader = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, filters=[("id", "<", -1)])
    assert list(loader) == []


@pytest.mark.parametrize("path", ["", " ", [""], ["a", ""]])
def test_an_empty_path_is_refused(path):
    """os.environ.get("TRAIN_DATA", ""): it read the working directory's Parquet files, recursively."""
    with pytest.raises(ValueError, match=r"^path is empty \('\s?'\): give a directory"):
        daskpile.PileLoader(path, batch_size=100, seed=1)
    with pytest.raises(ValueError, match=r"^source is empty"):
        daskpile.shuffle_parquet(path, "out", piles=2)


def test_state_of_another_dataset_or_layout_is_refused(datasets):
    state = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1, mix=2).state_dict()
    with pytest.raises(ValueError, match="mix 2 \\(this loader 1\\)"):
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="files 8 \\(this loader 5\\)"):
        daskpile.PileLoader(datasets["ddf"], batch_size=100, seed=1, mix=2).load_state_dict(state)


def test_a_state_of_other_filters_says_so_and_resumes_with_the_state_s(datasets):
    """A new user's trial: a state taken under other filters of the same files was said to be "another dataset",
    which sent them looking for another shuffle."""
    taken = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=[("id", "<", 5_000)])
    batches = iter(taken)
    seen = [next(batches) for _ in range(3)]
    state = taken.state_dict()
    rest = list(batches)
    for other in ([("id", ">=", 5_000)], None):
        said = (
            r"^the state belongs to a loader of other filters: \[\('id', '<', 5000\)\] \(this loader .*\(refused as: "
        )
        with pytest.raises(ValueError, match=said):
            daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=other).load_state_dict(state)
    resumed = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=[("id", "<", 5_000)])
    resumed.load_state_dict(state)
    assert [b.equals(r) for b, r in zip(resumed, rest, strict=True)] == [True] * len(rest) and len(seen) == 3
    # Filters written otherwise that select the same rows resume, as a set's text differs from one process to the
    # next (its order is the hash seed's): they are said only to explain a refusal
    same_rows = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=[("id", "<=", 4_999)])
    same_rows.load_state_dict(state)
    assert [b.equals(r) for b, r in zip(same_rows, rest, strict=True)] == [True] * len(rest)
    with pytest.raises(ValueError, match=r"mix 2 \(this loader 1\)"):  # (a layout said as it is)
        other = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, mix=2, filters=[("id", "<", 10)])
        daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4).load_state_dict(other.state_dict())


def test_a_state_of_filters_selecting_other_rows_as_many_in_each_file_is_refused(datasets):
    """Fold 0 and fold 1 of a dataset whose folds are dealt out evenly: a state of one resumed on the other,
    silently, as each file gave as many rows (and its batches were rows the state had never seen)."""
    files = [
        pq.read_table(path, columns=["id"])["id"].to_pylist() for path in Path(datasets["eager"]).glob("*.parquet")
    ]
    fold = {k: [("id", "in", {i for ids in files for i in ids[k : len(ids) // 2 * 2 : 2]})] for k in (0, 1)}
    taken = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=fold[0])
    batches = iter(taken)
    next(batches)
    state = taken.state_dict()
    rest = list(batches)
    with pytest.raises(ValueError) as refused:
        daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=fold[1]).load_state_dict(state)
    said = str(refused.value)  # (the filters said shortly: this set of ids, whole, took 130 kB)
    assert (
        re.fullmatch(
            r"the state belongs to a loader of other filters: \[\('id', 'in', \[.{150,}\.\.\. \([\d,]+ characters\) "
            r"\(this loader .*\): make the loader with the state's filters to resume \(refused as: the state belongs "
            r"to other rows of the same files: its filters select as many rows of each file, and other ones\)",
            said,
        )
        and len(said) < 700
    ), said
    # the same rows selected by other filters resume
    same_rows = [("id", "in", {i for ids in files for i in ids[: len(ids) // 2 * 2 : 2]} | {-1})]
    resumed = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=same_rows)
    resumed.load_state_dict(state)
    assert [b.equals(r) for b, r in zip(resumed, rest, strict=True)] == [True] * len(rest)
    # and a filter that selects every row is no filter
    everything = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4, filters=[("id", ">=", 0)])
    plain = daskpile.PileLoader(datasets["eager"], batch_size=300, seed=4)
    next(iter(everything))
    plain.load_state_dict(everything.state_dict())


def test_a_state_of_another_shuffle_of_the_same_rows_is_refused_and_a_copy_elsewhere_resumes(datasets, tmp_path):
    """Another seed's piles have as many rows and files: its state loaded, and the epoch ended with a quarter
    of the rows read twice and a quarter never."""
    import shutil

    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(datasets["source"], str(tmp_path / "other"), piles=8, seed=12)
    loader = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=1)
    iterator = iter(loader)
    seen = [next(iterator)["id"].to_numpy() for _ in range(5)]
    state = loader.state_dict()
    with pytest.raises(ValueError, match="the state belongs to another dataset: its files, or their rows"):
        daskpile.PileLoader(str(tmp_path / "other"), batch_size=700, seed=1).load_state_dict(state)
    # the lazy result of the same seed has the same files and rows, each file in another order: refused
    # mid-epoch; at an epoch's start nothing is read yet, in any order
    with pytest.raises(ValueError, match=r"taken on eager piles, this loader reads lazy piles \(second_pass='lazy'\)"):
        daskpile.PileLoader(datasets["lazy"], batch_size=700, seed=1).load_state_dict(state)
    at_start = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=1, epoch=3).state_dict()
    daskpile.PileLoader(datasets["lazy"], batch_size=700, seed=1).load_state_dict(at_start)
    shutil.copytree(datasets["eager"], tmp_path / "moved")
    resumed = daskpile.PileLoader(str(tmp_path / "moved"), batch_size=700, seed=1)
    resumed.load_state_dict(state)
    rows = np.concatenate(seen + ids(resumed))
    assert sorted(rows.tolist()) == list(range(ROWS))


@pytest.mark.parametrize(
    "layout", [{"piles": 1}, {"piles": 4, "rows_per_file": 6_000}], ids=["one pile", "rows_per_file"]
)
def test_a_state_of_another_seed_s_files_of_the_same_names_and_rows_is_refused(datasets, tmp_path, layout):
    """One pile (piles="auto" on small data), or rows_per_file: another seed's result has the same files and rows
    per file.  Its state was loaded, and the epoch read 1,187 of 5,000 rows twice and never read as many.  The
    same call run again writes the same rows in the same order: its state resumes."""
    with dask.config.set(scheduler="sync"):
        for name, seed in (("first", 1), ("other seed", 2), ("same call", 1)):
            daskpile.shuffle_parquet(datasets["source"], str(tmp_path / name), seed=seed, **layout)
    _a_state_resumes_on_the_same_call_alone(tmp_path, batches=5, rows=ROWS)


def test_a_state_of_another_seed_s_dataframe_files_of_the_same_sizes_is_refused(tmp_path):
    """``shuffle(ddf).to_parquet`` writes no manifest: files of fixed-width columns, uncompressed, have one size
    whatever the seed, and a state taken on one seed's files was loaded on the other's, its epoch reading 37,601
    of 200,000 rows twice (a new user's trial).  Each file's footer now says its shuffle's seed."""
    frame = dd.from_pandas(pd.DataFrame({"id": np.arange(5_000), "x": np.arange(5_000, dtype=float)}), npartitions=4)
    with dask.config.set(scheduler="sync"):
        for name, seed in (("first", 1), ("other seed", 2), ("same call", 1)):
            daskpile.shuffle(frame, piles=1, seed=seed).to_parquet(tmp_path / name, compression=None, write_index=False)
    assert len({(tmp_path / name / "part.0.parquet").stat().st_size for name in ("first", "other seed")}) == 1
    _a_state_resumes_on_the_same_call_alone(tmp_path, batches=3, rows=5_000)


def _a_state_resumes_on_the_same_call_alone(tmp_path, batches: int, rows: int) -> None:
    """A state taken after ``batches`` batches of the result in ``first``: refused on ``other seed``'s files,
    resumed on ``same call``'s to every row once."""
    loader = daskpile.PileLoader(str(tmp_path / "first"), batch_size=700, seed=1)
    iterator = iter(loader)
    seen = [next(iterator)["id"].to_numpy() for _ in range(batches)]
    state = loader.state_dict()
    with pytest.raises(ValueError, match="the same files and rows per file, of another shuffle"):
        daskpile.PileLoader(str(tmp_path / "other seed"), batch_size=700, seed=1).load_state_dict(state)
    resumed = daskpile.PileLoader(str(tmp_path / "same call"), batch_size=700, seed=1)
    resumed.load_state_dict(state)
    assert sorted(np.concatenate(seen + ids(resumed)).tolist()) == list(range(rows))


def test_a_state_of_shuffle_parquet_files_named_one_by_one_is_told_from_another_seed_s(datasets, tmp_path):
    """Files named by a glob or a list are read without their manifest: their key was their sizes alone, one
    for two seeds' files of one pile (the review).  Their pile stamps are in it now; a state saved before, of
    the sizes alone, still loads (the review: such states were refused as another shuffle's)."""
    from daskpile.loader.units import content_key

    source = tmp_path / "source"
    rng = np.random.default_rng(0)  # (random floats: Snappy does not pay, and two seeds' files have one size)
    write_parts(pa.table({"x": rng.random(5_000), "y": rng.random(5_000)}), source, 2)
    with dask.config.set(scheduler="sync"):
        for name, seed in (("first", 1), ("other seed", 2)):
            daskpile.shuffle_parquet(str(source), str(tmp_path / name), seed=seed, piles=1)
    named = {name: sorted(str(p) for p in (tmp_path / name).glob("part-*.parquet")) for name in ("first", "other seed")}
    assert len({os.path.getsize(files[0]) for files in named.values()}) == 1
    loader = daskpile.PileLoader(named["first"], batch_size=700, seed=1)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ValueError, match="the same files and rows per file, of another shuffle"):
        daskpile.PileLoader(named["other seed"], batch_size=700, seed=1).load_state_dict(state)
    sizes = [{"size": os.path.getsize(f)} for f in named["first"]]
    daskpile.PileLoader(named["first"], batch_size=700, seed=1).load_state_dict(
        {**state, "content": content_key(None, sizes)}
    )


def _written_again(path: Path) -> None:
    """The file's rows written again in another order, under its name (a new file, renamed over it)."""
    table = pq.read_table(path)
    pq.write_table(table.take(np.random.default_rng(0).permutation(table.num_rows)), path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)


@pytest.mark.parametrize("kind", ["result", "no manifest", "filtered"])
def test_files_written_again_under_their_names_mid_epoch_stop_the_epoch(datasets, tmp_path, kind):
    """A result shuffled again with rows_per_file (as many rows in files of the same names): the epoch went on
    into the new files, and 8,393 of 60,000 rows were read twice and as many never.  Each file read must be
    the one listed when the loader was made."""
    dest = tmp_path / "dest"
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(datasets["source"], str(dest), seed=1, piles=4, rows_per_file=6_000)
    if kind == "no manifest":
        (dest / "_daskpile.json").unlink()
    filters = [("id", ">=", 0)] if kind == "filtered" else None
    loader = daskpile.PileLoader(str(dest), batch_size=500, seed=1, filters=filters)
    iterator = iter(loader)
    next(iterator)
    for path in sorted(dest.glob("*.parquet")):
        _written_again(path)
    with pytest.raises(
        ValueError,
        match=r"part-0000[0-9]\.parquet' was written again since it was listed: the dataset "
        "changed since this loader was made",
    ):
        for _ in iterator:
            pass


def test_a_column_read_after_its_file_was_written_again_is_refused(datasets, tmp_path):
    """A piece reads its file's footer, then each column on its own: a column of the new file would be rows
    of other rows' values, aligned to nothing."""
    from daskpile._storage import FileChangedError
    from daskpile.loader.reading import _PieceReader
    from daskpile.loader.units import discover

    dest = tmp_path / "dest"
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(datasets["source"], str(dest), seed=1, piles=4, rows_per_file=6_000)
    units = discover(str(dest), None)
    piece = _PieceReader(units, 0, [(0, 6_000)], None, None)
    assert len(piece.column("id")) == 6_000
    _written_again(Path(units.paths[0][0]))
    with pytest.raises(FileChangedError, match=r"part-00000\.parquet' was written again since it was listed"):
        piece.column("id")


def test_a_file_cut_short_after_it_was_listed_is_said_so(datasets, tmp_path):
    """A copy stopped half way, or a disk full: said as what it is, not as a file written again."""
    from daskpile._storage import FileChangedError
    from daskpile.loader.reading import _PieceReader
    from daskpile.loader.units import discover

    dest = tmp_path / "dest"
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(datasets["source"], str(dest), seed=1, piles=4, rows_per_file=6_000)
    units = discover(str(dest), None)
    piece = _PieceReader(units, 0, [(0, 6_000)], None, None)
    path = Path(units.paths[0][0])
    size = path.stat().st_size
    os.truncate(path, size // 2)
    with pytest.raises(
        FileChangedError, match=rf"was cut short or written again \({size // 2:,} bytes, {size:,} when listed\)"
    ):
        piece.column("id")


def test_a_loader_made_without_a_seed_takes_the_state_s(datasets):
    state = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=3, epoch=2).state_dict()
    resumed = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=None)
    resumed.load_state_dict(state)
    assert resumed.seed == 3 and resumed.state_dict() == state


@pytest.mark.parametrize(
    "change, message",
    [
        ({"batches": -1}, r"batches is -1, not a whole number from 0"),
        ({"batches": 10**6}, r"1,000,000 batches read, and epoch 0 has 35"),
        ({"starts": [0, 0]}, r"starts is \[0, 0\], not 1 whole numbers"),
        ({"starts": [10**6]}, r"stream 0 starts at row 1,000,000, and has 24,000 rows"),
        ({"seed": "5"}, r"seed is '5', not a whole number"),
        ({"batch_size": 0}, r"batch_size is 0, not a whole number from 1"),
        ({"starts": None}, r"starts is None"),
    ],
)
def test_a_damaged_state_is_refused_before_it_is_used(datasets, change, message):
    """A batches of -1 yielded one batch more (a batch of rows twice); 10**6 none; a bad start an IndexError."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=700, seed=5)
    state = {**loader.state_dict(), **change}
    with pytest.raises(ValueError, match="^not a (valid )?PileLoader state: " + message):
        loader.load_state_dict(state)
    for damaged, said in [(None, "got NoneType"), ({}, "it lacks 'seed'"), ({"seed": 5}, "it lacks 'epoch'")]:
        with pytest.raises(ValueError, match=f"^not a PileLoader state: .*{said}"):
            loader.load_state_dict(damaged)
    assert len(loader) == 35 and loader.state_dict()["batches"] == 0  # untouched


def test_a_list_of_files_in_another_order_on_each_rank_reads_every_row_once(datasets):
    """Each rank plans the epoch from its own list: one listed in another order lost and repeated rows."""
    files = sorted(str(p) for p in Path(datasets["ddf"]).glob("*.parquet"))
    per_rank = [
        ids(daskpile.PileLoader(listed, batch_size=500, seed=5, rank=r, world_size=2))
        for r, listed in enumerate([files, files[::-1]])
    ]
    assert sorted(np.concatenate([np.concatenate(b) for b in per_rank]).tolist()) == list(range(ROWS))
    with pytest.raises(ValueError, match=r"part\.0\.parquet' is named twice: its rows would be read twice"):
        daskpile.PileLoader([*files, files[0]], batch_size=500, seed=5)


def test_a_damaged_manifest_is_named_as_such(datasets, tmp_path):
    """A manifest cut short, or with a key gone, gave a bare JSONDecodeError or KeyError, on the command line too."""
    import shutil

    shutil.copytree(datasets["eager"], tmp_path / "piles")
    manifest = tmp_path / "piles" / "_daskpile.json"
    whole = manifest.read_text()
    for damaged, said in [
        (whole[: len(whole) // 2], r"Unterminated string|Expecting"),
        (json.dumps({k: v for k, v in json.loads(whole).items() if k != "rows_per_file"}), "it lacks 'rows_per_file'"),
    ]:
        manifest.write_text(damaged)
        with pytest.raises(ValueError, match=rf"_daskpile\.json' is not a whole daskpile manifest: .*({said})"):
            daskpile.PileLoader(str(tmp_path / "piles"), batch_size=100, seed=1)
        done = daskpile_in_process("verify", str(tmp_path / "piles"))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
        assert "is not a whole daskpile manifest" in done.stderr


class SlowFileSystem(LocalFileSystem):
    """Local files behind a delay on every open: an object store far away."""

    protocol = "slowfile"
    delay = 0.1
    opens = 0

    def _open(self, path, *args, **kwargs):
        SlowFileSystem.opens += 1
        time.sleep(self.delay)
        return super()._open(path, *args, **kwargs)


fsspec.register_implementation("slowfile", SlowFileSystem, clobber=True)


class CountingFileSystem(LocalFileSystem):
    """Local files whose bytes read are counted: what an object store would be asked for."""

    protocol = "countfile"
    read = 0

    def _open(self, path, *args, **kwargs):
        f = super()._open(path, *args, **kwargs)
        original = f.read

        def counted(*a, **k):
            data = original(*a, **k)
            CountingFileSystem.read += len(data)
            return data

        f.read = counted
        return f


fsspec.register_implementation("countfile", CountingFileSystem, clobber=True)


def test_only_the_columns_asked_for_are_read(datasets, tmp_path):
    """Through fsspec the loader asks for byte ranges: one small column of seven is a fraction of the file.

    One pile, so that the file is large beside its footer (pyarrow reads a file's last 64 KiB first).
    """
    with dask.config.set(scheduler="sync"):
        report = daskpile.shuffle_parquet(datasets["source"], str(tmp_path / "one"), piles=1, seed=1)
    size = report.output_bytes
    url = "countfile://" + str(tmp_path / "one")
    CountingFileSystem.read = 0
    assert sum(b.num_rows for b in daskpile.PileLoader(url, batch_size=4000, seed=1)) == ROWS
    everything = CountingFileSystem.read
    CountingFileSystem.read = 0
    assert sum(b.num_rows for b in daskpile.PileLoader(url, batch_size=4000, seed=1, columns=["label"])) == ROWS
    assert everything >= size and CountingFileSystem.read < 0.2 * size


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [1, 0])
def test_prefetch_keeps_a_fast_consumer_fed(datasets, prefetch, monkeypatch):
    """A consumer slower than the reader waits for the first pile only; without prefetch it waits for every one.

    Each pile costs the reader an open of 0.2 s (its footer and its one column
    are read from the file opened once); the consumer spends 0.4 s a pile (4
    batches of 0.1 s).  With prefetch the next pile is ready each time.
    """
    monkeypatch.setattr(SlowFileSystem, "delay", 0.2)
    loader = daskpile.PileLoader(
        "slowfile://" + datasets["eager"], batch_size=750, seed=1, prefetch=prefetch, columns=["id"]
    )
    for _ in loader:
        time.sleep(0.1)
    assert loader.stats.groups == 8 and loader.stats.first_wait >= 0.2
    if prefetch:
        # About 0 s on a quiet machine; a loaded one may delay the reader's thread a little (a pile read ahead
        # only every other time would wait 0.7 s, none 1.4)
        assert loader.stats.waited < 0.5
    else:
        assert loader.stats.waited >= 7 * 0.2


@pytest.mark.parametrize("threads", [1, 2])
def test_a_file_is_opened_once_a_thread_not_once_a_column(tmp_path, monkeypatch, threads):
    """A piece's columns, each a task, opened its file again each: Arrow reads the schema at each opening, and
    a piece of 2,001 columns was read in 15.4 s, against 0.4 s with the file opened once (a time that grew as
    the columns squared)."""
    import pyarrow as pa

    monkeypatch.setattr(SlowFileSystem, "delay", 0)
    table = pa.table({f"c{i}": np.arange(1_000) + i for i in range(60)})
    for k in range(3):
        pq.write_table(table, tmp_path / f"part-{k}.parquet")
    loader = daskpile.PileLoader("slowfile://" + str(tmp_path), batch_size=500, seed=1, threads=threads)
    opens = SlowFileSystem.opens  # (once the files' row counts are known)
    batches = list(loader)
    assert sum(b.num_rows for b in batches) == 3_000 and batches[0].num_columns == 60
    assert SlowFileSystem.opens - opens <= 3 * threads


def test_a_loop_left_early_stops_the_reading_ahead(datasets):
    """The loads queued for the groups ahead do nothing once the consumer stops (here, 6 piles, an open or two each).

    Measured: 1 open more after the break, against 40 when the queued loads still ran (a file was opened for
    each column then).
    """
    loader = daskpile.PileLoader("slowfile://" + datasets["eager"], batch_size=100, seed=1, prefetch=6)
    iterator = iter(loader)
    next(iterator)
    iterator.close()
    at_break = SlowFileSystem.opens
    time.sleep(1.5)
    assert SlowFileSystem.opens - at_break <= 4  # the reads running at the break (2 threads) finish


def test_a_loop_left_early_lets_its_files_go(datasets, monkeypatch):
    """A piece's file is open until its last column is read: a loop left early left the files of the groups
    read ahead open until the garbage collector found them."""
    import gc

    monkeypatch.setattr(SlowFileSystem, "delay", 0.05)  # (reads still under way at the break)
    directory = os.path.realpath(datasets["eager"])
    gc.disable()  # (what it would find is what the loader must let go itself)
    try:
        loader = daskpile.PileLoader(f"slowfile://{directory}", batch_size=100, seed=1, prefetch=4, threads=2)
        iterator = iter(loader)
        next(iterator)
        iterator.close()
        time.sleep(1)  # (the reads running at the break end)
        held = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # (the listing's own)
                held.append(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        gc.enable()
    assert not [path for path in held if path.startswith(directory)]


@pytest.mark.parametrize("prefetch", [0, 1])
def test_many_small_files_are_read_ahead_by_the_file_not_by_the_row(tmp_path, prefetch):
    """Beside one large file, 60 small ones each count as a file: `prefetch` of them are read ahead, not all.

    Counted in rows alone (as many as the largest file's), every small file fitted in the first one's room.
    """
    import pyarrow as pa

    pq.write_table(pa.table({"id": np.arange(20_000)}), tmp_path / "part-000.parquet")
    for i in range(1, 61):
        pq.write_table(pa.table({"id": np.arange(20) + 20_000 * i}), tmp_path / f"part-{i:03}.parquet")
    loader = daskpile.PileLoader(str(tmp_path), batch_size=10, seed=3, prefetch=prefetch)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.5)  # room for the reader to run ahead as far as it may
    assert loader._loads.produced <= 1 + prefetch + 1  # +1: the group just let go
    assert sum(batch.num_rows for batch in iterator) + 10 == 20_000 + 60 * 20


def test_memory_holds_prefetch_plus_one_groups(datasets):
    """With one file a group, the reader never runs more than `prefetch` groups ahead of the consumer."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=3000, seed=1, prefetch=2, mix=1)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.5)  # room for the reader to run ahead as far as it may
    assert loader._loads.produced == 1 + 2


MIX_MEMORY = """
import os, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import daskpile
from daskpile.loader import reading

directory, mix, prefetch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
pile = pa.table({f"c{i}": rng.random(60_000) for i in range(4)})  # numpy's memory, not Arrow's pool
for j in range(8):
    pq.write_table(pile, f"{directory}/part-{j}.parquet", compression="none")
reading.PART_ROWS = 8192  # 7 parts a file, as B's 1.56 M-row piles make 2 parts of 2**20
rows = 0
# threads=2: the loader's column threads, each permuting a column at a time, as measured
for batch in daskpile.PileLoader(directory, batch_size=1000, seed=0, mix=mix, prefetch=prefetch, threads=2):
    rows += batch.num_rows
    time.sleep(0.001)  # a consumer slower than the reader: it reads as far ahead as it may
print(rows, pa.default_memory_pool().max_memory() / pile.nbytes)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mix, prefetch, files", [(4, 1, 8), (2, 1, 5)])
def test_mix_holds_mix_plus_prefetch_files_not_two_groups(tmp_path, mix, prefetch, files):
    """A group is let go part by part as it is consumed, and the next one's files read as room is made.

    Measured, in files of the Arrow pool's peak (a fresh process, so the pool's own peak is this loader's):
    mix 4 6.9-7.1 and mix 2 4.3, against 11.1-11.6 and 5.8 when the next whole group was loaded beside the
    one consumed.  Beyond the mix + prefetch files: the columns being permuted, each read and taken at once.
    The groups' orders are drawn in the pool too (``_kernels.permutation``), 8 bytes a row, a quarter of these
    32-byte rows: two groups' are allowed for (measured then 8.0 and 5.4).
    """
    out = subprocess.run(
        [sys.executable, "-c", MIX_MEMORY, str(tmp_path), str(mix), str(prefetch)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows, peak = out.stdout.split()
    assert int(rows) == 8 * 60_000
    orders = 2 * mix * 8 / 32  # in files: the group's order and the next one's, 8 bytes a row of 32
    assert float(peak) < files + orders


def test_loading_a_pile_does_not_hold_it_read_and_permuted_whole_at_once(tmp_path):
    """Each column read is let go once taken: the Arrow pool peaks near one copy of the pile, not two."""
    import pyarrow as pa

    rng = np.random.default_rng(0)
    pile = pa.table({f"c{i}": rng.random(300_000) for i in range(6)})
    pq.write_table(pile, tmp_path / "part-0.parquet", compression="none")
    pool, default = pa.proxy_memory_pool(pa.default_memory_pool()), pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        rows = sum(batch.num_rows for batch in daskpile.PileLoader(str(tmp_path), batch_size=1000, seed=0, prefetch=0))
    finally:
        pa.set_memory_pool(default)
    assert rows == 300_000
    # 1.28-1.56 measured (it depends on how the threads interleave); 2.02, every time, when reads were kept to the end
    assert pool.max_memory() < 1.8 * pile.nbytes


def test_a_batch_across_two_groups_holds_a_batch_of_the_first_not_its_last_part(tmp_path):
    """The rows a group ends with short of a batch are a view of a part of a batch's rows (no copy): what a
    batch across groups keeps of the group it began in is that part, not one of the group's large parts."""
    for j in range(3):
        pq.write_table(pa.table({"id": np.arange(j * 10_000, (j + 1) * 10_000)}), tmp_path / f"part-{j}.parquet")
    # two threads: parts of 3,500 rows, then the last 3,000 (a batch)
    batches = list(daskpile.PileLoader(str(tmp_path), batch_size=3_000, seed=0, prefetch=1, threads=2))
    across = [batch for batch in batches if len(set(batch["id"].to_numpy() // 10_000)) > 1]
    assert len(across) == 2  # 10,000 rows a group: batches of 3,000 end a group short by 1,000, then 2,000
    for batch in across:
        first = batch.column("id").chunk(0)  # the rows of the group it began in: a view of their part
        assert first.buffers()[1].size == 3_000 * 8  # the last 3,000 rows; taken in two halves, 5,000
    assert sorted(np.concatenate([b["id"].to_numpy() for b in batches])) == list(range(30_000))


def test_no_loading_thread_waits_for_another_ones_task(datasets, monkeypatch):
    """A load's tasks are queued once their inputs are done: with a thread a core, one thread waiting for
    another's task would leave a core idle (an epoch of A took 1.45-1.70 s so, against 1.21-1.38)."""
    import concurrent.futures
    import threading

    waits = []
    result = concurrent.futures.Future.result

    def checked(future, timeout=None):
        if threading.current_thread().name.startswith("daskpile-column") and not future.done():
            waits.append(threading.current_thread().name)
        return result(future, timeout)

    monkeypatch.setattr(concurrent.futures.Future, "result", checked)
    for path in (datasets["eager"], datasets["lazy"]):
        rows = sum(len(b) for b in daskpile.PileLoader(path, batch_size=700, seed=3, mix=2, prefetch=2))
        assert rows == ROWS
    assert waits == []


def test_the_task_pool_runs_the_earliest_loads_tasks_first():
    """A group's takes, queued once its reads are done, run before the next group's reads queued earlier:
    otherwise the columns read and not yet taken pile up."""
    import threading

    from daskpile.loader.reading import TaskPool

    pool, ran, gate = TaskPool(1, name="test"), [], threading.Event()
    first, second = pool.next_rank(), pool.next_rank()
    busy = pool.submit(first, gate.wait)  # the one thread is busy while the rest is queued
    later = [pool.submit(second, ran.append, f"read {i} of the second load") for i in range(2)]
    earlier = pool.submit(first, ran.append, "take of the first load")
    gate.set()
    for future in [busy, *later, earlier]:
        future.result(timeout=10)
    assert ran == ["take of the first load", "read 0 of the second load", "read 1 of the second load"]


def test_outputs_columns_and_filters(datasets):
    frame = next(iter(daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, output="pandas")))
    assert list(frame.columns) == pq.read_schema(datasets["source"] + "/in-000.parquet").names
    arrays = next(iter(daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, output="numpy", columns=["id"])))
    assert list(arrays) == ["id"] and arrays["id"].dtype == np.int64
    low = daskpile.PileLoader(datasets["eager"], batch_size=64, seed=1, filters=[("id", "<", 1000)], columns=["id"])
    assert sorted(np.concatenate(ids(low)).tolist()) == list(range(1000))


@pytest.mark.parametrize("second_pass", ["eager", "lazy"])
def test_numpy_output_gives_a_column_with_a_null_anywhere_one_dtype_in_every_batch(tmp_path, second_pass):
    """An integer or boolean column that holds a null in some file is float64 in every batch, those without a
    null too (a batch's dtype was its own: an embedding index int64 one step, float64 the next)."""
    rows = 2_000
    ids = np.arange(rows)
    table = pa.table({
        "id": ids,
        "user": pa.array([None if i % 97 == 0 else i for i in ids], pa.int32()),
        "flag": pa.array([None if i % 89 == 0 else bool(i % 2) for i in ids], pa.bool_()),
        "whole": pa.array(ids % 7, pa.int16()),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "source.parquet")
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(str(tmp_path / "source.parquet"), str(tmp_path / "piles"), piles=4, seed=1,
                                 second_pass=second_pass)  # fmt: skip
    loader = daskpile.PileLoader(str(tmp_path / "piles"), batch_size=32, seed=2, output="numpy")
    batches = list(loader)
    dtypes = {name: {str(b[name].dtype) for b in batches} for name in table.column_names}
    assert dtypes == {"id": {"int64"}, "user": {"float64"}, "flag": {"float64"}, "whole": {"int16"}}
    assert any(not np.isnan(b["user"]).any() for b in batches)  # batches without a null: float64 all the same
    order = np.concatenate([b["id"] for b in batches])
    user = np.concatenate([b["user"] for b in batches])
    flag = np.concatenate([b["flag"] for b in batches])
    assert np.array_equal(np.isnan(user), order % 97 == 0) and np.array_equal(
        user[order % 97 != 0], order[order % 97 != 0]
    )
    assert np.array_equal(np.isnan(flag), order % 89 == 0) and np.array_equal(
        flag[order % 89 != 0], order[order % 89 != 0] % 2
    )

    # pandas: the dtypes pd.read_parquet gives the files (float64, object), in batches without a null too
    frames = list(daskpile.PileLoader(str(tmp_path / "piles"), batch_size=32, seed=2, output="pandas"))
    dtypes = {name: {str(f[name].dtype) for f in frames} for name in table.column_names}
    assert dtypes == {"id": {"int64"}, "user": {"float64"}, "flag": {"object"}, "whole": {"int16"}}
    assert any(f["user"].notna().all() for f in frames)
    whole = pd.concat(frames, ignore_index=True).sort_values("id", ignore_index=True)
    pd.testing.assert_frame_equal(whole, pd.read_parquet(tmp_path / "source.parquet"))
    # a named index with a null in some file, as the pandas metadata restores it: float64 in every batch too
    indexed = tmp_path / "indexed"
    indexed.mkdir()
    metadata = pa.Table.from_pandas(pd.DataFrame({"x": [0]}, index=pd.Index([0], name="user"))).schema.metadata
    for part in range(3):
        users = pa.array([None if i == 5 else i for i in range(part * 200, (part + 1) * 200)], pa.int64())
        table = pa.table({"x": pa.array(range(200), pa.int64()), "user": users}).replace_schema_metadata(metadata)
        pq.write_table(table, indexed / f"part.{part}.parquet")
    loader = daskpile.PileLoader(str(indexed), batch_size=50, seed=0, output="pandas")
    assert {str(f.index.dtype) for f in loader} == {"float64"}


def test_a_window_records_the_columns_with_nulls_of_its_generations(tmp_path):
    """A null only in an appended generation: the window's manifest lists its column, before and after compact."""
    for day, users in ((0, list(range(300))), (1, [None if i % 7 == 0 else i for i in range(300, 600)])):
        pq.write_table(pa.table({"id": range(day * 300, day * 300 + 300), "user": pa.array(users, pa.int64())}),
                       tmp_path / f"day-{day}.parquet")  # fmt: skip
    window = str(tmp_path / "window")
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(str(tmp_path / "day-0.parquet"), window, piles=3, seed=1)
        assert daskpile.read_manifest(window)["null_columns"] == []
        daskpile.append(window, str(tmp_path / "day-1.parquet"))
        assert daskpile.read_manifest(window)["null_columns"] == ["user"]
        batches = list(daskpile.PileLoader(window, batch_size=16, seed=0, output="numpy"))
        assert {str(b["user"].dtype) for b in batches} == {"float64"}
        daskpile.compact(window)
        assert daskpile.read_manifest(window)["null_columns"] == ["user"]


def test_numpy_dtypes_of_columns_with_nulls_without_a_manifest_come_from_the_footers(tmp_path):
    """shuffle(ddf).to_parquet (footers with null counts), a key folder of no value, and files without null counts
    (said, naming the columns, and read batch by batch as before)."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame(
        {"id": range(600), "user": pd.array([None if i % 50 == 0 else i for i in range(600)], "Int64")}
    )
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(dd.from_pandas(frame, npartitions=3), piles=3, seed=1).to_parquet(str(tmp_path / "ddf"))
    batches = list(daskpile.PileLoader(str(tmp_path / "ddf"), batch_size=16, seed=0, output="numpy"))
    assert {str(b["user"].dtype) for b in batches} == {"float64"} and {str(b["id"].dtype) for b in batches} == {"int64"}

    for day, rows in (("1", range(0, 100)), ("__HIVE_DEFAULT_PARTITION__", range(100, 110))):
        (tmp_path / "keys" / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"id": list(rows)}), tmp_path / "keys" / f"day={day}" / "part-0.parquet")
    batches = list(daskpile.PileLoader(str(tmp_path / "keys"), batch_size=8, seed=0, output="numpy"))
    assert {str(b["day"].dtype) for b in batches} == {"float64"}
    frames = list(daskpile.PileLoader(str(tmp_path / "keys"), batch_size=8, seed=0, output="pandas"))
    assert {str(f["day"].dtype) for f in frames} == {"float64"}
    assert sorted(np.concatenate([b["id"][np.isnan(b["day"])] for b in batches]).tolist()) == list(range(100, 110))

    (tmp_path / "plain").mkdir()
    pq.write_table(frame.pipe(pa.Table.from_pandas), tmp_path / "plain" / "part-0.parquet", write_statistics=False)
    with pytest.warns(UserWarning, match=r"whether 'id', 'user' hold a null is not recorded") as warned:
        loader = daskpile.PileLoader(str(tmp_path / "plain"), batch_size=16, seed=0, output="numpy")
    assert {w.filename for w in warned} == {__file__}  # the caller's line, not daskpile's
    assert {str(b["user"].dtype) for b in loader} == {"float64", "int64"}  # batch by batch, as said


def test_an_empty_pile_s_file_is_not_taken_for_one_without_null_counts(tmp_path):
    """shuffle(ddf).to_parquet writes an empty pile as a row group of no rows and no statistics: every
    numpy loader warned that the integer columns' nulls were not recorded."""
    import warnings

    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame({"id": np.arange(3), "x": np.arange(3.0)})
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(dd.from_pandas(frame, npartitions=1), piles=8, seed=1).to_parquet(str(tmp_path / "d"))
    assert any(pq.ParquetFile(p).metadata.num_rows == 0 for p in (tmp_path / "d").glob("*.parquet"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = list(daskpile.PileLoader(str(tmp_path / "d"), batch_size=2, seed=0, output="numpy"))
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == [0, 1, 2]


def test_shuffle_ddf_to_parquet_counts_the_nulls_of_an_integer_index_it_writes(tmp_path):
    """Its index, named or not, is a column of the files: without null counts, every numpy loader warned."""
    import warnings

    import dask.dataframe as dd
    import pandas as pd

    for name in ("user_id", None):
        frame = pd.DataFrame({"x": np.arange(600)}, index=pd.Index(np.arange(600), name=name))
        with dask.config.set(scheduler="sync"):
            daskpile.shuffle(dd.from_pandas(frame, npartitions=2), piles=2, seed=0).to_parquet(
                str(tmp_path / str(name))
            )
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = daskpile.PileLoader(str(tmp_path / str(name)), batch_size=100, seed=0, output="numpy",
                                         columns=["x", name or "__null_dask_index__"])  # fmt: skip
        assert {str(b[name or "__null_dask_index__"].dtype) for b in loader} == {"int64"}


def test_missing_or_corrupt_pile_is_named(datasets, tmp_path):
    """A missing or cut file is named when the loader is made (one listing): not when an epoch reaches it."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(datasets["eager"], broken)
    data = (broken / "part-00003.parquet").read_bytes()
    (broken / "part-00003.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"part-00003\.parquet has [0-9,]+ bytes, the manifest said [0-9,]+: it chan"):
        daskpile.PileLoader(str(broken), batch_size=1000, seed=1)
    (broken / "part-00003.parquet").write_bytes(b"x" * len(data))  # as large as it was: found when read
    with pytest.raises(ValueError, match=r"part-00003\.parquet"):
        list(daskpile.PileLoader(str(broken), batch_size=1000, seed=1))
    loader = daskpile.PileLoader(str(broken), batch_size=1000, seed=1, prefetch=0)
    (broken / "part-00003.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"part-00003\.parquet, a file of the dataset's manifest, is missing"):
        daskpile.PileLoader(str(broken), batch_size=1000, seed=1)
    # removed after the loader was made: said as of a shuffle result, not of a window's (a trial: "a window whose
    # version this loader reads ... set_epoch(epoch, version=...)", of a result that has no versions)
    with pytest.raises(
        FileNotFoundError,
        match=r"part-00003\.parquet.*: the result changed since this loader was made "
        r"\(written again, or its files removed\), so this epoch cannot go on; make the loader again$",
    ):
        list(loader)


def test_files_without_a_manifest_must_have_the_same_columns(tmp_path):
    """A file with other columns was an IndexError mid-epoch; a first file without a column dropped it."""
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "v": [1.0, 2.0]}), tmp_path / "d" / "part.0.parquet")
    pq.write_table(pa.table({"id": [3, 4]}), tmp_path / "d" / "part.1.parquet")
    with pytest.raises(ValueError, match=r"part\.1\.parquet has other columns than .*part\.0\.parquet.*lacks 'v'$"):
        daskpile.PileLoader(str(tmp_path / "d"), batch_size=1, seed=1)
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int32()), "v": [3.0, 4.0]}), tmp_path / "d" / "part.1.parquet")
    with pytest.raises(ValueError, match=r"part\.1\.parquet .*: id is int32, not int64$"):
        daskpile.PileLoader(str(tmp_path / "d"), batch_size=1, seed=1)
    pq.write_table(pa.table({"id": [3, 4], "v": [3.0, 4.0], "w": [5, 6]}), tmp_path / "d" / "part.1.parquet")
    with pytest.raises(ValueError, match=r"part\.1\.parquet .*: it has 'w' too$"):
        daskpile.PileLoader(str(tmp_path / "d"), batch_size=1, seed=1)
    loader = daskpile.PileLoader(str(tmp_path / "d"), batch_size=1, seed=1, columns=["id"])  # what is read agrees
    assert sorted(b["id"][0].as_py() for b in loader) == [1, 2, 3, 4]


def test_a_filter_value_of_another_type_is_named_as_the_filters(datasets, tmp_path):
    with pytest.raises(ValueError, match=r"^filters: a value of another type than its column's"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, filters=[("id", "==", "a")])
    # An int beside a decimal column: "cannot read '.../part-00000.parquet' as Parquet: Precision is not great
    # enough", which a new user's trial read as a damaged pile
    prices = pa.array([decimal.Decimal(i) / 100 for i in range(1000)], pa.decimal128(12, 2))
    pq.write_table(pa.table({"id": range(1000), "price": prices}), tmp_path / "part-0.parquet")
    # Decimals of another scale than the column's: pyarrow 21 took Decimal("5") for 0.05 (994 rows, not 499)
    for filters, rows in [
        ([("price", ">", decimal.Decimal(5))], 499),
        ([("price", ">", decimal.Decimal("5.000"))], 499),
        ([("price", "in", [decimal.Decimal(1), decimal.Decimal("2.5")])], 2),
        ([[("price", "<", decimal.Decimal("0.1"))], [("id", "==", 999)]], 11),
    ]:
        loader = daskpile.PileLoader(str(tmp_path), batch_size=10, seed=1, filters=filters)
        assert sum(b.num_rows for b in loader) == rows, filters
    with pytest.raises(ValueError, match=r"^filters: a value of another type than its column's \(Precision .*\): "
                                         r"compare a decimal column with a decimal\.Decimal, or a float$"):  # fmt: skip
        daskpile.PileLoader(str(tmp_path), batch_size=10, seed=1, filters=[("price", ">", 5)])


def test_filters_whose_terms_are_lists_as_json_gives_them(tmp_path):
    """pyarrow takes a term as a list too ([["id", "<", 10]], what a filter read from JSON or YAML is): the
    decimal rewrite took that for a list of conjunctions, and every such filter failed ("too many values to
    unpack"), on any dataset."""
    pq.write_table(pa.table({"id": range(1000)}), tmp_path / "part-0.parquet")
    for filters, rows in [
        ([["id", "<", 10]], 10),
        ([("id", "<", 10)], 10),
        ([[["id", "<", 10]], [["id", ">=", 990]]], 20),
    ]:
        loader = daskpile.PileLoader(str(tmp_path), batch_size=100, seed=1, filters=filters)
        assert sum(b.num_rows for b in loader) == rows, filters


def test_decimal_filters_select_the_rows_python_does_at_any_scale(tmp_path):
    """pyarrow 21 compares a decimal(12, 2) column with Decimal("4.999") as with 4.99 (or worse): every operator,
    with values at, above and between the column's steps, against Python's own comparison of the values."""
    d = decimal.Decimal
    prices = [d(i) / 100 for i in range(-300, 700)] + [None] * 20
    pq.write_table(pa.table({"price": pa.array(prices, pa.decimal128(12, 2))}), tmp_path / "part-0.parquet")
    compare = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}
    compare["!="] = operator.ne
    cases = [([("price", op, v)], lambda x, f=f, v=v: f(x, v)) for op, f in compare.items()
             for v in [d("4.999"), d("5"), d("5.000"), d("-0.005"), d("-1.2345"), d("0.001"), d("99999")]]  # fmt: skip
    for values in [[d("4.999"), d("1")], [d("0.005")], [d("2.50"), d("3.001"), d("-1")]]:
        cases.append(([("price", "in", values)], lambda x, s=set(values): x in s))
        cases.append(([("price", "not in", values)], lambda x, s=set(values): x not in s))
    # terms as lists, as filters read from JSON or YAML are (the rewrite took [["price", ...]] for two conjunctions)
    cases.append(([["price", ">", d("4.999")]], lambda x: x > d("4.999")))
    cases.append(
        ([[["price", "<", d("0.5")]], [["price", ">=", d("6.985")]]], lambda x: x < d("0.5") or x >= d("6.985"))
    )
    for filters, keeps in cases:
        want = sum(1 for x in prices if x is not None and keeps(x)) + 20 * ("not in" in str(filters))  # nulls
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "match no row"
            loader = daskpile.PileLoader(str(tmp_path), batch_size=100, seed=1, filters=filters)
            assert sum(b.num_rows for b in loader) == want, filters


@pytest.mark.parametrize("filters", [None, [("label", "=", 1)]], ids=["no filter", "filters"])
def test_a_pile_replaced_by_another_is_named_with_or_without_filters(datasets, tmp_path, filters):
    """With filters the rows are counted anew, and the files' own counts are checked against the manifest too."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(datasets["eager"], broken)
    shutil.copy(broken / "part-00001.parquet", broken / "part-00000.parquet")  # a botched copy or sync
    with pytest.raises(ValueError, match=r"part-00000\.parquet has [0-9,]+ bytes.*said [0-9,]+: it changed"):
        list(daskpile.PileLoader(str(broken), batch_size=1000, seed=1, filters=filters))
    manifest = json.loads((broken / "_daskpile.json").read_text())  # the sizes unknown: the rows tell
    (broken / "_daskpile.json").write_text(json.dumps({**manifest, "file_stamps": [None] * len(manifest["files"])}))
    with pytest.raises(ValueError, match=r"part-00000\.parquet has [0-9,]+ rows.*said [0-9,]+: it changed since"):
        list(daskpile.PileLoader(str(broken), batch_size=1000, seed=1, filters=filters))


def test_arguments_are_checked(datasets):
    with pytest.raises(ValueError, match="rank 2 is not below world_size 2"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size 4 does not divide canonical_ranks 6"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, world_size=4, canonical_ranks=6)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        daskpile.PileLoader(datasets["eager"], batch_size=0, seed=1)
    with pytest.raises(ValueError, match="canonical_ranks must be a positive integer"):  # (0 was taken as None)
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, canonical_ranks=0)
    with pytest.raises(ValueError, match="output must be one of"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, output="torch")
    # A trial's: accepted ("False", a string, is true), or Python's own errors naming no argument
    with pytest.raises(ValueError, match=r"^drop_last must be True or False, got 'False'$"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, drop_last="False")
    with pytest.raises(ValueError, match=r"^drop_last must be True or False, got 2$"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, drop_last=2)
    for taken in (0, 1, np.True_):  # (argparse's type=int, YAML's 0 and 1: a reviewer's)
        assert daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, drop_last=taken)._layout.drop_last == taken
    with pytest.raises(TypeError, match=r"^storage_options must be a dict of the store's options or None, got str$"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, storage_options="anon=True")
    with pytest.raises(TypeError, match=r"^path must be a path or URL .* got None$"):
        daskpile.PileLoader(None, batch_size=10, seed=1)
    with pytest.raises(ValueError, match=r"^filters=\[\('id', '>'\)\] is not a filter: give \(column, op, value\)"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, filters=[("id", ">")])
    with pytest.raises(ValueError, match=r"^first_epoch must be a non-negative integer, got -1$"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1).co_batch_rate(-1)
    with pytest.raises(ValueError, match=r"^1 row after the filters cannot be cut into a share for each of 2 ranks"):
        daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, world_size=2, filters=[("id", "=", 5)])
    with pytest.raises(ValueError, match=r"^1 row after the filters cannot be cut into 4 canonical ranks"):
        daskpile.PileLoader(
            datasets["eager"], batch_size=10, seed=1, world_size=2, canonical_ranks=4, filters=[("id", "=", 5)]
        )


def test_columns_and_paths_are_checked_when_the_loader_is_made(datasets):
    for path in (datasets["eager"], datasets["ddf"]):  # Dask's __null_dask_index__ is not offered as a column
        with pytest.raises(ValueError, match=r"columns: 'lable' not in .*, whose columns are id, label") as caught:
            daskpile.PileLoader(path, batch_size=10, seed=1, columns=["id", "lable"])
        assert "__null_dask_index__" not in str(caught.value)
    with pytest.raises(FileNotFoundError, match=r"^path '.*nope' does not exist"):
        daskpile.PileLoader(datasets["eager"] + "/nope", batch_size=10, seed=1)
    for path in (datasets["eager"], datasets["ddf"]):  # with a manifest, and without
        with pytest.raises(
            ValueError, match=r"^filters: 'lable' is not a column of the dataset, whose columns are id"
        ) as e:
            daskpile.PileLoader(path, batch_size=10, seed=1, filters=[("lable", "=", 1)])
        assert "__null_dask_index__" not in str(e.value)
    (batch,) = daskpile.PileLoader(datasets["eager"], batch_size=ROWS, seed=1, columns="label")  # one name
    assert batch.column_names == ["label"]
    for wrong in ([], ["id", "id"]):
        with pytest.raises(ValueError, match="columns must name at least one column, each once"):
            daskpile.PileLoader(datasets["eager"], batch_size=10, seed=1, columns=wrong)


def test_batches_hold_the_users_columns_with_the_dtypes_pandas_gives_the_files(tmp_path):
    """shuffle(ddf).to_parquet writes Dask's __null_dask_index__ and pandas metadata (Int64 stays Int64)."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame({"id": range(100), "clicks": pd.array([None, *range(99)], dtype="Int64")})
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(dd.from_pandas(frame, npartitions=2), piles=2, seed=0).to_parquet(str(tmp_path / "p"))
        daskpile.shuffle(dd.from_pandas(frame.set_index("id"), npartitions=2), piles=2, seed=0).to_parquet(
            str(tmp_path / "named")
        )
    assert "__null_dask_index__" in pq.read_schema(next((tmp_path / "p").glob("*.parquet"))).names
    (arrow,) = daskpile.PileLoader(str(tmp_path / "p"), batch_size=100, seed=0)
    assert arrow.column_names == ["id", "clicks"]
    (batch,) = daskpile.PileLoader(str(tmp_path / "p"), batch_size=100, seed=0, output="pandas")
    assert batch.dtypes.to_dict() == {"id": np.dtype("int64"), "clicks": pd.Int64Dtype()}
    pd.testing.assert_frame_equal(batch.sort_values("id", ignore_index=True), frame)
    (named,) = daskpile.PileLoader(str(tmp_path / "named"), batch_size=100, seed=0, output="pandas")
    pd.testing.assert_frame_equal(named.sort_index(), frame.set_index("id"))
    # asked for by name, the index column is a column, as in the arrow and numpy batches
    (asked,) = daskpile.PileLoader(str(tmp_path / "named"), batch_size=100, seed=0, columns=["id"], output="pandas")
    assert list(asked.columns) == ["id"] and sorted(asked["id"]) == list(range(100))
    # a file's RangeIndex (pandas writes it as metadata, start 10 here) is not a batch's index
    frame.iloc[10:].to_parquet(tmp_path / "ranged.parquet")
    batches = list(daskpile.PileLoader(str(tmp_path / "ranged.parquet"), batch_size=90, seed=0, output="pandas"))
    assert [list(b.index) for b in batches] == [list(range(90))]


def test_pandas_batches_of_arrow_list_and_struct_columns_whatever_columns_are_read(tmp_path):
    """pandas cannot parse the dtype names it writes for them ('list<item: int64>[pyarrow]'): every batch
    failed, even of columns=["id"], as pandas' own reader of the files does."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame(
        {
            "id": range(100),
            "tags": pd.Series([[i, i] for i in range(100)], dtype=pd.ArrowDtype(pa.list_(pa.int64()))),
            "point": pd.Series([{"x": i} for i in range(100)], dtype=pd.ArrowDtype(pa.struct([("x", pa.int64())]))),
            "clicks": pd.array(range(100), dtype="Int64"),
        }
    )
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(dd.from_pandas(frame, npartitions=2), piles=2, seed=0).to_parquet(str(tmp_path / "p"))
    for columns in (None, ["id"], ["tags", "clicks"]):
        (batch,) = daskpile.PileLoader(str(tmp_path / "p"), batch_size=100, seed=0, output="pandas", columns=columns)
        expected = frame[columns or list(frame.columns)]
        assert list(batch.columns) == list(expected.columns)
        assert batch.dtypes.map(str).str.replace("element", "item").to_dict() == expected.dtypes.map(str).to_dict()
        got = batch.sort_values("id" if "id" in batch else "clicks", ignore_index=True)
        assert got.astype(object).map(str).equals(expected.astype(object).map(str))


@pytest.mark.slow
def test_on_s3(datasets):
    """Through fsspec, by row groups: two ranks over an S3-compatible server read every row once."""
    with moto_s3(buckets=("lake",)) as (fs, options):
        _read_from_s3(datasets, fs, options)


def _read_from_s3(datasets, fs, options):
    fs.put(datasets["eager"], "lake/loader/eager", recursive=True)
    url = "s3://lake/loader/eager"
    per_rank = [
        ids(daskpile.PileLoader(url, batch_size=500, seed=2, rank=r, world_size=2, storage_options=options))
        for r in range(2)
    ]
    assert sorted(np.concatenate([np.concatenate(b) for b in per_rank]).tolist()) == list(range(ROWS))


def test_objects_written_again_mid_epoch_stop_the_epoch_on_s3():
    """On an object store, by the ETag the loader listed, or (the listing cached) by s3fs reading with If-Match:
    written by another process, as a re-shuffle would be."""
    import s3fs

    with moto_s3(buckets=("lake",)) as (fs, options):
        for i in range(4):
            with fs.open(f"lake/d/part-{i}.parquet", "wb") as f:
                pq.write_table(pa.table({"id": np.arange(i * 1000, (i + 1) * 1000)}), f)
        loader = daskpile.PileLoader("s3://lake/d", batch_size=100, seed=1, storage_options=options)
        iterator = iter(loader)
        next(iterator)
        other = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        for i in range(4):
            with other.open(f"lake/d/part-{i}.parquet", "wb") as f:
                pq.write_table(pa.table({"id": np.arange((i + 1) * 1000 - 1, i * 1000 - 1, -1)}), f)
        with pytest.raises(
            ValueError,
            match=r"s3://lake/d/part-[0-9].parquet' was written again since it was listed(, or while it was read)?: "
            "the dataset changed since this loader was made",
        ):
            for _ in iterator:
                pass


def test_mix_over_more_streams_than_piles_to_mix_says_it_cannot_act(datasets):
    """8 piles read by 8 streams: each stream holds about one pile, so mix=2 mixes none, and its co-batch rate
    is mix=1's (a trial: 0.0264 against 0.0266), where the guide promised about 4x fewer pairs."""
    import warnings

    with pytest.warns(UserWarning, match=r"PileLoader\(mix=2\): the dataset's 8 piles are cut into 8 streams .* "
                      r"shuffle into 16 piles or more") as warned:  # fmt: skip
        mixed = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4, mix=2, world_size=8, rank=3)
    assert {w.filename for w in warned} == {__file__}
    plain = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4, world_size=8, rank=3)
    assert mixed.co_batch_rate().rate > 0.9 * plain.co_batch_rate().rate  # what the warning says
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4, mix=2, world_size=4, rank=0)
        # mix beyond the piles a stream reads mixes those it reads: no warning (a quality trial's mix=100)
        many = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4, mix=100)
    assert (
        many.co_batch_rate().rate
        < 0.5 * daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4).co_batch_rate().rate
    )


def test_mix_cuts_the_pairs_kept_together_from_epoch_to_epoch(datasets):
    """The co-batch rate of two epochs is about (batch - 1) / (pile - 1) at mix=1, and mix=2 cuts it over 2.5x.

    Fixed seed, so deterministic. Over seeds 0-19 the mix=1 rate was 0.974-0.998
    of the prediction (sd 0.006), and mix=2 over mix=1 was 0.25-0.38: the
    bounds below are more than 4 sd away. The biased variant, an epoch
    compared with itself (a loader that does not reshuffle), must fail.
    """
    predicted = (100 - 1) / (3000 - 1)  # 8 piles of 3,000 rows
    rates = {k: daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4, mix=k).co_batch_rate() for k in (1, 2)}
    assert abs(rates[1].rate / predicted - 1) < 0.06
    assert rates[2].rate < rates[1].rate / 2.5
    assert rates[2].rate > 0.9 * rates[2].ideal
    assert rates[1].ideal == pytest.approx(99 / (ROWS - 1))
    same = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=4).co_batch_rate(0, 0)
    assert same.rate == 1.0 and not abs(same.rate / predicted - 1) < 0.06


def test_the_torch_adapters_split_without_torch(datasets):
    """What daskpile.torch relies on: a loader per (rank, DataLoader worker), as ranks of a finer world."""
    from daskpile.loader.plan import worker_share

    seen, counts = collections.Counter(), set()
    for rank in range(2):
        for worker in range(3):
            finer_rank, finer_world = worker_share(rank, 2, worker, 3)
            loader = daskpile.PileLoader(datasets["lazy"], batch_size=500, seed=1, rank=finer_rank,
                                         world_size=finer_world, columns=["id"])  # fmt: skip
            batches = ids(loader)
            counts.add(len(batches))
            seen.update(np.concatenate(batches).tolist())
    assert len(counts) == 1 and set(seen) == set(range(ROWS)) and sum(seen.values()) == ROWS


def test_the_epochs_command_reports_the_loaders_rates(datasets):
    args = ("epochs", datasets["eager"], "--batch-size", "100", "--mix", "1", "--mix", "2", "--json")
    result = daskpile_in_process(*args)
    assert result.returncode == 0, result.stderr
    rates = json.loads(result.stdout)
    for k in (1, 2):
        expected = daskpile.PileLoader(datasets["eager"], batch_size=100, seed=0, mix=k).co_batch_rate()
        assert rates[str(k)] == {"rate": expected.rate, "ideal": expected.ideal, "pairs": expected.pairs}


def test_set_epoch_after_a_resume_keeps_its_position(datasets):
    """The guide's loop calls set_epoch(e) before each epoch; after load_state_dict it must not replay the epoch."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=None)
    iterator = iter(loader)
    seen = [next(iterator)["id"].to_numpy() for _ in range(10)]
    state = loader.state_dict()
    resumed = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=None)
    len(resumed)  # a plan of its own seed, made before the state's seed arrives
    resumed.load_state_dict(state)
    resumed.set_epoch(0)
    rest = ids(resumed)
    assert len(rest) == 14 and sorted(np.concatenate(seen + rest).tolist()) == list(range(ROWS))
    resumed.set_epoch(0)  # another epoch than the loader's (now 1): from its start
    assert len(resumed) == 24


def test_drop_last_with_ranks_shorter_than_a_batch_is_refused(datasets):
    with pytest.raises(ValueError, match="fewer than batch_size=5,000 rows"):
        daskpile.PileLoader(datasets["eager"], batch_size=5000, seed=1, world_size=6, drop_last=True)


def test_lazy_piles_named_without_their_manifest_are_still_lazy(datasets):
    """Files of a lazy result given as a list: their footers say they are lazy, so parts of them are random parts."""
    import glob

    files = sorted(glob.glob(datasets["lazy"] + "/part-*.parquet"))
    loader = daskpile.PileLoader(files, batch_size=500, seed=1, world_size=12, rank=0)
    assert (
        loader.units.lazy and not daskpile.PileLoader(datasets["eager"] + "/*.parquet", batch_size=1, seed=1).units.lazy
    )


def test_one_iterator_at_a_time_a_replaced_one_stops_and_the_position_stays_true(datasets):
    """A loop left with break, then another loop: the new iterator goes on, the old one cannot count into it."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=3)
    first = iter(loader)
    seen = [next(first)["id"].to_numpy() for _ in range(3)]
    second = iter(loader)
    seen += [next(second)["id"].to_numpy() for _ in range(2)]
    with pytest.raises(RuntimeError, match="this iterator of the PileLoader was replaced"):
        next(first)
    assert loader.state_dict()["batches"] == 5
    seen += ids(second)
    assert len(seen) == 24 and sorted(np.concatenate(seen).tolist()) == list(range(ROWS))
    # the next iteration reads epoch 1; the state is epoch 0's end until then (a checkpoint after the loop)
    assert loader.epoch == 1 and (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (0, 24)
    third = iter(loader)
    next(third)
    loader.set_epoch(4)
    with pytest.raises(RuntimeError, match="replaced"):
        next(third)
    fourth = iter(loader)
    next(fourth)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(RuntimeError, match="replaced"):
        next(fourth)


def test_a_replaced_iterator_lets_go_of_its_piles_and_loads_no_more(datasets):
    """A loop left with break kept its iterator's piles in memory, and its thread went on loading ahead, until
    the old iterator was next asked (and refused): with two alive, Arrow held twice the piles.  Once replaced,
    it holds nothing, and the new one reads what it should."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=3, prefetch=2)
    gc.collect()  # (an earlier test's loaders, in cycles with their threads, freed meanwhile made held negative)
    before = pa.total_allocated_bytes()  # (what the test's other datasets hold)
    first = iter(loader)
    next(first)
    time.sleep(0.3)  # (its thread loads ahead)
    loads, held = loader._loads, pa.total_allocated_bytes() - before
    assert loads._held and loads._budget.held_rows > 0 and held > 0
    second = iter(loader)
    events = [loads._events.get_nowait()[0] for _ in range(loads._events.qsize())]
    assert not loads._held and loads._budget.closed and events == ["stopped"]
    # Less than the first held: its current group and two ahead. The new iterator may have loaded up to two groups
    # already (prefetch=2), whose bytes a bound of a quarter counted against the first: it failed run alone
    assert pa.total_allocated_bytes() - before < 0.9 * held, (pa.total_allocated_bytes() - before, held)
    seen = ids(second)
    with pytest.raises(RuntimeError, match="this iterator of the PileLoader was replaced"):
        next(first)
    assert len(seen) == 23 and len(np.unique(np.concatenate(seen))) == ROWS - 1000


def test_a_loop_left_with_break_holds_nothing_of_what_it_loaded(datasets):
    """The loop's iterator, dropped, lets go of its piles and of the loads queued ahead (the reviewer: 4.2 MB
    held after a break, once the loader kept what its iterator loaded)."""
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=3, prefetch=2)
    gc.collect()  # (an earlier test's garbage is not this loop's to free)
    before = pa.total_allocated_bytes()
    for batch in loader:  # noqa: B007 (held after the loop, as a caller holds it)
        time.sleep(0.3)  # (its thread loads ahead)
        assert pa.total_allocated_bytes() > before
        break
    del batch  # (the caller's own: the rows of its part)
    assert loader._loads is None
    # A load under way when the loop ended is let go when it returns (the test failed when run alone)
    deadline = time.monotonic() + 10
    while pa.total_allocated_bytes() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pa.total_allocated_bytes() <= before


@pytest.mark.slow
def test_an_iterator_replaced_while_another_thread_reads_it_says_so(datasets, monkeypatch):
    """Replaced from another thread while it waited for a load, a reader hung (its loads' queue emptied) or
    got a bare CancelledError; it says it was replaced, and the new iterator reads the rest of the epoch."""
    import threading

    monkeypatch.setattr(SlowFileSystem, "delay", 0.05)
    for _ in range(5):
        loader = daskpile.PileLoader("slowfile://" + datasets["eager"], batch_size=100, seed=1, prefetch=1)
        first, outcome, seen = iter(loader), [], []

        def read(first=first, outcome=outcome, seen=seen):
            try:
                for batch in first:
                    seen.append(batch.num_rows)
                outcome.append("ended")
            except BaseException as e:
                outcome.append(f"{type(e).__name__}: {e}")

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.2)
        second = iter(loader)
        reader.join(10)
        assert not reader.is_alive() and outcome[0].startswith("RuntimeError: this iterator of the PileLoader was")
        assert sum(seen) + sum(batch.num_rows for batch in second) == ROWS  # (it goes on from the position)


def test_co_batch_rate_draws_each_group_s_permutation_once_whatever_the_streams(datasets, monkeypatch):
    """With more canonical ranks than ranks, a rank's streams take turns; one group was held for all of them,
    so each group's permutation was drawn again at every turn: 25 to 52 s on 3 M rows, against 0.6 s."""
    from daskpile.loader import pile_loader

    drawn = []
    real = pile_loader.group_row_ids

    def counted(units, group, seed, epoch):
        drawn.append((epoch, group.stream, group.index))
        return real(units, group, seed, epoch)

    monkeypatch.setattr(pile_loader, "group_row_ids", counted)
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=3, world_size=2, canonical_ranks=8)
    assert loader.co_batch_rate().pairs > 0
    groups = sum(len(stream) for stream in loader._plan(0).groups) + sum(len(s) for s in loader._plan(1).groups)
    assert len(drawn) == len(set(drawn)) == groups


@pytest.mark.parametrize("piles", [1, 3])
@pytest.mark.parametrize("given", ["folder", "list"])
def test_a_result_written_with_partition_on_keeps_its_keys_and_mixes_them_in_every_batch(tmp_path, piles, given):
    """``to_parquet(partition_on=["day"])`` writes pile k as ``day=*/part.k.parquet``: one pile, several files."""
    import dask.dataframe as dd
    import pandas as pd

    frame = pd.DataFrame({"id": np.arange(2000), "day": np.repeat(["mon", "tue", "wed", "thu"], 500)})
    with dask.config.set(scheduler="sync"):
        shuffled = daskpile.shuffle(dd.from_pandas(frame, npartitions=4), piles=piles, seed=1)
        shuffled.to_parquet(str(tmp_path / "by-day"), partition_on=["day"])
    path = str(tmp_path / "by-day") if given == "folder" else sorted(map(str, tmp_path.glob("by-day/*/*.parquet")))
    loader = daskpile.PileLoader(path, batch_size=100, seed=0)
    assert len(loader.units.paths) == piles and all(len(files) == 4 for files in loader.units.paths)
    batches = list(loader)
    ids = np.concatenate([b["id"].to_numpy() for b in batches])
    days = np.concatenate([b["day"].to_numpy(zero_copy_only=False) for b in batches])
    assert sorted(ids.tolist()) == list(range(2000))
    assert (days == frame["day"].to_numpy()[ids]).all()  # every row with its own key
    # a pile's files read one after the other would give batches of one day (p under 1e-50 here)
    assert all(len(set(b["day"].to_pylist())) > 1 for b in batches)
    tuesdays = daskpile.PileLoader(path, batch_size=100, seed=0, filters=[("day", "=", "tue")])
    assert sorted(np.concatenate([b["id"].to_numpy() for b in tuesdays]).tolist()) == list(range(500, 1000))


def test_a_lakes_files_are_units_of_their_own_and_a_keyed_file_is_read_by_row_groups(tmp_path, monkeypatch):
    """Only Dask's part.N names make piles of several files: pyarrow's part-0 in every folder would make
    most of a lake one unit, read whole.  A file with keys is still read by the row groups a rank needs."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from daskpile.loader import reading

    year = np.concatenate([np.repeat(np.arange(2015, 2024), 1000), np.repeat(2024, 3000)])
    ds.write_dataset(
        pa.table({"x": np.arange(len(year)), "year": year}), tmp_path / "lake", format="parquet",
        partitioning=["year"], partitioning_flavor="hive", max_rows_per_file=2000, max_rows_per_group=500,
    )  # fmt: skip
    monkeypatch.setattr(reading, "_whole_unit", None)  # a call would fail: no unit is read whole
    loader = daskpile.PileLoader(str(tmp_path / "lake"), batch_size=100, seed=0, rank=1, world_size=4)
    assert [len(files) for files in loader.units.paths] == [1] * 11 and not loader.units.lazy
    batches = list(loader)
    assert sum(b.num_rows for b in batches) == 3000
    x, years = (np.concatenate([b[c].to_numpy() for b in batches]) for c in ("x", "year"))
    assert (years == year[x]).all()


def test_key_folders_count_below_the_path_given_and_a_files_own_column_wins(tmp_path):
    """As pyarrow.dataset reads a hive dataset: a result kept under ``year=2024/`` gets no year column."""
    import pyarrow as pa

    for folder, name in [("year=2024/shuffled/day=1", "part.0"), ("year=2024/shuffled/day=2", "part.0")]:
        (tmp_path / folder).mkdir(parents=True)
        pq.write_table(pa.table({"id": [len(name), 7], "year": [2023, 2023]}), tmp_path / folder / f"{name}.parquet")
    for path in [tmp_path / "year=2024" / "shuffled", tmp_path / "year=2024" / "shuffled" / "day=*" / "*.parquet"]:
        batch = next(iter(daskpile.PileLoader(str(path), batch_size=10, seed=0)))
        assert batch.schema.names == ["id", "year", "day"] and set(batch["year"].to_pylist()) == {2023}
        assert sorted(batch["day"].to_pylist()) == [1, 1, 2, 2]


def test_a_result_of_no_rows_has_no_pairs_to_co_batch(tmp_path):
    (tmp_path / "source").mkdir()
    pq.write_table(pa.table({"id": np.arange(0)}), tmp_path / "source" / "a.parquet")
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(str(tmp_path / "source"), str(tmp_path / "piles"), piles=4, seed=0)
    loader = daskpile.PileLoader(str(tmp_path / "piles"), batch_size=4, seed=0)
    assert list(loader) == [] and loader.co_batch_rate() == CoBatch(0.0, 0.0, 0)
    command = [sys.executable, "-m", "daskpile", "epochs", str(tmp_path / "piles"), "--json"]
    said = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    assert said and all((rate["rate"], rate["ideal"], rate["pairs"]) == (0, 0, 0) for rate in said.values())


@pytest.mark.parametrize("kind", ["eager", "lazy"])
def test_the_batches_are_the_same_whatever_the_threads_that_load_them(datasets, kind):
    """A group's columns are taken one task a column where they are more than twice the threads, a task a
    part where they are fewer: both give the same batches, with mix 1 and with groups of several files."""
    for mix in (1, 3):
        loads = {
            threads: list(daskpile.PileLoader(datasets[kind], batch_size=700, seed=2, mix=mix, threads=threads))
            for threads in (1, 2, 16)  # the sorted source's 7 columns: a task each on 1 and 2 threads, not 16
        }
        assert 4 < len(loads[1][0].column_names) < 32
        for threads in (2, 16):
            assert len(loads[threads]) == len(loads[1])
            assert all(a.equals(b) for a, b in zip(loads[1], loads[threads], strict=True)), (kind, mix, threads)


def test_piles_of_view_columns_are_read_as_their_large_forms(tmp_path):
    """Piles written by Polars or DataFusion may hold string_view, binary_view and list_view columns, nested too,
    which Arrow's take and filter do not select from (pyarrow 26: "no kernel matching input types
    (string_view, int64)"); and a batch sliced from views would hold its whole pile's strings."""
    for i in range(2):
        ids = range(i * 500, (i + 1) * 500)
        pq.write_table(pa.table({
            "id": ids,
            "s": pa.array([None if j % 7 == 0 else f"{j}" * (j % 5) for j in ids], pa.string_view()),
            "b": pa.array([f"{j}".encode() * 4 for j in ids], pa.binary_view()),
            "nested": pa.array([{"t": [f"{j}"]} for j in ids], pa.struct([("t", pa.list_(pa.string_view()))])),
        }), tmp_path / f"part-{i}.parquet")  # fmt: skip
    for filters, wanted in [(None, range(1000)), ([("id", ">=", 990)], range(990, 1000))]:
        batches = list(daskpile.PileLoader(str(tmp_path), batch_size=64, seed=1, filters=filters))
        assert batches[0].schema.field("s").type == pa.large_string()
        assert batches[0].schema.field("nested").type == pa.struct([("t", pa.list_(pa.large_string()))])
        rows = pa.concat_tables(batches).to_pylist()
        assert sorted(r["id"] for r in rows) == list(wanted)
        assert all(r["s"] == (None if r["id"] % 7 == 0 else f"{r['id']}" * (r["id"] % 5)) for r in rows)
        assert all(r["b"] == f"{r['id']}".encode() * 4 and r["nested"] == {"t": [f"{r['id']}"]} for r in rows)


def test_a_ctrl_c_while_the_load_thread_starts_lets_go_of_it(datasets, monkeypatch):
    """A KeyboardInterrupt landing in the load thread's start left the thread waiting for room for ever, its
    piles held for the life of the process (a new user's trial: 21 threads after 60 Ctrl-C's in a notebook);
    the thread now ends, as after a break."""
    started, loading = threading.Thread.start, []

    def start_then_interrupted(thread):
        started(thread)
        if thread.name == "daskpile-load":
            loading.append(thread)
            time.sleep(0.3)  # (it loads ahead until its budget is full)
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupted)
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=3, prefetch=1)
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    loading[0].join(timeout=10)
    assert not loading[0].is_alive()


# Ctrl-C at seeded random moments of 2 epochs, each followed by a new loop, until the epochs are read: what the
# loader raised each time, the batches each epoch gave (None for one the loader counted as read, but the Ctrl-C
# took before the loop's body kept it), and those of the same epochs read without a Ctrl-C
_CTRL_C_AT_RANDOM = """
import collections, faulthandler, json, random, signal, sys
import daskpile

faulthandler.dump_traceback_later(240, exit=True)  # (a hang: where every thread was, then exit status 1)
options = dict(batch_size=20, seed=0, mix=2, output="pandas")
MOST = 8  # epochs
signal.signal(signal.SIGALRM, lambda *_: signal.raise_signal(signal.SIGINT))
loader = daskpile.PileLoader(sys.argv[1], **options)
moments, raised, read = random.Random(int(sys.argv[2])), collections.Counter(), [[] for _ in range(MOST)]
stalled = 0  # loops in a row that read nothing (on a slow machine the first batch comes after 50 ms)
# Two epochs, and more (up to MOST) until 20 Ctrl-Cs have landed: on a fast machine two epochs took 16
while loader.epoch < 2 or (sum(raised.values()) < 20 and loader.epoch < MOST):
    epoch, before = loader.epoch, len(read[loader.epoch])
    # Half while the loop starts, the consumer waiting for its first group (where a wait on a Condition of
    # Python's hung), half later, so that loops go on
    later = moments.uniform(0.01, 0.05 * 2 ** min(max(stalled - 20, 0), 6))
    signal.setitimer(signal.ITIMER_REAL, moments.choice([moments.uniform(0.0005, 0.01), later]))
    try:
        for batch in loader:
            read[epoch].append(batch["id"].tolist())
    except BaseException as error:
        signal.setitimer(signal.ITIMER_REAL, 0)
        raised[type(error).__name__] += 1
        if loader.epoch == epoch and loader.state_dict()["batches"] == len(read[epoch]) + 1:
            read[epoch].append(None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    stalled = stalled + 1 if loader.epoch == epoch and len(read[epoch]) == before else 0
reference = daskpile.PileLoader(sys.argv[1], **options)
expected = [[batch["id"].tolist() for batch in reference] for _ in range(loader.epoch)]
print(json.dumps({"raised": raised, "read": read[: loader.epoch], "expected": expected}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_ctrl_c_at_any_moment_raises_keyboardinterrupt_and_the_next_loop_goes_on(datasets, seed):
    """A Ctrl-C in the consumer's thread waiting on a future or a queue of Python's (``Condition.wait``) could
    leave its lock held: the process hung for ever (two trials in three), or the interrupt came out as
    "RuntimeError: cannot release un-acquired lock"; one landing in the first batch's import of pandas broke
    every batch after (a new user's trial).  Now each raises KeyboardInterrupt, and the loops after it read
    each epoch's batches in order, none twice, none left out, but those the Ctrl-C took from the consumer's
    hands (counted as read, not yet kept by the loop's body): at most one a Ctrl-C."""
    done = run_in_fresh_process(_CTRL_C_AT_RANDOM, datasets["eager"], str(seed))
    interrupts = done["raised"].get("KeyboardInterrupt", 0)
    assert set(done["raised"]) == {"KeyboardInterrupt"} and interrupts >= 20, done["raised"]
    taken = 0
    for read, expected in zip(done["read"], done["expected"], strict=True):
        assert sorted(row for batch in expected for row in batch) == list(range(ROWS))
        assert len(read) == len(expected)
        assert all(batch == wanted for batch, wanted in zip(read, expected, strict=True) if batch is not None)
        taken += read.count(None)
    assert taken <= interrupts


def test_a_ctrl_c_landing_in_a_loops_stop_still_lets_go_of_its_load_thread(datasets, monkeypatch):
    """Ctrl-C pressed twice: a KeyboardInterrupt landing in ``Prefetcher.stop``, as the loop stops for the
    first, cut the stop short, and its load thread waited for room for ever, holding its piles.  The stop now
    goes to its end, then raises the KeyboardInterrupt."""
    from daskpile.loader import reading

    def once(original):
        done = []

        def interrupted_once(self, *args):
            if not done:
                done.append(True)
                raise KeyboardInterrupt
            return original(self, *args)

        return interrupted_once

    # The first Ctrl-C while the consumer waits for its first group, the second as the loop then stops
    monkeypatch.setattr(reading.GroupLoad, "parts", once(reading.GroupLoad.parts))
    monkeypatch.setattr(reading.Budget, "close", once(reading.Budget.close))
    loader = daskpile.PileLoader(datasets["eager"], batch_size=1000, seed=3, prefetch=1)
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    loading = [thread for thread in threading.enumerate() if thread.name == "daskpile-load"]
    for thread in loading:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in loading)


def test_a_file_of_a_dataset_without_manifest_removed_mid_epoch_says_the_dataset_changed(datasets, tmp_path):
    """A shuffle(ddf).to_parquet folder written again with fewer files under a loader mid-epoch: a bare
    "No such file or directory", where a result with a manifest says what happened and what to do (a trial)."""
    copy = tmp_path / "ddf"
    shutil.copytree(datasets["ddf"], copy)
    loader = daskpile.PileLoader(str(copy), batch_size=100, seed=1, prefetch=0)
    batches = iter(loader)
    next(batches)
    for part in sorted(copy.glob("part.*.parquet"))[1:]:
        part.unlink()
    with pytest.raises(FileNotFoundError, match=r"the dataset changed since this loader was made .*make the loader"):
        list(batches)


def test_the_piles_of_an_unfinished_run_are_refused_however_named(datasets, tmp_path):
    """A trial: a glob over a run stopped in pass 2 (its folder holds its state, no manifest) was read as a dataset
    of 701,307 of 4,000,000 rows, nothing said, and ``quality`` called it uniform; the folder itself was refused.
    A glob, a list of its files and a folder above are refused too, by the loader, ``quality`` and ``verify``."""
    from daskpile.engine import _run as run_state

    dest = tmp_path / "runs" / "out"
    shutil.copytree(datasets["eager"], dest)
    (dest / "_daskpile.json").unlink()
    for stopped in sorted(dest.glob("part-*.parquet"))[3:]:  # pass 2 wrote 3 of the 8 piles
        stopped.unlink()
    run_state.write(LocalFileSystem(), str(dest), run_state.RunSpec((), (), 8, 11, str(dest), 2**20))
    said = r"holds an unfinished daskpile run \(seed 11, 8 piles\), and the files named are some of its piles: read"
    for named in (f"{dest}/*.parquet", sorted(map(str, dest.glob("*.parquet"))), str(tmp_path / "runs")):
        for reading in (
            lambda named=named: daskpile.PileLoader(named, batch_size=100, seed=0),
            lambda named=named: daskpile.quality(named, order_column="id"),
            lambda named=named: daskpile.verify(datasets["source"], named),
        ):
            with pytest.raises(ValueError, match=said):
                reading()
    (dest / "_daskpile.run.json").unlink()  # (the files of no run are read as they are, below)
    with pytest.warns(UserWarning, match=r"the files named hold 3 of the 8 piles of the shuffle \(seed 11\)"):
        loader = daskpile.PileLoader(f"{dest}/*.parquet", batch_size=100, seed=0)
    assert sum(batch.num_rows for batch in loader) < ROWS


def test_a_to_parquet_result_missing_a_pile_is_read_with_a_warning(tmp_path):
    """A trial deleted one file of a ``shuffle(ddf).to_parquet`` result (or named 7 of its 16 by a glob): the
    loader read fewer rows every epoch without a word, where a ``shuffle_parquet`` result's glob was warned of."""
    written = str(tmp_path / "ddf")
    frame = dd.from_pandas(pd.DataFrame({"id": range(400)}), npartitions=2)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(frame, piles=8, seed=3).to_parquet(written)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (every pile there: nothing said)
        daskpile.PileLoader(written, batch_size=10, seed=0)
    os.remove(os.path.join(written, "part.5.parquet"))
    with pytest.warns(UserWarning, match=r"the files named hold 7 of the 8 piles of the shuffle \(seed 3\)"):
        loader = daskpile.PileLoader(written, batch_size=10, seed=0)
    assert 0 < sum(batch.num_rows for batch in loader) < 400
    with pytest.warns(UserWarning, match=r"hold 3 of the 8 piles"):
        daskpile.PileLoader(f"{written}/part.[1-3].parquet", batch_size=10, seed=0)


def test_a_glob_of_every_pile_of_a_result_is_read_without_a_word(datasets, tmp_path):
    """The warning of piles missing from a glob is not said where every pile is there, nor of a to_parquet with
    partition_on, which writes no file for an empty pile (a reviewer's: "2 of the 8 piles ... missing")."""
    keyed = str(tmp_path / "keyed")
    frame = dd.from_pandas(pd.DataFrame({"id": range(3), "k": "a"}), npartitions=1)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle(frame, piles=8, seed=3).to_parquet(keyed, partition_on=["k"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = daskpile.PileLoader(f"{datasets['eager']}/*.parquet", batch_size=100, seed=0, columns=["id"])
        assert sum(batch.num_rows for batch in daskpile.PileLoader(keyed, batch_size=1, seed=0)) == 3
    assert sorted(np.concatenate(ids(loader)).tolist()) == list(range(ROWS))
