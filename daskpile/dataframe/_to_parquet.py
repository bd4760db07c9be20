"""``shuffle(ddf).to_parquet``: Dask's writer, its piles written as ``shuffle_parquet`` writes them, and, on a
local file system, shown together.

Dask's writer writes each partition under its final name as its task ends: a
run that fails, or is interrupted, half-way leaves half of the piles, which
every Parquet reader (``PileLoader`` too) then reads as the whole dataset, and
tasks still running after the error reached the user go on writing. Here each
pile is written under a hidden temporary name (readers skip names starting with
``.``), and the write's final task, which runs once every pile is written,
renames them all: a run that does not finish shows no pile. On an object
store, where a rename is a copy, the piles are written under their final names,
as Dask writes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import uuid

import dask.dataframe as dd
import pandas as pd
import pyarrow.parquet as pq
from dask.dataframe.dask_expr._collection import new_collection
from dask.dataframe.dask_expr.io.parquet import ToParquet, ToParquetBarrier, ToParquetData
from dask.dataframe.io.parquet.arrow import ArrowDatasetEngine, _index_in_schema

from daskpile._storage import TEMPORARY_SUFFIX, atomic_sink, is_local
from daskpile.engine import _manifest, _passes

SNAPPY_WHERE_IT_PAYS = "daskpile: snappy where it pays"  # PileFrame.to_parquet's default compression
_SHOWN_AT_THE_END = "daskpile_shown_at_the_end"  # the write's key of its temporary names' token


def write_piles(frame, path, seed: int, piles: int, compute: bool, compute_kwargs: dict | None, **kwargs):
    """``PileFrame.to_parquet``: Dask's ``to_parquet`` of ``frame`` (a ``shuffle`` result of ``seed`` and
    ``piles``), with daskpile's defaults for piles (see ``PileFrame``) and its piles shown together."""
    categorical = [str(c) for c, t in frame._meta.dtypes.items() if isinstance(t, pd.CategoricalDtype)]
    counted = _null_counted(frame._meta, kwargs.get("write_index", True))
    kwargs.setdefault("write_statistics", counted or False)
    kwargs.setdefault("use_dictionary", categorical or False)
    if kwargs.get("engine", "auto") in ("auto", "pyarrow"):  # Dask's names of the engine this one extends
        kwargs["engine"] = PileParquetEngine
    if isinstance(kwargs["engine"], type) and issubclass(kwargs["engine"], PileParquetEngine):
        kwargs.setdefault("compression", SNAPPY_WHERE_IT_PAYS)
    stamp = json.dumps({"seed": seed, "piles": piles}).encode()
    kwargs["custom_metadata"] = {_manifest.SHUFFLE_METADATA_KEY: stamp, **(kwargs.get("custom_metadata") or {})}
    write = dd.DataFrame.to_parquet(frame, path, compute=False, **kwargs)  # (Dask's own)
    (dask_write,) = write.expr.find_operations(ToParquet)
    shown_at_the_end = _shows_at_the_end(dask_write)
    if shown_at_the_end:
        # The token reaches PileParquetEngine.write_partition among the writer's options, and the piles it
        # writes under it are what ShowPiles, which replaces Dask's final task, renames
        token = uuid.uuid4().hex[:12]
        operands = dict(zip(dask_write._parameters, dask_write.operands, strict=True))
        operands["write_kwargs"] = {**operands["write_kwargs"], _SHOWN_AT_THE_END: token}
        write = new_collection(PileToParquet(*operands.values()))
        # (what an earlier write of these names left, failed with compute=False or still running at its error)
        _remove_temporaries(dask_write.path, _file_names(dask_write))
    # Fused as ``persist()`` fuses: ``compute()`` does not (Dask 2026.8 optimizes what it computes
    # without blockwise fusion), so reading a partition, its pass 1, and a pile's pass 2, index reset
    # and write would each be a task of its own: 274 tasks for dataset A in 64 piles instead of 106.
    write = new_collection(write.expr.optimize(fuse=True))
    if not compute:
        return write
    try:
        return write.compute(**(compute_kwargs or {}))
    except BaseException:
        if shown_at_the_end:  # (a pile task still running may write one more, hidden, after this)
            _remove_temporaries(dask_write.path, _file_names(dask_write))
        raise
    finally:
        dask_write.fs.invalidate_cache(dask_write.path)  # as Dask's to_parquet does after writing


def _shows_at_the_end(dask_write: ToParquet) -> bool:
    """Whether the piles are written under temporary names and renamed together: by daskpile's engine, on a
    local file system, one file per pile (``partition_on`` is Dask's engine's)."""
    engine = dask_write.engine
    ours = isinstance(engine, type) and issubclass(engine, PileParquetEngine)
    return ours and is_local(dask_write.fs) and not dask_write.partition_on


def _file_names(dask_write: ToParquet) -> list[str]:
    """The names of the files of a write, as Dask's writer gives them (``ToParquetFunctionWrapper``)."""
    numbers = range(dask_write.offset, dask_write.offset + dask_write.frame.npartitions)
    name = dask_write.name_function
    return [f"part.{i}.parquet" if name is None else name(i) for i in numbers]


class PileToParquet(ToParquet):
    """Dask's ``ToParquet``, whose final task renames the piles written under temporary names."""

    def _lower(self):
        return ShowPiles(ToParquetData(*self.operands), *self.operands[1:])


class ShowPiles(ToParquetBarrier):
    """The final task of a ``PileToParquet``: every pile renamed to its name, then Dask's ``_metadata``
    file where asked for."""

    def _layer(self):
        compression = self.write_kwargs.get("compression")
        task = (show_piles, self.frame.__dask_keys__(), self.fmd, self.fs, self.path, self.engine,
                self.write_metadata_file, self.append, compression)  # fmt: skip
        return {(self._name, 0): task}


