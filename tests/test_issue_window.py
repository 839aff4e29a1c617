"""The issue window of the nccl transport, on the CPU: however many launches an exchange brings
(the central root queues N-1 reductions per exchange), the host never has more operations queued
ahead of the device than the window holds, and waits, polling, while the device is slow."""

import pytest

from ringreduce import _C

# nccl_transport.h: the window, and what one exchange queues (its NCCL group and our event).
WINDOW_OPS = 512
OPS_PER_EXCHANGE = 5
MARK = 0  # in a script: an event queued after what came before


def central_root_script(world, exchanges):
    """What the central root queues: per gather exchange the group, its event, then one reduction
    kernel per peer (counted without an event of its own)."""
    script = []
    for _ in range(exchanges):
        script += [OPS_PER_EXCHANGE, MARK] + [1] * (world - 1)
    return script


@pytest.mark.parametrize("world", [2, 8, 32, 64, 200])
def test_the_window_bounds_queued_operations_whatever_the_world_size(world):
    most, pauses = _C._testing.issue_window_run(WINDOW_OPS, central_root_script(world, 64), 3)
    assert most <= WINDOW_OPS
    # Once the script outgrows the window, the host had to wait for the slow device.
    assert (pauses > 0) == (64 * (OPS_PER_EXCHANGE + world - 1) > WINDOW_OPS)


def test_a_device_that_never_finishes_keeps_the_host_waiting_in_the_window():
    """The fake device passes no marker: the host waits, polling, with the window full and no more,
    until it gives up (where the watchdog raises)."""
    with pytest.raises(RuntimeError, match="stalled with") as info:
        _C._testing.issue_window_run(WINDOW_OPS, central_root_script(32, 64), 0)
    in_flight = int(str(info.value).split()[2])
    assert WINDOW_OPS - OPS_PER_EXCHANGE < in_flight <= WINDOW_OPS, in_flight
