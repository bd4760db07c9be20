"""Running lists of tasks on whatever Dask scheduler is current, with optional progress.

With a ``distributed`` client, tasks run on its cluster and progress is
distributed's own bar (text in a terminal, a widget in a notebook); without
one, on Dask's local scheduler with ``dask.diagnostics.ProgressBar``.  Where
output is neither a terminal nor a notebook (a batch job's log), bars are
left out: redrawn ten times a second they would fill the log, and the summary
line of each pass says what matters.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import os
import sys
import threading
import time
import uuid
import warnings

import dask
import dask.system
import dask.threaded
import psutil

# The LocalCluster daskpile starts (the command line, the demo, and every Dask system of the benchmarks)
# runs with two settings of distributed turned off; pass 1 and 2 on dataset A took 26 % less time without them:
# - the statistical profiler samples every worker thread's stack 100 times a second, holding the GIL
#   between the fingerprints' numpy calls;
# - MALLOC_TRIM_THRESHOLD_ turns off glibc's adaptive mmap threshold, so every large numpy array or Parquet
#   writer buffer is fresh pages from the kernel.  daskpile's bulk memory is Arrow's (mimalloc), which that
#   setting, meant to return fragmented pandas memory, does not touch.
# and one slowed down: every server (scheduler, nannies, workers) checks its event loop's health every 20 ms,
# which kept an idle 2-worker cluster at 13 % of a core, 6 % at 200 ms.  The check only times the loop, to log
# "Event loop was unresponsive" after 3 s, which it still does.
# And one turned on: tasks waiting while no worker runs (every one paused for memory, or gone) fail after
# NO_WORKERS_TIMEOUT.  Dask resumes a paused worker once its memory falls below the pause threshold; one
# holding memory it cannot give back (a fragmented heap) stays paused, and the run waited forever.
NO_WORKERS_TIMEOUT = "600s"
LOCAL_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,  # None unsets it (distributed's rule)
    "distributed.admin.tick.interval": "200ms",
    "distributed.scheduler.no-workers-timeout": NO_WORKERS_TIMEOUT,
}
_HUGE_PAGES_KEY = "distributed.nanny.pre-spawn-environ.MIMALLOC_ALLOW_THP"


def local_cluster_config() -> dict:
    """``LOCAL_CLUSTER_CONFIG``, and Arrow's mimalloc without transparent huge pages in the workers, as the
    command runs itself (``daskpile/__main__.py`` says why): set in each worker before it loads pyarrow.  A
    value in this process's environment, or in Dask's configuration, wins; read now, not at import.

    >>> local_cluster_config()["distributed.admin.tick.interval"]
    '200ms'
    """
    said = os.environ.get("MIMALLOC_ALLOW_THP", dask.config.get(_HUGE_PAGES_KEY, "0"))
    return {**LOCAL_CLUSTER_CONFIG, _HUGE_PAGES_KEY: said}


def local_cluster(secure: bool = True, **kwargs):
    """A LocalCluster of worker processes with ``local_cluster_config()``; ``kwargs`` go to ``LocalCluster``.

    ``secure``: the scheduler, the workers and the clients talk TLS with a
    key made for this cluster and held in memory only
    (``distributed.Security.temporary``), so no other process may connect.
    A plain ``LocalCluster`` takes any connection to its port: on a machine
    shared with other users, any of them could run code as the user of the
    command, with the storage credentials of its environment.  And the
    dashboard listens on 127.0.0.1 only (a plain one, on every address).

    Malloc trimming stays on if this process's environment already has
    ``MALLOC_TRIM_THRESHOLD_``: exported by the user, or left there by a
    default LocalCluster started earlier (distributed sets it in the parent
    before spawning workers).

    >>> with local_cluster(n_workers=2, threads_per_worker=1) as cluster:  # doctest: +SKIP
    ...     ...
    """
    import warnings

    from distributed import LocalCluster

    kwargs.setdefault("dashboard_address", "127.0.0.1:8787")
    if secure:
        kwargs.setdefault("security", True)  # (LocalCluster's word for Security.temporary())
    with dask.config.set(local_cluster_config()), warnings.catch_warnings():
        # 8787 taken (another cluster's dashboard): distributed picks another port and says so in a
        # four-line warning; the command prints the dashboard's address anyway.
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        return LocalCluster(processes=True, **kwargs)


def quiet_workers(client) -> None:
    """Keep the workers of a LocalCluster this process started from repeating, on its stderr, what it reports.

    A task's error reaches the client, which the command reports in one
    line; the worker also logs it with its traceback ("Compute Failed").  And
    the scheduler runs in this process, so a worker's heartbeat fails only
    when the cluster closes under it (distributed's race: a heartbeat in
    flight as the scheduler goes), logged as a 30-line traceback.  Other
    worker logs (memory warnings, restarts) stay.  A plugin, so that a worker
    restarted after a crash (the nanny starts a new process) is quiet too.
    """
    from distributed.diagnostics.plugin import WorkerPlugin  # here: importing distributed takes half a second

    class QuietWorker(WorkerPlugin):
        name = "daskpile-quiet-worker"

        def setup(self, worker) -> None:
            _filter_worker_logs()

    client.register_plugin(QuietWorker())
    _filter_worker_logs()  # and this process, which runs the LocalCluster's scheduler


_REPORTED_ELSEWHERE = (
    "Compute Failed",  # the task's error, which the command reports
    "Failed to communicate with scheduler during heartbeat",  # the cluster closing
    "Async instruction for",  # a running task cancelled because another failed
)


def _filter_worker_logs() -> None:
    import logging

    # On the handlers distributed set up, which every distributed.* logger's records reach
    for handler in logging.getLogger("distributed").handlers or logging.getLogger().handlers:
        handler.addFilter(_not_reported_elsewhere)


def _not_reported_elsewhere(record) -> bool:
    message = record.getMessage()
    # A connection that is not the cluster's own (a port probe) fails the TLS handshake of daskpile's LocalCluster,
    # which admits no other process: refused as it should be, and logged on the command's stderr beside its line
    return not message.startswith(_REPORTED_ELSEWHERE) and "TLS handshake failed" not in message


def in_a_worker() -> bool:
    """Whether this runs in a task on a ``distributed`` worker (not on Dask's local schedulers)."""
    if "distributed" not in sys.modules:
        return False
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:  # not in a worker
        return False
    return True


# The command's cluster while not yet started (``started_when_needed``), with the stack it is entered into.
_WAITING_CLUSTERS: list[tuple[contextlib.AbstractContextManager, contextlib.ExitStack]] = []
_STARTING = threading.Lock()


@contextlib.contextmanager
def started_when_needed(cluster: contextlib.AbstractContextManager):
    """Run the block with ``cluster`` (a context making a client current) entered only once the block first
    asks for the cluster (``current_client``, which every path to the cluster goes through), if it does.

    A command's source is planned, its bad file refused or its nothing-to-do
    said before a cluster starts, not after a LocalCluster's seconds or a
    Kubernetes cluster's pods.  An error in the block reaches ``cluster`` as
    it would in a ``with`` around the block.

    >>> with started_when_needed(contextlib.nullcontext()):
    ...     pass  # nothing asked for the cluster: it was never started
    """
    with contextlib.ExitStack() as stack:
        waiting = (cluster, stack)
        _WAITING_CLUSTERS.append(waiting)
        try:
            yield
        finally:
            with _STARTING:
                if waiting in _WAITING_CLUSTERS:
                    _WAITING_CLUSTERS.remove(waiting)


def _start_waiting_cluster() -> None:
    with _STARTING:
        while _WAITING_CLUSTERS:
            cluster, stack = _WAITING_CLUSTERS.pop()
            stack.enter_context(cluster)


def current_client():
    """The running ``distributed`` client, or None.  A command's cluster not yet started is started now."""
    if _WAITING_CLUSTERS:
        _start_waiting_cluster()
    if "distributed" not in sys.modules:  # no client can exist, and importing distributed takes half a second
        return None
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):  # no client
        return None
    return client if client.status == "running" else None


