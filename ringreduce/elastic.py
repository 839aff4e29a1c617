"""Survivors that go on: the lost ranks of a group, a group without them, and one training state.

    try:
        train_step()
    except ringreduce.RanksLostError as lost:       # every survivor, the same lost_ranks
        group = ringreduce.shrink(group, lost.lost_ranks)
        step = ringreduce.sync_state(step, model, optimizer, group=group)

``shrink`` is ``torch.distributed.shrink_group`` on a group of the ringreduce backend, with its
checks made first; ``sync_state`` gives every survivor the state of the one furthest ahead. See
docs/elastic.md.
"""

import operator
from typing import NamedTuple

import torch
import torch.distributed as dist

from ringreduce import _C
from ringreduce._groups import ringreduce_backend
from ringreduce.backend import DEVICES
from ringreduce.collectives import destroy


def _backend_of(group):
    group = group or dist.distributed_c10d._get_default_group()
    backend = ringreduce_backend(group)
    if backend is None:
        raise TypeError(
            f"group {group.group_name!r} is not on the ringreduce backend, so ringreduce cannot shrink it (torch's gloo "
            "backend cannot shrink at all). Make the group with init_process_group(\"ringreduce\") or "
            "new_group(backend=\"ringreduce\")"
        )
    return group, backend


def _refuse_mixed_devices(group):
    """Refuses, before anything changes, to shrink a group that runs ringreduce on one device and another
    backend on the other ("cpu:ringreduce,cuda:nccl"): only ringreduce's side could shrink, and the
    shrunk group would have no backend left for the other device's tensors."""
    config = dist.distributed_c10d._world.pg_backend_config.get(group, "")
    backends = dict(entry.split(":", 1) for entry in config.split(",") if ":" in entry)
    others = {device: name for device, name in backends.items() if name != "ringreduce"}
    if "ringreduce" in backends.values() and others:
        device, name = sorted(others.items())[0]
        raise TypeError(
            f"group {group.group_name!r} runs {device} tensors on torch's {name} backend ({config}), which cannot be "
            "shrunk with ringreduce's side; nothing changed. To shrink a group, make it with "
            "init_process_group(\"ringreduce\") (or new_group(backend=\"ringreduce\")): ringreduce then serves "
            "CUDA tensors too, over NCCL point-to-point, and the shrunk group serves both devices"
        )


def _exclude_by_global_rank(finalize):
    """torch 2.14's shrink_group builds the shrunk group's rank map by removing the excluded *group* ranks
    from the group's *global* ranks: for new_group([1, 2, 3]) losing its group rank 0 it keeps all
    three global ranks over a 2-rank backend, so get_rank() and src=/dst= name the wrong ranks. The
    group ranks are turned into the global ranks they stand for before torch's step runs."""

    def finalize_shrunk_group(group_info, excluded_group_ranks, new_backend):
        global_ranks = dist.get_process_group_ranks(group_info["process_group"])
        return finalize(group_info, {global_ranks[r] for r in excluded_group_ranks}, new_backend)

    finalize_shrunk_group.repairs = finalize
    return finalize_shrunk_group


def _checking_devices(validate):
    """torch 2.14's shrink_group shrinks the backend of one device (the bound one, else the GPU when
    there is one, else the CPU): on a GPU host, a "cpu:ringreduce,cuda:nccl" group would have its
    NCCL side shrunk and registered for the CPU. Such groups are refused first (_refuse_mixed_devices)."""

    def validate_shrink_backend_requirements(group_info):
        _refuse_mixed_devices(group_info["process_group"])
        return validate(group_info)

    validate_shrink_backend_requirements.repairs = validate
    return validate_shrink_backend_requirements


def _on_every_device(create):
    """torch 2.14 registers a shrunk group's backend for one device only (the bound one, else the
    CPU), so after a shrink a ringreduce group's CUDA tensors (or, with a bound GPU, its CPU tensors)
    would find no backend. ringreduce's shrunk backend is registered for both, as the group's was."""

    def create_shrunk_process_group(new_backend, remaining_ranks, metadata, is_default_group):
        group = create(new_backend, remaining_ranks, metadata, is_default_group)
        if isinstance(new_backend, _C.Backend):
            custom = dist.ProcessGroup.BackendType.CUSTOM  # what init_process_group("ringreduce") registers
            for device in DEVICES:
                group._register_backend(torch.device(device), custom, new_backend)
            group._set_default_backend(custom)
        return group

    create_shrunk_process_group.repairs = create
    return create_shrunk_process_group


