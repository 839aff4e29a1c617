"""Inputs with closed-form results, and float64 references, for every dtype and op."""

import functools

import torch
import torch.distributed as dist

R = dist.ReduceOp
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.int64)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES
ALL_OPS = (R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT)


def ops_for(dtype):
    return ALL_OPS if dtype in FLOAT_DTYPES else (R.SUM, R.MIN, R.MAX, R.PRODUCT)


# The float patterns below repeat with a period that divides this (2, 3 and 5 all divide it).
PATTERN_PERIOD = 30


@functools.lru_cache(maxsize=4)
def _phases(numel):
    """Each element's index modulo PATTERN_PERIOD, computed once per size (a matrix asks for the same sizes
    many times; the modulo of a long index was most of the inputs' cost)."""
    return torch.arange(numel, dtype=torch.int64) % PATTERN_PERIOD


def _float_pattern(world, rank, op):
    """The float inputs of one rank over one period (in float64), as a function of the index j."""
    j = torch.arange(PATTERN_PERIOD, dtype=torch.int64)
    if op == R.PRODUCT:
        return torch.where((j + rank) % 5 == 0, 2.0, torch.where((j + rank) % 3 == 0, -1.0, 1.0))
    if op == R.AVG:
        return (j % 5).double() + (rank - (world - 1) / 2)
    return (j % 3 + (j + rank) % 2).double()


def exact_inputs(world, numel, dtype, op, seed=0):
    """Per-rank inputs whose reduction is exact in `dtype`, so any summation order gives the same bits.

    SUM: small integers (16-bit floats hold every integer up to 256). AVG: rank offsets that sum to
    zero, so the mean is an integer. PRODUCT: +-1 with a few 2s. Integers: full-range values, whose
    SUM and PRODUCT wrap.
    """
    gen = torch.Generator().manual_seed(seed * 7919 + world * 131 + numel)
    inputs = []
    for rank in range(world):
        if dtype in INT_DTYPES:
            info = torch.iinfo(dtype)
            if op == R.PRODUCT and dtype == torch.int64:
                values = torch.randint(-3, 4, (numel,), generator=gen)
            else:
                low, high = max(info.min, -(2**62)), min(info.max, 2**62)  # randint's bounds fit int64
                values = torch.randint(low, high + 1, (numel,), generator=gen, dtype=torch.int64)
            inputs.append(values.to(dtype))
        elif op in (R.MIN, R.MAX):
            inputs.append((torch.randn(numel, generator=gen, dtype=torch.float64) * 100).to(dtype))
        else:  # one period cast to the dtype, then spread over the elements
            inputs.append(_float_pattern(world, rank, op).to(dtype)[_phases(numel)])
    return inputs


def reference(inputs, op, cast=True):
    """The result reduced in float64 (int64 for integers), cast to the inputs' dtype unless told not to."""
    dtype = inputs[0].dtype
    wide = torch.stack([t.to(torch.float64 if dtype.is_floating_point else torch.int64) for t in inputs])
    if op in (R.SUM, R.AVG):
        result = wide.sum(0)
        if op == R.AVG:
            result = result / len(inputs)
    elif op == R.PRODUCT:
        result = wide.prod(0)
    elif op == R.MIN:
        result = wide.min(0).values
    else:
        result = wide.max(0).values
    return result.to(dtype) if cast else result


def assert_bitwise_equal(results, expected=None, context=""):
    """Every rank holds the same bits (and, when given, the expected bits)."""
    first = results[0]
    for rank, result in enumerate(results):
        assert result.dtype == first.dtype and result.shape == first.shape, context
        assert torch.equal(result.reshape(-1).view(torch.uint8), first.reshape(-1).view(torch.uint8)), (
            f"{context}: rank {rank} differs from rank 0"
        )
    if expected is not None:
        assert torch.equal(first, expected), (
            f"{context}: result differs from the closed form at "
            f"{(first != expected).nonzero()[:5].flatten().tolist()}"
        )


def kernel_reference(a, b, op, world, last):
    """What one reduction kernel call must produce for dst=a, src=b: torch in the kernel's compute
    type (float32 for 16-bit floats), rounded back to the dtype once."""
    wide = torch.float32 if a.dtype in (torch.float16, torch.bfloat16) else a.dtype
    x, y = a.to(wide), b.to(wide)
    if op in (R.SUM, R.AVG):
        out = x + y
        if op == R.AVG and last:
            # Divided by a tensor: torch on CUDA divides by a Python number as a multiply by its
            # reciprocal, which can differ from the correctly rounded quotient by an ulp.
            out = out / torch.full_like(out, world)
    elif op == R.PRODUCT:
        out = x * y
    elif op == R.MIN:
        out = torch.minimum(x, y)
    else:
        out = torch.maximum(x, y)
    return out.to(a.dtype)
