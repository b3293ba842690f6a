"""Log compaction against a model: the latest record per key, offsets kept, crash-safe swaps."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from raftline.raftlog import cleaner as cleaner_module
from raftline.raftlog.cleaner import Cleaner, CleanerConfig
from raftline.raftlog.log import LogConfig, PartitionLog
from raftline.raftlog.records import Codec, Record, build_batch, build_control_batch, iter_batches
from raftline.raftlog.segment import FileCache
from raftline.raftlog.storage import RaftStorage
from raftline.raftlog.types import Entry, EntryKind

# (offset, key, value, batch max timestamp)
Rec = tuple[int, bytes | None, bytes | None, int]


def read_all(
    log: PartitionLog, start: int, max_bytes: int = 1 << 20
) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record at or after `start`, fetched the way a consumer does."""
    out = []
    offset = start
    while offset < log.next_offset:
        data, offset = log.read_from(offset, max_bytes)
        for decoded in iter_batches(data):
            out += [(r.offset, r.key, r.value) for r in decoded.records if r.offset >= start]
    return out


def model_compact(records: list[Rec], end: int, horizon: int) -> list[Rec]:
    """The reference: below `end`, the last record per key, tombstones until the horizon."""
    latest = {key: off for off, key, _, _ in records if off < end and key is not None}
    return [
        r
        for r in records
        if r[0] >= end
        or r[1] is None
        or (latest[r[1]] == r[0] and not (r[2] is None and r[3] < horizon))
    ]


class Scenario:
    def __init__(self, directory: Path, segment_bytes: int = 700, codec: int = Codec.NONE) -> None:
        self.now = 1_000_000
        self.log = PartitionLog(
            directory,
            LogConfig(
                segment_bytes=segment_bytes,
                fsync="never",
                retention_ms=-1,
                index_interval_bytes=64,  # sparse-index lookups inside cleaned segments too
            ),
            files=FileCache(),
            clock=lambda: self.now,
        )
        self.codec = codec
        self.records: list[Rec] = []

    def produce(self, items: list[tuple[bytes | None, bytes | None]], dt: int = 1) -> None:
        self.now += dt
        base = self.log.next_offset
        batch = build_batch(
            [Record(value=v, key=k, timestamp=self.now) for k, v in items], codec=self.codec
        )
        self.log.append(batch, term=1)
        self.records += [(base + i, k, v, self.now) for i, (k, v) in enumerate(items)]

    def reopen(self) -> None:
        """The process died: a new log from the files alone (fsync "never" wrote them all)."""
        self.log = PartitionLog(
            self.log.directory, self.log.config, files=FileCache(), clock=lambda: self.now
        )

    def compact(self, cleaner: Cleaner, upto: int, fail: object = None) -> int:
        stats = cleaner.clean(upto, self.now, fail)  # type: ignore[arg-type]
        if stats.end:
            horizon = self.now - cleaner.config.delete_retention_ms
            self.records = model_compact(self.records, stats.end, horizon)
        return stats.end

    def check(self, start: int) -> None:
        expected = [(o, k, v) for o, k, v, _ in self.records if o >= start]
        assert read_all(self.log, start) == expected
        assert read_all(self.log, start, max_bytes=100) == expected  # a batch or two a read


def expected_end(log: PartitionLog, upto: int) -> int:
    ends = [s.next_offset for s in log.sealed_segments() if s.next_offset <= upto]
    return max(ends, default=0)


keys = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"]))
values = st.one_of(st.none(), st.binary(min_size=1, max_size=20))
batches = st.lists(st.tuples(keys, values), min_size=1, max_size=4)
produce = st.tuples(st.just("produce"), batches, st.integers(0, 50_000))
steps = st.lists(
    st.one_of(
        produce,
        produce,
        produce,
        st.tuples(st.just("compact"), st.floats(0, 1)),
        # a pass that dies at the nth time it reaches a step of the swap, then a restart
        st.tuples(
            st.just("crash"),
            st.floats(0, 1),
            st.sampled_from(["written", "swapped", "indexes_removed", "renamed"]),
            st.integers(0, 3),
        ),
    ),
    min_size=20,
    max_size=80,
)


