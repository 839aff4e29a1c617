"""Set-up on machines other than this one, each case simulated by the tool's answer: an old Python, a CUDA
toolkit whose major differs from torch's, a build that cannot see the user's torch, and the build's PATH."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
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


def test_make_refuses_a_python_older_than_3_11_before_making_anything(tmp_path):
    folder = _make_folder(tmp_path)
    # What Python 3.10 answers: its version, and a failed version check.
    old = _script(tmp_path, "python3.10", 'case "$1" in --version) echo "Python 3.10.13";; *) exit 1;; esac\n')
    done = subprocess.run(["make", "install", f"PYTHON={old}"], cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "ringreduce needs Python 3.11 or newer" in done.stderr and "Python 3.10.13" in done.stderr, done.stderr
    assert "make PYTHON=python3.11" in done.stderr
    assert not (folder / ".venv").exists()


def test_the_build_finds_the_venvs_ninja_first(tmp_path):
    folder = _make_folder(tmp_path)
    (folder / ".venv").mkdir()
    (folder / ".venv" / ".ringreduce-installed").touch()  # the set-up is done: only the build is shown
    done = subprocess.run(["make", "-n", "build"], cwd=folder, capture_output=True, text=True, timeout=60)
    wheel = next(line for line in done.stdout.splitlines() if "pip wheel" in line)
    assert f'PATH="{folder}/.venv/bin:$PATH" .venv/bin/pip wheel' in wheel, done.stdout


def test_a_cuda_toolkit_of_another_major_builds_the_cpu_engine_and_says_why(setup_module, tmp_path, monkeypatch,
                                                                              capsys):
    _script(tmp_path, "nvcc", 'echo "Cuda compilation tools, release 12.4, V12.4.131"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    torch_cu130 = types.SimpleNamespace(__version__="2.14.1+cu130", version=types.SimpleNamespace(cuda="13.0"))
    assert setup_module.cuda_plan(torch_cu130) is None
    said = capsys.readouterr().err
    assert "building CPU-only" in said and "is CUDA 12.4" in said and "built with CUDA 13.0" in said, said
    assert "install a torch wheel built for CUDA 12" in said and "a CUDA 13 toolkit" in said, said
    monkeypatch.setenv("RINGREDUCE_FORCE_CUDA", "1")
    with pytest.raises(SystemExit, match="the two majors must match"):
        setup_module.cuda_plan(torch_cu130)


def test_a_build_that_cannot_see_the_users_torch_stops_and_says_what_to_run(setup_module, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as in pip's isolated build environment
    with pytest.raises(SystemExit, match=r"no torch in this build's environment.*pip install --no-build-isolation"):
        setup_module.installed_torch()


def test_an_isolated_build_is_not_given_a_torch_to_download():
    requires = (ROOT / "pyproject.toml").read_text().split("requires = ")[1].split("\n")[0]
    assert "torch" not in requires, requires
