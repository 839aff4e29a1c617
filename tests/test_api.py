"""The Python contract: argument checks, non-contiguous tensors, async handles, build info, logging."""

import datetime
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist

import ringreduce
from multiproc import run_ranks
from reference import R


@pytest.fixture(scope="module")
def world2():
    return ringreduce.LocalWorld(2, timeout=datetime.timedelta(seconds=30))


@pytest.mark.parametrize(
    "make,op,error,match",
    [
        (lambda: torch.ones(4, dtype=torch.complex64), R.SUM, TypeError, "complex"),
        (lambda: torch.ones(4).to_sparse(), R.SUM, TypeError, "to_dense"),
        (lambda: torch.ones(4, device="meta"), R.SUM, TypeError, "meta"),
        (lambda: torch.ones(4, dtype=torch.bool), R.SUM, TypeError, "bool"),
        (lambda: torch.ones(4, dtype=torch.int32), R.AVG, TypeError, "AVG"),
        (lambda: torch.ones(4, dtype=torch.int16), R.SUM, TypeError, "int16"),
        (lambda: torch.ones(4), R.BAND, ValueError, "BAND"),
        (lambda: [1.0, 2.0], R.SUM, TypeError, "torch.Tensor, a NumPy array or a DLPack array"),
    ],
)
def test_bad_arguments_raise_and_leave_the_tensor_untouched(world2, make, op, error, match):
    tensor = make()
    before = tensor.clone() if isinstance(tensor, torch.Tensor) and not tensor.is_meta else None
    with pytest.raises(error, match=match):
        ringreduce.all_reduce(tensor, op, group=world2.group(0))
    if before is not None and before.layout == torch.strided:
        assert torch.equal(tensor, before)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"algorithm": "tree"}, "algorithm"),
        ({"transport": "carrier-pigeon"}, "transport"),
        ({"transport": "pg"}, "LocalWorld group uses transport 'local'"),
        ({"segment_bytes": 0}, "segment_bytes"),
        ({"segment_bytes": -5}, "segment_bytes"),
        ({"algorithm": "central", "root": 7}, "root"),
    ],
)
def test_bad_options_raise_value_error_before_any_data_moves(world2, kwargs, match):
    tensor = torch.arange(6.0)
    with pytest.raises(ValueError, match=match):
        ringreduce.all_reduce(tensor, group=world2.group(0), **kwargs)
    assert torch.equal(tensor, torch.arange(6.0))


def test_group_none_without_torch_distributed_says_what_to_do():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ringreduce.all_reduce(torch.ones(3))


def test_non_contiguous_tensors_are_reduced_and_written_back(world2):
    bases = [torch.arange(24, dtype=torch.float32).reshape(4, 6) * (r + 1) for r in range(2)]
    views = [b.t() for b in bases]  # transposed: not contiguous
    world2.all_reduce(views)
    expected = torch.arange(24, dtype=torch.float32).reshape(4, 6) * 3
    assert all(torch.equal(b, expected) for b in bases)
    # A strided slice: only the selected elements change.
    bases = [torch.zeros(10) + r + 1 for r in range(2)]
    world2.all_reduce([b[::3] for b in bases])
    for b in bases:
        assert b[::3].tolist() == [3.0] * 4
    assert bases[0][1::3].tolist() == [1.0] * 3 and bases[1][1::3].tolist() == [2.0] * 3


def test_async_handle_contract(world2):
    tensors = [torch.full((1000,), float(r + 1)) for r in range(2)]
    works = [ringreduce.all_reduce(t, group=g, async_op=True) for t, g in zip(tensors, world2.groups)]
    for work, tensor in zip(works, tensors):
        assert isinstance(work, dist.Work)
        work.wait()
        assert work.is_completed()
        future = work.get_future()
        # The same future type torch.distributed's own Work.get_future() returns.
        assert isinstance(future, type(torch.futures.Future().then(lambda f: None)))
        value = future.value()
        assert isinstance(value, list) and len(value) == 1 and value[0].data_ptr() == tensor.data_ptr()
        assert torch.equal(tensor, torch.full((1000,), 3.0))


