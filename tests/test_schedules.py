"""Learning-rate schedules against hand-computed values."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer_module.presets import get_preset
from trainer_module.schedules import (
    WarmupExponentialDecay,
    WarmupPolynomialDecay,
    build_schedule,
    scaled_learning_rate,
)


@pytest.mark.parametrize(
    "lr_per_256, batch, expected",
    [(0.016, 4096, 0.256), (0.236, 16384, 15.104), (0.118, 32768, 15.104), (0.081, 65536, 20.736)],
)
def test_scaled_learning_rate_follows_linear_scaling(lr_per_256, batch, expected):
    assert scaled_learning_rate(lr_per_256, batch) == pytest.approx(expected, rel=1e-12)


def test_scaled_learning_rate_rejects_empty_batch():
    with pytest.raises(ValueError, match="global_batch_size"):
        scaled_learning_rate(0.1, 0)


# peak 2.0, 4 warmup steps, 14 total steps, end 1e-4: decay over 10 steps.
POLYNOMIAL_CASES = [
    (0, 0.0),  # start of warmup
    (1, 0.5),
    (2, 1.0),  # mid-warmup
    (4, 2.0),  # end of warmup: the peak
    (6, (2.0 - 1e-4) * 0.8**2 + 1e-4),  # 1.280036
    (9, (2.0 - 1e-4) * 0.25 + 1e-4),  # mid-decay: 0.500075
    (13, (2.0 - 1e-4) * 0.01 + 1e-4),  # one step before the end: 0.020099
    (14, 1e-4),  # end
    (100, 1e-4),  # beyond the end: clamped
]


@pytest.mark.parametrize("step, expected", POLYNOMIAL_CASES)
@pytest.mark.parametrize("step_dtype", [tf.int32, tf.int64])
def test_warmup_polynomial_decay_values(step, expected, step_dtype):
    schedule = WarmupPolynomialDecay(2.0, warmup_steps=4, total_steps=14, end_learning_rate=1e-4)
    value = schedule(tf.constant(step, step_dtype))
    assert value.dtype == tf.float32
    assert float(value) == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_warmup_polynomial_decay_without_warmup_starts_at_peak():
    schedule = WarmupPolynomialDecay(1.0, warmup_steps=0, total_steps=4, end_learning_rate=0.0)
    values = [float(schedule(step)) for step in range(6)]
    np.testing.assert_allclose(values, [1.0, 0.5625, 0.25, 0.0625, 0.0, 0.0], rtol=1e-6)


# The recipe's b2-rmsprop-128x4096 numbers: peak 0.256, 312 steps/epoch, 5 warmup epochs = 1560 steps,
# decay every 2.4 epochs = 748.8 steps.
EXPONENTIAL_CASES = [
    (0, 0.0),
    (780, 0.128),  # mid-warmup
    (1559, 0.256 * 1559 / 1560),  # last warmup step
    (1560, 0.256 * 0.97**2),  # end of warmup: 2 decays already counted from step 0 (1560 / 748.8 = 2.08)
    (2246, 0.256 * 0.97**2),  # 2246 / 748.8 = 2.9995: still 2
    (2247, 0.256 * 0.97**3),  # 2247 / 748.8 = 3.0008
    (54600, 0.256 * 0.97**72),  # mid-run: 54600 / 748.8 = 72.9
    (109200, 0.256 * 0.97**145),  # end of 350 epochs: 145.8
]


@pytest.mark.parametrize("step, expected", EXPONENTIAL_CASES)
def test_warmup_exponential_decay_values(step, expected):
    schedule = WarmupExponentialDecay(0.256, warmup_steps=1560, decay_steps=748.8, decay_rate=0.97)
    value = schedule(tf.constant(step, tf.int64))
    assert value.dtype == tf.float32
    assert float(value) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "schedule",
    [
        WarmupPolynomialDecay(15.104, warmup_steps=3900, total_steps=27300, end_learning_rate=1e-4),
        WarmupExponentialDecay(0.256, warmup_steps=1560, decay_steps=748.8, decay_rate=0.97),
    ],
    ids=["polynomial", "exponential"],
)
def test_schedules_survive_keras_serialisation(schedule):
    restored = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(restored) is type(schedule)
    assert restored.get_config() == schedule.get_config()
    steps = tf.constant([0, 1000, 3900, 20000, 40000], tf.int64)
    np.testing.assert_array_equal(restored(steps).numpy(), schedule(steps).numpy())


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: WarmupPolynomialDecay(1.0, warmup_steps=10, total_steps=10), "total_steps"),
        (lambda: WarmupPolynomialDecay(1.0, warmup_steps=-1, total_steps=10), "warmup_steps"),
        (lambda: WarmupPolynomialDecay(1e-5, warmup_steps=1, total_steps=10), "end_learning_rate"),
        (lambda: WarmupExponentialDecay(1.0, warmup_steps=1, decay_steps=0.0), "decay_steps"),
        (lambda: WarmupExponentialDecay(1.0, warmup_steps=1, decay_steps=2.0, decay_rate=1.5), "decay_rate"),
    ],
)
def test_schedules_reject_bad_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_build_schedule_polynomial_from_lars_preset():
    config = get_preset("b2-lars-512x16384")  # peak 15.104, 3900 warmup steps, 27300 total steps
    schedule = build_schedule(config)
    assert isinstance(schedule, WarmupPolynomialDecay)
    assert float(schedule(1950)) == pytest.approx(15.104 / 2, rel=1e-6)
    assert float(schedule(3900)) == pytest.approx(15.104, rel=1e-6)
    assert float(schedule(27300)) == pytest.approx(1e-4, rel=1e-6)


def test_build_schedule_exponential_from_rmsprop_preset():
    config = get_preset("b5-rmsprop-256x8192")  # peak 0.512, 156 steps/epoch: 780 warmup, decay every 374.4
    schedule = build_schedule(config)
    assert isinstance(schedule, WarmupExponentialDecay)
    assert float(schedule(390)) == pytest.approx(0.256, rel=1e-6)
    assert float(schedule(780)) == pytest.approx(0.512 * 0.97**2, rel=1e-6)
