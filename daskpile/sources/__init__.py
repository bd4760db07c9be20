"""What a shuffle reads: the files of a lake, their partition keys, and the schema their rows take.

``plan_sources`` turns what the user gave (directories, globs, files, a Delta
or Iceberg table) into a ``SourcePlan``: the data files in a fixed order, each
with its partition values, and one schema.  Pass 1 reads the plan's
partitions (groups of consecutive files) with ``read.read_pieces``, and so
does ``verify``, so both see the rows as the shuffle did.

- ``listing``: which files a URL names, sidecars and strays apart;
- ``hive``: key=value partition folders;
- ``tables``: Delta Lake and Iceberg tables, through their libraries;
- ``schemas``: the schema policy (strict or unify) and conforming tables to it;
- ``read``: a partition as Arrow tables.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from daskpile._storage import (
    FileChangedError,
    FileVersion,
    as_urls,
    file_stamps,
    filesystem,
    full_url,
    is_local,
    listed_infos,
    reaching,
    redact,
    versions_now,
)
from daskpile.sources import arrowfiles, hive, listing, schemas, tables, text
from daskpile.sources.parquet import arrow_schema, open_parquet, read_parquet, refuse_unwritable
from daskpile.sources.read import Reading, SourceFile, read_pieces

__all__ = ["Reading", "SourceFile", "SourcePlan", "plan_sources", "read_pieces"]

# Consecutive files are read by one pass-1 task until they hold this fraction of
# blocksize on disk (16 MiB by default): enough that a task's fixed costs (a
# scratch file per band, a slice per pile in pass 2) are small against its data,
# small enough that a file of a typical lake (tens of MiB and up) is a task of
# its own, as it always was, and that there are many tasks for many cores.
GROUP_FRACTION = 1 / 16
# Text files sampled at most for the schema, until one has rows.
SCHEMA_CANDIDATES = 16


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """The files a shuffle reads, in order, and the schema of their rows."""

    fs: object
    files: tuple[SourceFile, ...]
    reading: Reading
    skipped: tuple[str, ...] = ()  # stray files, not read
    table: str | None = None  # "delta table at version 3", for reports
    metadata: pq.FileMetaData | None = None  # of a _metadata sidecar
    version: int | None = None  # of a table
    notes: tuple[str, ...] = ()  # what the user should know of how the source is read (a stale sidecar)

    @property
    def schema(self) -> pa.Schema:
        """The schema of the rows read: the output's stored types where they differ (``Reading.stored``)."""
        return self.reading.stored or self.reading.schema

    @property
    def data_schema(self) -> pa.Schema:
        """The schema of the rows in the files, without the partition keys."""
        keys = dict(self.files[0].keys) if self.files else {}
        return pa.schema([f for f in self.schema if f.name not in keys], metadata=self.schema.metadata)

    def with_pieces(self, row_bytes: int, cut_row_groups: bool = True) -> SourcePlan:
        """This plan with its Parquet pieces cut at ``row_bytes`` a row in memory, at least (``Reading.row_bytes``),
        and inside row groups larger than a piece unless ``cut_row_groups`` is False."""
        reading = dataclasses.replace(self.reading, row_bytes=row_bytes, cut_row_groups=cut_row_groups)
        return dataclasses.replace(self, reading=reading)

    @property
    def urls(self) -> list[str]:
        """Each file's URL as recorded and shown (a run's identity): credentials in it as ``***``."""
        return list(self._urls)

    @functools.cached_property
    def _urls(self) -> tuple[str, ...]:
        # made once a plan: a run asks for them several times, and 30,000 took 0.19 s each time
        return tuple(redact(full_url(self.fs, f.path)) for f in self.files)

    @property
    def stamps(self) -> list[str]:
        return [f.stamp for f in self.files]

    @property
    def sizes(self) -> list[int]:
        return [f.size for f in self.files]

    def refuse_files_written_again(self) -> None:
        """``FileChangedError`` naming the first file written again, or removed, since the plan listed it.

        Asked once pass 1 has read every file: a run whose tasks read some files before they were replaced and
        some after holds rows of no version of the source, and its checks, of what pass 1 read, would pass.
        A table's files are not looked at: its format never writes a file again (and a vacuum that removes
        one fails its read).
        """
        if self.table is not None:
            return
        now = versions_now(self.fs, [f.path for f in self.files])
        for f, version in zip(self.files, now, strict=True):
            if version is None or not f.listed.same_as(version):
                happened = "removed" if version is None else "written again"
                raise FileChangedError(
                    f"source file {redact(full_url(self.fs, f.path))!r} was {happened} while the shuffle read "
                    "the source, so the rows read are of no one version of it: nothing was written to dest; run "
                    "the same command again once the source is no longer being written"
                )

    def __str__(self) -> str:
        where = self.table or f"{len(self.files):,} file{'' if len(self.files) == 1 else 's'}"
        schema = ", ".join(f"{f.name}: {f.type}" for f in self.schema)
        return f"{where}, schema {self.reading.policy} ({schema})"

    def _ranges(self, limit: int) -> list[SourceFile]:
        """The files, those of text larger than ``limit`` cut into ranges of ``limit`` bytes."""
        if self.reading is None or self.reading.text is None:
            return list(self.files)
        cut = []
        for f in self.files:
            if f.size > limit and text.splittable(f.path, self.reading.text):
                cut += [dataclasses.replace(f, byte_range=(s, min(s + limit, f.size))) for s in range(0, f.size, limit)]
            else:
                cut.append(f)
        return cut

    def in_order(self, names: list[str]) -> SourcePlan:
        """This plan with its columns in the order of ``names``, where those are its columns (``verify`` reads a
        source in the order its result holds it: keys the files hold went to the end before they kept their
        place)."""
        if list(names) == self.reading.schema.names or sorted(names) != sorted(self.reading.schema.names):
            return self

        def ordered(schema: pa.Schema | None) -> pa.Schema | None:
            return None if schema is None else pa.schema([schema.field(n) for n in names], metadata=schema.metadata)

        reading = dataclasses.replace(
            self.reading, schema=ordered(self.reading.schema), stored=ordered(self.reading.stored)
        )
        return dataclasses.replace(self, reading=reading)

    def describe(self) -> dict:
        """How the source was read, for the manifest and the run's report."""
        keys = [f for f in self.schema if f.name in dict(self.files[0].keys)] if self.files else []
        return {
            "schema_policy": self.reading.policy,
            "schema_from": redact(self.reading.reference),
            "partition_keys": {f.name: str(f.type) for f in keys},
            "table": self.table,
            "table_version": self.version,
            "skipped_files": [redact(f) for f in self.skipped],
            "format": self.reading.text.format if self.reading.text else "parquet",
            **({"read_options": self.reading.text.read_options()} if self.reading.text else {}),
        }

    def partitions(self, blocksize: int, weigh_compressed: bool = True) -> list[list[SourceFile]]:
        """Consecutive files grouped up to ``blocksize * GROUP_FRACTION`` bytes on disk (a larger file alone), a
        compressed text file weighed as ``text.COMPRESSED_RATIO`` times its size (``weigh_compressed``).

        An uncompressed text file larger than that is cut into byte ranges of that size, one partition each.

        >>> plan = SourcePlan(None, tuple(SourceFile(str(k), size, "") for k, size in enumerate([5, 5, 20, 1])), None)
        >>> [[f.path for f in group] for group in plan.partitions(blocksize=160)]
        [['0', '1'], ['2'], ['3']]
        """
        options = self.reading.text if self.reading is not None else None
        if options is not None and options.format in text.TEXT_FORMATS and blocksize > text.MAX_BLOCKSIZE:
            raise ValueError(
                f"blocksize must be at most {text.MAX_BLOCKSIZE // 2**20:,} MiB for text, whose block is one Arrow "
                f"array a task holds, got {blocksize:,} bytes"
            )
        limit = blocksize * GROUP_FRACTION
        groups: list[list[SourceFile]] = []
        size = 0
        weight = self._weight if weigh_compressed else lambda f: f.size
        for f in self._ranges(max(1, int(limit))):  # (a blocksize under 16 bytes: ranges of one byte)
            weighs = weight(f)
            if groups and size + weighs <= limit:
                groups[-1].append(f)
                size += weighs
            else:
                groups.append([f])
                size = weighs
        return groups

    def _weight(self, f: SourceFile) -> int:
        """What a file weighs in a task: its size, or for compressed text the text it holds, roughly.  Grouped by
        their size on disk, 20,000 JSON lines files of a few kB gzipped made 3 tasks, for a cluster of any size."""
        compressed = self.reading is not None and self.reading.text is not None and text.compression_of(f.path)
        return f.size * text.COMPRESSED_RATIO if compressed else f.size


