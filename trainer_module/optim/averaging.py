"""Exponential moving average of the weights, as the EfficientNet reference keeps it.

The reference wraps its train op in ``tf.train.ExponentialMovingAverage(0.9999, num_updates=global_step)``:
after the optimizer step that brings the step counter to t, every averaged variable a of a weight w becomes

    decay_t = min(decay, (1 + t) / (10 + t))
    a       = decay_t * a + (1 - decay_t) * w

so early averages follow the weights closely (decay 0.18 after the first step, 0.9 after 80); a fixed 0.9999
from the first step (Keras' ``use_ema``) would leave half the average on the initial weights after the 6,842
steps of the B5 batch-65536 run. The averages start as copies of the initial weights and cover the trainable
weights and the batch-norm moving statistics (the reference's ``trainable_variables() + moving_*``), so an
evaluation with the averages normalises with statistics that match the averaged weights. Evaluation, the
target check and the export swap them in (``swapped()``); a ``tf.Module``, they travel in the checkpoint.
"""

from __future__ import annotations

import contextlib
import re

import keras
import tensorflow as tf

# Non-trainable variables the average also covers: batch-norm moving statistics, by their Keras names.
MOVING_STATISTICS = re.compile(r"(^|/)moving_(mean|variance)$")


def averaged_variables(model: keras.Model) -> list:
    """The model's trainable weights and batch-norm moving statistics, in a stable order."""
    statistics = [v for v in model.non_trainable_variables if MOVING_STATISTICS.search(v.path)]
    return list(model.trainable_variables) + statistics


def decay_at(step, decay: float):
    """min(decay, (1 + t) / (10 + t)) for the step counter t after the update (float32 tensor)."""
    step = tf.cast(step, tf.float32)
    return tf.minimum(tf.constant(decay, tf.float32), (1.0 + step) / (10.0 + step))


def _tensor_variable(variable):
    """The tf.Variable (distributed or not) behind a Keras variable."""
    return getattr(variable, "value", variable) if isinstance(variable, keras.Variable) else variable


class _Untracked:
    """Holds the averaged weights out of the module's checkpoint (the model saves them already)."""

    def __init__(self, variables):
        self.variables = list(variables)


class WeightAverage(tf.Module):
    """Moving averages of ``variables`` with the reference's warm-up of the decay.

    Create it under the strategy's scope, after the model is built, so the averages are mirrored like the
    weights. ``update`` and ``swap`` run in cross-replica context (outside ``strategy.run``); each replica's
    copy is updated from its own weights, which every replica holds identically.

    Args:
      variables: the variables to average (``averaged_variables(model)``).
      decay: the decay the warm-up approaches (0.9999 in the paper), in (0, 1).
    """

    def __init__(self, variables, decay: float):
        super().__init__(name="weight_average")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the moving-average decay must be in (0, 1), got {decay}")
        self.decay = float(decay)
        # The strategy the averages are created under; update and swap may run outside its scope.
        self._strategy = tf.distribute.get_strategy()
        self._weights = _Untracked(_tensor_variable(v) for v in variables)
        self.averages = [
            tf.Variable(
                tf.identity(w.read_value()),
                trainable=False,
                name="average",
                synchronization=tf.VariableSynchronization.ON_WRITE,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            for w in self._weights.variables
        ]

    def update(self, step) -> None:
        """One averaging step after the optimizer step that brought the step counter to ``step``."""
        decay = decay_at(step, self.decay)

        def blend(average, weight):
            return average.assign_sub((1.0 - tf.cast(decay, average.dtype)) * (average - weight))

        for average, weight in zip(self.averages, self._weights.variables, strict=True):
            self._strategy.extended.update(average, blend, args=(weight,), group=False)

    def swap(self) -> None:
        """Exchanges the weights with their averages (called twice, it restores the weights)."""

        def exchange(average, weight):
            held = tf.identity(weight)
            weight.assign(average)
            return average.assign(held)

        for average, weight in zip(self.averages, self._weights.variables, strict=True):
            self._strategy.extended.update(average, exchange, args=(weight,), group=False)

    @contextlib.contextmanager
    def swapped(self):
        """The averages in the model for the duration of the block (evaluation), the weights after it."""
        self.swap()
        try:
            yield
        finally:
            self.swap()
