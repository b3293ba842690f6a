"""Compression of a record batch's records section, framed exactly as Kafka puts it on the wire.

Owns codec ids 1-4 (gzip, xerial-framed snappy, LZ4 frame, zstd frames) and bounded decompression.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from enum import IntEnum

import lz4.frame
import snappy
import zstandard

from raftline.raftlog.batch import CorruptBatchError

DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


class Codec(IntEnum):
    """Compression codec ids of attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


# Kafka's Java client writes snappy through xerial's SnappyOutputStream: a 16-byte header
# (magic, version 1, min compatible version 1) then blocks of 32 KiB input, each prefixed
# by its compressed length as a big-endian int32.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_BLOCK_LENGTH = struct.Struct(">i")

_LZ4_STEP = 1 << 20  # output asked of the LZ4 decoder per call

# zstd frame layout (RFC 8878) for the pre-inflation walk.
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE_MASK = 0xFFFFFFF0
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50
_ZSTD_BLOCK_MAX = 128 * 1024
_ZSTD_DICT_ID_SIZES = (0, 1, 2, 4)
_ZSTD_FCS_SIZES = (0, 2, 4, 8)
_U32 = struct.Struct("<I")
# The decoder allocates the window a frame asks for. 2**27 is the zstd library's default
# decoder limit (which Java's zstd-jni keeps), so what Kafka reads we read, and no more.
_ZSTD_MAX_WINDOW = 1 << 27

_ZSTD_COMPRESSOR = zstandard.ZstdCompressor()

BytesLike = bytes | bytearray | memoryview


