"""Vertex AI faked at its network clients.

Custom jobs: ``python -m fake_vertex --record-dir DIR -- COMMAND``. ``COMMAND`` is a container's ``python -m
MODULE ARGS...`` (the Trainer task's KFP entry point). It runs in this process as ``python -m`` would run it, with
one change: ``google.cloud.aiplatform.gapic.JobServiceClient``, the client TFX's ``VertexJobClient`` and
``components.vertex_training`` build, is ``FakeJobServiceClient``. Everything up to the network call is TFX's and
this project's code: the job spec from the Trainer's ``custom_config``, the worker pools' command TFX writes, the
polling and the cancellation of the job.

``create_custom_job`` does what Vertex does with the request, on this machine:

1. checks it against the API's own ``aiplatform_v1.CustomJob`` message (an unknown field fails, as it would in
   the service) and against the service's rules for machines, TPUs, regions and provisioning
   (``check_custom_job``: a request the service refuses raises ``InvalidArgument``, as the API's 400 does),
   and records it, as sent, in ``DIR/custom_job-N.json`` (``parent``, ``api_endpoint``, ``custom_job``);
2. starts every replica of every worker pool: its container ``command`` + ``args`` (``python -m
   tfx.scripts.run_executor ...``) as a subprocess of this interpreter, with the variables Vertex sets on a
   replica: ``CLUSTER_SPEC`` (pools ``workerpool0``, ``workerpool1``...) and ``TF_CONFIG`` (pool 0 is the
   ``chief``, the next pool's replicas are ``worker`` 0, 1...), each with the job spec, the replicas reaching
   each other over loopback ports; replica ``workerpoolP-I``'s output goes to ``DIR/custom_job-N.workerpoolP-I.log``;
3. returns the job ``JOB_STATE_PENDING``. ``get_custom_job`` reports it running while a replica runs, then
   ``JOB_STATE_SUCCEEDED`` when every replica exited 0, or ``JOB_STATE_FAILED`` with the first failure's exit
   code; ``cancel_custom_job`` records ``DIR/custom_job-N.cancel.json``, stops the replicas (SIGTERM) and reports
   ``JOB_STATE_CANCELLED``; ``list_custom_jobs`` lists the location's jobs, newest last, through the API's
   filter on labels and state (``labels.KEY=VALUE``, ``labels.KEY:*``, ``state=``/``state!=``, joined by
   ``AND``; anything else is refused, as the service refuses a filter it cannot parse).

With ``RUN_REPLICAS`` False (tests of what a task sends, in this process), a created job starts no replica and
succeeds at once.

A job outlives the task that created it, as a real one does: each replica runs in a session of its own and
writes its exit status beside its log (``EXIT_FILE``), and a job's record, replicas and cancellation are files of
the record directory, so a task started again after its first attempt was killed (``kfp_launcher.run_task_retried``)
finds, follows and cancels the jobs the first one made. ``stop_all(record_dir)`` stops what is left.

Faults: every call is a GAPIC method (``faults.gapic_method``) that meets the next fault of ``FAULTS`` (a
``faults.FaultSchedule``; ``--faults FILE`` in a task's process) and honours the caller's ``retry=`` and
``timeout=`` as the generated clients do. In a task's process the retry policy's waits are made short
(``FAST_RETRY``).

Polls are made fast (``components.vertex_training.POLL_SECONDS``): the fake answers at once, where Vertex takes
seconds, so only the test's time changes.

Custom jobs already in the project, for the run's clean-up (``components.run_cleanup``): ``FakeProjectJobs`` holds
them in a JSON file, so that the test and the task's process share them; ``python -m fake_vertex --record-dir DIR
--project-jobs FILE -- COMMAND`` (``project_jobs_wrapper``) runs a task whose ``JobServiceClient`` lists, gets and
cancels those jobs, with the service's rules (see the class).

Pipeline jobs: ``FakePipelineService.install(monkeypatch)`` replaces the three calls of ``aiplatform_v1``'s
``PipelineServiceClient`` that the SDK's ``PipelineJob`` makes (create, get, cancel) in this process: requests
are recorded as the API's own messages, checked against the service's rules for labels and service accounts,
and the job moves through the states the test scripts; a read of a started job carries its run's metadata context
(``fake_vertex_metadata`` holds the metadata store, the experiments and the TensorBoard instances).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import re
import runpy
import signal
import subprocess
import sys
import time

import faults
from loopback import free_ports

RECORD_FILE = "custom_job-{n}.json"
CANCEL_FILE = "custom_job-{n}.cancel.json"
LOG_FILE = "custom_job-{n}.{replica}.log"
# Every poll of the job, in tests: Vertex would answer in seconds, the fake at once.
FAST_POLL_SECONDS = 0.2

# Jobs created in this process, by resource name (TFX builds a new client for each call).
_JOBS: dict = {}
_record_dir = ""
RUN_REPLICAS = True
# The faults the job service's calls meet (``faults.FaultSchedule``; ``--faults FILE`` in a task's process).
FAULTS: faults.FaultSchedule | None = None

# ---- the training service's rules --------------------------------------------------------------------------
#
# Sources: Vertex AI "Configure compute resources for custom training" (machine types and their GPUs),
# "Training with TPU accelerators" (TPU v2/v3 as cloud-tpu with 8 cores, v5e as ct5lp-hightpu-* with a
# topology and no accelerator fields in Google's samples), "Schedule training jobs based on resource
# availability" (flex-start), "Use Spot VMs with training", "Use reservations with training", and the
# ``aiplatform_v1`` protos (``Scheduling``, ``MachineSpec``, ``ReservationAffinity``).

# GPU machine families and the accelerator each carries; the count is the machine name's ``-Ng`` suffix.
GPU_MACHINES = {
    "a2-highgpu": "NVIDIA_TESLA_A100",
    "a2-megagpu": "NVIDIA_TESLA_A100",
    "a2-ultragpu": "NVIDIA_A100_80GB",
    "a3-highgpu": "NVIDIA_H100_80GB",
    "a3-megagpu": "NVIDIA_H100_MEGA_80GB",
    "a3-ultragpu": "NVIDIA_H200_141GB",
    "a4-highgpu": "NVIDIA_B200",
}
# N1 machines take these GPUs attached, 1, 2, 4 or 8 of them.
N1_GPUS = ("NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4")
CPU_FAMILIES = ("n1-standard", "n1-highmem", "n1-highcpu", "n2-standard", "n2-highmem", "e2-standard")
# TPU v5e VMs: chips per VM and the single-host topology of each.
V5E_MACHINES = {
    "ct5lp-hightpu-1t": (1, "1x1"),
    "ct5lp-hightpu-4t": (4, "2x2"),
    "ct5lp-hightpu-8t": (8, "2x4"),
}
# Regions where Vertex training offers each TPU type: Vertex's locations table for training (read for US
# regions: TPU v2 and v3 in us-central1, v3 also in us-east1) and Google's v5e training sample (us-west1);
# outside the US and for the other v5e regions, the regions of Cloud TPU's zones for the type (not confirmed
# for Vertex training).
TPU_REGIONS = {
    "TPU_V2": ("us-central1", "europe-west4", "asia-east1"),
    "TPU_V3": ("us-central1", "us-east1", "europe-west4"),
    "TPU_V5_LITEPOD": ("us-central1", "us-south1", "us-west1", "us-west4", "europe-west4"),
}
FLEX_START_GPUS = (
    "NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB", "NVIDIA_B200",
)  # fmt: skip
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
TENSORBOARD_NAME = re.compile(r"^projects/[^/]+/locations/(?P<location>[^/]+)/tensorboards/[^/]+$")


class Refused(ValueError):
    """A request the service refuses (raised as ``InvalidArgument`` by the fake client)."""


def _tpu_type(spec) -> str:
    """The machine's TPU type ('TPU_V2', 'TPU_V3', 'TPU_V5_LITEPOD'), or '' for a VM without TPUs."""
    if spec.machine_type == "cloud-tpu":
        return spec.accelerator_type.name
    return "TPU_V5_LITEPOD" if spec.machine_type in V5E_MACHINES else ""


