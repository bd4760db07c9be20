"""Where tasks run: daskpile's own LocalCluster settings, and the local scheduler without distributed."""

import contextlib
import json
import os
import re
import subprocess
import sys
import time

import dask
import pytest
from _util import huge_pages_testable

from daskpile._compute import compute, counting_worker_deaths, local_cluster_config


def test_the_local_cluster_runs_without_profiler_malloc_trimming_and_huge_pages_and_with_a_slower_tick():
    # In a fresh process, as the command runs: a default LocalCluster started earlier in the same process
    # leaves MALLOC_TRIM_THRESHOLD_ in its environment (distributed sets it there before spawning), and
    # later workers inherit it from there.
    script = """
import dask, json, os
from distributed import Client
from daskpile._compute import local_cluster
def huge_pages_allowed():
    import pyarrow  # (mimalloc reads MIMALLOC_ALLOW_THP as it loads, and tells Linux)
    pyarrow.allocate_buffer(1 << 20)
    status = open("/proc/self/status").read()
    return [line.split()[1] for line in status.splitlines() if line.startswith("THP_enabled")]
if __name__ == "__main__":
    with local_cluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        (environ,) = client.run(lambda: dict(os.environ)).values()
        (profiling,) = client.run(lambda: dask.config.get("distributed.worker.profile.enabled")).values()
        (tick,) = client.run(lambda dask_worker: dask_worker._tick_interval).values()
        (huge_pages,) = client.run(huge_pages_allowed).values()
        scheduler_tick = cluster.scheduler._tick_interval
        waits = cluster.scheduler.no_workers_timeout
    print(json.dumps({"environ": environ, "profiling": profiling, "tick": [tick, scheduler_tick], "waits": waits,
                      "huge_pages": huge_pages,
                      "default": dask.config.get("distributed.nanny.pre-spawn-environ")}))
"""
    # the environment of a shell starting `daskpile`, not of this test process (see above)
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_TRIM_THRESHOLD_", "MIMALLOC_ALLOW_THP")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True, env=environ
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "MALLOC_TRIM_THRESHOLD_" not in found["environ"]
    assert found["environ"]["OMP_NUM_THREADS"] == "1"  # distributed's other pre-spawn settings stay
    assert found["profiling"] is False
    assert found["environ"]["MIMALLOC_ALLOW_THP"] == "0"
    if not huge_pages_testable():  # (where a child of this process could have them)
        assert found["huge_pages"] == ["0"]  # Arrow's mimalloc in the worker turned them off
    assert found["tick"] == [0.2, 0.2]  # seconds between event-loop health checks, in workers and scheduler
    assert found["waits"] == 600  # seconds tasks wait while every worker is paused or gone
    assert "MALLOC_TRIM_THRESHOLD_" in found["default"]  # changed only for that cluster


@pytest.mark.slow
def test_the_local_clusters_huge_pages_setting_is_the_users_where_they_gave_one(monkeypatch):
    key = "distributed.nanny.pre-spawn-environ.MIMALLOC_ALLOW_THP"
    monkeypatch.delenv("MIMALLOC_ALLOW_THP", raising=False)
    assert local_cluster_config()[key] == "0"
    with dask.config.set({key: "1"}):  # (a ~/.config/dask file's)
        assert local_cluster_config()[key] == "1"
    monkeypatch.setenv("MIMALLOC_ALLOW_THP", "2")  # exported after daskpile was imported: read when a cluster starts
    assert local_cluster_config()[key] == "2"


