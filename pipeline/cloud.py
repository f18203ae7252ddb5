"""Where and on what a compiled pipeline runs in Google Cloud: ``CloudSettings``.

One frozen object holds the project, region, images, pipeline root, identity and network, the accelerator of
the training job and how it is provisioned, and the Dataflow workers of each Beam step. It is checked when it
is built (each problem one line naming the flag), and it builds what the compiled pipeline carries: the
Dataflow options of each Beam step, the Vertex custom job of the Trainer (worker pools, scheduling with a
timeout from the run's estimate and the provisioning its machine can have, labels, display name, the Vertex AI
TensorBoard it streams its logs to) and the labels of the jobs.
"""

from __future__ import annotations

import dataclasses
import re

from components.run_label import label_value
from effnet_common.cloud_retry import OUTAGE_HOURS
from effnet_common.registry import Registry

DEFAULT_REGION = "us-central1"
# A Vertex network: projects/{project number}/global/networks/{name} (VPC peering with Vertex AI).
_NETWORK = re.compile(r"^projects/[^/]+/global/networks/(?P<name>[^/]+)$")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_RESERVATION = re.compile(r"^projects/[^/]+/zones/[^/]+/reservations/[^/]+$")
# A Vertex AI TensorBoard instance (``CustomJobSpec.tensorboard``).
TENSORBOARD_NAME = re.compile(r"^projects/[^/]+/locations/(?P<location>[^/]+)/tensorboards/[^/]+$")
# Under the pipeline root: the TensorBoard logs of the training and tuning jobs, by pipeline, step and run
# (``_job_args``; the step adds the run: ``components.vertex_training.job_request``).
TENSORBOARD_DIR = "tensorboard"
PIPELINE_LABEL = "effnet-pipeline"
PRESET_LABEL = "effnet-preset"

# How the training job's machines are obtained (``--provisioning``): each name builds the job's
# ``scheduling`` entries for a machine (``accelerators.Accelerator``) and a flex-start wait, and refuses a
# machine the service would refuse. Spot and flex-start machines cost less; Spot ones can be reclaimed (the
# job restarts on new machines and the trainer resumes from its last checkpoint), flex-start ones are queued
# until capacity frees up, for at most the wait asked (``max_wait_duration``; 0 waits indefinitely).
PROVISIONING = Registry("--provisioning")
# Flex-start's wait for machines when none is given: a day, the service's own default, written into the job.
# Queued time is not billed, and the sharded data waits for the machines.
DEFAULT_MAX_WAIT_HOURS = 24.0


@PROVISIONING.register("standard")
def _standard(machine, max_wait_seconds: int) -> dict:
    return {}


@PROVISIONING.register("spot")
def _spot(machine, max_wait_seconds: int) -> dict:
    return {"strategy": "SPOT"}


@PROVISIONING.register("flex-start")
def _flex_start(machine, max_wait_seconds: int) -> dict:
    if not machine.offers_flex_start:
        what = {"tpu": "a TPU", "cpu": "a CPU machine"}.get(machine.kind, f"{machine.accelerator_type} GPUs")
        raise ValueError(
            f"--provisioning flex-start: Vertex's Dynamic Workload Scheduler takes only L4, A100, H100, H200 "
            f"and B200 GPUs, and --accelerator {machine.name} is {what}; use --provisioning standard or spot"
        )
    return {"strategy": "FLEX_START", "max_wait_duration": f"{max_wait_seconds}s"}


@dataclasses.dataclass(frozen=True)
class DataflowWorkers:
    """The Dataflow workers of one Beam step: machine type, boot disk and the autoscaling limit."""

    machine_type: str
    disk_gb: int
    max_workers: int

    def check(self, flag_prefix: str) -> None:
        if self.disk_gb < 0 or self.max_workers < 1:
            raise ValueError(f"{flag_prefix}-disk-gb must be >= 0 and {flag_prefix}-max-workers >= 1")

    def args(self) -> list[str]:
        return [
            f"--worker_machine_type={self.machine_type}",
            f"--disk_size_gb={self.disk_gb}",
            f"--max_num_workers={self.max_workers}",
        ]


