"""The Trainer on a multi-host Cloud TPU slice: a queued resource created through the Cloud TPU API,
followed, recreated when preempted, and deleted whatever happens.

Vertex AI custom training reaches single-host TPU machines only (``components.accelerators``); a multi-host
slice (``components.tpu_slices``) is asked for here with the public ``google-cloud-tpu`` client over REST.
Each attempt's queued resource and node are named after this execution's outputs and the attempt number, so a
retried step finds its killed predecessor's slice and follows it. Every worker runs the startup script of
``components.tpu_worker`` at boot; worker 0 runs the step's command in the trainer image and reports through
``components.slice_files``. A Spot slice preempted is deleted and created again under the next attempt's name,
and the trainer resumes from its checkpoints. The slice is an adapter of ``effnet_common.follower``, which
creates, follows and deletes it as it does every cloud resource of the project.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time

from components import slice_files
from effnet_common import cloud_retry, follower, goodput
from effnet_common.task_signals import StopSignals

logger = logging.getLogger("components.tpu_vm")

API_ENDPOINT = "tpu.googleapis.com"
# A rehearsal or test names its Cloud TPU API on this machine here (as STORAGE_EMULATOR_HOST does GCS's).
ENDPOINT_VARIABLE = "EFFNET_TPU_API_ENDPOINT"
# ``custom_config`` key of a Trainer that trains on a TPU VM slice (``SliceSettings``).
CONFIG_KEY = "tpu_vm"
POLL_SECONDS = 30.0
# How long a slice deleted at the end of the training is followed until the API no longer knows it (a stopped
# step has only its pod's grace period: ``follower.CANCEL_WAIT_SECONDS``; the exit task deletes what is left).
DELETE_WAIT_SECONDS = 600.0
# Queued resource states (``QueuedResourceState.State``) by what the step does with them.
WAITING = ("STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES")
ACTIVE = "ACTIVE"
LOST = ("SUSPENDING", "SUSPENDED", "DELETING")
FAILED = "FAILED"
# Node states of a slice that is gone.
NODE_LOST = ("PREEMPTED", "TERMINATED", "DELETING")
# What an attempt's training came to, beyond the queued resource's own states (``SliceAttempt.read``).
TRAINED = "TRAINED"
TRAINER_FAILED = "TRAINER_FAILED"
NODE_GONE = "NODE_GONE"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class SliceFailed(RuntimeError):
    """The slice could not be had, or the training on it failed; the message is one line."""


@dataclasses.dataclass(frozen=True)
class SliceSettings:
    """The slice a Trainer step trains on, as compiled into its ``custom_config`` (``CONFIG_KEY``).

    Attributes:
      project / zone: where the slice is created.
      accelerator: the ``--accelerator`` name (``components.tpu_slices.SLICES``), e.g. 'tpu-v4-32'.
      image: the trainer image worker 0 runs.
      tier: 'spot', 'reserved' or 'on-demand'; ``reservation``: the reservation's name, with 'reserved'.
      max_wait_seconds: how long a queued resource may wait to be provisioned (0: as long as it takes).
      service_account: what the VMs run as ('' is Compute Engine's default).
      max_recreations: how many times a preempted slice is created again.
      labels: the node's labels (the run's, the task's).
      api_endpoint: the Cloud TPU API ('tpu.googleapis.com'; a rehearsal's ``http://127.0.0.1:PORT``).
      poll_seconds: how often the step reads the slice (a rehearsal's service answers at once).
    """

    project: str
    zone: str
    accelerator: str
    image: str
    tier: str = "on-demand"
    reservation: str = ""
    max_wait_seconds: int = 3600
    service_account: str = ""
    max_recreations: int = 2
    labels: dict = dataclasses.field(default_factory=dict)
    api_endpoint: str = API_ENDPOINT
    poll_seconds: float = POLL_SECONDS

    def to_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, values: dict) -> SliceSettings:
        """The settings of a compiled ``custom_config[CONFIG_KEY]``.

        Raises:
          ValueError: one line naming a key the settings do not have.
        """
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"custom_config {CONFIG_KEY}: unknown settings {', '.join(unknown)}")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class SliceRequest:
    """One execution's slice: its settings, its base id (``slice_name``: the attempt's queued resource and
    node are ``<name>-<attempt>``), where its workers report and the trainer logs (``status_dir``, the step's
    model run), the script every worker runs at boot (``{attempt_dir}`` in it is that attempt's directory) and
    the TPU VM runtime."""

    settings: SliceSettings
    name: str
    status_dir: str
    startup_script: str
    runtime_version: str

    @property
    def accelerator(self) -> str:
        return self.settings.accelerator

    @property
    def zone(self) -> str:
        return self.settings.zone

    @property
    def parent(self) -> str:
        return f"projects/{self.settings.project}/locations/{self.settings.zone}"

    def attempt_id(self, attempt: int) -> str:
        return f"{self.name}-{attempt}"

    def queued_resource_name(self, attempt: int) -> str:
        return f"{self.parent}/queuedResources/{self.attempt_id(attempt)}"

    def node_name(self, attempt: int) -> str:
        return f"{self.parent}/nodes/{self.attempt_id(attempt)}"

    def attempt_dir(self, attempt: int) -> str:
        return slice_files.attempt_dir(self.status_dir, self.attempt_id(attempt))

    @property
    def api_type(self) -> str:
        return self.accelerator.removeprefix("tpu-")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SliceRequest:
        values = json.loads(text)
        return cls(**{**values, "settings": SliceSettings.from_config(values["settings"])})


def slice_name(digest: str) -> str:
    """A queued resource's base id from an execution's outputs digest: lowercase, starting with a letter,
    short enough for '-<attempt>' within the API's 63 characters."""
    return f"effnet-{digest[:20]}"


def client_for(endpoint: str):
    """The Cloud TPU API client over REST; anonymous against a rehearsal or test server on this machine."""
    from google.cloud import tpu_v2

    options = {"api_endpoint": endpoint}
    if endpoint.startswith(("http://127.0.0.1", "http://localhost")):
        from google.auth.credentials import AnonymousCredentials

        return tpu_v2.TpuClient(credentials=AnonymousCredentials(), transport="rest", client_options=options)
    return tpu_v2.TpuClient(transport="rest", client_options=options)


def _calls(what: str) -> dict:
    return {"retry": cloud_retry.call_retry(what), "timeout": cloud_retry.CALL_TIMEOUT_SECONDS}


def queued_resource(request: SliceRequest, attempt: int):
    """The QueuedResource of an attempt: one node of the slice's type with the startup script."""
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    settings = request.settings
    attempt_dir = request.attempt_dir(attempt)
    node = tpu_v2.Node(
        accelerator_type=request.api_type,
        runtime_version=request.runtime_version,
        labels=settings.labels,
        metadata={
            "startup-script": request.startup_script.replace("{attempt_dir}", attempt_dir),
            slice_files.ATTEMPT_DIR_KEY: attempt_dir,
        },
        network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
        service_account=tpu_v2.ServiceAccount(email=settings.service_account, scope=[CLOUD_PLATFORM_SCOPE])
        if settings.service_account
        else None,
        scheduling_config=tpu_v2.SchedulingConfig(reserved=True) if settings.tier == "reserved" else None,
    )
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=request.parent, node_id=request.attempt_id(attempt), node=node
    )
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    if settings.max_wait_seconds:  # 0: queued for as long as it takes
        resource.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=settings.max_wait_seconds)
        )
    if settings.tier == "spot":
        resource.spot = tpu_v2.QueuedResource.Spot()
    if settings.tier == "reserved" and settings.reservation:
        resource.reservation_name = settings.reservation
    return resource


