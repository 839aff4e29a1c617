"""ringreduce as a torch.distributed backend: init_process_group("ringreduce") runs torch's own
collective calls on the engine, delegates the rest to gloo, and trains DDP like gloo does."""

import datetime
import io
import re
import sys
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce
from multiproc import run_ranks
from reference import ALL_DTYPES, R, exact_inputs, ops_for, reference


def _collectives(rank, world):
    assert dist.get_backend() == "ringreduce"
    checks = 0
    for dtype in ALL_DTYPES:
        for op in ops_for(dtype):
            inputs = exact_inputs(world, 1001, dtype, op)
            mine = inputs[rank].clone()
            dist.all_reduce(mine, op)
            assert torch.equal(mine, reference(inputs, op)), f"all_reduce {dtype} {op}"
            checks += 1
    # Async, with the future's value as torch's backends give it.
    t = torch.full((100,), float(rank))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.is_completed() and work.get_future().value()[0] is t
    assert torch.equal(t, torch.full((100,), float(sum(range(world)))))
    # Complex through the real view.
    c = torch.full((7,), complex(rank, 1))
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((7,), complex(sum(range(world)), world)))
    # Reduce-scatter and all-gather, tensor and list forms.
    chunk = 33
    big = exact_inputs(world, chunk * world, torch.float32, R.SUM)
    out = torch.empty(chunk)
    dist.reduce_scatter_tensor(out, big[rank].clone())
    total = reference(big, R.SUM)
    assert torch.equal(out, total[rank * chunk:(rank + 1) * chunk]), "reduce_scatter_tensor"
    out_list = torch.empty(chunk)
    dist.reduce_scatter(out_list, list(big[rank].clone().chunk(world)))
    assert torch.equal(out_list, out), "reduce_scatter (list)"
    gathered = torch.empty(chunk * world)
    dist.all_gather_into_tensor(gathered, out)
    assert torch.equal(gathered, total), "all_gather_into_tensor"
    pieces = [torch.empty(chunk) for _ in range(world)]
    dist.all_gather(pieces, out)
    assert torch.equal(torch.cat(pieces), total), "all_gather (list)"
    # Uneven pieces, as torch's NCCL backend allows them: rank r's piece has r + 2 elements.
    uneven = [torch.empty(r + 2, dtype=torch.int64) for r in range(world)]
    dist.all_gather(uneven, torch.full((rank + 2,), rank, dtype=torch.int64))
    assert all(torch.equal(u, torch.full((r + 2,), r, dtype=torch.int64)) for r, u in enumerate(uneven)), uneven
    contributions = [[torch.arange(r + 2, dtype=torch.float64) * (sender + 1) for r in range(world)]
                     for sender in range(world)]
    mine_reduced = torch.empty(rank + 2, dtype=torch.float64)
    dist.reduce_scatter(mine_reduced, [p.clone() for p in contributions[rank]])
    assert torch.equal(mine_reduced, sum(c[rank] for c in contributions)), "reduce_scatter (uneven list)"
    with pytest.raises(RuntimeError, match="this rank's piece of the list"):
        dist.all_gather([torch.empty(1) for _ in range(world)], torch.ones(5))
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": r} for r in range(world)]
    # Broadcast, object broadcast and barrier.
    weights = torch.randn(50, 7) if rank == world - 1 else torch.zeros(50, 7)
    dist.broadcast(weights, src=world - 1)
    sums = torch.tensor([weights.sum().item()])
    dist.all_reduce(sums, R.MAX)
    assert sums.item() == weights.sum().item()
    box = [f"from {rank}"]
    dist.broadcast_object_list(box, src=0)
    assert box == ["from 0"]
    dist.barrier()
    # reduce on the engine; send/recv and gather delegated to gloo.
    if rank == 0 and world > 1:
        dist.send(torch.arange(5.0), dst=1)
    elif rank == 1:
        got = torch.zeros(5)
        dist.recv(got, src=0)
        assert torch.equal(got, torch.arange(5.0))
    r = torch.tensor([float(rank + 1)])
    dist.reduce(r, dst=0)
    if rank == 0:
        assert r.item() == sum(range(1, world + 1))
    gathered_ranks = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank)]), gathered_ranks, dst=0)
    if rank == 0:
        assert [g.item() for g in gathered_ranks] == list(range(world))
    # A subgroup gets a backend of its own.
    members = list(range(min(world, 2)))
    sub = dist.new_group(members)
    if rank in members:
        s = torch.ones(3)
        dist.all_reduce(s, group=sub)
        assert torch.equal(s, torch.full((3,), float(len(members))))
    return checks


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_torch_collectives_on_the_ringreduce_backend(world):
    checks = run_ranks(world, _collectives, backend="ringreduce")
    assert checks[0] > 0 and len(set(checks)) == 1


