"""daskpile: uniformly shuffle datasets larger than memory, on Dask.

>>> import daskpile
>>> daskpile.shuffle(ddf, piles=512).to_parquet("shuffled/")  # doctest: +SKIP
>>> daskpile.shuffle_parquet("s3://lake/table/", "s3://lake/shuffled/", piles=512)  # doctest: +SKIP
"""

from daskpile._dataframe import shuffle
from daskpile._manifest import read as read_manifest
from daskpile._parquet import ShuffleReport, shuffle_parquet

__all__ = ["ShuffleReport", "read_manifest", "shuffle", "shuffle_parquet"]
__version__ = "0.1.0"