class QueuedResource(follower.Resource):
    """A queued resource, as the follower reads and deletes it: its state, ``GONE`` once the API does not know
    it; it has ended only when gone (a failed or suspended one still holds its nodes until deleted)."""

    settle_seconds = DELETE_WAIT_SECONDS
    cancel_words = ("delete", "deleting")

    def __init__(self, client, name: str):
        self.client, self.name, self.last = client, name, None
        self.what = f"queued resource {name}"
        self.poll_seconds = POLL_SECONDS

    def read(self) -> str:
        from google.api_core import exceptions

        try:
            self.last = self.client.get_queued_resource(
                name=self.name, timeout=cloud_retry.CALL_TIMEOUT_SECONDS
            )
        except exceptions.NotFound:
            return follower.GONE
        return self.last.state.state.name

    def request_cancel(self) -> None:
        from google.cloud import tpu_v2

        request = tpu_v2.DeleteQueuedResourceRequest(name=self.name, force=True)  # its nodes with it
        self.client.delete_queued_resource(request=request, timeout=cloud_retry.CALL_TIMEOUT_SECONDS)


class SliceAttempt(QueuedResource):
    """One attempt's slice, read as the training on it: the queued resource's state until it is ACTIVE; then
    ``NODE_GONE`` or the node's state when the node is lost, else what worker 0 reported (``TRAINED``,
    ``TRAINER_FAILED``), else ACTIVE. ``status`` is worker 0's report."""

    def __init__(self, client, request: SliceRequest, attempt: int):
        super().__init__(client, request.queued_resource_name(attempt))
        self.request, self.attempt, self.status = request, attempt, None
        self.poll_seconds = request.settings.poll_seconds
        self.dir = request.attempt_dir(attempt)

    @property
    def label(self) -> str:
        return f"{self.request.accelerator} {self.request.attempt_id(self.attempt)}"

    def read(self) -> str:
        from google.api_core import exceptions

        state = super().read()
        if state != ACTIVE:
            return state
        try:
            node = self.client.get_node(
                name=self.request.node_name(self.attempt), timeout=cloud_retry.CALL_TIMEOUT_SECONDS
            )
        except exceptions.NotFound:
            return NODE_GONE
        if node.state.name in NODE_LOST:
            return node.state.name
        self.status = slice_files.read_status(self.dir)
        if self.status is None:
            return ACTIVE
        return TRAINED if self.status.get("exit_code") == 0 else TRAINER_FAILED


