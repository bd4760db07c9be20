"""``shuffle``: a Dask DataFrame in, a Dask DataFrame with one partition per pile out.

The shuffle is a Dask expression, ``PileShuffle``, like Dask's own shuffles
(``dask/dataframe/dask_expr/_shuffle.py``), so Dask's optimizer sees through
it: a column projection after the shuffle is pushed below it, ``count``,
``min`` and ``max`` of the whole result skip it, and ``s.partitions[i]``
computes only pile ``i``.  Its graph, built from the input's partitions as they are after
optimization (Dask fuses the partitions of ``read_parquet`` when few columns
are read), is:

- ``daskpile-scatter`` (pass 1), one task per input partition: the partition
  as Arrow (``_pandas``), its rows sent to random piles, one scratch file;
- ``daskpile-scattered``, one task: how many partitions pass 1 saw, and the
  rows of every pile, recorded in the scratch directory's run file;
- ``daskpile-gather`` (pass 2), one task per pile: its rows from every scratch
  file, permuted, back as pandas with the input's dtypes.

Pass 1 runs once per shuffled collection: once the run file is there, a later
compute (another pile, another epoch) reads scratch without reading the input.
A projection pushed below the shuffle is another collection, with its own pass 1.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import posixpath
import threading
import time
import uuid
import warnings
import weakref

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
from dask._task_spec import Task, TaskRef
from dask.dataframe.dask_expr._expr import (
    Blockwise,
    Expr,
    PartitionsFiltered,
    Projection,
    ResetIndex,
    determine_column_projection,
)
from dask.dataframe.dask_expr._reductions import Count, Max, Min, NBytes
from dask.dataframe.dask_expr._util import _convert_to_list
from dask.dataframe.dask_expr.io.io import IO, BlockwiseIO
from dask.tokenize import tokenize

from daskpile._compute import (
    WorkerKilled,
    compute,
    current_client,
    giving_memory_back,
    in_a_worker,
)
from daskpile._random import resolve_seed
from daskpile._storage import (
    exists,
    full_url,
    is_local,
    redact,
    redacting_errors,
    type_named,
    write_bytes,
)
from daskpile._validate import check_bytes, check_piles
from daskpile._words import count
from daskpile.dataframe._pandas import FrameCodec, MetaMismatch
from daskpile.dataframe._to_parquet import write_piles
from daskpile.engine import _passes, _session, _sizing
from daskpile.engine._places import refuse_blind_workers
from daskpile.engine._scratch import Scratch, read_pile

logger = logging.getLogger("daskpile")


@redacting_errors
def shuffle(
    ddf: dd.DataFrame,
    piles: int | str = 512,
    *,
    seed: int | None = None,
    scratch: str | None = None,
    storage_options: dict | None = None,
    memory_per_pile: int | None = None,
) -> dd.DataFrame:
    """Put the rows of a Dask DataFrame into a uniformly random order.

    The result is lazy and has exactly ``piles`` partitions: partition ``j``
    is pile ``j``, already permuted, and reading the partitions in order gives
    a uniformly random permutation of all rows.  Rows keep their index values,
    as with pandas ``sample(frac=1)``, and every column keeps its dtype.  The
    same ``seed`` and pile count give the same result on any scheduler and any
    number of workers.  Runs on the current Dask client if there is one, else
    on Dask's default local scheduler (``dask.config.set(scheduler=...)`` is
    honoured).

    Parameters
    ----------
    ddf
        Any Dask DataFrame: from ``read_parquet``, ``read_csv`` or
        ``from_pandas``, after your own transformations.  A partition must fit
        in a worker's memory: let Dask split a single huge CSV or JSON file
        (``dd.read_csv(path, blocksize="64MB")``).
    piles
        The number of piles, which is the number of partitions of the result
        (at least 1), or ``"auto"``.  Default 512, not ``"auto"`` as in
        :func:`shuffle_parquet`: a Dask DataFrame's size is unknown until its
        partitions are computed, and a lazy call computes nothing.
        ``"auto"`` computes up to 3 evenly spaced partitions, now, to measure
        their size in memory, scales it by the number of partitions and picks
        the count :func:`plan_piles` returns: the fewest piles, at least 4 per
        thread (unless ``memory_per_pile`` is given: then the count depends on
        the data alone) and of 32 MiB or less on average (but not so many that
        piles hold fewer than 10,000 rows and less than 32 MiB on average),
        whose largest fits ``memory_per_pile``.
        A compute whose pass 1 sends a pile over twice that (the partitions
        measured were much smaller than the others) raises
        :class:`PileTooLargeError`, saying the pile count that fits.
    seed
        A non-negative integer; the same seed, pile count and input partitions
        give the same output.  Default None: a seed drawn from the operating
        system.
    scratch
        Where pass 1 writes its files (about the uncompressed size of the
        data): a local path or any fsspec URL, under which a fresh
        ``daskpile-<random>/`` directory is made when ``shuffle`` is called.
        Default: the local temporary directory, which the workers of a
        ``LocalCluster`` share.  Every worker must reach it: on a cluster
        whose workers share no disk, pass an object-store URL such as
        ``"s3://bucket/tmp"``.  With a local path there, the first compute
        refuses to run, before reading anything (each worker is asked whether
        it sees a probe file).  The directory is removed when the result, and
        every collection derived from it, is garbage-collected (or at exit),
        after a failed compute too (on a cluster, once the tasks it left running
        have ended: they write into it), and not before every future the client had
        pending then (a running ``persist()`` or ``client.compute()``) is done.
        A graph taken out of the result (``.values``, ``to_dask_array()``,
        ``to_delayed()``) does not keep it: keep the result while such a graph
        runs (one that outlives it says so).
    storage_options
        Passed to fsspec for ``scratch`` (credentials, endpoint).  Default
        None.
    memory_per_pile
        The bytes of memory a pile may take, for ``piles="auto"`` only (it is
        ignored with a pile count).  Default None: a quarter of a worker's
        memory limit per thread (of the smallest worker), or of the machine's
        memory per core without a cluster.

    Returns
    -------
    dask.dataframe.DataFrame
        A lazy Dask DataFrame with ``npartitions == piles`` and unknown
        divisions.  Its ``to_parquet`` writes one file per pile, each under a
        temporary name then renamed, with statistics for integer and boolean
        columns only (for their null counts), dictionary encoding for
        categorical columns only and Snappy only on the columns it shrinks,
        unless you pass those options: a pile spans nearly every value, so
        statistics let a reader skip nothing, and dictionaries of values in
        random order cost time and bytes.  Collections derived from it
        (``s[cols]``, ``s.persist()``) are plain Dask DataFrames with Dask's
        defaults; pass ``write_statistics=False, use_dictionary=False`` to
        theirs.

    Raises
    ------
    TypeError
        If ``ddf`` is not a Dask DataFrame (a Series, a pandas DataFrame).
        At compute time: a partition with a MultiIndex, or whose column cannot
        take the dtype the DataFrame's meta says without changing its values
        (floats under an int meta), naming the column.
    ValueError
        If ``piles`` or ``seed`` is not valid, or with ``piles="auto"`` if a
        row takes more than ``memory_per_pile``.  At the first compute: on a
        cluster whose workers cannot all see a local ``scratch``.

    See Also
    --------
    plan_piles : the pile count ``piles="auto"`` would choose.
    shuffle_parquet : Parquet in, Parquet out, without pandas.

    Notes
    -----
    The shuffle is a Dask expression, so Dask's optimizer works through it:
    ``shuffle(ddf)[["a", "b"]]`` reads and shuffles only ``a`` and ``b``, in
    the same order as the whole result, when ``ddf`` is made partition by
    partition (reads, filters, assignments, ``map_partitions``); below a
    shuffle, merge, ``groupby().transform``, ``set_index``, ``sort_values``
    or repartition, a projection reads the pass 1 of the whole result
    instead, since Dask may give it other partitions; ``count()``, ``min()`` and ``max()``
    of the whole result skip the shuffle; ``s.partitions[j]`` computes pile
    ``j`` only.  The dashboard shows ``daskpile-scatter`` (pass 1, a task per
    input partition), ``daskpile-scattered`` and ``daskpile-gather`` (pass 2,
    a task per pile).

    Pass 1 runs once for the life of the result: later computes of it, or of
    any of its partitions, read the scratch it wrote, not the input.  A
    projection pushed below (columns selected, or the index dropped:
    ``reset_index(drop=True)``, ``to_parquet(..., write_index=False)``) is
    another shuffle, with a pass 1 of its own over its columns only: the same
    order as the whole result if the input gives the same rows each time it
    is computed, so ``persist()`` an input that draws unseeded random numbers.
    To read the piles every epoch, write them once (``to_parquet``) and read
    the files.  A worker lost in either pass is replaced and its tasks rerun;
    the output is the same as an undisturbed run's.

    Every dtype pandas and Dask produce is kept, in empty partitions too:
    numpy numbers, bools, datetimes and timedeltas; nullable ``Int64``,
    ``boolean`` and ``Float64``; every string dtype; categoricals with known,
    unknown or no categories; tz-aware datetimes, periods, intervals;
    ``pd.ArrowDtype`` (decimal, list, struct, map, large_string, timestamp);
    named, string and range indexes.  Columns of Python objects (lists, dicts,
    bytes, times, mixed types) and the dtypes Arrow lacks (complex, sparse)
    are carried as one pickle per value: exact, a few microseconds a value.
    A partition whose columns are in another order than the meta's is taken
    by label; a column whose dtype differs from the meta's is cast to it where
    that changes no value (object strings under a string meta).

    Examples
    --------
    >>> import dask.dataframe as dd, pandas as pd
    >>> ddf = dd.from_pandas(pd.DataFrame({"x": range(10)}), npartitions=2)
    >>> shuffled = shuffle(ddf, piles=3, seed=0)
    >>> shuffled.npartitions, sorted(shuffled.compute()["x"])
    (3, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    >>> shuffle(dd.read_parquet("data/"), piles=8).to_parquet("shuffled-ddf/")
    """
    if not isinstance(ddf, dd.DataFrame):
        in_memory = hasattr(ddf, "columns") and not hasattr(ddf, "npartitions")
        series = isinstance(ddf, dd.Series)
        raise TypeError(
            f"shuffle takes a dask DataFrame, got {type_named(ddf)}"
            + (": one in memory shuffles there (pandas: df.sample(frac=1); Polars: df.sample(fraction=1, "
               "shuffle=True)), or give the files it was written to to shuffle_parquet" if in_memory else "")
            + (": shuffle series.to_frame(), then take its column" if series else "")
        )  # fmt: skip
    if isinstance(ddf._meta.index, pd.MultiIndex):  # (a groupby of several keys): refused now, not at compute
        raise TypeError(
            f"daskpile cannot shuffle a DataFrame with a MultiIndex ({list(ddf._meta.index.names)}): "
            "make its levels columns first (ddf.reset_index())"
        )
    memory_per_pile = check_bytes("memory_per_pile", memory_per_pile)
    plan = None
    if piles == "auto":
        plan = plan_piles(ddf, memory_per_pile)
        logger.info("piles='auto': %s", plan)
        piles = plan.piles
    piles = check_piles(piles, auto_allowed=True)
    _passes.refuse_piles_beyond_their_counts(piles, ddf.npartitions, f"{ddf.npartitions:,} partitions")
    if piles > MANY_PARTITIONS and plan is None:  # (a new user's piles=10**6 on 1,000 rows: 8 min, 4.6 GB, no word)
        warnings.warn(
            f"piles={piles:,}: each pile is a partition of the result, and a task of each of its computations; "
            "Dask's scheduler runs a few hundred tasks a second (20,000 piles took 48 s on 2 cores): did you "
            "mean fewer? (piles='auto' sizes them from the data)",
            stacklevel=3,  # (the caller's line, through redacting_errors)
        )
    run = ScratchRun(Scratch.create(scratch, storage_options, 0))
    _session.mark(run.scratch.fs, run.scratch.directory, run.session)
    _remove_scratch_of_ended_sessions(run.scratch)
    return PileFrame(PileShuffle(ddf.expr, piles, resolve_seed(seed), run, ddf._meta, plan=plan))


MANY_PARTITIONS = 50_000  # piles beyond which shuffle warns of the result's partitions and tasks


class PileFrame(dd.DataFrame):
    """The Dask DataFrame ``shuffle`` returns: a plain one, whose ``to_parquet`` writes piles as piles.

    A pile is a uniform sample of the whole dataset: its min/max statistics
    span nearly every value, so they let a reader skip nothing, and dictionary
    encoding of values in random order makes files larger, not smaller.  So,
    unless given, ``to_parquet`` writes no statistics, dictionary-encodes only
    categorical columns and compresses with Snappy only the columns it shrinks,
    as ``shuffle_parquet`` does (``PileParquetEngine``); on dataset A that
    halves the time of pyarrow's write (0.42 against 0.21 s a million rows).
    Any option given to ``to_parquet`` wins.
    """

    @property
    def seed(self) -> int:
        """The seed of the shuffle: the one given, or the one drawn for ``seed=None`` (to shuffle alike again).

        >>> import dask.dataframe as dd, pandas as pd
        >>> shuffle(dd.from_pandas(pd.DataFrame({"x": range(4)}), npartitions=2), piles=2, seed=7).seed
        7
        """
        return next(iter(self.expr.find_operations(PileShuffle))).seed

    @redacting_errors
    def to_parquet(self, path, *, compute: bool = True, compute_kwargs: dict | None = None, **kwargs):
        shuffled = next(iter(self.expr.find_operations(PileShuffle)))
        return write_piles(self, path, shuffled.seed, shuffled.piles, compute, compute_kwargs, **kwargs)


class ScratchRun:
    """The scratch directory of one ``shuffle`` call, removed when the last expression holding it is gone.

    Every expression derived from the call holds this object; its tasks hold a
    ``borrowed`` copy.  Each set of columns shuffled (a projection pushed below the shuffle
    is a pass 1 of its own) writes in a subdirectory (``variant``); a selection
    of piles shares its shuffle's.  A pickled copy (the scheduler builds the
    graph from a pickled expression; workers run tasks) removes nothing.
    """

    def __init__(self, scratch: Scratch, owner: bool = True):
        self.scratch = scratch
        self._checked_clients: set[str] = set()
        self._removal = weakref.finalize(self, _remove_when_unused, scratch) if owner else None
        # (taken once: a forked child that makes the folder again must record its parent, which holds it)
        self.session = _session.Session.this_one() if owner else None

    def __reduce__(self):
        return ScratchRun, (self.scratch, False)

    def borrowed(self) -> ScratchRun:
        """The same directory, owned by someone else: what tasks hold."""
        return ScratchRun(self.scratch, owner=False)

    def __dask_tokenize__(self):
        return ("daskpile.ScratchRun", self.scratch.directory)

    def __repr__(self) -> str:
        return f"ScratchRun({self.scratch.directory!r})"

    def gone(self) -> FileNotFoundError:
        """What a task says when its run's scratch directory is gone (its owner removed it)."""
        return FileNotFoundError(
            f"daskpile's scratch {self.scratch.directory} is gone: the shuffled DataFrame whose graph this is "
            "(taken out with .values, to_dask_array(), to_delayed() or dask.delayed) was dropped, and its "
            "scratch with it; keep the shuffled DataFrame in a variable while such a graph runs (or something "
            "removed it: daskpile clean, a cleaner of the temporary directory)"
        )

    def variant(self, token: str, partitions: int = 0) -> Scratch:
        """The scratch of one set of columns shuffled, with ``partitions`` files once pass 1 is done."""
        return Scratch(self.scratch.fs, posixpath.join(self.scratch.directory, token), partitions)

    def restore_if_removed(self) -> None:
        """The directory made again if something removed it while the result lives (``daskpile clean``, a
        cleaner of the temporary directory): pass 1 then runs again.  It draws the same piles from an input
        that gives the same rows, as any compute of a Dask collection recomputes its input.

        Only by the owner: a copy (pickled) whose owner is gone and removed the scratch must not bring back
        what nothing would remove again.  The directory's parent is not made: a scratch root that went
        (an unmounted disk) is an error, not a directory on the disk beneath.
        """
        fs, directory = self.scratch.fs, self.scratch.directory
        fs.invalidate_cache(directory)  # (a store's listing cached before something removed it)
        if exists(fs, directory):
            return
        if self._removal is None or not self._removal.alive:
            raise FileNotFoundError(
                f"daskpile's scratch {directory} is gone: the result this one was copied from was dropped, and "
                "its scratch with it; compute the result itself, or call daskpile.shuffle again"
            )
        try:
            fs.mkdir(directory, create_parents=False)
            _session.mark(fs, directory, self.session)  # (or, this session killed, nothing would remove it)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"daskpile's scratch {directory} was removed, and so was the directory it was in; pass another "
                "scratch= to daskpile.shuffle"
            ) from None

    def check_workers_see_it(self) -> None:
        """Refuse, before anything runs, a cluster whose workers cannot all see local scratch."""
        client = current_client()
        if client is None or client.id in self._checked_clients:
            return
        fs, directory = self.scratch.fs, self.scratch.directory
        refuse_blind_workers(fs, directory, f"daskpile's scratch directory {full_url(fs, directory)}",
                             "scratch='s3://bucket/prefix' (with storage_options)")  # fmt: skip
        self._checked_clients.add(client.id)


