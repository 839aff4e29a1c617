"""The asynchronous parameter server (ringreduce.ps): exact replay of what it applied, the staleness
bound, synchronous rounds against synchronous SGD, bad input, and ranks that die."""

import os
import signal
import time

import pytest
import torch

from multiproc import run_ranks

NUMEL = 1000
LR = 0.5
STEPS = 12


def _start():
    return torch.linspace(-1.0, 1.0, NUMEL)


def _target(rank):
    return torch.full((NUMEL,), float(rank + 1)) + torch.linspace(0.0, 0.25, NUMEL)


def _grad(params, rank):
    """The gradient of 0.5 * |params - target(rank)|^2: the workers pull towards different points."""
    return params - _target(rank)


def _server(rank, **kwargs):
    import ringreduce.ps

    params = torch.nn.Parameter(_start() if rank == 0 else torch.zeros(NUMEL))
    return ringreduce.ps.ParameterServer([params], **kwargs), params


def _replay_run(rank, world, transport, use_optimizer):
    kwargs = {"optimizer": lambda p: torch.optim.SGD([p], lr=LR, momentum=0.9)} if use_optimizer else {"lr": LR}
    server, params = _server(rank, transport=transport, record=True, **kwargs)
    if rank == 1:
        for bad, error in [(torch.zeros(NUMEL + 1), ValueError), (torch.zeros(NUMEL, dtype=torch.float64), TypeError)]:
            with pytest.raises(error, match="grad"):
                server.push(bad)
    for step in range(STEPS):
        if rank == world - 1:
            time.sleep(0.002)  # one slower worker, so pushes interleave and some are stale
        params.grad = _grad(params.detach(), rank)
        server.step()
    stats = server.close()
    if rank != 0:
        # A hello, STEPS pushes (a message and the gradient), and the leave.
        assert stats["pushes"] == STEPS and stats["bytes_sent"] == 32 + STEPS * (32 + 4 * NUMEL) + 32
        return None
    # The server: replay every logged gradient in order from the start, with the same update.
    log, grads = server.log(), server.gradients()
    assert len(log) == len(grads) == world * STEPS == stats["version"]
    assert [applied for _, _, _, applied in log] == list(range(world * STEPS))
    for worker in range(world):
        assert [step for w, step, _, _ in log if w == worker] == list(range(STEPS))
    assert all(read <= applied for _, _, read, applied in log)
    replay = torch.nn.Parameter(_start())
    if use_optimizer:
        optimizer = torch.optim.SGD([replay], lr=LR, momentum=0.9)
        for g in grads:
            replay.grad = g / world
            optimizer.step()
    else:
        with torch.no_grad():
            for g in grads:
                replay.sub_(g * (LR / world))
    assert torch.equal(replay.detach(), server.params), "the server's parameters are not the replay of its log"
    staleness = [applied - read for _, _, read, applied in log]
    assert stats["staleness_max"] == max(staleness)
    assert stats["staleness_mean"] == pytest.approx(sum(staleness) / len(staleness))
    assert stats["lost"] == {}
    return stats["staleness_max"]


@pytest.mark.parametrize("transport,world,use_optimizer", [("shm", 3, False), ("pg", 2, False), ("shm", 2, True)])
def test_the_servers_parameters_are_the_exact_replay_of_the_pushes_it_logged(transport, world, use_optimizer):
    run_ranks(world, _replay_run, transport, use_optimizer)


def _synchronous_run(rank, world):
    server, params = _server(rank, lr=LR, staleness=0)
    for _ in range(STEPS):
        params.grad = _grad(params.detach(), rank)
        server.step()
    stats = server.close()
    return params.detach().tolist(), stats.get("staleness_max")


def test_staleness_zero_is_synchronous_sgd():
    world = 3
    results = run_ranks(world, _synchronous_run)
    expected = _start().double()
    for _ in range(STEPS):
        expected -= LR * sum(expected - _target(r).double() for r in range(world)) / world
    for params, _ in results:
        torch.testing.assert_close(torch.tensor(params, dtype=torch.float64), expected, rtol=0, atol=1e-5)
    # In a synchronous round the i-th push applied is i updates stale, never more.
    assert results[0][1] == world - 1


def _bounded_run(rank, world, bound):
    server, params = _server(rank, lr=0.01, staleness=bound)
    for _ in range(STEPS):
        if rank == 1:
            time.sleep(0.01)  # the straggler
        params.grad = _grad(params.detach(), rank)
        server.step()
    server.close()
    return server.log() if rank == 0 else None