def _check_machine(spec) -> None:
    """One pool's ``MachineSpec``: a machine type training offers, with the accelerators that machine has."""
    machine, accelerator, count = spec.machine_type, spec.accelerator_type.name, spec.accelerator_count
    if accelerator != "ACCELERATOR_TYPE_UNSPECIFIED" and not count:
        raise Refused(f"accelerator_type {accelerator} and accelerator_count should be given together")
    if machine == "cloud-tpu":
        # Only 8-core (one host) v2/v3 machines are documented; a larger count is not confirmed either way.
        if accelerator not in ("TPU_V2", "TPU_V3") or count != 8:
            raise Refused(
                f"cloud-tpu takes TPU_V2 or TPU_V3 with accelerator_count 8, not {accelerator} x {count}"
            )
        return
    if machine in V5E_MACHINES:
        chips, topology = V5E_MACHINES[machine]
        if spec.tpu_topology != topology:
            # Multi-host v5e topologies (4x4 and up, one replica a host) are not modelled by this fake.
            raise Refused(
                f"{machine} ({chips} chips) needs tpu_topology {topology}, got {spec.tpu_topology!r}"
            )
        return
    family, _, size = machine.rpartition("-")
    if family in GPU_MACHINES:
        wanted = int(size.removesuffix("g"))
        if (accelerator, count) != (GPU_MACHINES[family], wanted):
            raise Refused(f"{machine} has {wanted} {GPU_MACHINES[family]}, not {count} {accelerator}")
        return
    if family.startswith(CPU_FAMILIES):
        if accelerator == "ACCELERATOR_TYPE_UNSPECIFIED":
            return
        if family.startswith("n1-") and accelerator in N1_GPUS and count in (1, 2, 4, 8):
            return
        raise Refused(f"{machine} cannot have {count} {accelerator}")
    raise Refused(f"machine type {machine!r} is not offered for custom training")


def check_custom_job(parent: str, job) -> None:
    """The training service's rules for a ``CustomJob`` created under ``parent`` (``projects/P/locations/R``).

    Raises ``Refused`` naming the rule. Rules:

    - machines: each pool's machine type is one training offers, with the accelerators it has
      (``_check_machine``); ``accelerator_type`` without ``accelerator_count`` is refused (the API's own error).
    - TPUs: one worker pool of one replica (the SDK: TPU jobs allow one replica; a v2/v3 machine is one host),
      in a region of ``TPU_REGIONS``.
    - flex-start (``Scheduling.Strategy.FLEX_START``): every pool the same machine, its GPUs of
      ``FLEX_START_GPUS``, a timeout of at most 7 days, no reservation.
    - Spot: no reservation (a Compute Engine reservation holds standard VMs). Vertex refuses Spot for TPU Pods;
      no TPU Pod passes the TPU rule above. Spot on TPU v2/v3 could not be confirmed either way: accepted.
    - reservations (``SPECIFIC_RESERVATION``): the reservation-name key with one
      ``projects/P/zones/Z/reservations/N`` in the job's region; not on a ``cloud-tpu`` node (Vertex consumes
      reservations of CPU, GPU and TPU VMs; that a v2/v3 node has none is inferred, not stated).

    - a TensorBoard (``job_spec.tensorboard``, docs/run-page-research.md 2): named
      ``projects/P/locations/L/tensorboards/T``, in the job's region (Vertex takes a job's logs only into an
      instance of its region), with a ``service_account`` (the SDK: "service_account is required with provided
      tensorboard"); ``base_output_directory`` a gs:// prefix.

    Not checked, as no current source could be read: which GPUs each region offers for training; whether the
    TensorBoard exists when the job is created (the job service of a task's process holds no instances; the
    submission looks it up: ``fake_vertex_metadata.FakeTensorboardService``). Not modelled: multi-host v5e
    topologies (refused here; the service runs them, one container per host).
    """
    region = parent.rsplit("/", 1)[-1]
    pools = [pool for pool in job.job_spec.worker_pool_specs if pool.replica_count]
    if not pools:
        raise Refused("a custom job needs at least one worker pool with replicas")
    for pool in pools:
        _check_machine(pool.machine_spec)
    tpu = _tpu_type(pools[0].machine_spec)
    if tpu:
        if len(pools) > 1 or pools[0].replica_count != 1:
            raise Refused(f"a {tpu} job runs one replica in one worker pool")
        if region not in TPU_REGIONS[tpu]:
            raise Refused(f"{tpu} is not offered for training in {region}")
    strategy = job.job_spec.scheduling.strategy.name
    reserved = [pool for pool in pools if pool.machine_spec.reservation_affinity.reservation_affinity_type]
    if strategy == "FLEX_START":
        specs = {type(pool.machine_spec).to_json(pool.machine_spec) for pool in pools}
        if len(specs) > 1:
            raise Refused("FLEX_START needs the same machine configuration in every worker pool")
        if pools[0].machine_spec.accelerator_type.name not in FLEX_START_GPUS:
            raise Refused(
                f"FLEX_START takes L4, A100, H100, H200 or B200 GPUs, not {pools[0].machine_spec.machine_type}"
            )
        timeout = job.job_spec.scheduling.timeout
        if timeout and timeout.total_seconds() > MAX_TIMEOUT_SECONDS:
            raise Refused("FLEX_START needs a timeout of at most 7 days")
    if reserved and strategy in ("FLEX_START", "SPOT"):
        raise Refused(f"a {strategy} job cannot consume a reservation")
    _check_tensorboard(region, job.job_spec)
    for pool in reserved:
        affinity = pool.machine_spec.reservation_affinity
        if pool.machine_spec.machine_type == "cloud-tpu":
            raise Refused("a cloud-tpu machine cannot consume a Compute Engine reservation")
        if affinity.reservation_affinity_type.name != "SPECIFIC_RESERVATION":
            continue
        if affinity.key != RESERVATION_KEY or len(affinity.values) != 1:
            raise Refused(f"SPECIFIC_RESERVATION needs key {RESERVATION_KEY} and one reservation name")
        zone = affinity.values[0].split("/zones/")[-1].split("/")[0]
        if zone.rsplit("-", 1)[0] != region:
            raise Refused(f"reservation {affinity.values[0]} is not in region {region}")


