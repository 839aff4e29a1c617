"""Set-up on machines other than this one, each case simulated by the tool's answer: an old Python, a CUDA
toolkit whose major differs from torch's, a build that cannot see the user's torch, and the build's PATH."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def setup_module():
    spec = importlib.util.spec_from_file_location("ringreduce_setup_under_test", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines only: main() runs when setup.py is the script
    return module


def _script(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _make_folder(tmp_path):
    for name in ("Makefile", "requirements.txt", "requirements-dev.txt", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _python_claiming(tmp_path, version):
    """A Python that runs `-c` code as the real one does, but with `version` as its sys.version_info, and
    fails anything else (making a venv, say): the Makefile's version check meets a real comparison."""
    major, minor, micro = version
    return _script(tmp_path, f"python{major}.{minor}", f"""case "$1" in
  --version) echo "Python {major}.{minor}.{micro}";;
  -c) exec {sys.executable} -c "import sys; sys.version_info = ({major}, {minor}, {micro}, 'final', 0)
$2";;
  *) echo "not this fake: $*" >&2; exit 1;;
esac
""")


def test_make_refuses_a_python_older_than_3_11_before_making_anything(tmp_path):
    folder = _make_folder(tmp_path)
    old = _python_claiming(tmp_path, (3, 10, 13))
    done = subprocess.run(["make", "install", f"PYTHON={old}"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "ringreduce needs Python 3.11 or newer" in done.stderr and "Python 3.10.13" in done.stderr, done.stderr
    assert "make PYTHON=python3.11" in done.stderr
    assert not (folder / ".venv").exists()
    # The same fake claiming 3.11 passes the check and goes on to make the venv (which it cannot): the
    # refusal above came from the comparison, not from a fake that fails every command.
    oldest = _python_claiming(tmp_path, (3, 11, 0))
    done = subprocess.run(["make", "install", f"PYTHON={oldest}"], cwd=folder, capture_output=True, text=True,
                          timeout=60)
    assert "ringreduce needs Python" not in done.stderr, done.stderr
    assert "not this fake: -m venv .venv" in done.stderr, done.stderr


def test_the_build_finds_the_venvs_ninja_first(tmp_path):
    folder = _make_folder(tmp_path)
    (folder / ".venv").mkdir()
    (folder / ".venv" / ".ringreduce-installed").touch()  # the set-up is done: only the build is shown
    done = subprocess.run(["make", "-n", "build"], cwd=folder, capture_output=True, text=True, timeout=60)
    wheel = next(line for line in done.stdout.splitlines() if "pip wheel" in line)
    assert f'PATH="{folder}/.venv/bin:$PATH" .venv/bin/pip wheel' in wheel, done.stdout


def _toolkit(folder, release):
    """A CUDA toolkit folder whose bin/nvcc says `release`, with the runtime header the plan looks for."""
    (folder / "bin").mkdir(parents=True)
    (folder / "include").mkdir()
    (folder / "include" / "cuda_runtime.h").touch()
    _script(folder / "bin", "nvcc", f'echo "Cuda compilation tools, release {release}, V{release}.0"\n')
    return folder


TORCH_CU130 = types.SimpleNamespace(__version__="2.14.1+cu130", version=types.SimpleNamespace(cuda="13.0"))


def test_with_cuda_home_set_the_check_reads_the_nvcc_that_compiles_not_the_first_on_path(setup_module, tmp_path,
                                                                                           monkeypatch, capsys):
    # torch's build runs $CUDA_HOME/bin/nvcc: an old distribution nvcc first on PATH changes nothing.
    on_path = tmp_path / "usr-bin"
    on_path.mkdir()
    _script(on_path, "nvcc", 'echo "Cuda compilation tools, release 12.4, V12.4.131"\n')
    monkeypatch.setenv("PATH", f"{on_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(setup_module, "find_nccl", lambda: {"include": "/nccl/include", "lib": "/nccl/lib",
                                                             "flag": "-lnccl"})
    cuda13 = _toolkit(tmp_path / "cuda-13.0", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(cuda13))
    plan = setup_module.cuda_plan(TORCH_CU130)
    assert plan is not None, capsys.readouterr().err
    assert plan["nvcc"] == str(cuda13 / "bin" / "nvcc") and plan["home"] == str(cuda13)
    # The other mix: CUDA_HOME on 12.4 and a CUDA 13 nvcc on PATH. The 12.4 one would compile: refused.
    _script(on_path, "nvcc", 'echo "Cuda compilation tools, release 13.0, V13.0.48"\n')
    cuda12 = _toolkit(tmp_path / "cuda-12.4", "12.4")
    monkeypatch.setenv("CUDA_HOME", str(cuda12))
    assert setup_module.cuda_plan(TORCH_CU130) is None
    said = capsys.readouterr().err
    assert f"nvcc {cuda12 / 'bin' / 'nvcc'} is CUDA 12.4" in said and "built with CUDA 13.0" in said, said
    # CUDA_HOME naming a folder without bin/nvcc says so instead of taking another nvcc.
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    assert setup_module.cuda_plan(TORCH_CU130) is None
    said = capsys.readouterr().err
    assert "nvcc was not found" in said and str(tmp_path / "nowhere" / "bin" / "nvcc") in said, said


def test_a_cuda_toolkit_of_another_major_builds_the_cpu_engine_and_says_why(setup_module, tmp_path, monkeypatch,
                                                                              capsys):
    _script(tmp_path, "nvcc", 'echo "Cuda compilation tools, release 12.4, V12.4.131"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert setup_module.cuda_plan(TORCH_CU130) is None
    said = capsys.readouterr().err
    assert "building CPU-only" in said and "is CUDA 12.4" in said and "built with CUDA 13.0" in said, said
    assert "install a torch wheel built for CUDA 12" in said and "a CUDA 13 toolkit" in said, said
    monkeypatch.setenv("RINGREDUCE_FORCE_CUDA", "1")
    with pytest.raises(SystemExit, match="the two majors must match"):
        setup_module.cuda_plan(TORCH_CU130)


def test_a_build_that_cannot_see_the_users_torch_stops_and_says_what_to_run(setup_module, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as in pip's isolated build environment
    with pytest.raises(SystemExit, match=r"no torch in this build's environment.*pip install --no-build-isolation"):
        setup_module.installed_torch()
    # The build's own entry goes through it before anything else.
    with pytest.raises(SystemExit, match=r"no torch in this build's environment"):
        setup_module.extension()


def test_an_isolated_build_is_not_given_a_torch_to_download():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert requires and not any(r.lower().startswith("torch") for r in requires), requires