RUN_FILE = "_scattered.json"  # written once pass 1 has finished: partitions seen and rows per pile


class PileShuffle(PartitionsFiltered, Expr):
    """The two-pass pile shuffle of ``frame`` into ``piles`` partitions, as a Dask expression.

    This is the logical expression the optimizer simplifies (projections go
    below it, reductions that ignore order skip it, a selection of partitions
    becomes ``_partitions``); lowering turns it into the three physical ones:
    ``ScatterPartitions`` (Blockwise, so Dask fuses it with the task that makes
    each partition), ``ScatterSummary`` (one task), and ``GatherPiles``
    (Blockwise, so Dask fuses what follows a pile, such as ``to_parquet``).
    """

    # ``meta`` is the input's, taken on the client: the scheduler, which builds the graph from a pickled
    # expression, may infer another (Dask's string conversion is the client's setting).
    # ``keep_index=False``: the index is not carried (each pile gets a RangeIndex), for a parent that drops it.
    # ``plan``: that of ``piles="auto"``, whose budget pass 1 checks the piles against; None for a pile count.
    _parameters = ["frame", "piles", "seed", "run", "meta", "keep_index", "plan", "_partitions"]  # noqa: RUF012
    _defaults = {"keep_index": True, "plan": None, "_partitions": None}  # noqa: RUF012

    @property
    def _funcname(self) -> str:
        return "daskpile-shuffle"

    def __str__(self) -> str:
        return f"PileShuffle(piles={self.piles}, seed={self.seed})"

    def _node_label_args(self):
        return [self.frame, self.piles, self.seed]

    @property
    def _meta(self):
        return self.operand("meta")

    def _divisions(self):
        return (None,) * (self.piles + 1)

    def _simplify_up(self, parent, dependents):
        if isinstance(parent, Projection) and _partitions_keep_their_rows(self.frame):
            # Move the projection below the shuffle: a pile's rows do not depend on the columns.
            columns = _convert_to_list(determine_column_projection(self, parent, dependents))
            wanted = [c for c in self.frame.columns if c in columns]
            if len(wanted) < len(self.frame.columns):
                # Below AsBuilt when the shuffle was tuned already (set_index takes quantiles of an optimized
                # collection's column): the projected input must stay untuned, and be the one pass 1 reads.
                built = isinstance(self.frame, AsBuilt)
                frame = self.frame.frame[wanted] if built else self.frame[wanted]
                frame = AsBuilt(frame) if built else frame
                projected = self.substitute_parameters({"frame": frame, "meta": frame._meta})
                return projected[parent.operand("columns")]
        if isinstance(parent, ResetIndex) and parent.drop and self.keep_index:
            # ``to_parquet(write_index=False)`` and ``reset_index(drop=True)`` drop the index: pass 1 need not
            # carry it (8 bytes a row of dataset A's 50 in scratch, for a RangeIndex).  The rows keep their order.
            return type(parent)(self.substitute_parameters({"keep_index": False}), *parent.operands[1:])
        if isinstance(parent, (Count, NBytes, Min, Max)) and not self._filtered:
            return type(parent)(self.frame, *parent.operands[1:])  # the order of all rows does not matter to these
        return None

    def _tune_down(self):
        if not isinstance(self.frame, AsBuilt):
            return self.substitute_parameters({"frame": AsBuilt(self.frame)})
        return None

    def _lower(self):
        """The physical expressions; runs on the client, where Dask optimizes (the scheduler may not see scratch)."""
        self.run.check_workers_see_it()
        frame = self.frame.frame if isinstance(self.frame, AsBuilt) else self.frame
        # What the scratch depends on (not which piles are wanted): its subdirectory and task names.
        variant = tokenize(frame._name, self.piles, self.seed, self.keep_index)
        codec = FrameCodec(self._meta, self.keep_index)
        self.run.restore_if_removed()
        scattered = _read_run_file(self.run.variant(variant))  # pass 1 already ran for this shuffle
        if scattered is not None and not _all_there(self.run.variant(variant, scattered["partitions"])):
            scattered = None  # files of it were removed since: pass 1 runs again
        if scattered is None:
            scatter = ScatterPartitions(frame, self.piles, self.seed, self.run, variant, codec)
            scattered = ScatterSummary(scatter, self.piles, self.run, variant, self.operand("plan"))
        return GatherPiles(scattered, self.piles, self.seed, self.run, variant, codec, self.operand("_partitions"))


