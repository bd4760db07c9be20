"""Where a run reads and writes: dest and scratch apart from the source and from each other, and seen by the
cluster's workers, all checked before anything is written."""

from __future__ import annotations

import os
import posixpath

from daskpile._compute import current_client, workers_blind_to, workers_blind_to_memory, workers_missing
from daskpile._storage import FileVersion, full_url, is_local, is_memory


def _real(fs):
    """How paths of ``fs`` compare: locally through symlinks too (a link to the source is the source)."""
    return (lambda p: os.path.realpath(p).rstrip("/")) if is_local(fs) else (lambda p: p.rstrip("/"))


def _source_roots(source_fs, source, real) -> list[str]:
    return [real(source_fs._strip_protocol(r)) for r in (source if isinstance(source, (list, tuple)) else [source])]


def check_scratch_outside_source(source_fs, source, scratch_fs, scratch_path) -> None:
    """A scratch inside a folder of the source would be listed as source by the run that resumes this one.

    (A source inside scratch is fine: the run writes in a folder of its own under scratch.)
    """
    if type(source_fs) is not type(scratch_fs):
        return
    real = _real(scratch_fs)
    scratch_dir = real(scratch_path) + "/"
    inside = [root for root in _source_roots(source_fs, source, real) if scratch_dir.startswith(root + "/")]
    if inside:
        raise ValueError(
            f"scratch {full_url(scratch_fs, scratch_path)!r} is inside the source {inside[0]!r}, so a run resumed "
            "after an interruption would read its scratch files as source: pass a scratch outside the source"
        )


def check_dest_outside_source(source_fs, source_files, source, dest_fs, dest_path) -> None:
    """Neither inside the other: a source inside dest would be overwritten, a dest inside it read as source."""
    if type(source_fs) is not type(dest_fs):
        return
    local = is_local(dest_fs)
    real = _real(dest_fs)
    dest_dir = real(dest_path) + "/"
    roots = _source_roots(source_fs, source, real)
    if local:  # a file is in dest if its folder is, or if it is a link (realpath of each: 0.1 s per 2,000 files)
        folders_and_links = {posixpath.dirname(f) for f in source_files} | set(filter(os.path.islink, source_files))
        files = [real(f) for f in folders_and_links]
    else:
        files = source_files
    contain_dest = [r for r in roots if dest_dir.startswith(r + "/")]
    in_dest = [f for f in roots + files if (f + "/").startswith(dest_dir)]
    if contain_dest or in_dest:
        overlapped = full_url(source_fs, (contain_dest + in_dest)[0])
        raise ValueError(
            f"dest {full_url(dest_fs, dest_path)!r} overlaps the source {overlapped!r}: choose a separate directory"
        )


def check_scratch_outside_dest(scratch_fs, scratch_path: str, dest_fs, dest_path: str) -> None:
    """A scratch inside dest would leave dest holding a folder that is not daskpile's result."""
    if type(scratch_fs) is type(dest_fs) and (scratch_path.rstrip("/") + "/").startswith(dest_path.rstrip("/") + "/"):
        raise ValueError(
            f"scratch {full_url(scratch_fs, scratch_path)!r} is inside dest {full_url(dest_fs, dest_path)!r}, which "
            "would then hold a folder that is not daskpile's result (and a retry would refuse it): pass a scratch "
            "outside dest"
        )


def check_workers_see_the_source(source_fs, first_file: str | None) -> None:
    """Refuse, before anything is read, a local source the cluster's workers cannot see (its first file): each
    task then said the file did not exist, where it did on this machine."""
    if first_file is None or not is_local(source_fs):
        return
    blind, workers = workers_missing(first_file)
    if blind:
        raise ValueError(
            f"source {first_file!r} is on this machine's disk, which {len(blind)} of the cluster's {workers} workers "
            f"cannot see ({', '.join(blind[:3])}): they share no disk with it; put the source on object storage "
            "(s3://...) or on a path every worker shares"
        )


def check_workers_see(dest_fs, dest_path: str, scratch_fs, scratch_path: str) -> None:
    """Refuse, before anything is written, local paths that the cluster's workers cannot see."""
    refuse_blind_workers(scratch_fs, scratch_path, f"scratch {full_url(scratch_fs, scratch_path)!r}",
                         "scratch='s3://bucket/prefix' (--scratch)")  # fmt: skip
    refuse_blind_workers(dest_fs, dest_path, f"dest {full_url(dest_fs, dest_path)!r}", "a dest on object storage")


def refuse_blind_workers(fs, path: str, named: str, remedy: str) -> None:
    """Refuse ``path`` of ``fs`` (``named`` so in the message) if some of the current client's workers cannot see
    it: a local path is this machine's, a ``memory://`` one this process's.  Nothing for a store every worker
    reaches, or without a client."""
    if is_memory(fs):
        (blind, workers), where = workers_blind_to_memory(full_url(fs, path)), "in this process's memory"
    else:
        (blind, workers), where = workers_blind_to(path) if is_local(fs) else ([], 0), "on this machine's disk"
    if blind:
        raise ValueError(
            f"{named} is {where}, which {len(blind)} of the cluster's {workers} workers cannot see "
            f"({', '.join(blind[:3])}): pass {remedy} or a path every worker shares"
        )


def workers_finding(fs, path: str, version: FileVersion) -> tuple[list[str], list[str]]:
    """(the current client's workers that find the file ``path`` of ``fs`` as ``version``, those that do not),
    each asked now; ([], []) without a client.  A worker that cannot tell (no credentials, lost) is in neither.
    What a worker saw while a task ran may have changed since (a file rewritten and restored): what it sees
    now, against what this process sees now, says whether they look at one store."""
    client = current_client()
    if client is None:
        return [], []
    try:
        seen = client.run(finds, fs, path, version, on_error="return")
    except Exception:  # (the cluster cannot be asked: the error that led here is said as it is)
        return [], []
    return sorted(w for w, yes in seen.items() if yes is True), sorted(w for w, yes in seen.items() if yes is False)


def finds(fs, path: str, version: FileVersion) -> bool | None:
    """Whether this process finds the file ``path`` of ``fs`` as ``version`` now (its size, and its stamp or
    ETag where ``version`` has one); None where it cannot tell."""
    try:
        info = info_now(fs, path)
    except Exception:  # (credentials, a store out of reach: nothing is known of the file)
        return None
    return info is not None and version.same_as(FileVersion.listed(fs, info))


def info_now(fs, path: str) -> dict | None:
    """``fs.info`` of the file ``path`` as it is now, None if it is not there: one request, a local file opened
    first (an open revalidates what an NFS client cached of its folder, close-to-open, which a listing or a
    stat may give as it was up to a minute before)."""
    try:
        if is_local(fs):
            with open(path, "rb"):
                pass
        fs.invalidate_cache(path)
        return fs.info(path)
    except FileNotFoundError:
        return None
