"""Submitting a compiled pipeline to a Kubeflow Pipelines endpoint (``pipeline.submission`` has what both
backends share).

``kfp.Client`` against ``--kfp-host``, into an experiment named after the pipeline, in the namespace
``--kfp-namespace`` (a multi-user install, the standard one, needs it), with the bearer token of
``--kfp-token-file`` (or of kfp's own ``KF_PIPELINES_SA_TOKEN_PATH``), read again before every call: a
projected token rotated in place stays valid while ``--wait`` follows a run for hours. The server's version is
read from its healthz first, and a backend older than ``MIN_KFP_VERSION`` is refused before anything is
created. The run's name is this submission's own: a create whose answer was lost is looked up by it before it
is sent again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import sys

from effnet_common import cloud_retry, follower
from pipeline.submission import Submitted, caching_written, submission_id

# The oldest Kubeflow Pipelines backend the compiled .yaml runs on (from it, the exit task gets the run's
# id: kubeflow/pipelines#11599), and the first that applies a retry policy to tasks inside a DAG
# (kubeflow/pipelines#11908; before, to the root DAG's tasks only).
MIN_KFP_VERSION = (2, 5, 0)
KFP_NESTED_RETRY_VERSION = (2, 14, 0)
# kfp's own variable naming a file that holds a bearer token (``kfp.client.KF_PIPELINES_SA_TOKEN_ENV``; in a
# Kubeflow pod, a projected service-account token that the kubelet refreshes in place).
KFP_TOKEN_ENV = "KF_PIPELINES_SA_TOKEN_PATH"


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


@dataclasses.dataclass(frozen=True)
class TokenFile:
    """A bearer token kept in a file (``--kfp-token-file``, or the file kfp's ``KF_PIPELINES_SA_TOKEN_PATH``
    names), read through ``tf.io.gfile`` before every call, as kfp's own
    ``ServiceAccountTokenVolumeCredentials`` reads its file: a token refreshed in place (by the kubelet, or
    the identity provider's client) stays valid while ``--wait`` follows a run for hours.
    ``kfp.Client(credentials=...)`` calls ``refresh_api_key_hook`` before each request and sends the token as
    ``Authorization: Bearer TOKEN``.
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
    """kfp's errors as one line: the server's (or its gateway's) refusal after ``refused``, or the endpoint
    out of reach. A refused identity (401) names the token sent, or that none was."""
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
    (``cloud_retry.call_retry``): reachable, the token accepted by the gateway in front of the server, whether
    every call needs a namespace, and which backend it is."""
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
    """Refuses a backend older than ``MIN_KFP_VERSION``; ``warn``s about one that cannot be told, and about
    one that applies no retry policy to the steps inside ``tfx-dag`` (before ``KFP_NESTED_RETRY_VERSION``).

    Raises:
      ValueError: one line naming the version found and the minimum.
    """
    minimum = _version_text(MIN_KFP_VERSION)
    version = kfp_version(tag or "")
    if version is None:
        warn(
            f"Kubeflow Pipelines at {host} reports no version in its healthz (tag_name {tag!r}): this "
            f"pipeline needs {minimum} or newer, whose driver gives the clean-up exit task its run's id"
        )
        return
    if version < (*MIN_KFP_VERSION, 1):
        raise ValueError(
            f"Kubeflow Pipelines at {host} is {tag}: this pipeline needs {minimum} or newer (from {minimum} "
            f"the clean-up exit task gets its run's id, kubeflow/pipelines#11599; before 2.4.0 an exit task "
            f"also decides the run's outcome, #10917)"
        )
    if version < (*KFP_NESTED_RETRY_VERSION, 1):
        warn(
            f"Kubeflow Pipelines {tag} applies a task's retry policy to the root DAG's tasks only (every "
            f"task from {_version_text(KFP_NESTED_RETRY_VERSION)}, kubeflow/pipelines#11908): a step whose "
            f"pod is lost fails the run, and the clean-up cancels its job"
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
    """Creates a run on a Kubeflow Pipelines endpoint from the PipelineSpec (``.yaml``) template: its
    experiment (named after the pipeline) and the run in ``namespace``, every call with the bearer token of
    ``kfp_credentials(token_file)``.

    The server is asked first (healthz), so that a multi-user server without a namespace, or a backend older
    than ``MIN_KFP_VERSION``, is refused before anything is created. The run's name is this submission's own
    (``submission_id``): a create whose answer was lost is looked up by it before it is sent again.

    Raises:
      ValueError: the token file is unusable; the server is multi-user and no namespace is given, or too old;
        the server (or its gateway) refused a call.
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

        def send():
            with caching_written(template, enable_cache) as path:
                return client.run_pipeline(
                    experiment.experiment_id,
                    run_name,
                    pipeline_package_path=path,
                    params=params,
                    pipeline_root=template.pipeline_root,
                    enable_caching=None,  # the spec's per-task caching (caching_written)
                )

        def find():  # the run of a create whose answer was lost
            return _kfp_run_named(client, experiment.experiment_id, run_name)

        result = follower.create(send, find, f"creating run {run_name}")

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