def _partitions_keep_their_rows(frame: Expr) -> bool:
    """Whether a projection of ``frame`` has the rows of its partitions, in their order: ``frame`` is made
    partition by partition from its inputs (reads, ``persist()``-ed or ``from_delayed`` partitions, then
    Blockwise expressions only: filters, assignments, ``map_partitions``).

    Below anything else (a shuffle, a merge, a ``groupby().transform``, ``set_index``, ``sort_values``, a
    repartition) Dask's optimizer may give a projection other partitions: a column that needs no
    ``groupby().transform`` loses the shuffles that aligned the frame to it.  Pass 1 keys its draws by
    partition, so ``s[["x"]]`` and ``s["y"]`` would come out in other orders, misaligned row by row.  There
    the projection stays above the shuffle: every projection reads the pass 1 of the whole result, and
    ``s[["x"]]`` and ``s["y"]`` are its columns, in its order, even from an input whose ties
    (``sort_values``) come out in another order each time.
    """
    return all(isinstance(node, (Blockwise, IO, AsBuilt)) or not node.dependencies() for node in frame.walk())


class ScatterPartitions(Blockwise):
    """Pass 1: a task per input partition, writing its scratch file; its output is the pile counts."""

    _parameters = ["frame", "piles", "seed", "run", "variant", "codec"]  # noqa: RUF012

    @property
    def _name(self) -> str:
        return f"daskpile-scatter-{self.deterministic_token}"

    @functools.cached_property
    def _meta(self):
        return {}  # a dict per partition

    def _divisions(self):
        return (None,) * (self.frame.npartitions + 1)

    def _task(self, name, index: int) -> Task:
        frame, run = TaskRef((self.frame._name, index)), self.run.borrowed()
        return Task(name, scatter_partition, frame, index, self.piles, self.seed, run, self.variant, self.codec)


