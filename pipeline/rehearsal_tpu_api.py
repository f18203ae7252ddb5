"""A Cloud TPU API on 127.0.0.1 whose slices are processes of this machine: a pod run rehearsed before paying.

``components.tpu_vm`` talks to it as to ``tpu.googleapis.com``: the real ``google-cloud-tpu`` client over
REST, the same paths, JSON, long-running operations and HTTP errors (409 for an id that exists, 404, 400 for
a delete without ``force``, 429 and 503 on cue). It serves queued resources (create, get, list, delete), nodes
and operations; a queued resource passes through WAITING_FOR_RESOURCES and PROVISIONING to ACTIVE, when the
slice's hosts boot as local process groups running the node's startup script (``EFFNET_TPU_WORKER``,
``EFFNET_TPU_HOME``, ``EFFNET_TPU_DOCKER_ARGS`` and ``EFFNET_TPU_STAND_IN`` set); deleting it stops them and
worker 0's container. It also answers what a slice's VMs ask: the metadata server, and the Cloud TPU API v1
that TensorFlow's ``TPUClusterResolver`` reads. A ``Scenario`` adds a slice never provisioned (FAILED with a
stock-out once its ``validUntilDuration`` passes), a preemption once the trainer logged a given step, faults.

Run on its own (``python -m pipeline.rehearsal_tpu_api --port 0``) it prints its endpoint; the local runner's
``--rehearse-slice`` starts one for its run (``pipeline.tpu_rehearsal``).
"""

from __future__ import annotations

import dataclasses
import datetime
import http.server
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse

logger = logging.getLogger("pipeline.rehearsal_tpu_api")

# The id rule the API documents for queued resources and nodes.
ID_RULE = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
STOCKOUT = (
    "There is no more capacity in the zone {zone}; "
    "you can try in another zone where Cloud TPU Nodes are offered"
)
ERROR_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED",
                500: "INTERNAL", 503: "UNAVAILABLE"}  # fmt: skip
# What the hosts' VMs ask besides the API: the metadata server, and TensorFlow's TPU client's discovery
# document.
METADATA_PATH = "/computeMetadata/v1/"
DISCOVERY_PATH = "/discovery/tpu/v1"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TPU_WORKER_PORT = 8470


@dataclasses.dataclass
class Scenario:
    """What the rehearsed service does beside serving: see the module's docstring."""

    waiting_polls: int = 1
    never_provision: bool = False
    preempt_at_step: int = 0  # 0: never; else once, when the first slice's trainer has logged this step
    preempt_delay_seconds: float = 3.0  # ... this long after: mid-way through its next training call
    faults: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    # The logical CPUs that stand in for a slice's TPU replicas (pipeline.tpu_stand_in); None: as many as the
    # slice has. Fewer train the slice's global batch on fewer replicas: cheaper to trace on a small machine.
    stand_in_replicas: int | None = None


class ApiError(Exception):
    def __init__(self, code: int, message: str, status: str = ""):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status or ERROR_STATUS.get(code, "UNKNOWN")


def _json(message) -> dict:
    return json.loads(type(message).to_json(message, use_integers_for_enums=True, indent=None))


@dataclasses.dataclass
class _Slice:
    resource: object  # tpu_v2.QueuedResource
    node: object  # tpu_v2.Node
    created: float
    reads: int = 0
    hosts: list = dataclasses.field(default_factory=list)  # Popen of each host
    deleting_reads: int = -1  # >= 0 once deleted: reads left before it is gone


