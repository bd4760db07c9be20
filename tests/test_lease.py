"""One run at a time in a dest: a live run's lease refuses a second run, a dead run's is taken over."""

import json
import os
import socket
import subprocess
import time

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from _util import DASKPILE, daskpile_command, eventually, sorted_source, start_lease_holder

import daskpile
from daskpile import _storage
from daskpile.engine import _lease


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return sorted_source(tmp_path_factory.mktemp("lease-src"), rows=30_000, files=3)


@pytest.mark.slow
def test_a_live_run_holding_dest_refuses_another_which_writes_nothing(source, tmp_path):
    dest = tmp_path / "out"
    holder = start_lease_holder(dest)
    try:
        done = daskpile_command("shuffle", source, str(dest), "--piles", "4", "--seed", "1", "--scheduler", "sync")
        assert done.returncode == 75, done.stderr  # EX_TEMPFAIL: the same command succeeds once that run ends
        line = done.stderr.strip()
        assert "\n" not in line and "is being written by another daskpile run" in line and f"pid {holder.pid}" in line
        assert os.listdir(dest) == [_lease.LEASE_FILE]  # nothing of the refused run
        with pytest.raises(daskpile.DestBusyError, match="another daskpile run"):
            daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not dest.exists()  # the holder wrote nothing but its lease, and took both away
    report = daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)  # once it ended, the call runs
    assert report.rows == 30_000 and _lease.LEASE_FILE not in os.listdir(dest)


def test_a_killed_runs_lease_is_taken_over_once_it_is_old(source, tmp_path):
    dest = tmp_path / "out"
    holder = start_lease_holder(dest)
    holder.kill()  # as a pod lost with its node: its lease stays, no longer renewed
    holder.wait(timeout=30)
    path = dest / _lease.LEASE_FILE
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "host": "another-machine"}))  # its process cannot be asked there
    with pytest.raises(daskpile.DestBusyError):  # renewed just now: it may be alive
        daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    old = record["renewed"] - _lease.LEASE_SECONDS - 1
    path.write_text(json.dumps({**record, "host": "another-machine", "renewed": old}))
    report = daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    written = sorted([*(os.path.basename(f) for f in report.files), "_daskpile.json"])
    assert report.rows == 30_000 and sorted(os.listdir(dest)) == written  # the dead run's lease is gone
    # one dated a day ahead (a machine whose clock ran fast) is as dead: it blocked the dest for that day
    path.write_text(json.dumps({**record, "host": "another-machine", "renewed": time.time() + 86_400}))
    assert daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1, overwrite=True).rows == 30_000


def test_a_killed_runs_lease_on_this_machine_is_taken_over_at_once(source, tmp_path):
    """Run again right after a kill -9 (or an out-of-memory kill), the same call resumes without waiting."""
    dest = tmp_path / "out"
    holder = start_lease_holder(dest)
    holder.kill()
    holder.wait(timeout=30)
    assert daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1).rows == 30_000
    assert _lease.LEASE_FILE not in os.listdir(dest)


def test_a_lease_of_a_dead_run_whose_pid_is_now_another_process_is_taken_over_at_once(source, tmp_path):
    """A container restarted in its pod keeps the hostname and numbers its processes afresh: the killed run's
    pid was often the new run's own, and the new run was refused for 120 s as "pid N" (itself)."""
    dest = tmp_path / "out"
    dest.mkdir()
    record = {"owner": "killed", "host": socket.gethostname(), "pid": os.getpid(), "started": "earlier",
              "renewed": time.time()}  # fmt: skip
    (dest / _lease.LEASE_FILE).write_text(json.dumps({**record, "pid_started": _lease._process_started(os.getpid())}))
    with pytest.raises(daskpile.DestBusyError):  # the same pid, started when it did: the holder itself lives
        daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    (dest / _lease.LEASE_FILE).write_text(json.dumps({**record, "pid_started": 1}))  # another process's start
    assert daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1).rows == 30_000


def test_a_lease_being_written_counts_as_alive_and_a_half_written_old_one_as_dead(source, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / _lease.LEASE_FILE).write_bytes(b'{"owner": "ab')  # a writer stopped mid-write
    with pytest.raises(daskpile.DestBusyError, match="whose lease is being written"):
        daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    old = time.time() - _lease.LEASE_SECONDS - 1
    os.utime(dest / _lease.LEASE_FILE, (old, old))
    assert daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1).rows == 30_000


def test_a_run_interrupted_as_its_lease_appears_leaves_none_and_the_same_call_runs_at_once(
    source, tmp_path, monkeypatch
):
    """The lease was created empty, then written: a Ctrl-C in between (as it appears, which is when a test sending
    SIGINT once the lease exists sends it) left one "being written", alive for two minutes to the same command
    run again.  Now it is removed.  A renewal's temporary a kill -9 leaves is daskpile's, not a foreign file."""
    dest = tmp_path / "out"
    real_fdopen = os.fdopen

    class InterruptedWrite:
        def __init__(self, fd, mode):
            self.file = real_fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            raise KeyboardInterrupt  # Ctrl-C once the lease exists, before its record is in it

    monkeypatch.setattr(os, "fdopen", InterruptedWrite)
    with pytest.raises(KeyboardInterrupt):
        daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    monkeypatch.undo()
    assert not dest.exists()  # nothing left: no lease, no dest the run made
    dest.mkdir()
    (dest / f".{_lease.LEASE_FILE}.5f0c.tmp").write_bytes(b'{"owner": "ab')  # a renewal killed before its rename
    assert daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1).rows == 30_000


