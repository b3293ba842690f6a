"""S3 clients against SeaweedFS: sequential PUT and GET MiB/s of obstore, aiobotocore and boto3.

Owns the measurement behind tiered/store.py's choice of client. Run from the repository root:
`python -m bench.s3_clients [--mib 8] [--seconds 5]` (starts and stops its own `weed mini`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.seaweedfs import ACCESS_KEY, SECRET_KEY, running_seaweedfs

MAX_OPS = 100
_written = MAX_OPS


async def _timed(op: Callable[[int], Awaitable[None]], size: int, seconds: float) -> float:
    """MiB/s of `op` run sequentially for `seconds` (at most MAX_OPS times)."""
    global _written
    done = 0
    start = time.perf_counter()
    while done < MAX_OPS and time.perf_counter() - start < seconds:
        await op(done)
        done += 1
    _written = done  # the GET phase reads back what the PUT phase wrote
    return done * size / (1 << 20) / (time.perf_counter() - start)


async def bench_obstore(
    endpoint: str, bucket: str, data: bytes, seconds: float
) -> tuple[float, float]:
    from raftline.tiered.store import ObjectStore, S3Config

    store = ObjectStore(S3Config.from_env(endpoint, bucket, prefix="obstore"))

    async def put(i: int) -> None:
        await store.put(f"o{i}", data)

    async def get(i: int) -> None:
        assert len(await store.get(f"o{i % _written}")) == len(data)

    put_rate = await _timed(put, len(data), seconds)
    return put_rate, await _timed(get, len(data), seconds)


async def bench_aiobotocore(
    endpoint: str, bucket: str, data: bytes, seconds: float
) -> tuple[float, float]:
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    ) as client:

        async def put(i: int) -> None:
            await client.put_object(Bucket=bucket, Key=f"aio/o{i}", Body=data)

        async def get(i: int) -> None:
            answer = await client.get_object(Bucket=bucket, Key=f"aio/o{i % _written}")
            async with answer["Body"] as body:
                assert len(await body.read()) == len(data)

        put_rate = await _timed(put, len(data), seconds)
        return put_rate, await _timed(get, len(data), seconds)


async def bench_boto3(
    endpoint: str, bucket: str, data: bytes, seconds: float
) -> tuple[float, float]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )

    async def put(i: int) -> None:  # blocking, as boto3 is: the loop only sequences the calls
        client.put_object(Bucket=bucket, Key=f"boto3/o{i}", Body=data)

    async def get(i: int) -> None:
        body = client.get_object(Bucket=bucket, Key=f"boto3/o{i % _written}")["Body"].read()
        assert len(body) == len(data)

    put_rate = await _timed(put, len(data), seconds)
    return put_rate, await _timed(get, len(data), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=8, help="object size in MiB")
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase")
    args = parser.parse_args()
    data = os.urandom(args.mib << 20)
    with tempfile.TemporaryDirectory() as tmp, running_seaweedfs(Path(tmp)) as server:
        os.environ.update(server.env())
        bucket = server.create_bucket()
        print(f"SeaweedFS weed mini, {args.mib} MiB objects, sequential, {args.seconds} s phases")
        print(f"{'client':<12} {'PUT MiB/s':>10} {'GET MiB/s':>10}")
        for name, bench in (
            ("obstore", bench_obstore),
            ("aiobotocore", bench_aiobotocore),
            ("boto3", bench_boto3),
        ):
            put_rate, get_rate = asyncio.run(bench(server.endpoint, bucket, data, args.seconds))
            print(f"{name:<12} {put_rate:>10.0f} {get_rate:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
