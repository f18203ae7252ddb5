"""LARS and TF1's RMSProp against plain NumPy renderings of their updates, single-device and mirrored.

TF1RMSProp is also checked against ``tf.compat.v1.train.RMSPropOptimizer`` itself, run in graph mode.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer_module.config import with_overrides
from trainer_module.optim.optimizers import (
    DEFAULT_EXCLUDE,
    LARS,
    TF1RMSProp,
    build_optimizer,
    is_excluded,
    rmsprop,
)
from trainer_module.optim.schedules import WarmupPolynomialDecay
from trainer_module.presets import get_preset

NUM_STEPS = 6
MOMENTUM = 0.9
# Larger than the recipe's (1e-5, 0.001) so that decay and trust scaling move the weights well above the
# 1e-6 tolerance.
WEIGHT_DECAY = 0.05
EETA = 0.1
# The EfficientNet recipe's RMSProp: decay 0.9, epsilon 0.001 (with MOMENTUM).
RHO = 0.9
RMSPROP_EPSILON = 1e-3


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


def _apply_steps(optimizer, variables):
    for grads in _gradients():
        optimizer.apply_gradients([(tf.constant(grads[v.path], tf.float32), v) for v in variables])


@pytest.mark.parametrize("name", ["lars", "tf1_rmsprop"])
def test_optimizer_under_mirrored_strategy_matches_single_device(logical_cpus, name):
    def make_optimizer():
        if name == "lars":
            return _optimizer(nesterov=True, epsilon=0.0)
        return TF1RMSProp(_schedule(), rho=RHO, momentum=MOMENTUM, epsilon=RMSPROP_EPSILON)

    strategy = tf.distribute.MirroredStrategy(logical_cpus[:2])
    with strategy.scope():
        variables = _make_variables()
        optimizer = make_optimizer()
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
    _apply_steps(make_optimizer(), single_variables)

    for mirrored, single in zip(variables, single_variables, strict=True):
        replicas = strategy.experimental_local_results(mirrored.value)
        assert len(replicas) == 2
        np.testing.assert_array_equal(replicas[0].numpy(), replicas[1].numpy())
        np.testing.assert_allclose(replicas[0].numpy(), single.numpy(), rtol=1e-6, atol=1e-6)
    expected = _expected(nesterov=True, epsilon=0.0) if name == "lars" else _expected_rmsprop()
    _assert_matches(single_variables, expected)


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


def numpy_rmsprop(weights, gradients, *, rho, momentum, epsilon, initial_mean_square, epsilon_under_sqrt):
    """RMSProp with momentum in float64 NumPy, over ``len(gradients)`` steps.

    TF1 (``ApplyRMSProp``): initial_mean_square=1, epsilon_under_sqrt=True. Keras 3's ``RMSprop``:
    initial_mean_square=0, epsilon_under_sqrt=True. ``epsilon_under_sqrt=False`` (sqrt(ms) + eps) is the
    placement of tf.keras' legacy RMSprop without momentum, and of Adam.
    """
    weights = {path: value.astype(np.float64).copy() for path, value in weights.items()}
    mean_square = {path: np.full_like(value, initial_mean_square) for path, value in weights.items()}
    velocity = {path: np.zeros_like(value) for path, value in weights.items()}
    for step, grads in enumerate(gradients):
        lr = _learning_rate(step)
        for path, w in weights.items():
            g = grads[path]
            mean_square[path] = rho * mean_square[path] + (1 - rho) * g**2
            if epsilon_under_sqrt:
                denominator = np.sqrt(mean_square[path] + epsilon)
            else:
                denominator = np.sqrt(mean_square[path]) + epsilon
            velocity[path] = momentum * velocity[path] + lr * g / denominator
            weights[path] = w - velocity[path]
    return weights


def _expected_rmsprop(epsilon=RMSPROP_EPSILON, initial_mean_square=1.0, epsilon_under_sqrt=True):
    return numpy_rmsprop(
        {path: value for path, (value, _) in _initial_values().items()},
        _gradients(),
        rho=RHO,
        momentum=MOMENTUM,
        epsilon=epsilon,
        initial_mean_square=initial_mean_square,
        epsilon_under_sqrt=epsilon_under_sqrt,
    )


def test_tf1_rmsprop_matches_numpy_rule():
    variables = _make_variables()
    optimizer = TF1RMSProp(_schedule(), rho=RHO, momentum=MOMENTUM, epsilon=RMSPROP_EPSILON)
    _apply_steps(optimizer, variables)
    assert int(optimizer.iterations) == NUM_STEPS
    _assert_matches(variables, _expected_rmsprop())


def test_tf1_rmsprop_matches_tf_compat_v1_rmsprop_optimizer():
    """The strongest check: the reference's own optimizer, in a TF1 graph and session, on the same steps."""
    expected = {}
    graph = tf.Graph()
    with graph.as_default():
        learning_rate = tf.compat.v1.placeholder(tf.float32, [])
        weights, gradients = {}, {}
        for path, (value, _) in _initial_values().items():
            weights[path] = tf.compat.v1.Variable(value.astype(np.float32), use_resource=True)
            gradients[path] = tf.compat.v1.placeholder(tf.float32, value.shape)
        reference = tf.compat.v1.train.RMSPropOptimizer(
            learning_rate, decay=RHO, momentum=MOMENTUM, epsilon=RMSPROP_EPSILON
        )
        train_op = reference.apply_gradients([(gradients[p], weights[p]) for p in weights])
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            first_slot = session.run(reference.get_slot(weights["stem_conv/kernel"], "rms"))
            np.testing.assert_array_equal(first_slot, np.ones_like(first_slot))  # TF1 starts at ones
            for step, grads in enumerate(_gradients()):
                feed = {gradients[p]: grads[p].astype(np.float32) for p in weights}
                session.run(train_op, {**feed, learning_rate: _learning_rate(step)})
            expected = {path: session.run(variable) for path, variable in weights.items()}

    variables = _make_variables()
    _apply_steps(TF1RMSProp(_schedule(), rho=RHO, momentum=MOMENTUM, epsilon=RMSPROP_EPSILON), variables)
    for variable in variables:
        np.testing.assert_allclose(variable.numpy(), expected[variable.path], rtol=1e-6, atol=1e-6)
    # The NumPy rendering agrees with the reference too, so the other tests' oracle is the reference's rule.
    for path, value in _expected_rmsprop().items():
        np.testing.assert_allclose(value, expected[path], rtol=1e-5, atol=1e-6)


