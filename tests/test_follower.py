"""The one follower of cloud resources (effnet_common.follower), on a resource kept in memory whose API fails
as Google's do (503, 429, a dropped connection, 409). Each backend's adapter meets the same faults against its
own fake service (tests/test_vertex_training.py, test_faults.py, test_run_cleanup.py, test_tpu_vm.py,
test_vertex.py)."""

import pathlib
import re

import fake_vertex
import pytest
from google.api_core import exceptions

from effnet_common import cloud_retry, follower

REPO = pathlib.Path(__file__).resolve().parent.parent


class Job(follower.Resource):
    """A job whose reads answer ``states`` in turn (the last one for ever) and whose API first fails with
    ``faults`` (exceptions raised by the calls, in order)."""

    ended_states = ("DONE", "CANCELLED")

    def __init__(self, states, faults=(), cancellable=True):
        self.what = "job 1"
        self.poll_seconds = 0.0
        self.states, self.faults = list(states), list(faults)
        self.cancellable, self.cancels, self.reads = cancellable, 0, 0

    def _fault(self):
        if self.faults:
            raise self.faults.pop(0)

    def read(self) -> str:
        self._fault()
        self.reads += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def request_cancel(self) -> None:
        self._fault()
        if not self.cancellable:
            raise exceptions.FailedPrecondition("the job cannot be cancelled")
        self.cancels += 1
        self.states = ["CANCELLING", "CANCELLED"]


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    fake_vertex.fast_retries(monkeypatch.setattr)
    monkeypatch.setattr(follower, "CANCEL_POLL_SECONDS", 0.0)


def test_follow_reads_until_an_end_and_waits_out_what_google_calls_transient():
    job = Job(["QUEUED", "RUNNING", "DONE"], faults=[exceptions.ServiceUnavailable("x"), ConnectionError()])
    seen = []
    assert follower.follow(job, cloud_retry.Patience(), on_state=seen.append) == "DONE"
    assert seen == ["QUEUED", "RUNNING", "DONE"] and not job.faults


def test_follow_gives_up_in_one_line_when_the_api_is_out_for_longer_than_its_patience():
    job = Job(["RUNNING"], faults=[exceptions.ServiceUnavailable("out")] * 1000)
    with pytest.raises(
        cloud_retry.Unanswered, match=r"^reading job 1: no answer for 0\.5 s: ServiceUnavailable"
    ):
        follower.follow(job, cloud_retry.Patience(outage_seconds=0.5))


def test_follow_ends_where_until_says():
    job = Job(["QUEUED", "ACTIVE", "TRAINED"])
    assert follower.follow(job, cloud_retry.Patience(), until=lambda state: state == "ACTIVE") == "ACTIVE"


def test_cancel_follows_the_resource_to_its_end_through_transient_faults():
    job = Job(["RUNNING"], faults=[exceptions.TooManyRequests("x")])
    assert follower.cancel(job, wait_seconds=5) == follower.Cancelled("CANCELLED")
    assert job.cancels == 1


def test_cancel_of_a_resource_that_had_ended_leaves_it_as_it_ended():
    job = Job(["DONE"], cancellable=False)
    assert follower.cancel(job, wait_seconds=5) == follower.Cancelled("DONE")


def test_a_refused_cancel_is_reported_not_raised():
    job = Job(["RUNNING"], cancellable=False)
    cancelled = follower.cancel(job, wait_seconds=1)
    assert cancelled.state == "RUNNING" and isinstance(cancelled.error, exceptions.FailedPrecondition)


def test_a_cancel_not_ended_within_its_wait_says_the_last_state():
    job = Job(["RUNNING"])
    job.request_cancel = lambda: None  # accepted, never acted on
    assert follower.cancel(job, wait_seconds=0.2) == follower.Cancelled("RUNNING")


def test_a_create_whose_answer_was_lost_is_found_before_it_is_sent_again():
    made, sent = [], []

    def send():
        sent.append(1)
        made.append("job-1")
        if len(sent) == 1:
            raise ConnectionError("the answer was lost")
        return "job-2"

    assert follower.create(send, lambda: made[0] if made else None, "creating a job") == "job-1"
    assert len(sent) == 1


def test_a_create_by_id_is_sent_again_and_takes_what_exists_on_409():
    made, sent = [], []

    def send():
        sent.append(1)
        if made:
            raise exceptions.Conflict("exists")
        made.append("slice-0")
        raise exceptions.ServiceUnavailable("the answer was lost")

    assert (
        follower.create(send, lambda: made[0] if made else None, "creating a slice", by_id=True) == "slice-0"
    )
    assert len(sent) == 2


def test_reattach_follows_the_newest_reusable_and_cancels_the_others_still_running():
    newest, older, ended = Job(["RUNNING"]), Job(["RUNNING"]), Job(["DONE"])
    found = [(newest, "RUNNING"), (older, "RUNNING"), (ended, "DONE")]
    assert follower.reattach(found, lambda state: state == "RUNNING", wait_seconds=5) is newest
    assert (newest.cancels, older.cancels, ended.cancels) == (0, 1, 0)


def test_cancelled_on_failure_cancels_what_runs_and_the_error_goes_on():
    from effnet_common.task_signals import StopSignals

    job = Job(["RUNNING"])
    with pytest.raises(ValueError, match="boom"), follower.cancelled_on_failure(lambda: [job], StopSignals()):
        raise ValueError("boom")
    assert job.cancels == 1


def test_the_followers_constants_have_one_home():
    """No backend keeps a copy of how long a cancel is followed, or how often."""
    packages = ["beam_preprocess", "components", "effnet_common", "pipeline", "trainer_module"]
    found = [
        str(path.relative_to(REPO))
        for package in packages
        for path in (REPO / package).rglob("*.py")
        if re.search(r"^(CANCEL|STOPPED_DELETE|DELETE_POLL)_\w*SECONDS\s*=", path.read_text(), re.M)
    ]
    assert found == ["effnet_common/follower.py"]
