"""daskpile on a real cluster whose workers share no disk: each worker has a private /tmp (tests/_cluster.py).

Without ``scratch``, daskpile's scratch is the client's temporary directory,
which such workers cannot see: the shuffle must refuse before pass 1, and say
to pass ``scratch="s3://..."``.  With scratch on an S3-compatible server every
worker reaches, it works, survives a worker killed mid-run, and leaves nothing
behind.
"""

# ruff: noqa: F811 (test arguments named after the fixtures imported from _cluster)

import gc
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _cluster import (  # noqa: F401 (fixtures)
    isolated_client,
    isolated_cluster,
    s3_server,
    slow_partition,
    touch_partition,
    touched,
    wait_until,
)
from _util import DASKPILE, daskpile_command
from distributed import Client

import daskpile
from daskpile.datasets import write_reference_dataset

# A guard against a hang if the workers die, not a speed limit: the runs take 5-15 s here, and a VM whose
# host was busy once took over 60 s for one (the whole suite 29 min against 8.5)
RESULT_SECONDS = 300
SCRATCH_ADVICE = r"(?s)^(?=.*scratch)(?=.*s3://)"  # the message names the scratch argument and an s3:// URL


def frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"x": np.arange(n), "s": [f"row-{i:06d}" for i in range(n)]})


@pytest.mark.slow
def test_workers_do_not_share_tmp(isolated_cluster, isolated_client):
    client = isolated_client
    pids = client.run(os.getpid)
    assert pids == isolated_cluster.worker_pids() and len(pids) == 2
    # Each worker is in a mount namespace of its own, with a tmpfs on /tmp where all its temporary files go.
    namespaces = client.run(os.readlink, "/proc/self/ns/mnt")
    assert len(set(namespaces.values())) == 2 and os.readlink("/proc/self/ns/mnt") not in namespaces.values()
    assert set(client.run(tempfile.gettempdir).values()) == {"/tmp"}
    assert set(client.run(lambda: dask.config.get("temporary-directory")).values()) == {"/tmp"}
    local_dirs = client.run(lambda dask_worker: dask_worker.local_directory)
    assert all(d.startswith("/tmp/") for d in local_dirs.values()), local_dirs

    # A file of this process's /tmp: no worker sees it.
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="daskpile-isolation-") as f:
        assert os.path.exists(f.name)
        assert client.run(os.path.exists, f.name) == dict.fromkeys(pids, False)

    # A file one worker writes in its /tmp: the other worker (and this process) does not see it.
    first, second = sorted(pids)
    path = f"/tmp/daskpile-isolation-{uuid.uuid4().hex}"
    client.run(Path(path).touch, workers=[first])
    assert client.run(os.path.exists, path) == {first: True, second: False}
    assert not os.path.exists(path)
    client.run(os.remove, path, workers=[first])


def test_shuffle_without_scratch_refuses_before_running(isolated_client, monkeypatch):
    client = isolated_client
    # daskpile's default scratch is this process's temporary directory: make sure it is under /tmp, the one
    # directory the workers do not share (TMPDIR may point elsewhere, which the workers would see).
    host_tmp = tempfile.mkdtemp(dir="/tmp", prefix="daskpile-client-tmp-")
    monkeypatch.setattr(tempfile, "tempdir", host_tmp)
    tag = uuid.uuid4().hex
    ddf = dd.from_pandas(frame(4000), npartitions=4).map_partitions(touch_partition, tag)  # notes each read

    try:
        with pytest.raises(ValueError, match=SCRATCH_ADVICE):
            daskpile.shuffle(ddf, piles=8, seed=1).compute()
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)
    # Before pass 1: no worker computed a single input partition.
    read = client.run(touched, tag)
    assert sum(read.values()) == 0, f"the refusal came after pass 1 had read input partitions: {read}"


