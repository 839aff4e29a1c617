"""reduce_scatter_tensor, all_gather_into_tensor and broadcast: the ring's two halves and the chain
broadcast, on the schedule alone, on `local` ranks (world sizes 1-16) and on shm and pg processes,
against closed forms; with torch.distributed's argument rules and clear errors."""

import datetime

import numpy as np
import pytest
import torch

import ringreduce
from ringreduce import _C
from multiproc import run_ranks
from reference import ALL_DTYPES, R, exact_inputs, ops_for, reference

WORLDS = [1, 2, 3, 4, 5, 8, 16]
_worlds = {}


def world_of(size):
    if size not in _worlds:
        _worlds[size] = ringreduce.LocalWorld(size, timeout=datetime.timedelta(seconds=60))
    return _worlds[size]


def on_every_rank(world, call):
    """call(rank, group) -> work for each rank at once (async), then wait for all of them."""
    works = [call(rank, world.group(rank)) for rank in range(world.size)]
    errors = []
    for work in works:  # every rank is waited for before a failure is reported
        try:
            work.wait()
        except Exception as error:  # noqa: BLE001
            errors.append(error)
    if errors:
        raise errors[0]


# ---- the schedule ---------------------------------------------------------------------------


def simulate(numel, elem_size, world, segment_bytes, lanes, phases, holds):
    """Run every rank's schedule of `phases` as message passing over holds[rank][element, source]."""
    schedules = [_C._testing.ring_schedule(numel, elem_size, world, r, segment_bytes, lanes, phases) for r in range(world)]
    assert len({len(s) for s in schedules}) == 1
    for k in range(len(schedules[0])):
        outgoing = [holds[r][s[k][0]: s[k][0] + s[k][1]].copy() for r, s in enumerate(schedules)]
        for rank in range(world):
            prev = (rank - 1) % world
            _, _, recv_off, recv_cnt, reduce, *_ = schedules[rank][k]
            assert schedules[prev][k][:2] == (recv_off, recv_cnt), "a receive must match the peer's send"
            if reduce:
                holds[rank][recv_off: recv_off + recv_cnt] += outgoing[prev]
            else:
                holds[rank][recv_off: recv_off + recv_cnt] = outgoing[prev]
    return schedules


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("chunk,elem_size,segment_bytes", [(0, 4, 64), (1, 4, 64), (7, 2, 6), (100, 4, 36), (1001, 1, 1 << 20)])
@pytest.mark.parametrize("lanes", [1, 2])
def test_reduce_scatter_schedule_leaves_rank_r_with_chunk_r_reduced_once_by_every_rank(world, chunk, elem_size,
                                                                                          segment_bytes, lanes):
    numel = chunk * world
    holds = [np.zeros((numel, world), dtype=np.int64) for _ in range(world)]
    for rank in range(world):
        holds[rank][:, rank] = 1
    schedules = simulate(numel, elem_size, world, segment_bytes, lanes, "reduce_scatter", holds)
    for rank in range(world):
        assert (holds[rank][rank * chunk: (rank + 1) * chunk] == 1).all(), f"rank {rank}'s chunk"
    lasts = np.zeros(numel, dtype=np.int64)  # where AVG divides: once per element of the result
    for schedule in schedules:
        for _, _, off, cnt, reduce, last, *_ in schedule:
            lasts[off: off + cnt] += last
    if world > 1:
        assert (lasts == 1).all()


