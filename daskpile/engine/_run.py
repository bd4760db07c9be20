"""What identifies a run of ``shuffle_parquet``, so that an interrupted run can be resumed.

A run is (source files with their sizes and modification stamps, piles, seed,
dest, blocksize, rows_per_file).  Its description is written next to its scratch files before pass 1
and into ``dest/_daskpile.run.json`` before pass 2.  Running the same call
again finds it and reuses every finished scratch file and output file; a call
with other arguments is refused instead of mixing two runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath

import fsspec

from daskpile._storage import exists, write_bytes

BANDS = 8  # _scratch.BANDS, the most bands: a run state without "bands" was written in that many

RUN_FILE = "_daskpile.run.json"
STAGING_PREFIX = ".daskpile-staging-"


_SCRATCH_ONLY = ("bands", "row_bytes", "cut_row_groups", "weigh_compressed")  # how pass 1 cut and laid out scratch


@dataclasses.dataclass(frozen=True)
class RunSpec:
    source_files: tuple[str, ...]
    source_stamps: tuple[str, ...]
    piles: int
    seed: int
    dest: str
    blocksize: int
    rows_per_file: int | None = None
    schema_key: str | None = None  # the schema the rows are read into, and the policy that made it
    second_pass: str = "eager"  # "lazy": piles written unpermuted, for PileLoader to permute on load
    output: str = "parquet"  # the files' format and compression, "lines:zstd"
    bands: int = BANDS  # of scratch (``_scratch.bands_for``): decided from the source, kept when resumed
    row_bytes: int = 0  # ``Reading.row_bytes``, which cuts the pieces: decided from the source, kept when resumed
    cut_row_groups: bool = True  # ``Reading.cut_row_groups``: False in runs begun before it, kept when resumed
    # ``SourcePlan.partitions``' weigh_compressed, which groups the files into tasks: False in runs begun before it
    weigh_compressed: bool = True

    def to_json(self) -> dict:
        return {
            "source_files": list(self.source_files),
            "source_stamps": list(self.source_stamps),
            "piles": self.piles,
            "seed": self.seed,
            "dest": self.dest,
            "blocksize": self.blocksize,
            "rows_per_file": self.rows_per_file,
            "schema_key": self.schema_key,
            "second_pass": self.second_pass,
            **({"output": self.output} if self.output != "parquet" else {}),  # the keys of Parquet runs as they were
            **({"bands": self.bands} if self.bands != BANDS else {}),  # (and of runs in 8 bands)
            **({"row_bytes": self.row_bytes} if self.row_bytes else {}),
            **({"cut_row_groups": True} if self.cut_row_groups else {}),
            **({"weigh_compressed": True} if self.weigh_compressed else {}),
        }

    def call_json(self) -> dict:
        """What a manifest records of the call: ``to_json`` without what only the run's scratch needs."""
        return {key: value for key, value in self.to_json().items() if key not in _SCRATCH_ONLY}

    @classmethod
    def from_json(cls, data: dict) -> RunSpec:
        files, stamps = tuple(data["source_files"]), tuple(data["source_stamps"])
        rows_per_file = data.get("rows_per_file")
        return cls(
            files,
            stamps,
            int(data["piles"]),
            int(data["seed"]),
            data["dest"],
            int(data["blocksize"]),
            rows_per_file,
            data.get("schema_key"),
            data.get("second_pass", "eager"),
            data.get("output", "parquet"),
            int(data.get("bands", BANDS)),
            int(data.get("row_bytes", 0)),
            bool(data.get("cut_row_groups", False)),
            bool(data.get("weigh_compressed", False)),
        )

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def staging(self) -> str:
        """The directory in dest where an overwrite writes its parts, beside the result it replaces."""
        return STAGING_PREFIX + self.key()

    def differences(
        self,
        source_files,
        source_stamps,
        piles: int | None,
        seed: int | None,
        blocksize: int,
        rows_per_file=None,
        schema_key: str | None = None,
        second_pass: str = "eager",
        output: str = "parquet",
        still_there=lambda url: True,
    ) -> list[str]:
        """How a new call differs from this run; [] if it can resume it (None: adopt the run's value).

        ``still_there(url)``: whether a source file of the run's, not among this call's, exists still (removed:
        the source changed; there: another call, of some of its files, or of others).
        """
        found = []
        if tuple(source_files) != self.source_files:
            now, then = set(source_files), set(self.source_files)
            new, gone = sorted(now - then), sorted(then - now)
            removed = [url for url in gone if not still_there(url)]
            said = f"{len(source_files):,} now, {len(self.source_files):,} then"
            if removed or (new and not gone):  # the same call cannot resume it (it was told to run it again)
                named = f"{removed[0]} is gone" if removed else f"{new[0]} is new"
                found.append(f"source files changed since: {said} ({named})")
            else:
                missing = f": {gone[0]} is not among them" if gone else ""
                found.append(f"other source files ({said}{missing})")
        elif tuple(source_stamps) != self.source_stamps:
            changed = [f for f, a, b in zip(source_files, source_stamps, self.source_stamps, strict=True) if a != b]
            found.append(f"source files changed since: {', '.join(changed[:3])}")
        if piles is not None and piles != self.piles:
            found.append(f"piles {piles} instead of {self.piles}")
        if seed is not None and seed != self.seed:
            found.append(f"seed {seed} instead of {self.seed}")
        if blocksize != self.blocksize:
            found.append(f"blocksize {blocksize:,} bytes instead of {self.blocksize:,}")
        if rows_per_file != self.rows_per_file:
            found.append(f"rows_per_file {rows_per_file} instead of {self.rows_per_file}")
        if schema_key != self.schema_key:
            found.append(
                "another schema (schema=, partitioning=, format= or read options, or the files' schemas changed)"
            )
        if second_pass != self.second_pass:
            found.append(f"second_pass {second_pass!r} instead of {self.second_pass!r}")
        if output != self.output:
            found.append(f"output {output!r} instead of {self.output!r}")
        return found


def scratch_name(dest_url: str) -> str:
    """The scratch directory name of the runs writing to ``dest_url``: stable, so a rerun finds it."""
    return hashlib.sha256(dest_url.encode()).hexdigest()[:16]


class RunFileUnreadable(ValueError):
    """A run file that is not one this daskpile wrote: truncated (a full disk), of another version, or another's.

    ``cause``: the error reading it raised.
    """

    def __init__(self, message: str, cause: Exception):
        super().__init__(message)
        self.cause = cause


def read(fs: fsspec.AbstractFileSystem, directory: str) -> RunSpec | None:
    """The run described in ``directory``; None if there is no run file, ``RunFileUnreadable`` if it cannot be read."""
    path = posixpath.join(directory, RUN_FILE)
    try:
        with fs.open(path, "rb") as f:
            return RunSpec.from_json(json.load(f))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # (json's errors are ValueErrors)
        said = f"run file {path!r} is not one this daskpile can read ({type(e).__name__}: {e})"
        raise RunFileUnreadable(said, e) from None


def write(fs: fsspec.AbstractFileSystem, directory: str, spec: RunSpec) -> None:
    write_bytes(fs, posixpath.join(directory, RUN_FILE), json.dumps(spec.to_json(), indent=1).encode())


def remove(fs: fsspec.AbstractFileSystem, directory: str) -> None:
    path = posixpath.join(directory, RUN_FILE)
    if exists(fs, path):
        fs.rm(path)
