"""The GPU watchdog's rules, driven through a fake completion source (no GPU needed): collectives
finish in order, a late one fails the communicator with CommTimeoutError naming it, an asynchronous
error or a mismatch flag fails it at once, the work is aborted exactly once, and teardown is bounded."""

import time

import pytest

import ringreduce
from ringreduce import _C

# Generous bounds for a loaded 2-core machine; the watchdog itself polls every 10 ms.
SLACK_S = 2.0


def wait_until(condition, limit_s):
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > limit_s:
            return None
        time.sleep(0.005)
    return time.monotonic() - start


def raises_now(probe):
    try:
        probe.check()
    except RuntimeError:
        return True
    return False


def test_collectives_that_finish_leave_the_communicator_healthy():
    probe = _C._testing.WatchdogProbe(timeout_s=5)
    for sequence in range(3):
        probe.begin(sequence, f"collective #{sequence}")
        probe.end(sequence)
    probe.complete(2)
    assert wait_until(lambda: probe.in_flight == 1, SLACK_S) is not None, "the two finished ones are dropped, in order"
    probe.complete(3)
    assert wait_until(lambda: probe.in_flight == 0, SLACK_S) is not None
    probe.check()
    assert probe.drain() is True
    assert probe.aborts == 0


@pytest.mark.parametrize("issued", [True, False], ids=["stuck-on-device", "stuck-while-issuing"])
def test_a_late_collective_fails_with_a_timeout_that_names_it(issued):
    timeout_s = 0.3
    probe = _C._testing.WatchdogProbe(timeout_s=timeout_s)
    probe.begin(0, "collective #0")
    probe.end(0)
    probe.complete(1)
    start = time.monotonic()
    probe.begin(7, "nccl rank 1: 1000 x float32, SUM, ring (collective #7)")
    if issued:
        probe.end(7)
    elapsed = wait_until(lambda: raises_now(probe), timeout_s + SLACK_S)
    assert elapsed is not None, "the watchdog never fired"
    assert time.monotonic() - start >= timeout_s, "it fired before the timeout"
    with pytest.raises(ringreduce.CommTimeoutError, match=r"Timed out after 300 ms: .*collective #7\) did not finish"):
        probe.check()
    assert probe.aborts == 1
    # Every later call keeps raising the same error; the abort is not repeated.
    with pytest.raises(ringreduce.CommTimeoutError, match="collective #7"):
        probe.check()
    assert probe.abort("a later failure on the host").startswith("ringreduce: Timed out after 300 ms: nccl rank 1")
    assert probe.aborts == 1


@pytest.mark.parametrize("kind,error", [("failure", RuntimeError), ("mismatch", ringreduce.MismatchError)])
def test_a_reported_failure_fails_the_communicator_at_once(kind, error):
    probe = _C._testing.WatchdogProbe(timeout_s=60)
    probe.begin(0, "collective #0")
    probe.end(0)
    probe.report(kind, f"the source says: {kind}")
    assert wait_until(lambda: raises_now(probe), SLACK_S) is not None
    with pytest.raises(error, match=f"the source says: {kind}"):
        probe.check()
    assert probe.aborts == 1


def test_a_host_failure_aborts_once_and_the_first_notice_wins():
    probe = _C._testing.WatchdogProbe(timeout_s=60)
    probe.begin(0, "collective #0")
    assert probe.abort("ncclGroupEnd failed") == "ncclGroupEnd failed"
    assert probe.abort("a second failure") == "ncclGroupEnd failed"
    assert probe.aborts == 1
    with pytest.raises(RuntimeError, match="ncclGroupEnd failed"):
        probe.check()


def test_teardown_waits_for_the_work_but_no_longer_than_the_timeout():
    probe = _C._testing.WatchdogProbe(timeout_s=0.5)
    probe.begin(0, "collective #0")
    probe.end(0)
    start = time.monotonic()
    assert probe.drain() is False, "work that never finishes is aborted, not waited for"
    assert time.monotonic() - start < 0.5 + SLACK_S
    assert probe.aborts == 1

    finishing = _C._testing.WatchdogProbe(timeout_s=30)
    finishing.begin(0, "collective #0")
    finishing.end(0)
    finishing.complete(1)
    assert finishing.drain() is True
    assert finishing.aborts == 0


def test_a_collective_queued_behind_a_slow_one_is_not_late_for_waiting_its_turn():
    timeout_s = 1.2
    probe = _C._testing.WatchdogProbe(timeout_s=timeout_s)
    for sequence in range(2):
        probe.begin(sequence, f"collective #{sequence}")
        probe.end(sequence)
    time.sleep(0.7)
    probe.complete(1)  # the first took most of the timeout; the second's time starts now
    time.sleep(0.7)  # 1.4 s after both began, 0.7 s after the second's turn came
    probe.check()
    probe.complete(2)
    assert wait_until(lambda: probe.in_flight == 0, SLACK_S) is not None
    probe.check()
    assert probe.aborts == 0
