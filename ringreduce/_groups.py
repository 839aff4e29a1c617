"""Which communicator serves a call: one per (group, transport), created on first use."""

import datetime
import os
import threading

import torch
import torch.distributed as dist

from ringreduce import _C, _debug

# Transports of this build and the devices they serve.
TRANSPORT_DEVICES = {"local": ("cpu",), "pg": ("cpu",)}

_lock = threading.Lock()
_communicators = {}  # (group, transport) -> _C.Communicator
_creations = {}  # group name -> communicators created so far; keeps store prefixes unique


def timeout_seconds(group) -> float:
    """The group's timeout, or RINGREDUCE_TIMEOUT (seconds) when set."""
    override = os.environ.get("RINGREDUCE_TIMEOUT")
    if override:
        try:
            seconds = float(override)
        except ValueError:
            seconds = -1.0
        if seconds <= 0:
            raise ValueError(f"RINGREDUCE_TIMEOUT={override!r} is not a positive number of seconds")
        return seconds
    try:
        timeout = group._get_backend(torch.device("cpu")).options._timeout
    except (RuntimeError, AttributeError):
        timeout = dist.default_pg_timeout
    return timeout.total_seconds()


def _check_transport(name, device_type):
    if name not in TRANSPORT_DEVICES:
        known = ", ".join(sorted(TRANSPORT_DEVICES))
        raise ValueError(f"unknown transport {name!r}; this build has: {known} (or None to choose automatically)")
    if device_type not in TRANSPORT_DEVICES[name]:
        raise ValueError(
            f"transport {name!r} cannot serve a {device_type} tensor; it serves {', '.join(TRANSPORT_DEVICES[name])}. "
            "Pass transport=None to choose automatically."
        )


def _choose_transport(device_type):
    """Automatic choice for a torch.distributed group: (transport, reason)."""
    if device_type == "cpu":
        return "pg", "CPU tensor: point-to-point over a private gloo group"
    raise ValueError(f"ringreduce has no transport for {device_type} tensors in this build (see ringreduce.build_info())")


def _group_store(group):
    entry = dist.distributed_c10d._world.pg_map.get(group)
    return entry[1] if entry is not None else group.get_group_store()


def _create(group, transport, timeout_s):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    count = _creations.get(group.group_name, 0)
    _creations[group.group_name] = count + 1
    prefix = f"ringreduce/{group.group_name}/{count}/{transport}/"
    store = dist.PrefixStore(prefix, _group_store(group))
    # A private gloo group: ring messages never interleave with the user's own collectives.
    backend = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=timeout_s))
    return _C.pg_communicator(backend, timeout_s)


def communicator(group, tensor, transport, algorithm):
    """The communicator for this call, created (collectively) on first use."""
    from ringreduce.local import LocalGroup

    device_type = tensor.device.type
    if isinstance(group, LocalGroup):
        comm = group.communicator(device_type, transport)
        _debug.info_once((comm, algorithm), f"LocalWorld rank {comm.rank}/{comm.size}: algorithm {algorithm}, transport local")
        return comm
    if transport == "local":
        raise ValueError("transport 'local' runs ranks as threads of one process: pass a ringreduce.LocalWorld group")
    if group is None:
        if not dist.is_initialized():
            raise RuntimeError(
                "ringreduce.all_reduce with group=None needs torch.distributed.init_process_group() first "
                "(or torchrun); for ranks as threads of one process use ringreduce.LocalWorld"
            )
        group = dist.group.WORLD
    if transport is None:
        transport, reason = _choose_transport(device_type)
    else:
        _check_transport(transport, device_type)
        reason = "requested"
    key = (group, transport)
    comm = _communicators.get(key)
    if comm is None:
        with _lock:
            comm = _communicators.get(key)
            if comm is None:
                comm = _create(group, transport, timeout_seconds(group))
                _communicators[key] = comm
    _debug.info_once(
        (key, algorithm),
        f"group {group.group_name!r} rank {comm.rank}/{comm.size}: algorithm {algorithm}, "
        f"transport {transport} ({reason})",
    )
    return comm


def destroy(group=None) -> None:
    """Drop the communicators of `group` (all groups when None); later calls create new ones."""
    with _lock:
        for key in [k for k in _communicators if group is None or k[0] is group]:
            del _communicators[key]
