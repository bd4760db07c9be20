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


def test_ctrl_c_while_a_file_is_looked_for_is_not_taken_for_its_absence(tmp_path):
    """fsspec's ``exists`` (the local and memory file systems') catches everything, bare: a Ctrl-C that came as
    an append looked for its window's manifest said "holds no _daskpile.json", and a commit would have removed a
    staged part it did not move.  ``_storage.exists`` lets it through, and daskpile looks for files with it alone."""
    import pathlib
    import re

    import fsspec.implementations.local

    from daskpile._storage import exists

    class Interrupted(fsspec.implementations.local.LocalFileSystem):
        def info(self, path, **kwargs):
            raise KeyboardInterrupt

    (tmp_path / "there").write_bytes(b"")
    fs = fsspec.filesystem("file")
    assert exists(fs, str(tmp_path / "there")) and not exists(fs, str(tmp_path / "not-there"))
    with pytest.raises(KeyboardInterrupt):
        exists(Interrupted(skip_instance_cache=True), str(tmp_path / "there"))
    package = pathlib.Path(__file__).parent.parent / "daskpile"
    direct = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"(?<!os\.path)(?<!type\(fs\))\.exists\(", line)
        and "return fs.exists(path)  # a store's own" not in line
    ]
    assert not direct, direct


def test_an_unexpected_keyword_of_the_code_s_own_is_not_said_as_a_storage_option():
    """Only a name the user gave among the storage options is said as a misspelled one (tests/test_s3.py)."""
    import fsspec

    from daskpile._storage import reaching

    with pytest.raises(TypeError, match="read_dictionry"), reaching(fsspec.filesystem("file"), "/x", "source"):
        raise TypeError("ParquetFile() got an unexpected keyword argument 'read_dictionry'")


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


@pytest.fixture
def http_files(tmp_path):
    """A directory served over HTTP on 127.0.0.1, as presigned URLs reach objects (the query is ignored)."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the server's own log is not daskpile's output
            pass

        def do_GET(self):  # an expired presigned URL: its signature refused
            if "expired" in self.path:
                self.send_error(403)
                return
            super().do_GET()

        do_HEAD = do_GET

    handler = functools.partial(Quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_credentials_in_a_url_are_not_in_the_python_api_s_errors(http_files, tmp_path, sync_scheduler):
    """The command redacted them, but a notebook calling the API printed the password and the signature in
    the error and in the errors it came from (the traceback a notebook shows)."""
    import traceback

    import pyarrow as pa
    import pyarrow.parquet as pq

    import daskpile

    served, base = http_files
    pq.write_table(pa.table({"id": range(10)}), served / "a.parquet")
    secret = base.replace("://", "://bob:hunter2@") + "/gone.parquet?X-Amz-Signature=deadbeef0123"
    daskpile.shuffle_parquet(f"{base}/a.parquet", str(tmp_path / "out"), piles=2)
    expired = secret.replace("gone.parquet", "expired.parquet")
    for call in [
        lambda: daskpile.shuffle_parquet(secret, str(tmp_path / "o2"), piles=2),
        lambda: daskpile.shuffle_parquet(expired, str(tmp_path / "o2"), piles=2),  # aiohttp's error, by its fields
        lambda: daskpile.shuffle_parquet(f"{base}/a.parquet", secret.replace("gone.parquet", "o3"), piles=2),
        lambda: daskpile.verify(secret, str(tmp_path / "out")),
        lambda: daskpile.read_manifest(secret),
        lambda: daskpile.quality(secret, "id"),
        lambda: daskpile.append(secret, str(tmp_path / "window")),
        lambda: daskpile.PileLoader(secret, batch_size=2, seed=1),
    ]:
        with pytest.raises(Exception) as raised:
            call()
        shown = "".join(traceback.format_exception(raised.value)) + every_error_in(raised.value)
        assert "hunter2" not in shown and "deadbeef0123" not in shown, shown
        assert "***" in shown, shown


def every_error_in(error: BaseException) -> str:
    """The messages of an error and of every error it holds as cause or context, shown or not."""
    seen, found, pending = set(), [], [error]
    while pending:
        e = pending.pop()
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            found.append(f"{type(e).__name__}: {e}")
            pending += [e.__cause__, e.__context__]
    return "\n".join(found)


def test_errors_that_print_credentials_from_elsewhere_than_their_arguments_are_redacted():
    """An OSError's message is made of its errno, strerror and file names; an HTTP library's of its fields."""
    import traceback

    from daskpile._storage import RedactedError, redact, redacting_errors

    class ResponseError(Exception):  # as aiohttp's: its message from its fields, whatever its arguments
        def __init__(self, url):
            super().__init__()
            self.url = url

        def __str__(self):
            return f"403, url={self.url!r}"

    url = "http://127.0.0.1:9/a.parquet?X-Amz-Signature=deadbeef0123"

    @redacting_errors
    def full(url):
        raise OSError(28, f"No space left writing {url}")

    @redacting_errors
    def refused(url):
        try:
            raise ResponseError(url)
        except ResponseError as e:
            raise ValueError(f"cannot read {url}") from e

    for call, kind in [(full, OSError), (refused, ValueError)]:
        with pytest.raises(kind) as raised:
            call(url)
        shown = "".join(traceback.format_exception(raised.value)) + every_error_in(raised.value)
        assert "deadbeef0123" not in shown and "X-Amz-Signature=***" in shown, shown
    assert isinstance(raised.value.__cause__, RedactedError) and "ResponseError: 403" in str(raised.value.__cause__)

    @redacting_errors
    def resumable(url):  # what a run adds to an error it can resume after
        error = ResponseError(url)
        error.add_note(f"resumable: run the same call again; its state is in {url} now")
        error.daskpile_state = "/tmp/daskpile-1234"
        raise error

    with pytest.raises(RedactedError) as raised:
        resumable(url)
    assert raised.value.daskpile_state == "/tmp/daskpile-1234"
    assert raised.value.__notes__ == ["resumable: run the same call again; its state is in " + redact(url) + " now"]


def test_an_iteration_s_errors_are_redacted_as_a_call_s():
    """A PileLoader's iteration reads its files as it goes: an expired presigned URL fails there, not when
    the loader is made."""
    from daskpile._storage import redacting_iteration

    def batches():
        yield 1
        raise FileNotFoundError("http://127.0.0.1:9/part-0.parquet?X-Amz-Signature=deadbeef0123")

    iterator = redacting_iteration(batches())
    assert next(iterator) == 1
    with pytest.raises(FileNotFoundError, match=r"X-Amz-Signature=\*\*\*$"):
        next(iterator)
    assert list(redacting_iteration(iter([1, 2]))) == [1, 2]


def test_credentials_in_a_url_are_never_printed_or_recorded(http_files, tmp_path):
    """A presigned URL's signature was stored in the manifest three times; a password before the host was
    echoed in errors.  Both show as *** wherever daskpile prints or records a URL, and a rerun still finds
    its result done."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from _util import daskpile_in_process

    served, base = http_files
    pq.write_table(pa.table({"id": range(1000)}), served / "a.parquet")
    presigned = f"{base}/a.parquet?X-Amz-Credential=AKIDSECRET&X-Amz-Date=1&X-Amz-Signature=deadbeef0123"
    dest = tmp_path / "out"
    for attempt in ["shuffle", "rerun"]:
        run = daskpile_in_process("shuffle", presigned, str(dest), "--piles", "2", "--scheduler", "sync")
        assert run.returncode == 0, run.stderr
        assert ("already done" in run.stdout) == (attempt == "rerun")
        printed = run.stdout + run.stderr + "".join(p.read_text(errors="replace") for p in dest.iterdir())
        assert "AKIDSECRET" not in printed and "deadbeef0123" not in printed
        assert "X-Amz-Signature=***" in (dest / "_daskpile.json").read_text()
    checked = daskpile_in_process("verify", presigned, str(dest), "--scheduler", "sync")
    assert checked.returncode == 0 and "match" in checked.stdout
    for debug in [(), ("--debug",)]:  # the error line, and the traceback with it
        missing = daskpile_in_process(
            "shuffle", base.replace("://", "://bob:hunter2@") + "/gone.parquet", str(tmp_path / "o2"), *debug
        )
        assert missing.returncode == 2 and "bob:***@" in missing.stderr and "hunter2" not in missing.stderr
        assert ("Traceback" in missing.stderr) == bool(debug)


