"""Specification of records-section compression: Kafka's framing per codec, bounded inflation."""

from __future__ import annotations

import gzip
import os
import struct

import lz4.frame
import pytest
import snappy
import zstandard

from raftline.raftlog.batch import CorruptBatchError
from raftline.raftlog.compression import Codec, compress, decompress

COMPRESSED = [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
SECTION = b"".join(b"record %d;" % i for i in range(20_000)) + os.urandom(5_000)


@pytest.mark.parametrize("codec", COMPRESSED)
def test_every_codec_round_trips(codec: Codec) -> None:
    assert decompress(codec, compress(codec, SECTION)) == SECTION


@pytest.mark.parametrize("codec", COMPRESSED)
def test_every_codec_round_trips_an_empty_section(codec: Codec) -> None:
    assert decompress(codec, compress(codec, b"")) == b""


def test_gzip_writes_a_standard_gzip_member() -> None:
    out = compress(Codec.GZIP, SECTION)
    assert out[:2] == b"\x1f\x8b"
    assert gzip.decompress(out) == SECTION


def test_snappy_writes_xerial_framing_with_32k_blocks() -> None:
    out = compress(Codec.SNAPPY, SECTION)
    assert out[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, inflated = 16, []
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        inflated.append(snappy.decompress(out[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert [len(b) for b in inflated[:-1]] == [32 * 1024] * (len(inflated) - 1)
    assert b"".join(inflated) == SECTION


def test_lz4_writes_one_frame_of_independent_64k_blocks_without_size_or_checksums() -> None:
    out = compress(Codec.LZ4, SECTION)
    assert out[:4] == b"\x04\x22\x4d\x18"
    # FLG: version 01, block independence; no block checksum, content size or content checksum.
    assert out[4] == 0x60
    assert out[5] == 0x40  # BD: 64 KiB maximum block size
    assert lz4.frame.decompress(out) == SECTION


def test_zstd_writes_a_standard_frame() -> None:
    out = compress(Codec.ZSTD, SECTION)
    assert out[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(out) == SECTION


def test_snappy_reads_a_bare_block_as_java_snappy_input_stream_does() -> None:
    assert decompress(Codec.SNAPPY, snappy.compress(SECTION)) == SECTION


def test_gzip_reads_concatenated_members() -> None:
    assert decompress(Codec.GZIP, gzip.compress(b"ab") + gzip.compress(b"cd")) == b"abcd"


def test_zstd_reads_several_frames_and_skips_skippable_ones() -> None:
    skippable = struct.pack("<II", 0x184D2A50, 3) + b"xyz"
    compressor = zstandard.ZstdCompressor(write_content_size=False)
    data = compressor.compress(b"ab") + skippable + compressor.compress(b"cd")
    assert decompress(Codec.ZSTD, data) == b"abcd"


@pytest.mark.parametrize("codec", COMPRESSED)
def test_inflating_exactly_to_the_limit_is_allowed(codec: Codec) -> None:
    data = bytes(1 << 16)
    assert decompress(codec, compress(codec, data), max_size=len(data)) == data


@pytest.mark.parametrize("codec", COMPRESSED)
def test_inflating_past_the_limit_is_corrupt(codec: Codec) -> None:
    bomb = compress(codec, bytes(8 << 20))
    with pytest.raises(CorruptBatchError, match=r"past|declares"):
        decompress(codec, bomb, max_size=1 << 20)


def test_zstd_bomb_with_unknown_content_size_is_corrupt() -> None:
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(8 << 20))
    with pytest.raises(CorruptBatchError, match="past"):
        decompress(Codec.ZSTD, bomb, max_size=1 << 20)


@pytest.mark.parametrize("codec", COMPRESSED)
@pytest.mark.parametrize("cut", [1, 3, 7, 0.5])
def test_a_truncated_compressed_section_is_corrupt(codec: Codec, cut: float) -> None:
    whole = compress(codec, SECTION)
    keep = int(len(whole) * cut) if cut < 1 else len(whole) - int(cut)
    with pytest.raises(CorruptBatchError):
        decompress(codec, whole[:keep])


@pytest.mark.parametrize("codec", COMPRESSED)
def test_trailing_garbage_after_the_compressed_data_is_corrupt(codec: Codec) -> None:
    with pytest.raises(CorruptBatchError):
        decompress(codec, compress(codec, SECTION) + b"\x01\x02\x03\x04\x05")


@pytest.mark.parametrize("codec", [*COMPRESSED, 5, 6, 7])
def test_garbage_is_corrupt(codec: int) -> None:
    with pytest.raises(CorruptBatchError):
        decompress(codec, b"\x00\xff garbage that is no compressed stream \xff" * 3)
