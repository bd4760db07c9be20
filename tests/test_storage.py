import os

import pytest

from daskpile._storage import atomic_sink, filesystem


def test_atomic_sink_commits_whole_files_and_leaves_nothing_on_failure(tmp_path):
    fs, root = filesystem(str(tmp_path))
    with atomic_sink(fs, f"{root}/done.bin") as sink:
        sink.write(b"x" * 10)
        assert os.listdir(tmp_path) != ["done.bin"]  # under a temporary name until committed
    assert os.listdir(tmp_path) == ["done.bin"] and (tmp_path / "done.bin").read_bytes() == b"x" * 10

    with pytest.raises(RuntimeError, match="writer failed"), atomic_sink(fs, f"{root}/failed.bin") as sink:
        sink.write(b"partial")
        raise RuntimeError("writer failed")
    assert os.listdir(tmp_path) == ["done.bin"]  # neither the file nor its temporary
