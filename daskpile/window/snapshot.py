"""A moving window's state: its generations, the versions of its manifest, the change under way, retired files.

A window is a pile dataset written by ``shuffle_parquet`` (generation 0, its
files at the top of ``dest``) to which ``append`` adds generations (each in
``dest/gen-NNNNNN/``, one file per pile) and from which ``expire`` drops
them.  Every change writes its files first, then a new version of the
manifest: ``_daskpile_versions/v-NNNNNNNN.json``, then the same document as
``_daskpile.json``, the one readers open.  A reader reads one version and the
files it lists; files a version no longer lists are *retired* (recorded in
``_daskpile_versions/retired.json``) and removed only after a grace period,
so that a reader still on an older version finishes.

A change under way is marked by ``_daskpile.pending.json``: running the same
command again finishes it, any other change is refused until it is finished
or discarded.  While a command runs it holds the window's dest lease
(``_lease``, as a shuffle does), so a second command on the window, or a
shuffle into it, is refused at once rather than when it commits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import posixpath
import re
import time

import numpy as np
from dask.utils import parse_timedelta

from daskpile import _random
from daskpile._storage import check_writable, exists, filesystem, full_url, reaching, remove_tree, write_bytes
from daskpile._words import count
from daskpile.checks import _fingerprint
from daskpile.checks._fingerprint import Fingerprint
from daskpile.engine import _dest, _lease, _manifest, _outputs

RETIRED = posixpath.join(_manifest.VERSIONS_DIR, "retired.json")
# {a source file's key: the generation that held it}, for the generations expire dropped: appended again, their
# rows would come back as the newest generation (and the next expire --keep drop a newer day in their place)
EXPIRED = posixpath.join(_manifest.VERSIONS_DIR, "expired.json")
PENDING = _manifest.WINDOW_PENDING
GENERATION_DIR = _manifest.GENERATION_DIR
DEFAULT_RETAIN = "1d"
_PILE_OF_NAME = re.compile(r"part-(\d+)(?:-\d{4})?\.parquet$")


class WindowBusyError(RuntimeError):
    """The window has a change under way (an ``append``, ``expire`` or ``compact`` that was interrupted).

    Run the same command again to finish it, or :func:`daskpile.discard` to
    drop it; any other change is refused until then.
    """


class WindowChangedError(WindowBusyError):
    """Another process changed the window while this command ran: this one committed nothing, and run again
    it starts from the new version."""


def generation_dir(generation: int) -> str:
    """The directory of a generation's files (generation 0's are at the top of the window).

    >>> generation_dir(3)
    'gen-000003'
    """
    return f"gen-{generation:06d}"


def generation_seed(seed: int, generation: int) -> int:
    """The seed of a generation's shuffle: the window's for generation 0, else keyed by (seed, generation).

    So a generation's scatter is keyed by (seed, generation, partition) and
    its permutation by (seed, generation, pile).

    >>> generation_seed(5, 0), generation_seed(5, 1) == generation_seed(5, 1) != generation_seed(5, 2)
    (5, True)
    """
    if generation == 0:
        return seed
    return int(_random.keyed(seed, _random.WINDOW, generation).integers(0, 2**63 - 1))


@dataclasses.dataclass(frozen=True)
class Generation:
    """One append (or generation 0, the first shuffle; or a compaction of several): its files, per pile."""

    number: int
    files: tuple[str, ...]  # relative to the window, in pile order
    file_piles: tuple[int, ...]
    rows_per_file: tuple[int, ...]
    fingerprint: dict | None  # of the rows read from its sources (minus those a compaction cut)
    source_files: tuple[str, ...]
    source_stamps: tuple[str, ...]
    seed: int
    created: str
    cuts: tuple[dict, ...] = ()  # {"column", "before"} each: its rows before the value go at the next compact
    compacted: tuple[int, ...] = ()  # the generations a compaction merged
    null_columns: tuple[str, ...] | None = None  # the columns of its rows holding a null; None: not recorded

    @property
    def rows(self) -> int:
        return int(sum(self.rows_per_file))

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: dict) -> Generation:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Window:
    """The version of a window ``_daskpile.json`` holds (a plain shuffle result is version 0 of a window)."""

    fs: object
    path: str
    base: dict  # the manifest, for what every generation shares: piles, seed, schema, second pass
    version: int
    generations: tuple[Generation, ...]
    next_generation: int

    @property
    def url(self) -> str:
        return full_url(self.fs, self.path)

    @property
    def piles(self) -> int:
        return int(self.base["piles"])

    @property
    def seed(self) -> int:
        return int(self.base["seed"])

    @property
    def appends_lazily(self) -> bool:
        """Whether an append leaves its piles unpermuted: the window began as a lazy shuffle (``--lazy``)."""
        recorded = (self.base.get("window") or {}).get("lazy")
        return self.base.get("second_pass") == "lazy" if recorded is None else bool(recorded)

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self.generations)

    @classmethod
    def load(cls, dest: str, storage_options: dict | None = None, version: int | None = None) -> Window:
        """The window at ``dest``, to change it: the current version, or ``version`` (kept for the grace period).
        A generation's folder, which holds a manifest of its own, is refused."""
        fs, path = filesystem(dest, storage_options)
        fs.invalidate_cache(path)  # a long-lived process may have listed it before the last change
        if version is not None:
            manifest = _manifest.window_version(fs, path, version)
        else:
            try:
                manifest = _manifest.read(dest, storage_options)
            except FileNotFoundError as e:  # (a folder of Parquet files Dask wrote, most often)
                raise FileNotFoundError(
                    f"{e}: a window starts as a shuffle of its first data, with daskpile (daskpile shuffle SOURCE "
                    f"{dest}, or shuffle_parquet), its generation 0"
                ) from None
        _dest.check_outside_a_window(fs, path)
        return cls.from_manifest(fs, path, manifest)

    @classmethod
    def from_manifest(cls, fs, path: str, manifest: dict) -> Window:
        _outputs.require_parquet(manifest, full_url(fs, path), "a moving window")
        window = manifest.get("window")
        if window is not None:
            generations = tuple(Generation.from_json(g) for g in window["generations"])
            return cls(fs, path, manifest, window["version"], generations, window["next_generation"])
        run = manifest.get("run") or {}
        if run.get("rows_per_file") is not None:
            raise ValueError(
                f"{full_url(fs, path)!r} was cut into files of {run['rows_per_file']:,} rows (rows_per_file), "
                "not one file per pile: it cannot take appends; shuffle it again without rows_per_file"
            )
        first = Generation(
            number=0,
            files=tuple(manifest["files"]),
            file_piles=tuple(pile_of_name(name) for name in manifest["files"]),
            rows_per_file=tuple(manifest["rows_per_file"]),
            fingerprint=manifest.get("fingerprint"),
            source_files=tuple(manifest["source_files"]),
            source_stamps=tuple(run.get("source_stamps", ())),
            seed=int(manifest["seed"]),
            created=manifest.get("created", ""),
            null_columns=recorded_nulls(manifest.get("null_columns")),
        )
        return cls(fs, path, manifest, 0, (first,), 1)

    def manifest(self, version: int, generations: list[Generation], next_generation: int) -> dict:
        """The manifest of a new version holding ``generations``: files in pile order, generations within."""
        order = sorted(
            ((pile, position, g, f) for position, g in enumerate(generations) for f, pile in enumerate(g.file_piles)),
            key=lambda item: item[:2],
        )
        rows_per_pile = np.zeros(self.piles, dtype=np.int64)
        for g in generations:
            np.add.at(rows_per_pile, np.array(g.file_piles, dtype=np.int64), np.array(g.rows_per_file, np.int64))
        fingerprints = [Fingerprint.from_json(g.fingerprint) if g.fingerprint else None for g in generations]
        total = _fingerprint.total(fingerprints) if all(f is not None for f in fingerprints) else None
        manifest = _manifest.build(
            piles=self.piles,
            seed=self.seed,
            rows_per_pile=rows_per_pile.tolist(),
            files=[g.files[f] for _, _, g, f in order],
            rows_per_file=[g.rows_per_file[f] for _, _, g, f in order],
            schema=_manifest.arrow_schema(self.base),
            source_files=[s for g in generations for s in g.source_files],
            seconds={"scatter": 0.0, "gather": 0.0},
            fingerprint=total,
            source=self.base.get("source"),
            # what a plain reader gets: piles unpermuted if any generation is (a compaction's are permuted)
            second_pass="lazy" if self.appends_lazily and any(not g.compacted for g in generations) else "eager",
            null_columns=nulls_of(generations),
        )
        manifest["format"] = _manifest.WINDOW_FORMAT
        manifest["pile_plan"] = self.base.get("pile_plan")
        manifest["window"] = {
            "version": version,
            "next_generation": next_generation,
            "file_piles": [pile for pile, _, _, _ in order],
            "lazy": self.appends_lazily,
            "generations": [g.to_json() for g in generations],
        }
        return manifest

    def commit(
        self, generations: list[Generation], next_generation: int | None = None, retain: str | float | None = None
    ) -> Window:
        """Write the next version holding ``generations``; the files it no longer lists are retired (kept for
        ``retain``, when given, whatever a later command's default)."""
        version = self.version + 1
        self._check_unchanged()
        manifest = self.manifest(version, generations, next_generation or self.next_generation)
        listed = set(manifest["files"])
        gone = [f for g in self.generations for f in g.files if f not in listed]
        if self.version == 0 and not exists(self.fs, _manifest.version_path(self.path, 0)):
            write_bytes(self.fs, _manifest.version_path(self.path, 0), json.dumps(self.base, indent=1).encode())
        superseded = posixpath.relpath(_manifest.version_path(self.path, self.version), self.path)
        retire(self.fs, self.path, [*_directories_of(gone, listed), superseded], retain)
        write_bytes(self.fs, _manifest.version_path(self.path, version), json.dumps(manifest, indent=1).encode())
        _manifest.write(self.fs, self.path, manifest)  # the switch: readers opening it now read this version
        return Window.from_manifest(self.fs, self.path, manifest)

    def _check_unchanged(self) -> None:
        """Refuse to commit over a version another process wrote since this one was read."""
        self.fs.invalidate_cache(self.path)
        now = _manifest.read_at(self.fs, self.path)
        if _manifest.version_of(now) != self.version:
            raise WindowChangedError(
                f"{self.url!r} changed while this command ran (version {self.version} then, "
                f"{_manifest.version_of(now)} now): another process changed it; run one change at a time"
            )


