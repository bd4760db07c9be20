"""The ``daskpile`` command: a thin layer over the Python API.

    daskpile shuffle s3://lake/table/ s3://lake/shuffled/ --piles auto
    daskpile verify s3://lake/table/ s3://lake/shuffled/
    daskpile quality s3://lake/shuffled/ --order-column id --label-column label --plot quality.png
    daskpile append s3://lake/day-2026-11-23/ s3://lake/shuffled/
    daskpile expire s3://lake/shuffled/ --keep 30
    daskpile demo

Exit status: 0 on success; 1 when verification or a quality check fails, or
the run fails; 2 when the command cannot run as asked (bad options, a missing
or unreadable source, an occupied dest, an unfinished run with other
arguments); 130 on Ctrl-C; 141 when the reader of its output went away (``|
head``), as for a program ended by SIGPIPE.  Errors are one line on stderr;
``--debug`` adds the traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import os
import re
import select
import sys
import time
import traceback
import warnings

import click
from click.core import ParameterSource

from daskpile._compute import WAIT_SAID_AFTER, exception_chain, local_cluster, quiet_workers, started_when_needed
from daskpile._interrupt import (
    command_over,
    ctrl_c_ignorable,
    quiet_on_ctrl_c,
    terminate_as_ctrl_c,
    terminated,
    uninterrupted,
    workers_ignoring_ctrl_c,
)
from daskpile._storage import (
    FileChangedError,
    StoresApartError,
    StoreUnreachable,
    check_url,
    redact,
    store_out_of_reach,
    store_unusable,
)
from daskpile._words import count, size
from daskpile.engine._lease import DestBusyError
from daskpile.engine._pipeline import PileTooLargeError, RunMismatchError
from daskpile.engine._sizing import NotEnoughSpace
from daskpile.sources.text.formats import FORMATS
from daskpile.window.snapshot import WindowBusyError, WindowChangedError


class SchedulerUnreachable(ConnectionError):
    """--scheduler names a cluster this process cannot reach, or the cluster has no worker yet."""


class ClusterNotStarted(RuntimeError):
    """--kubernetes could not start its cluster (no kubeconfig, a namespace refused, the API out of reach)."""


# Errors in what the user asked for: exit status 2, like a usage error.
_REQUEST_ERRORS = (
    ValueError, TypeError, KeyError, FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError,
    IsADirectoryError, ImportError, RunMismatchError, PileTooLargeError, WindowBusyError, StoreUnreachable,
    ClusterNotStarted, NotEnoughSpace,
)  # fmt: skip


# Errors the same command may not meet when run again later: exit status 75, as sysexits.h's EX_TEMPFAIL, so that
# what runs the command (a Kubernetes Job's podFailurePolicy, Argo's or Airflow's retries, a shell loop) retries
# these, and gives up at once on a 2, which no retry mends.
# (FileChangedError: a source being written while the run read it, which a later run may read whole)
_TRY_AGAIN_ERRORS = (SchedulerUnreachable, DestBusyError, WindowChangedError, FileChangedError)
EXIT_TRY_AGAIN = 75


def _exit_status(e: BaseException) -> int:
    """75 if running the same command again later may succeed (the scheduler or the store out of reach, the dest
    held by another run), 2 if the command could not run as asked, 1 if the run failed."""
    if isinstance(e, StoresApartError):  # (caused by a FileChangedError, which alone would be worth a try)
        return 2
    chain = exception_chain(e)
    lost = (_cancelled_by_the_scheduler(e) or "").startswith("lost the scheduler")
    if lost or any(isinstance(c, _TRY_AGAIN_ERRORS) or store_out_of_reach(c) for c in chain):
        return EXIT_TRY_AGAIN
    return 2 if isinstance(e, _REQUEST_ERRORS) or store_unusable(e) else 1


def _error_line(e: BaseException) -> str:
    """The one line that says ``e``, and where its run's state is if it left one."""
    message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    if isinstance(e, OSError) and message == f"[Errno {e.errno}] {e.strerror}":  # not "[Errno 28] scratch ..."
        message = e.strerror
    line = message.splitlines()[0] if message else type(e).__name__
    # (Dask names a task: "daskpile-gather-... cancelled for reason: ...")
    return f"{_cancelled_by_the_scheduler(e) or line}{_where(e)}"


class _Piles(click.ParamType):
    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if value.strip().lower() == "auto":  # (the help shows it as AUTO, as click shows a metavar)
            return "auto"
        try:
            piles = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a whole number nor 'auto'", param, ctx)
        if piles < 1:
            self.fail(f"{piles} is less than 1", param, ctx)
        return piles


_SOURCE_FORMAT = click.Choice(["auto", *FORMATS])  # what a source's files are: shuffle's, and verify's to read it


class _Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value, param, ctx):
        from dask.utils import parse_timedelta

        try:
            seconds = parse_timedelta(value, default="s")
        except (ValueError, KeyError):
            self.fail(f"{value!r} is not a duration such as 90s, 10m or 1h", param, ctx)
        if seconds < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        return seconds


class _Bytes(click.ParamType):
    name = "BYTES"

    def __init__(self, minimum: tuple[int, str] = (0, ""), why: str = ""):
        (self.minimum, self.minimum_text), self.why = minimum, why

    def convert(self, value, param, ctx):
        from dask.utils import parse_bytes

        try:
            nbytes = value if isinstance(value, int) else parse_bytes(value)
        except ValueError:
            self.fail(f"{value!r} is not a size such as 512MiB or 2GB", param, ctx)
        if nbytes < self.minimum:
            self.fail(f"{value!r} is under {self.minimum_text}: {self.why}", param, ctx)
        return nbytes


# A text file is cut into ranges of a sixteenth of --blocksize, a pass-1 task and a scratch file per band each:
# --blocksize 1 made a task of every byte of a 330 KB file, and ran for minutes.  (The API takes any size, down
# to ranges of a byte, for tests of range boundaries.)
_BLOCKSIZE_OPTION = click.option(
    "--blocksize",
    type=_Bytes((2**14, "16KiB"), "text is read in ranges of a sixteenth of it, a task and scratch files each"),
    default="256MiB",
    show_default=True,
    help="Pieces a task reads: Parquet files larger than this by whole row groups; text files in ranges of a "
    "sixteenth of it, a task and scratch files each (so 16KiB makes 1 KiB tasks); small files together up to a "
    "sixteenth. It decides the output for a seed [at least 16KiB].",
)


