"""The nccl transport across processes, one GPU each: every dtype and op, both algorithms, one and
two lanes, odd and strided tensors, and the failures the watchdog and the device header check must
turn into errors. Needs two or more GPUs (make gpu-check runs it where they exist)."""

import time

import pytest
import torch

import ringreduce
from multiproc import run_ranks
from reference import ALL_DTYPES, R, exact_inputs, ops_for, reference

WORLD = 2
pytestmark = pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} CUDA GPUs")
# The group timeout of the failure tests, and what the watchdog may take beyond it.
TIMEOUT_S, SLACK_S = 3, 2
# A kernel that keeps the GPU busy for about half a second (torch.cuda._sleep spins this many
# clock cycles, at 1.5-2 GHz), so work queued behind it is still pending when the host looks.
SLEEP_CYCLES = 1_000_000_000


def _matrix(rank, world, lanes):
    import os

    os.environ["RINGREDUCE_LANES"] = lanes
    torch.cuda.set_device(rank)
    bits = []
    for algorithm in ("ring", "central"):
        for numel in (1, world + 1, 99_991):
            for dtype in ALL_DTYPES:
                for op in ops_for(dtype):
                    inputs = exact_inputs(world, 2 * numel, dtype, op)
                    mine = inputs[rank].cuda()[::2]  # strided: reduced through a contiguous copy
                    ringreduce.all_reduce(mine, op, algorithm=algorithm, segment_bytes=4100)
                    expected = reference([t[::2] for t in inputs], op)
                    assert torch.equal(mine.cpu(), expected), f"{algorithm} lanes={lanes} numel={numel} {dtype} {op}"
        data = torch.randn(3 << 20, generator=torch.Generator().manual_seed(rank)).cuda()
        ringreduce.all_reduce(data, algorithm=algorithm)
        bits.append(data.view(torch.int32).sum().item())
    ringreduce.destroy()
    return bits


@pytest.mark.parametrize("lanes", ["1", "2"])
def test_every_dtype_and_op_across_processes(lanes):
    bits = run_ranks(WORLD, _matrix, lanes)
    assert len({tuple(b) for b in bits}) == 1, "every rank must hold the same bits"


def _stuck_peer(rank, world):
    torch.cuda.set_device(rank)
    t = torch.ones(1 << 20, device="cuda")
    ringreduce.all_reduce(t)  # connections made, everyone healthy
    torch.cuda.synchronize()
    if rank == 1:
        return "skipped"  # never makes the second call
    start = time.monotonic()
    ringreduce.all_reduce(t)  # queued; its transfers never meet a peer
    while True:
        try:
            ringreduce.all_reduce(t)
        except ringreduce.CommTimeoutError as error:
            assert "collective #1" in str(error)
            return time.monotonic() - start
        if time.monotonic() - start > TIMEOUT_S + 10:
            return None
        time.sleep(0.1)


def test_a_stuck_peer_is_caught_by_the_watchdog():
    results = run_ranks(WORLD, _stuck_peer, env={"RINGREDUCE_TIMEOUT": str(TIMEOUT_S)})
    assert results[1] == "skipped"
    assert results[0] is not None and results[0] < TIMEOUT_S + SLACK_S, results


def _disagreeing(rank, world):
    torch.cuda.set_device(rank)
    t = torch.ones(1000 + rank, device="cuda")
    try:
        ringreduce.all_reduce(t)
        torch.cuda.synchronize()
        ringreduce.all_reduce(t)
    except ringreduce.MismatchError as error:
        return str(error)
    return None


def test_ranks_that_disagree_raise_mismatch_error_found_on_the_gpu():
    messages = run_ranks(WORLD, _disagreeing, env={"RINGREDUCE_TIMEOUT": str(TIMEOUT_S)})
    assert all(m and "1000 x float32" in m and "1001 x float32" in m for m in messages), messages
    assert len(set(messages)) == 1, "every rank reports the same pair"


def _backend_on_cuda(rank, world):
    torch.cuda.set_device(rank)
    t = torch.full((1001,), float(rank + 1), device="cuda")
    torch.distributed.all_reduce(t)  # the engine, over NCCL point-to-point
    assert torch.equal(t.cpu(), torch.full((1001,), float(sum(range(1, world + 1)))))
    shard = torch.empty(7, device="cuda")
    torch.distributed.reduce_scatter_tensor(shard, torch.arange(7.0 * world, device="cuda"))
    assert torch.equal(shard.cpu(), torch.arange(7.0 * rank, 7.0 * (rank + 1)) * world)
    gathered = torch.empty(7 * world, device="cuda")
    torch.distributed.all_gather_into_tensor(gathered, shard)
    assert torch.equal(gathered.cpu(), torch.arange(7.0 * world) * world)
    # Delegated to torch's NCCL backend: send/recv and all-to-all on CUDA tensors.
    if rank == 0:
        torch.distributed.send(torch.arange(5.0, device="cuda"), dst=1)
    elif rank == 1:
        got = torch.zeros(5, device="cuda")
        torch.distributed.recv(got, src=0)
        assert torch.equal(got.cpu(), torch.arange(5.0))
    out = torch.empty(world, device="cuda")
    torch.distributed.all_to_all_single(out, torch.full((world,), float(rank), device="cuda"))
    assert torch.equal(out.cpu(), torch.arange(float(world)))
    # barrier() covers the GPU communicator: once it returns, an all-reduce queued behind a long
    # kernel has finished on the GPU, and its Work says so.
    torch.cuda._sleep(SLEEP_CYCLES)
    late = torch.ones(1 << 20, device="cuda")
    work = torch.distributed.all_reduce(late, async_op=True)
    torch.distributed.barrier()
    assert work.is_completed(), "barrier() must wait for the GPU's collectives"
    torch.distributed.destroy_process_group()
    del late, t, shard, gathered  # freed after the communicator's streams are gone: no crash
    torch.cuda.synchronize()
    return True


def test_the_backend_on_cuda_tensors():
    """Rank r on cuda:r, as torchrun programs do: the ranks must meet on one NCCL communicator."""
    assert run_ranks(WORLD, _backend_on_cuda, backend="ringreduce") == [True] * WORLD