def test_tf1_rmsprop_is_not_the_keras_form():
    """Fails if TF1RMSProp started its accumulator at 0 (Keras) or put epsilon outside the square root.

    A large epsilon makes the placement visible: sqrt(ms + 0.25) and sqrt(ms) + 0.25 differ by about 10%
    here, where the recipe's 0.001 would move the weights by only ~1e-4 relative.
    """
    epsilon = 0.25
    variables = _make_variables()
    optimizer = TF1RMSProp(_schedule(), rho=RHO, momentum=MOMENTUM, epsilon=epsilon)
    optimizer.build(variables)
    for slot in optimizer.mean_squares:
        np.testing.assert_array_equal(slot.numpy(), np.ones(slot.shape))
    _apply_steps(optimizer, variables)
    _assert_matches(variables, _expected_rmsprop(epsilon))
    wrong_forms = {
        "accumulator at 0 (Keras 3)": _expected_rmsprop(epsilon, initial_mean_square=0.0),
        "epsilon outside the sqrt": _expected_rmsprop(epsilon, epsilon_under_sqrt=False),
        "both": _expected_rmsprop(epsilon, initial_mean_square=0.0, epsilon_under_sqrt=False),
    }
    for form, wrong in wrong_forms.items():
        # Far from each wrong form: the right one matched to 1e-6 above.
        gap = max(np.max(np.abs(v.numpy() - wrong[v.path])) for v in variables)
        assert gap > 1e-2, form


def test_keras_rmsprop_is_tf1_with_the_accumulator_at_zero():
    """Pins the Keras 3 behaviour 'rmsprop_form=keras' relies on (epsilon under the sqrt, ms from 0)."""
    optimizer = rmsprop(_schedule())
    assert type(optimizer) is keras.optimizers.RMSprop
    config = optimizer.get_config()
    assert (config["rho"], config["momentum"], config["epsilon"]) == (0.9, 0.9, 1e-3)
    variables = _make_variables()
    _apply_steps(optimizer, variables)
    _assert_matches(variables, _expected_rmsprop(initial_mean_square=0.0))


def test_tf1_rmsprop_config_round_trip():
    optimizer = rmsprop(_schedule(), rho=0.8, momentum=0.5, epsilon=1e-4, form="tf1")
    assert type(optimizer) is TF1RMSProp
    config = optimizer.get_config()
    assert (config["rho"], config["momentum"], config["epsilon"]) == (0.8, 0.5, 1e-4)
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, TF1RMSProp)
    assert revived.get_config() == config


@pytest.mark.parametrize(
    "kwargs, message",
    [({"rho": 1.0}, "rho"), ({"momentum": -0.1}, "momentum"), ({"epsilon": 0.0}, "epsilon")],
)
def test_tf1_rmsprop_rejects_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TF1RMSProp(0.1, **kwargs)


def test_rmsprop_rejects_unknown_form():
    with pytest.raises(ValueError, match="optimizer.rmsprop_form='tf2' is not one of 'keras', 'tf1'"):
        rmsprop(0.1, form="tf2")


@pytest.mark.parametrize(
    "preset, optimizer_type",
    [
        ("b2-lars-512x16384", LARS),
        ("b2-rmsprop-128x4096", TF1RMSProp),
        ("b5-rmsprop-512x16384", TF1RMSProp),
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
    else:
        assert (settings["rho"], settings["epsilon"]) == (0.9, 1e-3)


def test_build_optimizer_rmsprop_forms():
    config = with_overrides(get_preset("b2-rmsprop-128x4096"), ["optimizer.rmsprop_form=keras"])
    assert type(build_optimizer(config.optimizer, 0.1)) is keras.optimizers.RMSprop
    config = with_overrides(config, ["optimizer.rmsprop_form=tf1"])
    assert type(build_optimizer(config.optimizer, 0.1)) is TF1RMSProp


def test_build_optimizer_sgd():
    config = get_preset("smoke")
    optimizer = build_optimizer(with_overrides(config, ["optimizer.name=sgd"]).optimizer, 0.1)
    assert type(optimizer) is keras.optimizers.SGD
    assert optimizer.get_config()["momentum"] == 0.9