def _get(client, name: str):
    """The queued resource ``name``, or None when the API does not know it."""
    from google.api_core import exceptions

    try:
        return client.get_queued_resource(name=name, **_calls(f"reading {name}"))
    except exceptions.NotFound:
        return None


def state_of(resource) -> str:
    return resource.state.state.name


def create(client, request: SliceRequest, attempt: int):
    """Creates the attempt's queued resource and returns it (``follower.create``: a create whose answer was
    lost made it, and a second one meets 409 and takes it)."""
    from google.api_core import exceptions

    name = request.queued_resource_name(attempt)

    def send():
        client.create_queued_resource(
            parent=request.parent,
            queued_resource=queued_resource(request, attempt),
            queued_resource_id=request.attempt_id(attempt),
            timeout=cloud_retry.CALL_TIMEOUT_SECONDS,
        )
        found = _get(client, name)
        if found is None:  # created, and not yet readable: the next attempt of the retry finds it
            raise exceptions.ServiceUnavailable(f"{name} is not readable yet")
        return found

    try:
        return follower.create(
            send, lambda: _get(client, name), f"creating queued resource {name}", by_id=True
        )
    except (exceptions.BadRequest, exceptions.Forbidden, exceptions.TooManyRequests) as error:
        raise SliceFailed(_not_had(request, cloud_retry.one_line(error))) from None


def _not_had(request: SliceRequest, said: str) -> str:
    return f"{request.accelerator} in {request.zone} could not be had: {said}"


def delete(
    client, name: str, wait_seconds: float = DELETE_WAIT_SECONDS, poll_seconds: float | None = None
) -> bool:
    """Deletes queued resource ``name`` with its nodes and follows it until the API no longer knows it (at
    most ``wait_seconds``); True once it is gone. Best effort: a failure is logged, never raised."""
    resource = QueuedResource(client, name)
    return follower.cancel(resource, wait_seconds, poll_seconds=poll_seconds).state == follower.GONE


def progress_line(status_dir: str) -> str:
    """The trainer's last progress (step, epoch, ETA) and evaluation from its run log; '' before the first."""
    from trainer_module import files, recorder

    try:
        events = recorder.read_run_log(files.join(status_dir, recorder.RUN_LOG_FILE))
    except (files.Error, ValueError, OSError):
        return ""
    progress = [e for e in events if e.get("event") == "progress"]
    evals = [e for e in events if e.get("event") == "eval"]
    parts = []
    if progress:
        last = progress[-1]
        parts.append(
            f"step {last['step']}/{last['total_steps']} epoch {last['epoch']:.2f} ETA {last.get('eta', '?')}"
        )
    if evals and "top1" in evals[-1]:
        parts.append(f"top-1 {evals[-1]['top1']:.4f} at step {evals[-1]['step']}")
    starts = [e for e in events if e.get("event") == "start"]
    if starts and starts[-1].get("resumed"):
        parts.append(f"resumed at step {starts[-1].get('step')}")
    return ", ".join(parts)


class SliceStates:
    """The states each attempt's slice was seen in, and when: written beside the attempts
    (``slice_files.write_states``) at every change, for the run's time account (``time_spans``)."""

    def __init__(self, status_dir: str):
        self.status_dir = status_dir
        self.seen = slice_files.read_states(status_dir)  # a retried step goes on with the record

    def saw(self, attempt: int, state: str) -> None:
        last = next((s["state"] for s in reversed(self.seen) if s["attempt"] == attempt), None)
        if state != last:
            self.seen.append({"attempt": attempt, "state": state, "time": time.time()})
            with goodput.best_effort(f"the slice's states in {self.status_dir}"):
                slice_files.write_states(self.status_dir, self.seen)