def total_threads() -> int:
    """Threads of the current Dask client, or of this machine without one."""
    client = current_client()
    if client is None:
        return dask.system.CPU_COUNT
    return max(1, sum(client.nthreads().values()))


def _limits_per_thread() -> tuple[list[float], int]:
    """(each worker's memory limit over its threads, for those that have one; how many workers), of the
    current cluster: ([], 0) without one."""
    client = current_client()
    if client is None:
        return [], 0
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return [w["memory_limit"] / max(w["nthreads"], 1) for w in workers if w.get("memory_limit")], len(workers)


def worker_memory_per_thread() -> int | None:
    """The memory limit of a worker of the current cluster over its threads (the smallest); None without a
    cluster, or with workers that have no limit (a local scheduler's task may take the machine's)."""
    limits, workers = _limits_per_thread()
    return int(min(limits)) if limits and len(limits) == workers else None


def memory_per_thread() -> int:
    """Bytes of memory a task may count on: a worker's limit over its threads, or RAM over cores."""
    limits, _ = _limits_per_thread()
    return int(min(limits)) if limits else psutil.virtual_memory().total // dask.system.CPU_COUNT


def giving_memory_back(fn):
    """``fn``, then the memory it freed handed back to the system: Arrow's allocator (mimalloc) and glibc
    keep freed pages for reuse, and an idle worker then holds its last task's peak.  Dask counts that as
    the worker's, pauses it at 80 % of its limit, and a paused worker takes no task that could free it: a
    run on 3 GiB workers waited forever after pass 1, holding 2.4 GiB of nothing.

    >>> giving_memory_back(abs)(-1)
    1
    """

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            if _worker_memory_high():  # (Dask's local schedulers never pause: nothing to gain there)
                give_memory_back()

    return run


