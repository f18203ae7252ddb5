"""The sharding run's worker processes (beam_preprocess.processes): results, errors, a process that dies, the end."""

import os
import signal
import time

import pytest

from beam_preprocess import processes, spill
from effnet_common import stopping


@pytest.fixture(autouse=True)
def _tasks_importable_by_the_workers(monkeypatch):
    """The tasks below are functions of this module: the worker processes import it from the tests folder."""
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.abspath(__file__)))


def test_tasks_run_on_the_pool_processes_and_come_back_in_their_futures():
    pool = processes.Pool(2)
    try:
        squares = [pool.submit(pow_two, n) for n in range(20)]
        assert [f.result(timeout=60) for f in squares] == [n * n for n in range(20)]
        pids = {f.result(timeout=60) for f in [pool.submit(pid_of_worker, None) for _ in range(20)]}
        assert os.getpid() not in pids and len(pids) <= 2
    finally:
        pool.close()
    assert all(worker.process.poll() is not None for worker in pool._workers)


def pow_two(n):
    return n * n


def pid_of_worker(_):
    time.sleep(0.01)
    return os.getpid()


def fail_as_a_changed_source(path):
    raise spill.ChangedSourceError(f"{path} changed while the run was going: the bytes differ")


def die(_):
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_error_comes_back_as_raised_and_the_process_goes_on():
    pool = processes.Pool(1)
    try:
        with pytest.raises(spill.ChangedSourceError, match="a.tar changed while the run was going"):
            pool.submit(fail_as_a_changed_source, "a.tar").result(timeout=60)
        assert pool.submit(pow_two, 3).result(timeout=60) == 9
    finally:
        pool.close()


def test_a_process_that_dies_fails_its_task_and_the_others_take_the_rest():
    pool = processes.Pool(2)
    try:
        with pytest.raises(processes.WorkerDied, match="ended during a task"):
            pool.submit(die, None).result(timeout=60)
        assert [pool.submit(pow_two, n).result(timeout=60) for n in range(5)] == [0, 1, 4, 9, 16]
        with pytest.raises(processes.WorkerDied):
            pool.submit(die, None).result(timeout=60)
        # None is left: a task fails at once instead of waiting for ever.
        with pytest.raises(processes.WorkerDied, match="every worker process"):
            pool.submit(pow_two, 2).result(timeout=60)
    finally:
        pool.close()


def test_the_processes_end_at_sigint_and_with_the_process_that_started_them():
    pool = processes.Pool(1)
    (worker,) = pool._workers
    assert pool.submit(pow_two, 2).result(timeout=60) == 4
    os.kill(worker.process.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches every process of its group
    assert worker.process.wait(timeout=30) == stopping.STOPPED_EXIT
    pool.close()


def test_one_shared_pool_per_size_until_closed():
    try:
        assert processes.shared_pool(1) is processes.shared_pool(1)
        first = processes.shared_pool(1)
    finally:
        processes.close_shared_pools()
    try:
        assert processes.shared_pool(1) is not first
    finally:
        processes.close_shared_pools()
