"""A Kubeflow Pipelines API server on 127.0.0.1 that applies the real server's rules to a submitted run.

``kfp.Client`` (the installed SDK, unchanged) talks to it over HTTP, as it would to a cluster. It serves the
calls a run submission makes (healthz, experiments, runs) and, on ``POST /apis/v2beta1/runs``, checks the
run the way the Kubeflow Pipelines backend does before it creates any workflow (kubeflow/pipelines,
``backend/src/apiserver/template/v2_template.go``, ``backend/src/v2/compiler`` and ``driver/resolve.go``):

1. the spec parses as a ``PipelineSpec`` with no unknown field (Go's ``protojson.Unmarshal``);
2. ``schemaVersion`` is 2.1.0: "KFP only supports schema version 2.1.0, but the pipeline spec has version X";
3. the pipeline has a name and a root component;
4. every root input parameter is either given a value of its declared ``parameterType`` or is optional or has
   a ``defaultValue``; an untyped one is "unspecified type"; a value for an undeclared name is refused;
5. every executor is a container or an importer: the backend's compiler stops at any other kind (TFX's
   latest-blessed-model ``resolver``) with "non-container and non-importer executor not implemented";
6. a task's constant parameters are ``runtimeValue.constant`` (the driver implements no other form).

A refused run gets the server's 400 with the message; an accepted one moves through the states the test
scripts (``states``) as ``GET /apis/v2beta1/runs/ID`` is polled. ``GET /apis/v2beta1/runs`` lists an experiment's
runs, filtered on ``display_name`` (the one predicate the fake implements; others are refused).

**The backend's version** (``version``, default 2.5.0) is what healthz reports as ``tag_name`` (the API server's
``TAG_NAME``, ``backend/src/apiserver/main.go``), and the fake models what differs between the versions this
pipeline meets (read in kubeflow/pipelines ``backend/src/`` at the tags 2.3.0, 2.4.0, 2.5.0 and 2.14.0):

- ``fills_run_id_placeholder``: the driver replaces an input parameter's constant ``{{$.pipeline_job_uuid}}``
  with the run's id from 2.5.0 on (``v2/driver/driver.go``, kubeflow/pipelines#11599); before, the task gets the
  literal text. ``kfp_launcher`` asks it (``backend_version``).
- ``run_outcome``: before 2.4.0 the exit task was compiled as one more task of the root DAG, depending on the
  DAG it follows whatever its state (``v2/compiler/argocompiler/dag.go``, ``depends_exit_handler``), and Argo
  decides a DAG's outcome by its leaf tasks: the run's state is the exit task's (a failed run whose clean-up
  succeeded is SUCCEEDED, kubeflow/pipelines#10917). From 2.4.0 the exit task is an Argo exit lifecycle hook
  (#11470) that leaves the run's state to its steps.
- ``applies_retry_policy``: a task's ``retryPolicy`` becomes an Argo ``retryStrategy`` from 2.5.0 for tasks of
  the root DAG only (``argocompiler/container.go``, ``getTaskRetryPolicySpec`` reads ``Root.Dag.Tasks``), from
  2.14.0 for tasks in any DAG (#11908).

**Faults** (``faults``: a ``faults.FaultSchedule``): every request first meets the next fault scheduled for its
call, named ``METHOD /path`` with ids as ``{id}`` (``GET /apis/v2beta1/runs/{id}``...): a status (the gateway's
or server's error answer), a dropped connection, a slow answer.

Two modes, as the real server has:

- **single-user** (``FakeKfpServer()``): standalone Kubeflow Pipelines reached directly (``kubectl
  port-forward``): no identity, and namespaces are ignored (the server's ``ReplaceNamespace``).
- **multi-user** (``FakeKfpServer(users={TOKEN: User(IDENTITY, NAMESPACES)})``): the standard Kubeflow install,
  the API server in ``MULTIUSER`` mode behind Kubeflow's Istio gateway. The gateway, as kubeflow/manifests
  configures it (``common/oauth2-proxy``: ``oauth2_proxy.cfg``, ``istio-external-auth``, ``istio-m2m``):

  * a request without an ``Authorization`` header goes to oauth2-proxy, which answers API paths (its
    ``api_routes``, ``/apis/``) without a session with ``401 Unauthorized`` rather than a redirect to the login
    page. The body's text is not confirmed from source; the fake sends ``Unauthorized``.
  * a bearer token is verified by Istio's ``RequestAuthentication`` (Dex's issuer, or the cluster's for
    Kubernetes service-account tokens); a token it cannot verify is refused 401. The fake knows the tokens in
    ``users``; any other stands for an unverifiable one. The body, Envoy's ``Jwt verification fails``, is taken
    from reports of the gateway's answer, not from source.
  * a verified token's claim (``email`` for Dex, ``sub`` for a service account:
    ``system:serviceaccount:NS:NAME``) is written to the ``kubeflow-userid`` header, replacing any the client
    sent: the fake's ``User.identity``.

  The API server (kubeflow/pipelines 2.3.0 to 2.5.0, ``backend/src/apiserver``: ``server/experiment_server.go``,
  ``server/run_server.go``, ``resource/resource_manager.go``; deployed with ``KUBEFLOW_USERID_HEADER=
  kubeflow-userid`` and an empty prefix):

  * healthz answers without authorization, ``"multi_user": true``;
  * listing or creating experiments without a namespace: "An experiment cannot have an empty namespace in
    multi-user mode" (400), checked before the identity;
  * a run without an experiment: "Experiment id can not be empty in multi-user mode" (400); a run lives in its
    experiment's namespace;
  * every call is authorized by a ``SubjectAccessReview`` of the identity for the verb on the resource
    (``pipelines.kubeflow.org/v1beta1`` experiments or runs) in the namespace. The fake's ``User.namespaces``
    stands for the cluster's RBAC (a profile's owner and contributors, its ``default-editor`` account): any
    other namespace is "User 'X' is not authorized with reason: ..." (403). The review's ``reason`` is left
    empty (what RBAC's authorizer gives when no rule allows is not confirmed from source).

  Messages are the server's status messages as grpc-gateway sends them (``{"error", "code", "message"}``): the
  chain of the server's wrapped errors, outermost first, from the source above.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import threading
import urllib.parse
import uuid

import faults as fault_schedules
from google.protobuf import json_format, struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2

SCHEMA_VERSION = "2.1.0"
NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# parameterType -> the protobuf Value kind a given value must have.
VALUE_KINDS = {
    "NUMBER_DOUBLE": "number_value",
    "NUMBER_INTEGER": "number_value",
    "STRING": "string_value",
    "BOOLEAN": "bool_value",
    "LIST": "list_value",
    "STRUCT": "struct_value",
}
# gRPC codes the server answers with, and the HTTP status grpc-gateway maps each to.
INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED = 3, 5, 7, 16
HTTP_STATUS = {INVALID_ARGUMENT: 400, NOT_FOUND: 404, PERMISSION_DENIED: 403, UNAUTHENTICATED: 401}


class RunRefused(ValueError):
    """The server's refusal of a run (HTTP 400), with its message."""


