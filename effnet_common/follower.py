"""Following a long-running cloud resource, written once for every backend.

A backend is a ``Resource``: an adapter that reads the resource's state, knows which states are ends, and asks
for its cancel (or delete). Over it this module does what every step that runs a cloud resource does: create
it once (``create``), find an earlier attempt's to go on with (``reattach``), follow it to an end
(``follow``), cancel it and wait for the end (``cancel``), and cancel it when the step is stopped or fails
while it runs (``cancelled_on_failure``). Reads wait out an outage (``cloud_retry.Patience``), calls take the
one call policy (``cloud_retry.call_retry``), and a stop is raised where the follower waits
(``task_signals``). The model is google-api-core's ``PollingFuture``, one future for the long-running
operations of every Google client.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from effnet_common import cloud_retry, task_signals

logger = logging.getLogger("effnet_common.follower")

T = TypeVar("T")

# How long a cancel is followed to the resource's end when the step is stopped: within the grace period
# Kubernetes gives a stopped pod (30 s by default); the exit task cancels whatever is left after it.
CANCEL_WAIT_SECONDS = 20.0
CANCEL_POLL_SECONDS = 2.0
# The state of a resource the API no longer knows (deleted): an end of every resource.
GONE = "GONE"
# The state of a resource whose read failed.
UNKNOWN = "UNKNOWN"


class Resource(abc.ABC):
    """One long-running cloud resource (a job, a slice, a pipeline run): what a backend's adapter provides.

    Attributes:
      what: how messages name it, e.g. 'training job projects/P/locations/L/customJobs/1'.
      ended_states: the states in which it has ended (``GONE`` always counts).
      poll_seconds: how often it is read while it runs.
      settle_seconds: how long a cancel is followed to the end when the step is not in a hurry (a stopped
        step follows it for ``CANCEL_WAIT_SECONDS``).
      cancel_words: what messages call its cancel ('cancel', 'cancelling'; a slice is deleted).
    """

    what: str = "a cloud resource"
    ended_states: tuple[str, ...] = ()
    poll_seconds: float = 30.0
    settle_seconds: float | None = None  # None: CANCEL_WAIT_SECONDS
    cancel_words: tuple[str, str] = ("cancel", "cancelling")

    @abc.abstractmethod
    def read(self) -> str:
        """One read of the resource's state (``GONE`` when the API does not know it); raises the client's
        errors, which the follower retries or waits out."""

    @abc.abstractmethod
    def request_cancel(self) -> None:
        """One request to cancel (or delete) the resource; raises the client's errors."""

    def url(self) -> str:
        """Where a person can look at it (the console page), or ''."""
        return ""

    def ended(self, state: str) -> bool:
        return state == GONE or state in self.ended_states

    def where(self) -> str:
        url = self.url()
        return f" ({url})" if url else ""


def follow(
    resource: Resource,
    patience: cloud_retry.Patience,
    stop: task_signals.StopSignals | None = None,
    on_state: Callable[[str], None] | None = None,
    until: Callable[[str], bool] | None = None,
    deadline: float | None = None,
) -> str:
    """Reads the resource every ``poll_seconds`` until it has ended (or the state is one ``until`` accepts, or
    ``time.monotonic()`` passed ``deadline``) and returns the last state; ``on_state`` is called with every
    state read (it may raise to end the follow). A read that fails is waited out as ``patience`` says, never
    taken for the resource's end.

    Raises:
      cloud_retry.Unanswered: the API did not answer, or refused, for longer than ``patience`` waits.
      task_signals.TaskStopped: ``stop`` (or the installed stop) noted SIGTERM / SIGINT.
    """
    while True:
        state = patience.read(resource.read, f"reading {resource.what}")
        if on_state is not None:
            on_state(state)
        if (until or resource.ended)(state) or (deadline is not None and time.monotonic() >= deadline):
            return state
        if stop is not None:
            stop.wait(resource.poll_seconds)
        else:
            task_signals.check_stop()
            time.sleep(resource.poll_seconds)


@dataclasses.dataclass(frozen=True)
class Cancelled:
    """What ``cancel`` did: the last state seen (an end; not yet one when the wait ran out; ``UNKNOWN`` when
    unread), and the error of a cancel request that failed (the resource may still run)."""

    state: str
    error: BaseException | None = None


