"""The segment schedule, on its own: simulate the ring it describes and count contributions."""

import numpy as np
import pytest

from ringreduce import _C


def simulate_ring(numel, elem_size, world, segment_bytes, lanes=1):
    """Run the schedule of every rank as message passing; return per-rank contribution counts.

    holds[r][i, s] counts how many times rank s's input has entered element i on rank r.
    """
    holds = [np.zeros((numel, world), dtype=np.int64) for _ in range(world)]
    for rank in range(world):
        holds[rank][:, rank] = 1
    schedules = [_C._testing.ring_schedule(numel, elem_size, world, rank, segment_bytes, lanes) for rank in range(world)]
    lengths = {len(s) for s in schedules}
    assert len(lengths) == 1, "every rank must make the same number of transfers"
    for k in range(lengths.pop()):
        # All ranks send first (snapshots), then receive: the same ordering the engine enforces.
        outgoing = []
        for rank in range(world):
            send_off, send_cnt, *_ = schedules[rank][k]
            outgoing.append(holds[rank][send_off : send_off + send_cnt].copy())
        for rank in range(world):
            prev = (rank - 1) % world
            _, _, recv_off, recv_cnt, reduce, *_ = schedules[rank][k]
            prev_off, prev_cnt = schedules[prev][k][0], schedules[prev][k][1]
            assert (prev_off, prev_cnt) == (recv_off, recv_cnt), "a receive must match the peer's send"
            if reduce:
                holds[rank][recv_off : recv_off + recv_cnt] += outgoing[prev]
            else:
                holds[rank][recv_off : recv_off + recv_cnt] = outgoing[prev]
    return holds, schedules


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("numel", [0, 1, 2, 7, 15, 16, 17, 100, 1001])
@pytest.mark.parametrize("elem_size,segment_bytes", [(4, 1 << 20), (4, 36), (2, 10), (8, 8), (1, 3)])
@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_ring_reduces_every_element_once_for_every_rank(world, numel, elem_size, segment_bytes, lanes):
    holds, schedules = simulate_ring(numel, elem_size, world, segment_bytes, lanes)
    for rank in range(world):
        assert (holds[rank] == 1).all(), f"rank {rank}: an element misses or repeats a contribution"
    # Each element takes exactly one `last` reduction (where AVG divides), across all ranks.
    lasts = np.zeros(numel, dtype=np.int64)
    for schedule in schedules:
        for _, _, off, cnt, reduce, last, *_ in schedule:
            assert reduce or not last
            if last:
                lasts[off : off + cnt] += 1
    if world > 1:
        assert (lasts == 1).all()


@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("numel,segment_bytes", [(1, 4), (10, 4), (1000, 36), (4096, 1 << 20)])
@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_every_send_after_a_segments_first_step_forwards_its_lanes_receive_before_it(
    world, numel, segment_bytes, lanes
):
    steps = 2 * (world - 1)
    for rank in range(world):
        in_flight = {}  # lane -> (span received at the lane's last position, steps the segment made)
        for send_off, send_cnt, recv_off, recv_cnt, _, _, send_own, forward, lane in _C._testing.ring_schedule(
            numel, 4, world, rank, segment_bytes, lanes
        ):
            assert 0 <= lane < lanes
            if send_own:
                assert lane not in in_flight, "a lane starts a segment before finishing the one it holds"
                made = 0
            else:
                received, made = in_flight.pop(lane)
                assert received == (send_off, send_cnt), "the send must pass on the lane's last receive"
            made += 1
            assert forward == (made < steps)  # a segment's last all-gather step keeps what it gets
            if forward:
                in_flight[lane] = ((recv_off, recv_cnt), made)
        assert not in_flight, "a segment stopped before its last step"


@pytest.mark.parametrize("world", [2, 3, 5])
def test_one_lane_is_segment_major_and_two_lanes_alternate(world):
    steps = 2 * (world - 1)
    numel = 4 * world * 16  # four segments of 16 float32 per chunk
    one = _C._testing.ring_schedule(numel, 4, world, 0, 64, 1)
    assert [t[6] for t in one] == [k % steps == 0 for k in range(len(one))]
    assert {t[8] for t in one} == {0}
    two = _C._testing.ring_schedule(numel, 4, world, 0, 64, 2)
    assert len(two) == 4 * steps
    # Consecutive positions are in different lanes: one lane's transfer never waits for the other's reduction.
    assert [t[8] for t in two] == [k % 2 for k in range(len(two))]


def test_ring_moves_2_n_minus_1_over_n_of_the_buffer():
    numel, world = 1 << 16, 4
    for rank in range(world):
        sent = sum(t[1] for t in _C._testing.ring_schedule(numel, 4, world, rank, 4096))
        assert sent == 2 * (world - 1) * numel // world


def test_segments_respect_the_size_and_start_aligned():
    schedule = _C._testing.ring_schedule(100_000, 4, 3, 1, 1000)
    for send_off, send_cnt, recv_off, recv_cnt, *_ in schedule:
        assert send_cnt <= 240 and recv_cnt <= 240  # 1000 bytes rounded down to 64-byte multiples
        assert send_off % 16 == 0 and recv_off % 16 == 0


@pytest.mark.parametrize("numel,segment_bytes", [(0, 64), (1, 64), (1000, 64), (1000, 3), (12345, 4096)])
def test_central_schedule_covers_the_buffer_once(numel, segment_bytes):
    covered = np.zeros(numel, dtype=np.int64)
    for offset, count in _C._testing.central_schedule(numel, 4, segment_bytes):
        assert 0 < count and count * 4 <= max(segment_bytes, 4)
        covered[offset : offset + count] += 1
    assert (covered == 1).all()


