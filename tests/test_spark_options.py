"""spark/options.py: the source's options become ReadOptions or an OptionError naming the
problem (no Spark needed)."""

from __future__ import annotations

import pytest

from raftline.spark.options import EARLIEST, LATEST, OptionError, parse

BASE = {"s3.endpoint": "http://127.0.0.1:9000", "bucket": "b"}


def test_defaults_read_the_whole_bucket_in_batch_and_new_data_in_a_stream():
    batch = parse({**BASE, "subscribe": "a,b"}, streaming=False)
    stream = parse({**BASE, "subscribe": "a"}, streaming=True)
    assert (batch.starting, batch.ending) == (EARLIEST, LATEST)
    assert stream.starting == LATEST
    assert batch.subscription == ("subscribe", ["a", "b"])
    assert not batch.include_headers and batch.fail_on_data_loss and not batch.broker_tail


def test_option_names_are_case_insensitive_as_in_spark():
    options = parse({**BASE, "SUBSCRIBE": "a", "includeHeaders": "TRUE"}, streaming=False)
    assert options.include_headers


def test_per_partition_offsets_json_with_earliest_and_latest():
    options = parse(
        {**BASE, "subscribe": "a", "startingOffsets": '{"a": {"0": 5, "1": -2}}'},
        streaming=False,
    )
    assert options.starting == {"a": {0: 5, 1: EARLIEST}}


def test_credentials_come_from_options_else_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    from_env = parse({**BASE, "subscribe": "a"}, streaming=False).bucket
    given = parse(
        {**BASE, "subscribe": "a", "s3.accessKeyId": "k", "s3.secretAccessKey": "s"},
        streaming=False,
    ).bucket
    assert (from_env.access_key_id, from_env.secret_access_key) == ("env-key", "env-secret")
    assert (given.access_key_id, given.secret_access_key) == ("k", "s")


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "a", "bucket": ""}, False, "option bucket is required"),
        ({"subscribe": "a", "s3.endpoint": "127.0.0.1:9000"}, False, "http(s) URL"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, False, "exactly one of"),
        ({"subscribePattern": "("}, False, "not a regular expression"),
        ({"assign": '{"a": [0, "x"]}'}, False, "list of partition numbers"),
        ({"subscribe": "a", "startingOffsets": "[1]"}, False, "must be earliest, latest or JSON"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, False, "offsets >= 0"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, False, "would read nothing"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, False, "not allowed"),
        ({"subscribe": "a", "endingOffsets": "latest"}, True, "a stream has no end"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "10"}, False, "for streaming"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "must be positive"),
        ({"subscribe": "a", "startingTimestamp": "soon"}, False, "must be an integer"),
        (
            {"subscribe": "a", "startingTimestamp": "1", "startingOffsets": "earliest"},
            False,
            "not both",
        ),
        ({"subscribe": "a", "includeBrokerTail": "true"}, False, "needs brokers="),
        ({"subscribe": "a", "brokers": "http://x:1"}, False, "only used with includeBrokerTail"),
        ({"subscribe": "a", "includeHeaders": "yes"}, False, "true or false"),
        ({"subscribe": "a", "s3.accessKeyId": "k"}, False, "both s3.accessKeyId"),
        ({"subscribe": "a", "kafka.bootstrap.servers": "x"}, False, "unknown option(s)"),
    ],
)
def test_bad_options_name_the_problem(options, streaming, message):
    with pytest.raises(OptionError) as caught:
        parse({**BASE, **options}, streaming=streaming)
    assert message in str(caught.value)