@pytest.mark.parametrize("bound", [1, None])
def test_no_worker_runs_more_than_the_bound_ahead_of_the_slowest(bound):
    world = 3
    log = run_ranks(world, _bounded_run, bound)[0]
    applied = [0] * world
    lead = 0
    for worker, step, _, _ in log:
        # `worker` read the parameters for this step when every other worker still pushing had
        # applied at least step - bound pushes.
        others = [applied[w] for w in range(world) if w != worker and applied[w] < STEPS]
        if others:
            lead = max(lead, step - min(others))
        applied[worker] += 1
    if bound is None:
        assert lead > 1, "without a bound the fast workers should have run ahead of the straggler"
    else:
        assert lead == bound, f"the lead over the slowest reached {lead}, the bound is {bound}"


def _dying_worker_run(rank, world, transport):
    server, params = _server(rank, lr=0.1, staleness=0, transport=transport)
    for step in range(STEPS):
        if rank == 2 and step == 3:
            os._exit(3)
        params.grad = _grad(params.detach(), rank)
        server.step()
    stats = server.close()
    return stats.get("lost"), stats["pushes"]


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_a_worker_that_dies_is_dropped_and_the_others_finish(transport):
    results = run_ranks(3, _dying_worker_run, transport, dying=(2,))
    lost, _ = results[0]
    assert list(lost) == [2], lost
    # The message names the group's ranks, not the ranks inside the server's private pair.
    assert "rank 2" in lost[2] and "rank 1" not in lost[2], lost[2]
    assert [r[1] for r in results[:2]] == [STEPS, STEPS]
    assert results[2] == 3


def _dying_server_run(rank, world, transport):
    server, params = _server(rank, lr=0.1, staleness=0, transport=transport)
    last = time.monotonic()
    for step in range(STEPS):
        if rank == 0 and step == 3:
            os._exit(3)
        params.grad = _grad(params.detach(), rank)
        try:
            server.step()
        except RuntimeError as error:
            return str(error), time.monotonic() - last
        last = time.monotonic()
    return "finished", 0.0


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_when_the_server_dies_every_worker_raises_within_the_timeout(transport):
    timeout_s = 5.0
    results = run_ranks(3, _dying_server_run, transport, dying=(0,), env={"RINGREDUCE_TIMEOUT": str(timeout_s)})
    for message, waited in results[1:]:
        assert "lost the parameter server (rank 0)" in message, message
        assert waited < timeout_s + 2, f"a worker took {waited:.1f} s to notice"


def _mismatched_run(rank, world):
    import ringreduce.ps

    params = torch.nn.Parameter(torch.zeros(NUMEL + (rank == 2)))
    if rank == 2:
        with pytest.raises(ValueError, match=f"parameters have {NUMEL + 1} elements, the server's"):
            ringreduce.ps.ParameterServer([params], lr=0.1, staleness=0)
        return None
    server = ringreduce.ps.ParameterServer([params], lr=0.1, staleness=0)
    for _ in range(3):
        params.grad = torch.ones(NUMEL)
        server.step()
    return server.close().get("lost")


def test_a_worker_with_other_parameters_is_refused_and_the_others_go_on():
    lost = run_ranks(3, _mismatched_run)[0]
    assert list(lost) == [2] and f"worker 2 has {NUMEL + 1} parameters, the server {NUMEL}" in lost[2], lost


def _bad_arguments(rank, world):
    import ringreduce.ps

    params = [torch.nn.Parameter(torch.zeros(3))]
    bad = [
        (dict(lr=0.1, optimizer=lambda p: None), ValueError, "exactly one"),
        (dict(lr=-1.0), ValueError, "positive"),
        (dict(lr=0.1, staleness=-1), ValueError, "staleness"),
        (dict(lr=0.1, server_rank=5), ValueError, "server_rank"),
        (dict(lr=0.1, transport="nccl"), ValueError, "transport"),
    ]
    for kwargs, error, words in bad:
        with pytest.raises(error, match=words):
            ringreduce.ps.ParameterServer(params, **kwargs)
    with pytest.raises(ValueError, match="no elements"):
        ringreduce.ps.ParameterServer([torch.zeros(0)], lr=0.1)
    with pytest.raises(TypeError, match="float32 CPU"):
        ringreduce.ps.ParameterServer([torch.zeros(3, dtype=torch.float64)], lr=0.1)
    # One rank alone: its pushes are applied directly, SGD with the full learning rate.
    server = ringreduce.ps.ParameterServer(params, lr=0.5)
    params[0].grad = torch.ones(3)
    server.step()
    assert params[0].detach().tolist() == [-0.5] * 3
    server.close()
    with pytest.raises(RuntimeError, match="closed"):
        server.step()
    return True


