"""Source, destination and scratch on object storage, against a real S3-compatible
server (moto's, over HTTP on 127.0.0.1) that the workers reach as a cluster would."""

import collections
import concurrent.futures
import dataclasses
import functools
import gc
import json
import os
import re
import socket
import threading
import time
import traceback

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _cluster import moto_s3_process
from _util import daskpile_command, eventually, interrupted_after, read_store_output
from click.testing import CliRunner

import daskpile
from daskpile import _kernels, _random, _storage
from daskpile.cli import cli
from daskpile.datasets import write_reference_dataset
from daskpile.engine import _lease, _outputs, _scratch

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"},
    }
    fs = s3fs.S3FileSystem(**options)
    for bucket in ["lake", "scratch"]:
        if not fs.exists(bucket):  # moto's state is the process's: another module's server made it
            fs.mkdir(bucket)
    yield fs, options
    server.stop()


@pytest.mark.slow
def test_shuffle_parquet_on_s3(client, s3):
    fs, options = s3
    write_reference_dataset("s3://lake/sorted", rows=20_000, files=4, storage_options=options)
    report = daskpile.shuffle_parquet(
        "s3://lake/sorted", "s3://lake/shuffled", piles=6, seed=3, scratch="s3://scratch/tmp", storage_options=options
    )
    assert report.files[0] == "s3://lake/shuffled/part-00000.parquet" and report.rows == 20_000
    out = read_store_output(fs, "lake/shuffled")
    assert np.array_equal(np.sort(out["id"].to_numpy()), np.arange(20_000))
    assert daskpile.read_manifest("s3://lake/shuffled", storage_options=options)["rows"] == 20_000
    fs.invalidate_cache()
    assert report.output_bytes == sum(fs.size(f) for f in fs.glob("lake/shuffled/part-*.parquet"))
    assert fs.find("scratch/tmp") == []  # scratch removed


_CALLS: list[tuple[str, str | None]] = []  # (method, key) of each request s3fs made in this process


def _count_s3_calls(on: bool) -> list[tuple[str, str | None]]:
    """In a worker (``client.run``): from now on count the requests s3fs makes (``on``), or stop, giving them."""
    call_s3 = getattr(s3fs.S3FileSystem._call_s3, "uncounted", s3fs.S3FileSystem._call_s3)

    async def counting(self, method, *args, **kwargs):
        _CALLS.append((method, kwargs.get("Key")))
        return await call_s3(self, method, *args, **kwargs)

    counting.uncounted = call_s3
    s3fs.S3FileSystem._call_s3 = counting if on else call_s3
    calls = list(_CALLS)
    _CALLS.clear()
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("format", ["parquet", "jsonl"])
def test_pass_1_reads_each_source_object_without_looking_it_up_again(client, s3, format):
    """The listing gave every object's size and ETag: s3fs' HEAD before the first GET of each file a worker
    opened was half of pass 1's requests over a lake of small files (2,000 objects of 1 KB on moto: 2,000 HEADs
    beside 2,002 GETs; 20.9 s against 1.4 s locally).  Reads require the listed ETag instead (If-Match)."""
    fs, options = s3
    for i in range(6):
        table = pa.table({"id": np.arange(i * 100, (i + 1) * 100)})
        if format == "parquet":
            with fs.open(f"lake/no-head-{format}/f{i}.parquet", "wb") as f:
                pq.write_table(table, f)
        else:
            fs.pipe(
                f"lake/no-head-{format}/f{i}.jsonl",
                "".join(f'{{"id": {k}}}\n' for k in table["id"].to_pylist()).encode(),
            )
    client.run(_count_s3_calls, True)
    try:
        report = daskpile.shuffle_parquet(
            f"s3://lake/no-head-{format}", f"s3://lake/no-head-{format}-out", piles=2, seed=1, storage_options=options
        )
    finally:
        calls = [c for worker in client.run(_count_s3_calls, False).values() for c in worker]
    assert report.rows == 600
    source = [(method, key) for method, key in calls if key and key.startswith(f"no-head-{format}/")]
    assert [c for c in source if c[0] == "get_object"] and not [c for c in source if c[0] == "head_object"], source


@pytest.mark.slow
def test_a_pass_2_task_reads_a_small_scratch_file_on_a_store_in_one_request(client, s3):
    """Each pass-2 task opens every scratch file of its band: s3fs looked each up (a HEAD) and Arrow read its
    footer in two requests, before the pile's own: 4 requests a file and task, 1,203 HEADs and 3,600 GETs
    for 300 pass-1 tasks in 4 piles on moto (pass 2 20 s, 8 s with one).  A task now lists the run's files
    once, and fetches a file's end (its footer, a small file whole) as it opens it."""
    _, options = s3
    write_reference_dataset("s3://lake/one-get-in", rows=4_000, files=8, storage_options=options)
    client.run(_count_s3_calls, True)
    try:
        report = daskpile.shuffle_parquet(
            "s3://lake/one-get-in", "s3://lake/one-get", piles=4, seed=1, scratch="s3://scratch/one-get",
            storage_options=options, blocksize="16 KiB",
        )  # fmt: skip
    finally:
        calls = [c for worker in client.run(_count_s3_calls, False).values() for c in worker]
    assert report.rows == 4_000
    scratch = [(method, key) for method, key in calls if key and key.endswith(".arrow")]
    gets = collections.Counter(key for method, key in scratch if method == "get_object")
    assert len(gets) >= 8 and max(gets.values()) <= 4, gets  # a request a task (4 piles: 4 tasks at most)
    assert not [c for c in scratch if c[0] == "head_object"], scratch