def _check_tensorboard(region: str, spec) -> None:
    """``check_custom_job``'s TensorBoard rules."""
    output = spec.base_output_directory.output_uri_prefix
    if output and not output.startswith("gs://"):
        raise Refused(f"base_output_directory {output!r} must be a gs:// prefix")
    if not spec.tensorboard:
        return
    match = TENSORBOARD_NAME.match(spec.tensorboard)
    if not match:
        raise Refused(f"tensorboard {spec.tensorboard!r} is not projects/P/locations/L/tensorboards/T")
    if match["location"] != region:
        raise Refused(f"tensorboard {spec.tensorboard} is not in the job's region {region}")
    if not spec.service_account:
        raise Refused("service_account is required with tensorboard")


def _matches(job, term: str) -> bool:
    """One term of the API's list filter: ``labels.KEY=VALUE`` (VALUE quoted or not), ``labels.KEY:*``,
    ``state=STATE`` or ``state!=STATE``."""
    if term.startswith("labels."):
        key, sep, value = term[len("labels.") :].partition("=")
        if sep:
            return job.labels.get(key) == value.strip('"')
        key, sep, value = term[len("labels.") :].partition(":")
        if sep and value == "*":
            return key in job.labels
    for op, equal in (("!=", False), ("=", True)):
        name, sep, value = term.partition(op)
        if sep and name == "state":
            return (job.state.name == value.strip('"')) == equal
    raise Refused(f"unsupported filter term {term!r}")


def wrapper(record_dir: str, faults_file: str = "", in_images: ReplicaImages | None = None) -> list[str]:
    """The command to put in front of a container's command (``kfp_launcher.run_task(wrapper=...)``, which puts
    ``tests/`` on the container's PYTHONPATH); the job service's calls meet the schedule of ``faults_file``;
    with ``in_images``, the jobs' replicas run in their images."""
    schedule = ["--faults", faults_file] if faults_file else []
    images = ["--in-images", in_images.to_json()] if in_images else []
    return [sys.executable, "-m", "fake_vertex", "--record-dir", record_dir, *schedule, *images, "--"]


# The retry policy's waits in a task's process: the policy as written, its waits made short (the fake answers at
# once, where a service's outage lasts minutes), as polls are (``FAST_POLL_SECONDS``).
FAST_RETRY = {
    "CALL_TIMEOUT_SECONDS": 1.0,
    "CALL_INITIAL_SECONDS": 0.05,
    "CALL_MAXIMUM_SECONDS": 0.2,
    "FOLLOW_INITIAL_SECONDS": 0.05,
    "FOLLOW_MAXIMUM_SECONDS": 0.2,
    "REFUSAL_SECONDS": 2.0,
}


def fast_retries(setattr=setattr) -> None:
    """Makes ``cloud_retry``'s waits short (``FAST_RETRY``) and the follower's reads of a cancelled resource
    fast; ``setattr`` may be a monkeypatch's."""
    from effnet_common import cloud_retry, follower

    for name, value in FAST_RETRY.items():
        setattr(cloud_retry, name, value)
    setattr(follower, "CANCEL_POLL_SECONDS", FAST_POLL_SECONDS)


def install_in_process(monkeypatch, records: str, run_replicas: bool = True) -> None:
    """Vertex's job service faked in this process (its records in ``records``), with no faults, polls made
    fast; ``run_replicas=False``: a job succeeds once read, the calls being the subject."""
    from google.cloud.aiplatform import gapic

    from components import vertex_training

    monkeypatch.setattr(sys.modules[__name__], "_JOBS", {})
    monkeypatch.setattr(sys.modules[__name__], "_record_dir", records)
    monkeypatch.setattr(sys.modules[__name__], "FAULTS", None)
    monkeypatch.setattr(sys.modules[__name__], "RUN_REPLICAS", run_replicas)
    monkeypatch.setattr(gapic, "JobServiceClient", FakeJobServiceClient)
    monkeypatch.setattr(vertex_training, "POLL_SECONDS", 0.05)
    fast_retries(monkeypatch.setattr)


