"""``append``: scatter new rows into the piles of a window, as a new generation."""

from __future__ import annotations

import dataclasses
import datetime
import os
import posixpath
import warnings

from daskpile._storage import file_stamp, full_url, is_local, redacting_errors, remove_tree
from daskpile._validate import check_bytes
from daskpile._words import count
from daskpile.engine import _manifest, _passes
from daskpile.engine._pipeline import shuffle_plan
from daskpile.engine._places import check_dest_outside_source
from daskpile.engine._sizing import NotEnoughSpace
from daskpile.sources import MixedFormatsError, plan_sources
from daskpile.sources.parquet import open_parquet
from daskpile.sources.read import Reading
from daskpile.sources.schemas import conformer, nullable, with_geo_of_all
from daskpile.window import snapshot
from daskpile.window.snapshot import Generation, Window, WindowReport, report


@redacting_errors
@snapshot.one_change_at_a_time
def append(
    dest: str,
    source: str | list[str],
    *,
    seed: int | None = None,
    scratch: str | None = None,
    storage_options: dict | None = None,
    verify: bool = True,
    progress: bool = False,
    retain: str | float | None = None,
    blocksize: int | str = _passes.BLOCKSIZE,
    partitioning="hive",
    stray_files: str = "skip",
    again: bool = False,
) -> WindowReport:
    """Scatter the rows of ``source`` into the piles of the window ``dest``, as a new generation.

    Costs what ``shuffle_parquet`` of ``source`` alone costs: the window's
    rows are not read.  The generation is one file per pile in
    ``dest/gen-NNNNNN/``, scattered with the generator keyed by (seed,
    generation, partition); then a new version of the manifest lists it.
    Readers of the previous version are not disturbed.  Appending the same
    files again (unchanged) does nothing; an interrupted append is finished by
    running it again.

    Parameters
    ----------
    dest
        A result of ``shuffle_parquet`` (generation 0) or a window already
        appended to: one file per pile (not ``rows_per_file``).
    source
        Files of one format, as for ``shuffle_parquet``: Parquet, or text
        (CSV, TSV, JSON lines, lines; Arrow, ORC), which is parsed into the
        window's columns and types, with the read options its first data was
        read with where the day is in that format.  Its rows must have the
        window's columns and types (column order, nullability and ``string``
        against ``large_string`` may differ); a mismatch is refused naming the
        column (for text, the file and the line), before anything is written.
    seed
        The seed of this generation's scatter, with the generation number.
        Default None: the window's seed.
    scratch, storage_options, verify, progress, blocksize, partitioning, stray_files
        As for ``shuffle_parquet``.
    retain
        How long files that a version no longer lists are kept for readers
        still on it ("1d", "12h", seconds): those retired longer ago than this
        are removed now.  Default: the retain they were retired with, else
        ``"1d"``; given, it is recorded with the files this call retires.
    again
        Append files at a path a generation holds that have changed since (a
        landing path a feed writes every day), files of a generation
        ``expire`` dropped (by ``--keep`` or ``--before``), or rows a
        generation of the window holds already (the same day under another
        path, found by the fingerprints): all refused by default, since the
        rows may be there twice or come back as the newest generation.

    Returns
    -------
    WindowReport

    Raises
    ------
    WindowBusyError
        If another change (an interrupted ``compact`` or ``expire``, or an
        append of other files) is under way: finish it or ``discard`` it.
    DestBusyError
        If another command or run is writing the window now: wait for it.
    ValueError
        If the files do not fit the window's schema, some (not all) of them
        are in the window already, or one has changed since it was appended.

    Examples
    --------
    >>> import daskpile
    >>> report = daskpile.append("window/", "day-2/")  # window/: generations 0 and 1, 40,000 rows
    >>> report.generation, report.generations, report.rows
    (2, [0, 1, 2], 50000)
    >>> daskpile.append("window/", "day-2/").changed  # the same files again: nothing to do
    False
    """
    blocksize = check_bytes("blocksize", blocksize)
    window = load_window(dest, source, storage_options)
    plan = _plan_into_window(window, source, storage_options, partitioning, stray_files)
    key = {"source_files": plan.urls, "source_stamps": plan.stamps, "seed": seed}
    pending = snapshot.check_idle(window.fs, window.path, "append", key)
    resuming = pending is not None
    held = _appended_already(window, plan, partly_refused=not resuming, again=again)
    if held is None and not resuming and not again:
        _refuse_expired(window, plan)
    if held is not None:  # appended already (and committed, if it was interrupted after that)
        snapshot.finish(window.fs, window.path)
        summary = f"already appended as generation{'s' * (len(held) > 1)} {', '.join(map(str, held))}: nothing to do"
        return report(window, False, summary, generation=held[-1], removed=snapshot.collect(window, retain))
    removed = snapshot.collect(window, retain)
    description = f"append of {count(len(plan.urls), 'file')} ({', '.join(plan.urls[:2])}...)"
    pending = snapshot.begin(window, "append", key, description, window.next_generation, scratch=scratch)
    generation = pending["generation"]
    generation_path = posixpath.join(window.path, snapshot.generation_dir(generation))
    generation_seed = snapshot.generation_seed(window.seed if seed is None else seed, generation)
    try:
        shuffled = shuffle_plan(
            plan, source, full_url(window.fs, generation_path), window.piles, seed=generation_seed,
            # a fresh append takes the place of whatever an abandoned (discarded) attempt left there
            scratch=scratch, storage_options=storage_options, overwrite=not resuming, verify=verify,
            memory_per_pile=None,
            progress=progress, blocksize=blocksize, on_oversize="split", rows_per_file=None,
            second_pass="lazy" if window.appends_lazily else "eager", window_generation=True,
        )  # fmt: skip
    except (ValueError, TypeError, NotEnoughSpace):  # bad input found in pass 1, or no room: nothing worth resuming
        if not resuming:
            remove_tree(window.fs, generation_path)
            snapshot.finish(window.fs, window.path)
        raise
    new = _generation(generation, window)
    twin = _same_rows(window, new) if not again else None
    if twin is not None:  # nothing committed: the window stays as it was, with no change under way
        remove_tree(window.fs, generation_path)
        snapshot.finish(window.fs, window.path)
        raise ValueError(
            f"the rows of {plan.urls[0]}{' and the rest' if len(plan.urls) > 1 else ''} are those of generation "
            f"{twin}: the same day under another path? Pass again=True (--again on the command line) to append "
            "them anyway"
        )
    window = window.commit([*window.generations, new], next_generation=generation + 1, retain=retain)
    snapshot.finish(window.fs, window.path)
    removed += snapshot.collect(window, retain)  # those due now (all of them with retain=0)
    summary = f"appended generation {generation} ({count(new.rows, 'row')})"
    if not new.rows:  # (a file cut short upstream: a 0-byte day came in as one, a trial found)
        warnings.warn(
            f"{plan.urls[0]}{' and the rest' if len(plan.urls) > 1 else ''} held no row: generation {generation} is "
            "empty, and counts toward expire --keep as a day of rows would",
            stacklevel=4,  # (the caller's line, above one_change_at_a_time and redacting_errors)
        )
    return report(window, True, summary, generation=generation, shuffle=shuffled, removed=removed)