def cancel(
    resource: Resource,
    wait_seconds: float | None = None,
    retry_seconds: float | None = None,
    poll_seconds: float | None = None,
) -> Cancelled:
    """Asks for the resource's cancel and reads it until it has ended, for at most ``wait_seconds`` (by
    default its ``settle_seconds``), every ``poll_seconds`` (``CANCEL_POLL_SECONDS``). Transient errors of the
    request are retried for ``retry_seconds`` (by default ``wait_seconds``). A resource that had ended already
    stays as it ended. Best effort: whatever fails is logged and reported, never raised (the step is ending
    anyway)."""
    wait = wait_seconds if wait_seconds is not None else resource.settle_seconds
    wait = CANCEL_WAIT_SECONDS if wait is None else wait
    poll = CANCEL_POLL_SECONDS if poll_seconds is None else poll_seconds
    deadline = time.monotonic() + wait
    retry = cloud_retry.call_retry(f"{resource.cancel_words[1]} {resource.what}")
    try:
        retry.with_timeout(wait if retry_seconds is None else retry_seconds)(resource.request_cancel)()
    except Exception as error:  # refused, or out of reach: did it end meanwhile?
        state, _ = _read(resource, deadline - time.monotonic())
        if resource.ended(state):
            return Cancelled(state)
        logger.error(
            "could not %s %s: %s%s",
            resource.cancel_words[0], resource.what, cloud_retry.one_line(error), resource.where(),
        )  # fmt: skip
        return Cancelled(state, error)
    logger.warning("%s %s", resource.cancel_words[1], resource.what)
    state, error = _read(resource, deadline - time.monotonic())
    # A refused read ends the wait: the cancel was accepted, and its end cannot be read.
    while not resource.ended(state) and time.monotonic() < deadline and not cloud_retry.is_refusal(error):
        time.sleep(max(0.0, min(poll, deadline - time.monotonic())))
        state, error = _read(resource, deadline - time.monotonic())
    if resource.ended(state):
        logger.warning("%s is %s", resource.what, "deleted" if state == GONE else state)
    else:
        logger.error(
            "%s was still %s %.0f s after its request%s", resource.what, state, wait, resource.where()
        )
    return Cancelled(state)


def _read(resource: Resource, seconds: float) -> tuple[str, BaseException | None]:
    """The resource's state, transient errors retried for ``seconds`` (at least one), and the error of a read
    that failed (its state then ``UNKNOWN``)."""
    retry = cloud_retry.call_retry(f"reading {resource.what}")
    try:
        return retry.with_timeout(max(1.0, seconds))(resource.read)(), None
    except Exception as error:  # noqa: BLE001 - reported as the state
        logger.warning("reading %s: %s", resource.what, cloud_retry.one_line(error))
        return UNKNOWN, error


@contextlib.contextmanager
def cancelled_on_failure(
    running: Callable[[], Iterable[Resource]], stop: task_signals.StopSignals, shield: bool = True
) -> Iterator[None]:
    """Inside, the step runs its resource; whatever ends the block with an exception (a stop, a failure, an
    API that did not answer) cancels the resources ``running()`` names before the exception goes on. A stopped
    step follows each cancel for ``CANCEL_WAIT_SECONDS``. With ``shield``, SIGTERM / SIGINT are ignored during
    the clean-up and restored after it; without (a command whose Ctrl-C runs a clean-up of its own:
    ``effnet_common.stopping``), Ctrl-C still stops the command."""
    try:
        yield
    except BaseException:
        with task_signals.ignoring() if shield else contextlib.nullcontext():
            wait = CANCEL_WAIT_SECONDS if stop.received is not None else None
            for resource in running():
                cancel(resource, wait_seconds=wait)
        raise


def create(
    send: Callable[[], T],
    find: Callable[[], T | None],
    what: str,
    stop: task_signals.StopSignals | None = None,
    by_id: bool = False,
) -> T:
    """``send()``, the create of a resource, made once: transient errors are retried (``call_retry``), and
    before a create is sent again ``find()`` looks for what the last one may have made (its answer lost) and
    takes it. A create refused because the resource exists (409) takes what ``find()`` finds: a create that
    names its resource (``by_id``) is just sent again, and meets that refusal if the last one made it. With
    ``stop``, a signal is held while a create is in flight only (its answer names what it made) and raised
    after it.

    Raises:
      Exception: what the service answered other than a transient error or 409, at once.
    """
    sent = False

    def attempt() -> T:
        nonlocal sent
        if stop is not None:
            stop.check()  # stopped while an earlier attempt was looked up: nothing to create and cancel
        if sent and not by_id:
            made = find()
            if made is not None:
                logger.warning("%s: the create whose answer was lost had made it", what)
                return made
        sent = True
        try:
            with stop.held() if stop is not None else contextlib.nullcontext():
                return send()
        except Exception as error:
            if cloud_retry.http_status(error) != 409:
                raise
            logger.warning("%s: it exists already (an earlier create's answer was lost)", what)
            made = find()
            if made is None:  # made, and not readable yet: the next attempt finds it
                from google.api_core import exceptions

                raise exceptions.ServiceUnavailable(f"{what}: made, not readable yet") from error
            return made

    return cloud_retry.retried(attempt, what)


def reattach(
    found: Iterable[tuple[Resource, str]], reusable: Callable[[str], bool], wait_seconds: float | None = None
) -> Resource | None:
    """What an earlier attempt of this step made, to be followed instead of a new one: of ``found`` (resources
    with their states, newest first), the newest whose state is ``reusable``; every other one that has not
    ended is cancelled (it would write the same outputs), followed for ``wait_seconds``."""
    chosen = None
    for resource, state in found:
        if chosen is None and reusable(state):
            chosen = resource
            logger.warning(
                "following %s (%s), made by an earlier attempt of this step%s",
                resource.what, state, resource.where(),
            )  # fmt: skip
        elif not resource.ended(state):
            cancel(resource, wait_seconds=wait_seconds)
    return chosen