def output_environment(job_spec: dict) -> dict[str, str]:
    """What Vertex sets in every container of a job with a ``base_output_directory`` (``custom_job.proto``):
    ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR`` and ``AIP_TENSORBOARD_LOG_DIR`` under it."""
    base = (job_spec.get("base_output_directory") or {}).get("output_uri_prefix", "")
    if not base:
        return {}
    base = base.rstrip("/")
    return {
        "AIP_MODEL_DIR": f"{base}/model/",
        "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/",
    }


def replica_environments(job_spec: dict, pool_sizes: list[int]) -> dict[str, dict[str, str]]:
    """``CLUSTER_SPEC`` and ``TF_CONFIG`` of every replica, by its name ``workerpoolP-I``, as Vertex sets them:
    pool 0 (one replica) is TensorFlow's ``chief``, pool 1's replicas are ``worker`` 0, 1...; with a
    ``base_output_directory``, the ``AIP_*`` directories under it (``output_environment``)."""
    ports = iter(free_ports(sum(pool_sizes)))
    addresses = [[f"127.0.0.1:{next(ports)}" for _ in range(size)] for size in pool_sizes]
    cluster_spec = {f"workerpool{p}": pool for p, pool in enumerate(addresses)}
    tf_cluster = {"chief": addresses[0]}
    if len(addresses) > 1:
        tf_cluster["worker"] = addresses[1]
    environments = {}
    for p, pool in enumerate(addresses):
        for index in range(len(pool)):
            task = {"type": "chief" if p == 0 else "worker", "index": index}
            environments[f"workerpool{p}-{index}"] = {
                **output_environment(job_spec),
                "CLUSTER_SPEC": json.dumps(
                    {
                        "cluster": cluster_spec,
                        "environment": "cloud",
                        "task": {"type": f"workerpool{p}", "index": index},
                        "job": job_spec,
                    }
                ),
                "TF_CONFIG": json.dumps(
                    {"cluster": tf_cluster, "environment": "cloud", "task": task, "job": job_spec}
                ),
            }
    return environments


# A replica as Vertex runs it: its own process (a session of its own, so that it outlives the task that created
# its job, as a real job outlives its killed task), which writes its exit status where any process can read it.
_REPLICA = r"""
import os, signal, subprocess, sys
exit_file, argv = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(argv)
signal.signal(signal.SIGTERM, lambda *args: child.terminate())
code = child.wait()
with open(exit_file + ".tmp", "w") as f:
    f.write(str(code))
os.replace(exit_file + ".tmp", exit_file)
sys.exit(code)
"""
EXIT_FILE = "custom_job-{n}.{replica}.exit"
PIDS_FILE = "custom_job-{n}.pids.json"


class _Replica:
    """One replica process, started here (``process``) or by another task's process (``pid`` only)."""

    def __init__(self, exit_file: str, pid: int, process: subprocess.Popen | None = None):
        self.exit_file, self.pid, self.process = exit_file, pid, process

    def poll(self) -> int | None:
        if os.path.exists(self.exit_file):
            with open(self.exit_file) as f:
                return int(f.read())
        if self.process is not None:
            code = self.process.poll()
            return None if code is None else (code or -9)  # gone without its exit file: killed
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -9
        return None

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("replica", timeout)
            time.sleep(0.05)
        if self.process is not None:
            self.process.wait()


class _FakeJob:
    """A created job: its message (state updated as its replicas run) and the replica processes."""

    def __init__(self, job, number: int, replicas: dict[str, _Replica], logs: dict[str, str]):
        self.job = job
        self.number = number
        self.replicas = replicas
        self.logs = logs

    @property
    def cancelled(self) -> bool:
        return os.path.exists(os.path.join(_record_dir, CANCEL_FILE.format(n=self.number)))

    @classmethod
    def load(cls, number: int) -> _FakeJob:
        """A job another process created in the same record directory."""
        from google.cloud import aiplatform_v1

        with open(os.path.join(_record_dir, RECORD_FILE.format(n=number))) as f:
            record = json.load(f)
        job = aiplatform_v1.CustomJob(record["custom_job"])
        job.name = f"{record['parent']}/customJobs/{number}"
        job.create_time = _created(number)
        with open(os.path.join(_record_dir, PIDS_FILE.format(n=number))) as f:
            pids = json.load(f)
        replicas = {
            name: _Replica(os.path.join(_record_dir, EXIT_FILE.format(n=number, replica=name)), pid)
            for name, pid in pids.items()
        }
        logs = {name: os.path.join(_record_dir, LOG_FILE.format(n=number, replica=name)) for name in pids}
        return cls(job, number, replicas, logs)

    def refresh(self):
        from google.cloud import aiplatform_v1

        states = aiplatform_v1.JobState
        self._set_times()
        if self.cancelled:
            self.job.state = states.JOB_STATE_CANCELLED
            return self.job
        codes = {name: replica.poll() for name, replica in self.replicas.items()}
        failed = {name: code for name, code in codes.items() if code not in (None, 0)}
        if failed:
            name, code = sorted(failed.items())[0]
            self.stop()
            self.job.state = states.JOB_STATE_FAILED
            self.job.error.code = 13  # INTERNAL
            self.job.error.message = (
                f"The replica {name} exited with a non-zero status of {code} (log: {self.logs[name]})."
            )
        elif all(code == 0 for code in codes.values()):
            self.job.state = states.JOB_STATE_SUCCEEDED
        else:
            self.job.state = states.JOB_STATE_RUNNING
        return self.job

    def _set_times(self) -> None:
        """The job's ``start_time`` (Vertex: when it first entered RUNNING; here its replicas start as it is
        created, when their pids are written) and ``end_time`` (when it entered an end state: its last
        replica's exit, or its cancellation), read from the record directory, so in any process alike."""
        pids = os.path.join(_record_dir, PIDS_FILE.format(n=self.number))
        if self.replicas and os.path.exists(pids):
            self.job.start_time = _file_time(pids)
        ends = [os.path.join(_record_dir, CANCEL_FILE.format(n=self.number))]
        if not self.cancelled:
            ends = [replica.exit_file for replica in self.replicas.values()]
        if ends and all(os.path.exists(path) for path in ends):
            self.job.end_time = max(_file_time(path) for path in ends)

    def stop(self) -> None:
        for replica in self.replicas.values():
            if replica.poll() is None:
                replica.send_signal(signal.SIGTERM)
        for replica in self.replicas.values():
            try:
                replica.wait(timeout=30)
            except subprocess.TimeoutExpired:
                replica.send_signal(signal.SIGKILL)


