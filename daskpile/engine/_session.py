"""Which Python session owns a ``shuffle(ddf)`` scratch directory, and whether it has ended.

``shuffle(ddf)``'s scratch lives as long as the shuffled DataFrame: it is
removed when the last expression holding it is garbage collected, or at the
interpreter's exit.  A session killed (a notebook's kernel killed for memory,
SIGTERM, SIGKILL) removes nothing, and its scratch (the size of the data) stays
in the temporary directory for ever.  So the directory records its owner: the
process, when it started in clock ticks since boot (which no change of the
wall clock moves; a pid alone may be a new process's), the machine's name, its
boot and the pid namespace.  A process's first ``shuffle(ddf)`` on a root,
and ``daskpile clean``, remove the scratch of owners that have ended in this
machine's boot and pid namespace, of this user, on Linux; nothing is judged
elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import shutil
import socket
import stat

import fsspec

from daskpile._storage import is_local, write_bytes
from daskpile.engine._scratch import DIRECTORY_NAME

SESSION_FILE = "_daskpile.session.json"
_RECORD_BYTES = 4096  # a record is about 150 bytes: more is not one (a file planted to be read for ever)


@dataclasses.dataclass(frozen=True)
class Session:
    """The process that owns a scratch directory: its pid, when it started (clock ticks since boot), its
    machine's name, and where its pid means that process (``pids``: the machine's boot and the pid namespace;
    two containers of a pod share a host name and may share a ``/tmp``, not their pids, and two machines may
    share a host name and a disk).  None of those known (not Linux): never judged."""

    pid: int
    started: int | None
    host: str
    pids: str | None = None

    @classmethod
    def this_one(cls) -> Session:
        """This process.

        >>> Session.this_one().ended()
        False
        """
        return cls(os.getpid(), _started(os.getpid()), socket.gethostname(), _pid_space())

    def here(self) -> bool:
        """Whether it ran in this machine's boot, among this process's pids (only there can it be told to have
        ended).

        >>> Session(1, 0, socket.gethostname(), "another-boot pid:[4026531836]").here()  # (same name, a disk)
        False
        """
        return self.pids is not None and (self.host, self.pids) == (socket.gethostname(), _pid_space())

    def ended(self) -> bool:
        """Whether its process has ended: judged here only, a later process given its pid not being it.

        >>> Session(os.getpid(), -1, socket.gethostname(), _pid_space()).ended()  # (the pid reused)
        True
        """
        if not self.here() or self.started is None:
            return False
        try:
            return _started(self.pid) != self.started
        except FileNotFoundError:  # (no such process)
            return True

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}"


def _started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``'s 22nd field); None where
    Linux does not say.  FileNotFoundError if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()  # (after the command's name, which may hold anything)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise
        return None
    except OSError:
        return None
    return int(fields[19])


def _pid_space() -> str | None:
    """Where this process's pids mean what they say: this boot of the machine (every machine's first pid
    namespace is ``pid:[4026531836]``) and the pid namespace, where Linux says; None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def mark(fs: fsspec.AbstractFileSystem, directory: str, session: Session) -> None:
    """Record ``session`` as the owner of the scratch ``directory``, if it can be written there: where it cannot
    (a store read-only to these credentials), the first task that writes scratch says so, naming it."""
    record = json.dumps(dataclasses.asdict(session)).encode()
    with contextlib.suppress(Exception):
        write_bytes(fs, posixpath.join(directory, SESSION_FILE), record)


def owner(fs: fsspec.AbstractFileSystem, directory: str) -> Session | None:
    """The session recorded in ``directory``; None if none is (a ``shuffle_parquet`` run's), it is not one, or
    the directory is another user's (whose processes this one may not see: /proc's ``hidepid``).

    >>> import tempfile; directory = tempfile.mkdtemp(); fs = fsspec.filesystem("file")
    >>> owner(fs, directory) is None
    True
    >>> mark(fs, directory, Session.this_one()); owner(fs, directory).pid == os.getpid()
    True
    """
    path = posixpath.join(directory, SESSION_FILE)
    try:
        if is_local(fs) and os.stat(directory, follow_symlinks=False).st_uid != os.geteuid():
            return None
        said = json.loads(_read_local(path) if is_local(fs) else fs.cat_file(path, 0, _RECORD_BYTES))
        session = Session(said["pid"], said["started"], said["host"], said.get("pids"))
        typed = isinstance(session.pid, int) and session.pid > 0 and isinstance(session.host, str)
        return session if typed and isinstance(session.started, (int, type(None))) else None
    except Exception:  # (another user's folder, 0700; a file that is not a record): not judged
        return None


def _read_local(path: str) -> bytes:
    """A small regular file, never through a link, never waiting (a FIFO planted under the name)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return os.read(descriptor, _RECORD_BYTES)
    finally:
        os.close(descriptor)


def ended_sessions(root: str) -> list[tuple[str, Session]]:
    """The ``shuffle(ddf)`` scratch directories of this user in the local directory ``root`` whose Python
    session has ended here, with their session: one listing of ``root``, one small read a directory of
    daskpile's.

    >>> import tempfile; ended_sessions(tempfile.mkdtemp())
    []
    """
    found = []
    try:
        entries = list(os.scandir(root))
    except OSError:  # (not there yet, or not ours to list: nothing to remove)
        return []
    for entry in entries:
        try:
            if not (DIRECTORY_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False)):
                continue
            session = owner(fsspec.filesystem("file"), entry.path)  # (None for another user's folder)
            if session is not None and session.ended():
                found.append((entry.path, session))
        except Exception:  # (gone meanwhile, or anything else: that one is not judged)
            continue
    return found


def remove(path: str) -> None:
    """Remove an ended session's local scratch ``path``, its record last: stopped halfway, what is left is
    still known as an ended session's, and removed by the next sweep."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(path):
            if entry.name == SESSION_FILE:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(posixpath.join(path, SESSION_FILE))
        os.rmdir(path)
