"""The machines a pipeline's Trainer can run on in Vertex AI custom training, and the check of a preset
against one.

``ACCELERATORS`` is the registry of ``--accelerator``: each name is bound to the function that builds its
``Accelerator`` for ``--machines`` machines. An ``Accelerator`` knows the Vertex worker pools it compiles to
(machine type, accelerator type and count, TPU topology, the primary/worker pools of a multi-node job), the
``tf.distribute`` strategy that drives it, and the replicas and hosts it provides, so that a preset that does
not fit is refused before anything is compiled, written or paid for. Multi-host TPU slices run through the
Cloud TPU API instead (``backend='tpu_vm'``, ``components.tpu_slices``).

What Vertex offers and why (single-host TPU v2/v3 only, multi-host v5e refused, no TensorFlow from v6e,
flex-start, reservations and Spot by machine): docs/vertex.md ('Accelerators', 'Checked before anything is
written, submitted or paid for'); the sources in docs/accelerators-research.md.
"""

from __future__ import annotations

import dataclasses
import math
import re

from components import tpu_slices
from effnet_common.registry import Registry

ACCELERATORS = Registry("--accelerator")

# Regions where Vertex AI custom training offers each TPU type. Vertex's own table ("Vertex AI locations",
# accelerators for training) is the source where it could be read: it lists TPU v3 for training in us-east1,
# where Cloud TPU VMs have no v3 zone; Google's v5e training sample on Vertex runs in us-west1. Where Vertex's
# table could not be read (regions outside the US, and v5e training, which came after the copy read), the
# regions with the zones Cloud TPU documents for that type stand in (docs/accelerators-research.md, 1.4).
# GPU machines are not checked: no current Vertex table of training GPUs by region could be read, and a
# refusal from a stale one would stop runs the service accepts. ``--skip-region-check`` passes a region Google
# has added since.
_V5E_REGIONS = ("us-central1", "us-south1", "us-west1", "us-west4", "europe-west4")
TRAINING_REGIONS: dict[str, tuple[str, ...]] = {
    "tpu-v2-8": ("us-central1", "europe-west4", "asia-east1"),
    "tpu-v3-8": ("us-central1", "us-east1", "europe-west4"),
    "tpu-v5litepod-1": _V5E_REGIONS,
    "tpu-v5litepod-4": _V5E_REGIONS,
    "tpu-v5litepod-8": _V5E_REGIONS,
}

# The GPUs Vertex's flex-start (Dynamic Workload Scheduler) queues a training job for ("Schedule training jobs
# based on resource availability": L4, A100, H100, H200 and B200), as ``aiplatform_v1.AcceleratorType`` names.
# TPUs and CPU machines are not among them.
FLEX_START_GPUS = frozenset(
    {
        "NVIDIA_L4",
        "NVIDIA_TESLA_A100",
        "NVIDIA_A100_80GB",
        "NVIDIA_H100_80GB",
        "NVIDIA_H100_MEGA_80GB",
        "NVIDIA_H200_141GB",
        "NVIDIA_B200",
    }
)
# The machine type of TPU v2 / v3 on Vertex: a Cloud TPU node, not a Compute Engine machine, so no Compute
# Engine reservation can hold it (Vertex consumes reservations of CPU, GPU and TPU VMs only).
CLOUD_TPU_MACHINE = "cloud-tpu"