def _created(number: int):
    """When job ``number`` was created: when its record was written."""
    return _file_time(os.path.join(_record_dir, RECORD_FILE.format(n=number)))


def _file_time(path: str) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)


def _numbers() -> list[int]:
    """The jobs recorded in the record directory (by any process), in order."""
    names = os.listdir(_record_dir) if _record_dir and os.path.isdir(_record_dir) else []
    found = (re.fullmatch(r"custom_job-(\d+)\.json", name) for name in names)
    return sorted(int(match.group(1)) for match in found if match)


def _job(name: str) -> _FakeJob:
    """The job ``name``, created by this process or by another one sharing the record directory."""
    from google.api_core import exceptions

    if name not in _JOBS:
        number = name.rsplit("/", 1)[-1]
        if not number.isdigit() or int(number) not in _numbers():
            raise exceptions.NotFound(f"CustomJob {name} not found")
        _JOBS[name] = _FakeJob.load(int(number))
    return _JOBS[name]


@dataclasses.dataclass(frozen=True)
class ReplicaImages:
    """Runs each replica in its pool's image with a real Docker daemon, as Vertex does (``--in-images``): the
    task's container reaches the daemon through its socket, mounted with a docker client at the same paths.
    Replicas get the host's network, the run's directories at the same paths (``shared``), the suite's
    environment (``env``) and Vertex's variables; each is labelled with the record directory (``stop_all``)."""

    docker: str
    shared: tuple[str, ...]
    env: dict

    def argv(self, image: str, command: list[str], replica_env: dict) -> list[str]:
        mounts = [arg for path in self.shared for arg in ("-v", f"{path}:{path}")]
        variables = [arg for item in {**self.env, **replica_env}.items() for arg in ("-e", "=".join(item))]
        return [
            self.docker, "run", "--rm", "--network", "host", "--label", f"{DOCKER_LABEL}={_record_dir}",
            *mounts, *variables, "--entrypoint", command[0], image, *command[1:],
        ]  # fmt: skip

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


DOCKER_LABEL = "effnet.fake-vertex"
# Set by ``--in-images``: replicas run in their images (``ReplicaImages``), not in this interpreter.
IN_IMAGES: ReplicaImages | None = None


def stop_all(record_dir: str) -> None:
    """Stops every replica still running of the jobs recorded in ``record_dir`` (whatever process started it)."""
    import shutil

    docker = shutil.which("docker")
    if docker:  # replicas run in their images: the containers go with them
        found = subprocess.run(
            [docker, "ps", "-aq", "--filter", f"label={DOCKER_LABEL}={record_dir}"],
            capture_output=True,
            text=True,
        )
        if found.stdout.split():
            subprocess.run([docker, "rm", "--force", *found.stdout.split()], capture_output=True)
    for pids_file in sorted(pathlib.Path(record_dir).glob("custom_job-*.pids.json")):
        for name, pid in json.loads(pids_file.read_text()).items():
            exit_file = str(pids_file).replace(".pids.json", f".{name}.exit")
            replica = _Replica(exit_file, pid)
            if replica.poll() is None:
                replica.send_signal(signal.SIGKILL)


class FakeJobServiceClient:
    """The calls of ``google.cloud.aiplatform_v1.JobServiceClient`` that a Vertex training task makes.

    Each call is a GAPIC method (``faults.gapic_method``): the caller's ``retry=`` and ``timeout=`` apply as they do
    to the real client, and each attempt first meets the next fault ``FAULTS`` schedules for it.
    """

    def __init__(self, client_options=None, **kwargs):
        options = client_options or {}
        self.api_endpoint = options.get("api_endpoint") if isinstance(options, dict) else options.api_endpoint

    @staticmethod
    def _call(call: str, serve, *args, **kwargs):
        return faults.gapic_method(lambda: FAULTS, call, serve)(*args, **kwargs)

    def create_custom_job(self, *args, **kwargs):
        return self._call("create_custom_job", self._create_custom_job, *args, **kwargs)

    def get_custom_job(self, *args, **kwargs):
        return self._call("get_custom_job", self._get_custom_job, *args, **kwargs)

    def list_custom_jobs(self, *args, **kwargs):
        return self._call("list_custom_jobs", self._list_custom_jobs, *args, **kwargs)

    def cancel_custom_job(self, *args, **kwargs):
        return self._call("cancel_custom_job", self._cancel_custom_job, *args, **kwargs)

    def _create_custom_job(self, parent: str, custom_job, **kwargs):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        # The API's own message: an unknown field fails here, as it would in Vertex.
        job = aiplatform_v1.CustomJob(custom_job)
        try:
            check_custom_job(parent, job)
        except Refused as refusal:
            raise exceptions.InvalidArgument(str(refusal)) from None
        number = max(_numbers(), default=0) + 1
        request = custom_job if isinstance(custom_job, dict) else aiplatform_v1.CustomJob.to_dict(job)
        record = {"parent": parent, "api_endpoint": self.api_endpoint, "custom_job": request}
        with open(os.path.join(_record_dir, RECORD_FILE.format(n=number)), "w") as f:
            json.dump(record, f, indent=1)

        pools = job.job_spec.worker_pool_specs
        environments = replica_environments(request["job_spec"], [pool.replica_count for pool in pools])
        replicas, logs = {}, {}
        for p, pool in enumerate(pools if RUN_REPLICAS else ()):
            for index in range(pool.replica_count):
                name = f"workerpool{p}-{index}"
                argv = [*pool.container_spec.command, *pool.container_spec.args]
                if IN_IMAGES is not None:
                    argv = IN_IMAGES.argv(pool.container_spec.image_uri, argv, environments[name])
                elif argv[0] == "python":
                    argv[0] = sys.executable
                logs[name] = os.path.join(_record_dir, LOG_FILE.format(n=number, replica=name))
                exit_file = os.path.join(_record_dir, EXIT_FILE.format(n=number, replica=name))
                with open(logs[name], "wb") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-c", _REPLICA, exit_file, *argv],
                        env={**os.environ, **environments[name]},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                replicas[name] = _Replica(exit_file, process.pid, process)
        with open(os.path.join(_record_dir, PIDS_FILE.format(n=number)), "w") as f:
            json.dump({name: replica.pid for name, replica in replicas.items()}, f)
        job.name = f"{parent}/customJobs/{number}"
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING
        job.create_time = _created(number)
        _JOBS[job.name] = _FakeJob(job, number, replicas, logs)
        return aiplatform_v1.CustomJob(job)

    def _get_custom_job(self, name: str, **kwargs):
        from google.cloud import aiplatform_v1

        return aiplatform_v1.CustomJob(_job(name).refresh())

    def _list_custom_jobs(self, request=None, *, parent: str | None = None, **kwargs) -> list:
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        request = aiplatform_v1.ListCustomJobsRequest(request or {"parent": parent})
        terms = [term.strip() for term in request.filter.split(" AND ")] if request.filter else []
        names = [f"{parent_of(n)}/customJobs/{n}" for n in _numbers()]
        jobs = [_job(name).refresh() for name in names if name.startswith(f"{request.parent}/")]
        try:
            return [
                aiplatform_v1.CustomJob(job) for job in jobs if all(_matches(job, term) for term in terms)
            ]
        except Refused as refusal:
            raise exceptions.InvalidArgument(str(refusal)) from None

    def _cancel_custom_job(self, name: str, **kwargs) -> None:
        fake = _job(name)
        running = [n for n, replica in fake.replicas.items() if replica.poll() is None]
        with open(os.path.join(_record_dir, CANCEL_FILE.format(n=fake.number)), "w") as f:
            json.dump({"name": name, "running": running}, f)
        fake.stop()


