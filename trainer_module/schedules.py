"""Learning-rate schedules of the large-batch EfficientNet recipe.

Two shapes, both starting with a linear warmup from 0 to the peak learning rate:

* ``WarmupPolynomialDecay``: the LARS runs. After warmup the rate falls as a power-2 polynomial from the peak
  to an end rate over the remaining steps (the ResNet/MLPerf LARS schedule).
* ``WarmupExponentialDecay``: the original RMSProp recipe. The rate is multiplied by 0.97 every 2.4 epochs
  (staircase), counted from step 0 as tensorflow/tpu ``efficientnet/utils.py::build_learning_rate`` does.

The peak follows the linear scaling rule, ``scaled_learning_rate``. Both schedules are Keras
``LearningRateSchedule`` objects registered for serialisation, so an optimizer that holds one survives
``get_config`` / ``from_config`` and model saving.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import tensorflow as tf

if TYPE_CHECKING:
    from trainer_module.config import TrainerConfig

# Linear scaling rule: learning rates are quoted per 256 examples of global batch.
REFERENCE_BATCH_SIZE = 256
# End rate of the polynomial decay in the ResNet/MLPerf LARS code (tf.compat.v1 polynomial_decay's default).
DEFAULT_END_LEARNING_RATE = 1e-4
POLYNOMIAL_POWER = 2.0


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


def _linear_warmup(step: tf.Tensor, peak: float, warmup_steps: int) -> tf.Tensor:
    # max(1, .) keeps the division finite when warmup is off; the warmup branch is then never selected.
    return peak * step / float(max(warmup_steps, 1))


@keras.saving.register_keras_serializable(package="trainer_module")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to a peak, then polynomial decay to an end rate.

    For step s (0-based, the optimizer's iteration count), with W warmup steps and T total steps::

        s <  W:      lr = peak * s / W
        W <= s:      p  = min(s - W, T - W) / (T - W)
                     lr = (peak - end) * (1 - p) ** power + end

    The decay starts when warmup ends and is clamped at ``end_learning_rate`` from step T on. The reference
    ResNet LARS code decays over ``T - W + 1`` steps counted from ``max(1, s - W)``; that off-by-one is not
    reproduced (it moves the curve by less than one step).

    Args:
      peak_learning_rate: rate reached at the end of warmup.
      warmup_steps: length of the linear warmup; 0 starts at the peak.
      total_steps: step at which the end rate is reached; must exceed ``warmup_steps``.
      end_learning_rate: rate held from ``total_steps`` on (1e-4 in the ResNet/MLPerf code).
      power: exponent of the decay (2 in the recipe).
      name: name of the schedule.
    """

    def __init__(
        self,
        peak_learning_rate: float,
        warmup_steps: int,
        total_steps: int,
        end_learning_rate: float = DEFAULT_END_LEARNING_RATE,
        power: float = POLYNOMIAL_POWER,
        name: str = "warmup_polynomial_decay",
    ):
        super().__init__()
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if total_steps <= warmup_steps:
            raise ValueError(
                f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps}): no steps left to decay"
            )
        if end_learning_rate > peak_learning_rate:
            raise ValueError(
                f"end_learning_rate ({end_learning_rate}) exceeds peak_learning_rate ({peak_learning_rate})"
            )
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.name = name

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = _linear_warmup(step, self.peak_learning_rate, self.warmup_steps)
        decay_steps = float(self.total_steps - self.warmup_steps)
        progress = tf.clip_by_value((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        decayed = (self.peak_learning_rate - self.end_learning_rate) * (
            1.0 - progress
        ) ** self.power + self.end_learning_rate
        return tf.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "name": self.name,
        }


@keras.saving.register_keras_serializable(package="trainer_module")
class WarmupExponentialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to a peak, then staircase exponential decay counted from step 0.

    For step s (0-based), with W warmup steps and a decay every D steps (D may be fractional: 2.4 epochs)::

        s <  W:      lr = peak * s / W
        W <= s:      lr = peak * decay_rate ** floor(s / D)

    The exponent counts from step 0, not from the end of warmup, as in tensorflow/tpu
    ``efficientnet/utils.py::build_learning_rate`` (an exponential decay of the global step that the warmup
    branch merely masks). With 5 warmup epochs and D = 2.4 epochs the first post-warmup rate is therefore
    ``peak * 0.97 ** 2``.

    Args:
      peak_learning_rate: rate reached at the end of warmup (before decay factors).
      warmup_steps: length of the linear warmup; 0 disables it.
      decay_steps: steps between two decays (``2.4 * steps_per_epoch`` in the recipe); may be fractional.
      decay_rate: factor applied at every decay (0.97 in the recipe).
      name: name of the schedule.
    """

    def __init__(
        self,
        peak_learning_rate: float,
        warmup_steps: int,
        decay_steps: float,
        decay_rate: float = 0.97,
        name: str = "warmup_exponential_decay",
    ):
        super().__init__()
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if decay_steps <= 0:
            raise ValueError(f"decay_steps must be positive, got {decay_steps}")
        if not 0.0 < decay_rate <= 1.0:
            raise ValueError(f"decay_rate must be in (0, 1], got {decay_rate}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.decay_steps = float(decay_steps)
        self.decay_rate = float(decay_rate)
        self.name = name

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = _linear_warmup(step, self.peak_learning_rate, self.warmup_steps)
        decayed = self.peak_learning_rate * tf.pow(self.decay_rate, tf.floor(step / self.decay_steps))
        return tf.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "name": self.name,
        }


def build_schedule(config: TrainerConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """The learning-rate schedule a trainer config asks for.

    Args:
      config: a ``trainer_module.config.TrainerConfig``; its ``schedule.kind`` picks the shape and its derived
        values (peak learning rate, warmup/total/decay steps) parameterise it.

    Returns:
      A ``WarmupPolynomialDecay`` ('polynomial') or ``WarmupExponentialDecay`` ('exponential').
    """
    kind = config.schedule.kind
    if kind == "polynomial":
        return WarmupPolynomialDecay(
            peak_learning_rate=config.peak_learning_rate,
            warmup_steps=config.warmup_steps,
            total_steps=config.total_steps,
            end_learning_rate=config.schedule.end_lr,
            power=config.schedule.polynomial_power,
        )
    if kind == "exponential":
        return WarmupExponentialDecay(
            peak_learning_rate=config.peak_learning_rate,
            warmup_steps=config.warmup_steps,
            decay_steps=config.decay_steps,
            decay_rate=config.schedule.decay_rate,
        )
    raise ValueError(f"schedule.kind={kind!r} is not one of 'polynomial', 'exponential'")