MODEL_INPUTS = {
    "steps": steps,
    "codec": st.sampled_from([Codec.NONE, Codec.GZIP]),
    "retention": st.sampled_from([0, 20_000, 10**9]),
    "reads": st.lists(st.floats(0, 1), max_size=4),
}


def run_model(steps: list, codec: int, retention: int, reads: list[float]) -> None:
    """Random produce (keys, values, tombstones, times) and compaction at random points; after
    each step, and from random offsets at the end, reads equal the model's records."""
    directory = Path(tempfile.mkdtemp())
    try:
        scenario = Scenario(directory, segment_bytes=300, codec=codec)
        cleaner = Cleaner(scenario.log, CleanerConfig(retention, 0.0, 0))
        for step in steps:
            if step[0] == "produce":
                scenario.produce(step[1], step[2])
            elif step[0] == "crash":
                upto = int(step[1] * (scenario.log.next_offset + 1))
                allowed = expected_end(scenario.log, upto)

                def fail(
                    at: str,
                    where: str = step[2],
                    nth: int = step[3],
                    reached: list = [],  # noqa: B006
                ) -> None:
                    reached.append(at)
                    if reached.count(where) > nth:
                        raise Crash(at)

                try:
                    end = scenario.compact(cleaner, upto, fail)
                except Crash:
                    scenario.reopen()
                    cleaner = Cleaner(scenario.log, cleaner.config)
                    # some segments cleaned, the others not: nothing lost, doubled or invented
                    horizon = scenario.now - retention
                    whole = [(o, k, v) for o, k, v, _ in scenario.records]
                    cleaned = model_compact(scenario.records, allowed, horizon)
                    now_read = read_all(scenario.log, 0)
                    assert [r[0] for r in now_read] == sorted({r[0] for r in now_read})
                    assert {(o, k, v) for o, k, v, _ in cleaned} <= set(now_read) <= set(whole)
                    end = scenario.compact(cleaner, upto)  # the restarted node's next pass
                    assert end == allowed
                assert end in (0, allowed)
            else:
                upto = int(step[1] * (scenario.log.next_offset + 1))
                allowed = expected_end(scenario.log, upto)
                end = scenario.compact(cleaner, upto)
                # never past `upto` nor into the active segment
                assert end in (0, allowed)
                assert end <= scenario.log.segment_bases[-1]
            scenario.check(0)
        for fraction in reads:
            scenario.check(int(fraction * scenario.log.next_offset))
        # a reopened log reads the same
        scenario.log.close()
        reopened = PartitionLog(directory, scenario.log.config, files=FileCache())
        assert read_all(reopened, 0) == [(o, k, v) for o, k, v, _ in scenario.records]
        reopened.close()
    finally:
        shutil.rmtree(directory)


# The default run draws 50 histories (150 took 35 s of a loaded 2-core run); the slow run draws
# many more. The planted-bug tests below show what runs of this model catch.
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**MODEL_INPUTS)
def test_compacted_log_matches_last_value_per_key(
    steps: list, codec: int, retention: int, reads: list[float]
) -> None:
    run_model(steps, codec, retention, reads)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(**MODEL_INPUTS)
def test_many_compacted_logs_match_last_value_per_key(
    steps: list, codec: int, retention: int, reads: list[float]
) -> None:
    run_model(steps, codec, retention, reads)


def build_history(tmp_path: Path) -> Scenario:
    scenario = Scenario(tmp_path, segment_bytes=400)
    for i in range(40):
        scenario.produce([(b"k%d" % (i % 3), b"v%d" % i), (b"x", b"w%d" % i)])
    return scenario


