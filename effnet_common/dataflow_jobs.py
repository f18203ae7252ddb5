"""Dataflow jobs: a Beam pipeline's job cancelled when its process stops; a run's jobs found and cancelled.

Beam's DataflowRunner submits a job and waits on it; a process stopped while it waits (a task's SIGTERM, a
person's Ctrl-C) leaves the job running, on up to a hundred workers. On Dataflow, ``StoppablePipeline`` (the
sharding command's, the sharding step's and the Evaluator's pipeline) cancels its job when the process is
stopped or fails while it waits; a signal during the submission is held until the job has an id. ``Job``
adapts a job to ``effnet_common.follower``. A retried task re-attaches: a step's job is named after its
execution (``components.beam_executor``), and when Dataflow answers the create with the active job of that
name, which Beam refuses, the pipeline follows that job (``_adopt``). Beam's stager files go to a temporary
directory removed after the submission. On other runners it is Beam's pipeline as it is.

``DataflowApi`` reaches the jobs of one project and region with ``JobsV1Beta3Client`` over REST, at Beam's
``--dataflow_endpoint`` and with the credentials Beam submits with (``credentials_of``). The module sits below
``beam_preprocess`` and ``components``, which both use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
import threading
import time

import apache_beam as beam

from effnet_common import cloud_retry, follower, task_signals
from effnet_common.task_signals import StopSignals, TaskStopped

logger = logging.getLogger("effnet_common.dataflow_jobs")

# Following a job this process did not submit (an earlier attempt's): how often its state is read.
FOLLOW_POLL_SECONDS = 10.0
CANCELLED = "JOB_STATE_CANCELLED"
DONE = "JOB_STATE_DONE"
# Dataflow's terminal job states: a job in one of them cannot be cancelled.
TERMINAL = (DONE, "JOB_STATE_FAILED", CANCELLED, "JOB_STATE_UPDATED", "JOB_STATE_DRAINED")
CONSOLE = "https://console.cloud.google.com/dataflow/jobs/{region}/{job}?project={project}"


@dataclasses.dataclass(frozen=True)
class DataflowJob:
    """A Dataflow job as the clean-up reports it."""

    id: str
    name: str
    state: str


def state_name(job) -> str:
    """A ``Job`` message's ``current_state`` as Dataflow names it (``JOB_STATE_RUNNING``...)."""
    from google.cloud import dataflow_v1beta3

    return dataflow_v1beta3.JobState(job.current_state).name


def credentials_of(cloud):
    """The credentials Beam submits with, for ``GoogleCloudOptions`` ``cloud``: the application default
    credentials with ``--gcp_oauth_scopes``, through ``--impersonate_service_account`` when given (a chain,
    comma-separated, the last one impersonated), none with ``--no_auth``. None found: anonymous, as Beam goes
    on without them (the service then refuses, and the caller says so)."""
    import google.auth
    from google.auth import credentials, impersonated_credentials
    from google.auth import exceptions as auth_exceptions

    if cloud.no_auth:
        return credentials.AnonymousCredentials()
    try:
        found, _ = google.auth.default(scopes=cloud.gcp_oauth_scopes)
    except auth_exceptions.DefaultCredentialsError as error:
        logger.warning(
            "no credentials for Dataflow's API, calling it anonymously: %s", cloud_retry.one_line(error)
        )
        return credentials.AnonymousCredentials()
    if not cloud.impersonate_service_account:
        return found
    chain = cloud.impersonate_service_account.split(",")
    return impersonated_credentials.Credentials(
        source_credentials=found,
        target_principal=chain[-1],
        delegates=chain[:-1],
        target_scopes=cloud.gcp_oauth_scopes,
    )


