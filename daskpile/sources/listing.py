"""Which files a source names: directories, globs and files, as many as given, on any fsspec filesystem.

A lake holds more than data.  Names starting with ``.`` or ``_`` (``_SUCCESS``,
``_committed_*``, ``.crc``, ``_delta_log/``) are never data, except the
``_metadata`` and ``_common_metadata`` sidecars, which are kept apart for
planning.  A file whose extension says it is something else (``README.txt``)
is a stray: skipped and listed in the report, or an error with
``stray_files="error"``; so is a file whose name (or folder's) starts with
``.`` or ``_`` but whose extension says the data's format (``_b.txt``,
``_tmp/part-0.jsonl``): not read, as Spark and pyarrow do not, but not
silently either.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re

import fsspec

from daskpile._storage import GLOB_CHARS, as_urls, exists, filesystem, full_url, is_local
from daskpile.sources import tables, text

SIDECARS = ("_metadata", "_common_metadata")
PARQUET_EXTENSIONS = text.PARQUET_EXTENSIONS


@dataclasses.dataclass(frozen=True)
class Listed:
    """One source's files: ``root`` is the directory partition folders are found under ('' for none)."""

    fs: fsspec.AbstractFileSystem
    root: str
    files: list[dict]  # fsspec info dicts (name, size, and a modification stamp)
    sidecars: dict[str, str]  # sidecar name -> path
    strays: list[str]
    nested_table: str | None = None  # a Delta or Iceberg table folder below root
    table_above: str | None = None  # a table folder the source lies inside
    hidden: tuple[str, ...] = ()  # of the strays, those not read for a name (or folder's) starting with . or _


def list_source(
    url: str, storage_options: dict | None = None, role: str = "source", format: str = "parquet", guessed: bool = True
) -> Listed:
    """The data files under one URL (a file, a directory, searched recursively, or a glob), sorted by path.

    ``format`` says which files are data: those whose name says that format, or nothing (a file
    named alone, or matched by a glob naming their suffix, is data whatever its name, unless the format
    is Parquet and was only ``guessed``).
    """
    fs, path = filesystem(url, storage_options)
    named = False  # files the glob matched, which it names as a path names its file
    named_hidden = False  # a glob's last part naming files that start with . or _ ('corpus/_b*.txt'): read
    if any(ch in path for ch in GLOB_CHARS) and not exists(fs, path):  # (a folder may be named "[2024]")
        found = fs.glob(path, detail=True)
        named_hidden = posixpath.basename(path).startswith((".", "_"))
        # ('exports/*.DAT' names its files' suffix, as a path names its file; 'corpus/*' names none)
        named = (format != "parquet" or not guessed) and _NAMED_SUFFIX.search(posixpath.basename(path)) is not None
        if all(info.get("type") == "directory" for info in found.values()):
            named = False
            # a glob of folders only ('lake/day=0[1-5]') names the data in them, as a folder named does; one that
            # matches files reads those alone, as before
            for folder in list(found):
                found.update(fs.find(folder, detail=True))
        found = _with_linked_folders(fs, found, literal_prefix(path))
        root = literal_prefix(path)
        above = tables.table_around(fs, root)
    elif fs.isdir(path):
        found = _with_linked_folders(fs, fs.find(path, detail=True), path)
        root = path.rstrip("/")
        saved = _hugging_face_saved(fs, root, found, url)
        if saved is not None:
            return saved
        above = tables.table_around(fs, posixpath.dirname(root))
        _refuse_splits(found, url)
    else:
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{role} {url!r} {_gone_or_broken(fs, path)}") from None
        if info.get("type") == "other":  # (a pipe, /dev/stdin: fsspec's "File or stream is not seekable")
            raise ValueError(
                f"{role} {url!r} is not a file (a pipe or a device): a shuffle reads its source in ranges and more "
                "than once; write it to a file first (zcat corpus.gz > corpus.txt), or name the file it comes from"
            )
        if format == "parquet" and guessed and is_stray(posixpath.basename(path)):
            return Listed(fs, "", [], {}, [full_url(fs, path)])
        return Listed(fs, "", [info], {}, [], table_above=tables.table_around(fs, posixpath.dirname(path)))
    files, strays, sidecars, hidden = [], [], {}, []
    nested = tables.nested_table(list(found), root)
    for name in sorted(found):
        info = found[name]
        if info.get("type") == "directory" or _is_folder_marker(name, info):
            continue
        relative = name[len(root) :] if root and name.startswith(root) else posixpath.basename(name)
        base = posixpath.basename(name)
        if base in SIDECARS and posixpath.dirname(name) == root:
            sidecars[base] = name
        elif _is_hidden(relative if not named_hidden else posixpath.dirname(relative)):
            if _named_as(base, format):  # (_SUCCESS, .crc and _delta_log/ are said nowhere: they are never data)
                strays.append(full_url(fs, name))
                hidden.append(strays[-1])
        elif base.upper() in NOT_DATA if named else is_stray(base, format):  # ('exports/*.DAT' with csv)
            strays.append(full_url(fs, name))
        elif info.get("islink") and info.get("type") == "other" and not exists(fs, name):  # (its data is missing)
            raise FileNotFoundError(f"{role} file {full_url(fs, name)!r} {_gone_or_broken(fs, name)}")
        else:
            files.append(info)
    return Listed(fs, root, files, sidecars, strays, nested, above, tuple(hidden))


