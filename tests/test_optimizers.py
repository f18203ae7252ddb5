"""LARS against a plain NumPy rendering of the tensorflow/tpu update, single-device and mirrored."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer_module.config import with_overrides
from trainer_module.optimizers import DEFAULT_EXCLUDE, LARS, build_optimizer, is_excluded, rmsprop
from trainer_module.presets import get_preset
from trainer_module.schedules import WarmupPolynomialDecay

NUM_STEPS = 6
MOMENTUM = 0.9
# Larger than the recipe's (1e-5, 0.001) so that decay and trust scaling move the weights well above the
# 1e-6 tolerance.
WEIGHT_DECAY = 0.05
EETA = 0.1


def _learning_rate(step):
    """The rate keras.optimizers.schedules.ExponentialDecay(0.5, 1, 0.8) gives at ``step``."""
    return 0.5 * 0.8**step


def _schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.8)


def _initial_values():
    """Variable path -> (initial value, whether LARS should exclude it)."""
    rng = np.random.default_rng(0)
    return {
        "stem_conv/kernel": (rng.normal(size=(3, 3, 2, 4)), False),
        "block1a_bn/gamma": (1.0 + 0.1 * rng.normal(size=4), True),
        "stem_bn/beta": (0.1 * rng.normal(size=4), True),
        "head/bias": (0.1 * rng.normal(size=3), True),
        # Zero weights: trust falls back to 1 on the first step, and only then.
        "zero_init/kernel": (np.zeros((2, 3)), False),
        # Zero gradient on every step: trust is 1 and only weight decay moves the weights.
        "no_grad/kernel": (rng.normal(size=(5,)), False),
    }


def _gradients():
    """Per step, variable path -> gradient (the same sequence for every test)."""
    rng = np.random.default_rng(1)
    steps = []
    for _ in range(NUM_STEPS):
        grads = {path: rng.normal(size=value.shape) for path, (value, _) in _initial_values().items()}
        grads["no_grad/kernel"] = np.zeros_like(grads["no_grad/kernel"])
        steps.append(grads)
    return steps


def numpy_lars(weights, gradients, excluded, *, momentum, weight_decay, eeta, epsilon, nesterov):
    """The tensorflow/tpu LARS rule in float64 NumPy, over ``len(gradients)`` steps."""
    weights = {path: value.astype(np.float64).copy() for path, value in weights.items()}
    velocity = {path: np.zeros_like(value) for path, value in weights.items()}
    for step, grads in enumerate(gradients):
        lr = _learning_rate(step)
        for path, w in weights.items():
            g = grads[path]
            if excluded[path]:
                scaled = lr * g
            else:
                w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
                if w_norm > 0 and g_norm > 0:
                    trust = eeta * w_norm / (g_norm + weight_decay * w_norm + epsilon)
                else:
                    trust = 1.0
                scaled = lr * trust * (g + weight_decay * w)
            velocity[path] = momentum * velocity[path] + scaled
            if nesterov:
                weights[path] = w - (scaled + momentum * velocity[path])
            else:
                weights[path] = w - velocity[path]
    return weights


def _make_variables():
    variables = []
    for path, (value, _) in _initial_values().items():
        scope, name = path.split("/")
        with keras.name_scope(scope):
            variables.append(keras.Variable(value.astype(np.float32), name=name))
    return variables


def _expected(nesterov, epsilon):
    initial = _initial_values()
    return numpy_lars(
        {path: value for path, (value, _) in initial.items()},
        _gradients(),
        {path: flag for path, (_, flag) in initial.items()},
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        eeta=EETA,
        epsilon=epsilon,
        nesterov=nesterov,
    )


def _optimizer(nesterov, epsilon):
    return LARS(
        _schedule(),
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        eeta=EETA,
        epsilon=epsilon,
        nesterov=nesterov,
    )


def _assert_matches(variables, expected):
    initial = _initial_values()
    for variable in variables:
        actual = np.asarray(variable.numpy(), np.float64)
        np.testing.assert_allclose(
            actual, expected[variable.path], rtol=1e-6, atol=1e-6, err_msg=variable.path
        )
        # The displacement too, so that a wrong small term cannot hide under the weights' magnitude.
        start = initial[variable.path][0]
        np.testing.assert_allclose(actual - start, expected[variable.path] - start, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
@pytest.mark.parametrize("epsilon", [0.0, 0.5])
def test_lars_matches_numpy_rule(nesterov, epsilon):
    variables = _make_variables()
    optimizer = _optimizer(nesterov, epsilon)
    for grads in _gradients():
        optimizer.apply_gradients(
            [(tf.constant(grads[v.path], tf.float32), v) for v in variables],
        )
    assert int(optimizer.iterations) == NUM_STEPS
    _assert_matches(variables, _expected(nesterov, epsilon))


def test_lars_excluded_variables_get_plain_momentum():
    # A cross-check of the NumPy reference itself: an excluded variable follows momentum SGD exactly.
    expected = _expected(nesterov=False, epsilon=0.0)["head/bias"]
    w = _initial_values()["head/bias"][0].copy()
    v = np.zeros_like(w)
    for step, grads in enumerate(_gradients()):
        v = MOMENTUM * v + _learning_rate(step) * grads["head/bias"]
        w = w - v
    np.testing.assert_allclose(expected, w, rtol=1e-12)


def test_lars_under_mirrored_strategy_matches_single_device(logical_cpus):
    strategy = tf.distribute.MirroredStrategy(logical_cpus[:2])
    with strategy.scope():
        variables = _make_variables()
        optimizer = _optimizer(nesterov=True, epsilon=0.0)
        optimizer.build(variables)

    @tf.function
    def train_step(per_replica_grads):
        def apply(grads):
            optimizer.apply_gradients(zip(grads, variables, strict=True))

        strategy.run(apply, args=(per_replica_grads,))

    rng = np.random.default_rng(2)
    for grads in _gradients():
        # Each replica holds a different half of the global gradient; Keras sums them across replicas.
        noise = {path: rng.normal(size=g.shape) for path, g in grads.items()}

        def replica_grads(context, grads=grads, noise=noise):
            sign = 1.0 if context.replica_id_in_sync_group == 0 else -1.0
            return [tf.constant((grads[v.path] + sign * noise[v.path]) / 2, tf.float32) for v in variables]

        train_step(strategy.experimental_distribute_values_from_function(replica_grads))

    single_variables = _make_variables()
    single_optimizer = _optimizer(nesterov=True, epsilon=0.0)
    for grads in _gradients():
        single_optimizer.apply_gradients(
            [(tf.constant(grads[v.path], tf.float32), v) for v in single_variables]
        )

    for mirrored, single in zip(variables, single_variables, strict=True):
        replicas = strategy.experimental_local_results(mirrored.value)
        assert len(replicas) == 2
        np.testing.assert_array_equal(replicas[0].numpy(), replicas[1].numpy())
        np.testing.assert_allclose(replicas[0].numpy(), single.numpy(), rtol=1e-6, atol=1e-6)
    _assert_matches(single_variables, _expected(nesterov=True, epsilon=0.0))


@pytest.mark.parametrize(
    "path, excluded",
    [
        ("block1a_bn/gamma", True),
        ("stem_bn/beta", True),
        ("top_bn/gamma", True),
        ("block2b_project_bn/beta", True),
        ("batch_normalization/gamma", True),
        ("grouped_batch_norm_3/beta", True),
        ("BatchNorm/gamma", True),
        ("predictions/bias", True),
        ("block1a_se_reduce/bias", True),
        ("stem_conv/kernel", False),
        ("block1a_dwconv/depthwise_kernel", False),
        ("block1a_se_expand/kernel", False),
        ("predictions/kernel", False),
    ],
)
def test_default_exclusions(path, excluded):
    assert is_excluded(path, DEFAULT_EXCLUDE) is excluded


def test_lars_keeps_keras_decoupled_weight_decay_off():
    optimizer = LARS(0.1, weight_decay=1e-4)
    assert optimizer.weight_decay is None  # Keras would otherwise decay the weights a second time.
    assert optimizer.lars_weight_decay == 1e-4
    assert optimizer.get_config()["weight_decay"] == 1e-4


def test_lars_config_round_trip():
    schedule = WarmupPolynomialDecay(15.104, warmup_steps=3900, total_steps=27300)
    optimizer = LARS(
        schedule, momentum=0.8, weight_decay=1e-4, eeta=0.002, epsilon=1e-6, nesterov=True, exclude=("bias",)
    )
    config = optimizer.get_config()
    restored = LARS.from_config(dict(config))
    assert restored.get_config() == config
    restored.iterations.assign(1950)  # Mid-warmup: the schedule came back, not a constant.
    assert float(restored.learning_rate) == pytest.approx(15.104 / 2, rel=1e-6)
    # And through Keras' registry, as when a model is saved with its optimizer.
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, LARS)
    assert revived.get_config() == config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"momentum": 1.0}, "momentum"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"eeta": 0.0}, "eeta"),
        ({"epsilon": -1e-3}, "epsilon"),
        ({"exclude": ("(",)}, "missing"),
    ],
)
def test_lars_rejects_bad_hyperparameters(kwargs, message):
    with pytest.raises(Exception, match=message):
        LARS(0.1, **kwargs)


def test_rmsprop_recipe_settings_and_one_step():
    optimizer = rmsprop(0.1)
    config = optimizer.get_config()
    assert (config["rho"], config["momentum"], config["epsilon"]) == (0.9, 0.9, 1e-3)
    variable = keras.Variable(np.array([1.0, -2.0], np.float32))
    gradient = np.array([0.5, 2.0])
    optimizer.apply_gradients([(tf.constant(gradient, tf.float32), variable)])
    mean_square = 0.1 * gradient**2
    expected = np.array([1.0, -2.0]) - 0.1 * gradient / np.sqrt(mean_square + 1e-3)
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "preset, optimizer_type",
    [
        ("b2-lars-512x16384", LARS),
        ("b2-rmsprop-128x4096", keras.optimizers.RMSprop),
        ("smoke", LARS),
    ],
)
def test_build_optimizer_from_preset(preset, optimizer_type):
    config = get_preset(preset)
    optimizer = build_optimizer(config.optimizer, 0.1)
    assert type(optimizer) is optimizer_type
    settings = optimizer.get_config()
    assert settings["momentum"] == 0.9
    if optimizer_type is LARS:
        assert (settings["weight_decay"], settings["eeta"], settings["epsilon"]) == (1e-5, 0.001, 0.0)
        assert settings["nesterov"] is False


def test_build_optimizer_sgd():
    config = get_preset("smoke")
    optimizer = build_optimizer(with_overrides(config, ["optimizer.name=sgd"]).optimizer, 0.1)
    assert type(optimizer) is keras.optimizers.SGD
    assert optimizer.get_config()["momentum"] == 0.9