# Handing memory back costs a worker of dataset A's passes 12 % of its time (malloc_trim walks the heap), so it
# is done where the pause it prevents is near: a worker holding over half of its limit.
GIVE_BACK_ABOVE = 0.5


def _worker_memory_high() -> bool:
    if not in_a_worker():
        return False
    from distributed import get_worker

    limit = get_worker().memory_manager.memory_limit
    return not limit or psutil.Process().memory_info().rss > GIVE_BACK_ABOVE * limit


def give_memory_back() -> None:
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only: musl and macOS have none)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc() if sys.platform.startswith("linux") else None


def task(fn, *args, key: str, **kwargs) -> dask.delayed:
    """A Delayed of ``fn(*args, **kwargs)`` named ``key``, its arguments passed as they are.

    ``dask.delayed(fn)(*args)`` looks inside every argument for Dask collections and rebuilds dataclasses
    field by field, when the graph is built and again in the task: 0.23 s to build pass 1 over the 2,000
    files of a lake's plan.  So arguments here must hold no Dask collection.

    >>> compute([task(abs, -1, key="abs-1")])
    [1]
    """
    run = functools.partial(giving_memory_back(fn), *args, **kwargs)
    return dask.delayed(run, name=key, traverse=False)(dask_key_name=key)


def task_of(fn, *tasks, key: str) -> dask.delayed:
    """A Delayed of ``fn`` of the results of ``tasks`` (Delayeds), named ``key``.

    >>> compute([task_of(max, task(abs, -1, key="a"), task(abs, -2, key="b"), key="max")])
    [2]
    """
    return dask.delayed(fn, name=key, traverse=False)(*tasks, dask_key_name=key)


@dataclasses.dataclass(frozen=True)
class Units:
    """What the tasks of a ``compute`` do in parts (a pass-2 task's piles): ``counts[i]`` of task ``i``, named
    ``name``.  A task calls ``units.report(i)`` with how many it has done, and a job's progress line counts
    those, not tasks: 1,000 piles in 8 tasks said "0 of 8 tasks done" for minutes.

    >>> units = Units.new("pile", [3, 2])
    >>> compute([task(units.report(i), n, key=f"u-{i}") for i, n in enumerate(units.counts)], units=units)
    [None, None]
    """

    run: str
    name: str
    counts: tuple[int, ...]

    @classmethod
    def new(cls, name: str, counts) -> Units:
        return cls(uuid.uuid4().hex, name, tuple(int(n) for n in counts))

    def report(self, i: int) -> UnitsDone:
        return UnitsDone(self.run, i)


@dataclasses.dataclass(frozen=True)
class UnitsDone:
    """Called by task ``task`` with how many of its units it has done: from a worker of another process,
    through the scheduler (distributed's events, one topic for every run: the scheduler keeps the last events
    of each topic); in this process, directly.  Best effort: never an error."""

    run: str
    task: int

    def __call__(self, done: int) -> None:
        counting = _COUNTING.get(self.run)
        if counting is not None:
            counting((self.task, done))
            return
        try:
            from distributed import get_worker

            get_worker().log_event(UNITS_TOPIC, (self.run, self.task, done))
        except (ImportError, ValueError):  # not on a worker (a local scheduler's task, nobody counting)
            pass


