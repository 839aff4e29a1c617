"""Build of the ringreduce engine (ringreduce._C): C++ always, CUDA and NCCL when they can be built.

Environment:
    RINGREDUCE_CPU_ONLY=1     build without CUDA even where it could be built
    RINGREDUCE_FORCE_CUDA=1   fail, saying why, unless the CUDA part is built
    TORCH_CUDA_ARCH_LIST      GPU architectures (default: the visible GPUs', else "8.0;9.0")
"""

import glob
import os
import shutil
import subprocess
import sys

VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
# Compiled for when no GPU is visible to ask: A100-class (8.0) and H100/H200 (9.0).
DEFAULT_CUDA_ARCHS = "8.0;9.0"


def say(message):
    print(f"ringreduce setup: {message}", file=sys.stderr)


def toolkit_of(nvcc):
    """The CUDA toolkit folder behind `nvcc`, which may be a link or a wrapper script: nvcc says."""
    try:
        dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
        for line in (dry.stdout + dry.stderr).splitlines():
            if line.startswith("#$ TOP="):
                return os.path.realpath(line.split("=", 1)[1].strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def nccl_folder():
    """The nvidia-nccl wheel that torch depends on: (include dir, lib dir) or None."""
    try:
        import nvidia.nccl
    except ImportError:
        return None
    for root in nvidia.nccl.__path__:  # a namespace package
        include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
        if os.path.exists(os.path.join(include, "nccl.h")) and os.path.exists(os.path.join(lib, "libnccl.so.2")):
            return include, lib
    return None


def cuda_plan(torch):
    """What the CUDA part needs, or None with the reason said aloud (fatal under RINGREDUCE_FORCE_CUDA=1)."""
    if os.environ.get("RINGREDUCE_CPU_ONLY") == "1":
        say("building CPU-only: RINGREDUCE_CPU_ONLY=1")
        return None
    reason, plan = None, None
    nvcc = shutil.which("nvcc")
    if torch.version.cuda is None:
        reason = f"torch {torch.__version__} was built without CUDA"
    elif nvcc is None:
        reason = "nvcc is not on PATH"
    else:
        home = os.environ.get("CUDA_HOME") or toolkit_of(nvcc)
        nccl = nccl_folder()
        if not os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            reason = f"no CUDA headers under {home} (set CUDA_HOME to the toolkit folder)"
        elif nccl is None:
            reason = "the nvidia-nccl wheel (a dependency of CUDA torch) is not installed"
        else:
            plan = {"home": home, "nccl_include": nccl[0], "nccl_lib": nccl[1]}
    if plan is None:
        if os.environ.get("RINGREDUCE_FORCE_CUDA") == "1":
            raise SystemExit(f"ringreduce setup: RINGREDUCE_FORCE_CUDA=1 but the CUDA part cannot be built: {reason}")
        say(f"building CPU-only: {reason}")
    return plan


def extension():
    import torch

    plan = cuda_plan(torch)
    if plan is not None:
        # torch guesses CUDA_HOME from the nvcc on PATH (its grandparent folder), which is wrong
        # for a wrapper or a link: tell it before cpp_extension reads it.
        os.environ["CUDA_HOME"] = plan["home"]
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCHS
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    # Every room of csrc/ but cuda/, which only a CUDA build compiles (csrc/README.md).
    sources = sorted(s for s in glob.glob(os.path.join("csrc", "*", "*.cpp")) if not s.startswith(os.path.join("csrc", "cuda", "")))
    defines = [("RINGREDUCE_VERSION", f'"{VERSION}"'), ("RINGREDUCE_TORCH_VERSION", f'"{torch.__version__}"')]
    # -fno-trapping-math lets the compiler turn the 16-bit conversions' selects into vector code
    # (no FP exceptions are ever unmasked); hidden visibility is what pybind11 expects.
    cxx = ["-O3", "-fno-trapping-math", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
    if plan is None:
        return CppExtension("ringreduce._C", sources, include_dirs=[os.path.join(HERE, "csrc")],
                            define_macros=defines, extra_compile_args={"cxx": cxx})
    say(f"building with CUDA ({plan['home']}, archs {os.environ.get('TORCH_CUDA_ARCH_LIST', 'of the visible GPUs')}) "
        f"and NCCL ({plan['nccl_lib']})")
    sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cpp"))) + sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    return CUDAExtension(
        "ringreduce._C",
        sources,
        include_dirs=[os.path.join(HERE, "csrc"), plan["nccl_include"]],
        define_macros=defines + [("RINGREDUCE_WITH_CUDA", "1")],
        # The wheel ships libnccl.so.2 without a libnccl.so link: name the file, and find it at run time.
        extra_link_args=[f"-L{plan['nccl_lib']}", "-l:libnccl.so.2", f"-Wl,-rpath,{plan['nccl_lib']}"],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3"]},
    )


def main():
    from setuptools import setup

    ext = extension()  # first: it sets CUDA_HOME before torch.utils.cpp_extension reads it
    from torch.utils.cpp_extension import BuildExtension

    setup(
        name="ringreduce",
        version=VERSION,
        description="Ring and central all-reduce for PyTorch, in C++ and CUDA",
        packages=["ringreduce"],
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
        python_requires=">=3.10",
    )


main()
