import contextlib
import decimal
import gc
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import eventually, str_dtype

import daskpile


def frame(rows: int) -> pd.DataFrame:
    i = np.arange(rows)
    return pd.DataFrame(
        {
            "i8": (i % 100).astype("int8"),
            "u64": i.astype("uint64"),
            "nullable": pd.array(np.where(i % 7 == 0, None, i), dtype="Int32"),
            "f": np.where(i % 5 == 0, np.nan, i / 3),
            "b": i % 2 == 0,
            "s": [f"s{x}" for x in i],
            "cat": pd.Categorical([f"c{x % 3}" for x in i], categories=["c2", "c0", "c1"]),
            "when": pd.date_range("2024-01-01", periods=rows, freq="min", tz="UTC"),
        },
        index=pd.Index(i * 10, name="key"),
    )


@pytest.mark.slow
def test_partitions_are_piles_and_rows_keep_their_index(client):
    df = frame(1000)
    ddf = dd.from_pandas(df, npartitions=4)
    shuffled = daskpile.shuffle(ddf, piles=9, seed=3)
    assert shuffled.npartitions == 9
    out = shuffled.compute()
    assert not out.index.equals(df.index)  # really reordered
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute())
    parts = [shuffled.get_partition(j).compute() for j in range(9)]
    pd.testing.assert_frame_equal(pd.concat(parts), out)


def test_dtypes_match_meta(client):
    ddf = dd.from_pandas(frame(100), npartitions=3)
    shuffled = daskpile.shuffle(ddf, piles=2, seed=0)
    pd.testing.assert_series_equal(shuffled.dtypes, ddf.dtypes)
    pd.testing.assert_series_equal(shuffled.compute().dtypes, ddf.dtypes)


def test_after_user_transformations_and_csv(client, tmp_path):
    df = frame(300)
    df[["i8", "f", "s"]].to_csv(tmp_path / "a.csv")
    ddf = dd.read_csv(str(tmp_path / "*.csv"), blocksize=2000)
    ddf = ddf[ddf.i8 > 10].assign(g=lambda d: d.i8 * 2)
    expected = ddf.compute()
    out = daskpile.shuffle(ddf, piles=5, seed=1).compute()
    pd.testing.assert_frame_equal(out.sort_values("key").reset_index(drop=True), expected.reset_index(drop=True))


def test_read_parquet_input_to_parquet_writes_one_file_per_pile(client, tmp_path):
    frame(500).to_parquet(tmp_path / "in.parquet")
    ddf = dd.read_parquet(str(tmp_path / "in.parquet"))
    daskpile.shuffle(ddf, piles=6, seed=2).to_parquet(str(tmp_path / "out"))
    files = sorted(f for f in os.listdir(tmp_path / "out") if f.endswith(".parquet"))
    assert len(files) == 6
    back = dd.read_parquet(str(tmp_path / "out")).compute()
    pd.testing.assert_frame_equal(back.sort_index(), ddf.compute(), check_categorical=False)


def test_empty_partitions_and_empty_input(sync_scheduler):
    ddf = dd.from_pandas(frame(50), npartitions=5)
    filtered = ddf[ddf.u64 < 10]  # later partitions become empty
    out = daskpile.shuffle(filtered, piles=4, seed=0).compute()
    pd.testing.assert_frame_equal(out.sort_index(), filtered.compute())
    nothing = ddf[ddf.u64 > 10**6]
    result = daskpile.shuffle(nothing, piles=3, seed=0)
    assert result.npartitions == 3 and len(result.compute()) == 0


@pytest.mark.slow
def test_many_partitions_have_their_pile_counts_summed_in_a_tree(sync_scheduler):
    """Pass 1's counts are summed 16 partitions' at a time (one task holding 10,000 partitions' counts of 32,768
    piles would hold 5 GiB): 300 partitions, two levels of sums, every row once, each pile its counted rows."""
    ddf = dd.from_pandas(frame(3_000), npartitions=300)
    shuffled = daskpile.shuffle(ddf, piles=7, seed=0)
    graph = dict(shuffled.__dask_graph__())
    assert sum(1 for key in graph if isinstance(key, tuple) and "-sum-" in str(key[0])) == 19 + 2
    out = shuffled.compute()  # (pass 2 checks each pile's rows against the sums: "pass 1 sent it ...")
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute())


def test_single_row_and_more_piles_than_rows(sync_scheduler):
    one = dd.from_pandas(frame(1), npartitions=1)
    pd.testing.assert_frame_equal(daskpile.shuffle(one, piles=8, seed=0).compute(), one.compute())
    three = dd.from_pandas(frame(3), npartitions=1)
    out = daskpile.shuffle(three, piles=1, seed=0).compute()
    pd.testing.assert_frame_equal(out.sort_index(), three.compute())


def test_a_pile_count_dask_would_take_minutes_to_schedule_is_warned_of_at_the_call():
    """A new user's typo, piles=10**6 on 1,000 rows, ran 8 minutes and took 4.6 GB without a word."""
    small = dd.from_pandas(frame(1_000), npartitions=2)
    with pytest.warns(
        UserWarning, match=r"^piles=1,000,000: each pile is a partition of the result.*did you mean"
    ) as said:
        daskpile.shuffle(small, piles=10**6, seed=0)
    assert said[0].filename == __file__  # the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        daskpile.shuffle(small, piles=50_000, seed=0)


def test_scratch_lives_as_long_as_the_result(sync_scheduler, tmp_path):
    ddf = dd.from_pandas(frame(100), npartitions=2)
    shuffled = daskpile.shuffle(ddf, piles=3, seed=0, scratch=str(tmp_path))
    derived = shuffled[["s"]]
    del shuffled
    gc.collect()
    assert len(derived.compute()) == 100
    (run_dir,) = list(tmp_path.iterdir())
    (variant,) = [p for p in run_dir.iterdir() if p.is_dir()]  # the shuffle of column s alone: the projection
    assert sorted(p.name for p in run_dir.iterdir() if p.is_file()) == ["_daskpile.session.json"]  # went below
    assert sorted(p.name for p in variant.iterdir()) == [
        "_scattered.json",
        "scatter-000000.arrow",
        "scatter-000001.arrow",
    ]
    del derived
    gc.collect()
    eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")


@pytest.mark.parametrize("taken", ["values", "to_dask_array", "delayed", "to_delayed"])
def test_a_graph_taken_out_of_a_dropped_result_says_to_keep_the_result(sync_scheduler, tmp_path, taken):
    """``y = daskpile.shuffle(ddf)["label"].values``, the result itself dropped at once, failed with a bare
    FileNotFoundError of a scratch path: the result's scratch went with it, though the array's graph read it."""
    ddf = dd.from_pandas(frame(100), npartitions=2)
    shuffled = daskpile.shuffle(ddf, piles=3, seed=0, scratch=str(tmp_path))
    graph = {
        "values": lambda result: result["u64"].values,
        "to_dask_array": lambda result: result[["u64"]].to_dask_array(),
        "delayed": lambda result: dask.delayed(lambda f: f["u64"].to_numpy())(result),
        "to_delayed": lambda result: dask.delayed(np.concatenate)([d["u64"].values for d in result.to_delayed()]),
    }[taken](shuffled)
    del shuffled
    gc.collect()
    eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")
    with pytest.raises(FileNotFoundError, match="was dropped, and its scratch with it; keep the shuffled DataFrame"):
        graph.compute()


@pytest.mark.slow
def test_scratch_is_removed_when_the_shuffle_is_a_scripts_last_line(tmp_path):
    """The removal runs on a thread of its own; started by the collector just before exit, it was killed with
    the interpreter (half the runs of a new user's script left their scratch in /tmp).  A removal slowed down
    here makes the race certain."""
    source = tmp_path / "src"
    source.mkdir()
    pd.DataFrame({"x": range(1000)}).to_parquet(source / "part.parquet")
    script = f"""
        import time, dask, dask.dataframe as dd, daskpile
        from daskpile.engine._scratch import Scratch
        remove = Scratch.remove
        Scratch.remove = lambda self: (time.sleep(0.5), remove(self))[1]
        dask.config.set(scheduler="threads")
        daskpile.shuffle(dd.read_parquet({str(source)!r}), piles=3, seed=1, scratch={str(tmp_path / "scratch")!r}
        ).to_parquet({str(tmp_path / "out")!r})
    """
    (tmp_path / "scratch").mkdir()
    subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=True, capture_output=True)
    assert list((tmp_path / "scratch").iterdir()) == []
    assert len(pd.read_parquet(tmp_path / "out")) == 1000


SESSION = """
    import os, signal, sys, dask, dask.dataframe as dd, daskpile
    dask.config.set(scheduler="sync")
    shuffled = daskpile.shuffle(dd.read_parquet(sys.argv[2]), piles=3, seed=1, scratch=sys.argv[3])
    shuffled.partitions[0].compute()  # (pass 1's files written)
    print("ready", flush=True)
    if sys.argv[1] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[1] == "ended":  # (as killed, but as a pid namespace's first process, which SIGKILL spares)
        os._exit(0)
    sys.stdin.readline()
"""


def started_session(how: str, scratch, *before: str) -> tuple[subprocess.Popen, pathlib.Path]:
    """A Python session that shuffles a DataFrame, its scratch in ``scratch``, then is ``killed``, ``ended`` or
    ``live`` until a line comes on its stdin; and its scratch directory.  ``before``: a command it runs under."""
    source = scratch.parent / "src"
    if not source.exists():
        source.mkdir()
        pd.DataFrame({"x": range(1000)}).to_parquet(source / "part.parquet")
    there = set(scratch.iterdir())
    args = [*before, sys.executable, "-c", textwrap.dedent(SESSION), how, str(source), str(scratch)]
    session = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert session.stdout.readline() == "ready\n"
    (directory,) = set(scratch.iterdir()) - there
    return session, directory


