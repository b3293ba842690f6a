"""The classic Raft lab scenarios (MIT 6.5840 list) on the deterministic simulator.

Each test scripts faults on a simulated cluster; the simulator's checker verifies every safety
rule after each step, and the test asserts the scenario's own outcome (who leads, what commits).
"""

from __future__ import annotations

import random

from raftline.raftlog.simchaos import check_final
from raftline.raftlog.simcluster import LONG_REORDER, TICK, UNRELIABLE, NetConfig, Simulation
from raftline.raftlog.types import MessageType

ELECTION = 2 * 10 * TICK  # the longest randomized election timeout with the default config


def connected(sim: Simulation) -> list[int]:
    """Live nodes in the main partition: the first group given to partition(), minus
    disconnected nodes."""
    return [n for n in sim.live() if sim.groups.get(n, 0) == 0]


def await_leader(sim: Simulation, among: list[int] | None = None) -> int:
    nodes = among if among is not None else connected(sim)
    assert sim.run_until(lambda: sim.connected_leader(nodes) is not None, 10 * ELECTION)
    leader = sim.connected_leader(nodes)
    assert leader is not None
    return leader


def copies(sim: Simulation, offset: int, payload: bytes) -> int:
    """Live nodes that applied `payload`, committed at `offset`."""
    entry = sim.checker.committed_at(offset)
    if entry is None or entry.index != offset or entry.data != payload:
        return 0
    return len(sim.applied_at(entry.last_index))


def one(sim: Simulation, expected: int, count: int = 1, among: list[int] | None = None) -> int:
    """Like the lab's one(): get a fresh payload committed on >= expected nodes through a
    leader inside `among` (default: the main partition); return its offset."""
    deadline = sim.time + 20 * ELECTION
    while sim.time < deadline:
        leader = sim.connected_leader(among if among is not None else connected(sim))
        payload = sim.next_payload()
        offset = sim.propose(leader, payload, count) if leader is not None else None
        if offset is None:
            sim.run_for(TICK)
            continue
        done = lambda o=offset, p=payload: copies(sim, o, p) >= expected  # noqa: E731
        if sim.run_until(done, 2 * ELECTION):
            return offset
    raise AssertionError(f"no payload reached {expected} nodes within {20 * ELECTION}")


def test_initial_election_elects_one_leader_that_stays_without_failures() -> None:
    sim = Simulation(1, 3)
    leader = await_leader(sim)
    term = sim.nodes[leader].core.term
    assert term >= 1
    assert {sim.nodes[n].core.term for n in sim.live()} == {term}
    sim.run_for(2 * ELECTION)
    assert sim.leader() == leader
    assert sim.nodes[leader].core.term == term


def test_re_election_needs_a_quorum_and_a_rejoining_old_leader_does_not_disrupt() -> None:
    sim = Simulation(2, 3)
    first = await_leader(sim)
    sim.disconnect(first)
    second = await_leader(sim)
    assert second != first
    sim.reconnect(first)
    assert await_leader(sim) == second
    sim.run_for(ELECTION)
    assert sim.connected_leader(sim.live()) == second
    third = next(n for n in sim.live() if n != second)
    sim.disconnect(second)
    sim.disconnect(third)
    alone = next(n for n in sim.live() if n not in (second, third))
    sim.run_for(4 * ELECTION)
    assert sim.connected_leader([alone]) is None
    sim.reconnect(third)
    await_leader(sim)
    sim.reconnect(second)
    await_leader(sim)


def test_many_elections_keep_a_leader_whenever_four_of_seven_are_connected() -> None:
    sim = Simulation(3, 7)
    rng = random.Random(3)
    await_leader(sim)
    for _ in range(10):
        cut = rng.sample(sorted(sim.nodes), 3)
        for node in cut:
            sim.disconnect(node)
        await_leader(sim)
        for node in cut:
            sim.reconnect(node)
    await_leader(sim)


