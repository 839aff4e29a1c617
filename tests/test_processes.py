"""The process transports (`pg` over gloo, `shm`) in separate processes, against torch.distributed.all_reduce."""

import os

import pytest
import torch
import torch.distributed as dist

import ringreduce
from multiproc import run_ranks
from reference import ALL_DTYPES, R, exact_inputs, ops_for, reference


def _matrix(rank, world, transport):
    checks = 0
    # halving_doubling, an algorithm between hosts, on gloo's pairs only: tests/test_local.py runs it on
    # every dtype and op at 1-16 thread ranks, and _random_floats_and_async below on shm too.
    algorithms = ("ring", "central", "one_shot", "doubling") + (("halving_doubling",) if transport == "pg" else ())
    # 30,011: 4 to 29 segments of 8 KiB by dtype; 99,991 took twice as long for no more paths.
    for numel in sorted({0, 1, world - 1, world, 30_011}):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, numel, dtype, op)
                expected = reference(inputs, op)
                # torch.distributed once per case: the algorithms below must all give its bits.
                theirs = inputs[rank].clone()
                dist.all_reduce(theirs, op)
                assert torch.equal(theirs, expected), f"torch.distributed numel={numel} {dtype} {op}"
                for algorithm in algorithms:
                    mine = inputs[rank].clone()
                    ringreduce.all_reduce(mine, op, algorithm=algorithm, transport=transport, segment_bytes=8192)
                    assert torch.equal(mine, expected), f"{algorithm} numel={numel} {dtype} {op}"
                    checks += 1
    return checks


def _random_floats_and_async(rank, world, transport):
    gen = torch.Generator().manual_seed(rank)
    results = {}
    for algorithm in ("ring", "central", "one_shot", "halving_doubling", "auto"):
        data = torch.randn(1 << 18, generator=gen)
        expected = data.clone()
        dist.all_reduce(expected)
        mine = data.clone()
        ringreduce.all_reduce(mine, algorithm=algorithm, transport=transport)
        torch.testing.assert_close(mine, expected, rtol=1e-5, atol=1e-5)
        # Async: several in flight, completed in issue order, each future holding [tensor].
        tensors = [torch.full((1000 + i,), float(rank + i)) for i in range(8)]
        works = [ringreduce.all_reduce(t, async_op=True, algorithm=algorithm, transport=transport) for t in tensors]
        for i, work in enumerate(works):
            work.wait()
            assert work.is_completed()
            value = work.get_future().value()
            assert isinstance(value, list) and value[0].data_ptr() == tensors[i].data_ptr()
            assert torch.equal(tensors[i], torch.full((1000 + i,), float(sum(r + i for r in range(world)))))
        results[algorithm] = mine
    # The bits are the same on every rank: returned to the parent for comparison.
    return {k: v.view(torch.int32).sum().item() for k, v in results.items()}