class AcceleratorMismatch(ValueError):
    """A preset or an accelerator request that cannot run; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """One kind of Vertex training machine, times ``machines``.

    Attributes:
      name: the ``--accelerator`` name, e.g. 'tpu-v3-8', 'gpu-h100x8'.
      kind: 'tpu', 'gpu' or 'cpu'.
      machine_type: Vertex machine type, e.g. 'cloud-tpu', 'a3-highgpu-8g'.
      accelerator_type: ``aiplatform_v1.AcceleratorType`` name; '' where Vertex takes a topology instead
        (v5e).
      accelerator_count: accelerators per machine as the machine spec counts them (TPU v2/v3: cores).
      replicas_per_machine: ``tf.distribute`` replicas one machine provides (TPU cores, or GPUs).
      tpu_topology: the TPU slice's topology where Vertex needs one (v5e), else ''.
      machines: machines of the job (several only for GPU machines).
      env: environment variables the training container needs on this machine, as (name, value) pairs.
      peak_tflops: the vendor's peak dense bfloat16 TFLOP/s of one machine (all its chips or GPUs), from
        which ``estimate`` derives a nominal run time.
      unit: what ``accelerator_hours`` counts on this machine (e.g. 'TPU v3 cores', 'H100 GPUs').
      backend: what runs the Trainer: 'vertex' (a Vertex AI custom job) or 'tpu_vm' (a multi-host TPU slice
        through the Cloud TPU API, ``components.tpu_vm``; its slice type in ``components.tpu_slices``).
      hosts_per_machine: the hosts (VMs) of one machine: a slice's, else 1.
    """

    name: str
    kind: str
    machine_type: str
    accelerator_type: str
    accelerator_count: int
    replicas_per_machine: int
    tpu_topology: str = ""
    machines: int = 1
    env: tuple[tuple[str, str], ...] = ()
    peak_tflops: float = 0.0
    unit: str = ""
    backend: str = "vertex"
    hosts_per_machine: int = 1

    @property
    def hosts(self) -> int:
        return self.hosts_per_machine * self.machines

    @property
    def slice_type(self):
        """The TPU VM slice (``components.tpu_slices.SliceType``) of a 'tpu_vm' accelerator, else None."""
        from components import tpu_slices

        return tpu_slices.SLICES.get(self.name) if self.backend == "tpu_vm" else None

    @property
    def units(self) -> int:
        """Accelerators the job holds (what it is billed by): TPU cores or chips, or GPUs, on every machine (a
        slice's chips)."""
        if self.backend == "tpu_vm":
            return self.accelerator_count * self.machines
        return max(self.accelerator_count, self.replicas_per_machine) * self.machines

    @property
    def replicas(self) -> int:
        return self.replicas_per_machine * self.machines

    @property
    def strategy(self) -> str:
        """The trainer's ``loop.strategy`` on this machine (a name of
        ``trainer_module.distribute.strategies``)."""
        if self.machines > 1:
            return "multi_worker"
        return {"tpu": "tpu", "cpu": "one_device", "gpu": "mirrored"}[self.kind]

    def describe(self) -> str:
        """'tpu-v3-8', or '2 x gpu-h100x8' for several machines."""
        return f"{self.machines} x {self.name}" if self.machines > 1 else self.name

    def machine_spec(self) -> dict:
        """The Vertex ``MachineSpec`` of one machine."""
        spec = {"machine_type": self.machine_type}
        if self.accelerator_type:
            spec["accelerator_type"] = self.accelerator_type
            spec["accelerator_count"] = self.accelerator_count
        if self.tpu_topology:
            spec["tpu_topology"] = self.tpu_topology
        return spec

    def worker_pool_specs(self, image: str, boot_disk_gb: int = 0, replicas: int | None = None) -> list[dict]:
        """The CustomJob's worker pools: the primary (chief) pool, and one pool of the other workers.

        ``replicas`` machines in all (default ``machines``; a tuning job asks for one per parallel trial).
        TFX's Vertex job client replaces each pool's command with its executor call but fills the image only
        in pools that lack one, with TFX's own image; so every pool names ``image``.
        """
        replicas = self.machines if replicas is None else replicas
        container = {"image_uri": image}
        if self.env:
            container["env"] = [{"name": name, "value": value} for name, value in self.env]
        pool = {"machine_spec": self.machine_spec(), "container_spec": container}
        if boot_disk_gb:
            pool["disk_spec"] = {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": boot_disk_gb}
        pools = [{**pool, "replica_count": 1}]
        if replicas > 1:
            pools.append({**pool, "replica_count": replicas - 1})
        return pools

    def trainer_settings(self) -> dict[str, object]:
        """The settings that bind the trainer to this machine: its strategy and replicas per host."""
        per_host = self.replicas_per_machine // self.hosts_per_machine
        return {"loop.strategy": self.strategy, "data.replicas_per_host": per_host}

    def check_region(self, region: str) -> None:
        """Refuses a region where Vertex AI custom training (a slice: the Cloud TPU API) does not offer this
        machine.

        Raises:
          AcceleratorMismatch: one line naming the region and the ones that offer the machine.
        """
        if self.slice_type is not None:
            zones = self.slice_type.generation.zones
            if not any(zone.rsplit("-", 1)[0] == region for zone in zones):
                raise AcceleratorMismatch(
                    f"--region {region}: {self.name} is offered in the zones {', '.join(zones)} "
                    f"(--skip-region-check if it is offered in {region} now)"
                )
            return
        offered = TRAINING_REGIONS.get(self.name)
        if offered is not None and region not in offered:
            raise AcceleratorMismatch(
                f"--region {region}: Vertex AI training offers {self.name} in {', '.join(offered)} "
                f"(--skip-region-check if it is offered in {region} now)"
            )

    @property
    def offers_flex_start(self) -> bool:
        """Whether Vertex's flex-start (Dynamic Workload Scheduler) takes this machine: GPUs of some types."""
        return self.kind == "gpu" and self.accelerator_type in FLEX_START_GPUS

    @property
    def takes_reservations(self) -> bool:
        """Whether a reservation can hold this machine (every one but a Cloud TPU v2/v3 node; a slice takes a
        TPU reservation)."""
        return self.machine_type != CLOUD_TPU_MACHINE

    def check_zone(self, zone: str) -> None:
        """Refuses a zone that does not offer this slice (a Vertex machine has no zone to check).

        Raises:
          AcceleratorMismatch: one line naming the zone and the ones that offer the slice.
        """
        if self.slice_type is not None and zone not in self.slice_type.generation.zones:
            raise AcceleratorMismatch(
                f"--zone {zone}: {self.name} is offered in {', '.join(self.slice_type.generation.zones)}"
            )

    def check(self, preset: str, config) -> None:
        """Refuses a trainer config made for another number of replicas (the config itself checks that its
        batch and batch-norm groups split over its replicas).

        Raises:
          AcceleratorMismatch: one line naming the preset's size and this accelerator's.
        """
        if config.plan.replicas != self.replicas:
            why = ""
            if self.slice_type is not None and self.slice_type.generation.replicas_per_chip == 1:
                why = f" (TensorFlow sees one device per {self.slice_type.generation.name} chip)"
            raise AcceleratorMismatch(
                f"preset {preset} needs {config.plan.replicas} replicas; "
                f"{self.describe()} has {self.replicas}{why}"
            )


def _single_machine_only(name: str, machines: int) -> None:
    if machines != 1:
        raise AcceleratorMismatch(f"--machines {machines}: {name} runs on one machine; give --machines 1")


def _register_tpu(name: str, **fields) -> None:
    @ACCELERATORS.register(name)
    def build(machines: int) -> Accelerator:
        _single_machine_only(name, machines)
        return Accelerator(name=name, kind="tpu", **fields)


def _register_gpu(name: str, machine_type: str, gpu: str, gpus: int, tflops_per_gpu: float) -> None:
    unit = gpu.removeprefix("NVIDIA_").replace("TESLA_", "") + " GPUs"

    @ACCELERATORS.register(name)
    def build(machines: int) -> Accelerator:
        if machines < 1:
            raise AcceleratorMismatch(f"--machines {machines}: give at least 1")
        return Accelerator(
            name, "gpu", machine_type, gpu, gpus, gpus, machines=machines, peak_tflops=gpus * tflops_per_gpu,
            unit=unit,
        )  # fmt: skip


# TPU v2 / v3: Vertex counts the 8 cores of the one host (4 chips, 2 cores each).
# Peak bfloat16 TFLOP/s per chip: TPU v2 45, v3 123, v5e 197 (Google's TPU pages); H100 SXM 989, A100 312
# (NVIDIA's dense figures).
_register_tpu("tpu-v2-8", machine_type=CLOUD_TPU_MACHINE, accelerator_type="TPU_V2", accelerator_count=8,
              replicas_per_machine=8, peak_tflops=4 * 45.0, unit="TPU v2 cores")  # fmt: skip
_register_tpu("tpu-v3-8", machine_type=CLOUD_TPU_MACHINE, accelerator_type="TPU_V3", accelerator_count=8,
              replicas_per_machine=8, peak_tflops=4 * 123.0, unit="TPU v3 cores")  # fmt: skip
# TPU v5e: one TensorCore per chip; Vertex takes the machine type and topology, no accelerator fields.
# TensorFlow reaches v5e only through the PJRT plug-in (Vertex's TPU custom-container instructions), i.e.
# libtpu loaded as a pluggable device from where the trainer-tpu image links it.
V5E_PJRT_ENV = (
    ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "true"),
    ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "/lib/libtpu.so"),
)
for _chips, _topology in ((1, "1x1"), (4, "2x2"), (8, "2x4")):
    _register_tpu(f"tpu-v5litepod-{_chips}", machine_type=f"ct5lp-hightpu-{_chips}t", accelerator_type="",
                  accelerator_count=0, replicas_per_machine=_chips, tpu_topology=_topology,
                  env=V5E_PJRT_ENV, peak_tflops=_chips * 197.0, unit="TPU v5e chips")  # fmt: skip