def test_an_object_written_again_since_it_was_listed_is_refused_by_its_reads(s3):
    """``open_read`` of a listed version: without a HEAD of its own, the reads require the listed ETag."""
    from s3fs.utils import FileExpired

    fs, options = s3
    fs.pipe("lake/listed-once/a.jsonl", b'{"id": 1}\n')
    listed = _storage.FileVersion.of(fs.info("lake/listed-once/a.jsonl"))
    assert listed.etag and listed.size == 10
    fs.pipe("lake/listed-once/a.jsonl", b'{"id": 2}\n')  # the same size
    worker = s3fs.S3FileSystem(skip_instance_cache=True, **options)  # a worker's, no listing cached
    with _storage.open_read(worker, "lake/listed-once/a.jsonl", listed) as f, pytest.raises(FileExpired):
        f.read()
    with _storage.open_read(
        worker, "lake/listed-once/a.jsonl", _storage.FileVersion.of(fs.info("lake/listed-once/a.jsonl"))
    ) as f:
        assert f.read() == b'{"id": 2}\n'
    # A store that refuses If-Match (s3fs' local_expiry_check, for VAST): none sent, s3fs compares the ETag itself
    local = s3fs.S3FileSystem(skip_instance_cache=True, local_expiry_check=True, **options)
    with _storage.open_read(local, "lake/listed-once/a.jsonl", listed) as f, pytest.raises(FileExpired):
        assert "IfMatch" not in f.read_kw
        f.read()


@pytest.mark.slow
def test_a_range_of_a_text_object_is_fetched_with_the_line_past_its_end_only(s3, monkeypatch):
    """fsspec's read-ahead (s3fs' blocks of 50 MiB) fetched a range's object to its end: 19 MB for a range of
    1 MB of a 20 MB object, a range task's bytes many times over."""
    from daskpile.sources.text.blocks import LINE_SCAN_BYTES, read_lines_range

    fs, options = s3
    fs.pipe("lake/ranges/a.txt", b"".join(b"%09d\n" % i for i in range(2_000_000)))  # 20 MB
    ranges = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        ranges.extend([kwargs["Range"]] if method == "get_object" else [])
        return await call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    worker = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    listed = _storage.FileVersion.of(fs.info("lake/ranges/a.txt"))
    begin, lines = read_lines_range(worker, "lake/ranges/a.txt", 1_000_000, 2_000_000, listed)
    assert (begin, len(lines), lines[:10]) == (
        1_000_010,
        1_000_000,
        b"000100001\n",
    )  # (the line at its start: the range before's)
    assert ranges == [f"bytes=1000000-{2_000_000 + LINE_SCAN_BYTES - 1}"]


@pytest.mark.slow
def test_pass_2_reads_remote_scratch_in_runs_of_piles(sync_scheduler, s3, monkeypatch):
    """Fewer GETs than one per file and pile: a batch of piles is read once per task, not once per pile."""
    _, options = s3
    write_reference_dataset("s3://lake/runs-in", rows=80_000, files=4, storage_options=options)  # 1 MB a file
    gets = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counting_call_s3(self, method, *args, **kwargs):
        gets.extend([kwargs.get("Key")] if method == "get_object" else [])
        return await call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting_call_s3)
    source, dest, scratch = "s3://lake/runs-in", "s3://lake/runs-out", "s3://scratch/runs"
    report = daskpile.shuffle_parquet(source, dest, piles=64, seed=1, scratch=scratch, storage_options=options)
    assert report.rows == 80_000
    scratch_gets = [key for key in gets if key and key.endswith(".arrow")]
    assert 0 < len(scratch_gets) < 4 * 64 / 2


@pytest.mark.slow
def test_pass_2_reads_the_scratch_files_of_a_pile_on_a_store_at_once(sync_scheduler, s3, monkeypatch, tmp_path):
    """A pile is a slice of every pass-1 task's file: on an object store, each costs requests of tens of
    milliseconds, so a pass-2 task reads REMOTE_FILES_AT_ONCE of them at once (one at a time, a corpus of 543
    pass-1 tasks took 52-82 s in pass 2 against 4 s locally).  Local files are still read one by one."""
    _, options = s3
    write_reference_dataset("s3://lake/at-once-in", rows=40_000, files=12, storage_options=options)
    lock, now, most = threading.Lock(), collections.Counter(), collections.Counter()
    read = _scratch.ScratchFile.pile

    def slow_read(self, pile):
        kind = "remote" if not isinstance(self.file, pa.NativeFile) else "local"
        with lock:
            now[kind] += 1
            most[kind] = max(most[kind], now[kind])
        time.sleep(0.02)  # a request's latency, for reads to overlap if they are made at once
        with lock:
            now[kind] -= 1
        return read(self, pile)

    monkeypatch.setattr(_scratch.ScratchFile, "pile", slow_read)
    for scratch, dest in (("s3://scratch/at-once", "s3://lake/at-once"), (str(tmp_path), "s3://lake/at-once-2")):
        report = daskpile.shuffle_parquet(
            "s3://lake/at-once-in", dest, piles=4, seed=1, scratch=scratch, storage_options=options, blocksize="1 MiB"
        )
        assert report.rows == 40_000
    assert most["remote"] > 1 and most["local"] == 1, most
    fs, _ = s3
    fs.invalidate_cache()
    assert read_store_output(fs, "lake/at-once").equals(read_store_output(fs, "lake/at-once-2"))  # the same order


@pytest.mark.slow
def test_a_pile_read_from_a_store_at_once_says_a_file_gone_and_leaves_none_open(s3, monkeypatch):
    """An error in one of the files read at once is raised, once the others are done or cancelled, and every
    file opened for the pile is closed; so is the case of a reader closed partway."""
    fs, options = s3
    run = _scratch.Scratch.create("s3://scratch/gone", options, partitions=24, name="g")
    grouped, counts = _kernels.scatter(pa.table({"x": np.arange(600)}), 2, _random.generator(0, _random.SCATTER, 0))
    for k in range(24):
        run.write(k, 0, grouped, counts)
    with _scratch.PileReader(run) as reader:
        assert sum(b.num_rows for b in reader.pile(1)) == 24 * counts[1]
    opened, closed = [], []
    real_init, real_close = _scratch.ScratchFile.__init__, _scratch.ScratchFile.close
    monkeypatch.setattr(  # (counted once open)
        _scratch.ScratchFile, "__init__", lambda self, *a, **k: (real_init(self, *a, **k), opened.append(self))[0]
    )
    monkeypatch.setattr(_scratch.ScratchFile, "close", lambda self: (closed.append(self), real_close(self))[1])
    fs.rm(run.paths(run.band_of(1))[13])
    for one_at_a_time in (False, True):
        with pytest.raises(FileNotFoundError, match="is gone"), _scratch.PileReader(run) as reader:
            reader._one_at_a_time = one_at_a_time
            reader.pile(1)
        assert opened and set(map(id, opened)) == set(map(id, closed)), (len(opened), len(closed))
        opened.clear(), closed.clear()
    run.remove()


