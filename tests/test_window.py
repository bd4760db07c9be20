"""Moving windows: append, expire, compact, discard; snapshots, resume, retention, verify, the loader."""

import contextlib
import datetime
import importlib
import json
import os
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path

import dask
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _util import DASKPILE, daskpile_command, daskpile_in_process, start_lease_holder, write_parts

import daskpile
from daskpile.datasets import reference_table
from daskpile.engine import _sizing
from daskpile.window import snapshot

PILES, SEED = 4, 11
DAY_ROWS = 2_000


def day(directory: Path, number: int, rows: int = DAY_ROWS, files: int = 2) -> str:
    """The rows that arrive on day ``number``: ids ``number * rows ...``, with the day as a column."""
    table = reference_table(number * rows, (number + 1) * rows, 10**9)
    table = table.append_column("day", pa.array(np.full(rows, number, dtype=np.int32)))
    path = directory / f"day-{number}"
    write_parts(table, path, parts=files)
    return str(path)


@pytest.fixture
def days(tmp_path):
    return [day(tmp_path / "in", d) for d in range(4)]


def window_ids(dest) -> np.ndarray:
    """The ids the current version lists, read as a plain reader would (the listed files)."""
    manifest = daskpile.read_manifest(str(dest))
    return np.concatenate([pq.read_table(os.path.join(dest, f), columns=["id"])["id"].to_numpy()
                           for f in manifest["files"]])  # fmt: skip


def ids_of(*day_numbers) -> list[int]:
    return sorted(i for d in day_numbers for i in range(d * DAY_ROWS, (d + 1) * DAY_ROWS))


def loader_ids(dest, **kwargs) -> np.ndarray:
    loader = daskpile.PileLoader(str(dest), batch_size=500, seed=0, **kwargs)
    return np.concatenate([b["id"].to_numpy() for b in loader])


def test_append_expire_compact_keep_the_window_exact(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    first = daskpile.append(str(dest), days[1])
    assert (first.generation, first.version, first.generations, first.rows) == (1, 1, [0, 1], 2 * DAY_ROWS)
    assert len(list((dest / "gen-000001").glob("part-*.parquet"))) == PILES  # one new file per pile
    daskpile.append(str(dest), days[2])
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2)
    expired = daskpile.expire(str(dest), keep_generations=2)
    assert expired.generations == [1, 2] and sorted(window_ids(dest)) == ids_of(1, 2)
    assert daskpile.verify(str(dest)).ok
    manifest = daskpile.read_manifest(str(dest))
    assert manifest["rows"] == 2 * DAY_ROWS and sum(manifest["rows_per_pile"]) == 2 * DAY_ROWS
    assert [g["number"] for g in manifest["window"]["generations"]] == [1, 2]
    assert [g["fingerprint"]["rows"] for g in manifest["window"]["generations"]] == [DAY_ROWS, DAY_ROWS]
    # every row of the window once per epoch through the loader: each pile's generations loaded together
    assert sorted(loader_ids(dest)) == ids_of(1, 2)
    compacted = daskpile.compact(str(dest))
    assert compacted.generations == [3]
    manifest = daskpile.read_manifest(str(dest))
    assert manifest["files"] == [f"gen-000003/part-{j:05d}.parquet" for j in range(PILES)]
    assert sorted(window_ids(dest)) == ids_of(1, 2) and daskpile.verify(str(dest)).ok
    # a compacted pile is permuted: the days are mixed inside each file, not one after the other
    first_pile = pq.read_table(dest / manifest["files"][0], columns=["day"])["day"].to_numpy()
    assert (np.diff(first_pile) != 0).sum() > 10


