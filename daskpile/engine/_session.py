"""Which Python session owns a ``shuffle(ddf)`` scratch directory, and whether it has ended.

``shuffle(ddf)``'s scratch lives as long as the shuffled DataFrame: it is
removed when the last expression holding it is garbage collected, or at the
interpreter's exit.  A session killed (a notebook's kernel killed for memory,
SIGTERM, SIGKILL) removes nothing, and its scratch (the size of the data) stays
in the temporary directory for ever.  So the directory records its owner, the
process and when it started (a pid alone may be a new process's), and the
machine: a later ``shuffle(ddf)`` on the same root, and ``daskpile clean``,
remove the scratch of owners that have ended on this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import posixpath
import socket

import fsspec
import psutil

from daskpile._storage import filesystem, write_bytes
from daskpile.engine._scratch import DIRECTORY_NAME

SESSION_FILE = "_daskpile.session.json"
_SAME_START_SECONDS = 0.5  # (a process's start time is read in clock ticks, then added to the boot time)


@dataclasses.dataclass(frozen=True)
class Session:
    """The process that owns a scratch directory: its pid, when it started, its machine, and where its pid
    means that process (``pids``: the machine's boot and the pid namespace; two containers of a pod share a
    host name and may share a ``/tmp``, not their pids, and two machines may share a host name and a disk)."""

    pid: int
    started: float
    host: str
    pids: str | None = None

    @classmethod
    def this_one(cls) -> Session:
        """This process.

        >>> Session.this_one().ended()
        False
        """
        return cls(os.getpid(), psutil.Process().create_time(), socket.gethostname(), _pid_space())

    def here(self) -> bool:
        """Whether it ran on this machine, among this process's pids (only there can it be told to have ended).

        >>> Session(1, 0.0, socket.gethostname(), "another-boot pid:[4026531836]").here()  # (same name, a disk)
        False
        """
        return (self.host, self.pids) == (socket.gethostname(), _pid_space())

    def ended(self) -> bool:
        """Whether its process has ended: on this machine only, and a later process given its pid is not it.

        >>> Session(os.getpid(), 0.0, socket.gethostname(), _pid_space()).ended()  # (the pid reused)
        True
        """
        if not self.here():
            return False
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) > _SAME_START_SECONDS
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:  # (not ours to look at: alive)
            return False

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}"


def _pid_space() -> str | None:
    """Where this process's pids mean what they say: this boot of the machine (every machine's first pid
    namespace is ``pid:[4026531836]``) and the pid namespace, where Linux says; None elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def mark(fs: fsspec.AbstractFileSystem, directory: str) -> None:
    """Record this process as the owner of the scratch ``directory``, if it can be written there: where it cannot
    (a store read-only to these credentials), the first task that writes scratch says so, naming it."""
    record = json.dumps(dataclasses.asdict(Session.this_one())).encode()
    with contextlib.suppress(Exception):
        write_bytes(fs, posixpath.join(directory, SESSION_FILE), record)


def owner(fs: fsspec.AbstractFileSystem, directory: str) -> Session | None:
    """The session recorded in ``directory``; None if none is (a ``shuffle_parquet`` run's) or it cannot be read.

    >>> import tempfile; directory = tempfile.mkdtemp(); fs = fsspec.filesystem("file")
    >>> owner(fs, directory) is None
    True
    >>> mark(fs, directory); owner(fs, directory).pid == os.getpid()
    True
    """
    try:
        with fs.open(posixpath.join(directory, SESSION_FILE), "rb") as file:
            said = json.loads(file.read())
        return Session(int(said["pid"]), float(said["started"]), str(said["host"]), said.get("pids"))
    except (OSError, ValueError, KeyError, TypeError):  # (another user's folder, 0700: not ours to judge)
        return None


def ended_sessions(root: str) -> list[tuple[str, Session]]:
    """The ``shuffle(ddf)`` scratch directories in the local directory ``root`` whose Python session has
    ended on this machine, with their session: one listing of ``root``, one small read a directory of
    daskpile's.

    >>> import tempfile; ended_sessions(tempfile.mkdtemp())
    []
    """
    try:
        found = [entry.path for entry in os.scandir(root) if DIRECTORY_NAME.match(entry.name) and entry.is_dir()]
    except OSError:  # (not there yet, or not ours to list: nothing to remove)
        return []
    fs = filesystem(root)[0]
    owners = ((path, owner(fs, path)) for path in found)
    return [(path, session) for path, session in owners if session is not None and session.ended()]