def pile_of_name(name: str) -> int:
    """The pile a file holds, from its name.

    >>> pile_of_name("gen-000002/part-00007-0001.parquet")
    7
    """
    found = _PILE_OF_NAME.search(name)
    if found is None:
        raise ValueError(f"{name!r} is not a pile file (part-NNNNN.parquet)")
    return int(found.group(1))


def _directories_of(files: list[str], listed: set[str]) -> list[str]:
    """Files to retire, a generation directory whole when none of its files stays listed."""
    listed_dirs = {posixpath.dirname(f) for f in listed}
    result, whole = [], set()
    for f in files:
        directory = posixpath.dirname(f)
        if directory and GENERATION_DIR.match(directory) and directory not in listed_dirs:
            if directory not in whole:
                whole.add(directory)
                result.append(directory)
        else:
            result.append(f)
    return result


@dataclasses.dataclass
class WindowReport:
    """What a window command did; ``print`` it for one line.

    Parameters
    ----------
    dest
        The window's URL.
    version
        The version of the manifest the command left current.
    generations
        The generations the window holds now.
    rows
        The rows of the window now.
    changed
        False when there was nothing to do (the same append already in the
        window, nothing to expire or compact).
    summary
        What was done, in words.
    generation
        The generation the command wrote (append, compact), else None.
    shuffle
        For an append, the report of the new generation's shuffle.
    removed
        Retired files removed because their grace period had passed.
    """

    dest: str
    version: int
    generations: list[int]
    rows: int
    changed: bool
    summary: str
    generation: int | None = None
    shuffle: object | None = None  # a ShuffleReport
    removed: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        n = len(self.removed)
        removed = f"; removed {n:,} retired {'file or folder' if n == 1 else 'files or folders'}" if n else ""
        deaths = "" if self.shuffle is None else self.shuffle.deaths_said  # (its own workers' deaths, if any)
        return (
            f"{self.summary}: {self.dest} is at version {self.version}, {count(len(self.generations), 'generation')}, "
            f"{count(self.rows, 'row')}{removed}{deaths}"
        )

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["shuffle"] = None if self.shuffle is None else str(self.shuffle)
        return data