def test_basic_agreement_commits_proposals_at_consecutive_offsets_on_every_node() -> None:
    sim = Simulation(4, 3)
    leader = await_leader(sim)
    expected = sim.nodes[leader].core.last_index + 1  # after the leader's NOOP
    for count in (1, 3, 2):
        assert sim.checker.committed_at(expected) is None
        offset = one(sim, 3, count)
        assert offset == expected
        expected += count


def test_agreement_continues_with_a_follower_down_and_resumes_when_it_returns() -> None:
    sim = Simulation(5, 3)
    leader = await_leader(sim)
    one(sim, 3)
    follower = next(n for n in sim.live() if n != leader)
    sim.disconnect(follower)
    for _ in range(4):
        one(sim, 2)
    sim.reconnect(follower)
    last = one(sim, 3)
    assert sim.nodes[follower].applied >= last


def test_nothing_commits_with_both_followers_down() -> None:
    sim = Simulation(6, 3)
    leader = await_leader(sim)
    one(sim, 3)
    for follower in (n for n in sim.live() if n != leader):
        sim.disconnect(follower)
    offset = sim.propose(leader)
    assert offset is not None
    sim.run_for(4 * ELECTION)
    assert sim.checker.committed_offset() < offset


def test_no_agreement_without_a_majority_then_agreement_after_reconnect() -> None:
    sim = Simulation(7, 5)
    leader = await_leader(sim)
    one(sim, 5)
    followers = [n for n in sorted(sim.nodes) if n != leader][:3]
    for node in followers:
        sim.disconnect(node)
    offset = sim.propose(leader)
    assert offset is not None
    sim.run_for(4 * ELECTION)
    assert sim.checker.committed_offset() < offset
    for node in followers:
        sim.reconnect(node)
    one(sim, 5)


def test_concurrent_proposals_in_one_term_all_commit_at_distinct_offsets() -> None:
    sim = Simulation(8, 3)
    leader = await_leader(sim)
    term = sim.nodes[leader].core.term
    proposals = {sim.next_payload(): 0 for _ in range(5)}
    for payload in proposals:
        offset = sim.propose(leader, payload, 2)
        assert offset is not None
        proposals[payload] = offset
    assert sim.run_until(lambda: all(p in sim.acked for p in proposals), 4 * ELECTION)
    assert sim.nodes[leader].core.term == term
    assert len(set(proposals.values())) == 5
    assert all(sim.acked[p] == offset for p, offset in proposals.items())


def test_a_rejoining_partitioned_leader_has_its_uncommitted_tail_overwritten() -> None:
    sim = Simulation(9, 3)
    one(sim, 3)
    old = await_leader(sim)
    sim.disconnect(old)
    stale = [sim.next_payload() for _ in range(3)]
    for payload in stale:
        assert sim.propose(old, payload) is not None
    one(sim, 2)
    new = await_leader(sim)
    sim.disconnect(new)
    sim.reconnect(old)
    one(sim, 2)
    sim.reconnect(new)
    last = one(sim, 3)
    assert not set(stale) & set(sim.checker.committed_data())
    assert sim.nodes[old].applied >= last
    assert not {e.data for e in sim.nodes[old].log.all_entries()} & set(stale)


def test_fast_backup_repairs_long_divergent_logs_in_few_round_trips() -> None:
    sim = Simulation(10, 5, net=NetConfig(min_delay=3, max_delay=3))  # FIFO links, like TCP
    one(sim, 5)
    leader = await_leader(sim)
    partner, *majority = [n for n in sorted(sim.nodes) if n != leader]
    # The leader and one follower get 50 entries that can never commit...
    sim.partition(majority, [leader, partner])
    for _ in range(50):
        sim.propose(leader)
    # ...while the other three commit 50 of their own.
    for _ in range(50):
        one(sim, 3)
    # A second leader among those gets 50 uncommittable entries of another term, while the
    # first pair and the third node commit 50 more.
    second = await_leader(sim, majority)
    helper, joiner = [n for n in majority if n != second]
    sim.partition([leader, partner, joiner], [second, helper])
    for _ in range(50):
        sim.propose(second)
    for _ in range(50):
        one(sim, 3)
    # A fresh leader probes from its own log end, so the two divergent followers must back up
    # past 50 entries of another term.
    sim.crash(await_leader(sim))
    sim.rejected_appends.clear()
    sim.heal()
    one(sim, 4)
    assert sim.rejected_appends[(await_leader(sim), second)] >= 1
    # Conflict-term hints skip a whole term per round trip: a few rejections, not ~50.
    assert max(sim.rejected_appends.values()) <= 4


