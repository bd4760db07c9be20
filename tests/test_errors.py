"""Bad input gets an error naming the problem, and nothing is written to dest."""

import errno
import os
import re
import shutil
import subprocess
import time

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from _util import daskpile_command, daskpile_in_process, write_parts

import daskpile
from daskpile.datasets import reference_table


@pytest.fixture
def source(tmp_path):
    write_parts(reference_table(0, 40_000, 40_000), tmp_path / "src", parts=4)
    return str(tmp_path / "src")


@pytest.fixture
def immutable_dir(tmp_path):
    """A directory nobody, root included, may write into (chattr +i)."""
    path = tmp_path / "locked"
    path.mkdir()
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    yield path
    subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 1 MiB tmpfs, to run out of space on."""
    path = tmp_path / "tiny"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield path
    for _ in range(100):  # a worker may still be finishing a write that failed
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    pytest.fail(f"could not unmount {path}")


def test_no_permission_to_write_dest(sync_scheduler, source, immutable_dir):
    dest = immutable_dir / "out"
    with pytest.raises(PermissionError, match=r"no permission to write dest .*locked.* is not writable"):
        daskpile.shuffle_parquet(source, str(dest), piles=2)
    assert not dest.exists()


def test_window_commands_on_a_window_nobody_may_write_say_so_in_one_line(sync_scheduler, source, tmp_path):
    """They failed with a bare "[Errno 30] Read-only file system: '.../_daskpile.lease.json'" and exit 1."""
    window = tmp_path / "window"
    daskpile.shuffle_parquet(source, str(window), piles=2, seed=1)
    subprocess.run(["chattr", "+i", str(window)], capture_output=True)
    try:
        if os.access(window, os.W_OK):
            pytest.skip("chattr +i is not available here")
        with pytest.raises(PermissionError, match=r"no permission to write window .*window.* is not writable"):
            daskpile.compact(str(window))
        for command in (["compact", str(window)], ["expire", str(window), "--keep", "1"], ["discard", str(window)]):
            refused = daskpile_in_process(*command)
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
            assert "no permission to write window" in refused.stderr
    finally:
        subprocess.run(["chattr", "-i", str(window)], check=True)


def test_a_finished_call_retried_where_its_dest_is_no_longer_writable_is_already_done(sync_scheduler, source, tmp_path):
    """A job's retry after its result was made read-only for its readers: "no permission to write dest", exit 2,
    where the same retry in a writable dest said "already done", exit 0."""
    dest = tmp_path / "out"
    first = daskpile.shuffle_parquet(source, str(dest), piles=2, seed=1)
    subprocess.run(["chattr", "+i", str(dest)], capture_output=True)
    try:
        if os.access(dest, os.W_OK):
            pytest.skip("chattr +i is not available here")
        again = daskpile.shuffle_parquet(source, str(dest), piles=2, seed=1)
        assert again.rows == first.rows and again.files == first.files and again.seconds_scatter == 0.0
        done = daskpile_in_process("shuffle", source, str(dest), "--piles", "2", "--seed", "1", "--scheduler", "sync")
        assert done.returncode == 0 and "already done" in done.stdout, done.stderr
        with pytest.raises(PermissionError, match="no permission to write dest"):  # another call: refused as before
            daskpile.shuffle_parquet(source, str(dest), piles=3, seed=1)
    finally:
        subprocess.run(["chattr", "-i", str(dest)], check=True)


def test_scratch_inside_dest_is_refused_before_anything_is_written(sync_scheduler, source, tmp_path):
    """It left a folder in dest that a retry of the same call then refused as not daskpile's."""
    dest = tmp_path / "out"
    with pytest.raises(ValueError, match=r"scratch '.*out/tmp' is inside dest '.*out', .* pass a scratch outside"):
        daskpile.shuffle_parquet(source, str(dest), piles=2, seed=1, scratch=str(dest / "tmp"))
    assert not dest.exists()
    daskpile.shuffle_parquet(source, str(dest), piles=2, seed=1, scratch=str(tmp_path / "outside"))


def test_scratch_inside_the_source_is_refused_before_anything_is_written(sync_scheduler, source, tmp_path):
    """A run interrupted in pass 1 was resumed by listing its own scratch files as source data: of text, "holds
    files of several formats (arrow, jsonl)"; of Parquet, a schema mismatch.  A source inside scratch is fine."""
    dest = tmp_path / "out"
    for scratch in (f"{source}/tmp", source):
        with pytest.raises(ValueError, match=r"scratch '.*src(/tmp)?' is inside the source '.*src', so a run resumed"):
            daskpile.shuffle_parquet(source, str(dest), piles=2, seed=1, scratch=scratch)
        assert not dest.exists() and sorted(os.listdir(source)) == [f"in-{i:03d}.parquet" for i in range(4)]
    daskpile.shuffle_parquet([source], str(dest), piles=2, seed=1, scratch=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]


