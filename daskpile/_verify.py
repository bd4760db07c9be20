"""``verify``: recompute the fingerprints of a source and a result from the files."""

from __future__ import annotations

import dataclasses

import dask
import pyarrow as pa

from daskpile import _fingerprint, _manifest, _passes
from daskpile._compute import compute
from daskpile._fingerprint import Fingerprint
from daskpile._storage import full_url
from daskpile._words import count
from daskpile.sources import plan_sources, read_pieces
from daskpile.sources.parquet import read_parquet


@dataclasses.dataclass(frozen=True)
class Verification:
    """The fingerprints of the source rows and of the result rows, recomputed from the files.

    On a mismatch, ``columns_differing`` names the columns whose values
    differ (each column is also fingerprinted on its own), and
    ``missing_files`` / ``unreadable_files`` the result's files that could not
    be read, with the reason.  ``ignored_columns`` are columns of the result
    that pandas or Dask wrote for an index the source does not have (Dask's
    ``__null_dask_index__``): they are not compared.
    """

    source: Fingerprint
    dest: Fingerprint
    manifest: Fingerprint | None
    columns_differing: tuple[str, ...] = ()
    missing_files: tuple[str, ...] = ()
    unreadable_files: tuple[str, ...] = ()  # "path: reason"
    ignored_columns: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return (
            self.source == self.dest
            and self.manifest in (None, self.dest)
            and not self.missing_files
            and not self.unreadable_files
        )

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        ignored = (
            f"; not compared: {', '.join(self.ignored_columns)} (an index column the source does not have)"
            if self.ignored_columns
            else ""
        )
        if self.ok:
            return f"match: the result is a permutation of the source ({count(self.source.rows, 'row')}){ignored}"
        lines = [f"MISMATCH: source {count(self.source.rows, 'row')}, result {count(self.dest.rows, 'row')}{ignored}"]
        if self.columns_differing:
            lines.append(f"  columns that differ: {', '.join(self.columns_differing)}")
        elif self.source != self.dest and self.source.rows == self.dest.rows:
            lines.append("  every column holds the same values, but not in the same rows")
        lines += [f"  missing: {path}" for path in self.missing_files]
        lines += [f"  unreadable: {item}" for item in self.unreadable_files]
        if self.manifest is not None and self.manifest != self.dest:
            lines.append(f"  the manifest records another fingerprint ({count(self.manifest.rows, 'row')})")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "source": self.source.to_json(),
            "result": self.dest.to_json(),
            "manifest": None if self.manifest is None else self.manifest.to_json(),
            "columns_differing": list(self.columns_differing),
            "missing_files": list(self.missing_files),
            "unreadable_files": list(self.unreadable_files),
            "ignored_columns": list(self.ignored_columns),
        }


@dataclasses.dataclass(frozen=True)
class _Side:
    """What one task saw: rows, each column alone, and the files it could not read."""

    rows: Fingerprint
    columns: dict
    missing: tuple = ()
    unreadable: tuple = ()
    ignored: tuple = ()


