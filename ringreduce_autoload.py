"""How torch finds the "ringreduce" backend in scripts that never import ringreduce. Two entry points:

- `torch.backends` (`register`): torch calls it at `import torch`, unless TORCH_DEVICE_BACKEND_AUTOLOAD=0. It
  registers the name with a creator that loads the engine the first time a group is made on it, so the name
  is in `dist.Backend.backend_list` from the start. It must never break or slow `import torch`: it imports
  nothing of the package, and every failure becomes one warning.
- `torch.distributed.backends` (`register_on_use`): torch calls it when a backend name it does not know is
  first used (init_process_group, new_group), so the name works with autoload off too; a broken install
  raises there, saying why (and, with autoload on, `dist.is_backend_available` says False).

This module lives outside the package because importing `ringreduce` loads the compiled engine."""

import importlib.util
import os
import sys
import warnings

NAME = "ringreduce"


def register() -> None:
    try:
        _register_lazily()
    except Exception as error:  # noqa: BLE001 -- torch turns an escaping error into a failed `import torch`
        _say_unavailable()
        _warn(f"ringreduce: the backend was not registered with torch.distributed: {error}. "
              f"init_process_group('{NAME}') will raise the same; TORCH_DEVICE_BACKEND_AUTOLOAD=0 silences this.")


def _say_unavailable() -> None:
    """dist.is_backend_available(NAME) asks torch.distributed.is_<name>_available first, if there is one: a
    script that probes the name to choose a backend gets False, not the error (init_process_group still
    raises it, through the other entry point). With autoload off torch calls that entry point unguarded."""
    import torch.distributed as dist

    setattr(dist, f"is_{NAME}_available", lambda: False)


def register_on_use() -> None:
    _register_lazily()


def _warn(message: str) -> None:
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:  # noqa: BLE001 -- warnings turned into errors (-W error) must not fail `import torch`
        sys.stderr.write(f"RuntimeWarning: {message}\n")


def _register_lazily() -> None:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or hasattr(dist.Backend, NAME.upper()):
        return  # a torch without distributed, or registered already (`import ringreduce`, or the other entry point)
    folder = _package_folder()
    checks = importlib.util.spec_from_file_location("ringreduce_install_checks", os.path.join(folder, "_install.py"))
    install = importlib.util.module_from_spec(checks)
    checks.loader.exec_module(install)
    why = install.problem(folder, torch.__version__)
    if why:
        raise ImportError(why)
    dist.Backend.register_backend(NAME, _create_on_first_use, extended_api=False, devices=["cpu", "cuda"])


def _package_folder() -> str:
    """Where `ringreduce` would be imported from, found without importing it."""
    spec = importlib.util.find_spec(NAME)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the ringreduce package is not importable, though its entry point is installed")
    return spec.submodule_search_locations[0]


def _create_on_first_use(store, rank, size, timeout):
    # Importing the package loads the engine; its own register() finds this creator in place and keeps it.
    from ringreduce import backend

    return backend._create(store, rank, size, timeout)