def test_the_loader_fetches_the_columns_it_reads_not_the_file(s3, monkeypatch):
    """Arrow asks for the byte ranges it needs: fsspec's read-ahead cache fetched 50 MiB beyond each (s3fs'
    block), 19 MiB of a pile of 40 for one small column."""
    fs, options = s3
    rows = 2_000_000
    table = pa.table({"x": np.random.default_rng(0).random(rows), "y": np.arange(rows), "label": np.arange(rows) % 7})
    with fs.open("lake/one-pile/part-00000.parquet", "wb") as f:
        pq.write_table(table, f)
    size = fs.info("lake/one-pile/part-00000.parquet")["size"]
    fetched = []
    fetch = s3fs.core.S3File._fetch_range
    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", lambda f, a, b: (fetched.append(b - a), fetch(f, a, b))[1])
    loader = daskpile.PileLoader("s3://lake/one-pile", batch_size=500_000, seed=0, columns=["label"],
                                 storage_options=options)  # fmt: skip
    assert sum(b.num_rows for b in loader) == rows
    assert sum(fetched) < 0.02 * size, (sum(fetched), size)


def test_a_band_of_remote_scratch_is_removed_in_one_go(s3):
    fs, options = s3
    run = _scratch.Scratch.create("s3://scratch/bands", options, partitions=3, name="b")
    run = dataclasses.replace(run, bands=_scratch.band_bounds(6, 3))
    grouped, counts = _kernels.scatter(pa.table({"x": np.arange(600)}), 6, _random.generator(0, _random.SCATTER, 0))
    for k in range(3):
        run.write(k, 0, grouped, counts)
    run.remove_band(1)
    run.remove_band(1)  # gone already: nothing to do
    fs.invalidate_cache()
    assert sorted(p.rsplit("-", 1)[-1] for p in fs.find("scratch/bands")) == ["b0.arrow"] * 3 + ["b2.arrow"] * 3
    run.remove()


@pytest.mark.slow
def test_credentials_in_an_s3_url_are_refused_and_never_printed(s3, tmp_path):
    """s3://KEY:SECRET@bucket/...: botocore took the credentials for part of the bucket's name and quoted it,
    without s3://, in its error, which --debug's traceback and the Python API's printed whole."""
    fs, options = s3
    fs.pipe("lake/small.txt", b"a\nb\n")
    endpoint = [f"--storage-option=client_kwargs.endpoint_url={options['client_kwargs']['endpoint_url']}",
                f"--storage-option=key={options['key']}", f"--storage-option=secret={options['secret']}"]  # fmt: skip
    secret = "SuperSecretValue987xyz"
    with_secret = f"s3://AKIAFAKE:{secret}@"
    for args in (
        [f"{with_secret}lake/small.txt", "s3://lake/leak"],
        ["s3://lake/small.txt", f"{with_secret}lake/leak"],
        ["s3://lake/small.txt", "s3://lake/leak", f"--scratch={with_secret}scratch/x"],
    ):
        done = daskpile_command("shuffle", *args, "--piles=2", "--scheduler=sync", "--debug", *endpoint)
        assert done.returncode == 2 and secret not in done.stdout + done.stderr, done
        assert "an s3:// URL carries no credentials" in done.stderr and "s3://AKIAFAKE:***@" in done.stderr
    # ...before a cluster is started or reached for nothing (it was, and then the URL was refused)
    for args in (["shuffle", f"{with_secret}lake/small.txt", "s3://lake/leak"], ["verify", f"{with_secret}lake/x"]):
        done = daskpile_command(*args, *endpoint)
        assert done.returncode == 2 and "carries no credentials" in done.stderr, done
        assert "dashboard" not in done.stdout and secret not in done.stdout + done.stderr, done
    with pytest.raises(ValueError) as refused:
        daskpile.shuffle_parquet(f"{with_secret}lake/small.txt", "s3://lake/leak", storage_options=options)
    assert secret not in "".join(traceback.format_exception(refused.value))
    assert not fs.exists("lake/leak")
    # In the endpoint's URL: the store's HTTP client refused it mid-request, and the command exited 1
    endpoint_url = options["client_kwargs"]["endpoint_url"].replace("://", f"://AKIAFAKE:{secret}@")
    for option in ("endpoint_url", "client_kwargs.endpoint_url"):
        done = daskpile_command(
            "shuffle", "s3://lake/small.txt", "s3://lake/leak", "--piles=2", "--scheduler=sync", "--debug",
            f"--storage-option={option}={endpoint_url}", *endpoint[1:],
        )  # fmt: skip
        assert done.returncode == 2 and f"storage option {option} carries credentials" in done.stderr, done
        assert secret not in done.stdout + done.stderr, done
    # ...and in the environment's (a Secret's AWS_ENDPOINT_URL: exit 1, botocore's message; a platform trial)
    done = daskpile_command(
        "shuffle", "s3://lake/small.txt", "s3://lake/leak", "--piles=2", "--scheduler=sync", *endpoint[1:],
        env={**os.environ, "AWS_ENDPOINT_URL": endpoint_url},
    )  # fmt: skip
    assert done.returncode == 2 and "$AWS_ENDPOINT_URL carries credentials" in done.stderr, done
    assert secret not in done.stdout + done.stderr, done
    assert not fs.exists("lake/leak")
    # botocore takes AWS_ENDPOINT_URL_S3 before it: a clean one there is the endpoint used, and not refused
    done = daskpile_command(
        "shuffle", "s3://lake/small.txt", "s3://lake/clean", "--piles=2", "--scheduler=sync", *endpoint[1:],
        env={**os.environ, "AWS_ENDPOINT_URL": endpoint_url,
             "AWS_ENDPOINT_URL_S3": options["client_kwargs"]["endpoint_url"]},
    )  # fmt: skip
    assert done.returncode == 0 and fs.exists("lake/clean/_daskpile.json"), done


