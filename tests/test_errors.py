"""Bad input gets an error naming the problem, and nothing is written to dest."""

import os
import shutil
import subprocess
import time

import pyarrow as pa
import pytest
from _util import write_parts

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


def test_no_permission_to_write_scratch(sync_scheduler, source, immutable_dir, tmp_path):
    with pytest.raises(PermissionError, match="no permission to write scratch"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2, scratch=str(immutable_dir))
    assert not (tmp_path / "out").exists()


def test_not_enough_space_is_found_before_anything_is_written(client, source, tiny_filesystem, tmp_path):
    with pytest.raises(OSError, match=r"not enough space for scratch .*tiny.*: the run needs about .* are free"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=4, scratch=str(tiny_filesystem))
    assert os.listdir(tiny_filesystem) == []
    assert not (tmp_path / "out").exists()


def test_scratch_full_midway_says_so_and_cleans_up(client, tiny_filesystem, tmp_path):
    # Long repeated strings: dictionary-encoded in Parquet, so the footers promise a few KiB,
    # but plain strings in Arrow, so scratch takes 4 MB: the estimate passes, the disk fills.
    table = pa.table({"s": ["x" * 100] * 40_000})
    write_parts(table, tmp_path / "src", parts=4)
    with pytest.raises(OSError, match=r"scratch .*tiny.* is full"):
        daskpile.shuffle_parquet(str(tmp_path / "src"), str(tmp_path / "out"), piles=4, scratch=str(tiny_filesystem))
    assert os.listdir(tiny_filesystem) == []
    assert not (tmp_path / "out").exists()


def test_dest_that_is_a_file(source, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        daskpile.shuffle_parquet(source, str(tmp_path / "file"), piles=2)


def test_dest_with_foreign_files_is_refused(source, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds files; pass overwrite=True"):
        daskpile.shuffle_parquet(source, str(tmp_path / "out"), piles=2)
    assert os.listdir(tmp_path / "out") == ["notes.txt"]