class Refused(Exception):
    """A refusal by the API server (a gRPC code and its status message) or by the gateway (an HTTP status and a
    plain-text body)."""

    def __init__(self, message: str, code: int = INVALID_ARGUMENT, http_status: int | None = None):
        super().__init__(message)
        self.code = code
        self.http_status = http_status or HTTP_STATUS[code]
        self.from_gateway = http_status is not None


@dataclasses.dataclass(frozen=True)
class User:
    """Who the gateway lets in with a token (the ``kubeflow-userid`` it sets), and the namespaces RBAC lets that
    identity use."""

    identity: str
    namespaces: tuple[str, ...] = ()


def check_run(pipeline_spec: dict, parameters: dict) -> None:
    """The backend's checks of a run before any workflow is created; raises ``RunRefused``."""
    spec = pipeline_spec_pb2.PipelineSpec()
    try:
        json_format.ParseDict(pipeline_spec, spec)  # strict, as protojson.Unmarshal
    except json_format.ParseError as error:
        raise RunRefused(f"invalid v2 pipeline spec: {error}") from None
    if spec.schema_version != SCHEMA_VERSION:
        raise RunRefused(
            f"KFP only supports schema version 2.1.0, but the pipeline spec has version {spec.schema_version}"
        )
    if not spec.pipeline_info.name or not NAME_PATTERN.search(spec.pipeline_info.name):
        raise RunRefused("invalid v2 pipeline spec: name is empty or malformed")
    if not spec.HasField("root"):
        raise RunRefused("invalid v2 pipeline spec: root component is empty")
    declared = spec.root.input_definitions.parameters
    for name, parameter in declared.items():
        if name not in parameters:
            if not parameter.is_optional and not parameter.HasField("default_value"):
                raise RunRefused(
                    f"parameter {name} is not optional, yet has neither default value nor user provided value"
                )
            continue
        kind_name = pipeline_spec_pb2.ParameterType.ParameterTypeEnum.Name(parameter.parameter_type)
        if kind_name not in VALUE_KINDS:
            raise RunRefused(f"input parameter {name} has unspecified type")
        value = json_format.ParseDict(parameters[name], struct_pb2.Value())
        if value.WhichOneof("kind") != VALUE_KINDS[kind_name]:
            raise RunRefused(f"input parameter {name} requires type {kind_name}, but the value is not of it")
    extra = sorted(set(parameters) - set(declared))
    if extra:
        raise RunRefused(f"parameter(s) provided are not required by pipeline: {', '.join(extra)}")
    for label, executor in pipeline_spec["deploymentSpec"]["executors"].items():
        if "container" not in executor and "importer" not in executor:
            raise RunRefused(
                f"Failed to compile job: executor(label={label}): non-container and non-importer executor "
                "not implemented"
            )
    for task_name, task in spec.root.dag.tasks.items():
        for name, binding in task.inputs.parameters.items():
            if binding.HasField("runtime_value") and not binding.runtime_value.HasField("constant"):
                raise RunRefused(f"{task_name}.{name}: param runtime value spec not implemented")


