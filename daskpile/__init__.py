"""daskpile: uniformly shuffle datasets larger than memory, on Dask.

>>> import daskpile
>>> daskpile.shuffle(ddf, piles=512).to_parquet("shuffled/")  # doctest: +SKIP
>>> daskpile.shuffle_parquet("s3://lake/table/", "s3://lake/shuffled/", piles=512)  # doctest: +SKIP
>>> daskpile.quality("s3://lake/shuffled/", order_column="id")  # doctest: +SKIP
"""

from daskpile._manifest import read as read_manifest
from daskpile._parquet import PileTooLargeError, RunMismatchError, ShuffleReport, VerificationError, shuffle_parquet
from daskpile._quality import QualityReport, quality
from daskpile._verify import Verification, verify

__all__ = [
    "PileTooLargeError",
    "QualityReport",
    "RunMismatchError",
    "ShuffleReport",
    "Verification",
    "VerificationError",
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
