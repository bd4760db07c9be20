"""The ``daskpile`` command: a thin layer over the Python API.

    daskpile shuffle s3://lake/table/ s3://lake/shuffled/ --piles auto
    daskpile verify s3://lake/table/ s3://lake/shuffled/
    daskpile quality s3://lake/shuffled/ --order-column id --label-column label --plot quality.png
    daskpile demo

Exit status: 0 on success; 1 when verification or a quality check fails, or
the run fails; 2 when the command cannot run as asked (bad options, a missing
or unreadable source, an occupied dest, an unfinished run with other
arguments).  Errors are one line on stderr; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import traceback

import click

from daskpile._compute import local_cluster
from daskpile._parquet import PileTooLargeError, RunMismatchError

# Errors in what the user asked for: exit status 2, like a usage error.
_REQUEST_ERRORS = (
    ValueError, TypeError, KeyError, FileNotFoundError, FileExistsError, PermissionError, RunMismatchError,
    PileTooLargeError,
)  # fmt: skip


class _Piles(click.ParamType):
    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        try:
            piles = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a whole number nor 'auto'", param, ctx)
        if piles < 1:
            self.fail(f"{piles} is less than 1", param, ctx)
        return piles


class _Bytes(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):
        from dask.utils import parse_bytes

        if isinstance(value, int):
            return value
        try:
            return parse_bytes(value)
        except ValueError:
            self.fail(f"{value!r} is not a size such as 512MiB or 2GB", param, ctx)


def parse_storage_options(items: tuple[str, ...]) -> dict | None:
    """``KEY=VALUE`` pairs as fsspec storage options; VALUE is JSON if it parses, dots in KEY nest.

    >>> parse_storage_options(("anon=false", "client_kwargs.endpoint_url=http://127.0.0.1:9000"))
    {'anon': False, 'client_kwargs': {'endpoint_url': 'http://127.0.0.1:9000'}}
    """
    options: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--storage-option")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *parents, leaf = key.split(".")
        target = options
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return options or None


def _command(f):
    """Options every command shares, and the translation of exceptions into one line and an exit status."""

    @click.option("--debug", is_flag=True, help="On an error, print the whole traceback.")
    @click.option("--quiet", "-q", is_flag=True, help="No progress bars or summary lines.")
    @functools.wraps(f)
    def run(*args, debug: bool, **kwargs):
        try:
            return f(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("daskpile: interrupted; run the same command again to resume", err=True)
            sys.exit(130)
        except Exception as e:
            if debug:
                traceback.print_exc()
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            click.echo(f"daskpile: error: {message.splitlines()[0] if message else type(e).__name__}", err=True)
            sys.exit(2 if isinstance(e, _REQUEST_ERRORS) else 1)

    return run


def _cluster_options(f):
    options = [
        click.option(
            "--scheduler",
            envvar="DASK_SCHEDULER_ADDRESS",
            metavar="ADDRESS",
            help="An existing cluster's scheduler (tcp://...; $DASK_SCHEDULER_ADDRESS, as the dask-kubernetes "
            "operator sets it), or 'threads' / 'sync' for Dask's local schedulers. Default: a new LocalCluster.",
        ),
        click.option("--workers", type=click.IntRange(min=1), help="LocalCluster worker processes [cores]."),
        click.option("--threads-per-worker", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--memory-limit", default="auto", show_default=True, help="Per LocalCluster worker."),
        click.option(
            "--storage-option",
            "storage_options",
            multiple=True,
            metavar="KEY=VALUE",
            help="An fsspec storage option (repeatable); VALUE is JSON if it parses; "
            "client_kwargs.endpoint_url=... nests.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@contextlib.contextmanager
def _cluster(scheduler, workers, threads_per_worker, memory_limit, quiet: bool):
    """Where the tasks run: an existing cluster, Dask's local scheduler, or a new LocalCluster."""
    import dask

    if scheduler in ("threads", "sync"):
        with dask.config.set(scheduler=scheduler):
            yield
        return
    from distributed import Client

    if scheduler:
        with Client(scheduler) as client:
            if not quiet:
                click.echo(f"cluster {scheduler}: {len(client.nthreads())} workers, dashboard {client.dashboard_link}")
            yield
        return
    with (
        local_cluster(n_workers=workers, threads_per_worker=threads_per_worker, memory_limit=memory_limit) as cluster,
        Client(cluster) as client,
    ):
        if not quiet:
            click.echo(f"LocalCluster: {len(cluster.workers)} workers, dashboard {client.dashboard_link}")
        yield


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="daskpile", prog_name="daskpile")
def cli():
    """Shuffle datasets larger than memory into a uniformly random order, on Dask."""


