"""Text sources: CSV and TSV, JSON lines, and plain lines, parsed by Arrow from blocks of whole lines.

A file is read in blocks that start and end on a line boundary, as Dask's
``read_bytes`` with a delimiter cuts them (``fsspec``'s ``read_block``): a line
belongs to the block in which it starts, so a line longer than a block still
lands whole in exactly one.  An uncompressed file larger than a task's share
is cut into byte ranges, one pass-1 task each; a compressed file cannot be
cut, and is read by one task, streaming, a block at a time.

Each format turns a block into an Arrow table in the plan's schema:

- ``lines``: one row per line, a single binary column ``line`` holding the
  line's bytes exactly, without its ``\\n`` (a ``\\r`` before it stays, as in
  GNU ``shuf``); empty lines are rows;
- ``csv``/``tsv``: pyarrow's CSV reader, the column names from the first
  file's header (or ``f0``, ``f1``, ... without one), the types inferred from
  its first MiB unless declared;
- ``jsonl``: pyarrow's JSON-lines reader, the schema inferred from the first
  file's first MiB unless declared.  A field that the schema does not have is
  an error, not dropped.  With ``as_written``, the rows are the lines
  themselves, each checked to be one JSON object (``json_lines_table``): what
  a shuffle from JSON lines to JSON lines keeps, byte for byte.

The package, one module per concern, in the order they build on each other:
``formats`` (names, extensions, options, decompression), ``lines`` (blocks of
lines as Arrow, the newline scans), ``schema`` (inference from the first
MiB), ``blocks`` (byte ranges and streams parsed into the plan's schema) and
``sizing`` (the size in memory, for ``piles="auto"``).  What the rest of
daskpile uses is imported here.
"""

from daskpile.sources.text.blocks import BlockReader
from daskpile.sources.text.formats import (
    FORMATS,
    JSON_TEXT,
    MAX_BLOCKSIZE,
    PARQUET_EXTENSIONS,
    SAMPLE_BYTES,
    TEXT_FORMATS,
    TextOptions,
    compression_of,
    detect,
    is_json_text,
    open_decompressed,
    splittable,
    uncompressed_name,
)
from daskpile.sources.text.lines import SCAN_BYTES, first_newline, line_offsets, lines_table
from daskpile.sources.text.schema import infer_schema
from daskpile.sources.text.sizing import COMPRESSED_RATIO, STREAM_PEAK_BLOCKS, estimate

__all__ = [
    "COMPRESSED_RATIO",
    "FORMATS",
    "JSON_TEXT",
    "MAX_BLOCKSIZE",
    "PARQUET_EXTENSIONS",
    "SAMPLE_BYTES",
    "SCAN_BYTES",
    "STREAM_PEAK_BLOCKS",
    "TEXT_FORMATS",
    "BlockReader",
    "TextOptions",
    "compression_of",
    "detect",
    "estimate",
    "first_newline",
    "infer_schema",
    "is_json_text",
    "line_offsets",
    "lines_table",
    "open_decompressed",
    "splittable",
    "uncompressed_name",
]