@pytest.mark.slow
def test_the_scratch_of_a_killed_session_goes_at_the_next_shuffle_and_with_clean(sync_scheduler, tmp_path):
    """A notebook's kernel killed (out of memory, SIGKILL, SIGTERM) removed nothing: its scratch, as large as its
    data, stayed in /tmp for ever, and ``daskpile clean`` kept it as a live session's.  A live one keeps its own."""
    from daskpile.engine._clean import clean

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    killed, killed_directory = started_session("killed", scratch)
    live, live_directory = started_session("live", scratch)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    try:
        said = {pathlib.Path(leftover.url).name: leftover for leftover in clean(str(scratch), dry_run=True)}
        of_killed, of_live = said[killed_directory.name], said[live_directory.name]
        assert of_killed.removable and f"whose Python session ended (process {killed.pid} on " in of_killed.reason
        assert not of_live.removable and "of a live Python session" in of_live.reason

        kept = daskpile.shuffle(dd.from_pandas(frame(10), npartitions=1), piles=2, seed=0, scratch=str(scratch))
        eventually(lambda: not killed_directory.exists(), what="the killed session's scratch removed")
        assert live_directory.exists() and len(list(scratch.iterdir())) == 2
        assert len(kept.compute()) == 10
    finally:
        live.communicate("\n", timeout=60)
    assert live.returncode == 0 and not live_directory.exists()  # (removed at its exit, as ever)


@pytest.mark.slow
def test_the_scratch_of_a_session_in_another_pid_namespace_is_kept(sync_scheduler, tmp_path):
    """Two containers of a pod share a host name, and may share /tmp, but not their pids: a session of the other
    one cannot be told to have ended (its pid 1 is this one's init), so its scratch stays."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    try:
        elsewhere, directory = started_session("ended", scratch, "unshare", "--pid", "--fork", "--mount-proc")
    except (OSError, AssertionError) as e:
        pytest.skip(f"no pid namespace of its own here (unshare --pid needs root on Linux): {e}")
    assert elsewhere.wait(timeout=60) == 0 and directory.exists()
    kept = daskpile.shuffle(dd.from_pandas(frame(10), npartitions=1), piles=2, seed=0, scratch=str(scratch))
    assert len(kept.compute()) == 10
    time.sleep(0.5)  # (what a removal would have had: the one above took 20 ms)
    assert directory.exists()
    from daskpile.engine._clean import clean

    (leftover,) = [lo for lo in clean(str(scratch), dry_run=True) if lo.url.endswith(directory.name)]
    assert not leftover.removable and "of a Python session this machine cannot judge" in leftover.reason


def planted(root: pathlib.Path, name: str, record) -> pathlib.Path:
    """A folder named as shuffle(ddf)'s scratch, its session record ``record`` (bytes, or a callable that makes
    the record's path), a file of rows beside it."""
    folder = root / f"daskpile-{name}"
    (folder / "v").mkdir(parents=True)
    (folder / "v" / "scatter-000000.arrow").write_bytes(b"rows")
    session = folder / "_daskpile.session.json"
    session.write_bytes(record) if isinstance(record, bytes) else record(session)
    return folder


def test_the_sweep_of_ended_sessions_judges_only_this_users_folders_and_survives_what_is_planted(tmp_path):
    """A review: another user's folder readable in a shared root was judged (and, with /proc's hidepid, a live
    one removed); a FIFO planted as a record hung every shuffle() and ``daskpile clean`` on the machine, a link
    to /dev/zero read for ever, a pid of -1 or a record nested 100,000 deep failed them."""
    import json
    import socket
    import threading

    from daskpile.engine import _session
    from daskpile.engine._clean import clean

    ended = json.dumps({"pid": 2**22 + 1, "started": 1, "host": socket.gethostname(), "pids": _session._pid_space()})
    root = tmp_path / "shared"
    folders = {
        "fifo": planted(root, "000000000000f1f0", lambda path: os.mkfifo(path)),
        "link": planted(root, "00000000000011c0", lambda path: path.symlink_to("/dev/zero")),
        "pid": planted(root, "00000000000000d1", json.dumps({"pid": -1, "started": 1, "host": "h"}).encode()),
        "deep": planted(root, "00000000000000dd", b"[" * 100_000),
    }
    if os.geteuid() == 0:  # (another user's folder, as root can make one)
        folders["other"] = planted(root, "0000000000000be5", ended.encode())
        for path in [folders["other"], *folders["other"].rglob("*")]:
            os.chown(path, 65534, 65534, follow_symlinks=False)
    mine = planted(root, "00000000000000e5", ended.encode())  # (this user's, ended: the one to remove)
    results = []
    judging = threading.Thread(target=lambda: results.append(_session.ended_sessions(str(root))), daemon=True)
    judging.start()
    judging.join(30)
    assert results == [[(str(mine), _session.owner(fsspec_local(), str(mine)))]]
    said = {pathlib.Path(leftover.url).name: leftover for leftover in clean(str(root), dry_run=True)}
    assert [name for name, leftover in said.items() if leftover.removable] == [mine.name]
    daskpile.shuffle(dd.from_pandas(frame(10), npartitions=1), piles=2, seed=0, scratch=str(root))
    eventually(lambda: not mine.exists(), what="the ended session's scratch removed")
    assert all(folder.exists() for folder in folders.values())


def fsspec_local():
    import fsspec

    return fsspec.filesystem("file")


def test_clean_keeps_a_live_sessions_scratch_whatever_its_age(sync_scheduler, tmp_path):
    """A review: ``daskpile clean --older-than 1d`` removed the scratch of a live session idle for two days (its
    files are read, not written), as "no run description", which it knew to be a live session's."""
    from daskpile.engine._clean import clean

    shuffled = daskpile.shuffle(dd.from_pandas(frame(100), npartitions=2), piles=2, seed=0, scratch=str(tmp_path))
    shuffled.compute()
    two_days_ago = time.time() - 2 * 86400
    for path in [*tmp_path.rglob("*"), tmp_path]:
        os.utime(path, (two_days_ago, two_days_ago))
    (leftover,) = clean(str(tmp_path), older_than="1d", dry_run=True)
    assert not leftover.removable and "of a live Python session" in leftover.reason, leftover


def test_not_a_dataframe():
    """A Polars user's trial: "got DataFrame" named no library, and shuffle_parquet's message sent a frame in
    memory to daskpile.shuffle, which refused it."""
    with pytest.raises(TypeError, match=r"got a pandas DataFrame: one in memory shuffles there .*shuffle_parquet$"):
        daskpile.shuffle(pd.DataFrame({"x": [1]}), piles=2)
    with pytest.raises(TypeError, match=r"dask DataFrame, got int$"):
        daskpile.shuffle(3, piles=2)
    series = dd.from_pandas(pd.DataFrame({"x": range(6)}), npartitions=2)["x"]
    with pytest.raises(TypeError, match=r"got a dask Series: shuffle series.to_frame\(\), then take its column$"):
        daskpile.shuffle(series, piles=2)
    assert sorted(daskpile.shuffle(series.to_frame(), piles=2)["x"].compute()) == list(range(6))  # as said
    with pytest.raises(ValueError, match="piles"):
        daskpile.shuffle(dd.from_pandas(frame(4), npartitions=1), piles=0)


def test_threaded_scheduler_without_a_client():
    ddf = dd.from_pandas(frame(200), npartitions=3)
    with dask.config.set(scheduler="threads"):
        out = daskpile.shuffle(ddf, piles=4, seed=0).compute()
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute(scheduler="sync"))


# Parquet files of uneven sizes, as a user's directory holds them: one empty, one row, one file of 20 row groups.
UNEVEN_ROWS = [5000, 0, 20000, 1, 3000]


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = tmp_path_factory.mktemp("uneven")
    start = 0
    for k, rows in enumerate(UNEVEN_ROWS):
        ids = np.arange(start, start + rows)
        start += rows
        table = pa.table(
            {
                "id": ids,
                "label": (ids % 2).astype("int8"),
                "s": [f"s{x}" for x in ids],
                "cat": pa.array([f"c{x % 3}" for x in ids]).dictionary_encode(),
                "f": ids / 7,
            }
        )
        pq.write_table(table, directory / f"part-{k}.parquet", row_group_size=1000 if rows == 20000 else None)
    return str(directory)


INPUTS = {
    "read_parquet": lambda d: dd.read_parquet(d),
    "columns=": lambda d: dd.read_parquet(d, columns=["id", "label"]),
    "split_row_groups": lambda d: dd.read_parquet(d, split_row_groups=True),
    "blocksize": lambda d: dd.read_parquet(d, blocksize="64KiB"),
    "projection before": lambda d: dd.read_parquet(d)[["id", "s"]],
    "filter before": lambda d: (lambda x: x[x.label == 1])(dd.read_parquet(d)),
    # Dask fuses a read of few columns, and aligns the filter's or assign's other side to the fused count:
    # undoing the fusion afterwards left that side misaligned ("Mismatched divisions")
    "columns=, then a filter": lambda d: (lambda x: x[x.label == 1])(dd.read_parquet(d, columns=["id", "label"])),
    "columns=, then assign": lambda d: (lambda x: x.assign(g=x.f - x.f.mean()))(
        dd.read_parquet(d, columns=["id", "f"])
    ),
    "columns=, then isin": lambda d: (lambda x: x[x.label.isin([1])])(dd.read_parquet(d, columns=["id", "label"])),
    "repartition before": lambda d: dd.read_parquet(d).repartition(npartitions=3),
    "persist before": lambda d: dd.read_parquet(d).persist(),
}


def as_meta_says(computed: pd.DataFrame, ddf: dd.DataFrame) -> pd.DataFrame:
    """Dask's own compute of a projected read_parquet gives object strings where its meta says string."""
    plain = np.dtype(object)
    return computed.astype({c: t for c, t in ddf.dtypes.items() if computed[c].dtype == plain and t != plain})


