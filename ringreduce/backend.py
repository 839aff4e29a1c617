"""ringreduce as a torch.distributed backend, registered on ``import ringreduce``::

    dist.init_process_group("ringreduce")                  # CPU tensors, and CUDA tensors on NCCL p2p
    dist.init_process_group("cpu:ringreduce,cuda:nccl")    # ringreduce for CPU, torch's NCCL for CUDA

All-reduce (also coalesced), reduce-scatter and all-gather (tensor and list forms), broadcast,
reduce and barrier run on ringreduce's engine; gather, scatter, all-to-all and send/recv go to a
gloo backend on the same store (CUDA tensors: torch's NCCL backend). Every group made with ``new_group`` gets its own.
``RINGREDUCE_ALGORITHM`` (auto, ring, central, one_shot or hierarchical) picks the all-reduce algorithm; auto by
default (see ringreduce.tuning).
"""

import datetime
import os

import torch
import torch.distributed as dist

from ringreduce import _C, _debug
from ringreduce._checks import algorithm_code
from ringreduce._groups import agree_on_auto_table, host_labels, host_summary

NAME = "ringreduce"
# The all-reduce algorithm of every ringreduce backend of the process (auto by default).
ALGORITHM_ENV = "RINGREDUCE_ALGORITHM"


def _create(store, rank, size, timeout):
    """The creator torch calls once per group, on every member, with group-local rank and size."""
    timeout_s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    algorithm = os.environ.get(ALGORITHM_ENV, "auto")
    code = algorithm_code(algorithm)
    fallback = dist.ProcessGroupGloo(dist.PrefixStore("fallback/", store), rank, size,
                                     datetime.timedelta(seconds=timeout_s))
    hosts = host_labels(dist.PrefixStore("hosts/", store), rank, size)
    if len(set(hosts)) == 1:
        cpu = _C.shm_communicator(dist.PrefixStore("shm/", store), rank, size, timeout_s)
        why = "every rank on this host: shared memory"
    else:
        engine_gloo = dist.ProcessGroupGloo(dist.PrefixStore("pg/", store), rank, size,
                                            datetime.timedelta(seconds=timeout_s))
        cpu = _C.pg_communicator(engine_gloo, dist.PrefixStore("pg-notices/", store), timeout_s, hosts)
        why = host_summary(cpu)
    agree_on_auto_table(cpu, dist.PrefixStore("auto-table/", store), rank)
    if algorithm == "hierarchical" and not cpu.has_hierarchy:
        raise ValueError(f"{ALGORITHM_ENV}=hierarchical needs ranks on several hosts with several ranks on some host; "
                         f"this group has {cpu.hosts or 'every rank on one host'}. Unset it, or choose ring, central, "
                         "one_shot or auto")
    _debug.info_once(("backend", id(cpu)),
                     f"backend rank {rank}/{size}: CPU transport {cpu.transport} ({why}), all-reduce {algorithm}; "
                     "gather, scatter, all-to-all and send/recv go to gloo (CUDA tensors: nccl)")

    # CUDA tensors of the delegated ops go to torch's NCCL backend, which makes its communicators
    # only when first used.
    cuda_fallback = (dist.ProcessGroupNCCL(dist.PrefixStore("nccl-fallback/", store), rank, size,
                                           datetime.timedelta(seconds=timeout_s))
                     if torch.cuda.is_available() and dist.is_nccl_available() else None)

    return _C.Backend(store, rank, size, timeout_s, cpu, fallback, cuda_fallback, code, _debug.enabled())


def register() -> None:
    """Registers the backend under "ringreduce" (idempotent)."""
    if not hasattr(dist.Backend, NAME.upper()):
        dist.Backend.register_backend(NAME, _create, extended_api=False, devices=["cpu", "cuda"])