def parse_storage_options(
    items: tuple[str, ...], option: str = "--storage-option", levels: int | None = None
) -> dict | None:
    """``KEY=VALUE`` pairs as fsspec storage options (or read options); VALUE is JSON if it parses, dots in KEY nest
    (up to ``levels`` deep: read options nest once, as the rest of ``column_types.NAME`` is a column's name).

    >>> parse_storage_options(("anon=false", "client_kwargs.endpoint_url=http://127.0.0.1:9000"))
    {'anon': False, 'client_kwargs': {'endpoint_url': 'http://127.0.0.1:9000'}}
    >>> parse_storage_options(("column_types.a.b=int64",), "--read-option", levels=1)
    {'column_types': {'a.b': 'int64'}}
    """
    options: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *parents, leaf = key.split(".", -1 if levels is None else levels)
        target = options
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    if option == "--storage-option":
        _refuse_kwargs_not_objects(options)
    return options or None


def _refuse_kwargs_not_objects(options: dict) -> None:
    """A storage option named ``*_kwargs`` (s3fs's ``client_kwargs``, ``config_kwargs``...) is keyword arguments:
    given a string, s3fs failed far into the run with "'str' object has no attribute 'copy'" (exit 1).

    >>> _refuse_kwargs_not_objects({"client_kwargs": None, "config_kwargs": {"retries": {}}})  # (None: s3fs's default)
    >>> _refuse_kwargs_not_objects({"client_kwargs": "endpoint_url=http://h"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    click.exceptions.BadParameter: client_kwargs is keyword arguments: ...
    """
    for key, value in options.items():
        if key.endswith("kwargs") and not isinstance(value, dict | None):
            raise click.BadParameter(
                f"{key} is keyword arguments: give each as --storage-option {key}.NAME=VALUE (e.g. {key}.endpoint_url="
                f"http://127.0.0.1:9000), or all as a JSON object ({key}='{{\"NAME\": VALUE}}'), not {value!r}",
                param_hint="--storage-option",
            )


WRITING = {"shuffle", "append", "expire", "compact", "discard", "demo"}  # the commands whose purpose is a write


def _command(f):
    """Options every command shares, and the translation of exceptions into one line and an exit status."""

    @click.option("--debug", is_flag=True, help="On an error, print the whole traceback.")
    @click.option("--quiet", "-q", is_flag=True, help="No progress bars or lines: the final report only.")
    @click.option(
        "--retry-for",
        type=_Duration(),
        metavar="DURATION",
        help="Run again after an error a later try may not meet (exit status 75: the scheduler or the store out of "
        "reach, the dest written by another run), pausing between tries, for up to DURATION (10m, 1h) from the "
        "error; a try that had run longer than a minute starts the window anew.",
    )
    @functools.wraps(f)
    def run(*args, debug: bool, retry_for: float | None, **kwargs):
        # With --json, stdout carries the JSON document alone: every other line goes to stderr.
        _RESULTS.append(sys.stdout)
        logs_elsewhere = contextlib.redirect_stdout(sys.stderr) if kwargs.get("as_json") else contextlib.nullcontext()
        try:
            _check_urls(kwargs)  # before a cluster is started for nothing
            with logs_elsewhere, terminate_as_ctrl_c():
                return _tried_again(functools.partial(f, *args, **kwargs), retry_for or 0.0)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt as e:
            _say_stopped(e)
        except Exception as e:
            if _reader_gone(e):
                # `daskpile ... | head`: the run stops at its next line, as a program ended by SIGPIPE does,
                # and says on stderr what it left (a trial's `| head -1` before anything was written: exit 141,
                # no dest, and not a word of why)
                _stop_writing_to_stdout()
                left = _interruption_said(e) or ("; it had written nothing" if f.__name__ in WRITING else "")
                if left:  # (a command that only reads ends silently, as a program ended by SIGPIPE does)
                    click.echo(redact(f"daskpile: stopped: the reader of its output went away{left}"), err=True)
                sys.exit(141)
            if any(isinstance(c, KeyboardInterrupt) for c in exception_chain(e)[1:]):
                # An error raised while a Ctrl-C was handled (a file closed twice as scratch was removed): the
                # interruption is what happened
                _say_stopped(e)
            if debug:
                click.echo(redact(traceback.format_exc()), err=True, nl=False)
            click.echo(redact(f"daskpile: error: {_error_line(e)}"), err=True)
            sys.exit(_exit_status(e))
        finally:
            _RESULTS.pop()

    return run


# Pauses between tries of --retry-for, in seconds: a scheduler or a store back within seconds is met soon, one
# down for long is not asked every few seconds.
RETRY_PAUSES = (5.0, 10.0, 20.0, 40.0, 60.0)


def _tried_again(command, retry_for: float):
    """``command()``, run again after an error a later try may not meet, for up to ``retry_for`` seconds from that
    error (a run of ``shuffle`` resumes where the one before stopped).  A try that ran longer than the longest
    pause before it failed had got going: its error starts a new window, so that a run of hours that loses its
    scheduler at the second hour is tried again as one that cannot reach it at its start."""
    window, streak = 0.0, 0
    for tries in itertools.count(1):
        _SCHEDULER.clear()  # (a command run in process after another: its scheduler is not this one's)
        started = time.monotonic()
        try:
            return command()
        except Exception as e:
            failed = time.monotonic()
            if streak == 0 or failed - started > RETRY_PAUSES[-1]:
                window, streak = failed, 0
            pause = RETRY_PAUSES[min(streak, len(RETRY_PAUSES) - 1)]
            if _exit_status(e) != EXIT_TRY_AGAIN or failed + pause > window + retry_for:
                raise
            streak += 1
            click.echo(redact(f"daskpile: {_error_line(e)}: trying again in {pause:.0f} s (try {tries + 1})"), err=True)
            time.sleep(pause)


def _cancelled_by_the_scheduler(e: BaseException) -> str | None:
    """The line for a scheduler lost under the command (restarted, its pod moved), which Dask says as tasks
    cancelled (naming one), a connection closed or one timed out, depending on when; or for tasks another
    client cancelled."""
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError

    chain = exception_chain(e)
    cancelled = next((c for c in chain if isinstance(c, FutureCancelledError)), None)
    if cancelled is not None and cancelled.reason not in ("scheduler-connection-lost", "unknown"):
        return f"the scheduler cancelled the run's tasks ({cancelled.reason}): another client cancelled them?"
    # (distributed's words for a connection it could not make again: "Timed out trying to connect to ADDRESS after")
    to_scheduler = _SCHEDULER and any(
        isinstance(c, OSError) and f"connect to {_SCHEDULER[-1]} " in str(c) for c in chain
    )
    if cancelled is not None or to_scheduler or any(isinstance(c, CommClosedError) for c in chain):
        where = f" at {_SCHEDULER[-1]}" if _SCHEDULER else ""
        return (
            f"lost the scheduler{where}: the connection to it closed, and it did not come back; run the same "
            "command again once it is up"
        )
    return None


