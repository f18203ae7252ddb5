"""The tf.distribute strategy a run asks for, checked against the config before any work starts.

``STRATEGIES`` is the registry of ``loop.strategy``: each name is bound to the function that builds it.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from trainer_module.choices import STRATEGIES
from trainer_module.config import TrainerConfig


def tpu_to_resolve(config: TrainerConfig) -> str:
    """The TPU the 'tpu' strategy connects to: ``loop.tpu_name``, else ``$TPU_NAME``, else 'local'.

    'local' is the TPU attached to this VM: a single-host slice (a Vertex TPU job, a v3-8 TPU VM). A
    multi-host TPU VM slice is driven by one client, run on its worker 0 with ``TPU_NAME`` (or
    ``loop.tpu_name``) naming the slice; the resolver finds every host's TPU worker through the Cloud TPU API.
    """
    return config.loop.tpu_name or os.environ.get("TPU_NAME", "") or "local"


def tpu_cluster(config: TrainerConfig) -> tf.distribute.cluster_resolver.TPUClusterResolver:
    """The resolver of the TPU the 'tpu' strategy connects to (``tpu_to_resolve``). For a slice named by its
    node, it asks the VM's metadata server for the project and zone, and the Cloud TPU API for each host's TPU
    worker (``cluster_spec()``), before any TPU is reached."""
    return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_to_resolve(config))


@STRATEGIES.register("tpu")
def _tpu(config: TrainerConfig, devices: list[str] | None) -> tf.distribute.Strategy:
    resolver = tpu_cluster(config)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


@STRATEGIES.register("multi_worker")
def _multi_worker(config: TrainerConfig, devices: list[str] | None) -> tf.distribute.Strategy:
    if "TF_CONFIG" not in os.environ:
        raise ValueError("loop.strategy='multi_worker' needs TF_CONFIG describing the cluster and this task")
    json.loads(os.environ["TF_CONFIG"])  # fail here, clearly, on malformed JSON
    return tf.distribute.MultiWorkerMirroredStrategy()


@STRATEGIES.register("mirrored")
def _mirrored(config: TrainerConfig, devices: list[str] | None) -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(devices=devices)


@STRATEGIES.register("one_device")
def _one_device(config: TrainerConfig, devices: list[str] | None) -> tf.distribute.Strategy:
    default = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
    return tf.distribute.OneDeviceStrategy((devices or [default])[0])


def is_chief_task(tf_config: dict | None = None) -> bool:
    """Whether this process is the task that writes a run's files (logs, checkpoints, the export).

    A single process, the ``chief`` of a ``TF_CONFIG`` cluster, or worker 0 of a cluster that has no chief
    (MultiWorkerMirroredStrategy's rule). Vertex gives a multi-machine job's primary pool the ``chief`` task
    and numbers the other pool's ``worker`` tasks from 0, so there worker 0 is not the chief.

    Args:
      tf_config: the parsed ``TF_CONFIG``; None reads the environment's.
    """
    if tf_config is None:
        tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task, cluster = tf_config.get("task") or {}, tf_config.get("cluster") or {}
    if not task or not cluster:
        return True
    kind, index = task.get("type"), int(task.get("index", 0))
    return kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)


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
    strategy = STRATEGIES.build(config.loop.strategy, config, devices)
    check_replicas(config, strategy.num_replicas_in_sync)
    return strategy


def check_replicas(config: TrainerConfig, num_replicas: int) -> None:
    """The strategy must have the replicas the config was made for (the config checks that its global batch
    and batch-norm groups split over ``data.num_cores``)."""
    if num_replicas != config.data.num_cores:
        raise ValueError(
            f"the {config.loop.strategy} strategy has {num_replicas} replicas but data.num_cores="
            f"{config.data.num_cores}: set data.num_cores={num_replicas} (global batch "
            f"{config.data.global_batch_size} must be divisible by it)"
        )