@pytest.mark.parametrize("transport", ["pg", "shm"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_torch_distributed_for_every_dtype_and_op(world, transport):
    checks = run_ranks(world, _matrix, transport)
    assert checks[0] > 0 and len(set(checks)) == 1


@pytest.mark.parametrize("transport", ["pg", "shm"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_random_floats_and_async_handles(world, transport):
    digests = run_ranks(world, _random_floats_and_async, transport)
    assert all(d == digests[0] for d in digests), "ranks hold different bits"


def _in_lanes(rank, world):
    checks = 0
    for lanes in ("1", "2", "3"):
        os.environ["RINGREDUCE_LANES"] = lanes
        for numel in sorted({0, 1, world, 10_007, 99_991}):
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                for op in (R.SUM, R.MAX):
                    inputs = exact_inputs(world, numel, dtype, op)
                    mine = inputs[rank].clone()
                    ringreduce.all_reduce(mine, op, algorithm="ring", transport="pg", segment_bytes=4096)
                    assert torch.equal(mine, reference(inputs, op)), f"lanes={lanes} numel={numel} {dtype} {op}"
                    checks += 1
    return checks


@pytest.mark.parametrize("world", [2, 3, 4])
def test_pg_ring_in_several_lanes_matches_the_reference(world):
    # pg keeps lanes apart by tag, so this runs the interleaved schedule, per-lane staging and
    # lane-ordered matching that the nccl transport relies on.
    checks = run_ranks(world, _in_lanes)
    assert checks[0] == 3 * len({0, 1, world, 10_007, 99_991}) * 3 * 2 and len(set(checks)) == 1


def _subgroups(rank, world, transport):
    evens = dist.new_group([0, 2])  # collective: every rank creates every group
    tail = dist.new_group([1, 2])
    t = torch.full((10_007,), float(rank + 1))
    if rank in (0, 2):
        ringreduce.all_reduce(t, group=evens, transport=transport)
        assert torch.equal(t, torch.full_like(t, 4.0))  # 1 + 3: rank 1 took no part
    else:
        with pytest.warns(UserWarning, match="does not belong"):
            assert ringreduce.all_reduce(t, group=evens, transport=transport) is None
        assert torch.equal(t, torch.full_like(t, 2.0)), "a rank outside the group must keep its tensor"
    u = torch.full((3,), float(rank))
    if rank in (1, 2):
        # Group rank 1 is global rank 2: the root is given in group ranks, as in torch.distributed.
        ringreduce.all_reduce(u, group=tail, algorithm="central", root=1, transport=transport)
        assert torch.equal(u, torch.full_like(u, 3.0))
    # Both subgroups share the default group's store: WORLD still works beside them.
    v = torch.ones(100)
    ringreduce.all_reduce(v, transport=transport)
    assert torch.equal(v, torch.full_like(v, 3.0))
    return True


@pytest.mark.parametrize("transport", ["pg", "shm"])
def test_subgroups_reduce_among_their_members_only(transport):
    assert run_ranks(3, _subgroups, transport) == [True, True, True]


def _under_wait_strategy(rank, world):
    inputs = exact_inputs(world, 10_007, torch.float32, R.SUM)
    for algorithm in ("ring", "central", "one_shot"):
        mine = inputs[rank].clone()
        ringreduce.all_reduce(mine, algorithm=algorithm, transport="shm", segment_bytes=4096)
        assert torch.equal(mine, reference(inputs, R.SUM)), algorithm
    return os.environ["RINGREDUCE_WAIT"]


@pytest.mark.parametrize("strategy", ["spin", "yield", "sleep"])
def test_every_wait_strategy_of_shm_gives_the_same_results(strategy):
    assert run_ranks(3, _under_wait_strategy, env={"RINGREDUCE_WAIT": strategy}) == [strategy] * 3


def test_a_wait_stops_yielding_once_its_yields_hand_the_core_to_no_one():
    """The default plan yields at most 1000 us, and at most 50 us of it in yields that hand the
    core to no one (under 5 us each): those are polls, and a polling rank keeps the scheduler from
    moving queued work to its core."""
    from ringreduce._C import _testing

    assert _testing.yield_phase_length(1000, 50, [1.0] * 100) == 50  # nothing else runnable: 50 polls
    assert _testing.yield_phase_length(1000, 50, [100.0] * 100) == 10  # a peer runs each time: the whole 1000 us
    assert _testing.yield_phase_length(1000, 50, [1.0, 100.0] * 100) == 20  # 10 turns of a peer, 10 polls
    assert _testing.yield_phase_length(1000, 50, [4.9] * 20) == 11  # 10 polls of 4.9 us stay under 50 us
    assert _testing.yield_phase_length(1000, 50, [5.0] * 300) == 200  # 5 us is a peer's turn
    assert _testing.yield_phase_length(0, 0, [1.0]) == 1  # the sleep plan: nothing after the first


def test_a_long_wait_between_two_shm_ranks_polls_at_most_the_plans_idle_yield():
    """Two shm ranks as threads, with RINGREDUCE_WAIT unset: the receiver of words sent 20 ms and
    0.2 ms apart spends at most 50 us (and one yield under 5 us) of each wait in yields that hand
    its core to no one; the plan before this one polled the whole 1 ms."""
    from ringreduce._C import _testing

    assert "RINGREDUCE_WAIT" not in os.environ
    idle = _testing.shm_idle_yield_per_wait([20_000.0] * 4 + [200.0] * 4)
    assert len(idle) == 8 and all(0 <= us < 55 for us in idle), idle


def _bad_wait_strategy(rank, world):
    with pytest.raises(ValueError, match="RINGREDUCE_WAIT='busy' is not a wait strategy"):
        ringreduce.all_reduce(torch.ones(3), transport="shm")
    return True


def test_an_unknown_wait_strategy_is_refused():
    assert run_ranks(2, _bad_wait_strategy, env={"RINGREDUCE_WAIT": "busy"}) == [True, True]


def _repeated_calls(rank, world):
    """Calls that differ in one argument each, made again and again in a mixed order: the fast path
    (calls that passed the checks once are run again from C++) must tell every one apart."""
    from ringreduce._groups import checked_calls

    evens = dist.new_group([0, 2])
    calls = [
        dict(dtype=torch.float32, op=R.SUM, algorithm="ring", transport="shm"),
        dict(dtype=torch.float32, op=R.SUM, algorithm="ring", transport="pg"),
        dict(dtype=torch.float32, op=R.MAX, algorithm="ring", transport="shm"),
        dict(dtype=torch.float64, op=R.SUM, algorithm="ring", transport="shm"),
        dict(dtype=torch.int32, op=R.SUM, algorithm="central", transport="shm"),
        dict(dtype=torch.float32, op=R.SUM, algorithm="one_shot", transport=None),
        dict(dtype=torch.float32, op=R.SUM, algorithm="".join(["au", "to"]), transport="shm"),  # equal, not the same str
        dict(dtype=torch.float32, op=R.AVG, algorithm="ring", transport="shm", group=evens),
    ]
    for round_ in range(3):
        for i, call in enumerate(calls):
            group = call.get("group")
            members = [0, 2] if group is not None else list(range(world))
            if rank not in members:
                continue
            inputs = [torch.arange(5, dtype=call["dtype"]) * (r + 1) + i + round_ for r in members]
            mine = inputs[members.index(rank)].clone()
            work = ringreduce.all_reduce(mine, call["op"], group=group, algorithm=call["algorithm"],
                                         transport=call["transport"], async_op=round_ == 1)
            if round_ == 1:
                work.wait()
            else:
                assert work is None
            assert torch.equal(mine, reference(inputs, call["op"])), (round_, call)
        # A strided view and a Parameter (a subclass: always the checked path) of a known call.
        strided = torch.ones(10)[::2]
        ringreduce.all_reduce(strided, transport="shm")
        param = torch.nn.Parameter(torch.ones(5), requires_grad=False)
        ringreduce.all_reduce(param, transport="shm")
        assert torch.equal(strided, torch.full((5,), float(world))) and torch.equal(param, strided)
    # One entry per distinct call (the auto call matches with an equal string; the strided view is
    # the first call's twin); the rank outside `evens` never made the last one.
    assert len(checked_calls) == len(calls) - (rank not in (0, 2)), len(checked_calls)
    # A call the checks would refuse is still refused, with the tensor left alone.
    ints = torch.ones(4, dtype=torch.int32)
    with pytest.raises(TypeError, match="AVG is not defined for integer"):
        ringreduce.all_reduce(ints, R.AVG, transport="shm")
    assert torch.equal(ints, torch.ones(4, dtype=torch.int32))
    ringreduce.destroy(evens)
    assert len(checked_calls) == len(calls) - 1
    ringreduce.destroy()
    assert len(checked_calls) == 0
    again = torch.ones(3)
    ringreduce.all_reduce(again, transport="shm")  # a new communicator, checked again
    assert torch.equal(again, torch.full((3,), float(world))) and len(checked_calls) == 1
    return True


def test_repeated_calls_that_differ_in_one_argument_each_reach_their_own_communicator():
    assert run_ranks(3, _repeated_calls) == [True] * 3


def _destroy_world_after_default_calls(rank, world):
    t = torch.ones(8)
    for _ in range(3):
        ringreduce.all_reduce(t)  # group=None: the checked fast path from the second call on
    (old,) = ringreduce._groups.group_state(None).communicators.values()
    ringreduce.destroy(dist.group.WORLD)
    t = torch.ones(8)
    ringreduce.all_reduce(t)
    made = ringreduce._groups.group_state(None).communicators
    return len(made) == 1 and next(iter(made.values())) is not old, t.tolist()


def test_destroying_the_default_group_reaches_calls_made_with_group_none():
    results = run_ranks(2, _destroy_world_after_default_calls)
    assert results == [(True, [2.0] * 8)] * 2


def _two_groups_made_by_two_threads(rank, world):
    """Each rank's two threads make the first call of one group each, rank 0's WORLD thread first
    and rank 1's other thread first: the makings must not wait for each other."""
    import threading
    import time

    other = dist.new_group(list(range(world)))
    results = {}

    def first_call(group, delayed):
        if delayed:
            time.sleep(0.5)
        t = torch.full((1000,), float(rank + 1))
        ringreduce.all_reduce(t, group=group)
        results[group is None] = t.tolist()

    threads = [threading.Thread(target=first_call, args=(None, rank == 1)),
               threading.Thread(target=first_call, args=(other, rank == 0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return not any(thread.is_alive() for thread in threads) and results == {True: [3.0] * 1000, False: [3.0] * 1000}


def test_two_threads_making_two_groups_first_calls_in_opposite_orders_on_two_ranks():
    assert run_ranks(2, _two_groups_made_by_two_threads, timeout=120) == [True, True]