def plan_sources(
    source: str | list[str],
    storage_options: dict | None = None,
    *,
    partitioning="hive",
    schema: str = "strict",
    version: int | None = None,
    stray_files: str = "skip",
    format: str = "auto",
    read_options: dict | None = None,
    written_as: str | None = None,
) -> SourcePlan:
    """The plan of what ``source`` names: see ``shuffle_parquet`` for the arguments.

    ``written_as``: the output format the rows go to.  JSON lines written out
    as JSON lines are read as written (``TextOptions.as_written``), and a CSV
    written out as a CSV each value as its text (``TextOptions.as_text``),
    where the read options do not say and nothing asks for parsed rows (a
    declared type; for JSON lines, partition folders).

    >>> plan = plan_sources("lake/events/", schema="unify")  # doctest: +SKIP
    >>> plan.schema.names, len(plan.files)  # doctest: +SKIP
    (['id', 'v', 'year'], 2000)
    """
    source = as_urls(source)
    first = source[0] if isinstance(source, (list, tuple)) and source else source
    with reaching(*filesystem(first, storage_options), "source"):
        return _plan_sources(
            source, storage_options, partitioning, schema, version, stray_files, format, read_options, written_as
        )


def _plan_sources(
    source, storage_options, partitioning, schema, version, stray_files, format, read_options, written_as
) -> SourcePlan:
    schemas.check_policy(schema)
    if stray_files not in ("skip", "error"):
        raise ValueError(f"stray_files must be 'skip' or 'error', got {stray_files!r}")
    urls = list(source) if isinstance(source, (list, tuple)) else [source]
    if not urls:
        raise ValueError("source is an empty list")
    if format not in ("auto", *text.FORMATS):
        raise ValueError(f"format must be auto or one of {', '.join(text.FORMATS)}, got {format!r}")
    if read_options and format == "parquet":
        raise ValueError("read_options apply to text formats (csv, tsv, jsonl, lines), not parquet")
    fs = filesystem(urls[0], storage_options)[0]
    table = _single_table(urls, storage_options, version) if format in ("auto", "parquet") else None
    if table is not None:
        return _table_plan(fs, table, urls[0], asked=version is not None)
    if version is not None:
        raise ValueError(f"version={version!r} applies to Delta and Iceberg tables, and {urls[0]!r} is not one")
    declared = hive.parse_partitioning(partitioning)
    detected = format == "auto"  # (else a file named alone, or by a glob of its suffix, is read as that format)
    listed = [
        listing.list_source(url, storage_options, format=_listed_format(format), guessed=detected) for url in urls
    ]
    if detected:
        format = _format_of(listed, urls)
        if format != "parquet":  # the files named so; one without an extension (LICENSE) is not data then
            listed = [_named_only(listing.list_source(url, storage_options, format=format), format) for url in urls]
    if format != "parquet" and schema != "strict":
        raise ValueError(
            f"schema={schema!r} applies to Parquet: the rows of {format} files take the first file's columns and types"
        )
    others = [url for url, item in zip(urls, listed, strict=True) if type(item.fs) is not type(fs)]
    if others:
        raise ValueError(f"sources must share one filesystem: {others[0]!r} is not on that of {urls[0]!r}")
    files, strays, sidecars = _collect(listed, urls)
    hidden = {name for item in listed for name in item.hidden}
    kind = "Parquet" if format == "parquet" else format
    if stray_files == "error" and strays:
        why = _NOT_READ if strays[0] in hidden else f"is not a {kind} file"
        raise ValueError(f"{strays[0]!r} {why} (stray_files='skip', the default, skips such files)")
    if not files:
        named_alone = all(item.root == "" for item in listed)  # (files named, not folders or globs)
        raise FileNotFoundError(_no_files(urls, kind, strays, hidden, detected, named_alone))
    key_fields = hive.key_schema([k for _, k in files], declared, [full_url(fs, info["name"]) for info, _ in files])
    infos = [info for info, _ in files]
    stamps = file_stamps(infos)
    keys = _key_tuples(fs, [(info["name"], pairs) for info, pairs in files], key_fields)
    source_files = [
        SourceFile(info["name"], int(info.get("size") or 0), stamp, file_keys, listed=FileVersion.listed(fs, info))
        for (info, _), stamp, file_keys in zip(files, stamps, keys, strict=True)
    ]
    if format != "parquet":
        asked = text.TextOptions.of(format, read_options)
        options = _as_output_keeps(asked, key_fields, written_as)
        try:
            reading = _text_reading(fs, source_files, key_fields, options)
        except ValueError as e:
            if not (
                written_as == "jsonl" and asked.as_written is None and len(key_fields) and "JSON parse error" in str(e)
            ):
                raise
            raise ValueError(
                f"{e} (the lines are parsed, not kept as written, because their key=value folders add the columns "
                f"{key_fields.names}: partitioning='none' (--partitioning none) keeps them as written)"
            ) from None
        return SourcePlan(fs, tuple(source_files), reading, tuple(strays))
    metadata, stale = (
        _sidecar_metadata(fs, sidecars, source_files) if len(listed) == 1 else (None, "")
    )  # (its folder's)
    reading = _reading(fs, source_files, key_fields, schema, metadata, inferred=isinstance(declared, str))
    typed = pa.schema([reading.schema.field(n) for n in key_fields.names])
    if typed != key_fields:  # keys the files hold, typed as they do: their folders' values again, so typed
        keys = _key_tuples(fs, [(f.path, pairs) for f, (_, pairs) in zip(source_files, files, strict=True)], typed)
        source_files = [dataclasses.replace(f, keys=k) for f, k in zip(source_files, keys, strict=True)]
    return SourcePlan(fs, tuple(source_files), reading, tuple(strays), None, metadata, notes=(stale,) if stale else ())


