"""Helpers shared by the tests."""

import contextlib
import decimal
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def str_dtype() -> pd.StringDtype | None:
    """pandas 3's default string dtype ("str", missing values NaN); pandas 2.3 has it behind an option and 2.2,
    daskpile's oldest, not at all (None)."""
    try:
        return pd.StringDtype(na_value=np.nan)
    except TypeError:
        return None


DASKPILE = shutil.which("daskpile", path=os.path.dirname(sys.executable)) or "daskpile"


def huge_pages_testable() -> str | None:
    """Why a test of whether a process runs Arrow without transparent huge pages cannot tell here, or None.

    Linux passes PR_SET_THP_DISABLE, which mimalloc sets, on to every child: a test process running with huge
    pages off (MIMALLOC_ALLOW_THP=0 exported) has children without them whatever they are told.
    """
    status = Path("/proc/self/status").read_text() if os.path.exists("/proc/self/status") else ""
    flag = [line.split()[1] for line in status.splitlines() if line.startswith("THP_enabled")]
    if not flag:
        return "no THP_enabled in /proc/self/status (Linux before 5.0, or not Linux)"
    if flag != ["1"]:
        return "this process runs without transparent huge pages, and so would its children"
    try:
        pa.mimalloc_memory_pool()
    except NotImplementedError:
        return "this pyarrow has no mimalloc"
    return None