def _train(rank, world, steps=20):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]  # by value through the result queue


def test_ddp_with_no_hook_matches_gloo():
    ours = run_ranks(2, _train, backend="ringreduce")
    theirs = run_ranks(2, _train, backend="gloo")
    for a, b in zip(ours[0], theirs[0]):
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[0], ours[1]):
        assert (a == b).all(), "every rank holds the same parameters"


def test_the_backend_is_registered_on_import():
    assert dist.Backend.RINGREDUCE == "ringreduce"
    assert ringreduce.backend.NAME == "ringreduce"


def _delegations_logged(rank, world):
    sys.stderr = captured = io.StringIO()  # where RINGREDUCE_DEBUG's lines go in this rank
    for _ in range(2):
        pieces = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
        dist.gather(torch.ones(1), pieces, dst=0)
    dist.all_reduce(torch.ones(1))
    return captured.getvalue()


def test_debug_info_names_each_delegated_op_once():
    logs = run_ranks(2, _delegations_logged, backend="ringreduce", env={"RINGREDUCE_DEBUG": "INFO"})
    for rank, log in enumerate(logs):
        assert log.count(f"backend rank {rank}/2: gather goes to gloo") == 1, log
        assert "all_reduce" not in log and "allreduce" not in log, log


def _sparse_sum(rank, world):
    # Rank r holds 1 at index 0 and r at index r + 1: the sum is world at 0 and r at r + 1.
    tensor = torch.sparse_coo_tensor(torch.tensor([[0, rank + 1]]), torch.tensor([1.0, float(rank)]), (world + 1,))
    dist.all_reduce(tensor)
    return tensor.to_dense().numpy()


def test_a_sparse_all_reduce_goes_to_gloo_and_gives_its_result():
    ours = run_ranks(2, _sparse_sum, backend="ringreduce")
    theirs = run_ranks(2, _sparse_sum, backend="gloo")
    for mine, gloo in zip(ours, theirs):
        assert mine.tolist() == gloo.tolist() == [2.0, 0.0, 1.0]


def _gather_in_flight_at_teardown(rank, world):
    """Rank 0 forgets an unfinished gather and destroys the group; rank 1 sends its piece only then.

    gloo finishes the gather inside the destroy, and its last reference to the gathered tensors,
    whose Python objects the program has dropped, needs the GIL to go."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        work = dist.gather(torch.ones(1), [torch.zeros(1) for _ in range(world)], dst=0, async_op=True)
        del work
        store.set("destroying", "1")
        dist.destroy_process_group()
        return "destroyed"
    store.wait(["destroying"])
    time.sleep(1)  # rank 0 is inside destroy_process_group by now
    dist.gather(torch.ones(1), None, dst=0)
    return "sent"


def test_destroying_the_group_while_a_delegated_gather_is_in_flight_does_not_hang():
    assert run_ranks(2, _gather_in_flight_at_teardown, backend="ringreduce", timeout=60) == ["destroyed", "sent"]


BARRIER_TIMEOUT = datetime.timedelta(seconds=1)


def _lonely_barrier(rank, world):
    """torch's test_barrier_timeout: only rank 0 enters the barrier of a group with a 1 s timeout."""
    group = dist.new_group(timeout=BARRIER_TIMEOUT)
    store = dist.distributed_c10d._get_default_store()
    if rank != 0:
        store.wait(["barrier timed out"])  # stay alive until rank 0 has given up
        return None
    start = time.monotonic()
    try:
        dist.barrier(group)
    except RuntimeError as error:
        message = str(error)
    else:
        message = "no error"
    store.set("barrier timed out", "1")
    return message, time.monotonic() - start


def test_a_barrier_that_times_out_says_so_in_torchs_words():
    (message, elapsed), _ = run_ranks(2, _lonely_barrier, backend="ringreduce")
    assert re.search(" (Timed out|closed|timeout) ", message), message  # torch's own test's pattern
    assert elapsed >= BARRIER_TIMEOUT.total_seconds() - 0.1, elapsed
