"""``PileLoader``: batches from a pile dataset for training, every epoch in a fresh order."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import numbers
import os
import warnings
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from daskpile._cores import available_cores
from daskpile._random import seed_for_ranks
from daskpile._storage import FileChangedError, as_urls, redact, redacting_errors, redacting_iteration
from daskpile._words import count
from daskpile.loader.plan import EpochPlan, Layout
from daskpile.loader.reading import Budget, LoadsStopped, Prefetcher, TaskPool, group_row_ids, load_group
from daskpile.loader.units import DASK_NULL_INDEX, EXACT_IN_FLOAT64, Units, discover, numpy_would_refuse

STATE_FORMAT = "daskpile.loader/3"
# Format 2 cut an eager pile shared by two streams where its file cuts it, format 3 where its turned rows do
# (``plan.pile_turn``): the same rows where no eager pile is cut (one canonical rank, lazy piles) or at an
# epoch's start.  Format 1 besides read a rank's streams a batch from each in turn, not a row from each: the
# same where a rank reads one stream (canonical_ranks == world_size).
_FILE_CUT_FORMATS = ("daskpile.loader/1", "daskpile.loader/2")
_ONE_STREAM_FORMATS = ("daskpile.loader/1",)
OUTPUTS = ("arrow", "pandas", "numpy")


@dataclasses.dataclass(frozen=True)
class LoadStats:
    """How one pass over the loader went: seconds waiting for the first group, then for the others."""

    first_wait: float
    waited: float
    groups: int


@dataclasses.dataclass(frozen=True)
class CoBatch:
    """How tied two epochs are: the share of pairs in one batch of the first that are again in one of the second.

    ``ideal`` is that share for two independent uniform permutations with the
    same batch sizes.
    """

    rate: float
    ideal: float
    pairs: int

    def __str__(self) -> str:
        return f"co-batch rate {self.rate:.3g} (independent permutations {self.ideal:.3g}) over {self.pairs:,} pairs"


class PileLoader:
    """Batches of a pile dataset, a fresh order every epoch, for each rank of a training job.

    Each epoch puts the files (piles) in a random order keyed by
    ``(seed, epoch)``, cuts their rows into ``canonical_ranks`` streams of
    equal length, and loads each stream ``mix`` files at a time, permuting
    them together as they are loaded.  Rank ``rank`` of ``world_size`` reads
    its streams only, so every row is read by exactly one rank per epoch, and
    every rank yields the same number of batches of the same sizes.  Piles
    beyond the group being consumed, ``prefetch`` of them, are read and
    permuted in background threads meanwhile.

    After an iteration (whole or broken off), ``stats`` is a
    :class:`~daskpile.loader.LoadStats`: the seconds it waited for its first
    group and then for the others, which are near zero when prefetching keeps
    up.

    Parameters
    ----------
    path
        A pile dataset: a ``shuffle_parquet`` result (its manifest lists the
        files and rows; a lazy one, ``second_pass="lazy"``, is permuted here),
        or any Parquet directory, glob or list of files (``shuffle(ddf)
        .to_parquet``), local or an fsspec URL (read by row group: no whole
        file is downloaded); a ``pathlib.Path`` as its string.
    batch_size
        Rows per batch.
    seed
        The seed of the orders, with the epoch: the same on every rank.  None
        draws one (then save ``state_dict()`` to resume), with one rank only:
        ranks that drew their own would share out different orders.
    epoch
        The epoch to start at.  Iterating to the end of an epoch moves to the
        next; ``set_epoch`` sets it.
    rank, world_size
        This process's share.  ``world_size`` must divide ``canonical_ranks``.
    canonical_ranks
        The number of streams an epoch is cut into.  Default: ``world_size``.
        The rows of each stream, and their order, depend on ``(seed, epoch,
        canonical_ranks, mix)`` only, so a job can be restarted with any world
        size dividing it and resume where it stopped.  A rank takes a row
        from each of its streams in turn (a batch reads them stream by
        stream), and holds ``canonical_ranks / world_size`` groups at once.
    mix
        Files loaded and permuted together: pairs of rows batched together in
        one epoch are batched together again in the next about ``mix**2``
        times less often.
    prefetch
        Files read and permuted ahead, beyond the group being consumed, in
        background threads (``threads``).  The loader holds at most ``mix +
        prefetch`` files, and as many rows as that many of the largest
        file (a group is let go part by part as it is consumed; a rank
        reading several streams, see ``canonical_ranks``, holds ``mix`` files
        for each).  On top come the columns being permuted, up to one a
        thread, and the batches you keep: measured on B with 2 cores, the
        Arrow pool peaks at 2.1 files for ``mix=1`` and 7.6 for ``mix=4``.
        0 loads each group when it is needed.  With ``mix`` above 1,
        ``prefetch=mix`` loads a whole group ahead, so that a consumer that
        keeps up never waits at a group's start; a smaller one holds less,
        and the next group's last files are read only as the current group is
        consumed.
    columns, filters
        Read only these columns (default: every column but the
        ``__null_dask_index__`` Dask writes for an unnamed index); only the
        rows passing ``filters`` (pyarrow's DNF lists or a
        ``pyarrow.dataset`` expression; they are counted once when the
        loader is made).
    drop_last
        Drop each rank's rows beyond the shortest rank's whole batches.
        Default False: every row is read, and a rank with fewer rows than the
        longest wraps around to rows of its own from this epoch.
    output
        ``"arrow"`` (a ``pyarrow.Table`` per batch), ``"pandas"`` (with the
        dtypes pandas gives the files, in every batch: an integer or boolean
        column with a null in any file is float64 or object, as
        ``pd.read_parquet`` gives it, in batches without one too; nullable
        integers stay ``Int64``; and
        their named index, unless ``columns`` is given: then the columns
        named, an index's among them, are columns and the index is a range,
        where ``pd.read_parquet(columns=...)`` would add the index), or
        ``"numpy"`` (a dict of column name to array, as pyarrow's
        ``to_numpy`` gives, each column one dtype in every batch: an
        integer or boolean column with a null in any file (as the manifest
        records, or the files' footers count) is float64 with NaN, refused
        when it holds integers float64 would round; times with a time zone
        are ``datetime64`` in UTC; fixed-size lists of numbers, such as
        embeddings, are one array of shape (rows, size), a null vector of
        floats NaN).
    storage_options
        Passed to fsspec.
    version
        For a moving window (``daskpile.append``): read this version of its
        manifest.  Default None: the version current when the loader is
        made, which ranks made on either side of an ``append`` see
        differently (they would share out different rows, and yield
        different numbers of batches): with several ranks, pass rank 0's
        ``PileLoader.current_version(path)``, broadcast.  The loader stays
        on its version, whatever is appended, until
        ``set_epoch(epoch, version=...)`` moves it (every rank to the same
        version, so that they share out the same rows); ``state_dict``
        records it, so a resumed epoch reads it too.  A window's pile is all
        its generations, loaded and permuted together.
    threads
        The threads that read and permute files, their columns spread over
        them.  Default: the cores this process may use (its CPU affinity,
        within its cgroup's CPU quota, as a Kubernetes CPU limit sets it).
        ``PileDataset`` gives each DataLoader worker its share.

    Examples
    --------
    >>> import daskpile
    >>> loader = daskpile.PileLoader("shuffled/", batch_size=1000, seed=0)
    >>> len(loader), sum(batch.num_rows for batch in loader)
    (30, 30000)
    >>> loader.epoch  # the next epoch, in another order
    1
    >>> state = loader.state_dict()
    """

    @redacting_errors
    def __init__(
        self,
        path: str | list[str],
        *,
        batch_size: int,
        seed: int | None,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        canonical_ranks: int | None = None,
        mix: int = 1,
        prefetch: int = 1,
        columns: list[str] | None = None,
        filters=None,
        drop_last: bool = False,
        output: str = "arrow",
        storage_options: dict | None = None,
        version: int | None = None,
        threads: int | None = None,
    ):
        batch_size, world_size, mix = _positive(batch_size=batch_size, world_size=world_size, mix=mix)
        (threads,) = _positive(threads=available_cores() if threads is None else threads)
        (canonical,) = _positive(canonical_ranks=world_size if canonical_ranks is None else canonical_ranks)
        epoch, rank, prefetch = _at_least_zero(epoch=epoch, rank=rank, prefetch=prefetch)
        if rank >= world_size:
            raise ValueError(f"rank {rank} is not below world_size {world_size}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if not isinstance(drop_last, (bool, np.bool_, numbers.Integral)) or drop_last not in (0, 1):
            raise ValueError(f"drop_last must be True or False, got {drop_last!r}")  # ("False", a string, is true)
        drop_last = bool(drop_last)
        if path is None:
            raise TypeError("path must be a path or URL (a str or pathlib.Path) or a list of them, got None")
        if output == "pandas":  # now, not in the first batch: a Ctrl-C landing in Arrow's import of it there
            import pandas  # noqa: F401  left it half imported, and every batch after failed with AttributeError
        path = as_urls(path, "path")
        if world_size == 1 and canonical_ranks is None:
            warn_if_one_rank_of_many("PileLoader", job_world_size())
        warn_if_rank_is_not_the_launcher_s("PileLoader", rank, world_size)
        self._source = (path, storage_options, filters, columns)
        self.units: Units = discover(path, storage_options, filters, version, columns)
        self.seed = seed_for_ranks(seed, world_size)
        self._seed_given = seed is not None  # else a loaded state's seed replaces the one drawn
        self.rank, self.batch_size, self.mix, self.prefetch = rank, batch_size, mix, prefetch
        self.columns, self.output = _columns_to_read(columns, self.units.schema, path), output
        self._batch_metadata, self._arrow_dtypes = _batch_metadata(self.units.schema, columns is None, self.columns)
        if output == "numpy" and filters is None:  # (the footers' statistics are of every row, not those kept)
            _refuse_what_numpy_would_refuse_later(self.units, self.columns)
        self._warn_of_uncounted_nulls()
        self._warn_of_files_not_shuffled(path)
        self._warn_of_streams_too_many_to_mix(canonical)
        self._warn_of_piles_smaller_than_a_batch()
        if self.units.total == 0 and filters is not None:  # (a training loop would run no step, silently)
            warnings.warn(f"filters={filters!r} match no row of {path!r}: every epoch yields no batch", stacklevel=3)
        if 0 < self.units.total < canonical:  # (no rows at all: an epoch of no batch)
            after = " after the filters" if filters is not None else ""
            into = f"{canonical} canonical ranks" if canonical_ranks else f"a share for each of {world_size} ranks"
            raise ValueError(f"{count(self.units.total, 'row')}{after} cannot be cut into {into}")
        self._layout = Layout(canonical, world_size, batch_size, drop_last, (0,) * canonical)
        self._epoch, self._batches = epoch, 0
        self._cached_plan: tuple = (None, None)  # ((seed, epoch), its plan)
        self._threads = threads  # (Arrow and numpy let go of the GIL: a thread a core)
        self._pools: dict[int, TaskPool] = {}
        self.stats: LoadStats | None = None
        self._iteration = 0  # which iterator is current (see __iter__)
        self._loads: Prefetcher | None = None  # what the current iterator loads ahead
        self._running = None  # the current iterator's generator (see _WhileCurrent)
        self._finished: dict | None = None  # the state at the end of the epoch just read to its end
        if drop_last and self._layout.batches(self._plan(epoch)) == 0:
            raise ValueError(
                f"drop_last: {'each of the ' + count(world_size, 'rank') if world_size > 1 else 'the one rank'} "
                f"has fewer than batch_size={batch_size:,} rows, so no batch would be yielded"
            )

    def __getstate__(self) -> dict:
        # The thread pools stay with the process that made them: a copy sent to a spawned DataLoader worker,
        # or pickled after an epoch, makes its own when it first loads
        return {**self.__dict__, "_pools": {}, "_loads": None, "_running": None}

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads (or goes on reading)."""
        return self._epoch

    @property
    def world_size(self) -> int:
        return self._layout.world_size

    @property
    def canonical_ranks(self) -> int:
        return self._layout.canonical

    def set_epoch(self, epoch: int, version: int | None = None) -> None:
        """Read ``epoch`` at the next iteration: from its start, unless it is the epoch the loader is in.

        So a loop that calls ``set_epoch(e)`` before every epoch goes on where
        ``load_state_dict`` put it.  With ``version``, a moving window is read
        at that version of its manifest from this epoch on (from the next one
        if the loader is partway through this one, as a resumed job is: it
        finishes the epoch on the version it started, none of its rows read
        twice; ``restart`` starts it again on the new version): give every
        rank the same one (rank 0's ``PileLoader.current_version(path)``,
        broadcast), so that they share out the same rows.
        """
        (epoch,) = _at_least_zero(epoch=epoch)
        if epoch == self._epoch and (self._batches or any(self._layout.starts)):
            # (partway through it, resumed with its batch size or world or not: a new version from the start of
            # this epoch would read rows again)
            return
        if version is not None and version != self.units.version:
            self._read_version(version)
            self._start_epoch(epoch)
        elif epoch != self._epoch:
            self._start_epoch(epoch)

    def restart(self, epoch: int, version: int | None = None) -> None:
        """Read ``epoch`` from its start at the next iteration, wherever the loader is in it (``set_epoch`` goes on
        in the epoch the loader is in).  With ``version``, a moving window at that version of its manifest.

        >>> loader = PileLoader("shuffled/", batch_size=1000, seed=0)
        >>> first = next(iter(loader))
        >>> loader.restart(0)
        >>> next(iter(loader)).equals(first)
        True
        """
        (epoch,) = _at_least_zero(epoch=epoch)
        if version is not None:
            self._read_version(version)
        self._start_epoch(epoch)

    @property
    def version(self) -> int | None:
        """The version of the moving window (or 0 for a shuffle result) this loader reads; None for other data."""
        return self.units.version

    @staticmethod
    def current_version(path: str, storage_options: dict | None = None) -> int:
        """The version of the window (a shuffle result: 0) that ``path/_daskpile.json`` holds now.

        >>> PileLoader.current_version("shuffled/")
        0
        """
        from daskpile.engine import _manifest

        return _manifest.version_of(_manifest.read(path, storage_options))

    def _start_epoch(self, epoch: int) -> None:
        self._replace_iterator()
        self._epoch, self._batches, self._finished = epoch, 0, None
        self._layout = dataclasses.replace(self._layout, starts=(0,) * self.canonical_ranks)

    def _read_version(self, version: int) -> None:
        """A window's units at ``version``, if they are not those read already."""
        if version != self.units.version:
            path, storage_options, filters, columns = self._source
            self.units = discover(path, storage_options, filters, version, columns)

    def _warn_of_uncounted_nulls(self) -> None:
        uncounted = [name for name in self.columns if name in self.units.uncounted]
        if self.output != "arrow" and uncounted:
            warnings.warn(
                f"PileLoader(output={self.output!r}): whether {', '.join(map(repr, uncounted))} hold a null is not "
                "recorded (a result written before daskpile recorded it, or files without null counts), so a batch "
                f"of them holding one is float64{' (booleans: object)' if self.output == 'pandas' else ''} and the "
                "others keep their dtype; shuffle the data again for one dtype in every batch, or read "
                "output='arrow'",
                stacklevel=4,  # (the caller's line, above __init__ and its redacting_errors)
            )

    def _warn_of_files_not_shuffled(self, path) -> None:
        # (a folder of files in some order, read as piles, mixes each file's rows with its own only)
        if not self.units.from_daskpile and len(self.units.paths) > 1:
            named = redact(path) if isinstance(path, str) else "the files given"
            warnings.warn(
                f"PileLoader: {named} has no _daskpile.json and no daskpile stamp in its files' footers (nor has "
                "shuffle(ddf).to_parquet's output before 2026-12-01): if it was not shuffled, know that each of its "
                f"{count(len(self.units.paths), 'file')} is read as a pile, so a batch mixes the rows of one file (of "
                "mix files) only, as random as the files' split of the rows already is; shuffle it first (daskpile "
                "shuffle, or daskpile.shuffle(ddf).to_parquet)",
                stacklevel=4,  # (the caller's line, above __init__ and its redacting_errors)
            )

    def _warn_of_streams_too_many_to_mix(self, canonical: int) -> None:
        files = len(self.units.paths)
        # A stream mixes the piles it reads, up to mix of them: one that reads fewer than 2 mixes none (mix=100
        # over streams of 8 piles each mixes those 8, and was warned of as mixing none: a quality trial)
        if self.mix > 1 and files < 2 * canonical:
            warnings.warn(
                f"PileLoader(mix={self.mix}): the dataset's {count(files, 'pile')} are cut into {canonical} streams "
                "(canonical_ranks; with DataLoader workers, ranks x workers), each reading about "
                f"{files / canonical:.1f}, so few or none are mixed: co_batch_rate() is about mix=1's; for mix to "
                f"act, shuffle into {self.mix * canonical} piles or more (piles >= streams x mix)",
                stacklevel=4,  # (the caller's line, above __init__ and its redacting_errors)
            )

    def _warn_of_piles_smaller_than_a_batch(self) -> None:
        rows = int(np.median(self.units.rows)) if len(self.units.rows) else 0
        # (a batch of every row, as an evaluation may read them, has no other batch to share rows with)
        if 0 < rows * self.mix < self.batch_size < self.units.total:
            warnings.warn(
                f"PileLoader(batch_size={self.batch_size:,}): its piles hold {count(rows, 'row')} (the median), "
                f"{'a group of ' + str(self.mix) + ' of them ' if self.mix > 1 else ''}fewer than a batch, so a "
                "batch holds whole piles, whose rows meet in one batch again every epoch (co_batch_rate()): "
                f"pass mix={-(-self.batch_size // rows)} or more, or shuffle into fewer, larger piles",
                stacklevel=4,  # (the caller's line, above __init__ and its redacting_errors)
            )

    def __len__(self) -> int:
        """Batches the next iteration yields: the whole epoch's, or after ``load_state_dict`` those left."""
        return self._layout.batches(self._plan(self._epoch)) - self._batches

    def __iter__(self):
        # The loader has one position: a new iterator goes on from it, and an older one still alive
        # (a loop left with break, a peek with next(iter(loader))) stops rather than counting its
        # batches into the same position, which state_dict would then misreport.
        self._replace_iterator()
        self._running = self._iterate(self._iteration)
        return redacting_iteration(_WhileCurrent(self, self._iteration, self._running))

    def _iterate(self, iteration: int):
        plan = self._plan(self._epoch)
        takes = self._layout.takes(plan, self.rank, skip_batches=self._batches)
        epoch, units = self._epoch, self.units  # one version of a window for the whole epoch
        pool = self._column_pool()

        def load(group, reserve):
            return load_group(
                units, group, self.seed, epoch, self.columns, pool, reserve, self._threads, tail=self.batch_size,
                metadata=self._batch_metadata,
            )  # fmt: skip

        loaded = self._loads = Prefetcher(takes, load, self._budget())
        try:
            for batch in _batches(loaded, self.batch_size):  # (each asked for once _WhileCurrent has checked)
                converted = self._convert(batch)  # (a batch numpy refuses is not counted as read)
                self._batches += 1
                self._finished = None
                yield converted
        except FileNotFoundError as error:
            if units.version is None:  # files listed when the loader was made (a ``shuffle(ddf).to_parquet``'s)
                raise FileNotFoundError(
                    f"{error}: the dataset changed since this loader was made (its files written again, or removed), "
                    "so this epoch cannot go on; make the loader again"
                ) from error
            if units.version == 0:  # a shuffle result's (a window's versions begin at 1)
                raise FileNotFoundError(
                    f"{error}: the result changed since this loader was made (written again, or its files removed), "
                    "so this epoch cannot go on; make the loader again"
                ) from error
            raise FileNotFoundError(  # (the file system's error, with its filename, is its cause)
                f"{error}: the result changed since this loader was made (written again, or a window whose version "
                "this loader reads has its files removed once their grace period, retain= or --retain, is over): "
                "make the loader again, or move it with set_epoch(epoch, version=PileLoader.current_version(path))"
            ) from error
        except LoadsStopped:  # (replaced while it ran, in another thread)
            self._check_current(iteration)
            raise
        except FileChangedError as error:
            # Rows of another shuffle would be read twice or never this epoch: refused, whatever was yielded
            raise FileChangedError(
                f"{error}: the dataset changed since this loader was made (its files written again under the same "
                "names, or cut short), so this epoch cannot go on; make the loader again (a state saved before the "
                "change belongs to the old dataset)"
            ) from error
        finally:
            self.stats = LoadStats(loaded.first_wait, loaded.waited, loaded.loaded)
            if self._loads is loaded:  # (what it loaded is let go: a loop left with break holds nothing)
                self._loads = None
        self._check_current(iteration)
        self._finished = None  # (an epoch of no batch: this one's end, not the previous one's)
        finished = {**self.state_dict(), "ended": True}  # (resumable without its version: nothing is left to read)
        self._start_epoch(self._epoch + 1)
        # Its state stays that of the epoch's end until the loader moves on: a checkpoint of (epoch, state)
        # taken after the loop resumes at that end, with nothing left of the epoch (see load_state_dict)
        self._finished = finished

    def _budget(self) -> Budget:
        """What a rank holds at most: for each stream it reads a group of ``mix`` files, and ``prefetch`` files.

        Counted in files, and in rows as files of the largest file's rows.
        """
        files = len(range(self.rank, self.canonical_ranks, self.world_size)) * self.mix + self.prefetch
        largest = int(self.units.rows.max()) if len(self.units.rows) else 0
        return Budget(rows=files * max(largest, 1), files=files)

    def _replace_iterator(self) -> None:
        """A live iterator was of the position this replaces: it stops at its next batch, and what it holds and
        loads ahead is let go now (a loop left with ``break`` kept its piles, and went on loading)."""
        self._iteration += 1
        loads, self._loads = self._loads, None
        running, self._running = self._running, None
        if loads is not None:
            loads.stop()
        if running is not None:
            with contextlib.suppress(ValueError):  # (running: ending its epoch, or in another thread)
                running.close()  # (the batch it yielded last, and the one it was making)

    def _check_current(self, iteration: int) -> None:
        if iteration != self._iteration:
            raise RuntimeError(
                "this iterator of the PileLoader was replaced: the loader was iterated again, or its position "
                "set (set_epoch, load_state_dict), and goes on from there; use one iterator at a time"
            )

    def _column_pool(self) -> TaskPool:
        # One per process: a process forked from this one (a DataLoader worker) inherits a pool whose
        # threads it does not have, and that would never run a job
        pid = os.getpid()
        if pid not in self._pools:
            self._pools = {pid: TaskPool(self._threads, name="daskpile-column")}
        return self._pools[pid]

    def state_dict(self) -> dict:
        """Where this loader is: enough for ``load_state_dict`` to resume with the batches not yet yielded.

        Every rank's state says the same (the ranks move in step), so rank 0's
        is enough to resume all of them, with the same or another world size.
        Once an epoch is read to its end, and until the loader moves on, the
        state is that end: a loop that saves ``(epoch, state)`` after the epoch
        resumes with nothing left of ``epoch``, whether or not it calls
        ``set_epoch(epoch)``, and ``set_epoch(epoch + 1)`` starts the next.
        That state is marked ``"ended"``: on a window at another version since,
        it resumes on the loader's version, as it needs nothing of its own (kept
        or collected).
        """
        if self._finished is not None:
            return dict(self._finished)
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "epoch": self._epoch,
            "canonical_ranks": self.canonical_ranks,
            "mix": self.mix,
            "rows": self.units.total,
            "files": len(self.units.paths),
            "version": self.units.version,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "drop_last": self._layout.drop_last,
            "starts": list(self._layout.starts),
            "batches": self._batches,
            "data": self.units.key,
            "content": self.units.content,
            "lazy": self.units.lazy,
            "filters": self._filters_said(),
            "selection": self.units.selection,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume where ``state`` (from ``state_dict``, on any rank) was taken: the next batch is the next unseen.

        The world size and batch size may differ from the state's when
        ``canonical_ranks`` is the same: each stream then goes on from the
        rows it had given.  The seed is the state's: a loader made with
        ``seed=None`` takes it, one made with another seed refuses the state.
        """
        _check_fields(state)
        _check_format(state, self.units.lazy, state.get("ended") is True or self._ended(state))
        if state.get("version") is not None and self.units.version is not None:
            if state.get("ended") is True and state["version"] != self.units.version:
                # Nothing of its epoch is left to read: the next goes on this loader's version, whether the
                # state's is still kept or collected (ranks resuming on either side of a collect agree)
                self._stay_at_the_end_of(state)
                return
            try:
                self._read_version(state["version"])  # a resumed epoch reads the version it started on
            except ValueError:
                path, storage_options, _, _ = self._source
                current = self.current_version(path, storage_options)
                if state["version"] <= current:
                    raise
                raise ValueError(  # (versions only grow: the state read another window)
                    f"the state belongs to another dataset: it read version {state['version']}, and the window "
                    f"{path!r} is at version {current}"
                ) from None
        self._check_state(state)
        old = _layout_of(state)
        plan = self._plan(state["epoch"], state["seed"])
        _check_position(state, old, plan)
        self._replace_iterator()
        self._finished = None
        self.seed, self._epoch = state["seed"], state["epoch"]
        if state["batches"] >= old.batches(plan):
            # Taken after the last batch: the loader stays at the end of this epoch, so that the loop that
            # saved it, set_epoch(e) or not, finds nothing left of epoch e and goes on with e + 1
            self._start_epoch(self._epoch)
            self._batches = self._layout.batches(plan)
            self._finished = {**self.state_dict(), "ended": True}  # saved again, it still resumes without its version
            return
        ours = (self.world_size, self.batch_size, self._layout.drop_last)
        if (old.world_size, old.batch_size, old.drop_last) == ours:
            self._layout, self._batches = old, state["batches"]
            return
        starts = old.consumed(plan, state["batches"])
        self._layout = dataclasses.replace(self._layout, starts=tuple(int(s) for s in starts))
        self._batches = 0

    def _stay_at_the_end_of(self, state: dict) -> None:
        """Take ``state``, taken at the end of its epoch on another window version, on this loader's version:
        nothing is left of its epoch, and ``set_epoch(epoch + 1)`` starts the next on this version."""
        if self._seed_given and state["seed"] != self.seed:
            raise ValueError(
                f"the state's seed {state['seed']} is not this loader's seed {self.seed}: make the loader with the "
                "state's seed, or seed=None to take it"
            )
        ours = {"canonical_ranks": self.canonical_ranks, "mix": self.mix}  # (its files and rows are the version's)
        differ = [f"{key} {state[key]} (this loader {value})" for key, value in ours.items() if state[key] != value]
        if differ:
            raise ValueError(f"the state belongs to another loader: {', '.join(differ)}")
        self._replace_iterator()
        self.seed, self._epoch = state["seed"], state["epoch"]
        self._start_epoch(self._epoch)
        self._batches = self._layout.batches(self._plan(self._epoch))
        self._finished = dict(state)

    def co_batch_rate(self, first_epoch: int | None = None, second_epoch: int | None = None) -> CoBatch:
        """How tied two epochs are (default: this one and the next), over every rank, without reading data.

        Of the pairs of rows in one batch of ``first_epoch``, the share that
        are again in one batch of ``second_epoch``; beside it the share for
        two independent uniform permutations.  Computed from the plans alone.
        """
        first = self._epoch if first_epoch is None else _at_least_zero(first_epoch=first_epoch)[0]
        second = first + 1 if second_epoch is None else _at_least_zero(second_epoch=second_epoch)[0]
        batch_a, batch_b = self._batch_of_rows(first), self._batch_of_rows(second)
        if not len(batch_a):  # no rows: no pairs
            return CoBatch(0.0, 0.0, 0)
        both = (batch_a >= 0) & (batch_b >= 0)
        sizes_a = np.bincount(batch_a[batch_a >= 0])
        sizes_b = np.bincount(batch_b[batch_b >= 0])
        together = int((sizes_a * (sizes_a - 1) // 2).sum())
        _, joint = np.unique(batch_a[both] * (batch_b.max() + 1) + batch_b[both], return_counts=True)
        again = int((joint * (joint - 1) // 2).sum())
        n = int(both.sum())
        ideal = float((sizes_b * (sizes_b - 1)).sum()) / (n * (n - 1)) if n > 1 else 0.0
        return CoBatch(again / together if together else 0.0, ideal, together)

    def _batch_of_rows(self, epoch: int) -> np.ndarray:
        """Each row's batch number (over all ranks) in ``epoch`` from its start; -1 for a row not read."""
        plan = self._plan(epoch)
        layout = dataclasses.replace(self._layout, starts=(0,) * self.canonical_ranks)
        batch = np.full(self.units.total, -1, dtype=np.int64)
        batches = layout.batches(plan)
        for rank in range(self.world_size):
            # each stream's group and its row ids: a rank's streams take turns (canonical_ranks over world_size),
            # and one group held for all of them drew each group's permutation again at every turn (40-90x)
            position, ids = 0, {}
            for take in layout.takes(plan, rank):
                stream, index = take.group.stream, take.group.index
                if ids.get(stream, (None,))[0] != index:
                    ids[stream] = (index, group_row_ids(self.units, take.group, self.seed, epoch))
                rows = ids[stream][1][take.start : take.stop]
                numbers = rank * batches + (position + np.arange(len(rows))) // self.batch_size
                fresh = batch[rows] < 0  # rows wrapped around to count once
                batch[rows[fresh]] = numbers[fresh]
                position += len(rows)
        return batch

    def _ended(self, state: dict) -> bool:
        """Whether ``state`` was taken at its epoch's end (nothing of it left, however its piles were cut)."""
        try:
            if state["canonical_ranks"] != self.canonical_ranks:  # another layout: _check_state says so
                return False
            return state["batches"] >= _layout_of(state).batches(self._plan(state["epoch"], state["seed"]))
        except (KeyError, TypeError, ValueError):  # not a state of this dataset: _check_state says so
            return False

    def _plan(self, epoch: int, seed: int | None = None) -> EpochPlan:
        """The plan of ``epoch`` for this loader's seed (or ``seed``)."""
        seed = self.seed if seed is None else seed
        key = (seed, epoch, self.units.version)
        if self._cached_plan[0] != key:
            built = EpochPlan.build(
                self.units.rows, seed=seed, epoch=epoch, canonical=self.canonical_ranks, mix=self.mix
            )
            self._cached_plan = (key, built)
        return self._cached_plan[1]

    def _convert(self, batch: pa.Table):
        if self.output == "pandas":  # the files' pandas metadata says which dtypes and which index
            frame = batch.to_pandas(types_mapper=self._pandas_dtype)
            return _pandas_with_nulls(frame, self.units.nulls)
        if self.output == "numpy":
            return {
                name: _numpy(name, column, name in self.units.nulls)
                for name, column in zip(batch.column_names, batch.columns, strict=True)
            }
        return batch

    def _pandas_dtype(self, kind: pa.DataType):
        if kind in self._arrow_dtypes:
            import pandas as pd

            return pd.ArrowDtype(kind)
        return None

    def _filters_said(self) -> str | None:
        """The loader's filters on one line, as given, each set's values sorted (None without): a state says them,
        so that a state refused for its rows, taken under other filters, is said to be of other filters."""
        filters = self._source[2]
        if filters is None:
            return None
        # The filters as given, a set's values in order: an expression of a set prints them in the order of the
        # process's hash seed (a state taken in another process said its same filters were other ones)
        said = " ".join((str(_in_order(filters)) if isinstance(filters, (list, tuple)) else str(filters)).split())
        # (one line, and short: a set of ids said in a state and a message whole took 130 kB)
        return said if len(said) <= _FILTERS_SHOWN else f"{said[:_FILTERS_SHOWN]}... ({len(said):,} characters)"

    def _check_state(self, state: dict) -> None:
        with self._other_filters_said(state):
            self._check_dataset(state)
        if self.canonical_ranks % state["world_size"]:
            raise ValueError(f"the state's world_size {state['world_size']} does not divide canonical_ranks")
        # Mid-epoch, the rows read depend on the files' orders; states saved before it was recorded have no "lazy"
        if state.get("lazy", self.units.lazy) != self.units.lazy and not _at_start_or_end(state, self._ended(state)):
            piles = {True: "lazy piles (second_pass='lazy')", False: "eager piles"}
            raise ValueError(
                f"the state belongs to another dataset: it was taken on {piles[bool(state['lazy'])]}, this loader "
                f"reads {piles[self.units.lazy]}: the same rows and files, each in another order"
            )
        if self._seed_given and state["seed"] != self.seed:
            raise ValueError(
                f"the state's seed {state['seed']} is not this loader's seed {self.seed}: resuming goes on in the "
                "state's order; make the loader with the state's seed, or seed=None to take it"
            )

    @contextlib.contextmanager
    def _other_filters_said(self, state: dict):
        """A state refused as of another dataset, taken under other filters than this loader's, said as such (a
        new user's trial looked for another shuffle).  Only said, never a reason to refuse: the text of an
        ``in`` filter of a set depends on the process's hash seed, and other filters may select the same rows."""
        try:
            yield
        except ValueError as e:
            theirs, ours = state.get("filters", self._filters_said()), self._filters_said()  # (older states: none)
            if theirs == ours or (state["mix"], state["canonical_ranks"]) != (self.mix, self.canonical_ranks):
                raise  # (a layout said as it is)
            raise ValueError(
                f"the state belongs to a loader of other filters: {theirs or 'none'} (this loader {ours or 'none'}): "
                f"make the loader with the state's filters to resume (refused as: {e})"
            ) from None

    def _check_dataset(self, state: dict) -> None:
        """Refuse a state of other files, rows or shuffle than this loader's, or of another layout."""
        ours = {"canonical_ranks": self.canonical_ranks, "mix": self.mix, "rows": self.units.total,
                "files": len(self.units.paths)}  # fmt: skip
        differ = [f"{key} {state[key]} (this loader {value})" for key, value in ours.items() if state[key] != value]
        if differ:
            hint = ""
            if state["canonical_ranks"] != self.canonical_ranks and state["canonical_ranks"] == state["world_size"]:
                hint = (
                    f": a job resized between restarts keeps one canonical_ranks (the state's "
                    f"{state['canonical_ranks']}, or a multiple of every world size, given from the first run on)"
                )
            raise ValueError(f"the state belongs to another loader or dataset: {', '.join(differ)}{hint}")
        if state.get("data", self.units.key) != self.units.key:  # (states saved before it was recorded have none)
            raise ValueError(
                "the state belongs to another dataset: its files, or their rows, are not this loader's "
                "(another shuffle of the same data has as many rows and files)"
            )
        # (states saved before it was recorded have none; before pile stamps were in it, another: see Units)
        if state.get("content", self.units.content) not in (self.units.content, self.units.content_before):
            raise ValueError(
                "the state belongs to another dataset: the same files and rows per file, of another shuffle (another "
                "seed, or other rows: written again since the state was taken)"
            )
        if state.get("selection", self.units.selection) != self.units.selection:  # (older states: none)
            raise ValueError(
                "the state belongs to other rows of the same files: its filters select as many rows of each file, "
                "and other ones"
            )


def _in_order(value):
    """Filters (pyarrow's DNF) with each set's values sorted, lists and tuples kept as they are.

    >>> _in_order([("city", "in", {"rome", "oslo"})])
    [('city', 'in', ['oslo', 'rome'])]
    """
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=lambda v: (type(v).__name__, repr(v)))
    if isinstance(value, (list, tuple)):
        return type(value)(_in_order(v) for v in value)
    return value


_FILTERS_SHOWN = 200  # characters of the filters a state and its messages say

_STATE_COUNTS = ("epoch", "canonical_ranks", "mix", "rows", "files", "world_size", "batch_size", "batches")


def _check_fields(state) -> None:
    """Refuse what is not a loader state whole (a damaged checkpoint, one written by hand) before it is used.

    >>> _check_fields({"seed": 1})
    Traceback (most recent call last):
    ...
    ValueError: not a PileLoader state: it lacks 'epoch' (damaged, or not from state_dict())
    """
    if not isinstance(state, dict):
        raise ValueError(f"not a PileLoader state: a dict from state_dict(), got {type(state).__name__}")
    missing = [key for key in ("seed", *_STATE_COUNTS, "drop_last", "starts") if key not in state]
    if missing:
        raise ValueError(f"not a PileLoader state: it lacks {missing[0]!r} (damaged, or not from state_dict())")
    for key in ("seed", *_STATE_COUNTS):
        value, least = state[key], 1 if key in ("canonical_ranks", "mix", "world_size", "batch_size") else 0
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            raise ValueError(f"not a valid PileLoader state: {key} is {value!r}, not a whole number from {least}")
    starts = state["starts"]
    if (
        not isinstance(starts, (list, tuple))
        or len(starts) != state["canonical_ranks"]
        or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 0 for s in starts)
    ):
        raise ValueError(
            f"not a valid PileLoader state: starts is {starts!r}, not {state['canonical_ranks']} whole numbers "
            "from 0 (one a canonical rank)"
        )


