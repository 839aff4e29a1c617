"""Run a function on N processes joined by a process group (gloo unless told), and collect what each returns.

The ranks are forked from a server process that has imported torch and ringreduce once (multiprocessing's
forkserver), instead of each spawned rank importing them again: a few seconds of CPU saved per rank. Each
rank still starts fresh: its own process, the caller's environment, folder and output, a new group."""

import os
import tempfile
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

# How long the ranks of one call may take in all: the slowest such test took about 25 s on 2026-12-03.
DEFAULT_RANKS_TIMEOUT_S = 240
# What the server imports before it forks any rank: what every rank of every test imports.
PRELOADED = ["torch", "torch.distributed", "ringreduce", "pytest", "multiproc", "reference"]

_context = mp.get_context("forkserver")
_context.set_forkserver_preload(PRELOADED)


def queue():
    """A queue that the processes of start_process can put into."""
    return _context.Queue()


def _write_where_the_caller_writes(caller):
    """The server's stdout and stderr are the ones it started with (another test's capture, say): point them
    at the caller's, as spawn would have inherited them. Appending, since the caller's capture may rewind."""
    for fd in (1, 2):
        try:
            theirs = os.open(f"/proc/{caller}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue  # a socket, or closed: keep the server's
        os.dup2(theirs, fd)
        os.close(theirs)


def _as_the_caller(caller, environment, target, args):
    # The server's environment is the one it started with: give the process the caller's, as spawn would.
    os.environ.clear()
    os.environ.update(environment)
    _write_where_the_caller_writes(caller)
    target(*args)


def start_process(target, *args):
    """A started process that runs target(*args) with the caller's environment, working folder, stdout
    and stderr."""
    proc = _context.Process(target=_as_the_caller, args=(os.getpid(), dict(os.environ), target, args))
    proc.start()
    return proc


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
        outcomes = {}
        try:
            for _ in range(world - len(dying)):
                rank, ok, value = results.get(timeout=timeout)
                outcomes[rank] = (ok, value)
        except Exception as error:  # queue.Empty: somebody hung or died
            raise AssertionError(f"ranks {sorted(set(range(world)) - set(outcomes))} gave no result in {timeout}s") from error
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():  # nothing may be left behind, hung or not
                    proc.kill()
                    proc.join()
        for rank in dying:
            outcomes[rank] = (True, procs[rank].exitcode)
    failures = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(outcomes.items()) if not ok]
    if failures:
        raise AssertionError("\n".join(failures))
    return [outcomes[r][1] for r in range(world)]
