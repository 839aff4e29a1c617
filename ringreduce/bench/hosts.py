"""Emulated hosts: several "hosts" on one Linux machine, for the tests and the benchmark across hosts.

Each host is a network namespace with its own hostname (UTS namespace) and its own /dev/shm (mount
and IPC namespaces), as a real host has. The hosts hang on a bridge through veth pairs; each host's
link is limited in both directions with `tbf` (`netem` is not always there, so a link is a rate,
not a delay). The bridge has no address, so nothing routes anywhere but between the hosts.

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). Everything it makes is named with a prefix of
its own, which carries the creating process's id, and is removed on exit, on an exception, on
Ctrl-C and on SIGTERM; what a killed run left behind is removed by the next one (`sweep_stale`).

`launch` starts a job's ranks from one process that imported torch once, forking each rank into its
host's namespaces: starting an interpreter and importing torch costs 2-3 s of a core here, and a
16-rank job paid it 16 times.

    with EmulatedHosts(2, link="2gbit") as hosts:
        procs = hosts.launch([sys.executable, "-m", "my.worker"], placement=[[0, 1], [2, 3]])
"""

import atexit
import ctypes
import json
import os
import random
import re
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time

# The hosts' addresses: 10.213.0.(h+1)/24 inside their own namespaces only (the bridge has none,
# and no namespace has a route beyond the subnet).
SUBNET = "10.213.0"
# The name of each host's interface inside its namespace (GLOO_SOCKET_IFNAME).
INTERFACE = "eth0"
# tbf's bucket and queue: a 256 KiB burst lets one TCP stream reach the rate (0.24 GB/s at 2 Gbit/s
# measured here), and 20 ms of queue drops nothing at these rates.
TBF_BURST = "256kb"
TBF_LATENCY = "20ms"
# Names start with "rr", then the creating pid in hex: sweep_stale() finds those whose creator is gone.
_NAME = re.compile(r"^rr([0-9a-f]+)[hvb]")
# How long a launched rank gets to leave after SIGTERM before it is killed.
TERMINATE_GRACE_S = 5
# What the starter of a launch imports before it forks the ranks: the imports every rank makes and
# that cost nearly all of an interpreter's start (torch: 2-3 s of a core here; ringreduce, 0.03 s,
# is left to each rank, which loads its engine under its own environment).
PRELOADED = ("torch", "torch.distributed")
# How often a rank whose starter died is looked for until it is gone: a rare path, and a wait's
# answer need not come sooner than this.
ORPHAN_POLL_S = 0.1
# The namespaces a rank enters, those of its host's holder process (the mount namespace last: it
# resets the folder, which the rank then sets).
NAMESPACES = ("net", "uts", "ipc", "mnt")


def available():
    """None where emulated hosts can run here, else the reason they cannot."""
    if sys.platform != "linux":
        return "emulated hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        return f"emulated hosts need {', '.join(missing)} (iproute2, util-linux)"
    return None


def _run(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers():
    """Namespaces and links of emulated hosts that exist now (any creator)."""
    names = _run("ip", "netns", "list", check=False).stdout.split()
    names += [line.split(":")[1].strip().split("@")[0]
              for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines() if ":" in line]
    return sorted({n for n in names if _NAME.match(n)})


def sweep_stale():
    """Removes what emulated hosts of processes that no longer run left behind."""
    for name in leftovers():
        pid = int(_NAME.match(name).group(1), 16)
        if pid != os.getpid() and not _alive(pid):
            _run("ip", "netns", "del", name, check=False)
            _run("ip", "link", "del", name, check=False)


def in_order(counts):
    """A placement for EmulatedHosts.launch: counts[h] ranks on host h, numbered host by host
    ([2, 2]: [[0, 1], [2, 3]])."""
    placement, next_rank = [], 0
    for count in counts:
        placement.append(list(range(next_rank, next_rank + count)))
        next_rank += count
    return placement


class RankProcess:
    """One rank of a launch: its pid (the leader of its own process group), its pipes, and its exit
    status as its starter (the parent) saw it. Waits and reads as subprocess.Popen does."""

    def __init__(self, argv, rank, host):
        self.args, self.rank, self.host = argv, rank, host
        self.pid = self.returncode = self.stdout = self.stderr = None
        self._exited = threading.Event()
        self._readers = None  # threads reading the piped streams to their end, once communicate() starts them
        self._texts = {}

    def open_stream(self, name, how, text, theirs):
        """The rank's end of its stream `name` ("stdout", "stderr"), appended to `theirs`; where `how`
        is PIPE, ours becomes self.<name>."""
        if how == subprocess.PIPE:
            mine, their = os.pipe()
            setattr(self, name, open(mine, "r" if text else "rb"))
        elif how == subprocess.DEVNULL:
            their = os.open(os.devnull, os.O_WRONLY)
        elif how is None:
            their = os.dup(getattr(sys, name).fileno())
        else:
            their = os.dup(how if isinstance(how, int) else how.fileno())
        theirs.append(their)
        return their

    def exited(self, returncode):
        self.returncode = returncode
        self._exited.set()

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout=None):
        """(stdout, stderr) read to their end, the ones piped (None for the others), once the rank exited."""
        if self._readers is None:
            self._readers = [threading.Thread(target=self._read_all, args=(stream,), daemon=True)
                             for stream in (self.stdout, self.stderr) if stream is not None]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tuple(None if stream is None else self._texts[stream] for stream in (self.stdout, self.stderr))

    def _read_all(self, stream):
        self._texts[stream] = stream.read()


