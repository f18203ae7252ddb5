"""Pipeline presets: which trainer preset, how to shard for the hosts that will read; and a pipeline run
resolved once from a preset, the person's settings, the target and the inputs (``PipelinePreset.resolve``).

A slice has ``config.plan.hosts`` input pipelines (a TPU-v3 host drives 8 cores: C / 8 for a slice of C
cores); each split's shard count is a multiple of that (the reference's 1024 training and 128 validation
shards for the whole pod). The run's top-1 target (the trainer config's ``loop.target_top1``; for the paper's
rows the peak top-1 of its Table 2) stops the training and gates blessing and pushing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from beam_preprocess.config import ShardingConfig, splits_without_input
from components import parameters
from effnet_common import schema
from effnet_common.registry import Registry
from trainer_module import presets as trainer_presets
from trainer_module import resolve
from trainer_module.resolve import UNSET, ResolvedRun

# A pipeline's ShardingConfig needs an output_dir; the sharding component replaces this placeholder with its
# Examples artifact's URI.
ARTIFACT_OUTPUT_DIR = "<examples artifact uri>"


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """A pipeline run resolved once (``PipelinePreset.resolve``), read by every later step.

    Attributes:
      preset: the pipeline preset it came from.
      run: the trainer's run: its config holds the run's target (``loop.target_top1``: the trainer's stop and
        the Evaluator's gate) and epochs; the shards' manifest gives the epoch when the Trainer runs.
      sharding: the sharding step's inputs and layout (None for the trainer's run alone).
    """

    preset: PipelinePreset
    run: ResolvedRun
    sharding: ShardingConfig | None

    @property
    def trainer_config(self):
        return self.run.config

    @property
    def target_top1(self) -> float:
        return self.run.target_top1


@dataclasses.dataclass(frozen=True)
class PipelinePreset:
    """One named way to run the whole pipeline.

    Attributes:
      name: the preset's name (also the trainer preset's, whose config holds the target top-1).
      num_hosts: input pipelines that read the shards (shard counts are multiples of it).
      train_shards / val_shards: shard counts (0 = from the target shard size).
      settings: what the pipeline changes in the trainer preset (the smoke pipeline gates at 0).
    """

    name: str
    num_hosts: int
    train_shards: int = 0
    val_shards: int = 0
    settings: Mapping[str, object] = dataclasses.field(default_factory=dict)

    @property
    def pipeline_name(self) -> str:
        """The pipeline's name, one per preset: its Vertex display name, the scope of its baseline and of its
        pushes, and its label on every job."""
        return f"effnet-{self.name}"

    def trainer_config(self):
        return trainer_presets.get_preset(self.name)

    def resolve(
        self,
        settings: Mapping[str, object] | None = None,
        *,
        target_top1: float | None | object = UNSET,
        inputs: Mapping[str, str] | None = None,
        max_failures: int = 0,
        machine=None,
        layout: Mapping[str, int] | None = None,
    ) -> PipelineRun:
        """The run of this preset, in both runners: the trainer preset bound to ``machine`` (an accelerator:
        its strategy and replicas per host) with this preset's settings, then the person's ``settings``
        (typed, by dotted key), then ``target_top1`` when given (``--target-top1``, ``--param``); and the
        sharding step reading ``inputs`` (``train_archive``, ``val_archive``, ``train_dir``, ``val_dir``,
        ``tfds_data_dir``; empty ones ignored) into the shard ``layout`` (``train_shards``, ``val_shards``;
        this preset's unless given), for the hosts that will read them (the machine's, else this preset's);
        no ``inputs``: the trainer's run alone.

        Raises:
          ValueError / TypeError: a setting, input or layout that does not fit, naming it;
          AcceleratorMismatch: a config made for another number of replicas than ``machine`` has.
        """
        bound = machine.trainer_settings() if machine is not None else {}
        changes = {**bound, **self.settings, **(settings or {})}
        run = resolve.resolve_run(self.trainer_config(), changes, target_top1=target_top1)
        if run.target_top1 is None:
            raise ValueError(
                f"preset {self.name} has no target top-1: give --target-top1 (or --set loop.target_top1=...)"
            )
        if machine is not None:
            machine.check(self.name, run.config)
        if inputs is None:  # the trainer's run alone (a plan of it)
            return PipelineRun(self, run, None)
        check_both_splits(inputs)
        # The shards are laid out for the hosts that read them: the machine's, else this preset's.
        hosts = run.config.plan.hosts if machine is not None else self.num_hosts
        shape = {"num_hosts": hosts, "train_shards": self.train_shards, "val_shards": self.val_shards}
        sharding = ShardingConfig(
            output_dir=ARTIFACT_OUTPUT_DIR,
            max_failures=max_failures,
            **{**shape, **(layout or {})},
            **{key: value for key, value in inputs.items() if value},
        )
        return PipelineRun(self, run, sharding)


# Each split as a sentence names it, and the flags that give it its input, in both runners.
SPLIT_INPUT_FLAGS = {
    schema.TRAIN: ("training", "--train-archive or --train-dir"),
    schema.VALIDATION: ("validation", "--val-archive or --val-dir"),
}


def check_both_splits(inputs: Mapping[str, str]) -> None:
    """The pipeline trains on the training split and gates on the validation split: a run given one of them
    would pay for the sharding and fail at the Trainer.

    Raises:
      ValueError: one line naming the split without an input and the flags that give it.
    """
    missing = [SPLIT_INPUT_FLAGS[split] for split in splits_without_input(inputs)]
    if missing:
        raise ValueError(
            f"no {' and no '.join(name for name, _ in missing)} input: {parameters.BOTH_SPLITS}; give "
            f"{' and '.join(flags for _, flags in missing)}"
        )


def _paper(name: str) -> PipelinePreset:
    hosts = trainer_presets.get_preset(name).plan.hosts
    return PipelinePreset(
        name=name,
        num_hosts=hosts,
        train_shards=max(1024, hosts) // hosts * hosts,
        val_shards=max(128, hosts) // hosts * hosts,
    )


def _build() -> Registry:
    table = {
        # The embedded digits, sharded as if for 2 hosts; the demo's target is its trainer preset's.
        "demo": PipelinePreset("demo", num_hosts=2, train_shards=8, val_shards=2),
        # End-to-end checks: one epoch of small data at batch 8; any model passes a zero target.
        "smoke": PipelinePreset(
            "smoke", num_hosts=1, train_shards=2, val_shards=1, settings={"loop.target_top1": 0.0}
        ),
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