def test_bad_arguments_are_refused_with_what_was_wrong():
    assert run_ranks(1, _bad_arguments) == [True]


def _dropped_server_run(rank, world):
    import gc

    try:
        server, params = _server(rank, lr=0.1)  # a late worker may find the server stopped already
        for step in range(1000):
            if rank == 0 and step == 2:
                start = time.monotonic()
                del server  # dropped without close(), while the workers are still pushing
                gc.collect()
                return time.monotonic() - start
            params.grad = _grad(params.detach(), rank)
            server.step()
    except RuntimeError as error:
        return str(error)
    return "never told"


def test_a_server_dropped_without_close_stops_its_workers_with_an_error():
    results = run_ranks(3, _dropped_server_run, env={"RINGREDUCE_TIMEOUT": "10"})
    # Its links are woken, not left to the transport's timeout (10 s here).
    assert results[0] < 2.0, f"dropping the server took {results[0]:.1f} s"
    for message in results[1:]:
        assert "the parameter server has stopped" in message and "dropped without close()" in message, message


def _breaking_optimizer(p):
    """SGD whose third step raises (after the first two were applied)."""
    sgd = torch.optim.SGD([p], lr=0.1)
    steps = []
    step = sgd.step

    def breaking_step(*args, **kwargs):
        steps.append(1)
        if len(steps) == 3:
            raise RuntimeError("the optimizer broke at its third step")
        return step(*args, **kwargs)

    sgd.step = breaking_step
    return sgd


def _failing_update_run(rank, world, transport):
    server, params = _server(rank, optimizer=_breaking_optimizer, staleness=0, transport=transport)
    for step in range(STEPS):
        params.grad = _grad(params.detach(), rank)
        try:
            server.step()
        except RuntimeError as error:
            return str(error), step
    return "trained on", STEPS


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_an_update_that_raises_stops_the_server_and_every_rank_is_told_why(transport):
    """The server's failure, not a worker's: no worker is dropped, nobody trains on, and every rank
    (the server's too) raises with the optimizer's own error."""
    results = run_ranks(3, _failing_update_run, transport, env={"RINGREDUCE_TIMEOUT": "20"})
    for rank, (message, step) in enumerate(results):
        assert "its update failed" in message and "the optimizer broke at its third step" in message, (rank, message)
        assert "lost worker" not in message and step < 2, (rank, message, step)


def _server_leaves_by_exception_run(rank, world, transport):
    import ringreduce.ps

    params = torch.nn.Parameter(_start() if rank == 0 else torch.zeros(NUMEL))
    start = None
    try:
        with ringreduce.ps.ParameterServer([params], lr=0.1, staleness=0, transport=transport) as server:
            for step in range(100):
                if rank == 0 and step == 2:
                    start = time.monotonic()
                    raise ValueError("the server rank's own loop failed")
                time.sleep(0.02)
                params.grad = _grad(params.detach(), rank)
                server.step()
    except ValueError:
        return time.monotonic() - start
    except RuntimeError as error:
        return str(error)
    return "trained to the end"


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_a_server_rank_that_leaves_by_an_exception_stops_the_workers_at_once(transport):
    """Not a wait for the workers' whole loops (2 s here) with the bound gone: they are stopped."""
    results = run_ranks(3, _server_leaves_by_exception_run, transport, env={"RINGREDUCE_TIMEOUT": "20"})
    assert results[0] < 1.0, f"leaving the with block took {results[0]:.1f} s"
    for message in results[1:]:
        assert "left by ValueError: the server rank's own loop failed" in message, message


# How soon close() must give way to Ctrl-C: it waits for its workers in slices that check for signals.
CTRL_C_TAKEN_WITHIN_S = 1.0