def test_a_dest_or_scratch_naming_an_object_is_refused_as_locally(sync_scheduler, s3):
    """An object at dest's key was taken for a folder: the lease and the piles were written under it, and a
    later read of its folder lost the object itself (s3fs saw a folder)."""
    fs, options = s3
    fs.pipe("lake/r3/a.txt", b"a\nb\n")
    fs.pipe("lake/r3/b.txt", b"keep me\n")
    for dest, scratch in (("s3://lake/r3/b.txt", "s3://scratch/r3"), ("s3://lake/r3-out", "s3://lake/r3/b.txt")):
        role = "dest" if dest.endswith("b.txt") else "scratch"
        with pytest.raises(NotADirectoryError, match=rf"{role} 's3://lake/r3/b.txt' is a file \(an object\), not a"):
            daskpile.shuffle_parquet("s3://lake/r3/a.txt", dest, piles=1, scratch=scratch, storage_options=options)
    fs.invalidate_cache()
    assert fs.find("lake/r3") == ["lake/r3/a.txt", "lake/r3/b.txt"] and fs.cat("lake/r3/b.txt") == b"keep me\n"


def test_a_dest_inside_the_source_on_s3_is_named_by_its_url(sync_scheduler, s3):
    """It said "dest 'lake/r4/out' overlaps the source 'lake/r4'", dropping the scheme every other message has."""
    fs, options = s3
    fs.pipe("lake/r4/a.txt", b"a\nb\n")
    with pytest.raises(ValueError, match=r"^dest 's3://lake/r4/out' overlaps the source 's3://lake/r4': choose a"):
        daskpile.shuffle_parquet("s3://lake/r4/", "s3://lake/r4/out", piles=1, storage_options=options)


@pytest.mark.slow
def test_a_text_run_on_s3_interrupted_in_pass_2_keeps_the_files_it_wrote(sync_scheduler, s3):
    """A text file's stamp lies beside it: on a store, it must name the object as a later HEAD sees it."""
    fs, options = s3
    fs.pipe("lake/corpus.txt", b"".join(b"line %d\n" % i for i in range(2000)))
    kwargs = dict(piles=6, seed=2, output_format="lines", compression="gzip", storage_options=options)
    source, dest, scratch = "s3://lake/corpus.txt", "s3://lake/corpus-out", "s3://scratch/corpus"
    with interrupted_after(_outputs, "write", 4):
        daskpile.shuffle_parquet(source, dest, scratch=scratch, **kwargs)
    report = daskpile.shuffle_parquet(source, dest, scratch=scratch, **kwargs)
    assert report.resumed_piles == 4 and report.resumed_partitions == 1
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.find("lake/corpus-out")) == ["_daskpile.json"] + [
        f"part-{j:05d}.txt.gz" for j in range(6)
    ]
    assert daskpile.verify(source, dest, storage_options=options).ok


@pytest.mark.slow
def test_a_run_on_s3_that_fails_verification_says_so_and_leaves_nothing(sync_scheduler, s3, monkeypatch):
    """The clean-up after the failure must not fail in its place: the dest prefix is gone with its objects."""
    fs, options = s3
    write_reference_dataset("s3://lake/verr-in", rows=2_000, files=2, storage_options=options)
    honest = _kernels.permute

    def corrupting_permute(table, rng):
        permuted = honest(table, rng)
        return permuted.set_column(0, permuted.field(0), pa.array(np.asarray(permuted.column(0)) + 1))

    monkeypatch.setattr(_kernels, "permute", corrupting_permute)
    with pytest.raises(daskpile.VerificationError, match="not a permutation"):
        daskpile.shuffle_parquet(
            "s3://lake/verr-in", "s3://lake/verr-out", piles=3, seed=1, scratch="s3://scratch/verr",
            storage_options=options,
        )  # fmt: skip
    fs.invalidate_cache()
    assert fs.find("lake/verr-out") == [] and fs.find("scratch/verr") == []


@pytest.mark.slow
def test_a_live_runs_lease_in_an_s3_dest_refuses_a_second_run_and_two_racing_runs_leave_one(sync_scheduler, s3):
    """A store has no create-if-absent: of two runs writing the lease at once, the one whose write lands last
    holds it, and the other, reading it back, is refused."""
    fs, options = s3
    write_reference_dataset("s3://lake/lease-in", rows=2_000, files=2, storage_options=options)
    shuffle = functools.partial(
        daskpile.shuffle_parquet, "s3://lake/lease-in", "s3://lake/lease-out", piles=3, seed=1,
        scratch="s3://scratch/lease", storage_options=options,
    )  # fmt: skip
    first = _lease.Lease.take(fs, "lake/lease-out")
    try:
        with pytest.raises(daskpile.DestBusyError, match="another daskpile run"):
            shuffle()
        fs.invalidate_cache()
        assert [p.rsplit("/", 1)[-1] for p in fs.find("lake/lease-out")] == [_lease.LEASE_FILE]
        first.renew()
        assert first.lost is None
        racing = {"owner": "second", "pid": 2, "renewed": time.time()}
        _storage.write_bytes(fs, first.path, json.dumps(racing).encode())  # a racing run's write landed after ours
        with pytest.raises(daskpile.DestBusyError, match="pid 2"):
            first.check()
    finally:
        first.release()
    fs.invalidate_cache()
    assert fs.find("lake/lease-out") == [f"lake/lease-out/{_lease.LEASE_FILE}"]  # the other run's: kept
    fs.rm("lake/lease-out", recursive=True)
    report = shuffle()
    fs.invalidate_cache()
    assert report.rows == 2_000 and _lease.LEASE_FILE not in [p.rsplit("/", 1)[-1] for p in fs.find("lake/lease-out")]


