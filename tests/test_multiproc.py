"""The suite's own rank launcher (tests/multiproc.py): what a rank writes reaches the test's report, in
order; a rank that fails before its function runs is reported at once with its traceback; a rank starts
with the caller's settings; nothing outlives the call, even when the server that forked the ranks dies."""

import os
import sys
import time

import pytest

import multiproc

# Every test here fails within this, where the bug it guards would wait out run_ranks' timeout.
FAST_S = 30


def _say(rank, world):
    print(f"rank {rank} says hello", flush=True)
    return rank


def test_what_a_rank_writes_lands_between_what_the_caller_wrote_before_and_after(capfd):
    os.write(1, b"the caller, before\n")
    assert multiproc.run_ranks(1, _say) == [0]
    os.write(1, b"the caller, after\n")
    # One open file shared with the rank: nothing written by one overwrites the other's lines.
    assert capfd.readouterr().out == "the caller, before\nrank 0 says hello\nthe caller, after\n"


def _refuse():
    raise ValueError("planted: this argument cannot be loaded")


class _Unloadable:
    """An argument whose loading in the rank raises, before the rank's function can run."""

    def __reduce__(self):
        return _refuse, ()


def _never_called(rank, world, unloadable):
    raise AssertionError("not reached")


def test_a_rank_that_fails_before_its_function_runs_fails_the_call_at_once_with_its_traceback(capfd):
    start = time.monotonic()
    with pytest.raises(AssertionError, match="exited without a result"):
        multiproc.run_ranks(2, _never_called, _Unloadable(), timeout=120)
    assert time.monotonic() - start < FAST_S
    err = capfd.readouterr().err
    assert "Traceback" in err and "ValueError: planted: this argument cannot be loaded" in err, err


def _read_at_load(name):
    return os.environ.get(name), "ringreduce" in sys.modules


class _SettingsAtLoad:
    """What a rank sees while its arguments load, which is when the test's modules are imported."""

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return _read_at_load, (self.name,)


def _report(rank, world, seen):
    return seen


def test_a_rank_loads_its_modules_with_the_callers_settings(monkeypatch):
    monkeypatch.setenv("RINGREDUCE_MULTIPROC_PROBE", "the caller's")
    [(value, ringreduce_already_imported)] = multiproc.run_ranks(1, _report, _SettingsAtLoad(
        "RINGREDUCE_MULTIPROC_PROBE"))
    assert value == "the caller's"
    # The server did not import ringreduce (which reads its settings at import) with another test's.
    assert not ringreduce_already_imported


def test_a_preload_the_server_could_not_import_is_an_error(monkeypatch):
    monkeypatch.setattr(multiproc, "PRELOADED", multiproc.PRELOADED + ["a_module_nobody_has"])
    with pytest.raises(RuntimeError, match=r"could not preload \['a_module_nobody_has'\]"):
        multiproc._become_the_caller([None, None], dict(os.environ))


def _kill_the_server_and_wait(rank, world, pid_file):
    with open(pid_file, "w") as out:
        out.write(str(os.getpid()))
    os.kill(os.getppid(), 9)  # the forkserver: from now on this rank's status reads as exited
    time.sleep(120)


def test_a_rank_whose_server_died_is_killed_not_left_running(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(AssertionError, match=r"ranks \[0\] exited without a result"):
        multiproc.run_ranks(1, _kill_the_server_and_wait, str(pid_file), timeout=FAST_S)
    pid = int(pid_file.read_text())
    assert multiproc._start_time(pid) is None or multiproc._is_zombie(pid), f"rank {pid} still runs"
    # The next call starts a new server.
    assert multiproc.run_ranks(1, _say) == [0]
