"""ringreduce as a torch.distributed backend, registered on ``import ringreduce``::

    dist.init_process_group("ringreduce")                  # CPU tensors, and CUDA tensors on NCCL p2p
    dist.init_process_group("cpu:ringreduce,cuda:nccl")    # ringreduce for CPU, torch's NCCL for CUDA

All-reduce (also coalesced), reduce-scatter and all-gather (tensor and list forms), broadcast,
reduce and barrier run on ringreduce's engine; gather, scatter, all-to-all and send/recv go to a
gloo backend on the same store (CUDA tensors: torch's NCCL backend). Every group made with ``new_group`` gets its own.
``RINGREDUCE_ALGORITHM`` (auto, ring, central, one_shot, hierarchical, doubling or halving_doubling) picks the all-reduce algorithm; auto by
default (see ringreduce.tuning). ``RINGREDUCE_COMPRESS`` (bf16, fp16 or int8; none by default) sends float32 SUM and AVG
all-reduces and reduce-scatters between hosts compressed (docs/compression.md); every rank must set the same.

When ranks die, every survivor raises ringreduce.RanksLostError naming them, and
``dist.shrink_group(lost)`` gives the survivors a group of their own (see docs/elastic.md).
"""

import datetime
import os
import signal
import threading

import torch
import torch.distributed as dist

from ringreduce import _C, _debug
from ringreduce._checks import algorithm_code, compression_code
from ringreduce._errors import RanksLostError
from ringreduce._groups import (agree_on_auto_table, gloo_group, host_identity, host_labels, host_summary,
                                probe_address)

NAME = "ringreduce"
# The all-reduce algorithm of every ringreduce backend of the process (auto by default).
ALGORITHM_ENV = "RINGREDUCE_ALGORITHM"
# The 16-bit format of float32 SUM and AVG all-reduces and reduce-scatters between hosts (none by default).
COMPRESS_ENV = "RINGREDUCE_COMPRESS"
# The devices whose tensors a group of the backend serves (a shrunk group too: ringreduce.elastic).
DEVICES = ("cpu", "cuda")


# How long the survivors of a shrink may take to build the shrunk group once all have met (store
# waits and gloo's connections; well under a second here, 4 ranks on 2 cores): a death inside the
# build shows as a wait that ends here, not in the group's timeout.
SHRINK_BUILD_TIMEOUT_S = 10.0
# How often a shrink looks at the group's pulses while the shrunk group is built: a store read per
# look, against deaths found within about 0.5-1.5 s.
SHRINK_WATCH_POLL_S = 0.05
# Test-only: the point of a shrink at which this process kills itself ("built": after its build,
# before the survivors' vote; "voted": after a vote that committed). The tests use it to land a death between the build and the commit.
TESTING_DIE_IN_SHRINK_ENV = "RINGREDUCE_TESTING_DIE_IN_SHRINK"


def _create(store, rank, size, timeout, build_timeout_s=None):
    """The creator torch calls once per group, on every member, with group-local rank and size.
    `build_timeout_s` bounds the waits for the other ranks while building (default: the timeout)."""
    timeout_s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    build_s = min(timeout_s, build_timeout_s or timeout_s)
    algorithm = os.environ.get(ALGORITHM_ENV, "auto")
    code = algorithm_code(algorithm)
    compression = _compression(algorithm)
    fallback = gloo_group(dist.PrefixStore("fallback/", store), rank, size, timeout_s, build_s)
    hosts = host_labels(dist.PrefixStore("hosts/", store), rank, size)
    if len(set(hosts)) == 1:
        cpu = _C.shm_communicator(dist.PrefixStore("shm/", store), rank, size, timeout_s)
        why = "every rank on this host: shared memory"
    else:
        engine_gloo = gloo_group(dist.PrefixStore("pg/", store), rank, size, timeout_s, build_s)
        cpu = _C.pg_communicator(engine_gloo, dist.PrefixStore("pg-notices/", store), timeout_s, hosts)
        why = host_summary(cpu)
    agree_on_auto_table(cpu, dist.PrefixStore("auto-table/", store), rank)
    if algorithm == "hierarchical" and not cpu.has_hierarchy:
        raise ValueError(f"{ALGORITHM_ENV}=hierarchical needs ranks on several hosts with several ranks on some host; "
                         f"this group has {cpu.hosts or 'every rank on one host'}. Unset it, or choose ring, central, "
                         "one_shot, doubling, halving_doubling or auto")
    _debug.info_once(("backend", id(cpu)),
                     f"backend rank {rank}/{size}: CPU transport {cpu.transport} ({why}), all-reduce {algorithm}"
                     f"{f', {COMPRESS_ENV}={os.environ[COMPRESS_ENV]}' if compression else ''}; "
                     "gather, scatter, all-to-all and send/recv go to gloo (CUDA tensors: nccl)")

    # CUDA tensors of the delegated ops go to torch's NCCL backend, which makes its communicators
    # only when first used.
    cuda_fallback = (dist.ProcessGroupNCCL(dist.PrefixStore("nccl-fallback/", store), rank, size,
                                           datetime.timedelta(seconds=timeout_s))
                     if torch.cuda.is_available() and dist.is_nccl_available() else None)

    members = dist.PrefixStore("membership/", store)
    membership = _C.Membership(dist.PrefixStore("membership/", store.clone()), members, rank, size, host_identity(),
                               probe_address(store), timeout_s)
    return _C.Backend(store, rank, size, timeout_s, cpu, fallback, cuda_fallback, code, _debug.enabled(), membership,
                      compression)


