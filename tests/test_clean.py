"""`daskpile clean`: the scratch of runs that can no longer be resumed goes; the rest stays."""

import json
import os
import re
import time

import pytest
from _util import interrupted_after, sorted_source
from click.testing import CliRunner

import daskpile
from daskpile._storage import filesystem
from daskpile.cli import cli
from daskpile.engine import _run as run_state
from daskpile.engine._clean import clean
from daskpile.engine._scratch import band_bounds
from daskpile.sources import plan_sources

FS = filesystem("/")[0]


def leftover(root, name: str, spec, age_hours: float = 0.0) -> None:
    """A scratch directory as an interrupted run leaves it: a scratch file, and its run description."""
    directory = root / f"daskpile-{name}"
    directory.mkdir()
    for band in range(len(band_bounds(spec.piles if spec else 2)) - 1):  # one partition, every band written
        (directory / f"scatter-000000-b{band}.arrow").write_bytes(b"x" * 1000)
    if spec is not None:
        run_state.write(FS, str(directory), spec)
    stamp = time.time() - age_hours * 3600
    for path in [directory / n for n in os.listdir(directory)] + [directory]:
        os.utime(path, (stamp, stamp))


@pytest.fixture
def scratch_root(tmp_path, sync_scheduler):
    """Scratch of runs in every state, named by what they are (16 hex digits, as Scratch names them)."""
    root = tmp_path / "scratch"
    root.mkdir()
    source = sorted_source(tmp_path / "src", rows=1_000, files=2)
    plan = plan_sources(source)

    def spec(dest, piles=2, seed=1, stamps=None):
        return run_state.RunSpec(tuple(plan.urls), tuple(stamps or plan.stamps), piles, seed, str(dest), 1)

    daskpile.shuffle_parquet(source, str(tmp_path / "finished"), piles=2, seed=1)
    (tmp_path / "busy").mkdir()
    run_state.write(FS, str(tmp_path / "busy"), spec(tmp_path / "busy", seed=9))
    (tmp_path / "resumable").mkdir()
    run_state.write(FS, str(tmp_path / "resumable"), spec(tmp_path / "resumable"))
    leftover(root, "f" * 16, spec(tmp_path / "finished"), age_hours=2)  # its result is there: done
    leftover(root, "a" * 16, spec(tmp_path / "busy"), age_hours=2)  # dest holds another run
    leftover(root, "c" * 16, spec(tmp_path / "gone", stamps=["1:0", "1:0"]), age_hours=2)  # source changed
    leftover(root, "b" * 16, spec(tmp_path / "resumable"), age_hours=30)  # resumable
    leftover(root, "1" * 16, spec(tmp_path / "not-yet"), age_hours=30)  # in pass 1: dest not made yet
    leftover(root, "2" * 16, None, age_hours=30)  # shuffle(ddf)'s, no description
    leftover(root, "3" * 16, spec(tmp_path / "not-yet-2"), age_hours=0.1)
    (root / "daskpile-main").mkdir()  # not scratch: never touched
    (root / "daskpile-main" / "setup.py").write_text("x")
    return root


def names(found, removable=True):
    return {os.path.basename(f.url).removeprefix("daskpile-")[0] for f in found if f.removable == removable}


def test_clean_removes_only_what_no_run_can_use(scratch_root):
    found = clean(str(scratch_root))
    assert names(found) == {"f", "a", "c"} and names(found, False) == {"b", "1", "2", "3"}
    reasons = {os.path.basename(f.url)[9]: f.reason for f in found}
    assert "finished" in reasons["f"] and "another run" in reasons["a"] and "changed" in reasons["c"]
    assert "resumable" in reasons["b"] and "--older-than" in reasons["2"]
    assert sorted(os.listdir(scratch_root)) == sorted(["daskpile-main"] + [f"daskpile-{c * 16}" for c in "b123"])


def test_older_than_takes_stale_runs_and_keeps_recent_ones(scratch_root):
    found = clean(str(scratch_root), older_than="1d", dry_run=True)
    assert names(found) == {"b", "1", "2"} and names(found, False) == {"f", "a", "c", "3"}  # f, a, c: 2 h old
    assert len(os.listdir(scratch_root)) == 8  # a dry run removes nothing


