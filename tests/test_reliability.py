"""Bad input, disagreeing ranks, dead peers and long runs: clear errors, never hangs or lost data."""

import datetime
import gc
import os
import resource
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

import ringreduce
from conftest import KEEP_STALE_SEGMENTS, namespaces_unavailable
from multiproc import run_ranks
from reference import R

# A timeout far above what any check here may take, so that passing within seconds proves the
# error came from detection and not from the timeout.
GENEROUS_TIMEOUT_S = "60"
DETECTION_BUDGET_S = 10.0

MISMATCHES = {
    "numel": lambda rank: (torch.ones(1000 - (rank == 1)), {}),
    "dtype": lambda rank: (torch.ones(1000, dtype=torch.float64 if rank == 2 else torch.float32), {}),
    "op": lambda rank: (torch.ones(1000), {"op": R.MAX if rank == 1 else R.SUM}),
    "algorithm": lambda rank: (torch.ones(1000), {"algorithm": "central" if rank == 0 else "ring"}),
    "empty": lambda rank: (torch.ones(0 if rank == 2 else 1000), {}),
    "segment size": lambda rank: (torch.ones(1000), {"segment_bytes": 512 if rank == 1 else 1024}),
}


def _disagree(rank, world, transport, case):
    tensor, kwargs = MISMATCHES[case](rank)
    ringreduce.all_reduce(torch.ones(100), transport=transport)  # a good call first
    start = time.monotonic()
    try:
        ringreduce.all_reduce(tensor, transport=transport, **kwargs)
    except ringreduce.MismatchError as error:
        message = str(error)
    else:
        message = None
    elapsed = time.monotonic() - start
    # The communicator stays refused afterwards, with the same reason.
    with pytest.raises(ringreduce.MismatchError, match="failed earlier"):
        ringreduce.all_reduce(torch.ones(100), transport=transport)
    return message, elapsed


@pytest.mark.parametrize("transport", ["shm", "pg"])
@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_disagreeing_ranks_all_raise_the_same_error_within_seconds(transport, case):
    results = run_ranks(3, _disagree, transport, case, env={"RINGREDUCE_TIMEOUT": GENEROUS_TIMEOUT_S})
    messages = {message for message, _ in results}
    assert len(messages) == 1 and None not in messages, results
    message = messages.pop()
    assert "disagree" in message and message.count(" has ") == 2  # names both calls
    if case == "segment size":
        assert "in segments of 512 bytes" in message and "in segments of 1024 bytes" in message
    assert all(elapsed < DETECTION_BUDGET_S for _, elapsed in results), results


def _two_odd_ranks(rank, world, numel, algorithms):
    tensor = torch.full((numel - (rank >= 3),), float(rank))
    try:
        ringreduce.all_reduce(tensor, transport="pg", algorithm=algorithms[rank >= 3])
    except ringreduce.MismatchError as error:
        assert torch.equal(tensor, torch.full_like(tensor, float(rank))), "a refused call must leave the tensor alone"
        return str(error)
    return None


# (numel, algorithm of ranks 0-2, of ranks 3-4): the check on its own before a ring; inside a
# doubling all-reduce, with all of it in the check's messages and with most of it after them; and
# ranks 3 and 4 on another algorithm, whose check meets the doubling ranks' messages (halving-doubling
# checks the call on its own first, as the ring does).
ODD_CALLS = [(1000, ("ring", "ring")), (1000, ("doubling", "doubling")), (30_000, ("doubling", "doubling")),
             (30_000, ("doubling", "ring")), (30_000, ("halving_doubling", "doubling"))]


@pytest.mark.parametrize("numel, algorithms", ODD_CALLS)
def test_the_pg_call_check_names_the_same_two_ranks_on_every_rank(numel, algorithms):
    """5 ranks, so rank 4 hands its call to rank 0 before the doubling rounds; ranks 3 and 4 differ
    from the rest. Every rank, including those that never met either, names rank 0 and rank 3."""
    messages = run_ranks(5, _two_odd_ranks, numel, algorithms, env={"RINGREDUCE_TIMEOUT": GENEROUS_TIMEOUT_S})
    assert len(set(messages)) == 1, messages
    assert f"rank 0 has {numel} x float32, SUM, {algorithms[0]}" in messages[0], messages[0]
    assert f"rank 3 has {numel - 1} x float32, SUM, {algorithms[1]}" in messages[0], messages[0]


def _lanes_disagree(rank, world):
    os.environ["RINGREDUCE_LANES"] = "2" if rank == 1 else "1"
    with pytest.raises(ringreduce.MismatchError) as info:
        ringreduce.all_reduce(torch.ones(1000), transport="pg")
    return str(info.value)


def test_ranks_running_different_lane_counts_raise_a_mismatch():
    messages = run_ranks(3, _lanes_disagree, env={"RINGREDUCE_TIMEOUT": GENEROUS_TIMEOUT_S})
    assert len(set(messages)) == 1 and "in 2 lanes" in messages[0], messages