def parent_of(number: int) -> str:
    with open(os.path.join(_record_dir, RECORD_FILE.format(n=number))) as f:
        return json.load(f)["parent"]


# Vertex AI Pipelines' rules for a PipelineJob's labels (``aiplatform_v1.PipelineJob.labels``, which points to
# Google Cloud's label rules): keys and values of lowercase letters (international ones too), digits, "_" and
# "-"; a key starts with a letter; at most 64 labels. The length is stricter in the labels page (63 characters)
# than in the API reference (64): the fake takes 63. The key below is the service's own: whatever a caller sets,
# the service writes its value.
LABEL_MAX_CHARS = 63
MAX_LABELS = 64
BILLING_LABEL = "vertex-ai-pipelines-run-billing-id"


def label_error(key: str, value: str) -> str | None:
    """What is wrong with one label under Google Cloud's rules, or None."""

    def allowed(ch: str) -> bool:
        return ch in "_-" or ch.isdigit() or (ch.isalpha() and not ch.isupper())

    if not key or len(key) > LABEL_MAX_CHARS or not (key[0].isalpha() and not key[0].isupper()):
        return (
            f"label key {key!r} must be 1 to {LABEL_MAX_CHARS} characters and start with a lowercase letter"
        )
    if len(value) > LABEL_MAX_CHARS:
        return f"label value {value!r} of {key!r} is longer than {LABEL_MAX_CHARS} characters"
    for text in (key, value):
        if not all(allowed(ch) for ch in text):
            return f"label {key}={value!r}: only lowercase letters, digits, '_' and '-' are allowed"
    return None