def test_a_run_writing_now_keeps_its_scratch_whatever_its_age(scratch_root, tmp_path):
    """Pass 2 only reads and removes scratch, so its files grow old while the run uses them: a nightly
    `clean --older-than 12h` removed a long run's scratch under it ("The specified key does not exist")."""
    from _util import start_lease_holder

    holder = start_lease_holder(tmp_path / "resumable")  # b's run, alive: its lease renewed now
    try:
        found = {os.path.basename(f.url)[9]: f for f in clean(str(scratch_root), older_than="1h", dry_run=True)}
        assert not found["b"].removable and found["b"].reason.startswith(
            f"a run of {tmp_path / 'resumable'} is writing"
        )
        assert "its lease renewed" in found["b"].reason and found["1"].removable  # (another run, not alive)
    finally:
        holder.stdin.close()
        holder.wait()
    after = {os.path.basename(f.url)[9]: f for f in clean(str(scratch_root), older_than="1h", dry_run=True)}
    assert after["b"].removable  # ended: judged by its age again


def test_the_command(scratch_root):
    done = CliRunner().invoke(cli, ["clean", "--scratch", str(scratch_root), "--dry-run"])
    assert done.exit_code == 0, done.output
    assert "would remove 3 scratch directories" in done.output and "kept 4" in done.output
    # sizes in the units of every other line (Dask's format_bytes said "kiB")
    assert re.search(r"^keep   .* \(\d+(\.\d)? KiB, ", done.output, re.M) and "kiB" not in done.output
    assert re.search(r"would remove 3 scratch directories \(\d+ KiB\)", done.output)  # (it said "0 MiB")
    done = CliRunner().invoke(cli, ["clean", str(scratch_root), "--json"])  # (SCRATCH as the other commands' paths)
    assert sum(f["removable"] for f in json.loads(done.output)) == 3
    assert len(os.listdir(scratch_root)) == 5
    done = CliRunner().invoke(cli, ["clean", str(scratch_root), "--scratch", str(scratch_root / "other")])
    assert done.exit_code == 2 and "differ: give one" in done.output


def test_a_scratch_that_is_no_directory_and_an_age_dask_cannot_read_are_said_plainly(tmp_path):
    """A file given as the scratch said "removed 0 scratch directories" and exit 0; "3x" listed pandas' units."""
    (tmp_path / "a-file").write_text("x")
    for scratch, said in ((tmp_path / "a-file", "is a file"), (tmp_path / "nothing", "does not exist")):
        with pytest.raises(NotADirectoryError, match=rf"scratch '{scratch}' {said}: give the directory"):
            clean(str(scratch))
    with pytest.raises(ValueError, match=r"^older_than: '3x' is not an age such as 1d, 12h, 30m or 90s$"):
        clean(str(tmp_path), older_than="3x")


def test_scratch_pass_2_used_up_is_removed_when_dest_lacks_its_piles(tmp_path):
    source = sorted_source(tmp_path / "src", rows=1_000, files=1)
    plan = plan_sources(source)
    spec = run_state.RunSpec(tuple(plan.urls), tuple(plan.stamps), 16, 1, str(tmp_path / "deleted"), 1)
    directory = tmp_path / "scratch" / f"daskpile-{'d' * 16}"
    directory.mkdir(parents=True)
    (directory / "scatter-000000-b0.arrow").write_bytes(b"x")  # bands 1... already removed by pass 2
    run_state.write(FS, str(directory), spec)
    (found,) = clean(str(tmp_path / "scratch"))
    assert found.removable and "pass 2 had used up part of it" in found.reason


def test_a_run_still_in_pass_1_is_kept_when_its_listing_misses_files_renamed_in_meanwhile(tmp_path, monkeypatch):
    """readdir need not return a file renamed into the directory during the listing, even one renamed before
    another it does return: a band written before band 0 may be missing from the listing (seen in a new-user
    trial: `daskpile clean` removed the scratch of a shuffle in pass 1, which then failed)."""
    from fsspec.implementations.local import LocalFileSystem

    source = sorted_source(tmp_path / "src", rows=1_000, files=1)
    plan = plan_sources(source)
    spec = run_state.RunSpec(tuple(plan.urls), tuple(plan.stamps), 16, 1, str(tmp_path / "running"), 1)
    directory = tmp_path / "scratch" / f"daskpile-{'e' * 16}"
    directory.mkdir(parents=True)
    for band in range(len(band_bounds(16)) - 1):  # every band of partition 0 written, band 0 last
        (directory / f"scatter-000000-b{band}.arrow").write_bytes(b"x")
    run_state.write(FS, str(directory), spec)
    listed = LocalFileSystem.ls

    def racing_ls(self, path, detail=False, **kwargs):  # as a readdir concurrent with the renames may list
        found = listed(self, path, detail=detail, **kwargs)
        return [f for f in found if "-b1." not in (f["name"] if detail else f)]

    monkeypatch.setattr(LocalFileSystem, "ls", racing_ls)
    (found,) = clean(str(tmp_path / "scratch"))
    assert not found.removable, found.reason


