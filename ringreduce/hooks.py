"""DDP communication hooks: switch a DistributedDataParallel model's gradient exchange in one line.

    ddp.register_comm_hook(state=None, hook=ringreduce.hooks.ring_hook)

``state`` is what torch's own ``allreduce_hook`` takes (None for the default group, or a
ProcessGroup), or a :class:`HookState` to choose the transport and segment size as well.

Every hook starts the all-reduce on the engine's worker and returns at once, so DDP keeps
computing the rest of the backward pass while the bucket travels. The future's value is the
averaged bucket, set from Python as torch requires.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringreduce.collectives import all_reduce


@dataclass
class HookState:
    """Options for ringreduce's hooks.

    Attributes:
        group: the ProcessGroup DDP reduces over (None: the default group).
        transport: a ringreduce transport name, or None to choose automatically.
        segment_bytes: pipeline segment size, or None for the default.
    """

    group: object = None
    transport: str = None
    segment_bytes: int = None


def _options(state):
    if state is None or isinstance(state, dist.ProcessGroup):
        return HookState(group=state)
    if isinstance(state, HookState):
        return state
    raise TypeError(f"hook state must be None, a ProcessGroup or ringreduce.hooks.HookState, got {type(state).__name__}")


def _average(state, bucket, algorithm, wire_dtype=None):
    """Start the all-reduce of the bucket; the future resolves to the averaged bucket."""
    options = _options(state)
    buffer = bucket.buffer()
    kwargs = dict(group=options.group, async_op=True, algorithm=algorithm, transport=options.transport,
                  segment_bytes=options.segment_bytes)
    if wire_dtype is None:
        # AVG divides once, at each element's final reduction: no separate pass over the bucket.
        work = all_reduce(buffer, op=dist.ReduceOp.AVG, **kwargs)
        return work.get_future().then(lambda fut: fut.value()[0])
    # Divide before compressing, as torch's compression hooks do, so 16-bit partial sums cannot
    # overflow; then round once to the wire type.
    world = dist.get_world_size(options.group)
    wire = buffer.div_(world).to(wire_dtype)
    work = all_reduce(wire, op=dist.ReduceOp.SUM, **kwargs)

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return work.get_future().then(decompress)


def ring_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket with the ring all-reduce."""
    return _average(state, bucket, "ring")


def auto_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket with the algorithm auto chooses for its size (learned online, or a tuning table)."""
    return _average(state, bucket, "auto")


def central_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket with the central reducer (group rank 0 reduces, then broadcasts)."""
    return _average(state, bucket, "central")


def ring_fp16_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Ring all-reduce with float16 on the wire: half the bytes, about 3 decimal digits kept."""
    return _average(state, bucket, "ring", torch.float16)


def ring_bf16_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """Ring all-reduce with bfloat16 on the wire: half the bytes, float32's range, about 2 digits kept."""
    return _average(state, bucket, "ring", torch.bfloat16)


# The hooks by the names the example and the command lines use.
BY_NAME = {"ring": ring_hook, "central": central_hook, "auto": auto_hook, "ring_fp16": ring_fp16_hook,
           "ring_bf16": ring_bf16_hook}