class FakePipelineService:
    """Vertex AI Pipelines' PipelineService in this process: records created jobs, plays scripted states.

    ``states``: the states ``get_pipeline_job`` returns, in turn (the last one repeats), e.g.
    ``["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"]``.

    ``create_pipeline_job`` refuses, as the service does, before creating anything (``refused`` records each):

    - labels that break Google Cloud's label rules (``label_error``; at most ``MAX_LABELS``), INVALID_ARGUMENT.
      The service's wording is not confirmed: the fake names the label and the rule.
    - a ``service_account`` the caller may not act as (the service checks ``iam.serviceAccounts.actAs`` of the
      caller on it; ``act_as``: the accounts that exist and the caller may act as): INVALID_ARGUMENT "You do not
      have permission to act as service_account: X. (or it may not exist).", as reported from the service
      (googleapis/python-aiplatform#1073). Without one the job runs as the project's Compute Engine default
      account, which the fake does not check.

    A created job carries the labels it was sent, with the service's own ``BILLING_LABEL`` set by the service. A
    job's id is unique in its location: a second create of the same id is ``ALREADY_EXISTS``. Both calls are GAPIC
    methods (``faults.gapic_method``): the SDK's ``retry=`` applies, and each attempt meets ``faults`` first.

    The run's metadata context (``job_detail.pipeline_run_context``, schema ``system.PipelineRun``, named after the
    job's id in the location's ``default`` metadata store) is made asynchronously, as the run starts: a read of the
    job carries it from the ``run_context_after``-th read on. With ``metadata`` (a
    ``fake_vertex_metadata.FakeMetadataService``), the context is made in that store, with the run's parameters as
    Vertex records them (``input:NAME``).
    """

    def __init__(
        self,
        states=("PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"),
        act_as=(),
        metadata=None,
        run_context_after: int = 1,
    ):
        self.states = list(states)
        self.act_as = tuple(act_as)
        self.metadata = metadata
        self.run_context_after = run_context_after
        self.reads: dict[str, int] = {}  # reads of each job, by name
        self.created: list = []  # (parent, PipelineJob message, job id) as sent
        self.refused: list[str] = []
        self.gets = 0
        self.jobs: dict = {}  # by name, as created
        self.faults: faults.FaultSchedule | None = None  # what the calls meet (tests/faults.py)

    def check(self, message) -> None:
        """The service's checks of a PipelineJob before it is created; raises ``InvalidArgument``."""
        from google.api_core import exceptions

        errors = [error for key, value in message.labels.items() if (error := label_error(key, value))]
        if len(message.labels) > MAX_LABELS:
            errors.append(f"{len(message.labels)} labels: at most {MAX_LABELS} are allowed")
        if message.service_account and message.service_account not in self.act_as:
            errors.append(
                f"You do not have permission to act as service_account: {message.service_account}. "
                "(or it may not exist)."
            )
        if errors:
            self.refused.append("; ".join(errors))
            raise exceptions.InvalidArgument("; ".join(errors))

    def start_run(self, job) -> None:
        """What Vertex does as the run starts: its ``system.PipelineRun`` context, in the job's record (and in
        ``metadata``'s store, with the run's parameters)."""
        from google.cloud import aiplatform_v1

        parent, job_id = job.name.split("/pipelineJobs/")
        context = aiplatform_v1.Context(
            name=f"{parent}/metadataStores/default/contexts/{job_id}",
            display_name=job_id,
            schema_title="system.PipelineRun",
            schema_version="0.0.1",
        )
        if self.metadata is not None:
            parameters = dict(job.runtime_config.parameter_values)
            context = self.metadata.start_run(context, {f"input:{k}": v for k, v in parameters.items()})
        job.job_detail.pipeline_run_context = context

    def install(self, monkeypatch) -> FakePipelineService:
        from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient

        fake = self

        def create(parent=None, pipeline_job=None, pipeline_job_id=None, **kwargs):
            from google.api_core import exceptions
            from google.cloud import aiplatform_v1

            message = aiplatform_v1.PipelineJob(pipeline_job)  # the API's own message
            fake.check(message)
            name = f"{parent}/pipelineJobs/{pipeline_job_id or 'effnet-run-1'}"
            if name in fake.jobs:  # a job's id is unique in its location
                raise exceptions.AlreadyExists(f"PipelineJob {name} already exists")
            fake.created.append((parent, message, pipeline_job_id))
            created = aiplatform_v1.PipelineJob(message)
            created.name = name
            created.state = aiplatform_v1.PipelineState.PIPELINE_STATE_PENDING
            created.labels[BILLING_LABEL] = str(len(fake.created))
            fake.jobs[name] = created
            return aiplatform_v1.PipelineJob(created)

        def get(name=None, **kwargs):
            from google.api_core import exceptions
            from google.cloud import aiplatform_v1

            if name not in fake.jobs:
                raise exceptions.NotFound(f"PipelineJob {name} not found")
            state = fake.states[min(fake.gets, len(fake.states) - 1)]
            fake.gets += 1
            fake.reads[name] = fake.reads.get(name, 0) + 1
            if (
                fake.reads[name] >= fake.run_context_after
                and not fake.jobs[name].job_detail.pipeline_run_context
            ):
                fake.start_run(fake.jobs[name])
            job = aiplatform_v1.PipelineJob(fake.jobs[name])
            job.state = aiplatform_v1.PipelineState[state]
            return job

        def create_pipeline_job(client, *args, **kwargs):
            return faults.gapic_method(lambda: fake.faults, "create_pipeline_job", create)(*args, **kwargs)

        def get_pipeline_job(client, *args, **kwargs):
            return faults.gapic_method(lambda: fake.faults, "get_pipeline_job", get)(*args, **kwargs)

        monkeypatch.setattr(PipelineServiceClient, "create_pipeline_job", create_pipeline_job)
        monkeypatch.setattr(PipelineServiceClient, "get_pipeline_job", get_pipeline_job)
        return self