UNITS_TOPIC = "daskpile-progress"
_COUNTING: dict[str, object] = {}  # run: what counts its units in this process


def shows_progress_lines(progress: bool) -> bool:
    """Whether ``compute(..., progress=progress)`` prints progress lines (a log), where ``Units`` count."""
    return progress and not _shows_bars()


def compute(tasks, *, progress: bool = False, on_done=None, units: Units | None = None, along=None) -> list:
    """Compute Dask delayed ``tasks`` and return their results, in order.

    ``on_done(i)``, if given, is called as soon as task ``i`` has succeeded,
    on a thread of Dask's (so it must be quick and thread-safe).  ``units``
    (see ``Units``) makes a job's progress line count the tasks' parts.  When a task
    fails, the tasks still running are waited for (those not started are
    cancelled) before the error is raised: a caller that then removes what
    the run wrote finds every file a task will write already there.  ``along``: a task computed with them
    and not counted in their progress (one made of their results, such as their sum), its result last.

    >>> compute([dask.delayed(abs)(-1), dask.delayed(abs)(-2)], on_done=print)  # doctest: +SKIP
    0
    1
    [1, 2]
    """
    tasks = list(tasks)
    counted = len(tasks)
    bars = progress and _shows_bars()
    with contextlib.ExitStack() as callbacks:
        if progress and not bars and tasks:  # a log (a job's, a file): a line now and then, not a bar redrawn
            lines = ProgressLines(counted, on_done, units)
            on_done = callbacks.enter_context(lines)
            if units is not None:
                callbacks.enter_context(_counting(units.run, lines.units_done))
        return _compute(tasks + ([along] if along is not None else []), counted, bars, on_done, callbacks)


@contextlib.contextmanager
def _counting(run: str, count):
    """``count((task, done))`` for each report of ``run``: from this process, and from the current client's
    workers.  A client is subscribed while any run counts through it (runs in several threads, or clients)."""
    client = current_client()
    with _SUBSCRIBING:
        _COUNTING[run] = count
        if client is not None:
            if not _SUBSCRIBED.get(client.id):
                client.subscribe_topic(UNITS_TOPIC, _count_reported)
            _SUBSCRIBED[client.id] = _SUBSCRIBED.get(client.id, 0) + 1
    try:
        yield
    finally:
        with _SUBSCRIBING:
            _COUNTING.pop(run, None)
            if client is not None:
                _SUBSCRIBED[client.id] -= 1
                if not _SUBSCRIBED[client.id]:
                    del _SUBSCRIBED[client.id]
                    with contextlib.suppress(Exception):  # (a client closing: nothing more to count)
                        client.unsubscribe_topic(UNITS_TOPIC)


_SUBSCRIBING = threading.Lock()
_SUBSCRIBED: dict[str, int] = {}  # client id: the runs counting through it


def _count_reported(event) -> None:
    with contextlib.suppress(TypeError, ValueError):  # (not a report of ours: ignored)
        run, task, done = event[1]
        counting = _COUNTING.get(run)
        if counting is not None:
            counting((task, done))


class ProgressLines:
    """A line on stdout every ``PROGRESS_LINE_SECONDS`` while tasks run: ``  120 of 400 tasks done, 5 min``,
    or with ``units``, ``  300 of 1,000 piles done, 5 min``.

    Outside a terminal, a pass printed its one line when it ended, and a job's log (``kubectl logs``) said
    nothing for as long as a pass of 100 TB takes.  Used as a context manager, it gives ``on_done`` counting
    the tasks done (and calling the one given).
    """

    def __init__(self, total: int, on_done=None, units: Units | None = None):
        self.total, self.done, self._on_done, self.units = total, 0, on_done, units
        self._units_done = [0] * len(units.counts) if units is not None else []
        self._lock, self._start = threading.Lock(), time.monotonic()
        self._saying = _saying_every(self.line, PROGRESS_LINE_SECONDS)

    def __enter__(self):
        self._saying.__enter__()
        return self.task_done

    def __exit__(self, *exc) -> None:
        self._saying.__exit__(*exc)

    def task_done(self, i: int) -> None:
        with self._lock:
            self.done += 1
            if i < len(self._units_done):
                self._units_done[i] = self.units.counts[i]
        if self._on_done is not None:
            self._on_done(i)

    def units_done(self, report) -> None:
        """A task's report ``(task, units it has done)``; a task run again (its worker died) counts once."""
        with contextlib.suppress(TypeError, ValueError, IndexError):  # (not a report of ours: ignored)
            i, done = report
            with self._lock:
                self._units_done[i] = max(self._units_done[i], min(int(done), self.units.counts[i]))

    def line(self) -> str:
        minutes = (time.monotonic() - self._start) / 60
        if self.units is None:
            return f"  {self.done:,} of {self.total:,} tasks done, {minutes:,.0f} min"
        with self._lock:
            done = sum(self._units_done)
        return f"  {done:,} of {sum(self.units.counts):,} {self.units.name}s done, {minutes:,.0f} min"


