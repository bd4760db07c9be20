"""Every path is an fsspec URL: local directories and object stores alike.

Writes are atomic: on a filesystem a file is written under a temporary name
and renamed into place; on an object store a PUT only becomes visible when it
is complete, so the object is written under its final key.
"""

from __future__ import annotations

import collections.abc
import concurrent.futures
import contextlib
import dataclasses
import functools
import io
import os
import posixpath
import re
import shutil
import socket
import stat
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import BinaryIO

import fsspec
import pyarrow as pa
from fsspec.core import url_to_fs

GLOB_CHARS = "*?["


def filesystem(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem behind ``url`` and the path inside it.

    >>> fs, path = filesystem("/tmp/data")
    >>> path
    '/tmp/data'
    >>> filesystem("s3://AKIA1:hunter2@bucket/data")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: 's3://AKIA1:***@bucket/data': an s3:// URL carries no credentials ... a command's arguments
    """
    # (a string was an AttributeError, deep in)
    if storage_options is not None and not isinstance(storage_options, collections.abc.Mapping):
        raise TypeError(
            f"storage_options must be a dict of the store's options or None, got {type_named(storage_options)}"
        )
    url = str(url)
    check_url(url)
    _require_known_protocol(url)
    refuse_endpoint_credentials(storage_options or {}, url)
    return url_to_fs(url, **(storage_options or {}))


def _require_known_protocol(url: str) -> None:
    """A ValueError naming the URL, where fsspec's says "Protocol not known: s4" only.

    >>> _require_known_protocol("s4://bucket/x")
    Traceback (most recent call last):
    ValueError: 's4://bucket/x': fsspec knows no file system for s4:// (a typo? s3://, gs://, memory://, file://...)
    """
    for part in (_protocol_of(url) or "").split("::"):  # (a chain: simplecache::s3://)
        if part and part not in fsspec.registry and part not in fsspec.available_protocols():  # (registered too)
            raise ValueError(
                f"{redact(url)!r}: fsspec knows no file system for {part}:// (a typo? s3://, gs://, memory://, "
                "file://...)"
            )


def check_url(url: str) -> None:
    """Refuse, before anything reaches the store, a URL with credentials in it, or one of a store whose package
    is not installed."""
    refuse_credentials(url)
    require_store_package(url)


def refuse_credentials(url: str) -> None:
    """A ValueError, the password redacted, for an object store's URL with ``user:password@`` in it.

    >>> refuse_credentials("s3://bucket/data")
    """
    userinfo = _STORE_USERINFO.match(url)
    if userinfo:
        raise ValueError(
            f"{redact(url)!r}: an {userinfo['protocol']}:// URL carries no credentials (its store reads "
            "user:password@ as part of the bucket's name, and printed it in errors): give them in the environment "
            "or the store's credentials files (for s3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "--storage-option profile=...), which other users cannot read as they can a command's arguments"
        )


def require_store_package(url: str) -> None:
    """An ImportError naming daskpile's extra for a URL whose store's fsspec package is not installed (fsspec
    names the package alone: "Install s3fs to access S3"), so that the right version comes with it.

    >>> require_store_package("memory://x"), require_store_package("/local/path")
    (None, None)
    """
    protocol = _protocol_of(url)
    extra = _STORE_EXTRAS.get(protocol)
    if extra is None:
        return
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise ImportError(
            f"{protocol}:// URLs need daskpile's {extra} extra: pip install 'daskpile[{extra}]' ({e})"
        ) from None


def _protocol_of(url: str) -> str | None:
    return url.split("://", 1)[0].lower() if "://" in url else None


# The object stores' protocols, and daskpile's extra that installs each one's package
_STORE_EXTRAS = {
    "s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs",
    "abfs": "azure", "abfss": "azure", "az": "azure", "adl": "azure",
}  # fmt: skip


def endpoints_given(storage_options: dict, url: str | None = None) -> list[tuple[str, object]]:
    """(where, value) of each endpoint URL given for the store of ``url``: the storage options', else, for an
    s3:// ``url``, the environment's, which botocore reads (``AWS_ENDPOINT_URL_S3`` before ``AWS_ENDPOINT_URL``).

    >>> endpoints_given({"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}})
    [('storage option endpoint_url', None), ('storage option client_kwargs.endpoint_url', 'http://127.0.0.1:9000')]
    """
    client = storage_options.get("client_kwargs")
    found = [("storage option endpoint_url", storage_options.get("endpoint_url"))]
    found += (
        [("storage option client_kwargs.endpoint_url", client.get("endpoint_url"))]
        if isinstance(client, collections.abc.Mapping)
        else []
    )
    if all(value is None for _, value in found) and _protocol_of(url or "") in ("s3", "s3a"):
        # (a Kubernetes Secret's AWS_ENDPOINT_URL: a platform trial)
        name = next((n for n in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(n)), None)
        found = [(f"${name}", os.environ[name])] if name else []
    return found


def refuse_endpoint_credentials(storage_options: dict, url: str | None = None) -> None:
    """A ValueError, naming the option and not its value, for an endpoint URL with ``user:password@`` in it,
    which the store's HTTP client refuses mid-request (aiohttp: "Cannot combine AUTHORIZATION header ...");
    for an s3:// ``url`` without one in the options, the environment's (``AWS_ENDPOINT_URL``).

    >>> refuse_endpoint_credentials({"client_kwargs": {"endpoint_url": "http://k:s@127.0.0.1:9000"}})
    Traceback (most recent call last):
    ValueError: storage option client_kwargs.endpoint_url carries credentials (user:password@): give them in the \
environment or the store's credentials files (for s3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), not in a URL
    """
    found = endpoints_given(storage_options, url)
    for name, value in found:
        if isinstance(value, str) and _USERINFO.match(value):
            raise ValueError(
                f"{name} carries credentials (user:password@): give them in the environment or "
                "the store's credentials files (for s3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), not in a URL"
            )


_USERINFO = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s]*@", re.IGNORECASE)
# user:password@ in the URL of an object store, whose libraries take it for part of a bucket's name
_STORE_USERINFO = re.compile(rf"(?P<protocol>{'|'.join(_STORE_EXTRAS)})://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


def as_urls(source, role: str = "source"):
    """A URL, or a list of them, with path-like objects (``pathlib.Path``) as their strings; anything else
    (a DataFrame given where its files are meant) is a TypeError naming ``role``.

    >>> import pathlib
    >>> as_urls(pathlib.Path("/data/x")), as_urls(["a", pathlib.Path("b")]), as_urls(None)
    ('/data/x', ['a', 'b'], None)
    >>> as_urls(3, role="dest")
    Traceback (most recent call last):
    TypeError: dest must be a path or URL (a str or pathlib.Path) or a list of them, got int
    >>> as_urls("", role="path")  # (os.environ.get("DATA", ""): it named the working directory)
    Traceback (most recent call last):
    ValueError: path is empty (''): give a directory, a file, a glob or a URL
    """
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if isinstance(source, (list, tuple)):
        return [as_urls(item, role) for item in source]
    if isinstance(source, str) and not source.strip():
        raise ValueError(f"{role} is empty ({source!r}): give a directory, a file, a glob or a URL")
    if source is None or isinstance(source, str):
        return source
    raise TypeError(
        f"{role} must be a path or URL (a str or pathlib.Path) or a list of them, got {type_named(source)}"
        + (" (a DataFrame: daskpile.shuffle shuffles a dask one; this takes the files it was read from or written "
           "to)" if hasattr(source, "columns") else "")
    )  # fmt: skip


def type_named(value) -> str:
    """What ``value`` is, for messages: its library too, as a pandas and a Polars DataFrame are both "DataFrame".

    >>> import fractions
    >>> type_named(3), type_named(fractions.Fraction(1, 3))
    ('int', 'a fractions Fraction')
    """
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"a {kind.__module__.split('.')[0]} {kind.__name__}"


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return not _protocols(fs).isdisjoint(("file", "local"))


def is_memory(fs: fsspec.AbstractFileSystem) -> bool:
    """fsspec's memory file system: one of each process, which workers in other processes do not see."""
    return "memory" in _protocols(fs)


def _protocols(fs: fsspec.AbstractFileSystem) -> set[str]:
    return set(fs.protocol) if isinstance(fs.protocol, tuple) else {fs.protocol}


# A URL may carry its own credentials: a password before the host, or a signature or token in the query (a
# presigned S3 or GCS URL, an Azure SAS, a ?token= or ?api_key= of a file server).  What daskpile records
# and its command prints shows them as "***".  Only parameters that are credentials, never ones that could
# pick the file (key=, code=): the URL so shown is a run's identity, and two files must not share it.
REDACTED = "***"
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]*:)[^/\s@'\"]+(?=@)")
_URL_SECRET = re.compile(
    r"(?P<head>[?&](?:x-amz-signature|x-amz-credential|awsaccesskeyid|signature|x-goog-signature|"
    r"x-goog-credential|googleaccessid|sig|(?:x-amz-security|security|session|access|id|auth|api|bearer|"
    r"refresh)?[_-]?token|auth|authorization|(?:x-)?api[_-]?key|access[_-]?key|secret[_-]?key|"
    r"private[_-]?key|subscription-key|client[_-]?secret|password|passwd|secret)=)[^&#\s'\"`]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the credentials of the URLs in it shown as ``***``: what daskpile prints and records.

    >>> redact("http://bob:hunter2@host/a.parquet?X-Amz-Credential=AK%2F1&X-Amz-Date=1&X-Amz-Signature=f00d")
    'http://bob:***@host/a.parquet?X-Amz-Credential=***&X-Amz-Date=1&X-Amz-Signature=***'
    >>> redact("s3://bucket/key=3/a.parquet"), redact("https://acct.blob.core.windows.net/c/a?sv=1&sig=abc%3D")
    ('s3://bucket/key=3/a.parquet', 'https://acct.blob.core.windows.net/c/a?sv=1&sig=***')
    >>> redact("https://api.example.com/get?key=day-1.parquet&code=7")  # parameters that may pick the file stay
    'https://api.example.com/get?key=day-1.parquet&code=7'
    >>> redact("https://h/a.parquet?token=T0K&api_key=K3Y&X-Amz-Security-Token=S&auth=A&page=2")
    'https://h/a.parquet?token=***&api_key=***&X-Amz-Security-Token=***&auth=***&page=2'
    """
    return _URL_SECRET.sub(rf"\g<head>{REDACTED}", _URL_PASSWORD.sub(rf"\g<head>{REDACTED}", text))


def urls_said(source) -> str:
    """A source (or dest) as a progress line names it: a URL (redacted), or the first of a list and how many more.

    >>> urls_said("s3://b/lake/"), urls_said(["a.parquet", "b.parquet", "c.parquet"])
    ("'s3://b/lake/'", "'a.parquet' and 2 more")
    """
    urls = as_urls(source)
    if isinstance(urls, str):
        return repr(redact(urls))
    return f"{redact(urls[0])!r} and {len(urls) - 1:,} more" if urls else "no source"


def redacting_errors(function):
    """``function``, the messages of its errors (and of the errors they came from) with the credentials of
    their URLs shown as ``***``, as ``redact`` shows them: a notebook prints the whole chain.

    >>> @redacting_errors
    ... def read(url):
    ...     raise ValueError(f"cannot read {url!r}")
    >>> read("http://bob:hunter2@host/a.parquet")
    Traceback (most recent call last):
    ValueError: cannot read 'http://bob:***@host/a.parquet'
    """

    @functools.wraps(function)
    def redacting(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as e:
            clean, traceback = redacted(e), e.__traceback__
            if clean is e:
                raise
        # raised out of the except block, where Python would make the error it replaces its context
        raise clean.with_traceback(traceback)

    return redacting


def redacting_iteration(iterator: Iterator) -> Iterator:
    """``iterator``'s items, its errors redacted as ``redacting_errors`` redacts a function's."""
    try:
        yield from iterator
        return
    except Exception as e:
        clean, traceback = redacted(e), e.__traceback__
        if clean is e:
            raise
    raise clean.with_traceback(traceback)


class RedactedError(RuntimeError):
    """An error whose message held credentials that its own type would print whatever its arguments
    (an HTTP library's, built from the URL it was given): its type's name and its message, redacted."""


def redacted(error: BaseException, seen: dict | None = None) -> BaseException:
    """``error`` with the credentials in its message, and in those of the errors it came from, as ``***``: the
    same error, its arguments redacted, or where its type prints them from elsewhere a ``RedactedError``."""
    seen = {} if seen is None else seen
    if id(error) in seen:
        return seen[id(error)]
    seen[id(error)] = error
    error.args = tuple(redact(a) if isinstance(a, str) else a for a in error.args)
    for name in ("strerror", "filename", "filename2"):  # an OSError's message is made of these
        if isinstance(getattr(error, name, None), str):
            setattr(error, name, redact(getattr(error, name)))
    clean = error
    try:
        text = str(error)
    except Exception:  # a type whose message cannot be made at all
        text = ""
    if redact(text) != text:
        clean = seen[id(error)] = RedactedError(f"{type(error).__name__}: {redact(text)}")
        if hasattr(error, "daskpile_state"):  # where a resumable run's state is, for the command's line
            clean.daskpile_state = error.daskpile_state
    if getattr(error, "__notes__", None):  # ("resumable: run the same call again; its state is in ...")
        clean.__notes__ = [redact(note) if isinstance(note, str) else note for note in error.__notes__]
    cause, context = error.__cause__, error.__context__
    clean.__cause__ = None if cause is None else redacted(cause, seen)
    clean.__context__ = None if context is None else redacted(context, seen)
    clean.__suppress_context__ = error.__suppress_context__
    return clean


def full_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A URL that names ``path`` again with its protocol (for messages and manifests)."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


# Writes smaller than this are gathered into one system call; larger ones go straight through.
# Measured on one scratch file of dataset A at 512 piles (250 k rows in batches of about 490): 40 ms
# unbuffered, 26 ms buffered.  It is also the most a write of ours hands the kernel at once (``write_in_pieces``).
WRITE_BUFFER_BYTES = 2**20


def write_in_pieces(sink, data: pa.Buffer) -> None:
    """Write ``data`` to ``sink`` in pieces of at most ``WRITE_BUFFER_BYTES``.

    A single write of more than 2 MiB lets Linux cache the file in 2 MiB
    pages (ext4's large folios), taken from the free blocks that a VM's
    balloon device reports to its host (free page reporting): the host must
    hand each of them back, page by page.  On this project's VM a GiB written
    in writes of 8 MiB cost 2.4-2.8 s of system CPU, in writes of 1 MiB
    0.23-0.25 s (``benchmarks/fresh_memory.py --write-kib 1024 8192``); a
    5 M-line file shuffled lines to lines went from 2.3-2.8 to 1.0-1.4 s of
    system CPU.  A piece of exactly the buffer's size passes through
    ``atomic_sink``'s buffer uncopied.

    >>> sink = pa.BufferOutputStream()
    >>> write_in_pieces(sink, pa.py_buffer(b"x" * (3 * WRITE_BUFFER_BYTES + 5)))
    >>> sink.getvalue().size == 3 * WRITE_BUFFER_BYTES + 5
    True
    """
    for start in range(0, data.size, WRITE_BUFFER_BYTES):
        sink.write(data.slice(start, min(WRITE_BUFFER_BYTES, data.size - start)))


def rows_per_write(table: pa.Table | pa.RecordBatch) -> int:
    """Rows of ``table`` (or of a record batch, or a slice of one) whose buffers each hold about
    ``WRITE_BUFFER_BYTES`` at most, by its widest column's average row: a record batch of an IPC file is
    written a buffer a write (``write_in_pieces`` says why that matters).

    >>> rows_per_write(pa.table({"x": pa.array(range(2**20), pa.int64())}))
    131072
    """
    widest = max((column.nbytes for column in table.columns), default=0)
    return max(1, WRITE_BUFFER_BYTES * table.num_rows // max(widest, 1))


TEMPORARY_SUFFIX = ".tmp"


def is_temporary(name: str) -> bool:
    """Whether ``name`` is what ``atomic_sink`` writes under before committing (left behind by a kill -9).

    >>> is_temporary(".part-00003.parquet.5f0c.tmp"), is_temporary("part-00003.parquet")
    (True, False)
    """
    return name.startswith(".") and name.endswith(TEMPORARY_SUFFIX)


@contextlib.contextmanager
def atomic_sink(
    fs: fsspec.AbstractFileSystem, path: str, make_parents: bool = True
) -> Iterator[pa.NativeFile | BinaryIO]:
    """Somewhere to write ``path`` so that readers see either nothing or the whole file.

    Yields what pyarrow writers accept: a native Arrow file for local paths
    (written without the GIL) or an fsspec file object.  Without
    ``make_parents`` a missing directory is an error, so a task still running
    after its run was cleaned up cannot bring the directory back.
    """
    if not is_local(fs):
        with fs.open(path, "wb") as f:
            yield f
        return
    directory, name = posixpath.split(path)
    if make_parents:
        fs.makedirs(directory, exist_ok=True)
    tmp = posixpath.join(directory, f".{name}.{uuid.uuid4().hex}{TEMPORARY_SUFFIX}")
    try:
        # Our own native file, closed here even when a writer fails mid-way
        # (a writer left to close a file it opened keeps it open after ENOSPC).
        # Buffered: an IPC writer makes a write call per buffer of every batch.
        with pa.OSFile(tmp, "wb") as raw, pa.BufferedOutputStream(raw, WRITE_BUFFER_BYTES) as sink:
            yield sink
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_bytes(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write a small file atomically."""
    with atomic_sink(fs, path) as sink:
        sink.write(data)


# A storage endpoint that cannot be reached or signed into: the command cannot run as asked, like a missing
# file.  These come from the storage libraries (botocore, aiohttp), which the core does not import.  Out of
# reach (the network, the endpoint down, its name not yet in DNS as a pod starts) a later try may mend;
# credentials missing or an endpoint misspelled it does not.
_STORE_OUT_OF_REACH = {
    "EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ServerTimeoutError",
    "ReadTimeoutError", "ConnectionClosedError", "ServerDisconnectedError",  # (mid-run: a retry resumes)
}  # fmt: skip
# An endpoint_url no client can use, or a certificate refused
_STORE_MISCONFIGURED = {
    "InvalidEndpointError", "EndpointResolutionError", "ClientConnectorCertificateError", "SSLCertVerificationError",
}  # fmt: skip
# A TLS handshake with what speaks no TLS: https:// to an http endpoint ("SSL validation failed ...
# WRONG_VERSION_NUMBER"), taken for out of reach and retried for an hour (exit 75).  Other TLS errors (an alert,
# an EOF mid-handshake: a load balancer's) may pass, and stay out of reach.
_NOT_TLS_SPOKEN = ("WRONG_VERSION_NUMBER", "record layer failure", "packet length too long", "http request")
_STORE_UNUSABLE = _STORE_OUT_OF_REACH | _STORE_MISCONFIGURED | {
    "NoCredentialsError", "PartialCredentialsError", "ProfileNotFound",  # (AWS_PROFILE or profile= misspelled)
}  # fmt: skip


class StoreUnreachable(ConnectionError):
    """The store behind a path cannot be reached or signed into: the command cannot run as asked."""


def store_unusable(e: BaseException) -> bool:
    """Whether ``e`` says the store cannot be reached or signed into at all (not: this object is refused)."""
    return _named(e, _STORE_UNUSABLE) or _misconfigured(e)


def _misconfigured(e: BaseException) -> bool:
    """Whether ``e`` says the endpoint given cannot be used (no later try mends it).

    >>> import ssl
    >>> _misconfigured(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")), _misconfigured(
    ...     ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))
    (True, False)
    """
    tls = _named(e, {"SSLError", "ClientSSLError", "ClientConnectorSSLError"})
    return _named(e, _STORE_MISCONFIGURED) or (tls and any(said in str(e) for said in _NOT_TLS_SPOKEN))


def store_out_of_reach(e: BaseException) -> bool:
    """Whether ``e`` says the store could not be reached this time (a later try may reach it)."""
    return _named(e, _STORE_OUT_OF_REACH) and not _misconfigured(e)


def _named(e: BaseException, names: set[str]) -> bool:
    """Whether ``e``'s class, or one it derives from, is one of ``names`` (of libraries the core does not import)."""
    return any(c.__name__ in names for c in type(e).__mro__)


@contextlib.contextmanager
def reaching(fs: fsspec.AbstractFileSystem, path: str, role: str) -> Iterator[None]:
    """Requests to the store of ``path``; one that cannot reach or sign into the store, or that the store
    refuses (its own words, "Forbidden", name no URL), is said naming ``role``."""
    try:
        yield
    except PermissionError as e:
        if str(e).startswith(f"{role} "):  # (said so by a block within)
            raise
        raise PermissionError(f"{role} {full_url(fs, path)!r}: access denied: {e}") from None
    except TypeError as e:
        # A storage option misspelled reaches the store's client only as it connects: "AioSession.__init__() got
        # an unexpected keyword argument 'endpoint_urll'", naming neither the option nor the path
        wrong = re.search(r"unexpected keyword argument '([^']+)'", str(e))
        if wrong is None or wrong[1] not in _option_names(getattr(fs, "storage_options", {})):
            raise  # (not one of the user's options: a call of the code's own)
        raise ValueError(
            f"{role} {full_url(fs, path)!r}: the storage option {wrong[1]!r} is not one that "
            f"{type(fs).__name__} or its client takes (misspelled? {e})"
        ) from None
    except Exception as e:
        if store_unusable(e):
            what = (
                "reach" if store_out_of_reach(e) else "use the endpoint given for" if _misconfigured(e) else "sign into"
            )
            unresolved = _unresolved_endpoint(fs) if what == "reach" else ""
            raise StoreUnreachable(f"{role} {full_url(fs, path)!r}: cannot {what} the store: {e}{unresolved}") from e
        if isinstance(e, ValueError) and str(e).startswith("Invalid endpoint"):  # (botocore's, naming no option)
            url = full_url(fs, path)
            given = [where for where, value in endpoints_given(getattr(fs, "storage_options", {}) or {}, url) if value]
            where = given[0] if given else "the endpoint URL"  # ($AWS_ENDPOINT_URL, not an option, in a platform trial)
            # (not botocore's words, which quote the value: a scheme-less user:password@ is no URL, so no
            # credentials check saw it)
            raise ValueError(
                f"{role} {url!r}: {where} is not a URL: give it as http://host:port or https://host"
            ) from None
        raise


def _unresolved_endpoint(fs: fsspec.AbstractFileSystem) -> str:
    """Said after "cannot reach the store" when the endpoint's host name resolves to nothing (a misspelt name, or
    a service not made yet), which the store's client says as it says a server down."""
    options = getattr(fs, "storage_options", {}) or {}
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    host = urllib.parse.urlsplit(endpoint).hostname if isinstance(endpoint, str) else None
    if not host:
        return ""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        return f" (the endpoint's host name {host!r} resolves to no address: {e.strerror}; misspelled?)"
    except OSError:
        pass
    return ""


def _option_names(options: dict) -> set[str]:
    """The names in storage options, nested ones (``client_kwargs``) included."""
    return {
        name
        for key, value in options.items()
        for name in (key, *(_option_names(value) if isinstance(value, dict) else ()))
    }


class ScratchNotPrivateError(ValueError):
    """A scratch directory found that another user owns or may write to: not used."""


def make_private_directory(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """``path`` made a directory, or found as one (``check_private_directory``); its parents are made as usual.

    Under a local folder every user may write to (the temporary directory, the default scratch root), it is
    made 0700: scratch holds a copy of the rows there, in a folder named after dest, which any user can
    work out, so another user could otherwise read the rows, or make the folder first and put rows of theirs
    in a run resumed from it, with fingerprints to match.  Elsewhere (a folder of the user's, a team's, an
    object store) it is made as the umask says, as the root's owner chose.

    >>> import tempfile; base = tempfile.mkdtemp(); os.chmod(base, 0o1777)
    >>> make_private_directory(filesystem(base)[0], base + "/daskpile-1")
    >>> oct(os.stat(base + "/daskpile-1").st_mode & 0o777)
    '0o700'
    """
    if not is_local(fs):
        fs.makedirs(path, exist_ok=True)
        return
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, 0o700 if _writable_by_others(posixpath.dirname(path)) else 0o777)  # (0o777: as the umask says)
    except FileExistsError:
        check_private_directory(fs, path)


def check_private_directory(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Refuse a local scratch directory at ``path``, under a folder every user may write to, that is a link, or
    that another user owns or every user may write to (anything in it may be theirs); one of this user's that
    others may read is made 0700 where the file system allows (a run interrupted before scratch was private).
    Nothing to check where there is none, under a folder only its owners may write to, or on an object store.
    """
    if not is_local(fs) or not _writable_by_others(posixpath.dirname(path)):
        return
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    why = (
        "is a link or not a folder"
        if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode)
        else f"belongs to another user (uid {found.st_uid})"
        if found.st_uid != os.geteuid()
        else f"may be written by every user (mode {stat.S_IMODE(found.st_mode):o})"
        if found.st_mode & 0o002
        else None
    )
    if why is not None:
        raise ScratchNotPrivateError(
            f"scratch {path!r} {why}: it is not used, since what it holds may not be this run's; remove it "
            "(as its owner), or pass --scratch (scratch=) a folder of your own"
        )
    if found.st_mode & 0o077:
        with contextlib.suppress(OSError):  # (a file system without modes: vfat, some network mounts)
            os.chmod(path, 0o700)


def _writable_by_others(folder: str) -> bool:
    try:
        return bool(os.stat(folder).st_mode & 0o002)
    except OSError:
        return False


def check_writable(fs: fsspec.AbstractFileSystem, path: str, role: str) -> None:
    """Fail early, naming ``path``, if a local ``path`` could not be created or written.

    On an object store, the bucket (or container) must exist: creating one is
    the user's decision (where, who pays, who may read), never a side effect.
    Permissions are not probed there: the store says no at the first write.
    """
    if not is_local(fs):
        bucket = fs._strip_protocol(path).split("/", 1)[0]
        try:
            with reaching(fs, path, role):
                fs.info(bucket)
                # An object at the very key: written under, it would read as a folder holding itself, and a
                # later read of its folder would lose it
                is_object = path.rstrip("/") != bucket and fs.isfile(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{role} {full_url(fs, path)!r}: bucket {bucket!r} does not exist") from None
        except StoreUnreachable:  # said now: every later request would wait out the library's retries again
            raise
        except Exception:  # (``exists`` says False to these too) access scoped to a prefix: let the writes say
            return
        if is_object:
            raise NotADirectoryError(f"{role} {full_url(fs, path)!r} is a file (an object), not a folder")
        return
    existing = _existing_ancestor(path)
    if os.path.exists(existing) and not os.path.isdir(existing):
        raise NotADirectoryError(f"{role} {path!r}: {existing!r} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"no permission to write {role} {path!r}: {existing!r} is not writable")


def free_space(fs: fsspec.AbstractFileSystem, path: str) -> tuple[int, int] | None:
    """(free bytes, device) where a local ``path`` is or would be created; None for object stores."""
    if not is_local(fs):
        return None
    existing = _existing_ancestor(path)
    return shutil.disk_usage(existing).free, os.stat(existing).st_dev


def _existing_ancestor(path: str) -> str:
    existing = path
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    return existing


def exists(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """Whether ``path`` is there: ``fs.exists``, but Ctrl-C goes through.

    fsspec's own ``exists`` (which the local and memory file systems use)
    catches every exception, bare, and answers False: a Ctrl-C that came as
    it looked was lost, and the command went on as if the file were not
    there (an append said its window held no manifest; a commit would have
    removed a staged part it did not move).  Any other error still reads as
    absent, as fsspec has it.

    >>> import fsspec
    >>> exists(fsspec.filesystem("memory"), "/nothing/here")
    False
    """
    if getattr(fs.exists, "__func__", None) is not fsspec.AbstractFileSystem.exists:
        return fs.exists(path)  # a store's own (s3fs, gcsfs): its answer
    try:
        fs.info(path)
    except Exception:
        return False
    return True


def remove_tree(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Remove a directory tree, ignoring one that is already gone."""
    with contextlib.suppress(FileNotFoundError):
        if exists(fs, path):
            fs.rm(path, recursive=True)


# What changes when a file is written again, alike in a listing and in the details of a file opened: GCS's
# generation (its mtime, "updated", changes with the object's metadata too), S3's ETag, Azure's etag, a local
# file's mtime (S3's LastModified is not: a listing and a HEAD give it at other precisions)
_VERSION_KEYS = ("generation", "ETag", "etag", "mtime")


class FileChangedError(ValueError):
    """A file read is not the version listed before: written again since, under the same name."""


class StoresApartError(ValueError):
    """The workers find a file otherwise than this process does (another store behind one URL, another disk
    behind one path): no later try mends that, whatever other errors it caused."""


@dataclasses.dataclass(frozen=True)
class FileVersion:
    """A file's size and version (``_VERSION_KEYS``), as listed or as opened: a file written again under the
    same name, even as large, is another version.

    >>> FileVersion.of({"size": 5, "mtime": 1.5}).same_as(FileVersion.of({"size": 5, "mtime": 2.5}))
    False
    >>> FileVersion.of({"size": 5, "ETag": '"a"'}).same_as(FileVersion.of({"size": 5}))  # unknown: not refused
    True
    """

    size: int | None
    version: str | None
    etag: str | None = None  # S3's, as listed: reads of the file may require it (``open_read``)

    @classmethod
    def of(cls, info: dict) -> FileVersion:
        """From ``fs.info``, a listing's entry, or an opened file's details."""
        version = next((repr(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), None)
        etag = info.get("ETag")
        return cls(info.get("size"), version, etag if isinstance(etag, str) else None)

    @classmethod
    def listed(cls, fs: fsspec.AbstractFileSystem, info: dict) -> FileVersion:
        """Of a file as a listing gave it (``info``); a local link's from ``os.stat``, of what it points to, as it
        is read (fsspec lists a link's own mtime, and its target's size).  Not every file's: a second look at
        each was a tenth of planning 30,000 files."""
        return cls.local(info["name"]) if is_local(fs) and info.get("islink") else cls.of(info)

    @classmethod
    def local(cls, path: str) -> FileVersion:
        """Of the local file ``path`` names now (``os.stat``, as fsspec's listing of it)."""
        found = os.stat(path)
        return cls.of({"size": found.st_size, "mtime": found.st_mtime})

    @classmethod
    def opened(cls, handle) -> FileVersion:
        """Of the file an fsspec file object reads: from the details it was opened with (which s3fs reads with
        If-Match, refusing an object written again since)."""
        return cls.of(getattr(handle, "details", None) or {})

    def same_as(self, other: FileVersion) -> bool:
        """Whether both are of one version of a file, as far as both tell."""
        pairs = ((self.size, other.size), (self.version, other.version))
        return all(a is None or b is None or a == b for a, b in pairs)

    def require(self, found: FileVersion, url: str) -> None:
        """FileChangedError unless ``found``, of the file at ``url`` now, is this version of it."""
        if not self.same_as(found):
            raise FileChangedError(f"{url!r} {self._change_to(found)} since it was listed")

    def _change_to(self, found: FileVersion) -> str:
        """How the file changed, for its message: a file cut short (a copy stopped, a disk full) is said so, not
        taken for one written again."""
        if self.size is not None and found.size is not None and found.size < self.size:
            return f"was cut short or written again ({found.size:,} bytes, {self.size:,} when listed)"
        return "was written again"


def open_read(fs: fsspec.AbstractFileSystem, path: str, known: FileVersion | None = None, **options):
    """``fs.open(path, "rb", **options)``, of a file whose size (and ETag) a listing or its writer gave.

    On S3 without looking the file up again: s3fs sends a HEAD before the first read of a file it opens, for
    its size and ETag, which were half the requests of pass 1 over a lake of small files (2,000 objects of
    1 KB on moto: 2,000 HEADs beside 2,002 GETs) and a quarter of pass 2's over scratch on S3.  Given the
    listed ETag, every read requires it (If-Match, s3fs' ``FileExpired`` if the object is no longer the
    version listed), where s3fs' own HEAD only guarded against a change after the file was opened.  Other
    stores, a version-aware s3fs, or a size or ETag unknown: ``fs.open`` as it is.
    """
    if known is None or None in (known.size, known.etag) or not _is_s3fs(fs) or getattr(fs, "version_aware", False):
        return fs.open(path, "rb", **options)
    handle = fs.open(path, "rb", size=known.size, **options)
    # (AbstractBufferedFile's ``details``: s3fs reads it before each GET, and looks it up if not set)
    handle.details = {"name": path, "size": known.size, "type": "file", "ETag": known.etag}
    if not getattr(fs, "local_expiry_check", False):  # (set for stores refusing If-Match: s3fs compares itself)
        handle.read_kw = {**getattr(handle, "read_kw", {}), "IfMatch": known.etag}  # (as s3fs after its HEAD)
    return handle


class EndFetchedFirst(io.RawIOBase):
    """A remote file (an fsspec file object, its size known) whose last ``nbytes`` are fetched in one request
    as it is opened, the rest read through it: Arrow reads an IPC file's footer in two reads at its end (the
    footer's length, then the footer), each a request on an object store, and a small file is all end.

    >>> fs = fsspec.filesystem("memory")
    >>> fs.pipe("/doc/end-fetched", b"0123456789")
    >>> f = EndFetchedFirst(fs.open("/doc/end-fetched", "rb"), 4)
    >>> f.end, f.read(3), f.seek(-3, io.SEEK_END), f.read(), f.read()
    (b'6789', b'012', 7, b'789', b'')
    >>> fs.rm("/doc/end-fetched")
    """

    handle = None

    def __init__(self, handle, nbytes: int):
        super().__init__()
        self.handle, self.size = handle, handle.size
        self.end_start = max(self.size - nbytes, 0)
        handle.seek(self.end_start)
        self.end = handle.read(self.size - self.end_start)
        self.position = 0

    def forget_end(self) -> None:
        """Let go of the end fetched (a footer read already), unless it is the whole file: a reader holds every
        file of a band open, on an object store thousands."""
        if self.end_start:
            self.end_start, self.end = self.size, b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(base + offset, 0)
        return self.position

    def read(self, size: int = -1) -> bytes:
        stop = self.size if size is None or size < 0 else min(self.position + size, self.size)
        start, self.position = self.position, max(stop, self.position)
        if start >= stop:
            return b""
        if start >= self.end_start:
            return self.end[start - self.end_start : stop - self.end_start]
        self.handle.seek(start)
        return self.handle.read(stop - start)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        super().close()


def uncached(fs: fsspec.AbstractFileSystem) -> dict:
    """``fs.open`` options for a file read by ranges its reader chooses (Arrow's, coalesced with ``pre_buffer``;
    a range of lines): fsspec's read-ahead cache fetched a block beyond each (s3fs' of 50 MiB: a loader reading a
    column of 170 KiB fetched 19 MiB of a pile of 40; a range of 1 MB of a text file, the 19 MB to its end).
    Not over HTTP, where a server may not serve ranges, which its cache of 5 MiB blocks hid from small files."""
    return {} if _protocols(fs) & {"http", "https"} else {"cache_type": "none"}


def _is_s3fs(fs: fsspec.AbstractFileSystem) -> bool:
    return type(fs).__module__.partition(".")[0] == "s3fs"


def file_stamp(info: dict) -> str:
    """Size and modification stamp (mtime, ETag or generation) of a file, from ``fs.info``."""
    version = next(
        (info[k] for k in ("mtime", "LastModified", "ETag", "etag", "generation", "last_modified") if k in info), ""
    )
    return f"{info.get('size')}:{version}"


def file_stamps(infos: list[dict]) -> list[str]:
    """:func:`file_stamp` of each file."""
    return [file_stamp(info) for info in infos]


def stamp_size(stamp: str | None) -> int | None:
    """The size a :func:`file_stamp` records; None where the filesystem gave none.

    >>> stamp_size("1024:1795666202.1"), stamp_size("None:abc"), stamp_size(None)
    (1024, None, None)
    """
    size = (stamp or "").split(":")[0]
    return int(size) if size.isdigit() else None


# Folders listed, or files looked at, at once on an object store (a lake of thousands of key=value folders)
LISTING_THREADS = 16


def listed_infos(fs, paths: list[str]) -> list[dict | None]:
    """``fs.info`` of each file as it is now, from one listing of each directory (None for a file not there)."""

    def listing(directory: str) -> list[dict]:
        fs.invalidate_cache(directory)
        try:
            return fs.ls(directory, detail=True)
        except FileNotFoundError:  # a folder gone, with its files (an object store says so of an empty prefix)
            return []

    directories = list(dict.fromkeys(posixpath.dirname(p) for p in paths))
    with concurrent.futures.ThreadPoolExecutor(min(LISTING_THREADS, max(len(directories), 1))) as pool:
        listings = list(pool.map(listing, directories))
    infos = {}
    for directory, listed in zip(directories, listings, strict=True):
        for info in listed:
            infos[directory, posixpath.basename(info["name"].rstrip("/"))] = info
    return [infos.get((posixpath.dirname(p), posixpath.basename(p))) for p in paths]


def versions_now(fs, paths: list[str]) -> list[FileVersion | None]:
    """The version of each file as it is now (``FileVersion.listed``), None for one not there: local files'
    from ``os.stat``; others' from one listing of each folder, or from the file's own details where the listing
    lacks it or cannot be made (an HTTP server's, a bucket one may read but not list)."""
    if is_local(fs):
        return [_version_now(fs, path) for path in paths]
    try:
        infos = listed_infos(fs, paths)
    except (OSError, NotImplementedError, ValueError):
        infos = [None] * len(paths)
    missing = [path for path, info in zip(paths, infos, strict=True) if info is None]
    with concurrent.futures.ThreadPoolExecutor(min(LISTING_THREADS, max(len(missing), 1))) as pool:
        looked_at = dict(zip(missing, pool.map(functools.partial(_version_now, fs), missing), strict=True))
    return [looked_at[p] if info is None else FileVersion.of(info) for p, info in zip(paths, infos, strict=True)]


def _version_now(fs, path: str) -> FileVersion | None:
    try:
        if is_local(fs):
            return FileVersion.local(path)
        fs.invalidate_cache(path)
        return FileVersion.of(fs.info(path))
    except FileNotFoundError:
        return None
