"""Calls to cloud APIs that outlast the services' transient faults: the one retry policy of every client.

Google's APIs document HTTP 408, 429, 500, 502, 503, 504 (and their gRPC codes) and a dropped connection as
transient, to be retried with truncated exponential backoff and jitter; a Kubeflow Pipelines API behind its
gateway answers the same while its server restarts. Two policies (their bounds: docs/vertex.md), both
``google.api_core.retry.Retry`` (full jitter), passed as ``retry=`` where a client takes it, wrapped around
the call where it does not (Beam's Dataflow client, ``kfp``, the Vertex SDK's submission):

- ``call_retry``: one call (a create, a list, a cancel), transient errors and slow answers retried for
  ``CALL_RETRY_SECONDS``; anything else raised at once.
- ``Patience.read``: a job's state, read until its API answers (a stopped step stops at the next retry): an
  outage is waited out for ``OUTAGE_HOURS`` (``--api-outage-hours``), a refusal (401, 403, 404) for
  ``REFUSAL_SECONDS``; only then does the read fail (``Unanswered``): one failed read never gives a job up.
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from effnet_common import task_signals

logger = logging.getLogger("effnet_common.cloud_retry")

T = TypeVar("T")

# HTTP statuses every API here documents as transient, and the refusals a follower waits out a little.
TRANSIENT_STATUSES = (408, 429, 500, 502, 503, 504)
REFUSAL_STATUSES = (401, 403, 404)
# One call: each attempt's timeout, the backoff's first and largest bound, and how long it is retried in all.
CALL_TIMEOUT_SECONDS = 60.0
CALL_INITIAL_SECONDS = 1.0
CALL_MAXIMUM_SECONDS = 60.0
CALL_RETRY_SECONDS = 600.0
# Following a job: how long an outage of its API is waited out (the default of --api-outage-hours), how long a
# refusal, and the backoff's bounds between reads of a job whose API does not answer.
OUTAGE_HOURS = 12.0
REFUSAL_SECONDS = 300.0
FOLLOW_INITIAL_SECONDS = 5.0
FOLLOW_MAXIMUM_SECONDS = 300.0
# The task argument (among the Beam options every compiled task gets) that carries --api-outage-hours.
OUTAGE_FLAG = "--effnet_api_outage_hours"


class Unanswered(RuntimeError):
    """A job's state could not be read: its API was out for longer than the follower waits, or refused (401,
    403, 404) for longer than ``REFUSAL_SECONDS``. The message is one line."""


def one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


def http_status(error: BaseException) -> int | None:
    """The HTTP status of an error raised by any of the clients used here, None for an error without one.

    google-api-core's ``GoogleAPICallError`` (``code``, gRPC statuses mapped to HTTP ones), apitools'
    ``HttpError`` (Beam's Dataflow client: ``status_code``), ``kfp_server_api.ApiException`` (``status``),
    requests' ``HTTPError`` (``response.status_code``).
    """
    from google.api_core import exceptions

    if isinstance(error, exceptions.RetryError):
        return http_status(error.cause) if error.cause is not None else None
    if isinstance(error, exceptions.GoogleAPICallError):
        return error.code
    for attribute in ("status_code", "status"):
        value = getattr(error, attribute, None)
        if isinstance(value, int) and value >= 100:
            return value
    response = getattr(error, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def _dropped(error: BaseException) -> bool:
    """A connection refused, reset or closed without an answer, or an answer that did not come in time."""
    import requests
    import urllib3
    from google.auth import exceptions as auth_exceptions

    dropped = (
        ConnectionError,  # refused, reset, broken pipe; http.client.RemoteDisconnected
        TimeoutError,  # socket.timeout
        http.client.IncompleteRead,
        http.client.BadStatusLine,
        requests.exceptions.ConnectionError,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.Timeout,
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.TimeoutError,
        urllib3.exceptions.MaxRetryError,
        auth_exceptions.TransportError,  # a token refresh that could not reach its server
    )
    return isinstance(error, dropped)


def is_transient(error: BaseException) -> bool:
    """What the services document as transient: ``TRANSIENT_STATUSES``, or no answer at all."""
    from google.api_core import exceptions

    if isinstance(error, exceptions.RetryError):  # an inner retry ran out: what it retried
        return error.cause is not None and is_transient(error.cause)
    status = http_status(error)
    if status is not None:
        return status in TRANSIENT_STATUSES
    return _dropped(error)


def is_refusal(error: BaseException) -> bool:
    """A 401 (a token expired, perhaps about to be rotated), 403 (a permission missing, perhaps only until an
    IAM change takes effect) or 404 (a resource just created can be briefly missing)."""
    return http_status(error) in REFUSAL_STATUSES


def _log_retry(what: str) -> Callable[[Exception], None]:
    def log(error: Exception) -> None:
        logger.warning("%s: %s; retrying", what, one_line(error))

    return log


def call_retry(what: str = "a cloud API call"):
    """The policy of one call (see the module's docstring), a ``google.api_core.retry.Retry``."""
    from google.api_core import retry

    return retry.Retry(
        predicate=is_transient,
        initial=CALL_INITIAL_SECONDS,
        maximum=CALL_MAXIMUM_SECONDS,
        multiplier=2.0,
        timeout=CALL_RETRY_SECONDS,
        on_error=_log_retry(what),
    )


def call_policy(what: str) -> dict:
    """The keyword arguments of a client call under the policy: ``retry`` (``call_retry``) and ``timeout``."""
    return {"retry": call_retry(what), "timeout": CALL_TIMEOUT_SECONDS}


def retried(call: Callable[[], T], what: str) -> T:
    """``call()`` (a client call that takes no ``retry=``) under ``call_retry``; an outage longer than the
    policy's raises the last error (not api_core's ``RetryError``), so a caller's message names it."""
    from google.api_core import exceptions

    try:
        return call_retry(what)(call)()
    except exceptions.RetryError as error:
        if error.cause is not None:
            raise error.cause from None
        raise


@dataclasses.dataclass(frozen=True)
class Patience:
    """How long a follower waits for a job's API to answer (see the module's docstring)."""

    outage_seconds: float = OUTAGE_HOURS * 3600

    @classmethod
    def of_hours(cls, hours: float | None) -> Patience:
        return cls() if hours is None else cls(outage_seconds=hours * 3600)

    def describe(self) -> str:
        hours = self.outage_seconds / 3600
        return f"{hours:g} h" if hours >= 1 else f"{self.outage_seconds:g} s"

    def read(self, call: Callable[[], T], what: str) -> T:
        """``call()``'s answer, an outage waited out for ``outage_seconds`` and a refusal for
        ``REFUSAL_SECONDS``.

        Raises:
          Unanswered: the outage or the refusal lasted longer (one line naming ``what`` and the last error).
          Exception: any other error of ``call``, at once.
        """
        from google.api_core import exceptions, retry

        refused_since: list[float] = []

        def waited_out(error: Exception) -> bool:
            if is_refusal(error):
                refused_since[:] = refused_since or [time.monotonic()]
                return time.monotonic() - refused_since[0] < REFUSAL_SECONDS
            refused_since.clear()
            return is_transient(error)

        def before_retry(error: Exception) -> None:
            task_signals.check_stop()  # a stopped step does not wait out an outage
            _log_retry(what)(error)

        policy = retry.Retry(
            predicate=waited_out,
            initial=FOLLOW_INITIAL_SECONDS,
            maximum=FOLLOW_MAXIMUM_SECONDS,
            multiplier=2.0,
            timeout=self.outage_seconds,
            on_error=before_retry,
        )
        try:
            return policy(call)()
        except exceptions.RetryError as error:
            cause = error.cause or error
            raise Unanswered(f"{what}: no answer for {self.describe()}: {one_line(cause)}") from None
        except Exception as error:
            if is_refusal(error):
                raise Unanswered(f"{what}: refused for {REFUSAL_SECONDS:g} s: {one_line(error)}") from None
            raise

    def follow(
        self,
        read_state: Callable[[], str],
        ended: tuple[str, ...],
        what: str,
        poll_seconds: float,
        on_state: Callable[[str], None] | None = None,
    ) -> str:
        """Reads the state every ``poll_seconds`` until it is one of ``ended`` and returns it (``read`` rules:
        raises ``Unanswered``); ``on_state`` is called with each state read."""
        while True:
            state = self.read(read_state, what)
            if on_state is not None:
                on_state(state)
            if state in ended:
                return state
            time.sleep(poll_seconds)


def outage_arg(hours: float) -> str:
    """The task argument carrying ``--api-outage-hours`` (``take_patience`` reads it back)."""
    return f"{OUTAGE_FLAG}={hours:g}"


def take_patience(args: list[str]) -> tuple[Patience, list[str]]:
    """The ``Patience`` among a task's arguments (``outage_arg``; the default without one) and the others."""
    hours, rest = None, []
    for arg in args:
        if arg.startswith(f"{OUTAGE_FLAG}="):
            hours = float(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return Patience.of_hours(hours), rest
