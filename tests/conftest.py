"""Test session set-up shared by every test module.

TensorFlow fixes its device list the first time it is touched, so the 8 logical CPU devices that the
distributed tests (MirroredStrategy, grouped batch norm) need are configured here, before any test runs.
Single-device code is unaffected: without a strategy, TensorFlow places work on the first CPU.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 8

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)


@pytest.fixture(scope="session")
def logical_cpus():
    """Names of the logical CPU devices, for MirroredStrategy(devices=...)."""
    return [d.name for d in tf.config.list_logical_devices("CPU")]
