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

from ringreduce._checks import compression_code
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


class CompressionState:
    """The state of :func:`compressed_hook`, in the shape of torch's ``PowerSGDState``.

    Args:
        process_group: the ProcessGroup DDP reduces over (None: the default group).
        compress: the format of the values on the link between hosts: ``"bf16"`` (the default),
            ``"fp16"`` or ``"int8"`` (blocks of 256 values with a float32 scale); see
            ``ringreduce.all_reduce``'s ``compress``. Inside each host the sums stay exact.
        use_error_feedback: keep what each rounding dropped and add it to the same bucket's next
            gradient, so that nothing is lost over the steps. None (the default) turns it on for
            int8 and off for bf16 and fp16, whose values keep about 3 significant digits each
            (docs/compression.md measures both on a training run).
        transport, segment_bytes: as :class:`HookState`'s.

    The residuals take one float32 per gradient element, on the CPU (the model's gradients once
    more), and only buckets of float32 CPU gradients keep one. ``error_dict`` holds them by bucket
    index. They follow the parameters, not the bucket index: when DDP rebuilds its buckets (after
    the first step, or when the graph changes), each parameter's residual moves to its new bucket.
    """

    def __init__(self, process_group=None, compress="bf16", use_error_feedback=None, transport=None,
                 segment_bytes=None):
        if compression_code(compress) == 0:  # (a clear error now, not at the first bucket)
            raise ValueError("ringreduce.hooks.CompressionState: compress must be 'bf16', 'fp16' or 'int8'; for exact "
                             "sums use ringreduce.hooks.auto_hook")
        self.process_group = process_group
        self.compress = compress
        self.use_error_feedback = compress == "int8" if use_error_feedback is None else bool(use_error_feedback)
        self.transport = transport
        self.segment_bytes = segment_bytes
        self.error_dict = {}  # bucket index -> the bucket's residual (float32, flat)
        self._bucket_parameters = {}  # bucket index -> the ids of its parameters, in order
        self._residual_of = {}  # parameter id -> its residual (a view of a bucket's)

    def residual(self, bucket):
        """The residual of ``bucket`` (made, or rebuilt from its parameters' residuals, as needed)."""
        index = bucket.index()
        parameters = bucket.parameters()
        key = tuple(id(p) for p in parameters)
        if self._bucket_parameters.get(index) == key:
            return self.error_dict[index]
        buffer = bucket.buffer()
        residual = torch.zeros(buffer.numel(), dtype=torch.float32)
        sizes = [p.numel() for p in parameters]
        if sum(sizes) == buffer.numel():  # DDP lays a CPU bucket's gradients end to end, in this order
            for parameter, view in zip(parameters, residual.split(sizes)):
                kept = self._residual_of.get(id(parameter))
                if kept is not None:
                    view.copy_(kept)
                self._residual_of[id(parameter)] = view
        self.error_dict[index] = residual
        self._bucket_parameters[index] = key
        return residual


def compressed_hook(state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket with its values compressed on the link between hosts (hierarchical
    all-reduce), with error feedback as ``state`` says: this step's gradient plus what the last
    step's roundings dropped is what is reduced, and what this step's roundings drop is kept.

        state = ringreduce.hooks.CompressionState(compress="int8")
        ddp.register_comm_hook(state, ringreduce.hooks.compressed_hook)

    On one host, or for gradients other than float32, the sum runs exact.
    """
    if not isinstance(state, CompressionState):
        raise TypeError(f"ringreduce.hooks.compressed_hook takes a ringreduce.hooks.CompressionState, got "
                        f"{type(state).__name__}")
    buffer = bucket.buffer()
    # Divide first, as torch's compression hooks do: the residual then keeps the units of the average.
    buffer.div_(dist.get_world_size(state.process_group))
    residual = None
    if state.use_error_feedback and buffer.dtype == torch.float32 and buffer.device.type == "cpu":
        residual = state.residual(bucket)
        buffer.add_(residual)
        residual.zero_()
    work = all_reduce(buffer, op=dist.ReduceOp.SUM, group=state.process_group, async_op=True, algorithm="auto",
                      transport=state.transport, segment_bytes=state.segment_bytes, compress=state.compress,
                      residual=residual)
    return work.get_future().then(lambda fut: fut.value()[0])


# The hooks by the names the example and the command lines use.
BY_NAME = {"ring": ring_hook, "central": central_hook, "auto": auto_hook, "ring_fp16": ring_fp16_hook,
           "ring_bf16": ring_bf16_hook}
