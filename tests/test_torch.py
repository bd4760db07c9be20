"""daskpile.torch.PileDataset under a real torch DataLoader (runs where torch is installed: make test-torch)."""

import collections
import datetime
import warnings

import dask
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import daskpile
from daskpile.datasets import reference_table
from tests._util import sorted_source, write_parts

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from daskpile.torch import PileDataset  # noqa: E402

ROWS = 12_000


@pytest.fixture(scope="module")
def piles(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    source = sorted_source(root / "source", ROWS, files=3)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(source, str(root / "piles"), piles=6, seed=1, second_pass="lazy")
    return str(root / "piles")


@pytest.mark.parametrize("workers", [0, 2])
def test_every_row_once_over_ranks_and_workers(piles, workers):
    counts, seen = [], collections.Counter()
    for rank in range(2):
        data = PileDataset(piles, batch_size=500, seed=3, rank=rank, world_size=2, columns=["id", "label"])
        data.set_epoch(1)
        batches = list(DataLoader(data, batch_size=None, num_workers=workers))
        assert all(isinstance(b["id"], torch.Tensor) and b["id"].dtype == torch.int64 for b in batches)
        counts.append(len(batches))
        seen.update(torch.cat([b["id"] for b in batches]).tolist())
    assert counts[0] == counts[1]
    assert set(seen) == set(range(ROWS)) and sum(seen.values()) == ROWS


def test_resume_without_workers(piles):
    data = PileDataset(piles, batch_size=700, seed=3, columns=["id"])
    whole = [b["id"].numpy() for b in DataLoader(data, batch_size=None)]
    data = PileDataset(piles, batch_size=700, seed=3, columns=["id"])
    iterator = iter(DataLoader(data, batch_size=None))
    seen = [next(iterator)["id"].numpy() for _ in range(5)]
    state = data.state_dict()
    resumed = PileDataset(piles, batch_size=700, seed=3, columns=["id"])
    resumed.load_state_dict(state)
    rest = [b["id"].numpy() for b in DataLoader(resumed, batch_size=None)]
    assert np.array_equal(np.concatenate(seen + rest), np.concatenate(whole))


def test_a_drawn_seed_is_shared_by_the_workers(piles):
    data = PileDataset(piles, batch_size=500, seed=None, columns=["id"])
    seen = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=2)]).tolist()
    assert sorted(seen) == list(range(ROWS))


WORKER_SETTINGS = [
    pytest.param({"num_workers": 0}, id="no-workers"),
    pytest.param({"num_workers": 2}, id="workers"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="persistent-workers"),
]


@pytest.mark.parametrize("settings", WORKER_SETTINGS)
def test_set_epoch_reaches_every_worker_and_each_epoch_is_read_once_from_its_start(piles, settings):
    """The epoch lives in shared memory: persistent workers, made before set_epoch(1), read epoch 1 too."""
    data = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    loader = DataLoader(data, batch_size=None, timeout=60 if settings["num_workers"] else 0, **settings)
    epochs = []
    for epoch in range(2):
        data.set_epoch(epoch)
        epochs.append(torch.cat([b["id"] for b in loader]))
    alone = PileDataset(piles, batch_size=500, seed=1, columns=["id"], epoch=1)
    expected = torch.cat([b["id"] for b in DataLoader(alone, batch_size=None, **settings)])
    assert sorted(epochs[0].tolist()) == sorted(epochs[1].tolist()) == list(range(ROWS))
    assert not torch.equal(epochs[0], epochs[1]) and torch.equal(epochs[1], expected)


@pytest.mark.parametrize("settings", WORKER_SETTINGS)
def test_a_loop_left_early_and_begun_again_reads_the_epoch_from_its_start(piles, settings):
    """Whatever the workers: no row the workers had read ahead is lost, and the order is the epoch's."""
    data = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    loader = DataLoader(data, batch_size=None, timeout=60 if settings["num_workers"] else 0, **settings)
    data.set_epoch(3)
    for i, _ in enumerate(loader):
        if i == 4:
            break
    again = torch.cat([b["id"] for b in loader])
    whole = torch.cat([b["id"] for b in DataLoader(PileDataset(piles, batch_size=500, seed=1, columns=["id"], epoch=3),
                                                   batch_size=None, **settings)])  # fmt: skip
    assert torch.equal(again, whole) and sorted(again.tolist()) == list(range(ROWS))


