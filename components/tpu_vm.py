"""The Trainer on a multi-host Cloud TPU slice: created through the Cloud TPU API's queued resources, followed,
recreated when preempted, and deleted whatever happens.

Vertex AI custom training reaches single-host TPU machines only (``components.accelerators``). A multi-host
slice (``components.tpu_slices``: tpu-v3-32 ... tpu-v3-2048, tpu-v4-16 and up, tpu-v5p-16 and up,
tpu-v5litepod-16 and up) is asked for here, with the public ``google-cloud-tpu`` client over REST, every call
under the project's one retry policy (``effnet_common.cloud_retry``):

1. **Create or re-attach.** The queued resource and its node are named after this execution's outputs and the
   attempt (``<name>-<attempt>``), so a retried step finds the slice its killed predecessor made (a GET) and
   follows it instead of creating a second. The request carries the tier (Spot, a reservation, or on demand),
   how long it may wait to be provisioned (``queueingPolicy.validUntilDuration``), the TF pod runtime, the
   service account, the run's labels (on the node: a queued resource has none) and a startup script that every
   worker runs at boot (``components.tpu_worker``): it sets up the pinned project from the wheel and constraints
   this step wrote, and on worker 0 runs the very command a Vertex job would (TFX's executor, which calls the
   trainer's ``run_fn`` and writes this step's outputs).
2. **Follow.** Until the slice is ACTIVE, its queued state; then the trainer's progress (the model run's log:
   step, epoch, last evaluation, ETA) and the workers' status files, until worker 0 reports the trainer's exit.
   A slice not provisioned within its bound, or refused (quota, stock), ends the step in one line naming the
   accelerator, the zone and what the API said.
3. **Preemption.** A Spot slice suspended or preempted, or a node lost, is deleted and created again under
   the next attempt's name, at most ``max_recreations`` times; the trainer resumes from its last checkpoint
   (the same outputs, the same checkpoint directory).
4. **Delete.** The slice is deleted (``force``: its nodes first) when the training ends, fails, or the step
   is stopped (SIGTERM, SIGINT), and followed until the API no longer knows it; a slice the step could not
   delete is found by the run's label by the exit task (``components.run_cleanup``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from effnet_common import cloud_retry
from effnet_common.task_signals import StopSignals

logger = logging.getLogger("components.tpu_vm")

API_ENDPOINT = "tpu.googleapis.com"
# A rehearsal or test names its Cloud TPU API on this machine here (as STORAGE_EMULATOR_HOST does GCS's).
ENDPOINT_VARIABLE = "EFFNET_TPU_API_ENDPOINT"
# ``custom_config`` key of a Trainer that trains on a TPU VM slice (``SliceSettings``).
CONFIG_KEY = "tpu_vm"
POLL_SECONDS = 30.0
# After a delete: how long the step follows the slice until the API no longer knows it. A stopped step has
# Kubernetes' 30 s; the exit task deletes whatever is left.
DELETE_WAIT_SECONDS = 600.0
STOPPED_DELETE_WAIT_SECONDS = 20.0
DELETE_POLL_SECONDS = 5.0  # how often a deleted slice is looked up until it is gone (at most)
# Queued resource states (``QueuedResourceState.State``) by what the step does with them.
WAITING = ("STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES")
ACTIVE = "ACTIVE"
LOST = ("SUSPENDING", "SUSPENDED", "DELETING")
FAILED = "FAILED"
# Node states of a slice that is gone.
NODE_LOST = ("PREEMPTED", "TERMINATED", "DELETING")
# Where the workers report, under the step's status directory: one directory per attempt.
STATUS_DIR = "slice"
TRAINER_STATUS = "trainer.json"
COMMAND_FILE = "command.json"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class SliceFailed(RuntimeError):
    """The slice could not be had, or the training on it failed; the message is one line."""


@dataclasses.dataclass(frozen=True)
class SliceRequest:
    """The slice a Trainer step trains on, and how to follow it.

    Attributes:
      project / zone: where the slice is created.
      accelerator: the ``--accelerator`` name (``components.tpu_slices.SLICES``), e.g. 'tpu-v4-32'.
      name: this execution's base id (``slice_name``): the attempt's queued resource and node are
        ``<name>-<attempt>``.
      status_dir: where the workers report and the trainer writes its run log (the step's model run).
      startup_script: what every worker runs at boot (``components.tpu_worker.startup_script``) for an
        attempt: ``{attempt_dir}`` in it is replaced by that attempt's status directory.
      tier: 'spot', 'reserved' or 'on-demand'; ``reservation``: the reservation's name, with 'reserved'.
      max_wait_seconds: how long a queued resource may wait to be provisioned (0: as long as it takes).
      labels: the node's labels (the run's, the task's).
      service_account: what the VMs run as ('' is Compute Engine's default).
      max_recreations: how many times a preempted slice is created again.
      api_endpoint: the Cloud TPU API ('tpu.googleapis.com'; a rehearsal's ``http://127.0.0.1:PORT``).
    """

    project: str
    zone: str
    accelerator: str
    name: str
    status_dir: str
    startup_script: str
    runtime_version: str
    tier: str = "on-demand"
    reservation: str = ""
    max_wait_seconds: int = 3600
    labels: dict = dataclasses.field(default_factory=dict)
    service_account: str = ""
    max_recreations: int = 2
    api_endpoint: str = API_ENDPOINT

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    def attempt_id(self, attempt: int) -> str:
        return f"{self.name}-{attempt}"

    def queued_resource_name(self, attempt: int) -> str:
        return f"{self.parent}/queuedResources/{self.attempt_id(attempt)}"

    def node_name(self, attempt: int) -> str:
        return f"{self.parent}/nodes/{self.attempt_id(attempt)}"

    def attempt_dir(self, attempt: int) -> str:
        return f"{self.status_dir.rstrip('/')}/{STATUS_DIR}/{self.attempt_id(attempt)}"

    @property
    def api_type(self) -> str:
        return self.accelerator.removeprefix("tpu-")


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

    node = tpu_v2.Node(
        accelerator_type=request.api_type,
        runtime_version=request.runtime_version,
        labels=request.labels,
        metadata={
            "startup-script": request.startup_script.replace("{attempt_dir}", request.attempt_dir(attempt))
        },
        network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
        service_account=tpu_v2.ServiceAccount(email=request.service_account, scope=[CLOUD_PLATFORM_SCOPE])
        if request.service_account
        else None,
        scheduling_config=tpu_v2.SchedulingConfig(reserved=True) if request.tier == "reserved" else None,
    )
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=request.parent, node_id=request.attempt_id(attempt), node=node
    )
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    if request.max_wait_seconds:  # 0: queued for as long as it takes
        resource.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=request.max_wait_seconds)
        )
    if request.tier == "spot":
        resource.spot = tpu_v2.QueuedResource.Spot()
    if request.tier == "reserved" and request.reservation:
        resource.reservation_name = request.reservation
    return resource


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
    """Creates the attempt's queued resource and returns it. A create whose answer was lost made it: a retry
    meets 409 and takes the one that exists."""
    from google.api_core import exceptions

    name = request.queued_resource_name(attempt)

    def attempt_create():
        try:
            client.create_queued_resource(
                parent=request.parent,
                queued_resource=queued_resource(request, attempt),
                queued_resource_id=request.attempt_id(attempt),
                timeout=cloud_retry.CALL_TIMEOUT_SECONDS,
            )
        except exceptions.Conflict:
            logger.warning("queued resource %s exists already (an earlier create's answer was lost)", name)
        found = _get(client, name)
        if found is None:  # created, and not yet readable: the next attempt of the retry finds it
            raise exceptions.ServiceUnavailable(f"{name} is not readable yet")
        return found

    try:
        return cloud_retry.retried(attempt_create, f"creating queued resource {name}")
    except (exceptions.BadRequest, exceptions.Forbidden, exceptions.TooManyRequests) as error:
        raise SliceFailed(_not_had(request, cloud_retry.one_line(error))) from None


def _not_had(request: SliceRequest, said: str) -> str:
    return f"{request.accelerator} in {request.zone} could not be had: {said}"


def delete(
    client, name: str, wait_seconds: float = DELETE_WAIT_SECONDS, poll_seconds: float = DELETE_POLL_SECONDS
) -> bool:
    """Deletes queued resource ``name`` with its nodes and follows it until the API no longer knows it (at most
    ``wait_seconds``, looking every ``poll_seconds``); True once it is gone. Best effort: a failure is logged,
    never raised."""
    from google.api_core import exceptions
    from google.cloud import tpu_v2

    deadline = time.monotonic() + wait_seconds
    try:
        retry = cloud_retry.call_retry(f"deleting {name}").with_timeout(wait_seconds)
        client.delete_queued_resource(
            request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True),
            retry=retry,
            timeout=cloud_retry.CALL_TIMEOUT_SECONDS,
        )
    except exceptions.NotFound:
        return True
    except Exception as error:  # the step is ending anyway; say what was not done
        logger.error("could not delete queued resource %s: %s", name, cloud_retry.one_line(error))
        return False
    logger.warning("deleting queued resource %s", name)
    while time.monotonic() < deadline:
        try:
            if _get(client, name) is None:
                logger.warning("queued resource %s is deleted", name)
                return True
        except Exception as error:  # noqa: BLE001 - keep waiting out what the retry did not
            logger.warning("reading %s while it is deleted: %s", name, cloud_retry.one_line(error))
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))
    logger.error("queued resource %s was still there %.0f s after its delete", name, wait_seconds)
    return False


def read_status(attempt_dir: str) -> dict | None:
    """What worker 0 reported when the trainer ended (``{"exit_code", "last_line"}``), or None."""
    from trainer_module import files

    path = files.join(attempt_dir, TRAINER_STATUS)
    try:
        if not files.exists(path):
            return None
        return json.loads(files.read_text(path))
    except (files.Error, ValueError):
        return None


def read_errors(attempt_dir: str) -> str:
    """The end of the trainer's error output that worker 0 kept beside its report, or ''."""
    from components import tpu_worker
    from trainer_module import files

    try:
        return files.read_text(files.join(attempt_dir, tpu_worker.TRAINER_ERRORS))
    except files.Error:
        return ""


def setup_workers(attempt_dir: str) -> int:
    """How many workers report their set-up done."""
    from trainer_module import files

    try:
        return len(files.glob(files.join(attempt_dir, "worker-*.json")))
    except files.Error:
        return 0


def progress_line(status_dir: str) -> str:
    """The trainer's last progress (step, epoch, ETA) and evaluation, from its run log; '' before the first."""
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


@dataclasses.dataclass
class _Follower:
    """Follows one attempt's slice until the trainer on it ended or the slice was lost."""

    client: object
    request: SliceRequest
    attempt: int
    poll_seconds: float
    patience: cloud_retry.Patience
    stop: StopSignals
    _said: str = ""

    def say(self, line: str) -> None:
        if line and line != self._said:
            logger.info("%s", line)
            print(f"{self.request.accelerator} {self.request.attempt_id(self.attempt)}: {line}", flush=True)
            self._said = line

    def follow(self) -> str:
        """'succeeded' or 'lost' (preempted, suspended, a node gone).

        Raises:
          SliceFailed: not provisioned within the bound, refused, or the trainer failed (its last line).
        """
        from google.api_core import exceptions

        name = self.request.queued_resource_name(self.attempt)
        started = time.monotonic()
        bound = self.request.max_wait_seconds + 5 * self.poll_seconds
        while True:
            resource = self.patience.read(
                lambda: self.client.get_queued_resource(name=name, timeout=cloud_retry.CALL_TIMEOUT_SECONDS),
                f"reading queued resource {name}",
            )
            state = state_of(resource)
            if state == FAILED:
                said = resource.state.failed_data.error.message or "no reason given"
                raise SliceFailed(_not_had(self.request, f"the queued resource failed: {said}"))
            if state in LOST:
                self.say(f"the slice is {state} (initiated by {resource.state.state_initiator.name})")
                return "lost"
            if state in WAITING:
                if self.request.max_wait_seconds and time.monotonic() - started > bound:
                    raise SliceFailed(
                        _not_had(
                            self.request,
                            f"not provisioned within {self.request.max_wait_seconds} s (still {state})",
                        )
                    )
                self.say(f"queued resource {state}")
            elif state == ACTIVE:
                try:
                    node = self.client.get_node(
                        name=self.request.node_name(self.attempt), **_calls("reading the slice's node")
                    )
                except exceptions.NotFound:
                    self.say("the slice's node is gone")
                    return "lost"
                if node.state.name in NODE_LOST:
                    self.say(f"the slice's node is {node.state.name}")
                    return "lost"
                ended = self._trainer_ended()
                if ended is not None:
                    return ended
            self.stop.wait(self.poll_seconds)

    def _trainer_ended(self) -> str | None:
        attempt_dir = self.request.attempt_dir(self.attempt)
        status = read_status(attempt_dir)
        if status is not None:
            if status.get("exit_code") == 0:
                self.say("the trainer succeeded")
                return "succeeded"
            logger.error("the end of the trainer's error output:\n%s", read_errors(attempt_dir))
            raise SliceFailed(
                f"the trainer on {self.request.accelerator} {self.request.attempt_id(self.attempt)} exited "
                f"{status.get('exit_code')}: {status.get('last_line') or 'no message'}"
            )
        hosts = _hosts(self.request.accelerator)
        ready = setup_workers(attempt_dir)
        progress = progress_line(self.request.status_dir)
        self.say(f"ACTIVE, {ready}/{hosts} workers set up" + (f"; {progress}" if progress else ""))
        return None


def _hosts(accelerator: str) -> int:
    from components import tpu_slices

    return tpu_slices.SLICES[accelerator].hosts if accelerator in tpu_slices.SLICES else 1


def _current_attempt(client, request: SliceRequest) -> tuple[int, bool]:
    """(the attempt to go on with, whether its slice exists): an earlier attempt of this execution (a retried
    step) is followed when its slice is queued or active; a lost one is deleted and the next attempt begins."""
    newest = None
    for attempt in range(request.max_recreations + 1):
        resource = _get(client, request.queued_resource_name(attempt))
        if resource is not None:
            newest = (attempt, resource)
    if newest is None:
        return 0, False
    attempt, resource = newest
    state = state_of(resource)
    if state in WAITING or state == ACTIVE:
        logger.warning("following %s (%s), made by an earlier attempt of this step", resource.name, state)
        print(f"re-attaching to {request.accelerator} {request.attempt_id(attempt)} ({state})", flush=True)
        return attempt, True
    delete(client, resource.name)
    return attempt + 1, False


def run_slice(request: SliceRequest, poll_seconds: float | None = None, patience=None, client=None) -> None:
    """Creates (or finds again) the slice, follows the training on it to its end, recreates it when it is
    preempted, and deletes it whatever happens.

    Raises:
      TaskStopped: SIGTERM / SIGINT arrived; the slice was deleted.
      SliceFailed: the slice could not be had, was lost more than ``max_recreations`` times, or the trainer
        failed (one line).
    """
    from effnet_common import stopping

    client = client or client_for(request.api_endpoint)
    interval = POLL_SECONDS if poll_seconds is None else poll_seconds
    delete_interval = min(interval, DELETE_POLL_SECONDS)
    patience = patience or cloud_retry.Patience()
    stop = StopSignals()
    current: str | None = None

    def delete_current() -> None:
        if current is not None:
            delete(client, current, STOPPED_DELETE_WAIT_SECONDS, delete_interval)

    # In a command of this project's own (the local runner's rehearsal), Ctrl-C stops the command as it stops
    # any (``effnet_common.stopping``): the slice is deleted by a clean-up of the stop. In a pipeline task, the
    # task's SIGTERM / SIGINT ends the step where it waits (``task_signals.StopSignals``).
    guard = stopping.cleanup(delete_current) if stopping.is_armed() else stop.installed()
    with guard:
        try:
            attempt, exists = _current_attempt(client, request)
            while True:
                stop.check()
                if attempt > request.max_recreations:
                    raise SliceFailed(
                        f"{request.accelerator} in {request.zone} was lost {request.max_recreations + 1} times "
                        f"(max_recreations={request.max_recreations}); the checkpoints are kept in "
                        f"{request.status_dir}: run the step again to go on"
                    )
                current = request.queued_resource_name(attempt)
                if not exists:
                    with stop.held():
                        create(client, request, attempt)
                    print(
                        f"created {request.accelerator} {request.attempt_id(attempt)} in {request.zone}",
                        flush=True,
                    )
                outcome = _Follower(client, request, attempt, interval, patience, stop).follow()
                if outcome == "succeeded":
                    return
                print(
                    f"{request.accelerator} {request.attempt_id(attempt)} was lost: creating it again",
                    flush=True,
                )
                delete(client, current, poll_seconds=delete_interval)
                attempt, exists = attempt + 1, False
        except cloud_retry.Unanswered as error:
            raise SliceFailed(str(error)) from None
        finally:
            stop.ignore()
            if current is not None:
                wait = STOPPED_DELETE_WAIT_SECONDS if stop.received is not None else DELETE_WAIT_SECONDS
                delete(client, current, wait, delete_interval)


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
