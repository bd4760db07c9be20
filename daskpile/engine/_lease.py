"""One run at a time in a dest: a lease file, renewed while its run lives.

Two runs writing into one dest at once remove each other's temporaries, and
two runs of different calls, each with its own scratch, would leave parts of
both under one manifest.  So a run takes the dest's lease first
(``_daskpile.lease.json``: who holds it, and when it last said it was alive),
renews it while it runs, checks it is still its own before it commits, and
removes it at the end.  A run that finds a lease renewed less than
``LEASE_SECONDS`` ago is refused, naming the holder; an older one is a killed
run's, and is taken over, as is one whose process, on the same machine, is
gone (a pid now another process's, as in a container restarted in its pod,
counts as gone: the lease records when its process started).  Freshness is read from the holder's clock, so
machines sharing a dest need clocks within a minute or so of each other (as
NTP keeps them): a lease renewed more than ``LEASE_SECONDS`` ahead of this
machine's clock counts as dead too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import posixpath
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import fsspec

from daskpile._storage import full_url, is_local, reaching, write_bytes

LEASE_FILE = "_daskpile.lease.json"
LEASE_SECONDS = 120.0  # a lease not renewed for this long is a dead run's
RENEW_SECONDS = 20.0
# An object store has no "create unless it exists": two runs may both write the lease; the last write
# wins, and each reads it back after this pause to see whether it won.
CONFIRM_SECONDS = 0.5


class DestBusyError(RuntimeError):
    """Another live run is writing into the same dest; wait for it to end.  Nothing was written."""


@dataclasses.dataclass
class Lease:
    """The lease of ``dest_path`` held by this run (``owner``), renewed by a thread until released.

    >>> import tempfile
    >>> fs = fsspec.filesystem("file")
    >>> with held(fs, tempfile.mkdtemp()) as lease:
    ...     lease.check()  # still ours: the run may commit
    """

    fs: fsspec.AbstractFileSystem
    dest_path: str
    owner: str
    started: str
    made: list[str]  # the local directories taking the lease created, deepest first
    lost: str | None = None
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def path(self) -> str:
        return posixpath.join(self.dest_path, LEASE_FILE)

    @classmethod
    def take(cls, fs: fsspec.AbstractFileSystem, dest_path: str) -> Lease:
        """The dest's lease, if no live run holds it (a dead run's is taken over); else ``DestBusyError``."""
        made = []
        if is_local(fs):  # (on an object store a "directory" is a prefix: nothing to make)
            missing = dest_path
            while not os.path.exists(missing):
                made.append(missing)
                missing = os.path.dirname(missing)
            try:
                fs.makedirs(dest_path, exist_ok=True)
            except OSError as e:  # (under /proc: writable to root, yet nothing can be made there) named as dest
                raise type(e)(e.errno, f"dest {dest_path!r} cannot be made: {e.strerror or e}", e.filename) from None
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        lease = cls(fs, dest_path, uuid.uuid4().hex, now, made)
        try:
            lease._acquire()
        except BaseException:  # (Ctrl-C once the lease was written: it is let go, as the run never began)
            with contextlib.suppress(Exception):
                if (_read(fs, lease.path) or {}).get("owner") == lease.owner:
                    fs.rm(lease.path)
            lease._remove_dest_if_made()
            raise
        return lease

    def _record(self) -> bytes:
        return json.dumps({
            "owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
            "pid_started": _process_started(os.getpid()), "started": self.started, "renewed": time.time(),
        }).encode()  # fmt: skip

    def _acquire(self) -> None:
        for _ in range(2):  # a second time after removing a dead run's lease
            held = _read(self.fs, self.path)
            if held is not None and _alive(held):
                raise DestBusyError(_busy_message(self.fs, self.dest_path, held))
            if held is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(self.path)
            if is_local(self.fs):
                if _create_new(self.path, self._record()):
                    break
                continue  # another run created it in between: read it
            write_bytes(self.fs, self.path, self._record())
            time.sleep(CONFIRM_SECONDS)
            held = _read(self.fs, self.path)
            if held is not None and held.get("owner") != self.owner:
                raise DestBusyError(_busy_message(self.fs, self.dest_path, held))
            break
        else:
            raise DestBusyError(_busy_message(self.fs, self.dest_path, _read(self.fs, self.path) or {}))
        threading.Thread(target=self._renew_until_released, name="daskpile-lease", daemon=True).start()

    def _renew_until_released(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            with contextlib.suppress(Exception):  # a store that failed once: the next renewal is well in time
                self.renew()
            if self.lost is not None:
                return

    def _taken_by(self) -> str | None:
        """Who holds the lease now, if not this run (once lost, it stays lost)."""
        if self.lost is None:
            held = _read(self.fs, self.path)
            if held is None:
                self.lost = "no run (its file was removed)"
            elif held.get("owner") != self.owner:
                self.lost = _holder(held)
        return self.lost

    def renew(self) -> None:
        """Say the run is alive, unless another run took the lease meanwhile (then ``lost`` says who)."""
        if self._taken_by() is None:
            write_bytes(self.fs, self.path, self._record())

    def check(self) -> None:
        """Raise ``DestBusyError`` if the lease is no longer this run's: it must not commit."""
        if self._taken_by() is not None:
            raise DestBusyError(
                f"dest {full_url(self.fs, self.dest_path)!r}: this run's lease went to {self.lost} while it ran "
                f"(it was not renewed for {LEASE_SECONDS:.0f} s: a paused machine?); nothing was committed. "
                "Run the same call again once that run has ended: it resumes"
            )

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still this run's (and dest, if the lease alone made it)."""
        self._stop.set()
        if self._taken_by() is None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.path)
        self._remove_dest_if_made()

    def _remove_dest_if_made(self) -> None:
        """A run that wrote nothing leaves no dest behind, as before it took a lease there."""
        for directory in self.made:
            try:
                os.rmdir(directory)  # only if empty
            except OSError:
                return


