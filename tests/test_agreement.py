"""The survivors agree on one outcome: two ranks that die together on two hosts are named alike by
every survivor, and a death during a shrink (between a survivor's build and the vote, or just after
the vote) leaves every survivor on one group, never two."""

import functools

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce.backend import TESTING_DIE_IN_SHRINK_ENV
from multiproc import kill_after_first_call, run_ranks


def _two_hosts(rank):
    return {"RINGREDUCE_HOST_NAME": f"emulated-host-{rank // 2}"}


def _two_die_together(rank, world):
    # One on each host, at once: each host's survivor sees its own neighbour's pid go first.
    kill_after_first_call(rank, world, (1, 3))
    t = torch.full((1 << 16,), 1.0)
    with pytest.raises(ringreduce.RanksLostError) as caught:
        while True:
            dist.all_reduce(t)
    lost = caught.value.lost_ranks
    shrunk = ringreduce.shrink(None, lost)  # together until both have raised
    y = torch.full((10,), float(rank))
    dist.all_reduce(y, group=shrunk)
    return {"lost": lost, "after": float(y[0])}


def test_two_ranks_that_die_together_on_two_hosts_are_named_alike_by_every_survivor():
    results = run_ranks(4, _two_die_together, backend="ringreduce", env=_two_hosts, dying=(1, 3))
    assert [results[0], results[2]] == [{"lost": [1, 3], "after": 2.0}] * 2, results


def _die_in_the_shrink(rank, world):
    kill_after_first_call(rank, world, (world - 1,))
    group = None
    lost = []
    shrinks = 0
    while True:  # what a training loop does: on a loss, shrink (again if it must) and try again
        try:
            x = torch.full((10,), float(rank + 1))
            dist.all_reduce(x, group=group)
            break
        except ringreduce.RanksLostError as error:
            lost = error.lost_ranks
        while True:
            try:
                shrinks += 1
                group = ringreduce.shrink(group, lost)
                break
            except ringreduce.RanksLostError as error:
                lost = error.lost_ranks
    members = dist.get_process_group_ranks(group)
    return {"members": members, "sum": float(x[0]), "shrinks": shrinks}


def _rank_2_dies_at(point, rank):
    return {TESTING_DIE_IN_SHRINK_ENV: point} if rank == 2 else {}


# Rank 2 dies between its build of the shrunk group and the vote ("built": every survivor aborts and
# shrinks again without it), or just after voting ("voted": the group is committed with it, and the
# next call finds it lost).
@pytest.mark.parametrize("point", ["built", "voted"])
def test_a_death_during_a_shrink_leaves_every_survivor_on_one_group(point):
    results = run_ranks(4, _die_in_the_shrink, backend="ringreduce", dying=(2, 3),
                        env=functools.partial(_rank_2_dies_at, point))
    survivors = [results[0], results[1]]
    # Two shrinks each: one aborted ("built") or committed with rank 2 ("voted"), then one without it.
    assert [(r["members"], r["sum"], r["shrinks"]) for r in survivors] == [([0, 1], 3.0, 2)] * 2, results
