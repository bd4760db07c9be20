"""The ``daskpile`` command: the installed console script end to end on a
LocalCluster, and its exit statuses and error lines in-process."""

import functools
import gzip
import json
import os
import pty
import re
import subprocess
import sys
import warnings

import dask
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _util import DASKPILE, file_bytes, huge_pages_testable
from botocore.exceptions import EndpointConnectionError, NoCredentialsError, ReadTimeoutError
from click.testing import CliRunner
from distributed.comm.core import CommClosedError

import daskpile
from daskpile._storage import StoreUnreachable
from daskpile.cli import SchedulerUnreachable, _error_line, _exit_status, cli
from daskpile.datasets import write_reference_dataset
from daskpile.window.snapshot import WindowChangedError


@pytest.fixture(scope="module")
def sorted_source(tmp_path_factory):
    source = tmp_path_factory.mktemp("cli") / "sorted"
    write_reference_dataset(source, rows=30_000, files=3)
    return str(source)


def run(*args, check_status=None, env=None):
    done = subprocess.run([DASKPILE, *args], capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env})  # fmt: skip
    if check_status is not None:
        assert done.returncode == check_status, (done.stdout, done.stderr)
    return done


def run_in_a_terminal(*args) -> str:
    """Run the command with its stdout on a pseudo-terminal, as in an interactive shell."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen([DASKPILE, *args], stdout=secondary, stderr=subprocess.PIPE, text=True)
    os.close(secondary)
    output = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(primary)
    assert process.wait(timeout=300) == 0, (output, process.stderr.read())
    return output.decode()


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_version():
    assert run("--version", check_status=0).stdout.strip() == f"daskpile, version {daskpile.__version__}"


def as_the_command_then(then: str, environ: dict[str, str | None]) -> str:
    """The stdout of a fresh process that runs the command's entry point (``daskpile --version``), then ``then``,
    with ``environ``'s variables exported (None: not exported)."""
    script = (
        "import os, sys\n"
        "sys.argv = ['daskpile', '--version']\n"
        "import daskpile.__main__\n"
        "try:\n    daskpile.__main__.main()\nexcept SystemExit:\n    pass\n" + then
    )
    env = {k: v for k, v in os.environ.items() if k not in environ}
    env.update({k: v for k, v in environ.items() if v is not None})
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("exported", [None, "4"])
def test_the_command_runs_numpy_with_one_blas_thread_unless_told_otherwise(exported):
    # daskpile does no linear algebra: OpenBLAS's threads, one a core, only spun beside the command's own
    then = "import numpy\nprint(os.environ['OPENBLAS_NUM_THREADS'])"
    stdout = as_the_command_then(then, {"OPENBLAS_NUM_THREADS": exported})
    assert stdout.split()[-1] == (exported or "1")


@pytest.mark.skipif(bool(huge_pages_testable()), reason=str(huge_pages_testable()))
@pytest.mark.parametrize("exported", [None, "1"])
def test_the_command_runs_arrow_without_transparent_huge_pages_unless_told_otherwise(exported):
    # mimalloc turns THP off for its whole process (prctl) as pyarrow loads, if MIMALLOC_ALLOW_THP is 0 by then
    then = (
        "import pyarrow\n"
        "assert pyarrow.default_memory_pool().backend_name == 'mimalloc'\n"
        "pyarrow.allocate_buffer(1 << 20)\n"
        "print([line for line in open('/proc/self/status') if line.startswith('THP_enabled')])"
    )
    stdout = as_the_command_then(then, {"MIMALLOC_ALLOW_THP": exported, "ARROW_DEFAULT_MEMORY_POOL": None})
    assert stdout.splitlines()[-1] == f"['THP_enabled:\\t{exported or 0}\\n']"


@pytest.mark.slow
def test_shuffle_verify_quality_on_a_local_cluster(sorted_source, tmp_path, sync_scheduler):
    dest = str(tmp_path / "out")
    output = run_in_a_terminal("shuffle", sorted_source, dest, "--piles", "6", "--seed", "4", "--workers", "2")
    assert "LocalCluster: 2 workers, dashboard http" in output
    assert output.count("100% Completed") == 2  # distributed's progress bar, once per pass
    assert "pass 1: 30,000 rows read from 3 files" in output
    assert "pass 2: 30,000 rows written to 6 files" in output
    assert "shuffled 30,000 rows from 3 files into 6 piles (seed 4)" in output
    # the same bytes as the Python API with the same seed
    daskpile.shuffle_parquet(sorted_source, str(tmp_path / "api"), piles=6, seed=4)
    assert file_bytes(dest) == file_bytes(tmp_path / "api")

    assert "match" in run("verify", sorted_source, dest, "--scheduler", "sync", check_status=0).stdout
    plot = str(tmp_path / "q.png")
    done = run(
        "quality", dest, "--order-column", "id", "--label-column", "label", "--plot", plot, "--scheduler", "sync"
    )
    assert done.returncode == 0 and "consistent with a uniform shuffle" in done.stdout and os.path.exists(plot)
    done = run("quality", sorted_source, "--order-column", "id", "--scheduler", "sync", check_status=1)
    assert "NOT uniformly shuffled" in done.stdout


def test_quiet_auto_piles_and_json(sorted_source, tmp_path):
    dest = str(tmp_path / "out")
    result = invoke(
        "shuffle", sorted_source, dest, "--scheduler", "threads", "--memory-per-pile", "200KiB", "-q", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)  # nothing but the JSON report: no bars, no summary lines
    plan = report["pile_plan"]
    assert plan["piles"] == report["piles"] > 4 and plan["memory_per_pile"] == 200 * 1024 and plan["rows"] == 30_000
    assert daskpile.read_manifest(dest)["pile_plan"] == plan
    assert daskpile.verify(sorted_source, dest).ok