_SCHEDULER: list[str] = []  # the address of the scheduler the command's client connected to


def _say_stopped(e: BaseException) -> None:
    """The one line of a command Ctrl-C or SIGTERM stopped, and its exit status (128 + the signal's number)."""
    if terminated():
        click.echo(redact(f"daskpile: terminated (SIGTERM){_interruption_said(e)}"), err=True)
        sys.exit(143)
    click.echo(redact(f"daskpile: interrupted{_interruption_said(e)}"), err=True)
    sys.exit(130)


def _check_urls(arguments: dict) -> None:
    for value in arguments.values():
        for url in value if isinstance(value, tuple) else [value]:
            if isinstance(url, str):
                check_url(url)


def _interruption_said(e: BaseException) -> str:
    """What an interrupted command left: a result complete, a window's change committed, a run to resume, a
    window's change under way, or a window unchanged.  Read from ``e`` and the exceptions it was raised while
    handling: a second Ctrl-C (``timeout -s INT`` sends two), or an error, may land while the first is handled
    (the lease let go, scratch removed), and says nothing of what the run left."""

    def said(name: str):
        return next((getattr(c, name) for c in exception_chain(e) if getattr(c, name, None)), None)

    complete = said("daskpile_complete")
    if complete:
        line = f" once the result at {complete} was complete"
        # (a run with --overwrite would replace it; the demo starts afresh)
        if said("daskpile_reported_again") and click.get_current_context().info_name == "shuffle":
            line += ": the same command again reports it"
        return line
    if said("daskpile_committed"):
        window = said("daskpile_committed")
        return f" once the window at {window} was at its new version: the same command again reports it"
    if said("daskpile_state"):
        line = f"; run the same command again to resume; its state is in {said('daskpile_state')}"
        if said("daskpile_pending"):  # an append's shuffle: the window's change is under way too
            line += f" (or daskpile discard {said('daskpile_pending')} to drop the change to the window)"
        return line
    if said("daskpile_pending"):
        pending = said("daskpile_pending")
        return (
            f"; the change to the window at {pending} is under way: run the same command again to finish it (or "
            f"daskpile discard {pending} to drop it)"
        )
    if said("daskpile_unchanged"):
        return f"; the window at {said('daskpile_unchanged')} was not changed"
    return ""


def _reader_gone(e: BaseException) -> bool:
    """Whether ``e`` is a write to this process's stdout after its reader went away (a broken pipe): not
    an error of the run, whose stores and workers also speak through pipes and sockets."""
    if not any(isinstance(c, BrokenPipeError) for c in exception_chain(e)):
        return False
    try:
        poll = select.poll()
        poll.register(sys.__stdout__.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))  # a pipe without a reader
    except (OSError, ValueError, AttributeError):
        return False


def _stop_writing_to_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail on the broken pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno())
    os.close(devnull)


def _where(e: BaseException) -> str:
    """Where an interrupted run's state is, if the run left one to resume."""
    state = getattr(e, "daskpile_state", None)
    return f"; its state is in {state}" if state else ""


_RESULTS: list = []  # where each running command's result goes: its stdout before any redirection


def _result(text: str) -> None:
    """Print a command's result (its report or JSON document) on its stdout.

    In the console script, the command is over then: a Ctrl-C from there on is ignored, since it would
    turn a finished command into an interrupted one (exit status 130) while it only returns.
    """
    if _CONSOLE_SCRIPT:
        command_over()
    click.echo(redact(text), file=_RESULTS[-1] if _RESULTS else None)


def _with_options(options: list, f):
    """``f`` decorated with ``options``, in the order listed (as stacked decorators would show them)."""
    for option in reversed(options):
        f = option(f)
    return f


def _source_options(f):
    """How SOURCE is read: partition folders, schema policy, table version, stray files."""
    options = [
        click.option(
            "--partitioning",
            default="hive",
            show_default=True,
            help="Key=value folders: hive (types inferred), none (ignored), or types 'year:int16,region:string'.",
        ),
        click.option(
            "--schema",
            type=click.Choice(["strict", "unify"]),
            default="strict",
            show_default=True,
            help="strict: every file has the same columns; unify (Parquet): their union, types promoted, missing as "
            "nulls.",
        ),
        click.option("--table-version", type=int, help="Delta version or Iceberg snapshot id [the current one]."),
        click.option(
            "--stray-files",
            type=click.Choice(["skip", "error"]),
            default="skip",
            show_default=True,
            help="Files of no data format by their extension (README.md, LICENSE): skip and list them, or stop.",
        ),
    ]
    return _with_options(options, f)


def _cluster_options(f):
    options = [
        click.option(
            "--scheduler",
            envvar="DASK_SCHEDULER_ADDRESS",
            metavar="ADDRESS",
            help="An existing cluster's scheduler (tcp://...; $DASK_SCHEDULER_ADDRESS, as the dask-kubernetes "
            "operator sets it), or 'threads' / 'sync' for Dask's local schedulers. Default: a new LocalCluster.",
        ),
        click.option(
            "--scheduler-file",
            metavar="FILE",
            help="An existing cluster's scheduler, by the file dask scheduler --scheduler-file writes (dask-jobqueue "
            "and dask-mpi too); waited for up to Dask's connect timeout [30 s].",
        ),
        click.option(
            "--kubernetes",
            metavar="NAME",
            help="Start a Kubernetes cluster NAME with the dask-kubernetes operator (needs daskpile[kubernetes]); "
            "--image, --workers, --threads-per-worker and --memory-limit shape it.",
        ),
        click.option("--image", help="With --kubernetes: the image of deploy/Dockerfile, pushed to your registry."),
        click.option(
            "--namespace", help="With --kubernetes: where the cluster goes, with its Secret [the kubeconfig's]."
        ),
        click.option("--workers", type=click.IntRange(min=1), help="Worker processes or pods [cores; 4 pods]."),
        click.option(
            "--threads-per-worker",
            type=click.IntRange(min=1),
            help="Threads of each worker [1 local; 2 on Kubernetes, its CPUs].",
        ),
        click.option("--memory-limit", default="auto", show_default=True, help="Per worker [auto: 8GiB pods]."),
        click.option(
            "--storage-option",
            "storage_options",
            multiple=True,
            metavar="KEY=VALUE",
            help="An fsspec storage option (repeatable); VALUE is JSON if it parses; "
            "client_kwargs.endpoint_url=... nests.  Credentials belong in the environment or the store's profile "
            "(profile=...): other users can read a command's arguments.",
        ),
    ]
    return _with_options(options, f)