def test_shuffle_dataframe_with_scratch_on_s3(sync_scheduler, s3):
    fs, options = s3
    frame = pd.DataFrame({"x": np.arange(1000), "s": [f"v{i}" for i in range(1000)]})
    ddf = dd.from_pandas(frame, npartitions=4)
    shuffled = daskpile.shuffle(ddf, piles=3, seed=1, scratch="s3://scratch/df", storage_options=options)
    out = shuffled.compute()
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute())
    fs.invalidate_cache()
    names = [p.rsplit("/", 1)[-1] for p in fs.find("scratch/df")]
    scattered = ["_scattered.json"] + [f"scatter-00000{k}.arrow" for k in range(4)]  # one per partition
    assert sorted(names) == ["_daskpile.session.json", *scattered]
    del shuffled
    gc.collect()
    eventually(lambda: fs.invalidate_cache() or fs.find("scratch/df") == [], what="scratch removed")


def test_a_scratch_file_removed_from_the_store_under_a_live_result_runs_pass_1_again(sync_scheduler, s3, monkeypatch):
    """What an age-based lifecycle rule does: one object goes.  s3fs answered from the listing it had cached, and
    the next compute, once pass 2's files were closed, failed on the missing object."""
    monkeypatch.setattr(_scratch, "IDLE_SECONDS", 0.05)  # pass 2's files closed at once after its reads
    _, options = s3
    ddf = dd.from_pandas(pd.DataFrame({"x": np.arange(300)}), npartitions=3)
    shuffled = daskpile.shuffle(ddf, piles=3, seed=1, scratch="s3://scratch/lifecycle", storage_options=options)
    whole = shuffled.compute()
    pd.testing.assert_frame_equal(shuffled.compute(), whole)  # (lists the scratch: s3fs caches the listing)
    other = s3fs.S3FileSystem(skip_instance_cache=True, **options)  # another process: a rule, daskpile clean
    other.rm(next(p for p in other.find("scratch/lifecycle") if "scatter-" in p))
    time.sleep(0.5)
    pd.testing.assert_frame_equal(shuffled.compute(), whole)
    del shuffled  # its scratch goes while the server is up
    gc.collect()
    eventually(lambda: other.invalidate_cache() or other.find("scratch/lifecycle") == [], what="scratch removed")


@pytest.mark.slow
def test_the_command_on_s3(s3):
    _, options = s3
    write_reference_dataset("s3://lake/cli-in", rows=5_000, files=2, storage_options=options)
    endpoint = options["client_kwargs"]["endpoint_url"]
    storage = [
        "--storage-option=key=testing",
        "--storage-option=secret=testing",
        f"--storage-option=client_kwargs.endpoint_url={endpoint}",
        "--storage-option=client_kwargs.region_name=eu-west-1",
    ]
    args = ["s3://lake/cli-in", "s3://lake/cli-out", "--piles=3", "--seed=2", "--scratch=s3://scratch/cli"]
    result = CliRunner().invoke(cli, ["shuffle", *args, *storage, "--scheduler=threads", "-q"])
    assert result.exit_code == 0, result.output
    assert "shuffled 5,000 rows from 2 files into 3 piles (seed 2) at s3://lake/cli-out" in result.output
    result = CliRunner().invoke(cli, ["verify", "s3://lake/cli-in", "s3://lake/cli-out", *storage, "--scheduler=sync"])
    assert result.exit_code == 0 and "match" in result.output


def test_a_misspelled_storage_option_is_named_with_the_path(s3):
    """It said "AioSession.__init__() got an unexpected keyword argument 'endpoint_urll'", naming neither."""
    _, options = s3
    endpoint = options["client_kwargs"]["endpoint_url"]
    storage = ["--storage-option=key=testing", "--storage-option=secret=testing",
               f"--storage-option=client_kwargs.endpoint_urll={endpoint}"]  # fmt: skip
    result = CliRunner().invoke(cli, ["shuffle", "s3://lake/src", "s3://lake/typo-out", *storage, "--scheduler=sync"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("daskpile: error: source 's3://lake/src': the storage option 'endpoint_urll' "), (
        result.output
    )


def test_clean_of_a_scratch_prefix_whose_last_run_went_finds_nothing(s3):
    """On a store, a prefix is there while objects are: a nightly clean after the last scratch went failed."""
    from daskpile.engine._clean import clean

    _, options = s3
    assert clean("s3://scratch/emptied/", storage_options=options) == []


@pytest.mark.slow
def test_a_folder_marker_is_not_a_foreign_file_and_overwrite_keeps_user_objects(sync_scheduler, s3):
    """S3 consoles make "folders" as empty objects named dest/: s3fs lists them; they are not user files."""
    fs, options = s3
    write_reference_dataset("s3://lake/marked-src", rows=2_000, files=2, storage_options=options)
    fs.pipe("lake/marked/", b"")  # the console's "Create folder"
    fs.invalidate_cache()
    args = ("s3://lake/marked-src", "s3://lake/marked")
    daskpile.shuffle_parquet(*args, piles=3, seed=1, storage_options=options)
    daskpile.shuffle_parquet(*args, piles=2, seed=2, storage_options=options, overwrite=True)
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in fs.find("lake/marked")) == [
        "",
        "_daskpile.json",
        "part-00000.parquet",
        "part-00001.parquet",
    ]  # fmt: skip  ("": the marker, kept)
    fs.pipe("lake/marked/notes.txt", b"mine")
    with pytest.raises(FileExistsError, match=r"did not write \(notes\.txt\)"):
        daskpile.shuffle_parquet(*args, piles=2, seed=3, storage_options=options, overwrite=True)
    assert fs.cat("lake/marked/notes.txt") == b"mine"


SECRET = "s3cr3t-daskpile-7f3a9c"  # moto takes any key; this one must never be seen again


@pytest.mark.slow
def test_secrets_are_never_printed_logged_or_written(s3):
    import os

    fs, options = s3
    endpoint = options["client_kwargs"]["endpoint_url"]
    write_reference_dataset("s3://lake/secret-in", rows=5_000, files=2, storage_options=options)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET}
    endpoint_options = [f"--storage-option=client_kwargs.endpoint_url={endpoint}",
                        "--storage-option=client_kwargs.region_name=eu-west-1"]  # fmt: skip
    in_options = [*endpoint_options, "--storage-option=key=testing", f"--storage-option=secret={SECRET}"]
    unreachable = ["--storage-option=client_kwargs.endpoint_url=http://127.0.0.1:9", "--storage-option=key=testing",
                   f"--storage-option=secret={SECRET}", "--storage-option=config_kwargs.connect_timeout=1",
                   "--storage-option=config_kwargs.retries.max_attempts=1"]  # fmt: skip
    failures = [
        # a missing bucket as source and as dest, an endpoint that does not answer
        ("shuffle", "s3://no-such-bucket/x", "s3://lake/secret-never", *in_options),
        ("shuffle", "s3://lake/secret-in", "s3://no-such-bucket/out", "--piles=2", *in_options),
        ("shuffle", "s3://lake/secret-in", "s3://lake/secret-never", "--piles=2", *unreachable),
        ("shuffle", "s3://lake/secret-in", "s3://lake/secret-never", "--piles=2", "--debug", *unreachable),
    ]
    with concurrent.futures.ThreadPoolExecutor(len(failures)) as pool:  # beside the runs, which wait on each other
        failed = [pool.submit(daskpile_command, *args) for args in failures]
        runs = [
            # credentials from the environment, on a LocalCluster (its workers log to this stderr), then as
            # options; a retry; verify
            daskpile_command("shuffle", "s3://lake/secret-in", "s3://lake/secret-out", "--piles=3", "--seed=1",
                             "--scratch=s3://scratch/secret", *endpoint_options, "--debug", env=env),
            daskpile_command("shuffle", "s3://lake/secret-in", "s3://lake/secret-out", "--piles=3", "--seed=1",
                             "--scratch=s3://scratch/secret", *in_options, "--scheduler=threads", "--debug"),
            daskpile_command("verify", "s3://lake/secret-in", "s3://lake/secret-out", *in_options,
                             "--scheduler=sync", "--json"),
        ]  # fmt: skip
        runs += [future.result() for future in failed]
    assert [r.returncode for r in runs] == [0, 0, 0, 2, 2, 75, 75], [r.stderr for r in runs]
    for r in runs:
        assert SECRET not in r.stdout + r.stderr
    for failed in runs[3:6]:
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert "bucket 'no-such-bucket' does not exist" in runs[4].stderr
    assert runs[5].stderr.startswith("daskpile: error: source 's3://lake/secret-in': cannot reach the store: ")
    assert "Traceback" in runs[6].stderr  # --debug: the whole traceback, and still no secret
    assert "already done" in runs[1].stdout
    assert not fs.exists("lake/secret-never")
    for path in fs.find("lake") + fs.find("scratch"):
        assert SECRET.encode() not in fs.cat_file(path), path


