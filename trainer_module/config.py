"""The trainer stage's configuration: one frozen dataclass, serialised to JSON across the TFX boundary.

``TrainerConfig`` nests six sections (model, optimizer, schedule, augment, data, loop) that hold plain values
only. Everything that follows from them is resolved once into ``config.plan``, a ``TrainingPlan`` whose
values carry names of their own (``plan.bn_group_replicas`` is what ``model.bn_group_size`` resolves to,
``plan.input_size`` what ``model.image_size`` resolves to), so a preset or a ``--set`` override cannot leave
them inconsistent and a reader never confuses a setting with its resolved value. Each named choice
(optimizer, schedule, strategy, batch-norm layout and group rule, augmentation policy) is checked against
the one registry that also builds it. Validation happens at construction and names the setting.

    config = TrainerConfig.from_json(text)
    config = with_overrides(config, ["optimizer.weight_decay=1e-4", "loop.train_epochs=3"])
    config.plan.total_steps, config.plan.peak_learning_rate
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Iterable, Mapping

from effnet_common import schema
from trainer_module.choices import (
    AUGMENT_POLICIES,
    BN_GROUP_RULES,
    BN_LAYOUTS,
    OPTIMIZERS,
    PRECISIONS,
    RMSPROP_FORMS,
    SCHEDULES,
    STRATEGIES,
)
from trainer_module.models.variants import VARIANTS

# Linear scaling rule: learning rates are quoted per 256 examples of global batch.
REFERENCE_BATCH_SIZE = 256
# End rate of the EfficientNet reference's polynomial decay (absolute; 1e-4 is the ResNet/MLPerf value).
DEFAULT_END_LEARNING_RATE = 0.1
POLYNOMIAL_POWER = 2.0


@dataclasses.dataclass(frozen=True)
class ScheduleSteps:
    """The step counts a schedule is laid out on.

    Attributes:
      steps_per_epoch: examples per epoch / global batch, a float (19.549 at batch 65536 on ImageNet).
      warmup_steps: int(warmup epochs x steps per epoch).
      total_steps: int(epochs x steps per epoch): 350 epochs at batch 65536 are 6,842 steps.
    """

    steps_per_epoch: float
    warmup_steps: int
    total_steps: int

    @classmethod
    def of(
        cls, num_examples: int, global_batch_size: int, warmup_epochs: float, epochs: float
    ) -> ScheduleSteps:
        """The reference's arithmetic: float steps per epoch, truncated warmup and total steps."""
        steps_per_epoch = num_examples / global_batch_size
        return cls(steps_per_epoch, int(warmup_epochs * steps_per_epoch), int(epochs * steps_per_epoch))


def scaled_learning_rate(lr_per_256: float, global_batch_size: int) -> float:
    """Peak learning rate by the linear scaling rule.

    Args:
      lr_per_256: learning rate quoted for a global batch of 256 examples.
      global_batch_size: examples per training step summed over all replicas.

    Returns:
      ``lr_per_256 * global_batch_size / 256``.
    """
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    return lr_per_256 * global_batch_size / REFERENCE_BATCH_SIZE


def learning_rate_per_256(peak_learning_rate: float, global_batch_size: int) -> float:
    """The ``lr_per_256`` whose linearly scaled peak at ``global_batch_size`` is ``peak_learning_rate``: the
    inverse of ``scaled_learning_rate``, for stating an absolute peak in the config's unit."""
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    return peak_learning_rate * REFERENCE_BATCH_SIZE / global_batch_size


# The evaluation centre crop of today's reference: this share of the short side.
EVAL_CROP_FRACTION = 0.875


def eval_crop_padding(image_size: int) -> int:
    """Pixels added to ``image_size`` to size the evaluation crop: round(S * (1/0.875 - 1)), 32 at 224.

    Today's reference derives the padding from the 0.875 crop; the paper-era code used a constant 32 at every
    resolution (0.934 of the short side at 456), which ``data.eval_crop_padding=32`` reproduces.
    """
    return round(image_size * (1.0 / EVAL_CROP_FRACTION - 1.0))


# How many replicas share batch-norm statistics when ``model.bn_group_size`` is unset: a rule of the plan, by
# name (``model.bn_group_rule``); ``trainer_module.distribute.replica_groups`` lays the groups out.
GROUP_SIZE_RULES = BN_GROUP_RULES
# The reference LARS runs size batch-norm groups to hold about this many examples (docs/recipe.md).
EXAMPLES_PER_BN_GROUP = 128


