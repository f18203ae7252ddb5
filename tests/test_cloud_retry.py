"""The one retry policy of every cloud call (``effnet_common.cloud_retry``): what is transient for each client, the
call policy's backoff, and a follower's patience with an outage and with a refusal."""

import http.client
import time

import pytest
import requests
import urllib3
from google.api_core import exceptions, retry

from effnet_common import cloud_retry


def apitools_error(status: int):
    """Beam's Dataflow client raises apitools' ``HttpError``."""
    from apitools.base.py import exceptions as apitools

    return apitools.HttpError({"status": status}, b"{}", "https://dataflow.googleapis.com/v1b3/...")


def kfp_error(status: int):
    import kfp_server_api

    return kfp_server_api.ApiException(status=status, reason="injected")


@pytest.mark.parametrize(
    "error, transient, refusal",
    [
        (exceptions.TooManyRequests("429"), True, False),
        (exceptions.ResourceExhausted("gRPC RESOURCE_EXHAUSTED"), True, False),
        (exceptions.InternalServerError("500"), True, False),
        (exceptions.BadGateway("502"), True, False),
        (exceptions.ServiceUnavailable("503"), True, False),
        (exceptions.DeadlineExceeded("504"), True, False),
        (exceptions.RetryError("inner retry ran out", exceptions.ServiceUnavailable("503")), True, False),
        (exceptions.PermissionDenied("403"), False, True),
        (exceptions.NotFound("404"), False, True),
        (exceptions.InvalidArgument("400"), False, False),
        (exceptions.FailedPrecondition("400"), False, False),
        (apitools_error(503), True, False),
        (apitools_error(429), True, False),
        (apitools_error(403), False, True),
        (apitools_error(400), False, False),
        (kfp_error(503), True, False),
        (kfp_error(404), False, True),
        (kfp_error(401), False, True),
        (kfp_error(400), False, False),
        (ConnectionResetError(104, "Connection reset by peer"), True, False),
        (http.client.RemoteDisconnected("Remote end closed connection without response"), True, False),
        (TimeoutError("timed out"), True, False),
        (requests.exceptions.ConnectionError("reset"), True, False),
        (urllib3.exceptions.ProtocolError("Connection aborted."), True, False),
        (ValueError("a bug"), False, False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_what_each_client_raises_is_told_transient_or_refused(error, transient, refusal):
    assert cloud_retry.is_transient(error) is transient
    assert cloud_retry.is_refusal(error) is refusal


def test_the_call_policy_is_api_cores_retry_with_jittered_exponential_backoff(monkeypatch):
    policy = cloud_retry.call_retry("a call")
    assert isinstance(policy, retry.Retry)
    assert (policy._initial, policy._maximum, policy._multiplier) == (1.0, 60.0, 2.0)
    assert policy.timeout == cloud_retry.CALL_RETRY_SECONDS
    waits = []
    monkeypatch.setattr(time, "sleep", waits.append)
    answers = iter([exceptions.ServiceUnavailable("503"), exceptions.TooManyRequests("429"), "answer"])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert cloud_retry.retried(call, "a call") == "answer"
    assert len(waits) == 2 and 0 <= waits[0] <= 1.0 and 0 <= waits[1] <= 2.0  # full jitter under the bound
    with pytest.raises(exceptions.InvalidArgument):  # not transient: at once
        cloud_retry.retried(lambda: (_ for _ in ()).throw(exceptions.InvalidArgument("no")), "a call")
    assert len(waits) == 2


def test_a_follower_waits_out_an_outage_and_a_short_refusal_but_not_a_persistent_one(monkeypatch):
    monkeypatch.setattr(cloud_retry, "FOLLOW_INITIAL_SECONDS", 0.01)
    monkeypatch.setattr(cloud_retry, "FOLLOW_MAXIMUM_SECONDS", 0.02)
    monkeypatch.setattr(cloud_retry, "REFUSAL_SECONDS", 0.3)
    answers = iter(
        [
            exceptions.ServiceUnavailable("503"),
            exceptions.PermissionDenied("403"),
            ConnectionResetError(),
            "RUNNING",
        ]
    )

    def read():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    patience = cloud_retry.Patience(outage_seconds=5)
    assert patience.read(read, "reading job 1") == "RUNNING"

    def refused():
        raise exceptions.PermissionDenied("customJobs.get denied")

    started = time.monotonic()
    with pytest.raises(cloud_retry.Unanswered) as failure:
        patience.read(refused, "reading job 1")
    assert 0.3 <= time.monotonic() - started < 3
    assert (
        str(failure.value) == "reading job 1: refused for 0.3 s: PermissionDenied: 403 customJobs.get denied"
    )

    def down():
        raise exceptions.ServiceUnavailable("down")

    with pytest.raises(
        cloud_retry.Unanswered, match=r"^reading job 1: no answer for 0.2 s: ServiceUnavailable"
    ):
        cloud_retry.Patience(outage_seconds=0.2).read(down, "reading job 1")
    with pytest.raises(exceptions.InvalidArgument):  # neither: at once
        patience.read(lambda: (_ for _ in ()).throw(exceptions.InvalidArgument("bad name")), "reading job 1")


def test_the_outage_setting_travels_among_a_tasks_arguments():
    assert cloud_retry.Patience().outage_seconds == 12 * 3600  # the default outlasts a regional incident
    args = ["--runner=DataflowRunner", cloud_retry.outage_arg(0.5), "--effnet_run=r"]
    patience, rest = cloud_retry.take_patience(args)
    assert patience.outage_seconds == 1800 and rest == ["--runner=DataflowRunner", "--effnet_run=r"]
    assert cloud_retry.take_patience(["--x=1"]) == (cloud_retry.Patience(), ["--x=1"])