class FakeProjectJobs:
    """The custom jobs of a project as Vertex AI's ``JobService`` lists, gets and cancels them; the jobs are the
    ``CustomJob`` messages (as dicts) in the JSON file ``path``, read and written back on every call.

    Rules, from the v1 reference of ``ListCustomJobs``, ``GetCustomJob`` and ``CancelCustomJob``:

    - Resource names carry the project number (``projects/NUMBER/locations/L/customJobs/ID``), as the service
      returns them; a request may name the project by its id or its number (``numbers``: id -> number).
    - A location's jobs are served by its regional endpoint (``L-aiplatform.googleapis.com``): a request for
      another location's jobs is refused (INVALID_ARGUMENT), as a client built for one region cannot reach
      another's.
    - list: the jobs of ``parent`` only. ``filter`` is "the standard list filter"; the fake holds the part a
      clean-up needs and refuses the rest (INVALID_ARGUMENT) rather than guess it: terms joined by ``AND``, each
      ``labels.KEY=VALUE`` (key and value equality; the value quoted or not), ``labels.KEY:*`` (key existence),
      ``state=S`` / ``state!=S``, ``display_name=NAME``. Pages: ``page_size`` jobs at most, and at most
      ``PAGE_LIMIT`` (the service's default page size is not documented; small here, so that a client that
      stops at the first page misses jobs); ``next_page_token`` is empty on the last page. A client gets pages
      through the SDK's own pager (``ListCustomJobsPager``), as from the real client.
    - get: the job, ``NOT_FOUND`` for a name the project does not have.
    - cancel: "starts asynchronous cancellation": the job is ``JOB_STATE_CANCELLING``, then, at the next read,
      ``JOB_STATE_CANCELLED`` with ``error.code`` 1 (``CANCELLED``). Cancelling a job that has ended
      (succeeded, failed, cancelled, expired) is refused with ``FAILED_PRECONDITION``: not documented, the
      fake's assumption (what Google's services answer for an operation on a resource in the wrong state).
    """

    PAGE_LIMIT = 2
    ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
    _TERM = re.compile(
        r'^(?:labels\.(?P<key>[a-z][a-z0-9_-]*)(?:(?P<exists>:\*)|=(?P<value>"[^"]*"|[a-z0-9_-]+))'
        r'|(?P<field>state|display_name)(?P<op>!?=)(?P<text>"[^"]*"|[A-Za-z0-9_-]+))$'
    )

    def __init__(self, path: str, numbers: dict[str, str]):
        self.path = path
        self.numbers = numbers

    # The test's side.

    def write(self, jobs: list[dict]) -> None:
        with open(self.path, "w") as f:
            json.dump({"numbers": self.numbers, "jobs": jobs}, f, indent=1)

    def read(self) -> list[dict]:
        with open(self.path) as f:
            return json.load(f)["jobs"]

    @classmethod
    def load(cls, path: str) -> FakeProjectJobs:
        with open(path) as f:
            return cls(path, json.load(f)["numbers"])

    def client_class(self):
        """A ``JobServiceClient`` stand-in serving these jobs (constructed as the real one is)."""
        fake = self

        class Client:
            def __init__(self, client_options=None, **kwargs):
                options = client_options or {}
                self.endpoint = (
                    options.get("api_endpoint") if isinstance(options, dict) else options.api_endpoint
                )

            def _check_endpoint(self, name: str) -> None:
                from google.api_core import exceptions

                location = name.split("/locations/", 1)[1].split("/", 1)[0]
                if self.endpoint and self.endpoint != f"{location}-aiplatform.googleapis.com":
                    raise exceptions.InvalidArgument(f"{name} is not served by the endpoint {self.endpoint}")

            @staticmethod
            def _method(name: str, serve):
                return faults.gapic_method(lambda: FAULTS, name, serve)

            def list_custom_jobs(self, request=None, retry=None, timeout=None, **kwargs):
                from google.cloud import aiplatform_v1
                from google.cloud.aiplatform_v1.services.job_service import pagers

                request = aiplatform_v1.ListCustomJobsRequest(request)  # the API's own message
                self._check_endpoint(request.parent)
                method = self._method("list_custom_jobs", fake.list_page)
                return pagers.ListCustomJobsPager(
                    method=method,
                    request=request,
                    response=method(request, retry=retry, timeout=timeout),
                    retry=retry,
                    timeout=timeout,
                )

            def get_custom_job(self, name=None, **kwargs):
                self._check_endpoint(name)
                return self._method("get_custom_job", fake.get)(name, **kwargs)

            def cancel_custom_job(self, name=None, **kwargs):
                self._check_endpoint(name)
                return self._method("cancel_custom_job", fake.cancel)(name, **kwargs)

        return Client

    # The service.

    def _canonical(self, name: str) -> str:
        parts = name.split("/")
        if len(parts) > 1 and parts[0] == "projects":
            parts[1] = self.numbers.get(parts[1], parts[1])
        return "/".join(parts)

    def _jobs(self) -> list[dict]:
        jobs = self.read()
        for job in jobs:  # what happened since the last read: a cancelling job stopped
            if job["state"] == "JOB_STATE_CANCELLING":
                job["state"] = "JOB_STATE_CANCELLED"
                job["error"] = {"code": 1, "message": "CANCELED"}
        self.write(jobs)
        return jobs

    def _matches(self, job: dict, filter_text: str) -> bool:
        from google.api_core import exceptions

        if not filter_text.strip():
            return True
        for term in re.split(r"\s+AND\s+", filter_text.strip()):
            match = self._TERM.match(term.strip())
            if not match:
                raise exceptions.InvalidArgument(f"filter term the fake does not implement: {term!r}")
            if match["key"]:
                labels = job.get("labels", {})
                if match["exists"]:
                    ok = match["key"] in labels
                else:
                    ok = labels.get(match["key"]) == match["value"].strip('"')
            else:
                value = job.get(match["field"], "")
                ok = (value == match["text"].strip('"')) == (match["op"] == "=")
            if not ok:
                return False
        return True

    def list_page(self, request, **kwargs):
        from google.cloud import aiplatform_v1

        parent = self._canonical(request.parent)
        jobs = [
            job
            for job in self._jobs()
            if job["name"].rsplit("/customJobs/", 1)[0] == parent and self._matches(job, request.filter)
        ]
        start = int(request.page_token or 0)
        size = min(request.page_size or self.PAGE_LIMIT, self.PAGE_LIMIT)
        page = jobs[start : start + size]
        token = str(start + size) if start + size < len(jobs) else ""
        return aiplatform_v1.ListCustomJobsResponse(
            custom_jobs=[aiplatform_v1.CustomJob(job) for job in page], next_page_token=token
        )

    def get(self, name: str, **kwargs):
        from google.api_core import exceptions
        from google.cloud import aiplatform_v1

        name = self._canonical(name)
        for job in self._jobs():
            if job["name"] == name:
                return aiplatform_v1.CustomJob(job)
        raise exceptions.NotFound(f"CustomJob {name} not found")

    def cancel(self, name: str, **kwargs) -> None:
        from google.api_core import exceptions

        name = self._canonical(name)
        jobs = self.read()
        for job in jobs:
            if job["name"] == name:
                if job["state"] in self.ENDED:
                    raise exceptions.FailedPrecondition(f"CustomJob {name} has ended ({job['state']})")
                job["state"] = "JOB_STATE_CANCELLING"
                self.write(jobs)
                return
        raise exceptions.NotFound(f"CustomJob {name} not found")


def project_jobs_wrapper(record_dir: str, jobs_file: str, faults_file: str = "") -> list[str]:
    """``wrapper``, the task's ``JobServiceClient`` serving the project's jobs of ``jobs_file``
    (``FakeProjectJobs``)."""
    return [*wrapper(record_dir, faults_file)[:-1], "--project-jobs", jobs_file, "--"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fake_vertex", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record-dir", required=True, help="where the CustomJob requests and logs go")
    parser.add_argument(
        "--project-jobs", default="", help="serve the custom jobs of this file (FakeProjectJobs)"
    )
    parser.add_argument(
        "--faults", default="", help="a fault schedule for the job service's calls (faults.py)"
    )
    parser.add_argument(
        "--in-images", default="", help="run the replicas in their images (ReplicaImages JSON)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python -m MODULE ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 3 or command[1] != "-m":
        raise SystemExit(f"expected a container command 'python -m MODULE ...', got {command[:3]}")
    global _record_dir, FAULTS, IN_IMAGES
    if args.in_images:
        IN_IMAGES = ReplicaImages(**json.loads(args.in_images))
    _record_dir = args.record_dir
    os.makedirs(_record_dir, exist_ok=True)
    if args.faults:
        FAULTS = faults.FaultSchedule.load(args.faults)

    from google.cloud.aiplatform import gapic

    from components import vertex_training

    gapic.JobServiceClient = FakeJobServiceClient
    if args.project_jobs:
        gapic.JobServiceClient = FakeProjectJobs.load(args.project_jobs).client_class()
    vertex_training.POLL_SECONDS = FAST_POLL_SECONDS
    fast_retries()
    sys.argv = [command[2], *command[3:]]
    runpy.run_module(command[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