def show_piles(parts, fmd, fs, path, engine, write_metadata_file, append, compression) -> None:
    """Rename every pile written under a temporary name (``parts``: what each pile's task returned), then write
    Dask's ``_metadata`` where asked for.  Run again (a retried task), a pile already shown is left as it is."""
    for part in parts:
        for pile in part:
            temporary, final = pile["shown_as"]
            if os.path.exists(temporary) or not os.path.exists(final):
                os.replace(temporary, final)
    if write_metadata_file:
        parts = [[{k: v for k, v in pile.items() if k != "shown_as"} for pile in part] for part in parts]
        engine.write_metadata(parts, fmd, fs, path, append=append, compression=compression)


def _temporary_name(filename: str, token: str) -> str:
    """Where a pile of ``filename`` (a name_function's may have folders) is written until it is shown."""
    folder, name = posixpath.split(filename)
    return posixpath.join(folder, f".{name}.{token}{TEMPORARY_SUFFIX}")


def _remove_temporaries(path: str, names: list[str]) -> None:
    """The piles of ``names`` a write left under temporary names (of any token), best effort."""
    by_folder: dict[str, set[str]] = {}
    for name in names:
        folder, base = posixpath.split(name)
        by_folder.setdefault(posixpath.join(path, folder), set()).add(base)
    temporary = re.compile(rf"\.(.+)\.[0-9a-f]{{12}}{re.escape(TEMPORARY_SUFFIX)}")
    for folder, bases in by_folder.items():
        with contextlib.suppress(OSError):
            for entry in os.listdir(folder):
                matched = temporary.fullmatch(entry)
                if matched and matched.group(1) in bases:
                    with contextlib.suppress(OSError):
                        os.remove(posixpath.join(folder, entry))


def _null_counted(meta: pd.DataFrame, write_index: bool) -> list[str]:
    """The columns ``to_parquet`` writes statistics of, for their null counts (``PileLoader`` gives a column with
    a null in any file one dtype in every batch): integers and booleans, the index too as Dask writes it.

    >>> _null_counted(pd.DataFrame({"x": [1], "s": ["a"]}, index=pd.Index([7], name="user")), write_index=True)
    ['x', 'user']
    """

    def counts(dtype) -> bool:
        return pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)

    counted = [str(name) for name, dtype in meta.dtypes.items() if counts(dtype)]
    if write_index and counts(meta.index.dtype):
        counted.append("__null_dask_index__" if meta.index.name is None else str(meta.index.name))  # as Dask names it
    return counted


class PileParquetEngine(ArrowDatasetEngine):
    """Dask's pyarrow engine, writing each pile as ``shuffle_parquet`` writes one.

    The files hold what Dask's own engine writes (the same table, schema and
    pandas metadata); two things differ in how they are written:

    - through ``atomic_sink``: a local file is written by Arrow without the
      GIL (Dask's engine writes through a Python file object, 0.6 s of the
      4.1 s of dataset A on one thread) under a temporary name, then renamed,
      so a task killed mid-write leaves no partial file under a final name
      (given a token under ``_SHOWN_AT_THE_END``, under a hidden name that
      the write's final task renames: ``ShowPiles``);
    - with ``compression=SNAPPY_WHERE_IT_PAYS`` (``PileFrame.to_parquet``'s
      default), Snappy on the columns of the pile it shrinks only
      (``_passes.compression``).

    ``partition_on`` (a file per pile and value) is left to Dask's engine.
    """

    @classmethod
    def write_partition(
        cls, df, path, fs, filename, partition_on, return_metadata, fmd=None, compression=None, index_cols=None,
        schema=None, head=False, custom_metadata=None, **kwargs,
    ):  # fmt: skip
        if partition_on:
            return super().write_partition(
                df, path, fs, filename, partition_on, return_metadata, fmd,
                "snappy" if compression == SNAPPY_WHERE_IT_PAYS else compression, index_cols, schema, head,
                custom_metadata, **kwargs,
            )  # fmt: skip
        # The table as Dask's engine makes it
        preserve_index = _index_in_schema(index_cols, schema)
        if preserve_index:
            df = df.set_index(index_cols)
        table = cls._pandas_to_arrow_table(df, preserve_index=preserve_index, schema=schema)
        if custom_metadata:
            table = table.replace_schema_metadata({**table.schema.metadata, **custom_metadata})
        if compression == SNAPPY_WHERE_IT_PAYS:
            compression = _passes.compression(table)
        collected: list = []
        final = fs.sep.join([path, filename])
        token = kwargs.pop(_SHOWN_AT_THE_END, None)  # (given by write_piles, for ShowPiles)
        target = final if token is None else fs.sep.join([path, _temporary_name(filename, token)])
        if token is not None and posixpath.dirname(filename) and os.path.isdir(path):  # (a name_function's)
            os.makedirs(posixpath.dirname(target), exist_ok=True)
        # (not making dest: a task still running after a failure must not bring back a dest removed since)
        with atomic_sink(fs, target, make_parents=token is None) as sink:
            pq.write_table(table, sink, compression=compression, metadata_collector=collected, **kwargs)
        shown = {} if token is None else {"shown_as": (target, final)}  # (for ShowPiles alone: it replaces Dask's)
        if not return_metadata:
            return [shown] if shown else []
        collected[0].set_file_path(filename)
        return [{"meta": collected[0], **({"schema": table.schema} if head else {}), **shown}]