def test_in_a_log_progress_is_one_line_per_pass(sorted_source, tmp_path):
    result = invoke("shuffle", sorted_source, str(tmp_path / "out"), "--piles", "3", "--scheduler", "sync")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("pass")] == ["pass 1", "pass 2"]
    assert "Completed" not in result.output  # no bars redrawn into a batch job's log


@pytest.mark.slow
def test_bars_without_a_cluster_in_a_terminal(sorted_source, tmp_path):
    output = run_in_a_terminal("shuffle", sorted_source, str(tmp_path / "out"), "--piles=3", "--scheduler=threads")
    assert output.count("100% Completed") == 2  # dask.diagnostics.ProgressBar, once per pass


def test_the_api_is_quiet_unless_asked(sorted_source, tmp_path, sync_scheduler, capsys):
    daskpile.shuffle_parquet(sorted_source, str(tmp_path / "quiet"), piles=2, seed=1)
    daskpile.verify(sorted_source, str(tmp_path / "quiet"))
    assert capsys.readouterr().out == ""
    daskpile.shuffle_parquet(sorted_source, str(tmp_path / "loud"), piles=2, seed=1, progress=True)
    assert "pass 2: 30,000 rows written to 2 files" in capsys.readouterr().out


def test_piles_of_a_few_rows_each_are_said_before_the_run(tmp_path, sync_scheduler, monkeypatch):
    """A new user's --piles 200000 on a file of 200,000 lines ran 5 minutes to 162,000 files of a line each,
    without a word: many piles of a few rows each are said, at the caller's line (here with fewer piles)."""
    from daskpile.engine import _pipeline

    monkeypatch.setattr(_pipeline, "MANY_PILES", 50)
    pq.write_table(pa.table({"x": list(range(1_000))}), tmp_path / "k.parquet")
    with pytest.warns(
        UserWarning, match=r"^60 piles of about 17 rows: as many files of a few rows each; did you mean fewer\?"
    ) as w:
        daskpile.shuffle_parquet(str(tmp_path / "k.parquet"), str(tmp_path / "out"), piles=60, seed=1)
    assert [warning.filename for warning in w] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (piles of 100 rows or more: nothing said)
        daskpile.shuffle_parquet(str(tmp_path / "k.parquet"), str(tmp_path / "o2"), piles=10, seed=1)
        daskpile.shuffle_parquet(str(tmp_path / "k.parquet"), str(tmp_path / "o3"), piles=40, seed=1)  # (< 50)


@pytest.mark.parametrize("name, output_format, said", [
    ("corpus.jsonl", "jsonl", True), ("corpus.ndjson.gz", "jsonl", True), ("corpus.jsonl", "lines", False),
    ("corpus.txt", "jsonl", False),
])  # fmt: skip
def test_json_lines_read_as_lines_and_written_as_json_lines_are_said_to_become_strings(
    tmp_path, name, output_format, said
):
    source = tmp_path / name
    text = b"".join(b'{"a": %d}\n' % i for i in range(20))
    source.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    dest = tmp_path / "out"
    done = run("shuffle", str(source), str(dest), "--format", "lines", "--output-format", output_format, "--piles", "2",
               "--seed", "1", "--scheduler", "sync", check_status=0)  # fmt: skip
    note = (
        "format='lines' (--format lines) reads each line as one string, which output_format='jsonl' writes as "
        '{"line": "..."}: each JSON line becomes a string in an object; output_format=\'lines\' (--output-format '
        "lines) keeps the lines as they are"
    )
    assert (f"note: {note}" in done.stdout) == said
    written = b"".join(f.read_bytes() for f in sorted(dest.glob("part-*")))
    if output_format == "jsonl":  # (what the note says, as written)
        assert sorted(json.loads(line)["line"] for line in written.splitlines()) == sorted(
            line.decode() for line in text.splitlines()
        )


def test_json_lines_read_as_lines_and_written_as_json_lines_are_a_warning_of_the_api(tmp_path, sync_scheduler):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_bytes(b'{"a": 1}\n{"a": 2}\n')
    (tmp_path / "src" / "b.txt").write_bytes(b"x\ny\n")
    with pytest.warns(UserWarning, match=r"each JSON line becomes a string in an object") as warned:
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=2, seed=1, format="lines",
                                 output_format="jsonl")  # fmt: skip
    assert [w.filename for w in warned] == [__file__]  # (the line that called)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plain text files: nothing to say
        daskpile.shuffle_parquet(str(tmp_path / "src" / "b.txt"), str(tmp_path / "out2"), piles=2, seed=1,
                                 format="lines", output_format="jsonl")  # fmt: skip


def test_the_pass_2_line_counts_the_empty_files_of_more_piles_than_rows(tmp_path, sync_scheduler, capsys):
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "ten.parquet")
    daskpile.shuffle_parquet(str(tmp_path / "ten.parquet"), str(tmp_path / "out"), piles=40, seed=1, progress=True)
    empty = sum(not pq.read_metadata(f).num_rows for f in (tmp_path / "out").glob("part-*.parquet"))
    assert empty >= 30
    said = rf"pass 2: 10 rows written to 40 files \(\d+ KiB\), {empty} of them empty"  # (it said 0 MiB)
    out = capsys.readouterr().out
    assert re.search(said, out)
    # and said before: 1,000,000 piles for 120,916 rows began 879,084 empty files without a word
    assert "note: 40 piles for about 10 rows: about 30 or more of their files will be empty\n" in out
    with pytest.warns(
        UserWarning, match="^40 piles for about 10 rows: about 30 or more of their files will be empty$"
    ) as warned:
        daskpile.shuffle_parquet(str(tmp_path / "ten.parquet"), str(tmp_path / "out2"), piles=40, seed=1)
    assert [w.filename for w in warned] == [__file__]  # (the line that called, not one of daskpile's)
    daskpile.shuffle_parquet(str(tmp_path / "ten.parquet"), str(tmp_path / "one"), piles=1, seed=1, progress=True)
    assert "empty" not in capsys.readouterr().out


