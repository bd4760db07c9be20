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


def _write_calls() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("syscw:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts write calls in /proc/self/io (Linux)")
@pytest.mark.parametrize("output_format", ["lines", "jsonl", "csv", "arrow"])
def test_a_pile_is_written_in_pieces_the_kernel_caches_in_small_pages(tmp_path, output_format):
    # One write of more than 2 MiB is cached in 2 MiB pages, which cost ten times more on a VM that reports
    # free memory to its host (write_in_pieces): a pile of 8 MB must take at least 7 writes, whatever its format.
    import pyarrow as pa

    from daskpile._storage import WRITE_BUFFER_BYTES
    from daskpile.engine._outputs import Output, write

    text = pa.array([f"{i:0100d}" for i in range(80_000)])  # 8 MB
    table = pa.table({"line": text}) if output_format != "arrow" else pa.table({"line": text, "n": range(80_000)})
    fs, root = filesystem(str(tmp_path))
    before = _write_calls()
    size = write(table, fs, f"{root}/pile", Output(output_format))
    calls = _write_calls() - before
    assert size > 7 * WRITE_BUFFER_BYTES and calls >= size // WRITE_BUFFER_BYTES
    if output_format == "arrow":
        assert pa.ipc.open_file(str(tmp_path / "pile")).read_all().equals(table)
