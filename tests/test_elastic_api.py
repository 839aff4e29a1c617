"""What the package's own calls and GPU groups do when ranks are lost. On a group of the ringreduce
backend, ringreduce.all_reduce (and what is built on it: the DDP hooks, local SGD) names the lost
ranks as dist.all_reduce does, within the loss bound, on shared memory and on the GPU path (the
nccl transport on the simulated device), and so do the ops the backend delegates to gloo; on any
other group the package's error says what to do. A shrunk
group serves both devices, and a group whose CUDA side runs another backend is refused before
anything changes."""

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce import _C
from multiproc import run_ranks

# The loss bound of these tests (RINGREDUCE_LOST_AFTER), shorter than the default 10 s so that they
# are short too, and what the survivors may take beyond it to name the rank: a pulse period, the
# agreement, an abort on the simulated device (measured 0.5-1.2 s beyond the bound on 2026-12-05,
# 3 ranks, an idle 2-core machine; the suite runs two test files at once).
SILENT_BOUND_S = 2.0
NAMED_AFTER_BOUND_S = 3.0
# The timeout of the package's communicators: far beyond the bound, so that a wait the loss does
# not end shows as a failed bound, not as a pass.
PACKAGE_TIMEOUT_S = 60

TRANSPORTS = ["shm", pytest.param("sim", marks=pytest.mark.skipif(
    not _C.build_info()["sim"], reason="this build has no simulated device (setup.py)"))]


def _silent_rank_under_package_calls(rank, world, transport):
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid/{rank}", str(os.getpid()))
    t = torch.ones(1 << 16)
    ringreduce.all_reduce(t, transport=transport)  # every rank is up, the communicators are made
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)  # alive, but silent: as a host whose link went down
    started = time.monotonic()
    with pytest.raises(ringreduce.RanksLostError) as caught:
        ringreduce.all_reduce(t, transport=transport)
    detected_s = time.monotonic() - started
    assert caught.value.lost_ranks == [2]
    assert ringreduce.lost_ranks() == [2]
    ringreduce.shrink(None, [2])
    if rank == 0:
        os.kill(int(store.get("pid/2")), signal.SIGKILL)
    x = torch.full((1000,), float(rank + 1))
    ringreduce.all_reduce(x, transport=transport)
    assert torch.equal(x, torch.full((1000,), 3.0))
    return detected_s


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_package_calls_on_a_ringreduce_group_name_a_silent_rank_within_the_bound(transport):
    env = {"RINGREDUCE_LOST_AFTER": str(SILENT_BOUND_S), "RINGREDUCE_TIMEOUT": str(PACKAGE_TIMEOUT_S)}
    results = run_ranks(3, _silent_rank_under_package_calls, transport, backend="ringreduce", env=env, dying=(2,))
    for detected_s in results[:2]:
        assert detected_s < SILENT_BOUND_S + NAMED_AFTER_BOUND_S, results


def _lost_rank_under_delegated_ops(rank, world, how):
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid/{rank}", str(os.getpid()))
    dist.barrier()
    if rank == 2:
        os.kill(os.getpid(), how)
    started = time.monotonic()
    with pytest.raises(ringreduce.RanksLostError) as caught:
        if rank == 0:  # gloo's receive, aborted on the loss
            dist.recv(torch.empty(10), src=2)
        else:  # gloo's gather, left running in gloo's thread
            dist.gather(torch.ones(10), [torch.empty(10) for _ in range(world)], dst=1)
    detected_s = time.monotonic() - started
    assert caught.value.lost_ranks == [2], str(caught.value)
    assert "delegated to gloo" in str(caught.value), str(caught.value)
    ringreduce.shrink(None, [2])  # the old group goes without waiting for the gather's thread
    if rank == 0 and how == signal.SIGSTOP:
        os.kill(int(store.get("pid/2")), signal.SIGKILL)
    x = torch.full((10,), float(rank + 1))
    if rank == 0:
        dist.send(x, dst=1)
    else:
        dist.recv(x, src=0)
    assert torch.equal(x, torch.full((10,), 1.0))
    return detected_s


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["silent", "killed"])
def test_ops_delegated_to_gloo_name_a_lost_rank_within_the_bound(how):
    # The group's timeout is torch's 30 minutes: gloo alone would wait that long for a silent rank,
    # and raise its own connection error, naming nobody, for a killed one.
    env = {"RINGREDUCE_LOST_AFTER": str(SILENT_BOUND_S)}
    results = run_ranks(3, _lost_rank_under_delegated_ops, how, backend="ringreduce", env=env, dying=(2,))
    for detected_s in results[:2]:
        assert detected_s < SILENT_BOUND_S + NAMED_AFTER_BOUND_S, results


def _death_under_a_hook_on_a_gloo_group(rank, world):
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 8))
    model.register_comm_hook(None, ringreduce.hooks.ring_hook)
    for _ in range(2):  # every rank is up, the communicator is made, DDP has rebuilt its buckets (on gloo)
        model(torch.randn(4, 8)).sum().backward()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(RuntimeError) as caught:
        model(torch.randn(4, 8)).sum().backward()
    assert not isinstance(caught.value, ringreduce.RanksLostError)
    message = str(caught.value)
    assert "exited" in message, message  # what went wrong: the shared memory transport names the dead pid
    assert "keeps no membership" in message and 'init_process_group("ringreduce")' in message, message
    with pytest.raises(TypeError, match="not on the ringreduce backend"):
        ringreduce.lost_ranks()
    return True


def test_a_death_under_the_package_calls_on_a_gloo_group_says_what_to_do():
    assert run_ranks(3, _death_under_a_hook_on_a_gloo_group, dying=(2,))[:2] == [True, True]


def _shrunk_group_devices(rank, world):
    mixed = dist.new_group(backend="cpu:ringreduce,cuda:gloo")
    for shrink in (lambda: dist.shrink_group([2], group=mixed), lambda: ringreduce.shrink(mixed, [2])):
        started = time.monotonic()
        with pytest.raises(TypeError, match=r"runs cuda tensors on torch's gloo backend.*nothing changed.*"
                                            r"init_process_group\(\"ringreduce\"\)"):
            shrink()
        assert time.monotonic() - started < 1.0  # refused at once: no roll call waits for the others
    x = torch.full((100,), float(rank))
    dist.all_reduce(x, group=mixed)  # the group is untouched and still works
    assert torch.equal(x, torch.full((100,), 3.0))
    dist.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(ringreduce.RanksLostError):
        dist.all_reduce(x)
    shrunk = dist.shrink_group([2])
    # Both devices reach the survivors' backend, as both reached the group's (torch 2.14 alone
    # registers a shrunk group's backend for the CPU only, and CUDA tensors would find none).
    cpu, cuda = (shrunk._get_backend(torch.device(device)) for device in ("cpu", "cuda"))
    assert isinstance(cpu, _C.Backend) and cpu.size() == 2
    assert isinstance(cuda, _C.Backend) and cuda.size() == 2 and cuda.membership is cpu.membership
    assert dist.get_backend(shrunk) == "ringreduce"
    y = torch.full((100,), float(rank + 1))
    dist.all_reduce(y)
    assert torch.equal(y, torch.full((100,), 3.0))
    return True


def test_a_shrunk_group_serves_both_devices_and_a_mixed_one_is_refused_at_once():
    assert run_ranks(3, _shrunk_group_devices, backend="ringreduce", dying=(2,))[:2] == [True, True]
