"""How a process of this project ends: without the interpreter's slow last garbage collection, and never
while one of its threads is still inside TensorFlow.

``exit_with(status)`` ends the program as ``sys.exit`` does, after moving what is alive into the collector's
permanent generation (``gc.freeze``): the last pass over the millions of objects a TensorFlow, TFX or Beam
process holds is most of its exit. ``atexit`` handlers still run and files are flushed and closed; only
garbage cycles among the frozen objects are left to the end of the process.

``track(thread)`` names a daemon thread that may be inside a native call when the program ends: the deletion
of a finished tf.data iterator (``trainer_module.data.release``). That deletion must not end while the
interpreter finalizes or after it: its traced functions' stack traces take the GIL from a C++ destructor,
which then aborts or finds the interpreter gone. So ``exit_with`` leaves such a program without finalizing
(``atexit`` run, streams flushed; the deletion loses nothing by ending with the process), and any other end
(a TFX entry point) waits for the tracked threads, at most ``LONGEST_WAIT_SECONDS`` (docs/performance.md).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
import time

# The longest a tracked deletion can take: tf.data's autotuning thread sleeps out its re-tuning interval (at
# most a minute) before it ends, and the deletion waits for it.
LONGEST_WAIT_SECONDS = 90.0

_tracked: list[threading.Thread] = []
_lock = threading.Lock()
_leaving_without_finalizing = False


def track(thread: threading.Thread) -> None:
    """Makes the process end only once ``thread`` has (see the module's docstring)."""
    with _lock:
        if not _tracked:
            # Registered after TensorFlow's own handlers, so it runs before them.
            atexit.register(_wait_for_tracked)
        _tracked[:] = [t for t in _tracked if t.is_alive()]
        _tracked.append(thread)


def pending() -> list[threading.Thread]:
    """The tracked threads still running."""
    with _lock:
        return [t for t in _tracked if t.is_alive()]


def _wait_for_tracked() -> None:
    if _leaving_without_finalizing:
        return
    deadline = time.monotonic() + LONGEST_WAIT_SECONDS
    for thread in pending():
        thread.join(max(0.0, deadline - time.monotonic()))
    if pending():
        print(
            f"warning: a tf.data iterator deletion still runs after {LONGEST_WAIT_SECONDS:.0f} s; "
            "the process may crash as it ends",
            file=sys.stderr,
            flush=True,
        )


def _others_running() -> bool:
    """Whether a thread the interpreter would wait for at exit (not a daemon) is still running."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def _status_code(status) -> int:
    """The process's exit status for ``sys.exit(status)``'s argument."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    print(status, file=sys.stderr)
    return 1


def exit_with(status: int | None) -> None:
    """Ends the program with ``status`` (see the module's docstring)."""
    global _leaving_without_finalizing
    gc.freeze()
    if pending() and not _others_running():
        _leaving_without_finalizing = True
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # none, closed, or its reader gone
                pass
        os._exit(_status_code(status))
    sys.exit(status)