@pytest.mark.parametrize("settings", WORKER_SETTINGS)
def test_an_epoch_read_again_without_set_epoch_is_the_same_order(piles, settings):
    data = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    loader = DataLoader(data, batch_size=None, timeout=60 if settings["num_workers"] else 0, **settings)
    first = torch.cat([b["id"] for b in loader])
    assert torch.equal(torch.cat([b["id"] for b in loader]), first)


def test_without_workers_an_epoch_read_whole_and_begun_again_without_set_epoch_is_warned_of(piles):
    data = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    for i, _ in enumerate(DataLoader(data, batch_size=None)):
        if i == 3:
            break
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # left early: begun again without a warning
        list(DataLoader(data, batch_size=None))
    with pytest.warns(UserWarning, match="PileDataset reads epoch 0 again, in the order it was read in before"):
        list(DataLoader(data, batch_size=None))
    data.set_epoch(0)  # asked for: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(DataLoader(data, batch_size=None))


def test_a_state_loaded_after_epochs_read_is_resumed_in_the_same_process(piles):
    """A rollback to a checkpoint of an earlier epoch: set_epoch was called before, not since it was loaded."""
    data = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    for epoch in range(3):
        data.set_epoch(epoch)
        for i, _ in enumerate(DataLoader(data, batch_size=None)):
            if epoch == 1 and i == 4:
                state = data.state_dict()
    data.load_state_dict(state)
    rest = torch.cat([b["id"] for b in DataLoader(data, batch_size=None)])
    again = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    again.load_state_dict(state)
    assert torch.equal(rest, torch.cat([b["id"] for b in DataLoader(again, batch_size=None)]))
    assert data.epoch == 1 and len(rest) == ROWS - 5 * 500