def _check_position(state: dict, layout: Layout, plan: EpochPlan) -> None:
    """Refuse a position past the end of the state's epoch: its streams' rows, its batches."""
    past = [i for i, (start, rows) in enumerate(zip(state["starts"], plan.lengths, strict=True)) if start > rows]
    if past:
        raise ValueError(
            f"not a valid PileLoader state: stream {past[0]} starts at row {state['starts'][past[0]]:,}, and has "
            f"{int(plan.lengths[past[0]]):,} rows in epoch {state['epoch']}"
        )
    if state["batches"] > layout.batches(plan):
        raise ValueError(
            f"not a valid PileLoader state: {state['batches']:,} batches read, and epoch {state['epoch']} has "
            f"{layout.batches(plan):,}"
        )


def _layout_of(state: dict) -> Layout:
    """The layout of the loader ``state`` was taken of."""
    return Layout(
        state["canonical_ranks"], state["world_size"], state["batch_size"], state["drop_last"], tuple(state["starts"])
    )


def _numpy(name: str, column: pa.ChunkedArray, nulls: bool = False) -> np.ndarray:
    """A column as numpy, one dtype in every batch: integers and booleans of a column that holds a null in
    some file (``nulls``) as float64, a null as NaN (as pandas did before its nullable dtypes), in batches
    without one too; integers that float64 would round are refused rather than rounded.  Dictionaries
    (categoricals) as their values: pyarrow's ``ChunkedArray.to_numpy`` gives each null of a dictionary column
    a neighbour's value (26.0.1: ``['a', None, 'c']`` encoded came back ``['a', 'c', 'c']``).

    >>> _numpy("x", pa.chunked_array([[1, 2]]), nulls=True).dtype, _numpy("x", pa.chunked_array([[1, 2]])).dtype
    (dtype('float64'), dtype('int64'))
    """
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    kind = column.type
    if pa.types.is_fixed_size_list(kind):
        vectors = _vectors(name, column)
        if vectors is not None:
            return vectors
    if (nulls or column.null_count) and (pa.types.is_integer(kind) or pa.types.is_boolean(kind)):
        if pa.types.is_integer(kind) and kind.bit_width == 64:
            import pyarrow.compute as pc

            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()  # None when every value is null
            if high is not None and (high > EXACT_IN_FLOAT64 or low < -EXACT_IN_FLOAT64):
                raise ValueError(_wide_integers_refused(name, high if high > EXACT_IN_FLOAT64 else low))
        column = column.cast(pa.float64())
    return column.to_numpy()