def kubernetes_shape(workers, threads_per_worker, memory_limit) -> dict:
    """The arguments of ``daskpile.kubernetes.cluster_spec`` that the cluster options give."""
    shape = {"workers": workers, "threads_per_worker": threads_per_worker}
    if memory_limit != "auto":
        shape["memory_per_worker"] = memory_limit
    return {k: v for k, v in shape.items() if v is not None}


# How long a cluster may take to have its first worker: on Kubernetes, a pod scheduled and its image pulled.
FIRST_WORKER_TIMEOUT = 600


def _check_cluster_options(
    scheduler, scheduler_file, kubernetes, namespace, image, workers, threads_per_worker, memory_limit
):
    """Refuse options that would do nothing: where the tasks run decides which apply."""
    if (image or namespace) and not kubernetes:
        raise click.UsageError("--image and --namespace apply to --kubernetes")
    if scheduler and scheduler_file:
        raise click.UsageError(f"--scheduler {scheduler} and --scheduler-file {scheduler_file}: give one")
    a_file = bool(scheduler) and os.path.isfile(scheduler)
    if scheduler and scheduler not in ("threads", "sync") and (":" not in scheduler or a_file):  # no address
        file = " (a scheduler file is --scheduler-file's)" if a_file else ""
        raise click.UsageError(
            f"--scheduler takes a scheduler's address (tcp://host:8786), threads or sync, not {scheduler!r}{file}; "
            "without it, the command starts a LocalCluster of worker processes"
        )
    _check_memory_limit(memory_limit)
    given = [("--workers", workers), ("--threads-per-worker", threads_per_worker), ("--kubernetes", kubernetes)]
    shaping = [name for name, value in given if value] + (["--memory-limit"] if memory_limit != "auto" else [])
    if (scheduler or scheduler_file) and shaping:
        context = click.get_current_context(silent=True)
        from_environment = bool(scheduler) and (
            context is not None and context.get_parameter_source("scheduler") is ParameterSource.ENVIRONMENT
        )
        if scheduler_file:
            named = f"--scheduler-file {scheduler_file}"
        else:
            named = f"$DASK_SCHEDULER_ADDRESS ({scheduler})" if from_environment else f"--scheduler {scheduler}"
        raise click.UsageError(
            f"{', '.join(shaping)} {'shape' if len(shaping) > 1 else 'shapes'} a cluster the command starts, and "
            f"{named} {'runs in this process' if scheduler in ('threads', 'sync') else 'names an existing one'}"
            + (": unset it to start one" if from_environment else "")
        )


# A worker holds about 200 MiB before any data (Python, Dask, pyarrow), and Dask pauses it at 80 % of its
# limit: at --memory-limit 100MiB a worker was paused from its start, and the run waited forever.
LEAST_MEMORY_LIMIT = 512 * 2**20


def _check_memory_limit(memory_limit: str) -> None:
    if memory_limit in ("auto", None) or (re.fullmatch(r"[0-9]*\.?[0-9]+", memory_limit) and float(memory_limit) <= 1):
        return  # (a fraction of the machine's memory, as distributed reads 0.5 or 1; 0 is no limit)
    from dask.utils import parse_bytes

    try:
        limit = parse_bytes(memory_limit)
    except ValueError:
        return  # (a fraction of the machine's memory, or nonsense: distributed says which)
    if 0 < limit < LEAST_MEMORY_LIMIT:
        raise click.UsageError(
            f"--memory-limit {memory_limit}: a worker holds about 200 MiB before any data, and Dask pauses it at "
            "80 % of its limit; give it 512MiB or more"
        )


@contextlib.contextmanager
def _cluster(
    scheduler, scheduler_file, kubernetes, namespace, image, workers, threads_per_worker, memory_limit, quiet: bool,
    when_needed: bool = False,
):  # fmt: skip
    """Where the tasks run: an existing cluster, Dask's local scheduler, a Kubernetes cluster or a new LocalCluster.

    ``when_needed``: the cluster is started (or connected to) when the block
    first asks for it (``_compute.current_client``), so that what needs none
    (the source planned, a file refused, nothing to append) is said without
    waiting for one: on Kubernetes, without pods started for nothing.
    """
    import dask

    _check_cluster_options(
        scheduler, scheduler_file, kubernetes, namespace, image, workers, threads_per_worker, memory_limit
    )
    if scheduler in ("threads", "sync"):
        with dask.config.set(scheduler=scheduler):
            yield
        return
    cluster = _distributed_cluster(
        scheduler, scheduler_file, kubernetes, namespace, image, workers, threads_per_worker, memory_limit, quiet
    )
    with started_when_needed(cluster) if when_needed else cluster:
        yield


def _require_a_scheduler_answers(address: str) -> None:
    """Refuse a ``tcp://`` address where something accepts connections but is no Dask scheduler (its dashboard's
    port, another service): distributed's ``Client`` waits for its greeting forever (a platform trial: a DaskJob
    would sit silent to its deadline).  A scheduler greets a connection at once, within distributed's connect
    timeout (``distributed.comm.timeouts.connect``, 30 s: a scheduler that busy is out of reach for ``Client``
    too); one that cannot be reached is ``Client``'s to name."""
    import socket

    import dask
    from dask.utils import parse_timedelta
    from distributed.comm.addressing import parse_address, parse_host_port

    seconds = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")

    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
    except ValueError:
        return
    if scheme != "tcp":  # (TLS: the client speaks first, and a server that is not one refuses it at once)
        return
    try:
        connection = socket.create_connection((host, port), timeout=seconds)
    except OSError:
        return  # (Client retries, then names it)
    with connection:
        connection.settimeout(seconds)
        try:
            greeted = bool(connection.recv(1))
        except TimeoutError:
            greeted = False
        except OSError:
            return
    if not greeted:
        raise SchedulerUnreachable(
            f"{address} accepted a connection but no Dask scheduler answered in {seconds:g} s: "
            "is it the scheduler's port (8786 by default), not its dashboard's (8787) or another service's?"
        )


