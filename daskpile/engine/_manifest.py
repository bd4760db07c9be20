"""The output layout and its manifest.

A finished result is a directory holding ``part-00000.parquet`` ... one file
per pile (several consecutive ones for a pile split because it was over its
memory budget), names sorting in pile order, and ``_daskpile.json`` written
last: its presence is what marks the result complete.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import posixpath
import re
from importlib import metadata

import fsspec
import pyarrow as pa

from daskpile._storage import (
    as_urls,
    exists,
    filesystem,
    full_url,
    reaching,
    redacting_errors,
    store_unusable,
    write_bytes,
)
from daskpile.engine import _run as run_state
from daskpile.sources.listing import data_files

MANIFEST_NAME = "_daskpile.json"
VERSIONS_DIR = "_daskpile_versions"  # a moving window's manifest, version by version
WINDOW_PENDING = "_daskpile.pending.json"  # a moving window's change under way
GENERATION_DIR = re.compile(r"^gen-\d{6}$")  # a moving window's generation (generation 0 is at the top)
# The key of each output file's footer stamp: the pile it holds, piles, seed, rows (and "lazy": true)
PILE_METADATA_KEY = b"daskpile.pile"
# And of each file ``shuffle(ddf).to_parquet`` writes: the shuffle's seed and piles, which tell its files from
# another shuffle's of the same rows into files of the same names and sizes (a loader's saved state)
SHUFFLE_METADATA_KEY = b"daskpile.shuffle"
FORMAT = "daskpile/1"
# A moving window (daskpile.append): daskpile/1 plus "window".  A new format, so that a daskpile that does
# not know windows refuses one instead of reading its generations' files as one result, unpermuted together
WINDOW_FORMAT = "daskpile/2"


def part_name(pile: int, piles: int, sub: int | None = None, suffix: str = ".parquet") -> str:
    """File name of pile ``pile`` (or of its sub-pile ``sub``), zero-padded so that names sort in order.

    A pile split because it was over its memory budget is written as
    consecutive files ``part-00007-0000.parquet``, ``part-00007-0001.parquet``...,
    which sort after pile 6 and before pile 8.

    >>> part_name(7, 512), part_name(7, 1_000_000), part_name(7, 512, sub=1)
    ('part-00007.parquet', 'part-000007.parquet', 'part-00007-0001.parquet')
    """
    width = max(5, len(str(piles - 1)))
    sub_suffix = "" if sub is None else f"-{sub:04d}"
    return f"part-{pile:0{width}d}{sub_suffix}{suffix}"


@functools.cache
def library_versions() -> dict[str, str]:
    # Cached: reading seven packages' metadata took 12 ms a manifest, 40 % of a small append.
    names = ["daskpile", "dask", "distributed", "pyarrow", "pandas", "numpy", "fsspec"]
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return versions


def union_of_nulls(parts) -> frozenset[str] | None:
    """The columns holding a null in any part (a manifest's ``null_columns``); None if a part did not record its own.

    >>> union_of_nulls([frozenset({"a"}), frozenset({"b"})]) == {"a", "b"}, union_of_nulls([frozenset(), None])
    (True, None)
    """
    parts = list(parts)
    return None if any(p is None for p in parts) else frozenset().union(*parts)


def build(
    *,
    piles: int,
    seed: int,
    rows_per_pile: list[int],
    files: list[str],
    rows_per_file: list[int] | None = None,
    schema: pa.Schema,
    source_files: list[str],
    seconds: dict[str, float],
    fingerprint=None,
    file_fingerprints: list | None = None,
    null_columns=None,
    pile_plan=None,
    source: dict | None = None,
    run: dict | None = None,
    file_stamps: list | None = None,
    second_pass: str = "eager",
    output=None,
) -> dict:
    return {
        "format": FORMAT,
        "piles": piles,
        "seed": seed,
        "rows": int(sum(rows_per_pile)),
        "rows_per_pile": [int(r) for r in rows_per_pile],
        "files": files,
        "rows_per_file": [int(r) for r in (rows_per_pile if rows_per_file is None else rows_per_file)],
        # "lazy": each file is a pile in scatter order, for PileLoader to permute when it loads it
        "second_pass": second_pass,
        **({"output": output.to_json()} if output is not None and output.format != "parquet" else {}),
        "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "arrow_schema": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
        "source_files": source_files,
        # how the source was read: schema policy, partition keys, table version, files skipped
        "source": source or {},
        # the run that wrote it (RunSpec), so that retrying the same call finds its result done
        "run": run,
        # each file's size and modification stamp at the commit, so that a retry knows the result is intact
        "file_stamps": file_stamps or [],
        "fingerprint": None if fingerprint is None else fingerprint.to_json(),
        **({"file_fingerprints": [f.to_json() for f in file_fingerprints]} if file_fingerprints else {}),
        # which columns hold a null: PileLoader(output="numpy") gives such an integer column float64 in every batch
        **({"null_columns": sorted(null_columns)} if null_columns is not None else {}),
        "pile_plan": None if pile_plan is None else pile_plan.to_json(),
        "seconds": seconds,
        "versions": dict(library_versions()),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def arrow_schema(manifest: dict) -> pa.Schema:
    """The output's Arrow schema, as the manifest records it."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["arrow_schema"])))


def write(fs: fsspec.AbstractFileSystem, directory: str, manifest: dict) -> str:
    path = posixpath.join(directory, MANIFEST_NAME)
    write_bytes(fs, path, json.dumps(manifest, indent=1).encode())
    return path


def result_files(dest: str | list[str], storage_options: dict | None = None, role: str = "dest"):
    """(filesystem, files in reading order, manifest or None) of ``dest``.

    A daskpile result is exactly the files its manifest lists, in sequence
    order; any other Parquet dataset (a directory, glob or list of files) is
    its data files in name order.  ``role`` names ``dest`` in errors.
    """
    dest = as_urls(dest, role)
    first = dest if isinstance(dest, str) else (dest or [""])[0]
    fs, path = filesystem(first, storage_options)
    with reaching(fs, path, role):  # (a store refusing the credentials said "Forbidden", naming no URL)
        if isinstance(dest, str) and exists(fs, posixpath.join(path, MANIFEST_NAME)):
            manifest = read(dest, storage_options)
            return fs, [posixpath.join(path, name) for name in manifest["files"]], manifest
        if isinstance(dest, str):
            _refuse_an_unfinished_run(fs, path)
        fs, files = data_files(dest, storage_options, role=role)
        _refuse_piles_of_unfinished_runs(fs, files, checked=path if isinstance(dest, str) else None)
        return fs, files, None


def _refuse_an_unfinished_run(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Refuse a folder named as a result whose shuffle is unfinished (a run file, no manifest): its parts are some
    piles of the result (or none yet), which ``verify`` would call a mismatch and ``quality`` might call uniform."""
    try:
        run = unfinished_run(fs, path)
    except OSError as e:  # a file, a glob: not a directory that could hold a run
        if store_unusable(e):
            raise  # (said by ``reaching``, naming the URL)
        return
    if run is not None:
        raise ValueError(
            f"{full_url(fs, path)!r} holds an unfinished daskpile run (seed {run.seed}, {run.piles} piles), not a "
            "result: run the same shuffle again to finish it (it resumes), then check the result"
        )


def unfinished_run(fs: fsspec.AbstractFileSystem, path: str) -> run_state.RunSpec | None:
    """The unfinished run whose state the folder ``path`` holds, if any; a damaged state said plainly."""
    try:
        return run_state.read(fs, path)
    except run_state.RunFileUnreadable as e:
        where, cause = full_url(fs, posixpath.join(path, run_state.RUN_FILE)), e.cause
        raise ValueError(
            f"{where} is not a daskpile run's state ({type(cause).__name__}: {cause}): remove it if you wrote it, "
            "else discard the run with overwrite=True (--overwrite)"
        ) from None


# Folders of the files named looked at for a run's state: a result's are one; a lake of thousands of partition
# folders is not one (and a request each, on an object store, is slow)
MOST_FOLDERS_LOOKED_AT = 256


def _refuse_piles_of_unfinished_runs(fs: fsspec.AbstractFileSystem, files: list[str], checked: str | None) -> None:
    """Refuse files in the folder of a run not finished (its state there, no manifest), named by a glob, a list or a
    folder above: they are some of its piles.  A trial's glob over a run stopped in pass 2 read 701,307 of
    4,000,000 rows, and ``quality`` said uniform.  The folder named (``checked``) was looked at already, with its
    own message (``_refuse_an_unfinished_run``)."""
    folders = sorted({posixpath.dirname(f) for f in files} - {checked})
    if len(folders) > MOST_FOLDERS_LOOKED_AT:
        return
    for folder in folders:
        if exists(fs, posixpath.join(folder, MANIFEST_NAME)):
            continue
        try:
            run = run_state.read(fs, folder)
        except (run_state.RunFileUnreadable, OSError):  # (not ours to judge here: another's file so named)
            continue
        if run is not None:  # (a shuffle stopped, or one running: a window's append writes a generation so)
            raise ValueError(
                f"{full_url(fs, folder)!r} holds an unfinished daskpile run (seed {run.seed}, {run.piles} piles), "
                "and the files named are some of its piles: read them once it has finished (a shuffle stopped "
                "resumes when run again)"
            )


def version_path(directory: str, version: int) -> str:
    """Where a moving window keeps version ``version`` of its manifest.

    >>> version_path("w", 3)
    'w/_daskpile_versions/v-00000003.json'
    """
    return posixpath.join(directory, VERSIONS_DIR, f"v-{version:08d}.json")


def version_of(manifest: dict) -> int:
    """The version of a moving window a manifest is; a shuffle result is version 0.

    >>> version_of({"window": {"version": 3}}), version_of({})
    (3, 0)
    """
    return (manifest.get("window") or {}).get("version", 0)


def window_version(fs: fsspec.AbstractFileSystem, directory: str, version: int) -> dict:
    """Version ``version`` of a moving window's manifest, while the grace period keeps it."""
    where = version_path(directory, version)
    try:
        with fs.open(where, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"version {version} of the window {full_url(fs, directory)!r} is gone ({full_url(fs, where)}): its "
            "manifest, and the files no later version lists, are removed once their grace period is over (retain=, "
            "--retain, default 1d): read the current version, and give the window's commands a retain longer than "
            "a job may be down between a checkpoint and its resumption"
        ) from None


@redacting_errors
def read(dest: str, storage_options: dict | None = None) -> dict:
    """The manifest of a finished result, ``dest/_daskpile.json``.

    Parameters
    ----------
    dest
        The directory :func:`shuffle_parquet` wrote, local or an fsspec URL.
    storage_options
        Passed to fsspec for ``dest``.  Default None.

    Returns
    -------
    dict
        The manifest as parsed JSON: ``piles``, ``seed``, ``rows``,
        ``rows_per_pile``, ``files`` (in sequence order), the schema,
        ``source_files``, the row ``fingerprint``, the ``pile_plan``, seconds
        per pass and library versions; see :doc:`/reference/manifest`.

    Raises
    ------
    FileNotFoundError
        If ``dest`` holds no manifest: it is not a finished daskpile result.

    Examples
    --------
    >>> import daskpile
    >>> daskpile.read_manifest("shuffled/")["piles"]
    4
    """
    fs, path = filesystem(dest, storage_options)
    fs.invalidate_cache(path)  # a listing cached before a moving window's last change is stale
    with reaching(fs, path, "dest"):
        found = exists(fs, posixpath.join(path, MANIFEST_NAME))
    if not found:
        raise FileNotFoundError(f"{dest!r} holds no {MANIFEST_NAME}: not a finished daskpile result")
    return read_at(fs, path)


def read_at(fs: fsspec.AbstractFileSystem, directory: str) -> dict:
    """The manifest in ``directory`` of ``fs``; one of another format is refused, not misread."""
    path = posixpath.join(directory, MANIFEST_NAME)
    with fs.open(path, "rb") as f:
        data = f.read()
    damaged = f"{full_url(fs, path)!r} is not a whole daskpile manifest"
    try:
        manifest = json.loads(data)
    except ValueError as e:  # (JSON, or bytes that are not UTF-8)
        raise ValueError(f"{damaged}: {e}; it was damaged after it was written: write the result again") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{damaged}: it holds a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") not in (FORMAT, WINDOW_FORMAT):
        raise ValueError(
            f"{path}: manifest format {manifest.get('format')!r}, and this daskpile reads {FORMAT!r} and "
            f"{WINDOW_FORMAT!r}: "
            "use the daskpile version that wrote it"
        )
    missing = [key for key in READ_KEYS if key not in manifest]
    if missing or len(manifest["files"]) != len(manifest["rows_per_file"]):
        said = f"it lacks {missing[0]!r}" if missing else "its files and rows_per_file differ in length"
        raise ValueError(f"{damaged}: {said}; it was changed after it was written: write the result again")
    return manifest


# What readers of a result take from its manifest (see manifest.schema.json for all it holds)
READ_KEYS = ("piles", "seed", "rows", "files", "rows_per_file", "schema")