def test_async_calls_complete_in_issue_order(world2):
    order = [[], []]
    lock = threading.Lock()
    works = []
    for i in range(32):
        for rank in range(2):
            tensor = torch.full((100 + 1000 * (i % 4),), float(i))
            work = ringreduce.all_reduce(tensor, group=world2.group(rank), async_op=True)

            def record(fut, rank=rank, i=i):
                with lock:
                    order[rank].append(i)
                return fut.value()

            works.append((work.get_future().then(record), tensor, i))
    for future, tensor, i in works:
        future.wait()
        assert torch.equal(tensor, torch.full_like(tensor, 2.0 * i))
    assert order[0] == list(range(32)) and order[1] == list(range(32))


def test_blocking_calls_run_after_earlier_async_ones(world2):
    first = [torch.ones(1 << 16) for _ in range(2)]
    second = [torch.ones(10) * 5 for _ in range(2)]
    works = [ringreduce.all_reduce(t, group=g, async_op=True) for t, g in zip(first, world2.groups)]
    threads = [threading.Thread(target=ringreduce.all_reduce, args=(t,), kwargs={"group": g})
               for t, g in zip(second, world2.groups)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for work in works:
        work.wait()
    assert all(torch.equal(t, torch.full((1 << 16,), 2.0)) for t in first)
    assert all(torch.equal(t, torch.full((10,), 10.0)) for t in second)


def test_tensors_that_require_grad_are_reduced_like_torch_distributed(world2):
    tensors = [torch.ones(5, requires_grad=True) for _ in range(2)]
    world2.all_reduce(tensors)
    assert all(torch.equal(t.detach(), torch.full((5,), 2.0)) for t in tensors)


def test_build_info_reports_the_build():
    info = ringreduce.build_info()
    assert set(info) >= {"version", "torch", "cuda", "nccl", "transports"}
    assert info["version"] == ringreduce.__version__
    assert info["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert isinstance(info["cuda"], bool)
    assert {"local", "pg"} <= set(info["transports"])


def _log_choice(rank, world):
    tensor = torch.ones(8)
    for _ in range(3):
        ringreduce.all_reduce(tensor)
        ringreduce.all_reduce(tensor, algorithm="central")
    return tensor.tolist()


def test_debug_info_logs_the_choice_once_per_group_and_algorithm(capfd):
    results = run_ranks(2, _log_choice, env={"RINGREDUCE_DEBUG": "INFO"})
    assert results[0] == [2.0**6] * 8
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "ringreduce INFO" in line]
    assert len(lines) == 6, err  # per rank: the transport, then each algorithm once
    assert sum("transport shm (CPU tensor, every rank on this host" in line for line in lines) == 2, err
    assert sum("algorithm auto, transport shm" in line for line in lines) == 2, err
    assert sum("algorithm central, transport shm" in line for line in lines) == 2, err


def test_build_has_cuda_and_nccl_where_the_toolchain_allows():
    import os
    import shutil

    info = ringreduce.build_info()
    buildable = torch.version.cuda is not None and shutil.which("nvcc") and os.environ.get("RINGREDUCE_CPU_ONLY") != "1"
    if not buildable:
        pytest.skip("no CUDA toolchain here: the build is CPU-only by design")
    assert info["cuda"] is True
    assert info["nccl"] and info["nccl"].count(".") == 2
    assert {"nccl", "shm", "pg", "local"} <= set(info["transports"])


# A process whose ringreduce backend is never destroyed, which logs on auto's choice and on a
# delegated op: what lives in C++ globals and in the backend outlives the interpreter.
LOGS_AND_EXITS = """
import sys, tempfile, torch, torch.distributed as dist, ringreduce
dist.init_process_group("ringreduce", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
dist.all_reduce(torch.ones(10))
dist.gather(torch.ones(1), [torch.zeros(1)], dst=0)
sys.exit(0)
"""


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
@pytest.mark.parametrize("program", ["import ringreduce", LOGS_AND_EXITS], ids=["import", "backend"])
def test_debug_logging_never_crashes_a_process_at_exit(level, program):
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RINGREDUCE_DEBUG": level})
    assert done.returncode == 0, done.stderr[-3000:]
    if program == LOGS_AND_EXITS:
        assert "ringreduce INFO auto chose" in done.stderr, done.stderr
        assert "ringreduce INFO backend rank 0/1: gather goes to gloo" in done.stderr, done.stderr