def test_only_committed_sealed_segments_are_cleaned(tmp_path: Path) -> None:
    scenario = build_history(tmp_path)
    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    active = scenario.log.segment_bases[-1]
    stats = cleaner.clean(scenario.log.next_offset, scenario.now)
    assert stats.end == active and stats.records_removed > 0
    # everything in the active segment is still there, every version
    tail = read_all(scenario.log, active)
    assert tail == [(o, k, v) for o, k, v, _ in scenario.records if o >= active]
    # below the upto point nothing moves
    scenario2 = build_history(tmp_path / "b")
    upto = scenario2.log.segment_bases[2]
    Cleaner(scenario2.log, CleanerConfig(min_cleanable_dirty_ratio=0.0)).clean(upto, 0 + 10**7)
    assert read_all(scenario2.log, upto) == [
        (o, k, v) for o, k, v, _ in scenario2.records if o >= upto
    ]
    # each key's latest kept, offsets unchanged, log end unchanged
    assert scenario.log.next_offset == 80
    kept = read_all(scenario.log, 0)
    below = [(o, k) for o, k, _ in kept if o < active]
    assert len({k for _, k in below}) == len(below)


def test_dirty_ratio_and_compaction_lag(tmp_path: Path) -> None:
    scenario = build_history(tmp_path)
    end = scenario.log.segment_bases[-1]
    lagging = Cleaner(scenario.log, CleanerConfig(min_compaction_lag_ms=10**9))
    assert lagging.clean(end, scenario.now).end == 0
    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.5))
    assert cleaner.clean(end, scenario.now).end == end
    # all clean now: a second pass finds nothing dirty
    assert cleaner.clean(end, scenario.now).end == 0
    # a little new data is below the ratio
    scenario.produce([(b"k0", b"new")])
    scenario.log._roll()
    assert cleaner.clean(scenario.log.next_offset, scenario.now).end == 0
    assert (
        Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
        .clean(scenario.log.next_offset, scenario.now)
        .end
        == scenario.log.next_offset
    )


def test_tombstones_go_after_delete_retention(tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, segment_bytes=300)
    for i in range(10):
        scenario.produce([(b"k", b"v%d" % i)])
    scenario.produce([(b"k", None)])
    for i in range(10):
        scenario.produce([(b"other", b"o%d" % i)])
    cleaner = Cleaner(scenario.log, CleanerConfig(1000, 0.0, 0))
    scenario.compact(cleaner, scenario.log.next_offset)
    assert (10, b"k", None) in read_all(scenario.log, 0)  # young tombstone stays
    scenario.now += 5000
    scenario.produce([(b"other", b"again")])
    scenario.log._roll()
    scenario.compact(cleaner, scenario.log.next_offset)
    assert all(k != b"k" for _, k, _ in read_all(scenario.log, 0))
    scenario.check(0)


def test_keyless_records_and_control_batches_are_kept(tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, segment_bytes=300)
    for i in range(6):
        scenario.produce([(None, b"n%d" % i), (b"k", b"v%d" % i)])
        scenario.log.append(build_control_batch(100, b"cfg"), term=1)
    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    scenario.log._roll()
    # control batches carry the wall clock's time: clean as of later than that
    assert cleaner.clean(scenario.log.next_offset, 1 << 50).end == scenario.log.next_offset
    kept = read_all(scenario.log, 0)
    assert [v for _, k, v in kept if k is None and v] == [b"n%d" % i for i in range(6)]
    assert [v for _, k, v in kept if k == b"k"] == [b"v5"]
    assert sum(1 for d in iter_batches(scenario.log.read(0, 1 << 20)) if d.header.is_control) > 0


def test_a_fetch_from_a_removed_offset_continues_at_the_next_kept_one(tmp_path: Path) -> None:
    scenario = build_history(tmp_path)
    Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0)).clean(
        scenario.log.next_offset, scenario.now
    )
    kept = [o for o, _, _ in read_all(scenario.log, 0)]
    removed = next(o for o in range(scenario.log.next_offset) if o not in kept)
    after = read_all(scenario.log, removed)
    assert after[0][0] == min(o for o in kept if o > removed)


