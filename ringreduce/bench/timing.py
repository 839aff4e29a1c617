"""Timing rows side by side: warm-up, many short interleaved trials, their median and their fastest."""

import contextlib
import math
import time
from typing import NamedTuple

# With --iters 0 the bounds on the calls per trial that fill --row-seconds. The upper one only
# stops calls that take next to nothing from making endless trials: at 2000, as first, 4-rank
# 15 us calls filled 30 ms trials whatever --row-seconds asked for.
MIN_ITERS, MAX_ITERS = 1, 100_000
# With --iters 0 the calls per trial come from blocks of 1, 2, 4, ... calls timed before the trials,
# until at least PROBE_MIN_BLOCKS blocks have taken PROBE_SECONDS in all; the block with the least
# time per call counts. One call was no guide: on 4 ranks of 2 cores a 4 KiB call of about 30 us
# took up to 6 ms whenever a rank was descheduled, trials sized from it held 4-57 calls instead of
# about 800, and each trial then counted the ranks' staggered exits from the barrier before it (auto's
# row came out 3.7x the row of the algorithm it ran, 2026-12-02). 5 ms is a few scheduler
# time slices; at 64 MiB (30 ms a call) the two blocks cost three calls instead of one.
PROBE_SECONDS = 0.005
PROBE_MIN_BLOCKS = 2
# A row not ready after its warm-up (auto still exploring) makes this many calls between two
# looks: a look at auto's choices waits for the engine's worker, and between every call it would
# space the calls out as the timed trials do not (those explored would then be another workload).
READY_CHECK_EVERY = 64
# Pause after each trial of a row whose traffic goes over TCP (gloo, and ringreduce's pg transport).
# gloo's traffic leaves work behind in the kernel (TCP on loopback) for tens of milliseconds: 4 KiB
# shm calls timed right after 200 gloo calls took 10 us instead of 3 us, and 2.7 us again after a
# pause. Other rows do without: a pause before each of 21 trials of 5 rows would add 5 s per size.
TCP_SETTLE_SECONDS = 0.05


class RowTime(NamedTuple):
    """Seconds per call of a row: its median trial, and its fastest."""

    median: float
    fastest: float


def iterations_for(one_call_seconds: float, args) -> int:
    """Calls per trial that fill the row's time budget split over the trials."""
    budget = args.row_seconds / args.trials
    return max(MIN_ITERS, min(MAX_ITERS, int(budget / max(one_call_seconds, 1e-7))))


def seconds_per_call(call, sync, slowest) -> float:
    """The group's time per call of `call` (PROBE_SECONDS); every rank makes the same calls, as
    `slowest` gives every rank the same times."""
    fastest, spent, calls, blocks = math.inf, 0.0, 1, 0
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync()
        took = slowest([time.perf_counter() - start])[0]
        fastest, spent, blocks = min(fastest, took / calls), spent + took, blocks + 1
        if (blocks >= PROBE_MIN_BLOCKS and spent >= PROBE_SECONDS) or calls >= MAX_ITERS:
            return fastest
        calls *= 2


def nothing():
    """The default trial end: host calls are done when they return."""


def always():
    """The default readiness: a row is ready to time after its warm-up calls."""
    return True


def timed_trials(calls, args, barrier, slowest, agree, sync=nothing, settings=None, settles=None, ready=None) -> list:
    """RowTime of each of `calls`, over args.trials trials run round-robin.

    Interleaving the rows trial by trial, in an order that rotates, means a burst of load from
    elsewhere on the machine hits every row alike instead of one row. This host has spells of
    seconds in which every call takes 5-10x longer (2 ranks, 1 MiB ring: 55 us, then 400-800 us
    for a second or more): with trials of a few milliseconds each row meets them as often as the
    others, and the fastest trial of each row is its speed outside them.
    `slowest` maps a list of this rank's seconds to the group's slowest, element by element;
    `sync` ends a trial (torch.cuda.synchronize for GPU rows, whose calls only queue work);
    `settings[i]`, a context manager factory, is entered around row i's calls; `settles[i]` says
    that row i's trials are followed by a TCP_SETTLE_SECONDS pause; after its warm-up row i makes
    untimed calls until `ready[i]()` (READY_CHECK_EVERY), which must say the same on every rank
    after the same call.
    """
    settings = settings or [contextlib.nullcontext] * len(calls)
    settles = settles or [False] * len(calls)
    ready = ready or [always] * len(calls)
    iters = []
    for call, setting, is_ready in zip(calls, settings, ready):
        with setting():
            for _ in range(args.warmup):
                call()
            while not is_ready():
                for _ in range(READY_CHECK_EVERY):
                    call()
            sync()
            barrier()
            iters.append(args.iters or agree(iterations_for(seconds_per_call(call, sync, slowest), args)))
    samples = [[] for _ in calls]
    rows = list(zip(calls, settings, settles, iters, samples))
    for trial in range(args.trials):
        # Each trial starts one row later, so every row takes every place in the round: a
        # disturbance that recurs with the round's period would otherwise hit one row every time.
        start_row = trial % len(rows)
        for call, setting, settle, n, row in rows[start_row:] + rows[:start_row]:
            with setting():
                barrier()
                start = time.perf_counter()
                for _ in range(n):
                    call()
                sync()
                row.append((time.perf_counter() - start) / n)
            if settle:
                time.sleep(TCP_SETTLE_SECONDS)
    # One exchange for all trials: a gloo all-reduce per trial would add the TCP traffic the pause is for.
    group_times = slowest([t for row in samples for t in row])
    per_row = [sorted(group_times[i * args.trials:(i + 1) * args.trials]) for i in range(len(calls))]
    return [RowTime(median=times[len(times) // 2], fastest=times[0]) for times in per_row]
