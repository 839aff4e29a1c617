"""Ranks that pass different sizes to one collective: every rank raises MismatchError, for every
collective, algorithm and transport, with no process killed and nothing left hanging."""

import datetime
import time

import pytest

import ringreduce
from matrices import COLLECTIVES, PROCESS_TRANSPORTS, RAGGED_SIZES
from multiproc import run_ranks

# Far above what detection takes, so that passing well within it proves the error came from the
# header checks and not from a timeout.
TIMEOUT_S = 60
DETECTION_BUDGET_S = 10.0


def _every_case(rank, world, transport):
    """Each collective with each pattern of sizes, on fresh communicators: (case, outcome, seconds)."""
    outcomes = []
    for collective in sorted(COLLECTIVES):
        for sizes in sorted(RAGGED_SIZES):
            numel = RAGGED_SIZES[sizes](world)[rank]
            start = time.monotonic()
            try:
                COLLECTIVES[collective](numel, world, transport=transport)
                outcome = "returned"
            except ringreduce.MismatchError as error:
                outcome = "MismatchError" if "disagree" in str(error) else f"MismatchError: {error}"
            except Exception as error:  # noqa: BLE001 - the test names what came instead
                outcome = f"{type(error).__name__}: {error}"
            outcomes.append((f"{collective}, {sizes}", outcome, time.monotonic() - start))
            ringreduce.destroy()  # the failed communicator goes; the next case makes a new one
    return outcomes


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("transport", PROCESS_TRANSPORTS)
def test_every_process_raises_a_mismatch(transport, world):
    results = run_ranks(world, _every_case, transport, env={"RINGREDUCE_TIMEOUT": str(TIMEOUT_S)})
    for rank, outcomes in enumerate(results):
        for case, outcome, elapsed in outcomes:
            assert outcome == "MismatchError", f"rank {rank}, {case}: {outcome}"
            assert elapsed < DETECTION_BUDGET_S, f"rank {rank}, {case}: {elapsed:.1f} s"


@pytest.mark.parametrize("sizes", sorted(RAGGED_SIZES))
@pytest.mark.parametrize("collective", sorted(COLLECTIVES))
@pytest.mark.parametrize("world", [3, 4])
def test_every_local_rank_raises_a_mismatch(world, collective, sizes):
    local = ringreduce.LocalWorld(world, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    numels = RAGGED_SIZES[sizes](world)
    works = [COLLECTIVES[collective](numels[r], world, group=local.group(r), async_op=True) for r in range(world)]
    outcomes = []
    for work in works:
        try:
            work.wait()
            outcomes.append("returned")
        except ringreduce.MismatchError:
            outcomes.append("MismatchError")
        except Exception as error:  # noqa: BLE001
            outcomes.append(f"{type(error).__name__}: {error}")
    assert outcomes == ["MismatchError"] * world, outcomes
