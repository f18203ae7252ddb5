"""Dataflow's jobs API (REST v1b3, ``projects.locations.jobs``) on 127.0.0.1, for Beam's DataflowRunner and for
the project's own calls (``effnet_common.dataflow_jobs``: following, cancelling, the run's clean-up).

Clients reach it as they reach Dataflow, pointed at ``host`` by Beam's ``--dataflow_endpoint`` option, with
``--no_auth``: Beam's own API client (what the DataflowRunner submits and polls with), and
google-cloud-dataflow-client's ``JobsV1Beta3Client`` over its REST transport, which the project's code builds and
calls for real (request transcoding, JSON, the status-to-exception mapping, the pager, ``retry=``/``timeout=``).
Every request is recorded (``requests``: method, path, query, body, enums by name) and a test can move a job on
(``set_state``) as the service would.

The service's rules it holds, from Dataflow's REST reference (``projects.locations.jobs``: create, get, list,
update; ``Job``, ``JobState``, ``JobView``, ``ListJobsRequest.Filter``) and its label rules:

- Jobs are regional: a job is found (get, update, list) only under the location it was created in; elsewhere
  it is 404 ``NOT_FOUND``.
- create: the job's ``labels`` follow Google Cloud's label rules (at most 64; keys start with a lowercase
  letter, keys and values lowercase letters, digits, ``_`` and ``-``, at most 63 characters) or the request is
  400 ``INVALID_ARGUMENT``. The job gets an id (``YYYY-MM-DD_hh_mm_ss-N``) and ``JOB_STATE_PENDING``; it is
  ``JOB_STATE_RUNNING`` from the next read on, and stays so (nothing runs here) until cancelled or moved on by
  the test.
- get: ``view`` ``JOB_VIEW_SUMMARY`` returns the summary only (id, project, name, type, state and times, SDK
  version, location); ``JOB_VIEW_DESCRIPTION`` and ``JOB_VIEW_ALL`` add ``labels`` and the environment. The
  reference says a request without a view gets "at least the summary, and may contain additional information":
  the fake gives the summary only, so a client that needs labels must ask for them.
- list: "ListJobs always returns summaries now" (the ``view`` parameter is deprecated): no labels.
  ``filter``: ``ACTIVE`` (jobs not in a terminal state, by creation time), ``TERMINATED``, ``ALL`` (active
  first, then terminated), ``UNKNOWN`` or none (all). Pages: at most ``pageSize`` jobs and at most the server's
  own limit, "an unspecified server-defined limit", here ``PAGE_LIMIT`` (small, so a client that ignores
  ``nextPageToken`` misses jobs); ``nextPageToken`` is absent on the last page.
- update: only ``requestedState`` is considered when ``updateMask`` is empty; both at once is 400. A client may
  request ``JOB_STATE_CANCELLED`` or ``JOB_STATE_DONE`` of a job that has not reached a terminal state
  (``JOB_STATE_DONE``, ``FAILED``, ``CANCELLED``, ``UPDATED``, ``DRAINED``), and ``JOB_STATE_DRAINING`` of a
  running job only; cancelling moves the job to ``JOB_STATE_CANCELLING`` and, at the next read, to
  ``JOB_STATE_CANCELLED`` ("jobs that are cancelling may only transition to CANCELLED or FAILED"). A
  requested state a terminal job cannot take is refused; the reference does not give the status code: the
  fake answers 400 ``FAILED_PRECONDITION`` with the message Beam's Java SDK quotes from the service ("Cannot
  perform operation 'cancel' on Job: ID. Job has terminated in state ...").
- ``jobs.messages.list`` and ``jobs.getMetrics`` (Beam's runner polls them while it waits) answer empty.
- Enums (``filter``, ``view``, ``currentState``, ``requestedState``, ``type``) are taken by name or by number
  (proto3's JSON mapping; the numbers of ``google/dataflow/v1beta3/jobs.proto``); answers carry names, or numbers
  when the request asks for them with Google's system parameter ``$alt=json;enum-encoding=int`` (as the GAPIC
  REST transport does).

``create_delay_s``: seconds the service takes to answer a create request (the request is recorded first), so a
test can act while a job is being submitted.

``faults`` (a ``faults.FaultSchedule``): each request first meets the next fault scheduled for its call, named
``METHOD jobs`` (list, create) or ``METHOD jobs/{id}`` (get, update; ``jobs/{id}/messages`` and ``/metrics``):
Dataflow's error answer with a status, a dropped connection, a slow answer, or an answer lost after the request
was served (a create that made its job).

A create whose job name is that of an active job of the location does not create a second one: the service
answers with the active job (its ``clientRequestId``), which Beam's client reads as "already exists" unless the
request id is its own (``apiclient.submit_job_description``), so a create sent again after a lost answer finds
the job it made (the reference: ``clientRequestId`` "re-used across retried attempts ... to ensure
idempotence").

Not held: templates, snapshots, the ``projects.jobs`` (non-regional) and ``aggregated`` methods.
"""

