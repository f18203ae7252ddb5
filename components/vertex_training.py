"""A step's Vertex AI custom job (the Trainer's, the Tuner's): created, followed to its end, and cancelled
when its task is stopped.

TFX's own Vertex trainer (``tfx.extensions.google_cloud_ai_platform.runner``) creates the CustomJob and polls it
until it ends, and never cancels it: when Vertex AI Pipelines or Kubeflow cancels the run, or the pipeline fails
around it, the task's container gets SIGTERM and exits, while the job goes on training on its TPU slice or GPU
machines, and billing. Here the same job is created (the CustomJob TFX's ``VertexJobClient`` builds from the
Trainer's ``custom_config``: every worker pool runs TFX's executor with this execution's inputs and outputs) and
polled, and when the task receives SIGTERM or SIGINT, or anything fails while the job runs, the job is cancelled
and followed until Vertex reports it ended, within the grace period a stopped pod has; the task then fails with
one line naming the job.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import signal
import time
from typing import Any

logger = logging.getLogger("components.vertex_training")

# Seconds between two polls of a running job (TFX polls every 30 s; a training job runs for hours).
POLL_SECONDS = 30.0
# After cancelling: how long to follow the job to its end. Kubernetes gives a stopped pod 30 s by default.
CANCEL_WAIT_SECONDS = 20.0
CANCEL_POLL_SECONDS = 2.0
SUCCEEDED = "JOB_STATE_SUCCEEDED"
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
CONSOLE = "https://console.cloud.google.com/vertex-ai/locations/{region}/training/{job}/cpu?project={project}"


class TaskStopped(RuntimeError):
    """The pipeline task was told to stop (SIGTERM / SIGINT) while its training job ran."""


class TrainingJobFailed(RuntimeError):
    """The training job ended in a state other than succeeded; the message is one line."""


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """A CustomJob to create: where (project, region) and what (the ``CustomJob`` as a dict)."""

    project: str
    region: str
    custom_job: dict

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    @property
    def api_endpoint(self) -> str:
        return f"{self.region}-aiplatform.googleapis.com"


def job_request(
    input_dict: dict,
    output_dict: dict,
    exec_properties: dict[str, Any],
    custom_config: dict,
    executor_class_path: str,
    args_key: str = "",
) -> JobRequest:
    """The CustomJob whose worker pools run ``executor_class_path`` on this execution, as TFX builds it.

    ``custom_config`` holds TFX's Vertex keys: the region, and under ``args_key`` (the Trainer's training args
    by default; the Tuner's tuning args) the job's ``project``, ``job_spec`` (worker pools, ``scheduling``),
    ``display_name`` and ``labels``.
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
    builder = training_clients.VertexJobClient(region)
    custom_job = builder.create_training_job(
        input_dict, output_dict, exec_properties, executor_class_path, job_args, None, None
    )
    return JobRequest(project, region, custom_job)


def console_url(job_name: str) -> str:
    """The Cloud console page of a CustomJob ``projects/P/locations/L/customJobs/ID``."""
    parts = job_name.split("/")
    fields = dict(zip(parts[0::2], parts[1::2], strict=False))
    return CONSOLE.format(region=fields["locations"], job=fields["customJobs"], project=fields["projects"])


def _raise_stopped(signum, frame):
    raise TaskStopped(f"the pipeline task received {signal.Signals(signum).name}")


def run_job(request: JobRequest, poll_seconds: float | None = None):
    """Creates the job, polls it until it ends and returns it; cancels it if this task is stopped or fails.

    Raises:
      TaskStopped: SIGTERM / SIGINT arrived; the job was cancelled (and followed until it ended, or for
        ``CANCEL_WAIT_SECONDS``).
      TrainingJobFailed: the job ended failed, cancelled (by someone else) or expired.
    """
    from google.cloud.aiplatform import gapic

    client = gapic.JobServiceClient(client_options={"api_endpoint": request.api_endpoint})
    job = client.create_custom_job(parent=request.parent, custom_job=request.custom_job)
    logger.info("training job %s created: %s", job.name, console_url(job.name))
    interval = POLL_SECONDS if poll_seconds is None else poll_seconds
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while job.state.name not in ENDED:
            time.sleep(interval)
            job = client.get_custom_job(name=job.name)
    except BaseException:
        for sig in previous:  # a second signal must not interrupt the cancellation
            signal.signal(sig, signal.SIG_IGN)
        cancel(client, job.name)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if job.state.name != SUCCEEDED:
        reason = job.error.message or "no error message"
        raise TrainingJobFailed(
            f"training job {job.name} ended {job.state.name}: {reason} ({console_url(job.name)})"
        )
    logger.info("training job %s succeeded", job.name)
    return job


def cancel(client, name: str) -> str:
    """Asks Vertex to cancel job ``name`` and follows it until it ended (or ``CANCEL_WAIT_SECONDS``); returns
    the last state seen. Cancellation is best effort: a failure to reach Vertex is logged, not raised."""
    try:
        client.cancel_custom_job(name=name)
        logger.warning("cancelling training job %s", name)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        state = client.get_custom_job(name=name).state.name
        while state not in ENDED and time.monotonic() < deadline:
            time.sleep(CANCEL_POLL_SECONDS)
            state = client.get_custom_job(name=name).state.name
    except Exception as error:  # the task is failing anyway; say what could not be done
        logger.error("could not cancel training job %s: %s (%s)", name, error, console_url(name))
        return "UNKNOWN"
    logger.warning("training job %s is %s", name, state)
    return state
