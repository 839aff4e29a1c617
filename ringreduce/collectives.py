"""The drop-in collectives: all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast and reduce."""

import atexit
import warnings

import torch
import torch.distributed as dist

from ringreduce import _C, _groups
from ringreduce._checks import (_OP_CODES_BY_ID, algorithm_code, check_segment_bytes, check_tensor, compression_code,
                                op_code)
from ringreduce._groups import checked_calls as _checked_calls
from ringreduce._groups import communicator
from ringreduce._interop import as_tensor

_repeat_checked_call = _checked_calls.repeat


def all_reduce(
    tensor,
    op=dist.ReduceOp.SUM,
    group=None,
    async_op=False,
    algorithm="auto",
    transport=None,
    *,
    segment_bytes=None,
    root=0,
    compress=None,
    residual=None,
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
        algorithm: ``"auto"`` (the default: learned online per size class; see ringreduce.tuning),
            ``"ring"`` (reduce-scatter then all-gather), ``"central"`` (reduce at a root, then
            broadcast), ``"one_shot"`` (every rank reduces every rank's buffer; CPU tensors,
            small messages), ``"hierarchical"`` (shared memory inside each host, a ring of one rank
            per host across; groups that span hosts), ``"doubling"`` (recursive doubling: log2 N
            steps, each with the whole buffer; CPU tensors, small messages across hosts) or
            ``"halving_doubling"`` (a reduce-scatter by recursive halving, an all-gather by doubling:
            2 log2 N steps moving 2(N-1)/N of the buffer, as the ring does in 2(N-1); CPU tensors,
            large messages across many hosts). Give a fixed one for sums whose rounding is the
            same from run to run.
        transport: None chooses automatically; see ``build_info()["transports"]``.
        segment_bytes: pipeline segment size; default ``RINGREDUCE_SEGMENT_BYTES`` or the engine's.
        root: the reducing rank of the central algorithm (group rank).
        compress: ``None`` (exact, the default), ``"bf16"``, ``"fp16"`` or ``"int8"``: on a group
            that spans hosts, a float32 SUM or AVG runs hierarchical and its values cross the link
            between hosts in that format (int8: blocks of 256 with a float32 scale), added in
            float32 and rounded once per host; inside each host they stay exact, and every rank
            ends with the same bits (docs/compression.md).
            Elsewhere (one host, other dtypes and ops) the call runs exact, as
            ``RINGREDUCE_DEBUG=INFO`` says. Give it with ``algorithm`` "auto" or "hierarchical".
        residual: for error feedback, a contiguous float32 CPU tensor of ``tensor``'s elements
            (apart from it), on a compressed SUM: this rank adds to it what each rounding it made
            dropped, so that the residuals summed over the ranks gain the exact sum minus the
            result. Add it to the next step's values (ringreduce.hooks.compressed_hook does).
            Where the call runs exact it stays as it is.

    Returns:
        None, or the work handle when ``async_op`` is true; its future's value is ``[tensor]``.
    """
    if group is None:  # remembered and destroyed as the group itself
        group = _groups.default_group()
    # Fast path: a call like one that passed every check before skips the checks (in C++).
    if segment_bytes is None and root == 0 and compress is None and residual is None:
        work = _repeat_checked_call(tensor, op, group, async_op, algorithm, transport)
        if work is not NotImplemented:
            return work
    code = op_code(op)
    compression = compression_code(compress)
    if not isinstance(tensor, torch.Tensor):
        tensor = as_tensor(tensor)
    check_tensor(tensor, code)
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        # What torch.distributed does on a rank outside the group: warn, leave the tensor alone.
        warnings.warn(f"ringreduce.all_reduce on global rank {dist.get_rank()}, which does not belong to the given "
                      "group: nothing was reduced", stacklevel=2)
        return None
    comm = communicator(group, tensor, transport, algorithm)
    algorithm_code_ = algorithm_code(algorithm)
    if residual is not None and not isinstance(residual, torch.Tensor):
        raise TypeError(f"ringreduce.all_reduce: residual must be a torch.Tensor, got {type(residual).__name__}")
    work = comm.all_reduce(tensor, code, algorithm_code_, check_segment_bytes(segment_bytes), root, async_op,
                           compression, residual)
    # Only calls on torch groups with a ReduceOp singleton are remembered: a LocalWorld rank finds
    # its communicator itself, and a ReduceOp instance made per call would be a new entry each time.
    if (type(tensor) is torch.Tensor and segment_bytes is None and root == 0 and compress is None
            and residual is None and id(op) in _OP_CODES_BY_ID and not isinstance(group, _groups.CommunicatorSource)):
        _checked_calls.remember(tensor, op, group, algorithm, transport, comm, algorithm_code_, code)
    return work if async_op else None


def _outside(group, name):
    """What torch.distributed does on a rank outside the group: warn, leave the tensors alone."""
    if group is not dist.GroupMember.NON_GROUP_MEMBER:
        return False
    warnings.warn(f"ringreduce.{name} on global rank {dist.get_rank()}, which does not belong to the given group: "
                  "nothing was done", stacklevel=3)
    return True


def _tensor_pair(output, input, name):
    if not isinstance(output, torch.Tensor) or not isinstance(input, torch.Tensor):
        raise TypeError(f"ringreduce.{name} expects torch.Tensor output and input, got "
                        f"{type(output).__name__} and {type(input).__name__}")


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False, *, segment_bytes=None,
                          transport=None, algorithm="auto", compress=None):
    """Reduce ``input`` across the ranks of ``group`` and leave rank r's share in ``output``, like
    ``torch.distributed.reduce_scatter_tensor``: the ring's first half.

    ``input`` holds world size times ``output``'s elements (any shapes); rank r receives the
    reduction of every rank's r-th slice. ``input`` is left as it was. Ops, dtypes, ``transport``
    and ``segment_bytes`` as all_reduce. Each rank moves (N-1)/N of ``input``.

    ``algorithm``: ``"ring"``, ``"hierarchical"`` (a group that spans hosts where it moves fewer
    bytes across them than the ring, as with the same number of ranks on each host, or 3+2: shared
    memory inside each host, then each host's link carries (H-1)/H of ``input`` for H even hosts),
    or ``"auto"`` (the default: hierarchical wherever it runs, else ring).

    ``compress``: as all_reduce's, where the reduce-scatter runs hierarchical: each rank's share
    crosses hosts in bf16 or fp16, summed in float32
    (``"int8"`` runs exact here).
    """
    _tensor_pair(output, input, "reduce_scatter_tensor")
    code = op_code(op)
    compression = compression_code(compress)
    check_tensor(input, code)
    if _outside(group, "reduce_scatter_tensor"):
        return None
    comm = communicator(group, input, transport, "ring")
    work = comm.reduce_scatter(output, input, code, algorithm_code(algorithm), check_segment_bytes(segment_bytes),
                               async_op, compression)
    return work if async_op else None


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *, segment_bytes=None,
                           transport=None, algorithm="auto"):
    """Gather every rank's ``input_tensor`` into ``output_tensor``, rank r's in the r-th slice, like
    ``torch.distributed.all_gather_into_tensor``: the ring's second half. Any dtype; each rank moves
    (N-1)/N of ``output_tensor``. ``algorithm`` as reduce_scatter_tensor's."""
    _tensor_pair(output_tensor, input_tensor, "all_gather_into_tensor")
    if _outside(group, "all_gather_into_tensor"):
        return None
    comm = communicator(group, input_tensor, transport, "ring")
    work = comm.all_gather(output_tensor, input_tensor, algorithm_code(algorithm),
                           check_segment_bytes(segment_bytes), async_op)
    return work if async_op else None


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None, *, segment_bytes=None, transport=None):
    """Copy ``tensor`` from one rank to every rank of ``group``, like ``torch.distributed.broadcast``:
    ``src`` is a global rank, ``group_src`` a rank of ``group`` (give one). Segments are passed along
    the ring from the source, so every link carries the tensor once. Any dtype."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ringreduce.broadcast expects a torch.Tensor, got {type(tensor).__name__}")
    if (src is None) == (group_src is None):
        raise ValueError("ringreduce.broadcast needs exactly one of src (a global rank) and group_src (a group rank)")
    if _outside(group, "broadcast"):
        return None
    if group_src is None:
        group_src = src if group is None or hasattr(group, "communicator") else dist.get_group_rank(group, src)
    comm = communicator(group, tensor, transport, "ring")
    work = comm.broadcast(tensor, group_src, check_segment_bytes(segment_bytes), async_op)
    return work if async_op else None


def reduce(tensor, dst=None, op=dist.ReduceOp.SUM, group=None, async_op=False, group_dst=None, *,
           segment_bytes=None, transport=None):
    """Reduce ``tensor`` across the ranks of ``group`` into the destination rank's ``tensor``, like
    ``torch.distributed.reduce``: ``dst`` is a global rank, ``group_dst`` a rank of ``group`` (give
    one). The central reducer's first half: the other ranks' tensors are left as they were. Ops and
    dtypes as all_reduce."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ringreduce.reduce expects a torch.Tensor, got {type(tensor).__name__}")
    if (dst is None) == (group_dst is None):
        raise ValueError("ringreduce.reduce needs exactly one of dst (a global rank) and group_dst (a group rank)")
    code = op_code(op)
    check_tensor(tensor, code)
    if _outside(group, "reduce"):
        return None
    if group_dst is None:
        group_dst = dst if group is None or hasattr(group, "communicator") else dist.get_group_rank(group, dst)
    comm = communicator(group, tensor, transport, "central")
    work = comm.reduce(tensor, code, group_dst, check_segment_bytes(segment_bytes), async_op)
    return work if async_op else None