def test_credentials_in_a_url_are_not_in_shuffle_ddf_s_errors_or_warnings(http_files, sync_scheduler):
    """``shuffle(ddf)`` with a scratch URL holding a password: its warning that the scratch could not be removed
    (once the result is dropped, in a thread; and called directly) printed the password and the signature."""
    import traceback
    import warnings

    import dask.dataframe as dd
    import pandas as pd

    import daskpile
    from daskpile.dataframe._expr import _REMOVALS, ScratchRun, _remove_quietly
    from daskpile.engine._scratch import Scratch

    served, base = http_files
    (served / "scratch").mkdir()  # (the server reads the path before the query: the scratch is there)
    secret = base.replace("://", "://bob:hunter2@") + "/scratch?X-Amz-Signature=deadbeef0123"
    ddf = dd.from_pandas(pd.DataFrame({"a": range(10)}), npartitions=2)
    results = [daskpile.shuffle(ddf, piles=2, scratch=secret), daskpile.shuffle(ddf, piles=2, seed=1)]
    for call in [
        lambda: results[0].compute(),  # (an HTTP store cannot be written)
        lambda: results[1].to_parquet(secret),
    ]:
        with pytest.raises(Exception) as raised:
            call()
        shown = "".join(traceback.format_exception(raised.value)) + every_error_in(raised.value)
        assert "hunter2" not in shown and "deadbeef0123" not in shown, shown
    runs = {o for r in results for e in r.expr.walk() for o in e.operands if isinstance(o, ScratchRun)}
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for run in runs:  # what dropping the results does, when the garbage collector gets to them: here, not later
            run._removal()
        for thread in list(_REMOVALS):
            thread.join(30)
        _remove_quietly(Scratch.create(secret, None, 0, make=False))  # there (below), and HTTP removes nothing
    said = " ".join(str(w.message) for w in warned)
    assert len(runs) == 2 and said.count("could not remove its scratch") == 2 and "***" in said, said
    assert "hunter2" not in said and "deadbeef0123" not in said, said