class DataflowApi:
    """The Dataflow jobs of the project and region of a pipeline's Beam options."""

    def __init__(self, options):
        from apache_beam.options.pipeline_options import GoogleCloudOptions
        from google.cloud import dataflow_v1beta3

        cloud = options.view_as(GoogleCloudOptions)
        self.project, self.region = cloud.project, cloud.region
        self._types = dataflow_v1beta3
        self._client = dataflow_v1beta3.JobsV1Beta3Client(
            credentials=credentials_of(cloud),
            transport="rest",
            client_options={"api_endpoint": cloud.dataflow_endpoint},
        )

    @classmethod
    def from_args(cls, beam_args: list[str]) -> DataflowApi:
        from apache_beam.options.pipeline_options import PipelineOptions

        return cls(PipelineOptions(beam_args))

    def console_url(self, job_id: str) -> str:
        return CONSOLE.format(region=self.region, job=job_id, project=self.project)

    def get(self, job_id: str, with_labels: bool = False, retried: bool = True):
        """The job (a Dataflow ``Job`` message); ``with_labels`` asks for the view that carries its labels.
        ``retried``: transient errors retried under the call policy, else raised (a caller that retries)."""
        view = self._types.JobView
        request = self._types.GetJobRequest(
            project_id=self.project,
            location=self.region,
            job_id=job_id,
            view=view.JOB_VIEW_DESCRIPTION if with_labels else view.JOB_VIEW_SUMMARY,
        )
        if not retried:
            return self._client.get_job(request=request, timeout=cloud_retry.CALL_TIMEOUT_SECONDS)
        return self._client.get_job(
            request=request, **cloud_retry.call_policy(f"reading Dataflow job {job_id}")
        )

    def state(self, job_id: str) -> str:
        return state_name(self.get(job_id))

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    def active_jobs(self):
        """Every job not in a terminal state, as summaries, page after page (each under the call policy)."""
        request = self._types.ListJobsRequest(
            project_id=self.project, location=self.region, filter=self._types.ListJobsRequest.Filter.ACTIVE
        )
        yield from self._client.list_jobs(
            request=request,
            **cloud_retry.call_policy(f"listing the Dataflow jobs of {self.project}/{self.region}"),
        )

    def jobs_labelled(self, key: str, value: str) -> list[DataflowJob]:
        """The active jobs carrying label ``key=value`` (Dataflow's list gives summaries without labels, so
        each job is read with the view that carries them)."""
        found = []
        for summary in self.active_jobs():
            job = self.get(summary.id, with_labels=True)
            state = state_name(job)
            if job.labels.get(key) == value and state not in TERMINAL:
                found.append(DataflowJob(job.id, job.name, state))
        return found

    def request_cancel(self, job_id: str) -> None:
        """One request to cancel job ``job_id`` (Dataflow refuses it for a job that has ended)."""
        request = self._types.UpdateJobRequest(
            project_id=self.project,
            location=self.region,
            job_id=job_id,
            job=self._types.Job(requested_state=self._types.JobState.JOB_STATE_CANCELLED),
        )
        self._client.update_job(request=request, timeout=cloud_retry.CALL_TIMEOUT_SECONDS)

    def cancel(self, job_id: str) -> str:
        """Cancels job ``job_id`` and follows it to its end (``follower.cancel``); returns the last state
        seen. A job that ended before the request stays as it ended.

        Raises:
          google.api_core.exceptions.GoogleAPICallError: Dataflow refused the request and the job has not
            ended.
        """
        cancelled = follower.cancel(self.job(job_id))
        if cancelled.error is not None:
            raise cancelled.error
        return cancelled.state


class Job(follower.Resource):
    """A Dataflow job, as the follower reads and cancels it."""

    ended_states = TERMINAL

    def __init__(self, api: DataflowApi, job_id: str):
        self.api, self.id = api, job_id
        self.what = f"Dataflow job {job_id}"
        self.poll_seconds = FOLLOW_POLL_SECONDS

    def read(self) -> str:
        return state_name(self.api.get(self.id, retried=False))

    def request_cancel(self) -> None:
        self.api.request_cancel(self.id)

    def url(self) -> str:
        return self.api.console_url(self.id)


class _StoppableResult:
    """The DataflowRunner's result, whose ``wait_until_finish`` cancels the job if the task is stopped or
    fails while it waits, and outlasts an outage of Dataflow's API: Beam's waiter gives up after its own
    retries (about ten minutes of a failing ``get``) and would end the step while the job runs on. Everything
    else is the result's own."""

    def __init__(self, result, options, patience: cloud_retry.Patience | None = None):
        self._result = result
        self._options = options
        self._patience = patience or cloud_retry.Patience()

    def __getattr__(self, name):
        return getattr(self._result, name)

    def stop(self, reason: BaseException) -> None:
        """Cancels the job (unless it ended) and raises ``reason``."""
        job_id = self._result.job_id()
        where = ""
        with task_signals.ignoring():
            try:
                job = DataflowApi(self._options).job(job_id)
                where = job.where()
                # A job that ended meanwhile stays as it ended (follower.cancel).
                cancelled = follower.cancel(job, wait_seconds=follower.CANCEL_WAIT_SECONDS)
                error = cancelled.error
                state = cancelled.state if error is None else f"not cancelled ({cloud_retry.one_line(error)})"
            except Exception as error:  # the task is failing anyway; say what could not be done
                logger.error("could not cancel Dataflow job %s: %s", job_id, error)
                state = f"not cancelled ({error})"
        if isinstance(reason, TaskStopped):  # what a person who pressed Ctrl-C wants to read
            reason.args = (f"{reason}: Dataflow job {job_id} is {state}{where}",)
        raise reason

    def wait_until_finish(self, duration=None):
        # Beam's waiter is a loop of sleeps of its own: the stop is raised wherever it arrives.
        with StopSignals(anywhere=True).installed():
            try:
                while True:
                    try:
                        return self._result.wait_until_finish(duration)
                    except (TaskStopped, KeyboardInterrupt, cloud_retry.Unanswered):
                        raise  # a job followed through the jobs API has already waited the outage out
                    except Exception as error:
                        if not self._still_running(error):
                            raise
            except BaseException as error:
                self.stop(error)

    def _still_running(self, error: Exception) -> bool:
        """Whether Beam's waiter failed while its job still runs (its API out for longer than Beam retries):
        the job's state read with the follower's patience (``cloud_retry.Patience``); True to wait on it
        again."""
        from apache_beam.runners.runner import PipelineState

        if self._result.is_in_terminal_state() and self._result.state != PipelineState.UNKNOWN:
            return False
        job = DataflowApi(self._options).job(self._result.job_id())
        state = self._patience.read(job.read, f"reading {job.what}")
        if state in TERMINAL:
            return False
        logger.warning(
            "%s is %s, still followed after Beam's waiter failed: %s",
            job.what, state, cloud_retry.one_line(error),
        )  # fmt: skip
        return True


