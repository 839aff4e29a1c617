"""Which communicator serves a call: one per (group, transport), created collectively on first use."""

import abc
import datetime
import json
import os
import socket
import threading

import torch
import torch.distributed as dist

from ringreduce import _C, _debug

# Transports and the devices they serve (nccl and GPU `local` ranks only in a CUDA build). "sim" is
# the nccl transport on the simulated device, which serves CPU tensors (csrc/cuda/sim_device.h).
_CUDA_BUILT = _C.build_info()["cuda"]
TRANSPORT_DEVICES = {"local": ("cpu", "cuda") if _CUDA_BUILT else ("cpu",), "pg": ("cpu",), "shm": ("cpu",)}
if _C.build_info()["sim"]:
    TRANSPORT_DEVICES["sim"] = ("cpu",)
if _CUDA_BUILT:
    TRANSPORT_DEVICES["nccl"] = ("cuda",)

class CommunicatorSource(abc.ABC):
    """A group that holds its own communicators (a LocalWorld rank) instead of a torch group."""

    @abc.abstractmethod
    def communicator(self, device, transport):
        """The communicator for tensors on `device`; raises ValueError for a transport it cannot serve."""


_lock = threading.Lock()
_world = dist.distributed_c10d._world
_states = {}  # torch group -> _GroupState


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


# Names this process's host in place of its host name: processes of one machine under different
# names are taken for different hosts (they then talk through gloo, never through shared memory).
# The tests lay out several "hosts" on one machine with it; two machines never pass for one, as the
# identity keeps the boot id.
HOST_NAME_ENV = "RINGREDUCE_HOST_NAME"


