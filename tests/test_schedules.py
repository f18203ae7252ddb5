"""Learning-rate schedules against hand-computed values."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer_module.optim.schedules import (
    ScheduleSteps,
    WarmupExponentialDecay,
    WarmupPolynomialDecay,
    build_schedule,
    scaled_learning_rate,
)
from trainer_module.presets import get_preset


@pytest.mark.parametrize(
    "lr_per_256, batch, expected",
    [(0.016, 4096, 0.256), (0.236, 16384, 15.104), (0.118, 32768, 15.104), (0.081, 65536, 20.736)],
)
def test_scaled_learning_rate_follows_linear_scaling(lr_per_256, batch, expected):
    assert scaled_learning_rate(lr_per_256, batch) == pytest.approx(expected, rel=1e-12)


def test_scaled_learning_rate_rejects_empty_batch():
    with pytest.raises(ValueError, match="global_batch_size"):
        scaled_learning_rate(0.1, 0)


# peak 2.0, 4 warmup steps, 14 total steps, end 0.1 (the EfficientNet reference's absolute end rate). After
# warmup the reference decays over D = 14 - 4 + 1 = 11 steps counted from d = max(1, step - 4):
# lr = (2.0 - 0.1) * (1 - min(d, 11) / 11) ** 2 + 0.1.
POLYNOMIAL_CASES = [
    (0, 0.0),  # start of warmup
    (1, 0.5),
    (2, 1.0),  # mid-warmup
    (3, 1.5),  # last warmup step
    (4, 1.9 * (10 / 11) ** 2 + 0.1),  # end of warmup: already one decay step in (d = 1), 1.670248
    (5, 1.9 * (10 / 11) ** 2 + 0.1),  # d = 1 again: max(1, 1)
    (6, 1.9 * (9 / 11) ** 2 + 0.1),  # 1.371901
    (9, 1.9 * (6 / 11) ** 2 + 0.1),  # mid-decay: 0.665289
    (14, 1.9 * (1 / 11) ** 2 + 0.1),  # the last of the total steps: 0.115702
    (15, 0.1),  # d = D: the end rate
    (100, 0.1),  # beyond the end: clamped
]


@pytest.mark.parametrize("step, expected", POLYNOMIAL_CASES)
@pytest.mark.parametrize("step_dtype", [tf.int32, tf.int64])
def test_warmup_polynomial_decay_values(step, expected, step_dtype):
    schedule = WarmupPolynomialDecay(2.0, warmup_steps=4, total_steps=14, end_learning_rate=0.1)
    value = schedule(tf.constant(step, step_dtype))
    assert value.dtype == tf.float32
    assert float(value) == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_warmup_polynomial_decay_without_warmup_starts_one_decay_step_in():
    schedule = WarmupPolynomialDecay(1.0, warmup_steps=0, total_steps=4, end_learning_rate=0.0)
    values = [float(schedule(step)) for step in range(7)]
    # D = 5; d = max(1, step): steps 0 and 1 both take d = 1.
    np.testing.assert_allclose(values, [0.64, 0.64, 0.36, 0.16, 0.04, 0.0, 0.0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "examples, batch, warmup_epochs, epochs, expected",
    [
        # 1,281,167 / 65536 = 19.549 steps per epoch: 43 warmup epochs = 840 steps, 350 epochs = 6,842 steps.
        (1_281_167, 65536, 43.0, 350, (1_281_167 / 65536, 840, 6842)),
        (1_281_167, 4096, 5.0, 350, (1_281_167 / 4096, 1563, 109474)),
        (1438, 64, 3.0, 30, (1438 / 64, 67, 674)),
    ],
)
def test_schedule_steps_are_the_references_truncations(examples, batch, warmup_epochs, epochs, expected):
    steps = ScheduleSteps.of(examples, batch, warmup_epochs, epochs)
    assert (steps.steps_per_epoch, steps.warmup_steps, steps.total_steps) == pytest.approx(expected)
    assert isinstance(steps.warmup_steps, int) and isinstance(steps.total_steps, int)


# Round numbers near the recipe's b2-rmsprop-128x4096 row: peak 0.256, 1560 warmup steps, a decay every
# 748.8 steps (2.4 epochs of 312 steps).
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
        WarmupPolynomialDecay(15.104, warmup_steps=3900, total_steps=27300, end_learning_rate=0.1),
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


def _preset_schedule(name):
    config = get_preset(name)
    return build_schedule(config.schedule, config.plan.peak_learning_rate, config.plan.schedule_steps)


def test_build_schedule_polynomial_from_lars_preset():
    # peak 15.104; 78.196 steps per epoch: 3909 warmup steps, 27368 total, decay over D = 23460 steps.
    schedule = _preset_schedule("b2-lars-512x16384")
    assert isinstance(schedule, WarmupPolynomialDecay)
    assert float(schedule(1954)) == pytest.approx(15.104 * 1954 / 3909, rel=1e-6)
    assert float(schedule(3909)) == pytest.approx(15.004 * (1 - 1 / 23460) ** 2 + 0.1, rel=1e-6)
    assert float(schedule(15639)) == pytest.approx(15.004 * 0.25 + 0.1, rel=1e-5)  # d = 11730 = D / 2
    assert float(schedule(27369)) == pytest.approx(0.1, rel=1e-6)


def test_build_schedule_exponential_from_rmsprop_preset():
    # peak 0.512; 156.39 steps per epoch: 781 warmup steps, a decay every 375.34 steps.
    schedule = _preset_schedule("b5-rmsprop-256x8192")
    assert isinstance(schedule, WarmupExponentialDecay)
    assert float(schedule(390)) == pytest.approx(0.512 * 390 / 781, rel=1e-6)
    assert float(schedule(781)) == pytest.approx(0.512 * 0.97**2, rel=1e-6)
    assert float(schedule(1126)) == pytest.approx(0.512 * 0.97**2, rel=1e-6)  # 1126 / 375.342 = 2.9999
    assert float(schedule(1127)) == pytest.approx(0.512 * 0.97**3, rel=1e-6)  # 1127 / 375.342 = 3.0026