@pytest.mark.slow
@pytest.mark.parametrize("make", INPUTS.values(), ids=INPUTS.keys())
def test_every_row_once_whatever_the_optimizer_does_and_the_same_order_everywhere(uneven, make, request):
    """Every row once, dtypes intact, and one order for a seed on sync, threads and a LocalCluster.

    The scratch layout follows the partitions pass 1 sees after Dask's optimizer
    fused or split them, never a count taken when ``shuffle`` was called.
    """
    orders = {}
    for where in ["sync", "threads", "LocalCluster"]:  # the client last: it stays current once made
        if where == "LocalCluster":
            request.getfixturevalue("client")
        with dask.config.set(scheduler=where) if where != "LocalCluster" else contextlib.nullcontext():
            ddf = make(uneven)
            expected = as_meta_says(ddf.compute(), ddf)
            shuffled = daskpile.shuffle(ddf, piles=16, seed=5)
            out = shuffled.compute()
            pd.testing.assert_series_equal(out.dtypes, expected.dtypes)
            pd.testing.assert_frame_equal(out.sort_values("id"), expected.sort_values("id"), check_index_type=False)
            assert not out["id"].is_monotonic_increasing
            # a projection after the shuffle gives the same rows in the same order
            np.testing.assert_array_equal(shuffled["id"].compute().to_numpy(), out["id"].to_numpy())
            orders[where] = out["id"].to_numpy()
    np.testing.assert_array_equal(orders["sync"], orders["threads"])
    np.testing.assert_array_equal(orders["sync"], orders["LocalCluster"])


def test_a_projection_of_a_persisted_random_input_gives_the_whole_result_s_rows(sync_scheduler):
    """A projection is another shuffle with a pass 1 of its own (the docs say so): over an input that draws
    random numbers, it gave other rows than the whole result; persisted, the input gives the same rows."""
    frame = pd.DataFrame({"id": np.arange(4_000), "v": np.arange(4_000) * 0.5})

    def subsample(part: pd.DataFrame) -> pd.DataFrame:
        return part[np.random.random(len(part)) < 0.5]  # the global generator: other rows each compute

    def shuffled(persist: bool):
        ddf = dd.from_pandas(frame, npartitions=4).map_partitions(subsample)
        return daskpile.shuffle(ddf.persist() if persist else ddf, piles=3, seed=1)

    np.random.seed(0)
    volatile = shuffled(persist=False)
    # the projection's own pass 1 draws the input again: other rows (this line pins what the docs say)
    assert set(volatile["id"].compute()) != set(volatile.compute()["id"])
    stable = shuffled(persist=True)
    whole = stable.compute()
    np.testing.assert_array_equal(stable["id"].compute().to_numpy(), whole["id"].to_numpy())
    np.testing.assert_array_equal(stable.reset_index(drop=True)["v"].compute().to_numpy(), whole["v"].to_numpy())


def test_to_parquet_after_the_shuffle_writes_the_piles_in_order(uneven, tmp_path, sync_scheduler):
    # Not the categorical column: Dask's meta of it has no categories, so Dask's to_parquet refuses it
    # (dd.read_parquet(uneven).to_parquet(...) fails the same way, without daskpile).
    shuffled = daskpile.shuffle(dd.read_parquet(uneven, columns=["id", "label", "s", "f"]), piles=6, seed=2)
    shuffled.to_parquet(str(tmp_path / "out"))
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert len(files) == 6
    back = pd.concat([pd.read_parquet(f) for f in files])
    np.testing.assert_array_equal(back["id"].to_numpy(), shuffled.compute()["id"].to_numpy())


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["threads", "local cluster"])
def test_a_to_parquet_that_fails_shows_no_pile_even_after_the_tasks_still_running(request, tmp_path, scheduler):
    """A new user's trial: a value one pile cannot write (a string in a column of ints) failed the write with 8
    of 16 piles in dest, which every reader took for the dataset; piles still being written appeared after the
    error, one in a folder the user had removed. Piles are shown together by the write's last task now."""
    if scheduler == "local cluster":
        request.getfixturevalue("client")
    values = np.arange(40_000).astype(object)
    values[5] = "oops"
    df = pd.DataFrame({"id": np.arange(40_000), "v": values})
    dest = tmp_path / "out"
    on_threads = {"scheduler": "threads"} if scheduler == "threads" else {}
    with dask.config.set({"dataframe.convert-string": False, **on_threads}):  # (else Dask makes "v" strings)
        shuffled = daskpile.shuffle(dd.from_pandas(df, npartitions=4), piles=16, seed=1)
        with pytest.raises(Exception, match="Could not convert 'oops'"):
            shuffled.to_parquet(str(dest), schema=None)
    shown = lambda: [n for n in os.listdir(dest) if not n.startswith(".")] if dest.exists() else []  # noqa: E731
    assert shown() == []
    shutil.rmtree(dest)  # as a user cleaning up would: the tasks still running bring no folder back
    time.sleep(2)
    assert not dest.exists()
    # Computed later (compute=False), a failed write leaves its piles hidden; the next write of those names
    # removes them, and one that does not fail shows them all
    with dask.config.set({"dataframe.convert-string": False, **on_threads}):
        later = shuffled.to_parquet(str(dest), schema=None, compute=False)
        with pytest.raises(Exception, match="Could not convert 'oops'"):
            dask.compute(later)
    assert shown() == []
    time.sleep(2)  # (its pile tasks still running, as above, would leave theirs after the next write's removal)
    good = daskpile.shuffle(dd.from_pandas(df.assign(v=df["id"]), npartitions=4), piles=16, seed=1)
    good.to_parquet(str(dest))
    assert sorted(os.listdir(dest)) == sorted(f"part.{i}.parquet" for i in range(16))
    assert len(dd.read_parquet(str(dest))) == 40_000


def test_to_parquet_of_names_in_folders_and_its_last_task_run_twice(tmp_path, sync_scheduler):
    """A name_function's folders are made (the review: a pile's temporary was written in a folder not made);
    the write's last task, run again (a retry), leaves the piles it showed as they are."""
    from daskpile.dataframe._to_parquet import show_piles

    shuffled = daskpile.shuffle(dd.from_pandas(frame(1_000), npartitions=2), piles=3, seed=0)
    shuffled.to_parquet(str(tmp_path / "out"), name_function=lambda i: f"sub/part-{i}.parquet")
    assert sorted(os.listdir(tmp_path / "out" / "sub")) == [f"part-{i}.parquet" for i in range(3)]
    pd.testing.assert_frame_equal(dd.read_parquet(str(tmp_path / "out" / "sub")).compute(), shuffled.compute())
    shuffled.to_parquet(str(tmp_path / "again"))
    before = {name: (tmp_path / "again" / name).read_bytes() for name in os.listdir(tmp_path / "again")}
    shown = [[{"shown_as": (str(tmp_path / "again" / f".part.{i}.parquet.0123456789ab.tmp"),
                             str(tmp_path / "again" / f"part.{i}.parquet"))}] for i in range(3)]  # fmt: skip
    show_piles(shown, None, None, str(tmp_path / "again"), None, False, False, None)  # (as its retry would)
    assert {name: (tmp_path / "again" / name).read_bytes() for name in os.listdir(tmp_path / "again")} == before
    assert sorted(os.listdir(tmp_path / "again")) == [f"part.{i}.parquet" for i in range(3)]


def test_to_parquet_is_one_task_per_input_partition_and_per_pile(uneven):
    """Reading a partition and its pass 1 are one task, a pile's pass 2 and its write another (fused)."""
    from dask.utils import key_split

    write = daskpile.shuffle(dd.read_parquet(uneven), piles=6, seed=2).to_parquet("unused", compute=False)
    names = [key_split(k) for k in write.__dask_graph__()]
    assert len(names) == len(UNEVEN_ROWS) + 1 + 6 + 1, sorted(set(names))  # + the pass-1 summary, + the barrier
    assert "toparquetdata" not in names and "daskpile-gather" not in names


