"""What proves a result: fingerprints of row multisets, ``verify`` and ``quality``.

``_fingerprint`` hashes rows so that a shuffle's input and output compare
without holding either; ``_verify`` recomputes both from the files;
``_quality`` tests how random an order is, from the statistics of
``_order_stats`` over ranks that ``_ranks`` computes on Dask when the order
column is not a dense range.
"""
