"""What a loader reads: the files (units) of a pile dataset, their rows, whether they are lazy piles."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from daskpile import _manifest
from daskpile._storage import full_url
from daskpile.sources.parquet import open_parquet, parquet_errors

FOOTER_THREADS = 16  # footers are small reads, so on an object store their latency, not the cores, bounds them


@dataclasses.dataclass(frozen=True)
class Units:
    """The files of a pile dataset in a fixed order, the rows the loader takes from each.

    ``lazy``: the files are piles left unpermuted (``second_pass="lazy"``), so
    a part of one must be a random part, not a row range.  ``rows`` are after
    ``filter``, when there is one.
    """

    fs: fsspec.AbstractFileSystem
    paths: tuple[str, ...]
    rows: np.ndarray
    lazy: bool
    schema: pa.Schema
    filter: ds.Expression | None  # noqa: F821 - pyarrow.dataset, imported only with filters

    def url(self, unit: int) -> str:
        return full_url(self.fs, self.paths[unit])

    @property
    def total(self) -> int:
        return int(self.rows.sum())


def discover(path: str | list[str], storage_options: dict | None, filters=None) -> Units:
    """The units of ``path``: a daskpile result's files as its manifest lists them, else Parquet files by name.

    A manifest gives the rows without reading a footer; other datasets have
    their footers read, in threads.  With ``filters`` (pyarrow DNF or an
    expression), the rows that pass are counted once, here, so that every
    rank can plan the epoch.
    """
    fs, paths, manifest = _manifest.result_files(path, storage_options)
    expression = None if filters is None else _expression(filters)
    if manifest is not None and expression is None:
        rows = np.array(manifest["rows_per_file"], dtype=np.int64)
        schema = _manifest.arrow_schema(manifest)
        lazy = manifest.get("second_pass") == "lazy"
    else:
        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            counted = list(pool.map(lambda p: _count(fs, p, expression), paths))
        rows = np.array([c.rows for c in counted], dtype=np.int64)
        schema = counted[0].schema
        # files of a lazy result named one by one or by a glob: their footers say they are lazy piles
        lazy = any(c.lazy for c in counted)
    return Units(fs, tuple(paths), rows, lazy, schema, expression)


def _expression(filters) -> ds.Expression:  # noqa: F821
    import pyarrow.dataset as ds  # only with filters: it imports pandas (0.3 s, holding the GIL)

    return filters if isinstance(filters, ds.Expression) else pq.filters_to_expression(filters)


@dataclasses.dataclass(frozen=True)
class _Counted:
    rows: int
    schema: pa.Schema
    lazy: bool


def _count(fs, path: str, expression) -> _Counted:
    with open_parquet(fs, path) as parquet:
        stamp = (parquet.metadata.metadata or {}).get(_manifest.PILE_METADATA_KEY)
        lazy = bool(stamp) and json.loads(stamp).get("lazy", False)
        if expression is None:
            return _Counted(parquet.metadata.num_rows, parquet.schema_arrow, lazy)
    with parquet_errors(full_url(fs, path)):
        dataset = parquet_dataset(fs, path)
        return _Counted(dataset.count_rows(filter=expression), dataset.schema, lazy)


def parquet_dataset(fs, path: str):
    """One file as a ``pyarrow.dataset``, for a filter.

    Imported here, only with filters: ``pyarrow.dataset`` imports pandas (0.3 s, holding the GIL).
    """
    import pyarrow.dataset as ds

    return ds.dataset(path, filesystem=fs, format="parquet")