@contextlib.contextmanager
def _submission_tempdir():
    """The process's temporary directory is a new one while Beam submits the job, removed after: Beam's
    stager writes files there (the submitting environment's packages, its requirements cache) and leaves
    them."""
    previous, private = tempfile.tempdir, tempfile.mkdtemp(prefix="dataflow-submission-")
    tempfile.tempdir = private
    try:
        yield
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(private, ignore_errors=True)


class _FollowedJob:
    """The result of a pipeline whose job an earlier attempt submitted: Beam's ``PipelineResult`` interface
    over the jobs API. ``wait_until_finish`` follows the job (``follower.follow``) until it ended: done
    returns, any other end raises Beam's ``DataflowRuntimeException`` naming the state."""

    has_job = True

    def __init__(self, job: Job, patience: cloud_retry.Patience):
        self._job, self._patience = job, patience
        self._job_state = "JOB_STATE_UNKNOWN"

    def job_id(self) -> str:
        return self._job.id

    @property
    def state(self) -> str:
        """Beam's ``PipelineState`` of the job's last state read."""
        from apache_beam.runners.runner import PipelineState

        return getattr(PipelineState, self._job_state.removeprefix("JOB_STATE_"), PipelineState.UNKNOWN)

    def is_in_terminal_state(self) -> bool:
        return self._job_state in TERMINAL

    def wait_until_finish(self, duration=None):
        """Follows the job until it ended, or for ``duration`` milliseconds (Beam's unit) when given."""
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRuntimeException

        deadline = None if duration is None else time.monotonic() + duration / 1000
        self._job_state = follower.follow(self._job, self._patience, deadline=deadline)
        if self._job_state in TERMINAL and self._job_state != DONE:
            raise DataflowRuntimeException(f"{self._job.what} is {self._job_state}{self._job.where()}", self)
        return self.state

    def cancel(self):
        return self._job.api.cancel(self._job.id)

    def metrics(self):
        raise NotImplementedError(f"{self._job.what} was submitted by an earlier attempt: see its page")


def _adopt(pipeline: StoppablePipeline, error: Exception) -> _FollowedJob:
    """The result of the active job named as this pipeline's (an earlier attempt's, or a create whose answer
    was lost, which Beam refuses as not the job its request made), followed through the jobs API; re-raises
    ``error`` when there is none (or none can be listed)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    name = pipeline.options.view_as(GoogleCloudOptions).job_name
    api = DataflowApi(pipeline.options)
    try:
        found = [(api.job(summary.id), state_name(summary)) for summary in api.active_jobs()
                 if name and summary.name == name]  # fmt: skip
    except Exception as listing:
        logger.error("looking for an active Dataflow job named %s: %s", name, cloud_retry.one_line(listing))
        found = []
    job = follower.reattach(found, lambda state: state not in TERMINAL)
    if job is None:
        raise error
    return _FollowedJob(job, pipeline.patience or cloud_retry.Patience())


class StoppablePipeline(beam.Pipeline):
    """A Beam pipeline whose Dataflow job is cancelled when its process is stopped or fails while the job
    runs (see the module's docstring); on another runner, or off the main thread (signals reach the main
    thread only), Beam's pipeline as it is."""

    # How long an outage of Dataflow's API is waited out while the job runs (``cloud_retry.Patience``).
    patience: cloud_retry.Patience | None = None

    def run(self, test_runner_api="AUTO"):
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

        if (
            not isinstance(self.runner, DataflowRunner)
            or threading.current_thread() is not threading.main_thread()
        ):
            return super().run(test_runner_api)
        # Signals are held until the job has an id; Beam's submission files go with their own directory.
        signals = StopSignals()
        with signals.installed(), signals.held(raise_after=False), _submission_tempdir():
            try:
                result = super().run(test_runner_api)
            except Exception as error:  # a job of this execution's name may run: follow it (``_adopt``)
                result = _adopt(self, error)
        if not getattr(result, "has_job", False):  # a template was written: no job runs
            return result
        stoppable = _StoppableResult(result, self.options, self.patience)
        if signals.received is not None:
            stoppable.stop(signals.stopped())
        return stoppable