def _repair_torch_shrink() -> None:
    """Installs the repairs above on the torch releases that need them (2.14, whose source was read), once."""
    c10d = dist.distributed_c10d
    repairs = {"_finalize_shrunk_group": _exclude_by_global_rank,
               "_validate_shrink_backend_requirements": _checking_devices,
               "_create_shrunk_process_group": _on_every_device}
    if not torch.__version__.startswith("2.14."):
        return
    for name, repair in repairs.items():
        step = getattr(c10d, name, None)
        if step is not None and not hasattr(step, "repairs"):
            setattr(c10d, name, repair(step))


_repair_torch_shrink()


def lost_ranks(group=None) -> list:
    """The ranks of `group` (default: WORLD) its survivors agreed are lost; empty while none is."""
    return list(_backend_of(group)[1].membership.lost)


def shrink(group=None, lost=None):
    """A group of the survivors of `group` (default: WORLD), without the ranks `lost` (default:
    ``lost_ranks(group)``); every survivor calls it. Ranks keep their order. Shrinking WORLD makes
    the new group the default one and destroys every other group, as torch.distributed.shrink_group
    does. Raises RanksLostError if more ranks are lost than `lost` names (call again with
    ``err.lost_ranks``), and ValueError for a rank in `lost` that is alive."""
    group, backend = _backend_of(group)
    _refuse_mixed_devices(group)
    lost = backend.membership.lost if lost is None else lost
    if not lost:
        raise ValueError("ringreduce.shrink: no rank of the group is known to be lost; pass the ranks to leave out")
    shrunk = dist.shrink_group(list(lost), group=group)
    destroy(group)
    return shrunk


# Where each tensor starts in the bytes sync_state broadcasts: a multiple of the widest element, so
# that every tensor can be viewed in place as its own dtype.
_TENSOR_ALIGN_BYTES = 16


class _Slot(NamedTuple):
    """A tensor of a state, as the state's skeleton carries it: where its bytes are, and what they are."""
    device_type: str
    offset: int
    nbytes: int
    shape: tuple
    dtype: torch.dtype


class _Refused(NamedTuple):
    """The skeleton the source sends instead of its state when it cannot give it: every rank raises."""
    error: str


def _is_plain_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter) and (
        value.layout == torch.strided and not value.is_quantized)


def _map_leaves(state, leaf):
    """`state` rebuilt, with leaf(x) for each x in it that is not a dict, list or tuple (a _Slot is a leaf)."""
    if isinstance(state, dict):
        return type(state)((key, _map_leaves(value, leaf)) for key, value in state.items())
    if isinstance(state, _Slot):
        return leaf(state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a named tuple
        return type(state)(*(_map_leaves(value, leaf) for value in state))
    if isinstance(state, (list, tuple)):
        return type(state)(_map_leaves(value, leaf) for value in state)
    return leaf(state)


def _split(state, tensors: dict):
    """`state` with each plain tensor replaced by a _Slot; (offset, tensor) goes to tensors[device type]."""

    def place(value):
        if not isinstance(value, torch.Tensor):
            return value
        if not _is_plain_tensor(value):
            dtensor = getattr(getattr(torch.distributed, "tensor", None), "DTensor", None)
            if dtensor is not None and isinstance(value, dtensor):
                raise ValueError("the state holds a sharded tensor (DTensor, as FSDP2 makes): each survivor holds "
                                 "its own shard, so no one survivor's state can stand for all; restore sharded "
                                 "state from a checkpoint instead")
            return value  # a sparse or quantized tensor travels pickled, with the skeleton
        placed = tensors.setdefault(value.device.type, [])
        offset = placed[-1][0] + _aligned(placed[-1][1].nbytes) if placed else 0
        placed.append((offset, value.detach()))
        return _Slot(value.device.type, offset, value.nbytes, tuple(value.shape), value.dtype)

    return _map_leaves(state, place)


def _join(skeleton, buffers: dict):
    """The state again: each _Slot becomes a view of its bytes in buffers[device type]."""

    def view(value):
        if not isinstance(value, _Slot):
            return value
        raw = buffers[value.device_type][value.offset:value.offset + value.nbytes]
        return raw.view(value.dtype).view(value.shape)

    return _map_leaves(skeleton, view)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _TENSOR_ALIGN_BYTES) * _TENSOR_ALIGN_BYTES


