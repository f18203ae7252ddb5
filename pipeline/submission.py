"""Submitting a compiled pipeline and following its run: Vertex AI Pipelines or a Kubeflow Pipelines endpoint.

Both take a compiled ``template.Template`` as it is, with the run's parameter values (checked beforehand by
``Template.check_values``), and return where the run can be watched. ``follow`` polls the run until it ends
and returns its final state; ``succeeded`` tells the CLI's exit status.

Vertex: the ``google-cloud-aiplatform`` SDK's ``PipelineJob``, submitted as the compiled template's service
account and network, under its compiled pipeline root (where its serving directory and Dataflow's temp location
are), with the compiled labels (the SDK takes them only from its argument, not from the template). A template
whose training jobs stream to a Vertex AI TensorBoard has the instance looked up first (``check_tensorboard``);
``--experiment NAME`` puts the run into that Vertex AI experiment (``find_experiment`` before the job is created,
``add_to_experiment`` after: the calls ``PipelineJob.submit(experiment=...)`` makes, made here so that a failure
after the create never creates the job again). Kubeflow:
``kfp.Client`` against ``--kfp-host``, into an experiment named after the pipeline, in the namespace
``--kfp-namespace`` (a multi-user install, the standard one, needs it), with the bearer token of
``--kfp-token-file`` (or of kfp's own ``KF_PIPELINES_SA_TOKEN_PATH``) on every call.

What both share:

- **Caching per task.** The run is submitted with the clients' caching unset and the spec's own per-task setting
  written (``spec_patches.set_caching``): the steps as ``--no-cache`` says, the exit task (the clean-up) never
  cached. The Vertex SDK's ``enable_caching`` would cache the exit task too, and ``kfp.Client``'s reaches the
  root's tasks only, not the steps inside ``tfx-dag``.
- **Faults waited out.** Every call retries what the services document as transient
  (``effnet_common.cloud_retry``); ``follow`` (``--wait``) waits out an outage for ``--api-outage-hours``. A create
  is sent again only once it is known not to have been made: the Vertex PipelineJob has an id of this
  submission's (a retried create is refused ``ALREADY_EXISTS`` and the job is read instead), the Kubeflow run a
  name of its own (looked up in its experiment before another create).
- **Kubeflow versions.** ``MIN_KFP_VERSION`` (2.5.0) is the first backend that gives the exit task its run's id
  (it fills ``{{$.pipeline_job_uuid}}`` in input parameters from 2.5.0 on, kubeflow/pipelines#11599; before
  2.4.0 the exit task was also a plain task that set the run's outcome, #10917): the server's version is read
  from its healthz and an older one is refused before anything is created.
- **Tokens that outlive the run.** The token file is read before every call; a 401 while following a run is
  waited out for ``cloud_retry.REFUSAL_SECONDS`` (a projected service-account token is rotated in place).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import secrets
import sys
import tempfile
import time

from effnet_common import cloud_retry

# Seconds between two polls of a run's state (a pipeline run takes hours).
POLL_SECONDS = 30.0
# Final states: Vertex's PipelineState names and Kubeflow's run states.
VERTEX_FINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")
KFP_FINAL = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")
SUCCEEDED = ("PIPELINE_STATE_SUCCEEDED", "SUCCEEDED")
VERTEX_CONSOLE = (
    "https://console.cloud.google.com/vertex-ai/locations/{location}/pipelines/runs/{job}?project={project}"
)
# A Vertex AI experiment's name: the id of its metadata context (``CreateContextRequest.context_id``).
EXPERIMENT_NAME = re.compile(r"^[a-z0-9-]{4,128}$")
# After the create: how often, and for how long at most, the job is read until Vertex has made its run's metadata
# context (it does so asynchronously as the run starts; the SDK reads it every second until the job ends).
RUN_CONTEXT_POLL_SECONDS = 2.0
RUN_CONTEXT_WAIT_SECONDS = 600.0
# The role the training jobs' service account needs to stream to a TensorBoard (docs/run-page-research.md, 2).
TENSORBOARD_ROLE = "roles/aiplatform.user"
# The oldest Kubeflow Pipelines backend the compiled .yaml runs on (see the module's docstring), and the first that
# applies a retry policy to tasks inside a DAG (kubeflow/pipelines#11908; before, to the root DAG's tasks only).
MIN_KFP_VERSION = (2, 5, 0)
KFP_NESTED_RETRY_VERSION = (2, 14, 0)
# kfp's own variable naming a file that holds a bearer token (``kfp.client.KF_PIPELINES_SA_TOKEN_ENV``; in a
# Kubeflow pod, a projected service-account token that the kubelet refreshes in place).
KFP_TOKEN_ENV = "KF_PIPELINES_SA_TOKEN_PATH"


class Unfollowed(RuntimeError):
    """``--wait`` could not read the run's state (its API out, or refusing, for longer than it waits); the run
    goes on. The message is one line."""


@dataclasses.dataclass(frozen=True)
class Submitted:
    """A submitted run: what it is (``description``), where to watch it (``url``), how to poll it (``poll``,
    raising the client's own errors), how to say a client's error in one line (``describe``), and what else
    to tell about it (``notes``: one line each, e.g. its experiment's page)."""

    description: str
    url: str
    poll: object  # () -> state name
    describe: object = cloud_retry.one_line  # (error) -> one line
    notes: tuple[str, ...] = ()

    def follow(
        self, interval: float | None = None, on_change=None, patience: cloud_retry.Patience | None = None
    ) -> str:
        """Polls the run until a final state and returns it; ``on_change(state)`` is called as it changes. A poll
        that fails is waited out as ``patience`` says (``cloud_retry.Patience.read``).

        Raises:
          Unfollowed: the state could not be read for that long, or the service refused to say it.
        """
        interval = POLL_SECONDS if interval is None else interval
        patience = patience or cloud_retry.Patience()
        last = None
        while True:
            try:
                state = patience.read(self.poll, f"reading the state of {self.description}")
            except cloud_retry.Unanswered as error:
                raise Unfollowed(f"{error}; the run goes on: {self.url}") from None
            except Exception as error:
                raise Unfollowed(f"{self.describe(error)}; the run goes on: {self.url}") from None
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


@contextlib.contextmanager
def caching_written(template, enable_cache: bool):
    """A local copy of the template with each task's caching written (``spec_patches.set_caching``), removed
    afterwards: the clients read the file when the run is built."""
    import copy

    import yaml

    from pipeline import spec_patches

    document = copy.deepcopy(template.document)
    spec_patches.set_caching(document.get("pipelineSpec", document), enable_cache)
    with tempfile.TemporaryDirectory(prefix="effnet-submission-") as directory:
        path = os.path.join(
            directory, f"{template.name or 'pipeline'}.{'json' if template.is_job else 'yaml'}"
        )
        with open(path, "w") as f:
            f.write(json.dumps(document) if template.is_job else yaml.safe_dump(document, sort_keys=True))
        yield path


def submission_id(name: str) -> str:
    """An id of this submission: the pipeline's name, when, and a random part (Vertex: ``[a-z][-a-z0-9]*``)."""
    stem = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:90] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


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
            f"--experiment {name!r}: a Vertex AI experiment's name is 4 to 128 lowercase letters, digits and '-'"
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
            f"--tensorboard {name}: Vertex AI has no such TensorBoard in {target.region} ({_message(error)}); the "
            f"training jobs stream only to one of their region: create it there or name another"
        ) from None
    except exceptions.PermissionDenied as error:
        raise ValueError(
            f"--tensorboard {name}: permission denied ({_message(error)}); the training jobs stream to it as "
            f"{target.service_account}, which needs {TENSORBOARD_ROLE} in project {target.project} (as does the "
            "account submitting, to look it up)"
        ) from None
    except exceptions.GoogleAPICallError as error:
        raise ValueError(f"--tensorboard {name}: Vertex AI refused to read it: {_message(error)}") from None


