"""Ctrl-C on the ``daskpile`` command, at every stage of a run: one line, and a run that resumes.

SIGINT goes to the command's whole process group, as a terminal sends it, so the workers of its
LocalCluster get it too.  Each test waits for a stage it can see from outside (a library mapped, a
process started, a line printed, a scratch file written), so none depends on timing.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pyarrow.parquet as pq
import pytest
from _util import DASKPILE, file_bytes, finished_partitions, run_in_fresh_process, uninterrupted_run

from daskpile.datasets import reference_table, write_reference_dataset
from daskpile.engine._lease import LEASE_FILE
from daskpile.engine._manifest import MANIFEST_NAME
from daskpile.engine._run import RUN_FILE

pytestmark = pytest.mark.slow

INTERRUPTED = "daskpile: interrupted"
RESUMABLE = "daskpile: interrupted; run the same command again to resume; its state is in "


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("interrupt") / "src"
    write_reference_dataset(path, rows=2_000_000, files=40)
    return str(path)


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    """The bytes of the uninterrupted run of ``shuffle_args``, made once for the tests that compare with it."""
    return uninterrupted_run(source, tmp_path_factory.mktemp("reference") / "out", 8, 3, blocksize=16 * 2**20)


def shuffle_args(source, tmp_path, *options):
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    # Small blocks: pass 1 is many tasks (about 80), so an interruption after the first few is well inside it
    return [
        DASKPILE, "shuffle", source, str(dest), "--piles", "8", "--seed", "3", "--scratch", str(scratch),
        "--blocksize", "16MiB", *options,
    ]  # fmt: skip


def interrupted_when(args, stage, timeout=120, sigterm=False, sigint=signal.SIG_DFL, sigterm_group=False):
    """Run ``args``, SIGINT its process group as soon as ``stage(process)`` holds; (status, stdout, stderr).
    With ``sigterm``, SIGTERM the command's process alone, as Kubernetes (tini, its PID 1) or ``kill`` do;
    with ``sigterm_group``, its whole process group, as ``timeout``, systemd and Slurm do.
    ``sigint``: SIGINT's disposition the command starts with (``SIG_IGN``: started in the background by a
    shell without job control)."""
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while not stage(process):
        assert process.poll() is None, f"the command ended before the stage: {process.communicate()}"
        assert time.monotonic() < deadline, "the stage never came"
        time.sleep(0.002)
    if sigterm:
        process.send_signal(signal.SIGTERM)
    elif sigterm_group:
        os.killpg(process.pid, signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


WAITED = "daskpile: interrupted: waiting up to "  # said once tasks still running take WAIT_SAID_AFTER


def the_one_line(stderr: str) -> str:
    # A loaded machine may add a worker's warning from before the interruption, and the wait for tasks still
    # running said (a full suite beside two other jobs on 2 cores), nothing else
    lines = [
        line
        for line in stderr.splitlines()
        if (" - distributed." not in line or "WARNING" not in line) and not line.startswith(WAITED)
    ]
    assert len(lines) == 1 and "Traceback" not in stderr and "Error" not in stderr, stderr
    return lines[0]


def command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile
        return ""


def descendants(process) -> list[psutil.Process]:
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_while_python_imports_the_command(source, tmp_path):
    def importing(process):  # pyarrow's library is mapped while daskpile.cli is still being imported
        try:
            with open(f"/proc/{process.pid}/maps") as maps:
                return "libarrow" in maps.read()
        except FileNotFoundError:
            return False

    status, _, stderr = interrupted_when(shuffle_args(source, tmp_path), importing)
    assert status == 130
    assert the_one_line(stderr).startswith(INTERRUPTED)


@pytest.mark.parametrize("sent", ["SIGINT", "SIGTERM", "SIGTERM-started-in-the-background"])
def test_while_the_local_cluster_starts_it_is_stopped_and_leaves_no_process(source, tmp_path, sent):
    """Sent to the whole process group, as a terminal sends Ctrl-C and ``timeout``, systemd and Slurm send
    SIGTERM.  SIGTERM killed the workers being started: the command said "daskpile: error: Nanny failed to start."
    after 57 lines of tracebacks and exited 1, which a Job's podFailurePolicy takes for a failure not to retry."""
    seen = []

    def cluster_starting(process):  # a worker is forked from the fork server (both run its command line)
        seen[:] = descendants(process)
        return sum("forkserver" in command_line(p) for p in seen) >= 2

    term = sent.startswith("SIGTERM")
    sigint = signal.SIG_IGN if sent.endswith("background") else signal.SIG_DFL  # (as a script's `daskpile ... &`)
    args = shuffle_args(source, tmp_path)
    status, stdout, stderr = interrupted_when(args, cluster_starting, sigterm_group=term, sigint=sigint)
    assert status == (143 if term else 130)
    assert the_one_line(stderr) == ("daskpile: terminated (SIGTERM)" if term else INTERRUPTED)
    assert "pass 1" not in stdout
    _, alive = psutil.wait_procs(seen, timeout=30)
    assert not alive


