"""Emulated hosts: several "hosts" on one Linux machine, for the tests and the benchmark across hosts.

Each host is a network namespace with its own hostname (UTS namespace) and its own /dev/shm (mount
and IPC namespaces), as a real host has. The hosts hang on a bridge through veth pairs; each host's
link is limited in both directions with `tbf` (`netem` is not always there, so a link is a rate,
not a delay). The bridge has no address, so nothing routes anywhere but between the hosts.

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN). Everything it makes is named with a prefix of
its own, which carries the creating process's id, and is removed on exit, on an exception, on
Ctrl-C and on SIGTERM; what a killed run left behind is removed by the next one (`sweep_stale`).

    with EmulatedHosts(2, link="2gbit") as hosts:
        procs = hosts.launch([sys.executable, "-m", "my.worker"], placement=[[0, 1], [2, 3]])
"""

import os
import re
import shutil
import signal
import subprocess
import sys

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


class EmulatedHosts:
    """`count` hosts joined by links of `link` (a tc rate: "2gbit", "500mbit"; None: unlimited)."""

    def __init__(self, count, link="2gbit"):
        if count < 1:
            raise ValueError(f"emulated hosts: need at least one host, got {count}")
        self.count = count
        self.link = link
        self.prefix = f"rr{os.getpid():x}"
        self.bridge = f"{self.prefix}b"
        self._procs = []
        self._holders = []  # per host: the process that holds its hostname and /dev/shm
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
        self._procs.append(proc)
        return proc

    def launch(self, argv, placement, port=29500, env=None, **popen):
        """Starts one process per rank, rank r on the host whose list in `placement` holds r (any
        order: [[0, 2], [1, 3]] places ranks round-robin), joined as torch.distributed's env://
        expects (MASTER_ADDR is the host of rank 0). Returns the processes by rank."""
        ranks = sorted(r for host in placement for r in host)
        if ranks != list(range(len(ranks))) or len(placement) > self.count:
            raise ValueError(f"placement {placement} must spread ranks 0..N-1 over at most {self.count} hosts")
        host_of = {r: h for h, host in enumerate(placement) for r in host}
        procs = []
        for rank in ranks:
            local = placement[host_of[rank]].index(rank)
            procs.append(self.start(host_of[rank], argv, env={
                "RANK": str(rank), "WORLD_SIZE": str(len(ranks)), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(len(placement[host_of[rank]])), "MASTER_ADDR": self.address(host_of[0]),
                "MASTER_PORT": str(port), **(env or {})}, **popen))
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
        holder = str(self._holders[host].pid)
        self._signal(signal.SIGKILL, [p for p in self._procs if p.args[2] == holder])

    def stop_host(self, host, stopped=True):
        """Every process of host `host` stopped (SIGSTOP), as a VM paused or a cgroup frozen; continued
        (SIGCONT) with stopped=False. Its kernel still answers: the link stays up."""
        holder = str(self._holders[host].pid)
        self._signal(signal.SIGSTOP if stopped else signal.SIGCONT, [p for p in self._procs if p.args[2] == holder])

    def _signal(self, signum, procs):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def close(self):
        """Stops every process started here, then removes the namespaces, links and bridge."""
        self._signal(signal.SIGTERM, self._procs)
        for proc in self._procs:
            try:
                proc.wait(timeout=TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL, [proc])
                proc.wait()
        for holder in self._holders:
            holder.kill()
            holder.wait()
        self._procs, self._holders = [], []
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