def _message(error) -> str:
    return " ".join(str(error).split())  # the status code and the service's message


def find_experiment(name: str, target, credentials):
    """The Vertex AI experiment ``name`` of the target's project and region, created if missing, with the calls
    and checks of the SDK's ``Experiment.get_or_create`` (the ``default`` metadata store and the experiment's
    context got or created; the context must be an experiment's). A create that loses a race with another
    submission creating the same experiment (``ALREADY_EXISTS``) gets it instead; transient faults are retried.

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
    """Puts the created PipelineJob ``job`` into ``experiment``, as ``PipelineJob.submit(experiment=...)`` does:
    the job is read until Vertex has made its run's metadata context (``job_detail.pipeline_run_context``), which
    then becomes a child of the experiment's context (``AddContextChildren``, which skips a child already added).

    Raises:
      RuntimeError: one line: no run context within ``RUN_CONTEXT_WAIT_SECONDS`` or before the job ended; a call
        refused or unanswered.
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
    created (``find_experiment``). After it: the run is put into the experiment (``add_to_experiment``); a failure
    there is ``warn``ed in one line, and the run, already created, goes on.

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

    def create():
        try:
            job.submit(service_account=target.service_account or None, network=target.network or None)
            return job
        except exceptions.AlreadyExists:  # an earlier attempt made it
            return aiplatform.PipelineJob.get(
                name, project=target.project, location=target.region, credentials=credentials
            )

    try:
        job = cloud_retry.retried(create, f"creating {name}")
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
    """The endpoint's healthz as a dict (``multi_user`` and ``tag_name``, the backend's version), asked with
    the token as ``kfp.Client`` would ask it (with ``credentials``), transient errors retried
    (``cloud_retry.call_retry``): reachable, the token accepted by the gateway in front of the server, whether every
    call needs a namespace, and which backend it is."""
    import kfp_server_api

    config = kfp_server_api.Configuration(host=host.rstrip("/"))
    if credentials is not None:
        config.api_key["authorization"] = ""
        config.api_key_prefix["authorization"] = "Bearer"
        config.refresh_api_key_hook = credentials.refresh_api_key_hook
    api = kfp_server_api.HealthzServiceApi(kfp_server_api.ApiClient(config))

    def ask() -> dict:  # the raw answer: the generated model keeps multi_user only, not tag_name
        answer = api.healthz_service_get_healthz(
            _preload_content=False, _request_timeout=cloud_retry.CALL_TIMEOUT_SECONDS
        )
        return json.loads(answer.data or b"{}")

    return cloud_retry.retried(ask, f"asking {host} for its healthz")


