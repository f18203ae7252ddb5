"""A step's Vertex AI custom job (the Trainer's, the Tuner's): created or found again, followed to its end, and
cancelled when its task is stopped.

TFX's own Vertex trainer (``tfx.extensions.google_cloud_ai_platform.runner``) creates the CustomJob and polls it
until it ends, and never cancels it: when Vertex AI Pipelines or Kubeflow cancels the run, or the pipeline fails
around it, the task's container gets SIGTERM and exits, while the job goes on training on its TPU slice or GPU
machines, and billing. Here the same job is created (the CustomJob TFX's ``VertexJobClient`` builds from the
Trainer's ``custom_config``: every worker pool runs TFX's executor with this execution's inputs and outputs) and
polled, and:

- **a retried task re-attaches.** Every job carries the labels of the task that made it (``TASK_LABEL``) and of
  the outputs it writes (``OUTPUTS_LABEL``, a digest of this execution's output artifact URIs: Vertex AI
  Pipelines and Kubeflow place a task's outputs under its run's and task's own path, so the digest names the
  run and the task; it is not a runtime parameter, which would change the task's cache key every run). A task
  whose earlier attempt was killed (OOM, eviction, SIGKILL) finds that attempt's job by these labels and
  follows it, when it is still queued or running or has succeeded (its outputs are this attempt's), instead of
  starting a second job on the same outputs; other such jobs still running are cancelled. (A retry given new
  output URIs, which no documentation says either way, would start a job of its own.)
- **a stopped task leaves nothing running.** When the task receives SIGTERM or SIGINT, or anything fails while
  the job runs, the job is cancelled and followed until Vertex reports it ended, within the grace period a
  stopped pod has; the task then fails with one line naming the job. The signal is raised where the step waits
  between two reads of the job, never in the middle of a library's code (``effnet_common.task_signals``). A
  signal that arrives while ``create_custom_job`` is in flight is held until the call returns, so the job it
  created is known and cancelled; if the call raised, the jobs carrying this execution's labels are looked up and cancelled.
- **a fault of the API is waited out.** Every call goes through the project's one retry policy
  (``effnet_common.cloud_retry``): a lookup, a create, a cancel retry what Vertex documents as transient (429,
  500, 503, a deadline exceeded, a dropped connection) with exponential backoff and jitter; following the job
  waits out an outage of the API for ``--api-outage-hours`` (12 h by default) and a 403 or 404 for 5 minutes,
  so a job that trains for days is never cancelled because one poll of its state failed. Only a definite answer
  ends the step: the job ended (failed, cancelled, expired), or the API refused or did not answer for that long
  (the step then fails with one line and cancels the job if Vertex lets it). A create that failed with a
  transient error may have made the job: the jobs with this execution's labels are looked up before it is
  sent again.
- **its logs stream to Vertex AI TensorBoard** when the compiled job names an instance (``--tensorboard``): the
  compiled ``base_output_directory`` is the step's logs root under the pipeline root, to which the job adds its
  run (the run's id, else a digest of its outputs), so that each run's jobs get an ``AIP_TENSORBOARD_LOG_DIR``
  of their own (``<directory>/logs/``; a retried task's job the same one); the step logs the TensorBoard page of
  the job (``tensorboard_url``: Vertex names the instance's experiment after the job's id).
- **the timeout is the run's.** ``TimeoutRule`` (compiled into ``custom_config`` under ``TIMEOUT_KEY``) sets the
  job's ``scheduling.timeout`` from the config this execution trains (its epochs, its data, the accelerator;
  for the Tuner's job, the search's epochs over its parallel trials on that data), at most the compiled upper
  bound; the timeout compiled for the default values would kill a run of three times the epochs.
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
from effnet_common import cloud_retry
from effnet_common.task_signals import StopSignals, TaskStopped  # noqa: F401 - TaskStopped: what run_job raises

logger = logging.getLogger("components.vertex_training")

# Seconds between two polls of a running job (TFX polls every 30 s; a training job runs for hours).
POLL_SECONDS = 30.0
# After cancelling: how long to follow the job to its end. Kubernetes gives a stopped pod 30 s by default.
CANCEL_WAIT_SECONDS = 20.0
CANCEL_POLL_SECONDS = 2.0
SUCCEEDED = "JOB_STATE_SUCCEEDED"
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
CONSOLE = "https://console.cloud.google.com/vertex-ai/locations/{region}/training/{job}/cpu?project={project}"
# A custom job's page in the Vertex AI TensorBoard it streams to: the instance's experiment named after the job's id
# (google-cloud-aiplatform's ``console_utils.custom_job_tensorboard_console_uri``).
TENSORBOARD_PAGE = "https://{region}.tensorboard.googleusercontent.com/experiment/{experiment}"
# The labels that find an execution's job again (label keys and values: lowercase letters, digits, '_', '-').
TASK_LABEL = "effnet_task"
OUTPUTS_LABEL = "effnet_outputs"
# ``custom_config`` key of the Trainer's ``TimeoutRule``.
TIMEOUT_KEY = "training_timeout"


class TrainingJobFailed(RuntimeError):
    """The training job ended in a state other than succeeded, or Vertex refused it; the message is one line."""


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
    by default; the Tuner's tuning args) the job's ``project``, ``job_spec`` (worker pools, ``scheduling``, and
    with a TensorBoard its ``tensorboard`` and ``base_output_directory``), ``display_name`` and ``labels``. The job
    gets the labels of ``task`` and of this execution's outputs, a ``base_output_directory`` of its run under the
    compiled one, and, when given, ``timeout_seconds`` as its ``scheduling.timeout``.
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
    if output:  # the compiled logs root of the step: the run's own directory under it
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


def run_job(
    request: JobRequest, poll_seconds: float | None = None, patience: cloud_retry.Patience | None = None
):
    """Finds the job an earlier attempt of this execution started, or creates it; follows it until it ends
    and returns it; cancels it if this task is stopped or fails.

    Raises:
      TaskStopped: SIGTERM / SIGINT arrived; the job was cancelled (and followed until it ended, or for
        ``CANCEL_WAIT_SECONDS``).
      TrainingJobFailed: the job ended failed, cancelled (by someone else) or expired; Vertex refused it; or its
        state could not be read for the whole of ``patience`` (an outage) or 5 minutes (a refusal).
    """
    from google.cloud.aiplatform import gapic

    client = gapic.JobServiceClient(client_options={"api_endpoint": request.api_endpoint})
    interval = POLL_SECONDS if poll_seconds is None else poll_seconds
    job = None
    stop = StopSignals()
    with stop.installed():
        try:
            job = earlier_job(client, request)
            if job is None:
                job = _create(client, request, stop)
                logger.info("training job %s created: %s", job.name, console_url(job.name))
            if job.job_spec.tensorboard:
                logger.info(
                    "TensorBoard of training job %s: %s",
                    job.name,
                    tensorboard_url(job.job_spec.tensorboard, job.name),
                )
            job = follow(client, job.name, interval, patience or cloud_retry.Patience(), stop)
        except cloud_retry.Unanswered as error:  # its state could not be read for too long: the step gives up
            stop.ignore()
            cancel(client, job.name)
            raise TrainingJobFailed(f"{error} ({console_url(job.name)})") from None
        except BaseException:
            stop.ignore()
            if job is None:
                cancel_labelled(client, request)
            else:
                cancel(client, job.name)
            raise
    if job.state.name != SUCCEEDED:
        reason = job.error.message or "no error message"
        raise TrainingJobFailed(
            f"training job {job.name} ended {job.state.name}: {reason} ({console_url(job.name)})"
        )
    logger.info("training job %s succeeded", job.name)
    return job


def follow(client, name: str, poll_seconds: float, patience: cloud_retry.Patience, stop: StopSignals):
    """Reads job ``name`` every ``poll_seconds`` until it has ended and returns it. A read that fails is waited
    out as ``patience`` says (``cloud_retry.Patience.read``), never taken for the job's end.

    Raises:
      cloud_retry.Unanswered: Vertex did not answer, or refused, for longer than ``patience`` waits.
    """
    what = f"reading training job {name}"

    def read():
        return client.get_custom_job(name=name, timeout=cloud_retry.CALL_TIMEOUT_SECONDS)

    while True:
        job = patience.read(read, what)
        if job.state.name in ENDED:
            return job
        stop.wait(poll_seconds)


def _create(client, request: JobRequest, stop: StopSignals):
    """Creates the job, retrying transient errors (``cloud_retry.call_retry``). A create that failed that way
    may have made the job: before each retry the jobs carrying this execution's labels are looked up, and the
    newest is taken instead of a second one. A signal is held while the create call is in flight only."""
    from google.api_core import exceptions

    sent = False

    def attempt():
        nonlocal sent
        stop.check()  # stopped while an earlier job was looked up: nothing to create and cancel
        if sent:
            made = labelled_jobs(client, request)
            if made:
                logger.warning("a create that failed had made training job %s: following it", made[0].name)
                return made[0]
        sent = True
        with stop.held():
            return client.create_custom_job(
                parent=request.parent, custom_job=request.custom_job, timeout=cloud_retry.CALL_TIMEOUT_SECONDS
            )

    try:
        return cloud_retry.retried(attempt, f"creating a training job in {request.parent}")
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


def earlier_job(client, request: JobRequest):
    """The job an earlier attempt of this execution started, to be followed instead of a new one: the newest
    of its jobs that is queued, running or succeeded (None if there is none). Its other jobs still running are
    cancelled: they write the same outputs."""
    reused = None
    for job in labelled_jobs(client, request):
        state = job.state.name
        if reused is None and (state == SUCCEEDED or state not in ENDED):
            reused = job
            logger.warning(
                "following training job %s (%s), started by an earlier attempt of this task: %s",
                job.name, state, console_url(job.name),
            )  # fmt: skip
        elif state not in ENDED:
            cancel(client, job.name)
    return reused


def cancel_labelled(client, request: JobRequest) -> list[str]:
    """Cancels every job of this execution that has not ended (a create interrupted or failed may have made
    one); returns their names. Best effort, as ``cancel``."""
    try:
        running = [job.name for job in labelled_jobs(client, request) if job.state.name not in ENDED]
    except Exception as error:  # the task is failing anyway; say what could not be done
        logger.error("could not look up the training jobs labelled %s: %s", request.find_labels, error)
        return []
    for name in running:
        cancel(client, name)
    return running


def cancel(client, name: str, retry_seconds: float | None = None) -> str:
    """Asks Vertex to cancel job ``name`` and follows it until it ended (or ``CANCEL_WAIT_SECONDS``); returns
    the last state seen. Transient errors are retried for ``retry_seconds`` (by default what fits in the grace
    period of a stopped task). Cancellation is best effort: a failure to reach Vertex is logged, not raised."""
    retry = cloud_retry.call_retry(f"cancelling training job {name}")
    retry = retry.with_timeout(CANCEL_WAIT_SECONDS if retry_seconds is None else retry_seconds)
    calls = {"retry": retry, "timeout": cloud_retry.CALL_TIMEOUT_SECONDS}
    try:
        client.cancel_custom_job(name=name, **calls)
        logger.warning("cancelling training job %s", name)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        state = client.get_custom_job(name=name, **calls).state.name
        while state not in ENDED and time.monotonic() < deadline:
            time.sleep(CANCEL_POLL_SECONDS)
            state = client.get_custom_job(name=name, **calls).state.name
    except Exception as error:  # the task is failing anyway; say what could not be done
        logger.error("could not cancel training job %s: %s (%s)", name, error, console_url(name))
        return "UNKNOWN"
    logger.warning("training job %s is %s", name, state)
    return state