_NAMED_SUFFIX = re.compile(r"\.[^.*?\[\]]+$")  # a glob's last part ending in a literal suffix


def _hugging_face_saved(fs: fsspec.AbstractFileSystem, root: str, found: dict, url: str) -> Listed | None:
    """A folder ``datasets``' ``save_to_disk`` wrote: the Arrow files its ``state.json`` lists, the others
    (the ``cache-*.arrow`` of a ``map`` or ``filter``, which ``load_from_disk`` does not read) skipped; a
    ``DatasetDict``'s folder refused, since reading it whole would mix its splits.  None for another folder."""
    if posixpath.join(root, "dataset_dict.json") in found:
        splits = sorted({n[len(root) + 1 :].split("/")[0] for n in found if n.count("/") > root.count("/") + 1})
        raise ValueError(
            f"source {url!r} is a Hugging Face DatasetDict (splits {', '.join(splits)}): give the folder of the "
            f"split to shuffle ({url.rstrip('/')}/{splits[0] if splits else 'train'}); reading it whole would mix "
            "the splits"
        )
    state = posixpath.join(root, "state.json")
    if state not in found:
        return None
    try:
        with fs.open(state, "rb") as f:
            listed = [posixpath.join(root, entry["filename"]) for entry in json.load(f)["_data_files"]]
    except (ValueError, KeyError, TypeError):
        return None  # (another program's state.json)
    missing = [name for name in listed if name not in found]
    if missing:
        raise FileNotFoundError(f"{full_url(fs, missing[0])!r}, listed in {url}'s state.json, does not exist")
    taken = {*listed, state, posixpath.join(root, "dataset_info.json")}
    strays = [full_url(fs, n) for n in sorted(found) if n not in taken and found[n].get("type") != "directory"]
    return Listed(fs, root, [found[name] for name in listed], {}, strays)


# The files of a split named by shard (data/train-00000-of-00004.parquet, as the Hub and push_to_hub name
# them; c4-validation.00000-of-00008.json.gz, as C4 does): a split's name, after a prefix of the dataset's
_SPLIT_FILE = re.compile(
    r"(?P<split>(?:[\w.-]*[-_.])?(?:train|test|validation|valid|val|dev|eval))(?P<cut>[-.])\d{5}-of-(?P<of>\d{5})"
    r"(\.|$)",
    re.IGNORECASE,
)


def _refuse_splits(found: dict, url: str) -> None:
    """A folder holding the files of more than one split (train-..., test-...): read whole, its test rows
    would be shuffled into its training rows.  Shards of other names (a day's, a language's) are data.

    >>> c4 = {"d/c4-train.00000-of-01024.json.gz": {}, "d/c4-validation.00000-of-00008.json.gz": {}}
    >>> _refuse_splits(c4, "d")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: source 'd' holds the files of the splits c4-train, c4-validation ... ('d/**/c4-train.*'), ...
    >>> _refuse_splits({"d/en-00000-of-00002.parquet": {}, "d/fr-00000-of-00002.parquet": {}}, "d")
    """
    named = [m for m in (_SPLIT_FILE.match(posixpath.basename(n)) for n in found) if m]
    splits = sorted({m["split"] for m in named})
    if len(splits) > 1:
        shown = next((s for s in splits if "train" in s.lower()), splits[0])
        example = next(m for m in named if m["split"] == shown)
        raise ValueError(
            f"source {url!r} holds the files of the splits {', '.join(splits)} (named as "
            f"{example['split']}{example['cut']}00000-of-{example['of']}): name the split to shuffle with a glob "
            f"('{url.rstrip('/')}/**/{shown}{example['cut']}*'), or give each split's glob to shuffle them together"
        )