def test_no_permission_to_write_scratch(sync_scheduler, source, immutable_dir, tmp_path):
    with pytest.raises(PermissionError, match="no permission to write scratch"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, scratch=str(immutable_dir))
    assert not (tmp_path / "out").exists()


def test_not_enough_space_is_found_before_anything_is_written(client, source, tiny_filesystem, tmp_path):
    with pytest.raises(OSError, match=r"not enough space for scratch .*tiny.*: the run needs about .* are free") as e:
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=4, scratch=str(tiny_filesystem))
    assert e.value.errno == errno.ENOSPC
    assert os.listdir(tiny_filesystem) == []
    assert not (tmp_path / "out").exists()
    # the command: a request that cannot run as given (2), as a scratch without permission is; it exited 1,
    # "[Errno 28] ...", which says the run failed
    args = ["shuffle", source, str(tmp_path / "out"), "--piles", "4", "--scratch", str(tiny_filesystem)]
    done = daskpile_command(*args, "--scheduler", "sync")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"daskpile: error: not enough space for scratch '{tiny_filesystem}") and (
        done.stderr.endswith("Free some space or give scratch (--scratch) on a larger disk or an object store\n")
    )
    assert os.listdir(tiny_filesystem) == [] and not (tmp_path / "out").exists()
    # dest short of space is not helped by another scratch: it was advised all the same
    with pytest.raises(
        OSError, match=r"not enough space for dest .* are free\. Free some space or write the result on a "
    ):
        daskpile.shuffle_parquet(source, str(tiny_filesystem / "out"), piles=4, scratch=str(tmp_path / "scratch"))


def test_scratch_full_midway_says_so_and_cleans_up(client, tiny_filesystem, tmp_path):
    # Repeated strings, dictionary-encoded in Parquet, short in the file whose first rows the estimate
    # decodes and long in the others: the estimate promises 200 KB, scratch takes 3 MB, the disk fills.
    table = pa.table({"s": ["x"] * 10_000 + ["x" * 100] * 30_000})
    write_parts(table, tmp_path / "src", parts=4)
    full = r"scratch .*tiny.* is full: .*No space left on device\. Free space there, or give scratch \(--scratch\) on "
    again = r"a larger disk or an object store, and run the same command again \(nothing was written to dest\)$"
    with pytest.raises(OSError, match=full + again) as e:
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=4, scratch=str(tiny_filesystem))
    assert str(e.value).count("Errno") == 1  # (it was said three times)
    assert os.listdir(tiny_filesystem) == []
    assert not (tmp_path / "out").exists()


def test_small_pieces_into_many_piles_fit_where_their_rows_fit(sync_scheduler, tiny_filesystem, tmp_path):
    """250 KB of rows read in pieces of 16 KiB into 300 piles: every scratch file held the numbers of every pile
    uncompressed, 1.4 MB in all, more than the disk, where the estimate said 250 KB.  The estimate counts them,
    and the run's scratch is its rows and a little more."""
    import pyarrow.parquet as pq

    rows = 10_000
    table = pa.table({"x": np.arange(rows), "y": np.arange(rows) * 0.5, "s": [f"s{i:05d}" for i in range(rows)]})
    (tmp_path / "src").mkdir()
    pq.write_table(table, tmp_path / "src" / "one.parquet", row_group_size=500)
    report = daskpile.shuffle_parquet(
        str(tmp_path / "src"), str(tmp_path / "out"), piles=300, seed=1, blocksize="16KiB",
        scratch=str(tiny_filesystem),
    )  # fmt: skip
    assert report.rows == rows and report.scratch_bytes < 1.5 * table.nbytes, (report.scratch_bytes, table.nbytes)
    assert os.listdir(tiny_filesystem) == []


def test_a_copy_of_a_result_is_said_to_be_one(sync_scheduler, source, tmp_path):
    """It said "(this call: written as <the first dest>)", which names no difference of the call."""
    daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, seed=1)
    shutil.copytree(tmp_path / "out", tmp_path / "copy")
    with pytest.raises(FileExistsError, match=r"\(this call: dest is a copy of the result written at .*/out\)"):
        daskpile.shuffle_parquet(source, str(tmp_path / "copy"), piles=2, seed=1)