def _hear_exits(starter, procs):
    """Reads the starter's lines about exits: each rank's status, as it happens. Should the starter
    die first, a rank it did not report reads, once gone, as exited with the starter's own status."""
    by_rank = {proc.rank: proc for proc in procs}
    for line in starter.stdout:
        said = json.loads(line)
        by_rank.pop(said["rank"]).exited(said["returncode"])
    status = starter.wait()
    for proc in by_rank.values():
        while _running(proc.pid):
            time.sleep(ORPHAN_POLL_S)
        proc.exited(status)


def _running(pid):
    """Whether process `pid` runs (a zombie does not: an orphan's new parent may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


class EmulatedHosts:
    """`count` hosts joined by links of `link` (a tc rate: "2gbit", "500mbit"; None: unlimited)."""

    def __init__(self, count, link="2gbit"):
        if count < 1:
            raise ValueError(f"emulated hosts: need at least one host, got {count}")
        self.count = count
        self.link = link
        self.prefix = f"rr{os.getpid():x}"
        self.bridge = f"{self.prefix}b"
        self._procs = []  # (host, process) of every process started on a host
        self._holders = []  # per host: the process that holds its hostname and /dev/shm
        self._starters = []  # per launch: the process that forked its ranks
        self._made = False
        self._previous_sigterm = None

    def namespace(self, host):
        return f"{self.prefix}h{host}"

    def address(self, host):
        return f"{SUBNET}.{host + 1}"

    def __enter__(self):
        reason = available()
        if reason:
            raise RuntimeError(reason)
        sweep_stale()
        self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._made = True
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for host in range(self.count):
                self._make_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def _make_host(self, host):
        ns, veth = self.namespace(host), f"{self.prefix}v{host}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", INTERFACE, "netns", ns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        inside = ("ip", "netns", "exec", ns)
        _run(*inside, "ip", "addr", "add", f"{self.address(host)}/24", "dev", INTERFACE)
        _run(*inside, "ip", "link", "set", INTERFACE, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        if self.link:
            # The namespace's side limits what the host sends; the bridge's side what it receives.
            shape = ("root", "tbf", "rate", self.link, "burst", TBF_BURST, "latency", TBF_LATENCY)
            _run("tc", "qdisc", "add", "dev", veth, *shape)
            _run(*inside, "tc", "qdisc", "add", "dev", INTERFACE, *shape)
        # A process that holds the host's own hostname, /dev/shm and IPC namespace, which every
        # process of the host then enters (each unsharing its own would give each its own /dev/shm).
        holder = subprocess.Popen(
            [*inside, "unshare", "--uts", "--mount", "--ipc", "--", "sh", "-c",
             f"hostname {self.prefix}-host{host} && mount -t tmpfs tmpfs /dev/shm && echo ready && exec sleep infinity"],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        self._holders.append(holder)
        if holder.stdout.readline().strip() != "ready":
            raise RuntimeError(f"emulated host {host}: could not set its hostname and /dev/shm (exit {holder.wait()})")

    def set_link(self, host, up):
        """Takes host `host`'s link down (or up again): its cable pulled, from the bridge's side."""
        _run("ip", "link", "set", f"{self.prefix}v{host}", "up" if up else "down")

    def start(self, host, argv, env=None, **popen):
        """Runs `argv` on host `host`: its own hostname and /dev/shm, its environment `env` (added to ours)."""
        holder = str(self._holders[host].pid)
        # (nsenter --mount starts in /: --wd keeps the caller's folder)
        wrapped = ["nsenter", "--target", holder, "--net", "--uts", "--mount", "--ipc",
                   f"--wd={popen.pop('cwd', None) or os.getcwd()}", "--", *argv]
        proc = subprocess.Popen(wrapped, env={**os.environ, "GLOO_SOCKET_IFNAME": INTERFACE, **(env or {})},
                                start_new_session=True, **popen)
        self._procs.append((host, proc))
        return proc

    def launch(self, argv, placement, port=29500, env=None, stdout=None, stderr=None, text=False, cwd=None):
        """Starts one process per rank, rank r on the host whose list in `placement` holds r (any
        order: [[0, 2], [1, 3]] places ranks round-robin), joined as torch.distributed's env://
        expects (MASTER_ADDR is the host of rank 0). `argv` is `python script.py ...` or `python -m
        module ...`: one starter imports torch and forks every rank (RankProcess). stdout, stderr:
        None (ours), subprocess.PIPE or DEVNULL, or a file. Returns the processes by rank."""
        ranks = sorted(r for host in placement for r in host)
        if ranks != list(range(len(ranks))) or len(placement) > self.count:
            raise ValueError(f"placement {placement} must spread ranks 0..N-1 over at most {self.count} hosts")
        if len(argv) < 2 or argv[1] == "-m" and len(argv) < 3 or argv[1].startswith("-") and argv[1] != "-m":
            raise ValueError(f"launch runs `python script.py ...` or `python -m module ...`, not {argv}")
        host_of = {r: h for h, host in enumerate(placement) for r in host}
        shared = {"GLOO_SOCKET_IFNAME": INTERFACE, "WORLD_SIZE": str(len(ranks)),
                  "MASTER_ADDR": self.address(host_of[0]), "MASTER_PORT": str(port), **(env or {})}
        procs, specs, theirs = [], [], []
        for rank in ranks:
            ranks_here = placement[host_of[rank]]  # the ranks of this rank's host
            proc = RankProcess(argv, rank, host_of[rank])
            ends = [proc.open_stream(name, how, text, theirs) for name, how in (("stdout", stdout), ("stderr", stderr))]
            specs.append({"rank": rank, "holder": self._holders[host_of[rank]].pid, "streams": ends,
                          "env": {"RANK": str(rank), "LOCAL_RANK": str(ranks_here.index(rank)),
                                  "LOCAL_WORLD_SIZE": str(len(ranks_here))}})
            procs.append(proc)
        job = {"argv": [os.fspath(a) for a in argv[1:]], "cwd": os.fspath(cwd or os.getcwd()), "ranks": specs}
        try:  # (argv[0] is taken to be Python: the starter is this one)
            starter = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=theirs,
                env={**os.environ, **shared}, cwd=cwd, start_new_session=True)
        finally:
            for fd in theirs:
                os.close(fd)
        self._starters.append(starter)
        starter.stdin.write(json.dumps(job).encode())
        starter.stdin.close()
        forked = []
        for proc in procs:  # each rank's pid, in order, once forked
            said = starter.stdout.readline()
            if not said:
                break
            proc.pid = json.loads(said)["pid"]
            forked.append(proc)
            self._procs.append((proc.host, proc))
        threading.Thread(target=_hear_exits, args=(starter, forked), daemon=True).start()
        if len(forked) < len(procs):
            raise RuntimeError(f"emulated hosts: the ranks' starter exited {starter.wait()} before it forked "
                               f"rank {len(forked)} (its error is above)")
        return procs

    def torchrun(self, argv, per_host, port=29500, env=None, **popen):
        """torchrun on each host (--nnodes count --node-rank h --nproc-per-node per_host) running `argv`."""
        return [self.start(host, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.count),
                                  "--node-rank", str(host), "--nproc-per-node", str(per_host),
                                  "--master-addr", self.address(0), "--master-port", str(port), *argv],
                           env=env, **popen)
                for host in range(self.count)]

    def kill_host(self, host):
        """Every process of host `host` killed at once (SIGKILL), as a machine that loses power."""
        self._signal(signal.SIGKILL, [p for h, p in self._procs if h == host])

    def stop_host(self, host, stopped=True):
        """Every process of host `host` stopped (SIGSTOP), as a VM paused or a cgroup frozen; continued
        (SIGCONT) with stopped=False. Its kernel still answers: the link stays up."""
        self._signal(signal.SIGSTOP if stopped else signal.SIGCONT, [p for h, p in self._procs if h == host])

    def _signal(self, signum, procs):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def close(self):
        """Stops every process started here, then removes the namespaces, links and bridge."""
        procs = [proc for _, proc in self._procs]
        self._signal(signal.SIGTERM, procs)
        for proc in procs:
            try:
                proc.wait(timeout=TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL, [proc])
                proc.wait()
        for starter in self._starters:  # it leaves once its ranks have
            try:
                starter.wait(timeout=TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                starter.kill()
                starter.wait()
        for holder in self._holders:
            holder.kill()
            holder.wait()
        self._procs, self._holders, self._starters = [], [], []
        if self._made:
            for host in range(self.count):
                # The pair first: a namespace goes only when the kernel gets to it, and its end of the pair with it.
                _run("ip", "link", "del", f"{self.prefix}v{host}", check=False)
                _run("ip", "netns", "del", self.namespace(host), check=False)
            _run("ip", "link", "del", self.bridge, check=False)
            self._made = False
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def __exit__(self, *exc):
        self.close()
        return False


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through EmulatedHosts.__exit__, which removes everything


def _enter(holder):
    """Joins the namespaces of the process `holder` (this process must have one thread: a fork's child)."""
    setns = ctypes.CDLL(None, use_errno=True).setns
    for kind in NAMESPACES:
        fd = os.open(f"/proc/{holder}/ns/{kind}", os.O_RDONLY)
        try:
            if setns(fd, 0) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"emulated host: cannot enter the {kind} namespace of process {holder}")
        finally:
            os.close(fd)


