"""Workload files parse into validated scenarios; bad ones fail with a clear error."""

import json
from pathlib import Path

import pytest

from bench.workload import (
    WORKLOAD_DIR,
    WorkloadError,
    load_workload,
    load_workloads,
    order_workloads,
    workload_from_dict,
)


def test_defaults_fill_missing_fields() -> None:
    workload = workload_from_dict({"name": "w", "message_size": 100})
    assert workload.partitions_per_topic == 1
    assert workload.acks == "all"
    assert workload.max_rate


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "one-partition.json"
    path.write_text(json.dumps({"partitions_per_topic": 1}))
    assert load_workload(path).name == "one-partition"


def test_yaml_files_parse(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("partitions_per_topic: 16\nmessage_size: 1024\nproducer_rate: 5000\n")
    workload = load_workload(path)
    assert (workload.partitions_per_topic, workload.producer_rate) == (16, 5000)
    assert not workload.max_rate


def test_quick_run_swaps_in_the_quick_timings() -> None:
    workload = workload_from_dict({"name": "w", "quick_duration_seconds": 3})
    quick = workload.for_quick_run()
    assert quick.duration_seconds == 3
    assert quick.warmup_seconds == workload.quick_warmup_seconds


@pytest.mark.parametrize(
    "fields",
    [
        {"partitions_per_topic": 0},
        {"message_size": 8},
        {"message_size": 10**9},
        {"acks": "some"},
        {"topics": True},
        {"topics": "1"},
        {"duration_seconds": -1},
        {"rate_fraction": 0.5},
        {"rate_fraction": 1.5, "rate_of_workload": "x"},
        {"producer_rate": 10, "rate_fraction": 0.5, "rate_of_workload": "x"},
        {"partitions": 3},
    ],
)
def test_invalid_fields_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(WorkloadError):
        workload_from_dict({"name": "w", **fields})


def test_a_non_mapping_is_refused() -> None:
    with pytest.raises(WorkloadError):
        workload_from_dict(["name", "w"])


def test_unknown_suffix_and_bad_json_are_refused(tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_text("{}")
    (tmp_path / "w.json").write_text("{not json")
    with pytest.raises(WorkloadError):
        load_workload(tmp_path / "w.txt")
    with pytest.raises(WorkloadError):
        load_workload(tmp_path / "w.json")


def test_derived_rate_runs_after_the_workload_it_derives_from() -> None:
    half = workload_from_dict({"name": "a-half", "rate_fraction": 0.5, "rate_of_workload": "z"})
    full = workload_from_dict({"name": "z"})
    assert [w.name for w in order_workloads([half, full])] == ["z", "a-half"]


def test_a_missing_rate_reference_is_refused() -> None:
    half = workload_from_dict({"name": "h", "rate_fraction": 0.5, "rate_of_workload": "gone"})
    with pytest.raises(WorkloadError, match="gone"):
        order_workloads([half])


def test_shipped_workloads_cover_the_required_scenarios() -> None:
    workloads = {w.name: w for w in load_workloads(WORKLOAD_DIR)}
    quick = [w for w in workloads.values() if w.in_quick]
    shapes = {(w.partitions_per_topic, w.message_size) for w in quick if w.max_rate}
    assert {(1, 100), (16, 100), (1, 1024), (16, 1024), (1, 1_000_000)} <= shapes
    assert any(w.rate_fraction == 0.5 for w in quick)