def test_the_passes_lines_say_the_report_s_seconds(tmp_path, sync_scheduler, capsys):
    """The pass-1 line said 19.2 s where the report of the same run said 18.4."""
    write_reference_dataset(tmp_path / "src", rows=20_000, files=4)
    report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=4, seed=1, progress=True)
    lines = capsys.readouterr().out.splitlines()
    said = {line.split(":")[0]: line.rsplit(", ", 1)[1] for line in lines if line.startswith("pass ")}
    assert said == {"pass 1": f"{report.seconds_scatter:.1f} s", "pass 2": f"{report.seconds_gather:.1f} s"}


def test_more_piles_than_the_machine_holds_the_counts_of_are_refused(tmp_path, sync_scheduler, monkeypatch):
    """100,000,000 piles over 13 pass-1 tasks took 22 GB (their per-pile counts) before a row was written."""
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=64 * 2**30))
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "ten.parquet")
    with pytest.raises(ValueError, match=r"^4,000,000,000 piles would take 178\.8 GiB of pile counts to sum pass 1"):
        daskpile.shuffle_parquet(str(tmp_path / "ten.parquet"), str(tmp_path / "out"), piles=4 * 10**9, seed=1)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"piles must be at most 4,294,967,296 \(a pile's number is 32 bits\)"):
        daskpile.shuffle_parquet(str(tmp_path / "ten.parquet"), str(tmp_path / "out"), piles=2**33, seed=1)


@pytest.mark.slow
def test_pass_1_s_pile_counts_are_summed_on_the_workers_not_held_a_task_at_a_time(tmp_path, monkeypatch):
    """Each pass-1 task counts its rows, bytes and largest row for every pile (24 bytes a pile), and the
    command held every task's: piles of 32 MiB over 1 TiB of files of 16 MiB, 32,768 piles over 65,536 tasks,
    would have been 48 GiB.  They are summed 16 tasks' at a time on the workers: here 40 tasks and as many
    piles as 17 results' counts fit, where 40 results' did not, and the sums are the piles' rows."""
    import psutil

    from daskpile.engine import _passes

    (tmp_path / "src").mkdir()
    for k in range(40):  # 40 pass-1 tasks at this blocksize
        pq.write_table(pa.table({"x": range(k * 5_000, (k + 1) * 5_000)}), tmp_path / "src" / f"{k:02d}.parquet")
    piles = 50
    fits = (_passes.SUM_FAN_IN + 1) * piles * _passes.PILE_COUNT_BYTES / psutil.virtual_memory().total
    monkeypatch.setattr(_passes, "PILE_COUNTS_FRACTION", fits)  # 17 results' counts of 50 piles, not 40
    shuffle = functools.partial(daskpile.shuffle_parquet, str(tmp_path / "src"), seed=1, blocksize=2**14)
    with dask.config.set(scheduler="threads", num_workers=2):
        report = shuffle(str(tmp_path / "out"), piles=piles)
        assert report.rows == 200_000 and len(report.files) == piles
        manifest = json.loads((tmp_path / "out" / "_daskpile.json").read_text())
        written = [pq.read_metadata(tmp_path / "out" / name).num_rows for name in manifest["files"]]
        assert manifest["rows_per_pile"] == written and sum(written) == 200_000
        with pytest.raises(ValueError, match=r"^51 piles would take .* \(16 tasks' at a time\).* at most 50 piles"):
            shuffle(str(tmp_path / "more"), piles=piles + 1)
    assert not (tmp_path / "more").exists()


def test_usage_errors_exit_2(sorted_source, tmp_path):
    dest = str(tmp_path / "out")
    for args in [
        ("shuffle", sorted_source, dest, "--piles", "many"),
        ("shuffle", sorted_source, dest, "--piles", "0"),
        ("shuffle", sorted_source),
        ("shuffle", sorted_source, dest, "--storage-option", "anon"),
        ("shuffle", sorted_source, dest, "--memory-per-pile", "lots"),
        ("shuffle", sorted_source, dest, "--blocksize", "1"),  # ran for minutes: a task a byte of text
        ("quality", dest),
        ("frobnicate",),
    ]:
        result = CliRunner().invoke(cli, list(args))
        assert result.exit_code == 2, (args, result.output)
    assert not os.path.exists(dest)
    # (the S3 trial's) keyword arguments given as a string failed in s3fs, exit 1: "'str' object has no attribute
    # 'copy'"
    for typed in ["client_kwargs=endpoint_url=http://127.0.0.1:5555", "config_kwargs={bad"]:
        refused = CliRunner().invoke(cli, ["shuffle", sorted_source, dest, "--storage-option", typed])
        assert refused.exit_code == 2 and "kwargs is keyword arguments: give each as --storage-option" in refused.output
    for command in (["shuffle", sorted_source, dest], ["append", sorted_source, dest]):
        refused = CliRunner().invoke(cli, [*command, "--blocksize", "8KiB"])
        assert (
            refused.exit_code == 2 and "'8KiB' is under 16KiB: text is read in ranges of a sixteenth" in refused.output
        )
    assert not os.path.exists(dest)


@pytest.mark.slow
def test_bad_requests_are_one_line_on_stderr_and_exit_2(sorted_source, tmp_path):
    missing = str(tmp_path / "missing")
    done = run("shuffle", missing, str(tmp_path / "out"), "--scheduler", "sync", check_status=2)
    assert done.stderr.strip().splitlines() == [f"daskpile: error: source {missing!r} does not exist"]
    assert not os.path.exists(tmp_path / "out")
    done = run("shuffle", missing, str(tmp_path / "out"), "--scheduler", "sync", "--debug", check_status=2)
    assert "Traceback (most recent call last)" in done.stderr

    dest = str(tmp_path / "taken")
    os.makedirs(dest)
    open(os.path.join(dest, "notes.txt"), "w").close()
    result = CliRunner().invoke(cli, ["shuffle", sorted_source, dest, "--piles", "2", "--scheduler", "sync"])
    assert result.exit_code == 2 and "holds files daskpile did not write (notes.txt)" in result.output
    result = CliRunner().invoke(
        cli, ["shuffle", sorted_source, dest, "--piles", "2", "--scheduler", "sync", "--overwrite"]
    )
    assert result.exit_code == 2 and os.listdir(dest) == ["notes.txt"]


