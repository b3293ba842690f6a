"""`--tiered-cache-bytes`: the node-wide chunk cache of remote reads is sized by the flag (or
RAFTLINE_TIERED_CACHE_BYTES); sizes that cannot hold one chunk, or a node without object
storage, are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from inproc_harness import configs, start_all
from seaweedfs import SeaweedServer

from raftline.clients.cli import build_parser, node_config

S3 = ["--s3-endpoint", "http://127.0.0.1:1", "--s3-bucket", "b"]


def _config(argv: list[str], environ: dict[str, str] | None = None) -> object:
    return node_config(build_parser().parse_args(["serve", *argv]), environ or {})


def test_the_flag_and_its_variable_set_the_cache_size() -> None:
    assert _config([*S3, "--tiered-cache-bytes", "8388608"]).tiered_cache_bytes == 8 << 20
    config = _config(S3, {"RAFTLINE_TIERED_CACHE_BYTES": "268435456"})
    assert config.tiered_cache_bytes == 256 << 20
    assert _config(S3).tiered_cache_bytes == 64 << 20


@pytest.mark.parametrize("text", ["0", "-5", "1mb", "4194303", "1.5"])
def test_a_cache_smaller_than_one_chunk_or_not_a_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="tiered"):
        _config([*S3, "--tiered-cache-bytes", text])


def test_a_cache_size_without_object_storage_is_refused() -> None:
    with pytest.raises(ValueError, match="need object storage"):
        _config(["--tiered-cache-bytes", "8388608"])


async def test_the_node_cache_holds_at_most_the_configured_bytes(
    tmp_path: Path, seaweed: SeaweedServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    [config] = configs(tmp_path, 1)
    config.s3_endpoint, config.s3_bucket = seaweed.endpoint, bucket
    config.tiered_cache_bytes = 12 << 20
    [broker] = await start_all([config])
    try:
        assert broker.tiering is not None
        assert broker.tiering.cache.limit_bytes == 12 << 20
    finally:
        await broker.stop()
