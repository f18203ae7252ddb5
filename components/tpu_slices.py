"""Multi-host Cloud TPU slices, which the Trainer reaches through the Cloud TPU API (``components.tpu_vm``),
not Vertex AI: what each one is (chips, TensorFlow replicas, hosts, chip grid), where it is offered, which
TensorFlow runtime its VMs boot, and what a chip-hour costs. Facts and sources: docs/tpu-pods-research.md, 4.

- A slice is named by its generation and a size: TensorCores for v3, v4 and v5p (two per chip), chips for
  v5e; every host holds 4 chips. TensorFlow sees each v3 TensorCore as a replica but one device per v4, v5p
  ("megacore") or v5e chip: tpu-v3-1024 (the paper's, 512 chips) has 1,024 replicas, tpu-v4-1024 has 512.
- TensorFlow drives a multi-host slice from one client on worker 0 through the ``tpu-runtime`` service of the
  ``-pod`` runtimes; for the pinned TensorFlow 2.16 that is ``tpu-vm-tf-2.16.1-pod-pjrt`` (none for 2.16.2).
- Chip grids: v3 and v5e 2D, v4 and v5p 3D. Only v4/v5p grids whose every side is a multiple of 4 wrap
  around (a torus); of v3 only the full 2,048-core pod is documented as one, so smaller v3 slices are taken as
  meshes; of v5e the full 256-chip pod.
- Zones: where Cloud TPU documents (or Google's own CI uses) each generation's slices. Prices: v3 from a
  published table ($2.00 on demand, $0.60 Spot per chip-hour); the v4, v5p and v5e list prices no stored
  source confirmed, which ``--plan`` says beside its cost.
"""

from __future__ import annotations

import dataclasses
import math

# The TensorFlow runtime the slices' VMs boot: the pod (multi-host) PJRT runtime of the pinned TensorFlow's
# minor release.
POD_RUNTIME = "tpu-vm-tf-2.16.1-pod-pjrt"
CHIPS_PER_HOST = 4


@dataclasses.dataclass(frozen=True)
class Generation:
    """What every slice of one TPU generation shares."""

    name: str  # as in the accelerator names: "v3", "v4", "v5p", "v5litepod"
    cores_per_chip: int  # TensorCores per chip
    replicas_per_chip: int  # TensorFlow devices per chip
    size_counts: str  # what the N of 'vX-N' counts: "TensorCores" or "chips"
    peak_tflops_per_chip: float  # peak dense bfloat16
    zones: tuple[str, ...]
    chip_hour_usd: float
    spot_chip_hour_usd: float
    price_source: str
    sizes: tuple[int, ...]