def daskpile_command(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed ``daskpile`` command, run in a process of its own, with its output captured."""
    return subprocess.run([DASKPILE, *args], capture_output=True, text=True, timeout=timeout, env=env)


# A process of its own that takes a dest's lease, says so, and holds it until its stdin closes
_LEASE_HOLDER = """
import sys, fsspec
from daskpile.engine import _lease
with _lease.held(fsspec.filesystem("file"), sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def start_lease_holder(dest) -> subprocess.Popen:
    """A live run's stand-in: a process holding the lease of the local ``dest`` once this returns.

    Close its stdin to end it (it then removes the lease), or kill it to leave a dead run's lease.
    """
    holder = subprocess.Popen(
        [sys.executable, "-c", _LEASE_HOLDER, str(dest)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert holder.stdout.readline().strip() == b"held"
    return holder


def daskpile_in_process(*args: str) -> subprocess.CompletedProcess:
    """The ``daskpile`` command run in this process by click's runner, as ``daskpile_command`` reports it.

    For tests of what a command does and says: the same code, its exit status and its two streams, without
    a process's start (0.7 s of imports a command).  The installed command itself is tested in test_cli.py.
    """
    from click.testing import CliRunner

    from daskpile.cli import cli

    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(["daskpile", *args], result.exit_code, result.stdout, result.stderr)


PROCESSES = 2  # of the ``two_processes`` pool (conftest.py)


def over_processes(pool, trials, seeds: range, *args) -> list:
    """``trials(part, seeds[i::n], *args)`` in the ``n = PROCESSES`` processes of ``pool``, results in seed order.

    The exhaustive uniformity tests run hundreds of whole shuffles of 4 rows, each a fixed cost of Python
    on one core: shared by two processes, they take half the time on CI's two cores.  ``trials`` is a
    module-level function (a process imports it by name) that takes its part's number (for a directory
    of its own), its seeds and ``args``, and returns one result a seed; it runs on the sync scheduler.
    """
    n = PROCESSES
    parts = [pool.submit(_synchronously, trials, i, seeds[i::n], *args) for i in range(n)]
    results = [part.result() for part in parts]
    return [results[i % n][i // n] for i in range(len(seeds))]


def _synchronously(trials, *args):
    import dask

    with dask.config.set(scheduler="sync"):
        return trials(*args)


def read_output(dest) -> pa.Table:
    """The shuffled dataset, its part files read in name (= pile) order."""
    files = sorted(glob.glob(os.path.join(dest, "part-*.parquet")))
    return pa.concat_tables([pq.read_table(f) for f in files])


def read_store_output(fs, dest: str) -> pa.Table:
    """``read_output`` for a dest on an object store (``fs`` its fsspec filesystem, ``dest`` without the scheme)."""
    files = sorted(p for p in fs.ls(dest) if p.rsplit("/", 1)[-1].startswith("part-"))
    tables = []
    for path in files:
        with fs.open(path, "rb") as f:
            tables.append(pq.read_table(f))
    return pa.concat_tables(tables)


def shuffle_on_a_store(fs, scheme: str, storage: list[str]) -> list[subprocess.CompletedProcess]:
    """The command with source, dest and scratch under ``{scheme}://lake/``: shuffled and verified, verified
    again, retried, nothing left in scratch, a missing bucket refused in one line.  Returns the runs, whose
    output the caller may search for its secret.  ``lake/events`` must hold 20,000 rows in 3 files.
    """
    root = f"{scheme}://lake"
    run = ["shuffle", f"{root}/events", f"{root}/shuffled", "--piles=4", "--seed=1",
           f"--scratch={root}/tmp", "--scheduler=threads", *storage]  # fmt: skip
    done = daskpile_command(*run)
    assert done.returncode == 0, done.stderr
    assert f"shuffled 20,000 rows from 3 files into 4 piles (seed 1) at {root}/shuffled" in done.stdout
    assert "verified" in done.stdout
    verified = daskpile_command("verify", f"{root}/events", f"{root}/shuffled", "--scheduler=sync", *storage)
    assert verified.returncode == 0 and "match" in verified.stdout, verified.stderr
    retried = daskpile_command(*run)
    assert retried.returncode == 0 and retried.stdout.startswith(f"already done: {root}/shuffled"), retried.stderr
    fs.invalidate_cache()
    assert fs.find("lake/tmp") == []
    missing = daskpile_command(
        "shuffle", f"{root}/events", f"{scheme}://no-such-bucket/out", "--scheduler=sync", *storage
    )
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr == (
        f"daskpile: error: dest '{scheme}://no-such-bucket/out': bucket 'no-such-bucket' does not exist\n"
    )
    return [done, verified, retried, missing]


def file_bytes(dest) -> dict[str, bytes]:
    return {os.path.basename(f): Path(f).read_bytes() for f in sorted(glob.glob(os.path.join(dest, "part-*")))}


def write_parts(table: pa.Table, directory, parts: int) -> None:
    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, parts + 1).astype(int)
    for k in range(parts):
        pq.write_table(
            table.slice(bounds[k], bounds[k + 1] - bounds[k]), os.path.join(directory, f"in-{k:03d}.parquet")
        )


def every_type_table(rows: int) -> pa.Table:
    """One column of each Arrow type daskpile promises to round-trip."""
    i = np.arange(rows)
    nulls = i % 7 == 3
    return pa.table(
        {
            "id": pa.array(i, pa.int64()),
            "i8": pa.array(i % 100 - 50, pa.int8()),
            "i16": pa.array(i, pa.int16()),
            "i32": pa.array(-i, pa.int32()),
            "u8": pa.array(i % 256, pa.uint8()),
            "u16": pa.array(i, pa.uint16()),
            "u32": pa.array(i, pa.uint32()),
            "u64": pa.array(i.astype(np.uint64) + np.uint64(2**63), pa.uint64()),
            "nullable_int": pa.array(i, pa.int64(), mask=nulls),
            "f32": pa.array(i / 3, pa.float32()),
            "f64_nan": pa.array(np.where(i % 5 == 0, np.nan, i / 7), pa.float64(), mask=nulls),
            "flag": pa.array(i % 2 == 0, mask=nulls),
            "s": pa.array([f"s{x}" for x in i], mask=nulls),
            "ls": pa.array([f"large{x}" for x in i], pa.large_string()),
            "bin": pa.array([bytes([x % 256, 0, 1]) for x in i], pa.binary()),
            "day": pa.array(i.astype("int32"), pa.date32()),
            "ts": pa.array(i * 1_000_000, pa.timestamp("us")),
            "ts_tz": pa.array(i * 1_000_000_001, pa.timestamp("ns", tz="Europe/Paris")),
            "dec": pa.array([decimal.Decimal(int(x)) / 1000 for x in i], pa.decimal128(12, 3)),
            "cat": pa.array([f"c{x % 4}" for x in i]).dictionary_encode(),
            "lst": pa.array([list(range(int(x) % 4)) for x in i], pa.list_(pa.int64())),
            "st": pa.array(
                [{"a": int(x), "b": f"b{x}"} for x in i], pa.struct([("a", pa.int64()), ("b", pa.string())])
            ),
            "all_null": pa.nulls(rows, pa.null()),
            "all_null_int": pa.nulls(rows, pa.int32()),
        }
    )


def assert_tables_equal(actual: pa.Table, expected: pa.Table) -> None:
    """Exact equality of types and values, with NaN equal to NaN (Arrow's equals says otherwise)."""
    assert actual.schema.remove_metadata() == expected.schema.remove_metadata()
    for name in expected.column_names:
        a, e = actual[name].combine_chunks(), expected[name].combine_chunks()
        if pa.types.is_floating(e.type):
            assert a.is_null().equals(e.is_null()), name
            np.testing.assert_array_equal(a.to_numpy(zero_copy_only=False), e.to_numpy(zero_copy_only=False), name)
        elif pa.types.is_dictionary(e.type):
            assert a.dictionary_decode().equals(e.dictionary_decode()), name
        else:
            assert a.equals(e), name


def sorted_source(directory, rows: int, files: int) -> str:
    """The sorted reference dataset, as `files` Parquet files in `directory`."""
    from daskpile.datasets import reference_table

    write_parts(reference_table(0, rows, rows), directory, parts=files)
    return str(directory)


def uninterrupted_run(source, dest, piles: int, seed: int, **kwargs) -> dict[str, bytes]:
    """The part files of a plain run on the sync scheduler, to compare interrupted runs with."""
    import dask

    import daskpile

    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(source, str(dest), piles=piles, seed=seed, **kwargs)
    return file_bytes(dest)


def count_files(directory, prefix: str) -> int:
    """Files whose name starts with `prefix` anywhere below `directory` (0 if it is missing)."""
    return sum(name.startswith(prefix) for _, _, names in os.walk(directory) for name in names)


def finished_partitions(scratch) -> int:
    """Input files whose scratch pass 1 has written: a partition's file of band 0 is written last."""
    names = [name for _, _, files in os.walk(scratch) for name in files]
    return sum(name.startswith("scatter-") and name.endswith("-b0.arrow") for name in names)


def run_in_fresh_process(script: str, *args: str):
    """What ``script`` prints as JSON, run alone in a new interpreter (its memory and imports its own)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def eventually(condition, timeout: float = 10, what: str = "condition") -> None:
    """Wait until ``condition()`` is true: for what daskpile does on a thread of its own (removing dropped scratch)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout} s")
        time.sleep(0.02)


@contextlib.contextmanager
def interrupted_after(module, writer: str, files: int):
    """Fault injection: ``module.writer(table, fs, path, ...)`` raises KeyboardInterrupt, as Ctrl-C would, when
    called after ``files`` files; yields the paths written, and expects the run inside to be interrupted.

    >>> with interrupted_after(_outputs, "write", 5) as written:  # doctest: +SKIP
    ...     daskpile.shuffle_parquet(source, dest, output_format="lines")
    """
    import pytest

    real, written = getattr(module, writer), []

    def write_then_stop(*args, **kwargs):
        if len(written) == files:
            raise KeyboardInterrupt
        written.append(args[2])
        return real(*args, **kwargs)

    setattr(module, writer, write_then_stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield written
    finally:
        setattr(module, writer, real)


def resumed_as_begun(shuffle, tmp_path, monkeypatch, module, name: str, then):
    """A run begun by an earlier daskpile (``module.name`` as it was, ``then``), interrupted as its third piece is
    scattered, resumed by the daskpile of now: the resumed run's report, its bytes checked to be those the
    earlier daskpile wrote uninterrupted (``tmp_path / "before"``).  ``shuffle(dest, **kwargs)`` runs the call."""
    from daskpile.engine import _passes

    monkeypatch.setattr(module, name, then)  # as daskpile was before
    shuffle(str(tmp_path / "before"))
    with interrupted_after(_passes, "scatter_table", 2):  # (Ctrl-C as the third piece is scattered)
        shuffle(str(tmp_path / "out"), scratch=str(tmp_path / "scratch"))
    monkeypatch.undo()  # the daskpile of now resumes it
    report = shuffle(str(tmp_path / "out"), scratch=str(tmp_path / "scratch"))
    assert file_bytes(tmp_path / "out") == file_bytes(tmp_path / "before")
    return report
