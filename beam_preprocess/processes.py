"""Worker processes of the run's own, for a DirectRunner whose workers are threads.

With ``--direct_running_mode multi_threading`` (the recommended mode: its workers start at once), Beam's
workers are threads of one process. Decoding runs without the GIL, but reading archive members, PIL's header
parsing, framing Examples, the spill and writing shards hold it, so two worker threads on two cores queue
behind each other. Each whole work unit and shard therefore goes to a process of a small pool (one per core,
started with the run); only a unit's description and a few numbers cross the pipe (``beam_preprocess.work``),
never an image. What it buys: docs/performance.md, 'Sharding' (``benchmarks/preprocess.py``).

The processes are ``python -m beam_preprocess.processes``: they import only what the work needs (no
TensorFlow, no Beam unless a path is on an object store), end at once on Ctrl-C or when their parent ends
(``effnet_common.stopping``), and exchange pickled ``(function, argument)`` / ``(ok, value)`` pairs on pipes
of their own. A thread in the parent feeds each process from one shared queue, so a run's threads may keep
several tasks in flight (``Pool.submit``) and no process waits while another has work queued.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable

# The length prefix of a message on a worker's pipes.
_LENGTH = struct.Struct("<Q")


class WorkerDied(RuntimeError):
    """A worker process ended while it had a task (killed, out of memory): the task's error."""


def _send(pipe, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LENGTH.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _receive(pipe):
    header = pipe.read(_LENGTH.size)
    if len(header) != _LENGTH.size:
        raise EOFError("the worker process's pipe closed")
    (length,) = _LENGTH.unpack(header)
    data = pipe.read(length)
    if len(data) != length:
        raise EOFError("the worker process's pipe closed mid-message")
    return pickle.loads(data)


class _Worker:
    """One worker process and the thread of this process that feeds it from the pool's queue."""

    def __init__(self, tasks: queue.SimpleQueue, index: int, on_death: Callable[[], None]):
        from effnet_common import stopping

        self._tasks = tasks
        self._on_death = on_death
        self.process = subprocess.Popen(
            [sys.executable, "-m", "beam_preprocess.processes"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=stopping.child_environment(os.environ),
        )
        self._thread = threading.Thread(
            target=self._serve, name=f"beam_preprocess-process-{index}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, fn, argument = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                _send(self.process.stdin, (fn, argument))
                ok, value = _receive(self.process.stdout)
            except (OSError, EOFError, pickle.PickleError) as e:
                future.set_exception(
                    WorkerDied(
                        f"worker process {self.process.pid} ended during a task ({type(e).__name__}: {e})"
                    )
                )
                self._on_death()  # the others take the rest
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def close(self) -> None:
        """Ends the process (its stdin closes: it exits after its task) and waits for it."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.process.stdout.close()


class Pool:
    """``processes`` worker processes; ``submit(fn, argument)`` runs ``fn(argument)`` on one of them.

    ``fn`` must be a module-level function and ``argument`` and the result picklable. An exception of ``fn``
    is raised by the future as it was raised (the worker's traceback goes to its stderr); a worker that dies
    fails its task with ``WorkerDied``.
    """

    def __init__(self, processes: int):
        if processes < 1:
            raise ValueError(f"a pool needs at least one process, got {processes}")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._alive = processes
        self._alive_lock = threading.Lock()
        self._closed = False
        self._workers = [_Worker(self._tasks, i, self._worker_died) for i in range(processes)]

    @property
    def size(self) -> int:
        return len(self._workers)

    def submit(self, fn: Callable, argument) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("the pool is closed")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._alive_lock:
            if not self._alive:
                future.set_exception(WorkerDied("every worker process of the pool has ended"))
                return future
            self._tasks.put((future, fn, argument))
        return future

    def _worker_died(self) -> None:
        """A worker ended: once none is left, the tasks still queued fail instead of waiting for ever."""
        with self._alive_lock:
            self._alive -= 1
            if self._alive:
                return
        with contextlib.suppress(queue.Empty):
            while True:
                task = self._tasks.get_nowait()
                if task is not None and task[0].set_running_or_notify_cancel():
                    task[0].set_exception(WorkerDied("every worker process of the pool has ended"))

    def close(self) -> None:
        """Lets every worker finish its task, then ends the processes."""
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._tasks.put(None)
        for worker in self._workers:
            worker.close()
        with contextlib.suppress(queue.Empty):  # tasks submitted but never started: none should be left
            while True:
                task = self._tasks.get_nowait()
                if task is not None:
                    task[0].cancel()


_lock = threading.Lock()
_pools: dict[int, Pool] = {}


def shared_pool(processes: int) -> Pool:
    """The pool of ``processes`` processes of this process, started on first use; every DoFn instance and Beam
    worker thread of the process shares it."""
    with _lock:
        pool = _pools.get(processes)
        if pool is None:
            pool = _pools[processes] = Pool(processes)
        return pool


def close_shared_pools() -> None:
    """Ends the shared pools (a run's end); the next ``shared_pool`` starts new ones."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


# -- the worker process


def _serve_forever(requests, replies) -> None:
    while True:
        try:
            fn, argument = _receive(requests)
        except EOFError:
            return  # the pool closed this process's stdin, or its parent ended
        try:
            reply = (True, fn(argument))
        except Exception as e:  # noqa: BLE001 - every error goes back to the task's caller
            # The traceback goes to the command's log; the exception itself goes back unchanged (runners
            # rebuild it with their own context, which notes would garble).
            print(
                f"worker process {os.getpid()}: the task failed:\n{traceback.format_exc()}", file=sys.stderr
            )
            reply = (False, e)
        try:
            _send(replies, reply)
        except (pickle.PickleError, TypeError, AttributeError):  # an exception that does not pickle
            _send(replies, (False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))


def main() -> None:
    from beam_preprocess import lean_imports
    from effnet_common import stopping

    # The terminal's Ctrl-C reaches every process of its group: this one ends at once and quietly (the command
    # that started it says what happened and removes what the unfinished task wrote); so it does when that
    # command ends in any other way.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(stopping.STOPPED_EXIT))
    stopping.die_with_parent()
    lean_imports.install()
    # The messages travel on the pipes the pool gave as stdin and stdout; whatever the work would print goes
    # to stderr (the command's log) instead.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    from beam_preprocess import work  # noqa: F401 - imported once, before the first task

    _serve_forever(sys.stdin.buffer, replies)


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
