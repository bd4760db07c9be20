"""``verify``: recompute the fingerprints of a source and a result from the files."""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import uuid

import pyarrow as pa
import pyarrow.compute as pc

from daskpile._compute import compute, said_while_slow, task
from daskpile._storage import as_urls, exists, filesystem, full_url, redacting_errors, urls_said
from daskpile._words import count
from daskpile.checks import _fingerprint
from daskpile.checks._fingerprint import Fingerprint
from daskpile.engine import _manifest, _outputs, _passes, _sizing
from daskpile.loader.units import FolderKeys
from daskpile.sources import plan_sources, read_pieces
from daskpile.sources.hive import UndeclaredKeysError
from daskpile.sources.parquet import read_parquet
from daskpile.window.snapshot import generation_dir

COLUMNS_SHOWN = 10  # of the columns that differ: a result of another source differs in all of them


@dataclasses.dataclass(frozen=True)
class Verification:
    """The fingerprints of the source rows and of the result rows, recomputed from the files.

    What :func:`verify` returns.  Its truth value is :attr:`ok`; ``print`` it
    for ``match: the result is a permutation of the source (10,000,000
    rows)`` or a list of what differs.  Every parameter below is an attribute.

    Parameters
    ----------
    source
        The fingerprint of the source rows.
    dest
        The fingerprint of the result rows.
    manifest
        The fingerprint the result's manifest recorded; None for a dataset
        without a manifest, a result shuffled with ``verify=False``, or one
        whose fingerprint another version of the row hash computed.
    columns_differing
        On a mismatch, the columns whose values differ (each column is also
        fingerprinted on its own), noting a column that only one side has.
        Empty when every column holds the same values but not in the same
        rows.
    missing_files
        Files the manifest lists that are not there.
    unreadable_files
        Result files that could not be read, as ``"url: reason"``.
    ignored_columns
        Columns of the result that pandas or Dask wrote for an index the
        source does not have (Dask's ``__null_dask_index__``): not compared.
    generations_differing
        Checked against the manifest alone (``verify(dest)``): the
        generations of a window (0 for a plain result) whose files do not hold
        the rows their sources gave.
    against_manifest
        True when ``source`` is the fingerprint the manifest recorded when
        the rows were read, not one recomputed from the source files.
    files_differing
        Result files that no longer hold the rows pass 2 wrote in them, by
        the fingerprint of each file its manifest recorded (changed in place:
        a disk or a store that corrupted them, or a hand that edited them).
    unlisted_files
        Data files in the result's directory that its manifest does not list
        (a copy left there): daskpile and ``PileLoader`` read only the listed
        ones, but other readers of the directory (``pd.read_parquet(dest)``)
        read them too, so they make a mismatch.
    source_changed
        Source files added, gone or changed since the shuffle read them, by
        the files and stamps its manifest recorded: on a mismatch, the
        likelier cause than the result.
    types_differing
        Columns whose type in the result files is not the source's (or the
        manifest's), as ``"name (type in the source, in the result)"``, a
        column that a result file lacks ("missing"), and a column of the
        result that the source lacks (a column renamed): the
        fingerprints hash values, which a cast may keep (a timestamp as
        int64, a date as int32, a string as binary, int64 as int32).  Types
        that hold the same values alike are one type here: string and
        large_string, a dictionary and its values, a timestamp in any unit
        (its time zone counts, UTC however spelled), a decimal of any width,
        list and large_list.
    skipped_files
        Files of the source that are not data of its format (a ``.txt`` or
        ``.pqt`` beside Parquet files), skipped as the shuffle skipped them:
        said, since other readers of the folder may read them.
    other_version
        (the table version the result was made from, the one read), when
        ``version`` asked for another: what the manifest recorded of its
        files and its source is then not compared.
    """

    source: Fingerprint
    dest: Fingerprint
    manifest: Fingerprint | None
    columns_differing: tuple[str, ...] = ()
    missing_files: tuple[str, ...] = ()
    unreadable_files: tuple[str, ...] = ()  # "path: reason"
    ignored_columns: tuple[str, ...] = ()
    generations_differing: tuple[int, ...] = ()
    against_manifest: bool = False
    unlisted_files: tuple[str, ...] = ()
    files_differing: tuple[str, ...] = ()
    source_changed: tuple[str, ...] = ()
    types_differing: tuple[str, ...] = ()
    skipped_files: tuple[str, ...] = ()
    other_version: tuple[int, int] | None = None
    unfinished_change: str | None = None  # the window change under way whose files are the unlisted ones

    @property
    def ok(self) -> bool:
        """Whether the result is a permutation of the source.

        The two fingerprints are equal, the manifest's (if any) is equal to
        them, and no result file is missing or unreadable.
        """
        return (
            self.source == self.dest
            and self.manifest in (None, self.dest)
            and not self.missing_files
            and not self.unreadable_files
            and not self.generations_differing
            and not self.unlisted_files
            and not self.files_differing
            and not self.types_differing
        )

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        ignored = (
            f"; not compared: {', '.join(self.ignored_columns)} (an index column the source does not have)"
            if self.ignored_columns
            else ""
        )
        source = "the rows its manifest recorded from the sources" if self.against_manifest else "the source"
        skipped = ""
        if self.skipped_files:
            more = len(self.skipped_files) - COLUMNS_SHOWN
            more = f", and {more:,} more" if more > 0 else ""
            skipped = (
                f"\n  skipped in the source, as not data (as the shuffle skipped them): "
                f"{', '.join(self.skipped_files[:COLUMNS_SHOWN])}{more}"
            )
        if self.ok:
            return (
                f"match: the result is a permutation of {source} ({count(self.source.rows, 'row')}){ignored}{skipped}"
            )
        lines = [
            f"MISMATCH: {'recorded' if self.against_manifest else 'source'} {count(self.source.rows, 'row')}, "
            f"result {count(self.dest.rows, 'row')}{ignored}"
        ]
        if self.source == self.dest and self.files_differing:  # (files swapped, or rows moved between them)
            lines[0] += "; every row is there, but not every file holds the rows the run wrote in it"
        if self.other_version:
            made, read = self.other_version
            lines.append(f"  the result was made from version {made} of the table, and version {read} was read")
        if self.generations_differing:
            lines.append(f"  generations that differ: {', '.join(map(str, self.generations_differing))}")
        if self.columns_differing:
            shown, more = self.columns_differing[:COLUMNS_SHOWN], len(self.columns_differing) - COLUMNS_SHOWN
            lines.append(f"  columns that differ: {', '.join(shown)}" + (f", and {more:,} more" if more > 0 else ""))
        elif self.source != self.dest and self.source.rows == self.dest.rows and not self.against_manifest:
            # (against a manifest, no column was fingerprinted alone: which differ is not known)
            lines.append("  every column holds the same values, but not in the same rows")
        if self.types_differing:
            shown, more = self.types_differing[:COLUMNS_SHOWN], len(self.types_differing) - COLUMNS_SHOWN
            lines.append(
                f"  column types that differ: {', '.join(shown)}" + (f", and {more:,} more" if more > 0 else "")
            )
        lines += [f"  changed since it was written: {path}" for path in self.files_differing]
        lines += [f"  missing: {path}" for path in self.missing_files]
        lines += [f"  unreadable: {item}" for item in self.unreadable_files]
        lines += [
            f"  not in the manifest: {path} (other readers of the directory read it too)"
            for path in self.unlisted_files
        ]
        if self.unlisted_files and self.unfinished_change:
            only = (
                self.source == self.dest
                and self.manifest in (None, self.dest)
                and not (self.missing_files or self.unreadable_files or self.files_differing or self.types_differing)
            )
            lines.append(
                f"  they are an unfinished {self.unfinished_change}'s"
                + (": the files the manifest lists are whole" if only else "")
                + "; finish it (that command again) or drop it (`daskpile discard`)"
            )
        if self.manifest is not None and self.manifest != self.dest:
            lines.append(f"  the manifest records another fingerprint ({count(self.manifest.rows, 'row')})")
        if self.source_changed:
            more = len(self.source_changed) - COLUMNS_SHOWN
            lines.append(
                "  the source changed since the shuffle read it: "
                + ", ".join(self.source_changed[:COLUMNS_SHOWN])
                + (f", and {more:,} more" if more > 0 else "")
                + ("; the result matches what was read then" if self.manifest == self.dest else "")
            )
        return "\n".join(lines) + skipped

    def to_json(self) -> dict:
        """The verification as JSON-ready data, what ``daskpile verify --json`` prints.

        Returns
        -------
        dict
            ``ok``; ``source``, ``result`` and ``manifest`` as fingerprints
            (``rows``, ``sum`` and ``xor`` in hexadecimal, ``hash`` the version
            of the row hash; ``manifest`` may be None); ``columns_differing``,
            ``missing_files``, ``unreadable_files`` and ``ignored_columns`` as
            lists.
        """
        return {
            "ok": self.ok,
            "source": self.source.to_json(),
            "result": self.dest.to_json(),
            "manifest": None if self.manifest is None else self.manifest.to_json(),
            "columns_differing": list(self.columns_differing),
            "missing_files": list(self.missing_files),
            "unreadable_files": list(self.unreadable_files),
            "ignored_columns": list(self.ignored_columns),
            "generations_differing": list(self.generations_differing),
            "against_manifest": self.against_manifest,
            "unlisted_files": list(self.unlisted_files),
            "files_differing": list(self.files_differing),
            "source_changed": list(self.source_changed),
            "types_differing": list(self.types_differing),
            "skipped_files": list(self.skipped_files),
            "other_version": None if self.other_version is None else list(self.other_version),
            "unfinished_change": self.unfinished_change,
        }


