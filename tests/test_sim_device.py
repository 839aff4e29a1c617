"""The GPU path on the simulated device (csrc/cuda/sim_device.h): the device queue, the nccl
transport with its device header check, issue window and watchdog, the CUDA reducer and the local
transport's device memory, run unchanged on host threads with seeded random delays before every
stream operation and poisoned staging. Ranks are threads (LocalWorld(device="sim")) and processes
(transport="sim"). Run this set alone with `pytest -m sim_device`."""

import datetime
import threading
import time
import zlib

import pytest
import torch

import ringreduce
from ringreduce import _C
from matrices import RAGGED_SIZES
from multiproc import run_ranks
from reference import ALL_DTYPES, R, assert_bitwise_equal, exact_inputs, ops_for, reference

pytestmark = [pytest.mark.sim_device,
              pytest.mark.skipif(not _C.build_info()["sim"], reason="this build has no simulated device (setup.py)")]

TRANSPORTS = ("local", "nccl")
# Short enough to keep the failure tests quick, far above what a healthy collective takes here.
FAULT_TIMEOUT_S = 2.0
# What "within the timeout" allows beyond it (the issue's bound: timeout + 2 s).
SLACK_S = 2.0
# A generous timeout for the healthy runs: a bug shows as a wrong result long before it.
HEALTHY_TIMEOUT = datetime.timedelta(seconds=60)
NCCL_SEGMENT_BYTES = 4 << 20  # cuda/nccl_transport.h: collectives below this are one segment per chunk
ISSUE_WINDOW_OPS = 512  # cuda/nccl_transport.h: kIssueWindowOps


@pytest.fixture(autouse=True)
def _seeded_and_disarmed(request):
    """Every test gets its own seed for the device's delays (the same in every run), and no fault
    left armed by another."""
    _C._testing.sim_configure(seed=zlib.crc32(request.node.nodeid.encode()), max_delay_us=200)
    _C._testing.sim_clear()
    yield
    _C._testing.sim_clear()


def sim_world(size, transport, timeout=HEALTHY_TIMEOUT):
    return ringreduce.LocalWorld(size, timeout=timeout, device="sim", transport=transport)


def on_every_rank(world, call):
    """call(rank, group) for every rank at once (async): each rank's outcome, an exception or None."""
    works = [call(rank, world.group(rank)) for rank in range(world.size)]
    outcomes = []
    for work in works:
        try:
            work.wait()
            outcomes.append(None)
        except Exception as error:  # noqa: BLE001 - the caller judges every rank's outcome
            outcomes.append(error)
    return outcomes


def assert_matches(tensors, inputs, op, context):
    """The reference's bits on every rank; AVG of 16-bit floats, pre-multiplied as NCCL does, within
    the rounding of one scale and world - 1 additions."""
    if op == R.AVG and inputs[0].dtype in (torch.float16, torch.bfloat16):
        assert_bitwise_equal(tensors, context=context)
        mean = reference(inputs, op).double()
        error = (tensors[0].double() - mean).abs()
        assert (error <= len(inputs) * torch.finfo(inputs[0].dtype).eps * (mean.abs() + 2)).all(), context
    else:
        assert_bitwise_equal(tensors, reference(inputs, op), context)