def test_the_same_append_twice_does_nothing(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    assert daskpile.append(str(dest), days[1]).changed
    again = daskpile.append(str(dest), days[1])
    assert not again.changed and "already appended as generation 1" in str(again)
    assert again.version == 1 and sorted(window_ids(dest)) == ids_of(0, 1)


def test_an_append_of_another_schema_is_refused_naming_the_column_and_writes_nothing(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    before = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    other = tmp_path / "other"
    other.mkdir()
    table = reference_table(0, 100, 100).append_column("day", pa.array(np.zeros(100), pa.float64()))
    pq.write_table(table, other / "a.parquet")
    with pytest.raises(ValueError, match="day"):
        daskpile.append(str(dest), str(other))
    extra = tmp_path / "extra"
    extra.mkdir()
    pq.write_table(reference_table(0, 100, 100).append_column("day", pa.array(np.zeros(100, np.int32))).append_column(
        "w", pa.array(np.zeros(100))), extra / "a.parquet")  # fmt: skip
    with pytest.raises(ValueError, match="w: unexpected column"):
        daskpile.append(str(dest), str(extra))
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == before


def test_an_append_refused_for_space_leaves_no_pending_append(sync_scheduler, days, tmp_path, monkeypatch):
    # a pending append left behind would block the next append and fail verify, for a run that never began
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    before = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    monkeypatch.setattr(_sizing, "free_space", lambda fs, path: (1000, 0))
    with pytest.raises(_sizing.NotEnoughSpace, match="not enough space"):
        daskpile.append(str(dest), days[1])
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == before
    monkeypatch.undo()
    assert daskpile.append(str(dest), days[1]).generation == 1 and daskpile.verify(str(dest)).ok


def test_a_compact_the_disk_cannot_hold_is_refused_before_it_begins(sync_scheduler, days, tmp_path, monkeypatch):
    """It failed halfway on "No space left on device" (exit 1), its change left under way."""
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    before = window_state(dest)
    needed = sum(p.stat().st_size for p in dest.rglob("part-*.parquet"))
    monkeypatch.setattr(_sizing, "free_space", lambda fs, path: (needed - 1, 0))
    with pytest.raises(_sizing.NotEnoughSpace, match=f"window '{dest}'.*{needed:,} bytes.*expire generations"):
        daskpile.compact(str(dest))
    assert window_state(dest) == before
    # interrupted after its first pile, it is resumed with the room for the rest (it was refused the whole copy)
    from daskpile.engine import _passes

    write, calls = _passes._write_stamped, []

    def write_one_pile(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return write(*args, **kwargs)

    monkeypatch.setattr(_sizing, "free_space", lambda fs, path: (needed, 0))
    with monkeypatch.context() as patched:
        patched.setattr(_passes, "_write_stamped", write_one_pile)
        with pytest.raises(KeyboardInterrupt):
            daskpile.compact(str(dest))
    written = sum(p.stat().st_size for p in (dest / "gen-000002").glob("part-*.parquet"))
    assert 0 < written < needed
    monkeypatch.setattr(_sizing, "free_space", lambda fs, path: (needed - written, 0))
    assert daskpile.compact(str(dest)).changed
    assert sorted(window_ids(dest)) == ids_of(0, 1)


def test_columns_in_another_order_are_appended_in_the_windows_order(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    reordered = tmp_path / "reordered"
    reordered.mkdir()
    table = pq.read_table(days[1])
    pq.write_table(table.select(list(reversed(table.column_names))), reordered / "a.parquet")
    daskpile.append(str(dest), str(reordered))
    schema = pq.read_schema(dest / "gen-000001" / "part-00000.parquet")
    assert schema.names == table.column_names and daskpile.verify(str(dest)).ok


def test_expire_before_a_value_drops_whole_generations_and_cuts_the_straddling_one_at_compact(sync_scheduler, tmp_path):
    # day 1's rows carry the days 1 and 2 (a late file): a cut at 2 straddles it
    dest = tmp_path / "window"
    inputs = tmp_path / "in"
    daskpile.shuffle_parquet(day(inputs, 0), str(dest), piles=PILES, seed=SEED)
    straddling = reference_table(DAY_ROWS, 2 * DAY_ROWS, 10**9).append_column(
        "day", pa.array(np.repeat(np.array([1, 2], np.int32), DAY_ROWS // 2))
    )
    write_parts(straddling, inputs / "day-1", parts=2)
    daskpile.append(str(dest), str(inputs / "day-1"))
    daskpile.append(str(dest), day(inputs, 3))
    expired = daskpile.expire(str(dest), before=2, column="day")
    assert expired.generations == [1, 2] and "go at the next compact" in str(expired)
    generations = daskpile.read_manifest(str(dest))["window"]["generations"]
    assert generations[0]["cuts"] == [{"column": "day", "before": 2}] and generations[1]["cuts"] == []
    assert len(window_ids(dest)) == 2 * DAY_ROWS  # the cut rows stay until compact
    assert not daskpile.expire(str(dest), before=2, column="day").changed  # again: nothing to do
    daskpile.compact(str(dest))
    kept = sorted(window_ids(dest))
    assert kept == list(range(DAY_ROWS + DAY_ROWS // 2, 2 * DAY_ROWS)) + ids_of(3)
    assert daskpile.verify(str(dest)).ok
    with pytest.raises(ValueError, match="cannot be compared"):
        daskpile.expire(str(dest), before="not a number", column="day")
    with pytest.raises(KeyError, match="nope"):
        daskpile.expire(str(dest), before=1, column="nope")
    # a value past every row (a mistyped year) is refused, as dropping every generation by name is
    with pytest.raises(ValueError, match=r"every row of the window .* has day before 20260: .* leave it empty"):
        daskpile.expire(str(dest), before=20260, column="day")
    assert sorted(window_ids(dest)) == kept and daskpile.verify(str(dest)).ok


def test_expire_before_a_time_given_as_text(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    # ts is id microseconds after 2020-09-13T12:26:40: day 1 starts at id 2,000
    first_of_day_1 = pq.read_table(days[1], columns=["ts"])["ts"][0].as_py()
    report = daskpile.expire(str(dest), before=first_of_day_1.isoformat(), column="ts")
    assert report.generations == [1] and sorted(window_ids(dest)) == ids_of(1)


def test_verify_names_the_generation_whose_files_changed(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    daskpile.append(str(dest), days[2])
    assert daskpile.verify(str(dest)).ok
    victim = dest / "gen-000002" / "part-00001.parquet"
    table = pq.read_table(victim)
    pq.write_table(table.slice(1), victim)  # a row lost
    result = daskpile.verify(str(dest))
    assert not result.ok and result.generations_differing == (2,)
    assert "generations that differ: 2" in str(result)
    (dest / "gen-000001" / "part-00000.parquet").unlink()
    result = daskpile.verify(str(dest))
    assert result.generations_differing == (1, 2) and result.missing_files


def append_killed_before_its_version(dest, source, monkeypatch) -> None:
    """An append interrupted after its generation's files, before the manifest version that lists them."""
    with monkeypatch.context() as patched:
        patched.setattr(snapshot.Window, "commit", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            daskpile.append(str(dest), source)


def test_a_change_under_way_is_resumed_by_the_same_command_and_refuses_others(sync_scheduler, days, tmp_path,
                                                                           monkeypatch):  # fmt: skip
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    reference = tmp_path / "reference"
    shutil.copytree(dest, reference)
    daskpile.append(str(reference), days[1])
    append_killed_before_its_version(dest, days[1], monkeypatch)
    assert "window" not in daskpile.read_manifest(str(dest))  # still version 0, whole and readable
    assert sorted(loader_ids(dest)) == ids_of(0)
    with pytest.raises(daskpile.WindowBusyError, match="unfinished `daskpile append`"):
        daskpile.expire(str(dest), keep_generations=1)
    with pytest.raises(daskpile.WindowBusyError):
        daskpile.append(str(dest), days[2])
    finished = daskpile.append(str(dest), days[1])
    assert finished.changed and finished.generation == 1
    assert not (dest / snapshot.PENDING).exists()
    for name in (f"gen-000001/part-{j:05d}.parquet" for j in range(PILES)):
        assert (dest / name).read_bytes() == (reference / name).read_bytes()


def window_state(dest: Path) -> dict[str, bytes]:
    """Every file of the window, by its path relative to it."""
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def test_while_a_run_holds_the_window_every_command_is_refused_at_once_and_writes_nothing(
    sync_scheduler, days, tmp_path
):
    """Two commands on one window at once (a daily append beside a compact by hand): the second is refused
    before it reads the window, where before both did their work and the later one failed at its commit."""
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    before = window_state(dest)
    holder = start_lease_holder(dest)
    try:
        for command in (
            lambda: daskpile.append(str(dest), days[2]),
            lambda: daskpile.expire(str(dest), keep_generations=1),
            lambda: daskpile.compact(str(dest)),
            lambda: daskpile.discard(str(dest)),
            lambda: daskpile.shuffle_parquet(days[2], str(dest), piles=PILES, seed=SEED, overwrite=True),
        ):
            with pytest.raises(daskpile.DestBusyError, match=f"another daskpile run \\(the run of pid {holder.pid}"):
                command()
        done = daskpile_in_process("expire", str(dest), "--keep", "1")
        assert done.returncode == 75 and done.stderr.count("\n") == 1 and "another daskpile run" in done.stderr
        assert window_state(dest) == {**before, "_daskpile.lease.json": (dest / "_daskpile.lease.json").read_bytes()}
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert window_state(dest) == before  # the holder's lease went with it
    assert daskpile.append(str(dest), days[2]).generation == 2  # and the commands run again
    assert daskpile.compact(str(dest)).changed
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2) and "_daskpile.lease.json" not in os.listdir(dest)


def test_discard_drops_the_unfinished_change(sync_scheduler, days, tmp_path, monkeypatch):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    append_killed_before_its_version(dest, days[1], monkeypatch)
    assert (dest / "gen-000001").exists()
    assert daskpile.discard(str(dest)).changed
    assert not (dest / "gen-000001").exists() and not (dest / snapshot.PENDING).exists()
    assert daskpile.append(str(dest), days[2]).generation == 1  # the number is free again
    assert not daskpile.discard(str(dest)).changed


def test_verify_names_an_unfinished_first_append_as_what_the_unlisted_files_are(sync_scheduler, days, tmp_path,
                                                                                monkeypatch):  # fmt: skip
    """A result whose first append was interrupted: its own files are whole, the new generation's are not in its
    manifest yet. Verify said only MISMATCH, rows equal (an operator's first thought: the result is corrupt)."""
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    append_killed_before_its_version(dest, days[1], monkeypatch)
    checked = daskpile.verify(str(dest))
    assert not checked.ok  # pd.read_parquet(dest) reads the new generation's files too
    assert checked.unfinished_change.startswith("`daskpile append` (") and "gen-000001" in checked.unlisted_files[0]
    assert "they are an unfinished `daskpile append` (" in str(checked) and "`daskpile discard`" in str(checked)
    assert "the files the manifest lists are whole" in str(checked)
    (dest / "stray.parquet").write_bytes((dest / "part-00000.parquet").read_bytes())  # not the append's: unsaid
    assert daskpile.verify(str(dest)).unfinished_change is None
    (dest / "stray.parquet").unlink()
    daskpile.discard(str(dest))
    assert daskpile.verify(str(dest)).ok


@pytest.mark.parametrize("command", ["append", "expire", "compact"])
def test_discard_of_a_change_stopped_after_its_commit_says_it_was_committed(sync_scheduler, days, tmp_path,
                                                                           monkeypatch, command):  # fmt: skip
    """Killed after its commit, before it cleared its mark: the next command is refused and points at discard,
    which said "discarded the unfinished append", the day's rows still in the window (a user dropping a bad
    day trained on it)."""
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    run = {"append": lambda: daskpile.append(str(dest), days[2]),
           "expire": lambda: daskpile.expire(str(dest), keep_generations=1),
           "compact": lambda: daskpile.compact(str(dest))}[command]  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(snapshot, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            run()
    committed = sorted(window_ids(dest))
    discarded = daskpile.discard(str(dest))
    assert not discarded.changed and not (dest / snapshot.PENDING).exists()
    assert "was committed (the window is at version 2) before it was stopped: nothing to discard" in discarded.summary
    if command == "append":
        assert discarded.summary.endswith(f"to drop them, daskpile expire {dest} --generation 2")
    assert sorted(window_ids(dest)) == committed == {"append": ids_of(0, 1, 2), "expire": ids_of(1),
                                                      "compact": ids_of(0, 1)}[command]  # fmt: skip


@pytest.mark.slow
def test_a_killed_append_leaves_the_previous_version_whole_and_the_same_command_finishes_it(days, tmp_path):
    """SIGKILL of `daskpile append` in pass 1 of the new generation; then the same command."""
    dest = tmp_path / "window"
    source = tmp_path / "big"
    write_parts(pq.read_table(days[1]), source, parts=40)
    daskpile_command("shuffle", days[0], str(dest), "--piles", str(PILES), "--seed", str(SEED), "--scheduler",
                     "sync", "-q")  # fmt: skip
    reference = tmp_path / "reference"
    shutil.copytree(dest, reference)
    args = [str(source), "--blocksize", "16KiB", "--scheduler", "sync", "-q"]
    assert daskpile_command("append", *args[:1], str(reference), *args[1:]).returncode == 0
    process = subprocess.Popen([DASKPILE, "append", str(source), str(dest), *args[1:]])
    deadline = time.monotonic() + 60
    while not (dest / snapshot.PENDING).exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert "window" not in daskpile.read_manifest(str(dest))
    busy = daskpile_command("expire", str(dest), "--keep", "1")
    assert busy.returncode == 2 and "unfinished `daskpile append`" in busy.stderr
    done = daskpile_command("append", str(source), str(dest), *args[1:])
    assert done.returncode == 0, done.stderr
    for name in (f"gen-000001/part-{j:05d}.parquet" for j in range(PILES)):
        assert (dest / name).read_bytes() == (reference / name).read_bytes()


def test_files_retired_with_a_longer_retain_keep_it_under_a_later_default(sync_scheduler, days, tmp_path):
    """expire --retain 3d (a weekend's downtime, as the guide advises), then the next day's append with the
    default retain (a day): the files retired for three days were removed after one, and a checkpoint on the
    old version could not resume.  Two days are made to pass by moving the record of their retirement."""
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    daskpile.expire(str(dest), keep_generations=1, retain="3d")
    retired = dest / snapshot.RETIRED
    entries = json.loads(retired.read_text())
    assert [e.get("retain") for e in entries] == [None, 3 * 86_400]  # the append's (version 0), the expire's
    retired.write_text(json.dumps([{**e, "since": e["since"] - 2 * 86_400} for e in entries]))
    removed = daskpile.append(str(dest), days[2]).removed  # the default: only what was retired with it goes
    assert removed == [f"{os.path.dirname(snapshot.RETIRED)}/v-00000000.json"]
    assert (dest / "part-00000.parquet").exists() and sorted(loader_ids(dest, version=1)) == ids_of(0, 1)
    assert daskpile.append(str(dest), days[3], retain="1d").removed  # a retain given: it applies
    assert not (dest / "part-00000.parquet").exists()


def test_retired_files_stay_for_the_grace_period_and_a_reader_of_the_old_version_finishes(
    sync_scheduler, days, tmp_path
):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    reader = daskpile.PileLoader(str(dest), batch_size=500, seed=0, prefetch=0)
    batches = iter(reader)
    seen = [next(batches)["id"].to_numpy()]
    daskpile.expire(str(dest), keep_generations=1)  # default retain: a day
    assert (dest / "part-00000.parquet").exists()
    seen += [b["id"].to_numpy() for b in batches]  # the epoch goes on over version 1
    assert sorted(np.concatenate(seen)) == ids_of(0, 1)
    assert sorted(loader_ids(dest)) == ids_of(1)  # a new loader: the current version
    assert sorted(loader_ids(dest, version=1)) == ids_of(0, 1)  # an old version, kept for the grace period
    mid_epoch = iter(daskpile.PileLoader(str(dest), batch_size=500, seed=0, version=1, prefetch=0))
    next(mid_epoch)
    report = daskpile.append(str(dest), days[2], retain=0)
    assert not (dest / "part-00000.parquet").exists() and report.removed
    with pytest.raises(FileNotFoundError, match=r"grace period, retain= or --retain, is over\): make the loader again"):
        list(mid_epoch)  # its version's files went while it read
    with pytest.raises(FileNotFoundError, match=r"version 1 of the window .* is gone"):
        daskpile.PileLoader(str(dest), batch_size=500, seed=0, version=1)
    current = daskpile.PileLoader.current_version(str(dest))
    with pytest.raises(ValueError, match=rf"version={current + 5}: the window .* is at version {current}$"):
        daskpile.PileLoader(str(dest), batch_size=500, seed=0, version=current + 5)
    for wrong in (-1, 1.5, True):  # -1 was "version -1 ... is gone (v--0000001.json)"
        with pytest.raises(ValueError, match=rf"version must be a version number, 0 or more, got {wrong!r}"):
            daskpile.PileLoader(str(dest), batch_size=500, seed=0, version=wrong)
    plain = tmp_path / "plain"
    daskpile.shuffle_parquet(days[0], str(plain), piles=PILES, seed=SEED)
    with pytest.raises(ValueError, match=r"version=1: .* is a shuffle result, not a moving window: its version is 0"):
        daskpile.PileLoader(str(plain), batch_size=500, seed=0, version=1)


def test_a_checkpoint_at_an_epochs_end_resumes_after_its_versions_manifest_is_gone(sync_scheduler, days, tmp_path):
    """Appends only, every file of version 1 still there, its manifest removed after the grace period: a state
    taken at the end of an epoch, which needs nothing of it, failed "its files were removed"."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    loader = daskpile.PileLoader(dest, batch_size=500, seed=3, columns=["id"])
    batches = iter(loader)
    next(batches)
    mid_epoch = loader.state_dict()
    for _ in batches:
        pass
    ended = loader.state_dict()
    early = daskpile.PileLoader(dest, batch_size=500, seed=3, columns=["id"])
    early.load_state_dict(ended)  # resumed while version 1 is kept: saved again at once, before reading
    ended = early.state_dict()
    assert ended["ended"] and ended["version"] == 1
    daskpile.append(dest, days[2])
    # Version 1 still kept: the loader stays on its own version, as once version 1 is gone (below).  It went
    # back to version 1 while kept, so ranks resuming on either side of a collect read different rows.
    kept = daskpile.PileLoader(dest, batch_size=500, seed=None, columns=["id"])
    kept.load_state_dict(ended)
    assert list(kept) == [] and kept.version == 2
    kept.set_epoch(1)
    assert sorted(np.concatenate([b["id"].to_numpy() for b in kept])) == ids_of(0, 1, 2)
    daskpile.append(dest, days[3], retain=0)  # version 1's manifest is collected, its files all listed still
    resumed = daskpile.PileLoader(dest, batch_size=500, seed=None, columns=["id"])
    resumed.load_state_dict(ended)
    assert list(resumed) == [] and resumed.seed == 3 and resumed.version == 3
    assert resumed.state_dict()["epoch"] == 0
    with pytest.raises(ValueError, match=r"another loader: mix 1 \(this loader 2\)"):
        daskpile.PileLoader(dest, batch_size=500, seed=3, mix=2, columns=["id"]).load_state_dict(ended)
    resumed.set_epoch(1, version=daskpile.PileLoader.current_version(dest))
    assert sorted(np.concatenate([b["id"].to_numpy() for b in resumed])) == ids_of(0, 1, 2, 3)
    with pytest.raises(FileNotFoundError, match=r"version 1 of the window .* is gone .* its manifest, .* give the "
                                                r"window's commands a retain longer"):  # fmt: skip
        daskpile.PileLoader(dest, batch_size=500, seed=3, columns=["id"]).load_state_dict(mid_epoch)
    with pytest.raises(ValueError, match="the state's seed 3 is not this loader's seed 4"):
        daskpile.PileLoader(dest, batch_size=500, seed=4, columns=["id"]).load_state_dict(ended)


def test_a_state_of_a_window_further_on_belongs_to_another_dataset(sync_scheduler, days, tmp_path):
    """It was said "version=2: the window ... is at version 1", as if the window were behind."""
    further, behind = str(tmp_path / "further"), str(tmp_path / "behind")
    for dest, appended in ((further, days[1:3]), (behind, days[1:2])):
        daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
        for d in appended:
            daskpile.append(dest, d)
    loader = daskpile.PileLoader(further, batch_size=500, seed=0)
    next(iter(loader))
    said = r"^the state belongs to another dataset: it read version 2, and the window .* is at version 1$"
    with pytest.raises(ValueError, match=said):
        daskpile.PileLoader(behind, batch_size=500, seed=0).load_state_dict(loader.state_dict())


def test_the_loader_stays_on_its_version_until_every_rank_is_moved_to_another(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    ranks = [daskpile.PileLoader(str(dest), batch_size=500, seed=0, rank=r, world_size=2) for r in range(2)]
    first = iter(ranks[0])
    seen = [next(first)["id"].to_numpy()]
    state = ranks[0].state_dict()
    assert state["version"] == 1 == ranks[1].version
    daskpile.append(str(dest), days[2])  # between the ranks' epochs: neither moves by itself
    seen += [b["id"].to_numpy() for b in first] + [b["id"].to_numpy() for b in ranks[1]]
    assert sorted(np.concatenate(seen)) == ids_of(0, 1)
    seen = [b["id"].to_numpy() for loader in ranks for b in loader]  # epoch 1: still version 1
    assert sorted(np.concatenate(seen)) == ids_of(0, 1)
    version = daskpile.PileLoader.current_version(str(dest))  # rank 0 reads it, and broadcasts it
    for loader in ranks:
        loader.set_epoch(2, version=version)
    seen = [b["id"].to_numpy() for loader in ranks for b in loader]
    assert version == 2 and sorted(np.concatenate(seen)) == ids_of(0, 1, 2)
    # a job resumed from the state of epoch 0 reads the rest of version 1
    resumed = daskpile.PileLoader(str(dest), batch_size=500, seed=0, world_size=2)
    resumed.load_state_dict(state)
    assert resumed.version == 1
    rest = np.concatenate([b["id"].to_numpy() for b in resumed])
    assert len(rest) + 500 == len(ids_of(0, 1)) // 2


def test_a_job_resumed_mid_epoch_finishes_it_on_its_version_when_its_loop_names_the_new_one(
    sync_scheduler, days, tmp_path
):
    """The guide's loop, ``set_epoch(epoch, version=current)`` before each epoch, resumed after an append: it
    started the epoch again on the new version, and the batches read before the checkpoint were read twice
    (10,000 of 40,000 rows in a new user's trial)."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)

    def epoch_of(loader, epoch, stop_after=None):
        loader.set_epoch(epoch, version=daskpile.PileLoader.current_version(dest))
        ids = []
        for batch in loader:
            ids.append(batch["id"].to_numpy())
            if len(ids) == stop_after:
                break
        return list(np.concatenate(ids))

    loader = daskpile.PileLoader(dest, batch_size=100, seed=0, columns=["id"])
    head = epoch_of(loader, 1, stop_after=3)
    state = loader.state_dict()
    daskpile.append(dest, days[1])  # while the job is down
    resumed = daskpile.PileLoader(dest, batch_size=100, seed=0, columns=["id"])
    resumed.load_state_dict(state)
    rest = epoch_of(resumed, 1)
    assert sorted(head + rest) == ids_of(0) and resumed.version == 0
    other = daskpile.PileLoader(dest, batch_size=50, seed=0, columns=["id"])  # resumed with another batch size
    other.load_state_dict(state)
    assert sorted(head + epoch_of(other, 1)) == ids_of(0) and other.version == 0
    assert sorted(epoch_of(resumed, 2)) == ids_of(0, 1) and resumed.version == 1  # the next epoch moves
    resumed.restart(2, version=daskpile.PileLoader.current_version(dest))
    assert len(list(resumed)) == 2 * DAY_ROWS // 100


def test_a_loader_of_a_shuffle_result_resumes_after_appends(sync_scheduler, days, tmp_path):
    """A shuffle result is version 0 of a window: a state saved on it resumes on it after appends."""
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    loader = daskpile.PileLoader(str(dest), batch_size=500, seed=0)
    batches = iter(loader)
    head = next(batches)["id"].to_numpy()
    state = loader.state_dict()
    assert state["version"] == 0
    daskpile.append(str(dest), days[1])
    resumed = daskpile.PileLoader(str(dest), batch_size=500, seed=0)
    resumed.load_state_dict(state)
    assert sorted(np.concatenate([head, *[b["id"].to_numpy() for b in resumed]])) == ids_of(0)


def test_a_loader_on_a_version_whose_files_were_removed_says_so_in_a_short_traceback(sync_scheduler, days,
                                                                                     tmp_path):  # fmt: skip
    """Each task of a load after the failed read raised its error again, adding its frames to the error's
    traceback: 165 lines of them before the message, on 16 piles."""
    import traceback

    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=16, seed=SEED)
    daskpile.append(str(dest), days[1])
    loader = daskpile.PileLoader(str(dest), batch_size=100, seed=0)
    with pytest.raises(FileNotFoundError, match="the result changed since this loader was made") as raised:
        for i, _ in enumerate(loader):
            if i == 0:
                daskpile.expire(str(dest), keep_generations=1, retain=0)
    assert len("".join(traceback.format_exception(raised.value)).splitlines()) < 80


@pytest.mark.slow
def test_the_same_commands_give_byte_identical_files_on_any_cluster(client, days, tmp_path):
    def run(dest, scheduler):
        with dask.config.set(scheduler=scheduler) if scheduler else contextlib.nullcontext():
            daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
            daskpile.append(str(dest), days[1])
            daskpile.append(str(dest), days[2])
            daskpile.expire(str(dest), keep_generations=2, retain=0)
            daskpile.append(str(dest), days[3])
        files = daskpile.read_manifest(str(dest))["files"]
        return {name: (dest / name).read_bytes() for name in files}

    on_cluster = run(tmp_path / "cluster", None)
    on_sync = run(tmp_path / "sync", "sync")
    assert on_cluster == on_sync and len(on_cluster) == 3 * PILES
    with dask.config.set(scheduler="sync"):
        daskpile.compact(str(tmp_path / "sync"))
    daskpile.compact(str(tmp_path / "cluster"))
    assert file_set(tmp_path / "cluster") == file_set(tmp_path / "sync")


def file_set(dest) -> dict:
    return {name: (dest / name).read_bytes() for name in daskpile.read_manifest(str(dest))["files"]}


def test_shuffle_over_a_window_is_refused_unless_overwrite_which_removes_every_generation(
    sync_scheduler, days, tmp_path
):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    with pytest.raises(FileExistsError, match="moving window"):
        daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.shuffle_parquet(days[2], str(dest), piles=PILES, seed=SEED, overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == ["_daskpile.json"] + [f"part-{j:05d}.parquet" for j in range(4)]


def test_a_result_cut_into_rows_per_file_cannot_take_appends(sync_scheduler, days, tmp_path):
    dest = tmp_path / "cut"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED, rows_per_file=300)
    with pytest.raises(ValueError, match="rows_per_file"):
        daskpile.append(str(dest), days[1])


def test_the_commands(days, tmp_path):
    """On Dask's sync scheduler: the commands on a LocalCluster, as by default, are tested in test_cli.py."""
    dest = str(tmp_path / "window")
    sync = ("--scheduler", "sync")
    assert daskpile_in_process("shuffle", days[0], dest, "--piles", "4", "--seed", "3", "-q", *sync).returncode == 0
    assert "recorded from the sources" in daskpile_in_process("verify", dest, *sync).stdout  # by its manifest
    done = daskpile_in_process("append", days[1], dest, "--scheduler", "sync", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["generations"] == [0, 1]
    assert "appended generation 2" in daskpile_in_process("append", days[2], dest, "--scheduler", "sync").stdout
    assert daskpile_in_process("verify", dest, "-q", *sync).returncode == 0
    expired = daskpile_in_process("expire", dest, "--before", "1", "--column", "day", "--retain", "0")
    assert expired.returncode == 0 and "expired generation 0" in expired.stdout
    assert "expired generation 1" in daskpile_in_process("expire", dest, "--keep", "1").stdout
    assert daskpile_in_process("expire", dest).returncode == 2
    compacted = daskpile_in_process("compact", dest, "--scheduler", "sync")
    assert compacted.returncode == 0 and "nothing to compact" in compacted.stdout
    assert "nothing under way" in daskpile_in_process("discard", dest).stdout
    assert sorted(window_ids(dest)) == ids_of(2)


@pytest.mark.slow
def test_a_window_on_an_object_store(days, tmp_path):
    from _cluster import moto_s3

    with moto_s3(buckets=("lake",)) as (fs, options), dask.config.set(scheduler="sync"):
        dest = "s3://lake/window"
        daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED, storage_options=options)
        daskpile.append(dest, days[1], storage_options=options, scratch="s3://lake/tmp")
        daskpile.append(dest, days[2], storage_options=options, scratch="s3://lake/tmp")
        daskpile.expire(dest, keep_generations=2, storage_options=options, retain=0)
        assert daskpile.verify(dest, storage_options=options).ok
        loader = daskpile.PileLoader(dest, batch_size=500, seed=0, storage_options=options)
        assert sorted(np.concatenate([b["id"].to_numpy() for b in loader])) == ids_of(1, 2)
        daskpile.compact(dest, storage_options=options, retain=0)
        assert daskpile.verify(dest, storage_options=options).ok
        assert not fs.exists("lake/window/part-00000.parquet") and fs.glob("lake/tmp/daskpile-*") == []
        manifest = daskpile.read_manifest(dest, storage_options=options)
        assert pc.sum(pa.array(manifest["rows_per_file"])).as_py() == 2 * DAY_ROWS


@pytest.mark.slow
def test_quality_after_10_appends_and_5_expiries_sees_no_arrival_order_in_the_loaders_order(sync_scheduler, tmp_path):
    """Ids are arrival order.  Read in the loader's order the window passes ``quality`` (each check at alpha 1e-3);
    its files read one after the other, as a plain reader bypassing the loader would, fail it."""
    rows = 50_000  # the window ends with 300,000 of the 550,000 rows appended
    inputs = tmp_path / "in"
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(day(inputs, 0, rows), dest, piles=16, seed=SEED)
    for number in range(1, 11):
        daskpile.append(dest, day(inputs, number, rows), retain=0)
        if number >= 6:  # 5 expiries, each dropping the oldest generation
            assert daskpile.expire(dest, keep_generations=6, retain=0).changed
    manifest = daskpile.read_manifest(dest)
    assert [g["number"] for g in manifest["window"]["generations"]] == list(range(5, 11))
    assert manifest["rows"] == 6 * rows and daskpile.verify(dest).ok
    report = daskpile.quality(dest, order_column="id", label_column="day")
    assert report.ok, str(report)
    plain = daskpile.quality([os.path.join(dest, f) for f in manifest["files"]], order_column="id")
    assert not plain.ok


def _window_of_days(tmp_path, days: int = 3) -> tuple[str, list[str]]:
    """A window of day 0 with days 1 .. days - 1 appended; ``val`` null and ``f`` NaN on every seventh row."""
    inputs = tmp_path / "in"
    sources = []
    for number in range(days + 1):
        table = reference_table(number * DAY_ROWS, (number + 1) * DAY_ROWS, 10**9)
        ids = table["id"].to_numpy()
        table = table.append_column("val", pa.array(np.where(ids % 7 == 0, np.nan, ids), from_pandas=True))
        table = table.append_column("cat", pa.array([f"c{i % 3}" for i in ids]).dictionary_encode())
        table = table.append_column("f", pa.array(np.where(ids % 7 == 0, np.nan, ids)))  # NaN, not null
        write_parts(table, inputs / f"day-{number}", parts=2)
        sources.append(str(inputs / f"day-{number}"))
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(sources[0], dest, piles=PILES, seed=SEED)
    for source in sources[1:days]:
        daskpile.append(dest, source)
    return dest, sources


def test_a_null_is_never_before_the_value_and_every_cut_marked_applies(sync_scheduler, tmp_path):
    dest, _ = _window_of_days(tmp_path)
    # day 1 holds ids 2,000-3,999: cut at 2,500, then at 3,000 on another column (its values are the ids)
    daskpile.expire(dest, before=2_500, column="id")
    report = daskpile.expire(dest, before=3_000, column="val")
    assert report.generations == [1, 2]  # day 0's nulls kept nothing of it: every row with a value was before
    manifest = daskpile.read_manifest(dest)
    assert manifest["window"]["generations"][0]["cuts"] == [
        {"column": "id", "before": 2_500}, {"column": "val", "before": 3_000.0}
    ]  # fmt: skip
    assert manifest["window"]["generations"][1]["cuts"] == []  # day 2: nothing below either value
    daskpile.compact(dest)
    kept = set(window_ids(dest))
    day_1 = range(DAY_ROWS, 2 * DAY_ROWS)
    expected = {i for i in day_1 if i >= 3_000 or (i % 7 == 0 and i >= 2_500)} | set(ids_of(2))
    assert kept == expected and daskpile.verify(dest).ok


def test_a_generation_with_nulls_only_beside_earlier_values_stays(sync_scheduler, tmp_path):
    dest, _ = _window_of_days(tmp_path, days=2)
    report = daskpile.expire(dest, before=10**6, column="val")  # every value before it; the nulls are not
    assert report.generations == [0, 1]
    daskpile.compact(dest)
    assert sorted(window_ids(dest)) == [i for i in ids_of(0, 1) if i % 7 == 0]


def test_expire_by_a_dictionary_column_and_a_column_without_order(sync_scheduler, tmp_path):
    dest, _ = _window_of_days(tmp_path, days=2)
    assert not daskpile.expire(dest, before="c0", column="cat").changed  # c0 is the least value: nothing below
    daskpile.expire(dest, before="c1", column="cat")
    daskpile.compact(dest)
    assert sorted(window_ids(dest)) == [i for i in ids_of(0, 1) if i % 3 != 0]
    (tmp_path / "lists").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "l": [[1], [2]]}), tmp_path / "lists" / "a.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "lists"), str(tmp_path / "lw"), piles=1, seed=1)
    with pytest.raises(ValueError, match="expire by the values of a number, a date, a timestamp or text"):
        daskpile.expire(str(tmp_path / "lw"), before=1, column="l")


def test_appending_to_a_window_of_partition_folders(sync_scheduler, tmp_path):
    for year, start in ((2023, 0), (2024, 100), (2025, 200)):
        folder = tmp_path / ("old" if year < 2025 else "new") / f"year={year}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": np.arange(start, start + 100)}), folder / "a.parquet")
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(str(tmp_path / "old"), dest, piles=2, seed=1)
    daskpile.append(dest, str(tmp_path / "new"))
    table = pa.concat_tables(
        [pq.read_table(os.path.join(dest, f)) for f in daskpile.read_manifest(dest)["files"]]
    )  # fmt: skip
    assert sorted(zip(table["id"].to_pylist(), table["year"].to_pylist(), strict=True)) == [
        (i, 2023 + i // 100) for i in range(300)
    ]
    assert daskpile.verify(dest).ok


def test_files_already_in_the_window_are_refused(sync_scheduler, days, tmp_path):
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    with pytest.raises(ValueError, match=r"is in the window already \(appended in generation 1"):
        daskpile.append(dest, [days[1], days[2]])
    with pytest.raises(ValueError, match="overlaps"):
        daskpile.append(dest, os.path.join(dest, "gen-000001"))
    with pytest.raises(ValueError, match="an append takes the window's columns"):
        other = tmp_path / "other"
        other.mkdir()
        pq.write_table(pa.table({"id": [1]}), other / "a.parquet")
        daskpile.append(dest, str(other))
    assert daskpile.read_manifest(dest)["window"]["version"] == 1


def test_files_in_the_window_under_another_path_are_held_by_the_file(sync_scheduler, days, tmp_path):
    """A day appended again through a link to its folder (or a bind mount), beside a new day: the window held
    it twice (4,000 rows, 3,000 distinct), verify said match.  Alone, it is a retry: nothing to do."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    (tmp_path / "mount").symlink_to(Path(days[1]).parent)
    linked = str(tmp_path / "mount" / Path(days[1]).name)
    with pytest.raises(
        ValueError,
        match=rf"mount/day-1/in-00[01]\.parquet is in the window already \(appended as "
        rf"{Path(days[1])}/in-00[01]\.parquet in generation 1, unchanged since\)",
    ):
        daskpile.append(dest, [linked, days[2]])
    retried = daskpile.append(dest, linked)
    assert not retried.changed and retried.summary.startswith("already appended as generation 1: nothing to do")
    assert sorted(loader_ids(dest)) == ids_of(0, 1)


def test_a_day_appended_over_two_appends_retried_whole_is_done(sync_scheduler, days, tmp_path):
    """A late file appended on its own, then the cron job's retry of the day's folder: refused ("append only
    new files"), exit 2, with nothing new to append."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    late = Path(days[1]) / "in-001.parquet"
    late.rename(tmp_path / "late.parquet")
    daskpile.append(dest, days[1])
    (tmp_path / "late.parquet").rename(late)
    daskpile.append(dest, str(late))
    retried = daskpile.append(dest, days[1])
    assert not retried.changed and retried.summary.startswith("already appended as generations 1, 2: nothing to do")
    assert retried.generation == 2 and sorted(loader_ids(dest)) == ids_of(0, 1)


def test_a_day_folder_holding_a_csv_beside_its_parquet_is_refused_with_advice_append_takes(sync_scheduler, days,
                                                                                           tmp_path):  # fmt: skip
    """It said "pass format= (--format)", which append has not (a click error, a TypeError)."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    (Path(days[1]) / "export.csv").write_text("id,v\n1,0.5\n")
    said = (r"holds Parquet files and csv files \(.*export\.csv\): append reads the files of one format: move the "
            r"others out, or name the day's files")  # fmt: skip
    with pytest.raises(ValueError, match=said):
        daskpile.append(dest, days[1])
    assert daskpile.append(dest, os.path.join(days[1], "*.parquet")).generation == 1


def test_a_window_whose_first_day_declares_a_column_never_null_takes_a_later_day_s_nulls(sync_scheduler,
                                                                                         tmp_path):  # fmt: skip
    """A first day written by Spark (NOT NULL columns), a later one with a null: the append was refused, with
    no way through, where the guide says nullability may differ."""
    not_null = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.float64(), nullable=False)])
    for number, table in ((1, pa.table({"id": [1, 2, 3], "v": [0.1, 0.2, 0.3]}, schema=not_null)),
                          (2, pa.table({"id": [4, 5], "v": [None, 0.5]}))):  # fmt: skip
        (tmp_path / f"day={number}").mkdir()
        pq.write_table(table, tmp_path / f"day={number}" / "p.parquet")
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(str(tmp_path / "day=1"), dest, piles=2, seed=1, partitioning="none")
    assert daskpile.append(dest, str(tmp_path / "day=2"), partitioning="none").rows == 5
    assert sorted(loader_ids(dest)) == [1, 2, 3, 4, 5] and daskpile.verify(dest).ok
    daskpile.compact(dest)
    assert sorted(loader_ids(dest)) == [1, 2, 3, 4, 5] and daskpile.verify(dest).ok


def test_a_generations_folder_is_refused_as_dest_naming_the_window(sync_scheduler, days, tmp_path):
    """A generation's folder holds a manifest of its own: a shuffle there with --overwrite replaced the
    generation's files under the window (verify then failed, the loader refused it), and an append there
    started a window inside the window."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    generation = os.path.join(dest, "gen-000001")
    said = r"dest '.*window/gen-000001' is inside the moving window '.*window' \(version 1\): .* give the window"
    with pytest.raises(ValueError, match=said):
        daskpile.shuffle_parquet(days[2], generation, piles=PILES, seed=9, overwrite=True)
    for change in (lambda: daskpile.append(generation, days[2]), lambda: daskpile.compact(generation)):
        with pytest.raises(ValueError, match=said):
            change()
    run = daskpile_in_process("shuffle", days[2], generation, "--piles", "4", "--overwrite")
    assert run.returncode == 2 and "is inside the moving window" in run.stderr, run.stderr
    assert sorted(window_ids(dest)) == ids_of(0, 1) and daskpile.verify(dest).ok
    assert daskpile.read_manifest(dest)["window"]["version"] == 1


def test_a_changed_file_at_a_path_the_window_holds_is_refused_unless_asked(sync_scheduler, days, tmp_path):
    """A day written again upstream (corrected) at the same paths was appended as new files: its old rows and
    the corrected ones both in the window, and verify said match.  A path's new contents may be that, or a
    landing path's next day: only the user knows, so it is refused, naming the file, unless asked (--again)."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    landing = tmp_path / "landing"
    shutil.copytree(days[2], landing)
    daskpile.append(dest, str(landing))  # day 2 lands, generation 2
    changed = sorted(landing.glob("*.parquet"))[-1]
    corrected = pq.read_table(changed)
    x = corrected.schema.get_field_index("x")
    pq.write_table(corrected.set_column(x, "x", pc.negate(corrected["x"])), changed)  # one file of the day
    said = (
        rf"{changed.name} is in the window already \(appended in generation 2\) and has changed since: its rows as "
        rf"appended then are still in the window. .*--generation 2\), then append; .* pass again=True \(--again on "
        r"the command line\)"
    )
    with pytest.raises(ValueError, match=said):  # the changed file named, not the unchanged ones beside it
        daskpile.append(dest, str(landing))
    daskpile.expire(dest, generations=[2])  # the day's rows as they were, dropped
    daskpile.append(dest, str(landing))  # and the corrected day appended
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2) and daskpile.verify(dest).ok
    shutil.rmtree(landing)
    shutil.copytree(days[3], landing)  # a landing path: the next day, at the same paths
    with pytest.raises(ValueError, match="has changed since"):
        daskpile.append(dest, str(landing))
    daskpile.append(dest, str(landing), again=True)
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2, 3)


def test_an_expired_day_is_refused_by_its_paths_even_touched(sync_scheduler, days, tmp_path):
    """Expired files were remembered with their stamps: after a touch (or a copy, a sync) the expired day
    came back as the newest generation, and the next expire --keep dropped a recent day in its place."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    for d in (1, 2):
        daskpile.append(dest, days[d])
    daskpile.expire(dest, keep_generations=1)  # day 2 stays
    for path in sorted(Path(days[1]).glob("*.parquet")):
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 60))
    with pytest.raises(ValueError, match=r"in-000.parquet was in generation 1 \(as appended, or compacted\)"):
        daskpile.append(dest, days[1])
    assert sorted(window_ids(dest)) == ids_of(2)


def test_expire_by_generation_drops_a_day_to_append_it_corrected(sync_scheduler, days, tmp_path):
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    daskpile.append(dest, days[2])
    with pytest.raises(ValueError, match=r"has no generation 7 \(it holds 0, 1, 2\)"):
        daskpile.expire(dest, generations=[7])
    with pytest.raises(ValueError, match="give one of"):
        daskpile.expire(dest, generations=[1], keep_generations=2)
    report = daskpile.expire(dest, generations=[1])
    assert report.generations == [0, 2] and sorted(window_ids(dest)) == ids_of(0, 2)
    assert not daskpile.expire(dest, generations=[1]).changed  # expired already
    daskpile.append(dest, days[1])  # the corrected day, as the newest generation (dropped by name: not refused)
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2) and daskpile.verify(dest).ok
    with pytest.raises(ValueError, match=r"would leave the window .* empty"):
        daskpile.expire(dest, generations=[0, 2, 3])
    daskpile.compact(dest)  # generation 4 holds 0, 2 and 3
    with pytest.raises(ValueError, match=r"generation 2 was compacted into generation 4, with generations 0, 2, 3"):
        daskpile.expire(dest, generations=[2])
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2)


def test_expiring_all_but_empty_days_is_refused_naming_how_many_to_keep(sync_scheduler, days, tmp_path):
    """Days appended empty are generations: ``keep_generations=2`` after two of them emptied the window, and said
    it had expired its rows (a new user's trial: 12,000 rows gone, exit 0)."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    for name in ("sat", "sun"):
        write_parts(reference_table(0, 0, 10**9).append_column("day", pa.array([], pa.int32())), tmp_path / name, 1)
        assert daskpile.append(dest, str(tmp_path / name)).rows == 2 * DAY_ROWS
    said = r"kept \(2, 3\) hold no rows .* would leave the window .* empty; keep the newest 3 \(--keep 3\) to keep"
    with pytest.raises(ValueError, match=said + " the rows of generation 1"):
        daskpile.expire(dest, keep_generations=2)
    with pytest.raises(ValueError, match=r"the generations kept \(2, 3\) hold no rows .* append the new files first"):
        daskpile.expire(dest, generations=[0, 1])
    assert sorted(window_ids(dest)) == ids_of(0, 1)
    assert daskpile.expire(dest, keep_generations=3).changed
    assert sorted(window_ids(dest)) == ids_of(1)


def test_compact_keeps_an_unverified_generation_unverified_and_counts_its_rows(sync_scheduler, days, tmp_path):
    """compact recorded the fingerprint of the rows it wrote, so an append made with verify=False came out
    "verified", and a row lost from its file went unnoticed (40,000 rows became 39,999, verify said match)."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1], verify=False)
    name = daskpile.read_manifest(dest)["files"][-1]
    path = os.path.join(dest, name)
    original = pq.read_table(path)
    pq.write_table(original.slice(1), path)  # a row of the unverified generation lost
    with pytest.raises(daskpile.VerificationError, match=rf"{name} holds .* the window's manifest recorded"):
        daskpile.compact(dest)
    assert daskpile.read_manifest(dest)["window"]["version"] == 1
    assert not os.path.exists(os.path.join(dest, snapshot.generation_dir(2)))
    pq.write_table(original, path)
    daskpile.compact(dest)  # no change was left under way
    assert sorted(window_ids(dest)) == ids_of(0, 1)
    with pytest.raises(ValueError, match="verify=False: no fingerprint"):
        daskpile.verify(dest)
    assert daskpile.verify([days[0], days[1]], dest).ok


@pytest.mark.slow
def test_a_day_expired_then_appended_again_by_mistake_is_refused_unless_asked(sync_scheduler, days, tmp_path):
    """A week-old day appended again came back as the newest generation, and the next expire --keep 2 dropped
    day 2 in its place: the window of the last two days held days 1 and 3."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    for d in (1, 2, 3):
        daskpile.append(dest, days[d])
    daskpile.expire(dest, keep_generations=2)  # days 2 and 3
    for old in (days[1], days[0]):  # an appended day, and the shuffle's own source
        with pytest.raises(ValueError, match=r"was in generation \d \(as appended, or compacted\), which expire has"):
            daskpile.append(dest, old)
    assert sorted(window_ids(dest)) == ids_of(2, 3)
    daskpile.append(dest, days[1], again=True)  # a backfill, asked for
    assert sorted(window_ids(dest)) == ids_of(1, 2, 3)
    run = daskpile_in_process("append", days[0], dest)
    assert run.returncode == 2 and "Pass again=True (--again on the command line)" in run.stderr
    assert daskpile_in_process("append", days[0], dest, "--again").returncode == 0
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2, 3)


def test_the_same_day_under_another_path_is_refused_by_its_rows(sync_scheduler, days, tmp_path):
    """A day copied to another folder (re-landed upstream) was a new set of files: every row twice."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    copy = tmp_path / "relanded" / "day-1"
    shutil.copytree(days[1], copy)
    with pytest.raises(ValueError, match=r"are those of generation 1 \(from .*day-1.*\), row for row"):
        daskpile.append(dest, str(copy))
    assert sorted(window_ids(dest)) == ids_of(0, 1)
    assert not os.path.exists(os.path.join(dest, snapshot.generation_dir(2)))
    daskpile.append(dest, days[2])  # no change was left under way
    daskpile.append(dest, str(copy), again=True)
    assert len(window_ids(dest)) == len(ids_of(0, 1, 1, 2))


def test_an_expired_day_under_another_path_is_refused_by_its_rows(sync_scheduler, days, tmp_path):
    """Expire refuses a dropped day's paths; a trial's copy of one, under another path, came back as the newest
    generation, and the next expire --keep would have dropped a recent day in its place."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    daskpile.append(dest, days[2])
    daskpile.expire(dest, keep_generations=2)
    copy = tmp_path / "relanded" / "day-0"
    shutil.copytree(days[0], copy)
    with pytest.raises(ValueError, match=r"are those of generation 0, row for row, which expire has dropped since"):
        daskpile.append(dest, str(copy))
    assert sorted(window_ids(dest)) == ids_of(1, 2)
    daskpile.append(dest, str(copy), again=True)  # a backfill, asked for
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2)


def test_a_json_lines_day_fills_a_windows_dictionary_columns(sync_scheduler, tmp_path):
    """Arrow's JSON reader converts to no dictionary type: a day of JSON lines into a window with a categorical
    column failed "JSON conversion to dictionary<...> is not supported", where a CSV day filled it."""
    kinds = pa.array(["a", "b"] * 50).dictionary_encode()
    table = pa.table({"id": np.arange(100), "kind": kinds, "code": pa.array([7, 9] * 50).dictionary_encode()})
    write_parts(table, tmp_path / "day-0", 1)
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(str(tmp_path / "day-0"), dest, piles=2, seed=SEED)
    lines = "".join(f'{{"id": {100 + i}, "kind": {json.dumps(["c", None][i % 2])}, "code": {i}}}\n' for i in range(10))
    (tmp_path / "day-1.jsonl").write_text(lines)
    assert daskpile.append(dest, str(tmp_path / "day-1.jsonl")).rows == 110
    out = pa.concat_tables(pq.read_table(os.path.join(dest, f)) for f in daskpile.read_manifest(dest)["files"])
    assert out.schema.field("kind").type == kinds.type  # (Parquet gives the codes back as int64)
    got = sorted(zip(out["id"].to_pylist(), out["kind"].to_pylist(), out["code"].to_pylist(), strict=True))
    assert got[100:] == [(100 + i, ["c", None][i % 2], i) for i in range(10)] and len(got) == 110


def test_a_lazy_windows_manifest_says_whether_its_files_are_permuted_after_a_compact(sync_scheduler, days, tmp_path):
    """compact permutes every pile, yet a window begun ``--lazy`` still said ``"second_pass": "lazy"`` after it,
    and ``quality`` told plain readers they got each pile unpermuted (a new user's trial).  Appends after it
    stay lazy, as the window began."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED, second_pass="lazy")
    daskpile.append(dest, days[1])
    assert daskpile.read_manifest(dest)["second_pass"] == "lazy"
    daskpile.compact(dest)
    compacted = daskpile.read_manifest(dest)
    assert compacted["second_pass"] == "eager" and compacted["window"]["lazy"] is True
    ids = pq.read_table(os.path.join(dest, compacted["files"][0]))["id"].to_numpy()
    assert not np.all(np.diff(ids) > 0)  # permuted (a lazy pile is in input order)
    appended = daskpile.append(dest, days[2])
    manifest = daskpile.read_manifest(dest)
    assert manifest["second_pass"] == "lazy" and manifest["window"]["lazy"] is True
    newest = [f for f in manifest["files"] if f.startswith(f"gen-{appended.generation:06d}/")]
    assert all(np.all(np.diff(pq.read_table(os.path.join(dest, f))["id"].to_numpy()) > 0) for f in newest)
    assert sorted(loader_ids(dest)) == ids_of(0, 1, 2)


def test_what_an_append_cannot_do_is_said_plainly(sync_scheduler, days, tmp_path, monkeypatch):
    """A first append into a window not made yet said "holds no _daskpile.json"; a JSON-lines day "Parquet magic
    bytes not found ... corrupted"; an interrupted append run again on a file changed since "run it again"."""
    append_module = importlib.import_module("daskpile.window.append")  # (the package's name is the function)

    dest = str(tmp_path / "window")
    with pytest.raises(FileNotFoundError, match=r"does not exist: a window starts as an ordinary shuffle"):
        daskpile.append(dest, days[1])
    os.makedirs(dest)
    pq.write_table(pq.read_table(days[0]), os.path.join(dest, "part.0.parquet"))  # as Dask's to_parquet writes
    with pytest.raises(FileNotFoundError, match=r"holds no _daskpile.json: .*: a window starts as a shuffle of its"):
        daskpile.append(dest, days[1])
    shutil.rmtree(dest)
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    (tmp_path / "events.jsonl").write_text('{"id": 1, "unknown": 2}\n')
    with pytest.raises(ValueError, match=r"events.jsonl' as jsonl: .*field 'unknown' is not a column of the window"):
        daskpile.append(dest, str(tmp_path / "events.jsonl"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(append_module, "shuffle_plan", interrupted)
    with pytest.raises(KeyboardInterrupt):
        daskpile.append(dest, days[1])
    monkeypatch.undo()
    pending = r"unfinished `daskpile append` \(append of 2 files .*day-1.*if it was interrupted, run it again"
    with pytest.raises(daskpile.WindowBusyError, match=pending):
        daskpile.append(dest, days[2])  # another day: the pending one is not this one, changed or not
    changed = sorted(Path(days[1]).glob("*.parquet"))[1]
    os.utime(changed, (changed.stat().st_atime, changed.stat().st_mtime + 60))
    said = rf"cannot finish: .*{changed.name} changed since it began\. If it is still running, let it finish; else "
    with pytest.raises(daskpile.WindowBusyError, match=said + r"`daskpile discard` it, then run this again"):
        daskpile.append(dest, days[1])
    os.utime(changed, (changed.stat().st_atime, changed.stat().st_mtime - 60))
    late = Path(days[1]) / "late.parquet"  # a late file of the day, then the same command run again
    pq.write_table(pq.read_table(changed).slice(0, 0), late)
    said = r"cannot finish: its files differ \(3 files now, 2 then; .*late\.parquet is new\)\. If it is still running"
    with pytest.raises(daskpile.WindowBusyError, match=said):
        daskpile.append(dest, days[1])
    late.unlink()
    daskpile.discard(dest)
    daskpile.append(dest, days[1])
    assert sorted(window_ids(dest)) == ids_of(0, 1)


def test_after_a_discard_the_next_append_takes_the_generation_afresh(sync_scheduler, days, tmp_path, monkeypatch):
    """An append interrupted in pass 1 leaves scratch; discard removes it, so another append is not refused."""
    from daskpile.engine import _passes

    dest, scratch = str(tmp_path / "window"), tmp_path / "scratch"
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    big = tmp_path / "big"
    write_parts(pq.read_table(days[1]), big, parts=6)
    real, calls = _passes.scatter_partition, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(_passes, "scatter_partition", interrupted)
        with pytest.raises(KeyboardInterrupt):
            daskpile.append(dest, str(big), scratch=str(scratch), blocksize="4KiB")
    assert any(scratch.iterdir())  # the checkpoint a rerun would resume from
    with pytest.raises(daskpile.WindowBusyError):
        daskpile.compact(dest)
    daskpile.discard(dest)
    assert not any(scratch.iterdir())
    assert daskpile.append(dest, days[2], scratch=str(scratch)).generation == 1
    assert sorted(window_ids(Path(dest))) == ids_of(0, 2)


def test_shuffle_overwrite_replaces_a_window_with_retired_files(sync_scheduler, days, tmp_path):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    daskpile.append(str(dest), days[1])
    daskpile.expire(str(dest), keep_generations=1)  # generation 0's files retired, kept a day
    assert (dest / "part-00000.parquet").exists()
    daskpile.shuffle_parquet(days[2], str(dest), piles=2, seed=SEED, overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == ["_daskpile.json", "part-00000.parquet", "part-00001.parquet"]


def test_a_window_of_no_rows_gives_epochs_of_no_batch(sync_scheduler, days, tmp_path):
    dest = str(tmp_path / "window")
    for name in ("none-0", "none-1"):  # days of no rows (expire refuses to empty a window)
        (tmp_path / name).mkdir()
        pq.write_table(pq.read_table(days[0]).slice(0, 0), tmp_path / name / "in-000.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "none-0"), dest, piles=PILES, seed=SEED)
    daskpile.append(dest, str(tmp_path / "none-1"))
    assert daskpile.read_manifest(dest)["rows"] == 0 and daskpile.read_manifest(dest)["window"]["version"] == 1
    loader = daskpile.PileLoader(dest, batch_size=100, seed=0)
    assert len(loader) == 0 and list(loader) == [] and loader.epoch == 1
    assert daskpile.verify(dest).ok


def test_a_commit_over_a_version_written_meanwhile_is_refused(sync_scheduler, days, tmp_path):
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    stale = snapshot.Window.load(dest)
    daskpile.append(dest, days[1])  # another process's change
    with pytest.raises(daskpile.WindowBusyError, match="changed while this command ran"):
        stale.commit(list(stale.generations))
    assert daskpile.read_manifest(dest)["window"]["version"] == 1


def test_commands_interrupted_after_their_version_are_finished_by_running_them_again(
    sync_scheduler, days, tmp_path, monkeypatch
):
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    daskpile.append(dest, days[1])
    for command in (lambda: daskpile.compact(dest), lambda: daskpile.append(dest, days[2])):
        with monkeypatch.context() as patched:  # killed between the new version and the marker's removal
            patched.setattr(snapshot, "finish", lambda fs, path: (_ for _ in ()).throw(KeyboardInterrupt))
            with pytest.raises(KeyboardInterrupt):
                command()
        assert (Path(dest) / snapshot.PENDING).exists()
        again = command()
        assert not again.changed and not (Path(dest) / snapshot.PENDING).exists()
    assert sorted(window_ids(dest)) == ids_of(0, 1, 2) and daskpile.verify(dest).ok
    # after a compaction, retrying an append of files it merged does nothing
    daskpile.compact(dest)
    assert not daskpile.append(dest, days[1]).changed


def test_shuffle_overwrite_replaces_a_result_whose_first_append_was_interrupted(
    sync_scheduler, days, tmp_path, monkeypatch
):
    dest = tmp_path / "window"
    daskpile.shuffle_parquet(days[0], str(dest), piles=PILES, seed=SEED)
    append_killed_before_its_version(dest, days[1], monkeypatch)
    daskpile.shuffle_parquet(days[2], str(dest), piles=2, seed=SEED, overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == ["_daskpile.json", "part-00000.parquet", "part-00001.parquet"]


def test_a_nan_like_a_null_is_never_before_the_value(sync_scheduler, tmp_path):
    dest, _ = _window_of_days(tmp_path, days=2)
    assert daskpile.expire(dest, before=3_000.0, column="f").generations == [0, 1]  # day 0 stays for its NaNs
    daskpile.compact(dest)
    assert sorted(window_ids(dest)) == [i for i in ids_of(0, 1) if i >= 3_000 or i % 7 == 0]


def test_expire_says_that_keep_before_and_generation_are_ways_not_that_one_is_missing(sync_scheduler, tmp_path):
    both = daskpile_in_process("expire", str(tmp_path / "w"), "--keep", "2", "--before", "3", "--column", "day")
    assert both.returncode == 2 and "--keep and --before drop generations in different ways" in both.stderr
    two = daskpile_in_process("expire", str(tmp_path / "w"), "--generation", "1", "--keep", "1")
    assert two.returncode == 2 and "--keep and --generation drop generations in different ways" in two.stderr
    neither = daskpile_in_process("expire", str(tmp_path / "w"))
    assert neither.returncode == 2 and "give --keep N, --before VALUE with --column C, or --generation N" in (
        neither.stderr
    )
    dest, _ = _window_of_days(tmp_path, days=3)
    done = daskpile_in_process("expire", dest, "--generation", "0", "--generation", "2")
    assert done.returncode == 0 and "expired generations 0, 2" in done.stdout
    assert sorted(window_ids(dest)) == ids_of(1)


def json_day(path: Path, number: int, rows: int = 500, extra: dict | None = None) -> str:
    """A day of JSON-lines events, ids ``number * rows ...``; ``extra`` fields on its middle line."""
    lines = [{"id": number * rows + i, "text": f"event {i}", "score": i / 7} for i in range(rows)]
    lines[rows // 2] |= extra or {}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_days_of_json_lines_and_csv_are_appended_parsed_into_the_window_s_columns(sync_scheduler, tmp_path):
    """A feed of JSON lines kept in a window: append refused every day but Parquet ("write the day as Parquet
    first").  Each day is parsed into the window's columns and types, with its first data's read options."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(json_day(tmp_path / "day-0.jsonl", 0), dest, piles=PILES, seed=SEED)
    day1 = json_day(tmp_path / "day-1.jsonl", 1)
    report = daskpile.append(dest, day1)
    assert report.generation == 1 and report.rows == 1_000 and daskpile.verify(dest).ok
    assert sorted(loader_ids(dest)) == list(range(1_000))
    assert not daskpile.append(dest, day1).changed  # a retry: nothing to do
    schema = pq.read_schema(os.path.join(dest, daskpile.read_manifest(dest)["files"][-1]))
    assert [schema.field(n).type for n in ("id", "text", "score")] == [pa.int64(), pa.string(), pa.float64()]

    # a field the window has not, or a value its column cannot hold: refused naming the file, nothing changed
    refusals = [(2, {"tag": "x"}, r"field 'tag' is not a column of the window"),
                (3, {"id": "seven"}, r"JSON parse error: Column\(/id\) changed from number to string")]  # fmt: skip
    for number, extra, said in refusals:
        path = json_day(tmp_path / f"day-{number}.jsonl", number, extra=extra)
        with pytest.raises(ValueError, match=rf"day-{number}.jsonl' as jsonl: the line at byte [\d,]+: {said}"):
            daskpile.append(dest, path)
        assert daskpile.read_manifest(dest)["window"]["generations"][-1]["number"] == 1
    # a day of Parquet, of the same columns, too
    pq.write_table(pa.table({"id": [9_000], "text": ["late"], "score": [0.5]}), tmp_path / "late.parquet")
    assert daskpile.append(dest, str(tmp_path / "late.parquet")).rows == 1_001

    # CSV read with a delimiter: later days read with the same read options
    csv_dest = str(tmp_path / "csv-window")
    for number in range(2):
        (tmp_path / f"c-{number}.csv").write_text("id;v\n" + "".join(f"{number * 100 + i};{i}\n" for i in range(100)))
    daskpile.shuffle_parquet(str(tmp_path / "c-0.csv"), csv_dest, piles=2, seed=1, read_options={"delimiter": ";"})
    assert daskpile.append(csv_dest, str(tmp_path / "c-1.csv")).rows == 200
    assert sorted(loader_ids(csv_dest)) == list(range(200)) and daskpile.verify(csv_dest).ok


def test_a_json_day_s_time_without_its_offset_is_refused_in_a_column_with_a_zone(sync_scheduler, tmp_path):
    """Arrow's JSON reader takes "2026-11-02T10:00:00" as UTC in a column with a zone: a day's local times were
    stored as UTC and verified, where the same value in CSV, or a Parquet day without the zone, is refused (a
    new user's trial of a daily feed).  Times with their offset are read as the instants they are."""
    dest = str(tmp_path / "window")
    utc = pa.timestamp("us", tz="UTC")
    day0 = pa.table({"id": [1, 2], "ts": pa.array([datetime.datetime(2026, 11, 1, 9, tzinfo=datetime.UTC)] * 2, utc)})
    pq.write_table(day0, tmp_path / "day-0.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "day-0.parquet"), dest, piles=2, seed=SEED)
    (tmp_path / "day-1.jsonl").write_text(
        '{"id": 3, "ts": "2026-11-02T10:00:00+02:00"}\n{"id": 4, "ts": "2026-11-02T10:00:00"}\n'
    )
    with pytest.raises(ValueError, match=r"the line at byte 45: column 'ts' is of type timestamp\[us, tz=UTC\] in the "
                       r"window .*expected a zone offset"):  # fmt: skip
        daskpile.append(dest, str(tmp_path / "day-1.jsonl"))
    assert "window" not in daskpile.read_manifest(dest)  # (still the shuffle's result, nothing appended)
    (tmp_path / "day-2.jsonl").write_text('{"id": 3, "ts": "2026-11-02T10:00:00+02:00"}\n{"id": 4, "ts": null}\n')
    daskpile.append(dest, str(tmp_path / "day-2.jsonl"))
    read = pa.concat_tables(
        pq.read_table(os.path.join(dest, f)) for f in daskpile.read_manifest(dest)["files"]
    ).sort_by("id")  # fmt: skip
    assert read.column("ts").to_pylist()[2:] == [datetime.datetime(2026, 11, 2, 8, tzinfo=datetime.UTC), None]


def test_a_window_s_column_of_type_null_says_why_no_day_with_a_value_can_be_appended(sync_scheduler, tmp_path):
    """pandas writes a column with no value as type null: a window of such first data refused every later day
    with a value there, saying "convert the files", which cannot help (a new user's trial of a daily feed)."""
    import pandas as pd

    dest = str(tmp_path / "window")
    pd.DataFrame({"id": [1, 2, 3], "coupon": [None, None, None]}).to_parquet(tmp_path / "d0.parquet")
    pd.DataFrame({"id": [4], "coupon": [None]}).to_parquet(tmp_path / "d1.parquet")
    pd.DataFrame({"id": [5, 6], "coupon": ["SAVE10", None]}).to_parquet(tmp_path / "d2.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "d0.parquet"), dest, piles=2, seed=SEED)
    assert daskpile.append(dest, str(tmp_path / "d1.parquet")).rows == 4  # (no value: appended)
    said = r"(large_)?string instead of null \(the window's column 'coupon' is of type null: no row of its first data"
    with pytest.raises(ValueError, match=said + " held a value, so it can hold none; start a new window"):
        daskpile.append(dest, str(tmp_path / "d2.parquet"))
    # days of text: not "declare its type", which an append cannot
    (tmp_path / "d3.jsonl").write_text('{"id": 7, "coupon": "SAVE"}\n')
    (tmp_path / "d3.csv").write_text("id,coupon\n7,SAVE\n")
    for day, named in (("d3.jsonl", "'coupon' "), ("d3.csv", "")):  # (CSV's message names it before)
        with pytest.raises(ValueError, match=rf"\(the window's column {named}is of type null: no row of its first"):
            daskpile.append(dest, str(tmp_path / day))


def test_a_geoparquet_windows_files_say_the_extent_of_their_own_rows(sync_scheduler, tmp_path):
    """An appended day's files took the window's first data's GeoParquet bbox, and compaction's too: a reader
    skipping files by bbox (Sedona) would skip the day's rows (found beside a new user's trial of lakes)."""
    import struct

    def write(folder: Path, x0: int) -> str:
        folder.mkdir()
        column = {"encoding": "WKB", "geometry_types": ["Point"], "bbox": [x0, x0, x0 + 1, x0 + 1]}
        geo = {"version": "1.1.0", "primary_column": "geometry", "columns": {"geometry": column}}
        points = [struct.pack("<BIdd", 1, 1, x, x) for x in (x0, x0 + 1)]
        table = pa.table({"id": [x0, x0 + 1], "geometry": points}).replace_schema_metadata({"geo": json.dumps(geo)})
        pq.write_table(table, folder / "part.parquet")
        return str(folder)

    def boxes() -> dict[str, list]:
        found = {}
        for path in sorted((tmp_path / "window").rglob("*.parquet")):
            geo = json.loads(pq.read_schema(path).metadata[b"geo"])["columns"]["geometry"]
            xs = [struct.unpack("<BIdd", g)[2] for g in pq.read_table(path)["geometry"].to_pylist()]
            assert all(geo["bbox"][0] <= x <= geo["bbox"][2] for x in xs), path
            found[path.parent.name] = geo["bbox"]
        return found

    daskpile.shuffle_parquet(write(tmp_path / "d0", 0), str(tmp_path / "window"), piles=1, seed=0)
    daskpile.append(str(tmp_path / "window"), write(tmp_path / "d1", 100))
    assert boxes() == {"window": [0, 0, 1, 1], "gen-000001": [100, 100, 101, 101]}
    daskpile.compact(str(tmp_path / "window"))
    assert boxes()["gen-000002"] == [0, 0, 101, 101]


def test_an_append_of_no_row_is_warned_of(sync_scheduler, days, tmp_path):
    """A 0-byte day (a file cut short upstream) came in as an empty generation without a word, and counted
    toward expire --keep as a day: one real day fell out of the window early."""
    dest = str(tmp_path / "window")
    daskpile.shuffle_parquet(days[0], dest, piles=PILES, seed=SEED)
    empty = tmp_path / "day-9.jsonl"
    empty.write_bytes(b"")
    with pytest.warns(UserWarning, match=r"day-9.jsonl held no row: generation 1 is empty, and counts toward"):
        daskpile.append(dest, str(empty))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        daskpile.append(dest, days[1])
