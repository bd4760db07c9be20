"""abfs:// end to end, against Azurite (Microsoft's Azure Storage emulator) on 127.0.0.1, started here.

The same code as for s3://, through fsspec (adlfs): source, dest and scratch on the store,
verified, retried, nothing left behind; the account key never shown; a missing container
refused. Azurite is a Node.js program: make installs it under .venv/tools/azurite where npm
exists, and the tests skip, saying so, where it does not.
"""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _util import shuffle_on_a_store

from daskpile.datasets import write_reference_dataset

adlfs = pytest.importorskip("adlfs")

AZURITE = Path(sys.prefix) / "tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's documented development account: public, like moto's "testing"; still never to be printed.
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    if not AZURITE.exists():
        pytest.skip(f"Azurite is not installed at {AZURITE} (make installs it where npm exists)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    location = tmp_path_factory.mktemp("azurite")
    server = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(location), "--silent",
         "--skipApiVersionCheck"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert server.poll() is None and time.monotonic() < deadline, "Azurite did not start"
            time.sleep(0.1)
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        )
        options = {"connection_string": connection}
        fs = adlfs.AzureBlobFileSystem(**options)
        fs.mkdir("lake")
        yield fs, options
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
def test_abfs_source_dest_and_scratch(azure):
    fs, options = azure
    write_reference_dataset("abfs://lake/events", rows=20_000, files=3, storage_options=options)
    storage = [f"--storage-option=connection_string={options['connection_string']}"]
    for output in shuffle_on_a_store(fs, "abfs", storage):
        assert ACCOUNT_KEY not in output.stdout + output.stderr