def load_window(dest: str, source: str | list[str], storage_options: dict | None) -> Window:
    """The window ``dest``, to append ``source`` to; when ``dest`` is none and a source is a daskpile result,
    the two were given the wrong way round (Python's order is the command line's reversed)."""
    try:
        return Window.load(dest, storage_options)
    except FileNotFoundError as e:
        sources = [source] if isinstance(source, str) else list(source)
        results = [s for s in sources if _is_result(s, storage_options)]
        if not results:
            raise
        raise FileNotFoundError(
            f"{dest!r} is not a window, and {results[0]!r}, given as a source, is a daskpile result: the two the "
            "wrong way round? The window comes last on the command line (daskpile append SOURCE... DEST) and first "
            "in Python (append(dest, source))"
        ) from e


def _is_result(path: str, storage_options: dict | None) -> bool:
    try:
        _manifest.read(path, storage_options)
    except (OSError, ValueError):
        return False
    return True


def _plan_into_window(window: Window, source, storage_options, partitioning, stray_files):
    """The source planned into the window's schema; a first file that does not fit is refused at once.

    A file already in a generation of the window (unchanged), or inside the
    window's directory, is refused: its rows would be there twice.
    """
    plan = _plan(source, storage_options, partitioning, stray_files)
    check_dest_outside_source(plan.fs, [f.path for f in plan.files], source, window.fs, window.path)
    schema = nullable(_manifest.arrow_schema(window.base))  # (a first day declared never null, a later one null)
    # a GeoParquet window's new files hold the day's rows: the day's extent, not the window's first data's
    schema = with_geo_of_all(schema, [plan.reading.schema])
    reference = window.url  # (quoted in messages: the window's own name, not a label around it)
    if plan.reading.text is not None:
        return _text_into_window(window, plan, source, storage_options, partitioning, stray_files, schema)
    first = plan.files[0]
    with open_parquet(plan.fs, first.path) as parquet:
        conformer(parquet.schema_arrow, schema, dict(first.keys), "window", full_url(plan.fs, first.path), reference)
    return dataclasses.replace(plan, reading=Reading(schema, "window", reference))


