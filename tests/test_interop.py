"""NumPy (here) and CuPy (on a GPU) arrays are reduced in place, without a copy."""

import numpy as np
import pytest
import torch

import ringreduce
from reference import R


@pytest.fixture(scope="module")
def world3():
    return ringreduce.LocalWorld(3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8])
def test_numpy_arrays_are_reduced_in_place(world3, dtype):
    arrays = [(np.arange(1000) % 50 + r).astype(dtype) for r in range(3)]
    buffers = [a.ctypes.data for a in arrays]
    world3.all_reduce(arrays)
    expected = (np.arange(1000) % 50) * 3 + 3
    for array, address in zip(arrays, buffers):
        assert array.ctypes.data == address  # the very same memory
        assert np.array_equal(array.astype(np.int64), expected.astype(dtype).astype(np.int64))


def test_strided_numpy_views_write_back(world3):
    bases = [np.zeros((4, 6), dtype=np.float32) + r + 1 for r in range(3)]
    world3.all_reduce([b[:, ::2] for b in bases], op=R.MAX)
    for rank, b in enumerate(bases):
        assert (b[:, ::2] == 3).all() and (b[:, 1::2] == rank + 1).all()


def test_read_only_numpy_arrays_are_refused_untouched(world3):
    array = np.ones(8, dtype=np.float32)
    array.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        ringreduce.all_reduce(array, group=world3.group(0))
    assert (array == 1).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cupy_arrays_are_reduced_in_place_on_the_gpu():
    cupy = pytest.importorskip("cupy")
    world = ringreduce.LocalWorld(2, device="cuda")
    arrays = [cupy.arange(10_000, dtype=cupy.float32) * (r + 1) for r in range(2)]
    pointers = [a.data.ptr for a in arrays]
    world.all_reduce(arrays)
    torch.cuda.synchronize()
    for array, pointer in zip(arrays, pointers):
        assert array.data.ptr == pointer
        assert bool((array == cupy.arange(10_000, dtype=cupy.float32) * 3).all())
