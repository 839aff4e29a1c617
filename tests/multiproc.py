"""Run a function on N processes joined by a process group (gloo unless told), and collect what each returns.

The ranks are forked from a server process that has imported torch once (multiprocessing's forkserver),
instead of each spawned rank importing it again: a few seconds of CPU saved per rank. Each rank still
starts as the caller: its own process, the caller's environment, folder and open stdout and stderr, a
new group, and its own import of ringreduce and of the test's modules (so that settings read at import
are the caller's, whichever test started the server)."""

import os
import queue as queue_module
import signal
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from multiprocessing import reduction

# How long the ranks of one call may take in all: the slowest such test took about 25 s on 2026-12-03.
DEFAULT_RANKS_TIMEOUT_S = 240
# What the server imports before it forks any rank: the costly imports that read no test's settings.
# Not ringreduce (its import reads RINGREDUCE_* settings and the tuning file; 9 ms once torch is in)
# nor the tests' own modules.
PRELOADED = ["torch", "torch.distributed", "pytest"]
# How long a rank that has exited may take to have its result read: what it put in the queue before
# exiting is flushed by then (a feeder thread writes it; 0.1-0.2 s on a busy machine).
RESULT_AFTER_EXIT_S = 5.0
# How often run_ranks looks for ranks that exited without a result while it waits.
EXIT_POLL_S = 0.2
# How long ranks that all reported may take to leave (destroying their group) before they are killed.
RANK_EXIT_GRACE_S = 30

_context = mp.get_context("forkserver")
_context.set_forkserver_preload(PRELOADED)


def queue():
    """A queue that the processes of start_process can put into."""
    return _context.Queue()


class _AsTheCaller:
    """Unpickled in the new process before its target and arguments (which may import the test's module):
    from then on the process writes to the caller's own open stdout and stderr (the same open files,
    sharing their offsets, so neither overwrites the other) and has the caller's environment."""

    def __init__(self):
        self.environment = dict(os.environ)

    def __reduce__(self):
        # Called while the process is being started: DupFd sends the descriptors with it.
        streams = [reduction.DupFd(fd) if _is_open(fd) else None for fd in (1, 2)]
        return _become_the_caller, (streams, self.environment)


def _is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _become_the_caller(streams, environment):
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, stream in zip((1, 2), streams):
        if stream is not None:
            theirs = stream.detach()
            os.dup2(theirs, fd)
            os.close(theirs)
    os.environ.clear()
    os.environ.update(environment)
    # One core per rank, as torchrun sets for several ranks on a host (OMP_NUM_THREADS=1): 3 ranks on
    # 2 cores, each filling and comparing 4 MiB tensors on torch's 2 threads, took 18 ms a call of
    # tests/test_stalls.py's loop, against 3.2 ms with one thread each.
    torch.set_num_threads(1)
    missing = [name for name in PRELOADED if name not in sys.modules]
    if missing:  # the server skips a preload that fails to import, silently: say it here
        raise RuntimeError(f"the rank server could not preload {missing} (sys.path {sys.path})")


def _run(_caller, target, args):
    target(*args)


def start_process(target, *args):
    """A started process that runs target(*args) with the caller's environment, working folder, stdout
    and stderr (in place before the target's module is imported)."""
    proc = _context.Process(target=_run, args=(_AsTheCaller(), target, args))
    proc.start()
    proc.start_time = _start_time(proc.pid)
    return proc