def _invalid_input(message: str) -> str:
    return f"Invalid input error: {message}"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("-")[0].split("."))


class FakeKfpServer:
    """The server, started on a free port; ``host`` is its URL. ``runs`` holds every accepted run as sent,
    ``experiments`` every experiment by id (with its namespace), ``refused`` every refusal's message, ``calls``
    every request as ``(method, path, identity)`` (the identity the gateway let in, or None)."""

    def __init__(
        self,
        states=("RUNNING", "SUCCEEDED"),
        users: dict[str, User] | None = None,
        version: str = "2.5.0",
        faults: fault_schedules.FaultSchedule | None = None,
    ):
        self.states = list(states)
        self.users = users
        self.version = version
        self.faults = faults
        self.runs: list[dict] = []
        self.refused: list[str] = []
        self.calls: list[tuple[str, str, str | None]] = []
        self.experiments: dict[str, dict] = {}
        self._polls: dict[str, int] = {}
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def multi_user(self) -> bool:
        return self.users is not None

    # ---- what the backend's version decides ------------------------------------------------------------------

    @property
    def fills_run_id_placeholder(self) -> bool:
        return _version(self.version) >= (2, 5, 0)

    def applies_retry_policy(self, in_root_dag: bool) -> bool:
        version = _version(self.version)
        return version >= (2, 14, 0) or (in_root_dag and version >= (2, 5, 0))

    def run_outcome(self, steps_state: str, exit_task_state: str) -> str:
        """The run's final state from its steps' DAG and its exit task (see the module's docstring)."""
        return exit_task_state if _version(self.version) < (2, 4, 0) else steps_state

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- the gateway ---------------------------------------------------------------------------------------

    def gateway(self, headers) -> str | None:
        """The identity a request carries through the gateway (None in single-user mode, which has none)."""
        if not self.multi_user:
            return None
        authorization = headers.get("Authorization")
        if authorization is None:
            raise Refused("Unauthorized", UNAUTHENTICATED, http_status=401)  # oauth2-proxy, API route
        scheme, _, token = authorization.partition(" ")
        user = self.users.get(token) if scheme == "Bearer" else None
        if user is None:
            raise Refused("Jwt verification fails", UNAUTHENTICATED, http_status=401)  # RequestAuthentication
        return user.identity

    # ---- the API server's authorization ----------------------------------------------------------------------

    def authorize(
        self, identity: str | None, namespace: str, verb: str, resource: str, name: str = ""
    ) -> None:
        """The SubjectAccessReview of ``identity`` for ``verb`` on ``resource`` in ``namespace``."""
        if not self.multi_user:
            return
        user = next(user for user in self.users.values() if user.identity == identity)
        if namespace not in user.namespaces:
            attributes = (
                f"&ResourceAttributes{{Namespace:{namespace},Verb:{verb},Group:pipelines.kubeflow.org,"
                f"Version:v1beta1,Resource:{resource},Subresource:,Name:{name},}}"
            )
            raise Refused(
                f"PermissionDenied: User '{identity}' is not authorized with reason:  (request: {attributes}): "
                "Unauthorized access",
                PERMISSION_DENIED,
            )

    def access_experiment(self, identity, namespace: str, verb: str, name: str = "") -> None:
        """``canAccessExperiment``: a namespace first, then the review."""
        if not self.multi_user:
            return
        if namespace in ("", "-"):
            raise Refused(_invalid_input("An experiment cannot have an empty namespace in multi-user mode"))
        try:
            self.authorize(identity, namespace, verb, "experiments", name)
        except Refused as error:
            raise Refused(f"Failed to authorize with API: {error}", error.code) from None

    def access_run(self, identity, namespace: str, verb: str, run_id: str = "") -> None:
        """``canAccessRun``."""
        if not self.multi_user:
            return
        if namespace in ("", "-"):
            raise Refused(_invalid_input("A run cannot have an empty namespace in multi-user mode"))
        try:
            self.authorize(identity, namespace, verb, "runs")
        except Refused as error:
            raise Refused(
                f"Failed to access run {run_id}. Check if you have access to namespace {namespace}: {error}",
                error.code,
            ) from None

    # ---- the calls -------------------------------------------------------------------------------------------

    def list_experiments(self, identity, query: dict) -> dict:
        namespace = query.get("namespace", [""])[0] if self.multi_user else ""
        try:
            self.access_experiment(identity, namespace, "list")
        except Refused as error:
            raise Refused(
                f"List experiments failed: Failed to authorize with API: {error}", error.code
            ) from None
        names = None
        for predicate in json.loads(query.get("filter", ["{}"])[0] or "{}").get("predicates", []):
            if predicate.get("key") != "display_name" or predicate.get("operation") not in ("EQUALS", 1):
                raise Refused(f"the fake filters on display_name EQUALS only, not {predicate}")
            names = {predicate.get("stringValue") or predicate.get("string_value")}
        found = [
            experiment
            for experiment in self.experiments.values()
            if experiment["namespace"] == namespace and (names is None or experiment["display_name"] in names)
        ]
        return {"experiments": found, "total_size": len(found)}

    def create_experiment(self, identity, body: dict) -> dict:
        namespace = (body.get("namespace") or "") if self.multi_user else ""
        try:
            self.access_experiment(identity, namespace, "create", body.get("display_name", ""))
        except Refused as error:
            raise Refused(
                f"Failed to create a experiment: Failed to authorize the request: {error}", error.code
            ) from None
        experiment = {
            "experiment_id": str(uuid.uuid4()),
            "display_name": body["display_name"],
            "namespace": namespace,
        }
        self.experiments[experiment["experiment_id"]] = experiment
        return experiment

    def create_run(self, identity, body: dict) -> dict:
        prefix = "Failed to create a new run"
        experiment_id = body.get("experiment_id") or ""
        if self.multi_user and not experiment_id:
            raise Refused(
                f"{prefix}: Failed to create a run due to invalid experimentId and namespace combination: "
                + _invalid_input("Experiment id can not be empty in multi-user mode")
            )
        if experiment_id and experiment_id not in self.experiments:
            raise Refused(f"{prefix}: Experiment {experiment_id} not found", NOT_FOUND)
        namespace = self.experiments[experiment_id]["namespace"] if experiment_id else ""
        try:
            self.access_run(identity, namespace, "create")
        except Refused as error:
            raise Refused(
                f"{prefix}: Failed to create a run due to authorization error. Check if you have write "
                f"permissions to namespace {namespace}: {error}",
                error.code,
            ) from None
        runtime = body.get("runtime_config") or {}
        try:
            check_run(body.get("pipeline_spec") or {}, runtime.get("parameters") or {})
        except RunRefused as error:
            raise Refused(str(error)) from None
        run = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING"}
        self.runs.append(run)
        self._polls[run["run_id"]] = 0
        return run

    def list_runs(self, identity, query: dict) -> dict:
        experiment_id = query.get("experiment_id", [""])[0]
        experiment = self.experiments.get(experiment_id)
        if experiment is None:
            raise Refused(f"Failed to list runs: Experiment {experiment_id} not found", NOT_FOUND)
        try:
            self.access_run(identity, experiment["namespace"], "list")
        except Refused as error:
            raise Refused(f"Failed to list runs: {error}", error.code) from None
        names = None
        for predicate in json.loads(query.get("filter", ["{}"])[0] or "{}").get("predicates", []):
            if predicate.get("key") != "display_name" or predicate.get("operation") not in ("EQUALS", 1):
                raise Refused(f"the fake filters on display_name EQUALS only, not {predicate}")
            names = {predicate.get("stringValue") or predicate.get("string_value")}
        found = [
            run
            for run in self.runs
            if run.get("experiment_id") == experiment_id
            and (names is None or run.get("display_name") in names)
        ]
        return {"runs": found, "total_size": len(found)} if found else {}

    def get_run(self, identity, run_id: str) -> dict:
        run = next((run for run in self.runs if run["run_id"] == run_id), None)
        if run is None:
            raise Refused(f"Failed to get a run: Run {run_id} not found", NOT_FOUND)
        experiment = self.experiments.get(run.get("experiment_id") or "", {})
        try:
            self.access_run(identity, experiment.get("namespace", ""), "get", run_id)
        except Refused as error:
            raise Refused(
                f"Failed to get a run: Failed to authorize the request: {error}", error.code
            ) from None
        state = self.states[min(self._polls[run_id], len(self.states) - 1)]
        self._polls[run_id] += 1
        return {**run, "state": state}

    def _handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, code: int, body: dict | str) -> None:
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                self.send_response(code)
                self.send_header(
                    "Content-Type", "application/json" if isinstance(body, dict) else "text/plain"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _refuse(self, error: Refused) -> None:
                fake.refused.append(str(error))
                if error.from_gateway:
                    self._reply(error.http_status, str(error))
                else:
                    self._reply(
                        error.http_status, {"error": str(error), "message": str(error), "code": error.code}
                    )

            def _serve(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                path, query = url.path, urllib.parse.parse_qs(url.query)
                body = self._body() if method == "POST" else {}
                call = f"{method} {re.sub(r'/[0-9a-f-]{36}$', '/{id}', path)}"
                fault = fake.faults.take(call) if fake.faults is not None else None
                if fault_schedules.serve_http_fault(self, fault, call, self._reply):
                    return
                try:
                    identity = fake.gateway(self.headers)
                except Refused as error:
                    fake.calls.append((method, path, None))
                    self._refuse(error)
                    return
                fake.calls.append((method, path, identity))
                try:
                    reply = route(method, path, query, body, identity)
                except Refused as error:
                    self._refuse(error)
                    return
                if fault is not None and fault.kind == "lost":
                    fault_schedules.drop_connection(self)
                    return
                if reply is None:
                    self._reply(
                        404, {"error": f"no route {path}", "message": f"no route {path}", "code": NOT_FOUND}
                    )
                else:
                    self._reply(200, reply)

            def do_GET(self):  # noqa: N802 - http.server's interface
                self._serve("GET")

            def do_POST(self):  # noqa: N802 - http.server's interface
                self._serve("POST")

        def route(method, path, query, body, identity):
            if (method, path) == ("GET", "/apis/v2beta1/healthz"):
                return {"commit_sha": "fake", "tag_name": fake.version, "multi_user": fake.multi_user}
            if (method, path) == ("GET", "/apis/v2beta1/experiments"):
                return fake.list_experiments(identity, query)
            if (method, path) == ("POST", "/apis/v2beta1/experiments"):
                return fake.create_experiment(identity, body)
            if (method, path) == ("POST", "/apis/v2beta1/runs"):
                return fake.create_run(identity, body)
            if (method, path) == ("GET", "/apis/v2beta1/runs"):
                return fake.list_runs(identity, query)
            if method == "GET" and path.startswith("/apis/v2beta1/runs/"):
                return fake.get_run(identity, path.rsplit("/", 1)[1])
            return None

        return Handler