def test_cleaned_segments_are_read_by_kafka_python(tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, segment_bytes=400, codec=Codec.GZIP)
    for i in range(30):
        scenario.produce([(b"k%d" % (i % 2), b"v%d" % i), (b"z%d" % i, b"u")])
    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    scenario.compact(cleaner, scenario.log.next_offset)
    scenario.log.close()
    seen = []
    bases = []
    for path in sorted(tmp_path.glob("*.log")):
        records = MemoryRecords(path.read_bytes())
        while (kbatch := records.next_batch()) is not None:
            assert kbatch.validate_crc()
            bases.append(kbatch.base_offset)
            seen += [(r.offset, r.key, r.value) for r in kbatch]
    assert seen == [(o, k, v) for o, k, v, _ in scenario.records]
    assert bases == list(range(0, 60, 2))  # every batch kept at its base offset


STEPS = ["written", "swapped", "indexes_removed", "renamed"]


class Crash(Exception):
    pass


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_each_swap_step_loses_or_doubles_nothing(tmp_path: Path, step: str) -> None:
    scenario = build_history(tmp_path)
    before = read_all(scenario.log, 0)
    end = scenario.log.segment_bases[-1]

    def fail(at: str) -> None:
        if at == step:
            raise Crash(at)

    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    with pytest.raises(Crash):
        cleaner.clean(end, scenario.now, fail)
    # the process dies here: reopen from the files alone
    reopened = PartitionLog(tmp_path, scenario.log.config, files=FileCache())
    after = read_all(reopened, 0)
    assert not list(tmp_path.glob("*.cleaned")) and not list(tmp_path.glob("*.swap"))
    latest = model_compact([(*r, 0) for r in before], end, -1)
    expected_clean = [(o, k, v) for o, k, v, _ in latest]
    # offsets strictly increase (nothing doubled), every latest value present (nothing lost),
    # every record present is one of the originals
    offsets = [o for o, _, _ in after]
    assert offsets == sorted(set(offsets))
    assert set(expected_clean) <= set(after) <= set(before)
    # the first segment is either untouched or cleaned, never half
    first_end = reopened.sealed_segments()[0].next_offset
    head = [r for r in after if r[0] < first_end]
    assert head in (
        [r for r in before if r[0] < first_end],
        [r for r in expected_clean if r[0] < first_end],
    )
    # a later pass finishes the job
    Cleaner(reopened, CleanerConfig(min_cleanable_dirty_ratio=0.0)).clean(end, scenario.now)
    assert read_all(reopened, 0) == expected_clean
    assert reopened.next_offset == scenario.log.next_offset


def test_planted_bug_keeping_the_first_value_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def first_offsets(segments: list) -> dict[bytes, int]:
        first: dict[bytes, int] = {}
        for segment in segments:
            for header, data in cleaner_module._iter_batches(segment):
                if header.is_control or header.records_count == 0:
                    continue
                for r in cleaner_module.decode_batch(data).records:
                    if r.key is not None:
                        first.setdefault(r.key, r.offset)
        return first

    monkeypatch.setattr(cleaner_module, "latest_offsets", first_offsets)
    planted = settings(max_examples=200, deadline=None, phases=[Phase.generate], database=None)(
        given(**MODEL_INPUTS)(run_model)
    )
    with pytest.raises(AssertionError):
        planted()


def test_kafka_python_reads_batches_whose_records_all_went(tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, segment_bytes=300)
    for i in range(20):
        scenario.produce([(b"same", b"v%d" % i)])
    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    end = scenario.compact(cleaner, scenario.log.next_offset)
    assert end > 1
    scenario.log.close()
    seen, bases = [], []
    for path in sorted(tmp_path.glob("*.log")):
        records = MemoryRecords(path.read_bytes())
        while (kbatch := records.next_batch()) is not None:
            assert kbatch.validate_crc()
            bases.append(kbatch.base_offset)
            seen += [(r.offset, r.key, r.value) for r in kbatch]
    assert bases == list(range(20))  # emptied batches stay, at their offsets
    assert seen == [(o, k, v) for o, k, v, _ in scenario.records]
    assert seen[0][0] == end - 1  # the latest below the cleaned end, then the rest