PROGRESS_LINE_SECONDS = 60.0


@contextlib.contextmanager
def _saying_every(line, first: float):
    """While the block runs, ``line()`` printed after ``first`` seconds, then every ``PROGRESS_LINE_SECONDS``."""
    done = threading.Event()

    def say_until_done() -> None:
        wait = first
        while not done.wait(wait):
            print(line(), flush=True)
            wait = PROGRESS_LINE_SECONDS

    thread = threading.Thread(target=say_until_done, daemon=True, name="daskpile-progress")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _compute(tasks: list, counted: int, bars: bool, on_done, callbacks: contextlib.ExitStack) -> list:
    """``compute`` on the current client's cluster, else on Dask's local scheduler (``callbacks`` holds its
    callbacks for the call); the first ``counted`` tasks are those ``on_done`` and the bars count."""
    client = current_client()
    if client is not None:
        return _compute_on_cluster(client, tasks, counted, bars, on_done)
    if on_done is not None:
        from dask.callbacks import Callback

        index = {task.key: i for i, task in enumerate(tasks[:counted])}
        callbacks.enter_context(Callback(posttask=lambda key, *_: on_done(index[key]) if key in index else None))
    if bars:
        from dask.diagnostics import ProgressBar

        callbacks.enter_context(ProgressBar(out=sys.stdout))
    if _configured() not in (None, "threads", "threading"):
        return list(dask.compute(*tasks, scheduler=_local_scheduler()))
    # Threads: a pool of our own, so that a failure can wait for the tasks it leaves running, and Ctrl-C stop them
    ctrl_c = threading.Event()
    threads = dask.config.get("num_workers", None) or dask.system.CPU_COUNT
    pool = concurrent.futures.ThreadPoolExecutor(threads, initializer=_stopped_by, initargs=(ctrl_c,))
    interrupted = False
    try:
        return list(dask.compute(*tasks, scheduler=dask.threaded.get, pool=pool))
    except KeyboardInterrupt:  # Ctrl-C: the run is resumable whatever its running tasks still write
        interrupted = True
        ctrl_c.set()
        raise
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)


# What a thread of a threaded run's pool sees set once Ctrl-C stops that run (each pool its own: not another
# run's, in another thread, nor a later one): its running tasks stop at their next pile or piece
# (``stop_after_ctrl_c``), each written whole.  A task went on to the end of its share: one of 100,000 piles of
# a few rows each wrote for minutes, and the process, which waits for its threads, exited then.
_RUN = threading.local()


def _stopped_by(ctrl_c: threading.Event) -> None:
    _RUN.ctrl_c = ctrl_c


class StoppedByCtrlC(Exception):
    """A task of a run Ctrl-C stopped ends here (in a thread of this process; a worker's tasks are cancelled)."""


def stop_after_ctrl_c() -> None:
    """Raise ``StoppedByCtrlC`` in a task of a threaded run Ctrl-C has stopped: between two of its writes."""
    ctrl_c = getattr(_RUN, "ctrl_c", None)
    if ctrl_c is not None and ctrl_c.is_set():
        raise StoppedByCtrlC