@contextlib.contextmanager
def _distributed_cluster(
    scheduler, scheduler_file, kubernetes, namespace, image, workers, threads_per_worker, memory_limit, quiet: bool
):
    """A client of an existing cluster, or of one started here, current while the block runs."""
    from distributed import Client

    if scheduler_file:
        scheduler = _address_in(scheduler_file)
    with ctrl_c_ignorable() as ignore_ctrl_c, contextlib.ExitStack() as stack:
        hint = ""  # what to look at if no worker comes
        if scheduler:
            description = f"cluster {scheduler}"
            _require_a_scheduler_answers(scheduler)
            try:
                client = stack.enter_context(Client(scheduler))
            except (OSError, TimeoutError) as e:
                raise SchedulerUnreachable(f"cannot reach the scheduler at {scheduler}: {e}") from e
        else:
            if kubernetes:
                cluster = _kubernetes(kubernetes, namespace, image, workers, threads_per_worker, memory_limit)
                description = f"Kubernetes cluster {kubernetes}"
                where = f" -n {namespace}" if namespace else ""
                hint = (
                    f": are its pods pending (kubectl{where} get pods)? They need the image and the Secret "
                    "daskpile-storage in the namespace (deploy/README.md, step 3)"
                )
            else:
                stack.enter_context(workers_ignoring_ctrl_c())  # Ctrl-C reaches this process only: it stops them
                shape = dict(n_workers=workers, threads_per_worker=threads_per_worker or 1, memory_limit=memory_limit)
                cluster = uninterrupted(lambda: local_cluster(**shape), undo=lambda cluster: cluster.close())
                description = "LocalCluster"
            stack.enter_context(cluster)
            client = stack.enter_context(Client(cluster))
        _wait_for_a_worker(client, description, hint)
        _SCHEDULER[:] = [client.scheduler.address]  # (kept past the block: its error is said after it)
        # A scheduler lost mid-run: the client logged a traceback a reconnection attempt, and its comm "Batched
        # Comm Closed" (seen in a loaded CI run), before the command's one line (``_cancelled_by_the_scheduler``)
        for name in ("distributed.client", "distributed.batched"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        if description == "LocalCluster":
            quiet_workers(client)
        if not quiet:
            click.echo(f"{description}: {count(len(client.nthreads()), 'worker')}, dashboard {client.dashboard_link}")
        stack.callback(ignore_ctrl_c)  # while the client and cluster close, the command is over
        with quiet_on_ctrl_c(None if scheduler else client):
            yield


def _address_in(scheduler_file: str) -> str:
    """The address a scheduler file holds.  A scheduler writes its file once it listens, in place: as ``dask
    worker --scheduler-file`` does, the file is waited for, and read again while it is not yet whole, here up to
    Dask's connect timeout (a job script starts the scheduler, its workers and the command at once)."""
    import dask
    import distributed  # noqa: F401 (its configuration, the connect timeout)
    from dask.utils import parse_timedelta

    timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="s")
    start, said, why = time.monotonic(), False, None
    while time.monotonic() < start + timeout:
        try:
            with open(scheduler_file) as f:
                address = json.load(f).get("address")
            if isinstance(address, str) and address:
                return address
            why = "no 'address' in it"
        except FileNotFoundError:
            why = None
        except (OSError, ValueError, AttributeError) as e:  # (being written, or no JSON object)
            why = e.strerror if isinstance(e, OSError) else "not a JSON object with an address"
        if not said and time.monotonic() > start + WAIT_SAID_AFTER:  # (the scheduler starting beside us)
            click.echo(f"daskpile: waiting up to {timeout:.0f} s for the scheduler file {scheduler_file}", err=True)
            said = True
        time.sleep(0.1)
    if why is None:
        raise SchedulerUnreachable(f"no scheduler file at {scheduler_file} after {timeout:.0f} s")
    raise click.UsageError(
        f"--scheduler-file {scheduler_file}: not a scheduler file (JSON holding the scheduler's address, as dask "
        f"scheduler --scheduler-file writes): {why}"
    )


def _kubernetes(name, namespace, image, workers, threads_per_worker, memory_limit):
    from daskpile.kubernetes import IMAGE, kubernetes_cluster

    shape = kubernetes_shape(workers, threads_per_worker, memory_limit)
    try:
        return kubernetes_cluster(name, namespace=namespace, image=image or IMAGE, **shape)
    except ImportError:
        raise
    except Exception as e:
        unreachable = any(c.__name__ in ("ConnectError", "ConnectTimeout") for c in type(e).__mro__)  # (httpx's)
        if unreachable or isinstance(e, ConnectionError):  # (a temporary state, as a scheduler out of reach)
            server = _kubernetes_server()
            raise SchedulerUnreachable(
                f"cannot start the Kubernetes cluster {name!r}: its API server "
                f"{server or '(kubectl cluster-info names it)'} is out of reach: {e}"
            ) from e
        raise ClusterNotStarted(f"cannot start the Kubernetes cluster {name!r}: {e}") from e


def _kubernetes_server() -> str | None:
    """The API server of the kubeconfig's current context, as kubectl finds it (the first file of $KUBECONFIG,
    else ~/.kube/config), or None."""
    import yaml

    path = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        return next(c["cluster"]["server"] for c in config["clusters"] if c["name"] == context["cluster"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration):
        return None


def _wait_for_a_worker(client, description: str, hint: str = "") -> None:
    """A cluster's workers may still be starting (a DaskJob starts its runner beside them): piles="auto" sizes
    piles by the workers' memory, and the shared-disk check asks the workers, so neither can run without one."""
    said_after = min(WAIT_SAID_AFTER, FIRST_WORKER_TIMEOUT)
    if _a_worker_joins(client, said_after):
        return
    if said_after < FIRST_WORKER_TIMEOUT:  # (pods pulling their image: a job's log said nothing for ten minutes)
        click.echo(f"{description}: waiting for a worker to join, up to {FIRST_WORKER_TIMEOUT} s", err=True)
        if _a_worker_joins(client, FIRST_WORKER_TIMEOUT - said_after):
            return
    raise SchedulerUnreachable(f"{description} has no worker after {FIRST_WORKER_TIMEOUT} s{hint}")


def _a_worker_joins(client, seconds: float) -> bool:
    try:
        client.wait_for_workers(1, timeout=seconds)
    except TimeoutError:
        return False
    return True


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="daskpile", prog_name="daskpile")
def cli():
    """Shuffle datasets larger than memory into a uniformly random order, on Dask."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _one_line_warnings(shown):
    """A ``warnings.showwarning`` that says daskpile's own warnings as one line, ``daskpile: warning: ...``:
    Python's form printed the source file and line that warned, and that line of code (a corpus trial:
    "cli.py:798: UserWarning: 5 piles for about 2 rows", then "report = call(progress=not quiet)").  Other
    libraries' warnings, and other categories, are ``shown`` as they were."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category is not UserWarning or not os.path.abspath(str(filename)).startswith(_PACKAGE):
            shown(message, category, filename, lineno, file, line)
            return
        click.echo(redact(f"daskpile: warning: {message}"), err=True)

    return show


