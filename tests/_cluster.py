"""A real Dask cluster whose workers share no disk with the client or with each other, and an S3 server.

``open_isolated_cluster()`` (and the module-scoped fixture ``isolated_cluster``)
starts, as separate processes of this machine:

- one ``dask scheduler`` on 127.0.0.1, port chosen by the kernel (``--port 0``,
  read back from its scheduler file), no dashboard;
- workers (``dask worker --nthreads 1 --nworkers 1 --no-nanny``), each in a
  mount namespace of its own, ``unshare --mount --propagation private``, where a
  fresh tmpfs is mounted on /tmp before the worker starts.  ``TMPDIR=/tmp``,
  dask's ``temporary-directory`` and ``--local-directory /tmp/dask-worker``
  make every temporary path of the worker (Python's ``tempfile``, dask's spill
  and scratch space) land on that private /tmp.  Nothing the client or another
  worker writes under /tmp is visible to a worker, which is what a cluster of
  separate machines looks like to daskpile, whose default scratch is
  ``tempfile.gettempdir()``.  The rest of the file system stays shared (the
  workers run this virtualenv and can import the test helpers, as the machines
  of a real cluster have the same code installed); the network namespace too,
  so workers reach the scheduler and the S3 server on 127.0.0.1.  Should this
  checkout, the virtualenv or Python itself live under /tmp (a CI clone may),
  that directory is bound back into the worker's /tmp at the same path.

Why no nanny: a worker is then one process, started as ``setpriv`` exec'ing
``unshare`` exec'ing ``sh`` exec'ing ``dask worker``, so the PID of the
``Popen`` is the worker's own PID (``client.run(os.getpid)`` agrees, which the
harness checks).  SIGKILL to it loses exactly that worker and its /tmp (the
namespace and its tmpfs go with its last process), and nothing restarts it
behind the test's back: a test that wants a replacement asks for one with
``add_worker()``, which gets a fresh, empty /tmp like a new machine.

Clean-up: every process leads a process group of its own (``setsid``) and is
started under ``setpriv --pdeathsig KILL``, so it dies with the thread that
started it even if pytest itself is killed; on exit (test passed, failed or
interrupted) the groups get SIGTERM, then SIGKILL after a grace period (the
workers' first, then the scheduler's), and an ``atexit`` hook repeats that for
any cluster left open.  The tmpfs mounts need no unmounting: they exist only
inside the namespaces, which vanish with their processes.

Start the cluster from the main thread (as pytest runs fixtures and tests):
``--pdeathsig`` follows the *thread* that forked, so a cluster started from a
short-lived thread would die with it.

Functions the workers run (``touch_partition``, ``slow_partition``,
``touched``) live here, not in the test module: cloudpickle sends module-level
functions by reference, and the scheduler (which unpickles graphs) and the
workers import this module (``PYTHONPATH`` holds the tests directory).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

DASK = Path(sys.executable).parent / "dask"
TESTS = Path(__file__).resolve().parent
WORKER_TMP_SIZE = "1g"  # the tmpfs of each worker's /tmp; pages are only used as written
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL on exit (a worker stops in well under 1 s)

# What every process of the cluster gets in its environment, besides this process's.
CLUSTER_ENV = {
    # Lighter servers on 2 cores (the settings daskpile's own LocalCluster uses, daskpile/_compute.py).
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "200ms",
    # botocore must not look for an EC2 metadata service before talking to the local S3 server.
    "AWS_EC2_METADATA_DISABLED": "true",
    "PYTHONUNBUFFERED": "1",
}
# The scheduler unpickles graphs and the workers run tasks that name functions of this module.
PYTHONPATH = os.pathsep.join(p for p in [str(TESTS), os.environ.get("PYTHONPATH", "")] if p)
WORKER_ENV = {"TMPDIR": "/tmp", "DASK_TEMPORARY_DIRECTORY": "/tmp"}
WORKER_LOCAL_DIRECTORY = "/tmp/dask-worker"


def code_under_tmp() -> list[str]:
    """What the workers must still see if it lives under /tmp: this checkout, the virtualenv, the Python.

    A clone in /tmp (as some CI systems make) would otherwise vanish under
    the workers' private /tmp, and with it the ``dask`` command and the code.
    """
    paths = {Path(p).resolve() for p in [TESTS.parent, sys.prefix, sys.base_prefix]}
    under = sorted(p for p in paths if p.is_relative_to("/tmp") and p != Path("/tmp"))
    return [str(p) for p in under if not any(p != q and p.is_relative_to(q) for q in under)]


def mount_private_tmp(keep: list[str]) -> str:
    """The shell script run in the worker's new mount namespace: a tmpfs on /tmp, then the worker ("$0" "$@").

    Each directory of ``keep`` (under /tmp) is opened before the mount and
    bound back at its own path after it, through its open descriptor.
    """
    steps = [f"exec {3 + i}<{shlex.quote(path)}" for i, path in enumerate(keep)]
    steps.append(f"mount -t tmpfs -o mode=1777,size={WORKER_TMP_SIZE} daskpile-tmp /tmp")
    for i, path in enumerate(keep):
        q = shlex.quote(path)
        steps.append(f"mkdir -p {q} && mount --no-canonicalize --bind /proc/self/fd/{3 + i} {q} && exec {3 + i}<&-")
    steps.append('exec "$0" "$@"')
    return " && ".join(steps)


@functools.cache
def isolation_refused() -> str | None:
    """Why workers cannot get a private /tmp on this machine, or None if they can (tried for real, once)."""
    if not sys.platform.startswith("linux"):
        return f"private /tmp per worker needs Linux mount namespaces, this is {sys.platform}"
    for tool in ["unshare", "setpriv", "mount"]:
        if shutil.which(tool) is None:
            return f"private /tmp per worker needs util-linux's {tool}, not found on PATH"
    if os.geteuid() != 0:
        return f"private /tmp per worker needs root (unshare --mount and mount -t tmpfs), running as uid {os.geteuid()}"
    if not DASK.exists():
        return f"no dask command next to this Python ({DASK})"
    probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs daskpile-probe /tmp"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{shlex.join(probe)} failed: {e}"
    if result.returncode:
        return (
            f"{shlex.join(probe)} refused (exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
        )
    return None


@dataclasses.dataclass
class ClusterProcess:
    """One process of the cluster: the scheduler or a worker, with its log file."""

    name: str
    process: subprocess.Popen
    log: Path
    address: str | None = None  # a worker's, once it has registered

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)  # start_new_session: the process leads its own group


class IsolatedCluster:
    """A scheduler and workers with a private /tmp each (see the module's docstring)."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.scheduler: ClusterProcess | None = None
        self.address: str = ""
        self.workers: list[ClusterProcess] = []  # every worker started, dead or alive, in start order
        self._started = 0

    def __repr__(self) -> str:
        alive = [w.name for w in self.workers if w.alive()]
        return f"IsolatedCluster({self.address!r}, workers alive: {alive})"

    # -- starting -----------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> ClusterProcess:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **CLUSTER_ENV, "PYTHONPATH": PYTHONPATH, **env},
                start_new_session=True,
            )
        _open_clusters.add(self)
        return ClusterProcess(name, process, log)

    def start_scheduler(self, timeout: float) -> None:
        scheduler_file = self.log_dir / "scheduler.json"  # on the shared disk: only this process reads it
        args = [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
        self.scheduler = self._spawn("scheduler", [*args, "--scheduler-file", str(scheduler_file)], {})
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                self.address = json.loads(scheduler_file.read_text())["address"]
                return
            if not self.scheduler.alive():
                raise RuntimeError(
                    f"dask scheduler exited with {self.scheduler.process.returncode}:\n{self.scheduler.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"dask scheduler wrote no address in {timeout} s:\n{self.scheduler.log_tail()}")
            time.sleep(0.05)

    def _spawn_worker(self) -> ClusterProcess:
        name = f"isolated-{self._started}"
        self._started += 1
        worker = [
            str(DASK), "worker", self.address,
            "--name", name,
            "--nthreads", "1",
            "--nworkers", "1",
            "--no-nanny",
            "--no-dashboard",
            "--host", "127.0.0.1",
            "--local-directory", WORKER_LOCAL_DIRECTORY,
            "--memory-limit", "2GiB",
            "--death-timeout", "60",
        ]  # fmt: skip
        unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_private_tmp(code_under_tmp())]
        process = self._spawn(name, [*unshare, *worker], WORKER_ENV)
        self.workers.append(process)
        return process

    def _wait_for(self, new: list[ClusterProcess], timeout: float) -> None:
        """Until the scheduler lists every worker of ``new`` (by name), with the PID the harness started."""
        from distributed import Client

        deadline = time.monotonic() + timeout
        with Client(self.address, set_as_default=False, timeout=timeout) as client:
            while True:
                registered = {info["name"]: (addr, info) for addr, info in client.scheduler_info()["workers"].items()}
                for worker in new:
                    if worker.name in registered:
                        worker.address, info = registered[worker.name]
                        if info.get("pid", worker.pid) != worker.pid:
                            raise RuntimeError(f"{worker.name} runs as PID {info['pid']}, not {worker.pid}")
                    elif not worker.alive():
                        raise RuntimeError(
                            f"{worker.name} exited with {worker.process.returncode}:\n{worker.log_tail()}"
                        )
                if all(w.address for w in new):
                    return
                if time.monotonic() > deadline:
                    logs = "\n".join(f"--- {w.name}\n{w.log_tail()}" for w in new if not w.address)
                    raise TimeoutError(f"workers not registered with {self.address} in {timeout} s:\n{logs}")
                time.sleep(0.1)

    def start_workers(self, n: int, timeout: float) -> list[ClusterProcess]:
        new = [self._spawn_worker() for _ in range(n)]
        self._wait_for(new, timeout)
        return new

    def add_worker(self, timeout: float = 60) -> ClusterProcess:
        """Start one more worker (fresh, empty /tmp) and wait until the scheduler has it."""
        return self.start_workers(1, timeout)[0]

    # -- using --------------------------------------------------------------------------------------

    def alive_workers(self) -> list[ClusterProcess]:
        return [w for w in self.workers if w.alive()]

    def worker_pids(self) -> dict[str, int]:
        """Address -> PID of every worker process still running."""
        return {w.address: w.pid for w in self.alive_workers() if w.address}

    def worker_at(self, address: str) -> ClusterProcess:
        return next(w for w in self.workers if w.address == address)

    def kill_worker(self, worker: ClusterProcess, sig: int = signal.SIGKILL, timeout: float = 10) -> None:
        """Send ``sig`` to the worker (SIGKILL: no goodbye to the scheduler) and reap it."""
        os.kill(worker.pid, sig)
        worker.process.wait(timeout)

    def check(self, workers: int | None = None) -> None:
        """Raise if the scheduler has died, or fewer than ``workers`` workers are still running."""
        if self.scheduler is None or not self.scheduler.alive():
            raise RuntimeError(
                f"the scheduler of {self!r} is not running:\n{self.scheduler and self.scheduler.log_tail()}"
            )
        if workers is not None and len(self.alive_workers()) < workers:
            raise RuntimeError(f"{self!r} has fewer than {workers} workers")

    # -- stopping -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process: the workers, then the scheduler, each group SIGTERM then SIGKILL.

        Workers go first: a worker closing gracefully while the scheduler goes
        away can hang in its close (distributed 2026.8), which would cost the
        whole grace period.
        """
        for group in [self.workers, [self.scheduler] if self.scheduler else []]:
            for p in group:
                p.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE
            for p in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.process.wait(max(0.0, deadline - time.monotonic()))
            for p in group:
                p.signal_group(signal.SIGKILL)  # also anything the process left in its group
                p.process.wait()
        _open_clusters.discard(self)


_open_clusters: set[IsolatedCluster] = set()


@atexit.register
def _close_leftovers() -> None:
    for cluster in list(_open_clusters):
        cluster.close()


@contextlib.contextmanager
def open_isolated_cluster(n_workers: int = 2, *, log_dir: Path | None = None, timeout: float = 60):
    """A scheduler and ``n_workers`` workers with a private /tmp each; skips the test if this machine refuses.

    Yields the ``IsolatedCluster``: ``.address`` is the scheduler's,
    ``.worker_pids()`` maps worker addresses to PIDs, ``.add_worker()`` and
    ``.kill_worker()`` change the cluster.  Everything is stopped on exit.
    """
    reason = isolation_refused()
    if reason:
        pytest.skip(reason)
    owned = log_dir is None
    log_dir = Path(tempfile.mkdtemp(prefix="isolated-cluster-")) if owned else Path(log_dir)
    cluster = IsolatedCluster(log_dir)
    try:
        cluster.start_scheduler(timeout)
        cluster.start_workers(n_workers, timeout)
        yield cluster
    finally:
        cluster.close()
        if owned:
            shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def isolated_cluster(tmp_path_factory):
    """Two workers with a private /tmp each, shared by a test module (see ``open_isolated_cluster``)."""
    with open_isolated_cluster(2, log_dir=tmp_path_factory.mktemp("isolated-cluster")) as cluster:
        yield cluster


@pytest.fixture
def isolated_client(isolated_cluster):
    """A distributed Client of ``isolated_cluster``, the default one while the test runs."""
    from distributed import Client

    isolated_cluster.check(workers=2)
    with Client(isolated_cluster.address, timeout=30) as client:
        yield client


# -- an S3-compatible server (the pattern of tests/test_s3.py's ``s3`` fixture) ------------------------


@contextlib.contextmanager
def moto_s3(buckets=("scratch",)):
    """moto's S3 server on 127.0.0.1 (a thread of this process); yields ``(s3fs filesystem, storage_options)``."""
    s3fs = pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"},
        }
        fs = s3fs.S3FileSystem(**options)
        for bucket in buckets:
            if not fs.exists(bucket):  # moto's state is the process's: another module's server made it
                fs.mkdir(bucket)
        yield fs, options
    finally:
        server.stop()


