"""Build of the ringreduce C++ engine (ringreduce._C)."""

import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))


def engine_sources():
    return sorted(glob.glob(os.path.join("csrc", "*.cpp")))


def extension():
    defines = [
        ("RINGREDUCE_VERSION", f'"{VERSION}"'),
        ("RINGREDUCE_TORCH_VERSION", f'"{torch.__version__}"'),
    ]
    return CppExtension(
        "ringreduce._C",
        engine_sources(),
        include_dirs=[os.path.join(HERE, "csrc")],
        define_macros=defines,
        # -fno-trapping-math lets the compiler turn the 16-bit conversions' selects into vector code
        # (no FP exceptions are ever unmasked); hidden visibility is what pybind11 expects.
        extra_compile_args={
            "cxx": ["-O3", "-fno-trapping-math", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
        },
    )


setup(
    name="ringreduce",
    version=VERSION,
    description="Ring and central all-reduce for PyTorch, in C++ and CUDA",
    packages=["ringreduce"],
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.10",
)
