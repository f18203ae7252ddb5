"""Submitting a compiled pipeline and following its run: Vertex AI Pipelines or a Kubeflow Pipelines endpoint.

Both take a compiled ``template.Template`` as it is, with the run's parameter values (checked beforehand by
``Template.check_values``), and return where the run can be watched. ``follow`` polls the run until it ends
and returns its final state; ``succeeded`` tells the CLI's exit status.

Vertex: the ``google-cloud-aiplatform`` SDK's ``PipelineJob``, submitted as the compiled template's service
account and network, under its compiled pipeline root (where its serving directory and Dataflow's temp location
are), with the compiled labels (the SDK takes them only from its argument, not from the template). Kubeflow:
``kfp.Client`` against ``--kfp-host``, into an experiment named after the pipeline, in the namespace
``--kfp-namespace`` (a multi-user install, the standard one, needs it), with the bearer token of
``--kfp-token-file`` (or of kfp's own ``KF_PIPELINES_SA_TOKEN_PATH``) on every call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
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
# kfp's own variable naming a file that holds a bearer token (``kfp.client.KF_PIPELINES_SA_TOKEN_ENV``; in a
# Kubeflow pod, a projected service-account token that the kubelet refreshes in place).
KFP_TOKEN_ENV = "KF_PIPELINES_SA_TOKEN_PATH"


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
    """The message of a Kubeflow Pipelines API error on one line: the API server's JSON ``message``, else the
    status and the body's text (a refusal by the gateway in front of it, such as ``401 Unauthorized``)."""
    import json

    text = error.body.decode(errors="replace") if isinstance(error.body, bytes) else str(error.body or "")
    try:
        body = json.loads(text or "{}")
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    if not message:
        message = f"{error.status} {error.reason or ''}".strip()
        if text.strip() and not body and text.strip() != error.reason:
            message = f"{message}: {text.strip()}"
    return " ".join(str(message).split())


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
        labels=template.labels or None,
        credentials=credentials,
    )


def submit_vertex(template, params: dict, enable_cache: bool, credentials=None) -> Submitted:
    """Creates the PipelineJob in the template's project and region, as its service account and network."""
    from google.api_core import exceptions

    job = vertex_pipeline_job(template, params, enable_cache, credentials or google_credentials())
    target = template.target
    try:
        job.submit(service_account=target.service_account or None, network=target.network or None)
    except exceptions.GoogleAPICallError as error:
        message = " ".join(str(error).split())  # the status code and the service's message
        raise ValueError(f"Vertex AI Pipelines refused the run of {template.path}: {message}") from None

    def poll() -> str:
        return job.state.name

    return Submitted(f"Vertex PipelineJob {job.resource_name}", vertex_console_url(job.resource_name), poll)


@dataclasses.dataclass(frozen=True)
class TokenFile:
    """A bearer token kept in a file (``--kfp-token-file``, or the file kfp's ``KF_PIPELINES_SA_TOKEN_PATH``
    names), read through ``tf.io.gfile`` before every call, as kfp's own ``ServiceAccountTokenVolumeCredentials``
    reads its file: a token refreshed in place (by the kubelet, or the identity provider's client) stays valid
    while ``--wait`` follows a run for hours. ``kfp.Client(credentials=...)`` calls ``refresh_api_key_hook``
    before each request and sends the token as ``Authorization: Bearer TOKEN``.
    """

    path: str
    source: str  # what named the file: "--kfp-token-file" or the variable

    def __str__(self) -> str:
        return f"{self.source} {self.path}" if self.source.startswith("--") else f"{self.source}={self.path}"

    def token(self) -> str:
        """The token: the file's one word.

        Raises:
          ValueError: one line: the file is missing, empty, or holds more than one word.
        """
        import tensorflow as tf

        from trainer_module import files

        if not tf.io.gfile.exists(self.path):
            raise ValueError(
                f"{self}: no such file (it should hold the bearer token for the Kubeflow Pipelines API)"
            )
        words = files.read_text(self.path).split()
        if len(words) != 1:
            found = "nothing" if not words else f"{len(words)} words"
            raise ValueError(f"{self}: expected one bearer token, found {found}")
        return words[0]

    def refresh_api_key_hook(self, config) -> None:
        config.api_key["authorization"] = self.token()