def kfp_version(tag: str) -> tuple[int, int, int, int] | None:
    """A backend's ``tag_name`` as (major, minor, patch, 1), a pre-release (``2.5.0-rc.1``) as (..., 0): older
    than its release. None for a tag that names no version (``unknown``, a build from source)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?", tag.strip())
    if match is None:
        return None
    return (int(match[1]), int(match[2]), int(match[3]), 0 if match[4] else 1)


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version[:3]))


def check_kfp_version(host: str, tag: str, warn) -> None:
    """Refuses a backend older than ``MIN_KFP_VERSION``; ``warn``s about one that cannot be told, and about one
    that applies no retry policy to the steps inside ``tfx-dag`` (before ``KFP_NESTED_RETRY_VERSION``).

    Raises:
      ValueError: one line naming the version found and the minimum.
    """
    minimum = _version_text(MIN_KFP_VERSION)
    version = kfp_version(tag or "")
    if version is None:
        warn(
            f"Kubeflow Pipelines at {host} reports no version in its healthz (tag_name {tag!r}): this pipeline "
            f"needs {minimum} or newer, whose driver gives the clean-up exit task its run's id"
        )
        return
    if version < (*MIN_KFP_VERSION, 1):
        raise ValueError(
            f"Kubeflow Pipelines at {host} is {tag}: this pipeline needs {minimum} or newer (from {minimum} the "
            f"clean-up exit task gets its run's id, kubeflow/pipelines#11599; before 2.4.0 an exit task also "
            f"decides the run's outcome, #10917)"
        )
    if version < (*KFP_NESTED_RETRY_VERSION, 1):
        warn(
            f"Kubeflow Pipelines {tag} applies a task's retry policy to the root DAG's tasks only (every task from "
            f"{_version_text(KFP_NESTED_RETRY_VERSION)}, kubeflow/pipelines#11908): a step whose pod is lost fails "
            f"the run, and the clean-up cancels its job"
        )


def _kfp_run_named(client, experiment_id: str, name: str):
    """The run of ``experiment_id`` whose display name is ``name`` (one this submission made), or None."""
    predicate = {"key": "display_name", "operation": "EQUALS", "string_value": name}
    found = client.list_runs(experiment_id=experiment_id, filter=json.dumps({"predicates": [predicate]}))
    runs = [run for run in (found.runs or []) if run.display_name == name]
    return runs[0] if runs else None


def submit_kfp(
    template,
    params: dict,
    host: str,
    enable_cache: bool,
    namespace: str = "",
    token_file: str = "",
    warn=lambda message: print(f"warning: {message}", file=sys.stderr),
) -> Submitted:
    """Creates a run on a Kubeflow Pipelines endpoint from the PipelineSpec (``.yaml``) template: its experiment
    (named after the pipeline) and the run in ``namespace``, every call with the bearer token of
    ``kfp_credentials(token_file)``.

    The server is asked first (healthz), so that a multi-user server without a namespace, or a backend older
    than ``MIN_KFP_VERSION``, is refused before anything is created. The run's name is this submission's own
    (``submission_id``): a create whose answer was lost is looked up by it before it is sent again.

    Raises:
      ValueError: the token file is unusable; the server is multi-user and no namespace is given, or too old; the
        server (or its gateway) refused a call.
    """
    import kfp

    if not host.startswith(("http://", "https://")):
        raise ValueError(
            f"--kfp-host {host}: give the API's URL, http(s)://HOST (behind Kubeflow's gateway: .../pipeline)"
        )
    credentials = kfp_credentials(token_file)
    with _kfp_calls(host, "refused the call", credentials):
        healthz = kfp_healthz(host, credentials)
    check_kfp_version(host, str(healthz.get("tag_name") or ""), warn)
    if healthz.get("multi_user") and not namespace:
        raise ValueError(
            f"--kfp-namespace: Kubeflow Pipelines at {host} is multi-user: name the namespace (your Kubeflow "
            "profile) to create the run in"
        )
    # kfp takes a namespace when given (its default, "kubeflow", means none); the experiment names it again.
    given = {"namespace": namespace} if namespace else {}
    run_name = submission_id(template.name)
    with _kfp_calls(host, "refused the run", credentials), contextlib.redirect_stdout(io.StringIO()):
        # (kfp prints its own "Run details" line)
        client = cloud_retry.retried(
            lambda: kfp.Client(host=host, credentials=credentials, **given), f"connecting to {host}"
        )
        experiment = cloud_retry.retried(  # kfp's create_experiment gets the experiment first: idempotent
            lambda: client.create_experiment(template.name, namespace=namespace or None),
            f"finding experiment {template.name}",
        )
        sent = False

        def create():
            nonlocal sent
            if sent:
                made = _kfp_run_named(client, experiment.experiment_id, run_name)
                if made is not None:
                    return made
            sent = True
            with caching_written(template, enable_cache) as path:
                return client.run_pipeline(
                    experiment.experiment_id,
                    run_name,
                    pipeline_package_path=path,
                    params=params,
                    pipeline_root=template.pipeline_root,
                    enable_caching=None,  # the spec's per-task caching (caching_written)
                )

        result = cloud_retry.retried(create, f"creating run {run_name}")

    def poll() -> str:
        return str(client.get_run(result.run_id).state)

    def describe(error: BaseException) -> str:
        import kfp_server_api

        if isinstance(error, kfp_server_api.ApiException):
            line = (
                f"Kubeflow Pipelines at {host} refused to report run {result.run_id}: {_api_message(error)}"
            )
            if error.status == 401:
                line += (
                    f" (the token of {credentials}: refresh it, e.g. kubectl create token --duration)"
                    if credentials
                    else ""
                )
            return line
        return cloud_retry.one_line(error)

    url = f"{host.rstrip('/')}/#/runs/details/{result.run_id}"
    where = f" in namespace {namespace}" if namespace else ""
    return Submitted(f"Kubeflow run {result.run_id}{where}", url, poll, describe)
