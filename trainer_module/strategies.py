"""The tf.distribute strategy a run asks for, checked against the config before any work starts."""

from __future__ import annotations

import json
import os

import tensorflow as tf

from trainer_module.config import TrainerConfig


def build_strategy(config: TrainerConfig, devices: list[str] | None = None) -> tf.distribute.Strategy:
    """Builds the strategy of ``config.loop.strategy`` and checks it against the config.

    Args:
      config: the run's config; ``loop.strategy`` picks the strategy and ``data.num_cores`` must equal the
        number of replicas it yields (the global batch is split over exactly those replicas).
      devices: for 'mirrored', the devices to mirror over (for example N logical CPU devices in tests);
        None takes every GPU, or the CPU when there is none. For 'one_device', the first entry.

    Raises:
      ValueError: the replica count differs from ``data.num_cores``, or the batch-norm group size does not
        divide it.
    """
    kind = config.loop.strategy
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.loop.tpu_name or "local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    elif kind == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError(
                "loop.strategy='multi_worker' needs TF_CONFIG describing the cluster and this task"
            )
        json.loads(os.environ["TF_CONFIG"])  # fail here, clearly, on malformed JSON
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif kind == "mirrored":
        strategy = tf.distribute.MirroredStrategy(devices=devices)
    elif kind == "one_device":
        device = (devices or [_default_device()])[0]
        strategy = tf.distribute.OneDeviceStrategy(device)
    else:
        raise ValueError(
            f"loop.strategy={kind!r} is not one of 'tpu', 'multi_worker', 'mirrored', 'one_device'"
        )
    check_replicas(config, strategy.num_replicas_in_sync)
    return strategy


def _default_device() -> str:
    return "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"


def check_replicas(config: TrainerConfig, num_replicas: int) -> None:
    """The global batch and batch-norm groups must fit the replicas the strategy really has."""
    if num_replicas != config.data.num_cores:
        raise ValueError(
            f"the {config.loop.strategy} strategy has {num_replicas} replicas but data.num_cores="
            f"{config.data.num_cores}: set data.num_cores={num_replicas} (global batch "
            f"{config.data.global_batch_size} must be divisible by it)"
        )
    if num_replicas % config.bn_group_size:
        raise ValueError(
            f"batch-norm group size {config.bn_group_size} does not divide the {num_replicas} replicas"
        )