@pytest.mark.parametrize("call_set_epoch", [True, False])
def test_persistent_workers_checkpointed_at_their_first_batch_resume_the_epoch_they_are_in(piles, call_set_epoch):
    """torchdata asks each worker's state right after iter(), before the worker's first batch: it must be of
    the epoch begun, not the end of the one before (a worker's whole share was lost)."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        data = PileDataset(piles, batch_size=500, seed=3, columns=["id"])
        return data, stateful.StatefulDataLoader(
            data, batch_size=None, num_workers=2, persistent_workers=True, timeout=60
        )

    data, loader = make()
    data.set_epoch(0)
    list(loader)
    data.set_epoch(1)
    iterator = iter(loader)
    seen = [next(iterator)["id"]]
    state = loader.state_dict()
    del iterator
    data, loader = make()
    loader.load_state_dict(state)
    if call_set_epoch:
        data.set_epoch(1)
    epoch_1 = torch.cat(seen + [b["id"] for b in loader]).tolist()
    assert sorted(epoch_1) == list(range(ROWS))


def test_a_window_moved_by_set_epoch_is_read_at_its_new_version_by_persistent_workers(tmp_path):
    window = str(tmp_path / "window")
    write_parts(reference_table(0, 3_000, 6_000), tmp_path / "day-0", parts=1)
    write_parts(reference_table(3_000, 6_000, 6_000), tmp_path / "day-1", parts=1)
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(str(tmp_path / "day-0"), window, piles=4, seed=1)
        data = PileDataset(window, batch_size=250, seed=0, columns=["id"])
        loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True, timeout=60)
        data.set_epoch(0)
        assert len(torch.cat([b["id"] for b in loader])) == 3_000
        daskpile.append(window, str(tmp_path / "day-1"))
    data.set_epoch(1, version=daskpile.PileLoader.current_version(window))
    assert sorted(torch.cat([b["id"] for b in loader]).tolist()) == list(range(6_000))


def test_timestamps_and_durations_are_int64_tensors_of_their_unit(tmp_path):
    table = pa.table({
        "id": pa.array(range(10), pa.int64()),
        "ts": pa.array([datetime.datetime(2026, 1, 1, 0, 0, i) for i in range(9)] + [None], pa.timestamp("us")),
        "took": pa.array([datetime.timedelta(seconds=i) for i in range(10)], pa.duration("ms")),
        "name": pa.array([f"row-{i}" for i in range(10)]),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "part-0.parquet")
    data = PileDataset(str(tmp_path), batch_size=10, seed=0)
    for settings in ({"num_workers": 0}, {"num_workers": 1, "timeout": 60}):
        (batch,) = DataLoader(data, batch_size=None, **settings)
        order = batch["id"].numpy()
        ts = table.column("ts").to_numpy().view(np.int64)[order]
        assert batch["ts"].dtype == torch.int64 and batch["ts"].numpy().tolist() == ts.tolist()
        assert batch["ts"].numpy()[order == 9].tolist() == [np.iinfo(np.int64).min]  # NaT
        assert batch["took"].numpy().tolist() == (order * 1000).tolist()
        assert batch["name"].tolist() == [f"row-{i}" for i in order]


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_batches_per_epoch_is_what_a_dataloader_of_that_many_workers_yields(piles, workers):
    data = PileDataset(piles, batch_size=700, seed=1, columns=["id"], world_size=2, rank=1)
    yielded = list(DataLoader(data, batch_size=None, num_workers=workers, timeout=60 if workers else 0))
    assert data.batches_per_epoch(num_workers=workers) == len(yielded)


def test_resume_with_workers_under_a_stateful_dataloader(piles):
    """torchdata's StatefulDataLoader saves each worker's loader state and gives it back: exactly the rest."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        data = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
        return stateful.StatefulDataLoader(data, batch_size=None, num_workers=2)

    whole = [b["id"].tolist() for b in make()]
    loader = make()
    iterator = iter(loader)
    seen = [next(iterator)["id"].tolist() for _ in range(7)]
    state = loader.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b["id"].tolist() for b in resumed]
    assert seen + rest == whole
    # another num_workers: said as that (it was said as another canonical_ranks, "a job resized")
    fewer = stateful.StatefulDataLoader(PileDataset(piles, batch_size=300, seed=3, columns=["id"]), batch_size=None,
                                        num_workers=1)  # fmt: skip
    fewer.load_state_dict(state)
    with pytest.raises(ValueError, match=r"state was taken with 2 DataLoader workers on each rank .* this DataLoader"):
        list(fewer)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_resumed_on_another_world_size_without_canonical_ranks_says_the_world_size_changed(piles, workers):
    """Restarted on 1 rank from a state of 2: it was said as another num_workers, which the user had not changed."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make(rank, world_size):
        data = PileDataset(piles, batch_size=300, seed=3, columns=["id"], rank=rank, world_size=world_size)
        return stateful.StatefulDataLoader(data, batch_size=None, num_workers=workers)

    loader = make(0, 2)
    iterator = iter(loader)
    next(iterator), next(iterator)
    state = loader.state_dict()
    del iterator
    resumed = make(0, 1)
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"state was taken on 2 ranks \(world_size=2\), and this job has 1: .*"
                                         r"canonical_ranks"):  # fmt: skip
        list(resumed)


def test_workers_that_do_not_divide_canonical_ranks_are_named_as_workers(piles):
    data = PileDataset(piles, batch_size=500, seed=1, canonical_ranks=4)
    with pytest.raises(ValueError, match="1 rank of 3 DataLoader workers each make 3 readers, which do not divide"):
        data.loader(worker=0, workers=3)


def test_a_drawn_seed_is_refused_with_more_than_one_rank(piles):
    with pytest.raises(ValueError, match="same seed on every rank"):
        PileDataset(piles, batch_size=500, seed=None, rank=0, world_size=2)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_after_an_epoch_resumes_at_the_next_epoch_asked_for(piles, workers):
    """torchdata gives the dataset its state when the iterator is made: with no workers, after the loop's
    set_epoch(1), and the state (the end of epoch 0) put it back at epoch 0's end: epoch 1 yielded nothing."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        data = PileDataset(piles, batch_size=1000, seed=3, columns=["id"])
        return data, stateful.StatefulDataLoader(data, batch_size=None, num_workers=workers)

    data, loader = make()
    data.set_epoch(0)
    assert sorted(torch.cat([b["id"] for b in loader]).tolist()) == list(range(ROWS))
    checkpoint = {"next_epoch": 1, "loader": loader.state_dict()}
    data, loader = make()
    loader.load_state_dict(checkpoint["loader"])
    data.set_epoch(checkpoint["next_epoch"])
    epoch_1 = torch.cat([b["id"] for b in loader]).tolist()
    fresh = PileDataset(piles, batch_size=1000, seed=3, columns=["id"], epoch=1)  # epoch 1 as the same workers read it
    expected = torch.cat([b["id"] for b in DataLoader(fresh, batch_size=None, num_workers=workers)]).tolist()
    assert sorted(epoch_1) == list(range(ROWS)) and epoch_1 == expected


