"""daskpile: uniformly shuffle datasets larger than memory, on Dask.

>>> import daskpile, dask.dataframe as dd
>>> daskpile.shuffle(dd.read_parquet("data/"), piles=8).to_parquet("shuffled-ddf/")
>>> daskpile.shuffle_parquet("data/", "out/", piles=8).rows
30000
>>> daskpile.quality("out/", order_column="id").ok
True
"""

from daskpile._fingerprint import Fingerprint
from daskpile._manifest import read as read_manifest
from daskpile._parquet import PileTooLargeError, RunMismatchError, ShuffleReport, VerificationError, shuffle_parquet
from daskpile._quality import QualityCheck, QualityReport, quality
from daskpile._sizing import PilePlan
from daskpile._verify import Verification, verify
from daskpile.loader import PileLoader
from daskpile.window import WindowBusyError, WindowReport, append, compact, discard, expire

__all__ = [
    "Fingerprint",
    "PileLoader",
    "PilePlan",
    "PileTooLargeError",
    "QualityCheck",
    "QualityReport",
    "RunMismatchError",
    "ShuffleReport",
    "Verification",
    "VerificationError",
    "WindowBusyError",
    "WindowReport",
    "append",
    "compact",
    "discard",
    "expire",
    "plan_piles",
    "quality",
    "read_manifest",
    "shuffle",
    "shuffle_parquet",
    "verify",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # dask.dataframe takes over a second to import, and only shuffle(ddf) needs it: not
    # shuffle_parquet, the command line, or a worker running pass 1 or pass 2.
    if name in ("shuffle", "plan_piles"):
        from daskpile import _dataframe

        return getattr(_dataframe, name)
    raise AttributeError(f"module 'daskpile' has no attribute {name!r}")