from __future__ import annotations

import datetime
import http.server
import itertools
import json
import re
import threading
import time
import urllib.parse

import faults as fault_schedules

TERMINAL = (
    "JOB_STATE_DONE",
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_UPDATED",
    "JOB_STATE_DRAINED",
)
# The server's own page limit ("unspecified" in the reference).
PAGE_LIMIT = 2
SUMMARY_FIELDS = (
    "id", "projectId", "name", "type", "currentState", "currentStateTime", "createTime", "startTime",
    "location", "jobMetadata",
)  # fmt: skip
DESCRIPTION_FIELDS = (*SUMMARY_FIELDS, "labels", "environment", "requestedState", "clientRequestId")
# The API's enums by number (google/dataflow/v1beta3/jobs.proto): JobState, JobView, ListJobsRequest.Filter, JobType.
JOB_STATES = (
    "JOB_STATE_UNKNOWN", "JOB_STATE_STOPPED", "JOB_STATE_RUNNING", "JOB_STATE_DONE", "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLED", "JOB_STATE_UPDATED", "JOB_STATE_DRAINING", "JOB_STATE_DRAINED", "JOB_STATE_PENDING",
    "JOB_STATE_CANCELLING", "JOB_STATE_QUEUED", "JOB_STATE_RESOURCE_CLEANING_UP",
)  # fmt: skip
ENUMS = {
    "currentState": JOB_STATES,
    "requestedState": JOB_STATES,
    "view": ("JOB_VIEW_UNKNOWN", "JOB_VIEW_SUMMARY", "JOB_VIEW_ALL", "JOB_VIEW_DESCRIPTION"),
    "filter": ("UNKNOWN", "ALL", "TERMINATED", "ACTIVE"),
    "type": ("JOB_TYPE_UNKNOWN", "JOB_TYPE_BATCH", "JOB_TYPE_STREAMING"),
}
_JOBS = re.compile(r"^/v1b3/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/jobs(?:/(?P<job>[^/]+))?"
                   r"(?:/(?P<sub>messages|metrics))?$")  # fmt: skip
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


class ApiError(Exception):
    def __init__(self, code: int, status: str, message: str):
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


def by_name(fields: dict) -> dict:
    """``fields`` with every enum given by number named (proto3 JSON takes either)."""
    named = dict(fields)
    for key, names in ENUMS.items():
        value = named.get(key)
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            named[key] = names[int(value)]
    return named