@pytest.mark.slow  # 5 to 7 s: the scheduler and workers import s3fs and daskpile's modules on first use
def test_shuffle_with_scratch_on_s3_succeeds(isolated_client, s3_server):
    fs, options = s3_server
    n = 4000
    ddf = dd.from_pandas(frame(n), npartitions=4)
    expected = ddf.compute()  # the input as Dask gives it (strings as Arrow strings)

    shuffled = daskpile.shuffle(ddf, piles=8, seed=1, scratch="s3://scratch/tmp", storage_options=options)
    result = isolated_client.compute(shuffled).result(timeout=RESULT_SECONDS)  # .compute(), no hang if workers die
    assert len(result) == n
    assert not result["x"].is_monotonic_increasing  # shuffled, not passed through
    pd.testing.assert_frame_equal(result.sort_values("x"), expected)
    fs.invalidate_cache()
    assert fs.find("scratch/tmp"), "pass 1 wrote no scratch on S3"

    del shuffled, result
    gc.collect()

    def scratch_gone():
        fs.invalidate_cache()
        return fs.find("scratch/tmp") == []

    wait_until(scratch_gone, timeout=10, interval=0.2, what="scratch removed from s3://scratch/tmp")


@pytest.mark.slow
def test_worker_killed_mid_run_same_output(isolated_cluster, s3_server):
    """SIGKILL a worker while pass 1 runs: the compute completes, in the order of an undisturbed run.

    The module's cluster: the worker killed is replaced, as the tests after this one expect two.
    """
    _, options = s3_server
    n, partitions, piles, seed, delay = 20_000, 8, 4, 7, 0.5
    tag = uuid.uuid4().hex
    ddf = dd.from_pandas(frame(n), npartitions=partitions).map_partitions(slow_partition, delay, tag)

    def shuffle(scratch):
        return daskpile.shuffle(ddf, piles=piles, seed=seed, scratch=scratch, storage_options=options)

    cluster = isolated_cluster
    cluster.check(workers=2)
    with Client(cluster.address, timeout=30) as client:

        def partitions_read():
            return sum(client.run(touched, tag).values())

        undisturbed = shuffle("s3://scratch/reference")
        reference = client.compute(undisturbed).result(timeout=RESULT_SECONDS)
        del undisturbed
        assert len(reference) == n
        before = partitions_read()
        assert before >= partitions

        shuffled = shuffle("s3://scratch/killed")  # held until the result is in: its scratch goes with it
        future = client.compute(shuffled)

        def busy_worker():
            # Pass 1 under way: a few input partitions read, a worker in the middle of another task.
            if partitions_read() - before < 3:
                return None
            return next((w for w, keys in client.processing().items() if keys), None)

        victim = wait_until(busy_worker, timeout=20, what="pass 1 under way")
        assert not future.done(), "the run finished before a worker could be killed"
        cluster.kill_worker(cluster.worker_at(victim))
        replacement = cluster.add_worker()  # a new machine: empty /tmp, nothing of the run

        result = future.result(timeout=RESULT_SECONDS)
        workers = client.scheduler_info()["workers"]
        assert victim not in workers and replacement.address in workers

    pd.testing.assert_frame_equal(result, reference)  # the same rows in the same order, index included
    pd.testing.assert_frame_equal(result.sort_values("x"), dd.from_pandas(frame(n), npartitions=partitions).compute())


# -- the command line, as a Kubernetes job runs it ------------------------------------------------------


def storage_args(options: dict) -> list[str]:
    client = options["client_kwargs"]
    return [
        f"--storage-option=key={options['key']}",
        f"--storage-option=secret={options['secret']}",
        f"--storage-option=client_kwargs.endpoint_url={client['endpoint_url']}",
        f"--storage-option=client_kwargs.region_name={client['region_name']}",
    ]


def s3_source(fs, options, name: str, rows: int, files: int) -> str:
    if not fs.exists("lake"):
        fs.mkdir("lake")
    url = f"s3://lake/{name}"
    if not fs.exists(f"lake/{name}"):
        write_reference_dataset(url, rows=rows, files=files, storage_options=options)
    return url