def test_dest_that_is_a_file(source, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        daskpile.shuffle_parquet(source, str(tmp_path / "file"), piles=2)


@pytest.mark.parametrize("overwrite", [False, True])
def test_dest_with_foreign_files_is_refused_even_with_overwrite(source, tmp_path, overwrite):
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "sub" / "data.csv").write_text("a,b")
    with pytest.raises(FileExistsError, match=r"holds files daskpile did not write \(notes\.txt, sub\)"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, overwrite=overwrite)
    assert sorted(os.listdir(tmp_path / "out")) == ["notes.txt", "sub"]
    assert (tmp_path / "out" / "sub" / "data.csv").read_text() == "a,b"


def test_overwrite_removes_exactly_the_old_result(sync_scheduler, source, tmp_path):
    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=5, seed=1)
    with pytest.raises(
        FileExistsError,
        match=r"result of another call \(this call: piles 3 instead of 5; seed 2 instead of 1\); pass overwrite",
    ):
        daskpile.shuffle_parquet(source, str(dest), piles=3, seed=2)
    daskpile.shuffle_parquet(source, str(dest), piles=3, seed=2, overwrite=True)  # 5 parts replaced by 3
    assert sorted(os.listdir(dest)) == ["_daskpile.json"] + [f"part-{j:05d}.parquet" for j in range(3)]
    (dest / "notes.txt").write_text("mine")  # a user's file beside a result: the result is no longer only ours
    with pytest.raises(FileExistsError, match=r"did not write \(notes\.txt\)"):
        daskpile.shuffle_parquet(source, str(dest), piles=2, seed=3, overwrite=True)
    assert daskpile.read_manifest(str(dest))["seed"] == 2 and (dest / "notes.txt").exists()


def test_an_unfinished_run_claims_only_the_part_names_it_writes(source, tmp_path):
    """Every part-NNNNN.* of a dest holding an unfinished run was taken for its own: a part-00999.parquet of a
    run of 40 piles stayed, and the run said "verified" over a result that verify then failed."""
    from daskpile.engine import _dest
    from daskpile.engine import _run as run_state

    dest = tmp_path / "out"
    dest.mkdir()
    run_state.write(fsspec.filesystem("file"), str(dest), run_state.RunSpec((), (), 40, 7, str(dest), 2**20))
    (dest / "part-00003.parquet").write_bytes(b"a part the run wrote")
    assert _dest.check(fsspec.filesystem("file"), str(dest)) is None
    for name in ("part-00999.parquet", "part-00001.txt"):
        (dest / name).write_text("mine")
        with pytest.raises(FileExistsError, match=rf"did not write \({re.escape(name)}\)"):
            _dest.check(fsspec.filesystem("file"), str(dest))
        (dest / name).unlink()
    # read as a dataset, its parts would be some of the result's piles: a mismatch, "uniform", or (the loader,
    # until it refused too) the data
    for check in (lambda: daskpile.verify(source, str(dest)), lambda: daskpile.verify(str(dest)),
                  lambda: daskpile.quality(str(dest), order_column="id"),
                  lambda: daskpile.PileLoader(str(dest), batch_size=10, seed=0)):  # fmt: skip
        with pytest.raises(ValueError, match=r"holds an unfinished daskpile run \(seed 7, 40 piles\), not a result"):
            check()
    (dest / "part-00003.parquet").unlink()  # no part yet (or parts of text): "matches no Parquet files" before
    with pytest.raises(ValueError, match=r"holds an unfinished daskpile run \(seed 7, 40 piles\), not a result"):
        daskpile.verify(source, str(dest))
    (dest / "_daskpile.run.json").write_text("{}")  # damaged, or a user's: said so, not a KeyError
    with pytest.raises(ValueError, match=r"_daskpile\.run\.json is not a daskpile run's state \(KeyError"):
        _dest.check(fsspec.filesystem("file"), str(dest))


def test_many_foreign_files_are_named_up_to_ten(source, tmp_path):
    (tmp_path / "out").mkdir()
    for k in range(12):
        (tmp_path / "out" / f"f{k:02d}.txt").write_text("x")
    with pytest.raises(FileExistsError, match=r"f00\.txt, .*, f09\.txt and 2 more\)"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2)


def test_a_memory_budget_below_one_row_is_refused_before_pass_1(source, tmp_path):
    scratch = tmp_path / "scratch"
    with pytest.raises(ValueError, match=r"a row takes about .* more than memory_per_pile=16 \(--memory-per-pile\)"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=4, memory_per_pile=16, scratch=str(scratch))
    assert not (tmp_path / "out").exists() and not any(scratch.glob("daskpile-*/scatter-*"))


def test_a_dest_that_is_a_link_to_the_source_is_refused(source, tmp_path):
    os.symlink(source, tmp_path / "link")
    with pytest.raises(ValueError, match="overlaps the source"):
        daskpile.shuffle_parquet(source, str(tmp_path / "link"), piles=2, overwrite=True)