class RehearsalTpuApi:
    """The service (see the module's docstring); ``endpoint`` is what the client takes as its api_endpoint."""

    def __init__(
        self, workdir: str, scenario: Scenario | None = None, port: int = 0, shared: tuple[str, ...] = ()
    ):
        from google.cloud import tpu_v2

        self._tpu = tpu_v2
        self.workdir = workdir
        # The run's local directories, which a slice's hosts would reach through GCS: mounted into worker 0's
        # container at the same paths.
        self.shared = tuple(shared)
        self.scenario = scenario or Scenario()
        self.requests: list[dict] = []
        self.preemptions = 0
        self._slices: dict[str, _Slice] = {}
        self._operations: dict[str, dict] = {}
        self._lock = threading.RLock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._threads = [
            threading.Thread(target=self._server.serve_forever, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]
        self._stopped = threading.Event()
        for thread in self._threads:
            thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        """Stops the service and every host it started (once)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        with self._lock:
            for entry in self._slices.values():
                self._stop_hosts(entry)
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RehearsalTpuApi:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what tests and the runner read

    def slices(self) -> dict[str, str]:
        """Queued resource name -> state, of those the service still knows."""
        with self._lock:
            return {name: entry.resource.state.state.name for name, entry in self._slices.items()}

    def calls(self, method: str, fragment: str = "") -> list[dict]:
        return [r for r in self.requests if r["method"] == method and fragment in r["path"]]

    # -- the service

    def _fault(self, call: str) -> str | None:
        faults = self.scenario.faults.get(call)
        return faults.pop(0) if faults else None

    def _create(self, parent: str, query: dict, body: dict) -> dict:
        tpu_v2 = self._tpu
        resource_id = query.get("queuedResourceId", [""])[0]
        if not ID_RULE.match(resource_id):
            raise ApiError(400, f"queued resource id {resource_id!r} is not valid")
        name = f"{parent}/queuedResources/{resource_id}"
        if name in self._slices:
            raise ApiError(409, f"Resource '{name}' already exists")
        resource = tpu_v2.QueuedResource.from_json(json.dumps(body), ignore_unknown_fields=True)
        (spec,) = resource.tpu.node_spec
        node = tpu_v2.Node(spec.node)
        for key, value in node.labels.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
                raise ApiError(400, f"invalid label {key}={value!r}")
        from components import tpu_slices

        if f"tpu-{node.accelerator_type}" not in tpu_slices.SLICES:
            raise ApiError(400, f"accelerator type {node.accelerator_type!r} is not offered in {parent}")
        resource.name = name
        resource.state = tpu_v2.QueuedResourceState(
            state=tpu_v2.QueuedResourceState.State.WAITING_FOR_RESOURCES
        )
        resource.create_time = datetime.datetime.now(datetime.timezone.utc)
        node.name = f"{spec.parent}/nodes/{spec.node_id}"
        node.state = tpu_v2.Node.State.CREATING
        node.queued_resource = name
        self._slices[name] = _Slice(resource, node, time.monotonic())
        return self._operation(
            parent,
            "create",
            name,
            {"@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource", **_json(resource)},
        )

    def _operation(self, parent: str, verb: str, target: str, response: dict) -> dict:
        name = f"{parent}/operations/operation-{len(self._operations) + 1}"
        operation = {
            "name": name,
            "metadata": {
                "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                "target": target, "verb": verb, "apiVersion": "v2",
            },
            "done": True,
            "response": response,
        }  # fmt: skip
        self._operations[name] = operation
        return operation

    def _advance(self, entry: _Slice) -> None:
        """A read moves a queued resource along its states (see the module's docstring)."""
        tpu_v2 = self._tpu
        states = tpu_v2.QueuedResourceState.State
        entry.reads += 1
        state = entry.resource.state.state
        if state == states.WAITING_FOR_RESOURCES:
            valid = entry.resource.queueing_policy.valid_until_duration
            if self.scenario.never_provision:
                if valid and time.monotonic() - entry.created > valid.total_seconds():
                    zone = entry.resource.name.split("/")[3]
                    entry.resource.state = tpu_v2.QueuedResourceState(
                        state=states.FAILED,
                        failed_data=tpu_v2.QueuedResourceState.FailedData(
                            error={"code": 8, "message": STOCKOUT.format(zone=zone)}
                        ),
                    )
            elif entry.reads > self.scenario.waiting_polls:
                entry.resource.state = tpu_v2.QueuedResourceState(state=states.PROVISIONING)
        elif state == states.PROVISIONING:
            entry.resource.state = tpu_v2.QueuedResourceState(state=states.ACTIVE)
            entry.node.state = tpu_v2.Node.State.READY
            self._boot(entry)
        elif state == states.SUSPENDING:
            entry.resource.state = tpu_v2.QueuedResourceState(
                state=states.SUSPENDED, state_initiator=tpu_v2.QueuedResourceState.StateInitiator.SERVICE
            )

    def docker_args(self) -> list[str]:
        """What worker 0's ``docker run`` needs here: the run's directories, and this service as the VM's
        metadata server and as the Cloud TPU API that TensorFlow's resolver asks (its discovery document)."""
        address = self.endpoint.removeprefix("http://")
        args = [arg for path in self.shared for arg in ("-v", f"{path}:{path}")]
        for name, value in (
            ("GCE_METADATA_HOST", address),  # TensorFlow's TPU client
            ("GCE_METADATA_IP", address),  # oauth2client's GCE check and google-auth's
            ("GCE_METADATA_ROOT", address),  # oauth2client's metadata calls
            ("NO_GCE_CHECK", "False"),
            ("TPU_API_DISCOVERY_URL", f"{self.endpoint}{DISCOVERY_PATH}"),
            ("HOME", "/tmp"),
        ):
            args += ["-e", f"{name}={value}"]
        if os.getuid() != 0:  # the run's files stay the user's
            args += ["--user", f"{os.getuid()}:{os.getgid()}"]
        return args

    def _boot(self, entry: _Slice) -> None:
        from components import tpu_slices, tpu_worker

        slice_type = tpu_slices.SLICES[f"tpu-{entry.node.accelerator_type}"]
        hosts = slice_type.hosts
        node_id = entry.node.name.rsplit("/", 1)[1]
        script = entry.node.metadata.get("startup-script", "")
        for worker in range(hosts):
            home = os.path.join(self.workdir, node_id, f"worker-{worker}")
            os.makedirs(home, exist_ok=True)
            env = {
                **os.environ,
                "EFFNET_TPU_WORKER": str(worker),
                "EFFNET_TPU_HOME": home,
                "EFFNET_TPU_DOCKER_ARGS": " ".join(self.docker_args()),
                tpu_worker.STAND_IN_VARIABLE: str(self.scenario.stand_in_replicas or slice_type.replicas),
            }
            with open(os.path.join(home, "startup-script.log"), "ab") as log:
                entry.hosts.append(
                    subprocess.Popen(
                        ["bash", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip
        logger.info("rehearsed slice %s: %d hosts booted", entry.node.name, hosts)

    def _stop_hosts(self, entry: _Slice) -> None:
        """Stops the slice's hosts, worker 0's container with them; their disks (directories) go too."""
        from components import tpu_worker

        for host in entry.hosts:
            if host.poll() is None:
                try:
                    os.killpg(host.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            host.wait()
        if entry.hosts and shutil.which("docker"):
            name = tpu_worker.container_name(entry.node.name.rsplit("/", 1)[1])
            subprocess.run(["docker", "rm", "--force", name], capture_output=True, check=False)
        entry.hosts.clear()
        shutil.rmtree(os.path.join(self.workdir, entry.node.name.rsplit("/", 1)[1]), ignore_errors=True)

    def _delete(self, name: str, force: bool) -> dict:
        entry = self._slices.get(name)
        if entry is None or entry.deleting_reads >= 0:
            raise ApiError(404, f"Resource '{name}' was not found")
        states = self._tpu.QueuedResourceState.State
        if entry.resource.state.state == states.ACTIVE and not force:
            raise ApiError(400, f"{name} has nodes: delete it with force=true", "FAILED_PRECONDITION")
        self._stop_hosts(entry)
        entry.resource.state = self._tpu.QueuedResourceState(state=states.DELETING)
        entry.node.state = self._tpu.Node.State.DELETING
        entry.deleting_reads = 1
        parent = name.rsplit("/queuedResources/", 1)[0]
        return self._operation(parent, "delete", name, {"@type": "type.googleapis.com/google.protobuf.Empty"})

    def _read(self, name: str) -> dict:
        entry = self._slices.get(name)
        if entry is None:
            raise ApiError(404, f"Resource '{name}' was not found")
        if entry.deleting_reads >= 0:
            if entry.deleting_reads == 0:
                del self._slices[name]
                raise ApiError(404, f"Resource '{name}' was not found")
            entry.deleting_reads -= 1
        else:
            self._advance(entry)
        return _json(entry.resource)

    def _node(self, name: str) -> dict:
        for entry in self._slices.values():
            if entry.node.name == name and entry.deleting_reads < 0:
                return _json(entry.node)
        raise ApiError(404, f"Resource '{name}' was not found")

    def _serve_vm(self, path: str, query: dict) -> tuple[int, dict | bytes, bool]:
        """(status, answer, whether it is the metadata server's) of a GET the hosts make: their VM's metadata
        server, and TensorFlow's Cloud TPU API v1 (its discovery document and ``nodes.get``)."""
        live = [entry for entry in self._slices.values() if entry.deleting_reads < 0]
        if path == DISCOVERY_PATH:
            return 200, _tpu_v1_discovery(self.endpoint), False
        found = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+/nodes/[^/]+)", path)
        if found:
            for entry in live:
                if entry.node.name == found.group(1):
                    return 200, _v1_node(entry), False
            return 404, {"error": {"code": 404, "message": f"{found.group(1)} not found"}}, False
        if path == "/":  # the GCE check of oauth2client and google-auth
            return 200, b"computeMetadata/\n", True
        if not path.startswith(METADATA_PATH) or not live:
            return 404, b"not found\n", True
        entry = max(live, key=lambda e: e.created)  # the VM asking is a host of the newest slice
        project, zone = entry.node.name.split("/")[1], entry.node.name.split("/")[3]
        email = f"rehearsal@{project}.iam.gserviceaccount.com"
        answers = {
            "project/project-id": project.encode(),
            "project/numeric-project-id": b"0",
            "instance/zone": f"projects/0/zones/{zone}".encode(),
            "instance/service-accounts/ACCOUNT/": {
                "aliases": ["default"],
                "email": email,
                "scopes": [CLOUD_PLATFORM_SCOPE],
            },
            "instance/service-accounts/ACCOUNT/token": {
                "access_token": "rehearsal-token",
                "expires_in": 3600,
                "token_type": "Bearer",
            },
        }
        asked = re.sub(
            r"^instance/service-accounts/[^/]+/",
            "instance/service-accounts/ACCOUNT/",
            path.removeprefix(METADATA_PATH),
        )
        answer = answers.get(asked)
        return (404, b"not found\n", True) if answer is None else (200, answer, True)

    def _serve(self, method: str, path: str, query: dict, body: dict) -> tuple[str, dict]:
        """(the call's name, its answer) of one request."""
        found = re.fullmatch(
            r"/v2/(projects/[^/]+/locations/[^/]+)/(queuedResources|nodes|operations)(?:/([^/]+))?", path
        )
        if not found:
            raise ApiError(404, f"no such method {method} {path}")
        parent, collection, item = found.groups()
        name = f"{parent}/{collection}/{item}"
        if collection == "queuedResources":
            if method == "POST" and item is None:
                return "create_queued_resource", self._create(parent, query, body)
            if method == "GET" and item is None:
                entries = [_json(e.resource) for n, e in self._slices.items() if n.startswith(parent + "/")]
                return "list_queued_resources", {"queuedResources": entries}
            if method == "GET":
                return "get_queued_resource", self._read(name)
            if method == "DELETE":
                return "delete_queued_resource", self._delete(name, query.get("force", [""])[0] == "true")
        if collection == "nodes" and method == "GET":
            if item is None:
                nodes = [_json(e.node) for e in self._slices.values() if e.node.name.startswith(parent + "/")]
                return "list_nodes", {"nodes": nodes}
            return "get_node", self._node(name)
        if (
            collection == "operations"
            and method == "GET"
            and item in (o.rsplit("/", 1)[1] for o in self._operations)
        ):
            return "get_operation", self._operations[name]
        raise ApiError(404, f"no such method {method} {path}")

    def _handler(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _answer(self, code: int, data: bytes, content_type: str, headers: dict | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                query = urllib.parse.parse_qs(url.query)
                if method == "GET" and not url.path.startswith("/v2/"):  # what the hosts' VMs ask
                    api.requests.append({"method": method, "path": url.path, "query": query, "body": {}})
                    with api._lock:
                        code, answer, metadata = api._serve_vm(url.path, query)
                    data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                    kind = "application/text" if isinstance(answer, bytes) else "application/json"
                    self._answer(code, data, kind, {"Metadata-Flavor": "Google"} if metadata else None)
                    return
                api.requests.append({"method": method, "path": url.path, "query": query, "body": body})
                fault = api._fault(_call_name(method, url.path))
                try:
                    if fault and fault != "lost":  # refused before anything is done
                        raise ApiError(
                            int(fault), f"the service is rehearsing a {fault} on {method} {url.path}"
                        )
                    with api._lock:
                        _, answer = api._serve(method, url.path, query, body)
                    code = 200
                except ApiError as error:
                    fault = None
                    code = error.code
                    answer = {"error": {"code": error.code, "message": error.message, "status": error.status}}
                if fault == "lost":  # done, and the answer never arrives
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's interface
                self._handle("GET")

            def do_POST(self):  # noqa: N802 - http.server's interface
                self._handle("POST")

            def do_DELETE(self):  # noqa: N802 - http.server's interface
                self._handle("DELETE")

        return Handler

    # -- preemption

    def _watch(self) -> None:
        """Preempts the first slice ``preempt_delay_seconds`` after its trainer has logged ``preempt_at_step``
        (see ``Scenario``): the trainer is then in its next training call, its checkpoint of the step logged
        written."""
        due: dict[str, float] = {}
        while not self._stopped.wait(0.2):
            if not self.scenario.preempt_at_step or self.preemptions:
                continue
            with self._lock:
                for name, entry in self._slices.items():
                    if not entry.hosts:
                        continue
                    if name not in due and _trainer_step(entry) >= self.scenario.preempt_at_step:
                        due[name] = time.monotonic() + self.scenario.preempt_delay_seconds
                    if name in due and time.monotonic() >= due[name]:
                        self._preempt(entry)
                        break

    def _preempt(self, entry: _Slice) -> None:
        tpu_v2 = self._tpu
        self._stop_hosts(entry)
        entry.resource.state = tpu_v2.QueuedResourceState(
            state=tpu_v2.QueuedResourceState.State.SUSPENDING,
            state_initiator=tpu_v2.QueuedResourceState.StateInitiator.SERVICE,
        )
        entry.node.state = tpu_v2.Node.State.PREEMPTED
        self.preemptions += 1
        logger.warning("rehearsed slice %s preempted", entry.node.name)


def _tpu_v1_discovery(endpoint: str) -> dict:
    """The part of the Cloud TPU API v1 discovery document that TensorFlow's TPU client uses
    (``nodes.get``)."""
    get = {
        "id": "tpu.projects.locations.nodes.get",
        "path": "v1/{+name}",
        "flatPath": "v1/projects/{projectsId}/locations/{locationsId}/nodes/{nodesId}",
        "httpMethod": "GET",
        "parameters": {
            "name": {
                "type": "string",
                "required": True,
                "location": "path",
                "pattern": "^projects/[^/]+/locations/[^/]+/nodes/[^/]+$",
            }
        },
        "parameterOrder": ["name"],
        "response": {"$ref": "Node"},
    }
    nodes = {"methods": {"get": get}}
    return {
        "kind": "discovery#restDescription",
        "discoveryVersion": "v1",
        "id": "tpu:v1",
        "name": "tpu",
        "version": "v1",
        "protocol": "rest",
        "rootUrl": f"{endpoint}/",
        "servicePath": "",
        "batchPath": "batch",
        "parameters": {},
        "schemas": {"Node": {"id": "Node", "type": "object"}},
        "resources": {"projects": {"resources": {"locations": {"resources": {"nodes": nodes}}}}},
    }


def _v1_node(entry: _Slice) -> dict:
    """A slice's node as the Cloud TPU API v1 shows it: one network endpoint per host (TensorFlow's TPU worker
    port), on loopback ports of their own here."""
    from components import tpu_slices

    hosts = tpu_slices.SLICES[f"tpu-{entry.node.accelerator_type}"].hosts
    return {
        "name": entry.node.name,
        "acceleratorType": entry.node.accelerator_type,
        "state": entry.node.state.name,
        "health": "HEALTHY",
        "tensorflowVersion": entry.node.runtime_version,
        "networkEndpoints": [{"ipAddress": "127.0.0.1", "port": TPU_WORKER_PORT + n} for n in range(hosts)],
    }


def _call_name(method: str, path: str) -> str:
    """The name of the client method a request comes from (what a fault schedule names)."""
    collection = next((c for c in ("queuedResources", "nodes", "operations") if f"/{c}" in path), "")
    item = not path.rstrip("/").endswith(collection)
    verb = {"POST": "create", "DELETE": "delete"}.get(method, "get" if item else "list")
    noun = {"queuedResources": "queued_resource", "nodes": "node", "operations": "operation"}.get(
        collection, ""
    )
    return f"{verb}_{noun}{'s' if verb == 'list' else ''}"


def _trainer_step(entry: _Slice) -> int:
    """The last step the slice's trainer logged (its run log beside the attempt's status directory), or 0."""
    from components import slice_files
    from trainer_module import files
    from trainer_module.recorder import RUN_LOG_FILE, read_run_log

    attempt_dir = entry.node.metadata.get(slice_files.ATTEMPT_DIR_KEY, "")
    if not attempt_dir:
        return 0
    path = files.join(slice_files.status_dir_of(attempt_dir), RUN_LOG_FILE)
    try:
        events = read_run_log(path) if files.exists(path) else []
    except ValueError:  # its last line half written
        return 0
    return max((event.get("step", 0) for event in events if event.get("event") == "progress"), default=0)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pipeline.rehearsal_tpu_api", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--workdir", required=True, help="where the rehearsed hosts keep their files")
    parser.add_argument("--preempt-at-step", type=int, default=0)
    parser.add_argument("--never-provision", action="store_true")
    args = parser.parse_args(argv)
    scenario = Scenario(preempt_at_step=args.preempt_at_step, never_provision=args.never_provision)
    with RehearsalTpuApi(args.workdir, scenario, args.port) as api:
        print(api.endpoint, flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    from effnet_common import quick_exit

    quick_exit.exit_with(main())
