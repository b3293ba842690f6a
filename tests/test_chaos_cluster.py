"""Specification of how the harness finds the compose tool and reaches nodes run elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftline.chaos.cluster import ClusterError, StaticCluster, compose_command


def fake_tool(folder: Path, name: str, exit_code: int) -> None:
    tool = folder / name
    tool.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    tool.chmod(0o755)


def test_compose_plugin_is_preferred_when_docker_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tool(tmp_path, "docker", 0)
    fake_tool(tmp_path, "docker-compose", 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compose_command() == ["docker", "compose"]


def test_standalone_compose_is_used_when_the_plugin_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tool(tmp_path, "docker", 1)
    fake_tool(tmp_path, "docker-compose", 0)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compose_command() == ["docker-compose"]


def test_no_compose_tool_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ClusterError, match="docker-compose"):
        compose_command()


def test_static_cluster_numbers_nodes_from_one_in_url_order() -> None:
    cluster = StaticCluster(["http://127.0.0.1:8080/", "http://127.0.0.1:8081"])
    assert [(n.node_id, n.http_url) for n in cluster.nodes] == [
        (1, "http://127.0.0.1:8080"),
        (2, "http://127.0.0.1:8081"),
    ]


def test_static_cluster_without_urls_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one URL"):
        StaticCluster([])


def test_unreachable_node_is_not_ready_within_the_bound() -> None:
    # Port 9 on loopback: nothing listens, so the connection is refused at once.
    assert StaticCluster(["http://127.0.0.1:9"]).wait_ready(timeout_s=0.5) is False
