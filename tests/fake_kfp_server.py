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
scripts (``states``) as ``GET /apis/v2beta1/runs/ID`` is polled.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import uuid

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


class RunRefused(ValueError):
    """The server's refusal of a run (HTTP 400), with its message."""


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


class FakeKfpServer:
    """The server, started on a free port; ``host`` is its URL. ``runs`` holds every accepted run as sent."""

    def __init__(self, states=("RUNNING", "SUCCEEDED")):
        self.states = list(states)
        self.runs: list[dict] = []
        self.refused: list[str] = []
        self.experiments: dict[str, dict] = {}
        self._polls: dict[str, int] = {}
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def do_GET(self):  # noqa: N802 - http.server's interface
                path = self.path.split("?")[0]
                if path == "/apis/v2beta1/healthz":
                    self._reply(200, {"multi_user": False})
                elif path == "/apis/v2beta1/experiments":
                    self._reply(200, {"experiments": list(fake.experiments.values())})
                elif path.startswith("/apis/v2beta1/runs/"):
                    self._reply(200, fake._poll(path.rsplit("/", 1)[1]))
                else:
                    self._reply(404, {"error": f"no route {path}", "code": 5})

            def do_POST(self):  # noqa: N802 - http.server's interface
                path, body = self.path.split("?")[0], self._body()
                if path == "/apis/v2beta1/experiments":
                    experiment = {"experiment_id": str(uuid.uuid4()), "display_name": body["display_name"]}
                    fake.experiments[experiment["experiment_id"]] = experiment
                    self._reply(200, experiment)
                elif path == "/apis/v2beta1/runs":
                    runtime = body.get("runtime_config") or {}
                    try:
                        check_run(body.get("pipeline_spec") or {}, runtime.get("parameters") or {})
                    except RunRefused as error:
                        fake.refused.append(str(error))
                        self._reply(400, {"error": str(error), "message": str(error), "code": 3})
                        return
                    run = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING"}
                    fake.runs.append(run)
                    fake._polls[run["run_id"]] = 0
                    self._reply(200, run)
                else:
                    self._reply(404, {"error": f"no route {path}", "code": 5})

        return Handler

    def _poll(self, run_id: str) -> dict:
        run = next(run for run in self.runs if run["run_id"] == run_id)
        state = self.states[min(self._polls[run_id], len(self.states) - 1)]
        self._polls[run_id] += 1
        return {**run, "state": state}
