"""The pieces work together: the smoke run's EfficientNet (micro) + LARS + warmup/polynomial schedule +
grouped synchronised BN, over 2 replicas with one BN group of both, drive the loss on one small batch to near
zero."""

import numpy as np
import pytest
import tensorflow as tf

from trainer_module import presets, train
from trainer_module.config import with_overrides
from trainer_module.optim.averaging import averaged_variables


@pytest.mark.slow
def test_micro_lars_grouped_bn_overfits_a_small_batch(logical_cpus):
    steps = 60
    config = with_overrides(
        presets.get_preset("smoke"),
        [
            "loop.strategy=mirrored",
            "data.num_cores=2",
            "model.bn_group_size=2",
            "model.num_classes=10",
            "model.dropout_rate=0",
            "model.drop_connect_rate=0",
            "optimizer.label_smoothing=0",
            "optimizer.name=lars",
            "schedule.lr_per_256=40.0",
            "schedule.warmup_epochs=5",
            "data.global_batch_size=16",
            f"data.num_train_examples={16 * 2}",
            f"loop.train_epochs={steps // 2}",
            f"loop.eval_every_epochs={steps // 2}",
        ],
    )
    strategy = tf.distribute.MirroredStrategy(devices=logical_cpus[:2])
    trainer = train.Trainer(config, strategy)
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(0, 255, size=(16, 32, 32, 3)), tf.float32)
    labels = tf.constant(np.arange(16) % 10, tf.int32)
    batches = tf.data.Dataset.from_tensors((images, labels)).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(batches))
    first = float(trainer.train_loop(iterator, tf.constant(1))["loss"][0])
    for _ in range(steps // 10):
        last = float(np.mean(trainer.train_loop(iterator, tf.constant(10))["loss"]))
    assert first > 2.0  # about ln(10) at initialisation
    assert last < 0.05, f"loss {first:.3f} -> {last:.3f}"
    assert trainer.step == 1 + steps


@pytest.mark.slow  # about 20 s of training
def test_weight_averaging_swaps_in_the_averages_for_evaluation_and_back():
    config = with_overrides(presets.get_preset("smoke"), ["optimizer.ema_decay=0.5", "model.num_classes=10"])
    trainer = train.Trainer(config, tf.distribute.OneDeviceStrategy("/cpu:0"))
    rng = np.random.default_rng(1)
    batch = (
        tf.constant(rng.uniform(0, 255, (8, 32, 32, 3)), tf.float32),
        tf.constant(np.arange(8), tf.int32),
    )
    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
    trainer.train_loop(iterator, tf.constant(3))
    covered = averaged_variables(trainer.model)  # the weights and the batch-norm moving statistics
    raw = [w.numpy() for w in covered]
    averages = [a.numpy() for a in trainer.average.averages]
    assert any(not np.allclose(r, a) for r, a in zip(raw, averages, strict=True))
    moving = [i for i, v in enumerate(covered) if "moving_mean" in v.path]
    assert moving and any(not np.allclose(raw[i], averages[i]) for i in moving)
    with trainer.evaluation_weights():
        for weight, average in zip(covered, averages, strict=True):
            np.testing.assert_array_equal(weight.numpy(), average)
    for weight, original in zip(covered, raw, strict=True):
        np.testing.assert_array_equal(weight.numpy(), original)
