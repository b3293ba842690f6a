"""The `raftline serve` process: a Broker plus the HTTP API on one uvloop event loop.

Owns process startup and clean shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys

from aiohttp import web

from raftline.node.broker import Broker
from raftline.node.collector import COLLECTOR
from raftline.node.config import NodeConfig, parse_address
from raftline.raftlog.speedups import keep_large_buffers

log = logging.getLogger(__name__)


def quiet_collector() -> None:
    """Keep full garbage collections out of request latency. What exists once the node serves
    (modules, the app, the groups) lives as long as the process: frozen, it is never scanned
    again, where one full collection over it stalled the loop ~20 ms (p99.9 at 60k msg/s RF 3:
    25-35 ms before, 17-20 ms after). The collector's thresholds stay as they are: raised to
    (50000, 20, 100) in the same test, latency grew tenfold (cause not found). What piles up
    later is frozen after a long full collection (node/collector.py)."""
    gc.freeze()
    COLLECTOR.install()


async def run(config: NodeConfig, stop: asyncio.Event) -> None:
    """Serve until `stop` is set: broker first, then the HTTP API; shut down in reverse."""
    from raftline.api.app import create_app  # imported late: api imports node.broker
    from raftline.api.body_intake import IntakeAppRunner

    broker = Broker(config)
    await broker.start()
    runner = IntakeAppRunner(create_app(broker, self_http=config.http), access_log=None)
    try:
        await runner.setup()
        host, port = parse_address(config.http)
        await web.TCPSite(runner, host, port).start()
        quiet_collector()
        log.info(
            "node %s serving HTTP on %s, Raft on %s, data in %s",
            config.node_id,
            config.http,
            config.raft,
            config.data_dir,
        )
        stopping = asyncio.ensure_future(stop.wait())
        assert broker.runtime.driver is not None
        await asyncio.wait([stopping, broker.runtime.driver], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if broker.runtime.driver.done():
            raise SystemExit("the Raft driver stopped (see the error above); exiting")
    finally:
        await runner.cleanup()
        await broker.stop()


def configure_process(config: NodeConfig) -> None:
    """Process-wide settings of a serving node (not of in-process test clusters)."""
    sys.setswitchinterval(config.switch_interval_us / 1e6)
    keep_large_buffers()  # a buffer per batch: reuse freed ones, no fresh pages per message


def write_bodies_in_place() -> None:
    """Have aiohttp hand a message's head and body to the transport as two buffers, as it does
    on Python 3.12.9 and later. Before, it joins them into one first (CPython's own selector
    transport joined them anyway before 3.12, and its writelines was unsafe until 3.12.9): a
    copy of every body on the event loop, 1 MB for each fetch answer of a 1 MB batch and for
    each 1 MB batch the node forwards. For uvloop's transports only, whose writelines gives
    the buffers to one writev on any Python."""
    from aiohttp import http_writer

    if hasattr(http_writer, "SKIP_WRITELINES"):
        http_writer.SKIP_WRITELINES = False


def serve(config: NodeConfig) -> None:
    """Run a node in the foreground until SIGTERM or SIGINT (blocking)."""
    configure_process(config)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
        write_bodies_in_place()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(config, stop)

    asyncio.run(main())