@cli.command()
@click.argument("source", nargs=-1, required=True)
@click.argument("dest")
@click.option(
    "--piles", type=_Piles(), default="auto", show_default=True,
    help="Output files; auto fits memory, with at least 10,000 rows or 32 MiB a pile, as estimated from the files' "
    "first bytes or footers (small data: one pile).",
)  # fmt: skip
@click.option(
    "--memory-per-pile",
    type=_Bytes(),
    help="The memory a pile may take: sizes --piles auto, and a pile over it is split (--on-oversize) "
    "[with --piles auto, a quarter of a worker's memory per thread; with a count, none].",
)
@click.option(
    "--on-oversize",
    type=click.Choice(["split", "error"]),
    default="split",
    show_default=True,
    help="A pile over its memory budget: split it into consecutive files, or stop before pass 2.",
)
@_BLOCKSIZE_OPTION
@click.option("--seed", type=click.IntRange(min=0), help="Same seed, same output, on any cluster [drawn and recorded].")
@click.option(
    "--rows-per-file", type=click.IntRange(min=1), help="Cut the shuffled sequence into files of N rows [one per pile]."
)
@click.option(
    "--lazy",
    is_flag=True,
    help="Leave each pile unpermuted for daskpile.PileLoader to permute on load (plain readers get pile order).",
)
@click.option("--scratch", metavar="URL", help="Where pass 1 writes [the system's temporary directory].")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace daskpile's finished result in DEST (nothing else), or another unfinished run.",
)
@click.option("--no-verify", is_flag=True, help="Skip the fingerprints that prove nothing was lost.")
@click.option(
    "--format",
    "source_format",
    type=_SOURCE_FORMAT,
    default="auto",
    show_default=True,
    help="What SOURCE's files are; auto goes by their names (.csv, .tsv, .jsonl/.ndjson/.json, .txt, "
    ".arrow/.feather, .orc; text compressed .gz/.bz2/.zst (.zstd)/.xz too). lines: each line one row, its bytes "
    "exactly.",
)
@click.option(
    "--read-option",
    "read_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Text formats, pyarrow's names (repeatable): delimiter=';', autogenerate_column_names=true (no header), "
    "column_types.NAME=TYPE (int64, string, ...), newlines_in_values=true, quote_char=false (quotes are part of "
    "the values), encoding=latin1, null_values=NA, (the texts read as a null: an empty field only by default), "
    "escape_char=\\, decimal_point=',', true_values=Y, false_values=N, timestamp_parsers=%d/%m/%Y; "
    "as_written=false parses JSON lines written out as JSON lines (kept as "
    "written by default); as_text=false infers a CSV's types when it is written out as a CSV (its values' "
    "text kept by default).",
)
@click.option(
    "--output-format",
    type=click.Choice(["parquet", "arrow", "csv", "jsonl", "lines"]),
    default="parquet",
    show_default=True,
    help="What each pile is written as. lines: the single column, one value per line (lines in: the same lines); "
    "jsonl: JSON lines in, the same lines.",
)
@click.option(
    "--compression",
    type=click.Choice(["gzip", "zstd"]),
    help="Of each csv, jsonl or lines file (.gz, .zst), inside arrow (zstd) and parquet files [none; parquet's own].",
)
@_source_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_cluster_options
@_command
def shuffle(
    source, dest, piles, memory_per_pile, on_oversize, blocksize, seed, rows_per_file, lazy, scratch, overwrite,
    no_verify, source_format, read_options, output_format, compression, as_json, quiet, partitioning, schema,
    table_version, stray_files, **cluster,
):  # fmt: skip
    """Shuffle the data in SOURCE... into DEST (any fsspec URLs), one file per pile.

    SOURCE is directories, globs, files, or a Delta or Iceberg table folder:
    Parquet, CSV, TSV, JSON lines or plain lines.

    Key=value folders become columns.  Run the same command again after an
    interruption to resume.
    """
    from daskpile import shuffle_parquet
    from daskpile.engine._pipeline import finished_result, refuse_another_calls_run

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    call = functools.partial(
        shuffle_parquet, list(source) if len(source) > 1 else source[0], dest, piles, seed=seed, scratch=scratch,
        storage_options=storage_options, overwrite=overwrite, verify=not no_verify,
        memory_per_pile=memory_per_pile, blocksize=blocksize, on_oversize=on_oversize,
        partitioning=partitioning, schema=schema, version=table_version, stray_files=stray_files,
        rows_per_file=rows_per_file, second_pass="lazy" if lazy else "eager", format=source_format,
        read_options=parse_storage_options(read_options, "--read-option", levels=1), output_format=output_format,
        compression=compression,
    )  # fmt: skip
    report = None
    if cluster["scheduler"] is None and cluster["scheduler_file"] is None and not overwrite:  # a cluster to start
        _check_cluster_options(**cluster)
        report = finished_result(dest, storage_options, functools.partial(call, progress=False))
        if report is None:
            refuse_another_calls_run(dest, scratch, storage_options, piles, seed)
    if report is None:
        with _cluster(**cluster, quiet=quiet, when_needed=True):
            report = call(progress=not quiet)
    _result(json.dumps(_report_json(report), indent=1) if as_json else str(report))