@dataclasses.dataclass(frozen=True)
class _Side:
    """What one task saw: rows, each column alone, and the files it could not read."""

    rows: Fingerprint
    columns: dict
    missing: tuple = ()
    unreadable: tuple = ()
    ignored: tuple = ()
    types: dict = dataclasses.field(default_factory=dict)  # column -> the set of its types in the files read
    nans: dict = dataclasses.field(default_factory=dict)  # float column -> (NaNs, nulls)


@redacting_errors
def verify(
    source: str | list[str],
    dest: str | None = None,
    *,
    storage_options: dict | None = None,
    progress: bool = False,
    partitioning=None,
    schema: str | None = None,
    version: int | None = None,
    format: str | None = None,
    read_options: dict | None = None,
) -> Verification:
    """Check that the result at ``dest`` holds exactly the rows of ``source``.

    Reads every source file and every result file, in parallel on the current
    Dask client (else on Dask's default local scheduler), and compares their
    order-independent fingerprints: row count, and sum and xor of 64-bit row
    hashes.  Every column is also fingerprinted alone, to name the columns
    that differ.  Extension types (uuid, json, tensors, user types) are
    fingerprinted by their storage.  A mismatch is reported, not raised.

    With one argument, ``verify(dest)``, the result's files are checked
    against the fingerprints its manifest recorded when the rows were read
    from their sources: for a moving window, generation by generation (the
    rows of the appended sources minus what was expired), naming a generation
    that differs.  The sources themselves are not read.

    Parameters
    ----------
    source
        The input, as given to :func:`shuffle_parquet` (a file, directory,
        glob, list of these, or table folder).  It is read as the shuffle read
        it: partition keys, schema policy and table version are those the
        result's manifest records, unless given below.
    dest
        Default None: ``source`` is the result, checked against its manifest.
        A daskpile result, of which exactly the files its manifest lists are
        read; or any other Parquet dataset (a directory, glob or list of
        files), such as one written by ``shuffle(ddf).to_parquet(...)``, of
        which all the data files are read, the values of key=value folders
        (``partition_on=``) as columns, as Dask reads them back.
    storage_options
        Passed to fsspec for ``source`` and ``dest``.  Default None.
    progress
        Show Dask's progress bar while reading.  Default False.
    partitioning
        As in :func:`shuffle_parquet`.  Default None: the partition keys, and
        their types, the manifest records (``"hive"`` for a dataset without
        a daskpile manifest).
    schema
        ``"strict"`` or ``"unify"``, as in :func:`shuffle_parquet`.  Default
        None: the policy the manifest records (``"strict"`` without one).
    version
        As in :func:`shuffle_parquet`.  Default None: the table version the
        manifest records (the current one without one).
    format, read_options
        What the source's files are and how text is read, as in
        :func:`shuffle_parquet`: for a result of ``shuffle(dd.read_csv(...,
        sep=";"))``, ``format="csv", read_options={"delimiter": ";"}``.
        Default None: what the manifest records (``"auto"`` and none without
        one).

    Returns
    -------
    Verification
        The fingerprints of both sides and what the manifest recorded; true
        when they match, with what differs otherwise.  An index column pandas
        or Dask wrote that the source lacks (Dask's ``__null_dask_index__``)
        is set aside and named in ``ignored_columns``.

    Raises
    ------
    FileNotFoundError
        If ``source`` or ``dest`` does not exist or holds no Parquet file.
    ValueError
        If an argument is not valid, or the source files' schemas do not fit
        the schema policy.

    Examples
    --------
    >>> result = verify("data/", "shuffled/")
    >>> result.ok, result.source.rows
    (True, 30000)
    >>> print(result)
    match: the result is a permutation of the source (30,000 rows)
    """
    source, dest = as_urls(source), as_urls(dest, "dest")
    if dest is None:
        return _against_manifest(source, storage_options, progress)
    dest_fs, dest_files, manifest = _manifest.result_files(dest, storage_options)
    recorded = manifest and manifest.get("fingerprint")
    read_as = (manifest or {}).get("source") or {}
    recorded_keys = partitioning is None and read_as.get("partition_keys") is not None
    if partitioning is None:
        partitioning = _recorded_partitioning(manifest)
    table_version = read_as.get("table_version") if version is None else version
    made_from = read_as.get("table_version")
    other = (made_from, version) if None not in (version, made_from) and version != made_from else None
    if schema is None:  # a table's rows take the table's schema whatever the policy
        schema = read_as.get("schema_policy", "strict").replace("table", "strict")
    recorded_format = read_as.get("format", "auto")
    if read_options is None and format in (None, recorded_format):  # (the manifest's, for the format it records)
        read_options = read_as.get("read_options")
    try:
        with said_while_slow(f"still planning: listing and opening {urls_said(source)}", progress):
            plan = plan_sources(
                source, storage_options, partitioning=partitioning, schema=schema, version=table_version,
                format=format or recorded_format, read_options=read_options,
            )  # fmt: skip
    except UndeclaredKeysError as e:
        if not recorded_keys:  # (keys the user declared)
            raise
        raise ValueError(
            f"the source's partition folders have keys {e.keys}, where the result's manifest records "
            f"{list(read_as['partition_keys']) or 'none'}: is {source!r} the source the result was made from? "
            "(partitioning= reads it otherwise)"
        ) from None
    written_as = (_outputs.of_manifest(manifest), _manifest.arrow_schema(manifest)) if manifest else None
    plan = (written_as[0] if written_as else _outputs.Output()).stored_plan(plan)  # the source as the result holds it
    if written_as:
        plan = plan.in_order(written_as[1].names)
    if plan.reading.text is None:  # pieces of blocksize in memory, as the shuffle cuts them (a piece is a task's)
        _, _, row_bytes = _sizing.estimate_parquet(plan.fs, [f.path for f in plan.files], plan.sizes, plan.metadata)
        plan = plan.with_pieces(row_bytes)
    partitions = plan.partitions(_passes.BLOCKSIZE)
    names = plan.schema.names
    # (``task``: not ``dask.delayed``, which looked through the files of each task: 12.9 s of 100,000 files)
    run = uuid.uuid4().hex[:12]
    tasks = [
        task(_fingerprint_partition, plan.fs, files, plan.reading, key=f"daskpile-verify-source-{k}-{run}")
        for k, files in enumerate(partitions)
    ]
    keys = None if manifest else FolderKeys.below(dest, dest_fs, dest_files, storage_options)
    tasks += [
        task(
            _fingerprint_file, dest_fs, p, names, written_as, _folder_columns(keys, p, plan.schema),
            key=f"daskpile-verify-result-{i}-{run}",
        )
        for i, p in enumerate(dest_files)
    ]  # fmt: skip
    results = compute(tasks, progress=progress)
    source, dest_sides = _total(results[: len(partitions)]), results[len(partitions) :]
    result = _total(dest_sides)
    return Verification(
        source=source.rows,
        dest=result.rows,
        manifest=Fingerprint.from_json(recorded) if recorded else None,
        columns_differing=tuple(
            _column_difference(n, source.columns, result.columns) + _nans_said(n, source.nans, result.nans)
            for n in dict.fromkeys([*names, *result.columns])
            if source.columns.get(n) != result.columns.get(n)
        )
        if source.rows != result.rows
        else (),
        missing_files=result.missing,
        unreadable_files=result.unreadable,
        ignored_columns=result.ignored,
        unlisted_files=(unlisted := _unlisted(dest_fs, dest, manifest, storage_options)),
        unfinished_change=_unfinished_change(dest_fs, dest, unlisted, storage_options),
        # (what the manifest recorded is of the rows of the version it was made from, in that version's columns)
        files_differing=() if other else _files_differing(dest_fs, dest_files, dest_sides, manifest, names),
        source_changed=() if other else _source_changed(plan, manifest),
        types_differing=_types_differing(plan.schema, result.types, "the source"),
        skipped_files=tuple(plan.skipped),
        other_version=other,
    )


