"""What installing ringreduce adds to `import torch` (its torch.backends entry point).

    python benchmarks/import_cost.py [--runs 20]

Fresh interpreters time `import torch` (wall, and the process's CPU time, which other processes disturb
less) with ringreduce installed, and with it hidden from torch as if it were not: the package's metadata
folder (*.dist-info), where torch finds the entry point, is renamed for those runs and always renamed back.
The two alternate, so the machine's drift falls on both; each is the median of --runs. Then, inside one
interpreter, the time of ringreduce's registration alone.
"""

import argparse
import importlib.metadata
import os
import pathlib
import statistics
import subprocess
import sys

IMPORT = ("import time; t, c = time.perf_counter(), time.process_time(); import torch; "
          "print(time.perf_counter() - t, time.process_time() - c)")
REGISTER = ("import time, torch; t = time.perf_counter(); import ringreduce_autoload; ringreduce_autoload.register(); "
            "print(time.perf_counter() - t)")
HIDDEN_SUFFIX = ".hidden"


def seconds(code, autoload=True):
    """The durations `code` printed, in a fresh interpreter."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0", PYTHONSAFEPATH="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return [float(v) for v in done.stdout.split()]


def installed_metadata() -> pathlib.Path:
    metadata = importlib.metadata.distribution("ringreduce")
    folder = pathlib.Path(metadata.locate_file(f"ringreduce-{metadata.version}.dist-info"))
    if not folder.is_dir():
        raise SystemExit(f"no {folder}: install the wheel first (make build)")
    return folder


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    metadata = installed_metadata()
    hidden = metadata.with_name(metadata.name + HIDDEN_SUFFIX)
    installed, absent = [], []
    try:
        for _ in range(runs):
            installed.append(seconds(IMPORT))
            metadata.rename(hidden)
            try:
                absent.append(seconds(IMPORT))
            finally:
                hidden.rename(metadata)
    finally:
        if hidden.exists() and not metadata.exists():
            hidden.rename(metadata)
    register = [seconds(REGISTER, autoload=False)[0] for _ in range(runs)]
    ms = lambda values: 1e3 * statistics.median(values)  # noqa: E731
    for index, kind in enumerate(("wall", "CPU")):
        with_it, without = ms([v[index] for v in installed]), ms([v[index] for v in absent])
        print(f"import torch, {kind} time, median of {runs}: ringreduce installed {with_it:.1f} ms, "
              f"not installed {without:.1f} ms, difference {with_it - without:+.1f} ms")
    print(f"ringreduce's registration alone, median of {runs}: {ms(register):.2f} ms")


if __name__ == "__main__":
    main()
