"""kill -9 a worker process in the middle of each pass: the run completes, byte-identical."""

import os
import signal
import threading
import time

import pytest
from _util import count_files, file_bytes, finished_partitions, sorted_source, uninterrupted_run
from distributed import Client, LocalCluster

import daskpile

FILES, ROWS, PILES, SEED = 60, 300_000, 48, 11
# Small files are read together up to blocksize / 16 on disk: this blocksize keeps one task (and one
# scratch file per band) per file, so that a kill or an interruption can land between partitions.
BLOCKSIZE = 64 * 2**10


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return sorted_source(tmp_path_factory.mktemp("failures") / "src", ROWS, FILES)


@pytest.fixture(scope="module")
def uninterrupted(source, tmp_path_factory):
    return uninterrupted_run(
        source, tmp_path_factory.mktemp("failures") / "reference", PILES, SEED, blocksize=BLOCKSIZE
    )


def run_killing_a_worker(ready, still_running, progress, run):
    """``run()`` on a fresh LocalCluster, one worker kill -9ed once ``ready()``, if ``still_running()``.

    Returns the ``progress()`` seen at the kill and what ``run`` returned.
    """
    killed = []
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        victim = next(iter(client.run(os.getpid).values()))

        def killer():
            deadline = time.monotonic() + 60
            while not ready() and time.monotonic() < deadline:
                time.sleep(0.002)
            if still_running():
                os.kill(victim, signal.SIGKILL)
                killed.append(progress())

        thread = threading.Thread(target=killer)
        thread.start()
        result = run()
        thread.join()
        assert victim not in client.run(os.getpid).values()  # the worker really died and was replaced
    assert killed, "the run finished before the worker could be killed"
    return killed, result


@pytest.mark.slow
@pytest.mark.parametrize("during", ["pass 1", "pass 2"])
def test_a_killed_worker_changes_nothing(source, uninterrupted, tmp_path, during):
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    ready = {
        "pass 1": lambda: finished_partitions(scratch) >= 15,
        "pass 2": lambda: count_files(dest, "part-") >= 8,
    }[during]
    killed, report = run_killing_a_worker(
        ready,
        still_running=lambda: not (dest / "_daskpile.json").exists(),
        progress=lambda: (finished_partitions(scratch), count_files(dest, "part-")),
        run=lambda: daskpile.shuffle_parquet(
            source, str(dest), piles=PILES, seed=SEED, scratch=str(scratch), blocksize=BLOCKSIZE
        ),
    )
    scattered, gathered = killed[0]
    assert scattered < FILES if during == "pass 1" else gathered < PILES
    assert report.rows == ROWS and report.fingerprint.rows == ROWS
    assert file_bytes(dest) == uninterrupted
    # said, though the run succeeded: workers that die are what makes a larger run fail
    assert report.worker_deaths == 1
    assert "; 1 worker died running its tasks, which ran again (out of memory" in str(report)
    # the tasks that ran again found their files written: reused, but the run did not resume one interrupted
    assert report.resumed_partitions == report.resumed_piles == 0 and "resumed" not in str(report)


def _shuffle_dataframe_to_parquet(source, dest, scratch):
    import dask.dataframe as dd

    daskpile.shuffle(dd.read_parquet(source), piles=PILES, seed=SEED, scratch=str(scratch)).to_parquet(str(dest))


def _read_in_order(dest):
    import dask.dataframe as dd

    return dd.read_parquet(str(dest)).compute(scheduler="sync")


@pytest.fixture(scope="module")
def uninterrupted_dataframe(source, tmp_path_factory):
    import dask

    directory = tmp_path_factory.mktemp("failures-dataframe")
    with dask.config.set(scheduler="sync"):
        _shuffle_dataframe_to_parquet(source, directory / "out", directory)
    return _read_in_order(directory / "out")


