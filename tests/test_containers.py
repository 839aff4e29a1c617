"""Two containers on one machine that share its host name and boot id (host networking, as Kubernetes'
hostNetwork pods) but each have a /dev/shm of their own: their ranks must not be put on one
shared-memory host, and every collective of the backend runs right across them. Each container is
emulated with unshare: mount and pid namespaces of its own, with a fresh tmpfs on /dev/shm."""

import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import namespaces_unavailable

TESTS = os.path.dirname(os.path.abspath(__file__))
# Starting 4 ranks (torch imported 4 times) and running every collective at 16 MiB, on 2 cores
# (about 20 s here).
LAUNCH_TIMEOUT_S = 180
RANKS_PER_CONTAINER = 2
# The containers' /dev/shm mounts are named this, so a leftover mount is recognisable (each lives only
# as long as its mount namespace, which ends with the container).
SHM_MOUNT_NAME = "ringreduce-test-container-shm"


pytestmark = pytest.mark.skipif(namespaces_unavailable() is not None, reason=str(namespaces_unavailable()))


def _container(ranks, port, world):
    """A shell in mount and pid namespaces of its own, with a fresh /dev/shm, running one worker per rank."""
    # Each worker started in the background, then waited for in turn: the shell fails if any did.
    starts = "".join(f"RANK={r} {sys.executable} {TESTS}/hosts_worker.py every & pids=\"$pids $!\"; " for r in ranks)
    script = (f"mount -t tmpfs -o size=512m {SHM_MOUNT_NAME} /dev/shm || exit 1; pids=; {starts}"
              f"failed=0; for p in $pids; do wait $p || failed=1; done; exit $failed")
    # No empty entry in PYTHONPATH: it would put the working folder (the source tree) on the path.
    paths = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": paths,
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           # The test process holds the store: every rank is its client (no port picked ahead of time).
           "TORCHELASTIC_USE_AGENT_STORE": "True", "RINGREDUCE_DEBUG": "INFO"}
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
                             "sh", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_containers_that_share_a_host_name_but_not_dev_shm_run_every_collective_right():
    world = 2 * RANKS_PER_CONTAINER
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    containers = [_container(range(c * RANKS_PER_CONTAINER, (c + 1) * RANKS_PER_CONTAINER), store.port, world)
                  for c in range(2)]
    results, said = [], ""
    try:
        for container in containers:
            out, err = container.communicate(timeout=LAUNCH_TIMEOUT_S)
            assert container.returncode == 0, err[-3000:]  # a rank that raised exits non-zero
            results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            said += err
    finally:
        for container in containers:
            container.kill()
            container.wait()
    results.sort(key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == list(range(world)), said[-3000:]
    assert [r["failed"] for r in results] == [[]] * world, results
    hosts = [r["host"] for r in results]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts  # one host per container...
    assert hosts[0].rsplit("/", 1)[0] == hosts[2].rsplit("/", 1)[0], hosts  # ...on one machine
    assert all(r["pid"] <= 2 * RANKS_PER_CONTAINER + 1 for r in results), results  # pids of their own
    assert "do not share /dev/shm" in said and "each /dev/shm is a host of its own" in said, said[-3000:]
