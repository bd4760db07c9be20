"""A destination directory: which of its entries are daskpile's and which the user's, and how a result lands in it.

daskpile's own entries are a result (the files its manifest lists), a run's
state, an unfinished run's parts, a moving window's state and what a killed
writer left; anything else is the user's, which daskpile never writes among
or removes.  A new result over an old one is staged beside it and committed
by a plan written first, so that a commit an interruption stopped is finished
by the next run instead of left half done.
"""

from __future__ import annotations

import json
import posixpath
import re

from daskpile._storage import (
    exists,
    full_url,
    is_temporary,
    remove_tree,
    write_bytes,
)
from daskpile.engine import _lease, _manifest, _outputs
from daskpile.engine import _run as run_state


def remove_run_state(fs, dest_path: str) -> None:
    """What a run kept in dest for a rerun: once its manifest is written, nothing needs it."""
    run_state.remove(fs, dest_path)
    remove_tree(fs, posixpath.join(dest_path, _outputs.STAMPS_DIR))


FOREIGN_NAMES_SHOWN = 10
STAGING_PREFIX = run_state.STAGING_PREFIX
COMMIT_PLAN = "_commit.json"  # in a staging directory: the commit has begun; what it removes
_PART_NAME = re.compile(r"^part-(\d{5,})(-\d{4})?\.(parquet|arrow|csv|jsonl|txt)(\.gz|\.zst)?$")


def _entries_of(fs, dest_path: str) -> dict[str, str]:
    """{name: path} of what dest holds (not dest itself: s3fs lists a "folder" marker object as an entry)."""
    entries = {}
    for path in fs.ls(dest_path, detail=False):
        path = path.rstrip("/")
        if path != dest_path.rstrip("/"):
            entries[posixpath.basename(path)] = path
    return entries


def _is_ours(name: str, manifest: dict | None, unfinished_run: run_state.RunSpec | None) -> bool:
    """Whether daskpile wrote ``name`` in dest: its result, its run state, an unfinished run's parts, temporaries."""
    return (
        name in (_manifest.MANIFEST_NAME, run_state.RUN_FILE, _outputs.STAMPS_DIR, _lease.LEASE_FILE)
        or _is_window_state(name, manifest)
        or name in (manifest or {}).get("files", ())
        or name.startswith(STAGING_PREFIX)
        or _is_our_temporary(name)
        or (unfinished_run is not None and _is_part_of(name, unfinished_run))
    )


def _is_part_of(name: str, run: run_state.RunSpec) -> bool:
    """Whether ``name`` is one the unfinished ``run`` writes: its format's, and a pile it has (any number, with
    ``rows_per_file``); a ``part-00999.parquet`` of a run of 40 piles is not its, nor a ``.txt`` of Parquet's.

    >>> run = run_state.RunSpec((), (), piles=40, seed=1, dest="d", blocksize=1)
    >>> [_is_part_of(n, run) for n in ("part-00039.parquet", "part-00039-0001.parquet", "part-00040.parquet")]
    [True, True, False]
    >>> _is_part_of("part-00001.txt", run)
    False
    """
    found = _PART_NAME.match(name)
    if not found or not name.endswith(_outputs.Output.from_key(run.output).suffix):
        return False
    return run.rows_per_file is not None or int(found[1]) < run.piles


def check(fs, dest_path: str) -> dict | None:
    """The manifest of the finished result dest holds (None if none); refuses a dest holding other files.

    daskpile's own files are its result (the files its manifest lists), its
    run state, the parts of an unfinished run and what a killed writer left.
    Anything else is the user's: daskpile never writes among it or deletes it,
    with or without ``overwrite``.  A commit that was interrupted is finished
    first.
    """
    if not exists(fs, dest_path):
        return None
    if not fs.isdir(dest_path):
        raise FileExistsError(f"dest {full_url(fs, dest_path)!r} is a file, not a directory")
    _finish_interrupted_commits(fs, dest_path)
    entries = _entries_of(fs, dest_path)
    manifest = _manifest.read_at(fs, dest_path) if _manifest.MANIFEST_NAME in entries else None
    run = _manifest.unfinished_run(fs, dest_path) if run_state.RUN_FILE in entries else None
    foreign = sorted(n for n in entries if not _is_ours(n, manifest, run))
    if foreign:
        shown = ", ".join(foreign[:FOREIGN_NAMES_SHOWN]) + (
            f" and {len(foreign) - FOREIGN_NAMES_SHOWN} more" if len(foreign) > FOREIGN_NAMES_SHOWN else ""
        )
        raise FileExistsError(
            f"dest {full_url(fs, dest_path)!r} holds files daskpile did not write ({shown}); daskpile writes "
            "only into a new or empty directory or over its own result, and never removes other files: "
            "choose another dest"
        )
    return manifest


def _is_window_state(name: str, manifest: dict | None) -> bool:
    """A moving window's generations, manifest versions, marker of a change under way (also those of a first
    append that was interrupted), and generation 0's files, listed or retired (kept for the grace period)."""
    if name in (_manifest.VERSIONS_DIR, _manifest.WINDOW_PENDING) or _manifest.GENERATION_DIR.match(name):
        return manifest is not None
    return manifest is not None and "window" in manifest and bool(_PART_NAME.match(name))