def exception_chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised while handling (its ``__context__``), the latest first.

    >>> try:
    ...     try:
    ...         raise KeyboardInterrupt
    ...     except KeyboardInterrupt:
    ...         raise OSError(9, "Bad file descriptor")
    ... except OSError as e:
    ...     [type(c).__name__ for c in exception_chain(e)]
    ['OSError', 'KeyboardInterrupt']
    """
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        chain.append(e)
        seen.add(id(e))
        e = e.__context__
    return chain


class WorkerKilled(RuntimeError):
    """The workers running one of daskpile's tasks died while running it, as often as Dask allows: out of
    memory, most often.  ``key`` is the task's; ``piles``, a pass-2 task's piles."""

    key: str = ""
    piles: tuple[int, ...] = ()

    def saying(self, more: str) -> WorkerKilled:
        """The same error with ``more`` said after its message (what the caller knows of the task)."""
        said = WorkerKilled(f"{self}{more}")
        said.key, said.piles = self.key, self.piles
        return said


# What a task of daskpile's does, by the start of its key, and what to change when its workers die
_TASKS = [
    ("daskpile-scatter", "pass 1 (reading a piece of the input)",
     ", or a smaller blocksize (--blocksize: another call, with overwrite=True, --overwrite)"),
    ("daskpile-gather", "pass 2 (loading and writing a pile)",
     ", or a smaller memory_per_pile (--memory-per-pile: the same call, it resumes), or more piles (another call, "
     "with --overwrite)"),
    ("daskpile-split", "pass 2 (splitting a pile over its budget)",
     ", or a smaller memory_per_pile (--memory-per-pile: the same call, it resumes)"),
    ("daskpile-compact", "compact (merging a pile's generations)", ""),
    ("daskpile-pile-totals", "the end of pass 1 (summing its tasks' pile counts)", ", or fewer piles"),
]  # fmt: skip


class NoWorkerRunning(RuntimeError):
    """Tasks of daskpile's waited longer than Dask's ``distributed.scheduler.no-workers-timeout`` (10 minutes on
    the clusters daskpile starts) with no worker running: every one paused for memory, gone, or not started.
    The minutes count while every worker is paused, even one still finishing a task.  ``key`` is the first
    such task's."""

    key: str = ""


def _doing(key: str) -> tuple[str, str]:
    """What a task of daskpile's does, by its key, and what to change when its workers cannot run it."""
    return next(((d, c) for prefix, d, c in _TASKS if key.startswith(prefix)), (f"task {key}", ""))


def _task_key(task) -> str:
    return str(task[0] if isinstance(task, tuple) else task)


def _no_worker_running(error) -> NoWorkerRunning:
    """Dask's "Attempted to run task ... but timed out after N s waiting for any running workers" said as what
    daskpile was doing, and why a worker stops running."""
    key = _task_key(error.task)
    doing, _ = _doing(key)
    stopped = NoWorkerRunning(
        f"no worker ran {doing} for {error.timeout:,.0f} s: every worker was paused, above the memory at which "
        "Dask pauses one (80 % of its limit), gone, or not started.  A worker holding memory it cannot give back "
        "stays paused: give the workers more memory (--memory-limit, on a cluster daskpile starts), or restart "
        "them"
    )
    stopped.key = key
    return stopped


def _killed(error) -> WorkerKilled:
    """Dask's "Attempted to run task ... on N different workers" said as what daskpile was doing."""
    key = _task_key(error.task)
    doing, change = _doing(key)
    deaths = error.allowed_failures + 1
    killed = WorkerKilled(
        f"the workers running {doing} died {deaths} time{'s' if deaths > 1 else ''}, most likely out of memory (a task "
        f"holds several times its piece or pile): give the workers more memory (--memory-limit, on a cluster "
        f"daskpile starts){change}"
    )
    killed.key = key
    return killed


_DEATHS: contextvars.ContextVar[list | None] = contextvars.ContextVar("daskpile_worker_deaths", default=None)


@contextlib.contextmanager
def counting_worker_deaths(died: list):
    """Within the block, each worker that died while running or holding a task of ``compute`` (or a task they
    depend on) is appended to ``died`` (its address), the compute having succeeded: its tasks ran again.

    A run that succeeded so says that its workers ran out of memory (most
    often), which the user would otherwise not know until a run fails.  Read
    from the scheduler's event log once each compute is done: a death pushed
    out of it by later events (it keeps the last 1,000 of a busy shared
    cluster's) is not counted.

    >>> died = []
    >>> with counting_worker_deaths(died):  # doctest: +SKIP
    ...     compute(tasks)
    >>> died  # doctest: +SKIP
    ['tcp://127.0.0.1:40111']
    """
    token = _DEATHS.set(died)
    try:
        yield died
    finally:
        _DEATHS.reset(token)


