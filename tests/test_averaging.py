"""Weight averaging as the reference keeps it: NumPy rendering, distributed copies, swap, checkpoint."""

import numpy as np
import pytest
import tensorflow as tf

from trainer_module.optim.averaging import WeightAverage, averaged_variables, decay_at
from trainer_module.presets import get_preset
from trainer_module.train import build_model


def _numpy_average(initial, weights_by_step, decay):
    """The reference's ExponentialMovingAverage(decay, num_updates=t) after each step t = 1, 2, ..."""
    average = initial.copy()
    for t, weights in enumerate(weights_by_step, start=1):
        d = min(decay, (1.0 + t) / (10.0 + t))
        average = d * average + (1.0 - d) * weights
    return average


@pytest.mark.parametrize(
    "step, decay, expected",
    [
        (1, 0.9999, 2 / 11),
        (80, 0.9999, 81 / 90),
        (89_990, 0.9999, 0.9999),
        (10**6, 0.9999, 0.9999),
        (5, 0.2, 0.2),
    ],
)
def test_decay_warms_up_as_num_updates_does(step, decay, expected):
    assert float(decay_at(step, decay)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("decay", [0.9999, 0.5])
def test_average_matches_a_numpy_rendering_over_several_steps(decay):
    rng = np.random.default_rng(0)
    initial = rng.normal(size=(3, 4)).astype(np.float32)
    weight = tf.Variable(initial)
    average = WeightAverage([weight], decay)
    trajectory = []
    for t in range(1, 13):
        weight.assign(weight + rng.normal(size=(3, 4)).astype(np.float32))
        average.update(tf.constant(t, tf.int64))
        trajectory.append(weight.numpy())
    np.testing.assert_allclose(
        average.averages[0].numpy(), _numpy_average(initial, trajectory, decay), rtol=1e-5, atol=1e-6
    )
    # A fixed 0.9999 from step 1 (Keras' use_ema) would still sit almost entirely on the initial weights.
    assert not np.allclose(average.averages[0].numpy(), initial, atol=0.1)


def test_mirrored_average_updates_every_replica_inside_a_compiled_step(logical_cpus):
    strategy = tf.distribute.MirroredStrategy(devices=logical_cpus[:2])
    with strategy.scope():
        weight = tf.Variable(tf.zeros([5]))
        step = tf.Variable(0, dtype=tf.int64)
        average = WeightAverage([weight], 0.9999)

    @tf.function
    def train_step():
        strategy.run(lambda: weight.assign_add(tf.ones([5])))
        step.assign_add(1)
        average.update(step)

    for _ in range(6):
        train_step()
    expected = _numpy_average(
        np.zeros(5, np.float32), [np.full(5, t, np.float32) for t in range(1, 7)], 0.9999
    )
    copies = strategy.experimental_local_results(average.averages[0])
    assert len(copies) == 2
    for copy in copies:
        np.testing.assert_allclose(copy.numpy(), expected, rtol=1e-6)


def test_swap_exchanges_weights_and_averages_and_swapped_restores_them(logical_cpus):
    strategy = tf.distribute.MirroredStrategy(devices=logical_cpus[:2])
    with strategy.scope():
        weight = tf.Variable([1.0, 2.0])
        average = WeightAverage([weight], 0.5)
        weight.assign([3.0, 4.0])
        with average.swapped():
            for copy in strategy.experimental_local_results(weight):
                np.testing.assert_array_equal(copy.numpy(), [1.0, 2.0])
        for copy in strategy.experimental_local_results(weight):
            np.testing.assert_array_equal(copy.numpy(), [3.0, 4.0])
        np.testing.assert_array_equal(average.averages[0].numpy(), [1.0, 2.0])


def test_averaged_variables_are_the_weights_and_the_batch_norm_statistics():
    model = build_model(get_preset("smoke"))
    covered = averaged_variables(model)
    statistics = [v for v in covered if not v.trainable]
    assert len(covered) == len(model.trainable_variables) + len(statistics)
    bn_layers = [layer for layer in model.layers if layer.name.endswith("_bn")]
    assert bn_layers and len(statistics) == 2 * len(bn_layers)
    assert {v.path.rsplit("/", 1)[1] for v in statistics} == {"moving_mean", "moving_variance"}


def test_averages_travel_in_the_checkpoint(tmp_path):
    weight = tf.Variable([1.0, 1.0])
    average = WeightAverage([weight], 0.9)
    weight.assign([5.0, 5.0])
    average.update(tf.constant(100))  # decay 0.9: 0.9 * 1 + 0.1 * 5
    path = tf.train.Checkpoint(weight_average=average).save(str(tmp_path / "ckpt"))

    restored_weight = tf.Variable([0.0, 0.0])
    restored = WeightAverage([restored_weight], 0.9)
    tf.train.Checkpoint(weight_average=restored).restore(path).assert_existing_objects_matched()
    np.testing.assert_allclose(restored.averages[0].numpy(), [1.4, 1.4], rtol=1e-6)


def test_decay_outside_the_open_unit_interval_is_refused():
    with pytest.raises(ValueError, match="decay must be in"):
        WeightAverage([tf.Variable(1.0)], 1.0)