class ScatterSummary(Expr):
    """The end of pass 1: which partitions it saw, the rows of every pile, recorded in the run file."""

    _parameters = ["scatter", "piles", "run", "variant", "plan"]  # noqa: RUF012

    @property
    def _name(self) -> str:
        return f"daskpile-scattered-{self.deterministic_token}"

    @functools.cached_property
    def _meta(self):
        return {}  # not a frame: ndim 0, so that GatherPiles broadcasts it to every pile

    def _divisions(self):
        return (None, None)

    def _layer(self) -> dict:
        """The partitions' pile counts summed ``SUM_FAN_IN`` at a time, in a tree: one task holding every
        partition's (16 bytes a pile each) would hold 5 GiB for 10,000 partitions and 32,768 piles."""
        layer = {}

        def summed(depth: int, index: int, children: list) -> TaskRef:
            key = (f"{self._name}-sum-{depth}", index)
            layer[key] = Task(key, summed_scatter, *children)
            return TaskRef(key)

        parts = [TaskRef((self.scatter._name, k)) for k in range(self.scatter.npartitions)]
        key = (self._name, 0)
        few = _passes.summed_to_a_few(parts, summed)
        layer[key] = Task(key, finish_scatter, self.run.borrowed(), self.variant, self.piles, self.plan, *few)
        return layer