def _source_changed(plan, manifest: dict | None) -> tuple[str, ...]:
    """The source files added, gone or changed (their size or modification stamp) since the run its manifest
    records read them, and those it read that the source given leaves out; none where it records no run, or
    where no file is in both (another spelling of the source, or another source: nothing to compare)."""
    run = (manifest or {}).get("run") or {}
    then = dict(zip(run.get("source_files", ()), run.get("source_stamps", ()), strict=False))
    now = dict(zip(plan.urls, plan.stamps, strict=True))
    if not then.keys() & now.keys():
        return ()
    left_out = [url for url in then if url not in now]
    return (
        *(f"{url} (added)" for url in now if url not in then),
        *(f"{url} ({'not in the source given' if exists(plan.fs, url) else 'gone'})" for url in left_out),
        *(f"{url} (changed)" for url in now if url in then and now[url] != then[url]),
    )


def _files_differing(
    fs, paths: list[str], sides: list[_Side], manifest: dict | None, names: list[str]
) -> tuple[str, ...]:
    """The files whose rows are not those their manifest recorded for them (a file missing or unreadable is
    said so, not here), where they were read in the columns the manifest records (``names``)."""
    recorded = (manifest or {}).get("file_fingerprints")
    if not recorded or len(recorded) != len(paths) or list(names) != _manifest.arrow_schema(manifest).names:
        return ()
    return tuple(
        full_url(fs, path)
        for path, side, want in zip(paths, sides, recorded, strict=True)
        if not side.missing and not side.unreadable and Fingerprint.from_json(want) not in (None, side.rows)
    )


