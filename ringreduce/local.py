"""`local`: N ranks as N threads of one process, for fast and deterministic runs of the algorithms."""

import datetime

import torch
import torch.distributed as dist

from ringreduce import _C
from ringreduce._groups import CommunicatorSource
from ringreduce.collectives import all_reduce

# Long enough for a 1 GiB reduction on a loaded machine, short enough that a bug fails a test.
DEFAULT_LOCAL_TIMEOUT = datetime.timedelta(minutes=5)


class LocalGroup(CommunicatorSource):
    """One rank of a LocalWorld; pass it as ``group=`` from that rank's thread.

    It holds its rank's communicator, not the world: a world and its groups form no reference
    cycle, so a dropped world ends when its last reference goes, never later inside the garbage
    collector, which may run in the middle of another world's call (ending a GPU communicator
    waits for the device, and so for that call: a deadlock)."""

    def __init__(self, world, rank, communicator):
        self._rank = rank
        self._size = world.size
        self._transport = world.transport
        self._device = world.device
        self._tensor_device = world.tensor_device
        self._communicator = communicator

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def communicator(self, device, transport):
        if transport not in (None, self._transport):
            raise ValueError(f"a LocalWorld group uses transport {self._transport!r}, not {transport!r}")
        if device != self._tensor_device:
            raise ValueError(f"this LocalWorld holds {self._device} ranks, which take {self._tensor_device} "
                             f"tensors; got a tensor on {device}")
        return self._communicator

    def __repr__(self):
        return f"LocalGroup(rank={self._rank}, size={self._size})"


class LocalWorld:
    """``world_size`` ranks that are threads of this process, exchanging through memory.

    With ``device="cuda"`` they are virtual ranks on one GPU, each with a stream of its own: the
    whole ring (kernels, events) runs with several ranks on a single GPU, which NCCL refuses.

    With ``device="sim"`` rank r runs on simulated GPU r (csrc/cuda/sim_device.h): the GPU path's
    own code (streams, events, kernels' bodies; with ``transport="nccl"`` the nccl transport, its
    device header check and watchdog) runs on host threads, and the tensors are CPU tensors.

    Each rank has its own engine worker, so one thread can drive every rank with ``async_op``::

        world = ringreduce.LocalWorld(4)
        world.all_reduce([t0, t1, t2, t3])      # every rank at once
        ringreduce.all_reduce(t, group=world.group(2))   # or rank 2, from its own thread
    """

    def __init__(self, world_size: int, timeout: datetime.timedelta = DEFAULT_LOCAL_TIMEOUT, device="cpu",
                 transport="local"):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if transport not in ("local", "nccl"):
            raise ValueError(f"a LocalWorld's transport is 'local' or 'nccl' (on device='sim'), not {transport!r}")
        simulated = device == "sim"
        if not simulated:
            device = torch.device(device)
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            if device.type not in ("cpu", "cuda"):
                raise ValueError(f"a LocalWorld holds cpu, cuda or sim ranks, not {device}")
        if transport == "nccl" and not simulated:
            raise ValueError("transport 'nccl' in a LocalWorld needs device='sim': NCCL refuses several ranks on one GPU")
        self.size = world_size
        self.device = device
        self.transport = transport
        self.tensor_device = torch.device("cpu") if simulated else device
        if simulated:
            kind, index = ("sim_nccl" if transport == "nccl" else "sim"), -1
        else:
            kind, index = device.type, (device.index if device.type == "cuda" else -1)
        self._communicators = _C.local_world(world_size, timeout.total_seconds(), kind, index)
        self.groups = [LocalGroup(self, rank, communicator) for rank, communicator in enumerate(self._communicators)]

    def group(self, rank: int) -> LocalGroup:
        return self.groups[rank]

    def all_reduce(self, tensors, op=dist.ReduceOp.SUM, algorithm="ring", **kwargs) -> None:
        """Run one all-reduce on every rank at once: ``tensors[r]`` is rank r's tensor (or array)."""
        if len(tensors) != self.size:
            raise ValueError(f"expected {self.size} tensors (one per rank), got {len(tensors)}")
        works = [
            all_reduce(t, op, group=g, async_op=True, algorithm=algorithm, **kwargs) for t, g in zip(tensors, self.groups)
        ]
        errors = []
        for work in works:
            try:
                work.wait()
            except Exception as error:  # noqa: BLE001 - every rank is waited for before reporting
                errors.append(error)
        if errors:
            raise errors[0]
