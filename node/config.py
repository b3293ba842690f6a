"""How one broker node is configured: identity, addresses, initial members, durability, timing.

Owns NodeConfig and parsing of the `HOST:PORT` and `1=HOST:PORT,...` forms of flags and env.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FSYNC_MODES = ("always", "interval", "never")
# The tiered chunk cache holds whole chunks of remote reads (tiered/reader.py CHUNK_BYTES).
TIERED_CACHE_MIN_BYTES = 4 << 20
TIERED_CACHE_DEFAULT_BYTES = 64 << 20
# How long a thread may keep the interpreter lock while another waits (sys.setswitchinterval).
# A disk thread back from fdatasync waits up to this long for the event loop thread to let go
# before it can hand its result to the loop; Python's default of 5 ms can put that much on
# every acknowledged write (bench/README.md, RF 3 latency). Bounds: below 100 us the threads mostly
# trade the lock; above 100 ms a node's disk and fetch threads stall for whole ticks.
SWITCH_INTERVAL_US_DEFAULT = 500
SWITCH_INTERVAL_US_RANGE = (100, 100_000)


def parse_address(text: str) -> tuple[str, int]:
    """Split `HOST:PORT` (IPv6 hosts in brackets); raises ValueError on anything else."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def parse_peers(text: str) -> dict[int, str]:
    """Parse `1=H:P,2=H:P` into {node id: raft address}; an empty string means no peers."""
    peers: dict[int, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep or not node.strip().isdigit():
            raise ValueError(f"expected ID=HOST:PORT in --peers, got {item!r}")
        parse_address(address)
        node_id = int(node)
        if node_id in peers:
            raise ValueError(f"node {node_id} listed twice in --peers")
        peers[node_id] = address.strip()
    return peers


@dataclass
class NodeConfig:
    node_id: int = 1
    data_dir: Path = Path("./raftline-data")
    http: str = "127.0.0.1:8080"  # HOST:PORT the HTTP API listens on
    raft: str = "127.0.0.1:9090"  # HOST:PORT for node-to-node traffic
    # Raft addresses of the initial members, this node included; empty = a single node.
    peers: dict[int, str] = field(default_factory=dict)
    fsync: str = "always"  # always | interval | never
    tick_ms: int = 50
    rack: str | None = None
    election_ticks: int = 10  # randomized in [n, 2n) by the core
    # Idle ticks before a leader lets its group go quiet. Each awake tick is a heartbeat and
    # its answer per follower: at 6, heartbeats were over half the messages of creating a
    # partition (issue #21 item 6); 3 leaves the commit a tick to reach the followers first.
    quiet_after_ticks: int = 3
    leader_settle_s: float = 10.0  # the controller waits this long before moving leadership
    request_timeout_s: float = 10.0  # produce/metadata requests waiting on Raft give up after this
    retention_check_s: float = 30.0  # how often partition logs are trimmed per their retention
    producer_expiry_ms: int = 24 * 3600 * 1000  # idle producer ids are forgotten after this
    producer_snapshot_every: int = 2000  # committed entries between producer state snapshots
    # records a queue shard's leader holds read and not yet settled, over all its queues (bytes)
    queue_cache_bytes: int = 64 << 20
    test_hooks: bool = False  # serve the fault-injection endpoints under /v1/admin (tests only)
    # Tiered storage (tiered/): the bucket segments of remote.storage.enable topics go to.
    s3_endpoint: str | None = None
    s3_bucket: str | None = None
    s3_region: str = "us-east-1"
    s3_prefix: str = ""
    # chunks of remote reads (fetches below the local log start) kept in memory, node-wide
    tiered_cache_bytes: int = TIERED_CACHE_DEFAULT_BYTES
    switch_interval_us: int = SWITCH_INTERVAL_US_DEFAULT  # see SWITCH_INTERVAL_US_DEFAULT

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.node_id < 0:
            raise ValueError(f"node id must be >= 0, got {self.node_id}")
        parse_address(self.http)
        parse_address(self.raft)
        for address in self.peers.values():
            parse_address(address)
        if self.peers and self.node_id not in self.peers:
            raise ValueError(f"--peers must include this node ({self.node_id})")
        if self.fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}, got {self.fsync!r}")
        if self.queue_cache_bytes < 1:
            raise ValueError(f"queue cache bytes must be >= 1, got {self.queue_cache_bytes}")
        if self.tiered_cache_bytes < TIERED_CACHE_MIN_BYTES:
            raise ValueError(
                f"tiered cache bytes must be at least {TIERED_CACHE_MIN_BYTES} (one 4 MiB chunk "
                f"of a remote read), got {self.tiered_cache_bytes}"
            )
        tiered = self.s3_endpoint and self.s3_bucket
        if self.tiered_cache_bytes != TIERED_CACHE_DEFAULT_BYTES and not tiered:
            raise ValueError("tiered cache bytes need object storage (--s3-endpoint, --s3-bucket)")
        low, high = SWITCH_INTERVAL_US_RANGE
        if not low <= self.switch_interval_us <= high:
            raise ValueError(
                f"switch interval must be {low}-{high} us, got {self.switch_interval_us}"
            )
        if self.tick_ms <= 0 or self.election_ticks < 2:
            raise ValueError("tick_ms must be > 0 and election_ticks >= 2")

    def members(self) -> dict[int, str]:
        """The initial members' Raft addresses: the peers, or just this node."""
        return dict(self.peers) if self.peers else {self.node_id: self.raft}