def test_committed_entries_survive_crashes_and_restarts_of_every_node() -> None:
    sim = Simulation(11, 3)
    one(sim, 3)
    for node in sorted(sim.nodes):
        sim.crash(node)
    for node in sorted(sim.nodes):
        sim.start(node)
    one(sim, 3)
    leader = await_leader(sim)
    sim.restart(leader)
    one(sim, 3)
    leader = await_leader(sim)
    down = next(n for n in sim.live() if n != leader)
    sim.crash(down)
    one(sim, 2)
    sim.restart(await_leader(sim))
    sim.start(down)
    last = one(sim, 3)
    assert sorted(sim.applied_at(last)) == [1, 2, 3]


def test_overlapping_crash_sets_keep_committed_entries() -> None:
    sim = Simulation(12, 5)
    for _ in range(5):
        one(sim, 5)
        leader = await_leader(sim)
        followers = [n for n in sorted(sim.nodes) if n != leader]
        sim.crash(followers[0])
        sim.crash(followers[1])
        one(sim, 3)
        for node in (leader, followers[2], followers[3]):
            sim.crash(node)
        sim.start(followers[0])
        sim.start(followers[1])
        sim.run_for(ELECTION)
        sim.start(followers[2])
        one(sim, 3)
        sim.start(leader)
        sim.start(followers[3])
    one(sim, 5)


