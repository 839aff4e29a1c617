"""The GPU path: kernels against torch, the ring and the central reducer on virtual ranks of one GPU,
NCCL at world size 1, and stream ordering. Skipped where no GPU is visible."""

import datetime
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce
from ringreduce import _C
from reference import (ALL_DTYPES, FLOAT_DTYPES, R, assert_bitwise_equal, exact_inputs, kernel_reference, ops_for,
                       reference)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
OP_CODES = {R.SUM: 0, R.AVG: 1, R.MIN: 2, R.MAX: 3, R.PRODUCT: 4}
# Lengths around the 16-byte packs and the grid, plus one that spans many blocks.
LENGTHS = [1, 7, 8, 9, 15, 16, 17, 1000, 4099, (1 << 20) + 3]


def random_pair(n, dtype, op, gen):
    if dtype.is_floating_point:
        a = torch.randn(n + 1, generator=gen, device="cuda").to(dtype)
        b = torch.randn(n + 1, generator=gen, device="cuda").to(dtype)
        a[::97] = float("nan")
        b[5::89] = float("inf")
        return a, b
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    a = torch.randint(low, high, (n + 1,), generator=gen, device="cuda").to(dtype)
    b = torch.randint(low, high, (n + 1,), generator=gen, device="cuda").to(dtype)
    return a, b


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce_kernel_matches_torch_for_every_op_length_and_alignment(dtype):
    gen = torch.Generator(device="cuda").manual_seed(3)
    for op in ops_for(dtype):
        for n in LENGTHS:
            for offset in (0, 1):  # offset 1 breaks 16-byte alignment: the scalar path
                for last in (False, True):
                    a, b = random_pair(n, dtype, op, gen)
                    dst, src = a[offset : offset + n], b[offset : offset + n]
                    expected = kernel_reference(dst, src, op, 3, last)
                    copy = torch.empty_like(dst)
                    _C._testing.cuda_reduce(dst, src, OP_CODES[op], 3, last, copy)
                    context = f"{dtype} {op} n={n} offset={offset} last={last}"
                    assert torch.equal(dst.isnan(), expected.isnan()), context
                    finite = ~expected.isnan()
                    assert torch.equal(dst[finite], expected[finite]), context
                    assert torch.equal(copy.view(torch.uint8), dst.view(torch.uint8)), context


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("algorithm", ["ring", "central"])
def test_ring_and_central_on_virtual_ranks_of_one_gpu(world, algorithm):
    local = ringreduce.LocalWorld(world, timeout=datetime.timedelta(seconds=120), device="cuda")
    for numel in sorted({0, 1, world - 1, world, 99_991, (1 << 20) + 5}):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, numel, dtype, op)
                tensors = [t.cuda() for t in inputs]
                segment = max(1, numel * tensors[0].element_size() // world // 3) + 5
                local.all_reduce(tensors, op=op, algorithm=algorithm, segment_bytes=segment)
                torch.cuda.synchronize()
                context = f"{algorithm} world={world} numel={numel} {dtype} {op}"
                if op == R.AVG and dtype in (torch.float16, torch.bfloat16):
                    # Pre-multiplied by 1/world, as NCCL: the same bits everywhere, within the
                    # rounding of one scale and world - 1 additions of the mean.
                    assert_bitwise_equal([t.cpu() for t in tensors], context=context)
                    mean = reference(inputs, op).double()
                    error = (tensors[0].cpu().double() - mean).abs()
                    assert (error <= world * torch.finfo(dtype).eps * (mean.abs() + 2)).all(), context
                else:
                    assert_bitwise_equal([t.cpu() for t in tensors], reference(inputs, op), context)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("lanes", ["1", "2"])
def test_ring_in_one_and_two_lanes_on_virtual_ranks(world, lanes, monkeypatch):
    # Two lanes (the GPU default) run consecutive segments on two streams per rank; one lane is the
    # plain segment-major ring. Both must give the reference's bits.
    monkeypatch.setenv("RINGREDUCE_LANES", lanes)
    local = ringreduce.LocalWorld(world, timeout=datetime.timedelta(seconds=120), device="cuda")
    for numel in (1, 10_007, (1 << 20) + 5):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for op in (R.SUM, R.MAX):
                inputs = exact_inputs(world, numel, dtype, op)
                tensors = [t.cuda() for t in inputs]
                local.all_reduce(tensors, op=op, segment_bytes=4096)
                torch.cuda.synchronize()
                assert_bitwise_equal([t.cpu() for t in tensors], reference(inputs, op),
                                     f"lanes={lanes} world={world} numel={numel} {dtype} {op}")


def test_default_segments_and_random_floats_on_the_gpu():
    local = ringreduce.LocalWorld(4, device="cuda")
    gen = torch.Generator().manual_seed(11)
    for dtype in FLOAT_DTYPES:
        inputs = [torch.randn(3 << 20, generator=gen).to(dtype) for _ in range(4)]
        tensors = [t.cuda() for t in inputs]
        local.all_reduce(tensors)
        torch.cuda.synchronize()
        assert_bitwise_equal([t.cpu() for t in tensors], context=str(dtype))
        expected = torch.stack([t.double() for t in inputs]).sum(0)
        scale = torch.stack([t.double().abs() for t in inputs]).sum(0)
        error = (tensors[0].cpu().double() - expected).abs()
        assert (error <= 4 * torch.finfo(dtype).eps * scale + 1e-30).all(), dtype


def test_the_collective_waits_for_the_callers_stream_and_the_caller_for_it():
    # Virtual ranks' inputs are produced late on a side stream; the result is used on that stream
    # right away, with no synchronize in between. Missing events would read or publish stale data.
    local = ringreduce.LocalWorld(2, device="cuda")
    side = torch.cuda.Stream()
    results = []
    with torch.cuda.stream(side):
        tensors = [torch.zeros(1 << 22, device="cuda") for _ in range(2)]
        torch.cuda._sleep(50_000_000)  # about 20 ms of GPU time before the inputs are written
        for rank, t in enumerate(tensors):
            t.fill_(rank + 1.0)
        works = [ringreduce.all_reduce(t, group=local.group(rank), async_op=True) for rank, t in enumerate(tensors)]
        for work, t in zip(works, tensors):
            work.wait()  # makes the current (side) stream wait: no host synchronisation
            results.append(t * 2)
    torch.cuda.synchronize()
    for result in results:
        assert torch.equal(result, torch.full_like(result, 6.0))


def test_blocking_calls_order_the_callers_stream_too():
    local = ringreduce.LocalWorld(2, device="cuda")
    results = [None, None]

    def rank_body(rank):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            t = torch.zeros(1 << 20, device="cuda")
            torch.cuda._sleep(20_000_000)
            t.fill_(rank + 2.0)
            ringreduce.all_reduce(t, group=local.group(rank), op=R.AVG)
            results[rank] = t * 2
        stream.synchronize()

    threads = [threading.Thread(target=rank_body, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for result in results:
        assert torch.equal(result, torch.full_like(result, 5.0))


def test_nccl_transport_at_world_size_one():
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
        try:
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                t = torch.arange(1000, device="cuda").to(dtype)
                work = ringreduce.all_reduce(t, transport="nccl", async_op=True)
                work.wait()
                ringreduce.all_reduce(t, algorithm="central")  # transport=None picks nccl for CUDA
                torch.cuda.synchronize()
                assert torch.equal(t.cpu(), torch.arange(1000).to(dtype))
            assert ringreduce.build_info()["nccl"]
        finally:
            ringreduce.destroy()
            dist.destroy_process_group()


def test_a_cuda_tensor_on_a_cpu_transport_is_refused():
    local = ringreduce.LocalWorld(1)
    t = torch.ones(4, device="cuda")
    with pytest.raises(ValueError, match="cpu ranks"):
        ringreduce.all_reduce(t, group=local.group(0))
    assert torch.equal(t.cpu(), torch.ones(4))


@pytest.mark.parametrize("algorithm", ["ring", "central"])
def test_non_contiguous_and_bool_tensors_on_virtual_gpu_ranks(algorithm):
    world = 3
    local = ringreduce.LocalWorld(world, timeout=datetime.timedelta(seconds=120), device="cuda")
    inputs = exact_inputs(world, 2 * 10_007, torch.float32, R.SUM)
    tensors = [t.cuda()[::2] for t in inputs]  # every other element: strided views
    local.all_reduce(tensors, algorithm=algorithm, segment_bytes=4096)
    expected = reference([t[::2] for t in inputs], R.SUM)
    assert_bitwise_equal([t.cpu() for t in tensors], expected, "strided")
    offset = [t.cuda()[1:] for t in inputs]  # misaligned by one element: the kernels' scalar head
    local.all_reduce(offset, algorithm=algorithm, segment_bytes=4096)
    assert_bitwise_equal([t.cpu() for t in offset], reference([t[1:] for t in inputs], R.SUM), "offset")
    flags = [torch.tensor([True, True, False, rank == 1], device="cuda") for rank in range(world)]
    local.all_reduce(flags, op=R.MAX, algorithm=algorithm)
    assert all(f.cpu().tolist() == [True, True, False, True] for f in flags)
    local.all_reduce(flags, op=R.MIN, algorithm=algorithm)
    assert all(f.cpu().tolist() == [True, True, False, True] for f in flags)


def test_a_virtual_gpu_rank_that_never_sends_raises_within_the_timeout():
    local = ringreduce.LocalWorld(2, timeout=datetime.timedelta(seconds=1), device="cuda")
    t = torch.ones(1 << 20, device="cuda")
    start = time.monotonic()
    with pytest.raises(ringreduce.CommTimeoutError, match="rank 1"):
        ringreduce.all_reduce(t, group=local.group(0))  # rank 1 never calls
    assert time.monotonic() - start < 1 + 2


def test_the_device_header_check_flags_a_neighbour_that_differs():
    device = torch.cuda.current_device()
    assert _C._testing.device_header_check(1000, 1000, device)[0] == 0
    assert _C._testing.device_header_check(1000, 999, device) == (1, 1000, 999)


def test_nccl_sends_and_receives_on_one_gpu():
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(os.path.join(tmp, "store"), 1)
        src = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        dst = torch.zeros_like(src)
        _C._testing.nccl_self_exchange(store, src, dst, 60.0)
        assert torch.equal(dst, src)


def test_float16_avg_does_not_overflow_where_the_average_fits():
    world = 8
    local = ringreduce.LocalWorld(world, timeout=datetime.timedelta(seconds=60), device="cuda")
    for algorithm in ("ring", "central"):
        tensors = [torch.full((10_007,), 16384.0, dtype=torch.float16, device="cuda") for _ in range(world)]
        local.all_reduce(tensors, op=R.AVG, algorithm=algorithm, segment_bytes=4096)
        torch.cuda.synchronize()
        for t in tensors:
            assert torch.equal(t.cpu(), torch.full((10_007,), 16384.0, dtype=torch.float16)), algorithm


def test_the_watchdog_frees_a_stream_stalled_on_the_gpu():
    # A kernel waits for a flag nobody sets, as a receive waits for a sender that never comes.
    timeout_s = 1.0
    message, seconds = _C._testing.cuda_watchdog_stall(torch.cuda.current_device(), timeout_s)
    assert "Timed out after 1000 ms" in message and "collective #0 on a stalled stream did not finish" in message
    assert timeout_s <= seconds < timeout_s + 2
    t = torch.ones(4, device="cuda")  # the GPU is free again
    assert torch.equal((t + 1).cpu(), torch.full((4,), 2.0))


def test_one_shot_is_refused_on_the_gpu_before_anything_moves_and_auto_runs_there():
    local = ringreduce.LocalWorld(2, device="cuda")
    tensors = [torch.full((1000,), float(r + 1), device="cuda") for r in range(2)]
    with pytest.raises(ValueError, match="'one_shot' runs on host transports only"):
        local.all_reduce(tensors, algorithm="one_shot")
    assert all(torch.equal(t.cpu(), torch.full((1000,), float(r + 1))) for r, t in enumerate(tensors))
    local.all_reduce(tensors, algorithm="auto")  # the communicator is still healthy; auto picks ring here
    assert all(torch.equal(t.cpu(), torch.full((1000,), 3.0)) for t in tensors)


# About half a second of GPU time (torch.cuda._sleep spins this many clock cycles, at 1.5-2 GHz).
SLEEP_CYCLES = 1_000_000_000


def test_work_is_completed_only_once_the_gpu_has_done_it():
    world = ringreduce.LocalWorld(2, device="cuda")
    tensors = [torch.ones(1 << 20, device="cuda") for _ in range(2)]
    torch.cuda._sleep(SLEEP_CYCLES)  # the collective waits for this on the GPU, not on the host
    works = [ringreduce.all_reduce(t, group=g, async_op=True) for t, g in zip(tensors, world.groups)]
    for work in works:
        work.get_future().wait()  # the host has issued everything
    assert not any(work.is_completed() for work in works), "queued is not done"
    torch.cuda.synchronize()
    deadline = time.monotonic() + 10
    while not all(work.is_completed() for work in works) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(work.is_completed() for work in works)
    assert all(torch.equal(t.cpu(), torch.full((1 << 20,), 2.0)) for t in tensors)


FREES_AFTER_DESTROY = """
import gc, torch, ringreduce
world = ringreduce.LocalWorld(2, device="cuda")
tensors = [torch.ones(1 << 20, device="cuda") for _ in range(2)]
world.all_reduce(tensors)  # records the tensors on the engine's streams
del world
gc.collect()  # the communicators and their device queues are gone
del tensors   # the caching allocator records an event on every stream the tensors were used on
torch.cuda.synchronize()
again = ringreduce.LocalWorld(2, device="cuda")  # takes the streams back
more = [torch.ones(10, device="cuda") for _ in range(2)]
again.all_reduce(more)
assert all(torch.equal(t.cpu(), torch.full((10,), 2.0)) for t in more)
"""


def test_tensors_freed_after_their_communicator_is_gone_are_safe():
    done = subprocess.run([sys.executable, "-c", FREES_AFTER_DESTROY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