@pytest.mark.parametrize("scheduler", ["LocalCluster", "threads", "sync"])
def test_in_pass_1_on_every_scheduler_the_run_resumes(source, reference, tmp_path, scheduler):
    options = [] if scheduler == "LocalCluster" else ["--scheduler", scheduler]
    args = shuffle_args(source, tmp_path, *options)
    status, _, stderr = interrupted_when(args, lambda _: finished_partitions(tmp_path / "scratch") >= 2)
    assert status == 130
    line = the_one_line(stderr)
    assert line.startswith(RESUMABLE) and str(tmp_path / "scratch") in line
    # dest is named once pass 2 has begun there: before, it is not made yet (it named one that did not exist)
    assert str(tmp_path / "out") not in line and not (tmp_path / "out").exists()
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
    assert file_bytes(tmp_path / "out") == reference


def test_in_pass_2_the_run_resumes(source, tmp_path):
    # JSON lines out: pass 2 takes about 4 s here, against 0.4 s for Parquet, which a loaded machine once
    # finished before the SIGINT sent right after "pass 1:" landed
    args = shuffle_args(source, tmp_path, "--output-format", "jsonl")
    status, _, stderr = interrupted_when(args, lambda process: process.stdout.readline().startswith("pass 1:"))
    assert status == 130
    line = the_one_line(stderr)
    begun = (tmp_path / "out" / RUN_FILE).exists()  # (the SIGINT may land before pass 2 writes its run file)
    assert line.startswith(RESUMABLE) and line.endswith(f" and {tmp_path / 'out'}") == begun
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
    reference = uninterrupted_run(source, tmp_path / "reference", 8, 3, blocksize=16 * 2**20, output_format="jsonl")
    assert file_bytes(tmp_path / "out") == reference


def test_started_with_ctrl_c_ignored_a_run_on_a_local_cluster_ignores_it(source, tmp_path):
    """In a script's background (``daskpile ... &``) SIGINT is ignored from the start: the command ignored it on
    threads and stopped on a LocalCluster, whose handlers replaced the ignoring."""
    args = shuffle_args(source, tmp_path)
    ready = lambda _: finished_partitions(tmp_path / "scratch") >= 2  # noqa: E731
    status, stdout, stderr = interrupted_when(args, ready, sigint=signal.SIG_IGN)
    assert status == 0 and "verified" in stdout and INTERRUPTED not in stderr, stderr