def _plan(source, storage_options, partitioning, stray_files, format="auto", read_options=None):
    try:
        return plan_sources(
            source, storage_options, partitioning=partitioning, schema="strict", stray_files=stray_files,
            format=format, read_options=read_options,
        )  # fmt: skip
    except MixedFormatsError as e:  # (its advice, format=, is not append's: a day is read as it is named)
        raise ValueError(
            f"{e.found}: append reads the files of one format: move the others out, or name the day's files (a "
            "glob, such as 'day=2026-11-01/*.parquet')"
        ) from None


def _text_into_window(window: Window, plan, source, storage_options, partitioning, stray_files, schema):
    """Text (CSV, JSON lines, lines; Arrow and ORC files too) parsed straight into the window's columns and
    types, with the read options the window's first data was read with where the day is in its format.  A
    field or column the window lacks, or a value its type cannot hold, is refused naming the file."""
    base = window.base.get("source") or {}
    if base.get("format") == plan.reading.text.format and base.get("read_options"):
        plan = _plan(source, storage_options, partitioning, stray_files, base["format"], base["read_options"])
    return dataclasses.replace(
        plan, reading=dataclasses.replace(plan.reading, schema=schema, policy="window", reference=window.url)
    )


def _appended_already(window: Window, plan, partly_refused: bool, again: bool = False) -> list[int] | None:
    """The generations holding every file of the plan (unchanged since), if they do: a retried append, of
    files appended in one go or over several (a late file appended on its own).

    With ``partly_refused``, files some generation holds beside files none
    does are refused: a partly repeated append would hold rows twice.  So is
    a file at a path a generation holds that has changed since, unless
    ``again``: it may be the same day written again (its old rows are in the
    window), or a landing path a feed writes every day, and only the user
    knows which.  The changed file is named first, whatever else is held.
    """
    held = {(url, stamp): g.number for g in window.generations
            for url, stamp in zip(g.source_files, g.source_stamps, strict=False)}  # fmt: skip
    numbers = [held.get(f) for f in zip(plan.urls, plan.stamps, strict=True)]
    aliases = _held_under_other_paths(held, plan, numbers) if is_local(plan.fs) and None in numbers else {}
    numbers = [aliases[url][1] if url in aliases else number for url, number in zip(plan.urls, numbers, strict=True)]
    if None not in numbers:
        return sorted(set(numbers))
    if not partly_refused:
        return None
    held_paths = {url: number for (url, _), number in held.items()}
    for url, number in zip(plan.urls, numbers, strict=True):
        if number is None and url in held_paths and not again:
            raise ValueError(
                f"{url} is in the window already (appended in generation {held_paths[url]}) and has changed since: "
                "its rows as appended then are still in the window. If it is that data written again, drop them "
                f"first (daskpile expire {window.url} --generation {held_paths[url]}), then append; if the path "
                "holds new rows each time (a landing path), pass again=True (--again on the command line)"
            )
    for url, number in zip(plan.urls, numbers, strict=True):
        if number is not None:
            alias = f" as {aliases[url][0]}" if url in aliases else ""
            raise ValueError(
                f"{url} is in the window already (appended{alias} in generation {number}, unchanged since): "
                "append only new files"
            )
    return None


