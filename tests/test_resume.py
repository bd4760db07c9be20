"""Kill -9 the driver at several points; running the same call again resumes the run."""

import dataclasses
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import dask
import pytest
from _util import (
    DASKPILE,
    count_files,
    file_bytes,
    finished_partitions,
    interrupted_after,
    sorted_source,
    uninterrupted_run,
)

import daskpile
from daskpile.datasets import write_reference_dataset
from daskpile.engine._clean import clean as daskpile_clean

DRIVER = os.path.join(os.path.dirname(__file__), "_driver.py")
FILES, ROWS, PILES, SEED = 60, 120_000, 40, 7
# Small files are read together up to blocksize / 16 on disk, and a row group over blocksize in memory is cut:
# this blocksize (files of 2,000 rows, 50 KB on disk, 100 KB in memory) keeps one task, one piece and one
# scratch file per band per file, so that a kill or an interruption can land between partitions.
BLOCKSIZE = 128 * 2**10
shuffle = functools.partial(daskpile.shuffle_parquet, blocksize=BLOCKSIZE)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return sorted_source(tmp_path_factory.mktemp("resume") / "src", ROWS, FILES)


@pytest.fixture(scope="module")
def uninterrupted(source, tmp_path_factory):
    return uninterrupted_run(source, tmp_path_factory.mktemp("resume") / "reference", PILES, SEED, blocksize=BLOCKSIZE)


def kill_driver_when(source, dest, scratch, ready, timeout=60, overwrite=False, may_finish=False):
    """Start a driver, SIGKILL it as soon as ready() holds; fail if it finished first (unless it may)."""
    args = [sys.executable, DRIVER, source, str(dest), str(scratch), str(PILES), str(SEED), str(BLOCKSIZE)]
    process = subprocess.Popen(args + (["overwrite"] if overwrite else []))
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if process.poll() is not None:
                if may_finish:
                    return
                pytest.fail(f"the driver ended (code {process.returncode}) before it could be killed")
            if time.monotonic() > deadline:
                pytest.fail("the driver never reached the kill point")
            time.sleep(0.002)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    if not overwrite and not may_finish:
        assert not (dest / "_daskpile.json").exists()


def kill_points(dest, scratch) -> dict:
    """When to kill the driver: conditions on what the run has written so far."""
    return {
        "pass 1": lambda: finished_partitions(scratch) >= 10,
        "between passes": lambda: (dest / "_daskpile.run.json").exists(),
        "pass 2": lambda: count_files(dest, "part-") >= 8,
        "after the manifest": lambda: (dest / "_daskpile.json").exists(),  # or it ended first: a retry of a success
    }


@pytest.mark.slow
@pytest.mark.parametrize("point", ["pass 1", "between passes", "pass 2", "pass 2, a part changed since"])
def test_resume_after_the_driver_is_killed(source, uninterrupted, tmp_path, point, capsys):
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    ready = kill_points(dest, scratch)[point.split(",")[0]]
    kill_driver_when(source, dest, scratch, ready)
    scattered, gathered = finished_partitions(scratch), count_files(dest, "part-")
    assert scattered > 0 and (point != "pass 1" or scattered < FILES)
    assert not point.startswith("pass 2") or 0 < gathered < PILES
    if point != "pass 1":  # what a writer killed mid-file leaves (the kill may or may not land on one)
        (dest / ".part-00039.parquet.0123456789abcdef.tmp").write_bytes(b"PAR1 half a file")
    if point.endswith("changed since"):  # its footer, stamp and fingerprint kept: a resumed run took its word
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        part = sorted(dest.glob("part-*.parquet"))[0]
        table = pq.read_table(part)
        changed = table.set_column(0, table.field(0), pc.add(table.column(0), 1))
        pq.write_table(changed.replace_schema_metadata(table.schema.metadata), part)

    with dask.config.set(scheduler="sync"):
        report = shuffle(source, str(dest), piles=PILES, seed=SEED, scratch=str(scratch), progress=True)
    assert report.resumed_partitions >= 10
    assert not point.startswith("pass 2") or report.resumed_piles >= 7
    # pass 1 says what it wrote, apart from the scratch it kept
    said = re.search(
        r"([\d,.]+) [KM]iB to scratch, ([\d,.]+) [KM]iB kept from the interrupted run", capsys.readouterr().out
    )
    written, kept = (float(said[i].replace(",", "")) for i in (1, 2)) if said else (None, None)
    assert said and (written > 0) == (point == "pass 1") and kept > 0
    assert file_bytes(dest) == uninterrupted
    assert daskpile.verify(source, str(dest)).ok
    assert sorted(os.listdir(dest))[:2] == ["_daskpile.json", "part-00000.parquet"]
    assert not (dest / "_daskpile.run.json").exists() and os.listdir(scratch) == []


