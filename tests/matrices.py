"""What every transport and algorithm must pass, in one place: a new transport or algorithm added
here gets the ragged-size and callback tests (test_ragged.py, test_callbacks.py) for free."""

import torch

import ringreduce

# Transports whose ranks are processes (test_processes.py and the like run them through run_ranks).
PROCESS_TRANSPORTS = ("shm", "pg")


def _all_reduce(algorithm):
    return lambda numel, world, **where: ringreduce.all_reduce(torch.ones(numel), algorithm=algorithm, **where)


# Every collective, as one call of `numel` elements per rank: name -> call(numel, world, **where),
# where `where` is group=, transport= and async_op= as the caller needs.
COLLECTIVES = {
    "all_reduce ring": _all_reduce("ring"),
    "all_reduce central": _all_reduce("central"),
    "all_reduce one_shot": _all_reduce("one_shot"),
    "all_reduce doubling": _all_reduce("doubling"),
    "all_reduce auto": _all_reduce("auto"),
    "reduce_scatter": lambda numel, world, **where: ringreduce.reduce_scatter_tensor(
        torch.empty(numel), torch.ones(numel * world), **where),
    "all_gather": lambda numel, world, **where: ringreduce.all_gather_into_tensor(
        torch.empty(numel * world), torch.ones(numel), **where),
    "broadcast": lambda numel, world, **where: ringreduce.broadcast(torch.ones(numel), src=0, **where),
    "reduce": lambda numel, world, **where: ringreduce.reduce(torch.ones(numel), dst=0, **where),
}

# Per-rank sizes that disagree, at 3 and 4 ranks: one rank off; and sizes that agree with each
# rank's ring neighbours on one side but not with the root (rank 0), which only a check against
# every peer catches in the collectives where some ranks only send.
RAGGED_SIZES = {
    "one rank off": lambda world: [1000] * (world - 1) + [999],
    "neighbours agree, root differs": lambda world: ([1000, 2000, 2000, 1000] if world == 4 else [1000, 2000, 2000]),
}
