"""Submitting a compiled pipeline and following its run: Vertex AI Pipelines or a Kubeflow Pipelines endpoint.

Both take a compiled ``template.Template`` as it is, with the run's parameter values (checked beforehand by
``Template.check_values``), and return where the run can be watched. ``follow`` polls the run until it ends
and returns its final state; ``succeeded`` tells the CLI's exit status.

Vertex: the ``google-cloud-aiplatform`` SDK's ``PipelineJob``, submitted as the compiled template's service
account and network, under its compiled pipeline root (where its serving directory and Dataflow's temp location
are). Kubeflow: ``kfp.Client`` against ``--kfp-host``, into an experiment named after the pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import time

# Seconds between two polls of a run's state (a pipeline run takes hours).
POLL_SECONDS = 30.0
# Final states: Vertex's PipelineState names and Kubeflow's run states.
VERTEX_FINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
KFP_FINAL = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")
SUCCEEDED = ("PIPELINE_STATE_SUCCEEDED", "SUCCEEDED")
VERTEX_CONSOLE = (
    "https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{job}?project={project}"
)


@dataclasses.dataclass(frozen=True)
class Submitted:
    """A submitted run: what it is (``description``), where to watch it (``url``), and how to poll it."""

    description: str
    url: str
    poll: object  # () -> state name

    def follow(self, interval: float | None = None, on_change=None) -> str:
        """Polls the run until a final state and returns it; ``on_change(state)`` is called as it changes."""
        interval = POLL_SECONDS if interval is None else interval
        last = None
        while True:
            state = self.poll()
            if state != last and on_change is not None:
                on_change(state)
            last = state
            if state in VERTEX_FINAL + KFP_FINAL:
                return state
            time.sleep(interval)


def succeeded(state: str) -> bool:
    return state in SUCCEEDED


def vertex_console_url(resource_name: str) -> str:
    """The Cloud console page of a PipelineJob ``projects/P/locations/L/pipelineJobs/J``."""
    parts = resource_name.split("/")
    fields = dict(zip(parts[0::2], parts[1::2], strict=False))
    return VERTEX_CONSOLE.format(
        location=fields["locations"], job=fields["pipelineJobs"], project=fields["projects"]
    )


def _api_message(error) -> str:
    """The message of a Kubeflow Pipelines API error (its JSON body's ``message``), on one line."""
    import json

    try:
        body = json.loads(error.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return " ".join(str(body.get("message") or error.reason or error).split())


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


def vertex_pipeline_job(template, params: dict, enable_cache: bool, credentials=None):
    """The Vertex ``PipelineJob`` of a compiled template, built and validated by the SDK (no network)."""
    from google.cloud import aiplatform

    target = template.target
    return aiplatform.PipelineJob(
        display_name=template.name,
        template_path=template.path,
        pipeline_root=template.pipeline_root,
        parameter_values=params,
        project=target.project,
        location=target.region,
        enable_caching=enable_cache,
        credentials=credentials,
    )


def submit_vertex(template, params: dict, enable_cache: bool, credentials=None) -> Submitted:
    """Creates the PipelineJob in the template's project and region, as its service account and network."""
    job = vertex_pipeline_job(template, params, enable_cache, credentials or google_credentials())
    target = template.target
    job.submit(service_account=target.service_account or None, network=target.network or None)

    def poll() -> str:
        return job.state.name

    return Submitted(f"Vertex PipelineJob {job.resource_name}", vertex_console_url(job.resource_name), poll)


def submit_kfp(template, params: dict, host: str, enable_cache: bool) -> Submitted:
    """Creates a run on a Kubeflow Pipelines endpoint from the PipelineSpec (``.yaml``) template.

    Raises:
      ValueError: the template is a Vertex PipelineJob (``.json``), which Kubeflow does not take.
    """
    import kfp
    import kfp_server_api
    import urllib3

    if template.is_job:
        raise ValueError(f"--kfp-host takes a PipelineSpec: compile to .yaml, not {template.path}")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # kfp prints its own "Run details" line
            client = kfp.Client(host=host)
            result = client.create_run_from_pipeline_package(
                template.path,
                arguments=params,
                run_name=template.name,
                experiment_name=template.name,
                pipeline_root=template.pipeline_root,
                enable_caching=enable_cache,
            )
    except kfp_server_api.ApiException as error:
        raise ValueError(f"Kubeflow Pipelines at {host} refused the run: {_api_message(error)}") from None
    except urllib3.exceptions.HTTPError as error:
        raise ValueError(f"--kfp-host {host}: cannot reach Kubeflow Pipelines ({error})") from None

    def poll() -> str:
        return str(client.get_run(result.run_id).state)

    url = f"{host.rstrip('/')}/#/runs/details/{result.run_id}"
    return Submitted(f"Kubeflow run {result.run_id}", url, poll)