_register_gpu("gpu-h100x8", "a3-highgpu-8g", "NVIDIA_H100_80GB", 8, 989.0)


# CPU machines, one replica each: the demo and smoke presets on small data (the embedded digits copied to
# gs://) as a cheap end-to-end check of a project's set-up, on one machine or, with --machines N, N of them in
# a multi-worker job (what the tests run the compiled training step as, over loopback).
@ACCELERATORS.register("cpu")
def _cpu(machines: int) -> Accelerator:
    if machines < 1:
        raise AcceleratorMismatch(f"--machines {machines}: give at least 1")
    # 8 vCPUs, about 0.5 TFLOP/s of float32 at best.
    return Accelerator(
        "cpu", "cpu", "n1-standard-8", "", 0, 1, machines=machines, peak_tflops=0.5, unit="machines"
    )


_register_gpu("gpu-a100x8", "a2-highgpu-8g", "NVIDIA_TESLA_A100", 8, 312.0)
_register_gpu("gpu-a100-80gbx8", "a2-ultragpu-8g", "NVIDIA_A100_80GB", 8, 312.0)


def _register_slice(slice_type) -> None:
    """A multi-host TPU slice, trained on through the Cloud TPU API (``components.tpu_vm``); one slice a
    run."""

    @ACCELERATORS.register(slice_type.name)
    def build(machines: int) -> Accelerator:
        _single_machine_only(slice_type.name, machines)
        return Accelerator(
            name=slice_type.name, kind="tpu", machine_type="tpu-vm", accelerator_type=slice_type.api_type,
            accelerator_count=slice_type.chips, replicas_per_machine=slice_type.replicas,
            peak_tflops=slice_type.peak_tflops, unit=f"TPU {slice_type.generation.name} chips",
            backend="tpu_vm", hosts_per_machine=slice_type.hosts,
        )  # fmt: skip


