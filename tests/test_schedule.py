"""The segment schedule, on its own: simulate the ring it describes and count contributions."""

import numpy as np
import pytest

from ringreduce import _C


def simulate_ring(numel, elem_size, world, segment_bytes):
    """Run the schedule of every rank as message passing; return per-rank contribution counts.

    holds[r][i, s] counts how many times rank s's input has entered element i on rank r.
    """
    holds = [np.zeros((numel, world), dtype=np.int64) for _ in range(world)]
    for rank in range(world):
        holds[rank][:, rank] = 1
    schedules = [_C.ring_schedule(numel, elem_size, world, rank, segment_bytes) for rank in range(world)]
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
def test_ring_reduces_every_element_once_for_every_rank(world, numel, elem_size, segment_bytes):
    holds, schedules = simulate_ring(numel, elem_size, world, segment_bytes)
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
def test_every_send_after_a_segments_first_step_forwards_the_receive_before_it(world, numel, segment_bytes):
    steps = 2 * (world - 1)
    for rank in range(world):
        schedule = _C.ring_schedule(numel, 4, world, rank, segment_bytes)
        for k, (send_off, send_cnt, recv_off, recv_cnt, _, _, send_own, forward) in enumerate(schedule):
            assert send_own == (k % steps == 0)
            if not send_own:
                before = schedule[k - 1]
                assert before[7] and (before[2], before[3]) == (send_off, send_cnt)
            assert forward == (k % steps != steps - 1)  # a segment's last all-gather step keeps what it gets


def test_ring_moves_2_n_minus_1_over_n_of_the_buffer():
    numel, world = 1 << 16, 4
    for rank in range(world):
        sent = sum(t[1] for t in _C.ring_schedule(numel, 4, world, rank, 4096))
        assert sent == 2 * (world - 1) * numel // world


def test_segments_respect_the_size_and_start_aligned():
    schedule = _C.ring_schedule(100_000, 4, 3, 1, 1000)
    for send_off, send_cnt, recv_off, recv_cnt, *_ in schedule:
        assert send_cnt <= 240 and recv_cnt <= 240  # 1000 bytes rounded down to 64-byte multiples
        assert send_off % 16 == 0 and recv_off % 16 == 0


@pytest.mark.parametrize("numel,segment_bytes", [(0, 64), (1, 64), (1000, 64), (1000, 3), (12345, 4096)])
def test_central_schedule_covers_the_buffer_once(numel, segment_bytes):
    covered = np.zeros(numel, dtype=np.int64)
    for offset, count in _C.central_schedule(numel, 4, segment_bytes):
        assert 0 < count and count * 4 <= max(segment_bytes, 4)
        covered[offset : offset + count] += 1
    assert (covered == 1).all()
