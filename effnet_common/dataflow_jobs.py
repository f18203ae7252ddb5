"""Dataflow jobs: a Beam pipeline's job cancelled when its process is stopped, a run's jobs found and cancelled.

Beam's DataflowRunner submits a pipeline's job and then waits on it; when the process that waits is stopped (a
pipeline task whose run is cancelled or whose pod is evicted gets SIGTERM; a person presses Ctrl-C), the process
exits and the job goes on, on up to a hundred workers. ``StoppablePipeline`` is the Beam pipeline of such a
process (the sharding command line, the pipeline's sharding step and Evaluator): on Dataflow, a SIGTERM or SIGINT
while the job runs, or any failure while the process waits on it, cancels the job and follows it until Dataflow
reports it ended (within the grace period a stopped pod has); the process then fails with one line naming the
job. A signal that arrives while the job is being submitted is held until Dataflow has returned its id, then
acted on. The submission writes its files (Beam's stager: the list of the submitting environment's packages, the
requirements cache) into a temporary directory of its own, removed once the job is submitted: Beam leaves them
in the process's temporary directory. On other runners it is Beam's pipeline as it is.

It lives here, below both ``beam_preprocess`` (whose command line runs its Dataflow jobs in one) and
``components`` (whose Beam executors do, ``components.beam_executor``), because both stages share it and it
knows neither: it needs Beam, the jobs API and the one retry policy (``effnet_common.cloud_retry``), as the
Ctrl-C handling it stands in for while a job runs (``effnet_common.stopping``) lives here too.

A retried task re-attaches: a step's job is named after its execution (``components.beam_executor``: a digest of
the task's output URIs, which a retried task keeps), and Dataflow answers a create whose name is that of an
active job with that job, which Beam's DataflowRunner refuses (it is not the job its request made). A submission
that fails while an active job carries the pipeline's job name follows that job instead of failing
(``StoppablePipeline.run``: the job is this execution's, an earlier attempt's). The same answer finds the job of
a create whose first answer was lost, when Beam's client sends it again.

``DataflowApi`` reaches the jobs of one project and region with Dataflow's public client,
google-cloud-dataflow-client's ``JobsV1Beta3Client``, over its REST transport to the endpoint the DataflowRunner
submits to (``--dataflow_endpoint``), with the credentials Beam uses for the submission: the application default
credentials with ``--gcp_oauth_scopes``, through ``--impersonate_service_account`` (a chain, comma-separated,
the last one impersonated) when given, none with ``--no_auth``. Every call takes the one call policy
(``cloud_retry.call_retry``) as the client's ``retry=``. ``jobs_labelled`` finds a run's jobs by a label:
Dataflow's list returns summaries without labels, so each active job is read with the view that carries them.
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

from effnet_common import cloud_retry, task_signals
from effnet_common.task_signals import StopSignals, TaskStopped

logger = logging.getLogger("effnet_common.dataflow_jobs")

# After cancelling: how long to follow the job to its end. Kubernetes gives a stopped pod 30 s by default.
CANCEL_WAIT_SECONDS = 20.0
CANCEL_POLL_SECONDS = 2.0
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
    """The credentials Beam submits with, for ``GoogleCloudOptions`` ``cloud`` (see the module's docstring); none
    found: anonymous, as Beam goes on without them (the service then refuses, and the caller says so)."""
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

    def get(self, job_id: str, with_labels: bool = False):
        """The job (a Dataflow ``Job`` message); ``with_labels`` asks for the view that carries its labels."""
        view = self._types.JobView
        request = self._types.GetJobRequest(
            project_id=self.project,
            location=self.region,
            job_id=job_id,
            view=view.JOB_VIEW_DESCRIPTION if with_labels else view.JOB_VIEW_SUMMARY,
        )
        return self._client.get_job(
            request=request, **cloud_retry.call_policy(f"reading Dataflow job {job_id}")
        )

    def state(self, job_id: str) -> str:
        return state_name(self.get(job_id))

    def active_jobs(self):
        """Every job not in a terminal state, as summaries, page after page (each page under the call policy)."""
        request = self._types.ListJobsRequest(
            project_id=self.project, location=self.region, filter=self._types.ListJobsRequest.Filter.ACTIVE
        )
        yield from self._client.list_jobs(
            request=request,
            **cloud_retry.call_policy(f"listing the Dataflow jobs of {self.project}/{self.region}"),
        )

    def jobs_labelled(self, key: str, value: str) -> list[DataflowJob]:
        """The active jobs carrying label ``key=value``."""
        found = []
        for summary in self.active_jobs():
            job = self.get(summary.id, with_labels=True)
            state = state_name(job)
            if job.labels.get(key) == value and state not in TERMINAL:
                found.append(DataflowJob(job.id, job.name, state))
        return found

    def named(self, name: str) -> list[str]:
        """The ids of the active jobs named ``name`` (at most one: Dataflow's names are unique among them)."""
        return [summary.id for summary in self.active_jobs() if summary.name == name]

    def cancel(self, job_id: str) -> str:
        """Asks Dataflow to cancel job ``job_id`` and follows it until it ended (or ``CANCEL_WAIT_SECONDS``);
        returns the last state seen. A job that ended before the request stays as it ended.

        Raises:
          google.api_core.exceptions.GoogleAPICallError: Dataflow refused the request and the job has not ended.
        """
        from google.api_core import exceptions

        request = self._types.UpdateJobRequest(
            project_id=self.project,
            location=self.region,
            job_id=job_id,
            job=self._types.Job(requested_state=self._types.JobState.JOB_STATE_CANCELLED),
        )
        try:
            self._client.update_job(
                request=request, **cloud_retry.call_policy(f"cancelling Dataflow job {job_id}")
            )
        except (exceptions.GoogleAPICallError, exceptions.RetryError):
            state = self.state(job_id)
            if state in TERMINAL:  # it ended meanwhile: nothing to cancel
                return state
            raise
        logger.warning("cancelling Dataflow job %s (%s)", job_id, self.console_url(job_id))
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        try:
            state = self.state(job_id)
            while state not in TERMINAL and time.monotonic() < deadline:
                time.sleep(CANCEL_POLL_SECONDS)
                state = self.state(job_id)
        except Exception as error:  # the cancel was accepted; only following it failed
            logger.error(
                "Dataflow job %s: cancel requested, its state unread: %s", job_id, cloud_retry.one_line(error)
            )
            return "JOB_STATE_CANCELLING"
        logger.warning("Dataflow job %s is %s", job_id, state)
        return state


class _StoppableResult:
    """The DataflowRunner's result, whose ``wait_until_finish`` cancels the job if the task is stopped or fails
    while it waits, and outlasts an outage of Dataflow's API: Beam's waiter gives up after its own retries (about
    ten minutes of a failing ``get``) and would end the step while the job runs on. Everything else is the
    result's own."""

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
                api = DataflowApi(self._options)
                where = f" ({api.console_url(job_id)})"
                try:
                    state = api.state(job_id)
                except (
                    Exception
                ):  # its state cannot be read (the reason the step stops?): cancel it all the same
                    state = "UNKNOWN"
                if state not in TERMINAL:
                    state = api.cancel(job_id)
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
        """Whether Beam's waiter failed while its job still runs (its API out for longer than Beam retries): the
        job's state read with the follower's patience (``cloud_retry.Patience``); True to wait on it again."""
        from apache_beam.runners.runner import PipelineState

        if self._result.is_in_terminal_state() and self._result.state != PipelineState.UNKNOWN:
            return False
        job_id = self._result.job_id()
        api = DataflowApi(self._options)
        state = self._patience.read(lambda: api.state(job_id), f"reading Dataflow job {job_id}")
        if state in TERMINAL:
            return False
        logger.warning(
            "Dataflow job %s is %s, still followed after Beam's waiter failed: %s",
            job_id, state, cloud_retry.one_line(error),
        )  # fmt: skip
        return True


@contextlib.contextmanager
def _submission_tempdir():
    """The process's temporary directory is a new one while Beam submits the job, removed after: Beam's stager
    writes files there (the submitting environment's packages, its requirements cache) and leaves them."""
    previous, private = tempfile.tempdir, tempfile.mkdtemp(prefix="dataflow-submission-")
    tempfile.tempdir = private
    try:
        yield
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(private, ignore_errors=True)


class _FollowedJob:
    """The result of a pipeline whose job an earlier attempt submitted: Beam's ``PipelineResult`` interface over
    the jobs API. ``wait_until_finish`` reads the job's state every ``FOLLOW_POLL_SECONDS``, an outage waited out
    with the follower's patience, until it ended: done returns, any other end raises Beam's
    ``DataflowRuntimeException`` naming the state."""

    has_job = True

    def __init__(self, api: DataflowApi, job_id: str, patience: cloud_retry.Patience):
        self._api, self._job_id, self._patience = api, job_id, patience
        self._job_state = "JOB_STATE_UNKNOWN"

    def job_id(self) -> str:
        return self._job_id

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
        what = f"reading Dataflow job {self._job_id}"
        while True:
            self._job_state = self._patience.read(lambda: self._api.state(self._job_id), what)
            if self._job_state in TERMINAL or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(FOLLOW_POLL_SECONDS)
        if self._job_state in TERMINAL and self._job_state != DONE:
            where = self._api.console_url(self._job_id)
            raise DataflowRuntimeException(
                f"Dataflow job {self._job_id} is {self._job_state} ({where})", self
            )
        return self.state

    def cancel(self):
        return self._api.cancel(self._job_id)

    def metrics(self):
        raise NotImplementedError(
            f"Dataflow job {self._job_id} was submitted by an earlier attempt: see its page"
        )


def _adopt(pipeline: StoppablePipeline, error: Exception) -> _FollowedJob:
    """The result of the active job named as this pipeline's (an earlier attempt's, or a create whose answer was
    lost), followed through the jobs API; re-raises ``error`` when there is none (or none can be listed)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    name = pipeline.options.view_as(GoogleCloudOptions).job_name
    api = DataflowApi(pipeline.options)
    try:
        found = api.named(name) if name else []
    except Exception as listing:
        logger.error("looking for an active Dataflow job named %s: %s", name, cloud_retry.one_line(listing))
        found = []
    if not found:
        raise error
    logger.warning("following Dataflow job %s (%s), made by an earlier attempt: %s", found[0], name,
                   api.console_url(found[0]))  # fmt: skip
    return _FollowedJob(api, found[0], pipeline.patience or cloud_retry.Patience())


class StoppablePipeline(beam.Pipeline):
    """A Beam pipeline whose Dataflow job is cancelled when its process is stopped or fails while the job runs
    (see the module's docstring); on another runner, or off the main thread (signals reach the main thread only),
    Beam's pipeline as it is."""

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
