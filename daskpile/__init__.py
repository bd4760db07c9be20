"""daskpile: uniformly shuffle datasets larger than memory, on Dask.

>>> import daskpile, dask.dataframe as dd
>>> daskpile.shuffle(dd.read_parquet("data/"), piles=8).to_parquet("shuffled-ddf/")
>>> daskpile.shuffle_parquet("data/", "out/", piles=8, seed=1).rows  # (a seed: the same checks every run)
30000
>>> daskpile.quality("out/", order_column="id").ok
True
"""

__version__ = "0.1.0"


# Where each public name lives.  They are imported on first use: the command line then handles a Ctrl-C
# from its first instant (see daskpile.__main__), and dask.dataframe, which takes over a second to import,
# is needed by shuffle(ddf) only: not by shuffle_parquet, the command line, or a worker running a pass.
_PUBLIC = {
    "DestBusyError": "daskpile.engine._lease",
    "FileChangedError": "daskpile._storage",
    "Fingerprint": "daskpile.checks._fingerprint",
    "NoWorkerRunning": "daskpile._compute",
    "PileLoader": "daskpile.loader",
    "PilePlan": "daskpile.engine._sizing",
    "PileTooLargeError": "daskpile.engine._sizing",
    "QualityCheck": "daskpile.checks._quality",
    "QualityReport": "daskpile.checks._quality",
    "RunMismatchError": "daskpile.engine._pipeline",
    "ShuffleReport": "daskpile.engine._pipeline",
    "Verification": "daskpile.checks._verify",
    "VerificationError": "daskpile.engine._pipeline",
    "WindowBusyError": "daskpile.window",
    "WindowReport": "daskpile.window",
    "WorkerKilled": "daskpile._compute",
    "append": "daskpile.window",
    "compact": "daskpile.window",
    "discard": "daskpile.window",
    "expire": "daskpile.window",
    "plan_piles": "daskpile.dataframe._expr",
    "quality": "daskpile.checks._quality",
    "read_manifest": "daskpile.engine._manifest",
    "shuffle": "daskpile.dataframe._expr",
    "shuffle_parquet": "daskpile.engine._pipeline",
    "verify": "daskpile.checks._verify",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    import importlib

    if name not in _PUBLIC:
        raise AttributeError(f"module 'daskpile' has no attribute {name!r}")
    module = importlib.import_module(_PUBLIC[name])
    value = getattr(module, "read" if name == "read_manifest" else name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
