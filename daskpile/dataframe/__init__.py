"""``shuffle(ddf)``: a Dask DataFrame in, one partition per pile out, as a Dask expression.

``_expr`` holds the ``PileShuffle`` expression and its scratch's lifetime;
``_pandas`` turns pandas partitions into Arrow tables and back, exactly;
``_to_parquet`` is the result's ``to_parquet``, its piles shown together.
"""