def test_an_interrupted_overwrite_is_resumable_its_parts_are_in_its_staging_directory(tmp_path, sync_scheduler):
    from daskpile.engine import _passes

    source = sorted_source(tmp_path / "src", rows=4_000, files=4)
    dest, scratch = tmp_path / "out", tmp_path / "scratch"
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=1)
    kwargs = dict(piles=8, seed=2, scratch=str(scratch), overwrite=True, blocksize=2**14)
    with interrupted_after(_passes, "write_parquet", 6) as written:
        daskpile.shuffle_parquet(source, str(dest), **kwargs)
    (found,) = clean(str(scratch))
    assert not found.removable and "resumable" in found.reason
    for path in written[:3]:  # as a commit stopped halfway leaves them: some parts moved into dest already
        os.replace(path, dest / os.path.basename(path))
    (found,) = clean(str(scratch))
    assert not found.removable and "resumable" in found.reason
    for path in written[:3]:
        os.replace(dest / os.path.basename(path), path)
    report = daskpile.shuffle_parquet(source, str(dest), **kwargs)
    assert report.resumed_piles == 6 and report.resumed_partitions > 0


def test_a_run_whose_source_was_recorded_without_its_credentials_is_kept(tmp_path):
    """A presigned URL is recorded with its signature as ***: clean opened that URL, was refused, took the
    source for gone and removed the scratch of a run that could still be resumed."""
    (tmp_path / "resumable").mkdir()
    url = "http://127.0.0.1:9/a.parquet?X-Amz-Signature=***"  # (nothing listens there: opening it would fail)
    spec = run_state.RunSpec((url,), ("100:",), 2, 1, str(tmp_path / "resumable"), 1)
    run_state.write(FS, str(tmp_path / "resumable"), spec)
    root = tmp_path / "scratch"
    root.mkdir()
    leftover(root, "b" * 16, spec, age_hours=30)
    found = clean(str(root))
    assert names(found, removable=False) == {"b"} and (root / f"daskpile-{'b' * 16}").exists()


def test_a_run_whose_dest_cannot_be_reached_is_kept_and_the_others_still_judged(tmp_path):
    """A run's dest on a store clean had no options for stopped it at the first such run ("Could not connect
    to the endpoint URL"), naming no scratch, and cleaning nothing else of a shared /tmp."""
    root = tmp_path / "scratch"
    root.mkdir()
    source = tmp_path / "a.parquet"
    source.write_bytes(b"PAR1")
    unreachable = run_state.RunSpec((str(source),), ("4:",), 2, 1,
                                    "nosuchstore://bucket/out", 1)  # fmt: skip
    leftover(root, "a" * 16, unreachable, age_hours=30)
    gone = run_state.RunSpec((str(tmp_path / "gone.parquet"),), ("1:",), 2, 1, str(tmp_path / "out"), 1)
    leftover(root, "b" * 16, gone, age_hours=30)
    found = {os.path.basename(f.url)[9]: f for f in clean(str(root), dry_run=True)}
    assert not found["a"].removable and found["b"].removable  # the other judged all the same
    assert found["a"].reason.startswith("its dest nosuchstore://bucket/out or source could not be read (ValueError")
    assert found["a"].reason.endswith("give the --storage-option its store needs, or --older-than")
    assert clean(str(root), older_than="1d", dry_run=True)[0].removable


def test_a_run_file_that_cannot_be_read_is_said_and_the_others_still_judged(tmp_path):
    """From the security trial: one scratch folder whose run file was not readable (truncated, another
    version's) stopped `clean` with "error: source_files", cleaning nothing else of a shared /tmp."""
    root = tmp_path / "scratch"
    root.mkdir()
    leftover(root, "a" * 16, None, age_hours=30)
    unreadable = root / f"daskpile-{'a' * 16}" / run_state.RUN_FILE
    unreadable.write_text('{"x": 1}')
    os.utime(unreadable, (time.time() - 30 * 3600,) * 2)
    gone = run_state.RunSpec((str(tmp_path / "gone.parquet"),), ("1:",), 2, 1, str(tmp_path / "out"), 1)
    leftover(root, "b" * 16, gone, age_hours=30)
    found = {os.path.basename(f.url)[9]: f for f in clean(str(root), dry_run=True)}
    assert not found["a"].removable and found["a"].reason == "its run file cannot be read: give --older-than"
    assert found["b"].removable
    stale = {os.path.basename(f.url)[9]: f for f in clean(str(root), older_than="1d")}
    assert stale["a"].removable and stale["a"].reason == "its run file cannot be read, older than 1 d"
    assert not any(root.iterdir())