def _packed(placed: list) -> torch.Tensor:
    """The (offset, tensor) pairs _split placed, as one buffer of bytes."""
    last_offset, last = placed[-1]
    packed = torch.empty(last_offset + _aligned(last.nbytes), dtype=torch.uint8, device=last.device)
    for offset, tensor in placed:
        packed[offset:offset + tensor.nbytes].copy_(tensor.contiguous().reshape(-1).view(torch.uint8))
    return packed


def _describe(step, stateful) -> tuple:
    """(step, the kinds of state, what is wrong with them or None), as this rank tells the others."""
    kinds = [type(thing).__qualname__ for thing in stateful]
    for position, thing in enumerate(stateful, 1):
        if not (callable(getattr(thing, "state_dict", None)) and callable(getattr(thing, "load_state_dict", None))):
            return 0, kinds, (f"argument {position} after the step is a {type(thing).__name__}, which has no "
                              "state_dict()/load_state_dict(); pass the model, the optimizer and the like")
    try:
        return operator.index(step), kinds, None
    except TypeError:
        return 0, kinds, f"the step must be an int (the steps this rank completed), not {type(step).__name__}"


def sync_state(step, *stateful, group=None) -> int:
    """Makes the training state of every rank of `group` (default: WORLD) the same, bit for bit, and
    returns the step it stands at; every rank calls it, typically on the survivors just after
    ``shrink``. `step` is the number of steps this rank has completed; `stateful` are objects with
    ``state_dict()`` and ``load_state_dict()`` (the model, its optimizer, an LR scheduler, a
    GradScaler), of the same kinds in the same order on every rank.

    Every rank adopts the state of the rank furthest ahead (the highest `step`; of those, the lowest
    rank). A death can leave the survivors one step apart: some finished the last collective of a
    step and ran ``optimizer.step()``, others saw it fail. The ones ahead hold a valid step (a call
    completes on a rank only once its result holds every rank's contribution, the lost rank's too),
    so nothing is redone, and momentum and Adam's moments stay one history on every rank.

    The tensors travel in one broadcast per device type, the rest pickled; state that is sharded
    across ranks (DTensor) cannot be adopted from one rank, and is refused on every rank."""
    views = [None] * dist.get_world_size(group)
    dist.all_gather_object(views, _describe(step, stateful), group=group)  # before any raise: no rank left waiting
    for rank, (_, _, problem) in enumerate(views):
        if problem:
            raise TypeError(f"sync_state on rank {rank}: {problem}")
    if len({tuple(kinds) for _, kinds, _ in views}) > 1:
        raise ValueError("sync_state: the ranks passed different kinds of state: "
                         + "; ".join(f"rank {r}: {', '.join(kinds) or 'nothing'}" for r, (_, kinds, _) in enumerate(views)))
    source = max(range(len(views)), key=lambda r: (views[r][0], -r))
    mine = dist.get_rank(group) == source
    message = None
    buffers = {}
    if mine:
        try:
            tensors = {}
            skeleton = _split([thing.state_dict() for thing in stateful], tensors)
            buffers = {device_type: _packed(placed) for device_type, placed in tensors.items()}
            message = (skeleton, {device_type: len(buffer) for device_type, buffer in buffers.items()})
        except Exception as error:  # every rank raises it, rather than wait for tensors that never come
            message = _Refused(f"rank {source}, whose state the others would adopt: {error}")
    holder = [message]
    dist.broadcast_object_list(holder, group=group, group_src=source)
    if isinstance(holder[0], _Refused):
        raise ValueError(f"sync_state: {holder[0].error}")
    skeleton, sizes = holder[0]
    for device_type in sorted(sizes):
        if not mine:
            buffers[device_type] = torch.empty(sizes[device_type], dtype=torch.uint8, device=torch.device(device_type))
        dist.broadcast(buffers[device_type], group=group, group_src=source)
    if not mine:
        for thing, state in zip(stateful, _join(skeleton, buffers)):
            thing.load_state_dict(state)
    return views[source][0]