def _unlisted(fs, dest, manifest: dict | None, storage_options) -> tuple[str, ...]:
    """Files in a result's directory, in any folder below it, that its manifest does not list and that a reader
    of the directory reads (pyarrow's datasets, so pandas and Dask: every file and folder not named ``.*`` or
    ``_*``, whatever its suffix).  Not for a moving window, whose directory keeps the files of the versions it
    retains."""
    if manifest is None or "window" in manifest or not isinstance(dest, str) or not manifest["files"]:
        return ()
    base = filesystem(dest, storage_options)[1].rstrip("/")
    listed = set(manifest["files"])
    try:
        found = fs.find(base, withdirs=False, detail=True)
    except (OSError, NotImplementedError, ValueError):  # a store that cannot list (http): nothing to say
        return ()
    relative = (posixpath.relpath(p, base) for p, info in found.items() if not (p.endswith("/") and not info["size"]))
    return tuple(
        full_url(fs, posixpath.join(base, name))
        for name in sorted(relative)
        if name not in listed and name != "." and not any(part.startswith((".", "_")) for part in name.split("/"))
    )


def _unfinished_change(fs, dest: str, unlisted: tuple[str, ...], storage_options) -> str | None:
    """The window change under way on a result whose files are all the ``unlisted`` ones (its first ``append``,
    interrupted, has written a generation its manifest does not list yet), as ``"`daskpile append` (of ...,
    started ...)"``; None if there is none, or if another file is unlisted too."""
    if not unlisted:
        return None
    base = filesystem(dest, storage_options)[1].rstrip("/")
    try:
        with fs.open(posixpath.join(base, _manifest.WINDOW_PENDING), "rb") as f:
            pending = json.load(f)
        folder = full_url(fs, posixpath.join(base, generation_dir(int(pending["generation"])))) + "/"
        if not all(url.startswith(folder) for url in unlisted):
            return None
        return f"`daskpile {pending['command']}` ({pending['description']}, started {pending['started']})"
    except (OSError, ValueError, KeyError, TypeError):  # none, or not a marker daskpile wrote: nothing to say
        return None