GENERATIONS = {
    g.name: g
    for g in (
        Generation(
            "v3", 2, 2, "TensorCores", 123.0, ("europe-west4-a", "us-east1-d"), 2.00, 0.60,
            "published v3 table (SkyPilot's catalog)", (32, 64, 128, 256, 512, 1024, 2048),
        ),
        Generation(
            "v4", 2, 1, "TensorCores", 275.0, ("us-central2-b",), 3.22, 0.97,
            "2024 list price, not confirmed", (16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
        ),
        Generation(
            "v5p", 2, 1, "TensorCores", 459.0, ("us-east5-a", "us-central1-a", "europe-west4-b"), 4.20, 1.26,
            "2024 list price, not confirmed", (16, 32, 64, 128, 256, 512, 1024, 2048),
        ),
        Generation(
            "v5litepod", 1, 1, "chips", 197.0,
            ("us-west4-a", "us-east1-c", "us-central1-a", "us-south1-a", "us-west1-c", "europe-west4-b"),
            1.20, 0.36, "2024 list price, not confirmed", (16, 32, 64, 128, 256),
        ),
    )
}  # fmt: skip


def _v3_grid(chips: int) -> tuple[int, ...]:
    """2D: the hosts' 2x2 chips side by side (4x4 for 16 chips ... 32x32 for the full pod)."""
    side = 2 ** (int(math.log2(chips)) // 2)
    return (side, chips // side)


def _cube_grid(chips: int) -> tuple[int, ...]:
    """3D, smallest sides first: 2x2x4 for 16 chips, 4x4x4 for 64, 8x8x8 for 512, 8x16x16 for 2,048."""
    grid = [1, 1, 1]
    for _ in range(int(math.log2(chips))):
        grid[grid.index(min(grid))] *= 2
    return tuple(sorted(grid))


@dataclasses.dataclass(frozen=True)
class SliceType:
    """One multi-host slice type, e.g. tpu-v4-32 (16 chips, 16 replicas, 4 hosts)."""

    generation: Generation
    size: int

    @property
    def name(self) -> str:
        return f"tpu-{self.generation.name}-{self.size}"

    @property
    def api_type(self) -> str:
        """The Cloud TPU API's accelerator type, e.g. 'v4-32'."""
        return f"{self.generation.name}-{self.size}"

    @property
    def chips(self) -> int:
        return self.size // self.generation.cores_per_chip

    @property
    def replicas(self) -> int:
        return self.chips * self.generation.replicas_per_chip

    @property
    def hosts(self) -> int:
        return self.chips // CHIPS_PER_HOST

    @property
    def grid(self) -> tuple[int, ...]:
        """Chips per side of the slice's interconnect."""
        if self.generation.name in ("v4", "v5p"):
            return _cube_grid(self.chips)
        return _v3_grid(self.chips)

    @property
    def torus(self) -> bool:
        """Whether the grid wraps around (see the module's docstring)."""
        if self.generation.name in ("v4", "v5p"):
            return all(side % 4 == 0 for side in self.grid)
        full_pod = {"v3": 1024, "v5litepod": 256}[self.generation.name]
        return self.chips == full_pod

    @property
    def peak_tflops(self) -> float:
        return self.chips * self.generation.peak_tflops_per_chip

    def chip_hour_usd(self, spot: bool) -> float:
        return self.generation.spot_chip_hour_usd if spot else self.generation.chip_hour_usd

    def describe(self) -> str:
        kind = "torus" if self.torus else "mesh"
        grid = "x".join(map(str, self.grid))
        cores = f" ({self.size} TensorCores)" if self.generation.size_counts == "TensorCores" else ""
        return (
            f"{self.name}: {self.chips} chips{cores}, {self.replicas} "
            f"TensorFlow replicas on {self.hosts} hosts, chips {grid} ({kind})"
        )


SLICES: dict[str, SliceType] = {
    s.name: s
    for generation in GENERATIONS.values()
    for s in (SliceType(generation, n) for n in generation.sizes)
}


def slice_plan(
    slice_type: SliceType,
    global_batch: int,
    bn_group_replicas: int,
    train_shards: int,
    chip_hours: float,
) -> dict:
    """What a run on ``slice_type`` holds per host, where its batch-norm groups lie, and what it costs.

    ``bn_group_replicas``: replicas whose statistics one batch-norm group pools (the trainer's plan);
    ``train_shards``: the training shards the hosts read (0: derived from the data, a multiple of the hosts);
    ``chip_hours``: the run's estimate (``components.accelerators.estimate``).
    """
    generation = slice_type.generation
    per_host = slice_type.replicas // slice_type.hosts
    replicas_per_chip = generation.replicas_per_chip
    if bn_group_replicas <= replicas_per_chip:
        where = "the cores of one chip"
    elif bn_group_replicas <= per_host:
        where = f"{bn_group_replicas // replicas_per_chip} chips of one host"
    else:
        where = f"{bn_group_replicas // per_host} hosts, over the slice's interconnect"
    return {
        "slice": slice_type.describe(),
        "zones": list(generation.zones),
        "runtime_version": POD_RUNTIME,
        "hosts": slice_type.hosts,
        "replicas_per_host": per_host,
        "per_host_batch": global_batch // slice_type.hosts,
        "shards_per_host": train_shards // slice_type.hosts if train_shards else "derived from the data",
        "batch_norm_groups": {
            "replicas_per_group": bn_group_replicas,
            "groups": slice_type.replicas // bn_group_replicas,
            "each_on": where,
        },
        "cost_usd": {
            "chip_hours": round(chip_hours, 1),
            "on_demand": round(chip_hours * slice_type.chip_hour_usd(spot=False)),
            "spot": round(chip_hours * slice_type.chip_hour_usd(spot=True)),
            "per_chip_hour": {"on_demand": generation.chip_hour_usd, "spot": generation.spot_chip_hour_usd},
            "prices": generation.price_source,
        },
    }