def test_a_ctrl_c_the_moment_the_lease_file_is_created_leaves_none(source, tmp_path, monkeypatch):
    """A SIGINT handled between the lease file's creation and the write of its record left it empty: "a run
    whose lease is being written", which refused the same command again for two minutes (a window test under
    load).  It is handled once the record is in, and the lease is let go."""
    import signal

    dest = tmp_path / "out"
    real_open = os.open

    def creating(path, flags, *args):
        fd = real_open(path, flags, *args)
        if str(path).endswith(_lease.LEASE_FILE):
            signal.raise_signal(signal.SIGINT)  # (its handler runs at the next bytecode: here, in the old code)
        return fd

    monkeypatch.setattr(os, "open", creating)
    with pytest.raises(KeyboardInterrupt):
        daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1)
    monkeypatch.undo()
    assert not dest.exists()  # no lease, no dest the run made
    assert daskpile.shuffle_parquet(source, str(dest), piles=4, seed=1).rows == 30_000


def test_the_lease_is_renewed_while_the_run_lives_and_a_run_that_lost_it_does_not_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(_lease, "RENEW_SECONDS", 0.05)
    fs, dest = fsspec.filesystem("file"), str(tmp_path / "out")
    path = os.path.join(dest, _lease.LEASE_FILE)

    def lease_file() -> dict:
        with open(path) as f:
            return json.load(f)

    with _lease.held(fs, dest) as lease:
        first = lease_file()["renewed"]
        eventually(lambda: lease_file()["renewed"] > first, what="the lease renewed")
        lease.check()
        other = {**lease_file(), "owner": "another", "pid": 1}  # a run that took it over, thinking us dead

        def taken_over() -> bool:
            # Written as a run writes it, whole at once (a file read half-written is another writer's too).  A
            # renewal that read the lease as ours just before may still write over it once (a read, then a
            # write: no store offers more); the next one sees ours again, so the other run writes again
            _storage.write_bytes(fs, path, json.dumps(other).encode())
            time.sleep(0.2)
            return lease.lost is not None

        eventually(taken_over, what="the renewal thread saw the lease taken over")
        _storage.write_bytes(fs, path, json.dumps(other).encode())
        time.sleep(0.3)
        assert lease_file()["owner"] == "another"  # once seen taken over, never written over by our renewals
        with pytest.raises(daskpile.DestBusyError, match="lease went to the run of pid 1"):
            lease.check()
    assert lease_file()["owner"] == "another"  # not ours to remove


@pytest.mark.slow
def test_the_same_command_twice_at_once_one_runs_the_other_is_told_to_wait(tmp_path):
    source = sorted_source(tmp_path / "src", rows=1_000_000, files=8)
    dest = tmp_path / "out"
    command = [DASKPILE, "shuffle", source, str(dest), "--piles", "8", "--seed", "2", "--scheduler", "threads", "-q"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outcomes = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    assert 0 in [code for code, _ in outcomes], outcomes
    for code, stderr in outcomes:  # the other finished too (found the result) or was told to wait, never crashed
        assert code == 0 or (code == 75 and "is being written by another daskpile run" in stderr), outcomes
    assert daskpile.verify(str(dest)).ok
    ids = np.sort(pq.read_table(str(dest), columns=["id"]).column("id").to_numpy())
    assert np.array_equal(ids, np.arange(1_000_000))


@pytest.mark.slow
def test_retry_for_runs_again_once_the_dest_is_free_and_gives_up_on_what_no_retry_mends(source, tmp_path):
    """--retry-for: a scheduled job's run that meets another's lease (exit 75) tries again, and succeeds once that
    run has ended; a run that cannot succeed (exit 2) or whose next pause would outlast --retry-for stops at once."""
    dest = tmp_path / "out"
    holder = start_lease_holder(dest)
    command = [DASKPILE, "shuffle", source, str(dest), "--piles", "4", "--seed", "1", "--scheduler", "sync", "-q"]
    try:
        started = time.monotonic()
        done = daskpile_command(*command[1:], "--retry-for", "3s")  # the first pause, 5 s, would outlast it
        assert done.returncode == 75 and time.monotonic() - started < 30, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "is being written by another daskpile run" in done.stderr
        waiting = subprocess.Popen([*command, "--retry-for", "10m"], stderr=subprocess.PIPE, text=True)
        said = waiting.stderr.readline()
        assert said.startswith(f"daskpile: dest {str(dest)!r} is being written by another daskpile run"), said
        assert said.rstrip().endswith(": trying again in 5 s (try 2)"), said
    finally:
        holder.stdin.close()  # that run ends, and lets its lease go
        holder.wait(timeout=60)
    assert waiting.wait(timeout=120) == 0, waiting.stderr.read()
    assert daskpile.verify(str(dest)).ok
    missing = daskpile_command("shuffle", str(tmp_path / "missing"), str(tmp_path / "o"), "--retry-for", "10m")
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1, missing.stderr