def test_in_pass_2_of_many_piles_on_threads_the_tasks_stop_at_their_next_pile(tmp_path):
    """A task of pass 2 writes a share of the piles: of 300,000 piles of a few rows, minutes of them, which went
    on after Ctrl-C (its thread cannot be stopped), and the command ended only then."""
    write_reference_dataset(tmp_path / "src", rows=20_000, files=2)
    dest = tmp_path / "out"
    args = [DASKPILE, "shuffle", str(tmp_path / "src"), str(dest), "--piles", "5000", "--seed", "3",
            "--scheduler", "threads", "--scratch", str(tmp_path)]  # fmt: skip
    at_sigint = []

    def written(_) -> bool:
        with contextlib.suppress(FileNotFoundError):
            at_sigint[:] = [sum(1 for _ in os.scandir(dest))]
        return at_sigint and at_sigint[0] > 300

    status, _, stderr = interrupted_when(args, written)
    assert status == 130 and the_one_line(stderr).startswith(RESUMABLE)
    assert sum(1 for _ in os.scandir(dest)) < at_sigint[0] + 100  # (a pile or so a thread; it was thousands)
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr


@pytest.mark.parametrize(
    ("scheduler", "sigint"),
    [
        ("LocalCluster", signal.SIG_DFL),
        ("LocalCluster", signal.SIG_IGN),
        ("threads", signal.SIG_DFL),
        ("threads", signal.SIG_IGN),
    ],
    ids=["LocalCluster", "LocalCluster-started-in-the-background", "threads", "threads-started-in-the-background"],
)
def test_sigterm_in_pass_2_stops_as_ctrl_c_does_letting_go_of_the_lease(source, tmp_path, scheduler, sigint):
    """What Kubernetes sends a pod it deletes or drains: the command ended silently (exit 143, nothing in the
    job's log) and left the dest's lease, which refused a retry from another pod for two minutes.  Started by
    a script in the background (SIGINT ignored from the start), the threads scheduler's run went on to the
    end (a trial's Slurm job would have been killed at its grace's end)."""
    options = ["--output-format", "jsonl"] + ([] if scheduler == "LocalCluster" else ["--scheduler", scheduler])
    args = shuffle_args(source, tmp_path, *options)
    seen = []

    def in_pass_2(process):
        seen[:] = descendants(process)
        return process.stdout.readline().startswith("pass 1:")

    status, _, stderr = interrupted_when(args, in_pass_2, sigterm=True, sigint=sigint)
    assert status == 143
    assert the_one_line(stderr).startswith("daskpile: terminated (SIGTERM); run the same command again to resume; ")
    assert not (tmp_path / "out" / LEASE_FILE).exists()
    _, alive = psutil.wait_procs(seen, timeout=30)
    assert not alive
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr


def test_once_the_result_is_printed_the_command_ends_as_it_said(source, tmp_path):
    status, _, stderr = interrupted_when(
        shuffle_args(source, tmp_path), lambda process: process.stdout.readline().startswith("shuffled ")
    )
    assert (status, stderr) == (0, "")


def test_a_text_run_interrupted_in_pass_1_resumes_to_the_same_bytes(tmp_path):
    """A file of lines cut into byte ranges: the ranges a rerun finds done are not read again."""
    import dask

    import daskpile

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"".join(b"line %d of the corpus\n" % i for i in range(1_500_000)))
    args = [
        DASKPILE, "shuffle", str(corpus), str(tmp_path / "out"), "--piles", "8", "--seed", "3", "--output-format",
        "lines", "--blocksize", "16MiB", "--scratch", str(tmp_path / "scratch"), "--scheduler", "threads",
    ]  # fmt: skip
    (tmp_path / "scratch").mkdir()
    status, _, stderr = interrupted_when(args, lambda _: finished_partitions(tmp_path / "scratch") >= 2)
    assert status == 130 and the_one_line(stderr).startswith(RESUMABLE)
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(
            str(corpus), str(tmp_path / "reference"), 8, seed=3, output_format="lines", blocksize=16 * 2**20
        )
    assert file_bytes(tmp_path / "out") == file_bytes(tmp_path / "reference")


