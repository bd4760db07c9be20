"""``clean``: find and remove the scratch that interrupted or abandoned runs left behind.

Every run keeps its scratch in a directory ``daskpile-<name>`` under the
scratch root (the temporary directory by default).  A ``shuffle_parquet`` run
writes its description (``_daskpile.run.json``, with its dest) there, so its
scratch can be judged: it is a leftover when its dest holds its run's
finished result or another run, its source changed, or pass 2 had consumed
scratch whose piles dest no longer holds.  A dest deleted while the scratch
can still finish it is not a reason: the same command resumes from the scratch
(and pass 1 writes nothing in dest to tell a deleted dest from one not made yet).  Anything else may be
resumed, or be running: it stays, unless ``older_than`` says it is stale.
``shuffle(ddf)``'s scratch has no description but its owner (``_session``):
it goes once that Python session has ended here (killed, as a notebook's
kernel out of memory is, it removed nothing), stays while it lives whatever
``older_than`` says, and goes when older than ``older_than`` where it cannot
be judged (another machine, container or user).
"""

from __future__ import annotations

import dataclasses
import posixpath
import tempfile
import time

from dask.utils import parse_timedelta

from daskpile._storage import REDACTED, exists, file_stamps, filesystem, full_url, is_local, remove_tree
from daskpile._words import size
from daskpile.engine import _lease, _manifest, _outputs, _passes, _session
from daskpile.engine import _run as run_state
from daskpile.engine._scratch import DIRECTORY_NAME, Scratch, band_bounds, parse_scratch_name


@dataclasses.dataclass(frozen=True)
class Leftover:
    """A scratch directory, why it can go (or why it stays), its size and age."""

    url: str
    bytes: int
    age_seconds: float
    removable: bool
    reason: str

    def __str__(self) -> str:
        verb = "remove" if self.removable else "keep  "
        return f"{verb} {self.url} ({size(self.bytes)}, {format_seconds(self.age_seconds)} old): {self.reason}"


def clean(
    scratch: str | None = None,
    *,
    older_than: str | float | None = None,
    dry_run: bool = False,
    storage_options: dict | None = None,
) -> list[Leftover]:
    """List the scratch directories under ``scratch`` and remove those no run can use any more.

    ``older_than`` ("1d", "12h" or seconds) keeps anything more recent, and
    lets scratch of unknown runs older than that go too.  With ``dry_run``
    nothing is removed.

    >>> for leftover in clean(older_than="1d", dry_run=True):  # doctest: +SKIP
    ...     print(leftover)
    remove /tmp/daskpile-3f2a9c0d1b7e4a55 (781.00 MiB, 1.26 d old): its run finished: /data/out holds its result
    """
    fs, root = filesystem(scratch or tempfile.gettempdir(), storage_options)
    min_age = _age(older_than)
    if not fs.isdir(root):
        if not exists(fs, root) and not is_local(fs):  # an object store's prefix whose last scratch went
            return []
        what = "is a file" if exists(fs, root) else "does not exist"
        raise NotADirectoryError(f"scratch {full_url(fs, root)!r} {what}: give the directory runs kept scratch in")
    found = []
    for path in sorted(fs.ls(root, detail=False)):
        path = path.rstrip("/")
        if DIRECTORY_NAME.match(posixpath.basename(path)) and fs.isdir(path):
            leftover = _judge(fs, path, min_age, storage_options)
            if leftover is not None:
                found.append(leftover)
    if not dry_run:
        for leftover in found:
            if leftover.removable:
                remove_tree(fs, filesystem(leftover.url, storage_options)[1])
    return found


def _age(older_than: str | float | None) -> float | None:
    """Seconds of ``older_than`` ("1d", "12h", "30m", or seconds); a spelling Dask does not read, said plainly.

    >>> _age("12h"), _age(None)
    (43200, None)
    """
    if older_than is None:
        return None
    try:
        return parse_timedelta(older_than)
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"older_than: {older_than!r} is not an age such as 1d, 12h, 30m or 90s") from None