@cli.command()
@click.argument("source", nargs=-1)
@click.argument("dest")
@click.option("--partitioning", help="As the shuffle read SOURCE [what DEST's manifest records].")
@click.option(
    "--schema", type=click.Choice(["strict", "unify"]), help="As the shuffle read SOURCE [from the manifest]."
)
@click.option("--table-version", type=int, help="Of a Delta or Iceberg SOURCE [from the manifest].")
@click.option(
    "--format",
    "source_format",
    type=_SOURCE_FORMAT,
    help="What SOURCE's files are, as for shuffle [from the manifest; auto without one].",
)
@click.option(
    "--read-option", "read_options", multiple=True, metavar="KEY=VALUE", help="As for shuffle [from the manifest]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_cluster_options
@_command
def verify(source, dest, partitioning, schema, table_version, source_format, read_options, as_json, quiet, **cluster):
    """Recompute from the files that DEST holds exactly the rows of SOURCE (exit 1 if not).

    Without SOURCE, check DEST against the fingerprints its manifest recorded
    from its sources: a moving window generation by generation.
    """
    from daskpile import verify as verify_result

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    if not source and (source_format or read_options):
        raise click.UsageError("--format and --read-option say how SOURCE is read: give SOURCE")
    with _cluster(**cluster, quiet=quiet, when_needed=True):
        if not source:
            result = verify_result(dest, storage_options=storage_options, progress=not quiet)
        else:
            result = verify_result(
            list(source) if len(source) > 1 else source[0], dest, storage_options=storage_options,
            progress=not quiet, partitioning=partitioning, schema=schema, version=table_version,
            format=source_format, read_options=parse_storage_options(read_options, "--read-option", levels=1),
            )  # fmt: skip
    _result(json.dumps(result.to_json(), indent=1) if as_json else str(result))
    sys.exit(0 if result.ok else 1)


@cli.command()
@click.argument("dest", nargs=-1, required=True)
@click.option("--order-column", required=True, help="Column holding each row's original position (e.g. an id).")
@click.option("--label-column", help="A categorical column whose balance per file and per batch is checked.")
@click.option(
    "--neighbours",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Output neighbours closer than this in the input order are counted.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=2),
    default=1024,
    show_default=True,
    help="Rows of a training batch, for the label balance per batch (with --label-column).",
)
@click.option(
    "--alpha",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=1e-3,
    show_default=True,
    help="False-positive rate of each check on a uniform shuffle.",
)
@click.option("--plot", type=click.Path(dir_okay=False), help="Write the figure as PNG (one DEST), or PATH-N.png.")
@click.option(
    "--scratch", metavar="URL", help="Where a sort of the order column writes, past 2 M rows of a key not 0..n-1 [TMP]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@_cluster_options
@_command
def quality(dest, order_column, label_column, neighbours, batch_size, alpha, plot, scratch, as_json, quiet, **cluster):
    """How random is the row order of each DEST? Exit 1 if a check fails.

    DEST is a daskpile result in any output format (Parquet, Arrow, CSV, JSON
    lines, lines), or any Parquet directory, glob or file list; give the input
    too (as Parquet, if it is not) to see the difference.
    """
    from daskpile import quality as measure

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    reports = []
    with _cluster(**cluster, quiet=True):
        for k, url in enumerate(dest):
            report = measure(
                url, order_column, label_column, neighbours=neighbours, alpha=alpha,
                storage_options=storage_options, scratch=scratch, batch_size=batch_size,
            )  # fmt: skip
            reports.append(report)
            if plot:
                path = plot if len(dest) == 1 else f"{plot.removesuffix('.png')}-{k}.png"
                report.plot(path)
                if not quiet and not as_json:
                    click.echo(f"figure: {path}")
            if not as_json:
                click.echo(redact(str(report)))
    if as_json:
        _result(json.dumps([r.to_json() for r in reports], indent=1))
    sys.exit(0 if all(r.ok for r in reports) else 1)


@cli.command()
@click.argument("dest")
@click.option("--batch-size", type=click.IntRange(min=1), default=1024, show_default=True, help="Rows per batch.")
@click.option(
    "--mix",
    type=click.IntRange(min=1),
    multiple=True,
    help="Piles PileLoader permutes together (repeatable) [1, 2, 4].",
)
@click.option("--world-size", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks reading it.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="The loader's seed.")
@click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="An fsspec storage option (repeatable), as for shuffle.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rates as JSON.")
@_command
def epochs(dest, batch_size, mix, world_size, seed, storage_options, as_json, quiet):
    """How tied are two epochs of DEST read by daskpile.PileLoader?

    For each --mix, the share of pairs of rows in one batch of an epoch that
    are again in one batch of the next, beside that share for independent
    permutations.  Computed from the loader's plans: no data is read.
    """
    from daskpile import PileLoader

    options = parse_storage_options(storage_options)
    rates = {}
    for k in mix or (1, 2, 4):
        loader = PileLoader(dest, batch_size=batch_size, seed=seed, mix=k, world_size=world_size,
                            storage_options=options)  # fmt: skip
        rates[k] = loader.co_batch_rate()
        if not as_json:
            click.echo(f"mix {k}: {rates[k]}")
    if as_json:
        _result(json.dumps({k: dataclasses.asdict(r) for k, r in rates.items()}, indent=1))


@cli.command()
@click.argument("scratch_given", metavar="[SCRATCH]", required=False)
@click.option("--scratch", metavar="URL", help="Where runs kept their scratch, as SCRATCH [the system's temporary "
              "directory].")  # fmt: skip
@click.option("--older-than", metavar="AGE", help="Keep anything newer (1d, 12h); remove unknown scratch older.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE", help="As for shuffle.")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@_command
def clean(scratch_given, scratch, older_than, dry_run, storage_options, as_json, quiet):
    """Remove the scratch of interrupted runs that can no longer be resumed (finished, replaced, or their source
    changed); a run that can, its dest deleted or not, stays until --older-than says it is stale.  SCRATCH is
    where runs kept it, as --scratch gave it to them."""
    from daskpile.engine._clean import clean as find_and_remove

    if scratch_given and scratch and scratch_given.rstrip("/") != scratch.rstrip("/"):
        raise click.UsageError(f"SCRATCH {scratch_given} and --scratch {scratch} differ: give one")
    scratch = scratch_given or scratch

    found = find_and_remove(
        scratch, older_than=older_than, dry_run=dry_run, storage_options=parse_storage_options(storage_options)
    )
    if as_json:
        _result(json.dumps([dataclasses.asdict(f) for f in found], indent=1))
        return
    if not quiet:
        for leftover in found:
            click.echo(redact(str(leftover)))
    removable = [f for f in found if f.removable]
    verb = "would remove" if dry_run else "removed"
    freed = sum(f.bytes for f in removable)
    _result(f"{verb} {count(len(removable), 'scratch directory')} ({size(freed)}); kept {len(found) - len(removable)}")


