"""The backend found by name alone: torch's `torch.backends` entry point registers "ringreduce" at `import torch`
(ringreduce_autoload.py), the engine loads on first use, and a broken or mismatched install costs a warning,
never `import torch`. Every script here runs in its own process and never imports ringreduce itself."""

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import ringreduce
from conftest import users_environment

ROOT = pathlib.Path(__file__).resolve().parent.parent
WARNING = "ringreduce: the backend was not registered"
# Starting Python and importing torch takes a few seconds here; torchrun and Lightning add their own start-up.
SCRIPT_TIMEOUT_S = 120
# A test runs at most four scripts one after the other.
TEST_TIMEOUT_S = 4 * SCRIPT_TIMEOUT_S + 30
pytestmark = pytest.mark.timeout(TEST_TIMEOUT_S)

# A script that never imports ringreduce: the sum of (rank + 1) * arange over 2 ranks, exact in float64.
ALL_REDUCE = """
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZE = 1001  # not a multiple of the ranks: a ragged last chunk

def check(rank, world):
    assert "ringreduce" not in sys.modules, "the entry point imported the package at import torch"
    dist.init_process_group("ringreduce", **({} if world is None else
                            dict(init_method=f"file://{os.environ['STORE']}", rank=rank, world_size=2)))
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.arange(SIZE, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(tensor)
    expected = torch.arange(SIZE, dtype=torch.float64) * (world * (world + 1) / 2)
    assert torch.equal(tensor, expected), (tensor, expected)
    print(f"rank {rank}: {dist.get_backend()} sum ok, engine loaded {'ringreduce._C' in sys.modules}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    if sys.argv[1] == "torchrun":
        check(None, None)
    else:
        mp.spawn(check, args=(2,), nprocs=2)
"""


def run(args, cwd, env=None, timeout=SCRIPT_TIMEOUT_S):
    environment = users_environment()
    environment.update(env or {})
    return subprocess.run(args, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)


def write(folder, name, text):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_the_suite_runs_the_installed_package():
    """`make test` installs the wheel and keeps the source folder off sys.path; an editable install is the
    one case where the package is the sources."""
    direct = importlib.metadata.distribution("ringreduce").read_text("direct_url.json")
    editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
    from_sources = pathlib.Path(ringreduce.__file__).resolve().parent == ROOT / "ringreduce"
    assert from_sources == editable, (ringreduce.__file__, direct)


def test_import_torch_registers_the_name_without_loading_the_engine(tmp_path):
    """Autoload on: the name is known right after `import torch`; off (torch's switch): it is not, and torch
    finds it on first use through the torch.distributed.backends entry point. Neither loads the engine."""
    probe = ("import sys, torch, torch.distributed as dist; "
             "print(hasattr(dist.Backend, 'RINGREDUCE'), 'ringreduce' in sys.modules, 'ringreduce._C' in sys.modules, "
             "dist.is_backend_available('ringreduce'), 'ringreduce._C' in sys.modules)")
    on = run([sys.executable, "-c", probe], tmp_path)
    off = run([sys.executable, "-c", probe], tmp_path, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert on.stdout.split() == ["True", "False", "False", "True", "False"], on.stdout
    assert off.stdout.split() == ["False", "False", "False", "True", "False"], off.stdout
    assert WARNING not in on.stderr + off.stderr


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_a_script_that_never_imports_ringreduce(tmp_path, launcher):
    script = write(tmp_path, "train.py", ALL_REDUCE)
    if launcher == "torchrun":
        args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script, launcher]
    else:
        args = [sys.executable, script, launcher]
    done = run(args, tmp_path, env={"STORE": str(tmp_path / "store")})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(re.findall(r"rank \d: \w+ sum ok, engine loaded (?:True|False)", done.stdout))  # the ranks share a pipe
    assert lines == [f"rank {r}: ringreduce sum ok, engine loaded True" for r in range(2)], done.stdout + done.stderr


