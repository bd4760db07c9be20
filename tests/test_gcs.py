"""gs:// end to end, against gcp-storage-emulator (a GCS server in Python) on 127.0.0.1, started here.

The same code as for s3:// and abfs://, through fsspec (gcsfs): source, dest and scratch on
the store, verified, the same rows in the same order as a local run of the same seed,
retried, nothing left behind; a missing bucket refused in one line.

gcsfs asks a bucket's type (zonal, hierarchical) over gRPC, which the emulator does not
speak (each ask would wait 60 s): ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` turns that
off, as anyone pointing gcsfs at an emulator does.
"""

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from _util import daskpile_command, read_output, read_store_output, shuffle_on_a_store

from daskpile.datasets import write_reference_dataset

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported: it decides at import
gcsfs = pytest.importorskip("gcsfs")
EMULATOR = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable))


@pytest.fixture(scope="module")
def gcs():
    if EMULATOR is None:
        pytest.skip("gcp-storage-emulator is not installed (the test extra installs it)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [EMULATOR, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory", "--default-bucket=lake"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert server.poll() is None and time.monotonic() < deadline, "gcp-storage-emulator did not start"
            time.sleep(0.1)
        options = {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon", "project": "test"}
        yield gcsfs.GCSFileSystem(**options), options
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
def test_gs_source_dest_and_scratch(gcs, tmp_path):
    fs, options = gcs
    write_reference_dataset("gs://lake/events", rows=20_000, files=3, storage_options=options)
    shuffle_on_a_store(fs, "gs", [f"--storage-option={k}={v}" for k, v in options.items()])

    # The same rows in the same order as from a local copy of the same files: the store changes nothing.
    fs.get("lake/events", str(tmp_path / "events"), recursive=True)
    local = daskpile_command(
        "shuffle", str(tmp_path / "events"), str(tmp_path / "out"), "--piles=4", "--seed=1", "--scheduler=sync"
    )
    assert local.returncode == 0, local.stderr
    assert read_store_output(fs, "lake/shuffled").equals(read_output(tmp_path / "out"))