def test_a_ctrl_c_the_instant_the_manifest_is_written_says_the_result_complete(source, tmp_path, monkeypatch):
    """CI saw "daskpile: interrupted" alone: the Ctrl-C landed between the manifest's rename and the flag that
    says the result is complete.  Here it lands there every time."""
    import dask

    import daskpile
    from daskpile.engine import _manifest

    written = _manifest.write

    def write_then_ctrl_c(*args):
        path = written(*args)
        os.kill(os.getpid(), signal.SIGINT)  # (Python raises it at its next instruction, in this frame)
        return path

    monkeypatch.setattr(_manifest, "write", write_then_ctrl_c)
    with dask.config.set(scheduler="sync"), pytest.raises(KeyboardInterrupt) as raised:
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=1, scratch=str(tmp_path / "s"))
    assert raised.value.daskpile_complete == str(tmp_path / "out")


@pytest.mark.parametrize("options", [[], ["--overwrite"]])
def test_once_the_manifest_is_written_the_result_is_said_complete(source, tmp_path, options):
    # The manifest comes before the scratch is removed, the lease let go and the result printed: a Ctrl-C
    # landing there must not call the run unfinished.  It may also land after the printing (0, nothing said).
    # With --overwrite, the same command again would replace the result: it is not said to report it.
    for attempt in range(3):
        work = tmp_path / str(attempt)
        work.mkdir()
        args = shuffle_args(source, work, *options)
        manifest = work / "out" / MANIFEST_NAME
        status, _, stderr = interrupted_when(args, lambda _, manifest=manifest: manifest.exists())
        if status == 0:
            assert stderr == ""
            continue
        assert status == 130, stderr
        again_said = "" if options else ": the same command again reports it"
        said = f"daskpile: interrupted once the result at {work / 'out'} was complete{again_said}"
        assert the_one_line(stderr) == said
        if options:
            return
        again = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and "already" in again.stdout, again
        assert not any((work / "scratch").iterdir())
        return
    pytest.fail("no Ctrl-C landed between the manifest and the printed result")