def test_to_parquet_writes_what_dasks_writer_writes_snappy_only_where_it_pays(tmp_path, sync_scheduler):
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"id": np.arange(40_000), "noise": rng.random(40_000), "word": ["ab"] * 40_000})
    shuffled = daskpile.shuffle(dd.from_pandas(df, npartitions=3), piles=2, seed=4)
    shuffled.to_parquet(str(tmp_path / "ours"))
    dd.DataFrame.to_parquet(shuffled, str(tmp_path / "dask"), write_statistics=False, use_dictionary=False)
    for name in ("part.0.parquet", "part.1.parquet"):
        ours, theirs = pq.ParquetFile(tmp_path / "ours" / name), pq.ParquetFile(tmp_path / "dask" / name)
        said = dict(ours.schema_arrow.metadata)  # Dask's, and the shuffle's stamp (a loader's state names it)
        assert said.pop(b"daskpile.shuffle") == b'{"seed": 4, "piles": 2}'
        assert ours.schema_arrow.with_metadata(said).equals(theirs.schema_arrow, check_metadata=True)
        assert ours.read().equals(theirs.read())
        codecs = {ours.schema_arrow.names[i]: ours.metadata.row_group(0).column(i).compression for i in range(4)}
        assert codecs == {"id": "SNAPPY", "noise": "UNCOMPRESSED", "word": "SNAPPY", "__null_dask_index__": "SNAPPY"}
    assert sorted(os.listdir(tmp_path / "ours")) == ["part.0.parquet", "part.1.parquet"]  # no temporary file left
    pd.testing.assert_frame_equal(dd.read_parquet(str(tmp_path / "ours")).compute(), shuffled.compute())
    # a codec given wins, on every column
    shuffled.to_parquet(str(tmp_path / "zstd"), compression="zstd")
    meta = pq.ParquetFile(tmp_path / "zstd" / "part.0.parquet").metadata.row_group(0)
    assert {meta.column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    # Dask's names of its pyarrow engine are this one (its default codec reached pyarrow as a codec's name)
    for engine in ("pyarrow", "auto"):
        shuffled.to_parquet(str(tmp_path / engine), engine=engine)
        assert pq.read_table(tmp_path / engine / "part.0.parquet").equals(
            pq.read_table(tmp_path / "ours" / "part.0.parquet")
        )


def test_an_index_dropped_after_the_shuffle_is_not_shuffled_and_the_rows_keep_their_order(tmp_path):
    import pyarrow.ipc as ipc

    ddf = dd.from_pandas(frame(3000), npartitions=3)
    shuffled = daskpile.shuffle(ddf, piles=4, seed=6, scratch=str(tmp_path / "scratch"))
    with dask.config.set(scheduler="sync"):
        piles = [shuffled.partitions[j].compute() for j in range(4)]
        dropped = shuffled.reset_index(drop=True).compute()
        shuffled.to_parquet(str(tmp_path / "out"), write_index=False)
    pd.testing.assert_frame_equal(dropped, pd.concat([p.reset_index(drop=True) for p in piles]))
    written = dd.read_parquet(str(tmp_path / "out")).compute()
    pd.testing.assert_frame_equal(
        written.reset_index(drop=True), dropped.reset_index(drop=True), check_categorical=False
    )
    schemas = {}
    for path in (tmp_path / "scratch").glob("*/*/scatter-*.arrow"):
        with ipc.open_file(str(path)) as reader:
            schemas.setdefault(path.parent.name, reader.schema.names)
    # the whole frame with its index ("0"), and the frame without it (twice: compute and to_parquet share it)
    assert sorted(schemas.values()) == [[str(i) for i in range(9)], [str(i) for i in range(1, 9)]]


@pytest.mark.slow
def test_pass_2_keeps_scratch_files_open_between_piles_and_closes_them_once_idle(sync_scheduler, monkeypatch):
    from daskpile.engine import _scratch

    # Idle for 2 s, not less: a loaded machine may take longer than a fraction of a second between two piles
    monkeypatch.setattr(_scratch, "IDLE_SECONDS", 2.0)
    opened = []
    real_open = _scratch._open_scratch
    monkeypatch.setattr(_scratch, "_open_scratch", lambda *a: opened.append(a[1]) or real_open(*a))
    ddf = dd.from_pandas(frame(2000), npartitions=4)
    first, second = daskpile.shuffle(ddf, piles=5, seed=1), daskpile.shuffle(ddf, piles=3, seed=1)
    first.persist(), second.persist()  # pass 1 of each
    opened.clear()
    piles = [first.partitions[j].compute() for j in range(5)] + [second.partitions[j].compute() for j in range(3)]
    reader = _scratch._OPEN_RUN.reader  # (checked after the frames below, which may take longer than idle)
    assert len(opened) == 2 * 4  # each run's 4 files, once, not once per pile
    assert reader is not None and not reader.mapped  # pages mapped between tasks would stay in a worker's memory
    pd.testing.assert_frame_equal(pd.concat(piles[:5]).sort_index(), ddf.compute())
    pd.testing.assert_frame_equal(pd.concat(piles[5:]).sort_index(), ddf.compute())
    # closed once idle (a removed file's space is freed); a timer armed by an earlier test may still run with the
    # default delay
    eventually(lambda: _scratch._OPEN_RUN.reader is None, timeout=10, what="the scratch files closed once idle")


def test_a_projection_is_pushed_below_the_shuffle_so_only_its_columns_are_read_and_shuffled(uneven, tmp_path):
    import pyarrow.ipc as ipc

    shuffled = daskpile.shuffle(dd.read_parquet(uneven), piles=4, seed=1, scratch=str(tmp_path))
    projected = shuffled[["id", "label"]]
    (read,) = [e for e in projected.optimize(fuse=False).expr.walk() if type(e).__name__.startswith("ReadParquet")]
    assert read.operand("columns") == ["id", "label"]
    with dask.config.set(scheduler="sync"):
        projected.compute()
    (variant,) = [p for p in next(tmp_path.iterdir()).iterdir() if p.is_dir()]
    for scratch_file in variant.glob("scatter-*.arrow"):
        with ipc.open_file(str(scratch_file)) as reader:
            assert reader.schema.names == ["0", "1", "2"]  # the index, id and label: nothing else was shuffled


def _features_and_labels(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    data = pd.DataFrame({"row": np.arange(n), "user": rng.integers(0, 100, n), "score": rng.random(n)})
    return data.assign(label=data["row"], ts=rng.integers(0, n // 3, n))  # label is row, to see alignment; ts ties


def test_projections_of_a_frame_aligned_to_a_groupby_transform_come_out_in_its_order(sync_scheduler, tmp_path):
    """Features and labels taken as two projections (as a training script does) are row by row the same rows.

    A column that needs no groupby-transform let Dask's optimizer drop the shuffles that aligned the frame to
    it, so pass 1 of ``s["label"]`` saw other partitions: 19,996 of 20,000 rows misaligned, silently.
    """
    ddf = dd.from_pandas(_features_and_labels(20_000), npartitions=6)
    ddf = ddf.assign(user_mean=ddf.groupby("user").score.transform("mean", meta=("score", "f8")))
    shuffled = daskpile.shuffle(ddf, piles=4, seed=1, scratch=str(tmp_path))
    features = shuffled[["row", "user_mean"]].compute()
    labels = shuffled["label"].compute()
    whole = shuffled.compute()
    assert (features["row"].to_numpy() == labels.to_numpy()).all()
    assert (whole["row"].to_numpy() == labels.to_numpy()).all()
    assert not (whole["row"].to_numpy() == np.arange(20_000)).all()


@pytest.mark.parametrize("unstable", ["set_index", "sort_values"])
def test_projections_of_an_input_whose_ties_move_read_the_pass_1_of_the_whole_result(sync_scheduler, unstable):
    """Dask's set_index and sort_values give tied rows in another order at each compute: a projection that
    ran a pass 1 of its own drew other piles for them (about two thirds of the rows misaligned)."""
    ddf = dd.from_pandas(_features_and_labels(30_000), npartitions=6, sort=False)
    ddf = ddf.set_index("ts") if unstable == "set_index" else ddf.sort_values("ts")
    shuffled = daskpile.shuffle(ddf, piles=4, seed=1)
    features, labels = shuffled[["row", "score"]].compute(), shuffled["label"].compute()
    assert (features["row"].to_numpy() == labels.to_numpy()).all()
    assert (shuffled.compute()["row"].to_numpy() == labels.to_numpy()).all()


@pytest.mark.parametrize("made", ["filtered and assigned", "persisted", "from delayed objects"])
def test_a_projection_of_an_input_made_partition_by_partition_is_still_pushed_below(sync_scheduler, made):
    data = _features_and_labels(1_000)
    ddf = dd.from_pandas(data, npartitions=3)
    if made == "filtered and assigned":
        ddf = ddf[ddf.score > 0.1].assign(twice=lambda d: d.score * 2)
    elif made == "persisted":
        ddf = ddf.persist()
    else:
        ddf = dd.from_delayed([dask.delayed(data.iloc)[k : k + 500] for k in (0, 500)], meta=data.iloc[:0])
    projected = daskpile.shuffle(ddf, piles=2, seed=1)[["row"]].expr.simplify()
    (shuffle,) = [e for e in projected.walk() if type(e).__name__ == "PileShuffle"]
    assert list(shuffle.frame.columns) == ["row"]


@pytest.mark.slow
def test_piles_auto_refuses_piles_far_over_its_plan_when_the_partitions_measured_were_small(sync_scheduler):
    """plan_piles measures partitions 0, 2 and 4 of 5; 1 and 3 are 200 times larger.  The plan (a pile of
    about 80 KiB) would have given a pile of 12 MiB, 190 times its budget, with no word of it."""
    parts = [frame(1_000 if k % 2 == 0 else 200_000)[["u64", "f"]] for k in range(5)]
    ddf = dd.concat([dd.from_pandas(p, npartitions=1) for p in parts])
    planned = r"piles='auto' planned \d+ piles? for about 5,000 rows .* Pass piles=\d+ \(or more\)"
    with pytest.raises(daskpile.PileTooLargeError, match=planned):
        daskpile.shuffle(ddf, piles="auto", memory_per_pile=2**16, seed=1).compute()
    assert len(daskpile.shuffle(ddf, piles=3, seed=1).compute()) == 403_000  # a pile count: no plan to hold to
    even = dd.from_pandas(frame(60_000)[["u64", "f"]], npartitions=6)
    assert len(daskpile.shuffle(even, piles="auto", memory_per_pile=2**18, seed=1).compute()) == 60_000


def test_the_result_is_a_dask_expression_with_known_partitions_meta_and_named_tasks(uneven):
    from dask.utils import key_split

    ddf = dd.read_parquet(uneven)
    shuffled = daskpile.shuffle(ddf, piles=7, seed=1)
    assert shuffled.npartitions == 7
    assert shuffled.divisions == (None,) * 8 and not shuffled.known_divisions
    pd.testing.assert_frame_equal(shuffled._meta, ddf._meta)
    assert "PileShuffle(piles=7, seed=1)" in repr(shuffled.expr)
    names = {key_split(k) for k in shuffled.__dask_graph__()}
    assert {"daskpile-scatter", "daskpile-scattered", "daskpile-gather"} <= names
    # count() of the whole result skips the shuffle; of one pile, it counts that pile
    walked = shuffled.count().optimize(fuse=False).expr.walk()
    assert not any(type(e).__name__ in ("PileShuffle", "GatherPiles") for e in walked)
    assert shuffled.count().compute()["id"] == sum(UNEVEN_ROWS)
    with dask.config.set(scheduler="sync"):
        assert shuffled.partitions[2].count().compute()["id"] == len(shuffled.partitions[2].compute())


def test_pass_1_runs_once_for_the_life_of_the_result(uneven, sync_scheduler):
    """Reading the piles one at a time reads the input once, not once per pile."""
    from dask.callbacks import Callback

    reads = []
    source = dd.read_parquet(uneven)
    ddf = source.map_partitions(lambda frame: reads.append(len(frame)) or frame, meta=source._meta)
    shuffled = daskpile.shuffle(ddf, piles=8, seed=3)
    scattered = []
    with Callback(posttask=lambda key, *_: scattered.append(key)):
        piles = [shuffled.partitions[j].compute() for j in range(8)]
        whole = shuffled.compute()
    assert len(reads) == len(UNEVEN_ROWS)
    assert sum(str(k[0] if isinstance(k, tuple) else k).startswith("daskpile-scatter-") for k in scattered) == 5
    pd.testing.assert_frame_equal(pd.concat(piles), whole)


def test_scratch_is_removed_after_a_failed_compute_once_the_result_is_gone(sync_scheduler, tmp_path):
    def fail_on_the_third(frame, partition_info=None):
        if partition_info["number"] == 2:
            raise RuntimeError("boom")
        return frame

    ddf = dd.from_pandas(frame(100), npartitions=4)
    ddf = ddf.map_partitions(fail_on_the_third, meta=ddf._meta)
    shuffled = daskpile.shuffle(ddf, piles=3, seed=0, scratch=str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        shuffled.compute()
    assert len(list(tmp_path.iterdir())) == 1
    del shuffled
    gc.collect()
    eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")


def _slow(frame):
    time.sleep(0.3)
    return frame


@pytest.mark.slow
@pytest.mark.parametrize("how", ["persist", "client.compute"])
def test_a_result_still_computing_keeps_its_scratch_when_the_shuffle_is_dropped(client, tmp_path, how):
    """The shuffle is garbage-collected while its piles are being computed: they complete, then scratch goes.

    A ``client.compute`` future is the key of the concatenated result, not of a pile.
    """
    ddf = dd.from_pandas(frame(2000), npartitions=6).map_partitions(_slow)
    expected = ddf.compute()
    shuffled = daskpile.shuffle(ddf, piles=5, seed=4, scratch=str(tmp_path))
    running = shuffled.persist() if how == "persist" else client.compute(shuffled)
    del shuffled
    gc.collect()
    out = running.compute() if how == "persist" else running.result(timeout=60)
    pd.testing.assert_frame_equal(out.sort_index(), expected)
    del running
    eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")


def test_a_partition_that_disagrees_with_the_meta_is_aligned_by_label_or_refused_by_name(sync_scheduler):
    swapped = dd.from_pandas(pd.DataFrame({"a": [0, 1], "b": [1000, 1001]}), npartitions=1)
    swapped = swapped.map_partitions(lambda f: f[["b", "a"]], meta=swapped._meta, enforce_metadata=False)
    out = daskpile.shuffle(swapped, piles=1, seed=0).compute()
    assert out.sort_index().to_dict("list") == {"a": [0, 1], "b": [1000, 1001]}
    floats = dd.from_pandas(pd.DataFrame({"a": [0, 1, 2]}), npartitions=3)
    floats = floats.map_partitions(lambda f: f.assign(a=f.a + 0.5 * (f.a == 2)), meta=floats._meta)  # says int64
    with pytest.raises(TypeError, match="column 'a' of a partition is float64, the DataFrame's meta says int64"):
        daskpile.shuffle(floats, piles=1, seed=0).compute()
    # which one, of hundreds, a trial could not tell
    with pytest.raises(TypeError, match=r"meta= that matches.*\(found in partition 2\)$"):
        daskpile.shuffle(floats, piles=1, seed=0).compute()


# (partition values, the meta's dtype): each cast would change a value, so each is refused by name
CHANGED_BY_THE_META = {
    "int64 past int32": (pd.array([1, 5_000_000_000]), "int32"),
    "int64 past int8": (pd.array([300, 70_000]), "int8"),
    "float64 past float32": (np.array([1e-60, 1e300]), "float32"),
    "float64 rounded by float32": (np.array([0.1]), "float32"),
    "fractions under int64": (np.array([0.5]), "int64"),
    "int64 past 2**53 under float64": (np.array([2**53 + 1]), "float64"),
    "uint64 past int64": (np.array([2**63 + 1], dtype=np.uint64), "int64"),
    "nullable past Int8": (pd.array([300, None], dtype="Int64"), "Int8"),
    "missing under int64": (pd.array([1, None], dtype="Int64"), "int64"),
    # as read_parquet gives missing values of a nullable column (NaN, None), but values the meta cannot hold
    "fractions beside NaN under int64": (np.array([0.5, np.nan]), "int64"),
    "300 beside NaN under uint8": (np.array([300, np.nan]), "uint8"),
    # ids of a file with a missing id, which Dask's reader rounded: they came back as Int64 that looked exact
    "floats past 2**53 beside NaN under int64": (np.array([2.0**60, np.nan]), "int64"),
    "2**53 beside NaN under int64": (np.array([2.0**53, np.nan]), "int64"),  # (2**53 + 1, rounded)
    "text beside None under bool": (np.array(["yes", None], dtype=object), "bool"),
    "ints under datetime64": (np.array([1, 2]), "datetime64[ns]"),
    "datetimes under int64": (pd.to_datetime(["2020-01-01"]).values, "int64"),
    "nanoseconds under seconds": (pd.to_datetime(["2020-01-01 00:00:01.5"]).values, "datetime64[s]"),
    "text under int64": (np.array(["007"], dtype=object), "int64"),
    "ints under date32": (np.array([1]), pd.ArrowDtype(pa.date32())),
    # became '3' and '1.5' without a word
    "ints under string": (np.array([3, 4]), "string[pyarrow]"),
    "floats under str": (np.array([1.50]), str_dtype()),  # (None: pandas before 2.3, which has no "str")
    "datetimes under string": (pd.to_datetime(["2020-01-01"]).values, "string[pyarrow]"),
    # what fillna(0) puts in a string column (Dask keeps its meta): 0 became '0', b"zz" 'zz'
    "ints among strings under string": (np.array(["a", 0, None], dtype=object), "string[pyarrow]"),
    "bytes among strings under str": (np.array([b"zz", "x"], dtype=object), str_dtype()),
    # a lake whose first file is binary, a later one string (a trial): 'é' became b'\xc3\xa9'
    "text under binary": (pd.array(["é"], pd.ArrowDtype(pa.string())), pd.ArrowDtype(pa.binary())),
    "large text under binary": (pd.array(["é"], pd.ArrowDtype(pa.large_string())), pd.ArrowDtype(pa.binary())),
    "Python text under binary": (np.array(["é", b"x"], dtype=object), pd.ArrowDtype(pa.binary())),
    "numbers under large text": (np.array([3, 15]), pd.ArrowDtype(pa.large_string())),
    # Arrow casts a struct to one of fewer fields by dropping the others (a trial's emails, gone)
    "a struct of more fields": (
        pd.array(
            [{"name": "c", "email": "c@x"}], pd.ArrowDtype(pa.struct([("name", pa.string()), ("email", pa.string())]))
        ),
        pd.ArrowDtype(pa.struct([("name", pa.string())])),
    ),
    "large lists of structs of more fields": (
        pd.array([[{"a": 1, "b": 2}]], pd.ArrowDtype(pa.large_list(pa.struct([("a", pa.int64()), ("b", pa.int64())])))),
        pd.ArrowDtype(pa.list_(pa.struct([("a", pa.int64())]))),
    ),
    "lists of structs of more fields": (
        pd.array([[{"a": 1, "b": 2}]], pd.ArrowDtype(pa.list_(pa.struct([("a", pa.int64()), ("b", pa.int64())])))),
        pd.ArrowDtype(pa.list_(pa.struct([("a", pa.int64())]))),
    ),
}


def test_a_lake_whose_newer_files_add_a_struct_field_is_refused_naming_the_field(tmp_path, sync_scheduler):
    """A trial: read with dtype_backend="pyarrow", the first file's struct is the meta, and the newer files'
    extra field was dropped from every row without a word (Dask's own compute and shuffle keep it)."""
    user = pa.struct([("name", pa.string()), ("email", pa.string())])
    pq.write_table(pa.table({"id": [1, 2], "user": pa.array([{"name": "a"}, {"name": "b"}])}), tmp_path / "1.parquet")
    pq.write_table(
        pa.table({"id": [3], "user": pa.array([{"name": "c", "email": "c@x"}], user)}), tmp_path / "2.parquet"
    )
    ddf = dd.read_parquet(str(tmp_path), dtype_backend="pyarrow")
    with pytest.raises(
        TypeError, match=r"column 'user' .* converting would drop its field email \(found in partition 1\)"
    ):
        daskpile.shuffle(ddf, piles=2, seed=1).compute()
    widened = ddf.astype({"user": pd.ArrowDtype(user)})  # as the message advises
    assert sorted(daskpile.shuffle(widened, piles=2, seed=1).compute()["user"].tolist(), key=str)[-1] == {
        "name": "c", "email": "c@x"
    }  # fmt: skip


def test_a_lake_whose_files_widened_a_type_is_refused_with_the_cast_that_reads_it(tmp_path, sync_scheduler):
    """A trial: pandas writes decimals at the precision of each file's values, so Dask's meta (the first file's)
    cannot hold a later file's, and the refusal said only "ddf.astype({'price': ...})", whose string form of an
    Arrow decimal pandas does not parse.  It now names the cast that holds the partition, and that cast reads it."""
    for k, prices in enumerate([["1.25", "9.99"], ["12.50", "99.99"]]):
        frame = pd.DataFrame({"price": [decimal.Decimal(p) for p in prices]})
        frame.to_parquet(tmp_path / f"p{k}.parquet", index=False)
    ddf = dd.read_parquet(str(tmp_path))
    advice = "ddf.astype({'price': pd.ArrowDtype(pa.decimal128(4, 2))}) holds this partition's"
    with pytest.raises(TypeError, match=re.escape(f"(if the files' types widened, cast to the widest: {advice})")):
        daskpile.shuffle(ddf, piles=2, seed=1).compute()
    widened = ddf.astype({"price": pd.ArrowDtype(pa.decimal128(4, 2))})
    assert sorted(daskpile.shuffle(widened, piles=2, seed=1).compute()["price"]) == sorted(
        decimal.Decimal(p) for p in ["1.25", "9.99", "12.50", "99.99"]
    )


def test_partitions_of_categoricals_of_other_types_are_refused_naming_the_column(sync_scheduler):
    """A trial: categories of ints in one partition and of strings in another (Dask's compute refuses them too)
    failed in pass 2 with Arrow's "Field 2 has incompatible types", naming a position in daskpile's scratch."""
    ints = pd.DataFrame({"x": [1, 2], "c": pd.Categorical([1, 2])})
    texts = pd.DataFrame({"x": [3, 4], "c": pd.Categorical(["a", "b"])})
    parts = [dask.delayed(lambda frame: frame)(frame) for frame in (ints, texts)]
    ddf = dd.from_delayed(parts, meta=ints.iloc[:0], verify_meta=False)
    said = r"^the partitions hold column 'c' as dictionary<values=int64.* and as dictionary<values=(large_)?string"
    with pytest.raises(TypeError, match=said):
        daskpile.shuffle(ddf, piles=2, seed=1).compute()
    # a column whose types differ but promote (categoricals of 2 and of 200 categories: int8 and int16 indices)
    # is not the one named, but the one beside it that clashes (a reviewer's)
    cats = [str(i) for i in range(200)]
    first = pd.DataFrame({"a": pd.Categorical(["x", "y"]), "c": pd.Categorical([1, 2])})
    second = pd.DataFrame({"a": pd.Categorical(cats[:2], categories=cats), "c": pd.Categorical(["u", "v"])})
    parts = [dask.delayed(lambda frame: frame)(frame) for frame in (first, second)]
    ddf = dd.from_delayed(parts, meta=first.iloc[:0], verify_meta=False)
    with pytest.raises(TypeError, match=r"^the partitions hold column 'c' as "):
        daskpile.shuffle(ddf, piles=1, seed=1).compute()


@pytest.mark.parametrize("case", CHANGED_BY_THE_META)
def test_a_partition_whose_values_its_meta_cannot_hold_is_refused_by_name_never_changed(case, sync_scheduler):
    values, meta_dtype = CHANGED_BY_THE_META[case]
    if meta_dtype is None:
        pytest.skip("pandas before 2.3 has no 'str' dtype")
    meta = pd.DataFrame({"v": pd.Series([], dtype=meta_dtype)})
    ddf = dd.from_pandas(pd.DataFrame({"v": [0]}), npartitions=1).map_partitions(
        lambda _: pd.DataFrame({"v": values}), meta=meta, enforce_metadata=False
    )
    says = re.escape(str(meta.dtypes["v"]))
    with pytest.raises(TypeError, match=f"column 'v' of a partition is .*, the DataFrame's meta says {says}"):
        daskpile.shuffle(ddf, piles=1, seed=0).compute()


NO_VALUE_UNDER = {
    "string": "string[pyarrow]",
    "datetime": "datetime64[ns]",
    "tz-aware datetime": "datetime64[us, UTC]",
    "timedelta": "timedelta64[ns]",
    "Arrow list": pd.ArrowDtype(pa.list_(pa.int64())),
    "Arrow string": pd.ArrowDtype(pa.string()),
    "bool": "bool",
    "int64": "int64",
}


@pytest.mark.parametrize("rows", [0, 2], ids=["no rows", "all NaN"])
@pytest.mark.parametrize("meta_dtype", NO_VALUE_UNDER.values(), ids=NO_VALUE_UNDER.keys())
def test_a_partition_of_no_value_comes_through_under_any_meta_as_dask_computes_it(meta_dtype, rows, sync_scheduler):
    """A partition with no rows, or only NaN, in a float64 column whose meta is a string, a time or a list
    (an empty file of a lake that stored the column as double; a reindex that added it) was refused ("numbers
    and times would become text"), where Dask's compute gives missing values: nothing is lost."""
    held = {"bool": [True, False], "int64": [5, 6]}.get(meta_dtype, [None, None])
    full = pd.DataFrame({"id": [1, 2], "s": pd.Series(held).astype(meta_dtype)})
    other = pd.DataFrame({"id": pd.Series([3, 4][:rows], dtype="int64"), "s": [np.nan] * rows})
    ddf = dd.from_map(lambda i: [full, other][i], [0, 1], meta=full.iloc[:0], enforce_metadata=False)
    out = daskpile.shuffle(ddf, piles=1, seed=0).compute().set_index("id").sort_index()
    expected = ddf.compute().set_index("id").sort_index()
    assert out.index.tolist() == [1, 2, 3, 4][: 2 + rows]
    assert out.loc[[1, 2], "s"].tolist() == expected.loc[[1, 2], "s"].tolist()
    assert out.loc[[3, 4][:rows], "s"].isna().all()
    if meta_dtype not in ("bool", "int64") or not rows:  # (a numpy int or bool holds no NaN: as Dask reads them)
        assert out["s"].dtype == full["s"].dtype


def test_an_empty_file_of_a_lake_that_stored_a_string_column_as_double_is_read(tmp_path, sync_scheduler):
    """pandas writes a column of no value as double: beside files of strings, it was refused."""
    pd.DataFrame({"id": [1, 2], "s": ["a", "b"]}).to_parquet(tmp_path / "a.parquet", index=False)
    pd.DataFrame({"id": pd.Series([], dtype="int64"), "s": pd.Series([], dtype="float64")}).to_parquet(
        tmp_path / "b.parquet", index=False
    )
    pd.DataFrame({"id": [3], "s": [np.nan]}).to_parquet(tmp_path / "c.parquet", index=False)
    ddf = dd.read_parquet(tmp_path)
    out = daskpile.shuffle(ddf, piles=2, seed=0).compute().set_index("id").sort_index()
    assert out["s"].dtype == ddf.dtypes["s"] and out["s"].tolist()[:2] == ["a", "b"] and pd.isna(out.loc[3, "s"])


def test_a_nullable_int_or_bool_column_of_parquet_comes_through_as_dask_reads_it(tmp_path, sync_scheduler):
    """read_parquet's meta says int64 (bool) for a nullable column, and a partition with a missing value is
    float64 with NaN (objects with None): the commonest lake, refused before.  Each pile comes back as Dask
    reads such a partition."""
    with_missing = {"n": pa.array([1, None, 3], pa.int64()), "u": pa.array([7, 8, None], pa.uint8())}
    with_missing["b"] = pa.array([True, None, False])
    pq.write_table(pa.table({"id": [0, 1, 2], **with_missing}), tmp_path / "a.parquet")
    full = {"n": pa.array([4, 2**53], pa.int64()), "u": pa.array([9, 255], pa.uint8()), "b": pa.array([True, True])}
    pq.write_table(pa.table({"id": [3, 4], **full}), tmp_path / "b.parquet")
    none = {"n": pa.nulls(1, pa.int64()), "u": pa.nulls(1, pa.uint8()), "b": pa.nulls(1, pa.bool_())}
    pq.write_table(pa.table({"id": [5], **none}), tmp_path / "c.parquet")  # all missing: objects None, NaN
    ddf = dd.read_parquet(tmp_path)
    assert ddf.dtypes.to_dict() == {"id": np.int64, "n": np.int64, "u": np.uint8, "b": bool}
    shuffled = daskpile.shuffle(ddf, piles=2, seed=0)
    piles = [shuffled.partitions[p].compute() for p in range(2)]
    for pile in piles:  # each as read_parquet gives a partition: with a missing value, float64 or objects
        for column, missing_as in (("n", np.float64), ("u", np.float64), ("b", object)):
            assert pile[column].dtype == (missing_as if pile[column].isna().any() else ddf.dtypes[column])
    by_id = pd.concat(piles).set_index("id").sort_index()
    pd.testing.assert_frame_equal(by_id, ddf.compute().set_index("id").sort_index(), check_dtype=False)
    assert by_id.loc[1, "b"] is None and np.isnan(by_id.loc[2, "u"]) and by_id.loc[4, "n"] == 2**53
    assert by_id.loc[5, "b"] is None and np.isnan(by_id.loc[5, "n"])


def test_memory_scratch_on_workers_in_other_processes_is_refused_before_it_runs(client, tmp_path):
    """Each process has its own memory file system: pass 2 failed with "removed while the run used it", and so
    did every retry.  Workers in this process (threads) share it, and the probe says so."""
    ddf = dd.from_pandas(frame(100), npartitions=2)
    shuffled = daskpile.shuffle(ddf, piles=2, seed=0, scratch="memory://daskpile-tests")
    pq.write_table(pa.table({"x": range(10)}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"^scratch 'memory:///daskpile-tests[^']*' is in this process's memory"):
        daskpile.shuffle_parquet(
            str(tmp_path / "a.parquet"), str(tmp_path / "out"), seed=0, scratch="memory://daskpile-tests"
        )
    with pytest.raises(
        ValueError, match=r"memory:///daskpile-tests/daskpile-\w+ is in this process's memory, which 2 "
    ):
        shuffled.compute()


def test_more_piles_than_the_machine_holds_the_counts_of_are_refused_at_once(monkeypatch):
    """``piles=10**9`` (a typo) was accepted, and the first compute was killed for its memory at 24 GB."""
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=64 * 2**30))
    ddf = dd.from_pandas(frame(100), npartitions=2)
    with pytest.raises(ValueError, match=r"^1,000,000,000 piles would take .* give at most [\d,]+ piles \(for 2 part"):
        daskpile.shuffle(ddf, piles=10**9)


def test_strings_beside_missing_values_of_any_kind_are_cast_to_the_string_meta(sync_scheduler):
    """Objects other than strings under a string meta are refused; missing values (None, NaN, NaT) are not."""
    meta = pd.DataFrame({"v": pd.Series([], dtype="string[pyarrow]")})
    values = np.array(["a", None, np.nan, pd.NaT], dtype=object)
    ddf = dd.from_pandas(pd.DataFrame({"v": [0]}), npartitions=1).map_partitions(
        lambda _: pd.DataFrame({"v": values}), meta=meta, enforce_metadata=False
    )
    out = daskpile.shuffle(ddf, piles=1, seed=0).compute()["v"]
    assert out.dtype == "string[pyarrow]" and sorted(out.isna().tolist()) == [False, True, True, True]


def test_a_wide_frame_s_piles_are_not_a_block_a_column(sync_scheduler):
    """600 float columns came back as 600 blocks a pile: "highly fragmented" (a PerformanceWarning a pile in
    to_parquet, on any column added), to_numpy() 16 ms where the input's partition took none."""
    import warnings

    wide = pd.DataFrame(np.arange(2_000 * 600, dtype="float64").reshape(2_000, 600)).add_prefix("f")
    pile = daskpile.shuffle(dd.from_pandas(wide, npartitions=2), piles=2, seed=0).partitions[0].compute()
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        pile["added"] = 0.0
    np.testing.assert_array_equal(np.sort(pile["f7"].to_numpy()), np.sort(wide.loc[pile.index, "f7"].to_numpy()))


def test_a_meta_dask_left_looser_than_the_partitions_is_said_with_a_fix_that_works(sync_scheduler, tmp_path):
    """read_csv, assign(to_datetime), set_index: Dask's meta says float64 of int64 ids and object of bools.  Ids
    past 2**53 were refused with "cast the index first", which it already was, the fix named none that works
    on a Dask DataFrame (a new user's notebook)."""
    for k in range(2):
        ids = np.arange(k * 5, k * 5 + 5) + 2**60 + 1
        pd.DataFrame({"id": ids, "flag": [True, False] * 2 + [True], "when": ["2024-01-01"] * 5}).to_csv(
            tmp_path / f"{k}.csv", index=False
        )
    ddf = dd.read_csv(str(tmp_path / "*.csv"))
    ddf = ddf.assign(when=dd.to_datetime(ddf.when)).set_index("id")
    if ddf._meta.index.dtype == "int64":
        pytest.skip("this Dask's meta agrees with the partitions")
    said = r"the index \('id'\) of a partition is int64, the DataFrame's meta says float64: give the DataFrame its "
    with pytest.raises(TypeError, match=said + r"partitions' meta \(ddf = ddf.map_partitions\(lambda part: part, "):
        daskpile.shuffle(ddf, piles=2, seed=0).compute()
    fixed = ddf.map_partitions(lambda part: part, meta=ddf.partitions[0].compute().iloc[:0])  # the message's fix
    out = daskpile.shuffle(fixed, piles=2, seed=0).compute()
    assert out.index.dtype == "int64" and out["flag"].dtype == "bool"
    pd.testing.assert_frame_equal(out.sort_index(), ddf.compute().sort_index())


def test_an_index_its_meta_cannot_hold_is_refused_naming_the_index(sync_scheduler):
    """The message read "column the index (None) of a partition is str"."""
    meta = pd.DataFrame({"a": np.array([], "int64")})
    ddf = dd.from_delayed([dask.delayed(pd.DataFrame({"a": [1]}, index=["r"]))], meta=meta, verify_meta=False)
    with pytest.raises(TypeError, match=r"^daskpile: the index \(None\) of a partition is .*: give the DataFrame its"):
        daskpile.shuffle(ddf, piles=1, seed=0).compute()
    tree = daskpile.shuffle(ddf, piles=1, seed=0).optimize().expr.tree_repr()
    assert "codec=FrameCodec(columns=['a'], index=True)\n" in tree  # one line of the tree, not the empty frame


def test_integers_past_2_53_in_a_pile_with_a_missing_value_are_kept_exact(tmp_path, sync_scheduler):
    """A pile with a missing value came back float64, which rounded the ids of partitions read exactly (no
    missing value): two ids became one.  Such a pile is now pandas' Int64."""
    big = 1_400_000_000_000_000_001
    pq.write_table(pa.table({"id": [0, 1], "ref": pa.array([None, 5], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2, 3], "ref": pa.array([big, big + 2], pa.int64())}), tmp_path / "b.parquet")
    pile = daskpile.shuffle(dd.read_parquet(tmp_path), piles=1, seed=0).compute()
    assert str(pile.ref.dtype) == "Int64"
    assert pile.set_index("id").ref.sort_index().tolist() == [pd.NA, 5, big, big + 2]


def test_a_nullable_index_of_parquet_is_refused_naming_it(tmp_path, sync_scheduler):
    """pd.Index forces the meta's int or bool: a None became False.  A column may carry missing values as Dask
    reads them; an index is refused, as before."""
    pq.write_table(pa.table({"k": pa.array([1, None], pa.int64()), "v": [0, 1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": pa.array([True, None]), "v": [0, 1]}), tmp_path / "b.parquet")
    for column, name in (("k", "a.parquet"), ("k", "b.parquet")):
        ddf = dd.read_parquet(tmp_path / name, index=column)
        with pytest.raises(TypeError, match=r"^daskpile: the index \('k'\) of a partition is "):
            daskpile.shuffle(ddf, piles=2, seed=0).compute()


def test_an_evolved_lake_is_refused_where_dask_narrows_and_cast_where_every_value_fits(tmp_path, sync_scheduler):
    """Dask takes a lake's dtypes from its first file; a newer file's wider values must not wrap around."""
    pq.write_table(pa.table({"id": [0, 1], "v": pa.array([1, 2], pa.int32())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2, 3], "v": pa.array([5_000_000_000, 7], pa.int64())}), tmp_path / "b.parquet")
    with pytest.raises(TypeError, match="column 'v' of a partition is int64, the DataFrame's meta says int32"):
        daskpile.shuffle(dd.read_parquet(tmp_path), piles=2, seed=0).compute()
    pq.write_table(pa.table({"id": [2, 3], "v": pa.array([6, 7], pa.int64())}), tmp_path / "b.parquet")
    out = daskpile.shuffle(dd.read_parquet(tmp_path), piles=2, seed=0).compute()
    assert out.v.dtype == np.int32 and sorted(out.v) == [1, 2, 6, 7]


def test_a_task_that_runs_after_its_scratch_was_removed_does_not_bring_it_back(tmp_path):
    from daskpile.dataframe._expr import ScratchRun, scatter_partition
    from daskpile.engine._scratch import Scratch

    run = ScratchRun(Scratch.create(str(tmp_path), None, 0), owner=False)
    run.scratch.remove()
    with pytest.raises(FileNotFoundError):
        scatter_partition(frame(10), 0, 2, 0, run, "variant", frame(0))
    assert list(tmp_path.iterdir()) == []


def test_a_result_whose_scratch_was_removed_while_it_lives_runs_pass_1_again(sync_scheduler, tmp_path):
    """``daskpile clean --older-than`` or a cleaner of /tmp may remove a live result's scratch, whole or some of
    its files: the result then failed for good with FileNotFoundError.  Pass 1 now runs again, drawing the same
    piles."""
    import shutil

    shuffled = daskpile.shuffle(dd.from_pandas(frame(500), npartitions=3), piles=4, seed=2, scratch=str(tmp_path))
    whole = shuffled.compute()
    (run,) = tmp_path.iterdir()
    shutil.rmtree(run)
    pd.testing.assert_frame_equal(shuffled.compute(), whole)
    (variant,) = [p for p in run.iterdir() if p.is_dir()]
    assert (run / "_daskpile.session.json").exists()  # (made again with its owner: or, killed, it would stay)
    next(variant.glob("scatter-*.arrow")).unlink()
    pd.testing.assert_frame_equal(shuffled.compute(), whole)
    shutil.rmtree(run)
    pd.testing.assert_frame_equal(shuffled[["s"]].compute(), whole[["s"]])


def test_a_copy_of_a_dropped_result_does_not_bring_its_scratch_back(sync_scheduler, tmp_path):
    """Only the result that owns the scratch makes it again: a pickled copy whose owner was dropped (and removed
    the scratch) wrote a whole pass 1 that nothing would ever remove."""
    import pickle

    shuffled = daskpile.shuffle(dd.from_pandas(frame(100), npartitions=2), piles=2, seed=0, scratch=str(tmp_path))
    pickled = pickle.dumps(shuffled)
    del shuffled  # (unpickled while it lives, the copy would be it: Dask keeps one expression a name)
    gc.collect()
    eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")
    copy = pickle.loads(pickled)
    with pytest.raises(FileNotFoundError, match="the result this one was copied from was dropped"):
        copy.compute()
    assert list(tmp_path.iterdir()) == []


def test_scratch_files_removed_during_pass_1_are_said_to_be_gone_not_blamed_on_the_disks(sync_scheduler):
    """On one process, "the workers share no disk" could not be why, and sent the user to set up S3."""
    calls, removed = [], []

    def remove_what_was_written(part: pd.DataFrame) -> pd.DataFrame:
        calls.append(len(part))
        if len(calls) == 3:  # the two partitions before are in scratch
            for path in directory.glob("*/scatter-*.arrow"):
                path.unlink()
                removed.append(path)
        return part

    ddf = dd.from_pandas(frame(300), npartitions=3)
    shuffled = daskpile.shuffle(ddf.map_partitions(remove_what_was_written, meta=ddf._meta), piles=2, seed=1)
    directory = pathlib.Path(shuffled.expr.run.scratch.directory)
    with pytest.raises(FileNotFoundError, match=r"pass 1 wrote 2 scratch files that are gone .*compute again$"):
        shuffled.compute()
    assert len(removed) == 2


def test_set_index_on_the_result_works_as_on_any_frame(sync_scheduler):
    """set_index takes quantiles of a column of the optimized result, whose shuffle had been tuned already: the
    projection went on top of AsBuilt, and the graph failed ("AsBuilt defines neither _layer nor _task")."""
    ddf = dd.from_pandas(pd.DataFrame({"id": np.arange(1000)[::-1], "x": np.arange(1000)}), npartitions=3)
    shuffled = daskpile.shuffle(ddf, piles=4, seed=0)
    whole = shuffled.compute()
    for indexed in (shuffled.set_index("id"), shuffled[["id", "x"]].set_index("id", npartitions=3)):
        result = indexed.compute()
        assert result.index.is_monotonic_increasing and sorted(result.index) == list(range(1000))
        assert result.loc[whole.id.iloc[0], "x"] == whole.x.iloc[0]
    # a projection of the optimized result is still a projection of the same order
    assert shuffled.optimize()[["x"]].compute().x.tolist() == whole.x.tolist()


_REMOVERS: dict[str, set[str]] = {}  # a directory watched -> the names of the threads that removed files in it


def _record_removals(event: str, args: tuple) -> None:
    if event in ("shutil.rmtree", "os.remove") and _REMOVERS:
        for directory, threads in _REMOVERS.items():
            if os.fsdecode(args[0]).startswith(directory):
                threads.add(threading.current_thread().name)


def test_dropped_scratch_is_removed_on_a_thread_of_its_own_not_the_one_that_dropped_it(sync_scheduler, tmp_path):
    """The garbage collector runs the removal in whatever thread it ran in: once an S3 server's request thread
    in this process, whose lock the removal's requests then waited on for minutes.  An audit hook sees which
    thread removes each file."""
    if not hasattr(_record_removals, "added"):
        sys.addaudithook(_record_removals)  # hooks stay for the process: it does nothing unless watching
        _record_removals.added = True
    shuffled = daskpile.shuffle(dd.from_pandas(frame(100), npartitions=2), piles=2, seed=0, scratch=str(tmp_path))
    assert len(shuffled.compute()) == 100
    _REMOVERS[str(tmp_path)] = removers = set()
    try:
        del shuffled
        gc.collect()
        eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")
    finally:
        del _REMOVERS[str(tmp_path)]
    assert removers == {"daskpile-remove-scratch"}


def test_unknown_categories_of_piles_holding_none_are_the_datas_never_dasks_placeholder(sync_scheduler):
    """A pile of rows with no category (a partition of missing values only, or no rows) took the meta's
    placeholder '__UNKNOWN_CATEGORIES__' as its categories: Dask's concatenation of the piles then failed
    ("dtype of categories must be the same") or kept it as a category."""
    frame = pd.DataFrame({"x": range(6), "c": [None, None, None, "a", "b", "a"]})
    ddf = dd.from_pandas(frame, npartitions=2).astype({"c": "category"})
    shuffled = daskpile.shuffle(ddf, piles=8, seed=0)
    out = shuffled.compute()
    assert sorted(out["c"].cat.categories) == ["a", "b"]
    pd.testing.assert_series_equal(out.sort_values("x")["c"], ddf.compute()["c"], check_categorical=False)
    for pile in range(8):
        assert "__UNKNOWN_CATEGORIES__" not in shuffled.partitions[pile].compute()["c"].cat.categories


def test_an_empty_result_keeps_the_categories_its_partitions_had(sync_scheduler, tmp_path):
    """A filter that keeps no row: Dask's result still has the file's categories; the piles had none."""
    pd.DataFrame({"id": range(6), "c": pd.Categorical(list("abcabc"))}).to_parquet(tmp_path / "cat.parquet")
    none = dd.read_parquet(tmp_path / "cat.parquet").query("id < 0")
    shuffled = daskpile.shuffle(none, piles=2, seed=0)
    assert list(shuffled.compute()["c"].cat.categories) == list(none.compute()["c"].cat.categories) == ["a", "b", "c"]
    assert list(shuffled.partitions[1].compute()["c"].cat.categories) == ["a", "b", "c"]


def test_a_multiindex_is_refused_when_the_shuffle_is_called():
    """A groupby of several keys: accepted, then refused at compute ("Dask DataFrames have none")."""
    frame = pd.DataFrame({"user": [1, 1, 2], "day": [1, 2, 1], "v": [1.0, 2.0, 3.0]})
    totals = dd.from_pandas(frame, npartitions=2).groupby(["user", "day"]).agg(total=("v", "sum"))
    with pytest.raises(TypeError, match=r"MultiIndex \(\['user', 'day'\]\): .*ddf.reset_index\(\)"):
        daskpile.shuffle(totals, piles=2)


def test_known_categories_come_back_in_the_partitions_order_not_the_metas(sync_scheduler):
    """read_csv(include_path_column=True) gives a meta listing the paths in a set's order, which changes from
    one Python process to the next, where its partitions list them sorted: the codes, and the bytes written,
    followed the meta, so the same seed wrote other files in another process."""
    import dask

    parts = [
        pd.DataFrame({"x": [k, k + 2], "c": pd.Categorical(["a", "b"], categories=["a", "b", "c"])}) for k in (0, 1)
    ]
    meta = pd.DataFrame({"x": pd.Series([], dtype="int64"), "c": pd.Categorical([], categories=["c", "a", "b"])})
    ddf = dd.from_delayed([dask.delayed(p) for p in parts], meta=meta, verify_meta=False)
    assert list(ddf._meta["c"].cat.categories) == ["c", "a", "b"]
    out = daskpile.shuffle(ddf, piles=2, seed=0).compute()
    assert list(out["c"].cat.categories) == list(ddf.compute()["c"].cat.categories) == ["a", "b", "c"]
    assert out.sort_values("x")["c"].cat.codes.tolist() == [0, 0, 1, 1]


def test_the_seed_drawn_for_none_is_the_results_seed_and_shuffles_alike_again(sync_scheduler):
    ddf = dd.from_pandas(frame(200), npartitions=3)
    drawn = daskpile.shuffle(ddf, piles=4)
    again = daskpile.shuffle(ddf, piles=4, seed=drawn.seed)
    assert isinstance(drawn.seed, int) and again.seed == drawn.seed
    pd.testing.assert_frame_equal(drawn.compute(), again.compute())


def test_combining_a_pile_s_slices_as_read_leaves_each_pile_as_it_was(monkeypatch):
    """A pile's slices are combined once they hold many arrays; an empty slice must not bring its own types:
    partition 0's one row, in one pile only, came with a category "z" of no row into every pile."""
    from daskpile.engine import _scratch

    parts = []
    for k in range(60):
        n = 1 if k == 0 else 8
        part = pd.DataFrame({"x": np.arange(n) + 100 * k, "v": np.arange(n, dtype=float)})
        part["c"] = pd.Categorical(["z"] * n) if k == 0 else pd.Categorical(np.resize(["a", "b"], n))
        parts.append(part)
    meta = parts[1].iloc[:0].astype({"c": pd.CategoricalDtype(["__UNKNOWN_CATEGORIES__"])})
    ddf = dd.from_delayed([dask.delayed(p) for p in parts], meta=meta, verify_meta=False)
    piles = {}
    with dask.config.set(scheduler="sync"):
        for arrays in (10**9, 40):  # 60 slices of 4 arrays (the index too): combined by 10
            monkeypatch.setattr(_scratch, "COMPACT_ARRAYS", arrays)
            shuffled = daskpile.shuffle(ddf, piles=4, seed=1)
            piles[arrays] = [shuffled.partitions[j].compute() for j in range(4)]
    for as_read, combined in zip(piles[10**9], piles[40], strict=True):
        pd.testing.assert_frame_equal(as_read, combined)
        assert ("z" in set(combined["c"].cat.categories)) == ("z" in set(combined["c"]))


def test_a_compute_cancelled_in_a_notebook_prints_nothing_and_its_scratch_goes(tmp_path):
    """A new user's notebook: ``client.compute(shuffle(...))``, then ``future.cancel()``.  The result is dropped
    at once, and the removal's thread waited for the client's futures with distributed's ``wait``, which raised
    on the cancelled one: a traceback of 20 lines from "daskpile-remove-scratch"."""
    from distributed import Client, LocalCluster

    errors = []
    hook, threading.excepthook = threading.excepthook, errors.append
    try:
        with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
            slow = dd.from_pandas(frame(1000), npartitions=4).map_partitions(lambda d: (time.sleep(0.5), d)[1])
            future = client.compute(daskpile.shuffle(slow, piles=3, seed=2, scratch=str(tmp_path)))
            time.sleep(0.2)
            future.cancel()
            eventually(lambda: list(tmp_path.iterdir()) == [], what="scratch removed")
    finally:
        threading.excepthook = hook
    assert errors == []


def test_a_scratch_that_cannot_be_one_is_named(sync_scheduler, tmp_path):
    """A new user's notebook: a file given as scratch said "[Errno 17] File exists", an unknown protocol
    "Protocol not known: foo", naming neither the URL nor scratch; a chained URL's cache is refused."""
    ddf = dd.from_pandas(frame(10), npartitions=2)
    (tmp_path / "a-file").write_text("")
    for scratch in [tmp_path / "a-file", tmp_path / "a-file" / "below"]:
        with pytest.raises(NotADirectoryError, match=rf"^scratch '{tmp_path / 'a-file'}.*' is a file, not a directory"):
            daskpile.shuffle(ddf, piles=2, seed=1, scratch=str(scratch))
    with pytest.raises(ValueError, match=r"^'foo://bucket/tmp': fsspec knows no file system for foo://"):
        daskpile.shuffle(ddf, piles=2, seed=1, scratch="foo://bucket/tmp")
    with pytest.raises(ValueError, match=r"^scratch 'simplecache::memory://x': a chained URL's cache"):
        daskpile.shuffle(ddf, piles=2, seed=1, scratch="simplecache::memory://x")
