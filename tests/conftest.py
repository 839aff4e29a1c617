import os
import shutil

import pytest

# Tests must never hang: each gets this many seconds unless it asks for more.
DEFAULT_TEST_TIMEOUT_S = 300


def pytest_configure(config):
    """One torch thread per test process: two workers share 2 cores, and every rank they start
    (tests/multiproc.py) runs on one thread too, as torchrun sets for several ranks on a host."""
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT_S))


def _shared_memory_left_behind():
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith("ringreduce-"))


def pytest_sessionfinish(session):
    """After the whole suite, killed ranks included, no ringreduce segment may remain in /dev/shm. With
    pytest-xdist, only the controller asks, once every worker is done (a worker's peers may still run)."""
    if hasattr(session.config, "workerinput"):
        return
    leftovers = _shared_memory_left_behind()
    if leftovers:
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(f"FAILED: shared-memory segments left behind: {leftovers}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# No group sweeps dead processes' segments from /dev/shm during the suite: a segment that a killed rank
# leaves behind must stay for the leftover checks (the test's own and the final one), not be swept by
# another worker's next group at a moment that depends on scheduling.
KEEP_STALE_SEGMENTS = "RINGREDUCE_TESTING_KEEP_STALE_SEGMENTS"


def users_environment():
    """This environment without ringreduce settings, as a user's script starts, but with the suite's switch
    above: a group of the script must not sweep the segments that another test planted or checks."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RINGREDUCE_") or k == KEEP_STALE_SEGMENTS}


def namespaces_unavailable():
    """None where tests can make mount and pid namespaces (unshare, as root), else why they cannot."""
    if os.geteuid() != 0:
        return "needs root (unshare --mount --pid)"
    if shutil.which("unshare") is None:
        return "needs util-linux's unshare"
    return None


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Tests start without ringreduce settings from the caller's shell, and with the sweep off."""
    for name in list(os.environ):
        if name.startswith("RINGREDUCE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(KEEP_STALE_SEGMENTS, "1")