class GatherPiles(PartitionsFiltered, BlockwiseIO):
    """Pass 2: a task per pile, from ``scattered``, a ``ScatterSummary`` or what a finished pass 1 recorded."""

    _parameters = ["scattered", "piles", "seed", "run", "variant", "codec", "_partitions"]  # noqa: RUF012
    _defaults = {"_partitions": None}  # noqa: RUF012

    @property
    def _name(self) -> str:
        return f"daskpile-gather-{self.deterministic_token}"

    def __str__(self) -> str:
        return f"GatherPiles(piles={self.piles}, seed={self.seed})"

    @property
    def _meta(self):
        return self.codec.meta

    def _divisions(self):
        return (None,) * (self.piles + 1)

    def _filtered_task(self, name, pile: int) -> Task:
        scattered = self.scattered
        summary = TaskRef((scattered._name, 0)) if isinstance(scattered, Expr) else scattered
        return Task(name, gather_partition, summary, self.run.borrowed(), self.variant, pile, self.seed, self.codec)


class AsBuilt(Expr):
    """A shuffle's input with its partitions as the user built them: out of reach of Dask's tuning.

    Dask's tuning fuses the partitions of ``read_parquet`` (and other inputs)
    when few columns are read, so ``s[["a"]]`` would see fewer, larger
    partitions than ``s``, draw other piles, and give ``a`` in another order
    than ``s["a"]``: pass 1 keys its draws by partition, so it must see the
    same partitions whatever columns are projected.  Undoing the fusion
    after the fact left what tuning had aligned to it (a ``Repartition`` to
    the fused count beside a filter: "Mismatched divisions"); here the
    input is simply not tuned.  Dask's other stages (simplifying, lowering)
    go through it.
    """

    _parameters = ["frame"]  # noqa: RUF012

    @functools.cached_property
    def _meta(self):
        return self.frame._meta

    def _divisions(self):
        return self.frame._divisions()

    def rewrite(self, kind: str, rewritten):
        return self if kind == "tune" else super().rewrite(kind, rewritten)

    def _lower(self):
        return self.frame  # tuning is over once lowering starts: nothing is left to keep out


