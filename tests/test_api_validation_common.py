"""The produce validation fast path for the common message shape gives the full checks' result."""

import pytest

from raftline.api import validation
from raftline.api.errors import ApiError


def test_a_common_message_reads_its_key_value_and_partition() -> None:
    [message] = validation.produce_request(
        {"messages": [{"key": "k", "value": "v", "partition": 3}]}
    ).messages
    assert (message.key, message.value, message.partition) == (b"k", b"v", 3)
    assert (message.headers, message.timestamp) == ([], None)


def test_a_null_key_in_the_common_shape_means_no_key() -> None:
    [message] = validation.produce_request({"messages": [{"key": None, "value": "v"}]}).messages
    assert message.key is None


def test_a_lone_surrogate_value_is_still_an_invalid_request() -> None:
    with pytest.raises(ApiError) as info:
        validation.produce_request({"messages": [{"value": "\ud800"}]})
    assert info.value.code == "invalid_request"