def test_a_window_command_says_what_its_interruption_left(tmp_path):
    """Ctrl-C of compact (or of an append before its shuffle) said only "daskpile: interrupted": it now says
    that the change is under way and the same command finishes it, or that it was committed (the window at
    its new version), or that nothing was changed.  The same command then finishes it."""
    import daskpile

    write_reference_dataset(tmp_path / "day-0", rows=300_000, files=4)
    (tmp_path / "day-1").mkdir()
    pq.write_table(reference_table(300_000, 600_000, 600_000), tmp_path / "day-1" / "in.parquet")
    window = tmp_path / "window"
    daskpile.shuffle_parquet(str(tmp_path / "day-0"), str(window), piles=8, seed=3)
    daskpile.append(str(window), str(tmp_path / "day-1"))
    compact = [DASKPILE, "compact", str(window), "--scheduler", "threads"]  # (no cluster to start: quicker)
    status, _, stderr = interrupted_when(compact, lambda _: (window / "_daskpile.pending.json").exists())
    said = {
        f"{INTERRUPTED}; the change to the window at {window} is under way: run the same command again to finish "
        f"it (or daskpile discard {window} to drop it)",
        f"{INTERRUPTED} once the window at {window} was at its new version: the same command again reports it",
    }
    assert status == 0 or (status == 130 and the_one_line(stderr) in said), stderr
    again = subprocess.run(compact, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again
    assert daskpile.read_manifest(str(window))["window"]["generations"][0]["number"] == 2
    assert daskpile.verify(str(window)).ok
    # as soon as the append holds the window's lease: before its change is begun, most often
    (tmp_path / "day-2").mkdir()
    pq.write_table(reference_table(600_000, 900_000, 900_000), tmp_path / "day-2" / "in.parquet")
    append = [DASKPILE, "append", str(tmp_path / "day-2"), str(window), "--scheduler", "threads"]
    status, _, stderr = interrupted_when(append, lambda _: (window / LEASE_FILE).exists())
    said = {f"{INTERRUPTED}; the window at {window} was not changed", *said}

    def resumable(line: str) -> bool:  # its shuffle begun: where the shuffle's state is, and that discard drops it
        return line.startswith(f"{INTERRUPTED}; run the same command again to resume; its state is in ") and (
            line.endswith(f" (or daskpile discard {window} to drop the change to the window)")
        )

    # On a loaded machine the signal may come once the shuffle has begun, or once the append has said it is done
    # (Ctrl-C is then ignored: status 0, nothing said)
    line = the_one_line(stderr) if status else None
    assert (status == 130 and (line in said or resumable(line))) or (status == 0 and stderr == ""), stderr
    if status == 0:  # (done: day-2 is a generation of the window)
        generations = daskpile.read_manifest(str(window))["window"]["generations"]
        assert any(source.endswith("day-2/in.parquet") for g in generations for source in g["source_files"])
    if line and resumable(line):  # dropped: the next append's shuffle begins anew (its parts not there at once)
        subprocess.run([DASKPILE, "discard", str(window)], capture_output=True, text=True, timeout=120, check=True)
    # in its shuffle's pass 2, of a day not appended yet whatever happened above
    (tmp_path / "day-3").mkdir()
    pq.write_table(reference_table(900_000, 1_200_000, 1_200_000), tmp_path / "day-3" / "in.parquet")
    append = [DASKPILE, "append", str(tmp_path / "day-3"), str(window), "--scheduler", "threads"]
    generation = 1 + max(g["number"] for g in daskpile.read_manifest(str(window))["window"]["generations"])
    status, _, stderr = interrupted_when(append, lambda _: any((window / f"gen-{generation:06d}").glob("part-*")))
    line = the_one_line(stderr)
    assert status == 130 and (resumable(line) or line in said), line


CLOSING_TERMINATED = """
import os, signal, sys, time
import distributed
close = distributed.LocalCluster.close
def close_terminated(self, *args, **kwargs):  # SIGTERM as the command's cluster closes, the result complete
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
    return close(self, *args, **kwargs)
distributed.LocalCluster.close = close_terminated
from daskpile.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["foreground", "started-in-the-background"])
def test_sigterm_while_the_cluster_closes_after_the_result_is_ignored(tmp_path, sigint):
    """The run is complete: its report is said and the status is 0, as for Ctrl-C then (the review found the
    change for a command started with SIGINT ignored stopped it as terminated, its report unsaid)."""
    from daskpile.datasets import write_reference_dataset

    write_reference_dataset(tmp_path / "src", rows=3_000, files=3)
    done = subprocess.run(
        [sys.executable, "-c", CLOSING_TERMINATED, "shuffle", str(tmp_path / "src"), str(tmp_path / "out"), "-q"],
        capture_output=True, text=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("shuffled 3,000 rows"), done.stderr


def test_a_worker_start_failed_by_the_fork_server_gone_is_not_logged_beside_the_commands_line():
    # SIGTERM to the process group kills the fork server as workers start; the nanny logged each failed start,
    # with its traceback, before the command's handler of the same signal had quieted the logs (a loaded CI run)
    said = run_in_fresh_process("""
        import json, logging
        from daskpile._interrupt import workers_ignoring_ctrl_c
        nanny, kept = logging.getLogger("distributed.nanny"), []
        handler = logging.Handler()
        handler.emit = lambda record: kept.append(record.getMessage())
        nanny.addHandler(handler)
        gone = (EOFError, EOFError("unexpected EOF"), None)
        with workers_ignoring_ctrl_c():
            nanny.error("Failed to start process", exc_info=gone)
            nanny.error("Failed to start process", exc_info=(OSError, OSError("no room"), None))
            nanny.error("Worker process died unexpectedly")
        nanny.error("Failed to start process", exc_info=gone)  # (outside the command's cluster: as distributed says)
        print(json.dumps(kept))
    """)
    assert said == ["Failed to start process", "Worker process died unexpectedly", "Failed to start process"]