# The tasks take a borrowed ScratchRun, which removes nothing: a scheduler in this process (a LocalCluster's)
# keeps tasks after they ran, and an owner in them would keep the scratch as long.  So a graph taken out of
# the collection (``to_delayed()``) needs the collection kept while it runs.


@redacting_errors  # (raised in a worker: redacted before it is sent to the client)
@giving_memory_back
def scatter_partition(
    frame: pd.DataFrame, partition: int, piles: int, seed: int, run: ScratchRun, variant: str, codec: FrameCodec
) -> dict:
    """Pass 1 for one partition: its rows to scratch, grouped by pile."""
    scratch = run.variant(variant)
    if is_local(scratch.fs):
        # Not makedirs: a task still running after its run's scratch was removed must not bring it back.
        try:
            scratch.fs.mkdir(scratch.directory, create_parents=False)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise run.gone() from None
    try:
        table = codec.to_arrow(frame)
    except MetaMismatch as e:  # (which of hundreds: a trial could not tell)
        raise MetaMismatch(f"{e} (found in partition {partition})") from None
    result = _passes.scatter_table(table, partition, piles, seed, scratch)
    return {"partition": partition, "counts": result.counts, "pile_bytes": result.pile_bytes}


def summed_scatter(*results: dict) -> dict:
    """Pass-1 results (``scatter_partition``'s, or sums of them) as one: partitions counted, pile counts summed.

    >>> summed_scatter({"counts": np.array([1, 2]), "pile_bytes": np.array([8, 16])}, {"partitions": 2,
    ...     "counts": np.array([3, 0]), "pile_bytes": np.array([24, 0])})["counts"].tolist()
    [4, 2]
    """
    return {
        "partitions": sum(r.get("partitions", 1) for r in results),
        "counts": np.sum([r["counts"] for r in results], axis=0),
        "pile_bytes": np.sum([r["pile_bytes"] for r in results], axis=0),
    }


@redacting_errors
def finish_scatter(run: ScratchRun, variant: str, piles: int, plan: _sizing.PilePlan | None, *results: dict) -> dict:
    """What pass 1 did, as the partitions it saw at run time, recorded for later computes to reuse."""
    total = summed_scatter(*results)
    scratch = run.variant(variant, total["partitions"])
    rows = total["counts"]
    if plan is not None:
        _refuse_piles_over_their_plan(plan, total["pile_bytes"], rows)
    # "id": this pass 1's, so that pass 2 reads its files, not those of one before whose scratch was removed
    scattered = {"partitions": total["partitions"], "rows_per_pile": [int(n) for n in rows], "id": uuid.uuid4().hex}
    # Local scratch only: on an object store every worker sees every object, and this would be a request a file.
    missing = [p for p in scratch.paths() if not exists(scratch.fs, p)] if is_local(scratch.fs) else []
    if missing:
        # Workers that see other disks were refused when the graph was built (check_workers_see_it), but
        # for one that joined the cluster since
        also = (
            ""
            if not in_a_worker()
            else "; or a worker that joined the cluster since shares no disk with the others: then pass "
            "scratch='s3://bucket/prefix' (with storage_options) or a path every worker shares"
        )
        raise FileNotFoundError(
            f"pass 1 wrote {len(missing)} scratch files that are gone (e.g. {missing[0]}): removed while the "
            f"shuffle ran (by daskpile clean, or a cleaner of the temporary directory): compute again{also}"
        )
    write_bytes(scratch.fs, posixpath.join(scratch.directory, RUN_FILE), json.dumps(scattered).encode())
    return scattered


