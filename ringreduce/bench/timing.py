"""Timing rows side by side: warm-up, interleaved trials, and the median."""

import contextlib
import time

# With --iters 0 each (row, size) is timed for about this long in all, within these bounds on the
# calls per trial: long enough to average out the scheduler on a shared 2-core machine, short
# enough that the default sweep stays under two minutes.
TARGET_SECONDS_PER_ROW = 0.5
MIN_ITERS, MAX_ITERS = 3, 2000
# Pause before each row's trial. gloo's traffic leaves work behind in the kernel (TCP on loopback)
# for tens of milliseconds: 4 KiB shm calls timed right after 200 gloo calls took 10 us instead of
# 3 us, and 2.7 us again after a pause. Without it, rows that follow gloo rows pay for them.
ROW_SETTLE_SECONDS = 0.05


def iterations_for(one_call_seconds: float, args) -> int:
    """Calls per trial: --iters, or enough to fill the row's time budget split over the trials."""
    if args.iters > 0:
        return args.iters
    budget = TARGET_SECONDS_PER_ROW / args.trials
    return max(MIN_ITERS, min(MAX_ITERS, int(budget / max(one_call_seconds, 1e-7))))


def nothing():
    """The default trial end: host calls are done when they return."""


def timed_trials(calls, args, barrier, slowest, agree, sync=nothing, settings=None) -> list:
    """Median seconds per call of each of `calls`, over args.trials trials run round-robin.

    Interleaving the rows trial by trial, in an order that rotates, means a burst of load from
    elsewhere on the machine hits every row alike instead of one row, so the ratios between rows
    hold up; the median drops bursts.
    `sync` ends a trial (torch.cuda.synchronize for GPU rows, whose calls only queue work);
    `settings[i]`, a context manager factory, is entered around row i's calls.
    """
    settings = settings or [contextlib.nullcontext] * len(calls)
    iters = []
    for call, setting in zip(calls, settings):
        with setting():
            for _ in range(args.warmup):
                call()
            sync()
            barrier()
            start = time.perf_counter()
            call()
            sync()
        iters.append(agree(iterations_for(slowest(time.perf_counter() - start), args)))
    samples = [[] for _ in calls]
    rows = list(zip(calls, settings, iters, samples))
    for trial in range(args.trials):
        # Each trial starts one row later, so every row takes every place in the round: a
        # disturbance that recurs with the round's period would otherwise hit one row every time.
        start_row = trial % len(rows)
        for call, setting, n, row in rows[start_row:] + rows[:start_row]:
            time.sleep(ROW_SETTLE_SECONDS)
            with setting():
                barrier()
                start = time.perf_counter()
                for _ in range(n):
                    call()
                sync()
                elapsed = time.perf_counter() - start
            row.append(slowest(elapsed / n))
    return [sorted(row)[len(row) // 2] for row in samples]