@pytest.mark.slow
@pytest.mark.parametrize("during", ["pass 1", "pass 2"])
def test_a_killed_worker_changes_nothing_in_a_shuffled_dataframe(source, uninterrupted_dataframe, tmp_path, during):
    """``shuffle(ddf).to_parquet(...)`` with a worker kill -9ed mid-pass: the same rows in the same order."""
    import pandas as pd

    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    # (a pile is written under a hidden temporary name; the write's last task gives every pile its name)
    ready = {
        "pass 1": lambda: count_files(scratch, "scatter-") >= 15,
        "pass 2": lambda: count_files(dest, ".part") >= 8,
    }[during]
    progress = lambda: (count_files(scratch, "scatter-"), count_files(dest, ".part"))  # noqa: E731
    run_killing_a_worker(
        ready,
        still_running=lambda: progress()[0] < FILES if during == "pass 1" else progress()[1] < PILES,
        progress=progress,
        run=lambda: _shuffle_dataframe_to_parquet(source, dest, scratch),
    )
    pd.testing.assert_frame_equal(_read_in_order(dest), uninterrupted_dataframe)


@pytest.mark.slow
def test_a_worker_killed_in_an_append_is_said_in_its_report(source, tmp_path):
    """A day appended to a moving window while one of its workers dies: the report says so, as a shuffle's does."""
    dest, scratch = tmp_path / "window", tmp_path / "scratch"
    scratch.mkdir()
    first_day = sorted_source(tmp_path / "day-0", 20_000, 2)

    def run():
        daskpile.shuffle_parquet(first_day, str(dest), piles=PILES, seed=SEED)
        return daskpile.append(str(dest), source, scratch=str(scratch), blocksize=BLOCKSIZE)

    _, report = run_killing_a_worker(
        ready=lambda: finished_partitions(scratch) >= 15,
        still_running=lambda: finished_partitions(scratch) < FILES,
        progress=lambda: finished_partitions(scratch),
        run=run,
    )
    assert report.changed and report.rows == ROWS + 20_000
    assert report.shuffle.worker_deaths == 1
    said = "; 1 worker died running its tasks, which ran again (out of memory, or its machine or pod gone: the"
    assert said in str(report)


@pytest.mark.slow
def test_a_scheduler_lost_mid_run_is_one_line(tmp_path):
    """The scheduler's pod restarted in pass 2: the client logged a 35-line traceback a reconnection attempt,
    then the command named an internal task ("daskpile-gather-... cancelled for reason:
    scheduler-connection-lost.")."""
    import subprocess

    from _cluster import moto_s3, open_isolated_cluster
    from _util import DASKPILE

    from daskpile.datasets import write_reference_dataset

    with moto_s3(buckets=("scratch", "lake")) as (_, options), open_isolated_cluster(2, log_dir=tmp_path) as cluster:
        write_reference_dataset("s3://lake/src", rows=400_000, files=8, storage_options=options)
        store = [f"--storage-option=key={options['key']}", f"--storage-option=secret={options['secret']}",
                 f"--storage-option=client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}",
                 "--storage-option=client_kwargs.region_name=eu-west-1"]  # fmt: skip
        command = [DASKPILE, "shuffle", "s3://lake/src", "s3://lake/out", "--piles", "8", "--seed", "7",
                   "--output-format", "jsonl", "--scratch", "s3://scratch/lost", "--scheduler", cluster.address,
                   *store]  # fmt: skip
        env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}  # (the client's reconnection)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        while not process.stdout.readline().startswith("pass 1:"):
            assert process.poll() is None, process.communicate()
        cluster.scheduler.process.kill()
        _, stderr = process.communicate(timeout=120)
    assert process.returncode == 75, stderr  # EX_TEMPFAIL: run again once the scheduler is back, it resumes
    assert stderr.startswith(f"daskpile: error: lost the scheduler at {cluster.address}: the connection to it closed")
    assert "did not come back; run the same command again once it is up" in stderr, stderr
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr, stderr