def test_disagreeing_local_ranks_raise_the_same_error():
    world = ringreduce.LocalWorld(3, timeout=datetime.timedelta(seconds=60))
    tensors = [torch.ones(1000), torch.ones(999), torch.ones(1000)]
    works = [ringreduce.all_reduce(t, group=g, async_op=True) for t, g in zip(tensors, world.groups)]
    messages = []
    start = time.monotonic()
    for work in works:
        with pytest.raises(ringreduce.MismatchError) as info:
            work.wait()
        messages.append(str(info.value))
    assert time.monotonic() - start < DETECTION_BUDGET_S
    assert len(set(messages)) == 1 and "999 x float32" in messages[0] and "1000 x float32" in messages[0]


# How far past the timeout a survivor may raise on pg: the loop's last call started before the death,
# and two workers share two cores; the check before allowed timeout + 5 s, twice the timeout.
LATE_FACTOR = 1.5


def _die_midway(rank, world, transport):
    tensor = torch.ones(4 << 20)
    ringreduce.all_reduce(tensor, transport=transport)  # everyone is connected
    if rank == 2:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < 120:
            ringreduce.all_reduce(tensor, transport=transport)
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return None, time.monotonic() - start


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_a_killed_rank_makes_every_other_rank_raise(transport):
    # On pg the survivors raise when the timeout runs out (the test took 20.5 s with 20 s): short, then, but
    # far above what one 16 MiB call takes here.
    timeout_s = 5
    results = run_ranks(3, _die_midway, transport, dying={2}, env={"RINGREDUCE_TIMEOUT": str(timeout_s)})
    assert results[2] == -signal.SIGKILL
    # shm sees the death itself (the peer's pid), well inside the timeout; pg only by the timeout
    # running out, which a survivor that waited twice as long must not pass.
    bound_s = timeout_s if transport == "shm" else LATE_FACTOR * timeout_s
    for message, elapsed in results[:2]:
        assert message is not None, "a survivor finished its loop without an error"
        assert elapsed < bound_s, (message, elapsed)
    assert not leftover_segments()


def leftover_segments():
    """Segments whose creator (the pid after the prefix) has exited: this test's ranks all have by now;
    segments of processes still running (other tests' ranks, beside this one) are not left behind. The
    suite keeps groups from sweeping dead processes' segments (conftest.KEEP_STALE_SEGMENTS), so a
    segment a killed rank failed to unlink is still here, whatever the other worker's groups did."""
    names = [name for name in os.listdir("/dev/shm") if name.startswith("ringreduce-")]
    return sorted(name for name in names if not os.path.exists(f"/proc/{name.split('-')[1]}"))


def _open_a_group(rank, world):
    ringreduce.all_reduce(torch.ones(4), transport="shm")
    return rank


def _planted_segment(pid, pid_namespace):
    """A segment named as a ringreduce process `pid` of pid namespace `pid_namespace` would name its own."""
    path = f"/dev/shm/ringreduce-{pid}-{pid_namespace}-planted"
    open(path, "wb").close()
    return path


def _exited_pid():
    exited = subprocess.Popen(["true"])
    exited.wait()
    return exited.pid


def _another_pid_namespace():
    """The identity of a pid namespace other than this process's, as a container beside this one has."""
    done = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c",
                           "import os; print(os.stat('/proc/self/ns/pid').st_ino)"],
                          capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout)


@pytest.mark.skipif(namespaces_unavailable() is not None, reason=str(namespaces_unavailable()))
def test_a_new_shm_group_sweeps_the_segments_of_dead_processes_and_no_others(monkeypatch):
    own_namespace = os.stat("/proc/self/ns/pid").st_ino
    planted = {
        "dead here": _planted_segment(_exited_pid(), own_namespace),
        "live here": _planted_segment(os.getpid(), own_namespace),
        # A container sharing /dev/shm but not pids: its creator's pid names no process here, and
        # its job may be running.
        "in another pid namespace": _planted_segment(_exited_pid(), _another_pid_namespace()),
    }
    try:
        run_ranks(2, _open_a_group)  # the suite's setting: no sweep
        assert all(os.path.exists(path) for path in planted.values())
        monkeypatch.delenv(KEEP_STALE_SEGMENTS)
        run_ranks(2, _open_a_group)
        left = {what for what, path in planted.items() if os.path.exists(path)}
        assert left == {"live here", "in another pid namespace"}, left
    finally:
        for path in planted.values():
            if os.path.exists(path):
                os.unlink(path)


def _many_in_flight(rank, world):
    tensors = [torch.full((257 + 1000 * (i % 5),), float(i + rank)) for i in range(64)]
    order = []
    works = []
    for i, tensor in enumerate(tensors):
        work = ringreduce.all_reduce(tensor, async_op=True)
        works.append(work.get_future().then(lambda fut, i=i: order.append(i)))
    for work in works:
        work.wait()
    correct = all(torch.equal(t, torch.full_like(t, float(world * i + sum(range(world))))) for i, t in enumerate(tensors))
    return order == list(range(64)), correct


def test_64_async_all_reduces_complete_in_issue_order():
    assert all(in_order and correct for in_order, correct in run_ranks(2, _many_in_flight))