def test_an_interrupted_commit_is_finished_by_the_next_run(sync_scheduler, source, tmp_path, monkeypatch):
    """Fault injection: the overwrite's commit stops after its first move; the rerun completes it."""
    from fsspec.implementations.local import LocalFileSystem

    dest = tmp_path / "out"
    daskpile.shuffle_parquet(source, str(dest), piles=5, seed=1)
    real_mv, moves = LocalFileSystem.mv, []

    def mv_then_stop(self, *args, **kwargs):
        if moves:
            raise KeyboardInterrupt
        moves.append(args)
        return real_mv(self, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "mv", mv_then_stop)
    with pytest.raises(KeyboardInterrupt):
        daskpile.shuffle_parquet(source, str(dest), piles=3, seed=2, overwrite=True)
    monkeypatch.setattr(LocalFileSystem, "mv", real_mv)
    assert not (dest / "_daskpile.json").exists()  # no reader takes the mix for a result
    report = daskpile.shuffle_parquet(source, str(dest), piles=3, seed=2, overwrite=True)
    assert report.resumed_piles == 3
    assert sorted(os.listdir(dest)) == ["_daskpile.json"] + [f"part-{j:05d}.parquet" for j in range(3)]
    assert daskpile.verify(source, str(dest)).ok


def test_dest_full_in_pass_2_says_so_and_the_same_call_resumes(sync_scheduler, tiny_filesystem, tmp_path):
    """A full dest in pass 2 said only "[Errno 28] Error writing bytes to file": low-cardinality strings are
    small as dictionary-encoded Parquet and larger as daskpile writes them, so the space check passed."""
    words = np.array([f"{i:04d}-{'abcdefghijklmnopqrstuvwxyz'[i % 26] * 28}" for i in range(100)])
    rng = np.random.default_rng(0)
    write_parts(pa.table({"s": words[rng.integers(0, 100, 400_000)]}), tmp_path / "src", parts=2)
    dest = tiny_filesystem / "out"
    with pytest.raises(OSError, match=r"dest .*tiny/out.* is full: .* run the same call again: it resumes"):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(dest), piles=4, seed=1, scratch=str(tmp_path / "s"))
    subprocess.run(["mount", "-o", "remount,size=20m", str(tiny_filesystem)], check=True)  # space made
    report = daskpile.shuffle_parquet(str(tmp_path / "src"), str(dest), piles=4, seed=1, scratch=str(tmp_path / "s"))
    assert report.rows == 400_000 and report.resumed_piles > 0
    assert daskpile.verify(str(tmp_path / "src"), str(dest)).ok


@pytest.mark.parametrize("kind", ["gzipped JSON lines as written", "Parquet as JSON lines"])
def test_a_result_larger_than_its_source_is_found_too_large_before_anything_is_written(
    sync_scheduler, tiny_filesystem, tmp_path, kind
):
    """A new user's gzipped corpus (13.7 MB) written out as JSON lines (99 MiB) passed the check, which took the
    result for the source's size on disk, and filled dest in pass 2 (exit 1, 4 piles of 8 left); Parquet written
    as JSON lines is two to three times its size too."""
    import gzip

    source = tmp_path / "src"
    source.mkdir()
    if kind.startswith("gzipped"):
        lines = "".join(f'{{"id": {i}, "text": "{"lorem ipsum " * 8}"}}\n' for i in range(20_000))
        (source / "corpus.jsonl.gz").write_bytes(gzip.compress(lines.encode()))  # 2.2 MB of lines in 0.05 MB
    else:
        write_parts(reference_table(0, 12_000, 12_000), source, parts=2)  # 0.6 MB, 1.5 MB as JSON lines
    dest = tiny_filesystem / "out"
    with pytest.raises(OSError, match=r"^not enough space for dest .*tiny/out.*: the run needs about ") as e:
        daskpile.shuffle_parquet(str(source), str(dest), piles=4, seed=1, output_format="jsonl")
    assert e.value.errno == errno.ENOSPC and not dest.exists() and os.listdir(tiny_filesystem) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_dest_that_cannot_be_made_is_named_as_dest(sync_scheduler, source):
    """Under /proc, writable to root yet where nothing can be made, the command said a bare "[Errno 2] No such
    file or directory: '/proc/nope'", naming no dest (a new user's trial)."""
    with pytest.raises(OSError, match=r"^\[Errno \d+\] dest '/proc/daskpile-nope/out' cannot be made: ") as e:
        daskpile.shuffle_parquet(source, "/proc/daskpile-nope/out", piles=2, seed=1)
    assert e.value.errno is not None  # (kept: a full disk is told by it)