_NOT_READ = (
    "is not read: a name starting with '.' or '_', or in a folder so named, marks what is not data (as for Spark "
    "and pyarrow)"
)


def _no_files(
    urls: list[str], kind: str, strays: list[str], hidden: set[str], detected: bool, named_alone: bool = False
) -> str:
    """Why a source matches no data file: none there, only files of other formats (the format to give, where
    they may be text or were named alone; the glob that reads a folder's files by another name), or only files
    under names starting with . or _."""
    source = urls[0] if len(urls) == 1 else urls
    said = f"{kind} files" if strays or not detected else "files"  # an empty folder is of no format
    others = [name for name in strays if name not in hidden]
    if not others and strays:
        return f"source {source!r} matches no {said}: {strays[0]!r} {_NOT_READ}; rename it to read it"
    if not others:
        return f"source {source!r} matches no {said}"
    # (a log, app.log, or text by another name: the format its name does not say is to be given)
    text_like = detected and not listing.is_stray(posixpath.basename(others[0]), "lines")
    if text_like:
        hint = "; to read them as text, give their format (format='lines', --format lines; or csv, tsv, jsonl)"
    elif detected and named_alone:  # (p1.dat, named: its name says no format)
        hint = "; to read it, give its format (format=, --format: parquet, csv, tsv, jsonl, lines, arrow, orc)"
    elif detected:  # (a folder of pictures: no advice)
        hint = ""
    else:  # (JSON lines named .txt in a folder: a folder's files are taken by their names)
        folder = source.rstrip("/") if isinstance(source, str) else "folder"
        below = posixpath.basename(posixpath.dirname(others[0])) != posixpath.basename(folder)  # (in a subfolder)
        glob = f"{folder}/{'**/' if below else ''}*{posixpath.splitext(others[0])[1] or '.txt'}"
        hint = f"; to read files named otherwise as {kind}, name them with a glob of their suffix ({glob!r})"
    return f"source {source!r} matches no {said} (only files that are not {kind}, such as {others[0]!r}){hint}"