def _stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None once the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None once gone:
    with the pid, it names the process even after the pid is reused."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def stop(proc, grace_s=RANK_EXIT_GRACE_S):
    """Wait up to grace_s for proc, then kill it. Also when its status cannot be read any more (the server
    that forked it has died, and the status reads as exited): the pid is killed if it is still that process."""
    proc.join(timeout=grace_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if proc.start_time is not None and _start_time(proc.pid) == proc.start_time:
        os.kill(proc.pid, signal.SIGKILL)
        while _start_time(proc.pid) == proc.start_time:  # gone, or a zombie of its new parent
            if _is_zombie(proc.pid):
                break
            time.sleep(0.01)


def _is_zombie(pid):
    fields = _stat(pid)
    return fields is None or fields[0] == "Z"


def _entry(rank, world, store_path, fn, args, results, env, backend):
    os.environ.update(env(rank) if callable(env) else env)
    try:
        if backend != "gloo":
            import ringreduce  # noqa: F401  (registers the ringreduce backend)
        store = dist.FileStore(store_path, world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        results.put((rank, True, fn(rank, world, *args)))
    except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _collect(results, procs, expected, dying, timeout):
    """{rank: (ok, value)} for every rank but the dying; raises as soon as a rank has exited without a
    result (its traceback went to the caller's stderr), or when timeout passes."""
    outcomes = {}
    deadline = time.monotonic() + timeout
    exited_at = {}
    while len(outcomes) < expected:
        try:
            rank, ok, value = results.get(timeout=EXIT_POLL_S)
            outcomes[rank] = (ok, value)
            continue
        except queue_module.Empty:
            pass
        now = time.monotonic()
        for rank, proc in enumerate(procs):
            if rank not in outcomes and rank not in dying and proc.exitcode is not None:
                exited_at.setdefault(rank, now)
        silent = sorted(r for r, t in exited_at.items() if r not in outcomes and now - t > RESULT_AFTER_EXIT_S)
        if silent:
            codes = {r: procs[r].exitcode for r in silent}
            raise AssertionError(f"ranks {silent} exited without a result (exit codes {codes}); what they "
                                 f"wrote is in this test's captured stderr")
        if now > deadline:
            missing = sorted(set(range(len(procs))) - set(outcomes) - set(dying))
            raise AssertionError(f"ranks {missing} gave no result in {timeout}s")
    return outcomes


def run_ranks(world, fn, *args, timeout=DEFAULT_RANKS_TIMEOUT_S, env=None, dying=(), backend="gloo"):
    """Return [fn(rank, world, *args) for each rank]; raise with the ranks' tracebacks on failure.

    Ranks in `dying` are expected to kill themselves: their entry in the result is their exit code.
    `env` is a dict for every rank, or a function of the rank that returns one.
    """
    results = queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [start_process(_entry, rank, world, store_path, fn, args, results, env or {}, backend)
                 for rank in range(world)]
        reported = False
        try:
            outcomes = _collect(results, procs, world - len(dying), set(dying), timeout)
            reported = True
        finally:
            for proc in procs:  # nothing may be left behind: once a rank is lost, the rest wait for it
                stop(proc, RANK_EXIT_GRACE_S if reported else 0)
        for rank in dying:
            outcomes[rank] = (True, procs[rank].exitcode)
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(outcomes.items()) if not ok]
    if failures:
        raise AssertionError("\n".join(failures))
    return [outcomes[r][1] for r in range(world)]


def kill_after_first_call(rank, world, victims):
    """Inside a rank of run_ranks: every rank all-reduces once; then, once every rank is out of that
    call, rank 0 SIGKILLs the ranks `victims` (at once). Returns the group's store."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid/{rank}", str(os.getpid()))
    dist.all_reduce(torch.ones(1000))
    store.set(f"ready/{rank}", "1")
    if rank == 0:
        store.wait([f"ready/{r}" for r in range(world)])
        for victim in victims:
            os.kill(int(store.get(f"pid/{victim}")), signal.SIGKILL)
    return store


def lost_ranks_seen_by_all(rank, world):
    """Inside a rank of run_ranks: ringreduce.lost_ranks(), returned once every rank has read its own.
    A rank that returns first exits, and the others' membership would rightly find it gone."""
    import ringreduce  # (here: the rank server itself must not import it)

    lost = ringreduce.lost_ranks()
    store = dist.distributed_c10d._get_default_store()
    store.set(f"looked/{rank}", "1")
    store.wait([f"looked/{r}" for r in range(world)])
    return lost