def installed_copy(folder):
    """A copy of the installed package, its entry point module and its metadata in `folder`, first on the
    path of the scripts run with it, so that breaking it leaves the real install alone."""
    package = pathlib.Path(importlib.util.find_spec("ringreduce").submodule_search_locations[0])
    shutil.copytree(package, folder / "ringreduce", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(importlib.util.find_spec("ringreduce_autoload").origin, folder)
    metadata = importlib.metadata.distribution("ringreduce")
    info = pathlib.Path(metadata.locate_file(f"ringreduce-{metadata.version}.dist-info"))
    if not info.is_dir():  # an editable install keeps its metadata elsewhere; the entry points are what counts
        info = pathlib.Path(metadata._path)
    shutil.copytree(info, folder / info.name)
    return {"PYTHONPATH": str(folder)}


INIT_ONE_RANK = ("import sys, torch.distributed as dist; "
                 "dist.init_process_group('ringreduce', init_method='file://' + sys.argv[1], rank=0, world_size=1)")


def broken_then_imported(tmp_path, damage):
    """What `import torch` then a probe of the name (plain, and with warnings made errors), `import ringreduce`
    and a group on the backend do with a copy of the install that `damage` broke."""
    site = tmp_path / "site"
    site.mkdir()
    env = installed_copy(site)
    damage(site / "ringreduce")
    torch_then_probe = [sys.executable, "-c", "import torch; print(torch.ones(2).sum().item()); "
                        "import torch.distributed as dist; print(dist.is_backend_available('ringreduce'))"]
    return {"torch": run(torch_then_probe, tmp_path, env),
            "torch -W error": run(torch_then_probe, tmp_path, dict(env, PYTHONWARNINGS="error")),
            "package": run([sys.executable, "-c", "import ringreduce"], tmp_path, env),
            "group": run([sys.executable, "-c", INIT_ONE_RANK, str(tmp_path / "store")], tmp_path,
                         dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))}


def check_broken(done, reason):
    # torch imports with one warning, and a script that probes the name to choose a backend hears no,
    # not an exception.
    for name in ("torch", "torch -W error"):
        assert done[name].returncode == 0 and done[name].stdout.split() == ["2.0", "False"], (name, done[name].stderr)
        assert done[name].stderr.count(WARNING) == 1 and reason in done[name].stderr, (name, done[name].stderr)
    for name in ("package", "group"):
        assert done[name].returncode != 0 and "Segmentation" not in done[name].stderr, (name, done[name].stderr)
        assert "ImportError" in done[name].stderr and reason in done[name].stderr, (name, done[name].stderr)


def test_a_broken_install_still_lets_torch_import(tmp_path):
    def remove_engine(package):
        for engine in package.glob("_C.*.so"):
            engine.unlink()

    check_broken(broken_then_imported(tmp_path, remove_engine), "the compiled engine for this Python")


def test_a_torch_other_than_the_one_built_for_is_refused_at_import(tmp_path):
    def record_another_torch(package):
        (package / "_built_for.py").write_text('TORCH_VERSION = "2.0.0+cpu"\n')

    check_broken(broken_then_imported(tmp_path, record_another_torch),
                 f"built for torch 2.0.0+cpu, but torch {torch.__version__} is installed")


LIGHTNING = """
import sys
import torch
import lightning as L
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    backend, out = sys.argv[1], sys.argv[2]
    L.seed_everything(0, verbose=False)
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=16)
    model = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=backend),
                        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data)
    if trainer.global_rank == 0:
        torch.save({"backend": torch.distributed.get_backend(), "engine": "ringreduce._C" in sys.modules,
                    "parameters": model.state_dict()}, out)
"""


def test_lightning_trains_on_the_backend_named_alone(tmp_path):
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("lightning is not installed (requirements-dev.txt brings it)")
    script = write(tmp_path, "fit.py", LIGHTNING)
    finished = {}
    for backend in ("ringreduce", "gloo"):
        out = tmp_path / f"{backend}.pt"
        done = run([sys.executable, script, backend, str(out)], tmp_path, env={"PYTHONWARNINGS": "ignore"})
        assert done.returncode == 0, done.stdout + done.stderr
        finished[backend] = torch.load(out)
    assert finished["ringreduce"]["backend"] == "ringreduce" and finished["ringreduce"]["engine"]
    assert finished["gloo"]["backend"] == "gloo" and not finished["gloo"]["engine"]
    ours, gloos = finished["ringreduce"]["parameters"], finished["gloo"]["parameters"]
    # Two ranks: each sum is a + b in either order, the same float, so training ends bitwise where gloo's does.
    assert ours.keys() == gloos.keys()
    for name in ours:
        assert torch.equal(ours[name], gloos[name]), name
