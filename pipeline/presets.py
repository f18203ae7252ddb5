"""Pipeline presets: which trainer preset, which top-1 gate, and how to shard for the hosts that will read.

A slice has ``config.plan.hosts`` input pipelines (a TPU-v3 host drives 8 cores: C / 8 for a slice of C
cores); each split's shard count is a multiple of that (the reference's 1024 training and 128 validation
shards for the whole pod). The top-1
target gates blessing and pushing; for the paper's rows it is the peak top-1 of its Table 2.
"""

from __future__ import annotations

import dataclasses

from beam_preprocess.config import ShardingConfig
from effnet_common.registry import Registry
from trainer_module import presets as trainer_presets

# A pipeline's ShardingConfig needs an output_dir; the sharding component replaces this placeholder with its
# Examples artifact's URI.
ARTIFACT_OUTPUT_DIR = "<examples artifact uri>"


@dataclasses.dataclass(frozen=True)
class PipelinePreset:
    """One named way to run the whole pipeline.

    Attributes:
      name: the preset's name (also the trainer preset's).
      target_top1: validation top-1 a model must reach to be blessed and pushed.
      num_hosts: input pipelines that read the shards (shard counts are multiples of it).
      train_shards / val_shards: shard counts (0 = from the target shard size).
    """

    name: str
    target_top1: float
    num_hosts: int
    train_shards: int = 0
    val_shards: int = 0

    def trainer_config(self):
        return trainer_presets.get_preset(self.name)

    def run_target(self, trainer_config, given: float | None = None) -> float:
        """The run's target top-1, in both runners: ``given`` (``--target-top1``, ``--param target_top1``),
        else the trainer config's ``loop.target_top1`` (a ``--set`` override), else the preset's. The one
        target stops the training once reached and gates the blessing."""
        if given is not None:
            return given
        return (
            self.target_top1 if trainer_config.loop.target_top1 is None else trainer_config.loop.target_top1
        )

    def sharding_config(self, max_failures: int = 0, **inputs: str) -> ShardingConfig:
        """The sharding step's config for this preset: the shard layout of its hosts, reading ``inputs``
        (``train_archive``, ``val_archive``, ``train_dir``, ``val_dir``, ``tfds_data_dir``; empty ones
        ignored) into the pipeline's Examples artifact. The one place both runners build it.

        Raises:
          ValueError / TypeError: an unknown input name or an invalid combination (from ShardingConfig).
        """
        return ShardingConfig(
            output_dir=ARTIFACT_OUTPUT_DIR,
            num_hosts=self.num_hosts,
            train_shards=self.train_shards,
            val_shards=self.val_shards,
            max_failures=max_failures,
            **{key: value for key, value in inputs.items() if value},
        )


def _paper(name: str) -> PipelinePreset:
    config = trainer_presets.get_preset(name)
    hosts = config.plan.hosts
    return PipelinePreset(
        name=name,
        target_top1=config.loop.target_top1,
        num_hosts=hosts,
        train_shards=max(1024, hosts) // hosts * hosts,
        val_shards=max(128, hosts) // hosts * hosts,
    )


def _build() -> Registry:
    demo_target = trainer_presets.get_preset("demo").loop.target_top1
    table = {
        # The embedded digits, sharded as if for 2 hosts; the target the demo reaches on this machine.
        "demo": PipelinePreset("demo", target_top1=demo_target, num_hosts=2, train_shards=8, val_shards=2),
        # End-to-end checks: one epoch of small data at batch 8; any model passes a zero target.
        "smoke": PipelinePreset("smoke", target_top1=0.0, num_hosts=1, train_shards=2, val_shards=1),
    }
    for name in trainer_presets.preset_names():
        if name not in table:
            table[name] = _paper(name)
    registry = Registry("--preset")
    for name, preset in table.items():
        registry.register(name)(lambda preset=preset: preset)
    return registry


PIPELINE_PRESETS = _build()


def get(name: str) -> PipelinePreset:
    if name not in PIPELINE_PRESETS:
        raise ValueError(f"unknown pipeline preset {name!r}; known: {', '.join(PIPELINE_PRESETS)}")
    return PIPELINE_PRESETS.build(name)