@GROUP_SIZE_RULES.register("examples128")
def examples_per_group_rule(num_replicas: int, per_replica_batch: int) -> int:
    """max(1, 128 // per-replica batch) replicas, capped at the replica count."""
    return min(max(1, EXAMPLES_PER_BN_GROUP // per_replica_batch), num_replicas)


@GROUP_SIZE_RULES.register("reference_lars")
def reference_lars_rule(num_replicas: int, per_replica_batch: int) -> int:
    """All replicas up to 8 (a slice of one host normalises over its whole batch), else ``examples128``: what
    the reference LARS runs did, whose large slices always took the second branch."""
    if num_replicas <= 8:
        return num_replicas
    return examples_per_group_rule(num_replicas, per_replica_batch)


@GROUP_SIZE_RULES.register("reference_tpu")
def reference_tpu_rule(num_replicas: int, per_replica_batch: int) -> int:
    """1 up to 8 replicas, else max(8, replicas // 8), whatever the batch (tensorflow/tpu efficientnet)."""
    del per_replica_batch  # the reference looks at the slice size only
    return 1 if num_replicas <= 8 else max(8, num_replicas // 8)


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not one of {', '.join(repr(c) for c in choices)}")


def _check_range(key: str, value: float, low: float, high: float, *, high_inclusive: bool = True) -> None:
    inside = low <= value <= high if high_inclusive else low <= value < high
    if not inside:
        closing = "]" if high_inclusive else ")"
        raise ValueError(f"{key}={value!r} is outside [{low}, {high}{closing}")


def _allowed_types(annotation) -> tuple[type, ...]:
    """The runtime types a field annotation admits ('float | None' -> (float, NoneType))."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(typing.get_args(annotation))
    return (annotation,)


class _Section:
    """Shared behaviour of the config sections: field type checks and (de)serialisation."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            allowed = _allowed_types(hints[field.name])
            key = f"{self._section_name()}{field.name}"
            if isinstance(value, _Section) and type(value) in allowed:
                continue
            # bool is an int subclass: reject it for numeric fields so 'True' never becomes 1.
            if isinstance(value, bool) and bool not in allowed:
                raise TypeError(f"{key}={value!r} must be {_type_names(allowed)}, not a bool")
            if float in allowed and isinstance(value, int) and not isinstance(value, bool):
                # warmup_epochs=50 is stored as 50.0, so the JSON round trip keeps the type.
                object.__setattr__(self, field.name, float(value))
                continue
            if not isinstance(value, allowed):
                raise TypeError(f"{key}={value!r} must be {_type_names(allowed)}")
        self._validate()

    def _validate(self) -> None:
        """Section-specific checks; raise ValueError naming the setting."""

    @classmethod
    def _section_name(cls) -> str:
        return f"{SECTION_NAMES[cls]}." if cls in SECTION_NAMES else ""

    def to_dict(self) -> dict:
        """Plain nested dict of the stored fields (no derived values)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, prefix: str = ""):
        """Builds the section from a dict; unknown keys raise, missing keys take their defaults.

        Args:
          values: mapping of field name to value (nested dicts for sections).
          prefix: dotted path of this section, for error messages.
        """
        if not isinstance(values, dict):
            raise TypeError(f"config section {prefix.rstrip('.') or '<root>'} must be a JSON object")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(
                f"unknown config key '{prefix}{unknown[0]}'"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                + f"; known keys here: {', '.join(sorted(fields))}"
            )
        kwargs = {}
        for name, value in values.items():
            section_type = hints[name]
            if isinstance(section_type, type) and issubclass(section_type, _Section):
                value = section_type.from_dict(value, prefix=f"{prefix}{name}.")
            kwargs[name] = value
        return cls(**kwargs)


def _type_names(allowed: tuple[type, ...]) -> str:
    return " or ".join("None" if t is type(None) else t.__name__ for t in allowed)


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """Network and normalisation settings.

    Attributes:
      variant: 'b0'..'b7', 'tiny' (the demo's network) or 'micro' (the smoke run's: the plumbing tests).
      num_classes: logits of the classifier; 1000 for ImageNet and for the demo, whose labels are positions in
        the 1000 ImageNet synsets.
      image_size: input resolution in pixels; None takes the variant's (224 for b0, ..., 32 for tiny).
      dropout_rate: dropout before the classifier; None takes the variant's (0.2 for b0 ... 0.5 for b7).
      drop_connect_rate: stochastic-depth rate of the last block, ramped linearly with block index.
      bn_momentum: batch-norm moving-statistics momentum (0.99 in the recipe; 0.9 for short CPU runs).
      bn_epsilon: batch-norm epsilon.
      bn_group_size: replicas per batch-norm group; None derives it by ``bn_group_rule``.
      bn_group_rule: how an unset group size is derived: 'examples128' (about 128 examples per group, the
        reference LARS runs), 'reference_lars' (the reference LARS runs exactly: all replicas up to 8, else
        about 128 examples) or 'reference_tpu' (1 up to 8 replicas, else max(8, replicas / 8), as
        tensorflow/tpu's TpuBatchNormalization did for the paper's RMSProp rows).
      bn_group_layout: how replicas form groups: 'consecutive' ids or 'torus2d' tiles of the TPU torus.
      bn_virtual_batch: examples per batch-norm group within a replica ("ghost" batch norm); None = the
        replica's batch. Keeps the reference's ~128 examples per group on few replicas with large batches
        (the large-batch study on 2 CPU replicas); needs groups of one replica.
      precision: 'float32', or 'bfloat16' compute with float32 variables, logits and loss.
    """

    variant: str = "b0"
    num_classes: int = 1000
    image_size: int | None = None
    dropout_rate: float | None = None
    drop_connect_rate: float = 0.2
    bn_momentum: float = 0.99
    bn_epsilon: float = 1e-3
    bn_group_size: int | None = None
    bn_group_rule: str = "examples128"
    bn_group_layout: str = "consecutive"
    bn_virtual_batch: int | None = None
    precision: str = "float32"

    def _validate(self):
        _check_choice("model.variant", self.variant, tuple(VARIANTS))
        if self.num_classes < 2:
            raise ValueError(f"model.num_classes={self.num_classes} must be at least 2")
        if self.image_size is not None and self.image_size < 8:
            raise ValueError(f"model.image_size={self.image_size} must be at least 8 pixels (or None)")
        if self.dropout_rate is not None:
            _check_range("model.dropout_rate", self.dropout_rate, 0.0, 1.0, high_inclusive=False)
        _check_range("model.drop_connect_rate", self.drop_connect_rate, 0.0, 1.0, high_inclusive=False)
        _check_range("model.bn_momentum", self.bn_momentum, 0.0, 1.0, high_inclusive=False)
        if self.bn_epsilon <= 0.0:
            raise ValueError(f"model.bn_epsilon={self.bn_epsilon} must be positive")
        if self.bn_group_size is not None and self.bn_group_size < 1:
            raise ValueError(f"model.bn_group_size={self.bn_group_size} must be >= 1 (or none to derive it)")
        BN_GROUP_RULES.check(self.bn_group_rule)
        BN_LAYOUTS.check(self.bn_group_layout)
        if self.bn_virtual_batch is not None and self.bn_virtual_batch < 1:
            raise ValueError(f"model.bn_virtual_batch={self.bn_virtual_batch} must be >= 1 (or none)")
        PRECISIONS.check(self.precision)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(_Section):
    """Optimizer, regularisation and weight averaging.

    Attributes:
      name: 'lars', 'rmsprop' or 'sgd' (momentum SGD).
      momentum: momentum of all three optimizers.
      weight_decay: applied inside the update by LARS, as an L2 loss term otherwise.
      lars_eeta: LARS trust coefficient.
      lars_epsilon: LARS trust-ratio epsilon.
      lars_nesterov: Nesterov momentum in LARS.
      lars_l2_in_loss: exact reproduction of the reference: under LARS, add the L2 term to the loss as well,
        so weight decay is applied twice (once in the loss gradient, once inside LARS). Off by default.
      l2_includes_biases: exact reproduction of the reference (on in the paper presets): the L2 loss term
        sums over biases too (every variable but batch norm's); off, it leaves biases out, as LARS' own decay
        does.
      rmsprop_rho: RMSProp mean-square decay ("decay" in TF1).
      rmsprop_epsilon: RMSProp epsilon.
      rmsprop_form: 'keras' (``keras.optimizers.RMSprop``) or 'tf1', the reference's
        ``tf.compat.v1.train.RMSPropOptimizer`` (``optimizers.TF1RMSProp``): the same update, but the
        mean-square accumulator starts at 1 instead of 0, so the first steps are momentum-SGD-sized instead of
        about 3 x lr per weight. The paper's RMSProp presets use 'tf1'.
      label_smoothing: label smoothing of the cross-entropy.
      ema_decay: exponential moving average of the weights and batch-norm statistics, with the reference's
        warm-up min(decay, (1 + t) / (10 + t)); 0 turns it off.
    """

    name: str = "rmsprop"
    momentum: float = 0.9
    weight_decay: float = 1e-5
    lars_eeta: float = 0.001
    lars_epsilon: float = 0.0
    lars_nesterov: bool = False
    lars_l2_in_loss: bool = False
    l2_includes_biases: bool = False
    rmsprop_rho: float = 0.9
    rmsprop_epsilon: float = 1e-3
    rmsprop_form: str = "keras"
    label_smoothing: float = 0.1
    ema_decay: float = 0.0

    def _validate(self):
        OPTIMIZERS.check(self.name)
        _check_range("optimizer.momentum", self.momentum, 0.0, 1.0, high_inclusive=False)
        if self.weight_decay < 0.0:
            raise ValueError(f"optimizer.weight_decay={self.weight_decay} must be >= 0")
        if self.lars_eeta <= 0.0:
            raise ValueError(f"optimizer.lars_eeta={self.lars_eeta} must be positive")
        if self.lars_epsilon < 0.0:
            raise ValueError(f"optimizer.lars_epsilon={self.lars_epsilon} must be >= 0")
        _check_range("optimizer.rmsprop_rho", self.rmsprop_rho, 0.0, 1.0, high_inclusive=False)
        if self.rmsprop_epsilon <= 0.0:
            raise ValueError(f"optimizer.rmsprop_epsilon={self.rmsprop_epsilon} must be positive")
        RMSPROP_FORMS.check(self.rmsprop_form)
        _check_range("optimizer.label_smoothing", self.label_smoothing, 0.0, 1.0, high_inclusive=False)
        _check_range("optimizer.ema_decay", self.ema_decay, 0.0, 1.0, high_inclusive=False)


@dataclasses.dataclass(frozen=True)
class ScheduleConfig(_Section):
    """Learning-rate schedule (see trainer_module.optim.schedules).

    Attributes:
      kind: 'polynomial' (LARS runs) or 'exponential' (RMSProp runs).
      lr_per_256: learning rate per 256 examples; the peak is this times global batch / 256.
      warmup_epochs: linear warmup from 0 to the peak.
      end_lr: absolute rate the polynomial decay ends at (0.1 in the EfficientNet reference).
      polynomial_power: exponent of the polynomial decay.
      decay_epochs: epochs between two exponential decays (staircase).
      decay_rate: factor of each exponential decay.
    """

    kind: str = "exponential"
    lr_per_256: float = 0.016
    warmup_epochs: float = 5.0
    end_lr: float = DEFAULT_END_LEARNING_RATE
    polynomial_power: float = POLYNOMIAL_POWER
    decay_epochs: float = 2.4
    decay_rate: float = 0.97

    def _validate(self):
        SCHEDULES.check(self.kind)
        if self.lr_per_256 <= 0.0:
            raise ValueError(f"schedule.lr_per_256={self.lr_per_256} must be positive")
        if self.warmup_epochs < 0.0:
            raise ValueError(f"schedule.warmup_epochs={self.warmup_epochs} must be >= 0")
        if self.end_lr < 0.0:
            raise ValueError(f"schedule.end_lr={self.end_lr} must be >= 0")
        if self.polynomial_power <= 0.0:
            raise ValueError(f"schedule.polynomial_power={self.polynomial_power} must be positive")
        if self.decay_epochs <= 0.0:
            raise ValueError(f"schedule.decay_epochs={self.decay_epochs} must be positive")
        if not 0.0 < self.decay_rate <= 1.0:
            raise ValueError(f"schedule.decay_rate={self.decay_rate} is outside (0, 1]")


@dataclasses.dataclass(frozen=True)
class AugmentConfig(_Section):
    """Training-image augmentation after the random crop and flip (see trainer_module.data.augment).

    Attributes:
      policy: 'none', 'autoaugment' (policy v0 of the reference) or 'randaugment'.
      num_layers: RandAugment's N, operations applied per image.
      magnitude: RandAugment's M, on the reference's 0..10 level scale (values above 10 extrapolate).
    """

    policy: str = "none"
    num_layers: int = 2
    magnitude: float = 10.0

    def _validate(self):
        AUGMENT_POLICIES.check(self.policy)
        if self.num_layers < 1:
            raise ValueError(f"augment.num_layers={self.num_layers} must be at least 1")
        _check_range("augment.magnitude", self.magnitude, 0.0, 30.0)


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """Dataset sizes, batching and input processing.

    Attributes:
      num_train_examples: training examples per epoch (1,281,167 for ImageNet); the pipeline and the TFX
        Trainer replace it with the count of the shards' manifest.
      num_eval_examples: examples counted per evaluation pass (50,000 for ImageNet); the evaluation set is
        padded up to whole batches and the padding masked out.
      global_batch_size: training examples per step over all replicas.
      eval_batch_size: evaluation examples per step over all replicas; 0 uses ``global_batch_size``.
      num_cores: replicas (TPU cores or devices) that share the global batch.
      replicas_per_host: replicas one host (one input pipeline) feeds: 8 on a TPU v3 host or an 8-GPU
        machine, 1 for a single CPU.
      min_crop_area: smallest random training crop as a fraction of the image (0.08 in the recipe).
      random_flip: random left-right flips in training.
      clip_resized: clip the bicubic resize to [0, 255] (bicubic overshoots at sharp edges); off is the
        reference's unclipped resize (exact reproduction, on in the paper presets), in training, evaluation
        and the exported serving signatures alike.
      eval_crop_padding: pixels P of the evaluation centre crop, which keeps S / (S + P) of the short side;
        None derives P from the 0.875 crop of today's reference (32 at 224, 65 at 456); 32 is the paper-era
        constant (0.934 of the short side at 456).
      label_offset: subtracted from every stored label: 0 for beam_preprocess shards (labels 0..999), 1 for
        shards of tensorflow/tpu's imagenet_to_gcs.py (labels 1..1000).
    """

    num_train_examples: int = schema.NUM_TRAIN_IMAGES
    num_eval_examples: int = schema.NUM_VALIDATION_IMAGES
    global_batch_size: int = 4096
    eval_batch_size: int = 0
    num_cores: int = 128
    replicas_per_host: int = 8
    min_crop_area: float = 0.08
    random_flip: bool = True
    clip_resized: bool = True
    eval_crop_padding: int | None = None
    label_offset: int = 0

    def _validate(self):
        for name in ("num_train_examples", "num_eval_examples", "global_batch_size", "num_cores"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name}={getattr(self, name)} must be at least 1")
        if self.replicas_per_host < 1:
            raise ValueError(f"data.replicas_per_host={self.replicas_per_host} must be at least 1")
        _check_range("data.min_crop_area", self.min_crop_area, 0.0, 1.0)
        if self.min_crop_area <= 0.0:
            raise ValueError(f"data.min_crop_area={self.min_crop_area} must be positive")
        if self.eval_batch_size < 0:
            raise ValueError(f"data.eval_batch_size={self.eval_batch_size} must be >= 0 (0 = training batch)")
        if self.eval_crop_padding is not None and self.eval_crop_padding < 0:
            raise ValueError(f"data.eval_crop_padding={self.eval_crop_padding} must be >= 0 (or none)")


@dataclasses.dataclass(frozen=True)
class LoopConfig(_Section):
    """The train-and-evaluate loop.

    Attributes:
      train_epochs: epoch budget (350 in the paper).
      eval_every_epochs: epochs of training between two evaluations.
      steps_per_loop: training steps per compiled loop call; 0 runs one evaluation interval per call.
      target_top1: stop once evaluation top-1 reaches this; None runs the whole budget.
      strategy: 'tpu', 'multi_worker', 'mirrored' or 'one_device'.
      tpu_name: TPU to resolve when ``strategy`` is 'tpu' ('' = the local / environment default).
      seed: seed of the initial weights, dropout and stochastic depth, and of the training input order, crops
        and augmentation (a resumed run continues the same stream); runs that differ only in it are the
        independent repeats of a recipe.
      deterministic: run TensorFlow's ops deterministically (``enable_op_determinism``) for the training run,
        so that the same seed, data, hardware and software give the same weights and metrics bit for bit.
      stop_at_epoch: end the run at the evaluation of this epoch of the full ``train_epochs`` schedule (a
        truncated run: the learning rate, warmup and decay stay those of the whole budget); None trains the
        whole budget. Running the same config again with a later value resumes it from its checkpoint (bit
        for bit under ``deterministic``): how a tuner screens and continues a trial.
      cpu_threads: the CPU cores the run owns: TensorFlow's op thread pools (intra-op and inter-op) and the
        input pipelines' tf.data pools are sized for this many threads; 0 leaves TensorFlow's default (every
        core the process may run on). Set it when runs share a machine (the large-batch study runs two side by
        side with 1 each) or a container's CPU limit is below the machine's cores; it changes what a step
        costs, not what it computes.
      profile_from_step / profile_steps: trace ``profile_steps`` training steps from step
        ``profile_from_step`` with TensorFlow's profiler into the run's TensorBoard directory (its Profile
        tab, the tensorboard-plugin-profile package); 0 steps traces nothing. A step after the first (which
        traces and compiles the step) shows the steady state.
      summary_every_steps: training steps between two points of the training curves: TensorBoard's
        ``train/`` scalars and the run log's ``train`` records (the loss, the plain cross-entropy, the
        regularisation term, the learning rate and images/s), each point the mean over the steps since the
        previous one. The values are taken inside the compiled loop at every step, so a call of many steps
        still yields a point every N steps, with no extra call and no change to what is trained; evaluations
        are written at every evaluation whatever N is. The run log keeps every point (about 250 bytes each).
    """

    train_epochs: int = 350
    eval_every_epochs: int = 1
    steps_per_loop: int = 0
    target_top1: float | None = None
    strategy: str = "tpu"
    tpu_name: str = ""
    seed: int = 0
    deterministic: bool = False
    stop_at_epoch: int | None = None
    cpu_threads: int = 0
    profile_from_step: int = 0
    profile_steps: int = 0
    summary_every_steps: int = 10

    def _validate(self):
        if self.train_epochs < 1:
            raise ValueError(f"loop.train_epochs={self.train_epochs} must be at least 1")
        if self.eval_every_epochs < 1:
            raise ValueError(f"loop.eval_every_epochs={self.eval_every_epochs} must be at least 1")
        if self.steps_per_loop < 0:
            raise ValueError(
                f"loop.steps_per_loop={self.steps_per_loop} must be >= 0 (0 = one eval interval)"
            )
        if self.target_top1 is not None:
            _check_range("loop.target_top1", self.target_top1, 0.0, 1.0)
        STRATEGIES.check(self.strategy)
        if self.cpu_threads < 0:
            raise ValueError(f"loop.cpu_threads={self.cpu_threads} must be >= 0 (0 = every core)")
        for name in ("profile_from_step", "profile_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"loop.{name}={getattr(self, name)} must be >= 0")
        if self.summary_every_steps < 1:
            raise ValueError(f"loop.summary_every_steps={self.summary_every_steps} must be at least 1")
        stop = self.stop_at_epoch
        if stop is not None and not 1 <= stop <= self.train_epochs:
            raise ValueError(
                f"loop.stop_at_epoch={stop} is outside [1, loop.train_epochs={self.train_epochs}]"
            )
        if stop is not None and stop % self.eval_every_epochs:
            raise ValueError(
                f"loop.stop_at_epoch={stop} is not a multiple of "
                f"loop.eval_every_epochs={self.eval_every_epochs}: a truncated run ends at an evaluation"
            )


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """What a config resolves to: the values the run is laid out by, each under a name of its own.

    Attributes:
      replicas: replicas in sync (``data.num_cores``).
      hosts: input pipelines (hosts) the run expects: replicas / ``data.replicas_per_host``, at least 1.
      per_replica_batch_size: training examples per replica per step.
      steps_per_epoch: examples per epoch / global batch, a float as in the reference.
      warmup_steps: int(warmup epochs x steps per epoch).
      total_steps: int(epochs x steps per epoch).
      stop_step: the step the run ends at: ``total_steps``, or the evaluation step of ``loop.stop_at_epoch``
        (a truncated run).
      steps_per_eval: training steps between two evaluations, a float (eval_every_epochs x steps per epoch);
        evaluations fall on the truncated multiples of it (``next_eval_step``) and on the last step.
      steps_per_loop: training steps per compiled loop call.
      peak_learning_rate: learning rate at the end of warmup, by the linear scaling rule.
      bn_group_replicas: replicas per batch-norm group (``model.bn_group_size`` or its rule's value).
      bn_group_examples: training examples each batch-norm statistic is taken over:
        ``model.bn_virtual_batch``, else the per-replica batch times the group's replicas.
      input_size: input resolution in pixels (``model.image_size`` or the variant's).
      classifier_dropout: dropout before the classifier (``model.dropout_rate`` or the variant's).
      l2_loss_weight: weight of the L2 term in the loss: the weight decay unless LARS applies it (and
        ``optimizer.lars_l2_in_loss`` does not ask for both).
      eval_global_batch_size: evaluation examples per step over all replicas.
      eval_steps: evaluation steps per pass over ``data.num_eval_examples`` (the last batch padded).
      eval_crop_padding_pixels: P of the evaluation centre crop S / (S + P).
    """

    replicas: int
    hosts: int
    per_replica_batch_size: int
    steps_per_epoch: float
    warmup_steps: int
    total_steps: int
    stop_step: int
    steps_per_eval: float
    steps_per_loop: int
    peak_learning_rate: float
    bn_group_replicas: int
    bn_group_examples: int
    input_size: int
    classifier_dropout: float
    l2_loss_weight: float
    eval_global_batch_size: int
    eval_steps: int
    eval_crop_padding_pixels: int

    @property
    def schedule_steps(self) -> ScheduleSteps:
        return ScheduleSteps(self.steps_per_epoch, self.warmup_steps, self.total_steps)

    def next_eval_step(self, step: int) -> int:
        """The first evaluation's step after ``step``: int(k x steps_per_eval) > step, or the last step."""
        k = math.floor(step / self.steps_per_eval) + 1
        while int(k * self.steps_per_eval) <= step:
            k += 1
        return min(self.total_steps, int(k * self.steps_per_eval))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _resolve(config: TrainerConfig) -> TrainingPlan:
    model, data, loop, optimizer = config.model, config.data, config.loop, config.optimizer
    replicas = data.num_cores
    per_replica = data.global_batch_size // replicas
    steps = ScheduleSteps.of(
        data.num_train_examples, data.global_batch_size, config.schedule.warmup_epochs, loop.train_epochs
    )
    steps_per_eval = loop.eval_every_epochs * steps.steps_per_epoch
    input_size = model.image_size or VARIANTS[model.variant].resolution
    eval_batch = data.eval_batch_size or data.global_batch_size
    decays_itself = optimizer.name == "lars" and not optimizer.lars_l2_in_loss
    bn_group_replicas = model.bn_group_size or GROUP_SIZE_RULES.build(
        model.bn_group_rule, replicas, max(per_replica, 1)
    )
    return TrainingPlan(
        replicas=replicas,
        hosts=max(1, replicas // data.replicas_per_host),
        per_replica_batch_size=per_replica,
        steps_per_epoch=steps.steps_per_epoch,
        warmup_steps=steps.warmup_steps,
        total_steps=steps.total_steps,
        # The evaluation of stop_at_epoch falls where next_eval_step puts it: int(k x steps_per_eval).
        stop_step=steps.total_steps
        if loop.stop_at_epoch in (None, loop.train_epochs)
        else min(steps.total_steps, int(loop.stop_at_epoch // loop.eval_every_epochs * steps_per_eval)),
        steps_per_eval=steps_per_eval,
        steps_per_loop=loop.steps_per_loop or math.ceil(steps_per_eval),
        peak_learning_rate=scaled_learning_rate(config.schedule.lr_per_256, data.global_batch_size),
        bn_group_replicas=bn_group_replicas,
        bn_group_examples=model.bn_virtual_batch or per_replica * bn_group_replicas,
        input_size=input_size,
        classifier_dropout=VARIANTS[model.variant].dropout
        if model.dropout_rate is None
        else model.dropout_rate,
        l2_loss_weight=0.0 if decays_itself else optimizer.weight_decay,
        eval_global_batch_size=eval_batch,
        eval_steps=math.ceil(data.num_eval_examples / eval_batch),
        eval_crop_padding_pixels=eval_crop_padding(input_size)
        if data.eval_crop_padding is None
        else data.eval_crop_padding,
    )


@dataclasses.dataclass(frozen=True)
class TrainerConfig(_Section):
    """The whole trainer stage: plain settings in sections; ``plan`` holds what they resolve to.

    Attributes:
      name: label of the run (the preset's name, or 'custom').
      model, optimizer, schedule, augment, data, loop: the sections.
    """

    name: str = "custom"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    loop: LoopConfig = dataclasses.field(default_factory=LoopConfig)

    @functools.cached_property
    def plan(self) -> TrainingPlan:
        """The resolved values (computed once per config; the config itself is immutable)."""
        return _resolve(self)

    def _validate(self):
        data = self.data
        if data.global_batch_size % data.num_cores:
            raise ValueError(
                f"data.global_batch_size={data.global_batch_size} is not divisible by "
                f"data.num_cores={data.num_cores}"
            )
        if data.num_cores > data.replicas_per_host and data.num_cores % data.replicas_per_host:
            raise ValueError(
                f"data.num_cores={data.num_cores} is not a multiple of "
                f"data.replicas_per_host={data.replicas_per_host}: every host must feed the same replicas"
            )
        plan = self.plan
        if plan.eval_global_batch_size % data.num_cores:
            raise ValueError(
                f"data.eval_batch_size={plan.eval_global_batch_size} is not divisible by "
                f"data.num_cores={data.num_cores}"
            )
        if data.global_batch_size > data.num_train_examples:
            raise ValueError(
                f"data.global_batch_size={data.global_batch_size} exceeds "
                f"data.num_train_examples={data.num_train_examples}: an epoch would have no step"
            )
        if data.num_cores % plan.bn_group_replicas:
            how = (
                "model.bn_group_size"
                if self.model.bn_group_size
                else f"the batch-norm group size derived by model.bn_group_rule={self.model.bn_group_rule!r}"
            )
            raise ValueError(
                f"{how}={plan.bn_group_replicas} does not divide data.num_cores={data.num_cores}; "
                "set model.bn_group_size to a divisor of the replica count"
            )
        virtual = self.model.bn_virtual_batch
        if virtual is not None and (plan.bn_group_replicas != 1 or plan.per_replica_batch_size % virtual):
            raise ValueError(
                f"model.bn_virtual_batch={virtual} must divide the per-replica batch "
                f"({plan.per_replica_batch_size}) in batch-norm groups of one replica (here "
                f"{plan.bn_group_replicas}; set model.bn_group_size=1)"
            )
        if self.schedule.kind == "polynomial":
            if plan.warmup_steps >= plan.total_steps:
                raise ValueError(
                    f"schedule.warmup_epochs={self.schedule.warmup_epochs} leaves no steps to decay: "
                    f"{plan.warmup_steps} warmup steps >= {plan.total_steps} total steps "
                    f"(loop.train_epochs={self.loop.train_epochs})"
                )
            if self.schedule.end_lr > plan.peak_learning_rate:
                raise ValueError(
                    f"schedule.end_lr={self.schedule.end_lr} exceeds the peak learning rate "
                    f"{plan.peak_learning_rate:g} (schedule.lr_per_256={self.schedule.lr_per_256} at batch "
                    f"{data.global_batch_size}): lower schedule.end_lr"
                )
        if self.loop.eval_every_epochs > self.loop.train_epochs:
            raise ValueError(
                f"loop.eval_every_epochs={self.loop.eval_every_epochs} exceeds "
                f"loop.train_epochs={self.loop.train_epochs}: the run would never evaluate"
            )

    def to_json(self) -> str:
        """JSON of the stored settings; ``TrainerConfig.from_json`` restores an equal config."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        """Parses ``to_json`` output. Unknown keys raise naming the key; missing keys take defaults."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"trainer config is not valid JSON: {error}") from error
        return cls.from_dict(values)


SECTION_NAMES = {
    ModelConfig: "model",
    OptimizerConfig: "optimizer",
    ScheduleConfig: "schedule",
    AugmentConfig: "augment",
    DataConfig: "data",
    LoopConfig: "loop",
}

_TRUE_WORDS = ("true", "1", "yes", "on")
_FALSE_WORDS = ("false", "0", "no", "off")
_NONE_WORDS = ("none", "null")


def _parse_value(key: str, text: str, annotation):
    """Parses an override's text by the field's annotation, naming the key on failure."""
    allowed = _allowed_types(annotation)
    lowered = text.strip().lower()
    if type(None) in allowed and lowered in _NONE_WORDS:
        return None
    value_type = next(t for t in allowed if t is not type(None))
    if value_type is bool:
        if lowered in _TRUE_WORDS:
            return True
        if lowered in _FALSE_WORDS:
            return False
        raise ValueError(f"override {key}={text!r}: expected a bool (true/false)")
    if value_type is str:
        return text
    try:
        return value_type(text)
    except ValueError:
        raise ValueError(f"override {key}={text!r}: expected {_type_names(allowed)}") from None


def setting_field(key: str) -> tuple[str, str, object]:
    """(section, field, annotation) of a dotted setting key: 'optimizer.weight_decay', or 'name' at the top.

    The one place that reads 'section.field' keys: ``--set`` strings, ``replace``, ``setting`` and the tuning
    space all go through it.

    Raises:
      ValueError: an unknown section or field, naming the key and what is known there.
    """
    key = key.strip()
    section_name, dot, field_name = key.rpartition(".")
    sections = {name: section for section, name in SECTION_NAMES.items()}
    if not dot:
        target_type = TrainerConfig
    elif section_name in sections:
        target_type = sections[section_name]
    else:
        raise ValueError(
            f"override {key!r}: unknown config section {section_name!r}; sections are {', '.join(sections)}"
        )
    fields = {
        field.name
        for field in dataclasses.fields(target_type)
        if not (target_type is TrainerConfig and field.name in sections)
    }
    if field_name not in fields:
        raise ValueError(f"override {key!r}: unknown config field; known here: {', '.join(sorted(fields))}")
    return section_name, field_name, typing.get_type_hints(target_type)[field_name]


def setting(config: TrainerConfig, key: str):
    """The value of a dotted setting key in ``config`` ('data.global_batch_size' -> 4096)."""
    section_name, field_name, _ = setting_field(key)
    return getattr(getattr(config, section_name) if section_name else config, field_name)


def replace(config: TrainerConfig, changes: Mapping[str, object]) -> TrainerConfig:
    """A copy of ``config`` with typed values at dotted keys: ``replace(config, {"loop.train_epochs": 3})``.

    How code changes a config. Each value is checked as ``--set`` checks it (its field's type, then the
    section's and the config's rules), so derived values and cross-checks follow the change.

    Raises:
      ValueError: an unknown key, or a value the config's rules refuse, naming the key.
      TypeError: a value of the wrong type (a string for a number, a bool for an int), naming the key.
    """
    sections: dict[str, dict] = {}
    top_level = {}
    for key, value in changes.items():
        section_name, field_name, _ = setting_field(key)
        if section_name:
            sections.setdefault(section_name, {})[field_name] = value
        else:
            top_level[field_name] = value
    replaced = {
        name: dataclasses.replace(getattr(config, name), **fields) for name, fields in sections.items()
    }
    return dataclasses.replace(config, **replaced, **top_level)


def parse_overrides(overrides: Iterable[str]) -> dict[str, object]:
    """The typed values of 'section.field=value' strings (what a person types after ``--set``), by key.

    Values are parsed by the field's type (int, float, bool as true/false, str; 'none' for optional fields).

    Raises:
      ValueError: an override without '=', an unknown key, or text that is not of the field's type.
    """
    values = {}
    for override in overrides:
        key, separator, text = override.partition("=")
        if not separator:
            raise ValueError(f"override {override!r} is not of the form section.field=value")
        key = key.strip()
        values[key] = parse_setting(key, text)
    return values


def parse_setting(key: str, text: str):
    """The typed value of one setting given as text ('loop.deterministic', 'true' -> True), parsed by the
    field's type as ``--set`` parses it (a tuning space's choices given as text).

    Raises:
      ValueError: an unknown key, or text that is not of the field's type, naming the key.
    """
    return _parse_value(key, text, setting_field(key)[2])


def with_overrides(config: TrainerConfig, overrides: Iterable[str]) -> TrainerConfig:
    """A copy of ``config`` with the ``--set`` strings a person typed applied ('optimizer.weight_decay=1e-4').

    Code that changes a config passes typed values to ``replace``; this parses text first.

    Raises:
      ValueError: an override without '=', an unknown section or field, or a value of the wrong type.
    """
    return replace(config, parse_overrides(overrides))
