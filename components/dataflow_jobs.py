"""Dataflow jobs: a Beam step's job cancelled when its task is stopped, a run's jobs found and cancelled.

Beam's DataflowRunner submits a step's job and then waits on it; when the task that waits is stopped (its run is
cancelled, its pod evicted: the container gets SIGTERM), the task exits and the job goes on, on up to a hundred
workers. ``StoppablePipeline`` is the Beam pipeline of such a step (the sharding step, the Evaluator): on
Dataflow, a SIGTERM or SIGINT while the job runs, or any failure while the step waits on it, cancels the job and
follows it until Dataflow reports it ended (within the grace period a stopped pod has); the task then fails
with one line naming the job. A signal that arrives while the job is being submitted is held until Dataflow
has returned its id, then acted on. The submission writes its files (Beam's stager: the list of the
submitting environment's packages, the requirements cache) into a temporary directory of its own, removed once
the job is submitted: Beam leaves them in the process's temporary directory. On other runners it is Beam's
pipeline as it is. ``beam_preprocess``'s command line runs its Dataflow jobs in one too.

A retried task re-attaches: a step's job is named after its execution (``execution_job_name``: a digest of the
task's output URIs, which a retried task keeps), and Dataflow answers a create whose name is that of an active job
with that job; Beam's client reports it as ``DataflowJobAlreadyExistsError`` (its request id not Beam's), and the
step follows that job instead of failing (``StoppablePipeline.run``). The same answer finds the job of a create
whose first answer was lost, when Beam's client sends it again.

``DataflowApi`` reaches the jobs of one project and region with Beam's own Dataflow client (the one the
DataflowRunner submits with), built from the step's Beam options: ``--project`` and ``--region`` (where the
jobs are), ``--dataflow_endpoint``, and the credentials Beam finds for them (``--impersonate_service_account``,
``--no_auth``). ``jobs_labelled`` finds a run's jobs by a label: Dataflow's list returns summaries without
labels, so each active job is read with the view that carries them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import signal
import tempfile
import threading
import time

import apache_beam as beam

from effnet_common import cloud_retry

logger = logging.getLogger("components.dataflow_jobs")

# After cancelling: how long to follow the job to its end. Kubernetes gives a stopped pod 30 s by default.
CANCEL_WAIT_SECONDS = 20.0
CANCEL_POLL_SECONDS = 2.0
CANCELLED = "JOB_STATE_CANCELLED"
# Dataflow's terminal job states: a job in one of them cannot be cancelled.
TERMINAL = ("JOB_STATE_DONE", "JOB_STATE_FAILED", CANCELLED, "JOB_STATE_UPDATED", "JOB_STATE_DRAINED")
CONSOLE = "https://console.cloud.google.com/dataflow/jobs/{region}/{job}?project={project}"
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TaskStopped(RuntimeError):
    """The pipeline task was told to stop (SIGTERM / SIGINT) while its Dataflow job ran."""


@dataclasses.dataclass(frozen=True)
class DataflowJob:
    """A Dataflow job as the clean-up reports it."""

    id: str
    name: str
    state: str


class DataflowApi:
    """The Dataflow jobs of the project and region of a step's Beam options."""

    def __init__(self, options):
        from apache_beam.internal.gcp.auth import get_service_credentials
        from apache_beam.internal.http_client import get_new_http
        from apache_beam.options.pipeline_options import GoogleCloudOptions
        from apache_beam.runners.dataflow.internal.clients import dataflow

        cloud = options.view_as(GoogleCloudOptions)
        self.project, self.region = cloud.project, cloud.region
        self._messages = dataflow
        self._client = dataflow.DataflowV1b3(
            url=cloud.dataflow_endpoint,
            credentials=None if cloud.no_auth else get_service_credentials(options),
            get_credentials=not cloud.no_auth,
            http=get_new_http(),
            response_encoding="utf8",
        )

    @classmethod
    def from_args(cls, beam_args: list[str]) -> DataflowApi:
        from apache_beam.options.pipeline_options import PipelineOptions

        return cls(PipelineOptions(beam_args))

    def console_url(self, job_id: str) -> str:
        return CONSOLE.format(region=self.region, job=job_id, project=self.project)

    def _where(self) -> dict:
        return {"projectId": self.project, "location": self.region}

    def get(self, job_id: str, with_labels: bool = False):
        """The job (a Dataflow ``Job`` message); ``with_labels`` asks for the view that carries its labels."""
        requests = self._messages
        view = requests.DataflowProjectsLocationsJobsGetRequest.ViewValueValuesEnum
        request = requests.DataflowProjectsLocationsJobsGetRequest(
            jobId=job_id,
            view=view.JOB_VIEW_DESCRIPTION if with_labels else view.JOB_VIEW_SUMMARY,
            **self._where(),
        )
        return cloud_retry.retried(
            lambda: self._client.projects_locations_jobs.Get(request), f"reading Dataflow job {job_id}"
        )

    def state(self, job_id: str) -> str:
        return str(self.get(job_id).currentState)

    def active_jobs(self):
        """Every job not in a terminal state, as summaries, page after page."""
        requests = self._messages
        active = requests.DataflowProjectsLocationsJobsListRequest.FilterValueValuesEnum.ACTIVE
        token = None
        while True:
            request = requests.DataflowProjectsLocationsJobsListRequest(
                filter=active, pageToken=token, **self._where()
            )
            response = cloud_retry.retried(
                lambda request=request: self._client.projects_locations_jobs.List(request),
                f"listing the Dataflow jobs of {self.project}/{self.region}",
            )
            yield from response.jobs
            token = response.nextPageToken
            if not token:
                return

    def jobs_labelled(self, key: str, value: str) -> list[DataflowJob]:
        """The active jobs carrying label ``key=value``."""
        found = []
        for summary in self.active_jobs():
            job = self.get(summary.id, with_labels=True)
            labels = {p.key: p.value for p in job.labels.additionalProperties} if job.labels else {}
            if labels.get(key) == value and str(job.currentState) not in TERMINAL:
                found.append(DataflowJob(job.id, job.name or "", str(job.currentState)))
        return found

    def cancel(self, job_id: str) -> str:
        """Asks Dataflow to cancel job ``job_id`` and follows it until it ended (or ``CANCEL_WAIT_SECONDS``);
        returns the last state seen. A job that ended before the request stays as it ended.

        Raises:
          apitools' HttpError: Dataflow refused the request and the job has not ended.
        """
        from apitools.base.py import exceptions

        requests = self._messages
        cancel = requests.Job(requestedState=requests.Job.RequestedStateValueValuesEnum.JOB_STATE_CANCELLED)
        request = requests.DataflowProjectsLocationsJobsUpdateRequest(
            jobId=job_id, job=cancel, **self._where()
        )
        try:
            cloud_retry.retried(
                lambda: self._client.projects_locations_jobs.Update(request),
                f"cancelling Dataflow job {job_id}",
            )
        except exceptions.HttpError:
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


