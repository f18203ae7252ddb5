"""A step's Vertex AI custom job (the Trainer's, the Tuner's): created once or found again, followed to its
end, and cancelled when its task is stopped or fails.

The job is the CustomJob TFX's ``VertexJobClient`` builds from the step's ``custom_config`` (every worker pool
runs TFX's executor on this execution's inputs and outputs). ``CustomJob`` adapts it to
``effnet_common.follower``, which creates, re-attaches, follows and cancels it; TFX's own Vertex trainer only
polls, so a stopped run would leave its job training. What is Vertex's own lives here: the labels that find an
execution's job again (``TASK_LABEL``, and ``OUTPUTS_LABEL``: a digest of its output URIs, which name the run
and the task without a runtime parameter that would change the cache key every run); the job's TensorBoard
directory, one per run; and its timeout (``TimeoutRule``), from the run actually trained rather than the
compiled defaults. Behaviour and tests: docs/vertex.md.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import time
from typing import Any

from components import run_label
from effnet_common import cloud_retry, follower
from effnet_common.task_signals import StopSignals, TaskStopped  # noqa: F401 - raised by run_job

logger = logging.getLogger("components.vertex_training")

# Seconds between two reads of a running job: TFX's own runner's interval (a training job lasts hours).
POLL_SECONDS = 30.0
SUCCEEDED = "JOB_STATE_SUCCEEDED"
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
CONSOLE = "https://console.cloud.google.com/vertex-ai/locations/{region}/training/{job}/cpu?project={project}"
# A custom job's page in the Vertex AI TensorBoard it streams to: the instance's experiment named after the
# job's id (google-cloud-aiplatform's ``console_utils.custom_job_tensorboard_console_uri``).
TENSORBOARD_PAGE = "https://{region}.tensorboard.googleusercontent.com/experiment/{experiment}"
# The labels that find an execution's job again (label keys and values: lowercase letters, digits, '_', '-').
TASK_LABEL = "effnet_task"
OUTPUTS_LABEL = "effnet_outputs"
# ``custom_config`` key of the Trainer's ``TimeoutRule``.
TIMEOUT_KEY = "training_timeout"


class TrainingJobFailed(RuntimeError):
    """The training job ended other than succeeded, or Vertex refused it; the message is one line."""


@dataclasses.dataclass(frozen=True)
class TimeoutRule:
    """How a step sets its job's timeout: ``components.accelerators.job_timeout`` of the config it trains on
    ``machines`` of ``accelerator``, at most ``max_seconds`` (the compiled upper bound). A tuning job
    (``search_epochs`` > 0) trains ``search_epochs`` epochs of that config in all, on ``parallel_trials``
    machines at once."""

    accelerator: str
    machines: int
    max_seconds: int
    search_epochs: int = 0
    parallel_trials: int = 1

    def to_config(self) -> dict:
        """The rule as compiled: a training job's without the tuning fields (its compiled config, and so its
        task's cache key, as before they existed)."""
        values = dataclasses.asdict(self)
        if not self.search_epochs:
            del values["search_epochs"], values["parallel_trials"]
        return values

    @classmethod
    def from_config(cls, custom_config: dict) -> TimeoutRule | None:
        """The rule compiled into ``custom_config``, or None (a pipeline compiled without one)."""
        values = custom_config.get(TIMEOUT_KEY)
        return cls(**values) if values else None

    def planned(self, trainer_config) -> dict:
        """What ``--plan`` estimates for ``trainer_config`` on this rule's machines."""
        from components import accelerators

        return accelerators.planned(trainer_config, accelerators.get(self.accelerator, self.machines))

    def seconds(self, trainer_config) -> int:
        """The timeout of a job training ``trainer_config`` (the same estimate ``--plan`` prints)."""
        from components import accelerators

        machine = accelerators.get(self.accelerator, self.machines)
        if not self.search_epochs:
            return accelerators.job_timeout(trainer_config, machine, self.max_seconds)
        per_epoch = accelerators.estimate(trainer_config, machine).hours / trainer_config.loop.train_epochs
        hours = per_epoch * self.search_epochs / self.parallel_trials
        return min(accelerators.timeout_for(hours * 3600), self.max_seconds)


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """A CustomJob to create: where (project, region), what (the ``CustomJob`` as a dict), and the labels that
    find it again (``find_labels``: the task's and its outputs', also among the job's labels)."""

    project: str
    region: str
    custom_job: dict
    find_labels: dict = dataclasses.field(default_factory=dict)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def api_endpoint(self) -> str:
        return f"{self.region}-aiplatform.googleapis.com"


def outputs_digest(output_dict: dict) -> str:
    """A label value naming this execution's outputs: a digest of its output artifacts' URIs, by key."""
    uris = {key: sorted(artifact.uri for artifact in artifacts) for key, artifacts in output_dict.items()}
    return hashlib.sha256(json.dumps(uris, sort_keys=True).encode()).hexdigest()[:32]


