"""The drop-in all_reduce."""

import atexit
import warnings

import torch
import torch.distributed as dist

from ringreduce import _groups
from ringreduce._checks import algorithm_code, check_segment_bytes, check_tensor, op_code
from ringreduce._groups import communicator
from ringreduce._interop import as_tensor


def all_reduce(
    tensor,
    op=dist.ReduceOp.SUM,
    group=None,
    async_op=False,
    algorithm="ring",
    transport=None,
    *,
    segment_bytes=None,
    root=0,
):
    """Reduce ``tensor`` across every rank of ``group``, in place, like ``torch.distributed.all_reduce``.

    Args:
        tensor: CPU or CUDA tensor (contiguous or not) of float32, float64, float16, bfloat16,
            int8, uint8, int32 or int64; or a NumPy or CuPy array, viewed without a copy and reduced
            in place. float16 and bfloat16 are reduced in float32 and rounded to nearest even.
        op: ``torch.distributed.ReduceOp`` SUM, AVG, MIN, MAX or PRODUCT.
        group: a ``torch.distributed`` group (None: the default group) or a ``LocalWorld`` rank.
        async_op: return a work handle (``wait()``, ``is_completed()``, ``get_future()``) instead
            of blocking. Async calls on one group complete in the order they were issued.
        algorithm: ``"ring"`` (reduce-scatter then all-gather) or ``"central"`` (reduce at a
            root, then broadcast).
        transport: None chooses automatically; see ``build_info()["transports"]``.
        segment_bytes: pipeline segment size; default ``RINGREDUCE_SEGMENT_BYTES`` or the engine's.
        root: the reducing rank of the central algorithm (group rank).

    Returns:
        None, or the work handle when ``async_op`` is true; its future's value is ``[tensor]``.
    """
    code = op_code(op)
    if not isinstance(tensor, torch.Tensor):
        tensor = as_tensor(tensor)
    check_tensor(tensor, code)
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        # What torch.distributed does on a rank outside the group: warn, leave the tensor alone.
        warnings.warn(f"ringreduce.all_reduce on global rank {dist.get_rank()}, which does not belong to the given "
                      "group: nothing was reduced", stacklevel=2)
        return None
    comm = communicator(group, tensor, transport, algorithm)
    work = comm.all_reduce(tensor, code, algorithm_code(algorithm), check_segment_bytes(segment_bytes), root, async_op)
    return work if async_op else None


def destroy(group=None) -> None:
    """Release ringreduce's communicators (and their workers and buffers) for ``group``, or all."""
    _groups.destroy(group)


# Workers must stop while the interpreter can still run their completion callbacks.
atexit.register(destroy)