def _deaths_since(client, since: float, keys: set) -> list[str]:
    """The workers the scheduler lost, unexpectedly, since ``since`` (its clock) while running or holding
    one of ``keys``.  A worker retired on purpose (a cluster scaled down) hands its work over: not counted."""
    died = []
    for when, event in client.get_events("all"):
        if when < since or not isinstance(event, dict) or event.get("action") != "remove-worker":
            continue
        touched = {*event.get("processing-tasks", ()), *event.get("lost-computed-tasks", ())}
        if not event.get("expected") and touched & keys:
            died.append(event.get("worker", "?"))
    return died


def _compute_on_cluster(client, tasks: list, counted: int, bars: bool, on_done) -> list:
    died = _DEATHS.get()
    since = client.run_on_scheduler(time.time) if died is not None else 0.0
    with warnings.catch_warnings():
        # (a plan of 50,000 files is a graph of 30 MiB: distributed's advice to load the data with Dask instead
        # is for graphs that embed data)
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        futures = client.compute(tasks)
    # every task of the graphs, not the futures' alone: those may be made of tasks still running (pass 1's sums)
    keys = {key for task in tasks for key in task.__dask_graph__()}
    # The client runs done-callbacks on a thread of its own, which may still be on the last one when
    # gather returns: every call is waited for, so the caller never sees on_done(i) after compute.
    called = threading.Semaphore(0)

    def done(future, i):
        try:
            if future.status == "finished":
                on_done(i)
        finally:
            called.release()

    for i, future in enumerate(futures[:counted] if on_done is not None else []):
        future.add_done_callback(functools.partial(done, i=i))
    if bars:
        from distributed import progress as show_progress

        show_progress(futures[:counted])
    from distributed import KilledWorker
    from distributed.scheduler import NoValidWorkerError, NoWorkerError

    try:
        results = client.gather(futures)
    except KilledWorker as e:
        _cancel_and_wait(client, futures, keys)
        raise _killed(e) from e
    except (NoWorkerError, NoValidWorkerError) as e:  # (the second: a task waiting unassigned; ours ask for none)
        _cancel_and_wait(client, futures, keys)
        raise _no_worker_running(e) from e
    except BaseException as e:
        _cancel_and_wait(client, futures, keys, interrupted=isinstance(e, KeyboardInterrupt))
        raise
    for _ in futures[:counted] if on_done is not None else []:
        called.acquire()
    if died is not None:
        died.extend(_deaths_since(client, since, keys))
    return results


RUNNING_WAIT_SECONDS = 120  # a task's write, at most: a pile, or an input partition's scatter
# Once the process is to be killed (SIGTERM: Kubernetes and Slurm send SIGKILL 30 s later, by default), the wait
# ends in time for the command to let go of the dest's lease and say how to resume: killed while waiting, it left
# the lease, and a job resubmitted on another node was refused for two minutes.  What still runs finishes on its
# own; its writes are the ones a resumed run makes, each whole under a temporary name.
KILLED_SOON_WAIT_SECONDS = 20
KILLED_SOON = threading.Event()  # set by the command's SIGTERM handler
# A wait for running tasks after a Ctrl-C is said once it is this long: a shorter one ends in the command's one line
WAIT_SAID_AFTER = 2.0


