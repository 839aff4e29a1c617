"""Build of the ringreduce engine (ringreduce._C): C++ always, CUDA and NCCL when they can be built.

Environment:
    CUDA_HOME                 the CUDA toolkit whose bin/nvcc compiles the kernels (else the nvcc on PATH, else
                              /usr/local/cuda's)
    NCCL_HOME                 an NCCL install (include/nccl.h, lib/libnccl.so*), tried before the nvidia-nccl
                              wheel and the system folders
    RINGREDUCE_CPU_ONLY=1     build without CUDA even where it could be built
    RINGREDUCE_FORCE_CUDA=1   fail, saying why, unless the CUDA part is built
    TORCH_CUDA_ARCH_LIST      GPU architectures (default: the visible GPUs', else DEFAULT_CUDA_ARCHS below)
"""

import glob
import os
import re
import shutil
import subprocess
import sys

VERSION = "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
# Compiled for when no GPU is visible to ask: A100-class (8.0) and H100/H200 (9.0) machine code, and 9.0's
# PTX, which the driver compiles for GPUs newer than both (without it a wheel built here fails on them).
DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"
# The oldest Python the package and its development tools install on (hypothesis, matplotlib and numpy 2.4
# of requirements-dev.txt have no release for 3.10).
OLDEST_PYTHON = (3, 11)


def say(message):
    print(f"ringreduce setup: {message}", file=sys.stderr)


def cuda_release(nvcc):
    """The CUDA release `nvcc --version` names ("12.4"), or None when it says none."""
    try:
        said = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", said)
    return found.group(1) if found else None


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


# Where a CUDA toolkit lives when nvcc is not on PATH.
DEFAULT_CUDA_HOME = "/usr/local/cuda"
# System folders that distribution and NGC images install NCCL into.
SYSTEM_NCCL_FOLDERS = [("/usr/include", "/usr/lib/x86_64-linux-gnu"), ("/usr/include", "/usr/lib/aarch64-linux-gnu"),
                       ("/usr/local/include", "/usr/local/lib"), ("/usr/include", "/usr/lib64")]