def _as_output_keeps(options: text.TextOptions, key_fields: pa.Schema, written_as: str | None) -> text.TextOptions:
    """The read options, with what the output keeps of the text where they do not say: JSON lines as written, a
    CSV's values as their text."""
    if options.as_written and len(key_fields):
        raise ValueError(
            f"read option as_written keeps JSON lines as written, and key=value folders would add the columns "
            f"{key_fields.names}: pass partitioning='none' (--partitioning none), or as_written=false"
        )
    if options.format in ("csv", "tsv") and options.as_text is None:
        return dataclasses.replace(options, as_text=written_as == "csv" and not options.column_types)
    if options.format != "jsonl" or options.as_written is not None:
        return options
    keep = written_as == "jsonl" and not options.column_types and not len(key_fields)
    return dataclasses.replace(options, as_written=keep)


def _named_only(item: listing.Listed, format: str) -> listing.Listed:
    is_named = [text.detect(info["name"])[0] == format for info in item.files]  # (once each: 40,000 files)
    named = [info for info, yes in zip(item.files, is_named, strict=True) if yes]
    others = [full_url(item.fs, info["name"]) for info, yes in zip(item.files, is_named, strict=True) if not yes]
    return dataclasses.replace(item, files=named, strays=[*item.strays, *others])