def figure_8(sim: Simulation, rounds: int, disconnect: bool) -> None:
    """Propose on every live node, let a little time pass, knock out the leader, keep a majority."""
    rng = random.Random(sim.seed)
    one(sim, 1)
    size = len(sim.nodes)
    up = set(sim.nodes)
    for _ in range(rounds):
        leader = None
        for node in sorted(up):
            if sim.propose(node) is not None:
                leader = node
        sim.run_for(rng.randint(1, ELECTION // 2) if rng.random() < 0.1 else rng.randint(1, 13))
        if leader is not None:
            up.discard(leader)
            sim.disconnect(leader) if disconnect else sim.crash(leader)
        if len(up) < 3:
            node = rng.choice(sorted(set(sim.nodes) - up))
            up.add(node)
            sim.reconnect(node) if disconnect else sim.start(node)
    for node in sorted(set(sim.nodes) - up):
        sim.reconnect(node) if disconnect else sim.start(node)
    sim.net = NetConfig()
    one(sim, size)


def test_figure_8_never_commits_a_previous_term_entry_by_counting_replicas() -> None:
    figure_8(Simulation(13, 5), rounds=150, disconnect=False)


def test_figure_8_unreliable_with_long_reordering_stays_safe() -> None:
    figure_8(Simulation(14, 5, net=LONG_REORDER), rounds=150, disconnect=True)


def test_unreliable_agreement_makes_progress() -> None:
    sim = Simulation(15, 5, net=UNRELIABLE)
    for _ in range(20):
        one(sim, 1)
    sim.net = NetConfig()
    one(sim, 5)


def test_unreliable_churn_loses_no_acknowledged_proposal() -> None:
    sim = Simulation(16, 5, net=UNRELIABLE)
    rng = random.Random(16)

    def client() -> None:
        leader = sim.leader()
        if leader is not None:
            sim.propose(leader, count=rng.randint(1, 3))
        sim.call_at(sim.time + rng.randint(1, TICK), client)

    client()
    for _ in range(20):
        node = rng.choice(sorted(sim.nodes))
        roll = rng.random()
        if roll < 0.2:
            sim.disconnect(node)
        elif roll < 0.5:
            sim.reconnect(node)
            if not sim.nodes[node].alive:
                sim.start(node)
        elif roll < 0.7:
            sim.crash(node)
        sim.run_for(7 * ELECTION // 10)
    sim.heal()
    sim.net = NetConfig()
    for node in sorted(sim.nodes):
        if not sim.nodes[node].alive:
            sim.start(node)
    one(sim, 5)
    assert len(sim.acked) > 20
    check_final(sim)


def test_a_lagging_follower_catches_up_by_snapshot_after_the_leader_trims() -> None:
    sim = Simulation(17, 3)
    leader = await_leader(sim)
    lagging = next(n for n in sim.live() if n != leader)
    sim.disconnect(lagging)
    for _ in range(30):
        one(sim, 2)
    for node in sim.live():
        sim.compact(node)
    assert sim.nodes[leader].log.snapshot_meta().index > sim.nodes[lagging].log.last_index()
    sim.reconnect(lagging)
    last = one(sim, 3)
    assert sim.sent[MessageType.SNAPSHOT] >= 1
    assert sim.nodes[lagging].applied >= last


def test_a_crashed_follower_catches_up_by_snapshot_and_restarts_from_it() -> None:
    sim = Simulation(18, 3, net=UNRELIABLE)
    leader = await_leader(sim)
    down = next(n for n in sim.live() if n != leader)
    sim.crash(down)
    for _ in range(20):
        one(sim, 2)
        sim.compact(await_leader(sim))
    sim.start(down)
    one(sim, 3)
    assert sim.nodes[down].log.snapshot_meta().index >= 0
    sim.restart(down)
    last = one(sim, 3)
    assert sim.nodes[down].applied >= last


def test_every_node_restarts_from_its_snapshot_and_commit_never_goes_back() -> None:
    sim = Simulation(19, 3)
    for _ in range(5):
        for _ in range(8):
            one(sim, 3)
        for node in sorted(sim.nodes):
            sim.compact(node)
        before = sim.checker.committed_offset()
        for node in sorted(sim.nodes):
            sim.crash(node)
        for node in sorted(sim.nodes):
            sim.start(node)
            assert sim.nodes[node].core.commit_index >= sim.nodes[node].log.snapshot_meta().index
        assert one(sim, 3) > before


def test_membership_changes_under_leader_crashes_keep_one_configuration() -> None:
    sim = Simulation(20, 3, spares=2)
    one(sim, 3)

    def change(voters: set[int], learners: set[int]) -> None:
        for _ in range(50):
            leader = await_leader(sim)
            core = sim.nodes[leader].core
            if (set(core.voters), set(core.learners)) == (voters, learners):
                return
            sim.change_membership(leader, voters, learners)
            sim.run_for(ELECTION)
        raise AssertionError(f"membership never became {voters} / {learners}")

    sim.join(4, (1, 2, 3), (4,))
    change({1, 2, 3}, {4})
    change({1, 2, 3, 4}, set())
    sim.crash(await_leader(sim))
    one(sim, 3)
    for node in sorted(sim.nodes):
        if not sim.nodes[node].alive and sim.nodes[node].bootstrap[0]:
            sim.start(node)
    leaving = await_leader(sim)
    change({1, 2, 3, 4} - {leaving}, set())
    last = one(sim, 3)
    members = {1, 2, 3, 4} - {leaving}
    assert sorted(n for n in sim.applied_at(last) if n in members) == sorted(members)
    for node in members:
        assert set(sim.nodes[node].core.voters) == members


def test_read_index_never_answers_below_an_acknowledged_commit() -> None:
    sim = Simulation(21, 3, net=UNRELIABLE)
    await_leader(sim)
    answered = 0
    for _ in range(30):
        one(sim, 1)
        for node in sim.live():
            if sim.read(node) is not None:
                answered += 1
        sim.run_for(ELECTION // 4)
    assert answered > 0