@pytest.mark.parametrize("algorithm", ["ring", "central"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_dtype_and_op_of_the_all_reduce(transport, world, algorithm):
    local = sim_world(world, transport)
    for numel in sorted({0, 1, world + 1, 10_007}):
        for dtype in ALL_DTYPES:
            for op in ops_for(dtype):
                inputs = exact_inputs(world, numel, dtype, op)
                tensors = [t.clone() for t in inputs]
                segment = max(1, numel * tensors[0].element_size() // world // 3) + 5  # ragged segments
                local.all_reduce(tensors, op=op, algorithm=algorithm, segment_bytes=segment)
                assert_matches(tensors, inputs, op, f"{transport} {algorithm} world={world} numel={numel} {dtype} {op}")


@pytest.mark.parametrize("lanes", ["1", "2"])
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_ring_in_one_and_two_lanes(transport, world, lanes, monkeypatch):
    monkeypatch.setenv("RINGREDUCE_LANES", lanes)
    local = sim_world(world, transport)
    for dtype, op in ((torch.float32, R.SUM), (torch.bfloat16, R.AVG), (torch.float16, R.AVG), (torch.int64, R.MAX)):
        inputs = exact_inputs(world, 40_009, dtype, op)
        tensors = [t.clone() for t in inputs]
        local.all_reduce(tensors, op=op, segment_bytes=4096)
        assert_matches(tensors, inputs, op, f"{transport} lanes={lanes} world={world} {dtype} {op}")


def test_float16_avg_premultiplies_before_any_lane_sends():
    # The pre-multiply runs on the main stream before the lanes fork: a lane that did not wait for
    # it would send unscaled values (and 8 x 16384 overflows float16 to inf).
    world = 4
    local = sim_world(world, "nccl")
    for algorithm in ("ring", "central"):
        tensors = [torch.full((20_011,), 16384.0, dtype=torch.float16) for _ in range(world)]
        local.all_reduce(tensors, op=R.AVG, algorithm=algorithm, segment_bytes=2048)
        for t in tensors:
            assert torch.equal(t, torch.full((20_011,), 16384.0, dtype=torch.float16)), algorithm


def _collectives(world, transport, numel=20_011, segment_bytes=4096):
    """(name, call(rank, group), check(results)) for the collectives beyond all-reduce."""
    shard = torch.arange(numel * world, dtype=torch.float32).reshape(world, numel)
    outputs = {}

    def reduce_scatter(rank, group):
        outputs[rank] = torch.full((numel,), -1.0)
        return ringreduce.reduce_scatter_tensor(outputs[rank], shard.reshape(-1) * (rank + 1), group=group,
                                                async_op=True, segment_bytes=segment_bytes)

    def all_gather(rank, group):
        outputs[rank] = torch.full((numel * world,), -1.0)
        return ringreduce.all_gather_into_tensor(outputs[rank], shard[rank].clone(), group=group, async_op=True,
                                                 segment_bytes=segment_bytes)

    def broadcast(rank, group):
        outputs[rank] = shard[1 % world].clone() if rank == 1 % world else torch.full((numel,), -1.0)
        return ringreduce.broadcast(outputs[rank], src=1 % world, group=group, async_op=True,
                                    segment_bytes=segment_bytes)

    def reduce(rank, group):
        outputs[rank] = shard[0] * (rank + 1)
        return ringreduce.reduce(outputs[rank], dst=world - 1, group=group, async_op=True, segment_bytes=segment_bytes)

    total = world * (world + 1) / 2
    return [
        ("reduce_scatter", reduce_scatter, lambda r: torch.equal(outputs[r], shard[r] * total)),
        ("all_gather", all_gather, lambda r: torch.equal(outputs[r], shard.reshape(-1))),
        ("broadcast", broadcast, lambda r: torch.equal(outputs[r], shard[1 % world])),
        ("reduce", reduce, lambda r: r != world - 1 or torch.equal(outputs[r], shard[0] * total)),
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reduce_scatter_all_gather_broadcast_and_reduce(transport, world):
    local = sim_world(world, transport)
    for name, call, correct in _collectives(world, transport):
        assert on_every_rank(local, call) == [None] * world, name
        assert all(correct(rank) for rank in range(world)), f"{transport} world={world} {name}"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_strided_misaligned_and_bool_tensors(transport):
    world = 3
    local = sim_world(world, transport)
    inputs = exact_inputs(world, 2 * 10_007, torch.float32, R.SUM)
    strided = [t.clone()[::2] for t in inputs]
    local.all_reduce(strided, segment_bytes=4096)
    assert_bitwise_equal([t.contiguous() for t in strided], reference([t[::2] for t in inputs], R.SUM), "strided")
    offset = [t.clone()[1:] for t in inputs]  # misaligned by one element: the kernels' scalar head
    local.all_reduce(offset, segment_bytes=4096)
    assert_bitwise_equal(offset, reference([t[1:] for t in inputs], R.SUM), "offset")
    flags = [torch.tensor([True, True, False, rank == 1]) for rank in range(world)]
    local.all_reduce(flags, op=R.MAX)
    assert all(f.tolist() == [True, True, False, True] for f in flags)


def test_default_segments_at_several_megabytes():
    # Beyond the nccl transport's 4 MiB segment: several segments per chunk in both lanes, on the
    # transport's own staging (poisoned when fresh) and its issue window.
    world = 2
    local = sim_world(world, "nccl")
    numel = 3 * NCCL_SEGMENT_BYTES // 4 + 13
    inputs = exact_inputs(world, numel, torch.float32, R.SUM)
    tensors = [t.clone() for t in inputs]
    local.all_reduce(tensors)
    assert_bitwise_equal(tensors, reference(inputs, R.SUM), "default segments")


def _sim_process_matrix(rank, world):
    """Every collective on transport="sim", a few dtypes and ops: the failures, by name."""
    failures = []
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for op in (R.SUM, R.MAX) if dtype == torch.int32 else (R.SUM, R.AVG):
            for algorithm in ("ring", "central"):
                inputs = exact_inputs(world, 30_011, dtype, op)
                tensor = inputs[rank].clone()
                ringreduce.all_reduce(tensor, op=op, algorithm=algorithm, transport="sim", segment_bytes=8192)
                expected = reference(inputs, op)
                close = torch.equal(tensor, expected) or (
                    op == R.AVG and dtype == torch.bfloat16 and
                    bool(((tensor.double() - expected.double()).abs() <= 0.05 * (expected.double().abs() + 2)).all()))
                if not close:
                    failures.append(f"all_reduce {algorithm} {dtype} {op}")
    numel = 10_007
    out = torch.empty(numel)
    ringreduce.reduce_scatter_tensor(out, torch.arange(numel * world, dtype=torch.float32), transport="sim",
                                     segment_bytes=4096)
    if not torch.equal(out, torch.arange(numel * rank, numel * (rank + 1), dtype=torch.float32) * world):
        failures.append("reduce_scatter")
    gathered = torch.empty(numel * world)
    ringreduce.all_gather_into_tensor(gathered, torch.full((numel,), float(rank)), transport="sim", segment_bytes=4096)
    if not torch.equal(gathered, torch.arange(world, dtype=torch.float32).repeat_interleave(numel)):
        failures.append("all_gather")
    t = torch.full((numel,), float(rank))
    ringreduce.broadcast(t, src=world - 1, transport="sim", segment_bytes=4096)
    if not torch.equal(t, torch.full((numel,), float(world - 1))):
        failures.append("broadcast")
    t = torch.full((numel,), float(rank + 1))
    ringreduce.reduce(t, dst=0, transport="sim", segment_bytes=4096)
    if rank == 0 and not torch.equal(t, torch.full((numel,), world * (world + 1) / 2)):
        failures.append("reduce")
    return failures


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_collective_on_processes(world):
    assert run_ranks(world, _sim_process_matrix) == [[]] * world


# ---- reliability: mismatches, stalls, silence, deaths and errors reach every rank -------------


def _ragged_cases(rank, world):
    """Each collective with each pattern of sizes: (case, outcome, seconds). The device check
    compares neighbours and reports asynchronously, as on a GPU: the call may return, and the error
    comes from a later call on the group, within the budget."""
    outcomes = []
    for name, call in _RAGGED_CALLS.items():
        for sizes in sorted(RAGGED_SIZES):
            numel = RAGGED_SIZES[sizes](world)[rank]
            outcomes.append((f"{name}, {sizes}", *_until_mismatch(lambda: call(numel, world, transport="sim"))))
            ringreduce.destroy()
    return outcomes


def _until_mismatch(first, budget_s=10.0):
    start = time.monotonic()
    try:
        first()
        while time.monotonic() - start < budget_s:
            ringreduce.all_reduce(torch.ones(1), transport="sim")
            time.sleep(0.01)
        return "never raised", time.monotonic() - start
    except ringreduce.MismatchError as error:
        return ("MismatchError" if "disagree" in str(error) else f"MismatchError: {error}"), time.monotonic() - start
    except Exception as error:  # noqa: BLE001 - the test names what came instead
        return f"{type(error).__name__}: {error}", time.monotonic() - start


_RAGGED_CALLS = {
    "all_reduce ring": lambda n, w, **k: ringreduce.all_reduce(torch.ones(n), algorithm="ring", **k),
    "all_reduce central": lambda n, w, **k: ringreduce.all_reduce(torch.ones(n), algorithm="central", **k),
    "reduce_scatter": lambda n, w, **k: ringreduce.reduce_scatter_tensor(torch.empty(n), torch.ones(n * w), **k),
    "all_gather": lambda n, w, **k: ringreduce.all_gather_into_tensor(torch.empty(n * w), torch.ones(n), **k),
    "broadcast": lambda n, w, **k: ringreduce.broadcast(torch.ones(n), src=0, **k),
    "reduce": lambda n, w, **k: ringreduce.reduce(torch.ones(n), dst=0, **k),
}


@pytest.mark.parametrize("world", [3, 4])
def test_a_size_mismatch_raises_mismatch_error_on_every_process(world):
    for rank, outcomes in enumerate(run_ranks(world, _ragged_cases, env={"RINGREDUCE_TIMEOUT": "30"})):
        for case, outcome, seconds in outcomes:
            assert outcome == "MismatchError", f"rank {rank}, {case}: {outcome}"
            assert seconds < 10, f"rank {rank}, {case}: {seconds:.1f} s"


@pytest.mark.parametrize("world", [2, 4])
def test_a_dtype_mismatch_raises_mismatch_error_on_every_local_rank(world):
    local = sim_world(world, "nccl", timeout=datetime.timedelta(seconds=30))
    dtypes = [torch.float32] * (world - 1) + [torch.float64]
    outcomes = on_every_rank(local, lambda r, g: ringreduce.all_reduce(torch.ones(1000, dtype=dtypes[r]), group=g,
                                                                     async_op=True))
    start = time.monotonic()
    while not all(outcomes) and time.monotonic() - start < 10:  # later calls raise what the GPU check found
        later = on_every_rank(local, lambda r, g: ringreduce.all_reduce(torch.ones(1), group=g, async_op=True))
        outcomes = [first or then for first, then in zip(outcomes, later)]
    assert all(isinstance(o, ringreduce.MismatchError) for o in outcomes), outcomes
    assert all("float32" in str(o) and "float64" in str(o) for o in outcomes), outcomes


def _faulty_local_run(transport, fault, world=2, faulty_rank=1, seconds=0.0, after=3):
    """One all-reduce on every rank with `fault` armed on the faulty rank's simulated GPU: each
    rank's (error type, message), the seconds until every rank had raised, and whether every
    simulated stream was idle within a second after (ncclCommAbort ends the transfers in flight).
    The world is torn down before returning."""
    local = sim_world(world, transport, timeout=datetime.timedelta(seconds=FAULT_TIMEOUT_S))
    _C._testing.sim_inject(faulty_rank, fault, after=after, seconds=seconds)
    start = time.monotonic()
    outcomes = on_every_rank(local, lambda r, g: ringreduce.all_reduce(torch.ones(50_000), group=g, async_op=True,
                                                                     segment_bytes=4096))
    seconds = time.monotonic() - start
    drained = _within(1.0, lambda: _C._testing.sim_busy_streams() == 0)
    del local
    return [(type(o), str(o)) for o in outcomes], seconds, drained


def _within(seconds, condition):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stalled_stream_raises_within_the_timeout_on_every_rank(transport):
    # The stall outlasts the timeout (a hung kernel); teardown then waits for it to end. It strikes
    # the faulty rank's first kernel, which its later transfers come after: a later one could leave
    # a peer that has already received everything it needs, which then rightly succeeds.
    outcomes, seconds, _ = _faulty_local_run(transport, "stall", seconds=FAULT_TIMEOUT_S + SLACK_S - 0.5, after=0)
    assert all(kind is ringreduce.CommTimeoutError for kind, _ in outcomes), outcomes
    assert seconds < FAULT_TIMEOUT_S + SLACK_S, seconds


def test_a_peer_that_never_sends_raises_within_the_timeout_on_every_rank():
    outcomes, seconds, drained = _faulty_local_run("nccl", "silent_send")
    assert all(kind is ringreduce.CommTimeoutError for kind, _ in outcomes), outcomes
    assert seconds < FAULT_TIMEOUT_S + SLACK_S, seconds
    assert drained, "the watchdog's abort must end the transfers that wait for the silent peer"


def test_an_nccl_async_error_reaches_every_rank_quickly():
    outcomes, seconds, drained = _faulty_local_run("nccl", "async_error", world=3)
    assert all(issubclass(kind, RuntimeError) and "unhandled system error" in message for kind, message in outcomes), outcomes
    assert seconds < FAULT_TIMEOUT_S, seconds  # from the error and the published notice, not a timeout
    assert drained


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
def test_the_issue_window_keeps_the_host_within_reach_of_a_stalled_stream(collective):
    # One collective of thousands of exchanges (all-gather: exchanges only, no reduction kernel)
    # while rank 0's first kernel (its header write) hangs for a second: the host queues at most
    # the window's operations ahead of the device, and never blocks inside a call, so it finishes.
    _C._testing.sim_configure(seed=7, max_delay_us=20)
    local = sim_world(2, "nccl")
    _C._testing.sim_clear()
    _C._testing.sim_inject(0, "stall", after=0, seconds=1.0)
    numel = 1 << 20
    if collective == "all_reduce":
        tensors = [torch.ones(numel) for _ in range(2)]
        local.all_reduce(tensors, segment_bytes=1024)  # 2 x 2048 exchanges per rank
        assert all(torch.equal(t, torch.full((numel,), 2.0)) for t in tensors)
    else:
        outputs = [torch.empty(2 * numel) for _ in range(2)]
        works = [ringreduce.all_gather_into_tensor(outputs[r], torch.full((numel,), float(r)), group=local.group(r),
                                                   async_op=True, segment_bytes=1024) for r in range(2)]
        for work in works:
            work.wait()
        assert all(torch.equal(out, torch.arange(2.0).repeat_interleave(numel)) for out in outputs)
    assert 0 < _C._testing.sim_most_queued() <= ISSUE_WINDOW_OPS, _C._testing.sim_most_queued()


def _killed_peer(rank, world):
    if rank == 1:
        _C._testing.sim_inject(0, "exit", after=2)
    start = time.monotonic()
    try:
        ringreduce.all_reduce(torch.ones(50_000), transport="sim", segment_bytes=4096)
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return "returned", time.monotonic() - start


def test_a_peer_process_that_dies_mid_collective_is_reported():
    results = run_ranks(2, _killed_peer, dying=(1,), env={"RINGREDUCE_TIMEOUT": "60"})
    message, seconds = results[0]
    assert "exited" in message, message
    assert seconds < 10, seconds  # found by the dead peer's liveness, not the 60 s timeout
    assert results[1] == 17  # the fault's exit status


def test_teardown_with_collectives_in_flight_and_tensors_alive():
    threads_before = threading.active_count()
    for _ in range(3):
        local = sim_world(3, "nccl")
        tensors = [torch.ones(100_000) for _ in range(3)]
        works = [ringreduce.all_reduce(t, group=local.group(r), async_op=True, segment_bytes=4096)
                 for r, t in enumerate(tensors)]
        del local  # the communicators go while their collectives may still run; the tensors stay
        for work in works:
            work.wait()
        assert all(torch.equal(t, torch.full((100_000,), 3.0)) for t in tensors)
    time.sleep(0.5)
    assert threading.active_count() <= threads_before + 1


def test_streams_are_pooled_so_no_thread_is_left_behind():
    sim_world(4, "nccl")  # the pool holds what a 4-rank world needs
    before = _C._testing.sim_stream_threads()
    for _ in range(5):
        local = sim_world(4, "nccl")
        local.all_reduce([torch.ones(10) for _ in range(4)])
        del local
    assert _C._testing.sim_stream_threads() <= before + 12  # at most one more world's streams, however many come and go


def test_a_dropped_world_ends_at_once_not_later_inside_another_worlds_call():
    """A world and its groups form no reference cycle. With one, the garbage collector ended the
    world at a random later allocation, which could be one between two ranks' submissions of
    another world's first collective: ending the nccl transport waits for every stream (as
    cudaFreeHost does), rank 0's stream waited for ranks not yet submitted, and the run hung."""
    import gc
    import weakref

    gc.disable()
    try:
        local = sim_world(3, "nccl")
        local.all_reduce([torch.ones(10) for _ in range(3)])
        groups = [weakref.ref(g) for g in local.groups]
        world = weakref.ref(local)
        del local
        assert world() is None and all(g() is None for g in groups), "the world waits for the garbage collector"
    finally:
        gc.enable()


def test_tensors_kept_after_a_failure_go_with_the_next_call_once_the_device_is_done():
    """A failed call's tensors stay alive while work queued on the device may still write them,
    and not longer: once the device is done, the next call (here a healthy one) releases them.
    They were released only when another call failed."""
    import weakref

    assert _C._testing.sim_kept_calls() == 0
    local = sim_world(2, "nccl", timeout=datetime.timedelta(seconds=FAULT_TIMEOUT_S))
    _C._testing.sim_inject(1, "async_error", after=3)
    tensors = [torch.ones(50_000) for _ in range(2)]
    outcomes = on_every_rank(local, lambda r, g: ringreduce.all_reduce(tensors[r], group=g, async_op=True,
                                                                     segment_bytes=4096))
    assert all(isinstance(o, RuntimeError) for o in outcomes), outcomes
    assert _C._testing.sim_kept_calls() >= 1
    kept = [weakref.ref(t) for t in tensors]
    del tensors
    del local
    assert _within(5.0, lambda: _C._testing.sim_busy_streams() == 0)
    _C._testing.sim_clear()
    healthy = sim_world(2, "nccl")
    healthy.all_reduce([torch.ones(10) for _ in range(2)])
    assert _C._testing.sim_kept_calls() == 0
    assert all(ref() is None for ref in kept)


def _teardown_while_a_peer_runs(rank, world):
    """Rank 0 destroys its communicator while rank 1 still runs (it destroys 6 s later)."""
    ringreduce.all_reduce(torch.ones(1000), transport="sim")
    if rank == 1:
        time.sleep(6.0)
    start = time.monotonic()
    ringreduce.destroy()
    return time.monotonic() - start


def test_a_clean_teardown_does_not_wait_for_the_peers_to_tear_down_too():
    """ncclCommDestroy is collective among a node's ranks (so is the simulated one): waiting for it
    held a rank's teardown until every peer had torn down, or for the whole timeout (20 s here)."""
    took = run_ranks(2, _teardown_while_a_peer_runs, env={"RINGREDUCE_TIMEOUT": "20"})
    assert took[0] < 2.0, f"rank 0's teardown took {took[0]:.1f} s"