@pytest.mark.slow
def test_an_interrupted_run_whose_dest_was_deleted_starts_pass_1_again(source, uninterrupted, tmp_path):
    """Pass 2 removed the scratch of bands it had written; with those piles gone, the scratch cannot serve."""
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    kill_driver_when(source, dest, scratch, lambda: count_files(dest, "part-") >= PILES // 2)
    shutil.rmtree(dest)
    with dask.config.set(scheduler="sync"):
        report = shuffle(source, str(dest), piles=PILES, seed=SEED, scratch=str(scratch))
    assert report.resumed_partitions == 0 and file_bytes(dest) == uninterrupted


def test_a_resumed_run_reads_no_file_of_a_partition_pass_1_finished(source, uninterrupted, tmp_path, monkeypatch):
    """Finished partitions are reused as recorded (``Scratch.write_done``): their source files were all opened
    again to number their pieces, 30,000 small files 2-4 s, a request each on an object store."""
    from daskpile.engine import _passes

    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scatter, started = _passes.scatter_partition, []

    def stopping_at_the_eleventh(fs, files, partition, *args, **kwargs):
        if len(started) == 10:
            raise RuntimeError("interrupted")
        started.append(partition)
        return scatter(fs, files, partition, *args, **kwargs)

    with dask.config.set(scheduler="sync"):
        monkeypatch.setattr(_passes, "scatter_partition", stopping_at_the_eleventh)
        with pytest.raises(RuntimeError, match="interrupted"):
            shuffle(source, str(dest), piles=PILES, seed=SEED, scratch=str(scratch))
        monkeypatch.undo()
        opened, read_pieces = [], _passes.read_pieces

        def counting(fs, files, *args, **kwargs):
            opened.extend(f.path for f in files)
            return read_pieces(fs, files, *args, **kwargs)

        monkeypatch.setattr(_passes, "read_pieces", counting)
        report = shuffle(source, str(dest), piles=PILES, seed=SEED, scratch=str(scratch))
    assert report.resumed_partitions == 10 and file_bytes(dest) == uninterrupted
    assert len(opened) == FILES - 10 and len(set(opened)) == FILES - 10  # the other 50, each once


@pytest.mark.slow
@pytest.mark.parametrize("point", ["pass 1", "pass 2", "after the manifest"])
def test_a_retried_command_always_ends_with_exit_0_and_the_same_bytes(source, uninterrupted, tmp_path, point):
    """What Kubernetes does to a failed job pod: the same command again, at any moment, even after the commit."""
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    ready = kill_points(dest, scratch)[point]
    kill_driver_when(source, dest, scratch, ready, may_finish=point == "after the manifest")
    command = [DASKPILE, "shuffle", source, str(dest), "--piles", str(PILES), "--seed", str(SEED),
               "--scratch", str(scratch), "--blocksize", str(BLOCKSIZE), "--scheduler", "sync", "-q"]  # fmt: skip
    for _retry in range(2):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert file_bytes(dest) == uninterrupted
    assert done.stdout.startswith(f"already done: {dest} holds this run's finished result, 120,000 rows"), done.stdout
    assert not (dest / "_daskpile.run.json").exists() and os.listdir(scratch) == []
    other = subprocess.run([*command[:4], "--piles", "12", *command[6:]], capture_output=True, text=True)
    assert other.returncode == 2 and "of another call (this call: piles 12 instead of 40)" in other.stderr, other.stderr


def test_a_retry_after_the_commit_removes_what_the_killed_run_left(source, tmp_path):
    """The state of a driver killed between writing the manifest and removing its run file and scratch."""
    import fsspec

    from daskpile.engine import _run

    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    with dask.config.set(scheduler="sync"):
        shuffle(source, str(dest), piles=4, seed=1, scratch=str(scratch))
        written = file_bytes(dest)
        run = _run.RunSpec.from_json(daskpile.read_manifest(str(dest))["run"])
        _run.write(fsspec.filesystem("file"), str(dest), run)
        left = scratch / f"daskpile-{_run.scratch_name(run.dest)}"
        left.mkdir(parents=True)
        (left / "scatter-000000-0.arrow").write_bytes(b"what pass 1 wrote")
        report = shuffle(source, str(dest), piles=4, seed=1, scratch=str(scratch))
    assert report.already_finished and report.rows == ROWS
    assert file_bytes(dest) == written
    assert not (dest / "_daskpile.run.json").exists() and not left.exists()


@pytest.mark.slow
def test_a_retry_does_not_call_a_damaged_result_done(source, tmp_path):
    dest = tmp_path / "out"
    with dask.config.set(scheduler="sync"):
        shuffle(source, str(dest), piles=4, seed=1)
        assert shuffle(source, str(dest), piles=4, seed=1).already_finished
        (dest / "part-00002.parquet").unlink()
        with pytest.raises(FileExistsError, match=r"1 file of it changed or went since it was written \(part-00002"):
            shuffle(source, str(dest), piles=4, seed=1)
        shuffle(source, str(dest), piles=4, seed=1, overwrite=True)
        with open(dest / "part-00001.parquet", "r+b") as f:  # the same size, other bytes
            f.seek(100)
            f.write(b"damaged!")
        with pytest.raises(FileExistsError, match=r"1 file of it changed or went since it was written \(part-00001"):
            shuffle(source, str(dest), piles=4, seed=1)
        assert not shuffle(source, str(dest), piles=4, seed=1, overwrite=True).already_finished
    assert daskpile.verify(source, str(dest)).ok


@pytest.mark.slow
def test_leftover_state_of_a_deleted_dest_is_named_where_it_is(source, tmp_path):
    """A dest deleted by hand: the refusal names the scratch that holds the run, not the dest that is gone."""
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    kill_driver_when(source, dest, scratch, lambda: finished_partitions(scratch) >= 10)
    shutil.rmtree(dest, ignore_errors=True)
    with dask.config.set(scheduler="sync"), pytest.raises(daskpile.RunMismatchError) as refused:
        shuffle(source, str(dest), piles=PILES, seed=8, scratch=str(scratch))
    assert str(refused.value).startswith(f"scratch '{scratch}/daskpile-")
    assert f"holds, for dest '{dest}', an unfinished daskpile run" in str(refused.value)
    # what it says works (it said "daskpile clean", which keeps a run that can be resumed: the error came again)
    assert str(refused.value).endswith("or pass overwrite=True (--overwrite) to discard it and run this call.")
    assert [leftover.removable for leftover in daskpile_clean(str(scratch))] == [False]
    with dask.config.set(scheduler="sync"):
        report = shuffle(source, str(dest), piles=PILES, seed=8, scratch=str(scratch), overwrite=True)
    assert report.seed == 8 and daskpile.verify(source, str(dest)).ok


@pytest.mark.slow
def test_seed_none_adopts_the_interrupted_runs_seed(source, uninterrupted, tmp_path):
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    kill_driver_when(source, dest, scratch, lambda: count_files(dest, "part-") >= 4)
    with dask.config.set(scheduler="sync"):
        report = shuffle(source, str(dest), piles=PILES, scratch=str(scratch))
    assert report.seed == SEED and file_bytes(dest) == uninterrupted


@pytest.mark.slow
def test_a_mismatching_rerun_is_refused(source, tmp_path):
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    kill_driver_when(source, dest, scratch, lambda: count_files(dest, "part-") >= 4)
    with dask.config.set(scheduler="sync"):
        with pytest.raises(daskpile.RunMismatchError, match=r"seed 8 instead of 7.*overwrite=True"):
            shuffle(source, str(dest), piles=PILES, seed=8, scratch=str(scratch))
        with pytest.raises(daskpile.RunMismatchError, match="piles 12 instead of 40"):
            shuffle(source, str(dest), piles=12, seed=SEED, scratch=str(scratch))
        report = shuffle(source, str(dest), piles=12, seed=8, scratch=str(scratch), overwrite=True)
    assert report.resumed_partitions == 0 and report.resumed_piles == 0
    assert sorted(os.listdir(dest)) == ["_daskpile.json"] + [f"part-{j:05d}.parquet" for j in range(12)]
    assert daskpile.verify(source, str(dest)).ok


def test_a_run_whose_source_changed_since_is_not_said_resumable(tmp_path, sync_scheduler):
    """A rerun of the very call after a file of the source changed was told "Run the same call again to
    resume it": it was the same call, and it could not."""
    from daskpile.engine import _outputs

    write_reference_dataset(tmp_path / "src", rows=4_000, files=2)
    source, dest = str(tmp_path / "src"), str(tmp_path / "out")
    call = functools.partial(daskpile.shuffle_parquet, source, dest, piles=4, seed=1, output_format="csv")
    with interrupted_after(_outputs, "write", 1):
        call()
    changed = sorted((tmp_path / "src").iterdir())[0]
    os.utime(changed, (changed.stat().st_atime, changed.stat().st_mtime + 60))
    said = r"source files changed since: .*\. The source changed since it began, so it cannot be resumed: pass "
    with pytest.raises(daskpile.RunMismatchError, match=said + r"overwrite=True \(--overwrite\)"):
        call()
    with pytest.raises(daskpile.RunMismatchError, match=r"seed 2 instead of 1") as refused:
        daskpile.shuffle_parquet(source, dest, piles=4, seed=2, output_format="csv")
    assert "The source changed since it began, so it cannot be resumed" in str(refused.value)  # not "the same call"
    # another call, of some of its files: the call that began it resumes it (told it could not, by a review)
    one = str(sorted((tmp_path / "src").iterdir())[1])
    said = r"other source files \(1 now, 2 then: .*input-00000.parquet is not among them\)\. Run the call that began"
    with pytest.raises(daskpile.RunMismatchError, match=said):
        daskpile.shuffle_parquet(one, dest, piles=4, seed=1, output_format="csv")
    # another source for the same dest (a formats trial: told its source had changed)
    write_reference_dataset(tmp_path / "other", rows=1_000, files=1)
    said = (
        r"other source files \(1 now, 2 then: .*\)\. Run the call that began it again to resume it, or pass overwrite"
    )
    with pytest.raises(daskpile.RunMismatchError, match=said):
        daskpile.shuffle_parquet(str(tmp_path / "other"), dest, piles=4, seed=1, output_format="csv")
    # a file added since, or one removed: the source changed, even though the call is the same (told to run the
    # call that began it again, which was this one)
    added = tmp_path / "src" / "input-00009.parquet"
    shutil.copy(one, added)
    with pytest.raises(daskpile.RunMismatchError, match=r"input-00009.parquet is new\)\. The source changed"):
        call()
    added.unlink()
    os.rename(one, tmp_path / "elsewhere.parquet")
    with pytest.raises(daskpile.RunMismatchError, match=r"input-00001.parquet is gone\)\. The source changed"):
        call()
    os.rename(tmp_path / "elsewhere.parquet", one)
    assert call(overwrite=True).rows == 4_000


@pytest.mark.slow
def test_an_old_result_stays_whole_until_its_replacement_is_complete(source, uninterrupted, tmp_path):
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    with dask.config.set(scheduler="sync"):
        shuffle(source, str(dest), piles=5, seed=1)
    old = file_bytes(dest)
    kill_driver_when(source, dest, scratch, lambda: count_files(dest, "part-") >= 5 + 6, overwrite=True)
    assert file_bytes(dest) == old  # staged parts live in a hidden directory
    assert daskpile.read_manifest(str(dest))["piles"] == 5 and daskpile.verify(source, str(dest)).ok
    with dask.config.set(scheduler="sync"):
        report = shuffle(source, str(dest), piles=PILES, seed=SEED, scratch=str(scratch), overwrite=True)
    assert report.resumed_piles >= 6 and file_bytes(dest) == uninterrupted
    assert [n for n in os.listdir(dest) if n.startswith(".")] == []


def test_a_run_s_band_count_is_kept_in_its_state_and_runs_in_8_bands_keep_their_keys():
    """A resumed run reads its scratch in the bands it wrote, whatever ``bands_for`` would say now."""
    from daskpile.engine import _run, _scratch

    assert _run.BANDS == _scratch.BANDS
    spec = _run.RunSpec(("a.csv",), ("1",), piles=8, seed=1, dest="/d", blocksize=1, bands=2)
    assert _run.RunSpec.from_json(spec.to_json()) == spec
    eight = dataclasses.replace(spec, bands=8)
    assert "bands" not in eight.to_json() and _run.RunSpec.from_json(eight.to_json()) == eight
