"""The `torch.backends` entry point: torch calls `register()` at `import torch` (unless
TORCH_DEVICE_BACKEND_AUTOLOAD=0), so that init_process_group("ringreduce") works in scripts that never import
ringreduce. It lives outside the package because importing `ringreduce` loads the compiled engine; here the
engine is loaded the first time a group is created on the backend. It must never break or slow `import torch`:
every failure becomes one warning."""

import importlib.util
import os
import warnings

NAME = "ringreduce"


def register() -> None:
    try:
        _register_lazily()
    except Exception as error:  # noqa: BLE001 -- torch turns an escaping error into a failed `import torch`
        warnings.warn(f"ringreduce: the backend was not registered with torch.distributed: {error}. "
                      f"init_process_group('{NAME}') needs `import ringreduce` first, which will say the same; "
                      f"TORCH_DEVICE_BACKEND_AUTOLOAD=0 silences this.", RuntimeWarning, stacklevel=2)


def _register_lazily() -> None:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or hasattr(dist.Backend, NAME.upper()):
        return  # a torch without distributed, or `import ringreduce` came first
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
    from ringreduce import backend  # loads the engine and registers the real creator under the same name

    return backend._create(store, rank, size, timeout)