def _compression(algorithm):
    """The engine code of RINGREDUCE_COMPRESS, checked against the algorithm."""
    compress = os.environ.get(COMPRESS_ENV, "").lower() or None
    try:
        code = compression_code(compress)
    except ValueError:
        raise ValueError(f"{COMPRESS_ENV}={os.environ[COMPRESS_ENV]!r} is not a compression; set bf16, fp16, int8 or none, "
                         "or unset it") from None
    if code and algorithm not in ("auto", "hierarchical"):
        raise ValueError(f"{COMPRESS_ENV}={compress} compresses the hierarchical all-reduce's link between hosts; "
                         f"{ALGORITHM_ENV}={algorithm} never crosses compressed. Unset one of them")
    return code


def _shrink(backend, excluded, flags):
    """The survivors' half of torch.distributed.shrink_group (called by the backend's C++ shrink on
    every survivor): once all have met, each builds the shrunk group's backend under keys of the
    round they met in. The new ranks keep the survivors' order, as torch numbers a shrunk group."""
    del flags  # the old group is broken already: nothing of it is left to abort or to finish
    round_, attempt = backend.membership.roll_call(excluded)
    survivors = [r for r in range(backend.size()) if r not in excluded]
    rank = survivors.index(backend.rank())
    _debug.info_once(("shrink", id(backend), round_),
                     f"backend rank {backend.rank()}/{backend.size()}: shrinking without {excluded}; "
                     f"rank {rank}/{len(survivors)} of the shrunk group")
    store = dist.PrefixStore(f"shrunk/{round_}.{attempt}/", backend.store.clone())
    store.set_timeout(datetime.timedelta(seconds=SHRINK_BUILD_TIMEOUT_S))
    built = {}

    def build():
        try:
            built["backend"] = _create(store, rank, len(survivors), datetime.timedelta(seconds=backend.timeout_s),
                                       build_timeout_s=SHRINK_BUILD_TIMEOUT_S)
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            built["error"] = error

    # The build waits for every survivor; a survivor that dies meanwhile is found by the group's pulses,
    # and the build, left to end on its own, is dropped.
    builder = threading.Thread(target=build, name="ringreduce-shrink-build", daemon=True)
    builder.start()
    while builder.is_alive():
        builder.join(SHRINK_WATCH_POLL_S)
        if builder.is_alive() and backend.membership.poll_loss() != list(excluded):
            break
    _testing_stop_point("built")
    # Every survivor uses the shrunk group, or none does: a death during the build or the vote
    # leaves all of them retrying on the old group.
    if not backend.membership.decide_shrink(round_, attempt, list(excluded), "backend" in built):
        lost = backend.membership.agree_on_loss()
        if lost != list(excluded):
            raise _lost_while_building(backend, lost) from built.get("error")
        if "error" in built:
            raise built["error"]
        raise RuntimeError(f"ringreduce: rank {backend.rank()}: another survivor could not build the shrunk group "
                           f"without {excluded}; nothing changed, call shrink_group({excluded}) again")
    _testing_stop_point("voted")
    store.set_timeout(datetime.timedelta(seconds=backend.timeout_s))  # later waits (NCCL made on first use)
    return built["backend"]


def _testing_stop_point(point):
    """Test-only: SIGKILLs this process at `point` of a shrink when RINGREDUCE_TESTING_DIE_IN_SHRINK names
    it, so that a test can kill a survivor between its build and the vote."""
    if os.environ.get(TESTING_DIE_IN_SHRINK_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _lost_while_building(backend, lost):
    return RanksLostError(f"ringreduce: rank {backend.rank()}: the group lost ranks {lost} while the survivors built "
                          f"the shrunk group; call shrink_group({lost}) again", lost)


def register() -> None:
    """Registers the backend under "ringreduce" (idempotent)."""
    if not hasattr(dist.Backend, NAME.upper()):
        dist.Backend.register_backend(NAME, _create, extended_api=False, devices=list(DEVICES))
