"""Argument checks shared by all_reduce and the DDP hooks. They run before any data moves, so a
rejected call leaves the tensor untouched."""

import torch
import torch.distributed as dist

_RED_OP = dist.ReduceOp.RedOpType
# Engine codes (csrc/core/common.h, enum ReduceOp).
OP_CODES = {_RED_OP.SUM: 0, _RED_OP.AVG: 1, _RED_OP.MIN: 2, _RED_OP.MAX: 3, _RED_OP.PRODUCT: 4}
# Engine codes (csrc/core/common.h, enum Algorithm).
ALGORITHM_CODES = {"ring": 0, "central": 1, "one_shot": 2, "hierarchical": 3, "doubling": 4, "halving_doubling": 5,
                   "auto": 6}

SUPPORTED_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
)
_INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)
_SUPPORTED_NAMES = "float32, float64, float16, bfloat16, int8, uint8, int32, int64 (bool for MIN/MAX/PRODUCT)"


# The RedOpType members are singletons: looking them up by identity skips their slow __hash__.
_OP_CODES_BY_ID = {id(op): code for op, code in OP_CODES.items()}


def op_code(op) -> int:
    """The engine code of a torch.distributed.ReduceOp."""
    code = _OP_CODES_BY_ID.get(id(op))  # a ReduceOp.RedOpType, the common case
    if code is None:
        code = _OP_CODES_BY_ID.get(id(getattr(op, "op", None)))  # a ReduceOp instance wraps one
    if code is None:
        raise ValueError(
            f"ringreduce supports ReduceOp SUM, AVG, MIN, MAX and PRODUCT, got {op!r}; "
            "use torch.distributed.all_reduce for the bitwise and premultiplied ops"
        )
    return code


def algorithm_code(algorithm) -> int:
    code = ALGORITHM_CODES.get(algorithm)
    if code is None:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose 'auto', 'ring', 'central', 'one_shot', 'hierarchical', "
                         "'doubling' or 'halving_doubling'")
    return code


# Engine codes (csrc/core/header.h, enum Compression), by the names `compress` takes.
COMPRESSION_CODES = {None: 0, "none": 0, "bf16": 1, "fp16": 2, "int8": 3}


def compression_code(compress) -> int:
    code = COMPRESSION_CODES.get(compress) if isinstance(compress, (str, type(None))) else None
    if code is None:
        raise ValueError(f"unknown compress {compress!r}; choose None (exact), 'bf16', 'fp16' or 'int8'")
    return code


# dtype -> whether it is an integer type (AVG is refused there). Complex and other dtypes are absent.
_DTYPE_IS_INTEGER = {dtype: dtype in _INTEGER_DTYPES for dtype in SUPPORTED_DTYPES}
_SUM, _AVG = OP_CODES[_RED_OP.SUM], OP_CODES[_RED_OP.AVG]


def check_tensor(tensor, op_code_: int) -> None:
    """Raise TypeError for a tensor whose type or dtype ringreduce cannot reduce with this op.

    Cheap on the common path. The engine refuses sparse and meta tensors itself (csrc/python/bindings.cpp).
    """
    is_integer = _DTYPE_IS_INTEGER.get(getattr(tensor, "dtype", None))
    if is_integer is None:
        _explain_unsupported(tensor)
    if is_integer and op_code_ in (_SUM, _AVG):
        if tensor.dtype == torch.bool:
            raise TypeError("ringreduce reduces torch.bool with MIN, MAX or PRODUCT only; convert to an integer dtype for SUM")
        if op_code_ == _AVG:
            raise TypeError(
                f"ReduceOp.AVG is not defined for integer tensors ({tensor.dtype}), as in torch.distributed; "
                "use SUM and divide, or a floating dtype"
            )


def _explain_unsupported(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ringreduce.all_reduce expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_complex():
        raise TypeError(
            f"ringreduce cannot reduce complex tensors ({tensor.dtype}); "
            "reduce torch.view_as_real(tensor) instead (SUM and AVG are exact on it)"
        )
    raise TypeError(f"ringreduce cannot reduce {tensor.dtype} tensors; supported: {_SUPPORTED_NAMES}")


def check_segment_bytes(segment_bytes) -> int:
    """0 means: the environment or the engine's default."""
    if segment_bytes is None:
        return 0
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes <= 0:
        raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
    return segment_bytes