def test_verification_failure_exits_1(sorted_source, tmp_path):
    dest = str(tmp_path / "out")
    assert invoke("shuffle", sorted_source, dest, "--piles", "2", "--scheduler", "sync", "-q").exit_code == 0
    other = str(tmp_path / "other")
    write_reference_dataset(other, rows=30_001, files=3)
    result = CliRunner().invoke(cli, ["verify", other, dest, "--scheduler", "sync", "-q"])
    assert result.exit_code == 1 and "MISMATCH" in result.output


@pytest.mark.slow
def test_json_alone_on_stdout_and_every_log_line_on_stderr(sorted_source, tmp_path):
    done = run("shuffle", sorted_source, str(tmp_path / "out"), "--piles", "3", "--seed", "1", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert report["rows"] == 30_000
    assert "LocalCluster: " in done.stderr and "pass 1: " in done.stderr and "pass 2: " in done.stderr
    done = run("verify", sorted_source, str(tmp_path / "out"), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True


@pytest.mark.slow
def test_a_reader_gone_from_its_output_stops_the_run_as_sigpipe_would_and_it_resumes(sorted_source, tmp_path):
    """`daskpile shuffle ... | head -1`: exit 141, one line on stderr saying what the run left, no
    "[Errno 32] Broken pipe" error (it was exit 1) and no traceback of the flush at exit."""
    args = [DASKPILE, "shuffle", sorted_source, str(tmp_path / "out"), "--piles", "3", "--seed", "1",
            "--scheduler", "threads"]  # fmt: skip
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stdout.readline().startswith("pass 1: ")
        process.stdout.close()  # as head does, having its line
        stderr = process.stderr.read()
    assert process.returncode == 141, stderr
    assert stderr.startswith("daskpile: stopped: the reader of its output went away; run the same command again")
    assert len(stderr.splitlines()) == 1, stderr
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr


def test_a_reader_gone_before_anything_was_written_is_said_too(tmp_path):
    """The run's first line (a note of its plan) written after the reader went: exit 141 without a word."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"a\nb\nc\n")
    args = [DASKPILE, "shuffle", str(corpus), str(tmp_path / "out"), "--piles", "8", "--scheduler", "threads"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        process.stdout.close()  # as a reader gone at once does
        stderr = process.stderr.read()
    assert process.returncode == 141, stderr
    assert stderr == "daskpile: stopped: the reader of its output went away; it had written nothing\n"
    assert not (tmp_path / "out").exists()
    # A command that only reads ends silently, as a program ended by SIGPIPE does (a review: it said "it had
    # written nothing" after its first line)
    run("shuffle", str(corpus), str(tmp_path / "out"), "--piles", "2", "--scheduler", "threads", check_status=0)
    args = [DASKPILE, "epochs", str(tmp_path / "out"), "--batch-size", "1", *["--mix", "1", "--mix", "2"] * 50]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        process.stdout.close()
        stderr = process.stderr.read()
    assert (process.returncode, stderr) == (141, "")


@pytest.mark.slow
def test_a_retry_of_a_finished_run_reports_it_without_starting_a_cluster(sorted_source, tmp_path):
    """A Kubernetes job's retry: `--kubernetes` here has no cluster to reach (and maybe no dask-kubernetes),
    so a run that started one would fail; nor is a LocalCluster started for a retry."""
    dest = str(tmp_path / "out")
    run("shuffle", sorted_source, dest, "--piles", "3", "--seed", "1", "--scheduler", "threads", check_status=0)
    for where in ([], ["--kubernetes", "daskpile-test", "--namespace", "nowhere"]):
        retried = run("shuffle", sorted_source, dest, "--piles", "3", "--seed", "1", *where, check_status=0)
        assert retried.stdout.startswith(f"already done: {dest} holds this run's finished result"), retried.stdout
        assert "LocalCluster" not in retried.stdout + retried.stderr
    other = run("shuffle", sorted_source, dest, "--seed", "2", "--kubernetes", "daskpile-test", check_status=2)
    assert "of another call (this call: seed 2 instead of 1)" in other.stderr and "LocalCluster" not in other.stdout


@pytest.mark.slow
@pytest.mark.parametrize("stopped_in", ["pass 1", "pass 2"])  # (its run file in scratch alone, or in dest too)
def test_a_rerun_of_another_seed_an_unfinished_run_refuses_says_so_before_a_cluster(sorted_source, tmp_path,
                                                                                   stopped_in):  # fmt: skip
    """A rerun with another seed of an interrupted run started a LocalCluster (a Kubernetes job's pods) only to
    refuse it (a new user's trial of the command); the same call then resumes as before."""
    from _util import interrupted_after

    from daskpile.engine import _passes

    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    writer, after = ("scatter_table", 1) if stopped_in == "pass 1" else ("write_parquet", 1)
    with dask.config.set(scheduler="sync"), interrupted_after(_passes, writer, after):
        daskpile.shuffle_parquet(sorted_source, str(dest), 3, seed=1, scratch=str(scratch), blocksize=2**16)
    assert (dest / "_daskpile.run.json").exists() == (stopped_in == "pass 2")
    where = ["--scratch", str(scratch), "--blocksize", str(2**16)]
    other = run("shuffle", sorted_source, str(dest), "--piles", "3", "--seed", "2", *where,
                "--kubernetes", "daskpile-test", "--namespace", "nowhere", check_status=2)  # fmt: skip
    said = "an unfinished daskpile run (seed 1, 3 piles) that this call does not match: seed 2 instead of 1. Run"
    assert said in other.stderr and "Kubernetes" not in other.stderr, other.stderr
    resumed = run("shuffle", sorted_source, str(dest), "--piles", "3", "--seed", "1", *where, check_status=0)
    assert ("resumed" in resumed.stdout) == (stopped_in == "pass 2")  # (no task of pass 1 had finished)
    assert daskpile.verify(sorted_source, str(dest)).ok


@pytest.mark.slow
def test_a_resumed_run_says_the_files_it_kept_from_the_interrupted_run(sorted_source, tmp_path):
    """Its pass-2 line said them written (a new user's trial of the command)."""
    from _util import interrupted_after

    from daskpile.engine import _passes

    dest = tmp_path / "out"
    with dask.config.set(scheduler="sync"), interrupted_after(_passes, "write_parquet", 1):
        daskpile.shuffle_parquet(sorted_source, str(dest), 3, seed=1)
    resumed = run("shuffle", sorted_source, str(dest), "--piles", "3", "--seed", "1", "--scheduler", "threads",
                  check_status=0)  # fmt: skip
    assert "resumed" in resumed.stdout, resumed.stdout
    assert re.search(r"pass 2: .* written to 3 files \(.*\), 1 of them kept from the interrupted run", resumed.stdout)
    assert daskpile.verify(sorted_source, str(dest)).ok
    fresh = run("shuffle", sorted_source, str(tmp_path / "fresh"), "--piles", "3", "--seed", "1", "--scheduler",
                "threads", check_status=0)  # fmt: skip
    assert "kept from" not in fresh.stdout


@pytest.mark.slow
def test_append_with_the_window_and_the_day_swapped_says_so_before_starting_a_cluster(sorted_source, tmp_path):
    """Python's order is append(dest, source): `daskpile append WINDOW DAY/` started a cluster, then said the
    day's folder holds no manifest, naming no swap."""
    window = str(tmp_path / "window")
    run("shuffle", sorted_source, window, "--piles", "2", "--seed", "1", "--scheduler", "threads", check_status=0)
    swapped = run("append", window, sorted_source, "--kubernetes", "daskpile-test", "--namespace", "nowhere",
                  check_status=2)  # fmt: skip
    assert swapped.stderr.strip().endswith(
        f"daskpile: error: {sorted_source!r} is not a window, and {window!r}, given as a source, is a daskpile "
        "result: the two the wrong way round? The window comes last on the command line (daskpile append "
        "SOURCE... DEST) and first in Python (append(dest, source))"
    ), swapped.stderr


def test_every_command_and_option_says_what_it_does():
    """The reference is generated from these (tests/test_docs.py builds it), so each needs its help text."""
    import click

    for name, command in cli.commands.items():
        assert command.help, name
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, (name, param.opts)


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    """``error`` as raised while handling ``cause``, as daskpile wraps a library's exception."""
    try:
        try:
            raise cause
        except BaseException:
            raise error from cause
    except BaseException as e:
        return e


def test_a_system_error_s_line_drops_its_errno_only_where_that_is_all_it_adds():
    """ "[Errno 28] scratch '...' is full" said errno 28 before what mattered; an error whose text is more than
    its errno and strerror (a connection's, naming its host) keeps it."""
    assert _error_line(OSError(28, "scratch 's' is full: No space left")) == "scratch 's' is full: No space left"
    refused = ConnectionRefusedError(111, "Connect call failed ('10.0.0.1', 9000)")
    assert _error_line(refused) == "Connect call failed ('10.0.0.1', 9000)"

    class ClientConnectorError(OSError):  # (aiohttp's: its text names the host, its strerror does not)
        def __str__(self):
            return "Cannot connect to host s3.example:443 ssl:default [Connect call failed]"

    assert _error_line(ClientConnectorError(111, "Connect call failed")).startswith("Cannot connect to host s3.exa")
    named = FileNotFoundError(2, "No such file or directory", "/data/x.parquet")
    assert _error_line(named) == "[Errno 2] No such file or directory: '/data/x.parquet'"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        pytest.param(
            lambda: SchedulerUnreachable("cannot reach the scheduler at tcp://scheduler:8786"), 75, id="scheduler"
        ),
        pytest.param(
            lambda: daskpile.DestBusyError("dest is being written by another daskpile run"), 75, id="dest-busy"
        ),
        pytest.param(lambda: WindowChangedError("changed while this command ran"), 75, id="window-changed"),
        pytest.param(lambda: daskpile.WindowBusyError("has an unfinished `daskpile append`"), 2, id="window-pending"),
        pytest.param(
            lambda: _raised_from(StoreUnreachable("cannot reach"), EndpointConnectionError(endpoint_url="http://s3")),
            75,
            id="store-out-of-reach",
        ),
        pytest.param(lambda: EndpointConnectionError(endpoint_url="http://s3"), 75, id="store-out-of-reach-in-a-task"),
        pytest.param(lambda: ReadTimeoutError(endpoint_url="http://s3"), 75, id="store-read-timed-out-in-a-task"),
        pytest.param(
            lambda: _raised_from(StoreUnreachable("cannot sign into"), NoCredentialsError()), 2, id="no-credentials"
        ),
        pytest.param(lambda: ValueError("column 'x' holds objects of two types"), 2, id="bad-input"),
        pytest.param(
            lambda: daskpile.FileChangedError("source file 'a' was written again while the shuffle read the source"),
            75,
            id="source-written-during-the-run",
        ),
        pytest.param(
            lambda: CommClosedError("in <TCP (closed) ConnectionPool.gather>: Stream is closed"),
            75,
            id="scheduler-lost",
        ),
        pytest.param(lambda: RuntimeError("pass 2 wrote other rows than pass 1 read"), 1, id="run-failed"),
    ],
)
def test_exit_status_says_whether_running_again_may_mend_it(error, status):
    """75 (EX_TEMPFAIL) for what a later try may not meet, so that a job runner retries it, and 2 for what no
    retry mends: both were 2, and a Kubernetes Job could not tell a missing bucket from a scheduler still
    starting."""
    assert _exit_status(error()) == status


@pytest.mark.slow
def test_a_missing_extra_is_named_with_exit_status_2_before_a_cluster_starts(sorted_source, tmp_path):
    """A package a store or a feature needs, not installed (here: a module of that name that fails to import,
    first on the path): one line naming daskpile's extra to install, exit 2 (it was 1, which ``quality`` uses
    for a check that failed), and for a store before the command starts a cluster (it started one first)."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for module in ("s3fs", "gcsfs", "adlfs", "matplotlib", "torch"):
        (hidden / f"{module}.py").write_text(f"raise ImportError('No module named {module}')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])}
    for url, extra in (("s3://lake/x", "s3"), ("gs://lake/x", "gcs"), ("abfs://lake/x", "azure")):
        done = subprocess.run([DASKPILE, "shuffle", url, str(tmp_path / "o")], capture_output=True, text=True, env=env)
        assert done.returncode == 2 and f"pip install 'daskpile[{extra}]'" in done.stderr, done
        assert len(done.stderr.splitlines()) == 1 and "dashboard" not in done.stdout + done.stderr, done
    done = subprocess.run(
        [DASKPILE, "quality", sorted_source, "--order-column", "id", "--plot", str(tmp_path / "q.png")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and "pip install 'daskpile[plot]'" in done.stderr, done
    torch = subprocess.run([sys.executable, "-c", "import daskpile.torch"], capture_output=True, text=True, env=env)
    assert torch.returncode and "pip install 'daskpile[torch]'" in torch.stderr, torch


@pytest.mark.slow
def test_what_needs_no_cluster_is_said_without_one(sorted_source, tmp_path):
    """The cluster is started (here: reached) when the run first needs it: a source refused, a verify of a
    source that is not there and an append with nothing to do are said with the scheduler out of reach (they
    waited for a LocalCluster's seconds first, a Kubernetes cluster's pods)."""
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}

    def run_on_no_cluster(*args):
        return subprocess.run([DASKPILE, *args, "--scheduler", "tcp://127.0.0.1:9"], capture_output=True, text=True,
                              timeout=120, env=env)  # fmt: skip

    os.makedirs(tmp_path / "bad")
    (tmp_path / "bad" / "x.parquet").write_bytes(b"PAR1 not parquet")
    done = run_on_no_cluster("shuffle", str(tmp_path / "bad"), str(tmp_path / "o1"))
    assert done.returncode == 2 and "cannot read" in done.stderr and "x.parquet" in done.stderr, done.stderr
    window = str(tmp_path / "window")
    run("shuffle", sorted_source, window, "--piles", "4", "--seed", "1", "--scheduler", "sync", check_status=0)
    done = run_on_no_cluster("verify", str(tmp_path / "nowhere"), window)
    assert done.returncode == 2 and "nowhere' does not exist" in done.stderr, done.stderr
    done = run_on_no_cluster("append", sorted_source, window)
    assert done.returncode == 0 and "nothing to do" in done.stdout, done.stderr
    done = run_on_no_cluster("compact", window)
    assert done.returncode == 0 and "nothing to compact" in done.stdout, done.stderr
    # what needs the cluster still says it is out of reach
    done = run_on_no_cluster("verify", sorted_source, window)
    assert done.returncode == 75 and "cannot reach the scheduler at tcp://127.0.0.1:9" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_scheduler_address_where_no_scheduler_answers_is_said_not_waited_on(sorted_source, tmp_path):
    """A port that accepts connections but is no Dask scheduler (its dashboard's): distributed's Client waits
    for a greeting forever, and the command sat silent (a platform trial: a DaskJob to its 48 h deadline)."""
    import socket

    with socket.socket() as listening:  # (the kernel accepts connections into its backlog: never answered)
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        address = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        done = run(
            "shuffle",
            sorted_source,
            str(tmp_path / "out"),
            "--scheduler",
            address,
            check_status=75,
            env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "4s"},
        )  # (distributed's connect timeout)
    assert f"{address} accepted a connection but no Dask scheduler answered in 4 s" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_exit_status_2_for_every_request_that_cannot_run(sorted_source, tmp_path):
    (tmp_path / "a-file").write_text("x")
    done = run("shuffle", sorted_source, str(tmp_path / "a-file"), "--scheduler", "sync", check_status=2)
    assert done.stderr.startswith("daskpile: error: ") and len(done.stderr.splitlines()) == 1
    os.makedirs(tmp_path / "bad")
    (tmp_path / "bad" / "x.parquet").write_bytes(b"PAR1 not parquet")
    done = run("shuffle", str(tmp_path / "bad"), str(tmp_path / "o1"), "--scheduler", "sync", check_status=2)
    assert "x.parquet" in done.stderr and not (tmp_path / "o1").exists()
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    done = subprocess.run([DASKPILE, "shuffle", sorted_source, str(tmp_path / "o2"), "--scheduler", "tcp://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    # 75, EX_TEMPFAIL: a later try may reach it (a job's scheduler still starting), where no retry mends a 2
    assert done.returncode == 75 and "cannot reach the scheduler at tcp://127.0.0.1:9" in done.stderr, done.stderr
    done = run("shuffle", sorted_source, str(tmp_path / "o3"), "--seed", "-1", "--scheduler", "sync", check_status=2)
    assert "'--seed'" in done.stderr and "-1 is not in the range x>=0" in done.stderr
    # Dask's third local scheduler is not one of the command's (it was "missing port number in address")
    done = run("shuffle", sorted_source, str(tmp_path / "o4"), "--scheduler", "processes", check_status=2)
    assert "--scheduler takes a scheduler's address (tcp://host:8786), threads or sync, not 'processes'" in done.stderr
    # options that shape a cluster the command does not start (they were ignored)
    done = run("shuffle", sorted_source, str(tmp_path / "o5"), "--scheduler", "threads", "--workers", "7",
               check_status=2)  # fmt: skip
    assert "--workers shapes a cluster the command starts, and --scheduler threads runs in this process" in done.stderr
    # in a pod of a dask-kubernetes job, whose scheduler's address is in the environment
    env = {**os.environ, "DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.5:8786"}
    done = subprocess.run([DASKPILE, "shuffle", sorted_source, str(tmp_path / "o6"), "--workers", "8", "--kubernetes",
                           "big"], capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 2 and (
        "--workers, --kubernetes shape a cluster the command starts, and $DASK_SCHEDULER_ADDRESS (tcp://10.0.0.5:8786) "
        "names an existing one: unset it to start one"
    ) in " ".join(done.stderr.split()), done.stderr
    # a worker paused from its start by Dask (80 % of its limit) waited forever
    done = run("shuffle", sorted_source, str(tmp_path / "o7"), "--memory-limit", "100MiB", check_status=2)
    assert "--memory-limit 100MiB: a worker holds about 200 MiB before any data" in done.stderr
    # an endpoint no client can use (from the security trial: exit 1, naming neither the store nor the option),
    # its token shown as ***
    done = run("shuffle", "s3://lake/src", str(tmp_path / "o8"), "--storage-option", "key=a", "--storage-option",
               "secret=b", "--storage-option", "client_kwargs.endpoint_url=http://127.0.0.1:1/?token=TOK3N",
               "--scheduler", "sync", check_status=2)  # fmt: skip
    assert done.stderr.startswith(
        "daskpile: error: source 's3://lake/src': cannot use the endpoint given for the store: Custom endpoint "
        "`http://127.0.0.1:1/?token=***` was not a valid URI"
    ), done.stderr
    from daskpile.cli import _check_memory_limit

    for fraction in ["1", "1.0", "0.5", "0"]:  # of the machine's memory, as distributed reads them (0: no limit)
        _check_memory_limit(fraction)
    assert not any((tmp_path / f"o{i}").exists() for i in (2, 3, 4, 5, 6, 7, 8))


@pytest.mark.slow
def test_rows_per_file_plurals_and_a_quiet_demo(sorted_source, tmp_path):
    done = run("shuffle", sorted_source, str(tmp_path / "out"), "--rows-per-file", "10000", "--seed", "1",
               "--piles", "3", "--scheduler", "sync", check_status=0)  # fmt: skip
    assert sorted(daskpile.read_manifest(str(tmp_path / "out"))["rows_per_file"]) == [10_000] * 3
    one = tmp_path / "one"
    write_reference_dataset(one, rows=100, files=1)
    done = run("shuffle", str(one), str(tmp_path / "o1"), "--piles", "1", "--seed", "1", "--scheduler", "sync",
               check_status=0)  # fmt: skip
    assert "from 1 file into 1 pile" in done.stdout and "1 files" not in done.stdout + done.stderr
    done = run("demo", str(tmp_path / "demo"), "--rows", "20000", "-q", check_status=0)
    assert done.stdout.splitlines() == [done.stdout.strip()] and done.stdout.startswith("demo: all 20,000 rows")


def test_a_second_ctrl_c_landing_while_the_first_is_handled_still_says_what_the_run_left():
    """timeout -s INT sends SIGINT twice: the second landed while the first was handled (the dest lease let
    go on S3), and the line said only "daskpile: interrupted", though the run's scratch could resume it."""
    from daskpile.cli import _interruption_said

    try:
        try:
            first = KeyboardInterrupt()
            first.daskpile_state = "/tmp/scratch/daskpile-0123"  # as the passes mark a resumable run
            raise first
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # (from None: chained all the same, as __context__)
    except KeyboardInterrupt as second:
        said = _interruption_said(second)
    assert said == "; run the same command again to resume; its state is in /tmp/scratch/daskpile-0123"


def test_an_error_raised_while_a_ctrl_c_is_handled_is_said_as_the_interruption():
    """A Ctrl-C landing as scratch was removed, after the manifest, made shutil close a file twice: the line
    was "daskpile: error: [Errno 9] Bad file descriptor", exit 1, for a result that was complete."""
    import click
    from click.testing import CliRunner

    from daskpile.cli import _command

    @click.command()
    @_command
    def interrupted_then_failed(quiet):
        try:
            first = KeyboardInterrupt()
            first.daskpile_state = "/tmp/scratch/daskpile-0123"
            raise first
        except KeyboardInterrupt:
            raise OSError(9, "Bad file descriptor") from None

    done = CliRunner().invoke(interrupted_then_failed, [])
    assert done.exit_code == 130
    assert done.stderr == (
        "daskpile: interrupted; run the same command again to resume; its state is in /tmp/scratch/daskpile-0123\n"
    )


@pytest.mark.slow
def test_a_retry_of_a_finished_run_says_no_fresh_plan_before_already_done(tmp_path):
    """A retry on a cluster given by address printed a plan line with another pile count (the cluster had
    more workers then), then "already done: ... in 12 piles": two lines that disagree in a job's log."""
    from _util import daskpile_command, sorted_source

    source = sorted_source(tmp_path / "src", 20_000, files=2)
    args = ["shuffle", source, str(tmp_path / "out"), "--seed=1", "--scheduler=sync"]
    first = daskpile_command(*args)
    assert first.returncode == 0 and first.stdout.startswith("piles=auto: "), first.stdout
    again = daskpile_command(*args)
    assert again.returncode == 0 and again.stdout.startswith("already done: "), again.stdout


def test_retry_for_counts_from_the_error_and_anew_after_a_try_that_got_going(monkeypatch):
    """From the review: the window counted from the command's start, so a run of hours that lost its scheduler
    at the second hour was not tried again under --retry-for 1h (the DaskJob's runner then failed)."""
    from daskpile import cli as command_line

    clock = [0.0]
    monkeypatch.setattr(command_line.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(command_line.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    tries = []

    def run_for(*seconds):  # each try runs so long, then loses its scheduler; the last one succeeds
        def command():
            clock[0] += seconds[len(tries)]
            tries.append(clock[0])
            if len(tries) < len(seconds):
                raise SchedulerUnreachable("cannot reach the scheduler at tcp://scheduler:8786")
            return "done"

        return command

    assert command_line._tried_again(run_for(7200, 1, 1, 1, 7200, 1), retry_for=3600) == "done"
    assert len(tries) == 6
    tries.clear()
    with pytest.raises(SchedulerUnreachable):  # out of reach from the start, for longer than the window
        command_line._tried_again(run_for(*[1] * 100), retry_for=60)
    assert clock[0] - tries[0] < 60 + 60 and 3 <= len(tries) < 10


@pytest.mark.slow
def test_a_cluster_started_with_a_scheduler_file_is_named_by_it(sorted_source, tmp_path):
    """HPC clusters (dask-jobqueue, dask-mpi, a Slurm script running dask scheduler and dask worker) hand out a
    scheduler file, not an address: --scheduler-file takes it, as dask worker does, waiting for it.  The same bytes
    as on Dask's local scheduler; a file that is not one is exit status 2, one never written 75 (a later try may
    find it), and --scheduler given a file says which option takes it."""
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    scheduler_file = tmp_path / "job:1" / "scheduler.json"  # (a ':' in a path names no address)
    scheduler_file.parent.mkdir()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    processes = [  # started beside the command, as a job script does: the file is not there yet
        subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                          "--scheduler-file", str(scheduler_file)], **quiet),
        subprocess.Popen([dask, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                          "--no-dashboard", "--memory-limit", "1GiB"], **quiet),
    ]  # fmt: skip
    shuffle = ["shuffle", sorted_source, "--piles", "4", "--seed", "3"]
    try:
        by_file = run(*shuffle[:2], str(tmp_path / "by-file"), *shuffle[2:], "--scheduler-file", str(scheduler_file))
        assert by_file.returncode == 0, by_file.stderr
        address = json.loads(scheduler_file.read_text())["address"]
        (tmp_path / "job:1" / "kept.json").write_text(scheduler_file.read_text())  # (the scheduler removes its own)
        assert by_file.stdout.startswith(f"cluster {address}: 1 worker, ") and "verified" in by_file.stdout
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)
    run(*shuffle[:2], str(tmp_path / "sync"), *shuffle[2:], "--scheduler", "sync", check_status=0)
    assert file_bytes(tmp_path / "by-file") == file_bytes(tmp_path / "sync")
    refused = run(*shuffle[:2], str(tmp_path / "refused"), "--scheduler", str(tmp_path / "job:1" / "kept.json"))
    assert refused.returncode == 2 and "(a scheduler file is --scheduler-file's)" in refused.stderr, refused.stderr
    connect_in_3s = {**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}
    (tmp_path / "not-one.json").write_text('{"id": "Scheduler-1"}')
    missing = str(tmp_path / "missing" / "scheduler.json")
    refusals = []
    for named, status, said in [
        (str(tmp_path / "not-one.json"), 2, f"Error: --scheduler-file {tmp_path / 'not-one.json'}: not a scheduler "
         "file (JSON holding the scheduler's address, as dask scheduler --scheduler-file writes): no 'address' in it"),
        (missing, 75, f"daskpile: error: no scheduler file at {missing} after 3 s"),
    ]:  # fmt: skip
        refusals.append(
            (
                subprocess.Popen(
                    [DASKPILE, *shuffle[:2], str(tmp_path / "refused"), "--scheduler-file", named],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=connect_in_3s,
                ),
                named,
                status,
                said,
            )
        )  # fmt: skip  (at once: each waits out its 3 s)
    for process, named, status, said in refusals:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == status and stderr.endswith(said + "\n"), stderr
        assert stderr.startswith(f"daskpile: waiting up to 3 s for the scheduler file {named}\n")
    assert not (tmp_path / "refused").exists()


def test_a_warning_is_one_line_of_its_own(tmp_path):
    """Python's form printed the source file and line that warned, then that line of code (a corpus trial:
    "daskpile/cli.py:798: UserWarning: 5 piles for about 2 rows", then "report = call(progress=not quiet)")."""
    (tmp_path / "two.txt").write_text("a\nb\n")
    done = subprocess.run(
        [DASKPILE, "shuffle", str(tmp_path / "two.txt"), str(tmp_path / "out"), "--format", "lines", "--piles", "5",
         "--seed", "1", "-q", "--scheduler", "sync"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stderr.splitlines() == [
        "daskpile: warning: 5 piles for about 2 rows: about 3 or more of their files will be empty"
    ]


def test_a_pipe_as_source_is_refused_naming_it(tmp_path):
    """zcat corpus.gz | daskpile shuffle /dev/stdin ...: fsspec's "File or stream is not seekable" named nothing
    (a corpus trial).  A shuffle reads its source in ranges and more than once."""
    os.mkfifo(tmp_path / "pipe")
    done = subprocess.run(
        [DASKPILE, "shuffle", str(tmp_path / "pipe"), str(tmp_path / "out"), "--format", "lines", "-q"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith(
        f"daskpile: error: source '{tmp_path / 'pipe'}' is not a file"
    )
    assert not (tmp_path / "out").exists()