def kfp_credentials(token_file: str = "") -> TokenFile | None:
    """The bearer token for a Kubeflow Pipelines endpoint: ``--kfp-token-file``, else the file of kfp's
    ``KF_PIPELINES_SA_TOKEN_PATH``, else none (a single-user endpoint reached without a gateway, as through
    ``kubectl port-forward``). Read once here, so a missing file is refused before anything is sent.

    Raises:
      ValueError: one line naming the file and what is wrong with it.
    """
    if token_file:
        credentials = TokenFile(token_file, "--kfp-token-file")
    elif os.environ.get(KFP_TOKEN_ENV):
        credentials = TokenFile(os.environ[KFP_TOKEN_ENV], KFP_TOKEN_ENV)
    else:
        return None
    credentials.token()
    return credentials


@contextlib.contextmanager
def _kfp_calls(host: str, refused: str, credentials: TokenFile | None):
    """kfp's errors as one line: the server's (or its gateway's) refusal after ``refused``, or the endpoint out
    of reach. A refused identity (401) names the token sent, or that none was."""
    import kfp_server_api
    import urllib3

    try:
        yield
    except kfp_server_api.ApiException as error:
        line = f"Kubeflow Pipelines at {host} {refused}: {_api_message(error)}"
        if error.status == 401:
            line += (
                f" (the token of {credentials})"
                if credentials
                else f" (no token sent: give --kfp-token-file PATH or set {KFP_TOKEN_ENV})"
            )
        raise ValueError(line) from None
    except urllib3.exceptions.HTTPError as error:
        raise ValueError(f"--kfp-host {host}: cannot reach Kubeflow Pipelines ({error})") from None


def kfp_healthz(host: str, credentials: TokenFile | None):
    """The endpoint's healthz (``multi_user`` among its fields), asked once with the token, as ``kfp.Client``
    would ask it (with ``credentials``) but without its retries: reachable, the token accepted by the gateway in
    front of the server, and whether every call needs a namespace."""
    import kfp_server_api

    config = kfp_server_api.Configuration(host=host.rstrip("/"))
    if credentials is not None:
        config.api_key["authorization"] = ""
        config.api_key_prefix["authorization"] = "Bearer"
        config.refresh_api_key_hook = credentials.refresh_api_key_hook
    return kfp_server_api.HealthzServiceApi(kfp_server_api.ApiClient(config)).healthz_service_get_healthz()


def submit_kfp(
    template, params: dict, host: str, enable_cache: bool, namespace: str = "", token_file: str = ""
) -> Submitted:
    """Creates a run on a Kubeflow Pipelines endpoint from the PipelineSpec (``.yaml``) template: its experiment
    (named after the pipeline) and the run in ``namespace``, every call with the bearer token of
    ``kfp_credentials(token_file)``.

    A multi-user server (the standard Kubeflow install) refuses a call without a namespace; it is asked first
    (healthz), so the missing namespace is named before anything is created.

    Raises:
      ValueError: the token file is unusable; the server is multi-user and no namespace is given; the server
        (or its gateway) refused a call.
    """
    import kfp

    if not host.startswith(("http://", "https://")):
        raise ValueError(
            f"--kfp-host {host}: give the API's URL, http(s)://HOST (behind Kubeflow's gateway: .../pipeline)"
        )
    credentials = kfp_credentials(token_file)
    with _kfp_calls(host, "refused the call", credentials):
        multi_user = kfp_healthz(host, credentials).multi_user
    if multi_user and not namespace:
        raise ValueError(
            f"--kfp-namespace: Kubeflow Pipelines at {host} is multi-user: name the namespace (your Kubeflow "
            "profile) to create the run in"
        )
    # kfp takes a namespace when given (its default, "kubeflow", means none); the experiment names it again.
    given = {"namespace": namespace} if namespace else {}
    with _kfp_calls(host, "refused the run", credentials):
        with contextlib.redirect_stdout(io.StringIO()):  # kfp prints its own "Run details" line
            client = kfp.Client(host=host, credentials=credentials, **given)
            result = client.create_run_from_pipeline_package(
                template.path,
                arguments=params,
                run_name=template.name,
                experiment_name=template.name,
                namespace=namespace or None,
                pipeline_root=template.pipeline_root,
                enable_caching=enable_cache,
            )

    def poll() -> str:
        with _kfp_calls(host, f"refused to report run {result.run_id}", credentials):
            return str(client.get_run(result.run_id).state)

    url = f"{host.rstrip('/')}/#/runs/details/{result.run_id}"
    where = f" in namespace {namespace}" if namespace else ""
    return Submitted(f"Kubeflow run {result.run_id}{where}", url, poll)