def _listed_format(format: str) -> str:
    return "parquet" if format == "auto" else format


def _format_of(listed: list[listing.Listed], urls: list[str]) -> str:
    """What the files say: Parquet if any is named so or, without an extension (Hive's 000000_0), starts
    as Parquet does; else the one text format their names say (a LICENSE beside CSV files is not data)."""
    names = [info["name"] for item in listed for info in item.files]
    if any(text.detect(name)[0] == "parquet" for name in names):
        _refuse_data_beside_parquet(listed, urls)
        return "parquet"
    named = {text.detect(name)[0] for name in names} - {None}
    if len(named) == 1 and named != {"parquet"}:  # data by its folder's layout (save_to_disk's Arrow files)
        return named.pop()
    if names and (_starts_as_parquet(listed[0].fs, names[0]) or not any(_shown_strays(item) for item in listed)):
        return "parquet"
    said = sorted({text.detect(name)[0] for item in listed for name in _shown_strays(item)} - {None, "parquet"})
    if len(said) > 1:
        raise MixedFormatsError(
            f"source {urls[0] if len(urls) == 1 else urls!r} holds files of several formats ({', '.join(said)})"
        )
    return said[0] if said else "parquet"


# Names that say data, beside Parquet files: read alone, they would be skipped as strays.  Not .json or .txt,
# which lakes hold beside their data (dataset_info.json, README.txt).
_DATA_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".tsv", ".arrow", ".feather", ".orc")


def _refuse_data_beside_parquet(listed: list[listing.Listed], urls: list[str]) -> None:
    """Parquet files beside files named as data of another format (a corpus of JSON-lines shards with a
    Parquet file of metadata): refused, since reading the Parquet alone skipped every shard as not data, and
    the run verified what it read."""
    others = [name for item in listed for name in _shown_strays(item)
              if text.uncompressed_name(posixpath.basename(name))[0].lower().endswith(_DATA_SUFFIXES)]  # fmt: skip
    if others:
        kinds = sorted({text.detect(posixpath.basename(name))[0] for name in others})
        raise MixedFormatsError(
            f"source {urls[0] if len(urls) == 1 else urls!r} holds Parquet files and {', '.join(kinds)} files "
            f"({others[0]}{', ...' if len(others) > 1 else ''})"
        )


def _shown_strays(item: listing.Listed) -> list[str]:
    """The strays of a listing that say what the source holds: not those under names starting with . or _."""
    return [name for name in item.strays if name not in item.hidden]


class MixedFormatsError(ValueError):
    """A source holding data files of several formats: which to read is the caller's to say.  ``found`` says
    what it holds; the message, how to choose."""

    def __init__(self, found: str):
        super().__init__(f"{found}: pass format= (--format) to say which to read")
        self.found = found