def test_the_local_cluster_of_the_command_admits_no_other_process():
    """Its scheduler talks TLS with a key held in its own memory, so another process (another user of the
    machine) connecting to its port cannot run code on it, with or without TLS of its own; its dashboard
    listens on 127.0.0.1 only.  A plain LocalCluster (``secure=False``) lets the same intruder in."""
    import psutil
    from distributed import Client

    from daskpile._compute import local_cluster

    intruder = """
import sys
from distributed import Client
from distributed.security import Security
address, tls = sys.argv[1], sys.argv[2] == "tls"
try:
    with Client(address, timeout="5s", security=Security.temporary() if tls else None) as client:
        print("ran", client.submit(sum, [1, 2]).result())
except Exception as e:
    print("refused", type(e).__name__)
"""

    def intrude(address: str, tls: bool) -> str:
        done = subprocess.run(
            [sys.executable, "-c", intruder, address, "tls" if tls else "plain"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[-1]

    with local_cluster(n_workers=1, threads_per_worker=1) as cluster, Client(cluster) as client:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:") and client.submit(sum, [1, 2]).result() == 3
        assert intrude(address.replace("tls://", "tcp://"), tls=False).startswith("refused")
        assert intrude(address, tls=True).startswith("refused")
        port = cluster.scheduler.http_server.port
        listening = {c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.laddr.port == port}
        assert listening == {"127.0.0.1"}, listening
    with local_cluster(secure=False, n_workers=1, threads_per_worker=1) as plain:
        assert intrude(plain.scheduler_address, tls=False) == "ran 3"  # the test can fail


def test_a_foreign_connection_refused_by_the_commands_cluster_is_not_logged_beside_its_line():
    """A port probe from another process reset the TLS handshake of the command's scheduler, and distributed's
    WARNING line reached the command's stderr before its one-line error (seen in a parallel CI run)."""
    import logging

    from daskpile._compute import _not_reported_elsewhere

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("distributed.comm.tcp", logging.WARNING, __file__, 1, message, None, None)

    probe = "Listener on 'tls://127.0.0.1:37575': TLS handshake failed with remote 'tls://127.0.0.1:40168': reset"
    assert not _not_reported_elsewhere(record(probe))
    assert _not_reported_elsewhere(record("Worker is at 85% memory usage. Pausing worker."))


def test_a_run_without_a_cluster_imports_neither_distributed_nor_dask_dataframe(tmp_path):
    script = f"""
import sys
import daskpile
from daskpile.datasets import write_reference_dataset
write_reference_dataset({str(tmp_path / "in")!r}, rows=1000, files=2)
report = daskpile.shuffle_parquet({str(tmp_path / "in")!r}, {str(tmp_path / "out")!r}, piles=3, seed=1)
assert report.rows == 1000
print(sorted(m for m in ("distributed", "dask.dataframe") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("where", ["threads", "sync", "LocalCluster"])
def test_compute_reports_each_task_as_it_succeeds(request, where):
    if where == "LocalCluster":
        request.getfixturevalue("client")
    done = []
    tasks = [dask.delayed(abs)(-i, dask_key_name=f"abs-{i}") for i in range(5)]
    with dask.config.set(scheduler=where) if where != "LocalCluster" else contextlib.nullcontext():
        results = compute(tasks, on_done=done.append)
    assert results == [0, 1, 2, 3, 4]
    deadline = time.monotonic() + 10  # distributed calls back on a thread of its own
    while len(done) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(done) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("where", ["threads", "LocalCluster"])
def test_progress_in_a_log_is_a_line_now_and_then(request, where, capsys, monkeypatch):
    """Outside a terminal, a pass said one line when it ended: a job's log (kubectl logs) was silent for as
    long as a pass of 100 TB takes.  A bar is a terminal's or a notebook's; a log gets a line a minute."""
    from daskpile import _compute

    if where == "LocalCluster":
        request.getfixturevalue("client")
    monkeypatch.setattr(_compute, "PROGRESS_LINE_SECONDS", 0.2)
    done = []
    tasks = [dask.delayed(time.sleep)(0.15 * (i % 3), dask_key_name=f"sleep-{i}") for i in range(8)]
    with dask.config.set(scheduler=where) if where != "LocalCluster" else contextlib.nullcontext():
        compute(tasks, progress=True, on_done=done.append)
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(re.fullmatch(r"  \d of 8 tasks done, 0 min", line) for line in lines), lines
    deadline = time.monotonic() + 10  # (the caller's on_done is still called, once a task)
    while len(done) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(done) == list(range(8))
    compute(tasks, progress=False)
    assert capsys.readouterr().out == ""


def _report_slowly(report, units: int, seconds: float) -> int:
    for done in range(1, units + 1):
        time.sleep(seconds)
        report(done)
    return units


@pytest.mark.parametrize("where", ["threads", "LocalCluster"])
def test_progress_counts_the_piles_tasks_report_as_they_go(request, where, capsys, monkeypatch):
    """From an HPC user's trial: 1,000 piles in 8 tasks said "0 of 8 tasks done" for minutes.  Two tasks of 5
    piles, one every 0.3 s: the lines count piles before either task ends, from worker processes too."""
    from daskpile import _compute

    if where == "LocalCluster":
        request.getfixturevalue("client")
    monkeypatch.setattr(_compute, "PROGRESS_LINE_SECONDS", 0.2)
    units = _compute.Units.new("pile", [5, 5])
    tasks = [dask.delayed(_report_slowly)(units.report(i), 5, 0.3, dask_key_name=f"piles-{i}") for i in range(2)]
    with dask.config.set(scheduler=where) if where != "LocalCluster" else contextlib.nullcontext():
        assert compute(tasks, progress=True, units=units) == [5, 5]
    lines = capsys.readouterr().out.splitlines()
    counted = [int(re.fullmatch(r"  (\d+) of 10 piles done, 0 min", line).group(1)) for line in lines]
    assert counted == sorted(counted) and any(0 < n < 10 and n % 5 for n in counted), lines


@pytest.mark.slow
def test_after_a_ctrl_c_the_wait_for_running_tasks_is_said_and_lasts_until_they_end(client, capsys):
    """A pass-2 task writing to an object store ran for 30 s after a Ctrl-C with nothing said (a pod's grace
    period is 30 s).  Here a task sleeps 4 s; the wait says so once, on stderr, and ends when the task does.
    A wait of a second says nothing: the command's one line follows at once."""
    from daskpile._compute import _cancel_and_wait, _running_keys

    def running() -> bool:
        return any("daskpile-gather-slow" in keys for keys in client.run(_running_keys).values())

    said = {}
    for seconds in (1, 4):
        future = client.submit(time.sleep, seconds, key="daskpile-gather-slow", pure=False)
        while not running():
            time.sleep(0.01)
        started = time.monotonic()
        _cancel_and_wait(client, [future], {future.key}, interrupted=True)
        assert time.monotonic() - started > seconds / 2 and not running()  # it waited for the task
        said[seconds] = capsys.readouterr().err
    assert "daskpile" not in said[1]
    said = said[4]
    assert said == (
        "daskpile: interrupted: waiting up to 120 s for 1 task still running to finish their writes (Ctrl-C again "
        "stops without waiting)\n"
    )


def test_after_sigterm_the_wait_for_running_tasks_ends_before_the_kill_that_follows(client, monkeypatch):
    """SIGTERM is followed by SIGKILL 30 s later (Kubernetes' grace period, Slurm's KillWait): a wait of up to
    120 s for running tasks was cut by the kill, which left the dest's lease (a job resubmitted on another node
    was refused for two minutes).  After SIGTERM the wait is KILLED_SOON_WAIT_SECONDS (1 s here)."""
    import signal

    from daskpile import _compute
    from daskpile._interrupt import terminate_as_ctrl_c

    monkeypatch.setattr(_compute, "KILLED_SOON_WAIT_SECONDS", 1)
    with terminate_as_ctrl_c():
        with pytest.raises(KeyboardInterrupt):  # as the command's SIGTERM handler is reached
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        future = client.submit(time.sleep, 4, key="daskpile-gather-slow", pure=False)
        while not any("daskpile-gather-slow" in keys for keys in client.run(_compute._running_keys).values()):
            time.sleep(0.01)
        started = time.monotonic()
        _compute._cancel_and_wait(client, [future], {future.key}, interrupted=True)
        assert time.monotonic() - started < 2.5  # (waiting for the task, it would be 4 s)
    assert not _compute.KILLED_SOON.is_set()  # an API call after the command, in its process, waits as before


def _fails_soon_or_writes_late(k: int, directory: str) -> int:
    if k == 0:  # once the other task runs
        for _ in range(500):
            if os.path.exists(os.path.join(directory, "started")):
                break
            time.sleep(0.01)
        raise ValueError("bad input")
    open(os.path.join(directory, "started"), "w").close()
    time.sleep(2)
    with open(os.path.join(directory, str(k)), "w") as f:
        f.write("written")
    return k


def _first(result):
    return result


def test_a_failure_waits_for_the_running_tasks_its_results_are_made_of(tmp_path):
    """Pass 1's results are computed as tasks made of the scatter tasks (their counts summed apart): the wait
    after a failure looked at those results' tasks alone, which run after the scatter, and returned while
    scatter tasks still wrote (the caller then removes scratch: a running task's file outlived it)."""
    from distributed import Client, LocalCluster

    from daskpile._compute import task, task_of

    tasks = [task(_fails_soon_or_writes_late, k, str(tmp_path), key=f"daskpile-scatter-{k}-w") for k in range(2)]
    # (a cluster of its own: both tasks run at once, whatever the session's workers are busy with)
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0")
    with cluster, Client(cluster):
        with pytest.raises(ValueError, match="bad input"):
            compute(
                [task_of(_first, t, key=f"daskpile-scattered-{k}-w") for k, t in enumerate(tasks)],
                along=task_of(max, *tasks, key="daskpile-pile-totals-w"),
            )
        written = os.listdir(tmp_path)  # (as compute gave up: before the cluster closes)
    assert "1" in written


def test_compute_reports_no_failed_task(sync_scheduler):
    done = []
    fine = dask.delayed(abs)(-1, dask_key_name="fine")
    with pytest.raises(ZeroDivisionError):
        compute([fine, dask.delayed(divmod)(fine, 0)], on_done=done.append)  # runs after `fine`, and fails
    assert done == [0]


@pytest.mark.slow
def test_the_commands_cluster_keeps_its_workers_from_repeating_what_the_command_reports():
    """distributed's race: a worker's heartbeat in flight as the scheduler closes logs a 30-line traceback
    to the command's stderr, after its one-line error (seen in test_s3's secrets test on a loaded machine)."""
    script = """
import logging
from distributed import Client
from daskpile._compute import local_cluster, quiet_workers
if __name__ == "__main__":
    with local_cluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        quiet_workers(client)
        log = lambda message: logging.getLogger("distributed.worker").error(message)
        client.run(log, "Failed to communicate with scheduler during heartbeat.")
        client.run(log, "Compute Failed Key: daskpile-gather-0")
        client.run(log, "another worker error")
        client.restart()  # new worker processes, as after a crash
        client.run(log, "Compute Failed Key: daskpile-gather-1")
        client.run(log, "an error after the restart")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert "another worker error" in done.stderr and "an error after the restart" in done.stderr
    assert "heartbeat" not in done.stderr and "Compute Failed" not in done.stderr


def _die():
    os._exit(1)  # as the kernel's out-of-memory killer or Dask's nanny ends a worker


def test_workers_killed_running_a_task_are_said_as_what_daskpile_was_doing():
    """It printed distributed's "Attempted to run task 'daskpile-gather-000000-6bb4...' on 4 different workers,
    but all those workers died while running it", saying nothing of memory or what to change."""
    from distributed import Client, LocalCluster

    import daskpile

    once = dask.config.set({"distributed.scheduler.allowed-failures": 0})
    with once, LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        task = dask.delayed(_die)(dask_key_name="daskpile-scatter-000003-abc")
        with pytest.raises(daskpile.WorkerKilled) as killed:
            compute([task])
    said = str(killed.value)
    assert said.startswith("the workers running pass 1 (reading a piece of the input) died 1 time, most likely out")
    assert "--memory-limit" in said and "a smaller blocksize (--blocksize: another call" in said


def _die_in(frame):
    if 15 in frame["x"].to_numpy():  # the middle partition, one of those piles="auto" measures
        _die()
    return frame


@pytest.mark.slow
def test_workers_killed_measuring_a_partition_for_piles_auto_are_said_so():
    """shuffle(ddf, piles="auto") computes partitions to measure them: a worker killed there raised Dask's bare
    KilledWorker ("Attempted to run task ('_frame_size-...', ...)"), naming none of what to change.  The task
    killed is the partition's own or the measure fused with it, as Dask schedules them: said alike."""
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster

    import daskpile

    ddf = dd.from_pandas(pd.DataFrame({"x": range(30)}), npartitions=3)
    ddf = ddf.map_partitions(_die_in, meta=ddf._meta)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0")
    with cluster, Client(cluster), pytest.raises(daskpile.WorkerKilled) as killed:
        daskpile.shuffle(ddf, piles="auto")
    said = str(killed.value)
    assert said.startswith("the workers computing partitions 0, 1, 2 of 3 of the DataFrame, to measure them for piles=")
    assert "ddf.repartition(partition_size=" in said and "piles=N" in said


def _pause(dask_worker) -> None:
    from distributed.core import Status

    dask_worker.status = Status.paused  # as its memory monitor pauses it, above 80 % of its limit


def _statuses(dask_scheduler) -> list[str]:
    return [worker.status.name for worker in dask_scheduler.workers.values()]


@pytest.mark.parametrize("tasks", [1, 40])  # one waits unassigned (NoValidWorkerError); many, queued (NoWorkerError)
def test_tasks_waiting_while_every_worker_is_paused_fail_with_what_to_do(tasks):
    """A worker paused for memory it could not give back (trimming returns no fragmented heap) hung the run:
    nothing ran, nothing failed.  Here the pause is the worker's own state, its memory monitor off."""
    from distributed import Client, LocalCluster

    from daskpile._compute import NoWorkerRunning

    config = {"distributed.worker.memory.pause": False, "distributed.scheduler.no-workers-timeout": "1s"}
    with dask.config.set(config):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0")
    with cluster, Client(cluster) as client:
        client.run(_pause)
        # the worker tells the scheduler in a message of its own: a task sent before that lands waits on the
        # paused worker, not unassigned, and no timeout ends it (the suite hung once so, under load)
        deadline = time.monotonic() + 30
        while client.run_on_scheduler(_statuses) != ["paused"] and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(NoWorkerRunning) as stopped:
            compute([dask.delayed(abs)(-i, dask_key_name=f"daskpile-gather-{i:06d}-abc") for i in range(1, tasks + 1)])
        assert time.monotonic() - started < 30
    assert str(stopped.value).startswith(
        "no worker ran pass 2 (loading and writing a pile) for 1 s: every worker was paused, above the memory"
    )
    assert "--memory-limit" in str(stopped.value) and stopped.value.key.startswith("daskpile-gather-0000")
    assert type(stopped.value.__cause__).__name__ == ("NoValidWorkerError" if tasks == 1 else "NoWorkerError")


def _die_once(marker: str) -> int:
    if not os.path.exists(marker):
        open(marker, "w").close()
        _die()
    return 1


@pytest.mark.slow
def test_workers_that_died_in_a_compute_that_succeeded_are_counted(tmp_path):
    """A run whose worker ran out of memory, and whose task then ran again elsewhere, succeeded and said nothing:
    the user learnt of the memory only from a larger run that failed."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        compute([dask.delayed(_die_once)(str(tmp_path / "before"), dask_key_name="dies-before")])  # not counted
        died = []
        with counting_worker_deaths(died):
            # a run resumed with the same keys: the death of its first attempt, before, is not counted
            assert compute([dask.delayed(_die_once)(str(tmp_path / "before"), dask_key_name="dies-before")]) == [1]
            assert died == []
            tasks = [dask.delayed(_die_once)(str(tmp_path / "once"), dask_key_name="dies-once")]
            assert compute([*tasks, dask.delayed(abs)(-1, dask_key_name="fine")]) == [1, 1]
            # a task that a computed one depends on, as a pile's split feeds its parts
            inner = dask.delayed(_die_once)(str(tmp_path / "inner"), dask_key_name="dies-inside")
            assert compute([dask.delayed(abs)(inner, dask_key_name="outer")]) == [1]
        compute([dask.delayed(_die_once)(str(tmp_path / "after"), dask_key_name="dies-after")])  # not counted
    assert len(died) == 2 and all(address.startswith("tcp://") for address in died)


RETAINED_SCRIPT = """
import json, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from distributed import Client
import daskpile
from daskpile._compute import local_cluster

def rss():
    import psutil
    return psutil.Process().memory_info().rss

def give_back_always():
    import daskpile._compute
    daskpile._compute.GIVE_BACK_ABOVE = 0.0

if __name__ == "__main__":
    source, dest = sys.argv[1], sys.argv[2]
    n = 1_000_000
    table = pa.table({"id": np.arange(n), "s": pa.array(["x" * 100] * n)})  # 110 MiB in memory
    pq.write_table(table, source)
    small = source.replace(".parquet", "-small.parquet")
    pq.write_table(table.slice(0, 1000), small)
    with local_cluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        daskpile.shuffle_parquet(small, dest + "-small", piles=2, seed=1)  # the worker's imports
        client.run(give_back_always)  # (a worker gives back only above half its limit: 23 GiB here)
        (before,) = client.run(rss).values()
        daskpile.shuffle_parquet(source, dest, piles=2, seed=1)
        (after,) = client.run(rss).values()
    print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.slow
def test_a_worker_gives_back_the_memory_of_its_tasks(tmp_path):
    """Arrow's allocator and glibc kept a task's peak for reuse: an idle worker held it, Dask paused it at 80 % of
    its limit, and a paused worker took no task that could free it (a run on 3 GiB workers waited forever after
    pass 1).  Measured here, after a first small run (the modules a worker imports are no data): 161-201 MiB
    held after a run of 110 MiB, 2-3 MiB given back at the end of each task."""
    done = subprocess.run(
        [sys.executable, "-c", RETAINED_SCRIPT, str(tmp_path / "in.parquet"), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=180, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after"] - found["before"] < 80 * 2**20, found


def test_workers_killed_reading_a_large_column_chunk_are_told_of_its_pages(tmp_path):
    """A row group of 1,500 images, 955 MiB in one page of a column: every blocksize failed alike, and the
    message advised a smaller one.  It now names the row group and the column, and what to rewrite."""
    import types

    import pyarrow as pa
    import pyarrow.parquet as pq

    from daskpile.engine._pipeline import _Run
    from daskpile.sources import plan_sources

    images = [os.urandom(2**16) for _ in range(64)]  # 4 MiB, in one row group
    pq.write_table(pa.table({"id": range(64), "image": images}), tmp_path / "a.parquet")
    plan = plan_sources(str(tmp_path / "a.parquet"))

    def said(blocksize: int, key: str = "daskpile-scatter-0-abc") -> str:
        run = types.SimpleNamespace(plan=plan, partitions=plan.partitions(blocksize), blocksize=blocksize)
        return _Run._large_row_group_said(run, key)

    assert said(8 * 2**20) == ""  # the whole row group fits a piece: nothing to say of it
    hint = said(2**20)
    assert "Row group 0 of " in hint and "a.parquet' holds 4 MiB of column 'image' alone" in hint, hint
    assert "data_page_size and write_batch_size" in hint
    assert said(2**20, "daskpile-gather-000000-abc") == ""  # pass 2's: piles, not pages


@pytest.mark.slow
def test_rows_too_large_for_a_task_are_refused_by_the_task_about_to_read_them(tmp_path):
    """Giant rows in a file the estimate does not sample (the ninth) pass the check before pass 1.  They killed
    the worker that read them, four times, and the message advised a smaller blocksize, which cannot cut a row.
    The task now reads its row group's footer first and refuses them, naming the file and the memory needed."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from distributed import Client, LocalCluster

    import daskpile

    source = tmp_path / "src"
    source.mkdir()
    for k in range(8):
        pq.write_table(pa.table({"id": range(k * 100, k * 100 + 100), "blob": [b"x"] * 100}), source / f"{k}.parquet")
    blobs = pa.array([bytes(80 * 2**20)] * 2, pa.binary())  # zeros: a small file; 8 of a row fill 640 MiB
    giant = pa.table({"id": [800, 801], "blob": blobs})
    pq.write_table(giant, source / "8-giant.parquet", row_group_size=2, use_dictionary=False)  # as distinct values
    del blobs, giant
    once = dask.config.set({"distributed.scheduler.allowed-failures": 0})  # a death fails the run at once
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", dashboard_address=":0")
    with once, cluster, Client(cluster) as client:
        worker = client.run(os.getpid)
        with pytest.raises(ValueError) as refused:
            daskpile.shuffle_parquet(str(source), str(tmp_path / "out"), piles=2, scratch=str(tmp_path / "s"))
        assert client.run(os.getpid) == worker  # no worker died
    said = str(refused.value)
    assert said.startswith("row group 0 of '") and "8-giant.parquet' holds 2 rows of about 80 MiB each" in said
    assert "than the 512 MiB it has (a worker's memory limit over its threads): give each worker thread at " in said
    assert "least 0.9 GiB" in said
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path / "s") == []  # nothing written, scratch removed


@pytest.mark.slow
def test_workers_killed_loading_a_pile_are_told_which_and_how_large(tmp_path):
    """Pass 1 reads 1 MiB rows in pieces of 16 MiB; pass 2 holds all of them in one pile, too many for the worker.
    Pass 1 measured the pile and its largest row: the message says them, beside its advice."""
    import types

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from distributed import Client, LocalCluster

    import daskpile
    from daskpile.engine._passes import PileTotals
    from daskpile.engine._pipeline import _Run

    source = tmp_path / "src"
    source.mkdir()
    for k in range(16):
        blobs = pa.array([bytes(2**20)] * 10, pa.binary())
        pq.write_table(pa.table({"id": range(k * 10, k * 10 + 10), "blob": blobs}), source / f"{k}.parquet")
    once = dask.config.set({"distributed.scheduler.allowed-failures": 0})
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="400MiB", dashboard_address=":0")
    with once, cluster, Client(cluster), pytest.raises(daskpile.WorkerKilled) as killed:
        daskpile.shuffle_parquet(
            str(source), str(tmp_path / "out"), piles=1, seed=1, scratch=str(tmp_path / "s"), blocksize="16MiB"
        )
    said = str(killed.value)
    assert said.startswith("the workers running pass 2 (loading and writing a pile) died 1 time"), said
    assert said.endswith(". The task held pile 0: 160 rows, 160 MiB in memory, its largest row 1.0 MiB"), said
    assert killed.value.piles == (0,), killed.value.key

    # a row no task holds: no pile count helps, only memory (the figures are pass 1's, as a killed task's)
    counts = np.array([10, 12, 30])
    totals = PileTotals(counts, np.array([9, 300, 50]) * 2**20, np.array([1, 60, 2]) * 2**20)
    run = types.SimpleNamespace(counts=counts, totals=totals, task_memory=256 * 2**20)
    said = _Run._large_pile_said(run, (0, 1, 2), [])
    assert said == (
        ". The task held piles 0 to 2, the largest pile 1: 12 rows, 300 MiB in memory, its largest row 60.0 MiB; "
        "a task holds a row up to 8 times over, more than the 256 MiB it has: give each worker thread at least 0.7 "
        "GiB, which no pile count or memory_per_pile can spare it"
    )


def test_a_large_plan_sent_to_a_cluster_gives_no_advice_to_load_data_with_dask(client, tmp_path):
    """A plan of 50,000 files is a graph of 30 MiB: distributed warned in every run ("Consider loading the data
    with Dask directly"), advice for graphs that embed data."""
    import warnings

    import daskpile
    from daskpile.datasets import write_reference_dataset

    write_reference_dataset(tmp_path / "src", rows=4_000, files=4)
    with (
        warnings.catch_warnings(record=True) as said,
        dask.config.set({"distributed.admin.large-graph-warning-threshold": "1kB"}),
    ):
        warnings.simplefilter("always")
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, seed=0)
    assert not [w for w in said if "large graph" in str(w.message)], [str(w.message) for w in said]


def test_ctrl_c_stops_the_running_tasks_of_its_threaded_run_and_of_no_later_run():
    """Ctrl-C stops a threaded run's tasks at their next write (``stop_after_ctrl_c``); a flag of the whole process
    stopped the next run too, on the sync scheduler or in a notebook's next cell."""
    import signal
    import threading

    from daskpile._compute import _RUN, StoppedByCtrlC, stop_after_ctrl_c, task

    started, stopped, caught = threading.Event(), threading.Event(), threading.Event()
    runs = []  # the run's own Ctrl-C flag, as its task sees it

    def writing():
        runs.append(_RUN.ctrl_c)
        started.set()
        for _ in range(2_000):
            try:
                stop_after_ctrl_c()
            except StoppedByCtrlC:
                stopped.set()
                raise
            time.sleep(0.005)

    def ctrl_c():
        # Pressed again until the run has seen it: a signal that lands just before the main thread blocks on
        # its queue is handled only when the queue next wakes it (CPython's lock waits), here 10 s later
        started.wait(30)
        for _ in range(10):
            if runs[0].is_set() or caught.is_set():
                return
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            runs[0].wait(1)

    threading.Thread(target=ctrl_c, daemon=True).start()
    with dask.config.set(scheduler="threads"), pytest.raises(KeyboardInterrupt):
        compute([task(writing, key="writing")])
    caught.set()
    assert stopped.wait(5)  # (it would have written for 10 s)
    for scheduler in ("sync", "threads"):
        with dask.config.set(scheduler=scheduler):
            assert compute([task(stop_after_ctrl_c, key=f"later-{scheduler}")]) == [None]


def test_a_slow_step_is_said_while_it_runs_and_a_quick_one_not(capsys):
    """Planning said nothing until it ended: 18 s for 50,000 small files, two minutes for a store out of reach."""
    from daskpile._compute import said_while_slow

    with said_while_slow("still planning", progress=True, first=0.05):
        pass
    with said_while_slow("still planning", progress=False, first=0.01):
        time.sleep(0.1)
    assert capsys.readouterr().out == ""
    with said_while_slow("still planning", progress=True, first=0.05):
        time.sleep(0.3)
    assert capsys.readouterr().out == "  still planning, 0 s\n"  # once, then every PROGRESS_LINE_SECONDS


def test_the_command_says_its_planning_when_it_is_slow(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from _util import daskpile_in_process

    from daskpile import _compute

    pq.write_table(pa.table({"x": range(100)}), tmp_path / "a.parquet")
    monkeypatch.setattr(_compute, "SLOW_STEP_SECONDS", 0.0)  # every planning slow
    said = f"  still planning: listing and opening '{tmp_path / 'a.parquet'}', 0 s\n"
    shuffled = daskpile_in_process("shuffle", str(tmp_path / "a.parquet"), str(tmp_path / "out"), "--piles", "2",
                                   "--scheduler", "sync")  # fmt: skip
    assert shuffled.returncode == 0 and shuffled.stdout.startswith(said), shuffled.stdout
    verified = daskpile_in_process("verify", str(tmp_path / "a.parquet"), str(tmp_path / "out"))
    assert verified.returncode == 0 and said in verified.stdout, verified.stdout