def test_workers_forked_after_the_main_process_read_take_their_own_share(piles):
    """A worker inherits the main process's loader when it had one: it must make its own, not read everything."""
    data = PileDataset(piles, batch_size=500, seed=3, columns=["id"])
    data.state_dict()  # makes the main process's loader
    seen = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=2, timeout=60)]).tolist()
    assert sorted(seen) == list(range(ROWS))
    again = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=0)]).tolist()
    more = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=2, timeout=60)]).tolist()
    assert sorted(again) == sorted(more) == list(range(ROWS))


def test_the_main_process_state_after_workers_read_is_refused_not_the_epoch_s_start(piles):
    """With a plain DataLoader of workers, the main process's loader never moved: its state would replay the epoch."""
    data = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    iterator = iter(DataLoader(data, batch_size=None, num_workers=2))
    for _ in range(5):
        next(iterator)
    with pytest.raises(RuntimeError, match="read by 2 DataLoader workers, whose positions this process cannot see"):
        data.state_dict()
    del iterator
    data.set_epoch(1)  # between epochs: the next iteration starts epoch 1, which this process knows
    assert (data.state_dict()["epoch"], data.state_dict()["batches"]) == (1, 0)
    list(DataLoader(data, batch_size=None, num_workers=0))  # read in this process: its state is its own
    assert data.state_dict()["epoch"] == 1


def test_the_state_after_set_epoch_and_before_the_loop_is_that_epoch_s_start(piles):
    data = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    data.set_epoch(5)
    state = data.state_dict()
    assert (state["epoch"], state["batches"]) == (5, 0)
    resumed = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    resumed.load_state_dict(state)
    expected = PileDataset(piles, batch_size=300, seed=3, columns=["id"], epoch=5)
    assert [b["id"].tolist() for b in DataLoader(resumed, batch_size=None)] == [
        b["id"].tolist() for b in DataLoader(expected, batch_size=None)
    ]


def test_a_state_loaded_in_the_main_process_is_refused_by_workers(piles):
    data = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    iterator = iter(DataLoader(data, batch_size=None))
    next(iterator)
    state = data.state_dict()
    resumed = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    resumed.load_state_dict(state)
    with pytest.raises(ValueError, match="each DataLoader worker has its own: resume through torchdata"):
        list(DataLoader(resumed, batch_size=None, num_workers=2))
    # a state of an epoch's end, then set_epoch(next): not resumed, so not refused (the guide's checkpoint)
    ended = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    list(DataLoader(ended, batch_size=None))
    state = ended.state_dict()
    following = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    following.load_state_dict(state)
    following.set_epoch(1)
    ids = [i for b in DataLoader(following, batch_size=None, num_workers=2) for i in b["id"].tolist()]
    assert sorted(ids) == list(range(ROWS))