def find_nvcc():
    """The nvcc that will compile the kernels, with where it was looked for. torch's build runs
    $CUDA_HOME/bin/nvcc, so with CUDA_HOME set that is the one, whatever nvcc PATH finds first (often an
    older /usr/bin/nvcc from the distribution); without it, the nvcc on PATH, else /usr/local/cuda's."""
    home = os.environ.get("CUDA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "nvcc")
        return (candidate if os.access(candidate, os.X_OK) else None), [f"$CUDA_HOME/bin ({candidate})"]
    places = ["PATH"]
    found = shutil.which("nvcc")
    if not found:
        candidate = os.path.join(DEFAULT_CUDA_HOME, "bin", "nvcc")
        places.append(candidate)
        if os.access(candidate, os.X_OK):
            found = candidate
    return found, places


def nccl_library(lib):
    """The linker flag for libnccl in `lib` (wheels ship only libnccl.so.2), or None."""
    if os.path.exists(os.path.join(lib, "libnccl.so")):
        return "-lnccl"
    if os.path.exists(os.path.join(lib, "libnccl.so.2")):
        return "-l:libnccl.so.2"
    return None


def nccl_candidates():
    """(include dir, lib dir) pairs to try, in order: $NCCL_HOME, the nvidia-nccl wheel, the system."""
    home = os.environ.get("NCCL_HOME")
    if home:
        yield os.path.join(home, "include"), os.path.join(home, "lib")
    try:
        import nvidia.nccl

        for root in nvidia.nccl.__path__:  # a namespace package
            yield os.path.join(root, "include"), os.path.join(root, "lib")
    except ImportError:
        pass
    yield from SYSTEM_NCCL_FOLDERS


def find_nccl():
    """{"include", "lib", "flag"} of the first NCCL with both nccl.h and libnccl, or None."""
    for include, lib in nccl_candidates():
        flag = nccl_library(lib)
        if flag and os.path.exists(os.path.join(include, "nccl.h")):
            return {"include": include, "lib": lib, "flag": flag}
    return None


def cuda_plan(torch):
    """What the CUDA part needs, or None with the reason said aloud (fatal under RINGREDUCE_FORCE_CUDA=1)."""
    if os.environ.get("RINGREDUCE_CPU_ONLY") == "1":
        say("building CPU-only: RINGREDUCE_CPU_ONLY=1")
        return None
    reason, plan = None, None
    nvcc, places = find_nvcc()
    if torch.version.cuda is None:
        reason = f"torch {torch.__version__} was built without CUDA"
    elif nvcc is None:
        reason = f"nvcc was not found (looked on {', '.join(places)}); set CUDA_HOME to the CUDA toolkit folder"
    elif (release := cuda_release(nvcc)) and release.split(".")[0] != torch.version.cuda.split(".")[0]:
        reason = (f"nvcc {nvcc} is CUDA {release}, but torch {torch.__version__} was built with CUDA "
                  f"{torch.version.cuda}, and the two majors must match; for the GPU path, install a torch wheel "
                  f"built for CUDA {release.split('.')[0]}, or a CUDA {torch.version.cuda.split('.')[0]} toolkit "
                  f"and set CUDA_HOME to it, then build again")
    else:
        home = os.environ.get("CUDA_HOME") or toolkit_of(nvcc)
        nccl = find_nccl()
        if not os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            reason = f"no CUDA headers under {home} (set CUDA_HOME to the toolkit folder)"
        elif nccl is None:
            reason = ("NCCL was not found: no nccl.h with libnccl in $NCCL_HOME, the nvidia-nccl wheel or the "
                      "system folders; install nvidia-nccl-cu13 (or your CUDA's) or set NCCL_HOME")
        else:
            plan = {"home": home, "nvcc": nvcc, "nccl": nccl}
    if plan is None:
        if os.environ.get("RINGREDUCE_FORCE_CUDA") == "1":
            raise SystemExit(f"ringreduce setup: RINGREDUCE_FORCE_CUDA=1 but the CUDA part cannot be built: {reason}")
        say(f"building CPU-only: {reason}")
    return plan


def half_precision_headers(plan):
    """A folder with cuda_fp16.h, which the host build of the kernel bodies needs (host_kernels.cpp,
    the simulated device): the toolkit's, else the nvidia wheels' that the CUDA build of torch brings."""
    homes = [plan["home"]] if plan else [os.environ.get("CUDA_HOME"), DEFAULT_CUDA_HOME]
    folders = [os.path.join(home, "include") for home in homes if home]
    try:
        import nvidia

        for root in nvidia.__path__:  # a namespace package: nvidia/<part>/include
            folders += sorted(glob.glob(os.path.join(root, "*", "include")))
    except ImportError:
        pass
    return next((f for f in folders if os.path.exists(os.path.join(f, "cuda_fp16.h"))), None)


def record_torch(torch):
    """Writes ringreduce/_built_for.py: the torch this build is for, which `import ringreduce` and the
    entry point compare with the running torch before the extension is loaded (ringreduce/_install.py)."""
    with open(os.path.join(HERE, "ringreduce", "_built_for.py"), "w") as record:
        record.write(f'# Written by setup.py when the extension is built.\nTORCH_VERSION = "{torch.__version__}"\n')


def installed_torch():
    """The environment's torch; without one, what to run instead (an isolated build, pip's default, would
    build against another torch than the user's and then replace theirs with it)."""
    try:
        import torch
    except ImportError:
        raise SystemExit("ringreduce setup: no torch in this build's environment. ringreduce builds against the torch "
                         "you run it with: install torch first, then `pip install --no-build-isolation .` (or "
                         "`make build`); a build with isolation (pip's default) cannot see your torch.") from None
    return torch


def extension():
    torch = installed_torch()

    record_torch(torch)
    plan = cuda_plan(torch)
    if plan is not None:
        # torch guesses CUDA_HOME from the nvcc on PATH (its grandparent folder), which is wrong
        # for a wrapper or a link: tell it before cpp_extension reads it.
        os.environ["CUDA_HOME"] = plan["home"]
        # cpp_extension runs $CUDA_HOME/bin/nvcc; a wrapper found elsewhere goes first on PATH.
        os.environ["PATH"] = os.path.dirname(plan["nvcc"]) + os.pathsep + os.environ.get("PATH", "")
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_CUDA_ARCHS
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    # Every room of csrc/ but cuda/. Of cuda/, the host side of the GPU path (which also runs on the
    # simulated device) wherever cuda_fp16.h is found, and the real side of the device seam
    # (cuda/real_*.cpp) and the kernels (*.cu) in a CUDA build only (csrc/README.md).
    cuda_room = os.path.join("csrc", "cuda", "")
    needs_toolkit = os.path.join("csrc", "cuda", "real_")
    every = sorted(glob.glob(os.path.join("csrc", "*", "*.cpp")))
    sources = [s for s in every if not s.startswith(cuda_room)]
    gpu_path = [s for s in every if s.startswith(cuda_room) and not s.startswith(needs_toolkit)]
    defines = [("RINGREDUCE_VERSION", f'"{VERSION}"'), ("RINGREDUCE_TORCH_VERSION", f'"{torch.__version__}"')]
    with_sim = [("RINGREDUCE_WITH_SIM", "1")]
    # -fno-trapping-math lets the compiler turn the 16-bit conversions' selects into vector code
    # (no FP exceptions are ever unmasked); hidden visibility is what pybind11 expects. -g0 undoes the
    # -g that Python's own build flags add: debug info for torch's templates made a TU that includes
    # torch's headers a third slower to compile (backend.cpp: 39 s with -g, 26 s without).
    cxx = ["-O3", "-g0", "-fno-trapping-math", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
    if plan is None:
        headers = half_precision_headers(plan)
        if headers is None:
            say("building without the simulated device: no cuda_fp16.h (install torch's CUDA build, which brings "
                "it, or set CUDA_HOME to a CUDA toolkit)")
            return CppExtension("ringreduce._C", sources, include_dirs=[os.path.join(HERE, "csrc")],
                                define_macros=defines, extra_compile_args={"cxx": cxx})
        return CppExtension("ringreduce._C", sources + gpu_path, include_dirs=[os.path.join(HERE, "csrc"), headers],
                            define_macros=defines + with_sim, extra_compile_args={"cxx": cxx})
    nccl = plan["nccl"]
    say(f"building with CUDA ({plan['home']}, archs {os.environ.get('TORCH_CUDA_ARCH_LIST', 'of the visible GPUs')}) "
        f"and NCCL ({nccl['lib']})")
    sources += gpu_path + sorted(glob.glob(needs_toolkit + "*.cpp")) + sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    return CUDAExtension(
        "ringreduce._C",
        sources,
        include_dirs=[os.path.join(HERE, "csrc"), nccl["include"]],
        define_macros=defines + with_sim + [("RINGREDUCE_WITH_CUDA", "1")],
        # The wheel ships libnccl.so.2 without a libnccl.so link (find_nccl names the file then);
        # the rpath finds it at run time.
        extra_link_args=[f"-L{nccl['lib']}", nccl["flag"], f"-Wl,-rpath,{nccl['lib']}"],
        extra_compile_args={"cxx": cxx, "nvcc": ["-O3"]},
    )


def torch_release():
    """The installed torch's release, without the local tag (+cu130, +cpu) that package indexes leave out."""
    import torch

    return torch.__version__.split("+")[0]


def main():
    if sys.version_info < OLDEST_PYTHON:
        raise SystemExit(f"ringreduce setup: needs Python {'.'.join(map(str, OLDEST_PYTHON))} or newer; this is "
                         f"{sys.version.split()[0]}")
    from setuptools import setup

    ext = extension()  # first: it sets CUDA_HOME before torch.utils.cpp_extension reads it
    from torch.utils.cpp_extension import BuildExtension

    setup(
        name="ringreduce",
        version=VERSION,
        description="Ring and central all-reduce for PyTorch, in C++ and CUDA",
        packages=["ringreduce", "ringreduce.bench"],
        # The backend's name, found by torch without `import ringreduce` (ringreduce_autoload.py says how).
        py_modules=["ringreduce_autoload"],
        entry_points={"torch.backends": ["ringreduce = ringreduce_autoload:register"],
                      "torch.distributed.backends": ["ringreduce = ringreduce_autoload:register_on_use"]},
        # The engine links against this torch's C++ interface, which changes between releases.
        install_requires=[f"torch=={torch_release()}", "numpy>=1.26"],
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
        python_requires=f">={'.'.join(map(str, OLDEST_PYTHON))}",
    )


if __name__ == "__main__":
    main()