def _gone_or_broken(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """What is wrong with a path not found: a link whose target is gone, or nothing there."""
    if is_local(fs) and os.path.islink(path):
        return f"is a link to {os.readlink(path)!r}, which does not exist"
    return "does not exist"


def _is_folder_marker(name: str, info: dict) -> bool:
    """An object store's empty object named as a folder (``day=1/``: the S3 console's "Create folder", rclone's;
    ``day=1_$folder$``: Hadoop's S3 file systems and EMR's), which readers of the folder skip.

    >>> _is_folder_marker("lake/day=1/", {"size": 0}), _is_folder_marker("lake/a.parquet", {"size": 0})
    (True, False)
    >>> _is_folder_marker("lake/day=1_$folder$", {"size": 0})
    True
    """
    return name.endswith(("/", "_$folder$")) and not info.get("size")


def _with_linked_folders(fs: fsspec.AbstractFileSystem, found: dict, root: str) -> dict:
    """``found`` with the files in the folders its links point to, as pyarrow.dataset and Dask read them.

    fsspec's local ``find`` lists a link to a folder as one entry (type
    ``"other"``) and does not go in, so a lake whose partition folders are
    links was read as if they were files.  A link to a folder of the source
    itself, or above it, is refused: its files would be read twice, or for ever.
    """
    links = [name for name, info in found.items() if info.get("islink") and fs.isdir(name)]
    if not links:
        return found
    found, taken = dict(found), [os.path.realpath(root)]
    while links:
        link = links.pop(0)
        target = os.path.realpath(link)
        inside = next(
            (t for t in taken if target == t or target.startswith(t + os.sep) or t.startswith(target + os.sep)), None
        )
        if inside is not None:
            raise ValueError(
                f"source folder {link!r} is a link to {target!r}, which the source reads already (in {inside!r}): "
                "its files would be read twice; name the folders to read instead"
            )
        taken.append(target)
        del found[link]
        inner = fs.find(link, detail=True)
        found.update(inner)
        links += [name for name, info in inner.items() if info.get("islink") and fs.isdir(name)]
    return found


def data_files(
    source: str | list[str], storage_options: dict | None = None, role: str = "source"
) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    """The filesystem and Parquet files of URLs (files, directories, globs), in order, strays left out."""
    source = as_urls(source, role)
    listed = [list_source(url, storage_options, role) for url in ([source] if isinstance(source, str) else source)]
    if not listed:
        raise ValueError(f"{role} is an empty list")
    files = [info["name"] for item in listed for info in item.files]
    if not files:
        raise FileNotFoundError(f"{role} {source!r} matches no Parquet files")
    return listed[0].fs, files


def literal_prefix(pattern: str) -> str:
    """The directory part of a glob before its first wildcard: where partition folders start."""
    parts = pattern.split("/")
    literal = []
    for part in parts[:-1]:
        if any(ch in part for ch in GLOB_CHARS):
            break
        literal.append(part)
    return "/".join(literal)


def _is_hidden(relative_path: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative_path.split("/") if part)


def _named_as(name: str, format: str) -> bool:
    """Whether ``name``'s extension says data of ``format``: the format listed, a text format for lines, any
    for Parquet (the format a source is first listed as when it is to be found from the names).

    >>> _named_as("_b.txt", "lines"), _named_as(".part-0.parquet", "parquet"), _named_as("_SUCCESS", "parquet")
    (True, True, False)
    >>> _named_as("part-0.parquet.crc", "parquet"), _named_as("_tmp.jsonl.gz", "jsonl"), _named_as("_b.txt", "csv")
    (False, True, False)
    """
    said = text.detect(name.lstrip("._"))[0]
    if format == "parquet":
        return said is not None
    return said in text.TEXT_FORMATS if format == "lines" else said == format


# Files that sit beside data in the folders people publish (a Hugging Face dataset's LICENSE), named so by
# convention, without an extension that would say they are not data
NOT_DATA = {"LICENSE", "LICENCE", "COPYING", "NOTICE", "AUTHORS", "CONTRIBUTORS", "README", "CHANGELOG", "MAKEFILE"}


# Names of text that say no text format: a log and its rotations (app.log.1, access.log-20261128, app.log.2.gz),
# a program's output, text by another extension
_TEXT_NAMES = re.compile(r".*\.(log|out|err|text)([.-][0-9][0-9-]*)?")


def is_stray(name: str, format: str = "parquet") -> bool:
    """A file whose extension says it is not of ``format`` (``B.PARQUET`` is Parquet), or a LICENSE.

    >>> is_stray("LICENSE", "jsonl"), is_stray("part-0", "jsonl"), is_stray("part-0.jsonl", "jsonl")
    (True, False, False)
    >>> lines = ("part-0.jsonl", "server.log.gz", "app.log.1", "access.log-20261128", "run.out", "part-0")
    >>> [is_stray(n, "lines") for n in (*lines, "p.parquet", "README.md", "model.pt", "report.xlsx", "a.crc")]
    [False, False, False, False, False, False, True, True, True, True, True]
    """
    if name.upper() in NOT_DATA:
        return True
    if format == "lines":  # files named as text (JSON lines, CSV rows, .txt, logs) or not named, as the command asked
        if name.split(".")[0].upper() in NOT_DATA:  # README.txt, LICENSE.md
            return True
        stem = text.uncompressed_name(name)[0]
        named_text = text.detect(name)[0] in text.TEXT_FORMATS or _TEXT_NAMES.fullmatch(stem)
        return not named_text and posixpath.splitext(stem)[1] != ""
    if format != "parquet":
        said = text.detect(name)[0]
        return said != format and (said is not None or is_stray(name))
    if text.detect(name)[0] not in (None, "parquet"):  # data.jsonl.bz2: "bz2" alone would pass for no extension
        return True
    stem = name.lower()
    for compression in (".gz", ".snappy", ".zst", ".zstd", ".lz4", ".brotli"):
        stem = stem.removesuffix(compression)
    if stem.endswith(PARQUET_EXTENSIONS):
        return False
    extension = posixpath.splitext(stem)[1]
    # Spark and Hive file names have dots that are not extensions (part-0000.c000): only
    # short alphabetic suffixes are taken for one.
    return bool(extension) and extension[1:].isalpha() and len(extension) <= 8