def _judge(fs, path: str, min_age: float | None, storage_options) -> Leftover | None:
    """The verdict on one directory named like scratch; None if it holds no daskpile scratch."""
    files = fs.find(path, detail=True)
    names = {posixpath.basename(p) for p in files}
    ours = {run_state.RUN_FILE, _session.SESSION_FILE} & names or any(parse_scratch_name(n) for n in names)
    if not ours:
        return None
    size = sum(int(info.get("size") or 0) for info in files.values())
    age = max(0.0, time.time() - max(_mtime(info) for info in files.values()))
    url = full_url(fs, path)
    if min_age is not None and age < min_age:
        return Leftover(url, size, age, False, f"newer than {format_seconds(min_age)}")
    try:
        spec = run_state.read(fs, path)
    except run_state.RunFileUnreadable:  # (truncated by a full disk, another version's): one folder, not all
        if min_age is None:
            return Leftover(url, size, age, False, "its run file cannot be read: give --older-than")
        return Leftover(url, size, age, True, f"its run file cannot be read, older than {format_seconds(min_age)}")
    running = spec is not None and _running(spec, storage_options)
    if running:  # (pass 2 only reads scratch: its files grow old while the run uses them)
        return Leftover(url, size, age, False, f"a run of {spec.dest} is writing it now ({running})")
    session = _session.owner(fs, path) if spec is None else None
    if session is not None and session.ended():
        return Leftover(url, size, age, True, f"shuffle(ddf)'s, whose Python session ended ({session})")
    if session is not None and session.here():  # (whatever its age: a notebook idle for days still holds it)
        return Leftover(url, size, age, False, f"shuffle(ddf)'s, of a live Python session ({session}): it goes with it")
    if session is not None and min_age is None:
        return Leftover(
            url, size, age, False,
            f"shuffle(ddf)'s, of a Python session this machine cannot judge ({session}: another machine, container "
            "or boot, or not Linux): give --older-than",
        )  # fmt: skip
    if spec is None:
        if min_age is None:
            return Leftover(
                url, size, age, False, "no run description (shuffle(ddf) in a live session?): give --older-than"
            )
        return Leftover(url, size, age, True, f"no run description, older than {format_seconds(min_age)}")
    try:
        reason = _why_unused(spec, fs, path, storage_options)
    except Exception as e:  # one run's dest or source out of reach (another store, its options not given)
        said = f"its dest {spec.dest} or source could not be read ({type(e).__name__}: {e}".splitlines()[0] + ")"
        if min_age is not None:
            return Leftover(url, size, age, True, f"{said}, older than {format_seconds(min_age)}")
        return Leftover(url, size, age, False, f"{said}: give the --storage-option its store needs, or --older-than")
    if reason is not None:
        return Leftover(url, size, age, True, reason)
    if min_age is not None:
        return Leftover(url, size, age, True, f"a resumable run of {spec.dest} left for {format_seconds(min_age)}")
    return Leftover(url, size, age, False, f"a resumable run of {spec.dest}: run it again to finish it")


def _running(spec: run_state.RunSpec, storage_options) -> str | None:
    """How the run of ``spec``'s dest shows it is alive (its lease renewed lately), or None."""
    try:
        lease = _lease.live(*filesystem(spec.dest, storage_options))
    except Exception:  # its dest out of reach: judged as before
        return None
    if lease is None:
        return None
    return f"its lease renewed {format_seconds(max(0.0, time.time() - float(lease.get('renewed', 0))))} ago"


def _why_unused(spec: run_state.RunSpec, fs, path: str, storage_options) -> str | None:
    """Why no run can use this scratch any more, or None if its run may still be resumed (or be running)."""
    dest_fs, dest = filesystem(spec.dest, storage_options)
    there = run_state.read(dest_fs, dest) if exists(dest_fs, dest) else None
    if there is not None and there.key() != spec.key():
        return f"its dest {spec.dest} holds another run"
    manifest_path = posixpath.join(dest, _manifest.MANIFEST_NAME)
    if there is None and exists(dest_fs, manifest_path):
        manifest = _manifest.read_at(dest_fs, dest)
        if (manifest.get("seed"), manifest.get("piles"), manifest.get("source_files")) == (
            spec.seed, spec.piles, list(spec.source_files)
        ):  # fmt: skip
            return f"its run finished: {spec.dest} holds its result"
    changed = _changed_source(spec, storage_options)
    if changed:
        return f"its source changed since ({changed})"
    scratch = Scratch(fs, path, len(spec.source_files), bands=band_bounds(spec.piles, spec.bands))
    output = _outputs.Output.from_key(spec.output)
    staging = posixpath.join(dest, spec.staging())  # an overwrite's parts, beside the result it replaces
    targets = [staging, dest] if exists(dest_fs, staging) else [dest]  # (a commit stopped halfway moved some)
    if not _passes.scratch_can_finish(scratch, dest_fs, targets, spec.piles, spec.seed, output):
        return f"pass 2 had used up part of it, and {spec.dest} no longer holds those piles"
    return None


def _changed_source(spec: run_state.RunSpec, storage_options) -> str | None:
    """The first source file that is gone or changed since the run began, if any."""
    for url, stamp in zip(spec.source_files, spec.source_stamps, strict=True):
        if REDACTED in url:  # recorded without its credentials, it cannot be opened: kept, as unchanged
            continue
        fs, path = filesystem(url, storage_options)
        try:
            now = file_stamps([fs.info(path)])[0]
        except FileNotFoundError:
            return f"{url} is gone"
        if now != stamp:
            return f"{url} changed"
    return None


def _mtime(info: dict) -> float:
    value = next((info[k] for k in ("mtime", "LastModified", "last_modified", "created") if k in info), None)
    if value is None:
        return time.time()
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def format_seconds(seconds: float) -> str:
    """A duration in the largest unit it holds once or more, to three digits at most.

    >>> format_seconds(86400), format_seconds(5400), format_seconds(2), format_seconds(150), format_seconds(0.2)
    ('1 d', '1.5 h', '2 s', '2.5 min', '0.2 s')
    >>> format_seconds(59.96), format_seconds(3599), format_seconds(86400 * 1000)
    ('1 min', '1 h', '1,000 d')
    """
    seconds = float(f"{seconds:.3g}")  # rounded first: 59.96 s is 1 min, not 60 s
    unit, size = next((u, n) for u, n in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)) if seconds >= n or n == 1)
    value = float(f"{seconds / size:.3g}")
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:g} {unit}"