def _against_manifest(dest: str, storage_options, progress: bool) -> Verification:
    """A result's files, generation by generation, against the fingerprints its manifest recorded."""
    if not isinstance(dest, str):
        raise ValueError("verify(dest) with one argument needs a daskpile result's directory, with its manifest")
    fs, _, manifest = _manifest.result_files(dest, storage_options)
    if manifest is None:
        raise ValueError(f"{dest!r} has no daskpile manifest: give the source too, verify(source, dest)")
    window = manifest.get("window")
    generations = (
        [(g["number"], g["files"], g["fingerprint"]) for g in window["generations"]]
        if window
        else [(0, manifest["files"], manifest.get("fingerprint"))]
    )
    if any(recorded is None for _, _, recorded in generations):
        raise ValueError(f"{dest!r} was written with verify=False: no fingerprint to check against; give the source")
    other = next((f.get("hash", 1) for _, _, f in generations if Fingerprint.from_json(f) is None), None)
    if other is not None:
        raise ValueError(
            f"{dest!r} records fingerprints of version {other} of the row hash, and this daskpile computes version "
            f"{_fingerprint.HASH_VERSION}: give the source too, verify(source, dest) (daskpile verify SOURCE DEST)"
        )
    base = filesystem(dest, storage_options)[1]
    schema = _manifest.arrow_schema(manifest)
    names, written_as = schema.names, (_outputs.of_manifest(manifest), schema)
    run = uuid.uuid4().hex[:12]
    tasks = [
        [
            task(_fingerprint_file, fs, posixpath.join(base, name), names, written_as,
                 key=f"daskpile-verify-result-{g}-{i}-{run}")
            for i, name in enumerate(names_)
        ]
        for g, (_, names_, _) in enumerate(generations)
    ]  # fmt: skip
    sides = compute([t for group in tasks for t in group], progress=progress)
    paths = [posixpath.join(base, name) for _, names_, _ in generations for name in names_]
    per_generation, start = [], 0
    for group in tasks:
        per_generation.append(_total(sides[start : start + len(group)]))
        start += len(group)
    recorded = [Fingerprint.from_json(f) for _, _, f in generations]
    result = _total(per_generation)
    return Verification(
        source=_fingerprint.total(recorded),
        dest=result.rows,
        manifest=Fingerprint.from_json(manifest["fingerprint"]) if manifest.get("fingerprint") else None,
        missing_files=result.missing,
        unreadable_files=result.unreadable,
        ignored_columns=result.ignored,
        unlisted_files=(unlisted := _unlisted(fs, dest, manifest, storage_options)),
        unfinished_change=_unfinished_change(fs, dest, unlisted, storage_options),
        generations_differing=tuple(  # a moving window's: a plain result has no generations to name
            number
            for (number, _, _), side, want in zip(generations, per_generation, recorded, strict=True)
            if window and side.rows != want
        ),
        against_manifest=True,
        files_differing=_files_differing(fs, paths, sides, manifest, names),
        types_differing=_types_differing(schema, result.types, "the manifest"),
    )


