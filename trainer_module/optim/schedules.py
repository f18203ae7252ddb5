"""Learning-rate schedules of the large-batch EfficientNet recipe, laid out as tensorflow/tpu's code has them.

Two shapes, both starting with a linear warmup from 0 to the peak learning rate:

* ``WarmupPolynomialDecay``: the LARS runs. After warmup the rate falls as a power-2 polynomial from the peak
  to an absolute end rate of 0.1 (``efficientnet/utils.py::build_learning_rate``, ``lr_decay_type='poly'``).
* ``WarmupExponentialDecay``: the original RMSProp recipe. The rate is multiplied by 0.97 every 2.4 epochs
  (staircase), counted from step 0 as the same function does.

The peak follows the linear scaling rule, ``scaled_learning_rate``. Step counts come from the run
(``ScheduleSteps``: steps per epoch as a float, warmup and total steps truncated as the reference does). The
``SCHEDULES`` registry maps ``schedule.kind`` to the builder; both schedules are Keras
``LearningRateSchedule`` objects registered for serialisation, so an optimizer that holds one survives
``get_config`` / ``from_config`` and model saving.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainer_module.choices import SCHEDULES
from trainer_module.config import (  # noqa: F401 (the schedule arithmetic's home is the config's plan)
    DEFAULT_END_LEARNING_RATE,
    POLYNOMIAL_POWER,
    REFERENCE_BATCH_SIZE,
    ScheduleConfig,
    ScheduleSteps,
    scaled_learning_rate,
)


def _linear_warmup(step: tf.Tensor, peak: float, warmup_steps: int) -> tf.Tensor:
    # max(1, .) keeps the division finite when warmup is off; the warmup branch is then never selected.
    return peak * step / float(max(warmup_steps, 1))


@keras.saving.register_keras_serializable(package="trainer_module")
class WarmupPolynomialDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to a peak, then power-2 polynomial decay to an absolute end rate (the reference's form).

    For step s (0-based, the optimizer's iteration count), with W warmup steps and T total steps::

        s <  W:      lr = peak * s / W
        W <= s:      d  = max(1, s - W),  D = T - W + 1
                     lr = (peak - end) * (1 - min(d, D) / D) ** power + end

    which is ``tf.compat.v1.train.polynomial_decay`` as tensorflow/tpu's EfficientNet ``build_learning_rate``
    calls it: the decay counts from ``max(1, s - W)`` over ``T - W + 1`` steps, so the first post-warmup step
    is already one decay step in, and the rate reaches ``end`` one step after T (it is clamped there).

    Args:
      peak_learning_rate: rate reached at the end of warmup.
      warmup_steps: length of the linear warmup; 0 starts at the peak.
      total_steps: T above; must exceed ``warmup_steps``.
      end_learning_rate: absolute rate the decay ends at (0.1 in the EfficientNet reference).
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
                f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps}): "
                "no steps left to decay"
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
        decay_steps = float(self.total_steps - self.warmup_steps + 1)
        decayed_steps = tf.minimum(tf.maximum(1.0, step - self.warmup_steps), decay_steps)
        decayed = (self.peak_learning_rate - self.end_learning_rate) * (
            1.0 - decayed_steps / decay_steps
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


@SCHEDULES.register("polynomial")
def _polynomial(section: ScheduleConfig, peak_learning_rate: float, steps: ScheduleSteps):
    return WarmupPolynomialDecay(
        peak_learning_rate,
        warmup_steps=steps.warmup_steps,
        total_steps=steps.total_steps,
        end_learning_rate=section.end_lr,
        power=section.polynomial_power,
    )


@SCHEDULES.register("exponential")
def _exponential(section: ScheduleConfig, peak_learning_rate: float, steps: ScheduleSteps):
    return WarmupExponentialDecay(
        peak_learning_rate,
        warmup_steps=steps.warmup_steps,
        decay_steps=section.decay_epochs * steps.steps_per_epoch,
        decay_rate=section.decay_rate,
    )


def build_schedule(
    section: ScheduleConfig, peak_learning_rate: float, steps: ScheduleSteps
) -> keras.optimizers.schedules.LearningRateSchedule:
    """The learning-rate schedule of a config's ``schedule`` section laid out on the run's step counts.

    Args:
      section: the ``schedule`` section; ``kind`` picks the shape from ``SCHEDULES``.
      peak_learning_rate: the rate at the end of warmup (``scaled_learning_rate`` of the global batch).
      steps: steps per epoch, warmup and total steps of the run.
    """
    return SCHEDULES.build(section.kind, section, peak_learning_rate, steps)