@pytest.mark.slow
def test_wrong_credentials_are_one_line_and_exit_2(tmp_path):
    """A server that checks credentials (moto with authentication on from its first request), for a source
    and for a dest (which said only "Forbidden": the dest's first request, its lease, named no URL)."""
    from _util import sorted_source

    local = sorted_source(tmp_path / "local", 100, files=1)
    with moto_s3_process(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        options = [
            "--scheduler=sync", "--storage-option=key=nobody", f"--storage-option=secret={SECRET}",
            f"--storage-option=client_kwargs.endpoint_url={endpoint}",
            "--storage-option=client_kwargs.region_name=eu-west-1",
        ]  # fmt: skip
        done = daskpile_command("shuffle", "s3://lake/in", str(tmp_path / "out"), *options)
        into = daskpile_command("shuffle", local, "s3://lake/out", *options)
        checked = daskpile_command("verify", local, "s3://lake/out", *options)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("daskpile: error: source 's3://lake/in': access denied: The AWS Access Key Id")
    assert len(done.stderr.splitlines()) == 1 and SECRET not in done.stderr
    assert not (tmp_path / "out").exists()
    assert into.returncode == 2, into.stderr
    assert into.stderr.startswith("daskpile: error: dest 's3://lake/out': access denied: "), into.stderr
    assert len(into.stderr.splitlines()) == 1 and SECRET not in into.stderr
    # verify said only "Forbidden"
    assert checked.returncode == 2, checked.stderr
    assert checked.stderr.startswith("daskpile: error: dest 's3://lake/out': access denied: "), checked.stderr


@pytest.mark.slow
def test_workers_that_reach_another_store_than_the_command_are_told_so_not_to_try_again(s3):
    """Workers whose environment names another endpoint than the command's read another object under the same
    name, or none: that was said "written again while it was read" with exit status 75, which a job runner
    retries for ever, or "does not exist" of a file the command had just listed.  Where they found the same
    bytes, they wrote the result's files to their store, and the command committed a manifest naming them in
    its own, where there were none, and said "verified" (found beside an operator's trial)."""
    fs, options = s3
    with fs.open("lake/apart/a.parquet", "wb") as f:
        pq.write_table(pa.table({"x": range(100)}), f)
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}
    command_env = {**os.environ, **keys, "AWS_ENDPOINT_URL": options["client_kwargs"]["endpoint_url"]}
    from distributed import LocalCluster

    with moto_s3_process() as elsewhere:
        other = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": elsewhere})
        for bucket in ("lake", "scratch"):
            other.mkdir(bucket)
        with other.open("lake/apart/a.parquet", "wb") as f:
            pq.write_table(pa.table({"x": range(120)}), f)
        workers_env = {**keys, "AWS_ENDPOINT_URL": elsewhere}
        with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", env=workers_env) as cluster:

            def shuffle(dest: str = "s3://lake/apart-out", *options: str) -> str:
                done = daskpile_command(
                    "shuffle", "s3://lake/apart", dest, "--scratch", "s3://scratch/apart", "--piles", "2",
                    "--scheduler", cluster.scheduler_address, *options, env=command_env,
                )  # fmt: skip
                assert done.returncode == 2, done.stderr
                assert "do the workers reach the same store as this process" in done.stderr
                fs.invalidate_cache()
                return done.stderr

            for found in ("was written again", "does not exist"):
                if found == "does not exist":
                    other.rm("lake/apart/a.parquet")
                said = shuffle()
                assert said.startswith("daskpile: error: the workers do not find source file 's3://lake/apart/a.pa")
                assert found in said and fs.find("lake/apart-out") == [] and fs.find("scratch/apart") == []
            other.pipe("lake/apart/a.parquet", fs.cat("lake/apart/a.parquet"))  # the same bytes: the same ETag
            said = shuffle()
            assert said.startswith(
                "daskpile: error: the workers wrote 2 files of the result that this process does not find as written "
                "in dest 's3://lake/apart-out' (part-00000.parquet, part-00001.parquet), where 1 of 1 workers"
            ), said
            assert [p for p in fs.find("lake/apart-out") if "/part-" in p or p.endswith("/_daskpile.json")] == []
            # an overwrite of a finished result: refused before the old result is taken apart for the new one
            with dask.config.set(scheduler="sync"):
                daskpile.shuffle_parquet("s3://lake/apart", "s3://lake/done", 3, seed=1, storage_options=options)
            before = sorted(fs.find("lake/done"))
            said = shuffle("s3://lake/done", "--overwrite")
            assert "the workers wrote 2 files of the result that this process does not find as written" in said
            fs.invalidate_cache()
            assert [p for p in sorted(fs.find("lake/done")) if not p.endswith("/_daskpile.run.json")] == before
            with dask.config.set(scheduler="sync"):
                assert daskpile.verify("s3://lake/apart", "s3://lake/done", storage_options=options).ok