def verify(
    source: str | list[str],
    dest: str,
    *,
    storage_options: dict | None = None,
    progress: bool = False,
    partitioning=None,
    schema: str | None = None,
    version: int | None = None,
) -> Verification:
    """Check that the result at ``dest`` holds exactly the rows of ``source``.

    ``dest`` is a daskpile result (the files its manifest lists) or any
    Parquet dataset.  Reads every source file and every output file, in
    parallel on the current Dask client, and compares the order-independent
    fingerprints (row count, sum and xor of 64-bit row hashes).

    The source is read as the shuffle read it: partition folders, schema
    policy and table version are those the result's manifest records, unless
    given (``partitioning``, ``schema``, ``version``, as in ``shuffle_parquet``).

    >>> result = verify("data/", "shuffled/")  # doctest: +SKIP
    >>> result.ok, result.source.rows  # doctest: +SKIP
    (True, 10000000)
    """
    dest_fs, dest_files, manifest = _manifest.result_files(dest, storage_options)
    recorded = manifest and manifest.get("fingerprint")
    read_as = (manifest or {}).get("source") or {}
    if partitioning is None:
        partitioning = _recorded_partitioning(manifest)
    table_version = read_as.get("table_version") if version is None else version
    if schema is None:  # a table's rows take the table's schema whatever the policy
        schema = read_as.get("schema_policy", "strict").replace("table", "strict")
    plan = plan_sources(
        source, storage_options, partitioning=partitioning, schema=schema,
        version=table_version,
    )  # fmt: skip
    partitions = plan.partitions(_passes.BLOCKSIZE)
    names = plan.schema.names
    tasks = [dask.delayed(_fingerprint_partition)(plan.fs, files, plan.reading) for files in partitions]
    tasks += [dask.delayed(_fingerprint_file)(dest_fs, p, names) for p in dest_files]
    results = compute(tasks, progress=progress)
    source, dest_sides = _total(results[: len(partitions)]), results[len(partitions) :]
    result = _total(dest_sides)
    return Verification(
        source=source.rows,
        dest=result.rows,
        manifest=Fingerprint.from_json(recorded) if recorded else None,
        columns_differing=tuple(
            _column_difference(n, source.columns, result.columns)
            for n in dict.fromkeys([*names, *result.columns])
            if source.columns.get(n) != result.columns.get(n)
        )
        if source.rows != result.rows
        else (),
        missing_files=result.missing,
        unreadable_files=result.unreadable,
        ignored_columns=result.ignored,
    )


def _column_difference(name: str, source: dict, result: dict) -> str:
    if name not in result:
        return f"{name} (not in the result)"
    if name not in source:
        return f"{name} (not in the source)"
    return name


def _total(sides: list[_Side]) -> _Side:
    columns: dict = {}
    for side in sides:
        for name, fingerprint in side.columns.items():
            columns[name] = columns.get(name, Fingerprint()) + fingerprint
    return _Side(
        _fingerprint.total(s.rows for s in sides),
        columns,
        tuple(m for s in sides for m in s.missing),
        tuple(u for s in sides for u in s.unreadable),
        tuple(dict.fromkeys(i for s in sides for i in s.ignored)),
    )


def _recorded_partitioning(manifest: dict | None):
    """The partition keys a result's source was read with, typed as its schema records them."""
    keys = ((manifest or {}).get("source") or {}).get("partition_keys")
    if keys is None:  # not a daskpile result, or one made before partition folders were read
        return "hive"
    if not keys:
        return "none"
    schema = _manifest.arrow_schema(manifest)
    return pa.schema([schema.field(name) for name in keys])


def _fingerprint_partition(fs, files, reading) -> _Side:
    sides = [_side(table) for _, table in read_pieces(fs, files, reading, _passes.BLOCKSIZE)]
    return _total(sides)


def _fingerprint_file(fs, path: str, source_columns: list[str]) -> _Side:
    """One result file, its columns in the source's order; index columns the source lacks are set aside."""
    url = full_url(fs, path)
    try:
        table = read_parquet(fs, path)
    except FileNotFoundError:
        return _Side(Fingerprint(), {}, missing=(f"{url} (the manifest lists it; it is not there)",))
    except ValueError as e:
        return _Side(Fingerprint(), {}, unreadable=(f"{url}: {e}",))
    pandas_meta = table.schema.pandas_metadata or {}
    index_columns = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
    ignored = tuple(c for c in index_columns if c not in source_columns and c in table.column_names)
    kept = [n for n in source_columns if n in table.column_names]
    kept += [n for n in table.column_names if n not in source_columns and n not in ignored]
    return dataclasses.replace(_side(table.select(kept)), ignored=ignored)


def _side(table: pa.Table) -> _Side:
    return _Side(_fingerprint.of(table), _fingerprint.of_columns(table))
