"""The test harnesses' ports: picked where no outgoing connection can take them, and a node
whose start lost a port to another process (EADDRINUSE) is started again, not failed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cluster_harness
import pytest
from cluster_harness import running_cluster
from inproc_harness import configs, start_all

from bench import ports
from bench.ports import free_ports, lost_a_port

pytestmark = pytest.mark.timeout(120)


@contextmanager
def held_port() -> Iterator[int]:
    """A port another process could have taken: bound and listening until the block ends."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, high = ports.pick_span()
    picked = free_ports(50)
    assert len(set(picked)) == 50
    assert all(low <= port < high for port in picked)
    for port in picked:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_bind_failure_is_told_apart_from_other_exits() -> None:
    uvloop = "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 9): "
    assert lost_a_port(uvloop + "address already in use")
    assert lost_a_port("listen tcp 127.0.0.1:9: bind: Address already in use")
    assert not lost_a_port("ImportError: cannot import name 'Broker'")


def test_a_fresh_cluster_whose_port_was_taken_starts_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with held_port() as taken:
        picks = iter([[free_ports(1)[0], taken]])  # the first pick: the node's HTTP, Raft ports
        monkeypatch.setattr(
            cluster_harness, "free_ports", lambda count: next(picks, None) or free_ports(count)
        )
        with running_cluster(tmp_path, size=1) as cluster:
            [node] = cluster.nodes
            assert node.ready()
            assert node.raft != f"127.0.0.1:{taken}"
            assert "lost a port" in cluster.timeline.render()


def test_a_restarted_node_whose_port_is_taken_meanwhile_starts_once_it_is_free(
    tmp_path: Path,
) -> None:
    with running_cluster(tmp_path, size=1) as cluster:
        [node] = cluster.nodes
        node.kill()
        host, port = node.http.rsplit(":", 1)
        holder = socket.socket()
        # As the node's own bind does: the port's connections to the killed node linger.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((host, int(port)))
        holder.listen()
        node.start()
        failed_start = node.process
        assert failed_start is not None

        def let_go_once_the_start_failed() -> None:  # as the other process might
            failed_start.wait(30)
            holder.close()

        released = threading.Thread(target=let_go_once_the_start_failed)
        released.start()
        try:
            cluster.wait_ready([node])
        finally:
            released.join()
        assert failed_start.returncode == 1
        assert node.http == f"{host}:{port}"  # its peers know it there
        assert "lost a port; starting it again" in cluster.timeline.render()


async def test_in_process_brokers_whose_port_was_taken_start_on_new_ports(
    tmp_path: Path,
) -> None:
    cfgs = configs(tmp_path, 3)
    _, raft_port = cfgs[1].raft.rsplit(":", 1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(raft_port)))
        holder.listen()
        brokers = await start_all(cfgs)
    try:
        assert cfgs[1].raft != f"127.0.0.1:{raft_port}"
        assert all(c.peers == cfgs[0].peers for c in cfgs)
    finally:
        for broker in brokers:
            await broker.stop()
