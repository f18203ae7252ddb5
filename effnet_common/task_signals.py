"""A pipeline task's stop: SIGTERM (Kubernetes ending the pod, Vertex cancelling the run) or SIGINT while a
step follows its cloud job or TPU slice, raised as ``TaskStopped`` where the step's own code can act on it.

A handler that raised wherever the main thread is could be swallowed by a library's ``except Exception``, or
land between a lock's acquire and its ``try`` and leave the lock held (docs/vertex.md). So the handler only
notes the signal, and ``TaskStopped`` is raised where the step waits:

- in ``wait(seconds)``, the follower's sleep between two reads, at once (the signal interrupts the sleep);
- in ``check()``, after each read and before each retry of a failed read (``cloud_retry.Patience``);
- inside ``held()`` (a create call in flight, whose answer names what it made) not at all: on its way out.

``anywhere=True`` raises wherever the signal arrives, for a wait in a library's own loop of sleeps (Beam's
``wait_until_finish``). One ``StopSignals`` is installed at a time (handlers belong to the process), and
``check_stop()`` asks it.
"""

from __future__ import annotations

import contextlib
import signal
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TaskStopped(RuntimeError):
    """The process was told to stop (SIGTERM / SIGINT) while its cloud job or slice ran."""


_installed: StopSignals | None = None


class StopSignals:
    """SIGTERM / SIGINT noted while ``installed()``; raised as ``TaskStopped`` by ``wait`` and ``check``."""

    def __init__(self, anywhere: bool = False):
        self.received: int | None = None
        self._anywhere = anywhere
        self._waiting = False
        self._holding = False
        self._ignoring = False
        self._previous: dict = {}

    def _handle(self, signum, frame):
        self.received = self.received or signum
        if (self._waiting or self._anywhere) and not self._holding:
            raise self.stopped()

    def stopped(self) -> TaskStopped:
        return TaskStopped(f"the pipeline task received {signal.Signals(self.received).name}")

    @contextlib.contextmanager
    def installed(self):
        global _installed
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        outer, _installed = _installed, self
        try:
            yield self
        finally:
            _installed = outer
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    def check(self) -> None:
        """Raises ``TaskStopped`` if a signal has arrived (and the clean-up has not begun: ``ignore``)."""
        if self.received is not None and not self._ignoring and not self._holding:
            raise self.stopped()

    def wait(self, seconds: float) -> None:
        """Sleeps ``seconds``; a signal, arrived or arriving, ends the sleep as ``TaskStopped``."""
        self._waiting = True
        try:
            self.check()
            time.sleep(seconds)
        finally:
            self._waiting = False
        self.check()

    @contextlib.contextmanager
    def held(self, raise_after: bool = True):
        """A signal arriving inside is noted only; it is raised when the block is left (after its call has
        answered), unless ``raise_after`` is False (the caller then reads ``received``)."""
        self._holding = True
        try:
            yield
        except Exception as error:
            self._holding = False
            if self.received is not None and raise_after:
                raise self.stopped() from error
            raise
        finally:
            self._holding = False
        if raise_after:
            self.check()

    def ignore(self) -> None:
        """The clean-up begins: a second signal must not interrupt it, nor the first be raised again."""
        self._ignoring = True
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def ignoring():
    """Inside, SIGTERM / SIGINT are ignored (a clean-up that a second signal must not interrupt); the handlers
    before are restored after."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_stop() -> None:
    """Raises ``TaskStopped`` if the installed ``StopSignals`` (if any) has noted a signal."""
    if _installed is not None:
        _installed.check()