def destroy(group=None) -> None:
    """Release ringreduce's communicators (and their workers and buffers) for ``group``, or all."""
    _groups.destroy(group)


# At exit, workers that are still finishing a collective's completion (Python callbacks, or the
# release of what they held) are given this long to end while Python can still run them; a
# worker that needs the interpreter after it has begun to finalize aborts the process. A
# completion takes milliseconds; the bound is for a loaded machine, and it is spent only while a
# worker is busy (exits measured in benchmarks/RESULTS.md).
EXIT_WAIT_FOR_WORKERS_S = 5.0


def _at_exit():
    """Teardown at interpreter exit, in the one order csrc/README.md ("Teardown") states."""
    # 0. No group's pulse thread runs on into the teardown (a rank that exits is lost to its peers anyway).
    _C.stop_pulses()
    # 1. Parameter servers stop: their links wake and tell their workers, so no link thread waits on a peer.
    _C.stop_parameter_servers("ringreduce.ps: the parameter server has stopped: its process is exiting")
    # 2. The communicators go; 3. their workers end while the interpreter can still run their completions.
    destroy()
    _C.wait_until_idle(EXIT_WAIT_FOR_WORKERS_S)
    # 4. The backend's gloo and NCCL delegates join their threads, which must not meet the interpreter's end.
    _C.drop_backend_delegates()


atexit.register(_at_exit)