def _wide_integers_refused(name: str, value: int) -> str:
    return (
        f"column {name!r} holds nulls and integers past 2**53 ({value:,}), which output='numpy' would round as "
        "float64 (PileDataset's tensors too): leave it out (columns=), fill its nulls before the shuffle, or read it "
        "with PileLoader(output='arrow')"
    )


def _vectors_with_a_null_refused(name: str) -> str:
    return (
        f"column {name!r} holds vectors of integers with a null, which output='numpy' cannot give as integers (an "
        "array of one dtype in every batch, as tensors need): fill its nulls before the shuffle, or read it with "
        "PileLoader(output='arrow')"
    )


def _refuse_what_numpy_would_refuse_later(units: Units, columns: list[str]) -> None:
    """What ``_numpy`` would refuse at the batch holding it, hours into an epoch on one rank (the others then
    wait in their collectives), refused now where the footers' statistics show it."""
    found = numpy_would_refuse(units, columns)
    if found is not None:
        name, kind, value, file = found
        said = _wide_integers_refused(name, value) if kind == "wide" else _vectors_with_a_null_refused(name)
        raise ValueError(f"PileLoader(output='numpy'): {said} (found in the statistics of {file})")


def _vectors(name: str, column: pa.ChunkedArray) -> np.ndarray | None:
    """A column of fixed-size lists of numbers (embeddings; lists of lists too) as one array of shape (rows,
    size, ...), where pyarrow gives an object array of arrays (which torch cannot take): floats with a null
    vector or value as NaN; integers and booleans refused where they hold a null (their dtype would change
    from a batch to the next).  None for lists of other values.

    >>> _vectors("v", pa.chunked_array([pa.array([[1.5, 2], None], pa.list_(pa.float32(), 2))])).tolist()
    [[1.5, 2.0], [nan, nan]]
    >>> _vectors("v", pa.chunked_array([pa.array([[1, None]], pa.list_(pa.int8(), 2))]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: column 'v' holds vectors of integers with a null, which output='numpy' ...
    """
    array = pa.concat_arrays(column.chunks) if column.num_chunks else pa.array([], column.type)
    levels = [array]  # the array of each level, the values last
    while pa.types.is_fixed_size_list(levels[-1].type):
        size = levels[-1].type.list_size
        levels.append(levels[-1].values.slice(levels[-1].offset * size, len(levels[-1]) * size))
    values, shape = levels[-1], [len(array), *(level.type.list_size for level in levels[:-1])]
    missing = None  # of each value: its own null, or a null list above it (whose values are any)
    for level in levels:
        if missing is not None:
            missing = np.repeat(missing, len(level) // max(len(missing), 1))
        if level.null_count:
            nulls = np.asarray(level.is_null())
            missing = nulls if missing is None else missing | nulls
    kind = values.type
    if pa.types.is_floating(kind):
        flat = values.to_numpy(zero_copy_only=False)
        if missing is not None:
            flat = flat.copy()
            flat[missing] = np.nan
        return flat.reshape(shape)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        if missing is not None:
            raise ValueError(_vectors_with_a_null_refused(name))
        return values.to_numpy(zero_copy_only=False).reshape(shape)
    return None


def _pandas_with_nulls(frame, nulls: frozenset[str]):
    """``frame`` with the dtypes pandas gives a column holding a null in some file, in batches without one too:
    ``to_pandas`` makes integers float64 and booleans object in a batch holding a null, int64 and bool in one
    without (the nullable ``Int64`` and ``boolean`` the pandas metadata asks for stay as they are).

    >>> import pandas as pd
    >>> _pandas_with_nulls(pd.DataFrame({"n": [1], "b": [True], "x": [1]}), frozenset({"n", "b"})).dtypes.tolist()
    [dtype('float64'), dtype('O'), dtype('int64')]
    """

    def as_with_nulls(values):
        kind = values.dtype.kind if isinstance(values.dtype, np.dtype) else ""
        return values.astype(np.float64 if kind in "iu" else object) if kind and kind in "iub" else values

    for name in nulls.intersection(frame.columns):
        frame[name] = as_with_nulls(frame[name])
    if frame.index.name in nulls:  # a named index, restored from the pandas metadata
        frame.index = as_with_nulls(frame.index)
    return frame


def _at_start_or_end(state: dict, ended: bool) -> bool:
    """Whether ``state`` was taken at its epoch's start or (``ended``) its end: nothing of it read, or left, so
    that how the files' rows were cut and ordered does not matter."""
    return ended or (not state["batches"] and not any(state.get("starts") or ()))


def _check_format(state: dict, lazy: bool, ended: bool) -> None:
    """Refuse a state of another format, unless it means the same here (see ``STATE_FORMAT``): of lazy piles
    (their cuts are as before), or taken at its epoch's start or end (nothing of it read, or left)."""
    found = state.get("format")
    if found == STATE_FORMAT:
        return
    at_start = _at_start_or_end(state, ended)
    same_cuts = at_start or lazy or state["canonical_ranks"] == 1
    one_stream = at_start or state["canonical_ranks"] == state["world_size"]
    if found in _FILE_CUT_FORMATS and same_cuts and (found not in _ONE_STREAM_FORMATS or one_stream):
        return
    why = ""
    if found in _FILE_CUT_FORMATS:
        why = (
            " (its states taken mid-epoch, of several canonical ranks on eager piles, resume with the daskpile that "
            "saved them: it cut a pile shared by two streams in file order"
            + (", and read a rank's streams a batch at a time)" if found in _ONE_STREAM_FORMATS else ")")
        )
    raise ValueError(f"not a PileLoader state of format {STATE_FORMAT!r}: {found!r}{why}")


# CPython's words for releasing a lock not held (RLock, Lock)
_BROKEN_BY_AN_INTERRUPT = ("cannot release un-acquired lock", "release unlocked lock")


class _WhileCurrent:
    """A loader's batches while the iterator is its current one; then RuntimeError (``_check_current``).

    Not a generator, whose frame would hold the batch it yielded last: a replaced iterator's generator is
    closed, and lets go of every row it held, while this one still says it was replaced when next asked."""

    def __init__(self, loader: PileLoader, iteration: int, batches: Iterator):
        self._loader, self._iteration, self._batches = loader, iteration, batches

    def __iter__(self):
        return self

    def __next__(self):
        if self._batches is None:  # (its epoch read to the end: that stays its answer)
            raise StopIteration
        self._loader._check_current(self._iteration)
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = None
            raise
        except RuntimeError as error:
            # A Ctrl-C landing in a threading primitive of Python's (a thread's start waits on one) can break
            # its lock's release on the way out: what the user pressed is still Ctrl-C
            if isinstance(error.__context__, KeyboardInterrupt) and str(error) in _BROKEN_BY_AN_INTERRUPT:
                raise error.__context__ from None
            raise

    def close(self) -> None:
        """A loop left early (the iterator closed, or collected): its loads stop, its rows are let go."""
        with contextlib.suppress(ValueError, AttributeError):  # (running, in another thread; or ended)
            self._batches.close()


def _batches(spans, batch_size: int):
    """Spans of rows (``reading.Span``) regrouped into tables of ``batch_size`` rows (the last the rest).

    Zero-copy: the rows a group ends with short of a batch are a view of its
    last part, which ``load_group`` makes of a batch's rows (``tail``), so
    that holding them until the next group completes the batch holds no more
    than that (a copy of them cost a tenth of an epoch of A: each call into
    Arrow hands the GIL to the loading threads and waits to get it back).
    """
    pending, rows = [], 0  # the start of a batch, from the spans before
    for table, offset, n in spans:
        if pending and n:
            taken = min(batch_size - rows, n)
            pending.append(table.slice(offset, taken))
            rows += taken
            if rows < batch_size:
                continue
            yield pa.concat_tables(pending)
            pending, rows = [], 0
            offset, n = offset + taken, n - taken
        if n == batch_size == table.num_rows:
            yield table
            continue
        while n >= batch_size:  # one slice a batch, of the table given
            yield table.slice(offset, batch_size)
            offset, n = offset + batch_size, n - batch_size
        if n:
            pending, rows = [table.slice(offset, n)], n
    if pending:
        yield pa.concat_tables(pending) if len(pending) > 1 else pending[0]


def _columns_to_read(columns: list[str] | str | None, schema: pa.Schema, path) -> list[str]:
    """The columns a batch holds: those asked for, each checked now rather than by the first load."""
    data = [name for name in schema.names if name != DASK_NULL_INDEX]
    if columns is None:
        return data
    columns = [columns] if isinstance(columns, str) else list(columns)
    missing = [name for name in columns if name not in schema.names]
    if missing:
        raise ValueError(
            f"columns: {', '.join(map(repr, missing))} not in {path!r}, whose columns are {', '.join(data)}"
        )
    if not columns or len(set(columns)) < len(columns):
        raise ValueError(f"columns must name at least one column, each once, got {columns!r}")
    return columns


def _batch_metadata(schema: pa.Schema, index: bool, names: list[str]) -> tuple[dict | None, set[pa.DataType]]:
    """The files' schema metadata (a batch's, each output's: a Hugging Face dataset's features among them), with
    pandas' as it holds for a batch of the columns ``names``: the index a
    range of a file has is not a batch's, and the columns asked for by name (``index=False``) stay columns;
    and the Arrow types of its ``pd.ArrowDtype`` columns whose names pandas cannot parse back (lists,
    structs: pandas' own reader fails on the file, whatever columns it reads), given as ``pd.ArrowDtype`` by
    ``to_pandas``'s types_mapper instead."""
    # (a pile's stamp, daskpile's, describes its file: not a batch)
    metadata = {k: v for k, v in (schema.metadata or {}).items() if not k.startswith(b"daskpile.")} or None
    if not metadata or b"pandas" not in metadata:
        return metadata, set()
    pandas = json.loads(metadata[b"pandas"])
    pandas["index_columns"] = [c for c in pandas.get("index_columns", []) if index and isinstance(c, str)]
    kept = set(names) | set(pandas["index_columns"])
    columns = [c for c in pandas.get("columns", []) if c.get("field_name", c.get("name")) in kept]
    arrow_types = {c["field_name"] for c in columns if str(c.get("numpy_type")).endswith("[pyarrow]")}
    by_name = [c for c in columns if c["field_name"] not in arrow_types or _pandas_parses(c["numpy_type"])]
    unparsed = {c["field_name"] for c in columns} - {c["field_name"] for c in by_name}
    pandas["columns"] = by_name
    return {**metadata, b"pandas": json.dumps(pandas).encode()}, {schema.field(name).type for name in unparsed}


def _pandas_parses(dtype: str) -> bool:
    import pandas as pd

    try:
        pd.api.types.pandas_dtype(dtype)
    except TypeError:
        return False
    return True


def job_world_size() -> int:
    """The ranks of the job this process is one of, as its launcher says (torchrun, accelerate: WORLD_SIZE)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError:
        return 1


def warn_if_one_rank_of_many(who: str, ranks: int) -> None:
    """A loader left at world_size=1 in a job of several ranks gives each rank every row: said, as it may be
    meant (every rank evaluating the whole set), though most often rank= and world_size= were forgotten."""
    if ranks > 1:
        warnings.warn(
            f"{who}(world_size=1) in a job of {ranks} ranks: every rank reads every row, each epoch {ranks} times "
            "over; pass rank= and world_size= (torch.distributed.get_rank(), get_world_size())",
            stacklevel=4,
        )


def job_rank() -> int | None:
    """This process's rank as its launcher says (torchrun, accelerate: RANK), or None."""
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


# Set while PileDataset makes a DataLoader worker's loader, whose rank and world are the job's times its workers
# (a world that may equal the launcher's, its ranks not the launcher's)
SHARE_OF_A_RANK = contextvars.ContextVar("daskpile_share_of_a_rank", default=False)


def warn_if_rank_is_not_the_launcher_s(who: str, rank: int, world_size: int) -> None:
    """A loader of the job's world size whose rank is not the one its launcher gave the process: most often
    rank= forgotten, every process rank 0, reading one share as many times and leaving the others unread."""
    launched = job_rank()
    if SHARE_OF_A_RANK.get():
        return
    if world_size > 1 and world_size == job_world_size() and launched is not None and launched != rank:
        warnings.warn(
            f"{who}(rank={rank}, world_size={world_size}) in the process its launcher made rank {launched} (RANK): "
            f"a share read by two ranks is read twice an epoch and another never; pass rank= "
            "(torch.distributed.get_rank())",
            stacklevel=4,
        )


def _positive(**values) -> list[int]:
    """The values as Python ints (numpy's would go into ``state_dict``, which ``torch.load`` then refuses)."""
    return _integers(values, 1, "a positive integer")


def _at_least_zero(**values) -> list[int]:
    return _integers(values, 0, "a non-negative integer")


def _integers(values: dict, least: int, what: str) -> list[int]:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name} must be {what}, got {value!r}")
    return [int(value) for value in values.values()]
