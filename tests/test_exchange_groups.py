"""The groups a transport that groups like NCCL hands over (no posting ahead, one group per exchange),
traced through the real algorithms on the host: they must match across ranks and never deadlock.

A GPU machine with one GPU cannot run NCCL with two ranks, so this is where the order in which the
ring and the central reducer post their transfers is checked against NCCL's group semantics.
"""

import pytest

from ringreduce import _C


def run_groups(groups_per_rank):
    """Play NCCL's rules: a rank's groups run one after another on its stream; a group finishes when
    each of its transfers has met its partner (the k-th send from a to b meets the k-th receive at b
    from a) while the partner's group is running too. Returns the number of groups that finished;
    raises AssertionError on a deadlock or a size mismatch."""
    world = len(groups_per_rank)
    # Number every transfer by its pair order so partners can be found.
    labelled = []
    counts = {}
    for rank, groups in enumerate(groups_per_rank):
        labelled.append([])
        for group in groups:
            ops = []
            for is_send, peer, nbytes in group:
                key = (rank, peer) if is_send else (peer, rank)
                index = counts.get((key, is_send), 0)
                counts[(key, is_send)] = index + 1
                ops.append((is_send, key, index, nbytes))
            labelled[-1].append(ops)
    assert all(counts.get((key, True), 0) == counts.get((key, False), 0) for key, _ in counts), "unmatched transfers"
    head = [0] * world
    done = set()
    finished = 0
    while any(head[r] < len(labelled[r]) for r in range(world)):
        running = {}
        for rank in range(world):
            if head[rank] < len(labelled[rank]):
                for op in labelled[rank][head[rank]]:
                    running[op[:3]] = op[3]
        progress = False
        for (is_send, key, index), nbytes in running.items():
            partner = (not is_send, key, index)
            if partner in running:
                sent, expected = (nbytes, running[partner]) if is_send else (running[partner], nbytes)
                assert sent == expected, f"{key} message {index}: {sent} bytes sent, {expected} expected"
                if (is_send, key, index) not in done:
                    done.add((is_send, key, index))
                    progress = True
        for rank in range(world):
            if head[rank] < len(labelled[rank]) and all(op[:3] in done for op in labelled[rank][head[rank]]):
                head[rank] += 1
                finished += 1
                progress = True
        assert progress, f"deadlock: the ranks stop at groups {head}"
    return finished


def groups_of(numel, world, segment_bytes, lanes, algorithm):
    return [_C._testing.exchange_groups(numel, world, rank, segment_bytes, lanes, algorithm) for rank in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("lanes", [1, 2, 3])
@pytest.mark.parametrize("numel,segment_bytes", [(0, 64), (1, 64), (7, 4), (1000, 64), (4096, 1024), (10_007, 640)])
def test_ring_hands_over_one_send_and_one_receive_per_step_in_the_same_order_on_every_rank(
    world, lanes, numel, segment_bytes
):
    groups = groups_of(numel, world, segment_bytes, lanes, "ring")
    assert len({len(g) for g in groups}) == 1, "every rank hands over the same number of groups"
    for rank, rank_groups in enumerate(groups):
        for group in rank_groups:
            assert sorted((is_send, peer) for is_send, peer, _ in group) == [
                (False, (rank - 1) % world), (True, (rank + 1) % world)
            ], f"rank {rank}: a group must be one step's send and receive, got {group}"
    assert run_groups(groups) == world * len(groups[0])


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("numel,segment_bytes", [(0, 64), (1, 64), (1000, 64), (10_007, 640)])
def test_central_groups_match_and_finish(world, numel, segment_bytes):
    groups = groups_of(numel, world, segment_bytes, 1, "central")
    assert run_groups(groups) == sum(len(g) for g in groups)
    if numel > 0:
        # The root hands each segment's results to every peer in one group, not one group per peer.
        result_groups = [g for g in groups[0] if all(is_send for is_send, _, _ in g)]
        segments = len(_C._testing.central_schedule(numel, 4, segment_bytes))
        assert len(result_groups) == segments
        assert all(sorted(peer for _, peer, _ in g) == list(range(1, world)) for g in result_groups)


def test_the_simulator_catches_a_rank_that_waits_for_a_send_queued_behind_it():
    # Each rank first receives, then sends: every rank's first group waits for a peer's second one.
    groups = [[[(False, 1, 8)], [(True, 1, 8)]], [[(False, 0, 8)], [(True, 0, 8)]]]
    with pytest.raises(AssertionError, match="deadlock"):
        run_groups(groups)
    with pytest.raises(AssertionError, match="bytes sent"):
        run_groups([[[(True, 1, 8)]], [[(False, 0, 4)]]])