def job_request(
    input_dict: dict,
    output_dict: dict,
    exec_properties: dict[str, Any],
    custom_config: dict,
    executor_class_path: str,
    args_key: str = "",
    task: str = "trainer",
    timeout_seconds: int | None = None,
) -> JobRequest:
    """The CustomJob whose worker pools run ``executor_class_path`` on this execution, as TFX builds it.

    ``custom_config`` holds TFX's Vertex keys: the region, and under ``args_key`` (the Trainer's training args
    by default; the Tuner's tuning args) the job's ``project``, ``job_spec`` (worker pools, ``scheduling``,
    and with a TensorBoard its ``tensorboard`` and ``base_output_directory``), ``display_name`` and
    ``labels``. The job gets the labels of ``task`` and of this execution's outputs, a
    ``base_output_directory`` of its run under the compiled one, and, when given, ``timeout_seconds`` as its
    ``scheduling.timeout``.
    """
    from tfx import v1 as tfx
    from tfx.extensions.google_cloud_ai_platform import training_clients

    vertex = tfx.extensions.google_cloud_ai_platform
    region = custom_config[vertex.VERTEX_REGION_KEY]
    job_args = copy.deepcopy(custom_config[args_key or vertex.TRAINING_ARGS_KEY])
    project = job_args.pop("project")
    if "display_name" in job_args:  # a run of its own: the compiled name plus when it started
        job_args["display_name"] = (
            f"{job_args['display_name']}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        )
    if timeout_seconds is not None:
        job_args.setdefault("job_spec", {}).setdefault("scheduling", {})["timeout"] = f"{timeout_seconds}s"
    find_labels = {TASK_LABEL: task, OUTPUTS_LABEL: outputs_digest(output_dict)}
    job_args["labels"] = {**job_args.get("labels", {}), **find_labels}
    output = job_args.get("job_spec", {}).get("base_output_directory")
    if output:  # the step's compiled logs root: a directory of the run's own (a retry's job: the same)
        run = job_args["labels"].get(run_label.RUN_LABEL) or find_labels[OUTPUTS_LABEL]
        prefix = output["output_uri_prefix"].rstrip("/")
        job_args["job_spec"]["base_output_directory"] = {"output_uri_prefix": f"{prefix}/{run}"}
    builder = training_clients.VertexJobClient(region)
    custom_job = builder.create_training_job(
        input_dict, output_dict, exec_properties, executor_class_path, job_args, None, None
    )
    return JobRequest(project, region, custom_job, find_labels)


def console_url(job_name: str) -> str:
    """The Cloud console page of a CustomJob ``projects/P/locations/L/customJobs/ID``."""
    parts = job_name.split("/")
    fields = dict(zip(parts[0::2], parts[1::2], strict=False))
    return CONSOLE.format(region=fields["locations"], job=fields["customJobs"], project=fields["projects"])


def tensorboard_url(tensorboard: str, job_name: str) -> str:
    """The page of CustomJob ``job_name`` in Vertex AI TensorBoard instance ``tensorboard``
    (``projects/P/locations/L/tensorboards/T``): its experiment ``{tensorboard}/experiments/{job id}``."""
    region = tensorboard.split("/locations/", 1)[1].split("/", 1)[0]
    experiment = f"{tensorboard}/experiments/{job_name.rsplit('/', 1)[-1]}"
    return TENSORBOARD_PAGE.format(region=region, experiment=experiment.replace("/", "+"))


class CustomJob(follower.Resource):
    """A Vertex AI custom job, as the follower reads and cancels it; ``last`` is the job as last read."""

    ended_states = ENDED

    def __init__(self, client, name: str, last=None):
        self.client, self.name, self.last = client, name, last
        self.what = f"training job {name}"
        self.poll_seconds = POLL_SECONDS

    def read(self) -> str:
        self.last = self.client.get_custom_job(name=self.name, timeout=cloud_retry.CALL_TIMEOUT_SECONDS)
        return self.last.state.name

    def request_cancel(self) -> None:
        self.client.cancel_custom_job(name=self.name, timeout=cloud_retry.CALL_TIMEOUT_SECONDS)

    def url(self) -> str:
        return console_url(self.name)


def run_job(
    request: JobRequest, poll_seconds: float | None = None, patience: cloud_retry.Patience | None = None
):
    """Finds the job an earlier attempt of this execution started, or creates it; follows it until it ends
    and returns it; cancels it if this task is stopped or fails.

    Raises:
      TaskStopped: SIGTERM / SIGINT arrived; the job was cancelled (and followed until it ended, or for
        ``follower.CANCEL_WAIT_SECONDS``).
      TrainingJobFailed: the job ended failed, cancelled (by someone else) or expired; Vertex refused it; or
        its state could not be read for the whole of ``patience`` (an outage) or 5 minutes (a refusal).
    """
    from google.cloud.aiplatform import gapic

    client = gapic.JobServiceClient(client_options={"api_endpoint": request.api_endpoint})
    job: CustomJob | None = None
    stop = StopSignals()

    def running() -> list[CustomJob]:  # a create interrupted or failed may have made a job: found by labels
        return [job] if job is not None else _unended(client, request)

    try:
        with stop.installed(), follower.cancelled_on_failure(running, stop):
            job = earlier_job(client, request)
            if job is None:
                made = _create(client, request, stop)
                job = CustomJob(client, made.name, made)
                logger.info("training job %s created: %s", job.name, job.url())
            if job.last.job_spec.tensorboard:
                url = tensorboard_url(job.last.job_spec.tensorboard, job.name)
                logger.info("TensorBoard of training job %s: %s", job.name, url)
            if poll_seconds is not None:
                job.poll_seconds = poll_seconds
            follower.follow(job, patience or cloud_retry.Patience(), stop)
    except cloud_retry.Unanswered as error:  # its state could not be read for too long: the step gives up
        raise TrainingJobFailed(f"{error} ({job.url()})") from None
    found = job.last
    if found.state.name != SUCCEEDED:
        reason = found.error.message or "no error message"
        raise TrainingJobFailed(f"training job {job.name} ended {found.state.name}: {reason} ({job.url()})")
    logger.info("training job %s succeeded", job.name)
    return found


def _create(client, request: JobRequest, stop: StopSignals):
    """Creates the job (``follower.create``: a create that failed with a transient error may have made it,
    so the newest job carrying this execution's labels is taken before a second is sent)."""
    from google.api_core import exceptions

    def send():
        return client.create_custom_job(
            parent=request.parent, custom_job=request.custom_job, timeout=cloud_retry.CALL_TIMEOUT_SECONDS
        )

    def find():
        made = labelled_jobs(client, request)
        return made[0] if made else None

    try:
        return follower.create(send, find, f"creating a training job in {request.parent}", stop)
    except (exceptions.InvalidArgument, exceptions.FailedPrecondition) as error:
        raise TrainingJobFailed(f"Vertex AI refused the training job: {error.message}") from None


def labelled_jobs(client, request: JobRequest) -> list:
    """The jobs carrying ``request``'s labels (the jobs of this execution), newest first."""
    if not request.find_labels:
        return []
    found = client.list_custom_jobs(
        request={
            "parent": request.parent,
            "filter": f'labels.{OUTPUTS_LABEL}="{request.find_labels[OUTPUTS_LABEL]}"',
        },
        retry=cloud_retry.call_retry(f"listing the training jobs of {request.parent}"),
        timeout=cloud_retry.CALL_TIMEOUT_SECONDS,
    )
    jobs = [job for job in found if all(job.labels.get(k) == v for k, v in request.find_labels.items())]
    return sorted(jobs, key=lambda job: job.create_time, reverse=True)


def earlier_job(client, request: JobRequest) -> CustomJob | None:
    """The job an earlier attempt of this execution started, to be followed instead of a new one: the newest
    of its jobs that is queued, running or succeeded (None if there is none). Its other jobs still running are
    cancelled: they write the same outputs."""
    found = [(CustomJob(client, job.name, job), job.state.name) for job in labelled_jobs(client, request)]
    return follower.reattach(found, lambda state: state == SUCCEEDED or state not in ENDED)


def _unended(client, request: JobRequest) -> list[CustomJob]:
    """This execution's jobs that have not ended; none when they cannot be listed (logged)."""
    try:
        jobs = labelled_jobs(client, request)
    except Exception as error:  # the task is failing anyway; say what could not be done
        logger.error("could not look up the training jobs labelled %s: %s", request.find_labels, error)
        return []
    return [CustomJob(client, job.name) for job in jobs if job.state.name not in ENDED]


def job_spans(job, training) -> list:
    """The time account's spans of a custom job around its training (``training``, the trainer's
    ``effnet_common.goodput.TimeAccount``): created to first RUNNING (``create_time`` to ``start_time``:
    queued and provisioned), then to the training's start (image pull, container start), and from the
    training's end to the job's (``end_time``). [] for a job that never ran (no ``start_time``)."""
    from effnet_common import goodput

    created, running, ended = (
        _seconds(getattr(job, key, None)) for key in ("create_time", "start_time", "end_time")
    )
    if running is None:
        return []
    spans = [goodput.Span(running, training.start, "WORKER_SETUP")]
    if created:
        spans.append(goodput.Span(created, running, "PROVISIONING"))
    if ended:
        spans.append(goodput.Span(training.end, ended, "TEARDOWN"))
    return spans


def held_hours(job) -> float | None:
    """The hours the job held its machines: from its first RUNNING to its end."""
    running, ended = _seconds(getattr(job, "start_time", None)), _seconds(getattr(job, "end_time", None))
    return (ended - running) / 3600 if running and ended else None


def _seconds(timestamp) -> float | None:
    """Seconds since the epoch of a job's timestamp (None when the service set none)."""
    if timestamp is None:
        return None
    seconds = timestamp.timestamp()
    return seconds if seconds > 0 else None
