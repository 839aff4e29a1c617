"""A future's callback that makes another collective on the same group and waits for it (torch's
PowerSGD hook does this): it completes, with the right values, on every transport and collective."""

import datetime
import subprocess
import sys

import pytest
import torch

import ringreduce
from matrices import COLLECTIVES, PROCESS_TRANSPORTS
from multiproc import run_ranks

NUMEL = 1000
# Far above what the calls take: a deadlock fails the test instead of hanging it.
WAIT_S = 60


def _chain(where):
    """The collective, then in its callback an all-reduce that is waited for there: the future of
    what the callback returns, which holds the inner all-reduce's result."""
    def inner(fut):
        fut.value()
        return ringreduce.all_reduce(torch.full((7,), 2.0), async_op=True, **where).get_future().wait()[0]
    return inner


def _issue(collective, world, where):
    work = COLLECTIVES[collective](NUMEL, world, async_op=True, **where)
    return work.get_future().then(_chain(where))


def _check(future, world, context):
    result = future.wait()
    assert torch.equal(result, torch.full((7,), 2.0 * world)), f"{context}: {result}"


@pytest.mark.parametrize("collective", sorted(COLLECTIVES))
@pytest.mark.parametrize("world", [2, 3])
def test_on_local_ranks(world, collective):
    local = ringreduce.LocalWorld(world, timeout=datetime.timedelta(seconds=WAIT_S))
    futures = [_issue(collective, world, {"group": local.group(r)}) for r in range(world)]
    for rank, future in enumerate(futures):
        _check(future, world, f"rank {rank}")


def _every_collective(rank, world, transport):
    for collective in sorted(COLLECTIVES):
        _check(_issue(collective, world, {"transport": transport}), world, collective)
        # Two in flight at once: the second's callback runs after the first's, on every rank.
        first = _issue(collective, world, {"transport": transport})
        second = _issue(collective, world, {"transport": transport})
        _check(first, world, collective)
        _check(second, world, collective)
    return True


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("transport", PROCESS_TRANSPORTS)
def test_on_processes(transport, world):
    assert run_ranks(world, _every_collective, transport, env={"RINGREDUCE_TIMEOUT": str(WAIT_S)}) == [True] * world


# The callbacks hold the only references to the group: when they are released, on the engine's
# worker, the communicators go with them there.
LAST_REFERENCE_IN_A_CALLBACK = """
import torch, ringreduce
world = ringreduce.LocalWorld(2)
tensors = [torch.ones(1 << 20), torch.ones(1 << 20)]
chained = []
for rank in range(2):
    group = world.group(rank)
    work = ringreduce.all_reduce(tensors[rank], group=group, async_op=True)
    chained.append(work.get_future().then(lambda fut, group=group: fut.value()[0].sum().item()))
del world, group, work
assert [f.wait() for f in chained] == [2.0 * (1 << 20)] * 2
"""


def test_a_group_released_by_its_last_callback_is_torn_down_safely():
    for _ in range(5):
        done = subprocess.run([sys.executable, "-c", LAST_REFERENCE_IN_A_CALLBACK], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