for _slice in tpu_slices.SLICES.values():
    _register_slice(_slice)

_TPU_SLICE = re.compile(r"^tpu-v(?P<version>2|3|4|5p|5litepod|6e)-(?P<size>\d+)$")


def _not_offered(name: str) -> str | None:
    """Why a well-formed TPU name that is not registered cannot run, with the sizes that can, or None."""
    match = _TPU_SLICE.match(name)
    if not match:
        return None
    version, size = match["version"], int(match["size"])
    generation = tpu_slices.GENERATIONS.get(f"v{version}")
    vertex = sorted(n for n in ACCELERATORS.names() if n.startswith(f"tpu-v{version}-"))
    vertex = [n for n in vertex if n not in tpu_slices.SLICES]
    offers = []
    if vertex:
        offers.append(f"{', '.join(vertex)} on Vertex AI (one host)")
    if generation is not None:
        sizes = ", ".join(str(s) for s in generation.sizes)
        offers.append(f"slices of {sizes} {generation.size_counts} through the Cloud TPU API")
    if not offers:
        return (
            f"--accelerator {name}: no TensorFlow training on TPU v{version} (no TensorFlow runtime for it)"
        )
    return f"--accelerator {name}: TPU v{version} comes as {' or '.join(offers)}, not {size}"


def get(name: str, machines: int = 1) -> Accelerator:
    """The accelerator ``name`` on ``machines`` machines.

    Raises:
      AcceleratorMismatch: a TPU slice Vertex does not offer (with where to run it), an unknown name (listing
        the known ones) or a machine count the accelerator cannot take.
    """
    reason = _not_offered(name) if name not in ACCELERATORS else None
    if reason:
        raise AcceleratorMismatch(reason)
    try:
        ACCELERATORS.check(name)
    except ValueError as e:
        raise AcceleratorMismatch(str(e)) from None
    return ACCELERATORS.build(name, machines)