def _starts_as_parquet(fs, path: str) -> bool:
    with fs.open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def _text_reading(fs, files: list[SourceFile], key_fields: pa.Schema, options: text.TextOptions) -> Reading:
    """The rows of text files: the columns of the first non-empty file's first MiB, then the partition keys."""
    first = next((f for f in files if f.size), files[0])
    if options.format in arrowfiles.FORMATS:
        data = arrowfiles.schema(fs, first.path, options.format)
    else:  # the first file with rows: a CSV shard of a header alone would make every column null
        for candidate in [f for f in files if f.size][:SCHEMA_CANDIDATES] or [first]:
            data, rows = text.infer_schema(fs, candidate.path, options)
            first = candidate
            if rows:
                break
    clashes = [n for n in key_fields.names if n in data.names]
    if clashes:
        raise ValueError(
            f"column {clashes[0]!r} of {full_url(fs, first.path)!r} is also a partition folder key: pass "
            "partitioning='none' (--partitioning none) to read the files' column and ignore the folders"
        )
    # (the first file's schema metadata, as for Parquet: an Arrow file's, a Hugging Face dataset's features)
    schema = pa.schema([*data, *key_fields], metadata=data.metadata)
    return Reading(schema, "strict", full_url(fs, first.path), text=options)


def _single_table(urls, storage_options, version) -> tables.TableFiles | None:
    found = []
    for url in urls:
        fs, path = filesystem(url, storage_options)
        fmt = tables.table_format(fs, path) if fs.isdir(path) else None
        if fmt is not None:
            found.append((fmt, url))
    if not found:
        return None
    if len(urls) > 1:
        article = "an" if found[0][0][0] in "aeiou" else "a"
        raise ValueError(f"{found[0][1]!r} is {article} {found[0][0]} table: give it as the only source")
    fmt, url = found[0]
    return tables.read_table(fmt, url, storage_options, version)


def _table_plan(fs, table: tables.TableFiles, url: str, asked: bool) -> SourcePlan:
    """``asked``: the version was asked for (an older one, whose files a vacuum may have removed since; the
    current one's are there, and looking costs a listing of every partition folder)."""
    if not table.files:
        raise FileNotFoundError(f"the {table.description} at {url!r} has no data files")
    if asked:
        _refuse_files_gone(fs, table, url)
    files = tuple(SourceFile(path, size, stamp, tuple(keys.items())) for path, size, stamp, keys in table.files)
    reading = Reading(
        table.schema, "table", f"{url} ({table.description})", tuple(table.field_ids.items()),
        name_ids=tuple(table.name_ids.items()),
    )  # fmt: skip
    return SourcePlan(fs, files, reading, (), table.description, version=table.version)


def _refuse_files_gone(fs, table: tables.TableFiles, url: str) -> None:
    """A table's version whose files were removed since (a Delta vacuum, Iceberg's expired snapshots) cannot be
    read again: said so, before any task, not as the raw error of the first file missing."""
    paths = [path for path, *_ in table.files]
    gone = [path for path, info in zip(paths, listed_infos(fs, paths), strict=True) if info is None]
    if gone:
        more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
        raise FileNotFoundError(
            f"the {table.description} of {url!r} lists files that are gone ({full_url(fs, gone[0])}{more}): "
            "removed since by a vacuum or an expiry of snapshots, so its rows cannot be read again"
        )


def _collect(listed: list[listing.Listed], urls: list[str]):
    """(info, partition folder pairs) of every data file, the strays, the sidecars; a table inside is refused,
    and a file two of the sources ``urls`` name."""
    files, seen, strays, sidecars = [], {}, [], {}
    seen_local: dict[tuple[int, int], tuple[str, str]] = {}  # (device, inode): (path, source), of several sources
    for item, url in zip(listed, urls, strict=True):
        if item.table_above:  # (first: a glob inside a table sees the table's log below its root too)
            raise ValueError(
                f"the source lies inside the table {full_url(item.fs, item.table_above)!r}: give the table folder "
                "as the source (its folder holds files of other versions, and its log, which are not its rows)"
            )
        if item.nested_table:
            raise ValueError(
                f"{full_url(item.fs, item.nested_table)!r} is a table: give it as the source, not a folder above it"
            )
        for info in item.files:
            name = info["name"]
            if name in seen:
                raise ValueError(f"{full_url(item.fs, name)!r} is named by two sources: {seen[name]!r} and {url!r}")
            seen[name] = url
            if len(urls) > 1 and is_local(item.fs):
                _refuse_linked_twice(name, url, seen_local)
            files.append((info, hive.folder_keys(name)))
        strays += item.strays
        sidecars = sidecars or item.sidecars
    return files, strays, sidecars