def _cancel_and_wait(client, futures, keys: set, interrupted: bool = False) -> None:
    """Cancel ``futures``; return once no worker still runs a task of ``keys`` (or after a while).

    A cancelled task already running goes on in its worker's thread, which
    cannot be stopped: the scheduler forgets it, its worker does not.  After
    a Ctrl-C, a wait longer than ``WAIT_SAID_AFTER`` is said on stderr (a task
    writing a pile to an object store may take a minute, a pod's grace period
    is 30 s), and another Ctrl-C ends it.
    """
    said = not interrupted
    with contextlib.suppress(Exception):
        client.cancel(futures)
        start = time.monotonic()
        while time.monotonic() < start + (limit := _running_wait()):
            running = keys.intersection(key for found in client.run(_running_keys).values() for key in found)
            if not running:
                return
            if not said and time.monotonic() > start + WAIT_SAID_AFTER:
                print(
                    f"daskpile: interrupted: waiting up to {limit} s for {len(running)} "
                    f"task{'s' * (len(running) > 1)} still running to finish their writes "
                    f"({'another SIGTERM' if KILLED_SOON.is_set() else 'Ctrl-C again'} stops without waiting)",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(0.05)


def _running_wait() -> float:
    return KILLED_SOON_WAIT_SECONDS if KILLED_SOON.is_set() else RUNNING_WAIT_SECONDS


def _running_keys(dask_worker) -> list:
    """The keys of the tasks a worker's threads run, cancelled ones too."""
    return [ts.key for ts in dask_worker.state.executing | dask_worker.state.long_running]


def _configured():
    """The scheduler Dask's configuration names (lower case), None where it names none."""
    configured = dask.config.get("scheduler", None)
    return configured.lower() if isinstance(configured, str) else configured


def _local_scheduler():
    """Dask's configured local scheduler when ``distributed`` is not imported, else None (Dask decides).

    Without distributed no client can exist, and ``dask.compute`` would import
    it (0.7 s, a tenth of a small shuffle) only to find none.
    """
    if "distributed" in sys.modules:
        return None
    from dask.base import named_schedulers

    configured = _configured() or "threads"
    return named_schedulers.get(configured) if isinstance(configured, str) else None


def _shows_bars() -> bool:
    return sys.stdout.isatty() or _in_notebook()


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (what ``distributed.utils.is_kernel`` does, without importing it)."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


class Timer:
    """Seconds since creation; ``say`` prints one summary line when progress is on."""

    def __init__(self, progress: bool):
        self.progress = progress
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def say(self, message: str, seconds: float | None = None) -> None:
        """``message`` and the seconds since creation (or ``seconds``, which a report gives too)."""
        if self.progress:
            print(f"{message}, {self.seconds if seconds is None else seconds:.1f} s", flush=True)


@contextlib.contextmanager
def said_while_slow(doing: str, progress: bool, first: float | None = None):
    """With ``progress``, a line ``  doing, 10 s`` once a step that says nothing until it ends has taken
    ``first`` seconds (``SLOW_STEP_SECONDS``), and one every ``PROGRESS_LINE_SECONDS`` after.

    Planning a source (listing it, reading its footers, reaching its store) said nothing: 50,000 small files
    took 18 s before the first line, and gcsfs two minutes to give up on a store out of reach.

    >>> with said_while_slow("still planning", progress=True, first=0.01):
    ...     time.sleep(0.1)
      still planning, 0 s
    """
    if not progress:
        yield
        return
    start = time.monotonic()
    with _saying_every(
        lambda: f"  {doing}, {time.monotonic() - start:,.0f} s", SLOW_STEP_SECONDS if first is None else first
    ):
        yield


SLOW_STEP_SECONDS = 10.0


def workers_missing(path: str) -> tuple[list[str], int]:
    """(workers on which the local file ``path``, which this process sees, does not exist, all workers) of the
    current client; ([], 0) without one.  For a source, which may be read-only: nothing is written."""
    return _workers_without(os.path.exists, path)


def workers_blind_to(path: str) -> tuple[list[str], int]:
    """(workers that cannot see the local ``path``, all workers) of the current client; ([], 0) without one.

    A probe file is written in ``path``, or in its nearest existing parent, and
    every worker is asked whether it exists: on a cluster whose workers share no
    disk with this process (Kubernetes), local scratch or a local dest would be
    written where nobody else reads it.
    """
    if current_client() is None:
        return [], 0
    directory = path
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    probe = os.path.join(directory, f".daskpile-probe-{uuid.uuid4().hex[:8]}")
    open(probe, "wb").close()
    try:
        return _workers_without(os.path.exists, probe)
    finally:
        os.remove(probe)


def workers_blind_to_memory(url: str) -> tuple[list[str], int]:
    """``workers_blind_to`` for a ``memory://`` URL: fsspec's memory file system is each process's own, which only
    workers in this process (a LocalCluster of threads) see."""
    import fsspec

    if current_client() is None:
        return [], 0
    memory = fsspec.filesystem("memory")
    probe = f"{url.rstrip('/')}/.daskpile-probe-{uuid.uuid4().hex[:8]}"
    memory.pipe_file(probe, b"")
    try:
        return _workers_without(_in_memory, probe)
    finally:
        memory.rm_file(probe)


def _workers_without(found, path: str) -> tuple[list[str], int]:
    """(the current client's workers on which ``found(path)`` is false, all workers); ([], 0) without a client."""
    client = current_client()
    if client is None:
        return [], 0
    seen = client.run(found, path)
    return sorted(worker for worker, there in seen.items() if not there), len(seen)


def _in_memory(path: str) -> bool:
    import fsspec

    return fsspec.filesystem("memory").isfile(path)