def pass_messages(plans, outgoing, incoming):
    """Run each rank's plan of steps (peer, sends, receives) as message passing, each send queued
    until its receive: a step first queues its message to its peer (outgoing(rank, step)), then
    takes the peer's oldest one (incoming(rank, step, message)). Fails on a receive that no send
    can ever meet (a hang), and on messages nobody received."""
    world = len(plans)
    queues = {}  # (src, dst) -> messages in flight, in order
    position = [0] * world
    posted = [False] * world  # the current step's send is queued
    progress = True
    while progress:
        progress = False
        for rank in range(world):
            if position[rank] == len(plans[rank]):
                continue
            peer, sends, receives = plans[rank][position[rank]]
            if sends and not posted[rank]:
                queues.setdefault((rank, peer), []).append(outgoing(rank, position[rank]))
                posted[rank] = progress = True
            if receives:
                arrived = queues.get((peer, rank), [])
                if not arrived:
                    continue
                incoming(rank, position[rank], arrived.pop(0))
            posted[rank] = False
            position[rank] += 1
            progress = True
    stuck = [rank for rank in range(world) if position[rank] != len(plans[rank])]
    assert not stuck, f"world {world}: ranks {stuck} wait for a message that never comes"
    assert not any(queues.values()), f"world {world}: messages nobody received"


def simulate_doubling(world):
    """Run every rank's doubling schedule as message passing. Each rank starts holding {rank}; a
    combination is the union. Returns what each rank ends with, and how many messages each rank sent."""
    schedules = [_C._testing.doubling_schedule(world, rank) for rank in range(world)]
    holds = [frozenset([rank]) for rank in range(world)]
    sent = [0] * world

    def outgoing(rank, step):
        sent[rank] += 1
        return holds[rank]

    def incoming(rank, step, value):
        holds[rank] = value if schedules[rank][step][1] == "take_back" else holds[rank] | value

    plans = [[(peer, role in ("hand_over", "exchange", "hand_back"), role in ("take_over", "exchange", "take_back"))
              for peer, role in steps] for steps in schedules]
    pass_messages(plans, outgoing, incoming)
    return holds, sent


@pytest.mark.parametrize("world", list(range(1, 18)) + [31, 32, 33, 100])
def test_recursive_doubling_brings_every_rank_every_value_in_log_messages(world):
    holds, sent = simulate_doubling(world)
    assert holds == [frozenset(range(world))] * world
    rounds = world.bit_length() - 1  # log2 of the largest power of two not above world
    assert max(sent) == rounds + (world > 2**rounds), sent
    assert sum(sent) == 2**rounds * rounds + 2 * (world - 2**rounds), sent


def simulate_halving_doubling(numel, world):
    """Run every rank's halving-doubling schedule as message passing (an empty span moves nothing,
    on both sides). Each rank starts with element e holding one contribution of its own; a reduction
    adds the contributions of the received span, a copy replaces them. Returns the (numel, world)
    tallies each rank ends with, the elements each rank sent, and each rank's steps. Fails where a
    received span is not the one sent."""
    schedules = [_C._testing.halving_doubling_schedule(numel, 4, world, rank) for rank in range(world)]
    tallies = [np.zeros((numel, world), dtype=np.int64) for _ in range(world)]
    for rank in range(world):
        tallies[rank][:, rank] = 1
    sent = [0] * world

    def outgoing(rank, step):
        at, count = schedules[rank][step][2]
        sent[rank] += count
        return (at, count), tallies[rank][at : at + count].copy()

    def incoming(rank, step, message):
        peer, _, _, (at, count), reduce, _ = schedules[rank][step]
        span, rows = message
        assert span == (at, count), (world, rank, peer, span, (at, count))
        if reduce:
            tallies[rank][at : at + count] += rows
        else:
            tallies[rank][at : at + count] = rows

    plans = [[(step[0], step[2][1] > 0, step[3][1] > 0) for step in steps] for steps in schedules]
    pass_messages(plans, outgoing, incoming)
    return tallies, sent, schedules


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17])
@pytest.mark.parametrize("numel", [0, 1, 5, 1000, 4096])
def test_halving_doubling_gives_every_rank_every_contribution_once_moving_what_the_ring_does(numel, world):
    tallies, sent, schedules = simulate_halving_doubling(numel, world)
    assert all((t == 1).all() for t in tallies)
    p = 1 << (world.bit_length() - 1)  # the largest power of two not above world
    rounds = p.bit_length() - 1
    for rank, steps in enumerate(schedules):
        exchanges = [s for s in steps if s[1] == "exchange"]
        assert len(exchanges) == (2 * rounds if rank < p else 0)
        assert len(steps) == len(exchanges) + (2 if rank >= p or rank + p < world else 0)
        # One reduction of each element is its last (AVG divides there): the last reducing exchange's.
        lasts = [s for s in steps if s[5]]
        assert len(lasts) == (1 if rank < p and rounds > 0 else 0) and all(s[4] for s in lasts)
        if rank < p and rounds > 0:
            assert lasts[0] is [s for s in exchanges if s[4]][-1]
    if numel == 4096 and world == p:  # chunks of 1024 elements: 2(p-1)/p of the buffer, as the ring
        assert sent == [2 * (p - 1) * numel // p] * world