def _held_under_other_paths(held: dict, plan, numbers: list) -> dict[str, tuple[str, int]]:
    """The local files of the plan not held by their path that a generation holds under another (a link, a
    bind mount): each one's path as appended, and its generation.  By device and inode, for files unchanged
    since they were appended; a copy is another file (``_same_rows`` finds one appended alone)."""
    by_file = {}
    for (url, stamp), number in held.items():
        found = _local_file(url, stamp)
        if found is not None:
            by_file[found] = (url, number)
    aliases = {}
    for url, stamp, number in zip(plan.urls, plan.stamps, numbers, strict=True):
        found = by_file.get(_local_file(url, stamp)) if number is None else None
        if found is not None:
            aliases[url] = found
    return aliases


def _local_file(path: str, stamp: str) -> tuple[int, int] | None:
    """(device, inode) of the local file ``path`` names, if it is as ``stamp`` says (its size and mtime)."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):  # gone, or not a local path (a source on another store)
        return None
    if file_stamp({"size": found.st_size, "mtime": found.st_mtime}) != stamp:
        return None
    return found.st_dev, found.st_ino


def _same_rows(window: Window, new: Generation) -> str | None:
    """The generation of the window, or one expire dropped, whose rows are exactly ``new``'s (by their
    fingerprints), said, if one is."""
    if not new.rows or not new.fingerprint:
        return None
    twin = next((g for g in window.generations if g.fingerprint == new.fingerprint), None)
    if twin is not None:
        return f"{twin.number} (from {twin.source_files[0] if twin.source_files else 'its sources'}), row for row"
    held = {g.number for g in window.generations}  # (recorded by an expire that was then discarded)
    number = snapshot.read_expired(window.fs, window.path).get(snapshot.rows_key(new.fingerprint))
    if number is not None and number not in held:
        return (
            f"{number}, row for row, which expire has dropped since (appended again, they would come back as the "
            "newest generation, and the next expire --keep drop a recent day in their place)"
        )
    return None


def _refuse_expired(window: Window, plan) -> None:
    """Refuse files of a generation expire dropped: a day appended again by mistake would come back as the
    newest, and the next ``expire --keep`` drop a recent day in its place.  By path, whatever the file's
    stamp: a copy or a ``touch`` changes that, not the rows.  (Windows expired before daskpile kept paths
    alone recorded a path with its stamp.)"""
    expired = snapshot.read_expired(window.fs, window.path)
    held = {g.number for g in window.generations}  # (recorded by an expire that was then discarded)
    for url, stamp in zip(plan.urls, plan.stamps, strict=True):
        number = expired.get(snapshot.source_key(url), expired.get(snapshot.source_key(url, stamp)))
        if number is not None and number not in held:
            raise ValueError(
                f"{url} was in generation {number} (as appended, or compacted), which expire has dropped since: "
                "appended again, its rows would come back as the newest generation. Pass again=True (--again on "
                "the command line) to append it anyway"
            )


def _generation(number: int, window: Window) -> Generation:
    """The record of a generation, from its shuffle's manifest."""
    prefix = snapshot.generation_dir(number)
    written = _manifest.read_at(window.fs, posixpath.join(window.path, prefix))
    names = [posixpath.join(prefix, name) for name in written["files"]]
    return Generation(
        number=number,
        files=tuple(names),
        file_piles=tuple(snapshot.pile_of_name(n) for n in names),
        rows_per_file=tuple(written["rows_per_file"]),
        fingerprint=written.get("fingerprint"),
        source_files=tuple(written["source_files"]),
        source_stamps=tuple((written.get("run") or {}).get("source_stamps", ())),
        seed=int(written["seed"]),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        null_columns=snapshot.recorded_nulls(written.get("null_columns")),
    )