@contextlib.contextmanager
def moto_s3_process(env: dict | None = None):
    """moto's S3 server on 127.0.0.1 in a process of its own: a store apart from any of this process's (moto's
    state is its process's), or one started with ``env`` (``INITIAL_NO_AUTH_ACTION_COUNT``); yields its URL."""
    pytest.importorskip("moto.server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", "from moto.server import ThreadedMotoServer as S; import time; "
         f"S(ip_address='127.0.0.1', port={port}, verbose=False).start(); time.sleep(300)"],
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        for _ in range(100):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"moto's S3 server did not come up on port {port} in 10 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def s3_server():
    """``(fs, storage_options)`` of a module-wide S3 server with the bucket ``scratch``."""
    with moto_s3() as fs_and_options:
        yield fs_and_options


# -- run by the workers -------------------------------------------------------------------------------

_touched: list[str] = []  # in a worker process: the tags of the partitions it computed


def touch_partition(frame, tag: str):
    """The partition unchanged, noting in the worker that a partition tagged ``tag`` was computed."""
    _touched.append(tag)
    return frame


def touched(tag: str) -> int:
    """How many partitions tagged ``tag`` this worker computed (``client.run(touched, tag)``)."""
    return _touched.count(tag)


def slow_partition(frame, seconds: float, tag: str):
    """The partition unchanged, after ``seconds`` (then noted like ``touch_partition``).

    Makes pass 1 last long enough to kill a worker in the middle of it.
    """
    time.sleep(seconds)
    return touch_partition(frame, tag)


def wait_until(condition, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``condition()`` until it returns something true, which is returned; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met in {timeout} s")
        time.sleep(interval)