# Calls per timed batch when the worn group is set beside a fresh one: a few ms each here.
SIDE_BY_SIDE_CALLS = 1000


def _batch_seconds(tensor, group, calls):
    start = time.perf_counter()
    for _ in range(calls):
        ringreduce.all_reduce(tensor, op=R.MAX, group=group)
    return time.perf_counter() - start


def _back_to_back(rank, world, calls):
    tensor = torch.full((1024,), float(rank))  # 4 KiB
    _batch_seconds(tensor, None, calls // 5)  # warm-up: buffers, reducers and caches settle
    gc.collect()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _batch_seconds(tensor, None, calls)
    gc.collect()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    # The worn group against a fresh one, batch by batch in turn: both under the same load, so that
    # only work left behind per call (which would grow without limit) can set them apart.
    fresh = dist.new_group(list(range(world)))
    _batch_seconds(tensor, fresh, SIDE_BY_SIDE_CALLS)
    worn_seconds, fresh_seconds = [], []
    for _ in range(6):
        worn_seconds.append(_batch_seconds(tensor, None, SIDE_BY_SIDE_CALLS))
        fresh_seconds.append(_batch_seconds(tensor, fresh, SIDE_BY_SIDE_CALLS))
    return grown_kib, worn_seconds, fresh_seconds, tensor.sum().item()


def test_ten_thousand_small_all_reduces_neither_leak_nor_slow_down():
    for grown_kib, worn_seconds, fresh_seconds, total in run_ranks(2, _back_to_back, 10_000):
        assert total == 1024.0 * (2 - 1)  # MAX of rank 0's zeros and rank 1's ones
        assert grown_kib < 16 * 1024, f"peak memory grew by {grown_kib} KiB"
        # Each group's quietest batch: a loose bound, as the machine is shared.
        assert min(worn_seconds) < 3 * min(fresh_seconds) + 0.01, (worn_seconds, fresh_seconds)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
def test_integer_sums_and_products_wrap_like_torch(dtype):
    info = torch.iinfo(dtype)
    world = ringreduce.LocalWorld(3)
    values = [torch.tensor([info.max, info.min, info.max // 2 + 1, -1 if info.min < 0 else 7], dtype=dtype) for _ in range(3)]
    for op, combine in ((R.SUM, torch.add), (R.PRODUCT, torch.mul)):
        tensors = [v.clone() for v in values]
        world.all_reduce(tensors, op=op)
        expected = combine(combine(values[0], values[1]), values[2])  # torch's own wrapping arithmetic
        assert all(torch.equal(t, expected) for t in tensors), (dtype, op, tensors[0], expected)


def test_a_cpu_tensor_is_refused_by_a_gpu_transport_and_left_untouched():
    if "nccl" not in ringreduce.build_info()["transports"]:
        pytest.skip("this build has no GPU transport")
    world = ringreduce.LocalWorld(2)
    tensor = torch.arange(4.0)
    with pytest.raises(ValueError, match="cannot serve a cpu tensor"):
        ringreduce.all_reduce(tensor, transport="nccl")
    with pytest.raises(ValueError, match="LocalWorld group uses transport 'local'"):
        ringreduce.all_reduce(tensor, group=world.group(0), transport="nccl")
    assert torch.equal(tensor, torch.arange(4.0))


# How long a sleeping shm rank may take to hear of a peer's abort: a futex wake-up and a few
# checks, against the 100 ms liveness poll it used to wait out.
ABORT_REACHES_A_SLEEPER_S = 0.03
# Long enough for rank 1 to be asleep in its wait (it spins and yields for about 1 ms first).
SLEEPER_HEAD_START_S = 0.3
# Trials, all but one of which must be that fast: a busy machine may delay one; the 100 ms poll this
# guards against gives lags spread over 0-100 ms, 30% of them under the bound, so 6 of 7 pass by
# chance about 0.4% of the time (a median of 3 did 22% of the time).
ABORT_TRIALS = 7


def _abort_while_asleep(rank, world):
    """Rank 1 calls first and falls asleep waiting for rank 0; rank 2 then calls with another size,
    finds the disagreement in rank 1's first piece and aborts; rank 0 comes last. Returns when the
    rank's MismatchError came, per trial."""
    raised_at = []
    for trial in range(ABORT_TRIALS):
        time.sleep({0: 2 * SLEEPER_HEAD_START_S, 1: 0.0, 2: SLEEPER_HEAD_START_S}[rank])
        numel = 999 if rank == 2 else 1000
        try:
            ringreduce.all_reduce(torch.ones(numel), algorithm="ring", transport="shm")
        except ringreduce.MismatchError:
            raised_at.append(time.time())
        ringreduce.destroy()
    return raised_at


def test_an_abort_reaches_a_sleeping_shm_peer_within_milliseconds():
    times = run_ranks(3, _abort_while_asleep, env={"RINGREDUCE_TIMEOUT": GENEROUS_TIMEOUT_S})
    assert all(len(t) == ABORT_TRIALS for t in times), times
    lags = sorted(times[1][trial] - times[2][trial] for trial in range(ABORT_TRIALS))
    assert lags[-2] < ABORT_REACHES_A_SLEEPER_S, lags