def test_a_shuffle_whose_scratch_store_is_unreachable_says_so_naming_it():
    """daskpile.shuffle makes its scratch directory when called: a store that cannot be reached was the store
    client's own traceback (aiohttp's, for gs://), where the command said one line."""
    unreachable = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}, "key": "k", "secret": "s",
                   "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}  # fmt: skip
    ddf = dd.from_pandas(pd.DataFrame({"x": range(10)}), npartitions=1)
    with pytest.raises(_storage.StoreUnreachable, match=r"^scratch 's3://lake/tmp/daskpile-\w+': cannot reach"):
        daskpile.shuffle(ddf, piles=2, scratch="s3://lake/tmp", storage_options=unreachable)


@pytest.mark.slow
def test_unreachable_dest_is_said_at_once_naming_it(tmp_path):
    """Before any data is read: a dest whose store cannot be reached is one line naming it, nothing written."""
    write_reference_dataset(tmp_path / "events", rows=1_000, files=1)
    unreachable = ["--storage-option=client_kwargs.endpoint_url=http://127.0.0.1:9", "--storage-option=key=k",
                   "--storage-option=secret=s", "--storage-option=config_kwargs.connect_timeout=1",
                   "--storage-option=config_kwargs.retries.max_attempts=1"]  # fmt: skip
    done = daskpile_command("shuffle", str(tmp_path / "events"), "s3://lake/out", "--scheduler=sync", *unreachable)
    assert done.returncode == 75, done.stderr  # EX_TEMPFAIL: a later try may reach it
    assert done.stderr.startswith("daskpile: error: dest 's3://lake/out': cannot reach the store: "), done.stderr
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("endpoint", "status", "said"),
    [
        ("http://daskpile-no-such-host.invalid:9", 75, r"cannot reach the store: .* \(the endpoint's host name "
         r"'daskpile-no-such-host\.invalid' resolves to no address: .*; misspelled\?\)$"),
        ("127.0.0.1:9", 2, r"storage option client_kwargs\.endpoint_url is not a URL: give it as http://host:port "
         r"or https://host$"),
        # a scheme-less user:password@ is no URL, so no credentials check saw it: botocore's message quoted it
        ("AKIA:s3cr3t@127.0.0.1:9", 2, r"storage option client_kwargs\.endpoint_url is not a URL: give it as "
         r"http://host:port or https://host$"),
    ],
    ids=["host-unknown", "no-scheme", "no-scheme-with-credentials"],
)  # fmt: skip
def test_a_misspelt_endpoint_is_said_as_such(tmp_path, endpoint, status, said):
    """A host name that resolves to nothing was said as a server down ("Could not connect to the endpoint URL"),
    and retried for an hour under ``--retry-for`` (it may be a service not made yet: still exit 75); an
    endpoint without its scheme was botocore's "Invalid endpoint", naming neither the option nor the path."""
    write_reference_dataset(tmp_path / "events", rows=1_000, files=1)
    options = [f"--storage-option=client_kwargs.endpoint_url={endpoint}", "--storage-option=key=k",
               "--storage-option=secret=s", "--storage-option=config_kwargs.retries.max_attempts=1"]  # fmt: skip
    done = daskpile_command("shuffle", str(tmp_path / "events"), "s3://lake/out", "--scheduler=sync", *options)
    assert done.returncode == status and len(done.stderr.splitlines()) == 1, done.stderr
    assert re.match(r"daskpile: error: dest 's3://lake/out': " + said, done.stderr.strip()), done.stderr


@pytest.mark.slow
def test_an_environment_endpoint_without_its_scheme_is_named_as_the_environment_s(tmp_path):
    """A scheme-less AWS_ENDPOINT_URL (a Kubernetes Secret's) was said to be "the storage option endpoint_url",
    which the user never gave: the message names the variable."""
    import os

    write_reference_dataset(tmp_path / "events", rows=1_000, files=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_ENDPOINT_URL": "127.0.0.1:9",
    }  # fmt: skip
    done = daskpile_command("shuffle", str(tmp_path / "events"), "s3://lake/out", "--scheduler=sync", env=env)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.strip() == (
        "daskpile: error: dest 's3://lake/out': $AWS_ENDPOINT_URL is not a URL: give it as http://host:port or "
        "https://host"
    ), done.stderr


