"""Submitting a compiled pipeline to Vertex AI Pipelines (``pipeline.submission``: what both backends share).

The ``google-cloud-aiplatform`` SDK's ``PipelineJob``, submitted as the compiled template's service account
and network, under its compiled pipeline root (where its serving directory and Dataflow's temp location are),
with the compiled labels (the SDK takes them only from its argument, not from the template). A template whose
training jobs stream to a Vertex AI TensorBoard has the instance looked up first (``check_tensorboard``);
``--experiment NAME`` puts the run into that Vertex AI experiment (``find_experiment`` before the job is
created, ``add_to_experiment`` after: the calls ``PipelineJob.submit(experiment=...)`` makes, made here so
that a failure after the create never creates the job again). The job's id is this submission's own: a create
sent again after its answer was lost is refused ``ALREADY_EXISTS``, and the job is read instead.
"""

from __future__ import annotations

import re
import sys
import time

from effnet_common import cloud_retry, follower
from pipeline.submission import VERTEX_FINAL, Submitted, caching_written, submission_id

VERTEX_CONSOLE = (
    "https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{job}?project={project}"
)
# A Vertex AI experiment's name: the id of its metadata context (``CreateContextRequest.context_id``).
EXPERIMENT_NAME = re.compile(r"^[a-z0-9-]{4,128}$")
# After the create: how often, and for how long at most, the job is read until Vertex has made its run's
# metadata context (it does so asynchronously as the run starts; the SDK reads it every second until the job
# ends).
RUN_CONTEXT_POLL_SECONDS = 2.0
RUN_CONTEXT_WAIT_SECONDS = 600.0
# The role the training jobs' service account needs to stream to a TensorBoard (docs/run-page-research.md, 2).
TENSORBOARD_ROLE = "roles/aiplatform.user"


def vertex_console_url(resource_name: str) -> str:
    """The Cloud console page of a PipelineJob ``projects/P/locations/L/pipelineJobs/J``."""
    parts = resource_name.split("/")
    fields = dict(zip(parts[0::2], parts[1::2], strict=False))
    return VERTEX_CONSOLE.format(
        location=fields["locations"], job=fields["pipelineJobs"], project=fields["projects"]
    )


def google_credentials():
    """Application-default credentials, or one line saying how to get them.

    Raises:
      ValueError: no credentials are configured on this machine.
    """
    import google.auth
    from google.auth import exceptions

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except exceptions.DefaultCredentialsError:
        raise ValueError(
            "no Google Cloud credentials: run 'gcloud auth application-default login' or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key"
        ) from None
    return credentials


def vertex_pipeline_job(
    template, params: dict, enable_cache: bool, credentials=None, job_id: str | None = None
):
    """The Vertex ``PipelineJob`` of a compiled template, built and validated by the SDK (no network): each
    task's caching written in its spec (the exit task never cached), the SDK's own caching override unset."""
    from google.cloud import aiplatform

    target = template.target
    with caching_written(template, enable_cache) as path:
        return aiplatform.PipelineJob(
            display_name=template.name,
            template_path=path,
            job_id=job_id,
            pipeline_root=template.pipeline_root,
            parameter_values=params,
            project=target.project,
            location=target.region,
            enable_caching=None,
            labels=template.labels or None,
            credentials=credentials,
        )


def check_experiment_name(name: str) -> None:
    """Raises ValueError (one line) for a name Vertex AI Experiments refuses (``EXPERIMENT_NAME``)."""
    if not EXPERIMENT_NAME.match(name):
        raise ValueError(
            f"--experiment {name!r}: a Vertex AI experiment's name is 4 to 128 lowercase letters, digits "
            "and '-'"
        )


def _endpoint(region: str) -> dict:
    return {"api_endpoint": f"{region}-aiplatform.googleapis.com"}


def check_tensorboard(target, credentials) -> None:
    """The Vertex AI TensorBoard the template's training jobs stream to (``target.tensorboard``) exists where
    they run: read on its region's endpoint, transient faults retried (``cloud_retry``).

    Raises:
      ValueError: one line: no such instance in the region; permission denied (naming the service account the
        jobs run as and the role it needs); any other refusal.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    name = target.tensorboard
    client = aiplatform_v1.TensorboardServiceClient(
        client_options=_endpoint(target.region), credentials=credentials
    )
    try:
        cloud_retry.retried(
            lambda: client.get_tensorboard(name=name, timeout=cloud_retry.CALL_TIMEOUT_SECONDS),
            f"reading {name}",
        )
    except exceptions.NotFound as error:
        raise ValueError(
            f"--tensorboard {name}: Vertex AI has no such TensorBoard in {target.region} "
            f"({_message(error)}); the training jobs stream only to one of their region: create it there "
            f"or name another"
        ) from None
    except exceptions.PermissionDenied as error:
        raise ValueError(
            f"--tensorboard {name}: permission denied ({_message(error)}); the training jobs stream to it "
            f"as {target.service_account}, which needs {TENSORBOARD_ROLE} in project {target.project} "
            "(as does the account submitting, to look it up)"
        ) from None
    except exceptions.GoogleAPICallError as error:
        raise ValueError(f"--tensorboard {name}: Vertex AI refused to read it: {_message(error)}") from None


def _message(error) -> str:
    return " ".join(str(error).split())  # the status code and the service's message


def find_experiment(name: str, target, credentials):
    """The Vertex AI experiment ``name`` of the target's project and region, created if missing, with the
    calls and checks of the SDK's ``Experiment.get_or_create`` (the ``default`` metadata store and the
    experiment's context got or created; the context must be an experiment's). A create that loses a race
    with another submission creating the same experiment (``ALREADY_EXISTS``) gets it instead; transient
    faults are retried.

    Raises:
      ValueError: one line: the name is another kind of context, or Vertex AI refused a call.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform

    def get_or_create():
        where = {"project": target.project, "location": target.region, "credentials": credentials}
        try:
            return aiplatform.Experiment.get_or_create(name, **where)
        except exceptions.AlreadyExists:  # made by another submission between the SDK's get and its create
            return aiplatform.Experiment.get_or_create(name, **where)

    try:
        return cloud_retry.retried(get_or_create, f"getting or creating experiment {name}")
    except ValueError as error:  # the SDK's: a context of another schema, or a TensorBoard's experiment
        said = " ".join(str(error).split()).rstrip(".")
        raise ValueError(f"--experiment {name}: {said}; choose another name") from None
    except exceptions.GoogleAPICallError as error:
        raise ValueError(
            f"--experiment {name}: Vertex AI Experiments refused it: {_message(error)}"
        ) from None