def _types_differing(expected: pa.Schema, found: dict, whose: str) -> tuple[str, ...]:
    """The columns of ``expected`` whose type in the result files (``found``: column -> types) is another, or
    that some result file lacks (``MISSING``); and the result's columns ``expected`` lacks.

    A column renamed in every file, the last one, kept its place among the columns, whose row hash holds no
    names: it was said a match."""
    differing = []
    for field in expected:
        want = _logical_type(field.type)
        kinds = found.get(field.name, {MISSING} if found else set())
        other = sorted(k for k in kinds if k == MISSING or (k not in (want, "null") and want != "null"))
        if other:
            differing.append(f"{field.name} ({want} in {whose}, {' and '.join(other)} in the result)")
    names = set(expected.names)
    for name, kinds in found.items():
        if name not in names:
            differing.append(f"{name} (not in {whose}, {' and '.join(sorted(kinds - {MISSING}))} in the result)")
    return tuple(differing)


MISSING = "missing"  # a column's type in a result file that lacks it


def _logical_type(kind: pa.DataType) -> str:
    """``kind`` as the values it holds: one name for types that hold the same values alike.

    >>> _logical_type(pa.dictionary(pa.int8(), pa.large_string())), _logical_type(pa.timestamp("ns", "UTC"))
    ('string', 'timestamp[UTC]')
    >>> _logical_type(pa.timestamp("us", "Etc/UTC")), _logical_type(pa.timestamp("s", "+00:00"))
    ('timestamp[UTC]', 'timestamp[UTC]')
    >>> _logical_type(pa.large_list(pa.struct({"a": pa.int32()}))), _logical_type(pa.decimal128(38, 2))
    ('list<struct<a: int32>>', 'decimal(scale 2)')
    """
    if pa.types.is_dictionary(kind):
        return _logical_type(kind.value_type)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return "binary"
    if pa.types.is_timestamp(kind):
        tz = "UTC" if kind.tz in _UTC_NAMES else kind.tz
        return f"timestamp[{tz or 'no time zone'}]"
    if pa.types.is_decimal(kind):
        return f"decimal(scale {kind.scale})"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return f"list<{_logical_type(kind.value_type)}>"
    if pa.types.is_struct(kind):
        return f"struct<{', '.join(f'{f.name}: {_logical_type(f.type)}' for f in kind)}>"
    if pa.types.is_map(kind):
        return f"map<{_logical_type(kind.key_type)}, {_logical_type(kind.item_type)}>"
    if isinstance(kind, pa.ExtensionType):
        return f"{kind.extension_name}<{_logical_type(kind.storage_type)}>"
    return str(kind)