# Sharding: 4 vCPUs decode and check JPEGs; the spill goes to GCS, so the disk holds the image and Beam's
# staging only. Evaluation: TFMA runs the exported EfficientNet in every SDK worker process (one per vCPU), so
# its workers need memory: 8 vCPUs with 52 GB.
SHARDING_WORKERS = DataflowWorkers("n1-standard-4", 50, 100)
EVALUATOR_WORKERS = DataflowWorkers("n1-highmem-8", 50, 20)


@dataclasses.dataclass(frozen=True)
class CloudSettings:
    """Where and on what the pipeline runs in the cloud.

    Attributes:
      project / region: the Google Cloud project and region of Vertex AI and Dataflow.
      image: the pipeline image (Dockerfile target ``pipeline``) for every step and the Dataflow workers.
      pipeline_root: gs:// root of the pipeline's artifacts.
      trainer_image: the training job's image (``trainer-tpu`` or ``trainer-gpu``); '' uses ``image``.
      accelerator: the ``--accelerator`` name; ``machines``: how many of it (GPU machines only).
      service_account: runs the pipeline job, the training job and the Dataflow workers ('' = defaults).
      network: ``projects/NUMBER/global/networks/NAME`` peered with Vertex AI, for the pipeline and training
        jobs; Dataflow workers join the network NAME (and ``subnetwork`` when given).
      subnetwork: Dataflow's ``regions/REGION/subnetworks/NAME`` (or a full URL).
      sharding_workers / evaluator_workers: the Dataflow workers of the sharding step and of the Evaluator.
      provisioning: how the training job's machines are obtained (``PROVISIONING``).
      max_wait_hours: with flex-start, how long the job waits for its machines (None:
        ``DEFAULT_MAX_WAIT_HOURS``; 0 waits indefinitely).
      reservation: ``projects/P/zones/Z/reservations/NAME`` the training machines are taken from ('' = none).
      training_timeout_hours: the upper bound of the training job's timeout (0: Vertex's 7 days). The timeout
        is three times the estimate of the run that is actually run (at least 2 hours;
        ``accelerators.job_timeout``), set by the training step from the run's epochs and data.
      checkpoint_root: gs:// directory where the training job keeps its checkpoints, under a directory of the
        run's resolved settings, so that a re-run with the same settings resumes ('' = in the run's own
        artifact: every run starts from zero).
      check_region: refuse a region where the accelerator is not known to be offered.
      enable_cache: let Vertex reuse a step whose inputs, parameters and image are unchanged.
      api_outage_hours: how long a step following its job (and ``--wait``) waits out an outage of the job's
        API (``effnet_common.cloud_retry``); compiled into the steps' arguments when it is not the default.
      zone: a TPU VM slice's zone ('' = the first zone of ``region`` that offers it:
        ``components.tpu_slices``).
      max_recreations: how many times a preempted or lost TPU VM slice is created again.
      tensorboard: ``projects/P/locations/REGION/tensorboards/ID``, a Vertex AI TensorBoard instance the
        training and tuning jobs stream their logs to ('' = none). Vertex requires a service account with it,
        and takes logs only from jobs of the instance's region; each job also gets a ``base_output_directory``
        under the pipeline root (``TENSORBOARD_DIR``), where Vertex points ``AIP_TENSORBOARD_LOG_DIR``.
    """

    project: str
    region: str
    image: str
    pipeline_root: str
    trainer_image: str = ""
    accelerator: str = "tpu-v3-8"
    machines: int = 1
    service_account: str = ""
    network: str = ""
    subnetwork: str = ""
    sharding_workers: DataflowWorkers = SHARDING_WORKERS
    evaluator_workers: DataflowWorkers = EVALUATOR_WORKERS
    provisioning: str = "standard"
    max_wait_hours: float | None = None
    reservation: str = ""
    training_timeout_hours: float = 0.0
    checkpoint_root: str = ""
    check_region: bool = True
    enable_cache: bool = True
    api_outage_hours: float = OUTAGE_HOURS
    zone: str = ""
    max_recreations: int = 2
    tensorboard: str = ""

    def __post_init__(self):
        if not self.pipeline_root.startswith("gs://"):
            raise ValueError(
                f"--pipeline-root {self.pipeline_root!r} must be a gs:// path on Vertex / Kubeflow"
            )
        for name in ("project", "region", "image"):
            if not getattr(self, name):
                raise ValueError(f"--{name} is required to compile for the cloud")
        if self.network and not _NETWORK.match(self.network):
            raise ValueError(
                f"--network {self.network!r} must be projects/PROJECT_NUMBER/global/networks/NAME"
            )
        self.sharding_workers.check("--dataflow")
        self.evaluator_workers.check("--evaluator")
        PROVISIONING.check(self.provisioning)
        if self.reservation and not _RESERVATION.match(self.reservation):
            raise ValueError(
                f"--reservation {self.reservation!r} must be projects/PROJECT/zones/ZONE/reservations/NAME"
            )
        if self.reservation and self.provisioning != "standard":
            raise ValueError(
                f"--reservation takes reserved machines; --provisioning {self.provisioning} asks for others"
            )
        if self.api_outage_hours <= 0:
            raise ValueError(f"--api-outage-hours {self.api_outage_hours} must be > 0")
        if self.training_timeout_hours < 0:
            raise ValueError(f"--training-timeout-hours {self.training_timeout_hours} must be >= 0")
        slice_type = self.machine.slice_type
        if self.max_wait_hours is not None and self.provisioning != "flex-start" and slice_type is None:
            raise ValueError(
                f"--max-wait-hours is flex-start's wait for machines; "
                f"--provisioning {self.provisioning} does not wait"
            )
        if self.zone and slice_type is None:
            raise ValueError(
                f"--zone is a TPU VM slice's zone; {self.accelerator} runs on Vertex AI in --region"
            )
        if self.max_recreations < 0:
            raise ValueError(f"--max-recreations {self.max_recreations} must be >= 0")
        if self.max_wait_hours is not None and self.max_wait_hours < 0:
            raise ValueError(f"--max-wait-hours {self.max_wait_hours} must be >= 0 (0 waits indefinitely)")
        for flag, image in (("--image", self.image), ("--trainer-image", self.trainer_image)):
            if "@" in image and not _DIGEST.search(image):
                raise ValueError(
                    f"{flag} {image}: {image.partition('@')[2]!r} is not an image digest (sha256: and 64 hex "
                    "digits): give the one 'docker inspect' prints, or a tag"
                )
        if self.checkpoint_root and not self.checkpoint_root.startswith("gs://"):
            raise ValueError(f"--checkpoint-root {self.checkpoint_root!r} must be a gs:// path")
        machine = self.machine  # an unknown accelerator fails here
        PROVISIONING.build(self.provisioning, machine, self.max_wait_seconds)  # one it cannot have fails here
        zone = self.reservation.split("/zones/")[-1].split("/")[0]
        if self.reservation and zone.rsplit("-", 1)[0] != self.region:
            raise ValueError(
                f"--reservation {self.reservation}: zone {zone} is not in --region {self.region}"
            )
        if self.reservation and not machine.takes_reservations:
            raise ValueError(
                f"--reservation: {machine.name} runs on a Cloud TPU node, which no Compute Engine "
                f"reservation holds (Vertex takes reservations of CPU, GPU and TPU VMs)"
            )
        self._check_tensorboard(slice_type)
        if self.check_region:
            machine.check_region(self.region)
        if slice_type is not None:
            if self.tpu_zone.rsplit("-", 1)[0] != self.region:
                raise ValueError(f"--zone {self.tpu_zone} is not in --region {self.region}")
            if self.check_region:
                machine.check_zone(self.tpu_zone)

    def _check_tensorboard(self, slice_type) -> None:
        """``tensorboard``'s form and what Vertex requires of a job writing to it (the research of
        ``docs/run-page-research.md``, 2): a service account, the instance in the job's region, a Vertex
        job."""
        if not self.tensorboard:
            return
        match = TENSORBOARD_NAME.match(self.tensorboard)
        if not match:
            raise ValueError(
                f"--tensorboard {self.tensorboard!r} must be "
                "projects/PROJECT/locations/REGION/tensorboards/ID"
            )
        if match["location"] != self.region:
            raise ValueError(
                f"--tensorboard {self.tensorboard} is in {match['location']}: Vertex AI takes a training "
                f"job's logs only into a TensorBoard of the job's region (--region {self.region}); "
                f"name one in {self.region}"
            )
        if not self.service_account:
            raise ValueError(
                "--tensorboard needs --service-account: Vertex AI runs a job that writes to a TensorBoard "
                "only as a service account given to it (one with roles/aiplatform.user and "
                "roles/storage.admin)"
            )
        if slice_type is not None:
            raise ValueError(
                f"--tensorboard attaches Vertex AI training jobs; --accelerator {self.accelerator} trains "
                "on a TPU VM slice, outside Vertex AI"
            )

    @property
    def machine(self):
        from components import accelerators

        return accelerators.get(self.accelerator, self.machines)

    @property
    def tpu_zone(self) -> str:
        """The zone of a TPU VM slice: ``zone``, else the first of ``region`` that offers it."""
        slice_type = self.machine.slice_type
        if self.zone or slice_type is None:
            return self.zone
        offered = [zone for zone in slice_type.generation.zones if zone.rsplit("-", 1)[0] == self.region]
        return offered[0] if offered else f"{self.region}-a"

    def tpu_vm_config(self, pipeline_name: str, labels: dict[str, str]) -> dict:
        """``custom_config`` entries of a Trainer on a TPU VM slice
        (``components.tpu_vm_trainer.TpuVmTrainer``): the slice's project, zone, tier and bounds, the image
        worker 0 trains in; its checkpoints where they outlive the run (with ``checkpoint_root``)."""
        from components import tpu_vm
        from trainer_module import tfx_trainer

        tier = {"spot": "spot"}.get(self.provisioning, "reserved" if self.reservation else "on-demand")
        settings = tpu_vm.SliceSettings(
            project=self.project,
            zone=self.tpu_zone,
            accelerator=self.accelerator,
            image=self.training_image,
            tier=tier,
            reservation=self.reservation,
            max_wait_seconds=self.max_wait_seconds,
            service_account=self.service_account,
            max_recreations=self.max_recreations,
            labels=labels,
        )
        entries = {tpu_vm.CONFIG_KEY: settings.to_config()}
        if self.checkpoint_root:
            entries[tfx_trainer.CHECKPOINT_ROOT_KEY] = f"{self.checkpoint_root.rstrip('/')}/{pipeline_name}"
        return entries

    @property
    def max_wait_seconds(self) -> int:
        """Flex-start's ``max_wait_duration`` in seconds (0: indefinitely)."""
        hours = DEFAULT_MAX_WAIT_HOURS if self.max_wait_hours is None else self.max_wait_hours
        return round(hours * 3600)

    @property
    def max_timeout_seconds(self) -> int:
        """The upper bound of a training job's timeout: ``--training-timeout-hours``, else Vertex's 7 days."""
        from components import accelerators

        if self.training_timeout_hours:
            return round(self.training_timeout_hours * 3600)
        return accelerators.MAX_TIMEOUT_SECONDS

    @property
    def training_image(self) -> str:
        return self.trainer_image or self.image

    def images_by_tag(self) -> list[str]:
        """Images given by a mutable tag rather than a digest."""
        return [
            image for image in dict.fromkeys((self.image, self.training_image)) if not _DIGEST.search(image)
        ]

    def labels(self, pipeline_name: str, preset: str) -> dict[str, str]:
        """The labels of every job the pipeline starts (the pipeline job, the training job, Dataflow's)."""
        return {PIPELINE_LABEL: label_value(pipeline_name), PRESET_LABEL: label_value(preset)}

    def dataflow_args(self, labels: dict[str, str]) -> list[str]:
        """The Beam options every Beam step shares: Dataflow in the project and region, the pipeline image,
        the identity and network, the labels. Each step adds its workers (``sharding_workers`` ...)."""
        args = [
            "--runner=DataflowRunner",
            f"--project={self.project}",
            f"--region={self.region}",
            f"--temp_location={self.pipeline_root.rstrip('/')}/beam-tmp",
            f"--sdk_container_image={self.image}",
            "--sdk_location=container",
            *[f"--labels={key}={value}" for key, value in labels.items()],
        ]
        if self.service_account:
            args.append(f"--service_account_email={self.service_account}")
        if self.network:
            args.append(f"--network={_NETWORK.match(self.network)['name']}")
        if self.subnetwork:
            args.append(f"--subnetwork={self.subnetwork}")
        return args

    def timeout_seconds(self, hours: float) -> int:
        """A job's timeout for a nominal ``hours`` of work: the run estimate's rule (three times, at least 2
        hours, at most Vertex's 7 days), at most ``max_timeout_seconds``."""
        from components import accelerators

        return min(accelerators.timeout_for(hours * 3600), self.max_timeout_seconds)

    def scheduling(self, timeout_seconds: int) -> dict:
        """A job's ``scheduling``: its timeout, restart on a worker's restart (the trainer resumes from its
        last checkpoint), and the provisioning strategy."""
        return {
            "timeout": f"{timeout_seconds}s",
            "restart_job_on_worker_restart": True,
            **PROVISIONING.build(self.provisioning, self.machine, self.max_wait_seconds),
        }

    def tensorboard_root(self, pipeline_name: str, task: str) -> str:
        """Where the ``task`` ("trainer", "tuner") jobs of pipeline ``pipeline_name`` keep their TensorBoard
        logs, a directory a run each (``components.vertex_training.job_request``): ``tensorboard --logdir`` on
        it shows the runs side by side."""
        return f"{self.pipeline_root.rstrip('/')}/{TENSORBOARD_DIR}/{pipeline_name}/{task}"

    def _job_args(
        self, pools: list[dict], timeout_seconds: int, pipeline_name: str, task: str, labels: dict
    ) -> dict:
        if self.reservation:
            for pool in pools:
                pool["machine_spec"]["reservation_affinity"] = {
                    "reservation_affinity_type": "SPECIFIC_RESERVATION",
                    "key": "compute.googleapis.com/reservation-name",
                    "values": [self.reservation],
                }
        job_spec = {"worker_pool_specs": pools, "scheduling": self.scheduling(timeout_seconds)}
        if self.service_account:
            job_spec["service_account"] = self.service_account
        if self.network:
            job_spec["network"] = self.network
        if self.tensorboard:
            job_spec["tensorboard"] = self.tensorboard
            job_spec["base_output_directory"] = {
                "output_uri_prefix": self.tensorboard_root(pipeline_name, task)
            }
        display_name = f"{pipeline_name}-{task}"
        return {"project": self.project, "display_name": display_name, "labels": labels, "job_spec": job_spec}

    def vertex_training_config(self, trainer_config, pipeline_name: str, labels: dict[str, str]) -> dict:
        """``custom_config`` entries of the Vertex Trainer: a custom job on the accelerator's worker pools,
        its timeout compiled for the default run and set again by the training step for the run's own values
        (``components.vertex_training.TimeoutRule``), and where its checkpoints outlive the run (with
        ``checkpoint_root``)."""
        from tfx import v1 as tfx

        from components import accelerators, vertex_training
        from trainer_module import tfx_trainer

        vertex = tfx.extensions.google_cloud_ai_platform
        hours = accelerators.estimate(trainer_config, self.machine).hours
        pools = self.machine.worker_pool_specs(self.training_image)
        rule = vertex_training.TimeoutRule(self.accelerator, self.machines, self.max_timeout_seconds)
        entries = {
            vertex.ENABLE_VERTEX_KEY: True,
            vertex.VERTEX_REGION_KEY: self.region,
            vertex.TRAINING_ARGS_KEY: self._job_args(
                pools, self.timeout_seconds(hours), pipeline_name, "trainer", labels
            ),
            vertex_training.TIMEOUT_KEY: rule.to_config(),
        }
        if self.checkpoint_root:
            entries[tfx_trainer.CHECKPOINT_ROOT_KEY] = f"{self.checkpoint_root.rstrip('/')}/{pipeline_name}"
        return entries

    def check_tuning(self, parallel_trials: int) -> None:
        """What Vertex needs of a Tuner step on these machines (``vertex_tuning_config``), checked without
        TFX: the compiler checks it while planning, before TensorFlow and TFX are loaded.

        Raises:
          AcceleratorMismatch: the accelerator is several machines: Vertex runs each trial on one.
          ValueError: fewer than one parallel trial.
        """
        from components import accelerators

        machine = self.machine
        if machine.slice_type is not None:
            raise accelerators.AcceleratorMismatch(
                f"--tune: the Tuner's trials run on Vertex AI machines, and {machine.name} is a TPU VM "
                "slice; tune on tpu-v3-8 or GPU machines (or with python -m trainer_module tune), then "
                "train on the slice with --set the values found"
            )
        if machine.machines > 1:
            raise accelerators.AcceleratorMismatch(
                f"--tune: Vertex runs each tuning trial on one machine and {machine.describe()} is "
                f"{machine.machines}; tune a one-machine config, or tune with python -m trainer_module tune"
            )
        if parallel_trials < 1:
            raise ValueError(f"--tune-parallel-trials {parallel_trials} must be at least 1")

    def vertex_tuning_config(
        self, trainer_config, pipeline_name: str, labels: dict[str, str], parallel_trials: int, epochs: int
    ) -> dict:
        """``custom_config`` entries of the Vertex Tuner: one custom job of ``parallel_trials`` machines of
        the accelerator (the chief runs the search's oracle and trials, each worker trials), for a search that
        trains ``epochs`` epochs in all; its timeout compiled for the default data and set again by the tuning
        step for the run's own shards (``components.vertex_training.TimeoutRule``).

        Raises:
          AcceleratorMismatch: the accelerator is several machines: Vertex runs each trial on one.
        """
        from tfx import v1 as tfx

        from components import accelerators, vertex_training

        self.check_tuning(parallel_trials)
        machine = self.machine
        vertex = tfx.extensions.google_cloud_ai_platform
        per_epoch = accelerators.estimate(trainer_config, machine).hours / trainer_config.loop.train_epochs
        hours = per_epoch * epochs / parallel_trials
        pools = machine.worker_pool_specs(self.training_image, replicas=parallel_trials)
        rule = vertex_training.TimeoutRule(
            self.accelerator, self.machines, self.max_timeout_seconds, epochs, parallel_trials
        )
        return {
            vertex.ENABLE_VERTEX_KEY: True,
            vertex.VERTEX_REGION_KEY: self.region,
            vertex.experimental.TUNING_ARGS_KEY: self._job_args(
                pools, self.timeout_seconds(hours), pipeline_name, "tuner", labels
            ),
            vertex_training.TIMEOUT_KEY: rule.to_config(),  # the search's timeout on the run's data
        }
