import os

import pytest

# Tests must never hang: each gets this many seconds unless it asks for more.
DEFAULT_TEST_TIMEOUT_S = 300


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT_S))


@pytest.fixture(scope="session", autouse=True)
def _no_shared_memory_left_behind():
    """After the whole suite, killed ranks included, no ringreduce segment may remain in /dev/shm."""
    yield
    leftovers = [name for name in os.listdir("/dev/shm") if name.startswith("ringreduce-")]
    assert not leftovers, f"shared-memory segments left behind: {leftovers}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Tests start without ringreduce settings from the caller's shell."""
    for name in list(os.environ):
        if name.startswith("RINGREDUCE_"):
            monkeypatch.delenv(name)