def report(window: Window, changed: bool, summary: str, **extra) -> WindowReport:
    return WindowReport(
        window.url, window.version, [g.number for g in window.generations], window.rows, changed, summary, **extra
    )


# ---- the change under way ----


def one_change_at_a_time(command):
    """``command(dest, ..., storage_options=...)`` run under the dest lease of the window ``dest``.

    Without it, two commands started together on one window (a cron job's
    append beside a compact by hand) both did their work, and the later
    commit was refused ("changed while this command ran"); two of the same
    command both resumed one pending change.  With it, the second is refused
    before it reads the window (``DestBusyError``), writing nothing.
    """

    @functools.wraps(command)
    def under_the_lease(dest: str, *args, storage_options: dict | None = None, **kwargs):
        fs, path = filesystem(dest, storage_options)
        with reaching(fs, path, "window"):
            found = exists(fs, path)
        if not found:  # (before the lease, which would make it)
            raise FileNotFoundError(
                f"{full_url(fs, path)!r} does not exist: a window starts as an ordinary shuffle, its generation 0 "
                f"(daskpile shuffle SOURCE {dest})"
            )
        check_writable(fs, path, "window")  # (every command writes its lease: else a bare "Read-only file system")
        before = None
        try:
            with _lease.held(fs, path):
                before = _version_now(fs, path)
                return command(dest, *args, storage_options=storage_options, **kwargs)
        except KeyboardInterrupt as e:
            _say_what_an_interruption_left(e, fs, path, before)
            raise

    return under_the_lease


