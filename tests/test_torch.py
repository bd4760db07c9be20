"""daskpile.torch.PileDataset under a real torch DataLoader (runs where torch is installed: make test-torch)."""

import collections

import dask
import numpy as np
import pytest

import daskpile
from tests._util import sorted_source

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


def test_persistent_workers_go_on_to_the_next_epoch(piles):
    data = PileDataset(piles, batch_size=500, seed=1, columns=["id"])
    loader = DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True)
    first, second = ([b["id"] for b in loader] for _ in range(2))
    first, second = torch.cat(list(first)), torch.cat(list(second))
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(ROWS))
    assert not torch.equal(first, second)


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


def test_workers_that_do_not_divide_canonical_ranks_are_named_as_workers(piles):
    data = PileDataset(piles, batch_size=500, seed=1, canonical_ranks=4)
    with pytest.raises(ValueError, match="3 DataLoader workers on each of 1 ranks make 3 readers, which do not divide"):
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
    expected = torch.cat(
        [
            b["id"]
            for b in DataLoader(PileDataset(piles, batch_size=1000, seed=3, columns=["id"], epoch=1), batch_size=None)
        ]
    ).tolist()
    assert sorted(epoch_1) == list(range(ROWS)) and (workers or epoch_1 == expected)


def test_workers_forked_after_the_main_process_read_take_their_own_share(piles):
    """A worker inherits the main process's loader when it had one: it must make its own, not read everything."""
    data = PileDataset(piles, batch_size=500, seed=3, columns=["id"])
    data.state_dict()  # makes the main process's loader
    seen = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=2, timeout=60)]).tolist()
    assert sorted(seen) == list(range(ROWS))
    again = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=0)]).tolist()
    more = torch.cat([b["id"] for b in DataLoader(data, batch_size=None, num_workers=2, timeout=60)]).tolist()
    assert sorted(again) == sorted(more) == list(range(ROWS))