def test_raft_entries_of_a_cleaned_log_keep_their_offsets_and_terms(tmp_path: Path) -> None:
    """A follower catching up from a cleaned leader gets the same entry boundaries and terms."""
    config = LogConfig(segment_bytes=300, fsync="never", retention_ms=-1)
    leader = RaftStorage(tmp_path / "leader", config)
    entries = [Entry(0, 1, EntryKind.NOOP, b"", 1)]
    for i in range(1, 30):
        batch = build_batch([Record(value=b"v%d" % i, key=b"k%d" % (i % 2), timestamp=1)])
        entries.append(Entry(i, 1 + i // 10, EntryKind.DATA, batch, 1))
    leader.append(entries)
    terms = [leader.term_at(i) for i in range(30)]
    cleaner = Cleaner(leader.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    assert cleaner.clean(leader.last_index() + 1, 1 << 50).records_removed > 0
    leader.close()
    leader = RaftStorage(tmp_path / "leader", config)  # off the disk, not the tail cache
    assert [leader.term_at(i) for i in range(30)] == terms
    served = leader.entries(0, 29, 1 << 20)
    assert [(e.index, e.term, e.kind, e.count) for e in served] == [
        (e.index, e.term, e.kind, e.count) for e in entries
    ]
    follower = RaftStorage(tmp_path / "follower", config)
    follower.append(served)
    assert [follower.term_at(i) for i in range(30)] == terms
    assert read_all(follower.log, 0) == read_all(leader.log, 0)
    leader.close()
    follower.close()


def test_planted_bug_cleaning_the_active_segment_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def everything(self: Cleaner, upto: int, now_ms: int) -> list:
        return [*self.log.sealed_segments(), self.log._segments[-1]]

    monkeypatch.setattr(Cleaner, "cleanable", everything)
    planted = settings(max_examples=200, deadline=None, phases=[Phase.generate], database=None)(
        given(**MODEL_INPUTS)(run_model)
    )
    with pytest.raises(AssertionError):
        planted()


def test_transactional_batches_are_kept_whole_and_supersede_nothing(tmp_path: Path) -> None:
    """Transactions are not wired yet: an aborted write must not hide a committed value."""
    scenario = Scenario(tmp_path, segment_bytes=300)
    scenario.produce([(b"k", b"committed")])
    for i in range(8):
        txn = build_batch(
            [Record(value=b"t%d" % i, key=b"k", timestamp=scenario.now)],
            transactional=True,
            producer_id=7,
            producer_epoch=0,
            base_sequence=i,
        )
        scenario.log.append(txn, term=1)
    scenario.log._roll()
    before = read_all(scenario.log, 0)
    stats = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0)).clean(
        scenario.log.next_offset, scenario.now
    )
    assert stats.end == scenario.log.next_offset and stats.records_removed == 0
    assert read_all(scenario.log, 0) == before


def test_a_segment_deleted_by_retention_during_a_pass_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = build_history(tmp_path)
    cleaner = Cleaner(scenario.log, CleanerConfig(min_cleanable_dirty_ratio=0.0))
    doomed = scenario.log.sealed_segments()[0]
    original = cleaner_module._iter_batches

    def racing(segment: object):  # retention drops the first segment as the cleaner reads it
        if segment is doomed and doomed in scenario.log.sealed_segments():
            scenario.log.drop_prefix(doomed.next_offset)
        return original(segment)

    monkeypatch.setattr(cleaner_module, "_iter_batches", racing)
    assert cleaner.clean(scenario.log.next_offset, scenario.now).end == 0  # gave up this pass
    stats = cleaner.clean(scenario.log.next_offset, scenario.now)
    assert stats.end == scenario.log.segment_bases[-1] and stats.records_removed > 0
    assert scenario.log.log_start_offset == doomed.next_offset
    assert read_all(scenario.log, doomed.next_offset)[-1][0] == scenario.log.next_offset - 1