def _interrupted_close_run(rank, world):
    import _thread
    import threading

    server, params = _server(rank, lr=0.1)
    if rank == 0:
        # Ctrl-C as in a terminal, also where the suite runs in the background (which starts SIGINT ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        pressed = []

        def ctrl_c():
            pressed.append(time.monotonic())
            _thread.interrupt_main()

        threading.Timer(0.5, ctrl_c).start()  # half a second into close(), or later on a busy machine
        with pytest.raises(KeyboardInterrupt):  # so close() was still waiting when it came
            server.close()
        return time.monotonic() - pressed[0]
    try:
        for _ in range(200):  # 10 s of training
            time.sleep(0.05)
            params.grad = _grad(params.detach(), rank)
            server.step()
    except RuntimeError as error:
        return str(error)
    return "never told"


def test_ctrl_c_during_close_stops_the_server():
    results = run_ranks(2, _interrupted_close_run, env={"RINGREDUCE_TIMEOUT": "20"})
    # Timed from the moment Ctrl-C came, not from when it was asked for: a busy machine delays the timer.
    assert results[0] < CTRL_C_TAKEN_WITHIN_S, f"close() took {results[0]:.1f} s to take Ctrl-C"
    assert "interrupted while waiting for its workers" in results[1], results[1]


def _slow_server_rank_run(rank, world, transport):
    server, params = _server(rank, lr=0.1, staleness=0, transport=transport)
    for step in range(4):
        if rank == 0 and step == 1:
            time.sleep(2.5)  # the server rank's own work (an evaluation, a checkpoint): 1.7 timeouts
        params.grad = _grad(params.detach(), rank)
        server.step()
    stats = server.close()
    return stats.get("lost", {}), stats["pushes"]


@pytest.mark.parametrize("transport", ["shm", "pg"])
def test_workers_held_back_by_the_bound_longer_than_the_timeout_go_on(transport):
    """The bound holds the workers while the server rank is busy: keep-alives tell them it lives."""
    results = run_ranks(3, _slow_server_rank_run, transport, env={"RINGREDUCE_TIMEOUT": "1.5"})
    assert results[0] == ({}, 4), results[0]
    assert [pushes for _, pushes in results[1:]] == [4, 4]


def _stuck_server_rank_run(rank, world):
    server, params = _server(rank, lr=0.1, staleness=0)
    start = time.monotonic()
    try:
        for step in range(4):
            if rank == 0 and step == 1:
                time.sleep(6.0)  # stuck far beyond the timeout
                return "slept"
            params.grad = _grad(params.detach(), rank)
            server.step()
            start = time.monotonic()
    except RuntimeError as error:
        return str(error), time.monotonic() - start
    return "never told"


def test_workers_held_by_a_stuck_server_rank_are_told_who_holds_them():
    """Not a wait for ever: after two timeouts with nothing happening on the server, each held
    worker is told that the server rank is the one it waits for."""
    results = run_ranks(3, _stuck_server_rank_run, env={"RINGREDUCE_TIMEOUT": "1"})
    for message, waited in results[1:]:
        assert "waiting for worker 0 (the server rank)" in message, message
        assert 1.8 <= waited < 4.5, waited


def _foreign_worker_run(rank, world):
    """Rank 2 speaks another protocol version: its hello, then a longer message than ours."""
    import datetime

    import torch.distributed as dist

    from ringreduce import _groups

    if rank != 2:
        server, params = _server(rank, lr=0.1, staleness=None, transport="pg")
        for _ in range(3):
            params.grad = _grad(params.detach(), rank)
            server.step()
        return server.close().get("lost")
    pair = dist.PrefixStore("2/", _groups.group_state(None).fresh_store("ps"))
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", pair), 1, 2, datetime.timedelta(seconds=20))
    hello = torch.tensor([0x53505252, 1, 48, 0, 0, 0, 0, 0], dtype=torch.int32).view(torch.uint8)
    gloo.send([hello], 0, 0).wait()
    try:
        gloo.send([torch.zeros(48, dtype=torch.uint8)], 0, 1).wait()
    except RuntimeError:
        pass  # the server has closed the pair already
    return None


def test_a_worker_of_another_protocol_version_is_refused_and_the_server_lives():
    """Over gloo a message longer than the receive posted for it aborts the process: the server
    checks a fixed-size hello before it trusts anything else."""
    lost = run_ranks(3, _foreign_worker_run, env={"RINGREDUCE_TIMEOUT": "20"})[0]
    assert list(lost) == [2], lost
    assert "protocol version 1 (48-byte messages)" in lost[2] and "install the same ringreduce" in lost[2], lost
