"""Controller calls from a node that does not lead the metadata: what is tried again.

Only a call that certainly had no effect may be sent a second time: a metadata command whose
first try was applied would otherwise answer as if it had not been (a delete that says
`unknown_topic`, a create that says `topic_exists`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from inproc_harness import configs

from raftline.node.broker import Broker, OutcomeUnknown
from raftline.node.transport import OUTCOME_UNKNOWN, RemoteError


def broker_whose_controller_is_node_2(tmp_path: Path, answers: list[Any]) -> tuple[Broker, list]:
    """A broker (not started) whose calls to the controller get `answers` in turn."""
    broker = Broker(configs(tmp_path, 3)[0])
    sent: list[str] = []

    async def call(peer: int, method: str, args: Any, timeout: float) -> Any:
        sent.append(method)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def controller(group: str, voters: Collection[int], since: float) -> int:
        return 2

    async def while_leads(group: str, leader: int, request: Any) -> Any:
        return await request  # node 2 stays the controller throughout

    broker.runtime.transport.call = call  # type: ignore[method-assign]
    broker.router.leader_or_none = controller  # type: ignore[method-assign]
    broker.router.while_leads = while_leads  # type: ignore[method-assign]
    return broker, sent


async def test_a_controller_call_whose_link_failed_in_flight_is_not_sent_again(
    tmp_path: Path,
) -> None:
    answers: list[Any] = [RemoteError(OUTCOME_UNKNOWN, "link failed"), {"deleted": True}]
    broker, sent = broker_whose_controller_is_node_2(tmp_path, answers)
    with pytest.raises(OutcomeUnknown):
        await broker.router.on_controller("delete_topic", {"name": "orders"})
    assert sent == ["delete_topic"]


async def test_a_controller_call_that_timed_out_is_not_sent_again(tmp_path: Path) -> None:
    answers: list[Any] = [RemoteError("timeout", "no answer"), {"deleted": True}]
    broker, sent = broker_whose_controller_is_node_2(tmp_path, answers)
    with pytest.raises(Exception, match="no answer") as raised:
        await broker.router.on_controller("delete_topic", {"name": "orders"})
    assert getattr(raised.value, "code", None) == "timeout"
    assert sent == ["delete_topic"]


async def test_a_controller_call_that_had_no_effect_is_sent_again(tmp_path: Path) -> None:
    answers: list[Any] = [RemoteError("leader_unavailable", "not the controller"), {"ok": 1}]
    broker, sent = broker_whose_controller_is_node_2(tmp_path, answers)
    assert await broker.router.on_controller("delete_topic", {"name": "orders"}) == {"ok": 1}
    assert sent == ["delete_topic", "delete_topic"]