def read_result(fs, dest: str) -> pa.Table:
    manifest = json.loads(fs.cat_file(f"{dest}/_daskpile.json"))
    return pa.concat_tables(pq.read_table(f"{dest}/{name}", filesystem=fs) for name in manifest["files"])


@pytest.mark.slow
def test_the_command_refuses_local_scratch_then_runs_on_s3(isolated_cluster, s3_server):
    fs, options = s3_server
    source = s3_source(fs, options, "isolated-cli-src", rows=40_000, files=8)
    run = [
        "shuffle",
        source,
        "s3://lake/isolated-cli-out",
        "--piles=4",
        "--seed=1",
        f"--scheduler={isolated_cluster.address}",
    ]

    refused = daskpile_command(*run, *storage_args(options))  # scratch: this process's temporary directory
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("daskpile: error: scratch ") and "2 of the cluster's 2 workers cannot see" in (
        refused.stderr
    )
    assert "--scratch" in refused.stderr and len(refused.stderr.splitlines()) == 1
    fs.invalidate_cache()
    assert not fs.exists("lake/isolated-cli-out") and not fs.find("scratch/isolated-cli")

    done = daskpile_command(*run, "--scratch=s3://scratch/isolated-cli", *storage_args(options))
    assert done.returncode == 0, done.stderr
    assert "verified" in done.stdout
    fs.invalidate_cache()
    assert fs.find("scratch/isolated-cli") == [], "scratch objects left behind"
    address = f"--scheduler={isolated_cluster.address}"
    verified = daskpile_command("verify", source, "s3://lake/isolated-cli-out", address, *storage_args(options))
    assert verified.returncode == 0 and "match" in verified.stdout, verified.stderr


@pytest.mark.slow
def test_a_local_source_the_workers_cannot_see_is_refused_before_pass_1(isolated_cluster, s3_server, tmp_path):
    """Each task said "Failed to open local file ... No such file or directory", of a file this machine has."""
    from daskpile.datasets import write_reference_dataset

    fs, options = s3_server
    write_reference_dataset(tmp_path / "local-src", rows=1_000, files=2)
    refused = daskpile_command(
        "shuffle", str(tmp_path / "local-src"), "s3://scratch/local-src-out", "--piles=2", "--scratch=s3://scratch/ls",
        f"--scheduler={isolated_cluster.address}", *storage_args(options),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"daskpile: error: source '{tmp_path / 'local-src'}") and (
        "2 of the cluster's 2 workers cannot see" in refused.stderr
    ), refused.stderr
    fs.invalidate_cache()
    assert not fs.exists("scratch/local-src-out")


@pytest.mark.slow
def test_the_command_survives_a_worker_killed_mid_run(isolated_cluster, s3_server):
    fs, options = s3_server
    source = s3_source(fs, options, "kill-src", rows=400_000, files=24)
    cluster = isolated_cluster
    cluster.check(workers=2)

    def run(dest: str, scratch: str) -> list[str]:
        return [DASKPILE, "shuffle", source, dest, "--piles=6", "--seed=3", f"--scratch={scratch}",
                f"--scheduler={cluster.address}", "-q", *storage_args(options)]  # fmt: skip

    reference = subprocess.run(run("s3://lake/kill-ref", "s3://scratch/kill-ref"), capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr

    process = subprocess.Popen(run("s3://lake/kill-out", "s3://scratch/kill"), stderr=subprocess.PIPE, text=True)

    def scattering():
        fs.invalidate_cache()
        return len(fs.find("scratch/kill")) >= 6

    wait_until(scattering, timeout=60, interval=0.05, what="pass 1 under way")
    assert process.poll() is None, "the run ended before a worker could be killed"
    cluster.kill_worker(cluster.alive_workers()[0])
    cluster.add_worker()  # a new machine: empty /tmp, nothing of the run
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr

    assert read_result(fs, "lake/kill-out").equals(read_result(fs, "lake/kill-ref"))
    fs.invalidate_cache()
    assert fs.find("scratch/kill") == []