@contextlib.contextmanager
def held(fs: fsspec.AbstractFileSystem, dest_path: str) -> Iterator[Lease]:
    """The dest's lease for the ``with`` block (``Lease.take``), released at its end, however it ends.

    Taking it is the run's first request to dest: a store refusing the credentials is said of dest there
    (its own words, "Forbidden", name no URL)."""
    with reaching(fs, dest_path, "dest"):
        lease = Lease.take(fs, dest_path)
    try:
        yield lease
    finally:
        lease.release()


def live(fs: fsspec.AbstractFileSystem, dest_path: str) -> dict | None:
    """The lease of a run writing into ``dest_path`` now, if there is one: what ``held`` would refuse."""
    record = _read(fs, posixpath.join(dest_path, LEASE_FILE))
    return record if record is not None and _alive(record) else None


def _read(fs: fsspec.AbstractFileSystem, path: str) -> dict | None:
    """The lease at ``path``; None if there is none.  One being written (not yet JSON) counts as just renewed."""
    try:
        with fs.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
        if isinstance(record, dict):
            return record
    except ValueError:
        pass
    try:  # unreadable: alive while its file is recent (a writer mid-write), a dead writer's once it is old
        renewed = os.stat(path).st_mtime if is_local(fs) else time.time()
    except FileNotFoundError:
        return None
    return {"owner": None, "renewed": renewed}


def _alive(record: dict) -> bool:
    """Renewed within ``LEASE_SECONDS``, unless its process, on this machine, is gone (a run killed and run
    again at once resumes, rather than waiting out its own lease)."""
    try:
        # (one renewed in the future is a clock off, as one long before is: a lease dated a day ahead, by a
        # machine whose clock ran fast, blocked the dest for that day, "alive 0 s ago")
        recent = abs(time.time() - float(record.get("renewed", 0))) < LEASE_SECONDS
    except (TypeError, ValueError):
        return False
    if recent and record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        return _process_lives(record["pid"]) and _same_process(record["pid"], record.get("pid_started"))
    return recent


def _same_process(pid: int, started) -> bool:
    """Whether process ``pid`` is the one that started at ``started``, not a later one given its number: a
    container restarted in its pod keeps the hostname and numbers its processes afresh, so the killed run's
    pid is often the new run's own."""
    now = _process_started(pid)
    return started is None or now is None or now == started


def _process_started(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None without /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    except (OSError, IndexError, ValueError):
        return None


def _process_lives(pid: int) -> bool:
    """Whether process ``pid`` of this machine is running (a zombie, killed but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): it exists
        return True


def _create_new(path: str, data: bytes) -> bool:
    """Create the local file ``path`` holding ``data``, unless it exists (then False): one run wins.

    Interrupted before ``data`` is in it (Ctrl-C as the lease appears), the file is removed: left empty, it
    counted as a run writing its lease, alive for ``LEASE_SECONDS``, and the same command run again at once was
    refused.  (Not a hard link of a file written first: many mounts have none.)"""
    with _signals_held():  # (Ctrl-C between the file's creation and the try below left it empty)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            raise
    return True


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM held back until the block ends, then raised again for their own handlers.

    Python runs its handlers in the main thread whichever thread the kernel gave the signal to, so the
    handlers are what is swapped (a mask of the main thread's alone held nothing while other threads ran).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    # (a handler not installed from Python, None, could not be put back: that signal is left to it)
    ours = [signum for signum in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(signum) is not None]
    handlers = {signum: signal.signal(signum, lambda s, _: came.append(s)) for signum in ours}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


def _holder(record: dict) -> str:
    if not record.get("owner"):
        return "a run whose lease is being written"
    return f"the run of pid {record.get('pid')} on {record.get('host')!r}, started {record.get('started')}"


def _busy_message(fs: fsspec.AbstractFileSystem, dest_path: str, record: dict) -> str:
    try:
        ago = f"{max(0.0, time.time() - float(record.get('renewed', 0))):.0f} s ago"
    except (TypeError, ValueError):
        ago = "recently"
    return (
        f"dest {full_url(fs, dest_path)!r} is being written by another daskpile run ({_holder(record)}; alive "
        f"{ago}). Wait for it to end and run the same call again; if that run was killed on another machine, "
        f"its lease ({LEASE_FILE}) counts as dead {LEASE_SECONDS:.0f} s after its last renewal"
    )
