"""``verify``: recompute the fingerprints of a source and a result from the files."""

from __future__ import annotations

import dataclasses

import dask

from daskpile import _fingerprint, _manifest, _passes
from daskpile._compute import compute
from daskpile._fingerprint import Fingerprint
from daskpile._storage import dataset_files


@dataclasses.dataclass(frozen=True)
class Verification:
    """The fingerprints of the source rows and of the result rows, recomputed from the files."""

    source: Fingerprint
    dest: Fingerprint
    manifest: Fingerprint | None

    @property
    def ok(self) -> bool:
        return self.source == self.dest and self.manifest in (None, self.dest)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f"match: the result is a permutation of the source ({self.source.rows:,} rows)"
        lines = [f"MISMATCH: source {self.source}", f"          result {self.dest}"]
        if self.manifest is not None and self.manifest != self.dest:
            lines.append(f"          manifest says {self.manifest}")
        return "\n".join(lines)


def verify(
    source: str | list[str], dest: str, *, storage_options: dict | None = None, progress: bool = False
) -> Verification:
    """Check that the result at ``dest`` holds exactly the rows of ``source``.

    ``dest`` is a daskpile result (the files its manifest lists) or any
    Parquet dataset.  Reads every source file and every output file, in
    parallel on the current Dask client, and compares the order-independent
    fingerprints (row count, sum and xor of 64-bit row hashes).

    >>> result = verify("data/", "shuffled/")  # doctest: +SKIP
    >>> result.ok, result.source.rows  # doctest: +SKIP
    (True, 10000000)
    """
    source_fs, source_files = dataset_files(source, storage_options)
    dest_fs, dest_files, manifest = _manifest.result_files(dest, storage_options)
    recorded = manifest and manifest.get("fingerprint")
    tasks = [dask.delayed(_fingerprint_file)(source_fs, p) for p in source_files]
    tasks += [dask.delayed(_fingerprint_file)(dest_fs, p) for p in dest_files]
    results = compute(tasks, progress=progress)
    return Verification(
        source=_fingerprint.total(results[: len(source_files)]),
        dest=_fingerprint.total(results[len(source_files) :]),
        manifest=Fingerprint.from_json(recorded) if recorded else None,
    )


def _fingerprint_file(fs, path: str) -> Fingerprint:
    return _fingerprint.of(_passes.read_parquet(fs, path))