def _refuse_linked_twice(path: str, url: str, seen: dict[tuple[int, int], tuple[str, str]]) -> None:
    """Refuse a local file that another source names under another name (a linked folder, a hard link): by
    device and inode, as the window knows its files; by name, a file in ``day1/`` and ``day1-link/`` was read
    twice, and verified."""
    try:
        found = os.stat(path)
    except OSError:  # (a link to nothing: its read names it)
        return
    other = seen.setdefault((found.st_dev, found.st_ino), (path, url))
    if other[0] != path:

        def said(file: str, source: str) -> str:
            return repr(file) if source == file else f"{file!r} (in source {source!r})"

        raise ValueError(
            f"{said(path, url)} is {said(*other)} under another name, through a link: its rows would be read "
            "twice; name it once"
        )


def _key_tuples(fs, files: list[tuple[str, list[tuple[str, str]]]], key_fields: pa.Schema) -> list[tuple]:
    """The typed key values of each file ``(path, its folders' pairs)``, typed once a folder: 30,000 files in 300
    folders cast 60,000 values one by one.  The files of a folder share one tuple."""
    typed: dict[tuple, tuple] = {}
    found = []
    for path, pairs in files:
        folder = tuple(pairs)
        if folder not in typed:
            values = hive.key_values(pairs, key_fields, full_url(fs, path))
            typed[folder] = tuple(zip(key_fields.names, values, strict=True))
        found.append(typed[folder])
    return found


def _sidecar_metadata(fs, sidecars: dict[str, str], files: list[SourceFile]) -> tuple[pq.FileMetaData | None, str]:
    """A ``_metadata`` sidecar's footer, if it names exactly the files listed, and else None and why.

    A summary left from an earlier write names other files, or none (schema
    only): trusted, it planned 1 pile for 20 files' rows, and refused files
    that all agreed for a column it did not have.  Spark ignores summaries by
    default (``spark.sql.parquet.respectSummaryFiles``); DuckDB and
    ``pyarrow.dataset`` never read them.
    """
    path = sidecars.get("_metadata")
    if not path:
        return None, ""
    metadata = read_parquet(fs, path, pq.read_metadata)
    folder = posixpath.dirname(path)
    named = {
        posixpath.normpath(posixpath.join(folder, metadata.row_group(g).column(0).file_path))
        for g in range(metadata.num_row_groups)
        if metadata.num_columns
    }
    listed = {posixpath.normpath(f.path) for f in files}
    if named == listed or (named < listed and not any(_schemas_and_rows(fs, sorted(listed - named))[1])):
        return metadata, ""  # (a file of no rows may have no row group, which a summary cannot name)
    return None, (
        f"{full_url(fs, path)!r} names {len(named & listed):,} of the {len(listed):,} files listed"
        + (f" and {len(named - listed):,} others" if named - listed else "")
        + ": it describes an earlier state of the folder, and is not used to plan"
    )