# The run's time account's part for the time a slice spends in a state (``time_spans``): the queue, its
# provisioning, and its deletion once trained. While it is ACTIVE, its workers' set-up up to the trainer's
# start and its end after the trainer's; the trainer's own parts in between. A lost slice's time is the
# recovery the training's account measures.
_STATE_PARTS = {
    "WAITING_FOR_RESOURCES": "WAITING_FOR_CAPACITY",
    **{state: "PROVISIONING" for state in ("STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "PROVISIONING")},
    TRAINED: "TEARDOWN",
}


def time_spans(status_dir: str, training=None) -> list:
    """The time account's spans (``effnet_common.goodput.Span``) of the slices of the step whose status
    directory is ``status_dir``, around ``training`` (the trainer's ``TimeAccount``: its attempts say when the
    trainer ran on each slice); [] for a step that ran none."""
    attempts = training.attempts if training is not None else ()
    spans = []
    for states in _states_by_attempt(status_dir):
        for state, following in itertools.pairwise(states):
            begin, end = state["time"], following["time"]
            if state["state"] == ACTIVE:
                ran = [(start, last) for start, last in attempts if begin <= start <= end]
                setup_end = ran[0][0] if ran else end
                spans.append(goodput.Span(begin, setup_end, "WORKER_SETUP"))
                if ran:
                    spans.append(goodput.Span(min(ran[-1][1], end), end, "TEARDOWN"))
            elif state["state"] in _STATE_PARTS:
                spans.append(goodput.Span(begin, end, _STATE_PARTS[state["state"]]))
    return spans


def held_hours(status_dir: str) -> float:
    """The hours the step's slices were held: from ACTIVE to deleted, what they bill."""
    held = 0.0
    for states in _states_by_attempt(status_dir):
        active = next((s["time"] for s in states if s["state"] == ACTIVE), None)
        if active is not None:
            held += states[-1]["time"] - active
    return held / 3600


def _states_by_attempt(status_dir: str) -> list[list[dict]]:
    seen = slice_files.read_states(status_dir)
    return [[s for s in seen if s["attempt"] == attempt] for attempt in sorted({s["attempt"] for s in seen})]


class _Progress:
    """What a person following the step reads as one attempt's slice goes through its states (one line per
    change); raises ``SliceFailed`` for a slice that cannot be had or a trainer that failed. Every state goes
    to ``states``."""

    def __init__(self, attempt: SliceAttempt, states: SliceStates):
        self.attempt, self.states = attempt, states
        self.started = time.monotonic()
        self._said = ""

    def say(self, line: str) -> None:
        if line and line != self._said:
            logger.info("%s", line)
            print(f"{self.attempt.label}: {line}", flush=True)
            self._said = line

    def __call__(self, state: str) -> None:
        attempt, request = self.attempt, self.attempt.request
        settings = request.settings
        self.states.saw(attempt.attempt, state)
        if state == FAILED:
            said = attempt.last.state.failed_data.error.message or "no reason given"
            raise SliceFailed(_not_had(request, f"the queued resource failed: {said}"))
        if state in LOST:
            self.say(f"the slice is {state} (initiated by {attempt.last.state.state_initiator.name})")
        elif state == NODE_GONE:
            self.say("the slice's node is gone")
        elif state in NODE_LOST:
            self.say(f"the slice's node is {state}")
        elif state in WAITING:
            bound = settings.max_wait_seconds + 5 * attempt.poll_seconds
            if settings.max_wait_seconds and time.monotonic() - self.started > bound:
                said = f"not provisioned within {settings.max_wait_seconds} s (still {state})"
                raise SliceFailed(_not_had(request, said))
            self.say(f"queued resource {state}")
        elif state == TRAINED:
            self.say("the trainer succeeded")
        elif state == TRAINER_FAILED:
            logger.error("the end of the trainer's error output:\n%s", slice_files.read_errors(attempt.dir))
            raise SliceFailed(
                f"the trainer on {attempt.label} exited {attempt.status.get('exit_code')}: "
                f"{attempt.status.get('last_line') or 'no message'}"
            )
        elif state == ACTIVE:
            hosts = _hosts(request.accelerator)
            ready = slice_files.workers_reported(attempt.dir)
            progress = progress_line(request.status_dir)
            self.say(f"ACTIVE, {ready}/{hosts} workers set up" + (f"; {progress}" if progress else ""))


# What ends the following of an attempt: trained, or its slice lost (a failure raises on the way).
_ATTEMPT_ENDS = (TRAINED, NODE_GONE, follower.GONE, *LOST, *NODE_LOST)


def _hosts(accelerator: str) -> int:
    from components import tpu_slices

    return tpu_slices.SLICES[accelerator].hosts if accelerator in tpu_slices.SLICES else 1


def _current_attempt(client, request: SliceRequest) -> tuple[int, SliceAttempt | None]:
    """(the attempt to go on with, its slice when it exists): an earlier attempt of this execution (a
    retried step) is followed when its slice is queued or active; a lost one is deleted and the next attempt
    begins."""
    newest = None
    for attempt in range(request.settings.max_recreations + 1):
        resource = _get(client, request.queued_resource_name(attempt))
        if resource is not None:
            newest = (attempt, resource)
    if newest is None:
        return 0, None
    attempt, resource = newest
    found = SliceAttempt(client, request, attempt)
    if follower.reattach([(found, state_of(resource))], lambda state: state in WAITING or state == ACTIVE):
        print(f"re-attaching to {found.label} ({state_of(resource)})", flush=True)
        return attempt, found
    return attempt + 1, None


def run_slice(request: SliceRequest, poll_seconds: float | None = None, patience=None, client=None) -> None:
    """Creates (or finds again) the slice, follows the training on it to its end, recreates it when it is
    preempted, and deletes it whatever happens.

    Raises:
      TaskStopped: SIGTERM / SIGINT arrived; the slice was deleted.
      SliceFailed: the slice could not be had, was lost more than ``max_recreations`` times, or the trainer
        failed (one line).
    """
    from effnet_common import stopping

    settings = request.settings
    client = client or client_for(settings.api_endpoint)
    if poll_seconds is not None:
        request = dataclasses.replace(
            request, settings=dataclasses.replace(settings, poll_seconds=poll_seconds)
        )
    patience = patience or cloud_retry.Patience()
    stop = StopSignals()
    states = SliceStates(request.status_dir)
    current: SliceAttempt | None = None

    def running() -> list[SliceAttempt]:
        return [current] if current is not None else []

    def delete_now() -> None:  # a command's Ctrl-C: within the time a stopped step has
        for attempt in running():
            follower.cancel(attempt, follower.CANCEL_WAIT_SECONDS)

    # In a command of this project's own (the local runner's rehearsal), Ctrl-C stops the command as it stops
    # any, the slice deleted by a clean-up of the stop (``effnet_common.stopping``); in a pipeline task, the
    # task's SIGTERM / SIGINT ends the step where it waits (``task_signals``).
    armed = stopping.is_armed()
    guard = stopping.cleanup(delete_now) if armed else stop.installed()
    try:
        with guard:
            with follower.cancelled_on_failure(running, stop, shield=not armed):
                attempt, current = _current_attempt(client, request)
                while True:
                    if attempt > settings.max_recreations:
                        raise SliceFailed(
                            f"{settings.accelerator} in {settings.zone} was lost "
                            f"{settings.max_recreations + 1} times "
                            f"(max_recreations={settings.max_recreations}); the checkpoints are kept in "
                            f"{request.status_dir}: run the step again to go on"
                        )
                    if current is None:
                        current = SliceAttempt(client, request, attempt)
                        create(client, request, attempt)
                        print(f"created {current.label} in {settings.zone}", flush=True)
                    ends = lambda state: state in _ATTEMPT_ENDS  # noqa: E731 - read as a sentence
                    progress = _Progress(current, states)
                    if follower.follow(current, patience, stop, progress, until=ends) == TRAINED:
                        break
                    print(f"{current.label} was lost: creating it again", flush=True)
                    follower.cancel(current)
                    states.saw(attempt, slice_files.DELETED)
                    attempt, current = attempt + 1, None
            follower.cancel(current)  # trained: a slice bills until it is deleted
            states.saw(attempt, slice_files.DELETED)
    except cloud_retry.Unanswered as error:
        raise SliceFailed(str(error)) from None


def run_resources(client, project: str, zone: str, label: str, value: str) -> list[str]:
    """The queued resources in ``zone`` whose node carries label ``label=value`` (a queued resource has no
    labels of its own; its node spec's node has the run's)."""
    parent = f"projects/{project}/locations/{zone}"
    found = client.list_queued_resources(parent=parent, **_calls(f"listing the queued resources of {parent}"))
    names = []
    for resource in found:
        specs = resource.tpu.node_spec
        if any(spec.node.labels.get(label) == value for spec in specs):
            names.append(resource.name)
    return names