def test_an_epoch_s_start_loaded_in_the_main_process_is_every_worker_s(piles):
    """The guide's checkpoint between epochs with a plain DataLoader of workers (set_epoch(next), then
    state_dict()) was refused when loaded back, in every order of set_epoch and load_state_dict."""
    data = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    list(DataLoader(data, batch_size=None, num_workers=2))
    data.set_epoch(1)
    state = data.state_dict()
    expected = [b["id"].tolist() for b in DataLoader(data, batch_size=None, num_workers=2)]
    for order in ("load, then set_epoch", "set_epoch, then load", "load only"):
        resumed = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
        if order.startswith("set_epoch"):
            resumed.set_epoch(1)
        resumed.load_state_dict(state)
        if order.startswith("load,"):
            resumed.set_epoch(1)
        assert [b["id"].tolist() for b in DataLoader(resumed, batch_size=None, num_workers=2)] == expected, order
    other = PileDataset(piles, batch_size=300, seed=3, columns=["id"], filters=[("id", "<", 100)])
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="state belongs to another"):
        list(DataLoader(other, batch_size=None, num_workers=2))


def test_a_mid_epoch_state_passed_over_by_set_epoch_of_the_next_is_warned_of(piles):
    """set_epoch(e + 1) after loading a state of the middle of epoch e read epoch e + 1 from its start, the rest
    of epoch e never read, silently (set_epoch(e + 2) warned)."""
    data = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    iterator = iter(DataLoader(data, batch_size=None))
    for _ in range(3):
        next(iterator)
    state = data.state_dict()
    resumed = PileDataset(piles, batch_size=300, seed=3, columns=["id"])
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    with pytest.warns(UserWarning, match=r"a state in the middle of epoch 0 \(3 batches read\) is not resumed"):
        ids = [i for b in DataLoader(resumed, batch_size=None) for i in b["id"].tolist()]
    assert sorted(ids) == list(range(ROWS))


def test_a_dataset_left_at_one_rank_in_a_job_of_several_is_warned_of(piles, monkeypatch):
    """Under torchrun, rank= and world_size= forgotten: every rank read every row, silently."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(UserWarning, match=r"PileDataset\(world_size=1\) in a job of 2 ranks"):
        PileDataset(piles, batch_size=300, seed=3)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"columns": ["lable"]}, ValueError, "columns: 'lable' not in"),
        ({"colums": ["id"]}, TypeError, r"^PileDataset\(\) got an unexpected keyword argument 'colums'"),
        ({"output": "pandas"}, TypeError, "output= is not an option"),
        ({"batch_size": 0}, ValueError, "batch_size must be a positive integer, got 0"),
        ({"rank": 5, "world_size": 2}, ValueError, "rank 5 is not below world_size 2"),
        ({"path": "no-such-dir"}, FileNotFoundError, "no-such-dir"),
    ],
)
def test_a_wrong_argument_is_refused_when_the_dataset_is_made(piles, tmp_path, arguments, error, message):
    """Not by each worker at the first batch, after the model is set up (and with numbers of its own making)."""
    arguments = {"path": piles, "batch_size": 300, "seed": 3, **arguments}
    if arguments["path"] == "no-such-dir":
        arguments["path"] = str(tmp_path / "no-such-dir")
    with pytest.raises(error, match=message):
        PileDataset(arguments.pop("path"), **arguments)


def test_each_worker_reads_with_its_share_of_the_cores(piles, monkeypatch):
    """Not every core in every worker of every rank: 8 ranks of 8 workers on 64 cores would run 4,096 threads."""
    monkeypatch.setattr("daskpile.torch.available_cores", lambda: 64)
    monkeypatch.setattr("daskpile.torch.pinned", lambda: False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    data = PileDataset(piles, batch_size=300, seed=3)
    assert data.loader(0, 1)._threads == 64
    assert data.loader(1, 4)._threads == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert data.loader(0, 4)._threads == 2
    assert data.loader(0, 16)._threads == 1
    assert PileDataset(piles, batch_size=300, seed=3, threads=3).loader(0, 4)._threads == 3
    monkeypatch.setattr("daskpile.torch.pinned", lambda: True)  # a rank bound to cores of its own: all its own
    assert data.loader(0, 4)._threads == 16