def _is_our_temporary(name: str) -> bool:
    """The temporary of a part file or of the lease (a renewal): left behind only by a writer killed before it
    could commit."""
    return _is_part_temporary(name) or (name.startswith(f".{_lease.LEASE_FILE}.") and is_temporary(name))


def _is_part_temporary(name: str) -> bool:
    """The temporary of a part file: swept once pass 2's tasks are done (a killed writer's, of this run or an
    interrupted one)."""
    return name.startswith(".part-") and is_temporary(name)


def remove_temporaries(fs, directory: str) -> None:
    try:
        entries = _entries_of(fs, directory)
    except FileNotFoundError:  # (a store's folder of no file: none to remove; what is missing is said after)
        return
    for name, path in entries.items():
        if _is_part_temporary(name):  # (not the lease's: the running command's renewal may be writing it)
            fs.rm(path)


def discard_unfinished(fs, dest_path: str) -> None:
    """Remove what an interrupted run left in dest, keeping a finished result if there is one."""
    if not exists(fs, dest_path):
        return
    entries = _entries_of(fs, dest_path)
    finished = _manifest.MANIFEST_NAME in entries
    for name, path in entries.items():
        if (
            name in (run_state.RUN_FILE, _outputs.STAMPS_DIR)
            or name.startswith(STAGING_PREFIX)
            or (not finished and _PART_NAME.match(name))
            or _is_part_temporary(name)  # (not the lease's: the running command's renewal may be writing it)
        ):
            fs.rm(path, recursive=True)


def commit_staged(fs, dest_path: str, staging: str, names: list[str], old_result: dict) -> None:
    """Replace an old result by the staged new one: manifest first, so no reader takes the mix as complete.

    Removes exactly the old result's files (those its manifest lists) and
    daskpile's leftovers, nothing else.  What it will remove is written into
    the staging directory first, so an interrupted commit is finished by the
    next run (``_finish_interrupted_commits``) rather than left half done.
    """
    old_files = {n for n in old_result.get("files", []) if _PART_NAME.match(n)} - set(names)
    old_files |= {n for n in _entries_of(fs, dest_path) if _is_window_state(n, old_result)}
    stale = [n for n in _entries_of(fs, dest_path) if n.startswith(STAGING_PREFIX) and n != posixpath.basename(staging)]
    plan = {"remove": sorted(old_files | set(stale)), "move": names}
    write_bytes(fs, posixpath.join(staging, COMMIT_PLAN), json.dumps(plan).encode())
    _finish_commit(fs, dest_path, staging)


def _finish_commit(fs, dest_path: str, staging: str) -> None:
    with fs.open(posixpath.join(staging, COMMIT_PLAN), "rb") as f:
        plan = json.load(f)
    old_manifest = posixpath.join(dest_path, _manifest.MANIFEST_NAME)
    if exists(fs, old_manifest):
        fs.rm(old_manifest)
    for name in plan["remove"]:
        remove_tree(fs, posixpath.join(dest_path, name))
    for name in plan["move"]:
        source, target = posixpath.join(staging, name), posixpath.join(dest_path, name)
        if exists(fs, source):  # (those moved before an interruption are there already)
            _move_part(fs, source, target)
    remove_tree(fs, staging)


def _move_part(fs, source: str, target: str) -> None:
    """Move a staged part into dest; a text part's stamp goes with it, so a run killed before its manifest
    still finds the part done (a move on a store is a copy: the stamp is made again for the copy)."""
    stamp = _outputs.read_stamp(fs, source) if _outputs.stamped_beside(source) else None
    fs.mv(source, target)
    if stamp is not None:
        _outputs.write_stamp(fs, target, stamp)


def _finish_interrupted_commits(fs, dest_path: str) -> None:
    """Finish a commit that an interruption stopped halfway: its run had passed verification."""
    for name, path in _entries_of(fs, dest_path).items():
        if name.startswith(STAGING_PREFIX) and exists(fs, posixpath.join(path, COMMIT_PLAN)):
            _finish_commit(fs, dest_path, path)


def check_outside_a_window(dest_fs, dest_path: str) -> None:
    """A folder of a moving window (a generation's ``gen-NNNNNN/``, which holds a manifest of its own) is
    refused as dest: a shuffle there replaced a generation's files under the window's readers, and an append
    there started a window inside the window, which lost it when the generation was retired."""
    parent = posixpath.dirname(dest_path.rstrip("/"))
    if not parent or parent == dest_path.rstrip("/"):
        return
    try:  # (one request: no manifest there is the common case)
        window = _manifest.read_at(dest_fs, parent).get("window")
    except (OSError, ValueError):  # none, or not a whole manifest: not a window daskpile can name
        return
    if window is not None:
        raise ValueError(
            f"dest {full_url(dest_fs, dest_path)!r} is inside the moving window {full_url(dest_fs, parent)!r} "
            f"(version {window['version']}): its folders are the window's, changed only through it (daskpile "
            "append, expire, compact): give the window itself, or a dest outside it"
        )
