"""Ctrl-C on the command line: one line, whenever it comes, and no worker tracebacks.

A terminal sends SIGINT to its whole foreground process group, so the workers of a LocalCluster the
command started get it too; each would print a KeyboardInterrupt traceback.  They must ignore it, and only
the command's own process stops them.  A process keeps an ignored SIGINT across ``exec`` (Python does
not install its handler then), but it gets a handler back as the default; so the workers must be started
by a process that ignores SIGINT.  That is multiprocessing's fork server: started once, with SIGINT
ignored for the few milliseconds of its ``exec``, every worker forked from it ignores SIGINT, while this
process handles it from start to end.

Ctrl-C while the cluster starts waits for the start to end (an interrupted start leaves distributed's
half-started nannies printing tracebacks), then stops the cluster and the command as at any other time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Where the workers must have their pre-spawn environment: distributed sets it before it spawns a worker,
# which is too late for one forked from the fork server.
_DISTRIBUTED_PRE_SPAWN_ENVIRON = "distributed.nanny.pre-spawn-environ"


_over = threading.Event()  # the command has printed its result: Ctrl-C stays ignored to the end

_starting: list[threading.Event | None] = [None]  # set by SIGTERM while ``uninterrupted`` starts a cluster


_terminated = threading.Event()  # SIGTERM came: the command stops as on Ctrl-C, and says it was terminated


# SIGINT was ignored when the command began (`daskpile ... &` in a script, a batch job), not by daskpile: SIGTERM,
# handed to the SIGINT handler, must still stop the run then
_ignored_from_the_start = threading.Event()
_ignored_by_us = threading.Event()  # daskpile ignores Ctrl-C for a while (its cluster closing, the fork server)


@contextlib.contextmanager
def terminate_as_ctrl_c():
    """Within the block, SIGTERM (what Kubernetes, a node's drain and ``kill`` send) does what Ctrl-C would do
    at that moment: stop the run, wait for the writes under way, let go of the dest's lease and say how to
    resume.  It ended the command silently, leaving the lease, which refused a retry from another pod for two
    minutes."""
    if not _in_main_thread():
        yield
        return
    _terminated.clear()
    _killed_soon(False)
    (
        _ignored_from_the_start.set
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        else _ignored_from_the_start.clear
    )()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _killed_soon(False)  # (an API call after the command, in the same process, waits as long as before)


def terminated() -> bool:
    """Whether SIGTERM stopped the command."""
    return _terminated.is_set()


def _on_sigterm(signum, frame) -> None:
    _terminated.set()
    _killed_soon(True)
    # Sent to the whole process group (``timeout``, systemd, Slurm), it kills the cluster's workers too, whatever
    # the moment: their scheduler and nannies, in this process, log each lost worker (40 lines of tracebacks)
    silence_shutdown_logs()
    starting = _starting[0]
    if starting is not None:  # a cluster is starting (see ``uninterrupted``), which an exception would leave half
        starting.set()
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # (Python's default raises KeyboardInterrupt; ours do what this moment needs)
        handler(signal.SIGINT, frame)
    elif _ignored_from_the_start.is_set() and not (_over.is_set() or _ignored_by_us.is_set()):
        # Ctrl-C is not the command's, SIGTERM still is (it was ignored, and Slurm killed the run at its grace's end).
        # Quiet first (above), as quiet_on_ctrl_c's handler is: a cluster's client logged each abandoned gather
        # (1,500 "Task exception was never retrieved" tracebacks before the command's one line)
        signal.default_int_handler(signal.SIGINT, frame)
    # else ignored: the command has said how it ended, or its cluster closes, as for Ctrl-C


def _killed_soon(soon: bool) -> None:
    """Tell ``_compute`` that the process is to be killed shortly, so that it waits less for running tasks.  Not
    imported here (it imports Dask, and a signal handler should not import): not imported yet, it runs no task."""
    compute = sys.modules.get("daskpile._compute")
    if compute is not None:
        (compute.KILLED_SOON.set if soon else compute.KILLED_SOON.clear)()


def command_over() -> None:
    """From now on, in the main thread, Ctrl-C is ignored: the command has said how it ended."""
    if _in_main_thread():
        _over.set()
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _restore(previous) -> None:
    if not _over.is_set():
        signal.signal(signal.SIGINT, previous)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def start_fork_server_ignoring_ctrl_c() -> None:
    """Make the workers distributed starts from now on ignore SIGINT; call with the cluster's config set.

    The fork server gets the environment distributed gives a worker before spawning it
    (``distributed.nanny.pre-spawn-environ``, and ``PYTHONHASHSEED`` so that every worker hashes alike).
    """
    import dask
    from distributed.utils import get_mp_context

    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        get_mp_context()  # sets the fork server's preloads (distributed and the libraries it uses)
    from multiprocessing import forkserver

    # distributed's rules: a variable already set wins, a None in the config sets nothing
    environ = {k: str(v) for k, v in dask.config.get(_DISTRIBUTED_PRE_SPAWN_ENVIRON).items() if v is not None}
    environ.setdefault("PYTHONHASHSEED", "6640")  # distributed's value
    added = {k: v for k, v in environ.items() if k not in os.environ}
    os.environ.update(added)
    _ignored_by_us.set()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _in_main_thread() else None
    try:
        with _short_temporary_directory():
            forkserver.ensure_running()
    finally:
        _ignored_by_us.clear()
        if previous is not None:
            _restore(previous)
        for key in added:  # only what was added here: other threads may change the environment meanwhile
            os.environ.pop(key, None)


# The fork server listens on a Unix socket in multiprocessing's temporary directory, whose path may not
# exceed 107 bytes: under a long TMPDIR (a CI job's, a test's) it goes in /tmp instead.
LONGEST_TMPDIR = 60


@contextlib.contextmanager
def _short_temporary_directory():
    """multiprocessing's temporary directory (made once per process) under /tmp if TMPDIR is long."""
    import tempfile

    if len(tempfile.gettempdir()) <= LONGEST_TMPDIR or not os.access("/tmp", os.W_OK):
        yield
        return
    previous, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        yield
    finally:
        tempfile.tempdir = previous


@contextlib.contextmanager
def workers_ignoring_ctrl_c():
    """Within the block, the workers distributed starts (and restarts) ignore SIGINT.

    Where the fork server cannot start, the workers are spawned as distributed does by default, and a
    Ctrl-C reaches them too.
    """
    import dask

    from daskpile._compute import local_cluster_config

    try:
        with dask.config.set(local_cluster_config()):
            start_fork_server_ignoring_ctrl_c()
    except (OSError, ValueError):  # no fork server on this platform, or its socket cannot be made
        yield
        return
    nanny, gone = logging.getLogger("distributed.nanny"), _ForkServerGone()
    nanny.addFilter(gone)
    try:
        with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
            yield
    finally:
        nanny.removeFilter(gone)


class _ForkServerGone(logging.Filter):
    """Leaves out a nanny's log of a worker that could not start because the fork server is gone.

    A signal sent to the whole process group (SIGTERM from ``timeout``, systemd, Slurm) kills the fork server as
    the workers start, and the nanny logged the failed start with its traceback (25 lines, a loaded CI run) before
    this process's handler of the same signal had run and quieted the logs.  The start then fails, and the
    command says so in its one line, as it does of a fork server gone for any other reason.

    >>> import logging
    >>> record = logging.LogRecord("distributed.nanny", logging.ERROR, "", 0, "Failed to start process", (),
    ...                            (EOFError, EOFError("unexpected EOF"), None))
    >>> _ForkServerGone().filter(record)
    False
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, EOFError) and record.getMessage().startswith("Failed to start process"))


def uninterrupted(start: Callable[[], T], *, undo: Callable[[T], object]) -> T:
    """``start()``, which neither Ctrl-C nor SIGTERM interrupts: if one comes meanwhile, ``undo`` its result (a
    start that failed meanwhile failed of it), then raise KeyboardInterrupt.

    >>> uninterrupted(lambda: "cluster", undo=print)
    'cluster'
    """
    if not _in_main_thread():
        return start()
    pressed = threading.Event()

    def press(signum, frame) -> None:
        pressed.set()
        silence_shutdown_logs()  # (the start's own failures, which the signal may cause, are logged meanwhile)

    # SIGINT ignored from the start (a script's `daskpile ... &`) stays ignored; SIGTERM stops the start all the same
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    previous = None if ignored else signal.signal(signal.SIGINT, press)
    _starting[0] = pressed
    try:
        try:
            started = start()
        except Exception as error:
            # A signal sent to the whole process group (``timeout``, systemd, Slurm: SIGTERM) also reaches the
            # processes being started, and the start fails ("Nanny failed to start"): it is that stop, not an error
            if pressed.is_set():
                raise KeyboardInterrupt from error
            raise
        if pressed.is_set():
            undo(started)
            raise KeyboardInterrupt
        return started
    finally:
        _starting[0] = None
        if previous is not None:
            _restore(previous)


@contextlib.contextmanager
def ctrl_c_ignorable():
    """A function that makes Ctrl-C ignored from its call to the end of the block.

    For the end of a command: its cluster takes a second to close, which Ctrl-C would turn into tracebacks.
    """
    if not _in_main_thread():
        yield lambda: None
        return
    previous = signal.getsignal(signal.SIGINT)

    def ignore() -> None:
        _ignored_by_us.set()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    try:
        yield ignore
    finally:
        _ignored_by_us.clear()
        _restore(previous)


def silence_shutdown_logs() -> None:
    """distributed's, asyncio's and tornado's loggers, children included (Dask's config sets some levels)."""
    roots = ("distributed", "asyncio", "tornado")
    names = [name for name in logging.root.manager.loggerDict if name.split(".")[0] in roots]
    for name in {*roots, *names}:
        logging.getLogger(name).setLevel(logging.CRITICAL)


@contextlib.contextmanager
def quiet_on_ctrl_c(own_client=None):
    """Ctrl-C stops the run with one line, not a log line per cancelled task and unretrieved future.

    ``own_client`` is the client of a cluster this command started, whose workers are quieted too
    (a cluster the user gave by address is left as it is).

    The loggers go quiet in the signal handler itself, before KeyboardInterrupt unwinds: the client's
    event loop may log an abandoned gather ("Task exception was never retrieved") while it unwinds.
    """
    if not _in_main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # (started with Ctrl-C ignored, in a script's background: it keeps ignoring it, as on threads, and
        # SIGTERM stops it)
        yield
        return

    def interrupt(signum, frame):
        silence_shutdown_logs()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            if own_client is not None:
                own_client.run(lambda: logging.getLogger("distributed").setLevel(logging.CRITICAL))
        raise
    finally:
        _restore(previous)
