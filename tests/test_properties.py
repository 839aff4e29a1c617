"""Property tests: random shapes, dtypes, ops, world sizes, segment sizes and layouts on the `local`
transport, against a float64 reference (floats) or torch's own wrapping arithmetic (integers).

The examples are derandomized and capped, so the run is the same, and as long, every time.
"""

import datetime

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ringreduce
from reference import ALL_DTYPES, INT_DTYPES, R, assert_bitwise_equal, reference

# About 5 s of CI time on the 2-core machine.
MAX_EXAMPLES = 400
_worlds = {}


def world_of(size):
    if size not in _worlds:
        _worlds[size] = ringreduce.LocalWorld(size, timeout=datetime.timedelta(seconds=60))
    return _worlds[size]


def random_tensor(shape, dtype, op, gen):
    if dtype in INT_DTYPES:
        info = torch.iinfo(dtype)
        low, high = max(info.min, -(2**40)), min(info.max, 2**40)
        return torch.randint(low, high + 1, shape, generator=gen, dtype=torch.int64).to(dtype)
    values = torch.randn(shape, generator=gen, dtype=torch.float64)
    if op == R.PRODUCT:
        values = 1 + values / 4  # keep products of a few factors well inside the 16-bit range
    return values.to(dtype)


def expected_result(inputs, op):
    """Floats: float64, in any order. Integers: torch's arithmetic in the dtype, which wraps."""
    if inputs[0].dtype not in INT_DTYPES:
        return reference(inputs, op, cast=False)
    combine = {R.SUM: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum, R.MAX: torch.maximum}[op]
    out = inputs[0].clone()
    for t in inputs[1:]:
        out = combine(out, t)
    return out


@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    world=st.integers(1, 6),
    shape=st.lists(st.integers(0, 61), min_size=0, max_size=3),
    dtype=st.sampled_from(ALL_DTYPES),
    op=st.sampled_from([R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT]),
    algorithm=st.sampled_from(["ring", "central"]),
    segment_bytes=st.one_of(st.none(), st.integers(1, 5000)),
    transposed=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_call_matches_the_reference(world, shape, dtype, op, algorithm, segment_bytes, transposed, seed):
    if op == R.AVG and dtype in INT_DTYPES:
        op = R.SUM
    gen = torch.Generator().manual_seed(seed)
    inputs = [random_tensor(shape, dtype, op, gen) for _ in range(world)]
    tensors = [t.clone() for t in inputs]
    views = [t.t() if transposed and t.dim() == 2 else t for t in tensors]  # non-contiguous when 2-D
    world_of(world).all_reduce(views, op=op, algorithm=algorithm, segment_bytes=segment_bytes)
    context = f"world={world} shape={shape} {dtype} {op} {algorithm} segment={segment_bytes}"
    assert_bitwise_equal(tensors, context=context)
    expected = expected_result(inputs, op)
    if dtype in INT_DTYPES or op in (R.MIN, R.MAX) or world == 1:
        assert torch.equal(tensors[0], expected.to(dtype)), context
        return
    # Each of the world-1 reductions rounds once to the storage type (AVG divides once more).
    eps = torch.finfo(dtype).eps
    if op == R.PRODUCT:
        bound = 2 * world * eps * expected.abs()
    else:
        bound = (world + 1) * eps * torch.stack([t.double().abs() for t in inputs]).sum(0)
    error = (tensors[0].double() - expected).abs()
    assert (error <= bound + torch.finfo(dtype).tiny).all(), f"{context}: max error {error.max()}"
