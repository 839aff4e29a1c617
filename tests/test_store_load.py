"""What a group asks of its store, counted request by request (_C._testing.CountingStore): the
backend's set-up costs each rank a fixed number of requests beyond gloo's own rendezvous, whatever
the group's size, and the benchmark tool counts what the ranks ask."""

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from ringreduce import _C
from ringreduce import backend as ringreduce_backend
from ringreduce._groups import gloo_group
from ringreduce.bench import store_load

# The backend's own set-up requests per rank on one host: host labels, shared memory's names and
# its barrier (three gathers, two requests each, three on rank 0), rank 0's auto table, and the
# membership's records and first pulse.
OWN_REQUESTS = {"rank 0": 15, "others": 10}


# How long the idle groups are counted: twelve pulse periods (a count is off by up to one period's
# requests, as the window falls), once every rank has pulsed.
IDLE_WINDOW_S = 3.0
IDLE_SETTLE_S = 0.5


def _built(world, make):
    """What `make(rank)` returns on each of `world` thread ranks, run at once (a group's build is
    collective)."""
    made, errors = [None] * world, []

    def rank(r):
        try:
            made[r] = make(r)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return made


def _set_up_requests(world, make):
    """Each thread rank's store requests while `make(store, rank, world)` builds its part of a group
    over one in-process store."""
    store = dist.HashStore()
    counters = [_C._testing.CountingStore(store) for _ in range(world)]
    # (counted as each rank's part is built: its pulses begin a period later)
    built = _built(world, lambda r: (make(dist.PrefixStore("group/", counters[r]), r, world), counters[r].requests))
    return [requests for _, requests in built]


@pytest.mark.parametrize("world", [4, 8, 16])
def test_the_backends_set_up_costs_each_rank_a_fixed_number_of_requests_beyond_gloos(world):
    ours = _set_up_requests(world, lambda s, r, w: ringreduce_backend._create(s, r, w, datetime.timedelta(seconds=60)))
    gloo = _set_up_requests(world, lambda s, r, w: gloo_group(s, r, w, 60, 60))
    beyond = [a - b for a, b in zip(ours, gloo)]
    assert beyond == [OWN_REQUESTS["rank 0"]] + [OWN_REQUESTS["others"]] * (world - 1), (ours, gloo)


def test_the_tool_counts_the_idle_groups_pulses():
    """store_load.measure: 3 ranks in processes, over a TCPStore. Idle, each rank pulses every
    250 ms: its pulse, the pulses it watches in one request, a look for a new round; 12 requests a
    second, as thread ranks over one in-process store count exactly (processes counted up to 13)."""
    record = store_load.measure(3, idle_s=1.5)
    per_rank = record["idle_requests_per_s"] / 3
    assert 0.8 * 12 <= per_rank <= 1.2 * 12, record
    assert record["idle_segments_per_s"] >= record["idle_requests_per_s"], record


@pytest.mark.parametrize("world", [4, 16])
def test_an_idle_group_costs_each_rank_twelve_requests_a_second_whatever_its_size(world):
    """Thread ranks over one in-process store, each counted: each rank's pulse, the two pulses it
    watches (one multi_get) and a look for a new round, four times a second."""
    store = dist.HashStore()
    counters = [_C._testing.CountingStore(store) for _ in range(world)]
    backends = _built(world, lambda r: ringreduce_backend._create(dist.PrefixStore("group/", counters[r]), r, world,
                                                                  datetime.timedelta(seconds=60)))
    time.sleep(IDLE_SETTLE_S)
    before, began = [c.requests for c in counters], time.monotonic()
    time.sleep(IDLE_WINDOW_S)
    per_second = [(c.requests - b) / (time.monotonic() - began) for c, b in zip(counters, before)]
    # 12 a second, one period's 3 requests more or fewer as the window's edges fall (0.5 for the window's
    # own overshoot); a count that grew with the group would leave this band at 16 ranks.
    assert all(11 - 0.5 <= n <= 13 + 0.5 for n in per_second), per_second
    assert len(backends) == world


# The slow store's delay per request: a period's three requests take 0.9 s, so each reading begins
# 1.15 s after the last began; the loss bound there, which live ranks' pulses (seen at most two
# readings apart) never reach.
SLOW_STORE_DELAY_S = 0.3
SLOW_STORE_LOST_AFTER_S = 4.0


def test_a_slow_store_leaves_detection_on(monkeypatch):
    """Thread ranks' memberships over a store that answers each request 0.3 s late: nobody alive is
    found lost, and a rank whose pulse stops is named by every survivor within the bound and a few
    readings. (Readings a period apart counted as a gap once their own store calls took longer
    than that: every silence then started again at each reading, and no death was ever found.)"""
    monkeypatch.setenv("RINGREDUCE_LOST_AFTER", str(SLOW_STORE_LOST_AFTER_S))
    store, world = dist.HashStore(), 4
    slow = [_C._testing.CountingStore(store, delay_s=SLOW_STORE_DELAY_S) for _ in range(world)]
    members = _built(world, lambda r: _C.Membership(slow[r].clone(), slow[r], r, world, "one-host", "", 60.0))
    time.sleep(2 * SLOW_STORE_LOST_AFTER_S)
    assert [m.poll_loss() for m in members] == [[]] * world
    members.pop()  # rank 3's pulse stops
    stopped = time.monotonic()
    named = {}
    while len(named) < world - 1 and time.monotonic() - stopped < 4 * SLOW_STORE_LOST_AFTER_S:
        for rank, member in enumerate(members):
            if rank not in named and member.poll_loss():
                named[rank] = (member.poll_loss(), round(time.monotonic() - stopped, 1))
    assert sorted(named) == [0, 1, 2], named
    assert all(lost == [3] and after < SLOW_STORE_LOST_AFTER_S + 5 for lost, after in named.values()), named


def test_the_model_of_a_large_group_names_a_silent_rank_within_the_bound():
    """store_load.model: 64 thread ranks' memberships over one store; idle, 12 requests per rank a
    second (a 1.5 s window: 6 periods, give or take one); rank 32's pulse stopped, every survivor
    names it, and it alone, within the bound and 1.5 s."""
    record = store_load.model(64, idle_s=1.5, lost_after_s=1.0)
    assert 10 - 0.5 <= record["requests_per_rank_s"] <= 12 + 0.5, record
    assert record["named"] == 63 and record["wrong"] == {}, record
    # (1.5 s: 64 thread ranks on two cores shared with the rest of the suite read late; one took 2.07 s)
    assert record["named_after_s_max"] < record["lost_after_s"] + 1.5, record