def _reading(
    fs, files: list[SourceFile], key_fields: pa.Schema, policy: str, metadata, inferred: bool = False
) -> Reading:
    """The plan's schema: the reference file's (strict) or the union of all (unify), then the partition keys.

    A key the files hold as a column too (Polars' ``partition_by`` writes
    both) keeps its place in them, and, unless declared, their type: a date,
    a boolean or an Enum, not the string its folders spell.
    """
    if policy == "unify":
        footers = _schemas(fs, [f.path for f in files])
        data = schemas.unify([schemas.without_views(f) for f in footers], [full_url(fs, f.path) for f in files])
        reference = "the union of the files' schemas"
    elif metadata is not None:
        refuse_unwritable(metadata, "_metadata")
        data, reference = arrow_schema(metadata), "_metadata"
    else:
        data, reference = _reference_schema(fs, files)
    if schemas.GEO in (data.metadata or {}) and len(files) > 1:  # (each file's says its own rows' extent)
        data = schemas.with_geo_of_all(data, *_schemas_and_rows(fs, [f.path for f in files]))
    data = schemas.nullable(schemas.without_range_index(schemas.without_views(data)))
    _refuse_keys_differing_in_case(key_fields, data, reference)
    # A column the folders name too (polars' partition_by writes both): taken from the folders, each file's
    # checked to hold their value as it is read (``schemas.Conformer``)
    held = {n: data.field(n) if inferred else key_fields.field(n) for n in key_fields.names if n in data.names}
    data = pa.schema(
        [held.get(f.name, f) for f in data if f.name not in key_fields.names or f.name in held], metadata=data.metadata
    )
    schema = pa.schema([*data, *(f for f in key_fields if f.name not in held)], metadata=data.metadata)
    schema = schemas.without_stale_spark_schema(schema, unified=policy == "unify")
    return Reading(schema, policy, reference)


def _refuse_keys_differing_in_case(key_fields: pa.Schema, data: pa.Schema, reference: str) -> None:
    """A ValueError for a key=value folder whose key is a column of the files in another case (``Year=2024``
    over a column ``year``): kept apart, the result had both, which Spark refuses to read, and the check that
    the files' values are their folders' (made where the names are equal) was skipped.  Spark, Hive and DuckDB
    read them as one column."""
    columns = {name.casefold(): name for name in data.names}
    for key in key_fields.names:
        column = columns.get(key.casefold())
        if column is not None and key not in data.names:  # (the key's own spelling among them: checked as such)
            said = reference if reference.startswith("the union") else repr(reference)  # (else a file's URL)
            raise ValueError(
                f"partition folders' key {key!r} and column {column!r} of {said} differ only in case: the "
                "result would hold both, which Spark refuses to read, and Spark, Hive and DuckDB read them as one; "
                "rename the folders or the column to one spelling (or partitioning='none', --partitioning none, "
                "keeps the folders' keys out)"
            )


def _reference_schema(fs, files: list[SourceFile]) -> tuple[pa.Schema, str]:
    """The schema of the first file that has rows (a zero-row file may have written its columns as null); if
    none has, of the first with no null column, else of the first file."""
    fallback = None
    for f in files:
        with open_parquet(fs, f.path) as parquet:  # its schema_arrow maps Parquet's logical types (UUID) as reads do
            refuse_unwritable(parquet.metadata, full_url(fs, f.path))
            found = parquet.schema_arrow, full_url(fs, f.path)
            if parquet.metadata.num_rows:
                return found
        if fallback is None or (pa.null() in fallback[0].types and pa.null() not in found[0].types):
            fallback = found
    return fallback


def _schemas_and_rows(fs, paths: list[str]) -> tuple[list[pa.Schema], list[int]]:
    """Every file's schema (with its metadata) and rows, by its footer, read concurrently."""

    def read(path):
        footer = read_parquet(fs, path, pq.read_metadata)
        return footer.schema.to_arrow_schema(), footer.num_rows

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        found = list(pool.map(read, paths))
    return [schema for schema, _ in found], [rows for _, rows in found]


def _schemas(fs, paths: list[str]) -> list[pa.Schema]:
    """Every file's schema, read concurrently (on an object store each is a request)."""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda p: _checked_schema(fs, p), paths))


def _checked_schema(fs, path: str) -> pa.Schema:
    """A file's Arrow schema, as its rows are read, or ValueError naming a column the output could not hold;
    its columns stored as INT96 marked (``schemas.INT96``), for ``schemas.unify``."""
    with open_parquet(fs, path) as parquet:
        refuse_unwritable(parquet.metadata, full_url(fs, path))
        return schemas.marked_int96(parquet.schema_arrow, parquet.schema)