def _version_now(fs, path: str) -> int | None:
    try:
        return _manifest.version_of(_manifest.read_at(fs, path))
    except (OSError, ValueError):  # not a window (yet): its command says so
        return None


def _say_what_an_interruption_left(e: KeyboardInterrupt, fs, path: str, before: int | None) -> None:
    """Mark an interrupted window command's ``KeyboardInterrupt`` (for the command line's one line): the change
    committed (the window at a newer version), under way (its marker: the same command finishes it), or none
    begun.  An interruption during its shuffle says where that one's state is instead."""
    url = full_url(fs, path)
    with contextlib.suppress(Exception):  # what can be said: the interruption itself is what was asked for
        if before is not None and (_version_now(fs, path) or 0) > before:
            e.add_note(
                f"the window at {url} was at its new version when interrupted: the same command again reports it"
            )
            e.daskpile_committed = url
        elif read_pending(fs, path) is not None:
            if not hasattr(e, "daskpile_state"):
                e.add_note(f"a change of the window at {url} is under way: the same command again finishes it")
            e.daskpile_pending = url  # (with its shuffle's state: the command line says both, and discard)
        else:
            e.daskpile_unchanged = url


def begin(
    window: Window, command: str, key: dict, description: str, generation: int | None, scratch: str | None = None
) -> dict:
    """Mark ``command`` as under way on ``window`` (or find it under way already: its record, to resume it);
    refuse another.

    ``scratch``: where its shuffle keeps scratch (None: the temporary directory), for ``discard``.  The
    version it began on tells ``discard`` whether it committed before it was stopped.
    """
    fs, path = window.fs, window.path
    pending = check_idle(fs, path, command, key)
    if pending is not None:
        return pending
    record = {
        "command": command,
        "key": key,
        "description": description,
        "generation": generation,
        "version": window.version,
        "scratch": scratch,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    write_bytes(fs, posixpath.join(path, PENDING), json.dumps(record, indent=1).encode())
    return record


def check_idle(fs, path: str, command: str, key: dict) -> dict | None:
    """The record of this very command under way (None if none is); WindowBusyError if another is."""
    pending = read_pending(fs, path)
    if pending is None or (pending["command"] == command and pending["key"] == key):
        return pending
    then = pending["key"]
    files_then, files_now = then.get("source_files"), key.get("source_files")
    if pending["command"] == command == "append" and (
        files_then == files_now or _one_holds_the_other(files_then, files_now)
    ):
        # this very append run again, on files changed since it began (or a folder's files): it cannot finish it
        what = _how_the_files_changed(then, key)
        raise WindowBusyError(
            f"{full_url(fs, path)!r} has an unfinished `daskpile append` ({pending['description']}, started "
            f"{pending['started']}) that this one cannot finish: {what}. If it is still running, let it finish; "
            "else `daskpile discard` it, then run this again"
        )
    raise WindowBusyError(
        f"{full_url(fs, path)!r} has an unfinished `daskpile {pending['command']}` ({pending['description']}, "
        f"started {pending['started']}): if it is still running, let it finish; if it was interrupted, run it "
        "again to finish it, or `daskpile discard` to drop it"
    )


def _one_holds_the_other(then: list[str] | None, now: list[str] | None) -> bool:
    """Whether one append's files hold the other's: the same command run again on a folder a file arrived in
    or left (a late file of the day), not another day's append from the same landing folder."""
    before, after = set(then or ()), set(now or ())
    return bool(before and after) and (before <= after or after <= before)


def _how_the_files_changed(then: dict, now: dict) -> str:
    """What differs between an unfinished append's files and this one's, for its message."""
    before, after = list(then.get("source_files") or ()), list(now.get("source_files") or ())
    before_set, after_set = set(before), set(after)
    new = [url for url in after if url not in before_set]
    gone = [url for url in before if url not in after_set]
    if new or gone:
        said = [f"{count(len(after), 'file')} now, {len(before):,} then"]
        said += [f"{new[0]} is new"] if new else []
        said += [f"{gone[0]} is gone"] if gone else []
        return f"its files differ ({'; '.join(said)})"
    changed = [url for url, old, new in zip(after, then.get("source_stamps", ()), now.get("source_stamps", ()),
                                            strict=False) if old != new]  # fmt: skip
    return f"{changed[0]} changed since it began" if changed else "its seed differs"


def read_pending(fs, path: str) -> dict | None:
    fs.invalidate_cache(path)
    return _read_json(fs, posixpath.join(path, PENDING), None)


def _read_json(fs, path: str, missing):
    """A small JSON file of the window's own (its marker, its retired list), or ``missing`` if there is none."""
    try:
        with fs.open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        return missing


def finish(fs, path: str) -> None:
    target = posixpath.join(path, PENDING)
    if exists(fs, target):
        fs.rm(target)


# ---- retired files ----


def retire(fs, path: str, names: list[str], retain: str | float | None = None) -> None:
    """Record ``names`` (relative to the window) as no longer listed from now: removable after the grace period,
    ``retain`` if given (recorded with them: a later command's default does not cut it short).

    Written before the manifest that stops listing them, so that nothing is
    ever unlisted without being recorded; ``collect`` never removes what the
    current version lists.
    """
    if not names:
        return
    # a name retired before (by a change that was then discarded) starts its grace period again now
    renamed = set(names)
    entries = [{**e, "names": [n for n in e["names"] if n not in renamed]} for e in read_retired(fs, path)]
    entry = {"names": list(names), "since": time.time()}
    if retain is not None:
        entry["retain"] = parse_timedelta(retain)
    entries = [e for e in entries if e["names"]] + [entry]
    write_bytes(fs, posixpath.join(path, RETIRED), json.dumps(entries, indent=1).encode())


def record_expired(fs, path: str, generations: list[Generation]) -> None:
    """Remember the source files of ``generations``, which expire drops (before the version that drops them)."""
    if not generations:
        return
    known = read_expired(fs, path)
    known.update({source_key(url): g.number for g in generations for url in g.source_files})
    # and their rows' fingerprints: a day copied to another path is the same rows (a trial's expired day, copied,
    # came back as the newest generation)
    known.update({rows_key(g.fingerprint): g.number for g in generations if g.rows and g.fingerprint})
    write_bytes(fs, posixpath.join(path, EXPIRED), json.dumps(known).encode())


def read_expired(fs, path: str) -> dict[str, int]:
    return _read_json(fs, posixpath.join(path, EXPIRED), {})


def source_key(url: str, stamp: str | None = None) -> str:
    """A source file as ``expired.json`` keeps it: 16 hex digits of the SHA-256 of its URL (with its stamp, as
    windows expired by daskpile of 2026-11-29 kept it).  A year of a feed of a thousand files a day is a few
    MB, not the URLs' tens.

    >>> source_key("s3://lake/day=1/a.parquet"), source_key("s3://lake/day=1/a.parquet", "1024:1795666202.1")
    ('d6ba77c63c4c452d', 'a377d28ee54fed74')
    """
    return hashlib.sha256((url if stamp is None else f"{url}\n{stamp}").encode()).hexdigest()[:16]


def rows_key(fingerprint: dict) -> str:
    """A generation's rows as ``expired.json`` keeps them: ``rows:`` and 16 hex digits of the SHA-256 of their
    fingerprint (which does not depend on their order, nor on where they were read).

    >>> rows_key({"rows": 2, "sum": 7, "xor": 5})
    'rows:d2fa9677bfd3f316'
    """
    return "rows:" + hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def read_retired(fs, path: str) -> list[dict]:
    return _read_json(fs, posixpath.join(path, RETIRED), [])


def collect(window: Window, retain: str | float | None) -> list[str]:
    """Remove the retired files whose grace period has passed: ``retain`` if given, else the one they were
    retired with (``DEFAULT_RETAIN`` if none was); the names removed."""
    default = parse_timedelta(DEFAULT_RETAIN)
    entries = read_retired(window.fs, window.path)
    if not entries:
        return []
    listed = {f for g in window.generations for f in g.files}
    listed |= {posixpath.dirname(f) for f in listed}
    listed.add(posixpath.relpath(_manifest.version_path(window.path, window.version), window.path))
    now, kept, removed = time.time(), [], []
    for entry in entries:
        seconds = parse_timedelta(retain) if retain is not None else entry.get("retain", default)
        if now - entry["since"] < seconds:
            kept.append(entry)
            continue
        for name in entry["names"]:
            if name not in listed:
                remove_tree(window.fs, posixpath.join(window.path, name))
                removed.append(name)
    if removed or len(kept) != len(entries):
        write_bytes(window.fs, posixpath.join(window.path, RETIRED), json.dumps(kept, indent=1).encode())
    return removed


def recorded_nulls(null_columns: list[str] | None) -> tuple[str, ...] | None:
    """A manifest's ``null_columns`` as a generation keeps them (None: not recorded)."""
    return None if null_columns is None else tuple(null_columns)


def nulls_of(generations) -> tuple[str, ...] | None:
    """The columns holding a null in any of ``generations``; None if one of them did not record its own."""
    nulls = _manifest.union_of_nulls(g.null_columns for g in generations)
    return None if nulls is None else tuple(sorted(nulls))