@pytest.mark.parametrize("world", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("chunk,elem_size,segment_bytes", [(0, 4, 64), (1, 4, 64), (7, 2, 6), (1001, 1, 100)])
@pytest.mark.parametrize("lanes", [1, 3])
def test_all_gather_schedule_gives_every_rank_every_chunk(world, chunk, elem_size, segment_bytes, lanes):
    numel = chunk * world
    holds = [np.full((numel, 1), -1, dtype=np.int64) for _ in range(world)]
    for rank in range(world):
        holds[rank][rank * chunk: (rank + 1) * chunk] = rank  # only its own chunk is known at first
    simulate(numel, elem_size, world, segment_bytes, lanes, "all_gather", holds)
    expected = np.repeat(np.arange(world), chunk).reshape(-1, 1)
    for rank in range(world):
        assert (holds[rank] == expected).all(), f"rank {rank}"


# ---- local ranks ----------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_matches_the_reference_for_every_dtype_and_op(world):
    local = world_of(world)
    for chunk in (0, 1, 7, 10_007):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, chunk * world, dtype, op)
                kept = [t.clone() for t in inputs]
                outputs = [torch.empty(chunk, dtype=dtype) for _ in range(world)]
                on_every_rank(local, lambda r, g: ringreduce.reduce_scatter_tensor(
                    outputs[r], inputs[r], op, group=g, async_op=True, segment_bytes=4100))
                expected = reference(kept, op)
                for rank, out in enumerate(outputs):
                    assert torch.equal(out, expected[rank * chunk: (rank + 1) * chunk]), \
                        f"world={world} chunk={chunk} {dtype} {op} rank {rank}"
                assert all(torch.equal(a, b) for a, b in zip(inputs, kept)), "the input must stay as it was"


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_and_broadcast_copy_exactly_for_every_dtype(world):
    local = world_of(world)
    for chunk in (0, 1, 10_007):
        for dtype in ALL_DTYPES + (torch.bool, torch.complex64):
            inputs = [(torch.arange(chunk) * (r + 3) % 7).to(dtype) for r in range(world)]
            outputs = [torch.full((world * chunk,), 1).to(dtype) for _ in range(world)]
            on_every_rank(local, lambda r, g: ringreduce.all_gather_into_tensor(
                outputs[r], inputs[r], group=g, async_op=True, segment_bytes=999))
            expected = torch.cat(inputs)
            assert all(torch.equal(out, expected) for out in outputs), f"all_gather world={world} {dtype}"
            for root in sorted({0, world - 1, world // 2}):
                tensors = [inputs[r].clone() for r in range(world)]
                on_every_rank(local, lambda r, g: ringreduce.broadcast(
                    tensors[r], group_src=root, group=g, async_op=True, segment_bytes=999))
                assert all(torch.equal(t, inputs[root]) for t in tensors), f"broadcast world={world} root={root} {dtype}"


@pytest.mark.parametrize("world", [1, 2, 3, 5, 16])
def test_reduce_leaves_the_result_at_the_root_and_the_others_untouched(world):
    local = world_of(world)
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            for root in sorted({0, world - 1}):
                inputs = exact_inputs(world, 10_007, dtype, op)
                tensors = [t.clone() for t in inputs]
                on_every_rank(local, lambda r, g: ringreduce.reduce(
                    tensors[r], group_dst=root, op=op, group=g, async_op=True, segment_bytes=4100))
                for rank, t in enumerate(tensors):
                    want = reference(inputs, op) if rank == root else inputs[rank]
                    assert torch.equal(t, want), f"world={world} root={root} {dtype} {op} rank {rank}"


def test_strided_and_shaped_tensors_and_futures():
    world = 3
    local = world_of(world)
    base = [torch.arange(2 * 6 * world, dtype=torch.float32).reshape(2 * world, 6) * (r + 1) for r in range(world)]
    inputs = [b[:, ::2] for b in base]  # (2*world, 3), strided
    outputs = [torch.zeros(3, 2).t() for _ in range(world)]  # (2, 3), non-contiguous, 6 elements
    works = [ringreduce.reduce_scatter_tensor(outputs[r], inputs[r], group=local.group(r), async_op=True)
             for r in range(world)]
    for work, out in zip(works, outputs):
        work.wait()
        assert work.get_future().value()[0] is out
    total = sum(inputs).reshape(-1)
    for rank, out in enumerate(outputs):
        assert torch.equal(out.reshape(-1), total[rank * 6: (rank + 1) * 6])
    gathered = [torch.zeros(world * 2, 3).t() for _ in range(world)]  # non-contiguous output
    on_every_rank(local, lambda r, g: ringreduce.all_gather_into_tensor(gathered[r], outputs[r], group=g, async_op=True))
    expected = torch.cat([o.reshape(-1) for o in outputs])
    assert all(torch.equal(g.reshape(-1), expected) for g in gathered)


def test_bad_shapes_and_arguments_are_refused_before_any_data_moves():
    group = world_of(2).group(0)
    out, inp = torch.zeros(3), torch.ones(7)
    with pytest.raises(ValueError, match=r"world size \(2\) times the output's elements"):
        ringreduce.reduce_scatter_tensor(out, inp, group=group)
    with pytest.raises(ValueError, match=r"world size \(2\) times the input's elements"):
        ringreduce.all_gather_into_tensor(torch.zeros(5), torch.ones(3), group=group)
    with pytest.raises(ValueError, match="same dtype"):
        ringreduce.all_gather_into_tensor(torch.zeros(6), torch.ones(3, dtype=torch.float64), group=group)
    with pytest.raises(ValueError, match="not a rank of this group"):
        ringreduce.broadcast(torch.ones(3), group_src=2, group=group)
    untouched = torch.ones(3)
    with pytest.raises(ValueError, match="central root 2 is not a rank of this group"):
        ringreduce.all_reduce(untouched, algorithm="auto", root=2, group=group)  # auto may try central
    assert torch.equal(untouched, torch.ones(3))
    with pytest.raises(ValueError, match="exactly one of src"):
        ringreduce.broadcast(torch.ones(3), group=group)
    with pytest.raises(TypeError, match="AVG is not defined for integer"):
        ringreduce.reduce_scatter_tensor(torch.zeros(2, dtype=torch.int32), torch.ones(4, dtype=torch.int32),
                                         R.AVG, group=group)
    assert torch.equal(out, torch.zeros(3)) and torch.equal(inp, torch.ones(7))


def test_ranks_that_call_different_collectives_raise_mismatch_error():
    local = ringreduce.LocalWorld(2, timeout=datetime.timedelta(seconds=30))
    a, b = torch.ones(4), torch.ones(4)
    works = [ringreduce.broadcast(a, group_src=0, group=local.group(0), async_op=True),
             ringreduce.all_reduce(b, group=local.group(1), async_op=True)]
    messages = []
    for work in works:
        with pytest.raises(ringreduce.MismatchError) as error:
            work.wait()
        messages.append(str(error.value))
    assert "broadcast of 4 x float32 from root 0" in messages[0]


# ---- processes ------------------------------------------------------------------------------


def _processes(rank, world, transport):
    import torch.distributed as dist

    group = dist.new_group(list(range(world)))
    chunk = 10_007
    inputs = exact_inputs(world, chunk * world, torch.float32, R.SUM)
    out = torch.empty(chunk)
    ringreduce.reduce_scatter_tensor(out, inputs[rank].clone(), group=group, segment_bytes=8192, transport=transport)
    assert torch.equal(out, reference(inputs, R.SUM)[rank * chunk: (rank + 1) * chunk]), "reduce_scatter"
    gathered = torch.empty(chunk * world)
    ringreduce.all_gather_into_tensor(gathered, out, group=group, transport=transport)
    assert torch.equal(gathered, reference(inputs, R.SUM)), "all_gather"
    weights = torch.randn(1000, 33) if rank == 1 else torch.zeros(1000, 33)
    ringreduce.broadcast(weights, src=1, group=group, segment_bytes=4096, transport=transport)
    check = weights.clone()
    dist.broadcast(check, src=1)
    assert torch.equal(weights, check), "broadcast"
    return True


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_collectives_across_processes(transport):
    assert run_ranks(3, _processes, transport) == [True] * 3


def test_work_wait_with_a_timeout_raises_while_the_collective_is_still_running():
    local = ringreduce.LocalWorld(2, timeout=datetime.timedelta(seconds=30))
    mine, theirs = torch.ones(8), torch.ones(8)
    work = ringreduce.all_reduce(mine, group=local.group(0), async_op=True)  # rank 1 has not called yet
    with pytest.raises(ringreduce.CommTimeoutError, match="still running"):
        work.wait(timeout=datetime.timedelta(milliseconds=50))
    ringreduce.all_reduce(theirs, group=local.group(1))
    assert work.wait(timeout=datetime.timedelta(seconds=30))
    assert torch.equal(mine, torch.full((8,), 2.0))
