"""One training state after a death: ringreduce.sync_state gives every rank the parameters, optimizer
state and step of the rank furthest ahead, bit for bit; and a death landed where one survivor has
finished a step's last all-reduce and another has not is recovered that way."""

import collections
import functools
import hashlib

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringreduce
from ringreduce import _C
from multiproc import run_ranks

Pair = collections.namedtuple("Pair", "count values")


class Notebook:
    """State of a kind torch does not make: a strided view, a named tuple, a bf16 tensor and text."""

    def __init__(self, seed):
        gen = torch.Generator().manual_seed(seed)
        self.state = {"view": torch.randn(6, 4, generator=gen).t(), "pair": Pair(seed, torch.arange(seed + 3)),
                      "half": torch.randn(5, generator=gen).to(torch.bfloat16), "note": f"seed {seed}"}

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def _bytes_of(state) -> bytes:
    """Every bit of a (nested) state: tensors by dtype, shape and bytes, the rest by repr."""
    if isinstance(state, torch.Tensor):
        return repr((state.dtype, tuple(state.shape))).encode() + state.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
    if isinstance(state, dict):
        return b"{" + b"".join(repr(k).encode() + _bytes_of(v) for k, v in state.items()) + b"}"
    if isinstance(state, (list, tuple)):
        return b"[" + b"".join(_bytes_of(v) for v in state) + b"]"
    return repr(state).encode()


def _digest(*stateful) -> str:
    return hashlib.sha256(b"".join(_bytes_of(thing.state_dict()) for thing in stateful)).hexdigest()


def _model():
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    model.register_buffer("scale", torch.ones(3, dtype=torch.float64))
    return model


def _optimizer(name, model):
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-2)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _local_steps(model, optimizer, count, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(8, 16, generator=gen)).square().mean().backward()
        optimizer.step()


def _sync_divergent_ranks(rank, world, optimizer_name):
    # Each rank its own parameters and history: rank 0 never stepped (no optimizer state at all).
    torch.manual_seed(rank)
    model = _model()
    optimizer = _optimizer(optimizer_name, model)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _local_steps(model, optimizer, rank, seed=rank)
    for _ in range(rank):
        scheduler.step()
    notebook = Notebook(rank)
    stateful = (model, optimizer, scheduler, notebook)
    own = _digest(*stateful)
    step = ringreduce.sync_state([3, 5, 5][rank], *stateful)
    after = _digest(*stateful)
    _local_steps(model, optimizer, 2, seed=99)  # the adopted state trains on alike
    return {"own": own, "after": after, "step": step, "trained": _digest(model, optimizer)}


@pytest.mark.parametrize("optimizer_name", ["sgd-momentum", "adam"])
def test_every_rank_adopts_the_state_of_the_rank_furthest_ahead_bit_for_bit(optimizer_name):
    results = run_ranks(3, _sync_divergent_ranks, optimizer_name, backend="ringreduce")
    assert len({r["own"] for r in results}) == 3, "the ranks' states must differ before"
    # Ranks 1 and 2 are furthest ahead (step 5): the lower, rank 1, is the source.
    assert [r["after"] for r in results] == [results[1]["own"]] * 3
    assert [r["step"] for r in results] == [5] * 3
    assert len({r["trained"] for r in results}) == 1


def _sync_mismatched(rank, world):
    model = _model()
    stateful = {0: (model, _optimizer("adam", model)), 1: (model,), 2: (model, "not state")}[rank]
    with pytest.raises((TypeError, ValueError)) as caught:
        ringreduce.sync_state(1, *stateful)
    return str(caught.value)


def test_ranks_that_pass_unlike_state_all_raise_and_none_waits():
    messages = run_ranks(3, _sync_mismatched, backend="ringreduce", timeout=60)
    assert messages == [messages[0]] * 3, messages
    assert "rank 2: argument 2 after the step is a str" in messages[0]


KILL_STEP, STEPS = 3, 6
DEATH_IN_THE_ALL_GATHER = {
    "RINGREDUCE_ALGORITHM": "ring",
    "RINGREDUCE_SEGMENT_BYTES": str(4 << 20),  # one segment: the kill lands after the whole reduce-scatter
}


def _train_through_a_kill_in_the_all_gather(rank, world, optimizer_name):
    torch.manual_seed(0)
    model = _model()
    ddp = DDP(model)  # one bucket
    optimizer = _optimizer(optimizer_name, model)
    done, at_the_fault = 0, None
    while done < STEPS:
        try:
            if rank == 0 and done == KILL_STEP:
                # Rank 0 dies once it has passed its reduced chunk on: rank 1 cannot finish the bucket's
                # all-reduce, rank 2 can, and steps its optimizer.
                _C._testing.arm_ring_all_gather_kill()
            gen = torch.Generator().manual_seed(done * 10 + dist.get_rank())
            optimizer.zero_grad()
            ddp(torch.randn(8, 16, generator=gen)).square().mean().backward()
            optimizer.step()
            done += 1
        except dist.DistBackendError as error:
            lost = getattr(error, "lost_ranks", None) or ringreduce.lost_ranks()
            at_the_fault = {"done": done, "state": _digest(model, optimizer)}
            ringreduce.shrink(None, lost)
            done = ringreduce.sync_state(done, model, optimizer)
            ddp = DDP(model)
    return {"fault": at_the_fault, "done": done, "state": _digest(model, optimizer), "world": dist.get_world_size()}


@pytest.mark.parametrize("optimizer_name", ["sgd-momentum", "adam"])
def test_a_death_in_the_last_all_gather_leaves_one_state_on_every_survivor(optimizer_name):
    results = run_ranks(3, _train_through_a_kill_in_the_all_gather, optimizer_name, backend="ringreduce",
                        env=DEATH_IN_THE_ALL_GATHER, dying=(0,))
    survivors = results[1:]
    # The death split the survivors: rank 2 finished step KILL_STEP, rank 1 did not.
    assert [s["fault"]["done"] for s in survivors] == [KILL_STEP, KILL_STEP + 1], survivors
    assert survivors[0]["fault"]["state"] != survivors[1]["fault"]["state"]
    assert [(s["done"], s["world"]) for s in survivors] == [(STEPS, 2)] * 2
    assert survivors[0]["state"] == survivors[1]["state"]