# Names of UTC, which tools spell each their own way (Arrow stores the instants alike, in UTC, whatever the name)
_UTC_NAMES = frozenset(["UTC", "Etc/UTC", "+00:00", "Z", "GMT", "Etc/GMT", "UCT", "Etc/UCT", "Universal", "Zulu"])


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
    types: dict = {}
    for side in sides:
        for name, kinds in side.types.items():
            types[name] = types.get(name, frozenset()) | kinds
    nans: dict = {}
    for side in sides:
        for name, (nan, null) in side.nans.items():
            before = nans.get(name, (0, 0))
            nans[name] = (before[0] + nan, before[1] + null)
    return _Side(
        _fingerprint.total(s.rows for s in sides),
        columns,
        tuple(m for s in sides for m in s.missing),
        tuple(u for s in sides for u in s.unreadable),
        tuple(dict.fromkeys(i for s in sides for i in s.ignored)),
        types,
        nans,
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


def _folder_columns(keys: FolderKeys | None, path: str, source: pa.Schema) -> dict[str, pa.Scalar]:
    """The values of a result file's key=value folders (``to_parquet(partition_on=...)``), as columns of the
    source's types where it has them: Dask wrote those columns as folders, and reads them back so."""
    if keys is None:
        return {}
    columns = {}
    for field, value in zip(keys.schema, keys.values[path], strict=True):
        wanted = source.field(field.name).type if field.name in source.names else field.type
        try:
            columns[field.name] = value.cast(wanted)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # then the values differ, and verify says which
            columns[field.name] = value
    return columns


def _fingerprint_file(fs, path: str, source_columns: list[str], written_as=None, folder_columns=None) -> _Side:
    """One result file, its columns in the source's order; index columns the source lacks are set aside.

    ``written_as``: (output, schema) of a daskpile result's files, read back as that format (Parquet if None).
    ``folder_columns``: the values of the key=value folders the file is in, for columns it does not hold.
    """
    url = full_url(fs, path)
    try:
        if written_as is None or written_as[0].format == "parquet":
            table = read_parquet(fs, path)
        else:
            table = _outputs.read(fs, path, *written_as)
    except FileNotFoundError:
        return _Side(Fingerprint(), {}, missing=(f"{url} (the manifest lists it; it is not there)",))
    except ValueError as e:
        return _Side(Fingerprint(), {}, unreadable=(f"{url}: {e}",))
    for name, value in (folder_columns or {}).items():
        if name not in table.column_names:
            table = table.append_column(name, pa.repeat(value, table.num_rows))
    pandas_meta = table.schema.pandas_metadata or {}
    index_columns = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
    table = _as_the_source_names_its_unnamed_index(table, index_columns, source_columns)
    held, asked = set(table.column_names), set(source_columns)  # (looked up in lists, 2,001 columns took 2 s a file)
    ignored = tuple(c for c in index_columns if c not in asked and c in held)
    kept = [n for n in source_columns if n in held]
    kept += [n for n in table.column_names if n not in asked and n not in ignored]
    table = table.select(kept)
    types = {field.name: frozenset([_logical_type(field.type)]) for field in table.schema}
    types |= {name: frozenset([MISSING]) for name in source_columns if name not in types}
    return dataclasses.replace(_side(table), ignored=ignored, types=types)


# The column of an index without a name: pandas writes ``__index_level_0__``, Dask ``__null_dask_index__``
_UNNAMED_INDEX = re.compile(r"__index_level_\d+__|__null_dask_index__")


def _as_the_source_names_its_unnamed_index(table: pa.Table, index_columns: list[str], source_columns: list[str]):
    """``table`` with its unnamed index column under the source's name for one: a frame pandas wrote, shuffled
    and written by Dask, keeps its index values under another name, which made a mismatch."""
    in_source = [c for c in source_columns if _UNNAMED_INDEX.fullmatch(c) and c not in table.column_names]
    in_result = [c for c in index_columns if _UNNAMED_INDEX.fullmatch(c) and c not in source_columns]
    if len(in_source) != 1 or len(in_result) != 1 or in_result[0] not in table.column_names:
        return table
    return table.rename_columns([in_source[0] if n == in_result[0] else n for n in table.column_names])


def _side(table: pa.Table) -> _Side:
    nans = {
        name: (pc.sum(pc.is_nan(column)).as_py() or 0, column.null_count)
        for name, column in zip(table.column_names, table.columns, strict=True)
        if pa.types.is_floating(column.type)
    }
    return _Side(_fingerprint.of(table), _fingerprint.of_columns(table), nans=nans)


def _nans_said(name: str, source: dict, result: dict) -> str:
    """Why a float column differs, where its NaNs became nulls: pandas writes NaN as null (Dask's to_parquet of
    a frame read from Parquet too), which the rows then hold."""
    (source_nans, source_nulls), (result_nans, result_nulls) = source.get(name, (0, 0)), result.get(name, (0, 0))
    became = source_nans - result_nans
    if became <= 0 or result_nulls - source_nulls != became:
        return ""
    verb = "is" if became == 1 else "are"
    return f" ({count(became, 'NaN')} of the source {verb} null in the result: pandas writes NaN as null)"
