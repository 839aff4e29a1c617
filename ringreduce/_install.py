"""Is this install usable with the running torch? Read by `import ringreduce` and by the torch.backends entry
point (`ringreduce_autoload`), which loads this file by its path so that it does not import the package: keep
it free of package imports."""

import importlib.machinery
import importlib.util
import os

# Written by setup.py each time it builds the extension: the torch the extension was compiled against.
BUILD_RECORD = "_built_for.py"
# The compiled engine: ringreduce/_C plus one of this interpreter's extension suffixes (.cpython-311-....so).
ENGINE = "_C"


def built_for(folder: str) -> str | None:
    """The torch version the extension in `folder` was built for, or None where nothing records it."""
    path = os.path.join(folder, BUILD_RECORD)
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("ringreduce_build_record", path)
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    return record.TORCH_VERSION


def problem(folder: str, torch_version: str) -> str | None:
    """Why the ringreduce package in `folder` cannot run with torch `torch_version`, or None if it can.
    The C++ ABI of torch changes between releases, so anything but the exact version may crash on load."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if not any(os.path.exists(os.path.join(folder, ENGINE + suffix)) for suffix in suffixes):
        return (f"the compiled engine for this Python (ringreduce/{ENGINE}{suffixes[0]}) "
                f"is missing from {folder}: the install is "
                f"broken or this is a source tree that was never built. Reinstall ringreduce (pip install "
                f"ringreduce-*.whl), or build and install it with `make build`; in the source folder, set "
                f"PYTHONSAFEPATH=1 or run Python from another folder, so that the installed package is found")
    wanted = built_for(folder)
    if wanted is None:
        return (f"{folder}/{BUILD_RECORD} is missing, so the torch this engine was built for is unknown: rebuild "
                f"ringreduce (`make build`, or pip wheel --no-build-isolation --no-deps . and install that wheel)")
    if wanted != torch_version:  # the local tag too: +cu130 and +cpu builds differ in what they export
        return (f"this ringreduce was built for torch {wanted}, but torch {torch_version} is installed; the C++ "
                f"interface differs between torch builds. Install torch {wanted}, or rebuild ringreduce against "
                f"this torch: pip wheel --no-build-isolation --no-deps <ringreduce source> and install that wheel")
    return None