def by_number(answer: dict) -> dict:
    """An answer's enums as numbers (``$alt=json;enum-encoding=int``), in a job or a list of jobs."""
    if "jobs" in answer:
        return {**answer, "jobs": [by_number(job) for job in answer["jobs"]]}
    numbered = dict(answer)
    for key, names in ENUMS.items():
        if isinstance(numbered.get(key), str) and numbered[key] in names:
            numbered[key] = names.index(numbered[key])
    return numbered


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeDataflow:
    """The service, started on a free port of 127.0.0.1 until ``stop``; ``host`` is its URL."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}  # by id, as stored (every field)
        self.requests: list[dict] = []
        self.create_delay_s = 0.0
        self.faults: fault_schedules.FaultSchedule | None = None
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def beam_args(self) -> list[str]:
        """Beam options that point a Beam client at this service instead of Dataflow, without credentials.

        Beam refuses a Dataflow endpoint with a port unless its host is ``localhost`` (Beam's own local endpoint,
        which it does not validate as a service's), so the service is named ``localhost`` here.
        """
        return [f"--dataflow_endpoint=http://localhost:{self.port}", "--no_auth"]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # What a test sees and does.

    def state(self, job_id: str) -> str:
        return self.jobs[job_id]["currentState"]

    def set_state(self, job_id: str, state: str) -> None:
        """Moves a job on as the service would (it ran to its end, failed...)."""
        with self._lock:
            self._set(self.jobs[job_id], state)

    def add_job(self, project: str, location: str, name: str, labels: dict[str, str], state: str) -> str:
        """A job already in the project (another run's, say), as if created earlier; returns its id."""
        job = self._create(project, location, {"name": name, "type": "JOB_TYPE_BATCH", "labels": labels})
        self._set(job, state)
        return job["id"]

    def cancel_requests(self) -> list[str]:
        """The ids of the jobs a client asked to cancel, in order."""
        return [
            request["path"].rsplit("/", 1)[1]
            for request in self.requests
            if request["method"] == "PUT" and request["body"].get("requestedState") == "JOB_STATE_CANCELLED"
        ]

    # The service.

    @staticmethod
    def _set(job: dict, state: str) -> None:
        job["currentState"] = state
        job["currentStateTime"] = _now()

    def _create(self, project: str, location: str, body: dict) -> dict:
        labels = body.get("labels") or {}
        if len(labels) > 64:
            raise ApiError(400, "INVALID_ARGUMENT", f"a job takes at most 64 labels, got {len(labels)}")
        for key, value in labels.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(str(value)):
                raise ApiError(400, "INVALID_ARGUMENT", f"invalid label {key}={value}")
        active = [
            job
            for job in self.jobs.values()
            if job["projectId"] == project
            and job["location"] == location
            and job.get("name") == body.get("name")
            and job["currentState"] not in TERMINAL
        ]
        if active and body.get("name"):  # job names are unique among a location's active jobs
            return active[0]
        number = next(self._numbers)
        created = _now()
        job_id = f"{created[:10]}_{created[11:13]}_{created[14:16]}_{created[17:19]}-{number:019d}"
        job = {
            **body,
            "id": job_id,
            "projectId": project,
            "location": location,
            "createTime": created,
            "startTime": created,
            "currentState": "JOB_STATE_PENDING",
            "currentStateTime": created,
        }
        self.jobs[job_id] = job
        return job

    def _find(self, project: str, location: str, job_id: str) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job["projectId"] != project or job["location"] != location:
            raise ApiError(404, "NOT_FOUND", f"(job {job_id}): Could not find job in {project}/{location}")
        return job

    def _advance(self, job: dict) -> None:
        """What happened since the last read: a submitted job started, a cancelled one stopped."""
        if job["currentState"] == "JOB_STATE_PENDING":
            self._set(job, "JOB_STATE_RUNNING")
        elif job["currentState"] == "JOB_STATE_CANCELLING":
            self._set(job, "JOB_STATE_CANCELLED")

    @staticmethod
    def _view(job: dict, view: str) -> dict:
        fields = DESCRIPTION_FIELDS if view in ("JOB_VIEW_DESCRIPTION", "JOB_VIEW_ALL") else SUMMARY_FIELDS
        return {key: job[key] for key in fields if key in job}

    def _list(self, project: str, location: str, query: dict) -> dict:
        jobs = [
            job for job in self.jobs.values() if job["projectId"] == project and job["location"] == location
        ]
        for job in jobs:
            self._advance(job)
        active = sorted((j for j in jobs if j["currentState"] not in TERMINAL), key=lambda j: j["createTime"])
        ended = sorted(
            (j for j in jobs if j["currentState"] in TERMINAL), key=lambda j: j["currentStateTime"]
        )
        kind = query.get("filter", "UNKNOWN")
        selected = {"ACTIVE": active, "TERMINATED": ended, "ALL": active + ended}.get(
            kind, sorted(jobs, key=lambda j: j["id"], reverse=True)
        )
        if "name" in query:
            selected = [job for job in selected if job.get("name") == query["name"]]
        start = int(query.get("pageToken") or 0)
        size = min(int(query.get("pageSize") or PAGE_LIMIT), PAGE_LIMIT)
        page = selected[start : start + size]
        response = {"jobs": [self._view(job, "JOB_VIEW_SUMMARY") for job in page]}
        if start + size < len(selected):
            response["nextPageToken"] = str(start + size)
        return response

    def _update(self, job: dict, query: dict, body: dict) -> dict:
        requested = body.get("requestedState")
        if requested and query.get("updateMask"):
            raise ApiError(
                400, "INVALID_ARGUMENT", "cannot update both the requested state and an update mask"
            )
        if not requested:
            raise ApiError(400, "INVALID_ARGUMENT", "nothing to update: no requestedState")
        self._advance(job)
        state = job["currentState"]
        operation = {"JOB_STATE_CANCELLED": "cancel", "JOB_STATE_DONE": "stop", "JOB_STATE_DRAINING": "drain"}
        if requested not in operation:
            raise ApiError(400, "INVALID_ARGUMENT", f"requestedState {requested} cannot be set by a client")
        if state in TERMINAL or (requested == "JOB_STATE_DRAINING" and state != "JOB_STATE_RUNNING"):
            raise ApiError(
                400,
                "FAILED_PRECONDITION",
                f"Workflow modification failed. Causes: Cannot perform operation '{operation[requested]}' on "
                f"Job: {job['id']}. Job has terminated in state {state}",
            )
        job["requestedState"] = requested
        after = {"JOB_STATE_CANCELLED": "JOB_STATE_CANCELLING", "JOB_STATE_DRAINING": "JOB_STATE_DRAINING"}
        self._set(job, after.get(requested, "JOB_STATE_DONE"))
        return self._view(job, "JOB_VIEW_SUMMARY")

    def _serve(self, method: str, path: str, query: dict, body: dict) -> dict:
        match = _JOBS.match(path)
        if not match:
            raise ApiError(404, "NOT_FOUND", f"no method {method} {path}")
        project, location, job_id, sub = match.group("project", "location", "job", "sub")
        with self._lock:
            if job_id is None:
                if method == "POST":
                    return self._view(self._create(project, location, body), "JOB_VIEW_ALL")
                if method == "GET":
                    return self._list(project, location, query)
            else:
                job = self._find(project, location, job_id)
                if sub == "messages" and method == "GET":
                    return {"jobMessages": []}
                if sub == "metrics" and method == "GET":
                    return {"metrics": [], "metricTime": _now()}
                if sub is None and method == "GET":
                    self._advance(job)
                    return self._view(job, query.get("view", "JOB_VIEW_SUMMARY"))
                if sub is None and method == "PUT":
                    return self._update(job, query, body)
        raise ApiError(404, "NOT_FOUND", f"no method {method} {path}")

    def _handler(self):
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urllib.parse.urlparse(self.path)
                query = {key: values[-1] for key, values in urllib.parse.parse_qs(url.query).items()}
                numbers = "enum-encoding=int" in query.pop("$alt", "")
                query = by_name(query)
                length = int(self.headers.get("Content-Length") or 0)
                body = by_name(json.loads(self.rfile.read(length) or b"{}") if length else {})
                fake.requests.append({"method": method, "path": url.path, "query": query, "body": body})
                call = f"{method} {re.sub(r'^/v1b3/projects/[^/]+/locations/[^/]+/', '', url.path)}"
                call = re.sub(r"^jobs/[^/]+", "jobs/{id}", call.split(" ", 1)[1]) if "jobs/" in call else call
                call = f"{method} {call.split(' ', 1)[-1]}"
                fault = fake.faults.take(call) if fake.faults is not None else None
                if fault_schedules.serve_http_fault(self, fault, call, self._reply):
                    return
                if method == "POST":
                    time.sleep(fake.create_delay_s)
                try:
                    answer = fake._serve(method, url.path, query, body)
                    if fault is not None and fault.kind == "lost":
                        fault_schedules.drop_connection(self)
                        return
                    self._reply(200, by_number(answer) if numbers else answer)
                except ApiError as error:
                    self._reply(
                        error.code,
                        {"error": {"code": error.code, "message": error.message, "status": error.status}},
                    )

            def do_GET(self):  # noqa: N802 - http.server's interface
                self._handle("GET")

            def do_POST(self):  # noqa: N802
                self._handle("POST")

            def do_PUT(self):  # noqa: N802
                self._handle("PUT")

        return Handler