def test_https_to_an_http_endpoint_and_an_unknown_profile_are_exit_2_naming_the_url(s3, tmp_path):
    """From the S3 trial: https:// to a store that speaks http was "SSL validation failed", exit 75, so a batch
    job's --retry-for retried a mistake for an hour; an AWS_PROFILE misspelled was botocore's "The config profile
    (trail) could not be found", exit 1, naming no URL."""
    import os

    fs, options = s3
    fs.pipe("lake/tls-in/a.csv", b"a,b\n1,2\n")
    endpoint = options["client_kwargs"]["endpoint_url"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }  # fmt: skip
    https = env | {"AWS_ENDPOINT_URL": endpoint.replace("http://", "https://")}
    done = daskpile_command("shuffle", "s3://lake/tls-in", "s3://lake/tls-out", "--scheduler=sync", env=https)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("daskpile: error: source 's3://lake/tls-in': cannot use the endpoint given for "
                                  "the store: SSL validation failed"), done.stderr  # fmt: skip
    profile = env | {"AWS_ENDPOINT_URL": endpoint, "AWS_PROFILE": "daskpile-no-such-profile"}
    done = daskpile_command("shuffle", "s3://lake/tls-in", "s3://lake/tls-out", "--scheduler=sync", env=profile)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    said = "cannot sign into the store: The config profile (daskpile-no-such-profile) could not be found"
    assert done.stderr.startswith(f"daskpile: error: source 's3://lake/tls-in': {said}"), done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["append", "DAY", "s3://lake/w"], "window 's3://lake/w'"),
        (["expire", "s3://lake/w", "--keep=1"], "window 's3://lake/w'"),
        (["compact", "s3://lake/w", "--scheduler=sync"], "window 's3://lake/w'"),
        (["verify", "s3://lake/w", "--scheduler=sync"], "dest 's3://lake/w'"),
        (["verify", "DAY", "s3://lake/w", "--scheduler=sync"], "dest 's3://lake/w'"),
        (["quality", "s3://lake/w", "--order-column=id"], "dest 's3://lake/w'"),
        (["epochs", "s3://lake/w"], "path 's3://lake/w'"),  # (PileLoader's word)
    ],
    ids=["append", "expire", "compact", "verify", "verify-source", "quality", "epochs"],
)
def test_every_command_names_the_result_whose_store_it_cannot_reach(tmp_path, args, said):
    """Without credentials, the commands that read a result or a window first said only botocore's "Unable to
    locate credentials", naming no URL."""
    import os

    write_reference_dataset(tmp_path / "day", rows=10, files=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    nowhere = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    env |= nowhere | {"AWS_EC2_METADATA_DISABLED": "true"}
    args = [str(tmp_path / "day") if a == "DAY" else a for a in args]
    done = daskpile_command(*args, "--storage-option=client_kwargs.endpoint_url=http://127.0.0.1:9", env=env)
    assert done.returncode == 2, done.stderr  # no retry mends missing credentials
    assert done.stderr.startswith(f"daskpile: error: {said}: cannot sign into the store: "), done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_delta_table_on_a_store_named_by_the_environment_alone(sync_scheduler, s3, tmp_path, monkeypatch):
    """The deployment guide names the store with AWS_ENDPOINT_URL; Parquet read it, and a Delta table failed
    with "Generic S3 error" (delta-rs refuses an http endpoint it was not told to allow)."""
    deltalake = pytest.importorskip("deltalake")
    fs, options = s3
    table = pa.table({"id": pa.array(range(500), pa.int64()), "v": [str(i) for i in range(500)]})
    deltalake.write_deltalake(str(tmp_path / "delta"), table)
    fs.put(str(tmp_path / "delta"), "lake/delta-env", recursive=True)
    environment = {"AWS_ENDPOINT_URL": options["client_kwargs"]["endpoint_url"], "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}  # fmt: skip
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    report = daskpile.shuffle_parquet(
        "s3://lake/delta-env", "s3://lake/delta-env-out", piles=2, seed=1, scratch="s3://scratch/delta-env"
    )
    assert report.rows == 500
    out = read_store_output(fs, "lake/delta-env-out")
    assert sorted(out["id"].to_pylist()) == list(range(500))


def test_folder_markers_of_the_s3_console_and_of_hadoop_are_not_data(sync_scheduler, s3):
    """A zero-byte key ending in "/" (the console's Create folder, Hadoop's, rclone's) was read as a Parquet
    file: "cannot read 's3://lake/.../' as Parquet: Parquet file size is 0 bytes"."""
    fs, options = s3
    write_reference_dataset("s3://lake/foldered/day=1", rows=1_000, files=1, storage_options=options)
    write_reference_dataset("s3://lake/foldered/day=2", rows=1_000, files=1, storage_options=options)
    # (and Hadoop's and EMR's, beside the folder: a trial's lake, "cannot read '...day=2_$folder$' as Parquet")
    for marker in ("foldered/", "foldered/day=1/", "foldered/day=2_$folder$"):
        fs.call_s3("put_object", Bucket="lake", Key=marker, Body=b"")
    fs.invalidate_cache()
    report = daskpile.shuffle_parquet("s3://lake/foldered", "s3://lake/foldered-out", piles=2, seed=1,
                                      scratch="s3://scratch/tmp", storage_options=options)  # fmt: skip
    fs.call_s3("put_object", Bucket="lake", Key="foldered-out/", Body=b"")  # (and in the result's folder)
    fs.invalidate_cache()
    assert report.rows == 2_000 and daskpile.verify(
        "s3://lake/foldered", "s3://lake/foldered-out", storage_options=options
    )


def test_what_reads_parquet_results_refuses_text_ones_naming_their_url(sync_scheduler, s3):
    """A window or a PileLoader given a result of text files says so naming it as given, where it dropped s3://
    ("'lake/text-out' holds jsonl files")."""
    fs, options = s3
    fs.pipe("lake/text-in/a.jsonl", b"".join(b'{"id": %d}\n' % i for i in range(50)))
    daskpile.shuffle_parquet("s3://lake/text-in", "s3://lake/text-out", piles=2, seed=1, storage_options=options,
                             output_format="jsonl")  # fmt: skip
    with pytest.raises(ValueError, match=r"^'s3://lake/text-out' holds jsonl files: PileLoader reads Parquet"):
        daskpile.PileLoader("s3://lake/text-out", batch_size=8, seed=0, storage_options=options)
    with pytest.raises(ValueError, match=r"^'s3://lake/text-out' holds jsonl files: a moving window reads Parquet"):
        daskpile.append("s3://lake/text-out", "s3://lake/text-in", storage_options=options)
