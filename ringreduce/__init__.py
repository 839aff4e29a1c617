"""ringreduce: ring and central all-reduce for PyTorch, with a C++/CUDA engine.

    import ringreduce
    ringreduce.all_reduce(tensor)                      # like torch.distributed.all_reduce
    ringreduce.all_reduce(tensor, algorithm="central")  # the parameter-server baseline
"""

import os

import torch  # loads libtorch before the extension

from ringreduce import _install

if (_why := _install.problem(os.path.dirname(__file__), torch.__version__)) is not None:
    raise ImportError(f"ringreduce: {_why}")

from ringreduce import backend, hooks, ps, tuning
from ringreduce._C import CommTimeoutError, MismatchError
from ringreduce._errors import RanksLostError
from ringreduce.collectives import (all_gather_into_tensor, all_reduce, broadcast, destroy, reduce,
                                    reduce_scatter_tensor)
from ringreduce.elastic import lost_ranks, shrink, sync_state
from ringreduce.info import build_info
from ringreduce.local import LocalGroup, LocalWorld
from ringreduce.local_sgd import LocalSGD, average_parameters

__version__ = build_info()["version"]
backend.register()  # init_process_group("ringreduce")
tuning.load()  # the table behind algorithm="auto"

__all__ = [
    "CommTimeoutError",
    "LocalGroup",
    "LocalSGD",
    "LocalWorld",
    "MismatchError",
    "RanksLostError",
    "all_gather_into_tensor",
    "all_reduce",
    "average_parameters",
    "backend",
    "broadcast",
    "build_info",
    "destroy",
    "hooks",
    "lost_ranks",
    "ps",
    "reduce",
    "reduce_scatter_tensor",
    "shrink",
    "sync_state",
    "tuning",
]