def _all_there(scratch: Scratch) -> bool:
    """Whether every file of a finished pass 1 is still in scratch: one listing, not a cached one."""
    paths = scratch.paths()
    return len(_passes.existing(scratch.fs, paths)) == len(paths)


# Pass 2 holds a pile several times over (read, permuted, made pandas); at twice the budget, a quarter of a
# worker thread's memory by default, that nears the worker's limit
OVER_PLAN = 2


def _refuse_piles_over_their_plan(plan: _sizing.PilePlan, pile_bytes: np.ndarray, rows: np.ndarray) -> None:
    """``piles="auto"`` measured a few partitions; when the others are much larger, a pile is over its budget,
    and pass 2 would load it whole: said now, with the pile count that fits, rather than by a worker killed."""
    largest = int(np.argmax(pile_bytes))
    if pile_bytes[largest] <= OVER_PLAN * plan.memory_per_pile:
        return
    fits = math.ceil(1.25 * int(pile_bytes.sum()) / plan.memory_per_pile)
    raise _sizing.PileTooLargeError(
        f"piles='auto' planned {count(plan.piles, 'pile')} for about {count(plan.rows, 'row')} "
        f"({_sizing.human_size(plan.bytes)}), measured on a few partitions, but pass 1 sent pile {largest} "
        f"{count(int(rows[largest]), 'row')}, {_sizing.human_size(pile_bytes[largest])}, more than twice the "
        f"{_sizing.human_size(plan.memory_per_pile)} a pile was planned to fit: the partitions measured were smaller "
        f"than the others. Pass piles={fits} (or more), or a larger memory_per_pile"
    )


