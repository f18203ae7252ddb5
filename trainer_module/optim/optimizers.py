"""Optimizers of the recipe: LARS for the large-batch runs, RMSProp for the original baseline.

RMSProp comes in two forms (``optimizer.rmsprop_form``): Keras' ``RMSprop`` and ``TF1RMSProp``, the
reference's ``tf.compat.v1.train.RMSPropOptimizer``, whose accumulator starts at 1 instead of 0.

``build_optimizer`` turns the optimizer section of the trainer config plus a learning-rate schedule into a
Keras 3 optimizer; ``OPTIMIZERS`` is the registry of the accepted ``optimizer.name`` values. Weight
averaging is not the optimizer's business here (see ``trainer_module.optim.averaging``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import keras
import tensorflow as tf

from trainer_module.choices import OPTIMIZERS, RMSPROP_FORMS
from trainer_module.config import OptimizerConfig

# Regular expressions searched (case-insensitively) in a variable's path, e.g. 'block1a_bn/gamma'.
# Batch-norm layers are named '*_bn' in the EfficientNet graph ('stem_bn', 'block1a_project_bn', 'top_bn');
# 'batch_?norm' catches Keras' default 'batch_normalization' and other norm layers; gamma/beta as the leaf
# name catch normalisation scales and offsets under any layer name; 'bias' catches every bias.
DEFAULT_EXCLUDE = (r"bn/", r"batch_?norm", r"(^|/)(gamma|beta)$", r"bias")
# The batch-norm patterns alone: what the reference's L2 term leaves out (it decays biases).
BATCH_NORM_PATTERNS = DEFAULT_EXCLUDE[:3]


def is_excluded(variable_path: str, patterns: Sequence[str] = DEFAULT_EXCLUDE) -> bool:
    """Whether LARS leaves a variable out of trust scaling and weight decay.

    Args:
      variable_path: the variable's ``path`` (Keras 3, e.g. 'block1a_bn/gamma') or name.
      patterns: regular expressions; the variable is excluded when any of them is found in the path.
    """
    return any(re.search(pattern, variable_path, flags=re.IGNORECASE) for pattern in patterns)


def _variable_path(variable) -> str:
    # Keras variables carry their layer path; a bare tf.Variable only has 'name:0'.
    return getattr(variable, "path", None) or variable.name


@keras.saving.register_keras_serializable(package="trainer_module")
class LARS(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al., arXiv 1708.03888), in the tensorflow/tpu form.

    For every variable w with gradient g, learning rate lr (the schedule's value at this step), momentum m,
    weight decay wd, trust coefficient ``eeta`` and ``epsilon``; norms are L2 norms over the whole tensor::

        trust = eeta * ||w|| / (||g|| + wd * ||w|| + epsilon)    (1.0 when ||w|| == 0 or ||g|| == 0)
        g'    = g + wd * w
        v     = m * v + lr * trust * g'
        w     = w - v                                            (nesterov: w = w - (lr * trust * g' + m * v))

    Variables whose path matches ``exclude`` (batch-norm gamma/beta and biases by default) get neither trust
    scaling nor weight decay: ``v = m * v + lr * g``, then the same step on w. This is the update of
    tensorflow/tpu ``efficientnet/lars_optimizer.py`` (the code behind the paper), not Model Garden's, which
    takes the trust ratio as ``eeta * ||w|| / ||g + wd * w||``.

    Weight decay is applied here, inside the update, and only here: the loss must carry no L2 term when LARS
    is used. The reference adds ``weight_decay * L2`` to the loss as well, which decays the weights twice.
    Keras' own decoupled ``weight_decay`` stays off (``self.weight_decay`` is None); the LARS value is
    ``self.lars_weight_decay`` and is saved as ``weight_decay`` by ``get_config``.

    Under ``tf.distribute`` the optimizer sums the replicas' gradients before the update (Keras' behaviour),
    so each replica must pass its share of the global-batch mean, e.g. the gradient of a loss divided by the
    global batch size. Build the optimizer (``optimizer.build(model.trainable_variables)``) under the
    strategy's scope before calling ``apply_gradients`` inside ``strategy.run``.

    Args:
      learning_rate: float or ``keras.optimizers.schedules.LearningRateSchedule``; the base rate before trust
        scaling.
      momentum: momentum coefficient m, in [0, 1).
      weight_decay: wd above, >= 0; 1e-5 in the EfficientNet recipe.
      eeta: LARS trust coefficient (0.001 in the paper).
      epsilon: added to the trust ratio's denominator; 0 in the reference.
      nesterov: use the Nesterov form of the momentum step.
      exclude: regular expressions matched against each variable's path (see ``is_excluded``).
      name: optimizer name.
      **kwargs: other ``keras.optimizers.Optimizer`` arguments (clipnorm, use_ema, loss_scale_factor, ...).
    """

    def __init__(
        self,
        learning_rate,
        momentum: float = 0.9,
        weight_decay: float = 1e-5,
        eeta: float = 0.001,
        epsilon: float = 0.0,
        nesterov: bool = False,
        exclude: Sequence[str] = DEFAULT_EXCLUDE,
        name: str = "LARS",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, weight_decay=None, name=name, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"LARS momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"LARS weight_decay must be >= 0, got {weight_decay}")
        if eeta <= 0.0:
            raise ValueError(f"LARS eeta must be positive, got {eeta}")
        if epsilon < 0.0:
            raise ValueError(f"LARS epsilon must be >= 0, got {epsilon}")
        for pattern in exclude:
            re.compile(pattern)  # Fail here, not at the first step, on a malformed pattern.
        self.momentum = float(momentum)
        self.lars_weight_decay = float(weight_decay)
        self.eeta = float(eeta)
        self.epsilon = float(epsilon)
        self.nesterov = bool(nesterov)
        self.exclude = tuple(exclude)

    def build(self, variables):
        """Creates one momentum slot per variable and decides, once, which variables are excluded."""
        if self.built:
            return
        super().build(variables)
        self.momentums = self.add_optimizer_variables(variables, "momentum")
        # Decided from the path at build time: inside a distributed update the variable seen by update_step
        # is a per-device component that no longer carries the Keras path.
        self._excluded = [is_excluded(_variable_path(v), self.exclude) for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        """Applies one LARS step to ``variable`` (see the class docstring for the rule)."""
        index = self._get_variable_index(variable)
        velocity = self.momentums[index]
        dtype = variable.dtype
        learning_rate = tf.cast(learning_rate, dtype)
        gradient = tf.cast(gradient, dtype)
        momentum = tf.cast(self.momentum, dtype)

        if self._excluded[index]:
            scaled_gradient = learning_rate * gradient
        else:
            weights = tf.convert_to_tensor(variable)
            weight_decay = tf.cast(self.lars_weight_decay, dtype)
            weight_norm = tf.norm(weights)
            gradient_norm = tf.norm(gradient)
            both_nonzero = tf.logical_and(weight_norm > 0.0, gradient_norm > 0.0)
            # The ratio is only selected where both norms are positive, so its denominator is positive there.
            ratio = self.eeta * weight_norm / (gradient_norm + weight_decay * weight_norm + self.epsilon)
            trust = tf.where(both_nonzero, ratio, tf.ones_like(ratio))
            scaled_gradient = learning_rate * trust * (gradient + weight_decay * weights)

        new_velocity = momentum * velocity + scaled_gradient
        self.assign(velocity, new_velocity)
        if self.nesterov:
            self.assign_sub(variable, scaled_gradient + momentum * new_velocity)
        else:
            self.assign_sub(variable, new_velocity)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "momentum": self.momentum,
                "weight_decay": self.lars_weight_decay,
                "eeta": self.eeta,
                "epsilon": self.epsilon,
                "nesterov": self.nesterov,
                "exclude": list(self.exclude),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="trainer_module")
class TF1RMSProp(keras.optimizers.Optimizer):
    """RMSProp exactly as the reference ran it: ``tf.compat.v1.train.RMSPropOptimizer`` (non-centred).

    For every variable w with gradient g, learning rate lr, decay ``rho``, momentum m and ``epsilon``, the
    update of TF1's ``ApplyRMSProp`` kernel::

        ms  = rho * ms + (1 - rho) * g^2          (ms starts at 1.0)
        mom = m * mom + lr * g / sqrt(ms + epsilon)
        w   = w - mom

    It differs from Keras 3's ``RMSprop`` in one place only: TF1 starts the mean-square accumulator ``ms`` at
    ones (``rmsprop.py::_create_slots``, ``init_ops.ones_initializer``), Keras at zeros. Both keep epsilon
    under the square root. With zeros, the first step divides g by sqrt((1 - rho) g^2 + eps): every weight
    whose gradient is well above sqrt(eps / (1 - rho)) (0.1 in the recipe) moves by about 3.2 lr whatever the
    size of its gradient, and momentum 0.9 carries that on for ten steps. With ones, the first steps are plain
    momentum SGD (g / ~1), and the accumulator forgets its start as rho^t (0.12 after 20 steps, 0.01 after
    44): an implicit warm-up of a few dozen steps, negligible in the paper's thousands of steps but not in a
    run of a few hundred.

    Weight decay is an L2 term in the loss, as in the reference (``TrainingPlan.l2_loss_weight``). Under
    ``tf.distribute`` the same contract as ``LARS`` holds: Keras sums the replicas' gradients, so each replica
    passes its share of the global-batch mean; build under the strategy's scope.

    Args:
      learning_rate: float or ``keras.optimizers.schedules.LearningRateSchedule``.
      rho: discounting factor of the mean square of gradients ("decay" in TF1), in [0, 1).
      momentum: momentum coefficient, in [0, 1).
      epsilon: added to the mean square under the square root, > 0 (0.001 in the EfficientNet recipe).
      name: optimizer name.
      **kwargs: other ``keras.optimizers.Optimizer`` arguments (clipnorm, loss_scale_factor, ...).
    """

    # The accumulator's start in tf.compat.v1.train.RMSPropOptimizer.
    INITIAL_MEAN_SQUARE = 1.0

    def __init__(
        self,
        learning_rate,
        rho: float = 0.9,
        momentum: float = 0.9,
        epsilon: float = 1e-3,
        name: str = "TF1RMSProp",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0.0 <= rho < 1.0:
            raise ValueError(f"RMSProp rho must be in [0, 1), got {rho}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"RMSProp momentum must be in [0, 1), got {momentum}")
        if epsilon <= 0.0:
            raise ValueError(f"RMSProp epsilon must be positive, got {epsilon}")
        self.rho = float(rho)
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)

    def build(self, variables):
        """Creates the mean-square slot (at ones) and the momentum slot (at zeros) of every variable."""
        if self.built:
            return
        super().build(variables)
        self.mean_squares = self.add_optimizer_variables(
            variables, "mean_square", initializer=keras.initializers.Constant(self.INITIAL_MEAN_SQUARE)
        )
        self.momentums = self.add_optimizer_variables(variables, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        """Applies one TF1 RMSProp step to ``variable`` (see the class docstring for the rule)."""
        index = self._get_variable_index(variable)
        mean_square = self.mean_squares[index]
        velocity = self.momentums[index]
        dtype = variable.dtype
        learning_rate = tf.cast(learning_rate, dtype)
        gradient = tf.cast(gradient, dtype)
        rho = tf.cast(self.rho, dtype)

        new_mean_square = rho * mean_square + (1.0 - rho) * tf.square(gradient)
        self.assign(mean_square, new_mean_square)
        new_velocity = tf.cast(self.momentum, dtype) * velocity + learning_rate * gradient * tf.math.rsqrt(
            new_mean_square + tf.cast(self.epsilon, dtype)
        )
        self.assign(velocity, new_velocity)
        self.assign_sub(variable, new_velocity)

    def get_config(self):
        config = super().get_config()
        config.update({"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon})
        return config


@RMSPROP_FORMS.register("tf1")
def _tf1_rmsprop(learning_rate, **settings):
    return TF1RMSProp(learning_rate, **settings)


@RMSPROP_FORMS.register("keras")
def _keras_rmsprop(learning_rate, **settings):
    return keras.optimizers.RMSprop(learning_rate=learning_rate, name="RMSprop", **settings)


def rmsprop(
    learning_rate,
    rho: float = 0.9,
    momentum: float = 0.9,
    epsilon: float = 1e-3,
    form: str = "keras",
    **kwargs,
):
    """RMSProp with the original EfficientNet recipe's settings (decay 0.9, momentum 0.9, epsilon 0.001).

    Args:
      learning_rate: float or ``LearningRateSchedule``.
      rho: discounting factor of the mean square of gradients ("decay" in TF1).
      momentum: momentum coefficient.
      epsilon: added to the mean square under the square root (in both forms).
      form: 'keras' for ``keras.optimizers.RMSprop`` (accumulator starts at 0), 'tf1' for ``TF1RMSProp``,
        the reference's ``tf.compat.v1.train.RMSPropOptimizer`` (accumulator starts at 1).
      **kwargs: other optimizer arguments.
    """
    return RMSPROP_FORMS.build(form, learning_rate, rho=rho, momentum=momentum, epsilon=epsilon, **kwargs)


@OPTIMIZERS.register("lars")
def _lars(section: OptimizerConfig, learning_rate):
    return LARS(
        learning_rate,
        momentum=section.momentum,
        weight_decay=section.weight_decay,
        eeta=section.lars_eeta,
        epsilon=section.lars_epsilon,
        nesterov=section.lars_nesterov,
    )


@OPTIMIZERS.register("rmsprop")
def _rmsprop(section: OptimizerConfig, learning_rate):
    return rmsprop(
        learning_rate,
        rho=section.rmsprop_rho,
        momentum=section.momentum,
        epsilon=section.rmsprop_epsilon,
        form=section.rmsprop_form,
    )


@OPTIMIZERS.register("sgd")
def _momentum_sgd(section: OptimizerConfig, learning_rate):
    return keras.optimizers.SGD(learning_rate, momentum=section.momentum)


def build_optimizer(section: OptimizerConfig, learning_rate_schedule):
    """The optimizer a trainer config asks for.

    Args:
      section: the ``optimizer`` section of a ``trainer_module.config.TrainerConfig``; its ``name`` picks the
        builder from ``OPTIMIZERS`` ('lars', 'rmsprop' or 'sgd', momentum SGD).
      learning_rate_schedule: a ``LearningRateSchedule`` (or float) for the base learning rate.

    Returns:
      A Keras 3 optimizer. Only LARS applies weight decay itself; for the others the trainer adds
      ``TrainingPlan.l2_loss_weight`` times the L2 norm to the loss.
    """
    return OPTIMIZERS.build(section.name, section, learning_rate_schedule)