def add_to_experiment(job, experiment, credentials) -> None:
    """Puts the created PipelineJob ``job`` into ``experiment``, as ``PipelineJob.submit(experiment=...)``
    does: the job is read until Vertex has made its run's metadata context
    (``job_detail.pipeline_run_context``), which then becomes a child of the experiment's context
    (``AddContextChildren``, which skips a child already added).

    Raises:
      RuntimeError: one line: no run context within ``RUN_CONTEXT_WAIT_SECONDS`` or before the job ended; a
        call refused or unanswered.
    """
    from google.cloud import aiplatform_v1

    deadline = time.monotonic() + RUN_CONTEXT_WAIT_SECONDS
    while True:
        read = job.api_client.get_pipeline_job(
            name=job.resource_name, **cloud_retry.call_policy(f"reading {job.resource_name}")
        )
        context = read.job_detail.pipeline_run_context.name
        if context:
            break
        if read.state.name in VERTEX_FINAL or time.monotonic() > deadline:
            raise RuntimeError(f"Vertex made no metadata context for the run ({read.state.name})")
        time.sleep(RUN_CONTEXT_POLL_SECONDS)
    client = aiplatform_v1.MetadataServiceClient(
        client_options=_endpoint(job.location), credentials=credentials
    )
    client.add_context_children(
        context=experiment.resource_name,
        child_contexts=[context],
        **cloud_retry.call_policy(f"adding {context} to {experiment.resource_name}"),
    )


def submit_vertex(
    template,
    params: dict,
    enable_cache: bool,
    credentials=None,
    experiment: str = "",
    warn=lambda message: print(f"warning: {message}", file=sys.stderr),
) -> Submitted:
    """Creates the PipelineJob in the template's project and region, as its service account and network; with
    ``experiment``, in that Vertex AI experiment.

    The job's id is this submission's own: a create whose answer was lost (a timeout, a dropped connection) is
    sent again, and if the first had made the job Vertex refuses the second as ``ALREADY_EXISTS``: the job is
    then read, not made twice.

    Before the create: the template's TensorBoard is looked up (``check_tensorboard``), the experiment got or
    created (``find_experiment``). After it: the run is put into the experiment (``add_to_experiment``); a
    failure there is ``warn``ed in one line, and the run, already created, goes on.

    Raises:
      ValueError: one line: no credentials; the TensorBoard or the experiment refused; the run refused.
    """
    from google.api_core import exceptions
    from google.cloud import aiplatform

    credentials = credentials or google_credentials()
    target = template.target
    if target.tensorboard:
        check_tensorboard(target, credentials)
    found = find_experiment(experiment, target, credentials) if experiment else None
    job_id = submission_id(template.name)
    job = vertex_pipeline_job(template, params, enable_cache, credentials, job_id)
    name = f"projects/{target.project}/locations/{target.region}/pipelineJobs/{job_id}"

    def send():
        job.submit(service_account=target.service_account or None, network=target.network or None)
        return job

    def find():  # the job of a create whose answer was lost (refused ALREADY_EXISTS when sent again)
        return aiplatform.PipelineJob.get(
            name, project=target.project, location=target.region, credentials=credentials
        )

    try:
        job = follower.create(send, find, f"creating {name}", by_id=True)
    except exceptions.GoogleAPICallError as error:
        raise ValueError(
            f"Vertex AI Pipelines refused the run of {template.path}: {_message(error)}"
        ) from None

    notes = ()
    if found is not None:
        try:
            add_to_experiment(job, found, credentials)
            notes = (f"in experiment {experiment}: {found.dashboard_url}",)
        except Exception as error:  # the job exists: it is not created again, and goes on
            cause = error.cause if isinstance(error, exceptions.RetryError) and error.cause else error
            warn(
                f"{job.resource_name} was created but not put into experiment {experiment} "
                f"({cloud_retry.one_line(cause)}); the run goes on outside it"
            )

    def poll() -> str:  # one read, no retry of the SDK's own: ``Submitted.follow`` waits out the faults
        read = job.api_client.get_pipeline_job(
            name=job.resource_name, retry=None, timeout=cloud_retry.CALL_TIMEOUT_SECONDS
        )
        return read.state.name

    return Submitted(
        f"Vertex PipelineJob {job.resource_name}", vertex_console_url(job.resource_name), poll, notes=notes
    )