def _read_run_file(scratch: Scratch) -> dict | None:
    try:
        with scratch.fs.open(posixpath.join(scratch.directory, RUN_FILE), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


@redacting_errors
@giving_memory_back
def gather_partition(
    scattered: dict, run: ScratchRun, variant: str, pile: int, seed: int, codec: FrameCodec
) -> pd.DataFrame:
    """Pass 2 for one pile: its rows from every scratch file, permuted, as pandas with the input's dtypes."""
    scratch = run.variant(variant, scattered["partitions"])
    try:
        batches = read_pile(scratch, pile, scattered.get("id"))  # (no empties)
    except FileNotFoundError:
        if not exists(scratch.fs, run.scratch.directory):
            raise run.gone() from None
        raise
    try:
        table = _passes.gather_table(batches, pile, seed)
    except _passes.TypesDisagree as e:  # (scratch names the columns by position)
        raise TypeError(e.said(codec.label(e.column))) from None
    expected = scattered["rows_per_pile"][pile]
    if table.num_rows != expected:
        raise RuntimeError(f"pile {pile} has {table.num_rows} rows, pass 1 sent it {expected}")
    return codec.to_pandas(table)


def _remove_when_unused(scratch: Scratch) -> None:
    """Remove a run's scratch, once what the client is still computing is done, on a thread of its own.

    The result may be gone while a ``persist()`` or ``client.compute()`` of it
    still runs; the futures of those need not name the shuffle (a compute's
    future is the key of the concatenated result), so every future of the
    client pending at this moment is waited for.  Runs from the garbage
    collector, in whatever thread it ran in: that thread may hold a lock the
    removal's requests need (an S3 server's, in the same process; a client's
    event loop), so the removal never runs in it, but at exit, where a thread
    would not finish.  An exception is only a warning.
    """
    client = current_client()
    try:
        pending = [] if client is None else [k for k, f in list(client.futures.items()) if f.status == "pending"]
        if pending:
            from distributed import Future  # with a client, distributed is imported already

        futures = [Future(key, client) for key in pending]
    except Exception:  # a closing client, or the interpreter's exit: nothing can still need scratch
        futures = []

    def remove_after():
        try:
            _wait_for_pending(futures)
        finally:
            _remove_quietly(scratch)
            _REMOVALS.discard(threading.current_thread())

    if not threading.main_thread().is_alive():  # the interpreter's exit
        remove_after()
        return
    # A daemon thread, so that futures that never finish cannot hold the interpreter's exit for ever; but one
    # started just before exit (a script's last line) is waited for there, up to REMOVAL_AT_EXIT_SECONDS, or it
    # dies with the scratch half removed
    thread = threading.Thread(target=remove_after, name="daskpile-remove-scratch", daemon=True)
    _REMOVALS.add(thread)
    thread.start()


def _remove_scratch_of_ended_sessions(scratch: Scratch) -> None:
    """Remove, on a thread of its own, the scratch that ``shuffle`` calls of sessions that have ended (killed,
    as a notebook's kernel out of memory is) left beside ``scratch``, in a local directory: once a process for
    each directory.

    The scratch of a session that ends normally goes at its exit; a killed one's stayed for ever, as large as
    its data, until the disk was full.  The thread is not waited for at exit: a removal cut short leaves the
    session's record, removed last, and the next sweep finishes it.
    """
    root = posixpath.dirname(scratch.directory)
    if not is_local(scratch.fs) or root in _SWEPT:  # (a store's prefix: ``daskpile clean`` lists it)
        return
    _SWEPT.add(root)

    def sweep():
        for path, session in _session.ended_sessions(root):
            logger.info(
                "removing %s, the scratch of shuffle(ddf) in %s, which ended without removing it", path, session
            )
            _session.remove(path)

    threading.Thread(target=sweep, name="daskpile-remove-ended-scratch", daemon=True).start()


_SWEPT: set[str] = set()  # the scratch roots swept by this process


def _wait_for_pending(futures: list) -> None:
    """Wait until none of ``futures`` is pending.  distributed's ``wait`` raises once one is cancelled (a
    notebook's ``future.cancel()``, a client closed), where the others may still run on the scratch."""
    from distributed import wait

    while futures:
        try:
            wait(futures)
            return
        except Exception:  # (cancelled: nothing of it to wait for)
            pending = [f for f in futures if f.status == "pending"]
            if len(pending) == len(futures):  # (not a cancelled one: waiting again would raise again)
                return
            futures = pending


_REMOVALS: set[threading.Thread] = set()
REMOVAL_AT_EXIT_SECONDS = 60


@atexit.register
def _finish_removals() -> None:
    deadline = time.monotonic() + REMOVAL_AT_EXIT_SECONDS
    for thread in list(_REMOVALS):
        thread.join(max(0.0, deadline - time.monotonic()))


def _remove_quietly(scratch: Scratch) -> None:
    try:
        scratch.remove()
    except Exception as e:
        said = f"daskpile could not remove its scratch directory {scratch.directory!r}: {e}"
        warnings.warn(redact(said), stacklevel=1)


SAMPLED_PARTITIONS = 3


@redacting_errors
def plan_piles(ddf: dd.DataFrame, memory_per_pile: int | None = None) -> _sizing.PilePlan:
    """The pile count ``shuffle(ddf, piles="auto")`` would choose, without shuffling.

    Computes up to 3 evenly spaced partitions of ``ddf`` to measure their
    rows and their size in memory (``memory_usage(deep=True)``, index
    included), scales both by the number of partitions, and plans the fewest
    piles, at least 4 per thread of the current client (or of this machine)
    unless ``memory_per_pile`` is given (then the count depends on the data
    alone, for the same output on any cluster), and of 32 MiB or less on average (larger piles permute slower), such
    that a pile of mean size plus 6 standard deviations fits
    ``memory_per_pile``.  Piles never hold fewer than 10,000 rows and
    less than 32 MiB on average, for the sake of parallelism: 200 rows
    make one pile.

    Parameters
    ----------
    ddf
        The Dask DataFrame to be shuffled.
    memory_per_pile
        The bytes of memory a pile may take.  Default None: a quarter of a
        worker's memory limit per thread (of the smallest worker), or of the
        machine's memory per core without a cluster.

    Returns
    -------
    ~daskpile.engine._sizing.PilePlan
        The plan: ``piles``, and the estimated ``rows`` and ``bytes`` and the
        ``memory_per_pile`` it was made with.

    Raises
    ------
    ValueError
        If a row takes more than ``memory_per_pile``, or the data needs more
        than 65,535 piles.

    Examples
    --------
    >>> import dask.dataframe as dd, pandas as pd
    >>> ddf = dd.from_pandas(pd.DataFrame({"x": range(10_000)}), npartitions=4)
    >>> plan = plan_piles(ddf, memory_per_pile=2**14)
    >>> plan.piles, plan.rows
    (6, 10000)
    """
    memory_per_pile = check_bytes("memory_per_pile", memory_per_pile)
    n = ddf.npartitions
    picks = sorted({round(i * (n - 1) / max(SAMPLED_PARTITIONS - 1, 1)) for i in range(min(SAMPLED_PARTITIONS, n))})
    token = tokenize(ddf._name, picks)
    measures = [
        dask.delayed(_frame_size)(ddf.get_partition(i).to_delayed()[0], dask_key_name=f"daskpile-measure-{token}-{i}")
        for i in picks
    ]
    try:
        sizes = compute(measures)
    except WorkerKilled as e:  # (the task killed may be the partition's own, or the measure fused with it)
        killed = WorkerKilled(
            f"the workers computing partitions {', '.join(map(str, picks))} of {n} of the DataFrame, to measure them "
            "for piles='auto', died, most likely out of memory (a partition is computed whole): give the workers "
            "more memory, make the partitions smaller (ddf.repartition(partition_size='100MB')), or give a pile "
            "count (piles=N), which measures nothing"
        )
        killed.key = e.key
        raise killed from e
    if len(picks) < n and not any(rows for rows, _ in sizes):  # (a filter that keeps a range of sorted data)
        raise ValueError(
            f"piles='auto': the {len(picks)} partitions measured ({', '.join(map(str, picks))} of {n}) hold no "
            "rows, so the DataFrame's size cannot be estimated from them: give piles=N, or write the data first"
        )
    rows = round(np.mean([r for r, _ in sizes]) * n)
    data_bytes = round(np.mean([b for _, b in sizes]) * n)
    return _sizing.plan_for_cluster(rows, data_bytes, memory_per_pile)


def _frame_size(frame: pd.DataFrame) -> tuple[int, int]:
    return len(frame), int(frame.memory_usage(deep=True, index=True).sum())