def _become_rank(job, spec):
    """In a forked child: the rank `spec` of `job`, run as `python <job argv>` would run it on its host."""
    os.setsid()  # its own process group, which kill_host and stop_host signal
    null = os.open(os.devnull, os.O_RDONLY)
    for target, fd in enumerate([null, *spec["streams"]]):
        os.dup2(fd, target)
    for other in _stream_fds(job) | {null}:
        os.close(other)
    _enter(spec["holder"])
    os.chdir(job["cwd"])
    os.environ.update(spec["env"])
    # A fresh interpreter seeds these from the OS; forked ones would share the starter's state.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    # The C library's exit: its atexit handlers (ringreduce's own among them) and the static
    # destructors run, as after any interpreter's end; the GIL stays held (PyDLL) while they do.
    ctypes.PyDLL(None).exit(_run_as_main(job["argv"]))


def _run_as_main(argv):
    """Runs `python <argv>`'s script or module as __main__ and does what the interpreter does when it
    ends (an uncaught exception's traceback, the threads joined, atexit, the streams flushed), short of
    tearing down every module: in a child forked after torch's import that teardown writes to most
    pages of the heap it shares with the starter (an exit took 0.84 s of a core with it, 0.25 without).
    Returns the exit status the interpreter would give."""
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            if not sys.flags.safe_path:
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        status = 0
    except SystemExit as leaving:
        if leaving.code is None or isinstance(leaving.code, int):
            status = leaving.code or 0
        else:  # sys.exit("a message"): the message on stderr, status 1
            print(leaving.code, file=sys.stderr)
            status = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # non-daemon threads joined, as at the end of a script (multiprocessing does the same)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the script, or its reader gone
            pass
    return status


def _start_ranks():
    """The starter of a launch (`python -m ringreduce.bench.hosts`): the job (argv, folder, and per
    rank its host's holder, streams and environment) on stdin; imports torch once, forks every rank,
    and says on stdout each rank's pid, then each exit status (as subprocess's returncode)."""
    job = json.load(sys.stdin)
    for name in PRELOADED:
        __import__(name)
    ranks = {}
    for spec in job["ranks"]:
        pid = os.fork()
        if pid == 0:
            _become_rank(job, spec)  # exits as the interpreter does: atexit, then the script's status
        ranks[pid] = spec["rank"]
        _say({"rank": spec["rank"], "pid": pid})
    for fd in _stream_fds(job):
        os.close(fd)  # each rank's streams end when it does, not when the last rank has
    while ranks:
        pid, status = os.wait()
        if pid in ranks:
            _say({"rank": ranks.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})


def _stream_fds(job):
    """The starter's descriptors of every rank's streams (a rank keeps only its own, as 1 and 2)."""
    return {fd for spec in job["ranks"] for fd in spec["streams"]}


def _say(record):
    os.write(1, (json.dumps(record) + "\n").encode())  # unbuffered: a forked rank inherits no pending line


if __name__ == "__main__":
    _start_ranks()
