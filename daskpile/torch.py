"""PyTorch: ``PileDataset``, the batches of a pile dataset as an ``IterableDataset`` (``daskpile[torch]``).

The core of daskpile never imports torch; this module does, and is imported
only by those who ask for it.
"""

from __future__ import annotations

import inspect
import numbers
import os
import warnings

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:
    raise ImportError(f"daskpile.torch needs PyTorch: pip install 'daskpile[torch]' ({e})") from e

from daskpile._cores import available_cores, pinned
from daskpile._random import seed_for_ranks
from daskpile._storage import as_urls
from daskpile._words import count
from daskpile.loader import PileLoader
from daskpile.loader.pile_loader import (
    SHARE_OF_A_RANK,
    job_world_size,
    warn_if_one_rank_of_many,
    warn_if_rank_is_not_the_launcher_s,
)
from daskpile.loader.plan import worker_share


class PileDataset(IterableDataset):
    """The batches of a pile dataset for a ``DataLoader``, each worker of each rank reading its own share.

    A ``PileLoader`` per DataLoader worker: worker ``w`` of ``W`` on rank
    ``r`` of ``R`` reads as rank ``r * W + w`` of ``R * W``, so every row is
    read once per epoch over all ranks and workers, and all of them yield the
    same number of batches.  Batches are dicts of column name to tensor:
    numbers and booleans as tensors (vectors, fixed-size lists of numbers,
    as tensors of shape (batch, size)), dates, timestamps and durations as
    int64 tensors in their column's unit (days for a date; a null as
    ``-2**63``, numpy's NaT),
    strings and other values as NumPy arrays.  Give the DataLoader
    ``batch_size=None``, since the batches are made here.  The arguments
    are checked, and the path read, when the dataset is made.

    Each iteration reads the epoch ``set_epoch`` last asked for (or ``epoch``)
    from its start, with or without workers, persistent or not: the epoch
    and version live in shared memory, which the workers read when an
    iteration begins.  So call ``set_epoch(e)`` before each epoch, as with
    ``DistributedSampler``; an iteration without it reads the same epoch
    again, in the same order (without workers, a warning says so once an
    epoch was read whole), and a loop left early and begun again starts the
    epoch over.  To
    go on mid-epoch, ``state_dict`` / ``load_state_dict`` resume it: with
    ``num_workers=0``, and in each worker under torchdata's
    ``StatefulDataLoader`` (with the same ``num_workers``).

    Parameters
    ----------
    path, batch_size, seed, columns, filters, mix, prefetch, drop_last, storage_options
        As for :class:`daskpile.PileLoader`.
    rank, world_size
        This process's rank (``torch.distributed.get_rank()``) and the world size.
    canonical_ranks
        Streams an epoch is cut into, over all ranks and workers.  Default:
        ``world_size`` times the DataLoader's workers.
    threads
        Each DataLoader worker's reading threads.  Default: the cores this
        process may use, shared out among its workers and among the ranks on
        this machine (``LOCAL_WORLD_SIZE``, which ``torchrun`` sets) unless
        the process is pinned to some of the machine's cores.

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> from daskpile.torch import PileDataset
    >>> data = PileDataset("shuffled/", batch_size=1000, seed=0, columns=["id", "label"])
    >>> data.set_epoch(0)
    >>> batches = list(DataLoader(data, batch_size=None, num_workers=2))
    >>> len(batches), batches[0]["id"].dtype, data.batches_per_epoch(num_workers=2)
    (30, torch.int64, 30)
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
        unknown = [name for name in options if name not in inspect.signature(PileLoader).parameters]
        if unknown:  # (said by PileLoader, it named PileLoader.__init__)
            raise TypeError(f"PileDataset() got an unexpected keyword argument {unknown[0]!r}")
        if "output" in options:
            raise TypeError(
                "PileDataset: output= is not an option: its batches are dicts of tensors (strings and other values "
                "as NumPy arrays); read PileLoader(output='arrow' or 'pandas') in a loop without a DataLoader"
            )
        path = as_urls(path, "path")
        if world_size == 1:
            warn_if_one_rank_of_many("PileDataset", _job_world_size())
        warn_if_rank_is_not_the_launcher_s("PileDataset", rank, world_size)
        # One seed for every worker: drawn here when None, not in each worker
        self.options = dict(path=path, batch_size=batch_size, seed=seed_for_ranks(seed, world_size), **options)
        self._seed_given = seed is not None  # else a loaded state's seed replaces the one drawn, as in PileLoader
        version = self.options.pop("version", None)
        self.rank, self.world_size, self.canonical_ranks = rank, world_size, canonical_ranks
        # What every process of the DataLoader reads when an iteration begins: shared memory, which persistent
        # workers see change (a copy of the dataset made when they started would not), as Hugging Face's
        # IterableDataset keeps its epoch
        self._shared = torch.tensor([epoch, _NO_VERSION, 0, 0], dtype=torch.int64)
        self._shared.share_memory_()
        # This process's own: set_epoch's calls seen when its last iteration began (a worker made afresh
        # inherits the main process's), and the (epoch, calls) it last read whole, without workers
        self._set_seen, self._read_whole = 0, None
        self._state: dict | None = None  # loaded, resumed when the next iteration begins (in this process)
        self._state_of: int | None = None  # the process that loaded it
        self._loader: PileLoader | None = None
        self._loader_of: tuple | None = None  # (process, DataLoader worker) that made it
        if version is not None:
            self._shared[_VERSION] = version
        # Made now, and let go, so that a wrong argument (a column, a rank, the path) is said here, not by each
        # DataLoader worker at the first batch; and one version of a window for every worker
        checked = self.loader(*_worker_share())
        if checked.version is not None:
            self._shared[_VERSION] = checked.version

    def __getstate__(self) -> dict:
        # A spawned DataLoader worker makes a loader of its own share: this process's is not sent to it
        return {**self.__dict__, "_loader": None, "_loader_of": None}

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return int(self._shared[_EPOCH])

    @property
    def version(self) -> int | None:
        """The version of the moving window the next iteration reads (0 for a shuffle result; None for others)."""
        version = int(self._shared[_VERSION])
        return None if version == _NO_VERSION else version

    def set_epoch(self, epoch: int, version: int | None = None) -> None:
        """Read ``epoch`` from its start at the next iteration (where a loaded state of that epoch is, if any).

        With ``version``, a moving window at that version of its manifest (the
        same on every rank), as ``PileLoader.set_epoch`` says.  Workers see
        both, persistent ones too.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
            raise ValueError(f"epoch must be a whole number from 0, got {epoch!r}")
        if version is not None:
            self._shared[_VERSION] = version
        self._shared[_EPOCH] = epoch
        self._shared[_SET] += 1
        self._shared[_WORKERS] = 0  # the next iteration starts the epoch: where is known here too

    def loader(self, worker: int = 0, workers: int = 1) -> PileLoader:
        """The ``PileLoader`` of DataLoader worker ``worker`` of ``workers``, at the epoch the next iteration reads."""
        rank, world_size = worker_share(self.rank, self.world_size, worker, workers)
        if self.canonical_ranks and self.canonical_ranks % world_size:
            made = f"{count(self.world_size, 'rank')} of {count(workers, 'DataLoader worker')} each"
            raise ValueError(
                f"{made} make {count(world_size, 'reader')}, which do not divide canonical_ranks "
                f"{self.canonical_ranks}: canonical_ranks must be a multiple of world_size x num_workers (change "
                "num_workers or canonical_ranks)"
            )
        # The process's cores shared out among its DataLoader workers, and among the ranks on this machine
        # (torchrun's LOCAL_WORLD_SIZE) unless a rank is pinned to cores of its own: a pool each worker
        ranks_here = 1 if pinned() else _local_world_size()
        options = {"threads": max(1, available_cores() // (workers * ranks_here)), **self.options}
        share = SHARE_OF_A_RANK.set(True)  # (its rank is this rank's worker's, not the launcher's)
        try:
            return PileLoader(
                **options, rank=rank, world_size=world_size, epoch=self.epoch, output="numpy",
                canonical_ranks=self.canonical_ranks or world_size, version=self.version,
            )  # fmt: skip
        finally:
            SHARE_OF_A_RANK.reset(share)

    def batches_per_epoch(self, num_workers: int = 0) -> int:
        """The batches this rank yields in an epoch through a DataLoader with ``num_workers`` workers: steps per
        epoch, for a learning-rate schedule (``len()`` of the DataLoader cannot know its workers)."""
        workers = max(num_workers, 1)
        return workers * len(self.loader(0, workers))  # every worker yields as many

    def __iter__(self):
        # Positioned now, not at the first batch: torchdata asks a worker's state_dict() right after iter()
        loader = self._loader_for_iteration()
        return self._batches(loader, (loader.epoch, self._set_seen))

    def _batches(self, loader: PileLoader, reading: tuple[int, int]):
        for batch in loader:
            yield {name: _tensor(values) for name, values in batch.items()}
        self._read_whole = reading

    def _loader_for_iteration(self) -> PileLoader:
        """This process's loader (a DataLoader worker's, or the main one's), at the start of the epoch asked
        for, or where a loaded state is."""
        loader = self._own_loader()
        self._shared[_WORKERS] = _worker_share()[1] if _worker_id() is not None else 0
        asked = int(self._shared[_SET]) != self._set_seen  # set_epoch since this process's last iteration began
        self._set_seen = int(self._shared[_SET])
        state, self._state = self._state, None
        if state is not None and self._resumes(state, asked):
            if _worker_id() is not None and self._state_of != os.getpid() and _at_epoch_start(state):
                # an epoch's start is every worker's (set_epoch(next) before state_dict(), as the guide says)
                if (state["data"], state["content"]) != (loader.units.key, loader.units.content):
                    loader.load_state_dict(state)  # (which says whose state it is)
                loader.restart(state["epoch"], self.version)
                self._shared[_EPOCH] = state["epoch"]
                return loader
            if _worker_id() is not None and self._state_of != os.getpid():
                raise ValueError(
                    "PileDataset: a state given to load_state_dict in the main process is one loader's position, and "
                    "each DataLoader worker has its own: resume through torchdata's StatefulDataLoader "
                    "(its load_state_dict gives each worker its state), or with num_workers=0"
                )
            self._refuse_other_workers(state, loader)
            loader.load_state_dict(state)
            self._shared[_EPOCH] = state["epoch"]  # (the next iteration reads it again, unless set_epoch says)
            return loader
        if _worker_id() is None and self._read_whole == (self.epoch, self._set_seen) and not asked:
            # (a worker cannot tell an epoch read whole: what it read ahead, the loop may have left unread)
            warnings.warn(
                f"PileDataset reads epoch {self.epoch} again, in the order it was read in before: call "
                "set_epoch(epoch) before each epoch for a new order (as with DistributedSampler)",
                stacklevel=3,
            )
        loader.restart(self.epoch, self.version)
        return loader

    def _refuse_other_workers(self, state: dict, loader: PileLoader) -> None:
        """A state taken with another num_workers, said as that: the loader said another canonical_ranks and a
        job resized, which the user had not given nor done."""
        if self.canonical_ranks is not None or state.get("canonical_ranks") == loader.canonical_ranks:
            return
        ranks = state.get(_RANKS, self.world_size)  # (a state of before 2026-12-02 did not say: taken as the same)
        if ranks != self.world_size:
            raise ValueError(
                f"PileDataset: the state was taken on {count(ranks, 'rank')} (world_size={ranks}), and this job has "
                f"{self.world_size}: a job resized between restarts needs canonical_ranks (a multiple of every "
                "world_size x num_workers) given from the first run on, the same in every run"
            )
        then, now = state["canonical_ranks"] // ranks, loader.canonical_ranks // self.world_size
        if state["canonical_ranks"] % ranks or then == now:
            return  # (the loader says what else differs)
        raise ValueError(
            f"PileDataset: the state was taken with {count(max(then, 1), 'DataLoader worker')} on each rank (as "
            f"num_workers={then if then > 1 else '0 or 1'}), and this DataLoader has {now}: resume with the same "
            "num_workers, or give canonical_ranks (a multiple of every world_size x num_workers) from the first run on"
        )

    def _resumes(self, state: dict, asked: bool) -> bool:
        """Whether a loaded state is resumed: unless ``set_epoch`` asked for another epoch since this process's
        last iteration began (a checkpoint taken after an epoch's loop, then ``set_epoch(next_epoch)``: that
        epoch is read from its start)."""
        if not asked or state["epoch"] == self.epoch:
            return True
        if self.epoch != state["epoch"] + 1:
            warnings.warn(
                f"PileDataset: a state of epoch {state['epoch']} is not resumed, since set_epoch({self.epoch}) "
                "asked for another",
                stacklevel=4,
            )
        elif not state.get("ended") and state.get("batches"):  # (an epoch's end is the next epoch's start)
            warnings.warn(
                f"PileDataset: a state in the middle of epoch {state['epoch']} ({state['batches']:,} batches read) "
                f"is not resumed, since set_epoch({self.epoch}) asked for the next: the rest of epoch "
                f"{state['epoch']} is not read; call set_epoch({state['epoch']}) to finish it first",
                stacklevel=4,
            )
        return False

    def state_dict(self) -> dict:
        """Where this process's loader is; see ``PileLoader.state_dict``.

        With ``num_workers > 0`` the loaders live in the workers: torchdata's
        ``StatefulDataLoader`` asks each of them.  Asked in the main process
        after workers read, it raises: it cannot see where they are.
        """
        if self._state is not None:  # loaded and not yet resumed: still where it says
            return dict(self._state)
        workers = int(self._shared[_WORKERS])
        if workers and _worker_id() is None:
            raise RuntimeError(
                f"PileDataset.state_dict(): the last iteration was read by {workers} DataLoader workers, whose "
                "positions this process cannot see (its own loader is at the epoch's start): checkpoint through "
                "torchdata's StatefulDataLoader (its state_dict asks each worker), read with num_workers=0, or, "
                "between epochs, call set_epoch(next_epoch) first (the next iteration then starts it)"
            )
        if int(self._shared[_SET]) != self._set_seen:  # set_epoch since this process's last iteration began:
            state = self.loader(*_worker_share()).state_dict()  # the next iteration starts that epoch
        else:
            state = self._own_loader().state_dict()
        # The loader's world is ranks x workers: the ranks, for a resumed job to say which of the two changed
        return {**state, _RANKS: self.world_size}

    def _own_loader(self) -> PileLoader:
        """This process's loader, made on first use."""
        # A worker forked from a process that had made its loader inherits that loader: not its own share
        here = (os.getpid(), _worker_id())
        if self._loader is None or self._loader_of != here:
            self._loader, self._loader_of = self.loader(*_worker_share()), here
        return self._loader

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state`` when the next iteration begins, unless ``set_epoch`` asked for another epoch.

        torchdata's ``StatefulDataLoader`` calls this when its iterator is
        made, after the loop's ``set_epoch``: with no workers in this process,
        else in each worker with its own state.
        """
        if not self._seed_given:
            self.options["seed"] = state["seed"]
        self._state, self._state_of = state, os.getpid()


# The shared tensor: the epoch and version the next iteration reads, set_epoch's calls, and the DataLoader
# workers that read the iteration begun last (0: the main process)
_EPOCH, _VERSION, _SET, _WORKERS = range(4)
_RANKS = "dataset_world_size"  # the key of a state's ranks (its "world_size" is its loader's: ranks x workers)
_NO_VERSION = -1


def _at_epoch_start(state: dict) -> bool:
    """Whether ``state`` is an epoch's start: no batch of it read, no stream begun."""
    return not state.get("ended") and not state.get("batches") and not any(state.get("starts", ()))


def _worker_id() -> int | None:
    info = get_worker_info()
    return None if info is None else info.id


def _worker_share() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _job_world_size() -> int:
    """The ranks of the job: torch.distributed's, once initialised, else the launcher's (``WORLD_SIZE``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return job_world_size()


def _local_world_size() -> int:
    """The ranks on this machine, as torchrun says (``LOCAL_WORLD_SIZE``); 1 where it does not."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError:
        return 1


def _tensor(values: np.ndarray):
    if values.dtype.kind in "mM":  # torch has no time type: counts of the column's unit (days, for a date)
        values = values.view(np.int64)
    if values.dtype.kind in "biufc":
        return torch.from_numpy(np.array(values))  # a copy: Arrow's arrays are read-only, tensors may be written
    return values
