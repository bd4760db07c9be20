"""PyTorch: ``PileDataset``, the batches of a pile dataset as an ``IterableDataset`` (``daskpile[torch]``).

The core of daskpile never imports torch; this module does, and is imported
only by those who ask for it.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from daskpile._random import seed_for_ranks
from daskpile._storage import as_urls
from daskpile.loader import PileLoader
from daskpile.loader.plan import worker_share


class PileDataset(IterableDataset):
    """The batches of a pile dataset for a ``DataLoader``, each worker of each rank reading its own share.

    A ``PileLoader`` per DataLoader worker: worker ``w`` of ``W`` on rank
    ``r`` of ``R`` reads as rank ``r * W + w`` of ``R * W``, so every row is
    read once per epoch over all ranks and workers, and all of them yield the
    same number of batches.  Batches are dicts of column name to tensor
    (columns that are not numbers stay NumPy arrays); give the DataLoader
    ``batch_size=None``, since the batches are made here.

    Call ``set_epoch(e)`` before each epoch, as with ``DistributedSampler``
    (with ``persistent_workers=True``, whose workers never see it, each
    iteration goes on to the next epoch).  ``state_dict`` / ``load_state_dict`` resume mid-epoch with
    ``num_workers=0``, and in each worker under torchdata's
    ``StatefulDataLoader``.

    Parameters
    ----------
    path, batch_size, seed, columns, filters, mix, prefetch, drop_last, storage_options
        As for :class:`daskpile.PileLoader`.
    rank, world_size
        This process's rank (``torch.distributed.get_rank()``) and the world size.
    canonical_ranks
        Streams an epoch is cut into, over all ranks and workers.  Default:
        ``world_size`` times the DataLoader's workers.

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> from daskpile.torch import PileDataset
    >>> data = PileDataset("shuffled/", batch_size=1000, seed=0, columns=["id", "label"])
    >>> batches = list(DataLoader(data, batch_size=None, num_workers=2))
    >>> len(batches), batches[0]["id"].dtype
    (30, torch.int64)
    """

    def __init__(
        self,
        path: str | list[str],
        *,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        canonical_ranks: int | None = None,
        epoch: int = 0,
        **options,
    ):
        super().__init__()
        path = as_urls(path, "path")
        # One seed for every worker: drawn here when None, not in each worker
        self.options = dict(path=path, batch_size=batch_size, seed=seed_for_ranks(seed, world_size), **options)
        self._seed_given = seed is not None  # else a loaded state's seed replaces the one drawn, as in PileLoader
        if self.options.get("version") is None and isinstance(path, str):  # one version for every worker
            self.options["version"] = _current_version(path, options.get("storage_options"))
        self.rank, self.world_size, self.canonical_ranks = rank, world_size, canonical_ranks
        self.epoch = epoch
        self._epoch_given = True  # the next iteration starts self.epoch (else its loader goes on)
        self._epoch_set = False  # set_epoch was called since the last iteration began
        self._state: dict | None = None
        self._loader: PileLoader | None = None
        self._loader_of: tuple | None = None  # (process, DataLoader worker) that made it

    def set_epoch(self, epoch: int, version: int | None = None) -> None:
        """Read ``epoch`` at the next iteration (where a loaded state put it, if it is that state's epoch).

        With ``version``, a moving window at that version of its manifest (the
        same on every rank), as ``PileLoader.set_epoch`` says.
        """
        if version is not None:
            self.options["version"] = version
        if self._state is not None and self._state["epoch"] != epoch:
            self._state = None
        self.epoch, self._epoch_given, self._epoch_set = epoch, True, True

    def loader(self, worker: int = 0, workers: int = 1) -> PileLoader:
        """The ``PileLoader`` of DataLoader worker ``worker`` of ``workers``."""
        rank, world_size = worker_share(self.rank, self.world_size, worker, workers)
        if self.canonical_ranks and self.canonical_ranks % world_size:
            raise ValueError(
                f"{workers} DataLoader workers on each of {self.world_size} ranks make {world_size} readers, which "
                f"do not divide canonical_ranks {self.canonical_ranks}: change num_workers or canonical_ranks"
            )
        return PileLoader(
            **self.options, rank=rank, world_size=world_size, epoch=self.epoch, output="numpy",
            canonical_ranks=self.canonical_ranks or world_size,
        )  # fmt: skip

    def __iter__(self):
        for batch in self._process_loader():
            yield {name: _tensor(values) for name, values in batch.items()}

    def _process_loader(self) -> PileLoader:
        """The loader of this process (a DataLoader worker, or the main one), made or moved as asked."""
        # A persistent worker's copy of the dataset never sees set_epoch: its loader goes on to the next epoch.
        info = get_worker_info()
        # A worker forked from a process that had made its loader inherits that loader: not its own share
        here = (os.getpid(), None if info is None else info.id)
        if self._loader is None or self._epoch_given or self._state is not None or self._loader_of != here:
            self._loader = self.loader(*((0, 1) if info is None else (info.id, info.num_workers)))
            self._loader_of = here
        if self._state is not None:
            self._loader.load_state_dict(self._state)
            self._state = None
        self._epoch_given = self._epoch_set = False
        return self._loader

    def state_dict(self) -> dict:
        """Where this process's loader is; see ``PileLoader.state_dict``.

        With ``num_workers > 0`` the loaders live in the workers: torchdata's
        ``StatefulDataLoader`` asks each of them.
        """
        return self._process_loader().state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state`` at the next iteration, unless ``set_epoch`` asked for another epoch since the last.

        Whichever comes first: torchdata's ``StatefulDataLoader`` calls this
        when its iterator is made, after the loop's ``set_epoch``, with no
        workers, and before it in each worker.  A state of another epoch (the
        end of the one before, saved after its loop) then leaves the epoch
        asked for to start from its beginning.
        """
        if self._epoch_set and state["epoch"] != self.epoch:
            if self.epoch != state["epoch"] + 1:  # (the epoch after a state saved at its end: the usual loop)
                warnings.warn(
                    f"PileDataset: a state of epoch {state['epoch']} is not resumed, since set_epoch({self.epoch}) "
                    "asked for another",
                    stacklevel=2,
                )
            return
        if not self._seed_given:
            self.options["seed"] = state["seed"]
        self._state, self.epoch = state, state["epoch"]


def _current_version(path: str, storage_options) -> int | None:
    """The version a daskpile result's manifest holds now; None for other Parquet data."""
    try:
        return PileLoader.current_version(path, storage_options)
    except FileNotFoundError:
        return None


def _tensor(values: np.ndarray):
    if values.dtype.kind in "biuf":
        return torch.from_numpy(np.array(values))  # a copy: Arrow's arrays are read-only, tensors may be written
    return values
