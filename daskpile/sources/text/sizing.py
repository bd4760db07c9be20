"""How large a text source is in memory, for ``piles="auto"``: rows and bytes from the first file's first
MiB, and a compressed file's own ratio."""

from __future__ import annotations

import lzma

import pyarrow as pa

from daskpile.sources.text.blocks import BlockReader
from daskpile.sources.text.formats import compression_of
from daskpile.sources.text.schema import first_records, sample

# A compressed file's size in memory is unknown before it is read: the sampled file's own ratio is measured
# on its first RATIO_PROBE_BYTES (decompressing at most RATIO_OUTPUT_BYTES of them), and a file not sampled,
# or too little decompressed to tell (a bzip2 block of 900 kB), taken as this many times its size on disk
# (gzip and zstd shrink text and JSON three to ten times; a repetitive corpus was 66 times).
COMPRESSED_RATIO = 5
# A task streaming a file (compressed, or CSV with newlines in values) peaks at about this many blocks of
# --blocksize: the block parsed and scattered, the next one read, the allocator's free pages (a .csv.gz of
# 250 MiB of text, --blocksize 64MiB, sync: a peak resident set of 0.53 GB; 1.3 GB at the default 256 MiB)
STREAM_PEAK_BLOCKS = 5


RATIO_PROBE_BYTES = 2**20


RATIO_OUTPUT_BYTES = 16 * 2**20


def estimate(
    fs, path: str, sizes: list[int], compressed: list[bool], schema, options, window: str | None = None
) -> tuple[int, int]:
    """(rows, bytes in memory) of text files, extrapolated from the first file's first MiB (``window``: the
    moving window whose columns ``schema`` is, for an append)."""
    if options.newlines_in_values:
        table, head = first_records(fs, path, options, dict(zip(schema.names, schema.types, strict=True)))
        rows, nbytes, sampled = table.num_rows, table.nbytes, len(head)
    else:
        head = sample(fs, path, options)
        sampled = len(head)
        if options.as_written:  # (a line may be longer than the sample) a row is a line, its bytes as long
            rows, nbytes = head.count(b"\n") or int(bool(head.strip())), len(head)
        else:
            table = BlockReader(fs, path, schema, options, len(head) + 1, window).parse(head, 0) if head else None
            rows, nbytes = (table.num_rows, table.nbytes) if table is not None else (0, 0)
    if not rows:
        return 0, 0
    ratio = compressed_ratio(fs, path) if compression_of(path) else COMPRESSED_RATIO
    stored = sum(size * (ratio if c else 1) for size, c in zip(sizes, compressed, strict=True))
    return round(rows * stored / sampled), round(nbytes * stored / sampled)


def compressed_ratio(fs, path: str) -> float:
    """Bytes a compressed file holds per byte stored, from its first ``RATIO_PROBE_BYTES``;
    ``COMPRESSED_RATIO`` when they are too few to tell.

    The probe is decompressed 64 KiB at a time (Arrow's stream reads its
    input so; xz's decompressor is fed so), so what was used after each step
    is the bytes that gave its output, give or take 64 KiB: enough when it is
    a few times that, or when the output reaches ``RATIO_OUTPUT_BYTES`` first
    (a ratio of at least 64).
    """
    compression = compression_of(path)
    with fs.open(path, "rb") as raw:
        head = raw.read(RATIO_PROBE_BYTES)
    out, used = _xz_probe(head) if compression == "xz" else _arrow_probe(head, compression)
    if out >= RATIO_OUTPUT_BYTES or used >= 4 * 2**16 or (out and len(head) < RATIO_PROBE_BYTES):
        return out / max(used, 1)
    return COMPRESSED_RATIO


def _arrow_probe(head: bytes, compression: str) -> tuple[int, int]:
    """(bytes out, bytes used) of ``head`` decompressed by Arrow's codec, up to ``RATIO_OUTPUT_BYTES`` out."""
    probe = pa.BufferReader(head)
    stream = pa.CompressedInputStream(probe, compression)
    out = used = 0
    try:
        while out < RATIO_OUTPUT_BYTES and (chunk := stream.read(2**16)):
            out, used = out + len(chunk), probe.tell()
    except OSError:
        pass  # the probe ends inside a block: what came out before it counts
    return out, used


def _xz_probe(head: bytes) -> tuple[int, int]:
    """``_arrow_probe`` for xz, which Arrow has no codec for: Python's lzma, fed 64 KiB at a time."""
    decompressor = lzma.LZMADecompressor()
    out = used = 0
    for start in range(0, len(head), 2**16):
        try:
            out += len(decompressor.decompress(head[start : start + 2**16], max_length=RATIO_OUTPUT_BYTES - out))
        except lzma.LZMAError:
            break  # not xz after all: the read says so, naming the file
        used = min(start + 2**16, len(head))
        if out >= RATIO_OUTPUT_BYTES or decompressor.eof:
            break
    return out, used
