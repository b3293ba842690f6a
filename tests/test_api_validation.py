"""Request bodies and query parameters: what is accepted and what is an invalid_request."""

import base64
from typing import Any

import pytest

from raftline.api import validation
from raftline.api.errors import ApiError


def _invalid(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.code == "invalid_request"
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("name", ["orders", "a", "A.b_c-9", "x" * 249])
def test_topic_names_of_the_allowed_characters_are_accepted(name: str) -> None:
    assert validation.topic_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 250, "with space", "slash/y", "é", ".", "..", 7, None])
def test_other_topic_names_are_invalid(name: Any) -> None:
    _invalid(validation.topic_name, name)


def test_produce_defaults_to_acks_all_and_keeps_message_order() -> None:
    request = validation.produce_request(
        {"messages": [{"value": "a"}, {"value": "b", "key": "k", "partition": 1}]}
    )
    assert request.acks == "all"
    assert [m.value for m in request.messages] == [b"a", b"b"]
    assert request.messages[1].key == b"k"
    assert request.messages[1].partition == 1


def test_value_b64_is_decoded_to_bytes() -> None:
    raw = bytes([0, 255, 10])
    request = validation.produce_request(
        {"messages": [{"value_b64": base64.b64encode(raw).decode()}]}
    )
    assert request.messages[0].value == raw


def test_msgpack_bytes_values_are_taken_as_they_are() -> None:
    request = validation.produce_request({"messages": [{"value": b"\xff\x00"}]})
    assert request.messages[0].value == b"\xff\x00"


def test_null_value_is_a_tombstone() -> None:
    assert validation.produce_request({"messages": [{"value": None}]}).messages[0].value is None


def test_headers_become_name_and_utf8_bytes_pairs() -> None:
    request = validation.produce_request({"messages": [{"value": "v", "headers": {"h": "é"}}]})
    assert request.messages[0].headers == [("h", "é".encode())]


@pytest.mark.parametrize(
    "body",
    [
        [],
        "text",
        {},
        {"messages": []},
        {"messages": "x"},
        {"messages": [{"value": "a"}], "acks": "some"},
        {"messages": [{"value": "a"}], "extra": 1},
        {"messages": [{}]},
        {"messages": ["a"]},
        {"messages": [{"value": 5}]},
        {"messages": [{"value": "a", "value_b64": "YQ=="}]},
        {"messages": [{"value_b64": "not base64!"}]},
        {"messages": [{"value": "a", "vlaue": "typo"}]},
        {"messages": [{"value": "a", "partition": -1}]},
        {"messages": [{"value": "a", "partition": "0"}]},
        {"messages": [{"value": "a", "partition": True}]},
        {"messages": [{"value": "a", "timestamp": -5}]},
        {"messages": [{"value": "a", "timestamp": 1.5}]},
        {"messages": [{"value": "a", "headers": ["h"]}]},
        {"messages": [{"value": "a", "headers": {"h": 1}}]},
        {"messages": [{"value": "a", "key": 12}]},
    ],
)
def test_malformed_produce_bodies_are_invalid_requests(body: Any) -> None:
    _invalid(validation.produce_request, body)


def test_create_topic_reads_name_counts_and_config() -> None:
    request = validation.create_topic_request(
        {
            "name": "orders",
            "partitions": 3,
            "replication_factor": 3,
            "config": {"max.message.bytes": 2_000_000, "cleanup.policy": "compact"},
        }
    )
    assert (request.name, request.partitions, request.replication_factor) == ("orders", 3, 3)
    assert request.config == {"max.message.bytes": "2000000", "cleanup.policy": "compact"}


@pytest.mark.parametrize(
    "body",
    [
        {"partitions": 1},
        {"name": "bad name"},
        {"name": "t", "partitions": 0},
        {"name": "t", "partitions": "3"},
        {"name": "t", "partitions": True},
        {"name": "t", "replication_factor": 0},
        {"name": "t", "config": []},
        {"name": "t", "config": {"max.message.bytes": 20 * 1024 * 1024}},
        {"name": "t", "config": {"max.message.bytes": "lots"}},
        {"name": "t", "config": {"cleanup.policy": "forever"}},
        {"name": "t", "config": {"no.such.config": "1"}},
        {"name": "t", "config": {"retention.ms": True}},
        {"name": "t", "colour": "blue"},
    ],
)
def test_malformed_topic_creations_are_invalid_requests(body: Any) -> None:
    _invalid(validation.create_topic_request, body)


def test_fetch_defaults_and_named_offsets() -> None:
    request = validation.fetch_request({"offset": "latest"})
    assert request.offset == "latest"
    assert (request.max_messages, request.max_bytes, request.wait_ms) == (500, 1 << 20, 0)
    assert validation.fetch_request({"offset": "42"}).offset == 42


@pytest.mark.parametrize(
    "query",
    [
        {"offset": "-1"},
        {"offset": "first"},
        {"offset": "1.5"},
        {"offset": "0", "max_messages": "0"},
        {"offset": "0", "max_bytes": "abc"},
        {"offset": "0", "wait_ms": "-3"},
        {"offset": "9" * 100},
    ],
)
def test_malformed_fetch_parameters_are_invalid_requests(query: dict[str, str]) -> None:
    _invalid(validation.fetch_request, query)


def test_fetch_budgets_above_their_maximum_are_clamped() -> None:
    request = validation.fetch_request({"wait_ms": "999999999", "max_messages": "10000000"})
    assert request.wait_ms == validation.MAX_WAIT_MS
    assert request.max_messages == validation.MAX_MAX_MESSAGES


@pytest.mark.parametrize("text", ["-1", "x", "1e3", "", "9999999999"])
def test_partition_path_segment_must_be_a_small_non_negative_integer(text: str) -> None:
    _invalid(validation.partition_index, text)


def test_max_message_bytes_defaults_to_one_megabyte() -> None:
    assert validation.max_message_bytes({}) == 1024 * 1024
    assert validation.max_message_bytes({"max.message.bytes": "5000"}) == 5000
