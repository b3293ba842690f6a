"""Issue 16's outside check: a `raftline serve` process with --s3-* flags against SeaweedFS."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from seaweedfs import running_seaweedfs

from bench.node_procs import serve_command
from bench.ports import free_ports
from raftline.clients.client import Client

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_node_with_s3_flags_offloads_segments_and_serves_offset_0_from_the_bucket(
    tmp_path: Path,
) -> None:
    with running_seaweedfs(tmp_path / "weed") as seaweed:
        bucket = seaweed.create_bucket()
        http_port, raft_port = free_ports(2)
        http = f"127.0.0.1:{http_port}"
        data_dir = tmp_path / "node"
        command = [
            *serve_command(),
            "--http", http,
            "--raft", f"127.0.0.1:{raft_port}",
            "--data-dir", str(data_dir),
            "--fsync", "never",
            "--s3-endpoint", seaweed.endpoint,
            "--s3-bucket", bucket,
            "--s3-prefix", "outside",
        ]  # fmt: skip
        env = {**os.environ, **seaweed.env()}
        with (tmp_path / "node.log").open("wb") as log:
            node = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            with Client(f"http://{http}") as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        client.list_topics()
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                config = {
                    "remote.storage.enable": True,
                    "segment.bytes": 4096,
                    "local.retention.bytes": 0,
                }
                client.create_topic("offloaded", 1, config=config)
                values = [f"{i:05d}-" + "v" * 200 for i in range(300)]
                for start in range(0, len(values), 10):
                    client.produce_batch("offloaded", 0, values[start : start + 10])
                partition_dir = next((data_dir / "partitions").iterdir())
                first_segment = partition_dir / f"{0:020d}.log"
                # Local segments go once uploaded (at the node's retention check, every 30 s).
                deadline = time.monotonic() + 120
                while first_segment.exists() and time.monotonic() < deadline:
                    time.sleep(1)
                assert not first_segment.exists()
                store_keys = _bucket_keys(seaweed.endpoint, bucket, seaweed.env())
                assert sum(k.endswith(".log") for k in store_keys) >= 10
                assert sum(k.endswith("manifest.json") for k in store_keys) == 1
                fetched: list[bytes | None] = []
                offset = 0
                while len(fetched) < len(values):
                    answer = client.fetch_values("offloaded", 0, offset, max_messages=1000)
                    fetched += answer.values
                    offset = answer.next_offset
                assert [v.decode() for v in fetched if v is not None] == values
        finally:
            os.killpg(node.pid, signal.SIGTERM)
            node.wait(20)


def _bucket_keys(endpoint: str, bucket: str, env: dict[str, str]) -> list[str]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]