_RETAIN = click.option(
    "--retain",
    metavar="AGE",
    help="Keep files a new version no longer lists this long, for readers of older versions (12h, 7d, 0) [1d, or "
    "what they were retired with].",
)


@cli.command()
@click.argument("source", nargs=-1, required=True)
@click.argument("dest")
@click.option("--seed", type=click.IntRange(min=0), help="This generation's scatter seed [the window's].")
@_BLOCKSIZE_OPTION
@click.option("--scratch", metavar="URL", help="Where pass 1 writes [the system's temporary directory].")
@click.option("--no-verify", is_flag=True, help="Skip the fingerprints that prove nothing was lost.")
@click.option("--partitioning", default="hive", show_default=True, help="Key=value folders, as for shuffle.")
@click.option(
    "--again", is_flag=True,
    help="Append files that changed at a path a generation holds (a landing path), files of a generation expire "
    "dropped, or rows a generation holds already (as the newest).",
)  # fmt: skip
@_RETAIN
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_cluster_options
@_command
def append(source, dest, seed, blocksize, scratch, no_verify, partitioning, again, retain, as_json, quiet, **cluster):
    """Scatter the rows of SOURCE... into the piles of the window DEST, as a new generation.

    DEST is a shuffle result (generation 0) or a window appended to before.
    SOURCE is Parquet or text (CSV, JSON lines, lines), parsed into DEST's
    columns and types.  Costs a shuffle of SOURCE alone; readers of DEST see the new generation
    when its manifest version is written.  Run again after an interruption
    to finish it; appending the same files again does nothing.
    """
    from daskpile import append as append_to

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    with _cluster(**cluster, quiet=quiet, when_needed=True):
        report = append_to(
            dest, list(source) if len(source) > 1 else source[0], seed=seed, scratch=scratch,
            storage_options=storage_options, verify=not no_verify, progress=not quiet, retain=retain,
            blocksize=blocksize, partitioning=partitioning, again=again,
        )  # fmt: skip
    _result(json.dumps(report.to_json(), indent=1) if as_json else str(report))


@cli.command()
@click.argument("dest")
@click.option("--keep", type=click.IntRange(min=1), help="Keep the newest N generations.")
@click.option("--before", metavar="VALUE", help="Drop generations whose rows all have --column below VALUE.")
@click.option("--column", help="The column --before compares (a time, a day number...).")
@click.option(
    "--generation", "generations", type=click.IntRange(min=0), multiple=True,
    help="Drop this generation (repeat for more): a day corrected upstream, before appending it again.",
)  # fmt: skip
@_RETAIN
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE", help="As for shuffle.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_command
def expire(dest, keep, before, column, generations, retain, storage_options, as_json, quiet):
    """Drop generations of the window DEST: --keep N, --before VALUE --column C, or --generation N.

    Writes a new manifest version (and remembers the source files --keep and
    --before drop, which append then refuses).  A generation with rows on both
    sides of VALUE stays; its rows before VALUE go at the next compact.
    """
    from daskpile import expire as expire_window

    ways = [name for name, given in (("--keep", keep is not None), ("--before", before is not None),
                                     ("--generation", bool(generations))) if given]  # fmt: skip
    if len(ways) > 1:
        raise click.UsageError(f"{' and '.join(ways)} drop generations in different ways: give one of them")
    if not ways:
        raise click.UsageError("give --keep N, --before VALUE with --column C, or --generation N")
    report = expire_window(
        dest, keep_generations=keep, before=before, column=column, generations=list(generations) or None,
        storage_options=parse_storage_options(storage_options), retain=retain,
    )  # fmt: skip
    _result(json.dumps(report.to_json(), indent=1) if as_json else str(report))


@cli.command()
@click.argument("dest")
@_RETAIN
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_cluster_options
@_command
def compact(dest, retain, as_json, quiet, **cluster):
    """Merge each pile's generations of the window DEST into one permuted file, applying --before cuts."""
    from daskpile import compact as compact_window

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    with _cluster(**cluster, quiet=quiet, when_needed=True):
        report = compact_window(dest, storage_options=storage_options, progress=not quiet, retain=retain)
    _result(json.dumps(report.to_json(), indent=1) if as_json else str(report))


@cli.command()
@click.argument("dest")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE", help="As for shuffle.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_command
def discard(dest, storage_options, as_json, quiet):
    """Drop the unfinished append, expire or compact of the window DEST (its current version stays)."""
    from daskpile import discard as discard_change

    report = discard_change(dest, storage_options=parse_storage_options(storage_options))
    _result(json.dumps(report.to_json(), indent=1) if as_json else str(report))


@cli.command()
@click.argument("directory", default="demo-data")
@click.option("--rows", type=click.IntRange(min=1), default=3_000_000, show_default=True, help="Rows to write.")
@click.option("--piles", type=click.IntRange(min=1), default=32, show_default=True, help="Piles to shuffle into.")
@click.option(
    "--workers", type=click.IntRange(min=1), default=2, show_default=True, help="LocalCluster worker processes."
)
@_command
def demo(directory, rows, piles, workers, quiet):
    """Write a sorted dataset into DIRECTORY, shuffle it on a LocalCluster, prove the result."""
    from daskpile import demo as demo_module

    args = ["--dir", directory, "--rows", str(rows), "--piles", str(piles), "--workers", str(workers)]
    demo_module.main(args + (["--quiet"] if quiet else []))


def _report_json(report) -> dict:
    data = dataclasses.asdict(report)
    if report.fingerprint is not None:
        data["fingerprint"] = report.fingerprint.to_json()
    return data


# gcsfs logs every request that ran out of retries with its traceback (Python's last-resort handler
# prints it); the error itself reaches the user as one line.  A logging set-up of the caller's still gets it.
logging.getLogger("gcsfs").addHandler(logging.NullHandler())

_CONSOLE_SCRIPT = False  # the command runs as the process's main program (daskpile.__main__), not in a test


def main(argv: list[str] | None = None, *, console_script: bool = False) -> None:
    """The ``daskpile`` command with arguments ``argv`` (default: ``sys.argv[1:]``), in this process."""
    global _CONSOLE_SCRIPT
    _CONSOLE_SCRIPT = console_script
    shown = warnings.showwarning
    warnings.showwarning = _one_line_warnings(shown)
    try:
        cli.main(args=argv, prog_name="daskpile")
    finally:  # (a caller in this process keeps its own)
        warnings.showwarning = shown


if __name__ == "__main__":
    main()
