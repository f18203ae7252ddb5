"""Ctrl-C: a command stops in one line, within about a second, leaving nothing temporary behind.

Ctrl-C ends every command the same way, wherever it is: its child processes are stopped, the clean-ups the
running code registered run (``cleanup``), one line says what was kept and what to run next (``describe``),
the log is completed, and the process exits with ``STOPPED_EXIT`` (130, the shell's status for SIGINT).

Not Python's ``KeyboardInterrupt``: it reaches a main thread inside a long native call (a TensorFlow call that
trains a whole evaluation interval, a Beam bundle) only when the call returns, then unwinds through libraries
that print, wrap or wait on it. Here a thread of its own reads the signal (``signal.set_wakeup_fd``), stops
the command and ends the process with ``os._exit``: what a SIGKILL leaves consistent stays so, and what only a
clean exit removes (TensorFlow's autograph sources) is removed. ``arm`` is called by
``effnet_common.console.session`` in a command's own process, never a test's (a stop would end the test run);
while another handler owns SIGINT (a followed Dataflow job's: ``effnet_common.dataflow_jobs``), that one acts.
Nothing here imports TensorFlow or Beam, as Beam's worker processes import it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

STOPPED_EXIT = 130
# How long child processes get to stop on their own SIGINT before they are killed.
CHILD_GRACE_SECONDS = 1.0
# How long killed child processes get to be torn down by the kernel.
KILL_WAIT_SECONDS = 5.0
# How long the program's threads get, once a stop has begun, to make the files of the blocks they entered
# (registering their clean-up) before the clean-ups run.
SETTLE_SECONDS = 0.1
# The line's start: what the person did, then what was kept and what to run.
STOPPED = "stopped by the user"
# Set by ``child_environment`` in a child's environment (the parent's pid): the child dies with that parent.
PARENT_PID_VARIABLE = "EFFNET_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_order = itertools.count()
_cleanups: dict[int, Callable[[], None]] = {}
_descriptions: dict[int, Callable[[], str]] = {}
_armed: _Armed | None = None


@contextlib.contextmanager
def cleanup(remove: Callable[[], None]) -> Iterator[None]:
    """Runs ``remove`` if the command is stopped inside the block (latest first); nothing otherwise.

    ``remove`` runs on the stopping thread while the rest of the program may still be running: it deletes
    what the block would leave half-done (and must not fail when it is not there). Once a stop has begun, a
    thread of the program that enters a block (a Beam worker thread's next spill file) or leaves one waits
    there for the process to end (``_hold_if_stopping``): nothing it would write is made after the clean-ups
    ran, and no clean-up is taken away before they run.
    """
    _hold_if_stopping()
    key = next(_order)
    with _lock:
        _cleanups[key] = remove
    try:
        yield
    finally:
        _hold_if_stopping()
        with _lock:
            _cleanups.pop(key, None)


@contextlib.contextmanager
def describe(what: str | Callable[[], str]) -> Iterator[None]:
    """Inside the block, a stop's line says ``what`` (or what ``what()`` returns at the stop) after
    ``stopped by the user: ``: what was kept and what to run. The innermost block's description wins."""
    text = what if callable(what) else (lambda: what)
    key = next(_order)
    with _lock:
        _descriptions[key] = text
    try:
        yield
    finally:
        _hold_if_stopping()
        with _lock:
            _descriptions.pop(key, None)


def _hold_if_stopping() -> None:
    """Once a stop has begun, a thread of the program (not the stopping thread) waits here for the stopping
    thread to end the process (with its line and ``STOPPED_EXIT``).

    Called where a ``cleanup`` or ``describe`` block is entered or left, and at the interpreter's exit
    (``atexit``, while armed). Leaving and exiting count because the same Ctrl-C ends the command's worker
    processes, which can fail the main thread's call at once (Beam: "Channel closed prematurely") while the
    stop is still stopping children: that error would unwind the blocks, taking away the clean-ups and the
    line the stop is about to use, and the main thread would exit first, with status 1 and nothing printed
    (docs/troubleshooting.md, "A Ctrl-C that misbehaved")."""
    if _armed is not None and _armed.started.is_set() and threading.current_thread() is not _armed.stopper:
        threading.Event().wait()  # never set: the stop ends the process


def stop_line() -> str:
    """The line a stop prints now: ``stopped by the user: <the innermost description>``."""
    with _lock:
        describers = [_descriptions[key] for key in sorted(_descriptions, reverse=True)]
    for describer in describers:
        try:
            return f"{STOPPED}: {describer()}"
        except Exception:  # noqa: BLE001 - a description that fails to compute gives way to the one around it
            logger.warning("describing the stop failed", exc_info=True)
    return f"{STOPPED}: run the same command again"


def run_cleanups() -> None:
    """Every registered clean-up, latest first; one that fails is logged and the others still run."""
    with _lock:
        removals = [_cleanups[key] for key in sorted(_cleanups, reverse=True)]
    for remove in removals:
        try:
            remove()
        except Exception:  # noqa: BLE001 - the others must still run
            logger.warning("a clean-up after Ctrl-C failed", exc_info=True)


# -- child processes (Linux: /proc; elsewhere none are known and none are stopped)


def _process_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def child_processes(pid: int | None = None) -> list[int]:
    """The live (not zombie) child processes of ``pid`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return [child for child, (parent, state) in _process_table().items() if parent == pid and state != "Z"]


def descendant_processes(pid: int | None = None) -> list[int]:
    """The live (not zombie) processes below ``pid`` (this process by default): children, their children, ...,
    parents before their children."""
    pid = os.getpid() if pid is None else pid
    table = _process_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, frontier = [], [pid]
    while frontier:
        below = [child for parent in frontier for child in sorted(children.get(parent, ()))]
        found += [child for child in below if table[child][1] != "Z"]
        frontier = below
    return found


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process now."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    table = {}
    for entry in entries:
        if entry.isdigit():
            state = _process_state(int(entry))
            if state is not None:
                table[int(entry)] = state
    return table


def stop_children(grace: float = CHILD_GRACE_SECONDS) -> None:
    """SIGINT to every process below this one (a command of this project stops as this one does; Beam's
    workers end), then SIGKILL to those still running after ``grace`` seconds; returns once each has ended.

    Grandchildren count: Beam starts each multi-process worker through ``sh -c`` (which does not exec it), so
    the worker is the shell's child, and SIGINT ends the shell at once while the worker may still be tearing
    down. The whole tree is listed before any signal, so a process whose parent ends first is still waited
    for.
    """
    processes = descendant_processes()
    for pid in processes:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    processes = _running_after(processes, grace)
    for pid in processes:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    # A killed process ends when the kernel has torn it down, not when the signal is sent: wait for that, so
    # that none is still running (its memory half released) when this process exits.
    _running_after(processes, KILL_WAIT_SECONDS)


def _running_after(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running (not ended, not zombies) once they all ended or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while pids and time.monotonic() < deadline:
        time.sleep(0.02)
        pids = [pid for pid in pids if (_process_state(pid) or (0, "Z"))[1] != "Z"]
    return pids


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process that is to die with this one: the child calls ``die_with_parent`` as it
    starts (``python -m trainer_module`` does)."""
    return {**env, PARENT_PID_VARIABLE: str(os.getpid())}


def die_with_parent() -> None:
    """In a process started with ``child_environment``: from now on it is killed (SIGKILL) when the process
    that started it ends, however that ends (Linux's parent-death signal), and it ends at once if that process
    has already gone. A search's trial, for one, must never outlive its search and write on into the directory
    a re-run of the search resumes.

    The child asks for it itself, rather than its parent between fork and exec (a ``preexec_fn``): a
    ``preexec_fn`` makes Python fork the whole parent, which runs every loaded library's fork handlers in the
    child, and gRPC's (loaded by the pipeline's libraries) can abort the child before it starts."""
    parent = os.environ.pop(PARENT_PID_VARIABLE, None)  # the child's own children do not inherit it
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent ended before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def remove_generated_sources() -> None:
    """TensorFlow's autograph sources of this process (temporary files it removes at a normal exit)."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name.startswith("__autograph_generated_file") and path:
            with contextlib.suppress(OSError):
                os.remove(path)


# -- arming


class _Armed:
    """The stopping thread of one command, and how it prints and finishes."""

    def __init__(self, quiet: Callable[[], None], report: Callable[[str], None], finish: Callable[[], None]):
        self.quiet, self.report, self.finish = quiet, report, finish
        self.started = threading.Event()
        self.stopper: threading.Thread | None = None  # the thread that stops the command
        # Never waited for: the handler may run while the main thread holds a lock.
        self._once = threading.Lock()
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self.previous_handler = signal.signal(signal.SIGINT, self._handler)
        self.previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="effnet-stop", daemon=True)
        self._thread.start()

    def _handler(self, signum, frame) -> None:
        """Python's handler (main thread, when it gets to run): no KeyboardInterrupt anywhere; the stopping
        thread is woken through the pipe (this also covers a library that replaced the wakeup descriptor)."""
        self.trigger()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            # Another handler owns SIGINT for now (a Dataflow job being cancelled): it acts, not this one.
            if signal.SIGINT in data and signal.getsignal(signal.SIGINT) == self._handler:
                self.trigger()

    def trigger(self) -> None:
        """Starts the stop once (a second Ctrl-C while stopping changes nothing)."""
        if not self._once.acquire(blocking=False):
            return
        self.stopper = threading.Thread(target=self._stop, name="effnet-stopping", daemon=True)
        self.started.set()
        self.stopper.start()

    def _stop(self) -> None:
        try:
            # From now on the program's threads, still running until the process exits, print nothing on the
            # terminal.
            self.quiet()
            logger.info("SIGINT: stopping")
            stop_children()
            # Blocks entered from now on wait (``cleanup``); one entered just before gets a moment to make its
            # file, so that its clean-up finds it. A heuristic: a thread held up longer than that between
            # entering its block and making its file would still make it after the clean-ups ran.
            time.sleep(SETTLE_SECONDS)
            run_cleanups()
            remove_generated_sources()
            line = stop_line()
            logger.info("%s", line)
            self.report(line)
            self.finish()
        except BaseException:  # noqa: BLE001 - the process must end whatever happened
            pass
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(STOPPED_EXIT)

    def disarm(self) -> None:
        if signal.getsignal(signal.SIGINT) == self._handler:
            signal.signal(signal.SIGINT, self.previous_handler)
        signal.set_wakeup_fd(self.previous_fd)
        os.close(self._write)  # the stopping thread reads the end of the pipe and returns
        self._thread.join(timeout=5)
        os.close(self._read)


def log_thread_exception(args) -> None:
    """``threading.excepthook`` of a command: a thread's failure goes to the log file (a Beam thread whose
    worker process the terminal's Ctrl-C ended fails before this process's stop has begun)."""
    logger.error(
        "thread %s failed: %s",
        getattr(args.thread, "name", "?"),
        args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def can_arm() -> bool:
    """Only the main thread can take a signal's handler."""
    return threading.current_thread() is threading.main_thread()


def arm(quiet: Callable[[], None], report: Callable[[str], None], finish: Callable[[], None]) -> None:
    """From now on, Ctrl-C stops this process: ``quiet()`` first sends whatever the program's threads print to
    the log, ``report(line)`` prints the stop's line, ``finish()`` completes the log; then the process exits
    with ``STOPPED_EXIT``. Call from the main thread of a command's process."""
    global _armed
    if _armed is None and can_arm():
        _armed = _Armed(quiet, report, finish)
        atexit.register(_hold_if_stopping)


def is_armed() -> bool:
    """Whether Ctrl-C stops this process as ``arm`` says (a command of this project's own process)."""
    return _armed is not None


def disarm() -> None:
    """Ctrl-C back to what it was before ``arm`` (unless a stop has begun: it ends the process)."""
    global _armed
    if _armed is not None and not _armed.started.is_set():
        atexit.unregister(_hold_if_stopping)
        _armed.disarm()
        _armed = None