def compress(codec: int, data: BytesLike) -> bytes:
    """Compress a records section for `codec` in the framing Kafka's own clients write."""
    if codec == Codec.GZIP:
        return gzip.compress(data, mtime=0)
    if codec == Codec.SNAPPY:
        return _xerial_compress(memoryview(data))
    if codec == Codec.LZ4:
        # Kafka's KafkaLZ4BlockInputStream rejects linked blocks; it needs independent 64 KiB
        # blocks, so spell out every frame option instead of trusting library defaults.
        return lz4.frame.compress(
            data,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
    if codec == Codec.ZSTD:
        return _ZSTD_COMPRESSOR.compress(data)
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, data: BytesLike, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> bytes:
    """Inflate a records section; any malformed or over-`max_size` input is a CorruptBatchError."""
    view = memoryview(data)
    try:
        if codec == Codec.GZIP:
            out = _gunzip(view, max_size)
        elif codec == Codec.SNAPPY:
            out = _snappy_decompress(view, max_size)
        elif codec == Codec.LZ4:
            out = _lz4_decompress(view, max_size)
        elif codec == Codec.ZSTD:
            out = _zstd_decompress(view, max_size)
        else:
            raise CorruptBatchError(f"unknown compression codec {codec}")
    except CorruptBatchError:
        raise
    except Exception as err:  # the codec libraries raise assorted types on bad input
        raise CorruptBatchError(f"{Codec(codec).name} records section: {err}") from err
    if len(out) > max_size:
        raise CorruptBatchError(f"records section inflates past {max_size} bytes")
    return out


def _xerial_compress(view: memoryview) -> bytes:
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = snappy.compress(bytes(view[start : start + _XERIAL_BLOCK]))
        parts.append(_BLOCK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(view: memoryview, max_size: int) -> bytes:
    # Java's SnappyInputStream also accepts a bare snappy block, so we do too.
    if view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return _snappy_block(view, max_size)
    if len(view) < len(_XERIAL_HEADER):
        raise CorruptBatchError("truncated xerial snappy header")
    parts = []
    budget = max_size
    pos = len(_XERIAL_HEADER)
    while pos < len(view):
        if len(view) - pos < _BLOCK_LENGTH.size:
            raise CorruptBatchError("truncated xerial snappy block length")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += _BLOCK_LENGTH.size
        if length < 0 or length > len(view) - pos:
            raise CorruptBatchError(f"xerial snappy block length {length} out of range")
        block = _snappy_block(view[pos : pos + length], budget)
        budget -= len(block)
        parts.append(block)
        pos += length
    return b"".join(parts)


def _snappy_block(view: memoryview, max_size: int) -> bytes:
    # A raw snappy block starts with its inflated length (unsigned LEB128, at most 32 bits);
    # check it against the budget before the library allocates that much.
    declared = 0
    for i in range(min(5, len(view))):
        declared |= (view[i] & 0x7F) << (7 * i)
        if view[i] < 0x80:
            break
    else:
        raise CorruptBatchError("bad snappy length preamble")
    if declared > max_size:
        raise CorruptBatchError(f"snappy block declares {declared} bytes, over {max_size}")
    out = snappy.decompress(bytes(view))
    if len(out) != declared:
        raise CorruptBatchError("snappy block length mismatch")
    return out


def _gunzip(view: memoryview, max_size: int) -> bytes:
    # Java's GZIPInputStream reads concatenated members; a member must end cleanly.
    out = bytearray()
    rest: BytesLike = view
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        out += inflater.decompress(rest, max_size + 1 - len(out))
        if len(out) > max_size:
            raise CorruptBatchError(f"gzip records section inflates past {max_size} bytes")
        if not inflater.eof:
            raise CorruptBatchError("truncated gzip records section")
        rest = inflater.unused_data
        if not rest:
            return bytes(out)


def _lz4_decompress(view: memoryview, max_size: int) -> bytes:
    # Inflate in steps: asking for max_size at once makes the library allocate all of it.
    inflater = lz4.frame.LZ4FrameDecompressor()
    out = bytearray()
    pending: BytesLike = view
    while not inflater.eof:
        step = min(_LZ4_STEP, max_size + 1 - len(out))
        out += inflater.decompress(pending, max_length=step)
        pending = b""
        if len(out) > max_size:
            raise CorruptBatchError(f"lz4 records section inflates past {max_size} bytes")
        if inflater.needs_input and not inflater.eof:
            raise CorruptBatchError("truncated lz4 frame")
    if inflater.unused_data:
        raise CorruptBatchError("data after the lz4 frame")
    return bytes(out)


def _zstd_decompress(view: memoryview, max_size: int) -> bytes:
    bound = _zstd_inflated_bound(view)
    inflater = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    reader = inflater.stream_reader(view, read_across_frames=True)
    return reader.read(min(bound, max_size + 1)) if bound else b""


def _zstd_inflated_bound(view: memoryview) -> int:
    """Walk frame and block headers (RFC 8878): prove the input is whole and bound its output.

    The library's streaming reader stops quietly at a truncated frame, so completeness is
    checked here without inflating anything.
    """
    bound = 0
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise CorruptBatchError("truncated zstd frame magic")
        (magic,) = _U32.unpack_from(view, pos)
        pos += 4
        if magic & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE_MAGIC:
            if end - pos < 4:
                raise CorruptBatchError("truncated zstd skippable frame")
            (size,) = _U32.unpack_from(view, pos)
            pos += 4 + size
            continue
        if magic != _ZSTD_MAGIC or pos >= end:
            raise CorruptBatchError("not a zstd frame")
        descriptor = view[pos]
        single_segment = descriptor & 0x20
        fcs_size = _ZSTD_FCS_SIZES[descriptor >> 6] or (1 if single_segment else 0)
        pos += 1 + (0 if single_segment else 1) + _ZSTD_DICT_ID_SIZES[descriptor & 3] + fcs_size
        last = False
        while not last:
            if end - pos < 3:
                raise CorruptBatchError("truncated zstd block header")
            header = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
            pos += 3
            last = bool(header & 1)
            block_type = (header >> 1) & 3
            size = header >> 3
            if block_type == 0:  # raw
                bound += size
                pos += size
            elif block_type == 1:  # RLE: one byte repeated `size` times
                bound += size
                pos += 1
            elif block_type == 2:
                bound += _ZSTD_BLOCK_MAX
                pos += size
            else:
                raise CorruptBatchError("reserved zstd block type")
        if descriptor & 0x04:  # content checksum
            pos += 4
    if pos != end:
        raise CorruptBatchError("truncated zstd frame")
    return bound
