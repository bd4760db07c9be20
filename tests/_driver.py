"""A driver process for the resume tests: one shuffle_parquet call on the sync scheduler.

python _driver.py SOURCE DEST SCRATCH PILES SEED BLOCKSIZE [overwrite]
"""

import sys

import dask

import daskpile

if __name__ == "__main__":
    source, dest, scratch, piles, seed, blocksize = sys.argv[1:7]
    overwrite = sys.argv[7:] == ["overwrite"]
    with dask.config.set(scheduler="sync"):
        daskpile.shuffle_parquet(
            source,
            dest,
            piles=int(piles),
            seed=int(seed),
            scratch=scratch,
            overwrite=overwrite,
            blocksize=int(blocksize),
        )