@cli.command()
@click.argument("source", nargs=-1, required=True)
@click.argument("dest")
@click.option("--piles", type=_Piles(), default="auto", show_default=True, help="Output files; auto fits memory.")
@click.option("--memory-per-pile", type=_Bytes(), help="With --piles auto [a quarter of a worker's memory per thread].")
@click.option(
    "--on-oversize",
    type=click.Choice(["split", "error"]),
    default="split",
    show_default=True,
    help="A pile over its memory budget: split it into consecutive files, or stop before pass 2.",
)
@click.option("--blocksize", type=_Bytes(), default="256MiB", show_default=True, help="Read larger files in pieces.")
@click.option("--seed", type=int, help="Same seed, same output, on any cluster [drawn and recorded].")
@click.option("--scratch", metavar="URL", help="Where pass 1 writes [the system's temporary directory].")
@click.option("--overwrite", is_flag=True, help="Replace a finished result, or discard an unfinished other run.")
@click.option("--no-verify", is_flag=True, help="Skip the fingerprints that prove nothing was lost.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_cluster_options
@_command
def shuffle(
    source, dest, piles, memory_per_pile, on_oversize, blocksize, seed, scratch, overwrite, no_verify, as_json, quiet,
    **cluster,
):  # fmt: skip
    """Shuffle the Parquet dataset SOURCE (directory, glob, files; any fsspec URL) into DEST.

    Run the same command again after an interruption to resume.
    """
    from daskpile import shuffle_parquet

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    with _cluster(**cluster, quiet=quiet):
        report = shuffle_parquet(
            list(source) if len(source) > 1 else source[0], dest, piles, seed=seed, scratch=scratch,
            storage_options=storage_options, overwrite=overwrite, verify=not no_verify,
            memory_per_pile=memory_per_pile, progress=not quiet, blocksize=blocksize, on_oversize=on_oversize,
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(_report_json(report), indent=1))
    else:
        click.echo(str(report))


@cli.command()
@click.argument("source")
@click.argument("dest")
@_cluster_options
@_command
def verify(source, dest, quiet, **cluster):
    """Recompute from the files that DEST holds exactly the rows of SOURCE (exit 1 if not)."""
    from daskpile import verify as verify_result

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    with _cluster(**cluster, quiet=quiet):
        result = verify_result(source, dest, storage_options=storage_options, progress=not quiet)
    click.echo(str(result))
    sys.exit(0 if result.ok else 1)


@cli.command()
@click.argument("dest", nargs=-1, required=True)
@click.option("--order-column", required=True, help="Column holding each row's original position (e.g. an id).")
@click.option("--label-column", help="A categorical column whose balance per file is checked.")
@click.option("--neighbours", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=1e-3, show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), help="Write the figure as PNG (one DEST), or PATH-N.png.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
@_cluster_options
@_command
def quality(dest, order_column, label_column, neighbours, alpha, plot, as_json, quiet, **cluster):
    """How random is the row order of each DEST? Exit 1 if a check fails.

    DEST is a daskpile result, or any Parquet directory, glob or file list;
    give the input too to see the difference.
    """
    from daskpile import quality as measure

    storage_options = parse_storage_options(cluster.pop("storage_options"))
    reports = []
    with _cluster(**cluster, quiet=True):
        for k, url in enumerate(dest):
            report = measure(
                url, order_column, label_column, neighbours=neighbours, alpha=alpha, storage_options=storage_options
            )
            reports.append(report)
            if plot:
                path = plot if len(dest) == 1 else f"{plot.removesuffix('.png')}-{k}.png"
                report.plot(path)
                if not quiet and not as_json:
                    click.echo(f"figure: {path}")
            if not as_json:
                click.echo(str(report))
    if as_json:
        click.echo(json.dumps([r.to_json() for r in reports], indent=1))
    sys.exit(0 if all(r.ok for r in reports) else 1)


@cli.command()
@click.argument("directory", default="demo-data")
@click.option("--rows", type=click.IntRange(min=1), default=3_000_000, show_default=True)
@click.option("--piles", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@_command
def demo(directory, rows, piles, workers, quiet):
    """Write a sorted dataset into DIRECTORY, shuffle it on a LocalCluster, prove the result."""
    from daskpile import demo as demo_module

    demo_module.main(["--dir", directory, "--rows", str(rows), "--piles", str(piles), "--workers", str(workers)])


def _report_json(report) -> dict:
    data = dataclasses.asdict(report)
    if report.fingerprint is not None:
        data["fingerprint"] = report.fingerprint.to_json()
    return data


def main(argv: list[str] | None = None) -> None:
    """The console script's entry point."""
    cli.main(args=argv, prog_name="daskpile")


if __name__ == "__main__":
    main()