class _StopSignals:
    """SIGTERM / SIGINT while inside: raise ``TaskStopped`` at once, or (``held``) note them in ``received``."""

    def __init__(self, held: bool = False):
        self.held = held
        self.received: str | None = None
        self._previous = {}

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.held:
            self.received = self.received or name
            return
        raise TaskStopped(f"the pipeline task received {name}")

    def __enter__(self) -> _StopSignals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in _STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _ignoring_signals():
    """A second signal must not interrupt the cancellation."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
        with _ignoring_signals():
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
        with _StopSignals():
            try:
                while True:
                    try:
                        return self._result.wait_until_finish(duration)
                    except (TaskStopped, KeyboardInterrupt):
                        raise
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


def execution_job_name(output_dict: dict) -> str:
    """The Dataflow job name of a step's execution: the same for a retried task (it keeps its output URIs), another
    for every other execution (Dataflow's names: ``[a-z]([-a-z0-9]*[a-z0-9])?``)."""
    from components import vertex_training

    return f"effnet-{vertex_training.outputs_digest(output_dict)}"


def _adopt(pipeline, error: Exception):
    """The result of the active job already named as this pipeline's (an earlier attempt's, or a create whose
    answer was lost), for Beam's waiter to follow; re-raises ``error`` when there is none."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult

    name = pipeline._options.view_as(GoogleCloudOptions).job_name
    api = DataflowApi(pipeline._options)
    found = [summary.id for summary in api.active_jobs() if summary.name == name]
    if not found:
        raise error
    logger.warning(
        "following Dataflow job %s (%s), made by an earlier attempt: %s",
        found[0],
        name,
        api.console_url(found[0]),
    )
    return DataflowPipelineResult(api.get(found[0]), pipeline.runner)


class StoppablePipeline(beam.Pipeline):
    """A Beam pipeline whose Dataflow job is cancelled when its task is stopped or fails while the job runs (see
    the module's docstring); on another runner, or off the main thread (signals reach the main thread only),
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
        from apache_beam.runners.dataflow.internal.apiclient import DataflowJobAlreadyExistsError

        # Signals are held until the job has an id; Beam's submission files go with their own directory.
        with _StopSignals(held=True) as signals, _submission_tempdir():
            try:
                result = super().run(test_runner_api)
            except DataflowJobAlreadyExistsError as error:  # a job of this execution's name runs: follow it
                result = _adopt(self, error)
        if not getattr(result, "has_job", False):  # a template was written: no job runs
            return result
        stoppable = _StoppableResult(result, self._options, self.patience)
        if signals.received:
            stoppable.stop(TaskStopped(f"the pipeline task received {signals.received}"))
        return stoppable


class StoppableBeamExecutor:
    """Mixin for a TFX Beam executor (before it in the bases): its Beam pipeline is a ``StoppablePipeline`` whose
    Dataflow job carries the label of the run named among the task's arguments, or in its output URIs on
    Kubeflow (``components.run_label``), and the name of the task's execution (``execution_job_name``)."""

    _run_outputs: dict | None = None

    def take_run_outputs(self, output_dict: dict) -> None:
        """Keeps the task's outputs, where a Kubeflow run's id is (``run_label.kfp_run_arg``): each executor's
        ``Do`` calls it before its Beam pipeline is made."""
        self._run_outputs = output_dict

    def _make_beam_pipeline(self):
        from components import run_label

        if self._make_beam_pipeline_fn is not None:  # a TFX operator's own pipeline
            return self._make_beam_pipeline_fn()
        run_id, args = run_label.take_run_id(self._beam_pipeline_args, self._run_outputs)
        patience, args = cloud_retry.take_patience(args)
        if self._run_outputs and not any(arg.startswith("--job_name") for arg in args):
            args = [*args, f"--job_name={execution_job_name(self._run_outputs)}"]
        pipeline = StoppablePipeline(argv=[*args, *run_label.beam_args(run_id)])
        pipeline.patience = patience
        return pipeline