def probe_address(store) -> str:
    """The address the group's other hosts reach this process by: the one this host sends from
    towards the group's TCPStore (no packet is sent; the kernel picks the route). Empty for a store
    of another kind (its ranks on other hosts are then lost by silence only: docs/elastic.md)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return ""
    family, _, _, _, where = socket.getaddrinfo(store.host, store.port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as towards:
        towards.connect(where)
        return towards.getsockname()[0]


def gloo_group(store, rank, size, timeout_s, build_s):
    """A gloo backend whose connecting waits at most `build_s`, and whose calls then get `timeout_s`.
    Its pairs all connect here (two store requests per peer and rank, N² in all: gloo's own rendezvous):
    connected lazily, a pair to a rank that died before its first use would hold an op past the loss
    that should end it."""
    gloo = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=build_s))
    gloo._set_default_timeout(datetime.timedelta(seconds=timeout_s))
    return gloo


def host_identity() -> str:
    """Equal for two processes exactly when they can share memory through /dev/shm: one kernel (the host
    name and the boot id) and one /dev/shm filesystem (its device number, which NCCL's shared-memory
    transport also requires). Containers with host networking (Kubernetes' hostNetwork) share the host
    name and the boot id, but each has a /dev/shm of its own unless they share it (--ipc=host, a bind
    mount); POSIX shared memory is files there, so the filesystem decides, not the IPC namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:
        boot_id = "unknown-boot"
    try:
        shm = f"shm-device-{os.stat('/dev/shm').st_dev}"
    except OSError:
        shm = "no-dev-shm"
    return f"{os.environ.get(HOST_NAME_ENV) or socket.gethostname()}/{boot_id}/{shm}"


def host_labels(store, rank, size) -> list:
    """Each rank's host as a small integer (hosts numbered by their lowest rank), agreed through
    `store` (collective, a few store requests per rank whatever the size)."""
    identities = _C.gather_values(store, rank, size, host_identity())
    _say_where_one_machine_is_several_hosts(identities, rank)
    numbers = {}
    return [numbers.setdefault(identity, len(numbers)) for identity in identities]


def _say_where_one_machine_is_several_hosts(identities, rank) -> None:
    """RINGREDUCE_DEBUG=INFO: ranks of one machine (host name and boot id) that see different /dev/shm
    filesystems (containers that do not share it) are different hosts, joined through torch's engine."""
    machines = {}
    for r, identity in enumerate(identities):
        machine, _, shm = identity.rpartition("/")
        machines.setdefault(machine, {}).setdefault(shm, []).append(r)
    for machine, filesystems in machines.items():
        if len(filesystems) > 1:
            split = "; ".join(f"ranks {ranks} see {shm}" for shm, ranks in filesystems.items())
            _debug.info_once(("one machine, several /dev/shm", machine, tuple(identities)),
                             f"rank {rank}: ranks on machine {machine.split('/')[0]} do not share /dev/shm ({split}):"
                             f" each /dev/shm is a host of its own, and no shared memory is used between them")


def agree_on_auto_table(comm, store, rank) -> None:
    """Every rank of a new communicator follows rank 0's auto table (collective, before its first
    call). Tables differ between hosts (a tuning file on some), and ranks that chose by different
    lines would make different calls."""
    mine = json.loads(json.dumps(comm.auto_table))  # lists, as the store gives them back
    if rank == 0:
        store.set("auto-table", json.dumps(mine))
    agreed = json.loads(store.get("auto-table"))
    if agreed != mine:
        comm.adopt_auto_table(agreed["lines"], f"rank 0's table ({agreed['source']})")
        _debug.info_once(("auto-table", id(comm)), f"rank {rank}: this rank's auto table ({mine['source']}) differs "
                                                   f"from rank 0's ({agreed['source']}); the group follows rank 0's")


def host_summary(comm) -> str:
    """What a communicator over several hosts runs where, for RINGREDUCE_DEBUG=INFO."""
    if not comm.has_hierarchy:
        runs = "all-reduce flat (one rank per host)"
    elif comm.has_chunked_hierarchy:
        runs = "all-reduce hierarchical or flat, reduce-scatter and all-gather hierarchical"
    else:
        runs = ("all-reduce hierarchical or flat, reduce-scatter and all-gather flat (on these hosts, hierarchical "
                "ones would move no fewer bytes)")
    return f"{comm.hosts}: shared memory inside each host, gloo across; {runs}"


class _GroupState:
    """ringreduce's state for one torch.distributed group: its communicators and store prefixes."""

    _creations = {}  # group name -> store prefixes handed out, so a re-created group gets fresh keys

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.communicators = {}
        # Held while this group's communicators are made (collective): per group, so two threads
        # that make two groups' first calls never wait for each other across ranks.
        self.building = threading.Lock()
        self._hosts = None
        entry = dist.distributed_c10d._world.pg_map.get(group)
        self._store = entry[1] if entry is not None else group.get_group_store()

    def fresh_store(self, purpose):
        """A store under a prefix no earlier ringreduce use of this group has taken (collective)."""
        count = self._creations.get(self.group.group_name, 0)
        self._creations[self.group.group_name] = count + 1
        return dist.PrefixStore(f"ringreduce/{self.group.group_name}/{count}/{purpose}/", self._store)

    def hosts(self) -> list:
        """Each rank's host (host_labels), agreed through the group's store (collective, once)."""
        if self._hosts is None:
            self._hosts = host_labels(self.fresh_store("hosts"), self.rank, self.size)
        return self._hosts

    def single_host(self) -> bool:
        """Whether every rank runs on this host (collective, once)."""
        return len(set(self.hosts())) == 1

    def create(self, transport, device, timeout_s):
        comm = self._create(transport, device, timeout_s)
        self._follow_membership(comm)
        agree_on_auto_table(comm, self.fresh_store("auto-table"), self.rank)
        return comm

    def _follow_membership(self, comm):
        """On a group of the ringreduce backend, the package's calls name lost ranks as the backend's
        own do (RanksLostError), and a loss ends their waits; on any other group, a failure says what
        to do instead (docs/elastic.md)."""
        backend = ringreduce_backend(self.group)
        if backend is not None:
            backend.watch(comm)
            return
        name = dist.get_backend(self.group)
        if "ringreduce" in name:  # wrapped by torch (TORCH_DISTRIBUTED_DEBUG=DETAIL): its membership is out of reach
            return
        comm.advise_on_failure(
            f"group {self.group.group_name!r} is on torch's {name} backend, which keeps no membership: no rank can be "
            "named lost, and the group cannot shrink. To go on without the ranks a failure leaves behind, make the "
            "group with init_process_group(\"ringreduce\") (or new_group(backend=\"ringreduce\")); see "
            "docs/elastic.md")

    def _create(self, transport, device, timeout_s):
        store = self.fresh_store(transport)
        if transport == "nccl":
            return _C.nccl_communicator(store, self.rank, self.size, device.index, timeout_s)
        if transport == "sim":
            if not self.single_host():
                raise ValueError("transport 'sim' (the simulated device) needs every rank of the group on one host")
            return _C.sim_communicator(store, self.rank, self.size, timeout_s)
        if transport == "shm":
            if not self.single_host():
                raise ValueError("transport 'shm' needs every rank of the group on one host; use 'pg' or None")
            return _C.shm_communicator(store, self.rank, self.size, timeout_s)
        # A private gloo group: ring messages never interleave with the user's own collectives.
        backend = gloo_group(store, self.rank, self.size, timeout_s, timeout_s)
        return _C.pg_communicator(backend, store, timeout_s, self.hosts())

    def choose(self, device_type):
        """Automatic transport choice: (name, reason)."""
        if device_type == "cuda" and _CUDA_BUILT:
            return "nccl", "CUDA tensor: NCCL point-to-point on a communicator of ringreduce's own"
        if device_type != "cpu":
            raise ValueError(
                f"ringreduce has no transport for {device_type} tensors in this build "
                f"(build_info()['cuda'] is {_CUDA_BUILT}); move the tensor to the CPU or build with CUDA"
            )
        if self.single_host():
            return "shm", "CPU tensor, every rank on this host: shared memory"
        return "pg", "CPU tensor, ranks on several hosts"


def ringreduce_backend(group):
    """The ringreduce backend serving `group`'s CPU tensors, where it keeps a membership; else None."""
    try:
        backend = group._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, _C.Backend) and backend.membership is not None else None


def _check_transport(name, device_type):
    if name not in TRANSPORT_DEVICES:
        known = ", ".join(sorted(TRANSPORT_DEVICES))
        raise ValueError(f"unknown transport {name!r}; this build has: {known} (or None to choose automatically)")
    if device_type not in TRANSPORT_DEVICES[name]:
        raise ValueError(
            f"transport {name!r} cannot serve a {device_type} tensor; it serves {', '.join(TRANSPORT_DEVICES[name])}. "
            "Pass transport=None to choose automatically."
        )


# (group, transport, device type) -> communicator: the per-call fast path. A CommunicatorSource
# (a LocalWorld rank) holds its own communicators and is never kept here, so a LocalWorld and its
# threads go when its user drops it.
_resolved = {}
# (id of a communicator, algorithm) pairs already logged under RINGREDUCE_DEBUG=INFO.
_logged = set()
# all_reduce calls whose arguments passed every check once, for its fast path (torch groups only).
checked_calls = _C.CheckedCalls()


def communicator(group, tensor, transport, algorithm):
    """The communicator for this call, created (collectively) on first use."""
    if group is None:
        group = _world.default_pg  # None before init_process_group: _resolve says what to do
    if isinstance(group, CommunicatorSource):
        # A tensor off the GPU goes to the CPU communicator, which names what else is wrong with it (meta).
        comm = group.communicator(tensor.device if tensor.is_cuda else torch.device("cpu"), transport)
    else:
        key = (group, transport, tensor.get_device())  # -1 on the CPU, the GPU's index on CUDA
        comm = _resolved.get(key)
        if comm is None:
            comm = _resolved[key] = _resolve(group, tensor.device, transport)
    if (id(comm), algorithm) not in _logged:
        _logged.add((id(comm), algorithm))
        _debug.info_once((id(comm), algorithm), f"rank {comm.rank}/{comm.size}: algorithm {algorithm}, "
                                                f"transport {comm.transport}")
    return comm


def _resolve(group, device, transport):
    device_type = device.type
    if isinstance(group, CommunicatorSource):
        return group.communicator(device, transport)
    if transport == "local":
        raise ValueError("transport 'local' runs ranks as threads of one process: pass a ringreduce.LocalWorld group")
    if transport is not None:
        _check_transport(transport, device_type)
    if group is None:
        raise RuntimeError(
            "ringreduce.all_reduce with group=None needs torch.distributed.init_process_group() first "
            "(or torchrun); for ranks as threads of one process use ringreduce.LocalWorld"
        )
    with _lock:
        state = _state_of(group)
    # Not under _lock: making a communicator waits for the other ranks, and a thread of theirs may
    # be making another group's first (a rank whose threads took _lock in the other order waited
    # for it forever).
    with state.building:
        name, reason = state.choose(device_type) if transport is None else (transport, "requested")
        comm = state.communicators.get((name, device))
        if comm is None:
            comm = state.communicators[(name, device)] = state.create(name, device, timeout_seconds(group))
            _debug.info_once(
                (id(comm), "transport"),
                f"group {group.group_name!r} rank {comm.rank}/{comm.size}: transport {name} ({reason})"
                + (f"; {host_summary(comm)}" if comm.hosts else ""),
            )
    return comm


def _state_of(group):
    state = _states.get(group)
    if state is None:
        state = _states[group] = _GroupState(group)
    return state


def default_group():
    """The default group, or None before init_process_group()."""
    return _world.default_pg


def group_state(group):
    """ringreduce's state for a torch group (WORLD when None), made on first use."""
    if group is None:
        group = _world.default_pg
        if group is None:
            raise RuntimeError("ringreduce needs torch.distributed.init_process_group() first (or torchrun)")
    with _lock:
        return _state_of(group)


def destroy(group=None) -> None:
    """Drop the communicators of `group` (all groups when None); later calls create new ones."""
    with _lock:
        for key in [g for g in _states if group is None or g is group]:
            del _states[key]
        for key in [k for k in _resolved if group is None or k[0] is group]:
            del _resolved[key]
        checked_calls.forget(group)
        _logged.clear()
