"""The pile shuffle of files, from a planned source to a committed result.

A run (``_pipeline``) is a list of steps: check the places (``_places``),
read what dest holds (``_dest``) under its lease (``_lease``), find the
interrupted run to resume (``_run``), size the piles (``_sizing``), then the
two passes (``_passes``) through scratch (``_scratch``), each pile written in
its output format (``_outputs``), and the manifest (``_manifest``) written
last.  ``_clean`` removes the scratch that no run can use, and
``shuffle(ddf)``'s scratch whose Python session ended (``_session``).  The same engine
serves ``shuffle_parquet``, the command, ``shuffle(ddf)``'s passes and a
moving window's appends.
"""