# The share of peak a run is assumed to reach, by kind of machine; estimates err long. EfficientNet's
# depthwise convolutions keep accelerators far from peak. TPU: the paper's B5 on 128 TPU v3 cores (9.76
# images/ms) and the reference B0 on a TPU v2-8 (350 epochs in 23 hours) reach about 7%, its B2 on 128 cores
# about 4%: the lowest is taken. GPU: published EfficientNet-B0 rates on 8 A100s (about 1,500 images/s a GPU)
# are near 1% of peak. CPU: the tiny network's rate on the development machine (docs/performance.md) is 2-5%.
NOMINAL_UTILIZATION = {"tpu": 0.04, "gpu": 0.01, "cpu": 0.02}
# Training costs about three forward passes (forward, and the two products of the backward pass); one
# multiply-add is two FLOPs.
TRAINING_FLOPS_PER_MULTIPLY_ADD = 6
EVAL_FLOPS_PER_MULTIPLY_ADD = 2
# The training job's timeout: three times the estimate, at least 2 hours, at most Vertex's 7-day limit.
TIMEOUT_FACTOR = 3.0
MIN_TIMEOUT_SECONDS = 2 * 3600
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A run's nominal length on a machine, from its plan.

    Attributes:
      training_images / eval_images: images trained on (every step of the budget) and evaluated.
      teraflops: the run's compute (training plus evaluations).
      hours: wall-clock hours at the ``NOMINAL_UTILIZATION`` of the machine's peak.
      accelerator_hours: ``hours`` times the accelerators held (``unit``): what the run is billed by.
      timeout_seconds: the training job's timeout (``scheduling.timeout``).
    """

    training_images: int
    eval_images: int
    teraflops: float
    hours: float
    accelerator_hours: float
    unit: str
    timeout_seconds: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def estimate(config, machine: Accelerator) -> Estimate:
    """The nominal length of ``config``'s whole budget (no early stop at the target) on ``machine``."""
    from trainer_module.models.efficientnet import multiply_adds

    plan = config.plan
    per_image = multiply_adds(config.model.variant, plan.input_size, config.model.num_classes)
    training_images = plan.total_steps * config.data.global_batch_size
    evaluations = math.ceil(plan.total_steps / plan.steps_per_eval)
    eval_images = evaluations * plan.eval_steps * plan.eval_global_batch_size
    flops = per_image * (
        TRAINING_FLOPS_PER_MULTIPLY_ADD * training_images + EVAL_FLOPS_PER_MULTIPLY_ADD * eval_images
    )
    utilization = NOMINAL_UTILIZATION[machine.kind]
    seconds = flops / (machine.peak_tflops * 1e12 * machine.machines * utilization)
    return Estimate(
        training_images=training_images,
        eval_images=eval_images,
        teraflops=flops / 1e12,
        hours=seconds / 3600,
        accelerator_hours=seconds / 3600 * machine.units,
        unit=machine.unit,
        timeout_seconds=timeout_for(seconds),
    )


def planned(config, machine: Accelerator, spot: bool = False) -> dict:
    """What ``estimate`` says of ``config`` on ``machine``, in the terms a run's report puts beside what it
    measured: hours, accelerator-hours and their unit, and for a TPU slice the price of one (Spot or on
    demand) and where the price comes from."""
    found = estimate(config, machine)
    values = {
        "accelerator": machine.name,
        "hours": found.hours,
        "accelerator_hours": found.accelerator_hours,
        "unit": found.unit,
    }
    slice_type = machine.slice_type
    if slice_type is not None:
        values["usd_per_unit_hour"] = slice_type.chip_hour_usd(spot)
        values["prices"] = f"{slice_type.generation.price_source}, {'Spot' if spot else 'on demand'}"
    return values


def timeout_for(seconds: float) -> int:
    """A job's timeout for a nominal ``seconds`` of work: ``TIMEOUT_FACTOR`` times it, within Vertex's
    limits."""
    return min(MAX_TIMEOUT_SECONDS, max(MIN_TIMEOUT_SECONDS, math.ceil(TIMEOUT_FACTOR * seconds)))


def job_timeout(config, machine: Accelerator, max_seconds: int) -> int:
    """The training job's timeout for the run of ``config`` on ``machine``: ``estimate``'s, at most
    ``max_seconds`` (the compiled upper bound)."""
    return min(estimate(config, machine).timeout_seconds, max_seconds)
